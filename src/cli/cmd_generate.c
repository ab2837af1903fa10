/* cli/cmd_generate: `dspark generate`: one completion, streamed to stdout as it is decoded. */
#include "cli/cli.h"

#include "core/file.h"
#include "dspark.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark generate -m MODEL (-p TEXT | --file F) [options]\n\n"
            "Generates a continuation of the prompt and streams it to stdout.\n\n"
            "  -m, --model MODEL       GGUF file, Hugging Face directory, or repo id org/name[@rev] (HF cache)\n"
            "  -p, --prompt TEXT       the prompt\n"
            "  -f, --file F            read the prompt from a file ('-' = stdin)\n"
            "  -n, --max-tokens N      tokens to generate at most (default 256)\n"
            "      --chat              wrap the prompt as a user message in the model's chat template\n"
            "      --system TEXT       system message (with --chat)\n"
            "      --chat-template F   use this Jinja template instead of the model's\n"
            "      --temperature T     0 = greedy (default: the model's generation_config.json, else 0)\n"
            "      --top-p P           nucleus sampling mass (default: generation_config, else 1 = off)\n"
            "      --top-k K           keep the K most likely tokens (default: generation_config, else 0 = off)\n"
            "      --min-p P           drop tokens below P x the top probability (default: generation_config, else 0)\n"
            "      --quantize Q        quantize F32/F16/BF16 weights at load: q8_0, q4_0 or q4_k\n"
            "      --presence-penalty X, --frequency-penalty X   OpenAI penalties in [-2, 2]\n"
            "      --repeat-penalty X  llama.cpp repetition penalty (default 1 = off)\n"
            "      --seed S            sampling seed (default 0)\n"
            "      --stop TEXT         stop string (repeatable, at most 4)\n"
            "      --ignore-eos        do not stop at end-of-generation tokens\n"
            "      --logprobs N        report the chosen token's log-probability and N alternatives (--json)\n"
            DSP_CLI_SPEC_HELP
            DSP_CLI_ENGINE_HELP
            "      --json              print one JSON object at the end instead of streaming text; its \"spec\"\n"
            "                          object has rounds, mean_accepted_len (tokens per round, bonus included),\n"
            "                          accept_hist (rounds that produced 1, 2, ... tokens), acceptance_rate\n"
            "                          (accepted / drafted) and decode_tok_per_s\n"
            "      --trace-rounds FILE one JSON line per speculation round: pos, draft, kept, accepted, next\n"
            "  -h, --help              this help\n",
            DSP_CLI_STR(DSP_CLI_DEFAULT_MAX_DRAFT));
}

typedef struct gen_opts {
    const char *model, *prompt, *file, *system, *chat_template, *trace;
    bool chat, json;
    dsp_gen_params gp;
    int n_stop;
    dsp_engine_params cp;
} gen_opts;

typedef struct stream_state {
    bool json;
    char *text;           /* --json: the whole text */
    size_t n_text, cap;
    int32_t *ids;
    size_t n_ids, cap_ids;
    FILE *lp;             /* --json with logprobs: a memstream of the per-token array */
    char *lp_buf;
    size_t lp_len;
    bool first_lp;
} stream_state;

static void json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static bool on_token(const dsp_token_event *ev, void *user) {
    stream_state *ss = user;
    if (!ss->json) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        return true;
    }
    if (ss->n_text + ev->text_len + 1 > ss->cap) {
        size_t nc = (ss->n_text + ev->text_len + 1) * 2;
        char *nb = realloc(ss->text, nc);
        if (!nb) return false;
        ss->text = nb, ss->cap = nc;
    }
    memcpy(ss->text + ss->n_text, ev->text, ev->text_len);
    ss->n_text += ev->text_len;
    if (ss->n_ids == ss->cap_ids) {
        size_t nc = ss->cap_ids ? ss->cap_ids * 2 : 256;
        int32_t *ni = realloc(ss->ids, nc * sizeof *ni);
        if (!ni) return false;
        ss->ids = ni, ss->cap_ids = nc;
    }
    ss->ids[ss->n_ids++] = ev->token;
    if (ss->lp) {
        fprintf(ss->lp, "%s{\"token\": %d, \"logprob\": %.6g, \"top\": [", ss->first_lp ? "" : ", ", ev->token, ev->chosen.logprob);
        for (int i = 0; i < ev->n_top; i++)
            fprintf(ss->lp, "%s{\"token\": %d, \"logprob\": %.6g}", i ? ", " : "", ev->top[i].token, ev->top[i].logprob);
        fputs("]}", ss->lp);
        ss->first_lp = false;
    }
    return true;
}

int dsp_cmd_generate(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    gen_opts o;
    memset(&o, 0, sizeof o);
    o.gp = dsp_gen_default_params();
    dsp_cli_spec_defaults(&o.gp);
    o.cp = dsp_engine_default_params();
    o.cp.max_batch = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool handled;
        int rc = dsp_cli_parse_gen_opt(argc, argv, &i, &o.gp, &o.n_stop, &o.cp, &handled);
        if (rc) return rc;
        if (handled) continue;
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) o.model = argv[++i];
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && has_val) o.prompt = argv[++i];
        else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && has_val) o.file = argv[++i];
        else if (!strcmp(a, "--system") && has_val) o.system = argv[++i];
        else if (!strcmp(a, "--chat-template") && has_val) o.chat_template = argv[++i];
        else if (!strcmp(a, "--trace-rounds") && has_val) o.trace = argv[++i];
        else if (!strcmp(a, "--chat")) o.chat = true;
        else if (!strcmp(a, "--json")) o.json = true;
        else {
            fprintf(stderr, "dspark generate: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.model || (!o.prompt == !o.file)) {
        fprintf(stderr, "dspark generate: need -m MODEL and exactly one of -p TEXT or --file F\n\n");
        usage(stderr);
        return 2;
    }
    size_t plen = 0;
    char *ptext = NULL;
    if (o.file) {
        if (dsp_file_read(o.file, (size_t)1 << 30, &ptext, &plen))
            return dsp_cli_fail("generate", "%s", dsp_last_error());
    } else {
        ptext = strdup(o.prompt);
        plen = strlen(ptext);
    }
    double t0 = dsp_cli_now_ms();
    dsp_model_params mp = dsp_model_default_params();
    mp.progress = isatty(2);
    mp.quantize = dsp_cli_quantize;
    mp.n_threads = o.cp.n_threads;
    dsp_model *m = NULL;
    dsp_engine *c = NULL;
    FILE *trace = NULL;
    int rc = 1;
    int32_t *ids = NULL;
    char *rendered = NULL;
    stream_state ss;
    memset(&ss, 0, sizeof ss);
    ss.json = o.json;
    if (dsp_model_load(o.model, &mp, &m)) {
        dsp_cli_fail("generate", "%s", dsp_last_error());
        goto out;
    }
    if (dsp_engine_create(m, &o.cp, &c)) {
        dsp_cli_fail("generate", "%s", dsp_last_error());
        goto out;
    }
    if (o.trace && !(trace = fopen(o.trace, "w"))) {
        dsp_cli_fail("generate", "--trace-rounds %s: %s", o.trace, strerror(errno));
        goto out;
    }
    if (trace) o.gp.trace = dsp_cli_trace_round, o.gp.trace_user = trace;
    if (!o.json) dsp_cli_log_spec(c, &o.gp);
    double load_ms = dsp_cli_now_ms() - t0;
    dsp_cli_sampling_defaults(m, &o.gp);
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    int flags = DSP_TOKENIZE_ADD_SPECIAL;
    const char *text = ptext;
    size_t tlen = plen;
    if (o.chat) {
        size_t rlen;
        if (dsp_cli_render_chat(m, o.chat_template, o.system, ptext, plen, &rendered, &rlen)) goto out;
        text = rendered, tlen = rlen;
        flags = DSP_TOKENIZE_PARSE_SPECIAL; /* the template already placed BOS and the turn markers */
    }
    size_t n_ids = 0;
    if (dsp_cli_tokenize(tok, text, tlen, flags, &ids, &n_ids)) {
        dsp_cli_fail("generate", "tokenizing the prompt: %s", dsp_last_error());
        goto out;
    }
    if (o.json && o.gp.logprobs >= 0) {
        ss.lp = open_memstream(&ss.lp_buf, &ss.lp_len);
        ss.first_lp = true;
    }
    dsp_gen_result res;
    if (dsp_generate(c, ids, n_ids, &o.gp, on_token, &ss, &res)) {
        if (!o.json) fputc('\n', stdout);
        dsp_cli_fail("generate", "%s", dsp_last_error());
        goto out;
    }
    double tps = res.decode_ms > 0 ? (double)res.n_generated / (res.decode_ms / 1e3) : 0;
    if (o.json) {
        if (ss.lp) fclose(ss.lp), ss.lp = NULL;
        printf("{\"text\": ");
        json_str(stdout, ss.text ? ss.text : "", ss.n_text);
        printf(", \"token_ids\": [");
        for (size_t i = 0; i < ss.n_ids; i++) printf("%s%d", i ? ", " : "", ss.ids[i]);
        printf("], \"n_prompt\": %zu, \"n_generated\": %zu, \"finish_reason\": \"%s\"", res.n_prompt, res.n_generated, dsp_finish_to_string(res.finish));
        if (ss.lp_buf) printf(", \"logprobs\": [%s]", ss.lp_buf);
        printf(", ");
        dsp_cli_print_spec_json(stdout, &o.gp, &res);
        printf(", \"timings\": {\"load_ms\": %.1f, \"prefill_ms\": %.1f, \"decode_ms\": %.1f, \"decode_tok_per_s\": %.2f}}\n", load_ms,
               res.prefill_ms, res.decode_ms, tps);
    } else {
        fputc('\n', stdout);
        fprintf(stderr, "dspark: %zu prompt tokens in %.0f ms, %zu generated in %.0f ms (%.1f tok/s), finish: %s\n", res.n_prompt, res.prefill_ms,
                res.n_generated, res.decode_ms, tps, dsp_finish_to_string(res.finish));
        if (o.gp.mode != DSP_SPEC_BASELINE && res.n_rounds)
            fprintf(stderr, "dspark: %s: %zu rounds, %.2f tokens per round, %zu/%zu drafts accepted\n",
                    dsp_spec_mode_to_string(dsp_engine_resolve_mode(c, o.gp.mode)), res.n_rounds, (double)res.n_generated / (double)res.n_rounds,
                    res.n_accepted, res.n_drafted);
    }
    rc = 0;
out:
    if (trace) fclose(trace);
    if (ss.lp) fclose(ss.lp);
    free(ss.lp_buf);
    free(ss.text);
    free(ss.ids);
    free(ids);
    free(rendered);
    free(ptext);
    dsp_engine_destroy(c);
    dsp_model_destroy(m);
    return rc;
}
