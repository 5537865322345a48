/* verify.h: sluice_verify's one path (verify.c): reads and hashes
 * tensors and files straight from the model's files, local or remote,
 * without the engine. */
#ifndef SLUICE_VERIFY_H
#define SLUICE_VERIFY_H

#include "base/error.h"
#include "index/index.h"
#include "index/range.h"
#include "sluice.h"

typedef struct sl_manifest sl_manifest;

/* Verifies the tensors ids[0..n) (all: every tensor, ids ignored) and the
 * files o->flags asks for, against mf (NULL: only with
 * SLUICE_VF_DIGEST_ONLY), each read through its file's kind of reader
 * (verify.c): a local file with pread (or O_DIRECT), a remote one with
 * range requests of its source through ix->remote. model_opts gives
 * SLUICE_F_DIRECT and the default thread count. o is complete (defaults
 * filled, size checked); rep is filled whole, and net with the remote
 * requests made and the bytes they brought (remote_reads, remote_bytes;
 * the rest 0), for the model's stats. Returns what sluice_verify returns,
 * the detail in err. */
int sl_verify_run(const sl_index *ix, const sl_manifest *mf, const sluice_options *model_opts,
                  const size_t *ids, size_t n, int all, const sluice_verify_options *o,
                  struct sluice_verify_report *rep, sl_range_tally *net, sl_err *err);

#endif
