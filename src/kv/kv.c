/* kv/kv: see kv.h. */
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NONE UINT32_MAX

dsp_status dsp_kv_pool_create(dsp_kv_pool *p, int block_tokens, uint32_t n_blocks, bool prefix_cache) {
    memset(p, 0, sizeof *p);
    if (block_tokens <= 0 || block_tokens > 4096 || n_blocks == 0 || n_blocks > (1u << 28))
        return dsp_error(DSP_ERR_INVALID_ARG, "kv pool: bad shape (block %d tokens, %u blocks)", block_tokens, n_blocks);
    p->block_tokens = block_tokens;
    p->n_blocks = n_blocks;
    p->cache = prefix_cache;
    p->table_size = 16;
    while (p->table_size < 2 * n_blocks) p->table_size *= 2;
    p->refcnt = calloc(n_blocks, sizeof *p->refcnt);
    p->free_ids = malloc(n_blocks * sizeof *p->free_ids);
    p->key = calloc(n_blocks, sizeof *p->key);
    p->parent = calloc(n_blocks, sizeof *p->parent);
    p->tokens = malloc((size_t)n_blocks * (size_t)block_tokens * sizeof *p->tokens);
    p->published = calloc(n_blocks, sizeof *p->published);
    p->lru_prev = malloc(n_blocks * sizeof *p->lru_prev);
    p->lru_next = malloc(n_blocks * sizeof *p->lru_next);
    p->table = malloc(p->table_size * sizeof *p->table);
    if (!p->refcnt || !p->free_ids || !p->key || !p->parent || !p->tokens || !p->published || !p->lru_prev || !p->lru_next || !p->table) {
        dsp_kv_pool_destroy(p);
        return dsp_error(DSP_ERR_NOMEM, "kv pool: no memory for %u blocks", n_blocks);
    }
    for (uint32_t i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i; /* pop gives 0, 1, ... */
    p->n_free = n_blocks;
    for (uint32_t i = 0; i < p->table_size; i++) p->table[i] = NONE;
    p->lru_head = p->lru_tail = NONE;
    return DSP_OK;
}

void dsp_kv_pool_destroy(dsp_kv_pool *p) {
    free(p->refcnt), free(p->free_ids), free(p->key), free(p->parent), free(p->tokens), free(p->published);
    free(p->lru_prev), free(p->lru_next), free(p->table);
    memset(p, 0, sizeof *p);
}

dsp_status dsp_kv_pool_add_store(dsp_kv_pool *p, dsp_kv_copy_fn copy, void *ctx) {
    if (p->n_stores >= DSP_KV_MAX_STORES) return dsp_error(DSP_ERR_INVALID_ARG, "kv pool: more than %d stores", DSP_KV_MAX_STORES);
    p->copy[p->n_stores] = copy;
    p->copy_ctx[p->n_stores++] = ctx;
    return DSP_OK;
}

/* ---- the key table (linear probing, backward-shift deletion) ---------------------------------- */

static uint32_t slot_of(const dsp_kv_pool *p, uint64_t key) { return (uint32_t)(key ^ (key >> 29)) & (p->table_size - 1); }

static uint32_t table_find(const dsp_kv_pool *p, uint64_t key) {
    for (uint32_t i = slot_of(p, key);; i = (i + 1) & (p->table_size - 1)) {
        uint32_t b = p->table[i];
        if (b == NONE) return NONE;
        if (p->key[b] == key) return b;
    }
}

static void table_insert(dsp_kv_pool *p, uint32_t b) {
    uint32_t i = slot_of(p, p->key[b]);
    while (p->table[i] != NONE) i = (i + 1) & (p->table_size - 1);
    p->table[i] = b;
}

static void table_remove(dsp_kv_pool *p, uint32_t b) {
    uint32_t mask = p->table_size - 1, i = slot_of(p, p->key[b]);
    while (p->table[i] != b) {
        DSP_ASSERT(p->table[i] != NONE);
        i = (i + 1) & mask;
    }
    /* backward shift: move later entries of the run into the hole when their home allows it */
    for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        uint32_t e = p->table[j];
        if (e == NONE) break;
        uint32_t home = slot_of(p, p->key[e]);
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            p->table[i] = e;
            i = j;
        }
    }
    p->table[i] = NONE;
}

/* ---- LRU of cached blocks --------------------------------------------------------------------- */

static void lru_unlink(dsp_kv_pool *p, uint32_t b) {
    uint32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr != NONE) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx != NONE) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->n_cached--;
}

static void lru_push(dsp_kv_pool *p, uint32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = NONE;
    if (p->lru_tail != NONE) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static void unpublish(dsp_kv_pool *p, uint32_t b) {
    table_remove(p, b);
    p->published[b] = false;
}

/* ---- blocks ----------------------------------------------------------------------------------- */

/* A block for exclusive use: a free one, else the least recently used cached one. */
static uint32_t take(dsp_kv_pool *p) {
    uint32_t b;
    if (p->n_free) {
        b = p->free_ids[--p->n_free];
    } else {
        DSP_ASSERT(p->n_cached > 0);
        b = p->lru_head;
        lru_unlink(p, b);
        unpublish(p, b);
        p->n_evicted++;
    }
    p->refcnt[b] = 1;
    return b;
}

static void release(dsp_kv_pool *p, uint32_t b) {
    DSP_ASSERT(p->refcnt[b] > 0);
    if (--p->refcnt[b]) return;
    if (p->published[b]) lru_push(p, b);
    else p->free_ids[p->n_free++] = b;
}

dsp_status dsp_kv_seq_init(dsp_kv_seq *s, uint32_t max_tokens, int block_tokens, uint64_t salt) {
    memset(s, 0, sizeof *s);
    s->max_blocks = (max_tokens + (uint32_t)block_tokens - 1) / (uint32_t)block_tokens;
    s->blocks = malloc((s->max_blocks ? s->max_blocks : 1) * sizeof *s->blocks);
    s->salt = salt;
    s->last_key = salt;
    return s->blocks ? DSP_OK : dsp_error(DSP_ERR_NOMEM, "kv: no memory for a block table");
}

void dsp_kv_seq_free(dsp_kv_pool *p, dsp_kv_seq *s) {
    if (s->blocks)
        for (uint32_t i = 0; i < s->n_blocks; i++) release(p, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

dsp_status dsp_kv_seq_reserve(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens) {
    uint32_t bt = (uint32_t)p->block_tokens, need = (uint32_t)(((uint64_t)n_tokens + bt - 1) / bt);
    if (need > s->max_blocks)
        return dsp_error(DSP_ERR_RANGE, "context length exceeded: %u tokens, the limit is %u", n_tokens, s->max_blocks * bt);
    if (need <= s->n_blocks) return DSP_OK;
    if (need - s->n_blocks > dsp_kv_pool_available(p))
        return dsp_error(DSP_ERR_NOMEM, "KV cache full: %u more blocks of %u tokens needed, %u available", need - s->n_blocks, bt,
                         dsp_kv_pool_available(p));
    while (s->n_blocks < need) s->blocks[s->n_blocks++] = take(p);
    return DSP_OK;
}

dsp_status dsp_kv_seq_make_writable(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t from) {
    uint32_t bt = (uint32_t)p->block_tokens;
    for (uint32_t i = from / bt; i < s->n_blocks; i++) {
        uint32_t b = s->blocks[i];
        if (p->refcnt[b] == 1 && !p->published[b]) continue;
        if (p->refcnt[b] == 1) { /* ours alone but published: unpublish instead of copying */
            unpublish(p, b);
            continue;
        }
        if (dsp_kv_pool_available(p) == 0) return dsp_error(DSP_ERR_NOMEM, "KV cache full: no free block for copy-on-write");
        uint32_t nb = take(p);
        for (int k = 0; k < p->n_stores; k++) {
            dsp_status st = p->copy[k](p->copy_ctx[k], nb, b);
            if (st) {
                release(p, nb);
                return st;
            }
        }
        release(p, b);
        s->blocks[i] = nb;
    }
    if (s->n_keyed > from / bt) { /* keys past `from` no longer describe what will be written */
        s->n_keyed = from / bt;
        s->last_key = s->n_keyed ? p->key[s->blocks[s->n_keyed - 1]] : s->salt;
    }
    return DSP_OK;
}

void dsp_kv_seq_truncate(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens) {
    uint32_t bt = (uint32_t)p->block_tokens, keep = (n_tokens + bt - 1) / bt;
    if (n_tokens < s->n_tokens) s->n_tokens = n_tokens;
    while (s->n_blocks > keep) release(p, s->blocks[--s->n_blocks]);
    if (s->n_keyed > n_tokens / bt) { /* a keyed block is cut: later writes go through make_writable */
        s->n_keyed = n_tokens / bt;
        s->last_key = s->n_keyed ? p->key[s->blocks[s->n_keyed - 1]] : s->salt;
    }
}

static uint64_t block_key(uint64_t parent, const int32_t *tokens, int bt) {
    return XXH64(tokens, (size_t)bt * sizeof *tokens, parent);
}

uint32_t dsp_kv_seq_attach_prefix(dsp_kv_pool *p, dsp_kv_seq *s, const int32_t *tokens, uint32_t limit) {
    DSP_ASSERT(s->n_blocks == 0);
    if (!p->cache) return 0;
    uint32_t bt = (uint32_t)p->block_tokens, nb = limit / bt;
    if (nb > s->max_blocks) nb = s->max_blocks;
    uint64_t parent = s->salt;
    for (uint32_t i = 0; i < nb; i++) {
        const int32_t *t = tokens + (size_t)i * bt;
        uint64_t key = block_key(parent, t, (int)bt);
        uint32_t b = table_find(p, key);
        if (b == NONE || p->parent[b] != parent || memcmp(p->tokens + (size_t)b * bt, t, bt * sizeof *t)) break;
        if (p->refcnt[b] == 0) lru_unlink(p, b);
        p->refcnt[b]++;
        s->blocks[s->n_blocks++] = b;
        parent = key;
    }
    s->n_tokens = s->n_blocks * bt;
    s->n_keyed = s->n_blocks;
    s->last_key = parent;
    return s->n_tokens;
}

void dsp_kv_seq_publish(dsp_kv_pool *p, dsp_kv_seq *s, const int32_t *tokens, uint32_t n_committed) {
    if (!p->cache) return;
    uint32_t bt = (uint32_t)p->block_tokens, full = n_committed / bt;
    if (full > s->n_blocks) full = s->n_blocks;
    for (uint32_t i = s->n_keyed; i < full; i++) {
        const int32_t *t = tokens + (size_t)i * bt;
        uint64_t key = block_key(s->last_key, t, (int)bt);
        uint32_t b = s->blocks[i];
        if (!p->published[b] && table_find(p, key) == NONE) {
            p->key[b] = key;
            p->parent[b] = s->last_key;
            memcpy(p->tokens + (size_t)b * bt, t, bt * sizeof *t);
            p->published[b] = true;
            table_insert(p, b);
        }
        s->last_key = key;
        s->n_keyed = i + 1;
    }
}

void dsp_kv_pool_clear_cache(dsp_kv_pool *p) {
    for (uint32_t b = 0; b < p->n_blocks; b++) {
        if (!p->published[b]) continue;
        unpublish(p, b);
        if (p->refcnt[b] == 0) {
            lru_unlink(p, b);
            p->free_ids[p->n_free++] = b;
        }
    }
}
