/* location.c: a location split once into its parts (location.h). The one
 * parser of a location string: the remote source, the proxy's rules and
 * the messages read what it split. */
#include "base/location.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The parts of loc, as offsets into it. */
typedef struct loc_parts {
    sl_loc_kind kind;
    size_t scheme_len;            /* without "://" */
    size_t auth, auth_end;        /* the authority: [user:password@]host[:port] */
    size_t host, host_len;        /* in the authority, without [brackets] */
    size_t hostport, hostport_len; /* the authority without user:password@ */
    unsigned port;
    const char *bad_port;         /* what is wrong with the port given, or NULL */
    int hide;                     /* bad_port with an '@' after the authority: its
                                     "host:port" may be a user:password, nothing shown */
    int is_url;                   /* split as a URL (not a local path whole) */
    size_t path, path_len;
    size_t query, query_len;      /* query_len 0 and no '?': none */
    int has_query, has_rest;      /* a '?'; a '?' or '#' */
    size_t name_len;
} loc_parts;

static sl_loc_kind kind_of(const char *p)
{
    return !strncmp(p, "http://", 7) || !strncmp(p, "https://", 8) ? SL_LOC_HTTP
           : !strncmp(p, "s3://", 5)                                ? SL_LOC_S3
           : !strncmp(p, "hf://", 5)                                ? SL_LOC_HUB
                                                                    : SL_LOC_LOCAL;
}

/* The one rule of a port: the text after the host's ':' (n bytes, n 0
 * for a ':' with nothing after it) into *port; NULL when it is one, else
 * what is wrong with it. Empty is the scheme's default, as RFC 3986
 * section 3.2.3 (port = *DIGIT), the WHATWG URL standard and libcurl read
 * "http://host:/" (port 0 left: none given); otherwise decimal digits
 * only (no sign, no blank; leading zeros are digits), 1 to 65535: 0 is
 * no port a server listens on (libcurl would try to connect to it). */
static const char *port_rule(const char *s, size_t n, unsigned *port)
{
    unsigned long v = 0;
    *port = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return "is not a number";
        if ((v = v * 10 + (unsigned long)(s[i] - '0')) > 65535)
            v = 65536;  /* stays over, never wraps */
    }
    if (n && v > 65535)
        return "is over 65535";
    if (n && v == 0)
        return "is 0, which no server listens on";
    *port = (unsigned)v;
    return NULL;
}

/* Splits loc (a local path: all of it is its path and its name). as_url
 * 1: a string with "://" is a URL whatever its scheme (the host of any
 * URL); 2: any string is, one without "://" starting at its authority
 * (a proxy, which libcurl reads as http:// when it names no scheme). The
 * port rule is a URL's with a host: http(s)://, or as_url. */
static void split(const char *loc, int as_url, loc_parts *o)
{
    memset(o, 0, sizeof *o);
    size_t n = strlen(loc);
    o->kind = kind_of(loc);
    const char *sep = strstr(loc, "://");
    if (o->kind == SL_LOC_LOCAL && !(as_url == 2 || (as_url && sep))) {
        o->path_len = o->name_len = n;
        return;
    }
    o->is_url = 1;
    o->scheme_len = sep ? (size_t)(sep - loc) : 0;
    o->auth = sep ? o->scheme_len + 3 : 0;
    o->auth_end = o->auth + strcspn(loc + o->auth, "/?#");
    const char *a = loc + o->auth;
    size_t alen = o->auth_end - o->auth;
    /* the last '@' ends the user information (a raw '@' in a password,
     * as set_proxy splits a proxy URL): nothing of it shown or taken for
     * the host */
    const char *at = NULL;
    for (size_t i = 0; i < alen; i++)
        if (a[i] == '@')
            at = a + i;
    o->hostport = at ? (size_t)(at + 1 - loc) : o->auth;
    o->hostport_len = o->auth_end - o->hostport;
    const char *h = loc + o->hostport;
    size_t hl = o->hostport_len;
    const char *colon;
    if (hl && *h == '[') {
        const char *rb = memchr(h, ']', hl);
        o->host = o->hostport + 1;
        o->host_len = rb ? (size_t)(rb - h - 1) : hl - 1;
        colon = rb && rb + 1 < h + hl && rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(h, ':', hl);
        o->host = o->hostport;
        o->host_len = colon ? (size_t)(colon - h) : hl;
    }
    if (colon) {
        const char *bad = port_rule(colon + 1, (size_t)(h + hl - colon - 1), &o->port);
        if (bad && (o->kind == SL_LOC_HTTP || as_url)) {
            o->bad_port = bad;
            /* an '@' further on: a password with an unescaped '/', '?' or
             * '#' ended the authority early, and "host:port" is
             * user:password: none of it may be shown (shown) */
            if (memchr(loc + o->auth_end, '@', n - o->auth_end)) {
                o->hide = 1;
                o->bad_port = "cannot be told from a user:password (an '@' follows it: a "
                              "password holding '/', '?' or '#' must write them %2F, %3F, "
                              "%23); the location is not shown";
            }
        }
    }
    o->path = o->auth_end;
    o->path_len = strcspn(loc + o->path, "?#");
    size_t rest = o->path + o->path_len;
    o->has_rest = loc[rest] != '\0';
    o->name_len = rest;
    if (loc[rest] == '?') {
        o->has_query = 1;
        o->query = rest + 1;
        o->query_len = strcspn(loc + o->query, "#");
    }
}

/* The shown form of loc split as p, in buf. */
static const char *shown(const char *loc, const loc_parts *p, char *buf, size_t cap)
{
    if (!p->is_url)
        return loc;
    if (p->hide) {  /* the scheme alone: the rest may hold a password */
        snprintf(buf, cap, "%.*s%s...", (int)p->scheme_len, loc, p->scheme_len ? "://" : "");
        return buf;
    }
    snprintf(buf, cap, "%.*s%s%.*s%.*s%s", (int)p->scheme_len, loc, p->auth ? "://" : "",
             (int)p->hostport_len, loc + p->hostport, (int)p->path_len, loc + p->path,
             p->has_rest ? "?..." : "");
    return buf;
}

const char *sl_location_shown_of(const char *loc, char *buf, size_t cap)
{
    loc_parts p;
    split(loc, 0, &p);
    return shown(loc, &p, buf, cap);
}

const char *sl_location_host_of(const char *url, char *buf, size_t cap)
{
    loc_parts p;
    split(url, 1, &p);
    snprintf(buf, cap, "%.*s", (int)p.host_len, url + p.host);
    return buf;
}

size_t sl_location_name_len_of(const char *loc)
{
    loc_parts p;
    split(loc, 0, &p);
    return p.name_len;
}

sl_location *sl_location_new(const char *loc)
{
    if (!loc)
        return NULL;
    loc_parts p;
    split(loc, 0, &p);
    size_t n = strlen(loc);
    /* given, scheme, userinfo, host, path, query, shown: each NUL-ended;
     * shown is at most as long as given plus "://?..." */
    size_t cap = sizeof(sl_location) + 7 * (n + 1) + 8;
    sl_location *l = calloc(1, cap);
    if (!l)
        return NULL;
    char *s = (char *)(l + 1), *end = (char *)l + cap;
#define PUT(field, src, len)                                                                       \
    do {                                                                                           \
        l->field = s;                                                                              \
        memcpy(s, (src), (len));                                                                   \
        s[(len)] = '\0';                                                                           \
        s += (len) + 1;                                                                            \
    } while (0)
    PUT(given, loc, n);
    PUT(scheme, loc, p.scheme_len);
    if (p.hostport != p.auth)   /* user:password@ before the host */
        PUT(userinfo, loc + p.auth, p.hostport - 1 - p.auth);
    PUT(host, loc + p.host, p.host_len);
    PUT(path, loc + p.path, p.path_len);
    if (p.has_query)
        PUT(query, loc + p.query, p.query_len);
#undef PUT
    const char *sh = shown(l->given, &p, s, (size_t)(end - s));
    l->shown = sh == l->given ? l->given : s;
    l->kind = p.kind;
    l->port = p.port;
    l->bad_port = p.bad_port;
    l->name_len = p.name_len;
    return l;
}

/* The refusal of a location shown as shown whose port is bad. */
static int refuse_port(const char *what, const char *shown, const char *bad, sl_err *err)
{
    return sl_fail(err, SLUICE_E_INVAL, "%s%s%s: its port %s (a port is 1 to 65535, or "
                   "nothing after the ':' for the scheme's default)", what ? what : "",
                   what ? " " : "", shown, bad);
}

int sl_location_check(const sl_location *l, const char *what, sl_err *err)
{
    return l && l->bad_port ? refuse_port(what, l->shown, l->bad_port, err) : SLUICE_OK;
}

int sl_location_take(const char *loc, const char *what, sl_location **out, sl_err *err)
{
    *out = NULL;
    if (!loc)
        return SLUICE_OK;
    if (!(*out = sl_location_new(loc)))
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    return sl_location_check(*out, what, err);
}

int sl_location_check_proxy(const char *url, const char *what, sl_err *err)
{
    loc_parts p;
    split(url, 2, &p);
    if (!p.bad_port)
        return SLUICE_OK;
    char buf[SL_ERRMSG_MAX / 2];
    return refuse_port(what, shown(url, &p, buf, sizeof buf), p.bad_port, err);
}

void sl_location_free(sl_location *l)
{
    free(l);
}

int sl_location_remote(const sl_location *l)
{
    return l && l->kind != SL_LOC_LOCAL;
}

void sl_location_scrub_text(char *msg, const char *given, const char *shown)
{
    size_t n = strlen(given), k = strlen(shown);
    if (k > n || n == 0 || strcmp(given, shown) == 0)
        return;
    for (char *p = strstr(msg, given); p; p = strstr(p + k, given)) {
        memmove(p + k, p + n, strlen(p + n) + 1);
        memcpy(p, shown, k);
    }
}

void sl_location_scrub(char *msg, const sl_location *l)
{
    if (l)
        sl_location_scrub_text(msg, l->given, l->shown);
}
