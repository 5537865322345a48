/* trust_plan.c: every trust rule of an open, in one place (trust_plan.h).
 *
 * The rule for remote models is here and nowhere else: a signature is
 * checked on local bytes only. The sluice signature M.sig of a remote
 * manifest, and the OpenSSF bundle of a remote model (or of a remote
 * manifest), are not fetched: the open fails closed, saying so, rather
 * than read a URL as a relative local path (./http:/HOST/...sig) or trust
 * what it did not check. */
#include "trust/trust_plan.h"
#include "index/source.h"
#include "trust/model_signing.h"
#include "trust/signature.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define WHY_REMOTE_ED25519 "trusted keys are set and the signature of a remote manifest is not " \
                           "fetched (use a local manifest_path and its signature)"
#define WHY_REMOTE_OPENSSF "a remote model's OpenSSF model signature is not fetched: open a " \
                           "local copy to check it"

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

int sl_trust_plan_make(const sluice_options *o, const char *model_path, sl_trust_plan *out,
                       sl_err *err)
{
    memset(out, 0, sizeof *out);
    SL_TRY(contradictions(o, err));
    out->verify = o->verify;
    out->manifest_path = o->manifest_path;
    out->keys = o->trusted_keys;
    out->nkeys = o->ntrusted_keys;
    out->cas = o->trusted_cas;
    out->ncas = o->ntrusted_cas;
    out->bundle_path = o->signature_path;
    if (o->verify == SLUICE_VERIFY_OFF) {
        out->from = SL_MF_NONE;
        out->why = "policy OFF: no manifest is read, no signature checked";
        return SLUICE_OK;
    }
    int manifest_remote = sl_location_networked(o->manifest_path ? o->manifest_path : model_path);
    int model_remote = sl_location_networked(model_path);
    out->from = o->manifest_path ? (manifest_remote ? SL_MF_PATH_REMOTE : SL_MF_PATH)
                                 : (manifest_remote ? SL_MF_SIDECAR_REMOTE : SL_MF_SIDECAR);
    out->require = o->verify == SLUICE_VERIFY_REQUIRE;
    out->signature_asked = o->ntrusted_keys || o->ntrusted_cas;
    /* a Hub cache's blob names are the publisher's digests of local files,
     * unsigned: they stand in only where no signature is asked and no
     * manifest is named (an explicit manifest always wins) */
    out->hub_digest = !o->manifest_path && !model_remote && !out->signature_asked;
    if (o->ntrusted_cas || o->signature_path) {
        /* a bundle asked: OpenSSF model signing, by keys and CAs alike */
        out->formats = SL_SIG_OPENSSF;
        out->fail_closed = manifest_remote || model_remote;
        out->why = out->fail_closed ? WHY_REMOTE_OPENSSF
                                    : "trusted CAs or signature_path: the OpenSSF model signature";
        return SLUICE_OK;
    }
    if (!o->ntrusted_keys) {
        out->why = "no trusted key or CA: no signature asked";
        return SLUICE_OK;
    }
    out->formats = SL_SIG_ED25519;
    if (manifest_remote) {
        out->fail_closed = 1;
        out->why = WHY_REMOTE_ED25519;
        return SLUICE_OK;
    }
    /* EC keys check OpenSSF bundles: one beside a local model is checked
     * instead of M.sig; Ed25519 keys alone ask for M.sig, whatever else
     * lies beside the model */
    size_t ec = 0;
    for (size_t i = 0; i < o->ntrusted_keys; i++)
        ec += (size_t)sl_sig_key_is_ec(o->trusted_keys[i]);
    if (ec && !model_remote) {
        out->formats |= SL_SIG_OPENSSF;
        out->bundle_if_present = 1;
        out->why = "trusted keys, some EC: the OpenSSF model signature when model.sig lies "
                   "beside the model, else the manifest's Ed25519 signature";
    } else {
        out->why = "trusted keys: the manifest's Ed25519 signature (M.sig)";
    }
    return SLUICE_OK;
}

char *sl_trust_model_root(const sl_index *ix, const char *manifest_path)
{
    const char *p = ix->nfiles ? ix->files[0].path : manifest_path;
    const char *slash = strrchr(p, '/');
    return slash ? strndup(p, (size_t)(slash - p) ? (size_t)(slash - p) : 1) : strdup(".");
}

/* 1 when the model's directory holds an OpenSSF bundle (model.sig). */
static int bundle_beside(const sl_index *ix, const char *manifest_path)
{
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
