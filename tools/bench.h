/* bench.h: `sluice bench`, shared between its parts.
 *
 *   bench.c         options, the schedule of runs, medians
 *   bench_run.c     one measured run, in a child process of its own
 *   bench_report.c  the table, the CSV and the gnuplot chart
 */
#ifndef SLUICE_TOOLS_BENCH_H
#define SLUICE_TOOLS_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What the baselines need of the model, taken from its index once. */
typedef struct bench_tensor {
    size_t file;
    uint64_t offset;         /* absolute, in its file */
    uint64_t nbytes;
} bench_tensor;

typedef struct bench_model {
    const char *path;        /* as given: what sluice_open is called with */
    size_t nfiles;
    char **files;
    uint64_t *file_sizes;
    size_t ntensors;
    bench_tensor *tensors;   /* model order: file, then offset */
    uint64_t tensor_bytes;   /* what a load needs */
    uint64_t file_bytes;     /* what a whole-file read reads */
    uint64_t max_tensor;
} bench_model;

typedef enum bench_mode {
    BM_STREAM,               /* sluice_stream over every tensor */
    BM_RANDOM,               /* sluice_acquire of every tensor, random order */
    BM_SEQ,                  /* baseline (a): sequential pread, 8 MiB, no hashing */
    BM_PREAD_SHA,            /* baseline (b): pread + SHA-256 per tensor, one thread */
    BM_SHA_MEM,              /* baseline (c): SHA-256 of memory, one thread, 16 MiB */
    BM_PREAD_SHA_PAR,        /* baseline (e): pread + SHA-256, a thread per online CPU,
                                largest tensor first, one reused 8 MiB buffer each */
    BM_FIO,                  /* baseline (d), --cold with fio on PATH: fio io_uring,
                                O_DIRECT, the config's chunk as block size and its
                                qd as depth, the model's files */
    BM_VERIFY,               /* sluice_verify of every tensor (verify-only path) */
    BM_PY_VERIFY,            /* baseline (f), whole process: /usr/bin/python3 with
                                mmap + hashlib.sha256 on a thread per CPU
                                (tools/perf/py_verify.py) */
    BM_PROC_VERIFY,          /* whole process: `sluice verify PATH` exec'd */
    BM_CURL,                 /* baseline (a) of a remote model: `curl -s -o /dev/null`
                                of every file's bytes, split in as many ranges as
                                the library's remote connections (8), all at once */
    BM_PROC_STREAM           /* whole process: a fresh process that opens, streams
                                every tensor once and exits; no untimed pass */
} bench_mode;

/* Whether a mode is timed as a whole process (fork to exit) rather than
 * in-process after an untimed pass. */
int bench_whole_process(bench_mode mode);

typedef struct bench_config {
    bench_mode mode;
    /* sluice runs only */
    uint64_t pool, chunk;
    uint32_t qd;
    int direct, verify, force_pread;
    int algorithm;           /* sluice_algorithm of a verified run's manifest */
    char label[160];         /* "pool=1G qd=32 ..." or the baseline's name */
} bench_config;

typedef struct bench_result {
    int ok;
    char err[384];
    double wall_s, open_ms, first_ms, p50_ms, p99_ms; /* NAN when not measured */
    double cpu_s, peak_rss_mb, gbps;
    uint64_t bytes_read, bytes_needed, bytes_hashed, direct_fallbacks;
    int backend;             /* sluice_backend; -1 for a baseline */
    uint32_t tensors_refused; /* larger than the pool: skipped, err names the first */
} bench_result;

typedef struct bench_opts {
    const char *manifest;    /* NULL: the sidecar */
    const char *manifest_blake3; /* the BLAKE3 manifest the bench wrote, for
                                   --algorithm blake3; NULL: none */
    const char *manifest_found; /* the manifest verify on uses (for (f)); NULL: none */
    uint64_t seed;           /* random order */
    int cold;
    int remote;              /* PATH is a URL (http(s)://, s3://): no file is read
                                directly, baseline (a) is curl */
    int metrics_port;        /* >= 0: each sluice run serves its model's metrics
                                there while it runs (0: any free port); -1: no */
} bench_opts;

/* Runs c once in a forked child and fills *r (r->ok says whether it
 * worked; r->err why not). Returns 0, or -1 when no child could be made. */
int bench_run(const bench_model *m, const bench_config *c, const bench_opts *o,
              bench_result *r);

/* Writes the version 2 BLAKE3 manifest of the model at path to out, no
 * chunk digests, by running `sluice manifest` (this very executable). Returns 0, or -1 after
 * a message on stderr. */
int bench_write_blake3_manifest(const char *path, const char *out);

/* Drops the page cache of the model's files (fdatasync, then
 * POSIX_FADV_DONTNEED). Returns the fraction of pages still resident
 * afterwards (0..1), or a negative value when it cannot tell. */
double bench_drop_cache(const bench_model *m);

/* Seconds on the monotonic clock. */
double bench_now(void);

/* "256M", "1G", "4K", "1536" for a byte count. */
const char *bench_size(uint64_t v, char buf[32]);

/* A row of the report: one configuration and mode, all its runs. */
typedef struct bench_row {
    bench_config cfg;
    bench_result *runs;      /* nruns of them */
    size_t nruns;
    double ratio_base;       /* the ceiling its ratio is taken to (GB/s); 0: none */
} bench_row;

typedef struct bench_summary {
    const bench_model *model;
    int cold, ncpu;
    size_t nruns;
    double io_ceiling;       /* median GB/s of baseline (a); 0 when not run */
    double sha_core;         /* median GB/s of baseline (c); 0 when not run */
    double fio;              /* median GB/s of baseline (d); 0 when not run */
    double copy_hash;        /* median GB/s of baseline (e); 0 when not run */
    double fio_verify;       /* median GB/s of fio at sluice_verify's O_DIRECT block and
                                depth; 0 when not run */
    double py_verify;        /* median GB/s of baseline (f); 0 when not run */
    const char *swept[8];    /* names of the parameters that take several values */
    size_t nswept;
    char fixed[200];         /* the parameters that take one value: "qd=32 ..." */
    size_t fixed_len;
    size_t nconf;            /* sluice configurations (x positions of the chart) */
} bench_summary;

/* The median of a field over a row's successful runs, with min and max;
 * returns the number of runs that had the field (not NAN). */
size_t bench_stat(const bench_row *row, size_t field_offset, double *med, double *min,
                  double *max);
/* The q-quantile (0..1, nearest rank) of a field over a row's successful
 * runs; NAN when none. */
double bench_quantile(const bench_row *row, size_t field_offset, double q);

/* The O_DIRECT block sluice_verify reads with on threads threads, and the
 * blocks it keeps in flight per thread (as sluice.h documents). */
void bench_verify_shape(unsigned threads, uint64_t *block, unsigned *depth);

void bench_print_table(FILE *out, const bench_summary *s, const bench_row *rows, size_t nrows);
int bench_write_csv(const char *path, const bench_summary *s, const bench_row *rows,
                    size_t nrows);
/* Draws GB/s per configuration with gnuplot. Returns 0 or -1 (said on stderr). */
int bench_plot(const char *path, const bench_summary *s, const bench_row *rows, size_t nrows);
/* Whether an executable of that name is on PATH. */
int bench_have_program(const char *name);

#endif
