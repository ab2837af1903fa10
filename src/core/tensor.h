/* core/tensor: a weight tensor as the model layer sees it, whatever file it came from.
 *
 * The GGUF reader (io/gguf) and the safetensors reader (io/safetensors) both describe their tensors
 * with this struct; model/arch binds weights to it and the backends read it. ne[0] is the innermost
 * (contiguous) dimension, as in GGUF: a PyTorch weight of shape [out, in] has ne = {in, out}.
 * data points into a read-only mapping (or a buffer the model owns, e.g. after load-time
 * quantization) and lives as long as the model. */
#ifndef DSP_CORE_TENSOR_H
#define DSP_CORE_TENSOR_H

#include <stdbool.h>
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

#endif
