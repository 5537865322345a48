/* io.c: see io.h.
 *
 * io_uring backend: one ring, owned by one thread (the reaper), which is
 * the only thread that ever touches it. Other threads queue requests and
 * kick the reaper through an eventfd that the ring itself reads, so the
 * reaper sleeps in one place (io_uring_submit_and_wait, with a timeout
 * when a retry is waiting) for new work, completions and due retries. It
 * never sleeps otherwise: it reaps for every request, so a sleep there
 * would stall them all. Keeping every submission on one long-lived thread also
 * matters for correctness: the kernel cancels the requests a thread
 * submitted when that thread exits, and callers' threads come and go.
 *
 * pread backend: io_threads threads take requests from one queue and run
 * pread/preadv to the end, with the same retry rules. A request waiting
 * for a retry goes back to a timed list rather than keeping its thread
 * asleep, so that one io_thread is enough for any number of requests.
 *
 * The rules for one attempt's result (step()) are shared, so both backends
 * behave alike, and so are the injected faults (fault_take(),
 * fault_short()) and the list of retries by due time (retry_park()).
 */
#include "sources/io.h"
#include "base/threads.h"

#include <errno.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Reads at least this large go to io-wq workers (IOSQE_ASYNC). */
#define SL_IO_ASYNC_MIN (256u << 10)

struct sl_io {
    sl_io_config cfg;
    sluice_backend backend;
    int why;                     /* errno that refused io_uring */

    pthread_mutex_t lock;        /* the queue, quit and (pread) retries */
    pthread_cond_t cv;           /* pread workers wait here (CLOCK_MONOTONIC) */
    sl_io_req *head, *tail;      /* queued, not started */
    int quit;
    sl_io_req *retries;          /* pread: waiting for due_ns, earliest first */
    atomic_uint retries_waiting; /* both backends, for the tests */

    /* io_uring */
    struct io_uring ring;
    int ring_ready;
    int efd;                     /* kicks the reaper */
    uint64_t efd_buf;            /* where the ring reads the eventfd */
    atomic_int kicked;           /* a kick is written and not yet consumed */
    pthread_t reaper;
    int reaper_started;

    /* pread */
    pthread_t *threads;
    unsigned nthreads;

    /* faults */
    atomic_uint_fast64_t attempts;
    atomic_int fault_kind;
    atomic_uint_fast64_t fault_nth, fault_count;
};

/* ------------------------------------------------------------ shared rules */

static sl_io_fault fault_take(sl_io *io)
{
    uint64_t n = atomic_fetch_add(&io->attempts, 1) + 1;
    int kind = atomic_load(&io->fault_kind);
    if (kind == SL_IO_FAULT_NONE)
        return SL_IO_FAULT_NONE;
    uint64_t nth = atomic_load(&io->fault_nth), count = atomic_load(&io->fault_count);
    return (n >= nth && n - nth < count) ? (sl_io_fault)kind : SL_IO_FAULT_NONE;
}

/* The errno a fault stands for (0 for none, SHORT and EOF). */
static int fault_errno(sl_io_fault f)
{
    switch (f) {
    case SL_IO_FAULT_EIO: return EIO;
    case SL_IO_FAULT_EINTR: return EINTR;
    case SL_IO_FAULT_EAGAIN: return EAGAIN;
    case SL_IO_FAULT_EINVAL: return EINVAL;
    case SL_IO_FAULT_ENOSPC: return ENOSPC;
    case SL_IO_FAULT_EFAULT: return EFAULT;
    case SL_IO_FAULT_ENXIO: return ENXIO;
    default: return 0;
    }
}

/* The clock retries are due by: the test's, or CLOCK_MONOTONIC. */
static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t io_now(const sl_io *io)
{
    return io->cfg.clock_ns ? io->cfg.clock_ns(io->cfg.clock_ctx) : monotonic_ns();
}

/* 50 us doubling up to 12.8 ms: EINTR/EAGAIN on a file are transient.
 * Attempts 0 .. SL_IO_MAX_ATTEMPTS - 2 wait: about 26 ms in all. */
static uint64_t backoff_ns(uint32_t attempt)
{
    return (uint64_t)50000 << (attempt < 8 ? attempt : 8);
}

/* Puts r in *list, kept in order of due_ns (after those due as early, so
 * that retries due together go in the order they failed). */
static void retry_park(sl_io *io, sl_io_req **list, sl_io_req *r)
{
    while (*list && (*list)->due_ns <= r->due_ns)
        list = &(*list)->next;
    r->next = *list;
    *list = r;
    atomic_fetch_add(&io->retries_waiting, 1);
}

/* Takes the first of *list if it is due by now, else returns NULL. */
static sl_io_req *retry_take_due(sl_io *io, sl_io_req **list, uint64_t now)
{
    sl_io_req *r = *list;
    if (!r || r->due_ns > now)
        return NULL;
    *list = r->next;
    r->next = NULL;
    atomic_fetch_sub(&io->retries_waiting, 1);
    return r;
}

void sl_io_req_advance(sl_io_req *r, uint64_t n)
{
    r->done_bytes += n;
    r->offset += n;
    while (n && r->iovcnt) {
        if (n >= r->iov[0].iov_len) {
            n -= r->iov[0].iov_len;
            r->iov++;
            r->iovcnt--;
        } else {
            r->iov[0].iov_base = (char *)r->iov[0].iov_base + n;
            r->iov[0].iov_len -= n;
            n = 0;
        }
    }
}

enum { STEP_DONE, STEP_AGAIN, STEP_LATER };

/* Accounts for one attempt that asked `asked` bytes and got res (bytes, or
 * -errno). Says whether the request is finished, must go again at once
 * (short), or must go again at r->due_ns (EINTR, EAGAIN): the caller parks
 * it, so that no thread sleeps while other requests wait on it. */
static int step(const sl_io *io, sl_io_req *r, int64_t res, uint64_t asked)
{
    if (res < 0) {
        int e = (int)-res;
        if ((e == EINTR || e == EAGAIN) && r->attempts + 1 < SL_IO_MAX_ATTEMPTS) {
            r->due_ns = io_now(io) + backoff_ns(r->attempts++);
            r->retries++;
            if (e == EINTR)
                r->retries_eintr++;
            else
                r->retries_eagain++;
            return STEP_LATER;
        }
        r->error = e;
        r->error_offset = r->offset;
        return STEP_DONE;
    }
    r->attempts = 0;
    if (res == 0) {
        if (r->done_bytes < r->min_bytes) {
            r->eof = 1;
            r->error_offset = r->offset;
        }
        return STEP_DONE;
    }
    sl_io_req_advance(r, (uint64_t)res);
    if (r->done_bytes >= r->total)
        return STEP_DONE;
    /* Short. With what was needed in hand, a short read is the end of the
     * file inside an O_DIRECT span's padding: stop rather than ask again at
     * an offset O_DIRECT would refuse. */
    if ((uint64_t)res < asked && r->done_bytes >= r->min_bytes)
        return STEP_DONE;
    r->retries++;
    return STEP_AGAIN;
}

static uint64_t iov_bytes(const struct iovec *iov, int n)
{
    uint64_t t = 0;
    for (int i = 0; i < n; i++)
        t += iov[i].iov_len;
    return t;
}

/* An injected short read, made real: the attempt read `res` bytes of the
 * first cnt segments, and now reports half of them (at least one), and the
 * bytes it no longer reports are overwritten with their complement, so a
 * caller that took the short read as complete would hold wrong bytes, as
 * it would after a real short read into a reused buffer. */
static int64_t fault_short(sl_io_req *r, int cnt, int64_t res)
{
    if (res <= 1)
        return res;
    uint64_t keep = (uint64_t)res / 2, skip = keep, left = (uint64_t)res - keep;
    for (int i = 0; i < cnt && left; i++) {
        uint64_t len = r->iov[i].iov_len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        unsigned char *b = (unsigned char *)r->iov[i].iov_base + skip;
        uint64_t n = len - skip < left ? len - skip : left;
        for (uint64_t k = 0; k < n; k++)
            b[k] = (unsigned char)~b[k];
        left -= n;
        skip = 0;
    }
    return (int64_t)keep;
}

/* ------------------------------------------------------------ pread backend */

static int64_t pread_once(sl_io *io, sl_io_req *r, uint64_t *asked)
{
    sl_io_fault f = fault_take(io);
    int e = fault_errno(f);
    int cnt = r->iovcnt < IOV_MAX ? r->iovcnt : IOV_MAX;
    *asked = iov_bytes(r->iov, cnt);
    if (e)
        return -e;
    if (f == SL_IO_FAULT_EOF)
        return 0;
    ssize_t n = cnt == 1 ? pread(r->fd, r->iov[0].iov_base, r->iov[0].iov_len, (off_t)r->offset)
                         : preadv(r->fd, r->iov, cnt, (off_t)r->offset);
    if (n < 0)
        return -(int64_t)errno;
    return f == SL_IO_FAULT_SHORT ? fault_short(r, cnt, n) : (int64_t)n;
}

/* Waits on cv until signalled or until the clock reaches due (the test's
 * clock may not be CLOCK_MONOTONIC: the wait is converted, and a worker
 * that wakes before due by the test's clock just waits again). */
static void pread_wait_until(sl_io *io, uint64_t due)
{
    uint64_t now = io_now(io);
    uint64_t at = monotonic_ns() + (due > now ? due - now : 0);
    struct timespec ts = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
    pthread_cond_timedwait(&io->cv, &io->lock, &ts);
}

static void *pread_main(void *arg)
{
    sl_io *io = arg;
    pthread_mutex_lock(&io->lock);
    for (;;) {
        /* Retries that are due go first; then new requests. */
        sl_io_req *r = retry_take_due(io, &io->retries, io_now(io));
        if (!r && (r = io->head)) {
            io->head = r->next;
            if (!io->head)
                io->tail = NULL;
        }
        if (!r) {
            if (io->quit && !io->retries)
                break;
            if (io->retries)
                pread_wait_until(io, io->retries->due_ns);
            else
                pthread_cond_wait(&io->cv, &io->lock);
            continue;
        }
        pthread_mutex_unlock(&io->lock);
        int s;
        do {
            /* Two statements: the order in which a call's arguments are
             * evaluated is unspecified, and step() needs this attempt's
             * `asked`, not the last one's. */
            uint64_t asked = 0;
            int64_t res = pread_once(io, r, &asked);
            s = step(io, r, res, asked);
        } while (s == STEP_AGAIN);
        if (s == STEP_LATER) {
            pthread_mutex_lock(&io->lock);
            retry_park(io, &io->retries, r);
            /* A worker waiting for a later retry, or for nothing, must
             * now wake for this one. */
            pthread_cond_broadcast(&io->cv);
            continue;
        }
        r->next = NULL;
        io->cfg.done(io->cfg.ctx, r);
        pthread_mutex_lock(&io->lock);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

/* ------------------------------------------------------------ io_uring backend */

/* A request's SQE; the reaper alone calls this. */
static void uring_prep(sl_io *io, sl_io_req *r)
{
    struct io_uring_sqe *sqe;
    while (!(sqe = io_uring_get_sqe(&io->ring)))
        io_uring_submit(&io->ring);
    int cnt = r->iovcnt < IOV_MAX ? r->iovcnt : IOV_MAX;
    if (cnt == 1)
        io_uring_prep_read(sqe, r->fd, r->iov[0].iov_base,
                           r->iov[0].iov_len > 0x7ffff000u ? 0x7ffff000u : (unsigned)r->iov[0].iov_len,
                           r->offset);
    else
        io_uring_prep_readv(sqe, r->fd, r->iov, (unsigned)cnt, r->offset);
    /* A read of cached pages is otherwise copied inline, by this one
     * thread: io-wq workers copy large reads in parallel (measured 12 ->
     * 19 GB/s warm on 2 cores). Small reads stay inline, cheaper. */
    if (r->total - r->done_bytes >= SL_IO_ASYNC_MIN)
        io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    io_uring_sqe_set_data(sqe, r);
}

static void uring_arm_kick(sl_io *io)
{
    struct io_uring_sqe *sqe;
    while (!(sqe = io_uring_get_sqe(&io->ring)))
        io_uring_submit(&io->ring);
    io_uring_prep_read(sqe, io->efd, &io->efd_buf, sizeof io->efd_buf, 0);
    io_uring_sqe_set_data(sqe, &io->efd_buf);
}

/* The ring refused to submit or wait (not EINTR, EAGAIN, EBUSY, ETIME).
 * Rather than spin, wait for a completion, at most 50 us: a completion
 * ends the wait at once, so no read waits on this. Only if the ring cannot
 * even wait does the thread sleep those 50 us, there being nothing else
 * to wait on. */
static void uring_trouble(sl_io *io)
{
    struct io_uring_cqe *cqe;
    struct __kernel_timespec ts = {0, 50000};
    int rc = io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts);
    if (rc < 0 && rc != -ETIME && rc != -EINTR) {
        struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
    }
}

/* Submits what is prepared and waits for a completion, or until the first
 * parked retry is due. */
static int uring_submit_and_wait(sl_io *io, const sl_io_req *parked)
{
    if (!parked)
        return io_uring_submit_and_wait(&io->ring, 1);
    uint64_t now = io_now(io), wait = parked->due_ns > now ? parked->due_ns - now : 0;
    struct __kernel_timespec ts = {(long long)(wait / 1000000000u), (long long)(wait % 1000000000u)};
    struct io_uring_cqe *cqe;
    return io_uring_submit_and_wait_timeout(&io->ring, &cqe, 1, &ts, NULL);
}

static void *uring_main(void *arg)
{
    sl_io *io = arg;
    unsigned inflight = 0;      /* read SQEs the kernel holds */
    int armed = 0;              /* the eventfd read is in the ring */
    sl_io_req *again = NULL;    /* to resubmit now (short reads) */
    sl_io_req *parked = NULL;   /* to resubmit at due_ns (EINTR, EAGAIN), earliest first */
    for (;;) {
        pthread_mutex_lock(&io->lock);
        sl_io_req *q = io->head;
        io->head = io->tail = NULL;
        int quit = io->quit;
        pthread_mutex_unlock(&io->lock);
        uint64_t now = io_now(io);
        for (sl_io_req *r; (r = retry_take_due(io, &parked, now));) {
            r->next = again;
            again = r;
        }
        for (sl_io_req *r = again, *n; r; r = n) {
            n = r->next;
            uring_prep(io, r);
            inflight++;
        }
        again = NULL;
        for (sl_io_req *r = q, *n; r; r = n) {
            n = r->next;
            uring_prep(io, r);
            inflight++;
        }
        if (quit && inflight == 0 && !parked)
            break;
        if (!armed) {
            uring_arm_kick(io);
            armed = 1;
        }
        int rc = uring_submit_and_wait(io, parked);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
            uring_trouble(io);

        sl_io_req *done = NULL, **done_tail = &done;
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&io->ring, &cqe) == 0) {
            void *data = io_uring_cqe_get_data(cqe);
            int64_t res = cqe->res;
            io_uring_cqe_seen(&io->ring, cqe);
            if (data == &io->efd_buf) {
                armed = 0;
                atomic_store(&io->kicked, 0);
                continue;
            }
            sl_io_req *r = data;
            inflight--;
            int cnt = r->iovcnt < IOV_MAX ? r->iovcnt : IOV_MAX;
            uint64_t asked = iov_bytes(r->iov, cnt);
            sl_io_fault f = fault_take(io);
            if (fault_errno(f))
                res = -fault_errno(f);
            else if (f == SL_IO_FAULT_SHORT && res > 1)
                res = fault_short(r, cnt, res);
            else if (f == SL_IO_FAULT_EOF && res > 0)
                res = 0;
            switch (step(io, r, res, asked)) {
            case STEP_AGAIN:
                r->next = again;
                again = r;
                break;
            case STEP_LATER:
                retry_park(io, &parked, r);
                break;
            default:
                r->next = NULL;
                *done_tail = r;
                done_tail = &r->next;
            }
        }
        if (done)
            io->cfg.done(io->cfg.ctx, done);
    }
    return NULL;
}

/* ------------------------------------------------------------ the seam */

static int start_uring(sl_io *io)
{
    int rc = io_uring_queue_init(io->cfg.queue_depth + 1, &io->ring, 0);
    if (rc < 0)
        return -rc;
    io->ring_ready = 1;
    io->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (io->efd < 0)
        return errno;
    if ((rc = pthread_create(&io->reaper, NULL, uring_main, io)) != 0)
        return rc;
    io->reaper_started = 1;
    return 0;
}

static void stop_uring(sl_io *io)
{
    if (io->reaper_started) {
        pthread_mutex_lock(&io->lock);
        io->quit = 1;
        pthread_mutex_unlock(&io->lock);
        uint64_t one = 1;
        while (write(io->efd, &one, sizeof one) < 0 && errno == EINTR)
            ;
        pthread_join(io->reaper, NULL);
        io->reaper_started = 0;
    }
    if (io->efd >= 0)
        close(io->efd);
    io->efd = -1;
    if (io->ring_ready)
        io_uring_queue_exit(&io->ring);
    io->ring_ready = 0;
}

static void stop_pread(sl_io *io)
{
    pthread_mutex_lock(&io->lock);
    io->quit = 1;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->lock);
    for (unsigned i = 0; i < io->nthreads; i++)
        pthread_join(io->threads[i], NULL);
    io->nthreads = 0;
    free(io->threads);
    io->threads = NULL;
}

int sl_io_create(const sl_io_config *cfg, sl_io **out, sl_err *err)
{
    *out = NULL;
    sl_io *io = calloc(1, sizeof *io);
    if (!io)
        return sl_fail(err, SLUICE_E_NOMEM, "I/O: out of memory");
    io->cfg = *cfg;
    io->efd = -1;
    if (pthread_mutex_init(&io->lock, NULL) != 0) {
        free(io);
        return sl_fail(err, SLUICE_E_NOMEM, "I/O: cannot create a mutex");
    }
    /* pread workers wait for a retry's due time on CLOCK_MONOTONIC: a
     * change of the wall clock must not make them late or early. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&io->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!cfg->force_pread) {
        int why = start_uring(io);
        if (why == 0) {
            io->backend = SLUICE_BACKEND_IO_URING;
            *out = io;
            return SLUICE_OK;
        }
        stop_uring(io);
        io->why = why;
    }
    io->backend = SLUICE_BACKEND_PREAD;
    io->quit = 0;
    int rc = sl_threads_start(&io->threads, &io->nthreads, cfg->threads ? cfg->threads : 1,
                              pread_main, io, "I/O", "read thread", err);
    if (rc < 0) {
        sl_io_destroy(io);
        return rc;
    }
    *out = io;
    return SLUICE_OK;
}

void sl_io_destroy(sl_io *io)
{
    if (!io)
        return;
    if (io->backend == SLUICE_BACKEND_IO_URING)
        stop_uring(io);
    else
        stop_pread(io);
    pthread_cond_destroy(&io->cv);
    pthread_mutex_destroy(&io->lock);
    free(io);
}

void sl_io_submit(sl_io *io, sl_io_req *r)
{
    r->error = 0;
    r->eof = 0;
    r->done_bytes = 0;
    r->error_offset = 0;
    r->retries = 0;
    r->retries_eintr = r->retries_eagain = 0;
    r->status = 0;
    r->detail[0] = '\0';
    r->attempts = 0;
    r->total = iov_bytes(r->iov, r->iovcnt);
    r->next = NULL;
    pthread_mutex_lock(&io->lock);
    if (io->tail)
        io->tail->next = r;
    else
        io->head = r;
    io->tail = r;
    if (io->backend == SLUICE_BACKEND_PREAD)
        pthread_cond_signal(&io->cv);
    pthread_mutex_unlock(&io->lock);
}

void sl_io_flush(sl_io *io)
{
    if (io->backend != SLUICE_BACKEND_IO_URING)
        return;                  /* the workers were signalled at submit */
    if (pthread_equal(pthread_self(), io->reaper))
        return;                  /* it looks at the queue before it sleeps */
    pthread_mutex_lock(&io->lock);
    int queued = io->head != NULL;
    pthread_mutex_unlock(&io->lock);
    if (!queued || atomic_exchange(&io->kicked, 1))
        return;
    uint64_t one = 1;
    while (write(io->efd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

sluice_backend sl_io_backend(const sl_io *io, int *why)
{
    if (why)
        *why = io->why;
    return io->backend;
}

void sl_io_set_fault(sl_io *io, sl_io_fault kind, uint64_t nth, uint64_t count)
{
    atomic_store(&io->fault_kind, SL_IO_FAULT_NONE);
    atomic_store(&io->fault_nth, nth);
    atomic_store(&io->fault_count, count);
    if (count && kind != SL_IO_FAULT_NONE)
        atomic_store(&io->fault_kind, (int)kind);
}

uint64_t sl_io_attempts(const sl_io *io)
{
    return atomic_load(&((sl_io *)io)->attempts);
}

unsigned sl_io_retries_waiting(const sl_io *io)
{
    return atomic_load(&((sl_io *)io)->retries_waiting);
}
