/* consumer.c: the smallest outside user of an installed sluice. */
#include <sluice.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    sluice_model *m = NULL;
    int rc = sluice_open(argc > 1 ? argv[1] : "", NULL, &m);
    printf("open: %s (%s), %zu tensors\n", sluice_strerror(rc), sluice_errmsg(m), sluice_count(m));
    sluice_close(m);
    return rc == SLUICE_OK ? 0 : 1;
}
