/* manifest_write.h: the one writer of a manifest's JSON (manifest_write.c),
 * given the digests: used by sluice_manifest_write (manifest_make.c, which
 * computes them: `sluice manifest`, synth, Python's write_manifest) and by
 * the library for the manifests it derives from a Hub snapshot's verified
 * bytes (hub.c). It reads the model through the public calls only
 * (sluice_info, sluice_file_info, sluice_file_header_digest), so that the
 * command compiles it in too, for its JSON strings (tools/jsonout.c). */
#ifndef SLUICE_MANIFEST_WRITE_H
#define SLUICE_MANIFEST_WRITE_H

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { SL_MW_V2, SL_MW_V1, SL_MW_FLAT };

/* What to write. Digests are read at base + i * stride (a caller's array
 * of structs, or of uint8_t[32] with stride 32). */
typedef struct sl_mw {
    int form;                      /* SL_MW_V2, SL_MW_V1 or SL_MW_FLAT */
    sluice_algorithm alg;          /* the digests' algorithm */
    size_t only_file;              /* SIZE_MAX: every file; else that file and its
                                      tensors only (a manifest of one file) */
    const uint8_t *tensor_digest;  /* tensor i's at tensor_digest + i * tensor_stride */
    size_t tensor_stride;
    const uint8_t *file_digest;    /* file i's at file_digest + i * file_stride */
    size_t file_stride;
    const uint64_t *file_bytes;    /* file i's size at (char *)file_bytes + i * file_stride */
    uint64_t chunk_bytes;          /* version 2: the chunk size, with: */
    const uint32_t *chunk_count;   /* per tensor (NULL: no chunks; 0: none for it) */
    const size_t *chunk_first;     /* per tensor: its first chunk digest in chunks */
    const uint8_t (*chunks)[32];
    /* version 2: called after a tensor's fields, before its '}' (the
     * command's "parts"); NULL: none */
    void (*extra)(FILE *out, void *user, const struct sluice_tensor_info *info);
    void *user;
} sl_mw;

/* JSON string of s (len bytes) onto out, quoted and escaped. */
void sl_mw_json_string(FILE *out, const char *s, size_t len);

/* Writes the manifest of m as w says to out. Returns 0, or -1 (a header
 * digest missing, or a write error: errno set by stdio). */
int sl_manifest_write(FILE *out, const sluice_model *m, const sl_mw *w);

/* Writes it to path, replacing it atomically (base/replace.h). Returns
 * 0, or -1 with errno set (nothing left behind). */
int sl_manifest_write_file(const char *path, const sluice_model *m, const sl_mw *w);

#endif
