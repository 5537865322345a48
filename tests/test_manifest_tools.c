/* test_manifest_tools.c: the `sluice manifest`, `sluice verify` and
 * `sluice cat` commands, run as programs (SLUICE_BINARY_DIR/sluice):
 * a manifest they write loads and verifies clean (generated models and the
 * real files), file digests equal an independent SHA-256, a flipped byte
 * fails exactly its tensor by name, cat writes verified bytes or nothing,
 * and exit statuses follow their --help. */
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tool_run.h"

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

typedef struct fx {
    char *dir;    /* scratch: stdout, stderr */
    char *model;  /* dir/model: a sharded model */
} fx;

static const char *const k1[] = {"w.0", "tiny.a", "tiny.b", "tiny.c", "w.1"};
static const uint64_t z1[] = {200000, 1, 3, 2, 900000};
static const char *const k2[] = {"w.2", "odd \\\"name\\\"\\n\\u0001", "last"};
static const uint64_t z2[] = {50000, 17, 4};

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->model = mf_write_two_shards(f->dir, "model", 5, k1, z1, 3, k2, z2);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, NULL);
    free(f);
    return 0;
}

/* Opens path with manifest (NULL: sidecar) and policy REQUIRE. */
static sluice_model *open_require(const char *path, const char *manifest)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_REQUIRE;
    o.manifest_path = manifest;
    sluice_model *m = NULL;
    if (sluice_open(path, &o, &m) != SLUICE_OK)
        fail_msg("open %s: %s", path, sluice_errmsg(m));
    return m;
}

/* b3sum's digest of the file at path (the b3sum program; Debian package
 * b3sum): 0, or -1 when it is not there to ask. */
static int b3sum_file(const char *path, uint8_t out[32])
{
    char cmd[4200], line[128];
    snprintf(cmd, sizeof cmd, "b3sum --no-names '%s' 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    int ok = fgets(line, sizeof line, p) && strlen(line) >= 64;
    for (int j = 0; ok && j < 32; j++) {
        unsigned v;
        ok = sscanf(line + 2 * j, "%2x", &v) == 1;
        out[j] = (uint8_t)v;
    }
    return pclose(p) == 0 && ok ? 0 : -1;
}

/* The manifest's file digests and sizes equal EVP's SHA-256 over the
 * whole file (or b3sum's BLAKE3, where the manifest is BLAKE3). */
static void check_file_digests(sluice_model *m)
{
    for (size_t i = 0; i < sluice_file_count(m); i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        uint8_t want[32], got[32];
        uint64_t size = 0;
        assert_int_equal(sluice_file_info(m, i, &fi), SLUICE_OK);
        assert_int_equal(sluice_manifest_file(m, i, got, &size), SLUICE_OK);
        size_t len = 0;
        void *all = tu_read_file(fi.path, &len);
        assert_non_null(all);
        mf_sha256(all, len, want);
        free(all);
        if (sluice_digest_algorithm(m) == SLUICE_ALG_BLAKE3 && b3sum_file(fi.path, want) < 0) {
            print_message("b3sum not installed: %s's BLAKE3 not cross-checked\n", fi.path);
            continue;
        }
        assert_memory_equal(got, want, 32);
        assert_int_equal(size, len);
    }
}

/* ---------------------------------------------------------------- tests */

/* `sluice synth` of one file writes model.safetensors.manifest.json
 * beside it; `sluice verify DIR` finds it and says so. */
static void synth_directory_verifies(void **state)
{
    fx *f = *state;
    char *out = tu_join(f->dir, "synth1");
    run_result r = run(f->dir, "synth", "tiny", out, "--shards", "1", NULL);
    expect_status(&r, 0, "synth");
    run_free(&r);
    r = run(f->dir, "verify", out, "-q", NULL);
    expect_status(&r, 0, "verify of a synth directory");
    char want[4200];
    snprintf(want, sizeof want, "manifest %s/model.safetensors.manifest.json\n", out);
    if (strncmp(r.out, want, strlen(want)) != 0)
        fail_msg("verify does not name the manifest it used (%s): %s", want, r.out);
    assert_non_null(strstr(r.out, "39 tensors verified, 0 failed"));
    run_free(&r);
    tu_rmtree(out);
    free(out);
}

static void manifest_sidecar_verifies(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->model, "sluice.manifest.json");
    run_result r = run(f->dir, "manifest", f->model, "-o", side, NULL);
    expect_status(&r, 0, "manifest");
    assert_int_equal(r.out_len, 0);
    assert_int_equal(r.err_len, 0); /* no progress bar: stderr is not a terminal */
    run_free(&r);
    sluice_model *m = open_require(f->model, NULL);
    assert_string_equal(sluice_manifest_path(m), side);
    check_file_digests(m);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    r = run(f->dir, "verify", f->model, "--files", NULL);
    expect_status(&r, 0, "verify");
    assert_non_null(strstr(r.out, "8 tensors verified, 0 failed, 2 files verified, 0 failed"));
    run_free(&r);
    free(side);
}

/* --sign-key: the manifest written to -o FILE and signed into FILE.sig
 * by the library's one signer, the bytes `sluice sign` writes; verify
 * accepts it with the public key. */
static void manifest_sign_key(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->model, "sluice.manifest.json"), *k = tu_join(f->dir, "k");
    char *key = tu_join(f->dir, "k.key"), *pub = tu_join(f->dir, "k.pub");
    char *other = tu_join(f->dir, "other.sig"), sig[2048];
    snprintf(sig, sizeof sig, "%s.sig", side);
    run_result r = run(f->dir, "keygen", "--out", k, NULL);
    expect_status(&r, 0, "keygen");
    run_free(&r);
    r = run(f->dir, "manifest", f->model, "-o", side, "--sign-key", key, NULL);
    expect_status(&r, 0, "manifest --sign-key");
    run_free(&r);
    r = run(f->dir, "verify", f->model, "--key", pub, "-q", NULL);
    expect_status(&r, 0, "verify --key of the signed manifest");
    run_free(&r);
    r = run(f->dir, "sign", side, "--key", key, "-o", other, NULL);
    expect_status(&r, 0, "sign");
    run_free(&r);
    size_t a_len = 0, b_len = 0;
    char *a = tu_read_file(sig, &a_len), *b = tu_read_file(other, &b_len);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a_len, b_len);
    assert_memory_equal(a, b, a_len); /* one signer */
    free(a);
    free(b);
    r = run(f->dir, "manifest", f->model, "--sign-key", key, NULL);
    expect_status(&r, 2, "manifest --sign-key to stdout");
    assert_non_null(strstr(r.err, "-o FILE"));
    run_free(&r);
    r = run(f->dir, "manifest", f->model, "-o", side, "--sign-key", pub, NULL);
    expect_status(&r, 3, "manifest --sign-key with a public key");
    run_free(&r);
    free(side);
    free(k);
    free(key);
    free(pub);
    free(other);
}

static void manifest_stdout_and_flat(void **state)
{
    fx *f = *state;
    char *mpath = tu_join(f->dir, "m.json");
    run_result r = run(f->dir, "manifest", f->model, NULL);
    expect_status(&r, 0, "manifest to stdout");
    assert_non_null(strstr(r.out, "\"format\": \"sluice-manifest\""));
    /* tensors in model order */
    const char *a = strstr(r.out, "\"w.0\""), *b = strstr(r.out, "\"tiny.a\""), *c = strstr(r.out, "\"last\"");
    assert_true(a && b && c && a < b && b < c);
    tu_write_file(mpath, r.out, r.out_len);
    run_free(&r);
    sluice_model *m = open_require(f->model, mpath);
    check_file_digests(m);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    r = run(f->dir, "manifest", "--flat", f->model, NULL);
    expect_status(&r, 0, "manifest --flat");
    assert_null(strstr(r.out, "\"format\""));
    assert_null(strstr(r.out, "\"files\""));
    tu_write_file(mpath, r.out, r.out_len);
    run_free(&r);
    m = open_require(f->model, mpath);
    uint8_t d[32];
    assert_int_equal(sluice_manifest_file(m, 0, d, NULL), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    r = run(f->dir, "verify", f->model, "--manifest", mpath, NULL);
    expect_status(&r, 0, "verify flat");
    run_free(&r);
    /* --files with a manifest that has no file digests fails */
    r = run(f->dir, "verify", f->model, "--manifest", mpath, "--files", NULL);
    expect_status(&r, 1, "verify --files, flat manifest");
    assert_int_equal(count(r.out, "FAILED file"), 2);
    run_free(&r);
    free(mpath);
}

/* Version 2 by default, version 1 with --v1, BLAKE3 with --algorithm;
 * each reads back as such and verifies; wrong combinations are usage
 * errors. */
static void manifest_versions_and_algorithms(void **state)
{
    fx *f = *state;
    char *mpath = tu_join(f->dir, "m.json");
    static const struct {
        const char *args[3];
        int version;
        sluice_algorithm alg;
    } forms[] = {
        {{NULL}, 2, SLUICE_ALG_SHA256},
        {{"--v1", NULL}, 1, SLUICE_ALG_SHA256},
        {{"--algorithm", "sha256", NULL}, 2, SLUICE_ALG_SHA256},
        {{"--algorithm", "blake3", NULL}, 2, SLUICE_ALG_BLAKE3},
    };
    for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
        if (forms[k].alg == SLUICE_ALG_BLAKE3 && !sluice_algorithm_supported(SLUICE_ALG_BLAKE3))
            continue;
        run_result r = run(f->dir, "manifest", f->model, "-o", mpath,
                           forms[k].args[0], forms[k].args[1], NULL);
        expect_status(&r, 0, "manifest");
        run_free(&r);
        sluice_model *m = open_require(f->model, mpath);
        assert_int_equal(sluice_manifest_version(m), forms[k].version);
        assert_int_equal(sluice_digest_algorithm(m), forms[k].alg);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        r = run(f->dir, "verify", f->model, "--manifest", mpath, "--files", NULL);
        expect_status(&r, 0, "verify --files");
        assert_non_null(strstr(r.out, "8 tensors verified, 0 failed, 2 files verified, 0 failed"));
        run_free(&r);
    }
    static const struct {
        const char *args[4];
        const char *needle;
    } bad[] = {
        {{"--algorithm", "md5", NULL}, "not sha256 or blake3"},
        {{"--algorithm", "blake3", "--v1", NULL}, "needs version 2"},
        {{"--flat", "--algorithm", "blake3", NULL}, "needs version 2"},
        {{"--v1", "--flat", NULL}, "exclude each other"},
        {{"--algorithm", NULL}, "needs sha256 or blake3"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        run_result r = run(f->dir, "manifest", f->model, bad[k].args[0], bad[k].args[1],
                           bad[k].args[2], NULL);
        expect_status(&r, 2, bad[k].needle);
        if (!strstr(r.err, bad[k].needle))
            fail_msg("stderr lacks \"%s\": %s", bad[k].needle, r.err);
        run_free(&r);
    }
    free(mpath);
}

/* `sluice manifest --parts builtin` on a synth tiny-qwen2 (q/k/v biases):
 * the manifest opens, each split tensor has its part digests (the
 * library's digest of the part), a rank's `sluice shard` reads exactly
 * its bytes, a rules file of one's own and bad --parts / --worlds are
 * refused with exit 2. */
static void manifest_parts_and_shard(void **state)
{
    fx *f = *state;
    char *out = tu_join(f->dir, "tp"), *side = tu_join(f->dir, "tp/sluice.manifest.json");
    run_result r = run(f->dir, "synth", "tiny-qwen2", out, NULL);
    expect_status(&r, 0, "synth");
    run_free(&r);
    r = run(f->dir, "manifest", out, "--parts", "builtin", "--worlds", "2,4", "-q", "-o", side,
            NULL);
    expect_status(&r, 0, "manifest --parts");
    run_free(&r);
    size_t len = 0;
    char *text = tu_read_file(side, &len);
    assert_non_null(text);
    /* per layer: q, k, v, gate, up (dim 0), o, down (dim 1), q/k/v bias
     * (dim 0); and the embedding */
    assert_int_equal(count(text, "\"parts\": {\"dim\": 0"), 4 * 8 + 1);
    assert_int_equal(count(text, "\"parts\": {\"dim\": 1"), 4 * 2);
    assert_null(strstr(text, "\"8\": ["));
    free(text);
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = NULL;
    if (sluice_open(out, &o, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    unsigned char buf[1 << 14];
    const char *down = "model.layers.2.mlp.down_proj.weight";
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, down, &ti), SLUICE_OK);
    assert_true(ti.nbytes / 4 <= sizeof buf);
    assert_int_equal(sluice_read_part_into(m, down, 1, 3, 4, buf, ti.nbytes / 4), SLUICE_OK);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(st.bytes_read, ti.nbytes / 4);
    assert_int_equal(st.part_fallback_bytes, 0);
    sluice_close(m);
    r = run(f->dir, "shard", out, "--rank", "1", "--world", "4", "--json", NULL);
    expect_status(&r, 0, "shard");
    assert_non_null(strstr(r.out, "\"part_fallback_bytes\": 0,"));
    unsigned long long kept = 0, rd = 1;
    const char *k = strstr(r.out, "\"kept_bytes\": "), *b = strstr(r.out, "\"bytes_read\": ");
    assert_true(k && b && sscanf(k + 14, "%llu", &kept) == 1 && sscanf(b + 14, "%llu", &rd) == 1);
    assert_int_equal(kept, rd);
    run_free(&r);
    char *rules = tu_join(f->dir, "rules.txt");
    mf_write_text(rules, "*embed_tokens* 1\n");
    r = run(f->dir, "manifest", out, "--parts", rules, "-q", NULL);
    expect_status(&r, 0, "manifest --parts FILE");
    assert_int_equal(count(r.out, "\"parts\""), 1);
    run_free(&r);
    static const struct {
        const char *a, *b, *needle;
        int status;   /* 3: a file that cannot be opened; 2: usage */
    } bad[] = {
        {"--parts", "/nonexistent/rules", "/nonexistent/rules", 3},
        {"--worlds", "2,4", "needs --parts", 2},
        {"--parts", "builtin\0", NULL, 0},
    };
    for (size_t j = 0; j < 2; j++) {
        r = run(f->dir, "manifest", out, bad[j].a, bad[j].b, NULL);
        expect_status(&r, bad[j].status, bad[j].needle);
        if (!strstr(r.err, bad[j].needle))
            fail_msg("stderr lacks \"%s\": %s", bad[j].needle, r.err);
        run_free(&r);
    }
    mf_write_text(rules, "*embed_tokens* x\n");
    r = run(f->dir, "manifest", out, "--parts", rules, NULL);
    expect_status(&r, 2, "bad rules");
    assert_non_null(strstr(r.err, "rules line 1"));
    run_free(&r);
    r = run(f->dir, "manifest", out, "--parts", "builtin", "--worlds", "2,1", NULL);
    expect_status(&r, 2, "world 1");
    run_free(&r);
    r = run(f->dir, "shard", out, "--world", "3", NULL);
    expect_status(&r, 2, "shard world 3");   /* a world the model does not split into: usage */
    assert_non_null(strstr(r.err, "does not split into 3 equal parts"));
    run_free(&r);
    free(rules);
    tu_rmtree(out);
    free(out);
    free(side);
}

/* The same manifest whatever the thread count (1 and 2 threads read each
 * shard once for both digests, 8 hash files and tensors apart); the
 * engine's options are not the manifest's, and say so. */
static void manifest_same_for_any_thread_count(void **state)
{
    fx *f = *state;
    run_result one = run(f->dir, "manifest", f->model, "--threads", "1", NULL);
    expect_status(&one, 0, "manifest --threads 1");
    const char *counts[] = {"2", "8"};
    for (size_t k = 0; k < 2; k++) {
        run_result r = run(f->dir, "manifest", f->model, "--threads", counts[k], NULL);
        expect_status(&r, 0, counts[k]);
        assert_int_equal(r.out_len, one.out_len);
        assert_memory_equal(r.out, one.out, one.out_len);
        run_free(&r);
    }
    run_free(&one);
    run_result r = run(f->dir, "manifest", f->model, "--pool", "1G", NULL);
    expect_status(&r, 2, "manifest --pool");
    assert_non_null(strstr(r.err, "unknown option '--pool'"));
    run_free(&r);
    r = run(f->dir, "manifest", f->model, "--threads", "x", NULL);
    expect_status(&r, 2, "manifest --threads x");
    run_free(&r);
}

/* Names that need escaping survive the round trip. */
static void odd_names_round_trip(void **state)
{
    fx *f = *state;
    char *model = tu_join(f->dir, "odd.safetensors");
    const char *keys[] = {"q\\\"uote", "nul\\u0000in", "nul", "ctl\\u001f\\b\\f", "back\\\\slash", "\\u00e9\\ud83d\\ude00"};
    const uint64_t sizes[] = {3, 5, 7, 11, 13, 17};
    mf_write_model(model, 6, keys, sizes);
    char *side = tu_join(f->dir, "odd.safetensors.manifest.json");
    run_result r = run(f->dir, "manifest", model, "-o", side, NULL);
    expect_status(&r, 0, "manifest of odd names");
    run_free(&r);
    sluice_model *m = open_require(model, NULL); /* every name found again */
    assert_int_equal(sluice_count(m), 6);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    r = run(f->dir, "verify", model, "--files", NULL);
    expect_status(&r, 0, "verify odd names");
    run_free(&r);
    r = run(f->dir, "manifest", "--flat", model, "-o", side, NULL);
    expect_status(&r, 0, "flat manifest of odd names");
    run_free(&r);
    r = run(f->dir, "verify", model, NULL);
    expect_status(&r, 0, "verify odd names, flat");
    run_free(&r);
    free(side);
    free(model);
}

/* One byte flipped in one tensor (several positions and tensors, small
 * coalesced ones included): verify names exactly that tensor. */
static void verify_reports_flipped_tensor(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->model, "sluice.manifest.json");
    run_result r = run(f->dir, "manifest", f->model, "-o", side, NULL);
    expect_status(&r, 0, "manifest");
    run_free(&r);
    const struct { const char *name, *quoted; uint64_t at; } cases[] = {
        {"w.0", "\"w.0\"", 0},
        {"w.1", "\"w.1\"", 450000},
        {"w.1", "\"w.1\"", 899999},
        {"tiny.b", "\"tiny.b\"", 2},
        {"tiny.a", "\"tiny.a\"", 0},
        {"odd \"name\"\n\x01", "\"odd \\\"name\\\"\\n\\u0001\"", 16},
        {"last", "\"last\"", 3},
    };
    sluice_model *m = open_require(f->model, NULL);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find(m, cases[k].name, &info), SLUICE_OK);
        char *file = strdup(info.file);
        mf_flip_byte(file, info.offset + cases[k].at);
        r = run(f->dir, "verify", f->model, "--files", NULL);
        expect_status(&r, 1, cases[k].name);
        char want[128];
        snprintf(want, sizeof want, "FAILED tensor %s", cases[k].quoted);
        if (count(r.out, "FAILED tensor") != 1 || !strstr(r.out, want))
            fail_msg("expected only %s:\n%s", want, r.out);
        assert_int_equal(count(r.out, "FAILED file"), 1);
        assert_non_null(strstr(r.out, "7 tensors verified, 1 failed, 1 files verified, 1 failed"));
        run_free(&r);
        mf_flip_byte(file, info.offset + cases[k].at);
        free(file);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    r = run(f->dir, "verify", f->model, NULL);
    expect_status(&r, 0, "verify restored");
    run_free(&r);
    free(side);
}

static void cat_writes_verified_bytes(void **state)
{
    fx *f = *state;
    char *side = tu_join(f->model, "sluice.manifest.json");
    /* without a manifest: plain bytes */
    run_result r = run(f->dir, "cat", f->model, "w.2", NULL);
    expect_status(&r, 0, "cat, no manifest");
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(f->model, NULL, &m), SLUICE_OK);
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, "w.2", &info), SLUICE_OK);
    char *file = strdup(info.file);
    uint64_t off = info.offset, n = info.nbytes;
    assert_int_equal(sluice_close(m), SLUICE_OK);
    void *want = tu_pread_range(file, off, (size_t)n);
    assert_int_equal(r.out_len, n);
    assert_memory_equal(r.out, want, (size_t)n);
    run_free(&r);

    r = run(f->dir, "manifest", f->model, "-o", side, NULL);
    expect_status(&r, 0, "manifest");
    run_free(&r);
    r = run(f->dir, "cat", f->model, "w.2", NULL);
    expect_status(&r, 0, "cat, verified");
    assert_int_equal(r.out_len, n);
    assert_memory_equal(r.out, want, (size_t)n);
    run_free(&r);

    mf_flip_byte(file, off + n - 1);
    r = run(f->dir, "cat", f->model, "w.2", NULL);
    expect_status(&r, 1, "cat, corrupt");
    assert_int_equal(r.out_len, 0); /* nothing at all */
    assert_non_null(strstr(r.err, "\"w.2\""));
    run_free(&r);
    r = run(f->dir, "cat", f->model, "last", NULL); /* the others still fine */
    expect_status(&r, 0, "cat, other tensor");
    assert_int_equal(r.out_len, 4);
    run_free(&r);
    /* an explicit manifest that lacks the tensor: refused */
    char *partial = tu_join(f->dir, "partial.json");
    mf_write_text(partial, "{\"last\": \"0000000000000000000000000000000000000000000000000000000000000000\"}");
    r = run(f->dir, "cat", f->model, "w.0", "--manifest", partial, NULL);
    expect_status(&r, 1, "cat, no digest for it");
    assert_int_equal(r.out_len, 0);
    run_free(&r);
    r = run(f->dir, "cat", f->model, "nope", NULL);
    expect_status(&r, 2, "cat, no such tensor");
    run_free(&r);
    mf_flip_byte(file, off + n - 1);
    free(partial);
    free(want);
    free(file);
    free(side);
}

/* `sluice --version` prints the version of the library it loaded. */
static void version_is_the_library_s(void **state)
{
    fx *f = *state;
    run_result r = run(f->dir, "--version", NULL);
    expect_status(&r, 0, "--version");
    char want[64];
    snprintf(want, sizeof want, "sluice %s\n", sluice_version());
    assert_string_equal(r.out, want);
    run_free(&r);
}

static void usage_and_open_errors(void **state)
{
    fx *f = *state;
    const char *const *cases[] = {
        (const char *const[]){"verify", NULL},
        (const char *const[]){"verify", "--bogus", NULL},
        (const char *const[]){"verify", "--pool", "12Q", NULL},
        (const char *const[]){"manifest", NULL},
        (const char *const[]){"cat", NULL},
        (const char *const[]){"cat", "x", NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *const *a = cases[k];
        run_result r = run(f->dir, a[0], a[1], a[1] ? a[2] : NULL, a[1] && a[2] ? a[3] : NULL, NULL);
        expect_status(&r, 2, a[0]);
        run_free(&r);
    }
    /* a model that is not there: cannot open (3) */
    run_result r = run(f->dir, "verify", "/nonexistent/model.safetensors", NULL);
    expect_status(&r, 3, "verify /nonexistent/model.safetensors");
    run_free(&r);
    /* verify with no manifest at all: REQUIRE names the sidecar; the
     * manifest cannot be opened (3) */
    r = run(f->dir, "verify", f->model, NULL);
    expect_status(&r, 3, "verify without manifest");
    assert_non_null(strstr(r.err, "sluice.manifest.json"));
    run_free(&r);
    /* a manifest naming a tensor the model lacks: integrity (1), the name listed */
    char *mpath = tu_join(f->dir, "m.json");
    r = run(f->dir, "manifest", "--flat", f->model, "-o", mpath, NULL);
    expect_status(&r, 0, "manifest");
    run_free(&r);
    size_t len = 0;
    char *text = tu_read_file(mpath, &len);
    char *line = strstr(text, "\"last\": ");
    assert_non_null(line);
    memcpy(line, "\"lost\"", 6); /* now names a tensor the model lacks */
    tu_write_file(mpath, text, len);
    free(text);
    r = run(f->dir, "verify", f->model, "--manifest", mpath, NULL);
    expect_status(&r, 1, "verify, manifest names an unknown tensor");
    assert_non_null(strstr(r.err, "\"lost\""));
    run_free(&r);
    /* help */
    r = run(f->dir, "verify", "--help", NULL);
    expect_status(&r, 0, "verify --help");
    assert_non_null(strstr(r.out, "Exit status"));
    run_free(&r);
    r = run(f->dir, "manifest", "--help", NULL);
    expect_status(&r, 0, "manifest --help");
    assert_non_null(strstr(r.out, "stdout"));
    run_free(&r);
    free(mpath);
}

/* Every real file: manifest + verify --files clean, file digests equal
 * an independent SHA-256. The corpus is read-only: manifests go to tmp. */
static void real_files_round_trip(void **state)
{
    fx *f = *state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char **files = NULL;
    size_t n = tu_list_safetensors(real, &files);
    char *sharded = tu_join(real, "SafeTensors.jl__sharded");
    char *mpath = tu_join(f->dir, "real.json");
    for (size_t j = 0; j < 2 * (n + 1); j++) {
        size_t k = j % (n + 1);
        const char *path = k < n ? files[k] : sharded;
        const char *alg = j > n ? "blake3" : "sha256";
        if (j > n && !sluice_algorithm_supported(SLUICE_ALG_BLAKE3))
            break;
        run_result r = run(f->dir, "manifest", path, "-o", mpath, "--algorithm", alg, NULL);
        expect_status(&r, 0, path);
        run_free(&r);
        sluice_model *m = open_require(path, mpath);
        check_file_digests(m);
        size_t nt = sluice_count(m);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        r = run(f->dir, "verify", path, "--manifest", mpath, "--files", NULL);
        expect_status(&r, 0, path);
        char want[96];
        snprintf(want, sizeof want, "%zu tensors verified, 0 failed, ", nt);
        if (!strstr(r.out, want))
            fail_msg("%s: %s", path, r.out);
        run_free(&r);
    }
    free(mpath);
    free(sharded);
    tu_free_list(files, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(manifest_sidecar_verifies, setup, teardown),
        cmocka_unit_test_setup_teardown(synth_directory_verifies, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_parts_and_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_stdout_and_flat, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_versions_and_algorithms, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_same_for_any_thread_count, setup, teardown),
        cmocka_unit_test_setup_teardown(odd_names_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(verify_reports_flipped_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(cat_writes_verified_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(usage_and_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_sign_key, setup, teardown),
        cmocka_unit_test_setup_teardown(version_is_the_library_s, setup, teardown),
        cmocka_unit_test_setup_teardown(real_files_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, tool_group_setup, NULL);
}
