/* sign.c: `sluice keygen` and `sluice sign`: Ed25519 key pairs and
 * detached signatures of manifests, which sluice_open checks when given
 * trusted keys (`sluice verify --key`; "Signed manifests" in sluice.h).
 *
 * The signature file's format and the key loading are the library's own
 * (src/trust/signature.c, compiled into this command): one file writes what the
 * library reads.
 */
#include "cmd.h"
#include "integrity.h"
#include "msign.h"
#include "trust/signature.h"

#include <openssl/pem.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- keygen */

static void keygen_usage(FILE *out)
{
    fprintf(out,
            "usage: sluice keygen --out PREFIX [--curve p256|p384|p521]\n"
            "\n"
            "Makes an Ed25519 key pair for signing manifests (with --curve, an EC key\n"
            "pair on that curve, for OpenSSF model signing: 'sluice sign DIR --format\n"
            "model-signing'):\n"
            "  PREFIX.key  the private key (PKCS#8 PEM, unencrypted, mode 0600): keep it\n"
            "              secret, and away from the machines that hold the weights\n"
            "  PREFIX.pub  the public key (SubjectPublicKeyInfo PEM): give it to\n"
            "              'sluice verify --key' and sluice_options.trusted_keys\n"
            "Neither file may exist: a key is never overwritten. Prints the key id\n"
            "(sha256: of the public key's DER), which signature files name.\n"
            "\n"
            CMD_EXIT_HELP
            "keygen: 3 when a file could not be written (then neither is left).\n");
}

/* Creates path (which must not exist) with mode, writes key into it as
 * PEM (the private or the public part) and syncs it. Returns 0, or -1
 * after a message; a file it created is then removed. */
static int write_key_file(const char *path, mode_t mode, EVP_PKEY *key, int private_part)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        if (errno == EEXIST)
            fprintf(stderr, "sluice keygen: %s exists: a key is never overwritten\n", path);
        else
            fprintf(stderr, "sluice keygen: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    BIO *bio = BIO_new_fd(fd, BIO_NOCLOSE);
    /* the mode exactly, whatever the umask (it can only have removed bits) */
    int ok = bio && fchmod(fd, mode) == 0 &&
             (private_part ? PEM_write_bio_PKCS8PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL)
                           : PEM_write_bio_PUBKEY(bio, key)) == 1 &&
             BIO_flush(bio) == 1 && fsync(fd) == 0;
    int e = errno;
    BIO_free(bio);
    if (close(fd) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        fprintf(stderr, "sluice keygen: cannot write %s: %s\n", path, e ? strerror(e) : "OpenSSL failed");
        unlink(path);
        return -1;
    }
    return 0;
}

static char *with_suffix(const char *prefix, const char *suffix)
{
    size_t n = strlen(prefix) + strlen(suffix) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s", prefix, suffix);
    return p;
}

int cmd_keygen(int argc, char **argv)
{
    const char *prefix = NULL, *curve = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            keygen_usage(stdout);
            return 0;
        } else if ((r = ig_file_option("keygen", argc, argv, &i, "--out", "-o", &prefix)) != 0 ||
                   (r = ig_file_option("keygen", argc, argv, &i, "--curve", NULL, &curve)) != 0) {
            if (r < 0)
                return 2;
        } else {
            fprintf(stderr, "sluice keygen: unknown argument '%s'\n", a);
            keygen_usage(stderr);
            return 2;
        }
    }
    if (!prefix || !*prefix) {
        keygen_usage(stderr);
        return 2;
    }
    int status = CMD_EXIT_OPEN;   /* what fails below: a file, a key, memory */
    char *key_path = with_suffix(prefix, ".key"), *pub_path = with_suffix(prefix, ".pub");
    EVP_PKEY *key = curve ? ms_keygen_curve(curve) : EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    uint8_t id[32];
    char id_text[72];
    if (curve && !key)
        goto done;
    if (!key_path || !pub_path || !key || sl_sig_key_id(key, id) < 0) {
        fprintf(stderr, "sluice keygen: cannot make an Ed25519 key (out of memory?)\n");
        goto done;
    }
    /* the public file first: refusing there leaves no private key behind */
    if (write_key_file(pub_path, 0644, key, 0) < 0)
        goto done;
    if (write_key_file(key_path, 0600, key, 1) < 0) {
        unlink(pub_path);
        goto done;
    }
    printf("%s: private key (keep it secret)\n%s: public key %s\n", key_path, pub_path,
           sl_sig_key_id_text(id, id_text));
    status = 0;
done:
    EVP_PKEY_free(key);
    free(key_path);
    free(pub_path);
    return status;
}

/* ---------------------------------------------------------------- sign */

static void sign_usage(FILE *out)
{
    fprintf(out,
            "usage: sluice sign MANIFEST --key KEY [-o FILE]\n"
            "       sluice sign MODEL_DIR --format model-signing --key EC_KEY [--cert CERT\n"
            "                   [--chain CHAIN]...] [-o FILE]   (see --format model-signing --help)\n"
            "\n"
            "Signs the manifest file's exact bytes with the Ed25519 private key KEY\n"
            "(PREFIX.key of 'sluice keygen') and writes the detached signature\n"
            "MANIFEST.sig beside it (replaced atomically), which sluice_open checks\n"
            "when given trusted keys ('sluice verify PATH --key PREFIX.pub'). Any\n"
            "later change to the manifest's bytes voids the signature: sign last.\n"
            "\n"
            "  --key KEY         the private key (unencrypted PKCS#8 PEM)\n"
            "  -o FILE           write the signature to FILE instead (the library reads\n"
            "                    MANIFEST.sig only)\n"
            "\n"
            "With --format model-signing, signs the directory MODEL_DIR as OpenSSF model\n"
            "signing (sigstore/model-transparency) does, into MODEL_DIR/model.sig, with an\n"
            "EC key ('sluice keygen --curve p256') and optionally --cert CERT and --chain\n"
            "CHAIN (repeatable); 'sluice sign --format model-signing --help' says more.\n"
            "\n"
            CMD_EXIT_HELP
            "sign: 3 for a manifest or key that cannot be used, or a signature that\n"
            "cannot be written.\n");
}

int cmd_sign(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--format") && !strcmp(argv[i + 1], "model-signing"))
            return ms_cmd_sign(argc, argv);
    const char *manifest = NULL, *key_path = NULL, *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            sign_usage(stdout);
            return 0;
        } else if ((r = ig_file_option("sign", argc, argv, &i, "--key", "-k", &key_path)) != 0 ||
                   (r = ig_file_option("sign", argc, argv, &i, "--output", "-o", &out_path)) != 0) {
            if (r < 0)
                return 2;
        } else if (ig_path_operand("sign", a, &manifest, sign_usage) < 0) {
            return 2;
        }
    }
    if (!manifest || !key_path) {
        sign_usage(stderr);
        return 2;
    }
    sl_err err = {0};
    uint8_t key_id[32];
    size_t len = 0;
    char id[72];
    if (sl_sig_sign_file(manifest, key_path, out_path, key_id, &len, &err) < 0) {
        fprintf(stderr, "sluice sign: %s\n", err.msg);
        return CMD_EXIT_OPEN; /* a file, a key, memory */
    }
    printf("%s%s: signed %s (%zu bytes) with key %s\n", out_path ? out_path : manifest,
           out_path ? "" : ".sig", manifest, len, sl_sig_key_id_text(key_id, id));
    return 0;
}
