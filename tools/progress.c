/* progress.c: see progress.h. */
#include "progress.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct progress {
    const char *label;
    uint64_t total;
    _Atomic uint64_t done;
    double start;
    pthread_t thread;
    pthread_mutex_t lock;   /* the terminal line */
    pthread_cond_t wake;
    int stop;
    int drawn;              /* a bar is on the line */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *progress_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

/* Draws the bar; the lock is held. */
static void draw(progress *p)
{
    uint64_t done = atomic_load(&p->done);
    if (done > p->total)
        done = p->total;
    double dt = now_s() - p->start, frac = p->total ? (double)done / (double)p->total : 1.0;
    double rate = dt > 0 ? (double)done / dt : 0;
    char bar[31], d[32], t[32], r[32], eta[32] = "--:--";
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    if (rate > 0 && done < p->total) {
        unsigned long s = (unsigned long)((double)(p->total - done) / rate + 0.5);
        snprintf(eta, sizeof eta, "%lu:%02lu:%02lu", s / 3600, s / 60 % 60, s % 60);
    } else if (done >= p->total) {
        snprintf(eta, sizeof eta, "0:00:00");
    }
    fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %s / %s  %s/s  ETA %s", p->label, bar, frac * 100,
            progress_bytes(done, d, sizeof d), progress_bytes(p->total, t, sizeof t),
            progress_bytes((uint64_t)rate, r, sizeof r), eta);
    fflush(stderr);
    p->drawn = 1;
}

static void clear(progress *p)
{
    if (p->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        p->drawn = 0;
    }
}

static void *ticker(void *arg)
{
    progress *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        draw(p);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!p->stop && pthread_cond_timedwait(&p->wake, &p->lock, &ts) != ETIMEDOUT)
            ;
    }
    clear(p);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

progress *progress_start(const char *label, uint64_t total, int quiet)
{
    if (quiet || !isatty(STDERR_FILENO))
        return NULL;
    progress *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->label = label;
    p->total = total;
    p->start = now_s();
    atomic_init(&p->done, 0);
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->wake, NULL) != 0) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    if (pthread_create(&p->thread, NULL, ticker, p) != 0) {
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    return p;
}

void progress_add(progress *p, uint64_t bytes)
{
    if (p)
        atomic_fetch_add(&p->done, bytes);
}

void progress_printf(progress *p, FILE *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!p) {
        vfprintf(out, fmt, ap);
        va_end(ap);
        return;
    }
    pthread_mutex_lock(&p->lock);
    clear(p);
    vfprintf(out, fmt, ap);
    fflush(out);
    pthread_mutex_unlock(&p->lock);
    va_end(ap);
}

void progress_stop(progress *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
