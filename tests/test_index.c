/* test_index.c: models of several files (directory, index.json), and the
 * real-world corpus: every file opens and its index matches its header as
 * an independent JSON reader (cJSON) sees it. */
#include "index/index.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <sluice.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

static const char *SHARD1 = "{\"__metadata__\":{\"format\":\"pt\"},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
static const char *SHARD2 = "{\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}";

static char *make_shards(void)
{
    char *dir = tu_tmpdir();
    char *p1 = tu_join(dir, "model-00001-of-00002.safetensors");
    char *p2 = tu_join(dir, "model-00002-of-00002.safetensors");
    tu_write_safetensors(p1, SHARD1, NULL, 11);
    tu_write_safetensors(p2, SHARD2, NULL, 8);
    free(p1);
    free(p2);
    return dir;
}

static void write_index(const char *dir, const char *name, const char *json)
{
    char *p = tu_join(dir, name);
    tu_write_file(p, json, strlen(json));
    free(p);
}

static int open_code(const char *path, char *msg, size_t msg_size, sluice_model **keep)
{
    sluice_model *m = NULL;
    int rc = sluice_open(path, NULL, &m);
    if (msg)
        snprintf(msg, msg_size, "%s", sluice_errmsg(m));
    if (keep && rc == SLUICE_OK)
        *keep = m;
    else
        sluice_close(m);
    return rc;
}

static const char *GOOD_INDEX = "{\"metadata\":{\"total_size\":27},\"weight_map\":{"
                                "\"a\":\"model-00001-of-00002.safetensors\","
                                "\"b\":\"model-00001-of-00002.safetensors\","
                                "\"c\":\"model-00002-of-00002.safetensors\"},\"other\":[1,2]}";

static void test_directory_without_index(void **state)
{
    (void)state;
    char *dir = make_shards();
    sluice_model *m = NULL;
    assert_int_equal(open_code(dir, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_count(m), 3);
    assert_int_equal(sluice_file_count(m), 2);
    struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, 2, &t), SLUICE_OK);
    assert_string_equal(t.name, "c");
    assert_int_equal(t.file_index, 1);
    assert_non_null(strstr(t.file, "model-00002-of-00002.safetensors"));
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_file_info(m, 0, &fi);
    assert_int_equal(fi.tensor_count, 2);
    assert_int_equal(fi.metadata_kind, SLUICE_METADATA_OBJECT);
    sluice_file_info(m, 1, &fi);
    assert_int_equal(fi.metadata_kind, SLUICE_METADATA_ABSENT);
    sluice_close(m);
    tu_rmtree(dir);
    free(dir);
}

static void test_index_json(void **state)
{
    (void)state;
    char *dir = make_shards();
    write_index(dir, "model.safetensors.index.json", GOOD_INDEX);
    char *json = tu_join(dir, "model.safetensors.index.json");
    sluice_model *m = NULL;
    assert_int_equal(open_code(json, NULL, 0, &m), SLUICE_OK); /* the index path itself */
    assert_int_equal(sluice_count(m), 3);
    sluice_close(m);
    m = NULL;
    assert_int_equal(open_code(dir, NULL, 0, &m), SLUICE_OK); /* the directory, through its index */
    assert_int_equal(sluice_file_count(m), 2);
    sluice_close(m);
    /* a stray shard not in the index is ignored when the index decides */
    char *stray = tu_join(dir, "zzz.safetensors");
    tu_write_safetensors(stray, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", NULL, 1);
    assert_int_equal(open_code(dir, NULL, 0, NULL), SLUICE_OK);
    free(stray);
    free(json);
    tu_rmtree(dir);
    free(dir);
}

static void expect_index_error(const char *index, int code, const char *needle)
{
    char *dir = make_shards();
    write_index(dir, "model.safetensors.index.json", index);
    char msg[1024];
    int rc = open_code(dir, msg, sizeof msg, NULL);
    if (rc != code || !strstr(msg, needle))
        fprintf(stderr, "got %d \"%s\", expected %d with \"%s\"\n", rc, msg, code, needle);
    assert_int_equal(rc, code);
    assert_non_null(strstr(msg, needle));
    tu_rmtree(dir);
    free(dir);
}

static void test_index_errors(void **state)
{
    (void)state;
    expect_index_error("{", SLUICE_E_INDEX, "not valid JSON");
    expect_index_error("{\"metadata\":{}}", SLUICE_E_INDEX, "no \"weight_map\"");
    expect_index_error("{\"weight_map\":[]}", SLUICE_E_INDEX, "no \"weight_map\"");
    expect_index_error("{\"weight_map\":{\"a\":3}}", SLUICE_E_INDEX, "not a file name");
    expect_index_error("{\"weight_map\":{\"a\":\"../x.safetensors\"}}", SLUICE_E_INDEX, "not a file name");
    /* a shard that does not exist */
    expect_index_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"missing.safetensors\"}}",
                       SLUICE_E_INDEX_SHARD, "missing.safetensors");
    /* a tensor absent from its shard */
    expect_index_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\","
                       "\"d\":\"model-00002-of-00002.safetensors\"}}",
                       SLUICE_E_INDEX_MISMATCH, "\"d\" is mapped to model-00002-of-00002.safetensors");
    /* a tensor mapped to the wrong shard */
    expect_index_error("{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\","
                       "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}",
                       SLUICE_E_INDEX_MISMATCH, "lives in model-00001-of-00002.safetensors");
    /* a shard tensor that weight_map does not name */
    expect_index_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"c\":\"model-00002-of-00002.safetensors\"}}",
                       SLUICE_E_INDEX_MISMATCH, "\"b\"");
    /* the same tensor twice */
    expect_index_error("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
                       "\"c\":\"model-00002-of-00002.safetensors\"}}",
                       SLUICE_E_INDEX, "listed twice");
}

static void test_duplicate_across_shards(void **state)
{
    (void)state;
    char *dir = make_shards();
    char *p3 = tu_join(dir, "model-00003.safetensors");
    tu_write_safetensors(p3, "{\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", NULL, 1);
    char msg[1024];
    assert_int_equal(open_code(dir, msg, sizeof msg, NULL), SLUICE_E_DUPLICATE);
    assert_non_null(strstr(msg, "tensor \"c\" is also in"));
    free(p3);
    tu_rmtree(dir);
    free(dir);
}

static void test_directory_cases(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char msg[1024];
    assert_int_equal(open_code(dir, msg, sizeof msg, NULL), SLUICE_E_NO_FILES);
    assert_non_null(strstr(msg, "no .safetensors file"));
    /* one other-named index is used; two are ambiguous */
    char *p = tu_join(dir, "diffusion_pytorch_model.safetensors");
    tu_write_safetensors(p, SHARD2, NULL, 8);
    write_index(dir, "diffusion_pytorch_model.safetensors.index.json",
                "{\"weight_map\":{\"c\":\"diffusion_pytorch_model.safetensors\"}}");
    assert_int_equal(open_code(dir, NULL, 0, NULL), SLUICE_OK);
    write_index(dir, "other.safetensors.index.json", "{\"weight_map\":{}}");
    assert_int_equal(open_code(dir, msg, sizeof msg, NULL), SLUICE_E_INDEX);
    assert_non_null(strstr(msg, "several"));
    /* without an index, one bad shard fails the directory, naming it */
    char *idx1 = tu_join(dir, "other.safetensors.index.json");
    char *idx2 = tu_join(dir, "diffusion_pytorch_model.safetensors.index.json");
    char *bad = tu_join(dir, "b.safetensors");
    remove(idx1);
    remove(idx2);
    tu_write_file(bad, "xx", 2);
    assert_int_equal(open_code(dir, msg, sizeof msg, NULL), SLUICE_E_HEADER_SHORT);
    assert_non_null(strstr(msg, "b.safetensors"));
    free(bad);
    free(idx2);
    free(idx1);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* A FIFO where a shard or a sidecar manifest should be must not hang open. */
static void test_fifo_does_not_block(void **state)
{
    (void)state;
    char *dir = make_shards();
    char *fifo = tu_join(dir, "sluice.manifest.json");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    char msg[1024];
    int rc = open_code(dir, msg, sizeof msg, NULL);
    assert_int_equal(rc, SLUICE_E_MANIFEST); /* read as empty: not JSON */
    remove(fifo);
    free(fifo);
    fifo = tu_join(dir, "model-00003-of-00003.safetensors");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    rc = open_code(dir, msg, sizeof msg, NULL);
    assert_int_equal(rc, SLUICE_E_IO);
    assert_non_null(strstr(msg, "not a regular file"));
    free(fifo);
    tu_rmtree(dir);
    free(dir);
}

static void test_empty_weight_map(void **state)
{
    (void)state;
    expect_index_error("{\"weight_map\":{}}", SLUICE_E_INDEX, "weight_map is empty");
}

/* ---------------------------------------------------------------- real files */

static const char *dtype_of(const struct sluice_tensor_info *t)
{
    return sluice_dtype_name(t->dtype);
}

/* Compares the index of the file at path with its header read by cJSON. */
/* ---------------------------------------------------------------- a file changing during open */

typedef struct change {
    sl_index_stage stage;     /* when to act */
    const void *bytes;        /* rewrite the file in place with these (same inode) */
    size_t len;
    off_t truncate_to;        /* or, when bytes is NULL, truncate to this */
    int calls;
} change;

static void change_file(void *ctx, sl_index_stage stage, const char *path)
{
    change *c = ctx;
    if (stage != c->stage)
        return;
    c->calls++;
    if (c->bytes) {
        int fd = open(path, O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, c->bytes, c->len, 0), (ssize_t)c->len);
        close(fd);
    } else {
        assert_int_equal(truncate(path, c->truncate_to), 0);
    }
}

/* A writer rewrites the header in place right after open read it: the
 * index is the one of the bytes read and validated, not of the new ones
 * (before: the header was mapped and parsed through the mapping, so later
 * passes saw the writer's bytes). */
static void test_header_rewritten_during_open(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *path = tu_join(dir, "m.safetensors");
    const char *h1 = "{\"aaaa\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    const char *h2 = "{\"bbbb\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    assert_int_equal(strlen(h1), strlen(h2));
    tu_write_safetensors(path, h1, NULL, 4);
    size_t len = 0;
    void *first = tu_read_file(path, &len);
    tu_write_safetensors(path, h2, NULL, 4);
    void *second = tu_read_file(path, &len);
    tu_write_safetensors(path, h1, NULL, 4);

    change c = {.stage = SL_INDEX_AFTER_HEADER_READ, .bytes = second, .len = len};
    sl_index_hooks hooks = {change_file, &c};
    sl_index ix;
    sl_err err = {0};
    assert_int_equal(sl_index_open_hooked(&ix, path, &hooks, &err), SLUICE_OK);
    assert_int_equal(c.calls, 1);
    assert_int_equal(ix.ntensors, 1);
    assert_string_equal(ix.tensors[0].name, "aaaa");
    assert_int_equal(ix.tensors[0].dtype, SLUICE_DTYPE_U8);
    assert_int_equal(ix.tensors[0].nbytes, 4);
    assert_int_equal(ix.tensors[0].shape[0], 4);
    assert_null(ix.hooks);
    sl_index_free(&ix);

    /* the file now holds the second header: a fresh open sees it */
    assert_int_equal(sl_index_open(&ix, path, &err), SLUICE_OK);
    assert_string_equal(ix.tensors[0].name, "bbbb");
    sl_index_free(&ix);
    free(first);
    free(second);
    tu_rmtree(dir);
    free(dir);
    free(path);
}

/* The file is cut after its size was taken, before the header is read:
 * a clean SLUICE_E_FILE_CHANGED, never SIGBUS. The header spans several
 * pages, so that a mapping of it would fault on the pages past the new
 * end (as it did before). */
static void test_truncated_during_open(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *path = tu_join(dir, "m.safetensors");
    char header[12288];
    const char *entry = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}";
    size_t el = strlen(entry);
    memcpy(header, entry, el);
    memset(header + el, ' ', sizeof header - el - 2);
    header[sizeof header - 2] = '}';
    header[sizeof header - 1] = '\0';
    const off_t cuts[] = {16, 4, 0, 8 + 4096};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        tu_write_safetensors(path, header, NULL, 4);
        change c = {.stage = SL_INDEX_AFTER_STAT, .truncate_to = cuts[k]};
        sl_index_hooks hooks = {change_file, &c};
        sl_index ix;
        sl_err err = {0};
        assert_int_equal(sl_index_open_hooked(&ix, path, &hooks, &err), SLUICE_E_FILE_CHANGED);
        assert_int_equal(c.calls, 1);
        assert_non_null(strstr(err.msg, "shrank while being opened"));
        assert_non_null(strstr(err.msg, path));
        assert_int_equal(ix.ntensors, 0);
        sl_index_free(&ix);
    }
    /* untouched, it opens */
    tu_write_safetensors(path, header, NULL, 4);
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(path, NULL, &m), SLUICE_OK);
    assert_int_equal(sluice_count(m), 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
    free(path);
}

static void compare_with_header(sluice_model *m, const char *path, size_t file_index)
{
    size_t len;
    unsigned char *bytes = tu_read_file(path, &len);
    assert_non_null(bytes);
    assert_true(len >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | bytes[i];
    cJSON *root = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)n);
    assert_non_null(root);
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, file_index, &fi), SLUICE_OK);
    assert_int_equal(fi.header_bytes, n);
    assert_int_equal(fi.file_size, len);
    size_t count = 0;
    for (cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (cJSON_IsNull(e))
                assert_int_equal(fi.metadata_kind, SLUICE_METADATA_NULL);
            else
                assert_int_equal(fi.metadata_count, (size_t)cJSON_GetArraySize(e));
            continue;
        }
        count++;
        struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find(m, e->string, &t), SLUICE_OK);
        assert_int_equal(t.file_index, file_index);
        assert_string_equal(dtype_of(&t), cJSON_GetObjectItem(e, "dtype")->valuestring);
        cJSON *shape = cJSON_GetObjectItem(e, "shape");
        assert_int_equal(t.ndim, (uint32_t)cJSON_GetArraySize(shape));
        for (uint32_t k = 0; k < t.ndim; k++)
            assert_int_equal(t.shape[k], (uint64_t)cJSON_GetArrayItem(shape, (int)k)->valuedouble);
        cJSON *off = cJSON_GetObjectItem(e, "data_offsets");
        assert_int_equal(t.data_begin, (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble);
        assert_int_equal(t.data_end, (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble);
        assert_int_equal(t.offset, 8 + n + t.data_begin);
        assert_int_equal(t.nbytes, t.data_end - t.data_begin);
    }
    assert_int_equal(fi.tensor_count, count);
    cJSON_Delete(root);
    free(bytes);
}

static void test_real_files(void **state)
{
    (void)state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char **files;
    size_t n = tu_list_safetensors(real, &files);
    assert_true(n >= 10);
    for (size_t i = 0; i < n; i++) {
        sluice_model *m = NULL;
        int rc = sluice_open(files[i], NULL, &m);
        if (rc != SLUICE_OK)
            fprintf(stderr, "%s: %s\n", files[i], sluice_errmsg(m));
        assert_int_equal(rc, SLUICE_OK);
        compare_with_header(m, files[i], 0);
        /* model order is data order within the file */
        for (size_t k = 1; k < sluice_count(m); k++) {
            struct sluice_tensor_info a = SLUICE_TENSOR_INFO_INIT, b = SLUICE_TENSOR_INFO_INIT;
            sluice_info(m, k - 1, &a);
            sluice_info(m, k, &b);
            assert_true(a.data_end <= b.data_begin);
        }
        sluice_close(m);
    }
    tu_free_list(files, n);
}

static void test_real_sharded(void **state)
{
    (void)state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char *dir = tu_join(real, "SafeTensors.jl__sharded");
    char *json = tu_join(dir, "model.safetensors.index.json");
    const char *paths[] = {dir, json};
    for (int p = 0; p < 2; p++) {
        sluice_model *m = NULL;
        assert_int_equal(sluice_open(paths[p], NULL, &m), SLUICE_OK);
        assert_int_equal(sluice_count(m), 36);
        assert_int_equal(sluice_file_count(m), 6);
        uint64_t total = 0;
        for (size_t i = 0; i < sluice_count(m); i++) {
            struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
            sluice_info(m, i, &t);
            total += t.nbytes;
        }
        assert_int_equal(total, 4305); /* the index's metadata.total_size */
        char **files;
        size_t n = tu_list_safetensors(dir, &files);
        assert_int_equal(n, 6);
        for (size_t i = 0; i < n; i++)
            compare_with_header(m, files[i], i);
        tu_free_list(files, n);
        sluice_close(m);
    }
    free(json);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_directory_without_index),
        cmocka_unit_test(test_index_json),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_duplicate_across_shards),
        cmocka_unit_test(test_directory_cases),
        cmocka_unit_test(test_fifo_does_not_block),
        cmocka_unit_test(test_empty_weight_map),
        cmocka_unit_test(test_header_rewritten_during_open),
        cmocka_unit_test(test_truncated_during_open),
        cmocka_unit_test(test_real_files),
        cmocka_unit_test(test_real_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
