/* test_nfc: tok/nfc on targeted cases (the exhaustive comparison with Python's unicodedata is
 * tests/py/test_nfc.py): the quick check's fast path returns the input itself, composition,
 * Hangul, singletons, exclusions, reordering, blocking, long runs of marks, the output limit. */
#include "dsp_test.h"
#include "tok/nfc.h"

static dsp_nfc_scratch g_sc;

/* NFC of s must be want; same tells whether the input should come back untouched (no copy) */
static void expect(const char *s, const char *want, bool same) {
    const char *out;
    size_t ol;
    CHECK(dsp_nfc_normalize(s, strlen(s), 1u << 20, &g_sc, &out, &ol) == DSP_OK);
    CHECK_MSG(ol == strlen(want) && !memcmp(out, want, ol), "NFC(%s) = %.*s, want %s", s, (int)ol, out, want);
    CHECK_MSG((out == s) == same, "NFC(%s): %s", s, same ? "copied an NFC text" : "returned a non-NFC text as is");
    CHECK(dsp_nfc_quick_check(s, strlen(s)) == same);
}

static void test_already_nfc(void) {
    expect("", "", true);
    expect("plain ASCII text, long enough for the eight-byte path.\n", "plain ASCII text, long enough for the eight-byte path.\n", true);
    expect("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xED\x95\x9C", "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xED\x95\x9C", true);
    expect("\xF0\x9F\x98\x80 emoji", "\xF0\x9F\x98\x80 emoji", true);
    /* marks in canonical order with nothing to compose: x U+0316 (220) U+0301 (230); U+0301 is
     * quick check Maybe, so the text is normalized (into a copy) and comes out equal */
    expect("x\xCC\x96\xCC\x81", "x\xCC\x96\xCC\x81", false);
}

static void test_compose(void) {
    expect("e\xCC\x81", "\xC3\xA9", false);                                 /* e + U+0301 -> U+00E9 */
    expect("abc e\xCC\x81 xyz", "abc \xC3\xA9 xyz", false);                 /* prefix copied */
    expect("A\xCC\x8A", "\xC3\x85", false);                                 /* A + ring -> U+00C5 */
    expect("\xE2\x84\xAB", "\xC3\x85", false);                              /* U+212B ANGSTROM SIGN: singleton */
    expect("\xE2\x84\xA6", "\xCE\xA9", false);                              /* U+2126 OHM -> U+03A9 */
    expect("\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC", false);              /* U+0958: composition exclusion */
    expect("\xCD\x84", "\xCC\x88\xCC\x81", false);                          /* U+0344: non-starter decomposition */
    expect("\xEF\xA4\x80", "\xE8\xB1\x88", false);                          /* U+F900 CJK compatibility -> U+8C48 */
    /* reordering then composition: a + U+0301 (230) + U+0316 (220) -> U+00E1 U+0316 */
    expect("a\xCC\x81\xCC\x96", "\xC3\xA1\xCC\x96", false);
    /* not blocked: U+0316 (220) between a and U+0301 (230) */
    expect("a\xCC\x96\xCC\x81", "\xC3\xA1\xCC\x96", false);
    /* blocked: a + U+0301 + U+0301: the second acute is blocked by the first (same class) */
    expect("a\xCC\x81\xCC\x81", "\xC3\xA1\xCC\x81", false);
    /* decomposed then recomposed differently: U+1E69 (s dot below dot above) from s + 0307 + 0323 */
    expect("s\xCC\x87\xCC\xA3", "\xE1\xB9\xA9", false);
    /* a mark with no starter before it stays */
    expect("\xCC\x81x", "\xCC\x81x", false);
}

static void test_hangul(void) {
    expect("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C", false); /* L V T -> U+D55C */
    expect("\xE1\x84\x80\xE1\x85\xA1", "\xEA\xB0\x80", false);             /* L V -> U+AC00 */
    expect("\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81", false);             /* LV + T -> LVT */
    expect("\xEA\xB0\x81\xE1\x86\xA8", "\xEA\xB0\x81\xE1\x86\xA8", false); /* LVT + T: no */
}

static void test_long_runs(void) {
    /* 5000 marks alternating classes 230 / 220 after a base: linear, sorted stably by class */
    size_t n = 5000;
    char *s = malloc(1 + 2 * n + 1), *want = malloc(1 + 2 * n + 1);
    s[0] = want[0] = 'x';
    for (size_t i = 0; i < n; i++) memcpy(s + 1 + 2 * i, i % 2 ? "\xCC\x96" : "\xCC\x80", 2); /* 0300 (230), 0316 (220) */
    for (size_t i = 0; i < n; i++) memcpy(want + 1 + 2 * i, i < n / 2 ? "\xCC\x96" : "\xCC\x80", 2);
    s[1 + 2 * n] = want[1 + 2 * n] = '\0';
    /* x + U+0300 composes? no: there is no precomposed x-grave, so all marks stay */
    expect(s, want, false);
    free(s);
    free(want);
}

static void test_limit(void) {
    const char *out;
    size_t ol;
    /* U+0958 (3 bytes) becomes 6 bytes: over a 5-byte limit */
    CHECK(dsp_nfc_normalize("\xE0\xA5\x98", 3, 5, &g_sc, &out, &ol) == DSP_ERR_RANGE);
    CHECK(dsp_nfc_normalize("\xE0\xA5\x98", 3, 6, &g_sc, &out, &ol) == DSP_OK && ol == 6);
}

int main(void) {
    DSP_RUN(test_already_nfc);
    DSP_RUN(test_compose);
    DSP_RUN(test_hangul);
    DSP_RUN(test_long_runs);
    DSP_RUN(test_limit);
    dsp_nfc_scratch_free(&g_sc);
    return dsp_test_summary();
}
