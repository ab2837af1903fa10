/* core/tensor: a weight tensor as the model layer sees it, whatever file it came from.
 *
 * The GGUF reader (io/gguf) and the safetensors reader (io/safetensors) both describe their tensors
 * with this struct; model/arch binds weights to it and the backends read it. ne[0] is the innermost
 * (contiguous) dimension, as in GGUF: a PyTorch weight of shape [out, in] has ne = {in, out}.
 * data points into a read-only mapping (or a buffer the model owns, e.g. after load-time
 * quantization) and lives as long as the model. */
#ifndef DSP_CORE_TENSOR_H
#define DSP_CORE_TENSOR_H

#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_TENSOR_MAX_DIMS 4

/* A length-delimited string (not NUL-terminated), e.g. a name inside a mapped file. */
typedef struct dsp_str {
    const char *ptr;
    uint64_t len;
} dsp_str;

/* true if s equals the NUL-terminated c */
bool dsp_str_eq(dsp_str s, const char *c);

typedef struct dsp_tensor {
    dsp_str name;
    uint32_t n_dims;
    uint64_t ne[DSP_TENSOR_MAX_DIMS]; /* ne[0] innermost; unused dimensions are 1 */
    uint32_t type;                    /* dsp_dtype id (core/dtype.h) */
    uint64_t offset;                  /* from the start of its file's data section */
    uint64_t nbytes;
    uint64_t n_elems;
    const void *data;
} dsp_tensor;

/* A name -> entry index over an array of structs whose first member is a dsp_str name
 * (dsp_tensor, dsp_gguf_kv, ...): open addressing, built once, read-only after. */
typedef struct dsp_name_index {
    uint64_t *tab;     /* (cap) entry index + 1, 0 = empty */
    uint64_t cap;      /* a power of two, at least twice the entry count */
    const void *base;  /* the array */
    size_t stride;     /* bytes between entries */
} dsp_name_index;

/* Sized for n entries of the array at base; DSP_ERR_NOMEM (no message) if the table cannot be had. */
dsp_status dsp_name_index_init(dsp_name_index *ix, const void *base, size_t stride, uint64_t n);
/* Add entry idx; false if an entry of the same name is already there. */
bool dsp_name_index_insert(dsp_name_index *ix, uint64_t idx);
/* The entry named name (NUL-terminated), or NULL. */
const void *dsp_name_index_find(const dsp_name_index *ix, const char *name);
void dsp_name_index_free(dsp_name_index *ix);

#endif
