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
#include "shard.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice manifest PATH [-o FILE] [--algorithm sha256|blake3] [--v1 | --flat]\n"
            "                       [--parts RULES [--worlds 2,4,8]] [-q] [--threads N]\n"
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
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            "  --threads N       hashing threads (default: online CPUs)\n"
            "\n"
            CMD_EXIT_HELP
            "manifest: 3 also when a tensor or file could not be read (nothing written).\n");
}

/* Writes the manifest to out; returns 0 or -1 (errno set by stdio). */
enum { FORM_V2, FORM_V1, FORM_FLAT };

/* Chunk digests: per tensor, its first digest in all[] (count 0: none). */
typedef struct chunk_set {
    uint64_t bytes;
    uint32_t *count;
    size_t *first;
    uint8_t (*all)[32];
    size_t total;
    /* the work, shared by the threads */
    sluice_model *m;
    size_t *tensor_of;          /* per digest: its tensor */
    atomic_size_t next;
    atomic_int failed;
    const struct part_set *parts; /* --parts: written after the chunks */
} chunk_set;

/* Part digests (--parts): per tensor its dim (SLUICE_PART_REPLICATED:
 * none) and, for each world size that divides it, that many digests. */
typedef struct part_set {
    uint64_t worlds[8];
    size_t nworlds;
    int *dim;
    uint8_t (**digest)[32];   /* per tensor: the worlds' digests, one after the other */
} part_set;

static void part_set_free(part_set *ps, size_t n)
{
    for (size_t i = 0; ps->digest && i < n; i++)
        free(ps->digest[i]);
    free(ps->digest);
    free(ps->dim);
}

/* The part digests of every tensor the rules split, for each world size
 * that divides its dim. Returns 0, or -1 after a message. */
static int compute_parts(sluice_model *m, const sluice_part_rules *rules, part_set *ps)
{
    size_t n = sluice_count(m);
    ps->dim = calloc(n ? n : 1, sizeof *ps->dim);
    ps->digest = calloc(n ? n : 1, sizeof *ps->digest);
    if (!ps->dim || !ps->digest) {
        fprintf(stderr, "sluice manifest: out of memory\n");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &ti);
        int dim;
        if (sluice_part_rules_dim(rules, ti.name, ti.ndim, &dim) != SLUICE_OK) {
            fprintf(stderr, "sluice manifest: --parts: tensor %s: the rules split it along dim "
                    "%d; it has %u\n", ti.name, dim, ti.ndim);
            return -1;
        }
        ps->dim[i] = dim;
        if (dim == SLUICE_PART_REPLICATED)
            continue;
        size_t total = 0;
        for (size_t w = 0; w < ps->nworlds; w++)
            total += ti.shape[dim] % ps->worlds[w] ? 0 : ps->worlds[w];
        if (!total) {
            ps->dim[i] = SLUICE_PART_REPLICATED;
            continue;
        }
        if (!(ps->digest[i] = malloc(total * sizeof *ps->digest[i]))) {
            fprintf(stderr, "sluice manifest: out of memory\n");
            return -1;
        }
        size_t at = 0;
        for (size_t w = 0; w < ps->nworlds; w++)
            for (uint64_t r = 0; !(ti.shape[dim] % ps->worlds[w]) && r < ps->worlds[w]; r++)
                if (sluice_digest_part(m, i, (uint32_t)dim, r, ps->worlds[w],
                                       ps->digest[i][at++]) != SLUICE_OK) {
                    fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
                    return -1;
                }
    }
    return 0;
}

/* --worlds "2,4,8" into ps. Returns 0 or -1. */
static int parse_worlds(const char *s, part_set *ps)
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

static void *chunk_worker(void *arg)
{
    chunk_set *cs = arg;
    for (size_t k; (k = atomic_fetch_add(&cs->next, 1)) < cs->total && !atomic_load(&cs->failed);) {
        size_t i = cs->tensor_of[k];
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(cs->m, i, &info);
        uint64_t lo = (uint64_t)(k - cs->first[i]) * cs->bytes;
        uint64_t hi = lo + cs->bytes < info.nbytes ? lo + cs->bytes : info.nbytes;
        if (sluice_digest_range(cs->m, i, lo, hi, cs->all[k]) != SLUICE_OK) {
            if (!atomic_exchange(&cs->failed, 1))
                fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(cs->m));
        }
    }
    return NULL;
}

/* The chunk digests of every tensor larger than bytes, on threads
 * threads. Returns 0, or -1 after a message. */
static int compute_chunks(sluice_model *m, uint64_t bytes, unsigned threads, chunk_set *cs)
{
    size_t n = sluice_count(m);
    memset(cs, 0, sizeof *cs);
    cs->bytes = bytes;
    cs->m = m;
    cs->count = calloc(n ? n : 1, sizeof *cs->count);
    cs->first = calloc(n ? n : 1, sizeof *cs->first);
    if (!cs->count || !cs->first)
        goto nomem;
    for (size_t i = 0; bytes && i < n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        cs->first[i] = cs->total;
        if (info.nbytes > bytes) {
            cs->count[i] = (uint32_t)((info.nbytes + bytes - 1) / bytes);
            cs->total += cs->count[i];
        }
    }
    if (!cs->total)
        return 0;
    cs->all = malloc(cs->total * sizeof *cs->all);
    cs->tensor_of = malloc(cs->total * sizeof *cs->tensor_of);
    if (!cs->all || !cs->tensor_of)
        goto nomem;
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < cs->count[i]; k++)
            cs->tensor_of[cs->first[i] + k] = i;
    if (!threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (unsigned)cpus;
    }
    pthread_t tid[64];
    unsigned started = 0;
    for (; started < threads && started < 64; started++)
        if (pthread_create(&tid[started], NULL, chunk_worker, cs) != 0)
            break;
    if (!started)
        chunk_worker(cs);
    for (unsigned t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    return atomic_load(&cs->failed) ? -1 : 0;
nomem:
    fprintf(stderr, "sluice manifest: out of memory\n");
    return -1;
}

/* What says a file is the same file with the same bytes: the manifest is
 * written from two passes (whole digests, then chunk digests), and a file
 * changed in between would pair old whole digests with new chunks. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} file_id;

static int take_ids(const sluice_model *m, file_id *ids)
{
    for (size_t i = 0; i < sluice_file_count(m); i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        struct stat st;
        if (sluice_file_info(m, i, &fi) != SLUICE_OK || stat(fi.path, &st) != 0)
            return -1;
        ids[i] = (file_id){st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
    }
    return 0;
}

static int same_ids(const file_id *a, const file_id *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i].dev != b[i].dev || a[i].ino != b[i].ino || a[i].size != b[i].size ||
            a[i].mtime.tv_sec != b[i].mtime.tv_sec || a[i].mtime.tv_nsec != b[i].mtime.tv_nsec ||
            a[i].ctime.tv_sec != b[i].ctime.tv_sec || a[i].ctime.tv_nsec != b[i].ctime.tv_nsec)
            return 0;
    return 1;
}

static void chunk_set_free(chunk_set *cs)
{
    free(cs->count);
    free(cs->first);
    free(cs->all);
    free(cs->tensor_of);
}

/* The version 2 entry of one tensor: digest, dtype, shape, nbytes, and
 * its chunk digests when it has some. */
static void v2_tensor(FILE *out, const struct sluice_tensor_info *info, const uint8_t digest[32],
                      const chunk_set *cs)
{
    char hex[65];
    fprintf(out, ": {\"digest\": \"%s\", \"dtype\": \"%s\", \"shape\": [",
            sluice_digest_hex(digest, hex), sluice_dtype_name(info->dtype));
    for (uint32_t d = 0; d < info->ndim; d++)
        fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)info->shape[d]);
    fprintf(out, "], \"nbytes\": %llu", (unsigned long long)info->nbytes);
    uint32_t n = cs ? cs->count[info->index] : 0;
    if (n) {
        fprintf(out, ", \"chunk_bytes\": %llu, \"chunks\": [", (unsigned long long)cs->bytes);
        for (uint32_t k = 0; k < n; k++)
            fprintf(out, "%s\"%s\"", k ? ", " : "",
                    sluice_digest_hex(cs->all[cs->first[info->index] + k], hex));
        fputs("]", out);
    }
    const part_set *ps = cs ? cs->parts : NULL;
    if (ps && ps->dim[info->index] != SLUICE_PART_REPLICATED) {
        int dim = ps->dim[info->index];
        fprintf(out, ", \"parts\": {\"dim\": %d, \"digests\": {", dim);
        size_t at = 0, first = 1;
        for (size_t w = 0; w < ps->nworlds; w++) {
            if (info->shape[dim] % ps->worlds[w])
                continue;
            fprintf(out, "%s\"%llu\": [", first ? "" : ", ", (unsigned long long)ps->worlds[w]);
            first = 0;
            for (uint64_t r = 0; r < ps->worlds[w]; r++)
                fprintf(out, "%s\"%s\"", r ? ", " : "",
                        sluice_digest_hex(ps->digest[info->index][at++], hex));
            fputs("]", out);
        }
        fputs("}}", out);
    }
    fputs("}", out);
}

static int write_json(FILE *out, const sluice_model *m, const dg_result *tensors,
                      const dg_result *files, int form, const chunk_set *cs)
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
                v2_tensor(out, &info, tensors[i].digest, cs);
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
                      const dg_result *files, int form, const chunk_set *cs)
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
    int bad = write_json(out, m, tensors, files, form, cs) < 0 || fflush(out) != 0 || fsync(fd) != 0;
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
    const char *path = NULL, *out_path = NULL, *alg_name = NULL, *chunk_arg = NULL;
    const char *parts_arg = NULL, *worlds_arg = NULL;
    part_set ps = {.worlds = {2, 4, 8}, .nworlds = 3};
    sluice_part_rules *rules = NULL;
    int form = FORM_V2, quiet = 0;
    uint64_t chunk_bytes = (uint64_t)16 << 20;
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
    int flat = form == FORM_FLAT;
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
    if (worlds_arg && (!parts_arg || parse_worlds(worlds_arg, &ps) < 0)) {
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
    if (!flat)
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            sluice_file_info(m, i, &fi);
            total += fi.file_size;
        }
    int status = CMD_EXIT_OPEN;   /* what fails below: a read, a write, memory */
    dg_result *tensors = NULL, *files = NULL;
    chunk_set cs = {0};
    progress *bar = NULL;
    long failed = 0;
    file_id *before = calloc(nf ? nf : 1, sizeof *before), *after = calloc(nf ? nf : 1, sizeof *after);
    if (!before || !after || take_ids(m, before) < 0) {
        fprintf(stderr, "sluice manifest: cannot stat the model's files: %s\n", strerror(errno));
        goto done;
    }
    bar = progress_start("manifest", total, quiet);
    failed = dg_compute(m, "manifest", !flat, o.hash_threads, bar, &tensors, &files);
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
    if (!failed && compute_chunks(m, chunk_bytes, o.hash_threads, &cs) < 0)
        failed++;
    if (!failed && rules && compute_parts(m, rules, &ps) < 0)
        failed++;
    if (rules)
        cs.parts = &ps;
    if (!failed && (take_ids(m, after) < 0 || !same_ids(before, after, nf))) {
        fprintf(stderr, "sluice manifest: a file of the model changed (or was replaced) while its "
                        "digests were computed\n");
        failed++;
    }
    if (failed) {
        fprintf(stderr, "sluice manifest: %ld failure%s, nothing written\n", failed,
                failed == 1 ? "" : "s");
        goto done;
    }
    if (out_path) {
        if (write_file(out_path, m, tensors, files, form, &cs) < 0)
            goto done;
    } else if (write_json(stdout, m, tensors, files, form, &cs) < 0 || fflush(stdout) != 0) {
        fprintf(stderr, "sluice manifest: cannot write to stdout: %s\n", strerror(errno));
        goto done;
    }
    status = 0;
done:
    progress_stop(bar);
    chunk_set_free(&cs);
    part_set_free(&ps, n);
    sluice_part_rules_free(rules);
    free(before);
    free(after);
    free(tensors);
    free(files);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
        status = CMD_EXIT_OPEN;
    }
    return status;
}
