/* cli/common: what the generate and chat commands (and serve, benchmark) share: the sampling,
 * speculation and engine options, the --json speculation statistics, and chat rendering. */
#include "cli/cli.h"

#include "core/file.h"
#include "core/status.h"
#include "dspark.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double dsp_cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Render messages (a JSON array) with add_generation_prompt; template_file overrides the model's. */
int dsp_cli_render_messages(const dsp_model *m, const char *template_file, json_t *messages, char **out, size_t *out_len) {
    char *tsrc = NULL;
    if (template_file && dsp_file_read(template_file, (size_t)64 << 20, &tsrc, NULL))
        return dsp_cli_fail("chat", "%s", dsp_last_error());
    json_t *ctx = json_pack("{s:O, s:b}", "messages", messages, "add_generation_prompt", 1);
    char *js = ctx ? json_dumps(ctx, JSON_COMPACT) : NULL;
    json_decref(ctx);
    int rc = 0;
    if (!js || dsp_chat_render(m, tsrc, js, strlen(js), out, out_len)) {
        rc = dsp_cli_fail("chat", "%s%s", dsp_last_error(),
                          template_file || dsp_model_has_chat_template(m) ? "" : " (use --chat-template FILE)");
    }
    free(js);
    free(tsrc);
    return rc;
}

void dsp_cli_add_message(json_t *messages, const char *role, const char *content, size_t len) {
    json_array_append_new(messages, json_pack("{s:s, s:s%}", "role", role, "content", content, len));
}

int dsp_cli_render_chat(const dsp_model *m, const char *template_file, const char *system, const char *user, size_t user_len, char **out,
                        size_t *out_len) {
    json_t *msgs = json_array();
    if (system) dsp_cli_add_message(msgs, "system", system, strlen(system));
    dsp_cli_add_message(msgs, "user", user, user_len);
    int rc = dsp_cli_render_messages(m, template_file, msgs, out, out_len);
    json_decref(msgs);
    return rc;
}

/* Parse a number option; returns false (after printing) if malformed. */
static bool num(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "dspark: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

void dsp_cli_spec_defaults(dsp_gen_params *gp) {
    gp->mode = DSP_SPEC_AUTO;
    gp->max_draft = DSP_CLI_DEFAULT_MAX_DRAFT;
    /* "not given" until the model is loaded: dsp_cli_sampling_defaults fills them */
    gp->temperature = gp->top_p = gp->min_p = gp->repetition_penalty = -1.0f;
    gp->top_k = -1;
}

const char *dsp_cli_quantize = NULL;

void dsp_cli_sampling_defaults(const dsp_model *m, dsp_gen_params *gp) {
    unsigned given = (gp->temperature >= 0 ? DSP_GEN_HAS_TEMPERATURE : 0) | (gp->top_p >= 0 ? DSP_GEN_HAS_TOP_P : 0) |
                     (gp->top_k >= 0 ? DSP_GEN_HAS_TOP_K : 0) | (gp->min_p >= 0 ? DSP_GEN_HAS_MIN_P : 0) |
                     (gp->repetition_penalty >= 0 ? DSP_GEN_HAS_REPETITION_PENALTY : 0);
    dsp_gen_params lib = dsp_gen_default_params();
    lib.temperature = 0; /* the CLI is greedy unless the model or the user says otherwise */
    if (gp->temperature < 0) gp->temperature = lib.temperature;
    if (gp->top_p < 0) gp->top_p = lib.top_p;
    if (gp->top_k < 0) gp->top_k = lib.top_k;
    if (gp->min_p < 0) gp->min_p = lib.min_p;
    if (gp->repetition_penalty < 0) gp->repetition_penalty = lib.repetition_penalty;
    dsp_gen_defaults gd;
    dsp_model_gen_defaults(m, &gd);
    dsp_gen_apply_defaults(&gd, given, gp);
}

void dsp_cli_log_spec(const dsp_engine *e, const dsp_gen_params *gp) {
    dsp_drafter_info di;
    char md[16];
    if (gp->max_draft == DSP_DRAFT_AUTO) snprintf(md, sizeof md, "auto");
    else snprintf(md, sizeof md, "%d", gp->max_draft);
    dsp_spec_mode mode = dsp_engine_resolve_mode(e, gp->mode);
    if (dsp_engine_drafter_info(e, &di))
        fprintf(stderr, "dspark: speculation %s, max draft %s; drafter %s (%s %s, block %d, %d layers of %s%s, draft vocabulary %d%s%s%s)\n",
                dsp_spec_mode_to_string(mode), md, di.path, di.layout, di.kind, di.block, di.n_layers, di.layer_type, di.markov_rank ? ", Markov head" : "",
                di.draft_vocab, strcmp(di.draft_vocab_source, "full") ? " tokens by " : " tokens: ", di.draft_vocab_source,
                strcmp(di.draft_vocab_source, "full") ? "" : " vocabulary");
    else
        fprintf(stderr, "dspark: speculation %s, max draft %s; no drafter model\n", dsp_spec_mode_to_string(mode), md);
}

/* --trace-rounds: one JSON line per round (dsp_gen_params.trace with the FILE as user). */
void dsp_cli_trace_round(const dsp_round_trace *t, void *user) {
    FILE *f = user;
    fprintf(f, "{\"pos\": %u, \"source\": \"%s\", \"draft\": [", t->pos, t->source);
    for (int i = 0; i < t->n_draft; i++) fprintf(f, "%s%d", i ? ", " : "", t->draft[i]);
    fprintf(f, "], \"kept\": %d, \"accepted\": %d, \"next\": ", t->kept, t->accepted);
    if (t->next >= 0) fprintf(f, "%d", t->next);
    else fputs("null", f);
    if (t->source[0] == 'd') fprintf(f, ", \"ctx_rows\": %d", t->ctx_rows);
    if (t->top_ids) {
        fputs(", \"top\": [", f);
        for (int i = 0; i < t->n_draft; i++) {
            const int32_t *id = t->top_ids + 3 * i;
            const float *v = t->top_vals + 3 * i;
            fprintf(f, "%s{\"ids\": [%d, %d, %d], \"vals\": [%.9g, %.9g, %.9g]}", i ? ", " : "", id[0], id[1], id[2], (double)v[0], (double)v[1],
                    (double)v[2]);
        }
        fputc(']', f);
    }
    if (t->conf) {
        fputs(", \"conf\": [", f);
        for (int i = 0; i < t->n_draft; i++) fprintf(f, "%s%.9g", i ? ", " : "", (double)t->conf[i]);
        fputc(']', f);
    }
    fputs("}\n", f);
}

/* Speculation statistics for --json (generate) and the benchmark. */
void dsp_cli_print_spec_json(FILE *f, const dsp_gen_params *gp, const dsp_gen_result *r) {
    double tps = r->decode_ms > 0 ? (double)r->n_generated / (r->decode_ms / 1e3) : 0;
    size_t emitted = 0;
    int hi = 0;
    for (int k = 0; k < DSP_MAX_DRAFT + 2; k++) {
        emitted += (size_t)k * r->accept_hist[k];
        if (r->accept_hist[k]) hi = k;
    }
    char md[16];
    if (gp->max_draft == DSP_DRAFT_AUTO) snprintf(md, sizeof md, "\"auto\"");
    else snprintf(md, sizeof md, "%d", gp->max_draft);
    fprintf(f, "\"spec\": {\"mode\": \"%s\", \"max_draft\": %s, \"rounds\": %zu, \"draft_rounds\": %zu, \"drafted\": %zu, \"accepted\": %zu, ",
            dsp_spec_mode_to_string(gp->mode), md, r->n_rounds, r->n_draft_rounds, r->n_drafted, r->n_accepted);
    fprintf(f, "\"mean_accepted_len\": %.3f, \"acceptance_rate\": %.3f, \"accept_hist\": [", r->n_rounds ? (double)emitted / (double)r->n_rounds : 0.0,
            r->n_drafted ? (double)r->n_accepted / (double)r->n_drafted : 0.0);
    for (int k = 1; k <= hi; k++) fprintf(f, "%s%zu", k > 1 ? ", " : "", r->accept_hist[k]);
    int hk = 0;
    for (int k = 0; k <= DSP_MAX_DRAFT; k++)
        if (r->kept_hist[k]) hk = k;
    fputs("], \"kept_hist\": [", f);
    for (int k = 0; k <= hk; k++) fprintf(f, "%s%zu", k ? ", " : "", r->kept_hist[k]);
    fprintf(f, "], \"block_rounds\": %zu, \"draft_ms\": %.1f, \"verify_ms\": %.1f, \"decode_tok_per_s\": %.2f}", r->n_block_rounds,
            r->draft_ms, r->verify_ms, tps);
}

/* option value helpers of the two parsers below (a, argc, argv, i, v in scope) */
#define NEXT()                                                                 \
    do {                                                                       \
        if (*i + 1 >= argc) {                                                  \
            fprintf(stderr, "dspark: option %s needs a value\n", a);           \
            return 2;                                                          \
        }                                                                      \
        (*i)++;                                                                \
    } while (0)
#define NUM(lo, hi) \
    NEXT();         \
    if (!num(a, argv[*i], lo, hi, &v)) return 2;

int dsp_cli_parse_spec_opt(int argc, char **argv, int *i, dsp_gen_params *gp, bool *handled) {
    const char *a = argv[*i];
    double v;
    *handled = true;
    if (!strcmp(a, "--mode")) {
        NEXT();
        if (!dsp_spec_mode_from_string(argv[*i], &gp->mode)) {
            fprintf(stderr, "dspark: --mode: '%s' is not one of auto, dspark, dflash, hybrid, lookup, baseline\n", argv[*i]);
            return 2;
        }
    } else if (!strcmp(a, "--max-draft")) {
        NEXT();
        if (!strcmp(argv[*i], "auto")) gp->max_draft = DSP_DRAFT_AUTO;
        else if (!num(a, argv[*i], 1, DSP_MAX_DRAFT, &v)) return 2;
        else gp->max_draft = (int32_t)v;
    }
    else if (!strcmp(a, "--dspark-threshold")) { NUM(0, 1) gp->dspark_threshold = (float)v; }
    else if (!strcmp(a, "--dspark-cumulative")) { NUM(0, 1) gp->dspark_cumulative = (float)v; }
    else if (!strcmp(a, "--hybrid-min")) { NUM(1, 32) gp->hybrid_min = (int32_t)v; }
    else if (!strcmp(a, "--draft-argmax")) gp->draft_sample = false;
    else if (!strcmp(a, "--lookup-min")) { NUM(1, 16) gp->lookup_min_n = (int32_t)v; }
    else if (!strcmp(a, "--lookup-max")) { NUM(1, 16) gp->lookup_max_n = (int32_t)v; }
    else *handled = false;
    return 0;
}

int dsp_cli_parse_gen_opt(int argc, char **argv, int *i, dsp_gen_params *gp, int *n_stop, dsp_engine_params *cp, bool *handled) {
    const char *a = argv[*i];
    double v;
    *handled = true;
    if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) { NUM(1, 1e9) gp->max_tokens = (int32_t)v; }
    else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) { NUM(0, 100) gp->temperature = (float)v; }
    else if (!strcmp(a, "--top-p")) { NUM(0, 1) gp->top_p = (float)v; }
    else if (!strcmp(a, "--top-k")) { NUM(0, 1e9) gp->top_k = (int32_t)v; }
    else if (!strcmp(a, "--min-p")) { NUM(0, 1) gp->min_p = (float)v; }
    else if (!strcmp(a, "--presence-penalty")) { NUM(-2, 2) gp->presence_penalty = (float)v; }
    else if (!strcmp(a, "--frequency-penalty")) { NUM(-2, 2) gp->frequency_penalty = (float)v; }
    else if (!strcmp(a, "--repeat-penalty")) { NUM(0, 100) gp->repetition_penalty = (float)v; }
    else if (!strcmp(a, "--repeat-last-n")) { NUM(-1, 1e9) gp->repetition_last_n = (int32_t)v; }
    else if (!strcmp(a, "--seed")) { NUM(0, 1.8e19) gp->seed = (uint64_t)v; }
    else if (!strcmp(a, "--logprobs")) { NUM(0, DSP_MAX_LOGPROBS) gp->logprobs = (int32_t)v; }
    else if (!strcmp(a, "--ignore-eos")) gp->ignore_eos = true;
    else if (!strcmp(a, "--quantize")) {
        NEXT();
        dsp_cli_quantize = argv[*i];
    }
    else if (!strcmp(a, "--stop")) {
        NEXT();
        if (*n_stop >= DSP_MAX_STOP) {
            fprintf(stderr, "dspark: at most %d --stop strings\n", DSP_MAX_STOP);
            return 2;
        }
        gp->stop[(*n_stop)++] = argv[*i];
    }
    else *handled = false;
    if (!*handled) {
        int rc = dsp_cli_parse_spec_opt(argc, argv, i, gp, handled);
        if (rc || *handled) return rc;
        return dsp_cli_parse_engine_opt(argc, argv, i, cp, handled);
    }
    return 0;
}
#undef NUM
#undef NEXT


/* "8G", "512M", "1500000000": bytes */
static bool parse_bytes(const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (errno || end == s || *end || !(v > 0) || v * mul > 1e15) {
        fprintf(stderr, "dspark: %s: '%s' is not a size (e.g. 512M, 8G)\n", opt, s);
        return false;
    }
    *out = (uint64_t)(v * mul);
    return true;
}

bool dsp_cli_parse_draft_quant(const char *s, enum dsp_draft_quant *out) {
    if (dsp_draft_quant_parse(s, out)) return true;
    fprintf(stderr, "dspark: --draft-quant: '%s' is not q4_0 or q8_0\n", s);
    return false;
}

bool dsp_cli_parse_draft_vocab(const char *s, int32_t *out) {
    char *end = NULL;
    if (!strcmp(s, "auto")) {
        *out = DSP_DRAFT_VOCAB_AUTO;
        return true;
    }
    if (!strcmp(s, "full") || !strcmp(s, "all")) {
        *out = DSP_DRAFT_VOCAB_FULL;
        return true;
    }
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > (1L << 24)) {
        fprintf(stderr, "dspark: --draft-vocab: '%s' is not a number of tokens (1..vocabulary size), 0 (every token) or auto\n", s);
        return false;
    }
    *out = v == 0 ? DSP_DRAFT_VOCAB_FULL : (int32_t)v;
    return true;
}

int dsp_cli_parse_engine_opt(int argc, char **argv, int *i, dsp_engine_params *cp, bool *handled) {
    const char *a = argv[*i];
    double v;
    *handled = true;
    if (*i + 1 >= argc && (!strcmp(a, "-c") || !strcmp(a, "--ctx") || !strcmp(a, "-t") || !strcmp(a, "--threads") || !strcmp(a, "--batch") ||
                           !strcmp(a, "--batch-tokens") || !strcmp(a, "--max-batch") || !strcmp(a, "--kv-memory") || !strcmp(a, "--device") ||
                           !strcmp(a, "--backend") || !strcmp(a, "--gpu") || !strcmp(a, "--kv-type") || !strcmp(a, "--draft-model") || !strcmp(a, "--draft-vocab") ||
                           !strcmp(a, "--precision") || !strcmp(a, "--prefill-itl") || !strcmp(a, "--draft-quant"))) {
        fprintf(stderr, "dspark: option %s needs a value\n", a);
        return 2;
    }
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
        if (!num(a, argv[++*i], 16, 1 << 24, &v)) return 2;
        cp->n_ctx = (uint32_t)v;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!num(a, argv[++*i], 1, 1024, &v)) return 2;
        cp->n_threads = (int)v;
    } else if (!strcmp(a, "--batch") || !strcmp(a, "--batch-tokens")) {
        if (!num(a, argv[++*i], 1, 65536, &v)) return 2;
        cp->batch_tokens = (int)v;
    } else if (!strcmp(a, "--prefill-itl")) {
        if (!num(a, argv[++*i], 1, 100, &v)) return 2;
        cp->prefill_itl = (float)v;
    } else if (!strcmp(a, "--max-batch")) {
        if (!num(a, argv[++*i], 1, 1024, &v)) return 2;
        cp->max_batch = (int)v;
    } else if (!strcmp(a, "--kv-memory")) {
        if (!parse_bytes(a, argv[++*i], &cp->kv_memory)) return 2;
    } else if (!strcmp(a, "--no-prefix-cache")) {
        cp->no_prefix_cache = true;
    } else if (!strcmp(a, "--device") || !strcmp(a, "--backend")) {
        const char *d = argv[++*i];
        if (!strcmp(d, "auto")) cp->device = DSP_DEVICE_AUTO;
        else if (!strcmp(d, "cpu")) cp->device = DSP_DEVICE_CPU;
        else if (!strcmp(d, "cuda") || !strcmp(d, "gpu")) cp->device = DSP_DEVICE_CUDA;
        else {
            fprintf(stderr, "dspark: %s: '%s' is not one of auto, cpu, cuda\n", a, d);
            return 2;
        }
    } else if (!strcmp(a, "--kv-type")) {
        const char *t = argv[++*i];
        if (!strcmp(t, "f16")) cp->kv_type = DSP_KV_F16;
        else if (!strcmp(t, "bf16")) cp->kv_type = DSP_KV_BF16;
        else if (!strcmp(t, "f32")) cp->kv_type = DSP_KV_F32;
        else {
            fprintf(stderr, "dspark: --kv-type: '%s' is not f16, bf16 or f32\n", t);
            return 2;
        }
    } else if (!strcmp(a, "--precision")) {
        const char *d = argv[++*i];
        if (!strcmp(d, "q8")) cp->precision = DSP_PRECISION_Q8;
        else if (!strcmp(d, "f32")) cp->precision = DSP_PRECISION_F32;
        else {
            fprintf(stderr, "dspark: %s: '%s' is not one of q8, f32\n", a, d);
            return 2;
        }
    } else if (!strcmp(a, "--draft-quant")) {
        if (!dsp_cli_parse_draft_quant(argv[++*i], &cp->draft_quant)) return 2;
    } else if (!strcmp(a, "--gpu")) {
        if (!num(a, argv[++*i], 0, 64, &v)) return 2;
        cp->gpu = (int)v;
    } else if (!strcmp(a, "--draft-model")) {
        cp->draft_model = argv[++*i];
    } else if (!strcmp(a, "--draft-vocab")) {
        if (!dsp_cli_parse_draft_vocab(argv[++*i], &cp->draft_vocab)) return 2;
    } else {
        *handled = false;
    }
    return 0;
}

int dsp_cli_tokenize(const dsp_tokenizer *tok, const char *text, size_t len, int flags, int32_t **ids, size_t *n) {
    *n = 0;
    dsp_tokenize(tok, text, len, flags, NULL, 0, n); /* the count (0 slots are too few: not an error here) */
    if (!(*ids = malloc((*n ? *n : 1) * sizeof **ids))) return dsp_error(DSP_ERR_NOMEM, "no memory for %zu token ids", *n);
    return dsp_tokenize(tok, text, len, flags, *ids, *n, n);
}
