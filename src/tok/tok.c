/* tok/tok: vocabulary, construction (from arrays or GGUF), added-token matching, the encode driver
 * and decoding. The BPE merge loop is in tok_bpe.c, the pre-tokenizer regexes in tok_pre.c.
 *
 * Per token we keep three strings in one blob:
 *   text  - as stored in the file (what added tokens match in the input)
 *   key   - what BPE looks up: byte-level: the raw bytes (GPT-2 spelling undone); SPM: the text,
 *           except that Gemma's all-space tokens are respelled with U+2581 as Hugging Face does
 *   piece - the bytes the token decodes to
 * Lookup tables (all open addressing, power-of-two sized, built once):
 *   vocab: key -> id (a later duplicate wins, like a Python dict built in file order)
 *   pairs: (left id, right id) -> (rank, merged id), from tokenizer.ggml.merges
 *   trie:  the added tokens' texts, for leftmost-longest matching */
#include "tok/tok_internal.h"

#include "core/log.h"
#include "core/status.h"
#include "core/utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define MAX_TOKENS (1u << 24)
#define MAX_TOKEN_BYTES (1u << 16)

/* ---- GPT-2 byte <-> unicode spelling ------------------------------------------------------- */

/* Bytes 33..126, 161..172, 174..255 spell themselves; the other 68 map to U+0100.. in order. */
static void byte_spelling(uint32_t cp_of_byte[256], int16_t byte_of_cp[324]) {
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of_byte[b] = self ? (uint32_t)b : (uint32_t)(256 + k++);
        byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    }
}

/* Undo the spelling of s into out (room for n bytes). If any character is outside the alphabet
 * the token is kept as its raw UTF-8 (as HF does); returns the output length. */
static size_t unspell(const int16_t byte_of_cp[324], const uint8_t *s, size_t n, uint8_t *out, bool *spelled) {
    size_t o = 0, i = 0;
    while (i < n) {
        size_t l = dsp_utf8_seq(s + i, n - i);
        uint32_t cp = l ? dsp_utf8_decode(s + i, l, NULL) : DSP_UTF8_BAD;
        if (cp >= 324 || byte_of_cp[cp] < 0) {
            memcpy(out, s, n);
            *spelled = false;
            return n;
        }
        out[o++] = (uint8_t)byte_of_cp[cp];
        i += l;
    }
    *spelled = true;
    return o;
}

/* ---- hash tables ------------------------------------------------------------------------------ */

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

int32_t dsp_tok_vocab_lookup(const dsp_tok *t, const char *s, size_t n) {
    uint64_t h = XXH3_64bits(s, n);
    for (size_t i = h & t->vh_mask;; i = (i + 1) & t->vh_mask) {
        uint32_t e = t->vh[i];
        if (!e) return -1;
        int32_t id = (int32_t)(e - 1);
        if (t->vh_hash[i] == h && t->key_len[id] == n && !memcmp(t->blob + t->key_off[id], s, n)) return id;
    }
}

static void vocab_insert(dsp_tok *t, int32_t id) {
    const char *s = t->blob + t->key_off[id];
    size_t n = t->key_len[id];
    uint64_t h = XXH3_64bits(s, n);
    for (size_t i = h & t->vh_mask;; i = (i + 1) & t->vh_mask) {
        uint32_t e = t->vh[i];
        if (!e) {
            t->vh[i] = (uint32_t)id + 1;
            t->vh_hash[i] = h;
            return;
        }
        int32_t o = (int32_t)(e - 1);
        if (t->vh_hash[i] == h && t->key_len[o] == n && !memcmp(t->blob + t->key_off[o], s, n)) {
            t->vh[i] = (uint32_t)id + 1; /* later duplicate wins */
            return;
        }
    }
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

bool dsp_tok_pair_lookup(const dsp_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = mix64(key) & t->pm_mask;; i = (i + 1) & t->pm_mask) {
        if (t->pm_new[i] < 0) return false;
        if (t->pm_key[i] == key) {
            *rank = t->pm_rank[i];
            *merged = t->pm_new[i];
            return true;
        }
    }
}

static void pair_insert(dsp_tok *t, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = mix64(key) & t->pm_mask;; i = (i + 1) & t->pm_mask) {
        if (t->pm_new[i] < 0 || t->pm_key[i] == key) { /* a later duplicate merge wins, as in HF */
            t->pm_key[i] = key;
            t->pm_rank[i] = rank;
            t->pm_new[i] = merged;
            return;
        }
    }
}

/* ---- added-token trie ------------------------------------------------------------------------ */

static int32_t trie_child(const dsp_tok *t, int32_t node, uint8_t c) {
    uint64_t key = ((uint64_t)(uint32_t)node << 8) | c;
    for (size_t i = mix64(key + 1) & t->tr_mask;; i = (i + 1) & t->tr_mask) {
        if (t->tr_child[i] < 0) return -1;
        if (t->tr_key[i] == key) return t->tr_child[i];
    }
}

static void trie_add(dsp_tok *t, const uint8_t *s, size_t n, int32_t id) {
    int32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t c = trie_child(t, node, s[k]);
        if (c < 0) {
            c = t->tr_n++;
            t->tr_term[c] = -1;
            uint64_t key = ((uint64_t)(uint32_t)node << 8) | s[k];
            size_t i = mix64(key + 1) & t->tr_mask;
            while (t->tr_child[i] >= 0) i = (i + 1) & t->tr_mask;
            t->tr_key[i] = key;
            t->tr_child[i] = c;
        }
        node = c;
    }
    t->tr_term[node] = id;
}

/* Longest added token starting at s[0..n); returns its length (0 if none) and id. */
static size_t trie_match(const dsp_tok *t, const uint8_t *s, size_t n, int32_t *id) {
    if (!t->tr_first[s[0]]) return 0;
    int32_t node = 0;
    size_t best = 0;
    for (size_t k = 0; k < n; k++) {
        node = trie_child(t, node, s[k]);
        if (node < 0) break;
        if (t->tr_term[node] >= 0) {
            best = k + 1;
            *id = t->tr_term[node];
        }
    }
    return best;
}

/* ---- construction ---------------------------------------------------------------------------- */

typedef struct scored { float s; int32_t id; } scored;
static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static bool starts_with(const char *s, const char *p) { return s && !strncmp(s, p, strlen(p)); }

/* <0xXX> (exactly six characters, as HF's ByteFallback decoder reads it) -> the byte, else -1 */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static dsp_status tok_create(const dsp_tok_params *p, dsp_tok **out);

dsp_status dsp_tok_create(const dsp_tok_params *p, dsp_tok **out) {
    dsp_status st = tok_create(p, out);
    if (p && p->pre_custom) { /* ours either way */
        if (st) dsp_tok_pre_destroy((dsp_tok_pre *)p->pre_custom);
        else (*out)->pre = (dsp_tok_pre *)p->pre_custom;
    }
    return st;
}

static dsp_status tok_create(const dsp_tok_params *p, dsp_tok **out) {
    *out = NULL;
    if (!p || !p->tokens) return dsp_error(DSP_ERR_INVALID_ARG, "tokenizer: no tokens given");
    if (p->n_tokens == 0 || p->n_tokens > MAX_TOKENS)
        return dsp_error(DSP_ERR_FORMAT, "tokenizer: %zu tokens (must be 1..%u)", p->n_tokens, MAX_TOKENS);
    if (p->kind != DSP_TOK_BPE && p->kind != DSP_TOK_SPM) return dsp_error(DSP_ERR_INVALID_ARG, "tokenizer: bad kind");
    const size_t n = p->n_tokens;
    int32_t specials[4] = {p->bos, p->eos, p->unk, p->pad};
    for (int i = 0; i < 4; i++)
        if (specials[i] >= (int64_t)n || specials[i] < -1)
            return dsp_error(DSP_ERR_FORMAT, "tokenizer: special token id %d out of range (vocabulary of %zu)",
                             (int)specials[i], n);

    dsp_tok *t = calloc(1, sizeof *t);
    if (!t) return dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory");
    dsp_status st = DSP_OK;
    t->kind = p->kind;
    t->n = n;
    t->gemma = p->kind == DSP_TOK_SPM && starts_with(p->arch, "gemma");
    snprintf(t->pre_name, sizeof t->pre_name, "%s", p->kind == DSP_TOK_BPE ? (p->pre && *p->pre ? p->pre : "default") : "spm");
    t->bos = p->bos;
    t->eos = p->eos;
    t->unk = p->unk;
    t->pad = p->pad;
    t->add_bos = p->add_bos >= 0 ? p->add_bos != 0 : p->kind == DSP_TOK_SPM;
    t->add_eos = p->add_eos > 0;
    t->add_space_prefix = p->kind == DSP_TOK_SPM && !t->gemma && p->add_space_prefix != 0;
    t->space_prefix_first_only = p->space_prefix_first_only;
    t->space_prefix_unless_space = p->space_prefix_unless_space;
    t->spm_split = p->spm_split;
    t->decode_strip = t->add_space_prefix && !p->decode_keep_space;
    t->ignore_merges = p->ignore_merges;
    t->nfc = p->nfc;
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    if (t->add_eos && t->eos < 0) t->add_eos = false;

    /* sizes first, then one blob: text + key + piece. The key is at most 3x the text (Gemma's
     * all-space tokens respelled with U+2581), the text and the piece at most 1x. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = p->token_lens ? p->token_lens[i] : (p->tokens[i] ? strlen(p->tokens[i]) : 0);
        if (!p->tokens[i] && l) { st = dsp_error(DSP_ERR_FORMAT, "tokenizer: token %zu is NULL", i); goto fail; }
        if (l > MAX_TOKEN_BYTES) {
            st = dsp_error(DSP_ERR_FORMAT, "tokenizer: token %zu is %zu bytes long (limit %u)", i, l, MAX_TOKEN_BYTES);
            goto fail;
        }
        total += 5 * l;
    }
    if (total >= UINT32_MAX) { st = dsp_error(DSP_ERR_FORMAT, "tokenizer: token strings too large (%zu bytes)", total); goto fail; }
    t->blob = malloc(total + 1);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->key_off = malloc(n * sizeof *t->key_off);
    t->key_len = malloc(n * sizeof *t->key_len);
    t->piece_off = malloc(n * sizeof *t->piece_off);
    t->piece_len = malloc(n * sizeof *t->piece_len);
    t->nchars = malloc(n * sizeof *t->nchars);
    t->type = malloc(n * sizeof *t->type);
    t->added = calloc(n, 1);
    t->vh_mask = pow2_at_least(2 * n) - 1;
    t->vh = calloc(t->vh_mask + 1, sizeof *t->vh);
    t->vh_hash = malloc((t->vh_mask + 1) * sizeof *t->vh_hash);
    if (!t->blob || !t->text_off || !t->text_len || !t->key_off || !t->key_len || !t->piece_off || !t->piece_len ||
        !t->nchars || !t->type || !t->added || !t->vh || !t->vh_hash) {
        st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", n);
        goto fail;
    }

    uint32_t cp_of_byte[256];
    int16_t byte_of_cp[324];
    byte_spelling(cp_of_byte, byte_of_cp);
    bool *spelled = calloc(n, sizeof *spelled);
    if (!spelled) { st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = p->tokens[i] ? p->tokens[i] : "";
        size_t l = p->token_lens ? p->token_lens[i] : strlen(s);
        t->type[i] = p->types ? p->types[i] : DSP_TOK_TYPE_NORMAL;
        t->text_off[i] = (uint32_t)off;
        t->text_len[i] = (uint32_t)l;
        memcpy(t->blob + off, s, l);
        off += l;
        t->key_off[i] = (uint32_t)off;
        uint8_t *key = (uint8_t *)t->blob + off;
        size_t kl;
        if (t->kind == DSP_TOK_BPE) {
            kl = unspell(byte_of_cp, (const uint8_t *)s, l, key, &spelled[i]);
        } else {
            bool all_space = l > 0;
            for (size_t k = 0; k < l; k++) all_space &= s[k] == ' ';
            if (t->gemma && all_space) { /* HF respells Gemma's space tokens with U+2581 */
                for (size_t k = 0; k < l; k++) memcpy(key + 3 * k, "\xE2\x96\x81", 3);
                kl = 3 * l;
                spelled[i] = false; /* the file's text is not in HF's vocabulary */
            } else {
                memcpy(key, s, l);
                kl = l;
                spelled[i] = true;
            }
        }
        t->key_len[i] = (uint32_t)kl;
        off += kl;
        t->nchars[i] = (uint32_t)dsp_utf8_count(key, kl);
        /* piece */
        t->piece_off[i] = (uint32_t)off;
        uint8_t *pc = (uint8_t *)t->blob + off;
        size_t pl = 0;
        if (t->kind == DSP_TOK_BPE) {
            memcpy(pc, key, kl);
            pl = kl;
        } else {
            int bv = byte_token_value(s, l);
            if (bv >= 0) {
                pc[pl++] = (uint8_t)bv;
            } else {
                for (size_t k = 0; k < l;) {
                    if (k + 3 <= l && !memcmp(s + k, "\xE2\x96\x81", 3)) pc[pl++] = ' ', k += 3;
                    else pc[pl++] = (uint8_t)s[k++];
                }
            }
        }
        t->piece_len[i] = (uint32_t)pl;
        off += pl;
        if (pl > t->max_piece) t->max_piece = pl;
    }
    t->blob[off] = 0;
    for (size_t i = 0; i < n; i++) vocab_insert(t, (int32_t)i);

    /* single-byte / byte-fallback tokens */
    for (int b = 0; b < 256; b++) {
        if (t->kind == DSP_TOK_BPE) {
            uint8_t c = (uint8_t)b;
            t->byte_tok[b] = dsp_tok_vocab_lookup(t, (const char *)&c, 1);
        } else {
            char buf[8];
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = dsp_tok_vocab_lookup(t, buf, 6);
        }
    }

    /* merges: from the file, or (SPM) derived on the fly from the scores -- see tok_bpe.c */
    t->has_merges = p->kind == DSP_TOK_BPE || (p->merges && p->n_merges > 0); /* byte-level: even an empty list */
    if (t->has_merges) {
        if (p->n_merges > UINT32_MAX / 4) { st = dsp_error(DSP_ERR_FORMAT, "tokenizer: %zu merges", p->n_merges); free(spelled); goto fail; }
        t->pm_mask = pow2_at_least(2 * p->n_merges) - 1;
        t->pm_key = malloc((t->pm_mask + 1) * sizeof *t->pm_key);
        t->pm_rank = malloc((t->pm_mask + 1) * sizeof *t->pm_rank);
        t->pm_new = malloc((t->pm_mask + 1) * sizeof *t->pm_new);
        uint8_t *buf = malloc(2 * MAX_TOKEN_BYTES + 2);
        if (!t->pm_key || !t->pm_rank || !t->pm_new || !buf) {
            free(buf);
            free(spelled);
            st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory for %zu merges", p->n_merges);
            goto fail;
        }
        for (size_t i = 0; i <= t->pm_mask; i++) t->pm_new[i] = -1;
        size_t skipped = 0;
        for (size_t i = 0; i < p->n_merges; i++) {
            const char *m = p->merges && p->merges[i] ? p->merges[i] : "", *right;
            size_t ml = p->merge_lens ? p->merge_lens[i] : strlen(m), la, lb;
            if (p->merge_right) { /* pair form: the parts may contain spaces */
                right = p->merge_right[i] ? p->merge_right[i] : "";
                la = ml;
                lb = p->merge_right_lens ? p->merge_right_lens[i] : strlen(right);
                if (la > MAX_TOKEN_BYTES || lb > MAX_TOKEN_BYTES) {
                    skipped++;
                    continue;
                }
            } else {
                const char *sp = memchr(m, ' ', ml);
                if (!sp || ml > 2 * MAX_TOKEN_BYTES || memchr(sp + 1, ' ', ml - (size_t)(sp - m) - 1)) {
                    skipped++;
                    continue;
                }
                la = (size_t)(sp - m), lb = ml - la - 1, right = sp + 1;
            }
            bool sa = true, sb = true;
            size_t ka, kb;
            if (t->kind == DSP_TOK_BPE) {
                ka = unspell(byte_of_cp, (const uint8_t *)m, la, buf, &sa);
                kb = unspell(byte_of_cp, (const uint8_t *)right, lb, buf + ka, &sb);
            } else {
                memcpy(buf, m, la);
                memcpy(buf + la, right, lb);
                ka = la;
                kb = lb;
            }
            int32_t a = dsp_tok_vocab_lookup(t, (const char *)buf, ka);
            int32_t b = dsp_tok_vocab_lookup(t, (const char *)buf + ka, kb);
            int32_t c = dsp_tok_vocab_lookup(t, (const char *)buf, ka + kb);
            if (a < 0 || b < 0 || c < 0) {
                skipped++;
                continue;
            }
            pair_insert(t, a, b, (uint32_t)i, c);
        }
        free(buf);
        if (skipped) dsp_error_clear();
        t->n_merges_skipped = skipped;
    } else if (t->kind == DSP_TOK_SPM) {
        /* HF derives the merges from the vocabulary, best first by the merged token's score
         * (Gemma: by token order). We keep the score's dense rank per token. */
        t->score_rank = malloc(n * sizeof *t->score_rank);
        if (!t->score_rank) { free(spelled); st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
        if (t->gemma || !p->scores) {
            for (size_t i = 0; i < n; i++) t->score_rank[i] = (uint32_t)i;
        } else {
            scored *ord = malloc(n * sizeof *ord);
            if (!ord) { free(spelled); st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
            for (size_t i = 0; i < n; i++) /* NaN would break the sort order: rank it last */
                ord[i].s = p->scores[i] == p->scores[i] ? p->scores[i] : -HUGE_VALF, ord[i].id = (int32_t)i;
            qsort(ord, n, sizeof *ord, cmp_scored);
            uint32_t r = 0;
            for (size_t i = 0; i < n; i++) {
                if (i > 0 && ord[i].s != ord[i - 1].s) r++;
                t->score_rank[ord[i].id] = r;
            }
            free(ord);
        }
    }

    if (t->kind == DSP_TOK_SPM) { /* characters that a token joins to a following U+2581 */
        size_t cap = 0;
        for (size_t i = 0; i < n; i++) {
            const uint8_t *k = (const uint8_t *)t->blob + t->key_off[i];
            size_t kl = t->key_len[i];
            for (size_t j = 1; j + 3 <= kl; j++) {
                if (memcmp(k + j, "\xE2\x96\x81", 3)) continue;
                size_t b = dsp_utf8_prev(k, j);
                uint32_t cp = dsp_utf8_decode(k + b, j - b, NULL);
                if (cp == 0x2581) continue;
                if (t->n_cross == cap) {
                    cap = cap ? 2 * cap : 16;
                    uint32_t *v = realloc(t->cross_cp, cap * sizeof *v);
                    if (!v) { free(spelled); st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
                    t->cross_cp = v;
                }
                t->cross_cp[t->n_cross++] = cp;
            }
        }
        if (t->n_cross) qsort(t->cross_cp, t->n_cross, sizeof *t->cross_cp, cmp_u32);
        size_t u = 0;
        for (size_t i = 0; i < t->n_cross; i++)
            if (!u || t->cross_cp[u - 1] != t->cross_cp[i]) t->cross_cp[u++] = t->cross_cp[i];
        t->n_cross = u;
    }

    /* added tokens: CONTROL (special) and USER_DEFINED (always matched), plus the bos/eos/unk/pad
     * tokens that HF adds as special tokens. These are the added_tokens of the model's own
     * tokenizer.json (e.g. GPT-NeoX's runs of spaces), whatever their spelling; transformers' GGUF
     * converter drops the byte-level ones not written in the byte alphabet, which loses them (the
     * public test vectors need them). For Gemma it drops the all-space USER_DEFINED tokens, which
     * we follow: the Gemma oracle agrees on every corpus string that way. */
    size_t trie_bytes = 1;
    for (size_t i = 0; i < n; i++) {
        int ty = t->type[i];
        bool sp = false, ud = false;
        if (ty == DSP_TOK_TYPE_CONTROL) sp = true;
        if (ty == DSP_TOK_TYPE_USER_DEFINED) ud = t->kind == DSP_TOK_BPE || spelled[i];
        for (int k = 0; k < 4; k++)
            if (specials[k] == (int32_t)i) sp = true;
        if (t->text_len[i] == 0) sp = ud = false;
        if (sp) t->added[i] = ADDED_SPECIAL;
        else if (ud) t->added[i] = ADDED_USER;
        if (t->added[i]) trie_bytes += t->text_len[i];
    }
    free(spelled);
    t->tr_mask = pow2_at_least(2 * trie_bytes) - 1;
    t->tr_key = malloc((t->tr_mask + 1) * sizeof *t->tr_key);
    t->tr_child = malloc((t->tr_mask + 1) * sizeof *t->tr_child);
    t->tr_term = malloc(trie_bytes * sizeof *t->tr_term);
    if (!t->tr_key || !t->tr_child || !t->tr_term) { st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    for (size_t i = 0; i <= t->tr_mask; i++) t->tr_child[i] = -1;
    t->tr_n = 1;
    t->tr_term[0] = -1;
    for (size_t i = 0; i < n; i++) {
        if (!t->added[i]) continue;
        const uint8_t *s = (const uint8_t *)t->blob + t->text_off[i];
        /* the id is the vocabulary's for this text (a later duplicate wins) */
        int32_t id = (int32_t)i;
        if (t->kind == DSP_TOK_SPM) {
            int32_t v = dsp_tok_vocab_lookup(t, (const char *)s, t->text_len[i]);
            if (v >= 0) id = v;
        }
        trie_add(t, s, t->text_len[i], id);
        t->tr_first[s[0]] = true;
        t->n_added++;
    }

    if (p->added_flags) {
        if (!(t->added_flags = malloc(n))) { st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
        memcpy(t->added_flags, p->added_flags, n);
    }
    if (t->kind == DSP_TOK_BPE) {
        if (!p->pre_custom && (st = dsp_tok_pre_create(p->pre, &t->pre))) goto fail;
    }
    *out = t;
    return DSP_OK;
fail:
    dsp_tok_destroy(t);
    return st;
}

void dsp_tok_destroy(dsp_tok *t) {
    if (!t) return;
    dsp_tok_pre_destroy(t->pre);
    free(t->blob);
    free(t->text_off);
    free(t->text_len);
    free(t->key_off);
    free(t->key_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->nchars);
    free(t->type);
    free(t->added);
    free(t->vh);
    free(t->vh_hash);
    free(t->pm_key);
    free(t->pm_rank);
    free(t->pm_new);
    free(t->score_rank);
    free(t->cross_cp);
    free(t->tr_key);
    free(t->tr_child);
    free(t->tr_term);
    free(t->added_flags);
    free(t);
}

/* ---- from GGUF ------------------------------------------------------------------------------- */

static dsp_status opt_i32(const dsp_gguf *g, const char *key, int32_t *out) {
    uint32_t v;
    dsp_status st = dsp_gguf_get_u32(g, key, &v);
    if (st == DSP_ERR_NOT_FOUND) return DSP_OK;
    if (st) return st;
    if (v > INT32_MAX) return dsp_error(DSP_ERR_FORMAT, "%s = %u is out of range", key, v);
    *out = (int32_t)v;
    return DSP_OK;
}

static dsp_status opt_bool(const dsp_gguf *g, const char *key, int *out) {
    bool v;
    dsp_status st = dsp_gguf_get_bool(g, key, &v);
    if (st == DSP_ERR_NOT_FOUND) return DSP_OK;
    if (st) return st;
    *out = v;
    return DSP_OK;
}

static char *str_dup(dsp_str s) {
    char *c = malloc(s.len + 1);
    if (c) {
        memcpy(c, s.ptr, s.len);
        c[s.len] = 0;
    }
    return c;
}

dsp_status dsp_tok_create_from_gguf(const dsp_gguf *g, dsp_tok **out) {
    *out = NULL;
    dsp_tok_params p;
    memset(&p, 0, sizeof p);
    p.bos = p.eos = p.unk = p.pad = -1;
    p.add_bos = p.add_eos = p.add_space_prefix = -1;
    dsp_str model, pre = {0}, arch = {0};
    dsp_status st = dsp_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st == DSP_ERR_NOT_FOUND) return dsp_error(DSP_ERR_NOT_FOUND, "the file has no tokenizer (tokenizer.ggml.model absent)");
    if (st) return st;
    if (dsp_str_eq(model, "gpt2")) p.kind = DSP_TOK_BPE;
    else if (dsp_str_eq(model, "llama")) p.kind = DSP_TOK_SPM;
    else
        return dsp_error(DSP_ERR_UNSUPPORTED, "tokenizer.ggml.model '%.*s' is not supported (supported: gpt2, llama)",
                         (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if ((st = dsp_gguf_get_str(g, "tokenizer.ggml.pre", &pre)) && st != DSP_ERR_NOT_FOUND) return st;
    if ((st = dsp_gguf_get_str(g, "general.architecture", &arch)) && st != DSP_ERR_NOT_FOUND) return st;

    const dsp_gguf_kv *toks = NULL, *scores = NULL, *types = NULL, *merges = NULL;
    if ((st = dsp_gguf_get_arr(g, "tokenizer.ggml.tokens", DSP_GGUF_STRING, &toks))) {
        if (st == DSP_ERR_NOT_FOUND) return dsp_error(DSP_ERR_FORMAT, "tokenizer.ggml.tokens is absent");
        return st;
    }
    if ((st = dsp_gguf_get_arr(g, "tokenizer.ggml.scores", DSP_GGUF_F32, &scores)) && st != DSP_ERR_NOT_FOUND) return st;
    if ((st = dsp_gguf_get_arr(g, "tokenizer.ggml.token_type", DSP_GGUF_I32, &types)) && st != DSP_ERR_NOT_FOUND) return st;
    if ((st = dsp_gguf_get_arr(g, "tokenizer.ggml.merges", DSP_GGUF_STRING, &merges)) && st != DSP_ERR_NOT_FOUND) return st;
    dsp_error_clear();
    const uint64_t n = toks->arr_n;
    if (n == 0 || n > MAX_TOKENS) return dsp_error(DSP_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries (must be 1..%u)", (unsigned long long)n, MAX_TOKENS);
    if (scores && scores->arr_n != n)
        return dsp_error(DSP_ERR_FORMAT, "tokenizer.ggml.scores has %llu entries, tokens %llu", (unsigned long long)scores->arr_n, (unsigned long long)n);
    if (types && types->arr_n != n)
        return dsp_error(DSP_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries, tokens %llu", (unsigned long long)types->arr_n, (unsigned long long)n);
    if (merges && merges->arr_n > 4 * n + 1024)
        return dsp_error(DSP_ERR_FORMAT, "tokenizer.ggml.merges has %llu entries for %llu tokens", (unsigned long long)merges->arr_n, (unsigned long long)n);
    if ((st = opt_i32(g, "tokenizer.ggml.bos_token_id", &p.bos)) || (st = opt_i32(g, "tokenizer.ggml.eos_token_id", &p.eos)) ||
        (st = opt_i32(g, "tokenizer.ggml.unknown_token_id", &p.unk)) || (st = opt_i32(g, "tokenizer.ggml.padding_token_id", &p.pad)) ||
        (st = opt_bool(g, "tokenizer.ggml.add_bos_token", &p.add_bos)) || (st = opt_bool(g, "tokenizer.ggml.add_eos_token", &p.add_eos)) ||
        (st = opt_bool(g, "tokenizer.ggml.add_space_prefix", &p.add_space_prefix)))
        return st;
    int32_t *ids[4] = {&p.bos, &p.eos, &p.unk, &p.pad};
    for (int i = 0; i < 4; i++)
        if (*ids[i] >= (int64_t)n) {
            dsp_log(DSP_LOG_WARN, "tokenizer: special token id %d >= vocabulary size %llu: ignored", (int)*ids[i], (unsigned long long)n);
            *ids[i] = -1;
        }

    size_t nm = merges ? (size_t)merges->arr_n : 0;
    const char **tp = malloc(n * sizeof *tp);
    size_t *tl = malloc(n * sizeof *tl);
    float *sc = scores ? malloc(n * sizeof *sc) : NULL;
    int32_t *ty = types ? malloc(n * sizeof *ty) : NULL;
    const char **mp = nm ? malloc(nm * sizeof *mp) : NULL;
    size_t *ml = nm ? malloc(nm * sizeof *ml) : NULL;
    char *pre_c = pre.ptr ? str_dup(pre) : NULL, *arch_c = arch.ptr ? str_dup(arch) : NULL;
    if (!tp || !tl || (scores && !sc) || (types && !ty) || (nm && (!mp || !ml)) || (pre.ptr && !pre_c) || (arch.ptr && !arch_c)) {
        st = dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        dsp_str s = dsp_gguf_arr_str(toks, i);
        if (s.len > MAX_TOKEN_BYTES) {
            st = dsp_error(DSP_ERR_FORMAT, "tokenizer.ggml.tokens[%llu] is %llu bytes long (limit %u)", (unsigned long long)i,
                           (unsigned long long)s.len, MAX_TOKEN_BYTES);
            goto done;
        }
        tp[i] = s.ptr;
        tl[i] = (size_t)s.len;
        if (sc) sc[i] = (float)dsp_gguf_arr_float(scores, i);
        if (ty) {
            int64_t v = dsp_gguf_arr_int(types, i);
            ty[i] = v < 0 || v > 6 ? DSP_TOK_TYPE_UNDEFINED : (int32_t)v;
        }
    }
    for (size_t i = 0; i < nm; i++) {
        dsp_str s = dsp_gguf_arr_str(merges, i);
        mp[i] = s.ptr;
        ml[i] = s.len > 4 * MAX_TOKEN_BYTES ? 4 * MAX_TOKEN_BYTES : (size_t)s.len; /* over-long: skipped later */
    }
    p.arch = arch_c;
    p.pre = pre_c;
    p.n_tokens = (size_t)n;
    p.tokens = tp;
    p.token_lens = tl;
    p.scores = sc;
    p.types = ty;
    p.n_merges = nm;
    p.merges = mp;
    p.merge_lens = ml;
    st = dsp_tok_create(&p, out);
done:
    free(tp);
    free(tl);
    free(sc);
    free(ty);
    free(mp);
    free(ml);
    free(pre_c);
    free(arch_c);
    return st;
}

/* ---- accessors ------------------------------------------------------------------------------ */

size_t dsp_tok_n_vocab(const dsp_tok *t) { return t->n; }
dsp_tok_kind dsp_tok_get_kind(const dsp_tok *t) { return t->kind; }
const char *dsp_tok_pre_name(const dsp_tok *t) { return t->pre_name; }
int32_t dsp_tok_bos(const dsp_tok *t) { return t->bos; }
int32_t dsp_tok_eos(const dsp_tok *t) { return t->eos; }
size_t dsp_tok_max_piece_len(const dsp_tok *t) { return t->max_piece; }

const char *dsp_tok_piece(const dsp_tok *t, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= t->n) return NULL;
    *len = t->piece_len[id];
    return t->blob + t->piece_off[id];
}
const char *dsp_tok_text(const dsp_tok *t, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= t->n) return NULL;
    *len = t->text_len[id];
    return t->blob + t->text_off[id];
}
int32_t dsp_tok_type(const dsp_tok *t, int32_t id) {
    return id < 0 || (size_t)id >= t->n ? -1 : t->type[id];
}
bool dsp_tok_is_special(const dsp_tok *t, int32_t id) {
    return id >= 0 && (size_t)id < t->n && t->added[id] == ADDED_SPECIAL;
}
int32_t dsp_tok_find(const dsp_tok *t, const char *s, size_t len) {
    for (size_t i = 0; i < t->n; i++) /* rare (CLI, tests): a linear scan keeps no extra table */
        if (t->text_len[i] == len && !memcmp(t->blob + t->text_off[i], s, len)) return (int32_t)i;
    return -1;
}

/* ---- encode driver --------------------------------------------------------------------------- */

/* HF's lstrip/rstrip take Unicode whitespace; ASCII whitespace covers the tokenizers we load */
static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
/* single_word: a match must not touch a word character (ASCII letters, digits, '_', or any non-ASCII) */
static bool word_byte(uint8_t c) { return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }

void dsp_tok_ids_free(dsp_tok_ids *ids) {
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

dsp_status dsp_tok_ids_push(dsp_tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t nc = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, nc * sizeof *v);
        if (!v) return dsp_error(DSP_ERR_NOMEM, "tokenizer: out of memory for %zu ids", nc);
        ids->v = v;
        ids->cap = nc;
    }
    ids->v[ids->n++] = id;
    return DSP_OK;
}

dsp_status dsp_tok_encode(const dsp_tok *t, const char *text, size_t len, int flags, dsp_tok_ids *out) {
    if (!text && len) return dsp_error(DSP_ERR_INVALID_ARG, "tokenize: text is NULL");
    /* the encoder keeps offsets and symbol counts in 32 bits: SPM triples the text (every ' ' becomes
     * U+2581) and it must still fit */
    if (len > DSP_TOK_MAX_TEXT) return dsp_error(DSP_ERR_RANGE, "tokenize: text of %zu bytes is too long (limit 1 GiB)", len);
    dsp_status st = DSP_OK;
    char *clean = NULL;
    if (len && !dsp_utf8_valid(text, len)) {
        clean = dsp_utf8_sanitize(text, len, &len);
        if (!clean) return dsp_error(DSP_ERR_NOMEM, "tokenize: out of memory");
        text = clean;
    }
    dsp_tok_scratch sc;
    memset(&sc, 0, sizeof sc);
    if ((flags & DSP_TOKENIZE_ADD_SPECIAL) && t->add_bos && (st = dsp_tok_ids_push(out, t->bos))) goto done;
    const uint8_t *s = (const uint8_t *)text;
    const bool parse_special = (flags & DSP_TOKENIZE_PARSE_SPECIAL) != 0;
    size_t seg = 0, i = 0;
    while (i < len) {
        int32_t id = -1;
        size_t m = t->n_added ? trie_match(t, s + i, len - i, &id) : 0;
        if (!m) {
            i++;
            continue;
        }
        if (t->added[id] == ADDED_SPECIAL && !parse_special) { /* HF: found, then left in the text */
            i += m;
            continue;
        }
        uint8_t af = t->added_flags ? t->added_flags[id] : 0;
        if ((af & DSP_TOK_AF_SINGLE_WORD) && ((i > 0 && word_byte(s[i - 1])) || (i + m < len && word_byte(s[i + m])))) {
            i++;
            continue;
        }
        size_t start = i;
        if (af & DSP_TOK_AF_LSTRIP) /* the whitespace before the token goes with it */
            while (start > seg && is_ws(s[start - 1])) start--;
        if (af & DSP_TOK_AF_RSTRIP)
            while (i + m < len && is_ws(s[i + m])) m++;
        sc.at_text_start = seg == 0;
        if (start > seg && (st = dsp_tok_encode_segment(t, &sc, text + seg, start - seg, out))) goto done;
        if ((st = dsp_tok_ids_push(out, id))) goto done;
        i += m;
        seg = i;
    }
    sc.at_text_start = seg == 0;
    if (len > seg && (st = dsp_tok_encode_segment(t, &sc, text + seg, len - seg, out))) goto done;
    if ((flags & DSP_TOKENIZE_ADD_SPECIAL) && t->add_eos && (st = dsp_tok_ids_push(out, t->eos))) goto done;
done:
    dsp_tok_scratch_free(&sc);
    free(clean);
    return st;
}

/* ---- decode ---------------------------------------------------------------------------------- */

struct dsp_detok_stream {
    const dsp_tok *t;
    int flags;
    bool at_start; /* SPM with a space prefix: drop the first output space (HF's Strip decoder) */
    dsp_utf8_state u;
    uint8_t *buf;  /* 3 * max_piece + 8 */
};

static size_t stream_emit(dsp_detok_stream *s, const uint8_t *src, size_t n) {
    size_t o = dsp_utf8_feed(&s->u, src, n, s->buf);
    if (s->at_start && o) {
        s->at_start = false;
        if (s->buf[0] == ' ') {
            memmove(s->buf, s->buf + 1, o - 1);
            o--;
        }
    }
    return o;
}

dsp_status dsp_detok_stream_create(const dsp_tok *t, int flags, dsp_detok_stream **out) {
    *out = NULL;
    dsp_detok_stream *s = calloc(1, sizeof *s);
    if (s) s->buf = malloc(3 * t->max_piece + 8);
    if (!s || !s->buf) {
        if (s) free(s);
        return dsp_error(DSP_ERR_NOMEM, "detokenize: out of memory");
    }
    s->t = t;
    s->flags = flags;
    s->at_start = t->kind == DSP_TOK_SPM && t->decode_strip;
    *out = s;
    return DSP_OK;
}

void dsp_detok_stream_destroy(dsp_detok_stream *s) {
    if (!s) return;
    free(s->buf);
    free(s);
}

dsp_status dsp_detok_stream_feed(dsp_detok_stream *s, int32_t id, const char **text, size_t *len) {
    *text = (const char *)s->buf;
    *len = 0;
    const dsp_tok *t = s->t;
    if (id < 0 || (size_t)id >= t->n) return dsp_error(DSP_ERR_RANGE, "detokenize: token id %d out of range (vocabulary of %zu)", (int)id, t->n);
    if ((s->flags & DSP_DETOKENIZE_SKIP_SPECIAL) && t->added[id] == ADDED_SPECIAL) return DSP_OK;
    *len = stream_emit(s, (const uint8_t *)t->blob + t->piece_off[id], t->piece_len[id]);
    return DSP_OK;
}

dsp_status dsp_detok_stream_flush(dsp_detok_stream *s, const char **text, size_t *len) {
    size_t o = dsp_utf8_finish(&s->u, s->buf);
    if (s->at_start && o) s->at_start = false; /* U+FFFD is not a space */
    *text = (const char *)s->buf;
    *len = o;
    return DSP_OK;
}

dsp_status dsp_tok_decode(const dsp_tok *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len_out) {
    *text = NULL;
    *len_out = 0;
    size_t cap = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n)
            return dsp_error(DSP_ERR_RANGE, "detokenize: token id %d (at %zu) out of range (vocabulary of %zu)", (int)ids[i], i, t->n);
        cap += 3 * (size_t)t->piece_len[ids[i]];
    }
    char *buf = malloc(cap + 8);
    dsp_detok_stream *s = NULL;
    dsp_status st = dsp_detok_stream_create(t, flags, &s);
    if (st || !buf) {
        free(buf);
        dsp_detok_stream_destroy(s);
        return st ? st : dsp_error(DSP_ERR_NOMEM, "detokenize: out of memory");
    }
    size_t o = 0;
    const char *p;
    size_t l;
    for (size_t i = 0; i < n; i++) {
        dsp_detok_stream_feed(s, ids[i], &p, &l);
        memcpy(buf + o, p, l);
        o += l;
    }
    dsp_detok_stream_flush(s, &p, &l);
    memcpy(buf + o, p, l);
    o += l;
    buf[o] = 0;
    dsp_detok_stream_destroy(s);
    *text = buf;
    *len_out = o;
    return DSP_OK;
}
