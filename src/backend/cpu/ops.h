/* backend/cpu/ops: CPU kernels behind one ops table chosen at run time.
 *
 * Five implementations, each in its own translation unit:
 *   ref.c         scalar reference, kept forever as the oracle (portable C, no intrinsics), with
 *                 sample_ref.c for the sampler's kernels (its own flags: see there);
 *   avx2.c        AVX2 + FMA + F16C (compiled with those flags only);
 *   avx2vnni.c    the same + AVX-VNNI (vpdpbusd on 256-bit registers) for the 8-bit dot products;
 *   avx512.c      AVX-512 F/BW/VL/DQ (compiled with those flags only);
 *   avx512vnni.c  the same + AVX512-VNNI.
 * cpu.c detects the CPU (cpuid + xgetbv: the OS must have enabled the register state) and picks
 * the best table once; -march=native is never needed. DSP_CPU_ISA=scalar|avx2|avx2vnni|avx512|
 * avx512vnni in the environment caps the choice (for tests and for comparisons).
 *
 * Batch invariance (DESIGN.md §2): every kernel computes each output element with a reduction
 * order that depends only on the reduction length, never on how many rows are in the batch, how
 * they are tiled or which thread runs them. Within one table that makes a token's logits
 * bit-identical alone or in any batch. Different tables may round differently.
 *
 * The SIMD tables share one reduction order for dot products ("32-lane FMA order"): lane j
 * (0..31) accumulates a[32s+j]*b[32s+j] for s = 0, 1, ... with fused multiply-adds from +0 (a
 * missing tail element contributes nothing), then lanes are summed by a fixed tree
 * t16[j] = L[j] + L[j+16], t8[j] = t16[j] + t16[j+8], ... So AVX2 and AVX-512 give bit-identical
 * dot products and matmuls (tests check this where both run); only exp-based kernels differ.
 * Weights are dequantized bit-exactly (the same float operations as core/quant.c), so a
 * matmul differs from the reference only by the summation order of its dot products.
 *
 * 8-bit activations ("q8", the default precision): for the weight types of dsp_cpu_q8_type()
 * (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) each activation row is quantized once per matmul input
 * (quantize_q8, layout below) and matmul_q8 computes the dot products in integers. (The backend
 * itself multiplies every matrix of these types through its panels, "panel order" below; matmul_q8
 * and this order remain for test_kernels and bench_kernels.) The arithmetic
 * ("q8 block order"), identical in every table and for any number of rows:
 *   - per 32-weight block b the weight is w[e] = D_w * q[e] (+ M_w), q an integer (Q4_0: nibble - 8,
 *     Q8_0: the byte, Q6_K: 6 bits - 32 with one D_w per 16 weights, Q4_1/Q4_K/Q5_K: unsigned, with
 *     a min M_w: Q4_1 m, Q4_K/Q5_K -(dmin * m_j)); D_w is the float the reference dequantization
 *     multiplies by (Q4_K: d * sc_j);
 *   - the block splits into two halves, h = (e / 4) % 2 (weights 0-3, 8-11, 16-19, 24-27 and the
 *     rest: what one 32-bit lane of vpdpbusd sums over the interleaved layout below), and
 *     P[h] = sum q[e] * xq[e] over half h is exact (int32), however an ISA forms it (vpmaddubsw +
 *     vpmaddwd, vpdpbusd, the weights' integer offsets folded in through the block sums S);
 *     Q6_K has P_lo[h] (e < 16) and P_hi[h] (e >= 16) instead;
 *   - sixteen float lanes, lane 2 * (b mod 8) + h, start at +0 and take, for b = 0, 1, ... nbp - 1
 *     in order (nbp = nb rounded up to 8; padding blocks have D_w = M_w = dx = s = P = 0):
 *       L = fma(D_w * dx[b], (float)P[h], L)            (Q6_K: P_lo with D_lo, then P_hi with D_hi)
 *       L = fma(M_w, h ? 0 : s[b], L)                   (the types with a min)
 *   - y = t2[0] + t2[1], t2[j] = t4[j] + t4[j + 2], t4[j] = t8[j] + t8[j + 4], t8[j] = L[j] + L[j + 8].
 * dsp_cpu_q8_dot_ref is that definition in portable C; tests hold every table to it bit for bit.
 * Quantization (quantize_q8, also identical everywhere): per block dx = max|x| / 127,
 * xq = round-to-nearest-even(x * (1 / dx)) clamped to [-127, 127] (NaN -> -127; dx = 0 -> all 0),
 * S = sum xq, s = dx * (float)S. */
#ifndef DSP_BACKEND_CPU_OPS_H
#define DSP_BACKEND_CPU_OPS_H

#include "core/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* Weight rows a matmul call dequantizes at a time; the scratch it needs is
 * DSP_CPU_MM_ROWS * dsp_cpu_mm_stride(in) floats, 64-byte aligned. */
#define DSP_CPU_MM_ROWS 16
static inline int64_t dsp_cpu_mm_stride(int64_t in) { return (in + 15) / 16 * 16; }

/* y[i*ldy + r] = sum_k x[i*ldx + k] * W[r, k] for r in [r0, r1), i in [0, n_x).
 * W is a row-major weight matrix of `type` (a dsp_dtype id) with `in` columns, each row row_bytes
 * long, starting at w. `type` must have a reference dequantization and `in` must be a whole
 * number of its blocks (checked where the weights are bound, not here). */
typedef void (*dsp_cpu_matmul_fn)(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1,
                                  const float *x, int64_t ldx, int n_x, float *y, int64_t ldy, float *scratch);

/* ---- 8-bit activation rows ("q8 rows") ------------------------------------------------------
 * A row of n activations (n a multiple of 32: nb blocks of 32, padded to nbp = nb rounded up to 8)
 * is dsp_cpu_q8_row_bytes(n) bytes, 64-byte aligned when the buffer is. The per-block values are
 * stored once per float lane (lane 2b + h, see above) so that kernels load them as vectors:
 *   int8_t  q[32 * nbp]    quants, interleaved per group of 8 blocks (dsp_cpu_q8_index: element e
 *                          of block b is at 256 * (b / 8) + 64 * (e / 8) + 8 * (b % 8) + e % 8, so
 *                          a 64-byte vector holds 8 consecutive quants of each of 8 blocks and
 *                          successive vpdpbusd accumulate the halves in place; padding blocks 0)
 *   float   d[2 * nbp]     block scale dx, twice: d[2b] = d[2b + 1]
 *   float   s[2 * nbp]     s[2b] = dx * (float)S, s[2b + 1] = 0   (the min term)
 *   int32_t nS[2 * nbp]    nS[2b + h] = -(sum of the quants of half h of the block)
 *   int32_t nSlo[2 * nbp]  the same over the block's lower 16 quants only
 *   int32_t nShi[2 * nbp]  and over its upper 16
 *   int8_t  qn[32 * nbp]   the quants again, in natural order (element e of block b at 32 * b + e):
 *                          the one-row path of the AVX2 tables meets weight blocks in their own
 *                          order, where a transposition per weight step would cost more than the
 *                          products (q8_impl.h)
 * (the sums seed each lane's integer accumulator with the weights' offset, e.g. Q4_0's -8 * S) */
static inline int64_t dsp_cpu_q8_nbp(int64_t n) { return (n / 32 + 7) / 8 * 8; }
static inline int64_t dsp_cpu_q8_index(int64_t b, int e) { return 256 * (b / 8) + 64 * (e / 8) + 8 * (b % 8) + e % 8; }
static inline size_t dsp_cpu_q8_row_bytes(int64_t n) { return (size_t)(dsp_cpu_q8_nbp(n) * 104); }
static inline const int8_t *dsp_cpu_q8_q(const void *row) { return (const int8_t *)row; }
static inline const float *dsp_cpu_q8_d(const void *row, int64_t nbp) { return (const float *)((const uint8_t *)row + 32 * nbp); }
static inline const float *dsp_cpu_q8_s(const void *row, int64_t nbp) { return (const float *)((const uint8_t *)row + 40 * nbp); }
static inline const int32_t *dsp_cpu_q8_nS(const void *row, int64_t nbp) { return (const int32_t *)((const uint8_t *)row + 48 * nbp); }
static inline const int32_t *dsp_cpu_q8_nSlo(const void *row, int64_t nbp) { return (const int32_t *)((const uint8_t *)row + 56 * nbp); }
static inline const int32_t *dsp_cpu_q8_nShi(const void *row, int64_t nbp) { return (const int32_t *)((const uint8_t *)row + 64 * nbp); }
static inline const int8_t *dsp_cpu_q8_qn(const void *row, int64_t nbp) { return (const int8_t *)row + 72 * nbp; }
/* the per-lane values of block b from its scale and quant sums ([lower / upper 16][half]); shared
 * by every quantize_q8 */
static inline void dsp_cpu_q8_put_sums(int64_t b, float dx, const int32_t sum[2][2], float *d, float *s, int32_t *nS, int32_t *nSlo,
                                       int32_t *nShi) {
    const int32_t S = sum[0][0] + sum[0][1] + sum[1][0] + sum[1][1];
    d[2 * b] = d[2 * b + 1] = dx;
    s[2 * b] = dx * (float)S, s[2 * b + 1] = 0;
    for (int h = 0; h < 2; h++) nS[2 * b + h] = -(sum[0][h] + sum[1][h]), nSlo[2 * b + h] = -sum[0][h], nShi[2 * b + h] = -sum[1][h];
}

/* 1 if matmul_q8 takes weights of this type (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K); the other types
 * keep f32 activations in every precision */
int dsp_cpu_q8_type(uint32_t type);
/* the q8 types whose blocks have a min M_w (ops.h: the second FMA per block) */
static inline int dsp_cpu_q8_has_min(uint32_t type) { return type == DSP_Q4_1 || type == DSP_Q4_K || type == DSP_Q5_K; }

/* y[i*ldy + r] = q8 dot of W row r with q8 row i (at xq + i*ldq bytes), r in [r0, r1), i < n_x.
 * type must pass dsp_cpu_q8_type; `in` is a whole number of the type's blocks. */
typedef void (*dsp_cpu_matmul_q8_fn)(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1,
                                     const void *xq, size_t ldq, int n_x, float *y, int64_t ldy);

/* ---- panel weights ("panel order": Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) ----------------------------
 * A matrix of a panel type is repacked once, at load, into panels of DSP_CPU_PANEL output rows (the
 * last one padded with zero rows), so that one vector holds 16 outputs and neither a decode row nor
 * a prefill needs a horizontal sum, and AMX can take whole blocks (dsp_cpu_make_panels). Each weight
 * of the 4- to 6-bit types is an unsigned integer u with q = u - off the block integer of the q8
 * block order above (off: Q4_0 8, Q6_K 32, else 0). Per panel and 32-weight block b, element e of
 * row j (< 16) is in "group" g = e / 4 (t = e % 4), and the regions (dsp_cpu_panel_regions) are:
 *   q   [P][nb][qb]  the block's bits: byte 64 (g % 4) + 4 j + t holds u's low 4 bits, in the low
 *                    nibble for g < 4 and the high one for g >= 4 (qb = 256); Q5_K then has 64 bytes
 *                    with bit g of byte 4 j + t = bit 4 of u (qb = 320), Q6_K 128 bytes with bits
 *                    2 (g % 4) .. +1 of byte 64 (g / 4) + 4 j + t = bits 4-5 of u (qb = 384);
 *                    Q8_0: byte 64 g + 4 j + t is q itself, signed (qb = 512)
 *   d   [P][nd][16]  f16: the row's scale per block (Q4_0, Q4_1, Q8_0; nd = nb), or per 256-weight
 *                    super-block (K types; nd = nb / 8)
 *   m   [P][nd][16]  f16: Q4_1's min, Q4_K/Q5_K's dmin
 *   sc  [P][nb][32]  K types: the row's 6-bit sub-block scale (bytes 0-15) and min (16-31), or Q6_K's
 *                    signed scales of elements 0-15 (bytes 0-15) and 16-31 (16-31)
 * Unpacked, a group is 16 outputs x 4 bytes: the layout of an AMX B tile and of vpdpbusd lanes.
 * The arithmetic, identical in every table and for any number of activation rows (the batch
 * invariance of ops.h): with P = sum of q[e] * xq[e] over the block's 32 weights (exact int32),
 * D_w and M_w as the reference dequantization forms them (Q4_K: D_w = d * sc, M_w = -(dmin * m);
 * Q6_K: D_lo, D_hi of the two halves, with P_lo over e < 16 and P_hi over the rest) and
 * s[b] = dx[b] * (float)(the block's activation sum) as the q8 row stores it,
 *       y = +0;  then for b = 0, 1, ..., nb - 1 in order:
 *       y = fma(D_w * dx[b], (float)P, y);   the types with a min also  y = fma(M_w, s[b], y);
 *       (Q6_K: y = fma(D_lo * dx[b], (float)P_lo, y);  y = fma(D_hi * dx[b], (float)P_hi, y).)
 * (One float chain per output, not ops.h's 16 lanes and tree, which a tile product cannot give.) */
#define DSP_CPU_PANEL 16
/* 1 if matmuls of this type run on panels (with 8-bit activations) */
int dsp_cpu_panel_type(uint32_t type);
/* the panel types with super-block scales and per-block sub-scales (the sc region) */
static inline int dsp_cpu_panel_kq(uint32_t type) { return type == DSP_Q4_K || type == DSP_Q5_K || type == DSP_Q6_K; }
/* u - off = the block integer q (Q8_0: 0, its bytes are q) */
static inline int dsp_cpu_panel_off(uint32_t type) { return type == DSP_Q4_0 ? 8 : type == DSP_Q6_K ? 32 : 0; }
typedef struct dsp_cpu_panel_map {
    const uint8_t *q;   /* [P][nb][qb] */
    const uint16_t *d;  /* [P][nd][16] */
    const uint16_t *m;  /* [P][nd][16]; NULL without a min */
    const uint8_t *sc;  /* [P][nb][32]; NULL but for the K types */
    int64_t nb, nd, qb;
} dsp_cpu_panel_map;
/* bytes per block of the q region */
static inline int64_t dsp_cpu_panel_qb(uint32_t type) { return type == DSP_Q8_0 ? 512 : type == DSP_Q5_K ? 320 : type == DSP_Q6_K ? 384 : 256; }
/* the regions of the panels of an in x out matrix at pw (not NULL) */
static inline dsp_cpu_panel_map dsp_cpu_panel_regions(uint32_t type, const void *pw, int64_t in, int64_t out) {
    dsp_cpu_panel_map r;
    const int64_t np = (out + DSP_CPU_PANEL - 1) / DSP_CPU_PANEL;
    r.nb = in / 32, r.nd = dsp_cpu_panel_kq(type) ? r.nb / 8 : r.nb;
    r.qb = dsp_cpu_panel_qb(type);
    r.q = (const uint8_t *)pw;
    r.d = (const uint16_t *)(r.q + (size_t)(np * r.nb * r.qb));
    r.m = dsp_cpu_q8_has_min(type) ? r.d + (size_t)(np * r.nd * 16) : NULL;
    const uint16_t *end = r.d + (size_t)(np * r.nd * 16) * (r.m ? 2 : 1);
    r.sc = dsp_cpu_panel_kq(type) ? (const uint8_t *)end : NULL;
    return r;
}
/* bytes of the panels of an in x out matrix (in a whole number of the type's blocks) */
size_t dsp_cpu_panel_bytes(uint32_t type, int64_t in, int64_t out);
/* the panels of a row-major matrix (out rows of row_bytes) into dst (dsp_cpu_panel_bytes, 64-byte aligned) */
void dsp_cpu_make_panels(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t out, void *dst);
/* y[i*ldy + r] = panel dot of output r with q8 row i (xq + i*ldq), r in [r0, r1), i < n_x; r0 a
 * multiple of DSP_CPU_PANEL, r1 one too or out */
typedef void (*dsp_cpu_matmul_panel_fn)(uint32_t type, const void *pw, int64_t in, int64_t out, int64_t r0, int64_t r1, const void *xq,
                                        size_t ldq, int n_x, float *y, int64_t ldy);
void dsp_cpu_ref_matmul_panel(uint32_t type, const void *pw, int64_t in, int64_t out, int64_t r0, int64_t r1, const void *xq, size_t ldq,
                              int n_x, float *y, int64_t ldy);
/* 1 if AMX-INT8 can run here (the CPU has it and Linux granted the tile state; asked once) */
int dsp_cpu_amx_usable(void);
/* tests: 0 keeps the panel matmuls off AMX (their vector path), 1 lets them use it where it can run */
void dsp_cpu_amx_override(int on);

typedef struct dsp_cpu_ops {
    const char *name; /* "scalar", "avx2", "avx2vnni", "avx512", "avx512vnni" */
    dsp_cpu_matmul_fn matmul;
    dsp_cpu_matmul_q8_fn matmul_q8;
    dsp_cpu_matmul_panel_fn matmul_panel;
    /* dst = the q8 row of x[0..n), n a multiple of 32 (layout above) */
    void (*quantize_q8)(const float *x, int64_t n, void *dst);
    /* dst[0..n) = row of `type` at src, bit-identical to dsp_dequantize_row; n whole blocks */
    void (*dequant_row)(uint32_t type, const void *src, float *dst, int64_t n);
    float (*dot)(const float *a, const float *b, int64_t n);
    /* out = w * (x / sqrt(mean(x^2) + eps)); out may alias x; w may be NULL */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    void (*softmax)(float *x, int64_t n);                       /* in place */
    void (*swiglu)(float *a, const float *b, int64_t n);        /* a = silu(a) * b */
    void (*rope)(float *x, const float *cs, int rot_dim, int neox);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y = fma(a, x, y), element-wise */
    /* attention over a chunk of key (or value) rows, bit-identical to the calls one by one:
     * out[t] = dot(q, rows[t], n) * scale, and axpy(o, p[t], rows[t], n) for t = 0 .. nt - 1 in order */
    void (*dots)(const float *q, const float *const *rows, int nt, int64_t n, float scale, float *out);
    void (*axpys)(float *o, const float *p, const float *const *rows, int nt, int64_t n);
    /* the same over 16-bit key/value rows (the K/V cache in F16, or BF16 when bf16 != 0): bit-identical
     * to dots/axpys on the rows widened to f32 (exact), so the K/V type changes what is stored, never
     * the order of the arithmetic. */
    void (*dots16)(const float *q, const uint16_t *const *rows, int nt, int64_t n, float scale, float *out, int bf16);
    void (*axpys16)(float *o, const float *p, const uint16_t *const *rows, int nt, int64_t n, int bf16);
    /* the sampler's greedy rule (dsp_sample_argmax): the first index of the largest value, NaN read
     * as -inf and +inf as FLT_MAX; -1 when every value is NaN or -inf (or n <= 0) */
    int64_t (*argmax)(const float *x, int64_t n);
    /* The sampler's step 6 over a whole row (sample.h), bit-identical in every table: the same
     * IEEE double operations per element (dsp_sample_exp, sample/sample_kernels.h) and each sum a
     * sequential double sum in ascending i (a kernel adds the kept elements one by one, never
     * pairwise). Token i is "kept" under (z_thr, min_w) iff w[i] > 0 && w[i] >= min_w &&
     * z[i] >= z_thr.
     * sample_weights: w[i] = dsp_sample_exp(((double)z[i] - zmax) / t) for i < n; returns the sum
     *   of the w[i] with w[i] > 0 && w[i] >= min_w. */
    double (*sample_weights)(const float *z, int64_t n, double zmax, double t, double min_w, double *w);
    /* sample_mass: the sum of the kept w[i] */
    double (*sample_mass)(const float *z, const double *w, int64_t n, float z_thr, double min_w);
    /* sample_probs: p[i] = kept ? (float)(w[i] / mass) : 0 for every i < n; the i with p[i] > 0
     *   go to kept[] in ascending order, *n_kept of them; returns the sum of (double)p[i] over them */
    double (*sample_probs)(const float *z, const double *w, int64_t n, float z_thr, double min_w, double mass, float *p,
                           int32_t *kept, int32_t *n_kept);
    /* sample_keys: key[i] = dsp_sample_key(z[i]) for i < n, and bm[b] = the largest of the keys of
     *   block b (DSP_SAMPLE_KEY_BLOCK of them; the last block may be shorter), for n >= 1 */
    void (*sample_keys)(const float *z, int64_t n, uint32_t *key, uint32_t *bm);
} dsp_cpu_ops;

/* one 16-bit K/V element widened to f32 (exact) */
static inline float dsp_cpu_kv16(uint16_t h, int bf16) { return bf16 ? dsp_bf16_to_f32(h) : dsp_f16_to_f32(h); }

/* The table for this CPU (chosen on the first call, thread-safe). */
const dsp_cpu_ops *dsp_cpu_ops_best(void);
/* A table by name, or NULL if it was not compiled in or this CPU/OS cannot run it. */
const dsp_cpu_ops *dsp_cpu_ops_get(const char *name);
/* the best table name this CPU can run ("avx512vnni" ... "scalar"), ignoring DSP_CPU_ISA */
const char *dsp_cpu_isa_supported(void);

/* ---- the scalar reference (ref.c) ------------------------------------------------------------ */

/* sum_i a[i]*b[i] in a fixed order: 16 interleaved partial sums, then a fixed pairwise tree */
float dsp_cpu_dot_f32(const float *a, const float *b, int64_t n);
/* sum of squares, same order as dot */
float dsp_cpu_sumsq_f32(const float *a, int64_t n);
/* out = w * (x / sqrt(mean(x^2) + eps)); out may alias x; w may be NULL (no weight) */
void dsp_cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* in-place softmax over n values */
void dsp_cpu_softmax(float *x, int64_t n);
/* a = silu(a) * b */
void dsp_cpu_swiglu(float *a, const float *b, int64_t n);
/* Rotate one head in place. cs holds (cos, sin) pairs for i in 0..rot_dim/2. neox: pairs (i, i+rot/2),
 * else adjacent pairs (2i, 2i+1). Dimensions past rot_dim are left alone. */
void dsp_cpu_rope(float *x, const float *cs, int rot_dim, int neox);
void dsp_cpu_axpy(float *y, float a, const float *x, int64_t n);
int64_t dsp_cpu_argmax(const float *x, int64_t n);
/* the sampler's kernels (dsp_cpu_ops.sample_*, sample_ref.c), the definition the vector tables follow */
double dsp_cpu_sample_weights(const float *z, int64_t n, double zmax, double t, double min_w, double *w);
double dsp_cpu_sample_mass(const float *z, const double *w, int64_t n, float z_thr, double min_w);
double dsp_cpu_sample_probs(const float *z, const double *w, int64_t n, float z_thr, double min_w, double mass, float *p,
                            int32_t *kept, int32_t *n_kept);
void dsp_cpu_sample_keys(const float *z, int64_t n, uint32_t *key, uint32_t *bm);
/* reference matmul: dsp_dequantize_row of each weight row, then dsp_cpu_dot_f32 with each x row */
void dsp_cpu_ref_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const float *x,
                        int64_t ldx, int n_x, float *y, int64_t ldy, float *scratch);
/* the 32-lane FMA dot order of the SIMD tables, in portable C (fmaf): their bitwise oracle */
float dsp_cpu_dot32_fma_ref(const float *a, const float *b, int64_t n);
/* the q8 block order (see the top of this file) for one weight row of `type` and one q8 row */
float dsp_cpu_q8_dot_ref(uint32_t type, const void *wrow, const void *xq, int64_t n);
void dsp_cpu_quantize_q8(const float *x, int64_t n, void *dst);
void dsp_cpu_ref_matmul_q8(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const void *xq,
                           size_t ldq, int n_x, float *y, int64_t ldy);

extern const dsp_cpu_ops dsp_cpu_ops_scalar;
/* defined by the ISA translation units */
extern const dsp_cpu_ops dsp_cpu_ops_avx2;
extern const dsp_cpu_ops dsp_cpu_ops_avx2vnni;
extern const dsp_cpu_ops dsp_cpu_ops_avx512;
extern const dsp_cpu_ops dsp_cpu_ops_avx512vnni;

#endif
