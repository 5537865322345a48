/* engine_cache.c: the engine's side of the persistent cache (cache.c).
 *
 * Two uses, both decided per tensor:
 *
 *  - Blobs, for tensors of remote files that the manifest gives a digest
 *    for. When such a load starts, the blob named by the digest is opened;
 *    if it is there the load reads it (source SL_SRC_CACHE, file = the
 *    tensor, offset 0) through the local seam, hashed against the same
 *    digest as a fetch would be. A blob that fails is dropped and the load
 *    begins again from the remote file, into the same buffer. A tensor
 *    fetched from the remote file and verified is stored as a blob before
 *    its slot becomes READY: until the verdict is delivered nobody else
 *    touches the buffer, so no hold on the slot is needed.
 *
 *  - The verified-once memo (SLUICE_F_TRUST_UNCHANGED), for tensors of
 *    local files: at attach, the records of each file's identity whose
 *    offset, size and digest are the tensor's mark it (memo), and such a
 *    tensor loads unhashed (slot.hashed = 0). Each load first compares the
 *    file's identity with the one taken at attach: a file changed since is
 *    hashed after all. A hashed local tensor that matched is recorded
 *    for the next open (not for this one: its identity was taken before).
 *
 * A blob's descriptor is opened when its load is about to start (or when
 * the scheduler looks at the tensor to group it with a neighbour's read)
 * and closed when that load ends, or at close: a blob deleted by another
 * process after that is still read whole, one deleted before is a miss.
 * Whether a load reads its blob is decided by one probe: a tensor the
 * scheduler found without one joins its neighbour's read from the model's
 * file and is not probed again as it starts, so that a blob another
 * process stores in between never passes for the source of bytes that
 * came from the server (and is never dropped for that read's failure).
 */
#include "base/digest.h"
#include "cache/cache.h"
#include "engine/engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A tensor whose bytes the cache may hold: of a file worth caching (a
 * remote one), or of a model with a mirror worth caching (a tensor a
 * remote mirror delivered is kept, so that a damaged primary does not
 * cost the mirror's bytes again at every load), with a digest to check,
 * not empty. */
static int blob_candidate(const sl_engine *e, size_t i)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    return e->blob && ((e->ix->files[t->file_index].src->caps & SL_SRC_WORTH_CACHING) ||
                       e->mirror_caching) &&
           t->nbytes && sl_expected_digest(e, i);
}

static void close_blob(sl_engine *e, size_t i)
{
    sl_file *b = &e->blob[i];
    if (b->fd >= 0)
        close(b->fd);
    b->fd = -1;
    free(b->path);
    b->path = NULL;
}

/* Memo records of one file: each one that names a tensor of the file by
 * offset and size, with the digest the manifest gives it, vouches for it. */
typedef struct memo_scan {
    sl_engine *e;
    size_t file;
} memo_scan;

static void memo_found(void *user, uint64_t offset, uint64_t nbytes, const uint8_t digest[32])
{
    memo_scan *ms = user;
    sl_engine *e = ms->e;
    const sl_file *f = &e->ix->files[ms->file];
    /* Tensors of a file are in offset order: binary search. */
    size_t lo = f->first_tensor, hi = f->first_tensor + f->tensor_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->ix->tensors[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < f->first_tensor + f->tensor_count &&
                        e->ix->tensors[i].offset == offset; i++) {
        const unsigned char *want = sl_expected_digest(e, i);
        if (e->ix->tensors[i].nbytes == nbytes && nbytes && want && !memcmp(want, digest, 32)) {
            e->memo[i] = 1;
            sl_slot_set_hashed(e, i, 0);
        }
    }
}

int sl_engine_attach_cache(sl_engine *e, sl_cache *c, const char *model, sl_err *err)
{
    size_t n1 = e->n ? e->n : 1;
    e->cache = c;
    e->cache_model = model;
    int remote = (e->ix->caps_any & SL_SRC_WORTH_CACHING) != 0 || e->mirror_caching;
    int memo = (e->flags & SLUICE_F_TRUST_UNCHANGED) && !(e->flags & SLUICE_F_HASH_ALL);
    if (remote) {
        if (!(e->blob = calloc(n1, sizeof *e->blob)) || !(e->blob_hit = calloc(n1, 1)))
            return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
        for (size_t i = 0; i < e->n; i++) {
            e->blob[i].fd = -1;
            e->blob[i].src = &sl_source_local;   /* a blob is a local file */
        }
    }
    if (!memo || sl_cache_is_off(c))
        return SLUICE_OK;
    if (!(e->memo = calloc(n1, 1)) ||
        !(e->file_id = calloc(e->ix->nfiles ? e->ix->nfiles : 1, sizeof *e->file_id)))
        return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
    e->opened_ns = realtime_ns();
    size_t refused = 0;
    const char *first_fs = NULL, *first_path = NULL;
    for (size_t f = 0; f < e->ix->nfiles; f++) {
        const sl_file *file = &e->ix->files[f];
        int stable = (file->src->caps & SL_SRC_STABLE_IDENTITY) && file->fd >= 0;
        const char *fs = stable ? sl_file_id_untrusted_fs(file->fd) : NULL;
        if (fs && !refused++) {
            first_fs = fs;
            first_path = file->path;
        }
        if (!stable || fs || sl_file_id_settle(file->fd) < 0 ||
            sl_file_id_of(file->fd, &e->file_id[f]) < 0) {
            e->file_id[f].ino = 0;   /* no identity: never memoised */
            e->file_id[f].dev = 0;
            continue;
        }
        memo_scan ms = {e, f};
        sl_cache_memo_each(c, &e->file_id[f], e->alg, memo_found, &ms);
    }
    /* said, not silent: the caller asked for the memo and does not get it */
    char more[64] = "";
    if (refused > 1)
        snprintf(more, sizeof more, " and %zu more of the model's files", refused - 1);
    if (refused && asprintf(&e->memo_warning, "verified-once memo not used for %s%s: it is on "
                            "%s, where a write (through a shared mapping) need not change mtime "
                            "or ctime; their tensors are hashed", first_path, more, first_fs) < 0) {
        e->memo_warning = NULL;
        return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
    }
    return SLUICE_OK;
}

const char *sl_engine_cache_warning(const sl_engine *e)
{
    if (!e || !e->cache)
        return NULL;
    /* A cache turned off says so first; the memo's refusal comes before
     * the note of put-off index writes, which the cache keeps working
     * through. */
    const char *w = sl_cache_warning(e->cache);
    if (w && sl_cache_is_off(e->cache))
        return w;
    return e->memo_warning ? e->memo_warning : w;
}

void sl_ecache_stats(const sl_engine *e, struct sluice_stats *out)
{
    out->disk_degraded = e->cache && sl_cache_is_off(e->cache);
    out->disk_busy = e->cache ? sl_cache_busy(e->cache) : 0;
}

int sl_ecache_probe(sl_engine *e, size_t i)
{
    if (!blob_candidate(e, i))
        return 0;
    if (e->blob[i].fd >= 0)
        return 1;
    char *path = NULL;
    int fd = sl_cache_open_blob(e->cache, e->alg, sl_expected_digest(e, i),
                                e->ix->tensors[i].nbytes, &path);
    if (fd < 0) {
        e->test_pause_tensor = i;
        sl_pause_point(e, SL_PAUSE_BLOB_MISSED);
        return 0;
    }
    e->blob[i].fd = fd;
    e->blob[i].path = path;
    e->blob[i].size = e->ix->tensors[i].nbytes;
    return 1;
}

/* Whether tensor i's file is no longer what it was at attach; if so the
 * memo no longer speaks for the tensor, which is hashed from now on. */
static int memo_check(sl_engine *e, size_t i)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    sl_file_id now;
    const sl_file_id *then = &e->file_id[t->file_index];
    if (sl_file_id_of(e->ix->files[t->file_index].fd, &now) == 0 &&
        memcmp(&now, then, sizeof now) == 0)
        return 0;
    e->memo[i] = 0;
    sl_slot_set_hashed(e, i, 1);
    return 1;
}

int sl_ecache_memo_stale(sl_engine *e, size_t i)
{
    /* Checked again after the read: the check at the start cannot see a
     * write made while the bytes were being read. ctime never goes back,
     * so the same identity now means no write since attach. */
    return e->memo && e->memo[i] && memo_check(e, i);
}

unsigned sl_ecache_before_start(sl_engine *e, size_t i, int probe)
{
    if (e->memo && e->memo[i])
        memo_check(e, i);   /* changed already: hashed, no read wasted */
    if (!e->blob || !probe)
        return 0;
    return sl_ecache_probe(e, i) ? SL_SRC_CACHE : 0;
}

void sl_ecache_started(sl_engine *e, size_t i, unsigned source)
{
    /* here, not in before_start: a start that finds no room is tried
     * again, and would count its miss each time */
    if (e->blob && source != SL_SRC_CACHE && blob_candidate(e, i))
        e->st.disk_misses++;
}

void sl_ecache_ready(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    uint64_t nbytes = e->ix->tensors[i].nbytes;
    if (s->source == SL_SRC_CACHE) {
        e->st.disk_hits++;
        e->st.disk_hit_bytes += nbytes;
        e->blob_hit[i] = 1;
        s->source = 0;
    }
    if (e->blob)
        close_blob(e, i);   /* also one a probe opened that this load did not use */
    const unsigned char *want = sl_expected_digest(e, i);
    if (e->memo && e->memo[i] && !s->hashed && want) {
        /* the digest the memo vouched for is the handle's (none: the
         * digest table was replaced since, and the memo vouches for nothing) */
        memcpy(s->digest, want, 32);
        s->has_digest = 1;
        e->st.memo_tensors++;
        e->st.memo_bytes += nbytes;
    }
}

int sl_ecache_refetch(sl_engine *e, size_t i)
{
    close_blob(e, i);
    /* Out of memory (hashing, a buffer) says nothing of the blob's bytes:
     * it stays. Anything else (a mismatch, a read that failed) drops it. */
    if (e->slots[i].err_code != SLUICE_E_NOMEM) {
        sl_cache_drop(e->cache, e->alg, sl_expected_digest(e, i));
        e->st.disk_rotten++;
    }
    /* The blob is gone from this load: a failure that stands (closing, no
     * memory) is the model's own from here on, for the mirrors' code too
     * (source 255 is no mirror's number). */
    e->slots[i].source = 0;
    return !e->closing;
}

void sl_ecache_verified(sl_engine *e, size_t i)
{
    if (!e->cache)
        return;
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    const sl_file *f = &e->ix->files[t->file_index];
    pthread_mutex_lock(&e->lock);
    int hashing = s->state == SL_SLOT_HASHING && s->hashed;
    /* the model's own bytes or a mirror's, verified alike; never a blob's */
    int store = hashing && s->source != SL_SRC_CACHE && blob_candidate(e, i) && !e->closing;
    unsigned source = s->source;
    size_t src_file = s->src_file;
    int record = hashing && s->source == 0 && e->memo && !e->memo[i] &&
                 (f->src->caps & SL_SRC_STABLE_IDENTITY) &&
                 sl_expected_digest(e, i) && e->file_id[t->file_index].ino;
    /* HASHING until the verdict is delivered: the buffer stays as it is */
    const unsigned char *data = s->buf + s->delta;
    pthread_mutex_unlock(&e->lock);
    const unsigned char *want = sl_expected_digest(e, i);
    uint64_t evicted = 0;
    int stored = 0;
    const sl_file *from = store ? sl_read_file(e, source, source ? src_file : t->file_index) : f;
    /* bytes that came over the network, or stand in for a remote file's;
     * never a whole local model's, copied because a mirror is remote */
    store = store && ((f->src->caps | from->src->caps) & SL_SRC_WORTH_CACHING);
    if (!store && !record)
        return;
    if (store) {
        /* A mirror's bytes land at the buffer's start; O_DIRECT never
         * applies to a remote file, so data is the tensor's first byte. */
        sluice_cache_name name = {e->cache_model, t->name, t->name_len};
        stored = sl_cache_store_named(e->cache, e->alg, want, data, t->nbytes, from->path,
                                      e->cache_model ? &name : NULL, &evicted);
    }
    if (record)
        sl_cache_memo_record(e->cache, &e->file_id[t->file_index], e->opened_ns, e->alg,
                             t->offset, t->nbytes, want);
    if (store) {
        pthread_mutex_lock(&e->lock);
        e->st.disk_stored += (uint64_t)stored;
        e->st.disk_evicted += evicted;
        pthread_mutex_unlock(&e->lock);
    }
}

void sl_ecache_free(sl_engine *e)
{
    if (e->cache && e->blob_hit) {
        size_t hits = 0;
        for (size_t i = 0; i < e->n; i++)
            hits += e->blob_hit[i];
        uint8_t (*d)[32] = hits ? malloc(hits * sizeof *d) : NULL;
        size_t k = 0;
        for (size_t i = 0; d && i < e->n; i++)
            if (e->blob_hit[i])
                memcpy(d[k++], sl_expected_digest(e, i), 32);
        if (d)
            sl_cache_touch(e->cache, e->alg, (const uint8_t (*)[32])d, k);
        free(d);
    }
    for (size_t i = 0; e->blob && i < e->n; i++)
        close_blob(e, i);
    free(e->blob);
    free(e->blob_hit);
    free(e->memo);
    free(e->file_id);
    free(e->memo_warning);
    e->memo_warning = NULL;
    e->blob = NULL;
    e->blob_hit = e->memo = NULL;
    e->file_id = NULL;
    sl_cache_close(e->cache);
    e->cache = NULL;
}

/* ---------------------------------------------------------------- parts
 * A part whose digest the manifest gives (sluice_read_part_into,
 * sluice_acquire_part) is a blob as a tensor is: named by that digest (the
 * digest of the part's bytes laid out contiguously), so the same part of
 * the same tensor (same tensor digest, dim, rank, n: the manifest's same
 * part digest) is found by any later open. Kept on the tensor's rule:
 * a part of a file worth caching (a remote one). The blob is read with
 * pread on the calling thread and hashed again against the part digest:
 * one that fails is dropped and the part read from the source. */

static int part_candidate(const sl_engine *e, size_t i, uint64_t len)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    return e->blob && len && (e->ix->files[t->file_index].src->caps & SL_SRC_WORTH_CACHING);
}

int sl_engine_part_cached(sl_engine *e, size_t i, const uint8_t want[32], void *dst, uint64_t len)
{
    if (!want || !part_candidate(e, i, len))
        return 0;
    char *path = NULL;
    int fd = sl_cache_open_blob(e->cache, e->alg, want, len, &path);
    free(path);
    int hit = 0, rotten = 0;
    if (fd >= 0) {
        uint64_t got = 0;
        while (got < len) {
            size_t ask = len - got > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(len - got);
            ssize_t r = pread(fd, (char *)dst + got, ask, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (uint64_t)r;
        }
        close(fd);
        uint8_t d[32];
        int hashed = got == len && sl_md_oneshot(e->alg, dst, (size_t)len, d) == 0;
        hit = hashed && memcmp(d, want, 32) == 0;
        /* out of memory (hashing) says nothing of the blob: it stays */
        rotten = !hit && (got != len || hashed);
        if (rotten)
            sl_cache_drop(e->cache, e->alg, want);
    }
    pthread_mutex_lock(&e->lock);
    if (hit) {
        e->st.disk_hits++;
        e->st.disk_hit_bytes += len;
        e->st.bytes_hashed += len;
    } else {
        e->st.disk_misses++;
        e->st.disk_rotten += (uint64_t)rotten;
        e->st.checksum_failures += (uint64_t)rotten;
    }
    pthread_mutex_unlock(&e->lock);
    if (hit)
        sl_cache_touch(e->cache, e->alg, (const uint8_t (*)[32])want, 1);
    return hit;
}

void sl_engine_part_store(sl_engine *e, size_t i, const uint8_t want[32], const void *data,
                          uint64_t len, const char *name, size_t name_len)
{
    if (!want || !part_candidate(e, i, len))
        return;
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    uint64_t evicted = 0;
    sluice_cache_name nm = {e->cache_model, name, name_len};
    int stored = sl_cache_store_named(e->cache, e->alg, want, data, len,
                                      e->ix->files[t->file_index].path,
                                      e->cache_model ? &nm : NULL, &evicted);
    pthread_mutex_lock(&e->lock);
    e->st.disk_stored += (uint64_t)stored;
    e->st.disk_evicted += evicted;
    pthread_mutex_unlock(&e->lock);
}
