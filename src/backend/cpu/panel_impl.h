/* backend/cpu/panel_impl.h: matmuls on panel weights (ops.h, "panel order") for the SIMD tables.
 * Included by simd_impl.h only, so compiled once per ISA translation unit with its flags.
 *
 * A vector holds VW of a panel's 16 outputs (AVX-512: all of them; AVX2: half), so no horizontal
 * sum is ever needed. Per block the 256 bytes of nibbles are unpacked once (4 loads, and/shift) to
 * 8 vectors of unsigned bytes, vector g holding elements 4g..4g+3 of each output (g < 4: the low
 * nibbles of row group g, else the high nibbles of row group g - 4), which pair with activation
 * dword g of the block: vpdpbusd (or vpmaddubsw + vpmaddwd) of the broadcast dword, seeded with
 * -8 * (the block's activation sum), gives the exact P_b of every output at once. Then one
 * multiply (D_w * dx) and one FMA per block and activation row: the chain of ops.h.
 *
 * With AMX (the avx512vnni table, dsp_cpu_amx_usable) whole groups of 16 activation rows take a
 * tile product per block instead: A = the 16 rows' quants of the block (natural order, straight
 * from the q8 rows), B = the block's unpacked signed weights (the same 8 x 64 bytes, minus 8),
 * C = the 16 x 16 exact P_b, then the same chain on C's rows. The integers are exact and the float
 * chain is written the same way, so every path gives the oracle's bits (test_kernels). */

#define PANEL_ROWS (VW == 16 ? 8 : 4) /* activation rows per pass over a panel's blocks (vector path) */
#define PANEL_HALVES (16 / VW)

#if VW == 16
typedef __m512i pvi;
AI pvi p_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
AI pvi p_set1(int32_t v) { return _mm512_set1_epi32(v); }
AI pvi p_nib_lo(pvi v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
AI pvi p_nib_hi(pvi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
AI vf p_scales(const uint16_t *d) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d)); }
AI vf p_cvt(pvi v) { return _mm512_cvtepi32_ps(v); }
AI pvi p_dp(pvi acc, pvi u, pvi x) {
#if defined(DSP_Q8_VNNI)
    return _mm512_dpbusd_epi32(acc, u, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)));
#endif
}
#else
typedef __m256i pvi;
AI pvi p_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
AI pvi p_set1(int32_t v) { return _mm256_set1_epi32(v); }
AI pvi p_nib_lo(pvi v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
AI pvi p_nib_hi(pvi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
AI vf p_scales(const uint16_t *d) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d)); }
AI vf p_cvt(pvi v) { return _mm256_cvtepi32_ps(v); }
AI pvi p_dp(pvi acc, pvi u, pvi x) {
#if defined(DSP_Q8_VNNI)
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}
#endif

/* outputs [16 p + VW h, + VW) of panel p for activation rows x[0..nr) (nr <= PANEL_ROWS); q41: the
 * weights are the nibbles plus a min (m16: the mins), else nibble - 8 */
AI void panel_pass(const uint8_t *nib, const uint16_t *d16, const uint16_t *m16, int64_t nb, int h, const uint8_t *const *x, int nr, int64_t nbp,
                   float *const *y, int nv, const int q41) {
    vf acc[PANEL_ROWS];
    for (int m = 0; m < PANEL_ROWS; m++) acc[m] = vzero();
    for (int64_t b = 0; b < nb; b++, nib += 256, d16 += 16, m16 += 16) {
        pvi u[8];
        for (int r = 0; r < 4; r++) {
            const pvi v = p_load(nib + 64 * r + 4 * VW * h);
            u[r] = p_nib_lo(v), u[r + 4] = p_nib_hi(v);
        }
        const vf dw = p_scales(d16 + VW * h), mw = q41 ? p_scales(m16 + VW * h) : vzero();
        for (int m = 0; m < PANEL_ROWS; m++) {
            if (m >= nr) break;
            const int32_t *nS = dsp_cpu_q8_nS(x[m], nbp);
            int32_t xd[8];
            memcpy(xd, dsp_cpu_q8_qn(x[m], nbp) + 32 * b, sizeof xd);
            pvi s = p_set1(q41 ? 0 : 8 * (nS[2 * b] + nS[2 * b + 1])); /* Q4_0: -8 * S */
            for (int g = 0; g < 8; g++) s = p_dp(s, u[g], p_set1(xd[g]));
            acc[m] = vfma(vmul(dw, vset1(dsp_cpu_q8_d(x[m], nbp)[2 * b])), p_cvt(s), acc[m]);
            if (q41) acc[m] = vfma(mw, vset1(dsp_cpu_q8_s(x[m], nbp)[2 * b]), acc[m]);
        }
    }
    for (int m = 0; m < nr; m++) {
        if (nv >= VW) vstore(y[m], acc[m]);
        else vstoren(y[m], acc[m], nv);
    }
}

#if VW == 16 && defined(DSP_Q8_VNNI)
#define PANEL_AMX 1
#define PANEL_AMX_MIN 16 /* activation rows from which AMX takes over (fewer: the vector pass, faster at 9 rows) */
#define AMX_TGT __attribute__((target("amx-tile,amx-int8")))
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* tiles for groups of R <= 16 activation rows */
AMX_TGT static void amx_config(int R) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = (uint8_t)R, c.colsb[0] = 32; /* A: R activation rows x one block of quants */
    c.rows[1] = 8, c.colsb[1] = 64;          /* B: the block's 32 signed weights of 16 outputs, 4 per output and row */
    c.rows[2] = (uint8_t)R, c.colsb[2] = 64; /* C: R rows x 16 outputs, int32 */
    /* gcc 12 does not see that ldtilecfg reads all 64 bytes and dropped the stores of rows and
     * colsb (a #GP at run time): make them happen first */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

/* activation rows [0, n) x outputs of panels [p0, p1): groups of 16 rows, the last of n % 16. The B
 * tile holds nibble - 8 for both types; Q4_1's P is then C + 8 S. */
AMX_TGT static void panel_amx(const uint8_t *nib0, const uint16_t *d0, const uint16_t *m0, int64_t nb, int64_t p0, int64_t p1, int64_t r1,
                              const uint8_t *xq, size_t ldq, int64_t nbp, int n, float *y, int64_t ldy, const int q41) {
    int cfg = 0;
    int8_t bt[512] __attribute__((aligned(64)));
    int32_t ct[16][16] __attribute__((aligned(64)));
    const __m512i e8 = _mm512_set1_epi8(8);
    for (int64_t p = p0; p < p1; p++) {
        const int nv = r1 - 16 * p < 16 ? (int)(r1 - 16 * p) : 16;
        for (int i0 = 0; i0 < n; i0 += 16) {
            const int R = n - i0 < 16 ? n - i0 : 16;
            if (R != cfg) amx_config(cfg = R);
            __m512 acc[16];
            for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
            const uint8_t *nib = nib0 + (size_t)p * nb * 256;
            const uint16_t *d16 = d0 + (size_t)p * nb * 16, *m16 = q41 ? m0 + (size_t)p * nb * 16 : d16; /* Q4_0: never read */
            const uint8_t *xb = xq + (size_t)i0 * ldq;
            for (int64_t b = 0; b < nb; b++, nib += 256, d16 += 16, m16 += 16) {
                for (int r = 0; r < 4; r++) {
                    const __m512i v = _mm512_loadu_si512((const void *)(nib + 64 * r));
                    _mm512_store_si512(bt + 64 * r, _mm512_sub_epi8(p_nib_lo(v), e8));
                    _mm512_store_si512(bt + 64 * (r + 4), _mm512_sub_epi8(p_nib_hi(v), e8));
                }
                _tile_loadd(0, dsp_cpu_q8_qn(xb, nbp) + 32 * b, (long)ldq);
                _tile_loadd(1, bt, 64);
                _tile_zero(2);
                _tile_dpbssd(2, 0, 1);
                _tile_stored(2, ct, 64);
                const __m512 dw = p_scales(d16), mw = q41 ? p_scales(m16) : _mm512_setzero_ps();
                for (int m = 0; m < R; m++) {
                    const uint8_t *xm = xb + (size_t)m * ldq;
                    const float dx = dsp_cpu_q8_d(xm, nbp)[2 * b];
                    __m512i P = _mm512_load_si512(ct[m]);
                    if (q41) { /* + 8 S */
                        const int32_t *nS = dsp_cpu_q8_nS(xm, nbp);
                        P = _mm512_sub_epi32(P, _mm512_set1_epi32(8 * (nS[2 * b] + nS[2 * b + 1])));
                    }
                    acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(P), acc[m]);
                    if (q41) acc[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(dsp_cpu_q8_s(xm, nbp)[2 * b]), acc[m]);
                }
            }
            for (int m = 0; m < R; m++) {
                float *o = y + (size_t)(i0 + m) * ldy + 16 * p;
                if (nv == 16) _mm512_storeu_ps(o, acc[m]);
                else _mm512_mask_storeu_ps(o, (__mmask16)((1u << nv) - 1u), acc[m]);
            }
        }
    }
    _tile_release();
}
#endif

static void k_matmul_panel(uint32_t type, const void *pw, int64_t in, int64_t out, int64_t r0, int64_t r1, const void *xq, size_t ldq, int n_x,
                           float *y, int64_t ldy) {
    const int64_t nb = in / 32, nbp = dsp_cpu_q8_nbp(in), np = (out + 15) / 16, p0 = r0 / 16, p1 = (r1 + 15) / 16;
    const int q41 = type == DSP_Q4_1;
    const uint8_t *nib = pw;
    const uint16_t *d = (const uint16_t *)(nib + (size_t)np * nb * 256), *mn = d + (size_t)np * nb * 16; /* mn: Q4_1 only */
    int i0 = 0;
#if defined(PANEL_AMX)
    if (n_x >= PANEL_AMX_MIN && dsp_cpu_amx_usable()) {
        panel_amx(nib, d, mn, nb, p0, p1, r1, xq, ldq, nbp, n_x, y, ldy, q41);
        i0 = n_x;
    }
#endif
    for (int64_t p = p0; p < p1; p++)
        for (int h = 0; h < PANEL_HALVES; h++) {
            const int64_t o0 = 16 * p + VW * h;
            if (o0 >= r1) break;
            const int nv = r1 - o0 < VW ? (int)(r1 - o0) : VW;
            for (int i = i0; i < n_x; i += PANEL_ROWS) {
                const int nr = n_x - i < PANEL_ROWS ? n_x - i : PANEL_ROWS;
                const uint8_t *x[PANEL_ROWS];
                float *yo[PANEL_ROWS];
                for (int m = 0; m < nr; m++) x[m] = (const uint8_t *)xq + (size_t)(i + m) * ldq, yo[m] = y + (size_t)(i + m) * ldy + o0;
                const uint8_t *pn = nib + (size_t)p * nb * 256;
                const uint16_t *pd = d + (size_t)p * nb * 16, *pm = q41 ? mn + (size_t)p * nb * 16 : pd; /* Q4_0: never read */
                if (q41) panel_pass(pn, pd, pm, nb, h, x, nr, nbp, yo, nv, 1);
                else panel_pass(pn, pd, pm, nb, h, x, nr, nbp, yo, nv, 0);
            }
        }
}
