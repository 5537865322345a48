/* metrics.c: see counters/metrics.h. The rendering in the Prometheus text format 0.0.4 and OpenMetrics 1.0.
 *
 * A rendering first takes a snapshot of each model (the engine's counters
 * and gauges under its lock, as sluice_stats does; the atomics without
 * it), then writes text with no lock held. Within one family every
 * model's samples follow its one HELP and TYPE line, so that several
 * models make one valid exposition.
 */
#include "counters/metrics.h"

#include "engine/engine_int.h"
#include "index/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S 1000000000ull

static int verify_counted(void *user, const struct sluice_verify_item *it)
{
    sl_verify_tally *t = user;
    int result = it->status == SLUICE_OK            ? SL_VERIFY_OK
               : it->status == SLUICE_E_CHECKSUM ? SL_VERIFY_CHECKSUM
                                                 : SL_VERIFY_ERROR;
    int kind = it->kind == SLUICE_VERIFY_ITEM_FILE;
    sl_metrics_add(t->m, &t->m->verify_items[kind][result], 1);
    sl_metrics_add(t->m, &t->m->verify_bytes, it->bytes);
    return t->on_item ? t->on_item(t->user, it) : 0;
}

void sl_metrics_verify_begin(sl_metrics *m, sl_verify_tally *t, sluice_verify_options *o)
{
    sl_metrics_add(m, &m->verifies, 1);
    if (!m->on)
        return; /* the caller's callback untouched: no cost */
    *t = (sl_verify_tally){m, o->on_item, o->user};
    o->on_item = verify_counted;
    o->user = t;
}

sl_metrics *sl_engine_metrics(sl_engine *e)
{
    return &e->met;
}

int sl_metrics_label_check(const char *label, sl_err *err)
{
    size_t len = strlen(label), bad = 0;
    if (len == 0)
        return sl_fail(err, SLUICE_E_INVAL, "options: metrics_label is empty");
    if (len > SL_LABEL_MAX)
        return sl_fail(err, SLUICE_E_INVAL, "options: metrics_label is %zu bytes, over %d", len,
                       SL_LABEL_MAX);
    if (!sl_utf8_valid((const unsigned char *)label, len, &bad))
        return sl_fail(err, SLUICE_E_INVAL,
                       "options: metrics_label is not valid UTF-8 (byte %zu)", bad);
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- snapshot */

typedef sl_metrics_snap snap;

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

static void take_snap(sl_engine *e, snap *s)
{
    memset(s, 0, sizeof *s);
    sl_engine_stats(e, &s->st); /* the counters and pool gauges, under the lock */
    pthread_mutex_lock(&e->lock);
    s->live = e->live_handles;
    s->streams_running = e->nstreams;
    pthread_mutex_unlock(&e->lock);
    if (e->have_rcfg && e->rcfg.tally)
        for (int k = 0; k < SL_RRETRY_COUNT_; k++)
            s->remote_retries[k] = LOAD(e->rcfg.tally->retries[k]);
    const sl_metrics *m = &e->met;
    s->misses = LOAD(m->cache_misses);
    s->streams = LOAD(m->streams);
    for (int k = 0; k < SL_RETRY_COUNT_; k++)
        s->retries[k] = LOAD(m->retries[k]);
    for (int k = 0; k < SL_FALLBACK_COUNT_; k++)
        s->fallbacks[k] = LOAD(m->fallbacks[k]);
    s->verifies = LOAD(m->verifies);
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < SL_VERIFY_RESULT_COUNT_; r++)
            s->verify_items[k][r] = LOAD(m->verify_items[k][r]);
    s->verify_bytes = LOAD(m->verify_bytes);
    for (int h = 0; h < SL_H_COUNT_; h++) {
        for (unsigned b = 0; b <= SL_HIST_BUCKETS; b++)
            s->bucket[h][b] = LOAD(m->hist[h].bucket[b]);
        s->sum[h] = LOAD(m->hist[h].sum);
    }
}

/* What the rendering reads besides the counters: the stats fields that
 * are not uint64_t widened, and each family broken down by cause given
 * one cause as the rest of its sluice_stats total, so that the causes
 * always sum to what sluice_stats says (also with SLUICE_METRICS=0,
 * where only the total is counted), however the snapshot's two reads
 * (the stats under the lock, the cause atomics without) interleave. */
static void derive(snap *s)
{
    s->degraded = s->st.disk_degraded;
    s->backend_errno = s->st.backend_errno > 0 ? (uint64_t)s->st.backend_errno : 0;
    s->hash_peak = s->st.hash_parallel_peak;
    s->unverified = s->st.unverified;
    uint64_t *rest = &s->retries[SL_RETRY_SHORT], told = 0;
    for (int k = 0; k < SL_RETRY_COUNT_; k++)
        told += k == SL_RETRY_SHORT ? 0 : s->retries[k];
    *rest = s->st.retries > told ? s->st.retries - told : 0;
    rest = &s->fallbacks[SL_FALLBACK_READ];
    told = s->fallbacks[SL_FALLBACK_OPEN];
    *rest = s->st.direct_fallbacks > told ? s->st.direct_fallbacks - told : 0;
    rest = &s->remote_retries[SL_RRETRY_CONNECTION];
    told = 0;
    for (int k = 0; k < SL_RRETRY_COUNT_; k++)
        told += k == SL_RRETRY_CONNECTION ? 0 : s->remote_retries[k];
    *rest = s->st.remote_retries > told ? s->st.remote_retries - told : 0;
}

/* ---------------------------------------------------------------- text */

typedef struct out {
    char *buf;
    size_t cap, len;        /* len counts every byte, written or not */
} out;

static void put(out *o, const char *s, size_t n)
{
    if (o->len + n < o->cap)
        memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void puts_(out *o, const char *s)
{
    put(o, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void putf(out *o, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A label value: backslash, double quote and line feed escaped, as both
 * formats require. */
static void put_escaped(out *o, const char *s)
{
    for (const char *p = s; *p; p++) {
        const char *run = p;
        while (*p && *p != '\\' && *p != '"' && *p != '\n')
            p++;
        put(o, run, (size_t)(p - run));
        if (!*p)
            break;
        put(o, *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : "\\n", 2);
    }
}

/* A value in ns as decimal seconds, or bytes as an integer; with ".0" on
 * integers in OpenMetrics (its canonical form for le). */
static void put_num(out *o, uint64_t v, int seconds, int om)
{
    if (!seconds || v % S == 0) {
        putf(o, "%llu%s", (unsigned long long)(seconds ? v / S : v), om ? ".0" : "");
        return;
    }
    char frac[16];
    snprintf(frac, sizeof frac, "%09llu", (unsigned long long)(v % S));
    size_t n = strlen(frac);
    while (n > 1 && frac[n - 1] == '0')
        n--;
    frac[n] = '\0';
    putf(o, "%llu.%s", (unsigned long long)(v / S), frac);
}

typedef struct ctx {
    out *o;
    int om;
    size_t n;
    const char *const *labels;
    const snap *snaps;
} ctx;

static void family(ctx *c, const char *name, const char *type, const char *help)
{
    /* A counter family is named without _total in OpenMetrics. */
    size_t len = strlen(name);
    if (c->om && !strcmp(type, "counter") && len > 6 && !strcmp(name + len - 6, "_total"))
        len -= 6;
    puts_(c->o, "# HELP ");
    put(c->o, name, len);
    put(c->o, " ", 1);
    puts_(c->o, help);
    puts_(c->o, "\n# TYPE ");
    put(c->o, name, len);
    put(c->o, " ", 1);
    puts_(c->o, type);
    put(c->o, "\n", 1);
}

/* name{model="...",extra} (extra: label pairs already formatted, or NULL) */
static void series(ctx *c, size_t k, const char *name, const char *suffix, const char *extra)
{
    puts_(c->o, name);
    puts_(c->o, suffix);
    puts_(c->o, "{model=\"");
    put_escaped(c->o, c->labels[k]);
    put(c->o, "\"", 1);
    if (extra) {
        put(c->o, ",", 1);
        puts_(c->o, extra);
    }
    put(c->o, "} ", 2);
}

/* A scalar family: off is the offset of a uint64_t in snap (ns rendered
 * as seconds when seconds is set). */
static void scalar_in(ctx *c, const char *name, const char *type, const char *help, size_t off,
                      int seconds)
{
    family(c, name, type, help);
    for (size_t k = 0; k < c->n; k++) {
        series(c, k, name, "", NULL);
        uint64_t v;
        memcpy(&v, (const char *)&c->snaps[k] + off, sizeof v);
        put_num(c->o, v, seconds, 0);
        put(c->o, "\n", 1);
    }
}

static void scalar(ctx *c, const char *name, const char *type, const char *help, size_t off)
{
    scalar_in(c, name, type, help, off, 0);
}

/* A family with one extra label: values[j] at offsets offs[j]; label NULL:
 * each values[j] is already the label pairs. */
static void labelled(ctx *c, const char *name, const char *type, const char *help,
                     const char *label, const char *const *values, const size_t *offs, int nv)
{
    family(c, name, type, help);
    for (size_t k = 0; k < c->n; k++)
        for (int j = 0; j < nv; j++) {
            char extra[64];
            if (label)
                snprintf(extra, sizeof extra, "%s=\"%s\"", label, values[j]);
            else
                snprintf(extra, sizeof extra, "%s", values[j]);
            series(c, k, name, "", extra);
            uint64_t v;
            memcpy(&v, (const char *)&c->snaps[k] + offs[j], sizeof v);
            putf(c->o, "%llu\n", (unsigned long long)v);
        }
}

static void histogram(ctx *c, int h)
{
    const sl_hist_def *d = &sl_hist_defs[h];
    family(c, d->name, "histogram", d->help);
    for (size_t k = 0; k < c->n; k++) {
        const snap *s = &c->snaps[k];
        uint64_t cum = 0;
        for (unsigned b = 0; b <= d->nb; b++) {
            cum += s->bucket[h][b];
            char le[48];
            out lo = {le, sizeof le, 0};
            puts_(&lo, "le=\"");
            if (b < d->nb)
                put_num(&lo, d->bound[b], d->seconds, c->om);
            else
                puts_(&lo, "+Inf");
            puts_(&lo, "\"");
            le[lo.len < sizeof le ? lo.len : sizeof le - 1] = '\0';
            series(c, k, d->name, "_bucket", le);
            putf(c->o, "%llu\n", (unsigned long long)cum);
        }
        series(c, k, d->name, "_sum", NULL);
        put_num(c->o, s->sum[h], d->seconds, 0);
        put(c->o, "\n", 1);
        series(c, k, d->name, "_count", NULL);
        putf(c->o, "%llu\n", (unsigned long long)cum);
    }
}

#define OFF(f) offsetof(snap, f)

/* The proxy's (sluice.h "Proxies"). */
static void proxy_families(ctx *c)
{
    scalar(c, "sluice_proxy_failures_total", "counter",
           "Requests through the proxy that failed, and loads whose bytes from it failed "
           "verification: each went to the origin directly.", OFF(st.proxy_failures));
    scalar(c, "sluice_proxy_bypass_bytes_total", "counter",
           "Bytes fetched from the origin directly after the proxy failed.",
           OFF(st.proxy_bypass_bytes));
}

static void render(ctx *c)
{
    static const char *const retry_causes[] = {"short", "eintr", "eagain"};
    static const size_t retry_offs[] = {OFF(retries[0]), OFF(retries[1]), OFF(retries[2])};
    static const char *const fb_causes[] = {"open", "read"};
    static const size_t fb_offs[] = {OFF(fallbacks[0]), OFF(fallbacks[1])};
    static const char *const rr_kinds[] = {"tensor", "open"};
    static const size_t rr_req_offs[] = {OFF(st.remote_reads), OFF(st.remote_open_requests)};
    static const size_t rr_byte_offs[] = {OFF(st.remote_bytes), OFF(st.remote_open_bytes)};
    static const char *const rr_causes[] = {"status", "timeout", "connection", "short"};
    static const size_t rr_offs[] = {OFF(remote_retries[SL_RRETRY_STATUS]),
                                     OFF(remote_retries[SL_RRETRY_TIMEOUT]),
                                     OFF(remote_retries[SL_RRETRY_CONNECTION]),
                                     OFF(remote_retries[SL_RRETRY_SHORT])};
    static const char *const verify_pairs[] = {
        "kind=\"tensor\",result=\"ok\"", "kind=\"tensor\",result=\"checksum\"",
        "kind=\"tensor\",result=\"error\"", "kind=\"file\",result=\"ok\"",
        "kind=\"file\",result=\"checksum\"", "kind=\"file\",result=\"error\""};
    static const size_t verify_offs[] = {
        OFF(verify_items[0][SL_VERIFY_OK]), OFF(verify_items[0][SL_VERIFY_CHECKSUM]),
        OFF(verify_items[0][SL_VERIFY_ERROR]), OFF(verify_items[1][SL_VERIFY_OK]),
        OFF(verify_items[1][SL_VERIFY_CHECKSUM]), OFF(verify_items[1][SL_VERIFY_ERROR])};

    scalar(c, "sluice_bytes_read_total", "counter",
           "Bytes the reads brought in, coalescing waste included.", OFF(st.bytes_read));
    scalar(c, "sluice_bytes_delivered_total", "counter", "Tensor bytes handed to callers.",
           OFF(st.bytes_delivered));
    scalar(c, "sluice_bytes_hashed_total", "counter", "Bytes hashed with SHA-256.",
           OFF(st.bytes_hashed));
    scalar(c, "sluice_reads_total", "counter", "Read operations completed.", OFF(st.reads));
    labelled(c, "sluice_read_retries_total", "counter",
             "Reads resubmitted, by cause: a short read, EINTR or EAGAIN.", "cause",
             retry_causes, retry_offs, 3);
    scalar(c, "sluice_tensors_loaded_total", "counter", "Tensor loads completed.",
           OFF(st.tensors_loaded));
    scalar(c, "sluice_tensors_verified_total", "counter",
           "Tensor loads whose SHA-256 matched the manifest.", OFF(st.tensors_verified));
    scalar(c, "sluice_acquires_total", "counter", "Acquire calls.", OFF(st.acquire_count));
    scalar(c, "sluice_cache_hits_total", "counter",
           "Acquires served from the pool without I/O.", OFF(st.cache_hits));
    scalar(c, "sluice_cache_misses_total", "counter", "Acquires that waited for a load.",
           OFF(misses));
    scalar(c, "sluice_failures_total", "counter", "Tensors that failed (I/O, checksum, ...).",
           OFF(st.failures));
    scalar(c, "sluice_checksum_failures_total", "counter",
           "Tensor loads whose SHA-256 did not match the manifest.", OFF(st.checksum_failures));
    labelled(c, "sluice_direct_fallbacks_total", "counter",
             "Files read buffered though O_DIRECT was asked, by cause.", "cause", fb_causes,
             fb_offs, 2);
    scalar(c, "sluice_evictions_total", "counter", "Cached tensors evicted from the pool.",
           OFF(st.evictions));
    scalar(c, "sluice_streams_total", "counter", "sluice_stream calls finished.", OFF(streams));
    scalar(c, "sluice_disk_cache_hits_total", "counter",
           "Tensor loads read from the persistent cache's blobs.", OFF(st.disk_hits));
    scalar(c, "sluice_disk_cache_hit_bytes_total", "counter",
           "Bytes of the tensor loads read from the persistent cache's blobs.",
           OFF(st.disk_hit_bytes));
    scalar(c, "sluice_disk_cache_misses_total", "counter",
           "Remote tensor loads that found no blob.", OFF(st.disk_misses));
    scalar(c, "sluice_disk_cache_stored_total", "counter",
           "Blobs written after a verified fetch.", OFF(st.disk_stored));
    scalar(c, "sluice_disk_cache_rotten_total", "counter",
           "Blobs that failed verification: dropped and fetched again.", OFF(st.disk_rotten));
    scalar(c, "sluice_disk_cache_evicted_total", "counter",
           "Blobs this model's stores evicted for the budget.", OFF(st.disk_evicted));
    scalar(c, "sluice_disk_cache_busy_total", "counter",
           "Writes of the persistent cache's index put off: another process held its lock.",
           OFF(st.disk_busy));
    scalar(c, "sluice_memo_tensors_total", "counter",
           "Tensor loads the verified-once memo spared hashing.", OFF(st.memo_tensors));
    scalar(c, "sluice_memo_bytes_total", "counter",
           "Bytes of the tensor loads the verified-once memo spared hashing.",
           OFF(st.memo_bytes));
    scalar(c, "sluice_chunks_verified_total", "counter",
           "Chunk digests matched (version 2 manifests with chunks).", OFF(st.chunks_verified));
    scalar_in(c, "sluice_acquire_waited_seconds_total", "counter",
              "Time acquire calls waited for their tensors, in all.", OFF(st.acquire_wait_ns), 1);
    labelled(c, "sluice_remote_requests_total", "counter",
             "Remote requests completed, any outcome, by kind: tensor (range reads of tensor "
             "bytes) or open (headers, index.json and manifest, at open or a mirror's).",
             "kind", rr_kinds, rr_req_offs, 2);
    labelled(c, "sluice_remote_bytes_total", "counter",
             "Bytes the remote requests brought in, by kind (as sluice_remote_requests_total).",
             "kind", rr_kinds, rr_byte_offs, 2);
    labelled(c, "sluice_remote_retries_total", "counter",
             "Remote attempts retried, by cause: an HTTP status (429, 5xx), a timeout (stalled "
             "or too slow), a failed connection, a short body.",
             "cause", rr_causes, rr_offs, SL_RRETRY_COUNT_);
    scalar(c, "sluice_part_fallback_bytes_total", "counter",
           "Bytes of whole tensors read to check a tensor-parallel part that has no digest of "
           "its own.", OFF(st.part_fallback_bytes));
    scalar(c, "sluice_fallback_tensors_total", "counter",
           "Tensor loads delivered from a fallback mirror.", OFF(st.fallback_tensors));
    scalar(c, "sluice_fallback_bytes_total", "counter",
           "Bytes of the tensor loads delivered from a fallback mirror.",
           OFF(st.fallback_bytes));
    scalar(c, "sluice_fallback_failures_total", "counter",
           "Mirror attempts that failed too (the mirror could not be opened, lacks the "
           "tensor, or its bytes failed).", OFF(st.fallback_failures));
    proxy_families(c);
    scalar(c, "sluice_verify_runs_total", "counter",
           "sluice_verify calls (verifying without loading) that ran.", OFF(verifies));
    labelled(c, "sluice_verify_items_total", "counter",
             "Items sluice_verify reported, by kind and result: ok, checksum (digest or "
             "file size differ) or error (I/O, file changed, no digest, ...).",
             NULL, verify_pairs, verify_offs, 6);
    scalar(c, "sluice_verify_bytes_hashed_total", "counter",
           "Bytes sluice_verify hashed for the items it reported.", OFF(verify_bytes));
    scalar(c, "sluice_pool_budget_bytes", "gauge", "The pool's budget.", OFF(st.pool_bytes));
    scalar(c, "sluice_pool_in_use_bytes", "gauge", "Pool bytes held by buffers now.",
           OFF(st.pool_in_use));
    scalar(c, "sluice_pool_high_water_bytes", "gauge", "Most pool bytes ever held at once.",
           OFF(st.pool_high_water));
    scalar(c, "sluice_live_handles", "gauge", "Tensor handles live now.", OFF(live));
    scalar(c, "sluice_disk_cache_degraded", "gauge",
           "1 when the persistent cache was turned off for this model.", OFF(degraded));
    scalar(c, "sluice_streams_running", "gauge", "sluice_stream calls running now.",
           OFF(streams_running));
    scalar(c, "sluice_hash_parallel_peak", "gauge",
           "The most hashing threads that worked on one tensor's chunks at once.",
           OFF(hash_peak));
    scalar(c, "sluice_unverified", "gauge",
           "0 when a manifest checks the model's bytes; 1: no manifest was found; 2: "
           "verification is off.", OFF(unverified));
    scalar(c, "sluice_backend_errno", "gauge",
           "Why io_uring was not used: its errno (0 when used or forced off).",
           OFF(backend_errno));
    family(c, "sluice_backend_info", "gauge", "The I/O backend in use (value 1).");
    for (size_t k = 0; k < c->n; k++) {
        sluice_backend b = c->snaps[k].st.backend;
        series(c, k, "sluice_backend_info", "",
               b == SLUICE_BACKEND_IO_URING ? "backend=\"io_uring\""
               : b == SLUICE_BACKEND_PREAD  ? "backend=\"pread\""
                                            : "backend=\"none\"");
        puts_(c->o, "1\n");
    }
    for (int h = 0; h < SL_H_COUNT_; h++)
        histogram(c, h);
    if (c->om)
        puts_(c->o, "# EOF\n");
}

int sl_metrics_render(sl_engine *const *engines, const char *const *labels, size_t n,
                      char *buf, size_t cap, size_t *needed, int format, sl_err *err)
{
    snap *snaps = malloc(n * sizeof *snaps);
    if (!snaps)
        return sl_fail(err, SLUICE_E_NOMEM, "metrics: out of memory");
    for (size_t k = 0; k < n; k++)
        take_snap(engines[k], &snaps[k]);
    int rc = sl_metrics_render_snaps(snaps, labels, n, buf, cap, needed, format, err);
    free(snaps);
    return rc;
}

int sl_metrics_render_snaps(sl_metrics_snap *snaps, const char *const *labels, size_t n,
                            char *buf, size_t cap, size_t *needed, int format, sl_err *err)
{
    for (size_t k = 0; k < n; k++)
        derive(&snaps[k]);
    out o = {buf, cap, 0};
    ctx c = {&o, format == SLUICE_METRICS_OPENMETRICS, n, labels, snaps};
    render(&c);
    if (needed)
        *needed = o.len + 1;
    if (o.len + 1 > cap) {
        if (cap)
            buf[0] = '\0';
        return sl_fail(err, SLUICE_E_BUFFER,
                       "metrics: the text takes %zu bytes with its NUL, the buffer has %zu",
                       o.len + 1, cap);
    }
    buf[o.len] = '\0';
    return SLUICE_OK;
}
