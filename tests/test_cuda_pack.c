/* Unit tests for backend/cuda/pack.h and frag.h on the host (no GPU needed, so CI runs them):
 * 1. packing then decoding each element of a packed matrix is bit-identical to core/quant's
 *    dequantization, for every weight type the CUDA backend multiplies, on shapes with edge tiles
 *    and padded groups;
 * 2. an emulated warp (all 32 lanes' fragments gathered into the logical 16x16 A and 16x8 B of
 *    mma.m16n8k16, products summed in double) computes the matmul of the packed weights with the
 *    packed activations: this checks that weights and activations agree on the k permutation,
 *    the register order and the scale blocks. The GPU tests then check the kernels themselves. */
/* ctest-label: kernel */
#include "dsp_test.h"

#include "backend/cuda/frag.h"
#include "core/quant.h"
#include "rand_weights.h"

#include <math.h>

static const uint32_t g_types[] = {DSP_BF16, DSP_F16, DSP_F32, DSP_Q8_0, DSP_Q4_0, DSP_Q4_1, DSP_Q4_K, DSP_Q5_K, DSP_Q6_K};
#define N_TYPES (int)(sizeof g_types / sizeof g_types[0])

typedef struct packed {
    dsp_cu_layout L;
    int64_t M, K, n_tiles, n_groups;
    uint8_t *raw, *p;
    size_t row_bytes;
} packed;

static void pack_random(packed *pk, uint32_t type, int64_t M, int64_t K) {
    CHECK(dsp_cu_layout_of(type, &pk->L));
    pk->M = M, pk->K = K;
    pk->n_tiles = dsp_cu_n_tiles(M), pk->n_groups = dsp_cu_n_groups(&pk->L, K);
    pk->row_bytes = dsp_dtype_row_bytes(type, (uint64_t)K);
    pk->raw = xalloc(pk->row_bytes * (size_t)M);
    for (int64_t r = 0; r < M; r++) random_row(type, pk->raw + (size_t)r * pk->row_bytes, K);
    uint64_t bytes = dsp_cu_packed_bytes(&pk->L, M, K);
    pk->p = xalloc(bytes);
    memset(pk->p, 0xAB, bytes); /* poison: every byte must be written */
    const int64_t gb = dsp_cu_group_bytes(&pk->L);
    for (int64_t t = 0; t < pk->n_tiles; t++)
        for (int64_t c = 0; c < pk->n_groups; c++) {
            uint8_t *base = pk->p + (t * pk->n_groups + c) * gb;
            for (int l = 0; l < 32; l++) {
                uint8_t chunk[DSP_CU_MAX_LANE_BYTES];
                dsp_cu_pack_lane(&pk->L, pk->raw, pk->row_bytes, M, K, t, c, l, chunk);
                dsp_cu_put_lane(&pk->L, base, l, chunk);
            }
            dsp_cu_pack_scales(&pk->L, pk->raw, pk->row_bytes, M, K, t, c, base + 32 * pk->L.lane_bytes);
        }
}

static void packed_free(packed *pk) { free(pk->raw), free(pk->p); }

/* shapes: M not a multiple of 16, K with a partial last group where the type allows one */
static void shape_for(uint32_t type, int64_t *M, int64_t *K) {
    *M = 37;
    int blk = (int)dsp_dtype_get(type)->block_elems;
    *K = blk == 256 ? 512 : 96; /* Q4_0/Q4_1 (kg 64): one full group and half of one */
}

/* a random packed matrix of type g_types[ti] in its test shape */
static uint32_t pack_test_matrix(int ti, packed *pk, int64_t *M, int64_t *K) {
    shape_for(g_types[ti], M, K);
    pack_random(pk, g_types[ti], *M, *K);
    return g_types[ti];
}

static void test_elements_bit_exact(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        int64_t M, K;
        packed pk;
        const uint32_t type = pack_test_matrix(ti, &pk, &M, &K);
        float *ref = xalloc(sizeof(float) * (size_t)K);
        int bad = 0, bad_pad = 0;
        for (int64_t r = 0; r < pk.n_tiles * DSP_CU_TILE; r++) {
            if (r < M) CHECK(dsp_dequantize_row(type, pk.raw + (size_t)r * pk.row_bytes, ref, (uint64_t)K) == DSP_OK);
            for (int64_t k = 0; k < pk.n_groups * pk.L.kg; k++) {
                float v = dsp_cu_packed_elem(&pk.L, pk.p, pk.n_groups, r, k);
                if (r >= M || k >= K) {
                    bad_pad += v != 0.0f;
                } else if (memcmp(&v, &ref[k], 4) != 0) {
                    if (bad++ < 3) fprintf(stderr, "%s (%lld, %lld): %g != %g\n", dsp_dtype_name(type), (long long)r, (long long)k, v, ref[k]);
                }
            }
        }
        CHECK_MSG(bad == 0, "%s: %d elements differ", dsp_dtype_name(type), bad);
        CHECK_MSG(bad_pad == 0, "%s: %d padding elements are not 0", dsp_dtype_name(type), bad_pad);
        free(ref);
        packed_free(&pk);
    }
}

/* mma.m16n8k16 fragment positions: A register r of lane (g, t) holds logical (row, col) =
 * (g + 8 (r & 1), 2t + 8 (r >> 1) + e); B register j holds logical (row, col) = (2t + 8j + e, g). */
static void test_warp_emulation(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        int64_t M, K;
        packed pk;
        const uint32_t type = pack_test_matrix(ti, &pk, &M, &K);
        const int n_tok = 11, NT = 2; /* two 8-token tiles, the second partly empty */
        const int64_t units = dsp_cu_x_units(K);
        float *x = xalloc(sizeof(float) * (size_t)n_tok * K);
        uint32_t *xp = xalloc(16 * (size_t)(NT * 8) * units);
        memset(xp, 0, 16 * (size_t)(NT * 8) * units);
        double *xsum = xalloc(sizeof(double) * (size_t)(NT * 8) * (units / 8));
        for (int i = 0; i < n_tok * K; i++) x[i] = frnd() * (i % 7 == 0 ? 100.0f : 1.0f);
        for (int n = 0; n < n_tok; n++) {
            for (int64_t u = 0; u < units; u++) dsp_cu_x_unit(x + (size_t)n * K, K, u, xp + 4 * ((size_t)n * units + u));
            for (int64_t b = 0; b < units / 8; b++) { /* per 32-block: the sum the kernel adds min terms with */
                double s = 0;
                for (int64_t k = 32 * b; k < 32 * b + 32 && k < K; k++) s += x[(size_t)n * K + k];
                xsum[(size_t)n * (units / 8) + b] = s;
            }
        }
        const int steps = pk.L.kg / 16, bsteps = dsp_cu_block_steps(type);
        const int64_t gb = dsp_cu_group_bytes(&pk.L);
        double worst = 0;
        for (int64_t tile = 0; tile < pk.n_tiles; tile++) {
            double tot[16][16] = {{0}}; /* [row][token] */
            for (int64_t c = 0; c < pk.n_groups; c++) {
                const uint8_t *base = pk.p + (tile * pk.n_groups + c) * gb;
                double blk[16][16] = {{0}};
                for (int s = 0; s < steps; s++) {
                    double A[2][16][16]; /* [hi/lo][row][logical k] */
                    memset(A, 0, sizeof A);
                    for (int l = 0; l < 32; l++) {
                        uint32_t w[32], hi[4], lo[4] = {0, 0, 0, 0};
                        dsp_cu_get_lane(&pk.L, base, l, (uint8_t *)w);
                        if (bsteps) dsp_cu_frag_q(type, w, s, hi);
                        else dsp_cu_frag_f(type, w, s, hi, lo);
                        const int g = l >> 2, t = l & 3;
                        for (int r = 0; r < 4; r++)
                            for (int e = 0; e < 2; e++) {
                                A[0][g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + e] = dsp_cu_bf16((uint16_t)(hi[r] >> (16 * e)));
                                A[1][g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + e] = dsp_cu_bf16((uint16_t)(lo[r] >> (16 * e)));
                            }
                    }
                    for (int nt = 0; nt < NT; nt++) {
                        double B[2][16][8]; /* [hi/lo][logical k][token] */
                        for (int l = 0; l < 32; l++) {
                            const int g = l >> 2, t = l & 3;
                            const uint32_t *unit = xp + 4 * ((size_t)(8 * nt + g) * units + (c * pk.L.kg + 16 * s) / 4 + t);
                            for (int j = 0; j < 2; j++)
                                for (int e = 0; e < 2; e++) {
                                    B[0][2 * t + 8 * j + e][g] = dsp_cu_bf16((uint16_t)(unit[j] >> (16 * e)));
                                    B[1][2 * t + 8 * j + e][g] = dsp_cu_bf16((uint16_t)(unit[2 + j] >> (16 * e)));
                                }
                        }
                        for (int i = 0; i < 16; i++)
                            for (int n = 0; n < 8; n++) {
                                double acc = 0;
                                for (int k = 0; k < 16; k++) {
                                    acc += A[0][i][k] * (B[0][k][n] + B[1][k][n]);
                                    if (!bsteps && type != DSP_BF16) acc += A[1][i][k] * B[0][k][n];
                                }
                                blk[i][8 * nt + n] += acc;
                            }
                    }
                    if (bsteps && (s + 1) % bsteps == 0) { /* end of a scale block */
                        for (int g = 0; g < 8; g++) {
                            float mul[2], add[2];
                            dsp_cu_block_scale(type, base + 32 * pk.L.lane_bytes, g, s / bsteps, mul, add);
                            for (int h = 0; h < 2; h++)
                                for (int n = 0; n < NT * 8; n++) {
                                    const int64_t b32 = (c * pk.L.kg + 16 * s) / 32;
                                    tot[g + 8 * h][n] += mul[h] * blk[g + 8 * h][n] + add[h] * xsum[(size_t)n * (units / 8) + b32];
                                    blk[g + 8 * h][n] = 0;
                                }
                        }
                    }
                }
                if (!bsteps)
                    for (int i = 0; i < 16; i++)
                        for (int n = 0; n < 16; n++) tot[i][n] += blk[i][n];
            }
            float *wrow = xalloc(sizeof(float) * (size_t)K);
            for (int i = 0; i < 16 && tile * 16 + i < M; i++) {
                CHECK(dsp_dequantize_row(type, pk.raw + (size_t)(tile * 16 + i) * pk.row_bytes, wrow, (uint64_t)K) == DSP_OK);
                for (int n = 0; n < n_tok; n++) {
                    double ref = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++) {
                        ref += (double)wrow[k] * x[(size_t)n * K + k];
                        mag += fabs((double)wrow[k] * x[(size_t)n * K + k]);
                    }
                    double err = fabs(tot[i][n] - ref) / (mag > 0 ? mag : 1);
                    if (err > worst) worst = err;
                }
            }
            free(wrow);
        }
        /* activations carry 16 significant bits (hi + lo), F32 weights 16 too: relative to the sum
         * of |terms| the error stays near 2^-16; anything larger is an indexing bug */
        CHECK_MSG(worst < 1e-4, "%s: emulated warp matmul off by %g (relative to sum |w x|)", dsp_dtype_name(type), worst);
        free(x), free(xp), free(xsum);
        packed_free(&pk);
    }
}

static void test_layout_sizes(void) {
    /* the packed formats cost what the GGUF blocks cost (+ the unpacked K-quant scales) */
    dsp_cu_layout L;
    CHECK(dsp_cu_layout_of(DSP_Q4_0, &L) && dsp_cu_packed_bytes(&L, 16, 64) == 16 * 2 * 18);
    CHECK(dsp_cu_layout_of(DSP_Q4_1, &L) && dsp_cu_packed_bytes(&L, 16, 64) == 16 * 2 * 20);
    CHECK(dsp_cu_layout_of(DSP_Q8_0, &L) && dsp_cu_packed_bytes(&L, 16, 32) == 16 * 34);
    CHECK(dsp_cu_layout_of(DSP_BF16, &L) && dsp_cu_packed_bytes(&L, 16, 32) == 16 * 32 * 2);
    CHECK(dsp_cu_layout_of(DSP_Q4_K, &L) && dsp_cu_packed_bytes(&L, 16, 256) == 16 * 144 + 64);
    CHECK(!dsp_cu_layout_of(DSP_Q2_K, &L) && !dsp_cu_layout_of(DSP_IQ4_XS, &L));
}

int main(void) {
    DSP_RUN(test_layout_sizes);
    DSP_RUN(test_elements_bit_exact);
    DSP_RUN(test_warp_emulation);
    return dsp_test_summary();
}
