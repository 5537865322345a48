/* fuzz_index.c: libFuzzer target for the index.json reader. The input is
 * the text of model.safetensors.index.json in a folder that holds two
 * valid shards (written once); opening must succeed or fail cleanly. */
#include "index.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];
static char index_path[128];

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

static void remove_dir(void)
{
    char path[160];
    const char *names[] = {"a.safetensors", "b.safetensors", "model.safetensors.index.json"};
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
    snprintf(dir, sizeof dir, "/tmp/sluice-fuzz-index-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    write_shard("a.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                                 "\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}", 3);
    write_shard("b.safetensors", "{\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    atexit(remove_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    write_file(index_path, data, size);
    sl_index ix;
    sl_err err;
    if (sl_index_open(&ix, dir, &err) == SLUICE_OK) {
        for (size_t i = 0; i < ix.ntensors; i++)
            if (sl_index_find(&ix, ix.tensors[i].name, ix.tensors[i].name_len) != i)
                abort();
        sl_index_free(&ix);
    }
    return 0;
}
