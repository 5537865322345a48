/* bench.c: `sluice bench`: how fast sluice loads a model, next to what
 * the machine can do, measured in the same session.
 *
 * Every configuration of the sweep (pool x qd x chunk x direct x verify x
 * backend) is run in stream mode, and in random-acquire mode with
 * --random. Baselines run beside them: (a) sequential pread of the
 * files, the I/O ceiling; (b) pread + SHA-256 per tensor on one thread,
 * what a plain loader does; (c) SHA-256 of memory on one thread, the
 * hashing ceiling of a core; (e) pread + SHA-256 on a thread per CPU, the
 * ceiling of a verified load that must copy out of the page cache; and
 * with --cold (d) fio, when installed. Runs are interleaved, one round at a time
 * (every baseline, then every configuration), so that drift in the
 * machine hits all of them alike. Each run is a fresh process (see
 * bench_run.c); each figure is the median of the rounds, with min and max.
 */
#include "bench.h"
#include "metrics_cli.h"
#include "cmd.h"

#include "sluice.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_VALUES 16

typedef struct sweep {
    const char *name;        /* "pool" */
    uint64_t v[MAX_VALUES];
    size_t n;
    int is_size;             /* how values are written and parsed */
    const char *word[2];     /* a two-valued sweep's spelling of 0 and 1 */
} sweep;

enum { SW_POOL, SW_QD, SW_CHUNK, SW_DIRECT, SW_VERIFY, SW_ALGORITHM, SW_BACKEND, SW_COUNT };

static void usage(FILE *f)
{
    fprintf(f,
        "usage: sluice bench PATH [options]\n"
        "\n"
        "Loads the model at PATH with sluice in every configuration of the sweep and\n"
        "prints time, throughput, latencies, CPU and memory beside baselines\n"
        "measured in the same run: (a) sequential pread of the files (I/O ceiling),\n"
        "(b) pread + SHA-256 per tensor on one thread, (c) SHA-256 of memory on one\n"
        "thread (hashing ceiling per core), (e) pread + SHA-256 on a thread per\n"
        "online CPU, largest tensor first, each into one reused 8 MiB buffer (the\n"
        "ceiling of a verified load: the kernel's copy plus SHA-256, nothing else),\n"
        "with --cold (d) fio when installed, at the block size and depth of the\n"
        "configuration (and of sluice_verify --direct), and (f) a Python verifier\n"
        "(/usr/bin/python3: mmap + hashlib.sha256 on a thread per CPU, largest\n"
        "tensor first; whole process). With a manifest, the verify-only path runs\n"
        "too: sluice_verify in-process and `sluice verify` as a whole process.\n"
        "Figures are medians of --runs runs; the spread table gives p10/p50/p90.\n"
        "PATH may be a URL (http(s)://, s3://): then baseline (a) is curl fetching\n"
        "every file in 8 ranges at once (the library's remote connections; http(s)\n"
        "only), (c) runs as usual, nothing else reads the files, and neither --cold\n"
        "nor the whole-process rows apply.\n"
        "\n"
        "sweeps (comma lists; the cross product is run):\n"
        "  --pool SIZES        buffer pool budget (default: the library's, 4G, or 1/4\n"
        "                      of a cgroup memory limit when less)\n"
        "  --qd N,...          reads in flight (default 32)\n"
        "  --chunk SIZES       size of one read (default 8M)\n"
        "  --direct off,on     O_DIRECT reads (default off)\n"
        "  --verify off,on     on: the manifest with policy REQUIRE (default: off,on\n"
        "                      when the model has a manifest, else off)\n"
        "  --algorithm sha256,blake3  the digest of verified runs (default sha256);\n"
        "                      blake3 runs read a version 2 BLAKE3 manifest the bench\n"
        "                      writes first (`sluice manifest --algorithm blake3\n"
        "                      --chunk 0`: one digest per tensor, as a SHA-256 sidecar\n"
        "                      without chunks)\n"
        "  --backend auto,pread  auto: io_uring where the kernel allows (default auto)\n"
        "other options:\n"
        "  --world N           tensor-parallel: one rank's shard against loading whole\n"
        "                      and slicing, and N ranks at once (`sluice bench --world\n"
        "                      N --help`)\n"
        "  --random            also acquire every tensor in random order\n"
        "  --runs N            runs of each configuration (default 3)\n"
        "  --cold              drop the files' page cache before every run\n"
        "                      (default: warm, after one untimed pass)\n"
        "  --baselines all|none  (default all)\n"
        "  --whole-process on|off  also time each stream configuration, and `sluice\n"
        "                      verify`, as whole fresh processes, fork to exit, with no\n"
        "                      untimed pass (default on)\n"
        "  --manifest FILE     the manifest for --verify on (default: the sidecar)\n"
        "  --metrics-port N    each sluice run serves its model's metrics on\n"
        "                      http://127.0.0.1:N/metrics while it runs (0: any free port)\n"
        "  --seed S            order of --random (default 1)\n"
        "  --csv FILE          every run, one line each\n"
        "  --plot FILE.png     throughput per configuration (needs gnuplot)\n"
        "\n"
        "SIZES are byte counts with an optional K, M, G suffix (powers of 1024).\n"
        "\n"
        "figures (each run is a fresh process):\n"
        "  wall s     sluice: open + load every tensor + close; baselines: the whole pass\n"
        "  GB/s       tensor bytes / wall (c: bytes hashed / wall)\n"
        "  first ms, p50 ms, p99 ms  stream and (a), (b): from the start of the load to\n"
        "             each tensor's delivery; random: how long each acquire blocked\n"
        "  cpu s      user + system time of the run, every thread\n"
        "  rss MB     peak resident memory of the run's process\n"
        "  read/need  bytes read over tensor bytes (coalescing and read-ahead waste)\n"
        "  ratio      GB/s over the ceiling: verify off: (a); verify on: min((a), CPUs x (c));\n"
        "             verify-only rows and (f): CPUs x (c) (cold O_DIRECT: or fio at its blocks)\n"
        "  vs (e)     verified runs: GB/s over (e)\n"
        "\n"
        CMD_EXIT_HELP
        "bench: 1 a run failed; 2 also for options the library refuses.\n");
}

const char *bench_size(uint64_t v, char buf[32])
{
    static const char units[] = "KMGT";
    int u = -1;
    while (v && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, 32, "%llu", (unsigned long long)v);
    else
        snprintf(buf, 32, "%llu%c", (unsigned long long)v, units[u]);
    return buf;
}

static int parse_value(const sweep *s, const char *tok, uint64_t *out)
{
    if (s->word[0]) {
        if (!strcmp(tok, s->word[1]))
            *out = 1;
        else if (!strcmp(tok, s->word[0]))
            *out = 0;
        else
            return -1;
        return 0;
    }
    char *end;
    errno = 0;
    if (!*tok || *tok == '-')
        return -1;
    unsigned long long v = strtoull(tok, &end, 10);
    if (errno || end == tok)
        return -1;
    int shift = 0;
    if (s->is_size && *end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        case 't': case 'T': shift = 40; break;
        default: return -1;
        }
        end++;
        if (!strcmp(end, "iB") || !strcmp(end, "B"))
            end += strlen(end);
    }
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int parse_sweep(sweep *s, const char *list)
{
    char *copy = strdup(list), *save = NULL;
    if (!copy)
        return -1;
    s->n = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (s->n == MAX_VALUES || parse_value(s, tok, &s->v[s->n]) < 0) {
            fprintf(stderr, "sluice bench: --%s: '%s' is not a valid value%s\n", s->name, tok,
                    s->n == MAX_VALUES ? " (too many values)" : "");
            free(copy);
            return -1;
        }
        s->n++;
    }
    free(copy);
    if (!s->n) {
        fprintf(stderr, "sluice bench: --%s: no values\n", s->name);
        return -1;
    }
    return 0;
}

static void sweep_value(const sweep *s, uint64_t v, char buf[32])
{
    if (s->word[0])
        snprintf(buf, 32, "%s", s->word[v ? 1 : 0]);
    else if (s->is_size)
        bench_size(v, buf);
    else
        snprintf(buf, 32, "%llu", (unsigned long long)v);
}

static void free_model(bench_model *bm)
{
    for (size_t f = 0; bm->files && f < bm->nfiles; f++)
        free(bm->files[f]);
    free(bm->files);
    free(bm->file_sizes);
    free(bm->tensors);
}

/* The model's files and tensors, from its index (no weight is read). */
static int load_model(const char *path, bench_model *bm)
{
    sluice_options opts;
    sluice_options_init(&opts);
    opts.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &opts, &m);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice bench: %s\n", m ? sluice_errmsg(m) : sluice_strerror(rc));
        sluice_close(m);
        return cmd_exit_status(rc);
    }
    memset(bm, 0, sizeof *bm);
    bm->path = path;
    bm->nfiles = sluice_file_count(m);
    bm->ntensors = sluice_count(m);
    bm->files = calloc(bm->nfiles ? bm->nfiles : 1, sizeof *bm->files);
    bm->file_sizes = calloc(bm->nfiles ? bm->nfiles : 1, sizeof *bm->file_sizes);
    bm->tensors = calloc(bm->ntensors ? bm->ntensors : 1, sizeof *bm->tensors);
    int ok = bm->files && bm->file_sizes && bm->tensors;
    for (size_t f = 0; ok && f < bm->nfiles; f++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        ok = sluice_file_info(m, f, &fi) == SLUICE_OK && (bm->files[f] = strdup(fi.path));
        if (ok) {
            bm->file_sizes[f] = fi.file_size;
            bm->file_bytes += fi.file_size;
        }
    }
    for (size_t i = 0; ok && i < bm->ntensors; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        ok = sluice_info(m, i, &ti) == SLUICE_OK;
        if (ok) {
            bm->tensors[i] = (bench_tensor){ti.file_index, ti.offset, ti.nbytes};
            bm->tensor_bytes += ti.nbytes;
            if (ti.nbytes > bm->max_tensor)
                bm->max_tensor = ti.nbytes;
        }
    }
    sluice_close(m);
    if (!ok) {
        fprintf(stderr, "sluice bench: out of memory\n");
        free_model(bm);
    }
    return ok ? 0 : CMD_EXIT_OPEN;
}

/* Whether the model opens with policy REQUIRE: a manifest is there and
 * covers it. With say set, tells why not. */
static int manifest_usable(const char *path, const char *manifest, int say, char **found)
{
    sluice_options opts;
    sluice_options_init(&opts);
    opts.verify = SLUICE_VERIFY_REQUIRE;
    opts.manifest_path = manifest;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &opts, &m);
    if (rc != SLUICE_OK && say)
        fprintf(stderr, "sluice bench: --verify on: %s\n",
                m ? sluice_errmsg(m) : sluice_strerror(rc));
    if (rc == SLUICE_OK && sluice_manifest_path(m))
        *found = strdup(sluice_manifest_path(m));
    sluice_close(m);
    return rc == SLUICE_OK;
}

/* Whether sluice_open accepts the options of c (verify aside). */
static int options_accepted(const char *path, const bench_config *c)
{
    sluice_options opts;
    sluice_options_init(&opts);
    opts.pool_bytes = c->pool;
    opts.chunk_bytes = c->chunk;
    opts.queue_depth = c->qd;
    opts.flags = (c->direct ? SLUICE_F_DIRECT : 0) | (c->force_pread ? SLUICE_F_FORCE_PREAD : 0);
    opts.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &opts, &m);
    if (rc != SLUICE_OK)
        fprintf(stderr, "sluice bench: %s: %s\n", c->label,
                m ? sluice_errmsg(m) : sluice_strerror(rc));
    sluice_close(m);
    return rc == SLUICE_OK;
}

/* The field at off of row's successful runs (256 at most), sorted
 * ascending into v; returns how many. */
static size_t sorted_field(const bench_row *row, size_t off, double v[256])
{
    size_t n = 0;
    for (size_t i = 0; i < row->nruns && n < 256; i++) {
        const bench_result *r = &row->runs[i];
        double x = *(const double *)((const char *)r + off);
        if (r->ok && !isnan(x))
            v[n++] = x;
    }
    for (size_t i = 1; i < n; i++) /* insertion sort: n is small */
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n;
}

size_t bench_stat(const bench_row *row, size_t off, double *med, double *min, double *max)
{
    double v[256];
    size_t n = sorted_field(row, off, v);
    *med = *min = *max = NAN;
    if (!n)
        return 0;
    *min = v[0];
    *max = v[n - 1];
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return n;
}

double bench_quantile(const bench_row *row, size_t off, double q)
{
    double v[256];
    size_t n = sorted_field(row, off, v);
    if (!n)
        return NAN;
    size_t k = (size_t)ceil(q * (double)n); /* nearest rank */
    return v[k ? k - 1 : 0];
}

static void progress(int on, const char *what, size_t round, size_t rounds, size_t k, size_t n)
{
    if (!on)
        return;
    if (!round)
        fprintf(stderr, "\r\033[Kbench: %s", what);
    else
        fprintf(stderr, "\r\033[Kbench: run %zu/%zu, %zu/%zu: %s", round, rounds, k, n, what);
}

static int need_value(int i, int argc, const char *opt)
{
    if (i + 1 >= argc) {
        fprintf(stderr, "sluice bench: %s needs a value\n", opt);
        return 0;
    }
    return 1;
}

int cmd_bench(int argc, char **argv)
{
    sluice_options defaults;
    sluice_options_init(&defaults);
    sweep sw[SW_COUNT] = {
        [SW_POOL] = {"pool", {defaults.pool_bytes}, 1, 1, {NULL, NULL}},
        [SW_QD] = {"qd", {defaults.queue_depth}, 1, 0, {NULL, NULL}},
        [SW_CHUNK] = {"chunk", {defaults.chunk_bytes}, 1, 1, {NULL, NULL}},
        [SW_DIRECT] = {"direct", {0}, 1, 0, {"off", "on"}},
        [SW_VERIFY] = {"verify", {0, 1}, 2, 0, {"off", "on"}},
        [SW_ALGORITHM] = {"algorithm", {SLUICE_ALG_SHA256}, 1, 0, {"sha256", "blake3"}},
        [SW_BACKEND] = {"backend", {0}, 1, 0, {"auto", "pread"}},
    };
    for (int i = 1; i < argc; i++) /* tensor-parallel: its own bench (shard.c) */
        if (!strcmp(argv[i], "--world"))
            return cmd_bench_world(argc, argv);
    const char *path = NULL, *csv = NULL, *plot = NULL;
    bench_opts bo = {.seed = 1, .metrics_port = -1};
    uint64_t runs = 3;
    int random_mode = 0, baselines = 1, verify_given = 0, whole_process = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int matched = 0;
        for (int s = 0; s < SW_COUNT; s++) {
            if (a[0] == '-' && a[1] == '-' && !strcmp(a + 2, sw[s].name)) {
                if (!need_value(i, argc, a) || parse_sweep(&sw[s], argv[++i]) < 0)
                    return 2;
                if (s == SW_VERIFY)
                    verify_given = 1;
                matched = 1;
            }
        }
        if (matched)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--random")) {
            random_mode = 1;
        } else if (!strcmp(a, "--cold")) {
            bo.cold = 1;
        } else if (!strcmp(a, "--runs") || !strcmp(a, "--seed")) {
            if (!need_value(i, argc, a))
                return 2;
            char *end;
            errno = 0;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (errno || *end || end == argv[i] || argv[i][0] == '-' ||
                (!strcmp(a, "--runs") && (v < 1 || v > 256))) {
                fprintf(stderr, "sluice bench: %s %s: not a valid number%s\n", a, argv[i],
                        !strcmp(a, "--runs") ? " (1..256)" : "");
                return 2;
            }
            if (!strcmp(a, "--runs"))
                runs = v;
            else
                bo.seed = v;
        } else if (!strcmp(a, "--metrics-port")) {
            int r = mc_port_option("bench", argc, argv, &i, &bo.metrics_port);
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--whole-process")) {
            if (!need_value(i, argc, a))
                return 2;
            const char *v = argv[++i];
            if (strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, "sluice bench: --whole-process %s: use on or off\n", v);
                return 2;
            }
            whole_process = !strcmp(v, "on");
        } else if (!strcmp(a, "--baselines")) {
            if (!need_value(i, argc, a))
                return 2;
            const char *v = argv[++i];
            if (strcmp(v, "all") && strcmp(v, "none")) {
                fprintf(stderr, "sluice bench: --baselines %s: use all or none\n", v);
                return 2;
            }
            baselines = !strcmp(v, "all");
        } else if (!strcmp(a, "--csv") || !strcmp(a, "--plot") || !strcmp(a, "--manifest")) {
            if (!need_value(i, argc, a))
                return 2;
            const char **dst = !strcmp(a, "--csv") ? &csv : !strcmp(a, "--plot") ? &plot
                                                                                 : &bo.manifest;
            *dst = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sluice bench: unknown option %s\n", a);
            usage(stderr);
            return 2;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "sluice bench: unexpected argument %s\n", a);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (plot && !bench_have_program("gnuplot")) {
        fprintf(stderr, "sluice bench: --plot needs gnuplot, which is not on PATH "
                        "(apt-get install gnuplot-nox); nothing was run\n");
        return 2;
    }

    /* A remote model (a URL): no file can be read directly; its baseline
     * (a) is curl over as many connections as the library opens. */
    bo.remote = strstr(path, "://") != NULL;
    if (bo.remote && bo.cold) {
        fprintf(stderr, "sluice bench: --cold is for local files, not %s\n", path);
        return 2;
    }
    if (bo.remote)
        whole_process = 0;
    bench_model bm;
    int rc = load_model(path, &bm);
    if (rc)
        return rc;   /* an open error, as for every command */
    rc = 1;
    bench_row *rows = NULL;
    size_t nrows = 0;
    char b3_dir[] = "/tmp/sluice-bench-XXXXXX", b3_path[sizeof b3_dir + 32] = "";

    /* --verify: by default on too when a manifest covers the model. */
    int want_verify = 0;
    for (size_t k = 0; k < sw[SW_VERIFY].n; k++)
        want_verify |= sw[SW_VERIFY].v[k] != 0;
    char *manifest_found = NULL;
    if (want_verify && !manifest_usable(path, bo.manifest, verify_given, &manifest_found)) {
        if (verify_given)
            goto out;
        fprintf(stderr, "sluice bench: no usable manifest: --verify off only\n");
        sw[SW_VERIFY].n = 1;
        sw[SW_VERIFY].v[0] = 0;
    }

    /* --algorithm blake3: a BLAKE3 manifest of the model, written once. */
    int want_blake3 = 0;
    for (size_t k = 0; k < sw[SW_ALGORITHM].n; k++)
        want_blake3 |= sw[SW_ALGORITHM].v[k] == SLUICE_ALG_BLAKE3;
    if (want_blake3 && !want_verify) {
        fprintf(stderr, "sluice bench: --algorithm blake3 needs --verify on\n");
        rc = 2;
        goto out;
    }
    if (want_blake3) {
        if (!mkdtemp(b3_dir)) {
            fprintf(stderr, "sluice bench: %s: %s\n", b3_dir, strerror(errno));
            goto out;
        }
        snprintf(b3_path, sizeof b3_path, "%s/blake3.manifest.json", b3_dir);
        progress(isatty(2), "writing the BLAKE3 manifest", 0, runs, 0, 0);
        if (bench_write_blake3_manifest(path, b3_path) < 0)
            goto out;
        bo.manifest_blake3 = b3_path;
    }

    /* The rows: the baselines, then the cross product x modes. */
    size_t nconf = 1;
    for (int s = 0; s < SW_COUNT; s++)
        nconf *= sw[s].n;
    bo.manifest_found = manifest_found;
    size_t nmodes = (random_mode ? 2 : 1) + (whole_process ? 1 : 0);
    /* baselines, modes of every configuration, two verify rows per direct value */
    size_t cap = (baselines ? 7 : 0) + nconf * nmodes + 2 * sw[SW_DIRECT].n * sw[SW_ALGORITHM].n;
    rows = calloc(cap, sizeof *rows);
    bench_result *results = calloc(cap * runs, sizeof *results);
    if (!rows || !results) {
        fprintf(stderr, "sluice bench: out of memory\n");
        free(results);
        goto out;
    }
    rows[0].runs = results; /* freed through rows[0] */
    if (baselines) {
        static const struct {
            bench_mode mode;
            const char *label;
        } base[] = {
            {BM_SEQ, "(a) seq pread 8M, no hash"},
            {BM_PREAD_SHA, "(b) pread+SHA-256 per tensor, 1 thread"},
            {BM_SHA_MEM, "(c) SHA-256 of memory, 1 thread"},
            {BM_FIO, "(d) fio io_uring O_DIRECT"},
            {BM_PREAD_SHA_PAR, "(e) pread+SHA-256, a thread per CPU"},
            {BM_PY_VERIFY, "(f) python mmap+hashlib, whole process"},
        };
        /* fio, when installed, is the reference of cold O_DIRECT reads:
         * at the block size and depth of the first configuration */
        int fio = bo.cold && bench_have_program("fio");
        int python = manifest_found && access("/usr/bin/python3", X_OK) == 0;
        if (manifest_found && !python)
            fprintf(stderr, "sluice bench: no /usr/bin/python3: baseline (f) skipped\n");
        for (size_t b = 0; b < sizeof base / sizeof base[0]; b++) {
            if ((base[b].mode == BM_FIO && !fio) || (base[b].mode == BM_PY_VERIFY && !python))
                continue;
            /* remote: (a) is curl, and nothing else reads the files */
            if (bo.remote && base[b].mode != BM_SEQ && base[b].mode != BM_SHA_MEM)
                continue;
            bench_config *c = &rows[nrows].cfg;
            c->mode = base[b].mode;
            c->verify = base[b].mode != BM_SEQ && base[b].mode != BM_FIO;
            c->chunk = sw[SW_CHUNK].v[0];
            c->qd = (uint32_t)sw[SW_QD].v[0];
            snprintf(c->label, sizeof c->label, "%s", base[b].label);
            if (bo.remote && c->mode == BM_SEQ) {
                c->mode = BM_CURL;
                snprintf(c->label, sizeof c->label, "(a) curl -s -o /dev/null, 8 connections");
            }
            if (c->mode == BM_FIO) {
                char bs[32];
                snprintf(c->label, sizeof c->label, "%s %s x%u", base[b].label,
                         bench_size(c->chunk, bs), (unsigned)c->qd);
            }
            nrows++;
        }
        /* and at sluice_verify's O_DIRECT block and depth, when it runs so */
        int verify_direct = 0;
        for (size_t a = 0; a < sw[SW_VERIFY].n; a++)
            for (size_t d = 0; d < sw[SW_DIRECT].n; d++)
                verify_direct |= sw[SW_VERIFY].v[a] && sw[SW_DIRECT].v[d];
        if (fio && verify_direct) {
            bench_config *c = &rows[nrows++].cfg;
            /* sluice verify runs a thread per CPU, 64 at most */
            long cpus = sysconf(_SC_NPROCESSORS_ONLN);
            unsigned threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (unsigned)cpus, depth;
            c->mode = BM_FIO;
            bench_verify_shape(threads, &c->chunk, &depth);
            c->qd = depth * threads;
            c->direct = 1; /* marks it as the verify one */
            c->verify = 1;
            char bs[32];
            snprintf(c->label, sizeof c->label, "(d) fio io_uring O_DIRECT %s x%u (as verify)",
                     bench_size(c->chunk, bs), (unsigned)c->qd);
        }
    }
    bench_summary sum = {.model = &bm, .cold = bo.cold, .nruns = runs, .nconf = nconf,
                         .ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    for (int s = 0; s < SW_COUNT; s++)
        if (sw[s].n > 1)
            sum.swept[sum.nswept++] = sw[s].name;
    for (size_t k = 0; k < nconf; k++) {
        size_t idx[SW_COUNT], rest = k;
        for (int s = SW_COUNT - 1; s >= 0; s--) {
            idx[s] = rest % sw[s].n;
            rest /= sw[s].n;
        }
        bench_config c = {0};
        c.pool = sw[SW_POOL].v[idx[SW_POOL]];
        c.qd = (uint32_t)sw[SW_QD].v[idx[SW_QD]];
        c.chunk = sw[SW_CHUNK].v[idx[SW_CHUNK]];
        c.direct = (int)sw[SW_DIRECT].v[idx[SW_DIRECT]];
        c.verify = (int)sw[SW_VERIFY].v[idx[SW_VERIFY]];
        c.algorithm = (int)sw[SW_ALGORITHM].v[idx[SW_ALGORITHM]];
        if (!c.verify && idx[SW_ALGORITHM] > 0)
            continue; /* an unverified run reads no digest: once is enough */
        c.force_pread = (int)sw[SW_BACKEND].v[idx[SW_BACKEND]];
        /* The label names the swept parameters; the others are in the
         * table's heading. */
        size_t len = (size_t)snprintf(c.label, sizeof c.label, "sluice");
        for (int s = 0; s < SW_COUNT; s++) {
            char v[32];
            sweep_value(&sw[s], sw[s].v[idx[s]], v);
            if (sw[s].n > 1)
                len += (size_t)snprintf(c.label + len, sizeof c.label - len, " %s=%s",
                                        sw[s].name, v);
            else if (k == 0)
                sum.fixed_len += (size_t)snprintf(sum.fixed + sum.fixed_len,
                                                  sizeof sum.fixed - sum.fixed_len, "%s%s=%s",
                                                  sum.fixed_len ? " " : "", sw[s].name, v);
        }
        /* Options the library refuses fail here, once, not in every run. */
        if (!options_accepted(path, &c)) {
            rc = 2;
            goto out;
        }
        rows[nrows].cfg = c;
        rows[nrows++].cfg.mode = BM_STREAM;
        if (random_mode) {
            rows[nrows].cfg = c;
            rows[nrows++].cfg.mode = BM_RANDOM;
        }
        if (whole_process) {
            rows[nrows].cfg = c;
            rows[nrows++].cfg.mode = BM_PROC_STREAM;
        }
    }
    /* The verify-only path, once per direct value that runs verified. */
    for (size_t d = 0; d < sw[SW_DIRECT].n && manifest_found; d++) {
        int on = 0;
        for (size_t a = 0; a < sw[SW_VERIFY].n; a++)
            on |= sw[SW_VERIFY].v[a] != 0;
        if (!on)
            break;
        for (size_t a = 0; a < sw[SW_ALGORITHM].n; a++) {
            bench_config c = {.direct = (int)sw[SW_DIRECT].v[d], .verify = 1,
                              .algorithm = (int)sw[SW_ALGORITHM].v[a]};
            const char *dl = c.direct ? " direct=on" : sw[SW_DIRECT].n > 1 ? " direct=off" : "";
            const char *al = sw[SW_ALGORITHM].n > 1 ? (c.algorithm ? " algorithm=blake3"
                                                                   : " algorithm=sha256") : "";
            c.mode = BM_VERIFY;
            snprintf(c.label, sizeof c.label, "sluice_verify%s%s", dl, al);
            rows[nrows++].cfg = c;
            if (whole_process) {
                c.mode = BM_PROC_VERIFY;
                snprintf(c.label, sizeof c.label, "sluice verify%s%s", dl, al);
                rows[nrows++].cfg = c;
            }
        }
    }
    for (size_t r = 0; r < nrows; r++)
        rows[r].runs = results + r * runs;

    int tty = isatty(2);
    int warned_cache = 0;
    if (!bo.cold) {
        bench_config warm = {.mode = bo.remote ? BM_CURL : BM_SEQ};
        bench_result wr;
        progress(tty, "warm-up: reading every file once", 0, runs, 0, nrows);
        if (bench_run(&bm, &warm, &bo, &wr) < 0 || !wr.ok) {
            fprintf(stderr, "\nsluice bench: warm-up failed: %s\n",
                    wr.err[0] ? wr.err : strerror(errno));
            goto out;
        }
    }
    for (size_t round = 0; round < runs; round++) {
        for (size_t k = 0; k < nrows; k++) {
            /* Each round starts one row later: whatever the run after a
             * given neighbour pays (memory the previous process left
             * behind) falls on every row in turn, not always the same. */
            size_t r = (k + (size_t)round) % nrows;
            progress(tty, rows[r].cfg.label, round + 1, runs, k + 1, nrows);
            if (bo.cold && rows[r].cfg.mode != BM_SHA_MEM) {
                double left = bench_drop_cache(&bm);
                if (left > 0.05 && !warned_cache++)
                    fprintf(stderr, "%ssluice bench: --cold: %.0f%% of the files stayed in the "
                                    "page cache after POSIX_FADV_DONTNEED; figures are not "
                                    "cold\n", tty ? "\n" : "", left * 100);
            }
            bench_result *res = &rows[r].runs[round];
            if (bench_run(&bm, &rows[r].cfg, &bo, res) < 0) {
                fprintf(stderr, "\nsluice bench: cannot fork: %s\n", strerror(errno));
                goto out;
            }
            rows[r].nruns = round + 1;
            if (!res->ok && (!round || strcmp(res->err, rows[r].runs[round - 1].err)))
                fprintf(stderr, "%ssluice bench: %s, %s: %s\n", tty ? "\r\033[K" : "",
                        rows[r].cfg.label, rows[r].cfg.mode == BM_RANDOM ? "random" : "stream",
                        res->err);
        }
    }
    if (tty)
        fprintf(stderr, "\r\033[K");

    /* Ceilings and ratios. */
    double mn, mx;
    for (size_t r = 0; r < nrows; r++) {
        double med;
        if ((rows[r].cfg.mode == BM_SEQ || rows[r].cfg.mode == BM_CURL) &&
            bench_stat(&rows[r], offsetof(bench_result, gbps),
                                                     &med, &mn, &mx))
            sum.io_ceiling = med;
        if (rows[r].cfg.mode == BM_SHA_MEM && bench_stat(&rows[r], offsetof(bench_result, gbps),
                                                         &med, &mn, &mx))
            sum.sha_core = med;
        if (rows[r].cfg.mode == BM_FIO && bench_stat(&rows[r], offsetof(bench_result, gbps),
                                                     &med, &mn, &mx))
            *(rows[r].cfg.verify ? &sum.fio_verify : &sum.fio) = med;
        if (rows[r].cfg.mode == BM_PY_VERIFY &&
            bench_stat(&rows[r], offsetof(bench_result, gbps), &med, &mn, &mx))
            sum.py_verify = med;
        if (rows[r].cfg.mode == BM_PREAD_SHA_PAR &&
            bench_stat(&rows[r], offsetof(bench_result, gbps), &med, &mn, &mx))
            sum.copy_hash = med;
    }
    double verified = sum.io_ceiling;
    if (sum.sha_core > 0 && sum.ncpu * sum.sha_core < verified)
        verified = sum.ncpu * sum.sha_core;
    for (size_t r = 0; r < nrows; r++) {
        const bench_config *c = &rows[r].cfg;
        if (c->mode == BM_SHA_MEM)
            rows[r].ratio_base = 0;
        else if (c->verify && c->algorithm == SLUICE_ALG_BLAKE3)
            rows[r].ratio_base = sum.io_ceiling; /* (c) is SHA-256's ceiling */
        else if (c->mode == BM_SEQ || c->mode == BM_CURL)
            rows[r].ratio_base = sum.io_ceiling;
        else if (c->mode == BM_FIO)
            rows[r].ratio_base = c->verify ? sum.fio_verify : sum.fio;
        else if (c->mode == BM_VERIFY || c->mode == BM_PROC_VERIFY || c->mode == BM_PY_VERIFY) {
            /* hashing every byte: CPUs x (c); cold O_DIRECT: or fio at its blocks */
            double base = sum.sha_core > 0 ? sum.ncpu * sum.sha_core : 0;
            if (c->direct && sum.fio_verify > 0 && (base <= 0 || sum.fio_verify < base))
                base = sum.fio_verify;
            rows[r].ratio_base = base;
        }
        else if (c->direct && sum.fio > 0) /* cold O_DIRECT: against fio */
            rows[r].ratio_base = c->verify && sum.sha_core > 0 && sum.ncpu * sum.sha_core < sum.fio
                                     ? sum.ncpu * sum.sha_core : sum.fio;
        else
            rows[r].ratio_base = c->verify ? verified : sum.io_ceiling;
    }

    bench_print_table(stdout, &sum, rows, nrows);
    rc = 0;
    for (size_t r = 0; r < nrows; r++)
        for (size_t k = 0; k < rows[r].nruns; k++)
            if (!rows[r].runs[k].ok)
                rc = 1;
    if (csv && bench_write_csv(csv, &sum, rows, nrows) < 0)
        rc = 1;
    if (plot && bench_plot(plot, &sum, rows, nrows) < 0)
        rc = 1;
out:
    if (b3_path[0]) {
        unlink(b3_path);
        rmdir(b3_dir);
    }
    free(manifest_found);
    if (rows)
        free(rows[0].runs);
    free(rows);
    free_model(&bm);
    return rc;
}
