/* kv/kv: see kv.h. */
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>

size_t dsp_kv_pool_bytes(int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks) {
    return 2 * (size_t)n_layers * n_blocks * (size_t)block_tokens * (size_t)kv_dim * sizeof(float);
}

dsp_status dsp_kv_pool_create(dsp_kv_pool *p, int n_layers, int kv_dim, int block_tokens, uint32_t n_blocks) {
    memset(p, 0, sizeof *p);
    if (n_layers <= 0 || kv_dim <= 0 || block_tokens <= 0 || n_blocks == 0)
        return dsp_error(DSP_ERR_INVALID_ARG, "kv pool: bad shape (layers %d, kv_dim %d, block %d, blocks %u)", n_layers, kv_dim,
                         block_tokens, n_blocks);
    size_t elems = (size_t)n_layers * n_blocks * (size_t)block_tokens * (size_t)kv_dim;
    p->n_layers = n_layers;
    p->kv_dim = kv_dim;
    p->block_tokens = block_tokens;
    p->n_blocks = n_blocks;
    p->k = calloc(elems, sizeof(float));
    p->v = calloc(elems, sizeof(float));
    p->refcnt = calloc(n_blocks, sizeof *p->refcnt);
    p->free_ids = malloc(n_blocks * sizeof *p->free_ids);
    if (!p->k || !p->v || !p->refcnt || !p->free_ids) {
        dsp_kv_pool_destroy(p);
        return dsp_error(DSP_ERR_NOMEM, "kv pool: cannot allocate %zu MiB", 2 * elems * sizeof(float) >> 20);
    }
    for (uint32_t i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i; /* pop gives 0, 1, ... */
    p->n_free = n_blocks;
    return DSP_OK;
}

void dsp_kv_pool_destroy(dsp_kv_pool *p) {
    free(p->k);
    free(p->v);
    free(p->refcnt);
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

dsp_status dsp_kv_seq_init(dsp_kv_seq *s, uint32_t max_tokens, int block_tokens) {
    memset(s, 0, sizeof *s);
    s->max_blocks = (max_tokens + (uint32_t)block_tokens - 1) / (uint32_t)block_tokens;
    s->blocks = malloc((s->max_blocks ? s->max_blocks : 1) * sizeof *s->blocks);
    return s->blocks ? DSP_OK : dsp_error(DSP_ERR_NOMEM, "kv: no memory for a block table");
}

static void release(dsp_kv_pool *p, uint32_t b) {
    DSP_ASSERT(p->refcnt[b] > 0);
    if (--p->refcnt[b] == 0) p->free_ids[p->n_free++] = b;
}

void dsp_kv_seq_free(dsp_kv_pool *p, dsp_kv_seq *s) {
    if (s->blocks)
        for (uint32_t i = 0; i < s->n_blocks; i++) release(p, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

dsp_status dsp_kv_seq_reserve(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens) {
    uint32_t bt = (uint32_t)p->block_tokens, need = (n_tokens + bt - 1) / bt;
    if (need > s->max_blocks)
        return dsp_error(DSP_ERR_RANGE, "context length exceeded: %u tokens, the limit is %u", n_tokens, s->max_blocks * bt);
    if (need <= s->n_blocks) return DSP_OK;
    if (need - s->n_blocks > p->n_free)
        return dsp_error(DSP_ERR_NOMEM, "KV cache full: %u more blocks of %u tokens needed, %u free", need - s->n_blocks, bt, p->n_free);
    while (s->n_blocks < need) {
        uint32_t b = p->free_ids[--p->n_free];
        p->refcnt[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return DSP_OK;
}

dsp_status dsp_kv_seq_make_writable(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t from) {
    uint32_t bt = (uint32_t)p->block_tokens;
    size_t blk = (size_t)bt * (size_t)p->kv_dim;
    for (uint32_t i = from / bt; i < s->n_blocks; i++) {
        uint32_t b = s->blocks[i];
        if (p->refcnt[b] == 1) continue;
        if (p->n_free == 0) return dsp_error(DSP_ERR_NOMEM, "KV cache full: no free block for copy-on-write");
        uint32_t nb = p->free_ids[--p->n_free];
        p->refcnt[nb] = 1;
        for (int l = 0; l < p->n_layers; l++) {
            size_t base = (size_t)l * p->n_blocks;
            memcpy(p->k + (base + nb) * blk, p->k + (base + b) * blk, blk * sizeof(float));
            memcpy(p->v + (base + nb) * blk, p->v + (base + b) * blk, blk * sizeof(float));
        }
        release(p, b);
        s->blocks[i] = nb;
    }
    return DSP_OK;
}

void dsp_kv_seq_truncate(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens) {
    uint32_t bt = (uint32_t)p->block_tokens, keep = (n_tokens + bt - 1) / bt;
    if (n_tokens < s->n_tokens) s->n_tokens = n_tokens;
    while (s->n_blocks > keep) release(p, s->blocks[--s->n_blocks]);
}

uint32_t dsp_kv_seq_share_prefix(dsp_kv_pool *p, dsp_kv_seq *dst, const dsp_kv_seq *src, uint32_t n_tokens) {
    DSP_ASSERT(dst->n_blocks == 0);
    uint32_t bt = (uint32_t)p->block_tokens;
    if (n_tokens > src->n_tokens) n_tokens = src->n_tokens;
    uint32_t nb = n_tokens / bt;
    if (nb > dst->max_blocks) nb = dst->max_blocks;
    for (uint32_t i = 0; i < nb; i++) {
        dst->blocks[i] = src->blocks[i];
        p->refcnt[src->blocks[i]]++;
    }
    dst->n_blocks = nb;
    dst->n_tokens = nb * bt;
    return dst->n_tokens;
}
