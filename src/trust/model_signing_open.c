/* model_signing_open.c: the OpenSSF model-signing check sluice_open
 * makes (see "OpenSSF model signing" in sluice.h) when its trust plan
 * names it (trust_plan.c decides): the bundle verified and linked to
 * the manifest and the files the index opened. The format itself is model_signing.c's, which the sluice
 * command shares; this file is the library's glue to the index. */
#include "trust/model_signing.h"
#include "trust/manifest.h"
#include "base/location.h"
#include "index/source.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* path's name relative to the real directory root, or NULL when it lies
 * outside (or cannot be resolved). */
static const char *relative_to(const char *root_real, const char *path, char *buf, size_t size)
{
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash && slash == path)
        snprintf(dir, sizeof dir, "/");
    if (!realpath(dir, real))
        return NULL;
    size_t n = strlen(root_real);
    const char *base = slash ? slash + 1 : path;
    if (!strcmp(real, root_real))
        return snprintf(buf, size, "%s", base) < (int)size ? buf : NULL;
    if (strncmp(real, root_real, n) || real[n] != '/')
        return NULL;
    return snprintf(buf, size, "%s/%s", real + n + 1, base) < (int)size ? buf : NULL;
}

/* A remote model's bundle: signature_path (a path or a URL), else
 * model.sig beside its files, fetched (trust_plan.c); verified into *s.
 * *sig gets its location as messages show it. */
static int remote_bundle(const sl_index *ix, const sl_trust_plan *p, char **sig,
                         sl_ms_statement **s, sl_err *err)
{
    sl_ms_trust t = {p->keys, p->nkeys, p->cas, p->ncas};
    if (p->bundle_path && !p->bundle_remote) {
        *sig = strdup(p->bundle_path);
        return *sig ? sl_ms_verify_file(p->bundle_path, &t, s, err)
                    : sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    }
    char *loc = p->bundle_path ? strdup(p->bundle_path)
                               : sl_trust_sig_beside(ix->files[0].loc->given, 1, SL_MS_DEFAULT_NAME);
    char shown[1100], *text = NULL;
    size_t len = 0;
    if (!loc || !(*sig = strdup(sl_location_shown_of(loc, shown, sizeof shown)))) {
        free(loc);
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    }
    int rc = sl_trust_sig_fetch(ix->remote, loc, SL_MS_MAX_BYTES, &text, &len, err);
    free(loc);
    if (rc == SLUICE_OK && !text)
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: missing: trusted keys or CAs ask for "
                     "the OpenSSF model signature, and the remote model has none beside it",
                     *sig);
    if (rc == SLUICE_OK)
        rc = sl_ms_verify_text(*sig, text, len, &t, s, err);
    free(text);
    return rc;
}

/* The manifest's name relative to the remote model's directory root (as
 * messages show both), or NULL when it lies elsewhere. */
static const char *remote_relative(const char *root, const char *manifest_path)
{
    size_t n = strlen(root);
    return !strncmp(manifest_path, root, n) && manifest_path[n] == '/' ? manifest_path + n + 1
                                                                       : NULL;
}

int sl_ms_check_open(const sl_index *ix, const sl_trust_plan *p, const char *manifest_path,
                     const char *text, size_t len, uint8_t (*file_digest)[32], uint8_t *file_has,
                     sl_err *err)
{
    /* a remote model's bundle is fetched (remote_bundle), a local one read */
    char *root = sl_trust_model_root(ix, manifest_path), *sig = NULL, real[PATH_MAX], name[PATH_MAX];
    const char **files = calloc(ix->nfiles + 1, sizeof *files);
    sl_ms_statement *s = NULL;
    int rc = SLUICE_OK;
    if (!root || !files) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto done;
    }
    int remote = sl_trust_remote_model(ix);
    if (remote) {
        if ((rc = remote_bundle(ix, p, &sig, &s, err)) < 0)
            goto done;
    } else {
        if (p->bundle_path)
            sig = strdup(p->bundle_path);
        else if ((sig = malloc(strlen(root) + sizeof SL_MS_DEFAULT_NAME + 1)))
            sprintf(sig, "%s/%s", root, SL_MS_DEFAULT_NAME);
        if (!sig) {
            rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
            goto done;
        }
        sl_ms_trust t = {p->keys, p->nkeys, p->cas, p->ncas};
        if ((rc = sl_ms_verify_file(sig, &t, &s, err)) < 0)
            goto done;
    }
    for (size_t i = 0; i < ix->nfiles; i++)
        files[i] = ix->files[i].name;
    const char *mname = remote ? remote_relative(root, manifest_path)
                        : realpath(root, real) ? relative_to(real, manifest_path, name, sizeof name)
                                               : NULL;
    rc = sl_ms_check_link(s, sig, mname, manifest_path, text, len, files, ix->nfiles, err);
    /* the whole files' signed digests, for the manifest's rules (files
     * mode; a file listed once, as the link has checked) */
    for (size_t i = 0; rc == SLUICE_OK && file_digest && file_has && s->method == SL_MS_FILES &&
                       i < ix->nfiles; i++)
        for (size_t k = 0; k < s->nres; k++)
            if (s->res[k].sha256 && !strcmp(s->res[k].name, files[i])) {
                memcpy(file_digest[i], s->res[k].digest, 32);
                file_has[i] = 1;
                break;
            }
done:
    sl_ms_statement_free(s);
    free(files);
    free(sig);
    free(root);
    return rc;
}
