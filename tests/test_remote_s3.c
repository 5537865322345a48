/* test_remote_s3.c: s3:// models against s3rver 3.7 (npm), started here
 * on 127.0.0.1: path-style and virtual-host-style addressing, signed
 * (SigV4) and anonymous requests, the endpoint from the option and from
 * AWS_ENDPOINT_URL, a sharded model under a prefix, a missing key, and
 * remote signatures beside an S3 manifest (M.sig, model.sig: fetched and
 * checked, refused when tampered, failing closed when absent).
 *
 * s3rver does not check signatures and mishandles suffix and multi-range
 * requests (sluice sends neither): this checks the request format and
 * listing-free access, not authentication (test_remote_faults checks the
 * signed headers themselves). s3rver is installed with npm into the build
 * folder on first run; when that is impossible (no npm, no registry) the
 * test is skipped (77) with the reason. */
#include "remote_fixture.h"
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

static rf_server s3;
static char *data_dir, *local_dir;
static char endpoint[128], vhost_endpoint[128];

/* PUT of a local file as bucket/key (s3rver takes unsigned PUTs). */
static int put_object(const char *key, const char *file)
{
    size_t len;
    void *body = tu_read_file(file, &len);
    if (!body)
        return 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s3.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "PUT /models/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n"
                     "Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                     key, len);
    ok = ok && write(s, head, (size_t)n) == n;
    for (size_t off = 0; ok && off < len;) {
        ssize_t w = write(s, (char *)body + off, len - off);
        ok = w > 0;
        off += w > 0 ? (size_t)w : 0;
    }
    char reply[256] = {0};
    ok = ok && read(s, reply, sizeof reply - 1) > 0 && strstr(reply, " 200 ");
    if (s >= 0)
        close(s);
    free(body);
    return ok;
}

static void run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void run(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("failed: %s", cmd);
}

static void skip_all(const char *why)
{
    fprintf(stderr, "skipped: %s\n", why);
    exit(77);
}

static void write_model(const char *path, const char *prefix, uint64_t big)
{
    char header[1024];
    snprintf(header, sizeof header,
             "{\"__metadata__\":{\"k\":\"v\"},"
             "\"%sw\":{\"dtype\":\"F32\",\"shape\":[%llu],\"data_offsets\":[0,%llu]},"
             "\"%sb\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[%llu,%llu]}}",
             prefix, (unsigned long long)big / 4, (unsigned long long)big, prefix,
             (unsigned long long)big, (unsigned long long)big + 5);
    tu_write_safetensors(path, header, NULL, (size_t)big + 5);
}

static char *keys_dir;

/* Remote signatures over S3 (issue 38 item 5): KEY/m.safetensors, its
 * manifest and what signs it, made locally by the sluice command and
 * uploaded under signed-NAME/: ed (M.sig by ed), ed-other (by ed2),
 * ed-tampered (the manifest changed after ed signed it), unsigned (no
 * signature), ms (an OpenSSF model.sig by ec). */
static void signed_models(void)
{
    const char *b = SLUICE_BINARY_DIR;
    keys_dir = tu_tmpdir();
    run("%s/sluice keygen --out %s/ed >/dev/null && %s/sluice keygen --out %s/ed2 >/dev/null && "
        "%s/sluice keygen --out %s/ec --curve p256 >/dev/null", b, keys_dir, b, keys_dir, b,
        keys_dir);
    static const char *const dirs[] = {"ed", "ed-other", "ed-tampered", "unsigned", "ms"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char d[1024], key[1100];
        snprintf(d, sizeof d, "%s/signed-%s", local_dir, dirs[i]);
        mkdir(d, 0755);
        char *p = tu_join(d, "m.safetensors");
        write_model(p, "", 70000);
        run("%s/sluice manifest '%s' -o '%s/m.safetensors.manifest.json' >/dev/null", b, p, d);
        if (!strcmp(dirs[i], "ms"))
            run("%s/sluice sign %s --format model-signing --key %s/ec.key >/dev/null", b, d,
                keys_dir);
        else if (strcmp(dirs[i], "unsigned"))
            run("%s/sluice sign %s/m.safetensors.manifest.json --key %s/%s.key >/dev/null", b, d,
                keys_dir, strcmp(dirs[i], "ed-other") ? "ed" : "ed2");
        if (!strcmp(dirs[i], "ed-tampered"))
            run("printf ' ' >>%s/m.safetensors.manifest.json", d);
        static const char *const files[] = {"m.safetensors", "m.safetensors.manifest.json",
                                            "m.safetensors.manifest.json.sig", "model.sig"};
        for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
            char *f = tu_join(d, files[k]);
            snprintf(key, sizeof key, "signed-%s/%s", dirs[i], files[k]);
            if (access(f, F_OK) == 0 && !put_object(key, f))
                fail_msg("cannot upload %s to s3rver", key);
            free(f);
        }
        free(p);
    }
}

static int setup(void **state)
{
    char npm_dir[1024], bin[1200], cmd[4096];
    rf_skip_without_curl();
    snprintf(npm_dir, sizeof npm_dir, "%s/s3rver-npm", SLUICE_BINARY_DIR);
    snprintf(bin, sizeof bin, "%s/node_modules/.bin/s3rver", npm_dir);
    if (access(bin, X_OK) != 0) {
        if (system("command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1") != 0)
            skip_all("npm or node is not installed (s3rver comes from npm)");
        mkdir(npm_dir, 0755);
        snprintf(cmd, sizeof cmd, "cd '%s' && timeout 400 npm install --no-audit --no-fund "
                 "--silent s3rver@3.7 >npm.log 2>&1", npm_dir);
        if (system(cmd) != 0 || access(bin, X_OK) != 0)
            skip_all("npm install s3rver@3.7 failed (see s3rver-npm/npm.log in the build folder)");
    }
    data_dir = tu_tmpdir();
    local_dir = tu_tmpdir();
    for (int attempt = 0; attempt < 5 && !s3.pid; attempt++) {
        s3.port = rf_free_port();
        char port[16];
        snprintf(port, sizeof port, "%u", s3.port);
        char *const argv[] = {bin, "-d", data_dir, "-a", "127.0.0.1", "-p", port, "-s",
                              "--service-endpoint", "localhost", "--configure-bucket", "models",
                              NULL};
        s3.pid = rf_spawn_quiet(bin, argv);
        if (!rf_wait_ready(&s3)) {
            if (s3.pid > 0)
                kill(s3.pid, SIGKILL), waitpid(s3.pid, NULL, 0);
            s3.pid = 0;
        }
    }
    if (!s3.pid)
        skip_all("s3rver did not start");
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", s3.port);
    snprintf(vhost_endpoint, sizeof vhost_endpoint, "http://s3.localhost:%u", s3.port);
    /* one file, and a sharded model under a prefix */
    char *one = tu_join(local_dir, "model.safetensors");
    write_model(one, "", 3u << 20);
    char *s1 = tu_join(local_dir, "model-00001-of-00002.safetensors");
    char *s2 = tu_join(local_dir, "model-00002-of-00002.safetensors");
    write_model(s1, "a.", 1024);
    write_model(s2, "z.", 40000);
    const char *idx = "{\"weight_map\":{\"a.w\":\"model-00001-of-00002.safetensors\","
                      "\"a.b\":\"model-00001-of-00002.safetensors\","
                      "\"z.w\":\"model-00002-of-00002.safetensors\","
                      "\"z.b\":\"model-00002-of-00002.safetensors\"}}";
    char *ip = tu_join(local_dir, "model.safetensors.index.json");
    tu_write_file(ip, idx, strlen(idx));
    /* a [64, 1024] U8 matrix, for a dim-1 part (64 rows of 256 bytes) */
    char *tp = tu_join(local_dir, "tp.safetensors");
    tu_write_safetensors(tp, "{\"t\":{\"dtype\":\"U8\",\"shape\":[64,1024],"
                         "\"data_offsets\":[0,65536]}}", NULL, 65536);
    if (!put_object("tp/model.safetensors", tp))
        fail_msg("cannot upload the models to s3rver");
    free(tp);
    if (!put_object("one/model.safetensors", one) ||
        !put_object("sharded/model-00001-of-00002.safetensors", s1) ||
        !put_object("sharded/model-00002-of-00002.safetensors", s2) ||
        !put_object("sharded/model.safetensors.index.json", ip))
        fail_msg("cannot upload the models to s3rver");
    free(one);
    free(s1);
    free(s2);
    free(ip);
    signed_models();
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    if (s3.pid > 0) {
        kill(s3.pid, SIGTERM);
        waitpid(s3.pid, NULL, 0);
    }
    tu_rmtree(data_dir);
    tu_rmtree(local_dir);
    if (keys_dir)
        tu_rmtree(keys_dir);
    free(data_dir);
    free(local_dir);
    free(keys_dir);
    (void)state;
    return 0;
}

static void compare(const char *local, const char *loc, const sluice_options *o)
{
    sluice_model *l, *r = NULL;
    assert_int_equal(sluice_open(local, NULL, &l), SLUICE_OK);
    int rc = sluice_open(loc, o, &r);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s", loc, sluice_errmsg(r));
    assert_int_equal(sluice_count(r), sluice_count(l));
    for (size_t i = 0; i < sluice_count(l); i++) {
        sluice_tensor *a, *b;
        assert_int_equal(sluice_acquire_index(l, i, &a), SLUICE_OK);
        rc = sluice_acquire_index(r, i, &b);
        if (rc != SLUICE_OK)
            fail_msg("acquire %zu of %s: %s", i, loc, sluice_errmsg(r));
        assert_int_equal(sluice_tensor_size(a), sluice_tensor_size(b));
        assert_memory_equal(sluice_tensor_data(a), sluice_tensor_data(b), sluice_tensor_size(a));
        sluice_release(a);
        sluice_release(b);
    }
    struct sluice_file_info fi = {.size = sizeof fi};
    assert_int_equal(sluice_file_info(r, 0, &fi), SLUICE_OK);
    assert_int_equal(fi.metadata_count, 1);
    sluice_close(r);
    sluice_close(l);
}

static void set_credentials(int on)
{
    if (on) {
        setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
        setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
    } else {
        unsetenv("AWS_ACCESS_KEY_ID");
        unsetenv("AWS_SECRET_ACCESS_KEY");
    }
    unsetenv("AWS_SESSION_TOKEN");
}

static void test_path_style(void **state)
{
    char *one = tu_join(local_dir, "model.safetensors");
    char *ip = tu_join(local_dir, "model.safetensors.index.json");
    sluice_options o;
    sluice_options_init(&o);
    o.s3_endpoint = endpoint;
    for (int signed_ = 1; signed_ >= 0; signed_--) {
        set_credentials(signed_);
        compare(one, "s3://models/one/model.safetensors", &o);
        compare(ip, "s3://models/sharded/model.safetensors.index.json", &o);
        compare(ip, "s3://models/sharded/", &o);
        compare(one, "s3://models/one", &o);   /* a prefix holding model.safetensors */
    }
    free(one);
    free(ip);
    (void)state;
}

static void test_virtual_host_style(void **state)
{
    char *one = tu_join(local_dir, "model.safetensors");
    char *ip = tu_join(local_dir, "model.safetensors.index.json");
    sluice_options o;
    sluice_options_init(&o);
    o.s3_endpoint = vhost_endpoint;
    o.s3_addressing = SLUICE_S3_VIRTUAL_HOST;
    set_credentials(1);
    compare(one, "s3://models/one/model.safetensors", &o);
    compare(ip, "s3://models/sharded", &o);
    free(one);
    free(ip);
    (void)state;
}

static void test_endpoint_from_environment(void **state)
{
    char *one = tu_join(local_dir, "model.safetensors");
    setenv("AWS_ENDPOINT_URL", endpoint, 1);
    setenv("AWS_REGION", "us-west-2", 1);
    set_credentials(1);
    compare(one, "s3://models/one/model.safetensors", NULL);
    unsetenv("AWS_ENDPOINT_URL");
    unsetenv("AWS_REGION");
    free(one);
    (void)state;
}

static void test_missing_objects(void **state)
{
    sluice_options o;
    sluice_options_init(&o);
    o.s3_endpoint = endpoint;
    setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "the-SECRET-key", 1);
    sluice_model *m;
    assert_int_equal(sluice_open("s3://models/one/absent.safetensors", &o, &m), SLUICE_E_NO_FILES);
    assert_non_null(strstr(sluice_errmsg(m), "404"));
    assert_null(strstr(sluice_errmsg(m), "SECRET"));
    sluice_close(m);
    assert_int_equal(sluice_open("s3://nobucket/x.safetensors", &o, &m), SLUICE_E_NO_FILES);
    sluice_close(m);
    assert_int_equal(sluice_open("s3:///x.safetensors", &o, &m), SLUICE_E_INVAL);
    sluice_close(m);
    set_credentials(0);
    (void)state;
}

/* A dim-1 part over S3 (rows 256 bytes, 768 apart): the rows in a
 * multi-range request, or, where the server answers it with one range or
 * the whole object, in coalesced single ranges; either way the part's
 * bytes equal a local read's. */
static void test_part_over_s3(void **state)
{
    char *tp = tu_join(local_dir, "tp.safetensors");
    unsigned char want[16384], got[16384];
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *l, *r = NULL;
    assert_int_equal(sluice_open(tp, &o, &l), SLUICE_OK);
    assert_int_equal(sluice_read_part_into(l, "t", 1, 1, 4, want, sizeof want), SLUICE_OK);
    sluice_close(l);
    o.s3_endpoint = endpoint;
    for (int signed_ = 1; signed_ >= 0; signed_--) {
        set_credentials(signed_);
        if (sluice_open("s3://models/tp/model.safetensors", &o, &r) != SLUICE_OK)
            fail_msg("open: %s", sluice_errmsg(r));
        memset(got, 0, sizeof got);
        int rc = sluice_read_part_into(r, "t", 1, 1, 4, got, sizeof got);
        if (rc != SLUICE_OK)
            fail_msg("part: %s", sluice_errmsg(r));
        assert_memory_equal(got, want, sizeof want);
        struct sluice_stats st = {.size = sizeof st};
        assert_int_equal(sluice_stats(r, &st), SLUICE_OK);
        assert_true(st.remote_reads >= 1);
        fprintf(stderr, "part over s3rver: %llu requests, %llu bytes\n",
                (unsigned long long)st.remote_reads, (unsigned long long)st.remote_bytes);
        sluice_close(r);
    }
    free(tp);
    (void)state;
}

/* Opens s3://models/signed-DIR/m.safetensors trusting keys_dir/KEY.pub;
 * returns the code, wants want and words in the message. */
static void expect_signed(const char *dir, const char *key, int want, const char *words)
{
    char pub[1200], loc[256];
    snprintf(pub, sizeof pub, "%s/%s.pub", keys_dir, key);
    snprintf(loc, sizeof loc, "s3://models/signed-%s/m.safetensors", dir);
    const char *list[] = {pub};
    sluice_options o;
    sluice_options_init(&o);
    o.s3_endpoint = endpoint;
    o.trusted_keys = list;
    o.ntrusted_keys = 1;
    o.remote_attempts = 2;
    o.remote_backoff_ms = 10;
    sluice_model *m = NULL;
    int rc = sluice_open(loc, &o, &m);
    const char *msg = m ? sluice_errmsg(m) : "";
    if (rc != want || (words && !strstr(msg, words)))
        fail_msg("%s with key %s: %s (%s), wanted %s and \"%s\"", loc, key, sluice_strerror(rc),
                 msg, sluice_strerror(want), words ? words : "");
    if (rc == SLUICE_OK) {
        assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED);
        for (size_t i = 0; i < sluice_count(m); i++) {
            sluice_tensor *t;
            assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
            sluice_release(t);
        }
    }
    sluice_close(m);
}

/* A remote manifest's signature over S3 (M.sig, model.sig beside it) is
 * fetched and checked, signed requests and anonymous alike: accepted when
 * a trusted key signed it, refused when another did or the manifest
 * changed, and, with trusted keys and none there, the open fails closed. */
static void test_signatures_over_s3(void **state)
{
    for (int signed_ = 1; signed_ >= 0; signed_--) {
        set_credentials(signed_);
        expect_signed("ed", "ed", SLUICE_OK, NULL);
        expect_signed("ms", "ec", SLUICE_OK, NULL);
        expect_signed("ed-other", "ed", SLUICE_E_SIGNATURE, "not one of the 1 trusted key");
        expect_signed("ed-tampered", "ed", SLUICE_E_SIGNATURE, "changed after it was signed");
        expect_signed("unsigned", "ed", SLUICE_E_SIGNATURE, "has no signature beside it");
        expect_signed("ed", "ed2", SLUICE_E_SIGNATURE, NULL);
    }
    set_credentials(0);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_style),
        cmocka_unit_test(test_virtual_host_style),
        cmocka_unit_test(test_endpoint_from_environment),
        cmocka_unit_test(test_missing_objects),
        cmocka_unit_test(test_part_over_s3),
        cmocka_unit_test(test_signatures_over_s3),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
