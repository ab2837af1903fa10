/* fuzz/fuzz_gguf: libFuzzer target for the GGUF reader. Every input is opened from memory (the
 * fuzzer's buffer has exactly the input's size, so ASan sees any overread); a file that opens is
 * walked through every accessor (tests/gguf_walk.h), then loaded as a model (tokenizer, chat
 * template, hyper-parameters, binding; fuzz_common.h). A failed open must leave a message.
 * Structure-aware fuzzing of the model's metadata and shapes is fuzz_model. */
#include "fuzz_common.h"
#include "gguf_walk.h"

#include "core/status.h"
#include "io/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsp_gguf *g = NULL;
    dsp_error_clear();
    dsp_status st = dsp_gguf_open_memory(data, size, &g);
    if (st != DSP_OK) {
        if (g != NULL || dsp_last_error()[0] == '\0') abort(); /* an error needs a message */
        return 0;
    }
    volatile uint64_t sink = dsp_gguf_walk(g);
    (void)sink;
    dsp_gguf_destroy(g);
    fuzz_load_and_run(data, size);
    return 0;
}
