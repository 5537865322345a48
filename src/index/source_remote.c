/* source_remote.c: the source of an http(s):// or s3:// object, and of
 * an hf:// one (sl_source_hub, below) (source.h): its size from a first
 * range reply at open, and its validators (remote.h, sl_validators: the
 * strong ETag of each hop, the proxy's and the origin's, each from the
 * first reply over that hop), blocking range requests (remote.c) for the
 * header and sluice_read_into, the remote seam (sl_rio) for the engine's
 * reads (loads, and parts' spans in multi-range requests); every request checked against the size seen at open and asked
 * If-Match with its own hop's validator. */
#include "index/source.h"

#include "index/index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most one range request of sluice_read_into asks for: the deadline
 * and attempts bound each request, as they bound each read of a load. */
#define RS_PIECE ((size_t)16 << 20)

/* Opens f; validators: whether its requests are asked If-Match (not a
 * Hub file's, see hub_open). */
static int open_object(sl_file *f, const sl_remote_cfg *rc, int missing_code, int validators,
                       sl_err *err)
{
    /* The size comes with the first range reply; an object of fewer
     * than 8 bytes is then as short as a local one. */
    sl_err e2;
    if (!(f->url = sl_remote_url(rc, f->loc->given, err)))
        return err->code;
    if (!(f->target = malloc(sizeof *f->target)))
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    sl_remote_target_init(f->target, rc, f->loc, f->url);
    if (validators && !(f->validators = calloc(1, sizeof *f->validators)))
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    /* messages quote path: it keeps no credential of the location */
    if (strcmp(f->loc->shown, f->path) != 0) {
        char *shown = strdup(f->loc->shown);
        if (!shown)
            return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        free(f->path);
        f->path = shown;
    }
    unsigned char probe[8];
    uint64_t size = 0;
    int rc2 = sl_remote_read(rc, f->target, 0, 8, probe, &size, f->validators, missing_code,
                             &e2);
    if (rc2 < 0 && strstr(e2.msg, "HTTP 416"))
        size = 0;   /* an empty object: no byte can be asked for */
    else if (rc2 < 0)
        return sl_fail(err, rc2, "%s", e2.msg);
    f->size = size;
    return SLUICE_OK;
}

static int remote_open(sl_file *f, const sl_remote_cfg *rc, int missing_code, sl_err *err)
{
    return open_object(f, rc, missing_code, 1, err);
}

static int remote_read(sl_file *f, const sl_remote_cfg *rc, unsigned char *buf, size_t len,
                       uint64_t offset, sl_err *err)
{
    uint64_t size = f->size;
    return sl_remote_read(rc, f->target, offset, len, buf, &size, f->validators,
                          SLUICE_E_NO_FILES, err);
}

static int remote_read_tensor(const sl_file *f, const sl_remote_cfg *rc, unsigned char *buf,
                              size_t want, uint64_t offset, size_t *got, unsigned *requests,
                              sl_err *err)
{
    /* f is shared with the engine's reads: its validators are set once
     * each, without a lock (remote.h) */
    uint64_t size = f->size;
    if (want > RS_PIECE)
        want = RS_PIECE;
    *requests = 1;
    *got = 0;
    int rc2 = sl_remote_read_tensor(rc, f->target, offset, want, buf, &size, f->validators,
                                    SLUICE_E_REMOTE, err);
    if (rc2 < 0)
        return rc2;
    *got = want;
    return SLUICE_OK;
}

static size_t remote_batch_spans(const sl_file *f, const sl_span *spans, size_t n)
{
    return sl_remote_spans_batch(spans, n,
                                 atomic_load_explicit((_Atomic int *)&f->single_ranges, memory_order_relaxed));
}

static void remote_submit(const sl_file *f, sl_io *io, sl_rio *rio, sl_io_req *req)
{
    (void)io;
    /* f is shared: its flag is set once, without a lock (index.h) */
    req->single = (_Atomic int *)&f->single_ranges;
    sl_rio_submit(rio, req, f->target, f->size, f->validators);
}

static void remote_close(sl_file *f)
{
    free(f->target);
    f->target = NULL;
    free(f->url);
    f->url = NULL;
    free(f->validators);
    f->validators = NULL;
}

static int remote_read_small(const sl_remote_cfg *rc, const char *loc, size_t max, char **out,
                             size_t *len, sl_err *err)
{
    return sl_remote_get(rc, loc, max, out, len, SLUICE_E_NO_FILES, err);
}

/* What the Hub's table shares with the remote one. */
#define REMOTE_COMMON_METHODS                                                                      \
    .read_tensor = remote_read_tensor, .batch_spans = remote_batch_spans,                          \
    .submit = remote_submit, .close = remote_close, .read_small = remote_read_small,

/* A Hub file (hf://, read at the commit hf.c pinned): the remote source
 * without If-Match. Its bytes at resolve/COMMIT/FILE cannot change (a
 * commit is immutable, and the storage the Hub redirects to is addressed
 * by the file's SHA-256), while an If-Match would reach the Hub first:
 * its resolve answers with a 302 whose own ETag is not the storage's, and
 * a Hub that honoured If-Match there would refuse every read with 412.
 * It has no validators: no ETag is taken. */
static int hub_open(sl_file *f, const sl_remote_cfg *rc, int missing_code, sl_err *err)
{
    return open_object(f, rc, missing_code, 0, err);
}

static int hub_read(sl_file *f, const sl_remote_cfg *rc, unsigned char *buf, size_t len,
                    uint64_t offset, sl_err *err)
{
    uint64_t size = f->size;
    return sl_remote_read(rc, f->target, offset, len, buf, &size, NULL, SLUICE_E_NO_FILES,
                          err);
}

const sl_source_methods sl_source_hub = {
    .kind = "hub",
    .caps = SL_SRC_WORTH_CACHING | SL_SRC_NETWORK,
    .open = hub_open,
    .read = hub_read,
    REMOTE_COMMON_METHODS
};

const sl_source_methods sl_source_remote = {
    .kind = "remote",
    .caps = SL_SRC_WORTH_CACHING | SL_SRC_NETWORK,
    .open = remote_open,
    .read = remote_read,
    REMOTE_COMMON_METHODS
};

/* Whether the requests for file f go through a proxy under c (a remote
 * file, a proxy configured and no_proxy not naming its host: decided once
 * when it was opened, f->target). 0 for a local file or c NULL. */
static int proxied(const sl_remote_cfg *c, const struct sl_file *f)
{
    return c && f->target && f->target->proxied;
}

int sl_source_direct_again(const sl_remote_cfg *c, const struct sl_file *f, int code,
                           int through_proxy, int direct)
{
    return code == SLUICE_E_CHECKSUM && through_proxy && !direct && proxied(c, f);
}

int sl_source_read_direct(const sl_remote_cfg *c, const struct sl_file *f, int code,
                          int through_proxy, sl_direct_read_fn read, void *ctx, sl_err *err)
{
    if (!sl_source_direct_again(c, f, code, through_proxy, 0))
        return SL_SRC_NOT_PROXIED;
    sl_remote_cfg direct = *c;  /* the direct hop: the tally and secrets shared, not owned */
    direct.proxy_http = direct.proxy_https = NULL;
    uint64_t bytes = 0;
    int rc = read(&direct, ctx, &bytes, err);
    atomic_fetch_add_explicit(&c->tally->proxy_failures, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->tally->proxy_bypass_bytes, bytes, memory_order_relaxed);
    return rc;
}
