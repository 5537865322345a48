/* index.h: the tensor index of an open model (index.c, header.c).
 *
 * Built once by sl_index_open from the headers alone and immutable after,
 * so every thread may read it without a lock. Tensors are stored in model
 * order (shard order, then data offset); tensor i of the public API is
 * ix->tensors[i].
 */
#ifndef SLUICE_INDEX_H
#define SLUICE_INDEX_H

#include "base/error.h"
#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

struct sl_source_methods;

typedef struct sl_file {
    const struct sl_source_methods *src; /* source.h: how it is read, chosen at
                                open by its location's scheme; NULL only
                                before that */
    char *path;              /* as opened: directory + name (or a remote location,
                                as messages show it: no user:password@ or query) */
    struct sl_location *loc; /* its location, parsed once when it is opened
                                (base/location.h): its kind, the form given
                                (credentials included: requests use it), the
                                form shown (path) */
    struct sl_remote_target *target; /* remote: what its requests are made
                                from (remote.h), made once at open: the
                                location as given and shown, url, the hop
                                (the proxy's rules applied to url once) */
    char *url;               /* remote: the http(s) URL its bytes are read from
                                (fd is -1); NULL for a local file */
    struct sl_validators *validators; /* remote: its ETags per hop (remote.h),
                                asked with If-Match; NULL for a Hub file and a
                                local one */
    _Atomic int single_ranges; /* remote: its server answered a multi-range
                                request otherwise than multipart: parts' rows go
                                as single ranges from then on (remote.h,
                                sl_remote_spans_batch; set by the remote seam) */
    const char *name;        /* the base name inside path (manifest "files" key) */
    int fd;                  /* a local source's: open O_RDONLY|O_CLOEXEC until
                                sl_index_free; -1 for a remote one */
    uint64_t size;           /* st_size at open */
    uint64_t header_bytes;   /* N, the header length */
    uint64_t data_start;     /* 8 + N */
    size_t first_tensor;     /* tensors of this file: [first_tensor, first_tensor + tensor_count) */
    size_t tensor_count;
    sluice_metadata_kind metadata_kind;
    sluice_kv *metadata;
    size_t metadata_count;
    /* Digests of the 8 + N header bytes as read and parsed, one per
     * algorithm this build has (bit alg of header_digest_has). */
    uint8_t header_digest[2][32];
    unsigned header_digest_has;
} sl_file;

/* Test hooks of sl_index_open_hooked: the points of reading a header. */
typedef enum sl_index_stage {
    SL_INDEX_AFTER_STAT,        /* file opened and its size taken, nothing read */
    SL_INDEX_AFTER_HEADER_READ  /* the 8 + N header bytes copied, not yet parsed */
} sl_index_stage;

typedef struct sl_index_hooks {
    void (*fn)(void *ctx, sl_index_stage stage, const char *path);
    void *ctx;
} sl_index_hooks;

struct sl_remote_cfg;

typedef struct sl_index {
    const sl_index_hooks *hooks; /* NULL but in tests; only during open */
    const struct sl_remote_cfg *remote; /* remote.h: how remote files are
                                reached (owned by the model); NULL: none */
    unsigned caps_any;       /* source.h SL_SRC_*: what some file's source can do */
    unsigned caps_lacking;   /* and what some file's source cannot */
    sl_file *files;
    size_t nfiles;
    struct sluice_tensor_info *tensors; /* pointers inside point into the storage below */
    size_t ntensors;
    uint64_t total_bytes;    /* sum of every tensor's nbytes */
    size_t *slots;           /* open-addressing table of tensor indexes; SIZE_MAX = empty */
    size_t slot_mask;
    uint64_t seed;           /* of the name hash */
    struct sl_block *blocks; /* storage for names, shapes, metadata strings */
} sl_index;

/* Opens path (file, directory or *.index.json; see sluice_open) into *ix.
 * On failure *ix is left empty (safe to sl_index_free) and err says why. */
int sl_index_open(sl_index *ix, const char *path, sl_err *err);

/* The same, calling hooks (may be NULL) at each stage of each file: the
 * tests' way to change a file at an exact point of the open. */
int sl_index_open_hooked(sl_index *ix, const char *path, const sl_index_hooks *hooks, sl_err *err);

/* The same for a location that may be remote (http(s)://, s3://; see
 * sluice_open), reached through remote (NULL: local paths only). */
struct sl_location;
int sl_index_open_ex(sl_index *ix, const struct sl_location *loc,
                     const struct sl_remote_cfg *remote, sl_err *err);

/* Closes the files and frees everything; *ix is zeroed. */
void sl_index_free(sl_index *ix);

/* open(path, O_RDONLY | O_CLOEXEC) that cannot block: a FIFO with no
 * writer (a hostile "model file" or sidecar) would hang open() itself.
 * The descriptor is opened non-blocking and then made blocking again, so
 * a pipe with a writer still reads. Returns the fd, or -1 with errno
 * (source_local.c, which opens local files). */
int sl_open_read(const char *path);

/* Opens the very file f's descriptor names again, with open flags flags
 * (O_RDONLY | O_CLOEXEC are added): through proc_fd_dir/N (normally
 * /proc/self/fd), else by path, kept only when its device and inode are
 * those of f->fd (a file renamed over the path since is not it).
 * Returns the new descriptor, or -1 with errno (EXDEV: the path names
 * another file now). A reader that needs a description of its own (a
 * lease, O_DIRECT) uses this instead of the shared f->fd. */
int sl_file_reopen(const sl_file *f, const char *proc_fd_dir, int flags);

/* The digest in alg of f's header bytes (the 8-byte length and the
 * header, as parsed at open), or NULL when this build lacks alg. */
const uint8_t *sl_index_header_digest(const sl_file *f, sluice_algorithm alg);

/* The index of the tensor named name (len bytes), or SIZE_MAX. */
size_t sl_index_find(const sl_index *ix, const char *name, size_t len);

/* 1 when a and b describe the same tensor bytes: dtype, shape and size
 * (what a mirror's tensor must share with the model's to stand in). */
int sl_tensor_same_kind(const struct sluice_tensor_info *a, const struct sluice_tensor_info *b);

#endif
