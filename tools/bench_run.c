/* bench_run.c: one measured run of `sluice bench`, in a child process.
 *
 * Each run forks, so that its peak RSS and CPU time are its own and a
 * crash or a leak in one configuration cannot touch the next. The child
 * writes a bench_result into a pipe and exits.
 *
 * Latencies: in stream mode (and for the two pread baselines) the time from
 * the start of the read to the delivery of each tensor; in random mode the
 * time each sluice_acquire blocked.
 */
#include "bench.h"

#include "sluice.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEQ_READ_BYTES ((size_t)8 << 20)
#define SHA_BUF_BYTES ((size_t)16 << 20)

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fail(bench_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(bench_result *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    r->ok = 0;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Fills first/p50/p99 from n latencies in seconds (sorted here). */
static void latencies(bench_result *r, double *lat, size_t n, double first)
{
    if (!n)
        return;
    qsort(lat, n, sizeof *lat, cmp_double);
    r->first_ms = first * 1e3;
    r->p50_ms = lat[(n - 1) / 2] * 1e3;
    r->p99_ms = lat[(size_t)ceil(0.99 * (double)n) - 1] * 1e3;
}

/* ---------------------------------------------------------------- baselines */

static ssize_t pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static int open_all(const bench_model *m, int *fds, bench_result *r)
{
    for (size_t f = 0; f < m->nfiles; f++) {
        fds[f] = open(m->files[f], O_RDONLY | O_CLOEXEC);
        if (fds[f] < 0) {
            fail(r, "open %s: %s", m->files[f], strerror(errno));
            while (f--)
                close(fds[f]);
            return -1;
        }
    }
    return 0;
}

/* (a) Every file read front to back into one reused 8 MiB buffer; a
 * tensor counts as delivered once the read has passed its last byte. */
static void run_seq(const bench_model *m, bench_result *r, double *lat)
{
    int *fds = calloc(m->nfiles, sizeof *fds);
    void *buf = NULL;
    if (!fds || posix_memalign(&buf, 4096, SEQ_READ_BYTES) != 0) {
        fail(r, "out of memory");
        goto out;
    }
    memset(buf, 0, SEQ_READ_BYTES);
    double t0 = bench_now(), first = NAN;
    if (open_all(m, fds, r) < 0)
        goto out;
    size_t t = 0, nlat = 0;
    for (size_t f = 0; f < m->nfiles && r->ok; f++) {
        uint64_t off = 0;
        while (off < m->file_sizes[f]) {
            ssize_t n = pread_full(fds[f], buf, SEQ_READ_BYTES, off);
            if (n <= 0) {
                fail(r, "read %s at %llu: %s", m->files[f], (unsigned long long)off,
                     n < 0 ? strerror(errno) : "unexpected end of file");
                break;
            }
            off += (uint64_t)n;
            r->bytes_read += (uint64_t)n;
            double now = bench_now() - t0;
            for (; t < m->ntensors && m->tensors[t].file == f &&
                   m->tensors[t].offset + m->tensors[t].nbytes <= off; t++) {
                if (isnan(first))
                    first = now;
                lat[nlat++] = now;
            }
        }
    }
    for (size_t f = 0; f < m->nfiles; f++)
        close(fds[f]);
    r->wall_s = bench_now() - t0;
    r->bytes_needed = m->tensor_bytes;
    latencies(r, lat, nlat, first);
out:
    free(buf);
    free(fds);
}

/* (b) What most loaders do: each tensor read whole into a buffer, then
 * hashed, one after the other on one thread. */
static void run_pread_sha(const bench_model *m, bench_result *r, double *lat)
{
    int *fds = calloc(m->nfiles, sizeof *fds);
    uint8_t *buf = NULL;
    size_t cap = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!fds || !ctx) {
        fail(r, "out of memory");
        goto out;
    }
    double t0 = bench_now();
    if (open_all(m, fds, r) < 0)
        goto out;
    for (size_t i = 0; i < m->ntensors; i++) {
        const bench_tensor *t = &m->tensors[i];
        if (t->nbytes > cap) {
            free(buf);
            cap = (size_t)t->nbytes;
            if (!(buf = malloc(cap))) {
                fail(r, "out of memory for a tensor of %zu bytes", cap);
                break;
            }
        }
        ssize_t n = pread_full(fds[t->file], buf, (size_t)t->nbytes, t->offset);
        if (n != (ssize_t)t->nbytes) {
            fail(r, "read %s at %llu: %s", m->files[t->file], (unsigned long long)t->offset,
                 n < 0 ? strerror(errno) : "unexpected end of file");
            break;
        }
        uint8_t digest[32];
        if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ||
            !EVP_DigestUpdate(ctx, buf, (size_t)t->nbytes) ||
            !EVP_DigestFinal_ex(ctx, digest, NULL)) {
            fail(r, "SHA-256 failed (OpenSSL)");
            break;
        }
        r->bytes_read += (uint64_t)n;
        r->bytes_hashed += (uint64_t)n;
        lat[i] = bench_now() - t0;
    }
    for (size_t f = 0; f < m->nfiles; f++)
        close(fds[f]);
    r->wall_s = bench_now() - t0;
    r->bytes_needed = m->tensor_bytes;
    if (r->ok)
        latencies(r, lat, m->ntensors, lat[0]);
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    free(fds);
}

/* (e) The ceiling of any load that copies bytes out of the page cache and
 * hashes them: one thread per online CPU, each taking the next tensor
 * (largest first, so the threads finish together), reading it in 8 MiB
 * pieces into one reused buffer of its own and hashing each piece while it
 * is still in cache. No pool, no queue, no handover between threads: what
 * remains is the kernel's copy and SHA-256 itself. */
typedef struct sized {
    uint64_t nbytes;
    size_t index;
} sized;

typedef struct par_shared {
    const bench_model *m;
    const int *fds;
    const sized *order;             /* the tensors, largest first */
    size_t next;                    /* atomic: the next entry of order */
    int failed;                     /* atomic: a thread failed; the rest stop */
    pthread_mutex_t lock;           /* err and the byte counts */
    char err[384];
    uint64_t bytes;
} par_shared;

static void *par_thread(void *arg)
{
    par_shared *sh = arg;
    const bench_model *m = sh->m;
    char err[384] = "";
    uint64_t bytes = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    void *buf = NULL;
    if (!ctx || posix_memalign(&buf, 4096, SEQ_READ_BYTES) != 0) {
        snprintf(err, sizeof err, "out of memory");
        goto out;
    }
    for (;;) {
        size_t k = __atomic_fetch_add(&sh->next, 1, __ATOMIC_RELAXED);
        if (k >= m->ntensors || __atomic_load_n(&sh->failed, __ATOMIC_RELAXED))
            break;
        const bench_tensor *t = &m->tensors[sh->order[k].index];
        if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
            snprintf(err, sizeof err, "SHA-256 failed (OpenSSL)");
            break;
        }
        for (uint64_t done = 0; done < t->nbytes && !err[0];) {
            size_t want = t->nbytes - done < SEQ_READ_BYTES ? (size_t)(t->nbytes - done)
                                                             : SEQ_READ_BYTES;
            ssize_t n = pread_full(sh->fds[t->file], buf, want, t->offset + done);
            if (n != (ssize_t)want)
                snprintf(err, sizeof err, "read %s at %llu: %s", m->files[t->file],
                         (unsigned long long)(t->offset + done),
                         n < 0 ? strerror(errno) : "unexpected end of file");
            else if (!EVP_DigestUpdate(ctx, buf, want))
                snprintf(err, sizeof err, "SHA-256 failed (OpenSSL)");
            done += want;
        }
        uint8_t digest[32];
        if (!err[0] && !EVP_DigestFinal_ex(ctx, digest, NULL))
            snprintf(err, sizeof err, "SHA-256 failed (OpenSSL)");
        if (err[0])
            break;
        bytes += t->nbytes;
    }
out:
    if (err[0])
        __atomic_store_n(&sh->failed, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&sh->lock);
    if (err[0] && !sh->err[0])
        snprintf(sh->err, sizeof sh->err, "%s", err);
    sh->bytes += bytes;
    pthread_mutex_unlock(&sh->lock);
    free(buf);
    EVP_MD_CTX_free(ctx);
    return NULL;
}

static int larger_first(const void *a, const void *b)
{
    uint64_t x = ((const sized *)a)->nbytes, y = ((const sized *)b)->nbytes;
    return (x < y) - (x > y);
}

static void run_pread_sha_par(const bench_model *m, bench_result *r)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nthreads = ncpu > 0 ? (size_t)ncpu : 1;
    int *fds = calloc(m->nfiles, sizeof *fds);
    sized *order = calloc(m->ntensors ? m->ntensors : 1, sizeof *order);
    pthread_t *th = calloc(nthreads, sizeof *th);
    par_shared sh = {.m = m, .fds = fds, .order = order};
    pthread_mutex_init(&sh.lock, NULL);
    if (!fds || !order || !th) {
        fail(r, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m->ntensors; i++)
        order[i] = (sized){m->tensors[i].nbytes, i};
    qsort(order, m->ntensors, sizeof *order, larger_first);
    double t0 = bench_now();
    if (open_all(m, fds, r) < 0)
        goto out;
    size_t started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&th[started], NULL, par_thread, &sh) != 0)
            break;
    for (size_t k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    r->wall_s = bench_now() - t0;
    for (size_t f = 0; f < m->nfiles; f++)
        close(fds[f]);
    if (!started)
        fail(r, "cannot start a thread");
    else if (sh.err[0])
        fail(r, "%s", sh.err);
    r->bytes_read = r->bytes_hashed = sh.bytes;
    r->bytes_needed = m->tensor_bytes;
out:
    pthread_mutex_destroy(&sh.lock);
    free(th);
    free(order);
    free(fds);
}

/* (c) The hashing ceiling of one core: SHA-256 over a 16 MiB buffer in
 * memory, as many bytes as the model holds (at least 256 MiB, at most
 * 1 GiB, so that it is neither noise nor a long wait). */
static void run_sha_mem(const bench_model *m, bench_result *r)
{
    uint64_t want = m->tensor_bytes;
    if (want < ((uint64_t)256 << 20))
        want = (uint64_t)256 << 20;
    if (want > ((uint64_t)1 << 30))
        want = (uint64_t)1 << 30;
    uint8_t *buf = malloc(SHA_BUF_BYTES);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!buf || !ctx) {
        fail(r, "out of memory");
        goto out;
    }
    uint64_t x = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < SHA_BUF_BYTES; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    double t0 = bench_now();
    uint64_t done = 0;
    uint8_t digest[32];
    while (done < want) {
        size_t n = want - done < SHA_BUF_BYTES ? (size_t)(want - done) : SHA_BUF_BYTES;
        if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) || !EVP_DigestUpdate(ctx, buf, n) ||
            !EVP_DigestFinal_ex(ctx, digest, NULL)) {
            fail(r, "SHA-256 failed (OpenSSL)");
            break;
        }
        done += n;
    }
    r->wall_s = bench_now() - t0;
    r->bytes_hashed = done;
    r->bytes_needed = done;
out:
    EVP_MD_CTX_free(ctx);
    free(buf);
}

/* (a) of a remote model: curl fetching every file's bytes, split into
 * BENCH_CURL_CONNECTIONS ranges (the library's remote_connections
 * default), one process each, all at once; only http(s):// (an s3://
 * model would need curl to sign). */
#define BENCH_CURL_CONNECTIONS 8

static void run_curl(const bench_model *m, bench_result *r)
{
    uint64_t total = 0;
    for (size_t f = 0; f < m->nfiles; f++)
        total += m->file_sizes[f];
    uint64_t part = total / BENCH_CURL_CONNECTIONS + 1;
    pid_t pids[BENCH_CURL_CONNECTIONS * 64];
    size_t np = 0;
    double t0 = bench_now();
    for (size_t f = 0; f < m->nfiles && r->ok; f++) {
        if (strncmp(m->files[f], "http://", 7) && strncmp(m->files[f], "https://", 8)) {
            fail(r, "curl baseline: %s is not an http(s):// URL", m->files[f]);
            break;
        }
        for (uint64_t a = 0; a < m->file_sizes[f] && np < sizeof pids / sizeof *pids; a += part) {
            uint64_t b = a + part < m->file_sizes[f] ? a + part - 1 : m->file_sizes[f] - 1;
            char range[64];
            snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)a,
                     (unsigned long long)b);
            pid_t pid = fork();
            if (pid == 0) {
                execlp("curl", "curl", "-s", "-f", "-o", "/dev/null", "-r", range, m->files[f],
                       (char *)NULL);
                _exit(127);
            }
            if (pid < 0) {
                fail(r, "curl baseline: fork: %s", strerror(errno));
                break;
            }
            pids[np++] = pid;
        }
    }
    for (size_t k = 0; k < np; k++) {
        int st;
        while (waitpid(pids[k], &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail(r, "curl baseline: curl exited with %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    r->wall_s = bench_now() - t0;
    r->bytes_read = total;
    r->bytes_needed = total;
}

/* ---------------------------------------------------------------- sluice */

typedef struct stream_ctx {
    double t0, first;
    double *lat;
    size_t n, cap;
    bench_result *r;
} stream_ctx;

static int on_tensor(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    stream_ctx *c = user;
    double now = bench_now() - c->t0;
    if (status == SLUICE_E_TOO_LARGE) {
        /* A pool smaller than a tensor is a setting to measure, not a
         * broken run: the others still load. */
        if (!c->r->tensors_refused++)
            snprintf(c->r->err, sizeof c->r->err, "%s", message ? message : "tensor larger than the pool");
        return 0;
    }
    if (status != SLUICE_OK) {
        if (c->r->ok && message && *message) /* the message names the tensor */
            fail(c->r, "%s", message);
        else if (c->r->ok)
            fail(c->r, "tensor %s: %s", info ? info->name : "?", sluice_strerror(status));
        return 0;
    }
    /* latencies are those of tensors delivered */
    if (isnan(c->first))
        c->first = now;
    if (c->n < c->cap)
        c->lat[c->n++] = now;
    sluice_release(t);
    return 0;
}

/* Fisher-Yates with a fixed seed: every run acquires in the same order. */
static void shuffle(size_t *v, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = n; i > 1; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t j = (size_t)(x % i);
        size_t tmp = v[i - 1];
        v[i - 1] = v[j];
        v[j] = tmp;
    }
}

/* --metrics-port: a server started before the run's clock, so that only
 * adding the model is timed; NULL when not asked or when it cannot start
 * (the run then fails). */
static sluice_metrics_server *metrics_start(const bench_opts *o, bench_result *r)
{
    if (o->metrics_port < 0)
        return NULL;
    sluice_metrics_server *s = NULL;
    int rc = sluice_metrics_serve(NULL, (unsigned)o->metrics_port, &s);
    if (rc != SLUICE_OK)
        fail(r, "cannot serve metrics on 127.0.0.1:%d: %s", o->metrics_port, sluice_strerror(rc));
    return s;
}

static void metrics_stop(sluice_metrics_server *s, sluice_model *m)
{
    if (s && m)
        sluice_metrics_server_remove(s, m);
    sluice_metrics_server_free(s);
}

/* Opens the run's model with opts, *t0 the clock's start (after the
 * metrics server's, whose model it is added to); NULL, the run failed and
 * nothing left open, when it cannot. */
static sluice_model *open_timed(const bench_model *bm, const sluice_options *opts,
                                const bench_opts *o, bench_result *r,
                                sluice_metrics_server **ms, double *t0)
{
    *ms = metrics_start(o, r);
    *t0 = bench_now();
    sluice_model *m = NULL;
    int rc = r->ok ? sluice_open(bm->path, opts, &m) : SLUICE_E_INVAL;
    if (rc == SLUICE_OK && *ms && (rc = sluice_metrics_server_add(*ms, m)) != SLUICE_OK)
        fail(r, "metrics: %s", sluice_strerror(rc));
    else if (rc != SLUICE_OK && r->ok)
        fail(r, "open: %s", m ? sluice_errmsg(m) : sluice_strerror(rc));
    if (rc == SLUICE_OK)
        return m;
    sluice_close(m);
    metrics_stop(*ms, NULL);
    return NULL;
}

/* Ends what open_timed began: the server first (it holds the model),
 * then the model; the run's wall time ends with its close. */
static void close_timed(sluice_model *m, sluice_metrics_server *ms, double t0, bench_result *r)
{
    metrics_stop(ms, m);
    int rc = sluice_close(m);
    r->wall_s = bench_now() - t0;
    if (rc != SLUICE_OK && r->ok)
        fail(r, "close: %s", sluice_strerror(rc));
}

/* The manifest a verified run of c reads: the BLAKE3 one the bench wrote,
 * or the one given (NULL: the sidecar). */
static const char *manifest_of(const bench_config *c, const bench_opts *o)
{
    return c->algorithm == SLUICE_ALG_BLAKE3 ? o->manifest_blake3 : o->manifest;
}

static void run_sluice(const bench_model *bm, const bench_config *c, const bench_opts *o,
                       bench_result *r, double *lat)
{
    sluice_options opts;
    sluice_options_init(&opts);
    opts.pool_bytes = c->pool;
    opts.chunk_bytes = c->chunk;
    opts.queue_depth = c->qd;
    opts.flags = (c->direct ? SLUICE_F_DIRECT : 0) | (c->force_pread ? SLUICE_F_FORCE_PREAD : 0);
    opts.verify = c->verify ? SLUICE_VERIFY_REQUIRE : SLUICE_VERIFY_OFF;
    opts.manifest_path = c->verify ? manifest_of(c, o) : NULL;
    size_t *order = NULL;
    if (c->mode == BM_RANDOM) {
        if (!(order = malloc((bm->ntensors ? bm->ntensors : 1) * sizeof *order))) {
            fail(r, "out of memory");
            return;
        }
        for (size_t i = 0; i < bm->ntensors; i++)
            order[i] = i;
        shuffle(order, bm->ntensors, o->seed);
    }

    sluice_metrics_server *ms;
    double t0;
    sluice_model *m = open_timed(bm, &opts, o, r, &ms, &t0);
    if (!m) {
        free(order);
        return;
    }
    int rc;
    double t1 = bench_now();
    r->open_ms = (t1 - t0) * 1e3;
    if (c->mode == BM_STREAM) {
        stream_ctx sc = {.t0 = t1, .first = NAN, .lat = lat, .cap = bm->ntensors, .r = r};
        rc = sluice_stream(m, NULL, 0, on_tensor, &sc);
        if (rc != SLUICE_OK && r->ok && !(rc == SLUICE_E_TOO_LARGE && r->tensors_refused))
            fail(r, "stream: %s", sluice_errmsg(m)[0] ? sluice_errmsg(m) : sluice_strerror(rc));
        latencies(r, lat, sc.n, sc.first);
    } else {
        double first = NAN;
        size_t n = 0;
        for (size_t k = 0; k < bm->ntensors; k++) {
            sluice_tensor *t = NULL;
            double a = bench_now();
            rc = sluice_acquire_index(m, order[k], &t);
            double b = bench_now();
            if (rc == SLUICE_E_TOO_LARGE) {
                if (!r->tensors_refused++)
                    snprintf(r->err, sizeof r->err, "%s", sluice_errmsg(m));
                continue;
            }
            if (rc != SLUICE_OK) {
                struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
                if (*sluice_errmsg(m)) /* the message names the tensor */
                    fail(r, "%s", sluice_errmsg(m));
                else if (sluice_info(m, order[k], &info) == SLUICE_OK)
                    fail(r, "acquire %s: %s", info.name, sluice_strerror(rc));
                break;
            }
            if (isnan(first))
                first = b - t1;
            lat[n++] = b - a;
            sluice_release(t);
        }
        latencies(r, lat, n, first);
    }
    struct sluice_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    if (sluice_stats(m, &st) == SLUICE_OK) {
        r->bytes_read = st.bytes_read;
        r->bytes_needed = st.bytes_delivered;
        r->bytes_hashed = st.bytes_hashed;
        r->direct_fallbacks = st.direct_fallbacks;
        r->backend = (int)st.backend;
    }
    if (r->ok && !r->tensors_refused && r->bytes_needed != bm->tensor_bytes)
        fail(r, "delivered %llu bytes of %llu", (unsigned long long)r->bytes_needed,
             (unsigned long long)bm->tensor_bytes);
    close_timed(m, ms, t0, r);
    free(order);
}

/* Baseline (d): fio reading the model's files with O_DIRECT through
 * io_uring, c->chunk bytes a block, c->qd in flight (those of the sluice
 * configuration it is compared with), one file after the other; its own
 * terse report gives bytes and time. */
static void run_fio(const bench_model *m, const bench_config *c, bench_result *r)
{
    size_t len = 256;
    for (size_t f = 0; f < m->nfiles; f++) {
        if (strpbrk(m->files[f], ":'\\")) {
            fail(r, "fio: file name %s holds ':', a quote or a backslash", m->files[f]);
            return;
        }
        len += strlen(m->files[f]) + 1;
    }
    char *cmd = malloc(len);
    if (!cmd) {
        fail(r, "out of memory");
        return;
    }
    size_t o = (size_t)snprintf(cmd, len, "fio --name=sluice-bench --ioengine=io_uring --direct=1 "
                                          "--bs=%llu --iodepth=%u --rw=read --file_service_type=sequential "
                                          "--output-format=terse --terse-version=3 '--filename=",
                                (unsigned long long)c->chunk, (unsigned)c->qd);
    for (size_t f = 0; f < m->nfiles; f++)
        o += (size_t)snprintf(cmd + o, len - o, "%s%s", f ? ":" : "", m->files[f]);
    snprintf(cmd + o, len - o, "' 2>&1");
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p) {
        fail(r, "fio: %s", strerror(errno));
        return;
    }
    char line[4096] = "";
    unsigned long long kib = 0, ms = 0;
    int parsed = 0;
    while (fgets(line, sizeof line, p))
        if (!parsed && sscanf(line, "3;%*[^;];%*[^;];%*[^;];%*[^;];%llu;%*[^;];%*[^;];%llu", &kib, &ms) == 2)
            parsed = 1;
    int st = pclose(p);
    if (!parsed || st != 0 || ms == 0) {
        fail(r, "fio failed (status %d): %.200s", st, line);
        return;
    }
    r->bytes_read = r->bytes_needed = kib * 1024ull;
    r->wall_s = (double)ms / 1e3;
}

/* ---------------------------------------------------------------- the child */

static void reset(bench_result *r)
{
    memset(r, 0, sizeof *r);
    r->ok = 1;
    r->backend = -1;
    r->open_ms = r->first_ms = r->p50_ms = r->p99_ms = NAN;
}

/* ---------------------------------------------------------------- verify */

void bench_verify_shape(unsigned threads, uint64_t *block, unsigned *depth)
{
    /* sluice.h: min(1 MiB, 2 MiB / threads), 4 KiB aligned, 24 a thread;
     * past 8 threads 256 KiB blocks, fewer of them, 48 MiB in all */
    if (!threads)
        threads = 1;
    if (threads > 64)
        threads = 64;
    uint64_t share = ((uint64_t)48 << 20) / threads;
    uint64_t b = (share / 24) & ~(uint64_t)4095;
    *depth = 24;
    if (b > ((uint64_t)1 << 20))
        b = (uint64_t)1 << 20;
    if (b < ((uint64_t)256 << 10)) {
        b = (uint64_t)256 << 10;
        *depth = share / b ? (unsigned)(share / b) : 1;
    }
    *block = b;
}

/* sluice_verify of every tensor: open, verify, close. */
static void run_verify(const bench_model *bm, const bench_config *c, const bench_opts *o,
                       bench_result *r)
{
    sluice_options opts;
    sluice_options_init(&opts);
    opts.flags = c->direct ? SLUICE_F_DIRECT : 0;
    opts.verify = SLUICE_VERIFY_REQUIRE;
    opts.manifest_path = manifest_of(c, o);
    sluice_metrics_server *ms;
    double t0;
    sluice_model *m = open_timed(bm, &opts, o, r, &ms, &t0);
    if (!m)
        return;
    int rc;
    r->open_ms = (bench_now() - t0) * 1e3;
    struct sluice_verify_report rep = {.size = sizeof rep};
    rc = sluice_verify(m, NULL, 0, NULL, &rep);
    if (rc != SLUICE_OK)
        fail(r, "verify: %s", sluice_errmsg(m)[0] ? sluice_errmsg(m) : sluice_strerror(rc));
    r->bytes_read = r->bytes_hashed = rep.bytes_hashed;
    r->bytes_needed = rep.bytes_hashed;
    if (r->ok && rep.bytes_hashed != bm->tensor_bytes)
        fail(r, "verified %llu bytes of %llu", (unsigned long long)rep.bytes_hashed,
             (unsigned long long)bm->tensor_bytes);
    close_timed(m, ms, t0, r);
}

/* ---------------------------------------------------------------- whole processes */

int bench_write_blake3_manifest(const char *path, const char *out)
{
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "sluice bench: cannot fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* no chunk digests: the same one digest per tensor as a SHA-256
         * sidecar, so that the rows differ by the algorithm alone */
        const char *argv[] = {"sluice", "manifest", path, "--algorithm", "blake3", "--chunk", "0",
                              "-q", "-o", out, NULL};
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "sluice bench: `sluice manifest %s --algorithm blake3` failed (status "
                        "%d): no BLAKE3 runs\n", path, status);
        return -1;
    }
    return 0;
}

/* Baseline (f): tools/perf/py_verify.py, embedded at build time. */
static const unsigned char py_verify_script[] = {
#include "py_verify.inc"
};

int bench_whole_process(bench_mode mode)
{
    return mode == BM_PY_VERIFY || mode == BM_PROC_VERIFY || mode == BM_PROC_STREAM;
}

/* A fresh process, timed from fork to its exit (exit's unmapping of what
 * it touched included), with its own CPU time and peak RSS from wait4.
 * BM_PROC_STREAM forks and streams in the new process (no exec: a few
 * milliseconds of dynamic linking are not measured); the others exec
 * `sluice verify` (this very executable) or /usr/bin/python3. Their output
 * goes to /dev/null; a non-zero exit fails the run. */
static void run_whole_process(const bench_model *bm, const bench_config *c,
                              const bench_opts *o, bench_result *r)
{
    const char *argv[14], *exe = NULL;
    char port[16];
    size_t argc = 0;
    if (c->mode == BM_PROC_VERIFY) {
        exe = "/proc/self/exe"; /* this very file, even if rebuilt since */
        argv[argc++] = "sluice";
        argv[argc++] = "verify";
        argv[argc++] = bm->path;
        argv[argc++] = "-q";
        if (manifest_of(c, o)) {
            argv[argc++] = "--manifest";
            argv[argc++] = manifest_of(c, o);
        }
        if (c->direct)
            argv[argc++] = "--direct";
        if (o->metrics_port >= 0) {
            snprintf(port, sizeof port, "%d", o->metrics_port);
            argv[argc++] = "--metrics-port";
            argv[argc++] = port;
        }
    } else if (c->mode == BM_PY_VERIFY) {
        if (!o->manifest_found) {
            fail(r, "(f) needs a manifest");
            return;
        }
        argv[argc++] = exe = "/usr/bin/python3";
        argv[argc++] = "-c";
        argv[argc++] = (const char *)py_verify_script;
        argv[argc++] = bm->path;
        argv[argc++] = o->manifest_found;
    }
    argv[argc] = NULL;
    fflush(NULL);
    double t0 = bench_now();
    pid_t pid = fork();
    if (pid < 0) {
        fail(r, "fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        if (c->mode == BM_PROC_STREAM) {
            bench_config sc = *c;
            sc.mode = BM_STREAM;
            bench_result gr;
            reset(&gr);
            double *lat = malloc((bm->ntensors ? bm->ntensors : 1) * sizeof *lat);
            if (lat)
                run_sluice(bm, &sc, o, &gr, lat);
            _exit(lat && gr.ok ? 0 : 1);
        }
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            fail(r, "wait4: %s", strerror(errno));
            return;
        }
    }
    r->wall_s = bench_now() - t0;
    r->cpu_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec / 1e6;
    r->peak_rss_mb = ru.ru_maxrss / 1024.0;
    r->bytes_needed = r->bytes_read = bm->tensor_bytes;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail(r, "%s %s", c->mode == BM_PROC_STREAM ? "the stream process" : argv[0],
             WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "could not be run"
             : WIFEXITED(status) ? "exited with a failure" : "died of a signal");
}

static void run_mode(const bench_model *m, const bench_config *c, const bench_opts *o,
                     bench_result *r, double *lat)
{
    switch (c->mode) {
    case BM_SEQ: run_seq(m, r, lat); break;
    case BM_CURL: run_curl(m, r); break;
    case BM_PREAD_SHA: run_pread_sha(m, r, lat); break;
    case BM_SHA_MEM: run_sha_mem(m, r); break;
    case BM_PREAD_SHA_PAR: run_pread_sha_par(m, r); break;
    case BM_FIO: run_fio(m, c, r); break;
    case BM_STREAM:
    case BM_RANDOM: run_sluice(m, c, o, r, lat); break;
    case BM_VERIFY: run_verify(m, c, o, r); break;
    case BM_PY_VERIFY:
    case BM_PROC_VERIFY:
    case BM_PROC_STREAM: run_whole_process(m, c, o, r); break;
    }
}

static void child(const bench_model *m, const bench_config *c, const bench_opts *o, int fd)
{
    bench_result r;
    reset(&r);
    double *lat = malloc((m->ntensors ? m->ntensors : 1) * sizeof *lat);
    if (!lat) {
        fail(&r, "out of memory");
    } else {
        /* Warm runs pass once untimed in this very process first, sluice
         * and baselines alike: a process's first touch of its memory costs
         * a page fault per page (microseconds on a VM), which would
         * otherwise be measured as much as the load itself, and differ
         * from run to run with what the kernel hands out. */
        if (!o->cold && c->mode != BM_FIO && !bench_whole_process(c->mode)) {
            run_mode(m, c, o, &r, lat);
            reset(&r);
        }
        double cpu0 = cpu_seconds();
        run_mode(m, c, o, &r, lat);
        if (!bench_whole_process(c->mode)) /* else the process's own, from wait4 */
            r.cpu_s = cpu_seconds() - cpu0;
    }
    if (!bench_whole_process(c->mode)) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        r.peak_rss_mb = ru.ru_maxrss / 1024.0;
    }
    r.gbps = r.wall_s > 0 ? r.bytes_needed / r.wall_s / 1e9 : 0;
    free(lat);
    const char *p = (const char *)&r;
    size_t left = sizeof r;
    while (left) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        p += n;
        left -= (size_t)n;
    }
}

int bench_run(const bench_model *m, const bench_config *c, const bench_opts *o, bench_result *r)
{
    int fds[2];
    memset(r, 0, sizeof *r);
    if (pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        child(m, c, o, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof *r) {
        ssize_t n = read(fds[0], (char *)r + got, sizeof *r - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (got != sizeof *r) {
        memset(r, 0, sizeof *r);
        r->backend = -1;
        if (WIFSIGNALED(status))
            snprintf(r->err, sizeof r->err, "the run died of signal %d (%s)", WTERMSIG(status),
                     strsignal(WTERMSIG(status)));
        else
            snprintf(r->err, sizeof r->err, "the run exited with status %d and no result",
                     WEXITSTATUS(status));
    }
    return 0;
}

/* ---------------------------------------------------------------- page cache */

double bench_drop_cache(const bench_model *m)
{
    uint64_t pages = 0, resident = 0;
    long psz = sysconf(_SC_PAGESIZE);
    int known = 1;
    for (size_t f = 0; f < m->nfiles; f++) {
        int fd = open(m->files[f], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            known = 0;
            continue;
        }
        fdatasync(fd); /* pages still dirty (a model just written) would stay */
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        size_t len = (size_t)m->file_sizes[f];
        void *p = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        size_t np = (len + (size_t)psz - 1) / (size_t)psz;
        unsigned char *vec = np ? malloc(np) : NULL;
        if (p != MAP_FAILED && vec && mincore(p, len, vec) == 0) {
            for (size_t i = 0; i < np; i++)
                resident += vec[i] & 1;
            pages += np;
        } else if (len) {
            known = 0;
        }
        free(vec);
        if (p != MAP_FAILED)
            munmap(p, len);
        close(fd);
    }
    if (!known)
        return -1;
    return pages ? (double)resident / (double)pages : 0;
}
