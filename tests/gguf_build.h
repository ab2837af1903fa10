/* tests/gguf_build.h: writing GGUF files in memory, for tests and fuzzers.
 *
 * A byte builder (the host is little-endian, as GGUF is), and a tiny llama-family model: the
 * metadata a model loader reads and every tensor it binds, with hyper-parameters and tensor shapes
 * the caller may set to anything, valid or not. gb_model_tensors derives consistent shapes from
 * the hyper-parameters with 32-bit unsigned products, as a careless writer (or an attacker who
 * wants a wrapped product to match) would; a loader must not trust them. Shared by
 * tests/test_gguf.c, tests/test_model.c and fuzz/fuzz_model.c. */
#ifndef DSP_TESTS_GGUF_BUILD_H
#define DSP_TESTS_GGUF_BUILD_H

#include "core/dtype.h"
#include "io/gguf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a little byte builder ----------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static inline void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) abort();
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void u8_(buf *b, uint8_t v) { put(b, &v, 1); }
static inline void u16_(buf *b, uint16_t v) { put(b, &v, 2); }
static inline void u32_(buf *b, uint32_t v) { put(b, &v, 4); }
static inline void u64_(buf *b, uint64_t v) { put(b, &v, 8); }
static inline void f32_(buf *b, float v) { put(b, &v, 4); }
static inline void f64_(buf *b, double v) { put(b, &v, 8); }
static inline void str_(buf *b, const char *s) {
    u64_(b, strlen(s));
    put(b, s, strlen(s));
}
static inline void zeros(buf *b, size_t n) {
    static const uint8_t z[256];
    for (size_t k; n; n -= k) put(b, z, (k = n < sizeof z ? n : sizeof z));
}
static inline void pad_to(buf *b, size_t align) {
    while (b->n % align) u8_(b, 0);
}
static inline void hdr(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32_(b, version);
    u64_(b, n_tensors);
    u64_(b, n_kv);
}
static inline void key(buf *b, const char *k, uint32_t type) {
    str_(b, k);
    u32_(b, type);
}
static inline void arr_hdr(buf *b, uint32_t elem_type, uint64_t n) {
    u32_(b, elem_type);
    u64_(b, n);
}
static inline void tinfo(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset) {
    str_(b, name);
    u32_(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) u64_(b, ne[d]);
    u32_(b, type);
    u64_(b, offset);
}
static inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---- a tiny model -------------------------------------------------------------------------- */

/* hyper-parameters, written as <arch>.<key> u32 metadata */
enum { GB_EMBD, GB_LAYERS, GB_HEADS, GB_HEADS_KV, GB_FF, GB_CTX, GB_KEY_LEN, GB_VAL_LEN, GB_ROPE_DIM, GB_N_HP };
static const char *const gb_hp_keys[GB_N_HP] = {
    "embedding_length", "block_count", "attention.head_count", "attention.head_count_kv", "feed_forward_length",
    "context_length", "attention.key_length", "attention.value_length", "rope.dimension_count"};

#define GB_MAX_TENSORS 512

typedef struct gb_tensor {
    char name[48];
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type; /* dsp_dtype id */
} gb_tensor;

typedef struct gb_model {
    const char *arch;        /* general.architecture: llama, qwen2 (QKV bias), qwen3 (q/k norm), ... */
    uint32_t hp[GB_N_HP];    /* GB_*; 0 = the key is absent */
    uint32_t n_vocab;        /* rows of token_embd.weight */
    /* a byte-level BPE tokenizer of n_tokens tokens ("t0", "t1", ...), when n_tokens > 0, with
     * tokenizer.ggml.<name>_token_id keys for the ids that are not UINT64_MAX */
    uint32_t n_tokens;
    uint64_t bos_id, eos_id, eot_id;
    gb_tensor t[GB_MAX_TENSORS];
    size_t n_t;
} gb_model;

static inline void gb_add(gb_model *m, const char *name, uint64_t ne0, uint64_t ne1) {
    if (m->n_t == GB_MAX_TENSORS) return;
    gb_tensor *t = &m->t[m->n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 ? 2 : 1;
    t->ne[0] = ne0, t->ne[1] = ne1 ? ne1 : 1, t->ne[2] = t->ne[3] = 1;
    /* vectors must be F32; matrices Q8_0 when the rows allow it (smaller), else F32 */
    t->type = ne1 && ne0 % 32 == 0 ? DSP_Q8_0 : DSP_F32;
}

/* The tensors the loader binds, shaped from m->hp (products in uint32_t, see the top). */
static inline void gb_model_tensors(gb_model *m) {
    const uint32_t *hp = m->hp;
    uint32_t E = hp[GB_EMBD], H = hp[GB_HEADS], Hkv = hp[GB_HEADS_KV] ? hp[GB_HEADS_KV] : H, F = hp[GB_FF];
    uint32_t D = hp[GB_KEY_LEN] ? hp[GB_KEY_LEN] : H ? E / H : 0;
    uint32_t q = H * D, kv = Hkv * D;
    bool bias = m->arch && !strcmp(m->arch, "qwen2"), qk_norm = m->arch && !strcmp(m->arch, "qwen3");
    m->n_t = 0;
    gb_add(m, "token_embd.weight", E, m->n_vocab);
    gb_add(m, "output_norm.weight", E, 0);
    char n[48];
    for (uint32_t l = 0; l < hp[GB_LAYERS] && m->n_t + 16 <= GB_MAX_TENSORS; l++) {
#define GB_T(suffix, ne0, ne1) snprintf(n, sizeof n, "blk.%u.%s", l, suffix), gb_add(m, n, ne0, ne1)
        GB_T("attn_norm.weight", E, 0);
        GB_T("attn_q.weight", E, q);
        GB_T("attn_k.weight", E, kv);
        GB_T("attn_v.weight", E, kv);
        GB_T("attn_output.weight", q, E);
        GB_T("ffn_norm.weight", E, 0);
        GB_T("ffn_gate.weight", E, F);
        GB_T("ffn_up.weight", E, F);
        GB_T("ffn_down.weight", F, E);
        if (bias) GB_T("attn_q.bias", q, 0), GB_T("attn_k.bias", kv, 0), GB_T("attn_v.bias", kv, 0);
        if (qk_norm) GB_T("attn_q_norm.weight", D, 0), GB_T("attn_k_norm.weight", D, 0);
#undef GB_T
    }
}

/* A consistent small model: arch, 2 layers, width 64, 4 heads of 16 (2 KV heads), FFN 96. */
static inline void gb_model_init(gb_model *m, const char *arch) {
    memset(m, 0, sizeof *m);
    m->arch = arch;
    m->hp[GB_EMBD] = 64, m->hp[GB_LAYERS] = 2, m->hp[GB_HEADS] = 4, m->hp[GB_HEADS_KV] = 2;
    m->hp[GB_FF] = 96, m->hp[GB_CTX] = 64;
    m->n_vocab = 32;
    m->bos_id = m->eos_id = m->eot_id = UINT64_MAX;
    gb_model_tensors(m);
}

/* The GGUF file of m (tensor data: small deterministic values). Returns an empty buffer when the
 * tensor data would exceed max_data bytes or a tensor's size cannot be computed (bad type or
 * shape): the caller then has nothing to load. */
static inline buf gb_model_write(const gb_model *m, size_t max_data) {
    buf b = {0};
    uint64_t off[GB_MAX_TENSORS], total = 0;
    for (size_t i = 0; i < m->n_t; i++) {
        const gb_tensor *t = &m->t[i];
        const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
        if (!tr || !tr->block_elems || t->ne[0] % tr->block_elems || t->n_dims < 1 || t->n_dims > 4) return b;
        uint64_t rows = 1, row = t->ne[0] / tr->block_elems * tr->block_bytes;
        for (uint32_t d = 1; d < t->n_dims; d++) {
            if (t->ne[d] && rows > UINT64_MAX / t->ne[d]) return b;
            rows *= t->ne[d];
        }
        if (row && rows > (max_data + 1) / row) return b;
        off[i] = total;
        total = align_up(total + rows * row, 32);
        if (total > max_data) return b;
    }
    const char *const id_keys[3] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"};
    const uint64_t ids[3] = {m->bos_id, m->eos_id, m->eot_id};
    size_t n_kv = 2;
    for (int k = 0; k < GB_N_HP; k++) n_kv += m->hp[k] != 0;
    if (m->n_tokens) {
        n_kv += 2;
        for (int k = 0; k < 3; k++) n_kv += ids[k] != UINT64_MAX;
    }
    hdr(&b, 3, m->n_t, n_kv);
    key(&b, "general.architecture", DSP_GGUF_STRING), str_(&b, m->arch ? m->arch : "");
    key(&b, "general.name", DSP_GGUF_STRING), str_(&b, "gguf_build tiny model");
    char k[96];
    for (int i = 0; i < GB_N_HP; i++) {
        if (!m->hp[i]) continue;
        snprintf(k, sizeof k, "%s.%s", m->arch ? m->arch : "", gb_hp_keys[i]);
        key(&b, k, DSP_GGUF_U32), u32_(&b, m->hp[i]);
    }
    if (m->n_tokens) {
        key(&b, "tokenizer.ggml.model", DSP_GGUF_STRING), str_(&b, "gpt2");
        key(&b, "tokenizer.ggml.tokens", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_STRING, m->n_tokens);
        for (uint32_t i = 0; i < m->n_tokens; i++) {
            snprintf(k, sizeof k, "t%u", i);
            str_(&b, k);
        }
        for (int i = 0; i < 3; i++)
            if (ids[i] != UINT64_MAX) key(&b, id_keys[i], DSP_GGUF_U32), u32_(&b, (uint32_t)ids[i]);
    }
    for (size_t i = 0; i < m->n_t; i++) tinfo(&b, m->t[i].name, m->t[i].n_dims, m->t[i].ne, m->t[i].type, off[i]);
    pad_to(&b, 32);
    size_t data = b.n;
    for (size_t i = 0; i < m->n_t; i++) {
        const gb_tensor *t = &m->t[i];
        zeros(&b, data + off[i] - b.n);
        uint64_t n_el = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n_el *= t->ne[d];
        if (t->type == DSP_Q8_0) {
            uint8_t blk[34] = {0x00, 0x20}; /* f16 scale 2^-7, then 32 quants */
            for (uint64_t q = 0; q < n_el / 32; q++) {
                for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)((q * 7 + (uint64_t)j * 13) % 31 - 15);
                put(&b, blk, sizeof blk);
            }
        } else if (t->type == DSP_F32) {
            for (uint64_t e = 0; e < n_el; e++) f32_(&b, t->n_dims == 1 ? 1.0f : (float)((e * 37) % 17) / 64.0f - 0.125f);
        } else {
            const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
            zeros(&b, (size_t)(n_el / tr->block_elems * tr->block_bytes));
        }
    }
    pad_to(&b, 32);
    return b;
}

#endif
