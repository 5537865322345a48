/* cgroup.c: the memory limit of this process's control group (see
 * cgroup.h). A container's limit is what the kernel enforces, by killing
 * the process, whatever the host has: a pool sized for the host's memory
 * in a smaller container fills, and the process dies, with no error a
 * caller could see. So the default pool follows the limit, and a pool
 * larger than the limit is refused at open (api.c). Nothing here fails:
 * what cannot be read is no limit. */
#include "base/cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* v1's "unlimited" is the page counter's maximum in bytes (2^63 rounded
 * down to a page); anything this large is no limit. */
#define NO_LIMIT_ABOVE ((uint64_t)1 << 62)

/* Up to cap - 1 bytes of path, NUL-terminated; the length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = 0;
    while (n < cap - 1) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return (ssize_t)n;
}

/* The limit in file dir/name: 1 and *v, or 0 (absent, "max", unlimited,
 * not a number). */
static int limit_in(const char *dir, const char *name, uint64_t *v)
{
    char path[4096], buf[64];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        read_small(path, buf, sizeof buf) <= 0)
        return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (end == buf || errno || buf[0] == '-' || (*end && *end != '\n') || x >= NO_LIMIT_ABOVE)
        return 0;
    *v = (uint64_t)x;
    return 1;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Walks from base + rel (else base alone, when that is not a directory)
 * up to base, keeping the lowest limit of file name in *best. */
static void walk(const char *base, const char *rel, const char *name, uint64_t *best, int *found,
                 char *where, size_t wlen)
{
    char dir[4096];
    size_t blen = strlen(base);
    if (snprintf(dir, sizeof dir, "%s%s", base, rel) >= (int)sizeof dir || !is_dir(dir))
        snprintf(dir, sizeof dir, "%s", base);
    /* no trailing slash (a PATH of "/"): the loop below strips components */
    size_t len = strlen(dir);
    while (len > blen && dir[len - 1] == '/')
        dir[--len] = '\0';
    for (;;) {
        uint64_t v;
        if (limit_in(dir, name, &v) && (!*found || v < *best)) {
            *best = v;
            *found = 1;
            if (where && wlen)
                snprintf(where, wlen, "%s/%s", dir, name);
        }
        if (len <= blen)
            break;
        while (len > blen && dir[len - 1] != '/')
            len--;
        while (len > blen && dir[len - 1] == '/')
            len--;
        dir[len] = '\0';
    }
}

/* Whether the comma-separated list has the memory controller. */
static int has_memory(const char *list, size_t n)
{
    const char *p = list, *end = list + n;
    while (p < end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        size_t k = c ? (size_t)(c - p) : (size_t)(end - p);
        if (k == 6 && !memcmp(p, "memory", 6))
            return 1;
        p += k + 1;
    }
    return 0;
}

int sl_cgroup_memory_limit(const char *self, const char *root, uint64_t *limit, char *where,
                           size_t wlen)
{
    char buf[8192];
    if (where && wlen)
        where[0] = '\0';
    if (!self || !root || read_small(self, buf, sizeof buf) <= 0)
        return 0;
    uint64_t best = 0;
    int found = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/')
            continue;
        const char *path = c2 + 1;
        if (c1 == line + 1 && line[0] == '0' && c2 == c1 + 1) {
            walk(root, path, "memory.max", &best, &found, where, wlen);   /* v2 */
        } else if (has_memory(c1 + 1, (size_t)(c2 - c1 - 1))) {
            char base[4096];
            if (snprintf(base, sizeof base, "%s/memory", root) < (int)sizeof base)
                walk(base, path, "memory.limit_in_bytes", &best, &found, where, wlen);
        }
    }
    if (found)
        *limit = best;
    return found;
}

uint64_t sl_pool_default(uint64_t limit)
{
    const uint64_t mib = (uint64_t)1 << 20;
    if (!limit || limit / 4 >= SL_POOL_DEFAULT)
        return SL_POOL_DEFAULT;
    uint64_t p = limit / 4 / mib * mib;
    return p ? p : mib;
}
