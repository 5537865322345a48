/* hash.c: see hash.h.
 *
 * A job is one or more pieces: consecutive ranges of its bytes with a
 * digest each (one piece: the whole job). A piece is in at most one
 * worker's hands at a time, so its bytes are hashed in order; different
 * pieces of one job, and different jobs, hash in parallel. A worker takes
 * a job off the run queue, then works on any piece with arrived bytes to
 * hash (or a complete piece to finish), in slices, with the hasher's lock
 * dropped around each digest call; when it starts on one piece while
 * another also has work, it puts the job back on the queue so that a
 * second worker can join. A worker lets the job go when no piece has work
 * left for it; sl_hash_job_ready queues the job again when more bytes
 * arrive and no worker holds it. The worker that lets the job go last
 * delivers the one completion: when every piece is finished, or when the
 * job was cancelled.
 */
#include "engine/hash.h"

#include "base/digest.h"
#include "base/threads.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* The most bytes hashed between two looks at the job (a cancel waits at
 * most this long). */
#define SL_HASH_SLICE ((uint64_t)8 << 20)

typedef struct sl_piece {
    uint64_t begin, end;         /* bytes [begin, end) of the job */
    uint64_t hashed;             /* bytes of it hashed */
    sl_md *md;                   /* NULL: no digest, only the wait */
    int busy, finished;
    unsigned char digest[32];
} sl_piece;

struct sl_hash_job {
    const unsigned char *base;
    uint64_t len;
    uint64_t ready;              /* bytes arrived */
    uint64_t hashed;             /* bytes hashed, every piece */
    uint64_t busy_ns;            /* time spent in the digest calls */
    sl_piece *pieces;
    uint32_t npieces, nfinished;
    unsigned running;            /* workers holding the job */
    unsigned running_peak;       /* the most at once */
    void *owner;
    int queued, cancelled, finished, failed;
    sl_hash_job *next;           /* run queue */
};

struct sl_hasher {
    sl_hash_done_fn done;
    void *ctx;
    sluice_algorithm alg;
    pthread_mutex_t lock;
    pthread_cond_t work;         /* a job was queued, or quit */
    pthread_cond_t idle;         /* a worker let a job go */
    sl_hash_job *head, *tail;
    unsigned running;            /* workers holding a job */
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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether piece p has something for a worker: arrived bytes to hash, or
 * all its bytes hashed and the digest to finish. */
static int piece_has_work(const sl_hash_job *job, const sl_piece *p)
{
    if (p->busy || p->finished)
        return 0;
    uint64_t have = job->ready < p->end ? job->ready : p->end;
    return p->begin + p->hashed < have || (have == p->end && p->begin + p->hashed == p->end);
}

/* The next piece with work, from the first (the bytes arrive in order),
 * or NULL. */
static sl_piece *next_piece(sl_hash_job *job, const sl_piece *besides)
{
    for (uint32_t k = 0; k < job->npieces; k++)
        if (&job->pieces[k] != besides && piece_has_work(job, &job->pieces[k]))
            return &job->pieces[k];
    return NULL;
}

/* Works on job's pieces until none has work for this worker, or the job
 * was cancelled or failed. Lock held on entry and exit. */
static void work_on(sl_hasher *h, sl_hash_job *job)
{
    sl_piece *p;
    while (!job->cancelled && !job->failed && (p = next_piece(job, NULL))) {
        p->busy = 1;
        /* Another piece ready too: let a second worker join. */
        if (!job->queued && next_piece(job, p))
            enqueue(h, job);
        uint64_t have = job->ready < p->end ? job->ready : p->end;
        uint64_t from = p->begin + p->hashed, n = have - from;
        if (n > SL_HASH_SLICE)
            n = SL_HASH_SLICE;
        int finish = n == 0; /* every byte of the piece hashed: the digest */
        pthread_mutex_unlock(&h->lock);
        uint64_t t0 = now_ns();
        int ok = 1;
        if (p->md)
            ok = finish ? sl_md_final(p->md, p->digest) == 0
                        : sl_md_update(p->md, job->base + from, (size_t)n) == 0;
        uint64_t spent = now_ns() - t0;
        pthread_mutex_lock(&h->lock);
        job->busy_ns += spent;
        p->busy = 0;
        if (!ok) {
            job->failed = 1;
        } else if (finish) {
            p->finished = 1;
            job->nfinished++;
        } else {
            p->hashed += n;
            job->hashed += n;
        }
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
        job->running++;
        if (job->running > job->running_peak)
            job->running_peak = job->running;
        h->running++;
        work_on(h, job);
        /* The last worker out delivers the completion, once. */
        int status = 0, deliver = 0;
        if (--job->running == 0 && !job->finished && !job->queued) {
            if (job->cancelled)
                status = SL_HASH_CANCELLED, deliver = 1;
            else if (job->failed)
                status = SLUICE_E_NOMEM, deliver = 1;
            else if (job->nfinished == job->npieces)
                status = SLUICE_OK, deliver = 1;
        }
        if (deliver) {
            job->finished = 1;
            pthread_mutex_unlock(&h->lock);
            h->done(h->ctx, job, status); /* the job may be freed from here on */
            pthread_mutex_lock(&h->lock);
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
    int rc = sl_threads_start(&h->threads, &h->nthreads, threads ? threads : 1, worker_main, h,
                              "hashing", "thread", err);
    if (rc < 0) {
        sl_hasher_destroy(h);
        return rc;
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
                       uint64_t piece_bytes, void *owner, sl_hash_job **out)
{
    *out = NULL;
    if (!piece_bytes || piece_bytes > len)
        piece_bytes = len;
    uint64_t n = (len + piece_bytes - 1) / piece_bytes;
    if (n == 0 || n > UINT32_MAX)
        return SLUICE_E_NOMEM;
    sl_hash_job *job = calloc(1, sizeof *job);
    if (!job || !(job->pieces = calloc((size_t)n, sizeof *job->pieces))) {
        free(job);
        return SLUICE_E_NOMEM;
    }
    job->npieces = (uint32_t)n;
    for (uint64_t k = 0; k < n; k++) {
        sl_piece *p = &job->pieces[k];
        p->begin = k * piece_bytes;
        p->end = p->begin + piece_bytes < len ? p->begin + piece_bytes : len;
        if (with_digest && !(p->md = sl_md_new(h->alg))) {
            sl_hash_job_free(job);
            return SLUICE_E_NOMEM;
        }
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
    for (uint32_t k = 0; job->pieces && k < job->npieces; k++)
        sl_md_free(job->pieces[k].md);
    free(job->pieces);
    free(job);
}

void sl_hash_job_ready(sl_hasher *h, sl_hash_job *job, uint64_t ready)
{
    pthread_mutex_lock(&h->lock);
    if (ready > job->len)
        ready = job->len;
    if (ready > job->ready)
        job->ready = ready;
    /* Work to do (bytes to hash, or a piece to finish) and no worker to
     * see it: queue the job. */
    if (!job->queued && !job->running && !job->finished && !job->cancelled && !job->failed &&
        next_piece(job, NULL))
        enqueue(h, job);
    pthread_mutex_unlock(&h->lock);
}

int sl_hash_job_cancel(sl_hasher *h, sl_hash_job *job)
{
    pthread_mutex_lock(&h->lock);
    job->cancelled = 1;
    if (job->queued)
        unqueue(h, job);
    /* A finished job is being delivered by a worker that has already let
     * go of it (running is 0): its completion is on its way. */
    int quiet = !job->running && !job->finished;
    pthread_mutex_unlock(&h->lock);
    return quiet;
}

void *sl_hash_job_owner(const sl_hash_job *job)
{
    return job->owner;
}

const unsigned char *sl_hash_job_digest(const sl_hash_job *job)
{
    return job->pieces[0].digest;
}

uint32_t sl_hash_job_pieces(const sl_hash_job *job)
{
    return job->npieces;
}

const unsigned char *sl_hash_job_piece_digest(const sl_hash_job *job, uint32_t k)
{
    return job->pieces[k].digest;
}

unsigned sl_hash_job_parallel_peak(const sl_hash_job *job)
{
    return job->running_peak;
}

uint64_t sl_hash_job_hashed(const sl_hash_job *job)
{
    return job->hashed;
}

uint64_t sl_hash_job_busy_ns(const sl_hash_job *job)
{
    return job->busy_ns;
}
