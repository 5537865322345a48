/* error.h: how a failure travels inside sluice.
 *
 * Every internal function that can fail takes an sl_err * and returns a
 * negative SLUICE_E_* code after sl_fail() recorded the detail in it; the
 * public entry points copy that detail to the calling thread's slot of the
 * model (api.c, errmsg.c) so that sluice_errmsg() belongs to the failing call.
 */
#ifndef SLUICE_ERROR_H
#define SLUICE_ERROR_H

#include "sluice.h"

#include <stddef.h>

#define SL_ERRMSG_MAX 1024

typedef struct sl_err {
    int code;
    char msg[SL_ERRMSG_MAX];
} sl_err;

/* The name of a status code (sluice_strerror). */
const char *sl_status_name(int code);

/* Records code and a printf-style message in *e (which may be NULL) and
 * returns code, so that a failure is one line: return sl_fail(e, ...). */
int sl_fail(sl_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like sl_fail, with ": strerror(errnum)" appended. */
int sl_fail_errno(sl_err *e, int code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes name (len bytes, any content) into out as a double-quoted,
 * escaped string, cut to at most about 160 characters with "..." so a
 * message stays one readable line. Returns out. */
char *sl_quote(char *out, size_t out_size, const char *name, size_t len);

/* Drops an incomplete UTF-8 sequence at the end of s: for a message that
 * snprintf cut short, so that it stays valid UTF-8 when the rest is. */
void sl_utf8_cut(char *s);

/* The length of s's first bytes, at most max, that ends between two
 * UTF-8 characters (for "%.*s"); len when len <= max. */
size_t sl_utf8_prefix(const char *s, size_t len, size_t max);
#define SL_QUOTE_MAX 200

/* The value of one hex digit (either case), or -1. */
int sl_hex_value(char ch);

/* The value of one digit of standard base64 (RFC 4648 section 4: A-Z a-z
 * 0-9 + /), or -1 (padding '=' included). */
int sl_b64_value(unsigned char c);

/* Writes a SHA-256 digest as 64 lowercase hex digits and a NUL. */
char *sl_hex_digest(char out[65], const unsigned char digest[32]);

/* Evaluate a call returning a status; return it from the caller if < 0. */
#define SL_TRY(expr)                                                        \
    do {                                                                    \
        int sl_try_rc_ = (expr);                                            \
        if (sl_try_rc_ < 0)                                                 \
            return sl_try_rc_;                                              \
    } while (0)

#endif
