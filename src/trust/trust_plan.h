/* trust_plan.h: what an open trusts, decided once (trust_plan.c).
 *
 * sl_trust_plan_make reads the model's location and the open options and
 * says, before anything is read: where the manifest comes from, which
 * signature formats are checked (the sluice signed manifest M.sig, the
 * OpenSSF model signature model.sig; beside a remote manifest or model,
 * fetched: sl_trust_sig_fetch), by which keys and CAs, whether no
 * manifest is a failure, which of the Hugging Face Hub's digests may
 * stand in for a manifest nobody published (a cache snapshot's blob
 * names, an hf:// model's LFS SHA-256; a sidecar always wins), whether
 * every manifest fails closed (a signature asked of what nobody signed:
 * the Hub's LFS SHA-256 standing in for a manifest), with the reason used
 * in messages; and sl_trust_plan_read says how a manifest nobody published
 * is read (the Hub's stand-in, a manifest derived from it). The loader
 * (manifest.c), the signature checks (signature.c, model_signing_open.c),
 * the Hub's derivation (api/hub.c) and sluice_open (api.c) read the plan;
 * none decides again. The rules are those of "Manifests", "Signed
 * manifests", "OpenSSF model signing" and "Hub snapshots" in sluice.h.
 */
#ifndef SLUICE_TRUST_PLAN_H
#define SLUICE_TRUST_PLAN_H

#include "base/error.h"
#include "base/location.h"
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

/* Which of the Hub's digests may stand in for a manifest that nobody
 * published (sl_trust_plan.hub_digest). A sidecar always wins: each is
 * read only where the model has none (hf.h, api/hub.c). */
typedef enum sl_hub_stand_in {
    SL_HUB_NONE = 0,
    SL_HUB_SNAPSHOT, /* a local model whose files are a Hugging Face Hub cache
                        snapshot's: the SHA-256 each blob is named by
                        (sl_hub_open, before the loader, where no local
                        sidecar exists) */
    SL_HUB_LFS       /* an hf:// model read from its own location (never a
                        mirror): the Hub's LFS SHA-256 its API lists (the
                        loader, where the server has no sidecar; then
                        derived into tensor digests by sl_hub_open_remote) */
} sl_hub_stand_in;

/* Signature formats (bits of sl_trust_plan.formats). */
enum {
    SL_SIG_ED25519 = 1, /* the sluice signed manifest: M.sig beside M (signature.h) */
    SL_SIG_OPENSSF = 2  /* OpenSSF model signing: the bundle (model_signing.h) */
};

typedef struct sl_trust_plan {
    sl_manifest_from from;
    const char *manifest_path;    /* opts->manifest_path (borrowed), or NULL */
    const sl_location *manifest_loc; /* manifest_path as sluice_open parsed it (borrowed),
                                        or NULL */
    sluice_verify_policy verify;  /* the policy asked */
    int require;                  /* no manifest fails (REQUIRE) */
    int signature_asked;          /* keys or CAs: no manifest fails closed (SLUICE_E_SIGNATURE) */
    unsigned formats;             /* SL_SIG_*: what a manifest read is checked by */
    int bundle_if_present;        /* both formats: OpenSSF when the model's directory
                                     holds model.sig, else Ed25519 (EC keys alone
                                     check only a bundle) */
    int fail_closed;              /* a signature is asked and cannot be checked
                                     (sl_trust_plan_hub_stand_in): any manifest
                                     read fails, saying why */
    sl_hub_stand_in hub_digest;   /* no manifest published: the Hub's digests that
                                     may stand in (SL_HUB_*; "Hub snapshots" in
                                     sluice.h). A snapshot's: a local model, no
                                     manifest_path, no signature asked (keys or CAs
                                     want a signed manifest: a Hub snapshot without
                                     one still fails closed). The LFS SHA-256: an
                                     hf:// model, no manifest_path; with a signature
                                     asked they are read failing closed
                                     (sl_trust_plan_read) */
    const char *why;              /* the reason, for messages (never NULL) */
    const char *const *keys;      /* borrowed from the options */
    size_t nkeys;
    const char *const *cas;
    size_t ncas;
    const char *bundle_path;      /* signature_path, or NULL: model.sig in the model's directory */
    int bundle_remote;            /* signature_path is a remote location (fetched) */
    const char *manifest_at;      /* a remote manifest's location as read (credentials and
                                     query included), for the M.sig beside it; set by the
                                     loader (manifest.c), NULL otherwise */
} sl_trust_plan;

/* The locations an open is trusted by, as sluice_open parsed them once:
 * the model's (a local path or a remote location; a mirror's when it
 * serves), o->manifest_path's and o->signature_path's (NULL: not given).
 * Only their kinds are read (sl_location_remote). */
typedef struct sl_trust_locs {
    const sl_location *model, *manifest, *bundle;
} sl_trust_locs;

/* Makes the plan of an open of at->model with the options o (defaults
 * filled, shapes checked: no NULL entry in a list). Returns SLUICE_OK
 * with *out, or SLUICE_E_INVAL with err for options that contradict each
 * other (keys or CAs or a bundle path with policy OFF; a bundle path with
 * nothing to check it). The plan borrows o's lists and strings. */
int sl_trust_plan_make(const sluice_options *o, const sl_trust_locs *at, sl_trust_plan *out,
                       sl_err *err);

/* Mirrors for the whole model. Whether a failure of the model's own
 * location at open (code: of its hf:// resolution, of its index and
 * headers, or of the manifest's check of those headers) lets the mirrors
 * (sluice_options.fallback) serve the open: the location cannot be
 * reached or read (refused, DNS, a 5xx after every attempt, a 404, a
 * vanished or damaged file: SLUICE_E_IO, SLUICE_E_NO_FILES,
 * SLUICE_E_REMOTE, SLUICE_E_FILE_CHANGED, a header or index.json fault),
 * or its headers are not the ones the manifest's header digests name
 * (SLUICE_E_MANIFEST_MISMATCH). Never bad options, out of memory, a
 * missing feature, a cancelled call, a manifest that cannot be read or a
 * refused signature: a mirror does not stand in for what decides trust. */
int sl_trust_primary_down(int code);

/* The plan of an open that at->model (opts.fallback[k]) serves, the
 * model's own location being down (sl_trust_primary_down). What decides
 * is what the options say, as for the model's own location: a
 * manifest_path is the manifest whichever location serves (the mirror's
 * headers are checked against its header digests, its tensors against
 * its digests); without one, the sidecar beside the mirror, which must be
 * there (a mirror serves only a verified open: *needs_manifest is set)
 * and which trusted keys or CAs must have signed (its signature fetched
 * beside it as for any remote manifest). The caller named the mirror as
 * a copy of the model, so its sidecar is trusted as the model's own
 * sidecar would be; to trust one manifest whichever server answers, pin
 * it (manifest_path) or sign it. Same errors as sl_trust_plan_make. */
int sl_trust_plan_mirror(const sluice_options *o, const sl_trust_locs *at, sl_trust_plan *out,
                         int *needs_manifest, sl_err *err);

/* The one format that checks the manifest read from manifest_path, for
 * the model indexed in ix: SL_SIG_OPENSSF, SL_SIG_ED25519, or 0 (no
 * signature asked). */
unsigned sl_trust_plan_format(const sl_trust_plan *p, const sl_index *ix,
                              const char *manifest_path);

/* The model's directory: that of its files (ix's), else the manifest's;
 * malloc'd (NULL when out of memory). */
char *sl_trust_model_root(const sl_index *ix, const char *manifest_path);

/* 1 when the model's files are remote (its OpenSSF bundle is fetched). */
int sl_trust_remote_model(const sl_index *ix);

/* The location of a signature beside loc (a path or a URL, its query
 * dropped: the signature is another object): loc + name (in_dir 0:
 * "M" + ".sig"), or loc's directory + name (in_dir 1: "DIR/" +
 * "model.sig"). malloc'd; NULL when out of memory. */
char *sl_trust_sig_beside(const char *loc, int in_dir, const char *name);

/* The one place a remote signature is read: the object at loc (http(s),
 * s3, hf), whole, at most max bytes, through rc, from the origin (never
 * a proxy), into *text (malloc'd, a NUL after its *len bytes), or *text
 * NULL when the server has none (404). Any other failure is
 * SLUICE_E_SIGNATURE (SLUICE_E_NOMEM) with err, naming loc without its
 * credentials. */
struct sl_remote_cfg;
int sl_trust_sig_fetch(const struct sl_remote_cfg *rc, const char *loc, size_t max, char **text,
                       size_t *len, sl_err *err);

/* The plan of an hf:// model that publishes no manifest, whose Hub LFS
 * SHA-256 stand in for one (hf.h): nothing signed them, so a plan that
 * asks a signature fails closed, saying so. */
void sl_trust_plan_hub_stand_in(sl_trust_plan *p);

/* What is read under a plan of its own: a manifest nobody published. */
typedef enum sl_trust_read {
    SL_READ_HUB_LFS, /* the Hub's LFS SHA-256 standing in (SL_HUB_LFS): whole
                        files only, so read under IF_PRESENT (the policy asked
                        judges the manifest derived from them; REQUIRE
                        without one for every file is refused by the
                        loader), failing closed when p asks a signature
                        (sl_trust_plan_hub_stand_in) */
    SL_READ_DERIVED  /* a file's manifest api/hub.c derived from the Hub's
                        digest and kept in the cache directory: IF_PRESENT,
                        no signature checked (a record of the cache, trusted
                        as the memo's records are; hub.c checks that its
                        file digest is the Hub's), where p asks none; where
                        p asks a signature (formats, signature_asked) or
                        fails closed, the read fails closed
                        (SLUICE_E_SIGNATURE from the loader, saying so):
                        no caller can read a record without the signature
                        the open asks */
} sl_trust_read;

/* The plan *out under which `what` is read, for an open planned as p
 * (which it copies: the same keys, CAs and paths). */
void sl_trust_plan_read(const sl_trust_plan *p, sl_trust_read what, sl_trust_plan *out);

/* The failure of a plan that fails closed, for the manifest read from
 * manifest_path. Returns SLUICE_E_SIGNATURE. */
int sl_trust_plan_refuse(const sl_trust_plan *p, const char *manifest_path, sl_err *err);

/* The failure of a plan that asks a signature when no manifest was found
 * (looked: the sidecars looked for, "A" or "A nor B"). Returns
 * SLUICE_E_SIGNATURE. */
int sl_trust_plan_no_manifest(const sl_trust_plan *p, const char *model_path, const char *looked,
                              sl_err *err);

#endif
