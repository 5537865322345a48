/* trust_plan.h: what an open trusts, decided once (trust_plan.c).
 *
 * sl_trust_plan_make reads the model's location and the open options and
 * says, before anything is read: where the manifest comes from, which
 * signature formats are checked (the sluice signed manifest M.sig, the
 * OpenSSF model signature model.sig), by which keys and CAs, whether no
 * manifest is a failure, and whether every manifest fails closed (a
 * signature asked that cannot be fetched: a remote model or manifest),
 * with the reason used in messages. The loader (manifest.c), the
 * signature checks (signature.c, model_signing_open.c) and sluice_open
 * (api.c) read the plan; none decides again. The rules are those of
 * "Manifests", "Signed manifests" and "OpenSSF model signing" in sluice.h.
 */
#ifndef SLUICE_TRUST_PLAN_H
#define SLUICE_TRUST_PLAN_H

#include "base/error.h"
#include "index/index.h"
#include "sluice.h"

#include <stddef.h>

/* Where the manifest is read from. */
typedef enum sl_manifest_from {
    SL_MF_NONE,           /* policy OFF: no manifest is read, not even manifest_path */
    SL_MF_PATH,           /* manifest_path, a local file */
    SL_MF_PATH_REMOTE,    /* manifest_path, a remote location (a 404 is an error) */
    SL_MF_SIDECAR,        /* the first local sidecar that is there */
    SL_MF_SIDECAR_REMOTE  /* the first sidecar the server has (an hf:// model:
                             else the Hub's LFS SHA-256, see hf.h) */
} sl_manifest_from;

/* Signature formats (bits of sl_trust_plan.formats). */
enum {
    SL_SIG_ED25519 = 1, /* the sluice signed manifest: M.sig beside M (signature.h) */
    SL_SIG_OPENSSF = 2  /* OpenSSF model signing: the bundle (model_signing.h) */
};

typedef struct sl_trust_plan {
    sl_manifest_from from;
    const char *manifest_path;    /* opts->manifest_path (borrowed), or NULL */
    sluice_verify_policy verify;  /* the policy asked */
    int require;                  /* no manifest fails (REQUIRE) */
    int signature_asked;          /* keys or CAs: no manifest fails closed (SLUICE_E_SIGNATURE) */
    unsigned formats;             /* SL_SIG_*: what a manifest read is checked by */
    int bundle_if_present;        /* both formats: OpenSSF when the model's directory
                                     holds model.sig, else Ed25519 (EC keys alone
                                     check only a bundle) */
    int fail_closed;              /* a signature is asked and cannot be checked:
                                     any manifest read fails, saying why */
    int hub_digest;               /* no manifest found: the SHA-256 a Hugging Face Hub
                                     cache names each blob by may stand in (api/hub.c,
                                     "Hub snapshots" in sluice.h): a local model, no
                                     manifest_path, no signature asked (keys or CAs
                                     want a signed manifest: a Hub snapshot without
                                     one still fails closed) */
    const char *why;              /* the reason, for messages (never NULL) */
    const char *const *keys;      /* borrowed from the options */
    size_t nkeys;
    const char *const *cas;
    size_t ncas;
    const char *bundle_path;      /* signature_path, or NULL: model.sig in the model's directory */
} sl_trust_plan;

/* Makes the plan of an open of model_path (a local path or a remote
 * location) with the options o (defaults filled, shapes checked: no NULL
 * entry in a list). Returns SLUICE_OK with *out, or SLUICE_E_INVAL with
 * err for options that contradict each other (keys or CAs or a bundle
 * path with policy OFF; a bundle path with nothing to check it). The
 * plan borrows o's lists and strings. */
int sl_trust_plan_make(const sluice_options *o, const char *model_path, sl_trust_plan *out,
                       sl_err *err);

/* The one format that checks the manifest read from manifest_path, for
 * the model indexed in ix: SL_SIG_OPENSSF, SL_SIG_ED25519, or 0 (no
 * signature asked). */
unsigned sl_trust_plan_format(const sl_trust_plan *p, const sl_index *ix,
                              const char *manifest_path);

/* The model's directory: that of its files (ix's), else the manifest's;
 * malloc'd (NULL when out of memory). */
char *sl_trust_model_root(const sl_index *ix, const char *manifest_path);

/* The failure of a plan that fails closed, for the manifest read from
 * manifest_path. Returns SLUICE_E_SIGNATURE. */
int sl_trust_plan_refuse(const sl_trust_plan *p, const char *manifest_path, sl_err *err);

/* The failure of a plan that asks a signature when no manifest was found
 * (looked: the sidecars looked for, "A" or "A nor B"). Returns
 * SLUICE_E_SIGNATURE. */
int sl_trust_plan_no_manifest(const sl_trust_plan *p, const char *model_path, const char *looked,
                              sl_err *err);

#endif
