/* backend/cpu/q8_impl.h: the 8-bit activation kernels (quantize_q8, matmul_q8) of the SIMD
 * tables, in the q8 block order of ops.h. Included by simd_impl.h only, so it is compiled once
 * per ISA translation unit with that unit's flags: 512-bit (VW == 16) or 256-bit vectors, and
 * vpdpbusd (DSP_Q8_VNNI) or vpmaddubsw + vpmaddwd for the integer dot products.
 *
 * How the exact block sums P of ops.h are formed: vpmaddubsw/vpdpbusd multiply unsigned bytes by
 * signed bytes, so each weight block is unpacked to unsigned bytes u = q + o (Q4_0 o = 8, Q6_K
 * o = 32, Q8_0 o = 128 with VNNI; the min types have o = 0) and multiplied by the signed
 * activation quants; then P = sum(u * xq) - o * S with S the activation block sum stored in the
 * q8 row. Without VNNI a Q8_0 u (up to 255) could saturate vpmaddubsw's 16-bit pair sums, so Q8_0
 * uses |q| times xq with q's sign instead (o = 0). Every product sum is an exact integer, so all
 * tables give the same P; the float part (scales, lanes, tree) is written out identically.
 *
 * A step is 8 blocks (256 weights; a K-quant super-block): the weights of one row are unpacked
 * once per step and used for every activation row of the tile; the 4-element partial sums the
 * instructions produce are reduced to the 8 block sums with a fixed network (exact integers, so
 * its shape does not matter), then the 8 float lanes take the step. */

#if VW == 16
typedef __m512i vi;
#define NVI 4 /* vectors of a step: 2 blocks each */
#define VI_SET1_8(c) _mm512_set1_epi8(c)
#define VI_AND(a, b) _mm512_and_si512(a, b)
#define VI_XOR(a, b) _mm512_xor_si512(a, b)
static inline vf vand(vf a, vf b) { return _mm512_and_ps(a, b); }
#define VF_ABSMASK _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF))
typedef __m512i VI32;
#define VCVT_I32(v) _mm512_cvtps_epi32(v)
#define VSTORE_I8(p, v) _mm_storeu_si128((__m128i *)(p), _mm512_cvtepi32_epi8(v))
#define VHSUM_I32(v) _mm512_reduce_add_epi32(v)
#else
typedef __m256i vi;
#define NVI 8 /* 1 block each */
#define VI_SET1_8(c) _mm256_set1_epi8(c)
#define VI_AND(a, b) _mm256_and_si256(a, b)
#define VI_XOR(a, b) _mm256_xor_si256(a, b)
static inline vf vand(vf a, vf b) { return _mm256_and_ps(a, b); }
#define VF_ABSMASK _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))
typedef __m256i VI32;
#define VCVT_I32(v) _mm256_cvtps_epi32(v)
static inline void VSTORE_I8(int8_t *p, __m256i v) { /* 8 int32 in [-127, 127] -> 8 bytes */
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}
static inline int32_t VHSUM_I32(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}
#endif
#define Q8_MAXX 8 /* activation rows per tile */

/* bytes of one 8-block step of a row (a K-quant super-block) and of one block (legacy types) */
static inline int64_t q8_step_bytes(uint32_t type) {
    switch (type) {
    case DSP_Q8_0: return 8 * 34;
    case DSP_Q4_0: return 8 * 18;
    case DSP_Q4_1: return 8 * 20;
    case DSP_Q4_K: return 144;
    case DSP_Q5_K: return 176;
    default: return 210; /* Q6_K */
    }
}
static inline int q8_block_bytes(uint32_t type) { return type == DSP_Q8_0 ? 34 : type == DSP_Q4_0 ? 18 : 20; }

/* log2 of the unsigned-weight offset o, or -1 for none (see the top of this file) */
static inline int q8_offset_shift(uint32_t type) {
    switch (type) {
    case DSP_Q4_0: return 3;
    case DSP_Q6_K: return 5;
#if defined(DSP_Q8_VNNI)
    case DSP_Q8_0: return 7;
#endif
    default: return -1;
    }
}
static inline int q8_has_min(uint32_t type) { return type == DSP_Q4_1 || type == DSP_Q4_K || type == DSP_Q5_K; }

/* one unpacked step of a weight row */
typedef struct q8w {
    vi W[NVI];    /* unsigned weight bytes u, block after block */
    __m256 D, Dh; /* per-block scale D_w (Q6_K: of the lower 16; Dh: of the upper 16) */
    __m256 M;     /* per-block min M_w (min types) */
} q8w;

/* 8 f16 values at p, p + stride, ... (the block headers of the legacy types); hi: the upper
 * 16 bits of the 32 read at each (Q4_1's m after its d) */
AI __m256 q8_f16x8(const uint8_t *p, int stride, int hi) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
    __m256i g = _mm256_i32gather_epi32((const int *)p, idx, 1);
    g = hi ? _mm256_srli_epi32(g, 16) : _mm256_and_si256(g, _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
}

/* Q4_K/Q5_K: D_w = d * sc_j, M_w = -(dmin * m_j) for the 8 sub-blocks of the super-block at p */
AI void q8_k4_scales(const uint8_t *p, __m256 *D, __m256 *M) {
    uint8_t sc[16];
    for (int j = 0; j < 8; j++) dsp_quant_scale_min_k4(p + 4, j, &sc[j], &sc[8 + j]);
    const __m128i v = _mm_loadu_si128((const __m128i *)sc);
    const __m256 fsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    *D = _mm256_mul_ps(_mm256_set1_ps(h2f(p)), fsc);
    *M = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_set1_ps(h2f(p + 2)), fm)); /* -(dmin * m): negation is exact */
}

/* Q6_K: D_w of the lower / upper 16 of each 32-block: d * scales[2j], d * scales[2j + 1] */
AI void q8_k6_scales(const uint8_t *p, __m256 *D, __m256 *Dh) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
    const __m256 d = _mm256_set1_ps(h2f(p + 208));
    *D = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(s16, 16), 16)));
    *Dh = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(s16, 16)));
}

AI void q8_unpack(const uint32_t type, const uint8_t *p, q8w *w) {
    const vi m4 = VI_SET1_8(0x0F);
    if (type == DSP_Q8_0) {
        for (int k = 0; k < NVI; k++) {
#if VW == 16
            vi v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 68 * k + 2))),
                                      _mm256_loadu_si256((const __m256i *)(p + 68 * k + 36)), 1);
#else
            vi v = _mm256_loadu_si256((const __m256i *)(p + 34 * k + 2));
#endif
#if defined(DSP_Q8_VNNI)
            v = VI_XOR(v, VI_SET1_8((char)0x80));
#endif
            w->W[k] = v;
        }
        w->D = q8_f16x8(p, 34, 0);
    } else if (type == DSP_Q4_0 || type == DSP_Q4_1) {
        const int bs = type == DSP_Q4_1 ? 20 : 18, off = type == DSP_Q4_1 ? 4 : 2;
        for (int k = 0; k < NVI; k++) {
#if VW == 16
            /* (qs0, qs0, qs1, qs1) -> low nibbles, high nibbles of block 2k, then of 2k+1 */
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2 * k * bs + off)))),
                                           _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + (2 * k + 1) * bs + off))), 1);
            v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);
#else
            __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + k * bs + off)));
            v = _mm256_blend_epi32(v, _mm256_srli_epi16(v, 4), 0xF0);
#endif
            w->W[k] = VI_AND(v, m4);
        }
        w->D = q8_f16x8(p, bs, 0);
        if (type == DSP_Q4_1) w->M = q8_f16x8(p, bs, 1);
    } else if (type == DSP_Q4_K || type == DSP_Q5_K) {
        const int q5 = type == DSP_Q5_K;
        const uint8_t *qs = p + (q5 ? 48 : 16);
#if VW == 16
        const __m512i qh = q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 16))) : _mm512_setzero_si512();
        for (int h = 0; h < 4; h++) { /* sub-blocks 2h (low nibbles) and 2h + 1 (high nibbles) */
            __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
            __m512i v = _mm512_and_si512(_mm512_mask_srli_epi16(c, 0xFFFF0000u, c, 4), m4);
            if (q5) {
                __m512i t = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * h));
                t = _mm512_and_si512(_mm512_mask_srli_epi16(t, 0xFFFF0000u, t, 1), _mm512_set1_epi8(1));
                v = _mm512_or_si512(v, _mm512_slli_epi16(t, 4));
            }
            w->W[h] = v;
        }
#else
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
        for (int h = 0; h < 4; h++) {
            __m256i c = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int t = 0; t < 2; t++) {
                const int j = 2 * h + t;
                __m256i v = _mm256_and_si256(t ? _mm256_srli_epi16(c, 4) : c, m4);
                if (q5) {
                    __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
                    v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
                }
                w->W[j] = v;
            }
        }
#endif
        q8_k4_scales(p, &w->D, &w->M);
    } else { /* Q6_K: 32-block j = 4h + c has low nibbles (c / 2) of ql[64h + 32(c % 2) + l], high bits 2c.. of qh[32h + l] */
        const vi m2 = VI_SET1_8(3);
#if VW == 16
        for (int k = 0; k < 4; k++) { /* blocks 2k, 2k + 1: h = k / 2, c = 2 * (k % 2) + 0/1 */
            const int h = k / 2, c0 = 2 * (k % 2);
            __m512i ql = _mm512_loadu_si512((const void *)(p + 64 * h));
            ql = _mm512_and_si512(c0 ? _mm512_srli_epi16(ql, 4) : ql, m4);
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h)));
            qh = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * c0));
            qh = _mm512_and_si512(_mm512_mask_srli_epi16(qh, 0xFFFF0000u, qh, 2), m2);
            w->W[k] = _mm512_or_si512(ql, _mm512_slli_epi16(qh, 4));
        }
#else
        for (int j = 0; j < 8; j++) {
            const int h = j / 4, c = j % 4;
            __m256i ql = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (c % 2)));
            ql = _mm256_and_si256(c / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
            __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), m2);
            w->W[j] = _mm256_or_si256(ql, _mm256_slli_epi16(qh, 4));
        }
#endif
        q8_k6_scales(p, &w->D, &w->Dh);
    }
}

/* the exact block sums of one step: lo[b] / hi[b] over the lower / upper 16 of block b (8 blocks),
 * before the offset correction. x: the step's 256 activation quants. */
AI void q8_sums(const uint32_t type, const q8w *w, const int8_t *x, __m256i *lo, __m256i *hi) {
    (void)type; /* VNNI treats every type alike */
    vi Z[NVI];
    for (int k = 0; k < NVI; k++) {
#if VW == 16
        const __m512i X = _mm512_loadu_si512((const void *)(x + 64 * k));
#if defined(DSP_Q8_VNNI)
        Z[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w->W[k], X);
#else
        if (type == DSP_Q8_0) { /* |q| * (xq with q's sign) */
            const __m512i xs = _mm512_mask_sub_epi8(X, _mm512_movepi8_mask(w->W[k]), _mm512_setzero_si512(), X);
            Z[k] = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w->W[k]), xs), _mm512_set1_epi16(1));
        } else {
            Z[k] = _mm512_madd_epi16(_mm512_maddubs_epi16(w->W[k], X), _mm512_set1_epi16(1));
        }
#endif
#else
        const __m256i X = _mm256_loadu_si256((const __m256i *)(x + 32 * k));
#if defined(DSP_Q8_VNNI)
        Z[k] = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w->W[k], X);
#else
        if (type == DSP_Q8_0)
            Z[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w->W[k]), _mm256_sign_epi8(X, w->W[k])), _mm256_set1_epi16(1));
        else
            Z[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(w->W[k], X), _mm256_set1_epi16(1));
#endif
#endif
    }
    /* Z lane m of block b holds elements 4m..4m+3 (m < 4: the lower 16) */
#if VW == 16
    /* pairwise even+odd lanes of two vectors: [blocks 0,1 (8 lanes each)] [2,3] -> [0..3 (4 each)] */
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#define PAIRADD(a, b) _mm512_add_epi32(_mm512_permutex2var_epi32(a, ev, b), _mm512_permutex2var_epi32(a, od, b))
    const __m512i A = PAIRADD(Z[0], Z[1]), B = PAIRADD(Z[2], Z[3]);
    const __m512i C = PAIRADD(A, B); /* block b: lane 2b = lower 16, lane 2b + 1 = upper 16 */
#undef PAIRADD
    *lo = _mm512_cvtepi64_epi32(C);
    *hi = _mm512_cvtepi64_epi32(_mm512_srli_epi64(C, 32));
#else
    const __m256i h01 = _mm256_hadd_epi32(Z[0], Z[1]), h23 = _mm256_hadd_epi32(Z[2], Z[3]);
    const __m256i h45 = _mm256_hadd_epi32(Z[4], Z[5]), h67 = _mm256_hadd_epi32(Z[6], Z[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67); /* (0..3 lower | 0..3 upper), (4..7 ..) */
    *lo = _mm256_permute2x128_si256(a, b, 0x20);
    *hi = _mm256_permute2x128_si256(a, b, 0x31);
#endif
}

/* one step of one activation row into its 8 lanes L; xr: the q8 row, b0: the step's first block */
AI __m256 q8_step(const uint32_t type, const q8w *w, const uint8_t *xr, int64_t nbp, int64_t b0, __m256 L) {
    __m256i lo, hi;
    q8_sums(type, w, dsp_cpu_q8_q(xr) + 32 * b0, &lo, &hi);
    const __m256 dx = _mm256_loadu_ps(dsp_cpu_q8_d(xr, nbp) + b0);
    const int sh = q8_offset_shift(type);
    if (type == DSP_Q6_K) {
        lo = _mm256_sub_epi32(lo, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(dsp_cpu_q8_Slo(xr, nbp) + b0)), 5));
        hi = _mm256_sub_epi32(hi, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(dsp_cpu_q8_Shi(xr, nbp) + b0)), 5));
        L = _mm256_fmadd_ps(_mm256_mul_ps(w->D, dx), _mm256_cvtepi32_ps(lo), L);
        return _mm256_fmadd_ps(_mm256_mul_ps(w->Dh, dx), _mm256_cvtepi32_ps(hi), L);
    }
    __m256i P = _mm256_add_epi32(lo, hi);
    if (sh >= 0) P = _mm256_sub_epi32(P, _mm256_sll_epi32(_mm256_loadu_si256((const __m256i *)(dsp_cpu_q8_S(xr, nbp) + b0)), _mm_cvtsi32_si128(sh)));
    L = _mm256_fmadd_ps(_mm256_mul_ps(w->D, dx), _mm256_cvtepi32_ps(P), L);
    if (q8_has_min(type)) L = _mm256_fmadd_ps(w->M, _mm256_loadu_ps(dsp_cpu_q8_s(xr, nbp) + b0), L);
    return L;
}

/* y[i * ldy] = q8 dot of the weight row at `row` with the XR q8 rows xq + i * ldq */
AI void q8_tile(const uint32_t type, const int XR, const uint8_t *row, int64_t in, const uint8_t *xq, size_t ldq, float *y, int64_t ldy,
                int64_t pf) {
    if (XR > Q8_MAXX) return;
    const int64_t nb = in / 32, nbp = dsp_cpu_q8_nbp(in), SB = q8_step_bytes(type);
    __m256 L[Q8_MAXX];
    for (int i = 0; i < XR; i++) L[i] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nbp; b0 += 8) {
        const uint8_t *p = row + b0 / 8 * SB;
        _Alignas(64) uint8_t tail[8 * 34];
        if (b0 + 8 > nb) { /* the last, partial step (legacy types only): zero blocks after the row's end */
            memset(tail, 0, sizeof tail);
            memcpy(tail, p, (size_t)(nb - b0) * (size_t)q8_block_bytes(type));
            p = tail;
        } else if (pf) {
            for (int64_t o = 0; o < SB; o += 64) _mm_prefetch((const char *)p + pf + o, _MM_HINT_T0);
        }
        q8w w;
        q8_unpack(type, p, &w);
        for (int i = 0; i < XR; i++) L[i] = q8_step(type, &w, xq + (size_t)i * ldq, nbp, b0, L[i]);
    }
    for (int i = 0; i < XR; i++) y[i * ldy] = hsum8(L[i]);
}

#define Q8C(T, xr) \
    case xr: q8_tile(T, xr, row, in, xq, ldq, y, ldy, pf); break;
#define Q8T(T)                                                                                                                 \
    static void q8tile_##T(int xr, const uint8_t *row, int64_t in, const uint8_t *xq, size_t ldq, float *y, int64_t ldy, int64_t pf) { \
        switch (xr) { Q8C(T, 1) Q8C(T, 2) Q8C(T, 3) Q8C(T, 4) Q8C(T, 5) Q8C(T, 6) Q8C(T, 7) Q8C(T, 8) default: break; }          \
    }
Q8T(DSP_Q8_0)
Q8T(DSP_Q4_0)
Q8T(DSP_Q4_1)
Q8T(DSP_Q4_K)
Q8T(DSP_Q5_K)
Q8T(DSP_Q6_K)

typedef void (*q8tile_fn)(int, const uint8_t *, int64_t, const uint8_t *, size_t, float *, int64_t, int64_t);
static q8tile_fn q8_for(uint32_t type) {
    switch (type) {
    case DSP_Q8_0: return q8tile_DSP_Q8_0;
    case DSP_Q4_0: return q8tile_DSP_Q4_0;
    case DSP_Q4_1: return q8tile_DSP_Q4_1;
    case DSP_Q4_K: return q8tile_DSP_Q4_K;
    case DSP_Q5_K: return q8tile_DSP_Q5_K;
    case DSP_Q6_K: return q8tile_DSP_Q6_K;
    default: return NULL;
    }
}

/* tiles of 1 weight row x up to Q8_MAXX activation rows, balanced (9 rows: 5 + 4); activation
 * rows in blocks of XB so that a block's q8 rows stay in L2 while a chunk of weight rows runs */
static void k_matmul_q8(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const void *xq, size_t ldq,
                        int n_x, float *y, int64_t ldy) {
    const q8tile_fn ft = q8_for(type);
    if (!ft) return; /* the caller checked dsp_cpu_q8_type */
    const int nt = (n_x + Q8_MAXX - 1) / Q8_MAXX, tx = nt ? (n_x + nt - 1) / nt : 1;
    for (int64_t c0 = r0; c0 < r1; c0 += DSP_CPU_MM_ROWS) {
        const int64_t c1 = c0 + DSP_CPU_MM_ROWS < r1 ? c0 + DSP_CPU_MM_ROWS : r1;
        for (int i0 = 0; i0 < n_x; i0 += XB) {
            const int i1 = i0 + XB < n_x ? i0 + XB : n_x;
            for (int64_t r = c0; r < c1; r++)
                for (int i = i0; i < i1; i += tx) {
                    const int xr = i1 - i < tx ? i1 - i : tx;
                    const int64_t pf = i == i0 ? (int64_t)row_bytes * PF_ROWS : 0;
                    ft(xr, (const uint8_t *)w + (size_t)r * row_bytes, in, (const uint8_t *)xq + (size_t)i * ldq, ldq, y + (size_t)i * ldy + r, ldy,
                       pf);
                }
        }
    }
}

/* ---- quantization ------------------------------------------------------------------------------ */

static void k_quantize_q8(const float *x, int64_t n, void *dst) {
    const int64_t nb = n / 32, nbp = dsp_cpu_q8_nbp(n);
    int8_t *q = dst;
    float *d = (float *)(q + 32 * nbp), *s = d + nbp;
    int32_t *S = (int32_t *)(s + nbp), *Slo = S + nbp, *Shi = Slo + nbp;
    const vf absmask = VF_ABSMASK;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        vf m = vzero();
        for (int g = 0; g < NG; g++) m = vmax(vand(vload(xb + VW * g), absmask), m); /* a NaN element is dropped, like fmaxf */
        const float amax = vhmax(m), db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        int32_t sum[2] = {0, 0};
        for (int g = 0; g < NG; g++) {
            vf v = vmul(vload(xb + VW * g), vset1(id));
            v = vmin(vmax(v, vset1(-127.0f)), vset1(127.0f)); /* NaN -> -127 */
            VI32 iv = VCVT_I32(v);                           /* round to nearest even */
            VSTORE_I8(q + 32 * b + VW * g, iv);
            sum[VW * g / 16] += VHSUM_I32(iv); /* VW = 16: one half per g; VW = 8: two g per half */
        }
        d[b] = db;
        S[b] = sum[0] + sum[1];
        Slo[b] = sum[0], Shi[b] = sum[1];
        s[b] = db * (float)S[b];
    }
    for (int64_t b = nb; b < nbp; b++) {
        memset(q + 32 * b, 0, 32);
        d[b] = s[b] = 0.0f;
        S[b] = Slo[b] = Shi[b] = 0;
    }
}
