/* presets.h: the architectures `sluice synth` can imitate (presets.c).
 *
 * A preset is a decoder-only transformer described by the few numbers of
 * its Hugging Face config.json; sl_preset_tensors() expands it into the
 * tensor names and shapes the Hugging Face checkpoint of that architecture
 * holds, in state-dict order (embedding, layers in order, final norm,
 * lm_head when the embedding is not tied).
 */
#ifndef SLUICE_TOOLS_PRESETS_H
#define SLUICE_TOOLS_PRESETS_H

#include <stddef.h>
#include <stdint.h>

typedef struct sl_preset {
    const char *name;           /* "llama-3.2-1b" */
    const char *summary;        /* one line for --list */
    uint64_t vocab;             /* vocab_size */
    uint64_t hidden;            /* hidden_size */
    uint64_t layers;            /* num_hidden_layers */
    uint64_t intermediate;      /* intermediate_size */
    uint64_t heads;             /* num_attention_heads */
    uint64_t kv_heads;          /* num_key_value_heads */
    uint64_t head_dim;          /* hidden / heads unless the config says otherwise */
    int tied;                   /* tie_word_embeddings: no lm_head.weight */
    int qkv_bias;               /* Qwen2: q/k/v projections carry a bias */
    unsigned default_shards;    /* shards written when --shards is not given */
} sl_preset;

/* One tensor of an expanded preset: a name and a shape (1 or 2 dims). */
typedef struct sl_preset_tensor {
    char name[96];
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t elements;
} sl_preset_tensor;

/* The presets, in --list order. */
size_t sl_preset_count(void);
const sl_preset *sl_preset_at(size_t i);
/* The preset named name, or NULL. */
const sl_preset *sl_preset_find(const char *name);

/* Expands p into its tensors, in state-dict order. With out NULL only
 * counts. Returns the number of tensors. */
size_t sl_preset_tensors(const sl_preset *p, sl_preset_tensor *out);

/* Sum of the elements of every tensor of p. */
uint64_t sl_preset_elements(const sl_preset *p);

#endif
