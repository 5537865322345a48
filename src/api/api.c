/* api.c: every public entry point of sluice.h, and the model that ties
 * the components together. Here, and only here: arguments are checked,
 * names resolved, error detail recorded for the calling thread (errmsg.c),
 * and calls that wait or touch the engine after its lock are bracketed
 * with sl_engine_enter/sl_engine_leave so close never frees under them.
 *
 * The layers below point one way and never include the model:
 *   api.c -> index (index.c over header.c and json.c), manifest.c (a
 *            lookup of digests), engine (engine.h: engine.c, slot.c,
 *            sched.c, stream.c over pool.c, io.c, hash.c), errmsg.c,
 *            cancel.c, error.c
 * The metrics calls are in api_metrics.c, and the HTTP endpoint in
 * metrics_http.c, with the same rules.
 * open:  index -> manifest -> engine (given the manifest's digests)
 * close: engine -> manifest -> index
 */
#include "cache/cache.h"
#include "api/hub.h"
#include "api/model.h"
#include "api/verify.h"

#include "base/cancel.h"
#include "base/cgroup.h"
#include "engine/engine.h"
#include "base/errmsg.h"
#include "index/header.h"
#include "trust/hf.h"
#include "trust/manifest.h"
#include "index/range.h"
#include "base/digest.h"
#include "counters/metrics.h"
#include "sources/remote.h"
#include "index/source.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- library */

SLUICE_API const char *sluice_version(void)
{
    /* The header's macros tell what a program was compiled against; this
     * tells what it loaded. */
    return SLUICE_VERSION_STRING;
}

SLUICE_API int sluice_version_number(void)
{
    return SLUICE_VERSION_NUMBER;
}

SLUICE_API const char *sluice_strerror(int code)
{
    return sl_status_name(code);
}

SLUICE_API int sluice_algorithm_supported(sluice_algorithm alg)
{
    return sl_md_supported(alg);
}

/* ---------------------------------------------------------------- open, close */

/* A caller built against a newer header has fields this library does not
 * know: harmless while they hold their zero defaults, but a set one asks
 * for something this library would silently not do. Returns the offset of
 * the first non-zero byte past the `known` bytes of a `size`-byte struct,
 * or 0 when there is none. `known` ends at the last field this library
 * has, not at its sizeof: a newer field may sit in today's tail padding
 * (the *_init calls zero it). */
#define SL_END_OF(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

static size_t set_tail(const void *src, size_t size, size_t known)
{
    for (size_t i = known; i < size; i++)
        if (((const unsigned char *)src)[i])
            return i;
    return 0;
}

SLUICE_API int sluice_options_init(sluice_options *opts)
{
    if (!opts)
        return SLUICE_E_INVAL;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
    opts->queue_depth = 32;
    /* 4 GiB, or 1/4 of this process's cgroup memory limit when less */
    uint64_t limit = 0;
    if (!sl_cgroup_memory_limit(SL_CGROUP_SELF, SL_CGROUP_ROOT, &limit, NULL, 0))
        limit = 0;
    opts->pool_bytes = sl_pool_default(limit);
    opts->chunk_bytes = (uint64_t)8 << 20;
    opts->io_threads = 4;
    opts->hash_threads = 0;
    opts->manifest_path = NULL;
    opts->verify = SLUICE_VERIFY_DEFAULT;
    opts->remote_connections = 8;
    opts->remote_attempts = 5;
    opts->remote_connect_timeout_ms = 10000;
    opts->remote_stall_timeout_ms = 30000;
    opts->remote_deadline_ms = 120000;
    opts->remote_backoff_ms = 200;
    opts->cache_bytes = SLUICE_CACHE_DEFAULT_BYTES;
    return SLUICE_OK;
}

/* A list of paths in the options (trusted_keys, trusted_cas, named by
 * `name`; its count is n<name>): the list and its count are both set or
 * both unset, and no entry is NULL. */
static int take_path_list(const char *const *list, size_t n, const char *name, sl_err *err)
{
    if (!list != !n)
        return sl_fail(err, SLUICE_E_INVAL, "options: %s is %s but n%s is %zu", name,
                       list ? "set" : "NULL", name, n);
    for (size_t i = 0; i < n; i++)
        if (!list[i])
            return sl_fail(err, SLUICE_E_INVAL, "options: %s[%zu] is NULL", name, i);
    return SLUICE_OK;
}

/* The proxy's options (sluice.h "Proxies"). */
static int take_proxy_options(const sluice_options *o, sl_err *err)
{
    if (o->proxy_kind > SLUICE_PROXY_DRAGONFLY)
        return sl_fail(err, SLUICE_E_INVAL, "options: unknown proxy_kind %u",
                       (unsigned)o->proxy_kind);
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
    size_t set = set_tail(src, src->size, SL_END_OF(sluice_options, signature_path));
    if (set)
        return sl_fail(err, SLUICE_E_INVAL,
                       "options: byte %zu of the caller's %zu-byte struct is not zero, "
                       "but this library knows only the first %zu bytes (a newer "
                       "option it cannot honour)", set, src->size, sizeof *dst);
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
    /* a pool the container cannot hold gets its process killed once it
     * fills, with nothing the caller could see: refused here instead */
    uint64_t limit = 0;
    char where[512];
    if (sl_cgroup_memory_limit(SL_CGROUP_SELF, SL_CGROUP_ROOT, &limit, where, sizeof where) &&
        dst->pool_bytes > limit)
        return sl_fail(err, SLUICE_E_INVAL,
                       "options: pool_bytes %llu is more than this process's cgroup memory "
                       "limit, %llu bytes (%s): the pool could not be filled without the "
                       "process being killed; the default here is %llu",
                       (unsigned long long)dst->pool_bytes, (unsigned long long)limit, where,
                       (unsigned long long)sl_pool_default(limit));
    if (dst->io_threads < 1 || dst->io_threads > 256)
        return sl_fail(err, SLUICE_E_INVAL, "options: io_threads %u is outside 1..256",
                       (unsigned)dst->io_threads);
    if (dst->hash_threads > 256)
        return sl_fail(err, SLUICE_E_INVAL, "options: hash_threads %u is over 256",
                       (unsigned)dst->hash_threads);
    if ((unsigned)dst->verify > SLUICE_VERIFY_OFF)
        return sl_fail(err, SLUICE_E_INVAL, "options: unknown verify policy %d", (int)dst->verify);
    if ((unsigned)dst->algorithm > SLUICE_ALG_BLAKE3)
        return sl_fail(err, SLUICE_E_INVAL, "options: unknown digest algorithm %d",
                       (int)dst->algorithm);
    if (!sl_md_supported(dst->algorithm))
        return sl_fail(err, SLUICE_E_UNSUPPORTED,
                       "options: digest algorithm %s: this build of the library lacks it",
                       sluice_algorithm_name(dst->algorithm));
    if (dst->fallback_count > SL_MAX_FALLBACK)
        return sl_fail(err, SLUICE_E_INVAL, "options: fallback_count %u is over %d",
                       (unsigned)dst->fallback_count, SL_MAX_FALLBACK);
    if (dst->fallback_count && !dst->fallback)
        return sl_fail(err, SLUICE_E_INVAL, "options: fallback is NULL with fallback_count %u",
                       (unsigned)dst->fallback_count);
    for (uint32_t k = 0; k < dst->fallback_count; k++)
        if (!dst->fallback[k] || !*dst->fallback[k])
            return sl_fail(err, SLUICE_E_INVAL, "options: fallback[%u] is NULL or empty",
                           (unsigned)k);
    if (dst->remote_connections < 1 || dst->remote_connections > 256)
        return sl_fail(err, SLUICE_E_INVAL, "options: remote_connections %u is outside 1..256",
                       (unsigned)dst->remote_connections);
    if (dst->remote_attempts < 1 || dst->remote_attempts > 100)
        return sl_fail(err, SLUICE_E_INVAL, "options: remote_attempts %u is outside 1..100",
                       (unsigned)dst->remote_attempts);
    if (!dst->remote_connect_timeout_ms || !dst->remote_stall_timeout_ms ||
        !dst->remote_deadline_ms)
        return sl_fail(err, SLUICE_E_INVAL, "options: a remote timeout or deadline is 0");
    if (dst->cache_bytes == 0)
        return sl_fail(err, SLUICE_E_INVAL, "options: cache_bytes is 0");
    if (dst->s3_addressing > SLUICE_S3_VIRTUAL_HOST)
        return sl_fail(err, SLUICE_E_INVAL, "options: unknown s3_addressing %u",
                       (unsigned)dst->s3_addressing);
    SL_TRY(take_proxy_options(dst, err));
    /* Trusted keys ask for a signed manifest: a list that cannot be read
     * as one must not pass for "no signature asked" (what the keys ask
     * for is the trust plan's: trust_plan.c); trusted CAs (and a signature
     * path) ask for an OpenSSF model signature, their list under the same
     * rule. */
    int rc = take_path_list(dst->trusted_keys, dst->ntrusted_keys, "trusted_keys", err);
    return rc < 0 ? rc : take_path_list(dst->trusted_cas, dst->ntrusted_cas, "trusted_cas", err);
}

/* The caller's strings are the caller's: the model keeps copies of the
 * mirrors, and the remote configuration keeps the rest (token and S3
 * settings, which then leave m->opts). */
static int take_remote(sluice_model *m, const char *path, sl_err *err)
{
    sluice_options *o = &m->opts;
    int remote = sl_location_remote(m->loc) || sl_location_remote(m->manifest_loc);
    if (o->fallback_count) {
        if (!(m->fallback = calloc(o->fallback_count, sizeof *m->fallback)) ||
            !(m->fallback_loc = calloc(o->fallback_count, sizeof *m->fallback_loc)))
            return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        m->nfallback = o->fallback_count;
        for (uint32_t k = 0; k < o->fallback_count; k++) {
            if (!(m->fallback[k] = strdup(o->fallback[k])))
                return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
            char what[32];
            snprintf(what, sizeof what, "fallback[%u]", (unsigned)k);
            SL_TRY(sl_location_take(o->fallback[k], what, &m->fallback_loc[k], err));
            remote |= sl_location_remote(m->fallback_loc[k]);
        }
        o->fallback = (const char *const *)m->fallback;
    }
    if (remote) {
        SL_TRY(sl_remote_cfg_new(o, &m->remote, err));
        int hub = 0;
        SL_TRY(sl_hf_cfg_tokens(m->remote, o, m->loc, m->fallback_loc, m->nfallback, &hub, err));
        SL_TRY(sl_remote_dragonfly_hop(m->remote, hub, err));
    }
    o->http_token = o->s3_endpoint = o->s3_region = o->remote_ca_file = NULL;
    o->http_proxy = NULL;   /* the remote configuration's now */
    return SLUICE_OK;
}

/* Every sidecar the open looked for beside the location that serves ("A"
 * or "A nor B") into list, each as messages show a location (no
 * user:password@, "?..." for a query): -1 when out of memory. */
static int sidecars_looked(const sluice_model *m, char *list, size_t cap)
{
    char *side[2], shown[2][SL_ERRMSG_MAX / 2];
    char *show[2] = {NULL, NULL};
    int nside = sl_manifest_sidecars(&m->index, sl_model_where(m), side);
    if (nside < 0)
        return -1;
    for (int k = 0; k < nside; k++)
        show[k] = (char *)sl_location_shown_of(side[k], shown[k], sizeof shown[k]);
    sl_manifest_sidecars_list(show, nside, list, cap);
    for (int k = 0; k < nside; k++)
        free(side[k]);
    return nside;
}

/* What the open found to verify the model against: a manifest, none
 * (the sidecar it looked for is kept, for sluice_verify_state), or
 * nothing looked for (policy OFF). */
static int note_verification(sluice_model *m, sl_err *err)
{
    /* the Hub's whole-file digests left as they are (a file of the model
     * is no LFS object, so nothing was derived) check no tensor load: the
     * model loads unverified, and says so like one without a manifest
     * (sluice_verify with SLUICE_VF_FILES still checks its files against
     * them) */
    if (m->manifest && !m->hub_files_only) {
        m->verification = m->hub_snapshot ? SLUICE_VERIFIED_PUBLISHER_DIGEST : SLUICE_VERIFIED;
        return SLUICE_OK;
    }
    if (m->opts.verify == SLUICE_VERIFY_OFF) {
        m->verification = SLUICE_UNVERIFIED_OFF;
        return SLUICE_OK;
    }
    m->verification = SLUICE_UNVERIFIED_NO_MANIFEST;
    char list[2 * SL_ERRMSG_MAX / 3];
    if (sidecars_looked(m, list, sizeof list) < 0 || !(m->sidecar_looked = strdup(list)))
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", sl_model_where(m)->shown);
    return SLUICE_OK;
}

SLUICE_API int sluice_verify_state(const sluice_model *model, const char **where)
{
    if (where)
        *where = NULL;
    if (sl_model_usable(model) != SLUICE_OK)
        return SLUICE_E_INVAL;
    if (where)
        *where = model->verification == SLUICE_VERIFIED ||
                 model->verification == SLUICE_VERIFIED_PUBLISHER_DIGEST
                     ? sl_manifest_path(model->manifest) : model->sidecar_looked;
    return (int)model->verification;
}

static void free_remote(sluice_model *m)
{
    for (size_t k = 0; m->fallback && k < m->nfallback; k++)
        free(m->fallback[k]);
    for (size_t k = 0; m->fallback_loc && k < m->nfallback; k++)
        sl_location_free(m->fallback_loc[k]);
    free(m->fallback);
    m->fallback = NULL;
    free(m->fallback_loc);
    m->fallback_loc = NULL;
    sl_location_free(m->loc);
    sl_location_free(m->manifest_loc);
    sl_location_free(m->signature_loc);
    sl_location_free(m->pinned_loc);
    m->loc = m->manifest_loc = m->signature_loc = m->pinned_loc = NULL;
    m->nfallback = 0;
    m->opts.fallback = NULL;
    m->opts.fallback_count = 0;
    sl_remote_cfg_free(m->remote);
    m->remote = NULL;
}

static void release_model(sluice_model *m)
{
    sl_manifest_free(m->manifest);
    sl_index_free(&m->index);
    sl_open_mirrors_free(m);    /* before free_remote: it counts the mirrors */
    free_remote(m);
    /* The closing thread's own entry goes now; other threads' entries can
     * never match a later model (ids are not reused) and go when pushed
     * out or when their thread exits. */
    sl_errmsg_forget(m->err_id);
    free(m->sidecar_looked);
    free(m->path);
    free(m->metrics_label);
    free(m);
}

/* The engine checks what the manifest lists: handed over as an array of
 * digests, so that the engine needs no manifest. */
static int create_engine(sluice_model *m, sl_err *err)
{
    const uint8_t **expect = NULL;
    if (m->manifest) {
        if (!(expect = calloc(m->index.ntensors ? m->index.ntensors : 1, sizeof *expect)))
            return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", m->loc->shown);
        for (size_t i = 0; i < m->index.ntensors; i++)
            expect[i] = sl_manifest_tensor_digest(m->manifest, i);
    }
    int rc = sl_engine_create(&m->index, &m->opts,
                              (const sl_location *const *)m->fallback_loc, expect,
                              sl_manifest_chunks(m->manifest), &m->engine, err);
    free(expect);
    return rc;
}

/* The persistent cache, when one is named and has a use here: blobs for
 * a remote model's checked tensors, the memo for a local one's. A cache
 * that cannot be used is a warning (sluice_cache_warning), never a
 * failed open. */
static int attach_cache(sluice_model *m, sl_err *err)
{
    const sluice_options *o = &m->opts;
    int mirrors = 0;    /* a remote mirror's tensors are kept too */
    for (size_t k = 0; k < m->nfallback; k++)
        mirrors |= (sl_source_of(m->fallback_loc[k])->caps & SL_SRC_WORTH_CACHING) != 0;
    if (!m->manifest || !((m->index.caps_any & SL_SRC_WORTH_CACHING) || mirrors ||
                          (o->flags & SLUICE_F_TRUST_UNCHANGED)))
        return SLUICE_OK;
    char *dir = NULL;
    SL_TRY(sl_cache_dir_for(o, &dir, err));
    if (!dir)
        return SLUICE_OK;
    sl_cache *c = NULL;
    int rc = sl_cache_open(dir, o->cache_bytes, &c, err);
    free(dir);
    if (rc < 0)
        return rc;
    return sl_engine_attach_cache(m->engine, c, m->loc->shown, err);
}

SLUICE_API const char *sluice_cache_warning(sluice_model *m)
{
    if (sl_model_usable(m) != SLUICE_OK)
        return NULL;
    return sl_engine_cache_warning(m->engine);
}

/* Sets m->metrics_label from m->opts, else from path. */
static int metrics_label(sluice_model *m, sl_err *err)
{
    const char *label = m->opts.metrics_label;
    m->opts.metrics_label = NULL;  /* the caller's: borrowed during open only */
    if (label) {
        SL_TRY(sl_metrics_label_check(label, err));
    } else {
        /* The path, when it is a valid label; else a fixed word. A remote
         * location as messages show it: no credential, no query. */
        label = m->loc->shown;
        if (sl_metrics_label_check(label, NULL) < 0)
            label = "model";
    }
    if (!(m->metrics_label = strdup(label)))
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", m->loc->shown);
    return SLUICE_OK;
}

/* Notes when the open began (t0, CLOCK_MONOTONIC ns) in the engine. */
static void metrics_opened(sluice_model *m, uint64_t t0)
{
    sl_engine_metrics(m->engine)->open_ns = t0;
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
    uint64_t t_open = sl_metrics_clock();
    sl_err *err = &m->open_err;
    int rc;
    if (!path) {
        rc = sl_fail(err, SLUICE_E_INVAL, "sluice_open: path is NULL");
        goto failed;
    }
    if ((rc = take_options(&m->opts, opts, err)) < 0)
        goto failed;
    /* each location parsed once: the trust plan and everything after read
     * these; a port no request could use is refused here, before anything
     * is asked */
    const char *mp = m->opts.manifest_path, *sp = m->opts.signature_path;
    if ((rc = sl_location_take(path, NULL, &m->loc, err)) < 0 ||
        (mp && (rc = sl_location_take(mp, "manifest_path", &m->manifest_loc, err)) < 0) ||
        (sp && (rc = sl_location_take(sp, "signature_path", &m->signature_loc, err)) < 0))
        goto failed;
    sl_trust_locs at = {m->loc, m->manifest_loc, m->signature_loc};
    if ((rc = sl_trust_plan_make(&m->opts, &at, &m->trust, err)) < 0)
        goto failed;
    if ((rc = metrics_label(m, err)) < 0)
        goto failed;
    if (!(m->path = strdup(path))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", m->loc->shown);
        goto failed;
    }
    if ((rc = take_remote(m, path, err)) < 0)
        goto failed;
    /* a Hub location is opened as the location of its commit */
    if ((rc = sl_hf_resolve(m->remote, path, &m->hub, err)) < 0)
        goto primary_down;
    const sl_location *where = m->loc;
    if (m->hub) {
        path = sl_hf_pinned(m->hub);
        if (!(m->pinned_loc = sl_location_new(path))) {
            rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
            goto failed;
        }
        where = m->pinned_loc;
    }
    if ((rc = sl_index_open_ex(&m->index, where, m->remote, err)) < 0) {
        /* the API lists a gated repository's files to anyone; its
         * resolve refuses them: say why, as the API's refusal does */
        if (m->hub && rc == SLUICE_E_REMOTE &&
            (strstr(err->msg, "HTTP 401") || strstr(err->msg, "HTTP 403"))) {
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, " (the Hub refused the repository's "
                     "files: it is gated or private and %s)", m->remote->hf_token ?
                     "the token (http_token or HF_TOKEN) has no access to it" :
                     "no token was sent (set HF_TOKEN or http_token)");
        }
        goto primary_down;
    }
    m->index.remote = m->remote;    /* the mirrors' too */
    /* the plan says which of the Hub's digests may stand in (trust_plan.c):
     * a cache snapshot's blob names, where no sidecar lies beside it (hub.c) */
    rc = m->trust.hub_digest == SL_HUB_SNAPSHOT ? sl_hub_open(m, path, err) : SLUICE_OK;
    if (rc == SLUICE_OK && !m->manifest)
        rc = sl_manifest_load(&m->index, &m->trust, m->hub, where, &m->manifest,
                              &m->hub_files_only, err);
    /* or an hf:// model's LFS SHA-256, read by the loader where the Hub
     * has no sidecar, derived into tensor digests the same way (hub.c) */
    if (rc == SLUICE_OK && m->trust.hub_digest == SL_HUB_LFS && m->hub_files_only)
        rc = sl_hub_open_remote(m, path, err);
    if (rc < 0)
        goto primary_down;
opened:
    if (m->manifest) /* the manifest's algorithm is the model's */
        m->opts.algorithm = sl_manifest_algorithm(m->manifest);
    if (m->trust.signature_asked && !m->manifest) { /* a signature asked, none to check */
        char list[2 * SL_ERRMSG_MAX / 3];
        rc = sl_trust_plan_no_manifest(&m->trust, sl_model_where(m)->shown,
                                       sidecars_looked(m, list, sizeof list) < 0
                                           ? "(out of memory)" : list, err);
        goto failed;
    }
    if ((rc = note_verification(m, err)) < 0)
        goto failed;
    /* the caller's key list is borrowed for the open only */
    m->opts.trusted_keys = NULL;
    m->opts.ntrusted_keys = 0;
    m->opts.trusted_cas = NULL;
    m->opts.ntrusted_cas = 0;
    m->opts.signature_path = NULL;
    m->trust.keys = m->trust.cas = NULL;
    m->trust.nkeys = m->trust.ncas = 0;
    m->trust.bundle_path = m->trust.manifest_path = NULL;
    /* the Hub's whole-file digests cannot check a mirror's tensor either */
    if (m->nfallback && (!m->manifest || m->hub_files_only)) {
        rc = sl_fail(err, SLUICE_E_INVAL, "%s: fallback mirrors need a manifest to verify their "
                     "bytes against, and none is in force (no sidecar, no manifest_path, or "
                     "verify OFF): unverified bytes from elsewhere are never handed out",
                     sl_model_where(m)->shown);
        goto failed;
    }
    if ((rc = create_engine(m, err)) < 0)
        goto failed;
    sl_open_mirrors_done(m);
    /* sluice_unverified: 0 for every verified state */
    sl_engine_note_verification(m->engine, m->verification == SLUICE_VERIFIED_PUBLISHER_DIGEST
                                               ? 0 : (uint32_t)m->verification);
    if ((rc = attach_cache(m, err)) < 0) {
        sl_err ignored;
        sl_engine_destroy(m->engine, &ignored);   /* nothing can hold it yet */
        m->engine = NULL;
        goto failed;
    }
    m->opts.cache_dir = NULL;   /* the caller's string, read by open only */
    metrics_opened(m, t_open);
    sl_hf_free(m->hub);
    m->hub = NULL;
    return SLUICE_OK;

primary_down:
    /* the model's own location cannot be opened: a mirror may serve it */
    if (m->nfallback && sl_trust_primary_down(rc) &&
        (rc = sl_open_from_mirrors(m, rc, &path, err)) == SLUICE_OK)
        goto opened;
failed:
    /* Keep only the error: free what was built, leave a failed shell. */
    sl_manifest_free(m->manifest);
    m->manifest = NULL;
    free(m->sidecar_looked);
    m->sidecar_looked = NULL;
    sl_index_free(&m->index);
    sl_open_mirrors_free(m);    /* before free_remote: it counts the mirrors */
    free_remote(m);
    sl_hf_free(m->hub);
    m->hub = NULL;
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

/* A failing query on a model its caller holds const: the message is per
 * thread (errmsg.c), so nothing of the model is written. A model that is
 * NULL or whose open failed has its message already (sluice_errmsg).
 * Returns code. */
static int query_fail(const sluice_model *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int query_fail(const sluice_model *m, int code, const char *fmt, ...)
{
    if (sl_model_usable(m) < 0)
        return code;
    char msg[SL_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sl_utf8_cut(msg);
    sl_errmsg_set(m->err_id, msg);
    return code;
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

/* ---------------------------------------------------------------- the index */

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
        return query_fail(m, SLUICE_E_INVAL, "sluice_info: %s", !info || !info_size_ok(info)
                          ? "info is NULL or its size too small" : "index out of range");
    copy_sized(info, &m->index.tensors[i], sizeof *info);
    return SLUICE_OK;
}

SLUICE_API int sluice_find_n(const sluice_model *m, const char *name, size_t len,
                             struct sluice_tensor_info *info)
{
    if (sl_model_usable(m) < 0 || !name || (info && !info_size_ok(info)))
        return query_fail(m, SLUICE_E_INVAL, "sluice_find: %s", !name ? "name is NULL"
                          : "info's size is too small");
    size_t i = sl_index_find(&m->index, name, len);
    if (i == SIZE_MAX) {
        char q[SL_QUOTE_MAX];
        return query_fail(m, SLUICE_E_NOT_FOUND, "no tensor named %s in %s",
                          sl_quote(q, sizeof q, name, len), m->loc->shown);
    }
    if (info)
        copy_sized(info, &m->index.tensors[i], sizeof *info);
    return SLUICE_OK;
}

SLUICE_API int sluice_find(const sluice_model *m, const char *name, struct sluice_tensor_info *info)
{
    if (!name)
        return query_fail(m, SLUICE_E_INVAL, "sluice_find: name is NULL");
    return sluice_find_n(m, name, strlen(name), info);
}

SLUICE_API size_t sluice_file_count(const sluice_model *m)
{
    return sl_model_usable(m) == SLUICE_OK ? m->index.nfiles : 0;
}

SLUICE_API int sluice_file_info(const sluice_model *m, size_t i, struct sluice_file_info *info)
{
    if (sl_model_usable(m) < 0 || !info || info->size < sizeof info->size || i >= m->index.nfiles)
        return query_fail(m, SLUICE_E_INVAL, "sluice_file_info: %s",
                          !info || info->size < sizeof info->size
                              ? "info is NULL or its size too small" : "file index out of range");
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

SLUICE_API int sluice_read_file_range(sluice_model *m, size_t i, uint64_t offset, size_t len,
                                      void *dst)
{
    sl_err err = {0};
    if (sl_model_usable(m) < 0)
        return SLUICE_E_INVAL;
    if (i >= m->index.nfiles || (!dst && len))
        return sl_model_error(m, (sl_fail(&err, SLUICE_E_INVAL, "read_file_range: %s",
                                          dst || !len ? "no such file" : "dst is NULL"), &err));
    const sl_file *f = &m->index.files[i];
    if (offset > f->size || len > f->size - offset)
        return sl_model_error(m, (sl_fail(&err, SLUICE_E_INVAL, "file %s: %zu bytes at %llu: "
                                          "past its end (%llu bytes)", f->path, len,
                                          (unsigned long long)offset,
                                          (unsigned long long)f->size), &err));
    /* through the file's own source, as its tensors are read */
    for (size_t done = 0; done < len;) {
        size_t got = 0;
        unsigned requests = 0;
        int st = f->src->read_tensor(f, m->index.remote, (unsigned char *)dst + done, len - done,
                                     offset + done, &got, &requests, &err);
        if (st == SL_SRC_ERRNO)
            st = sl_fail(&err, SLUICE_E_IO, "file %s: read at offset %llu: %s", f->path,
                         (unsigned long long)(offset + done), strerror(errno));
        else if (st == SLUICE_OK && got == 0)
            st = sl_fail(&err, SLUICE_E_FILE_CHANGED, "file %s: ends at %llu, %llu bytes at "
                         "open", f->path, (unsigned long long)(offset + done),
                         (unsigned long long)f->size);
        if (st != SLUICE_OK)
            return sl_model_error(m, &err);
        done += got;
    }
    return SLUICE_OK;
}

SLUICE_API int sluice_find_manifest(const char *path, const sluice_model *like, char **manifest)
{
    if (manifest)
        *manifest = NULL;
    if (!path || !manifest || (like && sl_model_usable(like) < 0))
        return SLUICE_E_INVAL;
    sl_err err = {0};
    char *one = NULL;
    if (like && like->index.nfiles == 1) {
        const sl_file *f = &like->index.files[0];
        if (!(one = strndup(f->loc->given, f->loc->name_len)))
            return SLUICE_E_NOMEM;
    }
    int rc = sl_manifest_find_local(path, one, manifest, &err);
    free(one);
    if (rc == SLUICE_E_MANIFEST) {
        /* the sidecars looked for, for the caller's message */
        const char *list = strstr(err.msg, "no sidecar ");
        if (!(*manifest = strdup(list ? list + strlen("no sidecar ") : err.msg)))
            return SLUICE_E_NOMEM;
    }
    return rc;
}

/* ---------------------------------------------------------------- loading */

static sl_engine *engine_of(sluice_model *m)
{
    return sl_model_usable(m) == SLUICE_OK ? m->engine : NULL;
}

static int find(sluice_model *m, const char *name, size_t *i, sl_err *err)
{
    if (!name)
        return sl_fail(err, SLUICE_E_INVAL, "tensor name is NULL");
    *i = sl_index_find(&m->index, name, strlen(name));
    if (*i == SIZE_MAX) {
        char q[SL_QUOTE_MAX];
        int rc = sl_fail(err, SLUICE_E_NOT_FOUND, "no tensor named %s in %s",
                         sl_quote(q, sizeof q, name, strlen(name)), m->loc->shown);
        return rc;
    }
    return SLUICE_OK;
}

/* Resolves n names to indexes (malloc'd into *ids; NULL when n = 0). */
static int resolve(sluice_model *m, const char *const *names, size_t n, size_t **ids, sl_err *err)
{
    *ids = NULL;
    if (n == 0)
        return SLUICE_OK;
    if (!names)
        return sl_fail(err, SLUICE_E_INVAL, "names is NULL with n = %zu", n);
    size_t *v = malloc(n * sizeof *v);
    if (!v)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory for %zu names", n);
    for (size_t k = 0; k < n; k++) {
        int rc = find(m, names[k], &v[k], err);
        if (rc < 0) {
            free(v);
            return rc;
        }
    }
    *ids = v;
    return SLUICE_OK;
}

/* acquire of tensor i, inside the engine: the error is recorded before
 * the call leaves. */
static int acquire(sluice_model *m, sl_engine *e, size_t i, sluice_tensor **out)
{
    sl_err err = {0};
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    int rc = sl_engine_acquire(e, i, out, &err);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_pause_point(e, SL_PAUSE_ACQUIRE_EXIT);
    sl_engine_leave(e);
    return rc;
}

/* What every acquire call checks first: *out is NULL until a tensor is
 * held, and the model (its engine e) and out are usable; fn names the
 * call in the message. */
static int acquire_args(sluice_model *m, const sl_engine *e, sluice_tensor **out,
                        const char *fn, sl_err *err)
{
    if (out)
        *out = NULL;
    if (!e || !out) {
        sl_fail(err, SLUICE_E_INVAL, "%s: %s is NULL or unusable", fn, e ? "out" : "the model");
        return e ? sl_model_error(m, err) : SLUICE_E_INVAL;
    }
    return SLUICE_OK;
}

SLUICE_API int sluice_acquire(sluice_model *m, const char *name, sluice_tensor **out)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    SL_TRY(acquire_args(m, e, out, "sluice_acquire", &err));
    size_t i = 0;
    if (find(m, name, &i, &err) < 0)
        return sl_model_error(m, &err);
    return acquire(m, e, i, out);
}

/* ---------------------------------------------------------------- ranges */

/* The tensor `name` into *index, when [begin, begin + len) lies within
 * it: checked before anything is allocated or read for the range. */
static int find_range(sluice_model *m, const char *call, const char *name, uint64_t begin,
                      uint64_t len, size_t *index, sl_err *err)
{
    size_t i = 0;
    SL_TRY(find(m, name, &i, err));
    const struct sluice_tensor_info *t = &m->index.tensors[i];
    if (begin > t->nbytes || len > t->nbytes - begin) {
        char q[SL_QUOTE_MAX];
        return sl_fail(err, SLUICE_E_INVAL,
                       "%s: bytes %llu..+%llu are outside tensor %s (%llu bytes)", call,
                       (unsigned long long)begin, (unsigned long long)len,
                       sl_quote(q, sizeof q, t->name, t->name_len), (unsigned long long)t->nbytes);
    }
    *index = i;
    return SLUICE_OK;
}

/* A range that failed from the model's own files with a code a load
 * would take to a mirror is read from the mirrors (opts.fallback) in
 * order, each opened for this call (its headers only), and verified
 * against the same digests; a mirror's tensor is used only when it is
 * the same (dtype, shape, size). Returns SLUICE_OK when one delivered,
 * else the primary's code with every source's failure in err. */
static int range_from_mirrors(sluice_model *m, size_t i, uint64_t begin, uint64_t len, void *dst,
                              const uint8_t *want, const sl_chunk_digests *chunks,
                              sl_range_tally *tally, sl_err *err)
{
    const struct sluice_tensor_info *t = &m->index.tensors[i];
    char log[3072], q[SL_QUOTE_MAX];
    int code = err->code;
    size_t n = (size_t)snprintf(log, sizeof log, "primary: %s", err->msg);
    /* a mirror serving the model is its "primary"; those before it failed at open */
    for (size_t k = m->serving; k < m->nfallback; k++) {
        char why[sizeof err->msg];
        const char *loc = m->fallback_loc[k]->shown;
        sl_index mix;
        sl_err e2 = {0};
        int rc = sl_index_open_ex(&mix, m->fallback_loc[k], m->remote, &e2);
        if (rc == SLUICE_OK) {
            size_t j = sl_index_find(&mix, t->name, t->name_len);
            const struct sluice_tensor_info *u = j == SIZE_MAX ? NULL : &mix.tensors[j];
            if (!u || !sl_tensor_same_kind(u, t))
                rc = sl_fail(&e2, SLUICE_E_NOT_FOUND, "no tensor %s of the same dtype, shape "
                             "and size there", sl_quote(q, sizeof q, t->name, t->name_len));
            else
                rc = sl_range_read(&mix, j, begin, len, dst, want, chunks, m->opts.algorithm,
                                   tally, &e2);
        }
        sl_index_free(&mix);
        if (rc == SLUICE_OK)
            return SLUICE_OK;
        snprintf(why, sizeof why, "%s", e2.msg);
        if (n < sizeof log)
            n += (size_t)snprintf(log + n, sizeof log - n, "; fallback %zu (%s): %s", k + 1, loc,
                                  why);
    }
    return sl_fail(err, code, "tensor %s: every source failed: %s",
                   sl_quote(q, sizeof q, t->name, t->name_len), log);
}

/* Reads [begin, begin + len) of tensor `name` into dst, verified; the
 * common part of sluice_read_into and sluice_acquire_range. */

/* A range or part read of tensor i whose bytes came through the model's
 * proxy and failed verification is read again from the origin directly,
 * once, before any mirror, as a load is (sluice.h "Proxies": a tensor the
 * origin serves right never fails because of its proxy), by the remote
 * source's one such read (sl_source_read_direct). read(ix) makes the read
 * with the index given: a copy of the model's whose remote configuration
 * is the direct hop. */
typedef int (*direct_read_fn)(const sl_index *ix, void *ctx, sl_range_tally *tally, sl_err *err);

typedef struct index_direct_args {
    const sl_index *ix;
    direct_read_fn read;
    void *ctx;
    sl_range_tally t;
} index_direct_args;

static int index_direct(const sl_remote_cfg *direct, void *ctx, uint64_t *bytes, sl_err *err)
{
    index_direct_args *a = ctx;
    sl_index dix = *a->ix;
    dix.remote = direct;
    int rc = a->read(&dix, a->ctx, &a->t, err);
    *bytes = a->t.remote_bytes;
    return rc;
}

static int again_direct(sluice_model *m, size_t i, int rc, direct_read_fn read, void *ctx,
                        sl_range_tally *tally, sl_err *err)
{
    const sl_file *f = &m->index.files[m->index.tensors[i].file_index];
    index_direct_args a = {&m->index, read, ctx, {0}};
    sl_err e2 = {0};
    int rc2 = sl_source_read_direct(m->remote, f, rc, tally->through_proxy, index_direct, &a,
                                    &e2);
    if (rc2 == SL_SRC_NOT_PROXIED)
        return rc;
    tally->bytes_read += a.t.bytes_read;
    tally->bytes_hashed += a.t.bytes_hashed;
    tally->chunks_verified += a.t.chunks_verified;
    tally->checksum_failures += a.t.checksum_failures;
    tally->remote_reads += a.t.remote_reads;
    tally->remote_bytes += a.t.remote_bytes;
    tally->part_fallback_bytes += a.t.part_fallback_bytes;
    /* the origin's own answer; or the call's token, requested while the
     * part was read again (a cancelled call, not the proxy's failure) */
    int answer = rc2 == SLUICE_OK || rc2 == SLUICE_E_CHECKSUM || rc2 == SLUICE_E_CANCELLED;
    if (answer)
        *err = e2;
    return answer ? rc2 : rc;
}

typedef struct range_args {
    size_t i;
    uint64_t begin, len;
    void *dst;
    const uint8_t *want;
    const sl_chunk_digests *chunks;
    sluice_algorithm alg;
} range_args;

static int range_direct(const sl_index *ix, void *ctx, sl_range_tally *tally, sl_err *err)
{
    range_args *a = ctx;
    return sl_range_read(ix, a->i, a->begin, a->len, a->dst, a->want, a->chunks, a->alg, tally,
                         err);
}

static int read_range(sluice_model *m, sl_engine *e, const char *call, const char *name,
                      uint64_t begin, uint64_t len, void *dst, size_t *index, sl_err *err)
{
    size_t i = 0;
    SL_TRY(find_range(m, call, name, begin, len, &i, err));
    if (!dst && len)
        return sl_fail(err, SLUICE_E_INVAL, "%s: dst is NULL", call);
    const sl_chunk_digests *chunks = sl_manifest_chunks(m->manifest);
    const uint8_t *want = sl_manifest_tensor_digest(m->manifest, i);
    /* its blocking reads cannot tell: its bytes are taken to have come
     * through the proxy whenever the file's requests go through one */
    sl_range_tally tally = {.through_proxy = 1};
    int rc = sl_range_read(&m->index, i, begin, len, dst, want, chunks ? &chunks[i] : NULL,
                           m->opts.algorithm, &tally, err);
    range_args ra = {i, begin, len, dst, want, chunks ? &chunks[i] : NULL, m->opts.algorithm};
    rc = again_direct(m, i, rc, range_direct, &ra, &tally, err);
    if (want && m->nfallback && (rc == SLUICE_E_CHECKSUM || rc == SLUICE_E_IO ||
                                 rc == SLUICE_E_FILE_CHANGED || rc == SLUICE_E_REMOTE))
        rc = range_from_mirrors(m, i, begin, len, dst, want, chunks ? &chunks[i] : NULL, &tally,
                                err);
    sl_engine_range_tally(e, &tally, rc < 0);
    *index = i;
    return rc;
}

SLUICE_API int sluice_read_into(sluice_model *m, const char *name, uint64_t byte_begin,
                                void *dst, uint64_t len)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    /* No pool or handle: close must still wait for the reads. */
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    size_t i;
    int rc = read_range(m, e, "sluice_read_into", name, byte_begin, len, dst, &i, &err);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

SLUICE_API int sluice_digest_range(sluice_model *m, size_t i, uint64_t byte_begin,
                                   uint64_t byte_end, uint8_t digest[32])
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    if (i >= m->index.ntensors || !digest || byte_end < byte_begin ||
        byte_end > m->index.tensors[i].nbytes) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_digest_range: tensor %zu, bytes %llu..%llu: %s", i,
                (unsigned long long)byte_begin, (unsigned long long)byte_end,
                i >= m->index.ntensors ? "no such tensor" : !digest ? "digest is NULL"
                                                          : "not a range of the tensor");
        return sl_model_error(m, &err);
    }
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    sl_range_tally tally = {0};
    int rc = sl_range_digest(&m->index, i, byte_begin, byte_end, m->opts.algorithm, digest,
                             &tally, &err);
    sl_engine_range_tally(e, &tally, rc < 0);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

SLUICE_API int sluice_acquire_range(sluice_model *m, const char *name, uint64_t byte_begin,
                                    uint64_t byte_end, sluice_tensor **out)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    SL_TRY(acquire_args(m, e, out, "sluice_acquire_range", &err));
    if (byte_end < byte_begin) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_acquire_range: byte_end %llu is before byte_begin %llu",
                (unsigned long long)byte_end, (unsigned long long)byte_begin);
        return sl_model_error(m, &err);
    }
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    uint64_t len = byte_end - byte_begin;
    void *buf = NULL;
    size_t i = 0;
    /* the range is checked before its memory is asked for */
    int rc = find_range(m, "sluice_acquire_range", name, byte_begin, len, &i, &err);
    if (rc == SLUICE_OK && (len > SIZE_MAX || (len && posix_memalign(&buf, 64, (size_t)len) != 0)))
        rc = sl_fail(&err, SLUICE_E_NOMEM, "sluice_acquire_range: out of memory for %llu bytes",
                     (unsigned long long)len);
    if (rc == SLUICE_OK)
        rc = read_range(m, e, "sluice_acquire_range", name, byte_begin, len, buf, &i, &err);
    if (rc == SLUICE_OK && (rc = sl_engine_grant_range(e, i, buf, len, out, &err)) == SLUICE_OK)
        buf = NULL;
    free(buf);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

/* ----------------------------------------------------------------- parts */

typedef struct part_args {
    size_t i;
    const sl_part_geom *g;
    void *dst;
    const uint8_t *want_part, *want;
    const sl_chunk_digests *chunks;
    sluice_algorithm alg;
    const sl_reader *rd;
} part_args;

static int part_direct(const sl_index *ix, void *ctx, sl_range_tally *tally, sl_err *err)
{
    part_args *a = ctx;
    return sl_part_read(ix, a->i, a->g, a->dst, a->want_part, a->want, a->chunks, a->alg, a->rd,
                        tally, err);
}

/* Rank `rank` of n equal parts of tensor `name` along dim, read and
 * verified into dst (the part's bytes, contiguous); the common part of
 * sluice_read_part_into and sluice_acquire_part. */
static int read_part(sluice_model *m, sl_engine *e, const char *call, const char *name,
                     uint32_t dim, uint64_t rank, uint64_t n, void *dst, uint64_t len,
                     sluice_cancel *cancel, size_t *index, sl_part_geom *g, sl_err *err)
{
    size_t i = 0;
    SL_TRY(find(m, name, &i, err));
    const struct sluice_tensor_info *t = &m->index.tensors[i];
    SL_TRY(sl_part_geometry(t, dim, rank, n, g, err));
    uint64_t bytes = g->count * g->seg;
    if (len != bytes)
        return sl_fail(err, SLUICE_E_INVAL, "%s: tensor part takes %llu bytes (%llu / %llu), "
                       "len is %llu", call, (unsigned long long)bytes,
                       (unsigned long long)t->nbytes, (unsigned long long)n,
                       (unsigned long long)len);
    if (!dst && len)
        return sl_fail(err, SLUICE_E_INVAL, "%s: dst is NULL", call);
    const sl_chunk_digests *chunks = sl_manifest_chunks(m->manifest);
    const uint8_t *want = sl_manifest_tensor_digest(m->manifest, i);
    const uint8_t *want_part = want ? sl_manifest_part_digest(m->manifest, i, dim, n, rank) : NULL;
    if (sl_cancel_requested(cancel))
        return sl_fail(err, SLUICE_E_CANCELLED, "%s: cancelled before the part was read", call);
    /* a part the persistent cache holds: verified again as it is read */
    if (sl_engine_part_cached(e, i, want_part, dst, len)) {
        *index = i;
        return SLUICE_OK;
    }
    sl_range_tally tally = {0};
    /* a local file's reads go through the engine's seam */
    sl_reader rd = sl_engine_reader(e, cancel);
    part_args pa = {i, g, dst, want_part, want, chunks ? &chunks[i] : NULL, m->opts.algorithm,
                    &rd};
    int rc = part_direct(&m->index, &pa, &tally, err);
    if (rc != SLUICE_E_CANCELLED)
        rc = again_direct(m, i, rc, part_direct, &pa, &tally, err);
    if (rc == SLUICE_OK && want_part) {   /* verified against want_part: kept */
        char q[SL_QUOTE_MAX], label[SL_QUOTE_MAX + 96];
        int n_label = snprintf(label, sizeof label, "%s [part %llu of %llu along dim %u]",
                               sl_quote(q, sizeof q, t->name, t->name_len),
                               (unsigned long long)rank, (unsigned long long)n, dim);
        sl_engine_part_store(e, i, want_part, dst, len, label,
                             n_label < 0 ? 0 : (size_t)n_label < sizeof label ? (size_t)n_label
                                                                             : sizeof label - 1);
    }
    int unnoted = 0; /* 0 -> 1: this call writes the note; 2: written, readable */
    if (tally.part_fallback_bytes && atomic_compare_exchange_strong(&m->part_noted, &unnoted, 1)) {
        char q[SL_QUOTE_MAX];
        snprintf(m->part_note, sizeof m->part_note,
                 "%s: the manifest has no digest of part %llu of %llu of tensor %s along dim %u: "
                 "the whole tensor was read to check it (and so for every such part: "
                 "part_fallback_bytes; `sluice manifest --parts` writes part digests)",
                 m->loc->shown, (unsigned long long)rank, (unsigned long long)n,
                 sl_quote(q, sizeof q, t->name, t->name_len), dim);
        atomic_store(&m->part_noted, 2);
    }
    /* a cancelled part is not a failure (as a stream's tensors not delivered) */
    sl_engine_range_tally(e, &tally, rc < 0 && rc != SLUICE_E_CANCELLED);
    *index = i;
    return rc;
}

SLUICE_API int sluice_part_options_init(sluice_part_options *o)
{
    if (!o)
        return SLUICE_E_INVAL;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    return SLUICE_OK;
}

static int take_call_options(void *dst, size_t dst_size, const void *src, size_t known,
                             const char *what, sl_err *err);

static int take_part_options(sluice_part_options *dst, const sluice_part_options *src,
                             sl_err *err)
{
    sluice_part_options_init(dst);
    return take_call_options(dst, sizeof *dst, src, SL_END_OF(sluice_part_options, cancel),
                             "part", err);
}

SLUICE_API int sluice_read_part_into(sluice_model *m, const char *name, uint32_t dim,
                                     uint64_t rank, uint64_t n, void *dst, uint64_t len)
{
    return sluice_read_part_into_ex(m, name, dim, rank, n, dst, len, NULL);
}

SLUICE_API int sluice_read_part_into_ex(sluice_model *m, const char *name, uint32_t dim,
                                        uint64_t rank, uint64_t n, void *dst, uint64_t len,
                                        const sluice_part_options *o)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    sluice_part_options po;
    if (take_part_options(&po, o, &err) < 0)
        return sl_model_error(m, &err);
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    size_t i;
    sl_part_geom g;
    int rc = read_part(m, e, "sluice_read_part_into", name, dim, rank, n, dst, len, po.cancel,
                       &i, &g, &err);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

/* The block of a part handle: its description and its shape (its bytes
 * are in the pool); the handle frees it. */
typedef struct part_block {
    struct sluice_tensor_info info;
    uint64_t shape[];
} part_block;

SLUICE_API int sluice_acquire_part(sluice_model *m, const char *name, uint32_t dim,
                                   uint64_t rank, uint64_t n, sluice_tensor **out)
{
    return sluice_acquire_part_ex(m, name, dim, rank, n, out, NULL);
}

SLUICE_API int sluice_acquire_part_ex(sluice_model *m, const char *name, uint32_t dim,
                                      uint64_t rank, uint64_t n, sluice_tensor **out,
                                      const sluice_part_options *o)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    SL_TRY(acquire_args(m, e, out, "sluice_acquire_part", &err));
    sluice_part_options po;
    if (take_part_options(&po, o, &err) < 0)
        return sl_model_error(m, &err);
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    size_t i = 0;
    sl_part_geom g;
    part_block *b = NULL;
    int rc = find(m, name, &i, &err);
    const struct sluice_tensor_info *t = rc == SLUICE_OK ? &m->index.tensors[i] : NULL;
    if (rc == SLUICE_OK)
        rc = sl_part_geometry(t, dim, rank, n, &g, &err);
    uint64_t len = rc == SLUICE_OK ? g.count * g.seg : 0;
    void *data = NULL;
    sl_pool_blk *blk = NULL;
    if (rc == SLUICE_OK &&
        !(b = malloc(sizeof *b + t->ndim * sizeof b->shape[0])))
        rc = sl_fail(&err, SLUICE_E_NOMEM, "sluice_acquire_part: out of memory");
    if (rc == SLUICE_OK) {
        /* the part's bytes in the pool, taken as an acquire's load takes them */
        char q[SL_QUOTE_MAX], what[SL_QUOTE_MAX + 96];
        snprintf(what, sizeof what, "part %llu of %llu along dim %u of tensor %s",
                 (unsigned long long)rank, (unsigned long long)n, dim,
                 sl_quote(q, sizeof q, t->name, t->name_len));
        rc = sl_engine_part_room(e, what, len, po.cancel, &data, &blk, &err);
    }
    if (rc == SLUICE_OK)
        rc = read_part(m, e, "sluice_acquire_part", name, dim, rank, n, data, len, po.cancel,
                       &i, &g, &err);
    if (rc == SLUICE_OK) {
        b->info = *t;
        memcpy(b->shape, t->shape, t->ndim * sizeof b->shape[0]);
        b->shape[dim] /= n;
        b->info.shape = b->shape;
        b->info.nbytes = len;
        b->info.size = sizeof b->info;
        if ((rc = sl_engine_grant_part(e, i, b, blk, data, len, &b->info, out, &err)) ==
            SLUICE_OK)
            b = NULL, blk = NULL;
    }
    sl_engine_part_room_free(e, blk);
    free(b);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

SLUICE_API int sluice_digest_part(sluice_model *m, size_t i, uint32_t dim, uint64_t rank,
                                  uint64_t n, uint8_t digest[32])
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    sl_part_geom g;
    int rc = i >= m->index.ntensors || !digest
                 ? sl_fail(&err, SLUICE_E_INVAL, "sluice_digest_part: tensor %zu: %s", i,
                           !digest ? "digest is NULL" : "no such tensor")
                 : sl_part_geometry(&m->index.tensors[i], dim, rank, n, &g, &err);
    if (rc < 0)
        return sl_model_error(m, &err);
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    sl_range_tally tally = {0};
    rc = sl_part_digest(&m->index, i, &g, m->opts.algorithm, digest, &tally, &err);
    sl_engine_range_tally(e, &tally, rc < 0);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

SLUICE_API const char *sluice_part_note(sluice_model *m)
{
    if (sl_model_usable(m) != SLUICE_OK || atomic_load(&m->part_noted) != 2)
        return NULL;
    return m->part_note;
}

SLUICE_API int sluice_acquire_index(sluice_model *m, size_t i, sluice_tensor **out)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (out)
        *out = NULL;
    if (!e)
        return SLUICE_E_INVAL;
    if (!out || i >= m->index.ntensors) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_acquire_index: %s", !out ? "out is NULL"
                : "index out of range");
        return sl_model_error(m, &err);
    }
    return acquire(m, e, i, out);
}

SLUICE_API int sluice_release(sluice_tensor *t)
{
    return t ? sl_handle_release(t) : SLUICE_OK;
}

SLUICE_API const void *sluice_tensor_data(const sluice_tensor *t)
{
    return t ? sl_handle_data(t) : NULL;
}

SLUICE_API uint64_t sluice_tensor_size(const sluice_tensor *t)
{
    return t ? sl_handle_size(t) : 0;
}

SLUICE_API const struct sluice_tensor_info *sluice_tensor_info(const sluice_tensor *t)
{
    return t ? sl_handle_info(t) : NULL;
}

SLUICE_API const char *sluice_tensor_source(const sluice_tensor *t)
{
    return t ? sl_handle_source(t) : NULL;
}

SLUICE_API int sluice_tensor_digest(const sluice_tensor *t, uint8_t digest[32])
{
    if (!t || !digest)
        return SLUICE_E_INVAL;
    return sl_handle_digest(t, digest);
}

SLUICE_API int sluice_prefetch(sluice_model *m, const char *const *names, size_t n)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    size_t *ids;
    if (resolve(m, names, n, &ids, &err) < 0)
        return sl_model_error(m, &err);
    if (sl_engine_enter(e, &err) < 0) {
        free(ids);
        return sl_model_error(m, &err);
    }
    int rc = sl_engine_prefetch(e, ids, n, &err);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    return rc;
}

/* ---------------------------------------------------------------- streams */

SLUICE_API int sluice_stream_options_init(sluice_stream_options *o)
{
    if (!o)
        return SLUICE_E_INVAL;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->progress_interval_ms = 100;
    return SLUICE_OK;
}

/* Copies a caller's call options (a struct that starts with its size,
 * already filled with the defaults in dst) up to the size the caller
 * knows; a longer struct must have a zero tail past `known`. `what` names
 * the struct ("stream" for sluice_stream_options) in the messages. */
static int take_call_options(void *dst, size_t dst_size, const void *src, size_t known,
                             const char *what, sl_err *err)
{
    if (!src)
        return SLUICE_OK;
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size < sizeof size)
        return sl_fail(err, SLUICE_E_INVAL, "%s options: size %zu is too small; "
                       "call sluice_%s_options_init first", what, size, what);
    size_t set = set_tail(src, size, known);
    if (set)
        return sl_fail(err, SLUICE_E_INVAL, "%s options: byte %zu of the caller's %zu-byte "
                       "struct is not zero, but this library knows only the first %zu bytes",
                       what, set, size, dst_size);
    memcpy(dst, src, size < dst_size ? size : dst_size);
    memcpy(dst, &dst_size, sizeof dst_size);
    return SLUICE_OK;
}

static int take_stream_options(sluice_stream_options *dst, const sluice_stream_options *src,
                               sl_err *err)
{
    sluice_stream_options_init(dst);
    return take_call_options(dst, sizeof *dst, src, SL_END_OF(sluice_stream_options, cancel),
                             "stream", err);
}

SLUICE_API int sluice_stream_ex(sluice_model *m, const char *const *names, size_t n,
                                sluice_stream_fn fn, void *user, const sluice_stream_options *o)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    sluice_stream_options so;
    if (take_stream_options(&so, o, &err) < 0)
        return sl_model_error(m, &err);
    if (!fn) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_stream: the callback is NULL");
        return sl_model_error(m, &err);
    }
    size_t *ids = NULL;
    if (names && resolve(m, names, n, &ids, &err) < 0)
        return sl_model_error(m, &err);
    static const size_t none[1];
    if (sl_engine_enter(e, &err) < 0) {
        free(ids);
        return sl_model_error(m, &err);
    }
    /* names with n = 0 is the empty list, not every tensor */
    int rc = sl_engine_stream(e, names ? (ids ? ids : none) : NULL, n, fn, user, &so, &err);
    if (rc != SLUICE_OK)
        sl_model_error(m, &err);
    sl_engine_pause_point(e, SL_PAUSE_STREAM_EXIT);
    sl_engine_leave(e);
    free(ids);
    return rc;
}

SLUICE_API int sluice_stream(sluice_model *m, const char *const *names, size_t n,
                             sluice_stream_fn fn, void *user)
{
    return sluice_stream_ex(m, names, n, fn, user, NULL);
}

SLUICE_API int sluice_cancel_create(sluice_cancel **out)
{
    return out ? sl_cancel_create(out) : SLUICE_E_INVAL;
}

SLUICE_API void sluice_cancel_request(sluice_cancel *c)
{
    if (c)
        sl_cancel_request(c);
}

SLUICE_API int sluice_cancel_requested(const sluice_cancel *c)
{
    return sl_cancel_requested(c);
}

SLUICE_API void sluice_cancel_reset(sluice_cancel *c)
{
    if (c)
        sl_cancel_reset(c);
}

SLUICE_API void sluice_cancel_free(sluice_cancel *c)
{
    sl_cancel_free(c);
}

/* ---------------------------------------------------------------- verify */

SLUICE_API int sluice_verify_options_init(sluice_verify_options *o)
{
    if (!o)
        return SLUICE_E_INVAL;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->progress_interval_ms = 100;
    return SLUICE_OK;
}

static int take_verify_options(sluice_verify_options *dst, const sluice_verify_options *src,
                               sl_err *err)
{
    sluice_verify_options_init(dst);
    int rc = take_call_options(dst, sizeof *dst, src, SL_END_OF(sluice_verify_options, cancel),
                               "verify", err);
    if (rc < 0)
        return rc;
    if (dst->flags & ~SLUICE_VF_ALL_)
        return sl_fail(err, SLUICE_E_INVAL, "verify options: unknown flags 0x%x",
                       dst->flags & ~SLUICE_VF_ALL_);
    return SLUICE_OK;
}

SLUICE_API int sluice_verify(sluice_model *m, const char *const *names, size_t n,
                             const sluice_verify_options *o, struct sluice_verify_report *report)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    if (report && report->size < sizeof report->size) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_verify: report size %zu is too small", report->size);
        return sl_model_error(m, &err);
    }
    sluice_verify_options vo;
    if (take_verify_options(&vo, o, &err) < 0)
        return sl_model_error(m, &err);
    if ((vo.flags & SLUICE_VF_DIGEST_ONLY) && (m->index.caps_lacking & SL_SRC_DESCRIPTOR)) {
        sl_fail(&err, SLUICE_E_UNSUPPORTED, "sluice_verify: digest-only runs are not offered "
                "for a model with remote files (%s)", m->loc->shown); /* no credential */
        return sl_model_error(m, &err);
    }
    size_t *ids = NULL;
    if (names && resolve(m, names, n, &ids, &err) < 0)
        return sl_model_error(m, &err);
    /* No pool or handle is used, only the metrics; close must wait for this call. */
    if (sl_engine_enter(e, &err) < 0) {
        free(ids);
        return sl_model_error(m, &err);
    }
    sl_verify_tally tally; /* the model's metrics count each item as it is reported */
    sl_metrics_verify_begin(sl_engine_metrics(e), &tally, &vo);
    struct sluice_verify_report r;
    sl_range_tally net;
    int rc = sl_verify_run(&m->index, m->manifest, &m->opts, ids, names ? n : 0, !names, &vo,
                           &r, &net, &err);
    if (net.remote_reads)
        sl_engine_range_tally(e, &net, 0);
    /* The message is recorded before leaving: once the count drops, a
     * close waiting in another thread may free the model. */
    sl_engine_pause_point(e, SL_PAUSE_VERIFY_EXIT);
    if (rc < 0)
        sl_model_error(m, &err);
    sl_engine_leave(e);
    free(ids);
    if (report) {
        r.size = report->size;
        memcpy(report, &r, report->size < sizeof r ? report->size : sizeof r);
    }
    return rc;
}

/* ---------------------------------------------------------------- stats, trim */

SLUICE_API int sluice_stats(sluice_model *m, struct sluice_stats *out)
{
    sl_engine *e = engine_of(m);
    if (!e || !out || out->size < sizeof out->size)
        return query_fail(m, SLUICE_E_INVAL, "sluice_stats: out is NULL or its size too small");
    struct sluice_stats s;
    sl_err err = {0};
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    sl_engine_stats(e, &s);
    sl_engine_leave(e);
    s.size = out->size;
    memcpy(out, &s, out->size < sizeof s ? out->size : sizeof s);
    return SLUICE_OK;
}

SLUICE_API int sluice_trim(sluice_model *m, uint64_t *released)
{
    sl_engine *e = engine_of(m);
    if (released)
        *released = 0;
    if (!e)
        return SLUICE_E_INVAL;
    sl_err err = {0};
    if (sl_engine_enter(e, &err) < 0)
        return sl_model_error(m, &err);
    uint64_t given = sl_engine_trim(e);
    sl_engine_leave(e);
    if (released)
        *released = given;
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- manifests */

SLUICE_API sluice_verify_policy sluice_verify_mode(const sluice_model *model)
{
    return sl_model_usable(model) == SLUICE_OK ? sl_manifest_policy(model->manifest)
                                               : SLUICE_VERIFY_OFF;
}

SLUICE_API sluice_algorithm sluice_digest_algorithm(const sluice_model *model)
{
    return sl_model_usable(model) == SLUICE_OK ? model->opts.algorithm : SLUICE_ALG_SHA256;
}

SLUICE_API int sluice_manifest_version(const sluice_model *model)
{
    return sl_model_usable(model) == SLUICE_OK ? sl_manifest_version(model->manifest) : -1;
}

SLUICE_API int sluice_file_header_digest(const sluice_model *model, size_t file_index,
                                         sluice_algorithm alg, uint8_t digest[32])
{
    if (sl_model_usable(model) != SLUICE_OK || file_index >= model->index.nfiles || !digest ||
        (unsigned)alg > SLUICE_ALG_BLAKE3)
        return query_fail(model, SLUICE_E_INVAL, "sluice_file_header_digest: %s",
                          !digest ? "digest is NULL" : (unsigned)alg > SLUICE_ALG_BLAKE3
                          ? "unknown algorithm" : "file index out of range");
    const uint8_t *d = sl_index_header_digest(&model->index.files[file_index], alg);
    if (!d)
        return query_fail(model, SLUICE_E_UNSUPPORTED, "sluice_file_header_digest: this "
                          "build lacks the algorithm");
    memcpy(digest, d, 32);
    return SLUICE_OK;
}

SLUICE_API const char *sluice_manifest_path(const sluice_model *model)
{
    return sl_model_usable(model) == SLUICE_OK ? sl_manifest_path(model->manifest) : NULL;
}

SLUICE_API int sluice_manifest_tensor(const sluice_model *model, size_t i, uint8_t digest[32])
{
    if (sl_model_usable(model) < 0 || !digest || i >= model->index.ntensors)
        return query_fail(model, SLUICE_E_INVAL, "sluice_manifest_tensor: %s",
                          !digest ? "digest is NULL" : "index out of range");
    const uint8_t *d = sl_manifest_tensor_digest(model->manifest, i);
    if (!d)
        return query_fail(model, SLUICE_E_NOT_FOUND, "sluice_manifest_tensor: %s", model->manifest
                          ? "the manifest has no digest for this tensor" : "no manifest");
    memcpy(digest, d, 32);
    return SLUICE_OK;
}

SLUICE_API int sluice_manifest_chunks(const sluice_model *model, size_t i, uint64_t *chunk_bytes,
                                      uint32_t *count)
{
    if (sl_model_usable(model) != SLUICE_OK || i >= model->index.ntensors)
        return query_fail(model, SLUICE_E_INVAL, "sluice_manifest_chunks: index out of range");
    const sl_chunk_digests *c = sl_manifest_chunks(model->manifest);
    if (!c || !c[i].count || !sl_manifest_tensor_digest(model->manifest, i))
        return query_fail(model, SLUICE_E_NOT_FOUND, "sluice_manifest_chunks: %s",
                          model->manifest ? "the manifest has no chunk digests for this "
                          "tensor" : "no manifest");
    if (chunk_bytes)
        *chunk_bytes = c[i].bytes;
    if (count)
        *count = c[i].count;
    return SLUICE_OK;
}

SLUICE_API int sluice_manifest_file(const sluice_model *model, size_t file_index,
                                    uint8_t digest[32], uint64_t *size)
{
    if (sl_model_usable(model) < 0 || !digest || file_index >= model->index.nfiles)
        return query_fail(model, SLUICE_E_INVAL, "sluice_manifest_file: %s",
                          !digest ? "digest is NULL" : "file index out of range");
    const uint8_t *d = sl_manifest_file_digest(model->manifest, file_index, size);
    if (!d)
        return query_fail(model, SLUICE_E_NOT_FOUND, "sluice_manifest_file: %s",
                          model->manifest ? "the manifest has no digest for this file"
                                          : "no manifest");
    memcpy(digest, d, 32);
    return SLUICE_OK;
}

SLUICE_API char *sluice_digest_hex(const uint8_t digest[32], char hex[65])
{
    if (!hex)
        return NULL;
    if (!digest) {
        hex[0] = '\0';
        return hex;
    }
    return sl_hex_digest(hex, digest);
}
