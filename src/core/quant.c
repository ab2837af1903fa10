/* core/quant: TEMPORARY, see quant.h. */
#include "core/quant.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

dsp_status dsp_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n) {
    const uint8_t *b = src;
    const dsp_dtype_traits *tr = dsp_dtype_get(type);
    if (!tr || n % tr->block_elems) return dsp_error(DSP_ERR_INVALID_ARG, "dequantize: bad type/length");
    switch (type) {
    case DSP_F32: memcpy(dst, src, n * 4); return DSP_OK;
    case DSP_F16: for (uint64_t i = 0; i < n; i++) dst[i] = dsp_f16_to_f32(rd16(b + 2 * i)); return DSP_OK;
    case DSP_BF16: for (uint64_t i = 0; i < n; i++) dst[i] = dsp_bf16_to_f32(rd16(b + 2 * i)); return DSP_OK;
    case DSP_Q8_0:
        for (uint64_t i = 0; i < n / 32; i++, b += 34) {
            float d = dsp_f16_to_f32(rd16(b));
            for (int j = 0; j < 32; j++) dst[i * 32 + j] = (float)(int8_t)b[2 + j] * d;
        }
        return DSP_OK;
    case DSP_Q4_0:
        for (uint64_t i = 0; i < n / 32; i++, b += 18) {
            float d = dsp_f16_to_f32(rd16(b));
            for (int j = 0; j < 16; j++) {
                dst[i * 32 + j] = d * (float)((b[2 + j] & 15) - 8);
                dst[i * 32 + j + 16] = d * (float)((b[2 + j] >> 4) - 8);
            }
        }
        return DSP_OK;
    case DSP_Q4_1:
        for (uint64_t i = 0; i < n / 32; i++, b += 20) {
            float d = dsp_f16_to_f32(rd16(b)), m = dsp_f16_to_f32(rd16(b + 2));
            for (int j = 0; j < 16; j++) {
                dst[i * 32 + j] = d * (float)(b[4 + j] & 15) + m;
                dst[i * 32 + j + 16] = d * (float)(b[4 + j] >> 4) + m;
            }
        }
        return DSP_OK;
    }
    return dsp_error(DSP_ERR_UNSUPPORTED, "dequantize: type %s not supported yet", tr->name);
}
