/* tool_run.h: runs the sluice command (SLUICE_BINARY_DIR/sluice) as a
 * program for the CLI tests (test_manifest_tools.c, test_sign_tools.c):
 * its exit status and what it wrote. Header-only, like mf_fixture.h;
 * include it after <cmocka.h>. */
#ifndef SLUICE_TEST_TOOL_RUN_H
#define SLUICE_TEST_TOOL_RUN_H

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const tool = SLUICE_BINARY_DIR "/sluice";

typedef struct run_result {
    int status;       /* exit status, or 128 + signal */
    char *out, *err;  /* what it wrote, NUL-terminated */
    size_t out_len, err_len;
} run_result;

static inline void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

/* Runs the tool with args (NULL-terminated), stdout and stderr to files. */
static inline run_result run(const char *dir, const char *arg0, ...)
{
    const char *argv[32];
    int argc = 0;
    argv[argc++] = tool;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char *out = tu_join(dir, "stdout"), *err = tu_join(dir, "stderr");
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        execv(tool, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        assert_int_equal(errno, EINTR);
    run_result r = {0};
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = tu_read_file(out, &r.out_len);
    r.err = tu_read_file(err, &r.err_len);
    assert_non_null(r.out);
    assert_non_null(r.err);
    char *o2 = realloc(r.out, r.out_len + 1), *e2 = realloc(r.err, r.err_len + 1);
    assert_non_null(o2);
    assert_non_null(e2);
    r.out = o2;
    r.err = e2;
    r.out[r.out_len] = '\0';
    r.err[r.err_len] = '\0';
    free(out);
    free(err);
    return r;
}

static inline void expect_status(const run_result *r, int status, const char *what)
{
    if (r->status != status)
        fail_msg("%s: exit %d, expected %d\nstdout: %s\nstderr: %s", what, r->status, status, r->out, r->err);
}

/* A group setup: skips the program (77) when the command is not built. */
static inline int tool_group_setup(void **state)
{
    (void)state;
    if (access(tool, X_OK) != 0) {
        fprintf(stderr, "%s not built: skipping\n", tool);
        exit(77);
    }
    return 0;
}

#endif
