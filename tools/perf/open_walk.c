/* The walk of sluice_open's path: which files of src/ the calling thread
 * passes through, in order, while sluice_open opens one model. Built by
 * open_walk.sh against a libsluice.so compiled with -finstrument-functions;
 * every library function entered or left on this thread appends the file on
 * depth and the file on top of the call stack, and open_walk.sh folds that
 * into stays (runs in one file) and returns (a stay in a file already left). A measuring tool for
 * docs and issue notes, not a test: it asserts nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"

#define NO_TRACE __attribute__((no_instrument_function))

enum { max_depth = 4096 };

struct walk {
    FILE *out;
    pthread_t thread;
    int on;
    int depth;
    uintptr_t stack[max_depth]; /* offsets into libsluice.so, 0 = outside */
};

static struct walk walk; /* one per process: the hooks have no context argument */

NO_TRACE static uintptr_t library_offset(void *fn)
{
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_fname || !strstr(info.dli_fname, "libsluice"))
        return 0;
    return (uintptr_t)fn - (uintptr_t)info.dli_fbase;
}

NO_TRACE static void note_top(void)
{
    uintptr_t top = walk.depth > 0 ? walk.stack[walk.depth - 1] : 0;
    fprintf(walk.out, "%d %#lx\n", walk.depth, (unsigned long)top);
}

NO_TRACE void __cyg_profile_func_enter(void *fn, void *call_site)
{
    (void)call_site;
    if (!walk.on || !pthread_equal(pthread_self(), walk.thread))
        return;
    if (walk.depth < max_depth)
        walk.stack[walk.depth] = library_offset(fn);
    walk.depth++;
    note_top();
}

NO_TRACE void __cyg_profile_func_exit(void *fn, void *call_site)
{
    (void)fn;
    (void)call_site;
    if (!walk.on || !pthread_equal(pthread_self(), walk.thread) || walk.depth == 0)
        return;
    walk.depth--;
    note_top();
}

NO_TRACE int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: open_walk MODEL TRACE_OUT\n");
        return 2;
    }
    walk.out = fopen(argv[2], "w");
    if (!walk.out) {
        perror(argv[2]);
        return 2;
    }
    walk.thread = pthread_self();
    sluice_options opts;
    sluice_options_init(&opts);
    sluice_model *model = NULL;
    walk.on = 1;
    int rc = sluice_open(argv[1], &opts, &model);
    walk.on = 0;
    fclose(walk.out);
    if (rc < 0) {
        fprintf(stderr, "open_walk: sluice_open: %s\n", sluice_errmsg(model));
        sluice_close(model);
        return 1;
    }
    sluice_close(model);
    return 0;
}
