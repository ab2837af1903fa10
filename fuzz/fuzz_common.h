/* fuzz/fuzz_common.h: what the fuzz targets share. fuzz_load_and_run loads a GGUF image as a model
 * (metadata, tokenizer, chat template, hyper-parameters, weight binding) and, when it loads, runs
 * a forward over a few tokens: whatever the loader accepts must run without a sanitizer report. A
 * refused model must leave a message. */
#ifndef DSP_FUZZ_COMMON_H
#define DSP_FUZZ_COMMON_H

#include "core/status.h"
#include "model/forward.h"
#include "model/model.h"

#include <stdint.h>
#include <stdlib.h>

static inline void fuzz_load_and_run(const uint8_t *data, size_t size) {
    dsp_model *m = NULL;
    dsp_error_clear();
    dsp_status st = dsp_model_load_memory(data, size, "fuzz.gguf", NULL, &m);
    if (st != DSP_OK) {
        if (m != NULL || dsp_last_error()[0] == '\0') abort(); /* an error needs a message */
        return;
    }
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = 1, fp.max_batch_tokens = 4, fp.n_ctx = 8;
    dsp_fwd *f = NULL;
    if (dsp_fwd_create(m, &fp, &f) != DSP_OK) {
        dsp_model_destroy(m);
        return;
    }
    dsp_kv_seq s;
    if (dsp_fwd_seq_init(f, &s) == DSP_OK) {
        dsp_kv_seq *seqs[1] = {&s};
        int n_vocab = dsp_fwd_n_vocab(f);
        int32_t tok[3], seq[3] = {0, 0, 0}, pos[3] = {0, 1, 2}, row = 2;
        for (int i = 0; i < 3; i++) tok[i] = (int32_t)((i * 7 + 1) % n_vocab);
        dsp_batch b = {3, tok, seq, pos, 1, &row, 0, NULL};
        float *lg = malloc(sizeof(float) * (size_t)n_vocab);
        if (lg && dsp_fwd_run(f, seqs, 1, &b, lg, NULL) != DSP_OK && dsp_last_error()[0] == '\0') abort();
        free(lg);
        dsp_kv_seq_free(dsp_fwd_kv(f), &s);
    }
    dsp_fwd_destroy(f);
    dsp_model_destroy(m);
}

#endif
