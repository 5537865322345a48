/* range.c: verified reads of a byte range of one tensor into memory the
 * caller gives (sluice_read_into, and sluice_acquire_range through it).
 *
 * No pool: the range is read through its file's source (source.h:
 * pread, or range GETs of a remote file), or a reader (below), straight into the
 * caller's buffer, and hashed there. The digests a manifest gives cover
 * whole chunks (or the whole tensor), so the bytes of a covering chunk
 * that lie outside the range are read too, into a small bounce buffer,
 * and hashed in their place in the chunk's order; nothing outside the
 * range is written to the caller's memory. A chunk whose digest does not
 * match fails the call. The memory such a call needs is the bounce buffer
 * (RG_BOUNCE at most), whatever the size of the tensor.
 *
 * A caller may give a reader (range.h, sl_reader: the engine's, for
 * parts): then every read of the call goes through it, a local file's
 * and a remote one's, and a strided part's segments are one call, many
 * reads in flight at once (a remote file's in multi-range requests).
 */
#include "index/range.h"

#include "index/source.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The largest bounce buffer: the bytes of a chunk outside the range are
 * read and hashed this many at a time. */
#define RG_BOUNCE ((size_t)4 << 20)

typedef struct rg_ctx {
    const sl_index *ix;
    size_t i;
    const struct sluice_tensor_info *t;
    const sl_file *f;
    const sl_reader *rd;         /* NULL: the source's table */
    unsigned char *bounce;
    size_t bounce_cap;
    sl_md *md;
    sl_range_tally *tally;
    sl_err *err;
} rg_ctx;

static int rg_fail_read(rg_ctx *c, uint64_t at, int e)
{
    char q[SL_QUOTE_MAX];
    sl_quote(q, sizeof q, c->t->name, c->t->name_len);
    if (e == 0)
        return sl_fail(c->err, SLUICE_E_FILE_CHANGED,
                       "tensor %s (file %s): the file ends before byte %llu of the tensor: it "
                       "shrank after open", q, c->t->file, (unsigned long long)at);
    return sl_fail_errno(c->err, SLUICE_E_IO, e, "tensor %s (file %s): read at tensor byte %llu failed",
                         q, c->t->file, (unsigned long long)at);
}

/* The bounce buffer, allocated on first need. */
static unsigned char *rg_bounce(rg_ctx *c)
{
    if (!c->bounce) {
        c->bounce_cap = RG_BOUNCE;
        if (!(c->bounce = malloc(c->bounce_cap)))
            sl_fail(c->err, SLUICE_E_NOMEM, "read_into: out of memory");
    }
    return c->bounce;
}

/* Where the next *want bytes go: dst, or (dst NULL) the bounce buffer,
 * *want cut to its size. NULL: out of memory (c->err says so). */
static unsigned char *rg_into(rg_ctx *c, unsigned char *dst, uint64_t *want)
{
    if (dst)
        return dst;
    unsigned char *into = rg_bounce(c);
    if (into && *want > c->bounce_cap)
        *want = c->bounce_cap;
    return into;
}

/* Feeds n bytes at p to c->md (when set). */
static int rg_feed(rg_ctx *c, const unsigned char *p, uint64_t n)
{
    for (uint64_t at = 0; c->md && at < n;) {
        size_t k = n - at > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)(n - at);
        if (sl_md_update(c->md, p + at, k) < 0)
            return sl_fail(c->err, SLUICE_E_NOMEM, "read_into: digest update failed (OpenSSL)");
        c->tally->bytes_hashed += k;
        at += k;
    }
    return SLUICE_OK;
}

/* Whether c's reads go through its reader: one was given. */
static int rg_by_reader(const rg_ctx *c)
{
    return c->rd != NULL;
}

/* n spans through the reader; its failure names the tensor. */
static int rg_reader_read(rg_ctx *c, const sl_span *sp, size_t n)
{
    int proxied = 0;
    int rc = c->rd->read(c->rd->ctx, c->rd->cancel, c->f, c->ix->remote, sp, n, &proxied,
                         c->err);
    if (proxied)
        c->tally->through_proxy = 1;
    if (rc < 0 && rc != SLUICE_E_NOMEM) {
        char q[SL_QUOTE_MAX], msg[sizeof c->err->msg];
        snprintf(msg, sizeof msg, "%s", c->err->msg);
        sl_fail(c->err, rc, "tensor %s: %s", sl_quote(q, sizeof q, c->t->name, c->t->name_len),
                msg);
    }
    return rc;
}

/* Reads tensor bytes [lo, hi) into dst (NULL: through the bounce buffer,
 * discarded) and feeds them to md (NULL: no hashing). */
static int rg_read(rg_ctx *c, uint64_t lo, uint64_t hi, unsigned char *dst)
{
    while (lo < hi && rg_by_reader(c)) {
        uint64_t want = hi - lo;
        unsigned char *into = rg_into(c, dst, &want);
        if (!into)
            return SLUICE_E_NOMEM;
        sl_span sp = {c->t->offset + lo, want, into};
        SL_TRY(rg_reader_read(c, &sp, 1));
        SL_TRY(rg_feed(c, into, want));
        lo += want;
        if (dst)
            dst += want;
    }
    while (lo < hi) {
        uint64_t want = hi - lo > ((uint64_t)1 << 30) ? (uint64_t)1 << 30 : hi - lo;
        unsigned char *into = rg_into(c, dst, &want);
        if (!into)
            return SLUICE_E_NOMEM;
        size_t got;
        unsigned requests;
        const sl_file *f = c->f;
        int rc = f->src->read_tensor(f, c->ix->remote, into, (size_t)want, c->t->offset + lo,
                                     &got, &requests, c->err);
        c->tally->remote_reads += requests; /* a failed one too */
        if (rc == SL_SRC_ERRNO)
            return rg_fail_read(c, lo, errno);
        if (rc < 0)
            return rc;
        if (got == 0)
            return rg_fail_read(c, lo, 0);
        if (requests)
            c->tally->remote_bytes += got;
        c->tally->bytes_read += got;
        SL_TRY(rg_feed(c, into, got));
        lo += (uint64_t)got;
        if (dst)
            dst += got;
    }
    return SLUICE_OK;
}

/* The digest c->md took must be want, else a checksum failure naming
 * what was hashed. */
static int rg_check(rg_ctx *c, const uint8_t want[32], const char *what)
{
    uint8_t got[32];
    if (sl_md_final(c->md, got) < 0)
        return sl_fail(c->err, SLUICE_E_NOMEM, "read_into: digest final failed (OpenSSL)");
    if (memcmp(got, want, 32) == 0)
        return SLUICE_OK;
    char q[SL_QUOTE_MAX], hw[65], hg[65];
    c->tally->checksum_failures++;
    return sl_fail(c->err, SLUICE_E_CHECKSUM,
                   "tensor %s (file %s, offset %llu, %llu bytes): %s mismatch in %s: expected "
                   "%s, actual %s", sl_quote(q, sizeof q, c->t->name, c->t->name_len),
                   c->t->file, (unsigned long long)c->t->offset, (unsigned long long)c->t->nbytes,
                   sl_md_title(sl_md_algorithm(c->md)), what, sl_hex_digest(hw, want),
                   sl_hex_digest(hg, got));
}

/* One digest unit [ulo, uhi) of the tensor (a chunk, or the whole): the
 * part inside [begin, end) lands in dst at its place, the rest passes
 * through the bounce buffer; then the digest must be want. */
static int rg_unit(rg_ctx *c, uint64_t ulo, uint64_t uhi, uint64_t begin, uint64_t end,
                   unsigned char *dst, const uint8_t want[32], const char *what)
{
    uint64_t in_lo = ulo > begin ? ulo : begin, in_hi = uhi < end ? uhi : end;
    if (sl_md_reset(c->md) < 0)
        return sl_fail(c->err, SLUICE_E_NOMEM, "read_into: digest init failed (OpenSSL)");
    SL_TRY(rg_read(c, ulo, in_lo, NULL));
    SL_TRY(rg_read(c, in_lo, in_hi, dst + (in_lo - begin)));
    SL_TRY(rg_read(c, in_hi, uhi, NULL));
    char unit[160];
    snprintf(unit, sizeof unit, "%s (tensor bytes %llu..%llu)", what, (unsigned long long)ulo,
             (unsigned long long)uhi);
    return rg_check(c, want, unit);
}

static int range_read(const sl_index *ix, size_t i, uint64_t begin, uint64_t len, void *dst,
                      const uint8_t *want, const sl_chunk_digests *chunks, sluice_algorithm alg,
                      const sl_reader *rd, sl_range_tally *tally, sl_err *err)
{
    const struct sluice_tensor_info *t = &ix->tensors[i];
    rg_ctx c = {.ix = ix, .i = i, .t = t, .f = &ix->files[t->file_index], .rd = rd,
                .tally = tally, .err = err};
    uint64_t end = begin + len;
    int rc = SLUICE_OK;
    if (!want) { /* not checked: the bytes only */
        rc = rg_read(&c, begin, end, dst);
    } else if (!(c.md = sl_md_new(alg))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "read_into: out of memory");
    } else if (chunks && chunks->count) {
        uint64_t k0 = begin / chunks->bytes;
        uint64_t k1 = len ? (end - 1) / chunks->bytes : k0; /* len 0: nothing to read */
        for (uint64_t k = k0; len && k <= k1 && rc == SLUICE_OK; k++) {
            char what[64];
            uint64_t lo = k * chunks->bytes;
            uint64_t hi = lo + chunks->bytes < t->nbytes ? lo + chunks->bytes : t->nbytes;
            snprintf(what, sizeof what, "chunk %llu of %u", (unsigned long long)k, chunks->count);
            rc = rg_unit(&c, lo, hi, begin, end, dst, chunks->digest[k], what);
            if (rc == SLUICE_OK)
                tally->chunks_verified++;
        }
    } else {
        /* One digest for the whole tensor: all of it is read and hashed,
         * however small the range. */
        rc = rg_unit(&c, 0, t->nbytes, begin, end, dst, want, "the whole tensor");
    }
    sl_md_free(c.md);
    free(c.bounce);
    return rc;
}

int sl_range_read(const sl_index *ix, size_t i, uint64_t begin, uint64_t len, void *dst,
                  const uint8_t *want, const sl_chunk_digests *chunks, sluice_algorithm alg,
                  sl_range_tally *tally, sl_err *err)
{
    return range_read(ix, i, begin, len, dst, want, chunks, alg, NULL, tally, err);
}

/* The digest of g's segments of tensor i, one after the other, as the
 * file holds them now; `what` names the call in the messages. */
static int rg_digest(const sl_index *ix, size_t i, const sl_part_geom *g, sluice_algorithm alg,
                     uint8_t out[32], sl_range_tally *tally, sl_err *err, const char *what)
{
    const struct sluice_tensor_info *t = &ix->tensors[i];
    rg_ctx c = {.ix = ix, .i = i, .t = t, .f = &ix->files[t->file_index],
                .tally = tally, .err = err};
    int rc = SLUICE_OK;
    if (!(c.md = sl_md_new(alg)))
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", what);
    for (uint64_t s = 0; rc == SLUICE_OK && s < g->count; s++) {
        uint64_t lo = g->first + s * g->stride;
        rc = rg_read(&c, lo, lo + g->seg, NULL);
    }
    if (rc == SLUICE_OK && sl_md_final(c.md, out) < 0)
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: digest final failed (OpenSSL)", what);
    sl_md_free(c.md);
    free(c.bounce);
    return rc;
}

int sl_range_digest(const sl_index *ix, size_t i, uint64_t begin, uint64_t end,
                    sluice_algorithm alg, uint8_t out[32], sl_range_tally *tally, sl_err *err)
{
    /* one segment, [begin, end) (none when end is not past begin) */
    sl_part_geom g = {.count = 1, .first = begin, .seg = end > begin ? end - begin : 0};
    return rg_digest(ix, i, &g, alg, out, tally, err, "digest_range");
}

/* ------------------------------------------------------------------ parts */

/* Reads the part's segments into dst, one after the other (dst is the
 * part laid out contiguously), and feeds them to c->md when set. A
 * strided part's segments go in one call to the reader (many reads in
 * flight; a local file's close segments one read, a remote file's in
 * multi-range requests); else each segment is one read of the source,
 * and segments that touch (n = 1, or a single segment) are one read. */
static int rg_gather(rg_ctx *c, const sl_part_geom *g, unsigned char *dst)
{
    if (rg_by_reader(c) && g->count > 1 && g->stride != g->seg) {
        sl_span *sp = malloc((size_t)g->count * sizeof *sp);
        if (!sp)
            return sl_fail(c->err, SLUICE_E_NOMEM, "read_part: out of memory");
        for (uint64_t s = 0; s < g->count; s++)
            sp[s] = (sl_span){c->t->offset + g->first + s * g->stride, g->seg, dst + s * g->seg};
        int rc = rg_reader_read(c, sp, (size_t)g->count);
        free(sp);
        if (rc < 0)
            return rc;
        return rg_feed(c, dst, g->count * g->seg);
    }
    uint64_t s = 0;
    while (s < g->count) {
        uint64_t run = 1; /* segments that touch in the file go as one read */
        while (s + run < g->count && g->stride == g->seg)
            run++;
        uint64_t lo = g->first + s * g->stride;
        SL_TRY(rg_read(c, lo, lo + run * g->seg, dst + s * g->seg));
        s += run;
    }
    return SLUICE_OK;
}

/* Hashes the whole tensor in file order and lands the part's segments in
 * dst on the way: the check of a part that has no digest of its own.
 * Segments of a bounce buffer or more are read straight into dst (the
 * bytes between them through the bounce buffer); smaller ones are not
 * read one by one (two reads of the source per row: thousands of range
 * requests for one remote tensor), but the tensor a bounce buffer at a
 * time, hashed there, and the part's bytes copied out of it. */
static int rg_whole_for_part(rg_ctx *c, const sl_part_geom *g, unsigned char *dst)
{
    uint64_t pos = 0, nbytes = c->t->nbytes;
    if (g->seg >= RG_BOUNCE) {
        for (uint64_t s = 0; s < g->count; s++) {
            uint64_t lo = g->first + s * g->stride;
            SL_TRY(rg_read(c, pos, lo, NULL));
            SL_TRY(rg_read(c, lo, lo + g->seg, dst + s * g->seg));
            pos = lo + g->seg;
        }
        return rg_read(c, pos, nbytes, NULL);
    }
    if (!rg_bounce(c))
        return SLUICE_E_NOMEM;
    uint64_t s = 0; /* the first segment not wholly copied yet */
    while (pos < nbytes) {
        uint64_t end = nbytes - pos > c->bounce_cap ? pos + c->bounce_cap : nbytes;
        SL_TRY(rg_read(c, pos, end, c->bounce));
        for (; s < g->count; s++) {
            uint64_t lo = g->first + s * g->stride, hi = lo + g->seg;
            if (lo >= end)
                break;
            uint64_t a = lo > pos ? lo : pos, b = hi < end ? hi : end;
            if (a < b)
                memcpy(dst + s * g->seg + (a - lo), c->bounce + (a - pos), (size_t)(b - a));
            if (hi > end)
                break; /* its rest is in the next block */
        }
        pos = end;
    }
    return SLUICE_OK;
}

int sl_part_read(const sl_index *ix, size_t i, const sl_part_geom *g, void *dst,
                 const uint8_t *want_part, const uint8_t *want, const sl_chunk_digests *chunks,
                 sluice_algorithm alg, const sl_reader *rd, sl_range_tally *tally, sl_err *err)
{
    const struct sluice_tensor_info *t = &ix->tensors[i];
    rg_ctx c = {.ix = ix, .i = i, .t = t, .f = &ix->files[t->file_index], .rd = rd,
                .tally = tally, .err = err};
    uint64_t bytes = g->count * g->seg;
    int contiguous = g->count <= 1 || g->stride == g->seg;
    int rc;
    if (!want_part && !want) /* not checked: the segments only */
        return rg_gather(&c, g, dst);
    if (!want_part && contiguous) {
        /* one range (dim 0): read_into's path, chunk digests included;
         * without them the whole tensor is read, which is the fallback */
        if (want && !(chunks && chunks->count))
            tally->part_fallback_bytes += t->nbytes;
        return range_read(ix, i, g->first, bytes, dst, want, chunks, alg, rd, tally, err);
    }
    if (!(c.md = sl_md_new(alg)))
        return sl_fail(err, SLUICE_E_NOMEM, "read_part: out of memory");
    if (want_part) {
        char what[96];
        snprintf(what, sizeof what, "part %llu of %llu along dim %u", (unsigned long long)g->rank,
                 (unsigned long long)g->n, g->dim);
        rc = rg_gather(&c, g, dst);
        if (rc == SLUICE_OK)
            rc = rg_check(&c, want_part, what);
    } else {
        tally->part_fallback_bytes += t->nbytes;
        rc = rg_whole_for_part(&c, g, dst);
        if (rc == SLUICE_OK)
            rc = rg_check(&c, want, "the whole tensor (read to check a part: no part digests)");
    }
    sl_md_free(c.md);
    free(c.bounce);
    return rc;
}

int sl_part_digest(const sl_index *ix, size_t i, const sl_part_geom *g, sluice_algorithm alg,
                   uint8_t out[32], sl_range_tally *tally, sl_err *err)
{
    return rg_digest(ix, i, g, alg, out, tally, err, "digest_part");
}

int sl_part_geometry(const struct sluice_tensor_info *t, uint32_t dim, uint64_t rank, uint64_t n,
                     sl_part_geom *g, sl_err *err)
{
    char q[SL_QUOTE_MAX];
    sl_quote(q, sizeof q, t->name, t->name_len);
    if (dim >= t->ndim)
        return sl_fail(err, SLUICE_E_INVAL, "tensor %s has %u dims: no dim %u to split", q,
                       t->ndim, dim);
    if (n == 0 || rank >= n)
        return sl_fail(err, SLUICE_E_INVAL, "tensor %s: rank %llu of %llu parts does not exist",
                       q, (unsigned long long)rank, (unsigned long long)n);
    if (t->shape[dim] % n)
        return sl_fail(err, SLUICE_E_INVAL, "tensor %s: dim %u of size %llu does not split into "
                       "%llu equal parts (%llu %% %llu = %llu)", q, dim,
                       (unsigned long long)t->shape[dim], (unsigned long long)n,
                       (unsigned long long)t->shape[dim], (unsigned long long)n,
                       (unsigned long long)(t->shape[dim] % n));
    uint64_t outer = 1;
    for (uint32_t k = 0; k < dim; k++)
        outer *= t->shape[k];
    *g = (sl_part_geom){.dim = dim, .rank = rank, .n = n};
    if (outer == 0 || t->nbytes == 0)
        return SLUICE_OK; /* an empty tensor: an empty part */
    /* nbytes = outer x shape[dim] x inner x elem; a row of dim d and
     * below is nbytes / outer, of which each part takes 1/n */
    if (t->nbytes % outer || t->nbytes / outer % n) /* packed sub-byte elements */
        return sl_fail(err, SLUICE_E_INVAL, "tensor %s: its parts along dim %u of %llu are not "
                       "whole bytes (%llu bytes in %llu rows)", q, dim, (unsigned long long)n,
                       (unsigned long long)t->nbytes, (unsigned long long)outer);
    g->stride = t->nbytes / outer;
    g->seg = g->stride / n;
    g->count = g->seg ? outer : 0;
    g->first = rank * g->seg;
    return SLUICE_OK;
}
