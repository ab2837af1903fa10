/* The forward on the GPU op by op against the CPU backend (tests/backend_diff.h): where a whole
 * forward disagrees with the CPU, this names the first op that does.
 *
 *   1. the embedding table, every row, through embed on both backends: bit-exact (the upload and
 *      repacking of the largest tensor, all of it);
 *   2. a scenario of ragged forwards (a 37-token prefill; a decode row next to a second sequence's
 *      9-token prefill; a 1+4 verify block with logits for every row; two decode rows) three times:
 *        each    every op compared alone (the CPU's output copied into the GPU's buffer after each
 *                op, so every op starts from the same inputs; no fusion on the GPU);
 *        fused   compared after embed, matmul and attention only (the GPU fuses add -> rmsnorm ->
 *                matmul, swiglu -> matmul, norm_rope q, k + kv_write), resynced there;
 *        free    no resync: the GPU's own forward, errors compound as they would in use.
 * The CPU reference runs with f32 activations (dsp_precision F32), the arithmetic the GPU does.
 * Tolerances (NMSE against the CPU, as tests/test_cuda_ops.c argues): 1e-6 per op (matmuls land near
 * 1e-11, elementwise ops near 1e-14), attention 1e-5 with F16 K/V and 1e-4 with BF16; in the free run
 * everything within 1e-5 (F16) or 1e-4 (BF16), as the forward test's logits.
 *
 * DSP_TEST_BACKEND=cuda (DSP_TEST_KV_TYPE=bf16 for BF16 K/V) runs it on the GPU; DSP_DIFF_SELFTEST=1
 * against a second CPU backend (every difference must then be 0: checks the tool). Otherwise it
 * skips (77). DSP_TEST_MODEL picks the model; DSP_DIFF_CTX / DSP_DIFF_BATCH the forward's context
 * and batch limits (default 256 / 64; the engine uses 4096 / 512). */
/* ctest-label: gpu */
#include "dsp_test.h"

#include "backend_diff.h"
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77

static dsp_model *g_m;
static dsp_backend *g_ref, *g_dut;
static bool g_bf16;

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

/* 1. every row of the embedding table, bit for bit */
static void test_embed_table(void) {
    const dsp_tensor *t = g_m->w.tok_embd;
    const int E = (int)t->ne[0], V = (int)t->ne[1], C = 4096;
    dsp_bweight *wr, *wd;
    CHECK_MSG(g_ref->ops->weight_create(g_ref, t, &wr) == DSP_OK, "%s", dsp_last_error());
    CHECK_MSG(g_dut->ops->weight_create(g_dut, t, &wd) == DSP_OK, "%s", dsp_last_error());
    dsp_be_limits lim = {C, E, 1, 16, 2};
    CHECK(g_ref->ops->reserve(g_ref, &lim) == DSP_OK && g_dut->ops->reserve(g_dut, &lim) == DSP_OK);
    dsp_buf *xr, *xd;
    CHECK(g_ref->ops->buf_create(g_ref, (size_t)C * E, &xr) == DSP_OK && g_dut->ops->buf_create(g_dut, (size_t)C * E, &xd) == DSP_OK);
    int32_t *tok = malloc(sizeof(int32_t) * C * 4), *pos = tok + C, *seq = pos + C, *nk = seq + C;
    float *a = malloc(sizeof(float) * (size_t)C * E), *g = malloc(sizeof(float) * (size_t)C * E);
    dsp_kv_seq empty;
    CHECK(dsp_kv_seq_init(&empty, 16, 16, 0) == DSP_OK);
    const dsp_kv_seq *sp[1] = {&empty};
    long bad_rows = 0, first_bad = -1;
    for (int r0 = 0; r0 < V; r0 += C) {
        const int n = V - r0 < C ? V - r0 : C;
        for (int i = 0; i < n; i++) tok[i] = r0 + i, pos[i] = 0, seq[i] = 0, nk[i] = 1;
        dsp_be_batch b = {n, tok, pos, seq, nk, 1, sp};
        for (int k = 0; k < 2; k++) {
            dsp_backend *be = k ? g_dut : g_ref;
            CHECK(be->ops->begin(be, &b) == DSP_OK);
            be->ops->embed(be, k ? xd : xr, k ? wd : wr, E);
            CHECK_MSG(be->ops->end(be) == DSP_OK, "%s", dsp_last_error());
            CHECK(be->ops->buf_read(be, k ? xd : xr, 0, k ? g : a, (size_t)n * E) == DSP_OK);
        }
        for (int i = 0; i < n; i++)
            if (memcmp(a + (size_t)i * E, g + (size_t)i * E, sizeof(float) * (size_t)E)) {
                if (first_bad < 0) first_bad = r0 + i;
                bad_rows++;
            }
    }
    fprintf(stderr, "  embedding table %s (%d x %d): %ld rows differ%s", dsp_dtype_name(t->type), V, E, bad_rows, bad_rows ? "" : "\n");
    if (bad_rows) fprintf(stderr, ", the first is row %ld\n", first_bad);
    CHECK_EQ_INT((int)bad_rows, 0);
    free(tok), free(a), free(g), free(empty.blocks);
    g_ref->ops->buf_destroy(g_ref, xr), g_dut->ops->buf_destroy(g_dut, xd);
    g_ref->ops->weight_destroy(g_ref, wr), g_dut->ops->weight_destroy(g_dut, wd);
}

/* one forward of the scenario: rows (seq, token) appended at each sequence's end; logits for `nl`
 * rows (the last ones) */
static void fwd(dsp_fwd *f, dsp_kv_seq **seqs, int n, const int32_t *sq, int nl, int V, float *lg) {
    int32_t tok[64], pos[64], seq[64], rows[64], next[2] = {(int32_t)seqs[0]->n_tokens, (int32_t)seqs[1]->n_tokens};
    for (int i = 0; i < n; i++) {
        seq[i] = sq[i], pos[i] = next[sq[i]]++;
        tok[i] = (int32_t)(((int64_t)pos[i] * 7919 + 1234567 * (sq[i] + 1)) % V); /* ids all over the vocabulary */
    }
    for (int i = 0; i < nl; i++) rows[i] = n - nl + i;
    dsp_batch b = {n, tok, seq, pos, nl, rows, 0, NULL};
    dsp_status st = dsp_fwd_run(f, seqs, 2, &b, lg, NULL);
    CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
}

/* 2. the scenario through a dual backend; true if no op was over its tolerance */
static bool run_mode(const char *name, diff_sync sync, bool resync) {
    const double tol = resync ? 1e-6 : g_bf16 ? 1e-4 : 1e-5, tol_attn = g_bf16 ? 1e-4 : resync ? 1e-5 : 1e-5;
    diff_be *x = diff_create(g_ref, g_dut, sync, resync, tol, tol_attn);
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.backend = &x->base;
    fp.n_ctx = (uint32_t)env_int("DSP_DIFF_CTX", 256);
    fp.max_batch_tokens = env_int("DSP_DIFF_BATCH", 64);
    dsp_fwd *f = NULL;
    dsp_status st = dsp_fwd_create(g_m, &fp, &f);
    CHECK_MSG(st == DSP_OK, "%s", dsp_last_error());
    if (st) {
        free(x);
        return false;
    }
    const int V = dsp_fwd_n_vocab(f);
    float *lg = malloc(sizeof(float) * (size_t)V * 8);
    dsp_kv_seq a, b;
    dsp_fwd_seq_init(f, &a), dsp_fwd_seq_init(f, &b);
    dsp_kv_seq *seqs[2] = {&a, &b};
    int32_t sq[64] = {0};
    fwd(f, seqs, 37, sq, 1, V, lg); /* prefill of A */
    sq[0] = 0;
    for (int i = 1; i < 10; i++) sq[i] = 1;
    fwd(f, seqs, 10, sq, 2, V, lg); /* decode A + prefill B: logits for B's last two */
    memset(sq, 0, sizeof sq);
    fwd(f, seqs, 5, sq, 5, V, lg); /* a 1+4 verify block of A */
    sq[0] = 1, sq[1] = 0;
    fwd(f, seqs, 2, sq, 2, V, lg); /* two decode rows */
    dsp_kv_seq_free(dsp_fwd_kv(f), &a), dsp_kv_seq_free(dsp_fwd_kv(f), &b);
    dsp_fwd_destroy(f);
    fprintf(stderr, "  %-6s %ld ranges compared, %ld over tolerance (%.0e, attention %.0e)\n", name, x->compared, x->bad, tol, tol_attn);
    if (x->bad) fprintf(stderr, "         FIRST: %s\n", x->first_bad);
    for (int i = 0; i < x->n_stats; i++)
        fprintf(stderr, "         %-52s max nmse %9.3g over %d\n", x->stats[i].key, x->stats[i].max_nmse, x->stats[i].count);
    const bool ok = x->bad == 0 && x->compared > 0 && !x->err;
    CHECK_MSG(ok, "%s: %ld of %ld op outputs differ from the CPU backend", name, x->bad, x->compared);
    free(lg);
    free(x);
    return ok;
}

static void test_ops(void) { run_mode("each", DIFF_EACH, true); }
static void test_fused(void) { run_mode("fused", DIFF_FUSED, true); }
static void test_free(void) { run_mode("free", DIFF_FUSED, false); }

int main(void) {
    const bool self = env_int("DSP_DIFF_SELFTEST", 0) == 1;
    if (!dsp_test_wants_cuda() && !self) {
        printf("SKIP: set DSP_TEST_BACKEND=cuda (or DSP_DIFF_SELFTEST=1 for CPU against CPU)\n");
        return SKIP;
    }
    const char *kvt = getenv("DSP_TEST_KV_TYPE");
    g_bf16 = kvt && !strcmp(kvt, "bf16");
    dsp_backend_params rp = {.kind = DSP_BACKEND_CPU, .n_threads = env_int("DSP_DIFF_THREADS", 0), .f32_activations = true};
    dsp_backend_params dp = {.kind = self ? DSP_BACKEND_CPU : DSP_BACKEND_CUDA, .n_threads = rp.n_threads, .f32_activations = true,
                             .kv_type = g_bf16 ? DSP_BF16 : 0};
    if ((self ? dsp_backend_cpu_create(&dp, &g_dut) : dsp_backend_cuda_create(&dp, &g_dut)) != DSP_OK) {
        printf("SKIP: %s\n", dsp_last_error());
        return SKIP;
    }
    CHECK(dsp_backend_cpu_create(&rp, &g_ref) == DSP_OK);
    bool is_default;
    if (!(g_m = dsp_test_load_model(&is_default))) {
        dsp_backend_destroy(g_dut), dsp_backend_destroy(g_ref);
        return getenv("DSP_TEST_MODEL") ? 1 : SKIP;
    }
    fprintf(stderr, "%s against %s, K/V %s\n", g_dut->desc, g_ref->desc, g_bf16 ? "bf16" : "default");
    DSP_RUN(test_embed_table);
    DSP_RUN(test_ops);
    DSP_RUN(test_fused);
    DSP_RUN(test_free);
    dsp_model_destroy(g_m);
    dsp_backend_destroy(g_dut), dsp_backend_destroy(g_ref);
    return dsp_test_summary();
}
