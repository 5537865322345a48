/* manifest_sign.c: sluice_manifest_sign, the detached Ed25519 signature
 * of a manifest file, for callers of the library (the Python package's
 * sluice.write_manifest(..., sign_key=)). The signing itself is
 * signature.c's sl_sig_sign_file, which `sluice sign` runs too: one
 * writer of the format sluice_open checks (see "Signed manifests" in
 * sluice.h).
 */
#include "base/error.h"
#include "trust/signature.h"

#include <sluice.h>

#include <stdio.h>
#include <string.h>

SLUICE_API int sluice_manifest_sign(const char *manifest_path, const char *key_path,
                                    const char *sig_path, char *why, size_t why_cap)
{
    sl_err err = {0};
    int rc;
    if (!manifest_path || !key_path)
        rc = sl_fail(&err, SLUICE_E_INVAL, "sluice_manifest_sign: %s is NULL",
                     !manifest_path ? "manifest_path" : "key_path");
    else
        rc = sl_sig_sign_file(manifest_path, key_path, sig_path, NULL, NULL, &err);
    if (why && why_cap)
        snprintf(why, why_cap, "%s", rc < 0 ? err.msg : "");
    return rc;
}
