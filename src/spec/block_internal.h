/* spec/block_internal: the block drafter's state, shared by block_load.c (host: config, tensors,
 * checks) and block.c (backend: weights, buffers, KV store, the two forward steps). */
#ifndef DSP_SPEC_BLOCK_INTERNAL_H
#define DSP_SPEC_BLOCK_INTERNAL_H

#include "spec/block.h"

typedef struct blk_layer {
    dsp_bweight *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *q_norm, *k_norm;
    dsp_bweight *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
} blk_layer;

struct dsp_block_drafter {
    dsp_block_info info;
    dsp_model *m;                 /* the stack: path, safetensors, hp (the drafter's), w.layers, owned tensors */
    const dsp_model *target;
    /* host tensors (into m->st or the target) */
    const dsp_tensor *fc;         /* (n_taps * n_embd -> n_embd) */
    const dsp_tensor *hidden_norm, *norm; /* (n_embd) f32 */
    const dsp_tensor *embd;       /* (n_embd, n_vocab): the target's or an own copy */
    const dsp_tensor *head;       /* (n_embd -> n_vocab) */
    const dsp_tensor *mk_w1;      /* (r, n_vocab): row t = W1[t] (an embedding) */
    const dsp_tensor *mk_w2;      /* (r -> n_vocab) */
    const dsp_tensor *mk_pw, *mk_pb; /* gated: gate_proj (n_embd + r -> r); rnn: joint_proj (2r + n_embd -> 3r); + bias */
    const dsp_tensor *conf_w;     /* (n_embd [+ r] -> 1) */
    const dsp_tensor *conf_b;     /* (1) f32 */
    /* backend */
    dsp_backend *be;
    dsp_kv_pool *pool;
    dsp_kv_store *store;
    dsp_block_limits lim;
    int max_rows;                 /* rows of one forward: max(context rows, max_reqs * block) */
    dsp_bweight *b_fc, *b_hnorm, *b_norm, *b_embd, *b_head, *b_w2;
    bool own_embd, own_head;      /* b_embd / b_head created here (else the target forward's) */
    blk_layer *layers;            /* (n_layers) */
    dsp_buf *x, *h, *q, *k, *v, *att, *gate, *up; /* (max_rows, width) */
    dsp_buf *logits;              /* (max_reqs * n_draft, n_vocab) */
    dsp_buf *mk_e, *mk_y;         /* (max_reqs, r), (max_reqs, n_vocab) */
    bool host_chain;              /* $DSP_DRAFT_HOST_CHAIN: never on the backend */
    dsp_buf *mk_w1f;              /* (n_vocab, r) W1 as f32 for ops->markov_greedy (NULL: the chain runs on the host) */
    dsp_buf *inv_freq;
    dsp_rope rope;
    /* host scratch */
    int32_t *btok, *bpos, *bseq, *bkeys, *brow; /* (max_rows) */
    dsp_kv_seq **bseqs;           /* (max_reqs) */
    int *bout0;                   /* (max_reqs) each request's first row in the logits */
    int *bmrow;                   /* (max_reqs) each request's row in the Markov step (-1: none) */
    float *hlogits;               /* (max_reqs * n_draft, n_vocab) */
    float *hhid;                  /* (max_reqs * n_draft, n_embd) normed hidden rows */
    float *he;                    /* (max_reqs, r) Markov embeddings of the previous tokens */
    float *hbias;                 /* (max_reqs, n_vocab) */
    int32_t *btoks;               /* (max_reqs * n_draft) the tokens of the device chain */
    int *bn;                      /* (max_reqs) slots per request in the device chain */
    int32_t *banchor;             /* (max_reqs) */
    float *conf_wf;               /* (n_embd + r) the confidence weights as f32 */
    float *mk_pwf, *mk_pbf;       /* mk_pw / mk_pb as f32 (gated, rnn) */
    float *mk_state;              /* (max_reqs, r) the rnn head's state; (max_reqs, 3r) scratch after it */
    float conf_bias;
    /* draft vocabulary (block.h): Vd tokens, vids ascending (NULL: Vd = n_vocab, all) */
    int Vd;
    int32_t *vids;
    dsp_tensor head_sub, w2_sub;  /* the gathered rows of head / mk_w2 (data: below) */
    void *head_sub_mem, *w2_sub_mem;
};

/* block_load.c: d->vids / Vd / head_sub / w2_sub for a draft vocabulary of n tokens (1 <= n <
 * n_vocab); the gathered copies are uploaded by block.c */
dsp_status dsp_block_pick_vocab(dsp_block_drafter *d, int n);

#endif
