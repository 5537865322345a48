/* fuzz_index.c: libFuzzer target for the index.json reader. The input is
 * the text of model.safetensors.index.json in a folder that holds two
 * valid shards (written once); opening must succeed or fail cleanly. */
#include "fuzz_files.h"
#include "index/index.h"
#include "verdict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char index_path[160];

static void cleanup(void)
{
    fz_remove("model.safetensors.index.json");
}

static void setup_once(void)
{
    if (fz_dir[0])
        return;
    fz_make("index");
    snprintf(index_path, sizeof index_path, "%s", fz_path("model.safetensors.index.json"));
    atexit(cleanup);
}

const char fuzz_target_name[] = "index";

int fuzz_verdict(const uint8_t *data, size_t size)
{
    setup_once();
    fz_write_file(index_path, data, size);
    sl_index ix;
    sl_err err;
    int rc = sl_index_open(&ix, fz_dir, &err);
    if (rc == SLUICE_OK) {
        for (size_t i = 0; i < ix.ntensors; i++)
            if (sl_index_find(&ix, ix.tensors[i].name, ix.tensors[i].name_len) != i)
                abort();
        sl_index_free(&ix);
    }
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
