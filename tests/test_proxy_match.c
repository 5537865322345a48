/* test_proxy_match.c: which requests go through the proxy
 * (sl_remote_proxy_for, sluice.h "Proxies"): no_proxy read as libcurl's
 * noproxy.c reads it, since sluice's answer is the one libcurl follows
 * (CURLOPT_NOPROXY ""): names match themselves and their subdomains,
 * never a longer name; trailing dots, case and leading dots do not
 * matter; an IP address matches an entry equal to it or a range (CIDR)
 * holding it, never by a suffix of its text; IPv6 in brackets. */
#include "util.h"

#include "base/error.h"
#include "sources/remote.h"
#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

/* Whether url goes through the proxy with no_proxy set to list. */
static int proxied(const char *list, const char *url)
{
    setenv("no_proxy", list, 1);
    sluice_options o;
    sluice_options_init(&o);
    o.http_proxy = "http://user:pw@proxy.example:3128";
    sl_remote_cfg *c = NULL;
    sl_err err = {0};
    assert_int_equal(sl_remote_cfg_new(&o, &c, &err), SLUICE_OK);
    int through = sl_remote_proxy_for(c, url) != NULL;
    sl_remote_cfg_free(c);
    unsetenv("no_proxy");
    return through;
}

static void test_names(void **state)
{
    (void)state;
    assert_false(proxied("example.com", "https://example.com/m.safetensors"));
    assert_false(proxied("example.com", "https://www.example.com/m"));
    assert_true(proxied("example.com", "https://badexample.com/m"));
    assert_true(proxied("www.example.com", "https://example.com/m"));
    assert_false(proxied(".example.com", "https://example.com/m"));
    assert_false(proxied("EXAMPLE.com", "https://Example.COM:8443/m"));
    assert_false(proxied("example.com", "https://user:pw@example.com/m"));
    assert_false(proxied("a.org, example.com", "http://example.com/m?x=1"));
    assert_true(proxied("a.org, example.com", "http://example.org/m"));
    assert_false(proxied("*", "http://anything.test/m"));
    /* trailing dots, either side */
    assert_false(proxied("example.com.", "https://example.com/m"));
    assert_false(proxied("example.com", "https://example.com./m"));
    assert_false(proxied("example.com", "https://www.example.com.:443/m"));
}

static void test_addresses(void **state)
{
    (void)state;
    assert_false(proxied("127.0.0.1", "http://127.0.0.1:8080/m"));
    assert_true(proxied("0.0.1", "http://127.0.0.1/m"));       /* not a suffix */
    assert_true(proxied("0.0.1", "http://10.0.0.1/m"));
    assert_false(proxied("127.0.0.0/8", "http://127.1.2.3/m"));
    assert_true(proxied("127.0.0.0/8", "http://128.0.0.1/m"));
    assert_false(proxied("10.0.0.0/9", "http://10.127.0.1/m"));
    assert_true(proxied("10.0.0.0/9", "http://10.128.0.1/m"));
    assert_false(proxied("::1", "http://[::1]:8080/m"));
    assert_false(proxied("0:0:0:0:0:0:0:1", "http://[::1]/m"));
    assert_false(proxied("[::1]", "http://[::1]/m"));
    assert_false(proxied("fd00::/8", "http://[fd12::5]/m"));
    assert_true(proxied("fd00::/8", "http://[fe80::5]/m"));
    assert_true(proxied("1", "http://[::1]/m"));
    assert_true(proxied("example.com", "http://127.0.0.1/m"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
