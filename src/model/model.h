/* model/model: a loaded model: the mmapped GGUF, its metadata and (once tok/ lands) tokenizer.
 * The architecture tables and forward pass come with the CPU inference issue. */
#ifndef DSP_MODEL_MODEL_H
#define DSP_MODEL_MODEL_H

#include "dspark.h"
#include "io/gguf.h"
#include "model/arch.h"
#include "tok/tok.h"

#define DSP_MAX_EOG 16

struct dsp_model {
    char *path;
    dsp_gguf *gguf;
    dsp_model_info info; /* filled once at load */
    dsp_tok *tok;        /* NULL if the file has no tokenizer */
    struct dsp_tmpl *tmpl; /* parsed tokenizer.chat_template; NULL if absent or unparsable */
    bool has_chat_template;
    char tmpl_error[512]; /* why tmpl is NULL although the file has a template */
    int32_t eog[DSP_MAX_EOG]; /* end-of-generation tokens: eos, eot, eom, <|im_end|>, ... */
    int n_eog;
    bool has_weights;    /* false when loaded vocab-only */
    dsp_hparams hp;      /* valid when has_weights */
    dsp_weights w;
    char *arch, *name, *tok_model, *tok_pre; /* NUL-terminated copies for info */
};

/* dsp_model_load from a GGUF image in memory (tests, fuzzers); data must outlive the model and
 * label names it in messages. */
dsp_status dsp_model_load_memory(const void *data, size_t size, const char *label, const dsp_model_params *params, dsp_model **out);

/* parse tokenizer.chat_template if present (chat.c) */
dsp_status dsp_model_load_chat_template(dsp_model *m);

#endif
