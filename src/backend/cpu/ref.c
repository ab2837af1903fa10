/* backend/cpu/ref: scalar reference kernels (see ops.h). The 16-lane partial sums let the compiler
 * use SIMD registers without reassociating anything: lane k always sums elements k, k+16, ... */
#include "backend/cpu/ops.h"

#include "core/quant.h"
#include "core/status.h"
#include "sample/sample.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

static float tree16(float *acc) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++) acc[k] = acc[k] + acc[k + w];
    return acc[0];
}

float dsp_cpu_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += a[i] * b[i];
    return tree16(acc);
}

float dsp_cpu_sumsq_f32(const float *a, int64_t n) { return dsp_cpu_dot_f32(a, a, n); }

void dsp_cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float mean = dsp_cpu_sumsq_f32(x, n) / (float)n;
    float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

void dsp_cpu_softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void dsp_cpu_swiglu(float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

void dsp_cpu_rope(float *x, const float *cs, int rot_dim, int neox) {
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x1 * c + x0 * s;
    }
}

void dsp_cpu_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* the sampler's own rule, so that the kernel table's argmax is checked against it */
int64_t dsp_cpu_argmax(const float *x, int64_t n) {
    DSP_ASSERT(n <= INT32_MAX);
    return dsp_sample_argmax(x, (int32_t)n);
}

void dsp_cpu_ref_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const float *x,
                        int64_t ldx, int n_x, float *y, int64_t ldy, float *scratch) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = (const uint8_t *)w + (size_t)r * row_bytes;
        const float *wr = scratch;
        if (type == 0 /* DSP_F32 */) wr = (const float *)src;
        else dsp_dequantize_row(type, src, scratch, (uint64_t)in);
        for (int i = 0; i < n_x; i++) y[(size_t)i * ldy + r] = dsp_cpu_dot_f32(x + (size_t)i * ldx, wr, in);
    }
}

float dsp_cpu_dot32_fma_ref(const float *a, const float *b, int64_t n) {
    float l[32] = {0};
    for (int64_t i = 0; i < n; i++) l[i % 32] = fmaf(a[i], b[i], l[i % 32]);
    for (int w = 16; w > 0; w /= 2)
        for (int k = 0; k < w; k++) l[k] = l[k] + l[k + w];
    return l[0];
}

/* ---- 8-bit activations: the q8 block order, written out (ops.h) ------------------------------- */

int dsp_cpu_q8_type(uint32_t type) {
    return type == DSP_Q4_0 || type == DSP_Q4_1 || type == DSP_Q8_0 || type == DSP_Q4_K || type == DSP_Q5_K || type == DSP_Q6_K;
}

void dsp_cpu_quantize_q8(const float *x, int64_t n, void *dst) {
    const int64_t nb = n / 32, nbp = dsp_cpu_q8_nbp(n);
    int8_t *q = dst;
    float *d = (float *)(q + 32 * nbp), *s = d + 2 * nbp;
    int32_t *nS = (int32_t *)(s + 2 * nbp), *nSlo = nS + 2 * nbp, *nShi = nSlo + 2 * nbp;
    for (int64_t b = 0; b < nbp; b++) {
        float amax = 0;
        if (b < nb)
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[32 * b + k]));
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        int32_t sum[2][2] = {{0, 0}, {0, 0}}; /* [lower / upper 16][half] */
        for (int k = 0; k < 32; k++) {
            int v = 0;
            if (b < nb) {
                /* NaN -> -127 (fmaxf drops it), like the SIMD max(v, -127); |x * id| <= 127 + rounding */
                v = (int)nearbyintf(fminf(fmaxf(x[32 * b + k] * id, -127.0f), 127.0f));
            }
            q[dsp_cpu_q8_index(b, k)] = (int8_t)v;
            q[72 * nbp + 32 * b + k] = (int8_t)v; /* qn */
            sum[k / 16][(k / 4) % 2] += v;
        }
        dsp_cpu_q8_put_sums(b, db, sum, d, s, nS, nSlo, nShi);
    }
}

static float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return dsp_f16_to_f32(h);
}

/* block b (32 weights) of a row of `type` as integers q[] with w = D[k / 16] * q[k] + M (M = 0
 * for the types without a min) */
static void q8_wblock(uint32_t type, const uint8_t *row, int64_t b, int q[32], float D[2], float *M) {
    *M = 0;
    switch (type) {
    case DSP_Q8_0: {
        const uint8_t *p = row + 34 * b;
        D[0] = D[1] = f16(p);
        for (int k = 0; k < 32; k++) q[k] = (int8_t)p[2 + k];
        return;
    }
    case DSP_Q4_0:
    case DSP_Q4_1: {
        const int q41 = type == DSP_Q4_1;
        const uint8_t *p = row + (q41 ? 20 : 18) * b, *qs = p + (q41 ? 4 : 2);
        D[0] = D[1] = f16(p);
        for (int k = 0; k < 16; k++) q[k] = (qs[k] & 15) - (q41 ? 0 : 8), q[k + 16] = (qs[k] >> 4) - (q41 ? 0 : 8);
        if (q41) *M = f16(p + 2);
        return;
    }
    case DSP_Q4_K:
    case DSP_Q5_K: {
        const int q5 = type == DSP_Q5_K, j = (int)(b % 8);
        const uint8_t *p = row + (q5 ? 176 : 144) * (b / 8), *qs = p + (q5 ? 48 : 16) + 32 * (j / 2);
        uint8_t sc, m;
        dsp_quant_scale_min_k4(p + 4, j, &sc, &m);
        D[0] = D[1] = f16(p) * (float)sc;
        *M = -(f16(p + 2) * (float)m);
        for (int k = 0; k < 32; k++) q[k] = ((qs[k] >> (4 * (j % 2))) & 15) | (q5 ? ((p[16 + k] >> j) & 1) << 4 : 0);
        return;
    }
    case DSP_Q6_K: {
        const uint8_t *p = row + 210 * (b / 8);
        const int h = (int)(b % 8) / 4, c = (int)(b % 4);
        const float d = f16(p + 208);
        const int8_t *sc = (const int8_t *)(p + 192) + 8 * h + 2 * c;
        D[0] = d * (float)sc[0], D[1] = d * (float)sc[1];
        for (int k = 0; k < 32; k++) {
            int lo = (p[64 * h + 32 * (c % 2) + k] >> (4 * (c / 2))) & 15, hi = (p[128 + 32 * h + k] >> (2 * c)) & 3;
            q[k] = (lo | hi << 4) - 32;
        }
        return;
    }
    default: return;
    }
}

float dsp_cpu_q8_dot_ref(uint32_t type, const void *wrow, const void *xq, int64_t n) {
    const int64_t nb = n / 32, nbp = dsp_cpu_q8_nbp(n);
    const int8_t *xqs = dsp_cpu_q8_q(xq);
    const float *dx = dsp_cpu_q8_d(xq, nbp), *sx = dsp_cpu_q8_s(xq, nbp);
    const int has_min = dsp_cpu_q8_has_min(type);
    float L[16] = {0};
    for (int64_t b = 0; b < nbp; b++) {
        int q[32] = {0};
        float D[2] = {0, 0}, M = 0;
        if (b < nb) q8_wblock(type, wrow, b, q, D, &M);
        int32_t P[2][2] = {{0, 0}, {0, 0}}; /* [half][lower / upper 16] */
        for (int e = 0; e < 32; e++) P[(e / 4) % 2][e / 16] += q[e] * xqs[dsp_cpu_q8_index(b, e)];
        for (int h = 0; h < 2; h++) {
            float *l = &L[2 * (b % 8) + h];
            if (type == DSP_Q6_K) {
                *l = fmaf(D[0] * dx[2 * b], (float)P[h][0], *l);
                *l = fmaf(D[1] * dx[2 * b], (float)P[h][1], *l);
            } else {
                *l = fmaf(D[0] * dx[2 * b], (float)(P[h][0] + P[h][1]), *l);
            }
            if (has_min) *l = fmaf(M, sx[2 * b + h], *l);
        }
    }
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) L[j] = L[j] + L[j + w];
    return L[0];
}

void dsp_cpu_ref_matmul_q8(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const void *xq,
                           size_t ldq, int n_x, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int i = 0; i < n_x; i++)
            y[(size_t)i * ldy + r] = dsp_cpu_q8_dot_ref(type, (const uint8_t *)w + (size_t)r * row_bytes, (const uint8_t *)xq + (size_t)i * ldq, in);
}

/* ---- panels (ops.h, "panel order") ---- */
int dsp_cpu_panel_type(uint32_t type) {
    return type == DSP_Q4_0 || type == DSP_Q4_1 || type == DSP_Q8_0 || type == DSP_Q4_K || type == DSP_Q5_K || type == DSP_Q6_K;
}

static int64_t n_panels(int64_t out) { return (out + DSP_CPU_PANEL - 1) / DSP_CPU_PANEL; }

size_t dsp_cpu_panel_bytes(uint32_t type, int64_t in, int64_t out) { /* the regions of dsp_cpu_panel_regions */
    const int kq = dsp_cpu_panel_kq(type);
    const int64_t nb = in / 32, nd = kq ? nb / 8 : nb;
    const int64_t per = nb * dsp_cpu_panel_qb(type) + nd * 32 * (dsp_cpu_q8_has_min(type) ? 2 : 1) + (kq ? nb * 32 : 0);
    return (size_t)(n_panels(out) * per);
}

/* the f16 scale (and min) of block b of a row of a panel type, as the file stores them: per block for
 * Q4_0 / Q4_1 / Q8_0, per super-block for the K types; sc[0] and sc[16] the K types' sub-block scale
 * and min of block b (Q6_K: the signed scales of its two halves), as the sc region holds them (ops.h) */
static void panel_row_scales(uint32_t type, const uint8_t *row, int64_t b, uint16_t *d, uint16_t *m, uint8_t sc[32]) {
    switch (type) {
    case DSP_Q4_0: memcpy(d, row + sizeof(dsp_block_q4_0) * b + offsetof(dsp_block_q4_0, d), 2); return;
    case DSP_Q8_0: memcpy(d, row + sizeof(dsp_block_q8_0) * b + offsetof(dsp_block_q8_0, d), 2); return;
    case DSP_Q4_1: {
        const uint8_t *p = row + sizeof(dsp_block_q4_1) * b;
        memcpy(d, p + offsetof(dsp_block_q4_1, d), 2), memcpy(m, p + offsetof(dsp_block_q4_1, m), 2);
        return;
    }
    case DSP_Q4_K:
    case DSP_Q5_K: { /* the two blocks share d, dmin and scales at the same offsets */
        const uint8_t *p = row + (type == DSP_Q4_K ? sizeof(dsp_block_q4_K) : sizeof(dsp_block_q5_K)) * (b / 8);
        memcpy(d, p + offsetof(dsp_block_q4_K, d), 2), memcpy(m, p + offsetof(dsp_block_q4_K, dmin), 2);
        dsp_quant_scale_min_k4(p + offsetof(dsp_block_q4_K, scales), (int)(b % 8), &sc[0], &sc[16]);
        return;
    }
    case DSP_Q6_K: {
        const uint8_t *p = row + sizeof(dsp_block_q6_K) * (b / 8);
        memcpy(d, p + offsetof(dsp_block_q6_K, d), 2);
        memcpy(&sc[0], p + offsetof(dsp_block_q6_K, scales) + 2 * (b % 8), 1);
        memcpy(&sc[16], p + offsetof(dsp_block_q6_K, scales) + 2 * (b % 8) + 1, 1);
        return;
    }
    default: return;
    }
}

void dsp_cpu_make_panels(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t out, void *dst) {
    const int64_t np = n_panels(out);
    const dsp_cpu_panel_map r = dsp_cpu_panel_regions(type, dst, in, out);
    uint8_t *q0 = dst;
    uint16_t *d0 = (uint16_t *)r.d, *m0 = (uint16_t *)r.m;
    uint8_t *sc0 = (uint8_t *)r.sc;
    const int off = dsp_cpu_panel_off(type), kq = dsp_cpu_panel_kq(type);
    memset(dst, 0, dsp_cpu_panel_bytes(type, in, out));
    for (int64_t p = 0; p < np; p++)
        for (int64_t b = 0; b < r.nb; b++) {
            uint8_t *o = q0 + (size_t)(p * r.nb + b) * (size_t)r.qb, *sc = kq ? sc0 + (size_t)(p * r.nb + b) * 32 : NULL;
            const size_t ds = (size_t)(p * r.nd + (kq ? b / 8 : b)) * 16; /* the scales' slot of this block */
            for (int j = 0; j < DSP_CPU_PANEL; j++) {
                const int64_t row = p * DSP_CPU_PANEL + j;
                int q[32];
                float D[2], M;
                if (row < out) {
                    const uint8_t *wr = (const uint8_t *)w + (size_t)row * row_bytes;
                    q8_wblock(type, wr, b, q, D, &M);
                    uint16_t dv = 0, mv = 0;
                    uint8_t s[32] = {0};
                    panel_row_scales(type, wr, b, &dv, &mv, s);
                    d0[ds + j] = dv;
                    if (m0) m0[ds + j] = mv;
                    if (sc) sc[j] = s[0], sc[16 + j] = s[16];
                } else { /* padding: weight 0, scales 0 */
                    for (int e = 0; e < 32; e++) q[e] = 0;
                }
                for (int e = 0; e < 32; e++) {
                    const int u = q[e] + off, g = e / 4, t = e % 4, i = 4 * j + t;
                    if (type == DSP_Q8_0) {
                        o[64 * g + i] = (uint8_t)(int8_t)q[e];
                        continue;
                    }
                    o[64 * (g % 4) + i] |= (uint8_t)((u & 15) << (g < 4 ? 0 : 4));
                    if (type == DSP_Q5_K) o[256 + i] |= (uint8_t)(((u >> 4) & 1) << g);
                    if (type == DSP_Q6_K) o[256 + 64 * (g / 4) + i] |= (uint8_t)(((u >> 4) & 3) << (2 * (g % 4)));
                }
            }
        }
}

/* weights of row j of panel p, block b (as q8_wblock gives them from the row-major file) */
static void panel_wblock(uint32_t type, const dsp_cpu_panel_map *r, int64_t p, int64_t b, int j, int q[32], float D[2], float *M) {
    const uint8_t *o = r->q + (size_t)(p * r->nb + b) * (size_t)r->qb;
    const int off = dsp_cpu_panel_off(type), kq = dsp_cpu_panel_kq(type);
    for (int e = 0; e < 32; e++) {
        const int g = e / 4, i = 4 * j + e % 4;
        if (type == DSP_Q8_0) {
            q[e] = (int8_t)o[64 * g + i];
            continue;
        }
        int u = (o[64 * (g % 4) + i] >> (g < 4 ? 0 : 4)) & 15;
        if (type == DSP_Q5_K) u |= ((o[256 + i] >> g) & 1) << 4;
        if (type == DSP_Q6_K) u |= ((o[256 + 64 * (g / 4) + i] >> (2 * (g % 4))) & 3) << 4;
        q[e] = u - off;
    }
    const size_t ds = (size_t)(p * r->nd + (kq ? b / 8 : b)) * 16 + (size_t)j;
    const float d = dsp_f16_to_f32(r->d[ds]);
    const uint8_t *sc = kq ? r->sc + (size_t)(p * r->nb + b) * 32 : NULL;
    *M = 0;
    if (type == DSP_Q6_K) {
        D[0] = d * (float)(int8_t)sc[j], D[1] = d * (float)(int8_t)sc[16 + j];
    } else if (kq) {
        D[0] = D[1] = d * (float)sc[j];
        *M = -(dsp_f16_to_f32(r->m[ds]) * (float)sc[16 + j]);
    } else {
        D[0] = D[1] = d;
        if (r->m) *M = dsp_f16_to_f32(r->m[ds]);
    }
}

void dsp_cpu_ref_matmul_panel(uint32_t type, const void *pw, int64_t in, int64_t out, int64_t r0, int64_t r1, const void *xq, size_t ldq,
                              int n_x, float *y, int64_t ldy) {
    const dsp_cpu_panel_map map = dsp_cpu_panel_regions(type, pw, in, out);
    const int64_t nbp = dsp_cpu_q8_nbp(in);
    for (int i = 0; i < n_x; i++) {
        const uint8_t *row = (const uint8_t *)xq + (size_t)i * ldq;
        const int8_t *x = dsp_cpu_q8_qn(row, nbp);
        const float *dx = dsp_cpu_q8_d(row, nbp), *sx = dsp_cpu_q8_s(row, nbp);
        for (int64_t r = r0; r < r1; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < map.nb; b++) {
                int q[32];
                float D[2], M;
                panel_wblock(type, &map, r / DSP_CPU_PANEL, b, (int)(r % DSP_CPU_PANEL), q, D, &M);
                int32_t P[2] = {0, 0}; /* elements 0-15, 16-31 */
                for (int e = 0; e < 32; e++) P[e / 16] += q[e] * x[32 * b + e];
                if (type == DSP_Q6_K) {
                    acc = fmaf(D[0] * dx[2 * b], (float)P[0], acc);
                    acc = fmaf(D[1] * dx[2 * b], (float)P[1], acc);
                } else {
                    acc = fmaf(D[0] * dx[2 * b], (float)(P[0] + P[1]), acc);
                    if (map.m) acc = fmaf(M, sx[2 * b], acc);
                }
            }
            y[(size_t)i * ldy + r] = acc;
        }
    }
}

static void ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) { dsp_dequantize_row(type, src, dst, (uint64_t)n); }

static void ref_dots(const float *q, const float *const *rows, int nt, int64_t n, float scale, float *out) {
    for (int t = 0; t < nt; t++) out[t] = dsp_cpu_dot_f32(q, rows[t], n) * scale;
}
static void ref_axpys(float *o, const float *p, const float *const *rows, int nt, int64_t n) {
    for (int t = 0; t < nt; t++) dsp_cpu_axpy(o, p[t], rows[t], n);
}

/* 16-bit rows: the f32 definitions on each element widened */
static void ref_dots16(const float *q, const uint16_t *const *rows, int nt, int64_t n, float scale, float *out, int bf16) {
    for (int t = 0; t < nt; t++) {
        float acc[LANES] = {0};
        int64_t i = 0;
        for (; i + LANES <= n; i += LANES)
            for (int k = 0; k < LANES; k++) acc[k] += q[i + k] * dsp_cpu_kv16(rows[t][i + k], bf16);
        for (int k = 0; i < n; i++, k++) acc[k] += q[i] * dsp_cpu_kv16(rows[t][i], bf16);
        out[t] = tree16(acc) * scale;
    }
}
static void ref_axpys16(float *o, const float *p, const uint16_t *const *rows, int nt, int64_t n, int bf16) {
    for (int t = 0; t < nt; t++)
        for (int64_t i = 0; i < n; i++) o[i] = fmaf(p[t], dsp_cpu_kv16(rows[t][i], bf16), o[i]);
}

const dsp_cpu_ops dsp_cpu_ops_scalar = {
    "scalar", dsp_cpu_ref_matmul, dsp_cpu_ref_matmul_q8, dsp_cpu_ref_matmul_panel, dsp_cpu_quantize_q8, ref_dequant_row, dsp_cpu_dot_f32, dsp_cpu_rmsnorm,
    dsp_cpu_softmax, dsp_cpu_swiglu, dsp_cpu_rope, dsp_cpu_axpy, ref_dots, ref_axpys, ref_dots16, ref_axpys16, dsp_cpu_argmax,
    dsp_cpu_sample_weights, dsp_cpu_sample_mass, dsp_cpu_sample_probs, dsp_cpu_sample_keys,
};
