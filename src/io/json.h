/* io/json: JSON side files of model directories (config.json, tokenizer_config.json,
 * generation_config.json, ...) read with jansson, and typed access to their fields.
 *
 * The getters take a dotted path ("rope_scaling.factor") into nested objects. They return
 * DSP_ERR_NOT_FOUND without a message when the field is absent or JSON null (callers treat fields
 * as optional), and DSP_ERR_FORMAT with a message naming the field when it has the wrong type or
 * is out of range; callers prefix the file name. */
#ifndef DSP_IO_JSON_H
#define DSP_IO_JSON_H

#include "core/status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Parse a file (at most max_bytes) whose root must be an object. Errors name the path, and the
 * line and column of a syntax error. Duplicate keys are an error. */
dsp_status dsp_json_load_file(const char *path, size_t max_bytes, json_t **out);

/* The value at a dotted path, or NULL (absent, or a step is not an object). */
json_t *dsp_json_at(const json_t *root, const char *path);
dsp_status dsp_json_int(const json_t *root, const char *path, int64_t lo, int64_t hi, int64_t *out);
dsp_status dsp_json_num(const json_t *root, const char *path, double *out); /* integer or real */
dsp_status dsp_json_bool(const json_t *root, const char *path, bool *out);
dsp_status dsp_json_str(const json_t *root, const char *path, const char **out); /* valid while root lives */

#endif
