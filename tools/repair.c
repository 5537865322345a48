/* repair.c: `sluice repair`, which mends a local model whose tensors fail
 * to verify from mirrors that hold them verified, and what `sluice verify
 * --fallback` reports of those mirrors (ig_report_recoverable).
 *
 * The manifest is the judge. A tensor's bytes are taken from a mirror only
 * through the library: sluice_acquire on the model opened with
 * sluice_options.fallback reads the model's own bytes, then each mirror's
 * tensor of the same name, dtype, shape and size, and hands out only bytes
 * that match the model's manifest. Only those tensors' data ranges are
 * written; a header never is.
 *
 * Crash safety by a copy, not a journal. Each file with a failed tensor is
 * copied (copy_file_range: shared blocks where the file system has them)
 * to a temporary file in its own directory; the verified bytes are
 * written into the copy and read back; the copy is fsynced, renamed over
 * the file, and the directory fsynced. rename(2) replaces the name
 * atomically, so a reader, or a kill at any point, finds each file as it
 * was or as repaired, never half, with nothing to replay: a journal
 * applied in place would leave a half-written file to whoever opens it
 * before the replay, and every reader would have to know the journal.
 * The price is room for a copy of each file repaired, and the copy's time
 * where blocks cannot be shared. Nothing is written unless every failed
 * tensor could be taken from a mirror. A copy that a killed repair left
 * behind is known by its name and by its flock, which the kernel dropped
 * at the death, and the next repair of that file removes it.
 *
 * Whole files. A model that does not open (a file missing, truncated, or
 * with a damaged header) cannot be mended tensor by tensor. Its manifest
 * is found without opening it (sluice_find_manifest: the library's
 * sidecar rule, or --manifest) and each mirror is opened with it, so that
 * PATH's manifest, not the mirror's, judges the mirror's headers. Each
 * file of PATH that is missing, or not the manifest's size, or whose
 * header bytes are not the mirror's, is copied whole from the first
 * mirror that holds it (sluice_read_file_range: raw bytes through the
 * file's source) into a copy beside it, hashed (SHA-256) as it reads
 * back, and kept only if it matches the manifest's whole-file digest and
 * size; a manifest without them refuses. All such files or none; then
 * the copies are fsynced and renamed as above, and PATH, opened again,
 * goes through the tensor repair.
 *
 * SLUICE_REPAIR_TEST_KILL=POINT (for the tests) raises SIGKILL at that
 * point: temp (copy created), copied, written, synced (before the rename),
 * renamed (before the directory's fsync). A whole file: temp, copied
 * (the mirror's bytes in, before the digest is judged), written (every
 * file's copy checked), synced, renamed.
 */
#include "cmd.h"
#include "integrity.h"

#include <openssl/evp.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_point(const char *point)
{
    const char *at = getenv("SLUICE_REPAIR_TEST_KILL");
    if (at && !strcmp(at, point)) {
        fflush(NULL);
        raise(SIGKILL);
    }
}

/* "fallback K (LOC)" of a handle's source ("fallback K (LOC), after: ..."). */
static const char *mirror_of(const char *source, char *buf, size_t cap)
{
    const char *after = strstr(source, ", after: ");
    snprintf(buf, cap, "%.*s", (int)(after ? (size_t)(after - source) : strlen(source)), source);
    return buf;
}

/* The failed tensors next, in order, so that a load reads nothing else
 * ahead (names holding a NUL cannot be hinted: then no hint). */
static void hint(sluice_model *m, const ig_failed *f)
{
    const char **names = malloc((f->n ? f->n : 1) * sizeof *names);
    size_t k = 0;
    for (; names && k < f->n; k++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        if (sluice_info(m, f->index[k], &ti) != SLUICE_OK || strlen(ti.name) != ti.name_len)
            break;
        names[k] = ti.name;
    }
    if (names && k == f->n)
        sluice_prefetch(m, names, k);
    free(names);
}

/* Acquires tensor i, verified, through the fallbacks, printing what came
 * of it. Returns 1 with *t from a mirror, 0 with *t from PATH itself (the
 * failure did not repeat), -1 when no source delivered it. */
static int recover(sluice_model *m, size_t i, sluice_tensor **t)
{
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_info(m, i, &ti);
    int rc = sluice_acquire_index(m, i, t);
    printf("tensor ");
    ig_quote(stdout, ti.name, ti.name_len);
    if (rc != SLUICE_OK) {
        printf(": not recoverable from the fallbacks: %s\n", sluice_errmsg(m));
        return -1;
    }
    char label[1024];
    const char *src = sluice_tensor_source(*t);
    if (*src)
        printf(": recoverable from %s\n", mirror_of(src, label, sizeof label));
    else
        printf(": reads right from %s now (the failure did not repeat)\n", ti.file);
    return *src ? 1 : 0;
}

size_t ig_report_recoverable(sluice_model *m, const ig_failed *f)
{
    hint(m, f);
    size_t ok = 0;
    for (size_t k = 0; k < f->n; k++) {
        sluice_tensor *t = NULL;
        ok += recover(m, f->index[k], &t) == 1;
        sluice_release(t);
    }
    fflush(stdout);
    return ok;
}

/* ---------------------------------------------------------------- one file */

/* A new copy of a file, made beside it and renamed over it when complete
 * (tensor repair and whole-file restore alike): a crash at any step leaves
 * the old file or the new one, and a stale copy that the next repair
 * removes. */
typedef struct rp_copy {
    char *real;        /* the file it replaces (a symlink's target) */
    char *tmp;         /* the copy, beside it; NULL or "": none made */
    int fd;            /* the copy's, -1 when closed */
} rp_copy;

typedef struct rp_file {
    size_t file;       /* sluice_file_info index */
    rp_copy c;         /* its repaired copy */
    size_t written;    /* tensors written into the copy */
} rp_file;

static int write_all(int fd, const void *p, size_t len, off_t off)
{
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(fd, (const char *)p + done, len - done, off + (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t len, off_t off)
{
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(fd, (char *)p + done, len - done, off + (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EIO;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

/* size bytes of in into out, from offset 0: copy_file_range (blocks
 * shared where the file system can), else read and write. */
static int copy_file(int in, int out, uint64_t size)
{
    test_point("temp");
    loff_t io = 0, oo = 0;
    while ((uint64_t)io < size) {
        ssize_t n = copy_file_range(in, &io, out, &oo, (size_t)(size - (uint64_t)io), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n > 0)
            continue;
        if (n == 0) {
            errno = EIO;    /* the file ends early: it shrank */
            return -1;
        }
        if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)
            return -1;
        size_t cap = (size_t)1 << 20;
        char *buf = malloc(cap);
        int rc = buf ? 0 : -1;
        for (uint64_t off = (uint64_t)io; rc == 0 && off < size;) {
            size_t len = size - off < cap ? (size_t)(size - off) : cap;
            if (read_all(in, buf, len, (off_t)off) < 0 || write_all(out, buf, len, (off_t)off) < 0)
                rc = -1;
            off += len;
        }
        free(buf);
        return rc;
    }
    return 0;
}

/* Removes the copies of file `base` in dir that a killed repair left:
 * named .BASE.sluice-repair-XXXXXX, and no live process holds their
 * flock (a live repair takes it right after making its copy). */
static void remove_stale_copies(const char *dir, const char *base)
{
    char prefix[NAME_MAX + 32];
    int plen = snprintf(prefix, sizeof prefix, ".%s.sluice-repair-", base);
    DIR *d = opendir(dir);
    if (!d || plen < 0 || (size_t)plen >= sizeof prefix) {
        if (d)
            closedir(d);
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || strlen(e->d_name) != (size_t)plen + 6)
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dirfd(d), e->d_name, 0) == 0)
            printf("removed %s/%s, the copy of a repair that did not finish\n", dir, e->d_name);
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
}

/* Syncs the directory holding path, so that a rename in it lasts. */
static int sync_dir_of(const char *path)
{
    char *d = strdup(path);
    int fd = d ? open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int rc = fd >= 0 && fsync(fd) == 0 ? 0 : -1;
    if (fd >= 0)
        close(fd);
    free(d);
    return rc;
}

/* Makes c's copy beside c->real: empty, locked (so that no other repair
 * takes it for stale), named .BASE.sluice-repair-XXXXXX. Returns 0, or -1
 * after a message. */
static int copy_open(rp_copy *c)
{
    char *d1 = strdup(c->real), *b1 = strdup(c->real);
    size_t cap = strlen(c->real) * 2 + 40;
    int rc = -1;
    c->tmp = malloc(cap);
    if (c->tmp)
        c->tmp[0] = '\0';  /* no copy made yet: copy_drop unlinks nothing */
    if (!d1 || !b1 || !c->tmp) {
        fprintf(stderr, "sluice repair: out of memory\n");
        goto out;
    }
    const char *dir = dirname(d1), *base = basename(b1);
    remove_stale_copies(dir, base);
    snprintf(c->tmp, cap, "%s/.%s.sluice-repair-XXXXXX", dir, base);
    if ((c->fd = mkostemp(c->tmp, O_CLOEXEC)) < 0) {
        fprintf(stderr, "sluice repair: cannot make a copy beside %s (%s): %s\n", c->real,
                c->tmp, strerror(errno));
        c->tmp[0] = '\0';
    } else if (flock(c->fd, LOCK_EX) != 0) {
        fprintf(stderr, "sluice repair: %s: %s\n", c->tmp, strerror(errno));
    } else {
        rc = 0;
    }
out:
    free(d1);
    free(b1);
    return rc;
}

/* Gives c's copy the mode and owner of like (the owner only where
 * allowed), or with like NULL a new file's mode under the umask. Returns
 * 0, or -1 after a message. */
static int copy_give_mode(rp_copy *c, const struct stat *like)
{
    if (like) {
        if (fchmod(c->fd, like->st_mode & 07777) == 0 &&
            (fchown(c->fd, like->st_uid, like->st_gid) == 0 || errno == EPERM))
            return 0;
        fprintf(stderr, "sluice repair: %s: cannot give it %s's mode and owner: %s\n", c->tmp,
                c->real, strerror(errno));
        return -1;
    }
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(c->fd, 0666 & ~mask) == 0)
        return 0;
    fprintf(stderr, "sluice repair: %s: %s\n", c->tmp, strerror(errno));
    return -1;
}

/* Closes c's copy and removes it, unless it was renamed over its file. */
static void copy_drop(rp_copy *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->tmp && c->tmp[0])
        unlink(c->tmp);
    free(c->tmp);
    c->tmp = NULL;
}

/* fsync of c's copy. Returns 0 or CMD_EXIT_OPEN after a message. */
static int copy_sync(rp_copy *c)
{
    if (fsync(c->fd) == 0)
        return 0;
    fprintf(stderr, "sluice repair: fsync %s: %s\n", c->tmp, strerror(errno));
    return CMD_EXIT_OPEN;
}

/* Renames copy k of n over its file, then syncs its directory. Returns 0
 * or CMD_EXIT_OPEN after a message naming what was done before it. */
static int copy_rename(rp_copy *c, size_t k, size_t n, const char *done)
{
    if (rename(c->tmp, c->real) != 0) {
        fprintf(stderr, "sluice repair: rename %s over %s: %s (%zu of %zu files %s before it; "
                "this one and the rest unchanged)\n", c->tmp, c->real, strerror(errno), k, n,
                done);
        return CMD_EXIT_OPEN;
    }
    free(c->tmp);
    c->tmp = NULL;    /* it is the file now */
    test_point("renamed");
    if (sync_dir_of(c->real) != 0)
        fprintf(stderr, "sluice repair: fsync of the directory of %s: %s\n", c->real,
                strerror(errno));
    return 0;
}

/* Makes f's copy: the file as it is, locked, beside it. Returns 0, or -1
 * after a message. */
static int make_copy(sluice_model *m, rp_file *f)
{
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_file_info(m, f->file, &fi);
    if (!(f->c.real = realpath(fi.path, NULL))) {
        fprintf(stderr, "sluice repair: %s: %s\n", fi.path, strerror(errno));
        return -1;
    }
    int in = open(f->c.real, O_RDONLY | O_CLOEXEC);
    struct stat st;
    int rc = -1;
    if (in < 0 || fstat(in, &st) != 0)
        fprintf(stderr, "sluice repair: %s: %s\n", f->c.real, strerror(errno));
    else if ((uint64_t)st.st_size != fi.file_size)
        fprintf(stderr, "sluice repair: %s: %llu bytes now, %llu when it was verified: it "
                "changed meanwhile; nothing written\n", f->c.real, (unsigned long long)st.st_size,
                (unsigned long long)fi.file_size);
    else if (copy_open(&f->c) != 0)
        ;   /* said */
    else if (copy_file(in, f->c.fd, fi.file_size) != 0)
        fprintf(stderr, "sluice repair: copying %s to %s: %s\n", f->c.real, f->c.tmp,
                strerror(errno));
    else {
        if (st.st_nlink > 1)
            printf("note: %s has %llu hard links; the others keep the old bytes\n", f->c.real,
                   (unsigned long long)st.st_nlink);
        rc = copy_give_mode(&f->c, &st);
    }
    if (in >= 0)
        close(in);
    if (rc == 0)
        test_point("copied");
    return rc;
}

/* Writes tensor i's verified bytes (handle t) over its range in f's copy
 * and reads them back. Returns 0, or -1 after a message. */
static int write_tensor(sluice_model *m, rp_file *f, size_t i, const sluice_tensor *t)
{
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_info(m, i, &ti);
    sluice_file_info(m, f->file, &fi);
    /* the data range only: never a byte of the header */
    if (ti.offset < fi.data_start || ti.nbytes > fi.file_size - ti.offset ||
        sluice_tensor_size(t) != ti.nbytes || ti.nbytes > SIZE_MAX) {
        fprintf(stderr, "sluice repair: tensor %s: its range is not in the data of %s\n", ti.name,
                f->c.real);
        return -1;
    }
    size_t len = (size_t)ti.nbytes;
    void *back = malloc(len ? len : 1);
    int rc = -1;
    if (!back)
        fprintf(stderr, "sluice repair: out of memory for %zu bytes\n", len);
    else if (write_all(f->c.fd, sluice_tensor_data(t), len, (off_t)ti.offset) != 0 ||
             read_all(f->c.fd, back, len, (off_t)ti.offset) != 0)
        fprintf(stderr, "sluice repair: writing %s: %s\n", f->c.tmp, strerror(errno));
    else if (memcmp(back, sluice_tensor_data(t), len) != 0)
        fprintf(stderr, "sluice repair: %s does not read back what was written\n", f->c.tmp);
    else
        rc = 0;
    free(back);
    return rc;
}

/* ---------------------------------------------------------------- whole files */

/* A file of the model that cannot be mended tensor by tensor (missing,
 * of another size than the manifest's, a header that is not the
 * manifest's), restored whole from a mirror. */
typedef struct wf_file {
    char *name;         /* its base name: the manifest's key */
    rp_copy c;          /* the mirror's copy, verified; c.real: where it goes,
                           PATH's file (a symlink's target) */
    int existed;        /* real was there (its mode and owner are kept) */
    char from[1100];    /* "fallback K (LOC)" of the copy */
} wf_file;

/* The mirrors, each opened with the trusted manifest (so that it judges
 * their headers); NULL where one could not be. */
typedef struct wf_mirrors {
    sluice_model **m;
    size_t n;
} wf_mirrors;

/* The base name of a shown location (without "?..."), malloc'd. */
static char *base_of(const char *shown)
{
    size_t n = strcspn(shown, "?");
    const char *b = shown;
    for (size_t k = 0; k < n; k++)
        if (shown[k] == '/')
            b = shown + k + 1;
    return strndup(b, n - (size_t)(b - shown));
}

/* Where file `name` of the model at path lies: path itself when it names
 * one file, else in path's directory (path, or an index.json's). */
static char *local_file(const char *path, const char *name, size_t nfiles)
{
    struct stat st;
    size_t n = strlen(path);
    int dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    int json = n >= 5 && !strcmp(path + n - 5, ".json");
    if (!dir && !json && nfiles == 1)
        return strdup(path);
    size_t d = n;
    if (!dir)
        while (d > 0 && path[d - 1] != '/')
            d--;
    size_t cap = d + strlen(name) + 2;
    char *out = malloc(cap);
    if (out)
        snprintf(out, cap, "%.*s%s%s", (int)d, path, d && path[d - 1] != '/' ? "/" : "", name);
    return out;
}

/* The manifest to judge by when PATH does not open: --manifest, else
 * PATH's sidecar by the library's rule (the mirrors' file names standing
 * in for PATH's own). NULL after a message. */
static char *trusted_manifest(const char *path, const sluice_options *o)
{
    if (o->manifest_path)
        return strdup(o->manifest_path);
    sluice_options po = *o;
    po.verify = SLUICE_VERIFY_OFF;
    po.fallback = NULL;
    po.fallback_count = 0;
    sluice_model *like = NULL;
    for (size_t k = 0; k < o->fallback_count && !like; k++)
        if (sluice_open(o->fallback[k], &po, &like) != SLUICE_OK) {
            sluice_close(like);
            like = NULL;
        }
    char *man = NULL;
    int rc = sluice_find_manifest(path, like, &man);
    sluice_close(like);
    if (rc == SLUICE_OK)
        return man;
    if (rc == SLUICE_E_MANIFEST)
        fprintf(stderr, "sluice repair: no manifest to judge the mirrors by: no sidecar %s "
                "(give --manifest)\n", man);
    else
        fprintf(stderr, "sluice repair: %s\n", sluice_strerror(rc));
    free(man);
    return NULL;
}

static void wf_close_mirrors(wf_mirrors *mm)
{
    for (size_t k = 0; k < mm->n; k++)
        sluice_close(mm->m[k]);
    free(mm->m);
}

/* Opens each mirror with the manifest man, policy REQUIRE. Returns how
 * many opened. */
static size_t wf_open_mirrors(const sluice_options *o, const char *man, wf_mirrors *mm)
{
    size_t ok = 0;
    mm->n = 0;
    if (!(mm->m = calloc(o->fallback_count, sizeof *mm->m)))
        return 0;
    mm->n = o->fallback_count;
    sluice_options mo = *o;
    mo.manifest_path = man;
    mo.verify = SLUICE_VERIFY_REQUIRE;
    mo.fallback = NULL;
    mo.fallback_count = 0;
    for (size_t k = 0; k < mm->n; k++) {
        if (sluice_open(o->fallback[k], &mo, &mm->m[k]) != SLUICE_OK) {
            printf("fallback %zu: not used for whole files: %s\n", k + 1,
                   sluice_errmsg(mm->m[k]));
            sluice_close(mm->m[k]);
            mm->m[k] = NULL;
        } else {
            ok++;
        }
    }
    return ok;
}

/* File `name` of mirror m: its index, or -1. */
static long wf_find(sluice_model *m, const char *name)
{
    for (size_t j = 0; j < sluice_file_count(m); j++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, j, &fi);
        char *b = base_of(fi.path);
        int eq = b && !strcmp(b, name);
        free(b);
        if (eq)
            return (long)j;
    }
    return -1;
}

/* Whether the file at local is file j of mirror ref as the manifest has
 * it: its size, and its header the mirror's (which the manifest judged
 * at the mirror's open). Returns 0 (it is; its tensors are for the tensor
 * repair), 1 (it is not: why says), -1 after a message. */
static int wf_judge(sluice_model *ref, size_t j, const char *local, char *why, size_t cap)
{
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_file_info(ref, j, &fi);
    uint8_t dg[32];
    uint64_t want = fi.file_size;
    if (sluice_manifest_file(ref, j, dg, &want) != SLUICE_OK || want == SLUICE_SIZE_UNKNOWN)
        want = fi.file_size;
    int fd = open(local, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 && errno == ENOENT) {
        snprintf(why, cap, "missing");
        return 1;
    }
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "sluice repair: %s: %s\n", local, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int rc = 0;
    if ((uint64_t)st.st_size != want) {
        snprintf(why, cap, "%llu bytes, the manifest's %llu", (unsigned long long)st.st_size,
                 (unsigned long long)want);
        rc = 1;
    } else if (fi.data_start > SIZE_MAX || fi.data_start > want) {
        rc = -1;
    } else {
        size_t hb = (size_t)fi.data_start;
        unsigned char *a = malloc(hb ? hb : 1), *b = malloc(hb ? hb : 1);
        if (!a || !b)
            rc = -1;
        else if (read_all(fd, a, hb, 0) != 0) {
            fprintf(stderr, "sluice repair: %s: %s\n", local, strerror(errno));
            rc = -1;
        } else if (sluice_read_file_range(ref, j, 0, hb, b) != SLUICE_OK) {
            fprintf(stderr, "sluice repair: %s\n", sluice_errmsg(ref));
            rc = -1;
        } else if (memcmp(a, b, hb) != 0) {
            snprintf(why, cap, "its header is not the manifest's");
            rc = 1;
        }
        free(a);
        free(b);
    }
    close(fd);
    return rc;
}

/* Copies file j of mirror m whole into a new copy beside f->c.real,
 * hashing what reads back, and keeps it only if it is the manifest's
 * (digest and size). Returns 0 (f->c.tmp kept), 1 (the mirror's file is
 * not the manifest's: said, nothing kept), -1 after a message. */
static int wf_copy(sluice_model *m, size_t k, size_t j, wf_file *f, const uint8_t digest[32],
                   uint64_t size)
{
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_file_info(m, j, &fi);
    snprintf(f->from, sizeof f->from, "fallback %zu (%s)", k + 1, fi.path);
    if (fi.file_size != size) {
        printf("file %s: %s has %llu bytes, the manifest %llu: not taken\n", f->name, f->from,
               (unsigned long long)fi.file_size, (unsigned long long)size);
        return 1;
    }
    size_t piece = (size_t)16 << 20;
    unsigned char *buf = malloc(piece), *back = malloc(piece);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = -1;
    if (!buf || !back || !md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        fprintf(stderr, "sluice repair: out of memory\n");
        goto out;
    }
    if (copy_open(&f->c) != 0)
        goto out;
    test_point("temp");
    for (uint64_t off = 0; off < size;) {
        size_t len = size - off < piece ? (size_t)(size - off) : piece;
        if (sluice_read_file_range(m, j, off, len, buf) != SLUICE_OK) {
            printf("file %s: %s: %s\n", f->name, f->from, sluice_errmsg(m));
            rc = 1;
            goto out;
        }
        if (write_all(f->c.fd, buf, len, (off_t)off) != 0 ||
            read_all(f->c.fd, back, len, (off_t)off) != 0) {
            fprintf(stderr, "sluice repair: writing %s: %s\n", f->c.tmp, strerror(errno));
            goto out;
        }
        EVP_DigestUpdate(md, back, len);
        off += len;
    }
    uint8_t got[32];
    char gh[65], wh[65];
    if (EVP_DigestFinal_ex(md, got, NULL) != 1) {
        fprintf(stderr, "sluice repair: SHA-256 failed\n");
        goto out;
    }
    test_point("copied");
    if (memcmp(got, digest, 32) != 0) {
        printf("file %s: %s does not match the manifest (SHA-256 %s, the manifest's %s): not "
               "taken\n", f->name, f->from, sluice_digest_hex(got, gh), sluice_digest_hex(digest, wh));
        rc = 1;
        goto out;
    }
    struct stat st;
    if (copy_give_mode(&f->c, f->existed && stat(f->c.real, &st) == 0 ? &st : NULL) != 0)
        goto out;
    rc = 0;
out:
    if (rc != 0)
        copy_drop(&f->c);
    EVP_MD_CTX_free(md);
    free(buf);
    free(back);
    return rc;
}

/* Where a missing file goes: local itself, or, where local is a symlink
 * that dangles (a Hub snapshot whose blob is gone), the path its links
 * lead to. malloc'd; NULL with errno. */
static char *missing_target(const char *local)
{
    char *cur = strdup(local);
    for (int hops = 0; cur && hops < 40; hops++) {
        struct stat st;
        char to[PATH_MAX];
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
            return cur;
        ssize_t n = readlink(cur, to, sizeof to - 1);
        if (n < 0) {
            free(cur);
            return NULL;
        }
        to[n] = '\0';
        const char *slash = strrchr(cur, '/');
        size_t d = to[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
        char *next = malloc(d + (size_t)n + 1);
        if (next) {
            memcpy(next, cur, d);
            memcpy(next + d, to, (size_t)n + 1);
        }
        free(cur);
        cur = next;
    }
    if (cur) {
        free(cur);
        errno = ELOOP;
    }
    return NULL;
}

/* Judges each file of the model at path (by the first mirror that
 * opens with the trusted manifest, whose file list is the manifest's);
 * those missing or not the manifest's size or header go in files.
 * Returns 0, or the exit status (CMD_EXIT_OPEN: a file that cannot be read). */
static int wf_damaged(const char *path, sluice_model *ref, wf_file *files, size_t *nd)
{
    size_t nf = sluice_file_count(ref);
    *nd = 0;
    for (size_t j = 0; j < nf; j++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(ref, j, &fi);
        wf_file *f = &files[*nd];
        *f = (wf_file){.c.fd = -1};
        char *local = NULL, why[256];
        int bad = -1;
        struct stat st;
        if (!(f->name = base_of(fi.path)) || !(local = local_file(path, f->name, nf)))
            fprintf(stderr, "sluice repair: out of memory\n");
        else if ((bad = wf_judge(ref, j, local, why, sizeof why)) == 0)
            printf("file %s: good (the manifest's size and header)\n", f->name);
        else if (bad > 0) {
            printf("file %s: %s\n", f->name, why);
            f->existed = stat(local, &st) == 0;
            /* a symlink's target is what is restored (the Hub's blobs),
             * also one that is gone (the symlink dangles) */
            if (!(f->c.real = f->existed ? realpath(local, NULL) : missing_target(local))) {
                fprintf(stderr, "sluice repair: %s: %s\n", local, strerror(errno));
                bad = -1;
            }
        }
        free(local);
        if (bad > 0) {
            (*nd)++;
            continue;
        }
        free(f->name);
        f->name = NULL;
        if (bad < 0)
            return CMD_EXIT_OPEN;
    }
    return 0;
}

/* Takes each damaged file from the first mirror that holds it as the
 * manifest has it (digest and size) into a copy beside it. Returns 0,
 * CMD_EXIT_INTEGRITY (one no mirror holds so, or the manifest cannot
 * tell) or CMD_EXIT_OPEN (a copy that could not be made or written). */
static int wf_take(const wf_mirrors *mm, sluice_model *ref, const char *man, wf_file *files,
                   size_t nd)
{
    for (size_t d = 0; d < nd; d++) {
        wf_file *f = &files[d];
        long jr = wf_find(ref, f->name);
        uint8_t digest[32];
        uint64_t size = SLUICE_SIZE_UNKNOWN;
        if (jr < 0 || sluice_manifest_file(ref, (size_t)jr, digest, &size) != SLUICE_OK ||
            size == SLUICE_SIZE_UNKNOWN) {
            int v = sluice_manifest_version(ref);
            printf("file %s: cannot be restored: the manifest %s gives no whole-file digest "
                   "and size for it (a %s manifest), and a mirror's file is not taken "
                   "unchecked; write a version 2 manifest ('sluice manifest') from a good "
                   "copy\n", f->name, man, v == 0 ? "flat" : v == 1 ? "version 1" : "version 2");
            return CMD_EXIT_INTEGRITY;
        }
        if (sluice_digest_algorithm(ref) != SLUICE_ALG_SHA256) {
            printf("file %s: cannot be restored: whole files are checked with SHA-256 and the "
                   "manifest %s's digests are %s\n", f->name, man,
                   sluice_algorithm_name(sluice_digest_algorithm(ref)));
            return CMD_EXIT_INTEGRITY;
        }
        int got = 1;
        for (size_t k = 0; k < mm->n && got == 1; k++) {
            long jk = mm->m[k] ? wf_find(mm->m[k], f->name) : -1;
            if (jk >= 0)
                got = wf_copy(mm->m[k], k, (size_t)jk, f, digest, size);
        }
        if (got < 0)
            return CMD_EXIT_OPEN;
        if (got > 0) {
            printf("file %s: could not be restored: no fallback holds it as the manifest "
                   "has it\n", f->name);
            return CMD_EXIT_INTEGRITY;
        }
        printf("file %s: restorable from %s\n", f->name, f->from);
    }
    return 0;
}

/* Renames each verified copy over its file. Returns 0 or CMD_EXIT_OPEN. */
static int wf_commit(wf_file *files, size_t nd, size_t *restored)
{
    test_point("written");
    for (size_t d = 0; d < nd; d++)
        if (copy_sync(&files[d].c) != 0)
            return CMD_EXIT_OPEN;
    test_point("synced");
    for (size_t d = 0; d < nd; d++) {
        if (copy_rename(&files[d].c, d, nd, "restored") != 0)
            return CMD_EXIT_OPEN;
        printf("restored %s from %s\n", files[d].c.real, files[d].from);
        (*restored)++;
    }
    return 0;
}

/* The model at path does not open: restores its files that are missing,
 * or not the manifest's size or header, whole from the mirrors, each
 * checked against the manifest's whole-file digest and size before it
 * replaces anything; all of them or none. *restored: how many. Returns
 * 0, CMD_EXIT_INTEGRITY (not repaired, nothing replaced) or CMD_EXIT_OPEN
 * (the manifest, a file or a copy that cannot be read or written). */
static int restore_files(const char *path, const sluice_options *o, size_t *restored)
{
    *restored = 0;
    char *man = trusted_manifest(path, o);
    if (!man)
        return CMD_EXIT_OPEN;
    printf("manifest %s\n", man);
    wf_mirrors mm = {0};
    wf_open_mirrors(o, man, &mm);
    sluice_model *ref = NULL;
    for (size_t k = 0; k < mm.n && !ref; k++)
        ref = mm.m[k];
    size_t nd = 0;
    wf_file *files = ref ? calloc(sluice_file_count(ref) + 1, sizeof *files) : NULL;
    int status = 0;
    if (!ref)
        printf("no fallback opens with the manifest %s\n", man);
    if (!ref || !files)
        status = ref ? CMD_EXIT_OPEN : CMD_EXIT_INTEGRITY;
    if (status == 0)
        status = wf_damaged(path, ref, files, &nd);
    if (status == 0 && nd)
        status = wf_take(&mm, ref, man, files, nd);
    if (status == 0 && nd)
        status = wf_commit(files, nd, restored);
    if (status == CMD_EXIT_INTEGRITY)
        printf("not repaired: a file no fallback holds as the manifest has it; %s unchanged\n",
               path);
    for (size_t d = 0; d < nd; d++) {
        copy_drop(&files[d].c);     /* what was not renamed over its file */
        free(files[d].name);
        free(files[d].c.real);
    }
    free(files);
    wf_close_mirrors(&mm);
    free(man);
    return status;
}

/* Whether an open that failed with rc may fail for a damaged or missing
 * file (not for the manifest, the trust options or the arguments). */
static int file_damage(int rc)
{
    switch (rc) {
    case SLUICE_E_INVAL:
    case SLUICE_E_NOMEM:
    case SLUICE_E_MANIFEST:
    case SLUICE_E_MANIFEST_FORMAT:
    case SLUICE_E_MANIFEST_DIGEST:
    case SLUICE_E_MANIFEST_DUPLICATE:
    case SLUICE_E_SIGNATURE:
    case SLUICE_E_UNSUPPORTED:
        return 0;
    default:
        return 1;
    }
}

/* ---------------------------------------------------------------- the command */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice repair PATH --fallback LOC [--fallback LOC]... [--manifest FILE]\n"
            "                     [trust options] [--pool SIZE] [--qd N] [--threads N]\n"
            "                     [--direct] [--pread] [-q]\n"
            "\n"
            "Mends the local model at PATH from mirrors: verifies every tensor against\n"
            "PATH's manifest (the judge; policy REQUIRE), takes each tensor that fails\n"
            "from the first fallback whose tensor of the same name, dtype, shape and\n"
            "size matches the manifest's digest, writes those bytes over the tensor's\n"
            "range (never a header byte), then verifies PATH again.\n"
            "\n"
            "Whole files: when PATH does not open (a file missing, truncated, or with\n"
            "a damaged header), each mirror is opened with PATH's manifest (the\n"
            "sidecar, as sluice_open finds it, or --manifest), which judges its\n"
            "headers; each of PATH's files that is missing, or not the manifest's size\n"
            "or header, is copied whole from the first mirror whose file matches the\n"
            "manifest's whole-file SHA-256 and size, hashed as it is copied (a\n"
            "version 2 or version 1 manifest with \"files\"; a manifest without them\n"
            "is refused: a mirror's file is never taken unchecked). It says per file:\n"
            "good, restorable from which fallback, restored, or could not be. Nothing\n"
            "is replaced unless every such file can be; then the tensors are\n"
            "repaired as above.\n"
            "\n"
            "Crash-safe, file by file: a file is repaired in a copy beside it\n"
            "(.NAME.sluice-repair-XXXXXX), fsynced, read back and renamed over it, so a\n"
            "kill at any point leaves each file as it was or repaired, never half.\n"
            "Nothing is written unless every failed tensor can be taken from a\n"
            "fallback. It needs room for a copy of each file it repairs; a symlink's\n"
            "target is what is repaired; other hard links of a file keep the old\n"
            "bytes; do not run it while something writes the model. A copy that a\n"
            "killed repair left is removed by the next. A whole file is restored the\n"
            "same way: copied into .NAME.sluice-repair-XXXXXX, checked, fsynced,\n"
            "renamed.\n"
            "\n"
            "  --fallback LOC    a mirror of the model (directory, file, http(s):// or\n"
            "                    s3://) to take failed tensors and files from;\n"
            "                    repeatable, tried in order; at least one\n"
            "  --manifest FILE   the manifest (default: the sidecar, as for verify)\n"
            IG_TRUST_HELP
            "  --pool SIZE       buffer pool (default 4G): must hold the largest tensor\n"
            "                    repaired\n"
            "  --qd N, --threads N, --direct, --pread   as for verify\n"
            "  -q, --quiet       no progress bar\n"
            "\n"
            CMD_EXIT_HELP
            "repair: 0 PATH verifies (repaired, or nothing to repair); 1 (or 3 for a\n"
            "tensor that failed to read) not repaired, PATH unchanged (a failed tensor\n"
            "that no fallback holds verified, a file that no fallback holds as the\n"
            "manifest has it, or a manifest without whole-file digests), or failing\n"
            "still after the repair; 2 also for a remote PATH, no --fallback, or a\n"
            "mirror serving PATH in its place (PATH's own bytes are judged, never a\n"
            "mirror's: a PATH that does not open has its files restored as above); a\n"
            "PATH that does not open with no file to restore, its open's class (3 for\n"
            "most); 3 also for a copy that could not be made, written or renamed (PATH\n"
            "unchanged; with several files, each is as it was or repaired, as the\n"
            "message says).\n");
}

/* Makes the copies of the files holding failed tensors, with those
 * tensors' verified bytes written in, each tensor taken before its file is
 * copied. Returns 0, -1 (a tensor no source delivered), or CMD_EXIT_OPEN
 * (a copy that could not be made or written). */
static int prepare(sluice_model *m, const ig_failed *failed, rp_file *files, size_t *nfiles)
{
    *nfiles = 0;
    for (size_t k = 0; k < failed->n; k++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, failed->index[k], &ti);
        sluice_tensor *t = NULL;
        int got = recover(m, failed->index[k], &t);
        if (got <= 0) {
            sluice_release(t);
            if (got < 0)
                return -1;
            continue;       /* it reads right now: nothing to write */
        }
        rp_file *f = NULL;
        for (size_t j = 0; j < *nfiles && !f; j++)
            f = files[j].file == ti.file_index ? &files[j] : NULL;
        if (!f) {
            f = &files[(*nfiles)++];
            *f = (rp_file){.file = ti.file_index, .c.fd = -1};
        }
        int rc = (!f->c.tmp && make_copy(m, f) < 0) || write_tensor(m, f, failed->index[k], t) < 0;
        sluice_release(t);
        if (rc)
            return CMD_EXIT_OPEN;
        f->written++;
    }
    test_point("written");
    for (size_t j = 0; j < *nfiles; j++)
        if (copy_sync(&files[j].c) != 0)
            return CMD_EXIT_OPEN;
    test_point("synced");
    return 0;
}

/* Renames each copy over its file. Returns 0 or CMD_EXIT_OPEN. */
static int commit(rp_file *files, size_t nfiles)
{
    for (size_t j = 0; j < nfiles; j++) {
        if (copy_rename(&files[j].c, j, nfiles, "repaired") != 0)
            return CMD_EXIT_OPEN;
        printf("repaired %s: %zu tensor%s written\n", files[j].c.real, files[j].written,
               files[j].written == 1 ? "" : "s");
    }
    return 0;
}

/* Parses the command line into o (and trust, path, quiet); returns -1 to
 * go on, else the exit status. */
static int parse(int argc, char **argv, sluice_options *o, ig_trust *trust, const char **path,
                 int *quiet)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            *quiet = 1;
        } else if ((r = ig_file_option("repair", argc, argv, &i, "--manifest", "-m",
                                       &o->manifest_path)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = ig_trust_option("repair", argc, argv, &i, trust, o)) != 0) {
            if (r < 0)
                return 2;
        } else if (strcmp(a, "--trust-unchanged") && strcmp(a, "--cache-dir") &&
                   strcmp(a, "--cache-max") &&
                   (r = ig_loader_option("repair", argc, argv, &i, o)) != 0) {
            if (r < 0)
                return 2;
        } else if (ig_path_operand("repair", a, path, usage) < 0) {
            return 2;
        }
    }
    if (!*path || !o->fallback_count) {
        if (*path)
            fprintf(stderr, "sluice repair: at least one --fallback is needed\n");
        usage(stderr);
        return 2;
    }
    if (!strncmp(*path, "http://", 7) || !strncmp(*path, "https://", 8) ||
        !strncmp(*path, "s3://", 5) || !strncmp(*path, "hf://", 5)) {
        fprintf(stderr, "sluice repair: %s is remote; repair writes the model's files, which "
                        "must be local\n", *path);
        return 2;
    }
    return -1;
}

int cmd_repair(int argc, char **argv)
{
    const char *path = NULL;
    int quiet = 0;
    ig_trust trust = {0};
    sluice_options o;
    sluice_options_init(&o);
    int status = parse(argc, argv, &o, &trust, &path, &quiet);
    if (status >= 0)
        return status;
    o.verify = SLUICE_VERIFY_REQUIRE;
    double t0 = ig_now();
    sluice_model *m = NULL;
    size_t restored = 0;
    int rc = sluice_open(path, &o, &m);
    unsigned served = 0;
    if (rc == SLUICE_OK && (sluice_model_location(m, &served, NULL), served)) {
        /* a mirror stands in for PATH, which does not open: why not is
         * PATH's own open's to say (a damaged file is restored below) */
        sluice_close(m);
        m = NULL;
        sluice_options own = o;
        own.fallback = NULL;
        own.fallback_count = 0;
        if ((rc = sluice_open(path, &own, &m)) == SLUICE_OK) {
            sluice_close(m);    /* it opens now: with the mirrors, as first */
            m = NULL;
            rc = sluice_open(path, &o, &m);
        }
    }
    if (rc != SLUICE_OK) {
        /* a missing, truncated or damaged file: restored whole, then its
         * tensors judged as any */
        if (!file_damage(rc))
            return ig_open_failed("repair", m, rc);
        fprintf(stderr, "sluice repair: %s\n", sluice_errmsg(m));
        sluice_close(m);
        m = NULL;
        printf("%s does not open; judging its files by the manifest\n", path);
        if ((status = restore_files(path, &o, &restored)) != 0)
            return status;
        if (!restored) {
            printf("no file to restore whole; %s does not open for another reason (above)\n",
                   path);
            return cmd_exit_status(rc);
        }
        t0 = ig_now();
        if ((rc = sluice_open(path, &o, &m)) != SLUICE_OK)
            return ig_open_failed("repair", m, rc);
    }
    if (ig_own_location("repair", path, m) < 0) {  /* never write a mirror's files */
        sluice_close(m);
        return CMD_EXIT_USAGE;
    }
    printf("manifest %s\n", sluice_manifest_path(m));
    ig_failed failed = {0};
    status = ig_verify_print("repair", m, 0, quiet, t0, &failed);
    rp_file *files = calloc(failed.n ? failed.n : 1, sizeof *files);
    size_t nfiles = 0;
    if (status == 0) {
        printf(restored ? "no tensor to repair\n" : "nothing to repair\n");
    } else if (failed.n && !files) {
        status = CMD_EXIT_OPEN;
    } else if (failed.n && (status == CMD_EXIT_INTEGRITY || status == CMD_EXIT_OPEN)) {
        hint(m, &failed);
        int got = prepare(m, &failed, files, &nfiles);
        if (got < 0)
            printf("not repaired: a failed tensor that no fallback holds verified; %s "
                   "unchanged\n", path);   /* status: the verify's */
        else
            status = got ? got : commit(files, nfiles);
    }
    for (size_t j = 0; j < nfiles; j++) {
        copy_drop(&files[j].c);   /* what was not renamed over its file */
        free(files[j].c.real);
    }
    free(files);
    free(failed.index);
    int again = status == 0 && nfiles;
    if (sluice_close(m) != SLUICE_OK) {
        fprintf(stderr, "sluice repair: %s\n", sluice_errmsg(m));
        return CMD_EXIT_OPEN;
    }
    if (!again)
        return status;
    /* The files as they are now, opened afresh and judged again. */
    o.fallback = NULL;
    o.fallback_count = 0;
    printf("verifying %s again\n", path);
    if ((rc = sluice_open(path, &o, &m)) != SLUICE_OK)
        return ig_open_failed("repair", m, rc);
    status = ig_verify_print("repair", m, 0, quiet, ig_now(), NULL);
    if (sluice_close(m) != SLUICE_OK)
        status = cmd_exit_worse(status, CMD_EXIT_OPEN);
    return status;
}
