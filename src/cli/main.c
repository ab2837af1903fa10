/* cli/main: `dspark <command> [args]` dispatch, --help and --version. */
#include "cli/cli.h"

#include "core/log.h"
#include "core/version.h"
#include "dspark.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const dsp_cli_cmd g_cmds[] = {
    {"serve", "an OpenAI-compatible HTTP server (chat and completions, streaming)", dsp_cmd_serve},
    {"generate", "generate a completion of a prompt, streamed as it is decoded", dsp_cmd_generate},
    {"chat", "interactive chat in the terminal", dsp_cmd_chat},
    {"batch", "generate answers for a file of requests (JSON lines), many at a time", dsp_cmd_batch},
    {"info", "show a model's architecture, sizes, tensor types and tokenizer", dsp_cmd_info},
    {"tokenize", "print the token ids of a text as a JSON array", dsp_cmd_tokenize},
    {"detokenize", "print the text of token ids", dsp_cmd_detokenize},
    {"template", "render a chat template with a JSON context (as transformers does)", dsp_cmd_template},
    {"benchmark", "measure prefill, decode and the verify cost curve of a model on this machine", dsp_cmd_benchmark},
    {"pull", "download a Hugging Face repo into the hub cache (resumable, verified)", dsp_cmd_pull},
};
#define N_CMDS (sizeof g_cmds / sizeof g_cmds[0])

bool dsp_cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    }
    return false;
}

int dsp_cli_fail(const char *cmd, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dspark %s: %s\n", cmd, buf);
    return 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "dspark %s (%s): lossless speculative decoding for LLMs\n\n"
            "usage: dspark <command> [options]\n\ncommands:\n",
            DSP_VERSION, dsp_git_commit);
    for (size_t i = 0; i < N_CMDS; i++) fprintf(f, "  %-12s %s\n", g_cmds[i].name, g_cmds[i].summary);
    fprintf(f, "\n`dspark <command> --help` shows a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("dspark %s (commit %s)\n", DSP_VERSION, dsp_git_commit);
        return 0;
    }
    (void)dsp_log_get_level(); /* reads DSPARK_LOG now: a bad value is reported before any work */
    for (size_t i = 0; i < N_CMDS; i++)
        if (!strcmp(argv[1], g_cmds[i].name)) return g_cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "dspark: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
