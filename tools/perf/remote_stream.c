/* remote_stream.c: one timed sluice_stream of a whole model (local or
 * remote), for the remote-loading figures in README.md ("Remote models
 * and mirrors"). Not built by CMake; build it by hand against a build:
 *
 *   cc -O2 -Iinclude tools/perf/remote_stream.c -o remote_stream \
 *      -Lbuild -lsluice -Wl,-rpath,$PWD/build
 *   ./remote_stream LOCATION VERIFY CONNECTIONS [FALLBACK]
 *
 * VERIFY 1: the manifest with policy REQUIRE, 0: verify OFF. Prints the
 * open time, the time to the first tensor delivered, the total, the
 * throughput, the counters that tell where the bytes came from, and the
 * peak RSS (getrusage). Pool 1 GiB. */
#include <sluice.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static double t0, first = -1;
static unsigned long long bytes;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int on_tensor(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    (void)user;
    if (status) {
        fprintf(stderr, "%s: %s\n", info->name, message);
        return status;
    }
    if (first < 0)
        first = now() - t0;
    bytes += sluice_tensor_size(t);
    sluice_release(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s LOCATION VERIFY(0|1) CONNECTIONS [FALLBACK]\n", argv[0]);
        return 2;
    }
    sluice_options o;
    sluice_options_init(&o);
    o.verify = atoi(argv[2]) ? SLUICE_VERIFY_REQUIRE : SLUICE_VERIFY_OFF;
    o.remote_connections = (uint32_t)atoi(argv[3]);
    o.pool_bytes = 1ull << 30;
    const char *fallback[1];
    if (argc > 4) {
        fallback[0] = argv[4];
        o.fallback = fallback;
        o.fallback_count = 1;
    }
    t0 = now();
    sluice_model *m;
    int rc = sluice_open(argv[1], &o, &m);
    if (rc) {
        fprintf(stderr, "%s\n", sluice_errmsg(m));
        sluice_close(m);
        return 1;
    }
    double t_open = now() - t0;
    rc = sluice_stream(m, NULL, 0, on_tensor, NULL);
    double total = now() - t0;
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("rc=%d open %.3f s first tensor %.3f s total %.3f s %.3f GB/s verified %llu "
           "remote_bytes %llu retries %llu fallback_tensors %llu peak RSS %ld MiB\n",
           rc, t_open, first, total, (double)bytes / total / 1e9,
           (unsigned long long)st.tensors_verified, (unsigned long long)st.remote_bytes,
           (unsigned long long)st.remote_retries, (unsigned long long)st.fallback_tensors,
           ru.ru_maxrss / 1024);
    sluice_close(m);
    return rc ? 1 : 0;
}
