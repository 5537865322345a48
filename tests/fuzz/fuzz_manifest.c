/* fuzz_manifest.c: libFuzzer target for the manifest reader. The input is
 * a manifest for a small model (three tensors "x", "y", "z" in two files,
 * written once); reading it under each policy must succeed or fail
 * cleanly. */
#include "fuzz_files.h"
#include "index/index.h"
#include "trust/manifest.h"
#include "../trust_fixture.h"
#include "verdict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char manifest_path[160];
static sl_index ix;

static void cleanup(void)
{
    sl_index_free(&ix);
    fz_remove("m.json");
}

static void setup_once(void)
{
    if (fz_dir[0])
        return;
    fz_make("manifest");
    sl_err err;
    if (sl_index_open(&ix, fz_dir, &err) != SLUICE_OK)
        abort();
    snprintf(manifest_path, sizeof manifest_path, "%s", fz_path("m.json"));
    atexit(cleanup);
}

const char fuzz_target_name[] = "manifest";

/* The verdict is the first policy's failure (both must fail cleanly). */
int fuzz_verdict(const uint8_t *data, size_t size)
{
    setup_once();
    int verdict = SLUICE_OK;
    fz_write_file(manifest_path, data, size);
    static const sluice_verify_policy policies[] = {SLUICE_VERIFY_DEFAULT, SLUICE_VERIFY_IF_PRESENT};
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        sluice_options opts;
        sluice_options_init(&opts);
        opts.manifest_path = manifest_path;
        opts.verify = policies[p];
        sl_manifest *m = NULL;
        sl_err err;
        sl_trust_plan plan;
        int rc = tf_plan(&opts, fz_dir, &plan, &err);
        if (rc == SLUICE_OK)
            rc = tf_load(&ix, &plan, fz_dir, &m, NULL, &err);
        if (verdict == SLUICE_OK)
            verdict = rc;
        if (rc == SLUICE_OK) {
            for (size_t i = 0; i < ix.ntensors; i++) {
                (void)sl_manifest_tensor_digest(m, i);
                (void)sl_manifest_part_digest(m, i, 0, 2, 1);
            }
            for (size_t i = 0; i < ix.nfiles; i++)
                (void)sl_manifest_file_digest(m, i, NULL);
            sl_manifest_free(m);
        } else if (m) {
            abort(); /* a failed load leaves nothing behind */
        }
    }
    return verdict;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
