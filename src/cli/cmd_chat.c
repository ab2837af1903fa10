/* cli/cmd_chat: `dspark chat`, an interactive chat. Each turn renders the whole conversation with
 * the model's chat template and generates from it; the engine's prefix cache holds the KV of the
 * earlier turns, so only the new turn is computed. */
#include "cli/cli.h"

#include "dspark.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dspark chat -m MODEL [--system TEXT] [options]\n\n"
               "An interactive chat on the terminal. Type a message and press Enter; an empty line or\n"
               "Ctrl-D ends the session, /reset starts a new conversation. Earlier turns stay in the\n"
               "KV cache and are not recomputed.\n\n"
               "  -m, --model PATH        GGUF model file\n"
               "      --system TEXT       system message\n"
               "      --chat-template F   use this Jinja template instead of the model's\n"
               "  -n, --max-tokens N      tokens per reply at most (default 1024)\n"
               "      --temperature T, --top-p P, --top-k K, --min-p P, --seed S,\n"
               "      --presence-penalty X, --frequency-penalty X, --repeat-penalty X, --stop TEXT\n"
               "      --mode auto|dspark|dflash|hybrid|lookup|baseline, --max-draft N|auto, --dspark-threshold T,\n"
               "      --hybrid-min N, --lookup-min N, --lookup-max N, --draft-model D,\n"
               "      --draft-vocab N|auto\n"
               "                          speculative decoding (lossless; default auto, see dspark generate -h)\n"
               DSP_CLI_ENGINE_HELP);
}

typedef struct reply {
    char *text;
    size_t n, cap;
} reply;

static bool on_token(const dsp_token_event *ev, void *user) {
    reply *r = user;
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (r->n + ev->text_len + 1 > r->cap) {
        size_t nc = (r->n + ev->text_len + 1) * 2;
        char *nb = realloc(r->text, nc);
        if (!nb) return false;
        r->text = nb, r->cap = nc;
    }
    memcpy(r->text + r->n, ev->text, ev->text_len);
    r->n += ev->text_len;
    return true;
}

int dsp_cmd_chat(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *model = NULL, *system = NULL, *tfile = NULL;
    dsp_gen_params gp = dsp_gen_default_params();
    gp.max_tokens = 1024;
    dsp_cli_spec_defaults(&gp);
    dsp_engine_params cp = dsp_engine_default_params();
    cp.max_batch = 1;
    int n_stop = 0;
    for (int i = 1; i < argc; i++) {
        bool handled;
        int rc = dsp_cli_parse_gen_opt(argc, argv, &i, &gp, &n_stop, &cp, &handled);
        if (rc) return rc;
        if (handled) continue;
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) model = argv[++i];
        else if (!strcmp(a, "--system") && has_val) system = argv[++i];
        else if (!strcmp(a, "--chat-template") && has_val) tfile = argv[++i];
        else {
            fprintf(stderr, "dspark chat: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    dsp_model_params mp = dsp_model_default_params();
    mp.progress = isatty(2);
    mp.quantize = dsp_cli_quantize;
    mp.n_threads = cp.n_threads;
    dsp_model *m = NULL;
    dsp_engine *c = NULL;
    if (dsp_model_load(model, &mp, &m) || dsp_engine_create(m, &cp, &c)) {
        int rc = dsp_cli_fail("chat", "%s", dsp_last_error());
        dsp_engine_destroy(c), dsp_model_destroy(m);
        return rc;
    }
    dsp_cli_sampling_defaults(m, &gp);
    dsp_cli_log_spec(c, &gp);
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    json_t *msgs = json_array();
    if (system) dsp_cli_add_message(msgs, "system", system, strlen(system));
    bool tty = isatty(0);
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 0;
    for (;;) {
        if (tty) fputs("\n> ", stdout), fflush(stdout);
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n <= 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n == 0) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(msgs);
            if (system) dsp_cli_add_message(msgs, "system", system, strlen(system));
            fprintf(stderr, "[new conversation]\n");
            continue;
        }
        dsp_cli_add_message(msgs, "user", line, (size_t)n);
        char *prompt = NULL;
        size_t plen;
        if (dsp_cli_render_messages(m, tfile, msgs, &prompt, &plen)) {
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        size_t n_ids = 0;
        int32_t *ids = NULL;
        reply r = {0};
        dsp_gen_result res;
        if (dsp_cli_tokenize(tok, prompt, plen, DSP_TOKENIZE_PARSE_SPECIAL, &ids, &n_ids) ||
            dsp_generate(c, ids, n_ids, &gp, on_token, &r, &res)) {
            if (r.n) fputc('\n', stdout); /* end the partial reply's line; nothing was printed otherwise */
            fflush(stdout);
            dsp_cli_fail("chat", "%s", dsp_last_error());
            json_array_remove(msgs, json_array_size(msgs) - 1);
        } else {
            fputc('\n', stdout);
            dsp_cli_add_message(msgs, "assistant", r.text ? r.text : "", r.n);
            if (tty)
                fprintf(stderr, "[%zu prompt tokens (%zu cached), %zu generated, %.1f tok/s]\n", res.n_prompt, res.n_cached, res.n_generated,
                        res.decode_ms > 0 ? (double)res.n_generated * 1e3 / res.decode_ms : 0.0);
        }
        free(r.text);
        free(ids);
        free(prompt);
    }
    free(line);
    json_decref(msgs);
    dsp_engine_destroy(c);
    dsp_model_destroy(m);
    return rc;
}
