/* fuzz_header.c: libFuzzer target for the header parser. The input is a
 * whole .safetensors file; the parser must accept or reject it without
 * crashing, leaking, or reading outside it. */
#include "index/header.h"
#include "verdict.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target_name[] = "header";

int fuzz_verdict(const uint8_t *data, size_t size)
{
    sl_header h;
    sl_err err;
    int rc = sl_header_parse("fuzz", data, size, size, &h, &err);
    if (rc == SLUICE_OK) {
        /* walk what the index would copy */
        for (size_t i = 0; i < h.ntensors; i++) {
            uint64_t *dims = malloc((h.tensors[i].ndim + 1) * sizeof *dims);
            if (dims)
                sl_header_dims(&h, &h.tensors[i], dims);
            free(dims);
        }
    }
    sl_header_free(&h);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_verdict(data, size);
    return 0;
}
