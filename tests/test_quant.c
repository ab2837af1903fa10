/* Unit tests for core/quant: hand-worked blocks of a few types, unaligned sources, refusals, and
 * the can_dequant flags. The exhaustive bit-exact check against gguf-py is tests/py/test_dequant.py. */
/* ctest-label: kernel */
#include "dsp_test.h"

#include "core/dtype.h"
#include "core/quant.h"

static void test_q4_0_q8_0(void) {
    /* Q4_0 with d = 2: qs[j] = j | (15 - j) << 4 gives y[j] = 2 (j - 8), y[j + 16] = 2 (7 - j) */
    uint8_t blk[1 + sizeof(dsp_block_q4_0)]; /* +1: decode from an odd address */
    uint8_t *p = blk + 1;
    p[0] = 0x00, p[1] = 0x40; /* f16 2.0 */
    for (int j = 0; j < 16; j++) p[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    CHECK(dsp_dequantize_row(DSP_Q4_0, p, y, 32) == DSP_OK);
    int bad = 0;
    for (int j = 0; j < 16; j++) bad += y[j] != 2.0f * (float)(j - 8) || y[j + 16] != 2.0f * (float)(7 - j);
    CHECK_EQ_INT(bad, 0);

    dsp_block_q8_0 q8 = {.d = 0x3400}; /* 0.25 */
    for (int j = 0; j < 32; j++) q8.qs[j] = (int8_t)(j * 8 - 128);
    CHECK(dsp_dequantize_row(DSP_Q8_0, &q8, y, 32) == DSP_OK);
    CHECK(y[0] == -32.0f && y[31] == 30.0f);
}

static void test_q4_K_scales(void) {
    /* sub-block 5 takes its scale from the low nibble of byte 9 plus the top bits of byte 1 */
    uint8_t sc[12] = {0};
    sc[9] = 0xA3, sc[1] = 0xC0, sc[5] = 0x80;
    uint8_t s, m;
    dsp_quant_scale_min_k4(sc, 5, &s, &m);
    CHECK_EQ_INT(s, 0x33);
    CHECK_EQ_INT(m, 0x2A);
    dsp_quant_scale_min_k4(sc, 1, &s, &m);
    CHECK_EQ_INT(s, 0);
    CHECK_EQ_INT(m, 0);

    dsp_block_q4_K b = {.d = 0x3c00, .dmin = 0x3800}; /* d = 1, dmin = 0.5 */
    b.scales[0] = 3, b.scales[4] = 2;                  /* sub-block 0: scale 3, min 2 */
    for (int l = 0; l < 128; l++) b.qs[l] = 0x5A;      /* low nibble 10, high 5 */
    float y[256];
    CHECK(dsp_dequantize_row(DSP_Q4_K, &b, y, 256) == DSP_OK);
    CHECK(y[0] == 3.0f * 10.0f - 1.0f); /* (d * 3) * 10 - dmin * 2 */
    CHECK(y[32] == 0.0f);               /* sub-block 1: scale 0, min 0 */
}

static void test_q8_K_and_plain(void) {
    static dsp_block_q8_K b;
    b.d = -0.5f;
    for (int i = 0; i < 256; i++) b.qs[i] = (int8_t)(i - 128);
    float y[256];
    CHECK(dsp_dequantize_row(DSP_Q8_K, &b, y, 256) == DSP_OK);
    CHECK(y[0] == 64.0f && y[255] == -63.5f);
    uint16_t h[2] = {0x3c00, 0xc000}, bf[2] = {0x3f80, 0xc040};
    CHECK(dsp_dequantize_row(DSP_F16, h, y, 2) == DSP_OK && y[0] == 1.0f && y[1] == -2.0f);
    CHECK(dsp_dequantize_row(DSP_BF16, bf, y, 2) == DSP_OK && y[0] == 1.0f && y[1] == -3.0f);
}

static void test_refusals(void) {
    float y[256];
    uint8_t z[512] = {0};
    CHECK_EQ_INT(dsp_dequantize_row(DSP_Q4_K, z, y, 100), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "Q4_K") != NULL);
    CHECK_EQ_INT(dsp_dequantize_row(DSP_Q8_1, z, y, 32), DSP_ERR_UNSUPPORTED);
    CHECK_EQ_INT(dsp_dequantize_row(DSP_IQ4_NL, z, y, 32), DSP_ERR_UNSUPPORTED);
    CHECK_EQ_INT(dsp_dequantize_row(4, z, y, 32), DSP_ERR_UNSUPPORTED);
    CHECK_EQ_INT(dsp_dequantize_row(1u << 31, z, y, 32), DSP_ERR_UNSUPPORTED);
    CHECK_EQ_INT(dsp_dequantize_row(DSP_Q6_K, z, y, 0), DSP_OK);
    /* can_dequant is set for exactly the types the reference handles */
    int n = 0;
    for (uint32_t id = 0; id < DSP_DTYPE_COUNT; id++) {
        const dsp_dtype_traits *t = dsp_dtype_get(id);
        if (!t) continue;
        dsp_status st = dsp_dequantize_row(id, z, y, t->block_elems);
        CHECK_MSG((st == DSP_OK) == t->can_dequant, "%s: %s", t->name, dsp_last_error());
        n += t->can_dequant;
    }
    CHECK_EQ_INT(n, 14);
}

int main(void) {
    DSP_RUN(test_q4_0_q8_0);
    DSP_RUN(test_q4_K_scales);
    DSP_RUN(test_q8_K_and_plain);
    DSP_RUN(test_refusals);
    return dsp_test_summary();
}
