/* tests/gguf_walk.h: call every dsp_gguf accessor on every kv and tensor of an opened file, the
 * way a consumer might, so that ASan/UBSan see any read that the reader's validation let through.
 * Shared by tests/test_gguf.c and fuzz/fuzz_gguf.c. Returns a checksum so nothing is optimized
 * away. Precondition-checked accessors (DSP_ASSERT) are only called within their contract. */
#ifndef DSP_TESTS_GGUF_WALK_H
#define DSP_TESTS_GGUF_WALK_H

#include "core/quant.h"
#include "io/gguf.h"

#include <stdlib.h>
#include <string.h>

static uint64_t dsp_walk_arr(const dsp_gguf_kv *kv);

static uint64_t dsp_walk_elem(const dsp_gguf_kv *kv, uint64_t i) {
    uint64_t h = 0;
    switch (kv->arr_type) {
    case DSP_GGUF_STRING: {
        dsp_str s = dsp_gguf_arr_str(kv, i);
        h += s.len;
        if (s.len) h += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        break;
    }
    case DSP_GGUF_ARRAY: {
        dsp_gguf_kv sub = dsp_gguf_arr_sub(kv, i);
        char txt[64];
        dsp_gguf_kv_format(&sub, txt, sizeof txt);
        h += dsp_walk_arr(&sub) + (uint8_t)txt[0];
        break;
    }
    case DSP_GGUF_F32:
    case DSP_GGUF_F64: h += dsp_gguf_arr_float(kv, i) != 0; break;
    default: h += (uint64_t)dsp_gguf_arr_int(kv, i) + (dsp_gguf_arr_float(kv, i) != 0); break;
    }
    return h;
}

static uint64_t dsp_walk_arr(const dsp_gguf_kv *kv) {
    uint64_t h = kv->arr_n, n = kv->arr_n < 256 ? kv->arr_n : 256;
    for (uint64_t i = 0; i < n; i++) h += dsp_walk_elem(kv, i);
    if (kv->arr_n > n) h += dsp_walk_elem(kv, kv->arr_n - 1);
    return h;
}

static uint64_t dsp_gguf_walk(const dsp_gguf *g) {
    uint64_t h = dsp_gguf_version(g) + dsp_gguf_file_size(g) + dsp_gguf_alignment(g) + dsp_gguf_data_offset(g);
    char txt[256];
    for (uint64_t i = 0; i < dsp_gguf_n_kv(g); i++) {
        const dsp_gguf_kv *kv = dsp_gguf_kv_at(g, i);
        char *key = malloc(kv->key.len + 1);
        if (!key) abort();
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = '\0';
        if (dsp_gguf_find_kv(g, key) != kv) abort(); /* keys are unique and NUL-free after open */
        dsp_gguf_kv_format(kv, txt, sizeof txt);
        h += strlen(txt);
        for (size_t sz = 1; sz < 12; sz += 5) dsp_gguf_kv_format(kv, txt, sz); /* truncation */
        uint32_t u32; int32_t i32; uint64_t u64; float f; bool b; dsp_str s;
        if (!dsp_gguf_get_u32(g, key, &u32)) h += u32;
        if (!dsp_gguf_get_i32(g, key, &i32)) h += (uint32_t)i32;
        if (!dsp_gguf_get_u64(g, key, &u64)) h += u64;
        if (!dsp_gguf_get_f32(g, key, &f)) h += f != 0;
        if (!dsp_gguf_get_bool(g, key, &b)) h += b;
        if (!dsp_gguf_get_str(g, key, &s)) h += s.len + (s.len ? (uint8_t)s.ptr[s.len - 1] : 0);
        for (int t = 0; t < DSP_GGUF_TYPE_COUNT; t++) {
            const dsp_gguf_kv *arr;
            if (!dsp_gguf_get_arr(g, key, (dsp_gguf_type)t, &arr)) h += arr->arr_n;
        }
        if (kv->type == DSP_GGUF_ARRAY) h += dsp_walk_arr(kv);
        free(key);
    }
    if (dsp_gguf_kv_at(g, dsp_gguf_n_kv(g)) != NULL) abort();
    for (uint64_t i = 0; i < dsp_gguf_n_tensors(g); i++) {
        const dsp_gguf_tensor *t = dsp_gguf_tensor_at(g, i);
        char *name = malloc(t->name.len + 1);
        if (!name) abort();
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        if (dsp_gguf_find_tensor(g, name) != t) abort();
        free(name);
        const uint8_t *d = t->data;
        h += t->n_dims + t->ne[0] + t->type + t->n_elems;
        if (t->nbytes) h += d[0] + d[t->nbytes - 1]; /* ASan checks these lie in the buffer */
        const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
        if (tr && tr->can_dequant && t->n_elems <= (1u << 16)) {
            if (dsp_dtype_row_bytes(t->type, t->n_elems) != t->nbytes) abort();
            float *y = malloc(t->n_elems * sizeof *y);
            if (!y) abort();
            if (dsp_dequantize_row(t->type, t->data, y, t->n_elems) == DSP_OK) h += y[0] != 0;
            free(y);
        }
    }
    if (dsp_gguf_tensor_at(g, dsp_gguf_n_tensors(g)) != NULL) abort();
    return h;
}

#endif
