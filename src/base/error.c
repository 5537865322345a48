/* error.c: status names (sluice_strerror) and the message plumbing of
 * error.h. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sl_status_name(int code)
{
    switch (code) {
    case SLUICE_OK: return "success";
    case SLUICE_E_INVAL: return "invalid argument or API misuse";
    case SLUICE_E_NOMEM: return "out of memory";
    case SLUICE_E_IO: return "I/O error";
    case SLUICE_E_NOT_FOUND: return "no such tensor";
    case SLUICE_E_NO_FILES: return "no .safetensors file found";
    case SLUICE_E_HEADER_SHORT: return "file too short for its header";
    case SLUICE_E_HEADER_TOO_LARGE: return "header larger than the limit";
    case SLUICE_E_HEADER_UTF8: return "header is not valid UTF-8";
    case SLUICE_E_HEADER_JSON: return "header is not valid JSON";
    case SLUICE_E_HEADER_NOT_OBJECT: return "header is not a JSON object";
    case SLUICE_E_ENTRY: return "malformed tensor entry";
    case SLUICE_E_DTYPE: return "unknown dtype";
    case SLUICE_E_SHAPE: return "malformed shape";
    case SLUICE_E_OFFSETS: return "malformed data_offsets";
    case SLUICE_E_INTEGER: return "number is not an unsigned 64-bit integer literal";
    case SLUICE_E_OVERFLOW: return "tensor size overflows 64 bits";
    case SLUICE_E_SIZE_MISMATCH: return "shape and dtype disagree with data_offsets";
    case SLUICE_E_LAYOUT: return "tensor data not contiguous or not covering the file";
    case SLUICE_E_DUPLICATE: return "duplicate tensor name";
    case SLUICE_E_METADATA: return "malformed __metadata__";
    case SLUICE_E_INDEX: return "malformed index.json";
    case SLUICE_E_INDEX_SHARD: return "index.json names a missing shard";
    case SLUICE_E_INDEX_MISMATCH: return "index.json disagrees with the shards";
    case SLUICE_E_MANIFEST: return "manifest unreadable or not JSON";
    case SLUICE_E_MANIFEST_FORMAT: return "unsupported or malformed manifest";
    case SLUICE_E_MANIFEST_DIGEST: return "malformed digest in manifest";
    case SLUICE_E_MANIFEST_DUPLICATE: return "name listed twice in manifest";
    case SLUICE_E_MANIFEST_UNKNOWN: return "manifest names something the model lacks";
    case SLUICE_E_MANIFEST_MISSING: return "tensors without a digest in the manifest";
    case SLUICE_E_CHECKSUM: return "checksum mismatch";
    case SLUICE_E_MANIFEST_MISMATCH: return "the header disagrees with the manifest";
    case SLUICE_E_SIGNATURE: return "manifest signature missing or invalid";
    case SLUICE_E_TOO_LARGE: return "tensor larger than the pool";
    case SLUICE_E_POOL_EXHAUSTED: return "pool exhausted by live handles";
    case SLUICE_E_BUSY: return "model busy";
    case SLUICE_E_FILE_CHANGED: return "file changed after open";
    case SLUICE_E_CANCELLED: return "cancelled";
    case SLUICE_E_REMOTE: return "remote source failed";
    case SLUICE_E_BUFFER: return "output buffer too small";
    case SLUICE_E_UNSUPPORTED: return "not supported by this build";
    default: return "unknown status";
    }
}

void sl_utf8_cut(char *s)
{
    size_t len = strlen(s), k = len;
    while (k > 0 && len - k < 3 && ((unsigned char)s[k - 1] & 0xC0) == 0x80)
        k--; /* back over continuation bytes to their lead */
    if (k == 0)
        return;
    unsigned char lead = (unsigned char)s[k - 1];
    size_t want = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 && lead <= 0xEF ? 3
                : lead >= 0xC2 && lead <= 0xDF ? 2 : 1;
    if (want > 1 && len - (k - 1) < want)
        s[k - 1] = '\0';
}

size_t sl_utf8_prefix(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    size_t k = max;
    while (k > 0 && max - k < 3 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--; /* s[k] continues a character that began before it */
    return ((unsigned char)s[k] & 0xC0) == 0x80 ? max : k;
}

__attribute__((format(printf, 4, 0)))
static int vfail(sl_err *e, int code, int errnum, const char *fmt, va_list ap)
{
    if (!e)
        return code;
    e->code = code;
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    if (n < 0) {
        e->msg[0] = '\0';
        n = 0;
    }
    if (errnum && (size_t)n < sizeof e->msg)
        n += snprintf(e->msg + n, sizeof e->msg - (size_t)n, ": %s", strerror(errnum));
    if ((size_t)n >= sizeof e->msg)
        sl_utf8_cut(e->msg); /* cut short: never in the middle of a character */
    return code;
}

int sl_fail(sl_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(e, code, 0, fmt, ap);
    va_end(ap);
    return code;
}

int sl_fail_errno(sl_err *e, int code, int errnum, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(e, code, errnum, fmt, ap);
    va_end(ap);
    return code;
}

char *sl_quote(char *out, size_t out_size, const char *name, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, limit = out_size < SL_QUOTE_MAX ? out_size : SL_QUOTE_MAX;
    if (limit < 8) {
        if (out_size)
            out[0] = '\0';
        return out;
    }
    out[o++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (o + 8 >= limit) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        } else {
            out[o++] = (char)c;
        }
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}

int sl_hex_value(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int sl_b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

char *sl_hex_digest(char out[65], const unsigned char digest[32])
{
    static const char digits[] = "0123456789abcdef";
    for (int k = 0; k < 32; k++) {
        out[2 * k] = digits[digest[k] >> 4];
        out[2 * k + 1] = digits[digest[k] & 15];
    }
    out[64] = '\0';
    return out;
}
