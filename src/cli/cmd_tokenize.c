/* cli/cmd_tokenize: `dspark tokenize` and `dspark detokenize` (placeholders until tok/ lands). */
#include "cli/cli.h"

int dsp_cmd_tokenize(int argc, char **argv) {
    (void)argc; (void)argv;
    return dsp_cli_fail("tokenize", "not implemented yet");
}

int dsp_cmd_detokenize(int argc, char **argv) {
    (void)argc; (void)argv;
    return dsp_cli_fail("detokenize", "not implemented yet");
}
