/* counters.c: see metrics.h. The histograms' definitions (names and
 * bounds) and the observations the engine makes; the rendering of them is
 * the metrics layer's (src/metrics/metrics.c). */
#include "counters/metrics.h"

#include <stdlib.h>
#include <string.h>

#define US 1000ull
#define MS 1000000ull
#define S 1000000000ull

const sl_hist_def sl_hist_defs[SL_H_COUNT_] = {
    [SL_H_ACQUIRE_WAIT] = {"sluice_acquire_wait_seconds",
                           "Time an acquire waited for its tensor (a cache hit counts as 0).", 1, 19,
                           {50 * US, 100 * US, 250 * US, 500 * US, 1 * MS, 2500 * US, 5 * MS, 10 * MS,
                            25 * MS, 50 * MS, 100 * MS, 250 * MS, 500 * MS, 1 * S, 2500 * MS, 5 * S,
                            10 * S, 30 * S, 60 * S}},
    [SL_H_READ] = {"sluice_read_duration_seconds",
                   "Time one read took, from queued to completed.", 1, 19,
                   {10 * US, 25 * US, 50 * US, 100 * US, 250 * US, 500 * US, 1 * MS, 2500 * US,
                    5 * MS, 10 * MS, 25 * MS, 50 * MS, 100 * MS, 250 * MS, 500 * MS, 1 * S,
                    2500 * MS, 5 * S, 10 * S}},
    [SL_H_HASH] = {"sluice_tensor_hash_seconds",
                   "Hashing time of one tensor's SHA-256, summed over its slices.", 1, 21,
                   {10 * US, 25 * US, 50 * US, 100 * US, 250 * US, 500 * US, 1 * MS, 2500 * US,
                    5 * MS, 10 * MS, 25 * MS, 50 * MS, 100 * MS, 250 * MS, 500 * MS, 1 * S,
                    2500 * MS, 5 * S, 10 * S, 30 * S, 60 * S}},
    [SL_H_FIRST_TENSOR] = {"sluice_open_to_first_tensor_seconds",
                           "Time from the start of sluice_open to the first tensor handed out.", 1,
                           17,
                           {1 * MS, 2500 * US, 5 * MS, 10 * MS, 25 * MS, 50 * MS, 100 * MS,
                            250 * MS, 500 * MS, 1 * S, 2500 * MS, 5 * S, 10 * S, 30 * S, 60 * S,
                            120 * S, 300 * S}},
    [SL_H_STREAM] = {"sluice_stream_duration_seconds", "Duration of one sluice_stream call.", 1,
                     18,
                     {1 * MS, 5 * MS, 10 * MS, 50 * MS, 100 * MS, 250 * MS, 500 * MS, 1 * S,
                      2500 * MS, 5 * S, 10 * S, 30 * S, 60 * S, 120 * S, 300 * S, 600 * S,
                      1800 * S, 3600 * S}},
    [SL_H_TENSOR_SIZE] = {"sluice_tensor_size_bytes", "Size of each tensor load completed.", 0, 13,
                          {1ull << 10, 1ull << 12, 1ull << 14, 1ull << 16, 1ull << 18, 1ull << 20,
                           1ull << 22, 1ull << 24, 1ull << 26, 1ull << 28, 1ull << 30, 1ull << 32,
                           1ull << 34}},
};

uint64_t sl_metrics_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sl_metrics_init(sl_metrics *m)
{
    memset(m, 0, sizeof *m);
    const char *v = getenv("SLUICE_METRICS");
    m->on = !(v && strcmp(v, "0") == 0);
}

void sl_metrics_observe(sl_metrics *m, int h, uint64_t v)
{
    if (!m->on)
        return;
    const sl_hist_def *d = &sl_hist_defs[h];
    unsigned lo = 0, hi = d->nb; /* the first bound >= v, or nb (+Inf) */
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (d->bound[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&m->hist[h].bucket[lo], 1, memory_order_relaxed);
    if (v)
        atomic_fetch_add_explicit(&m->hist[h].sum, v, memory_order_relaxed);
}

void sl_metrics_first_tensor(sl_metrics *m)
{
    if (!m->on || atomic_load_explicit(&m->first_seen, memory_order_relaxed))
        return;
    if (atomic_exchange_explicit(&m->first_seen, 1, memory_order_relaxed) == 0)
        sl_metrics_since(m, SL_H_FIRST_TENSOR, m->open_ns);
}
