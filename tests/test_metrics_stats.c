/* test_metrics_stats.c: every field of struct sluice_stats is in the
 * metrics exposition, so that none is forgotten again. A table names each
 * field with its offsetof and size and the family that renders it; the
 * table must tile the whole struct (each field where the one before it
 * ends, padded to its own size, and sizeof the struct at the end), so a
 * field added to the struct without a family fails here. Each field is
 * given a distinct value in a snapshot rendered in both formats
 * (sl_metrics_render_snaps: the rendering the library runs after taking
 * its snapshot), and the value is looked for in its family's sample (or,
 * for a family split by cause, in the sum of its samples). The text also
 * goes through `promtool check metrics` where promtool is installed. */
#include "counters/metrics.h"
#include "util.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { K_NONE, K_VALUE, K_SECONDS, K_SUM, K_BACKEND };

typedef struct field {
    const char *name;
    size_t off, size;
    const char *family; /* the sample's name (with _total for counters) */
    int kind;
    const char *labels; /* K_VALUE: the sample's labels after model's, or NULL */
} field;

#define F(f, fam, kind) \
    {#f, offsetof(struct sluice_stats, f), sizeof(((struct sluice_stats *)0)->f), fam, kind, NULL}
#define FL(f, fam, labels) \
    {#f, offsetof(struct sluice_stats, f), sizeof(((struct sluice_stats *)0)->f), fam, K_VALUE, \
     labels}

static const field fields[] = {
    F(size, NULL, K_NONE), /* the caller's size, not a number of the model */
    F(backend, "sluice_backend_info", K_BACKEND),
    F(backend_errno, "sluice_backend_errno", K_VALUE),
    F(bytes_read, "sluice_bytes_read_total", K_VALUE),
    F(bytes_delivered, "sluice_bytes_delivered_total", K_VALUE),
    F(bytes_hashed, "sluice_bytes_hashed_total", K_VALUE),
    F(reads, "sluice_reads_total", K_VALUE),
    F(retries, "sluice_read_retries_total", K_SUM),
    F(tensors_loaded, "sluice_tensors_loaded_total", K_VALUE),
    F(tensors_verified, "sluice_tensors_verified_total", K_VALUE),
    F(cache_hits, "sluice_cache_hits_total", K_VALUE),
    F(failures, "sluice_failures_total", K_VALUE),
    F(checksum_failures, "sluice_checksum_failures_total", K_VALUE),
    F(direct_fallbacks, "sluice_direct_fallbacks_total", K_SUM),
    F(pool_bytes, "sluice_pool_budget_bytes", K_VALUE),
    F(pool_in_use, "sluice_pool_in_use_bytes", K_VALUE),
    F(pool_high_water, "sluice_pool_high_water_bytes", K_VALUE),
    F(evictions, "sluice_evictions_total", K_VALUE),
    F(acquire_wait_ns, "sluice_acquire_waited_seconds_total", K_SECONDS),
    F(acquire_count, "sluice_acquires_total", K_VALUE),
    F(chunks_verified, "sluice_chunks_verified_total", K_VALUE),
    F(hash_parallel_peak, "sluice_hash_parallel_peak", K_VALUE),
    FL(remote_reads, "sluice_remote_requests_total", "kind=\"tensor\""),
    FL(remote_bytes, "sluice_remote_bytes_total", "kind=\"tensor\""),
    F(remote_retries, "sluice_remote_retries_total", K_SUM),
    F(fallback_tensors, "sluice_fallback_tensors_total", K_VALUE),
    F(fallback_bytes, "sluice_fallback_bytes_total", K_VALUE),
    F(fallback_failures, "sluice_fallback_failures_total", K_VALUE),
    F(disk_hits, "sluice_disk_cache_hits_total", K_VALUE),
    F(disk_hit_bytes, "sluice_disk_cache_hit_bytes_total", K_VALUE),
    F(disk_misses, "sluice_disk_cache_misses_total", K_VALUE),
    F(disk_stored, "sluice_disk_cache_stored_total", K_VALUE),
    F(disk_rotten, "sluice_disk_cache_rotten_total", K_VALUE),
    F(disk_evicted, "sluice_disk_cache_evicted_total", K_VALUE),
    F(memo_tensors, "sluice_memo_tensors_total", K_VALUE),
    F(memo_bytes, "sluice_memo_bytes_total", K_VALUE),
    F(disk_degraded, "sluice_disk_cache_degraded", K_VALUE),
    FL(remote_open_requests, "sluice_remote_requests_total", "kind=\"open\""),
    FL(remote_open_bytes, "sluice_remote_bytes_total", "kind=\"open\""),
    F(disk_busy, "sluice_disk_cache_busy_total", K_VALUE),
    F(unverified, "sluice_unverified", K_VALUE),
    F(proxy_failures, "sluice_proxy_failures_total", K_VALUE),
    F(proxy_bypass_bytes, "sluice_proxy_bypass_bytes_total", K_VALUE),
    F(part_fallback_bytes, "sluice_part_fallback_bytes_total", K_VALUE),
};
#define NFIELDS (sizeof fields / sizeof *fields)

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* The table tiles the struct: no field of it is missing from the table. */
static void test_table_covers_the_struct(void **state)
{
    size_t end = 0;
    for (size_t j = 0; j < NFIELDS; j++) {
        const field *f = &fields[j];
        if (f->off != align_up(end, f->size))
            fail_msg("struct sluice_stats: %s at offset %zu, but the table's fields before it "
                     "end at %zu: a field between them has no entry here (and no family?)",
                     f->name, f->off, end);
        end = f->off + f->size;
    }
    if (align_up(end, _Alignof(struct sluice_stats)) != sizeof(struct sluice_stats))
        fail_msg("struct sluice_stats is %zu bytes, the table's fields end at %zu: a field "
                 "after %s has no entry here (and no family?)",
                 sizeof(struct sluice_stats), end, fields[NFIELDS - 1].name);
    (void)state;
}

/* The value every field gets: distinct, and not a prefix of another. */
static uint64_t value_of(size_t j, size_t size)
{
    if (size == 8)
        return 1000000007ull * (j + 1) + 4242;
    return 70000u + (unsigned)j * 11u;
}

static void fill(sl_metrics_snap *s)
{
    memset(s, 0, sizeof *s);
    for (size_t j = 0; j < NFIELDS; j++) {
        const field *f = &fields[j];
        unsigned char *at = (unsigned char *)&s->st + f->off;
        if (f->kind == K_NONE)
            continue;
        if (f->kind == K_BACKEND) {
            sluice_backend b = SLUICE_BACKEND_PREAD;
            memcpy(at, &b, sizeof b);
            continue;
        }
        uint64_t v = value_of(j, f->size);
        if (f->size == 8) {
            memcpy(at, &v, 8);
        } else {
            uint32_t w = (uint32_t)v;
            memcpy(at, &w, 4);
        }
    }
    s->st.size = sizeof s->st;
}

/* Sum of the samples of family name for model m, how many lines. */
static uint64_t samples(const char *text, const char *name, size_t *lines)
{
    char head[256];
    snprintf(head, sizeof head, "%s{model=\"m\"", name);
    uint64_t sum = 0;
    *lines = 0;
    for (const char *p = text; (p = strstr(p, head)); p++) {
        if (p != text && p[-1] != '\n')
            continue;
        const char *sp = strchr(p, ' ');
        if (!sp)
            break;
        sum += strtoull(sp + 1, NULL, 10);
        (*lines)++;
    }
    return sum;
}

static char *render(sl_metrics_snap *s, int format)
{
    static const char *const labels[] = {"m"};
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    sl_err err = {0};
    assert_int_equal(sl_metrics_render_snaps(s, labels, 1, buf, cap, NULL, format, &err),
                     SLUICE_OK);
    return buf;
}

static void check_text(const char *text, int om)
{
    for (size_t j = 0; j < NFIELDS; j++) {
        const field *f = &fields[j];
        uint64_t v = value_of(j, f->size);
        char want[256];
        switch (f->kind) {
        case K_NONE:
            continue;
        case K_BACKEND:
            snprintf(want, sizeof want, "\n%s{model=\"m\",backend=\"pread\"} 1\n", f->family);
            break;
        case K_SECONDS:
            snprintf(want, sizeof want, "\n%s{model=\"m\"} %llu.%09llu\n", f->family,
                     (unsigned long long)(v / 1000000000u),
                     (unsigned long long)(v % 1000000000u));
            break;
        case K_SUM: {
            size_t lines;
            uint64_t got = samples(text, f->family, &lines);
            if (got != v || lines < 2)
                fail_msg("%s: %s sums to %llu over %zu samples, want %llu over its causes",
                         om ? "OpenMetrics" : "text 0.0.4", f->family,
                         (unsigned long long)got, lines, (unsigned long long)v);
            continue;
        }
        default:
            snprintf(want, sizeof want, "\n%s{model=\"m\"%s%s} %llu\n", f->family,
                     f->labels ? "," : "", f->labels ? f->labels : "", (unsigned long long)v);
        }
        if (!strstr(text, want))
            fail_msg("%s: struct sluice_stats' %s (set to %llu) is not in the exposition as "
                     "\"%s\"", om ? "OpenMetrics" : "text 0.0.4", f->name,
                     (unsigned long long)v, want + 1);
    }
}

static void test_every_field_rendered(void **state)
{
    sl_metrics_snap s;
    for (int om = 0; om < 2; om++) {
        fill(&s);
        char *text = render(&s, om ? SLUICE_METRICS_OPENMETRICS : SLUICE_METRICS_PROMETHEUS);
        check_text(text, om);
        free(text);
    }
    (void)state;
}

/* A family split by cause sums to its sluice_stats total whatever the
 * causes counted (fewer, with SLUICE_METRICS=0; more, in a race). */
static void test_causes_sum_to_the_total(void **state)
{
    sl_metrics_snap s;
    fill(&s);
    s.st.remote_retries = 10;
    s.remote_retries[SL_RRETRY_STATUS] = 4;
    s.remote_retries[SL_RRETRY_TIMEOUT] = 3;
    s.st.retries = 5;
    s.retries[SL_RETRY_EINTR] = 7;  /* more than the total: the rest is 0, not negative */
    char *text = render(&s, SLUICE_METRICS_PROMETHEUS);
    assert_non_null(strstr(text, "\nsluice_remote_retries_total{model=\"m\",cause=\"status\"} 4\n"));
    assert_non_null(strstr(text, "\nsluice_remote_retries_total{model=\"m\",cause=\"timeout\"} 3\n"));
    assert_non_null(strstr(text, "\nsluice_remote_retries_total{model=\"m\",cause=\"connection\"} 3\n"));
    assert_non_null(strstr(text, "\nsluice_remote_retries_total{model=\"m\",cause=\"short\"} 0\n"));
    assert_non_null(strstr(text, "\nsluice_read_retries_total{model=\"m\",cause=\"short\"} 0\n"));
    free(text);
    (void)state;
}

/* promtool accepts the exposition with every field set. */
static void test_promtool_accepts(void **state)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: promtool not installed (apt-get install -y prometheus)\n");
        skip();
    }
    sl_metrics_snap s;
    fill(&s);
    char *text = render(&s, SLUICE_METRICS_PROMETHEUS);
    char *dir = tu_tmpdir(), *path = tu_join(dir, "all.prom"), cmd[1024];
    tu_write_file(path, text, strlen(text));
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s'", path);
    int rc = system(cmd);
    free(text);
    tu_rmtree(dir);
    free(path);
    free(dir);
    assert_int_equal(rc, 0);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_covers_the_struct),
        cmocka_unit_test(test_every_field_rendered),
        cmocka_unit_test(test_causes_sum_to_the_total),
        cmocka_unit_test(test_promtool_accepts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
