/* shard.c: `sluice shard PATH --rank R --world N`: one tensor-parallel
 * rank's shard of a model, verified (sluice_read_part_into for what the
 * rules split, sluice_read_into for what they replicate), with what it
 * read and how long it took; and `sluice bench PATH --world N`, which
 * puts that against loading every tensor whole and slicing it, and runs
 * the N ranks as N processes at once to show what they read together. */
#include "cmd.h"
#include "integrity.h"
#include "shard.h"

#include "sluice.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int shard_rules_load(const char *cmd, const char *arg, sluice_part_rules **out)
{
    char why[256];
    if (!arg || !strcmp(arg, "builtin")) {
        if (sluice_part_rules_parse(NULL, 0, out, why, sizeof why) != SLUICE_OK) {
            fprintf(stderr, "sluice %s: built-in rules: %s\n", cmd, why);
            return -CMD_EXIT_USAGE;
        }
        return 0;
    }
    FILE *f = fopen(arg, "rb");
    if (!f) {
        fprintf(stderr, "sluice %s: %s: %s\n", cmd, arg, strerror(errno));
        return -CMD_EXIT_OPEN;
    }
    char *text = malloc(1 << 20);
    size_t len = text ? fread(text, 1, 1 << 20, f) : 0;
    int toolong = text && len == 1 << 20;
    int bad = !text || ferror(f);
    fclose(f);
    if (bad || toolong) {
        fprintf(stderr, "sluice %s: %s: %s\n", cmd, arg, toolong ? "larger than 1 MiB"
                                                                  : "cannot read it");
        free(text);
        return toolong ? -CMD_EXIT_USAGE : -CMD_EXIT_OPEN;
    }
    int rc = sluice_part_rules_parse(text, len, out, why, sizeof why);
    free(text);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice %s: %s: %s\n", cmd, arg, why);
        return -CMD_EXIT_USAGE;
    }
    return 0;
}

/* One rank's load: the figures it reports. */
typedef struct shard_res {
    size_t split, replicated;
    uint64_t kept;            /* bytes the rank holds */
    uint64_t model_bytes;     /* every tensor's */
    struct sluice_stats st;   /* after the load */
    double wall_s;
} shard_res;

typedef struct shard_job {
    sluice_model *m;
    const sluice_part_rules *rules;
    uint64_t rank, world;
    int whole;                /* the baseline: every tensor streamed whole, sliced */
    atomic_size_t next;
    atomic_int failed;
    pthread_mutex_t lock;
    char err[1024];
    int status;               /* the first failure's exit status (cmd.h) */
    uint64_t kept;
    size_t split, replicated;
    void **bufs;              /* per tensor: what the rank keeps */
} shard_job;

static void job_fail(shard_job *j, const char *what, const struct sluice_tensor_info *ti,
                     int status)
{
    pthread_mutex_lock(&j->lock);
    if (!atomic_exchange(&j->failed, 1)) {
        snprintf(j->err, sizeof j->err, "tensor %s: %s", ti->name, what);
        j->status = status;
    }
    pthread_mutex_unlock(&j->lock);
}

/* The part of a whole tensor at t (rank of world along dim) into dst. */
static void slice_of(const struct sluice_tensor_info *ti, const unsigned char *t, uint32_t dim,
                     uint64_t rank, uint64_t world, unsigned char *dst)
{
    uint64_t outer = 1;
    for (uint32_t k = 0; k < dim; k++)
        outer *= ti->shape[k];
    if (!outer || !ti->nbytes)
        return;
    uint64_t stride = ti->nbytes / outer, seg = stride / world;
    for (uint64_t o = 0; o < outer; o++)
        memcpy(dst + o * seg, t + o * stride + rank * seg, (size_t)seg);
}

/* What the rules make of tensor ti: its dim (SLUICE_PART_REPLICATED:
 * whole) and the bytes the rank keeps. Returns 0, or -1 with the job
 * failed. */
static int job_plan(shard_job *j, const struct sluice_tensor_info *ti, int *dim, uint64_t *len)
{
    char why[160];
    *dim = SLUICE_PART_REPLICATED;
    if (sluice_part_rules_dim(j->rules, ti->name, ti->ndim, dim) != SLUICE_OK) {
        snprintf(why, sizeof why, "the rules split it along dim %d; it has %u", *dim, ti->ndim);
        job_fail(j, why, ti, CMD_EXIT_USAGE);
        return -1;
    }
    if (*dim != SLUICE_PART_REPLICATED && ti->shape[*dim] % j->world) {
        snprintf(why, sizeof why, "dim %d of size %llu does not split into %llu equal parts",
                 *dim, (unsigned long long)ti->shape[*dim], (unsigned long long)j->world);
        job_fail(j, why, ti, CMD_EXIT_USAGE);
        return -1;
    }
    *len = *dim != SLUICE_PART_REPLICATED ? ti->nbytes / j->world : ti->nbytes;
    return 0;
}

static void job_kept(shard_job *j, size_t i, void *buf, uint64_t len, int split)
{
    j->bufs[i] = buf;
    pthread_mutex_lock(&j->lock);
    j->kept += len;
    j->split += split;
    j->replicated += !split;
    pthread_mutex_unlock(&j->lock);
}

/* Tensor i of the job: its part, or its whole. */
static void job_one(shard_job *j, size_t i)
{
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_info(j->m, i, &ti);
    int dim;
    uint64_t len;
    void *buf = NULL;
    if (job_plan(j, &ti, &dim, &len) < 0)
        return;
    if (posix_memalign(&buf, 64, len ? (size_t)len : 1) != 0) {
        job_fail(j, "out of memory", &ti, CMD_EXIT_OPEN);
        return;
    }
    int split = dim != SLUICE_PART_REPLICATED;
    int rc = split ? sluice_read_part_into(j->m, ti.name, (uint32_t)dim, j->rank, j->world, buf,
                                           len)
                   : sluice_read_into(j->m, ti.name, 0, buf, len);
    if (rc != SLUICE_OK) {
        free(buf);
        job_fail(j, sluice_errmsg(j->m), &ti, cmd_exit_status(rc));
        return;
    }
    job_kept(j, i, buf, len, split);
}

/* The baseline's callback: the whole tensor t, of which the rank keeps
 * its slice (a copy) and gives the whole back. */
static int whole_cb(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *ti,
                    const char *message)
{
    shard_job *j = user;
    if (status != SLUICE_OK) {
        job_fail(j, message, ti, cmd_exit_status(status));
        return 1;
    }
    int dim;
    uint64_t len;
    void *buf = NULL;
    if (job_plan(j, ti, &dim, &len) < 0 || posix_memalign(&buf, 64, len ? (size_t)len : 1) != 0) {
        sluice_release(t);
        job_fail(j, "out of memory", ti, CMD_EXIT_OPEN);
        return 1;
    }
    int split = dim != SLUICE_PART_REPLICATED;
    if (split)
        slice_of(ti, sluice_tensor_data(t), (uint32_t)dim, j->rank, j->world, buf);
    else if (len)
        memcpy(buf, sluice_tensor_data(t), (size_t)len);
    sluice_release(t);
    job_kept(j, ti->index, buf, len, split);
    return 0;
}

static void *job_worker(void *arg)
{
    shard_job *j = arg;
    size_t n = sluice_count(j->m), i;
    while (!atomic_load(&j->failed) && (i = atomic_fetch_add(&j->next, 1)) < n)
        job_one(j, i);
    return NULL;
}

/* Loads rank of world's shard of the open model m on threads threads
 * (whole: the baseline, every tensor streamed whole and sliced). Returns
 * 0, or the exit status of the first failure (cmd.h) after a message on
 * stderr naming cmd. */
static int shard_run(const char *cmd, sluice_model *m, const sluice_part_rules *rules,
                     uint64_t rank, uint64_t world, unsigned threads, int whole, shard_res *res)
{
    size_t n = sluice_count(m);
    shard_job j = {.m = m, .rules = rules, .rank = rank, .world = world, .whole = whole};
    pthread_mutex_init(&j.lock, NULL);
    j.bufs = calloc(n ? n : 1, sizeof *j.bufs);
    pthread_t *tid = calloc(threads, sizeof *tid);
    if (!j.bufs || !tid) {
        fprintf(stderr, "sluice %s: out of memory\n", cmd);
        free(j.bufs);
        free(tid);
        return CMD_EXIT_OPEN;
    }
    double t0 = ig_now();
    unsigned started = 0;
    int src = whole ? sluice_stream(m, NULL, 0, whole_cb, &j) : SLUICE_OK;
    if (src != SLUICE_OK && !atomic_load(&j.failed))
        job_fail(&j, sluice_errmsg(m), &(struct sluice_tensor_info){.name = "(stream)"},
                 cmd_exit_status(src));
    while (!whole && started < threads &&
           pthread_create(&tid[started], NULL, job_worker, &j) == 0)
        started++;
    if (!whole && !started)
        job_worker(&j);
    for (unsigned k = 0; k < started; k++)
        pthread_join(tid[k], NULL);
    res->wall_s = ig_now() - t0;
    res->split = j.split;
    res->replicated = j.replicated;
    res->kept = j.kept;
    res->model_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &ti);
        res->model_bytes += ti.nbytes;
        free(j.bufs[i]);
    }
    res->st = (struct sluice_stats){.size = sizeof res->st};
    sluice_stats(m, &res->st);
    free(j.bufs);
    free(tid);
    pthread_mutex_destroy(&j.lock);
    if (atomic_load(&j.failed)) {
        fprintf(stderr, "sluice %s: rank %llu of %llu: %s\n", cmd, (unsigned long long)rank,
                (unsigned long long)world, j.err);
        return j.status ? j.status : CMD_EXIT_OPEN;
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

/* The options both commands take. */
typedef struct shard_opts {
    const char *path, *rules;
    uint64_t rank, world, threads;
    int rank_set, world_set, json;
    sluice_options o;
    ig_trust trust; /* o's trusted keys and CAs point into it */
} shard_opts;

/* argv[*i] as one of the shared options: 1 taken, 0 not one, -1 bad. */
static int shard_option(const char *cmd, int argc, char **argv, int *i, shard_opts *so)
{
    const char *a = argv[*i];
    uint64_t *into = !strcmp(a, "--rank")      ? &so->rank
                     : !strcmp(a, "--world")   ? &so->world
                     : !strcmp(a, "--jobs")    ? &so->threads
                                               : NULL;
    if (into) {
        if (*i + 1 >= argc || parse_u64(argv[*i + 1], into) < 0) {
            fprintf(stderr, "sluice %s: %s needs a number\n", cmd, a);
            return -1;
        }
        so->rank_set |= into == &so->rank;
        so->world_set |= into == &so->world;
        ++*i;
        return 1;
    }
    int r = ig_file_option(cmd, argc, argv, i, "--rules", NULL, &so->rules);
    if (r)
        return r;
    if ((r = ig_file_option(cmd, argc, argv, i, "--manifest", NULL, &so->o.manifest_path)) != 0)
        return r;
    if ((r = ig_trust_option(cmd, argc, argv, i, &so->trust, &so->o)) != 0)
        return r;
    if (!strcmp(a, "--json")) {
        so->json = 1;
        return 1;
    }
    return ig_loader_option(cmd, argc, argv, i, &so->o);
}

static int shard_check(const char *cmd, const shard_opts *so, void (*usage)(FILE *))
{
    if (!so->path || !so->world_set) {
        usage(stderr);
        return -1;
    }
    if (so->world == 0 || so->rank >= so->world || so->threads == 0 || so->threads > 256) {
        fprintf(stderr, "sluice %s: %s\n", cmd, so->world == 0 ? "--world must be at least 1"
                                                : so->rank >= so->world ? "--rank must be below --world"
                                                                        : "--jobs must be 1..256");
        return -1;
    }
    return 0;
}

static void shard_usage(FILE *out)
{
    fprintf(out,
            "usage: sluice shard PATH --rank R --world N [--rules FILE] [--jobs J] [--json]\n"
            "                    [--manifest FILE] [trust options] [loader options]\n"
            "\n"
            "Loads rank R of N's tensor-parallel shard of the model at PATH, verified, and\n"
            "says what it read and how long it took. The rules say which tensors are split\n"
            "along which dim (docs/parallel.md); each split tensor's part is read with\n"
            "sluice_read_part_into (only its bytes when the manifest has part digests:\n"
            "`sluice manifest --parts`), each replicated one whole with sluice_read_into.\n"
            "\n"
            "  --rank R        this rank, 0..N-1 (default 0)\n"
            "  --world N       the number of ranks (tensor-parallel size)\n"
            "  --rules FILE    lines `PATTERN DIM` or `PATTERN replicated` (fnmatch globs,\n"
            "                  first match wins; default: the built-in Llama/Qwen/Mistral set,\n"
            "                  also `--rules builtin`)\n"
            "  --jobs J        tensors read at once, a thread each (default 4)\n"
            "  --manifest FILE the manifest to verify against (default: the sidecar)\n"
            "  --json          one JSON object on stdout instead of the line\n"
            "%s%s"
            "\n"
            CMD_EXIT_HELP
            "shard: 1 or 3 when a tensor failed to verify or to read; 2 also when a\n"
            "tensor does not split into N.\n", IG_TRUST_HELP, IG_LOADER_HELP);
}

static void print_res(const char *what, const shard_opts *so, const shard_res *r,
                      const char *note)
{
    if (so->json) {
        printf("{\"rank\": %llu, \"world\": %llu, \"split\": %zu, \"replicated\": %zu, "
               "\"kept_bytes\": %llu, \"bytes_read\": %llu, \"bytes_hashed\": %llu, "
               "\"part_fallback_bytes\": %llu, \"model_bytes\": %llu, \"wall_s\": %.6f}\n",
               (unsigned long long)so->rank, (unsigned long long)so->world, r->split,
               r->replicated, (unsigned long long)r->kept, (unsigned long long)r->st.bytes_read,
               (unsigned long long)r->st.bytes_hashed,
               (unsigned long long)r->st.part_fallback_bytes,
               (unsigned long long)r->model_bytes, r->wall_s);
        return;
    }
    printf("%s rank %llu of %llu: %zu tensors split, %zu whole; kept %.1f MB, read %.1f MB "
           "(%.3f of the model's %.1f MB), part fallback %.1f MB, %.3f s\n", what,
           (unsigned long long)so->rank, (unsigned long long)so->world, r->split, r->replicated,
           r->kept / 1e6, r->st.bytes_read / 1e6,
           r->model_bytes ? (double)r->st.bytes_read / (double)r->model_bytes : 0.0,
           r->model_bytes / 1e6, r->st.part_fallback_bytes / 1e6, r->wall_s);
    if (note)
        fprintf(stderr, "sluice shard: note: %s\n", note);
}

int cmd_shard(int argc, char **argv)
{
    shard_opts so = {.threads = 4};
    sluice_options_init(&so.o);
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            shard_usage(stdout);
            return 0;
        } else if ((r = shard_option("shard", argc, argv, &i, &so)) != 0) {
            if (r < 0)
                return 2;
        } else if (ig_path_operand("shard", argv[i], &so.path, shard_usage) < 0) {
            return 2;
        }
    }
    if (shard_check("shard", &so, shard_usage) < 0)
        return 2;
    sluice_part_rules *rules = NULL;
    int lr = shard_rules_load("shard", so.rules, &rules);
    if (lr < 0)
        return -lr;
    sluice_model *m = NULL;
    int rc = sluice_open(so.path, &so.o, &m);
    if (rc != SLUICE_OK) {
        sluice_part_rules_free(rules);
        return ig_open_failed("shard", m, rc);
    }
    ig_warn_unverified("shard", m);
    shard_res res;
    int status = shard_run("shard", m, rules, so.rank, so.world, (unsigned)so.threads, 0, &res);
    if (status == 0)
        print_res("shard", &so, &res, sluice_part_note(m));
    sluice_close(m);
    sluice_part_rules_free(rules);
    return status;
}

/* ------------------------------------------------------------ the bench */

static void bench_world_usage(FILE *out)
{
    fprintf(out,
            "usage: sluice bench PATH --world N [--rank R] [--rules FILE] [--jobs J]\n"
            "                    [--manifest FILE] [--runs K] [--cold] [trust options]\n"
            "                    [loader options]\n"
            "\n"
            "Tensor-parallel loading, three ways, each verified, the median of K runs\n"
            "(default 3), each in a fresh process:\n"
            "  whole+slice  rank R loads every tensor whole (sluice_stream) and keeps its\n"
            "               slice: what a loader without parts does\n"
            "  shard        rank R loads its shard (as `sluice shard`)\n"
            "  N ranks      N processes, one per rank, load their shards at once; the\n"
            "               bytes they read together, against the model's\n"
            "  --cold       drop the model files' page cache (POSIX_FADV_DONTNEED) before\n"
            "               every run\n"
            "%s%s"
            "\n"
            CMD_EXIT_HELP
            "bench --world: a run that failed exits as its rank did (as 'sluice shard').\n",
            IG_TRUST_HELP, IG_LOADER_HELP);
}

/* Drops the page cache of the model's files. */
static void drop_cache(const char *path)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    o.pool_bytes = 4096;
    sluice_model *m = NULL;
    if (sluice_open(path, &o, &m) == SLUICE_OK)
        for (size_t i = 0; i < sluice_file_count(m); i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            sluice_file_info(m, i, &fi);
            int fd = open(fi.path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                fdatasync(fd);
                posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
                close(fd);
            }
        }
    sluice_close(m);
}

/* One run of rank (whole or shard) in a child process, whose figures
 * come back through fd[0]. Returns its pid, or -1. */
static pid_t run_child(const shard_opts *so, const sluice_part_rules *rules, uint64_t rank,
                       int whole, int fd[2])
{
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid != 0) {
        close(fd[1]);
        return pid;
    }
    close(fd[0]);
    sluice_model *m = NULL;
    shard_res r = {0};
    int st = sluice_open(so->path, &so->o, &m);
    if (st == SLUICE_OK)
        st = shard_run("bench", m, rules, rank, so->world, (unsigned)so->threads, whole, &r);
    else
        st = ig_open_failed("bench", m, st), m = NULL;
    sluice_close(m);
    r.wall_s = st ? -1 : r.wall_s;
    ssize_t w = write(fd[1], &r, sizeof r);
    _exit(st ? st : w == (ssize_t)sizeof r ? 0 : CMD_EXIT_OPEN);
}

/* The child's exit status (cmd.h): 0 with *r its figures. */
static int collect(pid_t pid, int fd, shard_res *r)
{
    ssize_t got = read(fd, r, sizeof *r);
    close(fd);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st))
        return CMD_EXIT_OPEN;
    return WEXITSTATUS(st) ? WEXITSTATUS(st) : got == (ssize_t)sizeof *r ? 0 : CMD_EXIT_OPEN;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cmd_bench_world(int argc, char **argv)
{
    shard_opts so = {.threads = 4};
    sluice_options_init(&so.o);
    uint64_t runs = 3;
    int cold = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_world_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--cold")) {
            cold = 1;
        } else if (!strcmp(argv[i], "--runs")) {
            if (i + 1 >= argc || parse_u64(argv[++i], &runs) < 0 || runs == 0 || runs > 100) {
                fprintf(stderr, "sluice bench: --runs needs 1..100\n");
                return 2;
            }
        } else if ((r = shard_option("bench", argc, argv, &i, &so)) != 0) {
            if (r < 0)
                return 2;
        } else if (ig_path_operand("bench", argv[i], &so.path, bench_world_usage) < 0) {
            return 2;
        }
    }
    if (shard_check("bench", &so, bench_world_usage) < 0)
        return 2;
    sluice_model *probe = NULL; /* an open error is said once, here, not by each child */
    int prc = sluice_open(so.path, &so.o, &probe);
    if (prc != SLUICE_OK)
        return ig_open_failed("bench", probe, prc);
    sluice_close(probe);
    sluice_part_rules *rules = NULL;
    int lr = shard_rules_load("bench", so.rules, &rules);
    if (lr < 0)
        return -lr;
    double *t[3];
    shard_res last[3] = {0};
    uint64_t all_read = 0;
    int status = 0;
    for (int k = 0; k < 3; k++)
        t[k] = calloc(runs, sizeof *t[k]);
    pid_t *pids = calloc(so.world, sizeof *pids);
    int (*fds)[2] = calloc(so.world, sizeof *fds);
    if (!t[0] || !t[1] || !t[2] || !pids || !fds) {
        fprintf(stderr, "sluice bench: out of memory\n");
        status = CMD_EXIT_OPEN;
        goto done;
    }
    for (uint64_t run = 0; run < runs && !status; run++) {
        for (int k = 0; k < 2 && !status; k++) { /* whole+slice, shard */
            if (cold)
                drop_cache(so.path);
            int fd[2];
            pid_t pid = run_child(&so, rules, so.rank, k == 0, fd);
            status = pid < 0 ? CMD_EXIT_OPEN : collect(pid, fd[0], &last[k]);
            t[k][run] = last[k].wall_s;
        }
        if (status)
            break;
        if (cold)
            drop_cache(so.path);
        double t0 = ig_now();
        for (uint64_t r = 0; r < so.world; r++)
            pids[r] = run_child(&so, rules, r, 0, fds[r]);
        all_read = 0;
        for (uint64_t r = 0; r < so.world; r++) {
            shard_res rr = {0};
            int st = pids[r] < 0 ? CMD_EXIT_OPEN : collect(pids[r], fds[r][0], &rr);
            if (st)
                status = cmd_exit_worse(status, st);
            else
                all_read += rr.st.bytes_read;
            if (r == 0)
                last[2] = rr;
        }
        t[2][run] = ig_now() - t0;
    }
    if (status) {
        fprintf(stderr, "sluice bench: a run failed\n");
        goto done;
    }
    double med[3];
    for (int k = 0; k < 3; k++) {
        qsort(t[k], runs, sizeof *t[k], cmp_double);
        med[k] = runs % 2 ? t[k][runs / 2] : (t[k][runs / 2 - 1] + t[k][runs / 2]) / 2;
    }
    double model = (double)last[1].model_bytes;
    printf("model %s: %.1f MB of tensors; world %llu, rank %llu, rules %s, %s, median of %llu "
           "runs, %llu jobs a rank\n", so.path, model / 1e6, (unsigned long long)so.world,
           (unsigned long long)so.rank, so.rules ? so.rules : "builtin", cold ? "cold" : "warm",
           (unsigned long long)runs, (unsigned long long)so.threads);
    printf("%-22s %9s %11s %9s\n", "", "wall s", "read MB", "of model");
    printf("%-22s %9.3f %11.1f %9.3f\n", "whole+slice rank", med[0], last[0].st.bytes_read / 1e6,
           last[0].st.bytes_read / model);
    printf("%-22s %9.3f %11.1f %9.3f\n", "shard rank", med[1], last[1].st.bytes_read / 1e6,
           last[1].st.bytes_read / model);
    char label[64];
    snprintf(label, sizeof label, "%llu ranks at once", (unsigned long long)so.world);
    printf("%-22s %9.3f %11.1f %9.3f\n", label, med[2], all_read / 1e6, all_read / model);
    printf("shard vs whole+slice: %.2fx faster; part fallback %.1f MB a rank\n",
           med[1] > 0 ? med[0] / med[1] : NAN, last[1].st.part_fallback_bytes / 1e6);
done:
    for (int k = 0; k < 3; k++)
        free(t[k]);
    free(pids);
    free(fds);
    sluice_part_rules_free(rules);
    return status;
}
