/* sample/sample_kernels: what the sampler (sample.c) shares with its CPU kernels
 * (backend/cpu/ops.h, sample_*): the own exp of its weights and the ordered keys of its logits.
 * The kernels must give these functions' bits, element for element.
 *
 * ---- dsp_sample_exp: w = exp((z - z_max) / T), sample.h step 6 ----
 * Why not libm: the weights decide which tokens are kept and with what probability, and the
 * library promises the same bits on every x86-64 machine; libm's exp differs between C
 * libraries and versions, and a scalar call per token is most of a sampling step. This one is a
 * fixed sequence of IEEE double operations (no FMA: the build has -ffp-contract=off), written
 * once here in C and mirrored lane for lane by the vector kernels (backend/cpu/simd_impl.h,
 * "sampler"): every table gives the same bits, which test_kernels and test_sample check.
 *
 * Domain: x <= 0, -inf included (the inputs are (z - z_max) / T). Not meant for x > 0.
 *   1. x = max(x, -746): below about -745.13 exp rounds to 0 anyway; the clamp turns -inf (and a
 *      NaN, which the sampler never passes) into an input the steps below handle.
 *   2. k = round-to-nearest-even(x / ln2), by adding and subtracting 1.5 * 2^52 (|x / ln2| < 2^51).
 *   3. r = (x - k * LN2_HI) - k * LN2_LO: LN2_HI holds ln2's top 41 bits, so k * LN2_HI is exact
 *      for |k| < 2^12 and so is the subtraction (Sterbenz); |r| <= ln2 / 2 plus a hair.
 *   4. e^r = 1 + r * q(r), q of degree 10 by Horner: a Chebyshev fit of (e^r - 1) / r on that
 *      interval (tools/gen_sample_exp.py prints every constant here), 0.09 ulp from e^r before
 *      rounding. The constant term 1 makes e^0 = 1 exactly.
 *   5. p * 2^k, rounded once: as p * 2^k1 * 2^k2 (k1 = floor(k / 2), both factors normal powers
 *      of two built from k's integer bits), where the first product is exact and the second
 *      rounds only a subnormal result. Where the result is normal (k >= -1021) both products are
 *      exact, so p * 2^k in one multiplication is the same number: the vector kernels take that
 *      shortcut, and the two steps only for a vector holding a smaller k.
 * exp(0) = 1 exactly (k = 0, r = 0), so the top token's weight is 1 as sample.h says.
 * Accuracy: within 1 ulp of glibc's exp on [-746, 0] (test_sample measures millions of points
 * and fails above 1 ulp); about 7% of results differ from it by that 1 ulp. */
#ifndef DSP_SAMPLE_SAMPLE_KERNELS_H
#define DSP_SAMPLE_SAMPLE_KERNELS_H

#include <stdint.h>
#include <string.h>

/* constants, shared with the vector kernels */
#define DSP_SAMPLE_EXP_MIN (-746.0)
#define DSP_SAMPLE_EXP_LOG2E 0x1.71547652b82fep+0   /* 1 / ln2 */
#define DSP_SAMPLE_EXP_SHIFT 0x1.8p52               /* x + SHIFT - SHIFT rounds x to an integer */
#define DSP_SAMPLE_EXP_SHIFT_BITS 0x4338000000000000ull
#define DSP_SAMPLE_EXP_LN2_HI 0x1.62e42fefa3000p-1  /* ln2 to 41 bits */
#define DSP_SAMPLE_EXP_LN2_LO 0x1.3de6af278ece6p-42 /* ln2 - LN2_HI */
/* q(r) = Q0 + Q1 r + ... + Q10 r^10 */
#define DSP_SAMPLE_EXP_Q10 0x1.af4ddda1c08cdp-26
#define DSP_SAMPLE_EXP_Q9 0x1.28a2c0bee04a5p-22
#define DSP_SAMPLE_EXP_Q8 0x1.71de0237484cdp-19
#define DSP_SAMPLE_EXP_Q7 0x1.a019a66a5f0b6p-16
#define DSP_SAMPLE_EXP_Q6 0x1.a01a01abe6323p-13
#define DSP_SAMPLE_EXP_Q5 0x1.6c16c17f43acbp-10
#define DSP_SAMPLE_EXP_Q4 0x1.11111111100dfp-7
#define DSP_SAMPLE_EXP_Q3 0x1.55555555520afp-5
#define DSP_SAMPLE_EXP_Q2 0x1.5555555555557p-3
#define DSP_SAMPLE_EXP_Q1 0x1.0000000000005p-1
#define DSP_SAMPLE_EXP_Q0 1.0
/* the smallest k for which p * 2^k is normal for every p of step 4 (p > 1/2) */
#define DSP_SAMPLE_EXP_KNORMAL (-1021.0)
/* step 5: with u = k + 1100 (k in [-1077, 0], so u in [23, 1100]) and u1 = u >> 1, the two
 * factors are 2^(u1 - 550) and 2^(u - u1 - 550), biased exponents u1 + 473 and u - u1 + 473,
 * both in [473, 1023]: normal numbers <= 1 */
#define DSP_SAMPLE_EXP_UBIAS 1100
#define DSP_SAMPLE_EXP_EBIAS 473

/* the vector kernels repeat exactly these floating-point operations, in this order, per lane */
static inline double dsp_sample_exp(double x) {
    x = x > DSP_SAMPLE_EXP_MIN ? x : DSP_SAMPLE_EXP_MIN; /* the semantics of maxpd(x, MIN) */
    const double t = x * DSP_SAMPLE_EXP_LOG2E + DSP_SAMPLE_EXP_SHIFT;
    const double k = t - DSP_SAMPLE_EXP_SHIFT;
    double r = x - k * DSP_SAMPLE_EXP_LN2_HI;
    r = r - k * DSP_SAMPLE_EXP_LN2_LO;
    double p = DSP_SAMPLE_EXP_Q10;
    p = p * r + DSP_SAMPLE_EXP_Q9;
    p = p * r + DSP_SAMPLE_EXP_Q8;
    p = p * r + DSP_SAMPLE_EXP_Q7;
    p = p * r + DSP_SAMPLE_EXP_Q6;
    p = p * r + DSP_SAMPLE_EXP_Q5;
    p = p * r + DSP_SAMPLE_EXP_Q4;
    p = p * r + DSP_SAMPLE_EXP_Q3;
    p = p * r + DSP_SAMPLE_EXP_Q2;
    p = p * r + DSP_SAMPLE_EXP_Q1;
    p = p * r + DSP_SAMPLE_EXP_Q0;
    p = p * r + 1.0;
    uint64_t tb;
    memcpy(&tb, &t, sizeof tb);
    const uint64_t u = tb - (DSP_SAMPLE_EXP_SHIFT_BITS - DSP_SAMPLE_EXP_UBIAS), u1 = u >> 1;
    const uint64_t b1 = (u1 + DSP_SAMPLE_EXP_EBIAS) << 52, b2 = (u - u1 + DSP_SAMPLE_EXP_EBIAS) << 52;
    double s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}

/* ---- sample_probs (ops.h) over z[i0, n): the reference's loop, which the vector kernels also run
 * on the elements after their last whole chunk. Appends to kept (*nk of them so far) and returns
 * psum plus the new p's, added one by one: the same chain of additions as a single loop. */
static inline double dsp_sample_probs_range(const float *z, const double *w, int64_t i0, int64_t n, float z_thr, double min_w,
                                            double mass, float *p, int32_t *kept, int32_t *nk, double psum) {
    for (int64_t i = i0; i < n; i++) {
        float pi = 0.0f;
        if (w[i] > 0.0 && w[i] >= min_w && z[i] >= z_thr) pi = (float)(w[i] / mass);
        p[i] = pi;
        if (pi > 0.0f) {
            kept[(*nk)++] = (int32_t)i;
            psum += (double)pi;
        }
    }
    return psum;
}

/* ---- ordered keys ----
 * float -> uint32, order-preserving for non-NaN values (larger float, larger key) with -0 mapped
 * like +0: top-k and top-p select on keys (radix select, sorts) and compare them as integers. */
static inline uint32_t dsp_sample_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
/* keys per block in the block maxima of sample_keys (ops.h) */
#define DSP_SAMPLE_KEY_BLOCK 64

#endif
