/* model.h: the model object that ties the components together, owned by
 * the API layer (api.c); also seen by the test hooks (hooks.c), and by
 * nothing below.
 *
 * open:  index (index.c) -> manifest (manifest.c) -> engine (engine.c)
 * close: engine -> manifest -> index
 */
#ifndef SLUICE_MODEL_H
#define SLUICE_MODEL_H

#include "base/error.h"
#include "index/index.h"
#include "sluice.h"
#include "trust/trust_plan.h"

#include <stdint.h>

typedef struct sl_manifest sl_manifest;
typedef struct sl_engine sl_engine;

struct sluice_model {
    int failed;                /* open failed: only errmsg and close work */
    sl_err open_err;           /* the open's failure, when failed */
    sluice_options opts;       /* copy of the caller's options (defaults filled) */
    sl_trust_plan trust;       /* what the open trusts (trust_plan.h); its lists
                                  are the caller's, cleared after the open */
    char *path;                /* as given to sluice_open */
    sl_index index;
    sl_manifest *manifest;     /* NULL when nothing is verified */
    sl_engine *engine;
    char *metrics_label;       /* the `model` label of its metrics (api_metrics.c) */
    char **fallback;           /* copies of opts.fallback (m->opts points here) */
    size_t nfallback;
    /* the locations, each parsed once at open (base/location.h): path,
     * opts.manifest_path (NULL when none), opts.signature_path (NULL when
     * none), the commit an hf:// path was pinned to (NULL when none), each
     * of fallback */
    struct sl_location *loc, *manifest_loc, *signature_loc, *pinned_loc;
    struct sl_location **fallback_loc;
    struct sl_remote_cfg *remote; /* remote.h; NULL when nothing is remote */
    sluice_verification verification; /* what open found to verify against */
    struct sl_hf_repo *hub;    /* hf.h: an hf:// location's resolution, during open only */
    int hub_files_only;        /* the manifest is the Hub's LFS SHA-256 (whole files
                                  only, nothing derived from them: a file of an hf://
                                  model is no LFS object): no tensor load is checked */
    int hub_snapshot;          /* the manifest was derived from the Hub's digests, a
                                  cache's blob names or an hf:// model's LFS SHA-256
                                  (hub.c): SLUICE_VERIFIED_PUBLISHER_DIGEST */
    unsigned serving;          /* 0: the index is the model's own location's; k: its
                                  own could not be opened and fallback k serves it
                                  (open_mirror.c) */
    char *serving_why;         /* serving: "primary: <why>[; fallback J (LOC): <why>]" */
    char **mirror_why;         /* during open only: why each mirror before `serving`
                                  could not serve (nfallback entries) */
    char *sidecar_looked;      /* SLUICE_UNVERIFIED_NO_MANIFEST: the sidecar looked
                                  for, as messages show it (no credentials) */

    /* the first part read that fell back to reading its whole tensor
     * (sluice_part_note): written once, by the call that took part_noted
     * from 0 to 1; 2 once written */
    _Atomic int part_noted;
    char part_note[512];

    /* names the model in each thread's error entries (errmsg.c); unlike
     * the address, never reused by a later model */
    uint64_t err_id;
};

/* Records err as the calling thread's last failure on m and returns
 * err->code. Public entry points end with: return sl_model_error(m, &err). */
int sl_model_error(sluice_model *m, const sl_err *err);

/* The model's own location could not be opened (code primary_rc, err
 * says why; sl_trust_primary_down): the first mirror that opens with the
 * checks of the trust plan the options make for it (trust_plan.c,
 * sl_trust_plan_mirror) serves the index and the manifest
 * (open_mirror.c). m->index, m->manifest and m->hub are freed first.
 * Returns SLUICE_OK with m->index, m->manifest, m->trust and m->serving
 * set and *path the mirror's location; else the primary's code, err
 * naming every location's failure. */
int sl_open_from_mirrors(sluice_model *m, int primary_rc, const char **path, sl_err *err);

/* The location that serves the model: the mirror's when one serves, else
 * the commit an hf:// path was pinned to, else the model's own. */
const struct sl_location *sl_model_where(const sluice_model *m);

/* After the engine is made for a model a mirror serves: the engine's
 * mirrors up to that one are not tried again for a tensor, and the
 * per-open messages go. */
void sl_open_mirrors_done(sluice_model *m);

/* Frees what sl_open_from_mirrors kept (close, a failed open). */
void sl_open_mirrors_free(sluice_model *m);

/* The mirrors a model may have at most (sluice_options.fallback_count). */
#define SL_MAX_FALLBACK 16

/* SLUICE_OK when m is an open, usable model, else SLUICE_E_INVAL. */
int sl_model_usable(const sluice_model *m);

#endif
