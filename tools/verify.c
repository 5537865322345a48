/* verify.c: `sluice verify`: checks every tensor of a model against its
 * manifest (policy REQUIRE) with the library's verify-only path
 * (sluice_verify: no pool, no handle), and with --files
 * every whole file too, and reports each failure. */
#include "cmd.h"
#include "digest.h"
#include "integrity.h"
#include "metrics_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vf_state {
    progress *bar;
} vf_state;

/* "FAILED tensor NAME: why" with NAME JSON-quoted, or "FAILED file PATH:
 * why". The library's message begins with the tensor's name quoted its
 * own way, or with "file PATH": a file's is printed as it is, a tensor's
 * after the JSON-quoted name, so that any name reads back unambiguously. */
static void print_failure(vf_state *s, const struct sluice_verify_item *it, const char *why)
{
    if (it->kind == SLUICE_VERIFY_ITEM_FILE) {
        progress_printf(s->bar, stdout, "FAILED %s\n", why);
        return;
    }
    char *q = NULL;
    size_t qlen = 0;
    FILE *mem = open_memstream(&q, &qlen);
    if (!mem) {
        progress_printf(s->bar, stdout, "FAILED %s\n", why);
        return;
    }
    fputs("tensor ", mem);
    ig_quote(mem, it->name, it->name_len);
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

static int on_item(void *user, const struct sluice_verify_item *it)
{
    vf_state *s = user;
    progress_add(s->bar, it->bytes);
    if (it->status != SLUICE_OK)
        print_failure(s, it, it->message && *it->message ? it->message
                                                         : sluice_strerror(it->status));
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice verify PATH [--manifest FILE] [--key PUB]... [--files] [-q]\n"
            "                     [loader options]\n"
            "\n"
            "Reads every tensor of the model at PATH and checks it against the manifest\n"
            "(policy REQUIRE: every tensor must have a digest), with the library's\n"
            "verify-only path (sluice_verify): no buffer pool, each thread reading into\n"
            "one small reused buffer; --direct reads with O_DIRECT. Prints the manifest\n"
            "used, each failure with its tensor, file, offset and digests, then a\n"
            "summary line.\n"
            "\n"
            "  --manifest FILE   the manifest (default: the sidecar: F.manifest.json\n"
            "                    beside a single file F; for a directory,\n"
            "                    sluice.manifest.json in it, then F.manifest.json when\n"
            "                    the model is one file F)\n"
            IG_KEY_HELP
            "  --files           also check every whole file against the manifest's\n"
            "                    \"files\" digests and sizes\n"
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            IG_LOADER_HELP
            MC_PORT_HELP
            "\n"
            "Exit status: 0 everything matched, 1 a mismatch or read failure, 2 usage\n"
            "or open error (including a manifest that cannot be used, and with --key a\n"
            "signature that is missing or invalid).\n");
}

/* Verifies m with sluice_verify, printing each failure and a summary;
 * returns the exit status. */
static int verify_model(sluice_model *m, int files, int quiet, uint64_t total, double t0)
{
    vf_state s = {.bar = progress_start("verify", total, quiet)};
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = files ? SLUICE_VF_FILES : 0;
    vo.on_item = on_item;
    vo.user = &s;
    struct sluice_verify_report r = {.size = sizeof r};
    int rc = sluice_verify(m, NULL, 0, &vo, &r);
    progress_stop(s.bar);
    if (rc != SLUICE_OK && r.tensors_failed + r.files_failed == 0) {
        /* nothing was checked: the verify itself could not run */
        fprintf(stderr, "sluice verify: %s\n", sluice_errmsg(m));
        return 2;
    }
    double dt = ig_now() - t0;
    char b[32];
    printf("%zu tensors verified, %zu failed", r.tensors_ok, r.tensors_failed);
    if (files)
        printf(", %zu files verified, %zu failed", r.files_ok, r.files_failed);
    printf(", %s (%llu bytes) in %.2f s\n", progress_bytes(r.bytes_hashed, b, sizeof b),
           (unsigned long long)r.bytes_hashed, dt);
    fflush(stdout);
    return rc == SLUICE_OK ? 0 : 1;
}

int cmd_verify(int argc, char **argv)
{
    const char *path = NULL;
    int files = 0, quiet = 0, metrics_port = -1;
    ig_keys keys = {.n = 0};
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
        } else if ((r = ig_key_option("verify", argc, argv, &i, &keys, &o)) != 0) {
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
        } else if (ig_path_operand("verify", a, &path, usage) < 0) {
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
    /* which manifest judges: a directory of one file may have two sidecars */
    if (keys.n)
        printf("manifest %s: signature verified (%s.sig, by one of %zu trusted key%s)\n",
               sluice_manifest_path(m), sluice_manifest_path(m), keys.n, keys.n == 1 ? "" : "s");
    else
        printf("manifest %s\n", sluice_manifest_path(m));
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
    int status = serve_failed ? 2 : verify_model(m, files, quiet, total, t0);
    mc_stop(ms, m);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice verify: %s\n", sluice_errmsg(m));
        status = 2;
    }
    return status;
}
