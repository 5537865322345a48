/* presets.c: architecture tables for `sluice synth` (see presets.h).
 *
 * The numbers are those of each model's config.json on the Hugging Face
 * Hub; the tensor count and size in BF16 are in the comments so that a
 * change shows. tiny is made for tests: a few hundred KB, untied lm_head.
 */
#include "presets.h"

#include <stdio.h>
#include <string.h>

static const sl_preset presets[] = {
    /* 39 tensors, 624 KB in BF16 */
    {"tiny", "test model: llama layout, 4 layers, hidden 64, untied lm_head",
     512, 64, 4, 256, 4, 2, 16, 0, 0, 2},
    /* 50 tensors, 559 KB in BF16 */
    {"tiny-qwen2", "test model: qwen2 layout (q/k/v biases), 4 layers, hidden 64",
     512, 64, 4, 256, 4, 2, 16, 1, 1, 2},
    /* 290 tensors, 988 MB in BF16 */
    {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B: 24 layers, hidden 896, tied",
     151936, 896, 24, 4864, 14, 2, 64, 1, 1, 1},
    /* 338 tensors, 3.09 GB in BF16 */
    {"qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B: 28 layers, hidden 1536, tied",
     151936, 1536, 28, 8960, 12, 2, 128, 1, 1, 1},
    /* 146 tensors, 2.47 GB in BF16 */
    {"llama-3.2-1b", "meta-llama/Llama-3.2-1B: 16 layers, hidden 2048, tied",
     128256, 2048, 16, 8192, 32, 8, 64, 1, 0, 2},
    /* 254 tensors, 6.43 GB in BF16 */
    {"llama-3.2-3b", "meta-llama/Llama-3.2-3B: 28 layers, hidden 3072, tied",
     128256, 3072, 28, 8192, 24, 8, 128, 1, 0, 2},
    /* 20 tensors, 1.32 GB in BF16, of which the embedding is 1 GiB: one
     * tensor that a single hashing thread takes about a second over
     * (what chunk digests spread over every core) */
    {"big-embed", "a 1 GiB embedding (vocab 262144 x hidden 2048) and 2 llama layers, tied",
     262144, 2048, 2, 8192, 32, 8, 64, 1, 0, 1},
    /* 291 tensors, 16.06 GB in BF16 */
    {"llama-3.1-8b", "meta-llama/Llama-3.1-8B: 32 layers, hidden 4096, untied",
     128256, 4096, 32, 14336, 32, 8, 128, 0, 0, 4},
};

size_t sl_preset_count(void)
{
    return sizeof presets / sizeof presets[0];
}

const sl_preset *sl_preset_at(size_t i)
{
    return i < sl_preset_count() ? &presets[i] : NULL;
}

const sl_preset *sl_preset_find(const char *name)
{
    for (size_t i = 0; i < sl_preset_count(); i++)
        if (!strcmp(presets[i].name, name))
            return &presets[i];
    return NULL;
}

/* Appends one tensor: "model.layers.<layer>.<name>", or name alone when
 * layer is negative; d1 == 0 makes it one-dimensional. */
static void add(sl_preset_tensor *out, size_t *n, uint64_t d0, uint64_t d1, long long layer,
                const char *name)
{
    if (out) {
        sl_preset_tensor *t = &out[*n];
        if (layer < 0)
            snprintf(t->name, sizeof t->name, "%s", name);
        else
            snprintf(t->name, sizeof t->name, "model.layers.%lld.%s", layer, name);
        t->ndim = d1 ? 2 : 1;
        t->shape[0] = d0;
        t->shape[1] = d1;
        t->elements = d1 ? d0 * d1 : d0;
    }
    (*n)++;
}

size_t sl_preset_tensors(const sl_preset *p, sl_preset_tensor *out)
{
    size_t n = 0;
    uint64_t q = p->heads * p->head_dim, kv = p->kv_heads * p->head_dim;
    add(out, &n, p->vocab, p->hidden, -1, "model.embed_tokens.weight");
    for (uint64_t l = 0; l < p->layers; l++) {
        long long L = (long long)l;
        add(out, &n, q, p->hidden, L, "self_attn.q_proj.weight");
        if (p->qkv_bias)
            add(out, &n, q, 0, L, "self_attn.q_proj.bias");
        add(out, &n, kv, p->hidden, L, "self_attn.k_proj.weight");
        if (p->qkv_bias)
            add(out, &n, kv, 0, L, "self_attn.k_proj.bias");
        add(out, &n, kv, p->hidden, L, "self_attn.v_proj.weight");
        if (p->qkv_bias)
            add(out, &n, kv, 0, L, "self_attn.v_proj.bias");
        add(out, &n, p->hidden, q, L, "self_attn.o_proj.weight");
        add(out, &n, p->intermediate, p->hidden, L, "mlp.gate_proj.weight");
        add(out, &n, p->intermediate, p->hidden, L, "mlp.up_proj.weight");
        add(out, &n, p->hidden, p->intermediate, L, "mlp.down_proj.weight");
        add(out, &n, p->hidden, 0, L, "input_layernorm.weight");
        add(out, &n, p->hidden, 0, L, "post_attention_layernorm.weight");
    }
    add(out, &n, p->hidden, 0, -1, "model.norm.weight");
    if (!p->tied)
        add(out, &n, p->vocab, p->hidden, -1, "lm_head.weight");
    return n;
}

uint64_t sl_preset_elements(const sl_preset *p)
{
    uint64_t q = p->heads * p->head_dim, kv = p->kv_heads * p->head_dim, h = p->hidden;
    uint64_t layer = q * h + kv * h * 2 + h * q + 3 * p->intermediate * h + 2 * h;
    if (p->qkv_bias)
        layer += q + 2 * kv;
    return p->vocab * h * (p->tied ? 1 : 2) + p->layers * layer + h;
}
