/* io/gguf: a checked reader for GGUF v2 and v3 files.
 *
 * The file is mmapped read-only; keys, strings and tensor data point into the mapping and stay
 * valid until dsp_gguf_destroy. Parsing is done once, up front, and validates everything a later
 * reader could trip on: every count, string length, array length, dimension product, tensor
 * offset and size is checked against the file size and against integer overflow, so that after a
 * successful open every accessor is safe. Errors name the field and the values involved.
 *
 * Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv (v1 used u32 counts
 * and is rejected), n_kv × {string key, u32 type, value}, n_tensors × {string name, u32 n_dims,
 * u64 ne[n_dims], u32 type, u64 offset}, padding to `general.alignment` (default 32), tensor data.
 * A string is u64 length + bytes (no NUL). An array is u32 elem type + u64 count + elements. */
#ifndef DSP_IO_GGUF_H
#define DSP_IO_GGUF_H

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum dsp_gguf_type {
    DSP_GGUF_U8 = 0, DSP_GGUF_I8 = 1, DSP_GGUF_U16 = 2, DSP_GGUF_I16 = 3,
    DSP_GGUF_U32 = 4, DSP_GGUF_I32 = 5, DSP_GGUF_F32 = 6, DSP_GGUF_BOOL = 7,
    DSP_GGUF_STRING = 8, DSP_GGUF_ARRAY = 9, DSP_GGUF_U64 = 10, DSP_GGUF_I64 = 11,
    DSP_GGUF_F64 = 12, DSP_GGUF_TYPE_COUNT
} dsp_gguf_type;

#define DSP_GGUF_MAX_DIMS DSP_TENSOR_MAX_DIMS

typedef struct dsp_gguf_kv {
    dsp_str key;
    dsp_gguf_type type;        /* value type; DSP_GGUF_ARRAY for arrays */
    dsp_gguf_type arr_type;    /* element type when type == ARRAY */
    uint64_t arr_n;            /* element count when type == ARRAY */
    const uint8_t *data;       /* scalar: the value bytes; array: the first element */
    uint64_t nbytes;           /* bytes the value occupies in the file (after type/count headers) */
    uint64_t *elem_offs;       /* ARRAY of STRING or ARRAY: offset of element i from `data` */
} dsp_gguf_kv;

/* GGUF tensors are plain dsp_tensors (core/tensor.h); offset is from the data section. */
typedef dsp_tensor dsp_gguf_tensor;

typedef struct dsp_gguf dsp_gguf;

/* Open and validate a file. On failure *out is NULL and dsp_last_error() names the problem. */
dsp_status dsp_gguf_open(const char *path, dsp_gguf **out);
/* Same checks over a caller-owned buffer (tests, fuzzing). The buffer must outlive the handle. */
dsp_status dsp_gguf_open_memory(const void *buf, size_t size, dsp_gguf **out);
void dsp_gguf_destroy(dsp_gguf *g);

uint32_t dsp_gguf_version(const dsp_gguf *g);
uint64_t dsp_gguf_file_size(const dsp_gguf *g);
uint64_t dsp_gguf_alignment(const dsp_gguf *g);
uint64_t dsp_gguf_data_offset(const dsp_gguf *g);

/* ---- metadata ---- */
uint64_t dsp_gguf_n_kv(const dsp_gguf *g);
const dsp_gguf_kv *dsp_gguf_kv_at(const dsp_gguf *g, uint64_t i);
const dsp_gguf_kv *dsp_gguf_find_kv(const dsp_gguf *g, const char *key); /* NULL if absent */
const char *dsp_gguf_type_name(dsp_gguf_type t);

/* Typed getters. They return DSP_ERR_NOT_FOUND if the key is absent (without setting a message,
 * so callers can treat keys as optional) and DSP_ERR_FORMAT with a message if the value has the
 * wrong type or does not fit. Integer getters accept any integer type whose value fits. */
dsp_status dsp_gguf_get_u32(const dsp_gguf *g, const char *key, uint32_t *out);
dsp_status dsp_gguf_get_i32(const dsp_gguf *g, const char *key, int32_t *out);
dsp_status dsp_gguf_get_u64(const dsp_gguf *g, const char *key, uint64_t *out);
dsp_status dsp_gguf_get_f32(const dsp_gguf *g, const char *key, float *out); /* F32, F64 or integer */
dsp_status dsp_gguf_get_bool(const dsp_gguf *g, const char *key, bool *out);
dsp_status dsp_gguf_get_str(const dsp_gguf *g, const char *key, dsp_str *out);
/* Arrays: the kv (type ARRAY) is returned through *out; elements are read with the kv helpers. */
dsp_status dsp_gguf_get_arr(const dsp_gguf *g, const char *key, dsp_gguf_type elem_type, const dsp_gguf_kv **out);

/* Element accessors for an ARRAY kv. i < kv->arr_n is the caller's precondition (DSP_ASSERT). */
dsp_str  dsp_gguf_arr_str(const dsp_gguf_kv *kv, uint64_t i);
int64_t  dsp_gguf_arr_int(const dsp_gguf_kv *kv, uint64_t i); /* any integer or bool element type */
double   dsp_gguf_arr_float(const dsp_gguf_kv *kv, uint64_t i); /* F32/F64 (or integer) */
/* Nested arrays: element i of an ARRAY of ARRAY, as a kv of its own (key empty). */
dsp_gguf_kv dsp_gguf_arr_sub(const dsp_gguf_kv *kv, uint64_t i);
/* A scalar value as text for display ("12", "1.5e-06", "\"llama\"", "[array of 3 u32]"). */
void dsp_gguf_kv_format(const dsp_gguf_kv *kv, char *buf, size_t size);

/* ---- tensors ---- */
uint64_t dsp_gguf_n_tensors(const dsp_gguf *g);
const dsp_gguf_tensor *dsp_gguf_tensor_at(const dsp_gguf *g, uint64_t i);
const dsp_gguf_tensor *dsp_gguf_find_tensor(const dsp_gguf *g, const char *name); /* NULL if absent */


#endif
