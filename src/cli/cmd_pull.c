/* cli/cmd_pull: `dspark pull ORG/NAME[@REV] [--include GLOB]...`: download a Hugging Face repo into
 * the hub cache (io/pull.h), then print its snapshot directory. */
#include "cli/cli.h"

#include "core/status.h"
#include "io/pull.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_INCLUDE 64

static void usage(FILE *f) {
    fprintf(f, "usage: dspark pull ORG/NAME[@REVISION] [--include GLOB]...\n\n"
               "Downloads a model repo from the Hugging Face hub into the cache that transformers, vLLM\n"
               "and mlx-lm share ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub),\n"
               "resuming partial files and checking every file against the hub's SHA-256 or git blob\n"
               "id, then prints the snapshot directory. `-m ORG/NAME` then loads it in every command.\n\n"
               "  --include GLOB   pull only files matching GLOB (repeatable; '*' also matches '/'),\n"
               "                   e.g. --include '*.json' --include '*.safetensors'; default: every file\n\n"
               "environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (private and gated\n"
               "repos; else the token file of `huggingface-cli login`), HF_HUB_OFFLINE=1 (no network:\n"
               "succeeds only if the revision is already in the cache), https_proxy.\n");
}

int dsp_cmd_pull(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *repo = NULL, *include[MAX_INCLUDE];
    int n_include = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--include")) {
            if (i + 1 >= argc) return dsp_cli_fail("pull", "--include needs a glob");
            if (n_include == MAX_INCLUDE) return dsp_cli_fail("pull", "at most %d --include globs", MAX_INCLUDE);
            include[n_include++] = argv[++i];
        } else if (argv[i][0] == '-') {
            usage(stderr);
            return 2;
        } else if (!repo) {
            repo = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!repo) {
        usage(stderr);
        return 2;
    }
    dsp_pull_params p = {.include = include, .n_include = n_include, .report = isatty(2) ? 2 : 1};
    char *snap = NULL;
    if (dsp_pull_repo(repo, &p, &snap)) return dsp_cli_fail("pull", "%s", dsp_last_error());
    printf("%s\n", snap);
    free(snap);
    return 0;
}
