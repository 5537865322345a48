/* test_signature.c: signed manifests at open (sluice_options.trusted_keys):
 * a good signature loads, and every way a signature, a key file or the
 * manifest can be wrong fails the open with SLUICE_E_SIGNATURE and its own
 * message. Keys and signatures are made here with OpenSSL directly, and
 * signature files written by this file's own code, so that the library's
 * reader is checked against the documented format, not against its own
 * writer. */
#include "mf_fixture.h"
#include "util.h"

#include "trust/signature.h"
#include "sluice.h"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct fx {
    char *dir;
    char *model;     /* dir/model.safetensors: tensors t.0 .. t.2 */
    char *manifest;  /* its sidecar, with the right digests */
    char *sig;       /* manifest + ".sig" (not written yet) */
    EVP_PKEY *a, *b; /* two Ed25519 keys */
    char *a_pub, *b_pub, *a_key;
} fx;

static char *write_pem(const char *dir, const char *name, EVP_PKEY *k, int private_key)
{
    char *path = tu_join(dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(private_key ? PEM_write_PKCS8PrivateKey(f, k, NULL, NULL, 0, NULL, NULL)
                                 : PEM_write_PUBKEY(f, k), 1);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* A flat manifest with every tensor's true digest, read independently. */
static void write_manifest(const fx *f)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(f->model, &o, &m), SLUICE_OK);
    mf_buf b = {0};
    mf_addf(&b, "{");
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &ti), SLUICE_OK);
        void *bytes = tu_pread_range(ti.file, ti.offset, ti.nbytes);
        uint8_t d[32];
        char hex[65];
        mf_sha256(bytes, ti.nbytes, d);
        free(bytes);
        mf_addf(&b, "%s\"%s\": \"%s\"", i ? ", " : "", ti.name, mf_hex(d, hex));
    }
    mf_addf(&b, "}\n");
    sluice_close(m);
    mf_write_text(f->manifest, b.p);
    mf_buf_free(&b);
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->model = tu_join(f->dir, "model.safetensors");
    f->manifest = tu_join(f->dir, "model.safetensors.manifest.json");
    f->sig = tu_join(f->dir, "model.safetensors.manifest.json.sig");
    mf_write_simple(f->model, 3, 1000);
    write_manifest(f);
    f->a = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    f->b = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    assert_non_null(f->a);
    assert_non_null(f->b);
    f->a_pub = write_pem(f->dir, "a.pub", f->a, 0);
    f->b_pub = write_pem(f->dir, "b.pub", f->b, 0);
    f->a_key = write_pem(f->dir, "a.key", f->a, 1);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    EVP_PKEY_free(f->a);
    EVP_PKEY_free(f->b);
    free(f->dir);
    free(f->model);
    free(f->manifest);
    free(f->sig);
    free(f->a_pub);
    free(f->b_pub);
    free(f->a_key);
    free(f);
    return 0;
}

/* ---------------------------------------------------------------- signing, here */

static void hex32(const uint8_t d[32], char out[65])
{
    mf_hex(d, out);
}

/* The signature file text for sig over msg by key, as documented. */
static void format_sig(EVP_PKEY *key, const uint8_t sig[64], const void *msg, size_t len,
                       char out[512])
{
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(key, &der);
    assert_true(n > 0);
    uint8_t id[32], md[32];
    mf_sha256(der, (size_t)n, id);
    OPENSSL_free(der);
    mf_sha256(msg, len, md);
    unsigned char b64[89];
    assert_int_equal(EVP_EncodeBlock(b64, sig, 64), 88);
    char idhex[65], mdhex[65];
    hex32(id, idhex);
    hex32(md, mdhex);
    snprintf(out, 512,
             "sluice-signature 1\nalgorithm ed25519\nkey sha256:%s\nmanifest-sha256 %s\nsignature %s\n",
             idhex, mdhex, (const char *)b64);
}

static void ed25519_sign(EVP_PKEY *key, const void *msg, size_t len, uint8_t sig[64])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t n = 64;
    assert_non_null(ctx);
    assert_int_equal(EVP_DigestSignInit(ctx, NULL, NULL, NULL, key), 1);
    assert_int_equal(EVP_DigestSign(ctx, sig, &n, msg, len), 1);
    assert_int_equal(n, 64);
    EVP_MD_CTX_free(ctx);
}

/* Signs the file at path with key: writes path.sig; its text in text. */
static void sign_file(const char *path, EVP_PKEY *key, char text[512])
{
    size_t len = 0;
    char *msg = tu_read_file(path, &len);
    assert_non_null(msg);
    uint8_t sig[64];
    ed25519_sign(key, msg, len, sig);
    format_sig(key, sig, msg, len, text);
    free(msg);
    char *sig_path = sl_sig_path(path);
    assert_non_null(sig_path);
    mf_write_text(sig_path, text);
    free(sig_path);
}

/* ---------------------------------------------------------------- opening */

/* Opens f->model with policy and the n trusted keys; returns the status
 * and copies the message. The model is closed. */
static int open_keys(const fx *f, sluice_verify_policy policy, const char *manifest,
                     const char *const *keys, size_t n, char *msg, size_t msg_size)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = policy;
    o.manifest_path = manifest;
    o.trusted_keys = keys;
    o.ntrusted_keys = n;
    o.pool_bytes = 1 << 20;
    sluice_model *m = NULL;
    int rc = sluice_open(f->model, &o, &m);
    assert_non_null(m);
    snprintf(msg, msg_size, "%s", sluice_errmsg(m));
    if (rc == SLUICE_OK && n) {
        /* it loads, verified: every tensor and the verify path */
        assert_int_equal(sluice_verify_mode(m), policy == SLUICE_VERIFY_IF_PRESENT
                                                     ? SLUICE_VERIFY_IF_PRESENT
                                                     : SLUICE_VERIFY_REQUIRE);
        for (size_t i = 0; i < sluice_count(m); i++) {
            sluice_tensor *t = NULL;
            assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
            sluice_release(t);
        }
        assert_int_equal(sluice_verify(m, NULL, 0, NULL, NULL), SLUICE_OK);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return rc;
}

/* The open with the trusted keys must fail with code and a message holding
 * every one of the NULL-terminated strings. */
static void expect_fail(const fx *f, const char *const *keys, size_t n, int code, ...)
{
    char msg[1200];
    int rc = open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, n, msg, sizeof msg);
    if (rc != code)
        fail_msg("open gave %d (%s), expected %d", rc, msg, code);
    va_list ap;
    va_start(ap, code);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!strstr(msg, s))
            fail_msg("message \"%s\" lacks \"%s\"", msg, s);
    va_end(ap);
}

static void key_id_text(EVP_PKEY *k, char out[72])
{
    uint8_t id[32];
    assert_int_equal(sl_sig_key_id(k, id), 0);
    sl_sig_key_id_text(id, out);
}

/* ---------------------------------------------------------------- tests */

static void good_signature(void **state)
{
    fx *f = *state;
    char text[512], msg[1200];
    sign_file(f->manifest, f->a, text);
    const char *keys[] = {f->a_pub};
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 1, msg, sizeof msg), SLUICE_OK);
    assert_int_equal(open_keys(f, SLUICE_VERIFY_REQUIRE, NULL, keys, 1, msg, sizeof msg), SLUICE_OK);
    assert_int_equal(open_keys(f, SLUICE_VERIFY_IF_PRESENT, NULL, keys, 1, msg, sizeof msg), SLUICE_OK);
    /* the signature is over the file's bytes, as `openssl pkeyutl -rawin` makes it */
    assert_int_equal((int)strlen(text), SL_SIG_TEXT_LEN);
}

/* sluice_manifest_sign (the library's signer, which `sluice sign` and the
 * Python package's write_manifest(sign_key=) run) writes the documented
 * file, byte for byte what signing here gives, and the open accepts it;
 * each wrong argument fails with its code and a message. */
static void manifest_sign_api(void **state)
{
    fx *f = *state;
    char why[512], want[512], msg[1200];
    assert_int_equal(sluice_manifest_sign(f->manifest, f->a_key, NULL, why, sizeof why), SLUICE_OK);
    assert_string_equal(why, "");
    size_t len = 0;
    char *got = tu_read_file(f->sig, &len);
    assert_non_null(got);
    char *mf = tu_read_file(f->manifest, &len);
    uint8_t sig[64];
    ed25519_sign(f->a, mf, len, sig);
    format_sig(f->a, sig, mf, len, want);
    assert_string_equal(got, want);
    free(got);
    free(mf);
    const char *keys[] = {f->a_pub};
    assert_int_equal(open_keys(f, SLUICE_VERIFY_REQUIRE, NULL, keys, 1, msg, sizeof msg), SLUICE_OK);
    /* elsewhere: that file only */
    char *other = tu_join(f->dir, "other.sig");
    assert_int_equal(unlink(f->sig), 0);
    assert_int_equal(sluice_manifest_sign(f->manifest, f->a_key, other, NULL, 0), SLUICE_OK);
    assert_int_equal(access(f->sig, F_OK), -1);
    assert_int_equal(access(other, F_OK), 0);
    /* a public key cannot sign; no manifest; NULL arguments */
    assert_int_equal(sluice_manifest_sign(f->manifest, f->a_pub, NULL, why, sizeof why),
                     SLUICE_E_SIGNATURE);
    assert_non_null(strstr(why, f->a_pub));
    assert_int_equal(access(f->sig, F_OK), -1);
    char *none = tu_join(f->dir, "none.json");
    assert_int_equal(sluice_manifest_sign(none, f->a_key, NULL, why, sizeof why), SLUICE_E_IO);
    assert_non_null(strstr(why, none));
    assert_int_equal(sluice_manifest_sign(NULL, f->a_key, NULL, why, sizeof why), SLUICE_E_INVAL);
    assert_non_null(strstr(why, "manifest_path"));
    assert_int_equal(sluice_manifest_sign(f->manifest, NULL, NULL, why, sizeof why), SLUICE_E_INVAL);
    /* a signature that cannot be written: nothing left behind */
    char *dir_sig = tu_join(f->dir, "no/such/dir.sig");
    assert_int_equal(sluice_manifest_sign(f->manifest, f->a_key, dir_sig, why, sizeof why),
                     SLUICE_E_IO);
    assert_non_null(strstr(why, dir_sig));
    free(dir_sig);
    free(none);
    free(other);
}

/* The library's writer writes what the documented format says. */
static void format_round_trip(void **state)
{
    fx *f = *state;
    char text[512], why[256], again[SL_SIG_TEXT_LEN + 1];
    sign_file(f->manifest, f->a, text);
    sl_sig s;
    assert_int_equal(sl_sig_parse(text, strlen(text), &s, why, sizeof why), 0);
    assert_int_equal(sl_sig_format(&s, again), SL_SIG_TEXT_LEN);
    assert_string_equal(again, text);
    /* and sl_sig_sign signs as OpenSSL does here: Ed25519 is deterministic */
    size_t len = 0;
    char *msg = tu_read_file(f->manifest, &len);
    sl_sig mine;
    sl_err err;
    assert_int_equal(sl_sig_sign(f->a, msg, len, &mine, &err), SLUICE_OK);
    assert_memory_equal(&mine, &s, sizeof s);
    free(msg);
}

static void two_keys_either_signs(void **state)
{
    fx *f = *state;
    char text[512], msg[1200];
    const char *keys[] = {f->a_pub, f->b_pub};
    sign_file(f->manifest, f->b, text); /* the second key signs */
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 2, msg, sizeof msg), SLUICE_OK);
    sign_file(f->manifest, f->a, text); /* the first */
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 2, msg, sizeof msg), SLUICE_OK);
}

static void missing_signature(void **state)
{
    fx *f = *state;
    const char *keys[] = {f->a_pub};
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, f->sig, "missing", "is not signed", "sluice sign",
                NULL);
}

static void wrong_key(void **state)
{
    fx *f = *state;
    char text[512], a_id[72], b_id[72];
    sign_file(f->manifest, f->b, text);
    key_id_text(f->a, a_id);
    key_id_text(f->b, b_id);
    const char *keys[] = {f->a_pub};
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "made with key", b_id,
                "not one of the 1 trusted key", a_id, NULL);
}

static void manifest_byte_flipped(void **state)
{
    fx *f = *state;
    char text[512];
    sign_file(f->manifest, f->a, text);
    /* a digest character, so the manifest is still valid JSON */
    size_t len = 0;
    char *m = tu_read_file(f->manifest, &len);
    char *d = strstr(m, ": \"");
    assert_non_null(d);
    d[3] = d[3] == '0' ? '1' : '0';
    tu_write_file(f->manifest, m, len);
    free(m);
    const char *keys[] = {f->a_pub};
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "changed after it was signed", NULL);
}

static void signature_byte_flipped(void **state)
{
    fx *f = *state;
    char text[512];
    size_t len = 0;
    char *m = tu_read_file(f->manifest, &len);
    uint8_t sig[64];
    ed25519_sign(f->a, m, len, sig);
    const char *keys[] = {f->a_pub};
    for (size_t at = 0; at < 64; at += 21) { /* in R, in S, ... */
        sig[at] ^= 0x01;
        format_sig(f->a, sig, m, len, text);
        mf_write_text(f->sig, text);
        expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "does not verify", "the signature was altered",
                    NULL);
        sig[at] ^= 0x01;
    }
    /* a base64 character of the signature line changed to another one */
    format_sig(f->a, sig, m, len, text);
    char *line = strstr(text, "\nsignature ") + 1;
    assert_non_null(line);
    line[10 + 5] = line[10 + 5] == 'A' ? 'B' : 'A';
    mf_write_text(f->sig, text);
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "the signature was altered", NULL);
    free(m);
}

/* A valid signature whose manifest-sha256 line lies is not what it claims. */
static void digest_line_altered(void **state)
{
    fx *f = *state;
    char text[512];
    sign_file(f->manifest, f->a, text);
    char *d = strstr(text, "manifest-sha256 ");
    assert_non_null(d);
    d[16] = d[16] == '0' ? '1' : '0';
    mf_write_text(f->sig, text);
    const char *keys[] = {f->a_pub};
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "line 4 gives", NULL);
}

static void truncated_pem(void **state)
{
    fx *f = *state;
    char text[512];
    sign_file(f->manifest, f->a, text);
    size_t len = 0;
    char *pem = tu_read_file(f->a_pub, &len);
    const char *keys[] = {f->a_pub};
    /* cut in the middle of the base64: no END line */
    tu_write_file(f->a_pub, pem, len / 2);
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "trusted key", f->a_pub, "truncated",
                "-----END PUBLIC KEY-----", NULL);
    /* the END line kept, a base64 line cut short: not a valid key */
    char *body = strchr(pem, '\n') + 1;
    char *end = strstr(pem, "-----END");
    mf_buf b = {0};
    mf_addf(&b, "%.*s%.*s\n%s", (int)(body - pem), pem, (int)(end - body) / 2, body, end);
    mf_write_text(f->a_pub, b.p);
    mf_buf_free(&b);
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "not a valid PEM public key", NULL);
    free(pem);
}

static void bad_key_files(void **state)
{
    fx *f = *state;
    char text[512];
    sign_file(f->manifest, f->a, text);
    char *other = tu_join(f->dir, "other.pub");
    const char *keys[] = {f->a_pub, other};
    /* a broken file fails the open although the good key signed */
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "cannot read", "No such file", NULL);
    mf_write_text(other, "");
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "empty", NULL);
    mf_write_text(other, "hello\n");
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "not a PEM public key", NULL);
    mf_write_text(other, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO2hL0yG user@host\n");
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "OpenSSH", NULL);
    size_t len = 0;
    char *priv = tu_read_file(f->a_key, &len);
    tu_write_file(other, priv, len);
    free(priv);
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "a private key", NULL);
    char *a_pem = tu_read_file(f->a_pub, &len);
    mf_buf b = {0};
    mf_addf(&b, "%s%s", a_pem, a_pem);
    mf_write_text(other, b.p);
    mf_buf_free(&b);
    free(a_pem);
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "more than one", NULL);
    EVP_PKEY *ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    assert_non_null(ec);
    free(write_pem(f->dir, "other.pub", ec, 0));
    EVP_PKEY_free(ec);
    /* an EC key is OpenSSF model signing's (issue 30): it may stand beside
     * the Ed25519 keys, which alone check M.sig */
    char msg[1200];
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 2, msg, sizeof msg), SLUICE_OK);
    unlink(other);
    assert_int_equal(mkdir(other, 0755), 0);
    expect_fail(f, keys, 2, SLUICE_E_SIGNATURE, other, "not a regular file", NULL);
    rmdir(other);
    free(other);
}

/* Each fault of the signature file, with what the message must say. */
static void malformed_signature_files(void **state)
{
    fx *f = *state;
    char good[512];
    sign_file(f->manifest, f->a, good);
    const char *keys[] = {f->a_pub};
    const char *l1 = "sluice-signature 1\n", *l2 = "algorithm ed25519\n";
    const char *l3 = strstr(good, "key "), *l4 = strstr(good, "manifest-sha256 ");
    const char *l5 = strstr(good, "\nsignature ") + 1;
    int n3 = (int)(l4 - l3), n4 = (int)(l5 - l4), n5 = (int)strlen(l5);
    char sig[100];
    snprintf(sig, sizeof sig, "%.88s", l5 + 10);
    struct {
        const char *what;
        char text[1400];
        const char *says;
    } c[24];
    size_t n = 0;
#define CASE(w, s, ...)                                                      \
    do {                                                                     \
        c[n].what = (w);                                                     \
        snprintf(c[n].text, sizeof c[n].text, __VA_ARGS__);                  \
        c[n].says = (s);                                                     \
        n++;                                                                 \
    } while (0)
    CASE("empty", "the file is empty", "%s", "");
    CASE("CRLF", "line 1 holds a carriage return", "sluice-signature 1\r\n%s%.*s%.*s%s", l2, n3, l3, n4, l4, l5);
    CASE("no final LF", "line 5 has no line feed", "%s%s%.*s%.*s%.*s", l1, l2, n3, l3, n4, l4, n5 - 1, l5);
    CASE("version 2", "line 1: unsupported version \"2\"", "sluice-signature 2\n%s%.*s%.*s%s", l2, n3, l3, n4, l4, l5);
    CASE("not ours", "not a sluice signature file: line 1 is \"-----BEGIN", "-----BEGIN PGP SIGNATURE-----\n");
    CASE("lines swapped", "not a sluice signature file: line 1 is \"algorithm", "%s%s%.*s%.*s%s", l2, l1, n3, l3, n4, l4, l5);
    CASE("rsa", "line 2: unsupported algorithm \"rsa\"", "%salgorithm rsa\n%.*s%.*s%s", l1, n3, l3, n4, l4, l5);
    CASE("two spaces", "line 2: unsupported algorithm \" ed25519\"", "%salgorithm  ed25519\n%.*s%.*s%s", l1, n3, l3, n4, l4, l5);
    CASE("key md5", "line 3: the key id \"md5:", "%s%skey md5:%.*s%.*s%s", l1, l2, n3 - 11, l3 + 11, n4, l4, l5);
    CASE("key short", "line 3: the key id has 63 characters, not 64", "%s%s%.*s\n%.*s%s", l1, l2, n3 - 2, l3, n4, l4, l5);
    CASE("key upper", "line 3: the key id has 'F' at position 1 (lowercase hex digits only)", "%s%skey sha256:F%.*s%.*s%s", l1, l2, n3 - 12, l3 + 12, n4, l4, l5);
    CASE("key line missing", "line 3 is \"manifest-sha256", "%s%s%.*s%s", l1, l2, n4, l4, l5);
    CASE("digest g", "line 4: the manifest digest has 'g' at position 64", "%s%s%.*s%.*sg\n%s", l1, l2, n3, l3, n4 - 2, l4, l5);
    CASE("digest long", "line 4: the manifest digest has 65 characters", "%s%s%.*s%.*s0\n%s", l1, l2, n3, l3, n4 - 1, l4, l5);
    CASE("sig bad char", "line 5: the signature has '*' at position 1, not base64", "%s%s%.*s%.*ssignature *%s\n", l1, l2, n3, l3, n4, l4, sig + 1);
    CASE("sig short", "line 5: the signature has 84 characters, not 88", "%s%s%.*s%.*ssignature %.84s\n", l1, l2, n3, l3, n4, l4, sig);
    CASE("sig no padding", "line 5: the signature does not end with \"==\"", "%s%s%.*s%.*ssignature %.86sAA\n", l1, l2, n3, l3, n4, l4, sig);
    CASE("sig not canonical", "line 5: the signature is not canonical base64", "%s%s%.*s%.*ssignature %.85s/==\n", l1, l2, n3, l3, n4, l4, sig);
    CASE("extra line", "6 bytes after line 5", "%s%s%.*s%.*s%shello\n", l1, l2, n3, l3, n4, l4, l5);
    CASE("cut after 3", "the file ends after line 3; line 4", "%s%s%.*s", l1, l2, n3, l3);
    CASE("blank line", "line 3 is \"\", not \"key sha256:", "%s%s\n%.*s%.*s%s", l1, l2, n3, l3, n4, l4, l5);
#undef CASE
    for (size_t i = 0; i < n; i++) {
        mf_write_text(f->sig, c[i].text);
        char msg[1200];
        int rc = open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 1, msg, sizeof msg);
        if (rc != SLUICE_E_SIGNATURE || !strstr(msg, c[i].says) || !strstr(msg, f->sig))
            fail_msg("case %s: open gave %d, \"%s\"; expected SLUICE_E_SIGNATURE and \"%s\"",
                     c[i].what, rc, msg, c[i].says);
    }
    /* a NUL byte (not writable through snprintf) */
    char nul[512];
    memcpy(nul, good, sizeof nul);
    nul[40] = '\0';
    tu_write_file(f->sig, nul, strlen(good));
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "a NUL byte at byte 40", NULL);
    char large[SL_SIG_MAX_BYTES + 2];
    memset(large, '\n', sizeof large);
    memcpy(large, good, strlen(good));
    tu_write_file(f->sig, large, sizeof large);
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, "more than 1024 bytes", NULL);
    /* the good one still loads: every case above was the fault named */
    mf_write_text(f->sig, good);
    char msg[1200];
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 1, msg, sizeof msg), SLUICE_OK);
}

/* The signature is not a regular file: a directory, a FIFO (which must
 * not hang the open). */
static void signature_not_a_file(void **state)
{
    fx *f = *state;
    const char *keys[] = {f->a_pub};
    assert_int_equal(mkfifo(f->sig, 0644), 0);
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, f->sig, "not a regular file", NULL);
    unlink(f->sig);
    assert_int_equal(mkdir(f->sig, 0755), 0);
    expect_fail(f, keys, 1, SLUICE_E_SIGNATURE, f->sig, "not a regular file", NULL);
    rmdir(f->sig);
}

/* Trusted keys never mean "unverified". */
static void keys_need_a_manifest(void **state)
{
    fx *f = *state;
    char text[512], msg[1200];
    sign_file(f->manifest, f->a, text);
    const char *keys[] = {f->a_pub};
    assert_int_equal(open_keys(f, SLUICE_VERIFY_OFF, NULL, keys, 1, msg, sizeof msg), SLUICE_E_INVAL);
    assert_non_null(strstr(msg, "SLUICE_VERIFY_OFF"));
    unlink(f->manifest);
    sluice_verify_policy policies[] = {SLUICE_VERIFY_DEFAULT, SLUICE_VERIFY_IF_PRESENT};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(open_keys(f, policies[i], NULL, keys, 1, msg, sizeof msg), SLUICE_E_SIGNATURE);
        assert_non_null(strstr(msg, "no manifest"));
        assert_non_null(strstr(msg, f->manifest)); /* the sidecar looked for */
        /* without keys the same open succeeds, unverified */
        assert_int_equal(open_keys(f, policies[i], NULL, NULL, 0, msg, sizeof msg), SLUICE_OK);
    }
}

static void bad_key_lists(void **state)
{
    fx *f = *state;
    char msg[1200];
    const char *keys[] = {f->a_pub, NULL};
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, NULL, 1, msg, sizeof msg), SLUICE_E_INVAL);
    assert_non_null(strstr(msg, "trusted_keys is NULL but ntrusted_keys is 1"));
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 0, msg, sizeof msg), SLUICE_E_INVAL);
    assert_non_null(strstr(msg, "trusted_keys is set but ntrusted_keys is 0"));
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, NULL, keys, 2, msg, sizeof msg), SLUICE_E_INVAL);
    assert_non_null(strstr(msg, "trusted_keys[1] is NULL"));
}

/* manifest_path's own .sig is the one read, not the sidecar's. */
static void explicit_manifest_path(void **state)
{
    fx *f = *state;
    char text[512], msg[1200];
    char *elsewhere = tu_join(f->dir, "elsewhere.json");
    size_t len = 0;
    char *m = tu_read_file(f->manifest, &len);
    tu_write_file(elsewhere, m, len);
    free(m);
    const char *keys[] = {f->a_pub};
    sign_file(f->manifest, f->a, text); /* the sidecar's signature: not the one asked */
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, elsewhere, keys, 1, msg, sizeof msg),
                     SLUICE_E_SIGNATURE);
    assert_non_null(strstr(msg, "elsewhere.json.sig: missing"));
    sign_file(elsewhere, f->a, text);
    assert_int_equal(open_keys(f, SLUICE_VERIFY_DEFAULT, elsewhere, keys, 1, msg, sizeof msg),
                     SLUICE_OK);
    free(elsewhere);
}

static void status_name(void **state)
{
    (void)state;
    assert_int_equal(SLUICE_E_SIGNATURE, -48);
    assert_string_equal(sluice_strerror(SLUICE_E_SIGNATURE), "manifest signature missing or invalid");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(good_signature, setup, teardown),
        cmocka_unit_test_setup_teardown(format_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_sign_api, setup, teardown),
        cmocka_unit_test_setup_teardown(two_keys_either_signs, setup, teardown),
        cmocka_unit_test_setup_teardown(missing_signature, setup, teardown),
        cmocka_unit_test_setup_teardown(wrong_key, setup, teardown),
        cmocka_unit_test_setup_teardown(manifest_byte_flipped, setup, teardown),
        cmocka_unit_test_setup_teardown(signature_byte_flipped, setup, teardown),
        cmocka_unit_test_setup_teardown(digest_line_altered, setup, teardown),
        cmocka_unit_test_setup_teardown(truncated_pem, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_key_files, setup, teardown),
        cmocka_unit_test_setup_teardown(malformed_signature_files, setup, teardown),
        cmocka_unit_test_setup_teardown(signature_not_a_file, setup, teardown),
        cmocka_unit_test_setup_teardown(keys_need_a_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_key_lists, setup, teardown),
        cmocka_unit_test_setup_teardown(explicit_manifest_path, setup, teardown),
        cmocka_unit_test(status_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
