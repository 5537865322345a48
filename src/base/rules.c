/* rules.c: which tensors a tensor-parallel rank splits, and along which
 * dim (sluice_part_rules_*).
 *
 * A rules text is a list of lines `PATTERN DIM` or `PATTERN replicated`
 * (fnmatch globs, `*` crossing dots; `#` starts a comment); the first
 * pattern that matches a name decides. The library never guesses from
 * shapes: a name no rule matches is replicated, and a bias no rule names
 * follows its weight (the same dim when the bias has it, replicated
 * otherwise: a row-parallel layer's bias is added once, after the
 * reduction). The built-in set is the naming of Llama, Qwen and Mistral
 * checkpoints as vLLM and Megatron split them. It names no fused
 * projection (qkv_proj, gate_up_proj): those stack several matrices
 * along dim 0 and a rank keeps a slice of each (vLLM's QKVParallelLinear,
 * MergedColumnParallelLinear), which one contiguous part is not, so they
 * stay whole.
 */
#include "base/error.h"

#include "sluice.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most rules one text may hold, and the longest pattern. */
#define RULES_MAX 1024
#define PATTERN_MAX 256

typedef struct rule {
    char pattern[PATTERN_MAX];
    int dim; /* SLUICE_PART_REPLICATED or 0..SLUICE_PART_MAX_DIM */
} rule;

struct sluice_part_rules {
    size_t n;
    rule r[];
};

static const char builtin[] =
    "# Column-parallel (split along the output features, dim 0)\n"
    "*.q_proj.weight 0\n"
    "*.k_proj.weight 0\n"
    "*.v_proj.weight 0\n"
    "*.gate_proj.weight 0\n"
    "*.up_proj.weight 0\n"
    "# the vocabulary is split along dim 0 too\n"
    "*embed_tokens* 0\n"
    "lm_head.weight 0\n"
    "*.lm_head.weight 0\n"
    "# Row-parallel (split along the input features, dim 1)\n"
    "*.o_proj.weight 1\n"
    "*.down_proj.weight 1\n"
    "# Norms whole on every rank (and any name no rule matches)\n"
    "*norm* replicated\n";

SLUICE_API const char *sluice_part_rules_builtin(void)
{
    return builtin;
}

static int bad(char *why, size_t cap, size_t line, const char *what)
{
    if (why && cap)
        snprintf(why, cap, "rules line %zu: %s", line, what);
    return SLUICE_E_INVAL;
}

/* One line's rule into *r: 0 a rule, 1 nothing (blank or comment), or a
 * negative code. */
static int parse_line(const char *s, size_t len, size_t line, rule *r, char *why, size_t cap)
{
    const char *hash = memchr(s, '#', len);
    if (hash)
        len = (size_t)(hash - s);
    const char *tok[3];
    size_t tlen[3], nt = 0, p = 0;
    while (p < len) {
        while (p < len && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r'))
            p++;
        if (p == len)
            break;
        if (nt == 3)
            return bad(why, cap, line, "more than a pattern and a dim");
        tok[nt] = s + p;
        while (p < len && s[p] != ' ' && s[p] != '\t' && s[p] != '\r')
            p++;
        tlen[nt] = (size_t)(s + p - tok[nt]);
        nt++;
    }
    if (nt == 0)
        return 1;
    if (nt != 2)
        return bad(why, cap, line, nt == 1 ? "a pattern without a dim (a number, or "
                                             "\"replicated\")"
                                           : "more than a pattern and a dim");
    if (tlen[0] >= PATTERN_MAX)
        return bad(why, cap, line, "the pattern is longer than 255 bytes");
    memcpy(r->pattern, tok[0], tlen[0]);
    r->pattern[tlen[0]] = '\0';
    if (tlen[1] == 10 && memcmp(tok[1], "replicated", 10) == 0) {
        r->dim = SLUICE_PART_REPLICATED;
        return 0;
    }
    int dim = 0;
    for (size_t k = 0; k < tlen[1]; k++) {
        if (tok[1][k] < '0' || tok[1][k] > '9' || (k == 0 && tok[1][k] == '0' && tlen[1] > 1))
            return bad(why, cap, line, "the dim is not a number nor \"replicated\"");
        dim = dim * 10 + (tok[1][k] - '0');
        if (dim > SLUICE_PART_MAX_DIM)
            return bad(why, cap, line, "the dim is past 7");
    }
    r->dim = dim;
    return 0;
}

SLUICE_API int sluice_part_rules_parse(const char *text, size_t len, sluice_part_rules **out,
                                       char *why, size_t why_cap)
{
    if (why && why_cap)
        why[0] = '\0';
    if (!out)
        return bad(why, why_cap, 0, "out is NULL");
    *out = NULL;
    if (!text) {
        text = builtin;
        len = sizeof builtin - 1;
    }
    size_t lines = 1; /* pieces between newlines: the last may be empty */
    for (size_t k = 0; k < len; k++)
        lines += text[k] == '\n';
    /* a text's last newline ends its last line and begins none */
    if (lines - (len && text[len - 1] == '\n') > RULES_MAX)
        return bad(why, why_cap, RULES_MAX + 1, "more than 1024 lines");
    sluice_part_rules *r = malloc(sizeof *r + lines * sizeof r->r[0]);
    if (!r) {
        if (why && why_cap)
            snprintf(why, why_cap, "rules: out of memory");
        return SLUICE_E_NOMEM;
    }
    r->n = 0;
    size_t line = 0, p = 0;
    while (p <= len) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len;
        line++;
        if (memchr(text + p, '\0', e - p)) {
            free(r);
            return bad(why, why_cap, line, "a NUL byte");
        }
        int rc = parse_line(text + p, e - p, line, &r->r[r->n], why, why_cap);
        if (rc < 0) {
            free(r);
            return rc;
        }
        if (rc == 0)
            r->n++;
        p = e + 1;
    }
    *out = r;
    return SLUICE_OK;
}

/* The first rule matching name, or NULL. */
static const rule *match(const sluice_part_rules *r, const char *name)
{
    for (size_t k = 0; k < r->n; k++)
        if (fnmatch(r->r[k].pattern, name, 0) == 0)
            return &r->r[k];
    return NULL;
}

SLUICE_API int sluice_part_rules_dim(const sluice_part_rules *r, const char *name, uint32_t ndim,
                                     int *dim)
{
    if (!r || !name || !dim)
        return SLUICE_E_INVAL;
    const rule *hit = match(r, name);
    size_t len = strlen(name);
    int follows = 0;
    if (!hit && len > 5 && strcmp(name + len - 5, ".bias") == 0 && len < 1024) {
        char weight[1024 + 2];
        memcpy(weight, name, len - 5);
        memcpy(weight + len - 5, ".weight", 8);
        hit = match(r, weight);
        follows = 1;
    }
    *dim = hit ? hit->dim : SLUICE_PART_REPLICATED;
    if (*dim != SLUICE_PART_REPLICATED && (uint32_t)*dim >= ndim) {
        if (follows || ndim == 0) {
            *dim = SLUICE_PART_REPLICATED;
            return SLUICE_OK;
        }
        return SLUICE_E_INVAL;
    }
    return SLUICE_OK;
}

SLUICE_API void sluice_part_rules_free(sluice_part_rules *r)
{
    free(r);
}
