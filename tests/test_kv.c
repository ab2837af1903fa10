/* kv: block allocation, O(1) rollback, context limit, pool exhaustion, copy-on-write through the
 * attached stores, and the prefix cache (publish, attach, LRU eviction, key checks). */
#include "dsp_test.h"

#include "kv/kv.h"

#include <stdlib.h>

/* A fake store: one int per block, copied on copy-on-write. */
typedef struct fake_store {
    int data[64];
    int copies;
} fake_store;

static dsp_status fake_copy(void *ctx, uint32_t dst, uint32_t src) {
    fake_store *f = ctx;
    f->data[dst] = f->data[src];
    f->copies++;
    return DSP_OK;
}

static void test_reserve_truncate(void) {
    dsp_kv_pool p;
    CHECK(dsp_kv_pool_create(&p, 4, 6, false) == DSP_OK); /* 6 blocks of 4 tokens */
    dsp_kv_seq s;
    CHECK(dsp_kv_seq_init(&s, 16, 4, 0) == DSP_OK);        /* capacity 16 tokens = 4 blocks */
    CHECK(dsp_kv_seq_reserve(&p, &s, 9) == DSP_OK);
    CHECK_EQ_INT(s.n_blocks, 3);
    CHECK_EQ_INT(p.n_free, 3);
    s.n_tokens = 9;
    dsp_kv_seq_truncate(&p, &s, 5);
    CHECK_EQ_INT(s.n_tokens, 5);
    CHECK_EQ_INT(s.n_blocks, 2);
    CHECK_EQ_INT(p.n_free, 4);
    CHECK_EQ_INT(dsp_kv_seq_reserve(&p, &s, 17), DSP_ERR_RANGE); /* past the sequence capacity */
    CHECK(strstr(dsp_last_error(), "context length exceeded") != NULL);
    dsp_kv_seq t;
    CHECK(dsp_kv_seq_init(&t, 64, 4, 0) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_reserve(&p, &t, 5 * 4), DSP_ERR_NOMEM); /* only 4 blocks free */
    CHECK_EQ_INT(t.n_blocks, 0);                                    /* nothing taken */
    CHECK_EQ_INT(p.n_free, 4);
    CHECK_EQ_INT(dsp_kv_seq_reserve(&p, &t, UINT32_MAX), DSP_ERR_RANGE); /* no wrap-around */
    dsp_kv_seq_free(&p, &t);
    dsp_kv_seq_free(&p, &s);
    CHECK_EQ_INT(p.n_free, 6);
    dsp_kv_pool_destroy(&p);
}

/* Fill s to n tokens (reserve + pretend the forward wrote them) and publish what is committed. */
static void fill(dsp_kv_pool *p, dsp_kv_seq *s, const int32_t *toks, uint32_t n) {
    CHECK(dsp_kv_seq_reserve(p, s, n) == DSP_OK);
    s->n_tokens = n;
    dsp_kv_seq_publish(p, s, toks, n);
}

static void test_prefix_cache(void) {
    dsp_kv_pool p;
    CHECK(dsp_kv_pool_create(&p, 4, 8, true) == DSP_OK);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 100 + i;
    dsp_kv_seq a, b;
    CHECK(dsp_kv_seq_init(&a, 32, 4, 7) == DSP_OK);
    fill(&p, &a, toks, 10); /* blocks 0, 1 full and published; block 2 partial */
    CHECK_EQ_INT(a.n_keyed, 2);
    /* a second sequence with the same prompt attaches the two full blocks, read-only */
    CHECK(dsp_kv_seq_init(&b, 32, 4, 7) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &b, toks, 9), 8);
    CHECK(b.blocks[0] == a.blocks[0] && b.blocks[1] == a.blocks[1]);
    CHECK_EQ_INT(p.refcnt[a.blocks[0]], 2);
    CHECK_EQ_INT(b.n_tokens, 8);
    /* the limit is respected: a block holding position limit..  is not attached */
    dsp_kv_seq c;
    CHECK(dsp_kv_seq_init(&c, 32, 4, 7) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &c, toks, 7), 4);
    dsp_kv_seq_free(&p, &c);
    /* another salt shares nothing; a different token in block 1 stops the chain there */
    CHECK(dsp_kv_seq_init(&c, 32, 4, 8) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &c, toks, 9), 0);
    dsp_kv_seq_free(&p, &c);
    int32_t other[32];
    memcpy(other, toks, sizeof toks);
    other[5] = 1;
    CHECK(dsp_kv_seq_init(&c, 32, 4, 7) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &c, other, 9), 4);
    dsp_kv_seq_free(&p, &c);
    /* when both let go, published blocks stay cached; the partial block is freed */
    uint32_t b0 = a.blocks[0];
    dsp_kv_seq_free(&p, &a);
    dsp_kv_seq_free(&p, &b);
    CHECK_EQ_INT(p.n_cached, 2);
    CHECK_EQ_INT(p.n_free, 6);
    CHECK_EQ_INT(dsp_kv_pool_available(&p), 8);
    CHECK_EQ_INT(dsp_kv_pool_used(&p), 0);
    /* ...and are found again by a later request */
    CHECK(dsp_kv_seq_init(&a, 32, 4, 7) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &a, toks, 20), 8);
    CHECK(a.blocks[0] == b0);
    CHECK_EQ_INT(p.n_cached, 0);
    dsp_kv_seq_free(&p, &a);
    /* pressure: a sequence needing every block evicts the cached ones (oldest first), never a used one */
    CHECK(dsp_kv_seq_init(&a, 32, 4, 9) == DSP_OK);
    CHECK(dsp_kv_seq_reserve(&p, &a, 32) == DSP_OK);
    CHECK_EQ_INT(p.n_cached, 0);
    CHECK(p.n_evicted == 2);
    CHECK(dsp_kv_seq_init(&b, 32, 4, 7) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &b, toks, 20), 0); /* evicted: gone from the table */
    CHECK_EQ_INT(dsp_kv_seq_reserve(&p, &b, 1), DSP_ERR_NOMEM);   /* a running sequence is never evicted */
    dsp_kv_seq_free(&p, &b);
    dsp_kv_seq_free(&p, &a);
    dsp_kv_pool_destroy(&p);
}

static void test_lru_order_and_clear(void) {
    dsp_kv_pool p;
    CHECK(dsp_kv_pool_create(&p, 2, 4, true) == DSP_OK);
    int32_t x[2] = {1, 2}, y[2] = {3, 4}, z[2] = {5, 6};
    dsp_kv_seq s;
    uint32_t bx, by;
    CHECK(dsp_kv_seq_init(&s, 8, 2, 0) == DSP_OK);
    fill(&p, &s, x, 2);
    bx = s.blocks[0];
    dsp_kv_seq_free(&p, &s);
    CHECK(dsp_kv_seq_init(&s, 8, 2, 0) == DSP_OK);
    fill(&p, &s, y, 2);
    by = s.blocks[0];
    dsp_kv_seq_free(&p, &s);
    /* touch x: y becomes the oldest */
    CHECK(dsp_kv_seq_init(&s, 8, 2, 0) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &s, x, 2), 2);
    dsp_kv_seq_free(&p, &s);
    CHECK(dsp_kv_seq_init(&s, 8, 2, 0) == DSP_OK);
    fill(&p, &s, z, 2);
    CHECK(dsp_kv_seq_reserve(&p, &s, 6) == DSP_OK); /* 1 free + 1 eviction: y (the oldest) goes, x stays */
    CHECK(s.blocks[1] == by || s.blocks[2] == by);
    dsp_kv_seq_free(&p, &s);
    dsp_kv_seq t;
    CHECK(dsp_kv_seq_init(&t, 8, 2, 0) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &t, x, 2), 2);
    CHECK(t.blocks[0] == bx);
    dsp_kv_seq_free(&p, &t);
    dsp_kv_pool_clear_cache(&p);
    CHECK_EQ_INT(p.n_cached, 0);
    CHECK_EQ_INT(p.n_free, 4);
    dsp_kv_pool_destroy(&p);
}

/* Many random operations: the table, the LRU and the free list always agree. */
static void test_random_ops(void) {
    dsp_kv_pool p;
    CHECK(dsp_kv_pool_create(&p, 2, 16, true) == DSP_OK);
    dsp_kv_seq seqs[4];
    int32_t toks[4][32];
    uint32_t rng = 12345;
    for (int i = 0; i < 4; i++) CHECK(dsp_kv_seq_init(&seqs[i], 32, 2, 0) == DSP_OK);
    for (int it = 0; it < 5000; it++) {
        rng = rng * 1664525u + 1013904223u;
        int i = (int)(rng >> 8) % 4, op = (int)(rng >> 16) % 4;
        dsp_kv_seq *s = &seqs[i];
        if (op == 0) { /* restart with a prompt from a small alphabet (lots of sharing) */
            dsp_kv_seq_free(&p, s);
            CHECK(dsp_kv_seq_init(s, 32, 2, 0) == DSP_OK);
            for (int k = 0; k < 32; k++) toks[i][k] = (int32_t)((rng >> (k % 8)) & 1);
            dsp_kv_seq_attach_prefix(&p, s, toks[i], 31);
        } else if (op == 1 || op == 2) { /* grow and publish */
            uint32_t n = s->n_tokens + 1 + (rng >> 20) % 5;
            if (n > 32) n = 32;
            if (dsp_kv_seq_reserve(&p, s, n) == DSP_OK) {
                s->n_tokens = n;
                dsp_kv_seq_publish(&p, s, toks[i], n);
            }
        } else { /* roll back a little, never into keyed blocks' data without make_writable */
            uint32_t n = s->n_tokens > 3 ? s->n_tokens - 3 : 0;
            dsp_kv_seq_truncate(&p, s, n);
            dsp_status st = dsp_kv_seq_make_writable(&p, s, n); /* may need a block for the copy */
            CHECK(st == DSP_OK || st == DSP_ERR_NOMEM);
        }
        uint32_t held = 0;
        for (uint32_t b = 0; b < p.n_blocks; b++) held += p.refcnt[b] > 0;
        CHECK_EQ_INT(held + p.n_free + p.n_cached, p.n_blocks);
    }
    for (int i = 0; i < 4; i++) dsp_kv_seq_free(&p, &seqs[i]);
    CHECK_EQ_INT(p.n_free + p.n_cached, p.n_blocks);
    dsp_kv_pool_destroy(&p);
}

static void test_cow(void) {
    dsp_kv_pool p;
    fake_store fs;
    memset(&fs, 0, sizeof fs);
    CHECK(dsp_kv_pool_create(&p, 4, 8, true) == DSP_OK);
    CHECK(dsp_kv_pool_add_store(&p, fake_copy, &fs) == DSP_OK);
    int32_t toks[16] = {0};
    dsp_kv_seq a, b;
    CHECK(dsp_kv_seq_init(&a, 32, 4, 0) == DSP_OK);
    fill(&p, &a, toks, 8);
    fs.data[a.blocks[1]] = 42;
    CHECK(dsp_kv_seq_init(&b, 32, 4, 0) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_attach_prefix(&p, &b, toks, 8), 8);
    /* b rolls back into a shared block and writes: copy-on-write keeps a intact */
    dsp_kv_seq_truncate(&p, &b, 6);
    CHECK(dsp_kv_seq_make_writable(&p, &b, 6) == DSP_OK);
    CHECK(b.blocks[1] != a.blocks[1]);
    CHECK(b.blocks[0] == a.blocks[0]); /* untouched block stays shared */
    CHECK_EQ_INT(fs.data[b.blocks[1]], 42);
    CHECK_EQ_INT(fs.copies, 1);
    CHECK_EQ_INT(b.n_keyed, 1);
    dsp_kv_seq_free(&p, &a);
    /* now a's block 1 is cached and ours is private: writing into our own published block unpublishes */
    dsp_kv_seq_free(&p, &b);
    CHECK_EQ_INT(p.n_free + p.n_cached, 8);
    dsp_kv_pool_destroy(&p);
}

static void test_bad_shape(void) {
    dsp_kv_pool p;
    CHECK_EQ_INT(dsp_kv_pool_create(&p, 0, 6, false), DSP_ERR_INVALID_ARG);
    CHECK_EQ_INT(dsp_kv_pool_create(&p, 4, 0, false), DSP_ERR_INVALID_ARG);
}

int main(void) {
    DSP_RUN(test_reserve_truncate);
    DSP_RUN(test_prefix_cache);
    DSP_RUN(test_lru_order_and_clear);
    DSP_RUN(test_random_ops);
    DSP_RUN(test_cow);
    DSP_RUN(test_bad_shape);
    return dsp_test_summary();
}
