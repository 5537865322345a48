/* test_manifest_write.c: sluice_manifest_write, the library's one writer
 * of manifests (`sluice manifest` and sluice.write_manifest call it): each
 * version it writes opens the model verified, chunk and part digests
 * where asked, a descriptor as well as a path, and bad options refused
 * with a message before anything is read or written. */
#include "util.h"

#include <sluice.h>

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct fx {
    char *dir, *path;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->path = tu_join(f->dir, "m.safetensors");
    /* "big": 8 x 2048 F32 (64 KiB: 16 chunks of 4 KiB, 4 parts along dim 0) */
    tu_write_safetensors(f->path,
                         "{\"big\":{\"dtype\":\"F32\",\"shape\":[8,2048],\"data_offsets\":[0,65536]},"
                         "\"odd \\\"q\\\"\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[65536,65539]}}",
                         NULL, 65539);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

static sluice_model *open_with(const char *path, const char *manifest, sluice_verify_policy v)
{
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = manifest;
    o.verify = v;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s with %s: %s", path, manifest ? manifest : "-", sluice_errmsg(m));
    return m;
}

/* Each version written to a path opens the model verified; version 2
 * carries chunk digests (16 of 4 KiB for "big") and part digests. */
static void versions_open_verified(void **state)
{
    fx *f = *state;
    char *out = tu_join(f->dir, "out.json");
    sluice_part_rules *rules = NULL;
    char why[128];
    assert_int_equal(sluice_part_rules_parse("big 0\n", 6, &rules, why, sizeof why), SLUICE_OK);
    for (int version = 0; version <= 2; version++) {
        sluice_model *m = open_with(f->path, NULL, SLUICE_VERIFY_OFF);
        sluice_manifest_options mo;
        assert_int_equal(sluice_manifest_options_init(&mo), SLUICE_OK);
        mo.version = version;
        mo.chunk_bytes = 4096;
        mo.parts = version == 2 ? rules : NULL;
        assert_int_equal(sluice_manifest_write(m, out, -1, &mo), SLUICE_OK);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        m = open_with(f->path, out, SLUICE_VERIFY_REQUIRE);
        assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED);
        assert_int_equal(sluice_verify(m, NULL, 0, NULL, NULL), SLUICE_OK);
        uint64_t cb = 0;
        uint32_t count = 0;
        assert_int_equal(sluice_manifest_chunks(m, 0, &cb, &count),
                         version == 2 ? SLUICE_OK : SLUICE_E_NOT_FOUND);
        if (version == 2) {
            assert_int_equal(cb, 4096);
            assert_int_equal(count, 16);
            static uint8_t part[16384];
            assert_int_equal(sluice_read_part_into(m, "big", 0, 1, 4, part, sizeof part),
                             SLUICE_OK);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    sluice_part_rules_free(rules);
    free(out);
}

/* To a descriptor: the same bytes as to a path. */
static void descriptor_same_as_path(void **state)
{
    fx *f = *state;
    char *a = tu_join(f->dir, "a.json"), *b = tu_join(f->dir, "b.json");
    sluice_model *m = open_with(f->path, NULL, SLUICE_VERIFY_OFF);
    assert_int_equal(sluice_manifest_write(m, a, -1, NULL), SLUICE_OK);
    int fd = open(b, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(sluice_manifest_write(m, NULL, fd, NULL), SLUICE_OK);
    close(fd);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    size_t la = 0, lb = 0;
    char *ta = tu_read_file(a, &la), *tb = tu_read_file(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(ta, tb, la);
    assert_non_null(strstr(ta, "\"version\": 2"));
    assert_non_null(strstr(ta, "\"odd \\\"q\\\"\""));
    free(ta);
    free(tb);
    free(a);
    free(b);
}

/* Bad options: refused, with a message, nothing written. */
static void bad_options_refused(void **state)
{
    fx *f = *state;
    char *out = tu_join(f->dir, "never.json");
    sluice_part_rules *rules = NULL;
    char why[128];
    assert_int_equal(sluice_part_rules_parse("big 0\n", 6, &rules, why, sizeof why), SLUICE_OK);
    static const struct {
        int version;
        uint64_t chunk;
        int parts;
        size_t nworlds;
        uint64_t world0;
        const char *needle;
    } bad[] = {
        {3, 0, 0, 3, 2, "version 3"},
        {-1, 0, 0, 3, 2, "version -1"},
        {2, 100, 0, 3, 2, "chunk_bytes 100"},
        {1, 0, 1, 3, 2, "part digests need version 2"},
        {2, 0, 1, 0, 2, "nworlds 0"},
        {2, 0, 1, 1, 1, "world size 1"},
    };
    sluice_model *m = open_with(f->path, NULL, SLUICE_VERIFY_OFF);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        sluice_manifest_options mo;
        sluice_manifest_options_init(&mo);
        mo.version = bad[k].version;
        mo.chunk_bytes = bad[k].chunk;
        mo.parts = bad[k].parts ? rules : NULL;
        mo.nworlds = bad[k].nworlds;
        mo.worlds[0] = bad[k].world0;
        assert_int_equal(sluice_manifest_write(m, out, -1, &mo), SLUICE_E_INVAL);
        if (!strstr(sluice_errmsg(m), bad[k].needle))
            fail_msg("case %zu: message lacks \"%s\": %s", k, bad[k].needle, sluice_errmsg(m));
    }
    assert_int_equal(sluice_manifest_write(m, NULL, -1, NULL), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "no path"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* BLAKE3 before version 2 */
    if (sluice_algorithm_supported(SLUICE_ALG_BLAKE3)) {
        sluice_options o;
        sluice_options_init(&o);
        o.verify = SLUICE_VERIFY_OFF;
        o.algorithm = SLUICE_ALG_BLAKE3;
        assert_int_equal(sluice_open(f->path, &o, &m), SLUICE_OK);
        sluice_manifest_options mo;
        sluice_manifest_options_init(&mo);
        mo.version = 1;
        assert_int_equal(sluice_manifest_write(m, out, -1, &mo), SLUICE_E_INVAL);
        assert_non_null(strstr(sluice_errmsg(m), "needs version 2"));
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    assert_int_not_equal(access(out, F_OK), 0);
    assert_int_equal(sluice_manifest_options_init(NULL), SLUICE_E_INVAL);
    sluice_part_rules_free(rules);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(versions_open_verified, setup, teardown),
        cmocka_unit_test_setup_teardown(descriptor_same_as_path, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_options_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
