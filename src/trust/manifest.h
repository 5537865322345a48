/* manifest.h: the digest manifest of a model (manifest.c).
 *
 * Read once at open (after the index, before the engine) and immutable
 * after, so every thread may read it without a lock. The forms read, the
 * sidecar rule and the policies are documented in sluice.h ("Manifests").
 */
#ifndef SLUICE_MANIFEST_H
#define SLUICE_MANIFEST_H

#include "base/digest.h"
#include "base/error.h"
#include "index/index.h"
#include "trust/trust_plan.h"
#include "sluice.h"

#include <stdint.h>

typedef struct sl_manifest sl_manifest;
struct sl_hf_repo;

/* The one manifest loader of sluice_open: reads the manifest where the
 * plan says (a local file or sidecar; a remote one through ix->remote;
 * for an hf:// model that publishes none, hub's LFS SHA-256, hub may be
 * NULL), checks its signature as the plan says, and resolves the policy
 * against ix. *out is NULL when nothing is to be verified (no manifest,
 * or policy OFF); *hub_files_only (may be NULL) is set to 1 when the
 * manifest is the Hub's stand-in (whole files only: sluice_open derives
 * tensor digests from it, api/hub.c sl_hub_open_remote). On failure *out is NULL, nothing is
 * leaked and err says why (naming remote locations without their
 * credentials). */
int sl_manifest_load(const sl_index *ix, const sl_trust_plan *plan, const struct sl_hf_repo *hub,
                     const sl_location *model, sl_manifest **out, int *hub_files_only,
                     sl_err *err);

/* The same for a manifest already read: text (len bytes, a NUL after
 * them) from path (a file or a remote location, named in messages).
 * Takes path and text (malloc'd) whatever the outcome. */
int sl_manifest_from_text(const sl_index *ix, const sl_trust_plan *plan, char *path,
                          char *text, size_t len, sl_manifest **out, sl_err *err);

/* OpenSSF model signing at open (model_signing_open.c): the check of the
 * bundle the plan names and its link to the manifest text read from
 * manifest_path (local, as the plan ensures) and to ix's files. */
/* file_digest / file_has (ix->nfiles each, may be NULL) get the signed
 * SHA-256 of each whole file (files mode), for the manifest to check. */
int sl_ms_check_open(const sl_index *ix, const sl_trust_plan *plan, const char *manifest_path,
                     const char *text, size_t len, uint8_t (*file_digest)[32], uint8_t *file_has,
                     sl_err *err);

void sl_manifest_free(sl_manifest *m);

/* The expected digest (32 bytes, sl_manifest_algorithm) of tensor i, or NULL when tensor i is not
 * checked. m may be NULL (nothing checked). Immutable: any thread. */
const uint8_t *sl_manifest_tensor_digest(const sl_manifest *m, size_t i);

/* The expected digest of file i (whole file), or NULL when the manifest
 * lists none; *size (may be NULL) gets the listed size or
 * SLUICE_SIZE_UNKNOWN. m may be NULL. */
const uint8_t *sl_manifest_file_digest(const sl_manifest *m, size_t i, uint64_t *size);

/* The chunk digests of every tensor (ntensors entries; count 0: none),
 * living as long as m; NULL for a NULL m. */
const sl_chunk_digests *sl_manifest_chunks(const sl_manifest *m);

/* The manifest's digest of rank `rank` of n parts of tensor i along
 * dim ("parts"), or NULL when it lists none for that dim and n. m may be
 * NULL. Immutable: any thread. */
const uint8_t *sl_manifest_part_digest(const sl_manifest *m, size_t i, uint32_t dim, uint64_t n,
                                       uint64_t rank);

/* The policy in force: REQUIRE or IF_PRESENT; OFF for a NULL m. */
sluice_verify_policy sl_manifest_policy(const sl_manifest *m);

/* The algorithm of every digest of m (SHA-256 for a NULL m). */
sluice_algorithm sl_manifest_algorithm(const sl_manifest *m);

/* 0 for the flat form, else the structured form's version (1 or 2); 0
 * for a NULL m. */
int sl_manifest_version(const sl_manifest *m);

/* The path the manifest was read from; NULL for a NULL m. */
const char *sl_manifest_path(const sl_manifest *m);

/* The sidecars of the model at model (a local path or a remote location,
 * as sluice_open parsed it), in the order they are looked for, into
 * out[0] and out[1], each malloc'd: F.manifest.json for a file F; for a
 * directory, prefix or index.json, DIR/sluice.manifest.json and then,
 * when ix (may be NULL) holds one file F, F.manifest.json. Returns how
 * many (1 or 2), or -1 when out of memory (nothing to free). */
int sl_manifest_sidecars(const sl_index *ix, const sl_location *model, char *out[2]);

/* The first of the local model_path's sidecars that is there (or cannot
 * be told absent), found without the model's index: one_name (may be
 * NULL) is the name of the model's one file, whose base name in
 * model_path's directory gives the second sidecar (sluice_find_manifest).
 * *path malloc'd; SLUICE_E_MANIFEST naming those looked for when none is
 * there, or SLUICE_E_NOMEM. */
int sl_manifest_find_local(const char *model_path, const char *one_name, char **path,
                           sl_err *err);

/* "A", or "A nor B": n sidecars for a message, in buf (returned). */
const char *sl_manifest_sidecars_list(char *const cand[], int n, char *buf, size_t cap);

#endif
