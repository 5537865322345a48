/* io.h: the I/O seam of an engine (io.c): positional reads of files into
 * memory, by io_uring or by a pool of pread threads, with one semantics.
 *
 * A request reads iov (in place, any number of segments) from fd at
 * offset. The seam finishes it or fails it; the caller only sees the end:
 *  - a short read is resubmitted for the rest (counted in retries);
 *  - EINTR and EAGAIN are retried after a bounded exponential backoff
 *    (SL_IO_MAX_ATTEMPTS attempts in a row at most, waiting 50 us, 100 us,
 *    ... 12.8 ms between them, about 26 ms in all; then the errno is the
 *    result; any byte read starts the count again). The wait is scheduled,
 *    not slept: the request is parked with its due time (cfg.clock_ns) and
 *    resubmitted when due, by the io_uring reaper (which waits for
 *    completions or the earliest due time in the ring, with a timeout) or
 *    by any pread worker (which waits on its condition variable until the
 *    earliest due time). So a request backing off never delays another:
 *    no thread that serves other requests sleeps for it;
 *  - end of file before min_bytes arrived sets eof;
 *  - any other errno is the result.
 * Completion calls cfg.done(cfg.ctx, list) on a thread of the seam, with
 * no lock of the seam held, for a list of finished requests chained by
 * next. The caller keeps a request (and its iov) alive until then.
 *
 * Submission is split in two so that callers can queue under their own
 * lock and start the reads after dropping it (with io_uring a read of
 * cached pages is copied inside io_uring_enter, by the submitting thread):
 * sl_io_submit queues, sl_io_flush starts what is queued. Both may be
 * called from any thread, including from inside cfg.done.
 *
 * Faults: sl_io_set_fault makes attempts number nth .. nth+count-1 (each
 * syscall or ring completion is one attempt, counted from 1 since create)
 * fail as asked, for the tests (no global state: it hangs off the seam).
 * A short read is real: the bytes it does not report are overwritten.
 */
#ifndef SLUICE_IO_H
#define SLUICE_IO_H

#include "base/error.h"
#include "sluice.h"

#include <stdint.h>
#include <sys/uio.h>

#define SL_IO_MAX_ATTEMPTS SLUICE_IO_MAX_ATTEMPTS /* EINTR/EAGAIN in a row: about 26 ms of backoff in all */

typedef struct sl_io sl_io;

typedef struct sl_io_req {
    /* set by the caller */
    int fd;
    uint64_t offset;
    struct iovec *iov;       /* advanced in place as bytes arrive */
    int iovcnt;
    uint64_t min_bytes;      /* fewer than this at end of file: eof */
    void *owner;             /* the caller's */
    struct sl_io_req *next;  /* free for the caller until submitted */

    /* results, valid in cfg.done */
    int error;               /* 0, or the errno that ended the request */
    int eof;                 /* the file ended before min_bytes */
    uint64_t done_bytes;     /* bytes read */
    uint64_t error_offset;   /* file offset of the attempt that failed */
    uint32_t retries;        /* resubmissions (short reads, EINTR, EAGAIN) */
    uint32_t retries_eintr, retries_eagain; /* of which for EINTR, for EAGAIN */
    int status;              /* remote seam (remote.h) only: the SLUICE_E_* code of
                              * a failure with a reason of its own, else 0 */
    char detail[200];        /* and its detail (no secret in it) */
    const struct sl_remote_target *target; /* remote seam: what sl_rio_submit was given */
    struct sl_validators *validators;
    uint64_t object_size;
    /* remote seam, set by the caller before submit (sluice.h "Proxies"):
     * go to the origin directly, not through the proxy; a caller waits on
     * it (a Dragonfly proxy gets the higher priority) */
    uint8_t no_proxy, demand;
    /* remote seam results: some of its bytes came through the proxy; the
     * proxy failed it and it went direct; why it went direct (that
     * failure, or the proxy taken for down) */
    uint8_t proxied, proxy_failed;
    char proxy_why[120];
    /* remote seam, set by the caller before submit: a request of spans of
     * the object (a part's rows: ascending, none overlapping, none empty)
     * instead of iov, each span's bytes landing in its dst, made as one
     * multi-range request (or, where the server refuses those, as
     * coalesced single ranges: remote.h, sl_remote_spans_batch); NULL: a
     * request of iov. single: the object's flag that its server refuses
     * multi-range requests (set by the seam when one is refused). cancel:
     * a call's token, or NULL: once requested, the request's transfer is
     * aborted (SLUICE_E_CANCELLED), no retry follows, and one not on the
     * wire yet fails without going out. */
    const struct sl_span *spans;
    size_t nspans;
    _Atomic int *single;
    const struct sluice_cancel *cancel;
    /* remote seam result of a spans request: the HTTP requests it made
     * (a multi-range one the server refused not counted); done_bytes: the
     * object bytes they asked, the gaps between spans included */
    uint32_t requests;

    /* private to the seam */
    uint32_t attempts;       /* consecutive EINTR/EAGAIN */
    uint64_t total;          /* bytes asked: sum of iov at submit */
    uint64_t due_ns;         /* when a parked retry goes again (cfg.clock_ns) */
} sl_io_req;

/* n more bytes of r arrived: its offset and iovecs move past them. */
void sl_io_req_advance(sl_io_req *r, uint64_t n);

typedef void (*sl_io_done_fn)(void *ctx, sl_io_req *list);

typedef struct sl_io_config {
    unsigned queue_depth;    /* requests in flight at most (the caller keeps to it) */
    unsigned threads;        /* threads of the pread backend */
    int force_pread;         /* do not try io_uring */
    sl_io_done_fn done;
    void *ctx;
    /* The clock retries are scheduled by, in nanoseconds: NULL for
     * CLOCK_MONOTONIC; the tests pass one they move by hand. */
    uint64_t (*clock_ns)(void *clock_ctx);
    void *clock_ctx;
} sl_io_config;

typedef enum sl_io_fault {
    SL_IO_FAULT_NONE = 0,
    SL_IO_FAULT_EIO,         /* the attempt fails with EIO */
    SL_IO_FAULT_SHORT,       /* the attempt reports half of what it read, and
                              * the other half of the buffer is garbage */
    SL_IO_FAULT_EINTR,
    SL_IO_FAULT_EAGAIN,
    SL_IO_FAULT_EINVAL,      /* as O_DIRECT does on a file system refusing it */
    SL_IO_FAULT_EOF,         /* the attempt reads 0 bytes: the file ended early */
    SL_IO_FAULT_ENOSPC,      /* errnos a read should not give, and may: */
    SL_IO_FAULT_EFAULT,
    SL_IO_FAULT_ENXIO
} sl_io_fault;

/* Starts the seam: io_uring unless forced off or refused (then the pread
 * pool; sl_io_backend says which and why). Returns SLUICE_OK or
 * SLUICE_E_NOMEM (no memory, or no thread could be started). */
int sl_io_create(const sl_io_config *cfg, sl_io **out, sl_err *err);

/* Stops the threads and frees the seam. The caller must have seen every
 * request it submitted complete. NULL is a no-op. */
void sl_io_destroy(sl_io *io);

/* Queues req (its results are reset). Never fails. */
void sl_io_submit(sl_io *io, sl_io_req *req);

/* Starts the queued requests. */
void sl_io_flush(sl_io *io);

/* The backend in use; *why receives the errno that refused io_uring (0
 * when it is used or was forced off). */
sluice_backend sl_io_backend(const sl_io *io, int *why);

/* Injects a fault in attempts nth .. nth+count-1 (nth from 1; count 0 or
 * kind NONE clears). Any thread. */
void sl_io_set_fault(sl_io *io, sl_io_fault kind, uint64_t nth, uint64_t count);

/* Attempts made so far (for tests that aim a fault). */
uint64_t sl_io_attempts(const sl_io *io);

/* Requests parked now, waiting for their retry's due time (for tests). */
unsigned sl_io_retries_waiting(const sl_io *io);

#endif
