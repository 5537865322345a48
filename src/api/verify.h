/* verify.h: the verify-only path of sluice_verify (verify.c): reads and
 * hashes tensors and files straight from the model's files, without the
 * engine. */
#ifndef SLUICE_VERIFY_H
#define SLUICE_VERIFY_H

#include "base/error.h"
#include "index/index.h"
#include "sluice.h"

typedef struct sl_manifest sl_manifest;

/* Verifies the tensors ids[0..n) (all: every tensor, ids ignored) and the
 * files o->flags asks for, against mf (NULL: only with
 * SLUICE_VF_DIGEST_ONLY). model_opts gives SLUICE_F_DIRECT and the default
 * thread count. o is complete (defaults filled, size checked); rep is
 * filled whole. Returns what sluice_verify returns, the detail in err. */
int sl_verify_run(const sl_index *ix, const sl_manifest *mf, const sluice_options *model_opts,
                  const size_t *ids, size_t n, int all, const sluice_verify_options *o,
                  struct sluice_verify_report *rep, sl_err *err);

/* SLUICE_VF_FILES for a model with remote files: every whole file read
 * with range requests of its source (through rc) and hashed on the
 * calling thread, each checked against mf's "files" digest and size and
 * reported as an item of o: the same item, judgement and report as
 * sl_verify_run's files, only read through the source's table. rep's file counts and bytes_hashed grow;
 * the first failure's status and message go to *first_fail (when 0) and
 * first_msg. Returns SLUICE_OK, the callback's non-zero value,
 * SLUICE_E_CANCELLED or SLUICE_E_NOMEM. */
struct sl_remote_cfg;
int sl_verify_remote_files(const sl_index *ix, const sl_manifest *mf,
                           const struct sl_remote_cfg *rc, sluice_algorithm alg,
                           const sluice_verify_options *o, struct sluice_verify_report *rep,
                           int *first_fail, char *first_msg, size_t cap);

#endif
