/* verify_faults_shim.c: an LD_PRELOAD library for test_verify_faults.c.
 * It stands between sluice_verify's O_DIRECT path (src/api/verify.c) and
 * liburing / libc, and fails the calls that path has fallbacks for.
 *
 * Nothing happens until the program calls vfs_arm() (found with dlsym, so
 * the test links nothing of this): from then on calls are counted, from 1,
 * and the environment says which fail:
 *
 *   VFS_SUBMIT_REFUSE=a-b   io_uring_submit calls a..b return -EAGAIN, queue nothing
 *   VFS_SUBMIT_PARTIAL=k    io_uring_submit call k submits one SQE only, however
 *                           many are queued (the rest stay queued, as a real
 *                           short submit leaves them)
 *   VFS_WAIT_FAIL=k         wait k (__io_uring_get_cqe) returns -EBADR: the ring
 *                           is broken; then every wait is such a call, see below
 *   VFS_NO_RING=1           io_uring_queue_init fails (-ENOSYS)
 *   VFS_EINVAL_AT=off       a pread on an O_DIRECT descriptor at or past off
 *                           fails with EINVAL (the file refuses O_DIRECT there)
 *
 * A wait finds a completion already there without a call into liburing
 * (io_uring_wait_cqe peeks inline), so which wait is the k-th would depend
 * on the disk's timing. With VFS_WAIT_FAIL set, each ring made after
 * arming shows an empty completion queue to inline code (its cq.ktail
 * points at its head) and the real tail only inside the calls hooked
 * here: every wait is then a __io_uring_get_cqe call, counted in order.
 * (The partial submit and the hidden tail use the fields of struct
 * io_uring as liburing 2.x has them: sq.sqe_head/sqe_tail, khead, ktail.)
 *
 * Built with the rest of the tests (sanitizers included); the child's
 * ASAN_OPTIONS carry verify_asan_link_order=0, since the preloaded library
 * comes before the ASan runtime.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* What vfs_counts() reports, in this order. */
enum { VFS_SUBMITS, VFS_REFUSED, VFS_PARTIAL, VFS_WAITS, VFS_WAIT_FAILED, VFS_RINGS,
       VFS_NO_RINGS, VFS_EINVALS, VFS_NCOUNTS };

static atomic_int armed;
static atomic_int counts[VFS_NCOUNTS];

void vfs_arm(void);
void vfs_counts(int out[VFS_NCOUNTS]);
int io_uring_submit(struct io_uring *ring);
int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned submit,
                       unsigned wait_nr, sigset_t *sigmask);
int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags);
void io_uring_queue_exit(struct io_uring *ring);
ssize_t pread(int fd, void *buf, size_t n, off_t off);
ssize_t pread64(int fd, void *buf, size_t n, off64_t off);

void vfs_arm(void)
{
    for (int i = 0; i < VFS_NCOUNTS; i++)
        atomic_store(&counts[i], 0);
    atomic_store(&armed, 1);
}

void vfs_counts(int out[VFS_NCOUNTS])
{
    for (int i = 0; i < VFS_NCOUNTS; i++)
        out[i] = atomic_load(&counts[i]);
}

static void *real_fn(const char *name)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        fprintf(stderr, "[vfs] %s not found after the shim\n", name);
        abort();
    }
    return p;
}

/* The functions hooked, as found after this library; resolved at load,
 * before any thread can call them. */
static int (*real_queue_init)(unsigned, struct io_uring *, unsigned);
static void (*real_queue_exit)(struct io_uring *);
static int (*real_submit)(struct io_uring *);
static int (*real_get_cqe)(struct io_uring *, struct io_uring_cqe **, unsigned, unsigned,
                           sigset_t *);
static ssize_t (*real_pread)(int, void *, size_t, off_t);

__attribute__((constructor)) static void vfs_load(void)
{
    real_queue_init = (int (*)(unsigned, struct io_uring *, unsigned))real_fn("io_uring_queue_init");
    real_queue_exit = (void (*)(struct io_uring *))real_fn("io_uring_queue_exit");
    real_submit = (int (*)(struct io_uring *))real_fn("io_uring_submit");
    real_get_cqe = (int (*)(struct io_uring *, struct io_uring_cqe **, unsigned, unsigned,
                            sigset_t *))real_fn("__io_uring_get_cqe");
    real_pread = (ssize_t (*)(int, void *, size_t, off_t))real_fn("pread");
}

/* Whether call n is in the env's "a-b" range, or is its single "k". */
static int picked(const char *env, int n)
{
    const char *s = getenv(env);
    if (!s || !*s)
        return 0;
    int a = 0, b = 0;
    if (sscanf(s, "%d-%d", &a, &b) == 2)
        return n >= a && n <= b;
    return atoi(s) == n;
}

/* ---------------------------------------------- the hidden completion tail */

/* The rings whose tail is hidden, with their real tail. A ring is made and
 * used by one verifying thread, and ended by the calling thread after it
 * joined that one. */
#define VFS_MAX_RINGS 256
static pthread_mutex_t hidden_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct io_uring *ring;
    unsigned *tail;
} hidden[VFS_MAX_RINGS];

/* The real tail of ring, or NULL when it is not hidden; forget: drop it. */
static unsigned *hidden_tail(struct io_uring *ring, int forget)
{
    unsigned *tail = NULL;
    pthread_mutex_lock(&hidden_lock);
    for (int i = 0; i < VFS_MAX_RINGS; i++)
        if (hidden[i].ring == ring) {
            tail = hidden[i].tail;
            if (forget)
                hidden[i].ring = NULL;
            break;
        }
    pthread_mutex_unlock(&hidden_lock);
    return tail;
}

static void tail_hide_first(struct io_uring *ring)
{
    pthread_mutex_lock(&hidden_lock);
    for (int i = 0; i < VFS_MAX_RINGS; i++)
        if (!hidden[i].ring) {
            hidden[i].ring = ring;
            hidden[i].tail = ring->cq.ktail;
            ring->cq.ktail = ring->cq.khead; /* tail - head: nothing there */
            break;
        }
    pthread_mutex_unlock(&hidden_lock);
}

static void tail_show(struct io_uring *ring)
{
    unsigned *tail = hidden_tail(ring, 0);
    if (tail)
        ring->cq.ktail = tail;
}

static void tail_hide(struct io_uring *ring)
{
    if (hidden_tail(ring, 0))
        ring->cq.ktail = ring->cq.khead;
}

/* ------------------------------------------------------------------ liburing */

int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
    if (atomic_load(&armed) && getenv("VFS_NO_RING")) {
        atomic_fetch_add(&counts[VFS_NO_RINGS], 1);
        return -ENOSYS;
    }
    int rc = real_queue_init(entries, ring, flags);
    if (rc == 0 && atomic_load(&armed)) {
        atomic_fetch_add(&counts[VFS_RINGS], 1);
        if (getenv("VFS_WAIT_FAIL"))
            tail_hide_first(ring);
    }
    return rc;
}

void io_uring_queue_exit(struct io_uring *ring)
{
    unsigned *tail = hidden_tail(ring, 1);
    if (tail)
        ring->cq.ktail = tail;
    real_queue_exit(ring);
}

int io_uring_submit(struct io_uring *ring)
{
    if (!atomic_load(&armed))
        return real_submit(ring);
    int n = atomic_fetch_add(&counts[VFS_SUBMITS], 1) + 1;
    if (picked("VFS_SUBMIT_REFUSE", n)) {
        atomic_fetch_add(&counts[VFS_REFUSED], 1);
        return -EAGAIN;
    }
    if (picked("VFS_SUBMIT_PARTIAL", n)) {
        /* What liburing's submit does (publish the queued SQEs to the
         * kernel's tail), then an enter that takes one. */
        struct io_uring_sq *sq = &ring->sq;
        unsigned tail = sq->sqe_tail;
        if (sq->sqe_head != tail) {
            sq->sqe_head = tail;
            __atomic_store_n(sq->ktail, tail, __ATOMIC_RELEASE);
        }
        unsigned queued = tail - __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE);
        int r = (int)syscall(__NR_io_uring_enter, ring->ring_fd, 1, 0, 0, NULL, 0);
        fprintf(stderr, "[vfs] submit %d: %u queued, the kernel took %d\n", n, queued, r);
        atomic_fetch_add(&counts[VFS_PARTIAL], 1);
        return r < 0 ? -errno : r;
    }
    tail_show(ring);
    int rc = real_submit(ring);
    tail_hide(ring);
    return rc;
}

int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned submit,
                       unsigned wait_nr, sigset_t *sigmask)
{
    if (atomic_load(&armed)) {
        int n = atomic_fetch_add(&counts[VFS_WAITS], 1) + 1;
        if (picked("VFS_WAIT_FAIL", n)) {
            atomic_fetch_add(&counts[VFS_WAIT_FAILED], 1);
            fprintf(stderr, "[vfs] wait %d: -EBADR\n", n);
            return -EBADR;
        }
    }
    tail_show(ring);
    int rc = real_get_cqe(ring, cqe_ptr, submit, wait_nr, sigmask);
    tail_hide(ring);
    return rc;
}

/* ---------------------------------------------------------------------- libc */

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    const char *at = atomic_load(&armed) ? getenv("VFS_EINVAL_AT") : NULL;
    if (at && *at && off >= (off_t)atoll(at) && (fcntl(fd, F_GETFL) & O_DIRECT)) {
        atomic_fetch_add(&counts[VFS_EINVALS], 1);
        errno = EINVAL;
        return -1;
    }
    return real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off64_t off)
{
    return pread(fd, buf, n, (off_t)off);
}
