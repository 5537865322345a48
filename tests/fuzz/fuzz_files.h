/* fuzz_files.h: the small model the index.json and manifest fuzz targets
 * read their input beside: a folder with two valid shards, written once
 * per process and removed at exit. */
#ifndef SLUICE_FUZZ_FILES_H
#define SLUICE_FUZZ_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tensors "x", "y" (a.safetensors) and "z" (b.safetensors). */
static char fz_dir[64];

static void fz_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len)
        abort();
    fclose(f);
}

/* dir/name, in a static buffer (one at a time). */
static const char *fz_path(const char *name)
{
    static char path[160];
    snprintf(path, sizeof path, "%s/%s", fz_dir, name);
    return path;
}

static void fz_write_shard(const char *name, const char *header, size_t data_len)
{
    unsigned char buf[512] = {0};
    size_t n = strlen(header);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    fz_write_file(fz_path(name), buf, 8 + n + data_len);
}

/* Removes the shards, the input file `extra` and the folder. */
static void fz_remove(const char *extra)
{
    unlink(fz_path("a.safetensors"));
    unlink(fz_path("b.safetensors"));
    unlink(fz_path(extra));
    rmdir(fz_dir);
}

/* Makes the folder (named after the target) and its two shards. */
static void fz_make(const char *target)
{
    snprintf(fz_dir, sizeof fz_dir, "/tmp/sluice-fuzz-%s-XXXXXX", target);
    if (!mkdtemp(fz_dir))
        abort();
    fz_write_shard("a.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                                    "\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}", 3);
    fz_write_shard("b.safetensors", "{\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4);
}

#endif
