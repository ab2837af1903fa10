/* cli/cmd_info: `dspark info MODEL` (placeholder until io/gguf lands). */
#include "cli/cli.h"

int dsp_cmd_info(int argc, char **argv) {
    (void)argc; (void)argv;
    return dsp_cli_fail("info", "not implemented yet");
}
