/* cache.c: `sluice cache`: looks after a persistent cache directory (see
 * "Persistent cache" in sluice.h) through the library's sluice_cache_*
 * calls: lists it, sums it, collects garbage, clears it, rehashes it. */
#include "cmd.h"
#include "integrity.h"

#include <sluice.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice cache [--cache-dir DIR] ls [--json]|du|gc [--max SIZE]|clear|verify\n"
            "\n"
            "Looks after a persistent cache directory (the blobs of verified remote\n"
            "tensors and the verified-once memo).\n"
            "\n"
            "  ls               one line per entry, least recently used first: size,\n"
            "                   time since last use, ALGORITHM:DIGEST, source; then a\n"
            "                   line per tensor stored as that blob: tensor \"NAME\" of\n"
            "                   MODEL (none for a blob an older sluice stored)\n"
            "  ls --json        the same as one JSON object: {\"cache\": DIR, \"entries\":\n"
            "                   [{\"algorithm\", \"digest\", \"bytes\", \"source\",\n"
            "                   \"created_ns\", \"last_access_ns\", \"present\", \"names\":\n"
            "                   [{\"model\", \"tensor\"}]}]}\n"
            "  du               the bytes and entries recorded\n"
            "  gc [--max SIZE]  delete least recently used blobs until at most SIZE\n"
            "                   remain (e.g. 10G, 512M, 0; default 64G), entries whose\n"
            "                   blob is gone, and leftovers of dead processes; record\n"
            "                   blobs no entry names\n"
            "  clear            delete every blob, entry and memo record\n"
            "  verify           rehash every blob and delete those that do not match\n"
            "                   their name; a good blob the index lacks (a fill cut\n"
            "                   short, an index lost) is recorded\n"
            "\n"
            "  --cache-dir DIR  the cache (default: $SLUICE_CACHE_DIR, else\n"
            "                   $XDG_CACHE_HOME/sluice, else ~/.cache/sluice)\n"
            "\n"
            "ls, du and verify create nothing: where the directory holds no cache they\n"
            "say so and exit 3. gc and clear make the cache they are given.\n"
            "\n"
            CMD_EXIT_HELP
            "cache: 1 verify found bad blobs; 3 a cache that cannot be opened (or, for\n"
            "ls, du and verify, is not there).\n");
}

/* "45s", "12m", "3h", "4d" since ns (CLOCK_REALTIME). */
static const char *age(int64_t ns, char *buf, size_t size)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    int64_t s = now > ns ? (now - ns) / 1000000000LL : 0;
    if (s < 60)
        snprintf(buf, size, "%llds", (long long)s);
    else if (s < 3600)
        snprintf(buf, size, "%lldm", (long long)(s / 60));
    else if (s < 86400)
        snprintf(buf, size, "%lldh", (long long)(s / 3600));
    else
        snprintf(buf, size, "%lldd", (long long)(s / 86400));
    return buf;
}

/* ls: the entry's line, then a line per tensor stored as its blob:
 * `tensor "NAME" of MODEL` (NAME JSON-quoted: any byte reads back). */
static int print_entry(void *user, const sluice_cache_entry *e)
{
    (void)user;
    char b[32], a[32];
    printf("%10s  %4s  %s:%s  %s%s\n", progress_bytes(e->bytes, b, sizeof b),
           age(e->last_access_ns, a, sizeof a), sluice_algorithm_name(e->algorithm), e->digest,
           e->source, e->present ? "" : "  (blob missing)");
    for (size_t k = 0; k < e->nnames; k++) {
        printf("%18s tensor ", "");
        ig_quote(stdout, e->names[k].tensor, e->names[k].tensor_len);
        printf(" of %s\n", e->names[k].model);
    }
    return 0;
}

/* ls --json: one object of the entries array (the caller writes the
 * commas and brackets). */
static int json_entry(void *user, const sluice_cache_entry *e)
{
    size_t *n = user;
    printf("%s\n    {\"algorithm\": \"%s\", \"digest\": \"%s\", \"bytes\": %" PRIu64
           ", \"source\": ", (*n)++ ? "," : "", sluice_algorithm_name(e->algorithm), e->digest,
           e->bytes);
    ig_quote(stdout, e->source, strlen(e->source));
    printf(", \"created_ns\": %" PRId64 ", \"last_access_ns\": %" PRId64
           ", \"present\": %s, \"names\": [", e->created_ns, e->last_access_ns,
           e->present ? "true" : "false");
    for (size_t k = 0; k < e->nnames; k++) {
        printf("%s{\"model\": ", k ? ", " : "");
        ig_quote(stdout, e->names[k].model, strlen(e->names[k].model));
        printf(", \"tensor\": ");
        ig_quote(stdout, e->names[k].tensor, e->names[k].tensor_len);
        printf("}");
    }
    printf("]}");
    return 0;
}

typedef struct verify_state {
    uint64_t bad;      /* reported, other than "not checked" or "recorded" */
    uint64_t recorded; /* blobs without an entry, good, recorded */
} verify_state;

static void on_bad(void *user, const sluice_cache_entry *e, const char *why)
{
    verify_state *s = user;
    int skipped = !strncmp(why, "not checked", 11);
    int recorded = !strncmp(why, "recorded:", 9);
    if (recorded)
        s->recorded++;
    else if (!skipped)
        s->bad++;
    printf("%s %s:%s: %s\n", skipped ? "SKIPPED" : recorded ? "RECORDED" : "BAD",
           sluice_algorithm_name(e->algorithm), e->digest, why);
}

int cmd_cache(int argc, char **argv)
{
    const char *dir = NULL, *action = NULL, *max_arg = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--cache-dir") || !strcmp(a, "--max")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice cache: %s needs a value\n", a);
                return 2;
            }
            if (!strcmp(a, "--cache-dir"))
                dir = argv[++i];
            else
                max_arg = argv[++i];
        } else if (a[0] == '-' || action) {
            fprintf(stderr, "sluice cache: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            action = a;
        }
    }
    static const char *const actions[] = {"ls", "du", "gc", "clear", "verify"};
    int known = 0;
    for (size_t k = 0; action && k < sizeof actions / sizeof actions[0]; k++)
        known |= !strcmp(action, actions[k]);
    if (!known) {
        if (action)
            fprintf(stderr, "sluice cache: unknown action '%s'\n", action);
        usage(stderr);
        return 2;
    }
    uint64_t max = SLUICE_CACHE_DEFAULT_BYTES;
    if (max_arg && (strcmp(action, "gc") || ig_parse_size(max_arg, &max) < 0)) {
        fprintf(stderr, strcmp(action, "gc") ? "sluice cache: --max is for gc only\n"
                                             : "sluice cache: --max: not a size: '%s'\n",
                max_arg);
        return 2;
    }
    if (json && strcmp(action, "ls") != 0) {
        fprintf(stderr, "sluice cache: --json is for ls only\n");
        return 2;
    }

    /* Only gc and clear may make the cache they are given; the others read,
     * and a typo in --cache-dir must not leave a new cache behind. */
    int reads_only = strcmp(action, "gc") && strcmp(action, "clear");
    sluice_cache *c = NULL;
    if ((reads_only ? sluice_cache_open_existing(dir, &c) : sluice_cache_open(dir, &c)) !=
        SLUICE_OK) {
        fprintf(stderr, "sluice cache: %s\n", sluice_cache_errmsg(c));
        sluice_cache_close(c);
        return CMD_EXIT_OPEN;
    }
    int rc = SLUICE_OK, status = 0;
    char b[32];
    uint64_t bytes = 0, n = 0;
    if (!strcmp(action, "ls") && json) {
        size_t listed = 0;
        printf("{\"cache\": ");
        ig_quote(stdout, sluice_cache_path(c), strlen(sluice_cache_path(c)));
        printf(", \"entries\": [");
        rc = sluice_cache_list(c, json_entry, &listed);
        if (rc == SLUICE_OK)
            printf("%s]}\n", listed ? "\n  " : "");
    } else if (!strcmp(action, "ls")) {
        rc = sluice_cache_list(c, print_entry, NULL);
    } else if (!strcmp(action, "du")) {
        rc = sluice_cache_usage(c, &bytes, &n);
        if (rc == SLUICE_OK)
            printf("%s (%" PRIu64 " bytes) in %" PRIu64 " entries: %s\n",
                   progress_bytes(bytes, b, sizeof b), bytes, n, sluice_cache_path(c));
    } else if (!strcmp(action, "gc") || !strcmp(action, "clear")) {
        rc = !strcmp(action, "gc") ? sluice_cache_gc(c, max, &bytes, &n)
                                   : sluice_cache_clear(c, &bytes, &n);
        uint64_t left = 0, left_n = 0;
        if (rc == SLUICE_OK)
            rc = sluice_cache_usage(c, &left, &left_n);
        if (rc == SLUICE_OK) {
            char l[32];
            printf("freed %s (%" PRIu64 " bytes) and %" PRIu64 " entries; %s (%" PRIu64
                   " bytes) in %" PRIu64 " entries left\n",
                   progress_bytes(bytes, b, sizeof b), bytes, n, progress_bytes(left, l, sizeof l),
                   left, left_n);
        }
    } else {
        verify_state s = {0};
        uint64_t checked = 0, dropped = 0;
        rc = sluice_cache_verify(c, &checked, &dropped, on_bad, &s);
        if (rc == SLUICE_OK) {
            printf("%" PRIu64 " blobs checked, %" PRIu64 " dropped, %" PRIu64
                   " recorded\n", checked, dropped, s.recorded);
            status = s.bad ? CMD_EXIT_INTEGRITY : 0;
        }
    }
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice cache %s: %s\n", action, sluice_cache_errmsg(c));
        status = cmd_exit_status(rc);
    }
    sluice_cache_close(c);
    return status;
}
