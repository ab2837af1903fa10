/* model/arch: the architecture table, hyper-parameters and weight binding. See arch.h. */
#include "model/arch.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arch_desc {
    const char *name;  /* general.architecture */
    dsp_arch_id id;
    bool rope_neox, qkv_bias, qk_norm;
} arch_desc;

/* Open table: a new llama-like family is one line here (plus its tensors in bind_layer). */
static const arch_desc g_archs[] = {
    {"llama", DSP_ARCH_LLAMA, false, false, false},
    {"mistral", DSP_ARCH_LLAMA, false, false, false},
    {"qwen2", DSP_ARCH_QWEN2, true, true, false},
    {"qwen3", DSP_ARCH_QWEN3, true, false, true},
};

/* Every dimension the model uses (a hyper-parameter or a product of two) is at most this: the int
 * fields and the index arithmetic built on them then never wrap. Real models are far below it. */
#define MAX_DIM (1 << 24)

static dsp_status need_u32(const dsp_gguf *g, const char *arch, const char *suffix, int *out, bool required, int dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    dsp_status st = dsp_gguf_get_u32(g, key, &v);
    if (st == DSP_ERR_NOT_FOUND) {
        if (required) return dsp_error(DSP_ERR_FORMAT, "metadata key '%s' is missing", key);
        *out = dflt;
        return DSP_OK;
    }
    if (st) return st;
    if (v == 0 || v > MAX_DIM) return dsp_error(DSP_ERR_FORMAT, "metadata key '%s' = %u is out of range", key, v);
    *out = (int)v;
    return DSP_OK;
}

static dsp_status opt_f32(const dsp_gguf *g, const char *arch, const char *suffix, float *out, float dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    dsp_status st = dsp_gguf_get_f32(g, key, out);
    if (st == DSP_ERR_NOT_FOUND) {
        *out = dflt;
        return DSP_OK;
    }
    return st;
}

dsp_status dsp_arch_load_hparams(const dsp_gguf *g, dsp_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    dsp_str a;
    dsp_status st = dsp_gguf_get_str(g, "general.architecture", &a);
    if (st == DSP_ERR_NOT_FOUND) return dsp_error(DSP_ERR_FORMAT, "metadata key 'general.architecture' is missing");
    if (st) return st;
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 63 ? a.len : 63), a.ptr);
    const arch_desc *d = NULL;
    for (size_t i = 0; i < sizeof g_archs / sizeof g_archs[0]; i++)
        if (dsp_str_eq(a, g_archs[i].name)) d = &g_archs[i];
    if (!d) return dsp_error(DSP_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: llama, mistral, qwen2, qwen3)", arch);
    hp->arch = d->id;
    hp->rope_neox = d->rope_neox;
    hp->qkv_bias = d->qkv_bias;
    hp->qk_norm = d->qk_norm;
    if ((st = need_u32(g, arch, "embedding_length", &hp->n_embd, true, 0)) || (st = need_u32(g, arch, "block_count", &hp->n_layer, true, 0)) ||
        (st = need_u32(g, arch, "attention.head_count", &hp->n_head, true, 0)) ||
        (st = need_u32(g, arch, "attention.head_count_kv", &hp->n_head_kv, false, hp->n_head)) ||
        (st = need_u32(g, arch, "feed_forward_length", &hp->n_ff, true, 0)) ||
        (st = need_u32(g, arch, "context_length", &hp->n_ctx_train, false, 2048)))
        return st;
    if (hp->n_head % hp->n_head_kv)
        return dsp_error(DSP_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", arch, hp->n_head, hp->n_head_kv);
    int hd_default = hp->n_embd / hp->n_head;
    if ((st = need_u32(g, arch, "attention.key_length", &hp->head_dim, false, hd_default))) return st;
    if (hp->head_dim == 0)
        return dsp_error(DSP_ERR_FORMAT, "%s: head size is 0 (embedding_length %d < head_count %d and no attention.key_length)", arch,
                         hp->n_embd, hp->n_head);
    /* the attention widths, in 64 bits: each factor may be up to MAX_DIM */
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    if (q_dim > MAX_DIM || kv_dim > MAX_DIM)
        return dsp_error(DSP_ERR_FORMAT, "%s: head_count %d (kv %d) x head size %d = %" PRId64 " is larger than %d", arch, hp->n_head,
                         hp->n_head_kv, hp->head_dim, q_dim, MAX_DIM);
    hp->q_dim = (int)q_dim;
    hp->kv_dim = (int)kv_dim;
    int vlen = 0;
    if ((st = need_u32(g, arch, "attention.value_length", &vlen, false, hp->head_dim))) return st;
    if (vlen != hp->head_dim) return dsp_error(DSP_ERR_UNSUPPORTED, "%s: key_length %d != value_length %d", arch, hp->head_dim, vlen);
    if ((st = need_u32(g, arch, "rope.dimension_count", &hp->rope_dim, false, hp->head_dim))) return st;
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return dsp_error(DSP_ERR_FORMAT, "%s: rope.dimension_count %d invalid for head size %d", arch, hp->rope_dim, hp->head_dim);
    if ((st = opt_f32(g, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 1e-5f)) ||
        (st = opt_f32(g, arch, "rope.freq_base", &hp->rope_base, 10000.0f)))
        return st;
    /* linear scaling: rope.scaling.type = "linear" with rope.scaling.factor (older files: rope.scale_linear) */
    hp->rope_scale = 1.0f;
    hp->rope_attn_factor = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    dsp_str stype;
    if (dsp_gguf_get_str(g, key, &stype) == DSP_OK) {
        if (dsp_str_eq(stype, "linear")) {
            if ((st = opt_f32(g, arch, "rope.scaling.factor", &hp->rope_scale, 1.0f))) return st;
        } else if (!dsp_str_eq(stype, "none") && !dsp_str_eq(stype, "llama3")) {
            /* llama3 scaling is carried by the rope_freqs tensor; yarn etc. are not implemented */
            return dsp_error(DSP_ERR_UNSUPPORTED, "%s: rope scaling type '%.*s' is not supported", arch, (int)(stype.len > 40 ? 40 : stype.len),
                             stype.ptr);
        }
    } else if ((st = opt_f32(g, arch, "rope.scale_linear", &hp->rope_scale, 1.0f))) {
        return st;
    }
    if (!(hp->rope_scale > 0)) return dsp_error(DSP_ERR_FORMAT, "%s: rope scaling factor %g is invalid", arch, hp->rope_scale);
    if (!(hp->rms_eps > 0) || !(hp->rope_base > 0))
        return dsp_error(DSP_ERR_FORMAT, "%s: invalid rms epsilon (%g) or rope base (%g)", arch, hp->rms_eps, hp->rope_base);
    /* the vocabulary: the tokenizer's, else the embedding's rows (binding checks they agree) */
    const dsp_gguf_kv *toks;
    uint64_t n_vocab;
    st = dsp_gguf_get_arr(g, "tokenizer.ggml.tokens", DSP_GGUF_STRING, &toks);
    if (st == DSP_OK) {
        n_vocab = toks->arr_n;
    } else if (st == DSP_ERR_NOT_FOUND) {
        const dsp_tensor *emb = dsp_gguf_find_tensor(g, "token_embd.weight");
        if (!emb) return dsp_error(DSP_ERR_FORMAT, "tensor 'token_embd.weight' is missing");
        n_vocab = emb->ne[1];
    } else {
        return st;
    }
    if (n_vocab == 0 || n_vocab > INT32_MAX) return dsp_error(DSP_ERR_FORMAT, "vocabulary of %" PRIu64 " tokens is out of range", n_vocab);
    hp->n_vocab = (int)n_vocab;
    return DSP_OK;
}

/* Find a tensor and check its shape: n_dims dims (ne0, ne1). ne1 <= 0 means a vector. */
static dsp_status bind(const dsp_gguf *g, const char *name, int64_t ne0, int64_t ne1, bool optional, const dsp_tensor **out) {
    const dsp_tensor *t = dsp_gguf_find_tensor(g, name);
    *out = t;
    if (!t) return optional ? DSP_OK : dsp_error(DSP_ERR_FORMAT, "tensor '%s' is missing", name);
    int64_t want1 = ne1 > 0 ? ne1 : 1;
    if ((int64_t)t->ne[0] != ne0 || (int64_t)t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%s' has shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 "], expected [%" PRId64 ", %" PRId64 "]",
                         name, t->ne[0], t->ne[1], t->ne[2], ne0, want1);
    const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
    if (!tr->can_dequant) return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%s' has type %s, which is not supported yet", name, tr->name);
    if (ne1 <= 0 && t->type != DSP_F32)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%s': norm/bias vectors must be F32 (got %s)", name, tr->name);
    return DSP_OK;
}

dsp_status dsp_arch_bind_weights(const dsp_gguf *g, const dsp_hparams *hp, dsp_weights *w) {
    memset(w, 0, sizeof *w);
    dsp_status st;
    /* each layer has at least 9 tensors: bound the layer count before sizing anything by it */
    uint64_t n_tensors = dsp_gguf_n_tensors(g);
    if ((uint64_t)hp->n_layer > n_tensors / 9)
        return dsp_error(DSP_ERR_FORMAT, "block_count %d needs at least %" PRIu64 " tensors, the file has %" PRIu64, hp->n_layer,
                         (uint64_t)hp->n_layer * 9, n_tensors);
    if ((st = bind(g, "token_embd.weight", hp->n_embd, hp->n_vocab, false, &w->tok_embd)) ||
        (st = bind(g, "output_norm.weight", hp->n_embd, 0, false, &w->out_norm)) ||
        (st = bind(g, "output.weight", hp->n_embd, hp->n_vocab, true, &w->output)) ||
        (st = bind(g, "rope_freqs.weight", hp->rope_dim / 2, 0, true, &w->rope_freqs)))
        return st;
    if (!w->output) w->output = w->tok_embd; /* tied embeddings */
    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers) return dsp_error(DSP_ERR_NOMEM, "no memory");
    const int q_dim = hp->q_dim, kv_dim = hp->kv_dim;
    for (int l = 0; l < hp->n_layer; l++) {
        dsp_layer_weights *L = &w->layers[l];
        char n[96];
#define B(field, suffix, ne0, ne1, opt)                                   \
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                        \
    if ((st = bind(g, n, ne0, ne1, opt, &L->field))) goto fail;
        B(attn_norm, "attn_norm.weight", hp->n_embd, 0, false);
        B(wq, "attn_q.weight", hp->n_embd, q_dim, false);
        B(wk, "attn_k.weight", hp->n_embd, kv_dim, false);
        B(wv, "attn_v.weight", hp->n_embd, kv_dim, false);
        B(wo, "attn_output.weight", q_dim, hp->n_embd, false);
        B(ffn_norm, "ffn_norm.weight", hp->n_embd, 0, false);
        B(ffn_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff, false);
        B(ffn_up, "ffn_up.weight", hp->n_embd, hp->n_ff, false);
        B(ffn_down, "ffn_down.weight", hp->n_ff, hp->n_embd, false);
        if (hp->qkv_bias) {
            B(bq, "attn_q.bias", q_dim, 0, false);
            B(bk, "attn_k.bias", kv_dim, 0, false);
            B(bv, "attn_v.bias", kv_dim, 0, false);
        }
        if (hp->qk_norm) {
            B(q_norm, "attn_q_norm.weight", hp->head_dim, 0, false);
            B(k_norm, "attn_k_norm.weight", hp->head_dim, 0, false);
        }
#undef B
    }
    return DSP_OK;
fail:
    dsp_arch_free_weights(w);
    return st;
}

void dsp_arch_free_weights(dsp_weights *w) {
    free(w->layers);
    w->layers = NULL;
}
