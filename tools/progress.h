/* progress.h: a one-line progress bar on stderr (bytes, rate, ETA), drawn
 * only when stderr is a terminal; quiet otherwise. Used by the manifest and
 * verify commands. Every call accepts NULL (no bar). */
#ifndef SLUICE_TOOLS_PROGRESS_H
#define SLUICE_TOOLS_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct progress progress;

/* Starts a bar labelled label for total bytes, redrawn by a thread of its
 * own a few times a second. NULL when stderr is not a terminal, when quiet
 * is set, or when it cannot be started. */
progress *progress_start(const char *label, uint64_t total, int quiet);

/* Counts bytes done. Any thread. */
void progress_add(progress *p, uint64_t bytes);

/* Prints a line to out (stdout or stderr) without garbling the bar: the
 * bar is cleared first and redrawn on the next tick. Any thread; with a
 * NULL p it is a plain vfprintf. */
void progress_printf(progress *p, FILE *out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Stops the thread, clears the bar and frees p. */
void progress_stop(progress *p);

/* "1.5 GiB" into buf. */
const char *progress_bytes(uint64_t bytes, char *buf, size_t size);

#endif
