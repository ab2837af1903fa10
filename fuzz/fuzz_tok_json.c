/* fuzz/fuzz_tok_json: libFuzzer target for tokenizer.json. The input is a tokenizer.json, optionally
 * followed by a NUL byte and a text. A file that builds a tokenizer must then encode the text (or a
 * fixed multilingual sample) with and without special tokens, decode the ids back, and decode every
 * id of the vocabulary; a file that does not must leave a message. Seeds: scripts/fuzz. */
#include "core/status.h"
#include "tok/tok.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_sample[] = "Hello, world! caf\xC3\xA9 cafe\xCC\x81 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB "
                               "<s></s><|endoftext|>  12345 \xE2\x84\xAB\xF0\x9F\x98\x80\n\tx";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : k_sample;
    size_t tlen = nul ? size - jlen - 1 : sizeof k_sample - 1;
    json_error_t je;
    json_t *tj = json_loadb((const char *)data, jlen, JSON_REJECT_DUPLICATES, &je);
    if (!tj) return 0;
    dsp_tok *t = NULL;
    char md[64], pd[128];
    dsp_error_clear();
    if (dsp_tok_create_from_hf(tj, NULL, &t, md, sizeof md, pd, sizeof pd) != DSP_OK) {
        if (t != NULL || dsp_last_error()[0] == '\0') abort();
        json_decref(tj);
        return 0;
    }
    json_decref(tj); /* the tokenizer keeps nothing of the JSON */
    for (int flags = 0; flags <= (DSP_TOKENIZE_ADD_SPECIAL | DSP_TOKENIZE_PARSE_SPECIAL); flags += DSP_TOKENIZE_ADD_SPECIAL | DSP_TOKENIZE_PARSE_SPECIAL) {
        dsp_tok_ids ids = {0};
        if (dsp_tok_encode(t, text, tlen, flags, &ids) == DSP_OK) {
            for (size_t i = 0; i < ids.n; i++)
                if (ids.v[i] < 0 || (size_t)ids.v[i] >= dsp_tok_n_vocab(t)) abort();
            char *out = NULL;
            size_t ol;
            if (dsp_tok_decode(t, ids.v, ids.n, 0, &out, &ol) != DSP_OK) abort();
            free(out);
        }
        dsp_tok_ids_free(&ids);
    }
    size_t n = dsp_tok_n_vocab(t) < 4096 ? dsp_tok_n_vocab(t) : 4096;
    for (size_t i = 0; i < n; i++) {
        int32_t id = (int32_t)i;
        char *out = NULL;
        size_t ol;
        if (dsp_tok_decode(t, &id, 1, 0, &out, &ol) != DSP_OK) abort();
        free(out);
    }
    dsp_tok_destroy(t);
    return 0;
}
