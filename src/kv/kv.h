/* kv/kv: the paged KV cache's bookkeeping and the cross-request prefix cache (host side).
 *
 * One pool of fixed-size blocks, sized at start-up, holds the keys and values of every sequence.
 * The data lives in backend KV stores (backend.h: one per model that keeps K/V, e.g. the target
 * and a block drafter), all indexed by the same block ids; this module only decides which block
 * holds what. A sequence owns a block table (block ids in position order) and a length.
 * Truncation (rollback after rejected drafts) is a length change plus releasing the blocks past
 * the new end.
 *
 * Prefix cache. A full block whose tokens are committed can be published under a key: a 64-bit
 * xxHash chained over the contents of every block before it (seeded by a salt the caller picks, e.g.
 * whether drafter K/V is present), so equal keys mean equal prefixes. A new sequence attaches the
 * longest published chain matching its prompt (read-only, reference counted) and computes only the
 * rest. A block nobody references stays cached while it is published, in least-recently-used order,
 * and is evicted (unpublished and reused) only when the free list is empty: a running sequence's
 * blocks are never taken. Attaching checks the block's tokens and its parent key, not only the key.
 *
 * Blocks are reference counted; a block with more than one reference (shared) is never written:
 * callers make a block writable with dsp_kv_seq_make_writable, which copies it (copy-on-write) in
 * every attached store. The engine never needs it in practice (a sequence attaches only blocks that
 * lie wholly before the first position it computes), but the invariant is enforced, not assumed. */
#ifndef DSP_KV_KV_H
#define DSP_KV_KV_H

#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_KV_MAX_STORES 4

/* Copies block src to block dst in one store (every layer). */
typedef dsp_status (*dsp_kv_copy_fn)(void *ctx, uint32_t dst, uint32_t src);

typedef struct dsp_kv_pool {
    int block_tokens;      /* tokens per block */
    uint32_t n_blocks;
    uint32_t *refcnt;      /* (n_blocks) sequences holding the block */
    uint32_t *free_ids;    /* stack of unused, unpublished block ids */
    uint32_t n_free;
    /* prefix cache (all (n_blocks) unless noted) */
    bool cache;            /* publish/attach enabled */
    uint64_t *key;         /* key of a published block */
    uint64_t *parent;      /* key of the block before it (its salt for the first block) */
    int32_t *tokens;       /* (n_blocks, block_tokens) contents of a published block */
    bool *published;
    uint32_t *lru_prev, *lru_next; /* cached blocks: published with refcnt 0, oldest first */
    uint32_t lru_head, lru_tail;   /* UINT32_MAX when empty */
    uint32_t n_cached;
    uint32_t *table;       /* (table_size) open addressing key -> block id, UINT32_MAX empty */
    uint32_t table_size;   /* a power of two >= 2 * n_blocks */
    /* statistics */
    uint64_t n_evicted;
    /* stores to copy on copy-on-write */
    int n_stores;
    dsp_kv_copy_fn copy[DSP_KV_MAX_STORES];
    void *copy_ctx[DSP_KV_MAX_STORES];
} dsp_kv_pool;

typedef struct dsp_kv_seq {
    uint32_t *blocks;      /* block table, (max_blocks) */
    uint32_t n_blocks;     /* blocks in the table */
    uint32_t max_blocks;   /* capacity = ceil(max_tokens / block_tokens) */
    uint32_t n_tokens;     /* positions whose K/V are written (committed length after a round) */
    uint32_t n_keyed;      /* leading blocks whose chain key is known (attached or published) */
    uint64_t last_key;     /* key of block n_keyed - 1 (the salt when n_keyed == 0) */
    uint64_t salt;
} dsp_kv_seq;

dsp_status dsp_kv_pool_create(dsp_kv_pool *p, int block_tokens, uint32_t n_blocks, bool prefix_cache);
void dsp_kv_pool_destroy(dsp_kv_pool *p);
/* Register a store whose blocks must follow copy-on-write (at most DSP_KV_MAX_STORES). */
dsp_status dsp_kv_pool_add_store(dsp_kv_pool *p, dsp_kv_copy_fn copy, void *ctx);
/* Blocks that can be handed out now: free + cached (evictable). */
static inline uint32_t dsp_kv_pool_available(const dsp_kv_pool *p) { return p->n_free + p->n_cached; }
/* Blocks held by sequences (refcnt > 0). */
static inline uint32_t dsp_kv_pool_used(const dsp_kv_pool *p) { return p->n_blocks - p->n_free - p->n_cached; }

/* An empty sequence of at most max_tokens; salt seeds its prefix keys (sequences share cached
 * blocks only with sequences of the same salt). */
dsp_status dsp_kv_seq_init(dsp_kv_seq *s, uint32_t max_tokens, int block_tokens, uint64_t salt);
void dsp_kv_seq_free(dsp_kv_pool *p, dsp_kv_seq *s); /* releases blocks and the table */

/* Make positions [0, n_tokens) present: allocates blocks up to ceil(n/bt), evicting cached blocks
 * when the free list is empty. DSP_ERR_RANGE past the sequence capacity, DSP_ERR_NOMEM when not
 * enough blocks can be had (nothing is changed then). */
dsp_status dsp_kv_seq_reserve(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens);
/* Copy-on-write: make the blocks holding positions [from, end of table) exclusive to s. */
dsp_status dsp_kv_seq_make_writable(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t from);
/* Roll back to n_tokens (<= current): releases the blocks past the new end. */
void dsp_kv_seq_truncate(dsp_kv_pool *p, dsp_kv_seq *s, uint32_t n_tokens);

/* Prefix cache: attach to an empty s the longest published chain of whole blocks that matches
 * tokens[0, limit) (limit: the first position the caller will compute must not lie in a shared
 * block, so pass n_prompt - 1). Returns the tokens attached (a multiple of block_tokens). */
uint32_t dsp_kv_seq_attach_prefix(dsp_kv_pool *p, dsp_kv_seq *s, const int32_t *tokens, uint32_t limit);
/* Publish s's whole blocks within tokens[0, n_committed) (their K/V must be final in every store).
 * A block whose key is already published (by another sequence) stays private to s. */
void dsp_kv_seq_publish(dsp_kv_pool *p, dsp_kv_seq *s, const int32_t *tokens, uint32_t n_committed);
/* Forget every cached block (used ones are unpublished too, so they are freed on release). */
void dsp_kv_pool_clear_cache(dsp_kv_pool *p);

#endif
