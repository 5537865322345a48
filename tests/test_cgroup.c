/* test_cgroup.c: the default pool follows the container (issue 25, item
 * 21). sl_cgroup_memory_limit on fake /proc/self/cgroup files and
 * /sys/fs/cgroup trees in a temporary directory (v2, v1, nested limits,
 * a container's view, no limit, garbage); sl_pool_default; and, where the
 * machine lets the test make a memory cgroup of its own (root, a writable
 * memory hierarchy; else it says so and skips), a child process moved
 * into one with a 256 MiB limit: its default pool is 64 MiB and a 1 GiB
 * pool is refused at open with both numbers. */
#include "base/cgroup.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <sluice.h>

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

/* dir/rel written with text, its directories made. */
static void put(const char *dir, const char *rel, const char *text)
{
    char *p = tu_join(dir, rel);
    for (char *s = p + strlen(dir) + 1; (s = strchr(s, '/')); s++) {
        *s = '\0';
        mkdir(p, 0755);
        *s = '/';
    }
    tu_write_file(p, text, strlen(text));
    free(p);
}

typedef struct tree_case {
    const char *what;
    const char *self;             /* /proc/self/cgroup */
    const char *files[4][2];      /* under the root: path, contents */
    int found;
    uint64_t limit;
    const char *where;            /* the file that sets it, under the root */
} tree_case;

static const tree_case cases[] = {
    {"v2, the cgroup's own limit", "0::/a/b\n",
     {{"a/b/memory.max", "268435456\n"}, {"a/memory.max", "max\n"}}, 1, 256 * MiB, "a/b/memory.max"},
    {"v2, a parent's lower limit wins", "0::/a/b\n",
     {{"a/b/memory.max", "max\n"}, {"a/memory.max", "1073741824\n"}}, 1, GiB, "a/memory.max"},
    {"v2, a cgroup namespace (the path is /)", "0::/\n",
     {{"memory.max", "536870912\n"}}, 1, 512 * MiB, "memory.max"},
    {"v2, a host path not under the root (no namespace): the root is the container's",
     "0::/docker/abc\n", {{"memory.max", "805306368\n"}}, 1, 768 * MiB, "memory.max"},
    {"v2, max everywhere", "0::/a\n", {{"a/memory.max", "max\n"}}, 0, 0, NULL},
    {"v1, the memory controller's line", "5:cpu,cpuacct:/x\n4:memory:/grp/sub\n1:name=systemd:/\n",
     {{"memory/grp/sub/memory.limit_in_bytes", "2147483648\n"},
      {"memory/grp/memory.limit_in_bytes", "9223372036854771712\n"}}, 1, 2 * GiB,
     "memory/grp/sub/memory.limit_in_bytes"},
    {"v1, memory among others", "3:cpuset,memory:/g\n",
     {{"memory/g/memory.limit_in_bytes", "104857600\n"}}, 1, 100 * MiB, "memory/g/memory.limit_in_bytes"},
    {"v1, unlimited (the page counter's maximum)", "4:memory:/g\n",
     {{"memory/g/memory.limit_in_bytes", "9223372036854771712\n"}}, 0, 0, NULL},
    {"v1 and v2 both: the lower", "4:memory:/g\n0::/g\n",
     {{"memory/g/memory.limit_in_bytes", "3221225472\n"}, {"g/memory.max", "2147483648\n"}}, 1,
     2 * GiB, "g/memory.max"},
    {"no memory line", "4:cpu:/g\n", {{"g/memory.max", "1048576\n"}}, 0, 0, NULL},
    {"garbage", "0::/g\n", {{"g/memory.max", "-5\n"}}, 0, 0, NULL},
    {"garbage 2", "0::/g\n", {{"g/memory.max", "12abc\n"}}, 0, 0, NULL},
    {"garbage 3", "nonsense\n::\n0:\n0::\n0::relative\n", {{"memory.max", "4096\n"}}, 0, 0, NULL},
    {"an empty file", "", {{"memory.max", "4096\n"}}, 0, 0, NULL},
};

static void test_fake_trees(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const tree_case *c = &cases[k];
        char *dir = tu_tmpdir();
        char *root = tu_join(dir, "cg");
        mkdir(root, 0755);
        put(dir, "self", c->self);
        for (size_t f = 0; f < 4 && c->files[f][0]; f++) {
            char rel[512];
            snprintf(rel, sizeof rel, "cg/%s", c->files[f][0]);
            put(dir, rel, c->files[f][1]);
        }
        char *self = tu_join(dir, "self");
        uint64_t limit = 12345;
        char where[1024];
        int found = sl_cgroup_memory_limit(self, root, &limit, where, sizeof where);
        if (found != c->found || (found && limit != c->limit))
            fail_msg("%s: found %d limit %llu, expected %d %llu", c->what, found,
                     (unsigned long long)limit, c->found, (unsigned long long)c->limit);
        if (c->where) {
            char *want = tu_join(root, c->where);
            if (strcmp(where, want) != 0)
                fail_msg("%s: where %s, expected %s", c->what, where, want);
            free(want);
        }
        tu_rmtree(dir);
        free(dir);
        free(root);
        free(self);
    }
    /* nothing there at all */
    uint64_t limit = 0;
    assert_int_equal(sl_cgroup_memory_limit("/nonexistent/self", "/nonexistent", &limit, NULL, 0), 0);
}

static void test_pool_default(void **state)
{
    (void)state;
    assert_int_equal(sl_pool_default(0), 4 * GiB);
    assert_int_equal(sl_pool_default(128 * GiB), 4 * GiB);
    assert_int_equal(sl_pool_default(64 * GiB), 4 * GiB);
    assert_int_equal(sl_pool_default(8 * GiB), 2 * GiB);
    assert_int_equal(sl_pool_default(256 * MiB), 64 * MiB);
    assert_int_equal(sl_pool_default(100 * MiB + 7), 25 * MiB);   /* whole MiB */
    assert_int_equal(sl_pool_default(3 * MiB), MiB);             /* at least 1 MiB */
}

/* The directory of this process's memory cgroup (v2 with the memory
 * controller, else v1's), malloc'd, and the name of its limit file; NULL
 * when there is none to make a child in. */
static char *own_memory_cgroup(const char **limit_file)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[4096];
    char *dir = NULL;
    while (f && !dir && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        char path[4096];
        if (!strncmp(line, "0::", 3)) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s", c2 + 1);
            char ctl[4200];
            snprintf(ctl, sizeof ctl, "%s/cgroup.subtree_control", path);
            size_t len;
            char *sub = tu_read_file(ctl, &len);
            if (sub && strstr(sub, "memory")) {
                dir = strdup(path);
                *limit_file = "memory.max";
            }
            free(sub);
        } else if (strstr(c1, "memory")) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s", c2 + 1);
            dir = strdup(path);
            *limit_file = "memory.limit_in_bytes";
        }
    }
    if (f)
        fclose(f);
    return dir;
}

static void test_real_cgroup(void **state)
{
    (void)state;
    const char *limit_file = NULL;
    char *parent = own_memory_cgroup(&limit_file);
    char cg[4300] = "";
    int made = 0;
    if (parent) {
        snprintf(cg, sizeof cg, "%s/sluice-test-%d", parent, (int)getpid());
        made = mkdir(cg, 0755) == 0;
    }
    char lim[4400];
    snprintf(lim, sizeof lim, "%s/%s", cg, limit_file ? limit_file : "");
    FILE *lf = made ? fopen(lim, "w") : NULL;
    int limited = lf && fprintf(lf, "268435456\n") > 0;
    if (lf && fclose(lf) != 0)
        limited = 0;
    if (made && !limited)
        rmdir(cg);
    if (!limited) {
        fprintf(stderr, "  no memory cgroup can be made here (%s): skipped\n",
                parent ? parent : "no memory controller in /proc/self/cgroup");
        free(parent);
        skip();
    }
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the child moves itself in; its checks are its exit status */
        char procs[4400];
        snprintf(procs, sizeof procs, "%s/cgroup.procs", cg);
        FILE *p = fopen(procs, "w");
        if (!p || fprintf(p, "0\n") < 0 || fclose(p) != 0)
            _exit(10);
        sluice_options o;
        sluice_options_init(&o);
        if (o.pool_bytes != 64 * MiB)
            _exit(11);
        o.pool_bytes = GiB;
        sluice_model *m = NULL;
        char *d = tu_tmpdir(), *f = tu_join(d, "m.safetensors");
        tu_write_safetensors(f, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", "abcd", 4);
        int rc = sluice_open(f, &o, &m);
        const char *msg = sluice_errmsg(m);
        int ok = rc == SLUICE_E_INVAL && strstr(msg, "1073741824") && strstr(msg, "268435456") &&
                 strstr(msg, limit_file);
        fprintf(stderr, "  in a cgroup limited to 256 MiB: default pool %llu; a 1 GiB pool: %s\n",
                (unsigned long long)(64 * MiB), msg);
        sluice_close(m);
        m = NULL;
        o.pool_bytes = 200 * MiB;   /* under the limit: fine */
        int rc2 = sluice_open(f, &o, &m);
        sluice_close(m);
        tu_rmtree(d);
        _exit(!ok ? 12 : rc2 != SLUICE_OK ? 13 : 0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    /* the child is gone: its cgroup is empty and can go */
    int removed = rmdir(cg) == 0;
    free(parent);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(removed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_trees),
        cmocka_unit_test(test_pool_default),
        cmocka_unit_test(test_real_cgroup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
