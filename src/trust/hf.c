/* hf.c: see hf.h.
 *
 * One API request per open: the revision's commit and its files with
 * their LFS metadata (what huggingface_hub's model_info(files_metadata=True)
 * asks: /api/models/ORG/NAME/revision/REV?blobs=true, whose "siblings"
 * carry "rfilename", "size" and, for LFS files, "lfs": {"sha256", "size"}).
 * Every file is then read at that commit (resolve/COMMIT/FILE), so a
 * branch that moves during a load cannot mix two versions of a model. On
 * a refusal a second request (/api/models/ORG/NAME) tells a missing
 * revision from a missing (or private) repository. */
#include "trust/hf.h"
#include "base/location.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The API's reply: a large repository lists thousands of files. */
#define HF_API_MAX ((size_t)64 << 20)

struct sl_hf_repo {
    char *pinned;       /* hf://ORG/NAME@COMMIT[/FILE] */
    char *prefix;       /* hf://ORG/NAME@COMMIT/ */
    cJSON *info;        /* the API's reply */
};

static int hub_status(const sl_err *e)
{
    const char *p = strstr(e->msg, "HTTP ");
    return p ? atoi(p + 5) : 0;
}

/* ENDPOINT/api/models/ORG/NAME[/revision/REV][?blobs=true] */
static char *api_url(const sl_remote_cfg *c, const sl_hf_loc *h, int with_rev)
{
    size_t n = strlen(c->hf_endpoint) + h->repo_len + h->rev_len + 64;
    char *u = malloc(n);
    if (u && with_rev)
        snprintf(u, n, "%s/api/models/%.*s/revision/%.*s?blobs=true", c->hf_endpoint,
                 (int)h->repo_len, h->repo, h->rev ? (int)h->rev_len : 4,
                 h->rev ? h->rev : "main");
    else if (u)
        snprintf(u, n, "%s/api/models/%.*s", c->hf_endpoint, (int)h->repo_len, h->repo);
    return u;
}

/* The words of a refused API request, by what the second request says. */
static int refused(const sl_remote_cfg *c, const sl_hf_loc *h, const char *loc, int code,
                   const sl_err *why, sl_err *err)
{
    int status = hub_status(why);
    if (code == SLUICE_E_NOMEM || code == SLUICE_E_UNSUPPORTED || code == SLUICE_E_CANCELLED ||
        (status != 404 && status != 401 && status != 403))
        return sl_fail(err, code, "%s: the Hub's API (%s): %s", loc, c->hf_endpoint, why->msg);
    char *u = api_url(c, h, 0), *text = NULL;
    size_t len = 0;
    sl_err e2;
    int repo_ok =
        u && sl_remote_get_anchor(c, u, HF_API_MAX, &text, &len, SLUICE_E_NO_FILES, &e2) == 0;
    free(u);
    free(text);
    if (repo_ok)
        return sl_fail(err, SLUICE_E_NO_FILES, "%s: repository %.*s has no revision \"%.*s\" "
                       "on %s (HTTP %d)", loc, (int)h->repo_len, h->repo,
                       h->rev ? (int)h->rev_len : 4, h->rev ? h->rev : "main", c->hf_endpoint,
                       status);
    if (status == 404)
        return sl_fail(err, SLUICE_E_NO_FILES, "%s: no repository %.*s on %s (HTTP 404)", loc,
                       (int)h->repo_len, h->repo, c->hf_endpoint);
    return sl_fail(err, SLUICE_E_REMOTE, "%s: repository %.*s on %s refused (HTTP %d): it does "
                   "not exist, or it is private or gated and %s", loc, (int)h->repo_len, h->repo,
                   c->hf_endpoint, status,
                   c->hf_token ? "the token (http_token or HF_TOKEN) has no access to it"
                               : "no token was sent (set HF_TOKEN or http_token)");
}

static const cJSON *sibling(const sl_hf_repo *r, const char *name, size_t len)
{
    const cJSON *s, *list = cJSON_GetObjectItemCaseSensitive(r->info, "siblings");
    cJSON_ArrayForEach(s, list) {
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "rfilename"));
        if (f && strlen(f) == len && !memcmp(f, name, len))
            return s;
    }
    return NULL;
}

/* The repository's .safetensors files, for a message. */
static void list_safetensors(const sl_hf_repo *r, char *buf, size_t cap)
{
    const cJSON *s, *list = cJSON_GetObjectItemCaseSensitive(r->info, "siblings");
    size_t o = 0;
    buf[0] = '\0';
    cJSON_ArrayForEach(s, list) {
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "rfilename"));
        size_t n = f ? strlen(f) : 0;
        if (n > 12 && !strcmp(f + n - 12, ".safetensors") && o + n + 3 < cap)
            o += (size_t)snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", f);
    }
    if (!o)
        snprintf(buf, cap, "none");
}

static int check_names(const sl_hf_repo *r, const sl_hf_loc *h, const char *loc,
                       const char *commit, sl_err *err)
{
    char files[512];
    if (h->file) {
        if (sibling(r, h->file, h->file_len))
            return SLUICE_OK;
        list_safetensors(r, files, sizeof files);
        return sl_fail(err, SLUICE_E_NO_FILES, "%s: no file %.*s in %.*s at commit %s (its "
                       ".safetensors files: %s)", loc, (int)h->file_len, h->file,
                       (int)h->repo_len, h->repo, commit, files);
    }
    static const char idx[] = "model.safetensors.index.json", one[] = "model.safetensors";
    if (sibling(r, idx, sizeof idx - 1) || sibling(r, one, sizeof one - 1))
        return SLUICE_OK;
    list_safetensors(r, files, sizeof files);
    return sl_fail(err, SLUICE_E_NO_FILES, "%s: neither %s nor %s in %.*s at commit %s (its "
                   ".safetensors files: %s; name one with hf://%.*s@REVISION/FILE)", loc, idx,
                   one, (int)h->repo_len, h->repo, commit, files, (int)h->repo_len, h->repo);
}

static int is_commit(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n >= 7 && n <= 64 && strspn(s, "0123456789abcdef") == n;
}

/* Whether the revision asked names a commit in full (40 hex digits, or 64
 * for a SHA-256 repository): the Hub must answer that very commit. A
 * shorter hex revision may be a branch or a tag of that name, so it is
 * not judged. */
static int full_commit(const sl_hf_loc *h)
{
    return h->rev && (h->rev_len == 40 || h->rev_len == 64) &&
           strspn(h->rev, "0123456789abcdef") >= h->rev_len;
}

static int resolve(const sl_remote_cfg *c, const char *loc, sl_hf_repo **out, sl_err *err)
{
    *out = NULL;
    if (strncmp(loc, "hf://", 5) != 0)
        return SLUICE_OK;
    sl_hf_loc h;
    if (sl_hf_parse(loc, &h) < 0)
        return sl_fail(err, SLUICE_E_INVAL, "%s: not a Hub location: expected "
                       "hf://ORG/NAME[@REVISION][/FILE] (a REVISION with '/' written %%2F)", loc);
    if (!c)
        return sl_fail(err, SLUICE_E_UNSUPPORTED, "%s: remote locations are not enabled", loc);
    char *u = api_url(c, &h, 1), *text = NULL;
    if (!u)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    size_t len = 0;
    sl_err e2;
    int rc = sl_remote_get_anchor(c, u, HF_API_MAX, &text, &len, SLUICE_E_NO_FILES, &e2);
    free(u);
    if (rc < 0)
        return refused(c, &h, loc, rc, &e2, err);
    sl_hf_repo *r = calloc(1, sizeof *r);
    if (!r) {
        free(text);
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    }
    r->info = cJSON_ParseWithLength(text, len);
    free(text);
    const char *commit = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r->info, "sha"));
    if (!r->info || !is_commit(commit) ||
        !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(r->info, "siblings"))) {
        rc = sl_fail(err, SLUICE_E_REMOTE, "%s: the Hub's API (%s) answered no commit \"sha\" "
                     "and \"siblings\" list for %.*s", loc, c->hf_endpoint, (int)h.repo_len,
                     h.repo);
        goto fail;
    }
    /* pinned means pinned: a Hub (a mirror of it, a proxy in front) that
     * answers another commit for a commit asked is not believed */
    if (full_commit(&h) && (strlen(commit) != h.rev_len || memcmp(commit, h.rev, h.rev_len))) {
        rc = sl_fail(err, SLUICE_E_REMOTE, "%s: the Hub's API (%s) answered commit %s for "
                     "commit %.*s: not the one pinned", loc, c->hf_endpoint, commit,
                     (int)h.rev_len, h.rev);
        goto fail;
    }
    if ((rc = check_names(r, &h, loc, commit, err)) < 0)
        goto fail;
    size_t n = h.repo_len + strlen(commit) + h.file_len + 16;
    r->pinned = malloc(n);
    r->prefix = malloc(n);
    if (!r->pinned || !r->prefix) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto fail;
    }
    snprintf(r->prefix, n, "hf://%.*s@%s/", (int)h.repo_len, h.repo, commit);
    snprintf(r->pinned, n, "hf://%.*s@%s%s%.*s", (int)h.repo_len, h.repo, commit,
             h.file ? "/" : "", (int)h.file_len, h.file ? h.file : "");
    *out = r;
    return SLUICE_OK;
fail:
    sl_hf_free(r);
    return rc;
}

int sl_hf_resolve(const sl_remote_cfg *c, const char *loc, sl_hf_repo **out, sl_err *err)
{
    int rc = resolve(c, loc, out, err);
    /* messages name the endpoint without its user:password@ or query */
    if (rc < 0 && c)
        sl_location_scrub(err->msg, c->hf_endpoint_loc);
    return rc;
}

const char *sl_hf_pinned(const sl_hf_repo *r)
{
    return r->pinned;
}

int sl_hf_manifest(const sl_hf_repo *r, const sl_index *ix, char **text, size_t *len,
                   char **named, int *all, sl_err *err)
{
    *text = *named = NULL;
    *len = 0;
    *all = 0;
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateObject();
    int nomem = !root || !files, listed = 0;
    if (!nomem) {
        cJSON_AddItemToObject(root, "files", files);
        files = NULL;
        nomem |= !cJSON_AddStringToObject(root, "format", "sluice-manifest") ||
                 !cJSON_AddNumberToObject(root, "version", 1) ||
                 !cJSON_AddStringToObject(root, "algorithm", "sha256");
    }
    size_t plen = strlen(r->prefix);
    for (size_t i = 0; !nomem && i < ix->nfiles; i++) {
        const sl_file *f = &ix->files[i];
        if (strncmp(f->path, r->prefix, plen) != 0)
            continue;
        const char *rel = f->path + plen;
        const cJSON *s = sibling(r, rel, sl_location_name_len_of(f->path) - plen);
        const cJSON *lfs = s ? cJSON_GetObjectItemCaseSensitive(s, "lfs") : NULL;
        const char *sha = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(lfs, "sha256"));
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(lfs, "size");
        if (!sha)
            continue;
        cJSON *e = cJSON_CreateObject();
        nomem |= !e || !cJSON_AddStringToObject(e, "sha256", sha) ||
                 (cJSON_IsNumber(size) && !cJSON_AddNumberToObject(e, "size", size->valuedouble));
        if (e && !nomem)
            cJSON_AddItemToObject(cJSON_GetObjectItemCaseSensitive(root, "files"), f->name, e);
        else
            cJSON_Delete(e);
        listed++;
    }
    *all = listed && (size_t)listed == ix->nfiles;
    if (!nomem && listed) {
        *text = cJSON_PrintUnformatted(root);
        size_t n = strlen(r->prefix) + 40;
        if ((*named = malloc(n)))
            snprintf(*named, n, "%.*s (the Hub's LFS SHA-256)", (int)(plen - 1), r->prefix);
        nomem |= !*text || !*named;
    }
    cJSON_Delete(root);
    cJSON_Delete(files);
    if (nomem) {
        free(*text);
        free(*named);
        *text = *named = NULL;
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    }
    *len = *text ? strlen(*text) : 0;
    return SLUICE_OK;
}

void sl_hf_free(sl_hf_repo *r)
{
    if (!r)
        return;
    free(r->pinned);
    free(r->prefix);
    cJSON_Delete(r->info);
    free(r);
}
