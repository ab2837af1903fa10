/* cli/cmd_benchmark: `dspark benchmark`: the speed figures of one model on this machine.
 *
 * After a warm-up, each figure is the median over --repeat runs:
 *   prefill   one forward of a 512-token prompt (tok/s);
 *   decode    dsp_generate of 128 tokens after a short prompt, through the public API, with the
 *             --mode/--max-draft given (tok/s, and the speculation statistics);
 *   verify    one forward of 1+k tokens of one sequence after a 128-token prefix, k = 0..16, with
 *             logits for every row (what verifying k drafted tokens costs), relative to k = 0.
 * Stamped with the CPU, the kernel ISA in use, threads, git commit, peak RSS, the memory bandwidth
 * of a built-in streaming read test and the decode roofline: bytes of weights one decode step
 * reads / bandwidth. --json prints one object (schema "dspark.benchmark/1").
 *
 * The decode measurement is deliberately small: the speculative work extends it (e.g. --prompts
 * DIR for prompt sets); prefill and verify use the forward pass directly, so they measure the
 * kernels and nothing else. */
#include "cli/cli.h"

#include "backend/cpu/ops.h"
#include "core/threads.h"
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
#define VERIFY_MAX_K 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark benchmark -m MODEL [options]\n\n"
            "Measures prefill (512-token prompt), decode (128 tokens) and the verify cost curve (one\n"
            "forward of 1+k tokens, k = 0..16) after a warm-up; reports medians over the repeats, peak\n"
            "RSS, memory bandwidth and the decode roofline.\n\n"
            "  -m, --model PATH     GGUF model file\n"
            "  -t, --threads N      threads (default: physical cores)\n"
            "  -r, --repeat R       measured runs per figure (default 5)\n"
            "      --mode M         speculation for the decode figure: baseline (default), auto, dspark, dflash,\n"
            "                       hybrid, lookup. Any mode but baseline is measured against baseline in the\n"
            "                       same run (interleaved repeats): speedup, accepted-length histogram, drafts\n"
            "                       verified per round, drafter and verify time per round\n"
            "      --draft-model D  a DFlash/DSpark drafter for the model (directory or repo id)\n"
            "      --max-draft N|auto, --dspark-threshold T, --dspark-cumulative T, --hybrid-min N,\n"
            "      --draft-argmax, --lookup-min N, --lookup-max N   as for dspark generate (see its -h)\n"
            "      --trace-rounds F one JSON line per speculation round of the measured decode runs\n"
            "      --bw-mb N        buffer of the bandwidth test in MiB (default 1024; 0 = skip)\n"
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

/* ---- measurements ----------------------------------------------------------------------------- */

typedef struct bench {
    dsp_fwd *f;
    int n_vocab;
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

int dsp_cmd_benchmark(int argc, char **argv) {
    const char *model = NULL, *draft = NULL, *trace_path = NULL;
    bool json = false;
    int threads = 0, repeat = 5, bw_mb = 1024;
    dsp_gen_params gp = dsp_gen_default_params();
    gp.mode = DSP_SPEC_BASELINE;
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
        else if (!strcmp(a, "--trace-rounds") && has_val) trace_path = argv[++i];
        else if (!strcmp(a, "--bw-mb") && has_val) bw_mb = atoi(argv[++i]);
        else if (!strcmp(a, "--json")) json = true;
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
    if (threads < 0 || threads > 1024 || repeat < 1 || repeat > 64 || bw_mb < 0 || bw_mb > 65536) {
        fprintf(stderr, "dspark benchmark: --threads 0..1024, --repeat 1..64, --bw-mb 0..65536\n");
        return 2;
    }
    const dsp_spec_mode mode = gp.mode;
    if (threads == 0) threads = dsp_physical_cores();

    dsp_model_params mp = dsp_model_default_params();
    dsp_model *m = NULL;
    dsp_engine *c = NULL;
    FILE *trace = NULL;
    bench *b = NULL;
    int32_t *ids = NULL;
    int rc = 1;
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

    /* decode, through the public API */
    dsp_engine_params cp = dsp_engine_default_params();
    cp.n_threads = threads;
    cp.max_batch = 1;
    cp.draft_model = draft;
    if (dsp_engine_create(m, &cp, &c)) {
        dsp_cli_fail("benchmark", "%s", dsp_last_error());
        goto out;
    }
    size_t n_ids = 0;
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    dsp_tokenize(tok, g_decode_prompt, strlen(g_decode_prompt), DSP_TOKENIZE_ADD_SPECIAL, NULL, 0, &n_ids);
    ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
    if (!ids || dsp_tokenize(tok, g_decode_prompt, strlen(g_decode_prompt), DSP_TOKENIZE_ADD_SPECIAL, ids, n_ids, &n_ids)) {
        dsp_cli_fail("benchmark", "tokenizing the decode prompt: %s", dsp_last_error());
        goto out;
    }
    gp.max_tokens = DECODE_TOKENS;
    gp.ignore_eos = true;
    const bool spec = mode != DSP_SPEC_BASELINE;
    dsp_gen_params gb = gp; /* the baseline of the same run */
    gb.mode = DSP_SPEC_BASELINE;
    dsp_spec_profile prof;
    bool have_prof = gp.max_draft == DSP_DRAFT_AUTO && !dsp_engine_profile(c, &prof); /* measured before the timed runs */
    if (trace_path && !(trace = fopen(trace_path, "w"))) {
        dsp_cli_fail("benchmark", "--trace-rounds %s: cannot open", trace_path);
        goto out;
    }
    double dec[64], dec_cpu[64], base[64], ratio[64];
    dec_result dr, br;
    dsp_gen_result sum; /* the speculation statistics summed over the measured runs */
    memset(&sum, 0, sizeof sum);
    if (decode_once(c, ids, n_ids, &gp, &dr) || (spec && decode_once(c, ids, n_ids, &gb, &br))) { /* warm-up */
        dsp_cli_fail("benchmark", "decode: %s", dsp_last_error());
        goto out;
    }
    if (trace) gp.trace = dsp_cli_trace_round, gp.trace_user = trace;
    for (int r = 0; r < repeat; r++) { /* interleaved: drifts in machine load hit both alike */
        if ((spec && decode_once(c, ids, n_ids, &gb, &br)) || decode_once(c, ids, n_ids, &gp, &dr)) {
            dsp_cli_fail("benchmark", "decode: %s", dsp_last_error());
            goto out;
        }
        dec[r] = dr.tok_s;
        dec_cpu[r] = dr.tok_cpu_s;
        base[r] = spec ? br.tok_s : dr.tok_s;
        ratio[r] = base[r] > 0 ? dec[r] / base[r] : 0;
        sum.n_rounds += dr.res.n_rounds, sum.n_drafted += dr.res.n_drafted, sum.n_accepted += dr.res.n_accepted;
        sum.n_block_rounds += dr.res.n_block_rounds, sum.draft_ms += dr.res.draft_ms, sum.verify_ms += dr.res.verify_ms;
        sum.n_generated += dr.res.n_generated;
        for (int k = 0; k < DSP_MAX_DRAFT + 2; k++) sum.accept_hist[k] += dr.res.accept_hist[k];
        for (int k = 0; k <= DSP_MAX_DRAFT; k++) sum.kept_hist[k] += dr.res.kept_hist[k];
    }
    const dsp_spec_mode resolved = dsp_engine_resolve_mode(c, mode);
    dsp_drafter_info di;
    const bool have_drafter = dsp_engine_drafter_info(c, &di);
    char dpath[512] = "", dlayout[32] = "", dkind[16] = ""; /* di's strings live in the engine */
    if (have_drafter) {
        snprintf(dpath, sizeof dpath, "%s", di.path), snprintf(dlayout, sizeof dlayout, "%s", di.layout), snprintf(dkind, sizeof dkind, "%s", di.kind);
        di.path = dpath, di.layout = dlayout, di.kind = dkind;
    }
    dsp_engine_destroy(c);
    c = NULL;

    /* prefill and the verify curve, on the forward pass itself */
    b = calloc(1, sizeof *b);
    if (!b) goto out;
    dsp_fwd_params fp = dsp_fwd_default_params();
    fp.n_threads = threads;
    fp.max_batch_tokens = PREFILL_TOKENS;
    fp.n_ctx = (uint32_t)(m->hp.n_ctx_train < 1024 ? m->hp.n_ctx_train : 1024);
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
    double pre[64], pre_cpu[64], ver[VERIFY_MAX_K + 1][64], ver_cpu[VERIFY_MAX_K + 1][64], cms;
    forward_ms(b, &s, 0, PREFILL_TOKENS, 1, NULL); /* warm-up */
    for (int r = 0; r < repeat; r++) {
        pre[r] = PREFILL_TOKENS / (forward_ms(b, &s, 0, PREFILL_TOKENS, 1, &cms) / 1e3);
        pre_cpu[r] = PREFILL_TOKENS / (cms / 1e3);
    }
    forward_ms(b, &s, 0, VERIFY_PREFIX, 1, NULL);
    for (int k = 0; k <= VERIFY_MAX_K; k++) forward_ms(b, &s, VERIFY_PREFIX, 1 + k, 1 + k, NULL); /* warm-up */
    for (int r = 0; r < repeat; r++) /* interleave k within a repeat: drifts in machine load hit all k alike */
        for (int k = 0; k <= VERIFY_MAX_K; k++) ver[k][r] = forward_ms(b, &s, VERIFY_PREFIX, 1 + k, 1 + k, &ver_cpu[k][r]);
    dsp_kv_seq_free(dsp_fwd_kv(b->f), &s);

    const double cpu_share = (cpu_seconds() - cpu0) / ((dsp_cli_now_ms() - wall0) / 1e3 * threads);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double peak_rss_mb = (double)ru.ru_maxrss / 1024.0; /* before the bandwidth test's buffer */
    double bw = bw_mb ? mem_bandwidth((size_t)bw_mb, threads) : 0;
    uint64_t wbytes = weight_bytes_per_token(m);
    double roof = bw > 0 ? bw * 1e9 / (double)wbytes : 0;

    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    const char *isa = dsp_cpu_ops_best()->name;
    double dec_med = median(dec, repeat), pre_med = median(pre, repeat), ver_med[VERIFY_MAX_K + 1];
    double ver_cpu_med[VERIFY_MAX_K + 1], pre_cpu_med = median(pre_cpu, repeat), dec_cpu_med = median(dec_cpu, repeat);
    for (int k = 0; k <= VERIFY_MAX_K; k++) ver_med[k] = median(ver[k], repeat), ver_cpu_med[k] = median(ver_cpu[k], repeat);
    if (json) {
        printf("{\"schema\": \"dspark.benchmark/1\", \"model\": \"");
        for (const char *p = model; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
        printf("\", \"machine\": {\"cpu\": \"%s\", \"isa\": \"%s\", \"isa_supported\": \"%s\", \"threads\": %d, \"git_commit\": \"%s\", "
               "\"mem_bw_gb_s\": %.2f, \"loadavg_1m\": %.2f, \"cpu_share\": %.2f}, \"repeat\": %d",
               cpu, isa, dsp_cpu_isa_supported(), threads, DSP_GIT_COMMIT, bw, load0, cpu_share, repeat);
        printf(", \"prefill\": {\"n_tokens\": %d, \"tok_s\": %.2f, \"tok_per_cpu_s\": %.2f, \"runs\": [", PREFILL_TOKENS, pre_med, pre_cpu_med);
        for (int r = 0; r < repeat; r++) printf("%s%.2f", r ? ", " : "", pre[r]);
        printf("]}, \"decode\": {\"n_tokens\": %d, \"mode\": \"%s\", \"tok_s\": %.2f, \"tok_per_cpu_s\": %.2f, \"runs\": [", DECODE_TOKENS,
               dsp_spec_mode_to_string(resolved), dec_med, dec_cpu_med);
        for (int r = 0; r < repeat; r++) printf("%s%.2f", r ? ", " : "", dec[r]);
        printf("], \"rounds\": %zu, \"drafted\": %zu, \"accepted\": %zu", dr.res.n_rounds, dr.res.n_drafted, dr.res.n_accepted);
        if (spec) {
            printf(", \"baseline_tok_s\": %.2f, \"speedup\": %.3f, ", median(base, repeat), median(ratio, repeat));
            dsp_cli_print_spec_json(stdout, &gp, &sum);
            if (have_drafter) {
                printf(", \"drafter\": {\"path\": \"");
                for (const char *p = di.path; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
                printf("\", \"kind\": \"%s\", \"layout\": \"%s\", \"block\": %d}", di.kind, di.layout, di.block);
            }
        }
        if (have_prof) {
            printf(", \"profile\": {\"rows\": [");
            for (int i = 0; i < prof.n; i++) printf("%s%d", i ? ", " : "", prof.rows[i]);
            printf("], \"rel\": [");
            for (int i = 0; i < prof.n; i++) printf("%s%.3f", i ? ", " : "", (double)prof.rel[i]);
            printf("], \"one_row_ms\": %.3f, \"ctx_tokens\": %u, \"ctx_rel_per_key\": %.3g, \"draft_rel\": %.4f, \"draft_rel_per_req\": %.4f, "
                   "\"draft_ctx_rel\": %.4f, \"cached\": %s}",
                   prof.one_row_ms, prof.ctx_tokens, (double)prof.ctx_rel_per_key, (double)prof.draft_rel, (double)prof.draft_rel_per_req,
                   (double)prof.draft_ctx_rel, prof.cached ? "true" : "false");
        }
        printf("}");
        printf(", \"verify\": {\"prefix\": %d, \"ms\": [", VERIFY_PREFIX);
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_med[k]);
        printf("], \"rel\": [");
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_med[k] / ver_med[0]);
        printf("], \"cpu_ms\": [");
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_cpu_med[k]);
        printf("], \"cpu_rel\": [");
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf("%s%.3f", k ? ", " : "", ver_cpu_med[k] / ver_cpu_med[0]);
        printf("]}, \"roofline\": {\"weight_bytes_per_token\": %llu, \"tok_s\": %.2f, \"decode_fraction\": %.3f}, \"peak_rss_mb\": %.1f}\n",
               (unsigned long long)wbytes, roof, roof > 0 ? dec_med / roof : 0, peak_rss_mb);
    } else {
        printf("machine   %s, kernels %s (supported: %s), %d threads, commit %s\n", cpu, isa, dsp_cpu_isa_supported(), threads, DSP_GIT_COMMIT);
        printf("load      load average %.2f before; this process got %.0f%% of %d CPUs while measuring\n", load0, 100 * cpu_share, threads);
        printf("memory    %.2f GB/s streaming read; weights %.1f MB per token -> roofline %.1f tok/s\n", bw, (double)wbytes / 1e6, roof);
        printf("prefill   %.1f tok/s (%d tokens, median of %d); %.1f tok per CPU second\n", pre_med, PREFILL_TOKENS, repeat, pre_cpu_med);
        printf("decode    %.1f tok/s (%d tokens, mode %s, median of %d) = %.0f%% of the roofline; %.1f tok per CPU second\n", dec_med,
               DECODE_TOKENS, dsp_spec_mode_to_string(resolved), repeat, roof > 0 ? 100 * dec_med / roof : 0, dec_cpu_med);
        if (spec) {
            size_t emitted = 0;
            for (int k = 0; k < DSP_MAX_DRAFT + 2; k++) emitted += (size_t)k * sum.accept_hist[k];
            printf("spec      baseline %.1f tok/s in the same run: speedup %.2fx (median of per-repeat ratios)\n", median(base, repeat),
                   median(ratio, repeat));
            if (have_drafter) printf("          drafter %s (%s %s, block %d)\n", di.path, di.layout, di.kind, di.block);
            printf("          %.2f tokens per round, %zu/%zu drafts accepted; drafter %.2f ms per drafted round, verify %.2f ms per round\n",
                   sum.n_rounds ? (double)emitted / (double)sum.n_rounds : 0, sum.n_accepted, sum.n_drafted,
                   sum.n_block_rounds ? sum.draft_ms / (double)sum.n_block_rounds : 0, sum.n_rounds ? sum.verify_ms / (double)sum.n_rounds : 0);
            printf("          rounds by tokens committed:");
            for (int k = 1; k < DSP_MAX_DRAFT + 2; k++)
                if (sum.accept_hist[k]) printf(" %d:%zu", k, sum.accept_hist[k]);
            printf("\n          rounds by drafts verified:");
            for (int k = 0; k <= DSP_MAX_DRAFT; k++)
                if (sum.kept_hist[k]) printf(" %d:%zu", k, sum.kept_hist[k]);
            printf("\n");
        }
        if (have_prof) {
            printf("profile   c(k) (1+k-row forward / 1-row, %.2f ms at %u tokens of context):", prof.one_row_ms, prof.ctx_tokens);
            for (int i = 0; i < prof.n; i++) printf(" %d:%.2f", prof.rows[i] - 1, (double)prof.rel[i]);
            printf("\n          drafter %.3f per block (+%.3f per further request), its context step %.3f per row%s\n", (double)prof.draft_rel,
                   (double)prof.draft_rel_per_req, (double)prof.draft_ctx_rel, prof.cached ? ", from the cache" : "");
            if (prof.draft_rel > 0) {
                /* a drafter round: one block + the context step of the row it commits (one accepted token: the least) */
                double tgt = prof.one_row_ms * (1.0 - prof.draft_ctx_rel), drf = prof.one_row_ms * (prof.draft_rel + prof.draft_ctx_rel);
                printf("          drafter per round %.2f ms = %.1f%% of a target decode step (%.2f ms)\n", drf, 100 * drf / tgt, tgt);
            }
        }
        printf("verify    1+k tokens after %d, time relative to k = 0 (%.2f ms):\n         ", VERIFY_PREFIX, ver_med[0]);
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf(" k=%d %.2f", k, ver_med[k] / ver_med[0]);
        printf("\n          in CPU time (%.2f ms):\n         ", ver_cpu_med[0]);
        for (int k = 0; k <= VERIFY_MAX_K; k++) printf(" k=%d %.2f", k, ver_cpu_med[k] / ver_cpu_med[0]);
        printf("\npeak RSS  %.1f MB\n", peak_rss_mb);
    }
    rc = 0;
out:
    if (b) {
        dsp_fwd_destroy(b->f);
        free(b->logits);
        free(b);
    }
    free(ids);
    if (trace) fclose(trace);
    dsp_engine_destroy(c);
    dsp_model_destroy(m);
    return rc;
}
