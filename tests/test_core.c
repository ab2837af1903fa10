/* Unit tests for core/: status messages, arena, dtype table, f16/bf16 conversion, UTF-8, files. */
#include "dsp_test.h"

#include "core/arena.h"
#include "core/dtype.h"
#include "core/file.h"
#include "core/status.h"
#include "core/utf8.h"
#include "core/threads.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <math.h>
#include <stdio.h>
#include <unistd.h>

static void test_status(void) {
    CHECK_EQ_INT(dsp_error(DSP_ERR_FORMAT, "tensor '%s': bad", "x"), DSP_ERR_FORMAT);
    CHECK_EQ_STR(dsp_last_error(), "tensor 'x': bad");
    dsp_error_prefix("file %s", "a.gguf");
    CHECK_EQ_STR(dsp_last_error(), "file a.gguf: tensor 'x': bad");
    CHECK_EQ_STR(dsp_status_to_string(DSP_ERR_NOT_FOUND), "not found");
}

static void test_arena(void) {
    dsp_arena a;
    dsp_arena_init(&a, 64, 1000);
    char *p = dsp_arena_alloc(&a, 10);
    CHECK(p && ((uintptr_t)p & 15) == 0);
    char *q = dsp_arena_alloc(&a, 100); /* larger than a chunk */
    CHECK(q != NULL);
    CHECK(dsp_arena_alloc(&a, 2000) == NULL); /* over the cap */
    CHECK(dsp_arena_alloc(&a, SIZE_MAX) == NULL);
    char *s = dsp_arena_strndup(&a, "hello", 3);
    CHECK_EQ_STR(s, "hel");
    dsp_arena_destroy(&a);
}

static void test_dtype(void) {
    CHECK_EQ_INT(dsp_dtype_get(DSP_Q4_K)->block_bytes, 144);
    CHECK(dsp_dtype_get(4) == NULL); /* retired id */
    CHECK(dsp_dtype_get(1000) == NULL);
    CHECK_EQ_INT(dsp_dtype_row_bytes(DSP_Q8_0, 64), 68);
    CHECK_EQ_INT(dsp_dtype_row_bytes(DSP_Q8_0, 33), 0);
}

static void test_f16(void) {
    /* every half value round-trips exactly through float */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dsp_f16_to_f32((uint16_t)h);
        uint16_t back = dsp_f32_to_f16(f);
        int is_nan = ((h >> 10) & 0x1f) == 31 && (h & 0x3ff);
        if (!is_nan && back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(dsp_f16_to_f32(0x3c00) == 1.0f);
    CHECK(dsp_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(dsp_f32_to_f16(65520.0f) == 0x7c00);       /* rounds to inf */
    CHECK(dsp_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00); /* tie to even */
    CHECK(dsp_bf16_to_f32(0x3f80) == 1.0f);
}

/* ---- the worker pool: every task of every run exactly once, whatever the threads, the spin
 * budget (sleeping workers, adaptive spinning) and the gaps between runs ---- */

typedef struct pool_job {
    atomic_int *hits; /* per task */
    atomic_int bad_thread;
    int n_threads;
} pool_job;

static void pool_task(void *ctx, int task, int thread) {
    pool_job *j = ctx;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread < 0 || thread >= j->n_threads) atomic_fetch_add(&j->bad_thread, 1);
}

static void pause_us(long us) {
    struct timespec t = {0, us * 1000};
    nanosleep(&t, NULL);
}

static void test_pool(void) {
    static const char *const spins[] = {"0", "50", NULL}; /* sleep at once; short spin; the default */
    static atomic_int hits[1000];
    for (int si = 0; si < 3; si++) {
        if (spins[si]) setenv("DSP_POOL_SPIN_US", spins[si], 1);
        else unsetenv("DSP_POOL_SPIN_US");
        for (int nt = 1; nt <= 4; nt++) {
            dsp_pool *p = NULL;
            CHECK(dsp_pool_create(nt, &p) == DSP_OK);
            if (!p) continue;
            CHECK_EQ_INT(dsp_pool_size(p), nt);
            int bad = 0;
            for (int run = 0; run < 200; run++) {
                const int n_tasks = run % 7 == 0 ? 1 : 1 + (run * 37) % 1000;
                for (int t = 0; t < n_tasks; t++) atomic_store(&hits[t], 0);
                pool_job j = {hits, 0, nt};
                dsp_pool_run(p, n_tasks, pool_task, &j);
                for (int t = 0; t < n_tasks; t++) bad += atomic_load(&hits[t]) != 1;
                bad += atomic_load(&j.bad_thread);
                if (run % 50 == 49) pause_us(2000); /* let workers exhaust their spin and sleep */
            }
            CHECK_MSG(!bad, "pool of %d threads (spin %s): %d tasks ran other than once", nt, spins[si] ? spins[si] : "default", bad);
            dsp_pool_run(p, 0, pool_task, NULL); /* no tasks: nothing runs */
            dsp_pool_destroy(p);
        }
    }
    unsetenv("DSP_POOL_SPIN_US");
    dsp_pool *p = NULL;
    CHECK(dsp_pool_create(0, &p) != DSP_OK && !p); /* bad sizes are errors */
    CHECK(dsp_pool_create(1025, &p) != DSP_OK && !p);
    CHECK(dsp_physical_cores() >= 1);
}

/* The RFC 3629 definition, written out independently of core/utf8.c: decode the bits the lead
 * byte announces, then check continuation bytes, the shortest form, surrogates and the range. */
static size_t ref_seq(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n) return 0;
    uint32_t cp = len == 1 ? c : c & (0xFFu >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] >> 6) != 2) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static bool ref_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0, l; i < n; i += l)
        if (!(l = ref_seq(s + i, n - i))) return false;
    return true;
}

static void test_utf8_strict(void) {
    /* every 1-, 2- and 3-byte string, and 4-byte ones (the last byte a continuation byte or not) */
    int bad = 0;
    uint8_t b[4];
    for (uint32_t x = 0; x < (1u << 24); x++) {
        b[0] = (uint8_t)(x >> 16), b[1] = (uint8_t)(x >> 8), b[2] = (uint8_t)x;
        b[3] = (x & 1) ? 0x7F : 0x80;
        for (size_t n = 1; n <= 4; n++) {
            if ((n == 1 && (x & 0xFFFF)) || (n == 2 && (x & 0xFF))) continue; /* seen already */
            size_t want = ref_seq(b, n), got = dsp_utf8_seq(b, n);
            bool vwant = ref_valid(b, n), vgot = dsp_utf8_valid(b, n);
            if (want != got || vwant != vgot) {
                if (bad++ < 5)
                    fprintf(stderr, "%02x %02x %02x %02x n=%zu: seq %zu (want %zu), valid %d (want %d)\n",
                            b[0], b[1], b[2], b[3], n, got, want, vgot, vwant);
            }
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* named cases: overlongs, surrogates, above U+10FFFF, truncation, stray continuation bytes */
    const struct { const char *s; size_t seq; } cases[] = {
        {"A", 1}, {"\xC3\xA9", 2}, {"\xE2\x82\xAC", 3}, {"\xF0\x9F\x99\x82", 4}, {"\xF4\x8F\xBF\xBF", 4},
        {"\xC0\xAF", 0}, {"\xC1\xBF", 0}, {"\xE0\x80\xAF", 0}, {"\xE0\x9F\xBF", 0}, {"\xF0\x8F\xBF\xBF", 0},
        {"\xED\xA0\x80", 0}, {"\xED\xBF\xBF", 0}, {"\xED\x9F\xBF", 3}, {"\xEE\x80\x80", 3},
        {"\xF4\x90\x80\x80", 0}, {"\xF5\x80\x80\x80", 0}, {"\xFF", 0}, {"\x80", 0}, {"\xBF", 0},
        {"\xE2\x82", 0}, {"\xF0\x9F\x99", 0}, {"\xC3", 0}, {"\xE2\x28\xA1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].s);
        CHECK_MSG(dsp_utf8_seq(cases[i].s, n) == cases[i].seq, "case %zu", i);
        CHECK_MSG(dsp_utf8_valid(cases[i].s, n) == (cases[i].seq == n), "case %zu", i);
    }
    CHECK(dsp_utf8_seq("", 0) == 0);
    CHECK(dsp_utf8_valid("", 0));
    CHECK(!dsp_utf8_valid("ab\xC3", 3));    /* truncated at the end */
    CHECK(!dsp_utf8_valid("a\xC3" "b", 3)); /* bad continuation */
}

static void test_utf8_codec(void) {
    /* encode -> decode -> seq round trip over every scalar value */
    int bad = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char o[4];
        size_t l = dsp_utf8_encode(cp, o), dl = 0;
        size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (l != want || dsp_utf8_len((uint8_t)o[0]) != l || dsp_utf8_seq(o, l) != l ||
            dsp_utf8_decode(o, l, &dl) != cp || dl != l || dsp_utf8_count(o, l) != 1 || dsp_utf8_prev(o, l) != 0)
            bad++;
        if (l > 1 && dsp_utf8_decode(o, l - 1, &dl) != DSP_UTF8_BAD) bad++; /* truncated */
    }
    CHECK_EQ_INT(bad, 0);
    size_t dl = 9;
    CHECK(dsp_utf8_decode("", 0, &dl) == DSP_UTF8_BAD && dl == 0);
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x99\x82z"; /* a é € 🙂 z */
    size_t n = strlen(s);
    CHECK_EQ_INT(dsp_utf8_count(s, n), 5);
    CHECK_EQ_INT(dsp_utf8_prev(s, n), n - 1);
    CHECK_EQ_INT(dsp_utf8_prev(s, n - 1), 6);
    CHECK_EQ_INT(dsp_utf8_prev(s, 6), 3);
    CHECK_EQ_INT(dsp_utf8_prev(s, 3), 1);
    CHECK_EQ_INT(dsp_utf8_prev(s, 1), 0);
    CHECK_EQ_INT(dsp_utf8_prev(s, 0), 0);
    CHECK_EQ_INT(dsp_utf8_prev("\x80\x80", 2), 0); /* only continuation bytes: stays in bounds */
}

static void test_utf8_lossy(void) {
    struct {
        const char *in;
        size_t n;
        const char *out;
    } cases[] = {
        {"abc", 3, "abc"},
        {"\xE6\x97", 2, "\xEF\xBF\xBD"},
        {"\xE6\x97" "a", 3, "\xEF\xBF\xBD" "a"},
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: 3 replacements, like Python */
        {"\xF0\x9F\xA6\x99", 4, "\xF0\x9F\xA6\x99"},
        {"\xF0\x9F\xA6", 3, "\xEF\xBF\xBD"},
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xE2\x28\xA1", 3, "\xEF\xBF\xBD(\xEF\xBF\xBD"},
        {"\xFF", 1, "\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t out[64];
        dsp_utf8_state st;
        memset(&st, 0, sizeof st);
        size_t o = dsp_utf8_feed(&st, (const uint8_t *)cases[i].in, cases[i].n, out);
        o += dsp_utf8_finish(&st, out + o);
        out[o] = 0;
        CHECK_MSG(!strcmp((char *)out, cases[i].out), "case %zu", i);
        /* byte at a time gives the same */
        memset(&st, 0, sizeof st);
        size_t o2 = 0;
        uint8_t out2[64];
        for (size_t k = 0; k < cases[i].n; k++) o2 += dsp_utf8_feed(&st, (const uint8_t *)cases[i].in + k, 1, out2 + o2);
        o2 += dsp_utf8_finish(&st, out2 + o2);
        CHECK(o2 == o && !memcmp(out, out2, o));
        CHECK_EQ_INT(dsp_utf8_valid((const uint8_t *)cases[i].in, cases[i].n), !strcmp(cases[i].in, cases[i].out));
    }
}

static void test_utf8_sanitize(void) {
    size_t n = 0;
    char *t = dsp_utf8_sanitize("a\xE2\x82" "b\xFF", 5, &n);
    CHECK(t && n == 8 && !memcmp(t, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8) && t[n] == 0);
    free(t);
    t = dsp_utf8_sanitize("", 0, &n);
    CHECK(t && n == 0 && t[0] == 0);
    free(t);
}

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void test_file_read(void) {
    char path[] = "/tmp/dsp_test_core_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    char *buf = NULL;
    size_t len = 99;
    /* empty file */
    CHECK_EQ_INT(dsp_file_read(path, 10, &buf, &len), DSP_OK);
    CHECK(buf && len == 0 && buf[0] == 0);
    free(buf);
    /* data with a NUL, exactly at the limit */
    write_file(path, "ab\0cd", 5);
    CHECK_EQ_INT(dsp_file_read(path, 5, &buf, &len), DSP_OK);
    CHECK(buf && len == 5 && !memcmp(buf, "ab\0cd", 6));
    free(buf);
    /* one byte over the limit */
    CHECK_EQ_INT(dsp_file_read(path, 4, &buf, &len), DSP_ERR_RANGE);
    CHECK(buf == NULL && len == 0);
    CHECK(strstr(dsp_last_error(), path) && strstr(dsp_last_error(), "larger than 4 bytes"));
    /* larger than the first buffer: grows */
    size_t big = 100000;
    char *data = malloc(big);
    for (size_t i = 0; i < big; i++) data[i] = (char)('a' + i % 26);
    write_file(path, data, big);
    CHECK_EQ_INT(dsp_file_read(path, big, &buf, NULL), DSP_OK);
    CHECK(buf && !memcmp(buf, data, big) && buf[big] == 0);
    free(buf);
    CHECK_EQ_INT(dsp_file_read(path, big - 1, &buf, NULL), DSP_ERR_RANGE);
    /* "-" reads standard input (here: a pipe) */
    int p[2];
    CHECK(pipe(p) == 0);
    int saved = dup(0);
    CHECK(write(p[1], "piped", 5) == 5);
    close(p[1]);
    dup2(p[0], 0);
    close(p[0]);
    clearerr(stdin);
    CHECK_EQ_INT(dsp_file_read("-", 100, &buf, &len), DSP_OK);
    CHECK(buf && len == 5 && !strcmp(buf, "piped"));
    free(buf);
    dup2(saved, 0);
    close(saved);
    clearerr(stdin);
    free(data);
    /* a missing file names the path and the reason */
    unlink(path);
    CHECK_EQ_INT(dsp_file_read(path, 10, &buf, &len), DSP_ERR_IO);
    CHECK(buf == NULL && strstr(dsp_last_error(), path) && strstr(dsp_last_error(), "No such file"));
    CHECK_EQ_INT(dsp_file_read("/", 10, &buf, &len), DSP_ERR_IO); /* a directory: read error */
}

/* dsp_file_drop_pages: the pages of a mapped file come back unchanged after being given up; heap
 * memory and ranges outside a mapping are left alone (MADV_DONTNEED would zero heap pages) */
static void test_file_drop_pages(void) {
    char path[] = "/tmp/dsp_test_drop_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const size_t n = 5 * 4096 + 123;
    uint8_t *want = malloc(n);
    for (size_t i = 0; i < n; i++) want[i] = (uint8_t)(i * 131 + 7);
    CHECK(write(fd, want, n) == (ssize_t)n);
    close(fd);
    dsp_file_map m;
    CHECK_EQ_INT(dsp_file_map_open(path, &m), DSP_OK);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += m.data[i]; /* fault everything in */
    CHECK(sum > 0);
    CHECK(dsp_file_drop_pages(m.data + 100, n - 200)); /* whole pages inside: given back */
    CHECK(!memcmp(m.data, want, n));                    /* and read back unchanged */
    CHECK(!dsp_file_drop_pages(m.data + 100, n));       /* past the mapping's end: refused */
    uint8_t *heap = malloc(3 * 4096);
    memset(heap, 0x5a, 3 * 4096);
    CHECK(!dsp_file_drop_pages(heap, 3 * 4096)); /* not a file mapping: left alone */
    CHECK(heap[4096 + 17] == 0x5a);
    dsp_file_map_close(&m);
    uint8_t *again = malloc(n); /* a closed mapping is forgotten */
    CHECK(!dsp_file_drop_pages(again, 1));
    free(again), free(heap), free(want);
    unlink(path);
}

int main(void) {
    DSP_RUN(test_status);
    DSP_RUN(test_pool);
    DSP_RUN(test_arena);
    DSP_RUN(test_dtype);
    DSP_RUN(test_f16);
    DSP_RUN(test_utf8_strict);
    DSP_RUN(test_utf8_codec);
    DSP_RUN(test_utf8_lossy);
    DSP_RUN(test_utf8_sanitize);
    DSP_RUN(test_file_read);
    DSP_RUN(test_file_drop_pages);
    return dsp_test_summary();
}
