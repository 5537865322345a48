/* hash.c: see hash.h.
 *
 * A job is on the run queue at most once and in one worker's hands at
 * most once (queued, running). A worker hashes every byte that has
 * arrived, in slices, with the hasher's lock dropped around each digest
 * update; when it catches up with the arrivals it lets the job go, and
 * sl_hash_job_ready queues it again when more arrive. Nobody else touches
 * a job's digest context while a worker holds it.
 */
#include "hash.h"

#include "digest.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* The most bytes hashed between two looks at the job (a cancel waits at
 * most this long). */
#define SL_HASH_SLICE ((uint64_t)8 << 20)

struct sl_hash_job {
    const unsigned char *base;
    uint64_t len;
    uint64_t ready;              /* bytes arrived */
    uint64_t hashed;             /* bytes hashed */
    uint64_t busy_ns;            /* time spent in the digest calls */
    sl_md *md;                   /* NULL: no digest, only the wait */
    void *owner;
    int queued, running, cancelled, finished;
    sl_hash_job *next;           /* run queue */
    unsigned char digest[32];
};

struct sl_hasher {
    sl_hash_done_fn done;
    void *ctx;
    sluice_algorithm alg;
    pthread_mutex_t lock;
    pthread_cond_t work;         /* a job was queued, or quit */
    pthread_cond_t idle;         /* a worker let a job go */
    sl_hash_job *head, *tail;
    unsigned running;            /* jobs in workers' hands */
    int quit;
    pthread_t *threads;
    unsigned nthreads;
};

static void enqueue(sl_hasher *h, sl_hash_job *job)
{
    job->queued = 1;
    job->next = NULL;
    if (h->tail)
        h->tail->next = job;
    else
        h->head = job;
    h->tail = job;
    pthread_cond_signal(&h->work);
}

static void unqueue(sl_hasher *h, sl_hash_job *job)
{
    sl_hash_job *prev = NULL;
    for (sl_hash_job *j = h->head; j; prev = j, j = j->next)
        if (j == job) {
            if (prev)
                prev->next = j->next;
            else
                h->head = j->next;
            if (h->tail == j)
                h->tail = prev;
            break;
        }
    job->queued = 0;
}

enum { STILL_OPEN = 2 };

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Works on job until it is done, cancelled or waiting for bytes. Lock
 * held on entry and exit. Returns the completion status, or STILL_OPEN. */
static int work_on(sl_hasher *h, sl_hash_job *job)
{
    for (;;) {
        if (job->cancelled)
            return SL_HASH_CANCELLED;
        if (job->hashed < job->ready) {
            uint64_t from = job->hashed, n = job->ready - job->hashed;
            if (n > SL_HASH_SLICE)
                n = SL_HASH_SLICE;
            int ok = 1;
            if (job->md) {
                pthread_mutex_unlock(&h->lock);
                uint64_t t0 = now_ns();
                ok = sl_md_update(job->md, job->base + from, (size_t)n) == 0;
                job->busy_ns += now_ns() - t0;
                pthread_mutex_lock(&h->lock);
            }
            if (!ok)
                return SLUICE_E_NOMEM;
            job->hashed += n;
            continue;
        }
        if (job->ready < job->len)
            return STILL_OPEN;
        int ok = 1;
        if (job->md) {
            pthread_mutex_unlock(&h->lock);
            uint64_t t0 = now_ns();
            ok = sl_md_final(job->md, job->digest) == 0;
            job->busy_ns += now_ns() - t0;
            pthread_mutex_lock(&h->lock);
        }
        return ok ? SLUICE_OK : SLUICE_E_NOMEM;
    }
}

static void *worker_main(void *arg)
{
    sl_hasher *h = arg;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (!h->head && !h->quit)
            pthread_cond_wait(&h->work, &h->lock);
        if (h->quit)
            break;
        sl_hash_job *job = h->head;
        unqueue(h, job);
        job->running = 1;
        h->running++;
        int status = work_on(h, job);
        if (status != STILL_OPEN) {
            job->finished = 1;
            pthread_mutex_unlock(&h->lock);
            h->done(h->ctx, job, status); /* the job may be freed from here on */
            pthread_mutex_lock(&h->lock);
        } else {
            job->running = 0;
        }
        h->running--;
        pthread_cond_broadcast(&h->idle);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

int sl_hasher_create(unsigned threads, sluice_algorithm alg, sl_hash_done_fn done, void *ctx,
                     sl_hasher **out, sl_err *err)
{
    *out = NULL;
    sl_hasher *h = calloc(1, sizeof *h);
    if (!h)
        return sl_fail(err, SLUICE_E_NOMEM, "hashing: out of memory");
    h->done = done;
    h->ctx = ctx;
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        free(h);
        return sl_fail(err, SLUICE_E_NOMEM, "hashing: cannot create a mutex");
    }
    pthread_cond_init(&h->work, NULL);
    pthread_cond_init(&h->idle, NULL);
    h->alg = alg;
    sl_md *probe = sl_md_new(alg);
    if (!probe) {
        sl_hasher_destroy(h);
        return sl_fail(err, SLUICE_E_NOMEM, "hashing: cannot make a %s context",
                       sluice_algorithm_name(alg));
    }
    sl_md_free(probe);
    unsigned n = threads ? threads : 1;
    if (!(h->threads = calloc(n, sizeof *h->threads))) {
        sl_hasher_destroy(h);
        return sl_fail(err, SLUICE_E_NOMEM, "hashing: out of memory");
    }
    for (; h->nthreads < n; h->nthreads++) {
        int rc = pthread_create(&h->threads[h->nthreads], NULL, worker_main, h);
        if (rc != 0) {
            sl_hasher_destroy(h);
            return sl_fail_errno(err, SLUICE_E_NOMEM, rc, "hashing: cannot start a thread");
        }
    }
    *out = h;
    return SLUICE_OK;
}

void sl_hasher_destroy(sl_hasher *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->lock);
    h->quit = 1;
    while (h->head)
        unqueue(h, h->head);
    pthread_cond_broadcast(&h->work);
    pthread_mutex_unlock(&h->lock);
    for (unsigned k = 0; k < h->nthreads; k++)
        pthread_join(h->threads[k], NULL);
    free(h->threads);
    pthread_cond_destroy(&h->idle);
    pthread_cond_destroy(&h->work);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

void sl_hasher_wait_idle(sl_hasher *h)
{
    pthread_mutex_lock(&h->lock);
    while (h->head || h->running)
        pthread_cond_wait(&h->idle, &h->lock);
    pthread_mutex_unlock(&h->lock);
}

int sl_hash_job_create(sl_hasher *h, const unsigned char *base, uint64_t len, int with_digest,
                       void *owner, sl_hash_job **out)
{
    *out = NULL;
    sl_hash_job *job = calloc(1, sizeof *job);
    if (!job)
        return SLUICE_E_NOMEM;
    if (with_digest && !(job->md = sl_md_new(h->alg))) {
        sl_hash_job_free(job);
        return SLUICE_E_NOMEM;
    }
    job->base = base;
    job->len = len;
    job->owner = owner;
    *out = job;
    return SLUICE_OK;
}

void sl_hash_job_free(sl_hash_job *job)
{
    if (!job)
        return;
    sl_md_free(job->md);
    free(job);
}

void sl_hash_job_ready(sl_hasher *h, sl_hash_job *job, uint64_t ready)
{
    pthread_mutex_lock(&h->lock);
    if (ready > job->len)
        ready = job->len;
    if (ready > job->ready)
        job->ready = ready;
    /* Work to do: bytes to hash, or the end to finish. */
    if (!job->queued && !job->running && !job->finished && !job->cancelled &&
        (job->hashed < job->ready || job->ready == job->len))
        enqueue(h, job);
    pthread_mutex_unlock(&h->lock);
}

int sl_hash_job_cancel(sl_hasher *h, sl_hash_job *job)
{
    pthread_mutex_lock(&h->lock);
    job->cancelled = 1;
    if (job->queued)
        unqueue(h, job);
    int quiet = !job->running;
    pthread_mutex_unlock(&h->lock);
    return quiet;
}

void *sl_hash_job_owner(const sl_hash_job *job)
{
    return job->owner;
}

const unsigned char *sl_hash_job_digest(const sl_hash_job *job)
{
    return job->digest;
}

uint64_t sl_hash_job_hashed(const sl_hash_job *job)
{
    return job->hashed;
}

uint64_t sl_hash_job_busy_ns(const sl_hash_job *job)
{
    return job->busy_ns;
}
