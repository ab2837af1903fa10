/* model/hf: loading a Hugging Face model directory.
 *
 *   config.json             architecture (model_type llama, mistral, qwen2, qwen3) and
 *                           hyper-parameters; RoPE from rope_theta + rope_scaling (transformers
 *                           <= 4) or rope_parameters (transformers 5, DeepSpec-style configs)
 *   *.safetensors (+ index) weights, mmapped (io/safetensors)
 *   tokenizer.json          the tokenizer (tok/tok_hf.c), with tokenizer_config.json's bos/eos,
 *                           add_bos_token and chat_template; chat_template.jinja wins over the latter
 *   generation_config.json  eos ids (joined to the end-of-generation set) and sampling defaults
 *
 * Weights are bound by their checkpoint names and used in place, with three exceptions the model
 * owns (dsp_model_own_tensor): norm and bias vectors are widened to F32 (the forward pass reads
 * them as float); llama/mistral Q and K rows are permuted from HF's rotate-half order into the
 * interleaved-pair order GGUF files use, so that a directory and the GGUF made from it run the
 * same arithmetic and give bit-identical logits (qwen2/qwen3 are rotate-half in both, untouched);
 * and llama3/yarn RoPE scaling becomes a per-frequency divisor vector (as GGUF's rope_freqs). */
#include "model/model.h"

#include "core/file.h"
#include "core/log.h"
#include "core/quant.h"
#include "io/json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PI 3.14159265358979323846
#define MAX_CONFIG_BYTES (16u << 20)
#define MAX_TOKENIZER_BYTES (512u << 20)

/* ---- config.json ----------------------------------------------------------------------------- */

typedef struct hf_rope {
    char type[32];        /* "default", "linear", "llama3", "yarn" */
    double theta, factor, low_freq_factor, high_freq_factor, beta_fast, beta_slow, attention_factor;
    double orig_max_pos;
    bool truncate, has_attention_factor;
} hf_rope;

static dsp_status cfg_int(const json_t *c, const char *key, int64_t lo, int64_t hi, bool required, int64_t dflt, int *out) {
    int64_t v = dflt;
    dsp_status st = dsp_json_int(c, key, lo, hi, &v);
    if (st == DSP_ERR_NOT_FOUND) {
        if (required) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is missing", key);
        v = dflt;
    } else if (st) {
        return st;
    }
    *out = (int)v;
    return DSP_OK;
}

static dsp_status cfg_num(const json_t *c, const char *key, double dflt, double *out) {
    dsp_status st = dsp_json_num(c, key, out);
    if (st == DSP_ERR_NOT_FOUND) *out = dflt, st = DSP_OK;
    return st;
}

/* RoPE parameters from either form: rope_parameters {rope_theta, rope_type, ...} or rope_theta +
 * rope_scaling {rope_type | type, ...}. */
static dsp_status read_rope(const json_t *c, hf_rope *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->type, sizeof r->type, "default");
    const json_t *rp = dsp_json_at(c, "rope_parameters");
    const json_t *rs = dsp_json_at(c, "rope_scaling");
    if (rp && !json_is_null(rp) && !json_is_object(rp)) return dsp_error(DSP_ERR_FORMAT, "\"rope_parameters\" is not an object");
    if (rs && !json_is_null(rs) && !json_is_object(rs)) return dsp_error(DSP_ERR_FORMAT, "\"rope_scaling\" is not an object");
    const json_t *p = json_is_object(rp) ? rp : json_is_object(rs) ? rs : NULL;
    const char *where = p == rp ? "rope_parameters" : "rope_scaling";
    dsp_status st;
    r->theta = 10000.0;
    if ((st = cfg_num(c, "rope_theta", 10000.0, &r->theta))) return st;
    if (p && (st = cfg_num(p, "rope_theta", r->theta, &r->theta))) return dsp_error_prefix("%s", where), st;
    if (p) {
        const char *type = NULL;
        if ((st = dsp_json_str(p, "rope_type", &type)) == DSP_ERR_NOT_FOUND) st = dsp_json_str(p, "type", &type);
        if (st && st != DSP_ERR_NOT_FOUND) return dsp_error_prefix("%s", where), st;
        if (type) snprintf(r->type, sizeof r->type, "%s", type);
        double omp = 0;
        bool trunc = true;
        if ((st = cfg_num(p, "factor", 1.0, &r->factor)) || (st = cfg_num(p, "low_freq_factor", 1.0, &r->low_freq_factor)) ||
            (st = cfg_num(p, "high_freq_factor", 4.0, &r->high_freq_factor)) || (st = cfg_num(p, "beta_fast", 32.0, &r->beta_fast)) ||
            (st = cfg_num(p, "beta_slow", 1.0, &r->beta_slow)) || (st = cfg_num(p, "original_max_position_embeddings", 0, &omp)) ||
            ((st = dsp_json_bool(p, "truncate", &trunc)) && st != DSP_ERR_NOT_FOUND))
            return dsp_error_prefix("%s", where), st;
        r->orig_max_pos = omp;
        r->truncate = trunc;
        r->has_attention_factor = dsp_json_num(p, "attention_factor", &r->attention_factor) == DSP_OK;
        if (dsp_json_at(p, "mscale") || dsp_json_at(p, "mscale_all_dim"))
            return dsp_error(DSP_ERR_UNSUPPORTED, "%s: mscale / mscale_all_dim are not supported", where);
    }
    if (!(r->theta > 0)) return dsp_error(DSP_ERR_FORMAT, "rope_theta %g is invalid", r->theta);
    return DSP_OK;
}

typedef struct arch_row {
    const char *model_type;
    dsp_arch_id id;
    bool qkv_bias_always, qk_norm, permute_qk;
} arch_row;

static const arch_row g_hf_archs[] = {
    {"llama", DSP_ARCH_LLAMA, false, false, true},
    {"mistral", DSP_ARCH_LLAMA, false, false, true},
    {"qwen2", DSP_ARCH_QWEN2, true, false, false},
    {"qwen3", DSP_ARCH_QWEN3, false, true, false},
};

static dsp_status read_hparams(dsp_model *m, const json_t *c, dsp_hparams *hp, hf_rope *rope, const arch_row **arch) {
    memset(hp, 0, sizeof *hp);
    const char *mt = NULL;
    dsp_status st = dsp_json_str(c, "model_type", &mt);
    if (st == DSP_ERR_NOT_FOUND) return dsp_error(DSP_ERR_FORMAT, "\"model_type\" is missing");
    if (st) return st;
    *arch = NULL;
    for (size_t i = 0; i < sizeof g_hf_archs / sizeof g_hf_archs[0]; i++)
        if (!strcmp(mt, g_hf_archs[i].model_type)) *arch = &g_hf_archs[i];
    if (!*arch) return dsp_error(DSP_ERR_UNSUPPORTED, "model_type '%.60s' is not supported (supported: llama, mistral, qwen2, qwen3)", mt);
    m->arch = strdup(mt);
    if (!m->arch) return dsp_error(DSP_ERR_NOMEM, "no memory");
    hp->arch = (*arch)->id;
    hp->qk_norm = (*arch)->qk_norm;
    const int64_t BIG = 1 << 24;
    if ((st = cfg_int(c, "vocab_size", 1, BIG, true, 0, &hp->n_vocab)) || (st = cfg_int(c, "hidden_size", 1, BIG, true, 0, &hp->n_embd)) ||
        (st = cfg_int(c, "num_hidden_layers", 1, 4096, true, 0, &hp->n_layer)) ||
        (st = cfg_int(c, "num_attention_heads", 1, 4096, true, 0, &hp->n_head)) ||
        (st = cfg_int(c, "num_key_value_heads", 1, 4096, false, hp->n_head, &hp->n_head_kv)) ||
        (st = cfg_int(c, "intermediate_size", 1, BIG, true, 0, &hp->n_ff)) ||
        (st = cfg_int(c, "max_position_embeddings", 1, BIG, false, 2048, &hp->n_ctx_train)))
        return st;
    if (hp->n_head % hp->n_head_kv)
        return dsp_error(DSP_ERR_FORMAT, "num_attention_heads %d is not a multiple of num_key_value_heads %d", hp->n_head, hp->n_head_kv);
    if ((st = cfg_int(c, "head_dim", 1, 65536, false, hp->n_embd / hp->n_head, &hp->head_dim))) return st;
    if (hp->head_dim < 2 || hp->head_dim % 2) return dsp_error(DSP_ERR_FORMAT, "head_dim %d must be even", hp->head_dim);
    /* the attention widths in 64 bits (each factor is bounded above); the tensors are checked against them */
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    if (q_dim > BIG || kv_dim > BIG)
        return dsp_error(DSP_ERR_FORMAT, "num_attention_heads %d x head_dim %d = %lld is larger than %lld", hp->n_head, hp->head_dim,
                         (long long)q_dim, (long long)BIG);
    hp->q_dim = (int)q_dim;
    hp->kv_dim = (int)kv_dim;
    hp->rope_dim = hp->head_dim;
    double eps;
    if ((st = cfg_num(c, "rms_norm_eps", 1e-6, &eps))) return st;
    if (!(eps > 0 && eps < 1)) return dsp_error(DSP_ERR_FORMAT, "rms_norm_eps %g is invalid", eps);
    hp->rms_eps = (float)eps;
    const char *act = NULL;
    if ((st = dsp_json_str(c, "hidden_act", &act)) && st != DSP_ERR_NOT_FOUND) return st;
    if (act && strcmp(act, "silu")) return dsp_error(DSP_ERR_UNSUPPORTED, "hidden_act '%.40s' is not supported (silu is)", act);
    bool b = false;
    if ((st = dsp_json_bool(c, "mlp_bias", &b)) && st != DSP_ERR_NOT_FOUND) return st;
    if (b) return dsp_error(DSP_ERR_UNSUPPORTED, "mlp_bias = true is not supported");
    b = false;
    if ((st = dsp_json_bool(c, "attention_bias", &b)) && st != DSP_ERR_NOT_FOUND) return st;
    hp->qkv_bias = (*arch)->qkv_bias_always || b;
    /* sliding-window attention is not implemented: never run past the window, so output stays exact */
    int sw = 0;
    bool use_sw = hp->arch == DSP_ARCH_LLAMA; /* mistral: a window is in force when sliding_window is set */
    if ((st = dsp_json_bool(c, "use_sliding_window", &use_sw)) && st != DSP_ERR_NOT_FOUND) return st;
    if ((st = cfg_int(c, "sliding_window", 1, INT32_MAX, false, 0, &sw))) return st;
    if (use_sw && sw > 0 && sw < hp->n_ctx_train) {
        DSP_LOGW("sliding_window %d: sliding-window attention is not implemented; the context is limited to %d tokens", sw, sw);
        hp->n_ctx_train = sw;
    }
    hp->rope_neox = !(*arch)->permute_qk; /* llama Q/K are permuted at bind: interleaved pairs, as GGUF */
    hp->rope_scale = 1.0f;
    hp->rope_attn_factor = 1.0f;
    if ((st = read_rope(c, rope))) return st;
    hp->rope_base = (float)rope->theta;
    if (!strcmp(rope->type, "linear")) {
        if (!(rope->factor > 0)) return dsp_error(DSP_ERR_FORMAT, "linear rope scaling factor %g is invalid", rope->factor);
        hp->rope_scale = (float)rope->factor;
    } else if (!strcmp(rope->type, "llama3") || !strcmp(rope->type, "yarn")) {
        if (!(rope->factor >= 1)) return dsp_error(DSP_ERR_FORMAT, "%s rope scaling factor %g is invalid", rope->type, rope->factor);
        if (rope->orig_max_pos == 0) rope->orig_max_pos = !strcmp(rope->type, "yarn") ? hp->n_ctx_train : 8192;
        if (!(rope->orig_max_pos >= 1)) return dsp_error(DSP_ERR_FORMAT, "original_max_position_embeddings %g is invalid", rope->orig_max_pos);
    } else if (strcmp(rope->type, "default")) {
        return dsp_error(DSP_ERR_UNSUPPORTED, "rope type '%s' is not supported (default, linear, llama3, yarn are)", rope->type);
    }
    return DSP_OK;
}

/* Per-frequency divisors of base^(-2i/d) (GGUF's rope_freqs) for llama3 and yarn; the yarn
 * attention factor goes to hp->rope_attn_factor. The llama3 rule is llama.cpp's converter's
 * (scalar double math, float32 result); yarn is transformers' _compute_yarn_parameters. */
static void rope_divisors(const hf_rope *r, dsp_hparams *hp, float *out) {
    int dim = hp->rope_dim, half = dim / 2;
    if (!strcmp(r->type, "llama3")) {
        double lo_wl = r->orig_max_pos / r->low_freq_factor, hi_wl = r->orig_max_pos / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            float p = (float)pow(r->theta, (double)(2 * i) / dim);
            double freq = (double)(float)(1.0 / (double)p), wl = 2 * PI / freq;
            if (wl < hi_wl) out[i] = 1.0f;
            else if (wl > lo_wl) out[i] = (float)r->factor;
            else {
                double smooth = (r->orig_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                out[i] = (float)(1.0 / ((1.0 - smooth) / r->factor + smooth));
            }
        }
        return;
    }
    /* yarn */
    double lo = dim * log(r->orig_max_pos / (r->beta_fast * 2 * PI)) / (2 * log(r->theta));
    double hi = dim * log(r->orig_max_pos / (r->beta_slow * 2 * PI)) / (2 * log(r->theta));
    if (r->truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        /* inv = inv_interp * ramp + inv_extrap * (1 - ramp) = base_inv * (ramp / factor + 1 - ramp) */
        out[i] = (float)(1.0 / (ramp / r->factor + (1.0 - ramp)));
    }
    hp->rope_attn_factor = r->has_attention_factor ? (float)r->attention_factor
                                                   : (r->factor <= 1 ? 1.0f : (float)(0.1 * log(r->factor) + 1.0));
}

/* ---- weights --------------------------------------------------------------------------------- */

/* the tensor, copied into a 64-byte aligned owned buffer when the mapping has it misaligned for
 * its element type (a writer may do that; the kernels load whole elements) */
static dsp_status st_get(dsp_model *m, const char *name, bool optional, const dsp_tensor **out) {
    *out = dsp_st_find(m->st, name);
    if (!*out) return optional ? DSP_OK : dsp_error(DSP_ERR_FORMAT, "tensor '%s' is missing", name);
    const dsp_tensor *t = *out;
    size_t el = dsp_dtype_get(t->type)->block_bytes;
    if ((uintptr_t)t->data % el) {
        dsp_tensor *c = dsp_model_own_tensor(m, t, name, t->type, (size_t)t->nbytes);
        if (!c) return DSP_ERR_NOMEM;
        memcpy((void *)c->data, t->data, (size_t)t->nbytes);
        *out = c;
    }
    return DSP_OK;
}

/* A norm or bias vector as F32 (owned when the file has it in another type). */
static dsp_status vec_f32(dsp_model *m, const char *name, int64_t n, bool optional, const dsp_tensor **out) {
    dsp_status st = st_get(m, name, optional, out);
    if (st || !*out) return st;
    const dsp_tensor *t = *out;
    if (t->n_dims != 1 || (int64_t)t->ne[0] != n)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%s' has %u dimensions [%" PRIu64 ", ...], expected a vector of %" PRId64, name, t->n_dims, t->ne[0], n);
    if (t->type == DSP_F32) return DSP_OK;
    if (t->type != DSP_F16 && t->type != DSP_BF16)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%s' has type %s (F32, F16, BF16 are supported)", name, dsp_dtype_name(t->type));
    dsp_tensor *c = dsp_model_own_tensor(m, t, name, DSP_F32, (size_t)n * sizeof(float));
    if (!c) return DSP_ERR_NOMEM;
    dsp_dequantize_row(t->type, t->data, (float *)c->data, (uint64_t)n);
    *out = c;
    return DSP_OK;
}

static dsp_status mat(dsp_model *m, const char *name, int64_t in, int64_t out_f, bool optional, const dsp_tensor **out) {
    dsp_status st = st_get(m, name, optional, out);
    if (st || !*out) return st;
    const dsp_tensor *t = *out;
    if (t->n_dims != 2 || (int64_t)t->ne[0] != in || (int64_t)t->ne[1] != out_f)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%s' has shape [%" PRIu64 ", %" PRIu64 "] (PyTorch order), expected [%" PRId64 ", %" PRId64 "]",
                         name, t->ne[1], t->ne[0], out_f, in);
    if (t->type != DSP_F32 && t->type != DSP_F16 && t->type != DSP_BF16)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%s' has type %s (F32, F16, BF16 are supported)", name, dsp_dtype_name(t->type));
    return DSP_OK;
}

/* HF rotate-half row order -> GGUF interleaved pairs, per head (llama.cpp's converter "permute"):
 * within a head of d rows, row r = 2i + j of the result is row i + j*d/2 of the source. `rows` of
 * `row_bytes` each; n_head heads. Works for matrices (row_bytes = a row) and bias vectors. */
static dsp_status permute_qk(dsp_model *m, const dsp_tensor **t, int n_head, size_t row_bytes) {
    const dsp_tensor *src = *t;
    uint64_t rows = src->nbytes / row_bytes;
    if (rows % (uint64_t)(2 * n_head)) return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': %" PRIu64 " rows do not split into %d heads of pairs", (int)src->name.len, src->name.ptr, rows, n_head);
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)(src->name.len < 95 ? src->name.len : 95), src->name.ptr);
    dsp_tensor *c = dsp_model_own_tensor(m, src, name, src->type, (size_t)src->nbytes);
    if (!c) return DSP_ERR_NOMEM;
    uint64_t d = rows / (uint64_t)n_head, h2 = d / 2;
    for (uint64_t h = 0; h < (uint64_t)n_head; h++)
        for (uint64_t i = 0; i < h2; i++)
            for (uint64_t j = 0; j < 2; j++)
                memcpy((uint8_t *)c->data + (h * d + 2 * i + j) * row_bytes, (const uint8_t *)src->data + (h * d + i + j * h2) * row_bytes, row_bytes);
    *t = c;
    return DSP_OK;
}

/* llama3/yarn RoPE scaling as a per-frequency divisor vector (an owned tensor) */
static dsp_status bind_rope_freqs(dsp_model *m, const hf_rope *rope) {
    dsp_hparams *hp = &m->hp;
    if (strcmp(rope->type, "llama3") && strcmp(rope->type, "yarn")) return DSP_OK;
    dsp_tensor like = {.n_dims = 1, .ne = {(uint64_t)hp->rope_dim / 2, 1, 1, 1}, .type = DSP_F32, .n_elems = (uint64_t)hp->rope_dim / 2};
    dsp_tensor *f = dsp_model_own_tensor(m, &like, "rope_freqs.weight", DSP_F32, (size_t)hp->rope_dim / 2 * sizeof(float));
    if (!f) return DSP_ERR_NOMEM;
    rope_divisors(rope, hp, (float *)f->data);
    m->w.rope_freqs = f;
    return DSP_OK;
}

/* The decoder layers `<prefix>layers.N.*` (prefix "model." for a model, "" for a drafter). */
static dsp_status bind_layers(dsp_model *m, const char *prefix, bool permute) {
    dsp_hparams *hp = &m->hp;
    dsp_weights *w = &m->w;
    dsp_status st;
    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers) return dsp_error(DSP_ERR_NOMEM, "no memory");
    int64_t E = hp->n_embd, q_dim = hp->q_dim, kv_dim = hp->kv_dim;
    for (int l = 0; l < hp->n_layer; l++) {
        dsp_layer_weights *L = &w->layers[l];
        char n[160];
#define NAME(suffix) (snprintf(n, sizeof n, "%slayers.%d.%s", prefix, l, suffix), n)
        const dsp_tensor *bo = NULL;
        if ((st = vec_f32(m, NAME("input_layernorm.weight"), E, false, &L->attn_norm)) ||
            (st = mat(m, NAME("self_attn.q_proj.weight"), E, q_dim, false, &L->wq)) ||
            (st = mat(m, NAME("self_attn.k_proj.weight"), E, kv_dim, false, &L->wk)) ||
            (st = mat(m, NAME("self_attn.v_proj.weight"), E, kv_dim, false, &L->wv)) ||
            (st = mat(m, NAME("self_attn.o_proj.weight"), q_dim, E, false, &L->wo)) ||
            (st = vec_f32(m, NAME("post_attention_layernorm.weight"), E, false, &L->ffn_norm)) ||
            (st = mat(m, NAME("mlp.gate_proj.weight"), E, hp->n_ff, false, &L->ffn_gate)) ||
            (st = mat(m, NAME("mlp.up_proj.weight"), E, hp->n_ff, false, &L->ffn_up)) ||
            (st = mat(m, NAME("mlp.down_proj.weight"), hp->n_ff, E, false, &L->ffn_down)) ||
            (st = st_get(m, NAME("self_attn.o_proj.bias"), true, &bo)))
            return st;
        if (bo) return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%s': an output-projection bias is not supported", n);
        if (hp->qkv_bias && ((st = vec_f32(m, NAME("self_attn.q_proj.bias"), q_dim, false, &L->bq)) ||
                             (st = vec_f32(m, NAME("self_attn.k_proj.bias"), kv_dim, false, &L->bk)) ||
                             (st = vec_f32(m, NAME("self_attn.v_proj.bias"), kv_dim, false, &L->bv))))
            return st;
        if (hp->qk_norm && ((st = vec_f32(m, NAME("self_attn.q_norm.weight"), hp->head_dim, false, &L->q_norm)) ||
                            (st = vec_f32(m, NAME("self_attn.k_norm.weight"), hp->head_dim, false, &L->k_norm))))
            return st;
#undef NAME
        if (permute) {
            if ((st = permute_qk(m, &L->wq, hp->n_head, dsp_dtype_row_bytes(L->wq->type, (uint64_t)E))) ||
                (st = permute_qk(m, &L->wk, hp->n_head_kv, dsp_dtype_row_bytes(L->wk->type, (uint64_t)E))))
                return st;
            if (L->bq && ((st = permute_qk(m, &L->bq, hp->n_head, sizeof(float))) || (st = permute_qk(m, &L->bk, hp->n_head_kv, sizeof(float)))))
                return st;
        }
    }
    return DSP_OK;
}

static dsp_status bind_weights(dsp_model *m, const arch_row *arch, const hf_rope *rope, bool tied) {
    dsp_hparams *hp = &m->hp;
    dsp_weights *w = &m->w;
    memset(w, 0, sizeof *w);
    dsp_status st;
    if ((st = dsp_model_own_reserve(m, 24 * hp->n_layer + 16))) return st;
    if ((st = mat(m, "model.embed_tokens.weight", hp->n_embd, hp->n_vocab, false, &w->tok_embd)) ||
        (st = vec_f32(m, "model.norm.weight", hp->n_embd, false, &w->out_norm)) ||
        (st = mat(m, "lm_head.weight", hp->n_embd, hp->n_vocab, tied, &w->output)))
        return st;
    if (tied || !w->output) {
        if (!tied) return dsp_error(DSP_ERR_FORMAT, "tensor 'lm_head.weight' is missing (tie_word_embeddings is false)");
        w->output = w->tok_embd;
    }
    if ((st = bind_rope_freqs(m, rope))) return st;
    return bind_layers(m, "model.", arch->permute_qk);
}

dsp_status dsp_hf_load_stack(dsp_model *m, const json_t *cfg, const char *prefix, int extra_own) {
    hf_rope rope;
    const arch_row *arch = NULL;
    dsp_status st = read_hparams(m, cfg, &m->hp, &rope, &arch);
    if (st) return st;
    /* the stack's own RoPE is rotate-half whatever the model type says (DFlash/DSpark layers) */
    m->hp.rope_neox = true;
    char probe[160];
    snprintf(probe, sizeof probe, "%slayers.0.self_attn.q_norm.weight", prefix);
    m->hp.qk_norm = arch->qk_norm || dsp_st_find(m->st, probe);
    memset(&m->w, 0, sizeof m->w);
    if ((st = dsp_model_own_reserve(m, 24 * m->hp.n_layer + 16 + extra_own)) || (st = bind_rope_freqs(m, &rope))) return st;
    return bind_layers(m, prefix, false);
}

dsp_status dsp_hf_vec(dsp_model *m, const char *name, int64_t n, bool optional, const dsp_tensor **out) {
    return vec_f32(m, name, n, optional, out);
}

dsp_status dsp_hf_mat(dsp_model *m, const char *name, int64_t in, int64_t out_f, bool optional, const dsp_tensor **out) {
    return mat(m, name, in, out_f, optional, out);
}

/* ---- tokenizer, templates, generation config ------------------------------------------------- */

static dsp_status load_opt_json(const char *dir, const char *name, size_t max, json_t **out) {
    *out = NULL;
    char *p = dsp_path_join(dir, name);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = dsp_file_exists(p) ? dsp_json_load_file(p, max, out) : DSP_OK;
    free(p);
    return st;
}

/* an id field that may be an integer or a list of them */
static void add_eog_ids(dsp_model *m, const json_t *v) {
    if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX)
        dsp_model_add_eog(m, (int32_t)json_integer_value(v));
    size_t i;
    json_t *x;
    if (json_is_array(v)) json_array_foreach(v, i, x) add_eog_ids(m, x);
}

static dsp_status load_chat_template(dsp_model *m, const char *dir, const json_t *tcfg) {
    char *p = dsp_path_join(dir, "chat_template.jinja");
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = DSP_OK;
    if (dsp_file_exists(p)) {
        size_t n;
        st = dsp_file_read(p, MAX_CONFIG_BYTES, &m->tmpl_own, &n);
        if (!st) {
            m->tmpl_src = m->tmpl_own, m->tmpl_len = n;
            snprintf(m->tmpl_origin, sizeof m->tmpl_origin, "chat_template.jinja");
        }
    } else if (tcfg) {
        const json_t *ct = json_object_get(tcfg, "chat_template");
        const char *src = NULL;
        if (json_is_string(ct)) {
            src = json_string_value(ct);
        } else if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: the "default" one, as transformers */
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *nm = json_string_value(json_object_get(e, "name"));
                const char *tp = json_string_value(json_object_get(e, "template"));
                if (!nm || !tp) {
                    st = dsp_error(DSP_ERR_FORMAT, "tokenizer_config.json: chat_template[%zu] needs string \"name\" and \"template\"", i);
                    break;
                }
                if (!strcmp(nm, "default")) src = tp;
            }
            if (!st && !src) DSP_LOGW("tokenizer_config.json: chat_template list has no \"default\" entry: no chat template");
        } else if (ct && !json_is_null(ct)) {
            st = dsp_error(DSP_ERR_FORMAT, "tokenizer_config.json: \"chat_template\" is neither a string nor a list");
        }
        if (src) {
            m->tmpl_own = strdup(src);
            if (!m->tmpl_own) st = dsp_error(DSP_ERR_NOMEM, "no memory");
            else {
                m->tmpl_src = m->tmpl_own, m->tmpl_len = strlen(src);
                snprintf(m->tmpl_origin, sizeof m->tmpl_origin, "tokenizer_config.json");
            }
        }
    }
    free(p);
    if (!st) dsp_model_parse_chat_template(m);
    return st;
}

static dsp_status load_gen_config(dsp_model *m, const char *dir, const json_t *cfg) {
    json_t *g;
    dsp_status st = load_opt_json(dir, "generation_config.json", MAX_CONFIG_BYTES, &g);
    if (st) return st;
    add_eog_ids(m, json_object_get(cfg, "eos_token_id"));
    if (!g) return DSP_OK;
    snprintf(m->gen_source, sizeof m->gen_source, "%s/generation_config.json", dir);
    add_eog_ids(m, json_object_get(g, "eos_token_id"));
    struct { const char *key; unsigned bit; float *dst; double lo, hi; } f[] = {
        {"temperature", DSP_GEN_HAS_TEMPERATURE, &m->gen.temperature, 0, 100},
        {"top_p", DSP_GEN_HAS_TOP_P, &m->gen.top_p, 0, 1},
        {"min_p", DSP_GEN_HAS_MIN_P, &m->gen.min_p, 0, 1},
        {"repetition_penalty", DSP_GEN_HAS_REPETITION_PENALTY, &m->gen.repetition_penalty, 1e-6, 100},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0] && !st; i++) {
        double v;
        st = dsp_json_num(g, f[i].key, &v);
        if (st == DSP_ERR_NOT_FOUND) {
            st = DSP_OK;
            continue;
        }
        if (!st && !(v >= f[i].lo && v <= f[i].hi)) st = dsp_error(DSP_ERR_FORMAT, "\"%s\" = %g is out of range [%g, %g]", f[i].key, v, f[i].lo, f[i].hi);
        if (!st) *f[i].dst = (float)v, m->gen.has |= f[i].bit;
    }
    int64_t k;
    if (!st && (st = dsp_json_int(g, "top_k", 0, INT32_MAX, &k)) == DSP_OK) m->gen.top_k = (int32_t)k, m->gen.has |= DSP_GEN_HAS_TOP_K;
    if (st == DSP_ERR_NOT_FOUND) st = DSP_OK;
    if (st) dsp_error_prefix("%s", m->gen_source);
    json_decref(g);
    return st;
}

/* ---- the directory --------------------------------------------------------------------------- */

static void fill_info(dsp_model *m) {
    dsp_model_info *in = &m->info;
    in->path = m->path;
    in->format = "safetensors";
    in->arch = m->arch;
    in->name = m->name;
    in->tok_model = m->tok_model;
    in->tok_pre = m->tok_pre;
    in->n_layers = (uint32_t)m->hp.n_layer;
    in->n_embd = (uint32_t)m->hp.n_embd;
    in->n_ff = (uint32_t)m->hp.n_ff;
    in->n_head = (uint32_t)m->hp.n_head;
    in->n_head_kv = (uint32_t)m->hp.n_head_kv;
    in->n_ctx_train = (uint32_t)m->hp.n_ctx_train;
    in->n_vocab = m->tok ? (uint32_t)dsp_tok_n_vocab(m->tok) : (uint32_t)m->hp.n_vocab;
    if (!m->st) return;
    in->n_files = (uint32_t)dsp_st_n_files(m->st);
    in->file_size = dsp_st_total_size(m->st);
    in->n_tensors = dsp_st_n_tensors(m->st);
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        const dsp_tensor *t = dsp_st_tensor_at(m->st, i);
        in->n_params += t->n_elems;
        in->type_bytes[t->type] += t->nbytes;
        in->type_count[t->type]++;
    }
}

dsp_status dsp_hf_load(dsp_model *m, const char *dir, const dsp_model_params *p) {
    json_t *cfg = NULL, *tj = NULL, *tcfg = NULL;
    char *cfg_path = dsp_path_join(dir, "config.json");
    if (!cfg_path) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st = dsp_json_load_file(cfg_path, MAX_CONFIG_BYTES, &cfg);
    hf_rope rope;
    const arch_row *arch = NULL;
    if (!st && (st = read_hparams(m, cfg, &m->hp, &rope, &arch))) dsp_error_prefix("%s", cfg_path);
    free(cfg_path);
    if (st) goto done;
    bool tied = false;
    if ((st = dsp_json_bool(cfg, "tie_word_embeddings", &tied)) && st != DSP_ERR_NOT_FOUND) {
        dsp_error_prefix("%s/config.json", dir);
        goto done;
    }
    const char *base = strrchr(dir, '/');
    const char *nm = NULL;
    dsp_json_str(cfg, "_name_or_path", &nm);
    m->name = strdup(nm && *nm ? nm : base && base[1] ? base + 1 : dir);
    if (!m->name) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory");
        goto done;
    }
    /* weights: required to run, optional for vocab-only use (info, tokenize) */
    st = dsp_st_open(dir, &m->st);
    if (st == DSP_ERR_NOT_FOUND && p->vocab_only) st = DSP_OK;
    if (st) goto done;
    if (!p->vocab_only) {
        if ((st = bind_weights(m, arch, &rope, tied))) {
            dsp_error_prefix("%s", dir);
            goto done;
        }
        m->has_weights = true;
    }
    /* tokenizer */
    if ((st = load_opt_json(dir, "tokenizer.json", MAX_TOKENIZER_BYTES, &tj)) ||
        (st = load_opt_json(dir, "tokenizer_config.json", MAX_CONFIG_BYTES, &tcfg)))
        goto done;
    char tk_model[64] = "", tk_pre[128] = "";
    if (tj) {
        if ((st = dsp_tok_create_from_hf(tj, tcfg, &m->tok, tk_model, sizeof tk_model, tk_pre, sizeof tk_pre))) {
            dsp_error_prefix("%s/tokenizer.json", dir);
            goto done;
        }
        if (m->hp.n_vocab && (int64_t)dsp_tok_n_vocab(m->tok) > m->hp.n_vocab)
            DSP_LOGW("%s: tokenizer has %zu tokens, more than the model's vocab_size %d", dir, dsp_tok_n_vocab(m->tok), m->hp.n_vocab);
        int32_t eos = dsp_tok_eos(m->tok);
        if (eos >= 0) dsp_model_add_eog(m, eos);
    }
    m->tok_model = strdup(tk_model);
    m->tok_pre = strdup(tk_pre);
    if (!m->tok_model || !m->tok_pre) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory");
        goto done;
    }
    if ((st = load_chat_template(m, dir, tcfg))) goto done;
    if ((st = load_gen_config(m, dir, cfg))) goto done;
    if (m->tok) dsp_model_add_named_eog(m);
    fill_info(m);
done:
    json_decref(cfg);
    json_decref(tj);
    json_decref(tcfg);
    return st;
}
