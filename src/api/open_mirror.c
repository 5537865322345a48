/* open_mirror.c: mirrors for the whole model (sluice_options.fallback).
 *
 * When the model's own location cannot be opened (sl_trust_primary_down:
 * refused, DNS, 5xx after every attempt, 404, a damaged header, headers
 * the manifest's header digests refuse), sluice_open goes on from the
 * first mirror that opens with the same checks: its index and headers
 * read, its manifest read and checked as the trust plan made for it says
 * (trust_plan.c, sl_trust_plan_mirror: manifest_path when given, else the
 * mirror's sidecar; its signature when keys or CAs are trusted), its
 * headers against the manifest's header digests. A mirror that fails any
 * of it is refused and the next is tried. The one that serves is said by
 * sluice_model_location; its tensors then load as the model's own (cached
 * like any remote model's), the later mirrors taking over a tensor that
 * fails there as usual. */
#include "api/model.h"
#include "base/location.h"
#include "engine/engine.h"
#include "sources/remote.h"
#include "trust/hf.h"
#include "trust/manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends "; label: msg" (no "; " first) to *log; keeps *log on failure. */
static void log_add(char **log, const char *label, const char *msg)
{
    size_t old = *log ? strlen(*log) : 0, add = strlen(label) + strlen(msg) + 8;
    char *grown = realloc(*log, old + add);
    if (!grown)
        return;
    snprintf(grown + old, add, "%s%s: %s", old ? "; " : "", label, msg);
    *log = grown;
}

/* Mirror k (0-based) as the model's index and manifest, or why not. */
static int try_mirror(sluice_model *m, size_t k, sl_index *ix, sl_manifest **mf,
                      sl_trust_plan *plan, sl_err *e)
{
    int needs = 0, hub_only = 0;
    sl_trust_locs at = {m->fallback_loc[k], m->manifest_loc, m->signature_loc};
    SL_TRY(sl_trust_plan_mirror(&m->opts, &at, plan, &needs, e));
    SL_TRY(sl_index_open_ex(ix, m->fallback_loc[k], m->remote, e));
    ix->remote = m->remote;
    SL_TRY(sl_manifest_load(ix, plan, NULL, m->fallback_loc[k], mf, &hub_only, e));
    if (needs && (!*mf || hub_only))
        return sl_fail(e, SLUICE_E_MANIFEST, "no manifest to check its bytes against (no "
                       "manifest_path, and none beside it): a mirror serves only a verified "
                       "open");
    return SLUICE_OK;
}

int sl_open_from_mirrors(sluice_model *m, int primary_rc, const char **path, sl_err *err)
{
    sl_manifest_free(m->manifest);
    m->manifest = NULL;
    sl_index_free(&m->index);
    sl_hf_free(m->hub);     /* a mirror is read as given, never pinned */
    m->hub = NULL;
    char *log = NULL, label[1200];
    snprintf(label, sizeof label, "primary (%s)", m->loc->shown);
    log_add(&log, label, err->msg);
    if (!log || !(m->mirror_why = calloc(m->nfallback, sizeof *m->mirror_why))) {
        free(log);
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", m->loc->shown);
    }
    for (size_t k = 0; k < m->nfallback; k++) {
        sl_index ix = {0};
        sl_manifest *mf = NULL;
        sl_trust_plan plan;
        sl_err e = {0};
        int rc = try_mirror(m, k, &ix, &mf, &plan, &e);
        if (rc == SLUICE_OK) {
            m->index = ix;
            m->manifest = mf;
            m->trust = plan;
            m->serving = (unsigned)k + 1;
            m->serving_why = log;
            *path = m->fallback[k];
            return SLUICE_OK;
        }
        sl_manifest_free(mf);
        sl_index_free(&ix);
        if (rc == SLUICE_E_NOMEM) {
            free(log);
            sl_open_mirrors_free(m);
            return sl_fail(err, SLUICE_E_NOMEM, "%s", e.msg);
        }
        sl_location_scrub(e.msg, m->fallback_loc[k]);
        snprintf(label, sizeof label, "fallback %zu (%s)", k + 1, m->fallback_loc[k]->shown);
        log_add(&log, label, e.msg);
        m->mirror_why[k] = strdup(e.msg);  /* NULL: a shorter message later */
    }
    /* the primary's code; the message names every location's failure */
    sl_fail(err, primary_rc, "%s: cannot be opened, from itself nor from a mirror: %s",
            m->loc->shown, log);
    free(log);
    sl_open_mirrors_free(m);
    return primary_rc;
}

const sl_location *sl_model_where(const sluice_model *m)
{
    return m->serving ? m->fallback_loc[m->serving - 1] : m->pinned_loc ? m->pinned_loc : m->loc;
}

/* Frees each mirror's failure (m->mirror_why) and the list. */
static void free_whys(sluice_model *m)
{
    for (size_t k = 0; m->mirror_why && k < m->nfallback; k++)
        free(m->mirror_why[k]);
    free(m->mirror_why);
    m->mirror_why = NULL;
}

void sl_open_mirrors_done(sluice_model *m)
{
    if (m->serving)
        sl_engine_served_by(m->engine, m->serving, (const char *const *)m->mirror_why);
    free_whys(m);
}

void sl_open_mirrors_free(sluice_model *m)
{
    free_whys(m);
    free(m->serving_why);
    m->serving_why = NULL;
    m->serving = 0;
}

SLUICE_API const char *sluice_model_location(const sluice_model *model, unsigned *fallback,
                                             const char **why)
{
    if (fallback)
        *fallback = 0;
    if (why)
        *why = NULL;
    if (!model || model->failed)    /* sl_model_usable's test: api.c calls this file */
        return NULL;
    if (fallback)
        *fallback = model->serving;
    if (why)
        *why = model->serving_why;
    return sl_model_where(model)->shown;
}
