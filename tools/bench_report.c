/* bench_report.c: what `sluice bench` shows: a table of medians on
 * stdout, every run in a CSV file, and a gnuplot chart. */
#include "bench.h"

#include "sluice.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIELD(f) offsetof(bench_result, f)

static const char *mode_name(bench_mode m)
{
    switch (m) {
    case BM_STREAM: return "stream";
    case BM_RANDOM: return "random";
    case BM_VERIFY: return "verify";
    case BM_PROC_STREAM: return "stream*";
    case BM_PROC_VERIFY: return "verify*";
    case BM_PY_VERIFY: return "baseline*";
    default: return "baseline";
    }
}

/* The configuration as one CSV/plot word group, without commas. */
static const char *config_name(const bench_config *c)
{
    switch (c->mode) {
    case BM_SEQ: return "seq-pread";
    case BM_CURL: return "curl";
    case BM_PREAD_SHA: return "pread-sha256";
    case BM_SHA_MEM: return "sha256-mem";
    case BM_FIO: return "fio-direct";
    case BM_PREAD_SHA_PAR: return "pread-sha256-parallel";
    case BM_PY_VERIFY: return "python-verify";
    default: return c->label;
    }
}

static const char *backend_name(int b)
{
    switch (b) {
    case SLUICE_BACKEND_IO_URING: return "io_uring";
    case SLUICE_BACKEND_PREAD: return "pread";
    case SLUICE_BACKEND_NONE: return "none";
    default: return "-";
    }
}

/* "624 KB", "988.1 MB", "2.47 GB" (powers of 1000, like GB/s). */
static const char *human(uint64_t v, char buf[32])
{
    if (v >= 1000000000u)
        snprintf(buf, 32, "%.2f GB", v / 1e9);
    else if (v >= 1000000u)
        snprintf(buf, 32, "%.1f MB", v / 1e6);
    else
        snprintf(buf, 32, "%.0f KB", v / 1e3);
    return buf;
}

static int is_sluice(const bench_config *c)
{
    return c->mode == BM_STREAM || c->mode == BM_RANDOM || c->mode == BM_PROC_STREAM ||
           c->mode == BM_VERIFY || c->mode == BM_PROC_VERIFY;
}

/* The first successful run of a row, for the fields that do not vary
 * (backend), or NULL. */
static const bench_result *first_ok(const bench_row *row)
{
    for (size_t i = 0; i < row->nruns; i++)
        if (row->runs[i].ok)
            return &row->runs[i];
    return NULL;
}

static void fmt_num(char *buf, size_t size, double v, int decimals)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.*f", decimals, v);
}

/* "med [min-max]" with the decimals given, or "-". */
static void fmt_range(char *buf, size_t size, const bench_row *row, size_t field, int dec)
{
    double med, mn, mx;
    if (!bench_stat(row, field, &med, &mn, &mx))
        snprintf(buf, size, "-");
    else if (row->nruns > 1)
        snprintf(buf, size, "%.*f [%.*f-%.*f]", dec, med, dec, mn, dec, mx);
    else
        snprintf(buf, size, "%.*f", dec, med);
}

/* A verified sluice run's GB/s over baseline (e), or NAN. */
static double ratio_e(const bench_summary *s, const bench_config *c, double gbps)
{
    return is_sluice(c) && c->verify && s->copy_hash > 0 ? gbps / s->copy_hash : NAN;
}

static double median_of(const bench_row *row, size_t field)
{
    double med, mn, mx;
    bench_stat(row, field, &med, &mn, &mx);
    return med;
}

/* The spread of every row's wall time over its runs, and the verify rows
 * next to baseline (f): whole processes are noisier than in-process runs. */
static void print_spread(FILE *out, const bench_summary *s, const bench_row *rows, size_t nrows)
{
    if (s->nruns < 3)
        return;
    int w = 6;
    for (size_t r = 0; r < nrows; r++)
        if ((int)strlen(rows[r].cfg.label) > w)
            w = (int)strlen(rows[r].cfg.label);
    fprintf(out, "\nspread over %zu runs (* = whole process: fork to exit, no untimed pass)\n",
            s->nruns);
    fprintf(out, "%-*s  %-9s  %8s  %8s  %8s  %9s  %8s  %7s\n", w, "config", "mode", "p10 s",
            "p50 s", "p90 s", "p90/p50", "GB/s p50", "vs (f)");
    for (size_t r = 0; r < nrows; r++) {
        const bench_row *row = &rows[r];
        double p10 = bench_quantile(row, FIELD(wall_s), 0.1);
        double p50 = bench_quantile(row, FIELD(wall_s), 0.5);
        double p90 = bench_quantile(row, FIELD(wall_s), 0.9);
        double g = median_of(row, FIELD(gbps));
        if (isnan(p50))
            continue;
        char vs_f[24];
        int verifying = row->cfg.mode == BM_VERIFY || row->cfg.mode == BM_PROC_VERIFY;
        fmt_num(vs_f, sizeof vs_f, verifying && s->py_verify > 0 ? g / s->py_verify : NAN, 2);
        fprintf(out, "%-*s  %-9s  %8.3f  %8.3f  %8.3f  %9.2f  %8.2f  %7s\n", w, row->cfg.label,
                mode_name(row->cfg.mode), p10, p50, p90, p90 / p50, g, vs_f);
    }
}

void bench_print_table(FILE *out, const bench_summary *s, const bench_row *rows, size_t nrows)
{
    const bench_model *m = s->model;
    char hb[32];
    fprintf(out, "sluice bench: %s\n", m->path);
    fprintf(out, "model: %zu tensors, %s of tensors in %zu file%s; %s; median of %zu run%s%s;"
                 " %d online CPU%s\n",
            m->ntensors, human(m->tensor_bytes, hb), m->nfiles, m->nfiles == 1 ? "" : "s",
            s->cold ? "cold (page cache dropped before every run)"
                    : "warm (page cache filled by an untimed pass)",
            s->nruns, s->nruns == 1 ? "" : "s", s->nruns > 1 ? " [min-max]" : "", s->ncpu,
            s->ncpu == 1 ? "" : "s");
    if (s->fixed_len)
        fprintf(out, "sluice runs: %s\n", s->fixed);
    if (s->io_ceiling > 0 || s->sha_core > 0) {
        fprintf(out, "ceilings: I/O (a) %.2f GB/s; SHA-256 (c) %.2f GB/s per core x %d = %.2f GB/s;"
                     " verified load: min of the two = %.2f GB/s\n",
                s->io_ceiling, s->sha_core, s->ncpu, s->sha_core * s->ncpu,
                s->sha_core > 0 && s->sha_core * s->ncpu < s->io_ceiling ? s->sha_core * s->ncpu
                                                                         : s->io_ceiling);
        if (s->fio > 0)
            fprintf(out, "fio (d): %.2f GB/s (O_DIRECT, io_uring, the configuration's chunk and "
                         "qd); sluice O_DIRECT runs are compared with it (verify on: with the "
                         "smaller of it and CPUs x (c))\n", s->fio);
        if (s->fio_verify > 0)
            fprintf(out, "fio (d) at sluice_verify's blocks: %.2f GB/s\n", s->fio_verify);
        if (s->py_verify > 0)
            fprintf(out, "python verifier (f): %.2f GB/s, whole process\n", s->py_verify);
        if (s->copy_hash > 0 && s->sha_core > 0)
            fprintf(out, "copy + hash (e): %.2f GB/s = %.2f x CPUs x (c): the most a load that "
                         "copies the bytes out of the page cache and hashes them reaches here\n",
                    s->copy_hash, s->copy_hash / (s->ncpu * s->sha_core));
        fprintf(out, "ratio: GB/s over the ceiling that applies (verify off: I/O; verify on: "
                     "verified load)%s\n", s->copy_hash > 0 ? "; vs (e): verified runs over (e)" : "");
    }
    fprintf(out, "\n");

    int w = 6;
    for (size_t r = 0; r < nrows; r++)
        if ((int)strlen(rows[r].cfg.label) > w)
            w = (int)strlen(rows[r].cfg.label);
    fprintf(out, "%-*s  %-8s  %-22s  %-22s  %8s  %8s  %8s  %6s  %7s  %9s  %-8s  %5s  %6s\n", w,
            "config", "mode", "wall s", "GB/s", "first ms", "p50 ms", "p99 ms", "cpu s",
            "rss MB", "read/need", "backend", "ratio", "vs (e)");
    for (size_t r = 0; r < nrows; r++) {
        const bench_row *row = &rows[r];
        const bench_result *ok = first_ok(row);
        fprintf(out, "%-*s  %-8s  ", w, row->cfg.label, mode_name(row->cfg.mode));
        if (!ok) {
            fprintf(out, "FAILED: %s\n", row->nruns ? row->runs[0].err : "not run");
            continue;
        }
        char wall[48], gbps[48], first[24], p50[24], p99[24], cpu[24], rss[24], rn[24], ratio[24],
            vs_e[24];
        fmt_range(wall, sizeof wall, row, FIELD(wall_s), 3);
        fmt_range(gbps, sizeof gbps, row, FIELD(gbps), 2);
        fmt_num(first, sizeof first, median_of(row, FIELD(first_ms)), 1);
        fmt_num(p50, sizeof p50, median_of(row, FIELD(p50_ms)), 1);
        fmt_num(p99, sizeof p99, median_of(row, FIELD(p99_ms)), 1);
        fmt_num(cpu, sizeof cpu, median_of(row, FIELD(cpu_s)), 2);
        fmt_num(rss, sizeof rss, median_of(row, FIELD(peak_rss_mb)), 0);
        if (row->cfg.mode == BM_SHA_MEM || !ok->bytes_needed)
            snprintf(rn, sizeof rn, "-");
        else
            snprintf(rn, sizeof rn, "%.3f", (double)ok->bytes_read / (double)ok->bytes_needed);
        double g = median_of(row, FIELD(gbps));
        fmt_num(ratio, sizeof ratio, row->ratio_base > 0 ? g / row->ratio_base : NAN, 2);
        fmt_num(vs_e, sizeof vs_e, ratio_e(s, &row->cfg, g), 2);
        fprintf(out, "%-22s  %-22s  %8s  %8s  %8s  %6s  %7s  %9s  %-8s  %5s  %6s", wall, gbps,
                first, p50, p99, cpu, rss, rn, backend_name(ok->backend), ratio, vs_e);
        size_t failed = 0;
        for (size_t i = 0; i < row->nruns; i++)
            failed += !row->runs[i].ok;
        if (failed)
            fprintf(out, "  (%zu of %zu runs failed)", failed, row->nruns);
        if (ok->tensors_refused)
            fprintf(out, "\n%*s  %u tensor(s) refused, figures without them: %s", w, "",
                    (unsigned)ok->tensors_refused, ok->err);
        fprintf(out, "\n");
    }
    print_spread(out, s, rows, nrows);
}

/* ---------------------------------------------------------------- CSV */

static void csv_str(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double v, int dec)
{
    if (!isnan(v))
        fprintf(f, "%.*f", dec, v);
}

int bench_write_csv(const char *path, const bench_summary *s, const bench_row *rows, size_t nrows)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "sluice bench: --csv %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "config,mode,run,pool,qd,chunk,direct,verify,wall_s,gbps,first_ms,p50_ms,p99_ms,"
               "cpu_s,peak_rss_mb,bytes_read,bytes_needed,backend,ratio,ratio_e,"
               "open_ms,bytes_hashed,direct_fallbacks,requested_backend,cold,ok,error\n");
    for (size_t r = 0; r < nrows; r++) {
        const bench_config *c = &rows[r].cfg;
        for (size_t k = 0; k < rows[r].nruns; k++) {
            const bench_result *res = &rows[r].runs[k];
            csv_str(f, config_name(c));
            fprintf(f, ",%s,%zu,", mode_name(c->mode), k + 1);
            if (is_sluice(c))
                fprintf(f, "%llu,%u,%llu,%s,", (unsigned long long)c->pool, c->qd,
                        (unsigned long long)c->chunk, c->direct ? "on" : "off");
            else
                fprintf(f, ",,,,");
            fprintf(f, "%s,", c->verify ? "on" : "off");
            int ok = res->ok;
            csv_num(f, ok ? res->wall_s : NAN, 6);
            fputc(',', f);
            csv_num(f, ok ? res->gbps : NAN, 4);
            fputc(',', f);
            csv_num(f, ok ? res->first_ms : NAN, 3);
            fputc(',', f);
            csv_num(f, ok ? res->p50_ms : NAN, 3);
            fputc(',', f);
            csv_num(f, ok ? res->p99_ms : NAN, 3);
            fputc(',', f);
            csv_num(f, res->cpu_s, 3);
            fputc(',', f);
            csv_num(f, res->peak_rss_mb, 1);
            fprintf(f, ",%llu,%llu,%s,", (unsigned long long)res->bytes_read,
                    (unsigned long long)res->bytes_needed, backend_name(res->backend));
            csv_num(f, ok && rows[r].ratio_base > 0 ? res->gbps / rows[r].ratio_base : NAN, 4);
            fputc(',', f);
            csv_num(f, ok ? ratio_e(s, c, res->gbps) : NAN, 4);
            fputc(',', f);
            csv_num(f, ok ? res->open_ms : NAN, 3);
            fprintf(f, ",%llu,%llu,%s,%d,%d,", (unsigned long long)res->bytes_hashed,
                    (unsigned long long)res->direct_fallbacks,
                    is_sluice(c) ? (c->force_pread ? "pread" : "auto") : "", s->cold, ok);
            csv_str(f, res->err);
            fputc('\n', f);
        }
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "sluice bench: --csv %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- plot */

int bench_have_program(const char *name)
{
    const char *env = getenv("PATH");
    if (!env || !*env)
        env = "/usr/local/bin:/usr/bin:/bin";
    char *copy = strdup(env), *save = NULL;
    int found = 0;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d && !found;
         d = strtok_r(NULL, ":", &save)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", *d ? d : ".", name);
        found = access(path, X_OK) == 0;
    }
    free(copy);
    return found;
}

/* The x label of a configuration: only the parameters that were swept
 * ("pool=256M qd=8"), or "default" when nothing was. */
static void xlabel(char *out, size_t size, const bench_summary *s, const bench_config *c)
{
    size_t len = 0;
    out[0] = '\0';
    char copy[sizeof c->label];
    snprintf(copy, sizeof copy, "%s", c->label);
    char *save = NULL;
    for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        for (size_t k = 0; k < s->nswept; k++) {
            size_t n = strlen(s->swept[k]);
            if (!strncmp(tok, s->swept[k], n) && tok[n] == '=' && len < size)
                len += (size_t)snprintf(out + len, size - len, "%s%s", len ? " " : "",
                                        s->nswept == 1 ? tok + n + 1 : tok);
        }
    }
    if (!out[0])
        snprintf(out, size, "default");
}

/* Writes s into a gnuplot single-quoted string (quotes doubled). */
static void gp_quoted(FILE *g, const char *s)
{
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', g);
        fputc(*s == '\n' ? ' ' : *s, g);
    }
    fputc('\'', g);
}

int bench_plot(const char *path, const bench_summary *s, const bench_row *rows, size_t nrows)
{
    /* One series of bars per mode: x is the configuration's position (a
     * stream and its random twin side by side), against the ceilings. */
    int have[2] = {0, 0};
    for (size_t r = 0; r < nrows; r++) {
        if (is_sluice(&rows[r].cfg) && first_ok(&rows[r]))
            have[rows[r].cfg.mode == BM_RANDOM] = 1;
    }
    double pread_sha = NAN;
    for (size_t r = 0; r < nrows; r++)
        if (rows[r].cfg.mode == BM_PREAD_SHA)
            pread_sha = median_of(&rows[r], FIELD(gbps));

    FILE *g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "sluice bench: --plot: cannot run gnuplot: %s\n", strerror(errno));
        return -1;
    }
    fprintf(g, "set terminal pngcairo size 1200,700 noenhanced font ',10'\nset output ");
    gp_quoted(g, path);
    char title[512], hb[32];
    snprintf(title, sizeof title, "sluice bench: %s (%zu tensors, %s), %s, median of %zu "
             "run%s (bars: min to max)", s->model->path, s->model->ntensors,
             human(s->model->tensor_bytes, hb), s->cold ? "cold" : "warm", s->nruns,
             s->nruns == 1 ? "" : "s");
    fprintf(g, "\nset title ");
    gp_quoted(g, title);
    fprintf(g, "\nset ylabel 'GB/s'\nset yrange [0:*]\nset grid ytics\n"
               "set key outside bottom center horizontal\nset xtics rotate by -25\n"
               "set xrange [-0.5:%.1f]\n", s->nconf ? s->nconf - 0.5 : 0.5);
    char xl[256] = "configuration";
    if (s->nswept) {
        size_t len = 0;
        for (size_t k = 0; k < s->nswept; k++)
            len += (size_t)snprintf(xl + len, sizeof xl - len, "%s%s", k ? ", " : "",
                                    s->swept[k]);
    }
    fprintf(g, "set xlabel ");
    gp_quoted(g, xl);
    fputc('\n', g);
    static const char *const names[2] = {"stream", "random"};
    for (int md = 0; md < 2; md++) {
        if (!have[md])
            continue;
        fprintf(g, "$%s << EOD\n", names[md]);
        size_t x = 0;
        for (size_t r = 0; r < nrows; r++) {
            const bench_config *c = &rows[r].cfg;
            if (!is_sluice(c))
                continue;
            if ((c->mode == BM_RANDOM) == md) {
                double med, mn, mx;
                char label[200];
                xlabel(label, sizeof label, s, c);
                for (char *p = label; *p; p++)
                    if (*p == '"')
                        *p = '\'';
                double shift = have[0] && have[1] ? (md ? 0.2 : -0.2) : 0.0;
                if (bench_stat(&rows[r], FIELD(gbps), &med, &mn, &mx))
                    fprintf(g, "%.2f %.4f %.4f %.4f \"%s\"\n", (double)x + shift, med, mn, mx, label);
            }
            if (c->mode == BM_STREAM && r + 1 < nrows && rows[r + 1].cfg.mode == BM_RANDOM)
                continue; /* its random twin shares the x */
            x++;
        }
        fprintf(g, "EOD\n");
    }
    fprintf(g, "set boxwidth %.2f\nset style fill solid 0.5 border -1\nset style data boxerrorbars\n"
               "set errorbars small\nplot ", have[0] && have[1] ? 0.38 : 0.6);
    const char *sep = "";
    for (int md = 0; md < 2; md++) {
        if (!have[md])
            continue;
        fprintf(g, "%s$%s using 1:2:3:4:(%.2f):xticlabels(5) with boxerrorbars lw 1 "
                   "title 'sluice %s (median, bars min to max)'", sep, names[md],
                have[0] && have[1] ? 0.38 : 0.6, names[md]);
        sep = ", ";
    }
    if (s->io_ceiling > 0) {
        fprintf(g, "%s%.4f with lines dt 2 lw 2 title '(a) I/O ceiling: seq pread %.2f GB/s'",
                sep, s->io_ceiling, s->io_ceiling);
        sep = ", ";
    }
    if (s->sha_core > 0) {
        fprintf(g, "%s%.4f with lines dt 3 lw 2 title '(c) SHA-256 x %d CPUs: %.2f GB/s'", sep,
                s->sha_core * s->ncpu, s->ncpu, s->sha_core * s->ncpu);
        sep = ", ";
    }
    if (!isnan(pread_sha)) {
        fprintf(g, "%s%.4f with lines dt 4 lw 2 title '(b) pread+SHA-256, 1 thread: %.2f GB/s'",
                sep, pread_sha, pread_sha);
        sep = ", ";
    }
    if (s->copy_hash > 0) {
        fprintf(g, "%s%.4f with lines dt 5 lw 2 title '(e) pread+SHA-256, %d threads: %.2f GB/s'",
                sep, s->copy_hash, s->ncpu, s->copy_hash);
        sep = ", ";
    }
    if (!*sep) /* nothing measured: an empty chart says so */
        fprintf(g, "NaN title 'no successful run'");
    fprintf(g, "\n");
    int st = pclose(g);
    if (st != 0) {
        fprintf(stderr, "sluice bench: --plot: gnuplot failed (status %d); no chart written\n",
                st);
        return -1;
    }
    fprintf(stderr, "sluice bench: chart written to %s\n", path);
    return 0;
}
