/* test_sign_tools.c: `sluice keygen`, `sluice sign` and the --key option
 * of verify, cat and stats, run as programs: a key pair as documented
 * (modes, PEM kinds, the key id printed is the SHA-256 of the public
 * key's DER), never overwritten; a signed manifest verifies with its key
 * and fails with another, after a change, or unsigned. */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tool_run.h"

typedef struct fx {
    char *dir;      /* scratch: stdout, stderr, keys */
    char *model;    /* dir/model.safetensors */
    char *manifest; /* its sidecar, written by `sluice manifest` */
    char *sig;      /* manifest + ".sig" */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest,
                        "model.safetensors.manifest.json");
    f->sig = tu_join(f->dir, "model.safetensors.manifest.json.sig");
    mf_write_simple(f->model, 3, 100);
    run_result r = run(f->dir, "manifest", f->model, "-q", "-o", f->manifest, NULL);
    expect_status(&r, 0, "manifest");
    run_free(&r);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, f->manifest);
    free(f->sig);
    free(f);
    return 0;
}

/* Makes the pair dir/name.key, dir/name.pub; returns the prefix. */
static char *keygen(const fx *f, const char *name)
{
    char *prefix = tu_join(f->dir, name);
    run_result r = run(f->dir, "keygen", "--out", prefix, NULL);
    expect_status(&r, 0, "keygen");
    run_free(&r);
    return prefix;
}

static char *suffixed(const char *prefix, const char *suffix)
{
    size_t n = strlen(prefix) + strlen(suffix) + 1;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s%s", prefix, suffix);
    return p;
}

/* Runs the command and checks its status and that stderr holds what
 * (NULL: anything). */
static void expect_run(const fx *f, int status, const char *what, const char *arg0, ...)
{
    const char *argv[16];
    size_t n = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && n < 15; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    while (n < 16)
        argv[n++] = NULL;
    run_result r = run(f->dir, argv[0], argv[1], argv[2], argv[3], argv[4], argv[5], argv[6],
                       argv[7], argv[8], argv[9], argv[10], argv[11], argv[12], argv[13], NULL);
    expect_status(&r, status, arg0);
    if (what && !strstr(r.err, what) && !strstr(r.out, what))
        fail_msg("%s: output lacks \"%s\"\nstdout: %s\nstderr: %s", arg0, what, r.out, r.err);
    run_free(&r);
}

static void keygen_writes_a_pair(void **state)
{
    fx *f = *state;
    char *prefix = tu_join(f->dir, "k");
    run_result r = run(f->dir, "keygen", "--out", prefix, NULL);
    expect_status(&r, 0, "keygen");
    char *key = suffixed(prefix, ".key"), *pub = suffixed(prefix, ".pub");
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(stat(pub, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0644);
    size_t len = 0;
    char *text = tu_read_file(key, &len);
    assert_non_null(strstr(text, "-----BEGIN PRIVATE KEY-----\n"));
    free(text);
    /* the public key: Ed25519, and its id as printed */
    FILE *pf = fopen(pub, "r");
    assert_non_null(pf);
    EVP_PKEY *k = PEM_read_PUBKEY(pf, NULL, NULL, NULL);
    fclose(pf);
    assert_non_null(k);
    assert_int_equal(EVP_PKEY_get_id(k), EVP_PKEY_ED25519);
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(k, &der);
    assert_true(n > 0);
    uint8_t id[32];
    char hex[65], want[128];
    mf_sha256(der, (size_t)n, id);
    OPENSSL_free(der);
    EVP_PKEY_free(k);
    snprintf(want, sizeof want, "public key sha256:%s\n", mf_hex(id, hex));
    if (!strstr(r.out, want))
        fail_msg("keygen printed \"%s\", not the id %s", r.out, want);
    run_free(&r);
    free(key);
    free(pub);
    free(prefix);
}

static void keygen_never_overwrites(void **state)
{
    fx *f = *state;
    char *prefix = keygen(f, "k");
    char *key = suffixed(prefix, ".key"), *pub = suffixed(prefix, ".pub");
    size_t klen = 0, plen = 0;
    char *k0 = tu_read_file(key, &klen), *p0 = tu_read_file(pub, &plen);
    expect_run(f, 3, "exists: a key is never overwritten", "keygen", "--out", prefix, NULL);
    /* only the private key there: nothing is left of the attempt */
    assert_int_equal(unlink(pub), 0);
    expect_run(f, 3, "exists", "keygen", "--out", prefix, NULL);
    assert_int_equal(access(pub, F_OK), -1);
    size_t len = 0;
    char *k1 = tu_read_file(key, &len);
    assert_int_equal(len, klen);
    assert_memory_equal(k0, k1, len);
    expect_run(f, 2, "usage", "keygen", NULL);
    free(k0);
    free(k1);
    free(p0);
    free(key);
    free(pub);
    free(prefix);
}

static void sign_then_verify(void **state)
{
    fx *f = *state;
    char *a = keygen(f, "a"), *b = keygen(f, "b");
    char *a_key = suffixed(a, ".key"), *a_pub = suffixed(a, ".pub"), *b_pub = suffixed(b, ".pub");
    expect_run(f, 4, "is not signed", "verify", f->model, "-q", "--key", a_pub, NULL);
    expect_run(f, 0, "signed", "sign", f->manifest, "--key", a_key, NULL);
    assert_int_equal(access(f->sig, R_OK), 0);
    expect_run(f, 0, "signature verified", "verify", f->model, "-q", "--key", a_pub, NULL);
    expect_run(f, 4, "not one of the 1 trusted key", "verify", f->model, "-q", "--key", b_pub, NULL);
    expect_run(f, 0, "3 tensors verified", "verify", f->model, "-q", "--key", b_pub, "--key", a_pub,
               NULL);
    expect_run(f, 0, NULL, "cat", f->model, "t.1", "--key", a_pub, NULL);
    expect_run(f, 4, "not one of", "cat", f->model, "t.1", "--key", b_pub, NULL);
    expect_run(f, 0, "sluice_tensors_verified_total", "stats", f->model, "--key", a_pub, NULL);
    expect_run(f, 4, "not one of", "stats", f->model, "--key", b_pub, NULL);
    /* without --key nothing changes */
    expect_run(f, 0, "3 tensors verified", "verify", f->model, "-q", NULL);
    /* one byte of the manifest changed (inside a JSON string): refused */
    size_t len = 0;
    char *text = tu_read_file(f->manifest, &len);
    char *d = strstr(text, "\"digest\": \"");
    assert_non_null(d);
    d[11] = d[11] == '0' ? '1' : '0';
    tu_write_file(f->manifest, text, len);
    free(text);
    expect_run(f, 4, "changed after it was signed", "verify", f->model, "-q", "--key", a_pub, NULL);
    /* signing a public key, or without a key, is refused */
    expect_run(f, 3, "signing needs the private key", "sign", f->manifest, "--key", a_pub, NULL);
    expect_run(f, 2, "usage", "sign", f->manifest, NULL);
    free(a);
    free(b);
    free(a_key);
    free(a_pub);
    free(b_pub);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(keygen_writes_a_pair, setup, teardown),
        cmocka_unit_test_setup_teardown(keygen_never_overwrites, setup, teardown),
        cmocka_unit_test_setup_teardown(sign_then_verify, setup, teardown),
    };
    return cmocka_run_group_tests(tests, tool_group_setup, NULL);
}
