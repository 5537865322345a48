/* cancel.h: the cancellation token of sluice.h (cancel.c).
 *
 * A token knows nothing of engines: a waiter registers a wake-up call
 * with it for as long as it waits, and sluice_cancel_request() calls every
 * registered one after setting the flag, so that a thread asleep on its
 * own condition variable wakes up and sees the flag.
 *
 * Lock order: the token's lock, then whatever the wake-up call takes.
 * Never register or unregister while holding a lock that a wake-up call
 * takes.
 */
#ifndef SLUICE_CANCEL_H
#define SLUICE_CANCEL_H

#include "sluice.h"

typedef struct sl_cancel_reg {
    struct sl_cancel_reg *next;
    void (*wake)(void *ctx);
    void *ctx;
} sl_cancel_reg;

/* The token calls of sluice.h (the API checks their arguments). */
int sl_cancel_create(sluice_cancel **out);
void sl_cancel_request(sluice_cancel *c);
int sl_cancel_requested(const sluice_cancel *c); /* c may be NULL: 0 */
void sl_cancel_reset(sluice_cancel *c);
void sl_cancel_free(sluice_cancel *c);             /* NULL: no-op */

/* Adds reg (owned by the caller, alive until unregistered). c may be
 * NULL (nothing happens). */
void sl_cancel_register(sluice_cancel *c, sl_cancel_reg *reg);
void sl_cancel_unregister(sluice_cancel *c, sl_cancel_reg *reg);

#endif
