/* test_remote.c: models read over HTTP from a real nginx started by the
 * test (remote_fixture.h), and mirrors (opts.fallback) that take over a
 * tensor whose local copy is corrupt or cut.
 *
 * Every check compares with the bytes of the local file the server
 * serves (read with pread, independently of sluice). Skipped (77, with
 * the reason) when nginx is not installed or does not start. */
#include "remote_fixture.h"
#include "util.h"

#include "sluice.h"

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/tcp.h>

#include <cmocka.h>

static rf_server nginx;
static char *root;          /* served at / */

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *at(const char *fmt, ...)
{
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ & 3];
    int n = snprintf(b, 1024, "%s/", nginx.base);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, 1024 - (size_t)n, fmt, ap);
    va_end(ap);
    return b;
}

/* ---------------------------------------------------------------- models */

#define MIB (1u << 20)

/* one.safetensors: tensors of every size class (empty, tiny, several
 * chunks of 1 MiB). */
static const char *const one_names[] = {"a", "b", "c", "d", "e", "f"};
static const uint64_t one_sizes[] = {100, 3 * MIB + 17, 0, 7, 5 * MIB + 3, 4096};
#define ONE_N 6

static void write_model(const char *path, size_t n, const char *const *names,
                        const uint64_t *sizes, const char *prefix)
{
    char header[8192];
    size_t len = 0;
    uint64_t off = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s%s\":{\"dtype\":\"U8\",\"shape\":[%llu],"
                                "\"data_offsets\":[%llu,%llu]}",
                                i ? "," : "", prefix, names[i], (unsigned long long)sizes[i],
                                (unsigned long long)off, (unsigned long long)(off + sizes[i]));
        off += sizes[i];
    }
    snprintf(header + len, sizeof header - len, "}");
    tu_write_safetensors(path, header, NULL, (size_t)off);
}

/* The flat manifest of the model at path (every tensor's SHA-256),
 * written to out. */
static void write_manifest(const char *path, const char *out)
{
    sluice_options o;
    sluice_options_init(&o);
    o.flags = SLUICE_F_HASH_ALL;
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    size_t n = sluice_count(m), cap = 64 + n * 200, len = 0;
    char *text = malloc(cap);
    len += (size_t)snprintf(text, cap, "{");
    for (size_t i = 0; i < n; i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        uint8_t d[32];
        char hex[65];
        assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
        len += (size_t)snprintf(text + len, cap - len, "%s\"%s\":\"%s\"", i ? "," : "",
                                sluice_tensor_info(t)->name, sluice_digest_hex(d, hex));
        sluice_release(t);
    }
    len += (size_t)snprintf(text + len, cap - len, "}");
    tu_write_file(out, text, len);
    free(text);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void flip_byte(const char *path, uint64_t offset)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, (off_t)offset), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)offset), 1);
    close(fd);
}

/* The absolute offset of tensor name in the local model at path. */
static uint64_t tensor_offset(const char *path, const char *name)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, name, &ti), SLUICE_OK);
    uint64_t off = ti.offset;
    sluice_close(m);
    return off;
}

static int setup(void **state)
{
    char why[256];
    rf_skip_without_curl();
    root = tu_tmpdir();
    chmod(root, 0755);
    char *p = tu_join(root, "one.safetensors");
    write_model(p, ONE_N, one_names, one_sizes, "");
    char *mf = tu_join(root, "one.safetensors.manifest.json");
    write_manifest(p, mf);
    free(mf);
    free(p);
    /* a sharded model in sh/, with its manifest */
    char *sh = tu_join(root, "sh");
    mkdir(sh, 0755);
    static const char *const n1[] = {"x", "y"}, *const n2[] = {"z", "w", "v"};
    static const uint64_t s1[] = {2 * MIB, 10}, s2[] = {33, MIB + 1, 0};
    char *f1 = tu_join(sh, "model-00001-of-00002.safetensors");
    char *f2 = tu_join(sh, "model-00002-of-00002.safetensors");
    write_model(f1, 2, n1, s1, "l1.");
    write_model(f2, 3, n2, s2, "l2.");
    const char *idx = "{\"metadata\":{},\"weight_map\":{"
                      "\"l1.x\":\"model-00001-of-00002.safetensors\","
                      "\"l1.y\":\"model-00001-of-00002.safetensors\","
                      "\"l2.z\":\"model-00002-of-00002.safetensors\","
                      "\"l2.w\":\"model-00002-of-00002.safetensors\","
                      "\"l2.v\":\"model-00002-of-00002.safetensors\"}}";
    char *ip = tu_join(sh, "model.safetensors.index.json");
    tu_write_file(ip, idx, strlen(idx));
    char *smf = tu_join(sh, "sluice.manifest.json");
    write_manifest(ip, smf);
    free(smf);
    free(ip);
    free(f1);
    free(f2);
    free(sh);
    if (!rf_nginx_start(&nginx, root, tu_real_data(), why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        tu_rmtree(root);
        free(root);
        exit(77);
    }
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    rf_stop(&nginx);
    tu_rmtree(root);
    free(root);
    (void)state;
    return 0;
}

/* ---------------------------------------------------------------- checks */

static sluice_model *open_ok(const char *loc, const sluice_options *o)
{
    sluice_model *m = NULL;
    int rc = sluice_open(loc, o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s: %s", loc, sluice_strerror(rc), sluice_errmsg(m));
    return m;
}

/* Every tensor of remote equals local's: info and bytes (through acquire,
 * and once more through a stream). */
static int same_bytes_cb(void *user, sluice_tensor *t, int status,
                         const struct sluice_tensor_info *info, const char *message)
{
    sluice_model *local = user;
    const char *name = info->name;
    if (status != SLUICE_OK)
        fail_msg("stream %s: %s: %s", name, sluice_strerror(status), message);
    sluice_tensor *lt;
    assert_int_equal(sluice_acquire(local, name, &lt), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(t), sluice_tensor_size(lt));
    assert_memory_equal(sluice_tensor_data(t), sluice_tensor_data(lt), sluice_tensor_size(t));
    sluice_release(lt);
    sluice_release(t);
    return 0;
}

static void compare_models(sluice_model *local, sluice_model *remote)
{
    size_t n = sluice_count(local);
    assert_int_equal(sluice_count(remote), n);
    assert_int_equal(sluice_file_count(remote), sluice_file_count(local));
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info a = SLUICE_TENSOR_INFO_INIT, b = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(local, i, &a), SLUICE_OK);
        assert_int_equal(sluice_info(remote, i, &b), SLUICE_OK);
        assert_int_equal(a.name_len, b.name_len);
        assert_memory_equal(a.name, b.name, a.name_len);
        assert_int_equal(a.dtype, b.dtype);
        assert_int_equal(a.ndim, b.ndim);
        if (a.ndim)
            assert_memory_equal(a.shape, b.shape, a.ndim * sizeof *a.shape);
        assert_int_equal(a.offset, b.offset);
        assert_int_equal(a.nbytes, b.nbytes);
        sluice_tensor *ta, *tb;
        assert_int_equal(sluice_acquire_index(local, i, &ta), SLUICE_OK);
        int rc = sluice_acquire_index(remote, i, &tb);
        if (rc != SLUICE_OK)
            fail_msg("acquire %s: %s: %s", a.name, sluice_strerror(rc), sluice_errmsg(remote));
        assert_memory_equal(sluice_tensor_data(ta), sluice_tensor_data(tb), a.nbytes);
        sluice_release(ta);
        sluice_release(tb);
    }
    for (size_t f = 0; f < sluice_file_count(local); f++) {
        struct sluice_file_info a = {.size = sizeof a}, b = {.size = sizeof b};
        assert_int_equal(sluice_file_info(local, f, &a), SLUICE_OK);
        assert_int_equal(sluice_file_info(remote, f, &b), SLUICE_OK);
        assert_int_equal(a.file_size, b.file_size);
        assert_int_equal(a.header_bytes, b.header_bytes);
        assert_int_equal(a.metadata_count, b.metadata_count);
    }
    sluice_trim(remote, NULL);
    assert_int_equal(sluice_stream(remote, NULL, 0, same_bytes_cb, local), SLUICE_OK);
}

static void compare_at(const char *local_path, const char *remote_loc, uint64_t chunk)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    o.pool_bytes = 64u * MIB;
    sluice_model *l = open_ok(local_path, &o);
    if (chunk)
        o.chunk_bytes = chunk;
    o.verify = SLUICE_VERIFY_DEFAULT;
    sluice_model *r = open_ok(remote_loc, &o);
    compare_models(l, r);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(r, &st), SLUICE_OK);
    assert_true(st.remote_reads > 0 || st.bytes_delivered == 0);
    assert_int_equal(st.failures, 0);
    assert_int_equal(sluice_close(r), SLUICE_OK);
    assert_int_equal(sluice_close(l), SLUICE_OK);
}

/* ---------------------------------------------------------------- tests */

static void test_file_url(void **state)
{
    char *p = tu_join(root, "one.safetensors");
    compare_at(p, at("one.safetensors"), MIB);
    /* the sidecar was found beside it: every tensor verified */
    sluice_model *m = open_ok(at("one.safetensors"), NULL);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), at("one.safetensors.manifest.json"));
    for (size_t i = 0; i < sluice_count(m); i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        sluice_release(t);
    }
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.tensors_verified, ONE_N - 1);  /* the empty one is never loaded */
    assert_int_equal(st.remote_bytes, st.bytes_read);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(p);
    (void)state;
}

/* sluice_read_into, sluice_acquire_range and sluice_digest_range on a
 * remote model give the bytes (and digests) of the same model read
 * locally: a remote file has no descriptor to pread. */
static void test_ranges(void **state)
{
    char *p = tu_join(root, "one.safetensors");
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *l = open_ok(p, &o);
    sluice_model *r = open_ok(at("one.safetensors"), &o);
    assert_int_equal(sluice_verify_mode(r), SLUICE_VERIFY_REQUIRE);
    for (size_t i = 0; i < sluice_count(l); i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(l, i, &ti), SLUICE_OK);
        uint64_t begin = ti.nbytes / 3, len = ti.nbytes / 2;
        unsigned char *a = malloc(len + 1), *b = malloc(len + 1);
        assert_int_equal(sluice_read_into(l, ti.name, begin, a, len), SLUICE_OK);
        int rc = sluice_read_into(r, ti.name, begin, b, len);
        if (rc != SLUICE_OK)
            fail_msg("read_into %s: %s: %s", ti.name, sluice_strerror(rc), sluice_errmsg(r));
        assert_memory_equal(a, b, len);
        sluice_tensor *t = NULL;
        rc = sluice_acquire_range(r, ti.name, begin, begin + len, &t);
        if (rc != SLUICE_OK)
            fail_msg("acquire_range %s: %s: %s", ti.name, sluice_strerror(rc),
                     sluice_errmsg(r));
        assert_int_equal(sluice_tensor_size(t), len);
        if (len)
            assert_memory_equal(sluice_tensor_data(t), a, len);
        sluice_release(t);
        uint8_t da[32], db[32];
        assert_int_equal(sluice_digest_range(l, i, begin, begin + len, da), SLUICE_OK);
        rc = sluice_digest_range(r, i, begin, begin + len, db);
        if (rc != SLUICE_OK)
            fail_msg("digest_range %s: %s: %s", ti.name, sluice_strerror(rc), sluice_errmsg(r));
        assert_memory_equal(da, db, 32);
        free(a);
        free(b);
    }
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(r, &st), SLUICE_OK);
    assert_int_equal(st.failures, 0);
    /* the range requests are counted as the loads' are */
    assert_true(st.remote_reads > 0);
    assert_true(st.bytes_read > 0);
    assert_int_equal(st.remote_bytes, st.bytes_read);
    assert_int_equal(sluice_close(r), SLUICE_OK);
    assert_int_equal(sluice_close(l), SLUICE_OK);
    free(p);
    (void)state;
}

/* Range reads of a remote model on several threads at once, beside
 * loads of the same tensors (this program runs under TSan too). */
typedef struct range_job {
    sluice_model *m;
    const unsigned char *good[2];   /* b, e as the file holds them */
    unsigned seed;
    int bad;
} range_job;

static void *range_worker(void *arg)
{
    range_job *j = arg;
    static const char *const name[2] = {"b", "e"};
    static const uint64_t size[2] = {3 * MIB + 17, 5 * MIB + 3};
    for (int it = 0; it < 12; it++) {
        int k = (int)(rand_r(&j->seed) % 2);
        uint64_t begin = rand_r(&j->seed) % size[k];
        uint64_t len = rand_r(&j->seed) % (size[k] - begin + 1) % (MIB + 5);
        unsigned char *d = malloc(len + 1);
        if (sluice_read_into(j->m, name[k], begin, d, len) != SLUICE_OK ||
            memcmp(d, j->good[k] + begin, len) != 0)
            j->bad++;
        free(d);
        sluice_tensor *t;
        if (it % 3 == 0 && sluice_acquire(j->m, name[k], &t) == SLUICE_OK) {
            if (memcmp(sluice_tensor_data(t), j->good[k], size[k]) != 0)
                j->bad++;
            sluice_release(t);
        }
    }
    return NULL;
}

/* Blocking reads of a remote model (sluice_read_into here; a verify's
 * pieces alike) keep their connection for the next one: ten reads on one
 * thread, one after the other, come over one connection (the model's
 * idle transfer handles), not ten (before: a new connection, and over
 * https a new TLS handshake, for each). */
static void test_blocking_reads_reuse_connections(void **state)
{
    (void)state;
    sluice_model *m = open_ok(at("one.safetensors"), NULL);
    size_t from = rf_requests(&nginx);
    unsigned char few[4096];
    for (int k = 0; k < 10; k++)
        assert_int_equal(sluice_read_into(m, "b", 0, few, sizeof few), SLUICE_OK);
    assert_true(rf_requests(&nginx) >= from + 9);   /* the last may not be logged yet */
    size_t conns = rf_connections(&nginx, from);
    if (conns > 2)
        fail_msg("10 blocking reads on one thread took %zu connections", conns);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}


/* The bytes acknowledged so far on the TCP socket fd (shared by a parent
 * and its forked child: one kernel socket). */
static uint64_t acked(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return UINT64_MAX;
    return ti.tcpi_bytes_acked;
}

/* A forked child's blocking reads never go over the connections its
 * parent's model keeps (one kernel socket for both processes: their
 * requests and replies would interleave, and fail, as they did, a
 * Content-Range of the other's request or "HTTP/0.9"): the child opens
 * its own. Checked on the parent's sockets to nginx, which the parent
 * leaves idle while the child reads: none moves a byte. */
static void test_blocking_reads_after_fork(void **state)
{
    (void)state;
    sluice_model *m = open_ok(at("one.safetensors"), NULL);
    unsigned char few[64];
    assert_int_equal(sluice_read_into(m, "b", 0, few, sizeof few), SLUICE_OK);
    int fds[64];
    size_t nfd = 0;
    for (int fd = 0; fd < 1024 && nfd < 64; fd++) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0 && peer.sin_family == AF_INET &&
            ntohs(peer.sin_port) == nginx.port)
            fds[nfd++] = fd;
    }
    assert_true(nfd > 0);   /* the model keeps the read's connection */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint64_t before[64];
        for (size_t i = 0; i < nfd; i++)
            before[i] = acked(fds[i]);
        int bad = 0;
        for (int k = 0; k < 5; k++)
            bad |= sluice_read_into(m, "b", 0, few, sizeof few) != SLUICE_OK;
        for (size_t i = 0; i < nfd; i++)
            if (acked(fds[i]) != before[i])
                bad |= 2;
        _exit(bad);     /* the model is the parent's to close */
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) & 2)
        fail_msg("the child's reads went over a connection of its parent's model");
    assert_int_equal(WEXITSTATUS(st), 0);
    /* the parent's connection is still its own */
    assert_int_equal(sluice_read_into(m, "b", 0, few, sizeof few), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void test_ranges_threads(void **state)
{
    char *p = tu_join(root, "one.safetensors");
    unsigned char *gb = tu_pread_range(p, tensor_offset(p, "b"), 3 * MIB + 17);
    unsigned char *ge = tu_pread_range(p, tensor_offset(p, "e"), 5 * MIB + 3);
    sluice_options o;
    sluice_options_init(&o);
    o.pool_bytes = 16u * MIB;
    o.chunk_bytes = MIB;
    sluice_model *m = open_ok(at("one.safetensors"), &o);
    range_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (range_job){.m = m, .good = {gb, ge}, .seed = 17u * (unsigned)i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, range_worker, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].bad, 0);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(gb);
    free(ge);
    free(p);
    (void)state;
}

static void test_sharded_urls(void **state)
{
    char *sh = tu_join(root, "sh"), *ip = tu_join(sh, "model.safetensors.index.json");
    compare_at(ip, at("sh/model.safetensors.index.json"), 0);
    compare_at(ip, at("sh"), 256u << 10);
    compare_at(ip, at("sh/"), 0);
    sluice_model *m = open_ok(at("sh/"), NULL);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), at("sh/sluice.manifest.json"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(ip);
    free(sh);
    (void)state;
}

static void test_real_files(void **state)
{
    const char *real = tu_real_data();
    if (!real) {
        skip();
        return;
    }
    char **files;
    size_t n = tu_list_safetensors(real, &files);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        const char *name = strrchr(files[i], '/') + 1;
        compare_at(files[i], at("real/%s", name), 0);
    }
    tu_free_list(files, n);
    char *sh = tu_join(real, "SafeTensors.jl__sharded");
    char *ip = tu_join(sh, "model.safetensors.index.json");
    compare_at(ip, at("real/SafeTensors.jl__sharded/model.safetensors.index.json"), 0);
    compare_at(ip, at("real/SafeTensors.jl__sharded/"), 0);
    free(ip);
    free(sh);
    (void)state;
}

static void test_manifest_url(void **state)
{
    /* a local model, its manifest given as a URL */
    char *p = tu_join(root, "one.safetensors");
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = at("one.safetensors.manifest.json");
    sluice_model *m = open_ok(p, &o);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a manifest URL that is not there */
    o.manifest_path = at("nothing.manifest.json");
    assert_int_equal(sluice_open(p, &o, &m), SLUICE_E_MANIFEST);
    assert_non_null(strstr(sluice_errmsg(m), "404"));
    sluice_close(m);
    /* REQUIRE with no sidecar at a remote place */
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_REQUIRE;
    char *q = tu_join(root, "nomf.safetensors");
    tu_copy_file(p, q);
    assert_int_equal(sluice_open(at("nomf.safetensors"), &o, &m), SLUICE_E_MANIFEST);
    sluice_close(m);
    /* DEFAULT with none: nothing verified */
    m = open_ok(at("nomf.safetensors"), NULL);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    sluice_close(m);
    unlink(q);
    free(q);
    free(p);
    (void)state;
}

static void test_missing_and_norange(void **state)
{
    sluice_model *m;
    assert_int_equal(sluice_open(at("absent.safetensors"), NULL, &m), SLUICE_E_NO_FILES);
    assert_non_null(strstr(sluice_errmsg(m), "404"));
    sluice_close(m);
    assert_int_equal(sluice_open(at("absent-dir/"), NULL, &m), SLUICE_E_NO_FILES);
    sluice_close(m);
    /* nginx with max_ranges 0 answers 200 and the whole file */
    assert_int_equal(sluice_open(at("norange/one.safetensors"), NULL, &m), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "ignores Range"));
    sluice_close(m);
    /* nothing listens there */
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 2;
    o.remote_backoff_ms = 1;
    char dead[128];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%u/x.safetensors", rf_free_port());
    assert_int_equal(sluice_open(dead, &o, &m), SLUICE_E_REMOTE);
    assert_non_null(strstr(sluice_errmsg(m), "after 2 attempts"));
    sluice_close(m);
    (void)state;
}

static void test_checksum_and_changed(void **state)
{
    char *p = tu_join(root, "one.safetensors"), *q = tu_join(root, "bad.safetensors");
    char *qm = tu_join(root, "bad.safetensors.manifest.json");
    char *pm = tu_join(root, "one.safetensors.manifest.json");
    tu_copy_file(p, q);
    tu_copy_file(pm, qm);
    free(pm);
    flip_byte(q, tensor_offset(q, "b") + 12345);
    sluice_model *m = open_ok(at("bad.safetensors"), NULL);
    sluice_tensor *t;
    /* b first: not the plan's first position, so nothing is read ahead */
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "SHA-256 mismatch"));
    unsigned char few[8];
    assert_int_equal(sluice_read_into(m, "b", 0, few, sizeof few), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "SHA-256 mismatch"));
    /* the object grows after open: every later read fails, none misplaced */
    size_t len;
    unsigned char *bytes = tu_read_file(q, &len);
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, bytes, len);
    longer[len] = 0;
    tu_write_file(q, longer, len + 1);
    assert_int_equal(sluice_acquire(m, "e", &t), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "changed after open"));
    assert_int_equal(sluice_read_into(m, "f", 0, few, sizeof few), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "changed after open"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* replaced by another object of the same size (nginx's ETag is mtime
     * and size: the mtime moves on): If-Match answers 412 */
    tu_write_file(q, bytes, len);
    m = open_ok(at("bad.safetensors"), NULL);
    bytes[len - 1] ^= 1;
    tu_write_file(q, bytes, len);
    struct timeval later[2] = {{time(NULL) + 100, 0}, {time(NULL) + 100, 0}};
    assert_int_equal(utimes(q, later), 0);
    assert_int_equal(sluice_acquire(m, "f", &t), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "HTTP 412: the object changed after open"));
    assert_int_equal(sluice_read_into(m, "a", 0, few, sizeof few), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "HTTP 412: the object changed after open"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(longer);
    free(bytes);
    unlink(q);
    unlink(qm);
    free(q);
    free(qm);
    free(p);
    (void)state;
}

/* sluice_read_into, sluice_acquire_range and sluice_digest_range on a
 * remote model read with range GETs (the file has no descriptor), chunk
 * by chunk against a chunked version 2 manifest written by the CLI; a
 * flipped byte fails the ranges that cover its chunk only. */
static void test_ranges_of_a_remote_model(void **state)
{
    char *p = tu_join(root, "one.safetensors"), *q = tu_join(root, "rng.safetensors");
    char *mf = tu_join(root, "rng.chunked.json");
    tu_copy_file(p, q);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s/sluice' manifest '%s' --chunk 1M -q -o '%s'", SLUICE_BINARY_DIR,
             q, mf);
    assert_int_equal(system(cmd), 0);
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = mf;
    sluice_model *m = open_ok(at("rng.safetensors"), &o);
    uint64_t cb = 0;
    uint32_t cn = 0;
    assert_int_equal(sluice_manifest_chunks(m, 1, &cb, &cn), SLUICE_OK); /* b: 3 MiB + 17 */
    assert_int_equal(cb, MIB);
    assert_int_equal(cn, 4);
    uint64_t off_b = tensor_offset(q, "b"), off_e = tensor_offset(q, "e");
    unsigned char *want = tu_pread_range(q, off_b + MIB + 5, MIB + 95);
    unsigned char *buf = malloc(5 * MIB + 4);
    assert_non_null(buf);
    int rc = sluice_read_into(m, "b", MIB + 5, buf + 1, MIB + 95);
    if (rc != SLUICE_OK)
        fail_msg("read_into over http: %s", sluice_errmsg(m));
    assert_memory_equal(buf + 1, want, MIB + 95);
    free(want);
    want = tu_pread_range(q, off_e, 5 * MIB + 3);
    assert_int_equal(sluice_read_into(m, "e", 0, buf, 5 * MIB + 3), SLUICE_OK);
    assert_memory_equal(buf, want, 5 * MIB + 3);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_range(m, "e", 10, 20, &t), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(t), want + 10, 10);
    sluice_release(t);
    free(want);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_true(st.chunks_verified >= 2 + 6);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* one byte of chunk 0 of b flipped on the server */
    flip_byte(q, off_b + 12345);
    m = open_ok(at("rng.safetensors"), &o);
    assert_int_equal(sluice_read_into(m, "b", 2 * MIB, buf, 100), SLUICE_OK);
    assert_int_equal(sluice_read_into(m, "b", 0, buf, 100), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "chunk 0 of 4"));
    uint8_t d[32], d2[32];
    assert_int_equal(sluice_digest_range(m, 1, 0, MIB, d), SLUICE_OK); /* the bytes as they are */
    unsigned char *now = tu_pread_range(q, off_b, MIB);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *l = open_ok(q, &o);
    assert_int_equal(sluice_digest_range(l, 1, 0, MIB, d2), SLUICE_OK);
    assert_memory_equal(d, d2, 32);
    assert_int_equal(sluice_close(l), SLUICE_OK);
    free(now);
    free(buf);
    unlink(q);
    unlink(mf);
    free(p);
    free(q);
    free(mf);
    (void)state;
}

/* ---------------------------------------------------------------- fallback */

/* A local copy in a fresh folder (with the manifest of the good model). */
static char *local_copy(char **model)
{
    char *d = tu_tmpdir();
    char *p = tu_join(root, "one.safetensors"), *pm = tu_join(root, "one.safetensors.manifest.json");
    *model = tu_join(d, "one.safetensors");
    char *qm = tu_join(d, "one.safetensors.manifest.json");
    tu_copy_file(p, *model);
    tu_copy_file(pm, qm);
    free(p);
    free(pm);
    free(qm);
    return d;
}

static void acquire_all_ok(sluice_model *m)
{
    for (size_t i = 0; i < sluice_count(m); i++) {
        sluice_tensor *t;
        int rc = sluice_acquire_index(m, i, &t);
        if (rc != SLUICE_OK)
            fail_msg("acquire %zu: %s: %s", i, sluice_strerror(rc), sluice_errmsg(m));
        sluice_release(t);
    }
}

static void test_fallback_corrupt_local(void **state)
{
    char *model, *d = local_copy(&model);
    flip_byte(model, tensor_offset(model, "e") + 3 * MIB);
    const char *mirrors[] = {at("one.safetensors")};
    sluice_options o;
    sluice_options_init(&o);
    o.fallback = mirrors;
    o.fallback_count = 1;
    o.chunk_bytes = MIB;
    sluice_model *m = open_ok(model, &o);
    acquire_all_ok(m);
    /* the bytes are the good ones */
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "e", &t), SLUICE_OK);
    char *p = tu_join(root, "one.safetensors");
    void *good = tu_pread_range(p, tensor_offset(p, "e"), 5 * MIB + 3);
    assert_memory_equal(sluice_tensor_data(t), good, 5 * MIB + 3);
    const char *src = sluice_tensor_source(t);
    assert_non_null(strstr(src, "fallback 1"));
    assert_non_null(strstr(src, "SHA-256 mismatch"));
    sluice_release(t);
    /* a range over the flipped byte comes from the mirror too, verified */
    unsigned char *r = malloc(MIB);
    int rc = sluice_read_into(m, "e", 3 * MIB - 100, r, MIB);
    if (rc != SLUICE_OK)
        fail_msg("read_into e: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    assert_memory_equal(r, (unsigned char *)good + 3 * MIB - 100, MIB);
    free(r);
    assert_int_equal(sluice_acquire_range(m, "e", 3 * MIB, 3 * MIB + 8, &t), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(t), (unsigned char *)good + 3 * MIB, 8);
    sluice_release(t);
    assert_int_equal(sluice_acquire(m, "a", &t), SLUICE_OK);
    assert_string_equal(sluice_tensor_source(t), "");
    sluice_release(t);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.fallback_tensors, 1);
    assert_int_equal(st.fallback_bytes, 5 * MIB + 3);
    assert_int_equal(st.failures, 0);
    assert_int_equal(st.checksum_failures, 3);   /* the load, then each range */
    assert_int_equal(st.tensors_verified, ONE_N - 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(good);
    free(p);
    tu_rmtree(d);
    free(d);
    free(model);
    (void)state;
}

/* A mirror whose tensor has the same name, dtype, rank, size and bytes but
 * another shape is not used: neither by a load nor by a range. */
static void test_fallback_other_shape(void **state)
{
    char *d = tu_tmpdir(), *e = tu_tmpdir();
    char *p = tu_join(d, "two.safetensors"), *pm = tu_join(d, "two.safetensors.manifest.json");
    char *q = tu_join(e, "two.safetensors");
    tu_write_safetensors(p, "{\"x\":{\"dtype\":\"U8\",\"shape\":[64,64],"
                            "\"data_offsets\":[0,4096]}}", NULL, 4096);
    tu_write_safetensors(q, "{\"x\":{\"dtype\":\"U8\",\"shape\":[32,128],"
                            "\"data_offsets\":[0,4096]}}", NULL, 4096);
    write_manifest(p, pm);
    flip_byte(p, tensor_offset(p, "x") + 100);
    const char *mirrors[] = {q};
    sluice_options o;
    sluice_options_init(&o);
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m = open_ok(p, &o);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "x", &t), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "not the same"));
    unsigned char buf[16];
    assert_int_equal(sluice_read_into(m, "x", 0, buf, sizeof buf), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "same dtype, shape and size"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(d);
    tu_rmtree(e);
    free(d);
    free(e);
    free(p);
    free(pm);
    free(q);
    (void)state;
}

static void test_fallback_truncated_after_open(void **state)
{
    char *model, *d = local_copy(&model);
    const char *mirrors[] = {at("sh"), at("one.safetensors")}; /* the first lacks the tensors */
    sluice_options o;
    sluice_options_init(&o);
    o.fallback = mirrors;
    o.fallback_count = 2;
    sluice_model *m = open_ok(model, &o);
    assert_int_equal(truncate(model, (off_t)tensor_offset(model, "b") + 10), 0);
    acquire_all_ok(m);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "e", &t), SLUICE_OK);
    const char *src = sluice_tensor_source(t);
    assert_non_null(strstr(src, "fallback 2"));
    assert_non_null(strstr(src, "no tensor \"e\" there"));
    sluice_release(t);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.fallback_tensors, 4);   /* b, d, e, f: past the cut */
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(d);
    free(d);
    free(model);
    (void)state;
}

static void test_fallback_all_fail(void **state)
{
    char *model, *d = local_copy(&model);
    flip_byte(model, tensor_offset(model, "b") + 1);
    /* a local mirror, corrupt in the same tensor */
    char *d2 = tu_tmpdir(), *m2 = tu_join(d2, "one.safetensors");
    tu_copy_file(model, m2);
    const char *mirrors[] = {d2, at("nowhere/")};
    sluice_options o;
    sluice_options_init(&o);
    o.fallback = mirrors;
    o.fallback_count = 2;
    sluice_model *m = open_ok(model, &o);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_E_CHECKSUM);
    const char *msg = sluice_errmsg(m);
    assert_non_null(strstr(msg, "every source failed"));
    assert_non_null(strstr(msg, "primary: "));
    assert_non_null(strstr(msg, "fallback 1 ("));
    assert_non_null(strstr(msg, "fallback 2 ("));
    assert_non_null(strstr(msg, m2));   /* the mirror's failure names the mirror's file */
    assert_non_null(strstr(msg, "neither model.safetensors.index.json nor"));
    assert_int_equal(sluice_acquire(m, "a", &t), SLUICE_OK);
    sluice_release(t);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.fallback_tensors, 0);
    assert_int_equal(st.failures, 1);
    assert_int_equal(st.fallback_failures, 2);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a range: the same sources, in order, and a mirror's credentials
     * never in the message */
    char secret[256];
    snprintf(secret, sizeof secret, "http://user:s3cr3t@%s/nowhere2/?sig=t0p",
             nginx.base + strlen("http://"));
    const char *mirrors3[] = {d2, at("nowhere/"), secret};
    o.fallback = mirrors3;
    o.fallback_count = 3;
    m = open_ok(model, &o);
    unsigned char few[4];
    assert_int_equal(sluice_read_into(m, "b", 0, few, sizeof few), SLUICE_E_CHECKSUM);
    msg = sluice_errmsg(m);
    assert_non_null(strstr(msg, "every source failed: primary: "));
    assert_non_null(strstr(msg, "; fallback 1 ("));
    assert_non_null(strstr(msg, m2));
    assert_non_null(strstr(msg, "; fallback 2 ("));
    assert_non_null(strstr(msg, "; fallback 3 ("));
    assert_null(strstr(msg, "s3cr3t"));
    assert_null(strstr(msg, "t0p"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(d2);
    free(d2);
    free(m2);
    tu_rmtree(d);
    free(d);
    free(model);
    (void)state;
}

static void test_fallback_needs_manifest(void **state)
{
    char *model, *d = local_copy(&model);
    const char *mirrors[] = {at("one.safetensors")};
    sluice_options o;
    sluice_options_init(&o);
    o.fallback = mirrors;
    o.fallback_count = 1;
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m;
    assert_int_equal(sluice_open(model, &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "need a manifest"));
    sluice_close(m);
    char *mf = tu_join(d, "one.safetensors.manifest.json");
    unlink(mf);
    o.verify = SLUICE_VERIFY_DEFAULT;
    assert_int_equal(sluice_open(model, &o, &m), SLUICE_E_INVAL);
    sluice_close(m);
    free(mf);
    tu_rmtree(d);
    free(d);
    free(model);
    (void)state;
}

/* A remote primary whose object is corrupt, a local mirror that is not. */
static void test_fallback_remote_primary(void **state)
{
    char *p = tu_join(root, "one.safetensors"), *q = tu_join(root, "rp.safetensors");
    char *qm = tu_join(root, "rp.safetensors.manifest.json");
    char *pm = tu_join(root, "one.safetensors.manifest.json");
    tu_copy_file(p, q);
    tu_copy_file(pm, qm);
    flip_byte(q, tensor_offset(q, "a") + 50);
    const char *mirrors[] = {p};
    sluice_options o;
    sluice_options_init(&o);
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m = open_ok(at("rp.safetensors"), &o);
    acquire_all_ok(m);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.fallback_tensors, 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* sluice_verify judges the model's own bytes and never reads the
     * mirrors: a tensor only a mirror had right fails with its own
     * checksum message */
    m = open_ok(at("rp.safetensors"), &o);
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &r), SLUICE_E_CHECKSUM);
    assert_int_equal(r.tensors_ok, ONE_N - 1);
    assert_int_equal(r.tensors_failed, 1);
    assert_non_null(strstr(sluice_errmsg(m), "tensor \"a\""));
    assert_non_null(strstr(sluice_errmsg(m), "SHA-256 mismatch"));
    assert_null(strstr(sluice_errmsg(m), "fallback"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(q);
    unlink(qm);
    free(p);
    free(q);
    free(qm);
    free(pm);
    (void)state;
}

/* Trusted keys with a remote manifest fail closed: its signature is not
 * fetched, and a local file that happens to sit at the URL read as a
 * relative path (./http:/HOST:PORT/....sig) is not taken for it. */
static void test_signed_remote_manifest(void **state)
{
    char *k = tu_tmpdir(), *c = tu_tmpdir(), cmd[4096], old_cwd[4096];
    char *mf = tu_join(root, "one.safetensors.manifest.json");
    snprintf(cmd, sizeof cmd, "%s/sluice keygen --out %s/p >/dev/null && %s/sluice sign %s "
             "--key %s/p.key -o %s/one.sig >/dev/null && mkdir -p '%s/%s' && cp %s/one.sig "
             "'%s/%s/one.safetensors.manifest.json.sig'", SLUICE_BINARY_DIR, k,
             SLUICE_BINARY_DIR, mf, k, k, c, nginx.base, k, c, nginx.base);
    assert_int_equal(system(cmd), 0);
    char *pub = tu_join(k, "p.pub");
    const char *keys[] = {pub};
    sluice_options o;
    sluice_options_init(&o);
    o.trusted_keys = keys;
    o.ntrusted_keys = 1;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(at("one.safetensors"), &o, &m), SLUICE_E_SIGNATURE);
    sluice_close(m);
    m = NULL;
    assert_non_null(getcwd(old_cwd, sizeof old_cwd));
    assert_int_equal(chdir(c), 0);
    int rc = sluice_open(at("one.safetensors"), &o, &m);
    assert_int_equal(chdir(old_cwd), 0);
    if (rc != SLUICE_E_SIGNATURE)
        fail_msg("trusted keys, remote manifest, a .sig at ./%s/...: %s", nginx.base,
                 sluice_strerror(rc));
    assert_non_null(strstr(sluice_errmsg(m), "remote"));
    sluice_close(m);
    tu_rmtree(k);
    tu_rmtree(c);
    free(k);
    free(c);
    free(mf);
    free(pub);
    (void)state;
}

/* A verify from a stream callback: the stream holds a handle, the pool
 * has no room for another tensor. */
typedef struct verify_in_stream {
    sluice_model *m;
    int calls, rc;
    size_t ok;
} verify_in_stream;

static int verify_in_stream_cb(void *user, sluice_tensor *t, int status,
                               const struct sluice_tensor_info *info, const char *message)
{
    verify_in_stream *v = user;
    (void)info, (void)message;
    if (status == SLUICE_OK && v->calls++ == 0) {
        struct sluice_verify_report r = {.size = sizeof r};
        v->rc = sluice_verify(v->m, NULL, 0, NULL, &r);
        v->ok = r.tensors_ok;
    }
    sluice_release(t);
    return 0;
}

/* sluice_verify of a remote model reads every item from the source with
 * requests of its own, like a local verify, never through the pool: from
 * a stream callback with the pool full it completes without waiting for
 * room; a tensor held in the pool and since changed on the server (same
 * size and mtime, so no validator can tell) fails; its items are counted
 * in the metrics and its requests in remote_reads. */
static void test_verify_reads_the_source(void **state)
{
    (void)state;
    char *p = tu_join(root, "one.safetensors"), *q = tu_join(root, "rs.safetensors");
    char *pm = tu_join(root, "one.safetensors.manifest.json");
    char *qm = tu_join(root, "rs.safetensors.manifest.json");
    tu_copy_file(p, q);
    tu_copy_file(pm, qm);
    sluice_options o;
    sluice_options_init(&o);
    o.pool_bytes = one_sizes[4] + MIB;  /* e, the largest, and little else */
    o.metrics_label = "rs";
    setenv("SLUICE_METRICS", "1", 1);
    sluice_model *m = open_ok(at("rs.safetensors"), &o);
    unsetenv("SLUICE_METRICS");
    verify_in_stream v = {.m = m};
    const char *const first[] = {"e", "b"};
    assert_int_equal(sluice_stream(m, first, 2, verify_in_stream_cb, &v), SLUICE_OK);
    if (v.rc != SLUICE_OK)
        fail_msg("verify in a stream callback: %s: %s", sluice_strerror(v.rc), sluice_errmsg(m));
    assert_int_equal(v.ok, ONE_N);
    /* b in the pool, then changed on the server behind the validators */
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_OK);
    struct stat sb;
    assert_int_equal(stat(q, &sb), 0);
    flip_byte(q, tensor_offset(q, "b") + 777);
    struct timeval same[2] = {{sb.st_atime, 0}, {sb.st_mtime, 0}};
    assert_int_equal(utimes(q, same), 0);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    uint64_t reads_before = st.remote_reads;
    const char *const b[] = {"b"};
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, b, 1, NULL, &r), SLUICE_E_CHECKSUM);
    assert_int_equal(r.tensors_failed, 1);
    assert_non_null(strstr(sluice_errmsg(m), "tensor \"b\""));
    assert_non_null(strstr(sluice_errmsg(m), "mismatch"));
    sluice_release(t);
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_true(st.remote_reads > reads_before);
    size_t need = 0;
    assert_int_equal(sluice_metrics_write(m, NULL, 0, &need, SLUICE_METRICS_PROMETHEUS),
                     SLUICE_E_BUFFER);
    char *text = malloc(need + 4096);
    assert_int_equal(sluice_metrics_write(m, text, need + 4096, &need, SLUICE_METRICS_PROMETHEUS),
                     SLUICE_OK);
    char line[256];
    snprintf(line, sizeof line, "sluice_verify_items_total{model=\"rs\",kind=\"tensor\","
             "result=\"ok\"} %d\n", ONE_N);
    if (!strstr(text, line))
        fail_msg("want %s in:\n%s", line, text);
    assert_non_null(strstr(text, "sluice_verify_items_total{model=\"rs\",kind=\"tensor\","
                           "result=\"checksum\"} 1\n"));
    free(text);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(q);
    unlink(qm);
    free(p);
    free(q);
    free(pm);
    free(qm);
}

static void test_verify_and_commands(void **state)
{
    sluice_model *m = open_ok(at("one.safetensors"), NULL);
    struct sluice_verify_report r = {.size = sizeof r};
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &r), SLUICE_OK);
    assert_int_equal(r.tensors_ok, ONE_N);
    assert_int_equal(r.tensors_failed, 0);
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    /* whole files over HTTP: the flat manifest lists none of them */
    vo.flags = SLUICE_VF_FILES;
    assert_int_equal(sluice_verify(m, NULL, 0, &vo, &r), SLUICE_E_MANIFEST_MISSING);
    assert_int_equal(r.tensors_ok, ONE_N);
    assert_int_equal(r.files_failed, 1);
    vo.flags = SLUICE_VF_DIGEST_ONLY;
    assert_int_equal(sluice_verify(m, NULL, 0, &vo, &r), SLUICE_E_UNSUPPORTED);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the command line, over HTTP, with a local mirror given by --fallback */
    char cmd[4096], *p = tu_join(root, "one.safetensors");
    snprintf(cmd, sizeof cmd, "%s/sluice verify -q %s >/dev/null", SLUICE_BINARY_DIR,
             at("one.safetensors"));
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/sluice inspect %s >/dev/null", SLUICE_BINARY_DIR,
             at("sh/"));
    assert_int_equal(system(cmd), 0);
    /* bench learns URLs: curl is its baseline (a) */
    snprintf(cmd, sizeof cmd, "%s/sluice bench %s --runs 1 --pool 64M 2>/dev/null "
             "| grep -q '(a) curl -s -o /dev/null, 8 connections'", SLUICE_BINARY_DIR,
             at("one.safetensors"));
    if (system("command -v curl >/dev/null 2>&1") == 0)
        assert_int_equal(system(cmd), 0);
    char *d = tu_tmpdir(), *q = tu_join(d, "one.safetensors"), *out = tu_join(d, "e.bin");
    char *qm = tu_join(d, "one.safetensors.manifest.json");
    char *pm = tu_join(root, "one.safetensors.manifest.json");
    tu_copy_file(p, q);
    tu_copy_file(pm, qm);
    flip_byte(q, tensor_offset(q, "e") + 10);
    snprintf(cmd, sizeof cmd, "%s/sluice cat %s e >%s 2>/dev/null", SLUICE_BINARY_DIR, q, out);
    assert_int_not_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/sluice cat %s e --fallback %s --fallback %s >%s",
             SLUICE_BINARY_DIR, q, at("nowhere/"), at("one.safetensors"), out);
    assert_int_equal(system(cmd), 0);
    size_t len;
    void *got = tu_read_file(out, &len);
    void *good = tu_pread_range(p, tensor_offset(p, "e"), 5 * MIB + 3);
    assert_int_equal(len, 5 * MIB + 3);
    assert_memory_equal(got, good, len);
    free(got);
    free(good);
    /* verify judges the local copy (exit 1) and names the mirror that
     * holds "e" verified; repair takes it from there */
    snprintf(cmd, sizeof cmd, "%s/sluice verify -q %s --fallback %s >%s 2>&1", SLUICE_BINARY_DIR,
             q, at("one.safetensors"), out);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
    got = tu_read_file(out, &len);
    char *z = realloc(got, len + 1), want[512];
    assert_non_null(z);
    z[len] = '\0';
    snprintf(want, sizeof want, "tensor \"e\": recoverable from fallback 1 (%s)",
             at("one.safetensors"));
    if (!strstr(z, want))
        fail_msg("sluice verify --fallback URL does not say \"%s\":\n%s", want, z);
    free(z);
    snprintf(cmd, sizeof cmd, "%s/sluice repair -q %s --fallback %s >/dev/null",
             SLUICE_BINARY_DIR, q, at("one.safetensors"));
    assert_int_equal(system(cmd), 0);
    got = tu_read_file(q, &len);
    good = tu_read_file(p, &len);
    assert_memory_equal(got, good, len);
    free(got);
    free(good);
    tu_rmtree(d);
    free(d);
    free(q);
    free(qm);
    free(pm);
    free(out);
    free(p);
    (void)state;
}

/* A copy of one.safetensors as DIR/model.safetensors with its manifest
 * as model.safetensors.manifest.json: the layout `sluice synth` writes
 * and the Hub's usual one. Returns DIR (under root), malloc'd. */
static char *single_file_dir(const char *name)
{
    char *d = tu_join(root, name), *p = tu_join(root, "one.safetensors");
    char *pm = tu_join(root, "one.safetensors.manifest.json");
    mkdir(d, 0755);
    char *q = tu_join(d, "model.safetensors"), *qm = tu_join(d, "model.safetensors.manifest.json");
    tu_copy_file(p, q);
    tu_copy_file(pm, qm);
    free(p);
    free(pm);
    free(q);
    free(qm);
    return d;
}

/* Every line of nginx's log past `from` ("STATUS RANGE URI") that asks
 * for `path` (then a query or nothing) carries `query` exactly, or none
 * when query is NULL; returns how many lines asked for it. */
static size_t logged_with(const char *log, size_t from, const char *path, const char *query)
{
    size_t n = 0, plen = strlen(path);
    char *copy = strdup(log + from), *save = NULL;
    assert_non_null(copy);
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        const char *uri = strrchr(line, ' ');
        uri = uri ? uri + 1 : line;
        if (strncmp(uri, path, plen) != 0 || (uri[plen] && uri[plen] != '?'))
            continue;
        n++;
        if (query ? strcmp(uri + plen, query) != 0 : uri[plen] != '\0')
            fail_msg("a request for %s %s: %s", path, query ? "without its query" : "with a query",
                     line);
    }
    free(copy);
    return n;
}

/* nginx logs a request once its reply is sent: wait (up to 5 s) until
 * the log holds `count` lines for path past `from`. */
static char *log_after(size_t from, const char *path, size_t count)
{
    char *log = NULL;
    for (int i = 0; i < 500; i++) {
        free(log);
        log = rf_log(&nginx);
        size_t n = 0;
        for (const char *p = log + from; (p = strstr(p, path)); p++)
            n++;
        if (n >= count)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return log;
}

/* A directory (or prefix) that is one file F has F.manifest.json for a
 * sidecar, looked for after DIR/sluice.manifest.json. */
static void test_prefix_of_one_file(void **state)
{
    char *d = single_file_dir("single");
    sluice_model *m = open_ok(at("single/"), NULL);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), at("single/model.safetensors.manifest.json"));
    acquire_all_ok(m);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* REQUIRE and neither: the message names both, in their order */
    char *qm = tu_join(d, "model.safetensors.manifest.json"), *sm = tu_join(d, "sluice.manifest.json");
    char *keep = tu_join(root, "single.keep");
    assert_int_equal(rename(qm, keep), 0);
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_REQUIRE;
    assert_int_equal(sluice_open(at("single"), &o, &m), SLUICE_E_MANIFEST);
    char want[512];
    snprintf(want, sizeof want, "no sidecar %s nor %s", at("single/sluice.manifest.json"),
             at("single/model.safetensors"));
    assert_non_null(strstr(sluice_errmsg(m), want));
    sluice_close(m);
    /* both there: sluice.manifest.json first (a flat manifest; the other
     * is made unusable to tell them apart) */
    tu_copy_file(keep, sm);
    tu_write_file(qm, "not json", 8);
    m = open_ok(at("single"), NULL);
    assert_string_equal(sluice_manifest_path(m), at("single/sluice.manifest.json"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(sm);
    unlink(qm);
    unlink(keep);
    tu_rmtree(d);
    free(qm);
    free(sm);
    free(keep);
    free(d);
    (void)state;
}

/* A presigned URL: classified by its path; its query on every request
 * for its object, on none other, and in no message or output. */
static void test_presigned_url(void **state)
{
    char *d = single_file_dir("med");
    static const char q[] = "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA/20250101/"
                            "us-east-1/s3/aws4_request&X-Amz-Signature=5ec7e75ig";
    char loc[1024];
    snprintf(loc, sizeof loc, "%s/med/model.safetensors%s", nginx.base, q);
    char *log0 = rf_log(&nginx);
    size_t from = strlen(log0);
    free(log0);
    sluice_model *m = open_ok(loc, NULL);
    /* the sidecar is found from the path: the signature is the object's */
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    assert_string_equal(sluice_manifest_path(m), at("med/model.safetensors.manifest.json"));
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, 0, &fi), SLUICE_OK);
    assert_string_equal(fi.path, at("med/model.safetensors?..."));
    acquire_all_ok(m);
    unsigned char few[100];    /* a range read too, on this thread */
    assert_int_equal(sluice_read_into(m, "a", 0, few, sizeof few), SLUICE_OK);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_true(st.remote_reads >= 2);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the probe, the header, every read of the load and the range, each
     * with the query; the sidecar without it */
    size_t want = 2 + (size_t)st.remote_reads;
    char *log = log_after(from, "/med/model.safetensors?", want);
    assert_true(logged_with(log, from, "/med/model.safetensors", q) >= want);
    if (logged_with(log, from, "/med/model.safetensors.manifest.json", NULL) != 1)
        fail_msg("the sidecar was not asked once: %s", log + from);
    free(log);
    /* a failure names the object without its query */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/med/absent.safetensors%s", nginx.base, q);
    assert_int_equal(sluice_open(bad, NULL, &m), SLUICE_E_NO_FILES);
    assert_null(strstr(sluice_errmsg(m), "5ec7e75ig"));
    assert_non_null(strstr(sluice_errmsg(m), "absent.safetensors?..."));
    sluice_close(m);
    /* an index.json with a query (holding '/'): its shards are beside its path */
    snprintf(bad, sizeof bad, "%s/sh/model.safetensors.index.json%s", nginx.base, q);
    m = open_ok(bad, NULL);
    assert_int_equal(sluice_count(m), 5);
    assert_string_equal(sluice_manifest_path(m), at("sh/sluice.manifest.json"));
    acquire_all_ok(m);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the commands: inspect, verify and stats open it, and print no query */
    char *scratch = tu_tmpdir();
    static const char *const cmds[][2] = {{"inspect", NULL}, {"verify", "-q"}, {"stats", NULL}};
    for (size_t k = 0; k < sizeof cmds / sizeof *cmds; k++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s/sluice %s '%s' %s >%s/out 2>&1", SLUICE_BINARY_DIR,
                 cmds[k][0], loc, cmds[k][1] ? cmds[k][1] : "", scratch);
        int rc = system(cmd);
        char *out = tu_join(scratch, "out");
        size_t len;
        char *text = tu_read_file(out, &len);
        assert_non_null(text);
        char *z = realloc(text, len + 1);
        assert_non_null(z);
        z[len] = '\0';
        if (rc != 0 || strstr(z, "5ec7e75ig") || strstr(z, "AKIA"))
            fail_msg("sluice %s of a presigned URL: exit %d:\n%s", cmds[k][0], rc, z);
        free(z);
        free(out);
    }
    tu_rmtree(scratch);
    free(scratch);
    tu_rmtree(d);
    free(d);
    (void)state;
}

static void test_https(void **state)
{
    if (!nginx.tls_port) {
        fprintf(stderr, "no certificate could be made (openssl): https not tried\n");
        skip();
        return;
    }
    char loc[256], *p = tu_join(root, "one.safetensors");
    snprintf(loc, sizeof loc, "%s/one.safetensors", nginx.tls_base);
    sluice_options o;
    sluice_options_init(&o);
    o.remote_ca_file = nginx.ca_file;
    sluice_model *l = open_ok(p, NULL), *r = open_ok(loc, &o);
    compare_models(l, r);
    assert_int_equal(sluice_verify(r, NULL, 0, NULL, NULL), SLUICE_OK);
    sluice_close(r);
    sluice_close(l);
    /* the system's store does not know this certificate: refused, not retried */
    sluice_options_init(&o);
    assert_int_equal(sluice_open(loc, &o, &r), SLUICE_E_REMOTE);
    assert_non_null(strcasestr(sluice_errmsg(r), "certificate"));
    sluice_close(r);
    free(p);
    (void)state;
}

/* A dim-1 part of a [2048, 512] BF16 tensor at world 4 (2,048 rows of
 * 256 bytes, 768 bytes apart), verified by its part digest: multi-range
 * requests, a few hundred rows each, not one request a row, and about the
 * part's bytes on the wire (nginx's log counts both); the bytes equal a
 * local read's. A token requested before the call: no request. */
static void test_part_ranges_coalesce(void **state)
{
    char *dir = tu_join(root, "tp");
    mkdir(dir, 0755);
    char *path = tu_join(dir, "model.safetensors");
    const uint64_t nbytes = 2048ull * 512 * 2, part = nbytes / 4;
    char header[256];
    snprintf(header, sizeof header, "{\"l.o_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[2048,512],"
             "\"data_offsets\":[0,%llu]}}", (unsigned long long)nbytes);
    tu_write_safetensors(path, header, NULL, (size_t)nbytes);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/sluice manifest %s --parts builtin --worlds 4 -q -o "
             "%s.manifest.json", SLUICE_BINARY_DIR, path, path);
    assert_int_equal(system(cmd), 0);
    unsigned char *want = malloc(part), *got = malloc(part);
    assert_non_null(want);
    assert_non_null(got);
    sluice_model *l = open_ok(path, NULL);
    assert_int_equal(sluice_read_part_into(l, "l.o_proj.weight", 1, 1, 4, want, part), SLUICE_OK);
    assert_int_equal(sluice_close(l), SLUICE_OK);
    sluice_model *r = open_ok(at("tp/model.safetensors"), NULL);
    /* the open's requests logged, then the part's alone */
    char *log = log_after(0, "/tp/model.safetensors.manifest.json", 1);
    free(log);
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    size_t n0 = rf_requests(&nginx);
    uint64_t b0 = rf_bytes_sent(&nginx);
    struct sluice_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    assert_int_equal(sluice_stats(r, &st0), SLUICE_OK);
    memset(got, 0, part);
    int rc = sluice_read_part_into(r, "l.o_proj.weight", 1, 1, 4, got, part);
    if (rc != SLUICE_OK)
        fail_msg("part: %s: %s", sluice_strerror(rc), sluice_errmsg(r));
    assert_memory_equal(got, want, part);
    assert_int_equal(sluice_stats(r, &st1), SLUICE_OK);
    size_t n1 = n0;
    for (int i = 0; i < 200 && (n1 = rf_requests(&nginx)) < n0 + st1.remote_reads - st0.remote_reads;
         i++)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    uint64_t sent = rf_bytes_sent(&nginx) - b0;
    fprintf(stderr, "part of %llu bytes: %zu requests, %llu bytes sent\n",
            (unsigned long long)part, n1 - n0, (unsigned long long)sent);
    assert_true(n1 - n0 >= 1);
    assert_true(n1 - n0 <= 16);
    assert_int_equal(st1.remote_reads - st0.remote_reads, n1 - n0);
    assert_true(sent >= part);
    assert_true(sent * 2 <= part * 3);
    /* its token requested before the call: no request, nothing read, no
     * failure (sluice_read_part_into_ex) */
    sluice_cancel *c = NULL;
    assert_int_equal(sluice_cancel_create(&c), SLUICE_OK);
    sluice_cancel_request(c);
    sluice_part_options po;
    assert_int_equal(sluice_part_options_init(&po), SLUICE_OK);
    po.cancel = c;
    struct sluice_stats st2 = {.size = sizeof st2};
    assert_int_equal(sluice_read_part_into_ex(r, "l.o_proj.weight", 1, 2, 4, got, part, &po),
                     SLUICE_E_CANCELLED);
    assert_int_equal(sluice_stats(r, &st2), SLUICE_OK);
    assert_int_equal(st2.remote_reads, st1.remote_reads);
    assert_int_equal(st2.bytes_read, st1.bytes_read);
    assert_int_equal(st2.failures, st1.failures);
    sluice_cancel_reset(c);
    assert_int_equal(sluice_read_part_into_ex(r, "l.o_proj.weight", 1, 1, 4, got, part, &po),
                     SLUICE_OK);
    assert_memory_equal(got, want, part);
    sluice_cancel_free(c);
    assert_int_equal(sluice_close(r), SLUICE_OK);
    free(want);
    free(got);
    tu_rmtree(dir);
    free(path);
    free(dir);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_url),
        cmocka_unit_test(test_sharded_urls),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_ranges_threads),
        cmocka_unit_test(test_blocking_reads_reuse_connections),
        cmocka_unit_test(test_blocking_reads_after_fork),
        cmocka_unit_test(test_real_files),
        cmocka_unit_test(test_manifest_url),
        cmocka_unit_test(test_missing_and_norange),
        cmocka_unit_test(test_checksum_and_changed),
        cmocka_unit_test(test_ranges_of_a_remote_model),
        cmocka_unit_test(test_fallback_corrupt_local),
        cmocka_unit_test(test_fallback_other_shape),
        cmocka_unit_test(test_fallback_truncated_after_open),
        cmocka_unit_test(test_fallback_all_fail),
        cmocka_unit_test(test_fallback_needs_manifest),
        cmocka_unit_test(test_fallback_remote_primary),
        cmocka_unit_test(test_signed_remote_manifest),
        cmocka_unit_test(test_verify_and_commands),
        cmocka_unit_test(test_verify_reads_the_source),
        cmocka_unit_test(test_https),
        cmocka_unit_test(test_prefix_of_one_file),
        cmocka_unit_test(test_presigned_url),
        cmocka_unit_test(test_part_ranges_coalesce),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
