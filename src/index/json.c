/* json.c: see json.h. A recursive-descent reader over RFC 8259 with a
 * depth limit; it never reads past len and never allocates more than the
 * input's size for strings. */
#include "index/json.h"

#include <stdlib.h>
#include <string.h>

typedef struct reader {
    sj_doc *doc;
    const char *s;
    size_t len, pos;
} reader;

static int syntax(reader *r, const char *what)
{
    r->doc->error = what;
    r->doc->error_pos = r->pos;
    return -1;
}

static void skip_ws(reader *r)
{
    while (r->pos < r->len) {
        char c = r->s[r->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        r->pos++;
    }
}

/* Appends a node and returns its index, or SJ_NONE when out of memory. */
static uint32_t new_node(reader *r, sj_type type)
{
    sj_doc *d = r->doc;
    if (d->count >= SJ_MAX_NODES) {
        syntax(r, "more JSON values than the reader accepts (8388608)");
        return SJ_NONE;
    }
    if (d->count == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        if (cap > SJ_MAX_NODES)
            cap = SJ_MAX_NODES;
        sj_node *grown = realloc(d->nodes, cap * sizeof *grown);
        if (!grown)
            return SJ_NONE;
        d->nodes = grown;
        d->cap = cap;
    }
    sj_node *n = &d->nodes[d->count];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->first_child = SJ_NONE;
    n->next = SJ_NONE;
    return (uint32_t)d->count++;
}

static int hex4(reader *r, unsigned *out)
{
    if (r->len - r->pos < 4)
        return syntax(r, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->s[r->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return syntax(r, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Reads a string starting at its opening quote into the string buffer.
 * A decoded string is never longer than its quoted form, so the buffer
 * sized to the input never overflows. */
static int read_string(reader *r, const char **out, size_t *out_len)
{
    sj_doc *d = r->doc;
    char *o = d->strings + d->strings_used;
    size_t n = 0;
    r->pos++; /* opening quote */
    for (;;) {
        if (r->pos >= r->len)
            return syntax(r, "unterminated string");
        unsigned char c = (unsigned char)r->s[r->pos];
        if (c == '"') {
            r->pos++;
            break;
        }
        if (c < 0x20)
            return syntax(r, "control character in string");
        if (c != '\\') {
            o[n++] = (char)c;
            r->pos++;
            continue;
        }
        if (++r->pos >= r->len)
            return syntax(r, "unterminated escape");
        char e = r->s[r->pos++];
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(r, &cp) < 0)
                return -1;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return syntax(r, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (r->len - r->pos < 2 || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u')
                    return syntax(r, "lone high surrogate in \\u escape");
                r->pos += 2;
                if (hex4(r, &lo) < 0)
                    return -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return syntax(r, "high surrogate not followed by a low one");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            r->pos--;
            return syntax(r, "unknown escape");
        }
    }
    o[n] = '\0';
    d->strings_used += n + 1;
    *out = o;
    *out_len = n;
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Checks the number grammar and records the literal. */
static int read_number(reader *r, sj_node *n)
{
    size_t start = r->pos;
    if (r->pos < r->len && r->s[r->pos] == '-')
        r->pos++;
    if (r->pos >= r->len || !is_digit(r->s[r->pos]))
        return syntax(r, "bad number");
    if (r->s[r->pos] == '0') {
        r->pos++;
        if (r->pos < r->len && is_digit(r->s[r->pos]))
            return syntax(r, "leading zero in number");
    } else {
        while (r->pos < r->len && is_digit(r->s[r->pos]))
            r->pos++;
    }
    if (r->pos < r->len && r->s[r->pos] == '.') {
        r->pos++;
        if (r->pos >= r->len || !is_digit(r->s[r->pos]))
            return syntax(r, "bad fraction in number");
        while (r->pos < r->len && is_digit(r->s[r->pos]))
            r->pos++;
    }
    if (r->pos < r->len && (r->s[r->pos] == 'e' || r->s[r->pos] == 'E')) {
        r->pos++;
        if (r->pos < r->len && (r->s[r->pos] == '+' || r->s[r->pos] == '-'))
            r->pos++;
        if (r->pos >= r->len || !is_digit(r->s[r->pos]))
            return syntax(r, "bad exponent in number");
        while (r->pos < r->len && is_digit(r->s[r->pos]))
            r->pos++;
    }
    n->str = r->s + start;
    n->len = r->pos - start;
    return 0;
}

static int literal(reader *r, const char *word)
{
    size_t n = strlen(word);
    if (r->len - r->pos < n || memcmp(r->s + r->pos, word, n) != 0)
        return syntax(r, "unexpected character");
    r->pos += n;
    return 0;
}

static int read_value(reader *r, uint32_t *out, int depth);

/* Reads the elements of an array or the members of an object (the opening
 * bracket already consumed) and links them under parent. */
static int read_children(reader *r, uint32_t parent, int is_object, int depth)
{
    char close = is_object ? '}' : ']';
    uint32_t prev = SJ_NONE, count = 0;
    skip_ws(r);
    if (r->pos < r->len && r->s[r->pos] == close) {
        r->pos++;
        return 0;
    }
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0;
        if (is_object) {
            skip_ws(r);
            if (r->pos >= r->len || r->s[r->pos] != '"')
                return syntax(r, "expected a member name");
            if (read_string(r, &key, &key_len) < 0)
                return -1;
            skip_ws(r);
            if (r->pos >= r->len || r->s[r->pos] != ':')
                return syntax(r, "expected ':'");
            r->pos++;
        }
        uint32_t child;
        int rc = read_value(r, &child, depth + 1);
        if (rc < 0)
            return rc;
        sj_node *c = &r->doc->nodes[child];
        c->key = key;
        c->key_len = key_len;
        if (prev == SJ_NONE)
            r->doc->nodes[parent].first_child = child;
        else
            r->doc->nodes[prev].next = child;
        prev = child;
        count++;
        skip_ws(r);
        if (r->pos >= r->len)
            return syntax(r, is_object ? "unterminated object" : "unterminated array");
        char c2 = r->s[r->pos++];
        if (c2 == close)
            break;
        if (c2 != ',') {
            r->pos--;
            return syntax(r, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    r->doc->nodes[parent].count = count;
    return 0;
}

static int read_value(reader *r, uint32_t *out, int depth)
{
    if (depth > SJ_MAX_DEPTH)
        return syntax(r, "nested too deeply");
    skip_ws(r);
    if (r->pos >= r->len)
        return syntax(r, "expected a value");
    char c = r->s[r->pos];
    sj_type type;
    switch (c) {
    case '{': type = SJ_OBJECT; break;
    case '[': type = SJ_ARRAY; break;
    case '"': type = SJ_STRING; break;
    case 't': type = SJ_TRUE; break;
    case 'f': type = SJ_FALSE; break;
    case 'n': type = SJ_NULL; break;
    default:
        if (c == '-' || is_digit(c)) {
            type = SJ_NUMBER;
            break;
        }
        return syntax(r, "unexpected character");
    }
    uint32_t idx = new_node(r, type);
    if (idx == SJ_NONE)
        return r->doc->error ? -1 : -2; /* too many values, or out of memory */
    *out = idx;
    switch (type) {
    case SJ_OBJECT:
    case SJ_ARRAY:
        r->pos++;
        return read_children(r, idx, type == SJ_OBJECT, depth);
    case SJ_STRING: {
        const char *s;
        size_t n;
        if (read_string(r, &s, &n) < 0)
            return -1;
        r->doc->nodes[idx].str = s;
        r->doc->nodes[idx].len = n;
        return 0;
    }
    case SJ_NUMBER:
        return read_number(r, &r->doc->nodes[idx]);
    case SJ_TRUE: return literal(r, "true");
    case SJ_FALSE: return literal(r, "false");
    default: return literal(r, "null");
    }
}

int sj_parse(sj_doc *doc, const char *text, size_t len)
{
    memset(doc, 0, sizeof *doc);
    doc->strings = malloc(len + 1);
    if (!doc->strings)
        return -2;
    reader r = {doc, text, len, 0};
    uint32_t root;
    int rc = read_value(&r, &root, 0);
    if (rc < 0)
        return rc;
    skip_ws(&r);
    if (r.pos != len)
        return syntax(&r, "trailing characters after the value");
    return 0;
}

void sj_free(sj_doc *doc)
{
    free(doc->nodes);
    free(doc->strings);
    memset(doc, 0, sizeof *doc);
}

int sj_u64(const sj_node *n, uint64_t *out)
{
    if (n->type != SJ_NUMBER || n->len == 0)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n->len; i++) {
        char c = n->str[i];
        if (!is_digit(c))
            return -1; /* '-', '.', 'e': not a plain non-negative integer */
        unsigned d = (unsigned)(c - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -2;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int sl_utf8_valid(const unsigned char *s, size_t len, size_t *bad_pos)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1; cp = c & 0x1F; min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2; cp = c & 0x0F; min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3; cp = c & 0x07; min = 0x10000;
        } else {
            *bad_pos = i;
            return 0;
        }
        if (len - i <= need) {
            *bad_pos = i;
            return 0;
        }
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                *bad_pos = i;
                return 0;
            }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            *bad_pos = i;
            return 0;
        }
        i += need + 1;
    }
    return 1;
}
