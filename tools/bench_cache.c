/* bench_cache.c: `sluice bench-cache`, what the persistent cache buys.
 *
 * Five loads of one model, each a fresh open, a stream of every tensor
 * and a close, timed from open to close:
 *   (a) remote (URL), every blob deleted first: every tensor fetched and stored
 *   (b) remote, cache warm: every tensor read from its blob, verified
 *   (c) local (PATH), verified against the manifest
 *   (d) local, verified-once memo (SLUICE_F_TRUST_UNCHANGED), memo warm
 *   (e) local, not verified
 *   (r) remote, no cache: what (a) costs over a plain remote load
 * One untimed pass of each first (page cache, the pool's first touch, the
 * memo recorded), then --runs rounds in that order; figures are medians,
 * ratios are of medians in this run. The remote requests counted are the
 * library's tensor range requests (remote_reads); the headers and the
 * manifest are fetched at every open on top (tools/bench_cache.sh counts
 * the server's log).
 */
#include "cmd.h"
#include "integrity.h"

#include "sluice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_A, ROW_B, ROW_C, ROW_D, ROW_E, ROW_R, ROWS };

static const char *const row_name[ROWS] = {
    "(a) remote, cold cache", "(b) remote, warm cache", "(c) local, verified",
    "(d) local, verified-once memo", "(e) local, unverified", "(r) remote, no cache",
};

typedef struct row_run {
    double s;
    struct sluice_stats st;
} row_run;

static int on_tensor(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *msg)
{
    int *failed = user;
    (void)info;
    if (status != SLUICE_OK) {
        if (!*failed)
            fprintf(stderr, "sluice bench-cache: %s\n", msg);
        (*failed)++;
    }
    sluice_release(t);
    return 0;
}

/* One load of row r; 0, or after a message minus the exit status (cmd.h):
 * the open's, -CMD_EXIT_OPEN (no manifest, the cache not emptied) or -1 (a
 * tensor failed). */
static int load(int r, const char *path, const char *url, const char *dir, uint64_t pool,
                row_run *out)
{
    sluice_options o;
    sluice_options_init(&o);
    if (pool)
        o.pool_bytes = pool;
    o.cache_dir = dir;
    const char *where = r <= ROW_B || r == ROW_R ? url : path;
    if (r == ROW_A) {
        sluice_cache *c = NULL;
        int rc = sluice_cache_open(dir, &c);
        if (rc == SLUICE_OK)   /* every blob goes; the memo (row d's) stays */
            rc = sluice_cache_gc(c, 0, NULL, NULL);
        if (rc != SLUICE_OK) {
            fprintf(stderr, "sluice bench-cache: emptying %s: %s\n", dir,
                    c ? sluice_cache_errmsg(c) : sluice_strerror(rc));
            sluice_cache_close(c);
            return -CMD_EXIT_OPEN;
        }
        sluice_cache_close(c);
    }
    if (r == ROW_D)
        o.flags |= SLUICE_F_TRUST_UNCHANGED;
    if (r == ROW_C || r == ROW_E || r == ROW_R)
        o.cache_dir = NULL;
    if (r == ROW_E)
        o.verify = SLUICE_VERIFY_OFF;
    double t0 = ig_now();
    sluice_model *m = NULL;
    int rc = sluice_open(where, &o, &m);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice bench-cache: %s: %s\n", row_name[r],
                m ? sluice_errmsg(m) : sluice_strerror(rc));
        sluice_close(m);
        return -cmd_exit_status(rc);
    }
    if (r != ROW_E && !sluice_manifest_path(m)) {
        fprintf(stderr, "sluice bench-cache: %s: %s has no manifest (a directory's is "
                "sluice.manifest.json, a file F's F.manifest.json)\n", row_name[r], where);
        sluice_close(m);
        return -CMD_EXIT_OPEN;
    }
    int failed = 0;
    rc = sluice_stream(m, NULL, 0, on_tensor, &failed);
    out->st.size = sizeof out->st;
    sluice_stats(m, &out->st);
    const char *warn = sluice_cache_warning(m);
    if (warn)
        fprintf(stderr, "sluice bench-cache: %s: cache: %s\n", row_name[r], warn);
    sluice_close(m);
    out->s = ig_now() - t0;
    if (rc != SLUICE_OK || failed) {
        fprintf(stderr, "sluice bench-cache: %s: %d tensors failed\n", row_name[r], failed);
        return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench-cache PATH --url URL --cache-dir DIR [--runs N] [--pool SIZE]\n"
            "Loads the model six ways, each a fresh open, stream and close: (a) from URL\n"
            "with the blobs of the cache DIR deleted first, (b) from URL with DIR warm,\n"
            "(c) PATH verified, (d) PATH with the verified-once memo (--trust-unchanged),\n"
            "(e) PATH unverified, (r) from URL without a cache. URL must serve the same\n"
            "files as PATH, with its manifest. Give a DIR for this benchmark only. Prints\n"
            "medians of N runs (default 3) after an untimed pass, and their ratios.\n"
            "tools/bench_cache.sh PATH serves PATH with nginx and runs this.\n"
            "\n"
            CMD_EXIT_HELP
            "bench-cache: 1 a load failed; 3 also when PATH or URL has no manifest.\n");
}

int cmd_bench_cache(int argc, char **argv)
{
    const char *path = NULL, *url = NULL, *dir = NULL;
    int runs = 3;
    uint64_t pool = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--url") || !strcmp(a, "--cache-dir")) && i + 1 < argc) {
            *(!strcmp(a, "--url") ? &url : &dir) = argv[++i];
        } else if (!strcmp(a, "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
            if (runs < 1 || runs > 100) {
                fprintf(stderr, "sluice bench-cache: --runs 1..100\n");
                return 2;
            }
        } else if (!strcmp(a, "--pool") && i + 1 < argc) {
            if (ig_parse_size(argv[++i], &pool) < 0) {
                fprintf(stderr, "sluice bench-cache: --pool: bad size '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (ig_path_operand("bench-cache", a, &path, usage) < 0) {
            return 2;
        }
    }
    if (!path || !url || !dir) {
        usage(stderr);
        return 2;
    }
    row_run *res = calloc((size_t)runs * ROWS, sizeof *res);
    row_run warm;
    if (!res)
        return CMD_EXIT_OPEN;
    int status = 0;   /* the exit status: -load() */
    for (int r = 0; r < ROWS && !status; r++)
        status = -load(r, path, url, dir, pool, &warm);
    for (int k = 0; k < runs && !status; k++)
        for (int r = 0; r < ROWS && !status; r++)
            status = -load(r, path, url, dir, pool, &res[k * ROWS + r]);
    if (status) {
        free(res);
        return status;
    }
    double med[ROWS];
    printf("%-32s %9s %9s %11s %11s %10s %10s %10s\n", "load", "median s", "GB/s",
           "bytes read", "hashed", "tensor req", "disk hits", "memo");
    for (int r = 0; r < ROWS; r++) {
        double v[100];
        for (int k = 0; k < runs; k++)
            v[k] = res[k * ROWS + r].s;
        qsort(v, (size_t)runs, sizeof *v, cmp_double);
        med[r] = runs % 2 ? v[runs / 2] : (v[runs / 2 - 1] + v[runs / 2]) / 2;
        const struct sluice_stats *st = &res[(runs - 1) * ROWS + r].st; /* the last round's */
        printf("%-32s %9.3f %9.2f %11llu %11llu %10llu %10llu %10llu\n", row_name[r], med[r],
               (double)st->bytes_delivered / med[r] / 1e9, (unsigned long long)st->bytes_read,
               (unsigned long long)st->bytes_hashed, (unsigned long long)st->remote_reads,
               (unsigned long long)st->disk_hits, (unsigned long long)st->memo_tensors);
    }
    printf("rounds: %d; every round's times (s):", runs);
    for (int r = 0; r < ROWS; r++) {
        printf("\n  %c:", "abcder"[r]);
        for (int k = 0; k < runs; k++)
            printf(" %.3f", res[k * ROWS + r].s);
    }
    printf("\nratios of medians (throughput): (b)/(c) = %.2f (target >= 0.9), "
           "(d)/(e) = %.2f (target >= 0.9), (d)/(c) = %.2f, (a)/(c) = %.2f, (a)/(r) = %.2f, "
           "(b)/(r) = %.2f\n",
           med[ROW_C] / med[ROW_B], med[ROW_E] / med[ROW_D], med[ROW_C] / med[ROW_D],
           med[ROW_C] / med[ROW_A], med[ROW_R] / med[ROW_A], med[ROW_R] / med[ROW_B]);
    free(res);
    return 0;
}
