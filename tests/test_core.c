/* Unit tests for core/: status messages, arena, dtype table and f16/bf16 conversion. */
#include "dsp_test.h"

#include "core/arena.h"
#include "core/dtype.h"
#include "core/status.h"

#include <math.h>

static void test_status(void) {
    CHECK_EQ_INT(dsp_error(DSP_ERR_FORMAT, "tensor '%s': bad", "x"), DSP_ERR_FORMAT);
    CHECK_EQ_STR(dsp_last_error(), "tensor 'x': bad");
    dsp_error_prefix("file %s", "a.gguf");
    CHECK_EQ_STR(dsp_last_error(), "file a.gguf: tensor 'x': bad");
    CHECK_EQ_STR(dsp_status_to_string(DSP_ERR_NOT_FOUND), "not found");
}

static void test_arena(void) {
    dsp_arena a;
    dsp_arena_init(&a, 64, 1000);
    char *p = dsp_arena_alloc(&a, 10);
    CHECK(p && ((uintptr_t)p & 15) == 0);
    char *q = dsp_arena_alloc(&a, 100); /* larger than a chunk */
    CHECK(q != NULL);
    CHECK(dsp_arena_alloc(&a, 2000) == NULL); /* over the cap */
    CHECK(dsp_arena_alloc(&a, SIZE_MAX) == NULL);
    char *s = dsp_arena_strndup(&a, "hello", 3);
    CHECK_EQ_STR(s, "hel");
    dsp_arena_destroy(&a);
}

static void test_dtype(void) {
    CHECK_EQ_INT(dsp_dtype_get(DSP_Q4_K)->block_bytes, 144);
    CHECK(dsp_dtype_get(4) == NULL); /* retired id */
    CHECK(dsp_dtype_get(1000) == NULL);
    CHECK_EQ_INT(dsp_dtype_row_bytes(DSP_Q8_0, 64), 68);
    CHECK_EQ_INT(dsp_dtype_row_bytes(DSP_Q8_0, 33), 0);
}

static void test_f16(void) {
    /* every half value round-trips exactly through float */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dsp_f16_to_f32((uint16_t)h);
        uint16_t back = dsp_f32_to_f16(f);
        int is_nan = ((h >> 10) & 0x1f) == 31 && (h & 0x3ff);
        if (!is_nan && back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(dsp_f16_to_f32(0x3c00) == 1.0f);
    CHECK(dsp_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(dsp_f32_to_f16(65520.0f) == 0x7c00);       /* rounds to inf */
    CHECK(dsp_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00); /* tie to even */
    CHECK(dsp_bf16_to_f32(0x3f80) == 1.0f);
}

int main(void) {
    DSP_RUN(test_status);
    DSP_RUN(test_arena);
    DSP_RUN(test_dtype);
    DSP_RUN(test_f16);
    return dsp_test_summary();
}
