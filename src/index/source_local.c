/* source_local.c: the source of a local file (source.h): a descriptor
 * opened once, pread for the header and sluice_read_into, the ring of
 * io.c (io_uring or pread threads) for the engine's reads. Also where a
 * location's kind picks its table. */
#include "index/source.h"

#include "index/index.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sl_open_read(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

const sl_source_methods *sl_source_of(const sl_location *loc)
{
    return loc->kind == SL_LOC_HUB     ? &sl_source_hub
           : loc->kind == SL_LOC_LOCAL ? &sl_source_local
                                       : &sl_source_remote;
}

static int local_open(sl_file *f, const sl_remote_cfg *rc, int missing_code, sl_err *err)
{
    (void)rc;
    f->fd = sl_open_read(f->path);
    if (f->fd < 0)
        return sl_fail_errno(err, errno == ENOENT ? missing_code : SLUICE_E_IO, errno, "%s", f->path);
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return sl_fail_errno(err, SLUICE_E_IO, errno, "%s: stat", f->path);
    if (!S_ISREG(st.st_mode))
        return sl_fail(err, SLUICE_E_IO, "%s: not a regular file", f->path);
    f->size = (uint64_t)st.st_size;
    return SLUICE_OK;
}

/* Loops on short reads and EINTR. A read that ends early means the file
 * shrank since its fstat. */
static int local_read(sl_file *f, const sl_remote_cfg *rc, unsigned char *buf, size_t len,
                      uint64_t offset, sl_err *err)
{
    (void)rc;
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(f->fd, buf + got, len - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot read the header at byte %llu",
                                 f->path, (unsigned long long)(offset + got));
        if (r == 0)
            return sl_fail(err, SLUICE_E_FILE_CHANGED,
                           "%s: file shrank while being opened: the header ends at byte %llu, "
                           "the file now at %llu", f->path, (unsigned long long)(offset + len),
                           (unsigned long long)(offset + got));
        got += (size_t)r;
    }
    return SLUICE_OK;
}

static int local_read_tensor(const sl_file *f, const sl_remote_cfg *rc, unsigned char *buf,
                             size_t want, uint64_t offset, size_t *got, unsigned *requests,
                             sl_err *err)
{
    (void)rc;
    (void)err;
    *requests = 0;
    for (;;) {
        ssize_t r = pread(f->fd, buf, want, (off_t)offset);
        if (r < 0 && errno == EINTR)
            continue;
        *got = r > 0 ? (size_t)r : 0;
        return r < 0 ? SL_SRC_ERRNO : SLUICE_OK;
    }
}

static void local_submit(const sl_file *f, sl_io *io, sl_rio *rio, sl_io_req *req)
{
    (void)f;
    (void)rio;
    sl_io_submit(io, req);
}

static void local_close(sl_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

static int local_read_small(const sl_remote_cfg *rc, const char *path, size_t max, char **out,
                            size_t *len, sl_err *err)
{
    (void)rc;
    const int code = SLUICE_E_INDEX;
    int fd = sl_open_read(path);
    if (fd < 0)
        return sl_fail_errno(err, code, errno, "%s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        close(fd);
        return sl_fail(err, code, "%s: not a regular file of at most %zu bytes", path, max);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return sl_fail_errno(err, code, e, "%s: read", path);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return SLUICE_OK;
}

const sl_source_methods sl_source_local = {
    .kind = "file",
    .caps = SL_SRC_STABLE_IDENTITY | SL_SRC_DESCRIPTOR,
    .open = local_open,
    .read = local_read,
    .read_tensor = local_read_tensor,
    .submit = local_submit,
    .close = local_close,
    .read_small = local_read_small,
};
