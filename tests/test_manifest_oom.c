/* test_manifest_oom.c: reading a manifest with the Nth allocation failing,
 * for every N: each open returns SLUICE_E_NOMEM or the manifest's own
 * code, and leaks nothing (LeakSanitizer checks at exit). The
 * seam is the linker (alloc_wrap.h, alloc.cmake); cJSON's own
 * allocations live in its shared library and are not failed here. */
#include "alloc_wrap.h"
#include "mf_fixture.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sluice.h>
#include <dirent.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opens path failing allocation N = 0, 1, ... until an open runs without a
 * failure; each must end with want (the code of the clean run) or NOMEM.
 * want is a manifest fault, so that the open stops at the manifest: the
 * engine's own allocations are test_alloc_fail's business. */
static void oom_loop(const char *path, const char *manifest, sluice_verify_policy pol, int want)
{
    long n;
    for (n = 0; n < 100000; n++) {
        sluice_options o;
        sluice_options_init(&o);
        o.manifest_path = manifest;
        o.verify = pol;
        sluice_model *m = NULL;
        aw_arm(n);
        int rc = sluice_open(path, &o, &m);
        long failed = aw_disarm();
        if (!failed) {
            if (rc != want)
                fail_msg("clean run: %d, expected %d: %s", rc, want, sluice_errmsg(m));
            sluice_close(m);
            break;
        }
        if (rc != SLUICE_E_NOMEM && rc != want)
            fail_msg("allocation %ld failed: got %d (%s)", n, rc, m ? sluice_errmsg(m) : "");
        sluice_close(m);
    }
    assert_true(n > 3);
}

typedef struct fx {
    char *dir, *model, *manifest;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest,
                        "model.safetensors.manifest.json"); /* the sidecar */
    const char *keys[] = {"a", "b\\u0000c", "d"};
    const uint64_t sizes[] = {3, 4, 5};
    mf_write_model(f->model, 3, keys, sizes);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, f->manifest);
    free(f);
    return 0;
}

#define Z "0000000000000000000000000000000000000000000000000000000000000000"

/* A structured manifest read to its very end: it fails only at the last
 * step (REQUIRE and "d" has no digest), so every allocation of a full read
 * is failed in turn without the engine being created. */
static void structured_to_the_end(void **state)
{
    fx *f = *state;
    mf_write_text(f->manifest, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\","
                               "\"tensors\":{\"a\":{\"sha256\":\"" Z "\"},\"b\\u0000c\":{\"sha256\":\"" Z "\"}},"
                               "\"files\":{\"model.safetensors\":{\"sha256\":\"" Z "\",\"size\":30}}}");
    oom_loop(f->model, NULL, SLUICE_VERIFY_DEFAULT, SLUICE_E_MANIFEST_MISSING);     /* sidecar */
    oom_loop(f->model, f->manifest, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST_MISSING); /* explicit */
}

static void flat_faults(void **state)
{
    fx *f = *state;
    mf_write_text(f->manifest, "{\"a\":\"" Z "\",\"d\":\"" Z "\"}");
    oom_loop(f->model, NULL, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST_MISSING);
    mf_write_text(f->manifest, "{\"a\":\"" Z "\",\"a\":\"" Z "\"}");
    oom_loop(f->model, NULL, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST_DUPLICATE);
    mf_write_text(f->manifest, "{\"a\":\"" Z "\",\"x\":\"" Z "\"}");
    oom_loop(f->model, NULL, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST_UNKNOWN);
    mf_write_text(f->manifest, "{\"a\":\"" Z "\",\"d\":7}");
    oom_loop(f->model, NULL, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST_DIGEST);
    mf_write_text(f->manifest, "{\"a\":");
    oom_loop(f->model, NULL, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST);
    mf_write_text(f->manifest, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\",\"x\":1}");
    oom_loop(f->model, NULL, SLUICE_VERIFY_REQUIRE, SLUICE_E_MANIFEST_FORMAT);
}

/* sluice_manifest_sign with allocation N failing, for every N: each
 * signing returns SLUICE_E_NOMEM (sluice.h), or SLUICE_OK where the
 * failure was one it can do without, and leaves no temporary file beside
 * the signature. (OpenSSL's own allocations are not failed here.) */
static void sign_faults(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *manifest = tu_join(dir, "m.json"), *key = tu_join(dir, "k.pem");
    mf_write_text(manifest, "{\"a\":\"" Z "\"}");
    EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    assert_non_null(k);
    FILE *kf = fopen(key, "w");
    assert_non_null(kf);
    assert_int_equal(PEM_write_PrivateKey(kf, k, NULL, NULL, 0, NULL, NULL), 1);
    assert_int_equal(fclose(kf), 0);
    EVP_PKEY_free(k);
    long n;
    for (n = 0; n < 100000; n++) {
        char why[512] = "";
        aw_arm(n);
        int rc = sluice_manifest_sign(manifest, key, NULL, why, sizeof why);
        long failed = aw_disarm();
        if (!failed) {
            if (rc != SLUICE_OK)
                fail_msg("clean run: %d (%s)", rc, why);
            break;
        }
        if (rc != SLUICE_E_NOMEM && rc != SLUICE_OK)
            fail_msg("allocation %ld failed: got %d (%s), not SLUICE_E_NOMEM", n, rc, why);
        DIR *d = opendir(dir);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));)
            if (strstr(e->d_name, ".tmp."))
                fail_msg("allocation %ld failed: %s left behind", n, e->d_name);
        closedir(d);
    }
    assert_true(n > 1);
    tu_rmtree(dir);
    free(manifest);
    free(key);
    free(dir);
}

/* sluice_manifest_write to a path with allocation N failing, for every N
 * (the model opened before): SLUICE_E_NOMEM each time (sluice.h), or
 * SLUICE_OK, and no temporary file left beside the manifest. */
static void write_faults(void **state)
{
    fx *f = *state;
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(f->model, &o, &m), SLUICE_OK);
    char *dir = tu_tmpdir();
    char *out = tu_join(dir, "out.manifest.json");
    long n;
    for (n = 0; n < 100000; n++) {
        aw_arm(n);
        int rc = sluice_manifest_write(m, out, -1, NULL);
        long failed = aw_disarm();
        if (!failed) {
            if (rc != SLUICE_OK)
                fail_msg("clean run: %d (%s)", rc, sluice_errmsg(m));
            break;
        }
        if (rc != SLUICE_E_NOMEM && rc != SLUICE_OK)
            fail_msg("allocation %ld failed: got %d (%s), not SLUICE_E_NOMEM", n, rc,
                     sluice_errmsg(m));
        DIR *d = opendir(dir);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));)
            if (strstr(e->d_name, ".tmp."))
                fail_msg("allocation %ld failed: %s left behind", n, e->d_name);
        closedir(d);
    }
    assert_true(n > 1);
    sluice_close(m);
    tu_rmtree(dir);
    free(out);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(structured_to_the_end, setup, teardown),
        cmocka_unit_test_setup_teardown(flat_faults, setup, teardown),
        cmocka_unit_test(sign_faults),
        cmocka_unit_test_setup_teardown(write_faults, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
