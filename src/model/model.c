/* model/model: dsp_model_load (GGUF files here; Hugging Face directories in hf.c), the owned-tensor
 * pool and info. See model.h. */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#include "model/model.h"

#include "core/file.h"
#include "core/log.h"
#include "io/hub.h"
#include "template/template.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

dsp_model_params dsp_model_default_params(void) {
    dsp_model_params p;
    memset(&p, 0, sizeof p);
    return p;
}

const char *dsp_tensor_type_name(uint32_t type_id) { return dsp_dtype_name(type_id); }

static char *dup_str(dsp_str s) {
    char *p = malloc(s.len + 1);
    if (!p) return NULL;
    memcpy(p, s.ptr, s.len);
    p[s.len] = '\0';
    return p;
}

/* string metadata as a NUL-terminated copy; "" if absent; NULL only on no memory / bad type */
static dsp_status meta_str(const dsp_gguf *g, const char *key, char **out) {
    dsp_str s = {"", 0};
    dsp_status st = dsp_gguf_get_str(g, key, &s);
    if (st && st != DSP_ERR_NOT_FOUND) return st;
    *out = dup_str(s);
    return *out ? DSP_OK : dsp_error(DSP_ERR_NOMEM, "no memory");
}

static uint32_t meta_u32(const dsp_gguf *g, const char *arch, const char *suffix) {
    char key[256];
    uint32_t v = 0;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (dsp_gguf_get_u32(g, key, &v) != DSP_OK) v = 0;
    return v;
}

void dsp_model_add_eog(dsp_model *m, int32_t id) {
    if (!m->tok || id < 0 || id >= (int32_t)dsp_tok_n_vocab(m->tok) || m->n_eog >= DSP_MAX_EOG) return;
    for (int k = 0; k < m->n_eog; k++)
        if (m->eog[k] == id) return;
    m->eog[m->n_eog++] = id;
}

/* Control tokens whose text is a well-known turn or text terminator (chat models often end turns
 * with one that is not `eos`). */
void dsp_model_add_named_eog(dsp_model *m) {
    static const char *names[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>", "<|end|>",
                                  "</s>", "<|end_of_text|>", "<|return|>", "<|call|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = dsp_tok_find(m->tok, names[i], strlen(names[i]));
        if (id >= 0 && dsp_tok_is_special(m->tok, id)) dsp_model_add_eog(m, id);
    }
}

/* End-of-generation set of a GGUF: the metadata's eos/eot/eom ids plus the named ones. */
static void find_eog(dsp_model *m) {
    static const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        uint32_t id;
        if (dsp_gguf_get_u32(m->gguf, keys[i], &id) == DSP_OK && id <= INT32_MAX) dsp_model_add_eog(m, (int32_t)id);
    }
    dsp_model_add_named_eog(m);
}

dsp_status dsp_model_own_reserve(dsp_model *m, int cap) {
    if (cap <= m->cap_own) return DSP_OK;
    if (m->own) return dsp_error(DSP_ERR_INTERNAL, "owned-tensor pool reserved twice");
    m->own = calloc((size_t)cap, sizeof *m->own);
    if (!m->own) return dsp_error(DSP_ERR_NOMEM, "no memory");
    m->cap_own = cap;
    return DSP_OK;
}

dsp_tensor *dsp_model_own_tensor(dsp_model *m, const dsp_tensor *like, const char *name, uint32_t type, size_t nbytes) {
    if (m->n_own >= m->cap_own) {
        dsp_error(DSP_ERR_INTERNAL, "owned-tensor pool full (%d)", m->cap_own);
        return NULL;
    }
    void *data = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64);
    if (!data) {
        dsp_error(DSP_ERR_NOMEM, "no memory for %zu bytes of tensor '%s'", nbytes, name);
        return NULL;
    }
    if (nbytes >= (4u << 20)) { /* quantized matrices: huge pages where the kernel allows them (fewer
                                 * faults while quantizing, fewer TLB misses in every matmul) */
        uintptr_t a = ((uintptr_t)data + 4095) & ~(uintptr_t)4095;
        madvise((void *)a, (nbytes - (a - (uintptr_t)data)) & ~(size_t)4095, MADV_HUGEPAGE);
    }
    dsp_owned_tensor *o = &m->own[m->n_own++];
    o->t = *like;
    snprintf(o->name, sizeof o->name, "%s", name);
    o->t.name.ptr = o->name;
    o->t.name.len = strlen(o->name);
    o->t.type = type;
    o->t.offset = 0;
    o->t.nbytes = nbytes;
    o->t.data = data;
    return &o->t;
}

static dsp_status fill_info(dsp_model *m) {
    dsp_model_info *in = &m->info;
    const dsp_gguf *g = m->gguf;
    dsp_status st;
    if ((st = meta_str(g, "general.architecture", &m->arch)) || (st = meta_str(g, "general.name", &m->name)) ||
        (st = meta_str(g, "tokenizer.ggml.model", &m->tok_model)) || (st = meta_str(g, "tokenizer.ggml.pre", &m->tok_pre)))
        return st;
    if (!m->arch[0]) return dsp_error(DSP_ERR_FORMAT, "metadata key 'general.architecture' is missing");
    in->path = m->path;
    in->format = "gguf";
    in->n_files = 1;
    in->gguf_version = dsp_gguf_version(g);
    in->file_size = dsp_gguf_file_size(g);
    in->arch = m->arch;
    in->name = m->name;
    in->tok_model = m->tok_model;
    in->tok_pre = m->tok_pre;
    in->n_layers = meta_u32(g, m->arch, "block_count");
    in->n_embd = meta_u32(g, m->arch, "embedding_length");
    in->n_ff = meta_u32(g, m->arch, "feed_forward_length");
    in->n_head = meta_u32(g, m->arch, "attention.head_count");
    in->n_head_kv = meta_u32(g, m->arch, "attention.head_count_kv");
    in->n_ctx_train = meta_u32(g, m->arch, "context_length");
    const dsp_gguf_kv *toks;
    if (dsp_gguf_get_arr(g, "tokenizer.ggml.tokens", DSP_GGUF_STRING, &toks) == DSP_OK)
        in->n_vocab = toks->arr_n > UINT32_MAX ? UINT32_MAX : (uint32_t)toks->arr_n;
    in->n_tensors = dsp_gguf_n_tensors(g);
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        const dsp_tensor *t = dsp_gguf_tensor_at(g, i);
        in->n_params += t->n_elems;
        if (t->type < 40) {
            in->type_bytes[t->type] += t->nbytes;
            in->type_count[t->type]++;
        }
    }
    return DSP_OK;
}

/* Fault the weights in now, with a progress line, rather than during the first forward: on a large
 * model that is the slow part of a load, and a user on a terminal wants to see it move. */
static void prefault(const dsp_model *m) {
    uint64_t n = m->gguf ? dsp_gguf_n_tensors(m->gguf) : m->st ? dsp_st_n_tensors(m->st) : 0, total = 0, done = 0;
    for (uint64_t i = 0; i < n; i++) total += (m->gguf ? dsp_gguf_tensor_at(m->gguf, i) : dsp_st_tensor_at(m->st, i))->nbytes;
    int last = -1;
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < n; i++) {
        const dsp_tensor *t = m->gguf ? dsp_gguf_tensor_at(m->gguf, i) : dsp_st_tensor_at(m->st, i);
        const uint8_t *p = t->data;
        for (uint64_t off = 0; off < t->nbytes; off += 4096) sink ^= p[off];
        done += t->nbytes;
        int pct = total ? (int)(done * 100 / total) : 100;
        if (pct / 5 != last / 5) {
            fprintf(stderr, "\rloading %s: %3d%%", m->path, pct);
            last = pct;
        }
    }
    (void)sink;
    fprintf(stderr, "\n");
}

/* A GGUF (m->gguf, opened by the caller; label names it in messages): metadata, tokenizer, chat
 * template, then (unless vocab_only) hyper-parameters and weights. */
static dsp_status load_gguf(dsp_model *m, const char *label, const dsp_model_params *params) {
    dsp_status st = fill_info(m);
    if (!st && m->tok_model[0]) {
        st = dsp_tok_create_from_gguf(m->gguf, &m->tok);
        if (!st) find_eog(m);
    }
    if (!st) {
        dsp_str src;
        st = dsp_gguf_get_str(m->gguf, "tokenizer.chat_template", &src);
        if (st == DSP_OK) {
            m->tmpl_src = src.ptr;
            m->tmpl_len = (size_t)src.len;
            snprintf(m->tmpl_origin, sizeof m->tmpl_origin, "tokenizer.chat_template");
            dsp_model_parse_chat_template(m);
        }
        if (st == DSP_ERR_NOT_FOUND) st = DSP_OK;
    }
    if (!st && !params->vocab_only) {
        st = dsp_arch_load_hparams(m->gguf, &m->hp);
        if (!st) st = dsp_arch_bind_weights(m->gguf, &m->hp, &m->w);
        m->has_weights = st == DSP_OK;
    }
    if (st) dsp_error_prefix("%s", label);
    return st;
}

dsp_status dsp_model_load(const char *path, const dsp_model_params *params, dsp_model **out) {
    *out = NULL;
    dsp_model_params defaults = dsp_model_default_params();
    if (!params) params = &defaults;
    uint32_t qtype = 0;
    if (params->quantize) {
        if (!strcmp(params->quantize, "q8_0")) qtype = DSP_Q8_0;
        else if (!strcmp(params->quantize, "q4_0")) qtype = DSP_Q4_0;
        else if (!strcmp(params->quantize, "q4_k")) qtype = DSP_Q4_K;
        else return dsp_error(DSP_ERR_INVALID_ARG, "quantize: '%s' is not one of q8_0, q4_0, q4_k", params->quantize);
    }
    /* a path that is neither a file nor a directory may be a repo id in the hub cache */
    char *resolved = NULL;
    if (!dsp_file_exists(path) && !dsp_file_is_dir(path) && dsp_hub_is_repo_id(path)) {
        dsp_status st = dsp_hub_resolve_cached(path, &resolved);
        if (st) return st;
        path = resolved;
    }
    dsp_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        free(resolved);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    free(resolved);
    dsp_status st;
    if (dsp_file_is_dir(m->path)) st = dsp_hf_load(m, m->path, params);
    else if (!(st = dsp_gguf_open(m->path, &m->gguf))) st = load_gguf(m, m->path, params);
    if (!st) m->info.has_chat_template = m->has_chat_template, m->info.chat_template_origin = m->tmpl_origin;
    if (!st && qtype && m->has_weights) st = dsp_model_quantize(m, qtype, params->n_threads, params->progress);
    if (st) {
        dsp_model_destroy(m);
        return st;
    }
    if (params->progress && m->has_weights && !qtype) prefault(m);
    *out = m;
    return DSP_OK;
}

dsp_status dsp_model_load_memory(const void *data, size_t size, const char *label, const dsp_model_params *params, dsp_model **out) {
    *out = NULL;
    dsp_model_params defaults = dsp_model_default_params();
    if (!params) params = &defaults;
    dsp_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(label))) {
        free(m);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    dsp_status st = dsp_gguf_open_memory(data, size, &m->gguf);
    if (st) dsp_error_prefix("%s", label);
    else st = load_gguf(m, label, params);
    if (!st) m->info.has_chat_template = m->has_chat_template, m->info.chat_template_origin = m->tmpl_origin;
    if (st) {
        dsp_model_destroy(m);
        return st;
    }
    *out = m;
    return DSP_OK;
}

void dsp_model_destroy(dsp_model *m) {
    if (!m) return;
    dsp_tok_destroy(m->tok);
    dsp_tmpl_destroy(m->tmpl);
    dsp_arch_free_weights(&m->w);
    dsp_gguf_destroy(m->gguf);
    dsp_st_destroy(m->st);
    for (int i = 0; i < m->n_own; i++) free((void *)m->own[i].t.data);
    free(m->own);
    free(m->tmpl_own);
    free(m->path);
    free(m->arch);
    free(m->name);
    free(m->tok_model);
    free(m->tok_pre);
    free(m);
}

void dsp_model_get_info(const dsp_model *m, dsp_model_info *info) { *info = m->info; }

const dsp_tokenizer *dsp_model_tokenizer(const dsp_model *m) { return m->tok; }

void dsp_model_gen_defaults(const dsp_model *m, dsp_gen_defaults *out) {
    *out = m->gen;
    out->source = m->gen_source;
}

void dsp_gen_apply_defaults(const dsp_gen_defaults *d, unsigned given, dsp_gen_params *p) {
    unsigned use = d->has & ~given;
    if (use & DSP_GEN_HAS_TEMPERATURE) p->temperature = d->temperature;
    if (use & DSP_GEN_HAS_TOP_P) p->top_p = d->top_p;
    if (use & DSP_GEN_HAS_TOP_K) p->top_k = d->top_k;
    if (use & DSP_GEN_HAS_MIN_P) p->min_p = d->min_p;
    if (use & DSP_GEN_HAS_REPETITION_PENALTY) p->repetition_penalty = d->repetition_penalty;
}
