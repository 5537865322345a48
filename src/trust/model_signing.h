/* model_signing.h: OpenSSF model signing (the format of the model_signing
 * package, 1.x, of sigstore/model-transparency): read, verify and write
 * the Sigstore bundle "model.sig" that signs a model directory
 * (model_signing.c; "OpenSSF model signing" in sluice.h and
 * docs/manifests.md say what is checked).
 *
 * The bundle (JSON, media type application/vnd.dev.sigstore.bundle.v0.3+json)
 * holds a DSSE envelope whose payload is an in-toto statement (type
 * https://in-toto.io/Statement/v1, predicate type
 * https://model_signing/signature/v1.0) listing every file of the model
 * (or every shard of each) with its digest, and one subject whose SHA-256
 * is that of the listed digests' bytes, in the order listed. The envelope
 * is signed with ECDSA (P-256/SHA-256, P-384/SHA-384, P-521/SHA-512) over
 * the DSSE pre-authentication encoding; the verification material is a
 * public key's hint (SHA-256 of its PEM text) or a certificate chain
 * (leaf first) to a trusted CA. Keyless (Sigstore: a Fulcio certificate
 * and a transparency-log entry) bundles are recognised and refused.
 *
 * Like signature.c, nothing here depends on the library but error.c and
 * signature.c, so that the sluice command compiles it in: one file writes
 * what the library reads.
 */
#ifndef SLUICE_MODEL_SIGNING_H
#define SLUICE_MODEL_SIGNING_H

#include "base/error.h"

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <stddef.h>
#include <stdint.h>

/* The largest bundle read. */
#define SL_MS_MAX_BYTES ((size_t)64 << 20)
/* The bundle's default name, in the model's directory. */
#define SL_MS_DEFAULT_NAME "model.sig"

typedef enum sl_ms_method { SL_MS_FILES, SL_MS_SHARDS } sl_ms_method;

typedef struct sl_ms_resource {
    char *name;          /* as listed: a path relative to the model root
                            ("." for a model that is one file); shards:
                            "PATH:START:END" */
    size_t path_len;     /* the PATH part's length (all of name for files) */
    uint64_t start, end; /* shards: the byte range; files: 0, 0 */
    int sha256;          /* 1: the algorithm is sha256 (sluice checks only those) */
    uint8_t digest[64];
    size_t digest_len;
} sl_ms_resource;

typedef struct sl_ms_statement {
    char *model_name;    /* the subject's name (informative only) */
    sl_ms_method method;
    char **ignore;       /* the serialization's ignore_paths */
    size_t nignore;
    sl_ms_resource *res;
    size_t nres;
    int certified;       /* 1: verified by a certificate chain to a trusted
                            CA; 0: by a trusted key */
} sl_ms_statement;

/* What a bundle may be trusted by: PEM files of EC public keys (Ed25519
 * ones are skipped: the format has none) and of CA certificates. */
typedef struct sl_ms_trust {
    const char *const *keys;
    size_t nkeys;
    const char *const *cas;
    size_t ncas;
} sl_ms_trust;

/* Verifies the bundle text (len bytes, any content) read from sig_path
 * (named in messages) against t, and parses its statement into *out
 * (free with sl_ms_statement_free). Returns SLUICE_OK, or
 * SLUICE_E_SIGNATURE (SLUICE_E_NOMEM) with err naming the rule that
 * failed: not JSON, wrong media type, keyless, no usable trust, key hint
 * mismatch, untrusted chain, certificate not for signing, bad signature,
 * wrong payload type, statement type or predicate type, subject digest
 * inconsistent. */
int sl_ms_verify_text(const char *sig_path, const char *text, size_t len, const sl_ms_trust *t,
                      sl_ms_statement **out, sl_err *err);

/* Reads sig_path (at most SL_MS_MAX_BYTES) and verifies it as above. */
int sl_ms_verify_file(const char *sig_path, const sl_ms_trust *t, sl_ms_statement **out,
                      sl_err *err);

void sl_ms_statement_free(sl_ms_statement *s);

/* The link between a verified statement and what sluice loads:
 * manifest_name (the manifest's path relative to the model root, NULL
 * when it is outside it) must be listed with the SHA-256 of text, and
 * every name in files[0..nfiles) (relative to the root) must be listed.
 * manifest_path and sig_path name them in messages. */
int sl_ms_check_link(const sl_ms_statement *s, const char *sig_path, const char *manifest_name,
                     const char *manifest_path, const char *text, size_t len,
                     const char *const *files, size_t nfiles, sl_err *err);

/* The file-level check (the reference verifier's): the files under
 * model_path (a directory, or one file whose resource is ".") but those
 * ignored (the statement's ignore_paths, model.sig, .git, .gitattributes,
 * .github, .gitignore, sig_path's base name when inside, and
 * extra_ignore) must be exactly the files listed, each with its listed
 * SHA-256 (files mode; shards: each range's). Symbolic links are refused.
 * Returns SLUICE_OK, or SLUICE_E_SIGNATURE naming the first difference. */
int sl_ms_check_tree(const sl_ms_statement *s, const char *model_path, const char *sig_path,
                     const char *const *extra_ignore, size_t nextra, sl_err *err);

/* Reads an EC private key (P-256/384/521, unencrypted PKCS#8 or SEC1
 * PEM) from path. Returns SLUICE_OK with *out, or SLUICE_E_SIGNATURE. */
int sl_ms_load_private_key(const char *path, EVP_PKEY **out, sl_err *err);

/* Signs the directory model_dir as the reference's `sign key` (cert
 * NULL) or `sign certificate` (cert: the signing certificate, whose key
 * must be key's; chain: the certificates after it, may be NULL) do: files
 * mode, SHA-256, the default ignores (model.sig, .git, .gitattributes,
 * .github, .gitignore, and sig_path's base name). Writes the bundle to
 * sig_path (a temporary file renamed over it); *nres gets the number of
 * files signed. Returns SLUICE_OK or SLUICE_E_SIGNATURE / SLUICE_E_IO /
 * SLUICE_E_NOMEM with err. */
int sl_ms_sign(const char *model_dir, const char *sig_path, EVP_PKEY *key, X509 *cert,
               STACK_OF(X509) *chain, size_t *nres, sl_err *err);

/* The key hint of the format: SHA-256 of the public key's PEM text
 * (SubjectPublicKeyInfo), as 64 lowercase hex digits. Returns 0 or -1. */
int sl_ms_key_hint(EVP_PKEY *key, char out[65]);

#endif
