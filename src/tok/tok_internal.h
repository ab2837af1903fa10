/* tok/tok_internal: the tokenizer's representation, shared by tok.c and tok_bpe.c only. */
#ifndef DSP_TOK_TOK_INTERNAL_H
#define DSP_TOK_TOK_INTERNAL_H

#include "tok/nfc.h"
#include "tok/tok.h"

enum { ADDED_NONE = 0, ADDED_SPECIAL = 1, ADDED_USER = 2 };

struct dsp_tokenizer {
    dsp_tok_kind kind;
    bool gemma;                 /* SPM variant: no space prefix, merge order = token order, space tokens respelled */
    char pre_name[48];
    size_t n;                   /* vocabulary size */
    int32_t bos, eos, unk, pad; /* -1: none */
    bool add_bos, add_eos, add_space_prefix;
    bool space_prefix_first_only, space_prefix_unless_space, spm_split, decode_strip, ignore_merges;
    bool nfc;                              /* each segment between added tokens is NFC-normalized first */
    uint8_t *added_flags;                  /* (n) DSP_TOK_AF_*, or NULL */
    size_t max_piece;

    char *blob;                            /* all token strings */
    uint32_t *text_off, *text_len;         /* (n) as in the file */
    uint32_t *key_off, *key_len;           /* (n) what BPE looks up */
    uint32_t *piece_off, *piece_len;       /* (n) decoded bytes */
    uint32_t *nchars;                      /* (n) code points in key */
    int32_t *type;                         /* (n) DSP_TOK_TYPE_* */
    uint8_t *added;                        /* (n) ADDED_* */

    uint32_t *vh;                          /* (vh_mask+1) id+1, 0 = empty */
    uint64_t *vh_hash;                     /* (vh_mask+1) key hash */
    size_t vh_mask;

    bool has_merges;
    size_t n_merges_skipped;               /* merges naming tokens absent from the vocabulary */
    uint64_t *pm_key;                      /* (pm_mask+1) left<<32 | right */
    uint32_t *pm_rank;                     /* (pm_mask+1) */
    int32_t *pm_new;                       /* (pm_mask+1) merged id, -1 = empty */
    size_t pm_mask;
    uint32_t *score_rank;                  /* (n) SPM without merges: dense rank, best score first */
    /* SPM: code points X such that some token contains X followed by U+2581 (X itself not U+2581),
     * sorted. Between any other character and a U+2581 no merge can ever happen, so the text is
     * cut there into independent BPE words (same result, small heaps). Gemma 3 has one: '>'. */
    uint32_t *cross_cp;
    size_t n_cross;

    int32_t byte_tok[256];                 /* BPE: token of a single byte; SPM: <0xXX>; -1 if absent */

    /* added tokens: a byte trie; edges in an open-addressing table keyed by node<<8 | byte */
    uint64_t *tr_key;
    int32_t *tr_child;                     /* -1 = empty slot */
    size_t tr_mask;
    int32_t *tr_term;                      /* per node: token id ending here or -1 */
    int32_t tr_n;
    bool tr_first[256];                    /* some added token starts with this byte */
    size_t n_added;

    dsp_tok_pre *pre;                      /* BPE only */
};

/* Per-call scratch of the encoder (grown as needed, freed at the end of the call). */
typedef struct dsp_tok_sym {
    int32_t id;
    uint32_t start, len;  /* bytes of the word */
    uint32_t nch;         /* code points */
    int32_t prev, next;
    bool can_merge;       /* false for byte-fallback and unknown symbols */
} dsp_tok_sym;
typedef struct dsp_tok_cand {
    uint64_t rank;
    int32_t pos, merged;
} dsp_tok_cand;
typedef struct dsp_tok_scratch {
    dsp_tok_sym *sym;
    size_t sym_cap;
    dsp_tok_cand *heap;
    size_t heap_n, heap_cap;
    char *norm;            /* SPM normalized text */
    size_t norm_cap;
    dsp_nfc_scratch nfc;   /* NFC of the segment (when the tokenizer asks for it) */
    dsp_tok_spans pieces, tmp;
    bool at_text_start;    /* the segment being encoded starts the text */
} dsp_tok_scratch;
void dsp_tok_scratch_free(dsp_tok_scratch *sc);

int32_t dsp_tok_vocab_lookup(const dsp_tok *t, const char *s, size_t n);
bool dsp_tok_pair_lookup(const dsp_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *merged);
/* Encode one stretch of text that contains no added token. */
dsp_status dsp_tok_encode_segment(const dsp_tok *t, dsp_tok_scratch *sc, const char *text, size_t len, dsp_tok_ids *out);

#endif
