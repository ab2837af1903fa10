/* tok/nfc: Unicode Normalization Form C, for tokenizer.json's NFC normalizer (Qwen2, Qwen3, ...).
 *
 * The algorithm of UAX #15: full canonical decomposition (Hangul syllables algorithmically, the
 * rest from tok/nfc_table.h, generated from Python's unicodedata by tools/gen_nfc_table.py),
 * canonical ordering of combining marks (stable, by combining class), then canonical composition
 * (a mark composes with the last starter unless blocked; composition exclusions never compose).
 * Most text is already NFC: the quick check (NFC_Quick_Check and combining-class order) returns it
 * untouched, without a copy; otherwise normalization starts at the last normalization boundary
 * before the first character the quick check could not pass, and the prefix is copied as is.
 * Tested against unicodedata.normalize on every code point and against the `tokenizers` package. */
#ifndef DSP_TOK_NFC_H
#define DSP_TOK_NFC_H

#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Buffers reused across calls (zero-initialize; dsp_nfc_scratch_free releases them). */
typedef struct dsp_nfc_scratch {
    uint32_t *cp; /* code point | combining class << 24 */
    size_t cp_cap;
    uint32_t *tmp; /* canonical ordering of long runs */
    size_t tmp_cap;
    char *out;
    size_t out_cap;
} dsp_nfc_scratch;
void dsp_nfc_scratch_free(dsp_nfc_scratch *sc);

/* true when s[0..n) (valid UTF-8) is NFC by the quick check alone */
bool dsp_nfc_quick_check(const char *s, size_t n);

/* The NFC of s[0..n) (valid UTF-8): *out is s itself when it is already NFC, else sc->out;
 * *out_len its length. DSP_ERR_NOMEM, or DSP_ERR_RANGE when the result would pass max_out bytes. */
dsp_status dsp_nfc_normalize(const char *s, size_t n, size_t max_out, dsp_nfc_scratch *sc, const char **out, size_t *out_len);

#endif
