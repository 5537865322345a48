/* metrics_cli.c: see metrics_cli.h; `sluice stats` and `sluice bench-metrics`. */
#include "cmd.h"
#include "integrity.h"
#include "metrics_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mc_port_option(const char *cmd, int argc, char **argv, int *i, int *port)
{
    if (strcmp(argv[*i], "--metrics-port") != 0)
        return 0;
    char *end = NULL;
    long v = *i + 1 < argc ? strtol(argv[*i + 1], &end, 10) : -1;
    if (*i + 1 >= argc || !end || *end || v < 0 || v > 65535) {
        fprintf(stderr, "sluice %s: --metrics-port needs a port 0..65535\n", cmd);
        return -1;
    }
    *port = (int)v;
    (*i)++;
    return 1;
}

sluice_metrics_server *mc_serve(const char *cmd, int port, sluice_model *m, int *failed)
{
    *failed = 0;
    if (port < 0)
        return NULL;
    sluice_metrics_server *s = NULL;
    int rc = sluice_metrics_serve(NULL, (unsigned)port, &s);
    if (rc == SLUICE_OK)
        rc = sluice_metrics_server_add(s, m);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice %s: cannot serve metrics on 127.0.0.1:%d: %s\n", cmd, port,
                sluice_strerror(rc));
        sluice_metrics_server_free(s);
        *failed = 1;
        return NULL;
    }
    fprintf(stderr, "sluice %s: metrics on http://127.0.0.1:%u/metrics\n", cmd,
            sluice_metrics_server_port(s));
    return s;
}

void mc_stop(sluice_metrics_server *s, sluice_model *m)
{
    if (!s)
        return;
    sluice_metrics_server_remove(s, m);
    sluice_metrics_server_free(s);
}

/* The exposition of m, malloc'd. */
static char *render(sluice_model *m, sluice_metrics_format f, size_t *len)
{
    size_t need = 0, cap = 1 << 14;
    for (int tries = 0; tries < 4; tries++) {
        char *buf = malloc(cap);
        if (!buf)
            return NULL;
        int rc = sluice_metrics_write(m, buf, cap, &need, f);
        if (rc == SLUICE_OK) {
            *len = need - 1;
            return buf;
        }
        free(buf);
        if (rc != SLUICE_E_BUFFER)
            return NULL;
        cap = need + 4096;
    }
    return NULL;
}

static int release_cb(void *user, sluice_tensor *t, int status,
                      const struct sluice_tensor_info *info, const char *msg)
{
    int *failed = user;   /* the exit status of the failures (cmd_exit_worse) */
    (void)info;
    if (status != SLUICE_OK) {
        fprintf(stderr, "FAILED %s\n", msg);
        *failed = cmd_exit_worse(*failed, cmd_exit_status(status));
    }
    sluice_release(t);
    return 0;
}

static void stats_usage(FILE *out)
{
    fprintf(out,
            "usage: sluice stats PATH [--openmetrics] [--manifest FILE] [trust options]\n"
            "                    [loader options]\n"
            "\n"
            "Loads every tensor of the model at PATH through the library (verified\n"
            "against its manifest when there is one, or, for a Hugging Face Hub cache\n"
            "snapshot without one, against its blobs' SHA-256: docs/manifests.md)\n"
            "and prints the model's metrics\n"
            "in the Prometheus text format 0.0.4 (or OpenMetrics 1.0). Without a\n"
            "manifest a warning on stderr says the load is not verified\n"
            "(sluice_unverified in the metrics).\n"
            "  --openmetrics     OpenMetrics 1.0 instead\n"
            "  --label TEXT      the model label (default: PATH)\n"
            IG_TRUST_HELP
            IG_FALLBACK_HELP
            IG_LOADER_HELP
            "\n" CMD_EXIT_HELP
            "stats: 1 or 3 when a tensor failed to verify or to read.\n");
}

int cmd_stats(int argc, char **argv)
{
    const char *path = NULL;
    sluice_metrics_format f = SLUICE_METRICS_PROMETHEUS;
    ig_trust trust = {0};
    sluice_options o;
    sluice_options_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            stats_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--openmetrics")) {
            f = SLUICE_METRICS_OPENMETRICS;
        } else if ((r = ig_file_option("stats", argc, argv, &i, "--manifest", "-m", &o.manifest_path)) != 0) {
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--label") && i + 1 < argc) {
            o.metrics_label = argv[++i];
        } else if ((r = ig_trust_option("stats", argc, argv, &i, &trust, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = ig_loader_option("stats", argc, argv, &i, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if (ig_path_operand("stats", a, &path, stats_usage) < 0) {
            return 2;
        }
    }
    if (!path) {
        stats_usage(stderr);
        return 2;
    }
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        return ig_open_failed("stats", m, rc);
    ig_warn_unverified("stats", m);
    int failed = 0;
    size_t len = 0;
    sluice_stream(m, NULL, 0, release_cb, &failed);
    /* the cache turned off, or the memo refused a file: asked for, not had */
    if (sluice_cache_warning(m))
        fprintf(stderr, "sluice stats: warning: %s\n", sluice_cache_warning(m));
    char *text = render(m, f, &len);
    int status = failed;
    if (!text) {
        fprintf(stderr, "sluice stats: %s\n", sluice_errmsg(m));
        status = cmd_exit_worse(status, CMD_EXIT_OPEN);
    } else {
        fwrite(text, 1, len, stdout);
        free(text);
    }
    sluice_close(m);
    return status;
}

/* ---------------------------------------------------------------- bench-metrics */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bm_usage(FILE *out)
{
    fprintf(out,
            "usage: sluice bench-metrics PATH [--runs N] [--pool BYTES] [--metrics-port N]\n"
            "\n"
            "What the metrics cost: warm streams of the whole model (page cache\n"
            "warm, the pool smaller than the model so every stream reads), with\n"
            "verification off and on, each with the metrics on and off\n"
            "(SLUICE_METRICS=0 at open), interleaved in the same run; the median\n"
            "throughput of each and the overhead. Then the time and size of a\n"
            "rendering of the model's exposition, both formats.\n"
            "\n"
            CMD_EXIT_HELP
            "bench-metrics: 1 or 3 when a tensor failed to verify or to read.\n");
}

int cmd_bench_metrics(int argc, char **argv)
{
    const char *path = NULL;
    int runs = 7, port = -1;
    uint64_t pool = (uint64_t)1 << 30;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bm_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--pool") && i + 1 < argc) {
            pool = strtoull(argv[++i], NULL, 0);
        } else if ((r = mc_port_option("bench-metrics", argc, argv, &i, &port)) != 0) {
            if (r < 0)
                return 2;
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            bm_usage(stderr);
            return 2;
        }
    }
    if (!path || runs < 1 || runs > 1000) {
        bm_usage(stderr);
        return 2;
    }
    /* configs: verify off/on x metrics on/off */
    const char *names[4] = {"verify off, metrics on ", "verify off, metrics off",
                            "verify on,  metrics on ", "verify on,  metrics off"};
    sluice_model *m[4] = {0};
    double *gbps[4] = {0};
    uint64_t bytes = 0;
    int status = 0;
    sluice_metrics_server *srv = NULL;
    for (int c = 0; c < 4; c++) {
        sluice_options o;
        sluice_options_init(&o);
        o.pool_bytes = pool;
        o.verify = c < 2 ? SLUICE_VERIFY_OFF : SLUICE_VERIFY_REQUIRE;
        char label[32];
        snprintf(label, sizeof label, "config%d", c);
        o.metrics_label = label;
        setenv("SLUICE_METRICS", c % 2 ? "0" : "1", 1);
        int rc = sluice_open(path, &o, &m[c]);
        unsetenv("SLUICE_METRICS");
        gbps[c] = calloc((size_t)runs, sizeof(double));
        if (rc != SLUICE_OK || !gbps[c]) {
            fprintf(stderr, "sluice bench-metrics: %s\n", sluice_errmsg(m[c]));
            status = rc != SLUICE_OK ? cmd_exit_status(rc) : CMD_EXIT_OPEN;
            goto out;
        }
    }
    for (size_t i = 0; i < sluice_count(m[0]); i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m[0], i, &info);
        bytes += info.nbytes;
    }
    if (port >= 0) {
        int failed;
        if (!(srv = mc_serve("bench-metrics", port, m[2], &failed)) && failed) {
            status = CMD_EXIT_OPEN;
            goto out;
        }
    }
    int failed = 0;
    for (int c = 0; c < 4; c++) /* warm-up: the page cache */
        sluice_stream(m[c], NULL, 0, release_cb, &failed);
    for (int r = 0; r < runs; r++)
        for (int k = 0; k < 4; k++) {
            int c = (k + r) % 4; /* rotate the order so drift spreads evenly */
            double t0 = ig_now();
            sluice_stream(m[c], NULL, 0, release_cb, &failed);
            gbps[c][r] = (double)bytes / (ig_now() - t0) / 1e9;
        }
    printf("model %s: %zu tensors, %llu bytes, pool %llu, %d runs each (median GB/s)\n", path,
           sluice_count(m[0]), (unsigned long long)bytes, (unsigned long long)pool, runs);
    double med[4];
    for (int c = 0; c < 4; c++) {
        qsort(gbps[c], (size_t)runs, sizeof(double), cmp_double);
        med[c] = gbps[c][runs / 2];
        printf("  %s  %7.3f GB/s  (min %.3f, max %.3f)\n", names[c], med[c], gbps[c][0],
               gbps[c][runs - 1]);
    }
    printf("  overhead of metrics: verify off %+.2f%%, verify on %+.2f%%\n",
           (med[1] - med[0]) / med[1] * 100.0, (med[3] - med[2]) / med[3] * 100.0);
    for (int f = 0; f < 2; f++) {
        size_t len = 0;
        int reps = 1000;
        double t0 = ig_now();
        for (int k = 0; k < reps; k++)
            free(render(m[2], (sluice_metrics_format)f, &len));
        double us = (ig_now() - t0) / reps * 1e6;
        printf("  rendering (%s): %zu bytes, %.1f us each (mean of %d)\n",
               f ? "OpenMetrics 1.0" : "Prometheus 0.0.4", len, us, reps);
    }
    status = failed;
out:
    mc_stop(srv, m[2]);
    for (int c = 0; c < 4; c++) {
        sluice_close(m[c]);
        free(gbps[c]);
    }
    return status;
}
