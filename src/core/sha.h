/* core/sha: SHA-256 and SHA-1 (FIPS 180-4), incremental, for verifying downloads: the Hugging Face
 * hub names a large (LFS) file by the SHA-256 of its bytes and a small one by its git blob id, the
 * SHA-1 of "blob <size>\0" followed by the bytes. Written from the standard; checked against
 * Python's hashlib (tests/test_core_sha.c carries the FIPS example vectors). */
#ifndef DSP_CORE_SHA_H
#define DSP_CORE_SHA_H

#include <stddef.h>
#include <stdint.h>

typedef struct dsp_sha256 {
    uint32_t h[8];
    uint64_t len;      /* bytes hashed so far */
    uint8_t buf[64];   /* a partial block */
} dsp_sha256;

typedef struct dsp_sha1 {
    uint32_t h[5];
    uint64_t len;
    uint8_t buf[64];
} dsp_sha1;

void dsp_sha256_init(dsp_sha256 *s);
void dsp_sha256_update(dsp_sha256 *s, const void *data, size_t n);
void dsp_sha256_final(dsp_sha256 *s, uint8_t out[32]);

void dsp_sha1_init(dsp_sha1 *s);
void dsp_sha1_update(dsp_sha1 *s, const void *data, size_t n);
void dsp_sha1_final(dsp_sha1 *s, uint8_t out[20]);

/* lowercase hex of n bytes into out (2n + 1 bytes) */
void dsp_hex(const uint8_t *bytes, size_t n, char *out);

#endif
