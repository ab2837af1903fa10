/* cli/cmd_benchmark: `dspark benchmark`: the speed figures of one model on this machine.
 *
 * After a warm-up, each figure is the median over --repeat runs:
 *   prefill   one forward of a 512-token prompt (tok/s);
 *   decode    dsp_generate of 128 tokens after a short prompt, through the public API, with the
 *             --mode/--max-draft given (tok/s, and the speculation statistics; a speculative mode
 *             alternates with baseline runs: speedup in the same run, accepted-length histogram,
 *             drafts verified per round, drafter and verify time per round, the cost profile);
 *   forward decode  128 greedy steps of one-token forwards after a 128-token prefix, the argmax
 *             taken on the backend (what the engine's rounds cost without the engine);
 *   verify    one forward of 1+k tokens of one sequence after a 128-token prefix, k = 0..32, with
 *             logits for every row (what verifying k drafted tokens costs), relative to k = 0;
 *   batched   B independent sequences (128-token prefixes) decoding one token each per forward,
 *             B = 1, 2, 4, .. 32: total tok/s.
 * --backend cpu|cuda|auto chooses where everything runs (--gpu N; --kv-type f16|bf16|f32, for
 * the forward figures and the engine's).
 * Stamped with the CPU (and GPU), the kernel ISA in use, threads, git commit, peak RSS, the memory
 * bandwidth of a streaming read test (of device memory for CUDA) and the decode roofline: bytes one
 * decode step reads (weights + the K/V of the context) / bandwidth. --json prints one object
 * (schema "dspark.benchmark/1").
 *
 * The decode measurement is deliberately small: the speculative work extends it (e.g. --prompts
 * DIR for prompt sets); prefill and verify use the forward pass directly, so they measure the
 * kernels and nothing else. */
#include "cli/cli.h"

#include "backend/cpu/ops.h"
#include "core/threads.h"
#include "core/version.h"
#include "dspark.h"
#include "model/forward.h"
#include "model/model.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define PREFILL_TOKENS 512
#define DECODE_TOKENS 128
#define VERIFY_PREFIX 128
#define VERIFY_MAX_K 32
#define BATCH_MAX 32   /* sequences of the batched-decode figure */
#define BATCH_STEPS 32 /* decode steps per sequence in it */

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark benchmark -m MODEL [options]\n\n"
            "Measures prefill (512-token prompt), decode (128 tokens), the verify cost curve (one\n"
            "forward of 1+k tokens, k = 0..32) and batched decode (1..32 sequences) after a warm-up;\n"
            "reports medians over the repeats, peak\n"
            "RSS, memory bandwidth and the decode roofline.\n\n"
            "  -m, --model PATH     GGUF model file\n"
            "  -t, --threads N      threads (default: physical cores)\n"
            "  -r, --repeat R       measured runs per figure (default 5)\n"
            "      --mode M         speculation for the decode figure: baseline (default), auto, dspark, dflash,\n"
            "                       hybrid, lookup. Any mode but baseline is measured against baseline in the\n"
            "                       same run (interleaved repeats): speedup, accepted-length histogram, drafts\n"
            "                       verified per round, drafter and verify time per round\n"
            "      --draft-model D  a DFlash/DSpark drafter for the model (directory or repo id)\n"
            "      --draft-vocab N|auto  its draft vocabulary: N tokens, 0 = every token (default auto; generate -h)\n"
            "      --draft-quant Q  a float drafter's matrices on the CPU: q4_0 (default) or q8_0\n"
            "      --max-draft N|auto, --dspark-threshold T, --dspark-cumulative T, --hybrid-min N,\n"
            "      --draft-argmax, --lookup-min N, --lookup-max N   as for dspark generate (see its -h);\n"
            "                       with --max-draft auto the cost profile is measured first and printed\n"
            "      --trace-rounds F one JSON line per speculation round of the measured decode runs\n"
            "      --bw-mb N        buffer of the bandwidth test in MiB (default 1024, 4096 on a GPU; 0 = skip)\n"
            "      --backend B      where the forward runs: auto|cpu|cuda (default auto: the GPU when there is one, else the CPU)\n"
            "      --gpu N          CUDA device (default 0)\n"
            "      --kv-type T      K/V element type: f16 (default)|bf16|f32 (the CPU only)\n"
            "      --precision P    CPU matmuls: q8 (default, 8-bit activations) or f32\n"
            "      --no-verify      skip the verify curve\n"
            "      --no-prefill     skip the prefill figure\n"
            "      --no-batched     skip the batched-decode figure\n"
            "      --decode-tokens N  tokens of the engine's decode figure (default 128)\n"
            "      --json           print one JSON object\n"
            "  -h, --help           this help\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(const double *v, int n) {
    double t[64];
    if (n > 64) n = 64;
    memcpy(t, v, sizeof(double) * (size_t)n);
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* ---- machine stamp ---------------------------------------------------------------------------- */

static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *c = strchr(line, ':');
        if (!c) break;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        c[strcspn(c, "\n")] = 0;
        snprintf(out, cap, "%s", c);
        break;
    }
    fclose(f);
}

typedef struct bw_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_arg;

static void *bw_read(void *arg) {
    bw_arg *a = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->n; i += 4) s0 ^= a->p[i], s1 ^= a->p[i + 1], s2 ^= a->p[i + 2], s3 ^= a->p[i + 3];
    a->sum = s0 ^ s1 ^ s2 ^ s3;
    return NULL;
}

/* streaming read of a buffer much larger than the caches by n_threads threads; median GB/s of 5 */
static double mem_bandwidth(size_t mib, int n_threads) {
    size_t bytes = mib << 20, words = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0;
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9E3779B97F4A7C15ull; /* touch every page */
    double gbs[5];
    uint64_t sink = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t th[256];
        bw_arg args[256];
        int nt = n_threads < 256 ? n_threads : 256;
        size_t per = words / (size_t)nt;
        double t0 = dsp_cli_now_ms();
        for (int k = 0; k < nt; k++) {
            args[k] = (bw_arg){buf + per * (size_t)k, per, 0};
            if (k && pthread_create(&th[k], NULL, bw_read, &args[k])) args[k].n = 0;
        }
        bw_read(&args[0]);
        for (int k = 1; k < nt; k++)
            if (args[k].n) pthread_join(th[k], NULL);
        double ms = dsp_cli_now_ms() - t0;
        for (int k = 0; k < nt; k++) sink ^= args[k].sum;
        gbs[r] = (double)(per * (size_t)nt * 8) / (ms * 1e6);
    }
    free(buf);
    if (sink == 42) fputc(' ', stderr); /* keep the reads */
    return median(gbs, 5);
}

/* 1-minute load average, or -1 */
static double loadavg1(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec + ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* bytes of weights a one-token forward reads: every layer matrix and norm, the output matrix and
 * the final norm (one embedding row is negligible and ignored) */
static uint64_t weight_bytes_per_token(const dsp_model *m) {
    const dsp_weights *w = &m->w;
    uint64_t b = w->output->nbytes + w->out_norm->nbytes;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const dsp_layer_weights *L = &w->layers[l];
        const dsp_tensor *t[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv,
                                      L->q_norm, L->k_norm, L->ffn_norm, L->ffn_gate, L->ffn_up, L->ffn_down};
        for (size_t i = 0; i < sizeof t / sizeof *t; i++)
            if (t[i]) b += t[i]->nbytes;
    }
    return b;
}

/* bytes of K and V a one-token forward at position pos reads (the store's 2 or 4 bytes a value) */
static uint64_t kv_bytes_per_token(const dsp_model *m, uint32_t pos, int elem) {
    return 2ull * (uint64_t)m->hp.n_layer * (uint64_t)(m->hp.n_head_kv * m->hp.head_dim) * pos * (uint64_t)elem;
}

/* ---- measurements ----------------------------------------------------------------------------- */

typedef struct bench {
    dsp_fwd *f;
    int n_vocab;
    int32_t am[BATCH_MAX];
    int32_t tokens[PREFILL_TOKENS], seq0[PREFILL_TOKENS], pos[PREFILL_TOKENS], rows[PREFILL_TOKENS];
    float *logits; /* (VERIFY_MAX_K + 1, n_vocab) */
} bench;

/* one forward of n tokens at positions start.. of s (truncated to start first); wall ms, and the
 * process CPU ms in *cpu_ms (on a busy machine the CPU time, at 1 thread, is what the work costs) */
static double forward_ms(bench *b, dsp_kv_seq *s, uint32_t start, int n, int n_logits, double *cpu_ms) {
    dsp_kv_seq_truncate(dsp_fwd_kv(b->f), s, start);
    for (int i = 0; i < n; i++) b->pos[i] = (int32_t)start + i, b->seq0[i] = 0, b->rows[i] = n - n_logits + i;
    dsp_batch bt = {n, b->tokens + start, b->seq0, b->pos, n_logits, b->rows, 0, NULL};
    dsp_kv_seq *seqs[1] = {s};
    double t0 = dsp_cli_now_ms(), c0 = cpu_seconds();
    dsp_status st = dsp_fwd_run(b->f, seqs, 1, &bt, b->logits, NULL);
    double ms = dsp_cli_now_ms() - t0;
    if (cpu_ms) *cpu_ms = (cpu_seconds() - c0) * 1e3;
    return st ? -1 : ms;
}

/* argmax of logits row 0 on the backend when it can (no download), else on the host */
static int32_t next_token(bench *b, int row) {
    dsp_backend *be = dsp_fwd_backend(b->f);
    int32_t t = 0;
    if (be->ops->argmax) {
        if (be->ops->argmax(be, dsp_fwd_logits(b->f), row + 1, b->n_vocab, b->am) == DSP_OK) t = b->am[row];
    } else if (be->ops->buf_read(be, dsp_fwd_logits(b->f), (size_t)row * b->n_vocab, b->logits, (size_t)b->n_vocab) == DSP_OK) {
        for (int v = 1; v < b->n_vocab; v++)
            if (b->logits[v] > b->logits[t]) t = v;
    }
    return t;
}

/* greedy decode of DECODE_TOKENS one-token forwards after VERIFY_PREFIX tokens: tok/s */
static double forward_decode(bench *b, dsp_kv_seq *s) {
    forward_ms(b, s, 0, VERIFY_PREFIX, 1, NULL);
    int32_t tok = b->tokens[VERIFY_PREFIX - 1], seq = 0, row = 0;
    double t0 = dsp_cli_now_ms();
    for (int i = 0; i < DECODE_TOKENS; i++) {
        int32_t pos = VERIFY_PREFIX + i;
        dsp_batch bt = {1, &tok, &seq, &pos, 1, &row, 0, NULL};
        dsp_kv_seq *seqs[1] = {s};
        if (dsp_fwd_run(b->f, seqs, 1, &bt, NULL, NULL)) return -1;
        tok = next_token(b, 0);
    }
    return DECODE_TOKENS / ((dsp_cli_now_ms() - t0) / 1e3);
}

/* n_seq sequences with VERIFY_PREFIX-token prefixes decode BATCH_STEPS tokens together: total tok/s */
static double batched_decode(bench *b, int n_seq) {
    dsp_kv_seq s[BATCH_MAX], *seqs[BATCH_MAX];
    int32_t tok[BATCH_MAX], seq[BATCH_MAX], pos[BATCH_MAX], rows[BATCH_MAX];
    double tps = -1;
    int ok = 0;
    for (; ok < n_seq; ok++) {
        if (dsp_fwd_seq_init(b->f, &s[ok])) break;
        seqs[ok] = &s[ok];
        if (forward_ms(b, &s[ok], 0, VERIFY_PREFIX, 1, NULL) < 0) {
            ok++;
            break;
        }
    }
    if (ok == n_seq) {
        for (int i = 0; i < n_seq; i++) tok[i] = b->tokens[(VERIFY_PREFIX + i) % PREFILL_TOKENS], seq[i] = i, rows[i] = i;
        double t0 = dsp_cli_now_ms();
        int step = 0;
        for (; step < BATCH_STEPS; step++) {
            for (int i = 0; i < n_seq; i++) pos[i] = VERIFY_PREFIX + step;
            dsp_batch bt = {n_seq, tok, seq, pos, n_seq, rows, 0, NULL};
            if (dsp_fwd_run(b->f, seqs, n_seq, &bt, NULL, NULL)) break;
            dsp_backend *be = dsp_fwd_backend(b->f);
            if (be->ops->argmax ? be->ops->argmax(be, dsp_fwd_logits(b->f), n_seq, b->n_vocab, tok) != DSP_OK
                                : be->ops->buf_read(be, dsp_fwd_logits(b->f), 0, b->logits, (size_t)b->n_vocab) != DSP_OK)
                break;
        }
        if (step == BATCH_STEPS) tps = (double)n_seq * BATCH_STEPS / ((dsp_cli_now_ms() - t0) / 1e3);
    }
    for (int i = 0; i < ok; i++) dsp_kv_seq_free(dsp_fwd_kv(b->f), &s[i]);
    return tps;
}

typedef struct dec_result {
    double tok_s, tok_cpu_s; /* per wall second, per CPU second */
    dsp_gen_result res;
} dec_result;

static int decode_once(dsp_engine *c, const int32_t *prompt, size_t n_prompt, const dsp_gen_params *gp, dec_result *out) {
    const double c0 = cpu_seconds();
    dsp_status st = dsp_generate(c, prompt, n_prompt, gp, NULL, NULL, &out->res);
    const double cpu = cpu_seconds() - c0;
    if (st) return 1;
    out->tok_s = out->res.decode_ms > 0 ? (double)out->res.n_generated / (out->res.decode_ms / 1e3) : 0;
    /* the prefill of the short prompt is inside cpu; take its share out by wall-time proportion */
    const double wall = out->res.prefill_ms + out->res.decode_ms;
    out->tok_cpu_s = cpu > 0 && wall > 0 ? (double)out->res.n_generated / (cpu * out->res.decode_ms / wall) : 0;
    return 0;
}

static const char g_decode_prompt[] =
    "The history of the city of Rome begins with small settlements on the hills near the river Tiber. Over the centuries";

/* What a speculative decode run reports beyond tok/s: baseline in the same run, the statistics
 * summed over the measured runs, the drafter, the cost profile. */
typedef struct spec_report {
    bool spec;                 /* a mode other than baseline */
    double base[64], ratio[64];
    dsp_gen_result sum;
    dsp_spec_mode resolved;
    bool have_drafter, have_prof;
    dsp_drafter_info di;
    char dpath[512], dlayout[32], dkind[16];
    dsp_spec_profile prof;
} spec_report;

static void add_stats(dsp_gen_result *sum, const dsp_gen_result *r) {
    sum->n_rounds += r->n_rounds, sum->n_drafted += r->n_drafted, sum->n_accepted += r->n_accepted, sum->n_generated += r->n_generated;
    sum->n_block_rounds += r->n_block_rounds, sum->draft_ms += r->draft_ms, sum->verify_ms += r->verify_ms;
    for (int k = 0; k < DSP_MAX_DRAFT + 2; k++) sum->accept_hist[k] += r->accept_hist[k];
    for (int k = 0; k <= DSP_MAX_DRAFT; k++) sum->kept_hist[k] += r->kept_hist[k];
}

/* dsp_generate of DECODE_TOKENS after g_decode_prompt through the engine on bp's device, a warm-up
 * and `repeat` runs; a speculative mode alternates with baseline runs (drifts in load hit both) */
static int32_t g_draft_vocab = DSP_DRAFT_VOCAB_AUTO; /* --draft-vocab */
static dsp_draft_quant g_draft_quant = DSP_DRAFT_QUANT_DEFAULT; /* --draft-quant */

static int engine_decode(dsp_model *m, const dsp_backend_params *bp, const char *draft_model, FILE *trace, const dsp_gen_params *gp, int repeat,
                         double *dec, double *dec_cpu, dec_result *dr, spec_report *sr) {
    dsp_engine_params cp = dsp_engine_default_params();
    cp.device = bp->kind == DSP_BACKEND_CUDA ? DSP_DEVICE_CUDA : DSP_DEVICE_CPU;
    cp.gpu = bp->gpu;
    cp.n_threads = bp->n_threads;
    cp.max_batch = 1;
    cp.draft_model = draft_model;
    cp.draft_vocab = g_draft_vocab;
    cp.draft_quant = g_draft_quant;
    cp.precision = bp->f32_activations ? DSP_PRECISION_F32 : DSP_PRECISION_Q8;
    cp.kv_type = bp->kv_type == DSP_BF16 ? DSP_KV_BF16 : bp->kv_type == DSP_F16 ? DSP_KV_F16 : bp->kv_type == DSP_F32 ? DSP_KV_F32 : DSP_KV_DEFAULT;
    dsp_engine *c = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    if (dsp_engine_create(m, &cp, &c)) {
        dsp_cli_fail("benchmark", "%s", dsp_last_error());
        return 1;
    }
    size_t n_ids = 0;
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    if (dsp_cli_tokenize(tok, g_decode_prompt, strlen(g_decode_prompt), DSP_TOKENIZE_ADD_SPECIAL, &ids, &n_ids)) {
        dsp_cli_fail("benchmark", "tokenizing the decode prompt: %s", dsp_last_error());
        goto out;
    }
    sr->spec = gp->mode != DSP_SPEC_BASELINE;
    sr->resolved = dsp_engine_resolve_mode(c, gp->mode);
    sr->have_prof = gp->max_draft == DSP_DRAFT_AUTO && !dsp_engine_profile(c, &sr->prof); /* before the timed runs */
    if ((sr->have_drafter = dsp_engine_drafter_info(c, &sr->di))) { /* its strings live in the engine */
        snprintf(sr->dpath, sizeof sr->dpath, "%s", sr->di.path), snprintf(sr->dlayout, sizeof sr->dlayout, "%s", sr->di.layout);
        snprintf(sr->dkind, sizeof sr->dkind, "%s", sr->di.kind);
        sr->di.path = sr->dpath, sr->di.layout = sr->dlayout, sr->di.kind = sr->dkind;
    }
    dsp_gen_params g = *gp, gb = *gp;
    gb.mode = DSP_SPEC_BASELINE;
    dec_result br;
    for (int r = -1; r < repeat; r++) { /* r = -1: warm-up */
        if (r == 0 && trace) g.trace = dsp_cli_trace_round, g.trace_user = trace;
        if ((sr->spec && decode_once(c, ids, n_ids, &gb, &br)) || decode_once(c, ids, n_ids, &g, dr)) {
            dsp_cli_fail("benchmark", "decode: %s", dsp_last_error());
            goto out;
        }
        if (r < 0) continue;
        dec[r] = dr->tok_s, dec_cpu[r] = dr->tok_cpu_s;
        sr->base[r] = sr->spec ? br.tok_s : dr->tok_s;
        sr->ratio[r] = sr->base[r] > 0 ? dec[r] / sr->base[r] : 0;
        add_stats(&sr->sum, &dr->res);
    }
    rc = 0;
out:
    free(ids);
    dsp_engine_destroy(c);
    return rc;
}

static void spec_json(const spec_report *sr, const dsp_gen_params *gp, int repeat) {
    if (sr->spec) {
        printf(", \"baseline_tok_s\": %.2f, \"speedup\": %.3f, ", median(sr->base, repeat), median(sr->ratio, repeat));
        dsp_cli_print_spec_json(stdout, gp, &sr->sum);
        if (sr->have_drafter) {
            printf(", \"drafter\": {\"path\": \"");
            for (const char *p = sr->di.path; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
            printf("\", \"kind\": \"%s\", \"layout\": \"%s\", \"block\": %d, \"draft_vocab\": %d}", sr->di.kind, sr->di.layout, sr->di.block,
                   sr->di.draft_vocab);
        }
    }
    if (sr->have_prof) {
        const dsp_spec_profile *p = &sr->prof;
        printf(", \"profile\": {\"rows\": [");
        for (int i = 0; i < p->n; i++) printf("%s%d", i ? ", " : "", p->rows[i]);
        printf("], \"rel\": [");
        for (int i = 0; i < p->n; i++) printf("%s%.3f", i ? ", " : "", (double)p->rel[i]);
        printf("], \"one_row_ms\": %.3f, \"ctx_tokens\": %u, \"ctx_rel_per_key\": %.3g, \"draft_rel\": %.4f, \"draft_rel_per_req\": %.4f, "
               "\"draft_ctx_rel\": %.4f, \"cached\": %s}",
               p->one_row_ms, p->ctx_tokens, (double)p->ctx_rel_per_key, (double)p->draft_rel, (double)p->draft_rel_per_req, (double)p->draft_ctx_rel,
               p->cached ? "true" : "false");
    }
}

static void spec_text(const spec_report *sr, int repeat) {
    const dsp_gen_result *s = &sr->sum;
    if (sr->spec) {
        size_t emitted = 0;
        for (int k = 0; k < DSP_MAX_DRAFT + 2; k++) emitted += (size_t)k * s->accept_hist[k];
        printf("spec      baseline %.1f tok/s in the same run: speedup %.2fx (median of per-repeat ratios)\n", median(sr->base, repeat),
               median(sr->ratio, repeat));
        if (sr->have_drafter)
            printf("          drafter %s (%s %s, block %d, draft vocabulary %d)\n", sr->di.path, sr->di.layout, sr->di.kind, sr->di.block,
                   sr->di.draft_vocab);
        printf("          %.2f tokens per round, %zu/%zu drafts accepted; drafter %.2f ms per drafted round, verify %.2f ms per round\n",
               s->n_rounds ? (double)emitted / (double)s->n_rounds : 0, s->n_accepted, s->n_drafted,
               s->n_block_rounds ? s->draft_ms / (double)s->n_block_rounds : 0, s->n_rounds ? s->verify_ms / (double)s->n_rounds : 0);
        printf("          rounds by tokens committed:");
        for (int k = 1; k < DSP_MAX_DRAFT + 2; k++)
            if (s->accept_hist[k]) printf(" %d:%zu", k, s->accept_hist[k]);
        printf("\n          rounds by drafts verified:");
        for (int k = 0; k <= DSP_MAX_DRAFT; k++)
            if (s->kept_hist[k]) printf(" %d:%zu", k, s->kept_hist[k]);
        printf("\n");
    }
    if (sr->have_prof) {
        const dsp_spec_profile *p = &sr->prof;
        printf("profile   c(k) (1+k-row forward / 1-row, %.2f ms at %u tokens of context):", p->one_row_ms, p->ctx_tokens);
        for (int i = 0; i < p->n; i++) printf(" %d:%.2f", p->rows[i] - 1, (double)p->rel[i]);
        printf("\n          drafter %.3f per block (+%.3f per further request), its context step %.3f per row%s\n", (double)p->draft_rel,
               (double)p->draft_rel_per_req, (double)p->draft_ctx_rel, p->cached ? ", from the cache" : "");
        if (p->draft_rel > 0) {
            /* a drafter round: one block + the context step of the row it commits (one token: the least) */
            double tgt = p->one_row_ms * (1.0 - p->draft_ctx_rel), drf = p->one_row_ms * (p->draft_rel + p->draft_ctx_rel);
            printf("          drafter per round %.2f ms = %.1f%% of a target decode step (%.2f ms)\n", drf, 100 * drf / tgt, tgt);
        }
    }
}

int dsp_cmd_benchmark(int argc, char **argv) {
    const char *model = NULL, *draft = NULL, *trace_path = NULL;
    bool json = false, no_verify = false, no_prefill = false, no_batched = false;
    int threads = 0, repeat = 5, bw_mb = -1, decode_tokens = DECODE_TOKENS;
    dsp_backend_params bp = {.kind = DSP_BACKEND_AUTO};
    dsp_precision precision = DSP_PRECISION_Q8;
    dsp_gen_params gp = dsp_gen_default_params();
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc, handled;
        int prc = dsp_cli_parse_spec_opt(argc, argv, &i, &gp, &handled);
        if (prc) return prc;
        if (handled) continue;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) model = argv[++i];
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has_val) threads = atoi(argv[++i]);
        else if ((!strcmp(a, "-r") || !strcmp(a, "--repeat")) && has_val) repeat = atoi(argv[++i]);
        else if (!strcmp(a, "--draft-model") && has_val) draft = argv[++i];
        else if (!strcmp(a, "--draft-vocab") && has_val) {
            if (!dsp_cli_parse_draft_vocab(argv[++i], &g_draft_vocab)) return 2;
        }
        else if (!strcmp(a, "--draft-quant") && has_val) {
            if (!dsp_cli_parse_draft_quant(argv[++i], &g_draft_quant)) return 2;
        }
        else if (!strcmp(a, "--trace-rounds") && has_val) trace_path = argv[++i];
        else if (!strcmp(a, "--bw-mb") && has_val) bw_mb = atoi(argv[++i]);
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--gpu") && has_val) bp.gpu = atoi(argv[++i]);
        else if (!strcmp(a, "--no-verify")) no_verify = true;
        else if (!strcmp(a, "--no-prefill")) no_prefill = true;
        else if (!strcmp(a, "--no-batched")) no_batched = true;
        else if (!strcmp(a, "--decode-tokens") && has_val) decode_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--precision") && has_val) {
            const char *v = argv[++i];
            if (!strcmp(v, "q8")) precision = DSP_PRECISION_Q8;
            else if (!strcmp(v, "f32")) precision = DSP_PRECISION_F32;
            else {
                fprintf(stderr, "dspark benchmark: --precision: '%s' is not q8 or f32\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--backend") && has_val) {
            const char *v = argv[++i];
            if (!strcmp(v, "auto")) bp.kind = DSP_BACKEND_AUTO;
            else if (!strcmp(v, "cpu")) bp.kind = DSP_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) bp.kind = DSP_BACKEND_CUDA;
            else {
                fprintf(stderr, "dspark benchmark: --backend: '%s' is not auto, cpu or cuda\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--kv-type") && has_val) {
            const char *v = argv[++i];
            if (!strcmp(v, "f16")) bp.kv_type = DSP_F16;
            else if (!strcmp(v, "bf16")) bp.kv_type = DSP_BF16;
            else if (!strcmp(v, "f32")) bp.kv_type = DSP_F32;
            else {
                fprintf(stderr, "dspark benchmark: --kv-type: '%s' is not f16, bf16 or f32\n", v);
                return 2;
            }
        }
        else {
            fprintf(stderr, "dspark benchmark: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    if (threads < 0 || threads > 1024 || repeat < 1 || repeat > 64 || bw_mb < -1 || bw_mb > 65536 || decode_tokens < 1 || decode_tokens > 4096 ||
        bp.gpu < 0) {
        fprintf(stderr, "dspark benchmark: --threads 0..1024, --repeat 1..64, --bw-mb 0..65536, --decode-tokens 1..4096, --gpu >= 0\n");
        return 2;
    }
    if (threads == 0) threads = dsp_physical_cores();
    bp.n_threads = threads;

    dsp_model_params mp = dsp_model_default_params();
    dsp_model *m = NULL;
    bench *b = NULL;
    dsp_backend *be = NULL;
    FILE *trace = NULL;
    spec_report *sr = calloc(1, sizeof *sr);
    int rc = 1;
    if (!sr) goto out;
    if (trace_path && !(trace = fopen(trace_path, "w"))) {
        dsp_cli_fail("benchmark", "--trace-rounds %s: cannot open", trace_path);
        goto out;
    }
    if (dsp_model_load(model, &mp, &m)) {
        dsp_cli_fail("benchmark", "%s", dsp_last_error());
        goto out;
    }
    if (!m->has_weights) {
        dsp_cli_fail("benchmark", "%s has no weights", model);
        goto out;
    }
    if (!json) fprintf(stderr, "dspark benchmark: %s, %d threads, %d repeats\n", model, threads, repeat);
    /* how busy the machine is: the load average before we start, and the share of `threads` CPUs
     * this process got while measuring (well below 1 = other processes took the cores) */
    const double load0 = loadavg1(), cpu0 = cpu_seconds(), wall0 = dsp_cli_now_ms();

    bp.progress = !json;
    bp.f32_activations = precision == DSP_PRECISION_F32;
    if (!bp.kv_type) bp.kv_type = DSP_F16; /* the engine's default K/V type, on either backend */
    if (dsp_backend_create(&bp, &be)) {
        dsp_cli_fail("benchmark", "%s", dsp_last_error());
        goto out;
    }
    const bool gpu = be->kind == DSP_BACKEND_CUDA;
    if (!json) fprintf(stderr, "dspark benchmark: forward on %s\n", be->desc);

    /* decode, through the public API (on the CPU: the engine does not take a device yet) */
    double dec[64] = {0}, dec_cpu[64] = {0};
    dec_result dr;
    memset(&dr, 0, sizeof dr);
    gp.max_tokens = decode_tokens;
    gp.ignore_eos = true;
    if (engine_decode(m, &bp, draft, trace, &gp, repeat, dec, dec_cpu, &dr, sr)) goto out;

    /* prefill and the verify curve, on the forward pass itself */
    b = calloc(1, sizeof *b);
    if (!b) goto out;
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.backend = be;
    fp.n_threads = threads;
    fp.f32_activations = bp.f32_activations;
    fp.max_batch_tokens = PREFILL_TOKENS;
    fp.max_logits = VERIFY_MAX_K + 1;
    fp.n_ctx = (uint32_t)(m->hp.n_ctx_train < 1024 ? m->hp.n_ctx_train : 1024);
    fp.kv_tokens = fp.n_ctx * (BATCH_MAX + 1);
    if (fp.n_ctx < PREFILL_TOKENS + 1) {
        dsp_cli_fail("benchmark", "the model's context (%d) is shorter than the %d-token prefill", m->hp.n_ctx_train, PREFILL_TOKENS);
        goto out;
    }
    if (dsp_fwd_create(m, &fp, &b->f)) {
        dsp_cli_fail("benchmark", "%s", dsp_last_error());
        goto out;
    }
    b->n_vocab = m->hp.n_vocab;
    b->logits = malloc(sizeof(float) * (size_t)b->n_vocab * (VERIFY_MAX_K + 1));
    if (!b->logits) goto out;
    uint64_t lcg = 12345;
    for (int i = 0; i < PREFILL_TOKENS; i++) {
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        b->tokens[i] = (int32_t)((lcg >> 33) % (uint64_t)b->n_vocab);
    }
    dsp_kv_seq s;
    if (dsp_fwd_seq_init(b->f, &s)) goto out;
    double pre[64] = {0}, pre_cpu[64] = {0}, ver[VERIFY_MAX_K + 1][64] = {{0}}, ver_cpu[VERIFY_MAX_K + 1][64] = {{0}}, cms;
    if (!no_prefill) forward_ms(b, &s, 0, PREFILL_TOKENS, 1, NULL); /* warm-up */
    for (int r = 0; r < repeat && !no_prefill; r++) {
        pre[r] = PREFILL_TOKENS / (forward_ms(b, &s, 0, PREFILL_TOKENS, 1, &cms) / 1e3);
        pre_cpu[r] = PREFILL_TOKENS / (cms / 1e3);
    }
    forward_ms(b, &s, 0, VERIFY_PREFIX, 1, NULL); /* the prefix the verify curve and the forward decode run after */
    if (!no_verify) {
        /* each k's forwards back to back after two unmeasured ones, as a round loop runs them (and
         * as the engine's cost profile measures, draft.c): interleaved with the other k, a 1-row
         * forward right after a 33-row one took 4.6 ms on the 2-vCPU Xeon against 3.0 ms in the
         * decode loop, which made every 1+k look 1.5x cheaper than it is in a round */
        for (int k = 0; k <= VERIFY_MAX_K; k++) {
            for (int w = 0; w < 2; w++) forward_ms(b, &s, VERIFY_PREFIX, 1 + k, 1 + k, NULL);
            for (int r = 0; r < repeat; r++) ver[k][r] = forward_ms(b, &s, VERIFY_PREFIX, 1 + k, 1 + k, &ver_cpu[k][r]);
        }
    }
    double fdec[64];
    forward_decode(b, &s); /* warm-up */
    for (int r = 0; r < repeat; r++) fdec[r] = forward_decode(b, &s);
    dsp_kv_seq_free(dsp_fwd_kv(b->f), &s);
    int n_batch = 0, batch_seqs[8];
    double batched[8][64];
    for (int B = 1; !no_batched && B <= BATCH_MAX; B *= 2, n_batch++) {
        batch_seqs[n_batch] = B;
        batched_decode(b, B); /* warm-up (graph capture on a GPU) */
        for (int r = 0; r < repeat; r++) batched[n_batch][r] = batched_decode(b, B);
    }

    const double cpu_share = (cpu_seconds() - cpu0) / ((dsp_cli_now_ms() - wall0) / 1e3 * threads);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double peak_rss_mb = (double)ru.ru_maxrss / 1024.0; /* before the bandwidth test's buffer */
    if (bw_mb < 0) bw_mb = gpu ? 4096 : 1024;
    double bw = 0;
    if (bw_mb) bw = gpu && be->ops->read_bandwidth ? be->ops->read_bandwidth(be, (size_t)bw_mb << 20) : mem_bandwidth((size_t)bw_mb, threads);
    /* a decode step at the middle of the forward-decode run reads the weights and that much K/V */
    uint64_t wbytes = weight_bytes_per_token(m), kvbytes = kv_bytes_per_token(m, VERIFY_PREFIX + DECODE_TOKENS / 2,
                                                                    bp.kv_type == DSP_F32 ? 4 : 2);
    double roof = bw > 0 ? bw * 1e9 / (double)(wbytes + kvbytes) : 0;

    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    const char *isa = dsp_cpu_ops_best()->name;
    double dec_med = median(dec, repeat), pre_med = median(pre, repeat), ver_med[VERIFY_MAX_K + 1];
    double ver_cpu_med[VERIFY_MAX_K + 1], pre_cpu_med = median(pre_cpu, repeat), dec_cpu_med = median(dec_cpu, repeat);
    for (int k = 0; k <= VERIFY_MAX_K; k++) ver_med[k] = median(ver[k], repeat), ver_cpu_med[k] = median(ver_cpu[k], repeat);
    const double fdec_med = median(fdec, repeat);
    if (json) {
        printf("{\"schema\": \"dspark.benchmark/1\", \"model\": \"");
        for (const char *p = model; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
        printf("\", \"machine\": {\"cpu\": \"%s\", \"isa\": \"%s\", \"isa_supported\": \"%s\", \"threads\": %d, \"git_commit\": \"%s\", "
               "\"precision\": \"%s\", \"backend\": \"%s\", \"mem_bw_gb_s\": %.2f, \"mem_bw_of\": \"%s\", \"loadavg_1m\": %.2f, \"cpu_share\": %.2f}, \"repeat\": %d",
               cpu, isa, dsp_cpu_isa_supported(), threads, dsp_git_commit, dsp_precision_to_string(precision), be->desc, bw, gpu ? "device" : "host", load0, cpu_share, repeat);
        printf(", \"prefill\": {\"n_tokens\": %d, \"tok_s\": %.2f, \"tok_per_cpu_s\": %.2f, \"runs\": [", PREFILL_TOKENS, pre_med, pre_cpu_med);
        for (int r = 0; r < repeat; r++) printf("%s%.2f", r ? ", " : "", pre[r]);
        char md[16];
        if (gp.max_draft == DSP_DRAFT_AUTO) snprintf(md, sizeof md, "\"auto\"");
        else snprintf(md, sizeof md, "%d", gp.max_draft);
        printf("]}, \"decode\": {\"n_tokens\": %d, \"via\": \"%s\", \"mode\": \"%s\", \"max_draft\": %s, \"tok_s\": %.2f, \"tok_per_cpu_s\": %.2f, "
               "\"runs\": [", decode_tokens, "engine", dsp_spec_mode_to_string(sr->resolved), md, dec_med, dec_cpu_med);
        for (int r = 0; r < repeat; r++) printf("%s%.2f", r ? ", " : "", dec[r]);
        printf("], \"rounds\": %zu, \"drafted\": %zu, \"accepted\": %zu", dr.res.n_rounds, dr.res.n_drafted, dr.res.n_accepted);
        spec_json(sr, &gp, repeat);
        printf("}");
        printf(", \"forward_decode\": {\"prefix\": %d, \"n_tokens\": %d, \"tok_s\": %.2f, \"runs\": [", VERIFY_PREFIX, DECODE_TOKENS, fdec_med);
        for (int r = 0; r < repeat; r++) printf("%s%.2f", r ? ", " : "", fdec[r]);
        printf("]}, \"batched\": {\"prefix\": %d, \"steps\": %d, \"seqs\": [", VERIFY_PREFIX, BATCH_STEPS);
        for (int i = 0; i < n_batch; i++) printf("%s%d", i ? ", " : "", batch_seqs[i]);
        printf("], \"tok_s\": [");
        for (int i = 0; i < n_batch; i++) printf("%s%.2f", i ? ", " : "", median(batched[i], repeat));
        printf("]}");
        if (no_verify) printf(", \"verify\": null");
        else {
        printf(", \"verify\": {\"prefix\": %d, \"ms\": [", VERIFY_PREFIX);
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_med[k]);
        printf("], \"rel\": [");
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_med[k] / ver_med[0]);
        printf("], \"cpu_ms\": [");
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_cpu_med[k]);
        printf("], \"cpu_rel\": [");
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_cpu_med[k] / ver_cpu_med[0]);
        printf("]}");
        }
        printf(", \"roofline\": {\"weight_bytes_per_token\": %llu, \"kv_bytes_per_token\": %llu, \"read_bw_gb_s\": %.2f, \"tok_s\": %.2f, "
               "\"decode_fraction\": %.3f, \"forward_decode_fraction\": %.3f}, \"peak_rss_mb\": %.1f}\n",
               (unsigned long long)wbytes, (unsigned long long)kvbytes, bw, roof, roof > 0 ? dec_med / roof : 0,
               roof > 0 ? fdec_med / roof : 0, peak_rss_mb);
    } else {
        printf("machine   %s, kernels %s (supported: %s), %s activations, %d threads, commit %s\n", cpu, isa, dsp_cpu_isa_supported(),
               dsp_precision_to_string(precision), threads, dsp_git_commit);
        printf("load      load average %.2f before; this process got %.0f%% of %d CPUs while measuring\n", load0, 100 * cpu_share, threads);
        printf("backend   %s\n", be->desc);
        printf("memory    %.2f GB/s streaming read (%s); weights %.1f MB + K/V %.1f MB per token -> roofline %.1f tok/s\n", bw,
               gpu ? "device" : "host", (double)wbytes / 1e6, (double)kvbytes / 1e6, roof);
        printf("prefill   %.1f tok/s (%d tokens, median of %d); %.1f tok per CPU second\n", pre_med, PREFILL_TOKENS, repeat, pre_cpu_med);
        printf("decode    %.1f tok/s (%d tokens, mode %s, median of %d) = %.0f%% of the roofline; %.1f tok per CPU second\n", dec_med,
               decode_tokens, dsp_spec_mode_to_string(sr->resolved), repeat, roof > 0 ? 100 * dec_med / roof : 0, dec_cpu_med);
        spec_text(sr, repeat);
        if (!no_verify) {
            printf("verify    1+k tokens after %d, time relative to k = 0 (%.2f ms):\n         ", VERIFY_PREFIX, ver_med[0]);
            for (int k = 0; k <= VERIFY_MAX_K; k++) printf(" k=%d %.2f", k, ver_med[k] / ver_med[0]);
            printf("\n          in CPU time (%.2f ms):\n         ", ver_cpu_med[0]);
            for (int k = 0; k <= VERIFY_MAX_K; k++) printf(" k=%d %.2f", k, ver_cpu_med[k] / ver_cpu_med[0]);
            printf("\n");
        }
        printf("forward   decode %.1f tok/s (%d one-token forwards after %d, argmax on the backend) = %.0f%% of the roofline\n", fdec_med,
               DECODE_TOKENS, VERIFY_PREFIX, roof > 0 ? 100 * fdec_med / roof : 0);
        printf("batched   total tok/s:");
        for (int i = 0; i < n_batch; i++) printf(" B=%d %.1f", batch_seqs[i], median(batched[i], repeat));
        printf("\npeak RSS  %.1f MB\n", peak_rss_mb);
    }
    rc = 0;
out:
    if (b) {
        dsp_fwd_destroy(b->f);
        free(b->logits);
        free(b);
    }
    if (trace) fclose(trace);
    free(sr);
    dsp_backend_destroy(be);
    dsp_model_destroy(m);
    return rc;
}
