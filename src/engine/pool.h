/* pool.h: the bounded buffer pool of an engine (pool.c).
 *
 * One anonymous mapping of the whole budget, reserved at create and never
 * returned to the kernel until destroy: a page is faulted in the first
 * time some buffer uses it and reused by every later buffer, so a warm
 * pool costs no page faults. Buffers are carved out of it by an
 * address-ordered first-fit allocator whose block descriptors live
 * outside the arena (the arena holds only tensor bytes).
 *
 * Not thread-safe: the engine's lock serialises every call.
 */
#ifndef SLUICE_POOL_H
#define SLUICE_POOL_H

#include "base/error.h"

#include <stdint.h>

/* Every buffer starts on a multiple of this (the handle's promise). */
#define SL_POOL_ALIGN 64u

typedef struct sl_pool sl_pool;
typedef struct sl_pool_blk sl_pool_blk;

/* Maps an arena of budget bytes (rounded down to SL_POOL_ALIGN).
 * Returns SLUICE_OK, SLUICE_E_INVAL (budget below SL_POOL_ALIGN) or
 * SLUICE_E_NOMEM (the mapping was refused). */
int sl_pool_create(uint64_t budget, sl_pool **out, sl_err *err);

/* Unmaps the arena and frees every descriptor. Buffers still allocated are
 * simply forgotten. NULL is a no-op. */
void sl_pool_destroy(sl_pool *p);

/* The end of the part of the arena ever handed out: pages below it have
 * been touched, pages above it would be faulted in fresh. */
uint64_t sl_pool_frontier(const sl_pool *p);

/* Like sl_pool_alloc, but only a block that ends at or below limit will
 * do (so that a buffer can reuse touched memory rather than fresh). */
void *sl_pool_alloc_below(sl_pool *p, uint64_t size, uint64_t align, uint64_t limit,
                          sl_pool_blk **out);

/* The usable bytes of the arena (the budget rounded down). */
uint64_t sl_pool_capacity(const sl_pool *p);

/* The bytes an allocation of size bytes with this alignment may need
 * (what to compare with the capacity to know if it can ever fit). */
uint64_t sl_pool_footprint(uint64_t size, uint64_t align);

/* Makes sure that the next sl_pool_alloc cannot fail for want of a block
 * descriptor (it needs at most two), so that its NULL means "no room".
 * Returns SLUICE_OK or SLUICE_E_NOMEM. */
int sl_pool_reserve(sl_pool *p);

/* A buffer of size bytes (> 0) starting on a multiple of align (a power of
 * two, at least SL_POOL_ALIGN), or NULL when no free range is large
 * enough right now, or (unless sl_pool_reserve succeeded since the last
 * allocation) when a descriptor cannot be allocated. *blk receives the
 * descriptor to give back to sl_pool_free. */
void *sl_pool_alloc(sl_pool *p, uint64_t size, uint64_t align, sl_pool_blk **blk);

/* Gives a buffer back; its range merges with free neighbours. */
void sl_pool_free(sl_pool *p, sl_pool_blk *blk);

/* Tags a buffer with its owner (the engine's slot index), so that
 * sl_pool_largest_room can ask whether the owner would give it up. */
void sl_pool_set_owner(sl_pool_blk *blk, size_t owner);

/* The largest buffer (aligned to align) that could be carved out of one
 * range of the arena if every buffer whose owner `evictable` accepts were
 * freed first (evictable NULL: free ranges only). Lets a caller learn that
 * no eviction can make room, because held buffers split the arena, before
 * it evicts anything. */
uint64_t sl_pool_largest_room(const sl_pool *p, uint64_t align,
                              int (*evictable)(void *ctx, size_t owner), void *ctx);

/* Gives the pages of every free range back to the kernel
 * (MADV_DONTNEED): they read as zero and are faulted in afresh when
 * used again. Returns the bytes given back. */
uint64_t sl_pool_trim(sl_pool *p);

/* Bytes held by allocated buffers now, and the most ever held at once. */
uint64_t sl_pool_in_use(const sl_pool *p);
uint64_t sl_pool_high_water(const sl_pool *p);

#endif
