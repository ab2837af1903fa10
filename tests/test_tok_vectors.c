/* test_tok_vectors: the public tokenizer test vectors (llama.cpp's models/ggml-vocab-*.gguf with
 * .inp/.out, expected ids produced by each model's own Hugging Face tokenizer) read from
 * $DSP_TESTDATA/tokenizer-vectors. Every complete trio of a supported tokenizer family must match
 * exactly; WordPiece (bert) vocabularies are skipped. Skips with a message if the folder is absent. */
/* ctest-label: oracle */
#include "dsp_test.h"

#include "dspark.h"
#include "io/gguf.h"
#include "tok/tok.h"

#include <dirent.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = (size_t)n;
    return b;
}

static int g_vocabs_checked;

static void check_vocab(const char *dir, const char *name) {
    if (strlen(dir) > 2048) return;
    char path[8192];
    snprintf(path, sizeof path, "%.2000s/ggml-vocab-%.100s.gguf", dir, name);
    dsp_gguf *g = NULL;
    dsp_tok *t = NULL;
    if (dsp_gguf_open(path, &g)) {
        CHECK_MSG(0, "%s: %s", path, dsp_last_error());
        return;
    }
    dsp_str model;
    if (dsp_gguf_get_str(g, "tokenizer.ggml.model", &model) == DSP_OK && dsp_str_eq(model, "bert")) {
        fprintf(stderr, "not checked %s: WordPiece (bert) tokenizers are not implemented\n", name);
        dsp_gguf_destroy(g);
        return;
    }
    if (dsp_tok_create_from_gguf(g, &t)) {
        CHECK_MSG(0, "%s: %s", name, dsp_last_error());
        dsp_gguf_destroy(g);
        return;
    }
    size_t li, lo;
    snprintf(path, sizeof path, "%.2000s/ggml-vocab-%.100s.gguf.inp", dir, name);
    char *inp = slurp(path, &li);
    snprintf(path, sizeof path, "%.2000s/ggml-vocab-%.100s.gguf.out", dir, name);
    char *out = slurp(path, &lo);
    CHECK(inp && out);
    size_t n_ok = 0, n_total = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *ip = inp, *op = out;
    while (ip && op && *ip) {
        char *e = strstr(ip, sep);
        if (!e) break;
        char *ol = strchr(op, '\n');
        if (!ol) break;
        *ol = 0;
        dsp_tok_ids ids = {0};
        bool good = dsp_tok_encode(t, ip, (size_t)(e - ip), 0, &ids) == DSP_OK;
        /* expected: space-separated ids */
        size_t k = 0;
        char *q = op;
        while (good) {
            while (*q == ' ') q++;
            if (!*q) break;
            long v = strtol(q, &q, 10);
            if (k >= ids.n || ids.v[k] != v) good = false;
            k++;
        }
        if (k != ids.n) good = false;
        n_ok += good;
        n_total++;
        if (!good) {
            fprintf(stderr, "  %s: input %zu \"%.*s\"\n    want %s\n    got ", name, n_total, (int)(e - ip), ip, op);
            for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.v[i]);
            fputc('\n', stderr);
        }
        dsp_tok_ids_free(&ids);
        ip = e + strlen(sep);
        op = ol + 1;
    }
    fprintf(stderr, "%-16s %-5s pre=%-16s %zu/%zu\n", name, dsp_tok_get_kind(t) == DSP_TOK_BPE ? "bpe" : "spm",
            dsp_tok_pre_name(t), n_ok, n_total);
    CHECK(n_total > 0);
    CHECK_EQ_INT(n_ok, n_total);
    g_vocabs_checked++;
    free(inp);
    free(out);
    dsp_tok_destroy(t);
    dsp_gguf_destroy(g);
}

static bool exists(const char *dir, const char *name, const char *suffix) {
    char path[8192];
    snprintf(path, sizeof path, "%.2000s/ggml-vocab-%.100s%.20s", dir, name, suffix);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static void test_vectors(void) {
    const char *shared = dsp_test_shared_dir();
    if (!shared) {
        dsp_test_skip("DSP_TESTDATA not set (the public test vectors of ../shared/testdata are absent)");
        return;
    }
    char dir[2048];
    snprintf(dir, sizeof dir, "%.2000s/tokenizer-vectors", shared);
    DIR *d = opendir(dir);
    if (!d) {
        dsp_test_skip("%s absent", dir);
        return;
    }
    struct dirent *de;
    char names[64][128];
    int nn = 0;
    while ((de = readdir(d)) && nn < 64) {
        const char *s = de->d_name;
        size_t l = strlen(s);
        if (strncmp(s, "ggml-vocab-", 11) || l < 16 || strcmp(s + l - 5, ".gguf") || l - 16 >= 128) continue;
        snprintf(names[nn], sizeof names[nn], "%.*s", (int)(l - 16), s + 11);
        nn++;
    }
    closedir(d);
    for (int i = 0; i < nn; i++) {
        if (!exists(dir, names[i], ".gguf.inp") || !exists(dir, names[i], ".gguf.out")) {
            fprintf(stderr, "not checked %s: the test data has no .inp/.out pair for it\n", names[i]);
            continue;
        }
        check_vocab(dir, names[i]);
    }
    fprintf(stderr, "%d vocabularies checked\n", g_vocabs_checked);
    CHECK(g_vocabs_checked > 0);
}

int main(void) {
    DSP_RUN(test_vectors);
    return dsp_test_summary();
}
