/* cli/cmd_template: `dspark template` renders a chat template with a JSON context and prints the
 * prompt exactly (no newline added). Used by people checking a model's prompt format and by the
 * jinja2 oracle test (tests/py/test_template.py). */
#include "cli/cli.h"

#include "core/file.h"
#include "core/status.h"
#include "dspark.h"
#include "template/template.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark template (-t TEMPLATE_FILE | -m MODEL) --context CONTEXT.json [--now UNIX_SECONDS]\n\n"
            "Render a Jinja chat template (the model's tokenizer.chat_template) the way Hugging Face\n"
            "transformers' apply_chat_template does, and print the prompt to stdout exactly.\n\n"
            "  -t, --template FILE   the template source (UTF-8)\n"
            "  -m, --model FILE      take the template from a GGUF model's tokenizer.chat_template\n"
            "  -c, --context FILE    JSON object of template variables: messages,\n"
            "                        add_generation_prompt, bos_token, eos_token, tools,\n"
            "                        enable_thinking, ... ('-' reads stdin)\n"
            "      --now SECONDS     pin strftime_now() to this Unix time, formatted in UTC\n"
            "                        (default: the current local time)\n"
            "  -h, --help            this help\n\n"
            "A template error, or raise_exception() in the template, prints the message to stderr\n"
            "and exits with status 1.\n");
}

int dsp_cmd_template(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *tpath = NULL, *cpath = NULL, *mpath = NULL;
    dsp_tmpl_render_opts opts = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(a, "-t") || !strcmp(a, "--template")) && has_val) tpath = argv[++i];
        else if ((!strcmp(a, "-c") || !strcmp(a, "--context")) && has_val) cpath = argv[++i];
        else if (!strcmp(a, "--now") && has_val) {
            char *end;
            errno = 0;
            long long v = strtoll(argv[++i], &end, 10);
            if (errno || *end || end == argv[i]) return dsp_cli_fail("template", "--now: bad number '%s'", argv[i]);
            opts.has_now = true;
            opts.now = v;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) {
            mpath = argv[++i];
        } else {
            usage(stderr);
            return dsp_cli_fail("template", "unknown or incomplete option '%s'", a);
        }
    }
    if (!tpath == !mpath || !cpath) {
        usage(stderr);
        return dsp_cli_fail("template", "need one of -t TEMPLATE_FILE or -m MODEL, and --context CONTEXT.json");
    }
    size_t tlen;
    char *src;
    if (mpath) {
        dsp_model_params mp = dsp_model_default_params();
        mp.vocab_only = true;
        dsp_model *m;
        if (dsp_model_load(mpath, &mp, &m)) return dsp_cli_fail("template", "%s", dsp_last_error());
        const char *ts = dsp_model_chat_template(m, &tlen);
        src = ts ? malloc(tlen + 1) : NULL;
        if (src) memcpy(src, ts, tlen), src[tlen] = '\0';
        dsp_model_destroy(m);
        if (!src) return dsp_cli_fail("template", "%s: %s", mpath, ts ? "no memory" : "the model has no chat template");
        tpath = mpath;
    } else {
        if (dsp_file_read(tpath, (size_t)256 << 20, &src, &tlen)) return dsp_cli_fail("template", "%s", dsp_last_error());
    }
    json_error_t jerr;
    json_t *ctx = !strcmp(cpath, "-") ? json_loadf(stdin, JSON_ALLOW_NUL, &jerr)
                                      : json_load_file(cpath, JSON_ALLOW_NUL, &jerr);
    if (!ctx) {
        free(src);
        return dsp_cli_fail("template", "%s: line %d column %d: %s", cpath, jerr.line, jerr.column, jerr.text);
    }
    if (!json_is_object(ctx)) {
        free(src);
        json_decref(ctx);
        return dsp_cli_fail("template", "%s: the context must be a JSON object", cpath);
    }
    dsp_tmpl *t = NULL;
    dsp_status st = dsp_tmpl_create(&t, src, tlen, NULL);
    free(src);
    if (st) {
        json_decref(ctx);
        return dsp_cli_fail("template", "%s: %s", tpath, dsp_last_error());
    }
    char *out = NULL;
    size_t n = 0;
    st = dsp_tmpl_render(t, ctx, &opts, &out, &n);
    dsp_tmpl_destroy(t);
    json_decref(ctx);
    if (st) return dsp_cli_fail("template", "%s: %s", tpath, dsp_last_error());
    size_t w = fwrite(out, 1, n, stdout);
    free(out);
    if (w != n || fflush(stdout)) return dsp_cli_fail("template", "write error");
    return 0;
}
