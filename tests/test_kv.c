/* kv: block allocation, O(1) rollback, context limit, pool exhaustion, shared prefixes with
 * copy-on-write. */
#include "dsp_test.h"

#include "kv/kv.h"

static void test_reserve_truncate(void) {
    dsp_kv_pool p;
    CHECK(dsp_kv_pool_create(&p, 2, 8, 4, 6) == DSP_OK); /* 6 blocks of 4 tokens */
    dsp_kv_seq s;
    CHECK(dsp_kv_seq_init(&s, 16, 4) == DSP_OK);            /* capacity 16 tokens = 4 blocks */
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
    CHECK(dsp_kv_seq_init(&t, 64, 4) == DSP_OK);
    CHECK_EQ_INT(dsp_kv_seq_reserve(&p, &t, 5 * 4), DSP_ERR_NOMEM); /* only 4 blocks free */
    CHECK_EQ_INT(t.n_blocks, 0);                                    /* nothing taken */
    CHECK_EQ_INT(p.n_free, 4);
    dsp_kv_seq_free(&p, &t);
    dsp_kv_seq_free(&p, &s);
    CHECK_EQ_INT(p.n_free, 6);
    dsp_kv_pool_destroy(&p);
}

static void test_share_and_cow(void) {
    dsp_kv_pool p;
    CHECK(dsp_kv_pool_create(&p, 1, 2, 4, 8) == DSP_OK);
    dsp_kv_seq a, b;
    CHECK(dsp_kv_seq_init(&a, 32, 4) == DSP_OK);
    CHECK(dsp_kv_seq_init(&b, 32, 4) == DSP_OK);
    CHECK(dsp_kv_seq_reserve(&p, &a, 10) == DSP_OK);
    for (uint32_t pos = 0; pos < 10; pos++) dsp_kv_k(&p, &a, 0, pos)[0] = (float)pos;
    a.n_tokens = 10;
    CHECK_EQ_INT(dsp_kv_seq_share_prefix(&p, &b, &a, 10), 8); /* whole blocks only */
    CHECK_EQ_INT(p.refcnt[a.blocks[0]], 2);
    CHECK(dsp_kv_k(&p, &b, 0, 7)[0] == 7.0f);
    /* b rolls back into a shared block and writes: copy-on-write keeps a intact */
    dsp_kv_seq_truncate(&p, &b, 6);
    CHECK(dsp_kv_seq_make_writable(&p, &b, 6) == DSP_OK);
    CHECK(b.blocks[1] != a.blocks[1]);
    CHECK(b.blocks[0] == a.blocks[0]); /* untouched block stays shared */
    CHECK(dsp_kv_k(&p, &b, 0, 5)[0] == 5.0f); /* copied content */
    dsp_kv_k(&p, &b, 0, 6)[0] = -1.0f;
    CHECK(dsp_kv_k(&p, &a, 0, 6)[0] == 6.0f);
    dsp_kv_seq_free(&p, &a);
    dsp_kv_seq_free(&p, &b);
    CHECK_EQ_INT(p.n_free, 8);
    dsp_kv_pool_destroy(&p);
}

static void test_bad_shape(void) {
    dsp_kv_pool p;
    CHECK_EQ_INT(dsp_kv_pool_create(&p, 0, 8, 4, 6), DSP_ERR_INVALID_ARG);
}

int main(void) {
    DSP_RUN(test_reserve_truncate);
    DSP_RUN(test_share_and_cow);
    DSP_RUN(test_bad_shape);
    return dsp_test_summary();
}
