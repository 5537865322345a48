/* test_file_change.c: the files of an open model change under it:
 * truncated, extended, rewritten in place, replaced (a new file renamed
 * over the path), deleted (unlinked while open). Each with a manifest
 * (REQUIRE: every tensor has a digest, the sidecar) and without, with and
 * without O_DIRECT, on both backends (ctest runs it again with
 * SLUICE_FORCE_PREAD=1).
 *
 * sluice reads through descriptors opened at open and maps nothing after
 * open, so nothing here may raise SIGBUS. What each must give:
 *  - truncated: the tensors past the new end fail with
 *    SLUICE_E_FILE_CHANGED ("shrank"), the others load;
 *  - extended, replaced, deleted: the descriptor still reads the bytes that
 *    were opened; every tensor loads, verified when there is a manifest;
 *  - rewritten in place: with a manifest, the changed tensors fail with
 *    SLUICE_E_CHECKSUM and the unchanged ones load; without, a read gives
 *    the file's bytes at the time of the read (nothing to check them
 *    against).
 * A live handle keeps its bytes whatever happens to the file. */
#include "engine_fixture.h"
#include "mf_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

static const uint64_t sizes[] = {200000, 100, 0, 4096, 300, 70000, 50, 9000};
#define NT (sizeof sizes / sizeof sizes[0])

typedef struct fx {
    char *dir, *file;
    uint32_t flags;
    int manifest;
    unsigned char *ref[NT];   /* each tensor's bytes at open */
    uint64_t off[NT];
    uint64_t file_size;
    sluice_model *m;
} fx;

static fx *fx_open(int manifest, uint32_t flags)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->file = tu_join(f->dir, "model.safetensors");
    f->flags = flags;
    f->manifest = manifest;
    uint64_t seed = 777;
    ef_write_shard(f->file, "t", sizes, NT, 5, &seed);
    size_t len = 0;
    free(tu_read_file(f->file, &len));
    f->file_size = len;
    if (manifest) {
        /* the sidecar, written from an independent read of the file */
        sluice_options o;
        sluice_options_init(&o);
        o.verify = SLUICE_VERIFY_OFF;
        sluice_model *m = NULL;
        assert_int_equal(sluice_open(f->file, &o, &m), SLUICE_OK);
        mf_buf b = {0};
        mf_addf(&b, "{");
        for (size_t i = 0; i < NT; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
            unsigned char *bytes = tu_pread_range(f->file, info.offset, (size_t)info.nbytes);
            uint8_t d[32];
            char hex[65];
            mf_sha256(bytes, (size_t)info.nbytes, d);
            mf_addf(&b, "%s\"%s\":\"%s\"", i ? "," : "", info.name, mf_hex(d, hex));
            free(bytes);
        }
        mf_addf(&b, "}");
        assert_int_equal(sluice_close(m), SLUICE_OK);
        char *side = tu_join(f->dir, "model.safetensors.manifest.json");
        mf_write_text(side, b.p);
        free(side);
        mf_buf_free(&b);
    }
    sluice_options o = ef_opts(4u << 20, 64u << 10, flags);
    o.queue_depth = 4;
    f->m = ef_open(f->file, &o);
    assert_int_equal(sluice_verify_mode(f->m), manifest ? SLUICE_VERIFY_REQUIRE : SLUICE_VERIFY_OFF);
    for (size_t i = 0; i < NT; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(f->m, i, &info), SLUICE_OK);
        f->ref[i] = tu_pread_range(f->file, info.offset, (size_t)info.nbytes);
        f->off[i] = info.offset;
    }
    return f;
}

static void fx_close(fx *f)
{
    assert_int_equal(sluice_close(f->m), SLUICE_OK);
    for (size_t i = 0; i < NT; i++)
        free(f->ref[i]);
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->file);
    free(f);
}

/* Acquires tensor i from the file (cache dropped first); on success
 * compares with want (NULL: the bytes at open). Returns the status. */
static int load(fx *f, size_t i, const unsigned char *want)
{
    assert_int_equal(sl_engine_drop_cache(f->m), SLUICE_OK);
    sluice_tensor *t = NULL;
    int rc = sluice_acquire_index(f->m, i, &t);
    if (rc != SLUICE_OK) {
        assert_null(t);
        return rc;
    }
    if (!want)
        want = f->ref[i];
    assert_int_equal(sluice_tensor_size(t), sizes[i]);
    if (sizes[i])
        assert_memory_equal(sluice_tensor_data(t), want, (size_t)sizes[i]);
    uint8_t d[32];
    if (f->manifest) {
        assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
        uint8_t mine[32];
        mf_sha256(want, (size_t)sizes[i], mine);
        assert_memory_equal(d, mine, 32);
    }
    assert_int_equal(sluice_release(t), SLUICE_OK);
    return SLUICE_OK;
}

typedef struct seen {
    const fx *f;
    unsigned ok, failed, bad;
} seen;

/* Compares with the bytes at open (ef_stream_cb would read the path,
 * which no longer names the file opened). */
static int cb(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
              const char *message)
{
    seen *s = user;
    (void)message;
    if (status != SLUICE_OK) {
        s->failed++;
        return 0;
    }
    s->ok++;
    if (info->nbytes && memcmp(sluice_tensor_data(t), s->f->ref[info->index], (size_t)info->nbytes))
        s->bad++;
    sluice_release(t);
    return 0;
}

/* Streams every tensor from the file; returns the stream's status. */
static int stream(fx *f, seen *s)
{
    assert_int_equal(sl_engine_drop_cache(f->m), SLUICE_OK);
    memset(s, 0, sizeof *s);
    s->f = f;
    int rc = sluice_stream(f->m, NULL, 0, cb, s);
    assert_int_equal(s->bad, 0);
    assert_int_equal(s->ok + s->failed, NT);
    return rc;
}

/* Every tensor loads with the bytes of open, one by one and by a stream. */
static void all_load(fx *f)
{
    for (size_t i = 0; i < NT; i++) {
        int rc = load(f, i, NULL);
        if (rc != SLUICE_OK)
            fail_msg("tensor %zu: %s: %s", i, sluice_strerror(rc), sluice_errmsg(f->m));
    }
    seen s;
    assert_int_equal(stream(f, &s), SLUICE_OK);
    assert_int_equal(s.ok, NT);
}

/* ---------------------------------------------------------------- truncated */

static void truncated(int manifest, uint32_t flags)
{
    fx *f = fx_open(manifest, flags);
    /* a live handle taken before keeps its bytes */
    sluice_tensor *held = NULL;
    assert_int_equal(sluice_acquire_index(f->m, 5, &held), SLUICE_OK);
    /* cut inside tensor 5 (70000 bytes, several chunks) */
    uint64_t cut = f->off[5] + 30000;
    assert_int_equal(truncate(f->file, (off_t)cut), 0);
    for (size_t i = 0; i < NT; i++) {
        int rc = load(f, i, NULL);
        /* tensor 5 is held: served from memory, the bytes verified before */
        int gone = sizes[i] && f->off[i] + sizes[i] > cut && i != 5;
        if (gone) {
            if (rc != SLUICE_E_FILE_CHANGED)
                fail_msg("tensor %zu past the cut: %s: %s", i, sluice_strerror(rc),
                         sluice_errmsg(f->m));
            assert_non_null(strstr(sluice_errmsg(f->m), "shrank"));
            assert_non_null(strstr(sluice_errmsg(f->m), f->file));
        } else if (rc != SLUICE_OK) {
            fail_msg("tensor %zu before the cut: %s: %s", i, sluice_strerror(rc),
                     sluice_errmsg(f->m));
        }
    }
    assert_memory_equal(sluice_tensor_data(held), f->ref[5], (size_t)sizes[5]);
    assert_int_equal(sluice_release(held), SLUICE_OK);
    /* a stream delivers the survivors and reports the change */
    seen s;
    assert_int_equal(stream(f, &s), SLUICE_E_FILE_CHANGED);
    assert_int_equal(s.failed, 3); /* tensors 5, 6, 7 */
    /* truncated to nothing: every non-empty tensor fails */
    assert_int_equal(truncate(f->file, 0), 0);
    for (size_t i = 0; i < NT; i++)
        assert_int_equal(load(f, i, NULL), sizes[i] ? SLUICE_E_FILE_CHANGED : SLUICE_OK);
    /* put back as it was: everything loads again (nothing sticks) */
    int fd = open(f->file, O_WRONLY);
    assert_true(fd >= 0);
    unsigned char *all = NULL;
    {
        /* rebuild the file from the shard writer's seed */
        uint64_t seed = 777;
        char *tmp = tu_join(f->dir, "again.safetensors");
        ef_write_shard(tmp, "t", sizes, NT, 5, &seed);
        size_t len = 0;
        all = tu_read_file(tmp, &len);
        assert_int_equal(len, f->file_size);
        unlink(tmp);
        free(tmp);
    }
    assert_int_equal(pwrite(fd, all, (size_t)f->file_size, 0), (ssize_t)f->file_size);
    close(fd);
    free(all);
    all_load(f);
    fx_close(f);
}

/* ---------------------------------------------------------------- extended */

static void extended(int manifest, uint32_t flags)
{
    fx *f = fx_open(manifest, flags);
    int fd = open(f->file, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    char junk[10000];
    memset(junk, 0x5a, sizeof junk);
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    all_load(f);
    fx_close(f);
}

/* ---------------------------------------------------------------- rewritten */

static void rewritten(int manifest, uint32_t flags)
{
    fx *f = fx_open(manifest, flags);
    /* flip one byte in tensors 0 (first chunk), 3 and 7 (the last) */
    const size_t victims[] = {0, 3, 7};
    sluice_tensor *held = NULL;
    assert_int_equal(sluice_acquire_index(f->m, 0, &held), SLUICE_OK);
    for (size_t k = 0; k < 3; k++)
        mf_flip_byte(f->file, f->off[victims[k]] + sizes[victims[k]] / 2);
    for (size_t i = 0; i < NT; i++) {
        int victim = i == 0 || i == 3 || i == 7;
        unsigned char *now = tu_pread_range(f->file, f->off[i], (size_t)sizes[i]);
        /* tensor 0 is held: served from memory, the bytes verified before */
        int rc = load(f, i, i == 0 ? f->ref[0] : now);
        if (victim && manifest && i != 0) {
            if (rc != SLUICE_E_CHECKSUM)
                fail_msg("changed tensor %zu: %s", i, sluice_strerror(rc));
            assert_non_null(strstr(sluice_errmsg(f->m), "SHA-256 mismatch"));
        } else if (rc != SLUICE_OK) {
            fail_msg("tensor %zu: %s: %s", i, sluice_strerror(rc), sluice_errmsg(f->m));
        }
        free(now);
    }
    /* the handle taken before the change still holds the verified bytes;
     * released, the tensor is read again from the file */
    assert_memory_equal(sluice_tensor_data(held), f->ref[0], (size_t)sizes[0]);
    assert_int_equal(sluice_release(held), SLUICE_OK);
    unsigned char *now = tu_pread_range(f->file, f->off[0], (size_t)sizes[0]);
    assert_int_equal(load(f, 0, now), manifest ? SLUICE_E_CHECKSUM : SLUICE_OK);
    free(now);
    /* changed back: everything loads and verifies again */
    for (size_t k = 0; k < 3; k++)
        mf_flip_byte(f->file, f->off[victims[k]] + sizes[victims[k]] / 2);
    all_load(f);
    fx_close(f);
}

/* A new file renamed over the path: the model reads the file it opened. */
static void replaced(int manifest, uint32_t flags)
{
    fx *f = fx_open(manifest, flags);
    char *tmp = tu_join(f->dir, "new.safetensors");
    tu_write_safetensors(tmp, "{\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
                         "abc", 3);
    assert_int_equal(rename(tmp, f->file), 0);
    free(tmp);
    all_load(f);
    fx_close(f);
}

/* ---------------------------------------------------------------- deleted */

static void deleted(int manifest, uint32_t flags)
{
    fx *f = fx_open(manifest, flags);
    assert_int_equal(unlink(f->file), 0);
    all_load(f);
    fx_close(f);
}

/* ---------------------------------------------------------------- the grid */

typedef void (*change_fn)(int manifest, uint32_t flags);

static void grid(change_fn fn)
{
    for (int manifest = 0; manifest < 2; manifest++)
        for (int direct = 0; direct < 2; direct++)
            fn(manifest, direct ? SLUICE_F_DIRECT : 0);
}

static void test_truncated(void **state) { (void)state; grid(truncated); }
static void test_extended(void **state) { (void)state; grid(extended); }
static void test_rewritten(void **state) { (void)state; grid(rewritten); }
static void test_replaced(void **state) { (void)state; grid(replaced); }
static void test_deleted(void **state) { (void)state; grid(deleted); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_extended),
        cmocka_unit_test(test_rewritten),
        cmocka_unit_test(test_replaced),
        cmocka_unit_test(test_deleted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
