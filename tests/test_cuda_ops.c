/* CUDA backend ops against the CPU backend (conformance), and per kernel bit-for-bit batch
 * invariance (DESIGN.md §2): a row's output must not depend on how many rows share the launch or
 * how they are grouped. Skips (CTest skip code 77) without a GPU, after checking that the backend
 * says so clearly.
 *
 * Tolerances (NMSE = sum (gpu - cpu)^2 / sum cpu^2):
 *   matmul 1e-9: the GPU feeds activations to the tensor cores as hi + lo bf16 terms (16
 *     significant bits, relative error <= 2^-17) and sums in another order than the CPU; for
 *     F32 weights, which the GPU splits the same way, 2^-16 per product. Expected NMSE ~1e-11;
 *     an indexing or scale bug gives NMSE ~1.
 *   elementwise ops, RMSNorm, RoPE 1e-10: the same f32 formulas; only summation order and the
 *     last ulp of expf / sincosf differ.
 *   attention 1e-5 (F16 K/V) and 1e-4 (BF16 K/V): the GPU stores K and V in 16 bits, relative
 *     rounding 2^-11 (F16) or 2^-8 (BF16) per element, i.e. NMSE ~2^-22 = 2.4e-7 (F16) and
 *     ~1.5e-5 (BF16) before averaging over keys.
 *   embed: bit-exact (the packed layout dequantizes with core/quant's float operations). */
/* ctest-label: gpu */
#include "dsp_test.h"

#include "backend/backend.h"
#include "core/quant.h"
#include "rand_weights.h"

#include <math.h>

#define SKIP 77

static dsp_backend *g_cpu, *g_gpu;

typedef struct tbuf {
    dsp_tensor t;
    uint8_t *data;
    char name[64];
} tbuf;

static void tensor_init(tbuf *tb, const char *name, uint32_t type, int64_t cols, int64_t rows) {
    snprintf(tb->name, sizeof tb->name, "%s", name);
    size_t rb = dsp_dtype_row_bytes(type, (uint64_t)cols);
    tb->data = xalloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) random_row(type, tb->data + (size_t)r * rb, cols);
    memset(&tb->t, 0, sizeof tb->t);
    tb->t.name.ptr = tb->name, tb->t.name.len = strlen(tb->name);
    tb->t.n_dims = rows > 1 ? 2 : 1;
    tb->t.ne[0] = (uint64_t)cols, tb->t.ne[1] = (uint64_t)rows, tb->t.ne[2] = tb->t.ne[3] = 1;
    tb->t.type = type;
    tb->t.nbytes = rb * (size_t)rows;
    tb->t.n_elems = (uint64_t)(cols * rows);
    tb->t.data = tb->data;
}

/* a buffer on both backends */
typedef struct pbuf {
    dsp_buf *c, *g;
    size_t n;
} pbuf;

static pbuf pb(size_t n) {
    pbuf p = {NULL, NULL, n};
    CHECK(g_cpu->ops->buf_create(g_cpu, n, &p.c) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, n, &p.g) == DSP_OK);
    return p;
}
static void pb_free(pbuf *p) {
    g_cpu->ops->buf_destroy(g_cpu, p->c);
    g_gpu->ops->buf_destroy(g_gpu, p->g);
}
static void pb_write(pbuf *p, const float *x, size_t n) {
    g_cpu->ops->buf_write(g_cpu, p->c, 0, x, n);
    g_gpu->ops->buf_write(g_gpu, p->g, 0, x, n);
}
static void pb_rand(pbuf *p, size_t n, float scale) {
    float *x = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frnd() * scale;
    pb_write(p, x, n);
    free(x);
}
static float *rd(dsp_backend *be, const dsp_buf *b, size_t n) {
    float *x = xalloc(n * sizeof(float));
    CHECK_MSG(be->ops->buf_read(be, b, 0, x, n) == DSP_OK, "%s", dsp_last_error());
    return x;
}

/* one sequence with no KV: enough for ops that ignore positions */
static dsp_kv_seq g_empty;
static const dsp_kv_seq *g_empty_tab[1] = {&g_empty};
static int32_t g_tok[1024], g_pos[1024], g_seq[1024], g_nk[1024];

static dsp_be_batch plain_batch(int n) {
    for (int i = 0; i < n; i++) g_tok[i] = i % 37, g_pos[i] = i * 13 % 4000, g_seq[i] = 0, g_nk[i] = 1;
    dsp_be_batch b = {n, g_tok, g_pos, g_seq, g_nk, 1, g_empty_tab};
    return b;
}

static void begin_end(dsp_backend *be, const dsp_be_batch *b, bool begin) {
    dsp_status st = begin ? be->ops->begin(be, b) : be->ops->end(be);
    CHECK_MSG(st == DSP_OK, "%s %s: %s", be->ops->name, begin ? "begin" : "end", dsp_last_error());
}

static bool report(const char *what, double e, double tol) {
    bool ok = e <= tol && e == e;
    fprintf(stderr, "  %-34s nmse %.3g (tol %.0e)%s\n", what, e, tol, ok ? "" : "  FAIL");
    CHECK_MSG(ok, "%s: nmse %g > %g", what, e, tol);
    return ok;
}

/* ---- matmul -------------------------------------------------------------------------------- */

static const uint32_t g_types[] = {DSP_BF16, DSP_F16, DSP_F32, DSP_Q8_0, DSP_Q4_0, DSP_Q4_1, DSP_Q4_K, DSP_Q5_K, DSP_Q6_K};
#define N_TYPES (int)(sizeof g_types / sizeof g_types[0])

/* y = x W^T on the GPU for rows [r0, r0 + n) of X placed at rows 0..n-1 */
static float *gpu_mm(dsp_bweight *w, int64_t M, int64_t K, const float *X, int r0, int n, pbuf *x, pbuf *y) {
    g_gpu->ops->buf_write(g_gpu, x->g, 0, X + (size_t)r0 * K, (size_t)n * K);
    dsp_be_batch b = plain_batch(n);
    begin_end(g_gpu, &b, true);
    g_gpu->ops->matmul(g_gpu, 1, (const dsp_bweight *const *)&w, &y->g, x->g, n);
    begin_end(g_gpu, &b, false);
    return rd(g_gpu, y->g, (size_t)n * M);
}

static void test_matmul(void) {
    /* edge tiles, padded groups, and k split over 1 to 8 warps (S = dsp_cu_mm_slices: 4096 k in
     * 16..128 groups), SmolLM2's widths (576, 1536) */
    static const struct { int64_t M, K; } shapes[] = {{200, 1024}, {37, 96}, {37, 512}, {576, 576}, {96, 1536}, {64, 4096}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    static const int rows[] = {1, 2, 8, 9, 16, 33, 64, 65, 130, 257};
    const int NMAX = 300; /* from 256 rows float weights take the tiled prefill kernel (mm_tiled_kernel) */
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int si = 0; si < n_shapes; si++) {
            const uint32_t type = g_types[ti];
            const int64_t M = shapes[si].M, K = shapes[si].K;
            if (K % (int64_t)dsp_dtype_get(type)->block_elems) continue; /* K-quants need K % 256 == 0 */
            tbuf tw;
            tensor_init(&tw, "blk.0.test.weight", type, K, M);
            dsp_bweight *wc, *wg;
            CHECK(g_cpu->ops->weight_create(g_cpu, &tw.t, &wc) == DSP_OK);
            CHECK_MSG(g_gpu->ops->weight_create(g_gpu, &tw.t, &wg) == DSP_OK, "%s", dsp_last_error());
            pbuf x = pb((size_t)NMAX * K), y = pb((size_t)NMAX * M);
            float *X = xalloc(sizeof(float) * (size_t)NMAX * K);
            for (int64_t i = 0; i < NMAX * K; i++) X[i] = frnd() * (i % 11 == 0 ? 30.0f : 1.0f); /* some outliers */
            /* CPU reference, all rows */
            g_cpu->ops->buf_write(g_cpu, x.c, 0, X, (size_t)NMAX * K);
            dsp_be_batch b = plain_batch(NMAX);
            begin_end(g_cpu, &b, true);
            g_cpu->ops->matmul(g_cpu, 1, (const dsp_bweight *const *)&wc, &y.c, x.c, NMAX);
            begin_end(g_cpu, &b, false);
            float *ref = rd(g_cpu, y.c, (size_t)NMAX * M);
            float *all = gpu_mm(wg, M, K, X, 0, NMAX, &x, &y);
            char what[96];
            snprintf(what, sizeof what, "matmul %s %lldx%lld", dsp_dtype_name(type), (long long)M, (long long)K);
            report(what, nmse(all, ref, (int64_t)NMAX * M), 1e-9);
            /* invariance: the first n rows in a launch of n; single rows anywhere; a block of 16 at row 50 */
            int bad = 0;
            for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                float *part = gpu_mm(wg, M, K, X, 0, rows[ri], &x, &y);
                bad += memcmp(part, all, sizeof(float) * (size_t)rows[ri] * M) != 0;
                free(part);
            }
            static const int singles[] = {0, 7, 64, 129, 299};
            for (int s = 0; s < 5; s++) {
                float *one = gpu_mm(wg, M, K, X, singles[s], 1, &x, &y);
                bad += memcmp(one, all + (size_t)singles[s] * M, sizeof(float) * (size_t)M) != 0;
                free(one);
            }
            float *blk = gpu_mm(wg, M, K, X, 50, 16, &x, &y);
            bad += memcmp(blk, all + (size_t)50 * M, sizeof(float) * 16 * (size_t)M) != 0;
            free(blk);
            CHECK_MSG(bad == 0, "%s: %d launches differ bitwise from the %d-row launch", what, bad, NMAX);
            free(ref), free(all), free(X);
            pb_free(&x), pb_free(&y);
            g_cpu->ops->weight_destroy(g_cpu, wc);
            g_gpu->ops->weight_destroy(g_gpu, wg);
            free(tw.data);
        }
}

/* fused q/k/v-style launches (3 weights, shared input) equal separate launches bit for bit; above 64
 * rows a CTA takes two tiles (BF16 and Q8_0 with 8 n-tiles, Q4_K with 4; 48 rows: 3 tiles, the
 * last CTA half empty); from 256 rows float weights take 8 tiles a CTA */
static void test_matmul_fused_one(uint32_t type, int n) {
    const int64_t K = 512, Ms[3] = {256, 64, 48};
    tbuf tw[3];
    dsp_bweight *w[3];
    pbuf y[3];
    for (int i = 0; i < 3; i++) {
        tensor_init(&tw[i], "blk.0.fused.weight", type, K, Ms[i]);
        CHECK(g_gpu->ops->weight_create(g_gpu, &tw[i].t, &w[i]) == DSP_OK);
        y[i] = pb((size_t)n * Ms[i]);
    }
    pbuf x = pb((size_t)n * K);
    pb_rand(&x, (size_t)n * K, 1.0f);
    dsp_be_batch b = plain_batch(n);
    begin_end(g_gpu, &b, true);
    dsp_buf *yg[3] = {y[0].g, y[1].g, y[2].g};
    g_gpu->ops->matmul(g_gpu, 3, (const dsp_bweight *const *)w, yg, x.g, n);
    begin_end(g_gpu, &b, false);
    for (int i = 0; i < 3; i++) {
        float *fused = rd(g_gpu, y[i].g, (size_t)n * Ms[i]);
        begin_end(g_gpu, &b, true);
        g_gpu->ops->matmul(g_gpu, 1, (const dsp_bweight *const *)&w[i], &y[i].g, x.g, n);
        begin_end(g_gpu, &b, false);
        float *single = rd(g_gpu, y[i].g, (size_t)n * Ms[i]);
        CHECK_MSG(memcmp(fused, single, sizeof(float) * (size_t)n * Ms[i]) == 0, "fused %s matmul %d (%d rows) differs from its own launch",
                  dsp_dtype_name(type), i, n);
        free(fused), free(single);
        g_gpu->ops->weight_destroy(g_gpu, w[i]);
        pb_free(&y[i]);
        free(tw[i].data);
    }
    pb_free(&x);
}

static void test_matmul_fused(void) {
    test_matmul_fused_one(DSP_Q4_K, 21);
    test_matmul_fused_one(DSP_Q4_K, 100);
    test_matmul_fused_one(DSP_BF16, 70);
    test_matmul_fused_one(DSP_Q8_0, 130);
    test_matmul_fused_one(DSP_BF16, 300); /* the tiled kernel: a CTA of 8 tiles, the 2nd and 3rd weights in part-empty CTAs */
}

/* add -> rmsnorm -> matmul and swiglu -> matmul in one forward are fused into the matmul's input
 * preparation; every output (x after the add, h after the norm, g after swiglu, y) must be
 * bit-identical to the ops run one per forward (no fusion then) */
static void test_fusion_one(int64_t E) {
    const int n = 19;
    const int64_t M = 96;
    tbuf tw, tn;
    tensor_init(&tw, "blk.0.fuse.weight", DSP_Q4_K, E, M);
    tensor_init(&tn, "blk.0.ffn_norm.weight", DSP_F32, E, 1);
    dsp_bweight *w, *nw;
    CHECK(g_gpu->ops->weight_create(g_gpu, &tw.t, &w) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &tn.t, &nw) == DSP_OK);
    dsp_buf *x, *h, *y, *u;
    const size_t nE = (size_t)n * E;
    CHECK(g_gpu->ops->buf_create(g_gpu, nE, &x) == DSP_OK && g_gpu->ops->buf_create(g_gpu, nE, &h) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)n * M, &y) == DSP_OK && g_gpu->ops->buf_create(g_gpu, nE, &u) == DSP_OK);
    float *x0 = xalloc(nE * 4), *h0 = xalloc(nE * 4), *u0 = xalloc(nE * 4), *out[2][3];
    for (size_t i = 0; i < nE; i++) x0[i] = frnd() * 4, h0[i] = frnd(), u0[i] = frnd();
    dsp_be_batch b = plain_batch(n);
    for (int pat = 0; pat < 2; pat++) {
        for (int split = 0; split < 2; split++) {
            dsp_backend *be = g_gpu;
            be->ops->buf_write(be, x, 0, x0, nE), be->ops->buf_write(be, h, 0, h0, nE), be->ops->buf_write(be, u, 0, u0, nE);
            begin_end(be, &b, true);
            if (pat == 0) {
                be->ops->add(be, x, h, nE);
                if (split) begin_end(be, &b, false), begin_end(be, &b, true);
                be->ops->rmsnorm(be, h, x, nw, n, (int)E, 1e-6f, NULL);
            } else {
                be->ops->swiglu(be, h, u, nE);
            }
            if (split) begin_end(be, &b, false), begin_end(be, &b, true);
            be->ops->matmul(be, 1, (const dsp_bweight *const *)&w, &y, h, n);
            begin_end(be, &b, false);
            out[split][0] = rd(be, x, nE), out[split][1] = rd(be, h, nE), out[split][2] = rd(be, y, (size_t)n * M);
        }
        CHECK_MSG(!memcmp(out[0][0], out[1][0], nE * 4) && !memcmp(out[0][1], out[1][1], nE * 4) &&
                      !memcmp(out[0][2], out[1][2], (size_t)n * M * 4),
                  "fused %s -> matmul differs from the ops run apart (%lld columns)", pat ? "swiglu" : "add -> rmsnorm", (long long)E);
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++) free(out[k][j]);
    }
    free(x0), free(h0), free(u0), free(tw.data), free(tn.data);
    g_gpu->ops->weight_destroy(g_gpu, w), g_gpu->ops->weight_destroy(g_gpu, nw);
    g_gpu->ops->buf_destroy(g_gpu, x), g_gpu->ops->buf_destroy(g_gpu, h), g_gpu->ops->buf_destroy(g_gpu, y), g_gpu->ops->buf_destroy(g_gpu, u);
}

/* 512 columns: one chunk (one CTA); 2,816: three, the last one partly past K (Q4_K: K a multiple
 * of 256), the norm's sums of squares crossing a cluster of three; 9,216: nine chunks over a
 * cluster of eight, one CTA taking two */
static void test_fusion(void) {
    test_fusion_one(512);
    test_fusion_one(2816);
    test_fusion_one(9216);
}

/* ---- row ops ------------------------------------------------------------------------------- */

static void test_row_ops(void) {
    const int n = 45, E = 576, H = 9, hd = 64;
    tbuf tw, tb, tn;
    tensor_init(&tw, "norm.weight", DSP_F32, E, 1);
    tensor_init(&tb, "bias", DSP_F32, E, 1);
    tensor_init(&tn, "q_norm.weight", DSP_F32, hd, 1);
    dsp_bweight *wc, *wg, *bc, *bg, *nc, *ng;
    CHECK(g_cpu->ops->weight_create(g_cpu, &tw.t, &wc) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &tw.t, &wg) == DSP_OK);
    CHECK(g_cpu->ops->weight_create(g_cpu, &tb.t, &bc) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &tb.t, &bg) == DSP_OK);
    CHECK(g_cpu->ops->weight_create(g_cpu, &tn.t, &nc) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &tn.t, &ng) == DSP_OK);
    pbuf x = pb((size_t)n * E), y = pb((size_t)n * E), z = pb((size_t)n * E), inv = pb((size_t)hd / 2);
    float invf[32];
    for (int i = 0; i < hd / 2; i++) invf[i] = 1.0f / powf(100000.0f, (float)(2 * i) / (float)hd);
    pb_write(&inv, invf, (size_t)hd / 2);
    int32_t rows[5] = {44, 0, 13, 13, 2};
    for (int variant = 0; variant < 7; variant++) {
        pb_rand(&x, (size_t)n * E, 3.0f);
        pb_rand(&y, (size_t)n * E, 3.0f);
        pb_rand(&z, (size_t)n * E, 1.0f);
        dsp_be_batch b = plain_batch(n);
        size_t cnt = (size_t)n * E;
        bool into_z = variant <= 1 || variant == 6; /* else the op works in place on x */
        const char *what = "";
        for (int k = 0; k < 2; k++) {
            dsp_backend *be = k ? g_gpu : g_cpu;
            dsp_buf *X = k ? x.g : x.c, *Y = k ? y.g : y.c, *Z = k ? z.g : z.c;
            dsp_bweight *W = k ? wg : wc, *Bi = k ? bg : bc, *N = k ? ng : nc;
            dsp_rope rope = {hd, variant == 5, 1.0f, 1.0f, k ? inv.g : inv.c};
            begin_end(be, &b, true);
            switch (variant) {
            case 0: what = "rmsnorm"; be->ops->rmsnorm(be, Z, X, W, n, E, 1e-5f, NULL); break;
            case 1: what = "rmsnorm rows, no weight"; be->ops->rmsnorm(be, Z, X, NULL, 5, E, 1e-5f, rows), cnt = 5 * (size_t)E; break;
            case 2: what = "add_bias"; be->ops->add_bias(be, X, Bi, n, E); break;
            case 3: what = "add + swiglu"; be->ops->add(be, X, Y, cnt), be->ops->swiglu(be, X, Y, cnt); break;
            case 4: what = "norm_rope (interleaved)"; be->ops->norm_rope(be, X, N, 1e-6f, H, hd, &rope); break;
            case 5: what = "norm_rope (neox, no norm)"; be->ops->norm_rope(be, X, NULL, 1e-6f, H, hd, &rope); break;
            case 6: what = "copy_rows"; be->ops->copy_rows(be, Z, 2 * 100, 37, X, E, 5, 20, 100); break;
            }
            begin_end(be, &b, false);
        }
        float *c = rd(g_cpu, into_z ? z.c : x.c, cnt), *g = rd(g_gpu, into_z ? z.g : x.g, cnt);
        report(what, nmse(g, c, (int64_t)cnt), variant == 6 ? 0.0 : 1e-10);
        free(c), free(g);
    }
    pb_free(&x), pb_free(&y), pb_free(&z), pb_free(&inv);
    g_cpu->ops->weight_destroy(g_cpu, wc), g_gpu->ops->weight_destroy(g_gpu, wg);
    g_cpu->ops->weight_destroy(g_cpu, bc), g_gpu->ops->weight_destroy(g_gpu, bg);
    g_cpu->ops->weight_destroy(g_cpu, nc), g_gpu->ops->weight_destroy(g_gpu, ng);
    free(tw.data), free(tb.data), free(tn.data);
}

static void test_embed(void) {
    const int n = 33;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int64_t E = dsp_dtype_get(g_types[ti])->block_elems == 256 ? 512 : 96, V = 100;
        tbuf tt;
        tensor_init(&tt, "token_embd.weight", g_types[ti], E, V);
        dsp_bweight *c, *g;
        CHECK(g_cpu->ops->weight_create(g_cpu, &tt.t, &c) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &tt.t, &g) == DSP_OK);
        pbuf x = pb((size_t)n * E);
        dsp_be_batch b = plain_batch(n);
        for (int i = 0; i < n; i++) g_tok[i] = (int32_t)((i * 31 + 5) % V);
        for (int k = 0; k < 2; k++) {
            dsp_backend *be = k ? g_gpu : g_cpu;
            begin_end(be, &b, true);
            be->ops->embed(be, k ? x.g : x.c, k ? g : c, (int)E);
            begin_end(be, &b, false);
        }
        float *rc = rd(g_cpu, x.c, (size_t)n * E), *rg = rd(g_gpu, x.g, (size_t)n * E);
        CHECK_MSG(memcmp(rc, rg, sizeof(float) * (size_t)n * E) == 0, "embed %s is not bit-exact", dsp_dtype_name(g_types[ti]));
        free(rc), free(rg);
        pb_free(&x);
        g_cpu->ops->weight_destroy(g_cpu, c), g_gpu->ops->weight_destroy(g_gpu, g);
        free(tt.data);
    }
}

/* ---- KV + attention ----------------------------------------------------------------------- */

typedef struct att_case {
    int n_head, n_head_kv, hd;
} att_case;

/* 1 if the attention of one row launched alone (query qrow; row i of the batch b) differs bitwise from
 * `want`, its output in the batch */
static int attn_alone_differs(dsp_backend *gpu, const att_case *ac, dsp_buf *qg, dsp_buf *og, dsp_kv_store *kg, const float *qrow,
                              const dsp_be_batch *b, int i, float scale, const float *want) {
    const size_t q_dim = (size_t)ac->n_head * ac->hd;
    gpu->ops->buf_write(gpu, qg, 0, qrow, q_dim);
    dsp_be_batch one = {1, NULL, &b->pos[i], &b->seq[i], &b->n_keys[i], b->n_seqs, b->seqs};
    begin_end(gpu, &one, true);
    gpu->ops->attention(gpu, og, qg, kg, 1, ac->n_head, ac->n_head_kv, ac->hd, scale);
    begin_end(gpu, &one, false);
    float *r1 = rd(gpu, og, q_dim);
    const int d = memcmp(r1, want, sizeof(float) * q_dim) != 0;
    free(r1);
    return d;
}

static void attention_case(dsp_backend *gpu, const att_case *ac, double tol, const char *kvname) {
    const int bt = 16, kv_dim = ac->n_head_kv * ac->hd, q_dim = ac->n_head * ac->hd;
    static const int lens[3] = {700, 5, 300};
    dsp_kv_pool pool;
    CHECK(dsp_kv_pool_create(&pool, bt, 200, false) == DSP_OK);
    dsp_kv_seq s[3];
    const dsp_kv_seq *sp[3] = {&s[0], &s[1], &s[2]};
    int total = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(dsp_kv_seq_init(&s[i], 1024, bt, 0) == DSP_OK);
        CHECK(dsp_kv_seq_reserve(&pool, &s[i], (uint32_t)lens[i]) == DSP_OK);
        total += lens[i];
    }
    dsp_kv_store *kc, *kg;
    CHECK(g_cpu->ops->kv_create(g_cpu, 2, kv_dim, bt, 200, &kc) == DSP_OK);
    CHECK_MSG(gpu->ops->kv_create(gpu, 2, kv_dim, bt, 200, &kg) == DSP_OK, "%s", dsp_last_error());
    /* write every position of every sequence in layer 1, one forward */
    dsp_buf *kbc, *vbc, *kbg, *vbg;
    CHECK(g_cpu->ops->buf_create(g_cpu, (size_t)total * kv_dim, &kbc) == DSP_OK && g_cpu->ops->buf_create(g_cpu, (size_t)total * kv_dim, &vbc) == DSP_OK);
    CHECK(gpu->ops->buf_create(gpu, (size_t)total * kv_dim, &kbg) == DSP_OK && gpu->ops->buf_create(gpu, (size_t)total * kv_dim, &vbg) == DSP_OK);
    float *kv = xalloc(sizeof(float) * (size_t)total * kv_dim);
    int32_t *pos = xalloc(sizeof(int32_t) * (size_t)total), *seq = xalloc(sizeof(int32_t) * (size_t)total), *nk = xalloc(sizeof(int32_t) * (size_t)total);
    for (int i = 0, r = 0; i < 3; i++)
        for (int p = 0; p < lens[i]; p++, r++) pos[r] = p, seq[r] = i, nk[r] = p + 1;
    dsp_be_batch wb = {total, NULL, pos, seq, nk, 3, sp};
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < (int64_t)total * kv_dim; i++) kv[i] = frnd() * 2.0f;
        g_cpu->ops->buf_write(g_cpu, pass ? vbc : kbc, 0, kv, (size_t)total * kv_dim);
        gpu->ops->buf_write(gpu, pass ? vbg : kbg, 0, kv, (size_t)total * kv_dim);
    }
    begin_end(g_cpu, &wb, true);
    g_cpu->ops->kv_write(g_cpu, kc, 1, kbc, vbc);
    begin_end(g_cpu, &wb, false);
    begin_end(gpu, &wb, true);
    gpu->ops->kv_write(gpu, kg, 1, kbg, vbg);
    begin_end(gpu, &wb, false);
    /* rows: a verify block at the end of s0, a decode row of s1, a prefill-like row of s2, s2's last */
    int32_t rp[8] = {695, 696, 697, 698, 699, 4, 100, 299}, rs[8] = {0, 0, 0, 0, 0, 1, 2, 2}, rk[8];
    const int n = 8;
    for (int i = 0; i < n; i++) rk[i] = rp[i] + 1;
    dsp_buf *qc, *oc, *qg, *og;
    CHECK(g_cpu->ops->buf_create(g_cpu, (size_t)n * q_dim, &qc) == DSP_OK && g_cpu->ops->buf_create(g_cpu, (size_t)n * q_dim, &oc) == DSP_OK);
    CHECK(gpu->ops->buf_create(gpu, (size_t)n * q_dim, &qg) == DSP_OK && gpu->ops->buf_create(gpu, (size_t)n * q_dim, &og) == DSP_OK);
    float *q = xalloc(sizeof(float) * (size_t)n * q_dim);
    for (int i = 0; i < n * q_dim; i++) q[i] = frnd();
    g_cpu->ops->buf_write(g_cpu, qc, 0, q, (size_t)n * q_dim);
    gpu->ops->buf_write(gpu, qg, 0, q, (size_t)n * q_dim);
    const float scale = 1.0f / sqrtf((float)ac->hd);
    dsp_be_batch ab = {n, NULL, rp, rs, rk, 3, sp};
    begin_end(g_cpu, &ab, true);
    g_cpu->ops->attention(g_cpu, oc, qc, kc, 1, ac->n_head, ac->n_head_kv, ac->hd, scale);
    begin_end(g_cpu, &ab, false);
    begin_end(gpu, &ab, true);
    gpu->ops->attention(gpu, og, qg, kg, 1, ac->n_head, ac->n_head_kv, ac->hd, scale);
    begin_end(gpu, &ab, false);
    float *rc = rd(g_cpu, oc, (size_t)n * q_dim), *rg = rd(gpu, og, (size_t)n * q_dim);
    char what[96];
    snprintf(what, sizeof what, "attention %s %d/%d heads, hd %d", kvname, ac->n_head, ac->n_head_kv, ac->hd);
    report(what, nmse(rg, rc, (int64_t)n * q_dim), tol);
    /* invariance: each row alone */
    int bad = 0;
    for (int i = 0; i < n; i++) bad += attn_alone_differs(gpu, ac, qg, og, kg, q + (size_t)i * q_dim, &ab, i, scale, rg + (size_t)i * q_dim);
    CHECK_MSG(bad == 0, "%s: %d rows differ alone vs in the batch", what, bad);
    /* a prefill-sized batch in one launch: s2's 300 rows (16-key chunks) and 80 of s0's (64-key
     * chunks); sampled rows equal the row alone */
    {
        const int np = 380;
        int32_t *pp = xalloc(sizeof(int32_t) * np), *ps = xalloc(sizeof(int32_t) * np), *pk = xalloc(sizeof(int32_t) * np);
        for (int i = 0; i < np; i++) {
            pp[i] = i < 300 ? i : 620 + (i - 300), ps[i] = i < 300 ? 2 : 0;
            pk[i] = pp[i] + 1;
        }
        dsp_buf *qb, *ob;
        CHECK(gpu->ops->buf_create(gpu, (size_t)np * q_dim, &qb) == DSP_OK && gpu->ops->buf_create(gpu, (size_t)np * q_dim, &ob) == DSP_OK);
        float *qp = xalloc(sizeof(float) * (size_t)np * q_dim);
        for (int64_t i = 0; i < (int64_t)np * q_dim; i++) qp[i] = frnd();
        gpu->ops->buf_write(gpu, qb, 0, qp, (size_t)np * q_dim);
        dsp_be_batch big = {np, NULL, pp, ps, pk, 3, sp};
        begin_end(gpu, &big, true);
        gpu->ops->attention(gpu, ob, qb, kg, 1, ac->n_head, ac->n_head_kv, ac->hd, scale);
        begin_end(gpu, &big, false);
        float *all = rd(gpu, ob, (size_t)np * q_dim);
        /* every row: the batch takes attn_rows_kernel (16 rows a CTA, a run boundary inside
         * rows 288-303), the row alone attn_chunk_kernel */
        int pbad = 0;
        for (int k = 0; k < np; k++) pbad += attn_alone_differs(gpu, ac, qg, og, kg, qp + (size_t)k * q_dim, &big, k, scale, all + (size_t)k * q_dim);
        CHECK_MSG(pbad == 0, "%s: %d of %d rows of a %d-row batch differ from the row alone", what, pbad, np, np);
        free(all), free(qp), free(pp), free(ps), free(pk);
        gpu->ops->buf_destroy(gpu, qb), gpu->ops->buf_destroy(gpu, ob);
    }
    /* copy-on-write: s0's first block copied to a free block; a table using the copy gives the same rows */
    uint32_t fresh = pool.free_ids[pool.n_free - 1];
    CHECK(gpu->ops->kv_copy_block(gpu, kg, fresh, s[0].blocks[0]) == DSP_OK);
    uint32_t saved = s[0].blocks[0];
    s[0].blocks[0] = fresh;
    gpu->ops->buf_write(gpu, qg, 0, q, (size_t)q_dim);
    dsp_be_batch one = {1, NULL, &rp[0], &rs[0], &rk[0], 3, sp};
    begin_end(gpu, &one, true);
    gpu->ops->attention(gpu, og, qg, kg, 1, ac->n_head, ac->n_head_kv, ac->hd, scale);
    begin_end(gpu, &one, false);
    float *r1 = rd(gpu, og, (size_t)q_dim);
    CHECK_MSG(memcmp(r1, rg, sizeof(float) * (size_t)q_dim) == 0, "%s: attention over a copied block differs", what);
    s[0].blocks[0] = saved;
    free(r1), free(rc), free(rg), free(q), free(kv), free(pos), free(seq), free(nk);
    g_cpu->ops->buf_destroy(g_cpu, qc), g_cpu->ops->buf_destroy(g_cpu, oc), g_cpu->ops->buf_destroy(g_cpu, kbc), g_cpu->ops->buf_destroy(g_cpu, vbc);
    gpu->ops->buf_destroy(gpu, qg), gpu->ops->buf_destroy(gpu, og), gpu->ops->buf_destroy(gpu, kbg), gpu->ops->buf_destroy(gpu, vbg);
    g_cpu->ops->kv_destroy(g_cpu, kc);
    gpu->ops->kv_destroy(gpu, kg);
    for (int i = 0; i < 3; i++) dsp_kv_seq_free(&pool, &s[i]);
    dsp_kv_pool_destroy(&pool);
}

/* norm_rope(q), norm_rope(k), kv_write in one forward run as one fused kernel: q, k and the
 * attention over what it wrote must equal the three ops run in separate forwards, bit for bit */
static void test_rope_kv_fusion(void) {
    const int n = 20, hq = 8, hk = 2, hd = 64, bt = 16;
    dsp_kv_pool pool;
    dsp_kv_seq s;
    CHECK(dsp_kv_pool_create(&pool, bt, 8, false) == DSP_OK && dsp_kv_seq_init(&s, 128, bt, 0) == DSP_OK);
    CHECK(dsp_kv_seq_reserve(&pool, &s, n) == DSP_OK);
    const dsp_kv_seq *sp[1] = {&s};
    int32_t pos[20], seq[20], nk[20];
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0, nk[i] = i + 1;
    dsp_be_batch b = {n, NULL, pos, seq, nk, 1, sp};
    tbuf tqn, tkn;
    tensor_init(&tqn, "q_norm.weight", DSP_F32, hd, 1);
    tensor_init(&tkn, "k_norm.weight", DSP_F32, hd, 1);
    dsp_bweight *qn, *kn;
    CHECK(g_gpu->ops->weight_create(g_gpu, &tqn.t, &qn) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &tkn.t, &kn) == DSP_OK);
    dsp_buf *q, *k, *v, *o, *inv;
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)n * hq * hd, &q) == DSP_OK && g_gpu->ops->buf_create(g_gpu, (size_t)n * hk * hd, &k) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)n * hk * hd, &v) == DSP_OK && g_gpu->ops->buf_create(g_gpu, (size_t)n * hq * hd, &o) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, hd / 2, &inv) == DSP_OK);
    float invf[32], *q0 = xalloc(sizeof(float) * n * hq * hd), *k0 = xalloc(sizeof(float) * n * hk * hd), *v0 = xalloc(sizeof(float) * n * hk * hd);
    for (int i = 0; i < hd / 2; i++) invf[i] = 1.0f / powf(1e6f, (float)(2 * i) / (float)hd);
    for (int i = 0; i < n * hq * hd; i++) q0[i] = frnd();
    for (int i = 0; i < n * hk * hd; i++) k0[i] = frnd(), v0[i] = frnd();
    g_gpu->ops->buf_write(g_gpu, inv, 0, invf, hd / 2);
    dsp_rope rope = {hd, true, 1.0f, 1.0f, inv};
    float *res[2][3];
    for (int split = 0; split < 2; split++) {
        dsp_kv_store *kv;
        CHECK(g_gpu->ops->kv_create(g_gpu, 1, hk * hd, bt, 8, &kv) == DSP_OK);
        g_gpu->ops->buf_write(g_gpu, q, 0, q0, (size_t)n * hq * hd);
        g_gpu->ops->buf_write(g_gpu, k, 0, k0, (size_t)n * hk * hd);
        g_gpu->ops->buf_write(g_gpu, v, 0, v0, (size_t)n * hk * hd);
        begin_end(g_gpu, &b, true);
        g_gpu->ops->norm_rope(g_gpu, q, qn, 1e-6f, hq, hd, &rope);
        if (split) begin_end(g_gpu, &b, false), begin_end(g_gpu, &b, true);
        g_gpu->ops->norm_rope(g_gpu, k, kn, 1e-6f, hk, hd, &rope);
        if (split) begin_end(g_gpu, &b, false), begin_end(g_gpu, &b, true);
        g_gpu->ops->kv_write(g_gpu, kv, 0, k, v);
        begin_end(g_gpu, &b, false);
        begin_end(g_gpu, &b, true);
        g_gpu->ops->attention(g_gpu, o, q, kv, 0, hq, hk, hd, 0.125f);
        begin_end(g_gpu, &b, false);
        res[split][0] = rd(g_gpu, q, (size_t)n * hq * hd), res[split][1] = rd(g_gpu, k, (size_t)n * hk * hd);
        res[split][2] = rd(g_gpu, o, (size_t)n * hq * hd);
        g_gpu->ops->kv_destroy(g_gpu, kv);
    }
    CHECK_MSG(!memcmp(res[0][0], res[1][0], sizeof(float) * n * hq * hd) && !memcmp(res[0][1], res[1][1], sizeof(float) * n * hk * hd) &&
                  !memcmp(res[0][2], res[1][2], sizeof(float) * n * hq * hd),
              "fused norm_rope q+k and kv_write differ from the ops run apart");
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) free(res[i][j]);
    free(q0), free(k0), free(v0), free(tqn.data), free(tkn.data);
    g_gpu->ops->weight_destroy(g_gpu, qn), g_gpu->ops->weight_destroy(g_gpu, kn);
    dsp_buf *bufs[] = {q, k, v, o, inv};
    for (int i = 0; i < 5; i++) g_gpu->ops->buf_destroy(g_gpu, bufs[i]);
    dsp_kv_seq_free(&pool, &s);
    dsp_kv_pool_destroy(&pool);
}

/* attention -> matmul (the o projection) in one forward: the merge packs the matmul's input
 * itself (DSP_CU_PREP_PACKED); the attention's output and the matmul's result must equal the two
 * ops run in separate forwards, bit for bit. hd 64 x 9 heads = 576 columns leaves units past the
 * row (zeros the merge writes), hd 128 x 8 none; Q4_1 reads the 32-block sums, BF16 does not. */
static void test_attn_pack_one(int hq, int hk, int hd, uint32_t type, int n) {
    const int bt = 16, K = hq * hd;
    const int64_t M = 48;
    dsp_kv_pool pool;
    dsp_kv_seq s;
    CHECK(dsp_kv_pool_create(&pool, bt, 8, false) == DSP_OK && dsp_kv_seq_init(&s, 128, bt, 0) == DSP_OK);
    CHECK(dsp_kv_seq_reserve(&pool, &s, 40) == DSP_OK);
    const dsp_kv_seq *sp[1] = {&s};
    int32_t pos[40], seq[40], nk[40];
    for (int i = 0; i < 40; i++) pos[i] = i, seq[i] = 0, nk[i] = i + 1;
    dsp_be_batch wb = {40, NULL, pos, seq, nk, 1, sp};
    dsp_be_batch b = {n, NULL, pos + 40 - n, seq, nk + 40 - n, 1, sp}; /* the last n positions */
    tbuf tw, twd;
    tensor_init(&tw, "blk.0.attn_output.weight", type, K, M);
    tensor_init(&twd, "blk.0.ffn_down.weight", DSP_BF16, 2048, 16);
    dsp_bweight *w, *wd;
    CHECK(g_gpu->ops->weight_create(g_gpu, &tw.t, &w) == DSP_OK && g_gpu->ops->weight_create(g_gpu, &twd.t, &wd) == DSP_OK);
    dsp_buf *xd, *yd;
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)40 * 2048, &xd) == DSP_OK && g_gpu->ops->buf_create(g_gpu, (size_t)40 * 16, &yd) == DSP_OK);
    {
        float *x0 = xalloc(sizeof(float) * 40 * 2048);
        for (int i = 0; i < 40 * 2048; i++) x0[i] = frnd() + 3.0f;
        g_gpu->ops->buf_write(g_gpu, xd, 0, x0, (size_t)40 * 2048);
        free(x0);
    }
    dsp_buf *q, *k, *v, *o, *y;
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)40 * K, &q) == DSP_OK && g_gpu->ops->buf_create(g_gpu, (size_t)40 * hk * hd, &k) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)40 * hk * hd, &v) == DSP_OK && g_gpu->ops->buf_create(g_gpu, (size_t)40 * K, &o) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)40 * M, &y) == DSP_OK);
    float *q0 = xalloc(sizeof(float) * 40 * K), *kv0 = xalloc(sizeof(float) * 40 * hk * hd);
    for (int i = 0; i < 40 * K; i++) q0[i] = frnd();
    dsp_kv_store *kv;
    CHECK(g_gpu->ops->kv_create(g_gpu, 1, hk * hd, bt, 8, &kv) == DSP_OK);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 40 * hk * hd; i++) kv0[i] = frnd() * 2.0f;
        g_gpu->ops->buf_write(g_gpu, pass ? v : k, 0, kv0, (size_t)40 * hk * hd);
    }
    begin_end(g_gpu, &wb, true);
    g_gpu->ops->kv_write(g_gpu, kv, 0, k, v);
    begin_end(g_gpu, &wb, false);
    g_gpu->ops->buf_write(g_gpu, q, 0, q0, (size_t)n * K);
    float *res[2][2];
    for (int split = 0; split < 2; split++) {
        /* first a wider matmul, so that the packed-activation scratch holds non-zero units past
         * this row's (which the fused merge must zero) */
        begin_end(g_gpu, &b, true);
        g_gpu->ops->matmul(g_gpu, 1, (const dsp_bweight *const *)&wd, &yd, xd, n);
        begin_end(g_gpu, &b, false);
        begin_end(g_gpu, &b, true);
        g_gpu->ops->attention(g_gpu, o, q, kv, 0, hq, hk, hd, 1.0f / sqrtf((float)hd));
        if (split) begin_end(g_gpu, &b, false), begin_end(g_gpu, &b, true);
        g_gpu->ops->matmul(g_gpu, 1, (const dsp_bweight *const *)&w, &y, o, n);
        begin_end(g_gpu, &b, false);
        res[split][0] = rd(g_gpu, o, (size_t)n * K), res[split][1] = rd(g_gpu, y, (size_t)n * M);
    }
    CHECK_MSG(!memcmp(res[0][0], res[1][0], sizeof(float) * (size_t)n * K) && !memcmp(res[0][1], res[1][1], sizeof(float) * (size_t)n * M),
              "attention -> matmul %s packed by the merge differs from the ops run apart (%d heads of %d, %d rows)",
              dsp_dtype_name(type), hq, hd, n);
    for (int i = 0; i < 2; i++) free(res[i][0]), free(res[i][1]);
    free(q0), free(kv0), free(tw.data), free(twd.data);
    g_gpu->ops->weight_destroy(g_gpu, w), g_gpu->ops->weight_destroy(g_gpu, wd);
    dsp_buf *bufs[] = {q, k, v, o, y, xd, yd};
    for (int i = 0; i < 7; i++) g_gpu->ops->buf_destroy(g_gpu, bufs[i]);
    g_gpu->ops->kv_destroy(g_gpu, kv);
    dsp_kv_seq_free(&pool, &s);
    dsp_kv_pool_destroy(&pool);
}

static void test_attn_pack(void) {
    test_attn_pack_one(9, 3, 64, DSP_Q4_1, 20);
    test_attn_pack_one(9, 3, 64, DSP_BF16, 1);
    test_attn_pack_one(8, 2, 128, DSP_Q4_1, 1);
    test_attn_pack_one(8, 2, 128, DSP_Q8_0, 17);
}

static void test_attention(void) {
    static const att_case cases[] = {{8, 2, 128}, {9, 3, 64}, {4, 4, 32}};
    for (int i = 0; i < 3; i++) attention_case(g_gpu, &cases[i], 1e-5, "f16");
    dsp_backend_params p = {.kind = DSP_BACKEND_CUDA, .kv_type = DSP_BF16};
    dsp_backend *bf;
    CHECK(dsp_backend_cuda_create(&p, &bf) == DSP_OK);
    dsp_be_limits lim = {1024, 4096, 4, 1024, 128};
    CHECK(bf->ops->reserve(bf, &lim) == DSP_OK);
    attention_case(bf, &cases[0], 1e-4, "bf16");
    dsp_backend_destroy(bf);
}

/* ---- logits on the device --------------------------------------------------------------- */

static void test_logits(void) {
    const int n = 5, V = 50000, k = 8;
    dsp_buf *lg;
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)n * V, &lg) == DSP_OK);
    float *x = xalloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n * V; i++) x[i] = frnd() * 10.0f;
    x[3 * V + 777] = 50.0f, x[3 * V + 778] = 50.0f; /* a tie: the lower id wins */
    g_gpu->ops->buf_write(g_gpu, lg, 0, x, (size_t)n * V);
    int32_t am[5], ids[5 * 8];
    float lp[5 * 8], lse[5];
    CHECK(g_gpu->ops->argmax(g_gpu, lg, n, V, am) == DSP_OK);
    CHECK(g_gpu->ops->top_logprobs(g_gpu, lg, n, V, k, ids, lp, lse) == DSP_OK);
    for (int r = 0; r < n; r++) {
        const float *row = x + (size_t)r * V;
        int best = 0;
        double mx = row[0];
        for (int i = 1; i < V; i++)
            if (row[i] > row[best]) best = i;
        for (int i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        double s = 0;
        for (int i = 0; i < V; i++) s += exp(row[i] - mx);
        double l = mx + log(s);
        CHECK_EQ_INT(am[r], best);
        CHECK_EQ_INT(ids[r * k], best);
        CHECK(fabs(lse[r] - l) < 1e-4);
        for (int j = 0; j < k; j++) {
            CHECK(fabs(lp[r * k + j] - (row[ids[r * k + j]] - l)) < 1e-4);
            if (j) CHECK(row[ids[r * k + j]] <= row[ids[r * k + j - 1]]);
        }
    }
    CHECK_EQ_INT(am[3], 777);
    CHECK_EQ_INT(ids[3 * k + 1], 778);
    /* the argmax splits a row into column ranges reduced by the last CTA to finish: a tie across
     * ranges goes to the lower id, NaN is skipped, +inf wins, a row without a finite logit gives -1;
     * twice (the tickets re-arm), then on more rows than before (the scratch grows) */
    for (int i = 0; i < 3 * V; i++) x[i] = frnd();
    x[45000] = 60.0f, x[5000] = 60.0f, x[49999] = NAN;
    for (int i = 0; i < V; i++) x[V + i] = i % 3 ? -INFINITY : NAN;
    x[2 * V + 10] = NAN, x[2 * V + 30001] = INFINITY, x[2 * V + 40000] = INFINITY;
    g_gpu->ops->buf_write(g_gpu, lg, 0, x, (size_t)3 * V);
    for (int rep = 0; rep < 2; rep++) {
        CHECK(g_gpu->ops->argmax(g_gpu, lg, 3, V, am) == DSP_OK);
        CHECK_EQ_INT(am[0], 5000);
        CHECK_EQ_INT(am[1], -1);
        CHECK_EQ_INT(am[2], 30001);
    }
    const int n2 = 300, V2 = 3001;
    dsp_buf *lg2;
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)n2 * V2, &lg2) == DSP_OK);
    float *x2 = xalloc(sizeof(float) * (size_t)n2 * V2);
    int32_t *am2 = xalloc(sizeof(int32_t) * n2);
    for (int i = 0; i < n2 * V2; i++) x2[i] = frnd();
    g_gpu->ops->buf_write(g_gpu, lg2, 0, x2, (size_t)n2 * V2);
    CHECK(g_gpu->ops->argmax(g_gpu, lg2, n2, V2, am2) == DSP_OK);
    int bad = 0;
    for (int r = 0; r < n2; r++) {
        int best = 0;
        for (int i = 1; i < V2; i++)
            if (x2[(size_t)r * V2 + i] > x2[(size_t)r * V2 + best]) best = i;
        bad += am2[r] != best;
    }
    CHECK_MSG(bad == 0, "%d of %d argmax rows differ", bad, n2);
    free(x2), free(am2);
    g_gpu->ops->buf_destroy(g_gpu, lg2);
    free(x);
    g_gpu->ops->buf_destroy(g_gpu, lg);
}

/* the drafter's Markov chain on the device (markov_greedy) equals spec/block.c's host loop: the
 * bias W2 . W1[prev] by the GPU's matmul for the slot's rows together, added on the host, argmax;
 * three requests of 4, 0 and 7 slots whose logit rows are not in request order */
static void test_markov_greedy(void) {
    const int V = 9001, r = 64, R = 3, rows = 16; /* 3 column ranges per argmax */
    const int n[3] = {4, 0, 7}, row0[3] = {9, 0, 1};
    const int32_t anchor[3] = {5, 17, 2999};
    tbuf w2;
    tensor_init(&w2, "mk_w2", DSP_BF16, r, V);
    dsp_bweight *bw2;
    CHECK(g_gpu->ops->weight_create(g_gpu, &w2.t, &bw2) == DSP_OK);
    float *w1 = xalloc(sizeof(float) * (size_t)V * r), *z = xalloc(sizeof(float) * (size_t)rows * V);
    for (int i = 0; i < V * r; i++) w1[i] = frnd();
    for (int i = 0; i < rows * V; i++) z[i] = frnd() * 4.0f;
    dsp_buf *lg, *bw1, *e, *y;
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)rows * V, &lg) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)V * r, &bw1) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)R * r, &e) == DSP_OK);
    CHECK(g_gpu->ops->buf_create(g_gpu, (size_t)R * V, &y) == DSP_OK);
    g_gpu->ops->buf_write(g_gpu, lg, 0, z, (size_t)rows * V);
    g_gpu->ops->buf_write(g_gpu, bw1, 0, w1, (size_t)V * r);
    int32_t out[11];
    CHECK_MSG(g_gpu->ops->markov_greedy(g_gpu, lg, V, bw1, r, bw2, e, y, R, row0, n, anchor, out) == DSP_OK, "%s", dsp_last_error());
    /* the reference, slot by slot as block.c's host loop */
    int32_t ref[11], prev[3];
    for (int j = 0; j < R; j++) prev[j] = anchor[j];
    pbuf pe = pb((size_t)R * r), py = pb((size_t)R * V);
    float *he = xalloc(sizeof(float) * (size_t)R * r);
    int mismatch = 0, o[3] = {0, 4, 4};
    for (int k = 0; k < 7; k++) {
        int m = 0, idx[3];
        for (int j = 0; j < R; j++)
            if (k < n[j]) memcpy(he + (size_t)m * r, w1 + (size_t)prev[j] * r, sizeof(float) * r), idx[m++] = j;
        float *b = gpu_mm(bw2, V, r, he, 0, m, &pe, &py);
        for (int i = 0; i < m; i++) {
            const int j = idx[i];
            float *row = z + (size_t)(row0[j] + k) * V;
            int best = 0;
            for (int c = 0; c < V; c++) row[c] += b[(size_t)i * V + c];
            for (int c = 1; c < V; c++)
                if (row[c] > row[best]) best = c;
            ref[o[j] + k] = prev[j] = best;
        }
        free(b);
    }
    for (int i = 0; i < 11; i++) mismatch += out[i] != ref[i];
    CHECK_MSG(mismatch == 0, "%d of 11 chain tokens differ from the host loop", mismatch);
    float *after = rd(g_gpu, lg, (size_t)rows * V);
    CHECK_MSG(!memcmp(after, z, sizeof(float) * (size_t)rows * V), "the biased logit rows differ from the host loop's");
    free(after), free(he), free(w1), free(z), free(w2.data);
    pb_free(&pe), pb_free(&py);
    g_gpu->ops->buf_destroy(g_gpu, lg), g_gpu->ops->buf_destroy(g_gpu, bw1), g_gpu->ops->buf_destroy(g_gpu, e);
    g_gpu->ops->buf_destroy(g_gpu, y);
    g_gpu->ops->weight_destroy(g_gpu, bw2);
}

/* ---- graphs: a replayed forward equals the direct launches ------------------------------ */

static void test_graph_replay(void) {
    setenv("DSP_CUDA_GRAPHS", "0", 1);
    dsp_backend_params p = {.kind = DSP_BACKEND_CUDA};
    dsp_backend *eager;
    CHECK(dsp_backend_cuda_create(&p, &eager) == DSP_OK);
    unsetenv("DSP_CUDA_GRAPHS");
    dsp_be_limits lim = {64, 1024, 4, 1024, 128};
    CHECK(eager->ops->reserve(eager, &lim) == DSP_OK);
    const int64_t M = 300, K = 1024;
    tbuf tw;
    tensor_init(&tw, "graph.weight", DSP_Q6_K, K, M);
    dsp_bweight *wg, *we;
    CHECK(g_gpu->ops->weight_create(g_gpu, &tw.t, &wg) == DSP_OK && eager->ops->weight_create(eager, &tw.t, &we) == DSP_OK);
    dsp_buf *xg, *yg, *xe, *ye;
    CHECK(g_gpu->ops->buf_create(g_gpu, 4 * K, &xg) == DSP_OK && g_gpu->ops->buf_create(g_gpu, 4 * M, &yg) == DSP_OK);
    CHECK(eager->ops->buf_create(eager, 4 * K, &xe) == DSP_OK && eager->ops->buf_create(eager, 4 * M, &ye) == DSP_OK);
    float *x = xalloc(sizeof(float) * 4 * K);
    int bad = 0;
    for (int it = 0; it < 4; it++) { /* the first run captures, the rest replay with new inputs */
        for (int i = 0; i < 4 * K; i++) x[i] = frnd();
        dsp_be_batch b = plain_batch(4);
        float *out[2];
        for (int k = 0; k < 2; k++) {
            dsp_backend *be = k ? eager : g_gpu;
            begin_end(be, &b, true);
            be->ops->buf_write(be, k ? xe : xg, 0, x, 4 * (size_t)K); /* inside the forward: staged */
            be->ops->matmul(be, 1, (const dsp_bweight *const *)(k ? &we : &wg), k ? &ye : &yg, k ? xe : xg, 4);
            be->ops->rmsnorm(be, k ? ye : yg, k ? ye : yg, NULL, 4, (int)M, 1e-6f, NULL);
            begin_end(be, &b, false);
            out[k] = rd(be, k ? ye : yg, 4 * (size_t)M);
        }
        bad += memcmp(out[0], out[1], sizeof(float) * 4 * (size_t)M) != 0;
        free(out[0]), free(out[1]);
    }
    CHECK_MSG(bad == 0, "%d graph replays differ from direct launches", bad);
    free(x), free(tw.data);
    g_gpu->ops->weight_destroy(g_gpu, wg), eager->ops->weight_destroy(eager, we);
    g_gpu->ops->buf_destroy(g_gpu, xg), g_gpu->ops->buf_destroy(g_gpu, yg);
    eager->ops->buf_destroy(eager, xe), eager->ops->buf_destroy(eager, ye);
    dsp_backend_destroy(eager);
}

/* ---- bad input ---------------------------------------------------------------------------- */

static void test_bad_input(void) {
    tbuf tq, tok;
    tensor_init(&tq, "blk.3.ffn_down.weight", DSP_Q2_K, 256, 16);
    dsp_bweight *w = NULL;
    CHECK_EQ_INT(g_gpu->ops->weight_create(g_gpu, &tq.t, &w), DSP_ERR_UNSUPPORTED);
    CHECK(strstr(dsp_last_error(), "blk.3.ffn_down.weight") && strstr(dsp_last_error(), "Q2_K"));
    tensor_init(&tok, "blk.0.attn_q.weight", DSP_Q8_0, 256, 16);
    const dsp_tensor *ts[2] = {&tok.t, &tq.t};
    CHECK_EQ_INT(g_gpu->ops->check_weights(g_gpu, ts, 2, 0), DSP_ERR_UNSUPPORTED);
    CHECK(strstr(dsp_last_error(), "blk.3.ffn_down.weight") != NULL);
    CHECK_EQ_INT(g_gpu->ops->check_weights(g_gpu, ts, 1, 0), DSP_OK);
    CHECK_EQ_INT(g_gpu->ops->check_weights(g_gpu, ts, 1, 1ull << 50), DSP_ERR_NOMEM); /* a petabyte of KV cache */
    CHECK(strstr(dsp_last_error(), "GiB") != NULL);
    fprintf(stderr, "  too little memory: %s\n", dsp_last_error());
    dsp_backend_params p = {.kind = DSP_BACKEND_CUDA, .gpu = 99};
    dsp_backend *b = NULL;
    CHECK_EQ_INT(dsp_backend_cuda_create(&p, &b), DSP_ERR_INVALID_ARG);
    CHECK(strstr(dsp_last_error(), "GPU 99") != NULL);
    p.gpu = 0, p.kv_type = DSP_Q8_0;
    CHECK_EQ_INT(dsp_backend_cuda_create(&p, &b), DSP_ERR_UNSUPPORTED);
    free(tq.data), free(tok.data);
}

int main(void) {
    dsp_backend_params p = {.kind = DSP_BACKEND_CUDA};
    dsp_status st = dsp_backend_cuda_create(&p, &g_gpu);
    if (st) {
        /* no GPU (or a build without CUDA): the error must say so plainly */
        const char *e = dsp_last_error();
        printf("SKIP: %s\n", e);
        bool clear = st == DSP_ERR_UNSUPPORTED && (strstr(e, "no CUDA device") || strstr(e, "without the CUDA backend"));
        if (!clear) fprintf(stderr, "unexpected error creating the CUDA backend: %s (%s)\n", e, dsp_status_to_string(st));
        return clear ? SKIP : 1;
    }
    fprintf(stderr, "%s\n", g_gpu->desc);
    dsp_backend_params cp = {.kind = DSP_BACKEND_CPU, .n_threads = 2, .f32_activations = true}; /* the GPU's f32 activations */
    CHECK(dsp_backend_cpu_create(&cp, &g_cpu) == DSP_OK);
    dsp_be_limits lim = {1024, 4096, 4, 1024, 128};
    CHECK(g_cpu->ops->reserve(g_cpu, &lim) == DSP_OK);
    CHECK(g_gpu->ops->reserve(g_gpu, &lim) == DSP_OK);
    CHECK(dsp_kv_seq_init(&g_empty, 16, 16, 0) == DSP_OK);
    DSP_RUN(test_matmul);
    DSP_RUN(test_matmul_fused);
    DSP_RUN(test_fusion);
    DSP_RUN(test_row_ops);
    DSP_RUN(test_embed);
    DSP_RUN(test_attention);
    DSP_RUN(test_rope_kv_fusion);
    DSP_RUN(test_attn_pack);
    DSP_RUN(test_logits);
    DSP_RUN(test_markov_greedy);
    DSP_RUN(test_graph_replay);
    DSP_RUN(test_bad_input);
    free(g_empty.blocks);
    dsp_backend_destroy(g_gpu);
    dsp_backend_destroy(g_cpu);
    return dsp_test_summary();
}
