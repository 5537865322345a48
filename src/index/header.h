/* header.h: parsing and validating one .safetensors header (header.c). */
#ifndef SLUICE_HEADER_H
#define SLUICE_HEADER_H

#include "base/error.h"
#include "index/json.h"
#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sl_header_tensor {
    const char *name;       /* points into the parsed document */
    size_t name_len;
    sluice_dtype dtype;
    uint32_t ndim;
    uint32_t shape_node;    /* the shape array's node in the document */
    uint64_t begin, end;
} sl_header_tensor;

typedef struct sl_header {
    sj_doc doc;
    sl_header_tensor *tensors;  /* sorted by (begin, end), i.e. data order */
    size_t ntensors;
    sluice_metadata_kind metadata_kind;
    uint32_t metadata_node;     /* the __metadata__ object, when an object */
} sl_header;

/* Validates the 8 + N header bytes of a file of file_size bytes (only the
 * first 8 + N bytes of `bytes` are read; bytes_len says how many exist)
 * and fills *h. label names the file in messages. On failure *h is safe
 * to free. */
int sl_header_parse(const char *label, const unsigned char *bytes, size_t bytes_len,
                    uint64_t file_size, sl_header *h, sl_err *err);

/* Reads the length prefix: SLUICE_OK and *n, or the error for a file
 * shorter than 8 bytes, a header over the limit or past the end. */
int sl_header_length(const char *label, const unsigned char *first8, uint64_t file_size,
                     uint64_t *n, sl_err *err);

/* Copies the t->ndim dimensions of tensor t into dims, in one walk of the
 * shape (a shape may hold millions of dimensions). */
void sl_header_dims(const sl_header *h, const sl_header_tensor *t, uint64_t *dims);

void sl_header_free(sl_header *h);

/* sluice_dtype_name and sluice_dtype_bits. */
const char *sl_dtype_name(sluice_dtype dtype);
unsigned sl_dtype_bits(sluice_dtype dtype);

#endif
