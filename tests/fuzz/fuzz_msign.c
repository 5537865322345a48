/* fuzz_msign.c: libFuzzer target for OpenSSF model-signing bundles
 * (model_signing.c). The input is a bundle (model.sig); a trusted EC key
 * and a trusted CA are fixed (corpus/msign was written for them by
 * tests/model_signing_fx.py, their private halves thrown away; the CA
 * remade when the leaf rule came, its cert*.sig with it). Every
 * input is verified through sl_ms_verify_text as sluice_open runs it:
 * accepted with a statement, or rejected with SLUICE_E_SIGNATURE and a
 * message, never a crash or a leak. */
#include "fuzz_files.h"
#include "trust/model_signing.h"
#include "verdict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char public_key[] =
    "-----BEGIN PUBLIC KEY-----\n"
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAErmOQSYU/KjAU8BJXq4csANlfTPAl\n"
    "TMAYuCpnn2BTg3VJkrlsu2iqCMvjUSNFXX5gb0nbJ1Ff2gamZiY0XbFX8A==\n"
    "-----END PUBLIC KEY-----\n";
static const char ca_cert[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBfTCCAQKgAwIBAgIUdgik9ENXMRdUXVkyVA+VHtGWTW8wCgYIKoZIzj0EAwIw\n"
    "DTELMAkGA1UEAwwCY2EwHhcNMjYwMTAxMDAwMDAwWhcNMzUxMjMwMDAwMDAwWjAN\n"
    "MQswCQYDVQQDDAJjYTB2MBAGByqGSM49AgEGBSuBBAAiA2IABI5jXmipIEDlWk0H\n"
    "YSfOGzWnzSwvDEM0P0avYGVN5cxbKDKPIwVFgUnCgdiiImWU1hhIoTyqu8KefnSh\n"
    "63VX0QQRGqql9faaeh0uRuvgzFil0YeFGQmnYWf8z487ZZSHSaMjMCEwDwYDVR0T\n"
    "AQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAQYwCgYIKoZIzj0EAwIDaQAwZgIxAKab\n"
    "rLz83oC/YmEzrjOeCI/WXYuBaMvUI9Yv5K8KFPwMyx0Vb57cABV8IjBiBFax0wIx\n"
    "ANoLDgBsUbbGmTGmz1ed3pLruJUi9u64yMFI6ruh7eo9bMcz4KkVdKTZrqrnFz4z\n"
    "/g==\n"
    "-----END CERTIFICATE-----\n";
static char key_path[160], ca_path[160];

static void cleanup(void)
{
    unlink(key_path);
    unlink(ca_path);
    fz_remove("k.pub");
}

static void setup_once(void)
{
    if (fz_dir[0])
        return;
    fz_make("msign");
    snprintf(key_path, sizeof key_path, "%s", fz_path("k.pub"));
    snprintf(ca_path, sizeof ca_path, "%s", fz_path("ca.pem"));
    fz_write_file(key_path, public_key, sizeof public_key - 1);
    fz_write_file(ca_path, ca_cert, sizeof ca_cert - 1);
    atexit(cleanup);
}

const char fuzz_target_name[] = "msign";

int fuzz_verdict(const uint8_t *data, size_t size)
{
    setup_once();
    const char *keys[] = {key_path}, *cas[] = {ca_path};
    sl_ms_trust t = {keys, 1, cas, 1};
    sl_ms_statement *s = NULL;
    sl_err err = {0};
    int rc = sl_ms_verify_text("fuzz.sig", (const char *)data, size, &t, &s, &err);
    if ((rc == SLUICE_OK) != (s != NULL) || (rc < 0 && !err.msg[0]))
        abort(); /* a statement exactly when accepted; every rejection says why */
    sl_ms_statement_free(s);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
