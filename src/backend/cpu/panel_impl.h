/* backend/cpu/panel_impl.h: matmuls on panel weights (ops.h, "panel order") for the SIMD tables.
 * Included by simd_impl.h only, so compiled once per ISA translation unit with its flags.
 *
 * A vector holds VW of a panel's 16 outputs (AVX-512: all of them; AVX2: half), so no horizontal
 * sum is ever needed. Per block the panel's bytes are unpacked once (4 loads, and/shift; Q5_K and
 * Q6_K or in their high bits from one or two more) to 8 vectors of unsigned bytes u[g], vector g
 * holding elements 4g..4g+3 of each output, which pair with activation dword g of the block:
 * vpdpbusd (or vpmaddubsw + vpmaddwd) of the broadcast dword, seeded with -off * (the block's
 * activation sum), gives the exact P of every output at once (Q6_K: P_lo from g < 4, P_hi from the
 * rest, each with its own seed). Then one multiply (D_w * dx) and one FMA per block and activation
 * row (a second FMA for the min or Q6_K's upper half): the chain of ops.h.
 *
 * With AMX (the avx512vnni table, dsp_cpu_amx_usable), from PANEL_AMX_MIN rows, groups of 16 (or one
 * group of 12-15) take a tile product per block instead: A = the group's quants of the block (natural
 * order, straight from the q8 rows), B = the block's unpacked weights (the same 8 x 64 bytes as
 * signed bytes: u - o for the types without a min, u itself for those with one, u <= 31), C = the
 * exact P of 16 outputs (Q6_K: two products of half the depth), then the same chain on C's rows.
 * The integers are exact and the float chain is written the same way, so every path gives the
 * oracle's bits (test_kernels).
 *
 * Both paths prefetch the weights ahead in software: without it the vector pass streamed about half
 * the bandwidth (bench_kernels --panel: one row 5.0 -> 2.5 ms over 64 MiB of Q4_1). */

/* activation rows per pass over a panel's blocks at most (vector path). AVX-512: 8, not 12 (32
 * registers would hold 12 accumulators, the 8 unpacked weight vectors and the scales, but passes of
 * 9-12 rows ran at ~145 GMAC/s against ~180 for 8: bench_kernels --panel --type q4_1 --in 512 on the
 * 2-core Xeon, 9 rows 1.64 -> 1.42 ms, 12 rows 2.23 -> 1.84, 17 rows 2.94 -> 2.61; 8 and 16 alike) */
#define PANEL_ROWS (VW == 16 ? 8 : 4)
#define PANEL_HALVES (16 / VW)
#define PANEL_PF 8 /* blocks the vector pass prefetches ahead (the next panel's follow a panel's last) */

#if VW == 16
typedef __m512i pvi;
AI pvi p_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
AI pvi p_set1(int32_t v) { return _mm512_set1_epi32(v); }
AI pvi p_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
AI pvi p_nib_lo(pvi v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
AI pvi p_nib_hi(pvi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
AI vf p_scales(const uint16_t *d) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d)); }
AI vf p_cvt(pvi v) { return _mm512_cvtepi32_ps(v); }
#if defined(DSP_Q8_VNNI)
AI pvi p_dp(pvi acc, pvi u, pvi x) { return _mm512_dpbusd_epi32(acc, u, x); }
#endif
/* without VNNI (p_dp_run): u x x word pairs; words added; acc + their dword pairs */
AI pvi p_maddubs(pvi u, pvi x) { return _mm512_maddubs_epi16(u, x); }
AI pvi p_add16(pvi a, pvi b) { return _mm512_add_epi16(a, b); }
AI pvi p_madd1_add(pvi acc, pvi t) { return _mm512_add_epi32(acc, _mm512_madd_epi16(t, _mm512_set1_epi16(1))); }
AI pvi p_or(pvi a, pvi b) { return _mm512_or_si512(a, b); }
AI pvi p_xor80(pvi a) { return _mm512_xor_si512(a, _mm512_set1_epi8((char)0x80)); }
/* acc + the 4-byte sums of q * x for signed q (Q8_0 without VNNI: |q| times x with q's sign, which
 * vpmaddubsw cannot saturate) */
AI pvi p_dp_signed(pvi acc, pvi q, pvi x) {
    const pvi xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
    return p_madd1_add(acc, p_maddubs(_mm512_abs_epi8(q), xs));
}
AI pvi p_and8(pvi a, char m) { return _mm512_and_si512(a, _mm512_set1_epi8(m)); }
#define p_sll16(v, n) _mm512_slli_epi16((v), (n))
#define p_srl16(v, n) _mm512_srli_epi16((v), (n))
/* VW unsigned / signed bytes at p as floats */
AI vf p_u8f(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
AI vf p_i8f(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
#else
typedef __m256i pvi;
AI pvi p_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
AI pvi p_set1(int32_t v) { return _mm256_set1_epi32(v); }
AI pvi p_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
AI pvi p_nib_lo(pvi v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
AI pvi p_nib_hi(pvi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
AI vf p_scales(const uint16_t *d) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d)); }
AI vf p_cvt(pvi v) { return _mm256_cvtepi32_ps(v); }
#if defined(DSP_Q8_VNNI)
AI pvi p_dp(pvi acc, pvi u, pvi x) { return _mm256_dpbusd_avx_epi32(acc, u, x); }
#endif
/* without VNNI (p_dp_run): u x x word pairs; words added; acc + their dword pairs */
AI pvi p_maddubs(pvi u, pvi x) { return _mm256_maddubs_epi16(u, x); }
AI pvi p_add16(pvi a, pvi b) { return _mm256_add_epi16(a, b); }
AI pvi p_madd1_add(pvi acc, pvi t) { return _mm256_add_epi32(acc, _mm256_madd_epi16(t, _mm256_set1_epi16(1))); }
AI pvi p_or(pvi a, pvi b) { return _mm256_or_si256(a, b); }
AI pvi p_xor80(pvi a) { return _mm256_xor_si256(a, _mm256_set1_epi8((char)0x80)); }
AI pvi p_dp_signed(pvi acc, pvi q, pvi x) {
    return p_madd1_add(acc, p_maddubs(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)));
}
AI pvi p_and8(pvi a, char m) { return _mm256_and_si256(a, _mm256_set1_epi8(m)); }
#define p_sll16(v, n) _mm256_slli_epi16((v), (n))
#define p_srl16(v, n) _mm256_srli_epi16((v), (n))
AI vf p_u8f(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
AI vf p_i8f(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
#endif

/* acc + the dword sums of u[g] * (activation dword g of x) for g < n. Without VNNI, vpmaddubsw's
 * word pairs are summed in 16 bits over `per` groups before one vpmaddwd: exact, since a pair of
 * u <= umax and |x| <= 127 (ops.h) is at most 254 umax, so per * 254 * umax < 32768 (4-bit types:
 * 8 groups, 30,480; Q5_K 4, 31,496; Q6_K 2, 32,004). On the 2-vCPU Zen 1 EPYC (AVX2, no VNNI) the
 * vpmaddwd per group was a third of the vector pass's multiplies. */
AI pvi p_dp_run(pvi acc, const pvi *u, const int8_t *x, int n, int per) {
#if defined(DSP_Q8_VNNI)
    (void)per;
    for (int g = 0; g < n; g++) acc = p_dp(acc, u[g], p_bcast4(x + 4 * g));
#else
    for (int g0 = 0; g0 < n; g0 += per) {
        pvi t = p_maddubs(u[g0], p_bcast4(x + 4 * g0));
        for (int g = g0 + 1; g < g0 + per && g < n; g++) t = p_add16(t, p_maddubs(u[g], p_bcast4(x + 4 * g)));
        acc = p_madd1_add(acc, t);
    }
#endif
    return acc;
}
/* groups per 16-bit run (p_dp_run) of a type's unsigned weights */
AI int p_run_per(const uint32_t type) { return type == DSP_Q6_K ? 2 : type == DSP_Q5_K ? 4 : 8; }

/* the weights of a block as 8 vectors of unsigned bytes u[g] (Q8_0: signed q): elements 4g..4g+3
 * of outputs VW h .. VW h + VW - 1 of the panel (ops.h layout; q: the block's bytes) */
AI void p_unpack(const uint8_t *q, int h, pvi u[8], const uint32_t type) {
    const int o = 4 * VW * h;
    if (type == DSP_Q8_0) { /* the signed bytes themselves */
        for (int g = 0; g < 8; g++) u[g] = p_load(q + 64 * g + o);
        return;
    }
    for (int r = 0; r < 4; r++) {
        const pvi v = p_load(q + 64 * r + o);
        u[r] = p_nib_lo(v), u[r + 4] = p_nib_hi(v);
    }
    if (type == DSP_Q5_K) { /* bit 4 of u[g] is bit g of the plane's byte */
        const pvi hb = p_load(q + 256 + o);
        u[0] = p_or(u[0], p_and8(p_sll16(hb, 4), 0x10)), u[1] = p_or(u[1], p_and8(p_sll16(hb, 3), 0x10));
        u[2] = p_or(u[2], p_and8(p_sll16(hb, 2), 0x10)), u[3] = p_or(u[3], p_and8(p_sll16(hb, 1), 0x10));
        u[4] = p_or(u[4], p_and8(hb, 0x10)), u[5] = p_or(u[5], p_and8(p_srl16(hb, 1), 0x10));
        u[6] = p_or(u[6], p_and8(p_srl16(hb, 2), 0x10)), u[7] = p_or(u[7], p_and8(p_srl16(hb, 3), 0x10));
    }
    if (type == DSP_Q6_K) /* bits 4-5 of u[4k + i] are bits 2i, 2i + 1 of plane k's byte */
        for (int k = 0; k < 2; k++) {
            const pvi hb = p_load(q + 256 + 64 * k + o);
            u[4 * k] = p_or(u[4 * k], p_and8(p_sll16(hb, 4), 0x30));
            u[4 * k + 1] = p_or(u[4 * k + 1], p_and8(p_sll16(hb, 2), 0x30));
            u[4 * k + 2] = p_or(u[4 * k + 2], p_and8(hb, 0x30));
            u[4 * k + 3] = p_or(u[4 * k + 3], p_and8(p_srl16(hb, 2), 0x30));
        }
}

/* block b's scales for outputs VW h .. of panel p: d0 = D_w (Q6_K: D_lo), d1 = M_w (Q6_K: D_hi;
 * zero for the types with neither) */
AI void p_block_scales(const dsp_cpu_panel_map *map, int64_t p, int64_t b, int h, vf *d0, vf *d1, const uint32_t type) {
    const int kq = dsp_cpu_panel_kq(type);
    const size_t ds = (size_t)(p * map->nd + (kq ? b / 8 : b)) * 16 + (size_t)(VW * h);
    const vf d = p_scales(map->d + ds);
    const uint8_t *sc = kq ? map->sc + (size_t)(p * map->nb + b) * 32 + VW * h : NULL;
    if (type == DSP_Q6_K) {
        *d0 = vmul(d, p_i8f(sc)), *d1 = vmul(d, p_i8f(sc + 16));
    } else if (kq) { /* D_w = d * sc, M_w = -(dmin * m) */
        *d0 = vmul(d, p_u8f(sc));
        *d1 = vmul(vmul(p_scales(map->m + ds), p_u8f(sc + 16)), vset1(-1.0f)); /* exactly -(x), zeros too */
    } else {
        *d0 = d;
        *d1 = type == DSP_Q4_1 ? p_scales(map->m + ds) : vzero();
    }
}

/* outputs [16 p + VW h, + VW) of panel p for activation rows x[0..nr) (nr <= PANEL_ROWS) */
AI void panel_pass(const dsp_cpu_panel_map *map, int64_t p, int h, const uint8_t *const *x, int nr, int64_t nbp, float *const *y, int nv,
                   const uint32_t type) {
    const int has_min = dsp_cpu_q8_has_min(type), q6 = type == DSP_Q6_K, q8 = type == DSP_Q8_0;
#if defined(DSP_Q8_VNNI)
    const int off = q8 ? 128 : dsp_cpu_panel_off(type); /* Q8_0: vpdpbusd takes q + 128, unsigned */
#else
    const int off = dsp_cpu_panel_off(type); /* Q8_0: 0, p_dp_signed */
#endif
    vf acc[PANEL_ROWS];
    for (int m = 0; m < PANEL_ROWS; m++) acc[m] = vzero();
    const uint8_t *q = map->q + (size_t)(p * map->nb) * (size_t)map->qb;
    for (int64_t b = 0; b < map->nb; b++, q += map->qb) {
        pvi u[8];
        if (h == 0)
            for (int64_t l = 0; l < map->qb; l += 64) _mm_prefetch((const char *)q + PANEL_PF * map->qb + l, _MM_HINT_T0);
        p_unpack(q, h, u, type);
#if defined(DSP_Q8_VNNI)
        if (q8)
            for (int g = 0; g < 8; g++) u[g] = p_xor80(u[g]);
#endif
        vf d0, d1;
        p_block_scales(map, p, b, h, &d0, &d1, type);
        for (int m = 0; m < PANEL_ROWS; m++) {
            if (m >= nr) break;
            const int8_t *xq8 = dsp_cpu_q8_qn(x[m], nbp) + 32 * b; /* dword g broadcast straight from memory (no shuffle port) */
            const vf dx = vset1(dsp_cpu_q8_d(x[m], nbp)[2 * b]);
            if (q6) { /* seeds: -32 * (the sums of each half) */
                const int32_t *lo = dsp_cpu_q8_nSlo(x[m], nbp), *hi = dsp_cpu_q8_nShi(x[m], nbp);
                pvi sl = p_set1(32 * (lo[2 * b] + lo[2 * b + 1])), sh = p_set1(32 * (hi[2 * b] + hi[2 * b + 1]));
                sl = p_dp_run(sl, u, xq8, 4, p_run_per(type)), sh = p_dp_run(sh, u + 4, xq8 + 16, 4, p_run_per(type));
                acc[m] = vfma(vmul(d0, dx), p_cvt(sl), acc[m]);
                acc[m] = vfma(vmul(d1, dx), p_cvt(sh), acc[m]);
            } else {
                const int32_t *nS = dsp_cpu_q8_nS(x[m], nbp);
                pvi s = p_set1(off * (nS[2 * b] + nS[2 * b + 1])); /* -off * S */
#if !defined(DSP_Q8_VNNI)
                if (q8)
                    for (int g = 0; g < 8; g++) s = p_dp_signed(s, u[g], p_bcast4(xq8 + 4 * g));
                else
#endif
                    s = p_dp_run(s, u, xq8, 8, p_run_per(type));
                acc[m] = vfma(vmul(d0, dx), p_cvt(s), acc[m]);
                if (has_min) acc[m] = vfma(d1, vset1(dsp_cpu_q8_s(x[m], nbp)[2 * b]), acc[m]);
            }
        }
    }
    for (int m = 0; m < nr; m++) {
        if (nv >= VW) vstore(y[m], acc[m]);
        else vstoren(y[m], acc[m], nv);
    }
}

#if VW == 16 && defined(DSP_Q8_VNNI)
#define PANEL_AMX 1
/* activation rows from which AMX takes over: a lone group of 12-15 rows (tiles configured for that
 * many), else the whole groups of 16 (the rows left take the vector pass). On the 2-vCPU Xeon
 * (bench_kernels --panel --type q4_1 --in 512, one thread, 16 MiB) AMX's cost is mostly per block
 * (unpacking, tile products and stores, the chain's loads): ~1.2 ms + 0.04 ms a row against the
 * vector pass's ~0.55 + 0.11 (5 rows 1.3 / 0.76 ms, 9 rows 1.40 / 1.39, 12 rows 1.67 / 1.80, 16 rows
 * 1.8 / 2.3). What made it pay below 32 rows (it measured slower there before): chunks of 8 blocks
 * with the C tiles packed (16 blocks' C tiles at a 2 KiB stride next to their B tiles filled the
 * 48 KiB L1: 16 rows 2.3 -> 2.0 ms), the min types' B tiles as u itself (u <= 31 is a valid signed
 * byte, so the chain needs no mid * S correction: -> 1.83), one ldtilecfg per matmul (-> 1.80).
 * Tried and not kept: a pipeline doing, block by block, the next chunk's unpacking, this unit's tile
 * products and the previous unit's chain (measured on the 16-block chunks, no faster); C tiles 2, 5
 * and 6, 7 by turns, each pair stored after the next pair's products (within the noise, +-5%). */
#define PANEL_AMX_MIN 12
#define AMX_CHUNK 8 /* blocks whose B tiles are unpacked together and whose C tiles wait for the float pass */
#define AMX_TGT __attribute__((target("amx-tile,amx-int8")))
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* tiles for groups of gr activation rows (16, or a lone group of 12-15: "16 rows" below). Q6_K: 3 and
 * 6 A (16 rows x the block's lower / upper 16 quants), 4 and 7 B (4 tile rows: its signed weights of
 * 16 outputs, 4 per output and tile row), 2 and 5 C (16 rows x 16 outputs, int32). The others, two
 * sets for two blocks in flight: 0 and 3 A (16 x 32 quants), 1 and 4 B (8 rows), 2 and 5 C. */
/* rows per group for n AMX rows (a multiple of 16, or a lone group of 12-15): the tile
 * configuration's rows and panel_amx's step must agree */
static inline int amx_group_rows(int n) { return n < 16 ? n : 16; }

AMX_TGT static void amx_config(int q6, int gr) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[2] = c.rows[5] = (uint8_t)gr, c.colsb[2] = c.colsb[5] = 64;
    if (q6) {
        c.rows[3] = c.rows[6] = (uint8_t)gr, c.colsb[3] = c.colsb[6] = 16;
        c.rows[4] = c.rows[7] = 4, c.colsb[4] = c.colsb[7] = 64;
    } else {
        c.rows[0] = c.rows[3] = (uint8_t)gr, c.colsb[0] = c.colsb[3] = 32;
        c.rows[1] = c.rows[4] = 8, c.colsb[1] = c.colsb[4] = 64;
    }
    /* gcc 12 does not see that ldtilecfg reads all 64 bytes and dropped the stores of rows and
     * colsb (a #GP at run time): make them happen first */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

/* the per-row values a chunk's float chain needs, [row][block of the chunk] */
typedef struct amx_rows {
    float dx[16][16] __attribute__((aligned(64))); /* AMX_CHUNK <= 16 blocks used */
    float s[16][16] __attribute__((aligned(64)));
} amx_rows;

/* the values of blocks [0, nc) from a per-lane q8-row array (entries 2b and 2b + 1): the even
 * entries (d, s) as 16 lanes (0 past nc) */
AI __m512i amx_even(const void *v, int nc) {
    const __mmask16 k0 = (__mmask16)(nc >= 8 ? 0xFFFFu : (1u << (2 * nc)) - 1u), k1 = (__mmask16)(nc > 8 ? (1u << (2 * (nc - 8))) - 1u : 0);
    const __m512i a = _mm512_maskz_loadu_epi32(k0, v), b = _mm512_maskz_loadu_epi32(k1, (const int32_t *)v + 16);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(a)), _mm512_cvtepi64_epi32(b), 1);
}
AMX_TGT static void amx_rows_vals(const uint8_t *xb, size_t ldq, int64_t nbp, int64_t c0, int nc, int gr, amx_rows *rv) {
    for (int m = 0; m < gr; m++) {
        const uint8_t *xm = xb + (size_t)m * ldq;
        _mm512_store_si512(rv->dx[m], amx_even(dsp_cpu_q8_d(xm, nbp) + 2 * c0, nc));
        _mm512_store_si512(rv->s[m], amx_even(dsp_cpu_q8_s(xm, nbp) + 2 * c0, nc));
    }
}

/* the float chain of a chunk for gr rows, C tiles in ct; y: row 0's outputs of the panel, each
 * row's partial sum carried in from earlier chunks (c0 > 0) */
AI void amx_chain(const amx_rows *rv, int32_t (*ct)[16][16], const dsp_cpu_panel_map *map, int64_t p, int64_t c0, int nc, int gr, float *y,
                  int64_t ldy, __mmask16 mv, const uint32_t type) {
    const int q6 = type == DSP_Q6_K, has_min = dsp_cpu_q8_has_min(type);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = c0 && m < gr ? _mm512_maskz_loadu_ps(mv, y + (size_t)m * ldy) : _mm512_setzero_ps();
    for (int k = 0; k < nc; k++) {
        vf d0, d1;
        p_block_scales(map, p, c0 + k, 0, &d0, &d1, type);
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            if (m >= gr) break;
            const __m512 dx = _mm512_set1_ps(rv->dx[m][k]);
            __m512i P = _mm512_load_si512(ct[q6 ? 2 * k : k][m]);
            if (q6) {
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d0, dx), _mm512_cvtepi32_ps(P), acc[m]);
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d1, dx), _mm512_cvtepi32_ps(_mm512_load_si512(ct[2 * k + 1][m])), acc[m]);
                continue;
            }
            acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d0, dx), _mm512_cvtepi32_ps(P), acc[m]);
            if (has_min) acc[m] = _mm512_fmadd_ps(d1, _mm512_set1_ps(rv->s[m][k]), acc[m]);
        }
    }
    for (int m = 0; m < gr; m++) _mm512_mask_storeu_ps(y + (size_t)m * ldy, mv, acc[m]);
}

/* activation rows [0, n) (n a multiple of 16, or 12-15) x the outputs of panel p. Per chunk of
 * AMX_CHUNK blocks the B tiles are unpacked once (u - mid as signed bytes: mid is the offset of the
 * types without a min, 0 for those with one, so C is P either way); then per group of gr rows the
 * tile products of the whole chunk run back to back (no tile waits for the vector code) and land in
 * ct, and the float chain takes them in block order, carrying each output's partial sum across
 * chunks in y (stored and reloaded as floats: the chain is unchanged). */
AMX_TGT static void panel_amx(const dsp_cpu_panel_map *map, int64_t p, int64_t r1, const uint8_t *xq, size_t ldq, int64_t nbp, int n, float *y,
                              int64_t ldy, const uint32_t type) {
    const int q6 = type == DSP_Q6_K, has_min = dsp_cpu_q8_has_min(type);
    const int mid = has_min ? 0 : dsp_cpu_panel_off(type);
    int8_t bt[AMX_CHUNK][512] __attribute__((aligned(64)));          /* 8 KiB */
    int32_t ct[2 * AMX_CHUNK][16][16] __attribute__((aligned(64))); /* block k's P at k (Q6_K: halves at 2k, 2k + 1), packed */
    amx_rows rv;
    const __m512i vmid = _mm512_set1_epi8((char)mid);
    const int nv = r1 - 16 * p < 16 ? (int)(r1 - 16 * p) : 16;
    const int gr = amx_group_rows(n);
    const __mmask16 mv = (__mmask16)((1u << nv) - 1u);
    const uint8_t *q = map->q + (size_t)(p * map->nb) * (size_t)map->qb;
    for (int64_t c0 = 0; c0 < map->nb; c0 += AMX_CHUNK) {
        const int nc = map->nb - c0 < AMX_CHUNK ? (int)(map->nb - c0) : AMX_CHUNK;
        for (int k = 0; k < nc; k++) {
            pvi u[8];
            const uint8_t *qk = q + (size_t)(c0 + k) * (size_t)map->qb;
            for (int64_t l = 0; l < map->qb; l += 64) _mm_prefetch((const char *)qk + AMX_CHUNK * map->qb + l, _MM_HINT_T0); /* the next chunk */
            p_unpack(qk, 0, u, type);
            for (int g = 0; g < 8; g++) _mm512_store_si512(bt[k] + 64 * g, _mm512_sub_epi8(u[g], vmid));
        }
        for (int i0 = 0; i0 < n; i0 += 16) {
            const uint8_t *xb = xq + (size_t)i0 * ldq;
            const int8_t *xa = dsp_cpu_q8_qn(xb, nbp) + 32 * c0;
            if (q6)
                for (int k = 0; k < nc; k++) {
                    _tile_loadd(3, xa + 32 * k, (long)ldq);
                    _tile_loadd(6, xa + 32 * k + 16, (long)ldq);
                    _tile_loadd(4, bt[k], 64);
                    _tile_loadd(7, bt[k] + 256, 64);
                    _tile_zero(2);
                    _tile_zero(5);
                    _tile_dpbssd(2, 3, 4);
                    _tile_dpbssd(5, 6, 7);
                    _tile_stored(2, ct[2 * k], 64);
                    _tile_stored(5, ct[2 * k + 1], 64);
                }
            else
                for (int k = 0; k < nc; k += 2) { /* two blocks in flight */
                    _tile_loadd(0, xa + 32 * k, (long)ldq);
                    _tile_loadd(1, bt[k], 64);
                    _tile_zero(2);
                    _tile_dpbssd(2, 0, 1);
                    if (k + 1 < nc) {
                        _tile_loadd(3, xa + 32 * (k + 1), (long)ldq);
                        _tile_loadd(4, bt[k + 1], 64);
                        _tile_zero(5);
                        _tile_dpbssd(5, 3, 4);
                    }
                    _tile_stored(2, ct[k], 64);
                    if (k + 1 < nc) _tile_stored(5, ct[k + 1], 64);
                }
            amx_rows_vals(xb, ldq, nbp, c0, nc, gr, &rv);
            amx_chain(&rv, ct, map, p, c0, nc, gr, y + (size_t)i0 * ldy + 16 * p, ldy, mv, type);
        }
    }
}
AMX_TGT static void amx_release(void) { _tile_release(); }
#endif

/* one type's matmul (type a constant once inlined). Panel by panel: from PANEL_AMX_MIN rows AMX
 * takes a lone group of 12-15 rows or the whole groups of 16, the vector pass the rows left, while
 * the panel's weights are still in the caches. */
AI void matmul_panel_t(const dsp_cpu_panel_map *map, int64_t r0, int64_t r1, const void *xq, size_t ldq, int n_x, int64_t nbp, float *y,
                       int64_t ldy, const uint32_t type) {
    const int64_t p0 = r0 / 16, p1 = (r1 + 15) / 16;
    int n_amx = 0;
#if defined(PANEL_AMX)
    if (n_x >= PANEL_AMX_MIN && dsp_cpu_amx_usable()) n_amx = n_x < 16 ? n_x : n_x / 16 * 16;
    if (n_amx) amx_config(type == DSP_Q6_K, amx_group_rows(n_amx)); /* once for all the panels (ldtilecfg and tilerelease are not free) */
#endif
    for (int64_t p = p0; p < p1; p++) {
#if defined(PANEL_AMX)
        if (n_amx) panel_amx(map, p, r1, xq, ldq, nbp, n_amx, y, ldy, type);
#endif
        for (int h = 0; h < PANEL_HALVES; h++) {
            const int64_t o0 = 16 * p + VW * h;
            if (o0 >= r1) break;
            const int nv = r1 - o0 < VW ? (int)(r1 - o0) : VW;
            /* the rows left in passes of near-equal size, each a compile-time count (no per-row branches) */
            const int left = n_x - n_amx, n_pass = (left + PANEL_ROWS - 1) / PANEL_ROWS;
            for (int k = 0, i = n_amx; k < n_pass; k++) {
                const int nr = (left * (k + 1)) / n_pass - (left * k) / n_pass;
                const uint8_t *x[PANEL_ROWS];
                float *yo[PANEL_ROWS];
                for (int m = 0; m < nr; m++) x[m] = (const uint8_t *)xq + (size_t)(i + m) * ldq, yo[m] = y + (size_t)(i + m) * ldy + o0;
                switch (nr) {
#define PANEL_PASS_CASE(N)                                        \
    case N: panel_pass(map, p, h, x, N, nbp, yo, nv, type); break;
                    PANEL_PASS_CASE(1)
                    PANEL_PASS_CASE(2)
                    PANEL_PASS_CASE(3)
                    PANEL_PASS_CASE(4)
#if PANEL_ROWS > 4
                    PANEL_PASS_CASE(5)
                    PANEL_PASS_CASE(6)
                    PANEL_PASS_CASE(7)
                    PANEL_PASS_CASE(8)
#endif
#if PANEL_ROWS > 8
                    PANEL_PASS_CASE(9)
                    PANEL_PASS_CASE(10)
                    PANEL_PASS_CASE(11)
                    PANEL_PASS_CASE(12)
#endif
#undef PANEL_PASS_CASE
                default: break;
                }
                i += nr;
            }
        }
    }
#if defined(PANEL_AMX)
    if (n_amx) amx_release();
#endif
}

static void k_matmul_panel(uint32_t type, const void *pw, int64_t in, int64_t out, int64_t r0, int64_t r1, const void *xq, size_t ldq, int n_x,
                           float *y, int64_t ldy) {
    const dsp_cpu_panel_map map = dsp_cpu_panel_regions(type, pw, in, out);
    const int64_t nbp = dsp_cpu_q8_nbp(in);
    switch (type) {
    case DSP_Q4_0: matmul_panel_t(&map, r0, r1, xq, ldq, n_x, nbp, y, ldy, DSP_Q4_0); break;
    case DSP_Q4_1: matmul_panel_t(&map, r0, r1, xq, ldq, n_x, nbp, y, ldy, DSP_Q4_1); break;
    case DSP_Q8_0: matmul_panel_t(&map, r0, r1, xq, ldq, n_x, nbp, y, ldy, DSP_Q8_0); break;
    case DSP_Q4_K: matmul_panel_t(&map, r0, r1, xq, ldq, n_x, nbp, y, ldy, DSP_Q4_K); break;
    case DSP_Q5_K: matmul_panel_t(&map, r0, r1, xq, ldq, n_x, nbp, y, ldy, DSP_Q5_K); break;
    case DSP_Q6_K: matmul_panel_t(&map, r0, r1, xq, ldq, n_x, nbp, y, ldy, DSP_Q6_K); break;
    default: break;
    }
}
