/* cli: the dspark command-line tool. Each subcommand lives in its own cmd_<name>.c and is a
 * client of include/dspark.h plus the internal headers it needs. main.c dispatches. */
#ifndef DSP_CLI_H
#define DSP_CLI_H

#include <stdbool.h>
#include <stdint.h>
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
int dsp_cmd_generate(int argc, char **argv);
int dsp_cmd_chat(int argc, char **argv);
int dsp_cmd_batch(int argc, char **argv);
int dsp_cmd_benchmark(int argc, char **argv);
int dsp_cmd_serve(int argc, char **argv);
int dsp_cmd_pull(int argc, char **argv);

double dsp_cli_now_ms(void);
struct dsp_gen_params;
struct dsp_engine_params;
/* Sampling, speculation and engine options shared by generate and chat. Advances *i past a value;
 * sets *handled when argv[*i] was one of them; returns 2 on a malformed value (message printed). */
int dsp_cli_parse_gen_opt(int argc, char **argv, int *i, struct dsp_gen_params *gp, int *n_stop, struct dsp_engine_params *cp,
                          bool *handled);
/* Speculation options alone (serve too): --mode, --max-draft, --dspark-threshold, --dspark-cumulative,
 * --hybrid-min, --draft-argmax, --lookup-min, --lookup-max. */
int dsp_cli_parse_spec_opt(int argc, char **argv, int *i, struct dsp_gen_params *gp, bool *handled);
/* Engine options alone (serve, benchmark too): -c/--ctx, -t/--threads, --batch-tokens (--batch),
 * --max-batch, --kv-memory, --no-prefix-cache, --device/--backend auto|cpu|cuda, --gpu N,
 * --precision q8|f32. */
int dsp_cli_parse_engine_opt(int argc, char **argv, int *i, struct dsp_engine_params *cp, bool *handled);
/* --draft-vocab N|auto|0 -> dsp_engine_params.draft_vocab; prints the error and returns false */
bool dsp_cli_parse_draft_vocab(const char *s, int32_t *out);
/* --draft-quant q4_0|q8_0; false (with a message) otherwise */
enum dsp_draft_quant;
bool dsp_cli_parse_draft_quant(const char *s, enum dsp_draft_quant *out);
struct dsp_tokenizer;
/* text's token ids in *ids (malloc'd, at least one slot, the caller frees it also on an error) and
 * their count in *n: the count-then-fill pair of dsp_tokenize calls; non-zero (a dsp_status) on an error */
int dsp_cli_tokenize(const struct dsp_tokenizer *tok, const char *text, size_t len, int flags, int32_t **ids, size_t *n);
/* the help lines for those */
#define DSP_CLI_ENGINE_HELP                                                                                    \
    "  -c, --ctx N             context length per sequence (default min(model, 4096))\n"                       \
    "  -t, --threads N         CPU threads (default: physical cores)\n"                                         \
    "      --device D          auto (default: the GPU when there is one and the model fits, else the CPU),\n" \
    "                          cpu or cuda (the GPU; --gpu N picks one); DSPARK_DEVICE=cpu|cuda overrides\n"  \
    "      --kv-type T         KV cache element type: f16 (default), bf16 (F32's range) or f32 (the CPU\n"  \
    "                          only: twice the memory; the reference arithmetic)\n"                        \
    "      --batch-tokens N    tokens per forward, also the prefill chunk (default 512)\n"                      \
    "      --prefill-itl X     next to decoding requests, a round with a prefill chunk costs at most X times\n" \
    "                          their rounds alone (default 1.5; lower: smoother streams, slower prefill)\n"   \
    "      --kv-memory SIZE    KV cache size, e.g. 512M (default: max-batch full contexts, at most 1/4 RAM)\n"   \
    "      --no-prefix-cache   do not reuse the KV of earlier requests\n"                                      \
    "      --precision P       CPU matmuls: q8 (default: 8-bit activations, integer dot products) or f32\n"      \
    "      --draft-model D     a DFlash or DSpark drafter for the model: a Hugging Face directory or repo id\n" \
    "      --draft-vocab N|auto  the drafter proposes only the N most frequent tokens (its LM head runs over\n" \
    "                          N rows; lossless either way); 0: every token; auto (default): 16384 when the\n" \
    "                          vocabulary is over 32768 and the LM head >= 1/8 of the model, else all (README)\n" \
    "      --draft-quant Q     a float drafter's matrices on the CPU: q4_0 (default) or q8_0 (README)\n"
/* the help lines of the speculation options (dsp_cli_parse_gen_opt) */
#define DSP_CLI_SPEC_HELP                                                                                       \
    "      --mode M            speculation: auto (default: with --draft-model, per round whichever of a\n"     \
    "                          lookup match, the drafter or no draft is expected to pay best; else lookup),\n" \
    "                          dspark, dflash, hybrid (lookup when its match has --hybrid-min tokens, else\n"  \
    "                          the drafter), lookup, baseline. Always lossless: the output is baseline's\n"   \
    "      --max-draft N|auto  drafted tokens verified per round at most, 1..32 (default %s); auto: per\n"      \
    "                          round, the number with the most expected tokens per second (README)\n"        \
    "      --dspark-threshold T  DSpark: keep drafts before the first slot with confidence < T (0 = off)\n"   \
    "      --dspark-cumulative T DSpark: also cut where the product of confidences falls below T (0 = off)\n" \
    "      --hybrid-min N      hybrid: lookup matches of at least N tokens replace the drafter (default 4)\n"  \
    "      --draft-argmax      T > 0: argmax drafts + sample-and-match (default: drafts sampled from the\n"   \
    "                          drafter's distribution, verified by rejection sampling; README says why)\n"   \
    "      --lookup-min N, --lookup-max N   n-gram sizes for lookup (default 2, 4)\n"
struct dsp_engine;
/* The startup line on stderr: the mode a request gets and the drafter, if any. */
void dsp_cli_log_spec(const struct dsp_engine *e, const struct dsp_gen_params *gp);
/* The CLI's speculation defaults (the library's are baseline): --mode auto, --max-draft below. */
#define DSP_CLI_DEFAULT_MAX_DRAFT 8
#define DSP_CLI_STR_(x) #x
#define DSP_CLI_STR(x) DSP_CLI_STR_(x)
/* Also marks the sampling fields "not given" (negative) for dsp_cli_sampling_defaults. */
void dsp_cli_spec_defaults(struct dsp_gen_params *gp);
struct dsp_model;
/* After loading: fields the command line did not give take the model's generation_config.json
 * values, else the CLI's (greedy). */
void dsp_cli_sampling_defaults(const struct dsp_model *m, struct dsp_gen_params *gp);
/* --quantize (parsed by dsp_cli_parse_gen_opt), for dsp_model_params.quantize */
extern const char *dsp_cli_quantize;
struct dsp_gen_result;
void dsp_cli_print_spec_json(FILE *f, const struct dsp_gen_params *gp, const struct dsp_gen_result *r);
struct dsp_round_trace;
/* --trace-rounds: writes one JSON line per round to user (a FILE *) */
void dsp_cli_trace_round(const struct dsp_round_trace *t, void *user);
struct dsp_model;
struct json_t;
/* Render messages (a JSON array) with add_generation_prompt; template_file overrides the model's.
 * Prints the error and returns 1 on failure. */
int dsp_cli_render_messages(const struct dsp_model *m, const char *template_file, struct json_t *messages, char **out, size_t *out_len);
void dsp_cli_add_message(struct json_t *messages, const char *role, const char *content, size_t len);
/* Render [system?, user] with add_generation_prompt; prints the error and returns 1 on failure. */
int dsp_cli_render_chat(const struct dsp_model *m, const char *template_file, const char *system, const char *user, size_t user_len,
                        char **out, size_t *out_len);

#endif
