/* test_header.c: every validation rule of the index, each with a file that
 * breaks it (written here), and the files that must still open. */
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sluice.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct fixture {
    char *dir;
    char *path;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->dir = tu_tmpdir();
    f->path = tu_join(f->dir, "model.safetensors");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

/* Opens path and checks the status and that the message names the file
 * and holds `needle`. Returns the model when open succeeded. */
static sluice_model *open_expect(const char *path, int code, const char *needle)
{
    sluice_options opts;
    sluice_options_init(&opts);
    sluice_model *m = NULL;
    int rc = sluice_open(path, &opts, &m);
    if (rc != code)
        fprintf(stderr, "expected %d (%s), got %d: %s\n", code, sluice_strerror(code), rc, sluice_errmsg(m));
    assert_int_equal(rc, code);
    assert_non_null(m);
    if (code != SLUICE_OK) {
        const char *msg = sluice_errmsg(m);
        if (needle && !strstr(msg, needle))
            fprintf(stderr, "message \"%s\" lacks \"%s\"\n", msg, needle);
        if (needle)
            assert_non_null(strstr(msg, needle));
        assert_int_equal(sluice_count(m), 0);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        return NULL;
    }
    return m;
}

/* Writes header + data_len pattern bytes, expects code and needle. */
static void check(void **state, const char *header, size_t data_len, int code, const char *needle)
{
    fixture *f = *state;
    tu_write_safetensors(f->path, header, NULL, data_len);
    sluice_model *m = open_expect(f->path, code, needle);
    if (m)
        sluice_close(m);
}

static void write_raw(const char *path, const void *bytes, size_t len)
{
    tu_write_file(path, bytes, len);
}

/* ---------------------------------------------------------------- sizes */

static void test_file_shorter_than_8(void **state)
{
    fixture *f = *state;
    write_raw(f->path, "\x02\0\0\0", 4);
    assert_null(open_expect(f->path, SLUICE_E_HEADER_SHORT, "model.safetensors"));
    write_raw(f->path, "", 0);
    assert_null(open_expect(f->path, SLUICE_E_HEADER_SHORT, "shorter"));
}

static void test_header_too_large(void **state)
{
    fixture *f = *state;
    unsigned char buf[16] = {0};
    uint64_t n = SLUICE_MAX_HEADER_BYTES + 1ull;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    write_raw(f->path, buf, sizeof buf);
    assert_null(open_expect(f->path, SLUICE_E_HEADER_TOO_LARGE, "over the limit"));
    memset(buf, 0xff, 8); /* 2^64 - 1 */
    write_raw(f->path, buf, sizeof buf);
    assert_null(open_expect(f->path, SLUICE_E_HEADER_TOO_LARGE, "over the limit"));
}

static void test_header_past_end(void **state)
{
    fixture *f = *state;
    unsigned char buf[8 + 2] = {20, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_raw(f->path, buf, sizeof buf);
    assert_null(open_expect(f->path, SLUICE_E_HEADER_SHORT, "past the end"));
}

static void test_empty_header(void **state)
{
    check(state, "", 0, SLUICE_E_HEADER_JSON, "not valid JSON");
}

/* ---------------------------------------------------------------- UTF-8 and JSON */

static void test_bad_utf8(void **state)
{
    check(state, "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
          SLUICE_E_HEADER_UTF8, "UTF-8");
    check(state, "{\"\xc0\x80\":null}", 0, SLUICE_E_HEADER_UTF8, "UTF-8");      /* overlong NUL */
    check(state, "{\"\xed\xa0\x80\":null}", 0, SLUICE_E_HEADER_UTF8, "UTF-8");  /* surrogate */
    check(state, "{\"\xf4\x90\x80\x80\":null}", 0, SLUICE_E_HEADER_UTF8, "UTF-8"); /* > U+10FFFF */
    check(state, "{\"\xe2\x82\":null}", 0, SLUICE_E_HEADER_UTF8, "UTF-8");      /* truncated */
}

static void test_bad_json(void **state)
{
    static const char *bad[] = {
        "{", "{\"a\":}", "{\"a\":1,}", "{'a':1}", "{} x", "{\"a\":NaN}", "{/*c*/}",
        "{\"a\":01}", "{\"a\":1.}", "{\"a\":\"\\x\"}", "{\"a\":\"\x01\"}", "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\udc00\"}", "{\"a\":tru}", "{\"a\" 1}", "{\"a\":[1 2]}", "{a:1}",
        "\xef\xbb\xbf{}", /* a byte-order mark is not JSON whitespace */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check(state, bad[i], 0, SLUICE_E_HEADER_JSON, "not valid JSON");
}

static void test_deep_nesting(void **state)
{
    char header[400] = "{\"__metadata__\":";
    for (int i = 0; i < 100; i++)
        strcat(header, "[");
    check(state, header, 0, SLUICE_E_HEADER_JSON, "nested too deeply");
}

static void test_not_an_object(void **state)
{
    check(state, "[]", 0, SLUICE_E_HEADER_NOT_OBJECT, "not an object");
    check(state, "\"x\"", 0, SLUICE_E_HEADER_NOT_OBJECT, "not an object");
    check(state, "12", 0, SLUICE_E_HEADER_NOT_OBJECT, "not an object");
    check(state, "null", 0, SLUICE_E_HEADER_NOT_OBJECT, "not an object");
}

static void test_whitespace_around(void **state)
{
    check(state, " \t\r\n{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}  \n ", 2,
          SLUICE_OK, NULL);
}

/* ---------------------------------------------------------------- entries */

static void test_entry_shape_of_entry(void **state)
{
    check(state, "{\"a\":5}", 0, SLUICE_E_ENTRY, "not an object");
    check(state, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SLUICE_E_ENTRY, "\"dtype\" is missing");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, SLUICE_E_ENTRY, "\"shape\" is missing");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, SLUICE_E_ENTRY, "\"data_offsets\" is missing");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
          SLUICE_E_ENTRY, "repeated");
    /* unknown keys are ignored, as the reference does */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":[{}]}}", 1,
          SLUICE_OK, NULL);
}

static void test_dtype(void **state)
{
    check(state, "{\"a\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2, SLUICE_E_DTYPE,
          "unknown dtype \"bf16\"");
    check(state, "{\"a\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16, SLUICE_E_DTYPE, "F128");
    check(state, "{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SLUICE_E_DTYPE, "not a string");
}

/* Every dtype of the reference opens with its exact bit size. */
static void test_every_dtype(void **state)
{
    fixture *f = *state;
    for (int d = 0; d < SLUICE_DTYPE_COUNT_; d++) {
        unsigned bits = sluice_dtype_bits((sluice_dtype)d);
        /* 8 elements fill whole bytes for every size */
        unsigned bytes = bits; /* 8 elements x bits / 8 */
        char header[256];
        snprintf(header, sizeof header, "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[0,%u]}}",
                 sluice_dtype_name((sluice_dtype)d), bytes);
        tu_write_safetensors(f->path, header, NULL, bytes);
        sluice_model *m = open_expect(f->path, SLUICE_OK, NULL);
        struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find(m, "t", &t), SLUICE_OK);
        assert_int_equal(t.dtype, d);
        assert_int_equal(t.nbytes, bytes);
        sluice_close(m);
    }
    assert_int_equal(sluice_dtype_bits(SLUICE_DTYPE_F4), 4);
    assert_int_equal(sluice_dtype_bits(SLUICE_DTYPE_F6_E3M2), 6);
    assert_int_equal(sluice_dtype_bits(SLUICE_DTYPE_C64), 64);
    assert_null(sluice_dtype_name(SLUICE_DTYPE_COUNT_));
}

static void test_packed_partial_bytes(void **state)
{
    check(state, "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, SLUICE_E_SIZE_MISMATCH,
          "12 bits, not a whole number of bytes");
    check(state, "{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
          SLUICE_E_SIZE_MISMATCH, "6 bits");
    check(state, "{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[0,3]}}", 3, SLUICE_OK, NULL);
}

static void test_shape(void **state)
{
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":5,\"data_offsets\":[0,5]}}", 5, SLUICE_E_SHAPE, "not an array");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[\"5\"],\"data_offsets\":[0,5]}}", 5, SLUICE_E_SHAPE,
          "non-number");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[null],\"data_offsets\":[0,5]}}", 5, SLUICE_E_SHAPE,
          "non-number");
    /* scalar and empty tensors */
    check(state, "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, SLUICE_OK, NULL);
    check(state, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,0,7],\"data_offsets\":[0,0]}}", 0, SLUICE_OK, NULL);
}

static void test_integer_literals(void **state)
{
    static const char *bad[] = {"2.0", "2e0", "2E+0", "-0", "-1", "18446744073709551616",
                                "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char header[256];
        snprintf(header, sizeof header, "{\"a\":{\"dtype\":\"U8\",\"shape\":[%s],\"data_offsets\":[0,2]}}", bad[i]);
        check(state, header, 2, SLUICE_E_INTEGER, bad[i]);
        snprintf(header, sizeof header, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,%s]}}", bad[i]);
        check(state, header, 2, SLUICE_E_INTEGER, "data_offsets");
    }
}

static void test_overflow(void **state)
{
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615,2],\"data_offsets\":[0,2]}}", 2,
          SLUICE_E_OVERFLOW, "more than 2^64 elements");
    check(state, "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967295],\"data_offsets\":[0,2]}}", 2,
          SLUICE_E_OVERFLOW, "overflows");
    check(state, "{\"a\":{\"dtype\":\"I16\",\"shape\":[9223372036854775808],\"data_offsets\":[0,2]}}", 2,
          SLUICE_E_OVERFLOW, "overflows");
    /* the largest literal itself is accepted where it fits */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615,0],\"data_offsets\":[0,0]}}", 0,
          SLUICE_OK, NULL);
}

static void test_offsets(void **state)
{
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":2}}", 2, SLUICE_E_OFFSETS, "two integers");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1,2]}}", 2, SLUICE_E_OFFSETS,
          "two integers");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,\"2\"]}}", 2, SLUICE_E_OFFSETS,
          "non-number");
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,0]}}", 2, SLUICE_E_OFFSETS,
          "end before they begin");
}

static void test_size_mismatch_message(void **state)
{
    fixture *f = *state;
    char *path = tu_join(f->dir, "model-00002-of-00002.safetensors");
    tu_write_safetensors(path, "{\"lm_head.weight\":{\"dtype\":\"F16\",\"shape\":[5,3],\"data_offsets\":[0,28]}}",
                         NULL, 28);
    open_expect(path, SLUICE_E_SIZE_MISMATCH,
                "model-00002-of-00002.safetensors: tensor \"lm_head.weight\": shape [5, 3] of F16 needs 30 bytes, "
                "data_offsets give 28");
    free(path);
}

static void test_layout(void **state)
{
    /* hole between tensors */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                 "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 5, SLUICE_E_LAYOUT, "hole");
    /* overlap */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                 "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, SLUICE_E_LAYOUT, "overlaps");
    /* not starting at 0 */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, SLUICE_E_LAYOUT, "hole");
    /* data left over after the last tensor */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3, SLUICE_E_LAYOUT,
          "ends at 2 but the file holds 3");
    /* tensor running past the end of the file */
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2, SLUICE_E_LAYOUT,
          "ends at 4 but the file holds 2");
    /* no tensors but trailing data */
    check(state, "{}", 1, SLUICE_E_LAYOUT, "holds 1");
    /* header order need not match data order; empty tensors anywhere */
    check(state, "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                 "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4, SLUICE_OK, NULL);
}

static void test_duplicate_in_file(void **state)
{
    check(state, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, SLUICE_E_DUPLICATE,
          "tensor \"a\" appears twice");
}

static void test_metadata(void **state)
{
    check(state, "{\"__metadata__\":{\"k\":1}}", 0, SLUICE_E_METADATA, "not a string");
    check(state, "{\"__metadata__\":[]}", 0, SLUICE_E_METADATA, "neither null nor an object");
    check(state, "{\"__metadata__\":\"x\"}", 0, SLUICE_E_METADATA, "neither");
    check(state, "{\"__metadata__\":null,\"__metadata__\":null}", 0, SLUICE_E_METADATA, "repeated");
    check(state, "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, SLUICE_E_METADATA, "repeated");

    fixture *f = *state;
    tu_write_safetensors(f->path, "{\"__metadata__\":{\"format\":\"pt\",\"n\\u0000ul\":\"v\\\"q\"}}", NULL, 0);
    sluice_model *m = open_expect(f->path, SLUICE_OK, NULL);
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, 0, &fi), SLUICE_OK);
    assert_int_equal(fi.metadata_kind, SLUICE_METADATA_OBJECT);
    assert_int_equal(fi.metadata_count, 2);
    assert_string_equal(fi.metadata[0].key, "format");
    assert_string_equal(fi.metadata[0].value, "pt");
    assert_int_equal(fi.metadata[1].key_len, 4);
    assert_memory_equal(fi.metadata[1].key, "n\0ul", 4);
    assert_string_equal(fi.metadata[1].value, "v\"q");
    sluice_close(m);

    tu_write_safetensors(f->path, "{\"__metadata__\":null}", NULL, 0);
    m = open_expect(f->path, SLUICE_OK, NULL);
    sluice_file_info(m, 0, &fi);
    assert_int_equal(fi.metadata_kind, SLUICE_METADATA_NULL);
    sluice_close(m);
    tu_write_safetensors(f->path, "{}", NULL, 0);
    m = open_expect(f->path, SLUICE_OK, NULL);
    sluice_file_info(m, 0, &fi);
    assert_int_equal(fi.metadata_kind, SLUICE_METADATA_ABSENT);
    sluice_close(m);
}

/* Escapes are decoded; a name may hold NUL and any character. */
static void test_names_with_escapes(void **state)
{
    fixture *f = *state;
    tu_write_safetensors(f->path,
                         "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                         "\"\\ud83d\\ude00 \\\"q\\\" \\n\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                         NULL, 3);
    sluice_model *m = open_expect(f->path, SLUICE_OK, NULL);
    assert_int_equal(sluice_count(m), 3);
    struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find_n(m, "a\0b", 3, &t), SLUICE_OK);
    assert_int_equal(t.name_len, 3);
    assert_int_equal(t.data_begin, 0);
    /* the plain-C lookup of "a" finds the other tensor, not the NUL one */
    assert_int_equal(sluice_find(m, "a", &t), SLUICE_OK);
    assert_int_equal(t.data_begin, 2);
    assert_int_equal(sluice_find(m, "\xf0\x9f\x98\x80 \"q\" \n", &t), SLUICE_OK);
    assert_int_equal(t.data_begin, 1);
    assert_int_equal(sluice_find(m, "nope", NULL), SLUICE_E_NOT_FOUND);
    sluice_close(m);
}

/* Hostile sizes: a shape of 300,000 dimensions opens in one pass (it was
 * quadratic once), and a header of millions of JSON values is refused
 * before it can take gigabytes of nodes. */
static void test_huge_shape_and_too_many_values(void **state)
{
    fixture *f = *state;
    size_t dims = 300000;
    char *h = malloc(dims * 2 + 128);
    size_t o = (size_t)sprintf(h, "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1],\"shape\":[");
    for (size_t i = 0; i < dims; i++) {
        h[o++] = '1';
        h[o++] = i + 1 < dims ? ',' : ']';
    }
    strcpy(h + o, "}}");
    tu_write_safetensors(f->path, h, NULL, 1);
    sluice_model *m = open_expect(f->path, SLUICE_OK, NULL);
    struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, "a", &t), SLUICE_OK);
    assert_int_equal(t.ndim, dims);
    assert_int_equal(t.shape[dims - 1], 1);
    sluice_close(m);
    free(h);

    size_t values = ((size_t)1 << 23) + 16;
    h = malloc(values * 2 + 64);
    o = (size_t)sprintf(h, "{\"__metadata__\":[");
    for (size_t i = 0; i < values; i++) {
        h[o++] = '0';
        h[o++] = i + 1 < values ? ',' : ']';
    }
    strcpy(h + o, "}");
    tu_write_safetensors(f->path, h, NULL, 0);
    open_expect(f->path, SLUICE_E_HEADER_JSON, "more JSON values than the reader accepts");
    free(h);
}

/* ---------------------------------------------------------------- index queries */

static void test_index_queries(void **state)
{
    fixture *f = *state;
    tu_write_safetensors(f->path,
                         "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                         NULL, 16);
    sluice_model *m = open_expect(f->path, SLUICE_OK, NULL);
    assert_int_equal(sluice_count(m), 2);
    assert_int_equal(sluice_file_count(m), 1);
    struct sluice_tensor_info t = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, 0, &t), SLUICE_OK); /* data order: b first */
    assert_string_equal(t.name, "b");
    assert_int_equal(sluice_info(m, 1, &t), SLUICE_OK);
    assert_string_equal(t.name, "w");
    assert_int_equal(t.dtype, SLUICE_DTYPE_BF16);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 2);
    assert_int_equal(t.shape[1], 3);
    assert_int_equal(t.nbytes, 12);
    size_t hlen = strlen("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}");
    assert_int_equal(t.offset, 8 + hlen + 4);
    assert_int_equal(t.index, 1);
    assert_string_equal(t.file, f->path);
    assert_int_equal(sluice_info(m, 2, &t), SLUICE_E_INVAL);
    assert_int_equal(sluice_info(m, 0, NULL), SLUICE_E_INVAL);

    /* after open nothing reads the file's header: truncating it is harmless */
    assert_int_equal(truncate(f->path, 3), 0);
    assert_int_equal(sluice_find(m, "w", &t), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open("x", NULL, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_open(NULL, NULL, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "NULL"));
    sluice_close(m);
    assert_int_equal(sluice_options_init(NULL), SLUICE_E_INVAL);
    sluice_options opts;
    sluice_options_init(&opts);
    opts.flags = 0x80000000u;
    assert_int_equal(sluice_open("x", &opts, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "unknown flag"));
    sluice_close(m);
    sluice_options_init(&opts);
    opts.size = 3;
    assert_int_equal(sluice_open("x", &opts, &m), SLUICE_E_INVAL);
    sluice_close(m);
    assert_int_equal(sluice_open("/nonexistent/model.safetensors", NULL, &m), SLUICE_E_NO_FILES);
    assert_non_null(strstr(sluice_errmsg(m), "/nonexistent/model.safetensors"));
    sluice_close(m);
    assert_int_equal(sluice_count(NULL), 0);
    assert_int_equal(sluice_find(NULL, "a", NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(NULL), SLUICE_OK);
    assert_string_equal(sluice_strerror(12345), "unknown status");
    for (int c = 0; c >= -60; c--)
        assert_non_null(sluice_strerror(c));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_file_shorter_than_8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_past_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_utf8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deep_nesting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_an_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_whitespace_around, setup, teardown),
        cmocka_unit_test_setup_teardown(test_entry_shape_of_entry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_packed_partial_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_integer_literals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_size_mismatch_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_in_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_with_escapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_shape_and_too_many_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_queries, setup, teardown),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
