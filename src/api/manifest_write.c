/* manifest_write.c: the one writer of a manifest's JSON (manifest_write.h). */
#include "api/manifest_write.h"
#include "base/replace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void sl_mw_json_string(FILE *out, const char *s, size_t len)
{
    fputc('"', out);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(out, "\\u%04x", c);
            else
                fputc(c, out);
        }
    }
    fputc('"', out);
}

static const uint8_t *at(const uint8_t *base, size_t stride, size_t i)
{
    return base + i * stride;
}

static uint64_t file_bytes(const sl_mw *w, size_t i)
{
    return *(const uint64_t *)(const void *)((const char *)w->file_bytes + i * w->file_stride);
}

/* The version 2 entry of one tensor: digest, dtype, shape, nbytes, and
 * its chunk digests when it has some. */
static void v2_tensor(FILE *out, const struct sluice_tensor_info *info, const uint8_t digest[32],
                      const sl_mw *w)
{
    char hex[65];
    fprintf(out, ": {\"digest\": \"%s\", \"dtype\": \"%s\", \"shape\": [",
            sluice_digest_hex(digest, hex), sluice_dtype_name(info->dtype));
    for (uint32_t d = 0; d < info->ndim; d++)
        fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)info->shape[d]);
    fprintf(out, "], \"nbytes\": %llu", (unsigned long long)info->nbytes);
    uint32_t n = w->chunk_count ? w->chunk_count[info->index] : 0;
    if (n) {
        fprintf(out, ", \"chunk_bytes\": %llu, \"chunks\": [", (unsigned long long)w->chunk_bytes);
        for (uint32_t k = 0; k < n; k++)
            fprintf(out, "%s\"%s\"", k ? ", " : "",
                    sluice_digest_hex(w->chunks[w->chunk_first[info->index] + k], hex));
        fputs("]", out);
    }
    if (w->extra)
        w->extra(out, w->user, info);
    fputs("}", out);
}

static int wanted(const sl_mw *w, size_t file_index)
{
    return w->only_file == SIZE_MAX || w->only_file == file_index;
}

/* One member's key: the separator before it (*sep, then next for the
 * members after it) and the name as a JSON string. */
static void key(FILE *out, const char **sep, const char *next, const char *name, size_t len)
{
    fputs(*sep, out);
    *sep = next;
    sl_mw_json_string(out, name, len);
}

/* Tensor i's info, and its key written (as key) when its file is wanted;
 * 0 when it is not (nothing written). */
static int tensor_key(FILE *out, const sluice_model *m, const sl_mw *w, size_t i,
                      struct sluice_tensor_info *info, const char **sep, const char *next)
{
    sluice_info(m, i, info);
    if (!wanted(w, info->file_index))
        return 0;
    key(out, sep, next, info->name, info->name_len);
    return 1;
}

int sl_manifest_write(FILE *out, const sluice_model *m, const sl_mw *w)
{
    size_t n = sluice_count(m);
    char hex[65], header_hex[65];
    const char *sep = "\n  ";
    if (w->form == SL_MW_FLAT) {
        fputs("{", out);
        for (size_t i = 0; i < n; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            if (!tensor_key(out, m, w, i, &info, &sep, ",\n  "))
                continue;
            fprintf(out, ": \"%s\"",
                    sluice_digest_hex(at(w->tensor_digest, w->tensor_stride, i), hex));
        }
        fputs(sep[0] == ',' ? "\n}\n" : "}\n", out);
        return ferror(out) ? -1 : 0;
    }
    fprintf(out, "{\n  \"format\": \"sluice-manifest\",\n  \"version\": %d,\n"
            "  \"algorithm\": \"%s\",\n  \"tensors\": {", w->form == SL_MW_V2 ? 2 : 1,
            sluice_algorithm_name(w->alg));
    sep = "\n    ";
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        if (!tensor_key(out, m, w, i, &info, &sep, ",\n    "))
            continue;
        const uint8_t *d = at(w->tensor_digest, w->tensor_stride, i);
        if (w->form == SL_MW_V2)
            v2_tensor(out, &info, d, w);
        else
            fprintf(out, ": {\"sha256\": \"%s\"}", sluice_digest_hex(d, hex));
    }
    fputs(sep[0] == ',' ? "\n  },\n  \"files\": {" : "},\n  \"files\": {", out);
    sep = "\n    ";
    size_t nf = sluice_file_count(m);
    for (size_t i = 0; i < nf; i++) {
        if (!wanted(w, i))
            continue;
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &fi);
        const char *base = strrchr(fi.path, '/');
        base = base ? base + 1 : fi.path;
        key(out, &sep, ",\n    ", base, strlen(base));
        const uint8_t *d = at(w->file_digest, w->file_stride, i);
        uint8_t header[32];
        if (w->form == SL_MW_V2 && sluice_file_header_digest(m, i, w->alg, header) != SLUICE_OK)
            return -1;
        if (w->form == SL_MW_V2)
            fprintf(out, ": {\"digest\": \"%s\", \"size\": %llu, \"header\": \"%s\"}",
                    sluice_digest_hex(d, hex), (unsigned long long)file_bytes(w, i),
                    sluice_digest_hex(header, header_hex));
        else
            fprintf(out, ": {\"sha256\": \"%s\", \"size\": %llu}", sluice_digest_hex(d, hex),
                    (unsigned long long)file_bytes(w, i));
    }
    fputs(sep[0] == ',' ? "\n  }\n}\n" : "}\n}\n", out);
    return ferror(out) ? -1 : 0;
}

int sl_manifest_write_file(const char *path, const sluice_model *m, const sl_mw *w)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out)
        return -1;
    int bad = sl_manifest_write(out, m, w) < 0;
    bad |= fclose(out) != 0;
    if (bad) {
        free(text);
        errno = ENOMEM;
        return -1;
    }
    int rc = sl_replace_file(path, text, len);
    int e = errno;
    free(text);
    errno = e;
    return rc;
}
