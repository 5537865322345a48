/* test_repair_tools.c: `sluice verify --fallback` and `sluice repair`, run
 * as programs (SLUICE_BINARY_DIR/sluice) on models `sluice synth` writes:
 * a flipped byte in the model, a good copy as a mirror. verify still
 * fails but says which mirror holds the tensor verified; repair writes
 * the mirror's bytes over the tensor and the model verifies again, byte
 * for byte the good file; a mirror that is corrupt too leaves the model
 * unchanged; a SIGKILL at each point of a repair (SLUICE_REPAIR_TEST_KILL)
 * leaves the file as it was or repaired, never half, and the next repair
 * removes the copy the killed one left. Whole files: a flipped header
 * byte, a truncated and a missing shard restored from a mirror directory
 * and from an http mirror (the test's own nginx), byte for byte; a kill
 * at each point; a mirror whose file is not the manifest's refused; a
 * manifest without whole-file digests refused. */
#include "mf_fixture.h"
#include "remote_fixture.h"
#include "util.h"

#include "sluice.h"

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tool_run.h"

typedef struct fx {
    char *dir;          /* scratch */
    char *good;         /* dir/good: the model as synth wrote it (one file) */
    char *model;        /* dir/model: the copy that gets damaged */
    char *mirror;       /* dir/mirror: a good copy, the fallback */
} fx;

static void copy_dir(const char *from, const char *to)
{
    mkdir(to, 0755);
    DIR *d = opendir(from);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char *a = tu_join(from, e->d_name), *b = tu_join(to, e->d_name);
        tu_copy_file(a, b);
        free(a);
        free(b);
    }
    closedir(d);
}

/* The absolute offset of tensor i of the model at path, and its file. */
static uint64_t tensor_at(const char *path, size_t i, char *file, size_t cap)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, i, &ti), SLUICE_OK);
    snprintf(file, cap, "%s", ti.file);
    uint64_t off = ti.offset + ti.nbytes / 2;
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return off;
}

/* Whether files a and b hold the same bytes. */
static int same(const char *a, const char *b)
{
    size_t la, lb;
    void *pa = tu_read_file(a, &la), *pb = tu_read_file(b, &lb);
    int eq = pa && pb && la == lb && memcmp(pa, pb, la) == 0;
    free(pa);
    free(pb);
    return eq;
}

/* How many entries of dir start with '.' (but . and ..): the copies. */
static size_t hidden(const char *dir)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int setup(void **state)
{
    tool_group_setup(state);
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->good = tu_join(f->dir, "good");
    f->model = tu_join(f->dir, "model");
    f->mirror = tu_join(f->dir, "mirror");
    run_result r = run(f->dir, "synth", "tiny", f->good, "--shards", "1", NULL);
    expect_status(&r, 0, "synth");
    run_free(&r);
    copy_dir(f->good, f->model);
    copy_dir(f->good, f->mirror);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->good);
    free(f->model);
    free(f->mirror);
    free(f);
    return 0;
}

/* The model's file and the good one's. */
static void files_of(const fx *f, char **model, char **good)
{
    *model = tu_join(f->model, "model.safetensors");
    *good = tu_join(f->good, "model.safetensors");
}

static void verify_says_recoverable_and_repair_mends(void **state)
{
    fx *f = *state;
    char *mf, *gf, file[4096];
    files_of(f, &mf, &gf);
    mf_flip_byte(mf, tensor_at(f->model, 5, file, sizeof file));
    char *nowhere = tu_join(f->dir, "nowhere");
    /* verify: fails, and says the second fallback holds it */
    run_result r = run(f->dir, "verify", f->model, "-q", "--fallback", nowhere, "--fallback",
                       f->mirror, NULL);
    expect_status(&r, 1, "verify --fallback of a damaged model");
    assert_non_null(strstr(r.out, "38 tensors verified, 1 failed"));
    char want[4200];
    snprintf(want, sizeof want, ": recoverable from fallback 2 (%s)\n", f->mirror);
    if (!strstr(r.out, want))
        fail_msg("verify does not say the tensor is recoverable (%s):\n%s", want, r.out);
    assert_non_null(strstr(r.out, "1 of 1 failed tensor recoverable from the fallbacks"));
    run_free(&r);
    /* without a mirror that holds it: not recoverable, and why */
    r = run(f->dir, "verify", f->model, "-q", "--fallback", nowhere, NULL);
    expect_status(&r, 1, "verify --fallback nowhere");
    assert_non_null(strstr(r.out, ": not recoverable from the fallbacks: "));
    assert_non_null(strstr(r.out, "0 of 1 failed tensor recoverable"));
    run_free(&r);
    /* repair: the file is the good one again, byte for byte */
    r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
    expect_status(&r, 0, "repair");
    assert_non_null(strstr(r.out, "1 tensor written"));
    assert_non_null(strstr(r.out, "39 tensors verified, 0 failed"));
    run_free(&r);
    assert_true(same(mf, gf));
    assert_int_equal(hidden(f->model), 0);
    /* nothing left to do: exit 0, the file untouched */
    r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
    expect_status(&r, 0, "repair of a good model");
    assert_non_null(strstr(r.out, "nothing to repair"));
    run_free(&r);
    r = run(f->dir, "verify", f->model, "-q", NULL);
    expect_status(&r, 0, "verify after repair");
    run_free(&r);
    free(nowhere);
    free(mf);
    free(gf);
}

/* A mirror damaged in the same tensor: repair fails (1), the model's
 * file unchanged, no copy left. */
static void mirror_that_fails_too(void **state)
{
    fx *f = *state;
    char *mf, *gf, file[4096];
    files_of(f, &mf, &gf);
    uint64_t off = tensor_at(f->model, 7, file, sizeof file);
    mf_flip_byte(mf, off);
    char *bad_mirror = tu_join(f->dir, "bad_mirror"), *bf = tu_join(bad_mirror, "model.safetensors");
    copy_dir(f->model, bad_mirror);
    char *before = tu_join(f->dir, "before");
    tu_copy_file(mf, before);
    run_result r = run(f->dir, "repair", f->model, "-q", "--fallback", bad_mirror, NULL);
    expect_status(&r, 1, "repair from a mirror that fails too");
    assert_non_null(strstr(r.out, "not recoverable from the fallbacks"));
    assert_non_null(strstr(r.out, "unchanged"));
    run_free(&r);
    assert_true(same(mf, before));
    assert_int_equal(hidden(f->model), 0);
    /* then a good mirror after the bad one: mended */
    r = run(f->dir, "repair", f->model, "-q", "--fallback", bad_mirror, "--fallback", f->mirror,
            NULL);
    expect_status(&r, 0, "repair, second mirror good");
    run_free(&r);
    assert_true(same(mf, gf));
    tu_rmtree(bad_mirror);
    unlink(before);
    free(before);
    free(bf);
    free(bad_mirror);
    free(mf);
    free(gf);
}

/* SIGKILL at each point of a repair: the file is the damaged one (before
 * the rename) or the good one (after), nothing else; the next repair
 * removes the copy left and mends the file. */
static void kill_at_every_point(void **state)
{
    fx *f = *state;
    char *mf, *gf, file[4096];
    files_of(f, &mf, &gf);
    mf_flip_byte(mf, tensor_at(f->model, 3, file, sizeof file));
    mf_flip_byte(mf, tensor_at(f->model, 30, file, sizeof file));
    char *damaged = tu_join(f->dir, "damaged");
    tu_copy_file(mf, damaged);
    static const char *const points[] = {"temp", "copied", "written", "synced", "renamed"};
    for (size_t k = 0; k < sizeof points / sizeof *points; k++) {
        tu_copy_file(damaged, mf);
        setenv("SLUICE_REPAIR_TEST_KILL", points[k], 1);
        run_result r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
        unsetenv("SLUICE_REPAIR_TEST_KILL");
        if (r.status != 128 + SIGKILL)
            fail_msg("repair killed at %s: exit %d\n%s%s", points[k], r.status, r.out, r.err);
        run_free(&r);
        int after = !strcmp(points[k], "renamed");
        if (!same(mf, after ? gf : damaged))
            fail_msg("killed at %s: the file is neither as it was nor repaired (or not the "
                     "one expected: %s)", points[k], after ? "repaired" : "as it was");
        /* the copy of a kill before the rename is left, and removed next */
        assert_int_equal(hidden(f->model), after ? 0 : 1);
        r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
        expect_status(&r, 0, "repair after a killed one");
        if (!after)
            assert_non_null(strstr(r.out, "the copy of a repair that did not finish"));
        run_free(&r);
        assert_true(same(mf, gf));
        assert_int_equal(hidden(f->model), 0);
    }
    unlink(damaged);
    free(damaged);
    free(mf);
    free(gf);
}

/* The Hub's cache layout: snapshots/REV/model.safetensors a symlink to
 * blobs/SHA. The blob is repaired; the symlink stays one. */
static void symlinked_file(void **state)
{
    fx *f = *state;
    char *hub = tu_join(f->dir, "hub"), *blobs = tu_join(hub, "blobs"), *snap = tu_join(hub, "snap");
    char *blob = tu_join(blobs, "0123abcd"), *link = tu_join(snap, "model.safetensors");
    char *lm = tu_join(snap, "model.safetensors.manifest.json");
    char *gm = tu_join(f->good, "model.safetensors.manifest.json"), *gf = tu_join(f->good, "model.safetensors");
    assert_int_equal(mkdir(hub, 0755), 0);
    assert_int_equal(mkdir(blobs, 0755), 0);
    assert_int_equal(mkdir(snap, 0755), 0);
    tu_copy_file(gf, blob);
    tu_copy_file(gm, lm);
    assert_int_equal(symlink("../blobs/0123abcd", link), 0);
    char file[4096];
    mf_flip_byte(blob, tensor_at(snap, 11, file, sizeof file));
    run_result r = run(f->dir, "repair", snap, "-q", "--fallback", f->mirror, NULL);
    expect_status(&r, 0, "repair through a symlink");
    assert_non_null(strstr(r.out, "blobs/0123abcd: 1 tensor written"));
    run_free(&r);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_true(same(blob, gf));
    assert_int_equal(hidden(blobs), 0);
    free(hub);
    free(blobs);
    free(snap);
    free(blob);
    free(link);
    free(lm);
    free(gm);
    free(gf);
}

/* A symlinked file whose target is gone (a Hub cache snapshot whose blob
 * was deleted: the symlink dangles): the file is missing, and its
 * symlink's target is what is restored, the symlink kept. */
static void dangling_symlink_restored(void **state)
{
    fx *f = *state;
    char *hub = tu_join(f->dir, "hub"), *blobs = tu_join(hub, "blobs"), *snap = tu_join(hub, "snap");
    char *blob = tu_join(blobs, "0123abcd"), *link = tu_join(snap, "model.safetensors");
    char *lm = tu_join(snap, "model.safetensors.manifest.json");
    char *gm = tu_join(f->good, "model.safetensors.manifest.json"), *gf = tu_join(f->good, "model.safetensors");
    assert_int_equal(mkdir(hub, 0755), 0);
    assert_int_equal(mkdir(blobs, 0755), 0);
    assert_int_equal(mkdir(snap, 0755), 0);
    tu_copy_file(gm, lm);
    assert_int_equal(symlink("../blobs/0123abcd", link), 0);  /* no blob: it dangles */
    run_result r = run(f->dir, "repair", snap, "-q", "--fallback", f->mirror, NULL);
    if (r.status != 0 || !strstr(r.out, "model.safetensors: missing") ||
        !strstr(r.out, "restored "))
        fail_msg("repair of a dangling symlink: exit %d\n%s%s", r.status, r.out, r.err);
    run_free(&r);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_true(same(blob, gf));
    assert_int_equal(hidden(blobs), 0);
    free(hub);
    free(blobs);
    free(snap);
    free(blob);
    free(link);
    free(lm);
    free(gm);
    free(gf);
}

/* Two shards, each with a flipped tensor: each file repaired; and the
 * usage errors. */
static void sharded_and_usage(void **state)
{
    fx *f = *state;
    char *good = tu_join(f->dir, "sgood"), *model = tu_join(f->dir, "smodel");
    char *mirror = tu_join(f->dir, "smirror");
    run_result r = run(f->dir, "synth", "tiny", good, NULL);
    expect_status(&r, 0, "synth sharded");
    run_free(&r);
    copy_dir(good, model);
    copy_dir(good, mirror);
    char f1[4096], f2[4096];
    uint64_t o1 = tensor_at(model, 1, f1, sizeof f1);
    uint64_t o2 = tensor_at(model, 37, f2, sizeof f2);
    assert_string_not_equal(f1, f2);
    mf_flip_byte(f1, o1);
    mf_flip_byte(f2, o2);
    r = run(f->dir, "repair", model, "-q", "--fallback", mirror, NULL);
    expect_status(&r, 0, "repair of two shards");
    const char *second = strstr(r.out, "1 tensor written");
    assert_non_null(second);
    assert_non_null(strstr(second + 1, "1 tensor written"));
    assert_non_null(strstr(r.out, "39 tensors verified, 0 failed"));
    run_free(&r);
    r = run(f->dir, "verify", model, "--files", "-q", NULL);
    expect_status(&r, 0, "verify --files after repair");
    run_free(&r);
    /* usage: no --fallback, a remote PATH */
    r = run(f->dir, "repair", model, NULL);
    expect_status(&r, 2, "repair without --fallback");
    assert_non_null(strstr(r.err, "at least one --fallback"));
    run_free(&r);
    r = run(f->dir, "repair", "http://127.0.0.1:9/m/", "--fallback", mirror, NULL);
    expect_status(&r, 2, "repair of a URL");
    assert_non_null(strstr(r.err, "must be local"));
    run_free(&r);
    r = run(f->dir, "repair", "--help", NULL);
    expect_status(&r, 0, "repair --help");
    assert_non_null(strstr(r.out, "never half"));
    run_free(&r);
    free(good);
    free(model);
    free(mirror);
}

/* ---------------------------------------------------------------- whole files */

enum { HEADER_BYTE, TRUNCATED, MISSING };
static const char *const damage_name[] = {"a flipped header byte", "a truncated file",
                                          "a missing file"};

/* Damages file as `kind` says. */
static void damage(const char *file, int kind)
{
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    if (kind == HEADER_BYTE)
        mf_flip_byte(file, 20);     /* in the header's JSON: the open fails */
    else if (kind == TRUNCATED)
        assert_int_equal(truncate(file, st.st_size / 2), 0);
    else
        assert_int_equal(unlink(file), 0);
}

/* Each damage repaired from mirror: the file restored whole, byte for
 * byte the good one, no copy left. */
static void restore_each(fx *f, const char *mirror, const char *from)
{
    char *mf, *gf;
    files_of(f, &mf, &gf);
    for (int kind = HEADER_BYTE; kind <= MISSING; kind++) {
        damage(mf, kind);
        run_result r = run(f->dir, "repair", f->model, "-q", "--fallback", mirror, NULL);
        if (r.status != 0 || !strstr(r.out, "restored ") || !strstr(r.out, from))
            fail_msg("repair of %s from %s: exit %d\n%s%s", damage_name[kind], mirror, r.status,
                     r.out, r.err);
        assert_non_null(strstr(r.out, kind == MISSING ? "model.safetensors: missing"
                                      : kind == TRUNCATED ? "bytes, the manifest's"
                                                          : "header is not the manifest's"));
        assert_non_null(strstr(r.out, "39 tensors verified, 0 failed"));
        run_free(&r);
        if (!same(mf, gf))
            fail_msg("%s: the file is not the good one after the repair", damage_name[kind]);
        assert_int_equal(hidden(f->model), 0);
    }
    free(mf);
    free(gf);
}

static void whole_files_from_a_directory(void **state)
{
    fx *f = *state;
    restore_each(f, f->mirror, "from fallback 1 (");
    /* a sharded model missing one shard (the sidecar sluice.manifest.json) */
    char *good = tu_join(f->dir, "sgood"), *model = tu_join(f->dir, "smodel");
    char *mirror = tu_join(f->dir, "smirror");
    run_result r = run(f->dir, "synth", "tiny", good, NULL);
    expect_status(&r, 0, "synth sharded");
    run_free(&r);
    copy_dir(good, model);
    copy_dir(good, mirror);
    char **shards = NULL, **gshards = NULL;
    size_t n = tu_list_safetensors(model, &shards);
    assert_int_equal(tu_list_safetensors(good, &gshards), n);
    assert_true(n >= 2);
    assert_int_equal(unlink(shards[n - 1]), 0);
    r = run(f->dir, "repair", model, "-q", "--fallback", mirror, NULL);
    expect_status(&r, 0, "repair of a missing shard");
    assert_non_null(strstr(r.out, ": missing"));
    assert_non_null(strstr(r.out, ": good (the manifest's size and header)"));
    run_free(&r);
    for (size_t k = 0; k < n; k++)
        assert_true(same(shards[k], gshards[k]));
    tu_free_list(shards, n);
    tu_free_list(gshards, n);
    free(good);
    free(model);
    free(mirror);
}

static void whole_files_from_http(void **state)
{
    fx *f = *state;
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 1;
    sluice_model *m = NULL;
    int rc = sluice_open("http://127.0.0.1:9/x.safetensors", &o, &m);
    sluice_close(m);
    if (rc == SLUICE_E_UNSUPPORTED)
        skip();     /* built without libcurl */
    rf_server sv;
    char why[512];
    chmod(f->dir, 0755);
    if (!rf_nginx_start(&sv, f->dir, NULL, why, sizeof why))
        skip();
    char url[256];
    snprintf(url, sizeof url, "%s/mirror/model.safetensors", sv.base);
    restore_each(f, url, url);
    rf_stop(&sv);
}

/* A mirror whose file is not the manifest's (a flipped data byte: its
 * header is the manifest's, so it opens): refused, nothing replaced;
 * the good mirror after it is taken. */
static void whole_file_mirror_refused(void **state)
{
    fx *f = *state;
    char *mf, *gf, file[4096];
    files_of(f, &mf, &gf);
    char *bad = tu_join(f->dir, "bad_mirror"), *bf = tu_join(bad, "model.safetensors");
    copy_dir(f->good, bad);
    mf_flip_byte(bf, tensor_at(bad, 9, file, sizeof file));
    damage(mf, TRUNCATED);
    char *before = tu_join(f->dir, "before");
    tu_copy_file(mf, before);
    run_result r = run(f->dir, "repair", f->model, "-q", "--fallback", bad, NULL);
    expect_status(&r, 1, "repair from a mirror whose file is not the manifest's");
    assert_non_null(strstr(r.out, "does not match the manifest"));
    assert_non_null(strstr(r.out, "could not be restored"));
    assert_non_null(strstr(r.out, "unchanged"));
    run_free(&r);
    assert_true(same(mf, before));
    assert_int_equal(hidden(f->model), 0);
    r = run(f->dir, "repair", f->model, "-q", "--fallback", bad, "--fallback", f->mirror, NULL);
    expect_status(&r, 0, "repair, second mirror good");
    assert_non_null(strstr(r.out, "from fallback 2 ("));
    run_free(&r);
    assert_true(same(mf, gf));
    unlink(before);
    free(before);
    free(bf);
    free(bad);
    free(mf);
    free(gf);
}

/* A manifest without whole-file digests (flat): refused, with why; a
 * version 1 manifest with them: restored. */
static void whole_file_needs_file_digests(void **state)
{
    fx *f = *state;
    char *mf, *gf;
    files_of(f, &mf, &gf);
    char *side = tu_join(f->model, "model.safetensors.manifest.json");
    run_result r = run(f->dir, "manifest", f->model, "--flat", "-q", "-o", side, NULL);
    expect_status(&r, 0, "manifest --flat");
    run_free(&r);
    damage(mf, MISSING);
    r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
    expect_status(&r, 1, "repair with a flat manifest");
    if (!strstr(r.out, "gives no whole-file digest and size for it (a flat manifest)"))
        fail_msg("no reason given:\n%s%s", r.out, r.err);
    run_free(&r);
    struct stat st;
    assert_int_not_equal(stat(mf, &st), 0);
    assert_int_equal(hidden(f->model), 0);
    /* a version 1 manifest with "files" (SHA-256 and size) is enough */
    tu_copy_file(gf, mf);
    r = run(f->dir, "manifest", f->model, "--v1", "-q", "-o", side, NULL);
    expect_status(&r, 0, "manifest --v1");
    run_free(&r);
    damage(mf, HEADER_BYTE);
    r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
    if (r.status != 0 || !strstr(r.out, "restored "))
        fail_msg("repair with a version 1 manifest: exit %d\n%s%s", r.status, r.out, r.err);
    run_free(&r);
    assert_true(same(mf, gf));
    free(side);
    free(mf);
    free(gf);
}

/* SIGKILL at each point of a whole-file repair: the file as it was
 * (truncated, or missing) before the rename, restored after; the next
 * repair removes the copy left and restores it. */
/* The exit classes of a model that does not open and cannot be restored:
 * no manifest to judge the mirrors by (3: cannot open), and no mirror
 * that opens with it (1: not repaired); the file is left as it was. */
static void whole_file_exit_classes(void **state)
{
    fx *f = *state;
    char *mf, *gf, *nowhere = tu_join(f->dir, "nowhere");
    files_of(f, &mf, &gf);
    damage(mf, TRUNCATED);
    struct stat before, after;
    assert_int_equal(stat(mf, &before), 0);
    run_result r = run(f->dir, "repair", f->model, "-q", "--fallback", nowhere, NULL);
    expect_status(&r, 3, "repair with no manifest to judge the mirrors by");
    assert_non_null(strstr(r.err, "no manifest to judge the mirrors by"));
    run_free(&r);
    char *man = tu_join(f->good, "model.safetensors.manifest.json");
    r = run(f->dir, "repair", f->model, "-q", "--fallback", nowhere, "--manifest", man, NULL);
    expect_status(&r, 1, "repair with no mirror that opens");
    assert_non_null(strstr(r.out, "no fallback opens with the manifest"));
    assert_non_null(strstr(r.out, "unchanged"));
    run_free(&r);
    assert_int_equal(stat(mf, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    assert_int_equal(hidden(f->model), 0);
    free(man);
    free(nowhere);
    free(mf);
    free(gf);
}

static void whole_file_kill_at_every_point(void **state)
{
    fx *f = *state;
    char *mf, *gf;
    files_of(f, &mf, &gf);
    char *damaged = tu_join(f->dir, "damaged");
    static const char *const points[] = {"temp", "copied", "written", "synced", "renamed"};
    for (int kind = TRUNCATED; kind <= MISSING; kind++)
        for (size_t k = 0; k < sizeof points / sizeof *points; k++) {
            tu_copy_file(gf, mf);
            damage(mf, kind);
            if (kind == TRUNCATED)
                tu_copy_file(mf, damaged);
            setenv("SLUICE_REPAIR_TEST_KILL", points[k], 1);
            run_result r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
            unsetenv("SLUICE_REPAIR_TEST_KILL");
            if (r.status != 128 + SIGKILL)
                fail_msg("repair of %s killed at %s: exit %d\n%s%s", damage_name[kind],
                         points[k], r.status, r.out, r.err);
            run_free(&r);
            int after = !strcmp(points[k], "renamed");
            struct stat st;
            int ok = after ? same(mf, gf)
                           : kind == MISSING ? stat(mf, &st) != 0 : same(mf, damaged);
            if (!ok)
                fail_msg("%s, killed at %s: the file is neither as it was nor restored",
                         damage_name[kind], points[k]);
            assert_int_equal(hidden(f->model), after ? 0 : 1);
            r = run(f->dir, "repair", f->model, "-q", "--fallback", f->mirror, NULL);
            expect_status(&r, 0, "repair after a killed one");
            if (!after)
                assert_non_null(strstr(r.out, "the copy of a repair that did not finish"));
            run_free(&r);
            assert_true(same(mf, gf));
            assert_int_equal(hidden(f->model), 0);
        }
    unlink(damaged);
    free(damaged);
    free(mf);
    free(gf);
}

/* The two library calls whole-file repair stands on, and their bad
 * input. */
static void read_file_range_and_find_manifest(void **state)
{
    fx *f = *state;
    char *mf, *gf;
    files_of(f, &mf, &gf);
    size_t len = 0;
    unsigned char *want = tu_read_file(gf, &len);
    assert_non_null(want);
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(f->good, &o, &m), SLUICE_OK);
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    assert_int_equal(sluice_read_file_range(m, 0, 0, len, buf), SLUICE_OK);
    assert_memory_equal(buf, want, len);
    assert_int_equal(sluice_read_file_range(m, 0, len - 3, 3, buf), SLUICE_OK);
    assert_memory_equal(buf, want + len - 3, 3);
    assert_int_equal(sluice_read_file_range(m, 0, len, 0, buf), SLUICE_OK);
    /* bad input: each fails with a message */
    assert_int_equal(sluice_read_file_range(m, 0, len - 3, 4, buf), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "past its end"));
    assert_int_equal(sluice_read_file_range(m, 0, UINT64_MAX, 1, buf), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_file_range(m, 1, 0, 1, buf), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "no such file"));
    assert_int_equal(sluice_read_file_range(m, 0, 0, 1, NULL), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "dst is NULL"));
    assert_int_equal(sluice_read_file_range(NULL, 0, 0, 1, buf), SLUICE_E_INVAL);
    /* the sidecar of a directory of one file: F.manifest.json needs F's
     * name, from like; without it, only sluice.manifest.json is looked for */
    char *p = NULL;
    assert_int_equal(sluice_find_manifest(f->model, NULL, &p), SLUICE_E_MANIFEST);
    assert_non_null(p);
    assert_non_null(strstr(p, "/sluice.manifest.json"));
    free(p);
    assert_int_equal(unlink(mf), 0);  /* found without opening the model */
    assert_int_equal(sluice_find_manifest(f->model, m, &p), SLUICE_OK);
    char *side = tu_join(f->model, "model.safetensors.manifest.json");
    assert_string_equal(p, side);
    free(p);
    assert_int_equal(sluice_find_manifest(mf, NULL, &p), SLUICE_OK);
    assert_string_equal(p, side);
    free(p);
    assert_int_equal(unlink(side), 0);
    assert_int_equal(sluice_find_manifest(mf, m, &p), SLUICE_E_MANIFEST);
    assert_string_equal(p, side);
    free(p);
    assert_int_equal(sluice_find_manifest(NULL, m, &p), SLUICE_E_INVAL);
    assert_null(p);
    assert_int_equal(sluice_find_manifest(f->model, m, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(side);
    free(buf);
    free(want);
    free(mf);
    free(gf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(verify_says_recoverable_and_repair_mends, setup, teardown),
        cmocka_unit_test_setup_teardown(mirror_that_fails_too, setup, teardown),
        cmocka_unit_test_setup_teardown(kill_at_every_point, setup, teardown),
        cmocka_unit_test_setup_teardown(symlinked_file, setup, teardown),
        cmocka_unit_test_setup_teardown(sharded_and_usage, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_files_from_a_directory, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_files_from_http, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_file_mirror_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_file_needs_file_digests, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_file_exit_classes, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_file_kill_at_every_point, setup, teardown),
        cmocka_unit_test_setup_teardown(read_file_range_and_find_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(dangling_symlink_restored, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
