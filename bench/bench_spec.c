/* bench_spec: decode speed of speculative decoding (prompt lookup by default, or --mode with a
 * --draft-model) against baseline, measured in the same run on the same prompts.
 *
 * For every prompt set (a directory of chat contexts, see bench/prompts/README.md) and every
 * prompt, it runs baseline and the speculative mode at every --max-draft value given (a list, e.g.
 * 2,4,8,16,auto) alternately (reps times each, after one warm-up round), checks that each produced
 * baseline's tokens (lossless; a mismatch is reported and fails the run), and reports per set and
 * max-draft value: the median over prompts of the median decode tok/s, the median of the
 * per-prompt speedups, the aggregate speedup (total tokens / total decode time), the mean accepted
 * length (tokens per round, bonus included) and the draft acceptance rate. The machine stamp (CPU,
 * cores, memory, kernel, commit, threads) heads the output.
 *
 * --mode takes a list too (e.g. dspark,hybrid,lookup): every mode runs at every --max-draft value,
 * all against the same baseline runs. --backend cuda runs it on the GPU (--kv-type f16|bf16).
 *
 * usage: bench_spec -m MODEL [--prompts DIR] [--sets copy,chat] [-n TOKENS] [--mode M,M,..] [--draft-model D] [--max-draft N,N,..|auto]
 *                   [--dspark-threshold T] [--reps R] [-t THREADS] [--backend cpu|cuda] [--kv-type f16|bf16] [--json] */
#include "core/version.h"
#include "dspark.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#define MAX_PROMPTS 64
#define MAX_REPS 16

typedef struct collect {
    int32_t ids[4096];
    int n;
} collect;

static bool on_tok(const dsp_token_event *ev, void *u) {
    collect *c = u;
    if (c->n < 4096) c->ids[c->n++] = ev->token;
    return true;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static void machine_stamp(char *cpu, size_t cap, long *mem_mb) {
    snprintf(cpu, cap, "unknown");
    *mem_mb = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(cpu, cap, "%s", p);
            }
            break;
        }
    if (f) fclose(f);
    f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "MemTotal:", 9)) *mem_mb = atol(line + 9) / 1024;
    if (f) fclose(f);
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

#define MAX_CFG 12

typedef struct cfg_result {
    double tps, speedup_median, speedup_aggregate, speedup_cpu, mean_accept_len, accept_rate;
    size_t tokens, rounds, drafted, accepted;
    size_t runs, block_drafts, lookup_only, gave_up; /* timed runs; the block drafter's drafts; auto runs started as lookup
                                                      * alone, or that gave the block drafter up */
    double ms, cpu_s;
    double fwd_ms, drafter_ms, host_ms; /* the engine's time in its rounds (prefill included): target forwards (with
                                         * the drafter's eager context step), the block drafter (context and draft
                                         * steps, wherever they ran), everything outside the forwards (the block
                                         * drafter's draft step and lazy context step included: host - drafter
                                         * is at most the rest) */
    uint64_t fwd_rows, ctx_rows;
} cfg_result;

typedef struct set_result {
    char name[64];
    int n_prompts;
    double base_tps;
    cfg_result cfg[MAX_CFG];
    int mismatches;
} set_result;

static void draft_name(int md, char *buf, size_t cap) {
    if (md == DSP_DRAFT_AUTO) snprintf(buf, cap, "auto");
    else snprintf(buf, cap, "%d", md);
}

/* "dspark/4": a configuration's name in the text output */
static void cfg_name(dsp_spec_mode mode, int md, char *buf, size_t cap) {
    char d[16];
    draft_name(md, d, sizeof d);
    snprintf(buf, cap, "%s/%s", dsp_spec_mode_to_string(mode), d);
}

#define USAGE "usage: bench_spec -m MODEL [--prompts DIR] [--sets copy,chat] [-n TOKENS] [--mode M,M,...] [--draft-model D]\n" \
              "                  [--draft-vocab N|auto|0] [--draft-quant q4_0|q8_0] [--dspark-threshold T]\n" \
              "                  [--max-draft N,N,...|auto] [--reps R] [-t THREADS] [--backend cpu|cuda] [--kv-type f16|bf16] [--json]\n"

int main(int argc, char **argv) {
    const char *model = NULL, *dir = "bench/prompts", *sets = "copy,chat", *drafts = "8", *draft_model = NULL, *modes = "lookup";
    int n_tokens = 128, reps = 3, threads = 2;
    int32_t draft_vocab = DSP_DRAFT_VOCAB_AUTO;
    dsp_draft_quant draft_quant = DSP_DRAFT_QUANT_DEFAULT;
    dsp_device device = DSP_DEVICE_CPU;
    dsp_kv_type kv_type = DSP_KV_DEFAULT;
    bool json = false;
    float threshold = 0; /* --dspark-threshold: the confidence cut of the speculative runs (0: off) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool v = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) model = argv[++i];
        else if (!strcmp(a, "--prompts") && v) dir = argv[++i];
        else if (!strcmp(a, "--sets") && v) sets = argv[++i];
        else if (!strcmp(a, "-n") && v) n_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--max-draft") && v) drafts = argv[++i];
        else if (!strcmp(a, "--draft-model") && v) draft_model = argv[++i];
        else if (!strcmp(a, "--draft-vocab") && v) {
            const char *b = argv[++i];
            char *end = NULL;
            long x = strtol(b, &end, 10);
            if (!strcmp(b, "auto")) draft_vocab = DSP_DRAFT_VOCAB_AUTO;
            else if (end != b && !*end && x >= 0 && x <= (1L << 24)) draft_vocab = x ? (int32_t)x : DSP_DRAFT_VOCAB_FULL;
            else {
                fprintf(stderr, "bench_spec: --draft-vocab: '%s' is not a number of tokens, 0 (every token) or auto\n", b);
                return 2;
            }
        }
        else if (!strcmp(a, "--draft-quant") && v) {
            if (!dsp_draft_quant_parse(argv[++i], &draft_quant)) {
                fprintf(stderr, "bench_spec: --draft-quant: '%s' is not q4_0 or q8_0\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(a, "--dspark-threshold") && v) {
            const char *b = argv[++i];
            char *end = NULL;
            threshold = strtof(b, &end);
            if (end == b || *end || !(threshold >= 0 && threshold <= 1)) {
                fprintf(stderr, "bench_spec: --dspark-threshold: '%s' is not a number in [0, 1]\n", b);
                return 2;
            }
        }
        else if (!strcmp(a, "--mode") && v) modes = argv[++i];
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--backend") && v) {
            const char *b = argv[++i];
            if (!strcmp(b, "cpu")) device = DSP_DEVICE_CPU;
            else if (!strcmp(b, "cuda")) device = DSP_DEVICE_CUDA;
            else {
                fprintf(stderr, "bench_spec: --backend: '%s' is not cpu or cuda\n", b);
                return 2;
            }
        } else if (!strcmp(a, "--kv-type") && v) {
            const char *b = argv[++i];
            if (!strcmp(b, "f16")) kv_type = DSP_KV_F16;
            else if (!strcmp(b, "bf16")) kv_type = DSP_KV_BF16;
            else {
                fprintf(stderr, "bench_spec: --kv-type: '%s' is not f16 or bf16\n", b);
                return 2;
            }
        } else if (!strcmp(a, "--json")) json = true;
        else {
            fprintf(stderr, USAGE);
            return 2;
        }
    }
    /* the configurations: every mode at every max-draft value */
    int md[MAX_CFG], n_cfg = 0;
    dsp_spec_mode mo[MAX_CFG];
    char mbuf[256];
    snprintf(mbuf, sizeof mbuf, "%s", modes);
    for (char *msave = NULL, *mt = strtok_r(mbuf, ",", &msave); mt; mt = strtok_r(NULL, ",", &msave)) {
        dsp_spec_mode mode;
        if (!dsp_spec_mode_from_string(mt, &mode) || mode == DSP_SPEC_BASELINE) {
            fprintf(stderr, "bench_spec: --mode: '%s' is not a speculation mode\n", mt);
            return 2;
        }
        char dbuf[256];
        snprintf(dbuf, sizeof dbuf, "%s", drafts);
        for (char *save = NULL, *t = strtok_r(dbuf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int x = !strcmp(t, "auto") ? DSP_DRAFT_AUTO : atoi(t);
            if (n_cfg == MAX_CFG || (x != DSP_DRAFT_AUTO && (x < 1 || x > DSP_MAX_DRAFT))) {
                fprintf(stderr, "bench_spec: --mode x --max-draft: at most %d configurations, max-draft 1..%d or auto\n", MAX_CFG,
                        DSP_MAX_DRAFT);
                return 2;
            }
            mo[n_cfg] = mode, md[n_cfg++] = x;
        }
    }
    if (!model || reps < 1 || reps > MAX_REPS || n_tokens < 1 || n_cfg == 0) {
        fprintf(stderr, "bench_spec: need -m MODEL; reps 1..%d, -n >= 1\n", MAX_REPS);
        return 2;
    }
    dsp_model_params mp = dsp_model_default_params();
    dsp_model *m;
    if (dsp_model_load(model, &mp, &m)) {
        fprintf(stderr, "bench_spec: %s\n", dsp_last_error());
        return 1;
    }
    dsp_engine_params cp = dsp_engine_default_params();
    cp.n_threads = threads;
    cp.n_ctx = 2048;
    cp.max_batch = 1;
    cp.no_prefix_cache = true; /* no prefix reuse between modes: each run prefills */
    cp.draft_model = draft_model;
    cp.draft_vocab = draft_vocab;
    cp.draft_quant = draft_quant;
    cp.device = device;
    cp.kv_type = kv_type;
    dsp_engine *c;
    if (dsp_engine_create(m, &cp, &c)) {
        fprintf(stderr, "bench_spec: %s\n", dsp_last_error());
        return 1;
    }
    dsp_spec_profile prof;
    for (int k = 0; k < n_cfg; k++)
        if (md[k] == DSP_DRAFT_AUTO) dsp_engine_profile(c, &prof); /* measured (or read) before the timed runs */
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    char cpu[256];
    long mem_mb;
    machine_stamp(cpu, sizeof cpu, &mem_mb);
    struct utsname un;
    uname(&un);
    if (!json)
        printf("machine: %s, %ld cores online, %ld MiB, %s %s; commit %s; model %s; %s; %d tokens, modes %s, max_draft %s, dspark threshold %g, %d reps\n", cpu,
               sysconf(_SC_NPROCESSORS_ONLN), mem_mb, un.sysname, un.release, dsp_git_commit, model, dsp_engine_backend(c), n_tokens, modes,
               drafts, threshold, reps);

    static set_result res[8];
    int n_sets = 0, rc = 0;
    char setbuf[256];
    snprintf(setbuf, sizeof setbuf, "%s", sets);
    for (char *save = NULL, *name = strtok_r(setbuf, ",", &save); name && n_sets < 8; name = strtok_r(NULL, ",", &save)) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        DIR *d = opendir(path);
        if (!d) {
            fprintf(stderr, "bench_spec: %s: %s\n", path, strerror(errno));
            return 1;
        }
        char *files[MAX_PROMPTS];
        int nf = 0;
        for (struct dirent *e; (e = readdir(d)) && nf < MAX_PROMPTS;)
            if (strstr(e->d_name, ".json")) files[nf++] = strdup(e->d_name);
        closedir(d);
        qsort(files, (size_t)nf, sizeof *files, cmp_str);
        set_result *sr = &res[n_sets++];
        memset(sr, 0, sizeof *sr);
        snprintf(sr->name, sizeof sr->name, "%s", name);
        sr->n_prompts = nf;
        static double pb[MAX_PROMPTS], ps[MAX_CFG][MAX_PROMPTS], pr[MAX_CFG][MAX_PROMPTS];
        double tb = 0, cb = 0;
        size_t tok_b = 0;
        for (int fi = 0; fi < nf; fi++) {
            snprintf(path, sizeof path, "%s/%s/%s", dir, name, files[fi]);
            char *ctx = slurp(path), *text = NULL;
            size_t tlen = 0, n_ids = 0;
            if (!ctx || dsp_chat_render(m, NULL, ctx, strlen(ctx), &text, &tlen)) {
                fprintf(stderr, "bench_spec: %s: %s\n", path, ctx ? dsp_last_error() : strerror(errno));
                return 1;
            }
            static int32_t ids[8192];
            if (dsp_tokenize(tok, text, tlen, DSP_TOKENIZE_PARSE_SPECIAL, ids, 8192, &n_ids)) {
                fprintf(stderr, "bench_spec: %s: %s\n", path, dsp_last_error());
                return 1;
            }
            double bt[MAX_REPS], st[MAX_CFG][MAX_REPS];
            static collect cb_, cs_;
            for (int r = fi == 0 ? -1 : 0; r < reps; r++) { /* r = -1: warm-up (first prompt of a set) */
                for (int k = -1; k < n_cfg; k++) { /* baseline, then each max-draft, interleaved within a rep */
                    dsp_gen_params gp = dsp_gen_default_params();
                    gp.max_tokens = n_tokens;
                    gp.mode = k < 0 ? DSP_SPEC_BASELINE : mo[k];
                    gp.max_draft = k < 0 ? 8 : md[k];
                    gp.dspark_threshold = k < 0 ? 0 : threshold;
                    collect *cl = k >= 0 ? &cs_ : &cb_;
                    cl->n = 0;
                    dsp_gen_result gr;
                    dsp_engine_stats s0, s1;
                    dsp_engine_get_stats(c, &s0);
                    double c0 = cpu_seconds();
                    if (dsp_generate(c, ids, n_ids, &gp, on_tok, cl, &gr)) {
                        fprintf(stderr, "bench_spec: %s: %s\n", path, dsp_last_error());
                        return 1;
                    }
                    if (r < 0) continue;
                    dsp_engine_get_stats(c, &s1);
                    double tps = gr.decode_ms > 0 ? (double)gr.n_generated / (gr.decode_ms / 1e3) : 0;
                    /* the decode's share of the process CPU time (the prefill is the same in every mode) */
                    double wall = gr.prefill_ms + gr.decode_ms, dcpu = wall > 0 ? (cpu_seconds() - c0) * gr.decode_ms / wall : 0;
                    if (k >= 0) {
                        cfg_result *cr = &sr->cfg[k];
                        st[k][r] = tps, cr->ms += gr.decode_ms, cr->tokens += gr.n_generated, cr->cpu_s += dcpu;
                        cr->rounds += gr.n_rounds, cr->drafted += gr.n_drafted, cr->accepted += gr.n_accepted;
                        cr->runs++, cr->block_drafts += s1.block_drafts - s0.block_drafts, cr->lookup_only += s1.auto_lookup_only - s0.auto_lookup_only;
                        cr->gave_up += s1.auto_gave_up - s0.auto_gave_up;
                        cr->fwd_ms += s1.forward_ms - s0.forward_ms, cr->drafter_ms += s1.draft_ms - s0.draft_ms, cr->host_ms += s1.host_ms - s0.host_ms;
                        cr->fwd_rows += s1.forward_rows - s0.forward_rows, cr->ctx_rows += s1.context_rows - s0.context_rows;
                        if (cb_.n != cs_.n || memcmp(cb_.ids, cs_.ids, sizeof(int32_t) * (size_t)cb_.n)) {
                            fprintf(stderr, "bench_spec: %s: speculative output differs from baseline!\n", path);
                            sr->mismatches++;
                            rc = 1;
                        }
                    } else {
                        bt[r] = tps, tb += gr.decode_ms, tok_b += gr.n_generated, cb += dcpu;
                    }
                }
            }
            pb[fi] = median(bt, reps);
            if (!json) printf("  %-5s %-28s %4d prompt tok %4d gen: baseline %6.2f tok/s", name, files[fi], (int)n_ids, cs_.n, pb[fi]);
            for (int k = 0; k < n_cfg; k++) {
                ps[k][fi] = median(st[k], reps), pr[k][fi] = ps[k][fi] / pb[fi];
                char nm[48];
                cfg_name(mo[k], md[k], nm, sizeof nm);
                if (!json) printf("  %s: %.2fx", nm, pr[k][fi]);
            }
            if (!json) printf("\n");
            fflush(stdout);
            free(ctx);
            free(text);
            free(files[fi]);
        }
        sr->base_tps = median(pb, nf);
        for (int k = 0; k < n_cfg; k++) {
            cfg_result *cr = &sr->cfg[k];
            cr->tps = median(ps[k], nf);
            cr->speedup_median = median(pr[k], nf);
            cr->speedup_aggregate = ((double)cr->tokens / cr->ms) / ((double)tok_b / tb);
            cr->speedup_cpu = ((double)cr->tokens / cr->cpu_s) / ((double)tok_b / cb);
            cr->mean_accept_len = cr->rounds ? (double)cr->tokens / (double)cr->rounds : 0;
            cr->accept_rate = cr->drafted ? (double)cr->accepted / (double)cr->drafted : 0;
        }
    }
    dsp_engine_stats est;
    dsp_engine_get_stats(c, &est);
    if (json) {
        printf("{\"machine\": {\"cpu\": \"%s\", \"cores_online\": %ld, \"mem_mib\": %ld, \"kernel\": \"%s %s\", \"commit\": \"%s\"}, ", cpu,
               sysconf(_SC_NPROCESSORS_ONLN), mem_mb, un.sysname, un.release, dsp_git_commit);
        dsp_drafter_info di;
        bool have_di = dsp_engine_drafter_info(c, &di);
        printf("\"model\": \"%s\", \"draft_model\": \"%s\", \"draft_vocab\": %d, \"draft_layer_type\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"max_tokens\": %d, "
               "\"reps\": %d, \"dspark_threshold\": %g, \"cost_scale\": [%.3f, %.3f, %.3f], \"sets\": [",
               model, draft_model ? draft_model : "", have_di ? di.draft_vocab : 0, have_di ? di.layer_type : "", dsp_engine_backend(c), threads, n_tokens, reps, threshold, est.cost_scale[0],
               est.cost_scale[1], est.cost_scale[2]);
        for (int i = 0; i < n_sets; i++) {
            printf("%s{\"name\": \"%s\", \"prompts\": %d, \"baseline_tok_per_s\": %.3f, \"mismatches\": %d, \"configs\": [", i ? ", " : "", res[i].name,
                   res[i].n_prompts, res[i].base_tps, res[i].mismatches);
            for (int k = 0; k < n_cfg; k++) {
                const cfg_result *cr = &res[i].cfg[k];
                char nm[16];
                draft_name(md[k], nm, sizeof nm);
                printf("%s{\"mode\": \"%s\", \"runs_as\": \"%s\", \"max_draft\": \"%s\", \"tok_per_s\": %.3f, \"speedup_median\": %.3f, \"speedup_aggregate\": %.3f, \"speedup_cpu\": %.3f, "
                       "\"mean_accepted_len\": %.3f, \"acceptance_rate\": %.3f, \"runs\": %zu, \"block_drafts\": %zu, \"runs_started_as_lookup\": %zu, \"runs_gave_up\": %zu, "
                       "\"engine_ms\": {\"forward\": %.1f, \"drafter\": %.1f, \"host\": %.1f}, \"forward_rows\": %" PRIu64 ", \"context_rows\": %" PRIu64 "}",
                       k ? ", " : "", dsp_spec_mode_to_string(mo[k]), dsp_spec_mode_to_string(dsp_engine_resolve_mode(c, mo[k])), nm, cr->tps,
                       cr->speedup_median, cr->speedup_aggregate, cr->speedup_cpu, cr->mean_accept_len, cr->accept_rate, cr->runs, cr->block_drafts,
                       cr->lookup_only, cr->gave_up, cr->fwd_ms, cr->drafter_ms, cr->host_ms, cr->fwd_rows, cr->ctx_rows);
            }
            printf("]}");
        }
        printf("]}\n");
    } else {
        for (int i = 0; i < n_sets; i++) {
            printf("%-5s: %d prompts; median decode tok/s baseline %.2f%s\n", res[i].name, res[i].n_prompts, res[i].base_tps,
                   res[i].mismatches ? " (OUTPUT MISMATCH)" : "");
            for (int k = 0; k < n_cfg; k++) {
                const cfg_result *cr = &res[i].cfg[k];
                char cn[48];
                cfg_name(mo[k], md[k], cn, sizeof cn);
                printf("   %-14s: %.2f tok/s, speedup median %.2fx, aggregate %.2fx, in CPU time %.2fx; mean accepted length %.2f, draft "
                       "acceptance %.2f; block drafts %zu; of %zu runs %zu started as lookup, %zu gave the drafter up\n",
                       cn, cr->tps, cr->speedup_median, cr->speedup_aggregate, cr->speedup_cpu, cr->mean_accept_len, cr->accept_rate, cr->block_drafts,
                       cr->runs, cr->lookup_only, cr->gave_up);
            }
        }
        printf("--max-draft auto's calibration (measured / profiled round time): plain %.3f, lookup %.3f, block drafter %.3f\n", est.cost_scale[0],
               est.cost_scale[1], est.cost_scale[2]);
    }
    dsp_engine_destroy(c);
    dsp_model_destroy(m);
    return rc;
}
