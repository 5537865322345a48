/* errmsg.h: the per-thread, per-model error detail behind sluice_errmsg
 * (errmsg.c).
 *
 * Each thread keeps its own short list of (model id, message) entries,
 * most recently failed model first, at most SLUICE_ERRMSG_MODELS long. A
 * model is named by an id that is never reused (not its address), so a
 * closed model's entries are never shown for a later model allocated at
 * the same address. A thread's entries are freed when it exits (one
 * process-wide pthread key with a destructor): no per-model key, so the
 * number of open models is not bounded by PTHREAD_KEYS_MAX.
 */
#ifndef SLUICE_ERRMSG_H
#define SLUICE_ERRMSG_H

#include <stddef.h>
#include <stdint.h>

/* A fresh model id: never 0, never returned twice in the process. */
uint64_t sl_errmsg_new_id(void);

/* Records msg (NUL-terminated, cut to SL_ERRMSG_MAX - 1 bytes) as the
 * calling thread's last failure on model id. Best effort: when the entry
 * cannot be allocated the detail is dropped (the caller still returns its
 * code). */
void sl_errmsg_set(uint64_t id, const char *msg);

/* The calling thread's last message on model id, or "" when none (never
 * recorded, or pushed out by failures on SLUICE_ERRMSG_MODELS other
 * models). Valid until this thread records a failure on a model that
 * pushes this one out, calls sl_errmsg_forget(id), or exits. */
const char *sl_errmsg_get(uint64_t id);

/* Drops the calling thread's entry for id (a model being closed). Other
 * threads' entries for it stay until pushed out or their thread exits:
 * they can never match again, since ids are not reused. */
void sl_errmsg_forget(uint64_t id);

/* Test hook: the entries alive in the whole process. */
size_t sl_errmsg_live_entries(void);

#endif
