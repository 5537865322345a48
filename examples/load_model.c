/* load_model.c: open a model and list its tensors.
 *
 *   load_model PATH
 *
 * PATH is a .safetensors file, a directory of them, or an index.json.
 */
#include <sluice.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL\n", argv[0]);
        return 2;
    }
    sluice_options opts;
    sluice_options_init(&opts);

    sluice_model *model = NULL;
    int rc = sluice_open(argv[1], &opts, &model);
    if (rc != SLUICE_OK) {
        /* the model carries the detail even when open failed */
        fprintf(stderr, "cannot open %s: %s\n", argv[1], sluice_errmsg(model));
        sluice_close(model);
        return 1;
    }

    uint64_t total = 0;
    for (size_t i = 0; i < sluice_count(model); i++) {
        struct sluice_tensor_info t;
        sluice_info(model, i, &t);
        printf("%-50s %-5s [", t.name, sluice_dtype_name(t.dtype));
        for (uint32_t k = 0; k < t.ndim; k++)
            printf("%s%llu", k ? ", " : "", (unsigned long long)t.shape[k]);
        printf("] %llu bytes\n", (unsigned long long)t.nbytes);
        total += t.nbytes;
    }
    printf("%zu tensors, %llu bytes in %zu files\n", sluice_count(model),
           (unsigned long long)total, sluice_file_count(model));
    return sluice_close(model) == SLUICE_OK ? 0 : 1;
}
