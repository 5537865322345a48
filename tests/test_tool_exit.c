/* test_tool_exit.c: the exit status of every subcommand of `sluice`, as the
 * README ("The `sluice` command") and each --help tell it: 2 for a usage
 * error or a model that cannot be opened, 1 for a model that opens but
 * whose tensors fail, 0 for success (issue 25, item 12: the README said
 * 1 on an invalid model while verify, cat and manifest exit 2). */
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

static char *dir;   /* bad.safetensors; good/ (synth tiny), flipped/ (a byte changed) */

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

static run_result run_case(const cmd_case *c, const char *model)
{
    const char *a[10] = {c->name};
    char *scratch = tu_join(dir, "scratch");
    size_t n = 1;
    for (size_t i = 0; i < 8 && c->args[i]; i++)
        a[n++] = !strcmp(c->args[i], "@") ? model : !strcmp(c->args[i], "%") ? scratch : c->args[i];
    run_result r = run(dir, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], NULL);
    tu_rmtree(scratch);
    free(scratch);
    return r;
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

/* An invalid model: every command exits 2, with one line on stderr that
 * names the file, and says so in its --help. */
static void test_invalid_model_exits_2(void **state)
{
    (void)state;
    char *bad = tu_join(dir, "bad.safetensors");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run_result r = run_case(&cases[k], bad);
        char what[64];
        snprintf(what, sizeof what, "%s on an invalid model", cases[k].name);
        expect_status(&r, 2, what);
        if (!strstr(r.err, "bad.safetensors") || !strchr(r.err, '\n') ||
            strchr(r.err, '\n')[1] != '\0')
            fail_msg("%s: stderr is not one line naming the file: %s", what, r.err);
        run_free(&r);
        r = run(dir, cases[k].name, "--help", NULL);
        expect_status(&r, 0, cases[k].name);
        squeeze(r.out);
        if (!strstr(r.out, "Exit status:") || !strstr(r.out, "2 usage or open error"))
            fail_msg("%s --help does not give the exit status of an open error:\n%s",
                     cases[k].name, r.out);
        run_free(&r);
    }
    /* sluice serve: its own program (built with grpc++); 2 when it has
     * no model to serve, and 2 when it is not installed at all */
    run_result r = run(dir, "serve", bad, "--listen", "127.0.0.1:0", NULL);
    expect_status(&r, 2, "serve on an invalid model");
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_model_exits_2),
        cmocka_unit_test(test_failed_tensor_exits_1),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
