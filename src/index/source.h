/* source.h: a source is one interface (source_local.c, source_remote.c).
 *
 * Each file of a model (sl_file, index.h) is read through the table of
 * the kind its location names, chosen once, when it is opened, from the
 * location's kind (sl_source_of; the location parsed once, base/location.h):
 * a local file (pread and the ring of
 * io.c) or an http(s):// / s3:// object (range requests through remote.c
 * and its seam). The index, the range reads and the engine call through
 * f->src and never ask which kind it is; where the kinds really differ in
 * what they can do, the table says so as a capability (caps), not as a
 * kind: a new kind is a new table, not new branches. SQLite's
 * sqlite3_io_methods and curl's Curl_handler are the model.
 */
#ifndef SLUICE_SOURCE_H
#define SLUICE_SOURCE_H

#include "base/error.h"
#include "base/location.h"
#include "sources/io.h"
#include "sources/remote.h"

#include <stddef.h>
#include <stdint.h>

struct sl_file;

/* What a source can do (sl_source_methods.caps). */
enum {
    /* An identity of its own that stays while the bytes do (device,
     * inode, mtime of an open descriptor): the verified-once memo may
     * speak for its tensors. */
    SL_SRC_STABLE_IDENTITY = 1u << 0,
    /* Its bytes are worth keeping in the persistent cache (they cross
     * the network each time otherwise). */
    SL_SRC_WORTH_CACHING = 1u << 1,
    /* Read through a descriptor of its own (f->fd): an O_DIRECT twin can
     * be opened, fstat tells its size now, verify reads it directly. */
    SL_SRC_DESCRIPTOR = 1u << 2,
    /* Reached over the network: it needs the model's remote configuration
     * (sl_remote_cfg), the engine's reads of it go to the remote seam and
     * count as remote reads. */
    SL_SRC_NETWORK = 1u << 3,
};

typedef struct sl_source_methods {
    const char *kind;   /* "file", "remote": for messages and tests only */
    unsigned caps;      /* SL_SRC_* */
    /* Opens f, whose path is set as given and its location parsed (f->loc;
     * path may be replaced by the form messages show, f->loc->shown):
     * takes its size and identity (a local descriptor; a remote object's
     * size and strong ETag from a first range reply). missing_code: the
     * code of "not there". rc: how remote files are reached. */
    int (*open)(struct sl_file *f, const sl_remote_cfg *rc, int missing_code, sl_err *err);
    /* Reads len bytes at offset synchronously (the header at open): all
     * of them, or an error (a file that ends early changed since open). A
     * remote object without an ETag yet takes the reply's. */
    int (*read)(struct sl_file *f, const sl_remote_cfg *rc, unsigned char *buf, size_t len,
                uint64_t offset, sl_err *err);
    /* Reads up to want bytes of a tensor at offset synchronously
     * (sluice_read_into, mirrors): *got gets how many (0: end of file),
     * *requests the requests it made. Returns 0, a negative SLUICE_E_*
     * (err set), or, for an errno-shaped failure the caller words,
     * SL_SRC_ERRNO with *got = 0 and errno set. */
    int (*read_tensor)(const struct sl_file *f, const sl_remote_cfg *rc, unsigned char *buf,
                       size_t want, uint64_t offset, size_t *got, unsigned *requests,
                       sl_err *err);
    /* How many of spans (a part's rows, or one piece of a tensor: ascending,
     * none overlapping, none empty; n >= 1) one read of the engine takes,
     * made by submit given the spans (sl_io_req spans) rather than iov:
     * remote, one request of the remote seam (sl_remote_spans_batch: a
     * multi-range request, or one coalesced range where f's server refuses
     * those). NULL: the engine cuts spans into reads of iov itself
     * (sched.c: SLUICE_PART_GAP). */
    size_t (*batch_spans)(const struct sl_file *f, const sl_span *spans, size_t n);
    /* Queues req (its fd set by the caller, its iov and offset, or its
     * spans, too) on the seam this kind is read through: io's ring or rio
     * (which reads f's spans as batch_spans said, its flag of a server
     * without multi-range requests kept in f). */
    void (*submit)(const struct sl_file *f, sl_io *io, sl_rio *rio, sl_io_req *req);
    /* Releases what open took; f's strings are the index's. */
    void (*close)(struct sl_file *f);
    /* Reads a small whole object (an index.json) of at most max bytes
     * into a malloc'd, NUL-ended buffer. */
    int (*read_small)(const sl_remote_cfg *rc, const char *loc, size_t max, char **out,
                      size_t *len, sl_err *err);
} sl_source_methods;

/* A failure that read_tensor leaves to its caller to word (errno set). */
#define SL_SRC_ERRNO 1

extern const sl_source_methods sl_source_local;
extern const sl_source_methods sl_source_remote;
extern const sl_source_methods sl_source_hub;   /* hf://: remote, without If-Match */

/* The table of a parsed location's kind: a Hub file, remote (http(s)://,
 * s3://), a local path. */
const sl_source_methods *sl_source_of(const sl_location *loc);

/* The remote source's hops: through the proxy, and to the origin
 * directly. Each has its own validators (remote.h, sl_validators: the
 * proxy's ETag is never asked of the origin), and each proxy its own
 * health (remote.h, sl_proxy_hop: skipped SL_PROXY_DOWN_MS after it
 * could not be reached, remote.c).
 *
 * "Read again from the origin directly, once" (sluice.h "Proxies"),
 * decided here and nowhere else, for every read of a remote file's bytes:
 * a load's (the engine's, asynchronous: slot.c resubmits its requests
 * with no_proxy set, sl_io_req), a range's or a part's (api.c), a
 * mirror's, a whole file's verify (verify.c). A read of f under c that
 * failed with code is read again directly when the failure is
 * verification's (SLUICE_E_CHECKSUM: a digest, or for a verify a size,
 * that differs), some of its bytes came through the proxy
 * (through_proxy), f's requests go through a proxy under c at all
 * (decided when f was opened, f->target) and it was not read directly
 * already (direct): once, before any mirror. Returns 1 or 0. */
int sl_source_direct_again(const sl_remote_cfg *c, const struct sl_file *f, int code,
                           int through_proxy, int direct);

/* The reads' side of it outside the engine's loads: when
 * sl_source_direct_again says so for a read of f that failed with code
 * (through_proxy: some of its bytes came through the proxy; a blocking
 * read, which cannot tell, passes 1 whenever f's requests go through
 * one; a part read through the engine knows), read(direct, ctx,
 * &bytes, err) is called once with a configuration whose requests all
 * take the direct hop (the tally, secrets and validators shared, not
 * owned), counted as the engine's loads are: one proxy failure, bytes in
 * proxy_bypass_bytes. Returns SL_SRC_NOT_PROXIED (nothing done) when the
 * rule says no, else what read returned (err set by it). */
#define SL_SRC_NOT_PROXIED 2
typedef int (*sl_direct_read_fn)(const sl_remote_cfg *direct, void *ctx, uint64_t *bytes,
                                 sl_err *err);
int sl_source_read_direct(const sl_remote_cfg *c, const struct sl_file *f, int code,
                          int through_proxy, sl_direct_read_fn read, void *ctx, sl_err *err);

#endif
