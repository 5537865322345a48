/* hub.c: a Hugging Face Hub cache snapshot, verified with no setup
 * (hub.h).
 *
 * huggingface_hub keeps models--ORG--NAME/snapshots/REV/FILE as a symlink
 * to ../../blobs/<SHA-256 of the file's bytes>, the digest the Hub
 * published for the Git LFS file. That digest covers whole files only,
 * and a tensor is loaded alone: so the first open of a file that has no
 * derived manifest reads it whole once, in one pass that hashes the file
 * and, from the same bytes, each of its tensors and their 16 MiB chunks
 * (three digests of each block at once, on three threads);
 * when the file's digest is its blob's name, those digests are written as
 * a version 2 manifest of that one file (the writer of `sluice manifest`,
 * manifest_write.c) into the cache directory, keyed by the file's digest
 * (DIR/derived/sha256/HEX.manifest.json, written atomically). Every later
 * open reads it and checks each tensor as it loads, without hashing the
 * whole file again. What this trusts: the Hub's digest, then the derived
 * manifest in the cache directory, as the memo trusts its records
 * (docs/manifests.md).
 *
 * Whether the Hub's digests stand in at all, and that a sidecar wins, is
 * the trust plan's (trust_plan.h, hub_digest: SL_HUB_SNAPSHOT for
 * sl_hub_open, SL_HUB_LFS for sl_hub_open_remote), and so is the plan a
 * derived manifest is read under (sl_trust_plan_read, SL_READ_DERIVED):
 * this file acts on them, it decides none.
 *
 * An hf:// model that publishes no sluice manifest is derived the same
 * way (sl_hub_open_remote): the Hub's API lists the SHA-256 of each LFS
 * file (hf.c, the stand-in manifest of manifest.c), and the first open
 * reads each file whole through its remote source, ranged as every
 * remote read is. The derived manifests are the same files, keyed by the
 * same digests: a snapshot and its hf:// location share them.
 */
#include "api/hub.h"
#include "api/manifest_write.h"
#include "api/model.h"
#include "base/digest.h"
#include "cache/cache.h"
#include "index/source.h"
#include "trust/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_BYTES ((uint64_t)16 << 20) /* `sluice manifest`'s default */
#define READ_BYTES ((size_t)4 << 20)      /* a local file's reads */
#define READ_BYTES_NET ((size_t)16 << 20) /* a remote one's ranges */

/* What one file derives to (or what its derived manifest says). */
typedef struct hub_file {
    uint8_t blob[32];     /* the digest the Hub published: its blob's name, or the
                             SHA-256 its API lists (hf://) */
    char *blob_path;      /* the blob's real path (NULL: an hf:// file) */
    uint8_t digest[32];   /* the writer's "digest" and "size" of the file */
    uint64_t bytes;
    char *derived;        /* DIR/derived/sha256/HEX.manifest.json, or NULL (no cache) */
} hub_file;

typedef struct hub_ctx {
    sluice_model *m;
    int remote;             /* hf:// files, read through m->remote */
    hub_file *files;
    uint8_t (*tensor)[32];  /* per tensor */
    uint32_t *chunk_count;  /* per tensor */
    size_t *chunk_first;
    uint8_t (*chunks)[32];
    size_t nchunks;
} hub_ctx;

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* 1 when name is 64 lowercase hex digits, into d. */
static int hex64(const char *name, uint8_t d[32])
{
    if (strlen(name) != 64)
        return 0;
    for (size_t k = 0; k < 32; k++) {
        int hi = hexval(name[2 * k]), lo = hexval(name[2 * k + 1]);
        if (hi < 0 || lo < 0)
            return 0;
        d[k] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

/* 1 when f (opened as fd) is a snapshot file of a Hub cache: its real
 * path R/blobs/HEX, the very file opened, and its directory under
 * R/snapshots/. Sets out->blob and out->blob_path (malloc'd). -1 out of
 * memory. */
static int hub_blob(const sl_file *f, hub_file *out)
{
    if (!f->src || !(f->src->caps & SL_SRC_DESCRIPTOR) || !(f->src->caps & SL_SRC_STABLE_IDENTITY))
        return 0; /* a local file's descriptor, read by pread below */
    char *real = realpath(f->path, NULL), *dir = strdup(f->path), *realdir = NULL;
    int yes = 0;
    if (!dir || (!real && errno == ENOMEM)) { /* never "not a snapshot": its check skipped */
        free(real);
        free(dir);
        return -1;
    }
    struct stat a, b;
    char *slash = real ? strrchr(real, '/') : NULL;
    if (!slash || !dir || !hex64(slash + 1, out->blob) || fstat(f->fd, &a) != 0 ||
        stat(real, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
        goto done;
    *slash = '\0';
    char *blobs = strrchr(real, '/');
    if (!blobs || strcmp(blobs + 1, "blobs") != 0)
        goto done;
    *blobs = '\0'; /* real: the repository's directory R */
    char *dslash = strrchr(dir, '/');
    if (dslash)
        *dslash = '\0';
    if (!(realdir = realpath(dslash ? (*dir ? dir : "/") : ".", NULL)))
        goto done;
    size_t n = strlen(real);
    yes = strncmp(realdir, real, n) == 0 && strncmp(realdir + n, "/snapshots/", 11) == 0;
    *blobs = '/';
    *slash = '/';
    if (yes && !(out->blob_path = strdup(real)))
        yes = -1;
done:
    free(real);
    free(dir);
    free(realdir);
    return yes;
}

/* ---------------------------------------------------------------- deriving */

/* The derivation's pass over one file: the main thread reads each block
 * and hashes the whole file; two lanes, each on a thread of its own where
 * one can be started, hash the same block into the tensors' digests and
 * into their chunks' digests, so that the three digests of each byte are
 * computed at once. */
enum { LANE_TENSOR, LANE_CHUNK, NLANES };

struct derive_job;

typedef struct lane {
    struct derive_job *j;
    int kind;             /* LANE_TENSOR or LANE_CHUNK */
    size_t cur;           /* the tensor it is in */
    sl_md *md;
    int rc;
    int threaded;
    pthread_t tid;
} lane;

typedef struct derive_job {
    hub_ctx *c;
    const struct sluice_tensor_info *t;  /* the model's tensors, offset order in a file */
    size_t first, count;                 /* the file's: [first, first + count) */
    lane lanes[NLANES];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;                        /* the block's number, moved by the main thread */
    int ndone, nthreads, stop;
    const uint8_t *p;                    /* the block: file bytes [lo, hi) */
    uint64_t lo, hi;
    int at_end;
} derive_job;

/* Feeds the block [lo, hi) (bytes at p) to l's digests of the tensors it
 * holds. */
static int feed(lane *l, const uint8_t *p, uint64_t lo, uint64_t hi, int at_end)
{
    derive_job *j = l->j;
    hub_ctx *c = j->c;
    while (l->cur < j->first + j->count) {
        const struct sluice_tensor_info *t = &j->t[l->cur];
        uint64_t tlo = t->offset, thi = t->offset + t->nbytes;
        uint32_t nch = c->chunk_count[l->cur];
        if (tlo > hi || (tlo == hi && !at_end && t->nbytes))
            return SLUICE_OK; /* starts later */
        uint64_t a = tlo > lo ? tlo : lo, b = thi < hi ? thi : hi;
        if (l->kind == LANE_TENSOR) {
            if (a < b && sl_md_update(l->md, p + (a - lo), (size_t)(b - a)) < 0)
                return SLUICE_E_NOMEM;
        } else {
            while (nch && a < b) {
                uint64_t e = tlo + ((a - tlo) / CHUNK_BYTES + 1) * CHUNK_BYTES;
                e = e < b ? e : b;
                if (sl_md_update(l->md, p + (a - lo), (size_t)(e - a)) < 0)
                    return SLUICE_E_NOMEM;
                if ((e - tlo) % CHUNK_BYTES == 0) {
                    size_t k = c->chunk_first[l->cur] + (size_t)((e - tlo) / CHUNK_BYTES) - 1;
                    if (sl_md_final(l->md, c->chunks[k]) < 0 || sl_md_reset(l->md) < 0)
                        return SLUICE_E_NOMEM;
                }
                a = e;
            }
        }
        if (thi > hi)
            return SLUICE_OK; /* goes on in the next block */
        if (l->kind == LANE_TENSOR) {
            if (sl_md_final(l->md, c->tensor[l->cur]) < 0 || sl_md_reset(l->md) < 0)
                return SLUICE_E_NOMEM;
        } else if (nch && t->nbytes % CHUNK_BYTES) {
            size_t k = c->chunk_first[l->cur] + nch - 1;
            if (sl_md_final(l->md, c->chunks[k]) < 0 || sl_md_reset(l->md) < 0)
                return SLUICE_E_NOMEM;
        }
        l->cur++;
    }
    return SLUICE_OK;
}

static void *lane_main(void *arg)
{
    lane *l = arg;
    derive_job *j = l->j;
    uint64_t seen = 0;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (j->gen == seen && !j->stop)
            pthread_cond_wait(&j->go, &j->mu);
        if (j->stop)
            break;
        seen = j->gen;
        pthread_mutex_unlock(&j->mu);
        int rc = l->rc < 0 ? l->rc : feed(l, j->p, j->lo, j->hi, j->at_end);
        pthread_mutex_lock(&j->mu);
        l->rc = rc;
        j->ndone++;
        pthread_cond_signal(&j->done);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Hands the block to every lane (the main thread runs those that have no
 * thread); wait_block waits for them and returns the first failure. */
static void run_block(derive_job *j, const uint8_t *p, uint64_t lo, uint64_t hi, int at_end)
{
    pthread_mutex_lock(&j->mu);
    j->p = p;
    j->lo = lo;
    j->hi = hi;
    j->at_end = at_end;
    j->ndone = 0;
    j->gen++;
    pthread_cond_broadcast(&j->go);
    pthread_mutex_unlock(&j->mu);
    for (int k = 0; k < NLANES; k++)
        if (!j->lanes[k].threaded && j->lanes[k].rc == SLUICE_OK)
            j->lanes[k].rc = feed(&j->lanes[k], p, lo, hi, at_end);
}

static int wait_block(derive_job *j)
{
    pthread_mutex_lock(&j->mu);
    while (j->ndone < j->nthreads)
        pthread_cond_wait(&j->done, &j->mu);
    pthread_mutex_unlock(&j->mu);
    for (int k = 0; k < NLANES; k++)
        if (j->lanes[k].rc < 0)
            return j->lanes[k].rc;
    return SLUICE_OK;
}

static void job_stop(derive_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->stop = 1;
    pthread_cond_broadcast(&j->go);
    pthread_mutex_unlock(&j->mu);
    for (int k = 0; k < NLANES; k++) {
        if (j->lanes[k].threaded)
            pthread_join(j->lanes[k].tid, NULL);
        sl_md_free(j->lanes[k].md);
    }
    pthread_cond_destroy(&j->go);
    pthread_cond_destroy(&j->done);
    pthread_mutex_destroy(&j->mu);
}

/* Reads file f whole through its source (rc: how a remote one is reached),
 * block by block, handing each to j's lanes and hashing it into file, and
 * its first 8 + N bytes (the header) into head. */
static int read_whole(derive_job *j, const sl_file *f, const sl_remote_cfg *rc, sl_md *file,
                      sl_md *head, uint8_t *buf, size_t block, sl_err *err)
{
    uint64_t off = 0;
    for (;;) {
        size_t want = f->size - off < block ? (size_t)(f->size - off) : block, got = 0;
        unsigned requests = 0;
        if (want) {
            sl_err e = {0};
            int st = f->src->read_tensor(f, rc, buf, want, off, &got, &requests, &e);
            if (st == SL_SRC_ERRNO)
                return sl_fail(err, SLUICE_E_IO, "%s: read at %llu: %s", f->path,
                               (unsigned long long)off, strerror(errno));
            if (st < 0) {
                *err = e;
                return st;
            }
            if (got == 0)
                return sl_fail(err, SLUICE_E_FILE_CHANGED, "%s: %llu bytes read, %llu at open: "
                               "the file changed", f->path, (unsigned long long)off,
                               (unsigned long long)f->size);
        }
        run_block(j, buf, off, off + (uint64_t)got, got == 0);
        int bad = sl_md_update(file, buf, got) < 0;
        if (off < f->data_start) {
            uint64_t in_head = f->data_start - off;
            bad |= sl_md_update(head, buf, got < in_head ? got : (size_t)in_head) < 0;
        }
        if (wait_block(j) < 0 || bad)
            return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", f->path);
        off += (uint64_t)got;
        if (got == 0)
            return SLUICE_OK;
    }
}

/* One pass over file fi read through rc: its digest and size into
 * c->files[fi], its tensors' and chunks' digests into c's arrays; then
 * the file's digest must be the one the Hub published. */
static int derive_pass(hub_ctx *c, size_t fi, const sl_remote_cfg *rc, sl_err *err)
{
    const sl_index *ix = &c->m->index;
    const sl_file *f = &ix->files[fi];
    hub_file *h = &c->files[fi];
    derive_job j = {.c = c, .t = ix->tensors, .first = f->first_tensor, .count = f->tensor_count};
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.go, NULL);
    pthread_cond_init(&j.done, NULL);
    size_t block = f->src->caps & SL_SRC_NETWORK ? READ_BYTES_NET : READ_BYTES;
    uint8_t *buf = malloc(block);
    sl_md *file = sl_md_new(SLUICE_ALG_SHA256), *head = sl_md_new(SLUICE_ALG_SHA256);
    uint8_t head_digest[32];
    int rc2 = SLUICE_OK, nomem = !buf || !file || !head;
    for (int k = 0; k < NLANES; k++) {
        lane *l = &j.lanes[k];
        *l = (lane){.j = &j, .kind = k, .cur = f->first_tensor, .md = sl_md_new(SLUICE_ALG_SHA256)};
        nomem |= !l->md;
    }
    if (nomem) {
        rc2 = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", f->path);
        goto done;
    }
    for (int k = 0; k < NLANES; k++) /* without a thread, a lane runs on this one */
        if (pthread_create(&j.lanes[k].tid, NULL, lane_main, &j.lanes[k]) == 0) {
            j.lanes[k].threaded = 1;
            j.nthreads++;
        }
    if ((rc2 = read_whole(&j, f, rc, file, head, buf, block, err)) < 0)
        goto done;
    if (j.lanes[LANE_TENSOR].cur != j.first + j.count ||
        j.lanes[LANE_CHUNK].cur != j.first + j.count) {
        rc2 = sl_fail(err, SLUICE_E_FILE_CHANGED, "%s: its tensors end past its %llu bytes: the "
                      "file changed", f->path, (unsigned long long)f->size);
        goto done;
    }
    if (sl_md_final(file, h->digest) < 0 || sl_md_final(head, head_digest) < 0) {
        rc2 = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", f->path);
        goto done;
    }
    h->bytes = f->size;
    if (memcmp(h->digest, h->blob, 32) != 0) {
        char got_hex[65], want[65];
        sl_hex_digest(want, h->blob);
        sl_hex_digest(got_hex, h->digest);
        if (h->blob_path)
            rc2 = sl_fail(err, SLUICE_E_CHECKSUM, "%s: SHA-256 mismatch: expected %s (the "
                          "digest the Hugging Face Hub published, its blob's name), actual %s: "
                          "the file (%s) is damaged; download it again", f->path, want, got_hex,
                          h->blob_path);
        else
            rc2 = sl_fail(err, SLUICE_E_CHECKSUM, "%s: SHA-256 mismatch: expected %s (the "
                          "digest the Hugging Face Hub publishes for it, its LFS SHA-256), "
                          "actual %s: the bytes served are not the file published", f->path,
                          want, got_hex);
    }
    /* The index (names, dtypes, shapes, offsets) was parsed from the
     * header read at open, the derived digests from these bytes: they
     * must be one file, or a header served once (a lying server or
     * proxy) would name the published bytes. */
    const uint8_t *parsed = sl_index_header_digest(f, SLUICE_ALG_SHA256);
    if (rc2 == SLUICE_OK && (!parsed || memcmp(parsed, head_digest, 32) != 0))
        rc2 = h->blob_path
            ? sl_fail(err, SLUICE_E_FILE_CHANGED, "%s: its header is not the one read at open: "
                      "the file changed", f->path)
            : sl_fail(err, SLUICE_E_CHECKSUM, "%s: the header served at open is not the "
                      "header of the bytes served now: the index is not of the file published",
                      f->path);
done:
    job_stop(&j);
    sl_md_free(file);
    sl_md_free(head);
    free(buf);
    return rc2;
}

/* A file read again from the origin directly (sl_source_read_direct's
 * read). */
typedef struct derive_direct_args {
    hub_ctx *c;
    size_t fi;
} derive_direct_args;

static int derive_direct(const sl_remote_cfg *direct, void *ctx, uint64_t *bytes, sl_err *err)
{
    derive_direct_args *a = ctx;
    *bytes = a->c->m->index.files[a->fi].size;
    return derive_pass(a->c, a->fi, direct, err);
}

/* derive_pass; a remote file whose bytes came through a proxy and do not
 * match is read again from the origin directly, once (the remote
 * source's rule, sluice.h "Proxies"). */
static int derive(hub_ctx *c, size_t fi, sl_err *err)
{
    const sl_file *f = &c->m->index.files[fi];
    int rc = derive_pass(c, fi, c->m->remote, err);
    if (rc == SLUICE_E_CHECKSUM && c->remote) {
        derive_direct_args a = {c, fi};
        sl_err e2 = {0};
        int again = sl_source_read_direct(c->m->remote, f, rc, 1, derive_direct, &a, &e2);
        if (again != SL_SRC_NOT_PROXIED) {
            *err = e2;
            rc = again;
        }
    }
    return rc;
}

/* ---------------------------------------------------------------- derived manifests */

static sl_mw writer(const hub_ctx *c, size_t only_file)
{
    sl_mw w = {
        .form = SL_MW_V2,
        .alg = SLUICE_ALG_SHA256,
        .only_file = only_file,
        .tensor_digest = c->tensor[0],
        .tensor_stride = 32,
        .file_digest = c->files[0].digest,
        .file_stride = sizeof *c->files,
        .file_bytes = &c->files[0].bytes,
        .chunk_bytes = CHUNK_BYTES,
        .chunk_count = c->chunk_count,
        .chunk_first = c->chunk_first,
        .chunks = (const uint8_t (*)[32])c->chunks,
    };
    return w;
}

/* The text of a manifest (only_file: SIZE_MAX for the whole model), for
 * sl_manifest_from_text. */
static int manifest_text(const hub_ctx *c, size_t only_file, char **text, size_t *len, sl_err *err)
{
    *text = NULL;
    *len = 0;
    FILE *out = open_memstream(text, len);
    if (!out)
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    sl_mw w = writer(c, only_file);
    int bad = sl_manifest_write(out, c->m, &w) < 0;
    bad |= fclose(out) != 0;
    if (bad) {
        free(*text);
        *text = NULL;
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: cannot write the derived manifest");
    }
    return SLUICE_OK;
}

/* Reads h->derived, the manifest derived from file fi before, into c's
 * arrays. 1 when it is there and whole (it lists exactly file fi, its
 * blob's digest and size, every tensor of it with 16 MiB chunks where
 * they are due, nothing else); 0 when absent or not so (derived again);
 * else the failure (err set): out of memory, or the plan's refusal of a
 * record where the open asks a signature (sl_trust_plan_read fails it
 * closed: a failure of the open, never a record derived again). */
static int read_derived(hub_ctx *c, size_t fi, const char *path, sl_err *err)
{
    const sl_index *ix = &c->m->index;
    hub_file *h = &c->files[fi];
    FILE *in = h->derived ? fopen(h->derived, "re") : NULL;
    if (!in)
        return 0;
    char *text = NULL;
    size_t len = 0, cap = 0;
    int ok = 1;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *t = cap <= SLUICE_MAX_MANIFEST_BYTES ? realloc(text, cap) : NULL;
            if (!t) {
                ok = 0;
                break;
            }
            text = t;
        }
        size_t got = fread(text + len, 1, cap - len - 1, in);
        len += got;
        if (got == 0)
            break;
    }
    ok &= !ferror(in);
    fclose(in);
    if (!ok) {
        free(text);
        return 0;
    }
    text[len] = '\0';
    sl_trust_plan p;
    sl_trust_plan_read(&c->m->trust, SL_READ_DERIVED, &p);
    sl_manifest *mf = NULL;
    sl_err ignored = {0};
    char *named = strdup(h->derived);
    if (!named) {
        free(text);
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
    }
    if (sl_manifest_from_text(ix, &p, named, text, len, &mf, &ignored) < 0) {
        if (ignored.code == SLUICE_E_NOMEM || ignored.code == SLUICE_E_SIGNATURE) {
            if (err)
                *err = ignored;
            return ignored.code;
        }
        return 0;
    }
    uint64_t size = 0;
    const uint8_t *fd = sl_manifest_file_digest(mf, fi, &size);
    ok = sl_manifest_version(mf) == 2 && sl_manifest_algorithm(mf) == SLUICE_ALG_SHA256 && fd &&
         !memcmp(fd, h->blob, 32) && size == ix->files[fi].size;
    for (size_t k = 0; ok && k < ix->nfiles; k++)
        ok = k == fi || !sl_manifest_file_digest(mf, k, NULL);
    const sl_chunk_digests *ch = sl_manifest_chunks(mf);
    const sl_file *f = &ix->files[fi];
    for (size_t i = 0; ok && i < ix->ntensors; i++) {
        const uint8_t *d = sl_manifest_tensor_digest(mf, i);
        int mine = i >= f->first_tensor && i < f->first_tensor + f->tensor_count;
        ok = mine ? d != NULL : d == NULL;
        if (!ok || !mine)
            continue;
        memcpy(c->tensor[i], d, 32);
        ok = ch[i].count == c->chunk_count[i] && (!ch[i].count || ch[i].bytes == CHUNK_BYTES);
        if (ok && ch[i].count)
            memcpy(c->chunks[c->chunk_first[i]], ch[i].digest, ch[i].count * sizeof *ch[i].digest);
    }
    if (ok) {
        memcpy(h->digest, fd, 32);
        h->bytes = size;
    }
    sl_manifest_free(mf);
    return ok;
}

/* Writes file fi's derived manifest into the cache directory, atomically;
 * a cache that cannot be written only costs the next open a full read. */
static void keep_derived(const hub_ctx *c, size_t fi)
{
    const char *path = c->files[fi].derived;
    if (!path)
        return;
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash) {
        *slash = '\0';
        if (sl_cache_mkdir_p(dir) == 0) {
            sl_mw w = writer(c, fi);
            (void)sl_manifest_write_file(path, c->m, &w);
        }
    }
    free(dir);
}

/* ---------------------------------------------------------------- open */

/* 1 when the model has a sidecar manifest (which always wins); -1 out
 * of memory (never taken for one: the Hub's check would be skipped). */
static int has_sidecar(const sluice_model *m)
{
    char *cand[2];
    int nc = sl_manifest_sidecars(&m->index, sl_model_where(m), cand), yes = nc < 0 ? -1 : 0;
    for (int k = 0; k < nc; k++) {
        struct stat st;
        yes |= stat(cand[k], &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
        free(cand[k]);
    }
    return yes;
}

static void ctx_free(hub_ctx *c, size_t nfiles)
{
    for (size_t i = 0; c->files && i < nfiles; i++) {
        free(c->files[i].blob_path);
        free(c->files[i].derived);
    }
    free(c->files);
    free(c->tensor);
    free(c->chunk_count);
    free(c->chunk_first);
    free(c->chunks);
}

static int ctx_new(hub_ctx *c, sluice_model *m)
{
    const sl_index *ix = &m->index;
    size_t nt = ix->ntensors ? ix->ntensors : 1;
    c->m = m;
    c->files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *c->files);
    c->tensor = calloc(nt, sizeof *c->tensor);
    c->chunk_count = calloc(nt, sizeof *c->chunk_count);
    c->chunk_first = calloc(nt, sizeof *c->chunk_first);
    if (!c->files || !c->tensor || !c->chunk_count || !c->chunk_first)
        return -1;
    for (size_t i = 0; i < ix->ntensors; i++) {
        uint64_t n = ix->tensors[i].nbytes;
        c->chunk_first[i] = c->nchunks;
        c->chunk_count[i] = n > CHUNK_BYTES ? (uint32_t)((n + CHUNK_BYTES - 1) / CHUNK_BYTES) : 0;
        c->nchunks += c->chunk_count[i];
    }
    c->chunks = calloc(c->nchunks ? c->nchunks : 1, sizeof *c->chunks);
    return c->chunks ? 0 : -1;
}

/* Names every file's derived manifest in the cache directory (none when
 * no directory can be named: then each open derives again). */
static int name_derived(hub_ctx *c, sl_err *err)
{
    sluice_options o = c->m->opts;
    o.flags |= SLUICE_F_CACHE_DEFAULT;
    char *dir = NULL;
    SL_TRY(sl_cache_dir_for(&o, &dir, err));
    for (size_t i = 0; dir && i < c->m->index.nfiles; i++) {
        char hex[65];
        size_t n = strlen(dir) + 100;
        if (!(c->files[i].derived = malloc(n))) {
            free(dir);
            return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        }
        snprintf(c->files[i].derived, n, "%s/derived/sha256/%s.manifest.json", dir,
                 sl_hex_digest(hex, c->files[i].blob));
    }
    free(dir);
    return SLUICE_OK;
}

/* What sluice_manifest_path says: the derived manifest (one file), or
 * where they are kept. */
static char *manifest_name(const hub_ctx *c)
{
    size_t nf = c->m->index.nfiles;
    const char *d = c->files[0].derived;
    const char *whose = c->remote ? "the Hub's LFS SHA-256" : "the Hub's SHA-256";
    char *s = NULL;
    int n;
    if (nf == 1 && d)
        n = asprintf(&s, "%s (derived from %s of %s)", d, whose, c->m->index.files[0].path);
    else if (d)
        n = asprintf(&s, "%.*s (%zu manifests derived from %s of the files)",
                     (int)(strrchr(d, '/') - d), d, nf, whose);
    else
        n = asprintf(&s, "(derived in memory from %s of %zu file%s; no cache directory to keep "
                     "it)", whose, nf, nf == 1 ? "" : "s");
    return n < 0 ? NULL : s;
}

/* c's files' published digests are set: reads each file's derived
 * manifest, or derives it (and keeps it), then sets m->manifest to the
 * model's, checked under the model's plan. */
static int hub_derive_all(hub_ctx *c, const char *path, sl_err *err)
{
    sluice_model *m = c->m;
    const sl_index *ix = &m->index;
    SL_TRY(name_derived(c, err));
    for (size_t i = 0; i < ix->nfiles; i++) {
        int have = read_derived(c, i, path, err);
        if (have < 0)
            return have;
        if (have)
            continue;
        SL_TRY(derive(c, i, err));
        keep_derived(c, i);
    }
    char *text = NULL, *named = manifest_name(c);
    size_t len = 0;
    if (!named)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
    int rc = manifest_text(c, SIZE_MAX, &text, &len, err);
    if (rc < 0) {
        free(named);
        return rc;
    }
    sl_manifest *mf = NULL;
    SL_TRY(sl_manifest_from_text(ix, &m->trust, named, text, len, &mf, err));
    sl_manifest_free(m->manifest);
    m->manifest = mf;
    m->hub_snapshot = 1;
    return SLUICE_OK;
}

int sl_hub_open(sluice_model *m, const char *path, sl_err *err)
{
    const sl_index *ix = &m->index;
    if (m->trust.hub_digest != SL_HUB_SNAPSHOT || !ix->nfiles)
        return SLUICE_OK;
    /* the plan's snapshot stands in only where no sidecar lies beside the
     * model (a sidecar wins): the loader reads that one */
    int sidecar = has_sidecar(m);
    if (sidecar < 0)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
    if (sidecar)
        return SLUICE_OK;
    hub_ctx c = {0};
    int rc = SLUICE_OK;
    if (ctx_new(&c, m) < 0) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < ix->nfiles; i++) {
        int yes = hub_blob(&ix->files[i], &c.files[i]);
        if (yes < 0)
            rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
        if (yes <= 0)
            goto done; /* not a Hub snapshot: as before */
    }
    rc = hub_derive_all(&c, path, err);
done:
    ctx_free(&c, ix->nfiles);
    return rc;
}

int sl_hub_open_remote(sluice_model *m, const char *path, sl_err *err)
{
    const sl_index *ix = &m->index;
    if (m->trust.hub_digest != SL_HUB_LFS || !m->hub_files_only || !m->manifest || !ix->nfiles)
        return SLUICE_OK;
    hub_ctx c = {.remote = 1};
    int rc = SLUICE_OK;
    if (ctx_new(&c, m) < 0) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < ix->nfiles; i++) {
        const uint8_t *d = sl_manifest_file_digest(m->manifest, i, NULL);
        if (!d)
            goto done; /* a file that is no LFS object: the model stays unverified */
        memcpy(c.files[i].blob, d, 32);
    }
    if ((rc = hub_derive_all(&c, path, err)) == SLUICE_OK)
        m->hub_files_only = 0;
done:
    ctx_free(&c, ix->nfiles);
    return rc;
}
