/* test_verify.c: verification in the read pipeline, end to end through the
 * public API: digests the library computes equal an independent SHA-256 of
 * the same bytes (generated models and every real file); a flipped byte
 * fails exactly its tensor, by name, while the others load; a live handle
 * keeps the bytes that were verified whatever happens to the file; a tensor
 * read again after the file changed fails. */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* ---------------------------------------------------------------- helpers */

typedef struct digests {
    size_t n;
    uint8_t (*d)[32];
    size_t delivered;
    size_t failed;
} digests;

static int collect(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
                   const char *message)
{
    digests *g = user;
    if (status != SLUICE_OK) {
        assert_null(t);
        assert_non_null(message);
        g->failed++;
        return 0;
    }
    assert_true(info->index < g->n);
    assert_int_equal(sluice_tensor_digest(t, g->d[info->index]), SLUICE_OK);
    g->delivered++;
    assert_int_equal(sluice_release(t), SLUICE_OK);
    return 0;
}

/* The library's digest of every tensor (HASH_ALL, no manifest). */
static digests library_digests(const char *path, uint64_t chunk)
{
    sluice_options o;
    sluice_options_init(&o);
    o.flags |= SLUICE_F_HASH_ALL;
    o.verify = SLUICE_VERIFY_OFF;
    if (chunk)
        o.chunk_bytes = chunk;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s", path, sluice_errmsg(m));
    digests g = {.n = sluice_count(m)};
    g.d = calloc(g.n ? g.n : 1, 32);
    assert_non_null(g.d);
    assert_int_equal(sluice_stream(m, NULL, 0, collect, &g), SLUICE_OK);
    assert_int_equal(g.delivered, g.n);
    assert_int_equal(g.failed, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return g;
}

/* Checks the library's digests against EVP over the bytes read with pread. */
static void check_independent(const char *path, const digests *g)
{
    sluice_model *m = NULL;
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    assert_int_equal(sluice_count(m), g->n);
    for (size_t i = 0; i < g->n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        void *bytes = tu_pread_range(info.file, info.offset, (size_t)info.nbytes);
        uint8_t want[32];
        mf_sha256(bytes, (size_t)info.nbytes, want);
        free(bytes);
        if (memcmp(want, g->d[i], 32) != 0) {
            char a[65], b[65];
            fail_msg("%s: tensor %s: library %s, EVP %s", path, info.name, mf_hex(g->d[i], a), mf_hex(want, b));
        }
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Writes the flat manifest of g for the model at path (names escaped). */
static void write_manifest(const char *model, const digests *g, const char *out)
{
    sluice_model *m = NULL;
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open(model, &o, &m), SLUICE_OK);
    mf_buf b = {0};
    mf_addf(&b, "{");
    for (size_t i = 0; i < g->n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        char hex[65];
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        mf_addf(&b, "%s\"", i ? ",\n" : "");
        for (size_t k = 0; k < info.name_len; k++) {
            unsigned char c = (unsigned char)info.name[k];
            if (c == '"' || c == '\\')
                mf_addf(&b, "\\%c", c);
            else if (c < 0x20)
                mf_addf(&b, "\\u%04x", c);
            else
                mf_addf(&b, "%c", c);
        }
        mf_addf(&b, "\": \"%s\"", mf_hex(g->d[i], hex));
    }
    mf_addf(&b, "}\n");
    tu_write_file(out, b.p, b.len);
    mf_buf_free(&b);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Overwrites one byte in place (same inode: an open model sees it). */
static void poke(const char *path, uint64_t offset, unsigned char xor_with)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, (off_t)offset), 1);
    c ^= xor_with;
    assert_int_equal(pwrite(fd, &c, 1, (off_t)offset), 1);
    close(fd);
}

/* The test model: big tensors spanning many chunks, and runs of tiny
 * adjacent tensors that the engine coalesces into one read. */
static const char *const model_keys[] = {
    "embed", "tiny.0", "tiny.1", "tiny.2", "tiny.3", "mid", "tiny.4", "tiny.5", "big", "last",
};
static const uint64_t model_sizes[] = {
    300000, 1, 2, 3, 1, 70000, 5, 7, 1200000, 33,
};
#define MODEL_N (sizeof model_keys / sizeof model_keys[0])

typedef struct fx {
    char *dir;
    char *model;
    char *manifest;
    digests clean;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest,
                        "model.safetensors.manifest.json"); /* the sidecar */
    mf_write_model(f->model, MODEL_N, model_keys, model_sizes);
    f->clean = library_digests(f->model, 0);
    write_manifest(f->model, &f->clean, f->manifest);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, f->manifest);
    free(f->clean.d);
    free(f);
    return 0;
}

static sluice_model *open_model(const char *path, sluice_verify_policy pol, uint64_t pool, uint64_t chunk)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = pol;
    if (pool)
        o.pool_bytes = pool;
    if (chunk)
        o.chunk_bytes = chunk;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %d %s", path, rc, sluice_errmsg(m));
    return m;
}

/* ---------------------------------------------------------------- tests */

static void generated_digests_are_independent(void **state)
{
    fx *f = *state;
    check_independent(f->model, &f->clean);
    /* the same with small chunks: a tensor hashed over many reads */
    digests g = library_digests(f->model, 4096);
    assert_memory_equal(g.d, f->clean.d, MODEL_N * 32);
    free(g.d);
}

static void clean_model_verifies(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f->model, SLUICE_VERIFY_DEFAULT, 0, 0);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    for (size_t i = 0; i < MODEL_N; i++) {
        sluice_tensor *t = NULL;
        int rc = sluice_acquire(m, model_keys[i], &t);
        if (rc != SLUICE_OK)
            fail_msg("%s: %s", model_keys[i], sluice_errmsg(m));
        uint8_t d[32];
        assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
        assert_memory_equal(d, f->clean.d[sluice_tensor_info(t)->index], 32);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Flips one byte (first, middle or last of a tensor) and expects exactly
 * that tensor to fail, by name, with both digests in the message. */
static void expect_only(fx *f, size_t victim, uint64_t at, uint64_t chunk)
{
    sluice_model *m = open_model(f->model, SLUICE_VERIFY_REQUIRE, 0, 0);
    struct sluice_tensor_info vi = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, model_keys[victim], &vi), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    poke(f->model, vi.offset + at, 0x5a);

    m = open_model(f->model, SLUICE_VERIFY_REQUIRE, 0, chunk);
    for (size_t i = 0; i < MODEL_N; i++) {
        sluice_tensor *t = NULL;
        int rc = sluice_acquire(m, model_keys[i], &t);
        if (i != victim) {
            if (rc != SLUICE_OK)
                fail_msg("%s failed though %s was hit: %s", model_keys[i], model_keys[victim], sluice_errmsg(m));
            assert_int_equal(sluice_release(t), SLUICE_OK);
            continue;
        }
        assert_int_equal(rc, SLUICE_E_CHECKSUM);
        assert_null(t);
        const char *msg = sluice_errmsg(m);
        char quoted[64], hex[65];
        snprintf(quoted, sizeof quoted, "\"%s\"", model_keys[victim]);
        if (!strstr(msg, quoted) || !strstr(msg, mf_hex(f->clean.d[vi.index], hex)))
            fail_msg("message lacks the name or the expected digest: %s", msg);
        /* trying again fails again, and never hands the bytes out */
        assert_int_equal(sluice_acquire(m, model_keys[i], &t), SLUICE_E_CHECKSUM);
        assert_null(t);
    }
    /* a stream delivers every other tensor and reports the victim */
    digests g = {.n = MODEL_N};
    g.d = calloc(MODEL_N, 32);
    assert_non_null(g.d);
    assert_int_equal(sluice_stream(m, NULL, 0, collect, &g), SLUICE_E_CHECKSUM);
    assert_int_equal(g.delivered, MODEL_N - 1);
    assert_int_equal(g.failed, 1);
    free(g.d);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    poke(f->model, vi.offset + at, 0x5a); /* restore */
}

static void flip_first_middle_last(void **state)
{
    fx *f = *state;
    const size_t victims[] = {0, 8, 9, 5};
    for (size_t k = 0; k < sizeof victims / sizeof victims[0]; k++) {
        uint64_t n = model_sizes[victims[k]];
        expect_only(f, victims[k], 0, 0);
        expect_only(f, victims[k], n / 2, 0);
        expect_only(f, victims[k], n - 1, 0);
        expect_only(f, victims[k], n / 3, 4096); /* many chunks */
    }
}

/* Tiny adjacent tensors share one coalesced read: a byte flipped in one
 * of them fails that one only. */
static void flip_coalesced_neighbours(void **state)
{
    fx *f = *state;
    for (size_t v = 1; v <= 7; v++) {
        if (v == 5)
            continue; /* "mid" */
        expect_only(f, v, 0, 0);
        expect_only(f, v, model_sizes[v] - 1, 0);
    }
}

/* IF_PRESENT checks what is listed and nothing else. */
static void if_present_checks_listed_only(void **state)
{
    fx *f = *state;
    char hex[65];
    mf_buf b = {0};
    mf_addf(&b, "{\"big\": \"%s\"}", mf_hex(f->clean.d[8], hex));
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    struct sluice_tensor_info big = SLUICE_TENSOR_INFO_INIT, embed = SLUICE_TENSOR_INFO_INIT;
    sluice_model *m = open_model(f->model, SLUICE_VERIFY_IF_PRESENT, 0, 0);
    assert_int_equal(sluice_find(m, "big", &big), SLUICE_OK);
    assert_int_equal(sluice_find(m, "embed", &embed), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    poke(f->model, embed.offset + 10, 1);
    poke(f->model, big.offset + 10, 1);
    m = open_model(f->model, SLUICE_VERIFY_IF_PRESENT, 0, 0);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "embed", &t), SLUICE_OK); /* unlisted: not checked */
    uint8_t d[32];
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_E_INVAL); /* and not hashed */
    sluice_release(t);
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* OFF: nothing checked even with the sidecar there */
    m = open_model(f->model, SLUICE_VERIFY_OFF, 0, 0);
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_OK);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* A handle keeps the bytes that were verified, whatever the file does. */
static void live_handle_survives_rewrite(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f->model, SLUICE_VERIFY_REQUIRE, 0, 0);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_OK);
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    void *before = tu_pread_range(f->model, info->offset, (size_t)info->nbytes);
    /* rewrite the whole file in place with other bytes, same size */
    size_t len = 0;
    unsigned char *all = tu_read_file(f->model, &len);
    assert_non_null(all);
    for (size_t k = (size_t)info->offset; k < info->offset + info->nbytes; k++)
        all[k] ^= 0xff;
    tu_write_file(f->model, all, len);
    free(all);
    assert_memory_equal(sluice_tensor_data(t), before, (size_t)info->nbytes);
    uint8_t d[32];
    mf_sha256(sluice_tensor_data(t), (size_t)info->nbytes, d);
    assert_memory_equal(d, f->clean.d[info->index], 32);
    /* a second handle on the same cached tensor shows the same bytes */
    sluice_tensor *t2 = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t2), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(t2), before, (size_t)info->nbytes);
    sluice_release(t2);
    sluice_release(t);
    free(before);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Released, evicted (a small pool), the file changed, read again: fails. */
static void evicted_then_changed_fails(void **state)
{
    fx *f = *state;
    /* a pool that holds "big" but not "big" and "embed" together */
    sluice_model *m = open_model(f->model, SLUICE_VERIFY_REQUIRE, 1300000, 65536);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "embed", &t), SLUICE_OK);
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    uint64_t off = info->offset;
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_OK); /* needs embed's room */
    assert_int_equal(sluice_release(t), SLUICE_OK);
    struct sluice_stats st = {.size = sizeof st};
    if (sluice_stats(m, &st) == SLUICE_OK)
        assert_true(st.evictions > 0);
    poke(f->model, off + 1234, 0x80);
    t = NULL;
    assert_int_equal(sluice_acquire(m, "embed", &t), SLUICE_E_CHECKSUM);
    assert_null(t);
    assert_non_null(strstr(sluice_errmsg(m), "\"embed\""));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    poke(f->model, off + 1234, 0x80);
}

/* Every real file: the library's digests equal EVP over pread bytes, and
 * a manifest of them verifies clean. */
static void real_files_digests(void **state)
{
    (void)state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char **files = NULL;
    size_t n = tu_list_safetensors(real, &files);
    char *sharded = tu_join(real, "SafeTensors.jl__sharded");
    char *dir = tu_tmpdir();
    char *mpath = tu_join(dir, "m.json");
    size_t checked = 0;
    for (size_t k = 0; k <= n; k++) {
        const char *path = k < n ? files[k] : sharded;
        digests g = library_digests(path, 0);
        check_independent(path, &g);
        write_manifest(path, &g, mpath);
        sluice_options o;
        sluice_options_init(&o);
        o.manifest_path = mpath;
        sluice_model *m = NULL;
        if (sluice_open(path, &o, &m) != SLUICE_OK)
            fail_msg("%s: %s", path, sluice_errmsg(m));
        assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
        digests v = {.n = g.n};
        v.d = calloc(g.n ? g.n : 1, 32);
        assert_int_equal(sluice_stream(m, NULL, 0, collect, &v), SLUICE_OK);
        assert_int_equal(v.failed, 0);
        assert_memory_equal(v.d, g.d, g.n * 32);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        free(v.d);
        free(g.d);
        checked++;
    }
    assert_true(checked >= 15);
    tu_rmtree(dir);
    free(dir);
    free(mpath);
    free(sharded);
    tu_free_list(files, n);
}

/* A real file copied, one byte flipped inside each tensor in turn (first,
 * middle, last): exactly that tensor fails. */
static void real_file_flips(void **state)
{
    (void)state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char *src = tu_join(real, "runai-model-streamer__test.safetensors");
    char *dir = tu_tmpdir();
    char *copy = tu_join(dir, "m.safetensors");
    char *mpath = tu_join(dir, "m.safetensors.manifest.json");
    size_t len = 0;
    void *bytes = tu_read_file(src, &len);
    assert_non_null(bytes);
    tu_write_file(copy, bytes, len);
    free(bytes);
    digests g = library_digests(copy, 0);
    write_manifest(copy, &g, mpath);
    for (size_t victim = 0; victim < g.n; victim++) {
        sluice_model *m = open_model(copy, SLUICE_VERIFY_REQUIRE, 0, 0);
        struct sluice_tensor_info vi = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, victim, &vi), SLUICE_OK);
        char q[300];
        snprintf(q, sizeof q, "\"%s\"", vi.name); /* names here are plain */
        assert_int_equal(sluice_close(m), SLUICE_OK);
        const uint64_t at[] = {0, vi.nbytes / 2, vi.nbytes - 1};
        for (int a = 0; a < 3 && vi.nbytes; a++) {
            poke(copy, vi.offset + at[a], 0xff);
            m = open_model(copy, SLUICE_VERIFY_REQUIRE, 0, 0);
            digests v = {.n = g.n};
            v.d = calloc(g.n, 32);
            assert_int_equal(sluice_stream(m, NULL, 0, collect, &v), SLUICE_E_CHECKSUM);
            assert_int_equal(v.failed, 1);
            assert_int_equal(v.delivered, g.n - 1);
            sluice_tensor *t = NULL;
            assert_int_equal(sluice_acquire_index(m, victim, &t), SLUICE_E_CHECKSUM);
            assert_non_null(strstr(sluice_errmsg(m), q));
            free(v.d);
            assert_int_equal(sluice_close(m), SLUICE_OK);
            poke(copy, vi.offset + at[a], 0xff);
        }
    }
    free(g.d);
    tu_rmtree(dir);
    free(dir);
    free(copy);
    free(mpath);
    free(src);
}

/* Without a manifest and without HASH_ALL nothing is hashed. */
static void no_digest_without_hashing(void **state)
{
    fx *f = *state;
    unlink(f->manifest);
    sluice_model *m = open_model(f->model, SLUICE_VERIFY_DEFAULT, 0, 0);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "mid", &t), SLUICE_OK);
    uint8_t d[32];
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_E_INVAL);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(generated_digests_are_independent, setup, teardown),
        cmocka_unit_test_setup_teardown(clean_model_verifies, setup, teardown),
        cmocka_unit_test_setup_teardown(flip_first_middle_last, setup, teardown),
        cmocka_unit_test_setup_teardown(flip_coalesced_neighbours, setup, teardown),
        cmocka_unit_test_setup_teardown(if_present_checks_listed_only, setup, teardown),
        cmocka_unit_test_setup_teardown(live_handle_survives_rewrite, setup, teardown),
        cmocka_unit_test_setup_teardown(evicted_then_changed_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(no_digest_without_hashing, setup, teardown),
        cmocka_unit_test(real_files_digests),
        cmocka_unit_test(real_file_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
