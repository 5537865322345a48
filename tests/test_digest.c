/* test_digest.c: the hashing behind `sluice manifest` (tools/digest.c,
 * over the library's sluice_verify with SLUICE_VF_DIGEST_ONLY),
 * in-process: its digests equal an independent SHA-256 of the same bytes
 * whatever the thread count, with and without whole files, empty tensors
 * and tensors longer than a read included; a file cut short after the
 * model was opened fails exactly the tensors it no longer holds; a shard
 * removed after open is still read through the descriptor opened then. */
#include "digest.h" /* tools/digest.h */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* Empty tensors first, between and last; one tensor longer than the 8 MiB
 * read, so that pieces end inside tensors. */
static const char *const k_single[] = {"z0", "a", "z1", "big", "b", "z2"};
static const uint64_t z_single[] = {0, 5, 0, ((uint64_t)9 << 20) + 7, 3, 0};
static const char *const k_s1[] = {"s1.a", "s1.b"};
static const uint64_t z_s1[] = {100000, 7};
static const char *const k_s2[] = {"s2.a"};
static const uint64_t z_s2[] = {3000001};
static const char *const k_s3[] = {"s3.a", "s3.b", "s3.c"};
static const uint64_t z_s3[] = {1, 0, 65536};

typedef struct fx {
    char *dir, *single, *sharded;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->single = tu_join(f->dir, "single.safetensors");
    mf_write_model(f->single, 6, k_single, z_single);
    f->sharded = tu_join(f->dir, "sharded");
    assert_int_equal(mkdir(f->sharded, 0755), 0);
    const char *const *keys[] = {k_s1, k_s2, k_s3};
    const uint64_t *sizes[] = {z_s1, z_s2, z_s3};
    const size_t counts[] = {2, 1, 3};
    for (size_t s = 0; s < 3; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05zu-of-00003.safetensors", s + 1);
        char *path = tu_join(f->sharded, name);
        mf_write_model(path, counts[s], keys[s], sizes[s]);
        free(path);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->single);
    free(f->sharded);
    free(f);
    return 0;
}

static sluice_model *open_index(const char *path)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s", path, m ? sluice_errmsg(m) : sluice_strerror(rc));
    return m;
}

static void expect_tensor(const sluice_model *m, size_t i, const dg_result *r)
{
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
    if (!r->ok)
        fail_msg("tensor %s: not hashed", info.name);
    uint8_t want[32];
    void *bytes = info.nbytes ? tu_pread_range(info.file, info.offset, (size_t)info.nbytes) : NULL;
    assert_true(bytes || !info.nbytes);
    mf_sha256(bytes ? bytes : "", (size_t)info.nbytes, want);
    free(bytes);
    if (memcmp(want, r->digest, 32) != 0)
        fail_msg("tensor %s: digest differs from an independent SHA-256", info.name);
    assert_int_equal(r->bytes, info.nbytes);
}

static void expect_file(const sluice_model *m, size_t i, const dg_result *r)
{
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, i, &fi), SLUICE_OK);
    assert_true(r->ok);
    size_t len = 0;
    void *all = tu_read_file(fi.path, &len);
    assert_non_null(all);
    uint8_t want[32];
    mf_sha256(all, len, want);
    free(all);
    assert_memory_equal(r->digest, want, 32);
    assert_int_equal(r->bytes, len);
}

/* Every thread count, with and without whole files. */
static void digests_equal_independent_sha256(void **state)
{
    fx *f = *state;
    const char *models[] = {f->single, f->sharded};
    const unsigned threads[] = {1, 2, 3, 8};
    for (size_t mi = 0; mi < 2; mi++) {
        sluice_model *m = open_index(models[mi]);
        for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++)
            for (int with_files = 0; with_files <= 1; with_files++) {
                dg_result *files = NULL, *tensors = NULL;
                assert_int_equal(dg_compute(m, "test", with_files, threads[ti], NULL, &tensors,
                                            &files), 0);
                assert_non_null(tensors);
                assert_non_null(files);
                for (size_t i = 0; with_files && i < sluice_file_count(m); i++)
                    expect_file(m, i, &files[i]);
                for (size_t i = 0; i < sluice_count(m); i++)
                    expect_tensor(m, i, &tensors[i]);
                free(tensors);
                free(files);
            }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
}

/* The single file cut inside "big" after open: z0, a, z1 still hash; big,
 * b and z2 fail (the file ends first); the file digest covers what is
 * left, and its byte count shows the change. */
static void file_cut_short_after_open(void **state)
{
    fx *f = *state;
    const unsigned threads[] = {1, 8};
    for (size_t ti = 0; ti < 2; ti++) {
        mf_write_model(f->single, 6, k_single, z_single);
        sluice_model *m = open_index(f->single);
        struct sluice_tensor_info big = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find(m, "big", &big), SLUICE_OK);
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        assert_int_equal(sluice_file_info(m, 0, &fi), SLUICE_OK);
        uint64_t cut = big.offset + (4u << 20);
        assert_int_equal(truncate(f->single, (off_t)cut), 0);

        dg_result *files = NULL, *tensors = NULL;
        assert_int_equal(dg_compute(m, "test", 1, threads[ti], NULL, &tensors, &files), 3);
        assert_true(files[0].ok);
        assert_int_equal(files[0].bytes, cut);
        assert_true(files[0].bytes != fi.file_size);
        for (size_t i = 0; i < sluice_count(m); i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
            if (info.offset + info.nbytes <= cut && strcmp(info.name, "z2") != 0)
                expect_tensor(m, i, &tensors[i]);
            else if (tensors[i].ok)
                fail_msg("%u threads: tensor %s hashed past the end of the file", threads[ti],
                         info.name);
        }
        free(tensors);
        free(files);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
}

/* A shard removed after open: it is read through the descriptor opened
 * then, like every read of the library, so every digest is still right. */
static void shard_removed_after_open(void **state)
{
    fx *f = *state;
    sluice_model *m = open_index(f->sharded);
    struct sluice_file_info gone = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, 1, &gone), SLUICE_OK);
    size_t len = 0;
    void *copy = tu_read_file(gone.path, &len);
    assert_non_null(copy);
    char *kept = tu_join(f->dir, "kept.safetensors");
    tu_write_file(kept, copy, len);
    free(copy);
    assert_int_equal(unlink(gone.path), 0);
    const unsigned threads[] = {1, 2, 8};
    for (size_t ti = 0; ti < 3; ti++) {
        dg_result *files = NULL, *tensors = NULL;
        assert_int_equal(dg_compute(m, "test", 1, threads[ti], NULL, &tensors, &files), 0);
        for (size_t i = 0; i < sluice_file_count(m); i++) {
            if (i != 1) {
                expect_file(m, i, &files[i]);
                continue;
            }
            size_t klen = 0;
            void *all = tu_read_file(kept, &klen);
            uint8_t want[32];
            mf_sha256(all, klen, want);
            free(all);
            assert_memory_equal(files[i].digest, want, 32);
        }
        for (size_t i = 0; i < sluice_count(m); i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
            if (info.file_index != 1)
                expect_tensor(m, i, &tensors[i]);
            else
                assert_true(tensors[i].ok);
        }
        free(tensors);
        free(files);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(kept);
}

/* A model without tensors: the file still hashes, nothing else happens. */
static void empty_model(void **state)
{
    fx *f = *state;
    char *path = tu_join(f->dir, "empty.safetensors");
    tu_write_safetensors(path, "{}", NULL, 0);
    sluice_model *m = open_index(path);
    dg_result *files = NULL, *tensors = NULL;
    assert_int_equal(dg_compute(m, "test", 1, 0, NULL, &tensors, &files), 0);
    expect_file(m, 0, &files[0]);
    assert_non_null(tensors);
    free(tensors);
    free(files);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(digests_equal_independent_sha256, setup, teardown),
        cmocka_unit_test_setup_teardown(file_cut_short_after_open, setup, teardown),
        cmocka_unit_test_setup_teardown(shard_removed_after_open, setup, teardown),
        cmocka_unit_test_setup_teardown(empty_model, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
