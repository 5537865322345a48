/* test_engine.c: the engine's contract: every byte of every tensor, in
 * every order and by streaming, of the real corpus and of generated
 * sharded models; cache, prefetch, pool limits, close, O_DIRECT, digests.
 * Runs on io_uring, and on the pread backend as test_engine_pread. */
#include "engine_fixture.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <unistd.h>

/* ---------------------------------------------------------------- corpus */

static void check_path(const char *path, uint32_t flags)
{
    sluice_options o = ef_opts(4u << 20, 64u << 10, flags);
    sluice_model *m = ef_open(path, &o);
    ef_check_orders(m, 42);
    ef_check_stream(m);
    struct sluice_stats st = ef_stats(m);
    assert_true(st.pool_high_water <= st.pool_bytes);
    assert_int_equal(st.failures, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void test_real_corpus(void **state)
{
    (void)state;
    const char *dir = tu_real_data();
    if (!dir)
        skip();
    char **files;
    size_t n = tu_list_safetensors(dir, &files);
    assert_true(n > 0);
    for (size_t k = 0; k < n; k++) {
        check_path(files[k], 0);
        check_path(files[k], SLUICE_F_HASH_ALL);
    }
    tu_free_list(files, n);
    char *sharded = tu_join(dir, "SafeTensors.jl__sharded");
    check_path(sharded, 0);
    check_path(sharded, SLUICE_F_DIRECT | SLUICE_F_HASH_ALL);
    free(sharded);
}

/* ---------------------------------------------------------------- generated */

static void test_generated_model(void **state)
{
    (void)state;
    char *dir = ef_model(3, ef_sizes, EF_NSIZES, 7);
    /* A pool far smaller than the model (3 x ~1.2 MB): eviction at work. */
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    assert_int_equal(sluice_count(m), 3 * EF_NSIZES);
    ef_check_orders(m, 1);
    ef_check_stream(m);
    ef_check_stream(m);
    struct sluice_stats st = ef_stats(m);
    assert_true(st.pool_high_water <= st.pool_bytes);
    assert_true(st.evictions > 0);
    assert_int_equal(st.failures, 0);
    assert_true(st.backend == SLUICE_BACKEND_IO_URING || st.backend == SLUICE_BACKEND_PREAD);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* Default chunk (8 MiB: every tensor one read, small ones coalesced). */
    o = ef_opts(64u << 20, 8u << 20, 0);
    m = ef_open(dir, &o);
    ef_check_stream(m);
    st = ef_stats(m);
    assert_true(st.reads < st.tensors_loaded);  /* coalesced */
    ef_check_orders(m, 3);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

static void test_direct(void **state)
{
    (void)state;
    char *dir = ef_model(2, ef_sizes, EF_NSIZES, 11);
    sluice_options o = ef_opts(2u << 20, 64u << 10, SLUICE_F_DIRECT);
    sluice_model *m = ef_open(dir, &o);
    ef_check_orders(m, 5);
    ef_check_stream(m);
    struct sluice_stats st = ef_stats(m);
    /* Either the file system takes O_DIRECT or each file fell back. */
    assert_true(st.direct_fallbacks == 0 || st.direct_fallbacks == 2);
    assert_int_equal(st.failures, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

static void test_empty(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *p = tu_join(dir, "empty.safetensors");
    tu_write_safetensors(p, "{}      ", NULL, 0);
    sluice_options o = ef_opts(1u << 20, 64u << 10, SLUICE_F_HASH_ALL);
    sluice_model *m = ef_open(p, &o);
    assert_int_equal(sluice_count(m), 0);
    ef_check_stream(m);
    assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* Only empty tensors: no read at all, a digest all the same. */
    tu_write_safetensors(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[0,0]}}",
                         NULL, 0);
    m = ef_open(p, &o);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "a", &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(t), 0);
    assert_int_equal((uintptr_t)sluice_tensor_data(t) % 64, 0);
    uint8_t d[32];
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
    assert_int_equal(d[0], 0xe3);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    ef_check_stream(m);
    assert_int_equal(ef_stats(m).reads, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* ---------------------------------------------------------------- cache, plan */

static void test_cache_and_prefetch(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 3);
    sluice_options o = ef_opts(16u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "s0.t013", &t), SLUICE_OK);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(sluice_acquire(m, "s0.t013", &t), SLUICE_OK);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.cache_hits, a.cache_hits + 1);
    assert_int_equal(b.reads, a.reads);
    assert_int_equal(b.bytes_read, a.bytes_read);

    /* A hint: those tensors are read ahead; acquiring them reads nothing. */
    assert_int_equal(sl_engine_drop_cache(m), SLUICE_OK);
    const char *names[] = {"s0.t015", "s0.t002", "s0.t009"};
    const char *bad[] = {"s0.t015", "nope"};
    assert_int_equal(sluice_prefetch(m, bad, 2), SLUICE_E_NOT_FOUND);
    assert_non_null(strstr(sluice_errmsg(m), "nope"));
    assert_int_equal(sluice_prefetch(m, names, 3), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    a = ef_stats(m);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(sluice_acquire(m, names[k], &t), SLUICE_OK);
        ef_check_handle(t);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    }
    b = ef_stats(m);
    assert_int_equal(b.reads, a.reads);
    assert_int_equal(b.cache_hits, a.cache_hits + 3);
    assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "absent", &t), SLUICE_E_NOT_FOUND);
    assert_null(t);
    assert_non_null(strstr(sluice_errmsg(m), "absent"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* A stream callback that acquires a tensor for which only its own stream
 * could make room gets POOL_EXHAUSTED, not a wait that never ends. */
typedef struct self_ctx {
    sluice_model *m;
    int acquire_rc, stream_rc;
} self_ctx;

static int nested_cb(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *msg)
{
    (void)user;
    (void)info;
    (void)msg;
    sluice_release(t);
    return 0;
}

static int acquire_inside(void *user, sluice_tensor *t, int status,
                          const struct sluice_tensor_info *info, const char *msg)
{
    (void)info;
    (void)msg;
    self_ctx *c = user;
    assert_int_equal(status, SLUICE_OK);
    sluice_tensor *b = NULL;
    c->acquire_rc = sluice_acquire_index(c->m, 1, &b); /* holding tensor 0 */
    const char *one[] = {"s0.t001"};
    c->stream_rc = sluice_stream(c->m, one, 1, nested_cb, NULL);
    sluice_release(b);
    sluice_release(t);
    return 0;
}

static void test_acquire_inside_stream_callback(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {1536u << 10, 1536u << 10};
    char *dir = ef_model(1, sizes, 2, 11);
    sluice_options o = ef_opts(2u << 20, 256u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    alarm(60); /* a hang fails the test instead of the ctest timeout */
    self_ctx c = {m, 0, 0};
    const char *first[] = {"s0.t000"};
    assert_int_equal(sluice_stream(m, first, 1, acquire_inside, &c), SLUICE_OK);
    alarm(0);
    assert_int_equal(c.acquire_rc, SLUICE_E_POOL_EXHAUSTED);
    assert_int_equal(c.stream_rc, SLUICE_E_POOL_EXHAUSTED);
    ef_acquire_check(m, 1); /* and it loads once the callback is gone */
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* Read-ahead along the default plan follows acquires that go in order and
 * pauses after a jump: acquires in random order read only their own
 * tensors, acquires in order get the next ones read ahead. */
static void test_readahead_follows_order(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 5);
    sluice_options o = ef_opts(16u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    static const size_t jumps[] = {9, 3, 14, 6, 1};
    uint64_t asked = 0;
    for (size_t k = 0; k < sizeof jumps / sizeof jumps[0]; k++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire_index(m, jumps[k], &t), SLUICE_OK);
        ef_check_handle(t);
        asked += sluice_tensor_size(t);
        assert_int_equal(sluice_release(t), SLUICE_OK);
        assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    }
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(a.bytes_read, asked); /* nothing read ahead */

    /* in order from the start: what follows is read ahead */
    assert_int_equal(sl_engine_drop_cache(m), SLUICE_OK);
    a = ef_stats(m);
    for (size_t i = 0; i < 3; i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    }
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats b = ef_stats(m);
    uint64_t first3 = 0;
    for (size_t i = 0; i < 3; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        first3 += info.nbytes;
    }
    assert_true(b.bytes_read - a.bytes_read > first3);
    for (size_t i = 3; i < sluice_count(m); i++)
        ef_acquire_check(m, i); /* and they are right */
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* A hint repeated (a caller that hints the same plan before each of its
 * steps) keeps what the plan has already read ahead: read-ahead never
 * evicts other read-ahead, so it cannot evict its own to read it again.
 * Before the fix, the new hint made the old one's unused read-ahead the
 * first to evict, and read-ahead along the same plan evicted it tensor by
 * tensor to read the holes before it again. */
static void test_rehint_keeps_readahead(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {256u << 10, 256u << 10, 256u << 10,
                                     256u << 10, 256u << 10, 256u << 10};
    char *dir = ef_model(1, sizes, 6, 9);
    /* room for three of them, not four */
    sluice_options o = ef_opts(3 * (256u << 10) + (128u << 10), 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    const char *plan[] = {"s0.t000", "s0.t001", "s0.t002", "s0.t003", "s0.t004", "s0.t005"};
    assert_int_equal(sluice_prefetch(m, plan, 6), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    /* t000 used and released: its room goes to t003, read ahead */
    ef_acquire_check(m, 0);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(a.bytes_read, 4 * (256u << 10));
    assert_int_equal(a.evictions, 1);
    /* The same plan again: t001 to t003 are still wanted; nothing is
     * evicted to read t000 again, and they are served from memory. */
    assert_int_equal(sluice_prefetch(m, plan, 6), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.evictions, a.evictions);
    assert_int_equal(b.bytes_read, a.bytes_read);
    for (size_t i = 1; i <= 3; i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire(m, plan[i], &t), SLUICE_OK);
        ef_check_handle(t);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    }
    struct sluice_stats c = ef_stats(m);
    assert_int_equal(c.cache_hits, b.cache_hits + 3);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* A demand that takes its room from the read-ahead (a tensor off the plan,
 * as a vocab part is, acquired and released again and again) pauses the
 * plan's read-ahead until the caller acquires along the plan again: before
 * the fix, each release let read-ahead read the next tensors of the plan
 * into the room the next demand took back, evicting them unused. */
static void test_demand_over_readahead_pauses_it(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {256u << 10, 256u << 10, 256u << 10,
                                     256u << 10, 256u << 10, 256u << 10};
    char *dir = ef_model(1, sizes, 6, 10);
    /* room for three of them, not four */
    sluice_options o = ef_opts(3 * (256u << 10) + (128u << 10), 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    const char *plan[] = {"s0.t000", "s0.t001", "s0.t002", "s0.t003", "s0.t004"};
    assert_int_equal(sluice_prefetch(m, plan, 5), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(a.bytes_read, 3 * (256u << 10)); /* t000 to t002: the pool is full */
    /* s0.t005 three times: its room is the newest read-ahead's (t002),
     * once; the read-ahead waits, nothing else is read or evicted */
    for (int k = 0; k < 3; k++) {
        ef_acquire_check(m, 5);
        assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    }
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.bytes_read, 4 * (256u << 10));
    assert_int_equal(b.evictions, 1);
    assert_int_equal(b.cache_hits, a.cache_hits + 2);
    /* along the plan again: read-ahead goes on (t002, evicted, is read) */
    ef_acquire_check(m, 0);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats c = ef_stats(m);
    assert_true(c.bytes_read > b.bytes_read);
    for (size_t i = 1; i <= 4; i++)
        ef_acquire_check(m, i);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* Read-ahead of an earlier plan still in flight when a new hint comes,
 * that the new plan does not name, is the first room taken once it lands,
 * as it would have been had it landed before the hint (sluice_prefetch).
 * Before the fix it landed as read-ahead, which read-ahead never evicts:
 * the new plan's read-ahead stopped at it until a demand took its room. */
static void test_rehint_ages_readahead_in_flight(void **state)
{
    (void)state;
    /* t000: 1 MiB in 256 reads of 4 KiB, one at a time: still loading
     * when the second hint comes right after the first */
    static const uint64_t sizes[] = {1u << 20, 256u << 10, 256u << 10, 256u << 10};
    char *dir = ef_model(1, sizes, 4, 12);
    /* room for t000 and one other, not two */
    sluice_options o = ef_opts((1u << 20) + (384u << 10), 4096, 0);
    o.queue_depth = 1;
    sluice_model *m = ef_open(dir, &o);
    const char *old_plan[] = {"s0.t000"};
    const char *plan[] = {"s0.t001", "s0.t002", "s0.t003"};
    assert_int_equal(sluice_prefetch(m, old_plan, 1), SLUICE_OK);
    assert_int_equal(sluice_prefetch(m, plan, 3), SLUICE_OK);
    /* (had t000 landed before the second hint, the hint aged it: the same
     * figures below, the test then shows nothing either way) */
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats a = ef_stats(m);
    /* t000 read, then made room for the plan's three */
    assert_int_equal(a.bytes_read, (1u << 20) + 3 * (256u << 10));
    assert_int_equal(a.evictions, 1);
    for (size_t i = 1; i <= 3; i++)
        ef_acquire_check(m, i);
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.cache_hits, a.cache_hits + 3);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* A new hint that names the earlier read-ahead in another order: a
 * demand that needs room takes it from what the new plan wants last
 * (evict_one takes the newest read-ahead, "the one wanted last"). Before
 * the fix the read-ahead the new plan names kept the earlier plan's
 * order, and the demand evicted the tensor the new plan wants first, for
 * the next acquire along it to wait for it. */
static void test_rehint_reorders_readahead(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {256u << 10, 256u << 10, 256u << 10, 256u << 10, 256u << 10};
    char *dir = ef_model(1, sizes, 5, 13);
    /* room for three of them, not four */
    sluice_options o = ef_opts(3 * (256u << 10) + (128u << 10), 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    const char *old_plan[] = {"s0.t000", "s0.t001", "s0.t002"};
    const char *plan[] = {"s0.t002", "s0.t001", "s0.t000", "s0.t003"};
    assert_int_equal(sluice_prefetch(m, old_plan, 3), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    assert_int_equal(sluice_prefetch(m, plan, 4), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    /* s0.t004, off the plan (a stand-in for a vocab part): its room is
     * t000's, the read-ahead the new plan wants last */
    ef_acquire_check(m, 4);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(a.bytes_read, 4 * (256u << 10));
    assert_int_equal(a.evictions, 1);
    /* t002 and t001, first along the plan, are served from memory */
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, plan[0], &t), SLUICE_OK);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, plan[1], &t), SLUICE_OK);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.cache_hits, a.cache_hits + 2);
    for (size_t i = 0; i <= 3; i++)
        ef_acquire_check(m, i);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* The same when the new plan names, before the read-ahead it keeps, a
 * tensor used already and still cached: read-ahead keeps it again as the
 * plan's walk passes it, in the plan's order, not as the newest (before
 * the fix, the one a demand evicted first, though the plan wants it
 * first). */
static void test_rehint_keeps_used_in_order(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {256u << 10, 256u << 10, 256u << 10, 256u << 10, 256u << 10};
    char *dir = ef_model(1, sizes, 5, 14);
    /* room for three of them, not four */
    sluice_options o = ef_opts(3 * (256u << 10) + (128u << 10), 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    ef_acquire_check(m, 2); /* t002 used, cached (no read-ahead: not the start of the order) */
    const char *old_plan[] = {"s0.t000", "s0.t001"};
    const char *plan[] = {"s0.t002", "s0.t000", "s0.t001", "s0.t003"};
    assert_int_equal(sluice_prefetch(m, old_plan, 2), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    assert_int_equal(sluice_prefetch(m, plan, 4), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    /* s0.t004 off the plan: its room is t001's, wanted last */
    ef_acquire_check(m, 4);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(a.bytes_read, 4 * (256u << 10));
    assert_int_equal(a.evictions, 1);
    sluice_tensor *t;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(sluice_acquire(m, plan[k], &t), SLUICE_OK);
        ef_check_handle(t);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    }
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.cache_hits, a.cache_hits + 2);
    for (size_t i = 0; i <= 3; i++)
        ef_acquire_check(m, i);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* A plan naming a tensor twice (a tied weight, used first and last): its
 * acquire at the second place goes on from there, the plan's end, and
 * reads nothing more. Before the fix every acquire of it counted at its
 * first place: read-ahead went back to the start of the plan and read
 * again what had been used and evicted, for nobody. */
static void test_hint_twice_goes_on_from_second_place(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {256u << 10, 256u << 10, 256u << 10, 256u << 10, 256u << 10};
    char *dir = ef_model(1, sizes, 5, 15);
    /* room for three of them, not four */
    sluice_options o = ef_opts(3 * (256u << 10) + (128u << 10), 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    const char *plan[] = {"s0.t000", "s0.t001", "s0.t002", "s0.t003", "s0.t004", "s0.t000"};
    assert_int_equal(sluice_prefetch(m, plan, 6), SLUICE_OK);
    for (size_t i = 0; i <= 4; i++) {
        ef_acquire_check(m, i);
        assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    }
    /* t000 read ahead again for its second place */
    struct sluice_stats a = ef_stats(m);
    assert_int_equal(a.bytes_read, 6 * (256u << 10));
    ef_acquire_check(m, 0);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    struct sluice_stats b = ef_stats(m);
    assert_int_equal(b.cache_hits, a.cache_hits + 1);
    assert_int_equal(b.bytes_read, a.bytes_read);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- pool limits */

static void test_too_large(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 5);
    sluice_options o = ef_opts(128u << 10, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "s0.t013", &t), SLUICE_E_TOO_LARGE); /* 300000 */
    const char *msg = sluice_errmsg(m);
    assert_non_null(strstr(msg, "s0.t013"));
    assert_non_null(strstr(msg, "300000"));
    assert_non_null(strstr(msg, "131072"));
    /* The rest still loads, and streaming reports the big ones. */
    assert_int_equal(sluice_acquire(m, "s0.t008", &t), SLUICE_OK);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    ef_stream_seen s = {0};
    s.n = sluice_count(m);
    s.seen = calloc(s.n, 1);
    assert_int_equal(sluice_stream(m, NULL, 0, ef_stream_cb, &s), SLUICE_E_TOO_LARGE);
    assert_int_equal(s.failed, 2);  /* 200000 and 300000 */
    assert_int_equal(s.delivered + s.failed, s.n);
    free(s.seen);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

static void test_pool_exhausted(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {256 << 10, 256 << 10, 256 << 10, 256 << 10, 256 << 10, 4096};
    char *dir = ef_model(1, sizes, 6, 9);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    sluice_tensor *h[4], *t;
    for (int k = 0; k < 4; k++)
        assert_int_equal(sluice_acquire_index(m, (size_t)k, &h[k]), SLUICE_OK);
    assert_int_equal(sluice_acquire_index(m, 4, &t), SLUICE_E_POOL_EXHAUSTED);
    assert_null(t);
    assert_non_null(strstr(sluice_errmsg(m), "s0.t004"));
    assert_non_null(strstr(sluice_errmsg(m), "held by live handles"));
    /* Close refuses while handles live, and the model goes on working. */
    assert_int_equal(sluice_close(m), SLUICE_E_BUSY);
    assert_non_null(strstr(sluice_errmsg(m), "4 tensor handles"));
    assert_int_equal(sluice_release(h[0]), SLUICE_OK);
    assert_int_equal(sluice_release(h[0]), SLUICE_E_INVAL); /* twice */
    assert_int_equal(sluice_acquire_index(m, 4, &t), SLUICE_OK);
    /* the new handle is not the released one: releasing that one a third
     * time is still refused, and t stays live */
    assert_ptr_not_equal(t, h[0]);
    assert_int_equal(sluice_release(h[0]), SLUICE_E_INVAL);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    for (int k = 1; k < 4; k++) {
        ef_check_handle(h[k]);
        assert_int_equal(sluice_release(h[k]), SLUICE_OK);
    }
    struct sluice_stats st = ef_stats(m);
    assert_true(st.pool_high_water <= (1u << 20));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* A stream whose callback keeps every handle: when the pool is all held,
 * the rest fail with POOL_EXHAUSTED instead of waiting for ever. */
static void test_stream_keeps_handles(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {300 << 10, 300 << 10, 300 << 10, 300 << 10, 300 << 10};
    char *dir = ef_model(1, sizes, 5, 13);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    ef_stream_seen s = {0};
    s.n = 5;
    s.seen = calloc(5, 1);
    s.keep = 1;
    s.kept = calloc(5, sizeof *s.kept);
    assert_int_equal(sluice_stream(m, NULL, 0, ef_stream_cb, &s), SLUICE_E_POOL_EXHAUSTED);
    assert_int_equal(s.delivered, 3);
    assert_int_equal(s.failed, 2);
    for (size_t k = 0; k < s.nkept; k++)
        assert_int_equal(sluice_release(s.kept[k]), SLUICE_OK);
    ef_check_stream(m);
    free(s.kept);
    free(s.seen);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

static int stop_at_three(void *user, sluice_tensor *t, int status,
                         const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    (void)message;
    int *count = user;
    assert_int_equal(status, SLUICE_OK);
    sluice_release(t);
    return ++*count == 3 ? 7 : 0;
}

static void test_stream_list_and_stop(void **state)
{
    (void)state;
    char *dir = ef_model(2, ef_sizes, EF_NSIZES, 17);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    const char *names[] = {"s1.t013", "s0.t001", "s1.t000", "s0.t009", "s0.t010"};
    ef_stream_seen s = {0};
    s.n = sluice_count(m);
    s.seen = calloc(s.n, 1);
    assert_int_equal(sluice_stream(m, names, 5, ef_stream_cb, &s), SLUICE_OK);
    assert_int_equal(s.delivered, 5);
    const char *bad[] = {"s0.t001", "missing"};
    assert_int_equal(sluice_stream(m, bad, 2, ef_stream_cb, &s), SLUICE_E_NOT_FOUND);
    int count = 0;
    assert_int_equal(sluice_stream(m, NULL, 0, stop_at_three, &count), 7);
    assert_int_equal(count, 3);
    free(s.seen);
    assert_int_equal(sluice_close(m), SLUICE_OK); /* nothing left held */
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- digests */

static void test_hash_all_digests(void **state)
{
    (void)state;
    char *dir = ef_model(2, ef_sizes, EF_NSIZES, 19);
    sluice_options o = ef_opts(1u << 20, 64u << 10, SLUICE_F_HASH_ALL);
    sluice_model *m = ef_open(dir, &o);
    uint64_t total = 0;
    for (size_t i = 0; i < sluice_count(m); i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        uint8_t got[32], want[32];
        unsigned len;
        assert_int_equal(sluice_tensor_digest(t, got), SLUICE_OK);
        EVP_Digest(sluice_tensor_data(t), (size_t)sluice_tensor_size(t), want, &len,
                   EVP_sha256(), NULL);
        assert_memory_equal(got, want, 32);
        total += sluice_tensor_size(t);
        ef_check_handle(t);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    }
    struct sluice_stats st = ef_stats(m);
    assert_true(st.bytes_hashed >= total);
    assert_int_equal(st.tensors_verified, 0); /* nothing to check against */
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* Without HASH_ALL and no manifest: no digest. */
    o.flags = 0;
    m = ef_open(dir, &o);
    sluice_tensor *t;
    uint8_t d[32];
    assert_int_equal(sluice_acquire_index(m, 3, &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(ef_stats(m).bytes_hashed, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- sharing */

typedef struct shared_arg {
    sluice_model *m;
    pthread_barrier_t *barrier;
} shared_arg;

static void *shared_acquire(void *p)
{
    shared_arg *a = p;
    sluice_tensor *t;
    pthread_barrier_wait(a->barrier);
    int rc = sluice_acquire(a->m, "s0.t000", &t);
    if (rc != SLUICE_OK)
        return (void *)1;
    const unsigned char *d = sluice_tensor_data(t);
    unsigned char *want = tu_pread_range(sluice_tensor_info(t)->file,
                                         sluice_tensor_info(t)->offset, (size_t)sluice_tensor_size(t));
    int same = memcmp(d, want, (size_t)sluice_tensor_size(t)) == 0;
    free(want);
    sluice_release(t);
    return same ? NULL : (void *)2;
}

static void test_shared_read(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {4u << 20};
    char *dir = ef_model(1, sizes, 1, 23);
    sluice_options o = ef_opts(8u << 20, 256u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    enum { N = 8 };
    pthread_t th[N];
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, N);
    shared_arg a = {m, &b};
    for (int k = 0; k < N; k++)
        pthread_create(&th[k], NULL, shared_acquire, &a);
    for (int k = 0; k < N; k++) {
        void *r;
        pthread_join(th[k], &r);
        assert_null(r);
    }
    pthread_barrier_destroy(&b);
    struct sluice_stats st = ef_stats(m);
    assert_int_equal(st.tensors_loaded, 1);
    assert_int_equal(st.reads, 16);         /* 4 MiB in 256 KiB chunks, once */
    assert_int_equal(st.bytes_read, 4u << 20);
    assert_int_equal(st.acquire_count, N);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- misuse */

static void test_misuse(void **state)
{
    (void)state;
    sluice_tensor *t = (sluice_tensor *)1;
    assert_int_equal(sluice_acquire(NULL, "x", &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_int_equal(sluice_release(NULL), SLUICE_OK);
    assert_null(sluice_tensor_data(NULL));
    assert_int_equal(sluice_tensor_size(NULL), 0);
    struct sluice_stats st = {0};
    assert_int_equal(sluice_stats(NULL, &st), SLUICE_E_INVAL);
    char *dir = ef_model(1, ef_sizes, 4, 1);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    assert_int_equal(sluice_acquire(m, NULL, &t), SLUICE_E_INVAL);
    assert_int_equal(sluice_acquire_index(m, 99, &t), SLUICE_E_INVAL);
    assert_int_equal(sluice_stream(m, NULL, 0, NULL, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_prefetch(m, NULL, 3), SLUICE_E_INVAL);
    assert_int_equal(sluice_stats(m, &st), SLUICE_E_INVAL); /* size 0 */
    /* A short stats struct: only its fields are written. */
    struct sluice_stats big;
    memset(&big, 0xab, sizeof big);
    big.size = offsetof(struct sluice_stats, bytes_read);
    assert_int_equal(sluice_stats(m, &big), SLUICE_OK);
    assert_int_equal(big.bytes_read, 0xababababababababull);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_corpus),
        cmocka_unit_test(test_generated_model),
        cmocka_unit_test(test_direct),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_cache_and_prefetch),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_pool_exhausted),
        cmocka_unit_test(test_stream_keeps_handles),
        cmocka_unit_test(test_stream_list_and_stop),
        cmocka_unit_test(test_hash_all_digests),
        cmocka_unit_test(test_shared_read),
        cmocka_unit_test(test_readahead_follows_order),
        cmocka_unit_test(test_rehint_keeps_readahead),
        cmocka_unit_test(test_demand_over_readahead_pauses_it),
        cmocka_unit_test(test_rehint_ages_readahead_in_flight),
        cmocka_unit_test(test_rehint_reorders_readahead),
        cmocka_unit_test(test_rehint_keeps_used_in_order),
        cmocka_unit_test(test_hint_twice_goes_on_from_second_place),
        cmocka_unit_test(test_acquire_inside_stream_callback),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
