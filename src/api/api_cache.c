/* api_cache.c: sluice_cache_*, the administration of a cache directory
 * ("Persistent cache" in sluice.h) on top of cache.c. A handle is used by
 * one thread at a time, so its last message lives in the handle itself. */
#include "cache/cache.h"
#include "base/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define VERIFY_PIECE ((size_t)4 << 20)

struct sluice_cache {
    sl_cache *c;   /* NULL: a handle that only carries the open's error */
    sl_err err;
};

static int cache_open(const char *dir, int create, sluice_cache **out);

SLUICE_API int sluice_cache_open(const char *dir, sluice_cache **out)
{
    return cache_open(dir, 1, out);
}

SLUICE_API int sluice_cache_open_existing(const char *dir, sluice_cache **out)
{
    return cache_open(dir, 0, out);
}

static int cache_open(const char *dir, int create, sluice_cache **out)
{
    if (!out)
        return SLUICE_E_INVAL;
    sluice_cache *h = calloc(1, sizeof *h);
    *out = h;
    if (!h)
        return SLUICE_E_NOMEM;
#ifndef SLUICE_HAVE_SQLITE
    (void)dir;
    (void)create;
    return sl_fail(&h->err, SLUICE_E_UNSUPPORTED,
                   "this sluice was built without SQLite (libsqlite3-dev): no persistent cache");
#else
    char *path = NULL;
    if (dir && *dir) {
        if (!(path = strdup(dir)))
            return sl_fail(&h->err, SLUICE_E_NOMEM, "out of memory opening the cache %s", dir);
    } else {
        sluice_options o;
        sluice_options_init(&o);
        o.flags |= SLUICE_F_CACHE_DEFAULT;
        SL_TRY(sl_cache_dir_for(&o, &path, &h->err));
        if (!path)
            return sl_fail(&h->err, SLUICE_E_INVAL,
                           "no cache directory: neither SLUICE_CACHE_DIR nor "
                           "XDG_CACHE_HOME nor HOME is set");
    }
    if (!create && !sl_cache_exists(path)) {
        int no = sl_fail(&h->err, SLUICE_E_NOT_FOUND, "no cache at %s", path);
        free(path);
        return no;
    }
    sl_cache *c = NULL;
    int rc = sl_cache_open(path, SLUICE_CACHE_DEFAULT_BYTES, &c, &h->err);
    free(path);
    if (rc < 0)
        return rc;
    if (sl_cache_is_off(c)) {
        rc = sl_fail(&h->err, SLUICE_E_IO, "%s", sl_cache_warning(c));
        sl_cache_close(c);
        return rc;
    }
    sl_cache_set_patient(c);   /* no load waits on the administration */
    h->c = c;
    return SLUICE_OK;
#endif
}

SLUICE_API const char *sluice_cache_errmsg(const sluice_cache *cache)
{
    if (!cache)
        return "out of memory";
    return cache->err.code < 0 ? cache->err.msg : "";
}

SLUICE_API const char *sluice_cache_path(const sluice_cache *cache)
{
    return cache && cache->c ? sl_cache_dir(cache->c) : NULL;
}

/* Starts a call: clears the last message; SLUICE_E_INVAL for a handle
 * whose open failed. */
static int begin(sluice_cache *h)
{
    if (!h)
        return SLUICE_E_INVAL;
    h->err.code = SLUICE_OK;
    h->err.msg[0] = '\0';
    if (!h->c)
        return sl_fail(&h->err, SLUICE_E_INVAL, "this cache handle's open failed");
    return SLUICE_OK;
}

/* The public view of a row; present from a stat of its blob. */
static void entry_of(const sluice_cache *h, const sl_cache_row *r, sluice_cache_entry *e)
{
    memset(e, 0, sizeof *e);
    e->algorithm = r->alg;
    memcpy(e->digest, r->digest, sizeof e->digest);
    e->bytes = r->size;
    e->source = r->source;
    e->created_ns = r->created_ns;
    e->last_access_ns = r->last_access_ns;
    e->names = r->names;
    e->nnames = r->nnames;
    char *p = sl_cache_blob_path(h->c, r->alg, r->digest);
    struct stat st;
    e->present = p && lstat(p, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == r->size;
    free(p);
}

SLUICE_API int sluice_cache_list(sluice_cache *cache,
                                 int (*fn)(void *user, const sluice_cache_entry *entry),
                                 void *user)
{
    SL_TRY(begin(cache));
    if (!fn)
        return sl_fail(&cache->err, SLUICE_E_INVAL, "sluice_cache_list: fn is NULL");
    sl_cache_row *rows;
    size_t n;
    int rc = sl_cache_rows(cache->c, &rows, &n, &cache->err);
    if (rc < 0)
        return rc;
    rc = SLUICE_OK;
    for (size_t i = 0; i < n && rc == 0; i++) {
        sluice_cache_entry e;
        entry_of(cache, &rows[i], &e);
        rc = fn(user, &e);
    }
    sl_cache_rows_free(rows, n);
    return rc;
}

SLUICE_API int sluice_cache_usage(sluice_cache *cache, uint64_t *bytes, uint64_t *entries)
{
    SL_TRY(begin(cache));
    uint64_t b, n;
    int rc = sl_cache_usage(cache->c, &b, &n, &cache->err);
    if (rc < 0)
        return rc;
    if (bytes)
        *bytes = b;
    if (entries)
        *entries = n;
    return SLUICE_OK;
}

SLUICE_API int sluice_cache_gc(sluice_cache *cache, uint64_t max_bytes, uint64_t *freed_bytes,
                               uint64_t *freed_entries)
{
    SL_TRY(begin(cache));
    uint64_t b, n;
    int rc = sl_cache_gc(cache->c, max_bytes, &b, &n, &cache->err);
    if (freed_bytes)
        *freed_bytes = b;
    if (freed_entries)
        *freed_entries = n;
    return rc < 0 ? rc : SLUICE_OK;
}

SLUICE_API int sluice_cache_clear(sluice_cache *cache, uint64_t *freed_bytes,
                                  uint64_t *freed_entries)
{
    SL_TRY(begin(cache));
    uint64_t b, n;
    int rc = sl_cache_clear(cache->c, &b, &n, &cache->err);
    if (freed_bytes)
        *freed_bytes = b;
    if (freed_entries)
        *freed_entries = n;
    return rc < 0 ? rc : SLUICE_OK;
}

/* Hashes the blob of r in VERIFY_PIECE reads. 1 it matches; 0 it does
 * not (why says how); -1 it could not be read (why says why, and the
 * blob is left alone); -2 out of memory. */
static int check_blob(sluice_cache *h, const sl_cache_row *r, sl_md *md, uint8_t *buf,
                      char *why, size_t why_size)
{
    char *p = sl_cache_blob_path(h->c, r->alg, r->digest);
    if (!p)
        return -2;
    /* O_NONBLOCK: a FIFO in its place must not hang the walk */
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    free(p);
    if (fd < 0) {
        if (errno == ENOENT) {
            snprintf(why, why_size, "its blob is missing");
            return 0;
        }
        snprintf(why, why_size, "cannot open its blob: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_size, "its blob is not a regular file");
        close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size != r->size) {
        snprintf(why, why_size, "its blob has %llu bytes, the entry says %llu",
                 (unsigned long long)st.st_size, (unsigned long long)r->size);
        close(fd);
        return 0;
    }
    sl_md_reset(md);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, VERIFY_PIECE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, why_size, "reading its blob failed: %s", strerror(errno));
            close(fd);
            return -1;
        }
        if (n == 0)
            break;
        sl_md_update(md, buf, (size_t)n);
        total += (uint64_t)n;
    }
    close(fd);
    uint8_t got[32], want[32];
    if (sl_md_final(md, got) != 0) {
        snprintf(why, why_size, "the digest could not be computed");
        return -1;
    }
    if (total != r->size) {
        snprintf(why, why_size, "its blob changed size while being read");
        return -1;
    }
    sl_cache_hex_parse(r->digest, want);
    if (memcmp(got, want, 32) == 0)
        return 1;
    char hex[65];
    snprintf(why, why_size, "its bytes have %s %s", sl_md_title(r->alg), sl_hex_digest(hex, got));
    return 0;
}

/* Rehashes the blobs of rows[0..n) (orphans: no entry names them) and
 * tells fn of each that is not good. An entry's bad blob is dropped with
 * its entry; an orphan's bad blob is deleted, a good one recorded (fn
 * told, why "recorded: ..."). SLUICE_OK or SLUICE_E_NOMEM. */
static int verify_rows(sluice_cache *cache, const sl_cache_row *rows, size_t n, int orphans,
                       sl_md *md[2], uint8_t *buf, uint64_t *nchecked, uint64_t *ndropped,
                       void (*fn)(void *user, const sluice_cache_entry *entry, const char *why),
                       void *user)
{
    for (size_t i = 0; i < n; i++) {
        const sl_cache_row *r = &rows[i];
        char why[256];
        int alg = r->alg == SLUICE_ALG_BLAKE3;
        sluice_cache_entry e;
        if (!sl_md_supported(r->alg)) {
            entry_of(cache, r, &e);
            snprintf(why, sizeof why, "not checked: this build cannot compute %s",
                     sl_md_title(r->alg));
            if (fn)
                fn(user, &e, why);
            continue;
        }
        if (!md[alg] && !(md[alg] = sl_md_new(r->alg)))
            return sl_fail(&cache->err, SLUICE_E_NOMEM, "out of memory verifying the cache");
        int ok = check_blob(cache, r, md[alg], buf, why, sizeof why);
        if (ok == -2)
            return sl_fail(&cache->err, SLUICE_E_NOMEM, "out of memory verifying the cache");
        if (ok == 1 && !orphans) {
            ++*nchecked;
            continue;
        }
        if (ok == 1) {
            ++*nchecked;
            int rc = sl_cache_adopt(cache->c, r, &cache->err);
            if (rc < 0)
                return rc;
            if (rc == 0)
                continue;   /* gone meanwhile: nothing to say */
            entry_of(cache, r, &e);
            snprintf(why, sizeof why, "recorded: its blob had no entry (%s); its bytes match",
                     "a fill cut short, or an index lost");
            if (fn)
                fn(user, &e, why);
            continue;
        }
        entry_of(cache, r, &e);
        if (ok == 0) {
            uint8_t d[32];
            sl_cache_hex_parse(r->digest, d);
            sl_cache_drop(cache->c, r->alg, d);
            ++*nchecked;
            ++*ndropped;
            e.present = 0;
        }
        /* one that could not be read is reported and kept: it may be a
         * passing fault, and a load verifies it again anyway */
        if (fn)
            fn(user, &e, why);
    }
    return SLUICE_OK;
}

SLUICE_API int sluice_cache_verify(sluice_cache *cache, uint64_t *checked, uint64_t *dropped,
                                   void (*fn)(void *user, const sluice_cache_entry *entry,
                                              const char *why),
                                   void *user)
{
    if (checked)
        *checked = 0;
    if (dropped)
        *dropped = 0;
    SL_TRY(begin(cache));
    sl_cache_row *rows;
    size_t n;
    int rc = sl_cache_rows(cache->c, &rows, &n, &cache->err);
    if (rc < 0)
        return rc;
    uint8_t *buf = malloc(VERIFY_PIECE);
    sl_md *md[2] = {NULL, NULL};
    uint64_t nchecked = 0, ndropped = 0;
    rc = buf ? verify_rows(cache, rows, n, 0, md, buf, &nchecked, &ndropped, fn, user)
             : sl_fail(&cache->err, SLUICE_E_NOMEM, "out of memory verifying the cache");
    sl_cache_rows_free(rows, n);
    /* then the blobs no entry names, listed after the entries were done
     * (a fill that lands meanwhile is an orphan until its insert: a
     * good one is recorded, which its own insert then updates) */
    if (rc == SLUICE_OK && (rc = sl_cache_orphans(cache->c, &rows, &n, &cache->err)) == SLUICE_OK) {
        rc = verify_rows(cache, rows, n, 1, md, buf, &nchecked, &ndropped, fn, user);
        sl_cache_rows_free(rows, n);
    }
    free(buf);
    sl_md_free(md[0]);
    sl_md_free(md[1]);
    if (checked)
        *checked = nchecked;
    if (dropped)
        *dropped = ndropped;
    return rc;
}

SLUICE_API void sluice_cache_close(sluice_cache *cache)
{
    if (!cache)
        return;
    sl_cache_close(cache->c);
    free(cache);
}
