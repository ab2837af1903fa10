/* Unit tests for core/quant: hand-worked blocks of a few types, unaligned sources, refusals, and
 * the can_dequant flags. The exhaustive bit-exact check against gguf-py is tests/py/test_dequant.py.
 * The Q4_K quantizer has no oracle in the gguf package: it is checked here by its round trip through
 * the (bit-exact) dequantizer, against error bounds and against Q4_0 on the same data. */
/* ctest-label: kernel */
#include "dsp_test.h"

#include "core/dtype.h"
#include "core/quant.h"

#include <math.h>

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

/* xorshift64* uniform in [0, 1) and a Box-Muller normal: deterministic test data */
static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static double unif(void) {
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return (double)((g_rng * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2.0 * log(1.0 - unif())) * cos(6.283185307179586 * unif())); }

/* RMS of x - dequantize(quantize(x)) over n floats, and the largest error relative to each
 * 32-weight sub-block's range */
static double round_trip(uint32_t type, const float *x, int n, double *worst_rel) {
    static uint8_t q[4 * 1024];
    static float y[4096];
    CHECK(dsp_quantize_row(type, x, q, (uint64_t)n) == DSP_OK);
    CHECK(dsp_dequantize_row(type, q, y, (uint64_t)n) == DSP_OK);
    double se = 0;
    *worst_rel = 0;
    for (int j = 0; j < n; j += 32) {
        float lo = 0, hi = 0; /* the range includes 0: Q4_K's min is never positive */
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[j + l]), hi = fmaxf(hi, x[j + l]);
        for (int l = 0; l < 32; l++) {
            double e = fabs((double)x[j + l] - y[j + l]);
            se += e * e;
            if (hi > lo && e / (hi - lo) > *worst_rel) *worst_rel = e / (hi - lo);
        }
    }
    return sqrt(se / n);
}

/* Whatever scales a Q4_K block chose, each weight that its sub-block's levels cover, x in
 * [-m, 15 d - m], must be on the nearest level: |x - y| <= d / 2 (up to float rounding); and
 * most weights must be covered (the least-squares fit clips a few extremes). */
static bool q4_K_steps_ok(const float *x, int n) {
    static dsp_block_q4_K q[16];
    float y[256];
    int covered = 0, bad = 0;
    CHECK(dsp_quantize_row(DSP_Q4_K, x, q, (uint64_t)n) == DSP_OK);
    for (int b = 0; b < n / 256; b++) {
        CHECK(dsp_dequantize_row(DSP_Q4_K, &q[b], y, 256) == DSP_OK);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            dsp_quant_scale_min_k4(q[b].scales, j, &sc, &m);
            float d = dsp_f16_to_f32(q[b].d) * (float)sc, mn = dsp_f16_to_f32(q[b].dmin) * (float)m;
            for (int l = 0; l < 32; l++) {
                float v = x[256 * b + 32 * j + l];
                if (!(d > 0) || v < -mn || v > 15 * d - mn) continue;
                covered++;
                bad += fabsf(v - y[32 * j + l]) > d * 0.5f * 1.0001f + 1e-6f * fabsf(v);
            }
        }
    }
    CHECK_MSG(bad == 0 && covered >= n * 9 / 10, "%d weights off their nearest level, %d of %d covered", bad, covered, n);
    return bad == 0 && covered >= n * 9 / 10;
}

static void test_q4_K_quantize(void) {
    enum { N = 4096 };
    static float x[N];
    double rel4k, rel40;
    /* Gaussian weights: 16 levels over a sub-block's range with 6-bit scales; Q4_K beats Q4_0 */
    for (int i = 0; i < N; i++) x[i] = 0.02f * normal();
    double e4k = round_trip(DSP_Q4_K, x, N, &rel4k), e40 = round_trip(DSP_Q4_0, x, N, &rel40);
    CHECK_MSG(e4k < 0.1 * 0.02 && e4k < e40, "Q4_K rms %g, Q4_0 rms %g (sigma 0.02)", e4k, e40);
    CHECK_MSG(rel4k < 0.1, "Q4_K: an error of %.3f of a sub-block's range", rel4k);
    CHECK(q4_K_steps_ok(x, N));
    /* sub-blocks of very different magnitudes in one super-block, all positive, one outlier */
    for (int i = 0; i < N; i++) x[i] = (float)((i / 32) % 8 + 1) * 0.01f * normal();
    CHECK(round_trip(DSP_Q4_K, x, N, &rel4k) > 0 && rel4k < 0.12);
    CHECK(q4_K_steps_ok(x, N));
    for (int i = 0; i < N; i++) x[i] = 1.0f + (float)unif();
    x[77] = 50.0f;
    CHECK(round_trip(DSP_Q4_K, x, N, &rel4k) > 0); /* the outlier's sub-block is fine, the others coarse */
    CHECK(q4_K_steps_ok(x, N));
    /* exact levels 0..15 come back as those levels, and zeros as zeros */
    static dsp_block_q4_K b;
    for (int i = 0; i < 256; i++) x[i] = (float)(i % 16);
    CHECK(dsp_quantize_row(DSP_Q4_K, x, &b, 256) == DSP_OK);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += (int)((b.qs[32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 15) != i % 16;
    CHECK_EQ_INT(bad, 0);
    memset(x, 0, 256 * sizeof *x);
    CHECK(dsp_quantize_row(DSP_Q4_K, x, &b, 256) == DSP_OK);
    float y[256];
    CHECK(dsp_dequantize_row(DSP_Q4_K, &b, y, 256) == DSP_OK);
    bad = b.d != 0 || b.dmin != 0;
    for (int i = 0; i < 256; i++) bad += y[i] != 0.0f;
    CHECK_EQ_INT(bad, 0);
    /* a constant negative sub-block is all minimum */
    for (int i = 0; i < 256; i++) x[i] = i < 32 ? -3.0f : 0.5f;
    CHECK(dsp_quantize_row(DSP_Q4_K, x, &b, 256) == DSP_OK && dsp_dequantize_row(DSP_Q4_K, &b, y, 256) == DSP_OK);
    CHECK_MSG(fabsf(y[0] + 3.0f) < 0.05f && fabsf(y[100] - 0.5f) < 0.05f, "y[0] = %g, y[100] = %g", y[0], y[100]);
    /* rows must be whole super-blocks */
    CHECK_EQ_INT(dsp_quantize_row(DSP_Q4_K, x, &b, 32), DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_quantize_row(DSP_Q6_K, x, &b, 256), DSP_ERR_UNSUPPORTED);
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
    DSP_RUN(test_q4_K_quantize);
    DSP_RUN(test_q8_K_and_plain);
    DSP_RUN(test_refusals);
    return dsp_test_summary();
}
