/* bench_amx: the measured case for the CPU's panel arithmetic (dspark now runs Q4_0 and Q4_1 this way:
 * src/backend/cpu/panel_impl.h; this probe stays as the stand-alone measurement).
 *
 *   bench_amx [--out N] [--json]
 *
 * The q8 block order of today's kernels (src/backend/cpu/ops.h) keeps 16 float lanes per output
 * (two half-blocks of 8 blocks) and cannot use AMX: a tile product sums whole K spans, so every
 * half-block would need its own C tile and a float epilogue as long as the products. This program
 * measures the candidate that can: Q4_0-like weights repacked into panels of 16 output rows (per
 * 32-block: the nibbles in AMX's B layout, which is also a VNNI lane layout, and 16 f16 scales), and
 * per output one float chain over the blocks,
 *     y = fma(D_w[b] * dx[b], (float)P[b], y)   for b = 0, 1, ...   (P[b] the exact int32 block dot)
 * computed three ways that must agree bit for bit:
 *   - scalar C (the oracle such an arithmetic would keep),
 *   - AVX512-VNNI for one activation row (decode: vpdpbusd over the panel, 16 outputs per register),
 *   - AMX-INT8 for many rows (tdpbssd of 16 or 32 activation rows x 16 outputs x one block, then the
 *     chain on the C tile's rows).
 * One thread, thread CPU time, fastest of 7; one row streams --out rows (default 8192: 4.5 MiB,
 * L3-sized like bench_kernels --mb 4), as do 9 rows (a verify block of 1 + 8: its cost over one
 * row is bench_kernels' "x1 row" at 9) and 16; the 16-512-row figures use 1024 outputs x 1024 inputs.
 * Compare with `bench_kernels --type q4_0 --in 1024 --mb 4` (today's kernels).
 * Needs AMX (Sapphire Rapids or later) and Linux's permission for the tile state; says so otherwise. */
#define _GNU_SOURCE /* syscall */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define IN 1024
#define NB (IN / 32)
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma,amx-tile,amx-int8")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

typedef struct {
    int n_out;
    int8_t *q;        /* (n_out, IN) weights, nibble - 8 */
    float *d;         /* (n_out, NB) block scales (f16 values) */
    uint8_t *nib;     /* (n_out / 16, NB, 256): byte p of 64-byte row r holds B[r][p] | B[r + 4][p] << 4 (nibbles) */
    uint16_t *d16;    /* (n_out / 16, NB, 16) */
} panels;

static double cpu_ms(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID) * 1e3; }

static uint32_t rng = 12345;
static int rnd(int n) {
    rng = rng * 1664525u + 1013904223u;
    return (int)((rng >> 8) % (uint32_t)n);
}

TGT static void make_panels(panels *w, int n_out) {
    w->n_out = n_out;
    w->q = malloc((size_t)n_out * IN);
    w->d = malloc(sizeof(float) * (size_t)n_out * NB);
    w->nib = aligned_alloc(64, (size_t)n_out / 16 * NB * 256);
    w->d16 = aligned_alloc(64, sizeof(uint16_t) * (size_t)n_out * NB);
    for (size_t i = 0; i < (size_t)n_out * IN; i++) w->q[i] = (int8_t)(rnd(16) - 8);
    for (size_t i = 0; i < (size_t)n_out * NB; i++) w->d[i] = _cvtsh_ss(_cvtss_sh((float)(rnd(1000) + 1) * 1e-5f, 0));
    for (int p = 0; p < n_out / 16; p++)
        for (int b = 0; b < NB; b++) {
            uint8_t *dst = w->nib + ((size_t)p * NB + b) * 256;
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < 16; j++)
                    for (int t = 0; t < 4; t++) {
                        const int8_t *row = w->q + (size_t)(16 * p + j) * IN + 32 * b;
                        dst[64 * r + 4 * j + t] = (uint8_t)((row[4 * r + t] + 8) | (row[4 * (r + 4) + t] + 8) << 4);
                    }
            for (int j = 0; j < 16; j++) w->d16[((size_t)p * NB + b) * 16 + j] = _cvtss_sh(w->d[(size_t)(16 * p + j) * NB + b], 0);
        }
}

/* the oracle: y[m][j] = the chain over blocks */
static void chain_ref(const panels *w, int M, const int8_t *x, const float *dx, float *y) {
    for (int m = 0; m < M; m++)
        for (int j = 0; j < w->n_out; j++) {
            float acc = 0;
            for (int b = 0; b < NB; b++) {
                int32_t P = 0;
                for (int k = 0; k < 32; k++) P += w->q[(size_t)j * IN + 32 * b + k] * x[(size_t)m * IN + 32 * b + k];
                acc = fmaf(w->d[(size_t)j * NB + b] * dx[m * NB + b], (float)P, acc);
            }
            y[(size_t)m * w->n_out + j] = acc;
        }
}

/* one activation row, AVX512-VNNI: 16 outputs per register; the unsigned nibbles times the signed
 * activations, minus 8 * (the block's activation sum) */
TGT static void chain_vnni_row(const panels *w, const int8_t *x, const float *dx, const int32_t *xsum, float *y) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int p = 0; p < w->n_out / 16; p++) {
        __m512 acc = _mm512_setzero_ps();
        const uint8_t *nb = w->nib + (size_t)p * NB * 256;
        for (int b = 0; b < NB; b++, nb += 256) {
            __m512i s = _mm512_set1_epi32(-8 * xsum[b]);
            int32_t xb[8]; /* the block's activations, 4 bytes per lane-sized group */
            memcpy(xb, x + 32 * b, sizeof xb);
            for (int r = 0; r < 4; r++) {
                const __m512i v = _mm512_load_si512(nb + 64 * r);
                s = _mm512_dpbusd_epi32(s, _mm512_and_si512(v, m4), _mm512_set1_epi32(xb[r]));
                s = _mm512_dpbusd_epi32(s, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), _mm512_set1_epi32(xb[r + 4]));
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(w->d16 + ((size_t)p * NB + b) * 16)));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[b])), _mm512_cvtepi32_ps(s), acc);
        }
        _mm512_storeu_ps(y + 16 * p, acc);
    }
}

/* many rows (up to 16, or a multiple of 16), AMX: per panel the blocks are unpacked once to signed
 * bytes (B tiles), then each 32-row group runs its tdpbssd per block and the chain on the C rows */
TGT static void chain_amx(const panels *w, int M, const int8_t *x, const float *dx, float *y) {
    static int8_t bt[NB][512] __attribute__((aligned(64)));
    static float dt[NB][16] __attribute__((aligned(64)));
    static int32_t ct[2][16][16] __attribute__((aligned(64)));
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int R = M < 16 ? M : 16; /* rows of the first A / C tile */
    c.rows[0] = (uint8_t)R, c.colsb[0] = 32; /* A: 16 activation rows x one block */
    c.rows[1] = 16, c.colsb[1] = 32;
    c.rows[2] = 8, c.colsb[2] = 64;  /* B: the block's 32 weights of 16 outputs, 4 bytes per output and row */
    c.rows[3] = (uint8_t)R, c.colsb[3] = 64; /* C: 16 rows x 16 outputs, int32 */
    c.rows[4] = 16, c.colsb[4] = 64;
    _tile_loadconfig(&c);
    const __m512i m4 = _mm512_set1_epi8(0x0F), e8 = _mm512_set1_epi8(8);
    for (int p = 0; p < w->n_out / 16; p++) {
        for (int b = 0; b < NB; b++) {
            const uint8_t *nb = w->nib + ((size_t)p * NB + b) * 256;
            for (int r = 0; r < 4; r++) {
                const __m512i v = _mm512_load_si512(nb + 64 * r);
                _mm512_store_si512(bt[b] + 64 * r, _mm512_sub_epi8(_mm512_and_si512(v, m4), e8));
                _mm512_store_si512(bt[b] + 64 * (r + 4), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), e8));
            }
            _mm512_store_ps(dt[b], _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(w->d16 + ((size_t)p * NB + b) * 16))));
        }
        for (int m0 = 0; m0 < M; m0 += 32) {
            const int two = m0 + 32 <= M;
            __m512 a0[16], a1[16];
            for (int r = 0; r < 16; r++) a0[r] = a1[r] = _mm512_setzero_ps();
            for (int b = 0; b < NB; b++) {
                _tile_loadd(2, bt[b], 64);
                _tile_loadd(0, x + (size_t)m0 * IN + 32 * b, IN);
                _tile_zero(3);
                _tile_dpbssd(3, 0, 2);
                if (two) {
                    _tile_loadd(1, x + (size_t)(m0 + 16) * IN + 32 * b, IN);
                    _tile_zero(4);
                    _tile_dpbssd(4, 1, 2);
                    _tile_stored(4, ct[1], 64);
                }
                _tile_stored(3, ct[0], 64);
                const __m512 d = _mm512_load_ps(dt[b]);
                for (int r = 0; r < R; r++)
                    a0[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[(m0 + r) * NB + b])), _mm512_cvtepi32_ps(_mm512_load_si512(ct[0][r])), a0[r]);
                if (two)
                    for (int r = 0; r < 16; r++)
                        a1[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[(m0 + 16 + r) * NB + b])), _mm512_cvtepi32_ps(_mm512_load_si512(ct[1][r])), a1[r]);
            }
            for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (size_t)(m0 + r) * w->n_out + 16 * p, a0[r]);
            if (two)
                for (int r = 0; r < 16; r++) _mm512_storeu_ps(y + (size_t)(m0 + 16 + r) * w->n_out + 16 * p, a1[r]);
            if (!two) m0 -= 16; /* a last group of 16 */
        }
    }
    _tile_release();
}

static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int amx = (d >> 24 & 1) && (d >> 25 & 1), avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (c >> 11 & 1);
    if (!amx || !avx512) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

int main(int argc, char **argv) {
    int n_one = 8192, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) n_one = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "usage: bench_amx [--out N] [--json]\n");
            return 2;
        }
    }
    if (n_one < 16 || n_one % 16 || n_one > 1 << 16) {
        fprintf(stderr, "bench_amx: --out must be a multiple of 16, at most 65536\n");
        return 2;
    }
    if (!amx_usable()) {
        fprintf(stderr, "bench_amx: this CPU or kernel offers no AMX-INT8 with AVX512-VNNI: nothing to measure\n");
        return 3;
    }
    enum { MAXM = 512 };
    panels big, w;
    make_panels(&big, n_one);
    make_panels(&w, 1024);
    int8_t *x = aligned_alloc(64, (size_t)MAXM * IN);
    const size_t ny = (size_t)MAXM * 1024 > (size_t)16 * n_one ? (size_t)MAXM * 1024 : (size_t)16 * n_one; /* outputs of the largest run */
    float *dx = malloc(sizeof(float) * MAXM * NB), *y = malloc(sizeof(float) * ny), *y0 = malloc(sizeof(float) * ny);
    int32_t *xsum = malloc(sizeof(int32_t) * NB);
    for (size_t i = 0; i < (size_t)MAXM * IN; i++) x[i] = (int8_t)(rnd(255) - 127);
    for (int i = 0; i < MAXM * NB; i++) dx[i] = (float)(rnd(1000) + 1) * 1e-3f;
    for (int b = 0; b < NB; b++) {
        xsum[b] = 0;
        for (int k = 0; k < 32; k++) xsum[b] += x[32 * b + k];
    }
    int bad = 0;
    if (json) printf("{\"schema\": \"dspark.bench_amx/1\", \"in\": %d, \"results\": [", IN);
    /* one row (VNNI) */
    double best = 1e30;
    for (int rep = 0; rep < 7; rep++) {
        const double t = cpu_ms();
        chain_vnni_row(&big, x, dx, xsum, y);
        const double e = cpu_ms() - t;
        best = e < best ? e : best;
    }
    chain_ref(&big, 1, x, dx, y0);
    int mis = 0;
    for (int j = 0; j < n_one; j++) mis += memcmp(&y[j], &y0[j], sizeof(float)) != 0;
    bad += mis;
    const double gb = (double)n_one * NB * (256 + 32) / 16 / (best * 1e6);
    if (json) printf("{\"rows\": 1, \"path\": \"vnni\", \"out\": %d, \"ms\": %.4f, \"weight_gb_s\": %.2f, \"gmac_s\": %.2f, \"mismatches\": %d}", n_one, best, gb, (double)n_one * IN / (best * 1e6), mis);
    else printf("  1 row  (vnni, %d outputs): %8.3f ms  %6.2f GB/s of weights  %7.2f GMAC/s  mismatches %d\n", n_one, best, gb, (double)n_one * IN / (best * 1e6), mis);
    /* a verify block (1 + 8 rows) and 16 rows on the one-row figure's matrix (the cost over one
     * row), then 16-512 rows on 1024 outputs (GMAC/s) */
    const double one = best;
    const struct { const panels *w; int rows; } runs[] = {{&big, 9}, {&big, 16}, {&w, 16}, {&w, 32}, {&w, 64}, {&w, 128}, {&w, 512}};
    for (size_t ri = 0; ri < sizeof runs / sizeof *runs; ri++) {
        const panels *pw = runs[ri].w;
        const int M = runs[ri].rows;
        best = 1e30;
        for (int rep = 0; rep < 7; rep++) {
            const double t = cpu_ms();
            chain_amx(pw, M, x, dx, y);
            const double e = cpu_ms() - t;
            best = e < best ? e : best;
        }
        chain_ref(pw, M, x, dx, y0);
        mis = 0;
        for (size_t i = 0; i < (size_t)M * pw->n_out; i++) mis += memcmp(&y[i], &y0[i], sizeof(float)) != 0;
        bad += mis;
        const double gmac = (double)M * pw->n_out * IN / (best * 1e6);
        char over[32] = "null"; /* the cost over one row, for the one-row figure's matrix only */
        if (pw == &big) snprintf(over, sizeof over, "%.3f", best / one);
        if (json)
            printf(", {\"rows\": %d, \"path\": \"amx\", \"out\": %d, \"ms\": %.4f, \"gmac_s\": %.2f, \"over_one_row\": %s, \"mismatches\": %d}", M,
                   pw->n_out, best, gmac, over, mis);
        else if (pw == &big)
            printf("%3d rows (amx,  %d outputs): %8.3f ms  %7.2f GMAC/s  x1 row: %.2f  mismatches %d\n", M, pw->n_out, best, gmac, best / one, mis);
        else
            printf("%3d rows (amx,  %d outputs): %8.3f ms  %7.2f GMAC/s  mismatches %d\n", M, pw->n_out, best, gmac, mis);
    }
    if (json) printf("], \"mismatches\": %d}\n", bad);
    return bad ? 1 : 0;
}
