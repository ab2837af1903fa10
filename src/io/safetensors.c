/* io/safetensors: see safetensors.h.
 *
 * Each file is parsed on its own (header, JSON, per-tensor checks, then the tiling check over its
 * buffer) and its tensors are appended to one table; a directory adds the index cross-checks and
 * the duplicate-name check across shards. The JSON header is parsed by jansson with duplicate keys
 * rejected; every number is range-checked before it is used. */
#include "io/safetensors.h"

#include "core/dtype.h"
#include "core/file.h"
#include "io/json.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_INDEX_BYTES (64u << 20)

typedef struct st_file {
    char *path;
    dsp_file_map map; /* empty for dsp_st_open_memory */
    const uint8_t *base;
    uint64_t size;
} st_file;

struct dsp_st {
    int n_files;
    st_file *files;
    uint64_t n, cap;
    dsp_tensor *t;      /* (n) */
    int *file_of;       /* (n) */
    uint8_t *dt;        /* (n) index into g_dtypes */
    char **names;       /* (n) owned NUL-terminated copies; t[i].name points at them */
    dsp_name_index ix;
    json_t *meta;       /* "__metadata__" of the first file, or NULL */
};

typedef struct st_dtype {
    const char *name;
    uint32_t bytes;     /* bytes per element */
    int dsp;            /* dsp_dtype, or -1: known to the format but not supported */
} st_dtype;

static const st_dtype g_dtypes[] = {
    {"F32", 4, DSP_F32},   {"F16", 2, DSP_F16},   {"BF16", 2, DSP_BF16}, {"F64", 8, DSP_F64},
    {"I8", 1, DSP_I8},     {"I16", 2, DSP_I16},   {"I32", 4, DSP_I32},   {"I64", 8, DSP_I64},
    {"U8", 1, -1},         {"BOOL", 1, -1},       {"U16", 2, -1},        {"U32", 4, -1},
    {"U64", 8, -1},        {"F8_E4M3", 1, -1},    {"F8_E5M2", 1, -1},    {"F8_E8M0", 1, -1},
};
#define N_DTYPES (sizeof g_dtypes / sizeof g_dtypes[0])

/* ---- one file -------------------------------------------------------------------------------- */

typedef struct extent {
    uint64_t begin, end, idx;
} extent;

static int extent_cmp(const void *a, const void *b) {
    const extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static dsp_status grow(dsp_st *s, uint64_t need) {
    if (need <= s->cap) return DSP_OK;
    uint64_t cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    dsp_tensor *t = realloc(s->t, cap * sizeof *t);
    if (t) s->t = t;
    int *f = realloc(s->file_of, cap * sizeof *f);
    if (f) s->file_of = f;
    uint8_t *d = realloc(s->dt, cap * sizeof *d);
    if (d) s->dt = d;
    char **nm = realloc(s->names, cap * sizeof *nm);
    if (nm) s->names = nm;
    if (!t || !f || !d || !nm) return dsp_error(DSP_ERR_NOMEM, "no memory for %" PRIu64 " tensors", need);
    s->cap = cap;
    return DSP_OK;
}

/* a non-negative JSON integer */
static bool get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static dsp_status parse_tensor(dsp_st *s, const char *name, const json_t *v, uint64_t data_size, int fi) {
    /* names are untrusted text: print at most 200 bytes of one */
#define NM (int)(strlen(name) > 200 ? 200 : strlen(name)), name
    if (!json_is_object(v)) return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': entry is not a JSON object", NM);
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': \"dtype\" is missing or not a string", NM);
    if (!json_is_array(js)) return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': \"shape\" is missing or not an array", NM);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': \"data_offsets\" is missing or not a [begin, end] pair", NM);
    const char *dname = json_string_value(jd);
    int di = -1;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(dname, g_dtypes[i].name)) di = (int)i;
    if (di < 0) return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': unknown dtype '%.40s'", NM, dname);
    const st_dtype *dt = &g_dtypes[di];
    if (dt->dsp < 0)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%.*s': dtype %s is not supported (F32, F16, BF16, F64, I8..I64 are)", NM, dt->name);
    size_t nd = json_array_size(js);
    if (nd > DSP_TENSOR_MAX_DIMS)
        return dsp_error(DSP_ERR_UNSUPPORTED, "tensor '%.*s': %zu dimensions (at most %d are supported)", NM, nd, DSP_TENSOR_MAX_DIMS);
    dsp_tensor t;
    memset(&t, 0, sizeof t);
    for (int d = 0; d < DSP_TENSOR_MAX_DIMS; d++) t.ne[d] = 1;
    t.n_dims = nd ? (uint32_t)nd : 1; /* a scalar is one element */
    uint64_t n = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t x;
        if (!get_u64(json_array_get(js, d), &x))
            return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': shape[%zu] is not a non-negative integer", NM, d);
        if (x && n > (uint64_t)INT64_MAX / x)
            return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': element count overflows at shape[%zu] = %" PRIu64, NM, d, x);
        n *= x;
        t.ne[nd - 1 - d] = x; /* row-major [.., out, in] -> ne[0] = in */
    }
    uint64_t begin, end;
    if (!get_u64(json_array_get(jo, 0), &begin) || !get_u64(json_array_get(jo, 1), &end))
        return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data_offsets are not non-negative integers", NM);
    if (end < begin)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", NM, begin, end);
    if (n > UINT64_MAX / dt->bytes || end - begin != n * dt->bytes)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes, but %" PRIu64
                                         " elements of %s need %s%" PRIu64,
                         NM, begin, end, end - begin, n, dt->name, n > UINT64_MAX / dt->bytes ? "more than " : "",
                         n > UINT64_MAX / dt->bytes ? UINT64_MAX : n * dt->bytes);
    if (end > data_size)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data ends at byte %" PRIu64 " of the buffer, past the end of the file (%" PRIu64
                                         " bytes of data)",
                         NM, end, data_size);
#undef NM
    t.type = (uint32_t)dt->dsp;
    t.offset = begin;
    t.nbytes = end - begin;
    t.n_elems = n;
    dsp_status st = grow(s, s->n + 1);
    if (st) return st;
    char *copy = strdup(name);
    if (!copy) return dsp_error(DSP_ERR_NOMEM, "no memory");
    t.name.ptr = copy;
    t.name.len = strlen(copy);
    s->names[s->n] = copy;
    s->t[s->n] = t;
    s->file_of[s->n] = fi;
    s->dt[s->n] = (uint8_t)di;
    s->n++;
    return DSP_OK;
}

/* The tensors first..s->n of file fi must tile its buffer [0, data_size) exactly. */
static dsp_status check_tiling(dsp_st *s, uint64_t first, uint64_t data_size) {
    uint64_t k = s->n - first;
    if (k == 0)
        return data_size ? dsp_error(DSP_ERR_FORMAT, "no tensors, but %" PRIu64 " bytes of data after the header", data_size) : DSP_OK;
    extent *ex = malloc(k * sizeof *ex);
    if (!ex) return dsp_error(DSP_ERR_NOMEM, "no memory to check %" PRIu64 " tensor extents", k);
    for (uint64_t i = 0; i < k; i++) ex[i] = (extent){s->t[first + i].offset, s->t[first + i].offset + s->t[first + i].nbytes, first + i};
    qsort(ex, k, sizeof *ex, extent_cmp);
    dsp_status st = DSP_OK;
    uint64_t at = 0;
    for (uint64_t i = 0; i < k && !st; i++) {
        const dsp_str *nm = &s->t[ex[i].idx].name;
        int nl = (int)(nm->len > 200 ? 200 : nm->len);
        if (ex[i].begin < at)
            st = dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%.*s' (which ends at %" PRIu64 ")",
                           nl, nm->ptr, ex[i].begin, ex[i].end, (int)(s->t[ex[i - 1].idx].name.len > 200 ? 200 : s->t[ex[i - 1].idx].name.len),
                           s->t[ex[i - 1].idx].name.ptr, at);
        else if (ex[i].begin > at)
            st = dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data begins at byte %" PRIu64 ", leaving bytes %" PRIu64 "..%" PRIu64 " of the buffer unused",
                           nl, nm->ptr, ex[i].begin, at, ex[i].begin);
        at = ex[i].end;
    }
    if (!st && at != data_size)
        st = dsp_error(DSP_ERR_FORMAT, "%" PRIu64 " bytes of data after the last tensor (which ends at byte %" PRIu64 " of %" PRIu64 ")",
                       data_size - at, at, data_size);
    free(ex);
    return st;
}

static dsp_status parse_file(dsp_st *s, int fi) {
    const st_file *f = &s->files[fi];
    if (f->size < 8) return dsp_error(DSP_ERR_FORMAT, "not a safetensors file: %" PRIu64 " bytes, shorter than the 8-byte header length", f->size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | f->base[i];
    if (hl > f->size - 8)
        return dsp_error(DSP_ERR_FORMAT, "header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)", hl, f->size);
    if (hl > DSP_ST_MAX_HEADER) return dsp_error(DSP_ERR_FORMAT, "header length %" PRIu64 " exceeds the limit of %u bytes", hl, DSP_ST_MAX_HEADER);
    if (hl < 2 || f->base[8] != '{') return dsp_error(DSP_ERR_FORMAT, "header is not a JSON object (does not start with '{')");
    json_error_t je;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!root) return dsp_error(DSP_ERR_FORMAT, "header JSON: line %d column %d: %s", je.line, je.column, je.text);
    dsp_status st = DSP_OK;
    if (!json_is_object(root)) {
        json_decref(root);
        return dsp_error(DSP_ERR_FORMAT, "header is not a JSON object");
    }
    uint64_t first = s->n, data_size = f->size - 8 - hl;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                st = dsp_error(DSP_ERR_FORMAT, "\"__metadata__\" is not a JSON object");
                break;
            }
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) {
                st = dsp_error(DSP_ERR_FORMAT, "\"__metadata__\" value of '%.100s' is not a string", mk);
                break;
            }
            if (st) break;
            if (fi == 0) s->meta = json_incref(v);
            continue;
        }
        if ((st = parse_tensor(s, key, v, data_size, fi))) break;
    }
    json_decref(root);
    if (st) return st;
    const uint8_t *data = f->base + 8 + hl;
    for (uint64_t i = first; i < s->n; i++) s->t[i].data = data + s->t[i].offset;
    return check_tiling(s, first, data_size);
}

/* ---- open ------------------------------------------------------------------------------------ */

void dsp_st_destroy(dsp_st *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        dsp_file_map_close(&s->files[i].map);
        free(s->files[i].path);
    }
    for (uint64_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->files);
    free(s->t);
    free(s->file_of);
    free(s->dt);
    free(s->names);
    dsp_name_index_free(&s->ix);
    json_decref(s->meta);
    free(s);
}

static dsp_status build_index(dsp_st *s) {
    if (dsp_name_index_init(&s->ix, s->t, sizeof *s->t, s->n)) return dsp_error(DSP_ERR_NOMEM, "no memory for the tensor index");
    for (uint64_t i = 0; i < s->n; i++) {
        if (dsp_name_index_insert(&s->ix, i)) continue;
        const dsp_tensor *o = dsp_name_index_find(&s->ix, s->names[i]);
        return dsp_error(DSP_ERR_FORMAT, "tensor '%.200s' appears in both %s and %s", s->names[i], s->files[s->file_of[o - s->t]].path,
                         s->files[s->file_of[i]].path);
    }
    return DSP_OK;
}

dsp_status dsp_st_open_memory(const void *buf, size_t size, dsp_st **out) {
    *out = NULL;
    if (!buf && size) return dsp_error(DSP_ERR_INVALID_ARG, "dsp_st_open_memory: NULL buffer");
    dsp_st *s = calloc(1, sizeof *s);
    if (s) s->files = calloc(1, sizeof *s->files);
    if (s && s->files) s->files[0].path = strdup("(memory)");
    if (!s || !s->files || !s->files[0].path) {
        dsp_st_destroy(s);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    s->n_files = 1;
    s->files[0].base = buf;
    s->files[0].size = size;
    dsp_status st = parse_file(s, 0);
    if (!st) st = build_index(s);
    if (st) {
        dsp_st_destroy(s);
        return st;
    }
    *out = s;
    return DSP_OK;
}

static dsp_status add_file(dsp_st *s, char *path) {
    st_file *f = realloc(s->files, ((size_t)s->n_files + 1) * sizeof *f);
    if (!f) {
        free(path);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    s->files = f;
    f = &s->files[s->n_files++];
    memset(f, 0, sizeof *f);
    f->path = path;
    dsp_status st = dsp_file_map_open(path, &f->map);
    if (st) return st; /* the message names the path */
    f->base = f->map.data;
    f->size = f->map.size;
    st = parse_file(s, s->n_files - 1);
    if (st) dsp_error_prefix("%s", path);
    return st;
}

/* A shard name from the index must be a plain file name inside the directory. */
static bool plain_name(const char *n) {
    return n[0] && strcmp(n, ".") && strcmp(n, "..") && !strchr(n, '/') && strlen(n) < 1024;
}

static dsp_status open_index(dsp_st *s, const char *dir, const char *index_path) {
    json_t *root;
    dsp_status st = dsp_json_load_file(index_path, MAX_INDEX_BYTES, &root);
    if (st) return st;
    json_t *wm = json_object_get(root, "weight_map");
    const char *name;
    json_t *v;
    if (!json_is_object(wm)) {
        st = dsp_error(DSP_ERR_FORMAT, "%s: \"weight_map\" is missing or not an object", index_path);
        goto done;
    }
    /* shards in order of first mention */
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v) || !plain_name(json_string_value(v))) {
            st = dsp_error(DSP_ERR_FORMAT, "%s: weight_map entry for '%.200s' is not a file name in this directory", index_path, name);
            goto done;
        }
        const char *fn = json_string_value(v);
        bool seen = false;
        for (int i = 0; i < s->n_files && !seen; i++) seen = !strcmp(strrchr(s->files[i].path, '/') + 1, fn);
        if (seen) continue;
        if (s->n_files >= DSP_ST_MAX_SHARDS) {
            st = dsp_error(DSP_ERR_FORMAT, "%s: more than %d shard files", index_path, DSP_ST_MAX_SHARDS);
            goto done;
        }
        char *p = dsp_path_join(dir, fn);
        if (!p) {
            st = dsp_error(DSP_ERR_NOMEM, "no memory");
            goto done;
        }
        if ((st = add_file(s, p))) goto done;
    }
    if ((st = build_index(s))) goto done;
    /* the index and the shards must agree, both ways */
    json_object_foreach(wm, name, v) {
        const dsp_tensor *t = dsp_st_find(s, name);
        const char *fn = json_string_value(v);
        if (!t || strcmp(strrchr(s->files[s->file_of[t - s->t]].path, '/') + 1, fn)) {
            st = dsp_error(DSP_ERR_FORMAT, "%s: lists tensor '%.200s' in %s, which has no such tensor", index_path, name, fn);
            goto done;
        }
    }
    for (uint64_t i = 0; i < s->n; i++)
        if (!json_object_get(wm, s->names[i])) {
            st = dsp_error(DSP_ERR_FORMAT, "%s: tensor '%.200s' is not listed in %s", s->files[s->file_of[i]].path, s->names[i], index_path);
            goto done;
        }
done:
    json_decref(root);
    return st;
}

dsp_status dsp_st_open(const char *path, dsp_st **out) {
    *out = NULL;
    dsp_st *s = calloc(1, sizeof *s);
    if (!s) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_status st;
    if (dsp_file_is_dir(path)) {
        char *index = dsp_path_join(path, INDEX_NAME), *single = dsp_path_join(path, SINGLE_NAME);
        if (!index || !single) st = dsp_error(DSP_ERR_NOMEM, "no memory");
        else if (dsp_file_exists(index)) st = open_index(s, path, index);
        else if (dsp_file_exists(single)) {
            st = add_file(s, single);
            single = NULL;
            if (!st) st = build_index(s);
        } else
            st = dsp_error(DSP_ERR_NOT_FOUND, "%s: no weights: neither %s nor %s is there", path, INDEX_NAME, SINGLE_NAME);
        free(index);
        free(single);
    } else {
        char *p = strdup(path);
        st = p ? add_file(s, p) : dsp_error(DSP_ERR_NOMEM, "no memory");
        if (!st) st = build_index(s);
    }
    if (st) {
        dsp_st_destroy(s);
        return st;
    }
    *out = s;
    return DSP_OK;
}

/* ---- accessors ------------------------------------------------------------------------------- */

uint64_t dsp_st_n_tensors(const dsp_st *s) { return s->n; }
const dsp_tensor *dsp_st_tensor_at(const dsp_st *s, uint64_t i) { return i < s->n ? &s->t[i] : NULL; }
const dsp_tensor *dsp_st_find(const dsp_st *s, const char *name) { return dsp_name_index_find(&s->ix, name); }
const char *dsp_st_dtype_name(const dsp_st *s, uint64_t i) { return i < s->n ? g_dtypes[s->dt[i]].name : NULL; }
int dsp_st_n_files(const dsp_st *s) { return s->n_files; }
const char *dsp_st_file_path(const dsp_st *s, int i) { return i >= 0 && i < s->n_files ? s->files[i].path : NULL; }
uint64_t dsp_st_file_size(const dsp_st *s, int i) { return i >= 0 && i < s->n_files ? s->files[i].size : 0; }
int dsp_st_tensor_file(const dsp_st *s, uint64_t i) { return i < s->n ? s->file_of[i] : -1; }

uint64_t dsp_st_total_size(const dsp_st *s) {
    uint64_t t = 0;
    for (int i = 0; i < s->n_files; i++) t += s->files[i].size;
    return t;
}

const char *dsp_st_metadata(const dsp_st *s, const char *key) {
    return s->meta ? json_string_value(json_object_get(s->meta, key)) : NULL;
}
