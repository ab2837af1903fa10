/* model/model: a loaded model: the mmapped GGUF, its metadata and (once tok/ lands) tokenizer.
 * The architecture tables and forward pass come with the CPU inference issue. */
#ifndef DSP_MODEL_MODEL_H
#define DSP_MODEL_MODEL_H

#include "dspark.h"
#include "io/gguf.h"
#include "model/arch.h"

struct dsp_model {
    char *path;
    dsp_gguf *gguf;
    dsp_model_info info; /* filled once at load */
    bool has_weights;    /* false when loaded vocab-only */
    dsp_hparams hp;      /* valid when has_weights */
    dsp_weights w;
    char *arch, *name, *tok_model, *tok_pre; /* NUL-terminated copies for info */
};

#endif
