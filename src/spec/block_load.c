/* spec/block_load: reading a block drafter directory and checking it against its target (see
 * block.h for the layouts; DRAFTERS.md §1.3-1.4, §2.4-2.5 for the fields and tensors).
 *
 * The decoder stack is bound by model/hf.c (dsp_hf_load_stack: the same config reader and tensor
 * checks as a model directory, names `layers.N.*`); this file reads the drafter keys of either
 * layout, binds fc / hidden_norm / norm / embedding / LM head / Markov / confidence tensors, and
 * decides what the drafter shares with the target. */
#include "spec/block_internal.h"

#include "core/file.h"
#include "core/log.h"
#include "core/quant.h"
#include "io/hub.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIG_BYTES (16u << 20)

const dsp_block_info *dsp_block_get_info(const dsp_block_drafter *d) { return &d->info; }

/* An int array field (e.g. target_layer_ids); DSP_ERR_NOT_FOUND when absent. */
static dsp_status int_list(const json_t *root, const char *key, int *out, int cap, int *n) {
    const json_t *a = dsp_json_at(root, key);
    if (!a || json_is_null(a)) return DSP_ERR_NOT_FOUND;
    if (!json_is_array(a)) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is not a list", key);
    if (json_array_size(a) == 0 || json_array_size(a) > (size_t)cap)
        return dsp_error(DSP_ERR_FORMAT, "\"%s\" has %zu entries (1..%d are supported)", key, json_array_size(a), cap);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > 65535)
            return dsp_error(DSP_ERR_FORMAT, "\"%s\"[%zu] is not a layer index", key, i);
        out[i] = (int)json_integer_value(v);
    }
    *n = (int)json_array_size(a);
    return DSP_OK;
}

/* an optional int / bool field of either the top level or dflash_config (the latter wins) */
static dsp_status opt_int(const json_t *c, const json_t *dc, const char *key, int64_t lo, int64_t hi, int64_t *v) {
    dsp_status st = DSP_ERR_NOT_FOUND;
    if (dc) st = dsp_json_int(dc, key, lo, hi, v);
    if (st == DSP_ERR_NOT_FOUND) st = dsp_json_int(c, key, lo, hi, v);
    return st;
}
static dsp_status opt_bool(const json_t *c, const json_t *dc, const char *key, bool *v) {
    dsp_status st = DSP_ERR_NOT_FOUND;
    if (dc) st = dsp_json_bool(dc, key, v);
    if (st == DSP_ERR_NOT_FOUND) st = dsp_json_bool(c, key, v);
    return st;
}
static dsp_status opt_str(const json_t *c, const json_t *dc, const char *key, const char **v) {
    dsp_status st = DSP_ERR_NOT_FOUND;
    if (dc) st = dsp_json_str(dc, key, v);
    if (st == DSP_ERR_NOT_FOUND) st = dsp_json_str(c, key, v);
    return st;
}

/* The drafter keys (DRAFTERS.md §1.3, §2.4, §2.5 "alternative export naming"). */
static dsp_status read_config(dsp_block_drafter *d, const json_t *c, const dsp_model *target, int n_layers) {
    dsp_block_info *in = &d->info;
    const json_t *arch = json_array_get(dsp_json_at(c, "architectures"), 0);
    const char *a = json_is_string(arch) ? json_string_value(arch) : "";
    const json_t *dc = dsp_json_at(c, "dflash_config");
    if (dc && !json_is_null(dc) && !json_is_object(dc)) return dsp_error(DSP_ERR_FORMAT, "\"dflash_config\" is not an object");
    if (dc && !json_is_object(dc)) dc = NULL;
    if (!strcmp(a, "Qwen3DSparkModel")) {
        in->layout = DSP_BLOCK_DEEPSPEC;
    } else if (!strcmp(a, "DFlashDraftModel") || (!*a && dc)) {
        in->layout = DSP_BLOCK_ZLAB;
    } else if (!strcmp(a, "Gemma4DSparkModel")) {
        return dsp_error(DSP_ERR_UNSUPPORTED, "architecture Gemma4DSparkModel (a Gemma 4 drafter) is not supported; Qwen3-style drafters are");
    } else {
        return dsp_error(DSP_ERR_UNSUPPORTED,
                         "\"architectures\" is [\"%.60s\"]: not a block drafter (DFlashDraftModel or Qwen3DSparkModel are supported)", a);
    }
    dsp_status st;
    int64_t v;
    /* tap layers: target_layer_ids, or z-lab's default from num_target_layers */
    int nt_cfg = 0;
    if ((st = opt_int(c, dc, "num_target_layers", 1, 65536, &v)) == DSP_OK) nt_cfg = (int)v;
    else if (st != DSP_ERR_NOT_FOUND) return st;
    st = DSP_ERR_NOT_FOUND;
    if (dc) st = int_list(dc, "target_layer_ids", in->tap_layers, DSP_BLOCK_MAX_TAPS, &in->n_taps);
    if (st == DSP_ERR_NOT_FOUND) st = int_list(c, "target_layer_ids", in->tap_layers, DSP_BLOCK_MAX_TAPS, &in->n_taps);
    if (st == DSP_ERR_NOT_FOUND) {
        /* [ZL] build_target_layer_ids(num_target_layers, num_hidden_layers) */
        int nT = nt_cfg ? nt_cfg : target->hp.n_layer, nL = n_layers;
        if (nL > DSP_BLOCK_MAX_TAPS) return dsp_error(DSP_ERR_UNSUPPORTED, "%d default tap layers (one per drafter layer) is too many", nL);
        in->n_taps = nL;
        for (int i = 0; i < nL; i++)
            in->tap_layers[i] = nL == 1 ? nT / 2 : (int)rint(1.0 + (double)i * (double)(nT - 4) / (double)(nL - 1)); /* Python round(): half to even */
        st = DSP_OK;
    }
    if (st) return st;
    if ((st = opt_int(c, dc, "mask_token_id", INT32_MIN, INT32_MAX, &v)) == DSP_ERR_NOT_FOUND)
        return dsp_error(DSP_ERR_FORMAT, "\"mask_token_id\" is missing (top level or dflash_config)");
    if (st) return st;
    in->mask_token = (int32_t)v;
    if ((st = opt_int(c, dc, "block_size", 1, DSP_BLOCK_MAX, &v)) == DSP_ERR_NOT_FOUND)
        return dsp_error(DSP_ERR_FORMAT, "\"block_size\" is missing");
    if (st) return st;
    in->block = (int)v;
    /* DSpark heads and the slot convention */
    const char *proj = NULL, *mtype = NULL;
    if ((st = opt_str(c, dc, "projector_type", &proj)) && st != DSP_ERR_NOT_FOUND) return st;
    bool shift = in->layout == DSP_BLOCK_DEEPSPEC, b;
    if ((st = opt_bool(c, dc, "shift_label", &b)) == DSP_OK) shift = shift || b;
    else if (st != DSP_ERR_NOT_FOUND) return st;
    if ((st = opt_bool(c, dc, "sample_from_anchor", &b)) == DSP_OK) shift = shift || b;
    else if (st != DSP_ERR_NOT_FOUND) return st;
    if (proj && !strcmp(proj, "dspark")) {
        in->layout = DSP_BLOCK_MODELOPT;
        shift = true;
    } else if (proj && strcmp(proj, "dflash")) {
        return dsp_error(DSP_ERR_UNSUPPORTED, "projector_type '%.40s' is not supported (dflash, dspark are)", proj);
    }
    in->slot0 = shift ? 0 : 1;
    in->n_draft = in->block - in->slot0;
    if (in->n_draft < 1) return dsp_error(DSP_ERR_FORMAT, "block_size %d leaves no draft slot", in->block);
    if ((st = opt_int(c, dc, "markov_rank", 0, 1 << 20, &v)) == DSP_OK) in->markov_rank = (int)v;
    else if (st != DSP_ERR_NOT_FOUND) return st;
    if (in->markov_rank > 0) {
        if ((st = opt_str(c, dc, "markov_head_type", &mtype)) && st != DSP_ERR_NOT_FOUND) return st;
        if (!mtype || !strcmp(mtype, "vanilla")) in->markov_type = DSP_MARKOV_VANILLA;
        else if (!strcmp(mtype, "gated")) in->markov_type = DSP_MARKOV_GATED;
        else if (!strcmp(mtype, "rnn")) in->markov_type = DSP_MARKOV_RNN;
        else return dsp_error(DSP_ERR_UNSUPPORTED, "markov_head_type '%.40s' is not supported (vanilla, gated, rnn are)", mtype);
    }
    bool conf = false;
    if ((st = opt_bool(c, dc, "enable_confidence_head", &conf)) == DSP_ERR_NOT_FOUND) st = opt_bool(c, dc, "use_confidence_head", &conf);
    if (st && st != DSP_ERR_NOT_FOUND) return st;
    in->confidence = conf;
    in->conf_with_markov = in->markov_rank > 0; /* DeepSpec's default; the tensor's width decides below */
    if ((st = opt_bool(c, dc, "confidence_head_with_markov", &b)) == DSP_OK) in->conf_with_markov = b && in->markov_rank > 0;
    else if (st != DSP_ERR_NOT_FOUND) return st;
    /* layer types: full attention only */
    const json_t *lt = dsp_json_at(c, "layer_types");
    for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        if (t && strcmp(t, "full_attention"))
            return dsp_error(DSP_ERR_UNSUPPORTED, "layer_types[%zu] is '%.40s': only full_attention drafter layers are supported", i, t);
    }
    if (nt_cfg && nt_cfg != target->hp.n_layer)
        return dsp_error(DSP_ERR_INVALID_ARG, "this drafter was made for a target of %d layers (num_target_layers), the target has %d", nt_cfg,
                         target->hp.n_layer);
    return DSP_OK;
}

/* The drafter and the target must fit (DRAFTERS.md §5 step 2); checked on config.json before any
 * tensor, so that a drafter for another target is named as such. */
static dsp_status check_fit(const dsp_block_drafter *d, const json_t *c, const dsp_model *t) {
    const dsp_block_info *in = &d->info;
    const dsp_hparams *th = &t->hp;
    int64_t v;
    dsp_status st;
    if ((st = dsp_json_int(c, "hidden_size", 1, 1 << 24, &v)) == DSP_OK && v != th->n_embd)
        return dsp_error(DSP_ERR_INVALID_ARG, "hidden_size %lld differs from the target's %d: this drafter is for another target", (long long)v,
                         th->n_embd);
    if (st && st != DSP_ERR_NOT_FOUND) return st;
    if ((st = dsp_json_int(c, "vocab_size", 1, 1 << 24, &v)) == DSP_OK && v != th->n_vocab)
        return dsp_error(DSP_ERR_INVALID_ARG, "vocab_size %lld differs from the target's %d: this drafter is for another target", (long long)v,
                         th->n_vocab);
    if (st && st != DSP_ERR_NOT_FOUND) return st;
    for (int i = 0; i < in->n_taps; i++) {
        int l = in->tap_layers[i];
        if (l < -1 || l >= th->n_layer) /* -1: the embedding output (DeepSpec's extract_context_feature) */
            return dsp_error(DSP_ERR_INVALID_ARG, "target_layer_ids[%d] = %d is outside the target's layers 0..%d (and -1, the embedding output)", i,
                             l, th->n_layer - 1);
        if (l == th->n_layer - 1)
            return dsp_error(DSP_ERR_INVALID_ARG,
                             "target_layer_ids[%d] = %d is the target's last layer, whose Hugging Face hidden state is normed (DeepSpec "
                             "forbids it too)",
                             i, l);
    }
    if (in->mask_token < 0 || in->mask_token >= th->n_vocab)
        return dsp_error(DSP_ERR_INVALID_ARG, "mask_token_id %d is outside the vocabulary (0..%d)", in->mask_token, th->n_vocab - 1);
    return DSP_OK;
}

/* Bit-equal tensors (same type, shape and bytes). */
static bool same_tensor(const dsp_tensor *a, const dsp_tensor *b) {
    if (!a || !b || a->type != b->type || a->nbytes != b->nbytes || a->ne[0] != b->ne[0] || a->ne[1] != b->ne[1]) return false;
    return a->data == b->data || !memcmp(a->data, b->data, (size_t)a->nbytes);
}

/* A copy in another type of the same values: on up to 64 rows spread over the matrix, the
 * relative RMS difference of the dequantized rows is at most 0.1 (a 4-bit target's own
 * quantization error is a few percent; another model's matrix differs by ~1.4). False when either
 * type has no reference dequantization or the shapes differ. */
static bool same_values(const dsp_tensor *a, const dsp_tensor *b) {
    if (a->ne[0] != b->ne[0] || a->ne[1] != b->ne[1] || a->ne[0] == 0 || a->ne[0] > (1u << 20)) return false;
    const uint64_t n = a->ne[0], rows = a->ne[1];
    float *x = malloc(sizeof(float) * 2 * n);
    if (!x) return false;
    double d2 = 0, b2 = 0;
    bool ok = true;
    for (uint64_t i = 0; i < 64 && i < rows && ok; i++) {
        uint64_t r = rows <= 64 ? i : i * (rows - 1) / 63;
        ok = !dsp_dequantize_row(a->type, (const char *)a->data + r * dsp_dtype_row_bytes(a->type, n), x, n) &&
             !dsp_dequantize_row(b->type, (const char *)b->data + r * dsp_dtype_row_bytes(b->type, n), x + n, n);
        for (uint64_t j = 0; ok && j < n; j++) d2 += (double)(x[j] - x[n + j]) * (x[j] - x[n + j]), b2 += (double)x[n + j] * x[n + j];
    }
    free(x);
    dsp_error_clear();
    return ok && b2 > 0 && d2 <= 0.01 * b2;
}

/* The drafter's copy of an embedding / LM head, or the target's. A copy of the target's type that
 * differs in value means the drafter was made for another target. A copy in another type (DeepSpec's
 * bf16 copies next to a quantized GGUF target) of the same values is replaced by the target's own
 * tensor: the drafter then reads the quantized matrix, as the target does, instead of a second,
 * larger one (the LM head over the vocabulary is most of a small drafter's cost). The drafts change
 * by the quantization's rounding; the output stays lossless. */
static dsp_status share(dsp_block_drafter *d, const char *name, const dsp_tensor *own, const dsp_tensor *tgt, const char *tname,
                        const dsp_tensor **out, bool *shared) {
    *out = tgt, *shared = true;
    if (!own) return DSP_OK;
    if (same_tensor(own, tgt)) return DSP_OK;
    if (own->type == tgt->type)
        return dsp_error(DSP_ERR_INVALID_ARG, "tensor '%s' differs from the target's %s (same type and shape, different values): this drafter "
                         "was made for another target",
                         name, tname);
    if (same_values(own, tgt)) {
        DSP_LOGI("%s: '%s' is a %s copy of the target's %s %s: using the target's", d->info.path, name, dsp_dtype_name(own->type),
                 dsp_dtype_name(tgt->type), tname);
        return DSP_OK;
    }
    DSP_LOGI("%s: '%s' is %s, the target's is %s: using the drafter's own copy", d->info.path, name, dsp_dtype_name(own->type),
             dsp_dtype_name(tgt->type));
    *out = own, *shared = false;
    return DSP_OK;
}

static dsp_status bind(dsp_block_drafter *d, const dsp_model *t, const char *pfx) {
    dsp_model *m = d->m;
    dsp_block_info *in = &d->info;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab, r = in->markov_rank;
    char n[160];
#define NAME(s) (snprintf(n, sizeof n, "%s%s", pfx, s), n)
    dsp_status st;
    if ((st = dsp_hf_mat(m, NAME("fc.weight"), (int64_t)in->n_taps * t->hp.n_embd, E, false, &d->fc)) ||
        (st = dsp_hf_vec(m, NAME("hidden_norm.weight"), E, false, &d->hidden_norm)) || (st = dsp_hf_vec(m, NAME("norm.weight"), E, false, &d->norm)))
        return st;
    const dsp_tensor *embd = NULL, *head = NULL;
    if ((st = dsp_hf_mat(m, NAME("embed_tokens.weight"), E, V, true, &embd)) || (st = dsp_hf_mat(m, NAME("lm_head.weight"), E, V, true, &head)))
        return st;
    if ((st = share(d, "embed_tokens.weight", embd, t->w.tok_embd, "token embedding", &d->embd, &in->shares_embd)) ||
        (st = share(d, "lm_head.weight", head, t->w.output, "output layer", &d->head, &in->shares_head)))
        return st;
    /* Markov head: markov_head.markov_w{1,2} (DeepSpec) or markov_w{1,2} (ModelOpt) */
    if (r > 0) {
        const char *p = in->layout == DSP_BLOCK_MODELOPT ? "" : "markov_head.";
        char n1[160], n2[160];
        snprintf(n1, sizeof n1, "%s%smarkov_w1.weight", pfx, p);
        snprintf(n2, sizeof n2, "%s%smarkov_w2.weight", pfx, p);
        if (!dsp_st_find(m->st, n1)) { /* the other naming */
            p = *p ? "" : "markov_head.";
            snprintf(n1, sizeof n1, "%s%smarkov_w1.weight", pfx, p);
            snprintf(n2, sizeof n2, "%s%smarkov_w2.weight", pfx, p);
        }
        if ((st = dsp_hf_mat(m, n1, r, V, false, &d->mk_w1)) || (st = dsp_hf_mat(m, n2, r, V, false, &d->mk_w2))) return st;
        /* the gated / rnn variants' projection, under the same prefix as W1 */
        if (in->markov_type != DSP_MARKOV_VANILLA) {
            const bool rnn = in->markov_type == DSP_MARKOV_RNN;
            const char *lin = rnn ? "joint_proj" : "gate_proj";
            const int64_t in_w = rnn ? 2 * r + E : E + r, out_w = rnn ? 3 * r : r;
            snprintf(n1, sizeof n1, "%s%s%s.weight", pfx, p, lin);
            snprintf(n2, sizeof n2, "%s%s%s.bias", pfx, p, lin);
            if ((st = dsp_hf_mat(m, n1, in_w, out_w, false, &d->mk_pw)) || (st = dsp_hf_vec(m, n2, out_w, false, &d->mk_pb))) return st;
        }
    }
    if (in->confidence) {
        const char *wn = "confidence_head.proj.weight", *bn = "confidence_head.proj.bias";
        if (!dsp_st_find(m->st, NAME(wn))) wn = "confidence_proj.weight", bn = "confidence_proj.bias";
        const dsp_tensor *w = dsp_st_find(m->st, NAME(wn));
        if (!w) return dsp_error(DSP_ERR_FORMAT, "the confidence head is enabled but tensor '%sconfidence_head.proj.weight' is missing", pfx);
        int64_t width = w->n_dims == 2 ? (int64_t)w->ne[0] : 0;
        if (width == E + r && r > 0) in->conf_with_markov = true;
        else if (width == E) in->conf_with_markov = false;
        if ((st = dsp_hf_mat(m, NAME(wn), in->conf_with_markov ? E + r : E, 1, false, &d->conf_w)) ||
            (st = dsp_hf_vec(m, NAME(bn), 1, false, &d->conf_b)))
            return st;
        if (d->conf_w->type != DSP_F32 && d->conf_w->type != DSP_F16 && d->conf_w->type != DSP_BF16)
            return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%s': type %s", wn, dsp_dtype_name(d->conf_w->type));
    }
#undef NAME
    in->dspark = r > 0 || in->confidence;
    return DSP_OK;
}

/* ---- draft vocabulary (block.h) ---------------------------------------------------------------- */

#define MAX_VOCAB_FILE_BYTES (64u << 20)

/* Mark up to n tokens of draft_vocab.json (most frequent first) in `in`; *got receives how many.
 * An absent file is no error; a malformed one is. */
static dsp_status vocab_file(dsp_block_drafter *d, int n, uint8_t *in, int *got, bool *found) {
    *got = 0, *found = false;
    char *path = dsp_path_join(d->info.path, "draft_vocab.json");
    if (!path) return dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!dsp_file_exists(path)) {
        free(path);
        return DSP_OK;
    }
    json_t *j = NULL;
    *found = true;
    dsp_status st = dsp_json_load_file(path, MAX_VOCAB_FILE_BYTES, &j);
    const json_t *a = j && json_is_object(j) ? json_object_get(j, "token_ids") : j;
    const int64_t V = d->m->hp.n_vocab;
    if (!st && !json_is_array(a)) st = dsp_error(DSP_ERR_FORMAT, "not a list of token ids (nor {\"token_ids\": [...]})");
    for (size_t i = 0; !st && i < json_array_size(a) && *got < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= V)
            st = dsp_error(DSP_ERR_FORMAT, "entry %zu is not a token id of the vocabulary (0..%lld)", i, (long long)V - 1);
        else if (!in[json_integer_value(v)]) in[json_integer_value(v)] = 1, ++*got;
    }
    if (st) dsp_error_prefix("%s", path);
    json_decref(j);
    free(path);
    return st;
}

/* t's rows ids[0..n) -> out (a copy of t's description with n rows; *mem owns the bytes) */
static dsp_status gather_rows(const dsp_tensor *t, const int32_t *ids, int n, dsp_tensor *out, void **mem) {
    const size_t rb = dsp_dtype_row_bytes(t->type, t->ne[0]), bytes = rb * (size_t)n;
    uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return dsp_error(DSP_ERR_NOMEM, "no memory for the draft vocabulary's %d rows of %.*s", n, (int)t->name.len, t->name.ptr);
    for (int i = 0; i < n; i++) memcpy(p + (size_t)i * rb, (const uint8_t *)t->data + (size_t)ids[i] * rb, rb);
    *out = *t;
    out->ne[1] = (uint64_t)n;
    out->n_elems = t->ne[0] * (uint64_t)n;
    out->nbytes = bytes;
    out->offset = 0;
    out->data = p;
    *mem = p;
    return DSP_OK;
}

dsp_status dsp_block_pick_vocab(dsp_block_drafter *d, int n) {
    const int V = d->m->hp.n_vocab;
    DSP_ASSERT(n >= 1 && n < V && !d->vids);
    uint8_t *in = calloc((size_t)V, 1);
    if (!in) return dsp_error(DSP_ERR_NOMEM, "no memory");
    int got = 0;
    bool found;
    dsp_status st = vocab_file(d, n, in, &got, &found);
    const int from_file = got;
    for (int t = 0; !st && t < V && got < n; t++) /* the rest in token id order */
        if (!in[t]) in[t] = 1, got++;
    d->info.draft_vocab_source = found ? (from_file < n ? "draft_vocab.json + token id order" : "draft_vocab.json") : "token id order";
    if (!st && !(d->vids = malloc(sizeof(int32_t) * (size_t)n))) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!st) {
        int k = 0;
        for (int t = 0; t < V; t++)
            if (in[t]) d->vids[k++] = t;
        DSP_ASSERT(k == n);
        d->Vd = n;
        st = gather_rows(d->head, d->vids, n, &d->head_sub, &d->head_sub_mem);
        if (!st && d->mk_w2) st = gather_rows(d->mk_w2, d->vids, n, &d->w2_sub, &d->w2_sub_mem);
    }
    free(in);
    return st;
}

dsp_status dsp_block_quantize(dsp_block_drafter *d, uint32_t type, int n_threads) {
    /* the tap projection (every context row, n_taps x n_embd wide) and the Markov head's W2 (one
     * row per draft-vocabulary token) too: as BF16 they ran the float tile, ~5% of a dspark-mode
     * decode on the 2-core Zen 4 (perf) */
    const dsp_tensor **const extra[] = {&d->fc, &d->mk_w2};
    dsp_status st = dsp_model_quantize_with(d->m, type, n_threads, false, extra, 2);
    if (!st) d->info.layer_type = d->m->w.layers[0].ffn_down->type;
    return st;
}

dsp_status dsp_block_load(const char *path, const dsp_model *target, dsp_block_drafter **out) {
    *out = NULL;
    if (!target->has_weights) return dsp_error(DSP_ERR_INVALID_ARG, "the target was loaded vocab-only");
    char *dir = NULL;
    dsp_status st = DSP_OK;
    if (!dsp_file_is_dir(path) && dsp_hub_is_repo_id(path)) st = dsp_hub_resolve_cached(path, &dir);
    else if (!(dir = strdup(path))) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    if (st) return st;
    dsp_block_drafter *d = calloc(1, sizeof *d);
    json_t *cfg = NULL;
    char *cfg_path = NULL;
    if (!d || !(d->m = calloc(1, sizeof *d->m))) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory");
        goto done;
    }
    d->m->path = dir;
    dir = NULL;
    d->info.path = d->m->path;
    d->target = target;
    if (!dsp_file_is_dir(d->m->path)) {
        st = dsp_error(DSP_ERR_NOT_FOUND, "not a directory (a drafter is a Hugging Face directory: config.json + safetensors)");
        goto done;
    }
    if (!(cfg_path = dsp_path_join(d->m->path, "config.json"))) {
        st = dsp_error(DSP_ERR_NOMEM, "no memory");
        goto done;
    }
    if ((st = dsp_json_load_file(cfg_path, MAX_CONFIG_BYTES, &cfg)) || (st = dsp_st_open(d->m->path, &d->m->st))) goto done;
    /* the stack's tensors are top-level ("layers.N"), or under "model." in some exports */
    const char *pfx = dsp_st_find(d->m->st, "layers.0.input_layernorm.weight") || !dsp_st_find(d->m->st, "model.layers.0.input_layernorm.weight")
                          ? ""
                          : "model.";
    int64_t n_layers = 0;
    if ((st = dsp_json_int(cfg, "num_hidden_layers", 1, 4096, &n_layers)) == DSP_ERR_NOT_FOUND)
        st = dsp_error(DSP_ERR_FORMAT, "\"num_hidden_layers\" is missing");
    if (st || (st = read_config(d, cfg, target, (int)n_layers)) || (st = check_fit(d, cfg, target)) ||
        (st = dsp_hf_load_stack(d->m, cfg, pfx, 16))) {
        dsp_error_prefix("config.json");
        goto done;
    }
    d->m->has_weights = true;
    if ((st = bind(d, target, pfx))) goto done;
    dsp_block_info *in = &d->info;
    const dsp_hparams *hp = &d->m->hp;
    in->layout_name = in->layout == DSP_BLOCK_ZLAB ? "z-lab DFlash" : in->layout == DSP_BLOCK_DEEPSPEC ? "DeepSpec" : "ModelOpt";
    in->n_layers = hp->n_layer, in->n_embd = hp->n_embd, in->n_head = hp->n_head, in->n_head_kv = hp->n_head_kv;
    in->head_dim = hp->head_dim, in->n_ff = hp->n_ff;
    for (uint64_t i = 0; i < dsp_st_n_tensors(d->m->st); i++) in->n_params += dsp_st_tensor_at(d->m->st, i)->n_elems;
    in->layer_type = d->m->w.layers[0].ffn_down->type;
done:
    if (st) dsp_error_prefix("drafter %s", path);
    json_decref(cfg);
    free(cfg_path);
    free(dir);
    if (st) {
        dsp_block_destroy(d);
        return st;
    }
    *out = d;
    return DSP_OK;
}
