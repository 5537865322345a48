// The relay's key of a client address for its per-address caps
// (relay::address_key): the address without its port; an IPv6 address
// as its /64, so that one host, which holds a whole /64, is one address.
#include "relay.h"

#include <cstdio>
#include <string>

int main()
{
    const struct {
        const char *peer, *key;
    } cases[] = {
        {"ipv4:127.0.0.1:5555", "ipv4:127.0.0.1"},
        {"ipv4:10.1.2.3:1", "ipv4:10.1.2.3"},
        {"ipv6:[2001:db8:1:2::1]:5555", "ipv6:[2001:db8:1:2::]/64"},
        {"ipv6:[2001:db8:1:2:ffff:eeee:dddd:cccc]:7", "ipv6:[2001:db8:1:2::]/64"},
        {"ipv6:[2001:db8:1:3::1]:5555", "ipv6:[2001:db8:1:3::]/64"},
        {"ipv6:[::1]:5555", "ipv6:[::]/64"},
        {"unknown", "unknown"},
    };
    int fails = 0;
    for (const auto &c : cases) {
        std::string got = relay::address_key(c.peer);
        bool ok = got == c.key;
        printf("%s - %s -> %s%s%s\n", ok ? "ok" : "FAIL", c.peer, got.c_str(),
               ok ? "" : ", want ", ok ? "" : c.key);
        fails += !ok;
    }
    return fails ? 1 : 0;
}
