/* cgroup.h: the memory limit of this process's control group, which the
 * default pool is derived from (sluice_options_init) and an explicit pool
 * is checked against (sluice_open). cgroup.c. */
#ifndef SLUICE_CGROUP_H
#define SLUICE_CGROUP_H

#include <stddef.h>
#include <stdint.h>

/* Where this process's are read from. */
#define SL_CGROUP_SELF "/proc/self/cgroup"
#define SL_CGROUP_ROOT "/sys/fs/cgroup"

/* The default pool of the default options without a limit. */
#define SL_POOL_DEFAULT ((uint64_t)4 << 30)

/* The lowest memory limit on the way from this process's cgroup up to
 * the hierarchy's root: cgroup v2 memory.max, cgroup v1 (the memory
 * controller's hierarchy, ROOT/memory) memory.limit_in_bytes. self is the
 * /proc/self/cgroup to read ("ID:CONTROLLERS:PATH" lines), root the
 * directory the hierarchies are mounted under (/sys/fs/cgroup); both are
 * parameters so that a test can give a tree of its own. A PATH that is
 * not under root (a container without a cgroup namespace sees its
 * host's) is looked for at root itself, which is then the container's.
 * Returns 1 and *limit (bytes) with the file that sets it in where
 * (truncated to wlen), or 0 when no limit applies ("max", v1's
 * unlimited, nothing readable): never an error. */
int sl_cgroup_memory_limit(const char *self, const char *root, uint64_t *limit, char *where,
                           size_t wlen);

/* The default pool for a memory limit (0: none): SL_POOL_DEFAULT, or
 * 1/4 of the limit when that is less (a quarter holds a 1 GB embedding
 * under an 8 GiB limit and leaves the rest to the process), in whole MiB,
 * at least 1 MiB. */
uint64_t sl_pool_default(uint64_t limit);

#endif
