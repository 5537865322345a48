/* synth.c: `sluice synth`: writes a synthetic model with the tensor names
 * and shapes of a real architecture, pseudo-random weights, the Hugging
 * Face sharded layout, and its manifest, written by `sluice manifest`'s own
 * code (cmd_manifest) over the files just written, so that a synth model's
 * manifest is every bit one a user would write: version 2, chunk digests,
 * header digests. The weights are random bits (some BF16/F16/F32 values are
 * NaN or Inf), or with --values finite values of the spread a trained
 * model's weights have, for examples that compute with them.
 *
 * The files are laid out as the reference writer lays them out: an 8-byte
 * little-endian header length, a JSON header with "__metadata__" first and
 * the tensors in data order, padded with spaces so the data starts 8-byte
 * aligned, tensors sorted by dtype alignment (descending) then name. The
 * bytes of a tensor depend only on the seed and the tensor's position in
 * the architecture, not on sharding, so two models written with the same
 * seed and different --shards hold the same tensors.
 */
#include "cmd.h"
#include "presets.h"
#include "progress.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SYN_BUF_BYTES ((size_t)16 << 20)

typedef struct syn_tensor {
    sl_preset_tensor t;
    size_t order;              /* position in the architecture: seeds the bytes */
    unsigned shard;
    uint64_t nbytes;
    uint64_t begin;            /* data_offsets in its shard */
} syn_tensor;

typedef struct syn_shard {
    char name[64];
    syn_tensor **members;      /* in file order */
    size_t count;
    uint64_t size;             /* whole file */
} syn_shard;

/* A growable string for the JSON we write. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* ---------------------------------------------------------------- bytes */

/* xoshiro256** seeded through splitmix64: fast, and good enough that no two
 * tensors share bytes. */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static void xoshiro_seed(uint64_t s[4], uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&x);
}

/* n bytes of the stream; n is a multiple of 8 except at a tensor's end, so
 * the bytes do not depend on where buffers are cut. */
static void gen_bytes(uint64_t s[4], uint8_t *dst, size_t n)
{
    for (; n >= 8; n -= 8, dst += 8) {
        uint64_t w = xoshiro_next(s);
        memcpy(dst, &w, 8);
    }
    if (n) {
        uint64_t w = xoshiro_next(s);
        memcpy(dst, &w, n);
    }
}

/* One value of about N(0, 0.02^2) from one draw: the sum of four uniform
 * 16-bit parts (Irwin-Hall, within 3.5 sigma), the spread of a trained
 * model's weights, so that an example can compute with them as they are. */
static float value_of(uint64_t r)
{
    double sum = 0;
    for (int k = 0; k < 4; k++)
        sum += (double)((r >> (16 * k)) & 0xffff) / 65536.0;
    return (float)((sum - 2.0) * (0.02 / 0.57735026918962576));
}

/* f's nearest BF16 (round to nearest even; f is finite). */
static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f's nearest F16 (round to nearest even; |f| < 65504, so no overflow). */
static uint16_t f16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (exp >= 31)
        return sign | 0x7c00u;
    if (exp <= 0) {     /* a subnormal F16, or zero */
        if (exp < -10)
            return sign;
        mant |= 0x800000u;
        int shift = 14 - exp;
        uint32_t half = mant >> shift, rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1u)))
            half++;
        return sign | (uint16_t)half;
    }
    uint32_t half = ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        half++;     /* a carry into the exponent is the right rounding */
    return sign | (uint16_t)half;
}

/* n bytes of values (value_of) in dtype BF16, F16 or F32, one draw per
 * element; n is a multiple of the element's size. */
static void gen_values(uint64_t s[4], uint8_t *dst, size_t n, const char *dtype)
{
    if (!strcmp(dtype, "F32")) {
        for (; n >= 4; n -= 4, dst += 4) {
            float v = value_of(xoshiro_next(s));
            memcpy(dst, &v, 4);
        }
        return;
    }
    int bf16 = !strcmp(dtype, "BF16");
    for (; n >= 2; n -= 2, dst += 2) {
        float v = value_of(xoshiro_next(s));
        uint16_t h = bf16 ? bf16_of(v) : f16_of(v);
        memcpy(dst, &h, 2);
    }
}

/* ---------------------------------------------------------------- output */

typedef struct syn_out {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t used;
    progress *bar;             /* NULL unless stderr is a terminal */
} syn_out;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int flush_out(syn_out *o)
{
    if (!o->used)
        return 0;
    const uint8_t *p = o->buf;
    size_t left = o->used;
    while (left) {
        ssize_t w = write(o->fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "sluice synth: write %s: %s\n", o->path, strerror(errno));
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    progress_add(o->bar, o->used);
    o->used = 0;
    return 0;
}

static int put(syn_out *o, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len) {
        size_t n = SYN_BUF_BYTES - o->used;
        if (n > len)
            n = len;
        memcpy(o->buf + o->used, p, n);
        o->used += n;
        p += n;
        len -= n;
        if (o->used == SYN_BUF_BYTES && flush_out(o) < 0)
            return -1;
    }
    return 0;
}

/* Writes t's bytes: random bits, or with values (the dtype's name) values
 * (gen_values). A piece is a multiple of 8 bytes but at the tensor's end,
 * so the bytes do not depend on where the buffer is cut. */
static int put_tensor(syn_out *o, syn_tensor *t, uint64_t seed, const char *values)
{
    uint64_t s[4];
    xoshiro_seed(s, seed, t->order + 1);
    uint64_t left = t->nbytes;
    while (left) {
        size_t space = SYN_BUF_BYTES - o->used;
        size_t n = left < space ? (size_t)left : (space & ~(size_t)7);
        if (!n) {
            if (flush_out(o) < 0)
                return -1;
            continue;
        }
        if (values)
            gen_values(s, o->buf + o->used, n, values);
        else
            gen_bytes(s, o->buf + o->used, n);
        o->used += n;
        left -= n;
        if (o->used == SYN_BUF_BYTES && flush_out(o) < 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- layout */

static const struct {
    const char *name;
    unsigned bytes;
} dtypes[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4}};

static int cmp_name(const void *a, const void *b)
{
    const syn_tensor *x = *(syn_tensor *const *)a, *y = *(syn_tensor *const *)b;
    return strcmp(x->t.name, y->t.name);
}

/* Splits the tensors, in architecture order, into nshards runs of about
 * equal bytes, none empty. */
static void assign_shards(syn_tensor *ts, size_t n, unsigned nshards, uint64_t total)
{
    uint64_t before = 0;
    unsigned prev = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = total ? (uint64_t)((unsigned __int128)before * nshards / total) : 0;
        if (s > prev + 1)
            s = prev + 1;           /* never skip a shard */
        if (s < prev)
            s = prev;
        if (s + (n - i) < nshards)  /* leave a tensor for each shard still to come */
            s = nshards - (n - i);
        ts[i].shard = (unsigned)s;
        prev = (unsigned)s;
        before += ts[i].nbytes;
    }
}

/* The header of one shard, padded with spaces to a multiple of 8; fills
 * each member's begin. */
static char *shard_header(syn_shard *sh, const char *dtype, size_t *len)
{
    sbuf b = {0};
    uint64_t off = 0;
    sb_add(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < sh->count; i++) {
        syn_tensor *t = sh->members[i];
        t->begin = off;
        sb_add(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->t.name, dtype);
        for (uint32_t d = 0; d < t->t.ndim; d++)
            sb_add(&b, "%s%llu", d ? "," : "", (unsigned long long)t->t.shape[d]);
        sb_add(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
               (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    sb_add(&b, "}");
    while (!b.oom && b.len % 8)
        sb_add(&b, " ");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

static int write_text(const char *dir, const char *name, const sbuf *b)
{
    if (b->oom) {
        fprintf(stderr, "sluice synth: out of memory\n");
        return -1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f || fwrite(b->p, 1, b->len, f) != b->len || fclose(f) != 0) {
        fprintf(stderr, "sluice synth: write %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    return 0;
}

/* Removes what an earlier `sluice synth` left in dir, so that a directory
 * open does not pick up stale shards. Touches only our own file names. */
static int clean_dir(const char *dir)
{
    static const char *const ours[] = {
        "model.safetensors", "model-[0-9]*-of-[0-9]*.safetensors",
        "model.safetensors.index.json", "sluice.manifest.json",
        "model.safetensors.manifest.json",
    };
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "sluice synth: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++) {
            if (fnmatch(ours[i], e->d_name, 0) == 0) {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
                break;
            }
        }
    }
    closedir(d);
    return 0;
}

static int mkdirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return -1;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- command */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice synth PRESET OUTDIR [--shards N] [--dtype BF16|F16|F32]\n"
            "                    [--seed S] [--values] [--no-manifest]\n"
            "       sluice synth --list\n"
            "\n"
            "Writes a model with the tensor names and shapes of PRESET and\n"
            "pseudo-random weights into OUTDIR: model.safetensors (--shards 1) or\n"
            "model-0000K-of-0000N.safetensors + model.safetensors.index.json, and\n"
            "its SHA-256 manifest (sluice.manifest.json beside the shards, or\n"
            "model.safetensors.manifest.json for one file), the one `sluice manifest`\n"
            "writes: version 2, with header and chunk digests. Files an earlier synth\n"
            "left in OUTDIR are replaced.\n"
            "\n"
            "The weights are random bits, not values a model would hold: some of\n"
            "them are NaN or Inf. They are for loading, not for inference. With\n"
            "--values they are finite values of about the spread of a trained\n"
            "model's weights (mean 0, standard deviation 0.02, within 0.07), for\n"
            "examples that compute with them as they are; still not a trained model.\n"
            "\n"
            CMD_EXIT_HELP);
}

static void list_presets(void)
{
    printf("%-14s %8s %14s %9s %7s  %s\n", "preset", "tensors", "bytes (BF16)", "", "shards",
           "architecture");
    for (size_t i = 0; i < sl_preset_count(); i++) {
        const sl_preset *p = sl_preset_at(i);
        uint64_t bytes = sl_preset_elements(p) * 2;
        char human[32];
        if (bytes >= 1000000000u)
            snprintf(human, sizeof human, "%.2f GB", bytes / 1e9);
        else if (bytes >= 1000000u)
            snprintf(human, sizeof human, "%.1f MB", bytes / 1e6);
        else
            snprintf(human, sizeof human, "%.0f KB", bytes / 1e3);
        printf("%-14s %8zu %14llu %9s %7u  %s\n", p->name, sl_preset_tensors(p, NULL),
               (unsigned long long)bytes, human, p->default_shards, p->summary);
    }
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || *s == '-')
        return -1;
    *out = v;
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    const char *preset_name = NULL, *outdir = NULL, *dtype = "BF16";
    unsigned dtype_bytes = 2;
    uint64_t seed = 0, shards = 0;
    int manifest = 1, values = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--list")) {
            list_presets();
            return 0;
        } else if (!strcmp(a, "--no-manifest")) {
            manifest = 0;
        } else if (!strcmp(a, "--values")) {
            values = 1;
        } else if (!strcmp(a, "--shards") || !strcmp(a, "--seed") || !strcmp(a, "--dtype")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice synth: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--dtype")) {
                size_t k = 0;
                while (k < sizeof dtypes / sizeof dtypes[0] && strcmp(dtypes[k].name, v))
                    k++;
                if (k == sizeof dtypes / sizeof dtypes[0]) {
                    fprintf(stderr, "sluice synth: --dtype %s: use BF16, F16 or F32\n", v);
                    return 2;
                }
                dtype = dtypes[k].name;
                dtype_bytes = dtypes[k].bytes;
            } else if (parse_u64(v, !strcmp(a, "--seed") ? &seed : &shards) < 0 ||
                       (!strcmp(a, "--shards") && (shards < 1 || shards > 99999))) {
                fprintf(stderr, "sluice synth: %s %s: not a valid number\n", a, v);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sluice synth: unknown option %s\n", a);
            usage(stderr);
            return 2;
        } else if (!preset_name) {
            preset_name = a;
        } else if (!outdir) {
            outdir = a;
        } else {
            fprintf(stderr, "sluice synth: unexpected argument %s\n", a);
            return 2;
        }
    }
    if (!preset_name || !outdir) {
        usage(stderr);
        return 2;
    }
    const sl_preset *p = sl_preset_find(preset_name);
    if (!p) {
        fprintf(stderr, "sluice synth: unknown preset '%s'; 'sluice synth --list' names them\n",
                preset_name);
        return 2;
    }
    if (!shards)
        shards = p->default_shards;

    size_t n = sl_preset_tensors(p, NULL);
    if (shards > n) {
        fprintf(stderr, "sluice synth: %s has %zu tensors, too few for %llu shards\n",
                p->name, n, (unsigned long long)shards);
        return 2;
    }
    int rc = CMD_EXIT_OPEN;   /* what fails below: a write, memory */
    unsigned nshards = (unsigned)shards;
    sl_preset_tensor *pt = calloc(n, sizeof *pt);
    syn_tensor *ts = calloc(n, sizeof *ts);
    syn_tensor **byname = calloc(n, sizeof *byname);
    syn_shard *sh = calloc(nshards, sizeof *sh);
    syn_tensor **members = calloc(n, sizeof *members);
    uint8_t *buf = malloc(SYN_BUF_BYTES);
    char *header = NULL;
    int fd = -1;
    char path[4096] = "";
    syn_out o = {0};
    if (!pt || !ts || !byname || !sh || !members || !buf) {
        fprintf(stderr, "sluice synth: out of memory\n");
        goto out;
    }
    sl_preset_tensors(p, pt);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        ts[i].t = pt[i];
        ts[i].order = i;
        ts[i].nbytes = pt[i].elements * dtype_bytes;
        total += ts[i].nbytes;
        byname[i] = &ts[i];
    }
    assign_shards(ts, n, nshards, total);

    /* Each shard's members, sorted as the reference writer sorts them: by
     * dtype alignment then name; one dtype here, so by name. */
    size_t at = 0;
    for (unsigned s = 0; s < nshards; s++) {
        sh[s].members = members + at;
        for (size_t i = 0; i < n; i++)
            if (ts[i].shard == s)
                members[at++] = &ts[i];
        sh[s].count = (size_t)(members + at - sh[s].members);
        qsort(sh[s].members, sh[s].count, sizeof *sh[s].members, cmp_name);
        if (nshards == 1)
            snprintf(sh[s].name, sizeof sh[s].name, "model.safetensors");
        else
            snprintf(sh[s].name, sizeof sh[s].name, "model-%05u-of-%05u.safetensors", s + 1,
                     nshards);
    }

    if (mkdirs(outdir) < 0) {
        fprintf(stderr, "sluice synth: cannot create %s: %s\n", outdir, strerror(errno));
        goto out;
    }
    if (clean_dir(outdir) < 0)
        goto out;

    o.buf = buf;
    o.bar = progress_start("synth", total, 0);
    double t0 = now_s();
    uint64_t all_bytes = 0;
    for (unsigned s = 0; s < nshards; s++) {
        size_t hlen;
        if (!(header = shard_header(&sh[s], dtype, &hlen))) {
            fprintf(stderr, "sluice synth: out of memory\n");
            goto out;
        }
        snprintf(path, sizeof path, "%s/%s", outdir, sh[s].name);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "sluice synth: open %s: %s\n", path, strerror(errno));
            goto out;
        }
        o.fd = fd;
        o.path = path;
        uint8_t len8[8];
        for (int i = 0; i < 8; i++)
            len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
        if (put(&o, len8, 8) < 0 || put(&o, header, hlen) < 0)
            goto out;
        for (size_t i = 0; i < sh[s].count; i++)
            if (put_tensor(&o, sh[s].members[i], seed, values ? dtype : NULL) < 0)
                goto out;
        if (flush_out(&o) < 0)
            goto out;
        if (close(fd) != 0) {
            fd = -1;
            fprintf(stderr, "sluice synth: close %s: %s\n", path, strerror(errno));
            goto out;
        }
        fd = -1;
        sh[s].size = 8 + hlen;
        for (size_t i = 0; i < sh[s].count; i++)
            sh[s].size += sh[s].members[i]->nbytes;
        all_bytes += sh[s].size;
        free(header);
        header = NULL;
    }
    path[0] = '\0';
    progress_stop(o.bar);
    o.bar = NULL;

    qsort(byname, n, sizeof *byname, cmp_name);
    if (nshards > 1) {
        sbuf b = {0};
        sb_add(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
               (unsigned long long)total);
        for (size_t i = 0; i < n; i++)
            sb_add(&b, "    \"%s\": \"%s\"%s\n", byname[i]->t.name, sh[byname[i]->shard].name,
                   i + 1 < n ? "," : "");
        sb_add(&b, "  }\n}\n");
        int w = write_text(outdir, "model.safetensors.index.json", &b);
        free(b.p);
        if (w < 0)
            goto out;
    }
    if (manifest) {
        /* `sluice manifest OUTDIR -q -o M`: the same code, so the same manifest. */
        char mpath[4096];
        snprintf(mpath, sizeof mpath, "%s/%s", outdir,
                 nshards > 1 ? "sluice.manifest.json" : "model.safetensors.manifest.json");
        char *margv[] = {"manifest", (char *)outdir, "-q", "-o", mpath, NULL};
        if (cmd_manifest(5, margv) != 0) {
            fprintf(stderr, "sluice synth: writing the manifest of %s failed\n", outdir);
            goto out;
        }
    }
    double dt = now_s() - t0;
    printf("%s: %s, %zu tensors, %llu bytes (%s) in %u file%s, %.1f s (%.2f GB/s)\n", outdir,
           p->name, n, (unsigned long long)all_bytes, dtype, nshards, nshards > 1 ? "s" : "", dt,
           dt > 0 ? all_bytes / dt / 1e9 : 0.0);
    /* Where sluice_open finds the manifest by itself: say so. */
    if (manifest)
        printf("open %s%s (manifest %s/%s found beside it)\n", outdir,
               nshards > 1 ? "" : " or its model.safetensors", outdir,
               nshards > 1 ? "sluice.manifest.json" : "model.safetensors.manifest.json");
    rc = 0;
    goto out;

out:
    progress_stop(o.bar);
    if (fd >= 0)
        close(fd);
    if (rc != 0 && path[0])
        unlink(path);
    free(header);
    free(buf);
    free(members);
    free(sh);
    free(byname);
    free(ts);
    free(pt);
    return rc;
}
