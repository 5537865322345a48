/* signature.h: detached Ed25519 signatures of manifests (signature.c).
 *
 * A manifest M is signed by the file "M.sig" beside it. The library reads
 * it at open when sluice_options.trusted_keys is set (see "Signed
 * manifests" in sluice.h); the sluice command's keygen and sign write keys
 * and signature files (tools/sign.c compiles this file and error.c in, so
 * the format is written and read by one file).
 *
 * The signature file: exactly these five lines, each ended by one LF,
 * nothing before, after or between them:
 *
 *   sluice-signature 1
 *   algorithm ed25519
 *   key sha256:<64 lowercase hex: SHA-256 of the signer's public key, DER
 *               SubjectPublicKeyInfo, as `openssl pkey -pubin -outform DER`>
 *   manifest-sha256 <64 lowercase hex: SHA-256 of the manifest bytes signed>
 *   signature <88 characters: the 64-byte Ed25519 signature, base64 with
 *             padding (RFC 4648 section 4), canonical>
 *
 * The signature is Ed25519 (RFC 8032, pure) over the manifest file's exact
 * bytes, nothing added: `openssl pkeyutl -verify -pubin -inkey K.pub
 * -rawin -in M -sigfile SIG.bin` checks it too. The key and manifest-sha256
 * lines are not trusted: they only pick the key to check with and say
 * precisely what went wrong (a changed manifest, a changed signature); the
 * verdict is the Ed25519 verification alone.
 */
#ifndef SLUICE_SIGNATURE_H
#define SLUICE_SIGNATURE_H

#include "base/error.h"

#include <openssl/evp.h>

#include <stddef.h>
#include <stdint.h>

/* The largest signature file read (a valid one is 293 bytes). */
#define SL_SIG_MAX_BYTES 1024
/* The largest key file read (an Ed25519 PEM key is about 120 bytes). */
#define SL_KEY_MAX_BYTES 65536
/* The length of a signature file's text, final LF included. */
#define SL_SIG_TEXT_LEN 293

typedef struct sl_sig {
    uint8_t key_id[32];          /* SHA-256 of the signer's public key (DER) */
    uint8_t manifest_sha256[32]; /* SHA-256 of the bytes signed */
    uint8_t sig[64];             /* Ed25519 signature */
} sl_sig;

/* OpenSSL's reason for the last failure, in buf, and its error queue
 * emptied (the calling thread's: other threads' are their own). */
const char *sl_sig_openssl_reason(char *buf, size_t size);

/* The key that the PEM text (len bytes) holds into *out: a private key
 * when want_private (an encrypted one is refused, never prompted for),
 * else a public key; *out NULL when OpenSSL reads none
 * (sl_sig_openssl_reason says why). -1 (and *out NULL) when out of memory
 * before the text was read. */
int sl_sig_pem_key(const char *text, size_t len, int want_private, EVP_PKEY **out);

/* Reads the regular file path whole (at most max bytes; a FIFO or a
 * directory is refused, never waited on) into *out, malloc'd with a NUL
 * after its *len bytes. what names it in messages ("signature").
 * Returns SLUICE_OK, or SLUICE_E_SIGNATURE (SLUICE_E_NOMEM) with err. */
int sl_sig_read_file(const char *what, const char *path, size_t max, char **out, size_t *len,
                     sl_err *err);

/* Parses a signature file's text (len bytes, any content). Returns 0 with
 * *out filled, or -1 with why (why_size bytes) saying what is wrong and
 * where ("line 3: ..."). */
int sl_sig_parse(const char *text, size_t len, sl_sig *out, char *why, size_t why_size);

/* Writes s as a signature file's text and a NUL into out (at least
 * SL_SIG_TEXT_LEN + 1 bytes). Returns SL_SIG_TEXT_LEN. */
size_t sl_sig_format(const sl_sig *s, char out[SL_SIG_TEXT_LEN + 1]);

/* path + ".sig", malloc'd; NULL when out of memory. */
char *sl_sig_path(const char *manifest_path);

/* The key id of key (public or private): SHA-256 of its public key as DER
 * SubjectPublicKeyInfo. Returns 0, or -1 (OpenSSL failed). */
int sl_sig_key_id(EVP_PKEY *key, uint8_t id[32]);

/* "sha256:" and the id in lowercase hex, into out (72 bytes). */
char *sl_sig_key_id_text(const uint8_t id[32], char out[72]);

/* Reads the Ed25519 key in the PEM file path: a public key
 * (SubjectPublicKeyInfo, "BEGIN PUBLIC KEY") or, with want_private, a
 * private one (unencrypted PKCS#8, "BEGIN PRIVATE KEY"). what names the
 * file in messages ("trusted key"). Returns SLUICE_OK with *out (free with
 * EVP_PKEY_free) or SLUICE_E_SIGNATURE (SLUICE_E_NOMEM) with err saying
 * what is wrong with the file: unreadable, not PEM, truncated, the other
 * kind of key, not Ed25519. */
int sl_sig_load_key(const char *what, const char *path, int want_private, EVP_PKEY **out,
                    sl_err *err);

/* Signs msg (len bytes) with the Ed25519 private key into *out (all three
 * fields). Returns SLUICE_OK or SLUICE_E_SIGNATURE. */
int sl_sig_sign(EVP_PKEY *key, const void *msg, size_t len, sl_sig *out, sl_err *err);

/* Signs the manifest file manifest_path (its exact bytes, at most
 * SLUICE_MAX_MANIFEST_BYTES) with the Ed25519 private key in the PEM file
 * key_path into the signature file sig_path (NULL: manifest_path +
 * ".sig"), written through a temporary file beside it, fsynced and
 * renamed over it: `sluice sign` and sluice_manifest_sign. key_id and
 * signed_len (may be NULL) get the signer's key id and the bytes signed.
 * Returns SLUICE_OK, or with err: SLUICE_E_SIGNATURE (the key unusable,
 * signing failed), SLUICE_E_IO (the manifest unreadable, the signature
 * not written), SLUICE_E_NOMEM. */
int sl_sig_sign_file(const char *manifest_path, const char *key_path, const char *sig_path,
                     uint8_t key_id[32], size_t *signed_len, sl_err *err);

/* 1 when the file path reads as an EC public key (PEM): OpenSSF model
 * signing's kind of trusted key, which the Ed25519 check skips. */
int sl_sig_key_is_ec(const char *path);

/* The check sluice_open makes when its trust plan names it (a local
 * manifest; trust_plan.h decides): every key file
 * in keys[0..nkeys) must be an Ed25519 public key, and manifest_path's
 * signature file must be valid for text (the manifest's bytes, as read
 * for parsing) by one of them. Returns SLUICE_OK, or SLUICE_E_SIGNATURE
 * (SLUICE_E_NOMEM) with err saying which rule failed. */
/* The same for a signature fetched from elsewhere (a remote manifest's
 * M.sig, trust_plan.c's sl_trust_sig_fetch): sig_text (sig_len bytes, or
 * NULL when there was none, which fails) read from sig_path (as messages
 * show it). */
int sl_signature_check_text(const char *manifest_path, const char *sig_path, const char *sig_text,
                            size_t sig_len, const char *text, size_t len,
                            const char *const *keys, size_t nkeys, sl_err *err);

int sl_signature_check(const char *manifest_path, const char *text, size_t len,
                       const char *const *keys, size_t nkeys, sl_err *err);

#endif
