/* Kernel conformance: every fast CPU kernel table (AVX2, AVX-512; whichever this CPU can run)
 * against the scalar reference on random data with odd and tail shapes, plus batch invariance.
 *
 *  - dequant_row: bitwise equal to dsp_dequantize_row (the gguf-exact oracle) for every type;
 *  - matmul: NMSE vs the reference matmul below 1e-10, and bitwise equal to the documented 32-lane
 *    FMA order (dsp_cpu_dot32_fma_ref over dequantized rows), for 1 and many activation rows;
 *  - batch invariance: each output of an n-row matmul is bitwise the 1-row result, whatever n
 *    (crossing the fused/scratch paths), the weight-row split (thread chunks) or the row offset;
 *  - AVX2 and AVX-512 matmuls/dots are bitwise equal where both run;
 *  - dot, rmsnorm, softmax, SwiGLU, axpy, argmax vs the reference (NMSE, or exact where the
 *    kernel promises it);
 *  - the sampler's kernels (sample_weights, sample_mass, sample_probs, sample_keys): bitwise equal
 *    to the reference, weights, sums, p and kept lists, keys and block maxima, at every tail
 *    length, with -inf logits, weights through the subnormals to 0, and each keep rule;
 *  - 8-bit activations: quantize_q8 bitwise equal to the scalar quantizer (odd values, zero, NaN
 *    and inf blocks); matmul_q8 bitwise equal to the q8 block order (dsp_cpu_q8_dot_ref) for 1 and
 *    n rows, any weight-row split, every q8 weight type, tails; and the oracle itself against a
 *    double-precision dot of the dequantized weights and activations (catches a lost offset/min).
 * Prints which tables ran; a table this CPU cannot run is reported as skipped. */
/* ctest-label: kernel */
#include "dsp_test.h"

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "rand_weights.h"
#include "sample/sample.h"
#include "sample/sample_kernels.h"

#include <float.h>
#include <math.h>

static const uint32_t g_types[] = {DSP_F32, DSP_F16, DSP_BF16, DSP_Q4_0, DSP_Q4_1, DSP_Q5_0, DSP_Q8_0, DSP_Q4_K, DSP_Q5_K, DSP_Q6_K};
#define N_TYPES (int)(sizeof g_types / sizeof g_types[0])

static int block_of(uint32_t type) { return (int)dsp_dtype_get(type)->block_elems; }

static const dsp_cpu_ops *g_tables[5];
static int g_n_tables;

/* ---- dequantization --------------------------------------------------------------------------- */

static void test_dequant_exact(void) {
    for (int t = 0; t < g_n_tables; t++)
        for (int ti = 0; ti < N_TYPES; ti++) {
            uint32_t type = g_types[ti];
            int64_t n = block_of(type) == 1 ? 1000 + 7 : (int64_t)block_of(type) * 5;
            uint8_t *row = xalloc(dsp_dtype_row_bytes(type, (uint64_t)n));
            float *a = xalloc(sizeof(float) * (size_t)n), *b = xalloc(sizeof(float) * (size_t)n);
            for (int rep = 0; rep < 20; rep++) {
                random_row(type, row, n);
                dsp_dequantize_row(type, row, b, (uint64_t)n);
                g_tables[t]->dequant_row(type, row, a, n);
                CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)n), "%s dequant %s not bit-exact", g_tables[t]->name, dsp_dtype_name(type));
            }
            free(row), free(a), free(b);
        }
}

/* ---- matmul ----------------------------------------------------------------------------------- */

typedef struct mm_case {
    uint32_t type;
    int64_t in, out;
} mm_case;

static void run_mm(const dsp_cpu_ops *o, const mm_case *c, const uint8_t *w, const float *x, int n_x, float *y, float *scratch) {
    size_t rb = dsp_dtype_row_bytes(c->type, (uint64_t)c->in);
    o->matmul(c->type, w, rb, c->in, 0, c->out, x, c->in, n_x, y, c->out, scratch);
}

static void test_matmul(void) {
    const int n_rows_list[] = {1, 2, 3, 4, 5, 8, 9, 13, 16, 17, 40, 70};
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = g_types[ti];
        int blk = block_of(type);
        /* odd shapes: few blocks, tails past the 32 lanes for the float types, odd row counts */
        mm_case cases[3];
        int nc = 0;
        if (blk == 1) {
            cases[nc++] = (mm_case){type, 33, 7};
            cases[nc++] = (mm_case){type, 100, 19};
            cases[nc++] = (mm_case){type, 576, 37};
        } else {
            cases[nc++] = (mm_case){type, blk, 5};
            cases[nc++] = (mm_case){type, blk * 3, 19};
            cases[nc++] = (mm_case){type, blk == 32 ? 576 : 768, 37};
        }
        for (int ci = 0; ci < nc; ci++) {
            const mm_case *c = &cases[ci];
            size_t rb = dsp_dtype_row_bytes(type, (uint64_t)c->in);
            int max_x = 70;
            uint8_t *w = xalloc(rb * (size_t)c->out);
            for (int64_t r = 0; r < c->out; r++) random_row(type, w + (size_t)r * rb, c->in);
            float *x = xalloc(sizeof(float) * (size_t)(c->in * max_x));
            for (int64_t i = 0; i < c->in * max_x; i++) x[i] = frnd();
            float *scratch = xalloc(sizeof(float) * DSP_CPU_MM_ROWS * (size_t)dsp_cpu_mm_stride(c->in));
            float *yref = xalloc(sizeof(float) * (size_t)(c->out * max_x));
            float *y1 = xalloc(sizeof(float) * (size_t)(c->out * max_x));
            float *yn = xalloc(sizeof(float) * (size_t)(c->out * max_x));
            float *yo = xalloc(sizeof(float) * (size_t)(c->out * max_x));
            float *wd = xalloc(sizeof(float) * (size_t)(c->in * c->out));
            for (int64_t r = 0; r < c->out; r++) dsp_dequantize_row(type, w + (size_t)r * rb, wd + r * c->in, (uint64_t)c->in);
            run_mm(&dsp_cpu_ops_scalar, c, w, x, max_x, yref, scratch);
            for (int t = 0; t < g_n_tables; t++) {
                const dsp_cpu_ops *o = g_tables[t];
                /* one activation row at a time: the batch-invariance reference */
                for (int i = 0; i < max_x; i++) run_mm(o, c, w, x + i * c->in, 1, y1 + i * c->out, scratch);
                double e = nmse(y1, yref, c->out * max_x);
                CHECK_MSG(e < 1e-10, "%s matmul %s %lldx%lld: NMSE %.3g vs reference", o->name, dsp_dtype_name(type), (long long)c->out,
                          (long long)c->in, e);
                if (o != &dsp_cpu_ops_scalar) { /* the documented order, bit for bit */
                    int bad = 0;
                    for (int i = 0; i < max_x; i++)
                        for (int64_t r = 0; r < c->out; r++)
                            if (y1[i * c->out + r] != dsp_cpu_dot32_fma_ref(x + i * c->in, wd + r * c->in, c->in)) bad++;
                    CHECK_MSG(!bad, "%s matmul %s %lldx%lld: %d outputs differ from the 32-lane FMA order", o->name, dsp_dtype_name(type),
                              (long long)c->out, (long long)c->in, bad);
                }
                for (size_t k = 0; k < sizeof n_rows_list / sizeof *n_rows_list; k++) {
                    int n_x = n_rows_list[k];
                    run_mm(o, c, w, x, n_x, yn, scratch);
                    CHECK_MSG(!memcmp(yn, y1, sizeof(float) * (size_t)(c->out * n_x)), "%s matmul %s: %d rows != 1 row at a time", o->name,
                              dsp_dtype_name(type), n_x);
                }
                /* the weight-row split of the thread pool: odd pieces, same values */
                for (int64_t r0 = 0; r0 < c->out;) {
                    int64_t r1 = r0 + 1 + (int64_t)(rnd() % 7);
                    if (r1 > c->out) r1 = c->out;
                    o->matmul(type, w, rb, c->in, r0, r1, x, c->in, 9, yo, c->out, scratch);
                    r0 = r1;
                }
                CHECK_MSG(!memcmp(yo, y1, sizeof(float) * (size_t)(c->out * 9)), "%s matmul %s: row split changes values", o->name,
                          dsp_dtype_name(type));
            }
            free(w), free(x), free(scratch), free(yref), free(y1), free(yn), free(yo), free(wd);
        }
    }
}

static void test_cross_isa(void) {
    const dsp_cpu_ops *a = dsp_cpu_ops_get("avx2"), *b = dsp_cpu_ops_get("avx512");
    if (!a || !b) {
        printf("  cross-ISA check skipped (needs both AVX2 and AVX-512)\n");
        return;
    }
    for (int ti = 0; ti < N_TYPES; ti++) {
        mm_case c = {g_types[ti], block_of(g_types[ti]) == 1 ? 77 : block_of(g_types[ti]) * 2, 21};
        size_t rb = dsp_dtype_row_bytes(c.type, (uint64_t)c.in);
        uint8_t *w = xalloc(rb * (size_t)c.out);
        for (int64_t r = 0; r < c.out; r++) random_row(c.type, w + (size_t)r * rb, c.in);
        float *x = xalloc(sizeof(float) * (size_t)c.in * 11), *ya = xalloc(sizeof(float) * (size_t)c.out * 11),
              *yb = xalloc(sizeof(float) * (size_t)c.out * 11);
        float *scratch = xalloc(sizeof(float) * DSP_CPU_MM_ROWS * (size_t)dsp_cpu_mm_stride(c.in));
        for (int64_t i = 0; i < c.in * 11; i++) x[i] = frnd();
        run_mm(a, &c, w, x, 11, ya, scratch);
        run_mm(b, &c, w, x, 11, yb, scratch);
        CHECK_MSG(!memcmp(ya, yb, sizeof(float) * (size_t)c.out * 11), "avx2 and avx512 matmul %s differ", dsp_dtype_name(c.type));
        CHECK(a->dot(x, x + c.in, c.in) == b->dot(x, x + c.in, c.in));
        free(w), free(x), free(ya), free(yb), free(scratch);
    }
}

/* ---- 8-bit activations ------------------------------------------------------------------------ */

/* activations with block magnitudes spread over decades, a zero block, outliers, and values that
 * land exactly on .5 after scaling (round-to-even ties) */
static void random_acts(float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float mag = powf(10.0f, (float)(rnd() % 7) - 4.0f);
        const int kind = (int)(rnd() % 8);
        for (int k = 0; k < 32; k++) x[32 * b + k] = kind == 0 ? 0.0f : mag * frnd();
        if (kind == 1) x[32 * b + (int)(rnd() % 32)] = 50 * mag; /* an outlier */
        if (kind == 2) {                                         /* ties: amax 127 -> scale 1 */
            for (int k = 0; k < 32; k++) x[32 * b + k] = (float)((int)(rnd() % 254) - 127) + 0.5f * (float)(rnd() % 2);
            x[32 * b] = 127.0f;
        }
    }
}

static const uint32_t g_q8_types[] = {DSP_Q4_0, DSP_Q4_1, DSP_Q8_0, DSP_Q4_K, DSP_Q5_K, DSP_Q6_K};
#define N_Q8_TYPES (int)(sizeof g_q8_types / sizeof g_q8_types[0])

static void test_q8_quantize(void) {
    const int64_t lens[] = {32, 64, 96, 256, 288, 576, 1056, 3072};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li], nbp = dsp_cpu_q8_nbp(n);
        const size_t rb = dsp_cpu_q8_row_bytes(n);
        float *x = xalloc(sizeof(float) * (size_t)n);
        uint8_t *a = xalloc(rb), *b = xalloc(rb);
        for (int rep = 0; rep < 10; rep++) {
            random_acts(x, n);
            if (rep == 9) x[0] = NAN, x[n - 1] = INFINITY, x[n / 2] = -INFINITY; /* garbage in: defined, identical out */
            memset(a, 0xAB, rb);
            dsp_cpu_quantize_q8(x, n, a);
            if (rep < 9) { /* the oracle itself: |x - dx * q| <= dx / 2, sums and lane copies consistent */
                const int8_t *q = dsp_cpu_q8_q(a), *qn = dsp_cpu_q8_qn(a, nbp);
                const float *d = dsp_cpu_q8_d(a, nbp), *sx = dsp_cpu_q8_s(a, nbp);
                const int32_t *nS = dsp_cpu_q8_nS(a, nbp), *nSlo = dsp_cpu_q8_nSlo(a, nbp), *nShi = dsp_cpu_q8_nShi(a, nbp);
                int bad = 0;
                for (int64_t bl = 0; bl < nbp; bl++) {
                    int32_t sum[2][2] = {{0, 0}, {0, 0}};
                    const float dx = d[2 * bl];
                    for (int k = 0; k < 32; k++) {
                        const int64_t e = dsp_cpu_q8_index(bl, k);
                        if (bl < n / 32 && fabs((double)x[32 * bl + k] - (double)dx * q[e]) > 0.5001 * dx + 1e-30) bad++;
                        if (bl >= n / 32 && q[e] != 0) bad++;
                        sum[k / 16][(k / 4) % 2] += q[e];
                        if (qn[32 * bl + k] != q[e]) bad++; /* the natural-order copy */
                    }
                    for (int h = 0; h < 2; h++)
                        if (-nSlo[2 * bl + h] != sum[0][h] || -nShi[2 * bl + h] != sum[1][h] || -nS[2 * bl + h] != sum[0][h] + sum[1][h]) bad++;
                    if (sx[2 * bl] != dx * (float)(sum[0][0] + sum[0][1] + sum[1][0] + sum[1][1]) || d[2 * bl + 1] != dx || sx[2 * bl + 1] != 0) bad++;
                }
                CHECK_MSG(!bad, "quantize_q8 n=%lld: %d bad values", (long long)n, bad);
            }
            for (int t = 0; t < g_n_tables; t++) {
                memset(b, 0xCD, rb);
                g_tables[t]->quantize_q8(x, n, b);
                CHECK_MSG(!memcmp(a, b, rb), "%s quantize_q8 n=%lld differs from the scalar quantizer (rep %d)", g_tables[t]->name,
                          (long long)n, rep);
            }
        }
        free(x), free(a), free(b);
    }
}

/* y within 1e-5 (relative to the sum of |products|) of the double-precision dot of the dequantized
 * weights wd with the values of q8 row xr */
static int near_deq_dot(float y, const float *wd, const uint8_t *xr, int64_t in) {
    const int64_t nbp = dsp_cpu_q8_nbp(in);
    double exact = 0, mag = 0;
    for (int64_t k = 0; k < in; k++) {
        const double xv = (double)dsp_cpu_q8_d(xr, nbp)[2 * (k / 32)] * dsp_cpu_q8_q(xr)[dsp_cpu_q8_index(k / 32, (int)(k % 32))];
        exact += (double)wd[k] * xv, mag += fabs((double)wd[k] * xv);
    }
    return fabs((double)y - exact) <= 1e-5 * mag + 1e-30;
}

static void test_q8_matmul(void) {
    const int n_rows_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 40};
    const int max_x = 40;
    for (int ti = 0; ti < N_Q8_TYPES; ti++) {
        const uint32_t type = g_q8_types[ti];
        CHECK(dsp_cpu_q8_type(type));
        const int blk = block_of(type);
        /* legacy types: a single block, a partial last step (18 blocks), whole steps; K-quants: 1, 3, 8 super-blocks */
        const int64_t ins[3] = {blk == 32 ? 32 : 256, blk == 32 ? 576 : 768, blk == 32 ? 1024 : 2048};
        const int64_t outs[3] = {5, 19, 37};
        for (int ci = 0; ci < 3; ci++) {
            const int64_t in = ins[ci], out = outs[ci];
            const size_t rb = dsp_dtype_row_bytes(type, (uint64_t)in), qb = dsp_cpu_q8_row_bytes(in);
            uint8_t *w = xalloc(rb * (size_t)out), *xq = xalloc(qb * (size_t)max_x);
            float *x = xalloc(sizeof(float) * (size_t)(in * max_x)), *wd = xalloc(sizeof(float) * (size_t)in);
            float *yref = xalloc(sizeof(float) * (size_t)(out * max_x)), *yn = xalloc(sizeof(float) * (size_t)(out * max_x));
            for (int64_t r = 0; r < out; r++) random_row(type, w + (size_t)r * rb, in);
            random_acts(x, in * max_x);
            for (int i = 0; i < max_x; i++) dsp_cpu_quantize_q8(x + i * in, in, xq + (size_t)i * qb);
            int bad = 0;
            for (int64_t r = 0; r < out; r++) {
                dsp_dequantize_row(type, w + (size_t)r * rb, wd, (uint64_t)in);
                for (int i = 0; i < max_x; i++) {
                    const uint8_t *xr = xq + (size_t)i * qb;
                    const float y = dsp_cpu_q8_dot_ref(type, w + (size_t)r * rb, xr, in);
                    yref[i * out + r] = y;
                    /* the integer formulation against float arithmetic on the dequantized values */
                    bad += !near_deq_dot(y, wd, xr, in);
                }
            }
            CHECK_MSG(!bad, "q8 oracle %s %lldx%lld: %d dots off the dequantized double-precision dot", dsp_dtype_name(type), (long long)out,
                      (long long)in, bad);
            for (int t = 0; t < g_n_tables; t++) {
                const dsp_cpu_ops *o = g_tables[t];
                int bad1 = 0;
                for (int i = 0; i < max_x; i++) {
                    o->matmul_q8(type, w, rb, in, 0, out, xq + (size_t)i * qb, qb, 1, yn + i * out, out);
                    for (int64_t r = 0; r < out; r++) bad1 += yn[i * out + r] != yref[i * out + r];
                }
                CHECK_MSG(!bad1, "%s matmul_q8 %s %lldx%lld: %d of 1-row outputs differ from the q8 block order", o->name, dsp_dtype_name(type),
                          (long long)out, (long long)in, bad1);
                for (size_t k = 0; k < sizeof n_rows_list / sizeof *n_rows_list; k++) {
                    const int n_x = n_rows_list[k];
                    o->matmul_q8(type, w, rb, in, 0, out, xq, qb, n_x, yn, out);
                    CHECK_MSG(!memcmp(yn, yref, sizeof(float) * (size_t)(out * n_x)), "%s matmul_q8 %s %lld: %d rows differ from the q8 block order",
                              o->name, dsp_dtype_name(type), (long long)in, n_x);
                }
                for (int64_t r0 = 0; r0 < out;) { /* the pool's weight-row split */
                    int64_t r1 = r0 + 1 + (int64_t)(rnd() % 7);
                    if (r1 > out) r1 = out;
                    o->matmul_q8(type, w, rb, in, r0, r1, xq, qb, 9, yn, out);
                    r0 = r1;
                }
                CHECK_MSG(!memcmp(yn, yref, sizeof(float) * (size_t)(out * 9)), "%s matmul_q8 %s: row split changes values", o->name,
                          dsp_dtype_name(type));
            }
            free(w), free(xq), free(x), free(wd), free(yref), free(yn);
        }
    }
    CHECK(!dsp_cpu_q8_type(DSP_F32) && !dsp_cpu_q8_type(DSP_F16) && !dsp_cpu_q8_type(DSP_Q5_0));
}

/* The largest integer sums the kernels form: every weight code at its maximum (Q4: 15, Q5_K: 31,
 * Q6_K: 63; the scales stay random) against activations that all quantize to +127 or -127. The
 * tables without VNNI add vpmaddubsw's 16-bit sums of several vectors before widening (q8_impl.h,
 * Q8_SUM16): an overflow there would show as a difference from the q8 block order. */
static void test_q8_extremes(void) {
    static const struct { uint32_t type; int lo, hi; } codes[] = { /* bytes [lo, hi) of a block hold the codes */
        {DSP_Q4_0, 2, 18}, {DSP_Q4_1, 4, 20}, {DSP_Q4_K, 16, 144}, {DSP_Q5_K, 16, 176}, {DSP_Q6_K, 0, 192}};
    const int64_t in = 1024, out = 3;
    const int n_x = 9;
    for (size_t ti = 0; ti < sizeof codes / sizeof *codes; ti++) {
        const uint32_t type = codes[ti].type;
        const dsp_dtype_traits *di = dsp_dtype_get(type);
        const size_t rb = dsp_dtype_row_bytes(type, (uint64_t)in), qb = dsp_cpu_q8_row_bytes(in);
        uint8_t *w = xalloc(rb * (size_t)out), *xq = xalloc(qb * (size_t)n_x);
        float *x = xalloc(sizeof(float) * (size_t)in), *yref = xalloc(sizeof(float) * (size_t)(out * n_x)), *yn = xalloc(sizeof(float) * (size_t)(out * n_x));
        for (int64_t r = 0; r < out; r++) {
            random_row(type, w + (size_t)r * rb, in);
            for (int64_t b = 0; b < in / (int64_t)di->block_elems; b++)
                memset(w + (size_t)r * rb + (size_t)b * di->block_bytes + codes[ti].lo, 0xFF, (size_t)(codes[ti].hi - codes[ti].lo));
        }
        for (int i = 0; i < n_x; i++) { /* +1 everywhere, -1 everywhere, then mixed signs per block */
            for (int64_t k = 0; k < in; k++) x[k] = i == 0 ? 1.0f : i == 1 ? -1.0f : ((k / 32 + i) % 3 ? 1.0f : -1.0f);
            dsp_cpu_quantize_q8(x, in, xq + (size_t)i * qb);
        }
        for (int i = 0; i < n_x; i++)
            for (int64_t r = 0; r < out; r++) yref[i * out + r] = dsp_cpu_q8_dot_ref(type, w + (size_t)r * rb, xq + (size_t)i * qb, in);
        for (int t = 0; t < g_n_tables; t++) {
            const dsp_cpu_ops *o = g_tables[t];
            for (int nx = 1; nx <= n_x; nx++) {
                o->matmul_q8(type, w, rb, in, 0, out, xq, qb, nx, yn, out);
                CHECK_MSG(!memcmp(yn, yref, sizeof(float) * (size_t)(out * nx)), "%s matmul_q8 %s, codes at their maximum, %d rows: differs from the q8 block order",
                          o->name, dsp_dtype_name(type), nx);
            }
        }
        free(w), free(xq), free(x), free(yref), free(yn);
    }
}

/* ---- small kernels ---------------------------------------------------------------------------- */

static void test_small(void) {
    const int64_t lens[] = {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 576, 1000, 1537};
    float *a = xalloc(sizeof(float) * 2048), *b = xalloc(sizeof(float) * 2048), *w = xalloc(sizeof(float) * 2048);
    float *r1 = xalloc(sizeof(float) * 2048), *r2 = xalloc(sizeof(float) * 2048), *cs = xalloc(sizeof(float) * 256);
    for (int t = 0; t < g_n_tables; t++) {
        const dsp_cpu_ops *o = g_tables[t];
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            int64_t n = lens[li];
            for (int64_t i = 0; i < n; i++) a[i] = 3 * frnd(), b[i] = 3 * frnd(), w[i] = 1 + 0.1f * frnd();
            float d0 = dsp_cpu_dot_f32(a, b, n), d1 = o->dot(a, b, n);
            double mag = 0;
            for (int64_t i = 0; i < n; i++) mag += fabs((double)a[i] * b[i]);
            CHECK_MSG(fabs((double)d0 - d1) <= 1e-6 * mag + 1e-30, "%s dot n=%lld: %g vs %g", o->name, (long long)n, d1, d0);
            if (o != &dsp_cpu_ops_scalar) CHECK_MSG(d1 == dsp_cpu_dot32_fma_ref(a, b, n), "%s dot n=%lld not in the 32-lane order", o->name, (long long)n);

            dsp_cpu_rmsnorm(r1, a, w, n, 1e-5f);
            o->rmsnorm(r2, a, w, n, 1e-5f);
            CHECK_MSG(nmse(r2, r1, n) < 1e-12, "%s rmsnorm n=%lld", o->name, (long long)n);
            memcpy(r2, a, sizeof(float) * (size_t)n);
            o->rmsnorm(r2, r2, NULL, n, 1e-5f); /* in place, no weight */
            dsp_cpu_rmsnorm(r1, a, NULL, n, 1e-5f);
            CHECK_MSG(nmse(r2, r1, n) < 1e-12, "%s rmsnorm in place n=%lld", o->name, (long long)n);

            for (int64_t i = 0; i < n; i++) r1[i] = r2[i] = 20 * a[i];
            if (n > 3) r1[3] = r2[3] = -INFINITY; /* a masked score */
            dsp_cpu_softmax(r1, n);
            o->softmax(r2, n);
            CHECK_MSG(nmse(r2, r1, n) < 1e-12, "%s softmax n=%lld: NMSE %g", o->name, (long long)n, nmse(r2, r1, n));
            if (n > 3) CHECK(r2[3] == 0.0f);

            for (int64_t i = 0; i < n; i++) r1[i] = r2[i] = 8 * a[i];
            dsp_cpu_swiglu(r1, b, n);
            o->swiglu(r2, b, n);
            CHECK_MSG(nmse(r2, r1, n) < 1e-12, "%s swiglu n=%lld: NMSE %g", o->name, (long long)n, nmse(r2, r1, n));

            memcpy(r1, b, sizeof(float) * (size_t)n);
            memcpy(r2, b, sizeof(float) * (size_t)n);
            dsp_cpu_axpy(r1, 0.37f, a, n);
            o->axpy(r2, 0.37f, a, n);
            CHECK_MSG(!memcmp(r1, r2, sizeof(float) * (size_t)n), "%s axpy n=%lld not exact", o->name, (long long)n);

            for (int64_t i = 0; i < n; i++) r1[i] = (float)(rnd() % 50); /* ties: the first index wins */
            CHECK_EQ_INT(o->argmax(r1, n), dsp_cpu_argmax(r1, n));
        }
        /* exp range: softmax of extreme gaps stays finite and normalized */
        for (int i = 0; i < 64; i++) r2[i] = (float)(i * 10 - 320);
        o->softmax(r2, 64);
        double s = 0;
        for (int i = 0; i < 64; i++) {
            s += r2[i];
            CHECK(isfinite(r2[i]));
        }
        CHECK_MSG(fabs(s - 1) < 1e-5, "%s softmax sum %g", o->name, s);
        /* rope: both conventions, vs the reference */
        for (int neox = 0; neox < 2; neox++) {
            for (int i = 0; i < 64; i++) cs[2 * i] = cosf(0.1f * i), cs[2 * i + 1] = sinf(0.1f * i);
            for (int i = 0; i < 128; i++) r1[i] = r2[i] = frnd();
            dsp_cpu_rope(r1, cs, 96, neox);
            o->rope(r2, cs, 96, neox);
            CHECK(nmse(r2, r1, 128) < 1e-12);
        }
    }
    free(a), free(b), free(w), free(r1), free(r2), free(cs);
}

/* dots / axpys (attention over a chunk of keys): each table's bits equal its own dot and axpy called
 * key by key, for head sizes on and off its vector paths and chunks of every length up to 37 (the
 * AVX-512 dots take 16 keys at a time, then 4, then one); and
 * dots16 / axpys16 over f16 and bf16 rows equal dots / axpys over the same rows widened */
static void test_attention_chunks(void) {
    const int64_t lens[] = {8, 40, 64, 96, 128, 136, 256};
    enum { MAXT = 37, MAXN = 256 };
    float *keys = xalloc(sizeof(float) * MAXT * MAXN), *q = xalloc(sizeof(float) * MAXN), *p = xalloc(sizeof(float) * MAXT);
    float *o1 = xalloc(sizeof(float) * MAXN), *o2 = xalloc(sizeof(float) * MAXN), *s1 = xalloc(sizeof(float) * MAXT), *s2 = xalloc(sizeof(float) * MAXT);
    const float *rows[MAXT], *wrows[MAXT];
    uint16_t *keys16 = xalloc(sizeof(uint16_t) * MAXT * MAXN);
    float *wide = xalloc(sizeof(float) * MAXT * MAXN);
    const uint16_t *rows16[MAXT];
    for (int t = 0; t < g_n_tables; t++) {
        const dsp_cpu_ops *o = g_tables[t];
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            const int64_t n = lens[li];
            for (int nt = 1; nt <= MAXT; nt++) {
                for (int64_t i = 0; i < n; i++) q[i] = 2 * frnd(), o1[i] = o2[i] = frnd();
                for (int k = 0; k < nt; k++) {
                    rows[k] = keys + (size_t)((k * 7) % MAXT) * MAXN; /* rows in no memory order */
                    p[k] = frnd();
                }
                for (int64_t i = 0; i < MAXT * MAXN; i++) keys[i] = 3 * frnd();
                o->dots(q, rows, nt, n, 0.125f, s2);
                for (int k = 0; k < nt; k++) s1[k] = o->dot(q, rows[k], n) * 0.125f;
                CHECK_MSG(!memcmp(s1, s2, sizeof(float) * (size_t)nt), "%s dots n=%lld nt=%d != dot per key", o->name, (long long)n, nt);
                o->axpys(o2, p, rows, nt, n);
                for (int k = 0; k < nt; k++) o->axpy(o1, p[k], rows[k], n);
                CHECK_MSG(!memcmp(o1, o2, sizeof(float) * (size_t)n), "%s axpys n=%lld nt=%d != axpy per key", o->name, (long long)n, nt);
                /* 16-bit K/V rows (f16, bf16): the f32 kernels' bits on the rows widened */
                for (int bf = 0; bf < 2; bf++) {
                    for (int64_t i = 0; i < MAXT * MAXN; i++) {
                        keys16[i] = bf ? dsp_f32_to_bf16(keys[i]) : dsp_f32_to_f16(keys[i]);
                        wide[i] = bf ? dsp_bf16_to_f32(keys16[i]) : dsp_f16_to_f32(keys16[i]);
                    }
                    for (int k = 0; k < nt; k++) rows16[k] = keys16 + (rows[k] - keys), wrows[k] = wide + (rows[k] - keys);
                    o->dots(q, wrows, nt, n, 0.125f, s1);
                    o->dots16(q, rows16, nt, n, 0.125f, s2, bf);
                    CHECK_MSG(!memcmp(s1, s2, sizeof(float) * (size_t)nt), "%s dots16 (%s) n=%lld nt=%d != dots of the widened rows", o->name,
                              bf ? "bf16" : "f16", (long long)n, nt);
                    for (int64_t i = 0; i < n; i++) o2[i] = o1[i];
                    o->axpys(o1, p, wrows, nt, n);
                    o->axpys16(o2, p, rows16, nt, n, bf);
                    CHECK_MSG(!memcmp(o1, o2, sizeof(float) * (size_t)n), "%s axpys16 (%s) n=%lld nt=%d != axpys of the widened rows",
                              o->name, bf ? "bf16" : "f16", (long long)n, nt);
                }
            }
        }
    }
    free(keys), free(q), free(p), free(o1), free(o2), free(s1), free(s2), free(keys16), free(wide);
}

/* panel matmuls (ops.h "panel order": Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K): the oracle against double precision
 * on the dequantized weights, then every table against the oracle bit for bit, for row counts on
 * both sides of the vector pass (4 / 8 rows) and of AMX's 16-row groups (with AMX on and off where it
 * runs), output counts that leave a partial panel, and row ranges as the backend's tasks split them */
static void test_panels(void) {
    static const uint32_t types[] = {DSP_Q4_0, DSP_Q4_1, DSP_Q8_0, DSP_Q4_K, DSP_Q5_K, DSP_Q6_K};
    const int n_types = (int)(sizeof types / sizeof *types);
    CHECK(!dsp_cpu_panel_type(DSP_Q5_0) && !dsp_cpu_panel_type(DSP_F32));
    const int n_rows_list[] = {1, 2, 3, 4, 5, 8, 9, 11, 12, 13, 15, 16, 17, 29, 32, 33, 40};
    const int max_x = 40;
    const int64_t outs[3] = {5, 37, 64};
    for (int ci = 0; ci < 3 * n_types; ci++) {
        const uint32_t type = types[ci / 3];
        CHECK(dsp_cpu_panel_type(type));
        /* legacy types: one block, a partial 8-block group, whole groups; K types: 1, 3, 6 super-blocks */
        const int64_t ins_l[3] = {32, 576, 1024}, ins_k[3] = {256, 768, 1536};
        const int64_t in = dsp_cpu_panel_kq(type) ? ins_k[ci % 3] : ins_l[ci % 3], out = outs[ci % 3];
        const size_t rb = dsp_dtype_row_bytes(type, (uint64_t)in), qb = dsp_cpu_q8_row_bytes(in);
        uint8_t *w = xalloc(rb * (size_t)out), *xq = xalloc(qb * (size_t)max_x), *pw = xalloc(dsp_cpu_panel_bytes(type, in, out));
        float *x = xalloc(sizeof(float) * (size_t)(in * max_x)), *wd = xalloc(sizeof(float) * (size_t)(in * out));
        float *yref = xalloc(sizeof(float) * (size_t)(out * max_x)), *yn = xalloc(sizeof(float) * (size_t)(out * max_x));
        for (int64_t r = 0; r < out; r++) random_row(type, w + (size_t)r * rb, in);
        random_acts(x, in * max_x);
        for (int i = 0; i < max_x; i++) dsp_cpu_quantize_q8(x + i * in, in, xq + (size_t)i * qb);
        dsp_cpu_make_panels(type, w, rb, in, out, pw);
        { /* the regions end where dsp_cpu_panel_bytes says */
            const dsp_cpu_panel_map r = dsp_cpu_panel_regions(type, pw, in, out);
            const int64_t np = (out + 15) / 16;
            const uint8_t *end = r.sc ? r.sc + np * r.nb * 32 : (const uint8_t *)((r.m ? r.m : r.d) + np * r.nd * 16);
            CHECK(end - pw == (ptrdiff_t)dsp_cpu_panel_bytes(type, in, out));
        }
        dsp_cpu_ref_matmul_panel(type, pw, in, out, 0, out, xq, qb, max_x, yref, out);
        int bad = 0;
        for (int64_t r = 0; r < out; r++) {
            dsp_dequantize_row(type, w + (size_t)r * rb, wd, (uint64_t)in);
            for (int i = 0; i < max_x; i++) {
                const uint8_t *xr = xq + (size_t)i * qb;
                bad += !near_deq_dot(yref[i * out + r], wd, xr, in);
            }
        }
        CHECK_MSG(!bad, "panel oracle %s %lldx%lld: %d dots off the dequantized double-precision dot", dsp_dtype_name(type), (long long)out,
                  (long long)in, bad);
        for (int t = 0; t < g_n_tables; t++) {
            const dsp_cpu_ops *o = g_tables[t];
            for (int amx = 0; amx < 2; amx++) {
                dsp_cpu_amx_override(amx);
                if (amx && !dsp_cpu_amx_usable()) continue;
                for (size_t ni = 0; ni < sizeof n_rows_list / sizeof *n_rows_list; ni++) {
                    const int n = n_rows_list[ni];
                    memset(yn, 0xff, sizeof(float) * (size_t)(out * max_x));
                    /* two tasks: rows [0, 16) and [16, out) when out > 16, as guided_split cuts */
                    const int64_t cut = out > 16 ? 16 : out;
                    o->matmul_panel(type, pw, in, out, 0, cut, xq, qb, n, yn, out);
                    if (cut < out) o->matmul_panel(type, pw, in, out, cut, out, xq, qb, n, yn, out);
                    int bad1 = 0;
                    for (int i = 0; i < n; i++)
                        for (int64_t r = 0; r < out; r++) bad1 += memcmp(&yn[i * out + r], &yref[i * out + r], sizeof(float)) != 0;
                    CHECK_MSG(!bad1, "%s panel matmul %s %lldx%lld, %d rows%s: %d outputs differ from the oracle", o->name, dsp_dtype_name(type),
                              (long long)out, (long long)in, n, amx ? " (AMX)" : "", bad1);
                }
            }
        }
        dsp_cpu_amx_override(1);
        free(w), free(xq), free(pw), free(x), free(wd), free(yref), free(yn);
    }
    printf("  AMX: %s\n", dsp_cpu_amx_usable() ? "used from 12 rows, in groups of 16 or one of 12-15 (tested)" : "not available here");
}

static void test_selection(void) {
    const dsp_cpu_ops *best = dsp_cpu_ops_best();
    CHECK(best != NULL);
    CHECK(dsp_cpu_ops_get("scalar") == &dsp_cpu_ops_scalar);
    CHECK(dsp_cpu_ops_get("nonsense") == NULL);
    const char *sup = dsp_cpu_isa_supported();
    CHECK(dsp_cpu_ops_get(sup) != NULL);
    printf("  CPU supports: %s; in use: %s\n", sup, best->name);
}

/* argmax is the sampler's greedy rule (ops.h): every table, the reference and dsp_sample_argmax agree
 * on ties, NaN (read as -inf), +inf (read as FLT_MAX, so it ties with FLT_MAX), rows without a finite
 * value (-1), at every position relative to the vector width and the 4-vector unroll */
static void test_argmax(void) {
    const int64_t lens[] = {0, 1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 576, 49152};
    float *x = xalloc(sizeof(float) * 49152);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        for (int c = 0; c < 9; c++) {
            for (int64_t i = 0; i < n; i++) x[i] = (float)(rnd() % 50) - 60.0f; /* ties: the first index wins */
            const int64_t at = n ? (int64_t)(rnd() % (uint64_t)n) : 0, at2 = n ? (int64_t)(rnd() % (uint64_t)n) : 0;
            switch (n ? c : 0) {
            case 1: x[at] = NAN; break;                                 /* a NaN is never the max */
            case 2: for (int64_t i = 0; i < n; i++) x[i] = i % 3 ? NAN : x[i]; break;
            case 3: x[at] = INFINITY, x[at2] = FLT_MAX; break;          /* +inf ties with FLT_MAX */
            case 4: for (int64_t i = 0; i < n; i++) x[i] = -INFINITY; break;
            case 5: for (int64_t i = 0; i < n; i++) x[i] = i % 2 ? NAN : -INFINITY; break;
            case 6: for (int64_t i = 0; i < n; i++) x[i] = NAN; break;
            case 7: for (int64_t i = 0; i < n; i++) x[i] = i % 5 ? -0.0f : 0.0f; break; /* -0 ties with +0 */
            case 8: x[at] = -INFINITY, x[at2] = 1e30f; break;
            default: break;
            }
            const int64_t want = dsp_cpu_argmax(x, n);
            CHECK_EQ_INT(want, n ? dsp_sample_argmax(x, (int32_t)n) : -1);
            for (int t = 0; t < g_n_tables; t++)
                CHECK_MSG(g_tables[t]->argmax(x, n) == want, "%s argmax n=%lld case %d: %lld, want %lld", g_tables[t]->name, (long long)n, c,
                          (long long)g_tables[t]->argmax(x, n), (long long)want);
        }
    }
    free(x);
}

/* the sampler's step-6 kernels (ops.h): every table gives the reference's bits */
static void test_sample_kernels(void) {
    const int64_t lens[] = {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097};
    const int64_t nmax = 4097;
    float *z = xalloc(sizeof(float) * (size_t)nmax), *pa = xalloc(sizeof(float) * (size_t)nmax), *pb = xalloc(sizeof(float) * (size_t)nmax);
    double *wa = xalloc(sizeof(double) * (size_t)nmax), *wb = xalloc(sizeof(double) * (size_t)nmax);
    int32_t *ka = xalloc(sizeof(int32_t) * (size_t)nmax), *kb = xalloc(sizeof(int32_t) * (size_t)nmax);
    const struct { float scale; double t, min_w; float z_thr; } cs[] = {
        {3.0f, 1.0, 0.0, -INFINITY}, {3.0f, 0.7, 0.05, -INFINITY}, {3.0f, 1.3, 0.0, 1.5f},  {3.0f, 1.0, 0.01, -2.0f},
        {400.0f, 1.0, 0.0, -INFINITY}, {400.0f, 1.0, 0.0, -400.0f}, {3.0f, 1e-30, 0.0, -INFINITY}, {1.0f, 1e30, 0.0, -INFINITY},
        /* powers of two (the kernels may multiply by 1 / t): ordinary, the smallest float, both ends of the normal doubles */
        {3.0f, 0.5, 0.0, -INFINITY}, {3.0f, 0x1p-149, 0.0, -INFINITY}, {1e-30f, 0x1p-1022, 0.0, -INFINITY}, {3.0f, 0x1p1023, 0.0, -INFINITY},
        {400.0f, 0x1p-4, 0.0, -INFINITY},
    };
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
            float zmax = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                z[i] = cs[c].scale * frnd();
                if (i % 7 == 3) z[i] = -INFINITY;
                zmax = z[i] > zmax ? z[i] : zmax;
            }
            if (zmax == -INFINITY) zmax = 0.0f;
            const double sa = dsp_cpu_sample_weights(z, n, zmax, cs[c].t, cs[c].min_w, wa);
            for (int64_t i = 0; i < n; i++) { /* the reference is dsp_sample_exp, compiled as it is */
                const double e = dsp_sample_exp(((double)z[i] - zmax) / cs[c].t);
                CHECK_MSG(!memcmp(&e, &wa[i], sizeof e), "reference weight %lld of %lld: %a, want %a", (long long)i, (long long)n, wa[i], e);
            }
            const double ma = dsp_cpu_sample_mass(z, wa, n, cs[c].z_thr, cs[c].min_w);
            int32_t nka = -1;
            const double qa = dsp_cpu_sample_probs(z, wa, n, cs[c].z_thr, cs[c].min_w, ma > 0.0 ? ma : 1.0, pa, ka, &nka);
            for (int t = 0; t < g_n_tables; t++) {
                const dsp_cpu_ops *o = g_tables[t];
                const double sb = o->sample_weights(z, n, zmax, cs[c].t, cs[c].min_w, wb);
                const double mb = o->sample_mass(z, wb, n, cs[c].z_thr, cs[c].min_w);
                int32_t nkb = -2;
                const double qb = o->sample_probs(z, wb, n, cs[c].z_thr, cs[c].min_w, ma > 0.0 ? ma : 1.0, pb, kb, &nkb);
                CHECK_MSG(!memcmp(wa, wb, sizeof(double) * (size_t)n) && !memcmp(&sa, &sb, sizeof sa), "%s sample_weights n=%lld case %zu",
                          o->name, (long long)n, c);
                CHECK_MSG(!memcmp(&ma, &mb, sizeof ma), "%s sample_mass n=%lld case %zu: %a vs %a", o->name, (long long)n, c, mb, ma);
                CHECK_MSG(nka == nkb && !memcmp(pa, pb, sizeof(float) * (size_t)n) && !memcmp(ka, kb, sizeof(int32_t) * (size_t)nka) &&
                              !memcmp(&qa, &qb, sizeof qa),
                          "%s sample_probs n=%lld case %zu: kept %d vs %d", o->name, (long long)n, c, nkb, nka);
            }
        }
    }
    /* keys and block maxima: any bit pattern (NaN, -0, inf included) */
    uint32_t *kya = xalloc(sizeof(uint32_t) * (size_t)nmax), *kyb = xalloc(sizeof(uint32_t) * (size_t)nmax);
    uint32_t bma[65], bmb[65];
    for (size_t li = 1; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        for (int64_t i = 0; i < n; i++) {
            const uint32_t u = i % 5 == 0 ? 0x80000000u : i % 5 == 1 ? 0u : rnd();
            memcpy(&z[i], &u, sizeof u);
        }
        dsp_cpu_sample_keys(z, n, kya, bma);
        for (int64_t i = 0; i < n; i++) CHECK(kya[i] == dsp_sample_key(z[i]));
        for (int t = 0; t < g_n_tables; t++) {
            g_tables[t]->sample_keys(z, n, kyb, bmb);
            const size_t nb = (size_t)(n + DSP_SAMPLE_KEY_BLOCK - 1) / DSP_SAMPLE_KEY_BLOCK;
            CHECK_MSG(!memcmp(kya, kyb, sizeof(uint32_t) * (size_t)n) && !memcmp(bma, bmb, sizeof(uint32_t) * nb), "%s sample_keys n=%lld",
                      g_tables[t]->name, (long long)n);
        }
    }
    free(z), free(pa), free(pb), free(wa), free(wb), free(ka), free(kb), free(kya), free(kyb);
}

int main(void) {
    static const char *const names[] = {"scalar", "avx2", "avx2vnni", "avx512", "avx512vnni"};
    for (int i = 0; i < 5; i++) {
        const dsp_cpu_ops *o = dsp_cpu_ops_get(names[i]);
        if (o) g_tables[g_n_tables++] = o;
        printf("  table %-7s %s\n", names[i], o ? "tested" : "SKIPPED (this CPU/OS cannot run it)");
    }
    DSP_RUN(test_selection);
    DSP_RUN(test_dequant_exact);
    DSP_RUN(test_matmul);
    DSP_RUN(test_cross_isa);
    DSP_RUN(test_q8_quantize);
    DSP_RUN(test_q8_matmul);
    DSP_RUN(test_q8_extremes);
    DSP_RUN(test_small);
    DSP_RUN(test_argmax);
    DSP_RUN(test_sample_kernels);
    DSP_RUN(test_attention_chunks);
    DSP_RUN(test_panels);
    return dsp_test_summary();
}
