/* model/model: a loaded model, from a GGUF file (model.c) or a Hugging Face directory (hf.c): the
 * mapped weights, hyper-parameters, tokenizer, chat template, end-of-generation set and sampling
 * defaults. Weights point into the read-only mappings; the few tensors the model owns (vectors
 * widened to F32, llama Q/K rows permuted, rope frequency divisors, load-time quantization) live in
 * `own` and are freed with the model. */
#ifndef DSP_MODEL_MODEL_H
#define DSP_MODEL_MODEL_H

#include "dspark.h"
#include "io/gguf.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "tok/tok.h"

#define DSP_MAX_EOG 16

/* A tensor the model owns (data malloc'd, 64-byte aligned). */
typedef struct dsp_owned_tensor {
    dsp_tensor t;
    char name[96];
} dsp_owned_tensor;

struct dsp_model {
    char *path;
    dsp_gguf *gguf;      /* a GGUF file, or */
    dsp_st *st;          /* a Hugging Face directory's safetensors (NULL when loaded vocab-only without weights) */
    dsp_model_info info; /* filled once at load */
    dsp_tok *tok;        /* NULL if the file has no tokenizer */
    struct dsp_tmpl *tmpl; /* parsed tokenizer.chat_template; NULL if absent or unparsable */
    bool has_chat_template;
    const char *tmpl_src;  /* the template's source (into the GGUF mapping, or tmpl_own) */
    size_t tmpl_len;
    char *tmpl_own;
    char tmpl_origin[64];  /* where it came from: "tokenizer.chat_template", "chat_template.jinja", ... */
    char tmpl_error[512]; /* why tmpl is NULL although the file has a template */
    int32_t eog[DSP_MAX_EOG]; /* end-of-generation tokens: eos, eot, eom, <|im_end|>, ... */
    int n_eog;
    bool has_weights;    /* false when loaded vocab-only */
    dsp_hparams hp;      /* valid when has_weights */
    dsp_weights w;
    char *arch, *name, *tok_model, *tok_pre; /* NUL-terminated copies for info */
    dsp_gen_defaults gen;   /* sampling defaults (generation_config.json) */
    char gen_source[512];
    dsp_owned_tensor *own; /* (cap_own), never reallocated: weights point into it */
    int n_own, cap_own;
};

/* Parse m->tmpl_src (if set) into m->tmpl (chat.c). A template that does not parse is not an
 * error here: rendering reports it. */
void dsp_model_parse_chat_template(dsp_model *m);
/* Add an end-of-generation token (ignored if out of range, already there, or the set is full). */
void dsp_model_add_eog(dsp_model *m, int32_t id);
/* The well-known end-of-turn tokens of the vocabulary that are special tokens (model.c). */
void dsp_model_add_named_eog(dsp_model *m);
/* A new model-owned tensor shaped like `like` with the given type, data of nbytes (uninitialized);
 * NULL (message set) if the pool is full or memory is short. */
dsp_tensor *dsp_model_own_tensor(dsp_model *m, const dsp_tensor *like, const char *name, uint32_t type, size_t nbytes);
dsp_status dsp_model_own_reserve(dsp_model *m, int cap);

/* A Hugging Face model directory (hf.c): config.json, safetensors, tokenizer.json,
 * tokenizer_config.json, chat_template.jinja, generation_config.json. */
dsp_status dsp_hf_load(dsp_model *m, const char *dir, const dsp_model_params *p);
/* A block drafter's decoder stack (spec/block_load.c): config.json's hyper-parameters and RoPE
 * (rope_theta / rope_scaling or rope_parameters) into m->hp, and the layers `<prefix>layers.N.*`
 * bound and checked into m->w.layers (norms and biases widened to F32, as for a model; never
 * permuted: the stack's RoPE is rotate-half). m->st must be open. extra_own: owned tensors the
 * caller will add (dsp_hf_vec of non-F32 vectors). */
dsp_status dsp_hf_load_stack(dsp_model *m, const json_t *cfg, const char *prefix, int extra_own);
/* One tensor of m->st, shape- and type-checked as the loader does: a vector of n (as F32, owned
 * when widened), or a matrix [out_f, in] (PyTorch order) of F32/F16/BF16. optional: *out = NULL
 * when absent. */
dsp_status dsp_hf_vec(dsp_model *m, const char *name, int64_t n, bool optional, const dsp_tensor **out);
dsp_status dsp_hf_mat(dsp_model *m, const char *name, int64_t in, int64_t out_f, bool optional, const dsp_tensor **out);
/* Replace F32/F16/BF16 matrices by `type` (Q8_0, Q4_0) at load (quantize.c). */
dsp_status dsp_model_quantize(dsp_model *m, uint32_t type, int n_threads, bool progress);
/* the same, and the matrices *extra[0 .. n_extra) beside the model's own (a block drafter's tap
 * projection and Markov W2: tensors of m's files the layer list does not name) */
dsp_status dsp_model_quantize_with(dsp_model *m, uint32_t type, int n_threads, bool progress, const dsp_tensor **const *extra, int n_extra);
/* dsp_model_load from a GGUF image in memory (tests, fuzzers); data must outlive the model and
 * label names it in messages. */
dsp_status dsp_model_load_memory(const void *data, size_t size, const char *label, const dsp_model_params *params, dsp_model **out);

#endif
