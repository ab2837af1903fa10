/* io/safetensors: a checked reader for safetensors files and Hugging Face checkpoints (one file, or
 * shards listed by model.safetensors.index.json).
 *
 * Format: u64 little-endian header length N, N bytes of JSON, then the byte buffer. The JSON is an
 * object: "__metadata__" (optional, string -> string) and, per tensor, {"dtype": "BF16", "shape":
 * [d0, d1, ...], "data_offsets": [begin, end]} with offsets relative to the buffer. Like the
 * reference implementation we require the tensors to tile the buffer exactly: sorted by offset,
 * each begins where the previous ended, the first at 0 and the last at the end of the file; so a
 * tensor can neither overlap another nor run past the file, and no byte is unaccounted for.
 * Everything is checked at open (header length, JSON, duplicate names, dtype, shape, element count
 * and byte size overflow, offsets), each failure an error naming the file and the tensor; after a
 * successful open every accessor is safe.
 *
 * Tensors are plain dsp_tensors (core/tensor.h) pointing into the read-only mappings, never copied:
 * a PyTorch shape [out, in] becomes ne = {in, out}. Dtypes F32, F16, BF16, F64, I8, I16, I32, I64
 * map to dsp_dtype; the others the format knows (U8, BOOL, F8_*, U16..U64) are refused as
 * unsupported, naming the tensor. Names are the checkpoint's own ("model.layers.0.mlp.up_proj.weight").
 *
 * Used by the model loader (model/hf.c) and usable alone, e.g. for drafter checkpoints. */
#ifndef DSP_IO_SAFETENSORS_H
#define DSP_IO_SAFETENSORS_H

#include "core/status.h"
#include "core/tensor.h"

#include <stddef.h>
#include <stdint.h>

#define DSP_ST_MAX_HEADER 100000000u /* bytes of JSON header at most (the reference's limit) */
#define DSP_ST_MAX_SHARDS 4096

typedef struct dsp_st dsp_st;

/* path: a .safetensors file, or a directory holding model.safetensors.index.json (then every
 * shard it names, which must lie in that directory) or else model.safetensors. On failure *out is
 * NULL and dsp_last_error() names the file (and the tensor) at fault. */
dsp_status dsp_st_open(const char *path, dsp_st **out);
/* One file's bytes in a caller-owned buffer that outlives the handle (tests, fuzzing). */
dsp_status dsp_st_open_memory(const void *buf, size_t size, dsp_st **out);
void dsp_st_destroy(dsp_st *s);

uint64_t dsp_st_n_tensors(const dsp_st *s);
const dsp_tensor *dsp_st_tensor_at(const dsp_st *s, uint64_t i); /* NULL past the end */
const dsp_tensor *dsp_st_find(const dsp_st *s, const char *name); /* NULL if absent */
/* the safetensors dtype string of tensor i ("BF16") */
const char *dsp_st_dtype_name(const dsp_st *s, uint64_t i);

int dsp_st_n_files(const dsp_st *s);
const char *dsp_st_file_path(const dsp_st *s, int i); /* "(memory)" for dsp_st_open_memory */
uint64_t dsp_st_file_size(const dsp_st *s, int i);
int dsp_st_tensor_file(const dsp_st *s, uint64_t i); /* which file tensor i lives in */
uint64_t dsp_st_total_size(const dsp_st *s);          /* bytes of all files */
/* A "__metadata__" string of the first file (e.g. "format" -> "pt"); NULL if absent. */
const char *dsp_st_metadata(const dsp_st *s, const char *key);

#endif
