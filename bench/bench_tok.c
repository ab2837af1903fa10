/* bench_tok: tokenizer throughput on one core.
 *
 *   bench_tok -m MODEL [--text FILE] [--mb N] [--repeats R] [--json]
 *
 * Encodes a text (FILE, or N MB of generated English prose by default) R times and reports the
 * median encode throughput in MB/s of input, the median decode throughput, and as the in-run
 * baseline the throughput of the pre-tokenizer alone (byte-level models) so that the BPE share is
 * visible. MODEL may also be a Hugging Face directory (its tokenizer.json): when that declares a
 * normalizer (NFC for Qwen2/3), the baseline is the same tokenizer without it, so that the
 * normalizer's cost is visible. Single-threaded by construction. */
#include "bench_util.h"
#include "dspark.h"
#include "core/file.h"
#include "io/gguf.h"
#include "io/json.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

static const char *k_words[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "that", "with", "as", "on", "by", "at", "from", "his", "her",
    "they", "this", "be", "which", "or", "are", "have", "had", "not", "but", "were", "one", "all", "their", "there",
    "been", "has", "more", "when", "who", "will", "would", "can", "if", "about", "into", "than", "them", "some",
    "could", "these", "two", "may", "first", "then", "do", "any", "like", "my", "now", "over", "such", "our", "man",
    "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where",
    "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too",
    "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here",
    "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might",
    "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three",
    "government", "development", "information", "understanding", "particularly", "responsibility", "Washington",
    "September", "approximately", "it's", "don't", "I'm", "we've", "tokenization", "speculative", "inference",
    "1984", "2,500", "3.14", "(see", "below)", "\"quoted\"", "e.g.", "co-operation", "well-known", "Mr.", "Dr."};

static char *gen_text(size_t n) {
    char *s = malloc(n + 64);
    size_t o = 0, w = 0;
    uint64_t x = 88172645463325252ULL;
    while (o < n) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *word = k_words[x % (sizeof k_words / sizeof k_words[0])];
        size_t l = strlen(word);
        if (o + l + 2 >= n) break;
        if (w == 0 && word[0] >= 'a' && word[0] <= 'z') s[o++] = (char)(word[0] - 32), word++, l--;
        memcpy(s + o, word, l);
        o += l;
        w++;
        if (w > 8 + x % 12) {
            s[o++] = ".,;!?"[(x >> 8) % 5];
            w = 0;
            if ((x >> 16) % 6 == 0) { s[o++] = '\n'; continue; }
        }
        s[o++] = ' ';
    }
    s[o] = 0;
    return s;
}

static char *read_all(const char *path, size_t *len) {
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
    *len = (size_t)n;
    return b;
}

int main(int argc, char **argv) {
    const char *model = NULL, *textf = NULL;
    double mb = 4;
    int repeats = 7;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) textf = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = true;
        else {
            fprintf(stderr, "usage: bench_tok -m MODEL [--text FILE] [--mb N] [--repeats R] [--json]\n");
            return 2;
        }
    }
    if (!model || repeats < 1 || repeats > 1000 || mb <= 0 || mb > 1024) {
        fprintf(stderr, "usage: bench_tok -m MODEL [--text FILE] [--mb N] [--repeats R] [--json]\n");
        return 2;
    }
    size_t len;
    char *text = textf ? read_all(textf, &len) : gen_text((size_t)(mb * 1e6));
    if (!text) {
        fprintf(stderr, "bench_tok: cannot read %s\n", textf);
        return 1;
    }
    if (!textf) len = strlen(text);
    dsp_gguf *g = NULL;
    dsp_tok *t = NULL, *plain = NULL; /* plain: tokenizer.json without its normalizer */
    double t0 = bench_now();
    if (dsp_file_is_dir(model)) {
        char *tp = dsp_path_join(model, "tokenizer.json"), md[64], pd[128];
        json_t *tj = NULL;
        if (!tp || dsp_json_load_file(tp, 1u << 30, &tj) || dsp_tok_create_from_hf(tj, NULL, &t, md, sizeof md, pd, sizeof pd)) {
            fprintf(stderr, "bench_tok: %s: %s\n", model, dsp_last_error());
            return 1;
        }
        const json_t *norm = json_object_get(tj, "normalizer");
        if (norm && !json_is_null(norm) && (json_object_del(tj, "normalizer") || dsp_tok_create_from_hf(tj, NULL, &plain, md, sizeof md, pd, sizeof pd))) {
            fprintf(stderr, "bench_tok: %s without its normalizer: %s\n", model, dsp_last_error());
            return 1;
        }
        json_decref(tj);
        free(tp);
    } else if (dsp_gguf_open(model, &g) || dsp_tok_create_from_gguf(g, &t)) {
        fprintf(stderr, "bench_tok: %s: %s\n", model, dsp_last_error());
        return 1;
    }
    double load_s = bench_now() - t0;
    double *enc = calloc((size_t)repeats, sizeof(double)), *dec = calloc((size_t)repeats, sizeof(double)),
           *pre = calloc((size_t)repeats, sizeof(double));
    size_t n_ids = 0;
    for (int r = 0; r < repeats; r++) {
        dsp_tok_ids ids = {0};
        double a = bench_now();
        if (dsp_tok_encode(t, text, len, 0, &ids)) {
            fprintf(stderr, "bench_tok: encode: %s\n", dsp_last_error());
            return 1;
        }
        double b = bench_now();
        char *out;
        size_t ol;
        if (dsp_tok_decode(t, ids.v, ids.n, 0, &out, &ol)) return 1;
        double c = bench_now();
        enc[r] = (double)len / 1e6 / (b - a);
        dec[r] = (double)ol / 1e6 / (c - b);
        n_ids = ids.n;
        free(out);
        dsp_tok_ids_free(&ids);
        if (plain) {
            ids = (dsp_tok_ids){0};
            a = bench_now();
            if (dsp_tok_encode(plain, text, len, 0, &ids)) return 1;
            pre[r] = (double)len / 1e6 / (bench_now() - a);
            dsp_tok_ids_free(&ids);
        } else if (!g) {
            pre[r] = 0;
        } else if (dsp_tok_get_kind(t) == DSP_TOK_BPE) {
            dsp_tok_pre *p = NULL;
            dsp_tok_spans s = {0}, tmp = {0};
            dsp_tok_pre_create(dsp_tok_pre_name(t), &p);
            a = bench_now();
            dsp_tok_pre_split(p, text, len, &s, &tmp);
            pre[r] = (double)len / 1e6 / (bench_now() - a);
            dsp_tok_spans_free(&s);
            dsp_tok_spans_free(&tmp);
            dsp_tok_pre_destroy(p);
        }
    }
    double enc_m = bench_median(enc, repeats), dec_m = bench_median(dec, repeats), pre_m = bench_median(pre, repeats);
    struct utsname u;
    uname(&u);
    char cpu[256] = "unknown";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) snprintf(cpu, sizeof cpu, "%s", c + 2);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(ci);
    }
    if (json) {
        printf("{\"bench\": \"tok\", \"model\": \"%s\", \"kind\": \"%s\", \"pre\": \"%s\", \"text\": \"%s\", "
               "\"text_bytes\": %zu, \"ids\": %zu, \"repeats\": %d, \"threads\": 1, \"load_s\": %.3f, "
               "\"encode_mb_s_median\": %.2f, \"decode_mb_s_median\": %.2f, \"%s_mb_s_median\": %.2f, "
               "\"encode_vs_%s\": %.3f, \"machine\": {\"cpu\": \"%s\", \"kernel\": \"%s %s\"}}\n",
               model, dsp_tok_get_kind(t) == DSP_TOK_BPE ? "bpe" : "spm", dsp_tok_pre_name(t),
               textf ? textf : "generated-english", len, n_ids, repeats, load_s, enc_m, dec_m, plain ? "encode_without_normalizer" : "pretok_only",
               pre_m, plain ? "without_normalizer" : "pretok_only", pre_m > 0 ? enc_m / pre_m : 0.0, cpu, u.sysname, u.release);
    } else {
        printf("model %s (%s, pre %s), text %zu bytes -> %zu ids, %d repeats, 1 thread, %s\n", model,
               dsp_tok_get_kind(t) == DSP_TOK_BPE ? "bpe" : "spm", dsp_tok_pre_name(t), len, n_ids, repeats, cpu);
        printf("  load      %8.3f s\n  encode    %8.2f MB/s (median)\n  decode    %8.2f MB/s (median)\n", load_s, enc_m, dec_m);
        if (plain) printf("  no norm.  %8.2f MB/s (without the normalizer; encode is %.2fx of it)\n", pre_m, enc_m / pre_m);
        else if (pre_m > 0) printf("  pre-tok   %8.2f MB/s (regex split alone; encode is %.2fx of it)\n", pre_m, enc_m / pre_m);
    }
    free(enc);
    free(dec);
    free(pre);
    free(text);
    dsp_tok_destroy(t);
    dsp_tok_destroy(plain);
    dsp_gguf_destroy(g);
    return 0;
}
