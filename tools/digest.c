/* digest.c: see digest.h. */
#include "digest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dg_state {
    const char *cmd;
    dg_result *tensors, *files;
    size_t ntensors, nfiles;
    long failed;
    progress *bar;
} dg_state;

static int on_item(void *user, const struct sluice_verify_item *it)
{
    dg_state *s = user;
    int file = it->kind == SLUICE_VERIFY_ITEM_FILE;
    dg_result *r = file ? (it->index < s->nfiles ? &s->files[it->index] : NULL)
                        : (it->index < s->ntensors ? &s->tensors[it->index] : NULL);
    progress_add(s->bar, it->bytes);
    if (!r)
        return 0;
    r->bytes = it->bytes;
    r->ok = it->status == SLUICE_OK && it->has_digest;
    memcpy(r->digest, it->digest, 32);
    if (!r->ok) {
        progress_printf(s->bar, stderr, "sluice %s: %s\n", s->cmd, it->message);
        s->failed++;
    }
    return 0;
}

long dg_compute(sluice_model *m, const char *cmd, int files, unsigned threads, progress *p,
                dg_result **tensors, dg_result **files_out)
{
    dg_state s = {.cmd = cmd, .ntensors = sluice_count(m), .nfiles = files ? sluice_file_count(m) : 0,
                  .bar = p};
    s.tensors = calloc(s.ntensors ? s.ntensors : 1, sizeof *s.tensors);
    s.files = calloc(s.nfiles ? s.nfiles : 1, sizeof *s.files);
    *tensors = NULL;
    *files_out = NULL;
    if (!s.tensors || !s.files) {
        free(s.tensors);
        free(s.files);
        fprintf(stderr, "sluice %s: out of memory\n", cmd);
        return -1;
    }
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_DIGEST_ONLY | (files ? SLUICE_VF_FILES : 0);
    vo.threads = threads;
    vo.on_item = on_item;
    vo.user = &s;
    int rc = sluice_verify(m, NULL, 0, &vo, NULL);
    if (rc != SLUICE_OK && rc != SLUICE_E_IO && rc != SLUICE_E_FILE_CHANGED) {
        progress_printf(p, stderr, "sluice %s: %s\n", cmd, sluice_errmsg(m));
        free(s.tensors);
        free(s.files);
        return -1;
    }
    *tensors = s.tensors;
    *files_out = s.files;
    return s.failed;
}
