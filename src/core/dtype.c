/* core/dtype: the block-layout table. Sizes follow the GGML definitions that GGUF files use; they
 * are checked against gguf-py's GGML_QUANT_SIZES by tests/py/test_dequant.py. One deliberate
 * difference: Q8_1 is 36 bytes (ggml's block_q8_1 = f16 d, f16 s, 32 x i8), where gguf-py still
 * lists 40 (an old f32 d, f32 s layout). can_dequant marks the types core/quant handles. */
#include "core/dtype.h"

#define T(id, nm, be, bb, dq) [id] = {nm, be, bb, dq}
static const dsp_dtype_traits g_traits[DSP_DTYPE_COUNT] = {
    T(DSP_F32, "F32", 1, 4, true),         T(DSP_F16, "F16", 1, 2, true),
    T(DSP_Q4_0, "Q4_0", 32, 18, true),     T(DSP_Q4_1, "Q4_1", 32, 20, true),
    T(DSP_Q5_0, "Q5_0", 32, 22, true),     T(DSP_Q5_1, "Q5_1", 32, 24, true),
    T(DSP_Q8_0, "Q8_0", 32, 34, true),     T(DSP_Q8_1, "Q8_1", 32, 36, false),
    T(DSP_Q2_K, "Q2_K", 256, 84, true),    T(DSP_Q3_K, "Q3_K", 256, 110, true),
    T(DSP_Q4_K, "Q4_K", 256, 144, true),   T(DSP_Q5_K, "Q5_K", 256, 176, true),
    T(DSP_Q6_K, "Q6_K", 256, 210, true),   T(DSP_Q8_K, "Q8_K", 256, 292, true),
    T(DSP_IQ2_XXS, "IQ2_XXS", 256, 66, false), T(DSP_IQ2_XS, "IQ2_XS", 256, 74, false),
    T(DSP_IQ3_XXS, "IQ3_XXS", 256, 98, false), T(DSP_IQ1_S, "IQ1_S", 256, 50, false),
    T(DSP_IQ4_NL, "IQ4_NL", 32, 18, false),    T(DSP_IQ3_S, "IQ3_S", 256, 110, false),
    T(DSP_IQ2_S, "IQ2_S", 256, 82, false),     T(DSP_IQ4_XS, "IQ4_XS", 256, 136, false),
    T(DSP_I8, "I8", 1, 1, false),          T(DSP_I16, "I16", 1, 2, false),
    T(DSP_I32, "I32", 1, 4, false),        T(DSP_I64, "I64", 1, 8, false),
    T(DSP_F64, "F64", 1, 8, false),        T(DSP_IQ1_M, "IQ1_M", 256, 56, false),
    T(DSP_BF16, "BF16", 1, 2, true),       T(DSP_TQ1_0, "TQ1_0", 256, 54, false),
    T(DSP_TQ2_0, "TQ2_0", 256, 66, false), T(DSP_MXFP4, "MXFP4", 32, 17, false),
};
#undef T

const dsp_dtype_traits *dsp_dtype_get(uint32_t type_id) {
    if (type_id >= DSP_DTYPE_COUNT || !g_traits[type_id].name) return NULL;
    return &g_traits[type_id];
}

const char *dsp_dtype_name(uint32_t type_id) {
    const dsp_dtype_traits *t = dsp_dtype_get(type_id);
    return t ? t->name : NULL;
}

size_t dsp_dtype_row_bytes(uint32_t type_id, uint64_t n) {
    const dsp_dtype_traits *t = dsp_dtype_get(type_id);
    if (!t || n % t->block_elems) return 0;
    uint64_t blocks = n / t->block_elems;
    if (blocks > SIZE_MAX / t->block_bytes) return 0;
    return (size_t)(blocks * t->block_bytes);
}
