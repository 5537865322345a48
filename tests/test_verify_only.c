/* test_verify_only.c: sluice_verify, the verify-only path, through the
 * public API: every item's digest equals an independent SHA-256 of the
 * file's bytes; a flipped byte fails exactly its tensor (and its file),
 * by name and with both digests; files, subsets, digests without a
 * manifest, a tensor the manifest does not list; a file cut after open;
 * O_DIRECT with tensors at unaligned offsets; cancellation, a callback
 * that stops, progress; every bad argument; memory that does not grow
 * with the model; and a verify running beside a stream on the same model
 * (this program runs under ThreadSanitizer too). */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <errno.h>
#include <sys/stat.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* ---------------------------------------------------------------- fixture */

typedef struct fixture {
    char *dir, *model, *manifest;
    size_t n;
    uint64_t file_size, data_bytes;
} fixture;

/* The manifest of the model at path (structured, with its file), each
 * digest computed here from the file's bytes. skip: a tensor left out
 * (SIZE_MAX: none). */
static void write_manifest(const char *model, const char *out, size_t skip)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model, &o, &m), SLUICE_OK);
    mf_buf b = {0};
    char hex[65];
    uint8_t d[32];
    mf_addf(&b, "{\"format\":\"sluice-manifest\",\"version\":1,\"algorithm\":\"sha256\",\"tensors\":{");
    for (size_t i = 0, k = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &ti), SLUICE_OK);
        if (i == skip)
            continue;
        void *bytes = tu_pread_range(ti.file, ti.offset, (size_t)ti.nbytes);
        mf_sha256(bytes, (size_t)ti.nbytes, d);
        free(bytes);
        mf_addf(&b, "%s\"%s\":{\"sha256\":\"%s\"}", k++ ? "," : "", ti.name, mf_hex(d, hex));
    }
    mf_addf(&b, "},\"files\":{");
    for (size_t f = 0; f < sluice_file_count(m); f++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        assert_int_equal(sluice_file_info(m, f, &fi), SLUICE_OK);
        size_t len = 0;
        void *all = tu_read_file(fi.path, &len);
        assert_non_null(all);
        mf_sha256(all, len, d);
        free(all);
        const char *base = strrchr(fi.path, '/');
        mf_addf(&b, "%s\"%s\":{\"sha256\":\"%s\",\"size\":%zu}", f ? "," : "",
                base ? base + 1 : fi.path, mf_hex(d, hex), len);
    }
    mf_addf(&b, "}}");
    mf_write_text(out, b.p);
    mf_buf_free(&b);
    sluice_close(m);
}

/* n tensors t.0 .. t.(n-1) of sizes 1 + i * step: odd sizes, so most
 * tensors start at offsets that are not 4 KiB aligned. */
static void make(fixture *fx, size_t n, uint64_t step)
{
    fx->dir = tu_tmpdir();
    fx->model = tu_join(fx->dir, "model.safetensors");
    fx->manifest = tu_join(fx->dir, "model.safetensors.manifest.json");
    fx->n = n;
    mf_write_simple(fx->model, n, step);
    write_manifest(fx->model, fx->manifest, SIZE_MAX);
    size_t len = 0;
    free(tu_read_file(fx->model, &len));
    fx->file_size = len;
    fx->data_bytes = 0;
    for (size_t i = 0; i < n; i++)
        fx->data_bytes += 1 + i * step;
}

static void unmake(fixture *fx)
{
    tu_rmtree(fx->dir);
    free(fx->dir);
    free(fx->model);
    free(fx->manifest);
}

static sluice_model *open_model(const char *path, sluice_verify_policy policy, uint32_t flags)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = policy;
    o.flags = flags;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s", path, m ? sluice_errmsg(m) : sluice_strerror(rc));
    return m;
}

/* What the callback saw. */
typedef struct seen {
    const sluice_model *m;
    size_t calls, ok, failed, files;
    size_t bad_index;          /* the last failed tensor */
    int bad_status;
    char message[1024];
    int stop_after;            /* >0: return 7 after that many calls */
    sluice_cancel *cancel_after_first;
    int checked_digests;       /* digests compared with an independent SHA-256 */
} seen;

static int on_item(void *user, const struct sluice_verify_item *it)
{
    seen *s = user;
    s->calls++;
    assert_int_equal(it->size, sizeof *it);
    assert_non_null(it->name);
    assert_non_null(it->message);
    if (it->kind == SLUICE_VERIFY_ITEM_FILE) {
        s->files++;
    } else {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(s->m, it->index, &ti), SLUICE_OK);
        assert_string_equal(it->name, ti.name);
        assert_int_equal(it->name_len, ti.name_len);
        if (it->has_digest) {
            uint8_t want[32];
            void *bytes = tu_pread_range(ti.file, ti.offset, (size_t)ti.nbytes);
            mf_sha256(bytes, (size_t)ti.nbytes, want);
            free(bytes);
            assert_memory_equal(it->digest, want, 32);
            assert_int_equal(it->bytes, ti.nbytes);
            s->checked_digests++;
        }
    }
    if (it->status == SLUICE_OK) {
        s->ok++;
        assert_string_equal(it->message, "");
    } else {
        s->failed++;
        s->bad_status = it->status;
        if (it->kind == SLUICE_VERIFY_ITEM_TENSOR)
            s->bad_index = it->index;
        snprintf(s->message, sizeof s->message, "%s", it->message);
    }
    if (s->cancel_after_first)
        sluice_cancel_request(s->cancel_after_first);
    if (s->stop_after && (int)s->calls >= s->stop_after)
        return 7;
    return 0;
}

static sluice_verify_options options(seen *s, uint32_t flags)
{
    sluice_verify_options o;
    sluice_verify_options_init(&o);
    o.flags = flags;
    o.on_item = on_item;
    o.user = s;
    return o;
}

/* ---------------------------------------------------------------- tests */

static void every_tensor_matches(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 40, 9973);
    for (unsigned threads = 1; threads <= 8; threads *= 2) {
        sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
        seen s = {.m = m};
        sluice_verify_options o = options(&s, 0);
        o.threads = threads;
        struct sluice_verify_report r = {.size = sizeof r};
        assert_int_equal(sluice_verify(m, NULL, 0, &o, &r), SLUICE_OK);
        assert_int_equal(s.calls, fx.n);
        assert_int_equal(s.ok, fx.n);
        assert_int_equal(s.checked_digests, fx.n);
        assert_int_equal(r.tensors_ok, fx.n);
        assert_int_equal(r.tensors_failed, 0);
        assert_int_equal(r.files_ok + r.files_failed, 0);
        uint64_t total = 0;
        for (size_t i = 0; i < fx.n; i++)
            total += 1 + i * 9973;
        assert_int_equal(r.bytes_hashed, total);
        assert_int_equal(r.bytes_direct, 0);
        assert_true(r.threads >= 1 && r.threads <= threads);
        /* no pool was touched */
        struct sluice_stats st = {.size = sizeof st};
        assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
        assert_int_equal(st.bytes_read, 0);
        assert_int_equal(st.pool_high_water, 0);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    unmake(&fx);
}

static void flipped_byte_fails_its_tensor_and_file(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 20, 5000);
    sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, "t.13", &ti), SLUICE_OK);
    mf_flip_byte(fx.model, ti.offset + ti.nbytes - 1); /* its last byte */
    /* 1 thread: the file and its tensors in one pass (fused); 2: apart */
    for (unsigned threads = 1; threads <= 2; threads++) {
        seen s = {.m = m};
        sluice_verify_options o = options(&s, SLUICE_VF_FILES);
        o.threads = threads;
        struct sluice_verify_report r = {.size = sizeof r};
        assert_int_equal(sluice_verify(m, NULL, 0, &o, &r), SLUICE_E_CHECKSUM);
        assert_int_equal(r.tensors_ok, fx.n - 1);
        assert_int_equal(r.tensors_failed, 1);
        assert_int_equal(r.files_ok, 0);
        assert_int_equal(r.files_failed, 1);
        assert_int_equal(s.files, 1);
        assert_int_equal(s.calls, fx.n + 1);
        assert_int_equal(s.checked_digests, fx.n);
        assert_int_equal(r.bytes_hashed, 2 * fx.file_size - (fx.file_size - fx.data_bytes));
        /* the file's failure may come first: either names the mismatch */
        assert_true(strstr(sluice_errmsg(m), "SHA-256 mismatch"));
    }
    sluice_verify_options o;
    uint8_t want[32];
    char hex[65];
    assert_int_equal(sluice_manifest_tensor(m, ti.index, want), SLUICE_OK);
    seen only = {.m = m};
    const char *name = "t.13";
    o = options(&only, 0);
    assert_int_equal(sluice_verify(m, &name, 1, &o, NULL), SLUICE_E_CHECKSUM);
    assert_int_equal(only.calls, 1);
    assert_int_equal(only.bad_index, ti.index);
    assert_int_equal(only.bad_status, SLUICE_E_CHECKSUM);
    assert_true(strstr(only.message, "\"t.13\""));
    assert_true(strstr(only.message, fx.model));
    assert_true(strstr(only.message, sluice_digest_hex(want, hex)));
    assert_string_equal(sluice_errmsg(m), only.message);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unmake(&fx);
}

static void files_and_subsets(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 10, 3000);
    sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
    seen s = {.m = m};
    sluice_verify_options o = options(&s, SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS);
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, NULL, 0, &o, &r), SLUICE_OK);
    assert_int_equal(s.calls, 1);
    assert_int_equal(r.files_ok, 1);
    assert_int_equal(r.bytes_hashed, fx.file_size);
    /* a list, a name twice, the empty list */
    const char *names[] = {"t.9", "t.0", "t.9"};
    seen l = {.m = m};
    o = options(&l, 0);
    assert_int_equal(sluice_verify(m, names, 3, &o, &r), SLUICE_OK);
    assert_int_equal(l.calls, 3);
    assert_int_equal(r.tensors_ok, 3);
    seen e = {.m = m};
    o = options(&e, 0);
    assert_int_equal(sluice_verify(m, names, 0, &o, &r), SLUICE_OK);
    assert_int_equal(e.calls, 0);
    /* unknown and NULL names: nothing is read */
    const char *unknown[] = {"t.0", "nope"};
    assert_int_equal(sluice_verify(m, unknown, 2, &o, NULL), SLUICE_E_NOT_FOUND);
    assert_true(strstr(sluice_errmsg(m), "nope"));
    const char *null_name[] = {"t.0", NULL};
    assert_int_equal(sluice_verify(m, null_name, 2, &o, NULL), SLUICE_E_INVAL);
    assert_int_equal(e.calls, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* a size in the manifest that is not the file's */
    char *text = tu_read_file(fx.manifest, &(size_t){0});
    char *size = strstr(text, "\"size\":");
    assert_non_null(size);
    size[7] = size[7] == '9' ? '8' : '9';
    mf_write_text(fx.manifest, text);
    free(text);
    m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
    seen f = {.m = m};
    o = options(&f, SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS);
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_CHECKSUM);
    assert_true(strstr(f.message, "the manifest says"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unmake(&fx);
}

static void digests_without_a_manifest(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 12, 777);
    sluice_model *m = open_model(fx.model, SLUICE_VERIFY_OFF, 0);
    seen s = {.m = m};
    sluice_verify_options o = options(&s, 0);
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_MANIFEST);
    assert_true(strstr(sluice_errmsg(m), "no manifest"));
    assert_int_equal(s.calls, 0);
    o = options(&s, SLUICE_VF_DIGEST_ONLY | SLUICE_VF_FILES);
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_OK);
    assert_int_equal(s.ok, fx.n + 1);
    assert_int_equal(s.checked_digests, fx.n);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* IF_PRESENT, one tensor left out of the manifest */
    write_manifest(fx.model, fx.manifest, 4);
    m = open_model(fx.model, SLUICE_VERIFY_IF_PRESENT, 0);
    seen p = {.m = m};
    o = options(&p, 0);
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_MANIFEST_MISSING);
    assert_int_equal(p.failed, 1);
    assert_int_equal(p.bad_index, 4);
    assert_true(strstr(p.message, "\"t.4\""));
    assert_true(strstr(p.message, "no digest"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unmake(&fx);
}

static void file_cut_after_open(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 16, 60000);
    for (int direct = 0; direct <= 1; direct++) {
        mf_write_simple(fx.model, fx.n, 60000);
        sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, direct ? SLUICE_F_DIRECT : 0);
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find(m, "t.10", &ti), SLUICE_OK);
        assert_int_equal(truncate(fx.model, (off_t)(ti.offset + 100)), 0);
        seen s = {.m = m};
        sluice_verify_options o = options(&s, SLUICE_VF_FILES);
        struct sluice_verify_report r = {.size = sizeof r};
        int rc = sluice_verify(m, NULL, 0, &o, &r);
        assert_true(rc == SLUICE_E_FILE_CHANGED || rc == SLUICE_E_CHECKSUM);
        /* t.0 .. t.9 still match; t.10 .. t.15 are cut; the file is short */
        assert_int_equal(r.tensors_ok, 10);
        assert_int_equal(r.tensors_failed, 6);
        assert_int_equal(r.files_failed, 1);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    unmake(&fx);
}

/* O_DIRECT: tensors at unaligned offsets, one larger than several blocks. */
static void direct_reads(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *model = tu_join(dir, "model.safetensors");
    char *manifest = tu_join(dir, "model.safetensors.manifest.json");
    const char *keys[] = {"a", "big", "c", "empty", "d"};
    uint64_t sizes[] = {4097, (30u << 20) + 4093, 1, 0, 70001}; /* big: more blocks than in flight */
    mf_write_model(model, 5, keys, sizes);
    write_manifest(model, manifest, SIZE_MAX);
    sluice_model *m = open_model(model, SLUICE_VERIFY_DEFAULT, SLUICE_F_DIRECT);
    for (unsigned threads = 1; threads <= 4; threads *= 4) {
        seen s = {.m = m};
        sluice_verify_options o = options(&s, SLUICE_VF_FILES);
        o.threads = threads;
        struct sluice_verify_report r = {.size = sizeof r};
        assert_int_equal(sluice_verify(m, NULL, 0, &o, &r), SLUICE_OK);
        assert_int_equal(r.tensors_ok, 5);
        assert_int_equal(r.files_ok, 1);
        assert_int_equal(s.checked_digests, 5);
        struct sluice_stats st = {.size = sizeof st};
        assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
        size_t file_size = 0;
        free(tu_read_file(model, &file_size));
        /* Exactly the file and the tensors of 64 KiB or more: the small
         * ones are read buffered, not a block each. */
        if (r.bytes_direct)
            assert_int_equal(r.bytes_direct, file_size + sizes[1] + sizes[4]);
        else
            fprintf(stderr, "note: no O_DIRECT on this file system; read buffered\n");
        assert_int_equal(r.bytes_hashed, file_size + sizes[0] + sizes[1] + sizes[2] + sizes[4]);
        (void)st;
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
    free(model);
    free(manifest);
}

typedef struct progress_seen {
    struct sluice_stream_progress last;
    size_t calls;
} progress_seen;

static void progress_fn(void *user, const struct sluice_stream_progress *p)
{
    progress_seen *ps = user;
    assert_true(p->tensors_done <= p->tensors_total);
    assert_true(p->bytes_done <= p->bytes_total);
    assert_true(p->tensors_done >= ps->last.tensors_done);
    ps->last = *p;
    ps->calls++;
}

static void cancel_stop_progress(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 30, 4000);
    sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
    sluice_cancel *c = NULL;
    assert_int_equal(sluice_cancel_create(&c), SLUICE_OK);
    /* requested before: nothing is reported */
    sluice_cancel_request(c);
    seen s = {.m = m};
    sluice_verify_options o = options(&s, 0);
    o.cancel = c;
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_CANCELLED);
    assert_int_equal(s.calls, 0);
    /* requested from the first callback: no callback after it */
    sluice_cancel_reset(c);
    seen s2 = {.m = m, .cancel_after_first = c};
    o = options(&s2, 0);
    o.cancel = c;
    o.threads = 1;
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_CANCELLED);
    assert_int_equal(s2.calls, 1);
    /* a callback that stops */
    seen s3 = {.m = m, .stop_after = 3};
    o = options(&s3, 0);
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), 7);
    assert_int_equal(s3.calls, 3);
    /* progress: the last call says all done */
    progress_seen ps = {0};
    seen s4 = {.m = m};
    o = options(&s4, 0);
    o.progress = progress_fn;
    o.progress_user = &ps;
    o.progress_interval_ms = 0;
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_OK);
    assert_true(ps.calls >= 1);
    assert_int_equal(ps.last.tensors_done, fx.n);
    assert_int_equal(ps.last.tensors_total, fx.n);
    assert_int_equal(ps.last.bytes_done, ps.last.bytes_total);
    /* an empty list: one call, 0 of 0 */
    memset(&ps, 0, sizeof ps);
    const char *none[1] = {NULL};
    seen s5 = {.m = m};
    o = options(&s5, 0);
    o.progress = progress_fn;
    o.progress_user = &ps;
    assert_int_equal(sluice_verify(m, none, 0, &o, NULL), SLUICE_OK);
    assert_int_equal(s5.calls, 0);
    assert_int_equal(ps.calls, 1);
    assert_int_equal(ps.last.tensors_total, 0);
    /* cancelled from the first callback: the last progress call says
     * how far it got */
    memset(&ps, 0, sizeof ps);
    sluice_cancel_reset(c);
    seen s6 = {.m = m, .cancel_after_first = c};
    o = options(&s6, 0);
    o.cancel = c;
    o.threads = 1;
    o.progress = progress_fn;
    o.progress_user = &ps;
    o.progress_interval_ms = 60000;
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_CANCELLED);
    assert_int_equal(ps.calls, 1);
    assert_int_equal(ps.last.tensors_done, 1);
    assert_int_equal(ps.last.tensors_total, fx.n);
    sluice_cancel_free(c);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unmake(&fx);
}

static void bad_arguments(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 3, 10);
    sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
    assert_int_equal(sluice_verify(NULL, NULL, 0, NULL, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_verify_options_init(NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, NULL), SLUICE_OK); /* defaults */
    sluice_verify_options o;
    sluice_verify_options_init(&o);
    o.flags = 0x100;
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_INVAL);
    assert_true(strstr(sluice_errmsg(m), "unknown flags"));
    sluice_verify_options_init(&o);
    o.size = 2;
    assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_E_INVAL);
    /* a newer caller's longer struct: a zero tail is fine, a set byte not */
    struct {
        sluice_verify_options o;
        uint64_t newer;
    } big;
    memset(&big, 0, sizeof big);
    sluice_verify_options_init(&big.o);
    big.o.size = sizeof big;
    assert_int_equal(sluice_verify(m, NULL, 0, &big.o, NULL), SLUICE_OK);
    big.newer = 1;
    assert_int_equal(sluice_verify(m, NULL, 0, &big.o, NULL), SLUICE_E_INVAL);
    assert_true(strstr(sluice_errmsg(m), "not zero"));
    struct sluice_verify_report r = {.size = 1};
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &r), SLUICE_E_INVAL);
    /* an older caller's shorter report: only what fits is written */
    struct sluice_verify_report small;
    memset(&small, 0xab, sizeof small);
    small.size = offsetof(struct sluice_verify_report, tensors_failed);
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &small), SLUICE_OK);
    assert_int_equal(small.tensors_ok, 3);
    assert_int_equal(small.size, offsetof(struct sluice_verify_report, tensors_failed));
    unsigned char *tail = (unsigned char *)&small.tensors_failed;
    assert_int_equal(tail[0], 0xab);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a failed open's shell */
    sluice_model *bad = NULL;
    assert_int_not_equal(sluice_open("/nonexistent/x.safetensors", NULL, &bad), SLUICE_OK);
    assert_int_equal(sluice_verify(bad, NULL, 0, NULL, NULL), SLUICE_E_INVAL);
    sluice_close(bad);
    unmake(&fx);
}

/* 256 MiB of tensors: the process's peak memory grows by far less. */
static void memory_does_not_grow_with_the_model(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *model = tu_join(dir, "model.safetensors");
    char *manifest = tu_join(dir, "model.safetensors.manifest.json");
    const char *keys[] = {"a", "b", "c", "d"};
    uint64_t sizes[] = {64u << 20, 64u << 20, 64u << 20, 64u << 20};
    mf_write_model(model, 4, keys, sizes);
    write_manifest(model, manifest, SIZE_MAX);
    tu_reset_peak_rss();
    long before = tu_status_kib("VmHWM:");
    sluice_model *m = open_model(model, SLUICE_VERIFY_DEFAULT, 0);
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &r), SLUICE_OK);
    assert_int_equal(r.bytes_hashed, 256u << 20);
    long after = tu_status_kib("VmHWM:");
    assert_int_equal(sluice_close(m), SLUICE_OK);
    if (before > 0 && after > 0) {
        fprintf(stderr, "peak RSS grew by %ld KiB verifying 256 MiB\n", after - before);
        assert_true(after - before < 32 * 1024);
    }
    tu_rmtree(dir);
    free(dir);
    free(model);
    free(manifest);
}

/* 64 threads with O_DIRECT: every thread's blocks together stay within
 * the 48 MiB sluice.h promises (fewer blocks in flight, not more memory). */
static void direct_memory_with_many_threads(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char *model = tu_join(dir, "model.safetensors");
    char *manifest = tu_join(dir, "model.safetensors.manifest.json");
    enum { N = 64 };
    const char *keys[N];
    char names[N][8];
    uint64_t sizes[N];
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "t%02zu", i);
        keys[i] = names[i];
        sizes[i] = 4u << 20;
    }
    mf_write_model(model, N, keys, sizes);
    write_manifest(model, manifest, SIZE_MAX);
    tu_reset_peak_rss();
    long before = tu_status_kib("VmHWM:");
    sluice_model *m = open_model(model, SLUICE_VERIFY_DEFAULT, SLUICE_F_DIRECT);
    sluice_verify_options o;
    sluice_verify_options_init(&o);
    o.threads = 64;
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, NULL, 0, &o, &r), SLUICE_OK);
    assert_int_equal(r.tensors_ok, N);
    assert_int_equal(r.bytes_hashed, (uint64_t)N << 22);
    long after = tu_status_kib("VmHWM:");
    assert_int_equal(sluice_close(m), SLUICE_OK);
    if (!r.bytes_direct) {
        fprintf(stderr, "note: no O_DIRECT on this file system; nothing to measure\n");
    } else if (before > 0 && after > 0) {
        /* 48 MiB of blocks, 64 x 256 KiB pread buffers, stacks, rings;
         * ThreadSanitizer's shadow of them about doubles it. (With 24
         * blocks a thread it grew by 214 MiB under AddressSanitizer.) */
#ifdef __SANITIZE_THREAD__
        long limit = 200 * 1024;
#else
        long limit = 100 * 1024;
#endif
        fprintf(stderr, "peak RSS grew by %ld KiB on 64 O_DIRECT threads\n", after - before);
        assert_true(after - before < limit);
    }
    tu_rmtree(dir);
    free(dir);
    free(model);
    free(manifest);
}

/* Whether s is valid UTF-8 (no overlong forms, no surrogates). */
static int utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = *p < 0x80 ? 1 : *p >= 0xC2 && *p <= 0xDF ? 2 : *p >= 0xE0 && *p <= 0xEF ? 3
                 : *p >= 0xF0 && *p <= 0xF4 ? 4 : 0;
        if (!n)
            return 0;
        for (size_t k = 1; k < n; k++)
            if ((p[k] & 0xC0) != 0x80)
                return 0;
        p += n;
    }
    return 1;
}

typedef struct messages {
    int all_utf8;
    size_t failed;
} messages;

static int check_message(void *user, const struct sluice_verify_item *it)
{
    messages *ms = user;
    if (it->status != SLUICE_OK) {
        ms->failed++;
        ms->all_utf8 &= utf8_ok(it->message);
    }
    return 0;
}

/* A mismatch in a model under a long path of two-byte characters: the
 * messages, cut to their size, are cut between characters, never inside
 * one (a binding decoding them as UTF-8 would fail). Paddings of 0..3
 * bytes move the cut across every position of a character. */
static void long_path_messages_stay_utf8(void **state)
{
    (void)state;
    char *top = tu_tmpdir();
    char part[256];
    size_t o = 0;
    for (int k = 0; k < 120; k++) {
        part[o++] = (char)0xC3;
        part[o++] = (char)0xA9; /* é */
    }
    part[o] = 0;
    for (int pad = 0; pad < 4; pad++) {
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/%.*s", top, pad, "xyz");
        for (int level = 0; level < 4; level++) {
            assert_true(mkdir(dir, 0755) == 0 || errno == EEXIST);
            strncat(dir, "/", sizeof dir - strlen(dir) - 1);
            strncat(dir, part, sizeof dir - strlen(dir) - 1);
        }
        assert_true(mkdir(dir, 0755) == 0 || errno == EEXIST);
        char *model = tu_join(dir, "model.safetensors");
        char *manifest = tu_join(dir, "model.safetensors.manifest.json");
        mf_write_simple(model, 3, 1000);
        write_manifest(model, manifest, SIZE_MAX);
        size_t size = 0;
        free(tu_read_file(model, &size));
        mf_flip_byte(model, size - 1); /* the last tensor's last byte */
        sluice_model *m = open_model(model, SLUICE_VERIFY_DEFAULT, 0);
        messages ms = {.all_utf8 = 1};
        sluice_verify_options vo;
        sluice_verify_options_init(&vo);
        vo.flags = SLUICE_VF_FILES;
        vo.on_item = check_message;
        vo.user = &ms;
        assert_true(sluice_verify(m, NULL, 0, &vo, NULL) < 0);
        assert_true(ms.failed >= 1);
        assert_true(ms.all_utf8);
        if (!utf8_ok(sluice_errmsg(m)))
            fail_msg("pad %d: the model's message is not UTF-8: %s", pad, sluice_errmsg(m));
        assert_int_equal(sluice_close(m), SLUICE_OK);
        free(model);
        free(manifest);
    }
    tu_rmtree(top);
    free(top);
}

typedef struct side {
    sluice_model *m;
    int rc;
    size_t delivered;
} side;

static int on_stream(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    (void)message;
    side *s = user;
    if (status == SLUICE_OK) {
        s->delivered++;
        sluice_release(t);
    }
    return 0;
}

static void *stream_thread(void *arg)
{
    side *s = arg;
    s->rc = sluice_stream(s->m, NULL, 0, on_stream, s);
    return NULL;
}

/* A verify, a stream and another verify at once on one model. */
static void beside_a_stream(void **state)
{
    (void)state;
    fixture fx;
    make(&fx, 50, 20000);
    sluice_model *m = open_model(fx.model, SLUICE_VERIFY_DEFAULT, 0);
    side s = {.m = m};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stream_thread, &s), 0);
    for (int k = 0; k < 3; k++) {
        seen v = {.m = m};
        sluice_verify_options o = options(&v, SLUICE_VF_FILES);
        assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_OK);
        assert_int_equal(v.ok, fx.n + 1);
    }
    pthread_join(t, NULL);
    assert_int_equal(s.rc, SLUICE_OK);
    assert_int_equal(s.delivered, fx.n);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unmake(&fx);
}

/* Every real file: the digest of every tensor equals an independent one. */
static void real_files(void **state)
{
    (void)state;
    const char *real = tu_real_data();
    if (!real)
        skip();
    char **files = NULL;
    size_t nf = tu_list_safetensors(real, &files);
    for (size_t f = 0; f < nf; f++) {
        sluice_model *m = open_model(files[f], SLUICE_VERIFY_OFF, 0);
        seen s = {.m = m};
        sluice_verify_options o = options(&s, SLUICE_VF_DIGEST_ONLY);
        assert_int_equal(sluice_verify(m, NULL, 0, &o, NULL), SLUICE_OK);
        assert_int_equal(s.checked_digests, sluice_count(m));
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    tu_free_list(files, nf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_tensor_matches),
        cmocka_unit_test(flipped_byte_fails_its_tensor_and_file),
        cmocka_unit_test(files_and_subsets),
        cmocka_unit_test(digests_without_a_manifest),
        cmocka_unit_test(file_cut_after_open),
        cmocka_unit_test(direct_reads),
        cmocka_unit_test(cancel_stop_progress),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(memory_does_not_grow_with_the_model),
        cmocka_unit_test(direct_memory_with_many_threads),
        cmocka_unit_test(long_path_messages_stay_utf8),
        cmocka_unit_test(beside_a_stream),
        cmocka_unit_test(real_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
