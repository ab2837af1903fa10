/* fuzz/fuzz_safetensors: libFuzzer target for the safetensors reader. Every input is opened from
 * memory (the fuzzer's buffer has exactly the input's size, so ASan sees any overread); a file that
 * opens has every tensor looked up by name and its first and last byte read, as a loader would. A
 * failed open must leave a message. Seeds: test_safetensors --write-seeds (scripts/fuzz). */
#include "core/status.h"
#include "io/safetensors.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsp_st *s = NULL;
    dsp_error_clear();
    if (dsp_st_open_memory(data, size, &s) != DSP_OK) {
        if (s != NULL || dsp_last_error()[0] == '\0') abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < dsp_st_n_tensors(s); i++) {
        const dsp_tensor *t = dsp_st_tensor_at(s, i);
        if (dsp_st_find(s, t->name.ptr) != t) abort();
        if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)dsp_st_dtype_name(s, i);
    }
    (void)dsp_st_metadata(s, "format");
    (void)sink;
    dsp_st_destroy(s);
    return 0;
}
