/* hooks.c: the test hooks of engine_hooks.h: fault injection through the
 * seam, expected digests without a manifest, cache dropping, pause
 * points. They hang off one model; nothing is global. Test glue at the top
 * of the layers: it reaches from the model into the engine's internals,
 * which nothing else does.
 */
#include "api/engine_hooks.h"
#include "engine/engine_int.h"

#include "trust/manifest.h"
#include "api/model.h"

#include <stdlib.h>
#include <unistd.h>
#include <string.h>

static sl_engine *engine_of(sluice_model *m)
{
    return sl_model_usable(m) == SLUICE_OK ? m->engine : NULL;
}

int sl_engine_set_fault(sluice_model *m, sl_io_fault kind, uint64_t nth, uint64_t count)
{
    sl_engine *e = engine_of(m);
    if (!e || (kind != SL_IO_FAULT_NONE && nth == 0))
        return SLUICE_E_INVAL;
    sl_io_set_fault(e->io, kind, sl_io_attempts(e->io) + nth, count);
    return SLUICE_OK;
}

uint64_t sl_engine_io_attempts(sluice_model *m)
{
    sl_engine *e = engine_of(m);
    return e ? sl_io_attempts(e->io) : 0;
}

int sl_engine_quiesce(sluice_model *m)
{
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    pthread_mutex_lock(&e->lock);
    sl_quiesce(e);
    sl_unlock(e);
    return SLUICE_OK;
}

int sl_engine_drop_cache(sluice_model *m)
{
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    pthread_mutex_lock(&e->lock);
    e->plan_active = 0; /* or read-ahead would fill it again at once */
    sl_quiesce(e);
    sl_slots_evict_unheld(e);
    sl_unlock(e);
    return SLUICE_OK;
}

int sl_engine_set_digests(sluice_model *m, const unsigned char (*digests)[32],
                          const unsigned char *has)
{
    sl_engine *e = engine_of(m);
    if (!e || (digests && !has))
        return SLUICE_E_INVAL;
    size_t n1 = e->n ? e->n : 1;
    unsigned char (*d)[32] = malloc(n1 * sizeof *d);
    unsigned char *h = calloc(n1, 1);
    if (!d || !h) {
        free(d);
        free(h);
        return SLUICE_E_NOMEM;
    }
    for (size_t i = 0; i < e->n; i++) {
        /* NULL: back to the manifest's digests */
        const uint8_t *want = digests ? (has[i] ? digests[i] : NULL)
                                      : sl_manifest_tensor_digest(m->manifest, i);
        if (want) {
            memcpy(d[i], want, 32);
            h[i] = 1;
        }
    }
    sl_err err;
    if (sl_hasher_need(e, &err) < 0) {
        free(d);
        free(h);
        return err.code;
    }
    pthread_mutex_lock(&e->lock);
    e->plan_active = 0;
    sl_quiesce(e);
    int loading = 0;
    for (size_t i = 0; i < e->n; i++)
        loading |= e->slots[i].state != SL_SLOT_IDLE && e->slots[i].state != SL_SLOT_READY;
    if (e->live_handles || e->nstreams || loading) {
        sl_unlock(e);
        free(d);
        free(h);
        return SLUICE_E_BUSY;
    }
    sl_slots_evict_unheld(e);
    free(e->expect);
    free(e->expect_has);
    e->expect = d;
    e->expect_has = h;
    for (size_t i = 0; i < e->n; i++)
        sl_slot_set_hashed(e, i, (e->flags & SLUICE_F_HASH_ALL) || sl_expected_digest(e, i));
    sl_unlock(e);
    return SLUICE_OK;
}

int sl_engine_set_pause(sluice_model *m, void (*fn)(void *ctx, int where), void *ctx)
{
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    pthread_mutex_lock(&e->lock);
    e->test_pause = fn;
    e->test_pause_ctx = ctx;
    pthread_mutex_unlock(&e->lock);
    return SLUICE_OK;
}

size_t sl_engine_pause_tensor(sluice_model *m)
{
    /* no lock: called from the pause hook, on the thread that holds it */
    sl_engine *e = engine_of(m);
    return e ? e->test_pause_tensor : SIZE_MAX;
}

int sl_engine_reopen_direct(sluice_model *m, const char *proc_fd_dir)
{
    sl_engine *e = engine_of(m);
    if (!e || !proc_fd_dir || !(e->flags & SLUICE_F_DIRECT))
        return SLUICE_E_INVAL;
    pthread_mutex_lock(&e->lock);
    e->plan_active = 0;
    sl_quiesce(e);
    for (size_t f = 0; f < e->ix->nfiles; f++) {
        if (e->files[f].direct_fd >= 0)
            close(e->files[f].direct_fd);
        e->files[f].direct_fd = -1;
        e->files[f].fell_back = 0;
    }
    e->st.direct_fallbacks = 0;
    atomic_store(&e->met.fallbacks[SL_FALLBACK_OPEN], 0);
    sl_engine_open_direct(e, proc_fd_dir);
    sl_unlock(e);
    return SLUICE_OK;
}
