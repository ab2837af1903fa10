/* cli/cmd_info: `dspark info MODEL [--json]`: what a model file holds. */
#include "cli/cli.h"

#include "dspark.h"
#include "spec/block.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dspark info MODEL [--draft-model D] [--json]\n\n"
               "MODEL is a GGUF file, a Hugging Face model directory, or a repo id org/name[@rev]\n"
               "in the Hugging Face cache. Shows the architecture, parameter count, bytes per tensor\n"
               "type, context length, tokenizer kind and vocabulary size, the chat template and where\n"
               "it came from, and the sampling defaults with their source.\n\n"
               "  --draft-model D  also load this DFlash/DSpark drafter, check that it fits the model, and show\n"
               "                   it and the speculation mode --mode auto picks with it\n"
               "  --json     print one JSON object instead of text\n");
}

static void human(char *buf, size_t n, double v, const char *unit) {
    const char *pre[] = {"", "K", "M", "G", "T"};
    int i = 0;
    while (v >= 1000 && i < 4) v /= 1000, i++;
    snprintf(buf, n, i ? "%.2f %s%s" : "%.0f %s%s", v, pre[i], unit);
}

/* The sampling defaults a request gets when it omits a field: the model's generation_config.json,
 * else dspark's own (the CLI: greedy; the server: OpenAI's temperature 1, top_p 1). */
typedef struct sd_row {
    const char *name;
    unsigned bit;
    double value, dflt;
} sd_row;

static int sd_rows(const dsp_gen_defaults *d, sd_row *r) {
    sd_row rows[] = {{"temperature", DSP_GEN_HAS_TEMPERATURE, d->temperature, 0},
                     {"top_p", DSP_GEN_HAS_TOP_P, d->top_p, 1},
                     {"top_k", DSP_GEN_HAS_TOP_K, d->top_k, 0},
                     {"min_p", DSP_GEN_HAS_MIN_P, d->min_p, 0},
                     {"repetition_penalty", DSP_GEN_HAS_REPETITION_PENALTY, d->repetition_penalty, 1}};
    memcpy(r, rows, sizeof rows);
    return (int)(sizeof rows / sizeof rows[0]);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int dsp_cmd_info(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *path = NULL, *draft = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--draft-model") && i + 1 < argc) draft = argv[++i];
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (argv[i][0] == '-') return usage(stderr), dsp_cli_fail("info", "unknown option '%s'", argv[i]), 2;
        else if (!path) path = argv[i];
        else return usage(stderr), 2;
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    dsp_model_params mp = dsp_model_default_params();
    mp.vocab_only = !draft; /* the drafter's checks need the model's weights (mapped, not read) */
    dsp_model *m;
    if (dsp_model_load(path, &mp, &m) != DSP_OK) return dsp_cli_fail("info", "%s", dsp_last_error());
    dsp_block_drafter *bd = NULL;
    if (draft && dsp_block_load(draft, m, &bd)) {
        int rc = dsp_cli_fail("info", "%s", dsp_last_error());
        dsp_model_destroy(m);
        return rc;
    }
    const dsp_block_info *bi = bd ? dsp_block_get_info(bd) : NULL;
    dsp_model_info in;
    dsp_model_get_info(m, &in);
    dsp_gen_defaults gd;
    dsp_model_gen_defaults(m, &gd);
    sd_row sd[8];
    int nsd = sd_rows(&gd, sd);
    if (json) {
        printf("{\"path\": ");
        json_str(stdout, in.path);
        printf(", \"format\": ");
        json_str(stdout, in.format);
        printf(", \"gguf_version\": %u, \"n_files\": %u, \"file_size\": %" PRIu64 ", \"architecture\": ", in.gguf_version, in.n_files,
               in.file_size);
        json_str(stdout, in.arch);
        printf(", \"name\": ");
        json_str(stdout, in.name);
        printf(", \"n_params\": %" PRIu64 ", \"n_tensors\": %" PRIu64 ", \"n_layers\": %u, \"n_embd\": %u, \"n_ff\": %u, "
               "\"n_head\": %u, \"n_head_kv\": %u, \"context_length\": %u, \"tokenizer\": {\"model\": ",
               in.n_params, in.n_tensors, in.n_layers, in.n_embd, in.n_ff, in.n_head, in.n_head_kv, in.n_ctx_train);
        json_str(stdout, in.tok_model);
        printf(", \"pre\": ");
        json_str(stdout, in.tok_pre);
        printf(", \"vocab_size\": %u}, \"chat_template\": %s, \"chat_template_origin\": ", in.n_vocab, in.has_chat_template ? "true" : "false");
        json_str(stdout, in.chat_template_origin ? in.chat_template_origin : "");
        printf(", \"sampling_defaults\": {");
        for (int i = 0; i < nsd; i++) {
            bool has = gd.has & sd[i].bit;
            printf("%s\"%s\": {\"value\": %.6g, \"source\": ", i ? ", " : "", sd[i].name, has ? sd[i].value : sd[i].dflt);
            json_str(stdout, has ? gd.source : "dspark default");
            printf("}");
        }
        printf("}, \"tensor_types\": {");
        bool first = true;
        for (int t = 0; t < 40; t++) {
            if (!in.type_count[t]) continue;
            printf("%s\"%s\": {\"tensors\": %u, \"bytes\": %" PRIu64 "}", first ? "" : ", ", dsp_tensor_type_name((uint32_t)t),
                   in.type_count[t], in.type_bytes[t]);
            first = false;
        }
        printf("}");
        if (bi) {
            printf(", \"drafter\": {\"path\": ");
            json_str(stdout, bi->path);
            printf(", \"kind\": \"%s\", \"layout\": \"%s\", \"block\": %d, \"drafts_per_block\": %d, \"layers\": %d, \"tap_layers\": [",
                   bi->dspark ? "dspark" : "dflash", bi->layout_name, bi->block, bi->n_draft, bi->n_layers);
            for (int i = 0; i < bi->n_taps; i++) printf("%s%d", i ? ", " : "", bi->tap_layers[i]);
            printf("], \"mask_token\": %d, \"markov_rank\": %d, \"markov_head\": \"%s\", \"confidence_head\": %s, \"shares_embedding\": %s, "
                   "\"shares_lm_head\": %s, \"n_params\": %" PRIu64 "}, \"speculation_mode\": \"%s\"",
                   bi->mask_token, bi->markov_rank, bi->markov_rank ? dsp_markov_type_name(bi->markov_type) : "none", bi->confidence ? "true" : "false",
                   bi->shares_embd ? "true" : "false",
                   bi->shares_head ? "true" : "false", bi->n_params, bi->dspark ? "dspark" : "dflash");
        }
        printf("}\n");
    } else {
        char a[32], b[32];
        human(a, sizeof a, (double)in.n_params, "");
        human(b, sizeof b, (double)in.file_size, "B");
        printf("model:          %s\n", in.path);
        printf("name:           %s\n", in.name[0] ? in.name : "(none)");
        printf("architecture:   %s\n", in.arch);
        printf("parameters:     %s (%" PRIu64 ")\n", a, in.n_params);
        if (in.gguf_version) printf("file:           %s, GGUF v%u, %" PRIu64 " tensors\n", b, in.gguf_version, in.n_tensors);
        else printf("files:          %s in %u safetensors file%s, %" PRIu64 " tensors\n", b, in.n_files, in.n_files == 1 ? "" : "s", in.n_tensors);
        printf("layers:         %u, embedding %u, feed-forward %u, heads %u (kv %u)\n", in.n_layers, in.n_embd, in.n_ff, in.n_head,
               in.n_head_kv);
        printf("context length: %u\n", in.n_ctx_train);
        printf("tokenizer:      %s%s%s%s, vocabulary %u\n", in.tok_model[0] ? in.tok_model : "(none)", in.tok_pre[0] ? " (pre: " : "",
               in.tok_pre, in.tok_pre[0] ? ")" : "", in.n_vocab);
        printf("chat template:  %s%s%s%s\n", in.has_chat_template ? "present" : "absent", in.has_chat_template ? " (" : "",
               in.has_chat_template ? in.chat_template_origin : "", in.has_chat_template ? ")" : "");
        printf("sampling defaults (requests that omit a field):\n");
        for (int i = 0; i < nsd; i++) {
            bool has = gd.has & sd[i].bit;
            if (has) printf("  %-19s %-8g from %s\n", sd[i].name, sd[i].value, gd.source);
            else printf("  %-19s %-8s dspark default (CLI %g; server %g)\n", sd[i].name, "-", sd[i].dflt,
                        sd[i].bit == DSP_GEN_HAS_TEMPERATURE ? 1.0 : sd[i].dflt);
        }
        printf("tensor types:\n");
        for (int t = 0; t < 40; t++) {
            if (!in.type_count[t]) continue;
            human(b, sizeof b, (double)in.type_bytes[t], "B");
            printf("  %-8s %4u tensors  %10s\n", dsp_tensor_type_name((uint32_t)t), in.type_count[t], b);
        }
    }
    if (bi && !json) {
        char a[32];
        human(a, sizeof a, (double)bi->n_params, "");
        printf("drafter:        %s\n", bi->path);
        printf("  kind:         %s (%s layout), block %d: %d drafts per block (%s)\n", bi->dspark ? "DSpark" : "DFlash", bi->layout_name, bi->block,
               bi->n_draft, bi->slot0 ? "slots 1.. predict their own positions" : "slot k predicts position k+1");
        printf("  layers:       %d, taps of model layers", bi->n_layers);
        for (int i = 0; i < bi->n_taps; i++) printf("%s%d", i ? ", " : " ", bi->tap_layers[i]);
        if (bi->markov_rank) printf("\n  heads:        Markov (%s, rank %d)%s\n", dsp_markov_type_name(bi->markov_type), bi->markov_rank, bi->confidence ? ", confidence" : ", no confidence");
        else printf("\n  heads:        no Markov%s\n", bi->confidence ? ", confidence" : ", no confidence");
        printf("  parameters:   %s of its own; embedding %s, LM head %s\n", a, bi->shares_embd ? "shared with the model" : "its own copy",
               bi->shares_head ? "shared with the model" : "its own copy");
        printf("  fits:         yes (hidden size, vocabulary, tap layers, mask token %d)\n", bi->mask_token);
        printf("speculation:    --mode auto uses %s\n", bi->dspark ? "dspark" : "dflash");
    }
    dsp_block_destroy(bd);
    dsp_model_destroy(m);
    return 0;
}
