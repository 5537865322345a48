/* fuzz_model.c: libFuzzer target for the whole load path. The input is
 * written as a .safetensors file, opened as a model, and every tensor is
 * acquired, then streamed: what sluice hands out must be the file's very
 * bytes; a tensor may only fail for a reason the input explains (larger
 * than the pool, a digest that does not match); close must succeed.
 *
 * Options: an input that starts with "SLFZ" and one option byte uses that
 * byte and the rest is the file; any other input is the file itself (so the
 * real files and tests/data/bad replay as they are) and the options come
 * from its length. Option bits:
 *   0    SLUICE_F_FORCE_PREAD (else io_uring when the kernel allows)
 *   1    SLUICE_F_HASH_ALL
 *   2    expected digests for every tensor (sl_engine_set_digests)
 *   3    ... with the digest of the middle tensor wrong: it must fail
 *   4-5  pool_bytes: 4 KiB, 64 KiB, 1 MiB, 64 MiB
 *   6    chunk_bytes 4 KiB (else 64 KiB), queue_depth 2 (else 8)
 *   7    SLUICE_F_DIRECT
 */
#include "api/engine_hooks.h"
#include "sluice.h"
#include "verdict.h"

#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];
static char path[128];

static void cleanup(void)
{
    unlink(path);
    rmdir(dir);
}

static void setup_once(void)
{
    if (dir[0])
        return;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/sluice-fuzz-model-XXXXXX", base);
    if (!mkdtemp(dir))
        abort();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    atexit(cleanup);
}

static void write_file(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        abort();
}

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "fuzz_model: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                          \
        }                                                                     \
    } while (0)

typedef struct ctx {
    const uint8_t *file;
    size_t file_size;
    uint64_t pool;
    int direct;
    size_t bad;                 /* tensor whose digest is wrong, or SIZE_MAX */
    unsigned char (*digests)[32];
    unsigned char *has;
    size_t n;
    unsigned char *seen;
} ctx;

/* A tensor's bytes, its digest and the reasons it may fail. */
static void check_ok(const ctx *c, const sluice_tensor *t, size_t i)
{
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    CHECK(info && info->index == i);
    CHECK(sluice_tensor_size(t) == info->nbytes);
    CHECK(info->offset <= c->file_size && info->nbytes <= c->file_size - info->offset);
    const unsigned char *d = sluice_tensor_data(t);
    if (info->nbytes) {
        CHECK(d && ((uintptr_t)d & 63) == 0);
        CHECK(memcmp(d, c->file + info->offset, (size_t)info->nbytes) == 0);
    }
    CHECK(i != c->bad); /* a wrong digest never passes */
    uint8_t got[32];
    if (sluice_tensor_digest(t, got) == SLUICE_OK && c->digests)
        CHECK(memcmp(got, c->digests[i], 32) == 0);
}

static void check_fail(const ctx *c, sluice_model *m, size_t i, int rc)
{
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    CHECK(sluice_info(m, i, &info) == SLUICE_OK);
    if (rc == SLUICE_E_TOO_LARGE)
        /* larger than the pool, with the 64-byte rounding (and O_DIRECT's
         * 4 KiB alignment of both ends) */
        CHECK(c->direct ? info.nbytes + 8192 > c->pool
                        : ((info.nbytes + 63) & ~(uint64_t)63) > (c->pool & ~(uint64_t)63));
    else if (rc == SLUICE_E_CHECKSUM)
        CHECK(i == c->bad);
    else {
        fprintf(stderr, "fuzz_model: tensor %zu: %s: %s\n", i, sluice_strerror(rc),
                sluice_errmsg(m));
        abort();
    }
}

static int stream_cb(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    ctx *c = user;
    CHECK(info && info->index < c->n && !c->seen[info->index]);
    c->seen[info->index] = 1;
    if (status == SLUICE_OK) {
        check_ok(c, t, info->index);
        CHECK(sluice_release(t) == SLUICE_OK);
    } else {
        CHECK(!t && message);
        if (status == SLUICE_E_CHECKSUM)
            CHECK(info->index == c->bad);
        else
            CHECK(status == SLUICE_E_TOO_LARGE && info->nbytes > 0);
    }
    return 0;
}

const char fuzz_target_name[] = "model";

/* The verdict is sluice_open's status; an opened model must pass every
 * check (or the process aborts). */
int fuzz_verdict(const uint8_t *data, size_t size)
{
    setup_once();
    unsigned opt;
    if (size >= 5 && memcmp(data, "SLFZ", 4) == 0) {
        opt = data[4];
        data += 5;
        size -= 5;
    } else {
        opt = (unsigned)(size * 2654435761u >> 24) & 0x7f; /* no O_DIRECT */
    }
    write_file(data, size);

    static const uint64_t pools[4] = {4096, 65536, 1u << 20, 64u << 20};
    sluice_options o;
    sluice_options_init(&o);
    o.flags = ((opt & 1) ? SLUICE_F_FORCE_PREAD : 0) | ((opt & 2) ? SLUICE_F_HASH_ALL : 0) |
              ((opt & 128) ? SLUICE_F_DIRECT : 0);
    o.pool_bytes = pools[(opt >> 4) & 3];
    o.chunk_bytes = (opt & 64) ? 4096 : 65536;
    o.queue_depth = (opt & 64) ? 2 : 8;
    o.io_threads = 1;
    o.hash_threads = 1;
    o.verify = SLUICE_VERIFY_OFF;

    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK) {
        CHECK(m && sluice_count(m) == 0 && sluice_errmsg(m)[0]);
        CHECK(sluice_close(m) == SLUICE_OK);
        return rc;
    }

    ctx c = {data, size, o.pool_bytes, (opt & 128) != 0, SIZE_MAX, NULL, NULL, sluice_count(m),
             NULL};
    size_t n1 = c.n ? c.n : 1;
    if (opt & 4) {
        c.digests = malloc(n1 * 32);
        c.has = malloc(n1);
        CHECK(c.digests && c.has);
        for (size_t i = 0; i < c.n; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            CHECK(sluice_info(m, i, &info) == SLUICE_OK);
            CHECK(info.offset <= size && info.nbytes <= size - info.offset);
            unsigned len = 0;
            CHECK(EVP_Digest(data + info.offset, (size_t)info.nbytes, c.digests[i], &len,
                             EVP_sha256(), NULL) == 1);
            c.has[i] = 1;
        }
        if ((opt & 8) && c.n) {
            c.bad = c.n / 2;
            c.digests[c.bad][size % 32] ^= 0x40;
        }
        CHECK(sl_engine_set_digests(m, (const unsigned char (*)[32])c.digests, c.has) ==
              SLUICE_OK);
    }

    /* every tensor, in order, each released before the next */
    for (size_t i = 0; i < c.n; i++) {
        sluice_tensor *t = NULL;
        rc = sluice_acquire_index(m, i, &t);
        if (rc == SLUICE_OK) {
            check_ok(&c, t, i);
            CHECK(sluice_release(t) == SLUICE_OK);
        } else {
            CHECK(!t);
            check_fail(&c, m, i, rc);
        }
    }
    /* and all of them by a stream, from the cache and the file */
    c.seen = calloc(n1, 1);
    CHECK(c.seen);
    rc = sluice_stream(m, NULL, 0, stream_cb, &c);
    CHECK(rc == SLUICE_OK || rc == SLUICE_E_TOO_LARGE || rc == SLUICE_E_CHECKSUM);
    for (size_t i = 0; i < c.n; i++)
        CHECK(c.seen[i]);

    struct sluice_stats st = {.size = sizeof st};
    CHECK(sluice_stats(m, &st) == SLUICE_OK);
    CHECK(st.pool_high_water <= st.pool_bytes);
    CHECK(sluice_close(m) == SLUICE_OK);
    free(c.seen);
    free(c.digests);
    free(c.has);
    return SLUICE_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
