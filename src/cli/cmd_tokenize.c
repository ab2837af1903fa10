/* cli/cmd_tokenize: `dspark tokenize` (text -> JSON array of ids) and `dspark detokenize`
 * (ids -> text). The tokenizer comes from the model loaded vocab-only (no weights are touched). */
#include "cli/cli.h"

#include "core/file.h"
#include "dspark.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_tok {
    dsp_model *m;
    const dsp_tokenizer *t;
} cli_tok;

/* a growable id list */
typedef struct id_list {
    int32_t *v;
    size_t n, cap;
} id_list;

static int push_id(id_list *l, int32_t id) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        int32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return 1;
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = id;
    return 0;
}

static int open_tokenizer(const char *cmd, const char *path, cli_tok *ct) {
    memset(ct, 0, sizeof *ct);
    dsp_model_params mp = dsp_model_default_params();
    mp.vocab_only = true;
    if (dsp_model_load(path, &mp, &ct->m)) return dsp_cli_fail(cmd, "%s", dsp_last_error()); /* names the path */
    ct->t = dsp_model_tokenizer(ct->m);
    if (!ct->t) {
        dsp_model_destroy(ct->m);
        return dsp_cli_fail(cmd, "%s: the model has no tokenizer (no tokenizer.ggml.model)", path);
    }
    return 0;
}

static void close_tokenizer(cli_tok *ct) { dsp_model_destroy(ct->m); }

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: dspark tokenize -m MODEL [--special] [--no-bos] [--file F | TEXT]\n\n"
               "Print the token ids of TEXT (or of file F, '-' for stdin) as a JSON array.\n\n"
               "  -m, --model MODEL  GGUF model file (its tokenizer metadata is enough)\n"
               "  --special          match special-token text such as <|im_start|> as the special token\n"
               "                     (default: such text is tokenized as plain text)\n"
               "  --no-bos           do not add BOS/EOS even where the model's metadata asks for them\n"
               "  --file F           read the text from F\n");
}

int dsp_cmd_tokenize(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        tokenize_usage(stdout);
        return 0;
    }
    const char *model = NULL, *file = NULL, *text = NULL;
    int flags = DSP_TOKENIZE_ADD_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--special")) flags |= DSP_TOKENIZE_PARSE_SPECIAL;
        else if (!strcmp(a, "--no-bos")) flags &= ~DSP_TOKENIZE_ADD_SPECIAL;
        else if (!strcmp(a, "--file") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(a, "--") && i + 1 < argc && !text) text = argv[++i];
        else if (a[0] == '-' && a[1]) {
            tokenize_usage(stderr);
            return dsp_cli_fail("tokenize", "unknown or incomplete option '%s'", a);
        } else if (!text) text = a;
        else return dsp_cli_fail("tokenize", "more than one TEXT argument (quote the text)");
    }
    if (!model) {
        tokenize_usage(stderr);
        return dsp_cli_fail("tokenize", "-m MODEL is required");
    }
    if (!!file == !!text) {
        tokenize_usage(stderr);
        return dsp_cli_fail("tokenize", "give exactly one of --file F or TEXT");
    }
    size_t len = 0;
    char *owned = NULL;
    if (file) {
        if (dsp_file_read(file, (size_t)1 << 30, &owned, &len)) return dsp_cli_fail("tokenize", "%s", dsp_last_error());
        text = owned;
    } else {
        len = strlen(text);
    }
    cli_tok ct;
    if (open_tokenizer("tokenize", model, &ct)) {
        free(owned);
        return 1;
    }
    int rc = 0;
    size_t n = 0;
    int32_t *ids = NULL;
    dsp_status st = dsp_tokenize(ct.t, text, len, flags, NULL, 0, &n); /* the count first */
    if (st == DSP_OK || st == DSP_ERR_RANGE) st = (ids = malloc((n ? n : 1) * sizeof *ids)) ? dsp_tokenize(ct.t, text, len, flags, ids, n, &n)
                                                                                          : dsp_error(DSP_ERR_NOMEM, "out of memory");
    if (st) {
        rc = dsp_cli_fail("tokenize", "%s", dsp_last_error());
    } else {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
        printf("]\n");
    }
    free(ids);
    close_tokenizer(&ct);
    free(owned);
    return rc;
}

static void detokenize_usage(FILE *f) {
    fprintf(f, "usage: dspark detokenize -m MODEL [--skip-special] IDS...\n\n"
               "Print the text of the token ids (separate arguments, or one argument such as\n"
               "\"[1, 2, 3]\" or \"1 2 3\"), followed by a newline.\n\n"
               "  -m, --model MODEL  GGUF model file\n"
               "  --skip-special     leave out special tokens (BOS, EOS, <|im_end|>, ...)\n");
}

/* Parse ids out of s: integers separated by spaces, commas or brackets. */
static int parse_ids(const char *s, id_list *ids) {
    while (*s) {
        if (strchr(" \t\n\r,[]", *s)) {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) return dsp_cli_fail("detokenize", "bad token id near '%.20s'", s);
        if (push_id(ids, (int32_t)v)) return dsp_cli_fail("detokenize", "out of memory");
        s = end;
    }
    return 0;
}

int dsp_cmd_detokenize(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        detokenize_usage(stdout);
        return 0;
    }
    const char *model = NULL;
    int flags = 0;
    id_list ids = {0};
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--skip-special")) flags |= DSP_DETOKENIZE_SKIP_SPECIAL;
        else if (a[0] == '-' && a[1] && !(a[1] >= '0' && a[1] <= '9')) {
            detokenize_usage(stderr);
            rc = dsp_cli_fail("detokenize", "unknown or incomplete option '%s'", a);
        } else rc = parse_ids(a, &ids);
    }
    if (!rc && !model) {
        detokenize_usage(stderr);
        rc = dsp_cli_fail("detokenize", "-m MODEL is required");
    }
    cli_tok ct;
    if (!rc && !(rc = open_tokenizer("detokenize", model, &ct))) {
        char *text = NULL;
        size_t len = 0;
        dsp_status st = dsp_detokenize(ct.t, ids.v, ids.n, flags, NULL, 0, &len); /* the length first */
        if (st == DSP_OK || st == DSP_ERR_RANGE)
            st = (text = malloc(len + 1)) ? dsp_detokenize(ct.t, ids.v, ids.n, flags, text, len + 1, &len) : dsp_error(DSP_ERR_NOMEM, "out of memory");
        if (st) {
            rc = dsp_cli_fail("detokenize", "%s", dsp_last_error());
        } else {
            fwrite(text, 1, len, stdout);
            putchar('\n');
        }
        free(text);
        close_tokenizer(&ct);
    }
    free(ids.v);
    return rc;
}
