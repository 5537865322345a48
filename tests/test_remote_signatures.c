/* test_remote_signatures.c: a remote manifest's signatures are fetched
 * and checked (issue 38 item 5): the sluice signature M.sig beside the
 * manifest M, and the OpenSSF model-signing bundle model.sig beside the
 * model, over HTTP from a real nginx started by the test
 * (remote_fixture.h); a tampered one is refused, and with trusted keys and
 * none there the open fails closed. Keys and signatures are made by the
 * sluice command (keygen, sign). Skipped (77) without nginx. */
#include "remote_fixture.h"
#include "util.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static rf_server nginx;
static char *root;          /* served at / */
static char *keys;          /* ed (Ed25519), ed2 (another), ec, ec2 (P-256) */

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *at(const char *fmt, ...)
{
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ & 3];
    int n = snprintf(b, 1024, "%s/", nginx.base);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, 1024 - (size_t)n, fmt, ap);
    va_end(ap);
    return b;
}

static void run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void run(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("failed: %s", cmd);
}

/* root/NAME/: a model and its manifest (version 2) */
static void model_dir(const char *name)
{
    char *d = tu_join(root, name);
    mkdir(d, 0755);
    char *p = tu_join(d, "m.safetensors");
    tu_write_safetensors(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1000],\"data_offsets\":[0,1000]},"
                            "\"b\":{\"dtype\":\"U8\",\"shape\":[70000],\"data_offsets\":[1000,71000]}}",
                         NULL, 71000);
    run("%s/sluice manifest '%s' -o '%s/m.safetensors.manifest.json' >/dev/null",
        SLUICE_BINARY_DIR, p, d);
    free(p);
    free(d);
}

static int setup(void **state)
{
    char why[256];
    rf_skip_without_curl();
    root = tu_tmpdir();
    keys = tu_tmpdir();
    chmod(root, 0755);
    const char *b = SLUICE_BINARY_DIR;
    run("%s/sluice keygen --out %s/ed >/dev/null && %s/sluice keygen --out %s/ed2 >/dev/null && "
        "%s/sluice keygen --out %s/ec --curve p256 >/dev/null && "
        "%s/sluice keygen --out %s/ec2 --curve p256 >/dev/null", b, keys, b, keys, b, keys, b, keys);
    /* ed/: M.sig by ed; ed-other/: M.sig by ed2; ed-tampered/: the manifest
     * changed after ed signed it; unsigned/: no signature at all */
    static const char *const dirs[] = {"ed", "ed-other", "ed-tampered", "unsigned", "ms",
                                       "ms-other", "ms-tampered"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        model_dir(dirs[i]);
    run("%s/sluice sign %s/ed/m.safetensors.manifest.json --key %s/ed.key >/dev/null", b, root, keys);
    run("%s/sluice sign %s/ed-other/m.safetensors.manifest.json --key %s/ed2.key >/dev/null", b,
        root, keys);
    run("%s/sluice sign %s/ed-tampered/m.safetensors.manifest.json --key %s/ed.key >/dev/null && "
        "printf ' ' >>%s/ed-tampered/m.safetensors.manifest.json", b, root, keys, root);
    /* ms/: model.sig by ec; ms-other/: by ec2; ms-tampered/: the manifest
     * changed after ec signed the directory */
    run("%s/sluice sign %s/ms --format model-signing --key %s/ec.key >/dev/null", b, root, keys);
    run("%s/sluice sign %s/ms-other --format model-signing --key %s/ec2.key >/dev/null", b, root,
        keys);
    run("%s/sluice sign %s/ms-tampered --format model-signing --key %s/ec.key >/dev/null && "
        "printf ' ' >>%s/ms-tampered/m.safetensors.manifest.json", b, root, keys, root);
    run("chmod -R a+rX %s", root);
    if (!rf_nginx_start(&nginx, root, NULL, why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        tu_rmtree(root);
        tu_rmtree(keys);
        exit(77);
    }
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    rf_stop(&nginx);
    tu_rmtree(root);
    tu_rmtree(keys);
    free(root);
    free(keys);
    (void)state;
    return 0;
}

/* Opens root/DIR/m.safetensors over HTTP trusting key KEY (keys/KEY.pub);
 * returns the code, the message in msg. */
static int open_signed(const char *dir, const char *key, char *msg, size_t cap)
{
    char *pub = malloc(strlen(keys) + strlen(key) + 8);
    sprintf(pub, "%s/%s.pub", keys, key);
    const char *list[] = {pub};
    sluice_options o;
    sluice_options_init(&o);
    o.trusted_keys = list;
    o.ntrusted_keys = 1;
    o.remote_attempts = 2;
    o.remote_backoff_ms = 10;
    char loc[1024];
    snprintf(loc, sizeof loc, "%s", at("%s/m.safetensors", dir));
    sluice_model *m = NULL;
    int rc = sluice_open(loc, &o, &m);
    snprintf(msg, cap, "%s", m ? sluice_errmsg(m) : "");
    if (rc == SLUICE_OK) {
        const char *where = NULL;
        assert_int_equal(sluice_verify_state(m, &where), SLUICE_VERIFIED);
        for (size_t i = 0; i < sluice_count(m); i++) {
            sluice_tensor *t;
            assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
            sluice_release(t);
        }
    }
    sluice_close(m);
    free(pub);
    return rc;
}

static void expect(const char *dir, const char *key, int want, const char *words)
{
    char msg[2048];
    int rc = open_signed(dir, key, msg, sizeof msg);
    if (rc != want || (words && !strstr(msg, words)))
        fail_msg("%s with key %s: %s (%s), wanted %s and \"%s\"", dir, key, sluice_strerror(rc),
                 msg, sluice_strerror(want), words ? words : "");
}

static void test_ed25519_fetched(void **state)
{
    expect("ed", "ed", SLUICE_OK, NULL);
    (void)state;
}

static void test_ed25519_refused(void **state)
{
    expect("ed-other", "ed", SLUICE_E_SIGNATURE, "not one of the 1 trusted key");
    expect("ed-tampered", "ed", SLUICE_E_SIGNATURE, "changed after it was signed");
    /* none beside the remote manifest: fails closed */
    expect("unsigned", "ed", SLUICE_E_SIGNATURE, "has no signature beside it");
    (void)state;
}

static void test_model_signing_fetched(void **state)
{
    expect("ms", "ec", SLUICE_OK, NULL);
    (void)state;
}

static void test_model_signing_refused(void **state)
{
    expect("ms-other", "ec", SLUICE_E_SIGNATURE, "model.sig");
    expect("ms-tampered", "ec", SLUICE_E_SIGNATURE, "differs from the one signed");
    /* an EC key and no model.sig: M.sig is looked for, which EC keys do
     * not check: fails closed */
    expect("unsigned", "ec", SLUICE_E_SIGNATURE, NULL);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ed25519_fetched),
        cmocka_unit_test(test_ed25519_refused),
        cmocka_unit_test(test_model_signing_fetched),
        cmocka_unit_test(test_model_signing_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
