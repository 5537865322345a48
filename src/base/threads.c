/* threads.c: a component's worker threads, started as a group (threads.h). */
#include "base/threads.h"

#include <stdlib.h>

int sl_threads_start(pthread_t **threads, unsigned *started, unsigned n, void *(*fn)(void *),
                     void *arg, const char *what, const char *noun, sl_err *err)
{
    if (!(*threads = calloc(n, sizeof **threads)))
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", what);
    for (; *started < n; (*started)++) {
        int rc = pthread_create(&(*threads)[*started], NULL, fn, arg);
        if (rc != 0)
            return sl_fail_errno(err, SLUICE_E_NOMEM, rc, "%s: cannot start a %s", what, noun);
    }
    return SLUICE_OK;
}
