/* fuzz_manifest.c: libFuzzer target for the manifest reader. The input is
 * a manifest for a small model (three tensors "x", "y", "z" in two files,
 * written once); reading it under each policy must succeed or fail
 * cleanly. */
#include "index.h"
#include "manifest.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];
static char manifest_path[128];
static sl_index ix;

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len)
        abort();
    fclose(f);
}

static void write_shard(const char *name, const char *header, size_t data_len)
{
    char path[160];
    unsigned char buf[512] = {0};
    size_t n = strlen(header);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, buf, 8 + n + data_len);
}

static void cleanup(void)
{
    char path[160];
    const char *names[] = {"a.safetensors", "b.safetensors", "m.json"};
    sl_index_free(&ix);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void setup_once(void)
{
    if (dir[0])
        return;
    snprintf(dir, sizeof dir, "/tmp/sluice-fuzz-manifest-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    write_shard("a.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                                 "\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}", 3);
    write_shard("b.safetensors", "{\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4);
    sl_err err;
    if (sl_index_open(&ix, dir, &err) != SLUICE_OK)
        abort();
    snprintf(manifest_path, sizeof manifest_path, "%s/m.json", dir);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    write_file(manifest_path, data, size);
    static const sluice_verify_policy policies[] = {SLUICE_VERIFY_DEFAULT, SLUICE_VERIFY_IF_PRESENT};
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        sluice_options opts;
        sluice_options_init(&opts);
        opts.manifest_path = manifest_path;
        opts.verify = policies[p];
        sl_manifest *m = NULL;
        sl_err err;
        if (sl_manifest_load(&ix, &opts, dir, &m, &err) == SLUICE_OK) {
            for (size_t i = 0; i < ix.ntensors; i++)
                (void)sl_manifest_tensor_digest(m, i);
            for (size_t i = 0; i < ix.nfiles; i++)
                (void)sl_manifest_file_digest(m, i, NULL);
            sl_manifest_free(m);
        } else if (m) {
            abort(); /* a failed load leaves nothing behind */
        }
    }
    return 0;
}
