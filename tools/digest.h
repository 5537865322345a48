/* digest.h: the SHA-256 of every tensor of a model, and of its whole
 * files, for `sluice manifest`, computed by the library's verify-only path
 * (sluice_verify with SLUICE_VF_DIGEST_ONLY: no pool, bytes hashed from
 * the page cache without a copy where it can). */
#ifndef SLUICE_TOOLS_DIGEST_H
#define SLUICE_TOOLS_DIGEST_H

#include "progress.h"

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dg_result {
    uint8_t digest[32];
    uint64_t bytes;     /* bytes hashed (a file: its size as read) */
    int ok;             /* every byte was read and hashed */
} dg_result;

/* Fills *tensors (one per tensor, model order) and, when files is set,
 * *files (one per file), to be freed with free(). Each item that could
 * not be read is printed on stderr as "sluice CMD: message". threads: 0
 * for the library's default. progress (may be NULL) counts the bytes. Returns the number of failed items, or -1 when
 * nothing could be done (message printed). */
long dg_compute(sluice_model *m, const char *cmd, int files, unsigned threads, progress *p,
                dg_result **tensors, dg_result **files_out);

#endif
