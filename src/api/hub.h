/* hub.h: a Hugging Face Hub cache snapshot verified against the digests
 * its blobs are named by (hub.c; "Hub snapshots" in sluice.h,
 * docs/manifests.md).
 */
#ifndef SLUICE_HUB_H
#define SLUICE_HUB_H

#include "base/error.h"
#include "sluice.h"

/* When the trust plan lets a snapshot's digests stand in (trust_plan.h
 * hub_digest SL_HUB_SNAPSHOT), no sidecar manifest exists (the plan's
 * order: a sidecar wins), and every file of m's index is
 * a snapshot file of a Hub cache (its real path a blob named by 64
 * lowercase hex digits in the "blobs" directory beside the "snapshots"
 * directory it lies under): sets m->manifest to the manifest derived from
 * the files' verified bytes (read from the cache directory, or derived
 * now: every file without one is read and hashed whole once, and must
 * match its blob's name) and m->hub_snapshot. Otherwise leaves m as it
 * was. Returns SLUICE_OK, SLUICE_E_CHECKSUM (a file whose bytes are not
 * the digest its blob is named by: the message names the file and both
 * digests), SLUICE_E_IO, SLUICE_E_FILE_CHANGED, SLUICE_E_NOMEM, or a
 * manifest code. */
int sl_hub_open(sluice_model *m, const char *path, sl_err *err);

/* The same for an hf:// model that publishes no sluice manifest, whose
 * plan lets the Hub's LFS SHA-256 stand in (hub_digest SL_HUB_LFS) and
 * whose manifest is that stand-in (m->hub_files_only: the LFS SHA-256 the
 * Hub's API lists for each file, hf.h): when it lists every file of m's
 * index, replaces m->manifest by the manifest derived from the files'
 * bytes (read from the cache directory, or derived now: each file without
 * one is read whole once through its remote source and must match the
 * Hub's digest), clears m->hub_files_only and sets m->hub_snapshot. A
 * model with a file the Hub lists no LFS digest for (not a Git LFS object)
 * is left as it was. path: the model, for messages. Same codes as
 * sl_hub_open (SLUICE_E_CHECKSUM names the file and both digests). */
int sl_hub_open_remote(sluice_model *m, const char *path, sl_err *err);

#endif
