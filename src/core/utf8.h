/* core/utf8: UTF-8, written once for the whole tree (tokenizers, templates, the server).
 *
 * "Valid" is RFC 3629: no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF,
 * no truncated sequence. Functions taking text "known to be valid" (dsp_utf8_len, dsp_utf8_decode,
 * dsp_utf8_prev, dsp_utf8_count) never read outside [s, s+n) whatever the bytes, but only promise a
 * meaningful answer on valid text; check untrusted text first with dsp_utf8_valid/dsp_utf8_seq, or
 * sanitize it (each maximal invalid subsequence becomes U+FFFD, the WHATWG and Python
 * bytes.decode("utf-8", "replace") rule). */
#ifndef DSP_CORE_UTF8_H
#define DSP_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_UTF8_BAD 0xFFFFFFFFu /* dsp_utf8_decode: a character cut short */

/* Bytes of the character a lead byte starts (1..4), for text known to be valid. */
static inline size_t dsp_utf8_len(uint8_t lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
/* Length (1..4) of the valid character at the start of s[0..n), or 0 if it does not start with one. */
size_t dsp_utf8_seq(const void *s, size_t n);
/* true if s[0..n) is valid UTF-8 */
bool dsp_utf8_valid(const void *s, size_t n);
/* The code point at s (n > 0 bytes available) in text known to be valid; its byte length in *len
 * (may be NULL). A character that n cuts short gives DSP_UTF8_BAD and *len = n. */
uint32_t dsp_utf8_decode(const void *s, size_t n, size_t *len);
/* Write cp (<= U+10FFFF) to out (room for 4 bytes); returns its length 1..4. */
size_t dsp_utf8_encode(uint32_t cp, char *out);
/* Code points in s[0..n) (bytes that are not continuation bytes). */
size_t dsp_utf8_count(const void *s, size_t n);
/* Offset of the start of the character that ends at s+n (0 if none). */
size_t dsp_utf8_prev(const void *s, size_t n);

/* Streaming lossy decoder: valid input passes through, each maximal invalid subsequence becomes
 * U+FFFD, an incomplete character at a chunk boundary is held back until the next chunk. A
 * zero-initialized state is ready to use. */
typedef struct dsp_utf8_state {
    uint8_t pend[4];
    uint8_t n_pend, need;
    uint8_t lo, hi;
} dsp_utf8_state;
/* Feed n bytes; appends output to out (room for 3*n + 4 bytes needed); returns bytes written. */
size_t dsp_utf8_feed(dsp_utf8_state *st, const uint8_t *in, size_t n, uint8_t *out);
/* End of input: an incomplete character becomes U+FFFD. Returns bytes written (0 or 3). */
size_t dsp_utf8_finish(dsp_utf8_state *st, uint8_t *out);
/* A malloc'd, NUL-terminated copy of s[0..n) with invalid sequences replaced as above; its length
 * in *out_len. NULL if out of memory. */
char *dsp_utf8_sanitize(const char *s, size_t n, size_t *out_len);

#endif
