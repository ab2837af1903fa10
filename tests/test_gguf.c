/* Unit tests for io/gguf: small valid files built here in memory (v2 and v3, every metadata value
 * type, nested arrays, a few tensors) checked through every accessor, then a corpus of corrupt
 * files: every truncation, every single-bit flip of the header, and hand-made ones whose error
 * message must name the bad field. Each input is copied into a buffer of exactly its size, so
 * ASan reports any read past it. `test_gguf --write-seeds DIR` writes the valid files and the
 * hand-made corrupt ones as a fuzzing seed corpus (scripts/fuzz). */
/* ctest-label: unit */
#include "dsp_test.h"
#include "gguf_build.h"
#include "gguf_walk.h"

#include "core/dtype.h"
#include "core/quant.h"
#include "io/gguf.h"

#include <errno.h>

/* ---- the valid file ------------------------------------------------------------------------ */

enum { N_KV_BASE = 20, N_TENSORS = 3 };

/* Builds the reference file. alignment 0: no general.alignment key (default 32). The file ends
 * exactly at the end of the last tensor, so that every truncation of it is invalid. */
static buf build_valid(uint32_t version, uint32_t alignment) {
    buf b = {0};
    uint32_t align = alignment ? alignment : 32;
    hdr(&b, version, N_TENSORS, N_KV_BASE + (alignment != 0));
    key(&b, "general.architecture", DSP_GGUF_STRING), str_(&b, "llama");
    key(&b, "t.u8", DSP_GGUF_U8), u8_(&b, 200);
    key(&b, "t.i8", DSP_GGUF_I8), u8_(&b, (uint8_t)-5);
    key(&b, "t.u16", DSP_GGUF_U16), u16_(&b, 60000);
    key(&b, "t.i16", DSP_GGUF_I16), u16_(&b, (uint16_t)-30000);
    key(&b, "t.u32", DSP_GGUF_U32), u32_(&b, 4000000000u);
    key(&b, "t.i32", DSP_GGUF_I32), u32_(&b, (uint32_t)-2000000000);
    key(&b, "t.f32", DSP_GGUF_F32), f32_(&b, 1.5f);
    key(&b, "t.bool", DSP_GGUF_BOOL), u8_(&b, 1);
    key(&b, "t.u64", DSP_GGUF_U64), u64_(&b, (1ull << 40) + 3);
    key(&b, "t.i64", DSP_GGUF_I64), u64_(&b, (uint64_t)-(1ll << 40));
    key(&b, "t.f64", DSP_GGUF_F64), f64_(&b, 0.25);
    key(&b, "t.arr_u32", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_U32, 3), u32_(&b, 1), u32_(&b, 2), u32_(&b, 3);
    key(&b, "t.arr_str", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_STRING, 3), str_(&b, "a"), str_(&b, ""), str_(&b, "hello");
    key(&b, "t.arr_f32", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_F32, 2), f32_(&b, 0.5f), f32_(&b, -2.0f);
    key(&b, "t.arr_bool", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_BOOL, 2), u8_(&b, 1), u8_(&b, 0);
    key(&b, "t.arr_empty", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_I64, 0);
    /* [[1, -2], [], [7]] as i16 */
    key(&b, "t.arr_arr", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_ARRAY, 3);
    arr_hdr(&b, DSP_GGUF_I16, 2), u16_(&b, 1), u16_(&b, (uint16_t)-2);
    arr_hdr(&b, DSP_GGUF_I16, 0);
    arr_hdr(&b, DSP_GGUF_I16, 1), u16_(&b, 7);
    /* [["x", "yz"], ["w"]] */
    key(&b, "t.arr_arr_str", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_ARRAY, 2);
    arr_hdr(&b, DSP_GGUF_STRING, 2), str_(&b, "x"), str_(&b, "yz");
    arr_hdr(&b, DSP_GGUF_STRING, 1), str_(&b, "w");
    /* [[[1, 2], [3]], [[4]]] as u8 */
    key(&b, "t.arr3", DSP_GGUF_ARRAY), arr_hdr(&b, DSP_GGUF_ARRAY, 2);
    arr_hdr(&b, DSP_GGUF_ARRAY, 2);
    arr_hdr(&b, DSP_GGUF_U8, 2), u8_(&b, 1), u8_(&b, 2);
    arr_hdr(&b, DSP_GGUF_U8, 1), u8_(&b, 3);
    arr_hdr(&b, DSP_GGUF_ARRAY, 1);
    arr_hdr(&b, DSP_GGUF_U8, 1), u8_(&b, 4);
    if (alignment) key(&b, "general.alignment", DSP_GGUF_U32), u32_(&b, alignment);

    const uint64_t ne_a[2] = {4, 3}, ne_b[2] = {64, 2}, ne_c[1] = {256};
    const size_t off_b = align_up(48, align), off_c = off_b + align_up(136, align);
    tinfo(&b, "tok.weight", 2, ne_a, DSP_F32, 0);
    tinfo(&b, "blk.0.q8", 2, ne_b, DSP_Q8_0, off_b);
    tinfo(&b, "blk.0.q4k", 1, ne_c, DSP_Q4_K, off_c);
    pad_to(&b, align);
    size_t data = b.n;
    for (int i = 0; i < 12; i++) f32_(&b, 0.5f * (float)i);
    zeros(&b, data + off_b - b.n);
    for (int blk = 0; blk < 4; blk++) {
        u16_(&b, 0x3800); /* 0.5 */
        for (int j = 0; j < 32; j++) u8_(&b, (uint8_t)(j - 16));
    }
    zeros(&b, data + off_c - b.n);
    u16_(&b, 0x3c00), u16_(&b, 0x3c00);
    for (int j = 0; j < 140; j++) u8_(&b, (uint8_t)(j * 37 + 11));
    return b;
}

/* Open a copy of exactly n bytes (so ASan sees any overread). */
static dsp_status open_exact(const uint8_t *p, size_t n, dsp_gguf **g, uint8_t **copy) {
    *copy = malloc(n ? n : 1);
    if (!*copy) abort();
    if (n) memcpy(*copy, p, n);
    return dsp_gguf_open_memory(*copy, n, g);
}

static void check_valid_file(uint32_t version, uint32_t alignment) {
    buf b = build_valid(version, alignment);
    dsp_gguf *g;
    uint8_t *copy;
    dsp_status st = open_exact(b.p, b.n, &g, &copy);
    CHECK_MSG(st == DSP_OK, "v%u align %u: %s", version, alignment, dsp_last_error());
    if (st) goto out;
    uint32_t align = alignment ? alignment : 32;
    CHECK_EQ_INT(dsp_gguf_version(g), version);
    CHECK_EQ_INT(dsp_gguf_alignment(g), align);
    CHECK_EQ_INT(dsp_gguf_file_size(g), b.n);
    CHECK_EQ_INT(dsp_gguf_data_offset(g) % align, 0);
    CHECK_EQ_INT(dsp_gguf_n_kv(g), N_KV_BASE + (alignment != 0));
    CHECK_EQ_INT(dsp_gguf_n_tensors(g), N_TENSORS);
    CHECK(dsp_gguf_walk(g) != 0);

    /* scalars through the typed getters, including range and type errors */
    uint32_t u32; int32_t i32; uint64_t u64; float f; bool bo; dsp_str s;
    CHECK(!dsp_gguf_get_str(g, "general.architecture", &s) && dsp_str_eq(s, "llama"));
    CHECK(!dsp_gguf_get_u32(g, "t.u8", &u32) && u32 == 200);
    CHECK(!dsp_gguf_get_i32(g, "t.i8", &i32) && i32 == -5);
    CHECK(!dsp_gguf_get_u32(g, "t.u16", &u32) && u32 == 60000);
    CHECK(!dsp_gguf_get_i32(g, "t.i16", &i32) && i32 == -30000);
    CHECK(!dsp_gguf_get_u32(g, "t.u32", &u32) && u32 == 4000000000u);
    CHECK(!dsp_gguf_get_i32(g, "t.i32", &i32) && i32 == -2000000000);
    CHECK(!dsp_gguf_get_f32(g, "t.f32", &f) && f == 1.5f);
    CHECK(!dsp_gguf_get_bool(g, "t.bool", &bo) && bo);
    CHECK(!dsp_gguf_get_u64(g, "t.u64", &u64) && u64 == (1ull << 40) + 3);
    CHECK(!dsp_gguf_get_f32(g, "t.f64", &f) && f == 0.25f);
    CHECK(!dsp_gguf_get_f32(g, "t.i8", &f) && f == -5.0f);
    CHECK_EQ_INT(dsp_gguf_get_i32(g, "t.u32", &i32), DSP_ERR_FORMAT); /* 4e9 does not fit */
    CHECK(strstr(dsp_last_error(), "t.u32") != NULL);
    CHECK_EQ_INT(dsp_gguf_get_u32(g, "t.i8", &u32), DSP_ERR_FORMAT); /* negative */
    CHECK_EQ_INT(dsp_gguf_get_u64(g, "t.i64", &u64), DSP_ERR_FORMAT);
    CHECK_EQ_INT(dsp_gguf_get_str(g, "t.u8", &s), DSP_ERR_FORMAT);
    CHECK(strstr(dsp_last_error(), "t.u8") != NULL);
    CHECK_EQ_INT(dsp_gguf_get_u32(g, "t.arr_u32", &u32), DSP_ERR_FORMAT);
    CHECK_EQ_INT(dsp_gguf_get_bool(g, "t.u8", &bo), DSP_ERR_FORMAT);
    dsp_error_clear();
    CHECK_EQ_INT(dsp_gguf_get_u32(g, "no.such.key", &u32), DSP_ERR_NOT_FOUND);
    CHECK_EQ_STR(dsp_last_error(), ""); /* absent keys are not errors */
    CHECK(dsp_gguf_find_kv(g, "t.u") == NULL);
    CHECK(dsp_gguf_find_kv(g, "") == NULL);

    char txt[64];
    dsp_gguf_kv_format(dsp_gguf_find_kv(g, "t.i64"), txt, sizeof txt);
    CHECK_EQ_STR(txt, "-1099511627776");
    dsp_gguf_kv_format(dsp_gguf_find_kv(g, "general.architecture"), txt, sizeof txt);
    CHECK_EQ_STR(txt, "\"llama\"");
    dsp_gguf_kv_format(dsp_gguf_find_kv(g, "t.arr_str"), txt, sizeof txt);
    CHECK_EQ_STR(txt, "[array of 3 string]");
    dsp_gguf_kv_format(dsp_gguf_find_kv(g, "t.bool"), txt, sizeof txt);
    CHECK_EQ_STR(txt, "true");

    /* arrays */
    const dsp_gguf_kv *a;
    CHECK(!dsp_gguf_get_arr(g, "t.arr_u32", DSP_GGUF_U32, &a) && a->arr_n == 3 && dsp_gguf_arr_int(a, 2) == 3);
    CHECK(!dsp_gguf_get_arr(g, "t.arr_u32", DSP_GGUF_I64, &a)); /* any integer type reads ints */
    CHECK_EQ_INT(dsp_gguf_get_arr(g, "t.arr_u32", DSP_GGUF_STRING, &a), DSP_ERR_FORMAT);
    CHECK_EQ_INT(dsp_gguf_get_arr(g, "t.u8", DSP_GGUF_U8, &a), DSP_ERR_FORMAT);
    if (!dsp_gguf_get_arr(g, "t.arr_str", DSP_GGUF_STRING, &a)) {
        CHECK(dsp_str_eq(dsp_gguf_arr_str(a, 0), "a"));
        CHECK(dsp_str_eq(dsp_gguf_arr_str(a, 1), ""));
        CHECK(dsp_str_eq(dsp_gguf_arr_str(a, 2), "hello"));
    } else CHECK(0);
    CHECK(!dsp_gguf_get_arr(g, "t.arr_f32", DSP_GGUF_F32, &a) && dsp_gguf_arr_float(a, 1) == -2.0);
    CHECK(!dsp_gguf_get_arr(g, "t.arr_bool", DSP_GGUF_BOOL, &a) && dsp_gguf_arr_int(a, 0) == 1 &&
          dsp_gguf_arr_int(a, 1) == 0);
    CHECK(!dsp_gguf_get_arr(g, "t.arr_empty", DSP_GGUF_I64, &a) && a->arr_n == 0);
    if (!dsp_gguf_get_arr(g, "t.arr_arr", DSP_GGUF_ARRAY, &a)) {
        dsp_gguf_kv s0 = dsp_gguf_arr_sub(a, 0), s1 = dsp_gguf_arr_sub(a, 1), s2 = dsp_gguf_arr_sub(a, 2);
        CHECK(s0.arr_type == DSP_GGUF_I16 && s0.arr_n == 2 && dsp_gguf_arr_int(&s0, 1) == -2);
        CHECK(s1.arr_n == 0);
        CHECK(s2.arr_n == 1 && dsp_gguf_arr_int(&s2, 0) == 7);
    } else CHECK(0);
    if (!dsp_gguf_get_arr(g, "t.arr_arr_str", DSP_GGUF_ARRAY, &a)) {
        dsp_gguf_kv s0 = dsp_gguf_arr_sub(a, 0), s1 = dsp_gguf_arr_sub(a, 1);
        CHECK(s0.arr_type == DSP_GGUF_STRING && dsp_str_eq(dsp_gguf_arr_str(&s0, 1), "yz"));
        CHECK(s1.arr_n == 1 && dsp_str_eq(dsp_gguf_arr_str(&s1, 0), "w"));
    } else CHECK(0);
    if (!dsp_gguf_get_arr(g, "t.arr3", DSP_GGUF_ARRAY, &a)) {
        dsp_gguf_kv s0 = dsp_gguf_arr_sub(a, 0), s1 = dsp_gguf_arr_sub(a, 1);
        dsp_gguf_kv s01 = dsp_gguf_arr_sub(&s0, 1), s10 = dsp_gguf_arr_sub(&s1, 0); /* depth 2 */
        CHECK(s01.arr_type == DSP_GGUF_U8 && s01.arr_n == 1 && dsp_gguf_arr_int(&s01, 0) == 3);
        CHECK(s10.arr_n == 1 && dsp_gguf_arr_int(&s10, 0) == 4);
    } else CHECK(0);

    /* tensors */
    const dsp_gguf_tensor *t = dsp_gguf_find_tensor(g, "tok.weight");
    CHECK(t && t == dsp_gguf_tensor_at(g, 0));
    if (t) {
        CHECK(t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 1 && t->ne[3] == 1);
        CHECK(t->type == DSP_F32 && t->n_elems == 12 && t->nbytes == 48 && t->offset == 0);
        CHECK((const uint8_t *)t->data == copy + dsp_gguf_data_offset(g));
        float v;
        memcpy(&v, (const uint8_t *)t->data + 11 * 4, 4);
        CHECK(v == 5.5f);
    }
    t = dsp_gguf_find_tensor(g, "blk.0.q8");
    CHECK(t && t->type == DSP_Q8_0 && t->nbytes == 136 && t->offset % align == 0);
    if (t) {
        float y[128];
        CHECK(dsp_dequantize_row(t->type, t->data, y, t->n_elems) == DSP_OK);
        CHECK(y[0] == -8.0f && y[31] == 7.5f && y[127] == 7.5f);
    }
    t = dsp_gguf_find_tensor(g, "blk.0.q4k");
    CHECK(t && t->type == DSP_Q4_K && t->n_dims == 1 && t->nbytes == 144 &&
          (const uint8_t *)t->data + t->nbytes == copy + b.n);
    CHECK(dsp_gguf_find_tensor(g, "blk.0") == NULL);
    dsp_gguf_destroy(g);
out:
    free(copy);
    free(b.p);
}

static void test_valid_files(void) {
    check_valid_file(3, 0);
    check_valid_file(2, 0);
    check_valid_file(3, 64);
    check_valid_file(2, 8);
    check_valid_file(3, 1);

    /* the smallest valid file: no metadata, no tensors */
    buf b = {0};
    hdr(&b, 3, 0, 0);
    dsp_gguf *g;
    uint8_t *copy;
    CHECK(open_exact(b.p, b.n, &g, &copy) == DSP_OK);
    if (g) CHECK(dsp_gguf_n_kv(g) == 0 && dsp_gguf_n_tensors(g) == 0 && dsp_gguf_walk(g) + 1 > 0);
    dsp_gguf_destroy(g);
    free(copy);
    free(b.p);
}

/* ---- corruption ----------------------------------------------------------------------------- */

static void test_truncations(void) {
    int opened = 0, no_msg = 0;
    for (uint32_t align = 0; align <= 64; align += 64) {
        buf b = build_valid(3, align);
        for (size_t len = 0; len < b.n; len++) {
            dsp_gguf *g;
            uint8_t *copy;
            dsp_error_clear();
            dsp_status st = open_exact(b.p, len, &g, &copy);
            if (st == DSP_OK) opened++, dsp_gguf_destroy(g);
            else if (!dsp_last_error()[0] || g != NULL) no_msg++;
            free(copy);
        }
        free(b.p);
    }
    CHECK_EQ_INT(opened, 0);
    CHECK_EQ_INT(no_msg, 0);
}

/* Every single-bit flip of the header (everything before the tensor data). Some flips leave a
 * valid file (a bit in a string's text, in a value, in a tensor's data-range-preserving field);
 * those must open and be safe to walk. All others must fail with a message. */
static void test_bit_flips(void) {
    buf b = build_valid(3, 0);
    dsp_gguf *g;
    uint8_t *copy;
    CHECK(open_exact(b.p, b.n, &g, &copy) == DSP_OK);
    size_t header = g ? (size_t)dsp_gguf_data_offset(g) : 0;
    dsp_gguf_destroy(g);
    free(copy);
    int failed = 0, opened = 0, no_msg = 0;
    for (size_t i = 0; i < header; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b.p[i] ^= (uint8_t)(1u << bit);
            dsp_error_clear();
            dsp_status st = open_exact(b.p, b.n, &g, &copy);
            if (st == DSP_OK) {
                opened++;
                (void)dsp_gguf_walk(g);
                dsp_gguf_destroy(g);
            } else {
                failed++;
                if (!dsp_last_error()[0] || g != NULL) no_msg++;
            }
            free(copy);
            b.p[i] ^= (uint8_t)(1u << bit);
        }
    }
    fprintf(stderr, "  bit flips of %zu header bytes: %d rejected, %d still valid\n", header, failed, opened);
    CHECK_EQ_INT(no_msg, 0);
    CHECK(failed > opened); /* most flips of structure must be caught */
    free(b.p);
}

/* Hand-made corrupt files: each must fail with `want` and a message containing `field`. */
typedef struct {
    const char *label;
    dsp_status want;
    const char *field;
    buf b;
} bad_case;

#define MAX_CASES 64
static bad_case g_cases[MAX_CASES];
static int g_ncases;

static buf *new_case(const char *label, dsp_status want, const char *field) {
    if (g_ncases == MAX_CASES) abort();
    bad_case *c = &g_cases[g_ncases++];
    c->label = label, c->want = want, c->field = field;
    memset(&c->b, 0, sizeof c->b);
    return &c->b;
}

/* a one-tensor file: header + tensor info + data of `data_bytes` */
static void one_tensor(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off,
                       size_t data_bytes) {
    hdr(b, 3, 1, 0);
    tinfo(b, name, n_dims, ne, type, off);
    pad_to(b, 32);
    zeros(b, data_bytes);
}

static void build_bad_cases(void) {
    buf *b;
    const uint64_t ne1[1] = {32}, ne5[5] = {1, 1, 1, 1, 1};

    b = new_case("short file", DSP_ERR_FORMAT, "magic"), put(b, "GGU", 3);
    b = new_case("bad magic", DSP_ERR_FORMAT, "magic"), hdr(b, 3, 0, 0), b->p[0] = 'X';
    b = new_case("version 1", DSP_ERR_UNSUPPORTED, "version 1"), hdr(b, 1, 0, 0);
    b = new_case("version 4", DSP_ERR_UNSUPPORTED, "version 4"), hdr(b, 4, 0, 0);
    b = new_case("big-endian", DSP_ERR_UNSUPPORTED, "big-endian"), hdr(b, 0x03000000u, 0, 0);
    b = new_case("truncated counts", DSP_ERR_FORMAT, "header tensor count"), put(b, "GGUF\3\0\0\0\0", 9);
    b = new_case("huge n_kv", DSP_ERR_FORMAT, "metadata count"), hdr(b, 3, 0, 1ull << 62), zeros(b, 64);
    b = new_case("huge n_tensors", DSP_ERR_FORMAT, "tensor count"), hdr(b, 3, UINT64_MAX, 0), zeros(b, 64);
    b = new_case("key length past EOF", DSP_ERR_FORMAT, "metadata entry 0 key");
    hdr(b, 3, 0, 1), u64_(b, 1000), put(b, "abcdefghijklmnop", 16);
    b = new_case("key length huge", DSP_ERR_FORMAT, "metadata entry 0 key");
    hdr(b, 3, 0, 1), u64_(b, UINT64_MAX), put(b, "abcdefghijklmnop", 16);
    b = new_case("empty key", DSP_ERR_FORMAT, "empty key"), hdr(b, 3, 0, 1), key(b, "", DSP_GGUF_U8), u8_(b, 0), zeros(b, 8);
    b = new_case("key with NUL", DSP_ERR_FORMAT, "NUL"), hdr(b, 3, 0, 1), u64_(b, 3), put(b, "a\0b", 3);
    u32_(b, DSP_GGUF_U8), u8_(b, 0);
    b = new_case("string value past EOF", DSP_ERR_FORMAT, "k.str");
    hdr(b, 3, 0, 1), key(b, "k.str", DSP_GGUF_STRING), u64_(b, 1ull << 40), put(b, "xy", 2);
    b = new_case("unknown value type", DSP_ERR_FORMAT, "unknown value type 13");
    hdr(b, 3, 0, 1), key(b, "k.t", 13), u64_(b, 0);
    b = new_case("value type huge", DSP_ERR_FORMAT, "k.t");
    hdr(b, 3, 0, 1), key(b, "k.t", 0x80000000u), u64_(b, 0);
    b = new_case("truncated u64 value", DSP_ERR_FORMAT, "k.u64");
    hdr(b, 3, 0, 1), key(b, "k.u64", DSP_GGUF_U64), u32_(b, 7);
    b = new_case("bool value 2", DSP_ERR_FORMAT, "bool value 2"), hdr(b, 3, 0, 1), key(b, "k.b", DSP_GGUF_BOOL), u8_(b, 2);
    b = new_case("bool element 5", DSP_ERR_FORMAT, "bool element 1");
    hdr(b, 3, 0, 1), key(b, "k.ab", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_BOOL, 2), u8_(b, 0), u8_(b, 5);
    b = new_case("array count huge", DSP_ERR_FORMAT, "k.arr");
    hdr(b, 3, 0, 1), key(b, "k.arr", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_U32, 1ull << 61), zeros(b, 16);
    b = new_case("array count past EOF", DSP_ERR_FORMAT, "k.arr");
    hdr(b, 3, 0, 1), key(b, "k.arr", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_U64, 3), zeros(b, 16);
    b = new_case("string array count huge", DSP_ERR_FORMAT, "k.as");
    hdr(b, 3, 0, 1), key(b, "k.as", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_STRING, UINT64_MAX), zeros(b, 16);
    b = new_case("string element past EOF", DSP_ERR_FORMAT, "k.as");
    hdr(b, 3, 0, 1), key(b, "k.as", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_STRING, 2), str_(b, "ok"), u64_(b, 99), put(b, "short", 5);
    b = new_case("unknown array element type", DSP_ERR_FORMAT, "unknown element type 13");
    hdr(b, 3, 0, 1), key(b, "k.a", DSP_GGUF_ARRAY), arr_hdr(b, 13, 1), zeros(b, 8);
    b = new_case("nested unknown element type", DSP_ERR_FORMAT, "k.n");
    hdr(b, 3, 0, 1), key(b, "k.n", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_ARRAY, 1), arr_hdr(b, 200, 1), zeros(b, 8);
    b = new_case("nested count huge", DSP_ERR_FORMAT, "k.n");
    hdr(b, 3, 0, 1), key(b, "k.n", DSP_GGUF_ARRAY), arr_hdr(b, DSP_GGUF_ARRAY, 1), arr_hdr(b, DSP_GGUF_STRING, 1ull << 60),
        zeros(b, 8);
    b = new_case("nesting too deep", DSP_ERR_FORMAT, "nested deeper");
    hdr(b, 3, 0, 1), key(b, "k.deep", DSP_GGUF_ARRAY);
    for (int d = 0; d < 12; d++) arr_hdr(b, DSP_GGUF_ARRAY, 1);
    arr_hdr(b, DSP_GGUF_U8, 0);
    b = new_case("duplicate key", DSP_ERR_FORMAT, "'k.dup' appears twice");
    hdr(b, 3, 0, 2), key(b, "k.dup", DSP_GGUF_U8), u8_(b, 1), key(b, "k.dup", DSP_GGUF_U32), u32_(b, 2);
    b = new_case("alignment 0", DSP_ERR_FORMAT, "general.alignment");
    hdr(b, 3, 0, 1), key(b, "general.alignment", DSP_GGUF_U32), u32_(b, 0);
    b = new_case("alignment 3", DSP_ERR_FORMAT, "general.alignment");
    hdr(b, 3, 0, 1), key(b, "general.alignment", DSP_GGUF_U32), u32_(b, 3);
    b = new_case("alignment 48", DSP_ERR_FORMAT, "general.alignment");
    hdr(b, 3, 0, 1), key(b, "general.alignment", DSP_GGUF_U32), u32_(b, 48);
    b = new_case("alignment as u64", DSP_ERR_FORMAT, "general.alignment");
    hdr(b, 3, 0, 1), key(b, "general.alignment", DSP_GGUF_U64), u64_(b, 32);

    b = new_case("tensor name past EOF", DSP_ERR_FORMAT, "tensor 0 name"), hdr(b, 3, 1, 0), u64_(b, 500), zeros(b, 40);
    b = new_case("empty tensor name", DSP_ERR_FORMAT, "tensor 0: empty name");
    one_tensor(b, "", 1, ne1, DSP_F32, 0, 128);
    b = new_case("n_dims 0", DSP_ERR_FORMAT, "'t0': 0 dimensions"), one_tensor(b, "t0", 0, ne1, DSP_F32, 0, 128);
    b = new_case("n_dims 5", DSP_ERR_FORMAT, "'t0': 5 dimensions"), one_tensor(b, "t0", 5, ne5, DSP_F32, 0, 128);
    b = new_case("n_dims huge", DSP_ERR_FORMAT, "dimensions"), hdr(b, 3, 1, 0), str_(b, "t0"), u32_(b, 0xffffffffu), zeros(b, 64);
    const uint64_t ne_zero[2] = {4, 0}, ne_ovf[2] = {1ull << 32, 1ull << 32}, ne_ovf4[4] = {1u << 16, 1u << 16, 1u << 16, 1u << 16};
    b = new_case("zero dimension", DSP_ERR_FORMAT, "'t0': dimension 1 is zero"), one_tensor(b, "t0", 2, ne_zero, DSP_F32, 0, 64);
    b = new_case("element count overflow", DSP_ERR_FORMAT, "'t0': element count overflows");
    one_tensor(b, "t0", 2, ne_ovf, DSP_F32, 0, 64);
    b = new_case("element count overflow (4 dims)", DSP_ERR_FORMAT, "'t0': element count overflows");
    one_tensor(b, "t0", 4, ne_ovf4, DSP_F16, 0, 64);
    const uint64_t ne_bytes[1] = {1ull << 62}, ne_bytes2[2] = {1ull << 31, 1ull << 31};
    b = new_case("byte size overflow (row)", DSP_ERR_FORMAT, "'t0': byte size overflows");
    one_tensor(b, "t0", 1, ne_bytes, DSP_F32, 0, 64);
    b = new_case("byte size overflow (rows)", DSP_ERR_FORMAT, "'t0': byte size overflows");
    one_tensor(b, "t0", 2, ne_bytes2, DSP_F64, 0, 64);
    b = new_case("unknown type id 4", DSP_ERR_FORMAT, "'t0': unknown tensor type id 4"), one_tensor(b, "t0", 1, ne1, 4, 0, 128);
    b = new_case("unknown type id 40", DSP_ERR_FORMAT, "'t0': unknown tensor type id 40"), one_tensor(b, "t0", 1, ne1, 40, 0, 128);
    b = new_case("unknown type id huge", DSP_ERR_FORMAT, "unknown tensor type id 4294967295");
    one_tensor(b, "t0", 1, ne1, UINT32_MAX, 0, 128);
    const uint64_t ne100[1] = {100};
    b = new_case("partial block", DSP_ERR_FORMAT, "'t0': row length 100"), one_tensor(b, "t0", 1, ne100, DSP_Q4_K, 0, 256);
    b = new_case("offset past EOF", DSP_ERR_FORMAT, "'t0': data ends at"), one_tensor(b, "t0", 1, ne1, DSP_F32, 1ull << 40, 128);
    b = new_case("offset huge", DSP_ERR_FORMAT, "'t0': data ends at"), one_tensor(b, "t0", 1, ne1, DSP_F32, UINT64_MAX - 31, 128);
    b = new_case("data one byte short", DSP_ERR_FORMAT, "past end of file"), one_tensor(b, "t0", 1, ne1, DSP_F32, 0, 127);
    b = new_case("misaligned offset", DSP_ERR_FORMAT, "'t0': data offset 8 is not a multiple of the alignment 32");
    one_tensor(b, "t0", 1, ne1, DSP_F32, 8, 256);
    b = new_case("duplicate tensor name", DSP_ERR_FORMAT, "'t.dup' appears twice");
    hdr(b, 3, 2, 0), tinfo(b, "t.dup", 1, ne1, DSP_F32, 0), tinfo(b, "t.dup", 1, ne1, DSP_F32, 128), pad_to(b, 32), zeros(b, 256);
    b = new_case("overlapping tensors", DSP_ERR_FORMAT, "overlaps tensor 'a'");
    hdr(b, 3, 2, 0), tinfo(b, "a", 1, ne1, DSP_F32, 0), tinfo(b, "b", 1, ne1, DSP_F32, 64), pad_to(b, 32), zeros(b, 256);
    const uint64_t ne_big[1] = {256}, ne_small[1] = {8};
    b = new_case("tensor inside another", DSP_ERR_FORMAT, "overlaps tensor 'big'");
    hdr(b, 3, 3, 0), tinfo(b, "big", 1, ne_big, DSP_F32, 0), tinfo(b, "late", 1, ne_small, DSP_F32, 1024),
        tinfo(b, "inner", 1, ne_small, DSP_F32, 512), pad_to(b, 32), zeros(b, 1056);
    b = new_case("same offset", DSP_ERR_FORMAT, "overlaps");
    hdr(b, 3, 2, 0), tinfo(b, "a", 1, ne1, DSP_F32, 128), tinfo(b, "b", 1, ne1, DSP_F32, 128), pad_to(b, 32), zeros(b, 256);
}

static void test_bad_files(void) {
    build_bad_cases();
    for (int i = 0; i < g_ncases; i++) {
        bad_case *c = &g_cases[i];
        dsp_gguf *g;
        uint8_t *copy;
        dsp_error_clear();
        dsp_status st = open_exact(c->b.p, c->b.n, &g, &copy);
        const char *msg = dsp_last_error();
        CHECK_MSG(st == c->want && g == NULL, "%s: status %s, want %s (%s)", c->label, dsp_status_to_string(st),
                  dsp_status_to_string(c->want), msg);
        CHECK_MSG(strstr(msg, c->field) != NULL, "%s: message \"%s\" does not name \"%s\"", c->label, msg, c->field);
        if (g) dsp_gguf_destroy(g);
        free(copy);
    }
    /* the two tensors of "overlapping tensors" are fine when apart: the case tests only overlap */
    buf b = {0};
    hdr(&b, 3, 2, 0);
    const uint64_t ne1[1] = {32};
    tinfo(&b, "a", 1, ne1, DSP_F32, 128), tinfo(&b, "b", 1, ne1, DSP_F32, 0), pad_to(&b, 32), zeros(&b, 256);
    dsp_gguf *g;
    uint8_t *copy;
    CHECK_MSG(open_exact(b.p, b.n, &g, &copy) == DSP_OK, "%s", dsp_last_error());
    dsp_gguf_destroy(g);
    free(copy);
    free(b.p);
}

static void test_open_file_errors(void) {
    dsp_gguf *g = (dsp_gguf *)&g;
    CHECK_EQ_INT(dsp_gguf_open("/nonexistent/x.gguf", &g), DSP_ERR_IO);
    CHECK(g == NULL && strstr(dsp_last_error(), "/nonexistent/x.gguf") != NULL);
    CHECK_EQ_INT(dsp_gguf_open("/", &g), DSP_ERR_IO);
}

static void free_cases(void) {
    for (int i = 0; i < g_ncases; i++) free(g_cases[i].b.p);
    g_ncases = 0;
}

/* --write-seeds DIR: the valid files and the hand-made corrupt ones, for scripts/fuzz */
/* a model small enough for the fuzzer's length limit (4 KiB): 1 layer, width 8, 2 heads of 4 */
static buf build_model_seed(const char *arch) {
    static gb_model m;
    gb_model_init(&m, arch);
    m.hp[GB_EMBD] = 8, m.hp[GB_LAYERS] = 1, m.hp[GB_HEADS] = 2, m.hp[GB_HEADS_KV] = 1, m.hp[GB_FF] = 8;
    m.n_vocab = 4;
    gb_model_tensors(&m);
    return gb_model_write(&m, 1 << 20);
}

static int write_seeds(const char *dir) {
    char path[4096];
    int n = 0;
    enum { N_VALID = 6 };
    buf valid[N_VALID] = {build_valid(3, 0), build_valid(2, 64), build_valid(3, 1),
                          build_model_seed("llama"), build_model_seed("qwen2"), build_model_seed("qwen3")};
    build_bad_cases();
    for (int i = 0; i < N_VALID + g_ncases; i++) {
        const buf *b = i < N_VALID ? &valid[i] : &g_cases[i - N_VALID].b;
        snprintf(path, sizeof path, "%s/seed-%03d.gguf", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f) != 0) {
            fprintf(stderr, "test_gguf: cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        n++;
    }
    for (int i = 0; i < N_VALID; i++) free(valid[i].p);
    free_cases();
    fprintf(stderr, "test_gguf: wrote %d seeds to %s\n", n, dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) return write_seeds(argv[2]);
    DSP_RUN(test_valid_files);
    DSP_RUN(test_truncations);
    DSP_RUN(test_bit_flips);
    DSP_RUN(test_bad_files);
    DSP_RUN(test_open_file_errors);
    fprintf(stderr, "  %d hand-made corrupt files\n", g_ncases);
    free_cases();
    return dsp_test_summary();
}
