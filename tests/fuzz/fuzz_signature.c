/* fuzz_signature.c: libFuzzer target for signature files (signature.c).
 * The input is a signature file for a fixed manifest; a trusted key is
 * fixed too (its private half was thrown away once corpus/signature/
 * good.sig was signed with it). Every input must be rejected with
 * SLUICE_E_SIGNATURE or, when it parses, checked through the whole of
 * sl_signature_check as sluice_open runs it. */
#include "fuzz_files.h"
#include "trust/signature.h"
#include "verdict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char manifest[] =
    "{\"x\": \"0000000000000000000000000000000000000000000000000000000000000000\"}\n";
static const char public_key[] = "-----BEGIN PUBLIC KEY-----\n"
                                 "MCowBQYDK2VwAyEArC8LrZqEcrgIqq9tczCogpvuRhkNeP0Zeh8jZZa3pbY=\n"
                                 "-----END PUBLIC KEY-----\n";
static char manifest_path[160], sig_path[170], key_path[160];

static void cleanup(void)
{
    unlink(key_path);
    unlink(manifest_path);
    fz_remove("m.json.sig");
}

static void setup_once(void)
{
    if (fz_dir[0])
        return;
    fz_make("signature");
    snprintf(manifest_path, sizeof manifest_path, "%s", fz_path("m.json"));
    snprintf(sig_path, sizeof sig_path, "%s", fz_path("m.json.sig"));
    snprintf(key_path, sizeof key_path, "%s", fz_path("k.pub"));
    fz_write_file(manifest_path, manifest, sizeof manifest - 1);
    fz_write_file(key_path, public_key, sizeof public_key - 1);
    atexit(cleanup);
}

const char fuzz_target_name[] = "signature";

int fuzz_verdict(const uint8_t *data, size_t size)
{
    setup_once();
    sl_sig sig;
    char why[512];
    if (sl_sig_parse((const char *)data, size, &sig, why, sizeof why) < 0) {
        if (!why[0] || strlen(why) >= sizeof why)
            abort(); /* every rejection says why */
        return SLUICE_E_SIGNATURE;
    }
    /* what parses writes back the same: the format has one spelling */
    char again[SL_SIG_TEXT_LEN + 1];
    if (sl_sig_format(&sig, again) != size || memcmp(again, data, size) != 0)
        abort();
    fz_write_file(sig_path, data, size);
    const char *keys[] = {key_path};
    sl_err err;
    return sl_signature_check(manifest_path, manifest, sizeof manifest - 1, keys, 1, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
