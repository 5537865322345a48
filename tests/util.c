/* util.c: see util.h. Failures here abort the test program: a test that
 * cannot set itself up has nothing to say. */
#include "util.h"
#include "cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what, const char *path)
{
    fprintf(stderr, "test setup: %s %s: %s\n", what, path ? path : "", strerror(errno));
    abort();
}

char *tu_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    char *path = tu_join(base, "sluice-test-XXXXXX");
    if (!mkdtemp(path))
        die("mkdtemp", path);
    return path;
}

char *tu_disk_tmpdir(char *why, size_t len)
{
    char build[4096];
    snprintf(build, sizeof build, "%s/test-tmp", SLUICE_BINARY_DIR);
    (void)mkdir(build, 0755);
    const char *env = getenv("TMPDIR");
    const char *cand[] = {env && *env ? env : NULL, build, "/var/tmp", "/tmp"};
    size_t at = 0;
    if (len)
        why[0] = 0;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        if (!cand[i])
            continue;
        int fd = open(cand[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        const char *fs = fd < 0 ? strerror(errno) : sl_file_id_untrusted_fs(fd);
        if (fd >= 0)
            close(fd);
        if (!fs && access(cand[i], W_OK) != 0)
            fs = "not writable";
        if (!fs) {
            char *path = tu_join(cand[i], "sluice-test-XXXXXX");
            if (mkdtemp(path))
                return path;
            fs = strerror(errno);
            free(path);
        }
        if (at < len)
            at += (size_t)snprintf(why + at, len - at, "%s%s: %s", at ? ", " : "", cand[i], fs);
    }
    return NULL;
}

char *tu_disk_or_tmpdir(void)
{
    char why[8];
    char *d = tu_disk_tmpdir(why, sizeof why);
    return d ? d : tu_tmpdir();
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

void tu_rmtree(const char *path)
{
    if (path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *tu_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p)
        die("malloc", NULL);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void write_all(int fd, const void *data, size_t len, const char *path)
{
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            die("write", path);
        }
        p += w;
        len -= (size_t)w;
    }
}

void tu_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die("open", path);
    write_all(fd, data, len, path);
    if (close(fd) != 0)
        die("close", path);
}

void tu_write_safetensors(const char *path, const char *header, const void *data, size_t data_len)
{
    size_t hlen = strlen(header);
    size_t total = 8 + hlen + data_len;
    unsigned char *buf = malloc(total ? total : 1);
    if (!buf)
        die("malloc", NULL);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, header, hlen);
    if (data)
        memcpy(buf + 8 + hlen, data, data_len);
    else
        for (size_t i = 0; i < data_len; i++)
            buf[8 + hlen + i] = (unsigned char)((i * 131 + 7) & 0xff);
    tu_write_file(path, buf, total);
    free(buf);
}

void *tu_read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    void *buf = tu_pread_range(path, 0, (size_t)st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return buf;
}

void tu_copy_file(const char *from, const char *to)
{
    size_t len;
    void *p = tu_read_file(from, &len);
    if (!p)
        abort();
    tu_write_file(to, p, len);
    free(p);
}

void *tu_pread_range(const char *path, uint64_t offset, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die("open", path);
    char *buf = malloc(len + 1);
    if (!buf)
        die("malloc", NULL);
    buf[len] = '\0';
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("pread", path);
        got += (size_t)r;
    }
    close(fd);
    return buf;
}

const char *tu_real_data(void)
{
    struct stat st;
    if (stat(SLUICE_REAL_DATA, &st) == 0 && S_ISDIR(st.st_mode))
        return SLUICE_REAL_DATA;
    /* Said here once for every caller, which then skips: a clone without
     * ../shared beside it runs every other test. */
    fprintf(stderr, "skipped: the real-world corpus %s is absent (../shared/data/real "
            "beside the checkout)\n", SLUICE_REAL_DATA);
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

size_t tu_list_safetensors(const char *dir, char ***out)
{
    DIR *d = opendir(dir);
    if (!d)
        die("opendir", dir);
    char **list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **grown = realloc(list, cap * sizeof *list);
            if (!grown)
                die("realloc", NULL);
            list = grown;
        }
        list[n++] = tu_join(dir, e->d_name);
    }
    closedir(d);
    if (n)
        qsort(list, n, sizeof *list, cmp_str);
    *out = list;
    return n;
}

void tu_free_list(char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

long tu_status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0)
            v = strtol(line + kl + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

void tu_reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}
