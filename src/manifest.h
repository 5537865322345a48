/* manifest.h: the SHA-256 manifest of a model (manifest.c).
 *
 * Read once at open (after the index, before the engine) and immutable
 * after, so every thread may read it without a lock. The forms read, the
 * sidecar rule and the policies are documented in sluice.h ("Manifests").
 */
#ifndef SLUICE_MANIFEST_H
#define SLUICE_MANIFEST_H

#include "error.h"
#include "index.h"
#include "sluice.h"

#include <stdint.h>

typedef struct sl_manifest sl_manifest;

/* Reads the manifest that opts names (or the sidecar beside model_path)
 * and resolves the policy against ix. *out is NULL when nothing is to be
 * verified (no manifest, or policy OFF). On failure *out is NULL, nothing
 * is leaked and err says why. */
int sl_manifest_load(const sl_index *ix, const sluice_options *opts,
                     const char *model_path, sl_manifest **out, sl_err *err);

/* The same for a manifest already read: text (len bytes, a NUL after
 * them) from path (a file or a remote location, named in messages).
 * Takes path and text (malloc'd) whatever the outcome. */
int sl_manifest_from_text(const sl_index *ix, const sluice_options *opts, char *path,
                          char *text, size_t len, sl_manifest **out, sl_err *err);

void sl_manifest_free(sl_manifest *m);

/* The expected SHA-256 (32 bytes) of tensor i, or NULL when tensor i is not
 * checked. m may be NULL (nothing checked). Immutable: any thread. */
const uint8_t *sl_manifest_tensor_digest(const sl_manifest *m, size_t i);

/* The expected SHA-256 of file i (whole file), or NULL when the manifest
 * lists none; *size (may be NULL) gets the listed size or
 * SLUICE_SIZE_UNKNOWN. m may be NULL. */
const uint8_t *sl_manifest_file_digest(const sl_manifest *m, size_t i, uint64_t *size);

/* The policy in force: REQUIRE or IF_PRESENT; OFF for a NULL m. */
sluice_verify_policy sl_manifest_policy(const sl_manifest *m);

/* The path the manifest was read from; NULL for a NULL m. */
const char *sl_manifest_path(const sl_manifest *m);

/* The sidecar path for a model path (see sluice_open), malloc'd; NULL when
 * out of memory. */
char *sl_manifest_sidecar(const char *model_path);

#endif
