/* template: a Jinja2-subset interpreter for chat templates (tokenizer.chat_template).
 *
 * It runs a model's own template the way Hugging Face transformers does (apply_chat_template:
 * jinja2 ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, the loopcontrols
 * extension, HF's tojson (ensure_ascii=False), raise_exception, strftime_now, namespace, dict)
 * and must produce the same bytes as jinja2 for every construct it accepts. A construct it does
 * not implement is an error naming the construct and the line, never a best-effort prompt.
 *
 * Templates and contexts are untrusted (model files, HTTP clients): parse and render are bounded
 * by dsp_tmpl_limits (nesting depth, evaluation steps, output size, memory) and every failure is a
 * DSP_ERR_TEMPLATE status with a message "line N: ..." in dsp_last_error().
 *
 * The module: tmpl_lexer.c (source -> tokens), tmpl_parser.c (tokens -> tree), tmpl_values.c (the
 * Python values templates use and their text forms), tmpl_eval.c (expressions, statements, calls),
 * tmpl_filters.c (filters and tests, one small function each) and template.c (this API), sharing
 * tmpl_internal.h.
 *
 * Lifetime: a dsp_tmpl owns its parsed tree (one arena); each render uses its own arena, freed
 * before dsp_tmpl_render returns, so a parsed template can be rendered from several threads. */
#ifndef DSP_TEMPLATE_TEMPLATE_H
#define DSP_TEMPLATE_TEMPLATE_H

#include "core/status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsp_tmpl dsp_tmpl;

typedef struct dsp_tmpl_limits {
    int max_depth;        /* nesting of blocks/expressions in the source, and macro call depth */
    uint64_t max_steps;   /* statements executed + loop iterations + macro calls per render */
    size_t max_output;    /* bytes of rendered output (and of any one intermediate string) */
    size_t max_memory;    /* bytes the render may allocate for values */
    size_t max_source;    /* bytes of template source accepted by dsp_tmpl_create */
} dsp_tmpl_limits;

/* The defaults: depth 64, 20M steps, 64 MiB output, 512 MiB memory, 1 MiB source. */
dsp_tmpl_limits dsp_tmpl_default_limits(void);

typedef struct dsp_tmpl_render_opts {
    /* strftime_now(): when has_now, the time is `now` (Unix seconds) formatted in UTC (tests pin
     * it); otherwise the current local time, as transformers does. */
    bool has_now;
    int64_t now;
} dsp_tmpl_render_opts;

/* Parse `src` (UTF-8, `len` bytes). limits may be NULL (defaults); they are kept for renders. */
dsp_status dsp_tmpl_create(dsp_tmpl **out, const char *src, size_t len,
                           const dsp_tmpl_limits *limits);
void dsp_tmpl_destroy(dsp_tmpl *t);

/* Render with `ctx`, a JSON object whose members are the template's variables (messages,
 * add_generation_prompt, bos_token, eos_token, tools, enable_thinking, ...). On success *out is
 * a malloc'd NUL-terminated string of *out_len bytes (it may contain NUL bytes if the context
 * does) that the caller frees. opts may be NULL. */
dsp_status dsp_tmpl_render(const dsp_tmpl *t, const json_t *ctx, const dsp_tmpl_render_opts *opts,
                           char **out, size_t *out_len);

#endif
