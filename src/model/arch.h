/* model/arch: architectures read from GGUF metadata, their hyper-parameters and weights.
 *
 * The architecture table (arch.c) maps general.architecture to a family description; every
 * family so far is a pre-norm decoder (llama, qwen2, qwen3) that differs in flags (QKV bias,
 * per-head q/k norm, RoPE layout). Weights are GGUF tensors pointed into the mapping, never
 * copied. GGUF shapes are (ne0 = input features, ne1 = output features): a weight row is one
 * output feature, stored contiguously. */
#ifndef DSP_MODEL_ARCH_H
#define DSP_MODEL_ARCH_H

#include "io/gguf.h"

#include <stdbool.h>

typedef enum dsp_arch_id { DSP_ARCH_LLAMA, DSP_ARCH_QWEN2, DSP_ARCH_QWEN3 } dsp_arch_id;

typedef struct dsp_hparams {
    dsp_arch_id arch;
    int n_vocab;
    int n_embd;        /* model width */
    int n_layer;
    int n_head, n_head_kv;
    int head_dim;      /* key/value head size */
    int q_dim, kv_dim; /* n_head * head_dim, n_head_kv * head_dim (products checked at load) */
    int n_ff;
    int n_ctx_train;
    float rms_eps;
    float rope_base;
    float rope_scale;  /* linear position scaling (positions are divided by it); 1 = none */
    float rope_attn_factor; /* cos/sin are multiplied by it (yarn's attention factor); 1 = none */
    int rope_dim;      /* rotated dimensions per head (<= head_dim) */
    bool rope_neox;    /* rotate pairs (i, i+d/2) instead of (2i, 2i+1) */
    bool qkv_bias;     /* qwen2 */
    bool qk_norm;      /* qwen3: per-head RMSNorm of q and k before RoPE */
} dsp_hparams;

typedef struct dsp_layer_weights {
    const dsp_tensor *attn_norm;       /* (n_embd) f32 */
    const dsp_tensor *wq;              /* (n_embd -> n_head*head_dim) */
    const dsp_tensor *wk, *wv;         /* (n_embd -> n_head_kv*head_dim) */
    const dsp_tensor *wo;              /* (n_head*head_dim -> n_embd) */
    const dsp_tensor *bq, *bk, *bv;    /* qkv_bias only: (q_dim), (kv_dim), (kv_dim) */
    const dsp_tensor *q_norm, *k_norm; /* qk_norm only: (head_dim) */
    const dsp_tensor *ffn_norm;        /* (n_embd) */
    const dsp_tensor *ffn_gate, *ffn_up; /* (n_embd -> n_ff) */
    const dsp_tensor *ffn_down;        /* (n_ff -> n_embd) */
} dsp_layer_weights;

typedef struct dsp_weights {
    const dsp_tensor *tok_embd;   /* (n_embd, n_vocab): row t is token t's embedding */
    const dsp_tensor *out_norm;   /* (n_embd) */
    const dsp_tensor *output;     /* (n_embd -> n_vocab); tok_embd when tied */
    const dsp_tensor *rope_freqs; /* optional (rope_dim/2): per-pair frequency divisors (llama3) */
    dsp_layer_weights *layers;         /* (n_layer) */
} dsp_weights;

/* Read hyper-parameters for the file's architecture; DSP_ERR_UNSUPPORTED names an unknown one.
 * Every dimension (and the products n_head * head_dim, n_head_kv * head_dim) is 1..2^24, so int
 * arithmetic on them and on a few of them multiplied in size_t cannot wrap; binding then checks
 * each one against the shape of a tensor the file really holds. */
dsp_status dsp_arch_load_hparams(const dsp_gguf *g, dsp_hparams *hp);
/* Bind and shape-check every weight tensor. w->layers is malloc'd (free with dsp_arch_free_weights). */
dsp_status dsp_arch_bind_weights(const dsp_gguf *g, const dsp_hparams *hp, dsp_weights *w);
void dsp_arch_free_weights(dsp_weights *w);

#endif
