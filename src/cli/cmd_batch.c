/* cli/cmd_batch: `dspark batch`: offline generation for a file of requests (JSON lines), all of
 * them through the engine's batched round loop, the way `dspark serve` runs concurrent requests.
 * Each answer is what `dspark generate` gives for that request alone (batch invariance). */
#include "cli/cli.h"

#include "dspark.h"

#include <jansson.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark batch -m MODEL [-i IN.jsonl] [-o OUT.jsonl] [options]\n\n"
            "Generates an answer for every request of a JSON-lines file, many at a time (--max-batch), and\n"
            "writes one JSON line per request as each finishes (not in input order: match them by \"index\",\n"
            "the request's line number from 0 among non-blank lines, or by your own \"id\", echoed).\n\n"
            "A request: {\"messages\": [...]} (rendered with the chat template), {\"prompt\": \"text\"} or\n"
            "{\"prompt_ids\": [token ids]}; optional \"id\" (any JSON value), \"max_tokens\", \"temperature\",\n"
            "\"top_p\", \"top_k\", \"min_p\" and \"seed\" override the command line's for that request.\n"
            "An answer: {\"index\", \"id\", \"text\", \"token_ids\" (the generated tokens, an end-of-generation\n"
            "token included), \"n_prompt\", \"n_generated\", \"finish_reason\"} (+ \"prompt_token_ids\" with\n"
            "--prompt-ids), or {\"index\", \"id\", \"error\": {\"message\"}} for a request that could not run (bad\n"
            "JSON, a prompt longer than the context, ...): the others go on.\n\n"
            "  -m, --model MODEL       GGUF file, Hugging Face directory, or repo id org/name[@rev] (HF cache)\n"
            "  -i, --input F           requests (default '-': stdin)\n"
            "  -o, --output F          answers (default '-': stdout)\n"
            "      --prompt-ids        also write each request's prompt token ids\n"
            "      --chat-template F   use this Jinja template instead of the model's\n"
            "  -n, --max-tokens N      tokens to generate at most per request (default 256)\n"
            "      --temperature T, --top-p P, --top-k K, --min-p P, --seed S, --stop TEXT, --ignore-eos,\n"
            "      --presence-penalty X, --frequency-penalty X, --repeat-penalty X   as for dspark generate\n"
            DSP_CLI_SPEC_HELP
            "      --max-batch N       requests decoded together (default 8)\n"
            DSP_CLI_ENGINE_HELP
            "  -h, --help              this help\n",
            DSP_CLI_STR(DSP_CLI_DEFAULT_MAX_DRAFT));
}

/* one request in flight */
typedef struct item {
    size_t index;
    json_t *id;          /* the request's "id", or NULL */
    int32_t *prompt;     /* with --prompt-ids */
    size_t n_prompt;
    int32_t *ids;        /* generated tokens */
    size_t n_ids, cap_ids;
    char *text;
    size_t n_text, cap_text;
    bool oom;
} item;

static void item_free(item *it) {
    if (!it) return;
    json_decref(it->id);
    free(it->prompt);
    free(it->ids);
    free(it->text);
    free(it);
}

static void item_token(item *it, const dsp_token_event *t) {
    if (it->n_ids == it->cap_ids) {
        size_t nc = it->cap_ids ? 2 * it->cap_ids : 256;
        int32_t *p = realloc(it->ids, nc * sizeof *p);
        if (!p) { it->oom = true; return; }
        it->ids = p, it->cap_ids = nc;
    }
    it->ids[it->n_ids++] = t->token;
    if (it->n_text + t->text_len + 1 > it->cap_text) {
        size_t nc = 2 * (it->n_text + t->text_len + 1);
        char *p = realloc(it->text, nc);
        if (!p) { it->oom = true; return; }
        it->text = p, it->cap_text = nc;
    }
    memcpy(it->text + it->n_text, t->text, t->text_len);
    it->n_text += t->text_len;
}

static json_t *id_array(const int32_t *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* write one answer line (takes ownership of obj); -1 when the output cannot be written */
static int emit(FILE *out, json_t *obj) {
    int rc = json_dumpf(obj, out, JSON_COMPACT);
    json_decref(obj);
    if (rc || fputc('\n', out) == EOF || fflush(out)) return -1;
    return 0;
}

static int emit_error(FILE *out, size_t index, json_t *id, const char *msg) {
    json_t *o = json_pack("{s:I, s:O?, s:{s:s}}", "index", (json_int_t)index, "id", id, "error", "message", msg);
    if (!o) o = json_pack("{s:I, s:O?, s:{s:s}}", "index", (json_int_t)index, "id", id, "error", "message", "(a message that is not UTF-8)");
    return o ? emit(out, o) : -1;
}

/* a number field of the request line overriding the command line's; false (with *err) when it is
 * not a number in [lo, hi] */
static bool field_num(json_t *req, const char *key, double lo, double hi, double *v, char *err, size_t n_err) {
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return true;
    if (!json_is_number(x) || !(json_number_value(x) >= lo && json_number_value(x) <= hi)) {
        snprintf(err, n_err, "\"%s\" must be a number in [%g, %g]", key, lo, hi);
        return false;
    }
    *v = json_number_value(x);
    return true;
}

/* the request's prompt tokens (malloc'd) and its parameters; false with err on a bad request */
static bool parse_request(const dsp_model *m, const char *tmpl, json_t *req, dsp_gen_params *gp, int32_t **ids, size_t *n_ids,
                          char *err, size_t n_err) {
    *ids = NULL, *n_ids = 0;
    if (!json_is_object(req)) {
        snprintf(err, n_err, "a request must be a JSON object");
        return false;
    }
    double v;
    if (v = gp->max_tokens, !field_num(req, "max_tokens", 1, 1 << 30, &v, err, n_err)) return false;
    gp->max_tokens = (int32_t)v;
    if (v = gp->temperature, !field_num(req, "temperature", 0, 100, &v, err, n_err)) return false;
    gp->temperature = (float)v;
    if (v = gp->top_p, !field_num(req, "top_p", 0, 1, &v, err, n_err)) return false;
    gp->top_p = (float)v;
    if (v = gp->top_k, !field_num(req, "top_k", 0, 1 << 30, &v, err, n_err)) return false;
    gp->top_k = (int32_t)v;
    if (v = gp->min_p, !field_num(req, "min_p", 0, 1, &v, err, n_err)) return false;
    gp->min_p = (float)v;
    if (v = (double)gp->seed, !field_num(req, "seed", 0, 9007199254740991.0, &v, err, n_err)) return false;
    gp->seed = (uint64_t)v;
    json_t *msgs = json_object_get(req, "messages"), *prompt = json_object_get(req, "prompt"), *pids = json_object_get(req, "prompt_ids");
    if ((msgs != NULL) + (prompt != NULL) + (pids != NULL) != 1) {
        snprintf(err, n_err, "a request needs exactly one of \"messages\", \"prompt\" or \"prompt_ids\"");
        return false;
    }
    if (pids) {
        size_t n = json_array_size(pids);
        if (!json_is_array(pids) || !n) {
            snprintf(err, n_err, "\"prompt_ids\" must be a non-empty array of token ids");
            return false;
        }
        if (!(*ids = malloc(n * sizeof **ids))) {
            snprintf(err, n_err, "no memory");
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(pids, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
                snprintf(err, n_err, "\"prompt_ids\"[%zu] is not a token id", i);
                free(*ids), *ids = NULL;
                return false;
            }
            (*ids)[i] = (int32_t)json_integer_value(t);
        }
        *n_ids = n; /* the engine checks them against the vocabulary */
        return true;
    }
    char *rendered = NULL;
    const char *text;
    size_t tlen;
    int flags = DSP_TOKENIZE_ADD_SPECIAL;
    if (msgs) {
        if (!json_is_array(msgs) || !json_array_size(msgs)) {
            snprintf(err, n_err, "\"messages\" must be a non-empty array");
            return false;
        }
        if (dsp_cli_render_messages(m, tmpl, msgs, &rendered, &tlen)) {
            snprintf(err, n_err, "chat template: %s", dsp_last_error());
            return false;
        }
        text = rendered;
        flags = DSP_TOKENIZE_PARSE_SPECIAL; /* the template placed BOS and the turn markers */
    } else {
        if (!json_is_string(prompt)) {
            snprintf(err, n_err, "\"prompt\" must be a string");
            return false;
        }
        text = json_string_value(prompt), tlen = json_string_length(prompt);
    }
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    size_t n = 0;
    bool ok = !dsp_cli_tokenize(tok, text, tlen, flags, ids, &n) && n > 0;
    if (!ok) {
        snprintf(err, n_err, "tokenizing the prompt: %s", n ? dsp_last_error() : "it is empty");
        free(*ids), *ids = NULL;
    }
    *n_ids = n;
    free(rendered);
    return ok;
}

int dsp_cmd_batch(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *model = NULL, *in_path = "-", *out_path = "-", *tmpl = NULL;
    bool want_prompt = false;
    dsp_gen_params gp = dsp_gen_default_params();
    dsp_cli_spec_defaults(&gp);
    dsp_engine_params cp = dsp_engine_default_params();
    int n_stop = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool handled;
        int rc = dsp_cli_parse_gen_opt(argc, argv, &i, &gp, &n_stop, &cp, &handled);
        if (rc) return rc;
        if (handled) continue;
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) model = argv[++i];
        else if ((!strcmp(a, "-i") || !strcmp(a, "--input")) && has_val) in_path = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has_val) out_path = argv[++i];
        else if (!strcmp(a, "--chat-template") && has_val) tmpl = argv[++i];
        else if (!strcmp(a, "--prompt-ids")) want_prompt = true;
        else {
            fprintf(stderr, "dspark batch: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "dspark batch: need -m MODEL\n\n");
        usage(stderr);
        return 2;
    }
    FILE *in = strcmp(in_path, "-") ? fopen(in_path, "r") : stdin;
    if (!in) return dsp_cli_fail("batch", "%s: %s", in_path, strerror(errno));
    FILE *out = strcmp(out_path, "-") ? fopen(out_path, "w") : stdout;
    if (!out) {
        if (in != stdin) fclose(in);
        return dsp_cli_fail("batch", "%s: %s", out_path, strerror(errno));
    }
    double t0 = dsp_cli_now_ms();
    dsp_model_params mp = dsp_model_default_params();
    mp.quantize = dsp_cli_quantize;
    mp.n_threads = cp.n_threads;
    dsp_model *m = NULL;
    dsp_engine *e = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 1;
    size_t n_lines = 0, n_ok = 0, n_failed = 0, in_flight = 0, tok_prompt = 0, tok_gen = 0;
    item **live = NULL; /* the requests in the engine, [in_flight] */
    if (dsp_model_load(model, &mp, &m)) {
        dsp_cli_fail("batch", "%s", dsp_last_error());
        goto done;
    }
    if (dsp_engine_create(m, &cp, &e)) {
        dsp_cli_fail("batch", "%s", dsp_last_error());
        goto done;
    }
    dsp_cli_log_spec(e, &gp);
    dsp_cli_sampling_defaults(m, &gp);
    const size_t window = 2 * (size_t)(cp.max_batch > 0 ? cp.max_batch : 8); /* requests queued beyond the running ones */
    if (!(live = calloc(window, sizeof *live))) {
        dsp_cli_fail("batch", "no memory");
        goto done;
    }
    double t_start = dsp_cli_now_ms();
    bool eof = false;
    while (!eof || in_flight) {
        while (!eof && in_flight < window) {
            ssize_t len = getline(&line, &line_cap, in);
            if (len < 0) {
                if (ferror(in)) {
                    dsp_cli_fail("batch", "reading %s: %s", in_path, strerror(errno));
                    goto done;
                }
                eof = true;
                break;
            }
            if (strspn(line, " \t\r\n") == (size_t)len) continue; /* blank */
            size_t index = n_lines++;
            json_error_t jerr;
            json_t *req = json_loadb(line, (size_t)len, 0, &jerr);
            json_t *id = json_is_object(req) ? json_object_get(req, "id") : NULL;
            char err[256];
            dsp_gen_params p = gp;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            item *it = NULL;
            dsp_req_id rid;
            if (!req) snprintf(err, sizeof err, "malformed JSON at column %d: %s", jerr.column, jerr.text);
            else if (parse_request(m, tmpl, req, &p, &ids, &n_ids, err, sizeof err)) {
                if (!(it = calloc(1, sizeof *it))) snprintf(err, sizeof err, "no memory");
                else if (dsp_engine_submit(e, ids, n_ids, &p, it, &rid)) snprintf(err, sizeof err, "%s", dsp_last_error());
                else {
                    it->index = index;
                    it->id = json_incref(id);
                    if (want_prompt) it->prompt = ids, it->n_prompt = n_ids, ids = NULL;
                    live[in_flight++] = it;
                    free(ids);
                    json_decref(req);
                    continue;
                }
            }
            free(it);
            free(ids);
            n_failed++;
            int wr = emit_error(out, index, id, err);
            json_decref(req);
            if (wr) {
                dsp_cli_fail("batch", "writing %s: %s", out_path, strerror(errno));
                goto done;
            }
        }
        if (!in_flight) continue;
        const dsp_event *ev;
        size_t n_ev;
        if (dsp_engine_step(e, &ev, &n_ev)) {
            dsp_cli_fail("batch", "%s", dsp_last_error());
            goto done;
        }
        for (size_t k = 0; k < n_ev; k++) {
            item *it = ev[k].user;
            if (ev[k].type == DSP_EVENT_TOKEN) {
                item_token(it, &ev[k].tok);
                continue;
            }
            for (size_t j = 0; j < in_flight; j++)
                if (live[j] == it) {
                    live[j] = live[--in_flight];
                    break;
                }
            int wr;
            if (ev[k].status || it->oom) {
                n_failed++;
                wr = emit_error(out, it->index, it->id, it->oom ? "no memory" : ev[k].error ? ev[k].error : "failed");
            } else {
                const dsp_gen_result *res = ev[k].res;
                json_t *o = json_pack("{s:I, s:O?, s:s%, s:o, s:I, s:I, s:s}", "index", (json_int_t)it->index, "id", it->id, "text",
                                      it->text ? it->text : "", it->n_text, "token_ids", id_array(it->ids, it->n_ids), "n_prompt",
                                      (json_int_t)res->n_prompt, "n_generated", (json_int_t)res->n_generated, "finish_reason",
                                      dsp_finish_to_string(res->finish));
                if (o && it->prompt) json_object_set_new(o, "prompt_token_ids", id_array(it->prompt, it->n_prompt));
                if (o) {
                    n_ok++;
                    tok_prompt += res->n_prompt, tok_gen += res->n_generated;
                    wr = emit(out, o);
                } else {
                    n_failed++;
                    wr = emit_error(out, it->index, it->id, "the answer could not be written as JSON");
                }
            }
            item_free(it);
            if (wr) {
                dsp_cli_fail("batch", "writing %s: %s", out_path, strerror(errno));
                goto done;
            }
        }
    }
    double secs = (dsp_cli_now_ms() - t_start) / 1e3;
    fprintf(stderr, "dspark batch: %zu requests (%zu answered, %zu failed), %zu prompt + %zu generated tokens in %.1f s (%.1f generated tok/s; load %.1f s)\n",
            n_lines, n_ok, n_failed, tok_prompt, tok_gen, secs, secs > 0 ? (double)tok_gen / secs : 0.0, (t_start - t0) / 1e3);
    rc = n_failed ? 3 : 0;
done:
    free(line);
    for (size_t j = 0; j < in_flight; j++) item_free(live[j]); /* an error stopped the loop */
    free(live);
    dsp_engine_destroy(e);
    dsp_model_destroy(m);
    if (in != stdin) fclose(in);
    if (out != stdout && fclose(out) && !rc) rc = dsp_cli_fail("batch", "writing %s: %s", out_path, strerror(errno));
    return rc;
}
