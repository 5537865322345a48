/* msign.c: the sluice command's side of OpenSSF model signing:
 * `sluice sign DIR --format model-signing` (write model.sig over a
 * directory, as the reference's `sign key` / `sign certificate` do),
 * `sluice keygen --curve` (an EC key for it), and the file-level check
 * `sluice verify PATH --no-manifest-link` (the bundle and every file's
 * digest, as the reference's verifier checks, with no sluice manifest).
 *
 * The format is the library's own src/trust/model_signing.c, compiled in.
 */
#include "cmd.h"
#include "integrity.h"
#include "trust/model_signing.h"
#include "msign.h"
#include "trust/signature.h"

#include <openssl/pem.h>

#include <dirent.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- keygen */

EVP_PKEY *ms_keygen_curve(const char *curve)
{
    const char *group = !strcmp(curve, "p256") ? "P-256"
                        : !strcmp(curve, "p384") ? "P-384"
                        : !strcmp(curve, "p521") ? "P-521" : NULL;
    if (!group) {
        fprintf(stderr, "sluice keygen: unknown curve '%s' (p256, p384 or p521; none: Ed25519)\n",
                curve);
        return NULL;
    }
    EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "EC", group);
    if (!key)
        fprintf(stderr, "sluice keygen: cannot make an EC %s key\n", group);
    return key;
}

/* ---------------------------------------------------------------- sign */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice sign MODEL_DIR --format model-signing --key EC_KEY\n"
            "                   [--cert CERT [--chain CHAIN]...] [-o FILE]\n"
            "\n"
            "Signs the directory as OpenSSF model signing (sigstore/model-transparency,\n"
            "model_signing 1.x) does: every file under MODEL_DIR with its SHA-256 (files\n"
            "mode), but model.sig, .git, .gitattributes, .github and .gitignore, in a\n"
            "Sigstore bundle written to MODEL_DIR/model.sig. Run 'sluice manifest' first:\n"
            "the manifest is then one of the files signed, which sluice_open checks\n"
            "('sluice verify MODEL_DIR --key EC_KEY.pub' or '--ca CA.pem').\n"
            "\n"
            "  --key EC_KEY      the EC private key (P-256, P-384 or P-521, unencrypted\n"
            "                    PEM; 'sluice keygen --curve p256')\n"
            "  --cert CERT       sign with this certificate (PEM; its key is EC_KEY's; a\n"
            "                    code-signing leaf: extended key usage codeSigning, key\n"
            "                    usage digitalSignature, not a CA, as verifiers ask):\n"
            "                    the bundle carries it and the chain, to be checked\n"
            "                    against a CA; without it, the bundle names the key\n"
            "  --chain CHAIN     the certificates between CERT and the CA (PEM; repeatable)\n"
            "  -o FILE           write the bundle to FILE instead\n"
            "\n"
            CMD_EXIT_HELP
            "sign: 3 for a key, certificate or file that cannot be used, or a bundle\n"
            "that cannot be written.\n");
}

static X509 *read_cert(const char *path, STACK_OF(X509) *all)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "sluice sign: cannot open %s\n", path);
        return NULL;
    }
    X509 *first = NULL, *c;
    while ((c = PEM_read_X509(f, NULL, NULL, NULL))) {
        if (!first)
            first = c;
        if (all)
            sk_X509_push(all, c);
        else if (c != first)
            X509_free(c);
    }
    fclose(f);
    if (!first)
        fprintf(stderr, "sluice sign: %s: no PEM certificate in it\n", path);
    return first;
}

/* 1 when dir holds a sidecar manifest (sluice.manifest.json or
 * F.manifest.json), which the signature then lists. */
static int has_manifest(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) {
        size_t n = strlen(e->d_name), k = strlen(".manifest.json");
        found = n > k && !strcmp(e->d_name + n - k, ".manifest.json");
    }
    if (d)
        closedir(d);
    return found;
}

int ms_cmd_sign(int argc, char **argv)
{
    const char *dir = NULL, *key_path = NULL, *cert_path = NULL, *out = NULL, *format = NULL;
    const char *chains[16];
    size_t nchains = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *c = NULL;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((r = ig_file_option("sign", argc, argv, &i, "--key", "-k", &key_path)) != 0 ||
                   (r = ig_file_option("sign", argc, argv, &i, "--cert", NULL, &cert_path)) != 0 ||
                   (r = ig_file_option("sign", argc, argv, &i, "--format", NULL, &format)) != 0 ||
                   (r = ig_file_option("sign", argc, argv, &i, "--output", "-o", &out)) != 0) {
            if (r < 0)
                return 2;
        } else if ((r = ig_file_option("sign", argc, argv, &i, "--chain", NULL, &c)) != 0) {
            if (r < 0)
                return 2;
            if (nchains == 16) {
                fprintf(stderr, "sluice sign: more than 16 --chain options\n");
                return 2;
            }
            chains[nchains++] = c;
        } else if (ig_path_operand("sign", a, &dir, usage) < 0) {
            return 2;
        }
    }
    if (!dir || !key_path || (nchains && !cert_path)) {
        usage(stderr);
        return 2;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "sluice sign: %s: not a directory (--format model-signing signs a "
                "model's directory)\n", dir);
        return 2;
    }
    char sig_path[4096];
    snprintf(sig_path, sizeof sig_path, "%s", out ? out : "");
    if (!out)
        snprintf(sig_path, sizeof sig_path, "%s/%s", dir, SL_MS_DEFAULT_NAME);
    if (!has_manifest(dir))
        fprintf(stderr, "sluice sign: warning: %s has no sluice manifest (sluice.manifest.json, "
                "F.manifest.json): the signature will not link one, and sluice_open will refuse "
                "it (run 'sluice manifest %s -o %s/sluice.manifest.json' first)\n", dir, dir, dir);
    int status = CMD_EXIT_OPEN;   /* what fails below: a file, a key, memory */
    sl_err err = {0};
    EVP_PKEY *key = NULL;
    X509 *cert = NULL;
    STACK_OF(X509) *chain = sk_X509_new_null();
    if (!chain)
        goto done;
    if (sl_ms_load_private_key(key_path, &key, &err) < 0) {
        fprintf(stderr, "sluice sign: %s\n", err.msg);
        goto done;
    }
    if (cert_path && !(cert = read_cert(cert_path, NULL)))
        goto done;
    for (size_t i = 0; i < nchains; i++) {
        int before = sk_X509_num(chain);
        read_cert(chains[i], chain);
        if (sk_X509_num(chain) == before)
            goto done;
    }
    size_t n = 0;
    if (sl_ms_sign(dir, sig_path, key, cert, chain, &n, &err) < 0) {
        fprintf(stderr, "sluice sign: %s\n", err.msg);
        goto done;
    }
    printf("%s: signed %zu files of %s (OpenSSF model signing, files, sha256, %s)\n", sig_path, n,
           dir, cert ? "certificate" : "key");
    status = 0;
done:
    EVP_PKEY_free(key);
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    return status;
}

/* ---------------------------------------------------------------- verify */

/* The bundle path of the model at path: model.sig in it (a directory)
 * or beside it (a file), into buf. */
static const char *default_sig(const char *path, char *buf, size_t size)
{
    struct stat st;
    const char *slash = strrchr(path, '/');
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(buf, size, "%s/%s", path, SL_MS_DEFAULT_NAME);
    else
        snprintf(buf, size, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path,
                 SL_MS_DEFAULT_NAME);
    return buf;
}

int ms_applied(const char *path, const char *const *keys, size_t nkeys)
{
    char buf[4096];
    struct stat st;
    size_t ec = 0;
    for (size_t i = 0; i < nkeys; i++)
        ec += (size_t)sl_sig_key_is_ec(keys[i]);
    return ec && lstat(default_sig(path, buf, sizeof buf), &st) == 0;
}

static int res_path_cmp(const void *pa, const void *pb)
{
    const sl_ms_resource *a = *(const sl_ms_resource *const *)pa, *b = *(const sl_ms_resource *const *)pb;
    size_t n = a->path_len < b->path_len ? a->path_len : b->path_len;
    int c = memcmp(a->name, b->name, n);
    return c ? c : (a->path_len > b->path_len) - (a->path_len < b->path_len);
}

/* The files a statement lists: its resources, or for shards their paths. */
static size_t distinct_files(const sl_ms_statement *s)
{
    const sl_ms_resource **v = s->method == SL_MS_SHARDS ? malloc((s->nres + 1) * sizeof *v) : NULL;
    if (!v)
        return s->nres;
    for (size_t i = 0; i < s->nres; i++)
        v[i] = &s->res[i];
    qsort(v, s->nres, sizeof *v, res_path_cmp);
    size_t n = 0;
    for (size_t i = 0; i < s->nres; i++)
        n += i == 0 || res_path_cmp(&v[i - 1], &v[i]) != 0;
    free(v);
    return n;
}

int ms_verify_files(const char *path, const char *sig, const char *const *keys, size_t nkeys,
                    const char *const *cas, size_t ncas, const char *const *ignore, size_t nignore)
{
    char def[4096];
    if (!sig)
        sig = default_sig(path, def, sizeof def);
    if (!nkeys && !ncas) {
        fprintf(stderr, "sluice verify: --no-manifest-link checks a signature: give --key PUB "
                "or --ca PEM\n");
        return 2;
    }
    sl_err err = {0};
    sl_ms_statement *s = NULL;
    sl_ms_trust t = {keys, nkeys, cas, ncas};
    if (sl_ms_verify_file(sig, &t, &s, &err) < 0) {
        printf("FAILED %s\n", err.msg);
        return CMD_EXIT_SIGNATURE;  /* missing, unreadable or refused: not trusted */
    }
    printf("signature %s: verified (%s, %zu resources, %s)\n", sig,
           s->method == SL_MS_FILES ? "files" : "shards", s->nres, s->certified ? "certificate "
           "chain to a trusted CA" : "trusted key");
    int rc = sl_ms_check_tree(s, path, sig, ignore, nignore, &err);
    size_t n = distinct_files(s);
    sl_ms_statement_free(s);
    if (rc < 0) {
        printf("FAILED %s\n", err.msg);
        return CMD_EXIT_INTEGRITY;  /* the files differ from what the signature lists */
    }
    printf("%zu files verified against the signature (manifest link not checked)\n", n);
    return 0;
}
