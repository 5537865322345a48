/* manifest.c: `sluice manifest`: writes the manifest of a model (version
 * 2 by default: every tensor's digest, dtype, shape and size, every file's
 * digest, size and header digest; see "Manifests" in sluice.h) with the
 * library's one writer, sluice_manifest_write (src/api/manifest_make.c,
 * which the Python package's sluice.write_manifest calls too): this file
 * reads the command line, opens the model for its index only and shows
 * the progress. Nothing is written unless every tensor and file was read.
 */
#include "cmd.h"
#include "integrity.h"
#include "progress.h"
#include "shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice manifest PATH [-o FILE [--sign-key KEY]] [--algorithm sha256|blake3]\n"
            "                       [--v1 | --flat] [--parts RULES [--worlds 2,4,8]] [-q]\n"
            "                       [--threads N]\n"
            "\n"
            "Computes the digest of every tensor of the model at PATH (a .safetensors\n"
            "file, a directory, or a *.safetensors.index.json) and of every whole file,\n"
            "on parallel threads (the library's sluice_verify, no buffer pool), and\n"
            "writes the manifest as JSON: format sluice-manifest version 2, tensors in\n"
            "model order with their dtype, shape and size, files with their size and\n"
            "the digest of their header, all of which sluice_open checks.\n"
            "\n"
            "  --algorithm ALG   sha256 (default) or blake3 (version 2 only)\n"
            "  --chunk SIZE      version 2: tensors larger than SIZE also get the digest of\n"
            "                    each SIZE-byte chunk (K, M, G suffixes; at least 4K), so\n"
            "                    that one tensor hashes on every core and a range of it\n"
            "                    verifies alone (default 16M; 0: no chunk digests)\n"
            "  --parts RULES     version 2: each tensor the rules split (a rules file, or\n"
            "                    `builtin`: docs/parallel.md) also gets the digest of each\n"
            "                    of its tensor-parallel parts, so that a rank verifies its\n"
            "                    part alone, reading only its bytes\n"
            "  --worlds LIST     the world sizes of --parts (default 2,4,8; each that\n"
            "                    divides a tensor's split dim is written)\n"
            "  --v1              version 1: SHA-256 digests of tensors and files only,\n"
            "                    for readers older than version 2 (headers not covered)\n"
            "  --flat            {\"tensor\": \"SHA-256\"} only (headers not covered)\n"
            "  -o FILE           write to FILE (replaced atomically) instead of stdout;\n"
            "                    sluice_open finds it by itself when FILE is the sidecar:\n"
            "                    F.manifest.json beside a single file F, else\n"
            "                    sluice.manifest.json in the model's directory\n"
            "  --sign-key KEY    then sign FILE with the Ed25519 private key KEY, as\n"
            "                    'sluice sign FILE --key KEY' does, into FILE.sig\n"
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            "  --threads N       hashing threads (default: online CPUs)\n"
            "\n"
            CMD_EXIT_HELP
            "manifest: 3 also when a tensor or file could not be read (nothing written),\n"
            "or, with --sign-key, the key cannot sign (the manifest stays, unsigned).\n");
}

enum { FORM_V2, FORM_V1, FORM_FLAT };

/* --worlds "2,4,8" into ps. Returns 0 or -1. */
static int parse_worlds(const char *s, sluice_manifest_options *ps)
{
    ps->nworlds = 0;
    while (*s) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || errno || v < 2 || v > 65536 || ps->nworlds == 8 || (*end && *end != ','))
            return -1;
        for (size_t k = 0; k < ps->nworlds; k++)
            if (ps->worlds[k] == v)
                return -1;
        ps->worlds[ps->nworlds++] = v;
        s = *end ? end + 1 : end;
        if (*end && !*s)
            return -1;
    }
    return ps->nworlds ? 0 : -1;
}

/* The progress bar's count, and each item that could not be read. */
static void on_bytes(void *user, uint64_t bytes)
{
    progress_add(user, bytes);
}

static void on_failure(void *user, const char *message)
{
    progress_printf(user, stderr, "sluice manifest: %s\n", message);
}

int cmd_manifest(int argc, char **argv)
{
    const char *path = NULL, *out_path = NULL, *alg_name = NULL, *chunk_arg = NULL,
               *sign_key = NULL;
    const char *parts_arg = NULL, *worlds_arg = NULL;
    sluice_manifest_options mo;
    sluice_manifest_options_init(&mo);
    sluice_part_rules *rules = NULL;
    int form = FORM_V2, quiet = 0;
    uint64_t chunk_bytes = mo.chunk_bytes;
    sluice_options o;
    sluice_options_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = ig_file_option("manifest", argc, argv, &i, "--output", "-o", &out_path)) != 0 ||
                   (r = ig_file_option("manifest", argc, argv, &i, "--sign-key", NULL, &sign_key)) != 0) {
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--flat") || !strcmp(a, "--v1")) {
            if (form != FORM_V2 && form != (a[2] == 'f' ? FORM_FLAT : FORM_V1)) {
                fprintf(stderr, "sluice manifest: --v1 and --flat exclude each other\n");
                return 2;
            }
            form = a[2] == 'f' ? FORM_FLAT : FORM_V1;
        } else if (!strcmp(a, "--chunk")) {
            if (i + 1 >= argc || ig_parse_size(argv[i + 1], &chunk_bytes) < 0 ||
                (chunk_bytes && chunk_bytes < 4096)) {
                fprintf(stderr, "sluice manifest: --chunk needs 0 or a size of at least 4K\n");
                return 2;
            }
            chunk_arg = argv[++i];
        } else if (!strcmp(a, "--parts") || !strcmp(a, "--worlds")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice manifest: %s needs a value\n", a);
                return 2;
            }
            *(a[2] == 'p' ? &parts_arg : &worlds_arg) = argv[++i];
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
    if (sign_key && !out_path) {
        fprintf(stderr, "sluice manifest: --sign-key needs -o FILE (the signature is FILE.sig "
                        "beside it)\n");
        return 2;
    }
    if (chunk_arg && form != FORM_V2) {
        fprintf(stderr, "sluice manifest: --chunk needs version 2 (not --v1 or --flat)\n");
        return 2;
    }
    if (form != FORM_V2)
        chunk_bytes = 0;
    if ((parts_arg || worlds_arg) && form != FORM_V2) {
        fprintf(stderr, "sluice manifest: --parts needs version 2 (not --v1 or --flat)\n");
        return 2;
    }
    if (worlds_arg && (!parts_arg || parse_worlds(worlds_arg, &mo) < 0)) {
        fprintf(stderr, "sluice manifest: --worlds needs --parts and a list of distinct world "
                        "sizes in 2..65536, at most 8 (2,4,8)\n");
        return 2;
    }
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

    int lr = parts_arg ? shard_rules_load("manifest", parts_arg, &rules) : 0;
    if (lr < 0)
        return -lr;
    /* The index is all that is needed: no manifest, the smallest pool. */
    o.verify = SLUICE_VERIFY_OFF;
    o.pool_bytes = 4096;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK) {
        sluice_part_rules_free(rules);
        return ig_open_failed("manifest", m, rc);
    }
    size_t n = sluice_count(m), nf = sluice_file_count(m);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        total += info.nbytes;
    }
    for (size_t i = 0; form != FORM_FLAT && i < nf; i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &fi);
        total += fi.file_size;
    }
    mo.version = form == FORM_V2 ? 2 : form == FORM_V1 ? 1 : 0;
    mo.chunk_bytes = chunk_bytes;
    mo.parts = rules;
    mo.threads = o.hash_threads;
    progress *bar = progress_start("manifest", total, quiet);
    mo.on_bytes = on_bytes;
    mo.on_failure = on_failure;
    mo.user = bar;
    fflush(stdout);
    rc = sluice_manifest_write(m, out_path, STDOUT_FILENO, &mo);
    progress_stop(bar);
    int status = CMD_EXIT_OK;
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
        status = cmd_exit_status(rc);
    }
    char why[1024];
    /* the library's one signer, as `sluice sign`; a key that cannot sign is
     * a key that cannot be used (3), as there */
    if (status == CMD_EXIT_OK && sign_key &&
        sluice_manifest_sign(out_path, sign_key, NULL, why, sizeof why) != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", why);
        status = CMD_EXIT_OPEN;
    }
    sluice_part_rules_free(rules);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
        status = CMD_EXIT_OPEN;
    }
    return status;
}
