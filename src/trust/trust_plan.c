/* trust_plan.c: every trust rule of an open, in one place (trust_plan.h).
 *
 * The rule for remote models is here and nowhere else: a remote
 * manifest's signature (M.sig beside it) and a remote model's OpenSSF
 * bundle (model.sig beside its files) are fetched from the same server
 * (sl_trust_sig_fetch, the one place a remote signature is read: never a
 * URL read as a relative local path, ./http:/HOST/...sig) and checked as
 * local ones are; with trusted keys or CAs and none there, the open fails
 * closed. What cannot carry a signature fails closed, saying so: the
 * Hub's LFS SHA-256 standing in for a manifest (manifest.c). */
#include "trust/trust_plan.h"
#include "index/source.h"
#include "sources/remote.h"
#include "trust/model_signing.h"
#include "trust/signature.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


/* Options that contradict each other: a signature asked of an open that
 * reads no manifest must not pass for "no signature asked". */
static int contradictions(const sluice_options *o, sl_err *err)
{
    if (o->ntrusted_keys && o->verify == SLUICE_VERIFY_OFF)
        return sl_fail(err, SLUICE_E_INVAL, "options: trusted_keys ask for a signed manifest, "
                       "but the verify policy is SLUICE_VERIFY_OFF (which reads none)");
    if (o->signature_path && !o->ntrusted_cas && !o->ntrusted_keys)
        return sl_fail(err, SLUICE_E_INVAL, "options: signature_path is set, but neither "
                       "trusted_keys nor trusted_cas, to check it with");
    if ((o->ntrusted_cas || o->signature_path) && o->verify == SLUICE_VERIFY_OFF)
        return sl_fail(err, SLUICE_E_INVAL, "options: trusted_cas or signature_path ask for a "
                       "signed model, but the verify policy is SLUICE_VERIFY_OFF (which reads "
                       "no manifest)");
    return SLUICE_OK;
}

int sl_trust_plan_make(const sluice_options *o, const sl_trust_locs *at, sl_trust_plan *out,
                       sl_err *err)
{
    memset(out, 0, sizeof *out);
    SL_TRY(contradictions(o, err));
    out->verify = o->verify;
    out->manifest_path = o->manifest_path;
    out->manifest_loc = at->manifest;
    out->keys = o->trusted_keys;
    out->nkeys = o->ntrusted_keys;
    out->cas = o->trusted_cas;
    out->ncas = o->ntrusted_cas;
    out->bundle_path = o->signature_path;
    out->bundle_remote = sl_location_remote(at->bundle);
    if (o->verify == SLUICE_VERIFY_OFF) {
        out->from = SL_MF_NONE;
        out->why = "policy OFF: no manifest is read, no signature checked";
        return SLUICE_OK;
    }
    int model_remote = sl_location_remote(at->model);
    int manifest_remote = at->manifest ? sl_location_remote(at->manifest) : model_remote;
    out->from = o->manifest_path ? (manifest_remote ? SL_MF_PATH_REMOTE : SL_MF_PATH)
                                 : (manifest_remote ? SL_MF_SIDECAR_REMOTE : SL_MF_SIDECAR);
    out->require = o->verify == SLUICE_VERIFY_REQUIRE;
    out->signature_asked = o->ntrusted_keys || o->ntrusted_cas;
    /* a Hub cache's blob names are the publisher's digests of local files,
     * unsigned: they stand in only where no signature is asked and no
     * manifest is named (an explicit manifest always wins) */
    if (!o->manifest_path && !model_remote && !out->signature_asked)
        out->hub_digest = SL_HUB_SNAPSHOT;
    /* an hf:// model with no manifest_path: the Hub's LFS SHA-256 where
     * the server has no sidecar (with a signature asked, read failing
     * closed: sl_trust_plan_read) */
    else if (out->from == SL_MF_SIDECAR_REMOTE && at->model && at->model->kind == SL_LOC_HUB)
        out->hub_digest = SL_HUB_LFS;
    if (o->ntrusted_cas || o->signature_path) {
        /* a bundle asked: OpenSSF model signing, by keys and CAs alike */
        out->formats = SL_SIG_OPENSSF;
        out->why = manifest_remote || model_remote
                       ? "trusted CAs or signature_path: the OpenSSF model signature (model.sig "
                         "fetched beside the remote model)"
                       : "trusted CAs or signature_path: the OpenSSF model signature";
        return SLUICE_OK;
    }
    if (!o->ntrusted_keys) {
        out->why = "no trusted key or CA: no signature asked";
        return SLUICE_OK;
    }
    out->formats = SL_SIG_ED25519;
    /* EC keys check OpenSSF bundles: one beside the model is checked
     * instead of M.sig (a remote model's when its manifest is remote too,
     * both fetched from beside it); Ed25519 keys alone ask for M.sig,
     * whatever else lies beside the model */
    size_t ec = 0;
    for (size_t i = 0; i < o->ntrusted_keys; i++)
        ec += (size_t)sl_sig_key_is_ec(o->trusted_keys[i]);
    if (ec && (!model_remote || manifest_remote)) {
        out->formats |= SL_SIG_OPENSSF;
        out->bundle_if_present = 1;
        out->why = "trusted keys, some EC: the OpenSSF model signature when model.sig lies "
                   "beside the model, else the manifest's Ed25519 signature";
    } else {
        out->why = manifest_remote ? "trusted keys: the manifest's Ed25519 signature (M.sig, "
                                     "fetched beside the remote manifest)"
                                   : "trusted keys: the manifest's Ed25519 signature (M.sig)";
    }
    return SLUICE_OK;
}

int sl_trust_primary_down(int code)
{
    switch (code) {
    case SLUICE_E_IO:
    case SLUICE_E_NO_FILES:
    case SLUICE_E_REMOTE:
    case SLUICE_E_FILE_CHANGED:
    case SLUICE_E_MANIFEST_MISMATCH:
        return 1;
    default:
        /* the header's and index.json's faults (-10..-32): a damaged copy */
        return code <= SLUICE_E_HEADER_SHORT && code >= SLUICE_E_INDEX_MISMATCH;
    }
}

int sl_trust_plan_mirror(const sluice_options *o, const sl_trust_locs *at, sl_trust_plan *out,
                         int *needs_manifest, sl_err *err)
{
    /* the same rules, read for the location that serves: a manifest_path
     * stays the manifest; else the mirror's sidecar, local or remote as
     * the mirror is */
    SL_TRY(sl_trust_plan_make(o, at, out, err));
    /* a mirror is read as given, never pinned: no Hub digest stands in
     * (the mirror's own manifest or manifest_path must be there) */
    out->hub_digest = SL_HUB_NONE;
    *needs_manifest = 1;
    return SLUICE_OK;
}

char *sl_trust_model_root(const sl_index *ix, const char *manifest_path)
{
    const char *p = ix->nfiles ? ix->files[0].path : manifest_path;
    const char *slash = strrchr(p, '/');
    return slash ? strndup(p, (size_t)(slash - p) ? (size_t)(slash - p) : 1) : strdup(".");
}

int sl_trust_remote_model(const sl_index *ix)
{
    return ix->nfiles && sl_location_remote(ix->files[0].loc);
}

char *sl_trust_sig_beside(const char *loc, int in_dir, const char *name)
{
    size_t n = sl_location_name_len_of(loc);
    if (in_dir)
        while (n > 0 && loc[n - 1] != '/')
            n--;
    size_t size = n + strlen(name) + 2;
    char *out = malloc(size);
    if (out)
        snprintf(out, size, "%.*s%s%s", (int)n, loc, in_dir && !n ? "./" : "", name);
    return out;
}

int sl_trust_sig_fetch(const sl_remote_cfg *rc, const char *loc, size_t max, char **text,
                       size_t *len, sl_err *err)
{
    *text = NULL;
    *len = 0;
    if (!rc)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature: no remote configuration to fetch it");
    /* from the origin, never a proxy: a signature decides trust, as the
     * manifest does (sluice.h "Proxies"); a 404 is no signature */
    int rc2 = sl_remote_get_anchor(rc, loc, max, text, len, 0, err);
    if (rc2 < 0 && rc2 != SLUICE_E_NOMEM) {
        char shown[1100];
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, " (the signature %s could not be fetched)",
                 sl_location_shown_of(loc, shown, sizeof shown));
        sl_remote_scrub(err->msg, sizeof err->msg, loc);
        err->code = rc2 = SLUICE_E_SIGNATURE;
    }
    return rc2;
}

/* 1 when the model's directory holds an OpenSSF bundle (model.sig): a
 * remote model's, fetched to tell (a few kB). */
static int bundle_beside(const sl_index *ix, const char *manifest_path)
{
    if (sl_trust_remote_model(ix)) {
        char *sig = sl_trust_sig_beside(ix->files[0].loc->given, 1, SL_MS_DEFAULT_NAME), *text = NULL;
        size_t len = 0;
        sl_err ignored = {0};
        int yes = sig && sl_trust_sig_fetch(ix->remote, sig, SL_MS_MAX_BYTES, &text, &len,
                                            &ignored) == SLUICE_OK && text;
        free(text);
        free(sig);
        return yes;
    }
    char *root = sl_trust_model_root(ix, manifest_path), sig[PATH_MAX];
    struct stat st;
    int yes = root && (size_t)snprintf(sig, sizeof sig, "%s/%s", root, SL_MS_DEFAULT_NAME) < sizeof sig &&
              lstat(sig, &st) == 0;
    free(root);
    return yes;
}

unsigned sl_trust_plan_format(const sl_trust_plan *p, const sl_index *ix,
                              const char *manifest_path)
{
    if (p->bundle_if_present)
        return bundle_beside(ix, manifest_path) ? SL_SIG_OPENSSF : SL_SIG_ED25519;
    return p->formats & SL_SIG_OPENSSF ? SL_SIG_OPENSSF : p->formats & SL_SIG_ED25519;
}

void sl_trust_plan_hub_stand_in(sl_trust_plan *p)
{
    if (!p->formats)
        return;
    p->fail_closed = 1;
    p->why = "the repository publishes no manifest and the Hub's LFS SHA-256 stand in for one, "
             "which nobody signed: a signature is not fetched for them (publish a signed "
             "manifest beside the weights)";
}

void sl_trust_plan_read(const sl_trust_plan *p, sl_trust_read what, sl_trust_plan *out)
{
    *out = *p;
    out->verify = SLUICE_VERIFY_IF_PRESENT;
    if (what == SL_READ_HUB_LFS) {
        sl_trust_plan_hub_stand_in(out);
        return;
    }
    /* SL_READ_DERIVED: the cache's record, no signature, read only where
     * none is asked (api/hub.c derives for such plans alone). A plan that
     * asks one (or fails closed) is never read without it: the record
     * fails closed instead, so no caller can turn the signature off */
    if (p->formats || p->signature_asked || p->fail_closed) {
        out->fail_closed = 1;
        out->why = "a manifest derived from the Hub's digests (a record of the cache) is "
                   "signed by nobody, and this open asks a signature: it is not read without "
                   "one (publish a signed manifest beside the weights)";
        return;
    }
    out->formats = 0;
    out->bundle_if_present = out->fail_closed = 0;
}

int sl_trust_plan_refuse(const sl_trust_plan *p, const char *manifest_path, sl_err *err)
{
    if (p->formats & SL_SIG_OPENSSF)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature of %s: %s", manifest_path, p->why);
    return sl_fail(err, SLUICE_E_SIGNATURE, "signature of %s.sig: missing: %s", manifest_path,
                   p->why);
}

int sl_trust_plan_no_manifest(const sl_trust_plan *p, const char *model_path, const char *looked,
                              sl_err *err)
{
    (void)p;
    return sl_fail(err, SLUICE_E_SIGNATURE, "%s: trusted keys are set but there is no "
                   "manifest to check the signature of: no sidecar %s (write one with "
                   "'sluice manifest', or set manifest_path)", model_path, looked);
}
