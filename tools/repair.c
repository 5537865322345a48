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
 * SLUICE_REPAIR_TEST_KILL=POINT (for the tests) raises SIGKILL at that
 * point: temp (copy created), copied, written, synced (before the rename),
 * renamed (before the directory's fsync).
 */
#include "cmd.h"
#include "integrity.h"

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

typedef struct rp_file {
    size_t file;       /* sluice_file_info index */
    char *real;        /* the file's real path (a symlink's target) */
    char *tmp;         /* its repaired copy, beside it; NULL: none made */
    int fd;            /* the copy's, -1 when closed */
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

static void drop_copy(rp_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp)
        unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
}

/* Makes f's copy: the file as it is, locked, beside it. Returns 0, or -1
 * after a message. */
static int make_copy(sluice_model *m, rp_file *f)
{
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_file_info(m, f->file, &fi);
    if (!(f->real = realpath(fi.path, NULL))) {
        fprintf(stderr, "sluice repair: %s: %s\n", fi.path, strerror(errno));
        return -1;
    }
    char *d1 = strdup(f->real), *b1 = strdup(f->real);
    if (!d1 || !b1) {
        free(d1);
        free(b1);
        fprintf(stderr, "sluice repair: out of memory\n");
        return -1;
    }
    const char *dir = dirname(d1), *base = basename(b1);
    remove_stale_copies(dir, base);
    size_t cap = strlen(dir) + strlen(base) + 40;
    f->tmp = malloc(cap);
    int in = open(f->real, O_RDONLY | O_CLOEXEC);
    struct stat st;
    int rc = -1;
    if (!f->tmp)
        fprintf(stderr, "sluice repair: out of memory\n");
    else if (in < 0 || fstat(in, &st) != 0)
        fprintf(stderr, "sluice repair: %s: %s\n", f->real, strerror(errno));
    else if ((uint64_t)st.st_size != fi.file_size)
        fprintf(stderr, "sluice repair: %s: %llu bytes now, %llu when it was verified: it "
                "changed meanwhile; nothing written\n", f->real, (unsigned long long)st.st_size,
                (unsigned long long)fi.file_size);
    else {
        snprintf(f->tmp, cap, "%s/.%s.sluice-repair-XXXXXX", dir, base);
        if ((f->fd = mkostemp(f->tmp, O_CLOEXEC)) < 0) {
            fprintf(stderr, "sluice repair: cannot make a copy beside %s (%s): %s\n", f->real,
                    f->tmp, strerror(errno));
            free(f->tmp);
            f->tmp = NULL;
        } else if (flock(f->fd, LOCK_EX) != 0 || copy_file(in, f->fd, fi.file_size) != 0) {
            fprintf(stderr, "sluice repair: copying %s to %s: %s\n", f->real, f->tmp,
                    strerror(errno));
        } else {
            if (st.st_nlink > 1)
                printf("note: %s has %llu hard links; the others keep the old bytes\n", f->real,
                       (unsigned long long)st.st_nlink);
            /* the file's mode and owner (the owner only where allowed) */
            if (fchmod(f->fd, st.st_mode & 07777) != 0 ||
                (fchown(f->fd, st.st_uid, st.st_gid) != 0 && errno != EPERM))
                fprintf(stderr, "sluice repair: %s: cannot give it %s's mode and owner: %s\n",
                        f->tmp, f->real, strerror(errno));
            else
                rc = 0;
        }
    }
    if (in >= 0)
        close(in);
    free(d1);
    free(b1);
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
                f->real);
        return -1;
    }
    size_t len = (size_t)ti.nbytes;
    void *back = malloc(len ? len : 1);
    int rc = -1;
    if (!back)
        fprintf(stderr, "sluice repair: out of memory for %zu bytes\n", len);
    else if (write_all(f->fd, sluice_tensor_data(t), len, (off_t)ti.offset) != 0 ||
             read_all(f->fd, back, len, (off_t)ti.offset) != 0)
        fprintf(stderr, "sluice repair: writing %s: %s\n", f->tmp, strerror(errno));
    else if (memcmp(back, sluice_tensor_data(t), len) != 0)
        fprintf(stderr, "sluice repair: %s does not read back what was written\n", f->tmp);
    else
        rc = 0;
    free(back);
    return rc;
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
            "Crash-safe, file by file: a file is repaired in a copy beside it\n"
            "(.NAME.sluice-repair-XXXXXX), fsynced, read back and renamed over it, so a\n"
            "kill at any point leaves each file as it was or repaired, never half.\n"
            "Nothing is written unless every failed tensor can be taken from a\n"
            "fallback. It needs room for a copy of each file it repairs; a symlink's\n"
            "target is what is repaired; other hard links of a file keep the old\n"
            "bytes; do not run it while something writes the model. A copy that a\n"
            "killed repair left is removed by the next.\n"
            "\n"
            "  --fallback LOC    a mirror of the model (directory, file, http(s):// or\n"
            "                    s3://) to take failed tensors from; repeatable, tried\n"
            "                    in order; at least one\n"
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
            "that no fallback holds verified), or failing still after the repair; 2\n"
            "also for a remote PATH or no --fallback; 3 also for a copy that could not\n"
            "be made, written or renamed (PATH unchanged; with several files, each is\n"
            "as it was or repaired, as the message says).\n");
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
            *f = (rp_file){.file = ti.file_index, .fd = -1};
        }
        int rc = (!f->tmp && make_copy(m, f) < 0) || write_tensor(m, f, failed->index[k], t) < 0;
        sluice_release(t);
        if (rc)
            return CMD_EXIT_OPEN;
        f->written++;
    }
    test_point("written");
    for (size_t j = 0; j < *nfiles; j++)
        if (fsync(files[j].fd) != 0) {
            fprintf(stderr, "sluice repair: fsync %s: %s\n", files[j].tmp, strerror(errno));
            return CMD_EXIT_OPEN;
        }
    test_point("synced");
    return 0;
}

/* Renames each copy over its file. Returns 0 or CMD_EXIT_OPEN. */
static int commit(rp_file *files, size_t nfiles)
{
    for (size_t j = 0; j < nfiles; j++) {
        if (rename(files[j].tmp, files[j].real) != 0) {
            fprintf(stderr, "sluice repair: rename %s over %s: %s (%zu of %zu files repaired "
                    "before it; this one and the rest unchanged)\n", files[j].tmp, files[j].real,
                    strerror(errno), j, nfiles);
            return CMD_EXIT_OPEN;
        }
        free(files[j].tmp);
        files[j].tmp = NULL;    /* it is the file now */
        test_point("renamed");
        if (sync_dir_of(files[j].real) != 0)
            fprintf(stderr, "sluice repair: fsync of the directory of %s: %s\n", files[j].real,
                    strerror(errno));
        printf("repaired %s: %zu tensor%s written\n", files[j].real, files[j].written,
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
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        return ig_open_failed("repair", m, rc);
    printf("manifest %s\n", sluice_manifest_path(m));
    ig_failed failed = {0};
    status = ig_verify_print("repair", m, 0, quiet, t0, &failed);
    rp_file *files = calloc(failed.n ? failed.n : 1, sizeof *files);
    size_t nfiles = 0;
    if (status == 0) {
        printf("nothing to repair\n");
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
        drop_copy(&files[j]);   /* what was not renamed over its file */
        free(files[j].real);
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
