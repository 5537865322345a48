/* cache.c: the persistent cache (see cache.h): blobs named by their digest,
 * written whole by rename, and an SQLite index of them for eviction and
 * administration, plus the verified-once memo.
 *
 * The order of a fill is what makes a crash at any point harmless: the
 * bytes go to DIR/tmp first (a dead process's leftovers are deleted by the
 * next open), become a blob only by rename (whole or absent), and get an
 * entry only after the rename and the directory's fsync, so an entry never
 * names a blob that is not there in full.
 *
 * Deleting a blob (eviction, drop, gc, clear) unlinks its file inside the
 * write transaction that deletes its entry, and a store checks that its
 * blob is still in place inside the transaction that inserts the entry.
 * SQLite's write lock thus orders the two, across threads and processes:
 * a blob evicted by one while another stores the same digest either is
 * seen missing by the store (not recorded) or is unlinked before it was
 * put back (recorded, present). Only a COMMIT that fails after the unlink
 * can leave an entry without its blob; a reader treats that as a miss and
 * gc deletes it. These unlinks are the one piece of file work done under
 * the lock; no blob is read or written under it.
 *
 * Nothing here may fail a load: every trouble either turns the handle off
 * (with one message) or makes the one call do nothing.
 */
#include "cache/cache.h"

#ifdef SLUICE_HAVE_SQLITE
#include <sqlite3.h>
#endif

#include <dirent.h>
#include <linux/magic.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

/* older kernel headers lack these */
#ifndef CIFS_SUPER_MAGIC
#define CIFS_SUPER_MAGIC 0xFF534D42
#endif
#ifndef SMB2_SUPER_MAGIC
#define SMB2_SUPER_MAGIC 0xFE534D42
#endif
#ifndef OVERLAYFS_SUPER_MAGIC
#define OVERLAYFS_SUPER_MAGIC 0x794c7630
#endif
/* A cache is there when its directory holds the index or the blobs folder
 * (an index lost beside its blobs is rebuilt by the open). Stats only: the
 * one check a caller that must create nothing makes first. */
int sl_cache_exists(const char *dir)
{
    char path[PATH_MAX];
    struct stat st;
    static const char *const marks[] = {"index.sqlite", "blobs"};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
        int n = snprintf(path, sizeof path, "%s/%s", dir, marks[i]);
        if (n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0)
            return 1;
    }
    return 0;
}

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

#define NS_PER_S 1000000000LL
#define TMP_MAX_AGE_NS (24LL * 3600 * NS_PER_S)

typedef enum fault_kind { FAULT_NONE, FAULT_KILL, FAULT_STOP, FAULT_ENOSPC, FAULT_EROFS } fault_kind;

enum { ON = 0, TURNING_OFF = 1, OFF = 2 };

struct sl_cache {
    char *dir;
    uint64_t max_bytes;
    /* ON, or OFF once warning is written (TURNING_OFF while it is): the
     * fast paths read state alone, and warning only after seeing OFF */
    atomic_int state;
    char warning[SL_ERRMSG_MAX];
    fault_kind fault;
    uint64_t fault_at;
    atomic_uint_fast64_t steps; /* fill steps so far, for the fault hook */
    pthread_mutex_t mu;         /* serialises every use of db and last_ns */
    int64_t last_ns;            /* the last access time given out */
    /* Another process holding the index's write lock (see "Busy" in
     * cache.h): blobs in place whose entry waits (under mu), the
     * CLOCK_MONOTONIC time before which stores do not try the index
     * again (under mu), the count of writes given up, and the note
     * (written once, under mu, before noted is set) */
    struct pending_blob *pend;
    size_t npend, cap_pend;
    int64_t retry_ns;
    atomic_uint_fast64_t busy;
    atomic_int noted;
    char note[SL_ERRMSG_MAX];
#ifdef SLUICE_HAVE_SQLITE
    sqlite3 *db;
#endif
};

/* A blob renamed into place whose entry could not be written yet. */
typedef struct pending_blob {
    sluice_algorithm alg;
    char hex[65];
    uint64_t size;
    char *source;   /* malloc'd */
    sluice_cache_name name; /* malloc'd strings; model NULL: none */
} pending_blob;

/* ---------------------------------------------------------------- helpers */

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

/* The directory name of alg under blobs/, NULL for an unknown one. */
static const char *alg_dir(sluice_algorithm alg)
{
    switch (alg) {
    case SLUICE_ALG_SHA256: return "sha256";
    case SLUICE_ALG_BLAKE3: return "blake3";
    }
    return NULL;
}

int sl_cache_alg_parse(const char *name, sluice_algorithm *alg)
{
    if (!strcmp(name, "sha256"))
        *alg = SLUICE_ALG_SHA256;
    else if (!strcmp(name, "blake3"))
        *alg = SLUICE_ALG_BLAKE3;
    else
        return -1;
    return 0;
}

/* 1 when s is n lower-case hex digits (and nothing more). */
static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return s[n] == '\0';
}

int sl_cache_hex_parse(const char *hex, uint8_t out[32])
{
    if (!is_hex(hex, 64))
        return -1;
    for (int i = 0; i < 32; i++)
        out[i] = (uint8_t)(sl_hex_value(hex[2 * i]) << 4 | sl_hex_value(hex[2 * i + 1]));
    return 0;
}

char *sl_cache_blob_path(const sl_cache *c, sluice_algorithm alg, const char hex[65])
{
    const char *a = alg_dir(alg);
    return a ? str_printf("%s/blobs/%s/%.2s/%s", c->dir, a, hex, hex) : NULL;
}

static inline int is_off(const sl_cache *c)
{
    return atomic_load_explicit(&c->state, memory_order_acquire) != ON;
}

/* Turns the handle off with "cache DIR: turned off: WHY"; the first
 * caller's message stays. */
static void turn_off(sl_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void turn_off(sl_cache *c, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    int expected = ON;
    if (!atomic_compare_exchange_strong(&c->state, &expected, TURNING_OFF))
        return;
    snprintf(c->warning, sizeof c->warning, "cache %s: turned off: %s", c->dir, why);
    sl_utf8_cut(c->warning);
    atomic_store_explicit(&c->state, OFF, memory_order_release);
}

const char *sl_cache_warning(const sl_cache *c)
{
    if (!c)
        return NULL;
    if (atomic_load_explicit(&c->state, memory_order_acquire) == OFF)
        return c->warning;
    return atomic_load_explicit(&c->noted, memory_order_acquire) ? c->note : NULL;
}

int sl_cache_is_off(const sl_cache *c)
{
    return c && atomic_load_explicit(&c->state, memory_order_acquire) == OFF;
}

uint64_t sl_cache_busy(const sl_cache *c)
{
    return c ? atomic_load_explicit(&c->busy, memory_order_relaxed) : 0;
}

const char *sl_cache_dir(const sl_cache *c)
{
    return c ? c->dir : NULL;
}

/* ---------------------------------------------------------------- directory */

int sl_cache_dir_for(const sluice_options *o, char **out, sl_err *err)
{
    *out = NULL;
    const char *dir = o && o->cache_dir && *o->cache_dir ? o->cache_dir : NULL;
    char *made = NULL;
    if (!dir) {
        const char *env = getenv("SLUICE_CACHE_DIR");
        if (env && *env)
            dir = env;
    }
    if (!dir && o && (o->flags & (SLUICE_F_CACHE_DEFAULT | SLUICE_F_TRUST_UNCHANGED))) {
        /* XDG: a relative $XDG_CACHE_HOME is invalid and ignored */
        const char *xdg = getenv("XDG_CACHE_HOME");
        const char *home = getenv("HOME");
        if (xdg && xdg[0] == '/')
            made = str_printf("%s/sluice", xdg);
        else if (home && *home)
            made = str_printf("%s/.cache/sluice", home);
        else
            return SLUICE_OK; /* nowhere to put it: no cache */
        if (!made)
            return sl_fail(err, SLUICE_E_NOMEM, "out of memory naming the cache directory");
        *out = made;
        return SLUICE_OK;
    }
    if (!dir)
        return SLUICE_OK;
    if (!(*out = strdup(dir)))
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory naming the cache directory");
    return SLUICE_OK;
}

int sl_file_id_of(int fd, sl_file_id *id)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    id->dev = (uint64_t)st.st_dev;
    id->ino = (uint64_t)st.st_ino;
    id->size = (uint64_t)st.st_size;
    id->mtime_ns = (int64_t)st.st_mtim.tv_sec * NS_PER_S + st.st_mtim.tv_nsec;
    id->ctime_ns = (int64_t)st.st_ctim.tv_sec * NS_PER_S + st.st_ctim.tv_nsec;
    return 0;
}

/* File systems whose mtime and ctime need not move on a write this
 * process could not see: memory-backed ones, where a store through a
 * shared mapping to a page that is there already takes no fault that
 * would update the times (tmpfs and /dev/shm: a page read through the
 * mapping then written back stays at the old times), and ones whose
 * times come from elsewhere (a server's, a user-space daemon's, an
 * attribute cache's), where another machine's write shows late or not
 * at all. And overlayfs: its times are those of the file below, whose
 * dirty pages sl_file_id_settle cannot reach through the overlay (seen:
 * sync_file_range on the overlay's descriptor leaves them dirty). */
static const struct {
    unsigned long magic;
    const char *name;
} untrusted_fs[] = {
    {TMPFS_MAGIC, "tmpfs"},         {RAMFS_MAGIC, "ramfs"},
    {HUGETLBFS_MAGIC, "hugetlbfs"}, {NFS_SUPER_MAGIC, "nfs"},
    {SMB_SUPER_MAGIC, "smb"},       {CIFS_SUPER_MAGIC, "cifs"},
    {SMB2_SUPER_MAGIC, "smb2"},     {V9FS_MAGIC, "9p"},
    {FUSE_SUPER_MAGIC, "fuse"},     {CEPH_SUPER_MAGIC, "ceph"},
    {AFS_SUPER_MAGIC, "afs"},       {AFS_FS_MAGIC, "afs"},
    {CODA_SUPER_MAGIC, "coda"},     {OVERLAYFS_SUPER_MAGIC, "overlayfs"},
};

const char *sl_file_id_untrusted_fs(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return "a file system fstatfs cannot name";
    for (size_t i = 0; i < sizeof untrusted_fs / sizeof untrusted_fs[0]; i++)
        if ((unsigned long)sf.f_type == untrusted_fs[i].magic)
            return untrusted_fs[i].name;
    return NULL;
}

int sl_file_id_settle(int fd)
{
    /* Writeback of a page write-protects every mapping of it (the kernel
     * cleans the page tables before it writes), so a store through a
     * mapping made before this faults again, and the fault moves the
     * times. Nothing dirty: a walk of the file's dirty tags, no I/O. */
    for (;;) {
        if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                          SYNC_FILE_RANGE_WAIT_AFTER) == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* (mkdir_p serves a build without SQLite too: hub.c keeps its derived
 * manifests in the cache directory) */
/* mkdir that is content with a directory already there. */
static int mkdir_one(const char *path)
{
    if (mkdir(path, 0755) == 0)
        return 0;
    if (errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int sl_cache_mkdir_p(const char *path)
{
    char *p = strdup(path);
    if (!p) {
        errno = ENOMEM;
        return -1;
    }
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        int rc = mkdir_one(p);
        *s = '/';
        if (rc != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            errno = e;
            return -1;
        }
    }
    int rc = mkdir_one(p);
    int e = errno;
    free(p);
    errno = e;
    return rc;
}

#ifdef SLUICE_HAVE_SQLITE

static void pending_clear(sl_cache *c)
{
    for (size_t i = 0; i < c->npend; i++) {
        free(c->pend[i].source);
        free((char *)c->pend[i].name.model);
        free((char *)c->pend[i].name.tensor);
    }
    c->npend = 0;
}

/* The errors after which the cache cannot work here at all (read-only,
 * forbidden or full): they turn the handle off rather than fail one fill. */
static int is_fatal_errno(int e)
{
    return e == EROFS || e == EACCES || e == EPERM || e == ENOSPC || e == EDQUOT;
}

/* A full disk reads the same in every warning, whichever layer met it
 * first: a blob's write or fsync (ENOSPC), or SQLite's journal
 * (SQLITE_FULL, "database or disk is full"). */
#define DISK_FULL "the disk is full (No space left on device)"

static const char *errno_why(int e)
{
    return e == ENOSPC ? DISK_FULL : strerror(e);
}

/* msg, the words of SQLite's rc, unless rc says the disk is full. */
static const char *sqlite_why(int rc, const char *msg)
{
    return (rc & 0xff) == SQLITE_FULL ? DISK_FULL : msg;
}

/* Deletes the temporary file name (in d) when its fill has ended without
 * finishing. A fill of this version is RANDOM.fill, flock'ed by its
 * writer from before its first byte to its end: the kernel drops the lock
 * when the writer dies, in whatever PID namespace it ran, so a lock this
 * call can take means the writer is gone, or has not taken it yet (it
 * creates the file, then locks it). The name is unlinked while the lock
 * is held, and only while it still names the file locked: a writer that
 * then locks its file finds it unlinked (st_nlink 0, fill_blob) and takes
 * another name. Unlinked after the lock was dropped (as before), the name
 * could be that of a fill whose writer had just locked it and found it
 * linked: its rename then failed. PID.RANDOM.tmp is an older sluice's,
 * which took no lock: gone when that pid does not exist here (not known
 * across PID namespaces). */
static void remove_if_gone(DIR *d, const char *name)
{
    size_t len = strlen(name);
    if (len > 5 && !strcmp(name + len - 5, ".fill")) {
        int fd = openat(dirfd(d), name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0)
            return;
        struct stat st, now;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dirfd(d), name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == st.st_dev &&
            now.st_ino == st.st_ino)
            unlinkat(dirfd(d), name, 0);
        close(fd);   /* the lock goes with it, after the unlink */
        return;
    }
    char *end;
    errno = 0;
    long pid = strtol(name, &end, 10);
    if (name[0] >= '1' && name[0] <= '9' && !errno && pid > 0 && pid <= INT_MAX &&
        end[0] == '.' && end[1] != '\0' && len > 4 && !strcmp(name + len - 4, ".tmp") &&
        end + 1 < name + len - 4 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        unlinkat(dirfd(d), name, 0);
}

/* Deletes the temporary files of fills that cannot finish: their writer
 * is gone (remove_if_gone), or they are over a day old (anything else there).
 * A live fill is left, whatever PID namespace its writer runs in. */
static void clean_tmp(const sl_cache *c)
{
    char *path = str_printf("%s/tmp", c->dir);
    DIR *d = path ? opendir(path) : NULL;
    free(path);
    if (!d)
        return;
    int64_t now = now_ns();
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (name[0] == '.')
            continue;
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        int64_t age = now - ((int64_t)st.st_mtim.tv_sec * NS_PER_S + st.st_mtim.tv_nsec);
        if (age > TMP_MAX_AGE_NS)
            unlinkat(dirfd(d), name, 0);
        else
            remove_if_gone(d, name);
    }
    closedir(d);
}

/* One blob file found by walking DIR/blobs. */
typedef struct found_blob {
    sluice_algorithm alg;
    char hex[65];
    uint64_t size;
    int64_t mtime_ns;
} found_blob;

typedef struct found_list {
    found_blob *v;
    size_t n, cap;
} found_list;

/* Lists every file DIR/blobs/ALG/XX/HEX that is a regular file with a
 * well-formed name; anything else there is left alone and not listed.
 * 0, or -1 (out of memory). A directory that cannot be read counts as
 * empty: the cache works with what it can see. */
static int walk_blobs(const sl_cache *c, found_list *out)
{
    static const sluice_algorithm algs[] = {SLUICE_ALG_SHA256, SLUICE_ALG_BLAKE3};
    for (size_t a = 0; a < sizeof algs / sizeof algs[0]; a++) {
        char *path = str_printf("%s/blobs/%s", c->dir, alg_dir(algs[a]));
        DIR *top = path ? opendir(path) : NULL;
        free(path);
        if (!top)
            continue;
        struct dirent *x;
        while ((x = readdir(top))) {
            if (!is_hex(x->d_name, 2))
                continue;
            int fd = openat(dirfd(top), x->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
            DIR *sub = fd >= 0 ? fdopendir(fd) : NULL;
            if (!sub) {
                if (fd >= 0)
                    close(fd);
                continue;
            }
            struct dirent *h;
            while ((h = readdir(sub))) {
                struct stat st;
                if (!is_hex(h->d_name, 64) || memcmp(h->d_name, x->d_name, 2) != 0 ||
                    fstatat(dirfd(sub), h->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                    !S_ISREG(st.st_mode))
                    continue;
                if (out->n == out->cap) {
                    size_t cap = out->cap ? out->cap * 2 : 64;
                    found_blob *v = realloc(out->v, cap * sizeof *v);
                    if (!v) {
                        closedir(sub);
                        closedir(top);
                        return -1;
                    }
                    out->v = v;
                    out->cap = cap;
                }
                found_blob *f = &out->v[out->n++];
                f->alg = algs[a];
                memcpy(f->hex, h->d_name, 65);
                f->size = (uint64_t)st.st_size;
                f->mtime_ns = (int64_t)st.st_mtim.tv_sec * NS_PER_S + st.st_mtim.tv_nsec;
            }
            closedir(sub);
        }
        closedir(top);
    }
    return 0;
}

/* SLUICE_TEST_CACHE_FAULT, parsed strictly: "erofs", "kill@N", "stop@N" or
 * "enospc@N" with N a positive decimal without leading zeros; anything
 * else is ignored. */
static void parse_fault(sl_cache *c)
{
    const char *v = getenv("SLUICE_TEST_CACHE_FAULT");
    if (!v)
        return;
    if (!strcmp(v, "erofs")) {
        c->fault = FAULT_EROFS;
        return;
    }
    fault_kind k;
    const char *n;
    if (!strncmp(v, "kill@", 5)) {
        k = FAULT_KILL;
        n = v + 5;
    } else if (!strncmp(v, "stop@", 5)) {
        k = FAULT_STOP;
        n = v + 5;
    } else if (!strncmp(v, "enospc@", 7)) {
        k = FAULT_ENOSPC;
        n = v + 7;
    } else {
        return;
    }
    if (*n < '1' || *n > '9')
        return;
    uint64_t x = 0;
    for (; *n; n++) {
        if (*n < '0' || *n > '9' || x > (UINT64_MAX - 9) / 10)
            return;
        x = x * 10 + (uint64_t)(*n - '0');
    }
    c->fault = k;
    c->fault_at = x;
}

/* The fault hook's view of one fill step: step_begin numbers it (0 when
 * no hook is set) and says whether its call must fail with ENOSPC instead
 * of being made; step_end, after the call, kills the process at the step
 * asked. */
static uint64_t step_begin(sl_cache *c, int *fail)
{
    *fail = 0;
    if (c->fault != FAULT_KILL && c->fault != FAULT_STOP && c->fault != FAULT_ENOSPC)
        return 0;
    uint64_t step = atomic_fetch_add(&c->steps, 1) + 1;
    if (c->fault == FAULT_ENOSPC && step == c->fault_at) {
        *fail = 1;
        errno = ENOSPC;
    }
    return step;
}

static void step_end(const sl_cache *c, uint64_t step)
{
    if (c->fault == FAULT_KILL && step == c->fault_at)
        kill(getpid(), SIGKILL);
    if (c->fault == FAULT_STOP && step == c->fault_at)
        kill(getpid(), SIGSTOP);
}


/* ---------------------------------------------------------------- SQLite */

static pthread_once_t sqlite_once = PTHREAD_ONCE_INIT;
static int sqlite_init_rc;

static void sqlite_init(void)
{
    sqlite_init_rc = sqlite3_initialize();
}

static const char *const SCHEMA_META =
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
    "INSERT INTO meta(key, value) VALUES('format', 'sluice-cache');";
static const char *const SCHEMA_BLOBS =
    "CREATE TABLE blobs(algorithm TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL,"
    " source TEXT, created_ns INTEGER NOT NULL, last_access_ns INTEGER NOT NULL,"
    " PRIMARY KEY(algorithm, digest));";
/* The tensors each blob was stored as (sluice_cache_entry.names): a table
 * of its own, made at every open where missing and never required, so
 * that the schema version stays 2 and an older sluice, which knows
 * nothing of it, opens the same cache as before. Rows whose blob is gone
 * are left out of every listing and deleted with the blob where this
 * version deletes it (gc deletes any an older one left). */
static const char *const SCHEMA_NAMES =
    "CREATE TABLE IF NOT EXISTS names(algorithm TEXT NOT NULL, digest TEXT NOT NULL,"
    " model TEXT NOT NULL, tensor TEXT NOT NULL,"
    " PRIMARY KEY(algorithm, digest, model, tensor));";
/* version 2 */
static const char *const SCHEMA_MEMO =
    "CREATE TABLE memo(dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL,"
    " mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, offset INTEGER NOT NULL,"
    " nbytes INTEGER NOT NULL, algorithm TEXT NOT NULL, digest TEXT NOT NULL,"
    " recorded_ns INTEGER NOT NULL,"
    " PRIMARY KEY(dev, ino, size, mtime_ns, ctime_ns, offset, nbytes, algorithm, digest));"
    "CREATE INDEX IF NOT EXISTS blobs_lru ON blobs(last_access_ns);";

/* A result code that says the file is not (or no longer) a database. */
static int is_corrupt_rc(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT;
}

/* An access time for the index: now, but always later than the last one
 * given, so that least recently used is a strict order. Under mu. */
static int64_t access_ns(sl_cache *c)
{
    int64_t t = now_ns();
    if (t <= c->last_ns)
        t = c->last_ns + 1;
    c->last_ns = t;
    return t;
}

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* A write of the index given up because another connection held its
 * write lock past the short wait (under mu): counted, noted once, and no
 * store tries the index again for SL_CACHE_BUSY_RETRY_MS. */
static void note_busy(sl_cache *c)
{
    atomic_fetch_add_explicit(&c->busy, 1, memory_order_relaxed);
    c->retry_ns = mono_ns() + (int64_t)SL_CACHE_BUSY_RETRY_MS * 1000000;
    if (atomic_load_explicit(&c->noted, memory_order_relaxed))
        return;
    snprintf(c->note, sizeof c->note,
             "cache %s: another process holds the write lock of its index.sqlite (waited %d "
             "ms): loads go on; a blob stored meanwhile gets its entry with a later store, or "
             "is deleted at close if the lock is still held (stats disk_busy counts the "
             "writes put off)",
             c->dir, SL_CACHE_BUSY_MS);
    sl_utf8_cut(c->note);
    atomic_store_explicit(&c->noted, 1, memory_order_release);
}

/* After a failed transaction (under mu; rc its code, since the ROLLBACK
 * has replaced the connection's message): turns the handle off when the
 * index cannot be written at all (read-only, full, corrupt); a busy or
 * other passing failure only fails the one call. */
static void db_trouble(sl_cache *c, int rc, const char *what)
{
    int prim = rc & 0xff;
    if (prim == SQLITE_BUSY) {
        note_busy(c);
        return;
    }
    int se = sqlite3_system_errno(c->db);
    if (prim == SQLITE_FULL || prim == SQLITE_READONLY || prim == SQLITE_CORRUPT ||
        prim == SQLITE_NOTADB || prim == SQLITE_PERM || prim == SQLITE_CANTOPEN ||
        (prim == SQLITE_IOERR && is_fatal_errno(se)))
        turn_off(c, "%s failed: %s", what,
                 se == ENOSPC ? DISK_FULL
                 : se && is_fatal_errno(se) ? strerror(se) : sqlite_why(rc, sqlite3_errstr(rc)));
}

static int db_exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* Runs a one-value query; *out gets its integer (0 with no row). */
static int db_int(sqlite3 *db, const char *sql, int64_t *out)
{
    sqlite3_stmt *st = NULL;
    *out = 0;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(st, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(st);
    return rc;
}

static int db_begin(sqlite3 *db)
{
    return db_exec(db, "BEGIN IMMEDIATE");
}

/* Commits, or rolls back when rc (the transaction's status so far) is a
 * failure; returns the transaction's status. */
static int db_end(sqlite3 *db, int rc)
{
    if (rc == SQLITE_OK) {
        rc = db_exec(db, "COMMIT");
        if (rc == SQLITE_OK)
            return rc;
    }
    db_exec(db, "ROLLBACK");
    return rc;
}

/* ---------------------------------------------------------------- open */

typedef enum index_state {
    INDEX_OK,     /* usable, schema current */
    INDEX_ASIDE,  /* corrupt or foreign: move it aside */
    INDEX_NEWER,  /* a newer schema: leave it, turn off */
    INDEX_FAILED  /* cannot be opened now: turn off */
} index_state;

/* Checks the database at db and brings it to the current schema: creates
 * it when empty, migrates version 1. *why says what went wrong. */
static index_state prepare_index(sqlite3 *db, int64_t *version, int *created, char *why,
                                 size_t why_size)
{
    int64_t v = 0, tables = 0;
    *created = 0;
    int rc = db_int(db, "PRAGMA user_version", &v);
    *version = v;
    if (rc != SQLITE_OK) {
        snprintf(why, why_size, "%s", sqlite_why(rc, sqlite3_errmsg(db)));
        return is_corrupt_rc(rc) ? INDEX_ASIDE : INDEX_FAILED;
    }
    if (v > SL_CACHE_SCHEMA) {
        snprintf(why, why_size,
                 "its index has schema version %lld, newer than this sluice's %d (a newer "
                 "sluice made it)",
                 (long long)v, SL_CACHE_SCHEMA);
        return INDEX_NEWER;
    }
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &st, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        snprintf(why, why_size, "%s", sqlite_why(rc, sqlite3_errmsg(db)));
        sqlite3_finalize(st);
        return is_corrupt_rc(rc) ? INDEX_ASIDE : INDEX_FAILED;
    }
    const unsigned char *qc = sqlite3_column_text(st, 0);
    int ok = qc && !strcmp((const char *)qc, "ok");
    sqlite3_finalize(st);
    if (!ok) {
        snprintf(why, why_size, "quick_check failed");
        return INDEX_ASIDE;
    }
    rc = db_int(db, "SELECT count(*) FROM sqlite_master", &tables);
    if (rc != SQLITE_OK) {
        snprintf(why, why_size, "%s", sqlite_why(rc, sqlite3_errmsg(db)));
        return is_corrupt_rc(rc) ? INDEX_ASIDE : INDEX_FAILED;
    }
    if (tables > 0) {
        /* ours only with the format row and the tables of its version */
        int64_t n = 0;
        rc = db_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                        "name = 'meta'", &n);
        int64_t mine = 0, have_blobs = 0, have_memo = 0;
        if (rc == SQLITE_OK && n == 1)
            rc = db_int(db, "SELECT count(*) FROM meta WHERE key = 'format' AND "
                            "value = 'sluice-cache'", &mine);
        if (rc == SQLITE_OK)
            rc = db_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                            "name = 'blobs'", &have_blobs);
        if (rc == SQLITE_OK)
            rc = db_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                            "name = 'memo'", &have_memo);
        if (rc != SQLITE_OK) {
            snprintf(why, why_size, "%s", sqlite_why(rc, sqlite3_errmsg(db)));
            return is_corrupt_rc(rc) ? INDEX_ASIDE : INDEX_FAILED;
        }
        if (!mine || !have_blobs || (v != 1 && v != 2) || (v == 2 && !have_memo)) {
            snprintf(why, why_size, "not a sluice cache index");
            return INDEX_ASIDE;
        }
    }
    /* WAL: readers never wait for the writer; NORMAL: a commit is durable
     * at the next checkpoint, and a lost entry is only a blob gc records */
    rc = db_exec(db, "PRAGMA journal_mode = WAL");
    if (rc == SQLITE_OK)
        rc = db_exec(db, "PRAGMA synchronous = NORMAL");
    if (rc != SQLITE_OK) {
        snprintf(why, why_size, "%s", sqlite_why(rc, sqlite3_errmsg(db)));
        return is_corrupt_rc(rc) ? INDEX_ASIDE : INDEX_FAILED;
    }
    if (tables > 0 && v == SL_CACHE_SCHEMA) {
        (void)db_exec(db, SCHEMA_NAMES);  /* advisory: listed when there */
        return INDEX_OK;
    }
    rc = db_begin(db);
    if (rc == SQLITE_OK) {
        if (tables == 0) {
            rc = db_exec(db, SCHEMA_META);
            if (rc == SQLITE_OK)
                rc = db_exec(db, SCHEMA_BLOBS);
        }
        if (rc == SQLITE_OK) /* new, or version 1 migrated */
            rc = db_exec(db, SCHEMA_MEMO);
        if (rc == SQLITE_OK)
            rc = db_exec(db, "PRAGMA user_version = 2");
        rc = db_end(db, rc);
    }
    if (rc != SQLITE_OK) {
        snprintf(why, why_size, "%s", sqlite_why(rc, sqlite3_errstr(rc)));
        return INDEX_FAILED;
    }
    *version = SL_CACHE_SCHEMA;
    *created = tables == 0;
    (void)db_exec(db, SCHEMA_NAMES);  /* advisory: listed when there */
    return INDEX_OK;
}

/* Moves DIR/index.sqlite and its companion files to
 * DIR/corrupt/index.sqlite.NS. 0 or -1 with errno. */
static int move_aside(const sl_cache *c)
{
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
    int64_t ns = now_ns();
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        char *from = str_printf("%s/index.sqlite%s", c->dir, suffix[i]);
        char *to = str_printf("%s/corrupt/index.sqlite.%lld%s", c->dir, (long long)ns, suffix[i]);
        int rc = from && to ? rename(from, to) : -1;
        int e = from && to ? errno : ENOMEM;
        free(from);
        free(to);
        if (rc != 0 && e != ENOENT) {
            errno = e;
            return -1;
        }
    }
    return 0;
}

static int db_open(const sl_cache *c, sqlite3 **db)
{
    char *path = str_printf("%s/index.sqlite", c->dir);
    if (!path) {
        *db = NULL;
        return SQLITE_NOMEM;
    }
    /* NOMUTEX: the handle's mutex serialises the connection */
    int rc = sqlite3_open_v2(path, db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                             SQLITE_OPEN_NOMUTEX, NULL);
    free(path);
    if (*db)
        sqlite3_busy_timeout(*db, SL_CACHE_OPEN_BUSY_MS);
    return rc;
}

/* Records found blobs that have no entry (source "rebuilt", times from
 * their mtime), in one transaction. Under mu. SQLite status. */
static int record_found(sl_cache *c, const found_list *f, uint64_t *added)
{
    sqlite3_stmt *st = NULL;
    int rc = db_begin(c->db);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c->db,
                                "INSERT OR IGNORE INTO blobs(algorithm, digest, size, source,"
                                " created_ns, last_access_ns) VALUES(?, ?, ?, 'rebuilt', ?, ?)",
                                -1, &st, NULL);
    for (size_t i = 0; rc == SQLITE_OK && i < f->n; i++) {
        sqlite3_bind_text(st, 1, alg_dir(f->v[i].alg), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, f->v[i].hex, 64, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)f->v[i].size);
        sqlite3_bind_int64(st, 4, f->v[i].mtime_ns);
        sqlite3_bind_int64(st, 5, f->v[i].mtime_ns);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
            if (added)
                *added += (uint64_t)sqlite3_changes(c->db);
        }
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    return db_end(c->db, rc);
}

/* Opens, checks and if need be repairs the index, under DIR/lock (so that
 * two processes never both move it aside or create it). Turns c off on
 * failure. */
static void open_index(sl_cache *c)
{
    char *lock_path = str_printf("%s/lock", c->dir);
    int lock = lock_path ? open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    int e = lock_path ? errno : ENOMEM;
    free(lock_path);
    if (lock < 0) {
        turn_off(c, "opening its lock file failed: %s", strerror(e));
        return;
    }
    int rc;
    while ((rc = flock(lock, LOCK_EX)) != 0 && errno == EINTR)
        ;
    if (rc != 0) {
        turn_off(c, "locking it failed: %s", strerror(errno));
        close(lock);
        return;
    }
    clean_tmp(c);

    char why[512] = "";
    int64_t version = 0;
    sqlite3 *db = NULL;
    index_state s;
    int created = 0;
    rc = db_open(c, &db);
    if (rc != SQLITE_OK) {
        snprintf(why, sizeof why, "%s", sqlite_why(rc, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
        s = is_corrupt_rc(rc) ? INDEX_ASIDE : INDEX_FAILED;
    } else {
        s = prepare_index(db, &version, &created, why, sizeof why);
    }
    int rebuilt = 0;
    if (s == INDEX_ASIDE) {
        sqlite3_close(db);
        db = NULL;
        if (move_aside(c) != 0) {
            snprintf(why, sizeof why, "moving the corrupt index aside failed: %s", strerror(errno));
            s = INDEX_FAILED;
        } else {
            rc = db_open(c, &db);
            s = rc == SQLITE_OK ? prepare_index(db, &version, &created, why, sizeof why)
                                : INDEX_FAILED;
            if (rc != SQLITE_OK)
                snprintf(why, sizeof why, "%s", sqlite_why(rc, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
            if (s == INDEX_ASIDE) /* a fresh one bad again: give up */
                s = INDEX_FAILED;
            rebuilt = 1;
        }
    }
    /* an index made here (deleted, emptied, moved aside) learns the
     * blobs already there, so that ls, du, verify and the budget see them */
    if (s == INDEX_OK && (rebuilt || created)) {
        found_list f = {0};
        c->db = db;
        if (walk_blobs(c, &f) != 0)
            snprintf(why, sizeof why, "out of memory"), s = INDEX_FAILED;
        else if ((rc = record_found(c, &f, NULL)) != SQLITE_OK)
            snprintf(why, sizeof why, "%s", sqlite_why(rc, sqlite3_errstr(rc))), s = INDEX_FAILED;
        free(f.v);
        c->db = NULL;
    }
    if (s == INDEX_OK) {
        /* from here on, a write of the index waits only a moment for
         * another process's lock (see "Busy" in cache.h) */
        sqlite3_busy_timeout(db, SL_CACHE_BUSY_MS);
        c->db = db;
    } else {
        sqlite3_close(db);
        if (s == INDEX_NEWER)
            turn_off(c, "%s", why);
        else
            turn_off(c, "%s the index failed: %s", rebuilt ? "rebuilding" : "opening", why);
    }
    flock(lock, LOCK_UN);
    close(lock);
}

int sl_cache_open(const char *dir, uint64_t max_bytes, sl_cache **out, sl_err *err)
{
    *out = NULL;
    sl_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory opening the cache %s", dir);
    }
    /* a trailing slash would make every path in messages read oddly */
    for (size_t n = strlen(c->dir); n > 1 && c->dir[n - 1] == '/'; n--)
        c->dir[n - 1] = '\0';
    c->max_bytes = max_bytes;
    atomic_init(&c->state, ON);
    atomic_init(&c->steps, 0);
    pthread_mutex_init(&c->mu, NULL);
    parse_fault(c);
    *out = c;

    pthread_once(&sqlite_once, sqlite_init);
    if (sqlite_init_rc != SQLITE_OK || !sqlite3_threadsafe()) {
        turn_off(c, "SQLite cannot be used here (%s)",
                 sqlite_init_rc != SQLITE_OK ? sqlite3_errstr(sqlite_init_rc)
                                             : "built without thread support");
        return SLUICE_OK;
    }
    static const char *const sub[] = {"", "/blobs", "/tmp", "/corrupt"};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        char *p = str_printf("%s%s", c->dir, sub[i]);
        int rc = -1;
        if (!p)
            errno = ENOMEM;
        else if (c->fault == FAULT_EROFS)
            errno = EROFS;
        else
            rc = i == 0 ? sl_cache_mkdir_p(p) : mkdir_one(p);
        int e = errno;
        free(p);
        if (rc != 0) {
            if (e == ENOMEM) {
                sl_cache_close(c);
                *out = NULL;
                return sl_fail(err, SLUICE_E_NOMEM, "out of memory opening the cache %s", dir);
            }
            turn_off(c, "making the directory failed: %s", errno_why(e));
            return SLUICE_OK;
        }
    }
    open_index(c);
    return SLUICE_OK;
}

static int insert_pending(sl_cache *c, int64_t t, uint64_t *n);
static void pending_unlink(sl_cache *c);

void sl_cache_close(sl_cache *c)
{
    if (!c)
        return;
    if (c->npend) {
        /* one more try for the blobs that waited for their entry (the
         * short wait, whatever retry_ns says); what is still locked out
         * goes, so that no blob is left outside the index */
        uint64_t n = 0;
        int rc = is_off(c) ? SQLITE_ABORT : db_begin(c->db);
        if (rc == SQLITE_OK)
            rc = insert_pending(c, access_ns(c), &n);
        rc = is_off(c) ? rc : db_end(c->db, rc);
        if (rc == SQLITE_OK)
            pending_clear(c);
        else
            pending_unlink(c);
    }
    free(c->pend);
    sqlite3_close(c->db);
    pthread_mutex_destroy(&c->mu);
    free(c->dir);
    free(c);
}

void sl_cache_set_patient(sl_cache *c)
{
    if (!c || !c->db)
        return;
    pthread_mutex_lock(&c->mu);
    sqlite3_busy_timeout(c->db, SL_CACHE_OPEN_BUSY_MS);
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- blobs */

/* Deletes entries (alg, hex), inside a transaction, under mu. */
static int delete_entries_in(sl_cache *c, const char *const *algs, const char (*hex)[65], size_t n)
{
    if (n == 0)
        return SQLITE_OK;
    sqlite3_stmt *st = NULL;
    /* the names of those blobs first (advisory: no names table, none) */
    if (sqlite3_prepare_v2(c->db, "DELETE FROM names WHERE algorithm = ? AND digest = ?", -1,
                           &st, NULL) == SQLITE_OK)
        for (size_t i = 0; i < n; i++) {
            sqlite3_bind_text(st, 1, algs[i], -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, hex[i], 64, SQLITE_STATIC);
            (void)sqlite3_step(st);
            sqlite3_reset(st);
        }
    sqlite3_finalize(st);
    st = NULL;
    int rc = sqlite3_prepare_v2(c->db, "DELETE FROM blobs WHERE algorithm = ? AND digest = ?",
                                -1, &st, NULL);
    for (size_t i = 0; rc == SQLITE_OK && i < n; i++) {
        sqlite3_bind_text(st, 1, algs[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, hex[i], 64, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    return rc;
}

static void drop_hex(sl_cache *c, sluice_algorithm alg, const char hex[65])
{
    char *path = sl_cache_blob_path(c, alg, hex);
    if (!path)
        return;
    /* the file inside the entry's transaction: see the top of this file */
    pthread_mutex_lock(&c->mu);
    const char *a = alg_dir(alg);
    int rc = db_begin(c->db);
    if (rc == SQLITE_OK)
        rc = delete_entries_in(c, &a, (const char(*)[65])hex, 1);
    if (rc == SQLITE_OK)
        unlink(path);
    rc = db_end(c->db, rc);
    if (rc != SQLITE_OK)
        db_trouble(c, rc, "deleting an entry");
    /* the index locked by another process: the bad bytes go all the same
     * (an entry left naming no blob is a miss, and gc deletes it) */
    if ((rc & 0xff) == SQLITE_BUSY)
        unlink(path);
    pthread_mutex_unlock(&c->mu);
    free(path);
}

void sl_cache_drop(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32])
{
    if (!c || is_off(c) || !alg_dir(alg))
        return;
    char hex[65];
    drop_hex(c, alg, sl_hex_digest(hex, digest));
}

int sl_cache_open_blob(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32],
                       uint64_t size, char **path)
{
    if (path)
        *path = NULL;
    if (!c || is_off(c) || !alg_dir(alg))
        return -1;
    char hex[65];
    sl_hex_digest(hex, digest);
    char *p = sl_cache_blob_path(c, alg, hex);
    if (!p)
        return -1;
    /* O_NONBLOCK: a FIFO put there must not block the open (and the
     * engine's lock with it); cleared once it is known a regular file */
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st = {0};
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size &&
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) {
        if (path)
            *path = p;
        else
            free(p);
        return fd;
    }
    int wrong_size = fd >= 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size != size;
    if (fd >= 0)
        close(fd);
    free(p);
    if (wrong_size) /* cannot be this tensor: whatever it is, it is bad */
        drop_hex(c, alg, hex);
    return -1;
}

/* The blobs an eviction deleted. */
typedef struct victim_list {
    char **path;
    size_t n, cap;
    uint64_t bytes;
} victim_list;

static void victims_free(victim_list *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->path[i]);
    free(v->path);
}

/* Inside a transaction, under mu: deletes the entries of least recently
 * used blobs until the rest take at most max_bytes, never (keep_alg,
 * keep_hex) when given, and their files; their paths go to *v. The
 * victims are chosen by one query run to its end and deleted after, so
 * that no row is deleted under a statement still reading the table.
 * SQLite status. */
static int evict_entries(sl_cache *c, uint64_t max_bytes, const char *keep_alg,
                         const char *keep_hex, victim_list *v)
{
    int64_t total = 0;
    int rc = db_int(c->db, "SELECT COALESCE(SUM(size), 0) FROM blobs", &total);
    if (rc != SQLITE_OK || (uint64_t)total <= max_bytes)
        return rc;
    const char **algs = NULL;
    char(*hex)[65] = NULL;
    size_t n = 0, cap = 0;
    sqlite3_stmt *sel = NULL;
    rc = sqlite3_prepare_v2(c->db, "SELECT algorithm, digest, size FROM blobs"
                                   " ORDER BY last_access_ns, rowid", -1, &sel, NULL);
    uint64_t left = (uint64_t)total;
    while (rc == SQLITE_OK && left > max_bytes) {
        int s = sqlite3_step(sel);
        if (s == SQLITE_DONE)
            break;
        if (s != SQLITE_ROW) {
            rc = s;
            break;
        }
        const char *a = (const char *)sqlite3_column_text(sel, 0);
        const char *h = (const char *)sqlite3_column_text(sel, 1);
        uint64_t size = (uint64_t)sqlite3_column_int64(sel, 2);
        sluice_algorithm alg;
        /* a row this version cannot name is left to the sluice that wrote it */
        if (!a || !h || sl_cache_alg_parse(a, &alg) != 0 || !is_hex(h, 64) ||
            (keep_alg && !strcmp(a, keep_alg) && !strcmp(h, keep_hex)))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            const char **na = realloc(algs, ncap * sizeof *na);
            if (na)
                algs = na;
            char(*nh)[65] = na ? realloc(hex, ncap * sizeof *nh) : NULL;
            char **np = nh ? realloc(v->path, ncap * sizeof *np) : NULL;
            if (nh)
                hex = nh;
            if (np)
                v->path = np;
            if (!np) {
                rc = SQLITE_NOMEM;
                break;
            }
            cap = v->cap = ncap;
        }
        if (!(v->path[n] = sl_cache_blob_path(c, alg, h))) {
            rc = SQLITE_NOMEM;
            break;
        }
        algs[n] = alg_dir(alg);
        memcpy(hex[n], h, 65);
        v->n = ++n;
        v->bytes += size;
        left -= size < left ? size : left;
    }
    sqlite3_finalize(sel);
    if (rc == SQLITE_OK)
        rc = delete_entries_in(c, algs, (const char(*)[65])hex, n);
    if (rc == SQLITE_OK)
        for (size_t i = 0; i < n; i++)
            unlink(v->path[i]); /* ENOENT: another process was first */
    free(algs);
    free(hex);
    return rc;
}

/* Writes all of n bytes to fd, each write() at most SL_CACHE_WRITE_MAX
 * bytes and one fault-hook step. 0 or -1 with errno. */
static int write_all(sl_cache *c, int fd, const uint8_t *p, uint64_t n)
{
    while (n > 0) {
        size_t len = n < SL_CACHE_WRITE_MAX ? (size_t)n : SL_CACHE_WRITE_MAX;
        int fail;
        uint64_t step = step_begin(c, &fail);
        if (fail)
            return -1;
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        step_end(c, step);
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (uint64_t)w;
    }
    return 0;
}

static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Puts the bytes in place as the blob at final (its directory xx made if
 * need be): temporary file, writes, fsync, rename, the directory's fsync.
 * 0, or -1 with errno and *what naming the step that failed. */
static int fill_blob(sl_cache *c, const char *final, const char *xx, const char *algdir,
                     const void *data, uint64_t size, const char **what)
{
    char *tmp = NULL;
    int fd = -1, fail;
    uint64_t step;
    *what = "making a temporary file";
    for (int tries = 0; fd < 0 && tries < 8; tries++) {
        uint64_t r;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
            r = (uint64_t)now_ns() ^ ((uint64_t)(uintptr_t)&r << 16) ^ (uint64_t)tries;
        free(tmp);
        if (!(tmp = str_printf("%s/tmp/%016llx.fill", c->dir, (unsigned long long)r))) {
            errno = ENOMEM;
            return -1;
        }
        step = step_begin(c, &fail);
        if (fail) {
            free(tmp);
            return -1;
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) {
            int e = errno;
            free(tmp);
            errno = e;
            return -1;
        }
        if (fd < 0)
            continue;
        /* locked for as long as this fill lives (clean_tmp's sign of
         * life); a cleaner that came between the open and the lock took
         * the lock or the name first: another name, then */
        struct stat st;
        int locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
        /* (a file system without flock: unlocked, left to the age rule) */
        if ((!locked && errno == EWOULDBLOCK) || fstat(fd, &st) != 0 || st.st_nlink == 0) {
            close(fd);
            fd = -1;
            continue;
        }
        step_end(c, step);
    }
    if (fd < 0) {
        free(tmp);
        errno = EEXIST;
        return -1;
    }
    int rc = -1;
    *what = "writing a blob";
    if (write_all(c, fd, data, size) != 0)
        goto out;
    *what = "syncing a blob";
    step = step_begin(c, &fail);
    if (fail || fsync(fd) != 0)
        goto out;
    step_end(c, step);
    *what = "making a blob's directory";
    if ((mkdir_one(algdir) != 0 && errno != EEXIST) || (mkdir_one(xx) != 0 && errno != EEXIST))
        goto out;
    *what = "renaming a blob into place";
    step = step_begin(c, &fail);
    if (fail || rename(tmp, final) != 0)
        goto out;
    step_end(c, step);
    free(tmp);
    tmp = NULL; /* it is the blob now */
    *what = "syncing a blob's directory";
    step = step_begin(c, &fail);
    if (fail || fsync_dir(xx) != 0) {
        /* in place but maybe not durable: not recorded, so not kept */
        int e = errno;
        unlink(final);
        errno = e;
        goto out;
    }
    step_end(c, step);
    rc = 0;
out:;
    int e = errno;
    close(fd);
    if (tmp)
        unlink(tmp);
    free(tmp);
    errno = e;
    return rc;
}

/* Inside a transaction, under mu: the entry of the blob (alg, hex) at
 * path, of size bytes, from source, used at t (or a newer access time for
 * one recorded before), if the blob is still in place: an eviction of the
 * same digest may have unlinked it since its rename (see the top of this
 * file). *vanished: it was not. SQLite status. */
/* Inside a transaction, under mu: that blob (a, hex) holds tensor
 * name->tensor of model name->model. Advisory: a failure (no names table,
 * made by a sluice that lacked it and not writable now) records nothing
 * and fails nothing. */
static void insert_name(sl_cache *c, const char *a, const char *hex, const sluice_cache_name *name)
{
    sqlite3_stmt *st = NULL;
    if (!name || !name->model || !name->tensor ||
        sqlite3_prepare_v2(c->db, "INSERT OR IGNORE INTO names(algorithm, digest, model, tensor)"
                                  " VALUES(?, ?, ?, ?)", -1, &st, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        return;
    }
    sqlite3_bind_text(st, 1, a, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, hex, 64, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, name->model, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, name->tensor, name->tensor_len > INT_MAX ? INT_MAX
                      : (int)name->tensor_len, SQLITE_STATIC);
    (void)sqlite3_step(st);
    sqlite3_finalize(st);
}

static int insert_entry(sl_cache *c, const char *a, const char *hex, const char *path,
                        uint64_t size, const char *source, const sluice_cache_name *name,
                        int64_t t, int *vanished)
{
    struct stat bs;
    *vanished = 0;
    if (lstat(path, &bs) != 0 || !S_ISREG(bs.st_mode) || (uint64_t)bs.st_size != size) {
        *vanished = 1;
        return SQLITE_OK;
    }
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db,
                                "INSERT INTO blobs(algorithm, digest, size, source, created_ns,"
                                " last_access_ns) VALUES(?, ?, ?, ?, ?, ?)"
                                " ON CONFLICT(algorithm, digest) DO UPDATE SET"
                                " size = excluded.size, last_access_ns = excluded.last_access_ns",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, a, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, hex, 64, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)size);
        sqlite3_bind_text(st, 4, source ? source : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, t);
        sqlite3_bind_int64(st, 6, t);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_OK)
        insert_name(c, a, hex, name);
    return rc;
}

/* Keeps the blob (alg, hex) waiting for its entry (under mu). 0, or -1
 * out of memory. */
static int pending_add(sl_cache *c, sluice_algorithm alg, const char *hex, uint64_t size,
                       const char *source, const sluice_cache_name *name)
{
    if (c->npend == c->cap_pend) {
        size_t cap = c->cap_pend ? c->cap_pend * 2 : 16;
        pending_blob *p = realloc(c->pend, cap * sizeof *p);
        if (!p)
            return -1;
        c->pend = p;
        c->cap_pend = cap;
    }
    pending_blob *b = &c->pend[c->npend];
    b->name = (sluice_cache_name){0};
    if (!(b->source = strdup(source ? source : "")))
        return -1;
    if (name && name->model && name->tensor) {
        char *model = strdup(name->model), *tensor = malloc(name->tensor_len + 1);
        if (!model || !tensor) {
            free(model);
            free(tensor);
            free(b->source);
            return -1;
        }
        memcpy(tensor, name->tensor, name->tensor_len);
        tensor[name->tensor_len] = '\0';
        b->name = (sluice_cache_name){model, tensor, name->tensor_len};
    }
    b->alg = alg;
    memcpy(b->hex, hex, 65);
    b->size = size;
    c->npend++;
    return 0;
}

/* Inside a transaction, under mu: the entries of the blobs waiting for
 * one (those gone since are skipped); *n gets how many were recorded.
 * SQLite status. */
static int insert_pending(sl_cache *c, int64_t t, uint64_t *n)
{
    int rc = SQLITE_OK;
    for (size_t i = 0; rc == SQLITE_OK && i < c->npend; i++) {
        const pending_blob *b = &c->pend[i];
        char *path = sl_cache_blob_path(c, b->alg, b->hex);
        int vanished = 0;
        rc = path ? insert_entry(c, alg_dir(b->alg), b->hex, path, b->size, b->source,
                                 &b->name, t, &vanished)
                  : SQLITE_NOMEM;
        free(path);
        *n += rc == SQLITE_OK && !vanished;
    }
    return rc;
}

/* Whether the index has an entry for (alg, hex) now: 1 yes, 0 no, -1 not
 * known (the read failed). A read needs no write lock (WAL). */
static int indexed(sl_cache *c, sluice_algorithm alg, const char *hex)
{
    sqlite3_stmt *st = NULL;
    int rc = c->db ? sqlite3_prepare_v2(c->db, "SELECT 1 FROM blobs WHERE algorithm = ? AND "
                                        "digest = ?", -1, &st, NULL)
                   : SQLITE_MISUSE;
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, alg_dir(alg), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, hex, 64, SQLITE_STATIC);
        rc = sqlite3_step(st);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

/* Deletes the blobs still waiting for their entry (under mu): a blob no
 * entry names would be outside the budget. Only its own store puts an
 * entry in place, unless another process stored the same digest
 * meanwhile (its rename replaced the file with the same bytes, or this
 * one replaced its): then its entry names this very file, which is kept
 * (deleted, the entry would name a missing blob: a later miss). The index
 * is read for that just before each unlink, and the blob kept when the
 * read fails (but for a cache turned off); what remains is an entry committed between that read and
 * the unlink, a window of microseconds (then the entry names a missing
 * blob, which a reader takes for a miss and gc deletes). */
static void pending_unlink(sl_cache *c)
{
    for (size_t i = 0; i < c->npend; i++) {
        char *path = sl_cache_blob_path(c, c->pend[i].alg, c->pend[i].hex);
        int k = path ? indexed(c, c->pend[i].alg, c->pend[i].hex) : 1;
        if (k == 0 || (k < 0 && is_off(c)))   /* an index turned off: as before */
            unlink(path);
        free(path);
    }
    pending_clear(c);
}

int sl_cache_store(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32], const void *data,
                   uint64_t size, const char *source, uint64_t *evicted)
{
    return sl_cache_store_named(c, alg, digest, data, size, source, NULL, evicted);
}

int sl_cache_store_named(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32],
                         const void *data, uint64_t size, const char *source,
                         const sluice_cache_name *name, uint64_t *evicted)
{
    if (evicted)
        *evicted = 0;
    const char *a = alg_dir(alg);
    if (!c || is_off(c) || !a || size > c->max_bytes || size > INT64_MAX)
        return 0;
    char hex[65];
    sl_hex_digest(hex, digest);
    char *final = sl_cache_blob_path(c, alg, hex);
    char *algdir = str_printf("%s/blobs/%s", c->dir, a);
    char *xx = str_printf("%s/blobs/%s/%.2s", c->dir, a, hex);
    int stored = 0;
    if (!final || !algdir || !xx)
        goto out;
    const char *what;
    if (fill_blob(c, final, xx, algdir, data, size, &what) != 0) {
        if (is_fatal_errno(errno))
            turn_off(c, "%s failed: %s", what, errno_why(errno));
        goto out;
    }

    /* the insert (or a newer access time for a blob stored before), the
     * entries of blobs that waited for one, and the eviction they call
     * for, in one transaction */
    victim_list v = {0};
    int fail;
    uint64_t step = step_begin(c, &fail);
    pthread_mutex_lock(&c->mu);
    int rc;
    uint64_t recorded = 0;
    if (fail) {
        rc = SQLITE_FULL;
        turn_off(c, "recording a blob failed: %s", DISK_FULL);
        unlink(final);
    } else if (mono_ns() < c->retry_ns) {
        /* the index was locked a moment ago: no wait for it now, the
         * entry waits instead (see "Busy" in cache.h) */
        atomic_fetch_add_explicit(&c->busy, 1, memory_order_relaxed);
        rc = SQLITE_BUSY;
        if (pending_add(c, alg, hex, size, source, name) != 0)
            unlink(final);
    } else {
        int64_t t = access_ns(c);
        int vanished = 0;
        rc = db_begin(c->db);
        if (rc == SQLITE_OK)
            rc = insert_pending(c, t, &recorded);
        if (rc == SQLITE_OK)
            rc = insert_entry(c, a, hex, final, size, source, name, t, &vanished);
        if (rc == SQLITE_OK)
            rc = evict_entries(c, c->max_bytes, a, hex, &v);
        rc = db_end(c->db, rc);
        if ((rc & 0xff) == SQLITE_BUSY) {
            /* another process holds the write lock: kept, recorded with
             * a later store or deleted at close */
            note_busy(c);
            if (pending_add(c, alg, hex, size, source, name) != 0)
                unlink(final);
        } else if (rc == SQLITE_OK) {
            pending_clear(c);
            recorded += !vanished;
        } else {
            db_trouble(c, rc, "recording a blob");
            /* no entry: not kept, so that every blob's bytes are counted
             * (a store of the same digest racing this failure may lose
             * its blob: a miss, and gc deletes its entry) */
            unlink(final);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == SQLITE_OK) {
        step_end(c, step);
        if (evicted)
            *evicted = v.n;
        stored = recorded > INT_MAX ? INT_MAX : (int)recorded;
    }
    victims_free(&v);
out:
    free(final);
    free(algdir);
    free(xx);
    return stored;
}

void sl_cache_touch(sl_cache *c, sluice_algorithm alg, const uint8_t (*digests)[32], size_t n)
{
    const char *a = alg_dir(alg);
    if (!c || is_off(c) || !a || n == 0)
        return;
    pthread_mutex_lock(&c->mu);
    sqlite3_stmt *st = NULL;
    int64_t t = access_ns(c);
    int rc = db_begin(c->db);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c->db, "UPDATE blobs SET last_access_ns = ?"
                                       " WHERE algorithm = ? AND digest = ?", -1, &st, NULL);
    for (size_t i = 0; rc == SQLITE_OK && i < n; i++) {
        char hex[65];
        sl_hex_digest(hex, digests[i]);
        sqlite3_bind_int64(st, 1, t);
        sqlite3_bind_text(st, 2, a, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, hex, 64, SQLITE_TRANSIENT);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    rc = db_end(c->db, rc);
    if (rc != SQLITE_OK)
        db_trouble(c, rc, "marking blobs used");
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- memo */

typedef struct memo_hit {
    uint64_t offset, nbytes;
    uint8_t digest[32];
} memo_hit;

/* Binds a file's identity, the memo's key (dev, ino, size, mtime_ns,
 * ctime_ns), to parameters 1 to 5 of st. */
static void bind_file_id(sqlite3_stmt *st, const sl_file_id *id)
{
    sqlite3_bind_int64(st, 1, (sqlite3_int64)id->dev);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)id->ino);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)id->size);
    sqlite3_bind_int64(st, 4, id->mtime_ns);
    sqlite3_bind_int64(st, 5, id->ctime_ns);
}

void sl_cache_memo_each(sl_cache *c, const sl_file_id *id, sluice_algorithm alg,
                        void (*fn)(void *user, uint64_t offset, uint64_t nbytes,
                                   const uint8_t digest[32]),
                        void *user)
{
    const char *a = alg_dir(alg);
    if (!c || is_off(c) || !a)
        return;
    /* collected first, called after: fn runs without the lock */
    memo_hit *hits = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&c->mu);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db,
                                "SELECT offset, nbytes, digest FROM memo WHERE dev = ? AND ino = ?"
                                " AND size = ? AND mtime_ns = ? AND ctime_ns = ? AND algorithm = ?"
                                " ORDER BY offset", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        bind_file_id(st, id);
        sqlite3_bind_text(st, 6, a, -1, SQLITE_STATIC);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const char *h = (const char *)sqlite3_column_text(st, 2);
            memo_hit hit;
            if (!h || sl_cache_hex_parse(h, hit.digest) != 0)
                continue;
            hit.offset = (uint64_t)sqlite3_column_int64(st, 0);
            hit.nbytes = (uint64_t)sqlite3_column_int64(st, 1);
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                memo_hit *p = realloc(hits, ncap * sizeof *p);
                if (!p)
                    break; /* the ones so far: the rest are hashed */
                hits = p;
                cap = ncap;
            }
            hits[n++] = hit;
        }
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < n; i++)
        fn(user, hits[i].offset, hits[i].nbytes, hits[i].digest);
    free(hits);
}

void sl_cache_memo_record(sl_cache *c, const sl_file_id *id, int64_t opened_ns,
                          sluice_algorithm alg, uint64_t offset, uint64_t nbytes,
                          const uint8_t digest[32])
{
    const char *a = alg_dir(alg);
    if (!c || is_off(c) || !a)
        return;
    /* a write within the same clock tick as the identity was taken would
     * leave mtime and ctime as they are: only a file quiet for a second
     * is trusted to show every change in them */
    if (id->mtime_ns >= opened_ns - NS_PER_S || id->ctime_ns >= opened_ns - NS_PER_S)
        return;
    char hex[65];
    sl_hex_digest(hex, digest);
    pthread_mutex_lock(&c->mu);
    sqlite3_stmt *del = NULL, *ins = NULL;
    int rc = db_begin(c->db);
    /* the records of this inode under an older identity can never match
     * again: dropped here, so that the memo stays the size of the files */
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c->db, "DELETE FROM memo WHERE dev = ? AND ino = ? AND"
                                       " (size != ? OR mtime_ns != ? OR ctime_ns != ?)",
                                -1, &del, NULL);
    if (rc == SQLITE_OK) {
        bind_file_id(del, id);
        rc = sqlite3_step(del);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c->db, "INSERT OR REPLACE INTO memo(dev, ino, size, mtime_ns,"
                                       " ctime_ns, offset, nbytes, algorithm, digest, recorded_ns)"
                                       " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", -1, &ins, NULL);
    if (rc == SQLITE_OK) {
        bind_file_id(ins, id);
        sqlite3_bind_int64(ins, 6, (sqlite3_int64)offset);
        sqlite3_bind_int64(ins, 7, (sqlite3_int64)nbytes);
        sqlite3_bind_text(ins, 8, a, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 9, hex, 64, SQLITE_STATIC);
        sqlite3_bind_int64(ins, 10, now_ns());
        rc = sqlite3_step(ins);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    sqlite3_finalize(del);
    sqlite3_finalize(ins);
    rc = db_end(c->db, rc);
    if (rc != SQLITE_OK)
        db_trouble(c, rc, "recording a verified file");
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- administration */

/* The message of a failed administration call (under mu; rc its code). */
static int admin_fail(sl_cache *c, sl_err *err, int rc, const char *what)
{
    if (rc == SQLITE_NOMEM)
        return sl_fail(err, SLUICE_E_NOMEM, "cache %s: out of memory %s", c->dir, what);
    return sl_fail(err, SLUICE_E_IO, "cache %s: %s: %s", c->dir, what, sqlite_why(rc, sqlite3_errstr(rc)));
}

static int admin_off(const sl_cache *c, sl_err *err)
{
    const char *w = sl_cache_warning(c);
    return sl_fail(err, SLUICE_E_IO, "%s", w ? w : "the cache is turned off");
}

void sl_cache_rows_free(sl_cache_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rows[i].source);
        for (size_t k = 0; k < rows[i].nnames; k++) {
            free((char *)rows[i].names[k].model);
            free((char *)rows[i].names[k].tensor);
        }
        free(rows[i].names);
    }
    free(rows);
}

static int row_key_cmp(const void *a, const void *b)
{
    const sl_cache_row *x = *(const sl_cache_row *const *)a, *y = *(const sl_cache_row *const *)b;
    return x->alg != y->alg ? (x->alg < y->alg ? -1 : 1) : strcmp(x->digest, y->digest);
}

/* Adds model and tensor (len bytes) to r's names. 0, or -1 out of memory. */
static int row_add_name(sl_cache_row *r, const char *model, const char *tensor, size_t len)
{
    sluice_cache_name *v = realloc(r->names, (r->nnames + 1) * sizeof *v);
    if (!v)
        return -1;
    r->names = v;
    char *m = strdup(model), *t = malloc(len + 1);
    if (!m || !t) {
        free(m);
        free(t);
        return -1;
    }
    memcpy(t, tensor, len);
    t[len] = '\0';
    v[r->nnames++] = (sluice_cache_name){m, t, len};
    return 0;
}

/* Under mu: the names table's rows, each added to its blob's row among
 * rows[0..n) (advisory: no table, no names). SQLite status. */
static int rows_names(sl_cache *c, sl_cache_row *rows, size_t n)
{
    if (n == 0)
        return SQLITE_OK;
    sl_cache_row **by = malloc(n * sizeof *by);
    if (!by)
        return SQLITE_NOMEM;
    for (size_t i = 0; i < n; i++)
        by[i] = &rows[i];
    qsort(by, n, sizeof *by, row_key_cmp);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT algorithm, digest, model, tensor FROM names"
                                       " ORDER BY model, tensor", -1, &st, NULL);
    if (rc != SQLITE_OK) {  /* a cache whose index lacks the table: none */
        free(by);
        return SQLITE_OK;
    }
    for (;;) {
        int s = sqlite3_step(st);
        if (s != SQLITE_ROW) {
            rc = s == SQLITE_DONE ? SQLITE_OK : s;
            break;
        }
        const char *a = (const char *)sqlite3_column_text(st, 0);
        const char *h = (const char *)sqlite3_column_text(st, 1);
        const char *model = (const char *)sqlite3_column_text(st, 2);
        const char *tensor = (const char *)sqlite3_column_text(st, 3);
        size_t len = (size_t)sqlite3_column_bytes(st, 3);
        sl_cache_row key = {0}, *kp = &key;
        if (!a || !h || !model || !tensor || sl_cache_alg_parse(a, &key.alg) != 0 ||
            !is_hex(h, 64))
            continue;
        memcpy(key.digest, h, 65);
        sl_cache_row **hit = bsearch(&kp, by, n, sizeof *by, row_key_cmp);
        if (hit && row_add_name(*hit, model, tensor, len) != 0) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    sqlite3_finalize(st);
    free(by);
    return rc;
}

int sl_cache_rows(sl_cache *c, sl_cache_row **out, size_t *count, sl_err *err)
{
    *out = NULL;
    *count = 0;
    if (is_off(c))
        return admin_off(c, err);
    sl_cache_row *rows = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&c->mu);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT algorithm, digest, size, source, created_ns,"
                                       " last_access_ns FROM blobs ORDER BY last_access_ns, rowid",
                                -1, &st, NULL);
    while (rc == SQLITE_OK) {
        int s = sqlite3_step(st);
        if (s == SQLITE_DONE)
            break;
        if (s != SQLITE_ROW) {
            rc = s;
            break;
        }
        const char *a = (const char *)sqlite3_column_text(st, 0);
        const char *h = (const char *)sqlite3_column_text(st, 1);
        const char *src = (const char *)sqlite3_column_text(st, 3);
        sluice_algorithm alg;
        if (!a || !h || sl_cache_alg_parse(a, &alg) != 0 || !is_hex(h, 64))
            continue; /* not a row this version can name: left to its writer */
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            sl_cache_row *p = realloc(rows, ncap * sizeof *p);
            if (!p) {
                rc = SQLITE_NOMEM;
                break;
            }
            rows = p;
            cap = ncap;
        }
        sl_cache_row *r = &rows[n];
        r->alg = alg;
        memcpy(r->digest, h, 65);
        r->names = NULL;
        r->nnames = 0;
        r->size = (uint64_t)sqlite3_column_int64(st, 2);
        r->created_ns = sqlite3_column_int64(st, 4);
        r->last_access_ns = sqlite3_column_int64(st, 5);
        if (!(r->source = strdup(src ? src : ""))) {
            rc = SQLITE_NOMEM;
            break;
        }
        n++;
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_OK)
        rc = rows_names(c, rows, n);
    if (rc != SQLITE_OK) {
        int code = admin_fail(c, err, rc, "listing the entries");
        pthread_mutex_unlock(&c->mu);
        sl_cache_rows_free(rows, n);
        return code;
    }
    pthread_mutex_unlock(&c->mu);
    *out = rows;
    *count = n;
    return SLUICE_OK;
}

int sl_cache_usage(sl_cache *c, uint64_t *bytes, uint64_t *entries, sl_err *err)
{
    *bytes = *entries = 0;
    if (is_off(c))
        return admin_off(c, err);
    pthread_mutex_lock(&c->mu);
    int64_t b = 0, n = 0;
    int rc = db_int(c->db, "SELECT COALESCE(SUM(size), 0) FROM blobs", &b);
    if (rc == SQLITE_OK)
        rc = db_int(c->db, "SELECT count(*) FROM blobs", &n);
    int code = rc == SQLITE_OK ? SLUICE_OK : admin_fail(c, err, rc, "counting the entries");
    pthread_mutex_unlock(&c->mu);
    *bytes = (uint64_t)b;
    *entries = (uint64_t)n;
    return code;
}

int sl_cache_orphans(sl_cache *c, sl_cache_row **out, size_t *count, sl_err *err)
{
    *out = NULL;
    *count = 0;
    if (is_off(c))
        return admin_off(c, err);
    found_list f = {0};
    if (walk_blobs(c, &f) != 0) {
        free(f.v);
        return sl_fail(err, SLUICE_E_NOMEM, "cache %s: out of memory listing the blobs", c->dir);
    }
    sl_cache_row *rows = NULL;
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT count(*) FROM blobs WHERE algorithm = ? AND"
                                       " digest = ?", -1, &st, NULL);
    if (rc == SQLITE_OK && f.n && !(rows = calloc(f.n, sizeof *rows)))
        rc = SQLITE_NOMEM;
    for (size_t i = 0; rc == SQLITE_OK && i < f.n; i++) {
        sqlite3_bind_text(st, 1, alg_dir(f.v[i].alg), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, f.v[i].hex, 64, SQLITE_STATIC);
        rc = sqlite3_step(st);
        int named = rc == SQLITE_ROW && sqlite3_column_int64(st, 0) > 0;
        rc = rc == SQLITE_ROW ? SQLITE_OK : rc;
        sqlite3_reset(st);
        if (rc != SQLITE_OK || named)
            continue;
        sl_cache_row *r = &rows[n];
        r->alg = f.v[i].alg;
        memcpy(r->digest, f.v[i].hex, 65);
        r->size = f.v[i].size;
        r->created_ns = r->last_access_ns = f.v[i].mtime_ns;
        if (!(r->source = strdup("")))
            rc = SQLITE_NOMEM;
        else
            n++;
    }
    sqlite3_finalize(st);
    int code = rc == SQLITE_OK ? SLUICE_OK : admin_fail(c, err, rc, "looking for blobs without an entry");
    pthread_mutex_unlock(&c->mu);
    free(f.v);
    if (code < 0) {
        sl_cache_rows_free(rows, n);
        return code;
    }
    *out = rows;
    *count = n;
    return SLUICE_OK;
}

int sl_cache_adopt(sl_cache *c, const sl_cache_row *row, sl_err *err)
{
    if (is_off(c))
        return admin_off(c, err);
    const char *a = alg_dir(row->alg);
    char *path = sl_cache_blob_path(c, row->alg, row->digest);
    if (!a || !path) {
        free(path);
        return sl_fail(err, SLUICE_E_NOMEM, "cache %s: out of memory recording a blob", c->dir);
    }
    pthread_mutex_lock(&c->mu);
    int vanished = 0;
    int rc = db_begin(c->db);
    if (rc == SQLITE_OK)
        rc = insert_entry(c, a, row->digest, path, row->size, "found by verify", NULL, access_ns(c),
                          &vanished);
    rc = db_end(c->db, rc);
    int code = rc == SQLITE_OK ? !vanished : admin_fail(c, err, rc, "recording a blob");
    pthread_mutex_unlock(&c->mu);
    free(path);
    return code;
}

/* What became of row's blob: 1 a regular file of its size (or it cannot
 * be looked at now: kept); 0 missing (or not a regular file); -1 a
 * regular file of another size, *wrong bytes. */
static int blob_state(const sl_cache *c, const sl_cache_row *row, uint64_t *wrong)
{
    char *p = sl_cache_blob_path(c, row->alg, row->digest);
    struct stat st;
    int rc = p ? lstat(p, &st) : -1;
    int e = p ? errno : ENOMEM;
    free(p);
    if (rc != 0)
        return e != ENOENT;
    if (!S_ISREG(st.st_mode))
        return 0;
    if ((uint64_t)st.st_size == row->size)
        return 1;
    *wrong = (uint64_t)st.st_size;
    return -1;
}

int sl_cache_gc(sl_cache *c, uint64_t max_bytes, uint64_t *freed_bytes, uint64_t *freed_entries,
                sl_err *err)
{
    *freed_bytes = *freed_entries = 0;
    if (is_off(c))
        return admin_off(c, err);
    clean_tmp(c);
    /* 1. entries whose blob is gone or of another size, deleted (with a
     * file of another size) inside one transaction, where no store can
     * race them: lstat is all the file work done under it */
    sl_cache_row *rows;
    size_t n;
    SL_TRY(sl_cache_rows(c, &rows, &n, err));
    int code = SLUICE_OK;
    pthread_mutex_lock(&c->mu);
    int rc = db_begin(c->db);
    for (size_t i = 0; rc == SQLITE_OK && i < n; i++) {
        uint64_t wrong = 0;
        int state = blob_state(c, &rows[i], &wrong);
        if (state == 1)
            continue;
        const char *a = alg_dir(rows[i].alg);
        rc = delete_entries_in(c, &a, (const char(*)[65])rows[i].digest, 1);
        if (rc == SQLITE_OK && state < 0) {
            char *p = sl_cache_blob_path(c, rows[i].alg, rows[i].digest);
            if (p && unlink(p) == 0)
                *freed_bytes += wrong;
            free(p);
        }
        if (rc == SQLITE_OK)
            ++*freed_entries;
    }
    /* names of blobs no entry names (an older sluice deleted them): advisory */
    if (rc == SQLITE_OK)
        (void)db_exec(c->db, "DELETE FROM names WHERE NOT EXISTS (SELECT 1 FROM blobs b WHERE"
                             " b.algorithm = names.algorithm AND b.digest = names.digest)");
    rc = db_end(c->db, rc);
    if (rc != SQLITE_OK) {
        code = admin_fail(c, err, rc, "deleting entries of missing blobs");
        *freed_bytes = *freed_entries = 0;
    }
    pthread_mutex_unlock(&c->mu);
    sl_cache_rows_free(rows, n);
    if (code < 0)
        return code;

    /* 2. blobs no entry names are recorded back, so that they are counted */
    found_list f = {0};
    if (walk_blobs(c, &f) != 0) {
        free(f.v);
        return sl_fail(err, SLUICE_E_NOMEM, "cache %s: out of memory collecting garbage", c->dir);
    }
    pthread_mutex_lock(&c->mu);
    rc = record_found(c, &f, NULL);
    if (rc != SQLITE_OK)
        code = admin_fail(c, err, rc, "recording blobs");
    pthread_mutex_unlock(&c->mu);
    free(f.v);
    if (code < 0)
        return code;

    /* 3. least recently used first, down to max_bytes */
    victim_list v = {0};
    pthread_mutex_lock(&c->mu);
    rc = db_begin(c->db);
    if (rc == SQLITE_OK)
        rc = evict_entries(c, max_bytes, NULL, NULL, &v);
    rc = db_end(c->db, rc);
    if (rc != SQLITE_OK)
        code = admin_fail(c, err, rc, "evicting");
    pthread_mutex_unlock(&c->mu);
    if (code == SLUICE_OK) {
        *freed_bytes += v.bytes;
        *freed_entries += v.n;
    }
    victims_free(&v);
    return code;
}

int sl_cache_clear(sl_cache *c, uint64_t *freed_bytes, uint64_t *freed_entries, sl_err *err)
{
    *freed_bytes = *freed_entries = 0;
    if (is_off(c))
        return admin_off(c, err);
    /* every file inside the transaction that deletes the entries: see the
     * top of this file */
    found_list f = {0};
    pthread_mutex_lock(&c->mu);
    int rc = db_begin(c->db);
    if (rc == SQLITE_OK)
        rc = db_exec(c->db, "DELETE FROM blobs");
    int64_t n = rc == SQLITE_OK ? sqlite3_changes64(c->db) : 0;
    if (rc == SQLITE_OK)
        rc = db_exec(c->db, "DELETE FROM memo");
    if (rc == SQLITE_OK)
        (void)db_exec(c->db, "DELETE FROM names");  /* advisory: may be missing */
    if (rc == SQLITE_OK && walk_blobs(c, &f) != 0)
        rc = SQLITE_NOMEM;
    for (size_t i = 0; rc == SQLITE_OK && i < f.n; i++) {
        char *p = sl_cache_blob_path(c, f.v[i].alg, f.v[i].hex);
        if (p && unlink(p) == 0)
            *freed_bytes += f.v[i].size;
        free(p);
    }
    rc = db_end(c->db, rc);
    int code = rc == SQLITE_OK ? SLUICE_OK : admin_fail(c, err, rc, "clearing the cache");
    pthread_mutex_unlock(&c->mu);
    free(f.v);
    if (code == SLUICE_OK)
        *freed_entries = (uint64_t)n;
    return code;
}

#else /* no SQLite: every handle is off */

int sl_cache_open(const char *dir, uint64_t max_bytes, sl_cache **out, sl_err *err)
{
    *out = NULL;
    sl_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory opening the cache %s", dir);
    }
    c->max_bytes = max_bytes;
    atomic_init(&c->state, ON);
    atomic_init(&c->steps, 0);
    pthread_mutex_init(&c->mu, NULL);
    turn_off(c, "this sluice was built without SQLite (libsqlite3-dev)");
    *out = c;
    return SLUICE_OK;
}

void sl_cache_close(sl_cache *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c->dir);
    free(c);
}

int sl_cache_open_blob(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32],
                       uint64_t size, char **path)
{
    if (path)
        *path = NULL;
    return -1;
}

int sl_cache_store(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32], const void *data,
                   uint64_t size, const char *source, uint64_t *evicted)
{
    if (evicted)
        *evicted = 0;
    return 0;
}

int sl_cache_store_named(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32],
                         const void *data, uint64_t size, const char *source,
                         const sluice_cache_name *name, uint64_t *evicted)
{
    (void)name;
    return sl_cache_store(c, alg, digest, data, size, source, evicted);
}

void sl_cache_drop(sl_cache *c, sluice_algorithm alg, const uint8_t digest[32])
{
}

void sl_cache_touch(sl_cache *c, sluice_algorithm alg, const uint8_t (*digests)[32], size_t n)
{
}

void sl_cache_memo_each(sl_cache *c, const sl_file_id *id, sluice_algorithm alg,
                        void (*fn)(void *user, uint64_t offset, uint64_t nbytes,
                                   const uint8_t digest[32]),
                        void *user)
{
}

void sl_cache_memo_record(sl_cache *c, const sl_file_id *id, int64_t opened_ns,
                          sluice_algorithm alg, uint64_t offset, uint64_t nbytes,
                          const uint8_t digest[32])
{
}

static int no_sqlite(const sl_cache *c, sl_err *err)
{
    return sl_fail(err, SLUICE_E_UNSUPPORTED, "%s", sl_cache_warning(c));
}

void sl_cache_set_patient(sl_cache *c)
{
}

void sl_cache_rows_free(sl_cache_row *rows, size_t n)
{
    free(rows);
}

int sl_cache_rows(sl_cache *c, sl_cache_row **out, size_t *count, sl_err *err)
{
    *out = NULL;
    *count = 0;
    return no_sqlite(c, err);
}

int sl_cache_usage(sl_cache *c, uint64_t *bytes, uint64_t *entries, sl_err *err)
{
    *bytes = *entries = 0;
    return no_sqlite(c, err);
}

int sl_cache_orphans(sl_cache *c, sl_cache_row **out, size_t *count, sl_err *err)
{
    *out = NULL;
    *count = 0;
    return no_sqlite(c, err);
}

int sl_cache_adopt(sl_cache *c, const sl_cache_row *row, sl_err *err)
{
    return no_sqlite(c, err);
}

int sl_cache_gc(sl_cache *c, uint64_t max_bytes, uint64_t *freed_bytes, uint64_t *freed_entries,
                sl_err *err)
{
    *freed_bytes = *freed_entries = 0;
    return no_sqlite(c, err);
}

int sl_cache_clear(sl_cache *c, uint64_t *freed_bytes, uint64_t *freed_entries, sl_err *err)
{
    *freed_bytes = *freed_entries = 0;
    return no_sqlite(c, err);
}

#endif
