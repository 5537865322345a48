/* remote_fixture.h: real servers for the remote tests, started and stopped
 * by the test itself, on 127.0.0.1 and a free port:
 *  - nginx (Debian's package) as an unprivileged foreground process
 *    (-p TMP -c CONF -g 'daemon off;'), serving a folder, and /real/ the
 *    real-world corpus when present;
 *  - the tests' own fault server (tests/remote_fault_server.py, Python's
 *    ThreadingHTTPServer), which serves a folder with ranges and misbehaves
 *    on request (see that file).
 * Header-only so that the shared test library stays as it is. */
#ifndef SLUICE_TEST_REMOTE_FIXTURE_H
#define SLUICE_TEST_REMOTE_FIXTURE_H

#include "util.h"

#include "sluice.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct rf_server {
    pid_t pid;
    unsigned port;
    char *dir;          /* its own temp dir (config, logs) */
    char base[64];      /* http://127.0.0.1:PORT */
    unsigned tls_port;  /* nginx: https on this port, 0 when no certificate could be made */
    char tls_base[64];  /* https://127.0.0.1:TLS_PORT */
    char ca_file[512];  /* the self-signed certificate it serves (its own CA) */
} rf_server;

static inline unsigned rf_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &len) != 0) {
        if (s >= 0)
            close(s);
        return 0;
    }
    close(s);
    return ntohs(a.sin_port);
}

static inline int rf_can_connect(unsigned port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0;
    if (s >= 0)
        close(s);
    return ok;
}

/* In a server's child, before exec: the server gets SIGTERM when the test
 * that started it dies without its teardown (a sanitizer's abort, a
 * crash, a skip's exit), so no server outlives its test. parent: the
 * test's pid, taken before fork (it may be gone already). */
static inline void rf_die_with_parent(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        _exit(0);
}

/* Starts bin with argv (argv[0] first, NULL last) in a child whose
 * stdout and stderr go to /dev/null and that dies with the test
 * (rf_die_with_parent); returns its pid (-1 when fork failed). */
static inline pid_t rf_spawn_quiet(const char *bin, char *const argv[])
{
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        rf_die_with_parent(parent);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv(bin, argv);
        _exit(127);
    }
    return pid;
}

/* Waits until the port accepts (up to 10 s) or the child died. */
static inline int rf_wait_ready(rf_server *sv)
{
    for (int i = 0; i < 1000; i++) {
        if (rf_can_connect(sv->port))
            return 1;
        int st;
        if (waitpid(sv->pid, &st, WNOHANG) == sv->pid) {
            sv->pid = 0;
            return 0;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static inline void rf_stop(rf_server *sv)
{
    if (sv->pid > 0) {
        kill(sv->pid, SIGTERM);
        int st;
        for (int i = 0; i < 300 && waitpid(sv->pid, &st, WNOHANG) == 0; i++) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (waitpid(sv->pid, &st, WNOHANG) == 0) {
            kill(sv->pid, SIGKILL);
            waitpid(sv->pid, &st, 0);
        }
    }
    sv->pid = 0;
    if (sv->dir) {
        tu_rmtree(sv->dir);
        free(sv->dir);
        sv->dir = NULL;
    }
}

/* The installed program name (/usr/sbin, /usr/bin, /usr/local/sbin) in
 * path (returned), or NULL. */
static inline const char *rf_binary(const char *name, char *path, size_t cap)
{
    static const char *const where[] = {"/usr/sbin", "/usr/bin", "/usr/local/sbin"};
    for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
        snprintf(path, cap, "%s/%s", where[i], name);
        if (access(path, X_OK) == 0)
            return path;
    }
    return NULL;
}

static inline const char *rf_nginx_binary(void)
{
    static char path[256];
    return rf_binary("nginx", path, sizeof path);
}

/* Starts nginx serving root at / (and real, when not NULL, at /real/;
 * /norange/ serves root with Range ignored). 1 on success, 0 when nginx
 * is missing or does not start (why says). */
static inline int rf_nginx_start(rf_server *sv, const char *root, const char *real, char *why,
                                 size_t cap)
{
    memset(sv, 0, sizeof *sv);
    const char *bin = rf_nginx_binary();
    if (!bin) {
        snprintf(why, cap, "nginx is not installed (apt-get install -y nginx)");
        return 0;
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        sv->dir = tu_tmpdir();
        sv->port = rf_free_port();
        chmod(sv->dir, 0755);
        char *conf = tu_join(sv->dir, "nginx.conf"), text[4096], cmd[2048], tls[1024] = "";
        /* https: a self-signed certificate for 127.0.0.1, made by openssl */
        snprintf(cmd, sizeof cmd,
                 "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 "
                 "-addext subjectAltName=IP:127.0.0.1 -keyout '%s/key.pem' -out '%s/cert.pem' "
                 ">/dev/null 2>&1", sv->dir, sv->dir);
        sv->tls_port = system(cmd) == 0 ? rf_free_port() : 0;
        if (sv->tls_port) {
            snprintf(sv->ca_file, sizeof sv->ca_file, "%s/cert.pem", sv->dir);
            snprintf(tls, sizeof tls,
                     "  server {\n"
                     "    listen 127.0.0.1:%u ssl;\n"
                     "    ssl_certificate %s/cert.pem; ssl_certificate_key %s/key.pem;\n"
                     "    location / { root %s; }\n"
                     "  }\n", sv->tls_port, sv->dir, sv->dir, root);
        }
        /* Workers of a master run by root would run as nobody: keep them
         * the same user, so that they read what the test wrote. */
        snprintf(text, sizeof text,
                 "%s"
                 "worker_processes 2;\n"
                 "pid %s/nginx.pid;\n"
                 "error_log %s/error.log warn;\n"
                 "events { worker_connections 512; }\n"
                 "http {\n"
                 "  log_format req '$status $http_range $request_uri';\n"
                 "  access_log %s/access.log req;\n"
                 "  log_format sent '$body_bytes_sent';\n"
                 "  access_log %s/bytes.log sent;\n"
                 "  log_format conn '$connection';\n"
                 "  access_log %s/conn.log conn;\n"
                 "  client_body_temp_path %s/cb; proxy_temp_path %s/px;\n"
                 "  fastcgi_temp_path %s/fc; uwsgi_temp_path %s/uw; scgi_temp_path %s/sc;\n"
                 "  default_type application/octet-stream;\n"
                 "  sendfile on; tcp_nopush on; keepalive_requests 1000000;\n"
                 "  server {\n"
                 "    listen 127.0.0.1:%u;\n"
                 "    location / { root %s; }\n"
                 "    location /norange/ { alias %s/; max_ranges 0; }\n"
                 "%s%s%s"
                 "  }\n"
                 "%s"
                 "}\n",
                 geteuid() == 0 ? "user root;\n" : "", sv->dir, sv->dir, sv->dir, sv->dir, sv->dir,
                 sv->dir, sv->dir,
                 sv->dir, sv->dir, sv->dir, sv->port, root, root,
                 real ? "    location /real/ { alias " : "", real ? real : "",
                 real ? "/; }\n" : "", tls);
        tu_write_file(conf, text, strlen(text));
        char *const argv[] = {(char *)bin, "-e", "stderr", "-p", sv->dir, "-c", conf, "-g",
                              "daemon off;", NULL};
        pid_t pid = rf_spawn_quiet(bin, argv);
        free(conf);
        sv->pid = pid;
        if (pid > 0 && rf_wait_ready(sv)) {
            snprintf(sv->base, sizeof sv->base, "http://127.0.0.1:%u", sv->port);
            if (sv->tls_port) {
                for (int i = 0; i < 500 && !rf_can_connect(sv->tls_port); i++) {
                    struct timespec ts = {0, 10000000};
                    nanosleep(&ts, NULL);
                }
                snprintf(sv->tls_base, sizeof sv->tls_base, "https://127.0.0.1:%u", sv->tls_port);
            }
            return 1;
        }
        rf_stop(sv);
    }
    snprintf(why, cap, "nginx did not start (5 tries)");
    return 0;
}

/* nginx: its access log so far (a line a request, "STATUS RANGE
 * URI[?QUERY]", written as each completes), malloc'd, NUL-terminated. */
static inline char *rf_log(const rf_server *sv)
{
    char *path = tu_join(sv->dir, "access.log");
    size_t len = 0;
    char *text = tu_read_file(path, &len);
    free(path);
    char *s = malloc(len + 1);
    if (s && text)
        memcpy(s, text, len);
    if (s)
        s[text ? len : 0] = '\0';
    free(text);
    return s;
}

/* nginx: the requests it logged so far (a line each, "STATUS RANGE URI";
 * written when each completes, so wait for the client to be done). */
static inline size_t rf_requests(const rf_server *sv)
{
    char *path = tu_join(sv->dir, "access.log");
    size_t len = 0, n = 0;
    char *text = tu_read_file(path, &len);
    for (size_t i = 0; text && i < len; i++)
        n += text[i] == '\n';
    free(text);
    free(path);
    return n;
}

/* nginx: the body bytes it sent so far, over every request logged. */
static inline uint64_t rf_bytes_sent(const rf_server *sv)
{
    char *path = tu_join(sv->dir, "bytes.log");
    size_t len = 0;
    char *text = tu_read_file(path, &len);
    uint64_t total = 0, v = 0;
    for (size_t i = 0; text && i < len; i++) {
        if (text[i] >= '0' && text[i] <= '9')
            v = v * 10 + (uint64_t)(text[i] - '0');
        else if (text[i] == '\n') {
            total += v;
            v = 0;
        }
    }
    free(text);
    free(path);
    return total;
}

/* nginx: how many connections served the requests logged from the
 * from-th on (a line each, its connection's serial number). */
static inline size_t rf_connections(const rf_server *sv, size_t from)
{
    char *path = tu_join(sv->dir, "conn.log");
    size_t len = 0, line = 0, n = 0;
    char *text = tu_read_file(path, &len);
    unsigned long seen[4096];
    for (size_t i = 0; text && i < len; line++) {
        unsigned long c = strtoul(text + i, NULL, 10);
        while (i < len && text[i] != '\n')
            i++;
        i++;
        if (line < from)
            continue;
        size_t k = 0;
        while (k < n && seen[k] != c)
            k++;
        if (k == n && n < sizeof seen / sizeof seen[0])
            seen[n++] = c;
    }
    free(text);
    free(path);
    return n;
}

static inline const char *rf_squid_binary(void)
{
    static char path[256];
    return rf_binary("squid", path, sizeof path);
}

/* Starts squid (Debian's package) as a caching forward proxy on a free
 * port, foreground (-N), its config, cache, logs and pid file in its own
 * temp dir; parent_port non-zero: every miss goes to that port as a
 * parent proxy (cache_peer, never direct), else to the origin. Its
 * settings for a model's range requests (docs/remote.md says why):
 * range_offset_limit -1 (a range miss fetches the whole object, which is
 * then cached: squid caches no partial object), collapsed_forwarding (the
 * concurrent misses of one object wait for the one fetch), quick_abort_min
 * -1 (that fetch completes whoever hangs up). As root, squid's workers run
 * as cache_effective_user: the dir is handed to that user. 1 on success,
 * 0 (why says) when squid is missing or does not start. */
static inline int rf_squid_start(rf_server *sv, unsigned parent_port, char *why, size_t cap)
{
    memset(sv, 0, sizeof *sv);
    const char *bin = rf_squid_binary();
    if (!bin) {
        snprintf(why, cap, "squid is not installed (apt-get install -y squid)");
        return 0;
    }
    const char *user = geteuid() == 0 ? (getpwnam("proxy") ? "proxy" : "nobody") : NULL;
    for (int attempt = 0; attempt < 3; attempt++) {
        sv->dir = tu_tmpdir();
        sv->port = rf_free_port();
        chmod(sv->dir, 0755);
        char *conf = tu_join(sv->dir, "squid.conf"), text[4096], peer[256] = "", owner[128] = "";
        if (parent_port)
            snprintf(peer, sizeof peer, "cache_peer 127.0.0.1 parent %u 0 no-query no-digest "
                     "default\nnever_direct allow all\n", parent_port);
        if (user)
            snprintf(owner, sizeof owner, "cache_effective_user %s\n", user);
        snprintf(text, sizeof text,
                 "http_port 127.0.0.1:%u\n"
                 "%s"
                 "pid_filename %s/squid.pid\n"
                 "cache_dir ufs %s/cache 2048 16 64\n"
                 "cache_mem 256 MB\n"
                 "maximum_object_size 4 GB\n"
                 "maximum_object_size_in_memory 512 MB\n"
                 "range_offset_limit -1\n"
                 "quick_abort_min -1 KB\n"
                 "collapsed_forwarding on\n"
                 "refresh_pattern . 1440 100%% 10080\n"
                 "access_log stdio:%s/access.log\n"
                 "cache_log %s/cache.log\n"
                 "cache_store_log none\n"
                 "coredump_dir %s\n"
                 "netdb_filename none\n"
                 "shutdown_lifetime 0 seconds\n"
                 "http_access allow all\n"
                 "%s",
                 sv->port, owner, sv->dir, sv->dir, sv->dir, sv->dir, sv->dir, peer);
        tu_write_file(conf, text, strlen(text));
        if (user) {
            struct passwd *pw = getpwnam(user);
            if (pw && chown(sv->dir, pw->pw_uid, pw->pw_gid) != 0) {
                /* then squid says why in its log */
            }
        }
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "'%s' -N -z -f '%s' >/dev/null 2>&1", bin, conf);
        int made = system(cmd) == 0;
        char *const argv[] = {(char *)bin, "-N", "-f", conf, NULL};
        pid_t pid = made ? rf_spawn_quiet(bin, argv) : -1;
        free(conf);
        sv->pid = pid;
        if (pid > 0 && rf_wait_ready(sv)) {
            snprintf(sv->base, sizeof sv->base, "http://127.0.0.1:%u", sv->port);
            return 1;
        }
        rf_stop(sv);
    }
    snprintf(why, cap, "squid did not start (3 tries)");
    return 0;
}

/* Starts python3 script PORT ROOT on port (one try): 1 when it accepts. */
static inline int rf_script_start_at(rf_server *sv, const char *script, const char *root,
                                     unsigned port)
{
    memset(sv, 0, sizeof *sv);
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    sv->port = port;
    char arg[16];
    snprintf(arg, sizeof arg, "%u", port);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        rf_die_with_parent(parent);
        execlp(py, py, script, arg, root, (char *)NULL);
        _exit(127);
    }
    sv->pid = pid;
    if (pid > 0 && rf_wait_ready(sv)) {
        snprintf(sv->base, sizeof sv->base, "http://127.0.0.1:%u", sv->port);
        return 1;
    }
    rf_stop(sv);
    return 0;
}

/* The fault server: python3 tests/remote_fault_server.py PORT ROOT. */
static inline int rf_fault_start(rf_server *sv, const char *script, const char *root, char *why,
                                 size_t cap)
{
    for (int attempt = 0; attempt < 5; attempt++)
        if (rf_script_start_at(sv, script, root, rf_free_port()))
            return 1;
    snprintf(why, cap, "the fault server (python3 %s) did not start", script);
    return 0;
}

/* Whether port is free on 127.0.0.1 now. */
static inline int rf_port_free(unsigned port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s >= 0)
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    if (s >= 0)
        close(s);
    return ok;
}

/* Two free ports P and P0 = 10 P + d (d a digit), so that
 * "http://127.0.0.1:P" is a prefix of "http://127.0.0.1:P0": a look-alike
 * of an endpoint, for the tests of what is sent to which host. P is taken
 * from 1100-6499 (unprivileged, below the ephemeral range); 1, or 0 when
 * no pair was free in 200 tries. */
static inline int rf_lookalike_ports(unsigned *p, unsigned *p0)
{
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 200; tries++) {
        seed = seed * 1103515245u + 12345u;
        unsigned a = 1100 + (seed >> 8) % 5400, d = (seed >> 4) % 10;
        if (rf_port_free(a) && rf_port_free(a * 10 + d)) {
            *p = a;
            *p0 = a * 10 + d;
            return 1;
        }
    }
    return 0;
}

/* One plain HTTP GET of path on the server, for the fault server's
 * control requests; returns the body (malloc'd) or NULL. */
static inline char *rf_get(const rf_server *sv, const char *path)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        if (s >= 0)
            close(s);
        return NULL;
    }
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(s, req, (size_t)n) != n) {
        close(s);
        return NULL;
    }
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = read(s, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(s);
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    char *out = strdup(body ? body + 4 : "");
    free(buf);
    return out;
}

/* Whether the library was built with libcurl (-DSLUICE_WITH_CURL=OFF:
 * remote locations are SLUICE_E_UNSUPPORTED). */
static inline int rf_have_curl(void)
{
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 1;
    o.remote_connect_timeout_ms = 200;
    sluice_model *m = NULL;
    char loc[64];
    snprintf(loc, sizeof loc, "http://127.0.0.1:%u/x.safetensors", rf_free_port());
    int rc = sluice_open(loc, &o, &m);
    sluice_close(m);
    return rc != SLUICE_E_UNSUPPORTED;
}

/* Exits 77 when the library was built without libcurl. */
static inline void rf_skip_without_curl(void)
{
    if (!rf_have_curl()) {
        fprintf(stderr, "skipped: this library was built without libcurl\n");
        exit(77);
    }
}

#endif
