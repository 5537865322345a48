/* hf.h: the resolution of a Hugging Face Hub location (hf.c), in front of
 * the remote source: hf://ORG/NAME[@REVISION][/FILE] is pinned to the
 * commit its revision names, checked against the Hub's list of the
 * repository's files, and that list gives the manifest of last resort
 * (the Hub's LFS SHA-256 of each whole file) when the repository
 * publishes no sluice manifest. remote_hf.c maps the pinned location to
 * the Hub's resolve URLs. */
#ifndef SLUICE_HF_H
#define SLUICE_HF_H

#include "base/error.h"
#include "index/index.h"
#include "sources/remote.h"

#include <stddef.h>

typedef struct sl_hf_repo sl_hf_repo;

/* For an hf:// location: asks the Hub's API
 * (ENDPOINT/api/models/ORG/NAME/revision/REVISION?blobs=true, with the
 * Hub's token) for the commit and the files, checks that FILE (or, with
 * none, model.safetensors.index.json or model.safetensors) is there, and
 * sets *out (sl_hf_free). For any other location *out is NULL and
 * nothing is asked. Codes: SLUICE_E_INVAL (malformed), SLUICE_E_NO_FILES
 * (no such repository, revision or file), SLUICE_E_REMOTE (401/403 and
 * other refusals, the API's reply unreadable), SLUICE_E_NOMEM. */
int sl_hf_resolve(const sl_remote_cfg *c, const char *loc, sl_hf_repo **out, sl_err *err);

/* The location pinned to the commit: hf://ORG/NAME@COMMIT[/FILE]. */
const char *sl_hf_pinned(const sl_hf_repo *r);

/* A manifest (version 1, "files" only) of the LFS SHA-256 and sizes the
 * Hub lists for the files of ix (a file the Hub lists no LFS digest for
 * has no entry), for sl_manifest_from_text: *text and *named malloc'd;
 * *text NULL when no file of ix has one. *all: 1 when every file of ix
 * has one (sluice_open then derives tensor digests from them, api/hub.c). */
int sl_hf_manifest(const sl_hf_repo *r, const sl_index *ix, char **text, size_t *len,
                   char **named, int *all, sl_err *err);

void sl_hf_free(sl_hf_repo *r);

#endif
