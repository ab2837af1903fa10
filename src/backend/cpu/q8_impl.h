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
 * Q8_SUM16: without VNNI, the 16-bit pair sums of vpmaddubsw are added for all the vectors that
 * feed one 32-bit accumulator (4; Q6_K: 2 per half) before the one vpmaddwd: u <= 31 (Q4_*, Q5_K)
 * or 63 (Q6_K, two vectors) times |xq| <= 127 keeps each 16-bit sum below 2^15 (4 * 2 * 31 * 127 =
 * 31496, 2 * 2 * 63 * 127 = 32004), so the integers, and with them every bit, are unchanged, for a
 * quarter fewer integer instructions per activation row. Q8_0 (|q| <= 128) cannot.
 *
 * A step is 8 blocks (256 weights; a K-quant super-block): the weights of one row are unpacked
 * once per step, transposed into the q8 rows' interleaved order, and used for every activation
 * row of the tile; per activation row, 4 vpdpbusd (or 8 on 256 bits) accumulate the 16 half-block
 * sums of ops.h in one register, seeded with the offset correction, then the 16 float lanes take
 * the step with one convert, one multiply (D_w * dx) and one or two FMAs.
 *
 * One activation row (decode) on the AVX2 tables takes another route to the same sums: blocks are
 * unpacked in their own order against the row's natural-order quants and the quad sums reduced
 * in registers (q8_row, below); the float part is the same function (q8_fstep). */

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
#define Q8_MAXX 16 /* activation rows per tile */
typedef __m512 lanes16;
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
#define Q8_MAXX 4 /* (16 registers) */
typedef struct lanes16 {
    __m256 v[2]; /* blocks 0-3, 4-7 */
} lanes16;
#endif

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

/* one unpacked step of a weight row, in the q8 rows' interleaved order: vector k (AVX-512) or
 * vectors 2k, 2k + 1 (AVX2: blocks 0-3, 4-7) hold weights 8k..8k+7 of each of the 8 blocks */
typedef struct q8sc {
    lanes16 D, Dh, M; /* per lane: scale D_w (Q6_K: of the lower 16; Dh: of the upper 16), min M_w */
} q8sc;
typedef struct q8w {
    vi W[NVI]; /* unsigned weight bytes u */
    q8sc s;
} q8w;

/* 8 per-block values -> 16 lanes (each twice) */
AI lanes16 q8_lanes(__m256 v) {
#if VW == 16
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_castps256_ps512(v));
#else
    lanes16 r = {{_mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)),
                  _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7))}};
    return r;
#endif
}

/* 8 f16 values at p + ord[k] * stride (the block headers of the legacy types; blocks from nblk on
 * read as 0), q8_f16x8 in block order; hi: the one at +2
 * (Q4_1's m after its d). Eight 16-bit loads through the stack, not vpgatherdd: on Zen 3 the
 * gather (microcoded) and the chain behind it took most of a one-row Q8_0 step (perf); a
 * vpinsrw chain measured slower than the store-to-load round trip too. */
AI __m256 q8_f16x8_at(const uint8_t *p, int stride, int hi, const int ord[8], int nblk) {
    uint16_t h[8] = {0};
    for (int k = 0; k < 8; k++)
        if (ord[k] < nblk) memcpy(&h[k], p + ord[k] * stride + 2 * hi, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}
AI __m256 q8_f16x8(const uint8_t *p, int stride, int hi) {
    static const int in_order[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    return q8_f16x8_at(p, stride, hi, in_order, 8);
}

#if VW == 16
/* Q4_0 / Q4_1: the scales (and mins) of 8 whole blocks at p by permutes of vector loads, the same
 * values as q8_f16x8 gives (which goes through the stack: 16 scalar loads and a store-forwarding
 * stall per Q4_1 step). Q4_0's d of block b is 16-bit word 9b of p (18-byte blocks), Q4_1's d | m
 * dword 5b (20-byte blocks); the loads stay inside the 8 blocks (144 / 160 bytes). */
AI void q8_q4_headers(const uint32_t type, const uint8_t *p, q8sc *s) {
    if (type == DSP_Q4_0) {
        static const uint16_t idx[32] = {0, 9, 18, 27, 36, 45, 54, 63};
        const __m512i h = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)p), _mm512_loadu_si512((const void *)idx),
                                                     _mm512_loadu_si512((const void *)(p + 64)));
        s->D = q8_lanes(_mm256_cvtph_ps(_mm512_castsi512_si128(h)));
    } else {
        __m512i t = _mm512_permutex2var_epi32(_mm512_loadu_si512((const void *)p), _mm512_setr_epi32(0, 5, 10, 15, 20, 25, 30, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                                              _mm512_loadu_si512((const void *)(p + 64)));
        t = _mm512_mask_permutexvar_epi32(t, 0x80, _mm512_set1_epi32(3), _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 128))));
        const __m512 dm = _mm512_cvtph_ps(_mm512_castsi512_si256(t)); /* d0 m0 d1 m1 ... */
        s->D = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14), dm);
        s->M = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15), dm);
    }
}
#endif

/* Q4_K/Q5_K: D_w = d * sc_j, M_w = -(dmin * m_j) for the 8 sub-blocks of the super-block at p.
 * The 6-bit scales (dsp_quant_scale_min_k4), four at a time in 32-bit words a, b, c = bytes 0-3,
 * 4-7, 8-11: sc0-3 = a & 63, sc4-7 = (c & 15) | (bits 6-7 of a) << 4; m likewise from b and c >> 4. */
AI void q8_k4_scales(const uint8_t *p, __m256 *D, __m256 *M) {
    uint32_t a, b, c;
    memcpy(&a, p + 4, 4), memcpy(&b, p + 8, 4), memcpy(&c, p + 12, 4);
    const uint32_t sc_lo = a & 0x3F3F3F3Fu, sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
    const uint32_t m_lo = b & 0x3F3F3F3Fu, m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
    const __m128i v = _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
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

/* qwords of a weight row need not be 8-byte aligned (Q6_K's blocks are 210 bytes): memcpy loads */
static inline long long load_q(const uint8_t *p) {
    long long q;
    memcpy(&q, p, sizeof q);
    return q;
}
#if VW == 16
static inline __m512i bcast_q(const uint8_t *p) { return _mm512_set1_epi64(load_q(p)); }
#else
static inline __m256i bcast_q(const uint8_t *p) { return _mm256_set1_epi64x(load_q(p)); }
#endif
#define QW(p, i) ((const uint8_t *)(p) + 8 * (i)) /* qword i of p */

AI void q8_unpack(const uint32_t type, const uint8_t *p, q8w *w) {
    const vi m4 = VI_SET1_8(0x0F);
    if (type == DSP_Q8_0) { /* an 8 x 4 transpose of qwords: block b's qword k -> vector k, slot b */
#if VW == 16
        __m512i Z[4], T[4];
        _Pragma("GCC unroll 8")
        for (int i = 0; i < 4; i++)
            Z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 68 * i + 2))),
                                      _mm256_loadu_si256((const __m256i *)(p + 68 * i + 36)), 1);
        const __m512i i01 = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13), i23 = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
        T[0] = _mm512_permutex2var_epi64(Z[0], i01, Z[1]); /* blocks 0-3: q0 | q1 */
        T[1] = _mm512_permutex2var_epi64(Z[0], i23, Z[1]); /* q2 | q3 */
        T[2] = _mm512_permutex2var_epi64(Z[2], i01, Z[3]); /* blocks 4-7 */
        T[3] = _mm512_permutex2var_epi64(Z[2], i23, Z[3]);
        w->W[0] = _mm512_shuffle_i64x2(T[0], T[2], 0x44);
        w->W[1] = _mm512_shuffle_i64x2(T[0], T[2], 0xEE);
        w->W[2] = _mm512_shuffle_i64x2(T[1], T[3], 0x44);
        w->W[3] = _mm512_shuffle_i64x2(T[1], T[3], 0xEE);
#else
        _Pragma("GCC unroll 8")
        for (int h = 0; h < 2; h++) { /* blocks 4h..4h+3: a 4 x 4 transpose */
            const __m256i B0 = _mm256_loadu_si256((const __m256i *)(p + 34 * (4 * h) + 2)), B1 = _mm256_loadu_si256((const __m256i *)(p + 34 * (4 * h + 1) + 2));
            const __m256i B2 = _mm256_loadu_si256((const __m256i *)(p + 34 * (4 * h + 2) + 2)), B3 = _mm256_loadu_si256((const __m256i *)(p + 34 * (4 * h + 3) + 2));
            const __m256i t0 = _mm256_unpacklo_epi64(B0, B1), t1 = _mm256_unpackhi_epi64(B0, B1);
            const __m256i t2 = _mm256_unpacklo_epi64(B2, B3), t3 = _mm256_unpackhi_epi64(B2, B3);
            w->W[0 + h] = _mm256_permute2x128_si256(t0, t2, 0x20);
            w->W[2 + h] = _mm256_permute2x128_si256(t1, t3, 0x20);
            w->W[4 + h] = _mm256_permute2x128_si256(t0, t2, 0x31);
            w->W[6 + h] = _mm256_permute2x128_si256(t1, t3, 0x31);
        }
#endif
#if defined(DSP_Q8_VNNI)
        _Pragma("GCC unroll 8")
        for (int k = 0; k < NVI; k++) w->W[k] = VI_XOR(w->W[k], VI_SET1_8((char)0x80));
#endif
        w->s.D = q8_lanes(q8_f16x8(p, 34, 0));
    } else if (type == DSP_Q4_0 || type == DSP_Q4_1) {
        /* qs qword A (bytes 0-7): weights 0-7 (low nibbles), 16-23 (high); B: 8-15, 24-31 */
        const int bs = type == DSP_Q4_1 ? 20 : 18, off = type == DSP_Q4_1 ? 4 : 2;
#define QS(b) _mm_loadu_si128((const __m128i *)(p + (b) * bs + off))
#if VW == 16
        const __m256i y02 = _mm256_inserti128_si256(_mm256_castsi128_si256(QS(0)), QS(2), 1), y13 = _mm256_inserti128_si256(_mm256_castsi128_si256(QS(1)), QS(3), 1);
        const __m256i y46 = _mm256_inserti128_si256(_mm256_castsi128_si256(QS(4)), QS(6), 1), y57 = _mm256_inserti128_si256(_mm256_castsi128_si256(QS(5)), QS(7), 1);
        const __m512i e = _mm512_inserti64x4(_mm512_castsi256_si512(y02), y46, 1), o = _mm512_inserti64x4(_mm512_castsi256_si512(y13), y57, 1);
        const __m512i A = _mm512_unpacklo_epi64(e, o), B = _mm512_unpackhi_epi64(e, o); /* A_0 .. A_7, B_0 .. B_7 */
        w->W[0] = _mm512_and_si512(A, m4), w->W[1] = _mm512_and_si512(B, m4);
        w->W[2] = _mm512_and_si512(_mm512_srli_epi16(A, 4), m4), w->W[3] = _mm512_and_si512(_mm512_srli_epi16(B, 4), m4);
#else
        _Pragma("GCC unroll 8")
        for (int h = 0; h < 2; h++) {
            const __m256i y02 = _mm256_inserti128_si256(_mm256_castsi128_si256(QS(4 * h)), QS(4 * h + 2), 1);
            const __m256i y13 = _mm256_inserti128_si256(_mm256_castsi128_si256(QS(4 * h + 1)), QS(4 * h + 3), 1);
            const __m256i A = _mm256_unpacklo_epi64(y02, y13), B = _mm256_unpackhi_epi64(y02, y13);
            w->W[0 + h] = _mm256_and_si256(A, m4), w->W[2 + h] = _mm256_and_si256(B, m4);
            w->W[4 + h] = _mm256_and_si256(_mm256_srli_epi16(A, 4), m4), w->W[6 + h] = _mm256_and_si256(_mm256_srli_epi16(B, 4), m4);
        }
#endif
#undef QS
#if VW == 16
        q8_q4_headers(type, p, &w->s);
#else
        w->s.D = q8_lanes(q8_f16x8(p, bs, 0));
        if (type == DSP_Q4_1) w->s.M = q8_lanes(q8_f16x8(p, bs, 1));
#endif
    } else if (type == DSP_Q4_K || type == DSP_Q5_K) {
        /* sub-blocks 2h, 2h + 1 are the low / high nibbles of chunk h (qs[32h..]): their weights
         * 8k.. are qword k of the chunk, twice */
        const int q5 = type == DSP_Q5_K;
        const uint8_t *qs = p + (q5 ? 48 : 16), *qh = p + 16;
#if VW == 16
        const __m512i Z0 = _mm512_loadu_si512((const void *)qs), Z1 = _mm512_loadu_si512((const void *)(qs + 64));
        const __m512i jsh = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 4; k++) {
            __m512i v = _mm512_permutex2var_epi64(Z0, _mm512_setr_epi64(k, k, 4 + k, 4 + k, 8 + k, 8 + k, 12 + k, 12 + k), Z1);
            v = _mm512_and_si512(_mm512_mask_srli_epi64(v, 0xAA, v, 4), m4);
            if (q5) /* bit j of qh[l]: bit 4 of weight l of sub-block j */
                v = _mm512_or_si512(v, _mm512_slli_epi64(_mm512_and_si512(_mm512_srlv_epi64(bcast_q(QW(qh, k)), jsh), _mm512_set1_epi8(1)), 4));
            w->W[k] = v;
        }
#else
        const __m256i sh04 = _mm256_setr_epi64x(0, 4, 0, 4);
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 4; k++)
            _Pragma("GCC unroll 8")
            for (int h = 0; h < 2; h++) { /* sub-blocks 4h..4h+3: chunks 2h, 2h + 1 */
                __m256i v = _mm256_blend_epi32(bcast_q(QW(qs + 64 * h, k)), bcast_q(QW(qs + 64 * h + 32, k)), 0xF0);
                v = _mm256_and_si256(_mm256_srlv_epi64(v, sh04), m4);
                if (q5)
                    v = _mm256_or_si256(v, _mm256_slli_epi64(_mm256_and_si256(_mm256_srlv_epi64(bcast_q(QW(qh, k)), _mm256_setr_epi64x(4 * h, 4 * h + 1, 4 * h + 2, 4 * h + 3)),
                                                                              _mm256_set1_epi8(1)),
                                                             4));
                w->W[2 * k + h] = v;
            }
#endif
        __m256 D, M;
        q8_k4_scales(p, &D, &M);
        w->s.D = q8_lanes(D), w->s.M = q8_lanes(M);
    } else { /* Q6_K: block j = 4h + c, weights 8k..: nibble c / 2 of ql qword 8h + 4(c % 2) + k, bits 2c of qh qword 4h + k */
        const vi m2 = VI_SET1_8(3);
#if VW == 16
        const __m512i L0 = _mm512_loadu_si512((const void *)p), L1 = _mm512_loadu_si512((const void *)(p + 64));
        const __m512i H = _mm512_loadu_si512((const void *)(p + 128)), hsh = _mm512_setr_epi64(0, 2, 4, 6, 0, 2, 4, 6);
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 4; k++) {
            __m512i lo = _mm512_permutex2var_epi64(L0, _mm512_setr_epi64(k, 4 + k, k, 4 + k, 8 + k, 12 + k, 8 + k, 12 + k), L1);
            lo = _mm512_and_si512(_mm512_mask_srli_epi64(lo, 0xCC, lo, 4), m4);
            __m512i hi = _mm512_permutexvar_epi64(_mm512_setr_epi64(k, k, k, k, 4 + k, 4 + k, 4 + k, 4 + k), H);
            hi = _mm512_and_si512(_mm512_srlv_epi64(hi, hsh), m2);
            w->W[k] = _mm512_or_si512(lo, _mm512_slli_epi64(hi, 4));
        }
#else
        const __m256i lsh = _mm256_setr_epi64x(0, 0, 4, 4), hsh = _mm256_setr_epi64x(0, 2, 4, 6);
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 4; k++)
            _Pragma("GCC unroll 8")
            for (int h = 0; h < 2; h++) {
                const __m256i a = bcast_q(QW(p + 64 * h, k)), b = bcast_q(QW(p + 64 * h + 32, k)); /* c even, odd */
                __m256i lo = _mm256_and_si256(_mm256_srlv_epi64(_mm256_blend_epi32(a, b, 0xCC), lsh), m4);
                __m256i hi = _mm256_and_si256(_mm256_srlv_epi64(bcast_q(QW(p + 128 + 32 * h, k)), hsh), m2);
                w->W[2 * k + h] = _mm256_or_si256(lo, _mm256_slli_epi64(hi, 4));
            }
#endif
        __m256 D, Dh;
        q8_k6_scales(p, &D, &Dh);
        w->s.D = q8_lanes(D), w->s.Dh = q8_lanes(Dh);
    }
}

#if VW == 16
/* acc[0] (Q6_K: acc[0], acc[1] for the lower / upper 16) += the step's 16 half-block sums; the
 * accumulators come seeded with the offset correction. x: the step's 256 interleaved quants;
 * vector k holds quants 8k..8k+7 of each block (k = 0, 1: the lower 16). */
AI void q8_sums(const uint32_t type, const q8w *w, const int8_t *x, __m512i *acc) {
#if !defined(DSP_Q8_VNNI)
    if (type != DSP_Q8_0) { /* the 16-bit sums first: Q8_SUM16 below */
        const int per = type == DSP_Q6_K ? 2 : 4;
        for (int k0 = 0; k0 < 4; k0 += per) {
            __m512i z = _mm512_maddubs_epi16(w->W[k0], _mm512_loadu_si512((const void *)(x + 64 * k0)));
            for (int k = k0 + 1; k < k0 + per; k++) z = _mm512_add_epi16(z, _mm512_maddubs_epi16(w->W[k], _mm512_loadu_si512((const void *)(x + 64 * k))));
            __m512i *a = &acc[type == DSP_Q6_K ? k0 / 2 : 0];
            *a = _mm512_add_epi32(*a, _mm512_madd_epi16(z, _mm512_set1_epi16(1)));
        }
        return;
    }
#endif
    for (int k = 0; k < 4; k++) {
        const __m512i X = _mm512_loadu_si512((const void *)(x + 64 * k));
        __m512i *a = &acc[type == DSP_Q6_K ? k / 2 : 0];
#if defined(DSP_Q8_VNNI)
        *a = _mm512_dpbusd_epi32(*a, w->W[k], X);
#else
        /* Q8_0: |q| * (xq with q's sign) */
        const __m512i z = _mm512_maddubs_epi16(_mm512_abs_epi8(w->W[k]), _mm512_mask_sub_epi8(X, _mm512_movepi8_mask(w->W[k]), _mm512_setzero_si512(), X));
        *a = _mm512_add_epi32(*a, _mm512_madd_epi16(z, _mm512_set1_epi16(1)));
#endif
    }
}

/* one step of one activation row into its 16 lanes L; xr: the q8 row, b0: the step's first block */
AI lanes16 q8_step(const uint32_t type, const q8w *w, const uint8_t *xr, int64_t nbp, int64_t b0, lanes16 L) {
    const int sh = q8_offset_shift(type);
    const __m512 dx = _mm512_loadu_ps(dsp_cpu_q8_d(xr, nbp) + 2 * b0);
    __m512i acc[2];
    if (type == DSP_Q6_K) {
        acc[0] = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(dsp_cpu_q8_nSlo(xr, nbp) + 2 * b0)), 5);
        acc[1] = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(dsp_cpu_q8_nShi(xr, nbp) + 2 * b0)), 5);
    } else {
        acc[0] = sh >= 0 ? _mm512_sll_epi32(_mm512_loadu_si512((const void *)(dsp_cpu_q8_nS(xr, nbp) + 2 * b0)), _mm_cvtsi32_si128(sh)) : _mm512_setzero_si512();
    }
    q8_sums(type, w, dsp_cpu_q8_q(xr) + 32 * b0, acc);
    L = _mm512_fmadd_ps(_mm512_mul_ps(w->s.D, dx), _mm512_cvtepi32_ps(acc[0]), L);
    if (type == DSP_Q6_K) L = _mm512_fmadd_ps(_mm512_mul_ps(w->s.Dh, dx), _mm512_cvtepi32_ps(acc[1]), L);
    if (dsp_cpu_q8_has_min(type)) L = _mm512_fmadd_ps(w->s.M, _mm512_loadu_ps(dsp_cpu_q8_s(xr, nbp) + 2 * b0), L);
    return L;
}
AI float q8_lanes_sum(lanes16 L) { return hsum8(_mm256_add_ps(_mm512_castps512_ps256(L), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(L), 1)))); }
AI lanes16 q8_lanes_zero(void) { return _mm512_setzero_ps(); }
#else
/* as above with 256-bit vectors: vector 2k + h holds quants 8k..8k+7 of blocks 4h..4h+3;
 * acc[2 * part + h] with part = lower / upper 16 for Q6_K, else 0 */
AI void q8_sums(const uint32_t type, const q8w *w, const int8_t *x, __m256i *acc) {
#if !defined(DSP_Q8_VNNI)
    if (type != DSP_Q8_0) { /* the 16-bit sums first: Q8_SUM16 below */
        const int per = type == DSP_Q6_K ? 2 : 4;
        for (int k0 = 0; k0 < 4; k0 += per)
            for (int h = 0; h < 2; h++) {
                __m256i z = _mm256_maddubs_epi16(w->W[2 * k0 + h], _mm256_loadu_si256((const __m256i *)(x + 64 * k0 + 32 * h)));
                for (int k = k0 + 1; k < k0 + per; k++)
                    z = _mm256_add_epi16(z, _mm256_maddubs_epi16(w->W[2 * k + h], _mm256_loadu_si256((const __m256i *)(x + 64 * k + 32 * h))));
                __m256i *a = &acc[2 * (type == DSP_Q6_K ? k0 / 2 : 0) + h];
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(z, _mm256_set1_epi16(1)));
            }
        return;
    }
#endif
    for (int k = 0; k < 4; k++)
        for (int h = 0; h < 2; h++) {
            const __m256i X = _mm256_loadu_si256((const __m256i *)(x + 64 * k + 32 * h)), W = w->W[2 * k + h];
            __m256i *a = &acc[2 * (type == DSP_Q6_K ? k / 2 : 0) + h];
#if defined(DSP_Q8_VNNI)
            *a = _mm256_dpbusd_avx_epi32(*a, W, X);
#else
            const __m256i z = type == DSP_Q8_0 ? _mm256_maddubs_epi16(_mm256_abs_epi8(W), _mm256_sign_epi8(X, W)) : _mm256_maddubs_epi16(W, X);
            *a = _mm256_add_epi32(*a, _mm256_madd_epi16(z, _mm256_set1_epi16(1)));
#endif
        }
}

/* the integer accumulators of a step (acc[2 * part + h] as above), seeded with the weights'
 * offset correction */
AI void q8_seed(const uint32_t type, const uint8_t *xr, int64_t nbp, int64_t b0, __m256i *acc) {
    const int sh = q8_offset_shift(type);
    for (int h = 0; h < 2; h++) {
        if (type == DSP_Q6_K) {
            acc[h] = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(dsp_cpu_q8_nSlo(xr, nbp) + 2 * b0 + 8 * h)), 5);
            acc[2 + h] = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(dsp_cpu_q8_nShi(xr, nbp) + 2 * b0 + 8 * h)), 5);
        } else {
            acc[h] = sh >= 0 ? _mm256_sll_epi32(_mm256_loadu_si256((const __m256i *)(dsp_cpu_q8_nS(xr, nbp) + 2 * b0 + 8 * h)), _mm_cvtsi32_si128(sh))
                             : _mm256_setzero_si256();
        }
    }
}

/* the float part of a step, from its exact block sums acc: the ops.h order, shared by the tile and
 * the one-row paths so that both give the same bits */
AI lanes16 q8_fstep(const uint32_t type, const q8sc *s, const __m256i *acc, const uint8_t *xr, int64_t nbp, int64_t b0, lanes16 L) {
    for (int h = 0; h < 2; h++) {
        const __m256 dx = _mm256_loadu_ps(dsp_cpu_q8_d(xr, nbp) + 2 * b0 + 8 * h);
        L.v[h] = _mm256_fmadd_ps(_mm256_mul_ps(s->D.v[h], dx), _mm256_cvtepi32_ps(acc[h]), L.v[h]);
        if (type == DSP_Q6_K) L.v[h] = _mm256_fmadd_ps(_mm256_mul_ps(s->Dh.v[h], dx), _mm256_cvtepi32_ps(acc[2 + h]), L.v[h]);
        if (dsp_cpu_q8_has_min(type)) L.v[h] = _mm256_fmadd_ps(s->M.v[h], _mm256_loadu_ps(dsp_cpu_q8_s(xr, nbp) + 2 * b0 + 8 * h), L.v[h]);
    }
    return L;
}

AI lanes16 q8_step(const uint32_t type, const q8w *w, const uint8_t *xr, int64_t nbp, int64_t b0, lanes16 L) {
    __m256i acc[4];
    q8_seed(type, xr, nbp, b0, acc);
    q8_sums(type, w, dsp_cpu_q8_q(xr) + 32 * b0, acc);
    return q8_fstep(type, &w->s, acc, xr, nbp, b0, L);
}
AI float q8_lanes_sum(lanes16 L) { return hsum8(_mm256_add_ps(L.v[0], L.v[1])); }
AI lanes16 q8_lanes_zero(void) {
    lanes16 r = {{_mm256_setzero_ps(), _mm256_setzero_ps()}};
    return r;
}
#endif

/* one step (8 blocks at p; b0 the first block) of the tile: unpack the weights, then each
 * activation row's lanes */
AI void q8_tile_step(const uint32_t type, const int XR, const uint8_t *p, const uint8_t *xq, size_t ldq, int64_t nbp, int64_t b0, lanes16 *L) {
    q8w w;
    q8_unpack(type, p, &w);
    _Pragma("GCC unroll 16")
    for (int i = 0; i < XR; i++) L[i] = q8_step(type, &w, xq + (size_t)i * ldq, nbp, b0, L[i]);
}

/* y[i * ldy] = q8 dot of the weight row at `row` with the XR q8 rows xq + i * ldq */
AI void q8_tile(const uint32_t type, const int XR, const uint8_t *row, int64_t in, const uint8_t *xq, size_t ldq, float *y, int64_t ldy,
                int64_t pf) {
    if (XR > Q8_MAXX) return;
    const int64_t nb = in / 32, nbp = dsp_cpu_q8_nbp(in), SB = row_bytes_of(type, 256); /* one step */
    lanes16 L[Q8_MAXX];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < XR; i++) L[i] = q8_lanes_zero();
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        const uint8_t *p = row + b0 / 8 * SB;
        if (pf)
            for (int64_t o = 0; o < SB; o += 64) _mm_prefetch((const char *)p + pf + o, _MM_HINT_T0);
        q8_tile_step(type, XR, p, xq, ldq, nbp, b0, L);
    }
    if (b0 < nb) { /* the last, partial step (legacy types only): zero blocks after the row's end */
        _Alignas(64) uint8_t tail[8 * 34] = {0};
        memcpy(tail, row + b0 / 8 * SB, (size_t)row_bytes_of(type, 32 * (nb - b0)));
        q8_tile_step(type, XR, tail, xq, ldq, nbp, b0, L);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < XR; i++) y[i * ldy] = q8_lanes_sum(L[i]);
}

#if VW == 8
/* ---- one activation row, weights in their own order (AVX2) -----------------------------------
 * For one activation row the transposition of q8_unpack is pure overhead: each weight byte is
 * used once. Here each 32-weight block is unpacked into one vector u in its own order (byte e =
 * weight e) and meets the row's natural-order quants qn; the quad sums Q[j] = sum over bytes
 * 4j..4j+3 of u * xq (vpmaddubsw + vpmaddwd, or vpdpbusd) reduce to the half sums of ops.h,
 * P[h] = Q[h] + Q[h + 2] + Q[h + 4] + Q[h + 6] (Q6_K: P_lo[h] = Q[h] + Q[h + 2], P_hi from Q[4..7]),
 * in the tile path's accumulator layout. The integers are exact, and the float part is q8_fstep
 * itself, so a row gives the same bits here as in any tile. */

/* quad sums of unsigned u times signed x */
AI __m256i q8_quads(__m256i u, __m256i x) {
#if defined(DSP_Q8_VNNI)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

/* blocks a, b: [a: Q0+Q2, Q1+Q3, b: Q0+Q2, Q1+Q3 | a: Q4+Q6, Q5+Q7, b: Q4+Q6, Q5+Q7] */
AI __m256i q8_pair(__m256i a, __m256i b) { return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b)); }

/* lane order [0 1 4 5 2 3 6 7] of 8 per-block floats -> lanes16 (block b at lanes 2b, 2b + 1)
 * with in-lane unpacks (the legacy scales are loaded in that order) */
AI lanes16 q8_lanes_0145(__m256 v) {
    lanes16 r = {{_mm256_unpacklo_ps(v, v), _mm256_unpackhi_ps(v, v)}};
    return r;
}
static const int q8_ord_0145[8] = {0, 1, 4, 5, 2, 3, 6, 7};

/* a step (8 blocks at p) in natural order: u[b] = block b's unsigned weight bytes (Q8_0: the
 * signed bytes themselves, see q8_row_step), scales as q8_unpack's. The legacy types' last step
 * may have nblk < 8 blocks: the others are zero weights and scales, the padding of ops.h, read
 * from nowhere (a zeroed copy of the tail cost a rep stos per row: 14% of SmolLM2's decode) */
AI void q8_unpack_row(const uint32_t type, const uint8_t *p, int nblk, __m256i *u, q8sc *s) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (type == DSP_Q8_0) {
        for (int b = 0; b < 8; b++) u[b] = b < nblk ? _mm256_loadu_si256((const __m256i *)(p + 34 * b + 2)) : _mm256_setzero_si256();
        s->D = q8_lanes_0145(q8_f16x8_at(p, 34, 0, q8_ord_0145, nblk));
    } else if (type == DSP_Q4_0 || type == DSP_Q4_1) { /* qs byte k: weight k (low nibble), k + 16 (high) */
        const int bs = type == DSP_Q4_1 ? 20 : 18, off = type == DSP_Q4_1 ? 4 : 2;
        const __m256i sh = _mm256_setr_epi64x(0, 0, 4, 4);
        for (int b = 0; b < 8; b++)
            u[b] = b < nblk ? _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + bs * b + off))), sh), m4)
                            : _mm256_setzero_si256();
        s->D = q8_lanes_0145(q8_f16x8_at(p, bs, 0, q8_ord_0145, nblk));
        if (type == DSP_Q4_1) s->M = q8_lanes_0145(q8_f16x8_at(p, bs, 1, q8_ord_0145, nblk));
    } else if (type == DSP_Q4_K || type == DSP_Q5_K) { /* sub-blocks 2c, 2c + 1: low / high nibbles of qs[32c..] */
        const int q5 = type == DSP_Q5_K;
        const uint8_t *qs = p + (q5 ? 48 : 16);
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            u[2 * c] = _mm256_and_si256(v, m4), u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        if (q5) { /* bit j of qh[e] -> bit 4 of weight e of sub-block j (16-bit shifts by at most 4 stay in the byte) */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16)), b4 = _mm256_set1_epi8(0x10);
            u[0] = _mm256_or_si256(u[0], _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
            u[1] = _mm256_or_si256(u[1], _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
            u[2] = _mm256_or_si256(u[2], _mm256_and_si256(_mm256_slli_epi16(qh, 2), b4));
            u[3] = _mm256_or_si256(u[3], _mm256_and_si256(_mm256_slli_epi16(qh, 1), b4));
            u[4] = _mm256_or_si256(u[4], _mm256_and_si256(qh, b4));
            u[5] = _mm256_or_si256(u[5], _mm256_and_si256(_mm256_srli_epi16(qh, 1), b4));
            u[6] = _mm256_or_si256(u[6], _mm256_and_si256(_mm256_srli_epi16(qh, 2), b4));
            u[7] = _mm256_or_si256(u[7], _mm256_and_si256(_mm256_srli_epi16(qh, 3), b4));
        }
        __m256 D, M;
        q8_k4_scales(p, &D, &M);
        s->D = q8_lanes(D), s->M = q8_lanes(M);
    } else { /* Q6_K: block 4h + c: nibble c / 2 of ql[64h + 32(c % 2)..], bits 2c of qh[32h..] at bit 4 */
        const __m256i m2 = _mm256_set1_epi8(0x30);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h)), l1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            u[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
            u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
            u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
            u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
        }
        __m256 D, Dh;
        q8_k6_scales(p, &D, &Dh);
        s->D = q8_lanes(D), s->Dh = q8_lanes(Dh);
    }
}

AI lanes16 q8_row_step(const uint32_t type, const uint8_t *p, int nblk, const uint8_t *xr, int64_t nbp, int64_t b0, lanes16 L) {
    __m256i u[8], Q[8], acc[4];
    q8sc s;
    q8_unpack_row(type, p, nblk, u, &s);
    const int8_t *x = dsp_cpu_q8_qn(xr, nbp) + 32 * b0;
    for (int b = 0; b < 8; b++) {
        const __m256i X = _mm256_loadu_si256((const __m256i *)(x + 32 * b));
#if defined(DSP_Q8_VNNI)
        /* Q8_0: u = q + 128 against the offset correction q8_seed adds (q8_offset_shift), as the tile
         * path; the sign trick with that correction too was wrong (seen on an AVX-VNNI Xeon) */
        Q[b] = q8_quads(type == DSP_Q8_0 ? _mm256_xor_si256(u[b], _mm256_set1_epi8((char)0x80)) : u[b], X);
#else
        /* Q8_0: |q| times xq with q's sign (|q| <= 128 cannot saturate vpmaddubsw; no offset) */
        Q[b] = type == DSP_Q8_0 ? q8_quads(_mm256_abs_epi8(u[b]), _mm256_sign_epi8(X, u[b])) : q8_quads(u[b], X);
#endif
    }
    q8_seed(type, xr, nbp, b0, acc);
    for (int h = 0; h < 2; h++) { /* blocks 4h..4h+3 */
        const __m256i s01 = q8_pair(Q[4 * h], Q[4 * h + 1]), s23 = q8_pair(Q[4 * h + 2], Q[4 * h + 3]);
        if (type == DSP_Q6_K) {
            acc[h] = _mm256_add_epi32(acc[h], _mm256_permute2x128_si256(s01, s23, 0x20));
            acc[2 + h] = _mm256_add_epi32(acc[2 + h], _mm256_permute2x128_si256(s01, s23, 0x31));
        } else { /* [s01.lo + s01.hi | s23.hi + s23.lo] */
            acc[h] = _mm256_add_epi32(acc[h], _mm256_add_epi32(_mm256_blend_epi32(s01, s23, 0xF0), _mm256_permute2x128_si256(s01, s23, 0x21)));
        }
    }
    return q8_fstep(type, &s, acc, xr, nbp, b0, L);
}

/* *y = q8 dot of the weight row at `row` with the q8 row xr */
AI void q8_row(const uint32_t type, const uint8_t *row, int64_t in, const uint8_t *xr, float *y, int64_t pf) {
    const int64_t nb = in / 32, nbp = dsp_cpu_q8_nbp(in), SB = row_bytes_of(type, 256);
    lanes16 L = q8_lanes_zero();
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        const uint8_t *p = row + b0 / 8 * SB;
        for (int64_t o = 0; o < SB; o += 64) _mm_prefetch((const char *)p + pf + o, _MM_HINT_T0);
        L = q8_row_step(type, p, 8, xr, nbp, b0, L);
    }
    if (b0 < nb) L = q8_row_step(type, row + b0 / 8 * SB, (int)(nb - b0), xr, nbp, b0, L); /* legacy types only */
    *y = q8_lanes_sum(L);
}

#define Q8R(T) \
    static void q8row_##T(const uint8_t *row, int64_t in, const uint8_t *xr, float *y, int64_t pf) { q8_row(T, row, in, xr, y, pf); }
Q8R(DSP_Q8_0)
Q8R(DSP_Q4_0)
Q8R(DSP_Q4_1)
Q8R(DSP_Q4_K)
Q8R(DSP_Q5_K)
Q8R(DSP_Q6_K)

typedef void (*q8row_fn)(const uint8_t *, int64_t, const uint8_t *, float *, int64_t);
static q8row_fn q8row_for(uint32_t type) {
    switch (type) {
    case DSP_Q8_0: return q8row_DSP_Q8_0;
    case DSP_Q4_0: return q8row_DSP_Q4_0;
    case DSP_Q4_1: return q8row_DSP_Q4_1;
    case DSP_Q4_K: return q8row_DSP_Q4_K;
    case DSP_Q5_K: return q8row_DSP_Q5_K;
    case DSP_Q6_K: return q8row_DSP_Q6_K;
    default: return NULL;
    }
}
#endif

#define Q8C(T, xr) \
    case xr: q8_tile(T, xr, row, in, xq, ldq, y, ldy, pf); break;
#define Q8T(T)                                                                                                                 \
    static void q8tile_##T(int xr, const uint8_t *row, int64_t in, const uint8_t *xq, size_t ldq, float *y, int64_t ldy, int64_t pf) { \
        switch (xr) {                                                                                                          \
            Q8C(T, 1) Q8C(T, 2) Q8C(T, 3) Q8C(T, 4) Q8C(T, 5) Q8C(T, 6) Q8C(T, 7) Q8C(T, 8) Q8C(T, 9) Q8C(T, 10) Q8C(T, 11) Q8C(T, 12) Q8C(T, 13) Q8C(T, 14) Q8C(T, 15) Q8C(T, 16) \
        default: break;                                                                                                        \
        }                                                                                                                      \
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

/* tiles of 1 weight row x up to Q8_MAXX activation rows, balanced (13 rows: 7 + 6). Loop order:
 * for each chunk of DSP_CPU_MM_ROWS weight rows, each tile of activation rows (a few KiB of q8
 * rows, L1-resident) meets every weight row of the chunk (L1/L2-resident after the first tile). */
static void k_matmul_q8(uint32_t type, const void *w, size_t row_bytes, int64_t in, int64_t r0, int64_t r1, const void *xq, size_t ldq,
                        int n_x, float *y, int64_t ldy) {
    const q8tile_fn ft = q8_for(type);
    if (!ft) return; /* the caller checked dsp_cpu_q8_type */
#if VW == 8
    if (n_x == 1) {
        const q8row_fn fr = q8row_for(type);
        for (int64_t r = r0; r < r1; r++)
            fr((const uint8_t *)w + (size_t)r * row_bytes, in, xq, y + r, (int64_t)row_bytes * PF_ROWS);
        return;
    }
#endif
    const int nt = (n_x + Q8_MAXX - 1) / Q8_MAXX, tx = nt ? (n_x + nt - 1) / nt : 1;
    for (int64_t c0 = r0; c0 < r1; c0 += DSP_CPU_MM_ROWS) {
        const int64_t c1 = c0 + DSP_CPU_MM_ROWS < r1 ? c0 + DSP_CPU_MM_ROWS : r1;
        for (int i = 0; i < n_x; i += tx) {
            const int xr = n_x - i < tx ? n_x - i : tx;
            const int64_t pf = i == 0 ? (int64_t)row_bytes * PF_ROWS : 0; /* the first tile streams the chunk from memory */
            for (int64_t r = c0; r < c1; r++)
                ft(xr, (const uint8_t *)w + (size_t)r * row_bytes, in, (const uint8_t *)xq + (size_t)i * ldq, ldq, y + (size_t)i * ldy + r, ldy, pf);
        }
    }
}

/* ---- quantization ------------------------------------------------------------------------------ */

static void k_quantize_q8(const float *x, int64_t n, void *dst) {
    const int64_t nb = n / 32, nbp = dsp_cpu_q8_nbp(n);
    int8_t *q = dst;
    float *d = (float *)(q + 32 * nbp), *s = d + 2 * nbp;
    int32_t *nS = (int32_t *)(s + 2 * nbp), *nSlo = nS + 2 * nbp, *nShi = nSlo + 2 * nbp;
    const vf absmask = VF_ABSMASK;
    for (int64_t b = 0; b < nbp; b++) {
        int8_t qb[32] = {0};
        float db = 0;
        if (b < nb) {
            const float *xb = x + 32 * b;
            vf m = vzero();
            for (int g = 0; g < NG; g++) m = vmax(vand(vload(xb + VW * g), absmask), m); /* a NaN element is dropped, like fmaxf */
            const float amax = vhmax(m), id = (db = amax / 127.0f) != 0.0f ? 1.0f / db : 0.0f;
            for (int g = 0; g < NG; g++) {
                vf v = vmul(vload(xb + VW * g), vset1(id));
                v = vmin(vmax(v, vset1(-127.0f)), vset1(127.0f)); /* NaN -> -127 */
                VSTORE_I8(qb + VW * g, VCVT_I32(v));             /* round to nearest even */
            }
        }
        /* sums of the 4-quant groups (vpmaddubsw by 1, then vpmaddwd by 1: exact), g[j] over j = k / 4 */
        const __m128i one8 = _mm_set1_epi8(1), one16 = _mm_set1_epi16(1);
        const __m128i glo = _mm_madd_epi16(_mm_maddubs_epi16(one8, _mm_loadu_si128((const __m128i *)qb)), one16);
        const __m128i ghi = _mm_madd_epi16(_mm_maddubs_epi16(one8, _mm_loadu_si128((const __m128i *)(qb + 16))), one16);
        const __m128i h = _mm_add_epi32(_mm_unpacklo_epi64(glo, ghi), _mm_unpackhi_epi64(glo, ghi)); /* g0+g2, g1+g3, g4+g6, g5+g7 */
        int32_t sum[2][2];
        _mm_storeu_si128((__m128i *)sum, h);
        for (int k = 0; k < 4; k++) memcpy(q + dsp_cpu_q8_index(b, 8 * k), qb + 8 * k, 8);
        memcpy(q + 72 * nbp + 32 * b, qb, 32); /* qn */
        dsp_cpu_q8_put_sums(b, db, sum, d, s, nS, nSlo, nShi);
    }
}
