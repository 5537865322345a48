/* verify.c: sluice_verify (see sluice.h, "Verifying without loading"),
 * its one reader, for every model.
 *
 * Nothing here touches the engine: a verify hands out no byte, so it needs
 * no pool and no private copy. Each thread reads an item through its
 * file's kind of reader, chosen by the source's caps (index/source.h):
 *
 * - A file with a descriptor of its own (a local file) is read with pread
 *   into one VF_BUF buffer of the thread's, reused, so the bytes are still
 *   in the CPU cache when they are hashed and no fresh memory is touched
 *   (first touch costs microseconds a page on these VMs); with
 *   SLUICE_F_DIRECT, O_DIRECT blocks, many in flight on a ring of the
 *   thread's own (direct_range): on the virtio disk here, cold throughput
 *   follows the number of reads in flight more than their size (2 threads,
 *   48 MiB in all: 24 x 1 MiB a thread read 3.4-3.9 s, 12 x 2 MiB 3.6-5.7 s,
 *   4 x 4 MiB 4.0-7.2 s, 3 x 8 MiB 5.1-6.0 s for the 2.47 GB preset).
 * - Any other file (a remote object) is read through its source's
 *   read_tensor, in pieces of run->net_piece (range requests), into a
 *   buffer the thread makes at its first such item; a piece that fails
 *   verification after coming through the proxy is read again from the
 *   origin directly, once, by the remote source's own rule
 *   (sl_source_read_direct). Never from the mirrors, never the cache.
 *
 * Why not map the files, which saves the kernel's copy: a mapping raises
 * SIGBUS when the file is truncated under it or a page cannot be read,
 * and a library may not install a signal handler. Made safe (a read lease
 * so that no truncate can happen while a window is mapped, each window
 * mlock()ed so that a read error fails mlock instead of a later access),
 * mapping measured slower than pread here: 0.95-0.99 s against 0.91-0.95 s
 * for the 2.47 GB Llama-3.2-1B preset on 2 threads, because mlock and
 * munmap cost more system time (0.28 s) than the copy they save (0.27 s).
 * Lazy, unsafe mapping was 0.87-0.93 s. So: pread.
 *
 * Work: items sorted largest first; each thread takes the next. A thread
 * that finishes an item queues it; the calling thread calls back, in the
 * order they finish, with no lock held.
 */
#include "base/cancel.h"
#include "base/digest.h"
#include "api/model.h"
#include "index/source.h"
#include "index/index.h"
#include "trust/manifest.h"
#include "api/verify.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define VF_BUF ((size_t)256 << 10)         /* pread buffer: fits in L2 */
#define VF_DIRECT_DEPTH 24                 /* O_DIRECT blocks in flight a thread, at most */
#define VF_DIRECT_MAX ((size_t)1 << 20)
#define VF_DIRECT_MIN ((size_t)256 << 10)  /* smallest block: fewer in flight below it */
#define VF_DIRECT_ITEM_MIN ((uint64_t)64 << 10) /* smaller items are read buffered */
#define VF_ALIGN ((uint64_t)4096)
#define VF_DIRECT_MEMORY ((size_t)48 << 20) /* O_DIRECT blocks, all threads */
#define VF_MAX_THREADS 64
/* A remote file's piece: one range request (the source reads at most
 * 16 MiB at once); each thread has two (one fetched while the other is
 * hashed), the pieces of all threads within VF_NET_MEMORY. */
#define VF_NET_PIECE_MAX ((size_t)16 << 20)
#define VF_NET_MEMORY ((size_t)64 << 20)

typedef struct vf_item {
    int kind;
    size_t index, file;
    uint64_t begin, end;        /* a tensor's range; a file: 0, UINT64_MAX */
    const uint8_t *want;        /* NULL: nothing to compare with */
    uint64_t want_size;         /* a file's listed size, or SLUICE_SIZE_UNKNOWN */
    const sl_chunk_digests *chunks; /* a tensor checked chunk by chunk (no whole digest
                                       is computed then), or NULL */
    uint32_t bad_chunk;         /* the first chunk that did not match, + 1; 0: none */
    uint64_t weight;            /* the order of the work */
    size_t sub0, nsub;          /* a fused file item: the tensor items items[sub0..+nsub)
                                   hashed in the same pass (see plan) */
    /* results, written by the thread that ran it */
    int status, has_digest;
    uint8_t digest[32];
    uint64_t bytes, direct;
    char *message;              /* NULL: none (or out of memory: generic) */
} vf_item;

typedef struct vf_run {
    const sl_index *ix;
    vf_item *items;             /* every item reported */
    size_t nitems;
    size_t *queue;              /* the work: items to run, largest first */
    size_t nqueue;
    int digest_only;
    sluice_algorithm alg;       /* of every digest computed and compared */
    const char *alg_name;       /* for the messages */
    int *direct_fd;             /* per file; -1: buffered; NULL: none opened so */
    size_t block;               /* O_DIRECT block */
    size_t depth;               /* O_DIRECT blocks in flight a thread */
    atomic_size_t next;         /* the next queue entry to take */
    atomic_int stop;            /* cancelled, or the callback said stop */
    /* remote files: read with net (ix->remote, whose blocking requests
     * stop when stop is set), net_piece at a time; what was asked of the
     * network, for the model's stats (sl_verify_run's tally) */
    sl_remote_cfg net;
    size_t net_piece;
    _Atomic uint64_t net_requests, net_bytes;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t *done;               /* finished items, in the order they finished */
    size_t ndone;               /* guarded by lock */
    size_t running;             /* threads still working; guarded by lock */
} vf_run;

/* One piece of a remote item: what is asked, and read_tensor's answer
 * (errno, for SL_SRC_ERRNO, taken on the thread that read it). */
typedef struct vf_piece {
    const sl_file *f;
    const sl_remote_cfg *rc;
    unsigned char *buf;
    size_t want;
    uint64_t pos;
    int status, errno_seen;
    size_t got;
    unsigned requests;
    sl_err err;
} vf_piece;

/* A thread's fetcher of remote pieces: the next piece of an item is
 * fetched on it while the thread hashes the one before, so that the
 * connection does not idle while a piece is hashed (a connection that
 * idles between requests may be slow to start again: see
 * docs/performance.md; it still idles between items) and the fetch and
 * the hash overlap. One piece
 * asked at a time; the thread always takes the answer before it asks
 * again or leaves the item. */
typedef struct vf_fetch {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int asked, answered, quit;  /* guarded by lock */
    vf_piece piece;             /* asked, then answered; guarded by lock */
} vf_fetch;

typedef struct vf_worker {
    vf_run *run;
    pthread_t thread;
    sl_md *md;
    sl_md *tensor_md;           /* a fused pass's tensor digest */
    unsigned char *buf;         /* VF_BUF, for pread */
    unsigned char *blocks;      /* depth x block, for O_DIRECT; made at first use */
    struct io_uring ring;
    int ring_ok;
    int direct_off;             /* O_DIRECT unusable on this thread: read buffered */
    int blocks_lost;            /* the ring failed with reads in flight into blocks */
    unsigned char *net[2];      /* 2 x run->net_piece, for remote files; made at first use */
    vf_fetch *fetch;            /* its fetcher, started with net; NULL: none (fetched
                                   on this thread, one piece after the other) */
} vf_worker;

static int stopped(const vf_run *run)
{
    return atomic_load_explicit(&run->stop, memory_order_relaxed);
}

/* Records a failure of it: code and the detail. */
static int item_fail(vf_item *it, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int item_fail(vf_item *it, int code, const char *fmt, ...)
{
    char msg[SL_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(msg, sizeof msg, fmt, ap) >= (int)sizeof msg)
        sl_utf8_cut(msg);
    va_end(ap);
    it->status = code;
    free(it->message);
    it->message = strdup(msg);
    return code;
}

/* "tensor "NAME" (file F, offset O, N bytes)" or "file F". */
static const char *item_what(const vf_run *run, const vf_item *it, char *out, size_t cap)
{
    const sl_file *f = &run->ix->files[it->file];
    int n;
    if (it->kind == SLUICE_VERIFY_ITEM_FILE) {
        n = snprintf(out, cap, "file %s", f->path);
    } else {
        const struct sluice_tensor_info *t = &run->ix->tensors[it->index];
        char q[SL_QUOTE_MAX];
        n = snprintf(out, cap, "tensor %s (file %s, offset %llu, %llu bytes)",
                     sl_quote(q, sizeof q, t->name, t->name_len), f->path,
                     (unsigned long long)t->offset, (unsigned long long)t->nbytes);
    }
    if (n >= (int)cap)
        sl_utf8_cut(out);
    return out;
}

/* The next len bytes of item it into md. A tensor with chunk digests is
 * checked as the engine checks it: each chunk's digest, compared when its
 * last byte is in (md starts again for the next); no whole digest. */
static int feed(const vf_run *run, vf_item *it, sl_md *md, const unsigned char *p, size_t len)
{
    const sl_chunk_digests *c = it->chunks;
    if (!c) {
        if (sl_md_update(md, p, len) < 0)
            return item_fail(it, SLUICE_E_NOMEM, "%s update failed (OpenSSL)", run->alg_name);
        it->bytes += len;
        return SLUICE_OK;
    }
    uint64_t nbytes = it->end - it->begin;
    while (len) {
        uint64_t k = it->bytes / c->bytes;
        uint64_t end = k + 1 < c->count ? (k + 1) * c->bytes : nbytes;
        size_t n = end - it->bytes < len ? (size_t)(end - it->bytes) : len;
        if (sl_md_update(md, p, n) < 0)
            return item_fail(it, SLUICE_E_NOMEM, "%s update failed (OpenSSL)", run->alg_name);
        it->bytes += n;
        p += n;
        len -= n;
        if (it->bytes == end) {
            uint8_t got[32];
            if (sl_md_final(md, got) < 0 || sl_md_reset(md) < 0)
                return item_fail(it, SLUICE_E_NOMEM, "%s final failed (OpenSSL)", run->alg_name);
            if (!it->bad_chunk && memcmp(got, c->digest[k], 32) != 0) {
                it->bad_chunk = (uint32_t)k + 1;
                memcpy(it->digest, got, 32);
            }
        }
    }
    return SLUICE_OK;
}

/* ------------------------------------------------------------- pread reads */

/* Hashes [*pos, stop) of fd with pread, to the end of the file at most. */
static void pread_range(vf_worker *w, vf_item *it, int fd, uint64_t *pos, uint64_t stop)
{
    int again = 0;
    while (*pos < stop && !stopped(w->run) && it->status == SLUICE_OK) {
        size_t want = stop - *pos < VF_BUF ? (size_t)(stop - *pos) : VF_BUF;
        ssize_t got = pread(fd, w->buf, want, (off_t)*pos);
        if (got < 0 && (errno == EINTR || errno == EAGAIN) && again++ < 8)
            continue;
        if (got < 0) {
            char what[SL_ERRMSG_MAX / 2];
            item_fail(it, SLUICE_E_IO, "%s: read at offset %llu failed: %s",
                      item_what(w->run, it, what, sizeof what), (unsigned long long)*pos,
                      strerror(errno));
            return;
        }
        if (got == 0)
            return; /* the end of the file */
        again = 0;
        if (feed(w->run, it, w->md, w->buf, (size_t)got) == SLUICE_OK)
            *pos += (uint64_t)got;
    }
}

/* ------------------------------------------------------------ O_DIRECT reads */

typedef struct vf_block {
    uint64_t offset;
    ssize_t result;
    int busy;                   /* submitted, completion not seen */
} vf_block;

/* Starts reading block b at offset: on the ring, or, when the thread has
 * no ring or the ring refuses the read, now with pread. */
static void block_start(vf_worker *w, int fd, vf_block *blk, size_t b, uint64_t offset)
{
    blk->offset = offset;
    blk->busy = 0;
    unsigned char *p = w->blocks + b * w->run->block;
    struct io_uring_sqe *sqe = w->ring_ok ? io_uring_get_sqe(&w->ring) : NULL;
    if (sqe) {
        io_uring_prep_read(sqe, fd, p, (unsigned)w->run->block, offset);
        io_uring_sqe_set_data64(sqe, b);
        int rc, tries = 0;
        do
            rc = io_uring_submit(&w->ring);
        while ((rc >= 0 ? io_uring_sq_ready(&w->ring) != 0
                        : rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && tries++ < 8);
        /* The read is the last SQE queued (a submit may take fewer than
         * were queued): it went in only when none is left. */
        if (rc >= 0 && io_uring_sq_ready(&w->ring) == 0) {
            blk->busy = 1;
            return;
        }
        /* Still queued: made a no-op, so that no later submit starts a
         * read into a block that is reused by then. */
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, UINT64_MAX);
    }
    ssize_t got;
    do
        got = pread(fd, p, w->run->block, (off_t)offset);
    while (got < 0 && errno == EINTR);
    blk->result = got < 0 ? -errno : got;
}

/* The ring failed with reads in flight: see block_wait. */
static void blocks_lose(vf_worker *w)
{
    size_t len = w->run->depth * w->run->block;
    if (mmap(w->blocks, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
             -1, 0) == MAP_FAILED)
        (void)mprotect(w->blocks, len, PROT_NONE); /* at least never read again */
    w->blocks_lost = 1;
    w->direct_off = 1;
}

/* Waits until block b's read is done. */
static void block_wait(vf_worker *w, vf_block *blocks, size_t b)
{
    while (blocks[b].busy) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&w->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0) {
            /* The ring itself failed: nothing more will come, yet the
             * kernel may still write the blocks. Their memory is given
             * back but their addresses stay reserved, inaccessible, so a
             * late write faults instead of landing in memory reused by
             * then (blocks_lose); this thread reads buffered from here. */
            for (size_t k = 0; k < w->run->depth; k++)
                if (blocks[k].busy) {
                    blocks[k].busy = 0;
                    blocks[k].result = rc;
                }
            blocks_lose(w);
            return;
        }
        size_t k = (size_t)io_uring_cqe_get_data64(cqe);
        if (k < w->run->depth) {
            blocks[k].result = cqe->res;
            blocks[k].busy = 0;
        }
        io_uring_cqe_seen(&w->ring, cqe);
    }
}

/* Makes the thread's O_DIRECT blocks and ring at its first O_DIRECT item;
 * returns 0, or -1 when there is no memory for them (then it reads
 * buffered). */
static int direct_ready(vf_worker *w)
{
    if (w->direct_off)
        return -1;
    if (w->blocks)
        return 0;
    void *p = mmap(NULL, w->run->depth * w->run->block, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        w->direct_off = 1;
        return -1;
    }
    w->blocks = p;
    w->ring_ok = io_uring_queue_init((unsigned)w->run->depth, &w->ring, 0) == 0;
    return 0;
}

/*
 * Hashes [*pos, stop) of the O_DIRECT descriptor fd: aligned blocks, up to
 * run->depth in flight, hashed in order as each arrives while the next
 * ones are read. Stops at the end of the file, on an error (which fails
 * the item), at a short read before the end, or when the file refuses an
 * O_DIRECT read with EINVAL (the caller reads the rest buffered). Every
 * read in flight is waited for before return: the blocks are reused.
 */
static void direct_range(vf_worker *w, vf_item *it, int fd, uint64_t *pos, uint64_t stop)
{
    const vf_run *run = w->run;
    vf_block blocks[VF_DIRECT_DEPTH] = {{0}};
    uint64_t next = *pos & ~(VF_ALIGN - 1);
    size_t head = 0, started = 0;
    int ended = 0;
    while (started < run->depth && next < stop) {
        block_start(w, fd, &blocks[started], started, next);
        next += run->block;
        started++;
    }
    for (size_t n = 0; n < started; n++, head = (head + 1) % run->depth) {
        block_wait(w, blocks, head);
        vf_block *blk = &blocks[head];
        if (ended || stopped(run) || it->status != SLUICE_OK)
            continue; /* only draining */
        if (blk->result == -EINVAL || w->blocks_lost) {
            /* this file or its filesystem refuses O_DIRECT reads, or the
             * ring failed: pread goes on from *pos */
            ended = 1;
            continue;
        }
        if (blk->result < 0) {
            char what[SL_ERRMSG_MAX / 2];
            item_fail(it, SLUICE_E_IO, "%s: O_DIRECT read at offset %llu failed: %s",
                      item_what(run, it, what, sizeof what), (unsigned long long)blk->offset,
                      strerror((int)-blk->result));
            continue;
        }
        uint64_t got_end = blk->offset + (uint64_t)blk->result;
        uint64_t lo = *pos, hi = got_end < stop ? got_end : stop;
        if (hi > lo && feed(w->run, it, w->md, w->blocks + head * run->block + (lo - blk->offset),
                            (size_t)(hi - lo)) == SLUICE_OK) {
            it->direct += hi - lo;
            *pos = hi;
        }
        if ((size_t)blk->result < run->block) {
            ended = 1; /* the end of the file, or a short read: pread goes on */
            continue;
        }
        if (next < stop && !w->direct_off) {
            block_start(w, fd, blk, head, next);
            next += run->block;
            started++;
        }
    }
}

/* ------------------------------------------------------------------- items */

/* Ends item it, whose bytes up to pos went into md: the tensor must have
 * been read to its end, then the digest is compared with the manifest's. */
/* How many bytes file f has now (pos: what was read, when that cannot be
 * told): a descriptor's fstat; a remote object's size seen at open (a
 * read past it since then fails as the source's range check says). */
static uint64_t size_now(const sl_file *f, uint64_t pos)
{
    struct stat st;
    if (!(f->src->caps & SL_SRC_DESCRIPTOR))
        return f->size;
    return fstat(f->fd, &st) == 0 ? (uint64_t)st.st_size : pos;
}

static void conclude(const vf_run *run, vf_item *it, sl_md *md, uint64_t pos)
{
    const sl_file *f = &run->ix->files[it->file];
    char what[SL_ERRMSG_MAX / 2];
    /* Short of the tensor's end; an empty tensor reads nothing, and is
     * there if the file still reaches its offset. */
    if (it->kind == SLUICE_VERIFY_ITEM_TENSOR &&
        (pos < it->end || (it->begin == it->end && size_now(f, UINT64_MAX) < it->begin))) {
        item_fail(it, SLUICE_E_FILE_CHANGED, "%s: the file is %llu bytes now and ends before "
                  "the tensor does: it shrank after open", item_what(run, it, what, sizeof what),
                  (unsigned long long)size_now(f, pos));
        return;
    }
    char hw[65], hg[65];
    if (it->chunks) { /* every chunk was compared as it came in */
        const sl_chunk_digests *c = it->chunks;
        if (it->bad_chunk) {
            uint64_t k = it->bad_chunk - 1, lo = k * c->bytes;
            uint64_t hi = k + 1 < c->count ? lo + c->bytes : it->end - it->begin;
            item_fail(it, SLUICE_E_CHECKSUM, "%s: %s mismatch in chunk %llu of %u (tensor bytes "
                      "%llu..%llu): expected %s, actual %s", item_what(run, it, what, sizeof what),
                      run->alg_name, (unsigned long long)k, c->count, (unsigned long long)lo,
                      (unsigned long long)hi, sl_hex_digest(hw, c->digest[k]),
                      sl_hex_digest(hg, it->digest));
        } else {
            memcpy(it->digest, it->want, 32); /* its chunks are the manifest's */
            it->has_digest = 1;
        }
        return;
    }
    if (sl_md_final(md, it->digest) < 0) {
        item_fail(it, SLUICE_E_NOMEM, "%s final failed (OpenSSL)", run->alg_name);
        return;
    }
    it->has_digest = 1;
    if (run->digest_only)
        return;
    if (!it->want) {
        item_fail(it, SLUICE_E_MANIFEST_MISSING, "%s: the manifest has no digest for it",
                  item_what(run, it, what, sizeof what));
    } else if (it->kind == SLUICE_VERIFY_ITEM_FILE && it->want_size != SLUICE_SIZE_UNKNOWN &&
               it->want_size != it->bytes) {
        item_fail(it, SLUICE_E_CHECKSUM, "%s: %llu bytes, the manifest says %llu",
                  item_what(run, it, what, sizeof what), (unsigned long long)it->bytes,
                  (unsigned long long)it->want_size);
    } else if (memcmp(it->want, it->digest, 32) != 0) {
        item_fail(it, SLUICE_E_CHECKSUM, "%s: %s mismatch: expected %s, actual %s",
                  item_what(run, it, what, sizeof what), run->alg_name, sl_hex_digest(hw, it->want),
                  sl_hex_digest(hg, it->digest));
    }
}

/*
 * A fused file item: one pass over the whole file with pread, each buffer
 * feeding the file's digest and the digest of the tensor(s) it holds, so
 * the kernel copies every byte out once for both (what `sluice manifest`
 * and `sluice verify --files` ask for). Its tensors are items of their
 * own for the report, in file order.
 */
static void run_fused(vf_worker *w, vf_item *fit)
{
    const vf_run *run = w->run;
    const sl_file *f = &run->ix->files[fit->file];
    size_t k = fit->sub0, kend = fit->sub0 + fit->nsub;
    for (size_t j = k; j < kend; j++)
        run->items[j].status = SLUICE_OK;
    fit->status = SLUICE_OK;
    if (sl_md_reset(w->md) < 0) {
        item_fail(fit, SLUICE_E_NOMEM, "%s init failed (OpenSSL)", run->alg_name);
        return;
    }
    uint64_t pos = 0;
    int open_tensor = 0, again = 0;
    while (!stopped(run) && fit->status == SLUICE_OK) {
        ssize_t got = pread(f->fd, w->buf, VF_BUF, (off_t)pos);
        if (got < 0 && (errno == EINTR || errno == EAGAIN) && again++ < 8)
            continue;
        if (got < 0) {
            char what[SL_ERRMSG_MAX / 2];
            item_fail(fit, SLUICE_E_IO, "%s: read at offset %llu failed: %s",
                      item_what(run, fit, what, sizeof what), (unsigned long long)pos,
                      strerror(errno));
            break;
        }
        if (got == 0)
            break;
        again = 0;
        if (feed(w->run, fit, w->md, w->buf, (size_t)got) != SLUICE_OK)
            break;
        uint64_t piece_end = pos + (uint64_t)got;
        /* the tensors this piece holds: the last may go on into the next */
        while (k < kend && run->items[k].begin < piece_end) {
            vf_item *t = &run->items[k];
            if (!open_tensor && sl_md_reset(w->tensor_md) < 0) {
                item_fail(t, SLUICE_E_NOMEM, "%s init failed (OpenSSL)", run->alg_name);
                k++;
                continue;
            }
            open_tensor = 1;
            uint64_t lo = t->begin > pos ? t->begin : pos;
            uint64_t hi = t->end < piece_end ? t->end : piece_end;
            if (hi > lo)
                feed(run, t, w->tensor_md, w->buf + (lo - pos), (size_t)(hi - lo));
            if (t->end > piece_end)
                break;
            if (t->status == SLUICE_OK)
                conclude(run, t, w->tensor_md, t->end);
            open_tensor = 0;
            k++;
        }
        pos = piece_end;
    }
    if (stopped(run))
        return;
    /* what the pass did not reach: empty tensors at its very end conclude,
     * the others failed with the file (or the file ended first) */
    for (; k < kend; k++) {
        vf_item *t = &run->items[k];
        if (fit->status != SLUICE_OK) {
            char what[SL_ERRMSG_MAX / 2];
            item_fail(t, fit->status, "%s: %s", item_what(run, t, what, sizeof what),
                      fit->message ? fit->message : sl_status_name(fit->status));
        } else if (open_tensor || t->begin != t->end) {
            conclude(run, t, w->tensor_md, t->begin + t->bytes); /* short: FILE_CHANGED */
            open_tensor = 0;
        } else if (sl_md_reset(w->tensor_md) == 0) {
            conclude(run, t, w->tensor_md, t->end);
        } else {
            item_fail(t, SLUICE_E_NOMEM, "%s init failed (OpenSSL)", run->alg_name);
        }
    }
    if (fit->status == SLUICE_OK)
        conclude(run, fit, w->md, pos);
}

/* ----------------------------------------------------- reads through a source */

/* Reads piece p (on the thread that calls it). */
static void piece_read(vf_piece *p)
{
    p->got = 0;
    p->requests = 0;
    p->err = (sl_err){0};
    errno = 0;
    p->status = p->f->src->read_tensor(p->f, p->rc, p->buf, p->want, p->pos, &p->got,
                                       &p->requests, &p->err);
    p->errno_seen = errno;
}

/* The fetcher: reads each piece asked and answers it, until told to quit. */
static void *fetch_main(void *arg)
{
    vf_fetch *x = arg;
    pthread_mutex_lock(&x->lock);
    for (;;) {
        while (!x->asked && !x->quit)
            pthread_cond_wait(&x->cond, &x->lock);
        if (x->quit)
            break;
        vf_piece p = x->piece;
        pthread_mutex_unlock(&x->lock);
        piece_read(&p);
        pthread_mutex_lock(&x->lock);
        x->piece = p;
        x->asked = 0;
        x->answered = 1;
        pthread_cond_broadcast(&x->cond);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

/* Starts w's fetcher; on any failure w has none (pieces are then fetched
 * on w's own thread). */
static void fetch_start(vf_worker *w)
{
    vf_fetch *x = calloc(1, sizeof *x);
    if (!x)
        return;
    if (pthread_mutex_init(&x->lock, NULL) != 0) {
        free(x);
        return;
    }
    if (pthread_cond_init(&x->cond, NULL) != 0) {
        pthread_mutex_destroy(&x->lock);
        free(x);
        return;
    }
    if (pthread_create(&x->thread, NULL, fetch_main, x) != 0) {
        pthread_cond_destroy(&x->cond);
        pthread_mutex_destroy(&x->lock);
        free(x);
        return;
    }
    w->fetch = x;
}

static void fetch_stop(vf_worker *w)
{
    vf_fetch *x = w->fetch;
    if (!x)
        return;
    pthread_mutex_lock(&x->lock);
    x->quit = 1;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
    pthread_join(x->thread, NULL);
    pthread_cond_destroy(&x->cond);
    pthread_mutex_destroy(&x->lock);
    free(x);
    w->fetch = NULL;
}

/* Makes the thread's two buffers for remote pieces and its fetcher at
 * its first remote item (never for a local run: fresh memory costs);
 * returns 0 or -1. */
static int net_ready(vf_worker *w)
{
    if (w->net[0])
        return 0;
    w->net[0] = malloc(w->run->net_piece);
    w->net[1] = malloc(w->run->net_piece);
    if (!w->net[0] || !w->net[1]) {
        free(w->net[0]);
        free(w->net[1]);
        w->net[0] = w->net[1] = NULL;
        return -1;
    }
    fetch_start(w);
    return 0;
}

/* Asks for piece *p: on w's fetcher, answered by piece_take; without
 * one, read now, into *p. */
static void piece_ask(vf_worker *w, vf_piece *p)
{
    vf_fetch *x = w->fetch;
    if (!x) {
        piece_read(p);
        return;
    }
    pthread_mutex_lock(&x->lock);
    x->piece = *p;
    x->asked = 1;
    x->answered = 0;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
}

/* The answer to the piece asked last, into *p (waited for on the fetcher). */
static void piece_take(vf_worker *w, vf_piece *p)
{
    vf_fetch *x = w->fetch;
    if (!x)
        return; /* read at the ask */
    pthread_mutex_lock(&x->lock);
    while (!x->answered)
        pthread_cond_wait(&x->cond, &x->lock);
    x->answered = 0;
    *p = x->piece;
    pthread_mutex_unlock(&x->lock);
}

/* Hashes [*pos, stop) of file f through its source's read_tensor with rc,
 * a piece at a time, the next one fetched while this one is hashed: all
 * of it, or the item fails (the size is known since open: an early end
 * is an I/O failure; a piece shorter than asked goes on where it ended).
 * Stops, the item left unjudged, when the run stops (rc's blocking
 * requests stop with it). No piece is in flight when it returns. */
static void source_range(vf_worker *w, vf_item *it, const sl_remote_cfg *rc, uint64_t *pos,
                         uint64_t stop)
{
    vf_run *run = w->run;
    int cur = 0;
    vf_piece p = {.f = &run->ix->files[it->file], .rc = rc, .buf = w->net[cur], .pos = *pos};
    if (*pos >= stop || stopped(run))
        return;
    p.want = stop - p.pos < run->net_piece ? (size_t)(stop - p.pos) : run->net_piece;
    piece_ask(w, &p);
    for (int pending = 1; pending;) {
        piece_take(w, &p);
        pending = 0;
        atomic_fetch_add_explicit(&run->net_requests, p.requests, memory_order_relaxed);
        atomic_fetch_add_explicit(&run->net_bytes, p.got, memory_order_relaxed);
        if (stopped(run) || it->status != SLUICE_OK)
            return;
        int st = p.status;
        if (st == SL_SRC_ERRNO || (st == SLUICE_OK && p.got == 0))
            st = sl_fail(&p.err, SLUICE_E_IO, "%s", st == SL_SRC_ERRNO ? strerror(p.errno_seen)
                                                                       : "no byte came");
        if (st != SLUICE_OK) {  /* named as a local read's failure is */
            char what[SL_ERRMSG_MAX / 2];
            item_fail(it, st, "%s: read at offset %llu failed: %s",
                      item_what(run, it, what, sizeof what), (unsigned long long)*pos, p.err.msg);
            return;
        }
        unsigned char *got = p.buf;
        size_t len = p.got;
        uint64_t next = p.pos + len;
        if (next < stop) { /* the next piece, in flight while this one is hashed */
            cur ^= 1;
            p.buf = w->net[cur];
            p.pos = next;
            p.want = stop - next < run->net_piece ? (size_t)(stop - next) : run->net_piece;
            piece_ask(w, &p);
            pending = 1;
        }
        if (feed(run, it, w->md, got, len) == SLUICE_OK)
            *pos += len;
    }
}

/* Reads item it whole through its file's source with rc and judges it.
 * Returns the read's status: SLUICE_OK when every byte was read (the
 * judgement is then it->status), SLUICE_E_CANCELLED when the run stopped. */
static int source_read(vf_worker *w, vf_item *it, const sl_remote_cfg *rc)
{
    const vf_run *run = w->run;
    const sl_file *f = &run->ix->files[it->file];
    it->status = SLUICE_OK;
    if (sl_md_reset(w->md) < 0)
        return item_fail(it, SLUICE_E_NOMEM, "%s init failed (OpenSSL)", run->alg_name);
    if (net_ready(w) < 0)
        return item_fail(it, SLUICE_E_NOMEM, "out of memory for a verifying thread");
    uint64_t pos = it->begin;
    source_range(w, it, rc, &pos, it->end < f->size ? it->end : f->size);
    if (stopped(run))
        return SLUICE_E_CANCELLED;
    int read = it->status;
    if (read == SLUICE_OK)
        conclude(run, it, w->md, pos);
    return read;
}

/* An item read again from the origin directly (sl_source_read_direct's
 * read), into again. */
typedef struct item_direct_args {
    vf_worker *w;
    vf_item *again;
} item_direct_args;

static int item_direct(const sl_remote_cfg *direct, void *ctx, uint64_t *bytes, sl_err *err)
{
    (void)err;  /* the item carries its own message */
    item_direct_args *a = ctx;
    int read = source_read(a->w, a->again, direct);
    *bytes = a->again->bytes;
    return read;
}

/* An item of a file without a descriptor: read through its source; bytes
 * that came through the proxy and fail are read again from the origin
 * directly, once, as a load's are (sluice.h "Proxies"), counted as
 * theirs: the remote source's rule and read. A blocking read cannot tell
 * which bytes came through the proxy: all of them did when f's requests
 * go through one. */
static void source_item(vf_worker *w, vf_item *it)
{
    const sl_file *f = &w->run->ix->files[it->file];
    if (source_read(w, it, &w->run->net) != SLUICE_OK || it->status != SLUICE_E_CHECKSUM)
        return;
    vf_item again = *it;
    again.bytes = 0;
    again.has_digest = 0;
    again.bad_chunk = 0;
    again.message = NULL;
    memset(again.digest, 0, sizeof again.digest);
    item_direct_args a = {w, &again};
    sl_err e = {0};
    int read = sl_source_read_direct(&w->run->net, f, it->status, 1, item_direct, &a, &e);
    if (read == SLUICE_OK || read == SLUICE_E_CANCELLED) {
        /* the origin's bytes judged (or the stop): its results only, the
         * fields this thread writes; the rest (weight, ...) the delivering
         * thread reads meanwhile, unlocked */
        free(it->message);
        it->status = again.status;
        it->has_digest = again.has_digest;
        memcpy(it->digest, again.digest, sizeof it->digest);
        it->bytes = again.bytes;
        it->bad_chunk = again.bad_chunk;
        it->message = again.message;
    } else {
        free(again.message);    /* the proxy's judgement stands */
    }
}

static void run_item(vf_worker *w, vf_item *it)
{
    const vf_run *run = w->run;
    const sl_file *f = &run->ix->files[it->file];
    if (!(f->src->caps & SL_SRC_DESCRIPTOR)) {
        source_item(w, it);
        return;
    }
    it->status = SLUICE_OK;
    if (sl_md_reset(w->md) < 0) {
        item_fail(it, SLUICE_E_NOMEM, "%s init failed (OpenSSL)", run->alg_name);
        return;
    }
    uint64_t pos = it->begin;
    int direct_fd = run->direct_fd ? run->direct_fd[it->file] : -1;
    /* A small item read with O_DIRECT would cost a whole block or two. */
    if (direct_fd >= 0 && it->weight >= VF_DIRECT_ITEM_MIN && direct_ready(w) == 0)
        direct_range(w, it, direct_fd, &pos, it->end);
    pread_range(w, it, f->fd, &pos, it->end);
    if (it->status == SLUICE_OK && !stopped(run))
        conclude(run, it, w->md, pos);
}

static void *worker_main(void *arg)
{
    vf_worker *w = arg;
    vf_run *run = w->run;
    for (;;) {
        size_t q = atomic_fetch_add(&run->next, 1);
        if (q >= run->nqueue || stopped(run))
            break;
        size_t i = run->queue[q];
        vf_item *it = &run->items[i];
        if (!w->md || !w->tensor_md || !w->buf) {
            item_fail(it, SLUICE_E_NOMEM, "out of memory for a verifying thread");
            for (size_t j = it->sub0; j < it->sub0 + it->nsub; j++)
                item_fail(&run->items[j], SLUICE_E_NOMEM, "out of memory for a verifying thread");
        } else if (it->nsub) {
            run_fused(w, it);
        } else {
            run_item(w, it);
        }
        pthread_mutex_lock(&run->lock);
        for (size_t j = it->sub0; j < it->sub0 + it->nsub; j++)
            run->done[run->ndone++] = j;
        run->done[run->ndone++] = i;
        pthread_cond_broadcast(&run->cond);
        pthread_mutex_unlock(&run->lock);
    }
    pthread_mutex_lock(&run->lock);
    run->running--;
    pthread_cond_broadcast(&run->cond);
    pthread_mutex_unlock(&run->lock);
    return NULL;
}

static int worker_init(vf_worker *w, vf_run *run)
{
    memset(w, 0, sizeof *w);
    w->run = run;
    w->md = sl_md_new(w->run->alg);
    w->tensor_md = sl_md_new(w->run->alg);
    if (posix_memalign((void **)&w->buf, 4096, VF_BUF) != 0)
        w->buf = NULL;
    return w->md && w->tensor_md && w->buf ? 0 : -1;
}

static void worker_free(vf_worker *w)
{
    if (w->ring_ok)
        io_uring_queue_exit(&w->ring);
    sl_md_free(w->md);
    sl_md_free(w->tensor_md);
    free(w->buf);
    fetch_stop(w);
    free(w->net[0]);
    free(w->net[1]);
    /* Blocks the kernel may still be reading into stay reserved (no
     * memory, only addresses) rather than be mapped again by someone. */
    if (w->blocks && !w->blocks_lost)
        munmap(w->blocks, w->run->depth * w->run->block);
}

/* ------------------------------------------------------------------ the run */

/* qsort_r is not C11: the queue is sorted through a copy of the weights. */
typedef struct vf_order {
    uint64_t weight;
    size_t item;
} vf_order;

static int by_weight(const void *a, const void *b)
{
    const vf_order *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight < y->weight ? 1 : -1;
    return (x->item > y->item) - (x->item < y->item);
}

static void wake_run(void *ctx)
{
    vf_run *run = ctx;
    pthread_mutex_lock(&run->lock);
    pthread_cond_broadcast(&run->cond);
    pthread_mutex_unlock(&run->lock);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether the tensors of file f lie in order, each where or after the
 * previous one ends (header validation rules out overlap; this does not
 * rely on it), so one pass over the file can digest them all. */
static int in_sequence(const sl_index *ix, size_t f)
{
    const sl_file *file = &ix->files[f];
    for (size_t i = file->first_tensor + 1; i < file->first_tensor + file->tensor_count; i++)
        if (ix->tensors[i].offset < ix->tensors[i - 1].offset + ix->tensors[i - 1].nbytes)
            return 0;
    return 1;
}

/*
 * Fills run->items from the list and the flags, and run->queue with the
 * work, largest first. With every tensor and every file asked for, files
 * read buffered, and at least as many files as threads, a file's tensors
 * are hashed in the same pass as the file (run_fused): each byte is copied
 * out of the kernel once for its two digests. Otherwise (few files: one
 * pass per file would leave threads idle) every item is a pass of its own.
 */
static int plan(vf_run *run, const sl_manifest *mf, const size_t *ids, size_t n, int all,
                uint32_t flags, unsigned nthreads, sl_err *err)
{
    const sl_index *ix = run->ix;
    size_t ntensors = flags & SLUICE_VF_NO_TENSORS ? 0 : all ? ix->ntensors : n;
    size_t nfiles = flags & SLUICE_VF_FILES ? ix->nfiles : 0;
    int fuse = all && ntensors && nfiles && !run->direct_fd && nfiles >= nthreads &&
               !(ix->caps_lacking & SL_SRC_DESCRIPTOR); /* a pass of pread over each file */
    for (size_t f = 0; fuse && f < nfiles; f++)
        fuse = in_sequence(ix, f);
    run->nitems = ntensors + nfiles;
    size_t cap = run->nitems ? run->nitems : 1;
    run->items = calloc(cap, sizeof *run->items);
    run->done = calloc(cap, sizeof *run->done);
    run->queue = calloc(cap, sizeof *run->queue);
    vf_order *order = calloc(cap, sizeof *order);
    if (!run->items || !run->done || !run->queue || !order) {
        size_t asked = run->nitems;
        free(order);
        run->nitems = 0;
        return sl_fail(err, SLUICE_E_NOMEM, "verify: out of memory for %zu items", asked);
    }
    for (size_t k = 0; k < ntensors; k++) {
        size_t i = all ? k : ids[k];
        const struct sluice_tensor_info *t = &ix->tensors[i];
        run->items[k] = (vf_item){.kind = SLUICE_VERIFY_ITEM_TENSOR, .index = i,
                                  .file = t->file_index, .begin = t->offset,
                                  .end = t->offset + t->nbytes, .weight = t->nbytes,
                                  .want = sl_manifest_tensor_digest(mf, i)};
        const sl_chunk_digests *chunks = sl_manifest_chunks(mf);
        if (!run->digest_only && run->items[k].want && chunks && chunks[i].count)
            run->items[k].chunks = &chunks[i];
        if (!fuse)
            order[run->nqueue++] = (vf_order){t->nbytes, k};
    }
    for (size_t f = 0; f < nfiles; f++) {
        size_t k = ntensors + f;
        vf_item *it = &run->items[k];
        *it = (vf_item){.kind = SLUICE_VERIFY_ITEM_FILE, .index = f, .file = f, .begin = 0,
                        .end = UINT64_MAX, .weight = ix->files[f].size};
        it->want = sl_manifest_file_digest(mf, f, &it->want_size);
        if (fuse) { /* all tensors: item k's are those of file f, in order */
            it->sub0 = ix->files[f].first_tensor;
            it->nsub = ix->files[f].tensor_count;
        }
        order[run->nqueue++] = (vf_order){it->weight, k};
    }
    qsort(order, run->nqueue, sizeof *order, by_weight);
    for (size_t q = 0; q < run->nqueue; q++)
        run->queue[q] = order[q].item;
    free(order);
    return SLUICE_OK;
}

/* Calls back for item it; returns the callback's value. */
static int report_item(const vf_run *run, const vf_item *it, const sluice_verify_options *o)
{
    if (!o->on_item)
        return 0;
    struct sluice_verify_item v = {.size = sizeof v, .kind = it->kind, .index = it->index,
                                   .status = it->status, .has_digest = it->has_digest,
                                   .bytes = it->bytes};
    if (it->kind == SLUICE_VERIFY_ITEM_TENSOR) {
        v.name = run->ix->tensors[it->index].name;
        v.name_len = run->ix->tensors[it->index].name_len;
    } else {
        v.name = run->ix->files[it->index].path;
        v.name_len = strlen(v.name);
    }
    v.message = it->status == SLUICE_OK ? ""
              : it->message ? it->message : sl_status_name(it->status);
    memcpy(v.digest, it->digest, 32);
    return o->on_item(o->user, &v);
}

int sl_verify_run(const sl_index *ix, const sl_manifest *mf, const sluice_options *model_opts,
                  const size_t *ids, size_t n, int all, const sluice_verify_options *o,
                  struct sluice_verify_report *rep, sl_range_tally *net, sl_err *err)
{
    uint64_t t0 = now_ns();
    memset(rep, 0, sizeof *rep);
    vf_run run = {.ix = ix, .digest_only = !!(o->flags & SLUICE_VF_DIGEST_ONLY),
                  .alg = model_opts->algorithm,
                  .alg_name = sl_md_title(model_opts->algorithm)};
    atomic_init(&run.next, 0);
    atomic_init(&run.stop, 0);
    atomic_init(&run.net_requests, 0);
    atomic_init(&run.net_bytes, 0);
    memset(net, 0, sizeof *net);
    if (!mf && !run.digest_only)
        return sl_fail(err, SLUICE_E_MANIFEST, "verify: no manifest was read at open, so there "
                       "is nothing to verify against (open with a manifest, or ask for "
                       "digests only)");
    unsigned nthreads = o->threads ? o->threads : model_opts->hash_threads;
    if (!nthreads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = cpus > 0 ? (unsigned)(cpus < VF_MAX_THREADS ? cpus : VF_MAX_THREADS) : 1;
    }
    /* Remote files: the threads mostly wait on the network, and the
     * verify alone keeps within the model's remote connections; each
     * blocking request stops when the run does. */
    if ((ix->caps_any & SL_SRC_NETWORK) && ix->remote) {
        run.net = *ix->remote;
        run.net.abort_flag = &run.stop;
        unsigned most = ix->remote->connections ? ix->remote->connections : 1;
        if (!o->threads || nthreads > most)
            nthreads = most;
    }
    if (nthreads > VF_MAX_THREADS)
        nthreads = VF_MAX_THREADS;
    int rc = SLUICE_OK;
    if (model_opts->flags & SLUICE_F_DIRECT) {
        run.direct_fd = malloc((ix->nfiles ? ix->nfiles : 1) * sizeof *run.direct_fd);
        if (!run.direct_fd)
            rc = sl_fail(err, SLUICE_E_NOMEM, "verify: out of memory");
        int opened = 0;
        for (size_t f = 0; run.direct_fd && f < ix->nfiles; f++) {
            const sl_file *file = &ix->files[f];
            run.direct_fd[f] = file->src->caps & SL_SRC_DESCRIPTOR
                               ? sl_file_reopen(file, "/proc/self/fd", O_DIRECT) : -1;
            opened |= run.direct_fd[f] >= 0;
        }
        if (!opened) { /* e.g. tmpfs: everything buffered, as without the flag */
            free(run.direct_fd);
            run.direct_fd = NULL;
        }
    }
    if (rc == SLUICE_OK)
        rc = plan(&run, mf, ids, n, all, o->flags, nthreads, err);
    if (nthreads > run.nqueue)
        nthreads = run.nqueue ? (unsigned)run.nqueue : 1;
    run.net_piece = VF_NET_MEMORY / 2 / nthreads < VF_NET_PIECE_MAX
                    ? VF_NET_MEMORY / 2 / nthreads : VF_NET_PIECE_MAX;
    /* The O_DIRECT blocks of all threads within VF_DIRECT_MEMORY: smaller
     * blocks down to VF_DIRECT_MIN, then fewer of them (1 at least). */
    size_t share = VF_DIRECT_MEMORY / nthreads;
    run.depth = VF_DIRECT_DEPTH;
    run.block = (share / VF_DIRECT_DEPTH) & ~(size_t)(VF_ALIGN - 1);
    if (run.block > VF_DIRECT_MAX)
        run.block = VF_DIRECT_MAX;
    if (run.block < VF_DIRECT_MIN) {
        run.block = VF_DIRECT_MIN;
        run.depth = share / VF_DIRECT_MIN ? share / VF_DIRECT_MIN : 1;
    }

    vf_worker *workers = NULL;
    int sync_ok = 0;
    if (rc == SLUICE_OK && !(workers = calloc(nthreads, sizeof *workers)))
        rc = sl_fail(err, SLUICE_E_NOMEM, "verify: out of memory");
    if (rc == SLUICE_OK) {
        if (pthread_mutex_init(&run.lock, NULL) != 0)
            rc = sl_fail(err, SLUICE_E_NOMEM, "verify: cannot make a lock");
        else if (pthread_cond_init(&run.cond, NULL) != 0) {
            pthread_mutex_destroy(&run.lock);
            rc = sl_fail(err, SLUICE_E_NOMEM, "verify: cannot make a condition variable");
        } else {
            sync_ok = 1;
        }
    }
    size_t started = 0;
    for (unsigned t = 0; rc == SLUICE_OK && t < nthreads; t++) {
        if (worker_init(&workers[t], &run) != 0) {
            worker_free(&workers[t]);
            break;
        }
        pthread_mutex_lock(&run.lock);
        run.running++;
        pthread_mutex_unlock(&run.lock);
        if (pthread_create(&workers[t].thread, NULL, worker_main, &workers[t]) != 0) {
            pthread_mutex_lock(&run.lock);
            run.running--;
            pthread_mutex_unlock(&run.lock);
            worker_free(&workers[t]);
            break;
        }
        started++;
    }
    if (rc == SLUICE_OK && !started && run.nitems)
        rc = sl_fail(err, SLUICE_E_NOMEM, "verify: cannot start a verifying thread");

    /* Deliver, on this thread, as items finish. */
    sl_cancel_reg reg = {.wake = wake_run, .ctx = &run};
    if (sync_ok)
        sl_cancel_register(o->cancel, &reg);
    struct sluice_stream_progress pr = {.size = sizeof pr, .tensors_total = run.nitems};
    for (size_t i = 0; i < run.nitems; i++)
        pr.bytes_total += run.items[i].weight;
    uint64_t interval = (uint64_t)o->progress_interval_ms * 1000000u, last_progress = 0;
    size_t progress_done = SIZE_MAX; /* tensors_done at the last progress call */
    int first_failure = SLUICE_OK, stop_rc = SLUICE_OK;
    size_t delivered = 0;
    while (rc == SLUICE_OK && started) {
        pthread_mutex_lock(&run.lock);
        while (delivered == run.ndone && run.running > 0 &&
               (stop_rc || delivered == run.nitems || !sl_cancel_requested(o->cancel)))
            pthread_cond_wait(&run.cond, &run.lock);
        int have = delivered < run.ndone;
        size_t i = have ? run.done[delivered] : 0;
        int all_gone = run.running == 0;
        pthread_mutex_unlock(&run.lock);
        if (sl_cancel_requested(o->cancel) && !stop_rc && delivered < run.nitems) {
            stop_rc = SLUICE_E_CANCELLED;
            atomic_store(&run.stop, 1);
        }
        if (!have) {
            if (all_gone)
                break;
            continue;
        }
        delivered++;
        vf_item *it = &run.items[i];
        if (stop_rc)
            continue; /* drained, not reported */
        if (it->kind == SLUICE_VERIFY_ITEM_FILE)
            it->status == SLUICE_OK ? rep->files_ok++ : rep->files_failed++;
        else
            it->status == SLUICE_OK ? rep->tensors_ok++ : rep->tensors_failed++;
        if (it->status != SLUICE_OK && first_failure == SLUICE_OK)
            first_failure = sl_fail(err, it->status, "%s",
                                    it->message ? it->message : sl_status_name(it->status));
        int cb = report_item(&run, it, o);
        if (cb) {
            stop_rc = cb;
            atomic_store(&run.stop, 1);
        }
        pr.tensors_done++;
        pr.bytes_done += it->weight;
        uint64_t now = now_ns();
        if (o->progress && (pr.tensors_done == pr.tensors_total || now - last_progress >= interval)) {
            last_progress = now;
            progress_done = pr.tensors_done;
            o->progress(o->progress_user, &pr);
        }
    }
    if (sync_ok)
        sl_cancel_unregister(o->cancel, &reg);
    for (size_t t = 0; t < started; t++) {
        pthread_join(workers[t].thread, NULL);
        worker_free(&workers[t]);
    }
    /* The last call, when stopped early or when there was nothing to do. */
    if (o->progress && rc == SLUICE_OK && progress_done != pr.tensors_done)
        o->progress(o->progress_user, &pr);
    if (sync_ok) {
        pthread_cond_destroy(&run.cond);
        pthread_mutex_destroy(&run.lock);
    }
    for (size_t i = 0; i < run.nitems; i++) {
        rep->bytes_hashed += run.items[i].bytes;
        rep->bytes_direct += run.items[i].direct;
        free(run.items[i].message);
    }
    for (size_t f = 0; run.direct_fd && f < ix->nfiles; f++)
        if (run.direct_fd[f] >= 0)
            close(run.direct_fd[f]);
    free(run.direct_fd);
    free(workers);
    free(run.items);
    free(run.done);
    free(run.queue);
    rep->threads = (uint32_t)started;
    rep->elapsed_ns = now_ns() - t0;
    net->remote_reads = atomic_load(&run.net_requests);
    net->remote_bytes = atomic_load(&run.net_bytes);
    if (rc != SLUICE_OK)
        return rc;
    if (stop_rc) {
        if (stop_rc == SLUICE_E_CANCELLED)
            return sl_fail(err, SLUICE_E_CANCELLED, "verify: cancelled");
        return stop_rc;
    }
    return first_failure; /* its detail is in err */
}
