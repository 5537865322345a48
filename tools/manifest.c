/* manifest.c: `sluice manifest`: writes the manifest of a model (version
 * 2 by default: every tensor's digest, dtype, shape and size, every file's
 * digest, size and header digest; see "Manifests" in sluice.h).
 *
 * The model is opened for its index only (which digests each header as it
 * parses it); the digests of every tensor and of every whole file (with
 * SHA-256, what the Hugging Face Hub lists for a Git LFS file)
 * are computed by the library's verify-only path (sluice_verify, digests
 * only; digest.c): a manifest is a statement about the files, not a load,
 * so nothing goes through the buffer pool and the bytes are hashed where
 * they lie in the page cache.
 * Nothing is written unless every tensor and file was read.
 */
#include "cmd.h"
#include "digest.h"
#include "integrity.h"
#include "jsonout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice manifest PATH [-o FILE] [--algorithm sha256|blake3] [--v1 | --flat]\n"
            "                       [-q] [--threads N]\n"
            "\n"
            "Computes the digest of every tensor of the model at PATH (a .safetensors\n"
            "file, a directory, or a *.safetensors.index.json) and of every whole file,\n"
            "on parallel threads (the library's sluice_verify, no buffer pool), and\n"
            "writes the manifest as JSON: format sluice-manifest version 2, tensors in\n"
            "model order with their dtype, shape and size, files with their size and\n"
            "the digest of their header, all of which sluice_open checks.\n"
            "\n"
            "  --algorithm ALG   sha256 (default) or blake3 (version 2 only)\n"
            "  --v1              version 1: SHA-256 digests of tensors and files only,\n"
            "                    for readers older than version 2 (headers not covered)\n"
            "  --flat            {\"tensor\": \"SHA-256\"} only (headers not covered)\n"
            "  -o FILE           write to FILE (replaced atomically) instead of stdout;\n"
            "                    sluice_open finds it by itself when FILE is the sidecar:\n"
            "                    F.manifest.json beside a single file F, else\n"
            "                    sluice.manifest.json in the model's directory\n"
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            "  --threads N       hashing threads (default: online CPUs)\n"
            "\n"
            "Exit status: 0 written, 1 a tensor or file could not be read, 2 usage or\n"
            "open error.\n");
}

/* Writes the manifest to out; returns 0 or -1 (errno set by stdio). */
enum { FORM_V2, FORM_V1, FORM_FLAT };

/* The version 2 entry of one tensor: digest, dtype, shape, nbytes. */
static void v2_tensor(FILE *out, const struct sluice_tensor_info *info, const uint8_t digest[32])
{
    char hex[65];
    fprintf(out, ": {\"digest\": \"%s\", \"dtype\": \"%s\", \"shape\": [",
            sluice_digest_hex(digest, hex), sluice_dtype_name(info->dtype));
    for (uint32_t d = 0; d < info->ndim; d++)
        fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)info->shape[d]);
    fprintf(out, "], \"nbytes\": %llu}", (unsigned long long)info->nbytes);
}

static int write_json(FILE *out, const sluice_model *m, const dg_result *tensors,
                      const dg_result *files, int form)
{
    size_t n = sluice_count(m);
    char hex[65], header_hex[65];
    sluice_algorithm alg = sluice_digest_algorithm(m);
    if (form == FORM_FLAT) {
        fputs("{", out);
        for (size_t i = 0; i < n; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            sluice_info(m, i, &info);
            fputs(i ? ",\n  " : "\n  ", out);
            json_string(out, info.name, info.name_len);
            fprintf(out, ": \"%s\"", sluice_digest_hex(tensors[i].digest, hex));
        }
        fputs(n ? "\n}\n" : "}\n", out);
    } else {
        fprintf(out, "{\n  \"format\": \"sluice-manifest\",\n  \"version\": %d,\n"
                "  \"algorithm\": \"%s\",\n  \"tensors\": {", form == FORM_V2 ? 2 : 1,
                sluice_algorithm_name(alg));
        for (size_t i = 0; i < n; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            sluice_info(m, i, &info);
            fputs(i ? ",\n    " : "\n    ", out);
            json_string(out, info.name, info.name_len);
            if (form == FORM_V2)
                v2_tensor(out, &info, tensors[i].digest);
            else
                fprintf(out, ": {\"sha256\": \"%s\"}", sluice_digest_hex(tensors[i].digest, hex));
        }
        fputs(n ? "\n  },\n  \"files\": {" : "},\n  \"files\": {", out);
        size_t nf = sluice_file_count(m);
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            sluice_file_info(m, i, &fi);
            const char *base = strrchr(fi.path, '/');
            base = base ? base + 1 : fi.path;
            fputs(i ? ",\n    " : "\n    ", out);
            json_string(out, base, strlen(base));
            uint8_t header[32];
            if (form == FORM_V2 && sluice_file_header_digest(m, i, alg, header) != SLUICE_OK)
                return -1;
            if (form == FORM_V2)
                fprintf(out, ": {\"digest\": \"%s\", \"size\": %llu, \"header\": \"%s\"}",
                        sluice_digest_hex(files[i].digest, hex), (unsigned long long)files[i].bytes,
                        sluice_digest_hex(header, header_hex));
            else
                fprintf(out, ": {\"sha256\": \"%s\", \"size\": %llu}",
                        sluice_digest_hex(files[i].digest, hex), (unsigned long long)files[i].bytes);
        }
        fputs(nf ? "\n  }\n}\n" : "}\n}\n", out);
    }
    return ferror(out) ? -1 : 0;
}

/* Writes to path through a temporary file in the same directory, renamed
 * over path once complete. */
static int write_file(const char *path, const sluice_model *m, const dg_result *tensors,
                      const dg_result *files, int form)
{
    size_t n = strlen(path) + sizeof ".tmp.XXXXXX";
    char *tmp = malloc(n);
    if (!tmp) {
        fprintf(stderr, "sluice manifest: out of memory\n");
        return -1;
    }
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        fprintf(stderr, "sluice manifest: %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    fchmod(fd, 0644);
    FILE *out = fdopen(fd, "w");
    if (!out) {
        fprintf(stderr, "sluice manifest: %s: %s\n", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    int bad = write_json(out, m, tensors, files, form) < 0 || fflush(out) != 0 || fsync(fd) != 0;
    int e = errno;
    if (fclose(out) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        fprintf(stderr, "sluice manifest: cannot write %s: %s\n", path, strerror(e));
        unlink(tmp);
    }
    free(tmp);
    return bad ? -1 : 0;
}

int cmd_manifest(int argc, char **argv)
{
    const char *path = NULL, *out_path = NULL, *alg_name = NULL;
    int form = FORM_V2, quiet = 0;
    sluice_options o;
    sluice_options_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = ig_file_option("manifest", argc, argv, &i, "--output", "-o", &out_path)) != 0) {
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--flat") || !strcmp(a, "--v1")) {
            if (form != FORM_V2 && form != (a[2] == 'f' ? FORM_FLAT : FORM_V1)) {
                fprintf(stderr, "sluice manifest: --v1 and --flat exclude each other\n");
                return 2;
            }
            form = a[2] == 'f' ? FORM_FLAT : FORM_V1;
        } else if (!strcmp(a, "--algorithm")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice manifest: --algorithm needs sha256 or blake3\n");
                return 2;
            }
            alg_name = argv[++i];
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--threads")) {
            if ((r = ig_loader_option("manifest", argc, argv, &i, &o)) < 0)
                return 2;
        } else if (ig_path_operand("manifest", a, &path, usage) < 0) {
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (out_path && !strcmp(out_path, "-"))
        out_path = NULL;
    int flat = form == FORM_FLAT;
    if (alg_name) {
        if (!strcmp(alg_name, "blake3")) {
            o.algorithm = SLUICE_ALG_BLAKE3;
        } else if (strcmp(alg_name, "sha256") != 0) {
            fprintf(stderr, "sluice manifest: --algorithm %s: not sha256 or blake3\n", alg_name);
            return 2;
        }
        if (o.algorithm != SLUICE_ALG_SHA256 && form != FORM_V2) {
            fprintf(stderr, "sluice manifest: --algorithm %s needs version 2 (not --v1 or --flat)\n",
                    alg_name);
            return 2;
        }
        if (!sluice_algorithm_supported(o.algorithm)) {
            fprintf(stderr, "sluice manifest: --algorithm %s: this build of the library lacks it\n",
                    alg_name);
            return 2;
        }
    }

    /* The index is all that is needed: no manifest, the smallest pool. */
    o.verify = SLUICE_VERIFY_OFF;
    o.pool_bytes = 4096;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", m ? sluice_errmsg(m) : sluice_strerror(rc));
        sluice_close(m);
        return 2;
    }
    size_t n = sluice_count(m), nf = sluice_file_count(m);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        total += info.nbytes;
    }
    if (!flat)
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            sluice_file_info(m, i, &fi);
            total += fi.file_size;
        }
    int status = 1;
    dg_result *tensors = NULL, *files = NULL;
    progress *bar = progress_start("manifest", total, quiet);
    long failed = dg_compute(m, "manifest", !flat, o.hash_threads, bar, &tensors, &files);
    progress_stop(bar);
    bar = NULL;
    if (failed < 0)
        goto done;
    for (size_t i = 0; !flat && i < nf; i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &fi);
        if (files[i].ok && files[i].bytes != fi.file_size) {
            fprintf(stderr, "sluice manifest: %s: %llu bytes now, %llu at open: the file changed\n",
                    fi.path, (unsigned long long)files[i].bytes, (unsigned long long)fi.file_size);
            failed++;
        }
    }
    if (failed) {
        fprintf(stderr, "sluice manifest: %ld failure%s, nothing written\n", failed,
                failed == 1 ? "" : "s");
        goto done;
    }
    if (out_path) {
        if (write_file(out_path, m, tensors, files, form) < 0)
            goto done;
    } else if (write_json(stdout, m, tensors, files, form) < 0 || fflush(stdout) != 0) {
        fprintf(stderr, "sluice manifest: cannot write to stdout: %s\n", strerror(errno));
        goto done;
    }
    status = 0;
done:
    progress_stop(bar);
    free(tensors);
    free(files);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
        status = 1;
    }
    return status;
}
