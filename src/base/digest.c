/* digest.c: see digest.h. */
#include "base/digest.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef SLUICE_HAVE_BLAKE3
#include <blake3.h>
#endif

/* The public name (sluice.h) sits here, in the lowest layer, since the
 * engine, the index and the manifest all name algorithms. */
SLUICE_API const char *sluice_algorithm_name(sluice_algorithm alg)
{
    return alg == SLUICE_ALG_SHA256 ? "sha256" : alg == SLUICE_ALG_BLAKE3 ? "blake3" : NULL;
}

struct sl_md {
    sluice_algorithm alg;
    EVP_MD_CTX *evp;            /* SHA-256 */
#ifdef SLUICE_HAVE_BLAKE3
    blake3_hasher b3;
#endif
};

static const uint8_t sha256_of_nothing[32] = {
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
    0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
static const uint8_t blake3_of_nothing[32] = {
    0xaf, 0x13, 0x49, 0xb9, 0xf5, 0xf9, 0xa1, 0xa6, 0xa0, 0x40, 0x4d, 0xea, 0x36, 0xdc, 0xc9, 0x49,
    0x9b, 0xcb, 0x25, 0xc9, 0xad, 0xc1, 0x12, 0xb7, 0xcc, 0x9a, 0x93, 0xca, 0xe4, 0x1f, 0x32, 0x62};

#ifdef SLUICE_HAVE_BLAKE3
/* The BLAKE3 sources pick their SIMD code on first use and remember the
 * CPU's features in a plain static variable; two threads making that
 * first call at once would race on it. One call under pthread_once, made
 * before any context is handed out, settles it for the whole process. */
static pthread_once_t blake3_settled = PTHREAD_ONCE_INIT;

static void settle_blake3(void)
{
    blake3_hasher h;
    uint8_t out[32];
    blake3_hasher_init(&h);
    blake3_hasher_update(&h, "sluice", 6);
    blake3_hasher_finalize(&h, out, sizeof out);
}
#endif

int sl_md_supported(sluice_algorithm alg)
{
#ifdef SLUICE_HAVE_BLAKE3
    if (alg == SLUICE_ALG_BLAKE3)
        return 1;
#endif
    return alg == SLUICE_ALG_SHA256;
}

sl_md *sl_md_new(sluice_algorithm alg)
{
    if (!sl_md_supported(alg))
        return NULL;
    sl_md *md = calloc(1, sizeof *md);
    if (!md)
        return NULL;
    md->alg = alg;
    if (alg == SLUICE_ALG_SHA256 && !(md->evp = EVP_MD_CTX_new())) {
        free(md);
        return NULL;
    }
#ifdef SLUICE_HAVE_BLAKE3
    if (alg == SLUICE_ALG_BLAKE3)
        pthread_once(&blake3_settled, settle_blake3);
#endif
    if (sl_md_reset(md) < 0) {
        sl_md_free(md);
        return NULL;
    }
    return md;
}

void sl_md_free(sl_md *md)
{
    if (!md)
        return;
    EVP_MD_CTX_free(md->evp);
    free(md);
}

int sl_md_reset(sl_md *md)
{
#ifdef SLUICE_HAVE_BLAKE3
    if (md->alg == SLUICE_ALG_BLAKE3) {
        blake3_hasher_init(&md->b3);
        return 0;
    }
#endif
    return EVP_DigestInit_ex(md->evp, EVP_sha256(), NULL) == 1 ? 0 : -1;
}

int sl_md_update(sl_md *md, const void *p, size_t n)
{
#ifdef SLUICE_HAVE_BLAKE3
    if (md->alg == SLUICE_ALG_BLAKE3) {
        blake3_hasher_update(&md->b3, p, n);
        return 0;
    }
#endif
    return EVP_DigestUpdate(md->evp, p, n) == 1 ? 0 : -1;
}

int sl_md_final(sl_md *md, uint8_t out[32])
{
#ifdef SLUICE_HAVE_BLAKE3
    if (md->alg == SLUICE_ALG_BLAKE3) {
        blake3_hasher_finalize(&md->b3, out, 32);
        return 0;
    }
#endif
    unsigned got = 0;
    return EVP_DigestFinal_ex(md->evp, out, &got) == 1 && got == 32 ? 0 : -1;
}

int sl_md_oneshot(sluice_algorithm alg, const void *p, size_t n, uint8_t out[32])
{
    sl_md *md = sl_md_new(alg);
    if (!md)
        return -1;
    int rc = sl_md_update(md, p, n) == 0 && sl_md_final(md, out) == 0 ? 0 : -1;
    sl_md_free(md);
    return rc;
}

sluice_algorithm sl_md_algorithm(const sl_md *md)
{
    return md->alg;
}

const char *sl_md_title(sluice_algorithm alg)
{
    return alg == SLUICE_ALG_BLAKE3 ? "BLAKE3" : "SHA-256";
}

const uint8_t *sl_md_empty(sluice_algorithm alg)
{
    if (!sl_md_supported(alg))
        return NULL;
    return alg == SLUICE_ALG_BLAKE3 ? blake3_of_nothing : sha256_of_nothing;
}
