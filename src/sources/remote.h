/* remote.h: remote sources (remote.c): http(s):// and s3:// locations read
 * with HTTP range requests through libcurl.
 *
 * Two ways in:
 *  - blocking fetches, for open (headers, index.json, the manifest): one
 *    easy handle per call, retried by the same rules as the reads;
 *  - sl_rio, the remote seam of an engine: requests shaped like the I/O
 *    seam's (io.h: an sl_io_req with its iov, or with a part's spans,
 *    made as multi-range requests), served by one thread that
 *    owns a curl multi handle, many requests in flight over kept-alive
 *    connections, completion through the same callback as the ring's.
 *
 * Every reply to a range request is checked: 206, a Content-Range that
 * starts where asked and names the object size seen at open. A 200 (the
 * server ignores Range) or another size fails the request with
 * SLUICE_E_FILE_CHANGED, before any byte of it lands; a short body is
 * resumed from where it stopped. Transient failures (connect, reset,
 * a stalled or too slow transfer, 429, 500, 502, 503, 504, a short body)
 * are retried with exponential backoff and full jitter, or after
 * Retry-After, within remote_attempts and remote_deadline_ms; the others
 * fail at once (SLUICE_E_REMOTE, the message giving the status).
 *
 * Clocks: an attempt is bounded by the connect timeout and by its
 * progress only (no byte for remote_stall_timeout_ms, or fewer than
 * SL_REMOTE_MIN_SPEED bytes a second over that window, from the body's
 * first byte on), never by a total
 * time, so a slow link that keeps moving always completes. The deadline
 * bounds a read's retries: it runs from the moment the read first goes
 * on the wire (a connection takes it; the seam's queue does not count),
 * and no retry is scheduled, nor a backoff waited, past it (a retry due
 * before it goes to the front of the seam's queue, and may still wait
 * there for a free connection: it is not dropped then).
 *
 * Nothing here is called, and no curl function runs, for a model that has
 * no remote location. Built without libcurl (SLUICE_HAVE_CURL unset),
 * every entry returns SLUICE_E_UNSUPPORTED.
 */
#ifndef SLUICE_REMOTE_H
#define SLUICE_REMOTE_H

#include "base/error.h"
#include "base/location.h"
#include "sources/io.h"
#include "sluice.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Why a remote attempt was retried (sluice_remote_retries_total{cause}):
 * an HTTP status (429, 5xx), a stalled or too slow transfer or a curl
 * timeout, a connection that failed (refused, reset, TLS, ...), a body
 * shorter than asked. */
enum { SL_RRETRY_STATUS = 0, SL_RRETRY_TIMEOUT, SL_RRETRY_CONNECTION, SL_RRETRY_SHORT,
       SL_RRETRY_COUNT_ };

/* The counts of one model's remote requests: the blocking fetches made
 * to open a file (headers, index.json, the manifest; a mirror's open)
 * count their requests and bytes here (remote_open_*); every retry,
 * tensor reads' included, counts here by cause. Tensor reads (the seam's,
 * sl_remote_read_tensor's) are counted by their callers (remote_reads).
 * Plain atomics, not metrics: they feed sluice_stats whatever
 * SLUICE_METRICS says. */
typedef struct sl_remote_tally {
    _Atomic uint64_t requests, bytes;
    _Atomic uint64_t retries[SL_RRETRY_COUNT_];
    /* requests through the proxy that failed and went direct, of every
     * kind; the bytes fetched directly instead (sluice.h "Proxies") */
    _Atomic uint64_t proxy_failures, proxy_bypass_bytes;
} sl_remote_tally;

/* The blocking fetches' idle transfer handles (remote.c), kept so that
 * the next fetch of the model reuses their connections (and TLS
 * sessions) instead of opening new ones: a verify or sluice_read_into
 * of a remote model makes a request per piece. */
typedef struct sl_easy_pool sl_easy_pool;

/* How long a proxy that could not be reached (connection refused or
 * reset, a timeout, a stall) is skipped before it is tried again. */
#define SL_PROXY_DOWN_MS 30000u

/* A proxy of the model: the hop through it (sluice.h "Proxies"), with
 * its own health. One per proxy the configuration names: one when
 * opts.http_proxy gives it (or the environment names the same one for
 * http:// and https://), else http_proxy's and https_proxy's, each its
 * own. Every request of the model and of its mirrors that goes through
 * it shares it (a proxy that is down is down for each of them, and a
 * blackholed one costs one connect timeout, not one per file); a request
 * through the other proxy, or direct, never reads it. */
typedef struct sl_proxy_hop {
    char *url;          /* the proxy as given: may hold user:password@ */
    /* until when (mono ms) it is taken for down: a request failed to
     * reach it or it stopped answering (SL_PROXY_DOWN_MS); requests
     * meanwhile go direct without trying it */
    _Atomic uint64_t down_until;
} sl_proxy_hop;

/* What every remote request of one model is made with (owned by the
 * model; immutable once built). Secrets live here only: no message, log
 * or stat ever holds them. */
typedef struct sl_remote_cfg {
    unsigned connections, attempts;
    uint64_t connect_timeout_ms, stall_timeout_ms, deadline_ms, backoff_ms;
    char *token;                 /* Bearer for http(s)://, or NULL */
    char *s3_endpoint;           /* scheme://host[:port], no trailing slash */
    char *s3_region;
    int s3_virtual;              /* virtual-host-style addressing */
    char *aws_key, *aws_secret, *aws_session; /* NULL: anonymous */
    char *ca_file;               /* NULL: libcurl's default CA store */
    char *hf_endpoint;           /* the Hub (remote_hf.c): $HF_ENDPOINT or https://huggingface.co,
                                    its scheme lowercased (http:// when it has none),
                                    no trailing '/' */
    sl_location *hf_endpoint_loc; /* hf_endpoint, parsed once (sl_hf_on_hub reads it) */
    char *hf_token;              /* the Hub's Bearer: http_token, else $HF_TOKEN; or NULL */
    /* the proxy hop of http:// and of https:// (and s3://) requests
     * (sluice.h "Proxies"), resolved once at open: NULL when none; the
     * same hop for both when one proxy serves both. Owned; shared by
     * copies of the struct, as the tally */
    sl_proxy_hop *proxy_http, *proxy_https;
    char *no_proxy;              /* the hosts reached directly, or NULL */
    unsigned proxy_kind;         /* SLUICE_PROXY_* */
    _Atomic int *abort_flag;    /* non-NULL and set: blocking fetches stop */
    sl_remote_tally *tally;     /* owned; shared by copies of the struct (the engine's) */
    sl_easy_pool *easy;         /* owned, as the tally; NULL: each fetch its own handle */
} sl_remote_cfg;

/* Whether c is the direct hop: no proxy in it (what
 * sl_source_read_direct reads with; a model without a proxy too): the
 * seam's requests of a read under it go with no_proxy (io.h). */
static inline int sl_remote_direct_hop(const sl_remote_cfg *c)
{
    return !c->proxy_http && !c->proxy_https;
}

/* The proxy a request for url (http(s)://) goes through, or NULL when
 * none applies (none configured, or no_proxy names its host). */
const char *sl_remote_proxy_for(const sl_remote_cfg *c, const char *url);

/* Whether path names a remote location (http://, https://, s3://, hf://). */
int sl_is_remote(const char *path);

/* Builds the configuration from the options and the environment
 * (SLUICE_HTTP_TOKEN, AWS_*). *out is malloc'd; free with
 * sl_remote_cfg_free. */
int sl_remote_cfg_new(const sluice_options *o, sl_remote_cfg **out, sl_err *err);
void sl_remote_cfg_free(sl_remote_cfg *c);

/* Replaces every loc in msg (a message that may quote it, or a URL made
 * from it) by the form messages show (base/location.h); nothing for a
 * local path. */
void sl_remote_scrub(char *msg, size_t cap, const char *loc);

/* The http(s) URL that location (http(s):// or s3://) is fetched from,
 * malloc'd (NULL when out of memory or not a valid location: err says). */
char *sl_remote_url(const sl_remote_cfg *c, const char *location, sl_err *err);

/* The slowest transfer kept, in bytes a second: an attempt that brings
 * fewer over a window of remote_stall_timeout_ms (or fewer than what is
 * left of its range) is stopped as too slow, and retried. */
#define SL_REMOTE_MIN_SPEED 1024u

/* The longest strong ETag kept (a longer one is not used). */
#define SL_ETAG_MAX 160

/* The validators of one remote object, one per hop (sluice.h "Proxies"):
 * what the origin says (SL_HOP_DIRECT) and what the proxy says
 * (SL_HOP_PROXY), which may differ (a proxy that rewrites ETags, or
 * flips bytes and rewrites the ETag). Each is taken from the first reply
 * that carried one over its hop (the open's probe, or any later request,
 * a read again directly included) and asked with If-Match on that hop's
 * requests only: the origin never gets the proxy's, so a proxy cannot
 * make a correct origin answer 412. Only a strong ETag of RFC 9110's
 * syntax is taken ('"', then bytes 0x21, 0x23-0x7E or 0x80-0xFF, then
 * '"'): one with a control character (a bare CR would end the If-Match
 * line and start a header of the server's choosing) or any other byte
 * is ignored, as if the reply had none, and that hop's requests carry no
 * If-Match until a reply gives a well-formed one. Each is set once and
 * read by any thread without a lock (state: 0 unknown, 1 being set, 2
 * set). Owned by the remote source (source_remote.c); none for a Hub
 * file, which is asked no If-Match. */
enum { SL_HOP_DIRECT = 0, SL_HOP_PROXY = 1 };
typedef struct sl_validators {
    _Atomic int state[2];
    char etag[2][SL_ETAG_MAX];
} sl_validators;

/* One remote object as its requests need it, made once when its file is
 * opened (source_remote.c) from its location parsed at open: no request
 * parses a location again. The strings are the caller's (the file's).
 * Which hop a request takes: through c's proxy when proxied and c has
 * one for its scheme (a configuration whose proxies are NULL is the
 * direct hop: sl_source_read_direct), else to the origin directly. */
typedef struct sl_remote_target {
    const char *loc;    /* as given: credentials and query included */
    const char *shown;  /* as messages show it */
    const char *url;    /* the http(s) URL its requests go to */
    int https;          /* url is https:// (which of the proxies applies) */
    int proxied;        /* no_proxy does not name url's host */
    int hub;            /* on the Hub: its requests carry the Hub's token */
    int s3;             /* an s3:// object: signed with SigV4 when c has keys */
} sl_remote_target;

/* Fills *t for loc (parsed; its shown form is the one messages use) read
 * at url (sl_remote_url of loc->given). */
void sl_remote_target_init(sl_remote_target *t, const sl_remote_cfg *c, const sl_location *loc,
                           const char *url);

/* Range GET of len bytes at offset of t into buf. *size gets the
 * object's size (from Content-Range). v (NULL: no validator, no If-Match):
 * the request asks If-Match with the validator of the hop it goes over,
 * when that hop has one, and a hop that has none takes the reply's.
 * Codes: SLUICE_E_NO_FILES (missing_code) for 404, SLUICE_E_REMOTE,
 * SLUICE_E_FILE_CHANGED (ignored Range, a size other than *size when *size
 * is not 0 on entry, 412 to If-Match), SLUICE_E_UNSUPPORTED. */
int sl_remote_read(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                   uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                   int missing_code, sl_err *err);

/* sl_remote_read for the bytes of a tensor (sluice_read_into): its
 * request and bytes are the caller's to count, its retries the tally's. */
int sl_remote_read_tensor(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                          uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                          int missing_code, sl_err *err);

/* A piece of an object wanted in the caller's memory: len bytes at
 * offset into dst. */
typedef struct sl_span {
    uint64_t offset, len;
    unsigned char *dst;
} sl_span;

/* How the spans of a part are asked for (sluice.h, "Parts of a remote
 * file"): spans less than SL_SPAN_GAP_MULTI apart are one range (the gap
 * fetched and dropped: less than a part's own header lines in a
 * multipart reply); up to SL_SPAN_BATCH ranges, a Range value of at most
 * SL_SPAN_HEADER_MAX bytes and SL_SPAN_RANGE_MAX bytes of data go in one
 * multi-range request. Where the server does not answer multipart, spans
 * less than SL_SPAN_GAP_SINGLE apart are one single-range request, of at
 * most SL_SPAN_RANGE_MAX bytes. */
#define SL_SPAN_GAP_MULTI ((uint64_t)256)
#define SL_SPAN_GAP_SINGLE ((uint64_t)64 << 10)
#define SL_SPAN_BATCH 512
#define SL_SPAN_HEADER_MAX 6144
#define SL_SPAN_RANGE_MAX ((uint64_t)16 << 20)

/* How many of spans (ascending, none overlapping, none empty; n >= 1)
 * the first request of a spans request of the seam takes (sl_io_req
 * spans): one multi-range request by the rules above, or with single set
 * (the object's server refuses multi-range requests) one coalesced
 * range. At least 1. The engine cuts a part's spans into such requests,
 * each one read of its queue depth; the seam makes each (sl_rio_submit):
 * a multi-range request (Range: bytes=a-b,c-d,...) answered 206
 * multipart/byteranges and parsed strictly (each part's Content-Range
 * must be the range asked, in order, of the object's size at open; else
 * SLUICE_E_REMOTE, or SLUICE_E_FILE_CHANGED for another size), retried as
 * any request of the seam; a server that answers one with 200, 416 or a
 * single range gets that request's spans as single coalesced ranges, one
 * after another on the same read, and the object's single flag is set:
 * its later requests go single at once. */
size_t sl_remote_spans_batch(const sl_span *spans, size_t n, int single);

/* GET of a whole object of at most max bytes into a malloc'd, NUL-ended
 * buffer. 404 gives missing_code (0: returns 0 with *out NULL: absent).
 * For what open reads once (an index.json, a manifest, the Hub's API): a
 * location made then, parsed for this request. */
int sl_remote_get(const sl_remote_cfg *c, const char *location, size_t max, char **out,
                  size_t *len, int missing_code, sl_err *err);
/* The same, never through the proxy: for what bytes are checked against
 * (a manifest, the Hub's API), which no proxy is trusted with (sluice.h
 * "Proxies"). */
int sl_remote_get_anchor(const sl_remote_cfg *c, const char *location, size_t max, char **out,
                         size_t *len, int missing_code, sl_err *err);

/* ---------------------------------------------------------------- Hub locations */

/* hf://ORG/NAME[@REVISION][/FILE] in parts (pointers into the location;
 * rev NULL: none given, file NULL: none). */
typedef struct sl_hf_loc {
    const char *repo, *rev, *file;
    size_t repo_len, rev_len, file_len;
} sl_hf_loc;

/* Splits loc; -1 when it is not a well-formed Hub location. */
int sl_hf_parse(const char *loc, sl_hf_loc *out);

/* ENDPOINT/ORG/NAME/resolve/REVISION[/FILE] of an hf:// location,
 * malloc'd (NULL and err set when loc is malformed or out of memory). */
char *sl_hf_url(const sl_remote_cfg *c, const char *loc, sl_err *err);

/* Whether requests for loc (parsed at open) go to the Hub: an hf://
 * location, or an http(s) URL of the Hub's endpoint (c->hf_endpoint, parsed
 * once: the same scheme, host and port, the same user information as the
 * endpoint's or none when it has none, a path at or under the endpoint's).
 * They carry the Hub's token (c->hf_token), else
 * c->token. Read from the parsed parts: no string is split for it. */
int sl_hf_on_hub(const sl_remote_cfg *c, const sl_location *loc);

/* Fill and clear the Hub's part of c (sl_remote_cfg_new, _free): -1 when
 * out of memory. */
int sl_hf_cfg_fill(sl_remote_cfg *c, const sluice_options *o);
void sl_hf_cfg_clear(sl_remote_cfg *c);

/* opts.http_token belongs to the model's own location (primary, parsed
 * at open): the Hub's when it is on the Hub (sl_hf_on_hub), never then
 * sent to another host; else the caller's servers', never sent to the Hub.
 * Call after sl_remote_cfg_new. Then each token is checked: one with a
 * control character (CR, LF: it would end its header line) is
 * SLUICE_E_INVAL. *hub gets whether the model or a mirror is on the Hub
 * (for sl_remote_dragonfly_hop, which the caller calls next: remote_hf.c
 * calls nothing of remote.c, remote.c calls it); when one is, the
 * endpoint's port is checked (sl_location_check: SLUICE_E_INVAL). */
int sl_hf_cfg_tokens(sl_remote_cfg *c, const sluice_options *o, const sl_location *primary,
                     sl_location *const *mirrors, size_t nmirrors, int *hub, sl_err *err);

/* Dragonfly mode with credentials refuses a daemon off this host's
 * loopback (sluice.h "Proxies"); hub: whether a location of the model or
 * its mirrors is on the Hub (only then does the Hub's token travel).
 * SLUICE_E_INVAL naming the daemon's host, else SLUICE_OK. */
int sl_remote_dragonfly_hop(const sl_remote_cfg *c, int hub, sl_err *err);

/* ---------------------------------------------------------------- the seam */

typedef struct sl_rio sl_rio;

/* Starts the seam (its thread). done(ctx, list) is called on that thread
 * with no lock of the seam held, as io.h's. */
int sl_rio_create(const sl_remote_cfg *c, sl_io_done_fn done, void *ctx, sl_rio **out,
                  sl_err *err);

/* Queues req for t (object_size: the size seen at open, which every
 * reply must name; v: the object's validators, asked with If-Match per hop
 * as sl_remote_read does, or NULL). Results as io.h's, plus req->status
 * and req->detail when the request failed for a reason of its own. A
 * spans request (req->spans: sl_remote_spans_batch's, one multi-range
 * request or one coalesced range) is made as that function says, each
 * of its requests retried, proxied and validated as any; req->requests
 * and req->done_bytes say what it asked. req->cancel: a call's token,
 * seen by the transfer on the wire (sl_rio_flush wakes the thread to
 * see it at once) and before any request or retry goes out. */
void sl_rio_submit(sl_rio *r, sl_io_req *req, const sl_remote_target *t, uint64_t object_size,
                   sl_validators *v);
void sl_rio_flush(sl_rio *r);

/* Fails every request queued, waiting or in flight with ECANCELED at once
 * (their completions run on the seam's thread); later ones too. */
void sl_rio_abort(sl_rio *r);

/* Stops the thread and frees the seam: every request must have completed. */
void sl_rio_destroy(sl_rio *r);

#endif
