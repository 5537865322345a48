/* cat.c: `sluice cat`: writes one tensor's bytes to stdout, verified
 * whenever a manifest is in play; nothing at all when they do not match. */
#include "cmd.h"
#include "integrity.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice cat PATH NAME [--manifest FILE] [trust options] [loader options]\n"
            "\n"
            "Writes the raw bytes of tensor NAME of the model at PATH to stdout.\n"
            "When a manifest is in play (--manifest, or the sidecar: F.manifest.json\n"
            "beside a single file F; for a directory, sluice.manifest.json in it,\n"
            "then F.manifest.json when the model is one file F) the bytes are\n"
            "checked first and nothing is written unless they match; a manifest\n"
            "without a digest for NAME is an error. Without one (a remote sidecar\n"
            "that answers 404 included) the bytes are written unchecked, and a\n"
            "warning on stderr says so.\n"
            "\n"
            "  --manifest FILE   the manifest to check against\n"
            IG_TRUST_HELP
            IG_FALLBACK_HELP
            IG_LOADER_HELP
            "\n"
            CMD_EXIT_HELP
            "cat: nothing is written unless it exits 0; 1 also when the manifest has\n"
            "no digest for NAME; 2 when the model has no tensor NAME.\n");
}

static int write_all(const void *data, uint64_t len)
{
    const char *p = data;
    while (len) {
        size_t chunk = len > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)len;
        ssize_t w = write(STDOUT_FILENO, p, chunk);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        p += w;
        len -= (uint64_t)w;
    }
    return 0;
}

int cmd_cat(int argc, char **argv)
{
    const char *path = NULL, *name = NULL;
    ig_trust trust = {0};
    sluice_options o;
    sluice_options_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = ig_file_option("cat", argc, argv, &i, "--manifest", "-m", &o.manifest_path)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = ig_trust_option("cat", argc, argv, &i, &trust, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = ig_loader_option("cat", argc, argv, &i, &o)) != 0) {
            if (r < 0)
                return 2;
        } else if (!strcmp(a, "--")) {
            /* everything after is positional: names may start with '-' */
            for (i++; i < argc; i++) {
                if (!path)
                    path = argv[i];
                else if (!name)
                    name = argv[i];
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sluice cat: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!path) {
            path = a;
        } else if (!name) {
            name = a;
        } else {
            fprintf(stderr, "sluice cat: one PATH and one NAME ('%s')\n", a);
            return 2;
        }
    }
    if (!path || !name) {
        usage(stderr);
        return 2;
    }
    /* IF_PRESENT: a manifest missing other tensors' digests is no reason
     * to refuse this one; this one's digest is required below. */
    o.verify = SLUICE_VERIFY_IF_PRESENT;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        return ig_open_failed("cat", m, rc);
    ig_warn_unverified("cat", m);
    int status = CMD_EXIT_USAGE;
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    uint8_t want[32];
    sluice_tensor *t = NULL;
    if (sluice_find(m, name, &info) != SLUICE_OK) {
        fprintf(stderr, "sluice cat: ");
        ig_quote(stderr, name, strlen(name));
        fprintf(stderr, ": no such tensor in %s\n", path);
        goto done;
    }
    /* an unverified model (warned above) has nothing to require; an
     * hf:// one may still name the Hub's whole-file digests */
    int state = sluice_verify_state(m, NULL);
    int verified = (state == SLUICE_VERIFIED || state == SLUICE_VERIFIED_PUBLISHER_DIGEST) &&
                   sluice_manifest_path(m);
    if (verified && sluice_manifest_tensor(m, info.index, want) != SLUICE_OK) {
        fprintf(stderr, "sluice cat: manifest %s has no digest for ", sluice_manifest_path(m));
        ig_quote(stderr, name, strlen(name));
        fprintf(stderr, "\n");
        status = CMD_EXIT_INTEGRITY;
        goto done;
    }
    rc = sluice_acquire(m, name, &t);
    /* the cache turned off, or the memo refused the file: asked for, not had */
    if (sluice_cache_warning(m))
        fprintf(stderr, "sluice cat: warning: %s\n", sluice_cache_warning(m));
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice cat: %s\n", sluice_errmsg(m));
        status = cmd_exit_status(rc);
        goto done;
    }
    status = CMD_EXIT_INTEGRITY;
    if (verified) {
        uint8_t got[32];
        if (sluice_tensor_digest(t, got) != SLUICE_OK || memcmp(got, want, 32) != 0) {
            fprintf(stderr, "sluice cat: delivered without a matching digest (library fault)\n");
            goto done;
        }
    }
    if (write_all(sluice_tensor_data(t), sluice_tensor_size(t)) != 0) {
        fprintf(stderr, "sluice cat: writing to stdout: %s\n", strerror(errno));
        status = CMD_EXIT_OPEN;
        goto done;
    }
    status = 0;
done:
    sluice_release(t);
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice cat: %s\n", sluice_errmsg(m));
        status = status ? status : CMD_EXIT_OPEN;
    }
    return status;
}
