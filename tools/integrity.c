/* integrity.c: see integrity.h. */
#include "integrity.h"

#include "jsonout.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define IG_BLOCK ((size_t)8 << 20)

double ig_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ig_quote(FILE *out, const char *name, size_t len)
{
    json_string(out, name, len);
}

/* "512M", "4G", "1.5G", "4096" (bytes; K, M, G, T are powers of 1024). */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0)
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul != 1 && *end == 'i') /* "MiB" */
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mul >= 18446744073709551616.0)
        return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end || errno || v > UINT32_MAX || s[0] == '-')
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int ig_loader_option(const char *cmd, int argc, char **argv, int *i, sluice_options *o)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--direct")) {
        o->flags |= SLUICE_F_DIRECT;
        return 1;
    }
    if (!strcmp(a, "--pread")) {
        o->flags |= SLUICE_F_FORCE_PREAD;
        return 1;
    }
    int which = !strcmp(a, "--pool") ? 1 : !strcmp(a, "--qd") ? 2 : !strcmp(a, "--threads") ? 3 : 0;
    if (!which)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "sluice %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    int bad = which == 1 ? parse_size(v, &o->pool_bytes)
            : which == 2 ? parse_u32(v, &o->queue_depth)
                         : parse_u32(v, &o->hash_threads);
    if (bad) {
        fprintf(stderr, "sluice %s: %s: bad value '%s'\n", cmd, a, v);
        return -1;
    }
    return 1;
}

int ig_file_option(const char *cmd, int argc, char **argv, int *i, const char *name,
                   const char *alias, const char **value)
{
    const char *a = argv[*i];
    if (strcmp(a, name) != 0 && !(alias && !strcmp(a, alias)))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "sluice %s: %s needs a file\n", cmd, a);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

/* ---------------------------------------------------------------- file hashing */

struct ig_filehash {
    size_t nfiles;
    char **paths;
    ig_file_result *results;
    _Atomic size_t next;
    progress *progress;
    pthread_t *threads;
    size_t nthreads;
};

static void hash_one(ig_filehash *fh, size_t i, unsigned char *buf, EVP_MD_CTX *ctx)
{
    ig_file_result *r = &fh->results[i];
    int fd = open(fh->paths[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        r->error = errno;
        return;
    }
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        r->error = ENOMEM;
        close(fd);
        return;
    }
    uint64_t off = 0;
    for (;;) {
        ssize_t n = pread(fd, buf, IG_BLOCK, (off_t)off);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            r->error = errno;
            close(fd);
            return;
        }
        if (n == 0)
            break;
        EVP_DigestUpdate(ctx, buf, (size_t)n);
        off += (uint64_t)n;
        progress_add(fh->progress, (uint64_t)n);
    }
    close(fd);
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, r->digest, &len);
    r->bytes = off;
}

static void *hash_thread(void *arg)
{
    ig_filehash *fh = arg;
    unsigned char *buf = malloc(IG_BLOCK);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    for (;;) {
        size_t i = atomic_fetch_add(&fh->next, 1);
        if (i >= fh->nfiles)
            break;
        if (!buf || !ctx)
            fh->results[i].error = ENOMEM;
        else
            hash_one(fh, i, buf, ctx);
    }
    EVP_MD_CTX_free(ctx);
    free(buf);
    return NULL;
}

void ig_filehash_free(ig_filehash *fh)
{
    if (!fh)
        return;
    ig_filehash_wait(fh);
    free(fh->paths); /* borrowed strings: only the array is ours */
    free(fh->results);
    free(fh->threads);
    free(fh);
}

ig_filehash *ig_filehash_start(const sluice_model *model, progress *p)
{
    ig_filehash *fh = calloc(1, sizeof *fh);
    if (!fh)
        goto nomem;
    fh->nfiles = sluice_file_count(model);
    fh->progress = p;
    atomic_init(&fh->next, 0);
    size_t n = fh->nfiles ? fh->nfiles : 1;
    fh->paths = calloc(n, sizeof *fh->paths);
    fh->results = calloc(n, sizeof *fh->results);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t want = fh->nfiles < (size_t)(cpus > 0 ? cpus : 1) ? fh->nfiles : (size_t)(cpus > 0 ? cpus : 1);
    fh->threads = calloc(want ? want : 1, sizeof *fh->threads);
    if (!fh->paths || !fh->results || !fh->threads)
        goto nomem;
    for (size_t i = 0; i < fh->nfiles; i++) {
        struct sluice_file_info info;
        if (sluice_file_info(model, i, &info) != SLUICE_OK)
            goto nomem;
        fh->paths[i] = (char *)info.path;
    }
    for (size_t t = 0; t < want; t++) {
        if (pthread_create(&fh->threads[t], NULL, hash_thread, fh) != 0)
            break;
        fh->nthreads++;
    }
    if (want && !fh->nthreads) {
        fprintf(stderr, "sluice: cannot start a hashing thread\n");
        ig_filehash_free(fh);
        return NULL;
    }
    return fh;
nomem:
    fprintf(stderr, "sluice: out of memory\n");
    ig_filehash_free(fh);
    return NULL;
}

const ig_file_result *ig_filehash_wait(ig_filehash *fh)
{
    for (size_t t = 0; t < fh->nthreads; t++)
        pthread_join(fh->threads[t], NULL);
    fh->nthreads = 0;
    return fh->results;
}
