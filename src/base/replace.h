/* replace.h: a file replaced whole, atomically (replace.c).
 *
 * The one way the library writes a file it owns beside the user's
 * (a signature, a manifest, a model signature bundle): the bytes go to a
 * temporary file in the same directory (mode 0644, close-on-exec), are
 * synced, renamed over path, and the directory is synced, so that a crash
 * at any point leaves the old file or the new one, never a part.
 */
#ifndef SLUICE_REPLACE_H
#define SLUICE_REPLACE_H

#include <stddef.h>

/* 0 when path now holds the len bytes at bytes; -1 with errno set when it
 * could not (path then unchanged, the temporary file removed): ENOMEM
 * when out of memory, which callers report as SLUICE_E_NOMEM. */
int sl_replace_file(const char *path, const void *bytes, size_t len);

#endif
