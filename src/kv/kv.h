/* kv/kv: the paged KV cache.
 *
 * One pool of fixed-size blocks, sized at start-up, holds the keys and values of every sequence.
 * A sequence owns a block table (block ids in position order) and a length. Truncation (rollback
 * after rejected drafts) is a length change plus freeing the blocks past the new end. Blocks are
 * reference counted so that a full block can be shared read-only between sequences (prefix
 * caching); a shared block is never written: writing into one is a programmer error (assert),
 * callers copy-on-write via dsp_kv_seq_reserve which only hands out exclusive tail blocks.
 *
 * Storage, per layer: K and V as [n_blocks][block_tokens][kv_dim] float32, kv_dim = n_kv_heads *
 * head_dim. f32 keeps attention bit-exact with the reference arithmetic; f16 KV is a later option. */
#ifndef DSP_KV_KV_H
#define DSP_KV_KV_H

#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dsp_kv_pool {
    int n_layers;
    int kv_dim;            /* n_kv_heads * head_dim */
    int block_tokens;      /* tokens per block */
    uint32_t n_blocks;
    float *k, *v;          /* (n_layers, n_blocks, block_tokens, kv_dim) each */
    uint32_t *refcnt;      /* (n_blocks) */
    uint32_t *free_ids;    /* stack of free block ids */
    uint32_t n_free;
} dsp_kv_pool;

typedef struct dsp_kv_seq {
    uint32_t *blocks;      /* block table, (max_blocks) */
    uint32_t n_blocks;     /* blocks in the table */
    uint32_t max_blocks;   /* capacity = ceil(max_tokens / block_tokens) */
    uint32_t n_tokens;     /* committed length */
} dsp_kv_seq;

dsp_status dsp_kv_pool_create(dsp_kv_pool *p, int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks);
void dsp_kv_pool_destroy(dsp_kv_pool *p);
size_t dsp_kv_pool_bytes(int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks);

dsp_status dsp_kv_seq_init(dsp_kv_seq *s, uint32_t max_tokens, int block_tokens);
void dsp_kv_seq_free(dsp_kv_pool *p, dsp_kv_seq *s); /* releases blocks and the table */

/* Make positions [0, n_tokens) writable-or-present: allocates blocks up to ceil(n/bt). Fails
 * with DSP_ERR_RANGE past the sequence capacity and DSP_ERR_NOMEM when the pool is exhausted
 * (nothing is changed then). */
dsp_status dsp_kv_seq_reserve(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens);
/* Copy-on-write: make the blocks holding positions [from, end of table) exclusive to s, copying
 * shared ones. Call before writing K/V at positions >= from. DSP_ERR_NOMEM if the pool is full. */
dsp_status dsp_kv_seq_make_writable(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t from);
/* Roll back to n_tokens (<= current): frees the blocks past the new end. */
void dsp_kv_seq_truncate(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens);
/* Share the first n_tokens of src (rounded down to whole blocks) into an empty dst; returns the
 * number of tokens shared. */
uint32_t dsp_kv_seq_share_prefix(dsp_kv_pool *p, dsp_kv_seq *dst, const dsp_kv_seq *src, uint32_t n_tokens);

/* Pointers to the K / V row of (layer, pos) for a sequence whose blocks cover pos. */
static inline float *dsp_kv_k(const dsp_kv_pool *p, const dsp_kv_seq *s, int layer, uint32_t pos) {
    uint32_t b = s->blocks[pos / (uint32_t)p->block_tokens], t = pos % (uint32_t)p->block_tokens;
    return p->k + (((size_t)layer * p->n_blocks + b) * (size_t)p->block_tokens + t) * (size_t)p->kv_dim;
}
static inline float *dsp_kv_v(const dsp_kv_pool *p, const dsp_kv_seq *s, int layer, uint32_t pos) {
    uint32_t b = s->blocks[pos / (uint32_t)p->block_tokens], t = pos % (uint32_t)p->block_tokens;
    return p->v + (((size_t)layer * p->n_blocks + b) * (size_t)p->block_tokens + t) * (size_t)p->kv_dim;
}

#endif
