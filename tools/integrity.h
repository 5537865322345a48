/* integrity.h: what the manifest, verify and cat commands share: the
 * options they take on the command line and quoting names for messages
 * (integrity.c). A manifest's digests are the library's to compute
 * (sluice_manifest_write). */
#ifndef SLUICE_TOOLS_INTEGRITY_H
#define SLUICE_TOOLS_INTEGRITY_H

#include "progress.h"

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The help text of --proxy and --proxy-kind (ig_loader_option's). */
#define IG_PROXY_HELP                                                         \
    "  --proxy URL       the HTTP proxy of every remote request (default: the\n" \
    "                    environment's http_proxy, https_proxy, all_proxy;\n"   \
    "                    '' for none; no_proxy applies); a request it fails,\n" \
    "                    or bytes of it that fail to verify, go direct\n"      \
    "  --proxy-kind K    plain (default; https:// tunnelled) or dragonfly\n"   \
    "                    (dfdaemon: its X-Dragonfly-* headers, https:// asked\n" \
    "                    as http://, never tunnelled; see docs/remote.md)\n"

/* The help text of the options ig_loader_option() takes. */
#define IG_LOADER_HELP                                                        \
    "  --pool SIZE       buffer pool budget (e.g. 512M, 4G; default 4G, or\n"  \
    "                    1/4 of a cgroup memory limit when less)\n"          \
    "  --qd N            reads in flight (default 32)\n"                      \
    "  --threads N       hashing threads (default: online CPUs)\n"            \
    "  --direct          read with O_DIRECT where the file system allows\n"   \
    "  --pread           use the pread thread pool instead of io_uring\n"     \
    "  --cache-dir DIR   a persistent cache ($SLUICE_CACHE_DIR is the default):\n" \
    "                    a remote model's verified tensors are kept there\n"   \
    "  --cache-max SIZE  the cache's budget (default 64G)\n"                  \
    "  --trust-unchanged skip hashing tensors of local files this cache saw\n" \
    "                    verified, in files unchanged since (see README)\n"    \
    "                    (the cache serves loads: cat, stats; verify and\n"    \
    "                    manifest always read and hash every byte)\n"    \
    IG_PROXY_HELP

/* The help text of --fallback (one of ig_loader_option's) for the
 * commands that load tensors (cat, stats); verify and repair say what it
 * means for them. */
#define IG_FALLBACK_HELP                                                      \
    "  --fallback LOC    a mirror (directory, file, http(s):// or s3://) that\n" \
    "                    serves a tensor whose bytes at PATH fail to verify\n"  \
    "                    or to read, verified against PATH's manifest;\n"      \
    "                    repeatable, tried in order; needs a manifest\n"

/* The help text of ig_trust_option's options: every command that opens a
 * model takes the same three, so a signed model opens alike in each. */
#define IG_TRUST_HELP                                                         \
    "  --key PUB         a trusted public key (PEM; repeatable, up to 16): the\n" \
    "                    manifest must carry a valid signature MANIFEST.sig by\n" \
    "                    one of them ('sluice keygen', 'sluice sign'); EC keys\n" \
    "                    also verify an OpenSSF model signature (model.sig)\n"   \
    "  --ca PEM          a trusted CA certificate (repeatable): an OpenSSF model\n" \
    "                    signature (model.sig) made with a certificate must chain\n" \
    "                    to one (no SHA-1; a code-signing leaf, not a CA's or a\n" \
    "                    TLS server's)\n"                                        \
    "  --signature FILE  the OpenSSF model-signing bundle (default: model.sig in\n" \
    "                    the model's directory, checked when present with --key,\n" \
    "                    always with --ca); it must list the manifest and files\n"

#define IG_KEY_MAX 16

/* A list of files from repeated options; lives as long as the options it
 * was given to. */
typedef struct ig_keys {
    const char *path[IG_KEY_MAX];
    size_t n;
} ig_keys;

/* The trust options of a command line (IG_TRUST_HELP); lives as long as
 * the options it was given to. */
typedef struct ig_trust {
    ig_keys keys, cas;
} ig_trust;

/* If argv[*i] is --key, --ca or --signature, takes the file that follows
 * into t and o (trusted_keys, trusted_cas, signature_path), advances *i
 * and returns 1; returns 0 when it is another argument; -1 (after a
 * message on stderr naming cmd) when the file is missing or there are too
 * many. */
int ig_trust_option(const char *cmd, int argc, char **argv, int *i, ig_trust *t,
                    sluice_options *o);

/* If argv[*i] is NAME, adds the file that follows to list (as
 * ig_trust_option, without touching the options); returns 1, 0 or -1. */
int ig_list_option(const char *cmd, int argc, char **argv, int *i, const char *name, ig_keys *list);

/* The tensors (sluice_info indexes, ascending) that failed a verify. */
typedef struct ig_failed {
    size_t *index;
    size_t n, cap;
} ig_failed;

/* files for ig_verify_print: whole files only (SLUICE_VF_NO_TENSORS too). */
#define IG_FILES_ONLY 2

/* Runs sluice_verify on m (with files: SLUICE_VF_FILES), printing each
 * failure ("FAILED ...") and the summary line, and collecting the failed
 * tensors into *failed (may be NULL; free failed->index). Returns the
 * exit status (cmd.h): 0 all matched, 1 a mismatch, 3 a read failure and
 * no mismatch, else the status of why the verify could not run (message
 * on stderr naming cmd). verify.c. */
int ig_verify_print(const char *cmd, sluice_model *m, int files, int quiet, double t0,
                    ig_failed *failed);

/* For each tensor of failed, whether m's fallbacks hold it verified: it
 * is acquired (the library reads m's own bytes, then each mirror in
 * order, against m's manifest) and "tensor NAME: recoverable from
 * fallback K (LOC)", or why not, is printed. Returns how many are
 * recoverable. repair.c. */
size_t ig_report_recoverable(sluice_model *m, const ig_failed *failed);

/* If argv[*i] is one of IG_LOADER_HELP's options or --fallback, applies it to o,
 * advances *i past its value and returns 1; returns 0 when it is not one;
 * -1 (after a message on stderr naming cmd) for a bad or missing value. */
int ig_loader_option(const char *cmd, int argc, char **argv, int *i, sluice_options *o);

/* If argv[*i] is the option `name` or its short form `alias` (may be
 * NULL), stores the file name that follows in *value, advances *i past it
 * and returns 1; returns 0 when it is another argument; -1 (after a
 * message on stderr naming cmd) when the file name is missing. */
int ig_file_option(const char *cmd, int argc, char **argv, int *i, const char *name,
                   const char *alias, const char **value);

/* The argument a that no option took, in a command of one PATH: stores
 * it in *path and returns 0; returns -1 (after a message on stderr naming
 * cmd, and usage(stderr) for an unknown option) when it is an option or a
 * second PATH. */
int ig_path_operand(const char *cmd, const char *a, const char **path, void (*usage)(FILE *));

/* 0 when m's index is PATH's own; -1 (after a message on stderr naming
 * cmd and why PATH could not be opened) when a mirror serves it
 * (sluice_model_location): verify and repair judge PATH, never a mirror. */
int ig_own_location(const char *cmd, const char *path, const sluice_model *m);

/* After sluice_open failed with rc: prints "sluice CMD: why" (m's
 * message, or rc's name when m is NULL), closes m and returns the exit
 * status (cmd_exit_status). */
int ig_open_failed(const char *cmd, sluice_model *m, int rc);

/* Warns on stderr, naming cmd, when m was opened with nothing to check
 * its bytes against (sluice_verify_state: no manifest found, or
 * verification off), so that a load is never unverified in silence.
 * Returns 1 when it warned, else 0. Notes first (not a warning) when a
 * mirror serves the model because its own location could not be opened
 * (sluice_model_location). */
int ig_warn_unverified(const char *cmd, const sluice_model *m);

/* What m's bytes are checked against, as `sluice verify` and `sluice
 * inspect` say it on out, each line after prefix: "manifest M" (with the
 * signature that was verified: M.sig by a trusted key, or the OpenSSF
 * model.sig), then, for a Hugging Face Hub snapshot, "verified against the
 * publisher's file digest: ..."; with unverified (inspect; verify opens
 * with REQUIRE and never has it) "not verified: no manifest found (no
 * sidecar ...)" or "not verified: verification is off". path, o and t are
 * the open's. */
void ig_print_checked_against(FILE *out, const char *prefix, const char *path,
                              const sluice_model *m, const sluice_options *o, const ig_trust *t);

/* "512M", "4G", "1.5G", "4096" into bytes (K, M, G, T are powers of
 * 1024). Returns 0, or -1 when s is not a size. */
int ig_parse_size(const char *s, uint64_t *out);

/* name (len bytes, any content) as a quoted, escaped JSON string. */
void ig_quote(FILE *out, const char *name, size_t len);

/* Seconds on the monotonic clock. */
double ig_now(void);

#endif
