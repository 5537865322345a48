/* signature.c: detached Ed25519 signatures of manifests: the signature
 * file's format (parse and write), PEM keys, signing, and the check
 * sluice_open makes when trusted keys are set (see signature.h and
 * "Signed manifests" in sluice.h).
 *
 * Every rejection says which rule failed, because the person reading it
 * must tell a misconfiguration (a wrong or damaged key file) from an
 * attack (a manifest or signature changed). Nothing here depends on the
 * rest of the library but error.c, so that the sluice command compiles
 * this file in to write what the library reads.
 */
#include "trust/signature.h"
#include "base/replace.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIG_FORMAT_LINE "sluice-signature 1"
#define SIG_ALGORITHM_LINE "algorithm ed25519"
#define SIG_B64_LEN 88 /* 64 bytes in base64 with padding */

_Static_assert(sizeof SIG_FORMAT_LINE + sizeof SIG_ALGORITHM_LINE + sizeof "key sha256:" + 64 +
                   sizeof "manifest-sha256 " + 64 + sizeof "signature " + SIG_B64_LEN ==
                   SL_SIG_TEXT_LEN,
               "SL_SIG_TEXT_LEN is the length of a signature file");

/* ---------------------------------------------------------------- files */

typedef enum read_status {
    READ_OK,
    READ_ERRNO,       /* *errnum says why */
    READ_NOT_REGULAR, /* a directory, FIFO, device: never read */
    READ_TOO_LARGE,
    READ_NOMEM
} read_status;

/* Reads the regular file path whole (at most max bytes) into a malloc'd
 * buffer with a NUL after it. Opened non-blocking, so that a FIFO put in
 * a key's or signature's place cannot hang the open; it is then refused. */
static read_status read_small(const char *path, size_t max, char **out, size_t *len, int *errnum)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        *errnum = errno;
        return READ_ERRNO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *errnum = errno;
        close(fd);
        return READ_ERRNO;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return READ_NOT_REGULAR;
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return READ_TOO_LARGE;
    }
    /* Room for the size fstat gave, grown (up to max + 1) if the file grew
     * meanwhile: a large limit (a manifest's) costs no large allocation. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return READ_NOMEM;
    }
    while (n <= max) { /* one byte past max tells a file that grew */
        if (n == cap) {
            size_t want = cap > max / 2 ? max + 1 : cap * 2;
            char *grown = realloc(buf, want + 1);
            if (!grown) {
                free(buf);
                close(fd);
                return READ_NOMEM;
            }
            buf = grown;
            cap = want;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            *errnum = errno;
            free(buf);
            close(fd);
            return READ_ERRNO;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (n > max) {
        free(buf);
        return READ_TOO_LARGE;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return READ_OK;
}

static int read_failed(sl_err *err, const char *what, const char *path, read_status rs, int errnum,
                       size_t max)
{
    switch (rs) {
    case READ_ERRNO:
        return sl_fail_errno(err, SLUICE_E_SIGNATURE, errnum, "%s %s: cannot read", what, path);
    case READ_NOT_REGULAR:
        return sl_fail(err, SLUICE_E_SIGNATURE, "%s %s: not a regular file", what, path);
    case READ_TOO_LARGE:
        return sl_fail(err, SLUICE_E_SIGNATURE, "%s %s: more than %zu bytes, too large to be one",
                       what, path, max);
    default:
        return sl_fail(err, SLUICE_E_NOMEM, "%s %s: out of memory", what, path);
    }
}

int sl_sig_read_file(const char *what, const char *path, size_t max, char **out, size_t *len,
                     sl_err *err)
{
    int errnum = 0;
    read_status rs = read_small(path, max, out, len, &errnum);
    return rs == READ_OK ? SLUICE_OK : read_failed(err, what, path, rs, errnum, max);
}

/* ---------------------------------------------------------------- the format */

/* A character for a message: 'c', or its byte value when not printable. */
static const char *show_char(unsigned char c, char out[16])
{
    if (c >= 0x21 && c < 0x7f)
        snprintf(out, 16, "'%c'", c);
    else
        snprintf(out, 16, "byte 0x%02x", c);
    return out;
}

/* 64 bytes from exactly SIG_B64_LEN characters of canonical base64. */
static int parse_b64_sig(const char *s, size_t n, uint8_t out[64], char *why, size_t why_size)
{
    char ch[16];
    if (n != SIG_B64_LEN) {
        snprintf(why, why_size, "the signature has %zu characters, not %d (64 bytes in base64)", n,
                 SIG_B64_LEN);
        return -1;
    }
    if (s[86] != '=' || s[87] != '=') {
        snprintf(why, why_size, "the signature does not end with \"==\" (64 bytes in base64 do)");
        return -1;
    }
    uint32_t acc = 0;
    size_t o = 0;
    for (size_t i = 0; i < 86; i++) {
        int v = sl_b64_value((unsigned char)s[i]);
        if (v < 0) {
            snprintf(why, why_size, "the signature has %s at position %zu, not base64",
                     show_char((unsigned char)s[i], ch), i + 1);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[o++] = (uint8_t)(acc >> 16);
            out[o++] = (uint8_t)(acc >> 8);
            out[o++] = (uint8_t)acc;
            acc = 0;
        }
    }
    /* the last two characters hold 12 bits: 8 of the 64th byte, 4 zero */
    if (acc & 0xf) {
        snprintf(why, why_size, "the signature is not canonical base64 (the 4 bits after the "
                                "last byte are not zero)");
        return -1;
    }
    out[o] = (uint8_t)(acc >> 4);
    return 0;
}

/* 32 bytes from exactly 64 lowercase hex digits. */
static int parse_hex32(const char *what, const char *s, size_t n, uint8_t out[32], char *why,
                       size_t why_size)
{
    char ch[16];
    if (n != 64) {
        snprintf(why, why_size, "%s has %zu characters, not 64 hex digits", what, n);
        return -1;
    }
    for (size_t i = 0; i < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) {
            snprintf(why, why_size, "%s has %s at position %zu (lowercase hex digits only)", what,
                     show_char(c, ch), i + 1);
            return -1;
        }
        out[i / 2] = (uint8_t)(i % 2 ? out[i / 2] | v : v << 4);
    }
    return 0;
}

/* The lines of a signature file, in their order: the keyword that starts
 * each (followed by one space) and what the line should read. */
static const struct {
    const char *keyword;
    const char *shape;
} sig_lines[] = {
    {"sluice-signature", SIG_FORMAT_LINE},
    {"algorithm", SIG_ALGORITHM_LINE},
    {"key", "key sha256:<64 hex digits>"},
    {"manifest-sha256", "manifest-sha256 <64 hex digits>"},
    {"signature", "signature <88 base64 characters>"},
};
#define SIG_NLINES (sizeof sig_lines / sizeof sig_lines[0])

/* Checks line k's value (n bytes at v) and stores what it gives. */
static int parse_value(size_t k, const char *v, size_t n, sl_sig *out, char *why, size_t why_size)
{
    char q[64];
    switch (k) {
    case 0:
        if (n == 1 && v[0] == '1')
            return 0;
        snprintf(why, why_size, "unsupported version %s (this library reads 1)",
                 sl_quote(q, sizeof q, v, n));
        return -1;
    case 1:
        if (n == 7 && !memcmp(v, "ed25519", 7))
            return 0;
        snprintf(why, why_size, "unsupported algorithm %s (only ed25519)", sl_quote(q, sizeof q, v, n));
        return -1;
    case 2:
        if (n < 7 || memcmp(v, "sha256:", 7) != 0) {
            snprintf(why, why_size, "the key id %s does not start with \"sha256:\"",
                     sl_quote(q, sizeof q, v, n));
            return -1;
        }
        return parse_hex32("the key id", v + 7, n - 7, out->key_id, why, why_size);
    case 3:
        return parse_hex32("the manifest digest", v, n, out->manifest_sha256, why, why_size);
    default:
        return parse_b64_sig(v, n, out->sig, why, why_size);
    }
}

int sl_sig_parse(const char *text, size_t len, sl_sig *out, char *why, size_t why_size)
{
    char q[64], msg[200];
    memset(out, 0, sizeof *out);
    if (len == 0) {
        snprintf(why, why_size, "the file is empty");
        return -1;
    }
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        snprintf(why, why_size, "a NUL byte at byte %zu (a signature file is text)",
                 (size_t)(nul - text));
        return -1;
    }
    size_t pos = 0;
    for (size_t k = 0; k < SIG_NLINES; k++) {
        unsigned line = (unsigned)k + 1;
        if (pos == len) {
            snprintf(why, why_size, "the file ends after line %u; line %u, \"%s\", is missing",
                     line - 1, line, sig_lines[k].shape);
            return -1;
        }
        const char *lf = memchr(text + pos, '\n', len - pos);
        if (!lf) {
            snprintf(why, why_size, "line %u has no line feed at its end (the file is cut short?)",
                     line);
            return -1;
        }
        const char *s = text + pos;
        size_t n = (size_t)(lf - s);
        pos += n + 1;
        if (memchr(s, '\r', n)) {
            snprintf(why, why_size, "line %u holds a carriage return (line ends are LF only)", line);
            return -1;
        }
        size_t kw = strlen(sig_lines[k].keyword);
        if (n <= kw || memcmp(s, sig_lines[k].keyword, kw) != 0 || s[kw] != ' ') {
            if (k == 0)
                snprintf(why, why_size, "not a sluice signature file: line 1 is %s, not \"%s\"",
                         sl_quote(q, sizeof q, s, n), SIG_FORMAT_LINE);
            else
                snprintf(why, why_size, "line %u is %s, not \"%s\"", line,
                         sl_quote(q, sizeof q, s, n), sig_lines[k].shape);
            return -1;
        }
        if (parse_value(k, s + kw + 1, n - kw - 1, out, msg, sizeof msg) < 0) {
            snprintf(why, why_size, "line %u: %s", line, msg);
            return -1;
        }
    }
    if (pos < len) {
        snprintf(why, why_size, "%zu bytes after line %zu (a signature file has %zu lines)",
                 len - pos, SIG_NLINES, SIG_NLINES);
        return -1;
    }
    return 0;
}

size_t sl_sig_format(const sl_sig *s, char out[SL_SIG_TEXT_LEN + 1])
{
    char key[65], digest[65];
    unsigned char b64[SIG_B64_LEN + 1];
    EVP_EncodeBlock(b64, s->sig, 64);
    int n = snprintf(out, SL_SIG_TEXT_LEN + 1, "%s\n%s\nkey sha256:%s\nmanifest-sha256 %s\nsignature %s\n",
                     SIG_FORMAT_LINE, SIG_ALGORITHM_LINE, sl_hex_digest(key, s->key_id),
                     sl_hex_digest(digest, s->manifest_sha256), (const char *)b64);
    return n == SL_SIG_TEXT_LEN ? SL_SIG_TEXT_LEN : 0;
}

char *sl_sig_path(const char *manifest_path)
{
    size_t n = strlen(manifest_path) + sizeof ".sig";
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s.sig", manifest_path);
    return p;
}

/* ---------------------------------------------------------------- keys */

int sl_sig_key_id(EVP_PKEY *key, uint8_t id[32])
{
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(key, &der);
    if (n <= 0)
        return -1;
    int ok = EVP_Digest(der, (size_t)n, id, NULL, EVP_sha256(), NULL);
    OPENSSL_free(der);
    return ok ? 0 : -1;
}

char *sl_sig_key_id_text(const uint8_t id[32], char out[72])
{
    char hex[65];
    snprintf(out, 72, "sha256:%s", sl_hex_digest(hex, id));
    return out;
}

const char *sl_sig_openssl_reason(char *buf, size_t size)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    snprintf(buf, size, "%s", r ? r : "no reason given");
    ERR_clear_error();
    return buf;
}

/* An encrypted private key is refused, never prompted for. */
static int no_passphrase(char *buf, int size, int rwflag, void *user)
{
    (void)buf, (void)size, (void)rwflag, (void)user;
    return -1;
}

static int has(const char *text, size_t len, const char *s)
{
    return memmem(text, len, s, strlen(s)) != NULL;
}

/* What is wrong with a key file's text before any PEM decoding: the other
 * kind of key, another format, a block cut short. NULL when none of that. */
static const char *key_text_fault(const char *text, size_t len, int want_private)
{
    const char *begin = want_private ? "-----BEGIN PRIVATE KEY-----" : "-----BEGIN PUBLIC KEY-----";
    const char *end = want_private ? "-----END PRIVATE KEY-----" : "-----END PUBLIC KEY-----";
    if (has(text, len, "OPENSSH PRIVATE KEY") || has(text, len, "ssh-ed25519 "))
        return "an OpenSSH key, not PEM (make keys with 'sluice keygen')";
    if (!want_private && has(text, len, "PRIVATE KEY-----"))
        return "a private key; a trusted key is a public key (the .pub file of 'sluice keygen')";
    if (want_private && has(text, len, "-----BEGIN ENCRYPTED PRIVATE KEY-----"))
        return "an encrypted private key; only unencrypted PKCS#8 keys are read";
    if (want_private && has(text, len, "-----BEGIN PUBLIC KEY-----"))
        return "a public key; signing needs the private key (the .key file of 'sluice keygen')";
    const char *b = memmem(text, len, begin, strlen(begin));
    if (!b)
        return want_private ? "no \"-----BEGIN PRIVATE KEY-----\" line: not a PEM private key"
                            : "no \"-----BEGIN PUBLIC KEY-----\" line: not a PEM public key";
    size_t rest = len - (size_t)(b - text);
    const char *e = memmem(b, rest, end, strlen(end));
    if (!e)
        return want_private ? "truncated: no \"-----END PRIVATE KEY-----\" line after the BEGIN line"
                            : "truncated: no \"-----END PUBLIC KEY-----\" line after the BEGIN line";
    if (memmem(e, len - (size_t)(e - text), "-----BEGIN ", 11))
        return "more than one PEM block: a key file holds one key";
    return NULL;
}

int sl_sig_pem_key(const char *text, size_t len, int want_private, EVP_PKEY **out)
{
    *out = NULL;
    BIO *bio = BIO_new_mem_buf(text, (int)len);
    if (!bio)
        return -1;
    *out = want_private ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL)
                        : PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    BIO_free(bio);
    return 0;
}

int sl_sig_load_key(const char *what, const char *path, int want_private, EVP_PKEY **out,
                    sl_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int errnum = 0;
    read_status rs = read_small(path, SL_KEY_MAX_BYTES, &text, &len, &errnum);
    if (rs != READ_OK)
        return read_failed(err, what, path, rs, errnum, SL_KEY_MAX_BYTES);
    int rc = SLUICE_OK;
    const char *fault = len == 0 ? "the file is empty" : key_text_fault(text, len, want_private);
    if (fault) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "%s %s: %s", what, path, fault);
        goto done;
    }
    EVP_PKEY *key;
    if (sl_sig_pem_key(text, len, want_private, &key) < 0) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "%s %s: out of memory", what, path);
        goto done;
    }
    char why[160];
    if (!key) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "%s %s: not a valid PEM %s key (%s)", what, path,
                     want_private ? "private" : "public", sl_sig_openssl_reason(why, sizeof why));
        goto done;
    }
    if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) {
        const char *type = EVP_PKEY_get0_type_name(key);
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "%s %s: the key is %s, not Ed25519", what, path,
                     type ? type : "of another type");
        EVP_PKEY_free(key);
        goto done;
    }
    *out = key;
done:
    OPENSSL_cleanse(text, len); /* a private key's bytes do not linger */
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- sign, check */

int sl_sig_sign(EVP_PKEY *key, const void *msg, size_t len, sl_sig *out, sl_err *err)
{
    char why[160];
    memset(out, 0, sizeof *out);
    if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519)
        return sl_fail(err, SLUICE_E_SIGNATURE, "sign: the key is not Ed25519");
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t n = sizeof out->sig;
    int ok = ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) == 1 &&
             EVP_DigestSign(ctx, out->sig, &n, msg, len) == 1 && n == sizeof out->sig &&
             EVP_Digest(msg, len, out->manifest_sha256, NULL, EVP_sha256(), NULL) &&
             sl_sig_key_id(key, out->key_id) == 0;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        return sl_fail(err, SLUICE_E_SIGNATURE, "sign: Ed25519 signing failed (%s)",
                       sl_sig_openssl_reason(why, sizeof why));
    return SLUICE_OK;
}

int sl_sig_sign_file(const char *manifest_path, const char *key_path, const char *sig_path,
                     uint8_t key_id[32], size_t *signed_len, sl_err *err)
{
    EVP_PKEY *key = NULL;
    char *text = NULL, *own_path = NULL;
    size_t len = 0;
    int errnum = 0, rc;
    if (!sig_path && !(sig_path = own_path = sl_sig_path(manifest_path)))
        return sl_fail(err, SLUICE_E_NOMEM, "sign %s: out of memory", manifest_path);
    if ((rc = sl_sig_load_key("key", key_path, 1, &key, err)) < 0)
        goto done;
    read_status rs = read_small(manifest_path, SLUICE_MAX_MANIFEST_BYTES, &text, &len, &errnum);
    if (rs != READ_OK) {
        rc = read_failed(err, "manifest", manifest_path, rs, errnum, SLUICE_MAX_MANIFEST_BYTES);
        if (rc == SLUICE_E_SIGNATURE)
            rc = err->code = SLUICE_E_IO; /* the manifest, not a signature, is at fault */
        goto done;
    }
    sl_sig sig;
    char sig_text[SL_SIG_TEXT_LEN + 1];
    if ((rc = sl_sig_sign(key, text, len, &sig, err)) < 0)
        goto done;
    if (sl_replace_file(sig_path, sig_text, sl_sig_format(&sig, sig_text)) != 0) {
        rc = sl_fail_errno(err, errno == ENOMEM ? SLUICE_E_NOMEM : SLUICE_E_IO, errno,
                           "cannot write %s", sig_path);
        goto done;
    }
    if (key_id)
        memcpy(key_id, sig.key_id, sizeof sig.key_id);
    if (signed_len)
        *signed_len = len;
done:
    EVP_PKEY_free(key);
    free(text);
    free(own_path);
    return rc;
}

/* 1 when sig verifies msg under key, 0 when it does not (a signature
 * OpenSSL finds malformed, S >= L, included), -1 when it could not start
 * (out of memory). */
static int ed25519_verify(EVP_PKEY *key, const uint8_t sig[64], const void *msg, size_t len)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int r = -1;
    if (ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) == 1)
        r = EVP_DigestVerify(ctx, sig, 64, msg, len) == 1;
    EVP_MD_CTX_free(ctx);
    ERR_clear_error(); /* a failed verification leaves a reason in the queue */
    return r;
}

/* "sha256:..., sha256:..." for the first keys, into out. */
static void list_ids(const uint8_t (*ids)[32], size_t n, char *out, size_t size)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && i < 4 && o < size; i++) {
        char t[72];
        o += (size_t)snprintf(out + o, size - o, "%s%s", i ? ", " : "", sl_sig_key_id_text(ids[i], t));
    }
    if (n > 4 && o < size)
        snprintf(out + o, size - o, ", and %zu more", n - 4);
}

/* The signature's verdict for text, once the keys are loaded: sig_text
 * (sig_len bytes) is the signature file's text, read from sig_path. */
static int check_sig_text(const char *manifest_path, const char *sig_path, const char *sig_text,
                          size_t sig_len, const char *text, size_t len, EVP_PKEY *const *keys,
                          const uint8_t (*ids)[32], size_t nkeys, sl_err *err)
{
    char why[400], t[72], hex[65], hex2[65];
    sl_sig sig;
    int bad = sl_sig_parse(sig_text, sig_len, &sig, why, sizeof why);
    if (bad)
        return sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: %s", sig_path, why);
    size_t k = 0;
    while (k < nkeys && (!keys[k] || memcmp(ids[k], sig.key_id, 32) != 0))
        k++;
    if (k == nkeys) {
        list_ids(ids, nkeys, why, sizeof why);
        return sl_fail(err, SLUICE_E_SIGNATURE,
                       "signature %s: made with key %s, which is not one of the %zu trusted "
                       "key%s (%s)", sig_path, sl_sig_key_id_text(sig.key_id, t), nkeys,
                       nkeys == 1 ? "" : "s", why);
    }
    uint8_t digest[32];
    if (!EVP_Digest(text, len, digest, NULL, EVP_sha256(), NULL))
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: cannot hash the manifest (%s)",
                       sig_path, sl_sig_openssl_reason(why, sizeof why));
    int same = memcmp(digest, sig.manifest_sha256, 32) == 0;
    int v = ed25519_verify(keys[k], sig.sig, text, len);
    if (v < 0)
        return sl_fail(err, SLUICE_E_NOMEM, "signature %s: cannot start verifying (out of memory)",
                       sig_path);
    /* Only the Ed25519 verdict decides; the digest line tells which side
     * changed when it fails, and must be true when it succeeds. */
    if (v == 0 && !same)
        return sl_fail(err, SLUICE_E_SIGNATURE,
                       "signature %s: the manifest %s changed after it was signed (its SHA-256 "
                       "is %s, the signature was made over %s)", sig_path, manifest_path,
                       sl_hex_digest(hex, digest), sl_hex_digest(hex2, sig.manifest_sha256));
    if (v == 0)
        return sl_fail(err, SLUICE_E_SIGNATURE,
                       "signature %s: does not verify with trusted key %s, although the "
                       "manifest is the one it names: the signature was altered",
                       sig_path, sl_sig_key_id_text(ids[k], t));
    if (!same)
        return sl_fail(err, SLUICE_E_SIGNATURE,
                       "signature %s: line 4 gives %s, but the manifest signed has SHA-256 %s",
                       sig_path, sl_hex_digest(hex2, sig.manifest_sha256), sl_hex_digest(hex, digest));
    return SLUICE_OK;
}

/* The signature file's verdict for text, once the keys are loaded. */
static int check_sig_file(const char *manifest_path, const char *sig_path, const char *text,
                          size_t len, EVP_PKEY *const *keys, const uint8_t (*ids)[32],
                          size_t nkeys, sl_err *err)
{
    char *sig_text = NULL;
    size_t sig_len = 0;
    int errnum = 0;
    read_status rs = read_small(sig_path, SL_SIG_MAX_BYTES, &sig_text, &sig_len, &errnum);
    if (rs == READ_ERRNO && (errnum == ENOENT || errnum == ENOTDIR))
        return sl_fail(err, SLUICE_E_SIGNATURE,
                       "signature %s: missing: trusted keys are set and the manifest %s is not "
                       "signed (sign it with 'sluice sign %s --key KEY')",
                       sig_path, manifest_path, manifest_path);
    if (rs != READ_OK)
        return read_failed(err, "signature", sig_path, rs, errnum, SL_SIG_MAX_BYTES);
    int rc = check_sig_text(manifest_path, sig_path, sig_text, sig_len, text, len, keys, ids,
                            nkeys, err);
    free(sig_text);
    return rc;
}

/* 1 when path reads as an EC public key (a trusted key of OpenSSF model
 * signing, in the same list as the Ed25519 ones). */
int sl_sig_key_is_ec(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    int errnum = 0;
    if (read_small(path, SL_KEY_MAX_BYTES, &text, &len, &errnum) != READ_OK)
        return 0;
    EVP_PKEY *key;
    sl_sig_pem_key(text, len, 0, &key);
    int ec = key && EVP_PKEY_get_id(key) == EVP_PKEY_EC;
    EVP_PKEY_free(key);
    free(text);
    ERR_clear_error();
    return ec;
}

/* The check of sl_signature_check (sig_text NULL: the file at sig_path
 * is read) or sl_signature_check_text (sig_text given, or missing). */
static int check(const char *manifest_path, const char *fetched_from, int fetched,
                 const char *sig_text, size_t sig_len, const char *text, size_t len,
                 const char *const *keys, size_t nkeys, sl_err *err)
{
    if (!keys || nkeys == 0)
        return sl_fail(err, SLUICE_E_INVAL, "signature: no trusted key given");
    EVP_PKEY **pk = calloc(nkeys, sizeof *pk);
    uint8_t (*ids)[32] = calloc(nkeys, sizeof *ids);
    char *sig_path = fetched ? strdup(fetched_from) : sl_sig_path(manifest_path);
    int rc = SLUICE_OK;
    if (!pk || !ids || !sig_path) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "signature: out of memory");
        goto done;
    }
    /* Every key first: a broken key file is a fault of its own, whichever
     * key signed. */
    size_t ned = 0;
    for (size_t i = 0; i < nkeys; i++) {
        if (sl_sig_key_is_ec(keys[i])) { /* OpenSSF model signing's: not for M.sig */
            memset(ids[i], 0, sizeof ids[i]);
            continue;
        }
        ned++;
        if ((rc = sl_sig_load_key("trusted key", keys[i], 0, &pk[i], err)) < 0)
            goto done;
        if (sl_sig_key_id(pk[i], ids[i]) < 0) {
            char why[160];
            rc = sl_fail(err, SLUICE_E_NOMEM, "trusted key %s: cannot encode it (%s)", keys[i],
                         sl_sig_openssl_reason(why, sizeof why));
            goto done;
        }
    }
    if (!ned) {
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: the trusted keys are all EC keys, "
                     "which check OpenSSF model signatures (model.sig, none beside the model), "
                     "not this Ed25519 signature file", sig_path);
        goto done;
    }
    if (!fetched)
        rc = check_sig_file(manifest_path, sig_path, text, len, pk, (const uint8_t (*)[32])ids,
                            nkeys, err);
    else if (!sig_text)
        rc = sl_fail(err, SLUICE_E_SIGNATURE, "signature %s: missing: trusted keys are set and "
                     "the remote manifest %s has no signature beside it (sign it with 'sluice "
                     "sign' and publish the .sig beside it)", sig_path, manifest_path);
    else
        rc = check_sig_text(manifest_path, sig_path, sig_text, sig_len, text, len, pk,
                            (const uint8_t (*)[32])ids, nkeys, err);
done:
    for (size_t i = 0; pk && i < nkeys; i++)
        EVP_PKEY_free(pk[i]);
    free(pk);
    free(ids);
    free(sig_path);
    return rc;
}

int sl_signature_check(const char *manifest_path, const char *text, size_t len,
                       const char *const *keys, size_t nkeys, sl_err *err)
{
    return check(manifest_path, NULL, 0, NULL, 0, text, len, keys, nkeys, err);
}

int sl_signature_check_text(const char *manifest_path, const char *sig_path, const char *sig_text,
                            size_t sig_len, const char *text, size_t len,
                            const char *const *keys, size_t nkeys, sl_err *err)
{
    return check(manifest_path, sig_path, 1, sig_text, sig_len, text, len, keys, nkeys, err);
}
