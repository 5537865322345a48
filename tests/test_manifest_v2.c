/* test_manifest_v2.c: version 2 manifests. Every kind of header tampering
 * (dtype and shape, offsets swapped between tensors of one size,
 * __metadata__ edited, padding changed) fails the open with a version 2
 * manifest and not with version 1; every new field is read strictly;
 * BLAKE3 digests equal b3sum's on sizes around its chunk and block edges
 * and on every tensor of the real files.
 *
 * The expected digests are computed here independently: SHA-256 with
 * OpenSSL's one-shot call, BLAKE3 by the b3sum program (Debian package
 * b3sum); the BLAKE3 cases skip, saying so, where it is not installed. */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* The model: three tensors, b and c of one size (12 bytes), and a
 * metadata entry; its header padded with spaces to HEADER_LEN bytes so
 * that a rewritten header keeps every data byte where it was. */
#define HEADER_LEN 256
#define DATA_LEN (64 + 12 + 12)

static const char *const plain_header =
    "{\"__metadata__\":{\"k\":\"v\"},"
    "\"a\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
    "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[64,76]},"
    "\"c\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[76,88]}}";

typedef struct fx {
    char *dir, *model, *manifest, *b3tmp;
} fx;

static void write_model(const fx *f, const char *header)
{
    char padded[HEADER_LEN + 1];
    size_t n = strlen(header);
    assert_true(n <= HEADER_LEN);
    memcpy(padded, header, n);
    memset(padded + n, ' ', HEADER_LEN - n);
    padded[HEADER_LEN] = '\0';
    tu_write_safetensors(f->model, padded, NULL, DATA_LEN);
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest, "m.json");
    f->b3tmp = tu_join(f->dir, "bytes.bin");
    write_model(f, plain_header);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, f->manifest);
    free(f->b3tmp);
    free(f);
    return 0;
}

/* SHA-256 of len bytes of path at offset, as hex. */
static void sha_of_range(const char *path, uint64_t offset, size_t len, char hex[65])
{
    unsigned char *p = tu_pread_range(path, offset, len);
    uint8_t d[32];
    mf_sha256(p, len, d);
    mf_hex(d, hex);
    free(p);
}

/* The SHA-256 of tensors a, b and c as the file holds them now. */
static void tensor_hexes(const fx *f, char a[65], char b[65], char c[65])
{
    sha_of_range(f->model, 8 + HEADER_LEN, 64, a);
    sha_of_range(f->model, 8 + HEADER_LEN + 64, 12, b);
    sha_of_range(f->model, 8 + HEADER_LEN + 76, 12, c);
}

/* A version 2 SHA-256 manifest of the model as it is now (digests of its
 * bytes and of its header), with extra text spliced in: tensor_extra
 * after a's entry keys, file_extra after the file entry's keys. */
static void write_v2(const fx *f, const char *tensor_extra, const char *file_extra)
{
    char a[65], b[65], c[65], whole[65], header[65];
    size_t len = 0;
    unsigned char *all = tu_read_file(f->model, &len);
    assert_non_null(all);
    uint8_t d[32];
    mf_sha256(all, len, d);
    mf_hex(d, whole);
    mf_sha256(all, 8 + HEADER_LEN, d);
    mf_hex(d, header);
    free(all);
    tensor_hexes(f, a, b, c);
    mf_buf m = {0};
    mf_addf(&m, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"sha256\",\n"
                " \"tensors\": {\n"
                "  \"a\": {\"digest\": \"%s\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64%s},\n"
                "  \"b\": {\"digest\": \"%s\", \"dtype\": \"F32\", \"shape\": [3], \"nbytes\": 12},\n"
                "  \"c\": {\"digest\": \"%s\", \"dtype\": \"U8\", \"shape\": [12], \"nbytes\": 12}},\n"
                " \"files\": {\"model.safetensors\": {\"digest\": \"%s\", \"size\": %zu, "
                "\"header\": \"%s\"%s}}}\n",
            a, tensor_extra ? tensor_extra : "", b, c, whole, len, header,
            file_extra ? file_extra : "");
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
}

/* The version 1 manifest of the same bytes (tensors only). */
static void write_v1(const fx *f)
{
    char a[65], b[65], c[65];
    tensor_hexes(f, a, b, c);
    mf_buf m = {0};
    mf_addf(&m, "{\"format\": \"sluice-manifest\", \"version\": 1, \"algorithm\": \"sha256\", "
                "\"tensors\": {\"a\": {\"sha256\": \"%s\"}, \"b\": {\"sha256\": \"%s\"}, "
                "\"c\": {\"sha256\": \"%s\"}}}", a, b, c);
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
}

/* Opens the model with the manifest; returns the status and copies the
 * message; the model is kept open in *keep when keep is set and it opened. */
static int open_model(const fx *f, sluice_algorithm alg, uint32_t flags, char *msg, size_t cap,
                      sluice_model **keep)
{
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = f->manifest;
    o.algorithm = alg;
    o.flags = flags;
    sluice_model *m = NULL;
    int rc = sluice_open(f->model, &o, &m);
    if (msg)
        snprintf(msg, cap, "%s", sluice_errmsg(m));
    if (keep && rc == SLUICE_OK) {
        *keep = m;
        return rc;
    }
    sluice_close(m);
    return rc;
}

/* Every tensor acquired and released; the first failure's status. */
static int load_all(sluice_model *m)
{
    for (size_t i = 0; i < sluice_count(m); i++) {
        sluice_tensor *t = NULL;
        int rc = sluice_acquire_index(m, i, &t);
        if (rc != SLUICE_OK)
            return rc;
        sluice_release(t);
    }
    return SLUICE_OK;
}

static void expect_open(const fx *f, int code, ...)
{
    char msg[1024];
    int rc = open_model(f, SLUICE_ALG_SHA256, 0, msg, sizeof msg, NULL);
    if (rc != code)
        fail_msg("expected %d (%s), got %d: %s", code, sluice_strerror(code), rc, msg);
    va_list ap;
    va_start(ap, code);
    for (const char *needle; (needle = va_arg(ap, const char *));)
        if (!strstr(msg, needle))
            fail_msg("message lacks \"%s\": %s", needle, msg);
    va_end(ap);
}

/* ---------------------------------------------------------------- loading */

static void v2_loads_and_reports(void **state)
{
    fx *f = *state;
    write_v2(f, NULL, NULL);
    sluice_model *m = NULL;
    char msg[1024];
    assert_int_equal(open_model(f, SLUICE_ALG_SHA256, 0, msg, sizeof msg, &m), SLUICE_OK);
    assert_int_equal(sluice_manifest_version(m), 2);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_int_equal(sluice_digest_algorithm(m), SLUICE_ALG_SHA256);
    assert_int_equal(load_all(m), SLUICE_OK);
    /* the header digest reported is the one of the bytes on disk */
    uint8_t got[32], want[32];
    unsigned char *head = tu_pread_range(f->model, 0, 8 + HEADER_LEN);
    mf_sha256(head, 8 + HEADER_LEN, want);
    free(head);
    assert_int_equal(sluice_file_header_digest(m, 0, SLUICE_ALG_SHA256, got), SLUICE_OK);
    assert_memory_equal(got, want, 32);
    assert_int_equal(sluice_file_header_digest(m, 1, SLUICE_ALG_SHA256, got), SLUICE_E_INVAL);
    assert_int_equal(sluice_file_header_digest(m, 0, (sluice_algorithm)7, got), SLUICE_E_INVAL);
    assert_int_equal(sluice_file_header_digest(m, 0, SLUICE_ALG_SHA256, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_int_equal(sluice_manifest_version(NULL), -1);
}

/* ---------------------------------------------------------------- tampering */

/* The header rewritten (same length, data untouched): a version 2
 * manifest of the original fails the open with the needles in its
 * message; a version 1 manifest of the original opens. */
static void tampered(fx *f, const char *header, const char *needle1, const char *needle2)
{
    write_model(f, plain_header);
    write_v2(f, NULL, NULL);
    write_model(f, header);
    expect_open(f, SLUICE_E_MANIFEST_MISMATCH, f->manifest, needle1, needle2, NULL);
    write_model(f, plain_header);
    write_v1(f);
    write_model(f, header);
    sluice_model *m = NULL;
    char msg[1024];
    int rc = open_model(f, SLUICE_ALG_SHA256, 0, msg, sizeof msg, &m);
    if (rc != SLUICE_OK)
        fail_msg("a version 1 manifest does not cover the header, yet: %s", msg);
    assert_int_equal(sluice_manifest_version(m), 1);
    sluice_close(m);
}

static void tamper_dtype_and_shape(void **state)
{
    tampered(*state,
             "{\"__metadata__\":{\"k\":\"v\"},"
             "\"a\":{\"dtype\":\"F16\",\"shape\":[8,4],\"data_offsets\":[0,64]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[64,76]},"
             "\"c\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[76,88]}}",
             "tensor \"a\" is F16 [8, 4] (64 bytes) in the header", "BF16 [4, 8] (64 bytes) in the manifest");
}

static void tamper_shape_only(void **state)
{
    tampered(*state,
             "{\"__metadata__\":{\"k\":\"v\"},"
             "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,16],\"data_offsets\":[0,64]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[64,76]},"
             "\"c\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[76,88]}}",
             "BF16 [2, 16]", "BF16 [4, 8]");
}

/* b and c trade places: every tensor's description still matches; only
 * the header digest tells. */
static void tamper_offsets_swapped(void **state)
{
    tampered(*state,
             "{\"__metadata__\":{\"k\":\"v\"},"
             "\"a\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[76,88]},"
             "\"c\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[64,76]}}",
             "the header of", "header changed");
}

static void tamper_metadata(void **state)
{
    tampered(*state,
             "{\"__metadata__\":{\"k\":\"w\"},"
             "\"a\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[64,76]},"
             "\"c\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[76,88]}}",
             "__metadata__", "sha256 digest");
}

/* Only the padding changed: the bytes of the header are what is covered. */
static void tamper_padding(void **state)
{
    fx *f = *state;
    write_v2(f, NULL, NULL);
    unsigned char *head = tu_pread_range(f->model, 8 + HEADER_LEN - 1, 1);
    assert_int_equal(head[0], ' ');
    free(head);
    size_t len = 0;
    unsigned char *all = tu_read_file(f->model, &len);
    all[8 + HEADER_LEN - 1] = '\t'; /* still JSON whitespace */
    tu_write_file(f->model, all, len);
    free(all);
    expect_open(f, SLUICE_E_MANIFEST_MISMATCH, "the header of", NULL);
}

/* The header digest in the manifest right but for one hex digit of
 * byte 16 or of byte 31 (the last): every byte of it is compared. */
static void header_digest_every_byte(void **state)
{
    fx *f = *state;
    static const int digit[] = {32, 63};
    for (size_t k = 0; k < sizeof digit / sizeof digit[0]; k++) {
        write_v2(f, NULL, NULL);
        size_t len = 0;
        char *text = tu_read_file(f->manifest, &len);
        assert_non_null(text);
        char *h = strstr(text, "\"header\": \"");
        assert_non_null(h);
        h += strlen("\"header\": \"");
        h[digit[k]] = h[digit[k]] == '0' ? '1' : '0';
        tu_write_file(f->manifest, text, len);
        free(text);
        expect_open(f, SLUICE_E_MANIFEST_MISMATCH, "the header of", "header changed", NULL);
    }
}

/* A size that is not the file's (the format allows no bytes past the
 * data, so a file of another size has another header: the manifest is
 * what differs here). */
static void file_size_differs(void **state)
{
    fx *f = *state;
    write_v2(f, NULL, NULL);
    size_t len = 0;
    char *text = tu_read_file(f->manifest, &len);
    char *at = strstr(text, "\"size\": 352");
    assert_non_null(at);
    at[strlen("\"size\": 35")] = '3';
    tu_write_file(f->manifest, text, len);
    free(text);
    expect_open(f, SLUICE_E_MANIFEST_MISMATCH, "is 352 bytes, the manifest says 353", NULL);
}

/* IF_PRESENT checks the description of the tensors it lists too. */
static void if_present_checks_descriptions(void **state)
{
    fx *f = *state;
    char a[65];
    sha_of_range(f->model, 8 + HEADER_LEN, 64, a);
    mf_buf m = {0};
    mf_addf(&m, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"sha256\", "
                "\"tensors\": {\"a\": {\"digest\": \"%s\", \"dtype\": \"F16\", \"shape\": [4, 8], "
                "\"nbytes\": 64}}}", a);
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = f->manifest;
    o.verify = SLUICE_VERIFY_IF_PRESENT;
    sluice_model *md = NULL;
    assert_int_equal(sluice_open(f->model, &o, &md), SLUICE_E_MANIFEST_MISMATCH);
    assert_non_null(strstr(sluice_errmsg(md), "BF16 [4, 8] (64 bytes) in the header"));
    sluice_close(md);
}

/* ---------------------------------------------------------------- strictness */

static void strict_fields(void **state)
{
    fx *f = *state;
    /* a's entry with one more key, or the file entry with one more */
    static const struct {
        const char *tensor_extra, *file_extra;
        int code;
        const char *needle;
    } cases[] = {
        {", \"sha256\": \"00\"", NULL, SLUICE_E_MANIFEST_FORMAT, "unknown key \"sha256\""},
        {", \"dtype\": \"BF16\"", NULL, SLUICE_E_MANIFEST_DUPLICATE, "\"dtype\" twice"},
        {NULL, ", \"sha256\": \"00\"", SLUICE_E_MANIFEST_FORMAT, "unknown key \"sha256\""},
        {NULL, ", \"size\": 1", SLUICE_E_MANIFEST_DUPLICATE, "\"size\" twice"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_v2(f, cases[k].tensor_extra, cases[k].file_extra);
        expect_open(f, cases[k].code, cases[k].needle, NULL);
    }
}

/* One whole version 2 manifest per case, from a template whose a entry
 * and file entry are given. */
static void expect_entries(fx *f, const char *a_entry, const char *file_entry, int code,
                           const char *needle)
{
    char b[65], c[65];
    sha_of_range(f->model, 8 + HEADER_LEN + 64, 12, b);
    sha_of_range(f->model, 8 + HEADER_LEN + 76, 12, c);
    mf_buf m = {0};
    mf_addf(&m, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"sha256\",\n"
                " \"tensors\": {\"a\": %s,\n"
                "  \"b\": {\"digest\": \"%s\", \"dtype\": \"F32\", \"shape\": [3], \"nbytes\": 12},\n"
                "  \"c\": {\"digest\": \"%s\", \"dtype\": \"U8\", \"shape\": [12], \"nbytes\": 12}}%s%s}",
            a_entry, b, c, file_entry ? ",\n \"files\": {\"model.safetensors\": " : "",
            file_entry ? file_entry : "");
    if (file_entry)
        mf_addf(&m, "}");
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
    char msg[1024];
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = f->manifest;
    o.verify = SLUICE_VERIFY_IF_PRESENT; /* no file entry needed */
    sluice_model *md = NULL;
    int rc = sluice_open(f->model, &o, &md);
    snprintf(msg, sizeof msg, "%s", sluice_errmsg(md));
    sluice_close(md);
    if (rc != code)
        fail_msg("expected %d (%s), got %d: %s\na: %s\nfile: %s", code, sluice_strerror(code), rc,
                 msg, a_entry, file_entry ? file_entry : "(none)");
    if (needle && !strstr(msg, needle))
        fail_msg("message lacks \"%s\": %s", needle, msg);
}

static void strict_values(void **state)
{
    fx *f = *state;
    char a[65], ok_entry[256], e[512];
    sha_of_range(f->model, 8 + HEADER_LEN, 64, a);
    snprintf(ok_entry, sizeof ok_entry,
             "{\"digest\": \"%s\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64}", a);
    expect_entries(f, ok_entry, NULL, SLUICE_OK, NULL);
    static const struct {
        const char *text; /* @: the digest of a */
        int code;
        const char *needle;
    } cases[] = {
        {"{\"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64, \"x\": \"@\"}",
         SLUICE_E_MANIFEST_FORMAT, "unknown key \"x\""},
        {"{\"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64}", SLUICE_E_MANIFEST_FORMAT,
         "no \"digest\""},
        {"{\"digest\": \"@\", \"shape\": [4, 8], \"nbytes\": 64}", SLUICE_E_MANIFEST_FORMAT,
         "no \"dtype\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"nbytes\": 64}", SLUICE_E_MANIFEST_FORMAT,
         "no \"shape\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, 8]}", SLUICE_E_MANIFEST_FORMAT,
         "no \"nbytes\""},
        {"{\"digest\": \"@\", \"dtype\": \"bf16\", \"shape\": [4, 8], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "\"dtype\" of tensor \"a\" is not a dtype name"},
        {"{\"digest\": \"@\", \"dtype\": 16, \"shape\": [4, 8], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "\"dtype\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": \"4x8\", \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "\"shape\" of tensor \"a\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, -8], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "\"shape\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, 8.5], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "\"shape\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, [8]], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "\"shape\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": \"64\"}",
         SLUICE_E_MANIFEST_FORMAT, "\"nbytes\" of tensor \"a\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 1e300}",
         SLUICE_E_MANIFEST_FORMAT, "\"nbytes\""},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 65}",
         SLUICE_E_MANIFEST_MISMATCH, "(65 bytes) in the manifest"},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [32], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_MISMATCH, "BF16 [32] (64 bytes) in the manifest"},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\", \"shape\": [], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_MISMATCH, "BF16 [] (64 bytes) in the manifest"},
        {"{\"digest\": \"12@\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_DIGEST, "66 characters"},
        {"[\"@\"]", SLUICE_E_MANIFEST_FORMAT, "entry of tensor \"a\" is not an object"},
        /* an escaped NUL in a value: cJSON's string would end there */
        {"{\"digest\": \"@\\u0000zz\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "a string value holds an escaped NUL"},
        {"{\"digest\": \"@\", \"dtype\": \"BF16\\u0000junk\", \"shape\": [4, 8], \"nbytes\": 64}",
         SLUICE_E_MANIFEST_FORMAT, "a string value holds an escaped NUL"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t o = 0;
        for (const char *c = cases[k].text; *c && o + 65 < sizeof e; c++) {
            if (*c == '@') {
                memcpy(e + o, a, 64);
                o += 64;
            } else {
                e[o++] = *c;
            }
        }
        e[o] = '\0';
        expect_entries(f, e, NULL, cases[k].code, cases[k].needle);
    }
    /* 65 dimensions: more than any reader allows */
    mf_buf big = {0};
    mf_addf(&big, "{\"digest\": \"%s\", \"dtype\": \"BF16\", \"nbytes\": 64, \"shape\": [", a);
    for (int d = 0; d < 65; d++)
        mf_addf(&big, "%s1", d ? ", " : "");
    mf_addf(&big, "]}");
    expect_entries(f, big.p, NULL, SLUICE_E_MANIFEST_FORMAT, "at most 64");
    mf_buf_free(&big);

    /* file entries */
    char whole[65], header[65], fe[512];
    size_t len = 0;
    unsigned char *all = tu_read_file(f->model, &len);
    uint8_t d[32];
    mf_sha256(all, len, d);
    mf_hex(d, whole);
    mf_sha256(all, 8 + HEADER_LEN, d);
    mf_hex(d, header);
    free(all);
    snprintf(fe, sizeof fe, "{\"digest\": \"%s\", \"size\": %zu, \"header\": \"%s\"}", whole, len, header);
    expect_entries(f, ok_entry, fe, SLUICE_OK, NULL);
    snprintf(fe, sizeof fe, "{\"digest\": \"%s\", \"size\": %zu}", whole, len);
    expect_entries(f, ok_entry, fe, SLUICE_E_MANIFEST_FORMAT, "no \"header\"");
    snprintf(fe, sizeof fe, "{\"digest\": \"%s\", \"header\": \"%s\"}", whole, header);
    expect_entries(f, ok_entry, fe, SLUICE_E_MANIFEST_FORMAT, "no \"size\"");
    snprintf(fe, sizeof fe, "{\"size\": %zu, \"header\": \"%s\"}", len, header);
    expect_entries(f, ok_entry, fe, SLUICE_E_MANIFEST_FORMAT, "no \"digest\"");
    snprintf(fe, sizeof fe, "{\"digest\": \"%s\", \"size\": %zu, \"header\": \"%.63s\"}", whole, len, header);
    expect_entries(f, ok_entry, fe, SLUICE_E_MANIFEST_DIGEST, "the header of file");
    snprintf(fe, sizeof fe, "{\"digest\": \"%s\", \"size\": -1, \"header\": \"%s\"}", whole, header);
    expect_entries(f, ok_entry, fe, SLUICE_E_MANIFEST_FORMAT, "\"size\" of file");
}

static void strict_algorithm_and_version(void **state)
{
    fx *f = *state;
    mf_write_text(f->manifest, "{\"format\": \"sluice-manifest\", \"version\": 1, \"algorithm\": \"blake3\"}");
    expect_open(f, SLUICE_E_MANIFEST_FORMAT, "version 1: \"sha256\"", NULL);
    mf_write_text(f->manifest, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"BLAKE3\"}");
    expect_open(f, SLUICE_E_MANIFEST_FORMAT, "unsupported algorithm \"BLAKE3\"", NULL);
    mf_write_text(f->manifest, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"sha512\"}");
    expect_open(f, SLUICE_E_MANIFEST_FORMAT, "unsupported algorithm \"sha512\"", NULL);
    mf_write_text(f->manifest, "{\"format\": \"sluice-manifest\", \"version\": 2.5, \"algorithm\": \"sha256\"}");
    expect_open(f, SLUICE_E_MANIFEST_FORMAT, "unsupported version", NULL);
    /* version 2 under REQUIRE: every file listed */
    char a[65], b[65], c[65];
    tensor_hexes(f, a, b, c);
    mf_buf m = {0};
    mf_addf(&m, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"sha256\", \"tensors\": {"
                "\"a\": {\"digest\": \"%s\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64},"
                "\"b\": {\"digest\": \"%s\", \"dtype\": \"F32\", \"shape\": [3], \"nbytes\": 12},"
                "\"c\": {\"digest\": \"%s\", \"dtype\": \"U8\", \"shape\": [12], \"nbytes\": 12}}}", a, b, c);
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
    expect_open(f, SLUICE_E_MANIFEST_MISSING, "has no entry", "model.safetensors", NULL);
    /* an unknown option value */
    sluice_options o;
    sluice_options_init(&o);
    o.algorithm = (sluice_algorithm)2;
    sluice_model *md = NULL;
    assert_int_equal(sluice_open(f->model, &o, &md), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(md), "unknown digest algorithm 2"));
    sluice_close(md);
    assert_string_equal(sluice_algorithm_name(SLUICE_ALG_BLAKE3), "blake3");
    assert_string_equal(sluice_algorithm_name(SLUICE_ALG_SHA256), "sha256");
    assert_null(sluice_algorithm_name((sluice_algorithm)9));
    assert_string_equal(sluice_strerror(SLUICE_E_MANIFEST_MISMATCH), "the header disagrees with the manifest");
}

/* ---------------------------------------------------------------- BLAKE3 */

static int have_b3sum(void)
{
    if (system("b3sum --version >/dev/null 2>&1") == 0 && sluice_algorithm_supported(SLUICE_ALG_BLAKE3))
        return 1;
    fprintf(stderr, "b3sum not installed or no BLAKE3 in this build (apt-get install -y b3sum "
                    "librust-blake3-dev): BLAKE3 cross-checks skipped\n");
    return 0;
}

/* b3sum of each of n files of dir named 0, 1, ... into digests. */
static void b3sum_files(const char *dir, size_t n, uint8_t (*digests)[32])
{
    mf_buf cmd = {0};
    mf_addf(&cmd, "cd '%s' && b3sum --no-names", dir);
    for (size_t i = 0; i < n; i++)
        mf_addf(&cmd, " %zu", i);
    FILE *p = popen(cmd.p, "r");
    assert_non_null(p);
    char line[128];
    for (size_t i = 0; i < n; i++) {
        assert_non_null(fgets(line, sizeof line, p));
        assert_true(strlen(line) >= 64);
        for (int j = 0; j < 32; j++) {
            unsigned v;
            assert_int_equal(sscanf(line + 2 * j, "%2x", &v), 1);
            digests[i][j] = (uint8_t)v;
        }
    }
    assert_int_equal(pclose(p), 0);
    mf_buf_free(&cmd);
}

/* Each tensor of the model at path written to dir/i; returns the count. */
static size_t extract_tensors(sluice_model *m, const char *dir)
{
    size_t n = sluice_count(m);
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &ti), SLUICE_OK);
        char name[32];
        snprintf(name, sizeof name, "%zu", i);
        char *path = tu_join(dir, name);
        unsigned char *bytes = ti.nbytes ? tu_pread_range(ti.file, ti.offset, (size_t)ti.nbytes) : NULL;
        tu_write_file(path, bytes ? (const void *)bytes : "", (size_t)ti.nbytes);
        free(bytes);
        free(path);
    }
    return n;
}

typedef struct vf_seen {
    size_t n;
    uint8_t (*digests)[32];
    int failed;
} vf_seen;

static int on_item(void *user, const struct sluice_verify_item *it)
{
    vf_seen *s = user;
    if (it->kind != SLUICE_VERIFY_ITEM_TENSOR || it->index >= s->n)
        return 0;
    if (it->status != SLUICE_OK || !it->has_digest)
        s->failed++;
    memcpy(s->digests[it->index], it->digest, 32);
    return 0;
}

/* Both paths of the library (the loading pipeline with SLUICE_F_HASH_ALL,
 * and sluice_verify's digest-only pass) give b3sum's digest of every
 * tensor of the model at path. */
static void check_blake3_model(const char *path, const char *scratch)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    o.algorithm = SLUICE_ALG_BLAKE3;
    o.flags = SLUICE_F_HASH_ALL;
    o.pool_bytes = (uint64_t)64 << 20;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    assert_int_equal(sluice_digest_algorithm(m), SLUICE_ALG_BLAKE3);
    size_t n = extract_tensors(m, scratch);
    uint8_t (*want)[32] = calloc(n ? n : 1, 32), (*seen)[32] = calloc(n ? n : 1, 32);
    assert_true(want && seen);
    if (n)
        b3sum_files(scratch, n, want);
    for (size_t i = 0; i < n; i++) {
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        uint8_t got[32];
        assert_int_equal(sluice_tensor_digest(t, got), SLUICE_OK);
        if (memcmp(got, want[i], 32) != 0) {
            char h1[65], h2[65];
            fail_msg("%s tensor %zu: BLAKE3 %s, b3sum %s", path, i, mf_hex(got, h1), mf_hex(want[i], h2));
        }
        sluice_release(t);
    }
    vf_seen s = {.n = n, .digests = seen};
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_DIGEST_ONLY;
    vo.on_item = on_item;
    vo.user = &s;
    assert_int_equal(sluice_verify(m, NULL, 0, &vo, NULL), SLUICE_OK);
    assert_int_equal(s.failed, 0);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(seen[i], want[i], 32);
    free(want);
    free(seen);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Sizes at BLAKE3's block (64) and chunk (1024) edges, and at its SIMD
 * batch sizes, through both of the library's paths. */
static void blake3_equals_b3sum_sizes(void **state)
{
    fx *f = *state;
    if (!have_b3sum())
        skip();
    static const uint64_t sizes[] = {0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 4095, 4097,
                                     16384, 65535, 65536, 65537, (1u << 20) + 1, (8u << 20) + 3};
    enum { N = sizeof sizes / sizeof sizes[0] };
    const char *keys[N];
    char names[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "s%02d", i);
        keys[i] = names[i];
    }
    char *path = tu_join(f->dir, "sizes.safetensors");
    mf_write_model(path, N, keys, sizes);
    char *scratch = tu_join(f->dir, "b3");
    assert_int_equal(mkdir(scratch, 0700), 0);
    check_blake3_model(path, scratch);
    free(scratch);
    free(path);
}

static void blake3_equals_b3sum_real_files(void **state)
{
    fx *f = *state;
    const char *real = tu_real_data();
    if (!real || !have_b3sum())
        skip();
    char **files = NULL;
    size_t n = tu_list_safetensors(real, &files);
    assert_true(n > 0);
    for (size_t k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "real%zu", k);
        char *scratch = tu_join(f->dir, name);
        assert_int_equal(mkdir(scratch, 0700), 0);
        check_blake3_model(files[k], scratch);
        tu_rmtree(scratch);
        free(scratch);
    }
    tu_free_list(files, n);
}

/* A BLAKE3 version 2 manifest, written from b3sum's digests: it loads,
 * and one flipped byte fails that tensor with a BLAKE3 mismatch. */
static void blake3_manifest_loads_and_catches(void **state)
{
    fx *f = *state;
    if (!have_b3sum())
        skip();
    char *scratch = tu_join(f->dir, "b3m");
    assert_int_equal(mkdir(scratch, 0700), 0);
    /* bytes of a, b, c, the header, the whole file as files 0..4 */
    static const uint64_t at[3][2] = {{0, 64}, {64, 12}, {76, 12}};
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "%d", i);
        char *p = tu_join(scratch, name);
        unsigned char *bytes = tu_pread_range(f->model, 8 + HEADER_LEN + at[i][0], (size_t)at[i][1]);
        tu_write_file(p, bytes, (size_t)at[i][1]);
        free(bytes);
        free(p);
    }
    size_t len = 0;
    unsigned char *all = tu_read_file(f->model, &len);
    char *p3 = tu_join(scratch, "3"), *p4 = tu_join(scratch, "4");
    tu_write_file(p3, all, 8 + HEADER_LEN);
    tu_write_file(p4, all, len);
    free(all);
    free(p3);
    free(p4);
    uint8_t d[5][32];
    b3sum_files(scratch, 5, d);
    char h[5][65];
    for (int i = 0; i < 5; i++)
        mf_hex(d[i], h[i]);
    mf_buf m = {0};
    mf_addf(&m, "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"blake3\", \"tensors\": {"
                "\"a\": {\"digest\": \"%s\", \"dtype\": \"BF16\", \"shape\": [4, 8], \"nbytes\": 64},"
                "\"b\": {\"digest\": \"%s\", \"dtype\": \"F32\", \"shape\": [3], \"nbytes\": 12},"
                "\"c\": {\"digest\": \"%s\", \"dtype\": \"U8\", \"shape\": [12], \"nbytes\": 12}},"
                "\"files\": {\"model.safetensors\": {\"digest\": \"%s\", \"size\": %zu, \"header\": \"%s\"}}}",
            h[0], h[1], h[2], h[4], len, h[3]);
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
    sluice_model *md = NULL;
    char msg[1024];
    /* the manifest's algorithm wins over the option */
    assert_int_equal(open_model(f, SLUICE_ALG_SHA256, 0, msg, sizeof msg, &md), SLUICE_OK);
    assert_int_equal(sluice_digest_algorithm(md), SLUICE_ALG_BLAKE3);
    assert_int_equal(load_all(md), SLUICE_OK);
    uint8_t file_digest[32];
    uint64_t size = 0;
    assert_int_equal(sluice_manifest_file(md, 0, file_digest, &size), SLUICE_OK);
    assert_memory_equal(file_digest, d[4], 32);
    /* the whole-file check of `sluice verify --files` uses BLAKE3 too */
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_FILES;
    struct sluice_verify_report rep = {.size = sizeof rep};
    assert_int_equal(sluice_verify(md, NULL, 0, &vo, &rep), SLUICE_OK);
    assert_int_equal(rep.tensors_failed + rep.files_failed, 0);
    assert_int_equal(rep.files_ok, 1);
    sluice_close(md);

    mf_flip_byte(f->model, 8 + HEADER_LEN + 70); /* inside b */
    assert_int_equal(open_model(f, SLUICE_ALG_SHA256, 0, msg, sizeof msg, &md), SLUICE_OK);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(md, "a", &t), SLUICE_OK);
    sluice_release(t);
    assert_int_equal(sluice_acquire(md, "b", &t), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(md), "BLAKE3 mismatch"));
    assert_non_null(strstr(sluice_errmsg(md), h[1]));
    assert_int_equal(sluice_acquire(md, "c", &t), SLUICE_OK);
    sluice_release(t);
    sluice_close(md);
    tu_rmtree(scratch);
    free(scratch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(v2_loads_and_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(tamper_dtype_and_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(tamper_shape_only, setup, teardown),
        cmocka_unit_test_setup_teardown(tamper_offsets_swapped, setup, teardown),
        cmocka_unit_test_setup_teardown(tamper_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(tamper_padding, setup, teardown),
        cmocka_unit_test_setup_teardown(header_digest_every_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(file_size_differs, setup, teardown),
        cmocka_unit_test_setup_teardown(if_present_checks_descriptions, setup, teardown),
        cmocka_unit_test_setup_teardown(strict_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(strict_values, setup, teardown),
        cmocka_unit_test_setup_teardown(strict_algorithm_and_version, setup, teardown),
        cmocka_unit_test_setup_teardown(blake3_equals_b3sum_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(blake3_equals_b3sum_real_files, setup, teardown),
        cmocka_unit_test_setup_teardown(blake3_manifest_loads_and_catches, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
