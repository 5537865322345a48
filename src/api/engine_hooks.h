/* engine_hooks.h: test hooks of the engine (engine.c). Not API: the tests
 * link the static library and call these to reach inside. Every hook
 * hangs off one model; nothing here is global.
 */
#ifndef SLUICE_ENGINE_HOOKS_H
#define SLUICE_ENGINE_HOOKS_H

#include "sources/io.h"
#include "sluice.h"

#include <stdint.h>

/* Makes read attempts nth .. nth+count-1, counted from this call (nth = 1:
 * the next attempt), fail as kind says (see io.h). kind NONE clears.
 * Returns SLUICE_OK or SLUICE_E_INVAL. */
int sl_engine_set_fault(sluice_model *m, sl_io_fault kind, uint64_t nth, uint64_t count);

/* Read attempts made so far on the model's seam. */
uint64_t sl_engine_io_attempts(sluice_model *m);

/* Replaces the manifest's expected digests: tensor i must hash to
 * digests[i] when has[i] is non-zero, and is not checked otherwise. NULL
 * digests returns to the manifest. Copies both arrays (sluice_count
 * entries). Drops every cached tensor so that the next acquire reads and
 * checks again. Call it with no handle live and no read running (just
 * after open, or after the reads settled). Returns SLUICE_OK,
 * SLUICE_E_INVAL, SLUICE_E_BUSY or SLUICE_E_NOMEM. */
int sl_engine_set_digests(sluice_model *m, const unsigned char (*digests)[32],
                          const unsigned char *has);

/* Evicts every tensor that no handle holds, so that the next acquire
 * reads it again. Returns SLUICE_OK or SLUICE_E_INVAL. */
int sl_engine_drop_cache(sluice_model *m);

/* Waits until no read is in flight and no worker has work. */
int sl_engine_quiesce(sluice_model *m);

/* Calls fn(ctx, where) on the calling thread where a public call has
 * dropped the engine's lock for the last time but has not yet left the
 * engine (where: 1 sluice_stream, 2 sluice_release, 3 sluice_acquire), so
 * that a test can hold a call there and race sluice_close against it; and
 * (where 4) in an acquire that the pump refused, before it leaves; and
 * (where 5) in sluice_verify after the run, before its message is
 * recorded and it leaves; and (where 6) when a load has started but
 * none of its reads is issued yet, with the engine's lock HELD (fn must
 * not call the library: it may change the model's file); and (where 7)
 * when a probe of the persistent cache found no blob for a tensor
 * (sl_engine_pause_tensor says which), the lock HELD likewise (fn may put
 * a blob in place, as another process would); and (where 8) each time
 * the caller of a span read (a local part) wakes in its wait, the lock
 * HELD likewise (fn must not call the library); and (where 9) when
 * sluice_acquire_part is about to wait for room in the pool, the lock
 * HELD likewise (fn must not call the library); and (where 10) when a
 * span read with a cancellation token has issued its first reads (they are in flight or done, the
 * rest not yet issued), the lock NOT held (fn may request a cancellation
 * token, sluice_cancel_request). fn NULL clears. Returns
 * SLUICE_OK or SLUICE_E_INVAL. */
int sl_engine_set_pause(sluice_model *m, void (*fn)(void *ctx, int where), void *ctx);

/* The tensor of the last pause at where 7; fn may call it. */
size_t sl_engine_pause_tensor(sluice_model *m);

/* Opens the O_DIRECT twins of the model's files again as if /proc were
 * mounted at proc_fd_dir's parent: a path that does not exist acts as a
 * system without /proc, so the files are reopened by path. Closes the
 * twins opened at open first and starts the fallback count afresh. For a
 * model opened with SLUICE_F_DIRECT; call it just after open, with no
 * handle live and no read running. Returns SLUICE_OK or SLUICE_E_INVAL. */
int sl_engine_reopen_direct(sluice_model *m, const char *proc_fd_dir);

#endif
