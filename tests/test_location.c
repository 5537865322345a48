/* test_location.c: a location split once into its parts
 * (base/location.h): kind, scheme, host, port, path, query, the form
 * messages show (no user:password@, "?..." for a query or fragment), and
 * how much of it names the object; a local path as given, whole. Then
 * whether a location is the Hub's (sl_hf_on_hub), read from its parts and
 * the endpoint's, parsed once. */
#include "util.h"

#include "base/error.h"
#include "base/location.h"
#include "sources/remote.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_url_with_credentials_and_query(void **state)
{
    const char *given = "https://user:pa:ss@example.com:8443/m/model.safetensors?X-Amz-Signature=S#f";
    sl_location *l = sl_location_new(given);
    assert_non_null(l);
    assert_int_equal(l->kind, SL_LOC_HTTP);
    assert_string_equal(l->given, given);
    assert_string_equal(l->scheme, "https");
    assert_string_equal(l->host, "example.com");
    assert_int_equal(l->port, 8443);
    assert_string_equal(l->path, "/m/model.safetensors");
    assert_non_null(l->query);
    assert_string_equal(l->query, "X-Amz-Signature=S");
    assert_string_equal(l->shown, "https://example.com:8443/m/model.safetensors?...");
    assert_int_equal(l->name_len, strlen("https://user:pa:ss@example.com:8443/m/model.safetensors"));
    assert_string_equal(l->userinfo, "user:pa:ss");
    assert_true(sl_location_remote(l));
    char buf[256];
    assert_string_equal(sl_location_shown_of(given, buf, sizeof buf), l->shown);
    assert_string_equal(sl_location_host_of(given, buf, sizeof buf), "example.com");
    assert_int_equal(sl_location_name_len_of(given), l->name_len);
    sl_location_free(l);
    (void)state;
}

static void test_kinds(void **state)
{
    struct {
        const char *given;
        sl_loc_kind kind;
        const char *host, *path, *shown;
        unsigned port;
        int query;
    } cases[] = {
        {"http://[::1]:9000/a.safetensors", SL_LOC_HTTP, "::1", "/a.safetensors",
         "http://[::1]:9000/a.safetensors", 9000, 0},
        {"s3://bucket/dir/m.safetensors", SL_LOC_S3, "bucket", "/dir/m.safetensors",
         "s3://bucket/dir/m.safetensors", 0, 0},
        {"hf://org/name@main/m.safetensors", SL_LOC_HUB, "org", "/name@main/m.safetensors",
         "hf://org/name@main/m.safetensors", 0, 0},
        {"http://h?token=T", SL_LOC_HTTP, "h", "", "http://h?...", 0, 1},
        /* a local path is shown as given and all of it is its name, '?',
         * '@' and "://" further in included */
        {"/models/a?b@c.safetensors", SL_LOC_LOCAL, "", "/models/a?b@c.safetensors",
         "/models/a?b@c.safetensors", 0, 0},
        {"rel/x://y", SL_LOC_LOCAL, "", "rel/x://y", "rel/x://y", 0, 0},
        {"", SL_LOC_LOCAL, "", "", "", 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        sl_location *l = sl_location_new(cases[k].given);
        assert_non_null(l);
        assert_int_equal(l->kind, cases[k].kind);
        assert_string_equal(l->host, cases[k].host);
        assert_string_equal(l->path, cases[k].path);
        assert_string_equal(l->shown, cases[k].shown);
        assert_int_equal(l->port, cases[k].port);
        assert_int_equal(l->query != NULL, cases[k].query);
        assert_null(l->userinfo); /* none given ('@' in a local path is no user) */
        if (cases[k].kind == SL_LOC_LOCAL)
            assert_int_equal(l->name_len, strlen(cases[k].given));
        sl_location_free(l);
    }
    assert_null(sl_location_new(NULL));
    assert_false(sl_location_remote(NULL));
    sl_location_free(NULL);
    (void)state;
}

/* A shown form never longer than fits: cut, never overrun. */
static void test_shown_of_small_buffer(void **state)
{
    char buf[8];
    sl_location_shown_of("http://user:pw@host.example/x?y", buf, sizeof buf);
    assert_string_equal(buf, "http://");
    (void)state;
}

/* A password with a raw '@' in it: the authority's last '@' ends the
 * user information (as set_proxy splits a proxy URL), so no piece of the
 * password is shown or taken for the host (a Dragonfly daemon's address
 * checked for loopback, and named in the refusal). */
static void test_at_in_password(void **state)
{
    char buf[256];
    const char *u = "http://user:p@ss@127.0.0.1:65001/x?sig";
    sl_location_shown_of(u, buf, sizeof buf);
    assert_string_equal(buf, "http://127.0.0.1:65001/x?...");
    sl_location_host_of(u, buf, sizeof buf);
    assert_string_equal(buf, "127.0.0.1");
    sl_location *l = sl_location_new(u);
    assert_non_null(l);
    assert_string_equal(l->host, "127.0.0.1");
    assert_int_equal(l->port, 65001);
    assert_null(strstr(l->shown, "ss"));
    sl_location_free(l);
    (void)state;
}

/* Which locations are the Hub's: an hf:// one, or a URL under the Hub's
 * endpoint ($HF_ENDPOINT, parsed once) with the same scheme, host and
 * port and the same user information (none when the endpoint has none);
 * the endpoint's path must be followed by '/' or end the location, query
 * and all. An endpoint written with user:password@ (a mirror of the Hub
 * behind basic auth) is reached by the URLs made from its text, which
 * carry it: those are the Hub's (before, none was, and the API's requests
 * went out with the caller's own servers' token). */
static void test_on_hub(void **state)
{
    static const struct {
        const char *loc;
        int hub;
    } cases[] = {
        {"hf://org/name", 1},
        {"hf://org/name@main/m.safetensors", 1},
        {"https://hub.example/mirror/org/name/resolve/main/m.safetensors", 1},
        {"https://hub.example/mirror/org/name/resolve/main/m.safetensors?x=1", 1},
        {"https://hub.example/mirror", 1},
        {"https://hub.example/mirror?x=1", 0},
        {"https://hub.example/mirror#f", 0},
        {"https://hub.example/mirrors/a", 0},
        {"https://hub.example/other/a", 0},
        {"https://hub.example", 0},
        {"https://u:p@hub.example/mirror/a", 0},
        {"http://hub.example/mirror/a", 0},
        {"https://hub.example:8443/mirror/a", 0},
        {"https://hub.example.evil/mirror/a", 0},
        {"s3://hub.example/mirror/a", 0},
        {"/hub.example/mirror/a", 0},
    };
    const char *old = getenv("HF_ENDPOINT");
    char *saved = old ? strdup(old) : NULL;
    setenv("HF_ENDPOINT", "https://hub.example/mirror/", 1);
    sluice_options o;
    sluice_options_init(&o);
    sl_remote_cfg *c = NULL;
    sl_err err = {0};
    assert_int_equal(sl_remote_cfg_new(&o, &c, &err), SLUICE_OK);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        sl_location *l = sl_location_new(cases[k].loc);
        assert_non_null(l);
        if (sl_hf_on_hub(c, l) != cases[k].hub)
            fail_msg("%s: on the Hub %d, expected %d", cases[k].loc, !cases[k].hub, cases[k].hub);
        sl_location_free(l);
    }
    assert_false(sl_hf_on_hub(c, NULL));
    sl_remote_cfg_free(c);
    static const struct {
        const char *loc;
        int hub;
    } with_user[] = {
        {"https://u:p@hub.example/mirror/api/models/org/name", 1},
        {"https://u:p@hub.example/mirror", 1},
        {"https://hub.example/mirror/a", 0},
        {"https://u:q@hub.example/mirror/a", 0},
        {"https://u@hub.example/mirror/a", 0},
        {"https://u:p@x@hub.example/mirror/a", 0},
        {"https://u:p@hub.example.evil/mirror/a", 0},
        {"https://u:p@hub.example/mirrors/a", 0},
        {"hf://org/name", 1},
    };
    setenv("HF_ENDPOINT", "https://u:p@hub.example/mirror", 1);
    assert_int_equal(sl_remote_cfg_new(&o, &c, &err), SLUICE_OK);
    for (size_t k = 0; k < sizeof with_user / sizeof *with_user; k++) {
        sl_location *l = sl_location_new(with_user[k].loc);
        assert_non_null(l);
        if (sl_hf_on_hub(c, l) != with_user[k].hub)
            fail_msg("%s: on the Hub %d, expected %d", with_user[k].loc, !with_user[k].hub,
                     with_user[k].hub);
        sl_location_free(l);
    }
    sl_remote_cfg_free(c);
    if (saved)
        setenv("HF_ENDPOINT", saved, 1);
    else
        unsetenv("HF_ENDPOINT");
    free(saved);
    (void)state;
}

/* A port is decimal digits, 1 to 65535, or nothing after the ':' (the
 * scheme's default, as RFC 3986 and libcurl read it): each other one is
 * noted (bad_port) and refused by sl_location_check, which names the
 * location shown (no user:password@, no query) and says what is wrong.
 * Only an http(s):// URL's authority has a port (an s3:// bucket and an
 * hf:// organisation do not; a local path is a path). */
static void test_ports(void **state)
{
    static const struct {
        const char *given;
        unsigned port;
        const char *bad;    /* in bad_port and the refusal, or NULL: taken */
        const char *shown;
    } cases[] = {
        {"http://hf.co:x/m.safetensors", 0, "is not a number", "http://hf.co:x/m.safetensors"},
        {"https://host:65536/m", 0, "is over 65535", "https://host:65536/m"},
        {"https://host:4294967377/m", 0, "is over 65535", NULL},   /* 2^32 + 81: no wrap */
        {"https://host:99999999999999999999999/m", 0, "is over 65535", NULL},
        {"http://host:0/m", 0, "is 0", "http://host:0/m"},
        {"http://host:00/m", 0, "is 0", NULL},
        {"http://[::1]:99999/m", 0, "is over 65535", "http://[::1]:99999/m"},
        {"http://host:+80/m", 0, "is not a number", NULL},
        {"http://host:-1/m", 0, "is not a number", NULL},
        {"http://host: 80/m", 0, "is not a number", NULL},
        {"http://host:80:81/m", 0, "is not a number", NULL},
        {"http://host:8x?q=1", 0, "is not a number", "http://host:8x?..."},
        {"http://u:s3cr3t@host:8x/m?sig=t0p", 0, "is not a number", "http://host:8x/m?..."},
        {"http://host:/m", 0, NULL, "http://host:/m"},   /* the scheme's default */
        {"http://[::1]:/m", 0, NULL, NULL},
        {"http://host:", 0, NULL, NULL},
        {"http://host/m", 0, NULL, NULL},
        {"http://host:1/m", 1, NULL, NULL},
        {"http://host:65535/m", 65535, NULL, NULL},
        {"http://host:080/m", 80, NULL, NULL},   /* leading zeros are digits */
        {"http://host:00000000000000000000443/m", 443, NULL, NULL},
        {"http://[::1]:9000/m", 9000, NULL, NULL},
        {"s3://bucket:x/key", 0, NULL, NULL},
        {"hf://org:x/name", 0, NULL, NULL},
        {"/models/m:x/a.safetensors", 0, NULL, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        sl_location *l = sl_location_new(cases[k].given);
        assert_non_null(l);
        if (l->port != cases[k].port)
            fail_msg("%s: port %u, expected %u", cases[k].given, l->port, cases[k].port);
        if (cases[k].shown)
            assert_string_equal(l->shown, cases[k].shown);
        sl_err err = {0};
        int rc = sl_location_check(l, "fallback[2]", &err);
        if (!cases[k].bad) {
            if (l->bad_port || rc != SLUICE_OK)
                fail_msg("%s: refused (%s)", cases[k].given, err.msg);
            sl_location_free(l);
            continue;
        }
        if (!l->bad_port || !strstr(l->bad_port, cases[k].bad) || rc != SLUICE_E_INVAL)
            fail_msg("%s: bad_port \"%s\", check %d", cases[k].given,
                     l->bad_port ? l->bad_port : "(none)", rc);
        char want[300];
        snprintf(want, sizeof want, "fallback[2] %s: its port %s", l->shown, cases[k].bad);
        if (strncmp(err.msg, want, strlen(want)) != 0 || strstr(err.msg, "s3cr3t") ||
            strstr(err.msg, "t0p"))
            fail_msg("%s: \"%s\"", cases[k].given, err.msg);
        sl_location_free(l);
    }
    sl_err err = {0};
    assert_int_equal(sl_location_check(NULL, NULL, &err), SLUICE_OK);
    /* without what, the message starts with the location */
    sl_location *l = sl_location_new("http://h:x/m");
    assert_int_equal(sl_location_check(l, NULL, &err), SLUICE_E_INVAL);
    assert_memory_equal(err.msg, "http://h:x/m: its port is not a number", 38);
    sl_location_free(l);
    (void)state;
}

/* A proxy URL by the same rule: host[:port] without a scheme (libcurl's
 * http:// proxy), any scheme's port; named shown, without its password. */
static void test_proxy_ports(void **state)
{
    static const struct {
        const char *url;
        const char *bad, *shown;
    } cases[] = {
        {"proxy.example:3128", NULL, NULL},
        {"http://proxy.example:3128/", NULL, NULL},
        {"http://proxy.example:", NULL, NULL},
        {"proxy.example", NULL, NULL},
        {"[::1]:3128", NULL, NULL},
        {"proxy.example:x", "is not a number", "proxy.example:x"},
        {"u:s3cr3t@proxy.example:99999", "is over 65535", "proxy.example:99999"},
        {"socks5://u:s3cr3t@proxy.example:0", "is 0", "socks5://proxy.example:0"},
        {"http://proxy.example:3l28/?t0p", "is not a number", "http://proxy.example:3l28/?..."},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        sl_err err = {0};
        int rc = sl_location_check_proxy(cases[k].url, "proxy ($https_proxy)", &err);
        if (!cases[k].bad) {
            if (rc != SLUICE_OK)
                fail_msg("%s: refused (%s)", cases[k].url, err.msg);
            continue;
        }
        char want[300];
        snprintf(want, sizeof want, "proxy ($https_proxy) %s: its port %s", cases[k].shown,
                 cases[k].bad);
        if (rc != SLUICE_E_INVAL || strncmp(err.msg, want, strlen(want)) != 0 ||
            strstr(err.msg, "s3cr3t") || strstr(err.msg, "t0p"))
            fail_msg("%s: %d \"%s\"", cases[k].url, rc, err.msg);
    }
    (void)state;
}

/* Saves an environment variable (malloc'd copy or NULL) and sets or
 * unsets it; restore_env puts it back. */
static char *swap_env(const char *name, const char *value)
{
    const char *old = getenv(name);
    char *saved = old ? strdup(old) : NULL;
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return saved;
}

static void restore_env(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* sluice_open refuses a port no request could use in any location it is
 * given, before anything is asked of a server: the model's, a mirror's,
 * manifest_path's, signature_path's, the proxy's (option or environment)
 * and $HF_ENDPOINT's (for an hf:// model): SLUICE_E_INVAL, naming it shown
 * (no credentials, no query) and what is wrong with its port. (Before,
 * each was left to libcurl: SLUICE_E_REMOTE once a request failed.) */
static void test_open_refuses_bad_ports(void **state)
{
    static const char *const envs[] = {"HF_ENDPOINT", "http_proxy", "https_proxy",
                                       "HTTPS_PROXY", "all_proxy", "ALL_PROXY"};
    char *saved[sizeof envs / sizeof *envs];
    for (size_t k = 0; k < sizeof envs / sizeof *envs; k++)
        saved[k] = swap_env(envs[k], NULL);
    /* port 1 of this host: refused at once, were anything asked of it */
    static const char *const model = "http://127.0.0.1:1/m.safetensors";
    static const struct {
        const char *path, *mirror, *manifest, *signature, *proxy, *env_proxy, *hf_endpoint;
        const char *want;
    } cases[] = {
        {"http://user:s3cr3t@127.0.0.1:x/m.safetensors?X-Amz-Signature=t0p", NULL, NULL, NULL,
         NULL, NULL, NULL, "http://127.0.0.1:x/m.safetensors?...: its port is not a number"},
        {"https://127.0.0.1:65536/m.safetensors", NULL, NULL, NULL, NULL, NULL, NULL,
         "https://127.0.0.1:65536/m.safetensors: its port is over 65535"},
        {"http://127.0.0.1:0/m.safetensors", NULL, NULL, NULL, NULL, NULL, NULL,
         "http://127.0.0.1:0/m.safetensors: its port is 0"},
        {"http://[::1]:99999/m.safetensors", NULL, NULL, NULL, NULL, NULL, NULL,
         "http://[::1]:99999/m.safetensors: its port is over 65535"},
        {model, "http://u:s3cr3t@127.0.0.1:x/m.safetensors?token=t0p", NULL, NULL, NULL, NULL,
         NULL, "fallback[0] http://127.0.0.1:x/m.safetensors?...: its port is not a number"},
        {model, NULL, "http://127.0.0.1:65536/m.safetensors.manifest.json", NULL, NULL, NULL,
         NULL, "manifest_path http://127.0.0.1:65536/m.safetensors.manifest.json: its port "
               "is over 65535"},
        {model, NULL, NULL, "http://127.0.0.1:0/model.sig", NULL, NULL, NULL,
         "signature_path http://127.0.0.1:0/model.sig: its port is 0"},
        {model, NULL, NULL, NULL, "http://u:s3cr3t@127.0.0.1:3l28", NULL, NULL,
         "proxy (http_proxy option) http://127.0.0.1:3l28: its port is not a number"},
        {"https://127.0.0.1:1/m.safetensors", NULL, NULL, NULL, NULL, "u:s3cr3t@127.0.0.1:0",
         NULL, "proxy ($https_proxy) 127.0.0.1:0: its port is 0"},
        {"hf://org/name", NULL, NULL, NULL, NULL, NULL, "http://u:s3cr3t@127.0.0.1:99999/hub",
         "$HF_ENDPOINT http://127.0.0.1:99999/hub: its port is over 65535"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        sluice_options o;
        sluice_options_init(&o);
        o.remote_attempts = 1;
        o.remote_connect_timeout_ms = 2000;
        const char *mirrors[1] = {cases[k].mirror};
        o.fallback = cases[k].mirror ? mirrors : NULL;
        o.fallback_count = cases[k].mirror ? 1 : 0;
        o.manifest_path = cases[k].manifest;
        o.signature_path = cases[k].signature;
        static const char *const cas[] = {"/nonexistent/ca.pem"};
        o.trusted_cas = cases[k].signature ? cas : NULL;   /* what a signature_path asks */
        o.ntrusted_cas = cases[k].signature ? 1 : 0;
        o.http_proxy = cases[k].env_proxy ? NULL : cases[k].proxy ? cases[k].proxy : "";
        if (cases[k].env_proxy)
            setenv("https_proxy", cases[k].env_proxy, 1);
        if (cases[k].hf_endpoint)
            setenv("HF_ENDPOINT", cases[k].hf_endpoint, 1);
        sluice_model *m = NULL;
        int rc = sluice_open(cases[k].path, &o, &m);
        const char *msg = sluice_errmsg(m);
        if (rc != SLUICE_E_INVAL || !strstr(msg, cases[k].want) || strstr(msg, "s3cr3t") ||
            strstr(msg, "t0p"))
            fail_msg("row %zu: %d \"%s\", expected SLUICE_E_INVAL \"%s\"", k, rc, msg,
                     cases[k].want);
        sluice_close(m);
        unsetenv("https_proxy");
        unsetenv("HF_ENDPOINT");
    }
    /* no_proxy "*": no request ever takes a proxy (redirects included),
     * so the environment's proxy is not checked (before: refused) */
    char *np = swap_env("no_proxy", "*"), *np_upper = swap_env("NO_PROXY", NULL);
    setenv("https_proxy", "u:s3cr3t@127.0.0.1:0", 1);
    setenv("http_proxy", "http://127.0.0.1:x", 1);
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 1;
    o.remote_connect_timeout_ms = 2000;
    sluice_model *m = NULL;
    int rc = sluice_open("https://127.0.0.1:1/m.safetensors", &o, &m);
    if (rc == SLUICE_OK || rc == SLUICE_E_INVAL || strstr(sluice_errmsg(m), "proxy"))
        fail_msg("no_proxy *: %d \"%s\"", rc, sluice_errmsg(m));
    sluice_close(m);
    unsetenv("https_proxy");
    unsetenv("http_proxy");
    restore_env("no_proxy", np);
    restore_env("NO_PROXY", np_upper);
    for (size_t k = 0; k < sizeof envs / sizeof *envs; k++)
        restore_env(envs[k], saved[k]);
    (void)state;
}

/* A password holding an unescaped '/', '?' or '#' ends the authority
 * early: "alice:s3cr3t" reads as host "alice" and port "s3cr3t". Its port
 * is refused, and the refusal, like the shown form, names neither the
 * user nor any piece of the password: an '@' after the authority is
 * taken for such a password, and only the scheme is shown (before: the
 * shown form and the refusal held "alice:s3cr3t/x@..." whole, or
 * "alice:s3cr3t"). */
static void test_bad_port_hides_misplaced_password(void **state)
{
    static const char *const given[] = {
        "http://alice:s3cr3t/x@127.0.0.1:8080/m.safetensors",
        "https://alice:s3cr3t?x@127.0.0.1:8080/m.safetensors",
        "http://alice:s3cr3t#x@127.0.0.1:8080/m.safetensors",
    };
    for (size_t k = 0; k < sizeof given / sizeof *given; k++) {
        sl_location *l = sl_location_new(given[k]);
        assert_non_null(l);
        sl_err err = {0};
        int rc = sl_location_check(l, "fallback[0]", &err);
        if (rc != SLUICE_E_INVAL || strstr(err.msg, "s3cr3t") || strstr(err.msg, "alice") ||
            strstr(l->shown, "s3cr3t") || strstr(l->shown, "alice"))
            fail_msg("%s: %d \"%s\", shown \"%s\"", given[k], rc, err.msg, l->shown);
        sl_location_free(l);
    }
    static const char *const proxies[] = {"http://alice:s3cr3t/x@proxy.example:3128",
                                          "alice:s3cr3t#x@proxy.example:3128"};
    for (size_t k = 0; k < sizeof proxies / sizeof *proxies; k++) {
        sl_err err = {0};
        int rc = sl_location_check_proxy(proxies[k], "proxy ($https_proxy)", &err);
        if (rc != SLUICE_E_INVAL || strstr(err.msg, "s3cr3t") || strstr(err.msg, "alice"))
            fail_msg("%s: %d \"%s\"", proxies[k], rc, err.msg);
    }
    /* an '@' in a path after a good port is a path's */
    sl_location *l = sl_location_new("https://host:8443/org/name@main/m.safetensors");
    assert_string_equal(l->shown, "https://host:8443/org/name@main/m.safetensors");
    sl_location_free(l);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_with_credentials_and_query),
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_shown_of_small_buffer),
        cmocka_unit_test(test_at_in_password),
        cmocka_unit_test(test_on_hub),
        cmocka_unit_test(test_ports),
        cmocka_unit_test(test_proxy_ports),
        cmocka_unit_test(test_bad_port_hides_misplaced_password),
        cmocka_unit_test(test_open_refuses_bad_ports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
