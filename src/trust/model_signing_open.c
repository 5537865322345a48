/* model_signing_open.c: the OpenSSF model-signing check sluice_open
 * makes (see "OpenSSF model signing" in sluice.h): whether it applies,
 * and the bundle verified and linked to the manifest and the files the
 * index opened. The format itself is model_signing.c's, which the sluice
 * command shares; this file is the library's glue to the index. */
#include "trust/model_signing.h"
#include "trust/manifest.h"
#include "trust/signature.h"
#include "index/source.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The model's directory: that of its files (the index's), else the
 * manifest's; malloc'd. */
static char *model_root(const sl_index *ix, const char *manifest_path)
{
    const char *p = ix->nfiles ? ix->files[0].path : manifest_path;
    const char *slash = strrchr(p, '/');
    return slash ? strndup(p, (size_t)(slash - p) ? (size_t)(slash - p) : 1) : strdup(".");
}

int sl_ms_applies(const sl_index *ix, const sluice_options *o, const char *manifest_path)
{
    if (o->ntrusted_cas || o->signature_path)
        return 1;
    if (!o->ntrusted_keys || sl_location_networked(manifest_path))
        return 0;
    /* Ed25519 keys alone ask for M.sig, whatever else lies beside it */
    size_t ec = 0;
    for (size_t i = 0; i < o->ntrusted_keys; i++)
        ec += (size_t)sl_sig_key_is_ec(o->trusted_keys[i]);
    if (!ec)
        return 0;
    char *root = model_root(ix, manifest_path), sig[PATH_MAX];
    struct stat st;
    int yes = root && (size_t)snprintf(sig, sizeof sig, "%s/%s", root, SL_MS_DEFAULT_NAME) < sizeof sig &&
              lstat(sig, &st) == 0;
    free(root);
    return yes;
}

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

int sl_ms_check_open(const sl_index *ix, const sluice_options *o, const char *manifest_path,
                     const char *text, size_t len, uint8_t (*file_digest)[32], uint8_t *file_has,
                     sl_err *err)
{
    if (sl_location_networked(manifest_path) || (ix->nfiles && sl_location_networked(ix->files[0].path)))
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature of %s: a remote model's OpenSSF "
                       "model signature is not fetched: open a local copy to check it",
                       manifest_path);
    char *root = model_root(ix, manifest_path), *sig = NULL, real[PATH_MAX], name[PATH_MAX];
    const char **files = calloc(ix->nfiles + 1, sizeof *files);
    sl_ms_statement *s = NULL;
    int rc = SLUICE_OK;
    if (!root || !files) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto done;
    }
    if (o->signature_path)
        sig = strdup(o->signature_path);
    else if ((sig = malloc(strlen(root) + sizeof SL_MS_DEFAULT_NAME + 1)))
        sprintf(sig, "%s/%s", root, SL_MS_DEFAULT_NAME);
    if (!sig) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto done;
    }
    sl_ms_trust t = {o->trusted_keys, o->ntrusted_keys, o->trusted_cas, o->ntrusted_cas};
    if ((rc = sl_ms_verify_file(sig, &t, &s, err)) < 0)
        goto done;
    for (size_t i = 0; i < ix->nfiles; i++)
        files[i] = ix->files[i].name;
    const char *mname = realpath(root, real) ? relative_to(real, manifest_path, name, sizeof name)
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
