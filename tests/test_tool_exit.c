/* test_tool_exit.c: the exit status of every subcommand of `sluice`, as
 * docs/command.md ("Exit status") and each --help tell it, one table for
 * all (tools/cmd.h): 0 success, 1 integrity (bytes that do not match the
 * manifest), 2 usage, 3 cannot open, 4 signature refused (issue 38, item
 * 7: a signature failure exited 2 like a usage error; issue 25, item 12
 * before it). One case per class in every command that opens a model. */
#include "util.h"

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

#include <sluice.h>

static char *dir;   /* bad.safetensors; good/ (synth tiny), flipped/ (a byte changed),
                       nomf/ (no manifest), k.pub (a key that signed nothing) */

static int setup(void **state)
{
    tool_group_setup(state);
    dir = tu_tmpdir();
    /* a header length far past the file's end: no command can open it */
    static const unsigned char bad[16] = {0xff, 0xff, 0xff, 0, 0, 0, 0, 0, '{', '}'};
    char *p = tu_join(dir, "bad.safetensors");
    tu_write_file(p, bad, sizeof bad);
    free(p);
    static const char *const names[] = {"good", "flipped"};
    for (size_t k = 0; k < 2; k++) {
        char *d = tu_join(dir, names[k]);
        run_result r = run(dir, "synth", "tiny", d, "--shards", "1", NULL);
        expect_status(&r, 0, "synth tiny");
        run_free(&r);
        free(d);
    }
    char *nomf = tu_join(dir, "nomf"), *key = tu_join(dir, "k");
    run_result r = run(dir, "synth", "tiny", nomf, "--shards", "1", "--no-manifest", NULL);
    expect_status(&r, 0, "synth tiny --no-manifest");
    run_free(&r);
    r = run(dir, "keygen", "--out", key, NULL);
    expect_status(&r, 0, "keygen");
    run_free(&r);
    free(nomf);
    free(key);
    /* a byte of the tensor `cat` asks for, covered by the manifest */
    char *f = tu_join(dir, "flipped/model.safetensors");
    sluice_model *m = NULL;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_open(f, NULL, &m), SLUICE_OK);
    assert_int_equal(sluice_find(m, "model.norm.weight", &ti), SLUICE_OK);
    size_t at = (size_t)ti.offset;
    sluice_close(m);
    size_t len;
    unsigned char *data = tu_read_file(f, &len);
    assert_true(data && at < len);
    data[at] ^= 1;
    tu_write_file(f, data, len);
    free(data);
    free(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(dir);
    free(dir);
    return 0;
}

/* Each command that opens a model, its arguments around MODEL. */
typedef struct cmd_case {
    const char *name;
    const char *args[8];   /* "@" stands for the model, "%" for a scratch directory */
} cmd_case;

static const cmd_case cases[] = {
    {"inspect", {"@"}},
    {"manifest", {"@", "-q"}},
    {"verify", {"@", "-q"}},
    {"cat", {"@", "model.norm.weight"}},
    {"stats", {"@"}},
    {"bench", {"@", "--runs", "1", "--baselines", "none", "--whole-process", "off"}},
    {"bench-metrics", {"@", "--runs", "1"}},
    {"bench-cache", {"@", "--url", "@", "--cache-dir", "%"}},
    {"shard", {"@", "--world", "2", "--rank", "1"}},
    {"bench", {"@", "--world", "2", "--runs", "1"}},
};

/* The case's command line on model, then up to four more arguments. */
static run_result run_case_with(const cmd_case *c, const char *model, const char *x0,
                                const char *x1, const char *x2, const char *x3)
{
    const char *a[14] = {c->name};
    char *scratch = tu_join(dir, "scratch");
    size_t n = 1;
    for (size_t i = 0; i < 8 && c->args[i]; i++)
        a[n++] = !strcmp(c->args[i], "@") ? model : !strcmp(c->args[i], "%") ? scratch : c->args[i];
    const char *x[4] = {x0, x1, x2, x3};
    for (size_t i = 0; i < 4 && x[i]; i++)
        a[n++] = x[i];
    run_result r = run(dir, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],
                       a[11], a[12], NULL);
    tu_rmtree(scratch);
    free(scratch);
    return r;
}

static run_result run_case(const cmd_case *c, const char *model)
{
    return run_case_with(c, model, NULL, NULL, NULL, NULL);
}

/* Line breaks and runs of blanks as one space, in place (help texts wrap). */
static void squeeze(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++)
        if (!(*r == ' ' || *r == '\n') || (w > s && w[-1] != ' '))
            *w++ = *r == '\n' ? ' ' : *r;
    *w = '\0';
}

/* An invalid model: every command exits 3 (cannot open), with one line on
 * stderr that names the file, and says so in its --help. */
static void test_invalid_model_exits_3(void **state)
{
    (void)state;
    char *bad = tu_join(dir, "bad.safetensors");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run_result r = run_case(&cases[k], bad);
        char what[64];
        snprintf(what, sizeof what, "%s on an invalid model", cases[k].name);
        expect_status(&r, 3, what);
        if (!strstr(r.err, "bad.safetensors") || !strchr(r.err, '\n') ||
            strchr(r.err, '\n')[1] != '\0')
            fail_msg("%s: stderr is not one line naming the file: %s", what, r.err);
        run_free(&r);
        r = run(dir, cases[k].name, "--help", NULL);
        expect_status(&r, 0, cases[k].name);
        squeeze(r.out);
        if (!strstr(r.out, "Exit status (the same in every command): 0 success; 1 integrity") ||
            !strstr(r.out, "2 usage error") || !strstr(r.out, "3 cannot open") ||
            !strstr(r.out, "4 signature refused"))
            fail_msg("%s --help does not give the table of exit statuses:\n%s",
                     cases[k].name, r.out);
        run_free(&r);
    }
    /* sluice serve: its own program (built with grpc++); 3 when it has
     * no model to serve, and 3 when it is not installed at all */
    run_result r = run(dir, "serve", bad, "--listen", "127.0.0.1:0", NULL);
    expect_status(&r, 3, "serve on an invalid model");
    run_free(&r);
    free(bad);
}

/* A model that opens but has a changed byte: the commands that check
 * tensors exit 1 (cat writing nothing); the good copy exits 0. */
static void test_failed_tensor_exits_1(void **state)
{
    (void)state;
    static const char *const checking[] = {"verify", "cat", "stats", "shard"};
    char *good = tu_join(dir, "good/model.safetensors");
    char *flipped = tu_join(dir, "flipped/model.safetensors");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int checks = 0;
        for (size_t j = 0; j < sizeof checking / sizeof *checking; j++)
            checks |= !strcmp(cases[k].name, checking[j]);
        if (!checks)
            continue;
        char what[64];
        run_result r = run_case(&cases[k], good);
        snprintf(what, sizeof what, "%s on a good model", cases[k].name);
        expect_status(&r, 0, what);
        run_free(&r);
        r = run_case(&cases[k], flipped);
        snprintf(what, sizeof what, "%s on a changed byte", cases[k].name);
        expect_status(&r, 1, what);
        if (!strcmp(cases[k].name, "cat"))
            assert_int_equal(r.out_len, 0);
        run_free(&r);
    }
    free(good);
    free(flipped);
}

/* A bad command line: every command (those that open no model too)
 * exits 2, before it opens anything. */
static void test_usage_exits_2(void **state)
{
    (void)state;
    char *good = tu_join(dir, "good/model.safetensors");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s --no-such-option", cases[k].name);
        run_result r = run_case_with(&cases[k], good, "--no-such-option", NULL, NULL, NULL);
        expect_status(&r, 2, what);
        run_free(&r);
    }
    static const char *const others[] = {"synth", "keygen", "sign", "cache", "repair"};
    for (size_t k = 0; k < sizeof others / sizeof *others; k++) {
        run_result r = run(dir, others[k], "--no-such-option", NULL);
        expect_status(&r, 2, others[k]);
        run_free(&r);
    }
    run_result r = run(dir, "no-such-command", NULL);
    expect_status(&r, 2, "an unknown command");
    run_free(&r);
    free(good);
}

/* The commands that judge a model against its manifest, given a model
 * with none: 3 (the manifest cannot be opened), not 1 nor 2. */
static void test_missing_manifest_exits_3(void **state)
{
    (void)state;
    char *nomf = tu_join(dir, "nomf/model.safetensors");
    char *good = tu_join(dir, "good");
    run_result r = run(dir, "verify", nomf, "-q", NULL);
    expect_status(&r, 3, "verify without a manifest");
    run_free(&r);
    r = run(dir, "repair", nomf, "--fallback", good, "-q", NULL);
    expect_status(&r, 3, "repair without a manifest");
    run_free(&r);
    char *scratch = tu_join(dir, "scratch");
    r = run(dir, "bench-cache", nomf, "--url", nomf, "--cache-dir", scratch, NULL);
    expect_status(&r, 3, "bench-cache without a manifest");
    run_free(&r);
    tu_rmtree(scratch);
    free(scratch);
    /* a manifest named that does not exist */
    char *gone = tu_join(dir, "gone.manifest.json");
    char *goodf = tu_join(dir, "good/model.safetensors");
    r = run(dir, "cat", goodf, "model.norm.weight", "--manifest", gone, NULL);
    expect_status(&r, 3, "cat --manifest MISSING");
    assert_int_equal(r.out_len, 0);
    run_free(&r);
    free(gone);
    free(goodf);
    free(nomf);
    free(good);
}

/* A trusted key that signed nothing: every command that opens a model
 * with the trust options exits 4 (the manifest has no valid signature),
 * and so does verify --no-manifest-link with no model.sig. */
static void test_signature_exits_4(void **state)
{
    (void)state;
    static const char *const trusting[] = {"verify", "cat", "stats", "shard", "bench"};
    char *good = tu_join(dir, "good/model.safetensors");
    char *mirror = tu_join(dir, "good");
    char *pub = tu_join(dir, "k.pub");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int takes = 0;
        for (size_t j = 0; j < sizeof trusting / sizeof *trusting; j++)
            takes |= !strcmp(cases[k].name, trusting[j]);
        /* bench with --world only: the throughput bench reads unverified too */
        if (!takes || (!strcmp(cases[k].name, "bench") && strcmp(cases[k].args[1], "--world")))
            continue;
        char what[64];
        snprintf(what, sizeof what, "%s --key (unsigned manifest)", cases[k].name);
        run_result r = run_case_with(&cases[k], good, "--key", pub, NULL, NULL);
        expect_status(&r, 4, what);
        if (!strcmp(cases[k].name, "cat"))
            assert_int_equal(r.out_len, 0);
        run_free(&r);
    }
    run_result r = run(dir, "repair", good, "--fallback", mirror, "--key", pub, "-q", NULL);
    expect_status(&r, 4, "repair --key (unsigned manifest)");
    run_free(&r);
    r = run(dir, "verify", mirror, "--no-manifest-link", "--key", pub, NULL);
    expect_status(&r, 4, "verify --no-manifest-link without model.sig");
    if (!strstr(r.out, "FAILED"))
        fail_msg("verify --no-manifest-link: no FAILED line: %s", r.out);
    run_free(&r);
    free(good);
    free(mirror);
    free(pub);
}

/* repair whose mirror holds the same damage: the tensor still does not
 * match (1), PATH unchanged. */
static void test_repair_failing_mirror_exits_1(void **state)
{
    (void)state;
    char *flipped = tu_join(dir, "flipped/model.safetensors");
    char *also = tu_join(dir, "flipped");
    run_result r = run(dir, "repair", flipped, "--fallback", also, "-q", NULL);
    expect_status(&r, 1, "repair from a mirror as damaged");
    run_free(&r);
    free(flipped);
    free(also);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_model_exits_3),
        cmocka_unit_test(test_failed_tensor_exits_1),
        cmocka_unit_test(test_usage_exits_2),
        cmocka_unit_test(test_missing_manifest_exits_3),
        cmocka_unit_test(test_signature_exits_4),
        cmocka_unit_test(test_repair_failing_mirror_exits_1),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
