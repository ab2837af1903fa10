/* Unit tests for io/safetensors: a valid file built here (three dtypes, a scalar, a 3-D tensor,
 * __metadata__) read through every accessor; every truncation and every single-bit flip of its
 * header (each must open cleanly or fail with a message, never read outside the buffer: each input
 * is copied into a buffer of exactly its size for ASan); hand-made corrupt files whose message must
 * name the problem; and a sharded directory with a bad index. `test_safetensors --write-seeds DIR`
 * writes the valid and hand-made files as a seed corpus for fuzz/fuzz_safetensors (scripts/fuzz). */
/* ctest-label: unit */
#include "dsp_test.h"

#include "core/dtype.h"
#include "io/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

/* header JSON + data bytes -> a file image (u64 length, JSON, data) */
static uint8_t *image(const char *json, size_t data_len, size_t *size) {
    size_t hl = strlen(json);
    *size = 8 + hl + data_len;
    uint8_t *p = malloc(*size);
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(p + 8, json, hl);
    for (size_t i = 0; i < data_len; i++) p[8 + hl + i] = (uint8_t)(i * 7 + 1);
    return p;
}

#define VALID                                                                                              \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                                               \
    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[0,24]},"                           \
    "\"b.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]},"                               \
    "\"c\":{\"dtype\":\"F16\",\"shape\":[2,1,3],\"data_offsets\":[40,52]},"                                \
    "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[52,60]}}"
#define VALID_DATA 60

/* open a copy of exactly n bytes; returns status, walks the result */
static dsp_status try_open(const uint8_t *p, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, p, n);
    dsp_st *s = NULL;
    dsp_error_clear();
    dsp_status st = dsp_st_open_memory(c, n, &s);
    if (st) {
        CHECK(s == NULL);
        CHECK_MSG(dsp_last_error()[0] != '\0', "status %d without a message", st);
    } else {
        for (uint64_t i = 0; i < dsp_st_n_tensors(s); i++) {
            const dsp_tensor *t = dsp_st_tensor_at(s, i);
            volatile uint8_t x = 0;
            if (t->nbytes) x ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)x;
            CHECK(dsp_st_find(s, t->name.ptr) == t);
        }
        dsp_st_destroy(s);
    }
    free(c);
    return st;
}

static void test_valid(void) {
    size_t n;
    uint8_t *p = image(VALID, VALID_DATA, &n);
    dsp_st *s;
    CHECK_EQ_INT(dsp_st_open_memory(p, n, &s), DSP_OK);
    CHECK_EQ_INT(dsp_st_n_tensors(s), 4);
    const dsp_tensor *a = dsp_st_find(s, "a.weight"), *c = dsp_st_find(s, "c"), *sc = dsp_st_find(s, "s");
    CHECK(a && a->type == DSP_BF16 && a->n_dims == 2 && a->ne[0] == 4 && a->ne[1] == 3 && a->nbytes == 24);
    CHECK(a && a->data == p + 8 + strlen(VALID));
    CHECK(c && c->type == DSP_F16 && c->n_dims == 3 && c->ne[0] == 3 && c->ne[1] == 1 && c->ne[2] == 2 && c->n_elems == 6);
    CHECK(sc && sc->type == DSP_I64 && sc->n_dims == 1 && sc->n_elems == 1);
    CHECK(dsp_st_find(s, "nope") == NULL);
    CHECK_EQ_STR(dsp_st_metadata(s, "format"), "pt");
    CHECK(dsp_st_metadata(s, "other") == NULL);
    CHECK_EQ_STR(dsp_st_dtype_name(s, (uint64_t)(a - dsp_st_tensor_at(s, 0))), "BF16");
    CHECK_EQ_INT(dsp_st_n_files(s), 1);
    dsp_st_destroy(s);
    free(p);
}

static void test_truncations_and_flips(void) {
    size_t n;
    uint8_t *p = image(VALID, VALID_DATA, &n);
    for (size_t k = 0; k < n; k++) CHECK_MSG(try_open(p, k) != DSP_OK, "truncation to %zu bytes opened", k);
    size_t hdr = 8 + strlen(VALID);
    for (size_t i = 0; i < hdr; i++)
        for (int b = 0; b < 8; b++) {
            p[i] ^= (uint8_t)(1 << b);
            try_open(p, n); /* may open (e.g. a flipped letter of a name): must not crash */
            p[i] ^= (uint8_t)(1 << b);
        }
    free(p);
}

typedef struct bad_case {
    const char *json;
    size_t data;
    dsp_status st;
    const char *msg;
} bad_case;

static const bad_case g_bad[] = {
    {"[1,2]", 0, DSP_ERR_FORMAT, "does not start with '{'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, DSP_ERR_FORMAT, "header JSON"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
     DSP_ERR_FORMAT, "duplicate"},
    {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DSP_ERR_FORMAT, "unknown dtype 'F33'"},
    {"{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, DSP_ERR_UNSUPPORTED, "F8_E4M3 is not supported"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, DSP_ERR_FORMAT, "shape[0] is not a non-negative integer"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, DSP_ERR_UNSUPPORTED, "5 dimensions"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, DSP_ERR_FORMAT, "overflows"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, DSP_ERR_FORMAT, "hold 4 bytes, but 2 elements of F32 need 8"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, DSP_ERR_FORMAT, "end before they begin"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, DSP_ERR_FORMAT, "past the end of the file"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
     DSP_ERR_FORMAT, "overlap tensor 'a'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, DSP_ERR_FORMAT, "leaving bytes 0..4"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, DSP_ERR_FORMAT, "8 bytes of data after the last tensor"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, DSP_ERR_FORMAT, "\"data_offsets\" is missing"},
    {"{\"a\":[1]}", 0, DSP_ERR_FORMAT, "not a JSON object"},
    {"{\"__metadata__\":{\"x\":1}}", 0, DSP_ERR_FORMAT, "__metadata__\" value of 'x' is not a string"},
    {"{}", 4, DSP_ERR_FORMAT, "no tensors, but 4 bytes"},
};
#define N_BAD (sizeof g_bad / sizeof g_bad[0])

static void test_bad(void) {
    for (size_t i = 0; i < N_BAD; i++) {
        size_t n;
        uint8_t *p = image(g_bad[i].json, g_bad[i].data, &n);
        dsp_st *s = NULL;
        dsp_status st = dsp_st_open_memory(p, n, &s);
        CHECK_MSG(st == g_bad[i].st && strstr(dsp_last_error(), g_bad[i].msg), "case %zu: status %d, message '%s' (want '%s')", i, st,
                  dsp_last_error(), g_bad[i].msg);
        dsp_st_destroy(s);
        free(p);
    }
    /* header length past the end, and over the limit */
    uint8_t h[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    dsp_st *s = NULL;
    CHECK(dsp_st_open_memory(h, sizeof h, &s) == DSP_ERR_FORMAT && strstr(dsp_last_error(), "runs past the end"));
    CHECK(dsp_st_open_memory(h, 7, &s) == DSP_ERR_FORMAT && strstr(dsp_last_error(), "shorter than the 8-byte"));
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fwrite(p, 1, n, f);
    fclose(f);
}

static void test_directory(void) {
    char dir[] = "/tmp/dsp_st_XXXXXX";
    if (!mkdtemp(dir)) abort();
    char path[256], idx[256];
    size_t n1, n2;
    uint8_t *s1 = image("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &n1);
    uint8_t *s2 = image("{\"y\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, &n2);
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    write_file(path, s1, n1);
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    write_file(path, s2, n2);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    dsp_st *s = NULL;
    CHECK(dsp_st_open(dir, &s) == DSP_ERR_NOT_FOUND && strstr(dsp_last_error(), "no weights"));
    const char *ok = "{\"metadata\":{},\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}";
    write_file(idx, ok, strlen(ok));
    CHECK_EQ_INT(dsp_st_open(dir, &s), DSP_OK);
    if (s) {
        CHECK(dsp_st_n_files(s) == 2 && dsp_st_n_tensors(s) == 2 && dsp_st_find(s, "y") && dsp_st_find(s, "y")->type == DSP_BF16);
        CHECK(dsp_st_tensor_file(s, 1) == 1);
        dsp_st_destroy(s);
    }
    struct {
        const char *index, *msg;
    } bad[] = {
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\"}}", "lists tensor 'y' in a.safetensors"},
        {"{\"weight_map\":{\"x\":\"b.safetensors\",\"y\":\"b.safetensors\"}}", "lists tensor 'x' in b.safetensors"},
        {"{\"weight_map\":{\"x\":\"../a.safetensors\"}}", "not a file name in this directory"},
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"c.safetensors\"}}", "c.safetensors: cannot open"},
        {"{\"weight_map\":[]}", "\"weight_map\" is missing or not an object"},
        {"{\"weight_map\":", "line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(idx, bad[i].index, strlen(bad[i].index));
        dsp_status st = dsp_st_open(dir, &s);
        CHECK_MSG(st != DSP_OK && s == NULL && strstr(dsp_last_error(), bad[i].msg), "index case %zu: '%s'", i, dsp_last_error());
    }
    /* the same tensor in two shards */
    uint8_t *s3 = image("{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, &n2);
    write_file(path, s3, n2);
    const char *dup = "{\"weight_map\":{\"x\":\"a.safetensors\"}}";
    write_file(idx, dup, strlen(dup));
    /* b.safetensors (now holding x) is not in the index: only a.safetensors is opened, fine */
    CHECK_EQ_INT(dsp_st_open(dir, &s), DSP_OK);
    dsp_st_destroy(s);
    const char *dup2 = "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"b.safetensors\"}}";
    write_file(idx, dup2, strlen(dup2));
    CHECK(dsp_st_open(dir, &s) != DSP_OK && strstr(dsp_last_error(), "appears in both"));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    free(s1), free(s2), free(s3);
}

static int write_seeds(const char *dir) {
    mkdir(dir, 0755);
    char path[512];
    size_t n;
    uint8_t *p = image(VALID, VALID_DATA, &n);
    snprintf(path, sizeof path, "%s/valid.safetensors", dir);
    write_file(path, p, n);
    free(p);
    for (size_t i = 0; i < N_BAD; i++) {
        p = image(g_bad[i].json, g_bad[i].data, &n);
        snprintf(path, sizeof path, "%s/bad-%02zu.safetensors", dir, i);
        write_file(path, p, n);
        free(p);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) return write_seeds(argv[2]);
    DSP_RUN(test_valid);
    DSP_RUN(test_truncations_and_flips);
    DSP_RUN(test_bad);
    DSP_RUN(test_directory);
    return dsp_test_summary();
}
