/* test_inspect.c: `sluice inspect` as a user runs it: the table, the JSON
 * object (checked against the library's index), the exit status (3) and
 * one-line message on a bad model, and the verification state it shows. */
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
#include <sys/wait.h>

/* Runs `sluice ARGS`, stdout and stderr into files of dir; returns the
 * exit status and the two outputs (malloc'd). */
static int run_sluice(const char *dir, const char *args, char **out, char **err)
{
    char *o = tu_join(dir, "stdout"), *e = tu_join(dir, "stderr");
    size_t n = strlen(args) + strlen(o) + strlen(e) + strlen(SLUICE_BINARY_DIR) + 64;
    char *cmd = malloc(n);
    snprintf(cmd, n, "'%s/sluice' %s >'%s' 2>'%s'", SLUICE_BINARY_DIR, args, o, e);
    int status = system(cmd);
    size_t len;
    *out = tu_read_file(o, &len);
    *err = tu_read_file(e, &len);
    free(cmd);
    free(o);
    free(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void check_json_against_library(const char *dir, const char *model_path)
{
    char args[4096], *out, *err;
    snprintf(args, sizeof args, "inspect --json '%s'", model_path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    cJSON *root = cJSON_Parse(out);
    assert_non_null(root);
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model_path, NULL, &m), SLUICE_OK);
    cJSON *files = cJSON_GetObjectItem(root, "files");
    cJSON *meta = cJSON_GetObjectItem(root, "metadata");
    cJSON *tensors = cJSON_GetObjectItem(root, "tensors");
    assert_true(cJSON_IsArray(files) && cJSON_IsObject(meta) && cJSON_IsArray(tensors));
    assert_int_equal((size_t)cJSON_GetArraySize(files), sluice_file_count(m));
    assert_int_equal((size_t)cJSON_GetArraySize(meta), sluice_file_count(m));
    assert_int_equal((size_t)cJSON_GetArraySize(tensors), sluice_count(m));
    size_t i = 0;
    for (cJSON *t = tensors->child; t; t = t->next, i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        assert_string_equal(cJSON_GetObjectItem(t, "name")->valuestring, info.name);
        assert_string_equal(cJSON_GetObjectItem(t, "dtype")->valuestring, sluice_dtype_name(info.dtype));
        assert_string_equal(cJSON_GetObjectItem(t, "file")->valuestring, info.file);
        cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
        assert_int_equal((uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble, info.data_begin);
        assert_int_equal((uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble, info.data_end);
        assert_int_equal((uint32_t)cJSON_GetArraySize(cJSON_GetObjectItem(t, "shape")), info.ndim);
    }
    sluice_close(m);
    cJSON_Delete(root);
    free(out);
    free(err);
}

static void test_real_files_json(void **state)
{
    (void)state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char *dir = tu_tmpdir();
    char **files;
    size_t n = tu_list_safetensors(real, &files);
    for (size_t i = 0; i < n; i++)
        check_json_against_library(dir, files[i]);
    tu_free_list(files, n);
    char *sharded = tu_join(real, "SafeTensors.jl__sharded");
    check_json_against_library(dir, sharded);
    free(sharded);
    tu_rmtree(dir);
    free(dir);
}

static void test_table_and_names(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *path = tu_join(dir, "m.safetensors");
    tu_write_safetensors(path,
                         "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"a\\u0000\\\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}",
                         NULL, 8);
    char args[4096], *out, *err;
    snprintf(args, sizeof args, "inspect '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    assert_non_null(strstr(out, "a\\x00\"b"));
    assert_non_null(strstr(out, "[2, 2]"));
    assert_non_null(strstr(out, "format = pt"));
    assert_non_null(strstr(out, "total: 1 tensors, 8 bytes"));
    free(out);
    free(err);
    /* the JSON form escapes the NUL and the quote, and round-trips */
    snprintf(args, sizeof args, "inspect --json '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    assert_non_null(strstr(out, "\"a\\u0000\\\"b\""));
    cJSON *root = cJSON_Parse(out);
    assert_non_null(root);
    cJSON_Delete(root);
    free(out);
    free(err);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void test_bad_model(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *path = tu_join(dir, "bad.safetensors");
    tu_write_safetensors(path, "{\"a\":{\"dtype\":\"F16\",\"shape\":[5,3],\"data_offsets\":[0,28]}}", NULL, 28);
    char args[4096], *out, *err;
    snprintf(args, sizeof args, "inspect --json '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 3);   /* cannot open, as for every command */
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "bad.safetensors: tensor \"a\": shape [5, 3] of F16 needs 30 bytes"));
    char *nl = strchr(err, '\n');
    assert_non_null(nl);
    assert_string_equal(nl + 1, ""); /* one line */
    free(out);
    free(err);
    assert_int_equal(run_sluice(dir, "inspect", &out, &err), 2); /* usage */
    free(out);
    free(err);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

/* Writes dir/m.safetensors (two U8 tensors) and returns its path. */
static char *small_model(const char *dir)
{
    char *path = tu_join(dir, "m.safetensors");
    tu_write_safetensors(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
                               "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[16,24]}}",
                         NULL, 24);
    return path;
}

/* The verification state, as `sluice verify` words it (issue 38): no
 * manifest, a manifest, a signed one with --key, and an open a load would
 * refuse (a manifest that disagrees with the headers, a signature by no
 * trusted key): the index is still listed, the refusal named, the exit
 * status its class. */
static void test_verification_state(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *path = small_model(dir);
    char args[4096], *out, *err, want[2048];
    snprintf(args, sizeof args, "inspect '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    snprintf(want, sizeof want, "verification: not verified: no manifest found (no sidecar %s",
             path);
    if (!strstr(out, want))
        fail_msg("no \"%s\" in:\n%s", want, out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "inspect --json '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    cJSON *root = cJSON_Parse(out);
    cJSON *v = cJSON_GetObjectItem(root, "verification");
    assert_string_equal(cJSON_GetObjectItem(v, "state")->valuestring, "no_manifest");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(v, "manifest")));
    cJSON_Delete(root);
    free(out);
    free(err);
    /* a manifest, and a key that signed it */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s/sluice' manifest m.safetensors -o m.safetensors.manifest.json "
             ">/dev/null && '%s/sluice' keygen --out k >/dev/null && '%s/sluice' keygen --out k2 "
             ">/dev/null && '%s/sluice' sign m.safetensors.manifest.json --key k.key >/dev/null",
             dir, SLUICE_BINARY_DIR, SLUICE_BINARY_DIR, SLUICE_BINARY_DIR, SLUICE_BINARY_DIR);
    assert_int_equal(system(cmd), 0);
    snprintf(args, sizeof args, "inspect '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    snprintf(want, sizeof want, "verification: manifest %s.manifest.json\n", path);
    if (!strstr(out, want))
        fail_msg("no \"%s\" in:\n%s", want, out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "inspect '%s' --key '%s/k.pub'", path, dir);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    assert_non_null(strstr(out, "signature verified (")); /* as verify says it */
    assert_non_null(strstr(out, "by one of 1 trusted key)"));
    free(out);
    free(err);
    snprintf(args, sizeof args, "inspect --json '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 0);
    root = cJSON_Parse(out);
    v = cJSON_GetObjectItem(root, "verification");
    assert_string_equal(cJSON_GetObjectItem(v, "state")->valuestring, "verified");
    snprintf(want, sizeof want, "%s.manifest.json", path);
    assert_string_equal(cJSON_GetObjectItem(v, "manifest")->valuestring, want);
    cJSON_Delete(root);
    free(out);
    free(err);
    /* another signer: refused (4), the index still listed */
    snprintf(args, sizeof args, "inspect '%s' --key '%s/k2.pub'", path, dir);
    assert_int_equal(run_sluice(dir, args, &out, &err), 4);
    assert_non_null(strstr(out, "verification: FAILED: "));
    assert_non_null(strstr(out, "total: 2 tensors, 24 bytes"));
    assert_non_null(strstr(err, "sluice inspect: "));
    free(out);
    free(err);
    /* a manifest that disagrees with the headers (b's dtype): integrity (1) */
    snprintf(cmd, sizeof cmd, "cd '%s' && rm m.safetensors.manifest.json.sig && "
             "sed -i 's/\"U8\"/\"I8\"/' m.safetensors.manifest.json", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(args, sizeof args, "inspect --json '%s'", path);
    assert_int_equal(run_sluice(dir, args, &out, &err), 1);
    root = cJSON_Parse(out);
    assert_non_null(root);
    v = cJSON_GetObjectItem(root, "verification");
    assert_string_equal(cJSON_GetObjectItem(v, "state")->valuestring, "failed");
    assert_non_null(strstr(cJSON_GetObjectItem(v, "detail")->valuestring, "I8"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(root, "tensors")), 2);
    cJSON_Delete(root);
    free(out);
    free(err);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_files_json),
        cmocka_unit_test(test_table_and_names),
        cmocka_unit_test(test_bad_model),
        cmocka_unit_test(test_verification_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
