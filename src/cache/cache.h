/* cache.h: the persistent cache (cache.c): blobs of verified tensors named
 * by their digest, an SQLite index of them, and the verified-once memo of
 * local files. See "Persistent cache" in sluice.h for what it promises.
 *
 * Layout of a cache directory DIR:
 *   DIR/index.sqlite (+ -wal, -shm)   the index, WAL mode
 *   DIR/lock                          flock'ed while the index is opened,
 *                                     created, migrated or rebuilt
 *   DIR/blobs/ALG/XX/HEX              a tensor's bytes (ALG "sha256" or
 *                                     "blake3", HEX its 64-digit digest,
 *                                     XX HEX's first two digits)
 *   DIR/tmp/RANDOM.fill               a fill in progress, flock'ed by its
 *                                     writer while it lives (PID.RANDOM.tmp:
 *                                     an older sluice's, told by its pid)
 *   DIR/corrupt/index.sqlite.NS       an index moved aside
 *
 * Schema (PRAGMA user_version = SL_CACHE_SCHEMA):
 *   meta(key TEXT PRIMARY KEY, value TEXT)        ('format','sluice-cache')
 *   blobs(algorithm TEXT, digest TEXT, size INTEGER, source TEXT,
 *         created_ns INTEGER, last_access_ns INTEGER,
 *         PRIMARY KEY(algorithm, digest))
 *   memo(dev, ino, size, mtime_ns, ctime_ns, offset, nbytes, algorithm,
 *        digest, recorded_ns, PRIMARY KEY(all but recorded_ns))   (v2)
 *   names(algorithm TEXT, digest TEXT, model TEXT, tensor TEXT,
 *         PRIMARY KEY(all))   the tensors a blob was stored as: made at
 *         every open where missing, never required, so the version
 *         stays 2 and an older sluice opens the cache as before
 * Version 1 had meta and blobs only; open migrates 1 -> 2.
 *
 * Reading a blob never touches SQLite: its path is its digest, and a blob
 * exists whole or not at all (renamed into place). SQLite holds what
 * eviction and `sluice cache` need. Every SQLite use is one short
 * transaction under the handle's mutex, with a busy timeout; no lock of
 * it is held across a blob's I/O.
 *
 * Busy: another process may hold the index's write lock for long (a
 * `sqlite3` shell in a transaction, a gc). Loads never wait for it more
 * than SL_CACHE_BUSY_MS per store: a store that cannot get the lock in
 * that time keeps its blob (renamed into place, whole) waiting for its
 * entry, which the next store that gets the lock writes along with its
 * own; for SL_CACHE_BUSY_RETRY_MS after such a miss, stores do not try
 * the lock at all. A blob still waiting at close gets one more try, and
 * is deleted if that fails too (no blob is left outside the index).
 * Every write of the index given up that way is counted (sl_cache_busy)
 * and the first one leaves a note (sl_cache_warning) without turning the
 * handle off. The open and the administration (sl_cache_set_patient)
 * wait up to SL_CACHE_OPEN_BUSY_MS.
 *
 * Degrading: an error that makes the cache unusable (EROFS, EACCES,
 * ENOSPC, EDQUOT on a write; a newer schema; an index that cannot be
 * rebuilt) turns the handle off: it keeps the first such message
 * (sl_cache_warning), every later store and record does nothing, lookups
 * find nothing. Loading never fails because of the cache. A full disk
 * reads "the disk is full (No space left on device)" in the message
 * whichever layer met it (a blob's write or fsync, SQLite's journal).
 *
 * Fault hook for tests (processes the tests start): the environment
 * variable SLUICE_TEST_CACHE_FAULT, read at sl_cache_open, "kill@N" sends
 * SIGKILL to the process at the Nth step of its fills (steps: the temporary
 * file made, each write, the fsync, the rename, the directory's fsync, the
 * insert), "stop@N" sends it SIGSTOP there instead (a fill held alive in
 * the middle, for the tests of clean-up), "enospc@N" makes the Nth step's
 * call fail with ENOSPC, "erofs" makes making the directories fail with
 * EROFS. Unset in normal use. Steps are counted across all fills of one
 * handle, from 1; a kill or stop comes right after its step's call
 * succeeded, an ENOSPC in place of the call.
 * Each write() is at most SL_CACHE_WRITE_MAX bytes (so a fill of n bytes
 * has ceil(n / SL_CACHE_WRITE_MAX) write steps). N is a positive decimal
 * without leading zeros; any other value is ignored.
 *
 * Thread safety: an sl_cache may be used by any number of threads at once.
 * Not from a signal handler, and not by the child of a fork (SQLite's
 * connection belongs to the process that opened it): a child opens its
 * own handle.
 */
#ifndef SLUICE_CACHE_H
#define SLUICE_CACHE_H

#include "base/error.h"
#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

#define SL_CACHE_SCHEMA 2

/* The most bytes one write() of a fill asks for. */
#define SL_CACHE_WRITE_MAX ((size_t)1 << 20)

/* How long a write of the index waits for another process's lock: on
 * the load's path, and for the open and the administration (see Busy);
 * and how long after a write gave up stores go without trying. */
#define SL_CACHE_BUSY_MS 100
#define SL_CACHE_OPEN_BUSY_MS 5000
#define SL_CACHE_BUSY_RETRY_MS 1000

typedef struct sl_cache sl_cache;

/* The directory a model uses: o->cache_dir, else $SLUICE_CACHE_DIR, else
 * (flags SLUICE_F_CACHE_DEFAULT or SLUICE_F_TRUST_UNCHANGED)
 * $XDG_CACHE_HOME/sluice or $HOME/.cache/sluice; malloc'd. *out NULL: no
 * cache. Returns SLUICE_E_NOMEM only. */
int sl_cache_dir_for(const sluice_options *o, char **out, sl_err *err);

/* mkdir -p path (mode 0755), content with directories already there.
 * 0, or -1 with errno. */
int sl_cache_mkdir_p(const char *path);

/* Opens (making what is missing) the cache at dir with a budget of
 * max_bytes. Returns SLUICE_E_NOMEM, or SLUICE_OK with *out set: a usable
 * handle, or one turned off with its warning (see above). Cleans the
 * temporary files of processes that are gone, and moves a corrupt or
 * foreign index aside and rebuilds it from the blobs; an index made
 * afresh (deleted, empty) records the blobs already there too. */
int sl_cache_open(const char *dir, uint64_t max_bytes, sl_cache **out, sl_err *err);
void sl_cache_close(sl_cache *c);

/* 1 when dir holds a cache (its index or its blobs), else 0; creates nothing. */
int sl_cache_exists(const char *dir);

/* NULL, or why the handle is off, or (while it works) the note that a
 * write of the index was put off (see Busy). Borrowed, valid until close. */
const char *sl_cache_warning(const sl_cache *c);
/* Whether the handle is off. */
int sl_cache_is_off(const sl_cache *c);
/* Writes of the index given up so far because another process held its
 * write lock (see Busy). */
uint64_t sl_cache_busy(const sl_cache *c);
/* Makes every write of the handle wait up to SL_CACHE_OPEN_BUSY_MS for
 * another process's lock: for the administration, which no load waits on. */
void sl_cache_set_patient(sl_cache *c);
const char *sl_cache_dir(const sl_cache *c);

/* Opens the blob of (alg, digest) for reading: its descriptor (O_RDONLY |
 * O_CLOEXEC), or -1 when there is none, or none of exactly size bytes (a
 * blob of another size is deleted: it cannot be this tensor). *path gets
 * the blob's path (malloc'd) when the descriptor is returned. */
int sl_cache_open_blob(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32],
                       uint64_t size, char **path);

/* Stores the size bytes at data, already verified to have digest, as the
 * blob of (alg, digest), fetched from source (a location as messages show
 * it), then evicts down to the budget (*evicted, may be NULL, gets the
 * count). A blob larger than the budget is not stored. Returns the
 * entries written: 1 (more when blobs that waited for their entry were
 * recorded with it), or 0: not stored (off, too large, or turned off by
 * this failure: see warning) or its entry waits (see Busy). */
int sl_cache_store(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32], const void *data,
                   uint64_t size, const char *source, uint64_t *evicted);

/* sl_cache_store, recording also that the blob holds tensor name->tensor
 * of model name->model (name may be NULL: none), in the names table
 * (sluice_cache_entry.names; see "Schema"). */
int sl_cache_store_named(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32],
                         const void *data, uint64_t size, const char *source,
                         const sluice_cache_name *name, uint64_t *evicted);

/* Deletes the blob of (alg, digest) and its entry: its bytes failed
 * verification. */
void sl_cache_drop(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32]);

/* Marks the entries of n digests used now (one transaction). */
void sl_cache_touch(sl_cache *c, sluice_algorithm alg, const uint8_t (*digests)[32], size_t n);

/* ---------------------------------------------------------------- memo */

typedef struct sl_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
} sl_file_id;

/* The identity of fd's file (fstat). */
int sl_file_id_of(int fd, sl_file_id *id);

/* The name of fd's file system when its identity cannot vouch for its
 * bytes (a write need not move mtime and ctime there: tmpfs, ramfs,
 * hugetlbfs; network and FUSE file systems; overlayfs), else NULL.
 * Static string. */
const char *sl_file_id_untrusted_fs(int fd);

/* Writes back fd's dirty pages (sync_file_range, no device flush), so
 * that any later store through a shared mapping of the file faults and
 * moves its times. Called before the identity is taken. 0, or -1
 * (errno): the identity is not to be trusted. */
int sl_file_id_settle(int fd);

/* Calls fn for every memo record of file id in alg. */
void sl_cache_memo_each(sl_cache *c, const sl_file_id *id, sluice_algorithm alg,
                        void (*fn)(void *user, uint64_t offset, uint64_t nbytes,
                                   const uint8_t digest[32]),
                        void *user);

/* Records that bytes [offset, offset + nbytes) of file id matched digest.
 * Does nothing for a file whose mtime or ctime is not at least a second
 * older than opened_ns (CLOCK_REALTIME when its identity was taken). */
void sl_cache_memo_record(sl_cache *c, const sl_file_id *id, int64_t opened_ns,
                          sluice_algorithm alg, uint64_t offset, uint64_t nbytes,
                          const uint8_t digest[32]);

/* ---------------------------------------------------------------- administration
 * For sluice_cache_* (api_cache.c). Each fails with SLUICE_E_IO (the
 * handle's warning as the message) on a handle that is off, and with
 * SLUICE_E_UNSUPPORTED in a build without SQLite. */

/* One entry of the index. */
typedef struct sl_cache_row {
    sluice_algorithm alg;
    char digest[65];      /* lower-case hex */
    uint64_t size;
    char *source;         /* malloc'd, "" when none */
    int64_t created_ns, last_access_ns;
    sluice_cache_name *names; /* the tensors stored as it (malloc'd, each string too) */
    size_t nnames;
} sl_cache_row;

/* Every entry, least recently used first (a snapshot: the index may
 * change as soon as it is taken). Free with sl_cache_rows_free. */
int sl_cache_rows(sl_cache *c, sl_cache_row **rows, size_t *n, sl_err *err);
void sl_cache_rows_free(sl_cache_row *rows, size_t n);

/* The bytes and the entries recorded. */
int sl_cache_usage(sl_cache *c, uint64_t *bytes, uint64_t *entries, sl_err *err);

/* The blob files no entry names (a fill killed between its rename and
 * its entry, one waiting for its entry, an index lost): one row each,
 * size the file's, source "", times its mtime. Free with
 * sl_cache_rows_free. */
int sl_cache_orphans(sl_cache *c, sl_cache_row **rows, size_t *n, sl_err *err);

/* Records row's blob, found good by a rehash, with source "found by
 * verify", if it is still in place with row's size: 1 recorded (or
 * another process had by now), 0 gone, or a failure. */
int sl_cache_adopt(sl_cache *c, const sl_cache_row *row, sl_err *err);

/* Deletes the temporary files of dead processes, the entries whose blob
 * is missing (or of another size, deleting that file too), records the
 * blobs no entry names (source "rebuilt"), then evicts down to max_bytes. */
int sl_cache_gc(sl_cache *c, uint64_t max_bytes, uint64_t *freed_bytes, uint64_t *freed_entries,
                sl_err *err);

/* Deletes every entry and the memo, then every blob file. */
int sl_cache_clear(sl_cache *c, uint64_t *freed_bytes, uint64_t *freed_entries, sl_err *err);

/* DIR/blobs/ALG/XX/HEX (malloc'd), NULL for an unknown alg or no memory. */
char *sl_cache_blob_path(const sl_cache *c, sluice_algorithm alg, const char hex[65]);

/* "sha256"/"blake3" into *alg: 0, or -1 for another name. */
int sl_cache_alg_parse(const char *name, sluice_algorithm *alg);

/* 64 lower-case hex digits into 32 bytes: 0, or -1. */
int sl_cache_hex_parse(const char *hex, uint8_t out[32]);

#endif
