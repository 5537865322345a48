/* fuzz_header.c: libFuzzer target for the header parser. The input is a
 * whole .safetensors file; the parser must accept or reject it without
 * crashing, leaking, or reading outside it. */
#include "header.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_header h;
    sl_err err;
    int rc = sl_header_parse("fuzz", data, size, size, &h, &err);
    if (rc == SLUICE_OK) {
        /* walk what the index would copy */
        for (size_t i = 0; i < h.ntensors; i++)
            for (uint32_t k = 0; k < h.tensors[i].ndim; k++)
                (void)sl_header_dim(&h, &h.tensors[i], k);
    }
    sl_header_free(&h);
    return 0;
}
