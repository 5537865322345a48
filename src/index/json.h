/* json.h: a strict JSON reader for safetensors headers (json.c).
 *
 * Why not cJSON here: cJSON keeps numbers as double (2^64-1 and 2.0 cannot
 * be told from 2^64 and 2), cuts strings at an escaped NUL, and does not
 * check UTF-8. A header is hostile input whose numbers are byte offsets,
 * so it gets a reader that keeps every number as its literal text and
 * every string with its length. cJSON still reads index.json and manifests.
 *
 * The input must already be valid UTF-8 (sl_utf8_valid). The tree is a
 * flat array of nodes linked by index; strings are decoded into one buffer
 * and NUL-terminated (the length is authoritative).
 */
#ifndef SLUICE_JSON_H
#define SLUICE_JSON_H

#include <stddef.h>
#include <stdint.h>

#define SJ_NONE UINT32_MAX
#define SJ_MAX_DEPTH 64
/* At most this many JSON values in one document (about 400 MB of nodes):
 * a 100 MB header of "0,0,0,..." would otherwise need 2.4 GB. */
#define SJ_MAX_NODES ((size_t)1 << 23)

typedef enum sj_type {
    SJ_NULL, SJ_FALSE, SJ_TRUE, SJ_NUMBER, SJ_STRING, SJ_ARRAY, SJ_OBJECT
} sj_type;

typedef struct sj_node {
    sj_type type;
    uint32_t count;        /* elements of an array, members of an object */
    uint32_t first_child;  /* SJ_NONE when empty */
    uint32_t next;         /* next sibling; SJ_NONE at the end */
    const char *key;       /* member name when the parent is an object */
    size_t key_len;
    const char *str;       /* string: decoded text; number: the literal as written */
    size_t len;
} sj_node;

typedef struct sj_doc {
    sj_node *nodes;        /* nodes[0] is the root */
    size_t count, cap;
    char *strings;         /* decoded strings, each NUL-terminated */
    size_t strings_used;
    size_t error_pos;      /* byte offset of a syntax error */
    const char *error;     /* what was wrong there (static text) */
} sj_doc;

/* Parses text[0..len) as one JSON value with optional whitespace around.
 * Returns 0, -1 on a syntax error (error and error_pos set), or -2 when
 * out of memory. sj_free must be called either way. */
int sj_parse(sj_doc *doc, const char *text, size_t len);
void sj_free(sj_doc *doc);

/* Reads a number node as an unsigned 64-bit integer literal. Returns 0,
 * -1 when the literal is not a plain non-negative integer (2.0, 2e0, -0,
 * -1), -2 when it is larger than 2^64-1. */
int sj_u64(const sj_node *n, uint64_t *out);

/* 1 when s[0..len) is valid UTF-8 (no overlong forms, no surrogates, at
 * most U+10FFFF), else 0 with *bad_pos set to the first bad byte. */
int sl_utf8_valid(const unsigned char *s, size_t len, size_t *bad_pos);

#endif
