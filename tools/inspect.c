/* inspect.c: `sluice inspect PATH [--json]`: the index of a model, as a
 * table or as one JSON object, and what its bytes would be checked
 * against when loaded (sluice_verify_state, worded as `sluice verify`
 * words it). Opens the model as a load does (headers, the manifest and
 * its signature); reads no tensor. */
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

/* What a failed verifying open said (failed[0] == 0: it opened). */
static void print_json(const sluice_model *m, const char *failed)
{
    size_t nf = sluice_file_count(m), nt = sluice_count(m);
    const char *where = NULL;
    int state = failed[0] ? -1 : sluice_verify_state(m, &where);
    printf("{\"verification\": {\"state\": \"%s\", \"manifest\": ",
           state < 0 ? "failed" : state == SLUICE_VERIFIED ? "verified"
           : state == SLUICE_VERIFIED_PUBLISHER_DIGEST ? "publisher_digest"
           : state == SLUICE_UNVERIFIED_NO_MANIFEST ? "no_manifest" : "off");
    const char *mf = state == SLUICE_VERIFIED || state == SLUICE_VERIFIED_PUBLISHER_DIGEST
                         ? sluice_manifest_path(m) : NULL;
    const char *detail = state < 0 ? failed : state == SLUICE_UNVERIFIED_NO_MANIFEST ? where : NULL;
    if (mf)
        json_string(stdout, mf, strlen(mf));
    else
        printf("null");
    printf(", \"detail\": ");
    if (detail)
        json_string(stdout, detail, strlen(detail));
    else
        printf("null");
    printf("},\n \"files\": [");
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

static void print_table(const sluice_model *m, const char *path, const sluice_options *o,
                        const ig_trust *trust, const char *failed)
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
    if (failed[0])
        printf("verification: FAILED: %s\n", failed);
    else
        ig_print_checked_against(stdout, "verification: ", path, m, o, trust);
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

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice inspect PATH [--json] [--manifest FILE] [trust options]\n"
            "  PATH: a .safetensors file, a directory, or a *.safetensors.index.json\n"
            "  --json: one JSON object {verification, files, metadata, tensors}\n"
            "          instead of a table\n"
            "  --manifest FILE   the manifest (default: the sidecar, as a load finds it)\n"
            IG_TRUST_HELP
            "\n"
            "Lists the tensors, metadata and totals, and says what a load's bytes are\n"
            "checked against, as 'sluice verify' words it: 'manifest M' (and the\n"
            "signature verified, with --key, --ca or --signature), 'verified against\n"
            "the publisher's file digest' (a Hugging Face Hub snapshot), 'not\n"
            "verified: no manifest found'; or 'FAILED' and why the open a load makes\n"
            "refused it (a manifest that does not match the headers, a signature\n"
            "refused), the index then listed from the headers alone. It opens the\n"
            "model as a load does (headers, the manifest and its signature; a Hub\n"
            "snapshot seen for the first time is hashed once, as its first load\n"
            "does) and reads no tensor: 'sluice verify' checks the tensors.\n"
            "\n"
            CMD_EXIT_HELP
            "inspect: the status of a refused open (1 integrity, 3, 4 signature)\n"
            "after the listing.\n");
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    ig_trust trust = {0};
    sluice_options opts;
    sluice_options_init(&opts);
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = ig_file_option("inspect", argc, argv, &i, "--manifest", "-m",
                                       &opts.manifest_path)) != 0 ||
                   (r = ig_trust_option("inspect", argc, argv, &i, &trust, &opts)) != 0) {
            if (r < 0)
                return 2;
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            fprintf(stderr, "sluice inspect: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    /* as a load opens it (DEFAULT), so that the state shown is a load's */
    sluice_model *m = NULL;
    char failed[1100] = "";
    int status = 0, rc = sluice_open(path, &opts, &m);
    if (rc < 0) {
        status = cmd_exit_status(rc);
        if (status == CMD_EXIT_USAGE || rc == SLUICE_E_NOMEM)
            return ig_open_failed("inspect", m, rc);
        /* refused: the index from the headers alone, and why */
        snprintf(failed, sizeof failed, "%s", m ? sluice_errmsg(m) : sluice_strerror(rc));
        sluice_close(m);
        m = NULL;
        sluice_options off;
        sluice_options_init(&off);
        off.verify = SLUICE_VERIFY_OFF;
        int rc2 = sluice_open(path, &off, &m);
        if (rc2 < 0) /* the headers themselves: one line, as before */
            return ig_open_failed("inspect", m, rc2);
        fprintf(stderr, "sluice inspect: %s\n", failed);
    }
    if (json)
        print_json(m, failed);
    else
        print_table(m, path, &opts, &trust, failed);
    sluice_close(m);
    return status;
}
