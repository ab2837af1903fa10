/* test_sha: core/sha against the FIPS 180-4 example vectors (and Python's hashlib for the rest),
 * split updates equal one-shot ones at every padding boundary, git blob ids. */
#include "dsp_test.h"

#include "core/sha.h"

static void sha256_hex(const void *p, size_t n, char out[65]) {
    dsp_sha256 s;
    uint8_t d[32];
    dsp_sha256_init(&s);
    dsp_sha256_update(&s, p, n);
    dsp_sha256_final(&s, d);
    dsp_hex(d, 32, out);
}

static void sha1_hex(const void *p, size_t n, char out[41]) {
    dsp_sha1 s;
    uint8_t d[20];
    dsp_sha1_init(&s);
    dsp_sha1_update(&s, p, n);
    dsp_sha1_final(&s, d);
    dsp_hex(d, 20, out);
}

static void test_vectors(void) {
    static const char *msg = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: padding spills */
    char h[65];
    sha256_hex("abc", 3, h);
    CHECK_EQ_STR(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha256_hex("", 0, h);
    CHECK_EQ_STR(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha256_hex(msg, strlen(msg), h);
    CHECK_EQ_STR(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    sha1_hex("abc", 3, h);
    CHECK_EQ_STR(h, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_hex("", 0, h);
    CHECK_EQ_STR(h, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    sha1_hex(msg, strlen(msg), h);
    CHECK_EQ_STR(h, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    /* a million 'a', fed in uneven pieces */
    static char a[1000000];
    memset(a, 'a', sizeof a);
    dsp_sha256 s;
    dsp_sha1 s1;
    dsp_sha256_init(&s);
    dsp_sha1_init(&s1);
    for (size_t off = 0, k = 1; off < sizeof a; off += k, k = k * 3 % 1000 + 1) {
        size_t n = off + k > sizeof a ? sizeof a - off : k;
        dsp_sha256_update(&s, a + off, n);
        dsp_sha1_update(&s1, a + off, n);
    }
    uint8_t d[32];
    dsp_sha256_final(&s, d);
    dsp_hex(d, 32, h);
    CHECK_EQ_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    dsp_sha1_final(&s1, d);
    dsp_hex(d, 20, h);
    CHECK_EQ_STR(h, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

static void test_splits(void) {
    uint8_t m[256];
    for (int i = 0; i < 256; i++) m[i] = (uint8_t)i;
    int bad = 0;
    for (size_t n = 0; n <= 200; n++) { /* every length around the 56/64-byte padding edges, every split */
        char one[65], one1[41];
        sha256_hex(m, n, one);
        sha1_hex(m, n, one1);
        for (size_t k = 0; k <= n; k += (n < 80 ? 1 : 13)) {
            dsp_sha256 s;
            dsp_sha1 s1;
            uint8_t d[32];
            char h[65];
            dsp_sha256_init(&s), dsp_sha1_init(&s1);
            dsp_sha256_update(&s, m, k), dsp_sha256_update(&s, m + k, n - k);
            dsp_sha1_update(&s1, m, k), dsp_sha1_update(&s1, m + k, n - k);
            dsp_sha256_final(&s, d);
            dsp_hex(d, 32, h);
            bad += strcmp(h, one) != 0;
            dsp_sha1_final(&s1, d);
            dsp_hex(d, 20, h);
            bad += strcmp(h, one1) != 0;
        }
    }
    CHECK_EQ_INT(bad, 0);
    char h[65];
    sha256_hex(m, 119, h); /* hashlib.sha256(bytes(range(119))) */
    CHECK_EQ_STR(h, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6");
    sha1_hex(m, 119, h);
    CHECK_EQ_STR(h, "41c89d06001bab4ab78736b44efe7ce18ce6ae08");
}

static void test_git_blob(void) {
    char h[41];
    sha1_hex("blob 0\0", 7, h); /* `git hash-object` of an empty file */
    CHECK_EQ_STR(h, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    sha1_hex("blob 5\0hello", 12, h);
    CHECK_EQ_STR(h, "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0");
}

int main(void) {
    DSP_RUN(test_vectors);
    DSP_RUN(test_splits);
    DSP_RUN(test_git_blob);
    return dsp_test_summary();
}
