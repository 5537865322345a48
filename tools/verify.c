/* verify.c: `sluice verify`: checks every tensor of a model against its
 * manifest (policy REQUIRE) with the library's verify-only path
 * (sluice_verify: no pool, no handle), and with --files
 * every whole file too, and reports each failure. */
#include "cmd.h"
#include "integrity.h"
#include "metrics_cli.h"
#include "msign.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vf_state {
    progress *bar;
    ig_failed *failed;      /* NULL: not collected */
    int oom;
    int status;             /* the exit status of the failures (cmd_exit_worse) */
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
    if (it->status == SLUICE_OK)
        return 0;
    s->status = cmd_exit_worse(s->status, cmd_exit_status(it->status));
    print_failure(s, it, it->message && *it->message ? it->message : sluice_strerror(it->status));
    ig_failed *f = s->failed;
    if (f && it->kind == SLUICE_VERIFY_ITEM_TENSOR) {
        if (f->n == f->cap) {
            size_t cap = f->cap ? 2 * f->cap : 16;
            size_t *grown = realloc(f->index, cap * sizeof *grown);
            if (!grown) {
                s->oom = 1;
                return 0;
            }
            f->index = grown;
            f->cap = cap;
        }
        f->index[f->n++] = it->index;
    }
    return 0;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice verify PATH [--manifest FILE] [trust options] [--files] [-q]\n"
            "                     [loader options]\n"
            "\n"
            "Reads every tensor of the model at PATH and checks it against the manifest\n"
            "(policy REQUIRE: every tensor must have a digest), with the library's\n"
            "verify-only path (sluice_verify): no buffer pool, each thread reading into\n"
            "one small reused buffer (for a remote PATH, range requests into two pieces\n"
            "of up to 16 MiB a thread); --direct reads with O_DIRECT. Prints the manifest\n"
            "used, each failure with its tensor, file, offset and digests, then a\n"
            "summary line.\n"
            "\n"
            "  --manifest FILE   the manifest (default: the sidecar: F.manifest.json\n"
            "                    beside a single file F; for a directory,\n"
            "                    sluice.manifest.json in it, then F.manifest.json when\n"
            "                    the model is one file F). Without one, a snapshot of\n"
            "                    the Hugging Face Hub's cache (models--ORG--NAME/\n"
            "                    snapshots/REV, its files links to blobs named by\n"
            "                    their SHA-256) is checked against those digests: the\n"
            "                    first time each file is read whole and must match,\n"
            "                    and a manifest derived from it is kept in the cache\n"
            "                    directory (docs/manifests.md); so is an hf:// PATH\n"
            "                    whose repository publishes none, against the LFS\n"
            "                    SHA-256 the Hub lists for its files\n"
            IG_TRUST_HELP
            "  --no-manifest-link  check the model-signing bundle and every file's digest\n"
            "                    alone, as the reference verifier does (no sluice manifest,\n"
            "                    no tensors); with --ignore PATH (repeatable) for files\n"
            "                    present but not signed\n"
            "  --files           also check every whole file against the manifest's\n"
            "                    \"files\" digests and sizes; for an hf:// PATH whose\n"
            "                    repository publishes no sluice.manifest.json, every\n"
            "                    file against the Hub's LFS SHA-256 (files only when a\n"
            "                    file is no Git LFS object); for\n"
            "                    a Hub cache snapshot, every file against its blob's\n"
            "                    name\n"
            "  -q, --quiet       no progress bar (shown only when stderr is a terminal)\n"
            "  --fallback LOC    a mirror (directory, file, http(s):// or s3://) of the\n"
            "                    model; repeatable, tried in order. PATH's own bytes\n"
            "                    are still what is judged (a tensor that fails at PATH\n"
            "                    fails the verify), but for each one that fails the\n"
            "                    mirrors are asked whether they hold it verified:\n"
            "                    \"recoverable from fallback K (LOC)\", or why not.\n"
            "                    'sluice repair' mends PATH from them. A PATH that\n"
            "                    cannot be opened is an open error (2), not judged\n"
            "                    by a mirror\n"
            IG_LOADER_HELP
            MC_PORT_HELP
            "\n"
            CMD_EXIT_HELP
            "verify: 1 a tensor or file that does not match (or a manifest that names\n"
            "tensors the model lacks, or a Hub snapshot's file that is not its blob's\n"
            "SHA-256); 2 PATH cannot be opened and a mirror would serve it (verify\n"
            "judges PATH's own bytes); 3 one that could not be read, none mismatched;\n"
            "4 with --key, --ca or --no-manifest-link, a signature refused.\n");
}

int ig_verify_print(const char *cmd, sluice_model *m, int files, int quiet, double t0, ig_failed *failed)
{
    uint64_t total = 0;
    for (size_t i = 0; files != IG_FILES_ONLY && i < sluice_count(m); i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        total += info.nbytes;
    }
    for (size_t i = 0; files && i < sluice_file_count(m); i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &fi);
        total += fi.file_size;
    }
    vf_state s = {.bar = progress_start("verify", total, quiet), .failed = failed};
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = files ? SLUICE_VF_FILES : 0;
    if (files == IG_FILES_ONLY)
        vo.flags |= SLUICE_VF_NO_TENSORS;
    vo.on_item = on_item;
    vo.user = &s;
    struct sluice_verify_report r = {.size = sizeof r};
    int rc = sluice_verify(m, NULL, 0, &vo, &r);
    progress_stop(s.bar);
    if (rc != SLUICE_OK && r.tensors_failed + r.files_failed == 0) {
        /* nothing was checked: the verify itself could not run */
        fprintf(stderr, "sluice %s: %s\n", cmd, sluice_errmsg(m));
        return cmd_exit_status(rc);
    }
    double dt = ig_now() - t0;
    char b[32];
    printf("%zu tensors verified, %zu failed", r.tensors_ok, r.tensors_failed);
    if (files)
        printf(", %zu files verified, %zu failed", r.files_ok, r.files_failed);
    printf(", %s (%llu bytes) in %.2f s\n", progress_bytes(r.bytes_hashed, b, sizeof b),
           (unsigned long long)r.bytes_hashed, dt);
    fflush(stdout);
    if (s.oom) {
        fprintf(stderr, "sluice %s: out of memory listing the failed tensors\n", cmd);
        return CMD_EXIT_OPEN;
    }
    if (failed && failed->n)
        qsort(failed->index, failed->n, sizeof *failed->index, cmp_size);
    if (rc == SLUICE_OK)
        return CMD_EXIT_OK;
    return s.status ? s.status : cmd_exit_worse(CMD_EXIT_OK, cmd_exit_status(rc));
}

/* Whether m's manifest lists no tensor (the Hub's whole-file digests). */
static int no_tensor_digest(const sluice_model *m)
{
    uint8_t d[32];
    for (size_t i = 0; i < sluice_count(m); i++)
        if (sluice_manifest_tensor(m, i, d) == SLUICE_OK)
            return 0;
    return 1;
}

int cmd_verify(int argc, char **argv)
{
    const char *path = NULL;
    int files = 0, quiet = 0, metrics_port = -1;
    ig_trust trust = {0};
    ig_keys ignore = {.n = 0};
    int no_link = 0;
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
        } else if ((r = ig_trust_option("verify", argc, argv, &i, &trust, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = mc_port_option("verify", argc, argv, &i, &metrics_port)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = ig_list_option("verify", argc, argv, &i, "--ignore", &ignore)) != 0) {
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--no-manifest-link")) {
            no_link = 1;
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
    if (no_link)
        return ms_verify_files(path, o.signature_path, trust.keys.path, trust.keys.n,
                               trust.cas.path, trust.cas.n, ignore.path, ignore.n);
    /* A Hub location without a manifest of its own is checked against
     * the manifest derived from the Hub's LFS SHA-256, or, when a file is
     * no Git LFS object, file by file against the others (--files):
     * DEFAULT is REQUIRE for a manifest of tensors, and takes those for
     * what they are. */
    int hub_files = files && !strncmp(path, "hf://", 5);
    o.verify = hub_files ? SLUICE_VERIFY_DEFAULT : SLUICE_VERIFY_REQUIRE;
    double t0 = ig_now();
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    /* a Hub snapshot's file that is not its published digest
     * (SLUICE_E_CHECKSUM): found damaged, 1, like any item that fails */
    if (rc != SLUICE_OK)
        return ig_open_failed("verify", m, rc);
    if (ig_own_location("verify", path, m) < 0) {
        sluice_close(m);
        return CMD_EXIT_USAGE;
    }
    /* which manifest judges: a directory of one file may have two sidecars */
    ig_print_checked_against(stdout, "", path, m, &o, &trust);
    if (hub_files && no_tensor_digest(m)) {
        printf("the Hub's LFS SHA-256: whole files only (the repository publishes no "
               "sluice.manifest.json)\n");
        files = IG_FILES_ONLY;
    }
    int serve_failed = 0;
    ig_failed failed = {0};
    sluice_metrics_server *ms = mc_serve("verify", metrics_port, m, &serve_failed);
    int status = serve_failed ? CMD_EXIT_OPEN : ig_verify_print("verify", m, files, quiet, t0, &failed);
    /* The mirrors never stand in for PATH's bytes here: they are asked
     * whether they could (what `sluice repair` would take). */
    if (status && failed.n && o.fallback_count) {
        size_t ok = ig_report_recoverable(m, &failed);
        printf("%zu of %zu failed tensor%s recoverable from the fallbacks%s\n", ok, failed.n,
               failed.n == 1 ? "" : "s", ok ? " ('sluice repair PATH --fallback ...' "
                                                "mends PATH)" : "");
    }
    free(failed.index);
    mc_stop(ms, m);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice verify: %s\n", sluice_errmsg(m));
        status = cmd_exit_worse(status, CMD_EXIT_OPEN);
    }
    return status;
}
