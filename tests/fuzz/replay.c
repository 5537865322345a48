/* replay.c: runs a fuzz target over every file of the corpus folders
 * given as arguments, so that every past input, crashers included, is
 * replayed by ctest with the ordinary compiler and sanitizers.
 *
 * "No crash" alone would not notice a parser that wrongly accepts a file,
 * so the replay also checks verdicts: with --verdicts FILE, each line
 * "TARGET NAME CODE" says that the file named NAME (its last path
 * component), replayed by this target (fuzz_target_name), must get CODE
 * (a SLUICE_* name) from fuzz_verdict(). A file that gets another code, or
 * a listed file that was not replayed, fails the replay. */
#include "sluice.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Defined by each target: its name in the verdicts file, and the status
 * it gives an input (SLUICE_OK when accepted, else the first failure). */
extern const char fuzz_target_name[];
int fuzz_verdict(const uint8_t *data, size_t size);

#define CODE(c) {#c, c}
static const struct {
    const char *name;
    int code;
} codes[] = {
    CODE(SLUICE_OK),
    CODE(SLUICE_E_INVAL),
    CODE(SLUICE_E_NOMEM),
    CODE(SLUICE_E_IO),
    CODE(SLUICE_E_NOT_FOUND),
    CODE(SLUICE_E_NO_FILES),
    CODE(SLUICE_E_HEADER_SHORT),
    CODE(SLUICE_E_HEADER_TOO_LARGE),
    CODE(SLUICE_E_HEADER_UTF8),
    CODE(SLUICE_E_HEADER_JSON),
    CODE(SLUICE_E_HEADER_NOT_OBJECT),
    CODE(SLUICE_E_ENTRY),
    CODE(SLUICE_E_DTYPE),
    CODE(SLUICE_E_SHAPE),
    CODE(SLUICE_E_OFFSETS),
    CODE(SLUICE_E_INTEGER),
    CODE(SLUICE_E_OVERFLOW),
    CODE(SLUICE_E_SIZE_MISMATCH),
    CODE(SLUICE_E_LAYOUT),
    CODE(SLUICE_E_DUPLICATE),
    CODE(SLUICE_E_METADATA),
    CODE(SLUICE_E_INDEX),
    CODE(SLUICE_E_INDEX_SHARD),
    CODE(SLUICE_E_INDEX_MISMATCH),
    CODE(SLUICE_E_MANIFEST),
    CODE(SLUICE_E_MANIFEST_FORMAT),
    CODE(SLUICE_E_MANIFEST_DIGEST),
    CODE(SLUICE_E_MANIFEST_DUPLICATE),
    CODE(SLUICE_E_MANIFEST_UNKNOWN),
    CODE(SLUICE_E_MANIFEST_MISSING),
    CODE(SLUICE_E_CHECKSUM),
    CODE(SLUICE_E_MANIFEST_MISMATCH),
    CODE(SLUICE_E_UNSUPPORTED),
    CODE(SLUICE_E_SIGNATURE),
    CODE(SLUICE_E_TOO_LARGE),
    CODE(SLUICE_E_POOL_EXHAUSTED),
    CODE(SLUICE_E_BUSY),
    CODE(SLUICE_E_FILE_CHANGED),
};

static const char *code_name(int code)
{
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i].code == code)
            return codes[i].name;
    return "(unknown code)";
}

typedef struct verdict {
    char name[256];
    int code;
    int seen;
} verdict;

typedef struct verdicts {
    verdict *v;
    size_t n;
} verdicts;

/* Reads this target's lines of path. Returns the failures (0 or 1). */
static int load_verdicts(const char *path, verdicts *out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return 1;
    }
    char line[1024];
    int failures = 0;
    unsigned lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char target[64], name[256], codestr[64];
        if (line[0] == '#' || strspn(line, " \t\r\n") == strlen(line))
            continue;
        if (sscanf(line, "%63s %255s %63s", target, name, codestr) != 3) {
            fprintf(stderr, "%s:%u: not \"TARGET NAME CODE\"\n", path, lineno);
            failures = 1;
            continue;
        }
        if (strcmp(target, fuzz_target_name) != 0)
            continue;
        size_t k = 0;
        while (k < sizeof codes / sizeof codes[0] && strcmp(codes[k].name, codestr) != 0)
            k++;
        if (k == sizeof codes / sizeof codes[0]) {
            fprintf(stderr, "%s:%u: unknown code %s\n", path, lineno, codestr);
            failures = 1;
            continue;
        }
        verdict *grown = realloc(out->v, (out->n + 1) * sizeof *grown);
        if (!grown) {
            failures = 1;
            break;
        }
        out->v = grown;
        snprintf(out->v[out->n].name, sizeof out->v[out->n].name, "%s", name);
        out->v[out->n].code = codes[k].code;
        out->v[out->n].seen = 0;
        out->n++;
    }
    fclose(f);
    return failures;
}

/* Checks path's verdict when one is listed. Returns the failures. */
static int check_verdict(verdicts *vs, const char *path, const uint8_t *data, size_t len)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    for (size_t i = 0; i < vs->n; i++) {
        if (strcmp(vs->v[i].name, base) != 0)
            continue;
        vs->v[i].seen++;
        int got = fuzz_verdict(data, len);
        if (got == vs->v[i].code)
            return 0;
        fprintf(stderr, "%s: %s gives %s, expected %s\n", fuzz_target_name, path, code_name(got),
                code_name(vs->v[i].code));
        return 1;
    }
    return 0;
}

static int replay_file(const char *path, verdicts *vs)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf)
        return 1;
    /* an exact-size copy, so that ASan catches a read one past the end */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    int failures = check_verdict(vs, path, exact, len);
    free(exact);
    return failures;
}

static int replay(const char *path, int *count, verdicts *vs)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return replay_file(path, vs);
    }
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return 1;
    }
    int failures = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *child = malloc(n);
        if (!child) {
            failures++;
            break;
        }
        snprintf(child, n, "%s/%s", path, e->d_name);
        failures += replay(child, count, vs);
        free(child);
    }
    closedir(d);
    return failures;
}

int main(int argc, char **argv)
{
    int failures = 0, count = 0, first = 1;
    verdicts vs = {NULL, 0};
    if (argc > 2 && strcmp(argv[1], "--verdicts") == 0) {
        failures += load_verdicts(argv[2], &vs);
        first = 3;
    }
    for (int i = first; i < argc; i++)
        failures += replay(argv[i], &count, &vs);
    size_t checked = 0;
    for (size_t i = 0; i < vs.n; i++) {
        if (vs.v[i].seen == 1) {
            checked++;
            continue;
        }
        fprintf(stderr, "%s: %s is listed in the verdicts but was replayed %d times, not once\n",
                fuzz_target_name, vs.v[i].name, vs.v[i].seen);
        failures++;
    }
    printf("replayed %d inputs, %zu verdicts checked, %d failures\n", count, checked, failures);
    free(vs.v);
    return failures ? 1 : 0;
}
