/* model_signing.c: OpenSSF model signing bundles (model.sig): verify one
 * against trusted EC keys or CA certificates, parse its in-toto
 * statement, check the link to the sluice manifest, check a directory's
 * files, and write one (see model_signing.h for the format).
 *
 * Every rule that fails has its own message, because whoever reads it
 * must tell a misconfiguration (the wrong key, a CA missing) from an
 * attack (a payload, signature or certificate changed). The bundle is
 * hostile input: every field is type-checked, base64 must be canonical
 * (so that no two texts decode to the same bytes and every byte changed
 * is a change), and nothing from the bundle is trusted before the ECDSA
 * verdict but the choice of which trusted key to try.
 */
#include "trust/model_signing.h"
#include "base/replace.h"
#include "trust/signature.h"

#include <cjson/cJSON.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MS_MEDIA_TYPE "application/vnd.dev.sigstore.bundle.v0.3+json"
#define MS_PAYLOAD_TYPE "application/vnd.in-toto+json"
#define MS_STATEMENT_TYPE "https://in-toto.io/Statement/v1"
#define MS_PREDICATE_TYPE "https://model_signing/signature/v1.0"
/* The predicate of releases before 1.0: one subject per file. */
#define MS_PREDICATE_COMPAT "https://model_signing/Digests/v0.1"

static const char *const default_ignores[] = {SL_MS_DEFAULT_NAME, ".git", ".gitattributes",
                                              ".github", ".gitignore"};
#define NDEFAULT_IGNORES (sizeof default_ignores / sizeof *default_ignores)

/* ---------------------------------------------------------------- base64, hex */

/* Decodes canonical standard base64 (RFC 4648 section 4, padding
 * required, the bits after the last byte zero) into a malloc'd buffer.
 * Returns it (*n bytes; a NUL after them), or NULL: *why says why. */
static uint8_t *b64_decode(const char *s, size_t len, size_t *n, const char **why)
{
    *n = 0;
    if (len % 4) {
        *why = "its length is not a multiple of 4 (not padded base64)";
        return NULL;
    }
    uint8_t *out = malloc(len / 4 * 3 + 1);
    if (!out) {
        *why = "out of memory";
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            v[k] = pad ? -1 : sl_b64_value(c);
            if (v[k] < 0) {
                free(out);
                *why = "a character that is not base64";
                return NULL;
            }
        }
        if (pad == 1 && s[i + 2] == '=') { /* "x=y=" */
            free(out);
            *why = "a character that is not base64";
            return NULL;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff))) {
            free(out);
            *why = "not canonical base64 (bits after the last byte are set)";
            return NULL;
        }
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    out[o] = 0;
    *n = o;
    return out;
}

/* Standard base64 with padding, malloc'd and NUL-ended; NULL: no memory. */
static char *b64_encode(const uint8_t *p, size_t n)
{
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    return out;
}

static char *hex_of(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
    return out;
}

/* Lowercase or uppercase hex of at most 64 bytes. Returns the byte count, or -1. */
static int hex_decode(const char *s, uint8_t out[64])
{
    size_t len = strlen(s);
    if (len == 0 || len % 2 || len > 128)
        return -1;
    for (size_t i = 0; i < len; i += 2) {
        int hi = sl_hex_value(s[i]), lo = sl_hex_value(s[i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return (int)(len / 2);
}

/* ---------------------------------------------------------------- keys */

int sl_ms_key_hint(EVP_PKEY *key, char out[65])
{
    BIO *bio = BIO_new(BIO_s_mem());
    char *pem = NULL;
    long n = 0;
    uint8_t d[32];
    int ok = bio && PEM_write_bio_PUBKEY(bio, key) == 1 && (n = BIO_get_mem_data(bio, &pem)) > 0 &&
             EVP_Digest(pem, (size_t)n, d, NULL, EVP_sha256(), NULL);
    BIO_free(bio);
    if (!ok)
        return -1;
    hex_of(d, 32, out);
    return 0;
}

/* The digest of ECDSA with key's curve, or NULL when the curve is not
 * one of the three the format allows (or the key is not EC). */
static const EVP_MD *ec_md(EVP_PKEY *key, char *curve, size_t size)
{
    snprintf(curve, size, "%s", EVP_PKEY_get0_type_name(key) ? EVP_PKEY_get0_type_name(key) : "?");
    if (EVP_PKEY_get_id(key) != EVP_PKEY_EC)
        return NULL;
    char g[64] = "";
    size_t gl = 0;
    if (EVP_PKEY_get_utf8_string_param(key, "group", g, sizeof g, &gl) != 1)
        return NULL;
    snprintf(curve, size, "EC %s", g);
    if (!strcmp(g, "prime256v1") || !strcmp(g, "P-256"))
        return EVP_sha256();
    if (!strcmp(g, "secp384r1") || !strcmp(g, "P-384"))
        return EVP_sha384();
    if (!strcmp(g, "secp521r1") || !strcmp(g, "P-521"))
        return EVP_sha512();
    return NULL;
}

/* Reads the public key PEM file path: EC (a supported curve) or Ed25519
 * (returned too: the caller skips it). */
static int load_public(const char *path, EVP_PKEY **out, sl_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = sl_sig_read_file("trusted key", path, SL_KEY_MAX_BYTES, &text, &len, err);
    if (rc < 0)
        return rc;
    EVP_PKEY *key;
    sl_sig_pem_key(text, len, 0, &key); /* out of memory: no key, as OpenSSL's failure */
    char why[160], curve[80];
    if (!key) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "trusted key %s: not a PEM public key "
                     "(\"-----BEGIN PUBLIC KEY-----\"%s: %s)", path,
                     strstr(text, "PRIVATE KEY") ? "; this is a private key" : "",
                     sl_sig_openssl_reason(why, sizeof why));
    } else if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519 && !ec_md(key, curve, sizeof curve)) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "trusted key %s: the key is %s, not EC P-256, "
                     "P-384 or P-521 (nor Ed25519)", path, curve);
        EVP_PKEY_free(key);
        key = NULL;
    }
    free(text);
    *out = key;
    return rc;
}

int sl_ms_load_private_key(const char *path, EVP_PKEY **out, sl_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = sl_sig_read_file("key", path, SL_KEY_MAX_BYTES, &text, &len, err);
    if (rc < 0)
        return rc;
    EVP_PKEY *key;
    sl_sig_pem_key(text, len, 1, &key); /* out of memory: no key, as OpenSSL's failure */
    char why[160], curve[80];
    if (!key)
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "key %s: not an unencrypted PEM private key (%s)",
                     path, sl_sig_openssl_reason(why, sizeof why));
    else if (!ec_md(key, curve, sizeof curve)) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "key %s: the key is %s; OpenSSF model signing "
                     "needs EC P-256, P-384 or P-521 (make one with 'sluice keygen --curve "
                     "p256')", path, curve);
        EVP_PKEY_free(key);
        key = NULL;
    }
    OPENSSL_cleanse(text, len);
    free(text);
    *out = key;
    return rc;
}

/* Appends the certificates of the PEM file path to sk. */
static int load_certs(const char *what, const char *path, STACK_OF(X509) *sk, sl_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = sl_sig_read_file(what, path, SL_KEY_MAX_BYTES * 16, &text, &len, err);
    if (rc < 0)
        return rc;
    BIO *bio = BIO_new_mem_buf(text, (int)len);
    int n = 0;
    X509 *c;
    while (bio && (c = PEM_read_bio_X509(bio, NULL, NULL, NULL))) {
        if (!sk_X509_push(sk, c)) {
            X509_free(c);
            break;
        }
        n++;
    }
    ERR_clear_error(); /* the end of the file reads as an error */
    BIO_free(bio);
    free(text);
    if (n == 0)
        return sl_fail(err, SLUICE_E_SIGNATURE, "%s %s: no PEM certificate in it "
                       "(\"-----BEGIN CERTIFICATE-----\")", what, path);
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- the bundle */

static const char *json_string(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : NULL;
}

/* A string of the bundle for a message: quoted, control bytes escaped
 * (a hostile bundle must not write lines or terminal escapes of its
 * own into what is printed), or "(none)". */
static const char *shown(char *buf, size_t size, const char *s)
{
    if (!s)
        return "(none)";
    return sl_quote(buf, size, s, strlen(s));
}

/* SLUICE_E_SIGNATURE with "signature SIG_PATH: " before the message. */
__attribute__((format(printf, 3, 4))) static int ms_fail(sl_err *err, const char *sig_path,
                                                        const char *fmt, ...)
{
    char msg[SL_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s", sig_path, msg);
}

/* The base64 field name of o, decoded. */
static int b64_field(const cJSON *o, const char *name, const char *what, const char *sig_path,
                     uint8_t **out, size_t *n, sl_err *err)
{
    const char *s = json_string(o, name);
    if (!s)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s: no \"%s\" string", sig_path,
                       what, name);
    const char *why = NULL;
    if (!(*out = b64_decode(s, strlen(s), n, &why)))
        return sl_fail(err, !strcmp(why, "out of memory") ? SLUICE_E_NOMEM : SLUICE_E_SIGNATURE,
                       "signature %s: %s \"%s\": %s", sig_path, what, name, why);
    return SLUICE_OK;
}

/* DSSE's pre-authentication encoding of payload, with the in-toto type
 * (the reference signs with that type whatever the envelope says; the
 * envelope's is checked after). */
static uint8_t *pae(const uint8_t *payload, size_t n, size_t *out_len)
{
    char head[128];
    int h = snprintf(head, sizeof head, "DSSEv1 %zu %s %zu ", strlen(MS_PAYLOAD_TYPE),
                     MS_PAYLOAD_TYPE, n);
    uint8_t *p = malloc((size_t)h + n + 1);
    if (!p)
        return NULL;
    memcpy(p, head, (size_t)h);
    memcpy(p + h, payload, n);
    *out_len = (size_t)h + n;
    return p;
}

/* 1: sig verifies msg under key with md; 0: it does not; -1: no memory. */
static int ecdsa_verify(EVP_PKEY *key, const EVP_MD *md, const uint8_t *sig, size_t siglen,
                        const uint8_t *msg, size_t len)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int r = -1;
    if (ctx && EVP_DigestVerifyInit(ctx, NULL, md, NULL, key) == 1)
        r = EVP_DigestVerify(ctx, sig, siglen, msg, len) == 1;
    EVP_MD_CTX_free(ctx);
    ERR_clear_error();
    return r;
}

static time_t asn1_time_t(const ASN1_TIME *t, int *ok)
{
    struct tm tm;
    *ok = t && ASN1_TIME_to_tm(t, &tm) == 1;
    return *ok ? timegm(&tm) : 0;
}

/* The OpenSSL security level of chain checks: 112 bits, so no SHA-1 (nor
 * MD5) signature under the trust anchor and no RSA or DSA key under 2048
 * bits (EC under 224). Level 1 refuses SHA-1 too; 2 is Debian's for TLS. */
#define MS_AUTH_LEVEL 2

/* Whether a leaf certificate may sign models: NULL, or why not. The rule
 * is OpenSSL 3.2's X509_PURPOSE_CODE_SIGN (the CA/Browser Forum's
 * code-signing leaf), which OpenSSL 3.0 lacks, so it is written here on
 * OpenSSL's decoded extensions (a purpose of our own, X509_PURPOSE_add,
 * would change the process's global purpose table): not a CA as
 * X509_check_ca sees one (the reference's own leaves carry the CA flag
 * without keyCertSign, which X509_check_ca and this rule take); key usage
 * present, critical, with digitalSignature and without keyCertSign or
 * cRLSign; extended key usage present, with codeSigning and without
 * serverAuth or anyExtendedKeyUsage. sigstore-python asks the same of a
 * leaf; the reference asks digitalSignature or codeSigning alone. */
static const char *leaf_may_not_sign(X509 *c)
{
    uint32_t xf = X509_get_extension_flags(c);
    uint32_t ku = X509_get_key_usage(c), xku = X509_get_extended_key_usage(c);
    int at = X509_get_ext_by_NID(c, NID_key_usage, -1);
    if (X509_check_ca(c))
        return "it is a CA certificate (it may issue certificates)";
    if (!(xf & EXFLAG_KUSAGE) || !(ku & KU_DIGITAL_SIGNATURE))
        return "its key usage lacks digitalSignature";
    if (ku & (KU_KEY_CERT_SIGN | KU_CRL_SIGN))
        return "its key usage allows keyCertSign or cRLSign";
    if (at < 0 || !X509_EXTENSION_get_critical(X509_get_ext(c, at)))
        return "its key usage is not critical";
    if (!(xf & EXFLAG_XKUSAGE))
        return "it has no extended key usage (codeSigning is required)";
    if (!(xku & XKU_CODE_SIGN))
        return "its extended key usage lacks codeSigning";
    if (xku & (XKU_SSL_SERVER | XKU_ANYEKU))
        return "its extended key usage allows serverAuth or anyExtendedKeyUsage too";
    return NULL;
}

/* The certificate chain of the bundle (leaf first, DER base64) checked
 * against the trusted CAs at the leaf's notBefore (the reference's
 * signing time), and the leaf allowed to sign; *leaf_key gets its key. */
static int check_chain(const cJSON *chain, const char *sig_path, const sl_ms_trust *t,
                       EVP_PKEY **leaf_key, sl_err *err)
{
    *leaf_key = NULL;
    const cJSON *certs = cJSON_GetObjectItemCaseSensitive(chain, "certificates");
    int count = cJSON_IsArray(certs) ? cJSON_GetArraySize(certs) : 0;
    if (count < 1)
        return ms_fail(err, sig_path, "x509CertificateChain has no \"certificates\"%s", "");
    if (!t->ncas)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: signed with a certificate chain, "
                       "and no trusted CA is given (trusted_cas, --ca PEM)%s", sig_path,
                       t->nkeys ? "; trusted keys are for key-signed bundles" : "");
    int rc = SLUICE_OK;
    X509_STORE *store = X509_STORE_new();
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    STACK_OF(X509) *cas = sk_X509_new_null(), *untrusted = sk_X509_new_null();
    X509 *leaf = NULL;
    if (!store || !ctx || !cas || !untrusted) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
        goto done;
    }
    for (size_t i = 0; i < t->ncas; i++)
        if ((rc = load_certs("trusted CA", t->cas[i], cas, err)) < 0)
            goto done;
    for (int i = 0; i < sk_X509_num(cas); i++)
        X509_STORE_add_cert(store, sk_X509_value(cas, i));
    for (int i = 0; i < count; i++) {
        uint8_t *der = NULL;
        size_t n = 0;
        char what[48];
        snprintf(what, sizeof what, "certificate %d of the chain", i);
        if ((rc = b64_field(cJSON_GetArrayItem(certs, i), "rawBytes", what, sig_path, &der, &n,
                            err)) < 0)
            goto done;
        const unsigned char *p = der;
        X509 *c = d2i_X509(NULL, &p, (long)n);
        int whole = c && p == der + n;
        free(der);
        if (!whole) {
            X509_free(c);
            ERR_clear_error();
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s is not a DER certificate",
                         sig_path, what);
            goto done;
        }
        if (i == 0)
            leaf = c;
        else if (!sk_X509_push(untrusted, c)) {
            X509_free(c);
            rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
            goto done;
        }
    }
    int ok = 0;
    time_t when = asn1_time_t(X509_get0_notBefore(leaf), &ok);
    if (!ok || X509_STORE_CTX_init(ctx, store, leaf, untrusted) != 1) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the signing certificate has no "
                     "readable notBefore", sig_path);
        goto done;
    }
    X509_STORE_CTX_set_time(ctx, 0, when);
    X509_VERIFY_PARAM_set_auth_level(X509_STORE_CTX_get0_param(ctx), MS_AUTH_LEVEL);
    if (X509_verify_cert(ctx) != 1) {
        int e = X509_STORE_CTX_get_error(ctx);
        int weak = e == X509_V_ERR_CA_MD_TOO_WEAK || e == X509_V_ERR_CA_KEY_TOO_SMALL ||
                   e == X509_V_ERR_EE_KEY_TOO_SMALL;
        char subject[256] = "";
        X509 *at = X509_STORE_CTX_get_current_cert(ctx);
        if (at)
            X509_NAME_oneline(X509_get_subject_name(at), subject, sizeof subject);
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the certificate chain is not trusted: "
                     "%s (at depth %d, %s), checked at the signing certificate's notBefore "
                     "against %zu trusted CA file%s%s", sig_path, X509_verify_cert_error_string(e),
                     X509_STORE_CTX_get_error_depth(ctx), *subject ? subject : "?", t->ncas,
                     t->ncas == 1 ? "" : "s", weak ? " at OpenSSL security level 2 (no SHA-1 "
                     "signature, no RSA key under 2048 bits)" : "");
        ERR_clear_error();
        goto done;
    }
    const char *why = leaf_may_not_sign(leaf);
    if (why) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the signing certificate may not "
                     "sign: %s (a model's signing certificate is a code-signing leaf)",
                     sig_path, why);
        goto done;
    }
    EVP_PKEY *k = X509_get_pubkey(leaf);
    char curve[80];
    if (!k || !ec_md(k, curve, sizeof curve)) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the signing certificate's key is "
                     "%s, not EC P-256, P-384 or P-521", sig_path, k ? curve : "unreadable");
        EVP_PKEY_free(k);
        goto done;
    }
    *leaf_key = k;
done:
    X509_free(leaf);
    sk_X509_pop_free(untrusted, X509_free);
    sk_X509_pop_free(cas, X509_free);
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    return rc;
}

/* The trusted EC keys of t, loaded; Ed25519 ones are dropped. */
static int load_keys(const sl_ms_trust *t, EVP_PKEY ***out, size_t *n, sl_err *err)
{
    *out = NULL;
    *n = 0;
    if (!t->nkeys)
        return SLUICE_OK;
    EVP_PKEY **k = calloc(t->nkeys, sizeof *k);
    if (!k)
        return sl_fail(err, SLUICE_E_NOMEM, "signature: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < t->nkeys; i++) {
        EVP_PKEY *key = NULL;
        int rc = load_public(t->keys[i], &key, err);
        if (rc < 0) {
            while (m)
                EVP_PKEY_free(k[--m]);
            free(k);
            return rc;
        }
        if (EVP_PKEY_get_id(key) == EVP_PKEY_ED25519)
            EVP_PKEY_free(key);
        else
            k[m++] = key;
    }
    *out = k;
    *n = m;
    return SLUICE_OK;
}

/* The signature over the envelope: by the trusted key the hint names
 * (or, in the older form without a hint, any trusted key), or by the
 * leaf certificate's key. */
static int check_envelope_sig(const cJSON *vm, const char *sig_path, const sl_ms_trust *t,
                              const uint8_t *msg, size_t msg_len, const uint8_t *sig,
                              size_t sig_len, sl_err *err)
{
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(vm, "publicKey");
    const cJSON *chain = cJSON_GetObjectItemCaseSensitive(vm, "x509CertificateChain");
    char curve[80];
    int rc, v;
    if (cJSON_IsObject(chain)) {
        EVP_PKEY *leaf = NULL;
        if ((rc = check_chain(chain, sig_path, t, &leaf, err)) < 0)
            return rc;
        v = ecdsa_verify(leaf, ec_md(leaf, curve, sizeof curve), sig, sig_len, msg, msg_len);
        EVP_PKEY_free(leaf);
        if (v < 0)
            return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
        if (!v)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the ECDSA signature does not "
                           "verify with the signing certificate's key (the payload or the "
                           "signature was altered)", sig_path);
        return SLUICE_OK;
    }
    if (!cJSON_IsObject(pk))
        return ms_fail(err, sig_path, "the verification material holds neither \"publicKey\" "
                       "nor \"x509CertificateChain\"%s", "");
    EVP_PKEY **keys = NULL;
    size_t n = 0;
    if ((rc = load_keys(t, &keys, &n, err)) < 0)
        return rc;
    if (!n) {
        free(keys);
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: signed with a key, and no "
                       "trusted EC public key is given (trusted_keys, --key PEM)%s", sig_path,
                       t->nkeys ? ": the trusted keys are Ed25519, which this format has not" : "");
    }
    const char *hint = json_string(pk, "hint");
    rc = SLUICE_OK;
    int tried = 0, verified = 0;
    char h[65], first[65] = "", q[SL_QUOTE_MAX];
    for (size_t i = 0; i < n && !verified; i++) {
        if (sl_ms_key_hint(keys[i], h) < 0) {
            rc = sl_fail(err, SLUICE_E_NOMEM, "trusted key %s: cannot encode it", t->keys[i]);
            break;
        }
        if (!*first)
            memcpy(first, h, sizeof h);
        if (hint && *hint && strcmp(hint, h) != 0)
            continue;
        tried++;
        v = ecdsa_verify(keys[i], ec_md(keys[i], curve, sizeof curve), sig, sig_len, msg, msg_len);
        if (v < 0)
            rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
        verified = v > 0;
    }
    for (size_t i = 0; i < n; i++)
        EVP_PKEY_free(keys[i]);
    free(keys);
    if (rc < 0)
        return rc;
    if (verified)
        return SLUICE_OK;
    if (!tried)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: key hint mismatch: made with the "
                       "key whose hint is %s, which is none of the %zu trusted EC key%s (%s%s)",
                       sig_path, shown(q, sizeof q, hint), n, n == 1 ? "" : "s", first,
                       n > 1 ? ", ..." : "");
    return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the ECDSA signature does not verify "
                   "with %s (the payload or the signature was altered)", sig_path,
                   hint && *hint ? "the trusted key its hint names" : "any trusted EC key");
}

/* One resource {name, algorithm, digest}. */
static int take_resource(const cJSON *r, sl_ms_method method, const char *sig_path, size_t i,
                         sl_ms_resource *out, sl_err *err)
{
    const char *name = json_string(r, "name"), *alg = json_string(r, "algorithm"),
               *dig = json_string(r, "digest");
    if (!name || !alg || !dig)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: resource %zu lacks a \"name\", "
                       "\"algorithm\" or \"digest\" string", sig_path, i);
    int n = hex_decode(dig, out->digest);
    if (n < 1)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: resource %zu (%s): the digest is "
                       "not hex", sig_path, i, name);
    out->digest_len = (size_t)n;
    out->sha256 = !strcmp(alg, "sha256") && n == 32;
    if (!(out->name = strdup(name)))
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    out->path_len = strlen(name);
    if (method == SL_MS_SHARDS) {
        /* PATH:START:END, the path itself may hold ':'; START and END
         * plain decimal, as the signers write them: strtoull alone would
         * take "-5" as 2^64-5 (and " +5"), a range no file has, which the
         * file-level check could then only fail as an I/O error */
        char *b = strrchr(out->name, ':');
        char *a = b ? memrchr(out->name, ':', (size_t)(b - out->name)) : NULL;
        char *e1 = NULL, *e2 = NULL;
        if (a && (a[1] < '0' || a[1] > '9' || b[1] < '0' || b[1] > '9'))
            a = NULL;
        if (a) {
            errno = 0;
            out->start = strtoull(a + 1, &e1, 10);
            out->end = strtoull(b + 1, &e2, 10);
        }
        if (!a || e1 != b || *e2 || e2 == b + 1 || errno || out->end < out->start)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: resource %zu (%s): not "
                           "PATH:START:END as a shard's name is", sig_path, i, name);
        out->path_len = (size_t)(a - out->name);
    }
    return SLUICE_OK;
}

void sl_ms_statement_free(sl_ms_statement *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nres; i++)
        free(s->res[i].name);
    for (size_t i = 0; i < s->nignore; i++)
        free(s->ignore[i]);
    free(s->res);
    free(s->ignore);
    free(s->model_name);
    free(s);
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A name twice would let one digest stand for another (sluice finds the
 * first, the reference keeps the last); sorted names find it in n log n,
 * whatever a hostile list holds. */
static int no_duplicates(const sl_ms_statement *s, const char *sig_path, sl_err *err)
{
    const char **names = malloc((s->nres + 1) * sizeof *names);
    if (!names)
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    for (size_t i = 0; i < s->nres; i++)
        names[i] = s->res[i].name;
    qsort(names, s->nres, sizeof *names, str_cmp);
    int rc = SLUICE_OK;
    for (size_t i = 1; i < s->nres && rc == SLUICE_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            rc = ms_fail(err, sig_path, "the resource %s is listed twice", names[i]);
    free(names);
    return rc;
}

/* The statement's predicate (or the pre-1.0 form's subjects) into s. */
static int take_statement(const cJSON *st, const char *sig_path, sl_ms_statement *s, sl_err *err)
{
    const char *type = json_string(st, "_type"), *ptype = json_string(st, "predicateType");
    char q[SL_QUOTE_MAX];
    if (!type || strcmp(type, MS_STATEMENT_TYPE))
        return ms_fail(err, sig_path, "wrong statement type %s (expected "
                       "\"" MS_STATEMENT_TYPE "\")", shown(q, sizeof q, type));
    const cJSON *subjects = cJSON_GetObjectItemCaseSensitive(st, "subject");
    int nsub = cJSON_IsArray(subjects) ? cJSON_GetArraySize(subjects) : -1;
    int compat = ptype && !strcmp(ptype, MS_PREDICATE_COMPAT);
    if (!ptype || (strcmp(ptype, MS_PREDICATE_TYPE) && !compat))
        return ms_fail(err, sig_path, "wrong predicate type %s (expected "
                       "\"" MS_PREDICATE_TYPE "\")", shown(q, sizeof q, ptype));
    const cJSON *list, *ser = NULL;
    if (compat) { /* each subject a file, sha256 */
        list = subjects;
        s->method = SL_MS_FILES;
    } else {
        if (nsub != 1)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the statement has %d "
                           "subjects, not one", sig_path, nsub < 0 ? 0 : nsub);
        const cJSON *pred = cJSON_GetObjectItemCaseSensitive(st, "predicate");
        ser = cJSON_GetObjectItemCaseSensitive(pred, "serialization");
        list = cJSON_GetObjectItemCaseSensitive(pred, "resources");
        const char *method = json_string(ser, "method");
        if (!method || (strcmp(method, "files") && strcmp(method, "shards")))
            return ms_fail(err, sig_path, "unknown serialization method %s (files or shards)",
                           shown(q, sizeof q, method));
        s->method = strcmp(method, "files") ? SL_MS_SHARDS : SL_MS_FILES;
    }
    int nres = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : -1;
    if (nres < 0)
        return ms_fail(err, sig_path, "the statement has no list of resources%s", "");
    s->res = calloc((size_t)nres + 1, sizeof *s->res);
    const cJSON *ign = cJSON_GetObjectItemCaseSensitive(ser, "ignore_paths");
    int nign = cJSON_IsArray(ign) ? cJSON_GetArraySize(ign) : 0;
    s->ignore = calloc((size_t)nign + 1, sizeof *s->ignore);
    if (!s->res || !s->ignore)
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    for (int i = 0; i < nign; i++) {
        const cJSON *v = cJSON_GetArrayItem(ign, i);
        if (cJSON_IsString(v) && v->valuestring && !(s->ignore[s->nignore++] = strdup(v->valuestring)))
            return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    }
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    if (!h || EVP_DigestInit_ex(h, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(h);
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    }
    int rc = SLUICE_OK;
    for (int i = 0; i < nres && rc == SLUICE_OK; i++) {
        const cJSON *r = cJSON_GetArrayItem(list, i);
        sl_ms_resource *o = &s->res[s->nres];
        if (compat) {
            const char *name = json_string(r, "name");
            const char *d = json_string(cJSON_GetObjectItemCaseSensitive(r, "digest"), "sha256");
            int n = d ? hex_decode(d, o->digest) : -1;
            if (!name || n != 32)
                rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: subject %d lacks a name or "
                             "a sha256 digest", sig_path, i);
            else if (!(o->name = strdup(name)))
                rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
            else {
                o->digest_len = 32;
                o->sha256 = 1;
                o->path_len = strlen(name);
                s->nres++;
            }
            continue;
        }
        rc = take_resource(r, s->method, sig_path, (size_t)i, o, err);
        if (o->name)
            s->nres++;
        if (rc == SLUICE_OK && EVP_DigestUpdate(h, o->digest, o->digest_len) != 1)
            rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    }
    uint8_t root[32];
    int ok = rc == SLUICE_OK && EVP_DigestFinal_ex(h, root, NULL) == 1;
    EVP_MD_CTX_free(h);
    if (rc < 0)
        return rc;
    if (compat) /* one subject per file: a name twice, too */
        return no_duplicates(s, sig_path, err);
    if (!ok)
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    const cJSON *sub = cJSON_GetArrayItem(subjects, 0);
    const char *name = json_string(sub, "name");
    const char *want = json_string(cJSON_GetObjectItemCaseSensitive(sub, "digest"), "sha256");
    uint8_t w[64];
    char hex[65];
    if (!want || hex_decode(want, w) != 32 || memcmp(w, root, 32) != 0)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the subject digest is inconsistent: "
                       "it is %s, but the %zu resources listed hash to %s", sig_path,
                       want ? want : "(none)", s->nres, hex_of(root, 32, hex));
    if (name && !(s->model_name = strdup(name)))
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
    return no_duplicates(s, sig_path, err);
}

int sl_ms_verify_text(const char *sig_path, const char *text, size_t len, const sl_ms_trust *t,
                      sl_ms_statement **out, sl_err *err)
{
    *out = NULL;
    if (memchr(text, '\0', len))
        return ms_fail(err, sig_path, "not a Sigstore bundle: a NUL byte in it%s", "");
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ms_fail(err, sig_path, "not a Sigstore bundle: not a JSON object%s", "");
    }
    int rc = SLUICE_OK;
    uint8_t *payload = NULL, *sig = NULL, *msg = NULL;
    size_t payload_len = 0, sig_len = 0, msg_len = 0;
    cJSON *st = NULL;
    sl_ms_statement *s = NULL;
    char q[SL_QUOTE_MAX];
    const char *mt = json_string(root, "mediaType");
    if (!mt || strcmp(mt, MS_MEDIA_TYPE)) {
        rc = ms_fail(err, sig_path, "wrong media type %s (expected \"" MS_MEDIA_TYPE "\")",
                     shown(q, sizeof q, mt));
        goto done;
    }
    const cJSON *vm = cJSON_GetObjectItemCaseSensitive(root, "verificationMaterial");
    const cJSON *tlog = cJSON_GetObjectItemCaseSensitive(vm, "tlogEntries");
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(vm, "certificate")) ||
        (cJSON_IsArray(tlog) && cJSON_GetArraySize(tlog) > 0)) {
        rc = ms_fail(err, sig_path, "a keyless (Sigstore) signature: verifying it needs the "
                     "Sigstore trust root and a transparency-log check, which sluice does not do "
                     "offline; verify it with the reference verifier (model_signing verify "
                     "sigstore) where the model is published, and sign it for loaders with a key "
                     "or a certificate ('sluice sign --format model-signing')%s", "");
        goto done;
    }
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(root, "dsseEnvelope");
    if (!cJSON_IsObject(env)) {
        rc = ms_fail(err, sig_path, "the bundle has no DSSE envelope (\"dsseEnvelope\")%s", "");
        goto done;
    }
    const cJSON *sigs = cJSON_GetObjectItemCaseSensitive(env, "signatures");
    if (!cJSON_IsArray(sigs) || cJSON_GetArraySize(sigs) < 1) {
        rc = ms_fail(err, sig_path, "the DSSE envelope has no signature%s", "");
        goto done;
    }
    if ((rc = b64_field(env, "payload", "the envelope's", sig_path, &payload, &payload_len, err)) < 0 ||
        (rc = b64_field(cJSON_GetArrayItem(sigs, 0), "sig", "the envelope's signature", sig_path,
                        &sig, &sig_len, err)) < 0)
        goto done;
    if (!(msg = pae(payload, payload_len, &msg_len))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
        goto done;
    }
    if ((rc = check_envelope_sig(vm, sig_path, t, msg, msg_len, sig, sig_len, err)) < 0)
        goto done;
    /* Authentic from here on; what it says is checked next. */
    const char *ptype = json_string(env, "payloadType");
    if (!ptype || strcmp(ptype, MS_PAYLOAD_TYPE)) {
        rc = ms_fail(err, sig_path, "wrong payload type %s (expected \"" MS_PAYLOAD_TYPE "\")",
                     shown(q, sizeof q, ptype));
        goto done;
    }
    st = cJSON_ParseWithLength((const char *)payload, payload_len);
    if (!cJSON_IsObject(st)) {
        rc = ms_fail(err, sig_path, "the payload is not a JSON object (an in-toto statement)%s", "");
        goto done;
    }
    if (!(s = calloc(1, sizeof *s))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "signature %s: out of memory", sig_path);
        goto done;
    }
    if ((rc = take_statement(st, sig_path, s, err)) < 0)
        goto done;
    s->certified = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(vm, "x509CertificateChain"));
    *out = s;
    s = NULL;
done:
    sl_ms_statement_free(s);
    cJSON_Delete(st);
    cJSON_Delete(root);
    free(payload);
    free(sig);
    free(msg);
    return rc;
}

int sl_ms_verify_file(const char *sig_path, const sl_ms_trust *t, sl_ms_statement **out,
                      sl_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = sl_sig_read_file("signature", sig_path, SL_MS_MAX_BYTES, &text, &len, err);
    if (rc < 0)
        return rc;
    rc = sl_ms_verify_text(sig_path, text, len, t, out, err);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- the link */

/* The resource of file path (files), or its first shard (shards). */
static const sl_ms_resource *find_path(const sl_ms_statement *s, const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < s->nres; i++)
        if (s->res[i].path_len == n && !memcmp(s->res[i].name, path, n))
            return &s->res[i];
    return NULL;
}

int sl_ms_check_link(const sl_ms_statement *s, const char *sig_path, const char *manifest_name,
                     const char *manifest_path, const char *text, size_t len,
                     const char *const *files, size_t nfiles, sl_err *err)
{
    const sl_ms_resource *r = manifest_name ? find_path(s, manifest_name) : NULL;
    if (!r)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the manifest %s is not listed among "
                       "the %zu signed files%s (sign the directory after 'sluice manifest')",
                       sig_path, manifest_path, s->nres,
                       manifest_name ? "" : ": it is outside the model's directory");
    uint8_t d[32];
    char hex[65], hex2[129];
    if (!r->sha256)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the manifest %s is listed with a "
                       "digest that is not SHA-256", sig_path, manifest_path);
    if (s->method == SL_MS_SHARDS) {
        /* the whole manifest must be one shard: its bytes are few */
        if (r->start != 0 || r->end != len)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the manifest %s is listed as "
                           "shard %s, not as its %zu bytes whole", sig_path, manifest_path,
                           r->name, len);
    }
    if (!EVP_Digest(text, len, d, NULL, EVP_sha256(), NULL))
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: cannot hash the manifest", sig_path);
    if (memcmp(d, r->digest, 32) != 0)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the manifest %s differs from the one "
                       "signed: its SHA-256 is %s, the signature lists %s", sig_path,
                       manifest_path, hex_of(d, 32, hex), hex_of(r->digest, 32, hex2));
    for (size_t i = 0; i < nfiles; i++) {
        const sl_ms_resource *f = find_path(s, files[i]);
        if (!f)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the model file %s is not "
                           "listed among the signed files", sig_path, files[i]);
        if (!f->sha256)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the model file %s is listed "
                           "with a digest that is not SHA-256", sig_path, files[i]);
    }
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- the tree */

typedef struct tree {
    char **names;  /* relative, '/'-separated */
    size_t n, cap;
} tree;

static void tree_free(tree *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->names[i]);
    free(t->names);
}

static int is_ignored(const char *rel, const char *const *ign, size_t nign)
{
    for (size_t i = 0; i < nign; i++) {
        size_t n = strlen(ign[i]);
        while (n && ign[i][n - 1] == '/')
            n--;
        if (n && !strncmp(rel, ign[i], n) && (rel[n] == '\0' || rel[n] == '/'))
            return 1;
    }
    return 0;
}

/* Lists the regular files under root/rel (rel "" for the root). */
static int walk(const char *root, const char *rel, tree *t, const char *const *ign, size_t nign,
                sl_err *err)
{
    char dir[4096], q[SL_QUOTE_MAX];
    snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d)
        return sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot list", dir);
    int rc = SLUICE_OK;
    struct dirent *e;
    while (rc == SLUICE_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[4096], full[8192];
        int n = snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        if (n < 0 || (size_t)n >= sizeof sub) {
            rc = sl_fail(err, SLUICE_E_IO, "%s/%s: path too long", dir, e->d_name);
            break;
        }
        if (is_ignored(sub, ign, nign))
            continue;
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (lstat(full, &st) != 0) {
            rc = sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot stat", shown(q, sizeof q, full));
        } else if (S_ISLNK(st.st_mode)) {
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "%s: a symbolic link (OpenSSF model signing "
                         "does not follow them by default)", shown(q, sizeof q, full));
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk(root, sub, t, ign, nign, err);
        } else if (S_ISREG(st.st_mode)) {
            if (t->n == t->cap) {
                size_t cap = t->cap ? 2 * t->cap : 16;
                char **g = realloc(t->names, cap * sizeof *g);
                if (!g) {
                    rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
                    break;
                }
                t->names = g;
                t->cap = cap;
            }
            if (!(t->names[t->n] = strdup(sub)))
                rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
            else
                t->n++;
        } else { /* the reference refuses these rather than pass them by */
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "%s: neither a regular file nor a directory "
                         "(a FIFO, socket or device, which OpenSSF model signing does not "
                         "read)", shown(q, sizeof q, full));
        }
    }
    closedir(d);
    return rc;
}

/* The reference's order: path components compared in turn, so that "/"
 * sorts before every other byte. */
static int path_cmp(const void *pa, const void *pb)
{
    const unsigned char *a = *(const unsigned char *const *)pa, *b = *(const unsigned char *const *)pb;
    for (;; a++, b++) {
        unsigned x = *a == '/' ? 1u : *a ? *a + 1u : 0u, y = *b == '/' ? 1u : *b ? *b + 1u : 0u;
        if (x != y)
            return x < y ? -1 : 1;
        if (!x)
            return 0;
    }
}

/* SHA-256 of bytes [start, end) of path (end UINT64_MAX: to the end). */
static int hash_file(const char *path, uint64_t start, uint64_t end, uint8_t out[32], sl_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot open", path);
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    int rc = SLUICE_OK;
    if (!h || !buf || EVP_DigestInit_ex(h, EVP_sha256(), NULL) != 1) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto done;
    }
    uint64_t off = start;
    while (off < end) {
        size_t want = end - off < cap ? (size_t)(end - off) : cap;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot read at %" PRIu64, path, off);
            goto done;
        }
        if (r == 0) {
            if (end != UINT64_MAX)
                rc = sl_fail(err, SLUICE_E_SIGNATURE, "%s: ends at byte %" PRIu64 ", before the "
                             "signed shard's end %" PRIu64, path, off, end);
            break;
        }
        EVP_DigestUpdate(h, buf, (size_t)r);
        off += (uint64_t)r;
    }
    if (rc == SLUICE_OK && EVP_DigestFinal_ex(h, out, NULL) != 1)
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
done:
    EVP_MD_CTX_free(h);
    free(buf);
    close(fd);
    return rc;
}

/* The ignore list: the defaults, the statement's, sig_path's base name
 * when it lies in root, and extra. */
static const char **ignores(const sl_ms_statement *s, const char *root, const char *sig_path,
                            const char *const *extra, size_t nextra, size_t *n, char **sig_rel)
{
    *sig_rel = NULL;
    size_t cap = NDEFAULT_IGNORES + (s ? s->nignore : 0) + nextra + 1, k = 0;
    const char **v = calloc(cap, sizeof *v);
    if (!v)
        return NULL;
    for (size_t i = 0; i < NDEFAULT_IGNORES; i++)
        v[k++] = default_ignores[i];
    for (size_t i = 0; s && i < s->nignore; i++)
        v[k++] = s->ignore[i];
    for (size_t i = 0; i < nextra; i++)
        v[k++] = extra[i];
    size_t rl = strlen(root);
    if (sig_path && !strncmp(sig_path, root, rl) && sig_path[rl] == '/')
        v[k++] = sig_path + rl + 1;
    *n = k;
    return v;
}

/* Shards sorted by path, then start. */
static int shard_cmp(const void *pa, const void *pb)
{
    const sl_ms_resource *a = *(const sl_ms_resource *const *)pa, *b = *(const sl_ms_resource *const *)pb;
    size_t n = a->path_len < b->path_len ? a->path_len : b->path_len;
    int c = memcmp(a->name, b->name, n);
    if (c || a->path_len != b->path_len)
        return c ? c : a->path_len < b->path_len ? -1 : 1;
    return a->start < b->start ? -1 : a->start > b->start;
}

/* Shards mode: each file's shards must cover it whole, from byte 0 to
 * its size, end to start, as the reference's re-sharding of the file
 * does; bytes no shard covers (appended after the last one, or in a gap)
 * are bytes nobody signed. */
static int check_shard_cover(const sl_ms_statement *s, const char *model_path,
                             const char *sig_path, sl_err *err)
{
    const sl_ms_resource **v = malloc((s->nres + 1) * sizeof *v);
    if (!v)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    for (size_t i = 0; i < s->nres; i++)
        v[i] = &s->res[i];
    qsort(v, s->nres, sizeof *v, shard_cmp);
    int rc = SLUICE_OK;
    for (size_t i = 0; i < s->nres && rc == SLUICE_OK;) {
        size_t j = i;
        uint64_t at = 0;
        for (; j < s->nres && v[j]->path_len == v[i]->path_len &&
               !memcmp(v[j]->name, v[i]->name, v[i]->path_len); j++) {
            if (v[j]->start != at || v[j]->end <= v[j]->start) {
                rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the shards of %.*s do not "
                             "cover it end to start: %s follows byte %" PRIu64, sig_path,
                             (int)v[i]->path_len, v[i]->name, v[j]->name, at);
                break;
            }
            at = v[j]->end;
        }
        if (rc < 0)
            break;
        char full[8192];
        struct stat st;
        snprintf(full, sizeof full, "%s/%.*s", model_path, (int)v[i]->path_len, v[i]->name);
        if (stat(full, &st) != 0)
            rc = sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot stat", full);
        else if ((uint64_t)st.st_size != at)
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s is %" PRIu64 " bytes, but its "
                         "signed shards end at byte %" PRIu64 " (bytes no shard covers)", sig_path,
                         full, (uint64_t)st.st_size, at);
        i = j;
    }
    free(v);
    return rc;
}

int sl_ms_check_tree(const sl_ms_statement *s, const char *model_path, const char *sig_path,
                     const char *const *extra_ignore, size_t nextra, sl_err *err)
{
    struct stat st;
    if (stat(model_path, &st) != 0)
        return sl_fail_errno(err, SLUICE_E_IO, errno, "%s: cannot stat", model_path);
    uint8_t d[32];
    char hex[65], hex2[129], q[SL_QUOTE_MAX];
    int rc;
    if (!S_ISDIR(st.st_mode)) { /* one file: its resource is "." */
        if (s->nres != 1 || strcmp(s->res[0].name, ".") || !s->res[0].sha256)
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s is one file, and the "
                           "signature lists %zu resources, not the one \".\" of a file model",
                           sig_path, model_path, s->nres);
        if ((rc = hash_file(model_path, 0, UINT64_MAX, d, err)) < 0)
            return rc;
        if (memcmp(d, s->res[0].digest, 32))
            return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: file %s: SHA-256 %s, the "
                           "signature lists %s", sig_path, model_path, hex_of(d, 32, hex),
                           hex_of(s->res[0].digest, 32, hex2));
        return SLUICE_OK;
    }
    size_t nign = 0;
    char *sig_rel = NULL;
    const char **ign = ignores(s, model_path, sig_path, extra_ignore, nextra, &nign, &sig_rel);
    if (!ign)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    tree t = {0};
    rc = walk(model_path, "", &t, ign, nign, err);
    free(ign);
    for (size_t i = 0; rc == SLUICE_OK && i < t.n; i++)
        if (!find_path(s, t.names[i]))
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the file %s in %s is not "
                         "signed (not listed, not ignored)", sig_path,
                         shown(q, sizeof q, t.names[i]), model_path);
    for (size_t i = 0; rc == SLUICE_OK && i < s->nres; i++) {
        const sl_ms_resource *r = &s->res[i];
        char full[8192], path[4096];
        snprintf(path, sizeof path, "%.*s", (int)r->path_len, r->name);
        snprintf(full, sizeof full, "%s/%s", model_path, path);
        size_t k = 0;
        while (k < t.n && strcmp(t.names[k], path))
            k++;
        if (k == t.n) {
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the signed file %s is missing "
                         "(or ignored)", sig_path, full);
            break;
        }
        if (!r->sha256) {
            rc = sl_fail(err, SLUICE_E_UNSUPPORTED, "signature %s: %s: its digest is not SHA-256 "
                         "(the only one sluice checks)", sig_path, r->name);
            break;
        }
        if ((rc = hash_file(full, r->start, s->method == SL_MS_SHARDS ? r->end : UINT64_MAX, d,
                            err)) < 0)
            break;
        if (memcmp(d, r->digest, 32))
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s %s: SHA-256 %s, the signature "
                         "lists %s", sig_path, s->method == SL_MS_SHARDS ? "shard" : "file",
                         r->name, hex_of(d, 32, hex), hex_of(r->digest, 32, hex2));
    }
    if (rc == SLUICE_OK && s->method == SL_MS_SHARDS)
        rc = check_shard_cover(s, model_path, sig_path, err);
    tree_free(&t);
    return rc;
}

/* ---------------------------------------------------------------- signing */

static char *der_b64(X509 *c)
{
    unsigned char *der = NULL;
    int n = i2d_X509(c, &der);
    char *s = n > 0 ? b64_encode(der, (size_t)n) : NULL;
    OPENSSL_free(der);
    return s;
}

/* The verification material: the key's hint, or the certificate chain. */
static cJSON *material(EVP_PKEY *key, X509 *cert, STACK_OF(X509) *chain)
{
    cJSON *vm = cJSON_CreateObject();
    if (!vm)
        return NULL;
    int ok = 1;
    if (cert) {
        cJSON *list = cJSON_AddArrayToObject(cJSON_AddObjectToObject(vm, "x509CertificateChain"),
                                             "certificates");
        int n = chain ? sk_X509_num(chain) : 0;
        for (int i = -1; ok && list && i < n; i++) {
            char *b = der_b64(i < 0 ? cert : sk_X509_value(chain, i));
            cJSON *o = cJSON_CreateObject();
            ok = b && o && cJSON_AddStringToObject(o, "rawBytes", b) && cJSON_AddItemToArray(list, o);
            if (!ok)
                cJSON_Delete(o);
            free(b);
        }
        ok = ok && list;
    } else {
        char hint[65];
        cJSON *pk = cJSON_AddObjectToObject(vm, "publicKey");
        ok = pk && sl_ms_key_hint(key, hint) == 0 && cJSON_AddStringToObject(pk, "hint", hint);
    }
    if (!ok || !cJSON_AddArrayToObject(vm, "tlogEntries")) {
        cJSON_Delete(vm);
        return NULL;
    }
    return vm;
}

/* The statement of the resources names[0..n) (sorted) under model_dir. */
static cJSON *statement(const char *model_dir, tree *t, const char *const *ign, size_t nign,
                        sl_err *err)
{
    cJSON *st = cJSON_CreateObject(), *pred = NULL, *ser, *res, *igl, *sub, *dig;
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    int rc = SLUICE_OK;
    if (!st || !h || EVP_DigestInit_ex(h, EVP_sha256(), NULL) != 1)
        goto nomem;
    char hex[65], full[8192];
    res = cJSON_CreateArray();
    if (!res)
        goto nomem;
    for (size_t i = 0; i < t->n; i++) {
        uint8_t d[32];
        snprintf(full, sizeof full, "%s/%s", model_dir, t->names[i]);
        if ((rc = hash_file(full, 0, UINT64_MAX, d, err)) < 0) {
            cJSON_Delete(res);
            goto fail;
        }
        EVP_DigestUpdate(h, d, 32);
        cJSON *r = cJSON_CreateObject();
        if (!r || !cJSON_AddItemToArray(res, r) || !cJSON_AddStringToObject(r, "name", t->names[i]) ||
            !cJSON_AddStringToObject(r, "algorithm", "sha256") ||
            !cJSON_AddStringToObject(r, "digest", hex_of(d, 32, hex))) {
            cJSON_Delete(res);
            goto nomem;
        }
    }
    uint8_t root[32];
    char real[4096], name[4096];
    const char *base = strrchr(model_dir, '/') ? strrchr(model_dir, '/') + 1 : model_dir;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        base = realpath(model_dir, real) ? (strrchr(real, '/') ? strrchr(real, '/') + 1 : real) : "model";
    }
    snprintf(name, sizeof name, "%s", base);
    if (EVP_DigestFinal_ex(h, root, NULL) != 1 ||
        !cJSON_AddStringToObject(st, "_type", MS_STATEMENT_TYPE) ||
        !(sub = cJSON_AddArrayToObject(st, "subject")) || !cJSON_AddItemToArray(sub, cJSON_CreateObject()) ||
        !cJSON_AddStringToObject(cJSON_GetArrayItem(sub, 0), "name", name) ||
        !(dig = cJSON_AddObjectToObject(cJSON_GetArrayItem(sub, 0), "digest")) ||
        !cJSON_AddStringToObject(dig, "sha256", hex_of(root, 32, hex)) ||
        !cJSON_AddStringToObject(st, "predicateType", MS_PREDICATE_TYPE) ||
        !(pred = cJSON_AddObjectToObject(st, "predicate")) ||
        !(ser = cJSON_AddObjectToObject(pred, "serialization")) ||
        !cJSON_AddStringToObject(ser, "method", "files") ||
        !cJSON_AddStringToObject(ser, "hash_type", "sha256") ||
        !cJSON_AddFalseToObject(ser, "allow_symlinks") ||
        !(igl = cJSON_AddArrayToObject(ser, "ignore_paths"))) {
        cJSON_Delete(res);
        goto nomem;
    }
    for (size_t i = 0; i < nign; i++)
        if (!cJSON_AddItemToArray(igl, cJSON_CreateString(ign[i]))) {
            cJSON_Delete(res);
            goto nomem;
        }
    cJSON_AddItemToObject(pred, "resources", res);
    EVP_MD_CTX_free(h);
    return st;
nomem:
    rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
fail:
    (void)rc;
    EVP_MD_CTX_free(h);
    cJSON_Delete(st);
    return NULL;
}

int sl_ms_sign(const char *model_dir, const char *sig_path, EVP_PKEY *key, X509 *cert,
               STACK_OF(X509) *chain, size_t *nres, sl_err *err)
{
    *nres = 0;
    char curve[80], why[160];
    const EVP_MD *md = ec_md(key, curve, sizeof curve);
    if (!md)
        return sl_fail(err, SLUICE_E_SIGNATURE, "sign: the key is %s, not EC P-256, P-384 or "
                       "P-521", curve);
    if (cert) {
        EVP_PKEY *ck = X509_get0_pubkey(cert);
        if (!ck || EVP_PKEY_eq(ck, key) != 1)
            return sl_fail(err, SLUICE_E_SIGNATURE, "sign: the certificate's public key is not "
                           "the key's (the certificate was issued for another key)");
        const char *no = leaf_may_not_sign(cert);
        if (no)
            return sl_fail(err, SLUICE_E_SIGNATURE, "sign: the certificate may not sign models: "
                           "%s; verifiers would refuse the bundle", no);
    }
    size_t nign = 0;
    char *sig_rel = NULL;
    const char **ign = ignores(NULL, model_dir, sig_path, NULL, 0, &nign, &sig_rel);
    if (!ign)
        return sl_fail(err, SLUICE_E_NOMEM, "out of memory");
    tree t = {0};
    cJSON *st = NULL, *bundle = NULL;
    char *payload = NULL, *p64 = NULL, *s64 = NULL, *text = NULL;
    uint8_t *msg = NULL, *sig = NULL;
    EVP_MD_CTX *ctx = NULL;
    int rc = walk(model_dir, "", &t, ign, nign, err);
    if (rc < 0)
        goto done;
    qsort(t.names, t.n, sizeof *t.names, path_cmp);
    /* a bare "model.sig" in the list once */
    size_t record = NDEFAULT_IGNORES + (nign > NDEFAULT_IGNORES &&
                                        strcmp(ign[nign - 1], SL_MS_DEFAULT_NAME) ? 1 : 0);
    if (!(st = statement(model_dir, &t, ign, record, err))) {
        rc = err->code ? err->code : SLUICE_E_NOMEM;
        goto done;
    }
    size_t msg_len = 0, sig_len = 0;
    if (!(payload = cJSON_Print(st)) || !(msg = pae((const uint8_t *)payload, strlen(payload), &msg_len)) ||
        !(ctx = EVP_MD_CTX_new()) || !(sig = malloc((size_t)EVP_PKEY_get_size(key)))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto done;
    }
    sig_len = (size_t)EVP_PKEY_get_size(key);
    if (EVP_DigestSignInit(ctx, NULL, md, NULL, key) != 1 ||
        EVP_DigestSign(ctx, sig, &sig_len, msg, msg_len) != 1) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "sign: ECDSA signing failed (%s)",
                     sl_sig_openssl_reason(why, sizeof why));
        goto done;
    }
    cJSON *env, *sigs, *s0, *vm = material(key, cert, chain);
    if (!vm || !(p64 = b64_encode((const uint8_t *)payload, strlen(payload))) ||
        !(s64 = b64_encode(sig, sig_len)) || !(bundle = cJSON_CreateObject()) ||
        !cJSON_AddStringToObject(bundle, "mediaType", MS_MEDIA_TYPE) ||
        !cJSON_AddItemToObject(bundle, "verificationMaterial", vm) ||
        !(env = cJSON_AddObjectToObject(bundle, "dsseEnvelope")) ||
        !cJSON_AddStringToObject(env, "payload", p64) ||
        !cJSON_AddStringToObject(env, "payloadType", MS_PAYLOAD_TYPE) ||
        !(sigs = cJSON_AddArrayToObject(env, "signatures")) ||
        !cJSON_AddItemToArray(sigs, s0 = cJSON_CreateObject()) ||
        !cJSON_AddStringToObject(s0, "sig", s64) || !cJSON_AddStringToObject(s0, "keyid", "") ||
        !(text = cJSON_PrintUnformatted(bundle))) {
        if (!bundle || !cJSON_GetObjectItemCaseSensitive(bundle, "verificationMaterial"))
            cJSON_Delete(vm);
        rc = sl_fail(err, SLUICE_E_NOMEM, "out of memory");
        goto done;
    }
    if (sl_replace_file(sig_path, text, strlen(text)) != 0)
        rc = sl_fail_errno(err, errno == ENOMEM ? SLUICE_E_NOMEM : SLUICE_E_IO, errno,
                           "%s: cannot write", sig_path);
    else
        *nres = t.n;
done:
    free(ign);
    tree_free(&t);
    cJSON_Delete(st);
    cJSON_Delete(bundle);
    free(payload);
    free(p64);
    free(s64);
    free(text);
    free(msg);
    free(sig);
    EVP_MD_CTX_free(ctx);
    return rc;
}
