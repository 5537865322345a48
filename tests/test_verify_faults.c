/* test_verify_faults.c: the fallbacks of sluice_verify's O_DIRECT path
 * (src/api/verify.c), each fault made by verify_faults_shim.c, a library
 * preloaded into a child run of this program (--child): io_uring_submit
 * refused, then a submit that takes fewer SQEs than were queued (a partial
 * submit once left a read marked busy that was never submitted: the thread
 * waited for ever); every submit refused; a wait on the ring failing; no
 * ring at all; O_DIRECT reads refused with EINVAL from offset 0 and from
 * 1 MiB; several threads with faults mixed. Each child runs under alarm()
 * (a hang kills it and fails the test) and reports its sluice_verify
 * report and what the shim did; every digest is checked in the child
 * against an independent SHA-256 of the file's bytes. The parent checks
 * the counts, bytes_hashed, and bytes_direct to the byte where the layout
 * fixes it. A file system without O_DIRECT skips the program (77). */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define CHILD_SECONDS 60                  /* a child past this has hung */
#define MIB ((uint64_t)1 << 20)
#define ITEM_DIRECT_MIN ((uint64_t)64 << 10) /* verify.c: smaller items read buffered */
#define BLOCK_ONE_THREAD MIB              /* verify.c: the O_DIRECT block of 1 thread */
#define MAX_TENSORS 16
#define STR_(x) #x
#define STR(x) STR_(x)

/* What the shim counts (verify_faults_shim.c, vfs_counts), in its order. */
enum { VFS_SUBMITS, VFS_REFUSED, VFS_PARTIAL, VFS_WAITS, VFS_WAIT_FAILED, VFS_RINGS,
       VFS_NO_RINGS, VFS_EINVALS, VFS_NCOUNTS };


/* ---------------------------------------------------------------- the model */

typedef struct model {
    char *dir, *path;
    size_t n;
    uint64_t size[MAX_TENSORS], offset[MAX_TENSORS]; /* offset: in the file */
} model;

/* Writes n U8 tensors "t.0".. of these sizes, in this order, with bytes of
 * a pseudo-random sequence: no period, so a read from the wrong offset
 * cannot give the right digest. */
static void model_make(model *m, size_t n, const uint64_t *sizes)
{
    assert_true(n <= MAX_TENSORS);
    memset(m, 0, sizeof *m);
    m->dir = tu_disk_or_tmpdir();   /* a disk where there is one: O_DIRECT */
    m->path = tu_join(m->dir, "model.safetensors");
    m->n = n;
    mf_buf h = {0};
    uint64_t off = 0;
    mf_addf(&h, "{");
    for (size_t i = 0; i < n; i++) {
        mf_addf(&h, "%s\"t.%zu\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[%llu,%llu]}",
                i ? "," : "", i, (unsigned long long)sizes[i], (unsigned long long)off,
                (unsigned long long)(off + sizes[i]));
        m->size[i] = sizes[i];
        off += sizes[i];
    }
    mf_addf(&h, "}");
    uint8_t *data = malloc(off ? off : 1);
    assert_non_null(data);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < off; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data[i] = (uint8_t)(x >> 24);
    }
    tu_write_safetensors(m->path, h.p, data, (size_t)off);
    uint64_t start = 8 + h.len;
    for (size_t i = 0; i < n; i++) {
        m->offset[i] = start;
        start += sizes[i];
    }
    free(data);
    mf_buf_free(&h);
}

static void model_free(model *m)
{
    tu_rmtree(m->dir);
    free(m->dir);
    free(m->path);
}

static uint64_t model_bytes(const model *m)
{
    uint64_t t = 0;
    for (size_t i = 0; i < m->n; i++)
        t += m->size[i];
    return t;
}

/* The bytes of the tensors sluice_verify reads with O_DIRECT when nothing
 * fails: those of 64 KiB or more. */
static uint64_t model_direct_bytes(const model *m)
{
    uint64_t t = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->size[i] >= ITEM_DIRECT_MIN)
            t += m->size[i];
    return t;
}

static size_t model_direct_items(const model *m)
{
    size_t k = 0;
    for (size_t i = 0; i < m->n; i++)
        k += m->size[i] >= ITEM_DIRECT_MIN;
    return k;
}

/* verify.c reads an item in blocks of `block` bytes from its offset
 * rounded down to 4 KiB. */
static uint64_t first_block(const model *m, size_t i)
{
    return m->offset[i] & ~(uint64_t)4095;
}

/* How many blocks tensor i is read in. */
static uint64_t blocks_of(const model *m, size_t i, uint64_t block)
{
    return (m->offset[i] + m->size[i] - first_block(m, i) + block - 1) / block;
}

/* The bytes of tensor i in its first block. */
static uint64_t in_first_block(const model *m, size_t i, uint64_t block)
{
    uint64_t end = first_block(m, i) + block;
    return (end < m->offset[i] + m->size[i] ? end : m->offset[i] + m->size[i]) - m->offset[i];
}

/* ---------------------------------------------------------------- the child */

typedef struct child_seen {
    const sluice_model *m;
    const char *path;
    size_t right, wrong;
} child_seen;

/* Each tensor: OK, its byte count, its digest an independent SHA-256. */
static int child_item(void *user, const struct sluice_verify_item *it)
{
    child_seen *s = user;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    if (it->kind != SLUICE_VERIFY_ITEM_TENSOR || sluice_info(s->m, it->index, &ti) != SLUICE_OK) {
        fprintf(stderr, "item %zu: not a tensor of the model\n", it->index);
        s->wrong++;
        return 0;
    }
    uint8_t want[32];
    void *bytes = tu_pread_range(s->path, ti.offset, (size_t)ti.nbytes);
    mf_sha256(bytes, (size_t)ti.nbytes, want);
    free(bytes);
    if (it->status != SLUICE_OK || !it->has_digest || it->bytes != ti.nbytes ||
        memcmp(it->digest, want, 32) != 0) {
        char hw[65], hg[65];
        fprintf(stderr, "tensor %s: status %d, %llu of %llu bytes, digest %s, expected %s: %s\n",
                ti.name, it->status, (unsigned long long)it->bytes, (unsigned long long)ti.nbytes,
                mf_hex(it->digest, hg), mf_hex(want, hw), it->message);
        s->wrong++;
    } else {
        s->right++;
    }
    return 0;
}

/* The child: verifies path (O_DIRECT, digests only) on threads threads,
 * the shim armed just before; prints one line for the parent. */
static int child_main(const char *path, unsigned threads)
{
    void (*arm)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "vfs_arm");
    void (*counts)(int *) = (void (*)(int *))dlsym(RTLD_DEFAULT, "vfs_counts");
    if (!arm || !counts) {
        fprintf(stderr, "child: the shim is not preloaded (LD_PRELOAD=%s)\n",
                getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
        return 3;
    }
    sluice_options so;
    sluice_options_init(&so);
    so.flags = SLUICE_F_DIRECT;
    so.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    if (sluice_open(path, &so, &m) != SLUICE_OK) {
        fprintf(stderr, "child: open %s: %s\n", path, m ? sluice_errmsg(m) : "failed");
        sluice_close(m);
        return 4;
    }
    child_seen s = {.m = m, .path = path};
    sluice_verify_options o;
    sluice_verify_options_init(&o);
    o.flags = SLUICE_VF_DIGEST_ONLY;
    o.threads = threads;
    o.on_item = child_item;
    o.user = &s;
    struct sluice_verify_report r = {.size = sizeof r};
    arm();
    int rc = sluice_verify(m, NULL, 0, &o, &r);
    int c[VFS_NCOUNTS];
    counts(c);
    if (rc != SLUICE_OK)
        fprintf(stderr, "child: sluice_verify: %s\n", sluice_errmsg(m));
    printf("rc %d ok %zu failed %zu right %zu wrong %zu hashed %llu direct %llu threads %u "
           "shim %d %d %d %d %d %d %d %d\n",
           rc, r.tensors_ok, r.tensors_failed, s.right, s.wrong,
           (unsigned long long)r.bytes_hashed, (unsigned long long)r.bytes_direct, r.threads,
           c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
    fflush(stdout);
    return sluice_close(m) == SLUICE_OK ? 0 : 5;
}

/* ---------------------------------------------------------------- the parent */

typedef struct outcome {
    int rc;
    size_t ok, failed, right, wrong;
    unsigned long long hashed, direct;
    unsigned threads;
    int c[VFS_NCOUNTS];
    char line[512];
} outcome;

/* Runs the child on m with threads threads, the shim preloaded and env
 * ("NAME=value", NULL-terminated) set; fails the test if the child hangs
 * (killed by its alarm), crashes, or exits non-zero. */
static outcome run_child(const char *what, const model *m, unsigned threads,
                         const char *const *env)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        if (dup2(p[1], 1) < 0)
            _exit(126);
        close(p[1]);
        for (size_t i = 0; env && env[i]; i++) {
            char name[64];
            const char *eq = strchr(env[i], '=');
            if (!eq || (size_t)(eq - env[i]) >= sizeof name)
                _exit(126);
            memcpy(name, env[i], (size_t)(eq - env[i]));
            name[eq - env[i]] = '\0';
            setenv(name, eq + 1, 1);
        }
        /* The shim first; the ASan runtime then is not first of the
         * libraries, which ASan refuses unless told. */
        char buf[4096];
        const char *old = getenv("LD_PRELOAD");
        snprintf(buf, sizeof buf, "%s%s%s", VFS_SHIM, old && *old ? ":" : "", old ? old : "");
        setenv("LD_PRELOAD", buf, 1);
        old = getenv("ASAN_OPTIONS");
        snprintf(buf, sizeof buf, "%s%sverify_asan_link_order=0", old ? old : "",
                 old && *old ? ":" : "");
        setenv("ASAN_OPTIONS", buf, 1);
        char nthreads[16];
        snprintf(nthreads, sizeof nthreads, "%u", threads);
        alarm(CHILD_SECONDS); /* kept across exec: a hang ends here */
        execl("/proc/self/exe", "test_verify_faults", "--child", m->path, nthreads, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    outcome o;
    memset(&o, 0, sizeof o);
    size_t len = 0;
    for (;;) {
        ssize_t got = read(p[0], o.line + len, sizeof o.line - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len == sizeof o.line - 1)
            break;
    }
    o.line[len] = '\0';
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        assert_int_equal(errno, EINTR);
    if (WIFSIGNALED(st))
        fail_msg("%s: the child was killed by signal %d%s; it printed: %s", what, WTERMSIG(st),
                 WTERMSIG(st) == SIGALRM ? " (its alarm: it hung for " STR(CHILD_SECONDS) " s)"
                                         : "", o.line);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: the child exited with %d; it printed: %s", what, WEXITSTATUS(st), o.line);
    int k = sscanf(o.line, "rc %d ok %zu failed %zu right %zu wrong %zu hashed %llu direct %llu "
                   "threads %u shim %d %d %d %d %d %d %d %d",
                   &o.rc, &o.ok, &o.failed, &o.right, &o.wrong, &o.hashed, &o.direct, &o.threads,
                   &o.c[0], &o.c[1], &o.c[2], &o.c[3], &o.c[4], &o.c[5], &o.c[6], &o.c[7]);
    if (k != 8 + VFS_NCOUNTS)
        fail_msg("%s: the child printed: %s", what, o.line);
    fprintf(stderr, "%s: %s", what, o.line);
    return o;
}

/* Every tensor reported once, OK, with the right digest, every byte hashed. */
static void expect_clean(const model *m, const outcome *o)
{
    assert_int_equal(o->rc, SLUICE_OK);
    assert_int_equal(o->ok, m->n);
    assert_int_equal(o->failed, 0);
    assert_int_equal(o->right, m->n);
    assert_int_equal(o->wrong, 0);
    assert_int_equal(o->hashed, model_bytes(m));
}

/* A 1.5 MB, a 3 MiB, a 70,001-byte tensor read direct; one of 64 KiB - 1,
 * one of 100 and an empty one read buffered. */
static const uint64_t mixed[] = {1500000, 3 * MIB + 5, 70001, 65535, 100, 0};
#define NMIXED (sizeof mixed / sizeof mixed[0])

/* ---------------------------------------------------------------- scenarios */

/* The shim preloaded, nothing failed: every byte of a large tensor read
 * on the ring. */
static void no_faults(void **state)
{
    (void)state;
    model m;
    model_make(&m, NMIXED, mixed);
    outcome o = run_child("no faults", &m, 1, NULL);
    expect_clean(&m, &o);
    assert_int_equal(o.direct, model_direct_bytes(&m));
    assert_int_equal(o.c[VFS_RINGS], 1);
    assert_true(o.c[VFS_SUBMITS] >= 5); /* 2 + 4 + 1 blocks */
    assert_int_equal(o.c[VFS_REFUSED] + o.c[VFS_PARTIAL] + o.c[VFS_WAIT_FAILED] + o.c[VFS_EINVALS], 0);
    model_free(&m);
}

/* One 1.5 MB tensor (2 blocks), 1 thread: block 0's submit is refused 9
 * times (all its tries), so its read becomes a queued NOP and block 0 is
 * read with pread; block 1's submit then takes only that NOP (a partial
 * submit), the read still queued: it is submitted again, not marked busy
 * unsubmitted (which waited for ever). */
static void submit_refused_then_partial(void **state)
{
    (void)state;
    const uint64_t sizes[] = {1500000};
    model m;
    model_make(&m, 1, sizes);
    assert_int_equal(blocks_of(&m, 0, BLOCK_ONE_THREAD), 2);
    const char *env[] = {"VFS_SUBMIT_REFUSE=1-9", "VFS_SUBMIT_PARTIAL=10", NULL};
    outcome o = run_child("9 submits refused, then a partial one", &m, 1, env);
    expect_clean(&m, &o);
    assert_int_equal(o.direct, 1500000); /* both blocks from the O_DIRECT descriptor */
    assert_int_equal(o.c[VFS_REFUSED], 9);
    assert_int_equal(o.c[VFS_PARTIAL], 1);
    assert_int_equal(o.c[VFS_SUBMITS], 11); /* 9 refused, the partial, the read */
    model_free(&m);
}

/* Every submit refused: every block read with pread, the ring's SQ filling
 * with NOPs until it has no room (then no SQE is asked for). */
static void submit_always_refused(void **state)
{
    (void)state;
    model m;
    model_make(&m, NMIXED, mixed);
    const char *env[] = {"VFS_SUBMIT_REFUSE=1-1000000", NULL};
    outcome o = run_child("every submit refused", &m, 1, env);
    expect_clean(&m, &o);
    assert_int_equal(o.direct, model_direct_bytes(&m));
    assert_true(o.c[VFS_REFUSED] >= 9);
    assert_int_equal(o.c[VFS_REFUSED], o.c[VFS_SUBMITS]);
    model_free(&m);
}

/* The ring fails on a wait (every wait is counted: the shim hides
 * completions from the inline peek). */
static void wait_failure(void **state)
{
    (void)state;
    /* 1 thread, largest first: t.0, t.1 and t.2 one block each (one read,
     * so one wait each); t.3 small. The second wait (t.1's) fails: t.1 is
     * read buffered from its start, and so is t.2 (the thread reads
     * buffered from then on); t.0 alone was read direct. */
    const uint64_t sizes[] = {600000, 300000, 200000, 100};
    model m;
    model_make(&m, 4, sizes);
    assert_int_equal(blocks_of(&m, 0, BLOCK_ONE_THREAD), 1);
    assert_int_equal(blocks_of(&m, 1, BLOCK_ONE_THREAD), 1);
    assert_int_equal(blocks_of(&m, 2, BLOCK_ONE_THREAD), 1);
    const char *env[] = {"VFS_WAIT_FAIL=2", NULL};
    outcome o = run_child("the second wait fails", &m, 1, env);
    expect_clean(&m, &o);
    assert_int_equal(o.direct, 600000);
    assert_int_equal(o.c[VFS_WAIT_FAILED], 1);
    assert_int_equal(o.c[VFS_WAITS], 2);
    model_free(&m);

    /* Inside one tensor of 4 blocks, reads in flight: whichever completion
     * the first wait gave, the tensor is read direct up to a block boundary
     * at most (or not at all), the rest buffered from there. */
    const uint64_t one[] = {3 * MIB + 500000};
    model_make(&m, 1, one);
    assert_int_equal(blocks_of(&m, 0, BLOCK_ONE_THREAD), 4);
    o = run_child("the second wait fails inside a tensor", &m, 1, env);
    expect_clean(&m, &o);
    assert_int_equal(o.c[VFS_WAIT_FAILED], 1);
    assert_int_equal(o.c[VFS_WAITS], 2);
    assert_true(o.direct < one[0]);
    if (o.direct) /* block 0 came first: exactly its part of the tensor */
        assert_int_equal(o.direct, in_first_block(&m, 0, BLOCK_ONE_THREAD));
    model_free(&m);
}

/* No ring (io_uring_queue_init fails): the blocks are read with pread on
 * the O_DIRECT descriptor, every byte still direct. */
static void no_ring(void **state)
{
    (void)state;
    model m;
    model_make(&m, NMIXED, mixed);
    const char *env[] = {"VFS_NO_RING=1", NULL};
    outcome o = run_child("no ring", &m, 1, env);
    expect_clean(&m, &o);
    assert_int_equal(o.direct, model_direct_bytes(&m));
    assert_int_equal(o.c[VFS_NO_RINGS], 1);
    assert_int_equal(o.c[VFS_SUBMITS], 0);
    model_free(&m);
}

/* No ring, and the file refuses O_DIRECT reads (EINVAL) from offset 0:
 * each item is read buffered from its start, nothing direct. */
static void no_ring_einval_at_0(void **state)
{
    (void)state;
    model m;
    model_make(&m, NMIXED, mixed);
    const char *env[] = {"VFS_NO_RING=1", "VFS_EINVAL_AT=0", NULL};
    outcome o = run_child("no ring, EINVAL from 0", &m, 1, env);
    expect_clean(&m, &o);
    assert_int_equal(o.direct, 0);
    assert_true((size_t)o.c[VFS_EINVALS] >= model_direct_items(&m));
    model_free(&m);
}

/* No ring, EINVAL from 1 MiB: t.0 lies in one block below 1 MiB, all
 * direct; t.1's first block starts below 1 MiB, its second past it: the
 * bytes of the first are read direct, the rest buffered from exactly its
 * end; t.2, past 1 MiB, buffered. */
static void no_ring_einval_at_1mib(void **state)
{
    (void)state;
    const uint64_t sizes[] = {200000, 3 * MIB + 5, 70001, 100};
    model m;
    model_make(&m, 4, sizes);
    assert_true(first_block(&m, 0) < MIB && blocks_of(&m, 0, BLOCK_ONE_THREAD) == 1);
    assert_true(first_block(&m, 1) < MIB && first_block(&m, 1) + BLOCK_ONE_THREAD >= MIB);
    assert_true(first_block(&m, 2) >= MIB);
    const char *env[] = {"VFS_NO_RING=1", "VFS_EINVAL_AT=1048576", NULL};
    outcome o = run_child("no ring, EINVAL from 1 MiB", &m, 1, env);
    expect_clean(&m, &o);
    assert_true(in_first_block(&m, 1, BLOCK_ONE_THREAD) < sizes[1]);
    assert_int_equal(o.direct, sizes[0] + in_first_block(&m, 1, BLOCK_ONE_THREAD));
    assert_true(o.c[VFS_EINVALS] >= 2);
    model_free(&m);
}

/* 4 threads (blocks of 512 KiB), 14 tensors (2 of them exactly around the
 * 64 KiB line): clean, every byte direct; then submits 3..20 refused, 22
 * partial, and the sixth wait failing on whichever thread makes it: every
 * digest still right, and fewer bytes direct (the thread whose ring
 * failed had a read in flight for its tensor, and goes on buffered). */
static void several_threads(void **state)
{
    (void)state;
    const uint64_t sizes[] = {5 * MIB + 3, 4 * MIB + 77, 3 * MIB + 1, 2 * MIB + 5, 1500000,
                              MIB, 900001, 700000, 500000, 300007, 70001, 65536, 65535, 1};
    model m;
    model_make(&m, sizeof sizes / sizeof sizes[0], sizes);
    outcome o = run_child("4 threads, no faults", &m, 4, NULL);
    expect_clean(&m, &o);
    assert_int_equal(o.threads, 4);
    assert_int_equal(o.direct, model_direct_bytes(&m));
    assert_true(o.c[VFS_RINGS] >= 1 && o.c[VFS_RINGS] <= 4);

    const char *env[] = {"VFS_SUBMIT_REFUSE=3-20", "VFS_SUBMIT_PARTIAL=22", "VFS_WAIT_FAIL=6",
                         NULL};
    o = run_child("4 threads, submits refused, a partial one, a wait failing", &m, 4, env);
    expect_clean(&m, &o);
    assert_int_equal(o.c[VFS_REFUSED], 18);
    assert_true(o.c[VFS_SUBMITS] >= 22);
    assert_int_equal(o.c[VFS_PARTIAL], 1);
    assert_int_equal(o.c[VFS_WAIT_FAILED], 1);
    assert_true(o.direct < model_direct_bytes(&m));
    model_free(&m);
}

/* ---------------------------------------------------------------- main */

/* Whether files in the test's temporary folder take O_DIRECT reads; if
 * not, why (in why). */
static int direct_works(char *why, size_t cap)
{
    char *dir = tu_disk_or_tmpdir();
    char *path = tu_join(dir, "probe");
    static const char zeros[8192];
    tu_write_file(path, zeros, sizeof zeros);
    int ok = 0;
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        snprintf(why, cap, "open(O_DIRECT) in %s: %s", dir, strerror(errno));
    } else {
        void *buf = NULL;
        if (posix_memalign(&buf, 4096, 4096) != 0)
            abort();
        ssize_t got = pread(fd, buf, 4096, 0);
        if (got != 4096)
            snprintf(why, cap, "O_DIRECT pread in %s: %s", dir,
                     got < 0 ? strerror(errno) : "short");
        ok = got == 4096;
        free(buf);
        close(fd);
    }
    tu_rmtree(dir);
    free(dir);
    free(path);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2], (unsigned)atoi(argv[3]));
    char why[512];
    if (!direct_works(why, sizeof why)) {
        fprintf(stderr, "skipped: %s; nothing would be read with O_DIRECT (set TMPDIR to a "
                "folder on a file system that takes it)\n", why);
        return 77;
    }
    /* Most cases fail a ring: without one (io_uring refused, as under a
     * default container seccomp profile) the program is skipped, visibly,
     * rather than passing with its point untested. */
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "skipped: io_uring_queue_init fails here (%s), so there is no ring to "
                "fail\n", strerror(-rc));
        return 77;
    }
    io_uring_queue_exit(&ring);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_faults),
        cmocka_unit_test(submit_refused_then_partial),
        cmocka_unit_test(submit_always_refused),
        cmocka_unit_test(wait_failure),
        cmocka_unit_test(no_ring),
        cmocka_unit_test(no_ring_einval_at_0),
        cmocka_unit_test(no_ring_einval_at_1mib),
        cmocka_unit_test(several_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
