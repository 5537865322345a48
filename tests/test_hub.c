/* test_hub.c: a Hugging Face Hub cache snapshot verified with no setup
 * (src/api/hub.c; "Hub snapshots" in sluice.h). A fake Hub cache is built
 * here: models--org--name/blobs/<SHA-256> holding the file,
 * snapshots/REV/model.safetensors a symlink to ../../blobs/<SHA-256>,
 * refs/main naming REV. Checked: a clean snapshot verified against its
 * blob's name (state SLUICE_VERIFIED_PUBLISHER_DIGEST) and its manifest
 * derived into the cache directory; a flipped byte found at the first
 * open, naming the file and both digests; the second open reading only
 * the acquired tensor's bytes (the derived manifest used), and a byte
 * flipped after the derivation caught by that tensor and by sluice_verify
 * of the file; a damaged derived manifest derived again; an explicit
 * manifest winning; trusted keys failing closed; what is not a snapshot
 * left unverified; a sharded snapshot (index.json), a derived manifest
 * per shard; and the command (`sluice verify --files`). */
#include "util.h"

#include "base/digest.h"
#include "base/error.h"
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

#include "tool_run.h"

#define BIG ((size_t)(17u << 20) + 5) /* two 16 MiB chunks, the second short */
#define REV "0123456789abcdef0123456789abcdef01234567"

typedef struct hub {
    char *root;     /* the temporary directory */
    char *cache;    /* root/cache: the sluice cache directory */
    char *repo;     /* root/hub/models--org--name */
    char *snap;     /* repo/snapshots/REV */
    char *file;     /* snap/model.safetensors (the symlink) */
    char *blob;     /* repo/blobs/HEX */
    char hex[65];   /* the blob's name */
    char *derived;  /* cache/derived/sha256/HEX.manifest.json */
} hub;

static char header[256];

static void sha256_file(const char *path, char hex[65])
{
    size_t n = 0;
    void *data = tu_read_file(path, &n);
    assert_non_null(data);
    uint8_t d[32];
    assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, data, n, d), 0);
    sl_hex_digest(hex, d);
    free(data);
}

static void mkdir_ok(const char *path)
{
    assert_true(mkdir(path, 0755) == 0 || errno == EEXIST);
}

/* The fake Hub cache of one model, its file named by its SHA-256. */
static void hub_make(hub *h)
{
    memset(h, 0, sizeof *h);
    h->root = tu_tmpdir();
    h->cache = tu_join(h->root, "cache");
    char *hubdir = tu_join(h->root, "hub");
    mkdir_ok(hubdir);
    h->repo = tu_join(hubdir, "models--org--name");
    mkdir_ok(h->repo);
    char *blobs = tu_join(h->repo, "blobs"), *snaps = tu_join(h->repo, "snapshots"),
         *refs = tu_join(h->repo, "refs");
    mkdir_ok(blobs);
    mkdir_ok(snaps);
    mkdir_ok(refs);
    char *main_ref = tu_join(refs, "main");
    tu_write_file(main_ref, REV, strlen(REV));
    h->snap = tu_join(snaps, REV);
    mkdir_ok(h->snap);
    snprintf(header, sizeof header,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"big\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[16,%zu]}}",
             BIG, 16 + BIG);
    char *tmp = tu_join(h->root, "download.tmp");
    tu_write_safetensors(tmp, header, NULL, 16 + BIG);
    sha256_file(tmp, h->hex);
    h->blob = tu_join(blobs, h->hex);
    assert_int_equal(rename(tmp, h->blob), 0);
    h->file = tu_join(h->snap, "model.safetensors");
    char target[128];
    snprintf(target, sizeof target, "../../blobs/%s", h->hex);
    assert_int_equal(symlink(target, h->file), 0);
    char rel[128];
    snprintf(rel, sizeof rel, "derived/sha256/%s.manifest.json", h->hex);
    h->derived = tu_join(h->cache, rel);
    free(tmp);
    free(main_ref);
    free(blobs);
    free(snaps);
    free(refs);
    free(hubdir);
}

static void hub_free(hub *h)
{
    tu_rmtree(h->root);
    free(h->root);
    free(h->cache);
    free(h->repo);
    free(h->snap);
    free(h->file);
    free(h->blob);
    free(h->derived);
}

static int open_hub(const hub *h, const char *path, sluice_model **m)
{
    sluice_options o;
    sluice_options_init(&o);
    o.cache_dir = h->cache;
    o.pool_bytes = 64u << 20;
    return sluice_open(path, &o, m);
}

/* Flips one byte of the blob, inside tensor "big" (its second chunk). */
static void flip(const hub *h)
{
    FILE *f = fopen(h->blob, "r+b");
    assert_non_null(f);
    long at = 8 + (long)strlen(header) + 16 + (17l << 20);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    assert_int_equal(fclose(f), 0);
}

static void acquire_equal(sluice_model *m, const hub *h, const char *name)
{
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, name, &t), SLUICE_OK);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, name, &ti), SLUICE_OK);
    void *want = tu_pread_range(h->blob, ti.offset, ti.nbytes);
    assert_memory_equal(sluice_tensor_data(t), want, ti.nbytes);
    free(want);
    assert_int_equal(sluice_release(t), SLUICE_OK);
}

/* ---------------------------------------------------------------- tests */

static void test_clean_snapshot_verified(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    const char *paths[2] = {h.snap, h.file};
    for (int k = 0; k < 2; k++) {
        sluice_model *m = NULL;
        assert_int_equal(open_hub(&h, paths[k], &m), SLUICE_OK);
        const char *where = NULL;
        assert_int_equal(sluice_verify_state(m, &where), SLUICE_VERIFIED_PUBLISHER_DIGEST);
        assert_non_null(where);
        assert_non_null(strstr(where, h.derived));
        assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
        assert_int_equal(sluice_manifest_version(m), 2);
        uint8_t d[32];
        char hex[65];
        assert_int_equal(sluice_manifest_file(m, 0, d, NULL), SLUICE_OK);
        assert_string_equal(sl_hex_digest(hex, d), h.hex);
        uint64_t cb = 0;
        uint32_t count = 0;
        assert_int_equal(sluice_manifest_chunks(m, 1, &cb, &count), SLUICE_OK);
        assert_int_equal(cb, 16u << 20);
        assert_int_equal(count, 2);
        acquire_equal(m, &h, "a");
        acquire_equal(m, &h, "big");
        struct sluice_stats st = {.size = sizeof st};
        assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
        assert_int_equal(st.unverified, 0);
        assert_int_equal(st.checksum_failures, 0);
        sluice_verify_options vo;
        sluice_verify_options_init(&vo);
        vo.flags = SLUICE_VF_FILES;
        struct sluice_verify_report r = {.size = sizeof r};
        assert_int_equal(sluice_verify(m, NULL, 0, &vo, &r), SLUICE_OK);
        assert_int_equal(r.files_ok, 1);
        assert_int_equal(r.tensors_ok, 2);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        /* derived at the first open, kept in the cache directory */
        struct stat st2;
        assert_int_equal(stat(h.derived, &st2), 0);
    }
    hub_free(&h);
}

static void test_flipped_byte_found_first_open(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    flip(&h);
    char got[65];
    sha256_file(h.blob, got);
    sluice_model *m = NULL;
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_E_CHECKSUM);
    const char *msg = sluice_errmsg(m);
    assert_non_null(strstr(msg, "model.safetensors"));
    assert_non_null(strstr(msg, h.hex));
    assert_non_null(strstr(msg, got));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    struct stat st;
    assert_int_equal(stat(h.derived, &st), -1); /* nothing derived from bad bytes */
    hub_free(&h);
}

typedef struct items {
    int failed;
    char message[1024];
} items;

static int on_item(void *user, const struct sluice_verify_item *it)
{
    items *s = user;
    if (it->status != SLUICE_OK && it->kind == SLUICE_VERIFY_ITEM_FILE) {
        s->failed++;
        snprintf(s->message, sizeof s->message, "%s", it->message);
    }
    return 0;
}

static void test_second_open_lazy(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    sluice_model *m = NULL;
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the second open: the derived manifest, and only "a"'s 16 bytes read */
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    const char *plan[1] = {"a"}; /* no read-ahead past it */
    assert_int_equal(sluice_prefetch(m, plan, 1), SLUICE_OK);
    acquire_equal(m, &h, "a");
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_true(st.bytes_read >= 16);
    assert_true(st.bytes_read < 1u << 20);
    assert_int_equal(st.bytes_hashed, 16);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* a byte flipped after the derivation: the open is cheap and passes,
     * the tensor holding it fails, and so does the file's check */
    flip(&h);
    char got[65];
    sha256_file(h.blob, got);
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
    acquire_equal(m, &h, "a");
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_E_CHECKSUM);
    assert_null(t);
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS;
    items s = {0};
    vo.on_item = on_item;
    vo.user = &s;
    assert_int_equal(sluice_verify(m, NULL, 0, &vo, NULL), SLUICE_E_CHECKSUM);
    assert_int_equal(s.failed, 1);
    assert_non_null(strstr(s.message, "model.safetensors"));
    assert_non_null(strstr(s.message, h.hex));
    assert_non_null(strstr(s.message, got));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    hub_free(&h);
}

static void test_damaged_derived_manifest(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    sluice_model *m = NULL;
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* another file's manifest under this key, then no JSON at all: each is
     * derived again and replaced */
    const char *bad[2] = {"{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": "
                          "\"sha256\", \"tensors\": {}, \"files\": {}}",
                          "not json"};
    for (int k = 0; k < 2; k++) {
        tu_write_file(h.derived, bad[k], strlen(bad[k]));
        assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
        assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
        acquire_equal(m, &h, "big");
        assert_int_equal(sluice_close(m), SLUICE_OK);
        size_t n = 0;
        char *text = tu_read_file(h.derived, &n);
        assert_non_null(text);
        assert_non_null(strstr(text, h.hex));
        free(text);
    }
    hub_free(&h);
}

static void test_explicit_manifest_wins(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    /* a flat manifest of both tensors, named by manifest_path */
    char da[65], db[65], text[256];
    void *a = tu_pread_range(h.blob, 8 + strlen(header), 16);
    void *b = tu_pread_range(h.blob, 8 + strlen(header) + 16, BIG);
    uint8_t d[32];
    assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, a, 16, d), 0);
    sl_hex_digest(da, d);
    assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, b, BIG, d), 0);
    sl_hex_digest(db, d);
    free(a);
    free(b);
    snprintf(text, sizeof text, "{\"a\": \"%s\", \"big\": \"%s\"}", da, db);
    char *mf = tu_join(h.root, "mine.json");
    tu_write_file(mf, text, strlen(text));
    sluice_options o;
    sluice_options_init(&o);
    o.cache_dir = h.cache;
    o.manifest_path = mf;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(h.snap, &o, &m), SLUICE_OK);
    const char *where = NULL;
    assert_int_equal(sluice_verify_state(m, &where), SLUICE_VERIFIED);
    assert_string_equal(where, mf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the sidecar too */
    char *side = tu_join(h.snap, "model.safetensors.manifest.json");
    tu_write_file(side, text, strlen(text));
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, &where), SLUICE_VERIFIED);
    assert_string_equal(where, side);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    struct stat st;
    assert_int_equal(stat(h.derived, &st), -1); /* nothing derived */
    free(side);
    free(mf);
    hub_free(&h);
}

static void test_trusted_keys_fail_closed(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    char *key = tu_join(h.root, "trusted.pub");
    const char *pem = "-----BEGIN PUBLIC KEY-----\n"
                      "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n"
                      "-----END PUBLIC KEY-----\n";
    tu_write_file(key, pem, strlen(pem));
    const char *keys[1] = {key};
    sluice_options o;
    sluice_options_init(&o);
    o.cache_dir = h.cache;
    o.trusted_keys = keys;
    o.ntrusted_keys = 1;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(h.snap, &o, &m), SLUICE_E_SIGNATURE);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(key);
    hub_free(&h);
}

static void test_not_a_snapshot(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    /* a plain copy of the file: no blob behind it */
    char *copy_dir = tu_join(h.root, "copy");
    mkdir_ok(copy_dir);
    char *copy = tu_join(copy_dir, "model.safetensors");
    tu_copy_file(h.blob, copy);
    sluice_model *m = NULL;
    assert_int_equal(open_hub(&h, copy_dir, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_UNVERIFIED_NO_MANIFEST);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a blob not named by 64 hex digits (a Git SHA-1) */
    char *odd = tu_join(h.repo, "blobs/0123456789abcdef0123456789abcdef01234567");
    assert_int_equal(rename(h.blob, odd), 0);
    assert_int_equal(unlink(h.file), 0);
    assert_int_equal(symlink("../../blobs/0123456789abcdef0123456789abcdef01234567", h.file), 0);
    assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_UNVERIFIED_NO_MANIFEST);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* policy OFF: nothing looked for, nothing derived */
    assert_int_equal(rename(odd, h.blob), 0);
    assert_int_equal(unlink(h.file), 0);
    char target[128];
    snprintf(target, sizeof target, "../../blobs/%s", h.hex);
    assert_int_equal(symlink(target, h.file), 0);
    sluice_options o;
    sluice_options_init(&o);
    o.cache_dir = h.cache;
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open(h.snap, &o, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_UNVERIFIED_OFF);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    struct stat st;
    assert_int_equal(stat(h.derived, &st), -1);
    free(odd);
    free(copy);
    free(copy_dir);
    hub_free(&h);
}

/* Two shards and their index.json: each shard verified against its own
 * blob, with a derived manifest of its own; the second open reads them. */
static void test_sharded_snapshot(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    assert_int_equal(unlink(h.file), 0);
    const char *names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    const char *hdrs[2] = {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                           "{\"y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                           "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,3]}}"};
    char hex[2][65];
    for (int k = 0; k < 2; k++) {
        char *tmp = tu_join(h.root, "shard.tmp");
        tu_write_safetensors(tmp, hdrs[k], NULL, k ? 3 : 8);
        sha256_file(tmp, hex[k]);
        char rel[128], target[128];
        snprintf(rel, sizeof rel, "blobs/%s", hex[k]);
        char *blob = tu_join(h.repo, rel);
        assert_int_equal(rename(tmp, blob), 0);
        snprintf(target, sizeof target, "../../blobs/%s", hex[k]);
        char *link = tu_join(h.snap, names[k]);
        assert_int_equal(symlink(target, link), 0);
        free(link);
        free(blob);
        free(tmp);
    }
    const char *index = "{\"metadata\": {}, \"weight_map\": {\"x\": "
                        "\"model-00001-of-00002.safetensors\", \"y\": "
                        "\"model-00002-of-00002.safetensors\", \"z\": "
                        "\"model-00002-of-00002.safetensors\"}}";
    char *ij = tu_join(h.snap, "model.safetensors.index.json");
    tu_write_file(ij, index, strlen(index));
    for (int round = 0; round < 2; round++) {
        sluice_model *m = NULL;
        assert_int_equal(open_hub(&h, h.snap, &m), SLUICE_OK);
        assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
        assert_int_equal(sluice_file_count(m), 2);
        for (size_t f = 0; f < 2; f++) {
            uint8_t d[32];
            char got[65];
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            assert_int_equal(sluice_file_info(m, f, &fi), SLUICE_OK);
            int k = strstr(fi.path, names[0]) ? 0 : 1;
            assert_int_equal(sluice_manifest_file(m, f, d, NULL), SLUICE_OK);
            assert_string_equal(sl_hex_digest(got, d), hex[k]);
        }
        const char *tn[3] = {"x", "y", "z"};
        for (int k = 0; k < 3; k++) {
            sluice_tensor *t = NULL;
            assert_int_equal(sluice_acquire(m, tn[k], &t), SLUICE_OK);
            assert_int_equal(sluice_release(t), SLUICE_OK);
        }
        struct sluice_stats st = {.size = sizeof st};
        assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
        assert_int_equal(st.checksum_failures, 0);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        for (int k = 0; k < 2; k++) {
            char rel[128];
            snprintf(rel, sizeof rel, "derived/sha256/%s.manifest.json", hex[k]);
            char *dm = tu_join(h.cache, rel);
            struct stat sb;
            assert_int_equal(stat(dm, &sb), 0);
            free(dm);
        }
    }
    free(ij);
    hub_free(&h);
}

/* ---------------------------------------------------------------- the command */

static void test_command_verify_files(void **state)
{
    (void)state;
    hub h;
    hub_make(&h);
    assert_int_equal(setenv("SLUICE_CACHE_DIR", h.cache, 1), 0);
    run_result r = run(h.root, "verify", "--files", "-q", h.snap, NULL);
    expect_status(&r, 0, "verify --files of a clean snapshot");
    assert_non_null(strstr(r.out, "publisher's file digest"));
    assert_non_null(strstr(r.out, "1 files verified, 0 failed"));
    run_free(&r);
    /* inspect says it too, as verify words it */
    r = run(h.root, "inspect", h.snap, NULL);
    expect_status(&r, 0, "inspect of a clean snapshot");
    assert_non_null(strstr(r.out, "verification: verified against the publisher's file digest"));
    run_free(&r);
    /* flipped after the derivation: the file's check names both digests */
    flip(&h);
    char got[65];
    sha256_file(h.blob, got);
    r = run(h.root, "verify", "--files", "-q", h.snap, NULL);
    expect_status(&r, 1, "verify --files of a damaged snapshot");
    assert_non_null(strstr(r.out, h.hex));
    assert_non_null(strstr(r.out, got));
    run_free(&r);
    /* flipped before any derivation: the first read finds it */
    tu_rmtree(h.cache);
    r = run(h.root, "verify", "--files", "-q", h.snap, NULL);
    expect_status(&r, 1, "verify --files of a damaged snapshot, never derived");
    assert_non_null(strstr(r.err, "model.safetensors"));
    assert_non_null(strstr(r.err, h.hex));
    assert_non_null(strstr(r.err, got));
    run_free(&r);
    assert_int_equal(unsetenv("SLUICE_CACHE_DIR"), 0);
    hub_free(&h);
}

int main(void)
{
    const struct CMUnitTest lib[] = {
        cmocka_unit_test(test_clean_snapshot_verified),
        cmocka_unit_test(test_flipped_byte_found_first_open),
        cmocka_unit_test(test_second_open_lazy),
        cmocka_unit_test(test_damaged_derived_manifest),
        cmocka_unit_test(test_explicit_manifest_wins),
        cmocka_unit_test(test_trusted_keys_fail_closed),
        cmocka_unit_test(test_not_a_snapshot),
        cmocka_unit_test(test_sharded_snapshot),
    };
    const struct CMUnitTest cmd[] = {
        cmocka_unit_test(test_command_verify_files),
    };
    int failed = cmocka_run_group_tests_name("hub", lib, NULL, NULL);
    if (access(tool, X_OK) != 0) {
        fprintf(stderr, "%s not built: the command's test skipped\n", tool);
        return failed;
    }
    return failed + cmocka_run_group_tests_name("hub_command", cmd, NULL, NULL);
}
