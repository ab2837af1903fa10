/* cli/cmd_chat: `dspark chat`, an interactive chat; and the chat-rendering helper that
 * `dspark generate --chat` shares. Each turn renders the whole conversation with the model's
 * chat template and generates on the same sequence, so the KV cache of earlier turns is reused
 * (dsp_generate keeps the common prefix) and only the new turn is computed. */
#include "cli/cli.h"

#include "dspark.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double dsp_cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Render messages (a JSON array) with add_generation_prompt; template_file overrides the model's. */
static int render_messages(const dsp_model *m, const char *template_file, json_t *messages, char **out, size_t *out_len) {
    char *tsrc = NULL;
    if (template_file && !(tsrc = read_all(template_file))) return dsp_cli_fail("chat", "%s: %s", template_file, strerror(errno));
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

static void add_message(json_t *messages, const char *role, const char *content, size_t len) {
    json_array_append_new(messages, json_pack("{s:s, s:s%}", "role", role, "content", content, len));
}

int dsp_cli_render_chat(const dsp_model *m, const char *template_file, const char *system, const char *user, size_t user_len, char **out,
                        size_t *out_len) {
    json_t *msgs = json_array();
    if (system) add_message(msgs, "system", system, strlen(system));
    add_message(msgs, "user", user, user_len);
    int rc = render_messages(m, template_file, msgs, out, out_len);
    json_decref(msgs);
    return rc;
}

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
               "      --mode baseline|lookup|auto, --max-draft N, --lookup-min N, --lookup-max N\n"
               "                          speculative decoding (lossless; default auto, see dspark generate -h)\n"
               "  -c, --ctx N             context length (default min(model, 4096))\n"
               "  -t, --threads N         threads (default: physical cores)\n");
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
    dsp_ctx_params cp = dsp_ctx_default_params();
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
    dsp_model *m = NULL;
    dsp_ctx *c = NULL;
    dsp_seq *s = NULL;
    if (dsp_model_load(model, &mp, &m) || dsp_ctx_create(m, &cp, &c) || dsp_seq_create(c, &s)) {
        int rc = dsp_cli_fail("chat", "%s", dsp_last_error());
        dsp_seq_destroy(s), dsp_ctx_destroy(c), dsp_model_destroy(m);
        return rc;
    }
    const dsp_tokenizer *tok = dsp_model_tokenizer(m);
    json_t *msgs = json_array();
    if (system) add_message(msgs, "system", system, strlen(system));
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
            if (system) add_message(msgs, "system", system, strlen(system));
            fprintf(stderr, "[new conversation]\n");
            continue;
        }
        add_message(msgs, "user", line, (size_t)n);
        char *prompt = NULL;
        size_t plen;
        if (render_messages(m, tfile, msgs, &prompt, &plen)) {
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        size_t n_ids = 0;
        dsp_tokenize(tok, prompt, plen, DSP_TOKENIZE_PARSE_SPECIAL, NULL, 0, &n_ids);
        int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
        reply r = {0};
        dsp_gen_result res;
        if (!ids || dsp_tokenize(tok, prompt, plen, DSP_TOKENIZE_PARSE_SPECIAL, ids, n_ids, &n_ids) ||
            dsp_generate(c, s, ids, n_ids, &gp, on_token, &r, &res)) {
            if (r.n) fputc('\n', stdout); /* end the partial reply's line; nothing was printed otherwise */
            fflush(stdout);
            dsp_cli_fail("chat", "%s", dsp_last_error());
            json_array_remove(msgs, json_array_size(msgs) - 1);
        } else {
            fputc('\n', stdout);
            add_message(msgs, "assistant", r.text ? r.text : "", r.n);
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
    dsp_seq_destroy(s);
    dsp_ctx_destroy(c);
    dsp_model_destroy(m);
    return rc;
}
