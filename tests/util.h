/* util.h: helpers shared by the tests: temporary folders and
 * .safetensors files written on the spot. */
#ifndef SLUICE_TEST_UTIL_H
#define SLUICE_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Makes a fresh temporary directory (under $TMPDIR or /tmp) and returns
 * its path (malloc'd). Aborts the test on failure. */
char *tu_tmpdir(void);

/* A fresh temporary directory on a file system whose files' times sluice
 * trusts (a disk: not tmpfs, overlayfs, NFS, ...; sl_file_id_untrusted_fs),
 * for the tests of what needs one (the verified-once memo; O_DIRECT, which
 * tmpfs refuses before Linux 6.6): the first of $TMPDIR, the build tree,
 * /var/tmp and /tmp that is one, so that a /tmp on tmpfs does not make
 * them fail or skip. NULL when none is, with each candidate and its file
 * system said in why. */
char *tu_disk_tmpdir(char *why, size_t len);

/* tu_disk_tmpdir's folder where there is one, else tu_tmpdir's: for tests
 * that run anywhere but test more on a disk (O_DIRECT taken, not refused). */
char *tu_disk_or_tmpdir(void);

/* Removes path and everything below it; frees nothing. */
void tu_rmtree(const char *path);

/* dir + "/" + name, malloc'd. */
char *tu_join(const char *dir, const char *name);

/* Writes len bytes to path (created or truncated). Aborts on failure. */
void tu_write_file(const char *path, const void *data, size_t len);

/* Writes a .safetensors file: the 8-byte little-endian length of header,
 * header itself (strlen), then data_len bytes of data (pattern bytes when
 * data is NULL: byte i is (i * 131 + 7) & 0xff). */
void tu_write_safetensors(const char *path, const char *header,
                          const void *data, size_t data_len);

/* Reads the whole file (malloc'd, with a NUL after the last byte; *len
 * set). NULL if it cannot be read. */
void *tu_read_file(const char *path, size_t *len);

/* Copies the file from to the file to (aborts when from cannot be read). */
void tu_copy_file(const char *from, const char *to);

/* Reads len bytes at offset of path into a malloc'd buffer (aborts on a
 * short read; a NUL follows the last byte): the independent check of
 * what sluice hands out. */
void *tu_pread_range(const char *path, uint64_t offset, size_t len);

/* The real-world corpus folder (../shared/data/real), or NULL when absent
 * (then it says so on stderr, and the caller skips its test). */
const char *tu_real_data(void);

/* The field key ("VmRSS:", "VmHWM:") of /proc/self/status in KiB; -1
 * when it cannot be read. */
long tu_status_kib(const char *key);

/* Resets the process's peak resident memory (VmHWM) to its present one
 * ("5" to /proc/self/clear_refs, proc(5)); nothing where it cannot. */
void tu_reset_peak_rss(void);

/* Lists the *.safetensors files directly inside dir, sorted; returns
 * the count and a malloc'd array of malloc'd paths (free with tu_free_list). */
size_t tu_list_safetensors(const char *dir, char ***out);
void tu_free_list(char **list, size_t n);

#endif
