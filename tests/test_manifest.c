/* test_manifest.c: reading manifests at open: both forms, the sidecar rule,
 * every fault with its own code, and every policy. Nothing here reads
 * tensor bytes, so these tests need only the index. */
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct fx {
    char *dir;
    char *model;     /* dir/model.safetensors: tensors t.0 .. t.3 */
    char *manifest;  /* dir/m.json (not written yet) */
    char hex[4][65]; /* fake digests, one per tensor */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest, "m.json");
    mf_write_simple(f->model, 4, 3);
    for (unsigned i = 0; i < 4; i++)
        mf_fake_digest(i * 40, f->hex[i]);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, f->manifest);
    free(f);
    return 0;
}

/* Opens f->model with the given policy and manifest path; returns the
 * status, the model (closed unless keep) in *out, and copies the message. */
static int open_with(const char *path, sluice_verify_policy policy, const char *manifest,
                     char *msg, size_t msg_size, sluice_model **keep)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = policy;
    o.manifest_path = manifest;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (msg)
        snprintf(msg, msg_size, "%s", sluice_errmsg(m));
    if (keep && rc == SLUICE_OK) {
        *keep = m;
        return rc;
    }
    if (keep)
        *keep = NULL;
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return rc;
}

/* Writes the manifest text and expects open to fail with code, the
 * message holding every needle given (NULL-terminated list). */
static void expect_fault(fx *f, const char *text, int code, ...)
{
    char msg[1024];
    mf_write_text(f->manifest, text);
    int rc = open_with(f->model, SLUICE_VERIFY_DEFAULT, f->manifest, msg, sizeof msg, NULL);
    if (rc != code)
        fail_msg("expected %d (%s), got %d: %s\nmanifest: %s", code, sluice_strerror(code), rc, msg, text);
    assert_non_null(strstr(msg, f->manifest));
    va_list ap;
    va_start(ap, code);
    for (const char *needle; (needle = va_arg(ap, const char *));)
        if (!strstr(msg, needle))
            fail_msg("message lacks \"%s\": %s", needle, msg);
    va_end(ap);
}

static char *flat4(const fx *f)
{
    mf_buf b = {0};
    mf_addf(&b, "{\"t.0\": \"%s\", \"t.1\": \"%s\", \"t.2\": \"%s\", \"t.3\": \"%s\"}",
            f->hex[0], f->hex[1], f->hex[2], f->hex[3]);
    return b.p;
}

/* ---------------------------------------------------------------- forms */

static void flat_form_loads(void **state)
{
    fx *f = *state;
    /* mixed case hex digits are accepted */
    char upper[65];
    strcpy(upper, f->hex[2]);
    for (char *p = upper; *p; p++)
        if (*p >= 'a' && *p <= 'f' && (p - upper) % 2)
            *p = (char)(*p - 'a' + 'A');
    mf_buf b = {0};
    mf_addf(&b, "\xEF\xBB\xBF \n{\"t.3\": \"%s\", \"t.0\": \"%s\",\n \"t.2\": \"%s\", \"t.1\": \"%s\"}\n",
            f->hex[3], f->hex[0], upper, f->hex[1]);
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    sluice_model *m;
    char msg[1024];
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, f->manifest, msg, sizeof msg, &m),
                     SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), f->manifest);
    for (size_t i = 0; i < 4; i++) {
        uint8_t d[32];
        char hex[65];
        assert_int_equal(sluice_manifest_tensor(m, i, d), SLUICE_OK);
        assert_string_equal(sluice_digest_hex(d, hex), f->hex[i]);
    }
    uint8_t d[32];
    assert_int_equal(sluice_manifest_tensor(m, 4, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_file(m, 0, d, NULL), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void structured_form_loads(void **state)
{
    fx *f = *state;
    char fhex[65];
    mf_fake_digest(200, fhex);
    mf_buf b = {0};
    mf_addf(&b, "{\"format\": \"sluice-manifest\", \"version\": 1, \"algorithm\": \"sha256\",\n"
                " \"tensors\": {\"t.0\": {\"sha256\": \"%s\"}, \"t.1\": {\"sha256\": \"%s\"},\n"
                "             \"t.2\": {\"sha256\": \"%s\"}, \"t.3\": {\"sha256\": \"%s\"}},\n"
                " \"files\": {\"model.safetensors\": {\"sha256\": \"%s\", \"size\": 12345}}}\n",
            f->hex[0], f->hex[1], f->hex[2], f->hex[3], fhex);
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    sluice_model *m;
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_REQUIRE, f->manifest, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    uint8_t d[32];
    char hex[65];
    uint64_t size = 0;
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(sluice_manifest_tensor(m, i, d), SLUICE_OK);
        assert_string_equal(sluice_digest_hex(d, hex), f->hex[i]);
    }
    assert_int_equal(sluice_manifest_file(m, 0, d, &size), SLUICE_OK);
    assert_string_equal(sluice_digest_hex(d, hex), fhex);
    assert_int_equal(size, 12345);
    assert_int_equal(sluice_manifest_file(m, 1, d, &size), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* "size" is optional; "tensors" is optional under IF_PRESENT. */
static void structured_optional_parts(void **state)
{
    fx *f = *state;
    char fhex[65];
    mf_fake_digest(7, fhex);
    mf_buf b = {0};
    mf_addf(&b, "{\"files\": {\"model.safetensors\": {\"sha256\": \"%s\"}}, \"algorithm\": \"sha256\","
                " \"version\": 1, \"format\": \"sluice-manifest\"}", fhex);
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    sluice_model *m;
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_IF_PRESENT, f->manifest, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_IF_PRESENT);
    uint8_t d[32];
    uint64_t size = 0;
    assert_int_equal(sluice_manifest_file(m, 0, d, &size), SLUICE_OK);
    assert_true(size == SLUICE_SIZE_UNKNOWN);
    assert_int_equal(sluice_manifest_tensor(m, 0, d), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* A flat manifest may name a tensor "format". */
static void flat_tensor_named_format(void **state)
{
    fx *f = *state;
    const char *keys[] = {"format", "version"};
    uint64_t sizes[] = {4, 4};
    char *model = tu_join(f->dir, "fmt.safetensors");
    mf_write_model(model, 2, keys, sizes);
    mf_buf b = {0};
    mf_addf(&b, "{\"format\": \"%s\", \"version\": \"%s\"}", f->hex[0], f->hex[1]);
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    sluice_model *m;
    char msg[1024];
    assert_int_equal(open_with(model, SLUICE_VERIFY_DEFAULT, f->manifest, msg, sizeof msg, &m), SLUICE_OK);
    uint8_t d[32];
    char hex[65];
    assert_int_equal(sluice_manifest_tensor(m, 1, d), SLUICE_OK);
    assert_string_equal(sluice_digest_hex(d, hex), f->hex[1]);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(model);
}

/* Names with escapes, non-ASCII and an embedded NUL match byte for byte. */
static void escaped_names_match(void **state)
{
    fx *f = *state;
    const char *keys[] = {"a", "a\\u0000b", "q\\\"uote\\\\", "\\u00e9t\\u00e9", "\\ud83d\\ude00", "tab\\t"};
    uint64_t sizes[] = {1, 2, 3, 4, 5, 6};
    char *model = tu_join(f->dir, "esc.safetensors");
    mf_write_model(model, 6, keys, sizes);
    /* the manifest spells some names differently but equivalently */
    const char *mkeys[] = {"a", "a\\u0000b", "q\\\"uote\\u005c", "\xc3\xa9t\xc3\xa9", "\xf0\x9f\x98\x80", "tab\\u0009"};
    char hex[6][65];
    mf_buf b = {0};
    mf_addf(&b, "{");
    for (unsigned i = 0; i < 6; i++) {
        mf_fake_digest(i * 3 + 1, hex[i]);
        mf_addf(&b, "%s\"%s\": \"%s\"", i ? ", " : "", mkeys[i], hex[i]);
    }
    mf_addf(&b, "}");
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    sluice_model *m;
    char msg[1024];
    int rc = open_with(model, SLUICE_VERIFY_DEFAULT, f->manifest, msg, sizeof msg, &m);
    if (rc != SLUICE_OK)
        fail_msg("%d: %s", rc, msg);
    for (size_t i = 0; i < 6; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        uint8_t d[32];
        char got[65];
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        assert_int_equal(sluice_manifest_tensor(m, i, d), SLUICE_OK);
        /* tensor sizes tell which key it was */
        assert_string_equal(sluice_digest_hex(d, got), hex[info.nbytes - 1]);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* "a\u0000c" is not "a" nor "a\u0000b" */
    mf_write_text(f->manifest, "{\"a\\u0000c\": \"0000000000000000000000000000000000000000000000000000000000000000\"}");
    assert_int_equal(open_with(model, SLUICE_VERIFY_IF_PRESENT, f->manifest, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST_UNKNOWN);
    assert_non_null(strstr(msg, "\"a\\x00c\""));
    free(model);
}

/* ---------------------------------------------------------------- sidecar */

static void sidecar_single_file(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->dir, "model.safetensors.manifest.json");
    char *text = flat4(f);
    mf_write_text(side, text);
    free(text);
    sluice_model *m;
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, NULL, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), side);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a broken sidecar is an error, not silently skipped */
    mf_write_text(side, "{\"t.0\": ");
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, NULL, NULL, 0, NULL), SLUICE_E_MANIFEST);
    unlink(side);
    free(side);
}

static void write_sharded(const char *dir)
{
    char *s1 = tu_join(dir, "model-00001-of-00002.safetensors");
    char *s2 = tu_join(dir, "model-00002-of-00002.safetensors");
    char *ix = tu_join(dir, "model.safetensors.index.json");
    const char *k1[] = {"a", "b"}, *k2[] = {"c"};
    uint64_t z1[] = {3, 5}, z2[] = {7};
    mf_write_model(s1, 2, k1, z1);
    mf_write_model(s2, 1, k2, z2);
    mf_write_text(ix, "{\"metadata\": {\"total_size\": 15}, \"weight_map\": {"
                      "\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
                      "\"c\": \"model-00002-of-00002.safetensors\"}}");
    free(s1);
    free(s2);
    free(ix);
}

static void sidecar_directory_and_index(void **state)
{
    fx *f = *state;
    char *dir = tu_join(f->dir, "sharded");
    assert_int_equal(mkdir(dir, 0755), 0);
    write_sharded(dir);
    char *side = tu_join(dir, "sluice.manifest.json");
    char *ix = tu_join(dir, "model.safetensors.index.json");
    char h[3][65], fh[2][65];
    for (unsigned i = 0; i < 3; i++)
        mf_fake_digest(i + 90, h[i]);
    mf_fake_digest(1, fh[0]);
    mf_fake_digest(2, fh[1]);
    mf_buf b = {0};
    mf_addf(&b, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\","
                "\"tensors\":{\"a\":{\"sha256\":\"%s\"},\"b\":{\"sha256\":\"%s\"},\"c\":{\"sha256\":\"%s\"}},"
                "\"files\":{\"model-00002-of-00002.safetensors\":{\"sha256\":\"%s\",\"size\":99},"
                "\"model-00001-of-00002.safetensors\":{\"sha256\":\"%s\",\"size\":98}}}",
            h[0], h[1], h[2], fh[1], fh[0]);
    mf_write_text(side, b.p);
    mf_buf_free(&b);

    char *with_slash = tu_join(dir, "");
    const char *paths[] = {dir, ix, with_slash};
    for (int k = 0; k < 3; k++) {
        sluice_model *m;
        char msg[1024];
        int rc = open_with(paths[k], SLUICE_VERIFY_DEFAULT, NULL, msg, sizeof msg, &m);
        if (rc != SLUICE_OK)
            fail_msg("%s: %d %s", paths[k], rc, msg);
        assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
        assert_non_null(strstr(sluice_manifest_path(m), "sharded/sluice.manifest.json"));
        assert_null(strstr(sluice_manifest_path(m), "//"));
        for (size_t i = 0; i < sluice_file_count(m); i++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            uint8_t d[32];
            char hex[65];
            uint64_t size;
            assert_int_equal(sluice_file_info(m, i, &fi), SLUICE_OK);
            assert_int_equal(sluice_manifest_file(m, i, d, &size), SLUICE_OK);
            int second = strstr(fi.path, "00002-of") != NULL;
            assert_string_equal(sluice_digest_hex(d, hex), fh[second]);
            assert_int_equal(size, second ? 99 : 98);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    free(with_slash);
    free(side);
    free(ix);
    free(dir);
}

/* A directory (or an index.json) whose model is one file F also has
 * F.manifest.json for a sidecar, looked for after DIR/sluice.manifest.json;
 * a directory of two files has no such second sidecar. */
static void sidecar_directory_of_one_file(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->dir, "model.safetensors.manifest.json");
    char *dirside = tu_join(f->dir, "sluice.manifest.json");
    char *text = flat4(f), msg[1024];
    mf_write_text(side, text);
    sluice_model *m;
    assert_int_equal(open_with(f->dir, SLUICE_VERIFY_REQUIRE, NULL, msg, sizeof msg, &m),
                     SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), side);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* both: the directory's comes first (the other is broken, so a read of
     * it would fail the open) */
    mf_write_text(dirside, text);
    mf_write_text(side, "{\"t.0\": ");
    assert_int_equal(open_with(f->dir, SLUICE_VERIFY_REQUIRE, NULL, NULL, 0, &m), SLUICE_OK);
    assert_string_equal(sluice_manifest_path(m), dirside);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* neither: REQUIRE names both, in that order */
    unlink(dirside);
    unlink(side);
    assert_int_equal(open_with(f->dir, SLUICE_VERIFY_REQUIRE, NULL, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST);
    char want[2048];
    snprintf(want, sizeof want, "no sidecar %s nor %s", dirside, side);
    if (!strstr(msg, want))
        fail_msg("message lacks \"%s\": %s", want, msg);
    /* an index.json of one shard: likewise, F being the shard */
    char *ix = tu_join(f->dir, "model.safetensors.index.json");
    mf_write_text(ix, "{\"weight_map\": {\"t.0\": \"model.safetensors\", \"t.1\": "
                      "\"model.safetensors\", \"t.2\": \"model.safetensors\", \"t.3\": "
                      "\"model.safetensors\"}}");
    mf_write_text(side, text);
    assert_int_equal(open_with(ix, SLUICE_VERIFY_REQUIRE, NULL, NULL, 0, &m), SLUICE_OK);
    assert_string_equal(sluice_manifest_path(m), side);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(ix);
    /* two files in the directory: F.manifest.json of one is not the model's */
    char *other = tu_join(f->dir, "zz.safetensors");
    const char *k[] = {"z"};
    uint64_t z[] = {3};
    mf_write_model(other, 1, k, z);
    assert_int_equal(open_with(f->dir, SLUICE_VERIFY_DEFAULT, NULL, NULL, 0, &m), SLUICE_OK);
    assert_null(sluice_manifest_path(m));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(other);
    unlink(side);
    free(other);
    free(ix);
    free(text);
    free(side);
    free(dirside);
}

static void sidecar_absent_policies(void **state)
{
    fx *f = *state;
    char msg[1024];
    sluice_model *m;
    /* DEFAULT: nothing in play, nothing checked */
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, NULL, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_null(sluice_manifest_path(m));
    uint8_t d[32];
    assert_int_equal(sluice_manifest_tensor(m, 0, d), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* IF_PRESENT: likewise */
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_IF_PRESENT, NULL, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* REQUIRE: an error naming the sidecar looked for */
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_REQUIRE, NULL, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST);
    assert_non_null(strstr(msg, "model.safetensors.manifest.json"));
    assert_non_null(strstr(msg, "REQUIRE"));
}

/* OFF reads nothing, not even an explicit path that does not exist. */
static void policy_off_ignores_manifest(void **state)
{
    fx *f = *state;
    sluice_model *m;
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_OFF, "/nonexistent/m.json", NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* nor a sidecar that is broken */
    char *side = tu_join(f->dir, "model.safetensors.manifest.json");
    mf_write_text(side, "not json");
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_OFF, NULL, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(side);
    free(side);
}

static void explicit_path_unreadable(void **state)
{
    fx *f = *state;
    char msg[1024];
    char *missing = tu_join(f->dir, "nope.json");
    const sluice_verify_policy pols[] = {SLUICE_VERIFY_DEFAULT, SLUICE_VERIFY_REQUIRE, SLUICE_VERIFY_IF_PRESENT};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(open_with(f->model, pols[k], missing, msg, sizeof msg, NULL), SLUICE_E_MANIFEST);
        assert_non_null(strstr(msg, missing));
        assert_non_null(strstr(msg, strerror(ENOENT)));
    }
    /* a directory */
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, f->dir, msg, sizeof msg, NULL), SLUICE_E_MANIFEST);
    assert_non_null(strstr(msg, strerror(EISDIR)));
    free(missing);
}

static void policy_require_missing(void **state)
{
    fx *f = *state;
    mf_buf b = {0};
    mf_addf(&b, "{\"t.1\": \"%s\"}", f->hex[1]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_MISSING, "3 of 4", "\"t.0\"", "\"t.2\"", "\"t.3\"", NULL);
    mf_buf_free(&b);
}

/* With many missing, the first ten are named, then "...". */
static void policy_require_missing_many(void **state)
{
    fx *f = *state;
    char *model = tu_join(f->dir, "many.safetensors");
    mf_write_simple(model, 25, 0);
    mf_write_text(f->manifest, "{}");
    char msg[1024];
    assert_int_equal(open_with(model, SLUICE_VERIFY_REQUIRE, f->manifest, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST_MISSING);
    assert_non_null(strstr(msg, "25 of 25"));
    assert_non_null(strstr(msg, "\"t.9\""));
    assert_null(strstr(msg, "\"t.10\""));
    assert_non_null(strstr(msg, "..."));
    free(model);
}

static void policy_if_present_partial(void **state)
{
    fx *f = *state;
    mf_buf b = {0};
    mf_addf(&b, "{\"t.2\": \"%s\"}", f->hex[2]);
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
    sluice_model *m;
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_IF_PRESENT, f->manifest, NULL, 0, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_IF_PRESENT);
    uint8_t d[32];
    assert_int_equal(sluice_manifest_tensor(m, 0, d), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_manifest_tensor(m, 2, d), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* IF_PRESENT still rejects what the model lacks */
    mf_write_text(f->manifest, "{\"zz\": \"0000000000000000000000000000000000000000000000000000000000000000\"}");
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_IF_PRESENT, f->manifest, NULL, 0, NULL),
                     SLUICE_E_MANIFEST_UNKNOWN);
}

/* ---------------------------------------------------------------- faults */

static void fault_not_json(void **state)
{
    fx *f = *state;
    expect_fault(f, "{\"t.0\": \"abc\",\n  oops}", SLUICE_E_MANIFEST, "not JSON", "line 2", "byte", NULL);
    expect_fault(f, "", SLUICE_E_MANIFEST, "not JSON", "empty", NULL);
    expect_fault(f, "{} trailing", SLUICE_E_MANIFEST, "not JSON", NULL);
    expect_fault(f, "{\"t.0\": \"abc\"", SLUICE_E_MANIFEST, "not JSON", NULL);
    /* a raw NUL byte inside the text */
    tu_write_file(f->manifest, "{}\0{\"x\": 1}", 11);
    char msg[1024];
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, f->manifest, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST);
    assert_non_null(strstr(msg, "NUL"));
    assert_non_null(strstr(msg, "byte 2"));
}

static void fault_too_large(void **state)
{
    fx *f = *state;
    int fd = open(f->manifest, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)SLUICE_MAX_MANIFEST_BYTES + 1), 0); /* sparse */
    close(fd);
    char msg[1024];
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, f->manifest, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST);
    assert_non_null(strstr(msg, "limit"));
    unlink(f->manifest);
}

static void fault_not_object(void **state)
{
    fx *f = *state;
    expect_fault(f, "[]", SLUICE_E_MANIFEST_FORMAT, "not an object", NULL);
    expect_fault(f, "\"x\"", SLUICE_E_MANIFEST_FORMAT, "not an object", NULL);
}

static void fault_digest_length(void **state)
{
    fx *f = *state;
    mf_buf b = {0};
    mf_addf(&b, "{\"t.0\": \"%s\", \"t.1\": \"%.63s\"}", f->hex[0], f->hex[1]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DIGEST, "\"t.1\"", "63 characters", "line 1", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "{\"t.0\": \"%s0\"}", f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DIGEST, "\"t.0\"", "65 characters", NULL);
    mf_buf_free(&b);
    expect_fault(f, "{\"t.0\": \"\"}", SLUICE_E_MANIFEST_DIGEST, "0 characters", NULL);
}

static void fault_digest_not_hex(void **state)
{
    fx *f = *state;
    char bad[65];
    strcpy(bad, f->hex[0]);
    bad[17] = 'g';
    mf_buf b = {0};
    mf_addf(&b, "{\"t.0\": \"%s\"}", bad);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DIGEST, "'g'", "position 17", NULL);
    mf_buf_free(&b);
    bad[17] = ' ';
    mf_addf(&b, "{\"t.0\": \"%s\"}", bad);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DIGEST, "position 17", NULL);
    mf_buf_free(&b);
    /* structured form too */
    strcpy(bad, f->hex[0]);
    bad[63] = 'Z';
    mf_addf(&b, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\","
                "\"tensors\":{\"t.0\":{\"sha256\":\"%s\"}}}", bad);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DIGEST, "'Z'", "position 63", NULL);
    mf_buf_free(&b);
}

static void fault_digest_not_string(void **state)
{
    fx *f = *state;
    expect_fault(f, "{\"t.0\": 12}", SLUICE_E_MANIFEST_DIGEST, "\"t.0\"", "a number", NULL);
    expect_fault(f, "{\"t.0\": null}", SLUICE_E_MANIFEST_DIGEST, "null", NULL);
    expect_fault(f, "{\"t.0\": [\"00\"]}", SLUICE_E_MANIFEST_DIGEST, "an array", NULL);
    expect_fault(f, "{\"t.0\": {\"sha256\": \"00\"}}", SLUICE_E_MANIFEST_DIGEST, "an object", NULL);
    expect_fault(f, "{\"t.0\": true}", SLUICE_E_MANIFEST_DIGEST, "a boolean", NULL);
    expect_fault(f, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\","
                    "\"tensors\":{\"t.0\":{\"sha256\":7}}}", SLUICE_E_MANIFEST_DIGEST, "a number", NULL);
}

static void fault_duplicate(void **state)
{
    fx *f = *state;
    mf_buf b = {0};
    mf_addf(&b, "{\"t.0\": \"%s\", \"t.1\": \"%s\",\n\"t.0\": \"%s\"}", f->hex[0], f->hex[1], f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DUPLICATE, "\"t.0\"", "twice", "line 2", NULL);
    mf_buf_free(&b);
    /* the same name spelt with an escape is the same name */
    mf_addf(&b, "{\"t.0\": \"%s\", \"t\\u002e0\": \"%s\"}", f->hex[0], f->hex[1]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DUPLICATE, "\"t.0\"", NULL);
    mf_buf_free(&b);
    const char *head = "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\",";
    mf_addf(&b, "%s\"tensors\":{\"t.2\":{\"sha256\":\"%s\"},\"t.2\":{\"sha256\":\"%s\"}}}", head, f->hex[2], f->hex[2]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DUPLICATE, "\"t.2\"", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"files\":{\"model.safetensors\":{\"sha256\":\"%s\"},\"model.safetensors\":{\"sha256\":\"%s\"}}}",
            head, f->hex[2], f->hex[2]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DUPLICATE, "\"model.safetensors\"", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"tensors\":{},\"tensors\":{}}", head);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DUPLICATE, "\"tensors\"", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"tensors\":{\"t.2\":{\"sha256\":\"%s\",\"sha256\":\"%s\"}}}", head, f->hex[2], f->hex[2]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_DUPLICATE, "\"sha256\" twice", NULL);
    mf_buf_free(&b);
}

/* 20,000 names load fast, and a duplicate at the very end is found. */
static void duplicate_among_many(void **state)
{
    fx *f = *state;
    const size_t n = 20000;
    char *model = tu_join(f->dir, "big.safetensors");
    mf_write_simple(model, n, 0);
    mf_buf b = {0};
    char hex[65];
    mf_addf(&b, "{");
    for (size_t i = 0; i < n; i++) {
        mf_fake_digest((unsigned)i, hex);
        mf_addf(&b, "%s\"t.%zu\": \"%s\"\n", i ? "," : "", i, hex);
    }
    size_t body = b.len;
    mf_addf(&b, "}");
    mf_write_text(f->manifest, b.p);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sluice_model *m;
    assert_int_equal(open_with(model, SLUICE_VERIFY_REQUIRE, f->manifest, NULL, 0, &m), SLUICE_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(dt < 10.0); /* generous under sanitizers; linear time keeps it well under */
    uint8_t d[32];
    char got[65];
    assert_int_equal(sluice_manifest_tensor(m, n - 1, d), SLUICE_OK);
    mf_fake_digest((unsigned)(n - 1), hex);
    assert_string_equal(sluice_digest_hex(d, got), hex);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    b.len = body;
    mf_addf(&b, ",\"t.123\": \"%s\"}", hex);
    mf_write_text(f->manifest, b.p);
    char msg[1024];
    assert_int_equal(open_with(model, SLUICE_VERIFY_REQUIRE, f->manifest, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST_DUPLICATE);
    assert_non_null(strstr(msg, "\"t.123\""));
    assert_non_null(strstr(msg, "line 20001"));
    mf_buf_free(&b);
    free(model);
}

static void fault_unknown_format_version_algorithm(void **state)
{
    fx *f = *state;
    expect_fault(f, "{\"format\": \"other-manifest\", \"version\": 1, \"algorithm\": \"sha256\"}",
                 SLUICE_E_MANIFEST_FORMAT, "format", NULL);
    expect_fault(f, "{\"format\": 3}", SLUICE_E_MANIFEST_FORMAT, "format", NULL);
    expect_fault(f, "{\"format\": \"sluice-manifest\", \"version\": 3, \"algorithm\": \"sha256\"}",
                 SLUICE_E_MANIFEST_FORMAT, "version", NULL);
    expect_fault(f, "{\"format\": \"sluice-manifest\", \"version\": \"1\", \"algorithm\": \"sha256\"}",
                 SLUICE_E_MANIFEST_FORMAT, "version", NULL);
    expect_fault(f, "{\"format\": \"sluice-manifest\", \"algorithm\": \"sha256\"}",
                 SLUICE_E_MANIFEST_FORMAT, "no \"version\"", NULL);
    expect_fault(f, "{\"format\": \"sluice-manifest\", \"version\": 1, \"algorithm\": \"sha512\"}",
                 SLUICE_E_MANIFEST_FORMAT, "algorithm", "\"sha512\"", NULL);
    expect_fault(f, "{\"format\": \"sluice-manifest\", \"version\": 1}",
                 SLUICE_E_MANIFEST_FORMAT, "no \"algorithm\"", NULL);
}

static void fault_bad_structure(void **state)
{
    fx *f = *state;
    const char *head = "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\",";
    mf_buf b = {0};
    mf_addf(&b, "%s\"extra\": 1}", head);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "unknown key \"extra\"", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"tensors\": []}", head);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "\"tensors\" is not an object", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"tensors\": {\"t.0\": \"%s\"}}", head, f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "\"t.0\"", "not an object", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"tensors\": {\"t.0\": {}}}", head);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "no \"sha256\"", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"tensors\": {\"t.0\": {\"sha256\": \"%s\", \"md5\": \"x\"}}}", head, f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "unknown key", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"files\": {\"model.safetensors\": {\"sha256\": \"%s\", \"size\": -1}}}", head, f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "size", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"files\": {\"model.safetensors\": {\"sha256\": \"%s\", \"size\": 1.5}}}", head, f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "size", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "%s\"files\": {\"model.safetensors\": {\"sha256\": \"%s\", \"size\": \"12\"}}}", head, f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_FORMAT, "size", NULL);
    mf_buf_free(&b);
}

static void fault_unknown_names(void **state)
{
    fx *f = *state;
    mf_buf b = {0};
    mf_addf(&b, "{\"t.0\": \"%s\", \"t.9\": \"%s\"}", f->hex[0], f->hex[1]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_UNKNOWN, "tensor \"t.9\"", "not in the model", NULL);
    mf_buf_free(&b);
    mf_addf(&b, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\","
                "\"files\":{\"model-00001-of-00009.safetensors\":{\"sha256\":\"%s\",\"size\":1}}}", f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_UNKNOWN, "file \"model-00001-of-00009.safetensors\"", NULL);
    mf_buf_free(&b);
    /* file keys are base names, not paths */
    mf_addf(&b, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\","
                "\"files\":{\"%s\":{\"sha256\":\"%s\"}}}", f->model, f->hex[0]);
    expect_fault(f, b.p, SLUICE_E_MANIFEST_UNKNOWN, NULL);
    mf_buf_free(&b);
}

/* Every fault above, again with the sidecar instead of manifest_path: the
 * message names the sidecar. */
static void fault_in_sidecar(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->dir, "model.safetensors.manifest.json");
    mf_write_text(side, "{\"t.0\": 5}");
    char msg[1024];
    assert_int_equal(open_with(f->model, SLUICE_VERIFY_DEFAULT, NULL, msg, sizeof msg, NULL),
                     SLUICE_E_MANIFEST_DIGEST);
    assert_non_null(strstr(msg, side));
    unlink(side);
    free(side);
}

static void api_arguments(void **state)
{
    (void)state;
    uint8_t d[32];
    char hex[65];
    assert_int_equal(sluice_verify_mode(NULL), SLUICE_VERIFY_OFF);
    assert_null(sluice_manifest_path(NULL));
    assert_int_equal(sluice_manifest_tensor(NULL, 0, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_file(NULL, 0, d, NULL), SLUICE_E_INVAL);
    for (int i = 0; i < 32; i++)
        d[i] = (uint8_t)(i * 8 + 0xa);
    assert_string_equal(sluice_digest_hex(d, hex),
                        "0a121a222a323a424a525a626a727a828a929aa2aab2bac2cad2dae2eaf2fa02");
    /* a failed model carries no manifest */
    sluice_model *m = NULL;
    assert_int_not_equal(sluice_open("/nonexistent.safetensors", NULL, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_int_equal(sluice_manifest_tensor(m, 0, d), SLUICE_E_INVAL);
    sluice_close(m);
    assert_string_equal(sluice_strerror(SLUICE_E_MANIFEST_MISSING), "tensors without a digest in the manifest");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(flat_form_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(structured_form_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(structured_optional_parts, setup, teardown),
        cmocka_unit_test_setup_teardown(flat_tensor_named_format, setup, teardown),
        cmocka_unit_test_setup_teardown(escaped_names_match, setup, teardown),
        cmocka_unit_test_setup_teardown(sidecar_single_file, setup, teardown),
        cmocka_unit_test_setup_teardown(sidecar_directory_and_index, setup, teardown),
        cmocka_unit_test_setup_teardown(sidecar_directory_of_one_file, setup, teardown),
        cmocka_unit_test_setup_teardown(sidecar_absent_policies, setup, teardown),
        cmocka_unit_test_setup_teardown(policy_off_ignores_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(explicit_path_unreadable, setup, teardown),
        cmocka_unit_test_setup_teardown(policy_require_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(policy_require_missing_many, setup, teardown),
        cmocka_unit_test_setup_teardown(policy_if_present_partial, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_not_json, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_not_object, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_digest_length, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_digest_not_hex, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_digest_not_string, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_duplicate, setup, teardown),
        cmocka_unit_test_setup_teardown(duplicate_among_many, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_unknown_format_version_algorithm, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_bad_structure, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_unknown_names, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_in_sidecar, setup, teardown),
        cmocka_unit_test(api_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
