/* metrics.h: the metrics of one engine (counters.c; rendered by
 * src/metrics/metrics.c): counters and histograms the engine's parts bump
 * as they go, and the Prometheus / OpenMetrics text rendering of one or
 * several models.
 *
 * Cost: every counter and histogram here is a relaxed atomic, bumped
 * where the event happens (with or without the engine's lock held), so
 * no lock is taken for them; an observation is one bucket search over at
 * most SL_HIST_BUCKETS bounds and two atomic adds. The counters that
 * sluice_stats already had stay in the engine's struct sluice_stats
 * (under e->lock, as before) and are copied once per rendering, with the
 * gauges, under that lock, as sluice_stats does.
 *
 * The switch: SLUICE_METRICS=0 in the environment when the engine is
 * created turns every observation of this file into a no-op (no clock
 * read either), so that the bench can measure what the metrics cost in
 * one process. Metrics are on otherwise.
 */
#ifndef SLUICE_METRICS_H
#define SLUICE_METRICS_H

#include "base/error.h"
#include "sources/remote.h"
#include "sluice.h"

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* The histograms, each with fixed bounds (metrics.c, documented in
 * sluice.h). */
enum {
    SL_H_ACQUIRE_WAIT = 0, /* ns: every acquire served, a cache hit as 0 */
    SL_H_READ,             /* ns: one read, queued to completed */
    SL_H_HASH,             /* ns: hasher time on one tensor's SHA-256 */
    SL_H_FIRST_TENSOR,     /* ns: sluice_open's start to the first handle */
    SL_H_STREAM,           /* ns: one sluice_stream call */
    SL_H_TENSOR_SIZE,      /* bytes: each tensor load completed */
    SL_H_COUNT_
};
#define SL_HIST_BUCKETS 24  /* bounds at most, +Inf excluded */

typedef struct sl_hist {
    _Atomic uint64_t bucket[SL_HIST_BUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
    _Atomic uint64_t sum;                         /* ns or bytes */
} sl_hist;

enum { SL_RETRY_SHORT = 0, SL_RETRY_EINTR, SL_RETRY_EAGAIN, SL_RETRY_COUNT_ };
enum { SL_FALLBACK_OPEN = 0, SL_FALLBACK_READ, SL_FALLBACK_COUNT_ };
/* sluice_verify's items by result: matched (or hashed, digests only), the
 * digest or a file's size differ (SLUICE_E_CHECKSUM), any other failure. */
enum { SL_VERIFY_OK = 0, SL_VERIFY_CHECKSUM, SL_VERIFY_ERROR, SL_VERIFY_RESULT_COUNT_ };

typedef struct sl_metrics {
    int on;                            /* immutable after init */
    uint64_t open_ns;                  /* when sluice_open began (set once, before use) */
    _Atomic int first_seen;            /* the first handle was observed */
    _Atomic uint64_t cache_misses;     /* acquires that had to wait for a load */
    _Atomic uint64_t retries[SL_RETRY_COUNT_];
    _Atomic uint64_t fallbacks[SL_FALLBACK_COUNT_];
    _Atomic uint64_t streams;          /* sluice_stream calls finished */
    /* sluice_verify (no engine load): its calls, and its items as they
     * are reported, by kind (SLUICE_VERIFY_ITEM_*) and SL_VERIFY_* */
    _Atomic uint64_t verifies;
    _Atomic uint64_t verify_items[2][SL_VERIFY_RESULT_COUNT_];
    _Atomic uint64_t verify_bytes;     /* the reported items' bytes hashed */
    sl_hist hist[SL_H_COUNT_];
} sl_metrics;

/* A histogram's definition: its family name (without _bucket/_sum/_count)
 * and help for the rendering, its unit, and its bounds (counters.c). */
typedef struct sl_hist_def {
    const char *name;
    const char *help;
    int seconds;            /* values in ns, rendered in seconds; else bytes */
    unsigned nb;
    uint64_t bound[SL_HIST_BUCKETS];
} sl_hist_def;

extern const sl_hist_def sl_hist_defs[SL_H_COUNT_];

/* CLOCK_MONOTONIC in ns. */
uint64_t sl_metrics_clock(void);

/* Zeroes m; on unless SLUICE_METRICS=0 in the environment. */
void sl_metrics_init(sl_metrics *m);

/* Records one value (ns or bytes) in histogram h. */
void sl_metrics_observe(sl_metrics *m, int h, uint64_t v);

static inline void sl_metrics_add(const sl_metrics *m, _Atomic uint64_t *c, uint64_t n)
{
    if (m->on && n)
        atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* The monotonic clock in ns when metrics are on, else 0 (no clock read). */
static inline uint64_t sl_metrics_now(const sl_metrics *m)
{
    if (!m->on)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Records now - t0 in h (t0 from sl_metrics_now). */
static inline void sl_metrics_since(sl_metrics *m, int h, uint64_t t0)
{
    if (m->on) {
        uint64_t t1 = sl_metrics_now(m);
        sl_metrics_observe(m, h, t1 > t0 ? t1 - t0 : 0);
    }
}

/* The first handle of the model went out: records open-to-first once. */
void sl_metrics_first_tensor(sl_metrics *m);

/* sluice_verify's metrics, counted while it runs so that a scrape during
 * a long verify sees it go: the caller's callback and user, kept while
 * o's point at sl_metrics_verify_begin's counting callback. */
typedef struct sl_verify_tally {
    sl_metrics *m;
    sluice_verify_fn on_item;
    void *user;
} sl_verify_tally;

/* Counts one sluice_verify call in m and, metrics on, makes o (the
 * verify's own copy of the options) count each item in m before calling
 * the caller's callback; t must outlive the verify. */
void sl_metrics_verify_begin(sl_metrics *m, sl_verify_tally *t, sluice_verify_options *o);

/* Renders the models (n >= 1, each usable, labels distinct) into buf as
 * sluice_metrics_write_models says. Called by api.c with every engine
 * entered. */
typedef struct sl_engine sl_engine;
int sl_metrics_render(sl_engine *const *engines, const char *const *labels, size_t n,
                      char *buf, size_t cap, size_t *needed, int format, sl_err *err);

/* One model's numbers as a rendering reads them: its struct sluice_stats
 * and what the metrics count beside it (the per-cause splits, the
 * verify counts, the histograms), copied once per rendering. The
 * fields after "derived" are computed by the rendering from the others
 * (see derive() in metrics.c). */
typedef struct sl_metrics_snap {
    struct sluice_stats st;
    uint64_t live, streams_running;
    uint64_t misses, streams, retries[SL_RETRY_COUNT_], fallbacks[SL_FALLBACK_COUNT_];
    uint64_t remote_retries[SL_RRETRY_COUNT_];
    uint64_t verifies, verify_items[2][SL_VERIFY_RESULT_COUNT_], verify_bytes;
    uint64_t bucket[SL_H_COUNT_][SL_HIST_BUCKETS + 1];
    uint64_t sum[SL_H_COUNT_];
    /* derived */
    uint64_t degraded, backend_errno, hash_peak, unverified;
} sl_metrics_snap;

/* The rendering of n snapshots (what sl_metrics_render does once it has
 * taken them; the tests give their own). Writes the derived fields. */
int sl_metrics_render_snaps(sl_metrics_snap *snaps, const char *const *labels, size_t n,
                            char *buf, size_t cap, size_t *needed, int format, sl_err *err);

/* The engine's metrics (engine.c owns them). */
sl_metrics *sl_engine_metrics(sl_engine *e);

/* Checks a model label: valid UTF-8, 1..SL_LABEL_MAX bytes, no NUL. */
#define SL_LABEL_MAX 1024
int sl_metrics_label_check(const char *label, sl_err *err);

#endif
