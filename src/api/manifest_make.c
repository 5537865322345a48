/* manifest_make.c: sluice_manifest_write, the manifests the library
 * makes (`sluice manifest`, `sluice synth` through it, and the Python
 * package's sluice.write_manifest): version 2 by default, every tensor's
 * digest, dtype, shape and size, every file's digest, size and header
 * digest; chunk and part digests on request (see "Manifests" in sluice.h).
 * The JSON is written by the one writer, manifest_write.c (sl_manifest_write,
 * the Hub snapshot's derived manifests' too); this file computes what it
 * writes.
 *
 * The model is opened by the caller (its index only is needed, which
 * digests each header as it parses it); the digests of every tensor and
 * every whole file are computed by the verify-only path (sluice_verify,
 * digests only): a manifest is a statement about the files, not a load,
 * so nothing goes through the buffer pool and the bytes are hashed where
 * they lie in the page cache. Nothing is written unless every tensor and
 * file was read, and no file changed while its digests were computed.
 */
#include "api/manifest_write.h"
#include "api/model.h"
#include "base/error.h"

#include <sluice.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

SLUICE_API int sluice_manifest_options_init(sluice_manifest_options *o)
{
    if (!o)
        return SLUICE_E_INVAL;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->version = 2;
    o->chunk_bytes = (uint64_t)16 << 20;
    o->worlds[0] = 2;
    o->worlds[1] = 4;
    o->worlds[2] = 8;
    o->nworlds = 3;
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- digests */

typedef struct mw_result {
    uint8_t digest[32];
    uint64_t bytes;     /* bytes hashed (a file: its size as read) */
    int ok;             /* every byte was read and hashed */
} mw_result;

typedef struct mw_digests {
    mw_result *tensors, *files;
    size_t ntensors, nfiles;
    long failed;
    const sluice_manifest_options *o;
    sl_err *err;        /* the first failure */
} mw_digests;

/* A failure the caller hears of (on_failure), the first one kept. */
static void failure(const sluice_manifest_options *o, sl_err *err, int code, const char *msg)
{
    if (o->on_failure)
        o->on_failure(o->user, msg);
    if (err->code == SLUICE_OK)
        sl_fail(err, code < 0 ? code : SLUICE_E_IO, "%s", msg);
}

static int on_item(void *user, const struct sluice_verify_item *it)
{
    mw_digests *s = user;
    int file = it->kind == SLUICE_VERIFY_ITEM_FILE;
    mw_result *r = file ? (it->index < s->nfiles ? &s->files[it->index] : NULL)
                        : (it->index < s->ntensors ? &s->tensors[it->index] : NULL);
    if (s->o->on_bytes)
        s->o->on_bytes(s->o->user, it->bytes);
    if (!r)
        return 0;
    r->bytes = it->bytes;
    r->ok = it->status == SLUICE_OK && it->has_digest;
    memcpy(r->digest, it->digest, 32);
    if (!r->ok) {
        failure(s->o, s->err, it->status, it->message && *it->message ? it->message
                                                                       : sluice_strerror(it->status));
        s->failed++;
    }
    return 0;
}

/* The digest of every tensor and (files) every file, into s. Returns
 * the failed items, or -1 when nothing could be done (err set). */
static long compute_digests(sluice_model *m, int files, mw_digests *s, sl_err *err)
{
    s->ntensors = sluice_count(m);
    s->nfiles = files ? sluice_file_count(m) : 0;
    s->err = err;
    s->tensors = calloc(s->ntensors ? s->ntensors : 1, sizeof *s->tensors);
    s->files = calloc(s->nfiles ? s->nfiles : 1, sizeof *s->files);
    if (!s->tensors || !s->files) {
        sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
        return -1;
    }
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_DIGEST_ONLY | (files ? SLUICE_VF_FILES : 0);
    vo.threads = s->o->threads;
    vo.on_item = on_item;
    vo.user = s;
    int rc = sluice_verify(m, NULL, 0, &vo, NULL);
    if (rc != SLUICE_OK && rc != SLUICE_E_IO && rc != SLUICE_E_FILE_CHANGED) {
        sl_fail(err, rc, "%s", sluice_errmsg(m));
        return -1;
    }
    return s->failed;
}

/* ---------------------------------------------------------------- chunks, parts */

/* Part digests: per tensor its dim (SLUICE_PART_REPLICATED: none) and,
 * for each world size that divides it, that many digests. */
typedef struct part_set {
    const uint64_t *worlds;
    size_t nworlds;
    int *dim;
    uint8_t (**digest)[32];   /* per tensor: the worlds' digests, one after the other */
} part_set;

/* Chunk digests: per tensor, its first digest in all[] (count 0: none). */
typedef struct chunk_set {
    uint64_t bytes;
    uint32_t *count;
    size_t *first;
    uint8_t (*all)[32];
    size_t total;
    /* the work, shared by the threads */
    sluice_model *m;
    size_t *tensor_of;          /* per digest: its tensor */
    atomic_size_t next;
    atomic_int failed;
    sl_err first_err;           /* the first failure's (its writer: failed 0 -> 1) */
    const part_set *parts;      /* written after the chunks */
} chunk_set;

static void part_set_free(part_set *ps, size_t n)
{
    for (size_t i = 0; ps->digest && i < n; i++)
        free(ps->digest[i]);
    free(ps->digest);
    free(ps->dim);
}

/* The part digests of every tensor the rules split, for each world size
 * that divides its dim. Returns 0, or -1 with err set. */
static int compute_parts(sluice_model *m, const sluice_part_rules *rules, part_set *ps, sl_err *err)
{
    size_t n = sluice_count(m);
    ps->dim = calloc(n ? n : 1, sizeof *ps->dim);
    ps->digest = calloc(n ? n : 1, sizeof *ps->digest);
    if (!ps->dim || !ps->digest)
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory"), -1;
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &ti);
        int dim;
        if (sluice_part_rules_dim(rules, ti.name, ti.ndim, &dim) != SLUICE_OK) {
            char q[SL_QUOTE_MAX];
            sl_fail(err, SLUICE_E_INVAL, "manifest: parts: tensor %s: the rules split it along "
                    "dim %d; it has %u", sl_quote(q, sizeof q, ti.name, ti.name_len), dim, ti.ndim);
            return -1;
        }
        ps->dim[i] = dim;
        if (dim == SLUICE_PART_REPLICATED)
            continue;
        size_t total = 0;
        for (size_t w = 0; w < ps->nworlds; w++)
            total += ti.shape[dim] % ps->worlds[w] ? 0 : ps->worlds[w];
        if (!total) {
            ps->dim[i] = SLUICE_PART_REPLICATED;
            continue;
        }
        if (!(ps->digest[i] = malloc(total * sizeof *ps->digest[i])))
            return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory"), -1;
        size_t at = 0;
        for (size_t w = 0; w < ps->nworlds; w++)
            for (uint64_t r = 0; !(ti.shape[dim] % ps->worlds[w]) && r < ps->worlds[w]; r++) {
                int rc = sluice_digest_part(m, i, (uint32_t)dim, r, ps->worlds[w],
                                            ps->digest[i][at++]);
                if (rc != SLUICE_OK)
                    return sl_fail(err, rc, "%s", sluice_errmsg(m)), -1;
            }
    }
    return 0;
}

static void *chunk_worker(void *arg)
{
    chunk_set *cs = arg;
    for (size_t k; (k = atomic_fetch_add(&cs->next, 1)) < cs->total && !atomic_load(&cs->failed);) {
        size_t i = cs->tensor_of[k];
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(cs->m, i, &info);
        uint64_t lo = (uint64_t)(k - cs->first[i]) * cs->bytes;
        uint64_t hi = lo + cs->bytes < info.nbytes ? lo + cs->bytes : info.nbytes;
        int rc = sluice_digest_range(cs->m, i, lo, hi, cs->all[k]);
        /* the message is this thread's: kept by the one that failed first */
        if (rc != SLUICE_OK && !atomic_exchange(&cs->failed, 1))
            sl_fail(&cs->first_err, rc, "%s", sluice_errmsg(cs->m));
    }
    return NULL;
}

/* The chunk digests of every tensor larger than bytes, on threads
 * threads. Returns 0, or -1 with err set. */
static int compute_chunks(sluice_model *m, uint64_t bytes, unsigned threads, chunk_set *cs,
                          sl_err *err)
{
    size_t n = sluice_count(m);
    cs->bytes = bytes;
    cs->m = m;
    cs->count = calloc(n ? n : 1, sizeof *cs->count);
    cs->first = calloc(n ? n : 1, sizeof *cs->first);
    if (!cs->count || !cs->first)
        goto nomem;
    for (size_t i = 0; bytes && i < n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &info);
        cs->first[i] = cs->total;
        if (info.nbytes > bytes) {
            cs->count[i] = (uint32_t)((info.nbytes + bytes - 1) / bytes);
            cs->total += cs->count[i];
        }
    }
    if (!cs->total)
        return 0;
    cs->all = malloc(cs->total * sizeof *cs->all);
    cs->tensor_of = malloc(cs->total * sizeof *cs->tensor_of);
    if (!cs->all || !cs->tensor_of)
        goto nomem;
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < cs->count[i]; k++)
            cs->tensor_of[cs->first[i] + k] = i;
    if (!threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (unsigned)cpus;
    }
    pthread_t tid[64];
    unsigned started = 0;
    for (; started < threads && started < 64; started++)
        if (pthread_create(&tid[started], NULL, chunk_worker, cs) != 0)
            break;
    if (!started)
        chunk_worker(cs);
    for (unsigned t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    if (atomic_load(&cs->failed)) {
        *err = cs->first_err;
        return -1;
    }
    return 0;
nomem:
    sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    return -1;
}

static void chunk_set_free(chunk_set *cs)
{
    free(cs->count);
    free(cs->first);
    free(cs->all);
    free(cs->tensor_of);
}

/* What says a file is the same file with the same bytes: the manifest is
 * written from two passes (whole digests, then chunk digests), and a file
 * changed in between would pair old whole digests with new chunks. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} file_id;

static int take_ids(const sluice_model *m, file_id *ids)
{
    for (size_t i = 0; i < sluice_file_count(m); i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        struct stat st;
        if (sluice_file_info(m, i, &fi) != SLUICE_OK || stat(fi.path, &st) != 0)
            return -1;
        ids[i] = (file_id){st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
    }
    return 0;
}

static int same_ids(const file_id *a, const file_id *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i].dev != b[i].dev || a[i].ino != b[i].ino || a[i].size != b[i].size ||
            a[i].mtime.tv_sec != b[i].mtime.tv_sec || a[i].mtime.tv_nsec != b[i].mtime.tv_nsec ||
            a[i].ctime.tv_sec != b[i].ctime.tv_sec || a[i].ctime.tv_nsec != b[i].ctime.tv_nsec)
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- JSON */

/* A tensor's part digests, after its other fields (sl_mw.extra). */
static void write_parts(FILE *out, void *user, const struct sluice_tensor_info *info)
{
    const part_set *ps = user;
    if (ps->dim[info->index] == SLUICE_PART_REPLICATED)
        return;
    char hex[65];
    int dim = ps->dim[info->index];
    fprintf(out, ", \"parts\": {\"dim\": %d, \"digests\": {", dim);
    size_t at = 0, first = 1;
    for (size_t w = 0; w < ps->nworlds; w++) {
        if (info->shape[dim] % ps->worlds[w])
            continue;
        fprintf(out, "%s\"%llu\": [", first ? "" : ", ", (unsigned long long)ps->worlds[w]);
        first = 0;
        for (uint64_t r = 0; r < ps->worlds[w]; r++)
            fprintf(out, "%s\"%s\"", r ? ", " : "",
                    sluice_digest_hex(ps->digest[info->index][at++], hex));
        fputs("]", out);
    }
    fputs("}}", out);
}

/* What the writer writes: the digests of d, cs's chunks and parts. */
static sl_mw writer_of(const sluice_model *m, const mw_digests *d, int version,
                       const chunk_set *cs)
{
    return (sl_mw){
        .form = version == 2 ? SL_MW_V2 : version == 1 ? SL_MW_V1 : SL_MW_FLAT,
        .alg = sluice_digest_algorithm(m),
        .only_file = SIZE_MAX,
        .tensor_digest = d->tensors[0].digest,
        .tensor_stride = sizeof *d->tensors,
        .file_digest = d->files[0].digest,
        .file_stride = sizeof *d->files,
        .file_bytes = &d->files[0].bytes,
        .chunk_bytes = cs->bytes,
        .chunk_count = cs->count,
        .chunk_first = cs->first,
        .chunks = (const uint8_t (*)[32])cs->all,
        .extra = cs->parts ? write_parts : NULL,
        .user = (void *)cs->parts,
    };
}

/* Writes to path through a temporary file in the same directory, fsynced
 * and renamed over path once complete (sl_manifest_write_file); or, path
 * NULL, to fd. Returns 0, or -1 with err set. */
static int write_out(const char *path, int fd, const sluice_model *m, const mw_digests *d,
                     int version, const chunk_set *cs, sl_err *err)
{
    sl_mw w = writer_of(m, d, version, cs);
    if (path) {
        if (sl_manifest_write_file(path, m, &w) < 0)
            return sl_fail_errno(err, errno == ENOMEM ? SLUICE_E_NOMEM : SLUICE_E_IO, errno,
                                 "manifest: cannot write %s", path), -1;
        return 0;
    }
    int dup_fd = dup(fd);
    FILE *out = dup_fd >= 0 ? fdopen(dup_fd, "w") : NULL;
    if (!out) {
        if (dup_fd >= 0)
            close(dup_fd);
        return sl_fail_errno(err, SLUICE_E_IO, errno, "manifest: descriptor %d", fd), -1;
    }
    int bad = sl_manifest_write(out, m, &w) < 0 || fflush(out) != 0;
    int e = errno;
    if (fclose(out) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? (sl_fail_errno(err, SLUICE_E_IO, e, "manifest: writing it"), -1) : 0;
}

/* ---------------------------------------------------------------- the call */

static int check_options(const sluice_manifest_options *o, sl_err *err)
{
    if (o->size < sizeof o->size || o->size > sizeof *o)
        return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: options size %zu is not one "
                       "this library knows", o->size);
    if (o->version < 0 || o->version > 2)
        return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: version %d is not 0 (flat), "
                       "1 or 2", o->version);
    if (o->version != 2 && o->parts)
        return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: part digests need version 2");
    if (o->chunk_bytes && o->chunk_bytes < 4096)
        return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: chunk_bytes %llu is below "
                       "4096", (unsigned long long)o->chunk_bytes);
    if (o->parts && (o->nworlds == 0 || o->nworlds > 8))
        return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: nworlds %zu is not 1..8",
                       o->nworlds);
    for (size_t w = 0; o->parts && w < o->nworlds; w++) {
        if (o->worlds[w] < 2 || o->worlds[w] > 65536)
            return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: world size %llu is not "
                           "2..65536", (unsigned long long)o->worlds[w]);
        for (size_t k = 0; k < w; k++)
            if (o->worlds[k] == o->worlds[w])
                return sl_fail(err, SLUICE_E_INVAL, "sluice_manifest_write: world size %llu "
                               "listed twice", (unsigned long long)o->worlds[w]);
    }
    return SLUICE_OK;
}

SLUICE_API int sluice_manifest_write(sluice_model *m, const char *path, int fd,
                                     const sluice_manifest_options *opts)
{
    sl_err err = {0};
    if (sl_model_usable(m) < 0)
        return SLUICE_E_INVAL;
    sluice_manifest_options o;
    if (!opts) {
        sluice_manifest_options_init(&o);
    } else {
        sluice_manifest_options_init(&o);
        if (check_options(opts, &err) < 0)
            return sl_model_error(m, &err);
        memcpy(&o, opts, opts->size);
        o.size = sizeof o;
    }
    if (!path && fd < 0) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_manifest_write: no path and no descriptor");
        return sl_model_error(m, &err);
    }
    if (o.version != 2 && sluice_digest_algorithm(m) != SLUICE_ALG_SHA256) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_manifest_write: %s needs version 2",
                sluice_algorithm_name(sluice_digest_algorithm(m)));
        return sl_model_error(m, &err);
    }
    size_t n = sluice_count(m), nf = sluice_file_count(m);
    int files = o.version != 0;
    mw_digests d = {.o = &o};
    chunk_set cs = {0};
    part_set ps = {.worlds = o.worlds, .nworlds = o.nworlds};
    file_id *before = calloc(nf ? nf : 1, sizeof *before), *after = calloc(nf ? nf : 1, sizeof *after);
    int rc = -1;
    if (!before || !after) {
        sl_fail(&err, SLUICE_E_NOMEM, "manifest: out of memory");
        goto done;
    }
    if (take_ids(m, before) < 0) {
        sl_fail_errno(&err, SLUICE_E_IO, errno, "manifest: cannot stat the model's files");
        goto done;
    }
    long failed = compute_digests(m, files, &d, &err);
    if (failed < 0)
        goto done;
    for (size_t i = 0; files && i < nf; i++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, i, &fi);
        if (d.files[i].ok && d.files[i].bytes != fi.file_size) {
            char msg[SL_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s: %llu bytes now, %llu at open: the file changed",
                     fi.path, (unsigned long long)d.files[i].bytes,
                     (unsigned long long)fi.file_size);
            failure(&o, &err, SLUICE_E_FILE_CHANGED, msg);
            failed++;
        }
    }
    if (!failed && o.version == 2 && compute_chunks(m, o.chunk_bytes, o.threads, &cs, &err) < 0)
        failed++;
    if (!failed && o.parts && compute_parts(m, o.parts, &ps, &err) < 0)
        failed++;
    if (o.parts)
        cs.parts = &ps;
    if (!failed && (take_ids(m, after) < 0 || !same_ids(before, after, nf))) {
        sl_fail(&err, SLUICE_E_FILE_CHANGED, "manifest: a file of the model changed (or was "
                "replaced) while its digests were computed");
        failed++;
    }
    if (failed) {
        char first[SL_ERRMSG_MAX];
        snprintf(first, sizeof first, "%s", err.msg);
        sl_fail(&err, err.code ? err.code : SLUICE_E_IO, "%ld failure%s, nothing written; the "
                "first: %s", failed, failed == 1 ? "" : "s", first);
        goto done;
    }
    if (write_out(path, fd, m, &d, o.version, &cs, &err) < 0)
        goto done;
    rc = SLUICE_OK;
done:
    chunk_set_free(&cs);
    part_set_free(&ps, n);
    free(before);
    free(after);
    free(d.tensors);
    free(d.files);
    return rc == SLUICE_OK ? SLUICE_OK : sl_model_error(m, &err);
}
