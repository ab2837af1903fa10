/* io/json: see json.h. */
#include "io/json.h"

#include "core/file.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

dsp_status dsp_json_load_file(const char *path, size_t max_bytes, json_t **out) {
    *out = NULL;
    char *txt;
    size_t len;
    dsp_status st = dsp_file_read(path, max_bytes, &txt, &len);
    if (st) return st;
    json_error_t je;
    json_t *root = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je);
    /* transformers writes model_max_length = 1e30 as an integer: read numbers as reals then
     * (dsp_json_int accepts whole reals) */
    if (!root && strstr(je.text, "too big integer")) root = json_loadb(txt, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    free(txt);
    if (!root) return dsp_error(DSP_ERR_FORMAT, "%s: line %d column %d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return dsp_error(DSP_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    }
    *out = root;
    return DSP_OK;
}

json_t *dsp_json_at(const json_t *root, const char *path) {
    const json_t *v = root;
    char key[128];
    while (v && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key || !json_is_object(v)) return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        v = json_object_get(v, key);
        path += n + (dot ? 1 : 0);
    }
    return (json_t *)v;
}

static dsp_status lookup(const json_t *root, const char *path, json_t **v) {
    *v = dsp_json_at(root, path);
    return *v && !json_is_null(*v) ? DSP_OK : DSP_ERR_NOT_FOUND;
}

dsp_status dsp_json_int(const json_t *root, const char *path, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v;
    if (lookup(root, path, &v)) return DSP_ERR_NOT_FOUND;
    /* 4096.0 is an integer in Python's json too: accept whole reals */
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != (double)(int64_t)d) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is %g, not an integer", path, d);
        if (d < (double)lo || d > (double)hi)
            return dsp_error(DSP_ERR_FORMAT, "\"%s\" = %g is out of range [%" PRId64 ", %" PRId64 "]", path, d, lo, hi);
        *out = (int64_t)d;
        return DSP_OK;
    }
    if (!json_is_integer(v)) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is not an integer", path);
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) return dsp_error(DSP_ERR_FORMAT, "\"%s\" = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]", path, x, lo, hi);
    *out = x;
    return DSP_OK;
}

dsp_status dsp_json_num(const json_t *root, const char *path, double *out) {
    json_t *v;
    if (lookup(root, path, &v)) return DSP_ERR_NOT_FOUND;
    if (!json_is_number(v)) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is not a number", path);
    *out = json_number_value(v);
    return DSP_OK;
}

dsp_status dsp_json_bool(const json_t *root, const char *path, bool *out) {
    json_t *v;
    if (lookup(root, path, &v)) return DSP_ERR_NOT_FOUND;
    if (!json_is_boolean(v)) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is not true or false", path);
    *out = json_is_true(v);
    return DSP_OK;
}

dsp_status dsp_json_str(const json_t *root, const char *path, const char **out) {
    json_t *v;
    if (lookup(root, path, &v)) return DSP_ERR_NOT_FOUND;
    if (!json_is_string(v)) return dsp_error(DSP_ERR_FORMAT, "\"%s\" is not a string", path);
    *out = json_string_value(v);
    return DSP_OK;
}
