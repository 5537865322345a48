/* integrity.c: see integrity.h. */
#include "integrity.h"

#include "cmd.h"
#include "jsonout.h"
#include "msign.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double ig_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ig_quote(FILE *out, const char *name, size_t len)
{
    json_string(out, name, len);
}

int ig_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0)
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul != 1 && *end == 'i') /* "MiB" */
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mul >= 18446744073709551616.0)
        return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end || errno || v > UINT32_MAX || s[0] == '-')
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* --proxy URL, --proxy-kind plain|dragonfly (sluice.h "Proxies"). */
static int proxy_option(const char *cmd, int argc, char **argv, int *i, sluice_options *o)
{
    const char *a = argv[*i];
    int kind = !strcmp(a, "--proxy-kind");
    if (!kind && strcmp(a, "--proxy") != 0)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "sluice %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (!kind) {
        o->http_proxy = v;  /* argv outlives every model the command opens */
        return 1;
    }
    if (!strcmp(v, "plain") || !strcmp(v, "dragonfly")) {
        o->proxy_kind = !strcmp(v, "dragonfly") ? SLUICE_PROXY_DRAGONFLY : SLUICE_PROXY_PLAIN;
        return 1;
    }
    fprintf(stderr, "sluice %s: --proxy-kind: '%s' is not plain or dragonfly\n", cmd, v);
    return -1;
}

int ig_loader_option(const char *cmd, int argc, char **argv, int *i, sluice_options *o)
{
    const char *a = argv[*i];
    int px = proxy_option(cmd, argc, argv, i, o);
    if (px)
        return px;
    if (!strcmp(a, "--direct")) {
        o->flags |= SLUICE_F_DIRECT;
        return 1;
    }
    if (!strcmp(a, "--pread")) {
        o->flags |= SLUICE_F_FORCE_PREAD;
        return 1;
    }
    if (!strcmp(a, "--trust-unchanged")) {
        o->flags |= SLUICE_F_TRUST_UNCHANGED;
        return 1;
    }
    if (!strcmp(a, "--cache-dir")) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "sluice %s: --cache-dir needs a directory\n", cmd);
            return -1;
        }
        o->cache_dir = argv[++*i];  /* argv outlives every model the command opens */
        return 1;
    }
    if (!strcmp(a, "--fallback")) {
        /* argv outlives every model the command opens */
        static const char *mirrors[16];
        if (*i + 1 >= argc) {
            fprintf(stderr, "sluice %s: --fallback needs a location\n", cmd);
            return -1;
        }
        if (o->fallback_count >= 16) {
            fprintf(stderr, "sluice %s: at most 16 --fallback\n", cmd);
            return -1;
        }
        mirrors[o->fallback_count++] = argv[++*i];
        o->fallback = mirrors;
        return 1;
    }
    int which = !strcmp(a, "--pool") ? 1 : !strcmp(a, "--qd") ? 2 : !strcmp(a, "--threads") ? 3
              : !strcmp(a, "--cache-max") ? 4 : 0;
    if (!which)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "sluice %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    int bad = which == 1 ? ig_parse_size(v, &o->pool_bytes)
            : which == 4 ? ig_parse_size(v, &o->cache_bytes)
            : which == 2 ? parse_u32(v, &o->queue_depth)
                         : parse_u32(v, &o->hash_threads);
    if (bad) {
        fprintf(stderr, "sluice %s: %s: bad value '%s'\n", cmd, a, v);
        return -1;
    }
    return 1;
}

int ig_path_operand(const char *cmd, const char *a, const char **path, void (*usage)(FILE *))
{
    if (a[0] == '-' && a[1]) {
        fprintf(stderr, "sluice %s: unknown option '%s'\n", cmd, a);
        usage(stderr);
        return -1;
    }
    if (*path) {
        fprintf(stderr, "sluice %s: one PATH only ('%s')\n", cmd, a);
        return -1;
    }
    *path = a;
    return 0;
}

int ig_file_option(const char *cmd, int argc, char **argv, int *i, const char *name,
                   const char *alias, const char **value)
{
    const char *a = argv[*i];
    if (strcmp(a, name) != 0 && !(alias && !strcmp(a, alias)))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "sluice %s: %s needs a file\n", cmd, a);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int ig_trust_option(const char *cmd, int argc, char **argv, int *i, ig_trust *t,
                    sluice_options *o)
{
    int r;
    if ((r = ig_list_option(cmd, argc, argv, i, "--key", &t->keys)) != 0) {
        o->trusted_keys = t->keys.path;
        o->ntrusted_keys = t->keys.n;
    } else if ((r = ig_list_option(cmd, argc, argv, i, "--ca", &t->cas)) != 0) {
        o->trusted_cas = t->cas.path;
        o->ntrusted_cas = t->cas.n;
    } else {
        r = ig_file_option(cmd, argc, argv, i, "--signature", NULL, &o->signature_path);
    }
    return r;
}

int ig_list_option(const char *cmd, int argc, char **argv, int *i, const char *name, ig_keys *list)
{
    const char *path = NULL;
    int r = ig_file_option(cmd, argc, argv, i, name, NULL, &path);
    if (r <= 0)
        return r;
    if (list->n == IG_KEY_MAX) {
        fprintf(stderr, "sluice %s: more than %d %s options\n", cmd, IG_KEY_MAX, name);
        return -1;
    }
    list->path[list->n++] = path;
    return 1;
}

int ig_own_location(const char *cmd, const char *path, const sluice_model *m)
{
    unsigned k = 0;
    const char *why = NULL;
    sluice_model_location(m, &k, &why);
    if (!k)
        return 0;
    fprintf(stderr, "sluice %s: %s cannot be opened (%s); the mirrors stand in for it when "
            "loading, but %s judges %s's own bytes\n", cmd, path, why ? why : "", cmd, path);
    return -1;
}

int ig_open_failed(const char *cmd, sluice_model *m, int rc)
{
    fprintf(stderr, "sluice %s: %s\n", cmd, m ? sluice_errmsg(m) : sluice_strerror(rc));
    sluice_close(m);
    return cmd_exit_status(rc);
}

/* What the publisher's digest is, for SLUICE_VERIFIED_PUBLISHER_DIGEST:
 * a snapshot's blob names, or the LFS SHA-256 the Hub's API lists for an
 * hf:// model that publishes no sluice manifest. */
static const char *publisher_digest_words(const sluice_model *m)
{
    unsigned k = 0;
    const char *loc = sluice_model_location(m, &k, NULL);
    return loc && !strncmp(loc, "hf://", 5)
        ? "an hf:// model with no sluice manifest: the LFS SHA-256 the Hub publishes for each file"
        : "a Hugging Face Hub snapshot: the SHA-256 its blobs are named by";
}

int ig_warn_unverified(const char *cmd, const sluice_model *m)
{
    /* a mirror serving the whole model is said too: the model's own
     * location is down, which its operator wants to know */
    unsigned k = 0;
    const char *why = NULL, *loc = sluice_model_location(m, &k, &why);
    if (k)
        fprintf(stderr, "sluice %s: note: fallback %u (%s) serves the model: its own location "
                "could not be opened (%s)\n", cmd, k, loc, why ? why : "");
    const char *where = NULL;
    switch (sluice_verify_state(m, &where)) {
    case SLUICE_UNVERIFIED_NO_MANIFEST:
        fprintf(stderr, "sluice %s: warning: not verified: no manifest found (no sidecar %s); "
                "the tensors are read unchecked (write one with 'sluice manifest', or name "
                "one with --manifest)\n", cmd, where ? where : "");
        return 1;
    case SLUICE_UNVERIFIED_OFF:
        fprintf(stderr, "sluice %s: warning: not verified: verification is off; the tensors "
                "are read unchecked\n", cmd);
        return 1;
    case SLUICE_VERIFIED_PUBLISHER_DIGEST:
        fprintf(stderr, "sluice %s: verified against the publisher's file digest (%s; "
                "manifest %s)\n", cmd, publisher_digest_words(m), where ? where : "");
        return 0;
    default:
        return 0;
    }
}

void ig_print_checked_against(FILE *out, const char *prefix, const char *path,
                              const sluice_model *m, const sluice_options *o, const ig_trust *t)
{
    const char *where = NULL;
    int state = sluice_verify_state(m, &where);
    if (state == SLUICE_UNVERIFIED_NO_MANIFEST) {
        fprintf(out, "%snot verified: no manifest found (no sidecar %s)\n", prefix,
                where ? where : "");
        return;
    }
    if (state != SLUICE_VERIFIED && state != SLUICE_VERIFIED_PUBLISHER_DIGEST) {
        fprintf(out, "%snot verified: verification is off\n", prefix);
        return;
    }
    const char *mf = sluice_manifest_path(m);
    if (o->signature_path || t->cas.n || ms_applied(path, t->keys.path, t->keys.n))
        fprintf(out, "%smanifest %s: OpenSSF model signature verified (%s: lists the manifest and "
                "every file)\n", prefix, mf, o->signature_path ? o->signature_path : "model.sig");
    else if (t->keys.n)
        fprintf(out, "%smanifest %s: signature verified (%s.sig, by one of %zu trusted key%s)\n",
                prefix, mf, mf, t->keys.n, t->keys.n == 1 ? "" : "s");
    else
        fprintf(out, "%smanifest %s\n", prefix, mf);
    if (state == SLUICE_VERIFIED_PUBLISHER_DIGEST)
        fprintf(out, "%sverified against the publisher's file digest: %s\n", prefix,
                publisher_digest_words(m));
}
