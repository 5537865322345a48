/* index.c: from a path to the tensor index (see index.h and sluice_open).
 *
 * Each file's header is read once into private memory (pread), parsed and
 * validated by header.c, copied into storage the index owns, and freed.
 * Nothing is ever mapped, so a file truncated during or after open cannot
 * raise SIGBUS, and a writer cannot change the bytes between validation
 * and parsing.
 */
#include "index/index.h"

#include "base/digest.h"
#include "base/location.h"

#include "index/header.h"
#include "sources/remote.h"
#include "index/source.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INDEX_JSON_MAX ((size_t)256 << 20)
#define BLOCK_MIN ((size_t)64 << 10)

/* ---------------------------------------------------------------- storage */

/* Names, shapes and metadata live in a few large blocks freed together. */
struct sl_block {
    struct sl_block *next;
    size_t used, cap;
    max_align_t data[];
};

static void *store(sl_index *ix, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    struct sl_block *b = ix->blocks;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > BLOCK_MIN ? size : BLOCK_MIN;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = ix->blocks;
        ix->blocks = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p;
}

static char *store_string(sl_index *ix, const char *s, size_t len)
{
    char *p = store(ix, len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

/* ---------------------------------------------------------------- one file */

static int add_tensors(sl_index *ix, sl_file *f, size_t file_index, const sl_header *h, sl_err *err)
{
    size_t need = ix->ntensors + h->ntensors;
    struct sluice_tensor_info *grown = realloc(ix->tensors, (need ? need : 1) * sizeof *grown);
    if (!grown)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", f->path);
    ix->tensors = grown;
    for (size_t i = 0; i < h->ntensors; i++) {
        const sl_header_tensor *ht = &h->tensors[i];
        struct sluice_tensor_info *t = &ix->tensors[ix->ntensors];
        memset(t, 0, sizeof *t);
        t->size = sizeof *t; /* what sluice_tensor_info(handle) hands out */
        t->name = store_string(ix, ht->name, ht->name_len);
        uint64_t *shape = ht->ndim ? store(ix, ht->ndim * sizeof *shape) : NULL;
        if (!t->name || (ht->ndim && !shape))
            return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", f->path);
        if (ht->ndim)
            sl_header_dims(h, ht, shape);
        t->name_len = ht->name_len;
        t->dtype = ht->dtype;
        t->ndim = ht->ndim;
        t->shape = shape;
        t->nbytes = ht->end - ht->begin;
        t->data_begin = ht->begin;
        t->data_end = ht->end;
        t->offset = f->data_start + ht->begin;
        t->file_index = file_index;
        t->file = f->path;
        t->index = ix->ntensors;
        ix->total_bytes += t->nbytes;
        ix->ntensors++;
    }
    f->tensor_count = h->ntensors;
    return SLUICE_OK;
}

static int copy_metadata(sl_index *ix, sl_file *f, const sl_header *h)
{
    f->metadata_kind = h->metadata_kind;
    if (h->metadata_kind != SLUICE_METADATA_OBJECT)
        return SLUICE_OK;
    const sj_node *obj = &h->doc.nodes[h->metadata_node];
    f->metadata_count = obj->count;
    f->metadata = store(ix, (obj->count ? obj->count : 1) * sizeof *f->metadata);
    if (!f->metadata)
        return SLUICE_E_NOMEM;
    size_t i = 0;
    for (uint32_t c = obj->first_child; c != SJ_NONE; c = h->doc.nodes[c].next, i++) {
        const sj_node *v = &h->doc.nodes[c];
        sluice_kv *kv = &f->metadata[i];
        kv->key = store_string(ix, v->key, v->key_len);
        kv->value = store_string(ix, v->str, v->len);
        if (!kv->key || !kv->value)
            return SLUICE_E_NOMEM;
        kv->key_len = v->key_len;
        kv->value_len = v->len;
    }
    return SLUICE_OK;
}

static int read_fully(const sl_index *ix, sl_file *f, unsigned char *buf, size_t len,
                      uint64_t offset, sl_err *err)
{
    return f->src->read(f, ix->remote, buf, len, offset, err);
}

static void run_hook(const sl_index *ix, sl_index_stage stage, const sl_file *f)
{
    if (ix->hooks && ix->hooks->fn)
        ix->hooks->fn(ix->hooks->ctx, stage, f->path);
}

/* Reads the first 8 + N bytes once, into private memory, and validates and
 * parses that copy alone: a writer changing the file meanwhile cannot make
 * the index disagree with what was validated (every pass of header.c sees
 * the same bytes), and nothing is mapped, so a file truncated during open
 * gives an error, never SIGBUS. The copy is freed before return. */
static int read_header(sl_index *ix, size_t file_index, sl_err *err)
{
    sl_file *f = &ix->files[file_index];
    unsigned char first8[8];
    run_hook(ix, SL_INDEX_AFTER_STAT, f);
    if (f->size >= 8)
        SL_TRY(read_fully(ix, f, first8, 8, 0, err));
    uint64_t n;
    SL_TRY(sl_header_length(f->path, first8, f->size, &n, err));
    size_t len = (size_t)(8 + n);
    unsigned char *bytes = malloc(len);
    if (!bytes)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory for the %zu-byte header", f->path, len);
    memcpy(bytes, first8, 8);
    int rc = read_fully(ix, f, bytes + 8, (size_t)n, 8, err);
    if (rc < 0) {
        free(bytes);
        return rc;
    }
    run_hook(ix, SL_INDEX_AFTER_HEADER_READ, f);
    sl_header h;
    rc = sl_header_parse(f->path, bytes, len, f->size, &h, err);
    /* A version 2 manifest checks these at open; the bytes digested are
     * the very bytes parsed. */
    for (int alg = SLUICE_ALG_SHA256; rc == SLUICE_OK && alg <= SLUICE_ALG_BLAKE3; alg++)
        if (sl_md_supported((sluice_algorithm)alg)) {
            if (sl_md_oneshot((sluice_algorithm)alg, bytes, len, f->header_digest[alg]) < 0)
                rc = sl_fail(err, SLUICE_E_NOMEM, "%s: cannot digest the header (%s)", f->path,
                             sluice_algorithm_name((sluice_algorithm)alg));
            else
                f->header_digest_has |= 1u << alg;
        }
    if (rc == SLUICE_OK) {
        f->header_bytes = n;
        f->data_start = 8 + n;
        f->first_tensor = ix->ntensors;
        rc = add_tensors(ix, f, file_index, &h, err);
    }
    if (rc == SLUICE_OK && copy_metadata(ix, f, &h) < 0)
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", f->path);
    sl_header_free(&h);
    free(bytes); /* after h: its number literals point into it */
    return rc;
}

const uint8_t *sl_index_header_digest(const sl_file *f, sluice_algorithm alg)
{
    if ((unsigned)alg > SLUICE_ALG_BLAKE3 || !(f->header_digest_has & 1u << alg))
        return NULL;
    return f->header_digest[alg];
}

int sl_file_reopen(const sl_file *f, const char *proc_fd_dir, int flags)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%d", proc_fd_dir, f->fd);
    flags |= O_RDONLY | O_CLOEXEC;
    int fd = open(path, flags);
    if (fd < 0 && errno == ENOENT)
        fd = open(f->path, flags);
    if (fd < 0)
        return -1;
    struct stat a, b;
    if (fstat(fd, &a) != 0 || fstat(f->fd, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        close(fd);
        errno = EXDEV;
        return -1;
    }
    return fd;
}

/* The source kind of loc in ix, by its kind: a remote location is one
 * only when ix has remote locations enabled (else it is a path like
 * another, as it always was). */
static const sl_source_methods *source_of(const sl_index *ix, const sl_location *loc)
{
    return ix->remote ? sl_source_of(loc) : &sl_source_local;
}

/* Opens dir/name (dir may be NULL) as file number ix->nfiles. */
static int open_file(sl_index *ix, const char *dir, const char *name, int missing_code, sl_err *err)
{
    sl_file *grown = realloc(ix->files, (ix->nfiles + 1) * sizeof *grown);
    if (!grown)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    ix->files = grown;
    sl_file *f = &ix->files[ix->nfiles];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    ix->nfiles++;
    size_t dlen = dir ? strlen(dir) : 0, nlen = strlen(name);
    if (!(f->path = malloc(dlen + nlen + 2)))
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    if (dir) {
        memcpy(f->path, dir, dlen);
        f->path[dlen] = '/';
        memcpy(f->path + dlen + 1, name, nlen + 1);
        f->name = f->path + dlen + 1;
    } else {
        memcpy(f->path, name, nlen + 1);
        const char *slash = strrchr(f->path, '/');
        f->name = slash ? slash + 1 : f->path;
    }
    if (!(f->loc = sl_location_new(f->path)))   /* parsed once */
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    f->src = source_of(ix, f->loc);
    SL_TRY(f->src->open(f, ix->remote, missing_code, err));
    ix->caps_any |= f->src->caps;
    ix->caps_lacking |= ~f->src->caps;
    /* The manifest's "files" key is the base name of the path alone: a
     * presigned URL's query is no part of the file's name. */
    const char *lp = f->src == &sl_source_local ? f->loc->given : f->loc->path;
    size_t plen = strlen(lp), b = plen;
    while (b > 0 && lp[b - 1] != '/')
        b--;
    size_t n = strlen(f->path);
    if (n >= plen - b && !strcmp(f->path + n - (plen - b), lp + b))
        f->name = f->path + n - (plen - b);
    else if (!(f->name = store_string(ix, lp + b, plen - b)))
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    return read_header(ix, ix->nfiles - 1, err);
}

/* ---------------------------------------------------------------- lookup */

/* FNV-1a from a per-index random start, so that names crafted to collide
 * in the table cannot turn lookups quadratic. */
static uint64_t hash_name(uint64_t seed, const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

int sl_tensor_same_kind(const struct sluice_tensor_info *a, const struct sluice_tensor_info *b)
{
    int same = a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes;
    for (uint32_t d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    return same;
}

size_t sl_index_find(const sl_index *ix, const char *name, size_t len)
{
    if (!ix->slots)
        return SIZE_MAX;
    for (size_t s = hash_name(ix->seed, name, len) & ix->slot_mask;; s = (s + 1) & ix->slot_mask) {
        size_t i = ix->slots[s];
        if (i == SIZE_MAX)
            return SIZE_MAX;
        const struct sluice_tensor_info *t = &ix->tensors[i];
        if (t->name_len == len && memcmp(t->name, name, len) == 0)
            return i;
    }
}

/* Builds the name table; a name seen twice, in one file or two, fails. */
static int build_table(sl_index *ix, sl_err *err)
{
    if (getrandom(&ix->seed, sizeof ix->seed, GRND_NONBLOCK) != (ssize_t)sizeof ix->seed)
        ix->seed = (uint64_t)(uintptr_t)ix ^ (uint64_t)time(NULL);
    size_t cap = 16;
    while (cap < ix->ntensors * 2)
        cap *= 2;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory for the name table");
    memset(ix->slots, 0xff, cap * sizeof *ix->slots);
    ix->slot_mask = cap - 1;
    for (size_t i = 0; i < ix->ntensors; i++) {
        const struct sluice_tensor_info *t = &ix->tensors[i];
        size_t s = hash_name(ix->seed, t->name, t->name_len) & ix->slot_mask;
        for (; ix->slots[s] != SIZE_MAX; s = (s + 1) & ix->slot_mask) {
            const struct sluice_tensor_info *o = &ix->tensors[ix->slots[s]];
            if (o->name_len == t->name_len && !memcmp(o->name, t->name, t->name_len)) {
                char q[SL_QUOTE_MAX];
                sl_quote(q, sizeof q, t->name, t->name_len);
                if (o->file_index == t->file_index)
                    return sl_fail(err, SLUICE_E_DUPLICATE, "%s: tensor %s appears twice in the header",
                                   t->file, q);
                return sl_fail(err, SLUICE_E_DUPLICATE, "%s: tensor %s is also in %s", t->file, q, o->file);
            }
        }
        ix->slots[s] = i;
    }
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- index.json */

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A shard name must stay inside the index's directory. */
static int plain_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* text: the index.json already read (taken), or NULL to read it. */
static int open_sharded(sl_index *ix, const char *json_path, size_t name_len, char *text,
                        size_t len, sl_err *err)
{
    char *dir = NULL;
    const char **shards = NULL;
    unsigned char *seen = NULL;
    size_t nshards = 0;
    cJSON *root = NULL;
    int rc = SLUICE_OK;
    if (!text)
        /* remote when ix reaches remote files: only a remote location's
         * index is opened so (sl_index_open_ex) */
        rc = (ix->remote ? &sl_source_remote : &sl_source_local)
                 ->read_small(ix->remote, json_path, INDEX_JSON_MAX, &text, &len, err);
    if (rc < 0)
        return rc;
    root = cJSON_ParseWithLength(text, len);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!root) {
        rc = sl_fail(err, SLUICE_E_INDEX, "%s: not valid JSON", json_path);
        goto out;
    }
    if (!cJSON_IsObject(map)) {
        rc = sl_fail(err, SLUICE_E_INDEX, "%s: no \"weight_map\" object", json_path);
        goto out;
    }
    int count = cJSON_GetArraySize(map);
    shards = calloc((size_t)count + 1, sizeof *shards);
    if (!shards) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", json_path);
        goto out;
    }
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !plain_name(e->valuestring)) {
            rc = sl_fail(err, SLUICE_E_INDEX, "%s: weight_map value of \"%s\" is not a file name in its directory",
                         json_path, e->string);
            goto out;
        }
        shards[nshards++] = e->valuestring;
    }
    if (nshards == 0) {
        rc = sl_fail(err, SLUICE_E_INDEX, "%s: weight_map is empty", json_path);
        goto out;
    }
    qsort(shards, nshards, sizeof *shards, cmp_cstr);
    size_t unique = 0;
    for (size_t i = 0; i < nshards; i++)
        if (!unique || strcmp(shards[unique - 1], shards[i]) != 0)
            shards[unique++] = shards[i];
    nshards = unique;
    /* the shards are beside it: in the directory of its path (a query,
     * which may hold '/', is not part of it and is not sent for them) */
    if (!(dir = strndup(json_path, name_len))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto out;
    }
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    for (size_t i = 0; i < nshards; i++)
        if ((rc = open_file(ix, slash ? dir : NULL, shards[i], SLUICE_E_INDEX_SHARD, err)) < 0)
            goto out;
    if ((rc = build_table(ix, err)) < 0)
        goto out;
    /* weight_map and the shards must agree both ways. */
    if (!(seen = calloc(ix->ntensors ? ix->ntensors : 1, 1))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto out;
    }
    for (const cJSON *e = map->child; e; e = e->next) {
        size_t t = sl_index_find(ix, e->string, strlen(e->string));
        if (t == SIZE_MAX) {
            rc = sl_fail(err, SLUICE_E_INDEX_MISMATCH, "%s: tensor \"%s\" is mapped to %s, which does not hold it",
                         json_path, e->string, e->valuestring);
            goto out;
        }
        const sl_file *f = &ix->files[ix->tensors[t].file_index];
        if (strcmp(f->name, e->valuestring) != 0) {
            rc = sl_fail(err, SLUICE_E_INDEX_MISMATCH, "%s: tensor \"%s\" is mapped to %s but lives in %s",
                         json_path, e->string, e->valuestring, f->name);
            goto out;
        }
        if (seen[t]++) {
            rc = sl_fail(err, SLUICE_E_INDEX, "%s: tensor \"%s\" is listed twice in weight_map", json_path, e->string);
            goto out;
        }
    }
    for (size_t t = 0; t < ix->ntensors; t++)
        if (!seen[t]) {
            char q[SL_QUOTE_MAX];
            rc = sl_fail(err, SLUICE_E_INDEX_MISMATCH, "%s: tensor %s of %s is not in weight_map", json_path,
                         sl_quote(q, sizeof q, ix->tensors[t].name, ix->tensors[t].name_len),
                         ix->tensors[t].file);
            goto out;
        }
out:
    free(seen);
    free(dir);
    free(shards);
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- paths */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Whether the name part of loc ends with suffix. */
static int name_ends_with(const sl_location *loc, const char *suffix)
{
    size_t n = loc->name_len, m = strlen(suffix);
    return n >= m && !memcmp(loc->given + n - m, suffix, m);
}

static int open_directory(sl_index *ix, const char *dir, sl_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return sl_fail_errno(err, SLUICE_E_IO, errno, "%s", dir);
    char **names = NULL, *index_name = NULL;
    size_t n = 0, cap = 0, nindex = 0;
    int rc = SLUICE_OK, has_model_index = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, "model.safetensors.index.json"))
            has_model_index = 1;
        if (ends_with(e->d_name, ".safetensors.index.json")) {
            nindex++;
            free(index_name);
            index_name = strdup(e->d_name);
            if (!index_name) {
                rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
                break;
            }
            continue;
        }
        if (!ends_with(e->d_name, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **grown = realloc(names, cap * sizeof *grown);
            if (!grown) {
                rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
                break;
            }
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == SLUICE_OK) {
        const char *chosen = has_model_index ? "model.safetensors.index.json" : nindex == 1 ? index_name : NULL;
        if (chosen) {
            char *p = malloc(strlen(dir) + strlen(chosen) + 2);
            if (!p) {
                rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
            } else {
                strcpy(p, dir);
                strcat(p, "/");
                strcat(p, chosen);
                rc = open_sharded(ix, p, strlen(p), NULL, 0, err);
                free(p);
            }
        } else if (nindex > 1) {
            rc = sl_fail(err, SLUICE_E_INDEX, "%s: several *.safetensors.index.json files; open one of them",
                         dir);
        } else if (n == 0) {
            rc = sl_fail(err, SLUICE_E_NO_FILES, "%s: no .safetensors file in this directory", dir);
        } else {
            qsort(names, n, sizeof *names, cmp_cstr);
            for (size_t i = 0; i < n && rc == SLUICE_OK; i++)
                rc = open_file(ix, dir, names[i], SLUICE_E_IO, err);
            if (rc == SLUICE_OK)
                rc = build_table(ix, err);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(index_name);
    return rc;
}

int sl_index_open(sl_index *ix, const char *path, sl_err *err)
{
    return sl_index_open_hooked(ix, path, NULL, err);
}

/* A remote "directory" is a prefix: its model.safetensors.index.json when
 * there is one, else its model.safetensors (nothing can be listed). A
 * query on the prefix names no object and is not sent for them. */
static int open_remote_directory(sl_index *ix, const sl_location *where, sl_err *err)
{
    const char *loc = where->given, *shown = where->shown;
    size_t n = where->name_len;
    while (n > 0 && loc[n - 1] == '/')
        n--;
    char *p = malloc(n + sizeof "/model.safetensors.index.json");
    if (!p)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    snprintf(p, n + sizeof "/model.safetensors.index.json", "%.*s/model.safetensors.index.json",
             (int)n, loc);
    char *text = NULL;
    size_t len = 0;
    int rc = sl_remote_get(ix->remote, p, INDEX_JSON_MAX, &text, &len, 0, err);
    if (rc == SLUICE_OK && text) {
        rc = open_sharded(ix, p, strlen(p), text, len, err);   /* no query: made from the name */
    } else if (rc == SLUICE_OK) {
        snprintf(p, n + sizeof "/model.safetensors.index.json", "%.*s/model.safetensors", (int)n, loc);
        if ((rc = open_file(ix, NULL, p, SLUICE_E_NO_FILES, err)) == SLUICE_OK)
            rc = build_table(ix, err);
        else if (rc == SLUICE_E_NO_FILES) {
            rc = sl_fail(err, SLUICE_E_NO_FILES, "%s: neither model.safetensors.index.json nor "
                         "model.safetensors is there", shown);
        }
    }
    free(p);
    return rc;
}

int sl_index_open_ex(sl_index *ix, const sl_location *loc, const struct sl_remote_cfg *remote,
                     sl_err *err)
{
    const char *path = loc->given;
    /* a location that needs no remote configuration is a path */
    if (!(sl_source_of(loc)->caps & SL_SRC_NETWORK))
        return sl_index_open_hooked(ix, path, NULL, err);
    memset(ix, 0, sizeof *ix);
    ix->remote = remote;
    int rc;
    if (!remote)
        rc = sl_fail(err, SLUICE_E_UNSUPPORTED, "%s: remote locations are not enabled", path);
    else if (name_ends_with(loc, ".json"))
        rc = open_sharded(ix, path, loc->name_len, NULL, 0, err);
    else if (name_ends_with(loc, ".safetensors")) {
        if ((rc = open_file(ix, NULL, path, SLUICE_E_NO_FILES, err)) == SLUICE_OK)
            rc = build_table(ix, err);
    } else
        rc = open_remote_directory(ix, loc, err);
    if (rc < 0) {
        sl_index_free(ix);
        sl_location_scrub(err->msg, loc);
    }
    else
        ix->remote = remote;
    return rc;
}

int sl_index_open_hooked(sl_index *ix, const char *path, const sl_index_hooks *hooks, sl_err *err)
{
    memset(ix, 0, sizeof *ix);
    ix->hooks = hooks;
    struct stat st;
    int rc;
    if (stat(path, &st) != 0)
        rc = sl_fail_errno(err, errno == ENOENT ? SLUICE_E_NO_FILES : SLUICE_E_IO, errno, "%s", path);
    else if (S_ISDIR(st.st_mode))
        rc = open_directory(ix, path, err);
    else if (ends_with(path, ".json"))
        rc = open_sharded(ix, path, strlen(path), NULL, 0, err);   /* a local path: all name */
    else if ((rc = open_file(ix, NULL, path, SLUICE_E_NO_FILES, err)) == SLUICE_OK)
        rc = build_table(ix, err);
    ix->hooks = NULL; /* the caller's, for this call only */
    if (rc < 0)
        sl_index_free(ix);
    return rc;
}

void sl_index_free(sl_index *ix)
{
    for (size_t i = 0; i < ix->nfiles; i++) {
        if (ix->files[i].src)
            ix->files[i].src->close(&ix->files[i]);
        free(ix->files[i].path);
        sl_location_free(ix->files[i].loc);
    }
    free(ix->files);
    free(ix->tensors);
    free(ix->slots);
    while (ix->blocks) {
        struct sl_block *next = ix->blocks->next;
        free(ix->blocks);
        ix->blocks = next;
    }
    memset(ix, 0, sizeof *ix);
}
