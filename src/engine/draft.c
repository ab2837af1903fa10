/* engine/draft: the drafting part of the round loop (DESIGN.md §1 step 2; see engine.h).
 *
 * Per round, before the layout: every decoding request gets its proposal. A request's own drafter
 * (prompt lookup, or a test's) proposes on the host; requests that draft with the engine's block
 * drafter (dflash, dspark, hybrid when lookup has no long match, auto when the drafter is expected to
 * pay best: pick_source) are drafted together, in one block
 * forward (chunks of max_breqs requests); DSpark's confidence truncation and the max-draft cap or
 * --max-draft auto's choice then decide how many drafts each request verifies. After the target
 * forward of a round with a request that may draft with the block drafter (dsp_engine_block_ctx),
 * its context step writes its K/V for every row of that forward (block.h), so such a request's
 * drafter cache covers exactly what its target cache does; rounds without one skip the step.
 *
 * --max-draft auto (spec/cost.h): the engine's cost profile is measured on first use (or read from
 * the cache). Before drafting, a request runs the block drafter only if, with its acceptance
 * estimate, verifying at least one draft is expected to pay for the drafter's cost; after
 * drafting, the round's draft lengths are chosen together over all decoding requests. */
#include "engine/engine.h"

#include "core/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifndef DSP_LIB_VERSION
#define DSP_LIB_VERSION "dev"
#endif

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

uint64_t dsp_engine_draft_kv_bytes(const dsp_block_drafter *bd, uint64_t kv_elem) {
    if (!bd) return 0;
    const dsp_block_info *in = dsp_block_get_info(bd);
    return 2ull * (uint64_t)in->n_layers * (uint64_t)in->n_head_kv * (uint64_t)in->head_dim * kv_elem;
}

/* --draft-vocab auto: all tokens on a backend with ops->markov_greedy, else AUTO_VOCAB_SUBSET tokens when the vocabulary has more than AUTO_VOCAB_MIN
 * tokens and the LM head is at least 1/8 of the target's parameters (then the head is most of the
 * drafter's round: SmolLM2-135M 21%, Qwen3-0.6B 26%; Qwen3-4B's tied head is 10%), else all of them.
 * README "Draft vocabulary" has the measurements behind both numbers. */
#define AUTO_VOCAB_MIN 32768
#define AUTO_VOCAB_SUBSET 16384
static int32_t draft_vocab_size(const dsp_engine *e, int32_t want) {
    if (want == DSP_DRAFT_VOCAB_FULL) return 0;
    if (want != DSP_DRAFT_VOCAB_AUTO) return want;
    /* a backend that keeps the slots' chain on the device (CUDA) reads the head once per round,
     * memory-bound and cheap, and a subset would send the chain back to the host: all tokens */
    if (e->be->ops->markov_greedy && e->bdi->markov_rank > 0) return 0;
    const uint64_t head = (uint64_t)e->n_vocab * (uint64_t)e->n_embd;
    return e->n_vocab > AUTO_VOCAB_MIN && head * 8 >= e->m->info.n_params ? AUTO_VOCAB_SUBSET : 0;
}

/* floats of one row of the block drafter's taps */
static size_t ctx_width(const dsp_engine *e) { return (size_t)e->bdi->n_taps * (size_t)dsp_fwd_n_embd(e->fwd); }

dsp_status dsp_engine_draft_init(dsp_engine *e, const char *path, int32_t draft_vocab) {
    (void)path;
    const dsp_block_info *in = e->bdi;
    if (draft_vocab < DSP_DRAFT_VOCAB_FULL || draft_vocab > e->n_vocab)
        return dsp_error(DSP_ERR_INVALID_ARG, "a draft vocabulary of %d tokens: the model's vocabulary has %d (give 1..%d tokens, or all)",
                         draft_vocab, e->n_vocab, e->n_vocab);
    e->max_breqs = e->max_batch < 8 ? e->max_batch : 8;
    e->breqs = calloc((size_t)e->max_batch, sizeof *e->breqs);
    if (!e->breqs) return dsp_error(DSP_ERR_NOMEM, "no memory");
    dsp_block_limits lim = {e->batch_tokens, e->max_breqs, e->n_ctx, draft_vocab_size(e, draft_vocab)};
    dsp_status st = dsp_block_attach(e->bd, e->be, e->kv, in->shares_embd ? dsp_fwd_embd(e->fwd) : NULL,
                                     in->shares_head ? dsp_fwd_output(e->fwd) : NULL, &lim);
    if (st) return st;
    e->lazy_ctx = e->be->kind == DSP_BACKEND_CPU; /* the CUDA backend: eager, until measured there */
    if (e->lazy_ctx) {
        e->ctx_tok = malloc(sizeof(int32_t) * 3 * (size_t)e->batch_tokens);
        e->ctx_seqs = malloc(sizeof *e->ctx_seqs * (size_t)e->max_batch);
        e->ctx_reqs = malloc(sizeof *e->ctx_reqs * (size_t)e->max_batch);
        if (!e->ctx_tok || !e->ctx_seqs || !e->ctx_reqs) return dsp_error(DSP_ERR_NOMEM, "no memory");
        e->ctx_pos = e->ctx_tok + e->batch_tokens, e->ctx_seq = e->ctx_pos + e->batch_tokens;
        if ((st = e->be->ops->buf_create(e->be, (size_t)e->batch_tokens * ctx_width(e), &e->ctx_stage))) return st;
    }
    DSP_LOGD("drafter %s: %s %s, block %d (%d drafts), %d layers, taps [%d..%d] (%d), %s%s%s", in->path, in->layout_name,
             in->dspark ? "DSpark" : "DFlash", in->block, in->n_draft, in->n_layers, in->tap_layers[0], in->tap_layers[in->n_taps - 1],
             in->n_taps, in->shares_embd && in->shares_head ? "embedding and LM head shared with the target" : "own embedding/LM head",
             in->markov_rank ? ", Markov head: " : "", in->markov_rank ? dsp_markov_type_name(in->markov_type) : "");
    DSP_LOGD("drafter %s: draft vocabulary %d of %d tokens (%s)", in->path, in->draft_vocab, e->n_vocab, in->draft_vocab_source);
    return DSP_OK;
}

bool dsp_engine_drafter_info(const dsp_engine *e, dsp_drafter_info *out) {
    memset(out, 0, sizeof *out);
    if (!e->bd) return false;
    const dsp_block_info *in = e->bdi;
    out->path = in->path;
    out->kind = in->dspark ? "dspark" : "dflash";
    out->layout = in->layout_name;
    out->block = in->block;
    out->n_draft = in->n_draft;
    out->n_layers = in->n_layers;
    out->n_taps = in->n_taps;
    for (int i = 0; i < in->n_taps && i < 16; i++) out->tap_layers[i] = in->tap_layers[i];
    out->mask_token = in->mask_token;
    out->markov_rank = in->markov_rank;
    out->markov_head = in->markov_rank ? dsp_markov_type_name(in->markov_type) : "none";
    out->confidence_head = in->confidence;
    out->shares_embedding = in->shares_embd;
    out->shares_lm_head = in->shares_head;
    out->n_params = in->n_params;
    out->layer_type = dsp_dtype_name(in->layer_type);
    out->draft_vocab = in->draft_vocab;
    out->draft_vocab_source = in->draft_vocab_source;
    return true;
}

dsp_spec_mode dsp_engine_resolve_mode(const dsp_engine *e, dsp_spec_mode m) {
    if (m != DSP_SPEC_AUTO) return m;
    return e->bd ? DSP_SPEC_HYBRID : DSP_SPEC_LOOKUP;
}

/* ---- per request ---------------------------------------------------------------------------- */

static bool block_may_pay(dsp_engine *e, const dsp_req *r);

dsp_status dsp_engine_draft_setup(dsp_engine *e, dsp_req *r, dsp_drafter *drafter) {
    const dsp_gen_params *p = &r->p;
    r->mode = dsp_engine_resolve_mode(e, p->mode);
    r->pick = p->mode == DSP_SPEC_AUTO && e->bd;
    r->bslot = -1;
    for (int b = 0; b < DSP_ACCEPT_BUCKETS; b++) dsp_accept_init_prior(&r->acc[b], &e->acc_pool[b]);
    if (r->pick && !block_may_pay(e, r)) {
        r->pick = false;
        r->mode = DSP_SPEC_LOOKUP;
        e->st.auto_lookup_only++;
    }
    dsp_rng_seed(&r->drng, p->seed ^ 0x5DEECE66DULL);
    bool block = r->mode == DSP_SPEC_DFLASH || r->mode == DSP_SPEC_DSPARK || r->mode == DSP_SPEC_HYBRID;
    if (block && !e->bd)
        return dsp_error(DSP_ERR_INVALID_ARG, "mode %s needs a block drafter: start the engine with a draft model (--draft-model)",
                         dsp_spec_mode_to_string(r->mode));
    if (r->mode == DSP_SPEC_DSPARK && !e->bdi->dspark)
        return dsp_error(DSP_ERR_INVALID_ARG, "mode dspark needs a DSpark drafter; %s is a DFlash drafter (no Markov or confidence head): use mode dflash",
                         e->bdi->path);
    dsp_status st = DSP_OK;
    if (drafter) {
        r->drafter = drafter;
    } else if (r->mode == DSP_SPEC_LOOKUP || r->mode == DSP_SPEC_HYBRID) {
        int32_t cap = p->max_draft == DSP_DRAFT_AUTO ? DSP_MAX_DRAFT : p->max_draft;
        dsp_lookup_params lp = {p->lookup_min_n, p->lookup_max_n, cap, e->n_ctx, true};
        st = dsp_lookup_create(&lp, &r->drafter);
        r->own_drafter = true;
    }
    r->block = block && !drafter;
    if (!st && r->drafter) dsp_drafter_reset(r->drafter);
    bool want_q = (r->drafter && r->drafter->supplies_q) || (r->block && p->draft_sample && p->temperature > 0);
    size_t q_rows = r->drafter && r->drafter->supplies_q ? DSP_MAX_DRAFT : (size_t)(e->bd ? e->bdi->n_draft : 0);
    if (!st && want_q && !(r->q = malloc(sizeof(float) * (size_t)e->n_vocab * q_rows))) st = dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!st && r->drafter && r->drafter->n_taps > 0) { /* host taps: one tap-layer set per engine */
        const int32_t *want = e->bd ? e->bdi->tap_layers : e->tap_layers;
        int n_want = e->bd ? e->bdi->n_taps : e->n_taps;
        if (n_want && (n_want != r->drafter->n_taps || memcmp(want, r->drafter->tap_layers, sizeof(int32_t) * (size_t)n_want)))
            st = dsp_error(DSP_ERR_UNSUPPORTED, "drafters with different tap layers cannot share an engine");
        else if (!e->taps && !(e->taps = malloc(sizeof(float) * (size_t)e->batch_tokens * DSP_SPEC_MAX_TAPS * (size_t)e->n_embd)))
            st = dsp_error(DSP_ERR_NOMEM, "no memory for hidden-state taps");
        else {
            e->n_taps = r->drafter->n_taps;
            memcpy(e->tap_layers, r->drafter->tap_layers, sizeof(int32_t) * (size_t)e->n_taps);
        }
    }
    return st;
}

uint32_t dsp_engine_draft_slack(const dsp_engine *e, const dsp_req *r) { return r->block ? (uint32_t)e->bdi->block : 0; }

/* ---- the cost profile ----------------------------------------------------------------------- */

/* The fastest of the repeats: other processes only ever add time (the machines are shared), so the
 * minimum estimates the cost on a quiet machine better than the median. */
static double fastest(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
}

/* Feed tokens [from, to) of a dummy sequence (no logits) */
static dsp_status fill(dsp_engine *e, dsp_kv_seq *s, uint32_t from, uint32_t to) {
    for (uint32_t at = from; at < to;) {
        int n = (int)(to - at < (uint32_t)e->batch_tokens ? to - at : (uint32_t)e->batch_tokens);
        for (int i = 0; i < n; i++) e->btok[i] = (int32_t)(((at + (uint32_t)i) * 7919u + 13u) % (uint32_t)e->n_vocab), e->bpos[i] = (int32_t)(at + (uint32_t)i), e->bseq[i] = 0;
        e->bseqs[0] = s;
        dsp_status st = dsp_engine_forward(e, n, 1, 0, false, false, DSP_CTX_ALL);
        if (st) return st;
        at += (uint32_t)n;
    }
    return DSP_OK;
}

/* the time of an n-row forward after the sequence's context (logits for every row, as a verify) */
static dsp_status time_rows(dsp_engine *e, dsp_kv_seq *s, int n, double *ms) {
    uint32_t L = s->n_tokens;
    int nl = n < e->max_rows ? n : e->max_rows;
    for (int i = 0; i < n; i++) e->btok[i] = (int32_t)((L + (uint32_t)i) % (uint32_t)e->n_vocab), e->bpos[i] = (int32_t)L + i, e->bseq[i] = 0;
    for (int i = 0; i < nl; i++) e->brow[i] = n - nl + i;
    e->bseqs[0] = s;
    double t0 = now_ms();
    dsp_status st = dsp_engine_forward(e, n, 1, nl, false, false, DSP_CTX_ALL);
    *ms = now_ms() - t0;
    dsp_kv_seq_truncate(e->kv, s, L);
    return st;
}

static dsp_status measure(dsp_engine *e, dsp_spec_profile *p) {
    static const int grid[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 33, 48, 64, 96, 128, 192, 256, 384, 512};
    const int reps = 5;
    uint32_t L0 = e->n_ctx / 8 < 256 ? e->n_ctx / 8 : 256, L1 = e->n_ctx / 2 < 4 * L0 ? e->n_ctx / 2 : 4 * L0;
    int max_rows = e->max_batch * (1 + 8) > 1 + DSP_MAX_DRAFT ? e->max_batch * (1 + 8) : 1 + DSP_MAX_DRAFT;
    if (max_rows > e->batch_tokens) max_rows = e->batch_tokens;
    if ((uint32_t)max_rows + 1 > e->n_ctx - L1) max_rows = (int)(e->n_ctx - L1) - 1;
    if (L0 < 16 || max_rows < 2) return dsp_error(DSP_ERR_RANGE, "the context (%u tokens) is too short to profile", e->n_ctx);
    memset(p, 0, sizeof *p);
    for (size_t g = 0; g < sizeof grid / sizeof grid[0] && p->n < DSP_PROFILE_MAX && grid[g] <= max_rows; g++) p->rows[p->n++] = grid[g];
    dsp_kv_seq s;
    dsp_status st = dsp_fwd_seq_init(e->fwd, &s);
    if (st) return st;
    double t[DSP_PROFILE_MAX][8], t1[8], tc[8];
    /* Each row count's forwards run back to back, after two unmeasured ones, as a round loop runs
     * them: on a 2-vCPU Xeon a 1-row forward right after a long one (or 30 ms idle) took 1.5-1.9x
     * the decode loop's step and needed ~5 forwards to get back to it, so measured after the
     * previous point's 512-row forward (the order before) the curve's base was 1.9x a real round's
     * and --max-draft auto drafted where drafting lost. */
    if (!(st = fill(e, &s, 0, L0))) {
        double w;
        for (int i = 0; i < p->n && !st; i++) {
            for (int k = 0; k < 2 && !st; k++) st = time_rows(e, &s, p->rows[i], &w); /* warm-up */
            for (int rep = 0; rep < reps && !st; rep++) {
                double c0 = e->st.draft_ms;
                st = time_rows(e, &s, p->rows[i], &t[i][rep]);
                if (i == 0) tc[rep] = e->st.draft_ms - c0; /* the drafter's context step in a 1-row forward */
            }
        }
    }
    if (!st && !(st = fill(e, &s, L0, L1)))
        for (int rep = -2; rep < reps && !st; rep++) st = time_rows(e, &s, 1, &t1[rep < 0 ? 0 : rep]); /* two warm-ups, as above */
    if (!st) {
        double base = fastest(t[0], reps);
        p->one_row_ms = base;
        p->ctx_tokens = L0;
        for (int i = 0; i < p->n; i++) p->rel[i] = (float)(fastest(t[i], reps) / base);
        p->draft_ctx_rel = e->bd ? (float)(fastest(tc, reps) / base) : 0;
        for (int i = 1; i < p->n; i++) /* more rows never cost less: noise must not make a deeper draft look free */
            if (p->rel[i] < p->rel[i - 1]) p->rel[i] = p->rel[i - 1];
        double slope = (fastest(t1, reps) / base - 1.0) / (double)(L1 - L0);
        p->ctx_rel_per_key = slope > 0 ? (float)slope : 0;
    }
    /* the block drafter: one request's block, then up to 4 requests in one call */
    if (!st && e->bd) {
        const dsp_block_info *in = e->bdi;
        int R = e->max_breqs < 4 ? e->max_breqs : 4;
        dsp_kv_seq sq[4];
        int n_init = 0;
        for (; n_init < R && !st; n_init++) {
            if ((st = dsp_fwd_seq_init(e->fwd, &sq[n_init]))) break;
            st = fill(e, &sq[n_init], 0, 32);
        }
        double td[2][8];
        for (int which = 0; which < 2 && !st; which++) {
            int nr = which ? R : 1;
            for (int rep = 0; rep <= reps && !st; rep++) {
                for (int j = 0; j < nr; j++) {
                    dsp_block_req *q = &e->breqs[j];
                    memset(q, 0, sizeof *q);
                    q->kv = &sq[j], q->anchor = 1, q->start = 32, q->n_slots = in->block, q->n_want = in->n_draft;
                    q->markov = q->confidence = in->dspark;
                    q->stop_below = -INFINITY;
                }
                double t0 = now_ms();
                st = dsp_block_draft(e->bd, e->breqs, nr);
                if (rep) td[which][rep - 1] = now_ms() - t0; /* the first is a warm-up */
                for (int j = 0; j < nr; j++) dsp_kv_seq_truncate(e->kv, &sq[j], 32);
            }
        }
        if (!st) {
            p->draft_rel = (float)(fastest(td[0], reps) / p->one_row_ms);
            double per = R > 1 ? (fastest(td[1], reps) - fastest(td[0], reps)) / (R - 1) / p->one_row_ms : p->draft_rel;
            p->draft_rel_per_req = per > 0 ? (float)per : 0;
        }
        for (int j = 0; j < n_init; j++) dsp_kv_seq_free(e->kv, &sq[j]);
    }
    dsp_kv_seq_free(e->kv, &s);
    return st;
}

/* A sanitized or unoptimized build runs many times slower: its curve must not be read by a release
 * build. A sanitized build (a test build) may read an optimized build's curve, so that its test
 * servers do not each measure one (minutes under ASan); the choices it makes from it stay lossless. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PROFILE_BUILD "sanitized"
#define PROFILE_SANITIZED 1
#elif defined(__OPTIMIZE__)
#define PROFILE_BUILD "optimized"
#else
#define PROFILE_BUILD "O0"
#endif

static void profile_key(const dsp_engine *e, const char *build, char *key, size_t cap) {
    struct stat sb;
    long long mt = stat(e->m->path, &sb) ? 0 : (long long)sb.st_mtime;
    const dsp_weights *w = &e->m->w;
    /* the weight types (--quantize changes them in the same file) and the drafter's shared
     * embedding / head (block_load.c share) change the costs */
    snprintf(key, cap, "model=%s:%llu:%lld:%s/%s/%s|drafter=%s:%llu:%d%d:v%d:%s|backend=%s|batch=%d:%d|ctx=%u|version=%s|build=%s", e->m->path,
             (unsigned long long)e->m->info.file_size, mt, dsp_dtype_name(w->tok_embd->type), dsp_dtype_name(w->output->type),
             dsp_dtype_name(w->layers[0].ffn_down->type), e->bd ? e->bdi->path : "", e->bd ? (unsigned long long)e->bdi->n_params : 0ull,
             e->bd ? (int)e->bdi->shares_embd : 0, e->bd ? (int)e->bdi->shares_head : 0, e->bd ? e->bdi->draft_vocab : 0,
             e->bd ? dsp_dtype_name(e->bdi->layer_type) : "", e->be->desc, e->max_batch, e->batch_tokens, e->n_ctx, DSP_LIB_VERSION, build);
}

/* e->prof from the cache entry of `build`; key and path are that entry's either way */
static bool read_cached(dsp_engine *e, const char *build, char *key, size_t kcap, char *path, size_t pcap) {
    profile_key(e, build, key, kcap);
    dsp_cost_cache_path(key, path, pcap);
    return dsp_cost_cache_read(path, key, &e->prof);
}

dsp_status dsp_engine_profile(dsp_engine *e, dsp_spec_profile *out) {
    if (!e->have_prof) {
        char key[2048], path[512];
        bool cached = false;
#ifdef PROFILE_SANITIZED
        cached = read_cached(e, "optimized", key, sizeof key, path, sizeof path);
#endif
        if (!cached && !read_cached(e, PROFILE_BUILD, key, sizeof key, path, sizeof path)) {
            double t0 = now_ms();
            dsp_status st = measure(e, &e->prof);
            e->profile_ms += now_ms() - t0;
            if (st) { /* not again: dsp_cost_time's linear guess from now on */
                DSP_LOGW("the speculation cost profile could not be measured (%s): --max-draft auto uses a guess", dsp_last_error());
                memset(&e->prof, 0, sizeof e->prof);
                e->have_prof = true;
                if (out) *out = e->prof;
                return st;
            }
            dsp_cost_cache_write(path, key, &e->prof);
            snprintf(e->prof.cache_path, sizeof e->prof.cache_path, "%s", path);
            DSP_LOGI("speculation cost profile measured in %.1f s: 1-row forward %.2f ms, c(4) = %.2f, c(8) = %.2f, drafter %.2f; cached in %s",
                     (now_ms() - t0) / 1e3, e->prof.one_row_ms, dsp_cost_time(&e->prof, 5, 0), dsp_cost_time(&e->prof, 9, 0),
                     e->prof.draft_rel, path);
        }
        e->have_prof = true;
    }
    if (out) *out = e->prof;
    return DSP_OK;
}

/* ---- the round ------------------------------------------------------------------------------ */

bool dsp_engine_block_ctx(const dsp_req *r) { return r->block || r->pick; }

/* ---- the lazy context step ------------------------------------------------------------------
 * The block drafter's context step writes its K/V for the rows of a target forward. Run inside every
 * round (as it still is on the CUDA backend), it streams the drafter's fc and K/V weights once a
 * round per drafting request, also for the rows the verifier rejects, and in mode auto also in the
 * rounds that pick prompt lookup (on the 2-vCPU EPYC, copy-heavy text: 3-3.5% of the decode time,
 * the drafter chosen in 8% of the rounds). Lazily, a decoding request keeps the taps of its committed
 * rows (at most DSP_CTX_KEEP) and the step runs over all of them just before its next block draft:
 * one weight pass for several rounds' rows, none for rejected rows. The drafter's K/V of a row does
 * not depend on the other rows (a projection, no attention among context rows) and the kernels are
 * batch-invariant, so the drafts are the same bits. Prefill chunks still run it at once. Blocks are
 * published to the prefix cache only up to the rows whose drafter K/V is written. */
#define DSP_CTX_KEEP 32

/* one context step over rows already in e->ctx_stage */
static dsp_status ctx_run(dsp_engine *e, int m, int ns) {
    if (m == 0) return DSP_OK;
    e->st.context_rows += (uint64_t)m;
    double t0 = now_ms();
    dsp_status st = dsp_block_context(e->bd, e->ctx_stage, m, e->ctx_tok, e->ctx_pos, e->ctx_seq, ns, e->ctx_seqs);
    e->st.draft_ms += now_ms() - t0;
    return st;
}

/* append r's n_rows taps (rows row0.. of src, at positions pos0..) to the stage: rows *m.., sequence *ns */
static void ctx_stage_rows(dsp_engine *e, int *m, int *ns, dsp_req *r, const dsp_buf *src, int row0, uint32_t pos0, int n_rows) {
    const size_t W = ctx_width(e);
    e->be->ops->copy_rows(e->be, e->ctx_stage, W, (size_t)*m * W, src, W, (size_t)row0 * W, n_rows, W);
    for (int j = 0; j < n_rows; j++, (*m)++) {
        e->ctx_pos[*m] = (int32_t)(pos0 + (uint32_t)j);
        e->ctx_tok[*m] = r->tokens[pos0 + (uint32_t)j];
        e->ctx_seq[*m] = *ns;
    }
    e->ctx_seqs[(*ns)++] = &r->kv;
}

/* the context step over the kept rows of n requests, in steps of at most batch_tokens rows */
static dsp_status ctx_flush(dsp_engine *e, dsp_req *const *rs, int n) {
    int m = 0, ns = 0;
    for (int i = 0; i < n; i++) {
        dsp_req *r = rs[i];
        if (r->ctx_pend == 0) continue;
        if (m + r->ctx_pend > e->batch_tokens || ns == e->max_batch) {
            dsp_status st = ctx_run(e, m, ns);
            if (st) return st;
            m = ns = 0;
        }
        ctx_stage_rows(e, &m, &ns, r, r->ctx_taps, 0, r->ctx_pos0, r->ctx_pend);
        r->ctx_pend = 0;
    }
    return ctx_run(e, m, ns);
}

dsp_status dsp_engine_ctx_keep(dsp_engine *e, dsp_req *r, uint32_t pos0, int32_t n_commit) {
    if (!e->lazy_ctx || !dsp_engine_block_ctx(r) || r->ctx_dropped || n_commit <= 0) return DSP_OK;
    const size_t W = ctx_width(e);
    dsp_status st;
    const int32_t keep = e->batch_tokens < DSP_CTX_KEEP ? e->batch_tokens : DSP_CTX_KEEP; /* a flush fits the stage */
    if (!r->ctx_taps && (st = e->be->ops->buf_create(e->be, (size_t)keep * W, &r->ctx_taps))) return st;
    if (r->ctx_pend + n_commit > keep && (st = ctx_flush(e, &r, 1))) return st;
    if (r->ctx_pend == 0) r->ctx_pos0 = pos0;
    DSP_ASSERT(r->ctx_pos0 + (uint32_t)r->ctx_pend == pos0 && n_commit <= keep); /* n_commit <= the round's rows <= batch_tokens */
    e->be->ops->copy_rows(e->be, r->ctx_taps, W, (size_t)r->ctx_pend * W, dsp_fwd_taps(e->fwd), W, (size_t)r->row0 * W, n_commit, W);
    r->ctx_pend += n_commit;
    return DSP_OK;
}

uint32_t dsp_engine_ctx_len(const dsp_req *r, uint32_t committed) {
    return r->ctx_pend > 0 && r->ctx_pos0 < committed ? r->ctx_pos0 : committed;
}

dsp_status dsp_engine_forward(dsp_engine *e, int n, int n_seqs, int n_logits, bool host_taps, bool argmax, dsp_ctx_mode block_ctx) {
    const bool bd = e->bd && block_ctx != DSP_CTX_NONE;
    int n_taps = bd ? e->bdi->n_taps : host_taps ? e->n_taps : 0;
    const int32_t *tap_layers = bd ? e->bdi->tap_layers : e->tap_layers;
    dsp_batch b = {n, e->btok, e->bseq, e->bpos, n_logits, e->brow, n_taps, n_taps ? tap_layers : NULL};
    dsp_status st = dsp_fwd_run(e->fwd, e->bseqs, n_seqs, &b, argmax ? NULL : e->logits, host_taps && e->taps ? e->taps : NULL);
    if (!st && argmax) st = dsp_fwd_argmax(e->fwd, n_logits, e->argmax);
    if (!st && bd && block_ctx == DSP_CTX_LAZY) { /* the prefill chunks' rows now; decode rows wait (dsp_engine_ctx_keep) */
        int m = 0, ns = 0;
        for (int i = 0; i < e->n_running; i++) {
            dsp_req *r = e->running[i];
            if (r->n_rows == 0 || r->state != DSP_REQ_PREFILL || !dsp_engine_block_ctx(r)) continue;
            ctx_stage_rows(e, &m, &ns, r, dsp_fwd_taps(e->fwd), r->row0, (uint32_t)e->bpos[r->row0], r->n_rows); /* a chunk: consecutive prompt positions */
        }
        return ctx_run(e, m, ns);
    }
    if (!st && bd) {
        e->st.context_rows += (uint64_t)n;
        double t0 = now_ms();
        st = dsp_block_context(e->bd, dsp_fwd_taps(e->fwd), n, e->btok, e->bpos, e->bseq, n_seqs, e->bseqs);
        e->st.draft_ms += now_ms() - t0;
    }
    return st;
}

static int32_t budget(const dsp_engine *e, const dsp_req *r) {
    int64_t k = DSP_MAX_DRAFT;
    if ((int64_t)e->n_ctx - (int64_t)r->n_tokens - 1 < k) k = (int64_t)e->n_ctx - (int64_t)r->n_tokens - 1;
    if ((int64_t)r->p.max_tokens - (int64_t)r->res.n_generated - 1 < k) k = (int64_t)r->p.max_tokens - (int64_t)r->res.n_generated - 1;
    return k > 0 ? (int32_t)k : 0;
}

static float sigmoidf(float c) { return 1.0f / (1.0f + expf(-c)); }

/* drafts kept by DeepSpec's per-slot rule and the cumulative variant */
static int32_t confident(const dsp_gen_params *p, const float *conf, int32_t n) {
    float prod = 1.0f;
    for (int32_t k = 0; k < n; k++) {
        float s = sigmoidf(conf[k]);
        prod *= s;
        if ((p->dspark_threshold > 0 && s < p->dspark_threshold) || (p->dspark_cumulative > 0 && prod < p->dspark_cumulative)) return k;
    }
    return n;
}

/* The host-time average takes a round in as at most 1.5x itself plus a tenth of the round's forward
 * (the first round: at most its forward). A stall is one round, not the host's cost: once, on the
 * 2-vCPU EPYC, a fresh process's first decode round spent ~13 ms outside its 5 ms forward (not seen
 * again in later runs); as the average's seed that counted 2.4 forwards of host time in every round,
 * decaying over ~30 rounds: --max-draft auto drafted 7 where 3-4 pay, and the calibration's
 * predictions came out 2.5x too long (its scales fell to ~0.5). Host time that really grows still
 * gets there, by half again a round. */
double dsp_engine_host_step(double avg, double host, double fwd_ms) {
    const double cap = avg > 0 ? 1.5 * avg + 0.1 * fwd_ms : fwd_ms;
    if (host > cap) host = cap;
    return avg > 0 ? 0.9 * avg + 0.1 * host : host;
}

/* The round's host time outside the forward, in units of the profile's 1-row forward. */
static float host_cost(const dsp_engine *e) { return e->prof.one_row_ms > 0 ? (float)(e->host_ms / e->prof.one_row_ms) : 0; }

/* ---- the calibration -----------------------------------------------------------------------
 * The profile is measured once, in isolation, each row count's forwards back to back. Real rounds
 * differ from it, and by kind: on a 2-vCPU Xeon (L3 480 MiB) the profile's 1-row forward came out
 * at 3.2-4.1 ms in different measurements against 2.9 ms in the decode loop, and a verify forward
 * right after the block drafter ran slower than the same forward after another forward. The 5%
 * margin did not cover it, and mode auto drafted where drafting lost (0.83x baseline on held-out
 * chat). So the engine compares every decode-only round's measured time with the profile's
 * prediction for it, per kind (dsp_round_kind), and weighs each alternative by its kind's ratio.
 * A kind's averages decay mostly when it is measured (costs are the machine's, not the text's),
 * and slowly in other kinds' rounds, so that a kind left unused returns to the prior and is tried
 * again; each round's step is bounded (CAL_CLAMP), so that one stall does not decide a kind. */
#define CAL_KEEP 0.95 /* about the last 20 rounds of the kind */
#define CAL_CLAMP 1.5 /* a round counts as at most 1.5x (at least 1/1.5 of) its kind's current ratio */
#define CAL_FORGET 0.995 /* per round of another kind: a kind left unused drifts back to the prior */
#define CAL_PRIOR 4.0 /* a kind's ratio starts at every round's ratio, weighted as 4 units of predicted
                       * time (about 2 rounds); that one starts at 1. A kind not yet measured thus
                       * inherits the profile's overall bias (its 1-row time off by 10-40% between
                       * measurements here) instead of looking cheaper or dearer than the kinds that
                       * were measured */

/* every decode-only round's ratio (the kinds' prior) */
static double cost_scale_all(const dsp_engine *e) { return (e->cal_act_all + CAL_PRIOR) / (e->cal_pred_all + CAL_PRIOR); }

double dsp_engine_cost_scale(const dsp_engine *e, dsp_round_kind k) {
    return (e->cal_act[k] + CAL_PRIOR * cost_scale_all(e)) / (e->cal_pred[k] + CAL_PRIOR);
}

/* a round's ratio r as one step for an average now at est (CAL_CLAMP) */
static double cal_step(double r, double est) { return r > CAL_CLAMP * est ? CAL_CLAMP * est : r < est / CAL_CLAMP ? est / CAL_CLAMP : r; }

/* the block drafter's cost for nb requests in one round, in units of a 1-row forward */
static float block_cost(const dsp_engine *e, int nb) { return nb ? e->prof.draft_rel + (float)(nb - 1) * e->prof.draft_rel_per_req : 0; }

void dsp_engine_calibrate(dsp_engine *e, int rows, double extra_keys, bool drafted, double ms) {
    const dsp_spec_profile *p = &e->prof;
    if (!e->have_prof || p->n <= 0 || p->one_row_ms <= 0 || e->no_calibration) return;
    const dsp_round_kind k = e->round_nb > 0 ? DSP_ROUND_BLOCK : drafted ? DSP_ROUND_LOOKUP : DSP_ROUND_PLAIN;
    const double pred = (double)host_cost(e) + (double)block_cost(e, e->round_nb) + (double)dsp_cost_time(p, rows, extra_keys);
    if (!(pred > 0) || !(ms >= 0)) return;
    /* One round moves a ratio by a bounded step: a stall (the process descheduled, a page fault
     * storm) is one round, not the kind's cost. Unbounded, on an H100 the first lookup rounds put
     * lookup's ratio at 2.0 (likely graph captures: each new row count is one), lookup then never
     * drafted again, and its ratio never came back: `--mode lookup` ran at 1.00x where it had given
     * 1.09-2.89x. Rounds in which the backend captured a CUDA graph are not calibrated at all
     * (engine.c, dsp_backend.n_setup); the bound covers the stalls nobody counts. */
    const double r = ms / p->one_row_ms / pred;
    const double rk = cal_step(r, dsp_engine_cost_scale(e, k)), ra = cal_step(r, cost_scale_all(e));
    for (int j = 0; j < DSP_ROUND_KINDS; j++)
        if (j != (int)k) e->cal_act[j] *= CAL_FORGET, e->cal_pred[j] *= CAL_FORGET;
    e->cal_act[k] = CAL_KEEP * e->cal_act[k] + rk * pred;
    e->cal_pred[k] = CAL_KEEP * e->cal_pred[k] + pred;
    e->cal_act_all = CAL_KEEP * e->cal_act_all + ra * pred;
    e->cal_pred_all = CAL_KEEP * e->cal_pred_all + pred;
    DSP_LOGD("round kind %d rows %d: %.2f ms, predicted %.2f ms; scales %.3f %.3f %.3f", (int)k, rows, ms, pred * p->one_row_ms,
             dsp_engine_cost_scale(e, DSP_ROUND_PLAIN), dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP), dsp_engine_cost_scale(e, DSP_ROUND_BLOCK));
}

/* The block drafter's acceptance estimate for r's next round. Exploration: until the engine has
 * seen EXPLORE_TRIALS trials of the block drafter (pooled over every request), the estimate is at
 * least EXPLORE_P. A drafter never run keeps the pool's prior of 1/2, and where the cost profile
 * says a drafter accepting half its drafts does not pay (the 2-core Xeon: verify rows and the
 * drafter cost ~0.4 of a forward each), it would never run, however good it is. The optimism ends
 * after a few rounds (each adds one trial per accepted draft plus one per rejection); the pool
 * decays only in rounds that draft, so the evidence stays once the drafter is left off. */
#define EXPLORE_TRIALS 12.0f
#define EXPLORE_RUNS 24 /* and at most this many drafter runs in all (confidence may verify none) */
#define EXPLORE_P 0.7f
static float block_accept_p(const dsp_engine *e, const dsp_req *r) {
    const float p = dsp_accept_p(&r->acc[0]);
    const bool explore = e->acc_pool[0].t < EXPLORE_TRIALS && e->st.block_drafts < EXPLORE_RUNS;
    return explore && p < EXPLORE_P ? EXPLORE_P : p;
}

/* Mode auto keeps the block drafter's context step running for a request in every round, chosen
 * or not. When the drafter has not been chosen for AUTO_GIVE_UP decode rounds in a row (while the
 * engine explores, its estimate is the optimistic EXPLORE_P, so not being chosen then says even
 * more), the request gives it up for good: it continues as prompt lookup, its rounds skip the
 * context step, and its later blocks are not published to the prefix cache (they lack the
 * drafter's K/V that requests under the same key expect). Drafter choice only: lossless. */
#define AUTO_GIVE_UP 32
static void give_up_block(dsp_engine *e, dsp_req *r) {
    e->st.auto_gave_up++;
    r->pick = r->block = false;
    r->mode = DSP_SPEC_LOOKUP;
    r->ctx_dropped = true;
    r->ctx_pend = 0;
}

/* --max-draft auto, before drafting: how many of r's drafts are expected to pay for the drafter
 * (0: none, so it does not run), in a round where n_decode requests decode anyway. Only that many
 * slots are decoded (LM head, Markov steps): the choice uses the acceptance estimate alone, never
 * the drafts, so it is a stopping rule. */
static int32_t worth_drafting(dsp_engine *e, dsp_req *r, int32_t cap, float draft_cost, int n_decode) {
    dsp_cost_req c = {block_accept_p(e, r), NULL, cap, r->n_tokens, 0};
    const float scale = (float)(dsp_engine_cost_scale(e, DSP_ROUND_BLOCK) / dsp_engine_cost_scale(e, DSP_ROUND_PLAIN));
    dsp_cost_choose_max(&e->prof, n_decode, 0, n_decode, host_cost(e), draft_cost, scale, &c, 1, -1);
    DSP_LOGD("worth drafting: p %.3f (pool %.1f/%.1f), cap %d, %d decoding, host %.3f, drafter %.3f, block/plain scale %.3f: k %d",
             c.p, e->acc_pool[0].s, e->acc_pool[0].t, cap, n_decode, host_cost(e), draft_cost, scale, c.k);
    return c.k;
}

/* Mode auto with a block drafter, before the block drafter runs: does r verify lookup's k_lookup
 * drafts (match length match_len), run the block drafter (at most block_cap drafts), or draft
 * nothing? The one with the best expected tokens per unit of time (spec/cost.h dsp_cost_rate),
 * from the acceptance estimates alone (never the drafts themselves): a stopping rule, lossless. */
typedef enum { PICK_NONE, PICK_LOOKUP, PICK_BLOCK } pick_src;
static double rate_none(dsp_engine *e, int n_decode) {
    return dsp_cost_rate(&e->prof, n_decode, host_cost(e), 0, 0) / dsp_engine_cost_scale(e, DSP_ROUND_PLAIN);
}
static double rate_block(dsp_engine *e, const dsp_req *r, int32_t block_cap, int n_decode) {
    const dsp_spec_profile *pr = &e->prof;
    return dsp_cost_rate(pr, n_decode, host_cost(e) + pr->draft_rel, block_accept_p(e, r), block_cap) / dsp_engine_cost_scale(e, DSP_ROUND_BLOCK);
}
static pick_src pick_source(dsp_engine *e, dsp_req *r, int32_t k_lookup, int32_t match_len, int32_t block_cap, int n_decode) {
    double none = rate_none(e, n_decode), look = 0, blk = 0;
    if (k_lookup > 0)
        look = dsp_cost_rate(&e->prof, n_decode, host_cost(e), dsp_accept_p(&r->acc[dsp_accept_bucket(match_len)]), k_lookup) /
               dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP);
    if (block_cap > 0) blk = rate_block(e, r, block_cap, n_decode);
    DSP_LOGD("pick: rates none %.4f, lookup %.4f (k %d, match %d), block %.4f (p %.3f, cap %d)", none, look, k_lookup, match_len, blk,
             block_cap > 0 ? block_accept_p(e, r) : 0.0f, block_cap);
    if (blk > (1.0 + DSP_COST_MARGIN) * none && blk > look) return PICK_BLOCK;
    return look > none ? PICK_LOOKUP : PICK_NONE;
}

/* Mode auto, at admission: could pick_source choose the block drafter at all? Not before the
 * request drafts: its estimate is the pool's (exploration included) and changes only in rounds
 * that run the drafter, so where the drafter does not beat drafting nothing now, it would not be
 * chosen for AUTO_GIVE_UP rounds, during which the context step (over the whole prompt first)
 * runs for nothing. Such a request starts as prompt lookup, its prompt and blocks are those of any
 * lookup request. (On the 2-vCPU Xeon the gain was within noise: the pooled evidence there keeps
 * the drafter in most requests, and auto stays 2-4% below lookup on held-out code.)
 * Needs the cost profile (measured here if not yet: a round would measure it next). */
static bool block_may_pay(dsp_engine *e, const dsp_req *r) {
    if (e->admit_block || dsp_engine_profile(e, NULL) != DSP_OK) return true;
    int n_decode = 1;
    for (int i = 0; i < e->n_running; i++) n_decode += e->running[i]->state == DSP_REQ_DECODE;
    int32_t cap = dsp_block_n_draft(e->bdi, e->bdi->block), room = budget(e, r); /* room: context and max_tokens */
    if (room < cap) cap = room;
    if (r->p.max_draft != DSP_DRAFT_AUTO && r->p.max_draft < cap) cap = r->p.max_draft;
    return cap > 0 && rate_block(e, r, cap, n_decode) > (1.0 + DSP_COST_MARGIN) * rate_none(e, n_decode);
}

dsp_status dsp_engine_draft_round(dsp_engine *e) {
    int nb = 0, n_decode = 0;
    bool any_auto = false, any_pick = false;
    e->round_block_ms = 0, e->round_nb = 0;
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->state != DSP_REQ_DECODE) continue;
        n_decode++;
        r->k = r->n_prop = 0, r->src = DSP_SRC_NONE, r->bslot = -1, r->sampled = false, r->acc_b = 0;
        bool autok = r->p.max_draft == DSP_DRAFT_AUTO;
        any_auto |= autok && (r->drafter || r->block);
        any_pick |= r->pick;
    }
    if (any_auto || any_pick) dsp_engine_profile(e, NULL); /* on a failure the linear guess is used */
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->state != DSP_REQ_DECODE) continue;
        const int32_t kmax = budget(e, r);
        if (kmax <= 0 || (!r->drafter && !r->block)) continue;
        const bool autok = r->p.max_draft == DSP_DRAFT_AUTO;
        const int32_t cap = autok || r->p.max_draft > kmax ? kmax : r->p.max_draft;
        if (r->drafter) {
            int32_t k = dsp_drafter_propose(r->drafter, r->tokens, r->n_tokens, cap, r->draft, r->q);
            if (k < 0) k = 0;
            if (k > cap) k = cap;
            for (int32_t j = 0; j < k; j++)
                if (r->draft[j] < 0 || r->draft[j] >= e->n_vocab) k = j; /* a drafter bug must not reach the forward */
            bool use = r->mode != DSP_SPEC_HYBRID || (k > 0 && dsp_lookup_last_len(r->drafter) >= r->p.hybrid_min);
            if (r->pick) {
                int32_t slots = e->bdi->block;
                if ((uint32_t)slots > e->n_ctx - (r->n_tokens - 1)) slots = (int32_t)(e->n_ctx - (r->n_tokens - 1));
                int32_t bcap = dsp_block_n_draft(e->bdi, slots);
                if (bcap > cap) bcap = cap;
                pick_src ps = pick_source(e, r, k, k > 0 ? dsp_lookup_last_len(r->drafter) : 0, bcap, n_decode);
                if (ps == PICK_BLOCK) r->no_block_rounds = 0;
                else if (++r->no_block_rounds >= AUTO_GIVE_UP) give_up_block(e, r);
                if (ps == PICK_NONE) continue;
                use = ps == PICK_LOOKUP;
            }
            if (use) {
                r->k = r->n_prop = k;
                r->src = k ? DSP_SRC_DRAFTER : DSP_SRC_NONE;
                if (k && !strcmp(r->drafter->ops->name, "lookup")) r->acc_b = dsp_accept_bucket(dsp_lookup_last_len(r->drafter));
                r->sampled = r->drafter->supplies_q && k > 0;
                if (r->mode != DSP_SPEC_HYBRID || k > 0) continue;
            }
        }
        if (!r->block) continue;
        const dsp_block_info *in = e->bdi;
        bool trace = r->p.trace != NULL;
        int32_t n_slots = in->block;
        uint32_t start = r->n_tokens - 1;
        if ((uint32_t)n_slots > e->n_ctx - start) n_slots = (int32_t)(e->n_ctx - start);
        int32_t full = dsp_block_n_draft(in, n_slots);
        if (full <= 0) continue;
        int32_t want = cap < full ? cap : full;
        if (autok && (want = worth_drafting(e, r, want, e->prof.draft_rel, n_decode)) == 0) continue;
        dsp_block_req *q = &e->breqs[nb];
        memset(q, 0, sizeof *q);
        q->kv = &r->kv;
        q->anchor = r->tokens[r->n_tokens - 1];
        q->start = start;
        q->n_slots = n_slots;
        q->n_want = trace ? full : want;
        q->markov = q->confidence = r->mode == DSP_SPEC_DSPARK || (r->mode == DSP_SPEC_HYBRID && in->dspark);
        q->stop_below = -INFINITY;
        if (!trace && r->p.dspark_threshold > 0 && q->confidence)
            q->stop_below = r->p.dspark_threshold >= 1 ? INFINITY : logf(r->p.dspark_threshold / (1.0f - r->p.dspark_threshold));
        q->temperature = r->p.draft_sample && r->p.temperature > 0 ? r->p.temperature : 0;
        q->rng = &r->drng;
        q->q = r->q;
        q->top = trace;
        r->bslot = nb++;
    }
    if (nb > 0) { /* one block forward per max_breqs requests */
        double t0 = now_ms(), d0 = e->st.draft_ms; /* (the lazy context step below counts itself: counted once) */
        if (e->lazy_ctx) { /* the drafting requests' kept rows through the context step first */
            int n_rs = 0;
            for (int i = 0; i < e->n_running; i++)
                if (e->running[i]->state == DSP_REQ_DECODE && e->running[i]->bslot >= 0) e->ctx_reqs[n_rs++] = e->running[i];
            dsp_status st = ctx_flush(e, e->ctx_reqs, n_rs);
            if (st) return st;
        }
        for (int off = 0; off < nb; off += e->max_breqs) {
            int cnt = nb - off < e->max_breqs ? nb - off : e->max_breqs;
            dsp_status st = dsp_block_draft(e->bd, e->breqs + off, cnt);
            if (st) return st;
        }
        double ms = now_ms() - t0;
        e->st.draft_ms = d0 + ms;
        e->st.block_drafts += (uint64_t)nb;
        e->round_draft_ms = ms / nb;
        e->round_block_ms = ms, e->round_nb = nb;
    }
    /* the block drafts: confidence truncation, the cap */
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->state != DSP_REQ_DECODE || r->bslot < 0) continue;
        const dsp_block_req *q = &e->breqs[r->bslot];
        int32_t k = q->n_draft;
        if (q->confidence) {
            int32_t c = confident(&r->p, q->conf, q->n_draft);
            if (c < k) k = c;
        }
        int32_t kmax = budget(e, r), cap = r->p.max_draft == DSP_DRAFT_AUTO || r->p.max_draft > kmax ? kmax : r->p.max_draft;
        if (k > cap) k = cap;
        memcpy(r->draft, q->draft, sizeof(int32_t) * (size_t)q->n_draft);
        r->k = k;
        r->n_prop = q->n_draft;
        r->src = DSP_SRC_BLOCK;
        r->sampled = q->temperature > 0 && k > 0;
        r->res.n_block_rounds++;
        r->res.draft_ms += e->round_draft_ms;
    }
    if (!any_auto) return DSP_OK;
    /* --max-draft auto: the round's draft lengths, chosen together. The rows the round has anyway:
     * one per decoding request, the drafts of requests with a fixed cap and, while a prompt is being
     * prefilled, the chunk that --prefill-itl's budget leaves next to them (not the whole prompt:
     * counted whole, it made drafts look free next to it, and they made the round several times
     * longer than the budget: p99 inter-token gaps of 6x the idle median). The drafts then share that
     * budget with the chunk: all but one of its prefill rows at most, so a round with a prefill pending
     * stays within the budget whenever its decoding rows alone do. */
    int nc = 0, base_rows = n_decode, max_drafts = -1, fixed = 0;
    double base_extra = 0;
    uint64_t pf_left = 0;
    uint32_t pf_pos = 0;
    for (int i = 0; i < e->n_running; i++) {
        const dsp_req *r = e->running[i];
        if (r->state == DSP_REQ_PREFILL) {
            if (!pf_left) pf_pos = r->kv.n_tokens;
            pf_left += r->n_prompt - r->kv.n_tokens;
        } else if (r->state == DSP_REQ_DECODE && r->p.max_draft != DSP_DRAFT_AUTO) {
            fixed += r->k;
        }
    }
    base_rows += fixed;
    if (pf_left) {
        int room = dsp_engine_prefill_budget(e, base_rows, n_decode, pf_pos) - base_rows; /* >= 1 */
        base_rows += pf_left < (uint64_t)room ? (int)pf_left : room;
        max_drafts = room - 1;
    }
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->state != DSP_REQ_DECODE) continue;
        if (r->n_tokens > e->prof.ctx_tokens) base_extra += r->n_tokens - e->prof.ctx_tokens;
        if (r->p.max_draft != DSP_DRAFT_AUTO || r->k == 0) continue;
        e->creqs[nc] = (dsp_cost_req){r->src == DSP_SRC_BLOCK ? block_accept_p(e, r) : dsp_accept_p(&r->acc[r->acc_b]), NULL, r->k, r->n_tokens, 0};
        nc++;
    }
    if (nc == 0) return DSP_OK;
    /* the drafter has run: its cost is sunk, and the round is of its kind with or without drafts */
    const float dscale = nb ? 1.0f : (float)(dsp_engine_cost_scale(e, DSP_ROUND_LOOKUP) / dsp_engine_cost_scale(e, DSP_ROUND_PLAIN));
    dsp_cost_choose_max(&e->prof, base_rows, base_extra, n_decode, host_cost(e) + block_cost(e, nb), 0, dscale, e->creqs, nc, max_drafts);
    nc = 0;
    for (int i = 0; i < e->n_running; i++) {
        dsp_req *r = e->running[i];
        if (r->state != DSP_REQ_DECODE || r->p.max_draft != DSP_DRAFT_AUTO || r->k == 0) continue;
        r->k = e->creqs[nc++].k;
        if (r->k == 0) r->sampled = false;
    }
    return DSP_OK;
}

void dsp_engine_draft_done(dsp_engine *e, dsp_req *r, int32_t k, const int32_t *out, int32_t n_out, int32_t emitted) {
    const int32_t a = n_out - 1;
    if (r->src != DSP_SRC_NONE || r->block) { /* a round without an offer teaches nothing */
        dsp_accept_round(&r->acc[r->acc_b], k, a);
        dsp_accept_pool(&e->acc_pool[r->acc_b], k, a);
    }
    if (r->pick && r->src == DSP_SRC_DRAFTER) dsp_accept_round(&r->acc[0], 0, 0); /* (auto) the block drafter's estimate decays in lookup's rounds too */
    r->res.kept_hist[k]++;
    if (!r->p.trace) return;
    dsp_round_trace t;
    memset(&t, 0, sizeof t);
    const uint32_t anchor = r->n_tokens - (uint32_t)emitted - 1;
    t.pos = anchor;
    t.kept = k;
    t.accepted = a;
    t.next = emitted > a ? out[a] : -1;
    if (r->src == DSP_SRC_BLOCK) {
        const dsp_block_req *q = &e->breqs[r->bslot];
        t.source = q->markov ? "dspark" : "dflash";
        t.n_draft = q->n_draft;
        t.draft = q->draft;
        t.ctx_rows = (int32_t)(anchor - r->prev_block_pos);
        t.conf = q->confidence ? q->conf : NULL;
        t.top_ids = &q->top_ids[0][0];
        t.top_vals = &q->top_vals[0][0];
        r->prev_block_pos = anchor;
    } else {
        t.source = r->src == DSP_SRC_DRAFTER ? r->drafter->ops->name : "";
        t.n_draft = r->n_prop;
        t.draft = r->draft;
    }
    r->p.trace(&t, r->p.trace_user);
}
