/*
 * sluice.h: lazy, verified loading of .safetensors model weights.
 *
 * This header is the whole public API. Everything it does not promise is
 * not API. It compiles as C99 and as C++.
 *
 * Conventions
 * -----------
 * - Every call that can fail returns int: SLUICE_OK (0) or a negative
 *   SLUICE_E_* code. Codes never change value. sluice_strerror() names a
 *   code; sluice_errmsg() gives the detail of the last failure on a model
 *   (file, tensor, byte offset, digests).
 * - `T **out` parameters give the caller ownership; free with the matching
 *   call. `const T *` results are borrowed; the comment says for how long.
 * - Destructors accept NULL.
 * - Threads: one model may be used from many threads at once. Error detail
 *   is kept per thread and per model, so the message read after a failed
 *   call is the one that call recorded, whatever other threads do.
 *
 * Tensor names
 * ------------
 * Names are stored exactly as the JSON header spells them after escapes are
 * decoded, so a name may contain any Unicode character, an escaped NUL
 * included. Every name is also NUL-terminated for convenience; when a name
 * holds an embedded NUL, only the `name_len` field and the *_n lookup calls
 * see all of it. A model never holds two tensors with the same name: a
 * repeated name within one file or across shards is rejected at open
 * (stricter than the reference implementation, which keeps the last).
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SLUICE_STATIC)
#define SLUICE_API
#elif defined(SLUICE_BUILDING) && defined(__GNUC__)
#define SLUICE_API __attribute__((visibility("default")))
#else
#define SLUICE_API
#endif

#define SLUICE_VERSION_MAJOR 0
#define SLUICE_VERSION_MINOR 1
#define SLUICE_VERSION_PATCH 0
/* The version this header belongs to, as a string and as one number
 * (major * 10000 + minor * 100 + patch). Compare them with
 * sluice_version() and sluice_version_number() to learn which library a
 * program actually runs against. */
#define SLUICE_VERSION_STRING "0.1.0"
#define SLUICE_VERSION_NUMBER \
    (SLUICE_VERSION_MAJOR * 10000 + SLUICE_VERSION_MINOR * 100 + SLUICE_VERSION_PATCH)

/* The largest header accepted, in bytes (as in the reference implementation). */
#define SLUICE_MAX_HEADER_BYTES 100000000u

/* Read attempts in a row that EINTR or EAGAIN may fail before the tensor
 * fails with SLUICE_E_IO (see sluice_acquire for the backoff). */
#define SLUICE_IO_MAX_ATTEMPTS 10

/* Row segments of a part of a local file less than this many bytes apart
 * are read as one read, the bytes between them dropped (one page: below
 * it a second read costs more than the copy of the gap, and cold the
 * kernel brings the page in anyway). See sluice_read_part_into. */
#define SLUICE_PART_GAP 4096u

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

enum sluice_status {
    SLUICE_OK = 0,

    /* API use and resources */
    SLUICE_E_INVAL = -1,           /* a bad argument, or the API misused */
    SLUICE_E_NOMEM = -2,           /* out of memory */
    SLUICE_E_IO = -3,              /* a system call failed; the message has errno and file */
    SLUICE_E_NOT_FOUND = -4,       /* no tensor of that name in the model */
    SLUICE_E_NO_FILES = -5,        /* the path names no .safetensors file */

    /* one .safetensors file: each rule its own code */
    SLUICE_E_HEADER_SHORT = -10,   /* file shorter than 8 bytes, or header past end of file */
    SLUICE_E_HEADER_TOO_LARGE = -11, /* header length over SLUICE_MAX_HEADER_BYTES */
    SLUICE_E_HEADER_UTF8 = -12,    /* header is not valid UTF-8 */
    SLUICE_E_HEADER_JSON = -13,    /* header is not strict JSON */
    SLUICE_E_HEADER_NOT_OBJECT = -14, /* top-level JSON value is not an object */
    SLUICE_E_ENTRY = -15,          /* tensor entry not an object, or a key missing/repeated */
    SLUICE_E_DTYPE = -16,          /* unknown dtype (names are case-sensitive) */
    SLUICE_E_SHAPE = -17,          /* shape is not an array of integers */
    SLUICE_E_OFFSETS = -18,        /* data_offsets not [begin, end] with begin <= end */
    SLUICE_E_INTEGER = -19,        /* a number that is not an integer literal in [0, 2^64-1] */
    SLUICE_E_OVERFLOW = -20,       /* element count x bits overflows 64 bits */
    SLUICE_E_SIZE_MISMATCH = -21,  /* shape x dtype size != end - begin, or partial bytes */
    SLUICE_E_LAYOUT = -22,         /* offsets leave a hole, overlap, or miss the end of file */
    SLUICE_E_DUPLICATE = -23,      /* a tensor name repeated in a file or across shards */
    SLUICE_E_METADATA = -24,       /* __metadata__ is not null or an object of strings */

    /* sharded layout (*.safetensors.index.json) */
    SLUICE_E_INDEX = -30,          /* index.json unreadable, not JSON, or no weight_map object */
    SLUICE_E_INDEX_SHARD = -31,    /* weight_map names a shard that does not exist */
    SLUICE_E_INDEX_MISMATCH = -32, /* weight_map and the shards' headers disagree */

    /* manifest and verification */
    SLUICE_E_MANIFEST = -40,       /* manifest unreadable or not JSON */
    SLUICE_E_MANIFEST_FORMAT = -41, /* unknown format, version or algorithm; bad structure */
    SLUICE_E_MANIFEST_DIGEST = -42, /* a digest is not 64 hex characters, or not a string */
    SLUICE_E_MANIFEST_DUPLICATE = -43, /* a name listed twice */
    SLUICE_E_MANIFEST_UNKNOWN = -44, /* a digest for a tensor (or file) the model lacks */
    SLUICE_E_MANIFEST_MISSING = -45, /* REQUIRE policy and tensors without a digest */
    SLUICE_E_CHECKSUM = -46,       /* bytes read do not match the manifest digest */
    SLUICE_E_MANIFEST_MISMATCH = -47, /* the headers disagree with a version 2 manifest
                                         (dtype, shape, size or header digest) */
    SLUICE_E_SIGNATURE = -48,      /* trusted keys set and the manifest's signature is
                                      missing, malformed, by another key or invalid, or a
                                      trusted key file is unusable ("Signed manifests") */

    /* engine */
    SLUICE_E_TOO_LARGE = -50,      /* tensor larger than the whole pool budget */
    SLUICE_E_POOL_EXHAUSTED = -51, /* live handles hold the room a tensor needs */
    SLUICE_E_BUSY = -52,           /* close with live handles or a stream running */
    SLUICE_E_FILE_CHANGED = -53,   /* a file shrank or vanished after (or during) open */
    SLUICE_E_CANCELLED = -54,      /* a stream, verify or part read stopped by its
                                      cancellation token */
    SLUICE_E_REMOTE = -55,         /* a remote source refused a request for good
                                      (HTTP 403, 404, 416, ...) or could not be
                                      reached within its attempts and deadline */

    /* metrics */
    SLUICE_E_BUFFER = -60,         /* the output buffer is too small (*needed says how large) */
    SLUICE_E_UNSUPPORTED = -61     /* the library was built without what the call needs */
};

/* The version of the library running (not of the header compiled
 * against): "0.1.0" for this release; static, never NULL. Any thread. */
SLUICE_API const char *sluice_version(void);
/* The same as one number, major * 10000 + minor * 100 + patch (100 for
 * 0.1.0), comparable with SLUICE_VERSION_NUMBER. Any thread. */
SLUICE_API int sluice_version_number(void);

/* A static string naming a status code ("header is not valid UTF-8").
 * Never NULL; unknown codes give "unknown status". Any thread. */
SLUICE_API const char *sluice_strerror(int code);

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

/* The dtypes of the reference implementation, with their bit sizes. */
typedef enum sluice_dtype {
    SLUICE_DTYPE_BOOL,        /*  8 */
    SLUICE_DTYPE_U8,          /*  8 */
    SLUICE_DTYPE_I8,          /*  8 */
    SLUICE_DTYPE_F8_E5M2,     /*  8 */
    SLUICE_DTYPE_F8_E4M3,     /*  8 */
    SLUICE_DTYPE_F8_E8M0,     /*  8 */
    SLUICE_DTYPE_F8_E4M3FNUZ, /*  8 */
    SLUICE_DTYPE_F8_E5M2FNUZ, /*  8 */
    SLUICE_DTYPE_I16,         /* 16 */
    SLUICE_DTYPE_U16,         /* 16 */
    SLUICE_DTYPE_F16,         /* 16 */
    SLUICE_DTYPE_BF16,        /* 16 */
    SLUICE_DTYPE_I32,         /* 32 */
    SLUICE_DTYPE_U32,         /* 32 */
    SLUICE_DTYPE_F32,         /* 32 */
    SLUICE_DTYPE_I64,         /* 64 */
    SLUICE_DTYPE_U64,         /* 64 */
    SLUICE_DTYPE_F64,         /* 64 */
    SLUICE_DTYPE_C64,         /* 64 */
    SLUICE_DTYPE_F4,          /*  4: packed, a tensor must fill whole bytes */
    SLUICE_DTYPE_F6_E2M3,     /*  6: packed, likewise */
    SLUICE_DTYPE_F6_E3M2,     /*  6: packed, likewise */
    SLUICE_DTYPE_COUNT_
} sluice_dtype;

/* The header spelling of a dtype ("BF16"), or NULL when out of range. */
SLUICE_API const char *sluice_dtype_name(sluice_dtype dtype);
/* Bits per element (4, 6, 8, 16, 32 or 64), or 0 when out of range. */
SLUICE_API unsigned sluice_dtype_bits(sluice_dtype dtype);

/* Digest algorithms. Both give 32-byte digests. A manifest names its own
 * (see "Manifests"); SHA-256 is the default. BLAKE3 is built from the
 * upstream C sources when they are found at build time (Debian package
 * librust-blake3-dev); without them a BLAKE3 manifest or option fails
 * with SLUICE_E_UNSUPPORTED. */
typedef enum sluice_algorithm {
    SLUICE_ALG_SHA256 = 0,
    SLUICE_ALG_BLAKE3 = 1
} sluice_algorithm;

/* The manifest spelling ("sha256", "blake3"), or NULL when out of range.
 * Any thread. */
SLUICE_API const char *sluice_algorithm_name(sluice_algorithm alg);
/* 1 when this build of the library computes alg, else 0. Any thread. */
SLUICE_API int sluice_algorithm_supported(sluice_algorithm alg);

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

/* Read with O_DIRECT where the file system allows it (falls back to
 * buffered reads per file, counted in the stats; also when the file cannot
 * be reopened as the very file opened: without /proc it is reopened by
 * path, and kept only when device and inode match). */
#define SLUICE_F_DIRECT 0x1u
/* Never use io_uring; use the pread thread pool. The environment variable
 * SLUICE_FORCE_PREAD=1 has the same effect. */
#define SLUICE_F_FORCE_PREAD 0x2u
/* Hash every tensor read, even those no manifest checks, so that
 * sluice_tensor_digest() can report it (used to write manifests). */
#define SLUICE_F_HASH_ALL 0x4u
/* Verified-once memo (needs a persistent cache; see "Persistent cache"):
 * a tensor of a local file that a load verified before, against the same
 * digest, in the same unchanged file (device, inode, size, mtime, ctime),
 * is not hashed again. Opt-in: it trusts the file's identity in place of
 * its bytes. Implies SLUICE_F_CACHE_DEFAULT when no cache is named. */
#define SLUICE_F_TRUST_UNCHANGED 0x8u
/* Use the default cache directory, $XDG_CACHE_HOME/sluice (else
 * $HOME/.cache/sluice), when neither cache_dir nor $SLUICE_CACHE_DIR names
 * one. Without it (or TRUST_UNCHANGED) no cache is used unless named. */
#define SLUICE_F_CACHE_DEFAULT 0x10u
#define SLUICE_F_ALL_ (SLUICE_F_DIRECT | SLUICE_F_FORCE_PREAD | SLUICE_F_HASH_ALL | \
                       SLUICE_F_TRUST_UNCHANGED | SLUICE_F_CACHE_DEFAULT)

typedef enum sluice_verify_policy {
    SLUICE_VERIFY_DEFAULT = 0,  /* REQUIRE when a manifest is in play, else OFF */
    SLUICE_VERIFY_REQUIRE = 1,  /* every tensor must have a digest and match it */
    SLUICE_VERIFY_IF_PRESENT = 2, /* check the tensors the manifest lists */
    SLUICE_VERIFY_OFF = 3       /* no checking, even with a manifest */
} sluice_verify_policy;

/* Options for sluice_open. Always start from sluice_options_init(): it
 * writes the defaults and the struct's size, so that a library built with a
 * later, longer struct knows which fields the caller has. Fields are only
 * ever appended. A caller built against a newer header, whose struct is
 * longer than this library's, is accepted when every byte past the fields
 * this library knows is zero (the newer fields left at their defaults);
 * a non-zero byte there fails sluice_open with SLUICE_E_INVAL, the message
 * giving its offset, since this library cannot honour that option. */
typedef struct sluice_options {
    size_t size;            /* sizeof(sluice_options), set by sluice_options_init */
    uint32_t flags;         /* SLUICE_F_*; unknown bits are rejected (SLUICE_E_INVAL) */
    uint32_t queue_depth;   /* reads in flight; default 32, 1..4096 */
    uint64_t pool_bytes;    /* buffer budget; default 4 GiB, or 1/4 of this
                               process's cgroup memory limit when that is
                               less; more than the limit:
                               SLUICE_E_INVAL (see "Sizing the pool" below) */
    uint64_t chunk_bytes;   /* size of one read; default 8 MiB, 4 KiB..1 GiB */
    uint32_t io_threads;    /* threads of the pread backend; default 4 */
    uint32_t hash_threads;  /* hashing threads; 0 = online CPUs */
    const char *manifest_path; /* NULL: the sidecar (see "Manifests") if present;
                                  ignored under SLUICE_VERIFY_OFF */
    sluice_verify_policy verify; /* default SLUICE_VERIFY_DEFAULT; see "Manifests" */
    const char *metrics_label; /* the value of the model's `model` label in the
                                  metrics (see "Metrics"); NULL: the path given
                                  to sluice_open (a remote one as messages show
                                  it: no user:password@, "?..." for its query).
                                  Copied by open; valid UTF-8,
                                  1..1024 bytes, else SLUICE_E_INVAL */
    sluice_algorithm algorithm; /* the digest computed when no manifest names
                                  one (SLUICE_F_HASH_ALL, sluice_verify with
                                  SLUICE_VF_DIGEST_ONLY): default SHA-256; a
                                  manifest's own algorithm always wins.
                                  Unknown: SLUICE_E_INVAL; not built in:
                                  SLUICE_E_UNSUPPORTED */
    const char *const *trusted_keys; /* paths of Ed25519 (or, for OpenSSF model
                                        signing, EC) public key files (PEM); when
                                        set, the manifest must carry a valid signature
                                        by one of them (see "Signed manifests"). NULL:
                                        no signature asked. Read by sluice_open only */
    size_t ntrusted_keys;   /* entries in trusted_keys: 0 with trusted_keys NULL,
                               else 1 or more, none NULL (else SLUICE_E_INVAL) */

    /* Remote sources and fallback (see "Remote models and mirrors"). */
    const char *const *fallback; /* fallback_count mirrors of the model, tried
                                  in order: a directory or file, an http(s)://
                                  or an s3:// location; copied by open. Needs a
                                  manifest (else SLUICE_E_INVAL at open) */
    uint32_t fallback_count;    /* 0: no fallback; at most 16 */
    uint32_t remote_connections; /* connections at once per remote model (and
                                  per mirror); default 8, 1..256 */
    uint32_t remote_attempts;   /* attempts of one remote read (transient
                                  failures); default 5, 1..100 */
    uint32_t remote_connect_timeout_ms; /* default 10000 */
    uint32_t remote_stall_timeout_ms;   /* an attempt that moves no byte for this
                                  long (waiting for the reply included), or
                                  fewer than 1 KiB a second over a window
                                  this long (from its first byte on), is
                                  stopped and retried;
                                  default 30000 */
    uint32_t remote_deadline_ms; /* how long one read may go on retrying:
                                  counted from when it first goes on the
                                  wire (a connection takes it; time queued
                                  behind other reads does not count), every
                                  attempt and backoff included; no retry
                                  is scheduled past it (one due before it
                                  may still wait for a free connection, and
                                  start later). It never stops an attempt
                                  that is moving bytes: a slow link that
                                  keeps its speed over 1 KiB/s completes
                                  however long it takes (the stall timeout
                                  bounds the others); default 120000 */
    uint32_t remote_backoff_ms; /* the first retry's backoff cap, doubled each
                                  attempt up to 30 s (full jitter); default 200 */
    const char *http_token;     /* "Authorization: Bearer" for http(s):// (not
                                  for s3://); NULL: $SLUICE_HTTP_TOKEN if set.
                                  For an hf:// model, the Hub's token instead
                                  (see sluice_open) */
    const char *s3_endpoint;    /* NULL: $AWS_ENDPOINT_URL, else
                                  https://s3.REGION.amazonaws.com. Requests
                                  signed with $AWS_ACCESS_KEY_ID follow no
                                  redirect (SLUICE_E_REMOTE): the keys and
                                  $AWS_SESSION_TOKEN are the endpoint's */
    const char *s3_region;      /* NULL: $AWS_REGION, else us-east-1 */
    uint32_t s3_addressing;     /* SLUICE_S3_* */
    const char *remote_ca_file; /* PEM file of the CAs https:// servers are checked
                                  against; NULL: the system's store */

    /* Persistent cache (see "Persistent cache"). */
    const char *cache_dir;      /* the cache directory (made if missing); NULL:
                                  $SLUICE_CACHE_DIR when set, else the default
                                  with SLUICE_F_CACHE_DEFAULT or
                                  SLUICE_F_TRUST_UNCHANGED, else no cache.
                                  Read by sluice_open only */
    uint64_t cache_bytes;       /* the cache's budget in bytes of blobs: least
                                  recently used blobs are evicted past it;
                                  default SLUICE_CACHE_DEFAULT_BYTES (64 GiB);
                                  0: SLUICE_E_INVAL */

    /* Proxies (see "Proxies" under "Remote models and mirrors"). */
    const char *http_proxy;     /* the proxy of every remote request of the
                                  model and its mirrors ("http://HOST:PORT";
                                  any scheme libcurl takes); NULL: the
                                  environment (http_proxy, https_proxy,
                                  HTTPS_PROXY, all_proxy, ALL_PROXY); "":
                                  no proxy, whatever the environment says.
                                  no_proxy / NO_PROXY apply to both.
                                  Copied by open */
    uint32_t proxy_kind;        /* SLUICE_PROXY_*: how the proxy is spoken to */
    /* OpenSSF model signing (see "OpenSSF model signing" below). */
    const char *const *trusted_cas; /* paths of PEM files of CA certificates:
                                  a model.sig signed with a certificate chain
                                  must chain to one of them, at OpenSSL
                                  security level 2 (no SHA-1 signature), and
                                  its leaf be a code-signing certificate (not
                                  a CA; key usage digitalSignature; extended
                                  key usage codeSigning, not serverAuth; see
                                  "OpenSSF model signing" below). NULL: none.
                                  Read by sluice_open only */
    size_t ntrusted_cas;        /* entries in trusted_cas (as ntrusted_keys) */
    const char *signature_path; /* the model-signing bundle; NULL: model.sig in
                                  the model's directory. Setting it (or
                                  trusted_cas) asks for a model-signing
                                  signature. Read by sluice_open only */
} sluice_options;

/* sluice_options.proxy_kind */
#define SLUICE_PROXY_PLAIN 0u       /* a plain HTTP proxy (squid, varnish, ...);
                                       https:// is tunnelled (CONNECT) */
#define SLUICE_PROXY_DRAGONFLY 1u   /* Dragonfly's dfdaemon: its headers, and
                                       https:// asked of it as http://, never
                                       tunnelled (see "Proxies") */

#define SLUICE_CACHE_DEFAULT_BYTES ((uint64_t)64 << 30)

/* sluice_options.s3_addressing */
#define SLUICE_S3_PATH 0u           /* ENDPOINT/BUCKET/KEY (the default) */
#define SLUICE_S3_VIRTUAL_HOST 1u   /* SCHEME://BUCKET.HOST/KEY */

/* Fills *opts with the defaults. Returns SLUICE_E_INVAL if opts is NULL. */
SLUICE_API int sluice_options_init(sluice_options *opts);

/*
 * Sizing the pool
 * ---------------
 * The default, from sluice_options_init: 4 GiB, or in a container (a
 * cgroup memory limit: cgroup v2 memory.max, v1 memory.limit_in_bytes, of
 * the process's cgroup in /proc/self/cgroup, the lowest on the way up to
 * the root under /sys/fs/cgroup) 1/4 of the limit when that is less, in
 * whole MiB, at least 1 MiB: 2 GiB under an 8 GiB limit (a quarter: room
 * for a 1 GB embedding, and three quarters left for the rest of the
 * process). A pool_bytes
 * above the limit is refused by sluice_open (SLUICE_E_INVAL, the message
 * giving both numbers and the file that sets the limit): such a pool
 * could not be filled without the kernel killing the process, which no
 * caller could see coming. One below it is the caller's to size against
 * the rest of its memory.
 * Every tensor is read into one contiguous buffer of the pool. A tensor
 * larger than the pool fails with SLUICE_E_TOO_LARGE. A tensor that fits
 * still needs one free range of its size: buffers held by handles stay
 * where they are, so they can split the pool into ranges that are each
 * too small although the bytes free in all are enough; the acquire then
 * fails with SLUICE_E_POOL_EXHAUSTED and a message that says so ("cannot
 * be placed", with the largest range that could be made), and nothing is
 * evicted for it. Buffers are placed lowest address first, which keeps
 * held ones packed, but no order can rule this out.
 * So give the pool at least the largest tensor plus what the callers hold
 * at once; to be safe from placement, twice the largest tensor plus that.
 * For example a 70B model in FP32 (Llama 3: vocabulary 128256 x hidden
 * 8192) has an embedding and an lm_head of 4,202,692,608 bytes each: the
 * default 4 GiB pool (4,294,967,296) holds one of them alone, with 88 MiB
 * to spare and nothing else held; to hold both at once, or one while
 * other handles are live, give at least 12 GiB (or hold the embedding
 * only while it is copied where it belongs).
 */

/* ------------------------------------------------------------------------ */
/* Opening a model and its index                                            */
/* ------------------------------------------------------------------------ */

typedef struct sluice_model sluice_model;

/*
 * Opens a model and builds its tensor index from the headers alone.
 *
 * path is one of:
 *  - a .safetensors file;
 *  - a *.safetensors.index.json file (the Hugging Face sharded layout): its
 *    weight_map decides the shards, which must exist beside it; every
 *    tensor it names must be in its shard and every shard tensor must be
 *    named; other keys are ignored;
 *  - a directory: its model.safetensors.index.json when present (else its
 *    only *.safetensors.index.json), otherwise every *.safetensors in it, in
 *    name order;
 *  - an http://, https:// or s3://bucket/key location of one of these
 *    (see "Remote models and mirrors" below);
 *  - a Hugging Face Hub location, hf://ORG/NAME[@REVISION][/FILE]
 *    (REVISION a branch, tag or commit, default main, '/' in it written
 *    %2F; FILE a path in the repository, default the repository's
 *    model.safetensors.index.json, else its model.safetensors). The
 *    Hub's API (endpoint $HF_ENDPOINT, default https://huggingface.co)
 *    pins REVISION to its commit and lists the files, then every file is
 *    read as ENDPOINT/ORG/NAME/resolve/COMMIT/FILE with range requests,
 *    following the Hub's redirects to its storage. The Hub's token is
 *    http_token when the model itself is hf:// (its other hosts, such as
 *    an http(s) mirror, then get $SLUICE_HTTP_TOKEN only), else $HF_TOKEN
 *    (never $SLUICE_HTTP_TOKEN, nor the http_token of a model on another
 *    server that has an hf:// mirror); it is sent to the endpoint only,
 *    never to the storage a redirect names. No
 *    If-Match is sent (the commit fixes the bytes, and the Hub answers
 *    before its storage does). The
 *    manifest is the repository's sluice.manifest.json (the sidecar rule
 *    below, at the commit); when it has none, the Hub's LFS SHA-256 of
 *    each whole file are derived into tensor and chunk digests as for a
 *    Hub cache snapshot ("Hub snapshots": the first open reads each file
 *    whole once; SLUICE_VERIFIED_PUBLISHER_DIGEST). When a file of the
 *    model has no LFS SHA-256 (no Git LFS object), nothing is derived and
 *    the others' digests stand in (sluice_manifest_path:
 *    "hf://ORG/NAME@COMMIT (the Hub's LFS SHA-256)"): they check whole
 *    files (sluice_verify with SLUICE_VF_FILES), never a tensor, so under
 *    DEFAULT the policy is IF_PRESENT with no tensor listed, the model
 *    loads unverified and says so (sluice_verify_state:
 *    SLUICE_UNVERIFIED_NO_MANIFEST, *where the sidecars looked for;
 *    sluice_stats' unverified 1), and REQUIRE fails the open with
 *    SLUICE_E_MANIFEST. A missing repository, revision or file is
 *    SLUICE_E_NO_FILES, a refusal (401, 403: private, gated, or a missing
 *    repository asked without a token) SLUICE_E_REMOTE, each message
 *    naming which.
 *
 * Remote models and mirrors
 * -------------------------
 * A remote location (built with libcurl, else SLUICE_E_UNSUPPORTED) is
 * read with HTTP range requests: headers at open, validated as local ones;
 * for a "directory" (a prefix) its model.safetensors.index.json, else its
 * model.safetensors (nothing is listed); the sidecar manifest at the same
 * place, and manifest_path may be a URL. Tensors load into the pool as
 * local ones, through one thread of the model that keeps up to
 * remote_connections connections (tensor-parallel parts too, in
 * multi-range requests); sluice_read_into, sluice_acquire_range and
 * sluice_digest_range send range requests on the calling thread, over
 * connections the model keeps for the next such request (those of up to
 * remote_connections idle transfers, each keeping what its last request
 * went over: the origin, a proxy, a redirect's target; closed with the
 * model; a child of fork() opens its own, never the parent's).
 * Every reply must be a 206 for the bytes asked of the object seen at open
 * (its size, and its strong ETag by If-Match: the ETag of the hop the
 * request goes over, the origin's or the proxy's, each taken from the
 * first reply over that hop; see "Proxies"), else SLUICE_E_FILE_CHANGED;
 * a permanent refusal is SLUICE_E_REMOTE; transient failures are retried
 * within remote_attempts and remote_deadline_ms. sluice_verify on a
 * remote model reads each item with range requests of its own (see
 * "Verifying without loading"; SLUICE_VF_DIGEST_ONLY:
 * SLUICE_E_UNSUPPORTED); SLUICE_F_DIRECT does not
 * apply; a remote manifest's signature is fetched beside it ("Signed
 * manifests"). Messages, sluice_file_info and sluice_tensor_source show a
 * location without its user:password@ and with "?..." for its query.
 * A URL's port is 1..65535 in decimal digits, or empty ("http://h:/m":
 * the scheme's default, as RFC 3986 reads it); any other in the model's
 * location, a mirror, manifest_path, signature_path, the proxy or
 * HF_ENDPOINT (for the Hub) fails sluice_open with SLUICE_E_INVAL
 * before any request, naming the location as messages show it.
 * A location is classified by its path, never its query (or fragment):
 * "https://H/m/model.safetensors?X-Amz-Signature=..." (a presigned URL)
 * is a .safetensors file. The query belongs to the one object it names:
 * it is sent on every request for that object (the header, every range,
 * every retry), and on none for the objects derived from the location,
 * which are named from its path alone: the sidecar manifest, the shards
 * of an index.json, the files under a prefix (a signature made for one
 * key is no credential for another; give a presigned manifest_path).
 * Mirrors (opts.fallback, a manifest required): a checked tensor or range
 * that fails from the model's own files with SLUICE_E_CHECKSUM,
 * SLUICE_E_IO, SLUICE_E_FILE_CHANGED or SLUICE_E_REMOTE is read from the
 * next mirror whose tensor has the same name, dtype, shape and size, and
 * verified against the model's manifest; when all fail, the primary's
 * code and every source's failure in the message. When the model's own
 * location cannot be opened at all (refused, DNS, 5xx after every
 * attempt, 404, a damaged header or index.json, headers a version 2
 * manifest's header digests refuse), the open goes on from the first
 * mirror that opens with the same checks: its headers and the manifest
 * (manifest_path when given, whichever location serves; else the sidecar
 * beside the mirror, which must be there; signed when keys or CAs are
 * trusted), its headers against the manifest's header digests; a mirror
 * that fails any of it is refused and the next tried (sluice_model_location
 * says which serves, and why). Else the primary's code, the message naming
 * every location's failure. A tensor a mirror delivered is kept in the
 * persistent cache like any verified remote tensor.
 *
 * Proxies
 * -------
 * Every remote request of a model and of its mirrors (open's, tensor
 * reads', sluice_read_into's) goes through one proxy when one applies,
 * but for what the bytes are checked against: the manifest (a sidecar or
 * manifest_path) and the Hub's API (its revision and LFS SHA-256) are
 * always read from the origin directly, since a proxy that served the
 * manifest too would be trusted with the result (not bypass bytes).
 * The proxy is
 * opts.http_proxy when set (it wins over the environment; "" turns
 * proxies off), else the environment as libcurl reads it: http_proxy
 * (lower case only) for http://, https_proxy or HTTPS_PROXY for https://
 * and s3://, else all_proxy or ALL_PROXY. no_proxy (or NO_PROXY) names
 * the hosts reached directly whichever gave the proxy: a comma-separated
 * list of host names (a name matches itself and its subdomains; a
 * leading dot, trailing dots and case are ignored) or IP addresses and
 * ranges ("10.0.0.0/8", "fd00::/8"), "*" for all, as libcurl reads it;
 * libcurl applies no no_proxy of its own, and applies this one to the
 * redirects a proxied request follows (a host it names is reached
 * directly; not in Dragonfly mode). A plain proxy
 * (SLUICE_PROXY_PLAIN) gets absolute-URI requests for http:// and a
 * CONNECT tunnel for https://, which it cannot cache. A Dragonfly proxy
 * (SLUICE_PROXY_DRAGONFLY, dfdaemon's HTTP proxy) gets every request as
 * a plain absolute-URI request, https:// ones rewritten to http:// so
 * that no tunnel hides the bytes from its peers (the daemon fetches the
 * origin over TLS by its proxy rule; the hop to the daemon is then in
 * clear: keep the daemon on the node; with credentials, a Bearer token
 * or AWS keys, sluice_open refuses a daemon off this host's loopback,
 * SLUICE_E_INVAL; the Hub's token counts only when the model or a
 * mirror is on the Hub, the one place it is sent), with X-Dragonfly-Use-P2P: true,
 * X-Dragonfly-Priority 6 for a request a caller waits on (acquire, the
 * open's fetches, a stream's head) and 3 for read-ahead, and
 * X-Dragonfly-Filtered-Query-Params naming the query parameters of
 * presigned URLs (S3, GCS, Azure), so that URLs signed on different
 * nodes count as one task; a redirect to https:// that it relays is not
 * followed through it (that would be a CONNECT tunnel): that request
 * goes direct, counted.
 * A proxy is never trusted with the result: a request through it that
 * fails (connection refused or reset, timeout, 5xx or any other status,
 * a reply that fails the range checks) is sent again at once to the
 * origin directly (a 404 or 416 too, which the proxy is not trusted to
 * say: it counts as a failure only when the origin then serves the
 * request), and a tensor whose bytes from the proxy fail
 * verification is loaded again directly; each counts in proxy_failures,
 * the bytes then fetched directly in proxy_bypass_bytes, and
 * sluice_tensor_source says "primary, direct: the proxy failed (...)".
 * Validators are kept per hop: a direct request is asked If-Match with
 * the origin's own strong ETag (from its first direct reply), never the
 * proxy's, so a proxy that rewrites ETags cannot make the origin answer
 * 412. A proxy that could not be reached (refused or reset, a timeout, a
 * stall) is skipped by the model's requests for 30 s, which go direct at
 * once (bypass bytes, not failures); then it is tried again. Each proxy
 * has its own health: its mirrors' requests through the same proxy skip
 * it too, while with http_proxy and https_proxy naming two proxies, one
 * that is down never makes the other skipped.
 * A tensor the origin serves right never fails because of its proxy; it
 * fails, or goes to the mirrors, only as the origin's own answer would.
 *
 * Each header is read once (pread) into private memory, and that copy
 * alone is parsed as strict JSON, validated as the reference implementation
 * does (see the SLUICE_E_* codes), copied into the index and freed: a
 * writer changing the file during open cannot make the index disagree with
 * what was validated. Nothing is ever mapped, so a file cut during open
 * fails it with SLUICE_E_FILE_CHANGED ("shrank while being opened"), never
 * SIGBUS. The files stay open until sluice_close.
 *
 * Tensor order (sluice_info's index) is shard order, then data offset.
 *
 * Then the manifest is read, unless opts->verify is SLUICE_VERIFY_OFF:
 * opts->manifest_path when set, else the first sidecar that exists, in
 * this order:
 *  - for a .safetensors file F: "F.manifest.json" beside it
 *    (model.safetensors -> model.safetensors.manifest.json);
 *  - for a directory (or a remote prefix) D: "D/sluice.manifest.json",
 *    then, when the model is one file F (D holds one .safetensors, or
 *    its index.json names one shard), "F.manifest.json" (what `sluice
 *    synth` writes for one file, and the Hugging Face Hub's usual layout);
 *  - for a *.safetensors.index.json: "sluice.manifest.json" in its
 *    directory, then, when it names one shard F, "F.manifest.json".
 * When none exists and the model is a snapshot of the Hugging Face Hub's
 * cache, the digests its blobs are named by are checked instead ("Hub
 * snapshots" below).
 * Which one was read is sluice_manifest_path()'s answer (and the first
 * line `sluice verify` prints). A sidecar that exists but cannot be read
 * or parsed fails the open; the next is looked for only when one is
 * absent (a local ENOENT, a remote 404). With REQUIRE and none found, the
 * message names every sidecar looked for.
 * Its forms, its checks and the policies are described under "Manifests"
 * below; any manifest fault fails the open with its own SLUICE_E_MANIFEST*
 * code and a message naming the manifest, the line and byte, and the name.
 * With opts->trusted_keys, the manifest must also be signed by one of
 * them ("Signed manifests" below), else SLUICE_E_SIGNATURE. With
 * opts->trusted_cas or signature_path, or EC trusted keys and a model.sig,
 * the OpenSSF model signature must verify and list the manifest and every
 * file ("OpenSSF model signing" below), else SLUICE_E_SIGNATURE.
 *
 * opts may be NULL for the defaults. On success *out is the model, to be
 * closed with sluice_close. On failure *out is still set, to a closed model
 * that only carries the error: read it with sluice_errmsg(), then call
 * sluice_close() (every other call on it returns SLUICE_E_INVAL); *out is
 * NULL only when even that could not be allocated (SLUICE_E_NOMEM) or out
 * is NULL.
 *
 * Returns SLUICE_OK, SLUICE_E_INVAL (also a pool_bytes above the cgroup
 * memory limit, see "Sizing the pool"; a URL's port that no request could
 * use, see "Remote models and mirrors"), SLUICE_E_NOMEM, SLUICE_E_IO,
 * SLUICE_E_NO_FILES, SLUICE_E_FILE_CHANGED, any header or index code, any
 * manifest code, SLUICE_E_SIGNATURE.
 * Thread safety: any thread; the model is not shared until open returns.
 */
SLUICE_API int sluice_open(const char *path, const sluice_options *opts,
                           sluice_model **out);

/*
 * Waits for reads in flight (read-ahead, hashing), then frees the model
 * and everything it owns. Every handle must have been released first, and
 * no stream may be running: otherwise close frees nothing, returns
 * SLUICE_E_BUSY (the message counts the live handles and the streams) and
 * the model stays usable. So close called from inside a stream callback,
 * or while another thread's stream runs, is refused, not a crash.
 * NULL is a no-op returning SLUICE_OK; so is the shell of a failed open
 * (which it frees).
 * A call that another thread is still running on the model (an acquire
 * waiting for its tensor, a release or a stream on its way out) is waited
 * for, and then counted: close returns SLUICE_E_BUSY if that call left a
 * live handle. No call may start on the model once close has begun,
 * and after a successful close nothing of the model may be used again: not the model (a second
 * close included), not a handle (one cannot be live: see above), not a
 * borrowed pointer. That misuse cannot be detected; it is undefined.
 */
SLUICE_API int sluice_close(sluice_model *model);

/* How many models each thread keeps error detail for (see sluice_errmsg). */
#define SLUICE_ERRMSG_MODELS 16

/*
 * The detail of the last failure recorded on this model by the calling
 * thread (for a model whose open failed: the open's failure). "" when none.
 * NULL model gives a generic out-of-memory message. Every call taking an
 * open model that fails records a message here, the queries on a const
 * model included (sluice_find: "no tensor named ..."; test_errmsg_calls).
 * Each thread keeps the detail of the SLUICE_ERRMSG_MODELS models it most
 * recently failed a call on: after failures on that many other models,
 * this one's detail is gone (""). So read it soon after the failed call.
 * A thread's detail is freed when the thread exits; memory stays bounded
 * however many threads come and go or models open and close.
 * Borrowed: valid until the next call on the model from this thread,
 * close, the thread's exit, or failures of this thread on
 * SLUICE_ERRMSG_MODELS other models.
 */
SLUICE_API const char *sluice_errmsg(const sluice_model *model);

/* Information about one tensor, borrowed from the model: every pointer is
 * valid until sluice_close. A struct tag without a typedef, like struct
 * stat, because sluice_tensor_info() is also the accessor of a handle.
 *
 * Like struct sluice_stats it starts with its size, so that fields can be
 * appended without overwriting an older caller's memory: the caller sets
 * .size = sizeof(struct sluice_tensor_info) (SLUICE_TENSOR_INFO_INIT does)
 * before sluice_info or sluice_find; the library writes only the fields
 * that fit in that size and leaves .size as the caller set it. A size
 * smaller than the size field itself is SLUICE_E_INVAL; a larger one than
 * this library's struct is fine (the fields it knows are written). The
 * structs the library hands out by pointer (sluice_tensor_info(handle),
 * a stream callback's info) have .size set by the library to its own
 * sizeof: read a field only when .size covers it. */
struct sluice_tensor_info {
    size_t size;            /* set by the caller; see above */
    const char *name;       /* NUL-terminated; see "Tensor names" above */
    size_t name_len;        /* bytes in name, without the terminating NUL */
    sluice_dtype dtype;
    uint32_t ndim;          /* 0 for a scalar */
    const uint64_t *shape;  /* ndim dimensions (NULL when ndim is 0) */
    uint64_t nbytes;        /* data_end - data_begin */
    uint64_t data_begin;    /* data_offsets[0] as written in the header */
    uint64_t data_end;      /* data_offsets[1] */
    uint64_t offset;        /* absolute offset of the first byte in the file */
    size_t file_index;      /* which file (see sluice_file_info) */
    const char *file;       /* that file's path */
    size_t index;           /* this tensor's position in the model's order */
};

/* An initializer for a struct sluice_tensor_info to be filled:
 *   struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT; */
#ifdef __cplusplus /* every field, for -Wmissing-field-initializers */
#define SLUICE_TENSOR_INFO_INIT \
    {sizeof(struct sluice_tensor_info), 0, 0, SLUICE_DTYPE_BOOL, 0, 0, 0, 0, 0, 0, 0, 0, 0}
#else
#define SLUICE_TENSOR_INFO_INIT {.size = sizeof(struct sluice_tensor_info)}
#endif

/* The number of tensors in the model (0 for a NULL or failed model). */
SLUICE_API size_t sluice_count(const sluice_model *model);

/* Fills *info (whose size field the caller sets) for the tensor at index
 * i (0 <= i < sluice_count). Returns SLUICE_OK, or SLUICE_E_INVAL (bad
 * model, i out of range, NULL info, info->size smaller than the size
 * field). */
SLUICE_API int sluice_info(const sluice_model *model, size_t i,
                           struct sluice_tensor_info *info);

/* Looks a tensor up by its NUL-terminated name, in O(1), and fills *info
 * as sluice_info does. info may be NULL to test for existence. Returns
 * SLUICE_OK, SLUICE_E_NOT_FOUND or SLUICE_E_INVAL (bad model, NULL name,
 * info->size smaller than the size field). */
SLUICE_API int sluice_find(const sluice_model *model, const char *name,
                           struct sluice_tensor_info *info);
/* The same with an explicit length, for names holding a NUL. */
SLUICE_API int sluice_find_n(const sluice_model *model, const char *name,
                             size_t name_len, struct sluice_tensor_info *info);

/* One key/value pair of a file's __metadata__; both NUL-terminated, the
 * lengths authoritative (they may hold NUL). */
typedef struct sluice_kv {
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
} sluice_kv;

typedef enum sluice_metadata_kind {
    SLUICE_METADATA_ABSENT = 0, /* no __metadata__ key */
    SLUICE_METADATA_NULL = 1,   /* "__metadata__": null */
    SLUICE_METADATA_OBJECT = 2  /* an object of strings (possibly empty) */
} sluice_metadata_kind;

/* Information about one file of the model, borrowed until sluice_close
 * (a struct tag like struct sluice_tensor_info, for the same reason). It
 * starts with its size, with the same rules as struct sluice_tensor_info:
 * the caller sets .size = sizeof(struct sluice_file_info)
 * (SLUICE_FILE_INFO_INIT); only the fields that fit are written. */
struct sluice_file_info {
    size_t size;             /* set by the caller */
    const char *path;        /* as opened (directory + shard name); a remote
                                location without its user:password@ and with
                                "?..." for its query, as messages show it */
    uint64_t file_size;      /* bytes, at open (named size before 0.1.0's size field) */
    uint64_t header_bytes;   /* the header length N of the file */
    uint64_t data_start;     /* 8 + N: where data_offsets count from */
    size_t tensor_count;
    sluice_metadata_kind metadata_kind;
    size_t metadata_count;   /* pairs in metadata, in header order */
    const sluice_kv *metadata;
};

#ifdef __cplusplus /* every field, for -Wmissing-field-initializers */
#define SLUICE_FILE_INFO_INIT \
    {sizeof(struct sluice_file_info), 0, 0, 0, 0, 0, SLUICE_METADATA_ABSENT, 0, 0}
#else
#define SLUICE_FILE_INFO_INIT {.size = sizeof(struct sluice_file_info)}
#endif

/* The number of files (shards) of the model. */
SLUICE_API size_t sluice_file_count(const sluice_model *model);
/* Fills *info (whose size field the caller sets) for file i. Returns
 * SLUICE_OK or SLUICE_E_INVAL (bad model, i out of range, NULL info,
 * info->size smaller than the size field). */
SLUICE_API int sluice_file_info(const sluice_model *model, size_t i,
                                struct sluice_file_info *info);

/* Reads len bytes of file i at offset (from the file's first byte, its
 * header included) into dst, raw, through the file's own source (a local
 * file, or range requests for a remote one): what `sluice repair` copies
 * a mirror's whole file with. UNVERIFIED: no manifest digest is checked
 * and no mirror is tried; the caller checks the bytes (e.g. against
 * sluice_manifest_file's whole-file digest). Not counted in the stats.
 * Returns SLUICE_OK; SLUICE_E_INVAL (bad model, i out of range, dst NULL
 * with len > 0, a range past the file's size at open); SLUICE_E_IO,
 * SLUICE_E_REMOTE (a remote read failed; the message says why), or
 * SLUICE_E_FILE_CHANGED (the file ends early now). On failure dst's
 * content is unspecified. Any thread. */
SLUICE_API int sluice_read_file_range(sluice_model *model, size_t i, uint64_t offset,
                                      size_t len, void *dst);

/* ------------------------------------------------------------------------ */
/* Loading tensors                                                          */
/* ------------------------------------------------------------------------ */

typedef struct sluice_tensor sluice_tensor;

/*
 * Hint: these tensors will be wanted next, in this order. Replaces the
 * previous hint; without one the plan is the model's order (n = 0 goes
 * back to it; names may then be NULL). Unknown names make the call fail
 * with SLUICE_E_NOT_FOUND before anything changes.
 * Read-ahead goes on from each acquire along the plan, within the pool
 * (of a name listed twice, from its next place within 8 after the
 * previous acquire's, else from its first).
 * Along a hinted plan it always does; along the default plan only while
 * acquires follow it (each within the next 8 positions of the previous
 * one): after a jump it pauses until they do again, so that random access
 * reads nothing it did not ask for. What an earlier plan read ahead and
 * nobody used yet stays read ahead when the new plan names it (read-ahead
 * never evicts read-ahead: the same hint again reads nothing twice), and
 * is the first room taken when it does not (what was still loading, as
 * soon as it lands). An acquire (a part's too), or a stream's next
 * tensor, that can only get room by evicting unused read-ahead pauses
 * the plan's read-ahead until the next acquire along the plan, or the
 * next hint: else it would refill that room as soon as the handle is
 * released, for the next such acquire to evict it unused.
 * Returns SLUICE_OK, SLUICE_E_INVAL (bad model, names NULL with n > 0, a
 * NULL name), SLUICE_E_NOT_FOUND, SLUICE_E_NOMEM. Any thread.
 */
SLUICE_API int sluice_prefetch(sluice_model *model, const char *const *names,
                               size_t n);

/*
 * Blocks until the tensor's bytes are read (and verified, when the policy
 * asks) and gives a read-only handle to them in *out. Two threads acquiring
 * the same tensor share one read; a tensor still cached is not read again.
 * The data are the very bytes that were hashed, in private memory, aligned
 * to 64 bytes; they stay valid and unchanged until sluice_release, whatever
 * happens to the file.
 * Returns SLUICE_OK, SLUICE_E_INVAL, SLUICE_E_NOT_FOUND, SLUICE_E_IO,
 * SLUICE_E_FILE_CHANGED, SLUICE_E_CHECKSUM, SLUICE_E_TOO_LARGE,
 * SLUICE_E_POOL_EXHAUSTED (see below), SLUICE_E_NOMEM. On failure *out is
 * NULL (when out is not). A failure concerns that tensor only; acquiring it again
 * tries again. Any thread, including from a stream callback.
 *
 * SLUICE_E_POOL_EXHAUSTED: the tensor cannot get room and waiting could
 * never end. Room comes back from reads in flight, from stream callbacks
 * running (they release what they were given) and from threads about to
 * return a handle from the library; handles that threads hold outside
 * the library are not counted, since nothing says they will ever be
 * released (so size the pool for what all threads hold at once). A thread
 * that waits inside the library gives nothing back meanwhile: when the
 * waiting thread runs a stream callback, and the room it needs is held by
 * its own stream (the handle it was given, the stream's read-ahead),
 * that acquire alone fails, at once (others waiting for the same tensor
 * go on waiting); two callbacks of two streams that each wait for the
 * other's room both fail, they do not wait for ever, also when the two
 * streams run on two models. A callback that waits outside the library
 * (a lock, a join) for a thread that needs its stream's room cannot be
 * seen: that wait is the caller's to avoid. It is also returned
 * when enough bytes are free but not in one range ("Sizing the pool").
 *
 * I/O faults, on either backend (io_uring or the pread threads):
 *  - a short read is asked again for the rest, as long as each read
 *    brings bytes (counted in sluice_stats.retries);
 *  - EINTR and EAGAIN are retried after an exponential backoff: 50 us,
 *    doubling to 12.8 ms, at most SLUICE_IO_MAX_ATTEMPTS attempts in a row
 *    (about 26 ms in all); then the tensor fails with SLUICE_E_IO. The
 *    wait delays that read only: the other reads go on meanwhile;
 *  - a read that returns 0 bytes before the tensor's end (the file shrank
 *    after open): SLUICE_E_FILE_CHANGED;
 *  - any other errno (EIO, ENOSPC, ENXIO, ...): SLUICE_E_IO, the message
 *    names the tensor, the file, the offset and the errno. When one read
 *    covered several small tensors, each of them fails so.
 * The files are read through the descriptors opened at open and nothing is
 * ever mapped, so a file truncated, extended, rewritten, replaced or
 * deleted after open never raises SIGBUS: a deleted or replaced file is
 * still read as it was opened; a shrunk one gives SLUICE_E_FILE_CHANGED
 * past its end; bytes rewritten in place fail SLUICE_E_CHECKSUM when a
 * digest checks them, and are read as they now are when none does. A live
 * handle keeps its bytes, and a tensor held by one is served from memory.
 */
SLUICE_API int sluice_acquire(sluice_model *model, const char *name,
                              sluice_tensor **out);
/* The same by index in the model's order. */
SLUICE_API int sluice_acquire_index(sluice_model *model, size_t i,
                                    sluice_tensor **out);

/* The bytes of a handle (64-byte aligned; may be NULL for an empty tensor),
 * their count, and the tensor's information. Valid until release. A NULL
 * handle gives NULL, 0 and NULL. */
SLUICE_API const void *sluice_tensor_data(const sluice_tensor *t);
SLUICE_API uint64_t sluice_tensor_size(const sluice_tensor *t);
SLUICE_API const struct sluice_tensor_info *sluice_tensor_info(const sluice_tensor *t);

/* Copies the digest of the handle's bytes (in sluice_digest_algorithm),
 * as the pipeline computed it, into digest (32 bytes); for a tensor
 * checked chunk by chunk (a manifest with chunk digests) no whole digest
 * is computed: every chunk matched, and this is the manifest's digest of
 * the whole tensor. Returns SLUICE_OK, or SLUICE_E_INVAL when the
 * tensor was not hashed (no digest to check and no SLUICE_F_HASH_ALL), or
 * t or digest is NULL. */
SLUICE_API int sluice_tensor_digest(const sluice_tensor *t, uint8_t digest[32]);

/*
 * Ranges of a tensor, verified, without the pool
 * ----------------------------------------------
 * sluice_read_into reads bytes [byte_begin, byte_begin + len) of the
 * tensor `name` straight into dst (any alignment, len bytes) with pread
 * (a remote file: with range GETs, one at a time; fallback mirrors are
 * not tried), and returns once every byte in it is verified:
 *  - the manifest gives the tensor chunk digests (version 2 "chunks"):
 *    only the chunks covering the range are read, each whole, and each
 *    must match; the bytes of those chunks outside the range are read
 *    into a bounce buffer of at most 4 MiB, never into dst;
 *  - the manifest gives only the whole tensor's digest: the whole tensor
 *    is read and must match, however small the range (its bytes outside
 *    the range pass through the bounce buffer);
 *  - the tensor is not checked (no manifest, policy OFF, or IF_PRESENT
 *    and not listed): the bytes are read, nothing is verified.
 * A checked range that fails from the model's own files with
 * SLUICE_E_CHECKSUM, SLUICE_E_IO, SLUICE_E_FILE_CHANGED or
 * SLUICE_E_REMOTE is read again from the mirrors (sluice_options.fallback)
 * in order, each opened for the call, against the same digests; when all
 * fail, the primary's code and every source's failure in the message.
 * A remote model's ranges are read with range requests; a range whose
 * bytes came through the proxy and fail verification is read again from
 * the origin directly first, once ("Proxies").
 * len 0 reads nothing with chunk digests, and the whole tensor without.
 * It needs no room in the pool and holds no handle, so a tensor larger
 * than the pool loads into the caller's memory, and it never evicts a
 * cached tensor. It does not use the io_uring ring or O_DIRECT: one
 * thread reads and hashes, the calling one; several calls on several
 * threads run in parallel. On failure (SLUICE_E_CHECKSUM,
 * SLUICE_E_IO, SLUICE_E_FILE_CHANGED, SLUICE_E_NOMEM) the content of dst
 * is unspecified: some bytes may have been written, none are verified.
 * Counted in the stats (bytes_read, bytes_hashed, chunks_verified,
 * checksum_failures, failures; remote_reads and remote_bytes for a
 * remote file), not in tensors_loaded nor in the fallback_* counts.
 * Returns SLUICE_OK, those codes, SLUICE_E_NOT_FOUND (no such name) or
 * SLUICE_E_INVAL (range past the tensor's end, dst NULL with len > 0, bad
 * model). Any thread, concurrently with every other call but close.
 */
SLUICE_API int sluice_read_into(sluice_model *model, const char *name, uint64_t byte_begin,
                                void *dst, uint64_t len);

/*
 * sluice_acquire_range gives a handle on bytes [byte_begin, byte_end) of
 * the tensor `name`, read and verified as sluice_read_into does, into a
 * buffer of their size that the handle owns (malloc'd, 64-byte aligned,
 * outside the pool's budget; freed by sluice_release). sluice_tensor_data
 * and sluice_tensor_size give the range; sluice_tensor_info the whole
 * tensor's description; sluice_tensor_digest says SLUICE_E_INVAL (a range
 * has no digest of its own). The handle counts as live for sluice_close.
 * Returns as sluice_read_into, and SLUICE_E_INVAL for byte_end before
 * byte_begin or out NULL (*out is NULL on every failure). Any thread.
 */
SLUICE_API int sluice_acquire_range(sluice_model *model, const char *name, uint64_t byte_begin,
                                    uint64_t byte_end, sluice_tensor **out);

/* The digest (sluice_digest_algorithm) of bytes [byte_begin, byte_end)
 * of tensor i as its file holds them now, read with pread; nothing is
 * verified (what `sluice manifest --chunk` writes chunk digests with).
 * Returns SLUICE_OK, SLUICE_E_IO, SLUICE_E_FILE_CHANGED, SLUICE_E_NOMEM,
 * or SLUICE_E_INVAL (bad model, i or range, NULL digest). Any thread. */
SLUICE_API int sluice_digest_range(sluice_model *model, size_t i, uint64_t byte_begin,
                                   uint64_t byte_end, uint8_t digest[32]);

/*
 * Tensor-parallel parts, verified
 * -------------------------------
 * Rank `rank` of n equal parts of a tensor along dim `dim` is the slice
 * [rank * shape[dim] / n, (rank + 1) * shape[dim] / n) of that dim, laid
 * out contiguously as the rank's own tensor: shape[dim] / n, the other
 * dims whole, nbytes / n bytes. Along dim 0 it is one byte range of the
 * tensor; along dim d >= 1 it is prod(shape[0..d)) row segments of
 * nbytes / prod(shape[0..d)) / n bytes each, one stride apart.
 *
 * sluice_read_part_into reads the part into dst (len must be the part's
 * size, nbytes / n) and returns once it is verified, reading only what
 * that needs: a local file through the model's I/O seam (the io_uring
 * ring or its pread threads, sluice_stats.backend), many reads in flight
 * under queue_depth, segments less than SLUICE_PART_GAP apart one read
 * (the gap's bytes dropped), a read at most chunk_bytes; a remote file's
 * through the model's remote thread, as a load's (many requests in
 * flight under queue_depth and remote_connections, each retried as a
 * load's, a segment longer than chunk_bytes cut at chunk_bytes), its segments
 * in HTTP multi-range requests (Range: bytes=a-b,c-d,..., answered 206
 * multipart/byteranges), segments less than 256 bytes apart one range,
 * up to 512 ranges, a 6 KiB Range value and 16 MiB a request. Each
 * part of the reply must carry a Content-Range of the range asked, in
 * order, of the object's size at open, and the body must end with the
 * closing boundary: anything else is SLUICE_E_REMOTE (another size:
 * SLUICE_E_FILE_CHANGED). A server that answers a multi-range request
 * with 200, one range or 416 (S3 and many servers) gets the segments
 * left as single range requests, segments less than 64 KiB apart one
 * range of at most 16 MiB, and so do the file's later parts at once
 * (docs/parallel.md). Then:
 *  - the manifest lists the digest of this part (version 2 "parts", for
 *    this dim and n; `sluice manifest --parts`): only the part's bytes
 *    are read, hashed in the part's order, and must match;
 *  - no part digest, a dim-0 part (one range): as sluice_read_into, so
 *    with chunk digests only the covering chunks are read;
 *  - no part digest, a strided part (dim >= 1), or a dim-0 part without
 *    chunk digests: the whole tensor is read and must match its digest
 *    (its bytes outside the part go through a bounce buffer of at most
 *    4 MiB), counted in sluice_stats.part_fallback_bytes, and said once
 *    per model by sluice_part_note;
 *  - the tensor is not checked: the part's bytes only.
 * Fallback mirrors are not tried; a part whose bytes came through the
 * proxy and fail verification is read again from the origin directly,
 * once ("Proxies"). A part with a part digest of a remote model opened
 * with a persistent cache is kept there once verified, as the blob named
 * by its part digest, and a later read of it (any open, any process:
 * same tensor digest, dim, rank and n) reads that blob on the calling
 * thread instead of the server and hashes it against the part digest
 * again: counted in disk_hits, disk_hit_bytes and bytes_hashed (not in
 * bytes_read); a blob that fails is dropped (disk_rotten,
 * checksum_failures) and the part read from the source and stored again
 * ("Persistent cache"). On failure dst holds anything. Counted
 * in the stats as sluice_read_into is (bytes_read: what was read, so a
 * rank's reads can be checked against the layout; a local file's gaps
 * are not counted; a remote file's requests in remote_reads, their bytes,
 * gaps included, in remote_bytes), and its reads, local or remote, also
 * as a load's are (reads, sluice_read_duration_seconds; a local file's
 * retries: EINTR, EAGAIN and short reads are retried as for a load,
 * any other failure is SLUICE_E_IO; a remote file's in remote_retries).
 * Returns SLUICE_OK, SLUICE_E_CHECKSUM, SLUICE_E_IO, SLUICE_E_FILE_CHANGED,
 * SLUICE_E_NOMEM, SLUICE_E_REMOTE, SLUICE_E_NOT_FOUND, or SLUICE_E_INVAL:
 * a dim the
 * tensor lacks, n 0 or rank >= n, a dim that n does not divide (the
 * message has the numbers), len not the part's size, dst NULL with
 * len > 0, a bad model. Any thread, concurrently with every call but
 * close.
 */
SLUICE_API int sluice_read_part_into(sluice_model *model, const char *name, uint32_t dim,
                                     uint64_t rank, uint64_t n, void *dst, uint64_t len);

/*
 * sluice_acquire_part gives a handle on the part, read and verified as
 * sluice_read_part_into does, in a buffer of the pool (64-byte aligned,
 * counted in pool_in_use, given back by sluice_release). The buffer is
 * taken as an acquire's load takes one (sluice_acquire): unheld tensors
 * are evicted for it; when the room is held, it waits while room may
 * come back (reads in flight, stream callbacks running, ...) and fails
 * with SLUICE_E_POOL_EXHAUSTED when it cannot (handles held outside the
 * library: size the pool for the parts held at once too), and with
 * SLUICE_E_TOO_LARGE when the part is larger than the pool. Waiting in a
 * stream callback, it holds its stream's room as an acquire there does:
 * when others wait for that room and no other comes back, it alone fails,
 * and they go on waiting (sluice_acquire, SLUICE_E_POOL_EXHAUSTED).
 * sluice_tensor_info describes the part: the tensor's name, dtype and
 * file, shape[dim] / n, nbytes / n (offset and data_begin stay the
 * whole tensor's); sluice_tensor_digest says SLUICE_E_INVAL. Returns as
 * sluice_read_part_into, SLUICE_E_POOL_EXHAUSTED, SLUICE_E_TOO_LARGE, and
 * SLUICE_E_INVAL for out NULL (*out is NULL on every failure). Any thread,
 * including from a stream callback.
 */
SLUICE_API int sluice_acquire_part(sluice_model *model, const char *name, uint32_t dim,
                                   uint64_t rank, uint64_t n, sluice_tensor **out);

/* Options of sluice_read_part_into_ex and sluice_acquire_part_ex. Start
 * from sluice_part_options_init(), which writes the defaults and the
 * struct's size; fields are only ever appended. The token is of
 * sluice_cancel_create ("Streaming with options"). */
typedef struct sluice_part_options {
    size_t size;                     /* set by sluice_part_options_init */
    struct sluice_cancel *cancel;    /* NULL: not cancellable */
} sluice_part_options;

/* Fills *o with the defaults. Returns SLUICE_E_INVAL if o is NULL. */
SLUICE_API int sluice_part_options_init(sluice_part_options *o);

/*
 * sluice_read_part_into and sluice_acquire_part with options (o NULL: the
 * same as those calls, which are these with no token). Besides what they
 * return: SLUICE_E_CANCELLED when o->cancel was requested before the part
 * was complete (also when it was requested at the call: then nothing is
 * read). A local file's part stops issuing reads once the token is
 * requested and waits for the reads already in flight (they write into
 * dst) before it returns, so dst is the caller's again on return; it
 * holds anything then (some of the part's bytes, unverified). A remote
 * file's part sends no request once the token is requested and aborts
 * the transfer in flight (libcurl's progress callback: within about a
 * second even when the server sends nothing), without retrying it nor
 * going to the origin past a proxy; dst holds anything then too. An
 * acquire waiting for room in the pool stops waiting. A cancelled
 * acquire gives no handle (*out NULL) and gives its pool buffer back
 * (pool_in_use as before the call); a cancelled part is not stored in
 * the persistent cache. The bytes read before the token was seen are
 * counted (reads, bytes_read, remote_*); a cancelled part is not
 * counted in failures (as a stream's tensors not delivered). A part the
 * persistent cache holds (a cache hit) is read whole once begun.
 * SLUICE_E_INVAL for an options size this library does not know
 * (smaller than the size field, or a larger one with a non-zero tail).
 * Any thread, as those calls; one token may serve many calls at once
 * (sluice_cancel_request stops them all).
 */
SLUICE_API int sluice_read_part_into_ex(sluice_model *model, const char *name, uint32_t dim,
                                        uint64_t rank, uint64_t n, void *dst, uint64_t len,
                                        const sluice_part_options *o);
SLUICE_API int sluice_acquire_part_ex(sluice_model *model, const char *name, uint32_t dim,
                                      uint64_t rank, uint64_t n, sluice_tensor **out,
                                      const sluice_part_options *o);

/* The digest (sluice_digest_algorithm) of the part's bytes laid out
 * contiguously, of tensor i as its file holds them now; nothing is
 * verified (what `sluice manifest --parts` writes). Returns SLUICE_OK,
 * SLUICE_E_IO, SLUICE_E_FILE_CHANGED, SLUICE_E_NOMEM, or SLUICE_E_INVAL
 * (bad model, i, dim, rank or n, NULL digest). Any thread. */
SLUICE_API int sluice_digest_part(sluice_model *model, size_t i, uint32_t dim, uint64_t rank,
                                  uint64_t n, uint8_t digest[32]);

/* NULL until a part was checked by reading its whole tensor (no part
 * digests: see sluice_read_part_into), then one sentence naming the
 * first such part and what to do about it, the same for the rest of the
 * model's life (said once per model; the bytes are counted in
 * part_fallback_bytes). Borrowed until close. Any thread. */
SLUICE_API const char *sluice_part_note(sluice_model *model);

/*
 * Rules: which tensors a rank splits, along which dim. A rules text is
 * lines `PATTERN DIM` or `PATTERN replicated` (fnmatch(3) globs without
 * flags, so `*` crosses dots; `#` to the end of the line is a comment;
 * blank lines skipped; at most 1024 lines, patterns of at most 255
 * bytes, dims 0..7). The first matching pattern decides; a name no rule
 * matches is replicated; a name ending in ".bias" that no rule matches
 * follows its ".weight" (its dim when the bias has that dim, replicated
 * otherwise). The built-in set (text NULL; sluice_part_rules_builtin
 * gives its text) is Llama/Qwen/Mistral naming as vLLM and Megatron
 * split it: q/k/v/gate/up_proj weights and embed_tokens and lm_head
 * dim 0, o_proj and down_proj dim 1, norms replicated; fused qkv_proj and
 * gate_up_proj stay whole (a rank keeps a slice of each stacked matrix,
 * which no one part along dim 0 is).
 *
 * sluice_part_rules_parse: *out gets the rules of text (len bytes; NULL:
 * the built-in set). Returns SLUICE_OK, SLUICE_E_NOMEM, or SLUICE_E_INVAL
 * with why (may be NULL; why_cap bytes) naming the line and the fault.
 * sluice_part_rules_builtin: the built-in set's text, a static string
 * (never freed; any thread).
 * sluice_part_rules_dim: *dim gets the dim the rules give name (a tensor
 * of ndim dims), or SLUICE_PART_REPLICATED. Returns SLUICE_OK, or
 * SLUICE_E_INVAL (a NULL argument, or a rule naming a dim the tensor
 * lacks: *dim has it). sluice_part_rules_free frees (NULL: no-op). Rules
 * are immutable: any thread may read them at once.
 */
typedef struct sluice_part_rules sluice_part_rules;
#define SLUICE_PART_REPLICATED (-1)
#define SLUICE_PART_MAX_DIM 7
SLUICE_API int sluice_part_rules_parse(const char *text, size_t len, sluice_part_rules **out,
                                       char *why, size_t why_cap);
SLUICE_API int sluice_part_rules_dim(const sluice_part_rules *rules, const char *name,
                                     uint32_t ndim, int *dim);
SLUICE_API const char *sluice_part_rules_builtin(void);
SLUICE_API void sluice_part_rules_free(sluice_part_rules *rules);

/* Gives a handle back. The tensor's buffer stays cached until the pool
 * needs its room. NULL is a no-op. Returns SLUICE_OK, or SLUICE_E_INVAL
 * for a handle that is not live: a handle released twice is detected as
 * long as fewer than 1024 other handles were released in between (the
 * model reuses a released handle's memory only after that many); past
 * that, or after a successful sluice_close, which frees every handle, a
 * second release is undefined. Any thread. */
SLUICE_API int sluice_release(sluice_tensor *t);

/*
 * Called by sluice_stream for each tensor, in completion order, from one of
 * the library's threads or the caller's. On success status is SLUICE_OK and
 * t is a live handle that now belongs to the callback: release it now or
 * later. On failure t is NULL, status the code, and message the detail.
 * info is borrowed until close. Return 0 to go on; a non-zero return stops
 * the stream, which then returns that value.
 * Calls are never concurrent for one stream.
 */
typedef int (*sluice_stream_fn)(void *user, sluice_tensor *t, int status,
                                const struct sluice_tensor_info *info,
                                const char *message);

/*
 * Reads the listed tensors (names NULL: all tensors, n ignored; names
 * non-NULL and n = 0: none) as fast as the pool allows and calls back as
 * each is ready, memory bounded by the pool. A name may be listed twice
 * (delivered twice). Returns SLUICE_OK when every tensor was delivered,
 * the callback's non-zero value, or the first failing tensor's code (after
 * all the others were delivered); before any delivery, SLUICE_E_INVAL (bad
 * model, NULL fn, a NULL name), SLUICE_E_NOT_FOUND (an unknown name) or
 * SLUICE_E_NOMEM. Any thread; several streams may run at once. The
 * callback may call any function on the model (sluice_close is refused
 * with SLUICE_E_BUSY while the stream runs); a stream it starts is
 * delivered SLUICE_E_POOL_EXHAUSTED for a tensor whose room only the
 * calling stream could give back (see sluice_acquire).
 * Memory: a stream reads ahead at most queue_depth x chunk_bytes (at least
 * 64 MiB, at most half the pool) past the tensor it waits for, and a
 * tensor it delivered and the callback released is the first whose room
 * is reused (a stream is one pass), before any untouched page of the pool:
 * its resident memory stays near the largest tensor plus that window.
 */
SLUICE_API int sluice_stream(sluice_model *model, const char *const *names,
                             size_t n, sluice_stream_fn fn, void *user);

/* ------------------------------------------------------------------------ */
/* Streaming with options: cancellation and progress                        */
/* ------------------------------------------------------------------------ */

/*
 * A cancellation token: an object of its own, so that any thread holding
 * it can stop the streams that were given it, without knowing the model
 * or the stream. One token may serve several streams, on several models,
 * one after the other or at once; cancelling stops them all.
 *
 * sluice_cancel_create: *out gets a new token, not requested. Returns
 * SLUICE_OK, SLUICE_E_INVAL (out NULL) or SLUICE_E_NOMEM.
 * sluice_cancel_request: sets the token and wakes every stream waiting on
 * it; each returns SLUICE_E_CANCELLED soon (before its next callback, or
 * as soon as the callback running returns); so do the part reads given it
 * (sluice_read_part_into_ex). Any thread, any number of
 * times; NULL is a no-op. A token stays requested until reset.
 * sluice_cancel_requested: non-zero once requested (0 for NULL).
 * sluice_cancel_reset: makes it unrequested again (for the next stream).
 * sluice_cancel_free: frees it; no stream may still be using it. NULL is
 * a no-op.
 */
typedef struct sluice_cancel sluice_cancel;
SLUICE_API int sluice_cancel_create(sluice_cancel **out);
SLUICE_API void sluice_cancel_request(sluice_cancel *c);
SLUICE_API int sluice_cancel_requested(const sluice_cancel *c);
SLUICE_API void sluice_cancel_reset(sluice_cancel *c);
SLUICE_API void sluice_cancel_free(sluice_cancel *c);

/* How far a stream has come: counts of its list (a name listed twice
 * counts twice; failed tensors count as done). */
struct sluice_stream_progress {
    size_t size;             /* sizeof(struct sluice_stream_progress) */
    size_t tensors_done;     /* delivered, successfully or not */
    size_t tensors_total;
    uint64_t bytes_done;     /* tensor bytes of those */
    uint64_t bytes_total;
};

/* Called on the stream's own thread (the caller of sluice_stream_ex),
 * never while a stream callback runs, with no lock of the library held:
 * it may call anything on the model, except close (which would wait for
 * the stream it is called from, for ever). p is valid during the call
 * only. */
typedef void (*sluice_stream_progress_fn)(void *user, const struct sluice_stream_progress *p);

/* Options of sluice_stream_ex. Start from sluice_stream_options_init(),
 * which writes the defaults and the struct's size; fields are only ever
 * appended. */
typedef struct sluice_stream_options {
    size_t size;                     /* set by sluice_stream_options_init */
    sluice_stream_progress_fn progress; /* NULL: none */
    void *progress_user;
    uint32_t progress_interval_ms;   /* at most one call per interval; default
                                        100; the last call (all done, or the
                                        stream stopping) is always made */
    sluice_cancel *cancel;           /* NULL: not cancellable */
} sluice_stream_options;

/* Fills *o with the defaults. Returns SLUICE_E_INVAL if o is NULL. */
SLUICE_API int sluice_stream_options_init(sluice_stream_options *o);

/*
 * sluice_stream with options (o NULL: the same as sluice_stream). Besides
 * what sluice_stream returns: SLUICE_E_CANCELLED when o->cancel was
 * requested before every tensor was delivered (also when it was already
 * requested at the call: then nothing is delivered; an empty list has
 * nothing to cancel and returns SLUICE_OK); the tensors not yet
 * delivered are not, and their read-ahead is dropped. SLUICE_E_INVAL for
 * an options size this library does not know (smaller than the size
 * field, or a larger one with a non-zero tail).
 */
SLUICE_API int sluice_stream_ex(sluice_model *model, const char *const *names,
                                size_t n, sluice_stream_fn fn, void *user,
                                const sluice_stream_options *o);

/*
 * Gives memory back to the system: evicts every cached tensor that no
 * handle holds and no stream or acquire waits for, and returns the pages
 * of every free range of the pool to the kernel (madvise MADV_DONTNEED),
 * so the process's resident size falls after a load. Buffers held by
 * handles, and reads in flight, are left alone. The pool stays usable: the
 * next reads fault their pages in afresh. *released (may be NULL) gets
 * the bytes given back: the pages that were resident (a second trim with
 * nothing loaded in between gives back 0). Returns SLUICE_OK or SLUICE_E_INVAL. Any thread.
 */
SLUICE_API int sluice_trim(sluice_model *model, uint64_t *released);

/* ------------------------------------------------------------------------ */
/* Manifests                                                                */
/* ------------------------------------------------------------------------ */

/*
 * A manifest is a JSON file of digests, read once by sluice_open (see
 * there for where it is looked for). Three forms are read:
 *
 *  - flat: {"tensor name": "64 hex digits", ...} (SHA-256)
 *  - version 1:
 *      {"format": "sluice-manifest", "version": 1, "algorithm": "sha256",
 *       "tensors": {"tensor name": {"sha256": "..."}, ...},
 *       "files": {"model-00001-of-00002.safetensors":
 *                   {"sha256": "...", "size": 4970000000}, ...}}
 *    "tensors" and "files" are optional; "size" is optional.
 *  - version 2 (what `sluice manifest` writes):
 *      {"format": "sluice-manifest", "version": 2, "algorithm": "sha256",
 *       "tensors": {"tensor name": {"digest": "...", "dtype": "BF16",
 *                                   "shape": [4, 8], "nbytes": 64}, ...},
 *       "files": {"model.safetensors": {"digest": "...", "size": 1234,
 *                                       "header": "..."}, ...}}
 *    "algorithm" is "sha256" or "blake3" (every digest of the manifest is
 *    of that algorithm); each tensor entry needs all four keys and each
 *    file entry all three. "header" is the digest of the file's first
 *    8 + N bytes: the length prefix and the JSON header exactly as stored
 *    (`head -c $((8 + N)) F | sha256sum`). At open, every listed tensor's
 *    dtype, shape and nbytes, and every listed file's size and header
 *    digest, must equal the model's (the header digest is taken of the
 *    very bytes parsed), else the open fails with
 *    SLUICE_E_MANIFEST_MISMATCH naming the tensor or file and both
 *    values. So a header rewritten to change how the bytes are read
 *    (BF16 [4, 8] made F16 [8, 4], offsets swapped between tensors of one
 *    size, __metadata__ edited) fails the open. A version 1 or flat
 *    manifest covers the tensor bytes only: such a rewrite passes it.
 *    A tensor entry may also hold "parts": {"dim": D, "digests": {"N":
 *    [N digests], ...}}: the digests of its N tensor-parallel parts
 *    along dim D (see sluice_read_part_into), for at most 8 world sizes
 *    N in 2..65536 that divide shape[D]; anything else in it fails the
 *    open with SLUICE_E_MANIFEST_FORMAT, _DIGEST or _DUPLICATE.
 *
 * File keys are the shards' base names; a file's digest is of the whole
 * file (with SHA-256, the one the Hugging Face Hub lists for a Git LFS
 * file). Open does not read whole files: the whole-file digests are for
 * sluice_manifest_file() (the `sluice verify --files` command).
 *
 * A top-level object whose "format" member is not itself a digest is the
 * structured form; any other object is flat (so a tensor may be named
 * "format"). Digests are 64 hex digits, either case. Names are compared
 * byte for byte after JSON escapes are decoded (an escaped NUL included).
 *
 * Faults, each failing the open:
 *  SLUICE_E_MANIFEST            the file cannot be opened or read (errno in
 *                               the message), is larger than
 *                               SLUICE_MAX_MANIFEST_BYTES, or is not JSON
 *                               (the message gives line, column and byte);
 *                               or REQUIRE was asked and there is no manifest
 *                               (the message names the sidecars looked for)
 *  SLUICE_E_MANIFEST_FORMAT     not an object; unknown "format", "version" or
 *                               "algorithm"; an unknown key; an entry that is
 *                               not an object or lacks a key its version
 *                               needs; a bad "size", "nbytes", "dtype" or
 *                               "shape"; a string value holding an escaped
 *                               NUL ("\u0000"; names may hold one)
 *  SLUICE_E_MANIFEST_DIGEST     a digest that is not a string of 64 hex digits
 *  SLUICE_E_MANIFEST_DUPLICATE  a tensor, file or key listed twice
 *  SLUICE_E_MANIFEST_UNKNOWN    a tensor or file the model does not have
 *  SLUICE_E_MANIFEST_MISSING    REQUIRE and tensors without a digest (the
 *                               message gives the count and the first names),
 *                               or, version 2, a file without an entry
 *  SLUICE_E_MANIFEST_MISMATCH   version 2: a header disagrees (see above)
 *  SLUICE_E_UNSUPPORTED         "algorithm": "blake3" in a build without it
 *
 * Policies (sluice_options.verify):
 *  DEFAULT     REQUIRE when a manifest is in play (manifest_path set, the
 *              sidecar exists, or a Hub snapshot's derived manifest: "Hub
 *              snapshots" below), else OFF.
 *  REQUIRE     a manifest must be found and give every tensor a digest
 *              (version 2: and list every file, so every header is
 *              checked); every tensor is checked when read.
 *  IF_PRESENT  the tensors the manifest lists are checked, others are not;
 *              no manifest found: nothing is checked (an explicit
 *              manifest_path that cannot be read still fails).
 *  OFF         no manifest is read at all, manifest_path included.
 * A checked tensor whose bytes do not match fails with SLUICE_E_CHECKSUM
 * (see sluice_acquire); its bytes are never handed out.
 *
 * Hub snapshots
 * -------------
 * A model downloaded with huggingface_hub lies in the Hub's cache
 * ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub) as
 * models--ORG--NAME/snapshots/REV/FILE, a symlink to ../../blobs/HEX, HEX
 * the SHA-256 of the file that the Hub published. The layout is
 * recognised wherever it lies: a local model with no manifest (no
 * manifest_path, no sidecar: a manifest named or found always wins),
 * whose every file is opened through a path whose real path is
 * R/blobs/HEX (64 lowercase hex digits; the very file opened), under a
 * directory R/snapshots/, is verified against those digests, under
 * DEFAULT, REQUIRE and IF_PRESENT alike:
 *  - A whole-file digest cannot check one tensor, so the first open of
 *    a file reads it whole, once, in one pass that hashes the file and,
 *    from the same bytes, every tensor of it and each 16 MiB chunk of
 *    the larger ones. A file whose SHA-256 is not its blob's name fails
 *    the open with SLUICE_E_CHECKSUM, the message naming the file, the
 *    digest expected (the blob's name) and the digest got; no byte of
 *    the model is handed out before its file matched.
 *    The pass also hashes the file's 8 + N header bytes: unless they
 *    are the header parsed at open (the names, dtypes, shapes and
 *    offsets the derived digests are bound to), nothing is derived and
 *    the open fails, SLUICE_E_FILE_CHANGED for a snapshot's file (it
 *    changed in between), SLUICE_E_CHECKSUM for an hf:// one (the header
 *    served at open is not the published file's).
 *  - The digests derived are a version 2 manifest of that file (the
 *    form `sluice manifest` writes, by the same code), kept in the cache
 *    directory (cache_dir, else $SLUICE_CACHE_DIR, else the default one,
 *    $XDG_CACHE_HOME/sluice or $HOME/.cache/sluice; this needs no
 *    SLUICE_F_CACHE_DEFAULT) as derived/sha256/HEX.manifest.json, keyed
 *    by the file's digest and written atomically (a temporary file,
 *    fsynced, renamed). Without a directory to keep it in, or where it
 *    cannot be written, every open derives again.
 *  - A later open reads the derived manifest of each file (it must list
 *    that file with its blob's digest and size and every tensor of it,
 *    and nothing else; else it is derived again and replaced), checks
 *    its header digests as for any version 2 manifest, and then verifies
 *    each tensor as it loads, reading only that tensor's bytes: the
 *    whole file is not hashed again.
 *  - sluice_verify_state says SLUICE_VERIFIED_PUBLISHER_DIGEST, *where
 *    the derived manifest (also sluice_manifest_path); the policy in
 *    force is REQUIRE under DEFAULT (every tensor has a digest).
 *    sluice_verify with SLUICE_VF_FILES checks every whole file against
 *    its blob's digest.
 *  - What this trusts: the Hub's digest (the blob's name, which whoever
 *    can write the Hub's cache could change along with the bytes: no
 *    signature covers it), and then the derived manifest in the cache
 *    directory, as the verified-once memo trusts its records: whoever
 *    can write the cache directory can make the next open accept other
 *    bytes. Keep the cache directory as private as the weights.
 *    Trusted keys or CAs ask for a signed manifest: a Hub snapshot
 *    without one still fails closed (SLUICE_E_SIGNATURE), as any model
 *    without a manifest.
 *  - Not covered: a file that is not the blob its name points to (a
 *    plain copy of a snapshot, a file not under snapshots/), and files
 *    that are no Git LFS object (the Hub names those by their Git SHA-1,
 *    40 digits): such a model is opened as before, unverified without a
 *    manifest.
 *  - hf:// models: a Hub location (hf://ORG/NAME[@REVISION][/FILE],
 *    "Remote models") whose repository publishes no sluice manifest at
 *    the commit (no sidecar there; a published one, or manifest_path,
 *    always wins) is derived the same way, by the same code, from the
 *    SHA-256 the Hub's API lists for each Git LFS file (lfs.sha256, the
 *    digest resolve answers as X-Linked-Etag): the first open reads each
 *    file without a derived manifest whole, once, through its remote
 *    source (16 MiB ranges; bytes through a proxy that do not match are
 *    read again from the origin directly, once), a mismatch fails the
 *    open with SLUICE_E_CHECKSUM naming the file, the digest published
 *    and the digest of the bytes, and a match keeps the same
 *    derived/sha256/HEX.manifest.json (shared with a snapshot of the same
 *    file); later opens read only the header and the tensors loaded.
 *    The state is SLUICE_VERIFIED_PUBLISHER_DIGEST, REQUIRE is met,
 *    mirrors are allowed; trusted keys or CAs still fail closed. It
 *    trusts the Hub's API (at the pinned commit) for the digests, then
 *    the cache directory. A repository with a file the Hub lists no
 *    SHA-256 for (no Git LFS object: its Git blob id is no SHA-256 of the
 *    file) derives nothing: it opens unverified as before, the other
 *    files' digests checking whole files only (sluice_verify with
 *    SLUICE_VF_FILES), and REQUIRE fails with SLUICE_E_MANIFEST.
 *
 * Signed manifests
 * ----------------
 * A manifest next to the weights protects against damage, not against
 * whoever can write that directory: they can rewrite the manifest with
 * the weights. sluice_options.trusted_keys closes that: when it is set,
 * sluice_open fails closed, with SLUICE_E_SIGNATURE, unless the manifest
 * it reads carries a valid Ed25519 signature by one of the trusted keys.
 *  - The signature is the file "M.sig" beside the manifest M that was
 *    read (the sidecar's, or manifest_path's), written by `sluice sign`.
 *    It is detached: Ed25519 (RFC 8032, pure) over M's exact bytes.
 *  - Its format is strict text, exactly five lines each ended by LF:
 *      sluice-signature 1
 *      algorithm ed25519
 *      key sha256:<64 lowercase hex: SHA-256 of the signer's public key
 *                  as DER SubjectPublicKeyInfo>
 *      manifest-sha256 <64 lowercase hex: SHA-256 of the bytes signed>
 *      signature <the 64-byte signature in canonical base64, 88 characters>
 *    The key and manifest-sha256 lines pick the key and explain a
 *    failure; they are not trusted: the verdict is the Ed25519
 *    verification of the manifest's bytes with that trusted key.
 *  - A trusted key is a PEM file "-----BEGIN PUBLIC KEY-----" holding an
 *    Ed25519 key (`sluice keygen` writes one, PREFIX.pub). Every file
 *    listed must be such a key, or the open fails, whichever key signed;
 *    EC public keys (OpenSSF model signing's, below) may stand beside
 *    them and are skipped here (a list of EC keys alone fails).
 *  - The manifest is read once: the very bytes verified are the bytes
 *    parsed, and the signature is checked before they are parsed.
 *  - A remote manifest's (http(s)://, s3://, hf://) signature M.sig is
 *    fetched beside it, from the same server (never through a proxy), and
 *    checked as a local one; none there (404) fails with
 *    SLUICE_E_SIGNATURE, as does the Hub's LFS SHA-256 standing in for a
 *    manifest (nobody signed them).
 *  - Each fault has its own message (code SLUICE_E_SIGNATURE; a NULL
 *    entry, or trusted_keys and ntrusted_keys that disagree, one NULL or
 *    0 and not the other, is SLUICE_E_INVAL): a key file
 *    unreadable, empty, not PEM, truncated (no END line), a private key,
 *    not Ed25519; the signature file missing, unreadable, not a regular
 *    file, malformed (the message names the line and what is wrong), made
 *    with a key that is not trusted (both key ids named); the manifest
 *    changed after signing (both SHA-256 named); the signature altered
 *    (the manifest is the one it names, yet it does not verify).
 *  - Trusted keys never mean "unverified": with SLUICE_VERIFY_OFF they
 *    fail the open with SLUICE_E_INVAL, and when no manifest is found
 *    (DEFAULT or IF_PRESENT without a sidecar) with SLUICE_E_SIGNATURE.
 *    The policy then applies as usual to the signed manifest.
 * Not protected against: a stolen signing key; an older manifest that
 * was validly signed, with its weights (rollback: nothing here dates a
 * signature); whoever can change the list of trusted keys or the program.
 */

/* OpenSSF model signing
 * ---------------------
 * The industry's format (sigstore/model-transparency, the model_signing
 * package 1.x): a Sigstore bundle "model.sig" in the model's directory
 * holding a DSSE envelope whose in-toto statement lists every file of the
 * directory with its SHA-256, signed with ECDSA by an EC key (P-256,
 * P-384, P-521) or by a certificate chained to a CA. A publisher runs
 * `sluice manifest`, then signs the directory (`sluice sign DIR --key
 * EC.pem --format model-signing`, or the reference's `model_signing sign
 * key|certificate`), so that sluice.manifest.json is one of the files
 * signed.
 *  - When it applies: trusted_cas or signature_path set, or trusted_keys
 *    holding an EC key and model.sig present in the model's directory;
 *    otherwise trusted_keys ask for the Ed25519 M.sig above. trusted_keys
 *    may hold EC and Ed25519 keys together: each format uses its own
 *    kind.
 *  - sluice_open verifies, before the manifest is parsed, as the
 *    reference does: the media type (bundle v0.3); the verification
 *    material (a public-key hint, SHA-256 of the key's PEM text, that
 *    names one trusted EC key; the older form without a hint is tried
 *    with each; or the certificate chain, leaf first, to a trusted CA,
 *    checked at the leaf's notBefore at OpenSSL security level 2 (no
 *    SHA-1 signature, no RSA key under 2048 bits), and the leaf a
 *    code-signing certificate as OpenSSL 3.2's X509_PURPOSE_CODE_SIGN
 *    defines it: not a CA (X509_check_ca), key usage critical with
 *    digitalSignature and without keyCertSign or cRLSign, extended key
 *    usage with codeSigning and without serverAuth or
 *    anyExtendedKeyUsage; stricter than the reference, which takes
 *    digitalSignature or codeSigning alone, docs/manifests.md); the
 *    ECDSA signature, with the curve's hash, over the DSSE
 *    pre-authentication encoding (an (r, s) and its twin (r, n - s) both
 *    verify, as everywhere: the same payload signed); the payload type,
 *    statement type and
 *    predicate type; one subject whose SHA-256 is that of the listed
 *    resource digests, in order.
 *  - Then the link to what is loaded: the manifest read (its path
 *    relative to the model's directory) must be listed, with the SHA-256
 *    of the very bytes then parsed (read once), and every .safetensors
 *    file of the model must be listed (files mode: with a SHA-256 that
 *    must equal the manifest's own "files" digest, and stands in for it
 *    where the manifest has none, for `sluice verify --files`; shards
 *    mode: by its shards). The weights are not read at
 *    open: every tensor is then verified against the now-trusted
 *    manifest as usual.
 *  - Each failure is SLUICE_E_SIGNATURE with its own message: bundle
 *    missing or not JSON, wrong media type, keyless, no trusted key or
 *    CA of the kind it needs, key hint mismatch, untrusted chain,
 *    certificate not for signing, bad signature, wrong payload,
 *    statement or predicate type, inconsistent subject digest, the
 *    manifest not listed, its digest different, a model file not listed.
 *  - Keyless (Sigstore: a Fulcio certificate and a transparency-log
 *    entry) bundles are refused: they need the Sigstore trust root and an
 *    online log check. Verify those with the reference verifier where the
 *    model is published, and give loaders a key or CA signature.
 *  - A remote model's bundle (model.sig beside its files, or a remote
 *    signature_path) is fetched from the same server and checked as a
 *    local one; the manifest must lie in the model's directory there to
 *    be listed by it. None there fails with SLUICE_E_SIGNATURE.
 */

/* The largest manifest read, in bytes. */
#define SLUICE_MAX_MANIFEST_BYTES ((uint64_t)1 << 30)
/* The size sluice_manifest_file() reports when the manifest gives none. */
#define SLUICE_SIZE_UNKNOWN UINT64_MAX

/* The policy in force on an open model: SLUICE_VERIFY_REQUIRE or
 * SLUICE_VERIFY_IF_PRESENT when a manifest was read, else
 * SLUICE_VERIFY_OFF (also for a NULL or failed model); never DEFAULT.
 * Any thread. */
SLUICE_API sluice_verify_policy sluice_verify_mode(const sluice_model *model);

/* What sluice_open found to check the model's bytes against. */
typedef enum sluice_verification {
    SLUICE_VERIFIED = 0,            /* a manifest was read: *where is its path
                                       (sluice_manifest_path; a URL without
                                       credentials or query); under IF_PRESENT
                                       it may list only some tensors
                                       (sluice_manifest_tensor says which) */
    SLUICE_UNVERIFIED_NO_MANIFEST = 1, /* DEFAULT or IF_PRESENT, no manifest_path,
                                       and no sidecar: a local file that does
                                       not exist, or a remote one that answered
                                       404 (a CDN miss, a mirror lacking it
                                       look the same); *where is the sidecar
                                       looked for, or both ("A nor B", see
                                       sluice_open), without credentials or
                                       query. No tensor is checked (an hf://
                                       model with a file that is no Git LFS
                                       object: the Hub's LFS SHA-256 of the
                                       others may still be the manifest,
                                       sluice_manifest_path, for
                                       sluice_verify's whole files) */
    SLUICE_UNVERIFIED_OFF = 2,      /* SLUICE_VERIFY_OFF: no manifest was looked
                                       for; *where is NULL. Nothing is checked */
    SLUICE_VERIFIED_PUBLISHER_DIGEST = 3 /* verified against the publisher's file
                                       digest: a Hugging Face Hub cache snapshot
                                       with no manifest of its own, each file
                                       checked against the SHA-256 its blob is
                                       named by (an hf:// model that publishes
                                       none: the LFS SHA-256 the Hub lists),
                                       each tensor against the manifest
                                       derived from those verified bytes (see "Hub
                                       snapshots"); *where is that derived
                                       manifest (sluice_manifest_path) */
} sluice_verification;

/*
 * Whether the model is verified, and against what: returns its
 * sluice_verification (>= 0), *where (where may be NULL) as above,
 * borrowed until sluice_close; or SLUICE_E_INVAL for a NULL or failed
 * model (*where NULL). The same value is struct sluice_stats' unverified
 * and the gauge sluice_unverified (there 0 for both verified states), so
 * that an unverified model can be seen from outside (`sluice cat` and
 * `sluice stats` warn on stderr).
 *
 * Why a remote model does not default to REQUIRE: most remote sources
 * (a Hugging Face repository, an S3 bucket of weights) publish no sluice
 * manifest, so REQUIRE by default would fail every such open and teach
 * callers to turn verification OFF, which checks less than DEFAULT does
 * with a manifest. DEFAULT therefore means the same for a local and a
 * remote model: REQUIRE when a manifest is in play, else unverified, and
 * visible as such here. A caller that must not run unverified sets
 * SLUICE_VERIFY_REQUIRE (an open without a manifest then fails with
 * SLUICE_E_MANIFEST, naming the sidecar), or names the manifest
 * (manifest_path, a path or a URL): a named manifest that cannot be
 * fetched or read (404 included) fails the open with SLUICE_E_MANIFEST,
 * under every policy but OFF; so does a sidecar whose fetch fails in any
 * other way than 404 (5xx after every attempt, a timeout, a refusal).
 * Any thread.
 */
SLUICE_API int sluice_verify_state(const sluice_model *model, const char **where);

/* The path of the manifest read at open (as given, or the sidecar that
 * was found, see sluice_open for their order; a remote one as messages
 * show it: no user:password@, "?..." for its query), or NULL when none
 * was read. Borrowed until sluice_close. Any thread. */
SLUICE_API const char *sluice_manifest_path(const sluice_model *model);

/* The local manifest sluice_open would read for the local model at path
 * by the sidecar rule (see sluice_open), found without opening the
 * model, so that one that cannot be opened (a damaged header, a missing
 * or truncated shard) can still be judged by its manifest: the first
 * sidecar that is there (or cannot be told absent). For a directory or
 * an index.json, the second sidecar (the model is one file F:
 * F.manifest.json) takes F's base name from like (may be NULL): an open
 * model of the same files, a mirror, with one file. *manifest gets the
 * path, malloc'd (free() it). Returns SLUICE_OK; SLUICE_E_MANIFEST when
 * none is there, *manifest then the sidecars looked for ("A" or "A nor
 * B"), malloc'd too, for a message; SLUICE_E_NOMEM (*manifest NULL), or
 * SLUICE_E_INVAL (NULL path or manifest, like failed). Any thread. */
SLUICE_API int sluice_find_manifest(const char *path, const sluice_model *like,
                                    char **manifest);

/* The algorithm of every digest the model checks and reports (the
 * manifest's; without one, sluice_options.algorithm). SHA-256 for a NULL
 * or failed model. Any thread. */
SLUICE_API sluice_algorithm sluice_digest_algorithm(const sluice_model *model);

/* The manifest's version: 0 flat, 1 or 2; also 0 when none was read; -1
 * for a NULL or failed model. Any thread. */
SLUICE_API int sluice_manifest_version(const sluice_model *model);

/* Copies the digest in alg of file i's header bytes (its first 8 + N
 * bytes, as read and parsed at open: what a version 2 manifest's "header"
 * holds) into digest. Returns SLUICE_OK, SLUICE_E_UNSUPPORTED (alg not
 * built in) or SLUICE_E_INVAL. Any thread. */
SLUICE_API int sluice_file_header_digest(const sluice_model *model, size_t file_index,
                                         sluice_algorithm alg, uint8_t digest[32]);

/* Copies the digest the manifest gives tensor i (model order) into digest.
 * Returns SLUICE_OK, SLUICE_E_NOT_FOUND when tensor i is not checked (no
 * manifest, or IF_PRESENT and not listed), or SLUICE_E_INVAL (bad model,
 * i out of range, NULL digest). Any thread. */
SLUICE_API int sluice_manifest_tensor(const sluice_model *model, size_t i,
                                      uint8_t digest[32]);

/* The chunk digests the manifest gives tensor i (version 2 "chunks"):
 * *chunk_bytes and *count (either may be NULL). Returns SLUICE_OK,
 * SLUICE_E_NOT_FOUND when tensor i has none (or is not checked), or
 * SLUICE_E_INVAL. Any thread. */
SLUICE_API int sluice_manifest_chunks(const sluice_model *model, size_t i, uint64_t *chunk_bytes,
                                      uint32_t *count);

/* Copies the whole-file digest the manifest gives file i (see
 * sluice_file_info) into digest, and its size into *size (size may be
 * NULL; SLUICE_SIZE_UNKNOWN when the manifest gives none). Returns
 * SLUICE_OK, SLUICE_E_NOT_FOUND when the manifest lists no such file (or
 * none was read), or SLUICE_E_INVAL. Any thread. */
SLUICE_API int sluice_manifest_file(const sluice_model *model, size_t file_index,
                                    uint8_t digest[32], uint64_t *size);

/* Writes digest as 64 lowercase hex digits and a NUL into hex; returns
 * hex. A NULL digest writes ""; a NULL hex returns NULL. Any thread. */
SLUICE_API char *sluice_digest_hex(const uint8_t digest[32], char hex[65]);

/* ------------------------------------------------------------------------ */
/* Verifying without loading                                                */
/* ------------------------------------------------------------------------ */

/*
 * sluice_verify checks tensors (and, when asked, whole files) against the
 * model's manifest without handing out any byte: no pool, no handle, no
 * private copy. It is what `sluice verify` and `sluice manifest` run.
 *
 * How the bytes are read: each thread reads with pread into one 256 KiB
 * buffer of its own, reused, and hashes it while it is in the CPU cache;
 * nothing is ever mapped, so a file truncated or failing during a verify
 * gives SLUICE_E_FILE_CHANGED or SLUICE_E_IO for its items, never
 * SIGBUS. When the model was opened with SLUICE_F_DIRECT, items are read
 * with O_DIRECT instead (bypassing the page cache): blocks of
 * min(1 MiB, 2 MiB / threads), 4 KiB aligned, 24 in flight per thread on
 * an io_uring ring of the thread's own (or one at a time with pread where
 * io_uring is refused); past 8 threads, blocks of 256 KiB and fewer of
 * them in flight, so that all threads' blocks stay within 48 MiB. Read
 * buffered even then: items (tensors or files) under 64 KiB (a block
 * would read more than they hold), a file that cannot be opened with
 * O_DIRECT, and the rest of an item whose O_DIRECT read the file system
 * refuses (EINVAL). Items are
 * handed to the threads largest first. Memory: 256 KiB a thread, plus
 * the O_DIRECT blocks of the threads that read so (48 MiB at most in
 * all), plus one small record per item; nothing else grows with the
 * model, whose bytes stay in the page cache only.
 *
 * A remote model's items (http(s)://, s3://, hf://) are read by the same
 * threads with range requests of their own, never through the pool, the
 * persistent cache or the mirrors: pieces of min(16 MiB, 32 MiB /
 * threads), each one request bounded as a load's are (remote_attempts,
 * remote_deadline_ms, the stall timeout), the next piece of an item
 * fetched (on a second thread of the thread's own) while the one before
 * is hashed; each thread makes its two piece buffers and that second
 * thread at its first remote item (64 MiB at most in all; one request
 * in flight a thread). The threads default to, and are at most,
 * remote_connections (the items, when fewer), each with its fetching
 * thread. An item whose bytes
 * came through the proxy and fail verification is read again from the
 * origin directly, once (see "Proxies"). A cancel stops the requests in
 * flight. The requests count in sluice_stats' remote_reads and
 * remote_bytes; bytes_read and bytes_hashed stay the loads'.
 *
 * A tensor item's bytes are its data_offsets range, read through the
 * file opened at sluice_open (reopened through /proc/self/fd, so a file
 * renamed over the path since is not the one read). A file item is the
 * whole file, read to its end now. A tensor the manifest gives chunk
 * digests is checked chunk by chunk, as loading checks it (a failure
 * names the chunk; on success the item's digest is the manifest's whole
 * digest); with SLUICE_VF_DIGEST_ONLY every tensor's whole digest is
 * computed instead.
 */

/* What an item is. */
#define SLUICE_VERIFY_ITEM_TENSOR 0
#define SLUICE_VERIFY_ITEM_FILE 1

/* One checked item, as passed to the callback. */
struct sluice_verify_item {
    size_t size;            /* sizeof(struct sluice_verify_item) */
    int kind;               /* SLUICE_VERIFY_ITEM_TENSOR or _FILE */
    size_t index;           /* tensor index (sluice_info) or file index */
    const char *name;       /* the tensor's name (name_len bytes, then a NUL)
                               or the file's path; borrowed until close */
    size_t name_len;
    int status;             /* SLUICE_OK: the digest matched (or, with
                               SLUICE_VF_DIGEST_ONLY, was computed);
                               SLUICE_E_CHECKSUM (digest, or a file's size,
                               differ), SLUICE_E_FILE_CHANGED (the file ends
                               before the tensor does; a remote object
                               changed after open), SLUICE_E_IO,
                               SLUICE_E_REMOTE (a remote read refused, or
                               failed after its attempts),
                               SLUICE_E_MANIFEST_MISSING (the manifest lists
                               no digest for it), SLUICE_E_NOMEM */
    const char *message;    /* "" on success, else the detail, naming the
                               item, its file and offset, and both digests */
    int has_digest;         /* digest below is valid: every byte was read */
    uint8_t digest[32];     /* the digest computed (sluice_digest_algorithm) */
    uint64_t bytes;         /* bytes hashed (a file: its size as read) */
};

/* Called on the thread that called sluice_verify, once per item, in the
 * order the items finish, with no lock of the library held; item is valid
 * during the call only. Return 0 to go on; non-zero stops the verify
 * (items not yet reported are not), which then returns that value. It may
 * call anything on the model except sluice_close, which would wait for
 * this verify for ever (so may the progress callback). */
typedef int (*sluice_verify_fn)(void *user, const struct sluice_verify_item *item);

/* Flags of sluice_verify_options. */
#define SLUICE_VF_FILES       0x1u  /* also every whole file (the manifest's
                                       "files" digests and sizes) */
#define SLUICE_VF_NO_TENSORS  0x2u  /* no tensor items (with FILES: files only) */
#define SLUICE_VF_DIGEST_ONLY 0x4u  /* compute and report digests; compare with
                                       nothing (no manifest needed) */
#define SLUICE_VF_ALL_ (SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS | SLUICE_VF_DIGEST_ONLY)

/* Options of sluice_verify. Start from sluice_verify_options_init(), which
 * writes the defaults and the struct's size; fields are only appended. */
typedef struct sluice_verify_options {
    size_t size;                     /* set by sluice_verify_options_init */
    uint32_t flags;                  /* SLUICE_VF_*; unknown bits: SLUICE_E_INVAL */
    uint32_t threads;                /* 0: the model's hash_threads, else online CPUs; at most 64 */
    sluice_verify_fn on_item;        /* NULL: none (read the report) */
    void *user;                      /* passed to on_item */
    sluice_stream_progress_fn progress; /* NULL: none; counts items and their bytes
                                        (tensors_* fields count every item) */
    void *progress_user;
    uint32_t progress_interval_ms;   /* default 100; the last call is always made */
    sluice_cancel *cancel;           /* NULL: not cancellable */
} sluice_verify_options;

/* Fills *o with the defaults. Returns SLUICE_E_INVAL if o is NULL. */
SLUICE_API int sluice_verify_options_init(sluice_verify_options *o);

/*
 * Writing a manifest: what `sluice manifest` writes, and the Python
 * package's sluice.write_manifest (one writer). Start from
 * sluice_manifest_options_init(); fields are only appended.
 */
typedef struct sluice_manifest_options {
    size_t size;                /* set by sluice_manifest_options_init */
    int version;                /* 2 (default: tensors' dtype, shape, size;
                                   files' header digests), 1 (SHA-256 of
                                   tensors and files), 0 (flat {name: SHA-256}) */
    uint64_t chunk_bytes;       /* version 2: tensors larger also get a digest
                                   per chunk of this size (default 16 MiB; 0:
                                   none; else at least 4096); ignored before 2 */
    const sluice_part_rules *parts; /* version 2: each tensor they split also
                                   gets its tensor-parallel parts' digests for
                                   each world size below that divides it */
    uint64_t worlds[8];         /* of parts: 2..65536, distinct (default 2, 4, 8) */
    size_t nworlds;
    unsigned threads;           /* hashing threads (0: the model's, else online CPUs) */
    void (*on_bytes)(void *user, uint64_t bytes);       /* progress, may be NULL */
    void (*on_failure)(void *user, const char *message); /* each tensor or file
                                   that could not be read, may be NULL */
    void *user;
} sluice_manifest_options;

/* Fills *o with the defaults. Returns SLUICE_E_INVAL if o is NULL. */
SLUICE_API int sluice_manifest_options_init(sluice_manifest_options *o);

/*
 * Writes the manifest of model, an open model (any verify policy: its
 * bytes are read and hashed as they are now; its digest algorithm,
 * sluice_options.algorithm, is the manifest's; BLAKE3 needs version 2),
 * to path (through a temporary file beside it, fsynced and renamed over
 * it), or, path NULL, to the descriptor fd. o NULL: the defaults. Nothing
 * is written unless every tensor and file was read and none changed while
 * it was hashed. Returns SLUICE_OK, SLUICE_E_INVAL (bad options, no path
 * and fd < 0), SLUICE_E_IO or another read failure's code (the message
 * counts the failures and gives the first), SLUICE_E_FILE_CHANGED,
 * SLUICE_E_NOMEM. Any thread; not with a close.
 */
SLUICE_API int sluice_manifest_write(sluice_model *model, const char *path, int fd,
                                     const sluice_manifest_options *o);

/*
 * Signs the manifest file manifest_path (its exact bytes) with the Ed25519
 * private key in the PEM file key_path (PKCS#8, as `sluice keygen` writes
 * it), writing the signature file sluice_open checks with trusted_keys
 * ("Signed manifests" below) to sig_path, or, sig_path NULL, to
 * manifest_path + ".sig" beside it, through a temporary file fsynced and
 * renamed over it: what `sluice sign MANIFEST --key KEY` writes (one
 * signer). Sign last: any later change to the manifest voids it. why (may
 * be NULL; why_cap bytes) gets "" or what failed. Returns SLUICE_OK;
 * SLUICE_E_INVAL (a NULL path); SLUICE_E_SIGNATURE (the key unreadable,
 * not a private key, not Ed25519; signing failed); SLUICE_E_IO (the
 * manifest unreadable or larger than SLUICE_MAX_MANIFEST_BYTES, the
 * signature not written); SLUICE_E_NOMEM. Any thread.
 */
SLUICE_API int sluice_manifest_sign(const char *manifest_path, const char *key_path,
                                    const char *sig_path, char *why, size_t why_cap);

/* What a verify did. Like struct sluice_stats, the caller sets .size; the
 * library writes only the fields that fit. */
struct sluice_verify_report {
    size_t size;
    size_t tensors_ok, tensors_failed;
    size_t files_ok, files_failed;
    uint64_t bytes_hashed;   /* every item's bytes hashed */
    uint64_t bytes_direct;   /* of which read with O_DIRECT */
    uint32_t threads;        /* threads that hashed */
    uint64_t elapsed_ns;
};

/*
 * Checks the listed tensors (names NULL: every tensor, n ignored; names
 * non-NULL and n = 0: none) and, with SLUICE_VF_FILES, every whole file,
 * against the manifest read at open, on o->threads threads, calling
 * o->on_item for each. o NULL: the defaults. report may be NULL.
 * Returns SLUICE_OK when every item matched; the callback's non-zero
 * value; SLUICE_E_CANCELLED when o->cancel was requested before every
 * item was reported (each thread stops after the buffer it is hashing,
 * or with O_DIRECT once the reads it has in flight, 24 MiB at most, are
 * done; the last progress call, if any, gives the counts reached);
 * otherwise the status of the first failed item reported. Before any
 * item: SLUICE_E_INVAL (bad model, bad options, a NULL name, report
 * with a size smaller than its size field), SLUICE_E_NOT_FOUND (an
 * unknown name), SLUICE_E_MANIFEST (no manifest was read and
 * SLUICE_VF_DIGEST_ONLY is not set), SLUICE_E_NOMEM.
 * Thread safety: any thread; any number of verifies, streams and acquires
 * may run on the model at once (a verify touches neither the pool nor the
 * engine's state); also from a stream callback, since it never waits for
 * the pool. A verify never reads the mirrors (sluice_options.fallback),
 * local or remote: it judges the files the model was opened from (its
 * own; or, when its own location could not be opened and a mirror serves
 * the model, that mirror's: sluice_model_location says which). Whether a
 * mirror holds a failed tensor verified is what acquiring it tells
 * (sluice_tensor_source names the mirror), as `sluice verify --fallback`
 * reports and `sluice repair` uses.
 */
SLUICE_API int sluice_verify(sluice_model *model, const char *const *names, size_t n,
                             const sluice_verify_options *o, struct sluice_verify_report *report);

/* Where a handle's bytes came from: "" when from the model's own files,
 * else the mirror and why ("fallback 1 (LOC), after: primary: <why>"; see
 * sluice_options.fallback), or, read from the model's own files directly
 * because its proxy failed, "primary, direct: the proxy failed (<why>)"
 * (see "Proxies"). Borrowed: valid while the handle is live.
 * NULL for a NULL handle. */
SLUICE_API const char *sluice_tensor_source(const sluice_tensor *t);

/* The location that serves the model's index, as messages show it (no
 * user:password@, "?..." for a query): the model's own (an hf:// one as
 * the commit it was pinned to), or, when that could not be opened, the
 * mirror (sluice_options.fallback) that serves instead. *fallback (may be
 * NULL): 0, or k for fallback k (1-based); *why (may be NULL): NULL, or
 * with a mirror serving, why each location before it could not ("primary
 * (LOC): <why>; fallback 1 (LOC): <why>"). Borrowed until sluice_close.
 * NULL (and 0, NULL) for a NULL or failed model. Any thread. */
SLUICE_API const char *sluice_model_location(const sluice_model *model, unsigned *fallback,
                                             const char **why);

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */
/* ------------------------------------------------------------------------ */

typedef enum sluice_backend {
    SLUICE_BACKEND_NONE = 0,    /* no I/O engine yet */
    SLUICE_BACKEND_IO_URING = 1,
    SLUICE_BACKEND_PREAD = 2
} sluice_backend;

struct sluice_stats {
    size_t size;                /* set by the caller: sizeof(sluice_stats) */
    sluice_backend backend;
    int backend_errno;          /* why io_uring was not used (0 if forced or used) */
    uint64_t bytes_read;        /* bytes the reads brought in (incl. coalescing waste) */
    uint64_t bytes_delivered;   /* tensor bytes handed to callers */
    uint64_t bytes_hashed;
    uint64_t reads;             /* read operations completed */
    uint64_t retries;           /* short reads, EINTR, EAGAIN resubmitted */
    uint64_t tensors_loaded;    /* reads of a tensor completed */
    uint64_t tensors_verified;  /* of which digests matched */
    uint64_t cache_hits;        /* acquires served without I/O */
    uint64_t failures;          /* tensors that failed (I/O, checksum, ...) */
    uint64_t checksum_failures;
    uint64_t direct_fallbacks;  /* files read buffered though O_DIRECT was asked */
    uint64_t pool_bytes;        /* the budget */
    uint64_t pool_in_use;       /* bytes held by buffers now */
    uint64_t pool_high_water;   /* most bytes ever held at once */
    uint64_t evictions;
    uint64_t acquire_wait_ns;   /* total time acquire calls waited */
    uint64_t acquire_count;
    uint64_t chunks_verified;   /* chunk digests matched (version 2 manifests
                                   with "chunks"; see "Manifests") */
    uint32_t hash_parallel_peak; /* the most hashing threads that worked on
                                   one tensor's chunks at once */
    /* remote sources and mirrors */
    uint64_t remote_reads;      /* range requests of tensor bytes completed (any
                                   outcome); the open's: remote_open_requests */
    uint64_t remote_bytes;      /* bytes they brought in */
    uint64_t remote_retries;    /* attempts retried (status, reset, timeout, short
                                   body), of every remote request: the open's,
                                   the mirrors', the tensor reads' */
    uint64_t fallback_tensors;  /* loads delivered from a mirror */
    uint64_t fallback_bytes;    /* their bytes */
    uint64_t fallback_failures; /* mirror attempts that failed too */
    /* persistent cache and verified-once memo (see "Persistent cache") */
    uint64_t disk_hits;         /* tensor loads (and parts) read from the cache's blobs */
    uint64_t disk_hit_bytes;    /* their bytes */
    uint64_t disk_misses;       /* remote tensor loads that found no blob */
    uint64_t disk_stored;       /* blobs written (fetched and verified here) */
    uint64_t disk_rotten;       /* blobs that failed verification: dropped,
                                   fetched again */
    uint64_t disk_evicted;      /* blobs this model's stores evicted */
    uint64_t memo_tensors;      /* loads the memo spared hashing */
    uint64_t memo_bytes;        /* their bytes */
    uint32_t disk_degraded;     /* 1: the cache was turned off for this model
                                   (sluice_cache_warning says why) */
    /* remote requests made to open files, not for tensor bytes: each
       file's first 8 bytes and header, index.json, the manifest, at
       sluice_open; a mirror's, when first needed (their retries are in
       remote_retries) */
    uint64_t remote_open_requests;
    uint64_t remote_open_bytes; /* the bytes they brought in */
    uint64_t disk_busy;         /* writes of the cache's index put off because
                                   another process held its write lock (see
                                   "Persistent cache": never waited out) */
    uint32_t unverified;        /* sluice_verify_state's value: 0 verified
                                   against a manifest (or against the
                                   publisher's digest, state 3), 1 no
                                   manifest found, 2 verification off by
                                   policy */
    /* proxies (see "Proxies") */
    uint64_t proxy_failures;    /* requests through the proxy that failed, and
                                   loads, ranges, parts and verified whole
                                   files whose bytes from it failed
                                   verification: each went direct */
    uint64_t proxy_bypass_bytes; /* bytes then fetched directly from the origin */
    uint64_t part_fallback_bytes; /* bytes of whole tensors read to check a part
                                   that has no digest of its own (no part
                                   digests, and a dim >= 1 part or no chunk
                                   digests; see sluice_read_part_into) */
};

/* Fills *stats (whose size field the caller sets; fields past it are not
 * written; a larger size than this header's struct is fine, the fields it
 * knows are written). Returns SLUICE_OK, or SLUICE_E_INVAL (bad model,
 * NULL stats, size smaller than the size field). Any thread. */
SLUICE_API int sluice_stats(sluice_model *model, struct sluice_stats *stats);

/* ------------------------------------------------------------------------ */
/* Persistent cache                                                         */
/* ------------------------------------------------------------------------ */

/*
 * A cache directory (opts.cache_dir) kept across processes and shared by
 * every process that names it. It holds:
 *  - blobs: the bytes of tensors fetched from a remote source and verified
 *    against the manifest, one file per tensor named by its digest
 *    (blobs/ALGORITHM/XX/HEX); only tensors with a digest are kept;
 *  - index.sqlite: an SQLite database (WAL) of the blobs (algorithm,
 *    digest, size, source, created, last access) and of the verified-once
 *    memo; its schema is versioned and older versions are migrated.
 *
 * A remote model opened with a cache loads each tensor whose blob is there
 * from the blob, through the local read path, and verifies it again as
 * it is read: a blob that fails is deleted, counted (disk_rotten) and the
 * tensor fetched from the source. A tensor fetched from the source and
 * verified is written to a temporary file, fsynced, renamed into place,
 * the directory fsynced, and only then recorded. The headers and the
 * manifest are fetched at every open (the blobs are named by the digests
 * of the manifest read then), so a remote model that changed loads the
 * tensors whose digests changed from the source, and the unchanged ones
 * from the cache. A part with a part digest (sluice_read_part_into,
 * sluice_acquire_part) is kept and read back the same way, as the blob of
 * its part digest. sluice_read_into and sluice_acquire_range do not use
 * the cache. sluice_verify checks the source: on a remote model it reads
 * every item from the source with requests of its own, neither reading
 * nor storing a blob, and the model's loads meanwhile use the cache as
 * ever.
 *
 * Eviction: after a store, the least recently used blobs are deleted until
 * the blobs take at most cache_bytes. A process reading a blob holds its
 * descriptor for the read, so deleting it (another process's eviction,
 * `sluice cache gc`) never cuts a read short; a blob gone before its load
 * starts is a miss, fetched again.
 *
 * Many processes: each finds a blob by its name, so a tensor another
 * process stored since this open is read from the cache; processes that
 * start at the same moment may each fetch the same tensor (at most once
 * per open model); the rename makes a blob appear whole or not at all.
 *
 * Failures: a corrupt or foreign index.sqlite is moved aside (to
 * corrupt/) and rebuilt from the blobs, and a deleted or empty one is
 * made again with the blobs already there; temporary files left by dead
 * processes are deleted at open (a fill is known to be alive by a lock
 * its process holds, which the kernel drops at its death: a process in
 * another PID namespace sharing the directory keeps its fills).
 *
 * Another process holding index.sqlite's write lock (a `sqlite3` shell,
 * a long gc) never stalls a load: a store waits at most 100 ms for it,
 * then leaves its blob in place with its entry to be written by a later
 * store (for a second after, stores do not wait at all); a blob still
 * without its entry at close gets one more try and is deleted if that
 * fails. Each write put off is counted (disk_busy) and the first leaves
 * a note in sluice_cache_warning (the cache stays on). When the cache cannot be used (a
 * read-only or full file system, a newer schema), loading goes on
 * without it: disk_degraded is 1 and sluice_cache_warning() says why,
 * once per model. A cache never fails a load.
 *
 * Verified-once memo (SLUICE_F_TRUST_UNCHANGED): after a tensor of a
 * local file is verified, the cache records the file's identity (st_dev,
 * st_ino, size, mtime and ctime in ns), the tensor's offset and size, and
 * the digest it matched. A later open with the flag that finds the same
 * record for the same digest hands the tensor out without hashing it
 * (memo_tensors). Any write to the file changes its mtime and ctime, and
 * ctime cannot be set back by any user-level call, so a changed file no
 * longer matches; a file whose mtime or ctime is within the last second at
 * open is not recorded (a write in the same clock tick would not change
 * them).
 * File systems: a file on tmpfs (/dev/shm too), ramfs, hugetlbfs,
 * overlayfs, NFS, SMB/CIFS, 9p, FUSE, Ceph, AFS or Coda (statfs f_type)
 * is neither recorded nor trusted: there a write need not move the times
 * this process sees (on tmpfs a byte read through a shared mapping and
 * written back changed leaves both as they were; overlayfs shows the
 * times of the file below, whose dirty pages cannot be written back
 * through it; the others report times kept elsewhere). Its tensors are
 * hashed, and sluice_cache_warning says which file and why (the cache
 * itself works: disk_degraded stays 0).
 * Shared mappings: the kernel moves the times when a store through a
 * shared mapping makes a clean page writable (a fault), not on later
 * stores to that page while it stays dirty and writable. So before it
 * takes a file's identity, an open with the flag writes the file's dirty
 * pages back (sync_file_range, no device flush; nothing to do, no I/O,
 * when none is dirty), which makes every mapping of them read-only
 * again: the next store faults and moves the times. Without that step
 * this sequence handed out changed bytes as verified on ext4: a process
 * maps the file shared and stores a byte (the times move); a second
 * later a load with the flag verifies the file and records it; the
 * process stores another byte of the same page (or large folio) through
 * the same mapping (no fault, no new times); the next load with the flag
 * trusts the record.
 * What it does not cover: the root user changing the clock or writing
 * the device below the file system, a file system that does not update
 * ctime, or one not named above whose mapped stores do not move the
 * times. That is why it is opt-in.
 */

/* The warning of a model whose cache was turned off (read-only or full
 * file system, a newer schema, ...; a full disk always reads "the disk is
 * full"; disk_degraded is 1), else the memo's refusal of a file
 * (SLUICE_F_TRUST_UNCHANGED on a file system where a write need not move
 * its times, see "Verified-once memo"; the first such file and how many
 * more), else, while its cache works, the note that writes of its index
 * were put off because another process held its lock (disk_busy), or
 * NULL when none of these happened or it has no cache. Borrowed: valid
 * until sluice_close. Any thread. */
SLUICE_API const char *sluice_cache_warning(sluice_model *model);

/* A cache directory opened for administration (`sluice cache`): listing,
 * usage, garbage collection, clearing, rehashing. One thread at a time
 * per handle; any number of handles and models may use one directory at
 * once. */
typedef struct sluice_cache sluice_cache;

/* A tensor a cache blob was stored as. */
typedef struct sluice_cache_name {
    const char *model;          /* the model's location as messages show it */
    const char *tensor;         /* its name: tensor_len bytes, NUL-terminated */
    size_t tensor_len;
} sluice_cache_name;

typedef struct sluice_cache_entry {
    sluice_algorithm algorithm;
    char digest[65];            /* lower-case hex */
    uint64_t bytes;
    const char *source;         /* where it was fetched from (credentials and
                                  query left out); borrowed for the callback */
    int64_t created_ns;         /* CLOCK_REALTIME */
    int64_t last_access_ns;
    int present;                /* its blob file exists with that size */
    /* The tensors stored as this blob (the same bytes serve each), by
     * model and name, sorted; none for a blob stored by an older sluice.
     * Borrowed for the callback. */
    const sluice_cache_name *names;
    size_t nnames;
} sluice_cache_entry;

/* Opens dir (NULL: $SLUICE_CACHE_DIR, else the default of
 * SLUICE_F_CACHE_DEFAULT), creating it as a model's open would (and
 * repairing its index the same way). *out is always set unless out is
 * NULL or memory runs out: on failure to a handle that only carries the
 * error (sluice_cache_errmsg), to be closed. */
SLUICE_API int sluice_cache_open(const char *dir, sluice_cache **out);
/* As sluice_cache_open, but creates nothing: where dir (or the default)
 * holds no cache (neither its index nor its blobs), SLUICE_E_NOT_FOUND,
 * the message naming the directory, and nothing is made there. For the
 * calls that only read (list, usage, verify of what is there). */
SLUICE_API int sluice_cache_open_existing(const char *dir, sluice_cache **out);
/* The detail of the handle's last failure ("" when none). Borrowed: valid
 * until the next call on the handle. */
SLUICE_API const char *sluice_cache_errmsg(const sluice_cache *cache);
/* The directory (borrowed, valid until close). */
SLUICE_API const char *sluice_cache_path(const sluice_cache *cache);
/* Calls fn for every entry, least recently used first; fn returning non-0
 * stops the walk (returned as is). */
SLUICE_API int sluice_cache_list(sluice_cache *cache,
                                 int (*fn)(void *user, const sluice_cache_entry *entry),
                                 void *user);
/* The bytes and entries recorded. */
SLUICE_API int sluice_cache_usage(sluice_cache *cache, uint64_t *bytes, uint64_t *entries);
/* Deletes least recently used blobs until at most max_bytes remain, and
 * entries whose blob is gone; blobs no entry names are recorded back.
 * Either count pointer may be NULL. */
SLUICE_API int sluice_cache_gc(sluice_cache *cache, uint64_t max_bytes, uint64_t *freed_bytes,
                               uint64_t *freed_entries);
/* Deletes every blob and entry (and the memo). */
SLUICE_API int sluice_cache_clear(sluice_cache *cache, uint64_t *freed_bytes,
                                  uint64_t *freed_entries);
/* Rehashes every blob and deletes those whose bytes do not match their
 * name (fn, may be NULL, is told of each, with the digest found). Blob
 * files the index does not name (a fill killed between its rename and
 * its entry, an index lost) are rehashed too: a bad one is deleted, a
 * good one recorded, fn told with a why that starts "recorded:". *checked
 * counts both kinds. */
SLUICE_API int sluice_cache_verify(sluice_cache *cache, uint64_t *checked, uint64_t *dropped,
                                   void (*fn)(void *user, const sluice_cache_entry *entry,
                                              const char *why),
                                   void *user);
/* Frees the handle. NULL: no-op. */
SLUICE_API void sluice_cache_close(sluice_cache *cache);

/* ------------------------------------------------------------------------ */
/* Metrics                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * Every open model keeps metrics, always (no option turns them on; the
 * environment variable SLUICE_METRICS=0 at open turns the histograms and
 * the new counters off, for measuring what they cost). They cost relaxed
 * atomic adds where the events happen and no lock of their own; a
 * rendering takes the model's lock as long as sluice_stats does.
 *
 * They are rendered in the Prometheus text format 0.0.4 or OpenMetrics
 * 1.0, each sample labelled model="..." (sluice_options.metrics_label,
 * escaped as the formats require). Base units: seconds and bytes.
 *
 * Counters (_total):
 *   sluice_bytes_read_total, sluice_bytes_delivered_total,
 *   sluice_bytes_hashed_total, sluice_reads_total,
 *   sluice_read_retries_total{cause="short"|"eintr"|"eagain"},
 *   sluice_tensors_loaded_total, sluice_tensors_verified_total,
 *   sluice_acquires_total, sluice_cache_hits_total (acquires served from
 *   the pool without I/O), sluice_cache_misses_total (acquires that
 *   waited for a load), sluice_failures_total (tensors that failed),
 *   sluice_checksum_failures_total,
 *   sluice_direct_fallbacks_total{cause="open"|"read"} (files read
 *   buffered though O_DIRECT was asked: the twin could not be opened, or
 *   a read was refused), sluice_evictions_total, sluice_streams_total,
 *   and the persistent cache's: sluice_disk_cache_hits_total,
 *   sluice_disk_cache_hit_bytes_total, sluice_disk_cache_misses_total,
 *   sluice_disk_cache_stored_total, sluice_disk_cache_rotten_total,
 *   sluice_disk_cache_evicted_total, sluice_disk_cache_busy_total,
 *   sluice_memo_tensors_total,
 *   sluice_memo_bytes_total (the stats of the same names, see struct
 *   sluice_stats); sluice_chunks_verified_total,
 *   sluice_acquire_waited_seconds_total (acquire_wait_ns);
 *   remote sources: sluice_remote_requests_total{kind="tensor"|"open"}
 *   and sluice_remote_bytes_total{kind=...} (tensor: remote_reads and
 *   remote_bytes; open: remote_open_requests and remote_open_bytes),
 *   sluice_remote_retries_total{cause="status"|"timeout"|"connection"|
 *   "short"} (an HTTP 429 or 5xx; a stalled or too slow transfer; a
 *   failed connection; a short body: remote_retries),
 *   sluice_fallback_tensors_total, sluice_fallback_bytes_total,
 *   sluice_fallback_failures_total (mirrors).
 *   Every field of struct sluice_stats has a family; a family split by
 *   cause sums to its stats field (with SLUICE_METRICS=0 the read
 *   retries all show as cause="short", the O_DIRECT fallbacks as
 *   "read": only the totals are counted then).
 *   sluice_verify (no load; none of the counters above moves) counts
 *   apart, each item as it is reported: sluice_verify_runs_total,
 *   sluice_verify_items_total{kind="tensor"|"file",
 *   result="ok"|"checksum"|"error"} (checksum: SLUICE_E_CHECKSUM; error:
 *   any other status), sluice_verify_bytes_hashed_total (the reported
 *   items' bytes).
 * Gauges:
 *   sluice_pool_budget_bytes, sluice_pool_in_use_bytes,
 *   sluice_pool_high_water_bytes, sluice_live_handles,
 *   sluice_streams_running, sluice_backend_info{backend="io_uring"|"pread"|
 *   "none"} 1 (none: no read has chosen a backend yet),
 *   sluice_disk_cache_degraded (1: the cache was turned off),
 *   sluice_hash_parallel_peak, sluice_backend_errno (why io_uring was
 *   not used; 0 when it was, or was forced off), sluice_unverified (0: a
 *   manifest checks the model; 1: none was found; 2: verification is
 *   off: see sluice_verify_state; alert on sluice_unverified != 0).
 * Histograms (fixed buckets, le in seconds or bytes, plus +Inf):
 *   sluice_acquire_wait_seconds        every acquire that succeeded (a
 *       cache hit as 0); 50us 100us 250us 500us 1ms 2.5ms 5ms 10ms 25ms 50ms 100ms
 *       250ms 500ms 1s 2.5s 5s 10s 30s 60s
 *   sluice_read_duration_seconds       one read, queued to completed;
 *       10us 25us 50us 100us 250us 500us 1ms 2.5ms 5ms 10ms 25ms 50ms
 *       100ms 250ms 500ms 1s 2.5s 5s 10s
 *   sluice_tensor_hash_seconds         hashing time of one tensor's
 *       SHA-256 (the hasher's time on it, summed over its slices);
 *       the buckets of sluice_read_duration_seconds and 30s 60s
 *   sluice_open_to_first_tensor_seconds  sluice_open's start to the first
 *       handle (one observation per model); 1ms 2.5ms 5ms 10ms 25ms 50ms
 *       100ms 250ms 500ms 1s 2.5s 5s 10s 30s 60s 120s 300s
 *   sluice_stream_duration_seconds     one sluice_stream(_ex) call;
 *       1ms 5ms 10ms 50ms 100ms 250ms 500ms 1s 2.5s 5s 10s 30s 60s 120s
 *       300s 600s 1800s 3600s
 *   sluice_tensor_size_bytes           each tensor load completed; 1 KiB
 *       and every power of 4 up to 16 GiB (4^5 .. 4^17)
 */

typedef enum sluice_metrics_format {
    SLUICE_METRICS_PROMETHEUS = 0,  /* text format 0.0.4
                                       (Content-Type: text/plain; version=0.0.4) */
    SLUICE_METRICS_OPENMETRICS = 1  /* OpenMetrics 1.0 text, ending "# EOF"
                                       (application/openmetrics-text; version=1.0.0) */
} sluice_metrics_format;

/*
 * The format a scrape asked for: SLUICE_METRICS_OPENMETRICS when accept
 * (an HTTP request's Accept header; NULL when it had none) names
 * application/openmetrics-text, in any case, else SLUICE_METRICS_PROMETHEUS.
 * The one rule of content negotiation for the library's endpoint
 * (sluice_metrics_serve) and any other that serves these families, such
 * as `sluice serve`'s. Pure; any thread.
 */
SLUICE_API sluice_metrics_format sluice_metrics_format_for_accept(const char *accept);

/*
 * Renders the metrics of model into buf: the text and a NUL. *needed
 * (needed may be NULL) gets the bytes the whole text takes, NUL included,
 * whether or not it fitted. buf may be NULL when cap is 0 (a size query).
 * The counters move between two calls and the size with them: allocate
 * some room to spare, or call again on SLUICE_E_BUFFER.
 * Returns SLUICE_OK, SLUICE_E_BUFFER (cap < *needed: buf holds an empty
 * string when cap > 0), or SLUICE_E_INVAL (bad model, buf NULL with cap >
 * 0, unknown format). Any thread.
 */
SLUICE_API int sluice_metrics_write(sluice_model *model, char *buf, size_t cap, size_t *needed,
                                    sluice_metrics_format format);

/*
 * The same for n models (n >= 1) in one exposition: each family's HELP
 * and TYPE once, then the samples of every model, so that the result is
 * one valid exposition (concatenating sluice_metrics_write outputs is
 * not: each repeats the HELP and TYPE lines). Every model must be open
 * and their labels distinct, else SLUICE_E_INVAL, the message recorded on
 * the offending model (models[0] when models itself is bad). Any thread.
 */
SLUICE_API int sluice_metrics_write_models(sluice_model *const *models, size_t n, char *buf,
                                           size_t cap, size_t *needed,
                                           sluice_metrics_format format);

/*
 * An HTTP endpoint serving the metrics of the models added to it, for a
 * Prometheus server or an OpenTelemetry Collector's Prometheus receiver to
 * scrape (libmicrohttpd; see README "Metrics"). Built when libmicrohttpd
 * is found (CMake option SLUICE_WITH_MICROHTTPD, on by default); without
 * it, sluice_metrics_serve returns SLUICE_E_UNSUPPORTED.
 *
 * It answers GET (and HEAD) /metrics with 200 and the models' exposition:
 * OpenMetrics when the request's Accept header asks for
 * application/openmetrics-text (in any case), else the text format 0.0.4.
 * Any other method, on any path, is 405 (Allow: GET, HEAD), answered at
 * once with the body unread; any other path 404. Connections are kept
 * alive between requests. Bounds: 32 connections at once (more wait in
 * the listen queue until one ends); 8 from one client address (more are
 * closed as soon as accepted); 16 KiB of request per connection (a
 * longer request line or header gets an error status and the connection
 * is closed); 5 s of idleness; and 5 s for a whole request, from the
 * connection's accept (or its previous answer) to its answer sent: a
 * client that trickles its request a byte at a time is cut then, however
 * often it sends (checked every 0.2 s). So slow clients from other
 * addresses cannot keep a scraper out, and those from the scraper's own
 * address (the same host: every 127.0.0.1 client) at most 5.2 s at a
 * time, if they do not come back; the endpoint is meant for 127.0.0.1 or
 * a trusted network. It runs on one thread of its own (and one that
 * enforces the deadline), which takes a model's lock only as long as
 * sluice_stats does: a scrape never waits for a load, and a load never
 * waits for a client.
 *
 * sluice_metrics_serve: listens on addr (an IPv4 or IPv6 literal; NULL
 * means "127.0.0.1") and port (0: any free port, see
 * sluice_metrics_server_port). *out gets the server, to be freed with
 * sluice_metrics_server_free. Returns SLUICE_OK, SLUICE_E_INVAL (out
 * NULL, addr not a literal address), SLUICE_E_IO (cannot listen: the port
 * taken, ...), SLUICE_E_NOMEM, or SLUICE_E_UNSUPPORTED. The server has no
 * model: there is no sluice_errmsg detail.
 *
 * sluice_metrics_server_add: serves model's metrics too (at most 64
 * models; a model added twice is served once). Returns SLUICE_OK,
 * SLUICE_E_INVAL (a NULL or failed model, 64 already, or a label one of
 * the server's models already has).
 * sluice_metrics_server_remove: stops serving model, waiting for a
 * scrape that is rendering it. Remove a model before closing it: the
 * server does not learn of sluice_close. Returns SLUICE_OK, or
 * SLUICE_E_NOT_FOUND when the server does not serve it.
 * sluice_metrics_server_port: the port listened on (0 for NULL).
 * sluice_metrics_server_free: stops listening, closes every connection
 * (waiting for a scrape in progress) and frees the server. NULL is a
 * no-op. The models are not touched.
 * Thread safety: all of these may be called from any thread, at the same
 * time as scrapes; free must not race with the other calls on the same
 * server.
 */
typedef struct sluice_metrics_server sluice_metrics_server;
SLUICE_API int sluice_metrics_serve(const char *addr, unsigned port, sluice_metrics_server **out);
SLUICE_API int sluice_metrics_server_add(sluice_metrics_server *s, sluice_model *model);
SLUICE_API int sluice_metrics_server_remove(sluice_metrics_server *s, sluice_model *model);
SLUICE_API unsigned sluice_metrics_server_port(const sluice_metrics_server *s);
SLUICE_API void sluice_metrics_server_free(sluice_metrics_server *s);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_H */
