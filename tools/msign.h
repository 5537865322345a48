/* msign.h: OpenSSF model signing in the sluice command (msign.c). */
#ifndef SLUICE_TOOLS_MSIGN_H
#define SLUICE_TOOLS_MSIGN_H

#include <openssl/evp.h>

#include <stddef.h>

/* `sluice sign DIR --format model-signing ...` (argv as cmd_sign's). */
int ms_cmd_sign(int argc, char **argv);

/* An EC key on curve "p256", "p384" or "p521"; NULL after a message. */
EVP_PKEY *ms_keygen_curve(const char *curve);

/* 1 when the model at path has a model.sig and keys hold an EC key (so
 * that the library checks model.sig, not MANIFEST.sig). */
int ms_applied(const char *path, const char *const *keys, size_t nkeys);

/* `sluice verify PATH --no-manifest-link`: the bundle sig (NULL:
 * model.sig in PATH, or beside the file PATH) verified with the keys or
 * CAs, then every file under PATH against it. Returns the exit status:
 * 0 verified, 1 a failure (printed), 2 usage. */
int ms_verify_files(const char *path, const char *sig, const char *const *keys, size_t nkeys,
                    const char *const *cas, size_t ncas, const char *const *ignore, size_t nignore);

#endif
