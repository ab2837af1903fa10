/* tok/tok_api: the tokenizer functions of include/dspark.h over tok/tok.h. */
#include "tok/tok.h"

#include "core/status.h"

#include <stdlib.h>
#include <string.h>

dsp_status dsp_tokenize(const dsp_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, size_t cap,
                        size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (cap && !ids)) return dsp_error(DSP_ERR_INVALID_ARG, "dsp_tokenize: NULL argument");
    dsp_tok_ids v = {0};
    dsp_status st = dsp_tok_encode(t, text, len, flags, &v);
    if (st == DSP_OK) {
        *n_out = v.n;
        if (cap && v.n) memcpy(ids, v.v, (v.n < cap ? v.n : cap) * sizeof *ids);
        if (v.n > cap) st = dsp_error(DSP_ERR_RANGE, "dsp_tokenize: %zu ids do not fit in %zu", v.n, cap);
    }
    dsp_tok_ids_free(&v);
    return st;
}

static dsp_status copy_out(const char *src, size_t n, char *buf, size_t cap, size_t *len_out, const char *what) {
    *len_out = n;
    if (cap) {
        size_t k = n < cap ? n : cap - 1;
        memcpy(buf, src, k);
        buf[k] = 0;
    }
    if (n >= cap) return dsp_error(DSP_ERR_RANGE, "%s: %zu bytes do not fit in %zu", what, n + 1, cap);
    return DSP_OK;
}

dsp_status dsp_detokenize(const dsp_tokenizer *t, const int32_t *ids, size_t n, int flags, char *text, size_t cap,
                          size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!t || !len_out || (n && !ids) || (cap && !text)) return dsp_error(DSP_ERR_INVALID_ARG, "dsp_detokenize: NULL argument");
    char *s;
    size_t l;
    dsp_status st = dsp_tok_decode(t, ids, n, flags, &s, &l);
    if (st) return st;
    st = copy_out(s, l, text, cap, len_out, "dsp_detokenize");
    free(s);
    return st;
}

dsp_status dsp_token_to_piece(const dsp_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!t || !len_out || (cap && !buf)) return dsp_error(DSP_ERR_INVALID_ARG, "dsp_token_to_piece: NULL argument");
    size_t l;
    const char *p = dsp_tok_piece(t, id, &l);
    if (!p) return dsp_error(DSP_ERR_RANGE, "token id %d out of range (vocabulary of %zu)", (int)id, dsp_tok_n_vocab(t));
    return copy_out(p, l, buf, cap, len_out, "dsp_token_to_piece");
}

int32_t dsp_tokenizer_n_vocab(const dsp_tokenizer *t) { return (int32_t)dsp_tok_n_vocab(t); }
int32_t dsp_tokenizer_bos(const dsp_tokenizer *t) { return dsp_tok_bos(t); }
int32_t dsp_tokenizer_eos(const dsp_tokenizer *t) { return dsp_tok_eos(t); }
bool dsp_tokenizer_is_special(const dsp_tokenizer *t, int32_t id) { return dsp_tok_is_special(t, id); }
size_t dsp_tokenizer_max_piece(const dsp_tokenizer *t) { return dsp_tok_max_piece_len(t); }
