/* metrics_http.c: sluice_metrics_serve and its server (see sluice.h), on
 * libmicrohttpd when the build found it (SLUICE_HAVE_MICROHTTPD), else
 * stubs that say SLUICE_E_UNSUPPORTED.
 *
 * One internal polling thread of libmicrohttpd answers every connection;
 * a scrape renders the models under the server's own mutex (which add and
 * remove take), each model's lock held only for its snapshot. Nothing
 * here is global: the server is the caller's object.
 *
 * libmicrohttpd's timeout is of idleness only: a client that sends a
 * header line every few seconds keeps its connection forever, and 32 of
 * them took every slot. So a second thread (the deadline watchdog) cuts
 * every connection whose request has not been answered within
 * SL_SERVE_DEADLINE_S of its accept or of its previous answer: it knows
 * each connection's socket from the connection notifier and shuts it down
 * (shutdown, not close: libmicrohttpd sees the end of the stream and
 * closes it itself). libmicrohttpd calls the "closed" notifier before it
 * closes the socket, and the watchdog shuts a socket down only while it
 * is on the list under the lock, so it never touches a reused descriptor.
 */
#include "api/model.h"

#include "counters/metrics.h"

#include <stdlib.h>
#include <string.h>

#define SL_SERVE_MAX_MODELS 64

#ifdef SLUICE_HAVE_MICROHTTPD

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#define SL_SERVE_CONNECTIONS 32
#define SL_SERVE_PER_ADDRESS 8       /* connections from one client address */
#define SL_SERVE_REQUEST_BYTES (16u << 10)
#define SL_SERVE_TIMEOUT_S 5         /* idleness */
#define SL_SERVE_DEADLINE_S 5        /* a whole request, see above */
#define SL_SERVE_TICK_MS 200         /* the watchdog's period */

/* One open connection, for the deadline watchdog. */
struct sl_conn {
    struct sl_conn *prev, *next;
    int fd;
    int cut;                       /* shut down already */
    int64_t since_ns;              /* accepted, or its last answer sent */
};

struct sluice_metrics_server {
    struct MHD_Daemon *d;
    pthread_mutex_t lock;          /* models */
    sluice_model *models[SL_SERVE_MAX_MODELS];
    size_t n;
    size_t last_need;              /* the last rendering's size: the next
                                      one starts there, rendered once */
    unsigned port;
    pthread_mutex_t conns_lock;    /* conns, stopping */
    pthread_cond_t wake;           /* the watchdog's sleep (CLOCK_MONOTONIC) */
    struct sl_conn *conns;
    int stopping;
    pthread_t watchdog;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The connection notifier: each connection on the watchdog's list from
 * its accept to just before its socket is closed. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    sluice_metrics_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct sl_conn *k = ci ? calloc(1, sizeof *k) : NULL;
        *socket_context = k;
        if (!k) { /* cannot be bounded: refused */
            if (ci)
                shutdown(ci->connect_fd, SHUT_RDWR);
            return;
        }
        k->fd = ci->connect_fd;
        k->since_ns = mono_ns();
        pthread_mutex_lock(&s->conns_lock);
        k->next = s->conns;
        if (s->conns)
            s->conns->prev = k;
        s->conns = k;
        pthread_mutex_unlock(&s->conns_lock);
        return;
    }
    struct sl_conn *k = *socket_context;
    if (!k)
        return;
    pthread_mutex_lock(&s->conns_lock);
    if (k->prev)
        k->prev->next = k->next;
    else
        s->conns = k->next;
    if (k->next)
        k->next->prev = k->prev;
    pthread_mutex_unlock(&s->conns_lock);
    free(k);
    *socket_context = NULL;
}

/* The request notifier: an answer sent restarts the connection's clock. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    sluice_metrics_server *s = cls;
    (void)con_cls;
    (void)toe;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct sl_conn *k = ci ? ci->socket_context : NULL;
    if (!k)
        return;
    pthread_mutex_lock(&s->conns_lock);
    k->since_ns = mono_ns();
    pthread_mutex_unlock(&s->conns_lock);
}

static void *watchdog_main(void *arg)
{
    sluice_metrics_server *s = arg;
    const int64_t limit = (int64_t)SL_SERVE_DEADLINE_S * 1000000000;
    pthread_mutex_lock(&s->conns_lock);
    while (!s->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += SL_SERVE_TICK_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->wake, &s->conns_lock, &until);
        int64_t now = mono_ns();
        for (struct sl_conn *k = s->conns; k; k = k->next)
            if (!k->cut && now - k->since_ns > limit) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = 1;
            }
    }
    pthread_mutex_unlock(&s->conns_lock);
    return NULL;
}

/* The watchdog's lock, its condition variable on CLOCK_MONOTONIC, and the
 * thread; 0 or -1 (nothing left behind). */
static int watchdog_init(sluice_metrics_server *s)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return -1;
    int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&s->wake, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok)
        return -1;
    if (pthread_mutex_init(&s->conns_lock, NULL) != 0) {
        pthread_cond_destroy(&s->wake);
        return -1;
    }
    return 0;
}

static void watchdog_stop(sluice_metrics_server *s)
{
    pthread_mutex_lock(&s->conns_lock);
    s->stopping = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->conns_lock);
    pthread_join(s->watchdog, NULL);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             char *body, size_t len, int owned)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned status, const char *msg)
{
    return reply(c, status, "text/plain; charset=utf-8", (char *)msg, strlen(msg), 0);
}

/* Renders the server's models into a malloc'd buffer (*len bytes). */
static char *render_all(sluice_metrics_server *s, int om, size_t *len)
{
    pthread_mutex_lock(&s->lock);
    char *buf = NULL;
    size_t cap = s->last_need ? s->last_need + s->last_need / 8 + 256 : 16384, need = 0;
    int rc = SLUICE_OK;
    if (s->n == 0) {
        static const char eof[] = "# EOF\n";
        buf = malloc(sizeof eof);
        if (buf)
            memcpy(buf, eof, sizeof eof);
        *len = om ? sizeof eof - 1 : 0;
        pthread_mutex_unlock(&s->lock);
        return buf;
    }
    for (int tries = 0; tries < 4; tries++) {
        char *nb = realloc(buf, cap);
        if (!nb)
            break;
        buf = nb;
        rc = sluice_metrics_write_models(s->models, s->n, buf, cap, &need,
                                         om ? SLUICE_METRICS_OPENMETRICS : SLUICE_METRICS_PROMETHEUS);
        if (rc != SLUICE_E_BUFFER)
            break;
        cap = need + need / 4 + 256;
    }
    if (rc == SLUICE_OK)
        s->last_need = need;
    pthread_mutex_unlock(&s->lock);
    if (rc != SLUICE_OK) {
        free(buf);
        return NULL;
    }
    *len = need - 1;
    return buf;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state)
{
    sluice_metrics_server *s = cls;
    /* The method first: no path takes another, so 405 (with Allow)
     * anywhere, answered at once, the body never read. */
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET /metrics\n");
    if (strcmp(url, "/metrics") != 0)
        return text(c, MHD_HTTP_NOT_FOUND, "not found: only /metrics is served\n");
    /* Answered on the second call, once the request is read: a response
     * queued on the first is an early one, after which libmicrohttpd
     * closes the connection instead of keeping it alive. */
    if (!*state) {
        /* a body on a GET: not read, answered now, the connection closed */
        const char *length =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if ((length && strcmp(length, "0") != 0) ||
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
            return text(c, MHD_HTTP_BAD_REQUEST, "bad request: GET /metrics has no body\n");
        *state = s;
        return MHD_YES;
    }
    if (*upload_size) { /* cannot be (no length, no chunks): dropped */
        *upload_size = 0;
        return MHD_YES;
    }
    const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    int om = sluice_metrics_format_for_accept(accept) == SLUICE_METRICS_OPENMETRICS;
    size_t len = 0;
    char *body = render_all(s, om, &len);
    if (!body)
        return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "metrics could not be rendered\n");
    return reply(c, MHD_HTTP_OK,
                 om ? "application/openmetrics-text; version=1.0.0; charset=utf-8"
                    : "text/plain; version=0.0.4; charset=utf-8",
                 body, len, 1);
}

SLUICE_API int sluice_metrics_serve(const char *addr, unsigned port, sluice_metrics_server **out)
{
    if (!out)
        return SLUICE_E_INVAL;
    *out = NULL;
    if (port > 65535)
        return SLUICE_E_INVAL;
    if (!addr)
        addr = "127.0.0.1";
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&sa;
    if (inet_pton(AF_INET, addr, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, addr, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        return SLUICE_E_INVAL;
    }
    sluice_metrics_server *s = calloc(1, sizeof *s);
    if (!s)
        return SLUICE_E_NOMEM;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s);
        return SLUICE_E_NOMEM;
    }
    if (watchdog_init(s) != 0) {
        pthread_mutex_destroy(&s->lock);
        free(s);
        return SLUICE_E_NOMEM;
    }
    int rc = SLUICE_OK;
    s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, handle, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)SL_SERVE_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)SL_SERVE_PER_ADDRESS,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SL_SERVE_REQUEST_BYTES,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SL_SERVE_TIMEOUT_S,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    if (!s->d)
        rc = SLUICE_E_IO;
    else if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0)
        rc = SLUICE_E_NOMEM;
    if (rc != SLUICE_OK) {
        if (s->d)
            MHD_stop_daemon(s->d);
        pthread_cond_destroy(&s->wake);
        pthread_mutex_destroy(&s->conns_lock);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return rc;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : port;
    *out = s;
    return SLUICE_OK;
}

SLUICE_API int sluice_metrics_server_add(sluice_metrics_server *s, sluice_model *model)
{
    if (!s || sl_model_usable(model) < 0)
        return SLUICE_E_INVAL;
    int rc = SLUICE_OK;
    pthread_mutex_lock(&s->lock);
    size_t k = 0;
    for (; k < s->n; k++)
        if (s->models[k] == model || !strcmp(s->models[k]->metrics_label, model->metrics_label))
            break;
    if (k < s->n)
        rc = s->models[k] == model ? SLUICE_OK : SLUICE_E_INVAL;
    else if (s->n == SL_SERVE_MAX_MODELS)
        rc = SLUICE_E_INVAL;
    else
        s->models[s->n++] = model;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

SLUICE_API int sluice_metrics_server_remove(sluice_metrics_server *s, sluice_model *model)
{
    if (!s)
        return SLUICE_E_INVAL;
    int rc = SLUICE_E_NOT_FOUND;
    pthread_mutex_lock(&s->lock);
    for (size_t k = 0; k < s->n; k++)
        if (s->models[k] == model) {
            memmove(&s->models[k], &s->models[k + 1], (s->n - k - 1) * sizeof *s->models);
            s->n--;
            rc = SLUICE_OK;
            break;
        }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

SLUICE_API unsigned sluice_metrics_server_port(const sluice_metrics_server *s)
{
    return s ? s->port : 0;
}

SLUICE_API void sluice_metrics_server_free(sluice_metrics_server *s)
{
    if (!s)
        return;
    watchdog_stop(s);
    MHD_stop_daemon(s->d); /* the connections' notifiers take conns_lock */
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->conns_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

#else /* !SLUICE_HAVE_MICROHTTPD */

SLUICE_API int sluice_metrics_serve(const char *addr, unsigned port, sluice_metrics_server **out)
{
    (void)addr;
    (void)port;
    if (out)
        *out = NULL;
    return out ? SLUICE_E_UNSUPPORTED : SLUICE_E_INVAL;
}

SLUICE_API int sluice_metrics_server_add(sluice_metrics_server *s, sluice_model *model)
{
    (void)s;
    (void)model;
    return SLUICE_E_INVAL;
}

SLUICE_API int sluice_metrics_server_remove(sluice_metrics_server *s, sluice_model *model)
{
    (void)s;
    (void)model;
    return SLUICE_E_INVAL;
}

SLUICE_API unsigned sluice_metrics_server_port(const sluice_metrics_server *s)
{
    (void)s;
    return 0;
}

SLUICE_API void sluice_metrics_server_free(sluice_metrics_server *s)
{
    (void)s;
}

#endif
