/* inspect.c: `sluice inspect PATH [--json]`: the index of a model, as a
 * table or as one JSON object. Reads headers only. */
#include "cmd.h"
#include "integrity.h"
#include "jsonout.h"

#include <sluice.h>
#include <stdio.h>
#include <string.h>

static void print_shape(FILE *out, const struct sluice_tensor_info *t)
{
    fputc('[', out);
    for (uint32_t k = 0; k < t->ndim; k++)
        fprintf(out, "%s%llu", k ? ", " : "", (unsigned long long)t->shape[k]);
    fputc(']', out);
}

/* A name for the table: non-printable bytes as \xNN. */
static void print_name(FILE *out, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
}

static void print_json(const sluice_model *m)
{
    size_t nf = sluice_file_count(m), nt = sluice_count(m);
    printf("{\"files\": [");
    for (size_t i = 0; i < nf; i++) {
        struct sluice_file_info f = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &f);
        printf("%s", i ? ", " : "");
        json_string(stdout, f.path, strlen(f.path));
    }
    printf("], \"metadata\": {");
    for (size_t i = 0; i < nf; i++) {
        struct sluice_file_info f = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &f);
        printf("%s", i ? ", " : "");
        json_string(stdout, f.path, strlen(f.path));
        if (f.metadata_kind != SLUICE_METADATA_OBJECT) {
            printf(": null");
            continue;
        }
        printf(": {");
        for (size_t k = 0; k < f.metadata_count; k++) {
            printf("%s", k ? ", " : "");
            json_string(stdout, f.metadata[k].key, f.metadata[k].key_len);
            printf(": ");
            json_string(stdout, f.metadata[k].value, f.metadata[k].value_len);
        }
        printf("}");
    }
    printf("}, \"tensors\": [");
    for (size_t i = 0; i < nt; i++) {
        struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &t);
        printf("%s\n  {\"name\": ", i ? "," : "");
        json_string(stdout, t.name, t.name_len);
        printf(", \"dtype\": \"%s\", \"shape\": ", sluice_dtype_name(t.dtype));
        print_shape(stdout, &t);
        printf(", \"data_offsets\": [%llu, %llu], \"file\": ", (unsigned long long)t.data_begin,
               (unsigned long long)t.data_end);
        json_string(stdout, t.file, strlen(t.file));
        printf("}");
    }
    printf("%s]}\n", nt ? "\n" : "");
}

static void print_table(const sluice_model *m)
{
    size_t nf = sluice_file_count(m), nt = sluice_count(m);
    uint64_t total = 0;
    for (size_t i = 0; i < nf; i++) {
        struct sluice_file_info f = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &f);
        printf("file %zu: %s  (%llu bytes, header %llu bytes, %zu tensors)\n", i, f.path,
               (unsigned long long)f.file_size, (unsigned long long)f.header_bytes, f.tensor_count);
        if (f.metadata_kind == SLUICE_METADATA_ABSENT)
            printf("  metadata: none\n");
        else if (f.metadata_kind == SLUICE_METADATA_NULL)
            printf("  metadata: null\n");
        for (size_t k = 0; k < f.metadata_count; k++) {
            printf("  metadata: ");
            print_name(stdout, f.metadata[k].key, f.metadata[k].key_len);
            printf(" = ");
            print_name(stdout, f.metadata[k].value, f.metadata[k].value_len);
            printf("\n");
        }
    }
    printf("\n%-6s %-48s %-8s %-22s %14s %5s %14s\n", "#", "name", "dtype", "shape", "bytes", "file", "offset");
    for (size_t i = 0; i < nt; i++) {
        struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &t);
        total += t.nbytes;
        printf("%-6zu ", i);
        print_name(stdout, t.name, t.name_len);
        int pad = 48 - (int)t.name_len;
        printf("%*s %-8s ", pad > 0 ? pad : 0, "", sluice_dtype_name(t.dtype));
        char shape[256];
        FILE *s = fmemopen(shape, sizeof shape, "w");
        if (s) {
            print_shape(s, &t);
            fclose(s);
        } else {
            shape[0] = '\0';
        }
        printf("%-22s %14llu %5zu %14llu\n", shape, (unsigned long long)t.nbytes, t.file_index,
               (unsigned long long)t.offset);
    }
    printf("\ntotal: %zu tensors, %llu bytes (%.3f GiB) in %zu file%s\n", nt, (unsigned long long)total,
           (double)total / (1024.0 * 1024 * 1024), nf, nf == 1 ? "" : "s");
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: sluice inspect PATH [--json]\n"
                   "  PATH: a .safetensors file, a directory, or a *.safetensors.index.json\n"
                   "  --json: one JSON object {files, metadata, tensors} instead of a table\n"
                   "\n"
                   CMD_EXIT_HELP);
            return 0;
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            fprintf(stderr, "sluice inspect: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: sluice inspect PATH [--json]\n");
        return 2;
    }
    sluice_options opts;
    sluice_options_init(&opts);
    opts.verify = SLUICE_VERIFY_OFF; /* inspect reads headers only */
    sluice_model *m = NULL;
    int rc = sluice_open(path, &opts, &m);
    if (rc < 0)
        return ig_open_failed("inspect", m, rc);
    if (json)
        print_json(m);
    else
        print_table(m);
    sluice_close(m);
    return 0;
}
