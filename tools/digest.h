/* digest.h: SHA-256 of a model's whole files and of its tensors, computed
 * by threads of their own that read with pread into one reused 8 MiB
 * buffer each (digest.c). `sluice manifest` takes both, `sluice verify
 * --files` the files only; tensors that are to be verified go through the
 * library instead, which hashes the very bytes it hands out. */
#ifndef SLUICE_TOOLS_DIGEST_H
#define SLUICE_TOOLS_DIGEST_H

#include "progress.h"

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dg_result {
    uint8_t digest[32];
    uint64_t bytes;     /* bytes hashed (for a file: its size as read) */
    int error;          /* errno of a failed open or read (EIO: the file ended
                           before the tensor did), else 0 */
} dg_result;

typedef struct dg_job dg_job;

/* Starts hashing: every whole file when files is set, every tensor when
 * tensors is set, on threads threads (0: online CPUs). progress (may be
 * NULL) counts the bytes hashed. Returns NULL when out of memory or no
 * thread could be started (with a message on stderr). */
dg_job *dg_start(const sluice_model *model, int files, int tensors, unsigned threads,
                 progress *p);

/* Waits for every thread. The results are valid until dg_free: one per
 * file in sluice_file_info order (NULL unless files was set), one per
 * tensor in model order (NULL unless tensors was set). */
void dg_wait(dg_job *job, const dg_result **files, const dg_result **tensors);
void dg_free(dg_job *job);

#endif
