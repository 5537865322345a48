/* remote.c: see remote.h.
 *
 * One attempt is one HTTP GET made by an easy handle. Its header callback
 * learns the status, Content-Range and Retry-After of the final reply
 * (a redirect's headers are forgotten when the next status line comes);
 * its write callback checks that reply before the first byte is stored
 * (a range request must get 206 and a Content-Range that starts where
 * asked, inside what was asked, and names the object size known from
 * open) and stops the transfer at once when it is wrong, so that a 200
 * with a whole multi-GB object is not downloaded to be thrown away and no
 * byte is ever stored at the wrong place. The outcome of an attempt is
 * OK, RETRY (transient) or FAIL, decided in one place (outcome()) for the
 * blocking fetches and the seam alike.
 *
 * The seam's thread owns the multi handle and every easy handle; other
 * threads only queue requests under the seam's lock and wake the thread
 * with curl_multi_wakeup. At most `connections` transfers run at once;
 * the rest wait in the thread's FIFO, so that a request's clocks only
 * run while it is on the wire: its deadline is set when a connection
 * first takes it (start()), not when it is queued. Retries wait in a list
 * by due time: no thread sleeps for one.
 */
#include "sources/remote.h"
#include "base/cancel.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int sl_is_remote(const char *p)
{
    return p && (!strncmp(p, "http://", 7) || !strncmp(p, "https://", 8) || !strncmp(p, "s3://", 5) ||
                 !strncmp(p, "hf://", 5));
}

static char *dup_or_null(const char *s)
{
    return s && *s ? strdup(s) : NULL;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int take_proxy(sl_remote_cfg *c, const sluice_options *o, sl_err *err);
static sl_easy_pool *easy_pool_new(unsigned cap);
static void easy_pool_free(sl_easy_pool *p);

/* A proxy hop for the proxy url (NULL when out of memory), and its end
 * (the URL, which may hold a password, wiped). */
static sl_proxy_hop *hop_new(const char *url)
{
    sl_proxy_hop *hop = calloc(1, sizeof *hop);
    if (hop && !(hop->url = strdup(url))) {
        free(hop);
        hop = NULL;
    }
    return hop;
}

static void hop_free(sl_proxy_hop *hop)
{
    if (!hop)
        return;
    memset(hop->url, 0, strlen(hop->url));
    free(hop->url);
    free(hop);
}

void sl_remote_cfg_free(sl_remote_cfg *c)
{
    if (!c)
        return;
    if (c->token)
        memset(c->token, 0, strlen(c->token));
    free(c->token);
    free(c->s3_endpoint);
    free(c->s3_region);
    /* secrets: wiped before the memory goes back */
    if (c->aws_secret)
        memset(c->aws_secret, 0, strlen(c->aws_secret));
    free(c->ca_file);
    free(c->aws_key);
    free(c->aws_secret);
    free(c->aws_session);
    sl_hf_cfg_clear(c);
    /* a proxy URL may hold user:password@ */
    if (c->proxy_https != c->proxy_http)
        hop_free(c->proxy_https);
    hop_free(c->proxy_http);
    free(c->no_proxy);
    free(c->tally);
    easy_pool_free(c->easy);
    free(c);
}

int sl_remote_cfg_new(const sluice_options *o, sl_remote_cfg **out, sl_err *err)
{
    *out = NULL;
    sl_remote_cfg *c = calloc(1, sizeof *c);
    if (!c)
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
    if (!(c->tally = calloc(1, sizeof *c->tally))) {
        free(c);
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
    }
    c->connections = o->remote_connections;
    /* no pool is no failure: each fetch then opens its own connection */
    c->easy = easy_pool_new(c->connections ? c->connections : 1);
    c->attempts = o->remote_attempts;
    c->connect_timeout_ms = o->remote_connect_timeout_ms;
    c->stall_timeout_ms = o->remote_stall_timeout_ms;
    c->deadline_ms = o->remote_deadline_ms;
    c->backoff_ms = o->remote_backoff_ms;
    const char *tok = o->http_token ? o->http_token : env("SLUICE_HTTP_TOKEN");
    const char *region = o->s3_region ? o->s3_region
                         : env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
    const char *ep = o->s3_endpoint ? o->s3_endpoint : env("AWS_ENDPOINT_URL");
    int nomem = 0;
    if (tok && *tok)
        nomem |= !(c->token = strdup(tok));
    nomem |= !(c->s3_region = strdup(region ? region : "us-east-1"));
    if (ep) {
        nomem |= !(c->s3_endpoint = strdup(ep));
    } else if (c->s3_region) {
        size_t n = strlen(c->s3_region) + 40;
        if ((c->s3_endpoint = malloc(n)))
            snprintf(c->s3_endpoint, n, "https://s3.%s.amazonaws.com", c->s3_region);
        nomem |= !c->s3_endpoint;
    }
    if (c->s3_endpoint) {
        size_t n = strlen(c->s3_endpoint);
        while (n > 0 && c->s3_endpoint[n - 1] == '/')
            c->s3_endpoint[--n] = '\0';
    }
    c->s3_virtual = o->s3_addressing == SLUICE_S3_VIRTUAL_HOST;
    if (o->remote_ca_file)
        nomem |= !(c->ca_file = strdup(o->remote_ca_file));
    if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
        nomem |= !(c->aws_key = dup_or_null(env("AWS_ACCESS_KEY_ID")));
        nomem |= !(c->aws_secret = dup_or_null(env("AWS_SECRET_ACCESS_KEY")));
        if (env("AWS_SESSION_TOKEN"))
            nomem |= !(c->aws_session = dup_or_null(env("AWS_SESSION_TOKEN")));
    }
    nomem |= sl_hf_cfg_fill(c, o) < 0;
    int rc = nomem ? sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory")
                   : take_proxy(c, o, err);
    if (rc < 0) {
        sl_remote_cfg_free(c);
        return rc;
    }
    /* the Dragonfly hop is checked once the tokens are the locations'
     * (sl_hf_cfg_tokens) */
    *out = c;
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- proxies */

/* The first of two environment variables that is set, and its name. */
static const char *env2(const char *a, const char *b, const char **name)
{
    const char *v = env(a) ? env(a) : b ? env(b) : NULL;
    if (name)
        *name = env(a) ? a : b;
    return v;
}

/* Resolves the proxy (sluice.h "Proxies"): opts.http_proxy wins ("" is
 * none); else the environment, read as libcurl reads it (http_proxy in
 * lower case only: a CGI's HTTP_PROXY is a request header). Every request
 * then sets CURLOPT_PROXY itself, so that libcurl never reads the
 * environment on its own and this decision is the one it follows. A
 * proxy's port is checked by the locations' rule (location.h): one no
 * request could use is SLUICE_E_INVAL, named as given to it. */
/* Whether the list no_proxy (may be NULL) is "*", blanks aside: every
 * host reached directly, as libcurl reads it (no_proxy_match). */
static int no_proxy_all(const char *np)
{
    if (!np)
        return 0;
    np += strspn(np, " \t");
    return *np == '*' && np[1 + strspn(np + 1, " \t")] == '\0';
}

static int take_proxy(sl_remote_cfg *c, const sluice_options *o, sl_err *err)
{
    int nomem = 0;
    c->proxy_kind = o->proxy_kind;
    if (o->http_proxy) {
        if (*o->http_proxy) {
            SL_TRY(sl_location_check_proxy(o->http_proxy, "proxy (http_proxy option)", err));
            nomem |= !(c->proxy_http = c->proxy_https = hop_new(o->http_proxy));
        }
    } else {
        const char *all_name, *hs_name, *all = env2("all_proxy", "ALL_PROXY", &all_name);
        const char *h = env("http_proxy") ? env("http_proxy") : all;
        const char *hs = env2("https_proxy", "HTTPS_PROXY", &hs_name);
        const char *h_name = env("http_proxy") ? "http_proxy" : all_name;
        if (!hs) {
            hs = all;
            hs_name = all_name;
        }
        /* checked unless no_proxy is "*": then no request takes one, a
         * redirect's neither */
        char what[32];
        int unused = no_proxy_all(env2("no_proxy", "NO_PROXY", NULL));
        snprintf(what, sizeof what, "proxy ($%s)", h_name);
        SL_TRY(h && !unused ? sl_location_check_proxy(h, what, err) : SLUICE_OK);
        snprintf(what, sizeof what, "proxy ($%s)", hs_name);
        SL_TRY(hs && !unused ? sl_location_check_proxy(hs, what, err) : SLUICE_OK);
        if (h)
            nomem |= !(c->proxy_http = hop_new(h));
        if (hs && h && c->proxy_http && !strcmp(h, hs))
            c->proxy_https = c->proxy_http;     /* one proxy: one hop, one health */
        else if (hs)
            nomem |= !(c->proxy_https = hop_new(hs));
    }
    const char *np = env2("no_proxy", "NO_PROXY", NULL);
    if (np && (c->proxy_http || c->proxy_https))
        nomem |= !(c->no_proxy = strdup(np));
    return nomem ? sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory") : SLUICE_OK;
}

/* Whether host (no brackets) is this host's loopback: localhost,
 * 127.0.0.0/8 or ::1. */
static int is_loopback(const char *host)
{
    unsigned char a[16];
    if (!strcasecmp(host, "localhost"))
        return 1;
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    return inet_pton(AF_INET6, host, a) == 1 && !memcmp(a, in6addr_loopback.s6_addr, 16);
}

/* Dragonfly mode asks the daemon for an https:// (or s3://) object as
 * http://, so the request crosses the hop to the daemon in clear, with
 * the credentials it carries: a Bearer token (http_token,
 * $SLUICE_HTTP_TOKEN, $HF_TOKEN) or the AWS signature and session token.
 * Sending them in clear off the host is refused at open, not done quietly:
 * with credentials the daemon must be on this host's loopback (the node's
 * own daemon, as Dragonfly runs it). Without credentials (public objects,
 * presigned URLs) any daemon address is taken. */
int sl_remote_dragonfly_hop(const sl_remote_cfg *c, int hub, sl_err *err)
{
    if (c->proxy_kind != SLUICE_PROXY_DRAGONFLY || !c->proxy_https)
        return SLUICE_OK;
    if (!c->token && !c->aws_key && !(hub && c->hf_token))
        return SLUICE_OK;
    char host[256];
    sl_location_host_of(c->proxy_https->url, host, sizeof host);
    if (is_loopback(host))
        return SLUICE_OK;
    return sl_fail(err, SLUICE_E_INVAL,
                   "remote: Dragonfly mode sends https:// and s3:// requests to its daemon "
                   "in clear, and these would carry credentials (%s); the daemon %s is not "
                   "on this host's loopback: run it on the node (127.0.0.1), use plain "
                   "proxy mode (a CONNECT tunnel), or load without credentials (public "
                   "objects, presigned URLs)",
                   c->aws_key ? "AWS keys" : "a Bearer token", host);
}

/* Whether the address a (len bytes) is in the network of entry e (n
 * bytes: an address, "/BITS" after it or not, an IPv6 one in brackets or
 * not), of the same family. */
static int no_proxy_net(const unsigned char *a, size_t len, int af, const char *e, size_t n)
{
    char ip[64];
    if (n >= sizeof ip)
        return 0;
    memcpy(ip, e, n);
    ip[n] = '\0';
    unsigned bits = (unsigned)len * 8;
    char *slash = strchr(ip, '/');
    if (slash) {
        char *end;
        unsigned long b = strtoul(slash + 1, &end, 10);
        if (end == slash + 1 || *end || b > len * 8)
            return 0;
        bits = (unsigned)b;
        *slash = '\0';
    }
    char *p = ip;
    size_t pl = strlen(p);
    if (af == AF_INET6 && pl >= 2 && p[0] == '[' && p[pl - 1] == ']') {
        p[pl - 1] = '\0';
        p++;
    }
    unsigned char net[16];
    if (inet_pton(af, p, net) != 1)
        return 0;
    size_t whole = bits / 8;
    if (memcmp(a, net, whole) != 0)
        return 0;
    unsigned rest = bits % 8;
    unsigned char mask = (unsigned char)(0xFFu << (8 - rest));
    return !rest || ((a[whole] ^ net[whole]) & mask) == 0;
}

/* Whether no_proxy names host, as libcurl's noproxy.c reads it: "*" (the
 * whole list), an address or an address range (CIDR) for a host that is
 * an IP address (never a suffix of its text: "0.0.1" is not 10.0.0.1);
 * for a name, the name itself or a domain of it, compared without case,
 * a leading dot of an entry and a trailing dot of either ignored
 * ("example.com" matches www.example.com, never badexample.com). */
static int no_proxy_match(const char *list, const char *host)
{
    size_t hl = strlen(host);
    size_t lead = strspn(list, " \t"), len = strlen(list + lead);
    while (len && (list[lead + len - 1] == ' ' || list[lead + len - 1] == '\t'))
        len--;
    if (len == 1 && list[lead] == '*')
        return 1;
    unsigned char addr[16];
    int af = inet_pton(AF_INET, host, addr) == 1 ? AF_INET
           : inet_pton(AF_INET6, host, addr) == 1 ? AF_INET6 : 0;
    if (!af && hl && host[hl - 1] == '.')
        hl--;
    for (const char *p = list; *p;) {
        p += strspn(p, ", \t");
        size_t n = strcspn(p, ", \t");
        const char *e = p;
        p += n;
        if (!n)
            continue;
        if (af) {
            if (no_proxy_net(addr, af == AF_INET ? 4 : 16, af, e, n))
                return 1;
            continue;
        }
        if (e[n - 1] == '.')
            n--;
        if (n && *e == '.') {
            e++;
            n--;
        }
        if (!n || n > hl)
            continue;
        if (!strncasecmp(host + hl - n, e, n) && (hl == n || host[hl - n - 1] == '.'))
            return 1;
    }
    return 0;
}

void sl_remote_target_init(sl_remote_target *t, const sl_remote_cfg *c, const sl_location *loc,
                           const char *url)
{
    t->loc = loc->given;
    t->shown = loc->shown;
    t->url = url;
    t->https = !strncmp(url, "https://", 8);
    t->proxied = sl_remote_proxy_for(c, url) != NULL;
    t->hub = sl_hf_on_hub(c, loc);
    t->s3 = loc->kind == SL_LOC_S3;
}

const char *sl_remote_proxy_for(const sl_remote_cfg *c, const char *url)
{
    const sl_proxy_hop *hop = !strncmp(url, "https://", 8) ? c->proxy_https : c->proxy_http;
    if (!hop)
        return NULL;
    const char *px = hop->url;
    char host[256];
    sl_location_host_of(url, host, sizeof host);
    return c->no_proxy && no_proxy_match(c->no_proxy, host) ? NULL : px;
}

void sl_remote_scrub(char *msg, size_t cap, const char *loc)
{
    char safe[512];
    if (!sl_is_remote(loc))
        return;
    /* safe is never longer than loc: the message only shrinks */
    sl_location_scrub_text(msg, loc, sl_location_shown_of(loc, safe, sizeof safe));
    (void)cap;
}

char *sl_remote_url(const sl_remote_cfg *c, const char *loc, sl_err *err)
{
    if (!strncmp(loc, "hf://", 5))
        return sl_hf_url(c, loc, err);
    if (strncmp(loc, "s3://", 5) != 0) {
        char *u = strdup(loc);
        if (!u)
            sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
        return u;
    }
    const char *b = loc + 5, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    const char *key = slash ? slash + 1 : "";
    if (bl == 0) {
        sl_fail(err, SLUICE_E_INVAL, "%s: no bucket in the s3:// location", loc);
        return NULL;
    }
    const char *ep = c->s3_endpoint;
    size_t n = strlen(ep) + bl + strlen(key) + 8;
    char *u = malloc(n);
    if (!u) {
        sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
        return NULL;
    }
    const char *sep = strstr(ep, "://");
    if (c->s3_virtual && sep)
        snprintf(u, n, "%.*s%.*s.%s/%s", (int)(sep + 3 - ep), ep, (int)bl, b, sep + 3, key);
    else
        snprintf(u, n, "%s/%.*s/%s", ep, (int)bl, b, key);
    return u;
}

/* The range of spans [s, n) that starts at s: spans closer than gap in
 * the object join it, up to SL_SPAN_RANGE_MAX bytes (a span longer is a
 * range alone). Returns the span past it; *lo, *hi its object bytes. */
static size_t span_range(const sl_span *spans, size_t s, size_t n, uint64_t gap, uint64_t *lo,
                         uint64_t *hi)
{
    *lo = spans[s].offset;
    *hi = *lo + spans[s].len;
    for (s++; s < n; s++) {
        uint64_t a = spans[s].offset, b = a + spans[s].len;
        if (a < *hi || a - *hi >= gap || b - *lo > SL_SPAN_RANGE_MAX)
            break;
        *hi = b;
    }
    return s;
}

size_t sl_remote_spans_batch(const sl_span *spans, size_t n, int single)
{
    uint64_t gap = single ? SL_SPAN_GAP_SINGLE : SL_SPAN_GAP_MULTI, want = 0;
    size_t s = 0, ranges = 0, hl = 0;
    while (s < n) {
        uint64_t lo, hi;
        size_t next = span_range(spans, s, n, gap, &lo, &hi);
        if (ranges && (single || ranges >= SL_SPAN_BATCH || hl + 42 > SL_SPAN_HEADER_MAX ||
                       want + (hi - lo) > SL_SPAN_RANGE_MAX))
            break;
        hl += (size_t)snprintf(NULL, 0, "%llu-%llu,", (unsigned long long)lo,
                               (unsigned long long)(hi - 1));
        want += hi - lo;
        ranges++;
        s = next;
    }
    return s;
}

#ifndef SLUICE_HAVE_CURL

static int unsupported(sl_err *err, const char *loc)
{
    return sl_fail(err, SLUICE_E_UNSUPPORTED, "%s: remote locations need libcurl, and this "
                   "library was built without it", loc);
}

int sl_remote_read(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                   uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                   int missing_code, sl_err *err)
{
    return unsupported(err, t->shown);
}

int sl_remote_read_tensor(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                          uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                          int missing_code, sl_err *err)
{
    return unsupported(err, t->shown);
}

int sl_remote_get(const sl_remote_cfg *c, const char *location, size_t max, char **out,
                  size_t *len, int missing_code, sl_err *err)
{
    *out = NULL;
    return unsupported(err, location);
}

int sl_remote_get_anchor(const sl_remote_cfg *c, const char *location, size_t max, char **out,
                         size_t *len, int missing_code, sl_err *err)
{
    *out = NULL;
    return unsupported(err, location);
}

int sl_rio_create(const sl_remote_cfg *c, sl_io_done_fn done, void *ctx, sl_rio **out,
                  sl_err *err)
{
    *out = NULL;
    return unsupported(err, "remote reads");
}

void sl_rio_submit(sl_rio *r, sl_io_req *req, const sl_remote_target *t, uint64_t object_size,
                   sl_validators *v) {}
void sl_rio_flush(sl_rio *r) {}
void sl_rio_abort(sl_rio *r) {}
void sl_rio_destroy(sl_rio *r) {}

static sl_easy_pool *easy_pool_new(unsigned cap)
{
    (void)cap;
    return NULL;
}

static void easy_pool_free(sl_easy_pool *p)
{
    (void)p;
}

#else

#include <curl/curl.h>

/* ---------------------------------------------------------------- idle handles */

/* At most cap idle handles (the model's connections: as many as its
 * blocking fetches are likely to run at once), taken and given back
 * under the lock; a handle is used by one thread at a time, and setup()
 * resets every option of it before each request, keeping its caches
 * (connections, DNS, TLS sessions).
 *
 * The pool is the process's that made it (pid): a child of fork() gets
 * copies of its idle handles, whose connections are the parent's own
 * sockets (one kernel socket in both processes: their requests and
 * replies would interleave on it, failing both, or a TLS stream would
 * break). A child never takes them, gives none back (each of its fetches
 * opens and closes its own handle) and never touches the lock (another
 * thread may have held it at the fork); closing the model in the child
 * leaves them, and their connections, to the parent. */
struct sl_easy_pool {
    pthread_mutex_t lock;
    pid_t pid;
    unsigned n, cap;
    CURL *idle[];
};

static sl_easy_pool *easy_pool_new(unsigned cap)
{
    sl_easy_pool *p = calloc(1, sizeof *p + cap * sizeof p->idle[0]);
    if (p && pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return NULL;
    }
    if (p) {
        p->cap = cap;
        p->pid = getpid();
    }
    return p;
}

/* Whether p is this process's (not a fork's copy). */
static int easy_pool_ours(const sl_easy_pool *p)
{
    return p && p->pid == getpid();
}

static void easy_pool_free(sl_easy_pool *p)
{
    if (!p)
        return;
    if (easy_pool_ours(p)) {
        for (unsigned i = 0; i < p->n; i++)
            curl_easy_cleanup(p->idle[i]);
        pthread_mutex_destroy(&p->lock);
    }
    free(p);
}

static CURL *easy_take(sl_easy_pool *p)
{
    CURL *h = NULL;
    if (easy_pool_ours(p)) {
        pthread_mutex_lock(&p->lock);
        if (p->n)
            h = p->idle[--p->n];
        pthread_mutex_unlock(&p->lock);
    }
    return h ? h : curl_easy_init();
}

static void easy_give(sl_easy_pool *p, CURL *h)
{
    if (easy_pool_ours(p)) {
        pthread_mutex_lock(&p->lock);
        if (p->n < p->cap) {
            p->idle[p->n++] = h;
            h = NULL;
        }
        pthread_mutex_unlock(&p->lock);
    }
    if (h)
        curl_easy_cleanup(h);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    /* Never cleaned up: other threads of the process may use curl too. */
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int curl_ready(sl_err *err)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return sl_fail(err, SLUICE_E_REMOTE, "remote: curl_global_init failed: %s",
                       curl_easy_strerror(curl_init_rc));
    return SLUICE_OK;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---------------------------------------------------------------- one attempt */

#define ERR_BODY_MAX (64u << 10)   /* an error reply's body read before it is cut */

typedef struct xfer {
    /* where the body goes: an iovec array (ranged) or a growing buffer */
    sl_io_req *req;              /* seam: iov, offset, done_bytes advanced */
    unsigned char *buf;          /* blocking ranged read: buf + done */
    char *gbuf;                  /* whole GET */
    size_t glen, gcap, gmax;
    int ranged;
    const char *multi;           /* a multi-range request: its Range value (the body,
                                    multipart/byteranges, goes to gbuf), or NULL */
    char boundary[72];           /* the reply's multipart boundary, "" when none */
    uint64_t want_off, want_len; /* this attempt's range */
    uint64_t size;               /* the object's size, 0 = learn it */
    uint64_t done;               /* ranged bytes landed over all attempts */
    /* this attempt's reply */
    long status;
    int have_cr;
    uint64_t cr_a, cr_b, cr_total;
    long retry_after_ms;         /* -1: none */
    char etag[SL_ETAG_MAX];      /* the reply's strong ETag, "" when none (or malformed) */
    sl_validators *tags;         /* the object's, per hop (remote.h), or NULL */
    const char *if_match;        /* this attempt's If-Match (setup: its hop's), or NULL */
    uint64_t got;                /* body bytes of this attempt */
    int checked;
    int verdict;                 /* a code decided by a callback (stops the transfer) */
    char why[160];
    char errbuf[CURL_ERROR_SIZE];
    const char *shown;           /* the location as messages show it */
    /* stall detection (the progress callback): no byte for stall_ms, or
     * fewer than SL_REMOTE_MIN_SPEED bytes a second over a window of
     * stall_ms, the first window from the first byte (moving) */
    _Atomic int *abort_flag;
    const sluice_cancel *cancel;  /* the cfg's: a call's token, or NULL */
    uint64_t stall_ms, last_move_ms, win_start_ms;
    curl_off_t last_dl, win_dl;
    int stalled, slow, aborted, moving;
    int cause;                   /* SL_RRETRY_*: why outcome() said RETRY */
    int tensor;                  /* a tensor's bytes: counted by the caller */
    /* proxies (sluice.h "Proxies"): set by the caller */
    int no_proxy;                /* go to the origin directly */
    int demand;                  /* a caller waits on it (Dragonfly's priority) */
    /* set by setup() for the attempt */
    int proxied;                 /* this attempt goes through the proxy */
    int would_proxy;             /* a proxy applies to its URL (no_proxy aside) */
    sl_proxy_hop *hop;           /* and its hop (its health), or NULL */
    int skipped;                 /* it went direct: the proxy was taken for down */
    int anchor;                  /* what bytes are checked against (a manifest,
                                    the Hub's API): to the origin directly, by
                                    design (not bypass bytes) */
    int unconfirmed;             /* the proxy said 404/416: asked directly, and
                                    its failure if the origin serves it */
    int signed_s3;               /* set by setup(): AWS credentials go with it, so
                                    it follows no redirect */
} xfer;

static void x_reset_attempt(xfer *x)
{
    x->status = 0;
    x->have_cr = 0;
    x->retry_after_ms = -1;
    x->etag[0] = '\0';
    x->boundary[0] = '\0';
    x->got = 0;
    x->checked = 0;
    x->verdict = 0;
    x->why[0] = '\0';
    x->errbuf[0] = '\0';
    x->last_move_ms = x->win_start_ms = mono_ms();
    x->last_dl = x->win_dl = 0;
    x->stalled = x->slow = x->aborted = x->moving = 0;
}

/* Whether v is a strong entity-tag as RFC 9110 writes it, short enough
 * to keep: '"', bytes 0x21, 0x23-0x7E or 0x80-0xFF (no control, space or
 * quote), '"', nothing after (remote.h, sl_validators). */
static int etag_ok(const char *v)
{
    size_t n = strlen(v);
    if (n < 2 || n >= SL_ETAG_MAX || v[0] != '"' || v[n - 1] != '"')
        return 0;
    for (size_t i = 1; i + 1 < n; i++) {
        unsigned char b = (unsigned char)v[i];
        if (b < 0x21 || b == '"' || b == 0x7f)
            return 0;
    }
    return 1;
}

/* The validator of hop (SL_HOP_*) of v, or NULL when it has none yet. */
static const char *hop_tag(sl_validators *v, int hop)
{
    return v && atomic_load_explicit(&v->state[hop], memory_order_acquire) == 2 ? v->etag[hop]
                                                                               : NULL;
}

/* The reply of a successful attempt over hop gave etag (may be ""): it
 * becomes that hop's validator when the hop has none yet. */
static void hop_learn(sl_validators *v, int hop, const char *etag)
{
    int none = 0;
    if (!v || !etag[0] ||
        !atomic_compare_exchange_strong_explicit(&v->state[hop], &none, 1, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return;
    snprintf(v->etag[hop], SL_ETAG_MAX, "%s", etag);
    atomic_store_explicit(&v->state[hop], 2, memory_order_release);
}

/* The verdict of a multi-range request the server does not answer with
 * multipart/byteranges (200, one range, 416): the seam reads the spans
 * as single coalesced ranges instead (finished). Never a SLUICE_E_* code. */
#define MR_FALLBACK (-2000)

/* The boundary of a Content-Type value "multipart/byteranges;
 * boundary=B" (B quoted or not, 1 to 70 characters of RFC 2046's
 * bcharsnospace and space, not ending in a space) into out, else "". */
static void mr_boundary(const char *v, char *out, size_t cap)
{
    static const char ok[] = "'()+_,-./:=? ";
    out[0] = '\0';
    while (*v == ' ' || *v == '\t')
        v++;
    if (strncasecmp(v, "multipart/byteranges", 20))
        return;
    const char *b = strcasestr(v + 20, "boundary=");
    if (!b)
        return;
    b += 9;
    int quoted = *b == '"';
    b += quoted;
    size_t n = 0;
    while (b[n] && (quoted ? b[n] != '"' : b[n] != ';' && b[n] != ' ' && b[n] != '\t'))
        n++;
    if (n == 0 || n > 70 || n >= cap || b[n - 1] == ' ' || (quoted && b[n] != '"'))
        return;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)b[i]) && !strchr(ok, b[i]))
            return;
    memcpy(out, b, n);
    out[n] = '\0';
}

static size_t on_header(char *line, size_t sz, size_t n, void *ud)
{
    xfer *x = ud;
    size_t len = sz * n;
    char h[512];
    size_t k = len < sizeof h - 1 ? len : sizeof h - 1;
    memcpy(h, line, k);
    h[k] = '\0';
    /* the line's end, and the OWS after the value (RFC 9110 5.5: not
     * part of it; an ETag followed by a space is still one) */
    while (k > 0 && (h[k - 1] == '\r' || h[k - 1] == '\n' || h[k - 1] == ' ' || h[k - 1] == '\t'))
        h[--k] = '\0';
    if (!strncmp(h, "HTTP/", 5)) {
        const char *sp = strchr(h, ' ');
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->have_cr = 0;
        x->retry_after_ms = -1;
        x->etag[0] = '\0';
        x->boundary[0] = '\0';
    } else if (!strncasecmp(h, "etag:", 5)) {
        const char *v = h + 5;
        while (*v == ' ' || *v == '\t')
            v++;
        /* strong ones only (If-Match compares strongly), well formed:
         * never a byte that would end or split the If-Match line */
        if (etag_ok(v))
            snprintf(x->etag, sizeof x->etag, "%s", v);
    } else if (!strncasecmp(h, "content-range:", 14)) {
        unsigned long long a, b, t;
        const char *v = h + 14;
        while (*v == ' ' || *v == '\t')
            v++;
        if (sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
            x->have_cr = 1;
            x->cr_a = a;
            x->cr_b = b;
            x->cr_total = t;
        }
    } else if (!strncasecmp(h, "content-type:", 13) && x->multi) {
        mr_boundary(h + 13, x->boundary, sizeof x->boundary);
    } else if (!strncasecmp(h, "retry-after:", 12)) {
        const char *v = h + 12;
        while (*v == ' ' || *v == '\t')
            v++;
        char *end;
        long s = strtol(v, &end, 10);
        if (end != v && s >= 0) {
            x->retry_after_ms = s > 86400 ? 86400000L : s * 1000L;
        } else {
            time_t when = curl_getdate(v, NULL);
            time_t now = time(NULL);
            if (when > 0)
                x->retry_after_ms = when > now ? (long)(when - now) * 1000L : 0;
        }
    }
    return len;
}

/* The checks of a reply, before its first byte is stored. */
static int check_reply(xfer *x)
{
    if (x->multi) {
        if (x->status == 200 || x->status == 416 || (x->status == 206 && !x->boundary[0])) {
            snprintf(x->why, sizeof x->why, "HTTP %ld%s to a multi-range request", x->status,
                     x->status == 206 ? " of one range" : "");
            x->verdict = MR_FALLBACK;
            return 0;
        }
        if (x->status == 206 && x->have_cr) {
            snprintf(x->why, sizeof x->why, "a multipart reply with a Content-Range of its own");
            x->verdict = SLUICE_E_REMOTE;
            return 0;
        }
        return 1;
    }
    if (!x->ranged) {
        if (x->status == 200)
            return 1;
        return x->status >= 200 && x->status < 300 ? (snprintf(x->why, sizeof x->why,
               "HTTP %ld where 200 was expected", x->status), x->verdict = SLUICE_E_REMOTE, 0) : 1;
    }
    if (x->status == 200) {
        snprintf(x->why, sizeof x->why, "HTTP 200 (the whole object) for a range request: the "
                 "server ignores Range, so no byte of it can be placed");
        x->verdict = SLUICE_E_FILE_CHANGED;
        return 0;
    }
    if (x->status != 206)
        return 1;   /* an error reply: its body is discarded, the status decides */
    if (!x->have_cr) {
        snprintf(x->why, sizeof x->why, "HTTP 206 without a Content-Range");
        x->verdict = SLUICE_E_REMOTE;
        return 0;
    }
    if (x->size && x->cr_total != x->size) {
        snprintf(x->why, sizeof x->why, "the object is now %llu bytes, %llu at open: it "
                 "changed after open", (unsigned long long)x->cr_total,
                 (unsigned long long)x->size);
        x->verdict = SLUICE_E_FILE_CHANGED;
        return 0;
    }
    if (x->cr_a != x->want_off || x->cr_b < x->cr_a ||
        x->cr_b > x->want_off + x->want_len - 1) {
        snprintf(x->why, sizeof x->why, "Content-Range bytes %llu-%llu for a request of bytes "
                 "%llu-%llu", (unsigned long long)x->cr_a, (unsigned long long)x->cr_b,
                 (unsigned long long)x->want_off,
                 (unsigned long long)(x->want_off + x->want_len - 1));
        x->verdict = SLUICE_E_FILE_CHANGED;
        return 0;
    }
    return 1;
}

static size_t on_body(char *data, size_t sz, size_t n, void *ud)
{
    xfer *x = ud;
    size_t len = sz * n;
    if (!x->checked) {
        x->checked = 1;
        if (!check_reply(x))
            return 0;   /* stops the transfer: CURLE_WRITE_ERROR */
    }
    int good = x->ranged || x->multi ? x->status == 206 : x->status == 200;
    if (!good) {
        x->got += len;
        return x->got > ERR_BODY_MAX ? 0 : len;
    }
    if (x->ranged) {
        if (x->got + len > x->want_len) {
            snprintf(x->why, sizeof x->why, "more bytes than the %llu asked",
                     (unsigned long long)x->want_len);
            x->verdict = SLUICE_E_FILE_CHANGED;
            return 0;
        }
        if (x->req) {
            for (size_t left = len; left;) {
                size_t k = x->req->iov[0].iov_len < left ? x->req->iov[0].iov_len : left;
                memcpy(x->req->iov[0].iov_base, data + (len - left), k);
                sl_io_req_advance(x->req, k);
                left -= k;
            }
        } else {
            memcpy(x->buf + x->done, data, len);
        }
        x->done += len;
        x->got += len;
        return len;
    }
    if (x->glen + len > x->gmax) {
        snprintf(x->why, sizeof x->why, "larger than the limit of %zu bytes", x->gmax);
        x->verdict = SLUICE_E_REMOTE;
        return 0;
    }
    if (x->glen + len + 1 > x->gcap) {
        size_t cap = x->gcap ? x->gcap : 65536;
        while (cap < x->glen + len + 1)
            cap *= 2;
        char *g = realloc(x->gbuf, cap);
        if (!g) {
            snprintf(x->why, sizeof x->why, "out of memory");
            x->verdict = SLUICE_E_NOMEM;
            return 0;
        }
        x->gbuf = g;
        x->gcap = cap;
    }
    memcpy(x->gbuf + x->glen, data, len);
    x->glen += len;
    x->got += len;
    return len;
}

/* Stops a transfer that moved no byte for stall_ms (curl's low-speed
 * limit averages over seconds, and a burst hides a stall behind it), one
 * that trickles (fewer than SL_REMOTE_MIN_SPEED bytes a second over a
 * window of stall_ms from its first byte on, or than what is left of the
 * range), or whose model
 * is closing. Nothing else bounds an attempt once its connection is up:
 * a transfer that keeps moving is never cut by a clock (see
 * remote_deadline_ms in sluice.h). */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    xfer *x = ud;
    (void)ultotal;
    (void)ulnow;
    if ((x->abort_flag && *x->abort_flag) || sl_cancel_requested(x->cancel)) {
        x->aborted = 1;
        return 1;
    }
    uint64_t now = mono_ms();
    if (dlnow != x->last_dl) {
        if (!x->moving) {
            /* The speed floor's first window opens with the first byte
             * (counting it): the wait for the reply is the stall rule's
             * to bound. Opened at the attempt's start, a reply that took
             * most of stall_ms left the window a fraction of it, and a
             * link well over the floor was cut as too slow, every
             * attempt alike. */
            x->moving = 1;
            x->win_start_ms = now;
            x->win_dl = x->last_dl;
        }
        x->last_dl = dlnow;
        x->last_move_ms = now;
    } else if (now - x->last_move_ms >= x->stall_ms) {
        x->stalled = 1;
        return 1;
    }
    if (x->moving && now - x->win_start_ms >= x->stall_ms) {
        /* the window's least: its share at the slowest speed kept, or
         * the rest of the body when that is less */
        uint64_t least = x->stall_ms * SL_REMOTE_MIN_SPEED / 1000;
        uint64_t moved = (uint64_t)(dlnow - x->win_dl), at = (uint64_t)x->win_dl;
        uint64_t total = x->ranged ? x->want_len : dltotal > 0 ? (uint64_t)dltotal : 0;
        if (total > at && total - at < least)
            least = total - at;
        if (moved < least) {
            x->slow = 1;
            return 1;
        }
        x->win_start_ms = now;
        x->win_dl = dlnow;
    }
    return 0;
}

/* The query parameters of presigned URLs (S3 SigV4 and SigV2, GCS,
 * Azure SAS) that Dragonfly leaves out of a task's id: the same object
 * signed on two nodes is one task, shared by their peers. */
#define DF_FILTERED "X-Amz-Algorithm,X-Amz-Credential,X-Amz-Date,X-Amz-Expires," \
    "X-Amz-SignedHeaders,X-Amz-Signature,X-Amz-Security-Token,X-Amz-Content-Sha256," \
    "AWSAccessKeyId,Signature,Expires,X-Goog-Algorithm,X-Goog-Credential,X-Goog-Date," \
    "X-Goog-Expires,X-Goog-SignedHeaders,X-Goog-Signature,GoogleAccessId,sv,ss,srt,sp,se," \
    "st,spr,sig,sr,skoid,sktid,skt,ske,sks,skv"

/* Dragonfly's daemon (dfdaemon's proxy) reads these (its client's
 * X-Dragonfly-* headers): P2P on; a priority (common.proto's Priority:
 * LEVEL6, its default and highest, for a request a caller waits on;
 * LEVEL3 for read-ahead); the presigned URLs' parameters. */
/* l with line appended; when that cannot be (out of memory), l as it
 * was and *bad set: the request must not go out without the header (a
 * Range, an If-Match or a credential silently dropped would be another
 * request). */
static struct curl_slist *hdr_add(struct curl_slist *l, const char *line, int *bad)
{
    struct curl_slist *n = curl_slist_append(l, line);
    if (!n)
        *bad = 1;
    return n ? n : l;
}

static struct curl_slist *dragonfly_headers(struct curl_slist *l, int demand, int *bad)
{
    l = hdr_add(l, "X-Dragonfly-Use-P2P: true", bad);
    l = hdr_add(l, demand ? "X-Dragonfly-Priority: 6" : "X-Dragonfly-Priority: 3", bad);
    return hdr_add(l, "X-Dragonfly-Filtered-Query-Params: " DF_FILTERED, bad);
}

/* Sets the proxy px on h: its URL without user:password@, and those,
 * percent-decoded, apart (CURLOPT_PROXYUSERNAME, CURLOPT_PROXYPASSWORD):
 * libcurl names the proxy URL whole in some of its errors ("Unsupported
 * proxy scheme for '...'"), which become messages and
 * sluice_tensor_source. */
static void set_proxy(CURL *h, const char *px)
{
    const char *sep = strstr(px, "://");
    const char *auth = sep ? sep + 3 : px;
    size_t alen = strcspn(auth, "/?#");
    const char *at = NULL;
    for (const char *q = auth; q < auth + alen; q++)
        if (*q == '@')
            at = q;
    if (!at) {
        curl_easy_setopt(h, CURLOPT_PROXY, px);
        return;
    }
    size_t n = strlen(px) + 1;
    char *bare = malloc(n), *info = malloc(n);
    if (!bare || !info) {
        free(bare);
        free(info);
        curl_easy_setopt(h, CURLOPT_PROXY, px);
        return;
    }
    snprintf(bare, n, "%.*s%s", (int)(auth - px), px, at + 1);
    snprintf(info, n, "%.*s", (int)(at - auth), auth);
    char *colon = strchr(info, ':');
    if (colon)
        *colon = '\0';
    char *user = curl_easy_unescape(h, info, 0, NULL);
    char *pass = colon ? curl_easy_unescape(h, colon + 1, 0, NULL) : NULL;
    curl_easy_setopt(h, CURLOPT_PROXY, bare);
    curl_easy_setopt(h, CURLOPT_PROXYUSERNAME, user ? user : "");
    curl_easy_setopt(h, CURLOPT_PROXYPASSWORD, pass ? pass : "");
    /* libcurl copies them */
    if (pass)
        memset(pass, 0, strlen(pass));
    curl_free(user);
    curl_free(pass);
    memset(info, 0, n);
    free(info);
    free(bare);
}

/* The proxy of one attempt (sluice.h "Proxies"): CURLOPT_PROXY always set
 * (to "" when direct), so that libcurl never reads the environment
 * itself. A Dragonfly proxy is asked https:// objects as http:// (an
 * absolute-URI request it can share with its peers, never a CONNECT
 * tunnel, which would hide the bytes from it); the daemon's proxy rule
 * fetches the origin over TLS. Returns l with its headers added. */
static struct curl_slist *setup_proxy(CURL *h, const sl_remote_cfg *c,
                                      const sl_remote_target *t, xfer *x, struct curl_slist *l,
                                      int *bad)
{
    const char *url = t->url;
    /* the hop decided at open; a configuration without proxies (the
     * direct hop, sl_source_read_direct) has none to take */
    sl_proxy_hop *hop = !t->proxied ? NULL : t->https ? c->proxy_https : c->proxy_http;
    const char *px = hop ? hop->url : NULL;
    x->hop = hop;
    x->would_proxy = px != NULL;
    if (px && !x->no_proxy &&
        mono_ms() < atomic_load_explicit(&hop->down_until, memory_order_relaxed)) {
        x->no_proxy = 1;    /* down a moment ago: not waited for again */
        x->skipped = 1;
    }
    x->proxied = px && !x->no_proxy;
    if (x->proxied)
        set_proxy(h, px);
    else
        curl_easy_setopt(h, CURLOPT_PROXY, "");
    /* never unset: libcurl would read the environment's no_proxy itself
     * (even with CURLOPT_PROXY set). Through a plain proxy it is the list
     * resolved at open, which libcurl then applies to the redirects it
     * follows too (a 302 to a host in no_proxy goes there directly; the
     * first request's decision above is the same, by the same rules).
     * Else "": the decision above is the one followed, and the Dragonfly
     * rewrite below never goes to the origin directly in clear (its
     * redirects to https:// are not followed, see setup) */
    curl_easy_setopt(h, CURLOPT_NOPROXY,
                     x->proxied && c->proxy_kind == SLUICE_PROXY_PLAIN && c->no_proxy
                         ? c->no_proxy : "");
    if (!x->proxied || c->proxy_kind != SLUICE_PROXY_DRAGONFLY)
        return l;
    if (!strncmp(url, "https://", 8)) {
        size_t n = strlen(url) + 1;
        char *plain = malloc(n);
        if (plain) {
            snprintf(plain, n, "http://%s", url + 8);
            curl_easy_setopt(h, CURLOPT_URL, plain);   /* libcurl copies it */
            free(plain);
        }
    }
    return dragonfly_headers(l, x->demand, bad);
}

/* A 404 or 416 through the proxy: what the origin may have answered, or
 * the proxy's own (a cached negative reply, a rule, a lie). */
static int proxy_relayed(const xfer *x, CURLcode rc)
{
    return rc == CURLE_OK && !x->verdict && (x->status == 404 || x->status == 416);
}

/* Whether the failure of an attempt through the proxy sends the request
 * to the origin directly: anything but a cancel. A 404 or 416 too: the
 * proxy is not trusted to say that an object (a manifest, a shard) is
 * missing, which would decide what is verified; it counts as the proxy's
 * failure only when the origin then serves the request (proxy_failed). */
static int proxy_fault(const xfer *x, CURLcode rc, int code)
{
    (void)rc;
    return x->proxied && code != SLUICE_E_CANCELLED && code != MR_FALLBACK;
}

/* Counts a proxy failure of x's attempt (ended with rc); the request goes
 * direct from now on. A proxy that could not be reached or stopped
 * answering is taken for down for SL_PROXY_DOWN_MS: the model's next
 * requests do not wait for it (a blackholed proxy would cost each one its
 * connect timeout); one answering 5xx, or wrong bytes, is tried again by
 * the next request. */
static void proxy_failed(const sl_remote_cfg *c, xfer *x, CURLcode rc)
{
    x->no_proxy = 1;
    if (proxy_relayed(x, rc)) {
        x->unconfirmed = 1;     /* counted if the origin serves it */
        return;
    }
    atomic_fetch_add_explicit(&c->tally->proxy_failures, 1, memory_order_relaxed);
    /* could not be reached, or stopped answering: not any transport error
     * (a redirect it may not follow, a protocol error, is one request's) */
    if (!x->verdict &&
        (x->stalled || x->slow || rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_PROXY ||
         rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR ||
         rc == CURLE_GOT_NOTHING))
        atomic_store_explicit(&x->hop->down_until, mono_ms() + SL_PROXY_DOWN_MS,
                              memory_order_relaxed);
}

/* Sets h up for one attempt of x at url; *hdrs gets the header list to
 * free after the attempt. */
static int setup(CURL *h, const sl_remote_cfg *c, const sl_remote_target *t, xfer *x,
                 struct curl_slist **hdrs)
{
    struct curl_slist *l = NULL;
    char line[256];
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, t->url);
    int bad = 0;    /* a header that could not be added (out of memory) */
    l = setup_proxy(h, c, t, x, l, &bad);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    /* Dragonfly never tunnels: a redirect to https:// (the Hub's to its
     * CDN) would be followed through the daemon with CONNECT; it fails
     * instead, and the request goes to the origin directly (proxy_fault) */
    if (x->proxied && c->proxy_kind == SLUICE_PROXY_DRAGONFLY)
        curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
    /* the Authorization header stays with the first request's host, port
     * and scheme: a redirect to storage elsewhere (the Hub's) gets none */
    curl_easy_setopt(h, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->connect_timeout_ms);
    /* no CURLOPT_TIMEOUT: on_progress bounds a stalled or trickling
     * transfer, the deadline bounds retries, never a moving transfer */
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    if (c->ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
    x->abort_flag = c->abort_flag;
    x->stall_ms = c->stall_timeout_ms;
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    if (x->ranged) {
        snprintf(line, sizeof line, "Range: bytes=%llu-%llu", (unsigned long long)x->want_off,
                 (unsigned long long)(x->want_off + x->want_len - 1));
        l = hdr_add(l, line, &bad);
    } else if (x->multi) {
        char *range = malloc(strlen(x->multi) + 16);
        if (range) {
            sprintf(range, "Range: bytes=%s", x->multi);
            l = hdr_add(l, range, &bad);
            free(range);
        } else {
            bad = 1;
        }
    }
    /* the validator of the hop this attempt goes over, never the other's
     * (a proxy's ETag sent to the origin would be answered 412) */
    x->if_match = hop_tag(x->tags, x->proxied ? SL_HOP_PROXY : SL_HOP_DIRECT);
    if (x->if_match) {
        snprintf(line, sizeof line, "If-Match: %s", x->if_match);
        l = hdr_add(l, line, &bad);
    }
    x->signed_s3 = 0;
    const char *tok = t->hub ? c->hf_token : c->token;
    if (t->s3) {
        if (c->aws_key) {
            /* no redirect followed: SigV4 signs for the endpoint's host (a
             * redirect elsewhere could not take it), and libcurl would
             * send the session token, a header of ours, to any host */
            x->signed_s3 = 1;
            curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
            snprintf(line, sizeof line, "aws:amz:%s:s3", c->s3_region);
            curl_easy_setopt(h, CURLOPT_AWS_SIGV4, line);
            curl_easy_setopt(h, CURLOPT_USERNAME, c->aws_key);
            curl_easy_setopt(h, CURLOPT_PASSWORD, c->aws_secret);
            /* SHA-256 of the empty payload of a GET */
            l = hdr_add(l, "x-amz-content-sha256: "
                        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", &bad);
            if (c->aws_session) {
                char *st = malloc(strlen(c->aws_session) + 32);
                if (st) {
                    sprintf(st, "x-amz-security-token: %s", c->aws_session);
                    l = hdr_add(l, st, &bad);
                    memset(st, 0, strlen(st));
                    free(st);
                } else {
                    bad = 1;
                }
            }
        }
    } else if (tok) {
        char *bearer = malloc(strlen(tok) + 32);
        if (bearer) {
            sprintf(bearer, "Authorization: Bearer %s", tok);
            l = hdr_add(l, bearer, &bad);
            memset(bearer, 0, strlen(bearer));
            free(bearer);
        } else {
            bad = 1;
        }
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    *hdrs = l;
    return bad ? SLUICE_E_NOMEM : SLUICE_OK;
}

enum { OUT_OK, OUT_RETRY, OUT_FAIL };

static int transient_curl(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
        return 1;
    default:
        return 0;
    }
}

/* The outcome of an attempt that ended with rc: *code and msg for a
 * failure (of this attempt, or for good). */
static int outcome(xfer *x, CURLcode rc, int missing_code, int *code, char *msg, size_t cap)
{
    if (x->verdict) {
        *code = x->verdict;
        snprintf(msg, cap, "%s", x->why);
        return OUT_FAIL;
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK && x->stalled) {
        *code = SLUICE_E_REMOTE;
        snprintf(msg, cap, "no byte for %llu ms (stalled)", (unsigned long long)x->stall_ms);
        x->cause = SL_RRETRY_TIMEOUT;
        return OUT_RETRY;
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK && x->slow) {
        *code = SLUICE_E_REMOTE;
        snprintf(msg, cap, "fewer than %u bytes a second for %llu ms (too slow; %llu bytes "
                 "received)", (unsigned)SL_REMOTE_MIN_SPEED, (unsigned long long)x->stall_ms,
                 (unsigned long long)x->got);
        x->cause = SL_RRETRY_TIMEOUT;
        return OUT_RETRY;
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
        *code = SLUICE_E_CANCELLED;
        snprintf(msg, cap, "cancelled (%s)", sl_cancel_requested(x->cancel)
                                                ? "the call's token was requested"
                                                : "the model is closing");
        return OUT_FAIL;
    }
    if (rc != CURLE_OK) {
        *code = SLUICE_E_REMOTE;
        snprintf(msg, cap, "%.80s%s%.150s", curl_easy_strerror(rc), x->errbuf[0] ? ": " : "", x->errbuf);
        x->cause = rc == CURLE_OPERATION_TIMEDOUT ? SL_RRETRY_TIMEOUT
                 : rc == CURLE_PARTIAL_FILE       ? SL_RRETRY_SHORT
                                                  : SL_RRETRY_CONNECTION;
        return transient_curl(rc) ? OUT_RETRY : OUT_FAIL;
    }
    long s = x->status;
    if (x->multi && (s == 200 || s == 416 || (s == 206 && !x->boundary[0]))) {
        *code = MR_FALLBACK;
        snprintf(msg, cap, "HTTP %ld to a multi-range request", s);
        return OUT_FAIL;
    }
    if ((x->ranged && s == 206) || (!x->ranged && s == (x->multi ? 206 : 200))) {
        if (x->ranged && x->got < x->want_len) {
            *code = SLUICE_E_REMOTE;
            snprintf(msg, cap, "short body: %llu of %llu bytes", (unsigned long long)x->got,
                     (unsigned long long)x->want_len);
            x->cause = SL_RRETRY_SHORT;
            return OUT_RETRY;
        }
        return OUT_OK;
    }
    if (s == 412 && x->if_match) {
        *code = SLUICE_E_FILE_CHANGED;
        snprintf(msg, cap, "HTTP 412: the object changed after open (its ETag is no longer %s)",
                 x->if_match);
        return OUT_FAIL;
    }
    *code = SLUICE_E_REMOTE;
    if (s == 404 && missing_code)
        *code = missing_code;
    snprintf(msg, cap, "HTTP %ld%s", s, x->signed_s3 && s >= 300 && s < 400
             ? " (a redirect of a signed s3:// request is not followed: its signature and "
               "session token are for the endpoint alone)" : "");
    x->cause = SL_RRETRY_STATUS;
    return (s == 429 || s == 500 || s == 502 || s == 503 || s == 504) ? OUT_RETRY : OUT_FAIL;
}

static uint64_t rand_below(uint64_t n)
{
    uint64_t v = 0;
    if (n == 0)
        return 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = (uint64_t)mono_ms() * 6364136223846793005ull + 1442695040888963407ull;
    return v % n;
}

/* The wait before attempt number `attempt` + 1 (attempt counts from 0):
 * Retry-After when the reply gave one, else full jitter under a cap that
 * doubles from backoff_ms up to 30 s. */
static uint64_t backoff_ms(const sl_remote_cfg *c, unsigned attempt, long retry_after_ms)
{
    if (retry_after_ms >= 0)
        return (uint64_t)retry_after_ms;
    uint64_t cap = c->backoff_ms;
    for (unsigned k = 0; k < attempt && cap < 30000; k++)
        cap *= 2;
    if (cap > 30000)
        cap = 30000;
    return rand_below(cap + 1);
}

/* ---------------------------------------------------------------- blocking fetches */

static int fetch(const sl_remote_cfg *c, const sl_remote_target *t, xfer *x, uint64_t off,
                 uint64_t len, int missing_code, sl_err *err)
{
    SL_TRY(curl_ready(err));
    x->shown = t->shown;
    x->demand = 1;  /* its caller waits */
    CURL *h = easy_take(c->easy);
    if (!h)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: cannot start a transfer", x->shown);
    uint64_t deadline = mono_ms() + c->deadline_ms;
    int rc = SLUICE_OK;
    char msg[256];
    uint64_t bypass_from = 0;   /* ranged bytes landed before it went direct */
    for (unsigned attempt = 0;; attempt++) {
        x_reset_attempt(x);
        if (x->ranged) {
            x->want_off = off + x->done;
            x->want_len = len - x->done;
        } else {
            x->glen = 0;
        }
        struct curl_slist *hdrs = NULL;
        if (setup(h, c, t, x, &hdrs) < 0) {
            curl_slist_free_all(hdrs);
            rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory (the request's headers)",
                         x->shown);
            break;
        }
        CURLcode cr = curl_easy_perform(h);
        curl_slist_free_all(hdrs);
        int code = 0;
        int out = outcome(x, cr, missing_code, &code, msg, sizeof msg);
        if (out == OUT_OK)
            break;
        if (proxy_fault(x, cr, code)) {
            /* at once, and not an attempt of the origin's */
            proxy_failed(c, x, cr);
            bypass_from = x->done;
            attempt--;
            continue;
        }
        if (out == OUT_RETRY && attempt + 1 < c->attempts && !(c->abort_flag && *c->abort_flag) &&
            !sl_cancel_requested(x->cancel)) {
            uint64_t wait = backoff_ms(c, attempt, x->retry_after_ms), now = mono_ms();
            if (now + wait < deadline) {
                atomic_fetch_add_explicit(&c->tally->retries[x->cause], 1, memory_order_relaxed);
                /* in slices, so that a close stops the wait */
                for (uint64_t end = now + wait; mono_ms() < end;) {
                    if ((c->abort_flag && *c->abort_flag) || sl_cancel_requested(x->cancel))
                        break;
                    struct timespec ts = {0, 20000000L};
                    nanosleep(&ts, NULL);
                }
                continue;
            }
            rc = sl_fail(err, code, "%s: %s (attempt %u; no retry: the %llu ms deadline would "
                         "pass)", x->shown, msg, attempt + 1, (unsigned long long)c->deadline_ms);
            break;
        }
        if (out == OUT_RETRY)
            rc = sl_fail(err, code, "%s: %s (after %u attempts)", x->shown, msg, attempt + 1);
        else
            rc = sl_fail(err, code, "%s: %s", x->shown, msg);
        break;
    }
    if (rc == SLUICE_OK)
        hop_learn(x->tags, x->proxied ? SL_HOP_PROXY : SL_HOP_DIRECT, x->etag);
    if (rc == SLUICE_OK && x->unconfirmed)
        atomic_fetch_add_explicit(&c->tally->proxy_failures, 1, memory_order_relaxed);
    if (rc == SLUICE_OK && x->no_proxy && x->would_proxy && !x->anchor)
        atomic_fetch_add_explicit(&c->tally->proxy_bypass_bytes,
                                  x->ranged ? x->done - bypass_from : x->glen,
                                  memory_order_relaxed);
    /* one request, whatever its attempts and outcome; the bytes it landed */
    if (!x->tensor) {
        atomic_fetch_add_explicit(&c->tally->requests, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->tally->bytes, x->ranged ? x->done : x->glen,
                                  memory_order_relaxed);
    }
    easy_give(c->easy, h);
    return rc;
}

static int ranged_read(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                       uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                       int missing_code, int tensor, sl_err *err)
{
    xfer x = {.buf = buf, .ranged = 1, .size = *size, .tags = v, .tensor = tensor};
    if (len == 0)
        return SLUICE_OK;
    SL_TRY(fetch(c, t, &x, offset, len, missing_code, err));
    *size = x.cr_total;
    return SLUICE_OK;
}

int sl_remote_read(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                   uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                   int missing_code, sl_err *err)
{
    return ranged_read(c, t, offset, len, buf, size, v, missing_code, 0, err);
}

int sl_remote_read_tensor(const sl_remote_cfg *c, const sl_remote_target *t, uint64_t offset,
                          uint64_t len, unsigned char *buf, uint64_t *size, sl_validators *v,
                          int missing_code, sl_err *err)
{
    return ranged_read(c, t, offset, len, buf, size, v, missing_code, 1, err);
}

/* ---------------------------------------------------------------- spans (parts) */

/* One range of a request: spans [s0, s1) of the caller's, file bytes
 * [lo, hi). */
typedef struct mr_range {
    uint64_t lo, hi;
    size_t s0, s1;
} mr_range;

/* Copies the bytes of r's spans out of buf, which holds file bytes
 * [r->lo, r->lo + len). */
static void mr_place(const mr_range *r, const sl_span *spans, const unsigned char *buf)
{
    for (size_t s = r->s0; s < r->s1; s++)
        memcpy(spans[s].dst, buf + (spans[s].offset - r->lo), (size_t)spans[s].len);
}

/* Expects the literal lit at *p (within end); advances past it. */
static int mr_lit(const char **p, const char *end, const char *lit, size_t n)
{
    if ((size_t)(end - *p) < n || memcmp(*p, lit, n))
        return 0;
    *p += n;
    return 1;
}

/* Parses a multipart/byteranges body (RFC 9110 14.6, RFC 2046) strictly:
 * one part a range asked, in the order asked, each with one Content-Range
 * that names exactly that range and the object's size, and nothing but
 * the closing delimiter (and line ends) after the last. The spans' bytes
 * land in their dst. */
static int mr_parse(const char *body, size_t len, const char *boundary, const mr_range *rg,
                    size_t nr, const sl_span *spans, uint64_t size, const char *shown,
                    sl_err *err)
{
    const char *p = body, *end = body + len;
    size_t bl = strlen(boundary);
    (void)mr_lit(&p, end, "\r\n", 2); /* nginx and Apache open with a line end */
    for (size_t k = 0; k < nr; k++) {
        if (!mr_lit(&p, end, "--", 2) || !mr_lit(&p, end, boundary, bl) ||
            !mr_lit(&p, end, "\r\n", 2))
            return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: no boundary line before "
                           "part %zu of %zu", shown, k + 1, nr);
        int have = 0;
        unsigned long long a = 0, b = 0, t = 0;
        for (;;) { /* the part's header lines, up to an empty one */
            const char *eol = NULL;
            for (const char *q = p; q + 1 < end && q - p < 1024; q++)
                if (q[0] == '\r' && q[1] == '\n') {
                    eol = q;
                    break;
                }
            if (!eol)
                return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of %zu: a "
                               "header line without its end", shown, k + 1, nr);
            if (eol == p) {
                p += 2;
                break;
            }
            if ((size_t)(eol - p) > 14 && !strncasecmp(p, "content-range:", 14)) {
                char line[128], extra;
                size_t n = (size_t)(eol - p) - 14;
                if (n >= sizeof line || have)
                    return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of %zu: "
                                   "a second or overlong Content-Range", shown, k + 1, nr);
                memcpy(line, p + 14, n);
                line[n] = '\0';
                if (sscanf(line, " bytes %llu-%llu/%llu %c", &a, &b, &t, &extra) != 3 ||
                    strchr(line, '-') != strrchr(line, '-') || strchr(line, '+'))
                    return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of "
                                   "%zu: a malformed Content-Range", shown, k + 1, nr);
                have = 1;
            }
            p = eol + 2;
        }
        if (!have)
            return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of %zu has no "
                           "Content-Range", shown, k + 1, nr);
        if (size && t != size)
            return sl_fail(err, SLUICE_E_FILE_CHANGED, "%s: the object is now %llu bytes, %llu "
                           "at open: it changed after open", shown, t, (unsigned long long)size);
        if (a != rg[k].lo || b + 1 != rg[k].hi)
            return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of %zu is bytes "
                           "%llu-%llu, bytes %llu-%llu were asked", shown, k + 1, nr, a, b,
                           (unsigned long long)rg[k].lo, (unsigned long long)(rg[k].hi - 1));
        uint64_t n = rg[k].hi - rg[k].lo;
        if ((uint64_t)(end - p) < n)
            return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of %zu is cut "
                           "short", shown, k + 1, nr);
        mr_place(&rg[k], spans, (const unsigned char *)p);
        p += n;
        if (!mr_lit(&p, end, "\r\n", 2))
            return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: part %zu of %zu is "
                           "longer than its Content-Range", shown, k + 1, nr);
    }
    if (!mr_lit(&p, end, "--", 2) || !mr_lit(&p, end, boundary, bl) || !mr_lit(&p, end, "--", 2))
        return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: more parts than the %zu "
                       "ranges asked, or no closing boundary", shown, nr);
    for (; p < end; p++)
        if (*p != '\r' && *p != '\n')
            return sl_fail(err, SLUICE_E_REMOTE, "%s: multipart reply: bytes after its closing "
                           "boundary", shown);
    return SLUICE_OK;
}

/* Ranges of spans [s, n): spans closer than gap in the file are one,
 * none longer than SL_SPAN_RANGE_MAX (a span longer is a range alone). */
static size_t mr_ranges(const sl_span *spans, size_t n, uint64_t gap, mr_range *out)
{
    size_t nr = 0;
    for (size_t s = 0; s < n; s++) {
        uint64_t lo = spans[s].offset, hi = lo + spans[s].len;
        if (nr && lo >= out[nr - 1].hi && lo - out[nr - 1].hi < gap &&
            hi - out[nr - 1].lo <= SL_SPAN_RANGE_MAX) {
            out[nr - 1].hi = hi;
            out[nr - 1].s1 = s + 1;
        } else {
            out[nr++] = (mr_range){lo, hi, s, s + 1};
        }
    }
    return nr;
}

static int get(const sl_remote_cfg *c, const char *location, size_t max, char **out,
               size_t *len, int missing_code, int anchor, sl_err *err)
{
    *out = NULL;
    *len = 0;
    xfer x = {.gmax = max, .anchor = anchor, .no_proxy = anchor};
    /* a location made at open (an index.json, a manifest, the Hub's
     * API), parsed for this one request */
    sl_location *where = sl_location_new(location);
    if (!where)
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
    char *url = sl_remote_url(c, location, err);
    if (!url) {
        sl_location_free(where);
        return err->code;
    }
    sl_remote_target t;
    sl_remote_target_init(&t, c, where, url);
    int rc = fetch(c, &t, &x, 0, 0, missing_code ? missing_code : -1000, err);
    free(url);
    sl_location_free(where);
    if (rc == -1000) {
        free(x.gbuf);
        return SLUICE_OK;   /* absent */
    }
    if (rc < 0) {
        free(x.gbuf);
        return rc;
    }
    if (!x.gbuf && !(x.gbuf = malloc(1)))
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
    x.gbuf[x.glen] = '\0';
    *out = x.gbuf;
    *len = x.glen;
    return SLUICE_OK;
}

int sl_remote_get(const sl_remote_cfg *c, const char *location, size_t max, char **out,
                  size_t *len, int missing_code, sl_err *err)
{
    return get(c, location, max, out, len, missing_code, 0, err);
}

int sl_remote_get_anchor(const sl_remote_cfg *c, const char *location, size_t max, char **out,
                         size_t *len, int missing_code, sl_err *err)
{
    return get(c, location, max, out, len, missing_code, 1, err);
}

/* ---------------------------------------------------------------- the seam */

typedef struct rreq {
    struct rreq *next;
    struct rreq *wnext;          /* on the wire list */
    sl_io_req *req;
    const sl_remote_target *t;
    CURL *h;
    struct curl_slist *hdrs;
    xfer x;
    uint64_t deadline, due;      /* ms, monotonic; deadline 0: not on the wire yet */
    unsigned attempt;
    char last[200];              /* the last attempt's failure */
    int last_code;
    uint64_t bypass_from;        /* req->done_bytes when it went direct */
    uint64_t attempt_from;       /* req->done_bytes when this attempt started */
    /* a spans request (req->spans): its ranges rg[0..nr), all of them in
     * one multi-range request (multi; its Range value range), else one
     * single range after another (cur the one on the wire; its bytes in
     * bounce when they are not one span's dst); sent: a request went out
     * that is not counted in req->requests yet */
    mr_range *rg;
    size_t nr, cur;
    int multi, sent;
    char *range;
    unsigned char *bounce;
} rreq;

struct sl_rio {
    const sl_remote_cfg *c;
    sl_io_done_fn done;
    void *ctx;
    pthread_mutex_t lock;
    sl_io_req *head, *tail;      /* queued by other threads */
    int quit;
    atomic_int abort;            /* set under lock; read unlocked by finished() */
    CURLM *multi;
    pthread_t thread;
    int started;
    /* the thread's own */
    rreq *pending, *pending_tail; /* to start, in order */
    rreq *parked;                /* retries, by due time */
    unsigned active;
    rreq *wire;                  /* the transfers in the multi */
    CURL **easy;                 /* idle handles */
    unsigned neasy, easy_cap;
    sl_io_req *out, **out_tail;  /* completions to deliver */
};

static void complete(sl_rio *r, rreq *q, int code, const char *msg, int errnum)
{
    sl_io_req *req = q->req;
    if (q->sent)
        req->requests++;    /* a spans request's last, failed or aborted */
    free(q->rg);
    free(q->range);
    free(q->bounce);
    free(q->x.gbuf);
    if (!code && q->x.unconfirmed)
        atomic_fetch_add_explicit(&r->c->tally->proxy_failures, 1, memory_order_relaxed);
    if (!code && q->x.no_proxy && q->x.would_proxy)
        atomic_fetch_add_explicit(&r->c->tally->proxy_bypass_bytes,
                                  req->done_bytes - q->bypass_from, memory_order_relaxed);
    if (code) {
        req->error = errnum ? errnum : EIO;
        req->error_offset = req->offset;
        req->status = code;
        size_t n = strlen(msg) < sizeof req->detail - 1 ? strlen(msg) : sizeof req->detail - 1;
        memcpy(req->detail, msg, n);
        req->detail[n] = '\0';
        sl_utf8_cut(req->detail);
    }
    req->retries = q->attempt;
    if (q->h) {
        if (r->neasy < r->easy_cap)
            r->easy[r->neasy++] = q->h;
        else
            curl_easy_cleanup(q->h);
    }
    curl_slist_free_all(q->hdrs);
    free(q);
    req->next = NULL;
    *r->out_tail = req;
    r->out_tail = &req->next;
}

static void deliver(sl_rio *r)
{
    sl_io_req *list = r->out;
    r->out = NULL;
    r->out_tail = &r->out;
    if (list)
        r->done(r->ctx, list);
}

/* Back to the front of the queue: a request that goes on at once (to the
 * origin directly, the next range of a spans request). */
static void requeue(sl_rio *r, rreq *q)
{
    q->next = r->pending;
    r->pending = q;
    if (!r->pending_tail)
        r->pending_tail = q;
}

/* Points spans request q at its current range: a fresh request (its own
 * attempts and deadline, as each blocking fetch has), whose bytes land in
 * its span's dst when the range is that span, else in a buffer of its
 * own (placed by sp_landed). SLUICE_OK or SLUICE_E_NOMEM. */
static int sp_range(rreq *q)
{
    free(q->bounce);
    q->bounce = NULL;
    q->x.done = 0;
    q->deadline = 0;
    q->attempt = 0;
    if (q->multi)
        return SLUICE_OK;
    const mr_range *g = &q->rg[q->cur];
    const sl_span *sp = q->req->spans;
    if (g->s1 - g->s0 == 1 && sp[g->s0].len == g->hi - g->lo) {
        q->x.buf = sp[g->s0].dst;
        return SLUICE_OK;
    }
    if (!(q->bounce = malloc((size_t)(g->hi - g->lo))))
        return SLUICE_E_NOMEM;
    q->x.buf = q->bounce;
    return SLUICE_OK;
}

/* Plans spans request q (remote.h, sl_remote_spans_batch's rules): one
 * multi-range request of its ranges, or (single: the server refuses
 * those; or one range) its spans coalesced wider into single ranges, made
 * one after another. SLUICE_OK or SLUICE_E_NOMEM. */
static int sp_plan(rreq *q, int single)
{
    const sl_span *sp = q->req->spans;
    size_t n = q->req->nspans;
    free(q->rg);
    free(q->range);
    q->range = NULL;
    if (!(q->rg = malloc(n * sizeof *q->rg)))
        return SLUICE_E_NOMEM;
    q->nr = mr_ranges(sp, n, single ? SL_SPAN_GAP_SINGLE : SL_SPAN_GAP_MULTI, q->rg);
    q->cur = 0;
    q->multi = !single && q->nr >= 2;
    q->x.multi = NULL;
    q->x.ranged = !q->multi;
    if (q->multi) {
        if (!(q->range = malloc(q->nr * 42 + 1)))
            return SLUICE_E_NOMEM;
        size_t at = 0;
        uint64_t want = 0;
        for (size_t k = 0; k < q->nr; k++) {
            at += (size_t)sprintf(q->range + at, "%s%llu-%llu", k ? "," : "",
                                  (unsigned long long)q->rg[k].lo,
                                  (unsigned long long)(q->rg[k].hi - 1));
            want += q->rg[k].hi - q->rg[k].lo;
        }
        /* the body: the bytes, and each part's lines (a few hundred bytes
         * at most from a sane server) */
        q->x.multi = q->range;
        q->x.gmax = (size_t)want + q->nr * 1024 + 4096;
    }
    return sp_range(q);
}

static void start(sl_rio *r, rreq *q)
{
    if (!q->h)
        q->h = r->neasy ? r->easy[--r->neasy] : curl_easy_init();
    if (!q->h) {
        complete(r, q, SLUICE_E_NOMEM, "out of memory (curl_easy_init)", ENOMEM);
        return;
    }
    x_reset_attempt(&q->x);
    if (!q->req->spans) {
        q->x.want_off = q->req->offset;
        q->x.want_len = q->req->total - q->req->done_bytes;
    } else if (q->multi) {
        q->x.glen = 0;
    } else {
        q->x.want_off = q->rg[q->cur].lo + q->x.done;
        q->x.want_len = q->rg[q->cur].hi - q->rg[q->cur].lo - q->x.done;
    }
    /* The read's clock starts when a connection first takes it: time in
     * the queue behind other reads is not the read's (remote_deadline_ms) */
    if (!q->deadline)
        q->deadline = mono_ms() + r->c->deadline_ms;
    curl_slist_free_all(q->hdrs);
    q->hdrs = NULL;
    if (setup(q->h, r->c, q->t, &q->x, &q->hdrs) < 0) {
        complete(r, q, SLUICE_E_NOMEM, "out of memory (the request's headers)", ENOMEM);
        return;
    }
    q->sent = q->req->spans != NULL;
    q->attempt_from = q->req->done_bytes;
    if (q->x.skipped && !q->req->proxy_why[0])
        snprintf(q->req->proxy_why, sizeof q->req->proxy_why,
                 "skipped: it could not be reached less than %u s ago", SL_PROXY_DOWN_MS / 1000);
    curl_easy_setopt(q->h, CURLOPT_PRIVATE, q);
    if (curl_multi_add_handle(r->multi, q->h) != CURLM_OK) {
        complete(r, q, SLUICE_E_REMOTE, "curl_multi_add_handle failed", EIO);
        return;
    }
    r->active++;
    q->wnext = r->wire;
    r->wire = q;
}

static void off_wire(sl_rio *r, rreq *q)
{
    for (rreq **p = &r->wire; *p; p = &(*p)->wnext)
        if (*p == q) {
            *p = q->wnext;
            break;
        }
    curl_multi_remove_handle(r->multi, q->h);
    r->active--;
}

static void park(sl_rio *r, rreq *q)
{
    rreq **p = &r->parked;
    while (*p && (*p)->due <= q->due)
        p = &(*p)->next;
    q->next = *p;
    *p = q;
}

/* A request of spans request q came back whole: its bytes placed (a
 * multi-range reply parsed strictly and placed by finished, remote.h),
 * and the next range goes out, or q is complete. */
static void sp_landed(sl_rio *r, rreq *q)
{
    sl_io_req *req = q->req;
    q->sent = 0;
    req->requests++;
    if (q->multi) {  /* its reply parsed and placed already (finished) */
        uint64_t want = 0;
        for (size_t k = 0; k < q->nr; k++)
            want += q->rg[k].hi - q->rg[k].lo;
        req->done_bytes += want;
        complete(r, q, 0, NULL, 0);
        return;
    }
    const mr_range *g = &q->rg[q->cur];
    if (q->bounce)
        mr_place(g, req->spans, q->bounce);
    req->done_bytes += g->hi - g->lo;
    if (++q->cur == q->nr) {
        complete(r, q, 0, NULL, 0);
        return;
    }
    if (sp_range(q) < 0) {
        complete(r, q, SLUICE_E_NOMEM, "out of memory", ENOMEM);
        return;
    }
    requeue(r, q);
}

static void finished(sl_rio *r, rreq *q, CURLcode cr)
{
    off_wire(r, q);
    int code = 0;
    char msg[200];
    int out = outcome(&q->x, cr, 0, &code, msg, sizeof msg);
    if (out == OUT_OK && q->req->spans && q->multi) {
        /* a multipart reply is parsed strictly (remote.h) before it counts
         * as delivered: one that fails is a reply that fails the range
         * checks, so through the proxy it goes to the origin directly */
        sl_err perr = {0};
        int prc = mr_parse(q->x.gbuf ? q->x.gbuf : "", q->x.glen, q->x.boundary, q->rg, q->nr,
                           q->req->spans, q->x.size, q->t->shown, &perr);
        if (prc < 0) {
            out = OUT_FAIL;
            code = prc;
            snprintf(msg, sizeof msg, "%.199s", perr.msg);
        }
    }
    uint64_t landed = q->req->spans ? (q->x.status == 206 ? q->x.got : 0)
                                    : q->req->done_bytes - q->attempt_from;
    if (q->x.proxied && landed)
        q->req->proxied = 1;    /* bytes of the proxy's landed: the digest must judge */
    if (out != OUT_OK && !r->abort && proxy_fault(&q->x, cr, code)) {
        /* to the origin directly, at once (the front of the queue), from
         * where the proxy's bytes stopped: the digest judges them all */
        proxy_failed(r->c, &q->x, cr);
        q->req->proxy_failed = 1;
        snprintf(q->req->proxy_why, sizeof q->req->proxy_why, "%.119s", msg);
        sl_utf8_cut(q->req->proxy_why);
        q->bypass_from = q->req->done_bytes;
        requeue(r, q);
        return;
    }
    if (code == MR_FALLBACK) {
        /* the server refuses multi-range requests: not counted; this
         * one's spans go as single coalesced ranges, and so do the
         * object's later ones (its flag) */
        q->sent = 0;
        if (q->req->single)
            atomic_store_explicit(q->req->single, 1, memory_order_relaxed);
        if (sp_plan(q, 1) < 0)
            complete(r, q, SLUICE_E_NOMEM, "out of memory", ENOMEM);
        else
            requeue(r, q);
        return;
    }
    if (out == OUT_OK) {
        hop_learn(q->x.tags, q->x.proxied ? SL_HOP_PROXY : SL_HOP_DIRECT, q->x.etag);
        if (q->req->spans)
            sp_landed(r, q);
        else
            complete(r, q, 0, NULL, 0);
        return;
    }
    if (out == OUT_RETRY && q->attempt + 1 < r->c->attempts && !r->abort &&
        !sl_cancel_requested(q->req->cancel)) {
        uint64_t wait = backoff_ms(r->c, q->attempt, q->x.retry_after_ms), now = mono_ms();
        if (now + wait < q->deadline) {
            atomic_fetch_add_explicit(&r->c->tally->retries[q->x.cause], 1, memory_order_relaxed);
            q->attempt++;
            q->due = now + wait;
            snprintf(q->last, sizeof q->last, "%s", msg);
            q->last_code = code;
            park(r, q);
            return;
        }
        char m2[300];
        snprintf(m2, sizeof m2, "%.200s (attempt %u; no retry: the %llu ms deadline would pass)",
                 msg, q->attempt + 1, (unsigned long long)r->c->deadline_ms);
        complete(r, q, code, m2, EIO);
        return;
    }
    if (out == OUT_RETRY) {
        char m2[300];
        snprintf(m2, sizeof m2, "%.200s (after %u attempts)", msg, q->attempt + 1);
        complete(r, q, code, m2, EIO);
        return;
    }
    complete(r, q, code, msg, code == SLUICE_E_CANCELLED ? ECANCELED : EIO);
}

static void abort_all(sl_rio *r)
{
    static const char why[] = "cancelled: the model is closing";
    for (rreq *q; (q = r->wire);) {
        off_wire(r, q);
        complete(r, q, SLUICE_E_CANCELLED, why, ECANCELED);
    }
    for (rreq *q; (q = r->pending);) {
        r->pending = q->next;
        complete(r, q, SLUICE_E_CANCELLED, why, ECANCELED);
    }
    r->pending_tail = NULL;
    for (rreq *q; (q = r->parked);) {
        r->parked = q->next;
        complete(r, q, SLUICE_E_CANCELLED, why, ECANCELED);
    }
}

/* A call's token requested: its requests that wait for a connection or
 * for a retry fail now, without going out (those on the wire are aborted
 * by on_progress). */
static void cancelled(sl_rio *r)
{
    static const char why[] = "cancelled (the call's token was requested)";
    for (rreq **p = &r->parked; *p;) {
        rreq *q = *p;
        if (!sl_cancel_requested(q->req->cancel)) {
            p = &q->next;
            continue;
        }
        *p = q->next;
        complete(r, q, SLUICE_E_CANCELLED, why, ECANCELED);
    }
    r->pending_tail = NULL;
    for (rreq **p = &r->pending; *p;) {
        rreq *q = *p;
        if (!sl_cancel_requested(q->req->cancel)) {
            r->pending_tail = q;
            p = &q->next;
            continue;
        }
        *p = q->next;
        complete(r, q, SLUICE_E_CANCELLED, why, ECANCELED);
    }
}

static void *rio_main(void *arg)
{
    sl_rio *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        sl_io_req *in = r->head;
        r->head = r->tail = NULL;
        int quit = r->quit, ab = r->abort;
        pthread_mutex_unlock(&r->lock);
        uint64_t now = mono_ms();
        for (sl_io_req *req = in, *n; req; req = n) {
            n = req->next;
            rreq *q = calloc(1, sizeof *q);
            if (!q) {
                req->error = ENOMEM;
                req->status = SLUICE_E_NOMEM;
                snprintf(req->detail, sizeof req->detail, "out of memory");
                req->next = NULL;
                *r->out_tail = req;
                r->out_tail = &req->next;
                continue;
            }
            q->req = req;
            q->t = req->target;
            q->x.req = req->spans ? NULL : req;
            q->x.ranged = 1;
            q->x.size = req->object_size;
            q->x.tags = req->validators;
            q->x.no_proxy = req->no_proxy;
            q->x.demand = req->demand;
            q->x.cancel = req->cancel;
            if (req->spans &&
                sp_plan(q, req->single && atomic_load_explicit(req->single, memory_order_relaxed)) < 0) {
                complete(r, q, SLUICE_E_NOMEM, "out of memory", ENOMEM);
                continue;
            }
            if (r->pending_tail)
                r->pending_tail->next = q;
            else
                r->pending = q;
            r->pending_tail = q;
        }
        if (ab)
            abort_all(r);
        cancelled(r);
        while (r->parked && r->parked->due <= now) {
            rreq *q = r->parked;
            r->parked = q->next;
            q->next = r->pending;
            r->pending = q;
            if (!r->pending_tail)
                r->pending_tail = q;
        }
        while (r->pending && r->active < r->c->connections) {
            rreq *q = r->pending;
            r->pending = q->next;
            if (!r->pending)
                r->pending_tail = NULL;
            q->next = NULL;
            start(r, q);
        }
        deliver(r);
        if (quit && !r->active && !r->pending && !r->parked)
            break;
        int running = 0;
        curl_multi_perform(r->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(r->multi, &left)))
            if (m->msg == CURLMSG_DONE) {
                rreq *q;
                curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&q);
                finished(r, q, m->data.result);
            }
        deliver(r);
        long wait = 1000;
        now = mono_ms();
        if (r->parked)
            wait = r->parked->due > now ? (long)(r->parked->due - now) : 0;
        if (wait > 1000)
            wait = 1000;
        if (r->pending && r->active < r->c->connections)
            wait = 0;
        curl_multi_poll(r->multi, NULL, 0, (int)wait, NULL);
    }
    return NULL;
}

int sl_rio_create(const sl_remote_cfg *c, sl_io_done_fn done, void *ctx, sl_rio **out,
                  sl_err *err)
{
    *out = NULL;
    SL_TRY(curl_ready(err));
    sl_rio *r = calloc(1, sizeof *r);
    if (!r)
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
    r->c = c;
    r->done = done;
    r->ctx = ctx;
    r->out_tail = &r->out;
    r->easy_cap = c->connections;
    r->easy = calloc(r->easy_cap ? r->easy_cap : 1, sizeof *r->easy);
    pthread_mutex_init(&r->lock, NULL);
    if (!r->easy || !(r->multi = curl_multi_init())) {
        sl_rio_destroy(r);
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory (curl_multi_init)");
    }
    curl_multi_setopt(r->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)c->connections);
    curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, (long)c->connections);
    if (pthread_create(&r->thread, NULL, rio_main, r) != 0) {
        sl_rio_destroy(r);
        return sl_fail(err, SLUICE_E_NOMEM, "remote: cannot start a thread");
    }
    r->started = 1;
    *out = r;
    return SLUICE_OK;
}

void sl_rio_submit(sl_rio *r, sl_io_req *req, const sl_remote_target *t, uint64_t object_size,
                   sl_validators *v)
{
    req->error = 0;
    req->eof = 0;
    req->done_bytes = 0;
    req->error_offset = 0;
    req->retries = req->retries_eintr = req->retries_eagain = 0;
    req->status = 0;
    req->detail[0] = '\0';
    req->attempts = 0;
    req->proxied = req->proxy_failed = 0;   /* no_proxy and demand are the caller's */
    req->proxy_why[0] = '\0';
    req->requests = 0;
    uint64_t total = 0;
    for (int i = 0; i < req->iovcnt; i++)
        total += req->iov[i].iov_len;
    req->total = total;
    req->target = t;
    req->validators = v;
    req->object_size = object_size;
    req->next = NULL;
    pthread_mutex_lock(&r->lock);
    if (r->tail)
        r->tail->next = req;
    else
        r->head = req;
    r->tail = req;
    pthread_mutex_unlock(&r->lock);
}

void sl_rio_flush(sl_rio *r)
{
    curl_multi_wakeup(r->multi);
}

void sl_rio_abort(sl_rio *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    r->abort = 1;
    pthread_mutex_unlock(&r->lock);
    curl_multi_wakeup(r->multi);
}

void sl_rio_destroy(sl_rio *r)
{
    if (!r)
        return;
    if (r->started) {
        pthread_mutex_lock(&r->lock);
        r->quit = 1;
        pthread_mutex_unlock(&r->lock);
        curl_multi_wakeup(r->multi);
        pthread_join(r->thread, NULL);
    }
    for (unsigned i = 0; i < r->neasy; i++)
        curl_easy_cleanup(r->easy[i]);
    free(r->easy);
    if (r->multi)
        curl_multi_cleanup(r->multi);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

#endif
