/* test_remote_hf.c: Hugging Face Hub locations, hf://ORG/NAME[@REVISION][/FILE],
 * against the tests' own stand-in for the Hub (hf_hub_server.py, started
 * here on 127.0.0.1 with HF_ENDPOINT pointing at it): its API, its resolve
 * URLs and their 302 to a second "storage" server (localhost, another
 * port). Checked: resolution with and without @REVISION and /FILE, the
 * index and single-file cases, the token on the Hub's requests and never
 * on the storage's, verification by a published sluice.manifest.json and,
 * when there is none, by the Hub's LFS SHA-256 of each whole file, from
 * which the first open derives tensor and chunk digests kept in the cache
 * directory (a flipped byte or a wrong published digest fails, naming
 * both digests; the second open reads only the tensor acquired), and the
 * errors for a missing repository, revision or file (404, 401). The real
 * Hub is not reached (no network here).
 * Skipped (77) when python3 cannot start the server. */
#include "remote_fixture.h"
#include "util.h"

#include "base/digest.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static rf_server srv;
static rf_server lookalike;  /* the fault server on http://127.0.0.1:P0, P0 = 10 P + d,
                                when the Hub is on http://127.0.0.1:P; pid 0: none */
static char *root;

#define C_MAIN "1111111111111111111111111111111111111111"
#define C_V1 "2222222222222222222222222222222222222222"
#define C_SHARDED "3333333333333333333333333333333333333333"
#define C_PRIVATE "4444444444444444444444444444444444444444"
#define C_PCT "5555555555555555555555555555555555555555"
#define HUB_TOKEN "hub-secret-token"
#define PRIVATE_TOKEN "private-repo-token"

static char *mkdirs(const char *rel)
{
    char *p = tu_join(root, rel);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    assert_int_equal(system(cmd), 0);
    return p;
}

static void put(const char *rel, const char *text)
{
    char *p = tu_join(root, rel);
    tu_write_file(p, text, strlen(text));
    free(p);
}

static void put_model(const char *rel, unsigned a_bytes, unsigned b_bytes)
{
    char header[512];
    snprintf(header, sizeof header,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[0,%u]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[%u,%u]}}",
             a_bytes, a_bytes, b_bytes, a_bytes, a_bytes + b_bytes);
    char *p = tu_join(root, rel);
    tu_write_safetensors(p, header, NULL, a_bytes + b_bytes);
    free(p);
}

static void open_ok(const char *loc, const sluice_options *o, sluice_model **m)
{
    int rc = sluice_open(loc, o, m);
    if (rc != SLUICE_OK)
        fail_msg("%s: %s", loc, sluice_errmsg(*m));
}

/* The flat manifest of the local model file(s) at rel (a file or index). */
static void append_digests(const char *rel, char *out, size_t cap)
{
    char *p = tu_join(root, rel);
    sluice_options o;
    sluice_options_init(&o);
    o.flags = SLUICE_F_HASH_ALL;
    sluice_model *m;
    open_ok(p, &o, &m);
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        sluice_tensor *t;
        uint8_t d[32];
        char hex[65];
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        sluice_tensor_digest(t, d);
        sluice_digest_hex(d, hex);
        sluice_release(t);
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s\"%.*s\":\"%s\"", n > 1 ? "," : "", (int)info.name_len,
                 info.name, hex);
    }
    sluice_close(m);
    free(p);
}

static int setup(void **state)
{
    char why[256];
    rf_skip_without_curl();
    root = tu_tmpdir();
    /* org/single: main = C_MAIN (a, b), v1 = C_V1 (other sizes) */
    free(mkdirs("org/single/refs"));
    free(mkdirs("org/single/" C_MAIN));
    free(mkdirs("org/single/" C_V1));
    put("org/single/refs/main", C_MAIN);
    put("org/single/refs/v1", C_V1);
    put_model("org/single/" C_MAIN "/model.safetensors", 1000, 200000);
    put_model("org/single/" C_V1 "/model.safetensors", 300, 5000);
    put_model("org/single/" C_V1 "/my model.safetensors", 300, 5000);
    put("org/single/" C_MAIN "/config.json", "{}");
    /* org/sharded: an index, two shards, a published sluice.manifest.json */
    free(mkdirs("org/sharded/refs"));
    free(mkdirs("org/sharded/" C_SHARDED));
    put("org/sharded/refs/main", C_SHARDED);
    char header[512];
    snprintf(header, sizeof header,
             "{\"x\":{\"dtype\":\"U8\",\"shape\":[4000],\"data_offsets\":[0,4000]}}");
    char *p = tu_join(root, "org/sharded/" C_SHARDED "/model-00001-of-00002.safetensors");
    tu_write_safetensors(p, header, NULL, 4000);
    free(p);
    snprintf(header, sizeof header,
             "{\"y\":{\"dtype\":\"U8\",\"shape\":[9000],\"data_offsets\":[0,9000]}}");
    p = tu_join(root, "org/sharded/" C_SHARDED "/model-00002-of-00002.safetensors");
    tu_write_safetensors(p, header, NULL, 9000);
    free(p);
    put("org/sharded/" C_SHARDED "/model.safetensors.index.json",
        "{\"metadata\":{},\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
        "\"y\":\"model-00002-of-00002.safetensors\"}}");
    char mf[4096] = "{";
    append_digests("org/sharded/" C_SHARDED "/model.safetensors.index.json", mf, sizeof mf);
    strcat(mf, "}");
    put("org/sharded/" C_SHARDED "/sluice.manifest.json", mf);
    /* org/mixed: org/sharded's files without its manifest, its second
     * shard no Git LFS object (the Hub lists no SHA-256 for it) */
    free(mkdirs("org/mixed/refs"));
    free(mkdirs("org/mixed/" C_SHARDED));
    put("org/mixed/refs/main", C_SHARDED);
    put("org/mixed/nolfs", "model-00002-of-00002.safetensors\n");
    snprintf(header, sizeof header, "cp '%s/org/sharded/%s/'*.safetensors* '%s/org/mixed/%s/'",
             root, C_SHARDED, root, C_SHARDED);
    assert_int_equal(system(header), 0);
    /* org/private: the Hub answers 401 without its token */
    free(mkdirs("org/private/refs"));
    free(mkdirs("org/private/" C_PRIVATE));
    put("org/private/refs/main", C_PRIVATE);
    put("org/private/token", PRIVATE_TOKEN);
    put_model("org/private/" C_PRIVATE "/model.safetensors", 100, 100);
    /* org/gated: the API answers anyone, the files only its token */
    free(mkdirs("org/gated/refs"));
    free(mkdirs("org/gated/" C_PRIVATE));
    put("org/gated/refs/main", C_PRIVATE);
    put("org/gated/gated", PRIVATE_TOKEN);
    put_model("org/gated/" C_PRIVATE "/model.safetensors", 100, 100);
    /* the Hub on P, and a look-alike host of its endpoint on P0 (the
     * fault server, which records every request's headers, serving root:
     * root/blob is root itself, for resolve's redirects sent to it) */
    char *blob = tu_join(root, "blob");
    assert_int_equal(symlink(".", blob), 0);
    free(blob);
    unsigned hp = 0, lp = 0;
    for (int k = 0; k < 5 && !lookalike.pid; k++) {
        if (!rf_lookalike_ports(&hp, &lp) || !rf_script_start_at(&srv, SLUICE_HF_SERVER, root, hp))
            continue;
        if (!rf_script_start_at(&lookalike, SLUICE_FAULT_SERVER, root, lp))
            rf_stop(&srv);
    }
    if (!srv.pid && !rf_fault_start(&srv, SLUICE_HF_SERVER, root, why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        exit(77);
    }
    setenv("HF_ENDPOINT", srv.base, 1);
    /* derived manifests go to the default cache directory: this run's */
    char *xdg = tu_join(root, "xdg");
    setenv("XDG_CACHE_HOME", xdg, 1);
    free(xdg);
    unsetenv("SLUICE_CACHE_DIR");
    unsetenv("HF_TOKEN");
    unsetenv("SLUICE_HTTP_TOKEN");
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    rf_stop(&lookalike);
    rf_stop(&srv);
    tu_rmtree(root);
    free(root);
    (void)state;
    return 0;
}

static void ctl(const char *q)
{
    char *r = rf_get(&srv, q);
    assert_non_null(r);
    assert_string_equal(r, "ok");
    free(r);
}

static sluice_options fast_options(void)
{
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 2;
    o.remote_backoff_ms = 10;
    return o;
}

/* How many logged requests of `who` ("hub " or "storage ") carry auth
 * (exactly "auth=VALUE"), and how many there were. */
static void count_log(const char *who, const char *auth, int *with, int *all)
{
    char *log = rf_get(&srv, "/ctl/log");
    assert_non_null(log);
    *with = *all = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, who, strlen(who)) != 0)
            continue;
        (*all)++;
        const char *a = strstr(line, " auth=");
        *with += a && !strcmp(a + 6, auth);
    }
    free(log);
}

static void check_tensor(sluice_model *m, const char *name, uint64_t nbytes)
{
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, name, &t), SLUICE_OK);
    const unsigned char *d = sluice_tensor_data(t);
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    assert_int_equal(info->nbytes, nbytes);
    /* the pattern of tu_write_safetensors, from the start of the data */
    for (uint64_t i = 0; i < nbytes; i += 997)
        assert_int_equal(d[i], (unsigned char)(((info->data_begin + i) * 131 + 7) & 0xff));
    sluice_release(t);
}

/* hf://org/single: main's commit, model.safetensors found, the token on
 * the Hub's requests only, the storage's requests without it. */
static void test_default_revision_and_token(void **state)
{
    ctl("/ctl/clear");
    sluice_options o = fast_options();
    o.http_token = HUB_TOKEN;
    sluice_model *m = NULL;
    open_ok("hf://org/single", &o, &m);
    assert_int_equal(sluice_count(m), 2);
    check_tensor(m, "a", 1000);
    check_tensor(m, "b", 200000);
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, 0, &fi), SLUICE_OK);
    assert_string_equal(fi.path, "hf://org/single@" C_MAIN "/model.safetensors");
    /* no sluice.manifest.json: the Hub's LFS digests are the manifest */
    assert_non_null(strstr(sluice_manifest_path(m), "the Hub's LFS SHA-256"));
    sluice_close(m);
    int with, all;
    count_log("hub ", "Bearer " HUB_TOKEN, &with, &all);
    assert_true(all >= 3);   /* the API, the sidecars, the file */
    assert_int_equal(with, all);
    count_log("storage ", "", &with, &all);
    assert_true(all >= 1);   /* the header and the tensors came from the storage */
    assert_int_equal(with, all);
    /* no If-Match: the pinned commit is the identity (and a Hub may judge
     * an If-Match against its own 302) */
    char *log = rf_get(&srv, "/ctl/log");
    assert_non_null(log);
    if (strstr(log, "if-match=\""))
        fail_msg("an If-Match was sent:\n%s", log);
    free(log);
    (void)state;
}

/* @REVISION (a branch, a commit) and /FILE pick what they name (a FILE
 * with a space goes %-encoded). */
static void test_revision_and_file(void **state)
{
    const char *const locs[] = {"hf://org/single@v1", "hf://org/single@" C_V1,
                                "hf://org/single@v1/model.safetensors",
                                "hf://org/single@v1/my model.safetensors"};
    for (size_t k = 0; k < sizeof locs / sizeof *locs; k++) {
        sluice_options o = fast_options();
        sluice_model *m = NULL;
        open_ok(locs[k], &o, &m);
        check_tensor(m, "a", 300);
        check_tensor(m, "b", 5000);
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, 0, &fi);
        assert_non_null(strstr(fi.path, C_V1));
        sluice_close(m);
    }
    /* one shard named alone */
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    open_ok("hf://org/sharded/model-00002-of-00002.safetensors", &o, &m);
    assert_int_equal(sluice_count(m), 1);
    check_tensor(m, "y", 9000);
    sluice_close(m);
    (void)state;
}

/* hf://org/sharded: its index and both shards, verified against the
 * sluice.manifest.json it publishes; a flipped byte fails its tensor. */
static void test_index_and_published_manifest(void **state)
{
    sluice_options o = fast_options();
    o.verify = SLUICE_VERIFY_REQUIRE;
    sluice_model *m = NULL;
    open_ok("hf://org/sharded", &o, &m);
    assert_int_equal(sluice_file_count(m), 2);
    assert_string_equal(sluice_manifest_path(m),
                        "hf://org/sharded@" C_SHARDED "/sluice.manifest.json");
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED);
    check_tensor(m, "x", 4000);
    sluice_close(m);
    /* byte 8 + header + 100 of shard 2 is in y's data */
    ctl("/ctl/flip?at=400");
    open_ok("hf://org/sharded", &o, &m);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "y", &t), SLUICE_E_CHECKSUM);
    sluice_close(m);
    ctl("/ctl/flip?at=-1");
    (void)state;
}

/* A Hub location as a mirror: a local copy of org/sharded with a flipped
 * byte in y loads y from the Hub, verified against the local manifest. */
static void test_hub_as_mirror(void **state)
{
    char *dir = tu_tmpdir(), cmd[2048];
    snprintf(cmd, sizeof cmd, "cp '%s/org/sharded/" C_SHARDED "/'* '%s'/", root, dir);
    assert_int_equal(system(cmd), 0);
    char *shard = tu_join(dir, "model-00002-of-00002.safetensors");
    size_t len = 0;
    unsigned char *b = tu_read_file(shard, &len);
    assert_non_null(b);
    b[len - 10] ^= 1;
    tu_write_file(shard, b, len);
    free(b);
    const char *mirrors[] = {"hf://org/sharded"};
    sluice_options o = fast_options();
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m = NULL;
    open_ok(dir, &o, &m);
    check_tensor(m, "y", 9000);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "y", &t), SLUICE_OK);
    if (!strstr(sluice_tensor_source(t), "hf://org/sharded"))
        fail_msg("source: %s", sluice_tensor_source(t));
    sluice_release(t);
    sluice_close(m);
    free(shard);
    tu_rmtree(dir);
    free(dir);
    (void)state;
}

/* The derived manifests of this run (XDG_CACHE_HOME/sluice/derived),
 * removed: the next open derives again. */
static void forget_derived(void)
{
    char *d = tu_join(root, "xdg/sluice/derived");
    tu_rmtree(d);
    free(d);
}

/* The SHA-256 of the file at rel under root, byte at (-1: none) flipped
 * as the storage's /ctl/flip flips it. */
static void sha256_of(const char *rel, long at, char hex[65])
{
    char *p = tu_join(root, rel);
    size_t n = 0;
    unsigned char *data = tu_read_file(p, &n);
    assert_non_null(data);
    if (at >= 0 && (size_t)at < n)
        data[at] ^= 0x01;
    uint8_t d[32];
    assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, data, n, d), 0);
    sluice_digest_hex(d, hex);
    free(data);
    free(p);
}

/* The bytes the storage served since the last /ctl/clear (the sum of its
 * ranges; a request without a range counts as 1 GiB) and its requests. */
static uint64_t storage_bytes(int *requests)
{
    char *log = rf_get(&srv, "/ctl/log");
    assert_non_null(log);
    uint64_t bytes = 0;
    *requests = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "storage ", 8) != 0)
            continue;
        (*requests)++;
        unsigned long long lo, hi;
        const char *r = strstr(line, " range=bytes=");
        if (r && sscanf(r, " range=bytes=%llu-%llu", &lo, &hi) == 2 && hi >= lo)
            bytes += hi - lo + 1;
        else
            bytes += 1ull << 30;
    }
    free(log);
    return bytes;
}

#define SINGLE "org/single/" C_MAIN "/model.safetensors"

/* No published manifest: the first open reads each file whole once
 * through the storage, checks it against the Hub's LFS SHA-256 and
 * derives a version 2 manifest (tensors, 16 MiB chunks) into the cache
 * directory: SLUICE_VERIFIED_PUBLISHER_DIGEST, under DEFAULT and REQUIRE
 * alike. The second open uses it: only the header and the tensor
 * acquired cross the network. sluice_verify with SLUICE_VF_FILES still
 * checks the whole files (a flipped byte fails the file and its tensor). */
static void test_lfs_sha256(void **state)
{
    forget_derived();
    struct stat fst;
    char *single = tu_join(root, SINGLE);
    assert_int_equal(stat(single, &fst), 0);
    free(single);
    uint64_t size = (uint64_t)fst.st_size;
    ctl("/ctl/clear");
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    open_ok("hf://org/single", &o, &m);
    int requests = 0;
    uint64_t first = storage_bytes(&requests);
    if (first < size || first > 2 * size)
        fail_msg("first open: %llu bytes in %d requests, the file has %llu",
                 (unsigned long long)first, requests, (unsigned long long)size);
    const char *where = NULL;
    assert_int_equal(sluice_verify_state(m, &where), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    if (!where || !strstr(where, "/xdg/sluice/derived/sha256/") ||
        !strstr(where, "the Hub's LFS SHA-256 of hf://org/single@" C_MAIN "/model.safetensors"))
        fail_msg("where: %s", where ? where : "(null)");
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_int_equal(sluice_manifest_version(m), 2);
    char hex[65], want[65];
    uint8_t d[32];
    sha256_of(SINGLE, -1, want);
    assert_int_equal(sluice_manifest_file(m, 0, d, NULL), SLUICE_OK);
    assert_string_equal(sluice_digest_hex(d, hex), want);
    check_tensor(m, "a", 1000);
    check_tensor(m, "b", 200000);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.unverified, 0);
    sluice_close(m);
    char derived[1024];
    snprintf(derived, sizeof derived, "%s/xdg/sluice/derived/sha256/%s.manifest.json", root, want);
    struct stat dst;
    assert_int_equal(stat(derived, &dst), 0);

    /* the second open: the derived manifest; a's 1000 bytes and the header */
    ctl("/ctl/clear");
    open_ok("hf://org/single", &o, &m);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    const char *plan[1] = {"a"}; /* no read-ahead past it */
    assert_int_equal(sluice_prefetch(m, plan, 1), SLUICE_OK);
    check_tensor(m, "a", 1000);
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.bytes_hashed, 1000);
    uint64_t second = storage_bytes(&requests);
    if (second >= size / 4)
        fail_msg("second open: %llu bytes in %d requests (the file has %llu)",
                 (unsigned long long)second, requests, (unsigned long long)size);
    sluice_close(m);

    /* REQUIRE is met by the derived manifest */
    o.verify = SLUICE_VERIFY_REQUIRE;
    open_ok("hf://org/single", &o, &m);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    sluice_close(m);
    o.verify = SLUICE_VERIFY_DEFAULT;

    /* a byte flipped after the derivation: the open passes (it reads no
     * tensor), the tensor holding it fails, and so does the whole file */
    open_ok("hf://org/single", &o, &m);
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS;
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, NULL, 0, &vo, &r), SLUICE_OK);
    assert_int_equal(r.files_ok, 1);
    assert_true(r.bytes_hashed > 201000);
    ctl("/ctl/flip?at=150000");
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_verify(m, NULL, 0, &vo, &r), SLUICE_E_CHECKSUM);
    assert_int_equal(r.files_failed, 1);
    if (!strstr(sluice_errmsg(m), "mismatch: expected"))
        fail_msg("%s", sluice_errmsg(m));
    ctl("/ctl/flip?at=-1");
    sluice_close(m);
    (void)state;
}

/* The first open finds the damage: a flipped byte served, or a digest
 * the Hub publishes that the bytes do not have, fails the open with
 * SLUICE_E_CHECKSUM naming the file, the digest published and the digest
 * of the bytes; nothing is derived from them. */
static void test_lfs_sha256_mismatch_first_open(void **state)
{
    char real[65], flipped[65], derived[1024];
    sha256_of(SINGLE, -1, real);
    sha256_of(SINGLE, 150000, flipped);
    snprintf(derived, sizeof derived, "%s/xdg/sluice/derived/sha256/%s.manifest.json", root, real);
    const char *wrong = "00000000000000000000000000000000000000000000000000000000000000ab";
    for (int k = 0; k < 2; k++) {
        forget_derived();
        char q[128];
        if (k == 0)
            ctl("/ctl/flip?at=150000");
        else {
            snprintf(q, sizeof q, "/ctl/lfs?value=%s", wrong);
            ctl(q);
        }
        sluice_options o = fast_options();
        sluice_model *m = NULL;
        int rc = sluice_open("hf://org/single", &o, &m);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sluice_errmsg(m));
        sluice_close(m);
        ctl("/ctl/flip?at=-1");
        ctl("/ctl/lfs");
        const char *expected = k == 0 ? real : wrong, *actual = k == 0 ? flipped : real;
        if (rc != SLUICE_E_CHECKSUM || !strstr(msg, "hf://org/single@" C_MAIN "/model.safetensors")
            || !strstr(msg, expected) || !strstr(msg, actual) || !strstr(msg, "LFS SHA-256"))
            fail_msg("%s: %d %s", k == 0 ? "a flipped byte" : "a wrong digest", rc, msg);
        struct stat st;
        assert_int_equal(stat(derived, &st), -1);
    }
    (void)state;
}

/* A header served once (the first response holding its byte flips a
 * tensor's name "b" to "c"), then the true file: the whole-file read
 * matches the Hub's digest, but the index was parsed from the header of
 * the first answer. The open fails (SLUICE_E_CHECKSUM): a derived
 * manifest would otherwise bind the published bytes to names, dtypes and
 * offsets no publisher wrote. Nothing is derived. */
static void test_lfs_sha256_header_served_at_open(void **state)
{
    forget_derived();
    char real[65], derived[1024], q[128];
    sha256_of(SINGLE, -1, real);
    snprintf(derived, sizeof derived, "%s/xdg/sluice/derived/sha256/%s.manifest.json", root, real);
    char *single = tu_join(root, SINGLE);
    size_t len = 0;
    unsigned char *b = tu_read_file(single, &len);
    free(single);
    assert_non_null(b);
    assert_true(len > 8);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | b[k];
    long at = -1;
    for (uint64_t k = 8; k + 3 <= 8 + n && k + 3 <= len; k++)
        if (memcmp(b + k, "\"b\"", 3) == 0) {
            at = (long)k + 1;
            break;
        }
    free(b);
    assert_true(at > 0);
    snprintf(q, sizeof q, "/ctl/flip?at=%ld&times=1", at);
    ctl(q);
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    int rc = sluice_open("hf://org/single", &o, &m);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sluice_errmsg(m));
    sluice_close(m);
    ctl("/ctl/flip?at=-1");
    if (rc != SLUICE_E_CHECKSUM || !strstr(msg, "header served at open"))
        fail_msg("a header served once: %d %s", rc, msg);
    struct stat st;
    assert_int_equal(stat(derived, &st), -1);
    /* the truth served: the open derives and verifies as before */
    open_ok("hf://org/single", &o, &m);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    check_tensor(m, "b", 200000);
    sluice_close(m);
    (void)state;
}

/* Through a proxy that serves a damaged copy of the file (the fault
 * server, as a proxy, serving root's copy at the resolve path and the API's
 * reply at the API's): the first open's whole-file read does not match the
 * Hub's digest, so the file is read again from the origin directly, once
 * (the remote source's rule), matches, and the model opens verified, one
 * proxy failure counted. */
static void test_lfs_sha256_through_lying_proxy(void **state)
{
    if (!lookalike.pid) {
        print_message("skipped: no fault server to act as the proxy\n");
        skip();
    }
    forget_derived();
    free(rf_get(&lookalike, "/ctl/clear"));
    char real[65], cmd[2048];
    sha256_of(SINGLE, -1, real);
    struct stat fst;
    char *single = tu_join(root, SINGLE);
    assert_int_equal(stat(single, &fst), 0);
    /* what the proxy answers: the API's reply, and a flipped copy of the file */
    free(mkdirs("api/models/org/single/revision"));
    char api[1024];
    snprintf(api, sizeof api, "{\"id\": \"org/single\", \"sha\": \"%s\", \"siblings\": "
             "[{\"rfilename\": \"model.safetensors\", \"size\": %lld, \"lfs\": {\"sha256\": "
             "\"%s\", \"size\": %lld}}, {\"rfilename\": \"config.json\", \"size\": 2}]}", C_MAIN,
             (long long)fst.st_size, real, (long long)fst.st_size);
    put("api/models/org/single/revision/main", api);
    free(mkdirs("org/single/resolve/" C_MAIN));
    char *copy = tu_join(root, "org/single/resolve/" C_MAIN "/model.safetensors");
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", single, copy);
    assert_int_equal(system(cmd), 0);
    size_t len = 0;
    unsigned char *b = tu_read_file(copy, &len);
    assert_non_null(b);
    b[150000] ^= 1;
    tu_write_file(copy, b, len);
    free(b);
    sluice_options o = fast_options();
    o.http_proxy = lookalike.base;
    sluice_model *m = NULL;
    int rc = sluice_open("hf://org/single", &o, &m);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sluice_errmsg(m));
    struct sluice_stats st = {.size = sizeof st};
    if (rc == SLUICE_OK)
        assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    int state_now = rc == SLUICE_OK ? sluice_verify_state(m, NULL) : -1;
    sluice_close(m);
    char *api_dir = tu_join(root, "api"), *res_dir = tu_join(root, "org/single/resolve");
    tu_rmtree(api_dir);
    tu_rmtree(res_dir);
    free(api_dir);
    free(res_dir);
    free(copy);
    free(single);
    char *log = rf_get(&lookalike, "/ctl/log");
    assert_non_null(log);
    int proxied = strstr(log, "/org/single/resolve/" C_MAIN "/model.safetensors") != NULL;
    free(log);
    free(rf_get(&lookalike, "/ctl/clear"));
    if (rc != SLUICE_OK)
        fail_msg("open through the lying proxy: %d %s", rc, msg);
    assert_true(proxied);   /* the file's bytes did come through the proxy */
    assert_int_equal(state_now, SLUICE_VERIFIED_PUBLISHER_DIGEST);
    assert_int_equal(st.proxy_failures, 1);
    assert_true(st.proxy_bypass_bytes >= (uint64_t)fst.st_size);
    (void)state;
}

/* A file the Hub lists no LFS SHA-256 for (not a Git LFS object: its
 * Git SHA-1 is no SHA-256): nothing is derived, the model loads
 * unverified (as one without a manifest), its manifest path names the
 * Hub's digests of the other files (sluice_verify's whole files), REQUIRE
 * cannot be met, and mirrors are refused. A published manifest still
 * wins. */
static void test_lfs_only_is_unverified(void **state)
{
    forget_derived();
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    open_ok("hf://org/mixed", &o, &m);
    const char *where = NULL;
    assert_int_equal(sluice_verify_state(m, &where), SLUICE_UNVERIFIED_NO_MANIFEST);
    assert_non_null(where);
    if (!strstr(where, "sluice.manifest.json"))
        fail_msg("where: %s", where);
    struct sluice_stats s = {.size = sizeof s};
    assert_int_equal(sluice_stats(m, &s), SLUICE_OK);
    assert_int_equal(s.unverified, SLUICE_UNVERIFIED_NO_MANIFEST);
    assert_non_null(strstr(sluice_manifest_path(m), "the Hub's LFS SHA-256"));
    sluice_close(m);
    char *d = tu_join(root, "xdg/sluice/derived");
    struct stat st;
    assert_int_equal(stat(d, &st), -1); /* nothing derived */
    free(d);
    o.verify = SLUICE_VERIFY_REQUIRE;
    assert_int_equal(sluice_open("hf://org/mixed", &o, &m), SLUICE_E_MANIFEST);
    assert_non_null(strstr(sluice_errmsg(m), "no LFS SHA-256 for some of its files"));
    sluice_close(m);
    o.verify = SLUICE_VERIFY_DEFAULT;
    /* mirrors need tensor digests to check their bytes against: refused,
     * as for a model without a manifest */
    const char *mirrors[] = {"hf://org/sharded"};
    o.fallback = mirrors;
    o.fallback_count = 1;
    assert_int_equal(sluice_open("hf://org/mixed", &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "fallback mirrors need a manifest"));
    sluice_close(m);
    o.fallback = NULL;
    o.fallback_count = 0;
    /* a published manifest: verified */
    open_ok("hf://org/sharded", &o, &m);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED);
    sluice_close(m);
    /* every file an LFS object: derived, and mirrors are allowed */
    const char *same[] = {"hf://org/single@" C_MAIN};
    o.fallback = same;
    o.fallback_count = 1;
    open_ok("hf://org/single", &o, &m);
    assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    sluice_close(m);
    o.fallback = NULL;
    o.fallback_count = 0;
    /* both shards LFS objects (nolfs gone): each derived, both checked */
    char *nolfs = tu_join(root, "org/mixed/nolfs");
    assert_int_equal(unlink(nolfs), 0);
    open_ok("hf://org/mixed", &o, &m);
    put("org/mixed/nolfs", "model-00002-of-00002.safetensors\n");
    free(nolfs);
    const char *where2 = NULL;
    assert_int_equal(sluice_verify_state(m, &where2), SLUICE_VERIFIED_PUBLISHER_DIGEST);
    if (!where2 || !strstr(where2, "2 manifests derived from the Hub's LFS SHA-256"))
        fail_msg("where: %s", where2 ? where2 : "(null)");
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "x", &t), SLUICE_OK);
    sluice_release(t);
    assert_int_equal(sluice_acquire(m, "y", &t), SLUICE_OK);
    sluice_release(t);
    assert_int_equal(sluice_stats(m, &s), SLUICE_OK);
    assert_int_equal(s.bytes_hashed, 13000);
    sluice_close(m);
    (void)state;
}

/* `sluice verify --files hf://...`: a repository that publishes no
 * manifest is verified against the manifest derived from the Hub's LFS
 * SHA-256 (every tensor and the file; exit 0, then 1 on a flipped byte),
 * or, with a file that is no LFS object, its whole files only; its
 * published manifest and the files otherwise. */
static void test_verify_command(void **state)
{
    char cmd[1024], out[256];
    char *log = tu_join(root, "verify.out");
    forget_derived();
    snprintf(cmd, sizeof cmd, "'%s/sluice' verify -q --files hf://org/single > '%s'",
             SLUICE_BINARY_DIR, log);
    assert_int_equal(system(cmd), 0);
    size_t len = 0;
    char *text = tu_read_file(log, &len);
    assert_non_null(text);
    if (!strstr(text, "verified against the publisher's file digest") ||
        !strstr(text, "the LFS SHA-256 the Hub publishes") || strstr(text, "snapshot") ||
        !strstr(text, "2 tensors verified, 0 failed, 1 files verified, 0 failed"))
        fail_msg("verify: %s", text);
    free(text);
    ctl("/ctl/flip?at=150000");
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
    ctl("/ctl/flip?at=-1");
    snprintf(cmd, sizeof cmd, "'%s/sluice' verify -q --files hf://org/mixed > '%s' 2>&1",
             SLUICE_BINARY_DIR, log);
    int st = system(cmd);   /* the file without a digest fails, as in a manifest */
    text = tu_read_file(log, &len);
    if (WEXITSTATUS(st) != 1 || !strstr(text, "whole files only") ||
        !strstr(text, "0 tensors verified, 0 failed, 1 files verified, 1 failed"))
        fail_msg("verify: %d %s", st, text);
    free(text);
    /* a published manifest: every tensor, then the files (which it lists
     * not: each "no digest", as for a local model) */
    snprintf(cmd, sizeof cmd, "'%s/sluice' verify -q hf://org/sharded > '%s'", SLUICE_BINARY_DIR,
             log);
    assert_int_equal(system(cmd), 0);
    text = tu_read_file(log, &len);
    snprintf(out, sizeof out, "manifest hf://org/sharded@%s/sluice.manifest.json", C_SHARDED);
    assert_non_null(strstr(text, out));
    assert_non_null(strstr(text, "2 tensors verified, 0 failed"));
    free(text);
    /* cat of a repository without a manifest (the docs' example): the
     * bytes, verified against the derived manifest, no warning; with a
     * file that is no LFS object, the warning that they are unchecked */
    snprintf(cmd, sizeof cmd, "'%s/sluice' cat hf://org/single b 2> '%s' | wc -c | "
             "grep -qx 200000", SLUICE_BINARY_DIR, log);
    assert_int_equal(system(cmd), 0);
    text = tu_read_file(log, &len);
    if (strstr(text, "warning"))
        fail_msg("cat's stderr: %s", text);
    free(text);
    snprintf(cmd, sizeof cmd, "'%s/sluice' cat hf://org/mixed y 2> '%s' | wc -c | "
             "grep -qx 9000", SLUICE_BINARY_DIR, log);
    assert_int_equal(system(cmd), 0);
    text = tu_read_file(log, &len);
    if (!strstr(text, "warning: not verified"))
        fail_msg("cat's stderr: %s", text);
    free(text);
    /* repair writes local files: a Hub location is refused before any request */
    snprintf(cmd, sizeof cmd, "'%s/sluice' repair hf://org/single --fallback /nowhere 2> '%s'",
             SLUICE_BINARY_DIR, log);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    text = tu_read_file(log, &len);
    assert_non_null(strstr(text, "is remote"));
    free(text);
    free(log);
    (void)state;
}

static void open_fails(const char *loc, const char *token, int code, const char *words)
{
    sluice_options o = fast_options();
    o.http_token = token;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(loc, &o, &m), code);
    if (!strstr(sluice_errmsg(m), words))
        fail_msg("%s: \"%s\" does not say \"%s\"", loc, sluice_errmsg(m), words);
    sluice_close(m);
}

/* A missing repository, revision or file, a private repository without
 * its token, a malformed location: each says which. */
static void test_errors(void **state)
{
    open_fails("hf://org/nothere", NULL, SLUICE_E_REMOTE, "refused (HTTP 401)");
    open_fails("hf://org/nothere", NULL, SLUICE_E_REMOTE, "set HF_TOKEN");
    open_fails("hf://org/nothere", HUB_TOKEN, SLUICE_E_NO_FILES,
               "no repository org/nothere on");
    open_fails("hf://org/single@nobranch", NULL, SLUICE_E_NO_FILES,
               "has no revision \"nobranch\"");
    open_fails("hf://org/single/missing.safetensors", NULL, SLUICE_E_NO_FILES,
               "no file missing.safetensors in org/single at commit " C_MAIN);
    open_fails("hf://org/private", NULL, SLUICE_E_REMOTE, "private or gated");
    open_fails("hf://org/private", "wrong", SLUICE_E_NO_FILES, "no repository org/private");
    open_fails("hf://org/gated", NULL, SLUICE_E_REMOTE, "gated or private and no token was sent");
    open_fails("hf://org/gated", "wrong", SLUICE_E_REMOTE, "gated or private and the token");
    {
        sluice_options o = fast_options();
        o.http_token = PRIVATE_TOKEN;
        sluice_model *m = NULL;
        open_ok("hf://org/gated", &o, &m);   /* with its token */
        check_tensor(m, "b", 100);
        sluice_close(m);
    }
    const char *const bad[] = {"hf://org", "hf://", "hf:///x", "hf://org/", "hf://org/single@",
                               "hf://org/single@/model.safetensors", "hf://org/../single",
                               "hf://org/single?revision=v1", "hf://org/single#v1",
                               "hf://org/single/model.safetensors?x=1"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
        open_fails(bad[k], NULL, SLUICE_E_INVAL, "hf://ORG/NAME[@REVISION][/FILE]");
    open_fails("hf://org/single/no such.safetensors", NULL, SLUICE_E_NO_FILES,
               "no file no such.safetensors");
    /* an endpoint's user:password@ never shows in a message */
    char ep[512];
    snprintf(ep, sizeof ep, "http://user:ep-secret@%s", srv.base + strlen("http://"));
    setenv("HF_ENDPOINT", ep, 1);
    const char *const secret_locs[] = {"hf://org/nothere", "hf://org/single@nobranch"};
    for (size_t k = 0; k < 2; k++) {
        sluice_options o = fast_options();
        sluice_model *m = NULL;
        assert_true(sluice_open(secret_locs[k], &o, &m) < 0);
        if (strstr(sluice_errmsg(m), "ep-secret"))
            fail_msg("%s: the endpoint's password shows: %s", secret_locs[k], sluice_errmsg(m));
        sluice_close(m);
    }
    setenv("HF_ENDPOINT", srv.base, 1);
    (void)state;
}

/* The token from HF_TOKEN; SLUICE_HTTP_TOKEN (the caller's own servers')
 * is never sent to the Hub. */
static void test_token_from_environment(void **state)
{
    ctl("/ctl/clear");
    setenv("HF_TOKEN", PRIVATE_TOKEN, 1);
    setenv("SLUICE_HTTP_TOKEN", "not-for-the-hub", 1);
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    open_ok("hf://org/private", &o, &m);
    check_tensor(m, "b", 100);
    sluice_close(m);
    unsetenv("HF_TOKEN");
    open_ok("hf://org/single", &o, &m);
    sluice_close(m);
    unsetenv("SLUICE_HTTP_TOKEN");
    /* a token with a line break would add a header of its own: refused */
    setenv("HF_TOKEN", PRIVATE_TOKEN "\r\nX-Injected: yes", 1);
    assert_int_equal(sluice_open("hf://org/private", &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "control character"));
    sluice_close(m);
    unsetenv("HF_TOKEN");
    o.http_token = "tok\n";
    assert_int_equal(sluice_open("hf://org/single", &o, &m), SLUICE_E_INVAL);
    sluice_close(m);
    o.http_token = NULL;
    int with, all;
    count_log("hub ", "Bearer not-for-the-hub", &with, &all);
    assert_int_equal(with, 0);
    count_log("hub ", "Bearer " PRIVATE_TOKEN, &with, &all);
    assert_true(with >= 3);
    count_log("storage ", "", &with, &all);
    assert_true(all >= 2);
    assert_int_equal(with, all);
    (void)state;
}

/* opts.http_token is the token of the model's own location: with an
 * hf:// model the Hub's, never sent to a mirror elsewhere; with a model
 * on the caller's server its, never sent to an hf:// mirror. */
static void test_token_stays_with_its_host(void **state)
{
    char *port = rf_get(&srv, "/ctl/storage"), mirror[256], primary[512];
    assert_non_null(port);
    snprintf(mirror, sizeof mirror, "http://localhost:%s/blob/org/sharded/", port);
    /* y fails from the Hub (a flipped byte): the mirror is asked */
    ctl("/ctl/clear");
    ctl("/ctl/flip?at=400");
    const char *mirrors[1] = {mirror};
    sluice_options o = fast_options();
    o.http_token = HUB_TOKEN;
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m = NULL;
    open_ok("hf://org/sharded", &o, &m);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "y", &t), SLUICE_E_CHECKSUM);
    sluice_close(m);
    int with, all;
    count_log("storage ", "", &with, &all);
    assert_true(all >= 2);   /* y from the Hub's storage, the mirror's index */
    if (with != all)
        fail_msg("the Hub's token went to the mirror: %d of %d storage requests", all - with,
                 all);
    /* the model on "the caller's server" (the storage's address, a local
     * manifest), the Hub a mirror: the caller's token stays off the Hub */
    ctl("/ctl/clear");
    char *mf = tu_join(root, "own.manifest.json");
    char mtext[4096] = "{";
    append_digests("org/sharded/" C_SHARDED "/model-00002-of-00002.safetensors", mtext,
                   sizeof mtext);
    strcat(mtext, "}");
    tu_write_file(mf, mtext, strlen(mtext));
    snprintf(primary, sizeof primary, "http://localhost:%s/blob/org/sharded/" C_SHARDED
             "/model-00002-of-00002.safetensors?X-Amz-Signature=x", port);
    const char *hub_mirror[1] = {"hf://org/sharded/model-00002-of-00002.safetensors"};
    o = fast_options();
    o.http_token = "own-server-token";
    o.manifest_path = mf;
    o.fallback = hub_mirror;
    o.fallback_count = 1;
    open_ok(primary, &o, &m);
    assert_int_equal(sluice_acquire(m, "y", &t), SLUICE_E_CHECKSUM);
    sluice_close(m);
    count_log("hub ", "", &with, &all);
    assert_true(all >= 1);
    if (with != all)
        fail_msg("the caller's token went to the Hub: %d of %d requests", all - with, all);
    ctl("/ctl/flip?at=-1");
    /* a URL of the Hub's endpoint is the Hub's: http_token goes there
     * (the open itself may fail: the stand-in judges the If-Match a plain
     * URL sends) */
    ctl("/ctl/clear");
    snprintf(primary, sizeof primary, "%s/org/single/resolve/main/model.safetensors", srv.base);
    o = fast_options();
    o.http_token = HUB_TOKEN;
    m = NULL;
    (void)sluice_open(primary, &o, &m);
    sluice_close(m);
    count_log("hub ", "Bearer " HUB_TOKEN, &with, &all);
    assert_true(all >= 1);
    assert_int_equal(with, all);
    free(mf);
    free(port);
    (void)state;
}

/* An endpoint written with user information ($HF_ENDPOINT
 * http://user:ep-secret@127.0.0.1:P, as a mirror of the Hub behind basic
 * auth is written), with its scheme in capitals (HTTP://127.0.0.1:P) or
 * with none (127.0.0.1:P, libcurl's http://) is still the Hub: every
 * request to it, the API's included, carries HF_TOKEN, and none
 * $SLUICE_HTTP_TOKEN (the caller's own servers'). Before, sl_hf_on_hub
 * took no URL with user information for the Hub's, and an endpoint it does
 * not parse as http(s) (the scheme's case, none) matched nothing: the
 * API's requests (made from the endpoint's text) went out with
 * SLUICE_HTTP_TOKEN, and a private repository's API refused. At 824ab9c
 * (a prefix compare of the text) each form passes. */
static void test_token_endpoint_with_userinfo(void **state)
{
    const char *const forms[] = {"http://user:ep-secret@", "HTTP://", ""};
    for (size_t k = 0; k < sizeof forms / sizeof *forms; k++) {
        char ep[512];
        snprintf(ep, sizeof ep, "%s%s", forms[k], srv.base + strlen("http://"));
        setenv("HF_ENDPOINT", ep, 1);
        setenv("HF_TOKEN", PRIVATE_TOKEN, 1);
        setenv("SLUICE_HTTP_TOKEN", "not-for-the-hub", 1);
        ctl("/ctl/clear");
        sluice_options o = fast_options();
        sluice_model *m = NULL;
        int rc = sluice_open("hf://org/private", &o, &m);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rc < 0 ? sluice_errmsg(m) : "");
        if (rc == SLUICE_OK)
            check_tensor(m, "b", 100);
        sluice_close(m);
        setenv("HF_ENDPOINT", srv.base, 1);
        unsetenv("HF_TOKEN");
        unsetenv("SLUICE_HTTP_TOKEN");
        int with, all;
        count_log("hub ", "Bearer not-for-the-hub", &with, &all);
        if (with)
            fail_msg("%s: SLUICE_HTTP_TOKEN went to the Hub: %d of %d requests (the open: %d %s)",
                     forms[k], with, all, rc, msg);
        if (rc != SLUICE_OK)
            fail_msg("%s: hf://org/private: %d %s", forms[k], rc, msg);
        count_log("hub ", "Bearer " PRIVATE_TOKEN, &with, &all);
        assert_true(all >= 3);
        assert_int_equal(with, all);
    }
    (void)state;
}

/* A commit asked in full is the commit read: an API that answers another
 * one for it (the stand-in told to lie) fails the open, SLUICE_E_REMOTE
 * "not the one pinned" (before: the other commit's files were opened, a
 * model other than the one named). A branch is the Hub's to resolve. */
static void test_pinned_commit_checked(void **state)
{
    ctl("/ctl/sha?value=" C_V1);
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    int rc = sluice_open("hf://org/single@" C_MAIN, &o, &m);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sluice_errmsg(m));
    sluice_close(m);
    m = NULL;
    int branch = sluice_open("hf://org/single@main", &o, &m);
    sluice_close(m);
    ctl("/ctl/sha");
    if (rc != SLUICE_E_REMOTE || !strstr(msg, "not the one pinned"))
        fail_msg("a commit pinned, the Hub answering another: %d %s", rc, msg);
    assert_int_equal(branch, SLUICE_OK);
    (void)state;
}

/* A weight_map name holding '%' is a file name, sent %-encoded ("%25"):
 * a shard literally named "x%2Fy.safetensors" loads (before: sent as is,
 * the Hub decoded it to x/y.safetensors, another path: 404; a name like
 * "%2e%2e%2f..." reached outside the repository's folder). */
static void test_percent_in_shard_name(void **state)
{
    free(mkdirs("org/pct/refs"));
    free(mkdirs("org/pct/" C_PCT));
    put("org/pct/refs/main", C_PCT);
    put_model("org/pct/" C_PCT "/x%2Fy.safetensors", 1000, 3000);
    put("org/pct/" C_PCT "/model.safetensors.index.json",
        "{\"metadata\":{},\"weight_map\":{\"a\":\"x%2Fy.safetensors\","
        "\"b\":\"x%2Fy.safetensors\"}}");
    ctl("/ctl/clear");
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    int rc = sluice_open("hf://org/pct", &o, &m);
    if (rc != SLUICE_OK) {
        char *log = rf_get(&srv, "/ctl/log");
        fail_msg("%s\n%s", sluice_errmsg(m), log);
    }
    check_tensor(m, "b", 3000);
    sluice_close(m);
    char *log = rf_get(&srv, "/ctl/log");
    assert_non_null(strstr(log, "/resolve/" C_PCT "/x%252Fy.safetensors"));
    free(log);
    (void)state;
}

/* Whether the look-alike's request log holds needle; the log is cleared. */
static int lookalike_saw(const char *needle, int *requests)
{
    char *log = rf_get(&lookalike, "/ctl/log");
    assert_non_null(log);
    *requests = 0;
    for (const char *l = log; (l = strstr(l, "GET /")); l++)
        (*requests)++;
    int saw = strstr(log, needle) != NULL;
    if (saw)
        print_message("the look-alike host got:\n%s\n", log);
    free(log);
    free(rf_get(&lookalike, "/ctl/clear"));
    return saw;
}

/* HF_TOKEN goes to the Hub's endpoint (http://127.0.0.1:P) and to no URL
 * that merely starts with its text: the look-alike host
 * http://127.0.0.1:P0 (P0 = 10 P + d; the fault server, which records
 * every request's headers) gets no Bearer token as a model, as a model
 * named "http://127.0.0.1:P@127.0.0.1:P0/..." (the endpoint's text, then
 * userinfo), as a mirror of hf://org/sharded, or as where the Hub's
 * resolve redirects; the Hub's own requests carry it every time. Checked
 * by breaking sl_hf_on_hub (remote_hf.c) into a prefix compare: this test then
 * fails on the first model. */
static void test_token_host_boundary(void **state)
{
    if (!lookalike.pid) {
        print_message("skipped: no pair of free ports P, 10 P + d on 127.0.0.1\n");
        skip();
    }
    setenv("HF_TOKEN", HUB_TOKEN, 1);
    free(rf_get(&lookalike, "/ctl/clear"));
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    int n;
    /* a model on the look-alike host, plainly and behind userinfo */
    char loc[512];
    for (int k = 0; k < 2; k++) {
        if (k == 0)
            snprintf(loc, sizeof loc, "%s/org/single/" C_MAIN "/model.safetensors",
                     lookalike.base);
        else
            snprintf(loc, sizeof loc, "http://127.0.0.1:%u@127.0.0.1:%u/org/single/" C_MAIN
                     "/model.safetensors", srv.port, lookalike.port);
        open_ok(loc, &o, &m);
        check_tensor(m, "b", 200000);
        sluice_close(m);
        if (lookalike_saw("Bearer", &n))
            fail_msg("the Hub's token went to %s", loc);
        assert_true(n >= 2);
    }
    /* a mirror there: y fails from the Hub (a flipped byte) */
    ctl("/ctl/clear");
    ctl("/ctl/flip?at=400");
    snprintf(loc, sizeof loc, "%s/org/sharded/" C_SHARDED "/", lookalike.base);
    const char *mirrors[1] = {loc};
    o.fallback = mirrors;
    o.fallback_count = 1;
    open_ok("hf://org/sharded", &o, &m);
    check_tensor(m, "y", 9000);
    sluice_close(m);
    ctl("/ctl/flip?at=-1");
    if (lookalike_saw("Bearer", &n))
        fail_msg("the Hub's token went to the mirror %s", loc);
    assert_true(n >= 2);
    int with, all;
    count_log("hub ", "Bearer " HUB_TOKEN, &with, &all);
    assert_true(all >= 3);
    assert_int_equal(with, all);
    /* the Hub's resolve redirects there */
    ctl("/ctl/clear");
    snprintf(loc, sizeof loc, "/ctl/storage_base?url=%s", lookalike.base);
    ctl(loc);
    o = fast_options();
    open_ok("hf://org/single", &o, &m);
    check_tensor(m, "b", 200000);
    sluice_close(m);
    ctl("/ctl/storage_base");
    if (lookalike_saw("Bearer", &n))
        fail_msg("the Hub's token followed its redirect to %s", lookalike.base);
    assert_true(n >= 2);
    count_log("hub ", "Bearer " HUB_TOKEN, &with, &all);
    assert_true(all >= 3);
    assert_int_equal(with, all);
    unsetenv("HF_TOKEN");
    (void)state;
}

/* A signature asked of an hf:// model fails closed, and says why: the
 * Hub's LFS SHA-256 stand-in (hf://org/single publishes no manifest) is
 * no file one could have signed, so no signature is fetched for it; the
 * manifest hf://org/sharded publishes has no signature beside it on the
 * Hub (fetched: a 404), nor the model a model.sig. With an Ed25519 key
 * the open once looked for a local file named after the stand-in's
 * description ("hf://org/single@C (the Hub's LFS SHA-256).sig", a path
 * relative to the working directory) and said it was missing; a file
 * there was read. */
static void test_signature_fails_closed(void **state)
{
    char *dir = tu_tmpdir();
    char *pub = tu_join(dir, "ed.pub");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "openssl genpkey -algorithm ed25519 2>/dev/null | "
             "openssl pkey -pubout -out '%s' 2>/dev/null", pub);
    if (system(cmd) != 0) {
        print_message("skipped: openssl cannot write an Ed25519 key\n");
        tu_rmtree(dir);
        free(dir);
        free(pub);
        skip();
    }
    const char *keys[] = {pub};
    const char *locs[] = {"hf://org/single", "hf://org/sharded"};
    for (size_t k = 0; k < 2; k++) {
        sluice_options o = fast_options();
        o.trusted_keys = keys;
        o.ntrusted_keys = 1;
        sluice_model *m = NULL;
        assert_int_equal(sluice_open(locs[k], &o, &m), SLUICE_E_SIGNATURE);
        const char *msg = sluice_errmsg(m);
        if (k == 0 ? !strstr(msg, "not fetched") || strstr(msg, "sluice sign")
                   : !strstr(msg, "sluice.manifest.json.sig: missing") ||
                         !strstr(msg, "has no signature beside it"))
            fail_msg("%s: %s", locs[k], msg);
        sluice_close(m);
        o.trusted_keys = NULL;
        o.ntrusted_keys = 0;
        o.trusted_cas = keys;
        o.ntrusted_cas = 1;
        assert_int_equal(sluice_open(locs[k], &o, &m), SLUICE_E_SIGNATURE);
        if (!strstr(sluice_errmsg(m), k == 0 ? "not fetched" : "model.sig: missing"))
            fail_msg("%s (trusted_cas): %s", locs[k], sluice_errmsg(m));
        sluice_close(m);
    }
    tu_rmtree(dir);
    free(dir);
    free(pub);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signature_fails_closed),
        cmocka_unit_test(test_default_revision_and_token),
        cmocka_unit_test(test_revision_and_file),
        cmocka_unit_test(test_index_and_published_manifest),
        cmocka_unit_test(test_hub_as_mirror),
        cmocka_unit_test(test_lfs_sha256),
        cmocka_unit_test(test_lfs_sha256_mismatch_first_open),
        cmocka_unit_test(test_lfs_sha256_header_served_at_open),
        cmocka_unit_test(test_lfs_sha256_through_lying_proxy),
        cmocka_unit_test(test_lfs_only_is_unverified),
        cmocka_unit_test(test_verify_command),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_token_from_environment),
        cmocka_unit_test(test_token_stays_with_its_host),
        cmocka_unit_test(test_token_host_boundary),
        cmocka_unit_test(test_token_endpoint_with_userinfo),
        cmocka_unit_test(test_pinned_commit_checked),
        cmocka_unit_test(test_percent_in_shard_name),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
