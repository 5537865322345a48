/* fuzz_msign_statement.c: libFuzzer target for what an OpenSSF
 * model-signing bundle says once its signature verifies (model_signing.c:
 * the in-toto statement, its predicate, the resource list, the link and
 * the file-level check). fuzz_msign cannot reach it: its key's private
 * half is gone, so every mutated payload fails the ECDSA check first.
 *
 * Here the input is the statement itself (the DSSE payload): the target
 * signs it with a fixed test key (TEST_KEY below, made for this file and
 * nothing else: it signs only fuzz inputs and trusts nothing), wraps it
 * in a bundle with that key's hint, and verifies it with the key trusted
 * two ways, over a small model written once in a temp dir (a.safetensors,
 * b.safetensors of fuzz_files.h, and a flat sluice.manifest.json):
 *  - link off, as `sluice verify --no-manifest-link`: sl_ms_verify_text,
 *    then, when accepted, sl_ms_check_tree over the model;
 *  - link on, as sluice_open (for what the verifier accepted): the bundle
 *    written as the model's model.sig, and the model opened with it (the statement must list the manifest
 *    with its SHA-256 and every .safetensors file).
 * Accepted or rejected with a message, never a crash or a leak.
 * corpus/msign_statement
 * holds valid statements for that model (files, shards, and the 0.2
 * Digests/v0.1 form), so mutations start past every check. */
#include "fuzz_files.h"
#include "trust/model_signing.h"
#include "sluice.h"
#include "verdict.h"

#include <cjson/cJSON.h>
#include <openssl/bio.h>
#include <openssl/pem.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Test-only P-256 key, generated for this target (openssl genpkey): it is
 * trusted by nothing but this process. */
static const char TEST_KEY[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgJ6T/lAa8OfbtSh0s\n"
    "tDCEovz0bpUjKt1cWJFShr+7VxChRANCAAT1iJ6kc04vu+8PUodqS0j1svjhAnmv\n"
    "G92JLRnAmLOH6GeJ1cQUW5QwXRTW3mkE33MTMqh3FPaKzdNdFkrRiLcv\n"
    "-----END PRIVATE KEY-----\n";

/* The flat manifest of fuzz_files.h's model: SHA-256 of x (2 zero bytes),
 * y (1), z (4). The corpus lists its SHA-256. */
static const char MANIFEST[] =
    "{\"x\":\"96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7\","
    "\"y\":\"6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d\","
    "\"z\":\"df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119\"}\n";

#define PAYLOAD_TYPE "application/vnd.in-toto+json"

static EVP_PKEY *key;
static char hint[65], key_path[180], sig_path[160], manifest_path[160];

static void cleanup(void)
{
    unlink(key_path);
    unlink(sig_path);
    EVP_PKEY_free(key);
    fz_remove("sluice.manifest.json");
}

static void setup_once(void)
{
    if (fz_dir[0])
        return;
    BIO *b = BIO_new_mem_buf(TEST_KEY, (int)sizeof TEST_KEY - 1);
    key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!key || sl_ms_key_hint(key, hint) < 0)
        abort();
    fz_make("msign-statement");
    snprintf(sig_path, sizeof sig_path, "%s", fz_path(SL_MS_DEFAULT_NAME));
    snprintf(manifest_path, sizeof manifest_path, "%s", fz_path("sluice.manifest.json"));
    fz_write_file(manifest_path, MANIFEST, sizeof MANIFEST - 1);
    /* beside the model, not in it: the file-level check lists the model */
    snprintf(key_path, sizeof key_path, "%s.pub", fz_dir);
    FILE *f = fopen(key_path, "w");
    if (!f || PEM_write_PUBKEY(f, key) != 1)
        abort();
    fclose(f);
    atexit(cleanup);
}

/* A mutated resource list no longer hashes to its subject's digest, and
 * a fuzzer cannot find SHA-256 preimages: where the input holds ROOT
 * (corpus/msign_statement's v1 statements do, as the subject's sha256),
 * it is replaced by the SHA-256 of the listed digests' bytes, in order, as
 * the verifier computes it, so that mutations reach what follows the
 * subject check. Other bytes are signed as they are. Returns a malloc'd
 * copy (NULL: none to replace). */
#define ROOT "@ROOT@"
static uint8_t *fix_root(const uint8_t *data, size_t size, size_t *out_len)
{
    const char *at = memmem(data, size, ROOT, sizeof ROOT - 1);
    if (!at)
        return NULL;
    uint8_t root[32] = {0};
    cJSON *st = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(st, "predicate");
    const cJSON *r, *list = cJSON_GetObjectItemCaseSensitive(pred, "resources");
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    if (!h || EVP_DigestInit_ex(h, EVP_sha256(), NULL) != 1)
        abort();
    cJSON_ArrayForEach(r, list) {
        const char *d = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "digest"));
        size_t n = d ? strlen(d) : 0;
        uint8_t b[64];
        if (n % 2 || n > 128)
            continue;
        for (size_t i = 0; i < n / 2; i++)
            if (sscanf(d + 2 * i, "%2hhx", &b[i]) != 1)
                n = 0;
        EVP_DigestUpdate(h, b, n / 2);
    }
    EVP_DigestFinal_ex(h, root, NULL);
    EVP_MD_CTX_free(h);
    cJSON_Delete(st);
    size_t pre = (size_t)(at - (const char *)data), post = size - pre - (sizeof ROOT - 1);
    uint8_t *out = malloc(size + 64);
    if (!out)
        abort();
    memcpy(out, data, pre);
    for (int i = 0; i < 32; i++)
        snprintf((char *)out + pre + 2 * i, 3, "%02x", root[i]);
    memcpy(out + pre + 64, at + sizeof ROOT - 1, post);
    *out_len = pre + 64 + post;
    return out;
}

/* The bundle of payload (n bytes) signed with the test key; malloc'd,
 * its length in *len. */
static char *bundle(const uint8_t *payload, size_t n, size_t *len)
{
    char head[96];
    int h = snprintf(head, sizeof head, "DSSEv1 %zu " PAYLOAD_TYPE " %zu ",
                     sizeof PAYLOAD_TYPE - 1, n);
    uint8_t *msg = malloc((size_t)h + n + 1), sig[128];
    size_t siglen = sizeof sig;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!msg || !c)
        abort();
    memcpy(msg, head, (size_t)h);
    memcpy(msg + h, payload, n);
    if (EVP_DigestSignInit(c, NULL, EVP_sha256(), NULL, key) != 1 ||
        EVP_DigestSign(c, sig, &siglen, msg, (size_t)h + n) != 1)
        abort();
    EVP_MD_CTX_free(c);
    free(msg);
    char *p64 = malloc((n + 2) / 3 * 4 + 1), s64[4 * sizeof sig / 3 + 4];
    if (!p64 || n > INT32_MAX)
        abort();
    EVP_EncodeBlock((unsigned char *)p64, payload, (int)n);
    EVP_EncodeBlock((unsigned char *)s64, sig, (int)siglen);
    size_t cap = strlen(p64) + 512;
    char *out = malloc(cap);
    if (!out)
        abort();
    int k = snprintf(out, cap,
                     "{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
                     "\"verificationMaterial\":{\"publicKey\":{\"hint\":\"%s\"},\"tlogEntries\":[]},"
                     "\"dsseEnvelope\":{\"payload\":\"%s\",\"payloadType\":\"" PAYLOAD_TYPE "\","
                     "\"signatures\":[{\"sig\":\"%s\"}]}}",
                     hint, p64, s64);
    free(p64);
    if (k < 0 || (size_t)k >= cap)
        abort();
    *len = (size_t)k;
    return out;
}

/* The model opened with the bundle as its model.sig (the link on). */
static int open_linked(void)
{
    const char *keys[] = {key_path};
    sluice_options opts;
    sluice_options_init(&opts);
    opts.manifest_path = manifest_path;
    opts.trusted_keys = keys;
    opts.ntrusted_keys = 1;
    opts.signature_path = sig_path;
    /* small and plain: the open is the check, no tensor is read */
    opts.flags = SLUICE_F_FORCE_PREAD;
    opts.pool_bytes = 65536;
    opts.queue_depth = 2;
    opts.io_threads = 1;
    opts.hash_threads = 1;
    sluice_model *m = NULL;
    int rc = sluice_open(fz_dir, &opts, &m);
    if (rc == SLUICE_OK && !m)
        abort();
    if (sluice_close(m) != SLUICE_OK)
        abort();
    return rc;
}

const char fuzz_target_name[] = "msign_statement";

/* The verdict is the verifier's alone (the link off): the statement is
 * authentic, so this is what its parser made of it. */
int fuzz_verdict(const uint8_t *data, size_t size)
{
    setup_once();
    size_t len = 0, fixed_len = 0;
    uint8_t *fixed = fix_root(data, size, &fixed_len);
    char *text = fixed ? bundle(fixed, fixed_len, &len) : bundle(data, size, &len);
    free(fixed);
    const char *keys[] = {key_path};
    sl_ms_trust t = {keys, 1, NULL, 0};
    sl_ms_statement *s = NULL;
    sl_err err = {0};
    int rc = sl_ms_verify_text(sig_path, text, len, &t, &s, &err);
    if ((rc == SLUICE_OK) != (s != NULL) || (rc < 0 && !err.msg[0]))
        abort(); /* a statement exactly when accepted; every rejection says why */
    if (s) {
        sl_err e2 = {0};
        if (sl_ms_check_tree(s, fz_dir, sig_path, NULL, 0, &e2) < 0 && !e2.msg[0])
            abort();
        sl_ms_statement_free(s);
    }
    /* the open verifies it again: worth it (threads, under ASan) only
     * for what the verifier accepted */
    if (rc == SLUICE_OK) {
        fz_write_file(sig_path, text, len);
        (void)open_linked();
    }
    free(text);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
