/* engine.h: the read pipeline of a model (engine.c and its parts).
 *
 * plan -> ring (io_uring or pread pool) -> pool buffer -> hash -> handle.
 * The engine implements the public loading calls of sluice.h
 * (prefetch, acquire, release, stream, stats, tensor accessors).
 */
#ifndef SLUICE_ENGINE_H
#define SLUICE_ENGINE_H

#include "error.h"
#include "index.h"
#include "manifest.h"
#include "sluice.h"

typedef struct sl_engine sl_engine;

/* Creates the engine for an open index; manifest may be NULL. */
int sl_engine_create(const sl_index *ix, const sluice_options *opts,
                     const sl_manifest *manifest, sl_engine **out, sl_err *err);

/* Waits for reads in flight and frees the engine. With live handles (or a
 * stream running) it frees nothing and returns SLUICE_E_BUSY. NULL: OK. */
int sl_engine_destroy(sl_engine *e, sl_err *err);

#endif
