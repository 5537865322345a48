/* remote_verify.c: sluice_verify of one model (local or remote), timed,
 * for the "One verify reader" figures of docs/performance.md. Not built
 * by CMake; build it by hand against a build:
 *
 *   cc -O2 -Iinclude tools/perf/remote_verify.c -o remote_verify \
 *      -Lbuild -lsluice -Wl,-rpath,$PWD/build
 *   ./remote_verify LOCATION RUNS [CA_FILE|-] [files]
 *
 * One untimed verify, then RUNS timed ones in the same process (the
 * model opened once). "files": the whole files only (SLUICE_VF_FILES |
 * SLUICE_VF_NO_TENSORS). Prints a line per timed run: seconds,
 * bytes_hashed, the threads that worked, the remote requests it made
 * (sluice_stats' remote_reads before and after). */
#include <sluice.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s LOCATION RUNS [CA_FILE|-] [files]\n", argv[0]);
        return 2;
    }
    sluice_options o;
    sluice_options_init(&o);
    if (argc > 3 && strcmp(argv[3], "-") != 0)
        o.remote_ca_file = argv[3];
    int files = argc > 4 && strcmp(argv[4], "files") == 0;
    sluice_model *m = NULL;
    if (sluice_open(argv[1], &o, &m) != SLUICE_OK) {
        fprintf(stderr, "open: %s\n", sluice_errmsg(m));
        sluice_close(m);
        return 1;
    }
    int runs = atoi(argv[2]);
    for (int r = -1; r < runs; r++) {
        struct sluice_stats s0 = {.size = sizeof s0}, s1 = {.size = sizeof s1};
        sluice_verify_options vo;
        sluice_verify_options_init(&vo);
        if (files)
            vo.flags = SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS;
        struct sluice_verify_report rep = {.size = sizeof rep};
        sluice_stats(m, &s0);
        double t0 = now();
        int rc = sluice_verify(m, NULL, 0, &vo, &rep);
        double t1 = now();
        sluice_stats(m, &s1);
        if (rc != SLUICE_OK) {
            fprintf(stderr, "verify: %s\n", sluice_errmsg(m));
            sluice_close(m);
            return 1;
        }
        if (r >= 0)
            printf("%.4f %llu %u %llu\n", t1 - t0, (unsigned long long)rep.bytes_hashed,
                   rep.threads, (unsigned long long)(s1.remote_reads - s0.remote_reads));
    }
    sluice_close(m);
    return 0;
}
