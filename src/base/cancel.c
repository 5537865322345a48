/* cancel.c: the cancellation token; see cancel.h and sluice.h ("Streaming
 * with options"). */
#include "base/cancel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct sluice_cancel {
    atomic_int requested;
    pthread_mutex_t lock;        /* the registrations */
    sl_cancel_reg *regs;
};

int sl_cancel_create(sluice_cancel **out)
{
    *out = NULL;
    sluice_cancel *c = calloc(1, sizeof *c);
    if (!c)
        return SLUICE_E_NOMEM;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return SLUICE_E_NOMEM;
    }
    atomic_init(&c->requested, 0);
    *out = c;
    return SLUICE_OK;
}

void sl_cancel_request(sluice_cancel *c)
{
    pthread_mutex_lock(&c->lock);
    atomic_store(&c->requested, 1);
    for (sl_cancel_reg *r = c->regs; r; r = r->next)
        r->wake(r->ctx);
    pthread_mutex_unlock(&c->lock);
}

int sl_cancel_requested(const sluice_cancel *c)
{
    return c ? atomic_load(&((sluice_cancel *)c)->requested) : 0;
}

void sl_cancel_reset(sluice_cancel *c)
{
    atomic_store(&c->requested, 0);
}

void sl_cancel_free(sluice_cancel *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void sl_cancel_register(sluice_cancel *c, sl_cancel_reg *reg)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    reg->next = c->regs;
    c->regs = reg;
    pthread_mutex_unlock(&c->lock);
}

void sl_cancel_unregister(sluice_cancel *c, sl_cancel_reg *reg)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    for (sl_cancel_reg **p = &c->regs; *p; p = &(*p)->next)
        if (*p == reg) {
            *p = reg->next;
            break;
        }
    pthread_mutex_unlock(&c->lock);
}
