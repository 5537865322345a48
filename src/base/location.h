/* location.h: a location (a model's, a mirror's, a manifest's, the
 * proxy's) parsed once, at sluice_open, into its parts (location.c).
 *
 * The string a caller gave ("/models/m.safetensors",
 * "https://user:pw@host:8443/m.safetensors?X-Amz-Signature=...",
 * "s3://bucket/key", "hf://org/name@rev/file") is split once; what is
 * kept holds it as given (requests are made from it: its credentials and
 * query are the server's) and the form every message, metric label and
 * source string shows: without user:password@ and with "?..." for its
 * query or fragment (a presigned URL's signature). No code after open
 * splits a location string again: it reads these fields.
 */
#ifndef SLUICE_LOCATION_H
#define SLUICE_LOCATION_H

#include <stddef.h>

/* What a location names, by its scheme. */
typedef enum sl_loc_kind {
    SL_LOC_LOCAL = 0, /* a path of this host */
    SL_LOC_HTTP,      /* http:// or https:// */
    SL_LOC_S3,        /* s3://BUCKET/KEY */
    SL_LOC_HUB,       /* hf://ORG/NAME[@REVISION][/FILE] */
} sl_loc_kind;

typedef struct sl_location {
    sl_loc_kind kind;
    const char *given;  /* as given, credentials and query included */
    const char *scheme; /* "http", "https", "s3", "hf"; "" for a local path */
    const char *host;   /* without user:password@, port and [brackets]; "" when none */
    unsigned port;      /* 0: none given, or nothing after its ':' (the scheme's
                           default), or bad_port */
    const char *path;   /* a URL's from the '/' after its host up to its query or
                           fragment ("" when none); a local path whole */
    const char *query;  /* after '?' (up to a fragment), or NULL when none */
    const char *shown;  /* as messages show it: no credentials, "?..." for a
                           query or fragment; a local path as given */
    size_t name_len;    /* how much of given names the object: up to its query
                           or fragment (a local path: all of it, '?' included) */
    const char *userinfo; /* a URL's user information (user:password, up to the last
                             '@' of its authority), or NULL when none */
    const char *bad_port; /* an http(s):// URL's port that no request could use
                             (not digits, over 65535, 0): what is wrong with it,
                             for sl_location_check; NULL when none or fine */
} sl_location;

/* Parses loc into one allocation (the struct and its strings): NULL when
 * out of memory or loc is NULL. Never fails on its form: a malformed URL
 * is split as far as it goes; a port no request could use is noted
 * (bad_port) for sl_location_check, and anything else wrong is said by
 * the request that uses it. Free with sl_location_free (NULL ignored). */
sl_location *sl_location_new(const char *loc);
void sl_location_free(sl_location *l);

/* What sluice_open asks of each location it parsed (the model's, each
 * mirror's, the manifest's, the signature's, $HF_ENDPOINT): SLUICE_OK, or
 * SLUICE_E_INVAL with err naming it in its shown form (after what, when
 * not NULL: "fallback[0]") and saying what is wrong with its port. l NULL
 * is SLUICE_OK. */
struct sl_err;
int sl_location_check(const sl_location *l, const char *what, struct sl_err *err);

/* What sluice_open does with a location it is given: parses loc (NULL:
 * none, *out NULL) into *out and checks it (sl_location_check, what
 * naming it). SLUICE_OK, SLUICE_E_NOMEM, or SLUICE_E_INVAL with *out
 * set (the caller frees it either way). */
int sl_location_take(const char *loc, const char *what, sl_location **out, struct sl_err *err);

/* The same rule for a proxy URL, which is kept as given (libcurl reads
 * it) and never parsed into an sl_location: one without "://" is
 * host[:port] (libcurl's http:// proxy), any scheme's port is checked;
 * the message names it shown (no user:password@, no query). */
int sl_location_check_proxy(const char *url, const char *what, struct sl_err *err);

/* Replaces every given in msg by shown (a location's form as given and as
 * messages show it), in place, so that the message only shrinks: nothing
 * when they are the same, or when shown is the longer (a query of under
 * four characters, shown "?...", and no credentials). */
void sl_location_scrub_text(char *msg, const char *given, const char *shown);

/* The same for a parsed location (NULL: nothing): a message that quotes
 * l as given names it as shown, without parsing it again. */
void sl_location_scrub(char *msg, const sl_location *l);

/* Whether l is reached over the network (any kind but SL_LOC_LOCAL). */
int sl_location_remote(const sl_location *l);

/* The shown form and the host of a URL that is no location given at
 * open (a URL made from one: a Hub file's resolve URL, an S3 object's
 * endpoint URL, a manifest sidecar's), by the same rules as
 * sl_location_new, without allocating: in buf (cap bytes), returned. */
const char *sl_location_shown_of(const char *loc, char *buf, size_t cap);
const char *sl_location_host_of(const char *url, char *buf, size_t cap);
size_t sl_location_name_len_of(const char *loc);

#endif
