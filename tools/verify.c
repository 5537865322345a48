/* verify.c: `sluice verify`: checks every tensor of a model against its
 * manifest through the library's pipeline (policy REQUIRE), and with
 * --files every whole file too, and reports each failure. */
#include "cmd.h"
#include "digest.h"
#include "integrity.h"
#include "metrics_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vf_state {
    const sluice_model *model;
    size_t verified, failed;
    uint64_t bytes;
    progress *bar;
} vf_state;

/* "FAILED tensor NAME: why", NAME JSON-escaped. The library's message
 * already begins with the tensor's name: it is then printed as it is. */
static void print_failure(vf_state *s, const struct sluice_tensor_info *info, const char *why)
{
    char *q = NULL;
    size_t qlen = 0;
    FILE *mem = open_memstream(&q, &qlen);
    if (!mem) {
        progress_printf(s->bar, stdout, "FAILED %s\n", why);
        return;
    }
    fputs("tensor ", mem);
    ig_quote(mem, info->name, info->name_len);
    if (fclose(mem) != 0 || !q) {
        free(q);
        progress_printf(s->bar, stdout, "FAILED %s\n", why);
        return;
    }
    if (!strncmp(why, q, qlen) && (why[qlen] == ' ' || why[qlen] == ':'))
        progress_printf(s->bar, stdout, "FAILED %s\n", why);
    else
        progress_printf(s->bar, stdout, "FAILED %s: %s\n", q, why);
    free(q);
}

static int on_tensor(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    vf_state *s = user;
    progress_add(s->bar, info->nbytes);
    s->bytes += info->nbytes;
    if (status != SLUICE_OK) {
        s->failed++;
        print_failure(s, info, message && *message ? message : sluice_strerror(status));
        return 0;
    }
    /* Belt and braces: the digest the pipeline computed is the one listed. */
    uint8_t got[32], want[32];
    if (sluice_manifest_tensor(s->model, info->index, want) != SLUICE_OK ||
        sluice_tensor_digest(t, got) != SLUICE_OK || memcmp(got, want, 32) != 0) {
        s->failed++;
        print_failure(s, info, "delivered without a matching digest (library fault)");
    } else {
        s->verified++;
    }
    sluice_release(t);
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice verify PATH [--manifest FILE] [--files] [-q] [loader options]\n"
            "\n"
            "Reads every tensor of the model at PATH through the library's pipeline\n"
            "and checks it against the manifest (policy REQUIRE: every tensor must\n"
            "have a digest). Prints each failure with its tensor, file, offset and\n"
            "digests, then a summary line.\n"
            "\n"
            "  --manifest FILE   the manifest (default: the sidecar, F.manifest.json\n"
            "                    beside a single file F, else sluice.manifest.json in\n"
            "                    the model's directory)\n"
            "  --files           also check every whole file against the manifest's\n"
            "                    \"files\" digests and sizes\n"
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            IG_LOADER_HELP
            MC_PORT_HELP
            "\n"
            "Exit status: 0 everything matched, 1 a mismatch or read failure, 2 usage\n"
            "or open error (including a manifest that cannot be used).\n");
}

int cmd_verify(int argc, char **argv)
{
    const char *path = NULL;
    int files = 0, quiet = 0, metrics_port = -1;
    sluice_options o;
    sluice_options_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = ig_file_option("verify", argc, argv, &i, "--manifest", "-m", &o.manifest_path)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = mc_port_option("verify", argc, argv, &i, &metrics_port)) != 0) {
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--files")) {
            files = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if ((r = ig_loader_option("verify", argc, argv, &i, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sluice verify: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "sluice verify: one PATH only ('%s')\n", a);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    o.verify = SLUICE_VERIFY_REQUIRE;
    double t0 = ig_now();
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice verify: %s\n", m ? sluice_errmsg(m) : sluice_strerror(rc));
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
    if (files)
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            sluice_file_info(m, i, &fi);
            total += fi.file_size;
        }

    int serve_failed = 0;
    sluice_metrics_server *ms = mc_serve("verify", metrics_port, m, &serve_failed);
    vf_state s = {.model = m};
    size_t files_ok = 0, files_failed = 0;
    int status = 2;
    dg_job *fh = NULL;
    s.bar = progress_start("verify", total, quiet);
    if (serve_failed)
        goto done;
    if (files && !(fh = dg_start(m, 1, 0, 0, s.bar)))
        goto done;
    rc = sluice_stream(m, NULL, 0, on_tensor, &s);
    if (rc != SLUICE_OK && s.verified + s.failed < n) {
        /* the stream stopped before delivering everything */
        progress_printf(s.bar, stdout, "FAILED %s\n", sluice_errmsg(m));
        s.failed += n - s.verified - s.failed;
    }
    if (fh) {
        const dg_result *r = NULL;
        dg_wait(fh, &r, NULL);
        for (size_t i = 0; i < nf; i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            uint8_t want[32];
            uint64_t want_size = SLUICE_SIZE_UNKNOWN;
            char wh[65], gh[65];
            sluice_file_info(m, i, &fi);
            s.bytes += r[i].bytes;
            int listed = sluice_manifest_file(m, i, want, &want_size) == SLUICE_OK;
            if (!listed)
                progress_printf(s.bar, stdout, "FAILED file %s: the manifest has no digest for it\n", fi.path);
            else if (r[i].error)
                progress_printf(s.bar, stdout, "FAILED file %s: %s\n", fi.path, strerror(r[i].error));
            else if (want_size != SLUICE_SIZE_UNKNOWN && want_size != r[i].bytes)
                progress_printf(s.bar, stdout, "FAILED file %s: %llu bytes, the manifest says %llu\n", fi.path,
                                (unsigned long long)r[i].bytes, (unsigned long long)want_size);
            else if (memcmp(want, r[i].digest, 32) != 0)
                progress_printf(s.bar, stdout, "FAILED file %s: sha256 %s, expected %s\n", fi.path,
                                sluice_digest_hex(r[i].digest, gh), sluice_digest_hex(want, wh));
            else {
                files_ok++;
                continue;
            }
            files_failed++;
        }
    }
    progress_stop(s.bar);
    s.bar = NULL;
    double dt = ig_now() - t0;
    char b[32];
    printf("%zu tensors verified, %zu failed", s.verified, s.failed);
    if (files)
        printf(", %zu files verified, %zu failed", files_ok, files_failed);
    printf(", %s (%llu bytes) in %.2f s\n", progress_bytes(s.bytes, b, sizeof b),
           (unsigned long long)s.bytes, dt);
    fflush(stdout);
    status = s.failed || files_failed ? 1 : 0;
done:
    progress_stop(s.bar);
    dg_free(fh);
    mc_stop(ms, m);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice verify: %s\n", sluice_errmsg(m));
        status = 2;
    }
    return status;
}
