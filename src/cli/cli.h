/* cli: the dspark command-line tool. Each subcommand lives in its own cmd_<name>.c and is a
 * client of include/dspark.h plus the internal headers it needs. main.c dispatches. */
#ifndef DSP_CLI_H
#define DSP_CLI_H

#include <stdbool.h>
#include <stdio.h>

typedef struct dsp_cli_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} dsp_cli_cmd;

/* true if argv has -h/--help; commands print their usage and return 0 then */
bool dsp_cli_wants_help(int argc, char **argv);
/* print "dspark <cmd>: <message>" + dsp_last_error() if set, return exit code 1 */
int dsp_cli_fail(const char *cmd, const char *fmt, ...);

int dsp_cmd_info(int argc, char **argv);
int dsp_cmd_tokenize(int argc, char **argv);
int dsp_cmd_detokenize(int argc, char **argv);
int dsp_cmd_template(int argc, char **argv);

#endif
