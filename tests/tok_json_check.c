/* tok_json_check TOKENIZER_DIR FIXTURE.jsonl CORPUS.jsonl
 *
 * Builds a tokenizer from TOKENIZER_DIR/tokenizer.json (+ tokenizer_config.json if present) and
 * compares, for every corpus string, our ids with the fixture's (the `tokenizers` package's,
 * tools/gen_tok_hf_fixtures.py) and our decode of those ids with the text (or the fixture's
 * "decoded" where tokenizers' round trip is not exact). Invalid UTF-8 corpus entries ("hex") are
 * fed as raw bytes. Prints the first mismatches; exit 1 on any. Driven by tests/py/test_tok_hf.py. */
#include "core/file.h"
#include "io/json.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t unhex(const char *h, char *out) {
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tok_json_check TOKENIZER_DIR FIXTURE.jsonl CORPUS.jsonl\n");
        return 2;
    }
    char *tp = dsp_path_join(argv[1], "tokenizer.json"), *cp = dsp_path_join(argv[1], "tokenizer_config.json");
    json_t *tj = NULL, *tc = NULL;
    dsp_tok *t = NULL;
    char md[64], pd[128];
    if (dsp_json_load_file(tp, 1u << 30, &tj) || (dsp_file_exists(cp) && dsp_json_load_file(cp, 1u << 24, &tc)) ||
        dsp_tok_create_from_hf(tj, tc, &t, md, sizeof md, pd, sizeof pd)) {
        fprintf(stderr, "tok_json_check: %s\n", dsp_last_error());
        return 2;
    }
    FILE *fx = fopen(argv[2], "r"), *co = fopen(argv[3], "r");
    if (!fx || !co) return 2;
    char *lf = NULL, *lc = NULL;
    size_t cf = 0, cc = 0;
    if (getline(&lf, &cf, fx) < 0) return 2; /* header */
    int n = 0, bad_ids = 0, bad_dec = 0;
    while (getline(&lf, &cf, fx) > 0 && getline(&lc, &cc, co) > 0) {
        json_error_t je;
        json_t *f = json_loads(lf, JSON_ALLOW_NUL, &je), *c = json_loads(lc, JSON_ALLOW_NUL, &je);
        const char *hex = json_string_value(json_object_get(c, "hex"));
        size_t len = hex ? strlen(hex) / 2 : json_string_length(json_object_get(c, "text"));
        char *text = malloc(len + 1);
        if (hex) unhex(hex, text);
        else memcpy(text, json_string_value(json_object_get(c, "text")), len);
        dsp_tok_ids ids = {0};
        dsp_tok_encode(t, text, len, DSP_TOKENIZE_PARSE_SPECIAL, &ids); /* tokenizers matches special tokens in text */
        json_t *want = json_object_get(f, "ids");
        bool same = ids.n == json_array_size(want);
        for (size_t i = 0; same && i < ids.n; i++) same = ids.v[i] == json_integer_value(json_array_get(want, i));
        if (!same && bad_ids++ < 5) {
            fprintf(stderr, "ids differ for corpus %d: %.*s\n  ours:", n, (int)(len > 80 ? 80 : len), text);
            for (size_t i = 0; i < ids.n && i < 30; i++) fprintf(stderr, " %d", ids.v[i]);
            fprintf(stderr, "\n  want: %.300s\n", lf);
        }
        /* decode the oracle's ids */
        size_t nw = json_array_size(want);
        int32_t *w = malloc((nw ? nw : 1) * sizeof *w);
        for (size_t i = 0; i < nw; i++) w[i] = (int32_t)json_integer_value(json_array_get(want, i));
        char *dec = NULL;
        size_t dl = 0;
        dsp_tok_decode(t, w, nw, 0, &dec, &dl);
        const json_t *jd = json_object_get(f, "decoded");
        const char *exp = jd ? json_string_value(jd) : text;
        size_t el = jd ? json_string_length(jd) : len;
        if (!hex && (dl != el || memcmp(dec, exp, el)) && bad_dec++ < 5)
            fprintf(stderr, "decode differs for corpus %d: ours '%.80s' want '%.80s'\n", n, dec, exp);
        free(dec), free(w), free(text);
        dsp_tok_ids_free(&ids);
        json_decref(f), json_decref(c);
        n++;
    }
    printf("%s: %d strings, %d id mismatches, %d decode mismatches (%s, pre-tokenizer %s)\n", argv[2], n, bad_ids, bad_dec, md, pd);
    free(lf), free(lc), free(tp), free(cp);
    fclose(fx), fclose(co);
    json_decref(tj), json_decref(tc);
    dsp_tok_destroy(t);
    return bad_ids || bad_dec ? 1 : 0;
}
