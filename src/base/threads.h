/* threads.h: a component's worker threads, started as a group (threads.c). */
#ifndef SLUICE_THREADS_H
#define SLUICE_THREADS_H

#include "base/error.h"

#include <pthread.h>

/* Starts n threads running fn(arg) into *threads (an array of n, calloc'd
 * here), counting each one started in *started (0 on entry), so that the
 * caller's teardown joins those and frees the array. A failure leaves the
 * ones started running for that teardown and is worded in err: "<what>:
 * out of memory", or "<what>: cannot start a <noun>" with pthread_create's
 * error; SLUICE_E_NOMEM. */
int sl_threads_start(pthread_t **threads, unsigned *started, unsigned n, void *(*fn)(void *),
                     void *arg, const char *what, const char *noun, sl_err *err);

#endif
