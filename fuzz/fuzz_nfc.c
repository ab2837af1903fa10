/* fuzz/fuzz_nfc: libFuzzer target for the NFC normalizer (tok/nfc). Any bytes are made valid UTF-8
 * (invalid sequences -> U+FFFD, as the tokenizer does), normalized, and the result must be valid
 * UTF-8, NFC again when normalized a second time (idempotence), and pass the quick check whenever
 * the input did unchanged. */
#include "tok/nfc.h"
#include "tok/tok.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *clean = malloc(3 * size + 4);
    if (!clean) return 0;
    dsp_utf8_state us;
    memset(&us, 0, sizeof us);
    size_t n = dsp_utf8_feed(&us, data, size, clean);
    n += dsp_utf8_finish(&us, clean + n);
    dsp_nfc_scratch a = {0}, b = {0};
    const char *x, *y;
    size_t xl, yl;
    if (dsp_nfc_normalize((const char *)clean, n, (size_t)1 << 30, &a, &x, &xl) != DSP_OK) abort();
    if (!dsp_utf8_valid((const uint8_t *)x, xl)) abort();
    if ((x == (const char *)clean) != dsp_nfc_quick_check((const char *)clean, n)) abort();
    if (dsp_nfc_normalize(x, xl, (size_t)1 << 30, &b, &y, &yl) != DSP_OK) abort();
    if (yl != xl || memcmp(x, y, xl)) abort();
    dsp_nfc_scratch_free(&a);
    dsp_nfc_scratch_free(&b);
    free(clean);
    return 0;
}
