/* pinned_upload.c: the pattern an inference engine uses to move verified
 * weights into device memory: a few fixed staging buffers (pinned host
 * memory on a GPU machine), each filled by sluice_read_into with bytes
 * that are verified before the call returns, then handed to an
 * asynchronous copy while the next buffer fills.
 *
 *   pinned_upload MODEL [STAGING_MIB]
 *
 * A tensor larger than a staging buffer goes through in pieces; with a
 * version 2 manifest that has chunk digests ("sluice manifest --chunk"),
 * each piece reads and verifies only the chunks it covers (make the
 * staging buffer a multiple of the chunk size for no waste); without,
 * every piece reads and checks its whole tensor, so give it chunk
 * digests. No pool room is needed: the library reads straight into the
 * staging buffer. With -DSLUICE_EXAMPLE_CUDA (and CUDA's headers and
 * libraries) the buffers are pinned with cudaHostAlloc and the copies are
 * cudaMemcpyAsync on two streams; without, the "upload" is a memcpy into
 * a host array standing in for device memory, so it builds anywhere.
 */
#include <sluice.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SLUICE_EXAMPLE_CUDA
#include <cuda_runtime.h>
#endif

#define NBUF 2

typedef struct staging {
    unsigned char *host;     /* pinned on a GPU machine */
#ifdef SLUICE_EXAMPLE_CUDA
    cudaStream_t stream;     /* its copy runs here; waited on before refilling */
#endif
} staging;

static int staging_init(staging *s, size_t bytes)
{
#ifdef SLUICE_EXAMPLE_CUDA
    if (cudaHostAlloc((void **)&s->host, bytes, cudaHostAllocDefault) != cudaSuccess)
        return -1;
    return cudaStreamCreate(&s->stream) == cudaSuccess ? 0 : -1;
#else
    s->host = malloc(bytes);
    return s->host ? 0 : -1;
#endif
}

static void staging_free(staging *s)
{
#ifdef SLUICE_EXAMPLE_CUDA
    cudaStreamDestroy(s->stream);
    cudaFreeHost(s->host);
#else
    free(s->host);
#endif
}

/* The buffer is about to be refilled: its last copy must be done. */
static void staging_wait(staging *s)
{
#ifdef SLUICE_EXAMPLE_CUDA
    cudaStreamSynchronize(s->stream);
#else
    (void)s;
#endif
}

/* Starts the copy of n verified bytes to device + offset. Returns 0, or
 * -1 when the copy cannot start. */
static int upload(staging *s, unsigned char *device, uint64_t offset, size_t n)
{
#ifdef SLUICE_EXAMPLE_CUDA
    return cudaMemcpyAsync(device + offset, s->host, n, cudaMemcpyHostToDevice, s->stream) ==
                   cudaSuccess
               ? 0
               : -1;
#else
    memcpy(device + offset, s->host, n);
    return 0;
#endif
}

/* Memory for one tensor on the device (a host array without CUDA). */
static unsigned char *device_alloc(size_t bytes)
{
#ifdef SLUICE_EXAMPLE_CUDA
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
#else
    return malloc(bytes);
#endif
}

static void device_free(unsigned char *p)
{
#ifdef SLUICE_EXAMPLE_CUDA
    cudaFree(p);
#else
    free(p);
#endif
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODEL [STAGING_MIB]\n", argv[0]);
        return 2;
    }
    size_t staging_bytes = (size_t)(argc > 2 ? strtoull(argv[2], NULL, 10) : 16) << 20;
    if (!staging_bytes) {
        fprintf(stderr, "%s: STAGING_MIB must be at least 1\n", argv[0]);
        return 2;
    }
    sluice_model *m = NULL;
    if (sluice_open(argv[1], NULL, &m) != SLUICE_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], m ? sluice_errmsg(m) : "out of memory");
        sluice_close(m);
        return 1;
    }
    staging buf[NBUF];
    int nbuf = 0, status = 0;
    for (; nbuf < NBUF; nbuf++)
        if (staging_init(&buf[nbuf], staging_bytes) < 0) {
            fprintf(stderr, "%s: cannot make a %zu-byte staging buffer\n", argv[0], staging_bytes);
            status = 1;
            goto out;
        }
    uint64_t total = 0, pieces = 0;
    int next = 0;
    for (size_t i = 0; i < sluice_count(m) && !status; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &ti);
        /* device memory of the tensor (cudaMalloc on a GPU machine) */
        unsigned char *device = device_alloc(ti.nbytes ? (size_t)ti.nbytes : 1);
        if (!device) {
            fprintf(stderr, "%s: out of memory for %s\n", argv[0], ti.name);
            status = 1;
            break;
        }
        for (uint64_t at = 0; at < ti.nbytes; at += staging_bytes) {
            size_t n = ti.nbytes - at < staging_bytes ? (size_t)(ti.nbytes - at) : staging_bytes;
            staging *s = &buf[next];
            next = (next + 1) % NBUF;
            staging_wait(s);
            /* every byte in s->host is verified when this returns OK */
            if (sluice_read_into(m, ti.name, at, s->host, n) != SLUICE_OK) {
                fprintf(stderr, "%s: %s\n", argv[0], sluice_errmsg(m));
                status = 1;
                break;
            }
            if (upload(s, device, at, n) < 0) {
                fprintf(stderr, "%s: cannot copy %s to the device\n", argv[0], ti.name);
                status = 1;
                break;
            }
            pieces++;
        }
        for (int k = 0; k < NBUF; k++)
            staging_wait(&buf[k]);
        total += ti.nbytes;
        device_free(device);
    }
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    printf("%zu tensors, %llu bytes uploaded in %llu pieces through %d staging buffers of %zu "
           "bytes; %llu bytes read, %llu hashed, %llu chunks verified (%s manifest: %s)\n",
           sluice_count(m), (unsigned long long)total, (unsigned long long)pieces, NBUF,
           staging_bytes, (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_hashed,
           (unsigned long long)st.chunks_verified,
           sluice_algorithm_name(sluice_digest_algorithm(m)),
           sluice_manifest_path(m) ? sluice_manifest_path(m) : "none");
out:
    for (int k = 0; k < nbuf; k++)
        staging_free(&buf[k]);
    if (sluice_close(m) != SLUICE_OK && !status) {
        fprintf(stderr, "%s: %s\n", argv[0], sluice_errmsg(m));
        status = 1;
    }
    return status;
}
