/* model/model: dsp_model_load and info. See model.h. */
#include "model/model.h"

#include "core/log.h"
#include "template/template.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* End-of-generation set: the metadata's eos/eot/eom ids plus control tokens whose text is a
 * well-known turn or text terminator (chat models often end turns with one that is not `eos`). */
static void find_eog(dsp_model *m) {
    static const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    static const char *names[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>", "<|end|>",
                                  "</s>", "<|end_of_text|>", "<|return|>", "<|call|>"};
    int32_t n_vocab = (int32_t)dsp_tok_n_vocab(m->tok);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        uint32_t id;
        if (dsp_gguf_get_u32(m->gguf, keys[i], &id) == DSP_OK && id < (uint32_t)n_vocab && m->n_eog < DSP_MAX_EOG)
            m->eog[m->n_eog++] = (int32_t)id;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = dsp_tok_find(m->tok, names[i], strlen(names[i]));
        if (id < 0 || !dsp_tok_is_special(m->tok, id)) continue;
        bool dup = false;
        for (int k = 0; k < m->n_eog; k++) dup |= m->eog[k] == id;
        if (!dup && m->n_eog < DSP_MAX_EOG) m->eog[m->n_eog++] = id;
    }
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
    in->has_chat_template = dsp_gguf_find_kv(g, "tokenizer.chat_template") != NULL;
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
    uint64_t total = 0, done = 0;
    for (uint64_t i = 0; i < m->info.n_tensors; i++) total += dsp_gguf_tensor_at(m->gguf, i)->nbytes;
    int last = -1;
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < m->info.n_tensors; i++) {
        const dsp_tensor *t = dsp_gguf_tensor_at(m->gguf, i);
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

/* A model over an opened file (label: its path, for info and messages): metadata, tokenizer, chat
 * template, then (unless vocab_only) hyper-parameters and weights. */
static dsp_status load_opened(const char *label, dsp_gguf *g, dsp_status open_st, const dsp_model_params *params, dsp_model **out) {
    *out = NULL;
    dsp_model_params defaults = dsp_model_default_params();
    if (!params) params = &defaults;
    dsp_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(label))) {
        free(m);
        dsp_gguf_destroy(g);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    m->gguf = g;
    dsp_status st = open_st;
    if (!st) {
        st = fill_info(m);
        if (!st && m->tok_model[0]) {
            st = dsp_tok_create_from_gguf(m->gguf, &m->tok);
            if (!st) find_eog(m);
        }
        if (!st) st = dsp_model_load_chat_template(m);
        if (!st && !params->vocab_only) {
            st = dsp_arch_load_hparams(m->gguf, &m->hp);
            if (!st) st = dsp_arch_bind_weights(m->gguf, &m->hp, &m->w);
            m->has_weights = st == DSP_OK;
        }
        if (st) dsp_error_prefix("%s", label);
    }
    if (st) {
        dsp_model_destroy(m);
        return st;
    }
    if (params->progress && m->has_weights) prefault(m);
    *out = m;
    return DSP_OK;
}

dsp_status dsp_model_load(const char *path, const dsp_model_params *params, dsp_model **out) {
    dsp_gguf *g = NULL;
    dsp_status st = dsp_gguf_open(path, &g);
    return load_opened(path, g, st, params, out);
}

dsp_status dsp_model_load_memory(const void *data, size_t size, const char *label, const dsp_model_params *params, dsp_model **out) {
    dsp_gguf *g = NULL;
    dsp_status st = dsp_gguf_open_memory(data, size, &g);
    return load_opened(label, g, st, params, out);
}

void dsp_model_destroy(dsp_model *m) {
    if (!m) return;
    dsp_tok_destroy(m->tok);
    dsp_tmpl_destroy(m->tmpl);
    dsp_arch_free_weights(&m->w);
    dsp_gguf_destroy(m->gguf);
    free(m->path);
    free(m->arch);
    free(m->name);
    free(m->tok_model);
    free(m->tok_pre);
    free(m);
}

void dsp_model_get_info(const dsp_model *m, dsp_model_info *info) { *info = m->info; }

const dsp_tokenizer *dsp_model_tokenizer(const dsp_model *m) { return m->tok; }
