/* model.c: sluice_open/sluice_close, the index queries, and the per-thread
 * error detail of a model. */
#include "model.h"

#include "engine.h"
#include "errmsg.h"
#include "manifest.h"

#include <stdlib.h>
#include <string.h>


SLUICE_API int sluice_options_init(sluice_options *opts)
{
    if (!opts)
        return SLUICE_E_INVAL;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
    opts->queue_depth = 32;
    opts->pool_bytes = (uint64_t)4 << 30;
    opts->chunk_bytes = (uint64_t)8 << 20;
    opts->io_threads = 4;
    opts->hash_threads = 0;
    opts->manifest_path = NULL;
    opts->verify = SLUICE_VERIFY_DEFAULT;
    return SLUICE_OK;
}

/* Copies the caller's options over the defaults, field by field up to the
 * size the caller knows, and checks them. */
static int take_options(sluice_options *dst, const sluice_options *src, sl_err *err)
{
    sluice_options_init(dst);
    if (!src)
        return SLUICE_OK;
    if (src->size < offsetof(sluice_options, flags) + sizeof src->flags)
        return sl_fail(err, SLUICE_E_INVAL,
                       "options: size %zu is not one this library knows (%zu); "
                       "call sluice_options_init first", src->size, sizeof *dst);
    /* A caller built against a newer header has fields this library does
     * not know: harmless while they hold their zero defaults, but a set
     * one asks for something this library would silently not do. */
    if (src->size > sizeof *dst) {
        const unsigned char *tail = (const unsigned char *)src;
        for (size_t i = sizeof *dst; i < src->size; i++)
            if (tail[i])
                return sl_fail(err, SLUICE_E_INVAL,
                               "options: byte %zu of the caller's %zu-byte struct is not zero, "
                               "but this library knows only the first %zu bytes (a newer "
                               "option it cannot honour)", i, src->size, sizeof *dst);
    }
    memcpy(dst, src, src->size < sizeof *dst ? src->size : sizeof *dst);
    dst->size = sizeof *dst;
    if (dst->flags & ~SLUICE_F_ALL_)
        return sl_fail(err, SLUICE_E_INVAL, "options: unknown flag bits 0x%x",
                       (unsigned)(dst->flags & ~SLUICE_F_ALL_));
    if (dst->queue_depth < 1 || dst->queue_depth > 4096)
        return sl_fail(err, SLUICE_E_INVAL, "options: queue_depth %u is outside 1..4096",
                       (unsigned)dst->queue_depth);
    if (dst->chunk_bytes < 4096 || dst->chunk_bytes > ((uint64_t)1 << 30))
        return sl_fail(err, SLUICE_E_INVAL, "options: chunk_bytes %llu is outside 4 KiB..1 GiB",
                       (unsigned long long)dst->chunk_bytes);
    if (dst->pool_bytes == 0)
        return sl_fail(err, SLUICE_E_INVAL, "options: pool_bytes is 0");
    if (dst->io_threads < 1 || dst->io_threads > 256)
        return sl_fail(err, SLUICE_E_INVAL, "options: io_threads %u is outside 1..256",
                       (unsigned)dst->io_threads);
    if (dst->hash_threads > 256)
        return sl_fail(err, SLUICE_E_INVAL, "options: hash_threads %u is over 256",
                       (unsigned)dst->hash_threads);
    if ((unsigned)dst->verify > SLUICE_VERIFY_OFF)
        return sl_fail(err, SLUICE_E_INVAL, "options: unknown verify policy %d", (int)dst->verify);
    return SLUICE_OK;
}

static void release_model(sluice_model *m)
{
    sl_manifest_free(m->manifest);
    sl_index_free(&m->index);
    /* The closing thread's own entry goes now; other threads' entries can
     * never match a later model (ids are not reused) and go when pushed
     * out or when their thread exits. */
    sl_errmsg_forget(m->err_id);
    free(m->path);
    free(m);
}

SLUICE_API int sluice_open(const char *path, const sluice_options *opts, sluice_model **out)
{
    if (!out)
        return SLUICE_E_INVAL;
    sluice_model *m = calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return SLUICE_E_NOMEM;
    m->err_id = sl_errmsg_new_id();
    sl_err *err = &m->open_err;
    int rc;
    if (!path) {
        rc = sl_fail(err, SLUICE_E_INVAL, "sluice_open: path is NULL");
        goto failed;
    }
    if ((rc = take_options(&m->opts, opts, err)) < 0)
        goto failed;
    if (!(m->path = strdup(path))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
        goto failed;
    }
    if ((rc = sl_index_open(&m->index, path, err)) < 0)
        goto failed;
    if ((rc = sl_manifest_load(&m->index, &m->opts, path, &m->manifest, err)) < 0)
        goto failed;
    if ((rc = sl_engine_create(&m->index, &m->opts, m->manifest, &m->engine, err)) < 0)
        goto failed;
    return SLUICE_OK;

failed:
    /* Keep only the error: free what was built, leave a failed shell. */
    sl_manifest_free(m->manifest);
    m->manifest = NULL;
    sl_index_free(&m->index);
    m->failed = 1;
    return rc;
}

SLUICE_API int sluice_close(sluice_model *m)
{
    if (!m)
        return SLUICE_OK;
    if (!m->failed) {
        sl_err err = {0};
        int rc = sl_engine_destroy(m->engine, &err);
        if (rc < 0)
            return sl_model_error(m, &err);
        m->engine = NULL;
    }
    release_model(m);
    return SLUICE_OK;
}

int sl_model_error(sluice_model *m, const sl_err *err)
{
    if (m)
        sl_errmsg_set(m->err_id, err->msg); /* best effort: the code tells what failed */
    return err->code;
}

SLUICE_API const char *sluice_errmsg(const sluice_model *m)
{
    if (!m)
        return "out of memory (no model)";
    if (m->failed)
        return m->open_err.msg;
    return sl_errmsg_get(m->err_id);
}

int sl_model_usable(const sluice_model *m)
{
    return (m && !m->failed) ? SLUICE_OK : SLUICE_E_INVAL;
}

/* ---------------------------------------------------------------- index queries */

SLUICE_API size_t sluice_count(const sluice_model *m)
{
    return sl_model_usable(m) == SLUICE_OK ? m->index.ntensors : 0;
}

/* A caller's struct may be shorter (built against an older header) or
 * longer (a newer one) than ours: write only what both know, and keep the
 * caller's size. */
static void copy_sized(void *dst, const void *src, size_t src_size)
{
    size_t caller = *(const size_t *)dst;
    memcpy(dst, src, caller < src_size ? caller : src_size);
    *(size_t *)dst = caller;
}

static int info_size_ok(const struct sluice_tensor_info *info)
{
    return info->size >= sizeof info->size;
}

SLUICE_API int sluice_info(const sluice_model *m, size_t i, struct sluice_tensor_info *info)
{
    if (sl_model_usable(m) < 0 || !info || !info_size_ok(info) || i >= m->index.ntensors)
        return SLUICE_E_INVAL;
    copy_sized(info, &m->index.tensors[i], sizeof *info);
    return SLUICE_OK;
}

SLUICE_API int sluice_find_n(const sluice_model *m, const char *name, size_t len,
                             struct sluice_tensor_info *info)
{
    if (sl_model_usable(m) < 0 || !name || (info && !info_size_ok(info)))
        return SLUICE_E_INVAL;
    size_t i = sl_index_find(&m->index, name, len);
    if (i == SIZE_MAX)
        return SLUICE_E_NOT_FOUND;
    if (info)
        copy_sized(info, &m->index.tensors[i], sizeof *info);
    return SLUICE_OK;
}

SLUICE_API int sluice_find(const sluice_model *m, const char *name, struct sluice_tensor_info *info)
{
    if (!name)
        return SLUICE_E_INVAL;
    return sluice_find_n(m, name, strlen(name), info);
}

SLUICE_API size_t sluice_file_count(const sluice_model *m)
{
    return sl_model_usable(m) == SLUICE_OK ? m->index.nfiles : 0;
}

SLUICE_API int sluice_file_info(const sluice_model *m, size_t i, struct sluice_file_info *info)
{
    if (sl_model_usable(m) < 0 || !info || info->size < sizeof info->size || i >= m->index.nfiles)
        return SLUICE_E_INVAL;
    const sl_file *f = &m->index.files[i];
    struct sluice_file_info fi = {
        .size = sizeof fi,
        .path = f->path,
        .file_size = f->size,
        .header_bytes = f->header_bytes,
        .data_start = f->data_start,
        .tensor_count = f->tensor_count,
        .metadata_kind = f->metadata_kind,
        .metadata_count = f->metadata_count,
        .metadata = f->metadata,
    };
    copy_sized(info, &fi, sizeof fi);
    return SLUICE_OK;
}
