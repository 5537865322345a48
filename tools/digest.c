/* digest.c: see digest.h.
 *
 * The work is cut into items, handed to the threads largest first so that
 * they finish together. When there are at least as many files as threads
 * and both kinds of digest are wanted, an item is a whole file read once
 * front to back: each 8 MiB piece feeds the file's digest and the digest
 * of the tensor(s) it holds, so every byte is copied out of the kernel
 * once. Otherwise (few files, or one kind only) each file and each tensor
 * is an item of its own, so that a single-file model still keeps every
 * thread busy: SHA-256 of one stream cannot be split between threads.
 */
#include "digest.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DG_PIECE ((size_t)8 << 20)

typedef struct dg_item {
    size_t file;
    int whole_file;          /* feed the file's digest; read up to its end */
    uint64_t begin, end;     /* otherwise the byte range to read */
    size_t t0, t1;           /* tensors to digest (model order: by offset) */
    uint64_t weight;         /* bytes hashed: the order of the items */
} dg_item;

typedef struct dg_tensor {
    size_t file;
    uint64_t offset, nbytes;
} dg_tensor;

struct dg_job {
    size_t nfiles, ntensors;
    const char **paths;      /* borrowed from the model */
    dg_tensor *tensor;
    dg_result *files, *tensors;
    dg_item *items;
    size_t nitems;
    atomic_size_t next;
    progress *progress;
    pthread_t *threads;
    size_t nthreads;
};

typedef struct dg_worker {
    unsigned char *buf;
    EVP_MD_CTX *file_md, *tensor_md;
} dg_worker;

static int by_weight(const void *a, const void *b)
{
    uint64_t x = ((const dg_item *)a)->weight, y = ((const dg_item *)b)->weight;
    return (x < y) - (x > y);
}

/* Marks tensors [k, t1) of an item failed with err. */
static void fail_tensors(dg_job *job, size_t k, size_t t1, int err)
{
    for (; job->tensors && k < t1; k++)
        job->tensors[k].error = err;
}

static ssize_t pread_retry(int fd, void *buf, size_t len, uint64_t off)
{
    for (;;) {
        ssize_t n = pread(fd, buf, len, (off_t)off);
        if (n >= 0 || (errno != EINTR && errno != EAGAIN))
            return n;
    }
}

static void run_item(dg_job *job, const dg_item *it, dg_worker *w)
{
    dg_result *fr = it->whole_file ? &job->files[it->file] : NULL;
    size_t k = it->t0;
    int err = 0, open_tensor = 0;
    int fd = open(job->paths[it->file], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        goto out;
    }
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    if (fr && !EVP_DigestInit_ex(w->file_md, EVP_sha256(), NULL)) {
        err = ENOMEM;
        goto out;
    }
    uint64_t pos = it->whole_file ? 0 : it->begin;
    uint64_t stop = it->whole_file ? UINT64_MAX : it->end;
    while (pos < stop) {
        size_t want = stop - pos < DG_PIECE ? (size_t)(stop - pos) : DG_PIECE;
        ssize_t got = pread_retry(fd, w->buf, want, pos);
        if (got < 0) {
            err = errno;
            break;
        }
        if (got == 0)
            break;
        uint64_t n = (uint64_t)got, piece_end = pos + n;
        if (fr) {
            if (!EVP_DigestUpdate(w->file_md, w->buf, n)) {
                err = ENOMEM;
                break;
            }
            progress_add(job->progress, n);
        }
        /* The tensors this piece holds: the last may go on into the next. */
        while (k < it->t1 && job->tensor[k].offset < piece_end) {
            const dg_tensor *t = &job->tensor[k];
            uint64_t t_end = t->offset + t->nbytes;
            if (!open_tensor && !EVP_DigestInit_ex(w->tensor_md, EVP_sha256(), NULL)) {
                err = ENOMEM;
                break;
            }
            open_tensor = 1;
            uint64_t lo = t->offset > pos ? t->offset : pos;
            uint64_t hi = t_end < piece_end ? t_end : piece_end;
            if (hi > lo) {
                if (!EVP_DigestUpdate(w->tensor_md, w->buf + (lo - pos), hi - lo)) {
                    err = ENOMEM;
                    break;
                }
                progress_add(job->progress, hi - lo);
            }
            if (t_end > piece_end)
                break;
            unsigned len = 0;
            if (!EVP_DigestFinal_ex(w->tensor_md, job->tensors[k].digest, &len)) {
                err = ENOMEM;
                break;
            }
            open_tensor = 0;
            job->tensors[k].bytes = t->nbytes;
            k++;
        }
        if (err)
            break;
        pos = piece_end;
    }
    /* An empty tensor alone reads nothing: it is there if the file still
     * reaches its offset, as it is in a pass over the whole file. */
    struct stat st;
    if (!err && !it->whole_file && it->begin == it->end) {
        if (fstat(fd, &st) != 0)
            err = errno;
        else if ((uint64_t)st.st_size < it->begin)
            pos = 0; /* short of the offset: EIO below */
    }
    /* Empty tensors at the very end of what was read. */
    while (!err && k < it->t1 && job->tensor[k].nbytes == 0 && job->tensor[k].offset <= pos) {
        unsigned len = 0;
        if (!EVP_DigestInit_ex(w->tensor_md, EVP_sha256(), NULL) ||
            !EVP_DigestFinal_ex(w->tensor_md, job->tensors[k].digest, &len))
            err = ENOMEM;
        else
            k++;
    }
    if (fr && !err) {
        unsigned len = 0;
        if (EVP_DigestFinal_ex(w->file_md, fr->digest, &len))
            fr->bytes = pos;
        else
            err = ENOMEM;
    }
out:
    if (fd >= 0)
        close(fd);
    if (fr && err)
        fr->error = err;
    /* A read error, or the file ended before these tensors did. */
    fail_tensors(job, k, it->t1, err ? err : EIO);
}

static void *dg_thread(void *arg)
{
    dg_job *job = arg;
    dg_worker w = {malloc(DG_PIECE), EVP_MD_CTX_new(), EVP_MD_CTX_new()};
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->nitems)
            break;
        const dg_item *it = &job->items[i];
        if (w.buf && w.file_md && w.tensor_md) {
            run_item(job, it, &w);
        } else {
            if (it->whole_file)
                job->files[it->file].error = ENOMEM;
            fail_tensors(job, it->t0, it->t1, ENOMEM);
        }
    }
    EVP_MD_CTX_free(w.file_md);
    EVP_MD_CTX_free(w.tensor_md);
    free(w.buf);
    return NULL;
}

/* Whether one pass per file can digest its tensors: each starts where or
 * after the previous one ended (the header validation allows no overlap,
 * but this does not rely on it). */
static int tensors_in_sequence(const dg_job *job)
{
    for (size_t i = 1; i < job->ntensors; i++) {
        const dg_tensor *a = &job->tensor[i - 1], *b = &job->tensor[i];
        if (b->file < a->file || (a->file == b->file && b->offset < a->offset + a->nbytes))
            return 0;
    }
    return 1;
}

/* Cuts the work into items (see the top of the file). */
static int plan(dg_job *job, const sluice_model *m, int files, int tensors, size_t nthreads)
{
    int fused = files && tensors && job->nfiles >= nthreads && tensors_in_sequence(job);
    size_t cap = (files ? job->nfiles : 0) + (tensors && !fused ? job->ntensors : 0);
    job->items = calloc(cap ? cap : 1, sizeof *job->items);
    if (!job->items)
        return -1;
    size_t t = 0;
    for (size_t f = 0; files && f < job->nfiles; f++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, f, &fi);
        dg_item *it = &job->items[job->nitems++];
        *it = (dg_item){.file = f, .whole_file = 1, .weight = fi.file_size};
        if (fused) {
            it->t0 = t;
            for (; t < job->ntensors && job->tensor[t].file == f; t++)
                it->weight += job->tensor[t].nbytes;
            it->t1 = t;
        }
    }
    for (size_t i = 0; tensors && !fused && i < job->ntensors; i++) {
        const dg_tensor *ti = &job->tensor[i];
        job->items[job->nitems++] = (dg_item){.file = ti->file, .begin = ti->offset,
                                              .end = ti->offset + ti->nbytes, .t0 = i,
                                              .t1 = i + 1, .weight = ti->nbytes};
    }
    qsort(job->items, job->nitems, sizeof *job->items, by_weight);
    return 0;
}

void dg_free(dg_job *job)
{
    if (!job)
        return;
    dg_wait(job, NULL, NULL);
    free(job->paths);
    free(job->tensor);
    free(job->files);
    free(job->tensors);
    free(job->items);
    free(job->threads);
    free(job);
}

dg_job *dg_start(const sluice_model *model, int files, int tensors, unsigned threads,
                 progress *p)
{
    dg_job *job = calloc(1, sizeof *job);
    if (!job)
        goto nomem;
    job->nfiles = sluice_file_count(model);
    job->ntensors = sluice_count(model);
    job->progress = p;
    atomic_init(&job->next, 0);
    job->paths = calloc(job->nfiles ? job->nfiles : 1, sizeof *job->paths);
    job->tensor = calloc(job->ntensors ? job->ntensors : 1, sizeof *job->tensor);
    if (files)
        job->files = calloc(job->nfiles ? job->nfiles : 1, sizeof *job->files);
    if (tensors)
        job->tensors = calloc(job->ntensors ? job->ntensors : 1, sizeof *job->tensors);
    if (!job->paths || !job->tensor || (files && !job->files) || (tensors && !job->tensors))
        goto nomem;
    for (size_t f = 0; f < job->nfiles; f++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        if (sluice_file_info(model, f, &fi) != SLUICE_OK)
            goto nomem;
        job->paths[f] = fi.path;
    }
    for (size_t i = 0; i < job->ntensors; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        if (sluice_info(model, i, &ti) != SLUICE_OK)
            goto nomem;
        job->tensor[i] = (dg_tensor){ti.file_index, ti.offset, ti.nbytes};
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t want = threads ? threads : (size_t)(cpus > 0 ? cpus : 1);
    if (plan(job, model, files, tensors, want) < 0)
        goto nomem;
    if (want > job->nitems)
        want = job->nitems;
    job->threads = calloc(want ? want : 1, sizeof *job->threads);
    if (!job->threads)
        goto nomem;
    for (size_t t = 0; t < want; t++) {
        if (pthread_create(&job->threads[t], NULL, dg_thread, job) != 0)
            break;
        job->nthreads++;
    }
    if (want && !job->nthreads) {
        fprintf(stderr, "sluice: cannot start a hashing thread\n");
        dg_free(job);
        return NULL;
    }
    return job;
nomem:
    fprintf(stderr, "sluice: out of memory\n");
    dg_free(job);
    return NULL;
}

void dg_wait(dg_job *job, const dg_result **files, const dg_result **tensors)
{
    for (size_t t = 0; t < job->nthreads; t++)
        pthread_join(job->threads[t], NULL);
    job->nthreads = 0;
    if (files)
        *files = job->files;
    if (tensors)
        *tensors = job->tensors;
}
