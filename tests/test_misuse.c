/* test_misuse.c: every public call with NULL or invalid arguments, on no
 * model, on the closed shell a failed open leaves, and on an open model:
 * each gives the value sluice.h documents (mostly SLUICE_E_INVAL), never
 * undefined behaviour. Also options of a wrong size or with unknown flags,
 * double release, close with live handles or from inside a stream
 * callback (SLUICE_E_BUSY, the model stays usable). Release after a
 * successful close cannot be detected (the handle's memory is gone): the
 * header says so, and close refuses while any handle is live, so a
 * program that checks close's status never gets there. */
#include "engine_fixture.h"

#include <limits.h>

/* ---------------------------------------------------------------- no model */

static void test_static_calls(void **state)
{
    (void)state;
    for (int code = -100; code <= 5; code++)
        assert_non_null(sluice_strerror(code));
    assert_string_equal(sluice_strerror(INT_MIN), "unknown status");
    assert_string_equal(sluice_strerror(1), "unknown status");
    assert_null(sluice_dtype_name(SLUICE_DTYPE_COUNT_));
    assert_null(sluice_dtype_name((sluice_dtype)-1));
    assert_int_equal(sluice_dtype_bits(SLUICE_DTYPE_COUNT_), 0);
    assert_int_equal(sluice_dtype_bits((sluice_dtype)-1), 0);
    assert_int_equal(sluice_options_init(NULL), SLUICE_E_INVAL);
    char hex[65];
    assert_null(sluice_digest_hex(NULL, NULL));
    uint8_t d[32] = {0};
    assert_null(sluice_digest_hex(d, NULL));
    hex[0] = 'x';
    assert_ptr_equal(sluice_digest_hex(NULL, hex), hex);
    assert_string_equal(hex, "");
}

/* Every call that takes a model, with a model that is NULL. */
static void test_null_model(void **state)
{
    (void)state;
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    struct sluice_file_info finfo = SLUICE_FILE_INFO_INIT;
    struct sluice_stats st = {.size = sizeof st};
    uint8_t d[32];
    uint64_t size = 7;
    sluice_tensor *t = (sluice_tensor *)&info;
    const char *names[1] = {"x"};
    assert_int_equal(sluice_open("x", NULL, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(NULL), SLUICE_OK);
    assert_non_null(sluice_errmsg(NULL));
    assert_int_equal(sluice_count(NULL), 0);
    assert_int_equal(sluice_info(NULL, 0, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_find(NULL, "x", &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_find_n(NULL, "x", 1, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_file_count(NULL), 0);
    assert_int_equal(sluice_file_info(NULL, 0, &finfo), SLUICE_E_INVAL);
    assert_int_equal(sluice_prefetch(NULL, names, 1), SLUICE_E_INVAL);
    assert_int_equal(sluice_acquire(NULL, "x", &t), SLUICE_E_INVAL);
    assert_null(t);
    t = (sluice_tensor *)&info;
    assert_int_equal(sluice_acquire_index(NULL, 0, &t), SLUICE_E_INVAL);
    assert_null(t);
    t = (sluice_tensor *)&info;
    assert_int_equal(sluice_acquire_range(NULL, "x", 0, 1, &t), SLUICE_E_INVAL);
    assert_null(t);
    t = (sluice_tensor *)&info;
    assert_int_equal(sluice_acquire_part(NULL, "x", 0, 0, 1, &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_int_equal(sluice_stream(NULL, NULL, 0, ef_stream_cb, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_verify_mode(NULL), SLUICE_VERIFY_OFF);
    assert_null(sluice_manifest_path(NULL));
    assert_int_equal(sluice_manifest_tensor(NULL, 0, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_file(NULL, 0, d, &size), SLUICE_E_INVAL);
    assert_int_equal(sluice_stats(NULL, &st), SLUICE_E_INVAL);
    /* handles */
    assert_int_equal(sluice_release(NULL), SLUICE_OK);
    assert_null(sluice_tensor_data(NULL));
    assert_int_equal(sluice_tensor_size(NULL), 0);
    assert_null(sluice_tensor_info(NULL));
    assert_int_equal(sluice_tensor_digest(NULL, d), SLUICE_E_INVAL);
}

/* ---------------------------------------------------------------- the shell */

/* Every call on the closed model a failed open leaves: SLUICE_E_INVAL (or
 * 0, NULL, OFF), its errmsg the open's failure, then close. */
static void check_shell(sluice_model *m, const char *why)
{
    assert_non_null(m);
    assert_non_null(strstr(sluice_errmsg(m), why));
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    struct sluice_file_info finfo = SLUICE_FILE_INFO_INIT;
    struct sluice_stats st = {.size = sizeof st};
    uint8_t d[32];
    sluice_tensor *t = (sluice_tensor *)&info;
    const char *names[1] = {"a"};
    assert_int_equal(sluice_count(m), 0);
    assert_int_equal(sluice_info(m, 0, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_find(m, "a", &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_find_n(m, "a", 1, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_file_count(m), 0);
    assert_int_equal(sluice_file_info(m, 0, &finfo), SLUICE_E_INVAL);
    assert_int_equal(sluice_prefetch(m, names, 1), SLUICE_E_INVAL);
    assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_E_INVAL);
    assert_int_equal(sluice_acquire(m, "a", &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_int_equal(sluice_acquire_index(m, 0, &t), SLUICE_E_INVAL);
    assert_int_equal(sluice_stream(m, NULL, 0, ef_stream_cb, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_null(sluice_manifest_path(m));
    assert_int_equal(sluice_manifest_tensor(m, 0, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_file(m, 0, d, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_stats(m, &st), SLUICE_E_INVAL);
    /* the message is still the open's, after all these */
    assert_non_null(strstr(sluice_errmsg(m), why));
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* The running library's version, which the header's macros describe. */
static void test_version(void **state)
{
    (void)state;
    assert_string_equal(sluice_version(), SLUICE_VERSION_STRING);
    assert_string_equal(sluice_version(), "0.1.0");
    assert_int_equal(sluice_version_number(), SLUICE_VERSION_NUMBER);
    assert_int_equal(sluice_version_number(),
                     SLUICE_VERSION_MAJOR * 10000 + SLUICE_VERSION_MINOR * 100 + SLUICE_VERSION_PATCH);
}

static void test_bad_options(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, 4, 3);
    sluice_model *m = NULL;
    sluice_options o;

    assert_int_equal(sluice_open(NULL, NULL, &m), SLUICE_E_INVAL);
    check_shell(m, "path is NULL");

    /* one field wrong at a time */
    for (int k = 0; k < 13; k++) {
        sluice_options_init(&o);
        const char *why = NULL;
        switch (k) {
        case 0: o.size = 0; why = "size 0"; break;
        case 1: o.size = offsetof(sluice_options, flags); why = "is not one this library knows"; break;
        case 2: o.size = sizeof o.size; why = "is not one this library knows"; break;
        case 3: o.flags = 0x20; why = "unknown flag bits 0x20"; break;
        case 4: o.flags = 0x80000000u | SLUICE_F_HASH_ALL; why = "unknown flag bits 0x80000000"; break;
        case 5: o.queue_depth = 0; why = "queue_depth 0"; break;
        case 6: o.queue_depth = 4097; why = "queue_depth 4097"; break;
        case 7: o.chunk_bytes = 4095; why = "chunk_bytes 4095"; break;
        case 8: o.chunk_bytes = (1ull << 30) + 1; why = "chunk_bytes"; break;
        case 9: o.pool_bytes = 0; why = "pool_bytes is 0"; break;
        case 10: o.io_threads = 0; why = "io_threads 0"; break;
        case 11: o.hash_threads = 257; why = "hash_threads 257"; break;
        case 12: o.verify = (sluice_verify_policy)4; why = "unknown verify policy 4"; break;
        }
        m = NULL;
        assert_int_equal(sluice_open(dir, &o, &m), SLUICE_E_INVAL);
        check_shell(m, why);
    }
    sluice_options_init(&o);
    o.verify = (sluice_verify_policy)-1;
    assert_int_equal(sluice_open(dir, &o, &m), SLUICE_E_INVAL);
    check_shell(m, "unknown verify policy -1");
    /* a pool below one buffer's alignment */
    sluice_options_init(&o);
    o.pool_bytes = 63;
    assert_int_equal(sluice_open(dir, &o, &m), SLUICE_E_INVAL);
    check_shell(m, "holds no buffer");
    /* the options' path lists, trusted_keys and trusted_cas under one rule
     * (list and count both set or both unset, no entry NULL), each named
     * in its message; trusted_keys is checked first */
    const char *paths[2] = {"/nonexistent/a.pem", NULL};
    for (int k = 0; k < 7; k++) {
        sluice_options_init(&o);
        const char *why = NULL;
        switch (k) {
        case 0: o.ntrusted_cas = 1; why = "options: trusted_cas is NULL but ntrusted_cas is 1"; break;
        case 1: o.trusted_cas = paths; why = "options: trusted_cas is set but ntrusted_cas is 0"; break;
        case 2: o.trusted_cas = paths, o.ntrusted_cas = 2; why = "options: trusted_cas[1] is NULL"; break;
        case 3: o.ntrusted_keys = 1; why = "options: trusted_keys is NULL but ntrusted_keys is 1"; break;
        case 4: o.trusted_keys = paths; why = "options: trusted_keys is set but ntrusted_keys is 0"; break;
        case 5: o.trusted_keys = paths, o.ntrusted_keys = 2; why = "options: trusted_keys[1] is NULL"; break;
        case 6:
            o.trusted_keys = paths, o.ntrusted_keys = 2, o.ntrusted_cas = 1;
            why = "options: trusted_keys[1] is NULL";
            break;
        }
        m = NULL;
        assert_int_equal(sluice_open(dir, &o, &m), SLUICE_E_INVAL);
        check_shell(m, why);
    }

    /* an older caller's shorter struct: the fields it has, defaults after */
    sluice_options_init(&o);
    o.size = offsetof(sluice_options, queue_depth);
    o.flags = SLUICE_F_HASH_ALL;
    o.pool_bytes = 0;  /* past its size: not read */
    assert_int_equal(sluice_open(dir, &o, &m), SLUICE_OK);
    ef_check_orders(m, 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* a newer caller's longer struct: its unknown tail all zero is fine,
     * a non-zero byte there is refused, named by its offset */
    struct {
        sluice_options o;
        unsigned char tail[24];
    } newer;
    memset(&newer, 0, sizeof newer);
    sluice_options_init(&newer.o);
    newer.o.size = sizeof newer;
    newer.o.flags = SLUICE_F_HASH_ALL;
    assert_int_equal(sluice_open(dir, &newer.o, &m), SLUICE_OK);
    ef_check_orders(m, 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    newer.tail[5] = 1;
    assert_int_equal(sluice_open(dir, &newer.o, &m), SLUICE_E_INVAL);
    char why[64];
    snprintf(why, sizeof why, "byte %zu of", sizeof(sluice_options) + 5);
    check_shell(m, why);
    newer.tail[5] = 0;
    newer.tail[23] = 0x80;
    assert_int_equal(sluice_open(dir, &newer.o, &m), SLUICE_E_INVAL);
    snprintf(why, sizeof why, "byte %zu of", sizeof(sluice_options) + 23);
    check_shell(m, why);

    /* a path that names nothing, and an explicit manifest that is absent */
    assert_int_equal(sluice_open("/nonexistent/sluice", NULL, &m), SLUICE_E_NO_FILES);
    check_shell(m, "/nonexistent/sluice");
    sluice_options_init(&o);
    o.manifest_path = "/nonexistent/manifest.json";
    assert_int_equal(sluice_open(dir, &o, &m), SLUICE_E_MANIFEST);
    check_shell(m, "/nonexistent/manifest.json");
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- an open model */

static int stop_cb(void *user, sluice_tensor *t, int status,
                   const struct sluice_tensor_info *info, const char *message)
{
    (void)user;
    (void)info;
    (void)message;
    if (status == SLUICE_OK)
        sluice_release(t);
    return 42;
}

typedef struct inner {
    sluice_model *m;
    unsigned calls, busy, nested_ok;
} inner;

/* From inside a callback: close must refuse (a stream runs, a handle is
 * held), nested calls work. */
static int inner_cb(void *user, sluice_tensor *t, int status,
                    const struct sluice_tensor_info *info, const char *message)
{
    (void)message;
    inner *in = user;
    in->calls++;
    if (sluice_close(in->m) == SLUICE_E_BUSY)
        in->busy++;
    sluice_tensor *t2 = NULL;
    if (sluice_acquire_index(in->m, (info->index + 1) % sluice_count(in->m), &t2) == SLUICE_OK &&
        sluice_release(t2) == SLUICE_OK)
        in->nested_ok++;
    if (status == SLUICE_OK)
        sluice_release(t);
    return 0;
}

/* The info structs start with their size: a shorter (older) struct gets
 * only the fields it has, a longer (newer) one keeps its tail, the size
 * the caller set stays; a size below the size field is refused. */
static void test_info_sizes(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, 6, 4);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);

    struct sluice_tensor_info full = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, 1, &full), SLUICE_OK);
    assert_int_equal(full.size, sizeof full);
    assert_int_equal(full.index, 1);

    struct {
        struct sluice_tensor_info i;
        unsigned char tail[32];
    } t;
    for (size_t size = 0; size < sizeof t.i.size; size++) {
        memset(&t, 0xa5, sizeof t);
        t.i.size = size;
        assert_int_equal(sluice_info(m, 1, &t.i), SLUICE_E_INVAL);
        assert_int_equal(sluice_find(m, "s0.t001", &t.i), SLUICE_E_INVAL);
    }
    /* an older caller's struct that ends before dtype */
    memset(&t, 0xa5, sizeof t);
    t.i.size = offsetof(struct sluice_tensor_info, dtype);
    assert_int_equal(sluice_find(m, full.name, &t.i), SLUICE_OK);
    assert_int_equal(t.i.size, offsetof(struct sluice_tensor_info, dtype));
    assert_ptr_equal(t.i.name, full.name);
    assert_int_equal(t.i.name_len, full.name_len);
    const unsigned char *bytes = (const unsigned char *)&t;
    for (size_t k = offsetof(struct sluice_tensor_info, dtype); k < sizeof t; k++)
        assert_int_equal(bytes[k], 0xa5);
    /* a newer caller's longer struct: every field we know, tail untouched */
    memset(&t, 0xa5, sizeof t);
    t.i.size = sizeof t;
    assert_int_equal(sluice_info(m, 1, &t.i), SLUICE_OK);
    assert_int_equal(t.i.size, sizeof t);
    assert_int_equal(t.i.index, 1);
    assert_int_equal(t.i.offset, full.offset);
    for (size_t k = 0; k < sizeof t.tail; k++)
        assert_int_equal(t.tail[k], 0xa5);

    /* the same rules for the file info */
    struct sluice_file_info ffull = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(m, 0, &ffull), SLUICE_OK);
    assert_int_equal(ffull.size, sizeof ffull);
    assert_true(ffull.file_size > 8);
    struct {
        struct sluice_file_info i;
        unsigned char tail[32];
    } f;
    memset(&f, 0xa5, sizeof f);
    f.i.size = sizeof f.i.size - 1;
    assert_int_equal(sluice_file_info(m, 0, &f.i), SLUICE_E_INVAL);
    f.i.size = offsetof(struct sluice_file_info, header_bytes);
    assert_int_equal(sluice_file_info(m, 0, &f.i), SLUICE_OK);
    assert_ptr_equal(f.i.path, ffull.path);
    assert_int_equal(f.i.file_size, ffull.file_size);
    bytes = (const unsigned char *)&f;
    for (size_t k = offsetof(struct sluice_file_info, header_bytes); k < sizeof f; k++)
        assert_int_equal(bytes[k], 0xa5);
    memset(&f, 0xa5, sizeof f);
    f.i.size = sizeof f;
    assert_int_equal(sluice_file_info(m, 0, &f.i), SLUICE_OK);
    assert_int_equal(f.i.size, sizeof f);
    assert_int_equal(f.i.tensor_count, ffull.tensor_count);
    for (size_t k = 0; k < sizeof f.tail; k++)
        assert_int_equal(f.tail[k], 0xa5);

    /* what the library hands out by pointer carries its own size */
    sluice_tensor *h = NULL;
    assert_int_equal(sluice_acquire_index(m, 1, &h), SLUICE_OK);
    assert_int_equal(sluice_tensor_info(h)->size, sizeof(struct sluice_tensor_info));
    assert_int_equal(sluice_tensor_info(h)->index, 1);
    assert_int_equal(sluice_release(h), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

static void test_open_model(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, 6, 4);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    size_t n = sluice_count(m);
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    struct sluice_file_info finfo = SLUICE_FILE_INFO_INIT;
    uint8_t d[32];
    uint64_t size = 0;
    sluice_tensor *t = (sluice_tensor *)&info;

    /* index queries */
    assert_int_equal(sluice_info(m, n, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_info(m, SIZE_MAX, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_info(m, 0, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_find(m, NULL, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_find_n(m, NULL, 0, &info), SLUICE_E_INVAL);
    assert_int_equal(sluice_find(m, "nope", &info), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_find(m, "s0.t001", NULL), SLUICE_OK);
    assert_int_equal(sluice_find_n(m, "s0.t001", 3, NULL), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_file_info(m, 1, &finfo), SLUICE_E_INVAL);
    assert_int_equal(sluice_file_info(m, 0, NULL), SLUICE_E_INVAL);

    /* manifest queries: none read */
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_OFF);
    assert_null(sluice_manifest_path(m));
    assert_int_equal(sluice_manifest_tensor(m, 0, d), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_manifest_tensor(m, n, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_tensor(m, 0, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_file(m, 0, d, &size), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_manifest_file(m, 1, d, &size), SLUICE_E_INVAL);
    assert_int_equal(sluice_manifest_file(m, 0, NULL, &size), SLUICE_E_INVAL);

    /* prefetch */
    const char *bad[2] = {"s0.t001", NULL};
    const char *unknown[2] = {"s0.t001", "nope"};
    assert_int_equal(sluice_prefetch(m, NULL, 3), SLUICE_E_INVAL);
    assert_int_equal(sluice_prefetch(m, bad, 2), SLUICE_E_INVAL);
    assert_int_equal(sluice_prefetch(m, unknown, 2), SLUICE_E_NOT_FOUND);
    assert_non_null(strstr(sluice_errmsg(m), "\"nope\""));
    assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK); /* back to model order */
    assert_int_equal(sluice_prefetch(m, unknown, 1), SLUICE_OK);

    /* acquire */
    assert_int_equal(sluice_acquire(m, NULL, &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_int_equal(sluice_acquire(m, "s0.t001", NULL), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "sluice_acquire: out is NULL or unusable"));
    /* each acquire call names itself; a NULL out is the first check */
    assert_int_equal(sluice_acquire_range(m, "s0.t001", 5, 1, NULL), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "sluice_acquire_range: out is NULL or unusable"));
    assert_int_equal(sluice_acquire_part(m, "s0.t001", 7, 9, 1, NULL), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "sluice_acquire_part: out is NULL or unusable"));
    assert_int_equal(sluice_acquire_part_ex(m, "s0.t001", 0, 0, 1, NULL, NULL), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "sluice_acquire_part: out is NULL or unusable"));
    t = (sluice_tensor *)&info;
    assert_int_equal(sluice_acquire_range(m, "s0.t001", 5, 1, &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_non_null(strstr(sluice_errmsg(m), "byte_end 1 is before byte_begin 5"));
    t = (sluice_tensor *)&info;
    assert_int_equal(sluice_acquire(m, "nope", &t), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_acquire_index(m, n, &t), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "out of range"));
    assert_int_equal(sluice_acquire_index(m, 0, NULL), SLUICE_E_INVAL);

    /* handles: digest without hashing, double release */
    assert_int_equal(sluice_acquire(m, "s0.t001", &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_E_INVAL); /* not hashed */
    assert_int_equal(sluice_tensor_digest(t, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sluice_release(t), SLUICE_E_INVAL);
    assert_int_equal(sluice_release(t), SLUICE_E_INVAL);
    /* a released handle's slot is reused by the next acquire, which works */
    ef_acquire_check(m, 1);

    /* stream */
    assert_int_equal(sluice_stream(m, NULL, 0, NULL, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_stream(m, bad, 2, ef_stream_cb, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_stream(m, unknown, 2, ef_stream_cb, NULL), SLUICE_E_NOT_FOUND);
    ef_stream_seen s = {0};
    s.n = n;
    s.seen = calloc(n, 1);
    assert_int_equal(sluice_stream(m, unknown, 0, ef_stream_cb, &s), SLUICE_OK); /* nothing */
    assert_int_equal(s.delivered, 0);
    free(s.seen);
    assert_int_equal(sluice_stream(m, NULL, 0, stop_cb, NULL), 42);
    inner in = {m, 0, 0, 0};
    assert_int_equal(sluice_stream(m, NULL, 0, inner_cb, &in), SLUICE_OK);
    assert_int_equal(in.calls, n);
    assert_int_equal(in.busy, n);
    assert_int_equal(in.nested_ok, n);

    /* stats */
    struct sluice_stats st;
    memset(&st, 0, sizeof st);
    assert_int_equal(sluice_stats(m, NULL), SLUICE_E_INVAL);
    st.size = 0;
    assert_int_equal(sluice_stats(m, &st), SLUICE_E_INVAL);
    st.size = sizeof st.size - 1;
    assert_int_equal(sluice_stats(m, &st), SLUICE_E_INVAL);
    /* a later caller's longer struct: the fields known are written */
    unsigned char big[sizeof st + 64];
    memset(big, 0xcd, sizeof big);
    size_t bigsize = sizeof big;
    memcpy(big, &bigsize, sizeof bigsize);
    assert_int_equal(sluice_stats(m, (struct sluice_stats *)(void *)big), SLUICE_OK);
    assert_int_equal(big[sizeof big - 1], 0xcd);

    /* close with a live handle: BUSY, nothing freed, still usable */
    assert_int_equal(sluice_acquire_index(m, 2, &t), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_E_BUSY);
    assert_non_null(strstr(sluice_errmsg(m), "still live"));
    ef_check_handle(t);
    ef_check_stream(m);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_calls),
        cmocka_unit_test(test_null_model),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_info_sizes),
        cmocka_unit_test(test_open_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
