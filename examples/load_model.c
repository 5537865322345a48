/* load_model.c: open a model, stream every tensor through the verified
 * pipeline, and say what happened.
 *
 *   load_model MODEL [POOL_MIB]
 *
 * MODEL is a .safetensors file, a directory of them, or an index.json.
 * When a manifest sits beside it (see sluice_open), every tensor is
 * checked against its digest (SHA-256, or BLAKE3 when the manifest says
 * so) before this program sees a byte of it.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <sluice.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct tally {
    size_t ok, failed;
    uint64_t bytes;
    double first_ms;
    struct timespec start;
};

static double ms_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) * 1e3 + (double)(now.tv_nsec - start->tv_nsec) / 1e6;
}

/* Called once per tensor, as soon as it is read and verified. */
static int on_tensor(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    struct tally *tally = user;
    if (status != SLUICE_OK) {
        /* a failure concerns this tensor only; the stream goes on */
        printf("  FAILED %s: %s\n", sluice_strerror(status), message);
        tally->failed++;
        return 0;
    }
    if (tally->ok + tally->failed == 0)
        tally->first_ms = ms_since(&tally->start);
    tally->ok++;
    tally->bytes += sluice_tensor_size(t);
    (void)info; /* an engine would copy sluice_tensor_data(t) to its device here */
    sluice_release(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODEL [POOL_MIB]\n", argv[0]);
        return 2;
    }
    sluice_options opts;
    sluice_options_init(&opts);
    if (argc == 3)
        opts.pool_bytes = strtoull(argv[2], NULL, 10) << 20;

    sluice_model *model = NULL;
    int rc = sluice_open(argv[1], &opts, &model);
    if (rc != SLUICE_OK) {
        /* the model carries the detail even when open failed */
        fprintf(stderr, "cannot open %s: %s\n", argv[1], sluice_errmsg(model));
        sluice_close(model);
        return 1;
    }
    const char *manifest = sluice_manifest_path(model);
    printf("opened %s: %zu tensors in %zu file(s); manifest: %s\n", argv[1], sluice_count(model),
           sluice_file_count(model), manifest ? manifest : "none (nothing verified)");

    struct tally tally = {0};
    clock_gettime(CLOCK_MONOTONIC, &tally.start);
    rc = sluice_stream(model, NULL, 0, on_tensor, &tally); /* NULL: every tensor */
    double ms = ms_since(&tally.start);

    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(model, &st);
    printf("streamed %zu tensors, %llu bytes in %.1f ms (%.2f GB/s), first tensor after %.2f ms\n",
           tally.ok, (unsigned long long)tally.bytes, ms, ms > 0 ? (double)tally.bytes / ms / 1e6 : 0.0,
           tally.first_ms);
    printf("verified %llu of %zu tensors with %s, %zu failed; %llu reads, backend %s, "
           "pool high water %llu of %llu bytes\n",
           (unsigned long long)st.tensors_verified, sluice_count(model),
           sluice_digest_algorithm(model) == SLUICE_ALG_BLAKE3 ? "BLAKE3" : "SHA-256", tally.failed,
           (unsigned long long)st.reads, st.backend == SLUICE_BACKEND_IO_URING ? "io_uring" : "pread",
           (unsigned long long)st.pool_high_water, (unsigned long long)st.pool_bytes);
    sluice_close(model);
    return rc == SLUICE_OK ? 0 : 1;
}
