/* test_synth_bench.c: `sluice synth` and `sluice bench` as a user runs them.
 *
 * synth: the tiny model opens with the library (directory, index.json and
 * single-file forms), has the names and shapes of its architecture, its
 * manifest is found as the sidecar and matches an independent SHA-256 of
 * the bytes, loading it with policy REQUIRE verifies every tensor, the
 * bytes depend on the seed and not on sharding, and --list states the
 * sizes of the real architectures; its manifest is byte for byte the one
 * `sluice manifest` writes of the same files.
 * bench: one run of every mode over a small sweep, with the CSV checked
 * column by column. No test looks at a speed.
 */
#include "util.h"

#include <openssl/evp.h>
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

#include "sluice.h"

/* ---------------------------------------------------------------- helpers */

/* Runs `sluice ARGS` with stdout and stderr into files of dir; returns the
 * exit status and stdout (malloc'd, may be NULL). stderr is shown when the
 * status is not the one expected. */
static int run_sluice_expect(const char *dir, const char *args, char **out, int expect)
{
    char *o = tu_join(dir, "stdout"), *e = tu_join(dir, "stderr");
    size_t n = strlen(args) + strlen(o) + strlen(e) + strlen(SLUICE_BINARY_DIR) + 64;
    char *cmd = malloc(n);
    assert_non_null(cmd);
    snprintf(cmd, n, "'%s/sluice' %s >'%s' 2>'%s'", SLUICE_BINARY_DIR, args, o, e);
    int status = system(cmd);
    size_t len;
    char *err = tu_read_file(e, &len);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != expect)
        fprintf(stderr, "sluice %s: status %d, stderr:\n%s\n", args, status, err ? err : "");
    free(err);
    if (out)
        *out = tu_read_file(o, &len);
    free(cmd);
    free(o);
    free(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int run_sluice(const char *dir, const char *args, char **out)
{
    return run_sluice_expect(dir, args, out, 0);
}

#define assert_status(dir, args, want) \
    assert_int_equal(run_sluice_expect((dir), (args), NULL, (want)), (want))

static int setup(void **state)
{
    *state = tu_tmpdir();
    return 0;
}

static int teardown(void **state)
{
    tu_rmtree(*state);
    free(*state);
    return 0;
}

/* Writes the preset into dir/name with the extra arguments; returns the
 * model's directory (malloc'd). */
static char *synth(const char *dir, const char *preset, const char *name, const char *extra)
{
    char *out = tu_join(dir, name), args[4096];
    snprintf(args, sizeof args, "synth %s '%s' %s", preset, out, extra);
    assert_int_equal(run_sluice(dir, args, NULL), 0);
    return out;
}

static void sha256(const void *data, size_t len, uint8_t out[32])
{
    unsigned n = 32;
    assert_int_equal(EVP_Digest(data, len, out, &n, EVP_sha256(), NULL), 1);
}

static void expect_shape(sluice_model *m, const char *name, uint32_t ndim, uint64_t d0,
                         uint64_t d1)
{
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    if (sluice_find(m, name, &info) != SLUICE_OK)
        fail_msg("no tensor %s", name);
    assert_int_equal(info.dtype, SLUICE_DTYPE_BF16);
    assert_int_equal(info.ndim, ndim);
    assert_int_equal(info.shape[0], d0);
    if (ndim == 2)
        assert_int_equal(info.shape[1], d1);
    assert_int_equal(info.nbytes, (ndim == 2 ? d0 * d1 : d0) * 2);
}

/* Every tensor's manifest digest equals SHA-256 of its bytes read with
 * pread; every file's digest and size equal those of the whole file. */
static void check_manifest_independently(sluice_model *m)
{
    assert_int_not_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        uint8_t want[32], got[32];
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        assert_int_equal(sluice_manifest_tensor(m, i, want), SLUICE_OK);
        void *bytes = tu_pread_range(info.file, info.offset, (size_t)info.nbytes);
        sha256(bytes, (size_t)info.nbytes, got);
        free(bytes);
        assert_memory_equal(want, got, 32);
    }
    for (size_t f = 0; f < sluice_file_count(m); f++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        uint8_t want[32], got[32];
        uint64_t size;
        size_t len;
        assert_int_equal(sluice_file_info(m, f, &fi), SLUICE_OK);
        assert_int_equal(sluice_manifest_file(m, f, want, &size), SLUICE_OK);
        void *whole = tu_read_file(fi.path, &len);
        assert_non_null(whole);
        assert_int_equal(size, len);
        sha256(whole, len, got);
        free(whole);
        assert_memory_equal(want, got, 32);
    }
}

typedef struct loaded {
    size_t delivered, failed;
    uint64_t bytes;
} loaded;

static int count_tensor(void *user, sluice_tensor *t, int status,
                        const struct sluice_tensor_info *info, const char *message)
{
    loaded *l = user;
    if (status != SLUICE_OK) {
        fprintf(stderr, "tensor %s: %s\n", info ? info->name : "?", message);
        l->failed++;
        return 0;
    }
    l->delivered++;
    l->bytes += sluice_tensor_size(t);
    sluice_release(t);
    return 0;
}

/* Opens path with policy REQUIRE (the sidecar found without being named)
 * and streams every tensor: all verified, none failed. */
static void check_loads_verified(const char *path, size_t want_tensors)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_REQUIRE;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s", path, sluice_errmsg(m));
    assert_int_equal(sluice_count(m), want_tensors);
    assert_non_null(sluice_manifest_path(m));
    check_manifest_independently(m);
    loaded l = {0};
    assert_int_equal(sluice_stream(m, NULL, 0, count_tensor, &l), SLUICE_OK);
    assert_int_equal(l.delivered, want_tensors);
    assert_int_equal(l.failed, 0);
    struct sluice_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.tensors_verified, want_tensors);
    assert_int_equal(st.checksum_failures, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* ---------------------------------------------------------------- synth */

static void test_synth_tiny_opens(void **state)
{
    const char *dir = *state;
    char *model = synth(dir, "tiny", "tiny", "");
    char *index = tu_join(model, "model.safetensors.index.json");
    struct stat st;
    assert_int_equal(stat(index, &st), 0);

    /* The directory and its index.json name the same model. */
    const char *paths[] = {model, index};
    for (size_t p = 0; p < 2; p++) {
        sluice_model *m = NULL;
        int rc = sluice_open(paths[p], NULL, &m);
        if (rc != SLUICE_OK)
            fail_msg("open %s: %s", paths[p], sluice_errmsg(m));
        /* 1 embedding + 4 layers x 9 + final norm + lm_head (untied) */
        assert_int_equal(sluice_count(m), 39);
        assert_int_equal(sluice_file_count(m), 2);
        expect_shape(m, "model.embed_tokens.weight", 2, 512, 64);
        expect_shape(m, "lm_head.weight", 2, 512, 64);
        expect_shape(m, "model.norm.weight", 1, 64, 0);
        expect_shape(m, "model.layers.0.self_attn.q_proj.weight", 2, 64, 64);
        expect_shape(m, "model.layers.3.self_attn.k_proj.weight", 2, 32, 64);
        expect_shape(m, "model.layers.3.self_attn.v_proj.weight", 2, 32, 64);
        expect_shape(m, "model.layers.2.self_attn.o_proj.weight", 2, 64, 64);
        expect_shape(m, "model.layers.1.mlp.gate_proj.weight", 2, 256, 64);
        expect_shape(m, "model.layers.1.mlp.up_proj.weight", 2, 256, 64);
        expect_shape(m, "model.layers.1.mlp.down_proj.weight", 2, 64, 256);
        expect_shape(m, "model.layers.3.input_layernorm.weight", 1, 64, 0);
        expect_shape(m, "model.layers.3.post_attention_layernorm.weight", 1, 64, 0);
        assert_int_equal(sluice_find(m, "model.layers.4.input_layernorm.weight", NULL),
                         SLUICE_E_NOT_FOUND);
        assert_int_equal(sluice_find(m, "model.layers.0.self_attn.q_proj.bias", NULL),
                         SLUICE_E_NOT_FOUND);
        /* "format": "pt" and data 8-byte aligned, as the reference writes. */
        for (size_t f = 0; f < 2; f++) {
            struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
            assert_int_equal(sluice_file_info(m, f, &fi), SLUICE_OK);
            assert_int_equal(fi.data_start % 8, 0);
            assert_int_equal(fi.metadata_kind, SLUICE_METADATA_OBJECT);
            assert_int_equal(fi.metadata_count, 1);
            assert_string_equal(fi.metadata[0].key, "format");
            assert_string_equal(fi.metadata[0].value, "pt");
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    free(index);
    free(model);
}

static void test_synth_tiny_verifies(void **state)
{
    char *model = synth(*state, "tiny", "tiny-verify", "--seed 7");
    check_loads_verified(model, 39);
    free(model);
}

static void test_synth_single_file(void **state)
{
    char *model = synth(*state, "tiny-qwen2", "one", "--shards 1");
    char *file = tu_join(model, "model.safetensors");
    char *sidecar = tu_join(model, "model.safetensors.manifest.json");
    char *index = tu_join(model, "model.safetensors.index.json");
    struct stat st;
    assert_int_equal(stat(sidecar, &st), 0);
    assert_int_not_equal(stat(index, &st), 0);
    check_loads_verified(file, 50);

    sluice_model *m = NULL;
    assert_int_equal(sluice_open(file, NULL, &m), SLUICE_OK);
    expect_shape(m, "model.layers.0.self_attn.q_proj.bias", 1, 64, 0);
    expect_shape(m, "model.layers.3.self_attn.k_proj.bias", 1, 32, 0);
    expect_shape(m, "model.layers.3.self_attn.v_proj.bias", 1, 32, 0);
    assert_int_equal(sluice_find(m, "lm_head.weight", NULL), SLUICE_E_NOT_FOUND); /* tied */
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(index);
    free(sidecar);
    free(file);
    free(model);
}

/* synth's manifest is the one `sluice manifest` writes of the same files,
 * byte for byte (version 2 with its header digests and, for tensors over
 * 16 MiB, chunk digests: one writer, so a synth model is sliced and
 * verified as a user's model is), and --help says the weights are random. */
static void test_synth_manifest_is_sluice_manifests(void **state)
{
    const char *dir = *state;
    char *model = synth(dir, "tiny", "mf", "--seed 3");
    char *mine = tu_join(model, "sluice.manifest.json"), *again = tu_join(dir, "again.json");
    char args[4096];
    snprintf(args, sizeof args, "manifest '%s' -q -o '%s'", model, again);
    assert_int_equal(run_sluice(dir, args, NULL), 0);
    size_t a_len, b_len;
    char *a = tu_read_file(mine, &a_len), *b = tu_read_file(again, &b_len);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a_len, b_len);
    assert_memory_equal(a, b, a_len);
    assert_non_null(strstr(a, "\"version\": 2"));
    assert_non_null(strstr(a, "\"header\": \""));

    char *help = NULL;
    assert_int_equal(run_sluice(dir, "synth --help", &help), 0);
    assert_non_null(help);
    assert_non_null(strstr(help, "NaN or Inf"));
    assert_non_null(strstr(help, "chunk digests"));
    free(help);
    free(b);
    free(a);
    free(again);
    free(mine);
    free(model);
}

static void test_synth_bytes_follow_seed_not_shards(void **state)
{
    const char *dir = *state;
    char *a = synth(dir, "tiny", "seed1-2shards", "--seed 1");
    char *b = synth(dir, "tiny", "seed1-3shards", "--seed 1 --shards 3");
    char *c = synth(dir, "tiny", "seed2", "--seed 2");
    uint8_t xa[6][32], db[6][32], dc[6][32];
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(b, NULL, &m), SLUICE_OK);
    assert_int_equal(sluice_file_count(m), 3);
    assert_int_equal(sluice_count(m), 39);
    sluice_close(m);
    /* The digests of a few tensors of each model, read with pread. */
    for (int k = 0; k < 3; k++) {
        const char *p = k == 0 ? a : k == 1 ? b : c;
        uint8_t (*out)[32] = k == 0 ? xa : k == 1 ? db : dc;
        sluice_options o;
        sluice_options_init(&o);
        o.verify = SLUICE_VERIFY_OFF;
        assert_int_equal(sluice_open(p, &o, &m), SLUICE_OK);
        static const char *const names[6] = {
            "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.0.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight",
            "model.layers.2.self_attn.v_proj.weight"};
        for (int i = 0; i < 6; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            assert_int_equal(sluice_find(m, names[i], &info), SLUICE_OK);
            void *bytes = tu_pread_range(info.file, info.offset, (size_t)info.nbytes);
            sha256(bytes, (size_t)info.nbytes, out[i]);
            free(bytes);
        }
        sluice_close(m);
    }
    for (int i = 0; i < 6; i++) {
        assert_memory_equal(xa[i], db[i], 32);     /* same seed, other sharding */
        assert_memory_not_equal(xa[i], dc[i], 32); /* other seed */
        for (int j = 0; j < i; j++)
            assert_memory_not_equal(xa[i], xa[j], 32); /* tensors differ */
    }
    free(a);
    free(b);
    free(c);
}

/* Reads tensor name of the model at path (verified) as floats: F32 as it
 * is, BF16 widened (its bits are a float's top half). n: elements. */
static float *read_floats(const char *path, const char *name, size_t *n)
{
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(path, NULL, &m), SLUICE_OK);
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, name, &info), SLUICE_OK);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, name, &t), SLUICE_OK);
    int bf16 = info.dtype == SLUICE_DTYPE_BF16;
    assert_true(bf16 || info.dtype == SLUICE_DTYPE_F32);
    *n = (size_t)info.nbytes / (bf16 ? 2 : 4);
    float *f = malloc(*n * sizeof *f);
    assert_non_null(f);
    const unsigned char *b = sluice_tensor_data(t);
    for (size_t i = 0; i < *n; i++) {
        uint32_t u = 0;
        if (bf16) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            u = (uint32_t)h << 16;
        } else {
            memcpy(&u, b + 4 * i, 4);
        }
        memcpy(&f[i], &u, 4);
    }
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return f;
}

/* --values: finite weights of mean 0 and spread 0.02 (within 3.5 sigma),
 * the same values in every dtype (BF16 is F32's nearest), following the
 * seed; and --help says what they are. */
static void test_synth_values(void **state)
{
    const char *dir = *state;
    char *f32 = synth(dir, "tiny", "values-f32", "--values --dtype F32 --seed 5");
    char *bf16 = synth(dir, "tiny", "values-bf16", "--values --dtype BF16 --seed 5");
    check_loads_verified(f32, 39);
    static const char *const names[3] = {"model.embed_tokens.weight", "model.norm.weight",
                                         "model.layers.1.mlp.down_proj.weight"};
    for (int k = 0; k < 3; k++) {
        size_t n, nb;
        float *a = read_floats(f32, names[k], &n), *b = read_floats(bf16, names[k], &nb);
        assert_int_equal(n, nb);
        double sum = 0, sq = 0;
        for (size_t i = 0; i < n; i++) {
            assert_true(a[i] > -0.0701f && a[i] < 0.0701f); /* finite, within 3.5 sigma */
            sum += a[i];
            sq += (double)a[i] * a[i];
            /* the nearest BF16: within half a BF16 step (8 bits of mantissa) */
            float d = a[i] - b[i];
            assert_true(d <= 0x1p-8f * (a[i] < 0 ? -a[i] : a[i]) + 1e-30f &&
                        -d <= 0x1p-8f * (a[i] < 0 ? -a[i] : a[i]) + 1e-30f);
        }
        double mean = sum / (double)n, var = sq / (double)n - mean * mean;
        assert_true(mean > -0.005 && mean < 0.005);
        assert_true(var > 0.017 * 0.017 && var < 0.023 * 0.023); /* sigma 0.02 */
        free(a);
        free(b);
    }
    char *help = NULL;
    assert_int_equal(run_sluice(dir, "synth --help", &help), 0);
    assert_non_null(help);
    assert_non_null(strstr(help, "--values"));
    assert_non_null(strstr(help, "standard deviation 0.02"));
    free(help);
    free(bf16);
    free(f32);
}

static void test_synth_list_and_errors(void **state)
{
    const char *dir = *state;
    char *out = NULL;
    assert_int_equal(run_sluice(dir, "synth --list", &out), 0);
    assert_non_null(out);
    /* The real architectures' sizes in BF16, as their checkpoints have them. */
    static const char *const want[] = {
        "llama-3.2-1b", "146", "2471628800",
        "llama-3.2-3b", "254", "6425499648",
        "qwen2.5-0.5b", "290", "988065536",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i += 3) {
        const char *line = strstr(out, want[i]);
        assert_non_null(line);
        const char *eol = strchr(line, '\n');
        char buf[256];
        snprintf(buf, sizeof buf, "%.*s", (int)(eol ? eol - line : (long)strlen(line)), line);
        if (!strstr(buf, want[i + 1]) || !strstr(buf, want[i + 2]))
            fail_msg("--list line '%s' lacks %s tensors or %s bytes", buf, want[i + 1],
                     want[i + 2]);
    }
    free(out);
    char *o2 = tu_join(dir, "x");
    char args[4096];
    snprintf(args, sizeof args, "synth no-such-preset '%s'", o2);
    assert_status(dir, args, 2);
    snprintf(args, sizeof args, "synth tiny '%s' --shards 40", o2); /* 39 tensors */
    assert_status(dir, args, 2);
    snprintf(args, sizeof args, "synth tiny '%s' --dtype F8", o2);
    assert_status(dir, args, 2);
    free(o2);
}

/* ---------------------------------------------------------------- bench */

static const char *const csv_columns[] = {
    "config", "mode", "run", "pool", "qd", "chunk", "direct", "verify", "wall_s", "gbps",
    "first_ms", "p50_ms", "p99_ms", "cpu_s", "peak_rss_mb", "bytes_read", "bytes_needed",
    "backend", "ratio", "ratio_e", "bytes_hashed",
};
#define NCOLS (sizeof csv_columns / sizeof csv_columns[0])

/* Splits one CSV line (no quoted commas in what is checked) into fields. */
static size_t split(char *line, char **f, size_t max)
{
    size_t n = 0;
    for (char *p = line; n < max;) {
        f[n++] = p;
        if (*p == '"') { /* skip a quoted field */
            for (p++; *p && !(*p == '"' && p[1] != '"'); p += *p == '"' ? 2 : 1)
                ;
        }
        p = strchr(p, ',');
        if (!p)
            break;
        *p++ = '\0';
    }
    return n;
}

static void test_bench_every_mode(void **state)
{
    const char *dir = *state;
    char *model = synth(dir, "tiny", "bench", "");
    char *csv = tu_join(dir, "bench.csv");
    char args[4096], *out = NULL;
    snprintf(args, sizeof args,
             "bench '%s' --runs 1 --pool 1M,8M --qd 4 --chunk 64K --verify off,on "
             "--backend auto,pread --random --csv '%s'", model, csv);
    assert_int_equal(run_sluice(dir, args, &out), 0);
    assert_non_null(out);
    assert_non_null(strstr(out, "(a) seq pread"));
    assert_non_null(strstr(out, "ratio"));
    free(out);

    size_t len;
    char *text = tu_read_file(csv, &len);
    assert_non_null(text);
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    assert_non_null(line);
    char *head[64];
    size_t ncols = split(line, head, 64);
    assert_true(ncols >= NCOLS);
    size_t col[NCOLS];
    for (size_t k = 0; k < NCOLS; k++) {
        col[k] = SIZE_MAX;
        for (size_t i = 0; i < ncols; i++)
            if (!strcmp(head[i], csv_columns[k]))
                col[k] = i;
        if (col[k] == SIZE_MAX)
            fail_msg("CSV has no column %s", csv_columns[k]);
    }
    size_t ok_col = SIZE_MAX;
    for (size_t i = 0; i < ncols; i++)
        if (!strcmp(head[i], "ok"))
            ok_col = i;
    assert_int_not_equal(ok_col, SIZE_MAX);

    /* 4 baselines (+ (f) with /usr/bin/python3) + 2 pools x 2 verify x 2 backends x 3
     * modes (stream, random, whole-process stream) + the verify-only path in-process
     * and as a whole process, one run each */
    size_t rows = 0, baseline = 0, stream = 0, random = 0, parallel = 0, python = 0, whole = 0,
           verify = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[64];
        assert_int_equal(split(line, f, 64), ncols);
        rows++;
        assert_string_equal(f[ok_col], "1");
        assert_string_equal(f[col[2]], "1"); /* run */
        const char *mode = f[col[1]];
        if (!strcmp(mode, "baseline")) {
            baseline++;
            if (!strcmp(f[col[0]], "pread-sha256-parallel")) {
                /* (e) read and hashed every tensor byte once */
                parallel++;
                assert_string_equal(f[col[15]], "623744");
                assert_string_equal(f[col[20]], "623744");
                assert_true(strtod(f[col[18]], NULL) > 0);
            }
            assert_string_equal(f[col[19]], ""); /* vs (e): verified sluice runs only */
            continue;
        }
        if (!strcmp(mode, "baseline*")) {
            /* (f), the Python verifier, as a whole process */
            python++;
            assert_string_equal(f[col[0]], "python-verify");
            assert_string_equal(f[col[16]], "623744");
            assert_true(strtod(f[col[8]], NULL) > 0);
            continue;
        }
        if (!strcmp(mode, "stream*") || !strcmp(mode, "verify") || !strcmp(mode, "verify*")) {
            /* whole-process streams and the verify-only path */
            whole += !strcmp(mode, "stream*");
            verify += mode[0] == 'v';
            assert_string_equal(f[col[16]], "623744");
            assert_true(strtod(f[col[8]], NULL) > 0);  /* wall_s */
            assert_true(strtod(f[col[14]], NULL) > 0); /* peak RSS, the process's own */
            assert_true(strtod(f[col[18]], NULL) > 0); /* ratio */
            continue;
        }
        stream += !strcmp(mode, "stream");
        random += !strcmp(mode, "random");
        assert_true(!strcmp(f[col[3]], "1048576") || !strcmp(f[col[3]], "8388608"));
        assert_string_equal(f[col[4]], "4");
        assert_string_equal(f[col[5]], "65536");
        assert_string_equal(f[col[6]], "off");
        assert_true(!strcmp(f[col[7]], "on") || !strcmp(f[col[7]], "off"));
        assert_true(strtod(f[col[8]], NULL) > 0);   /* wall_s */
        assert_true(strtod(f[col[9]], NULL) > 0);   /* gbps */
        assert_true(strtod(f[col[11]], NULL) <= strtod(f[col[12]], NULL)); /* p50 <= p99 */
        assert_true(strtod(f[col[14]], NULL) > 0);  /* peak RSS */
        assert_true(strtoull(f[col[15]], NULL, 10) >= strtoull(f[col[16]], NULL, 10));
        assert_string_equal(f[col[16]], "623744");  /* every byte of tiny delivered */
        assert_true(!strcmp(f[col[17]], "io_uring") || !strcmp(f[col[17]], "pread"));
        assert_true(strtod(f[col[18]], NULL) > 0);  /* ratio to a ceiling */
        if (!strcmp(f[col[7]], "on"))
            assert_true(strtod(f[col[19]], NULL) > 0); /* over (e) */
        else
            assert_string_equal(f[col[19]], "");
    }
    assert_int_equal(baseline, 4);
    assert_int_equal(parallel, 1);
    assert_int_equal(stream, 8);
    assert_int_equal(random, 8);
    assert_int_equal(whole, 8);
    assert_int_equal(verify, 2);
    assert_int_equal(python, access("/usr/bin/python3", X_OK) == 0 ? 1 : 0);
    assert_int_equal(rows, 4 + python + 8 + 8 + 8 + 2);
    free(text);
    free(csv);
    free(model);
}

static void test_bench_cold_plot_and_errors(void **state)
{
    const char *dir = *state;
    char *dirmodel = synth(dir, "tiny", "bench2", "--shards 1");
    char *model = tu_join(dirmodel, "model.safetensors"); /* its sidecar is beside it */
    char *png = tu_join(dir, "bench.png");
    char args[4096];
    /* --cold on a file system that may keep its pages (tmpfs) only warns. */
    snprintf(args, sizeof args, "bench '%s' --runs 1 --verify on --direct on --cold --baselines none",
             model);
    assert_int_equal(run_sluice(dir, args, NULL), 0);

    char *gp = NULL;
    int have_gnuplot = system("command -v gnuplot >/dev/null 2>&1") == 0;
    snprintf(args, sizeof args, "bench '%s' --runs 1 --qd 2,8 --plot '%s'", model, png);
    if (have_gnuplot) {
        assert_int_equal(run_sluice(dir, args, NULL), 0);
        size_t len;
        gp = tu_read_file(png, &len);
        assert_non_null(gp);
        assert_true(len > 8 && !memcmp(gp, "\x89PNG\r\n\x1a\n", 8));
    } else {
        assert_status(dir, args, 2); /* said before running */
    }
    free(gp);
    /* Without gnuplot on PATH, --plot is refused before anything runs. */
    snprintf(args, sizeof args,
             "PATH=/nonexistent '%s/sluice' bench '%s' --plot '%s' >/dev/null 2>&1",
             SLUICE_BINARY_DIR, model, png);
    int st = system(args);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);

    snprintf(args, sizeof args, "bench '%s' --pool 12Q", model);
    assert_status(dir, args, 2);
    snprintf(args, sizeof args, "bench '%s' --no-such-option", model);
    assert_status(dir, args, 2);
    snprintf(args, sizeof args, "bench '%s' --qd 0", model); /* refused by sluice_open */
    assert_status(dir, args, 2);
    snprintf(args, sizeof args, "bench '%s/nothing-here'", dir); /* cannot open: 3 */
    assert_status(dir, args, 3);
    free(png);
    free(model);
    free(dirmodel);
}

int main(void)
{
    char *bin = tu_join(SLUICE_BINARY_DIR, "sluice");
    int have = access(bin, X_OK) == 0;
    free(bin);
    if (!have) {
        fprintf(stderr, "skipped: no sluice command in %s (SLUICE_BUILD_TOOLS off?)\n",
                SLUICE_BINARY_DIR);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_tiny_opens),
        cmocka_unit_test(test_synth_tiny_verifies),
        cmocka_unit_test(test_synth_single_file),
        cmocka_unit_test(test_synth_manifest_is_sluice_manifests),
        cmocka_unit_test(test_synth_bytes_follow_seed_not_shards),
        cmocka_unit_test(test_synth_values),
        cmocka_unit_test(test_synth_list_and_errors),
        cmocka_unit_test(test_bench_every_mode),
        cmocka_unit_test(test_bench_cold_plot_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
