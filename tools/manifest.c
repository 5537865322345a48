/* manifest.c: `sluice manifest`: writes the SHA-256 manifest of a model.
 *
 * Tensor digests come from the library's own pipeline (open with
 * SLUICE_F_HASH_ALL and verification off, stream every tensor, read
 * sluice_tensor_digest in the callback), so the hashing runs on the
 * engine's worker threads while reads are in flight. Whole-file digests
 * (what the Hugging Face Hub lists for a Git LFS file) are computed here
 * at the same time, one thread per file. Nothing is written unless every
 * tensor and file was read.
 */
#include "cmd.h"
#include "integrity.h"
#include "jsonout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct mf_state {
    uint8_t (*digest)[32];
    unsigned char *got;
    size_t failed;
    progress *bar;
} mf_state;

static int on_tensor(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    mf_state *s = user;
    if (status != SLUICE_OK) {
        s->failed++;
        progress_printf(s->bar, stderr, "sluice manifest: %s\n", message ? message : sluice_strerror(status));
        return 0;
    }
    int rc = sluice_tensor_digest(t, s->digest[info->index]);
    if (rc == SLUICE_OK) {
        s->got[info->index] = 1;
    } else {
        s->failed++;
        progress_printf(s->bar, stderr, "sluice manifest: no digest for a tensor: %s\n", sluice_strerror(rc));
    }
    progress_add(s->bar, info->nbytes);
    sluice_release(t);
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice manifest PATH [-o FILE] [--flat] [-q] [loader options]\n"
            "\n"
            "Computes the SHA-256 of every tensor of the model at PATH (a .safetensors\n"
            "file, a directory, or a *.safetensors.index.json) through the library's\n"
            "read pipeline, and of every whole file, and writes the manifest as JSON:\n"
            "the structured form (format sluice-manifest, version 1, tensors in model\n"
            "order, files with their size), or with --flat {\"tensor\": \"digest\"} only.\n"
            "\n"
            "  -o FILE           write to FILE (replaced atomically) instead of stdout;\n"
            "                    sluice_open finds it by itself when FILE is the sidecar:\n"
            "                    F.manifest.json beside a single file F, else\n"
            "                    sluice.manifest.json in the model's directory\n"
            "  --flat            the flat form (no file digests)\n"
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            IG_LOADER_HELP
            "\n"
            "Exit status: 0 written, 1 a tensor or file could not be read, 2 usage or\n"
            "open error.\n");
}

/* Writes the manifest to out; returns 0 or -1 (errno set by stdio). */
static int write_json(FILE *out, const sluice_model *m, const mf_state *s,
                      const ig_file_result *files, int flat)
{
    size_t n = sluice_count(m);
    char hex[65];
    if (flat) {
        fputs("{", out);
        for (size_t i = 0; i < n; i++) {
            struct sluice_tensor_info info;
            sluice_info(m, i, &info);
            fputs(i ? ",\n  " : "\n  ", out);
            json_string(out, info.name, info.name_len);
            fprintf(out, ": \"%s\"", sluice_digest_hex(s->digest[i], hex));
        }
        fputs(n ? "\n}\n" : "}\n", out);
    } else {
        fputs("{\n  \"format\": \"sluice-manifest\",\n  \"version\": 1,\n"
              "  \"algorithm\": \"sha256\",\n  \"tensors\": {", out);
        for (size_t i = 0; i < n; i++) {
            struct sluice_tensor_info info;
            sluice_info(m, i, &info);
            fputs(i ? ",\n    " : "\n    ", out);
            json_string(out, info.name, info.name_len);
            fprintf(out, ": {\"sha256\": \"%s\"}", sluice_digest_hex(s->digest[i], hex));
        }
        fputs(n ? "\n  },\n  \"files\": {" : "},\n  \"files\": {", out);
        size_t nf = sluice_file_count(m);
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi;
            sluice_file_info(m, i, &fi);
            const char *base = strrchr(fi.path, '/');
            base = base ? base + 1 : fi.path;
            fputs(i ? ",\n    " : "\n    ", out);
            json_string(out, base, strlen(base));
            fprintf(out, ": {\"sha256\": \"%s\", \"size\": %llu}",
                    sluice_digest_hex(files[i].digest, hex), (unsigned long long)files[i].bytes);
        }
        fputs(nf ? "\n  }\n}\n" : "}\n}\n", out);
    }
    return ferror(out) ? -1 : 0;
}

/* Writes to path through a temporary file in the same directory, renamed
 * over path once complete. */
static int write_file(const char *path, const sluice_model *m, const mf_state *s,
                      const ig_file_result *files, int flat)
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
    int bad = write_json(out, m, s, files, flat) < 0 || fflush(out) != 0 || fsync(fd) != 0;
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
    const char *path = NULL, *out_path = NULL;
    int flat = 0, quiet = 0;
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
        } else if (!strcmp(a, "--flat")) {
            flat = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if ((r = ig_loader_option("manifest", argc, argv, &i, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sluice manifest: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "sluice manifest: one PATH only ('%s')\n", a);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (out_path && !strcmp(out_path, "-"))
        out_path = NULL;

    o.flags |= SLUICE_F_HASH_ALL;
    o.verify = SLUICE_VERIFY_OFF;
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
        struct sluice_tensor_info info;
        sluice_info(m, i, &info);
        total += info.nbytes;
    }
    if (!flat)
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi;
            sluice_file_info(m, i, &fi);
            total += fi.size;
        }
    int status = 1;
    mf_state s = {0};
    ig_filehash *fh = NULL;
    s.digest = calloc(n ? n : 1, sizeof *s.digest);
    s.got = calloc(n ? n : 1, 1);
    if (!s.digest || !s.got) {
        fprintf(stderr, "sluice manifest: out of memory\n");
        goto done;
    }
    s.bar = progress_start("manifest", total, quiet);
    if (!flat && !(fh = ig_filehash_start(m, s.bar)))
        goto done;
    rc = sluice_stream(m, NULL, 0, on_tensor, &s);
    const ig_file_result *files = fh ? ig_filehash_wait(fh) : NULL;
    progress_stop(s.bar);
    s.bar = NULL;
    for (size_t i = 0; i < n; i++)
        if (!s.got[i] && rc == SLUICE_OK) {
            /* every tensor is delivered or reported; a hole is a bug */
            fprintf(stderr, "sluice manifest: tensor %zu was never delivered\n", i);
            s.failed++;
            break;
        }
    if (rc != SLUICE_OK && !s.failed) {
        fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
        s.failed++;
    }
    for (size_t i = 0; files && i < nf; i++) {
        struct sluice_file_info fi;
        sluice_file_info(m, i, &fi);
        if (files[i].error) {
            fprintf(stderr, "sluice manifest: %s: %s\n", fi.path, strerror(files[i].error));
            s.failed++;
        } else if (files[i].bytes != fi.size) {
            fprintf(stderr, "sluice manifest: %s: %llu bytes now, %llu at open: the file changed\n",
                    fi.path, (unsigned long long)files[i].bytes, (unsigned long long)fi.size);
            s.failed++;
        }
    }
    if (s.failed) {
        fprintf(stderr, "sluice manifest: %zu failure%s, nothing written\n", s.failed,
                s.failed == 1 ? "" : "s");
        goto done;
    }
    if (out_path) {
        if (write_file(out_path, m, &s, files, flat) < 0)
            goto done;
    } else if (write_json(stdout, m, &s, files, flat) < 0 || fflush(stdout) != 0) {
        fprintf(stderr, "sluice manifest: cannot write to stdout: %s\n", strerror(errno));
        goto done;
    }
    status = 0;
done:
    progress_stop(s.bar);
    ig_filehash_free(fh);
    free(s.digest);
    free(s.got);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice manifest: %s\n", sluice_errmsg(m));
        status = 1;
    }
    return status;
}
