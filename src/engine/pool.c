/* pool.c: see pool.h.
 *
 * The arena is described by a list of blocks in address order, free and
 * used alike, so that a freed block finds its neighbours in O(1) and merges
 * with them; the free blocks are also chained on their own, in address
 * order, for first fit. Lowest-address first fit keeps the used blocks
 * packed towards the start of the arena, which keeps the set of pages
 * ever touched (the resident size) as small as the load allows.
 *
 * Descriptors are malloc'd and recycled through a spare list, so a warm
 * pool allocates nothing.
 */
#include "engine/pool.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct sl_pool_blk {
    uint64_t off, size;             /* range in the arena */
    int free;
    size_t owner;                   /* the caller's tag (sl_pool_set_owner) */
    sl_pool_blk *prev, *next;       /* every block, by address */
    sl_pool_blk *fprev, *fnext;     /* free blocks only, by address */
};

struct sl_pool {
    unsigned char *base;
    uint64_t capacity;
    uint64_t in_use, high_water;
    uint64_t frontier;              /* end of the highest block ever used */
    sl_pool_blk *first;             /* address order */
    sl_pool_blk *free_first;
    sl_pool_blk *spare;             /* recycled descriptors (chained by next) */
};

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) & ~(a - 1);
}

static sl_pool_blk *blk_new(sl_pool *p)
{
    sl_pool_blk *b = p->spare;
    if (b)
        p->spare = b->next;
    else if (!(b = malloc(sizeof *b)))
        return NULL;
    *b = (sl_pool_blk){0};
    return b;
}

static void blk_recycle(sl_pool *p, sl_pool_blk *b)
{
    b->next = p->spare;
    p->spare = b;
}

int sl_pool_reserve(sl_pool *p)
{
    int have = 0;
    for (sl_pool_blk *b = p->spare; b && have < 2; b = b->next)
        have++;
    for (; have < 2; have++) {
        sl_pool_blk *b = malloc(sizeof *b);
        if (!b)
            return SLUICE_E_NOMEM;
        blk_recycle(p, b);
    }
    return SLUICE_OK;
}

int sl_pool_create(uint64_t budget, sl_pool **out, sl_err *err)
{
    *out = NULL;
    uint64_t cap = budget & ~(uint64_t)(SL_POOL_ALIGN - 1);
    if (cap == 0)
        return sl_fail(err, SLUICE_E_INVAL, "pool: a budget of %llu bytes holds no buffer",
                       (unsigned long long)budget);
    if (cap > SIZE_MAX)
        return sl_fail(err, SLUICE_E_INVAL, "pool: a budget of %llu bytes exceeds the address space",
                       (unsigned long long)budget);
    sl_pool *p = calloc(1, sizeof *p);
    if (!p)
        return sl_fail(err, SLUICE_E_NOMEM, "pool: out of memory");
    /* MAP_NORESERVE: the budget is a ceiling, not a commitment; pages are
     * faulted in by use. */
    void *base = mmap(NULL, (size_t)cap, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(p);
        return sl_fail_errno(err, SLUICE_E_NOMEM, errno,
                             "pool: cannot map %llu bytes", (unsigned long long)cap);
    }
#ifdef MADV_HUGEPAGE
    /* First touch costs a fault per page, and on these VMs a fault costs
     * microseconds: 2 MiB pages make a cold pool about 10x faster to
     * fill (measured). Only a hint; ignored where THP is off. */
    if (cap >= (2u << 20))
        madvise(base, (size_t)cap, MADV_HUGEPAGE);
#endif
    p->base = base;
    p->capacity = cap;
    sl_pool_blk *b = blk_new(p);
    if (!b) {
        munmap(base, (size_t)cap);
        free(p);
        return sl_fail(err, SLUICE_E_NOMEM, "pool: out of memory");
    }
    b->size = cap;
    b->free = 1;
    p->first = p->free_first = b;
    *out = p;
    return SLUICE_OK;
}

void sl_pool_destroy(sl_pool *p)
{
    if (!p)
        return;
    munmap(p->base, (size_t)p->capacity);
    for (sl_pool_blk *b = p->first, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    for (sl_pool_blk *b = p->spare, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(p);
}

uint64_t sl_pool_capacity(const sl_pool *p) { return p->capacity; }
uint64_t sl_pool_in_use(const sl_pool *p) { return p->in_use; }
uint64_t sl_pool_high_water(const sl_pool *p) { return p->high_water; }
uint64_t sl_pool_frontier(const sl_pool *p) { return p->frontier; }

uint64_t sl_pool_footprint(uint64_t size, uint64_t align)
{
    if (size > UINT64_MAX - 2 * (uint64_t)align)
        return UINT64_MAX;
    return round_up(size, SL_POOL_ALIGN) + (align > SL_POOL_ALIGN ? align - SL_POOL_ALIGN : 0);
}

/* Puts a free block b on the free chain after free block `after` (NULL:
 * at the head). */
static void free_link(sl_pool *p, sl_pool_blk *b, sl_pool_blk *after)
{
    b->free = 1;
    b->fprev = after;
    b->fnext = after ? after->fnext : p->free_first;
    if (b->fnext)
        b->fnext->fprev = b;
    if (after)
        after->fnext = b;
    else
        p->free_first = b;
}

static void free_unlink(sl_pool *p, sl_pool_blk *b)
{
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        p->free_first = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
    b->free = 0;
}

/* Splits the first `head` bytes of b into a new block placed before it.
 * The new block takes b's place on the free chain when b is free. */
static sl_pool_blk *split_front(sl_pool *p, sl_pool_blk *b, uint64_t head)
{
    sl_pool_blk *h = blk_new(p);
    if (!h)
        return NULL;
    h->off = b->off;
    h->size = head;
    b->off += head;
    b->size -= head;
    h->prev = b->prev;
    h->next = b;
    if (b->prev)
        b->prev->next = h;
    else
        p->first = h;
    b->prev = h;
    return h;
}

/* split_front of b while b is off the free chain (it was after
 * prev_free): when out of memory, b goes back there and NULL is
 * returned, the pool as it was. */
static sl_pool_blk *carve_front(sl_pool *p, sl_pool_blk *b, uint64_t head, sl_pool_blk *prev_free)
{
    sl_pool_blk *h = split_front(p, b, head);
    if (!h)
        free_link(p, b, prev_free);
    return h;
}

void *sl_pool_alloc(sl_pool *p, uint64_t size, uint64_t align, sl_pool_blk **out)
{
    return sl_pool_alloc_below(p, size, align, UINT64_MAX, out);
}

void *sl_pool_alloc_below(sl_pool *p, uint64_t size, uint64_t align, uint64_t limit,
                          sl_pool_blk **out)
{
    *out = NULL;
    if (size == 0 || size > p->capacity)
        return NULL;
    if (align < SL_POOL_ALIGN)
        align = SL_POOL_ALIGN;
    size = round_up(size, SL_POOL_ALIGN);
    for (sl_pool_blk *b = p->free_first; b; b = b->fnext) {
        uint64_t start = round_up(b->off, align);
        uint64_t pad = start - b->off;
        if (pad > b->size || b->size - pad < size)
            continue;
        if (start + size > limit)
            break; /* the free chain is in address order: nothing lower fits */
        /* Carve [start, start + size) out of b: a free head of `pad`
         * bytes and a free tail stay on the free chain. */
        sl_pool_blk *prev_free = b->fprev;
        free_unlink(p, b);
        if (pad) {
            sl_pool_blk *h = carve_front(p, b, pad, prev_free);
            if (!h)
                return NULL;
            free_link(p, h, prev_free);
            prev_free = h;
        }
        if (b->size > size) {
            /* The used part becomes a new front block; b keeps the tail. */
            sl_pool_blk *u = carve_front(p, b, size, prev_free);
            if (!u)
                return NULL;
            free_link(p, b, prev_free);
            b = u;
        }
        b->free = 0;
        p->in_use += b->size;
        if (p->in_use > p->high_water)
            p->high_water = p->in_use;
        if (b->off + b->size > p->frontier)
            p->frontier = b->off + b->size;
        *out = b;
        return p->base + b->off;
    }
    return NULL;
}

void sl_pool_free(sl_pool *p, sl_pool_blk *b)
{
    if (!b)
        return;
    p->in_use -= b->size;
    /* The free block before b, by address: the nearest free one at or
     * before b->prev, found by walking the chain of all blocks back. Merge
     * neighbours first so that the walk is short in the common case. */
    sl_pool_blk *prev = b->prev, *next = b->next;
    if (next && next->free) {
        free_unlink(p, next);
        b->size += next->size;
        b->next = next->next;
        if (b->next)
            b->next->prev = b;
        blk_recycle(p, next);
    }
    if (prev && prev->free) {
        /* prev stays on the free chain where it is and absorbs b. */
        prev->size += b->size;
        prev->next = b->next;
        if (prev->next)
            prev->next->prev = prev;
        blk_recycle(p, b);
        return;
    }
    sl_pool_blk *after = NULL;
    for (sl_pool_blk *q = b->prev; q; q = q->prev)
        if (q->free) {
            after = q;
            break;
        }
    free_link(p, b, after);
}

void sl_pool_set_owner(sl_pool_blk *b, size_t owner)
{
    b->owner = owner;
}

uint64_t sl_pool_largest_room(const sl_pool *p, uint64_t align,
                              int (*evictable)(void *ctx, size_t owner), void *ctx)
{
    if (align < SL_POOL_ALIGN)
        align = SL_POOL_ALIGN;
    uint64_t best = 0, run_start = 0;
    int in_run = 0;
    for (const sl_pool_blk *b = p->first;; b = b->next) {
        int usable = b && (b->free || (evictable && evictable(ctx, b->owner)));
        if (usable && !in_run) {
            run_start = b->off;
            in_run = 1;
        } else if (!usable && in_run) {
            uint64_t end = b ? b->off : p->capacity, start = round_up(run_start, align);
            if (end > start && end - start > best)
                best = end - start;
            in_run = 0;
        }
        if (!b)
            break;
    }
    return best;
}

/* The bytes of [addr, addr + len) (page-aligned) resident in memory,
 * asked of the kernel (mincore) a bounded batch of pages at a time. */
static uint64_t resident_bytes(unsigned char *addr, uint64_t len, uint64_t page)
{
    unsigned char vec[4096];
    uint64_t resident = 0;
    for (uint64_t off = 0; off < len;) {
        uint64_t n = (len - off) / page < sizeof vec ? (len - off) / page : sizeof vec;
        if (mincore(addr + off, (size_t)(n * page), vec) != 0)
            return len - off + resident;    /* cannot tell: count it all */
        for (uint64_t k = 0; k < n; k++)
            resident += (vec[k] & 1) ? page : 0;
        off += n * page;
    }
    return resident;
}

uint64_t sl_pool_trim(sl_pool *p)
{
    long page_size = sysconf(_SC_PAGESIZE);
    uint64_t page = page_size > 0 ? (uint64_t)page_size : 4096, given = 0, frontier = 0;
    for (const sl_pool_blk *b = p->first; b; b = b->next) {
        if (!b->free) {
            frontier = b->off + b->size;
            continue;
        }
        /* Whole pages only: a page shared with a live buffer stays. Past
         * the frontier nothing was ever touched: nothing to give back. */
        uint64_t end = b->off + b->size < p->frontier ? b->off + b->size : p->frontier;
        uint64_t lo = round_up(b->off, page), hi = end / page * page;
        if (hi <= lo)
            continue;
        /* Count what is resident: a hole between live buffers that an
         * earlier trim emptied gives nothing back again. */
        uint64_t resident = resident_bytes(p->base + lo, hi - lo, page);
        if (madvise(p->base + lo, (size_t)(hi - lo), MADV_DONTNEED) == 0)
            given += resident;
    }
    /* Pages past the last live buffer are fresh again. */
    p->frontier = frontier;
    return given;
}
