/* tok/tok_bpe: the BPE merge loop, shared by both families, and per-segment encoding.
 *
 * It is Hugging Face's algorithm (tokenizers' Word::merge_all): start from one symbol per byte
 * (byte-level) or per character (SPM), keep every adjacent pair that has a merge in a min-heap
 * ordered by (rank, position), pop the best, skip it if the pair at that position no longer merges
 * into the same token, merge, and push the two pairs the merge created. O(n log n) per word.
 *
 * Ranks: byte-level (and SPM files with merges) use the merge's line in tokenizer.ggml.merges.
 * SPM files without merges get them derived by HF (generate_merges) as every split l+r of every
 * token, sorted best-first by (merged token's score, len(l), len(r)) descending and then by
 * vocabulary order. We never build that list: the merge of two adjacent symbols is the vocabulary
 * lookup of their concatenated text, and its rank is that key computed on the spot. */
#include "tok/tok_internal.h"

#include "core/status.h"

#include <stdlib.h>
#include <string.h>

void dsp_tok_scratch_free(dsp_tok_scratch *sc) {
    free(sc->sym);
    free(sc->heap);
    free(sc->norm);
    dsp_nfc_scratch_free(&sc->nfc);
    dsp_tok_spans_free(&sc->pieces);
    dsp_tok_spans_free(&sc->tmp);
    memset(sc, 0, sizeof *sc);
}

static bool cand_less(const dsp_tok_cand *a, const dsp_tok_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static dsp_status heap_push(dsp_tok_scratch *sc, dsp_tok_cand c) {
    if (sc->heap_n == sc->heap_cap) {
        size_t nc = sc->heap_cap ? sc->heap_cap * 2 : 256;
        dsp_tok_cand *h = realloc(sc->heap, nc * sizeof *h);
        if (!h) return dsp_error(DSP_ERR_NOMEM, "tokenize: out of memory");
        sc->heap = h;
        sc->heap_cap = nc;
    }
    size_t i = sc->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!cand_less(&c, &sc->heap[up])) break;
        sc->heap[i] = sc->heap[up];
        i = up;
    }
    sc->heap[i] = c;
    return DSP_OK;
}

static dsp_tok_cand heap_pop(dsp_tok_scratch *sc) {
    dsp_tok_cand top = sc->heap[0], last = sc->heap[--sc->heap_n];
    size_t i = 0, n = sc->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const dsp_tok_cand *best = &last;
        if (l < n && cand_less(&sc->heap[l], best)) m = l, best = &sc->heap[l];
        if (r < n && cand_less(&sc->heap[r], best)) m = r;
        if (m == i) break;
        sc->heap[i] = sc->heap[m];
        i = m;
    }
    if (n) sc->heap[i] = last;
    return top;
}

/* The merge of symbols a, b (adjacent) in word w: its rank and the merged token. */
static bool pair_rank(const dsp_tok *t, const char *w, const dsp_tok_sym *a, const dsp_tok_sym *b, uint64_t *rank,
                      int32_t *merged) {
    if (!a->can_merge || !b->can_merge) return false;
    if (t->has_merges) {
        uint32_t r;
        if (!dsp_tok_pair_lookup(t, a->id, b->id, &r, merged)) return false;
        *rank = r;
        return true;
    }
    int32_t id = dsp_tok_vocab_lookup(t, w + a->start, (size_t)a->len + b->len);
    if (id < 0) return false;
    uint64_t nl = a->nch > 1023 ? 1023 : a->nch, nr = b->nch > 1023 ? 1023 : b->nch;
    /* (score rank, longer left first, longer right first, vocabulary order) */
    *rank = ((uint64_t)t->score_rank[id] << 40) | ((1023 - nl) << 30) | ((1023 - nr) << 20) | ((uint64_t)id & 0xFFFFF);
    *merged = id;
    return true;
}

static dsp_status push_pair(const dsp_tok *t, dsp_tok_scratch *sc, const char *w, int32_t pos) {
    dsp_tok_sym *a = &sc->sym[pos];
    if (a->next < 0) return DSP_OK;
    dsp_tok_cand c;
    if (!pair_rank(t, w, a, &sc->sym[a->next], &c.rank, &c.merged)) return DSP_OK;
    c.pos = pos;
    return heap_push(sc, c);
}

static dsp_status grow_syms(dsp_tok_scratch *sc, size_t n) {
    if (n <= sc->sym_cap) return DSP_OK;
    size_t nc = sc->sym_cap ? sc->sym_cap : 256;
    while (nc < n) nc *= 2;
    dsp_tok_sym *s = realloc(sc->sym, nc * sizeof *s);
    if (!s) return dsp_error(DSP_ERR_NOMEM, "tokenize: out of memory for a %zu-symbol word", n);
    sc->sym = s;
    sc->sym_cap = nc;
    return DSP_OK;
}

/* BPE over one word w[0..n) (valid UTF-8); appends its ids. */
static dsp_status bpe_word(const dsp_tok *t, dsp_tok_scratch *sc, const char *w, size_t n, dsp_tok_ids *out) {
    dsp_status st;
    if (n == 1 && t->kind == DSP_TOK_BPE) { /* the common single-byte piece */
        int32_t id = t->byte_tok[(uint8_t)w[0]];
        return id >= 0 ? dsp_tok_ids_push(out, id) : DSP_OK;
    }
    if (t->ignore_merges) { /* a piece that is a token as a whole stays whole */
        int32_t id = dsp_tok_vocab_lookup(t, w, n);
        if (id >= 0) return dsp_tok_ids_push(out, id);
    }
    if ((st = grow_syms(sc, n))) return st;
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = t->kind == DSP_TOK_BPE ? 1 : dsp_utf8_len((uint8_t)w[i]);
        if (cl > n - i) cl = n - i;
        int32_t id = t->kind == DSP_TOK_BPE ? t->byte_tok[(uint8_t)w[i]] : dsp_tok_vocab_lookup(t, w + i, cl);
        if (id >= 0) {
            sc->sym[ns++] = (dsp_tok_sym){id, (uint32_t)i, (uint32_t)cl, 1, -1, -1, true};
        } else if (t->kind == DSP_TOK_SPM) {
            bool all = true;
            for (size_t k = 0; k < cl; k++) all &= t->byte_tok[(uint8_t)w[i + k]] >= 0;
            if (all) { /* byte fallback: one unmergeable symbol per byte */
                for (size_t k = 0; k < cl; k++)
                    sc->sym[ns++] = (dsp_tok_sym){t->byte_tok[(uint8_t)w[i + k]], (uint32_t)(i + k), 1, 0, -1, -1, false};
            } else if (t->unk >= 0) { /* unknown, fused with an unknown just before it */
                if (ns > 0 && !sc->sym[ns - 1].can_merge && sc->sym[ns - 1].id == t->unk &&
                    sc->sym[ns - 1].start + sc->sym[ns - 1].len == i)
                    sc->sym[ns - 1].len += (uint32_t)cl;
                else
                    sc->sym[ns++] = (dsp_tok_sym){t->unk, (uint32_t)i, (uint32_t)cl, 1, -1, -1, false};
            }
        } /* byte-level byte with no token and no unk token: dropped, as HF does */
        i += cl;
    }
    for (int32_t i = 0; i < ns; i++) {
        sc->sym[i].prev = i - 1;
        sc->sym[i].next = i + 1 < ns ? i + 1 : -1;
    }
    sc->heap_n = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        if ((st = push_pair(t, sc, w, i))) return st;
    while (sc->heap_n) {
        dsp_tok_cand c = heap_pop(sc);
        dsp_tok_sym *a = &sc->sym[c.pos];
        if (a->len == 0 || a->next < 0) continue;
        dsp_tok_sym *b = &sc->sym[a->next];
        uint64_t r;
        int32_t m;
        if (!pair_rank(t, w, a, b, &r, &m) || m != c.merged) continue; /* stale */
        a->id = m;
        a->len += b->len;
        a->nch += b->nch;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) sc->sym[b->next].prev = c.pos;
        if (a->prev >= 0 && (st = push_pair(t, sc, w, a->prev))) return st;
        if ((st = push_pair(t, sc, w, c.pos))) return st;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = sc->sym[i].next)
        if ((st = dsp_tok_ids_push(out, sc->sym[i].id))) return st;
    return DSP_OK;
}

static bool in_sorted(const uint32_t *v, size_t n, uint32_t x) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (v[m] == x) return true;
        if (v[m] < x) lo = m + 1;
        else hi = m;
    }
    return false;
}

dsp_status dsp_tok_encode_segment(const dsp_tok *t, dsp_tok_scratch *sc, const char *text, size_t len, dsp_tok_ids *out) {
    dsp_status st;
    /* HF normalizes each stretch between added tokens; the result obeys the same length limit as
     * the text (SPM below triples it in 32-bit offsets) */
    if (t->nfc && (st = dsp_nfc_normalize(text, len, DSP_TOK_MAX_TEXT, &sc->nfc, &text, &len))) return st;
    if (t->kind == DSP_TOK_BPE) {
        if ((st = dsp_tok_pre_split(t->pre, text, len, &sc->pieces, &sc->tmp))) return st;
        for (size_t i = 0; i < sc->pieces.n; i++)
            if ((st = bpe_word(t, sc, text + sc->pieces.v[i].off, sc->pieces.v[i].len, out))) return st;
        return DSP_OK;
    }
    /* SPM: optional U+2581 prefix, every ' ' -> U+2581, the whole segment is one word */
    size_t need = 3 * len + 3;
    if (need > sc->norm_cap) {
        char *p = realloc(sc->norm, need);
        if (!p) return dsp_error(DSP_ERR_NOMEM, "tokenize: out of memory");
        sc->norm = p;
        sc->norm_cap = need;
    }
    size_t o = 0;
    if (t->add_space_prefix && len && (!t->space_prefix_first_only || sc->at_text_start) && !(t->space_prefix_unless_space && (text[0] == ' ' || (len >= 3 && !memcmp(text, "\xE2\x96\x81", 3)))))
        memcpy(sc->norm, "\xE2\x96\x81", 3), o = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(sc->norm + o, "\xE2\x96\x81", 3), o += 3;
        else sc->norm[o++] = text[i];
    }
    /* cut before each U+2581 that follows a character no token joins to a U+2581 */
    const uint8_t *w = (const uint8_t *)sc->norm;
    size_t start = 0;
    for (size_t i = 1; i + 3 <= o; i++) {
        if (w[i] != 0xE2 || w[i + 1] != 0x96 || w[i + 2] != 0x81) continue;
        size_t b = start + dsp_utf8_prev(w + start, i - start);
        uint32_t cp = dsp_utf8_decode(w + b, i - b, NULL);
        if (!t->spm_split && (cp == 0x2581 || in_sorted(t->cross_cp, t->n_cross, cp))) continue;
        if ((st = bpe_word(t, sc, sc->norm + start, i - start, out))) return st;
        start = i;
    }
    return bpe_word(t, sc, sc->norm + start, o - start, out);
}
