/* tests/dequant_tool: drives core/quant's reference dequantization for tests/py/test_dequant.py.
 *
 *   dequant_tool raw TYPE N     read dsp_dtype_row_bytes(TYPE, N) bytes from stdin, write N f32
 *                               to stdout (exit 1 with the message on stderr if refused)
 *   dequant_tool gguf PATH      open PATH with the dsp_gguf reader and stream every tensor:
 *                               per tensor a header {u32 name_len, name bytes, u32 type,
 *                               u64 n_elems, u32 status} then, if status == 0, n_elems f32
 *   dequant_tool sizes          print "id name block_elems block_bytes can_dequant" per dtype
 *   dequant_tool quantize TYPE N   read N f32 from stdin, write dsp_quantize_row's blocks
 *
 * Output is binary, little-endian, host floats. Tensors are dequantized in chunks so that memory
 * stays bounded whatever the tensor size. */
#include "core/dtype.h"
#include "core/quant.h"
#include "core/status.h"
#include "io/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_ELEMS (1u << 20) /* a multiple of every block size */

static int fail(const char *what) {
    fprintf(stderr, "dequant_tool: %s: %s\n", what, dsp_last_error());
    return 1;
}

static int write_all(const void *p, size_t n) {
    if (n && fwrite(p, 1, n, stdout) != n) {
        fprintf(stderr, "dequant_tool: write failed: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return 1;
    *out = v;
    return 0;
}

static int cmd_raw(const char *type_s, const char *n_s) {
    uint64_t type, n;
    if (parse_u64(type_s, &type) || parse_u64(n_s, &n) || type > UINT32_MAX) {
        fprintf(stderr, "dequant_tool: raw: bad TYPE or N\n");
        return 2;
    }
    const dsp_dtype_traits *t = dsp_dtype_get((uint32_t)type);
    /* Refusals (unknown type, partial block) come from dsp_dequantize_row itself: call it on an
     * empty source first so that the library, not this tool, decides. */
    size_t nbytes = t && n % t->block_elems == 0 ? dsp_dtype_row_bytes((uint32_t)type, n) : 0;
    uint8_t *src = malloc(nbytes ? nbytes : 1);
    float *dst = malloc(n ? n * sizeof(float) : 1);
    if (!src || !dst) {
        free(src);
        free(dst);
        fprintf(stderr, "dequant_tool: out of memory\n");
        return 1;
    }
    int rc = 0;
    if (nbytes && fread(src, 1, nbytes, stdin) != nbytes) {
        fprintf(stderr, "dequant_tool: raw: expected %zu bytes on stdin\n", nbytes);
        rc = 1;
    } else if (dsp_dequantize_row((uint32_t)type, src, dst, n) != DSP_OK) {
        rc = fail("raw");
    } else {
        rc = write_all(dst, n * sizeof(float));
    }
    free(src);
    free(dst);
    return rc;
}

static int cmd_quantize(const char *type_s, const char *n_s) {
    uint64_t type, n;
    if (parse_u64(type_s, &type) || parse_u64(n_s, &n) || type > UINT32_MAX || !dsp_dtype_get((uint32_t)type) || n > (1u << 28)) {
        fprintf(stderr, "dequant_tool: quantize: bad TYPE or N\n");
        return 2;
    }
    size_t nbytes = dsp_dtype_row_bytes((uint32_t)type, n);
    float *src = malloc(n ? n * sizeof(float) : 1);
    uint8_t *dst = malloc(nbytes ? nbytes : 1);
    int rc = 0;
    if (!src || !dst) {
        fprintf(stderr, "dequant_tool: out of memory\n");
        rc = 1;
    } else if (fread(src, sizeof(float), n, stdin) != n) {
        fprintf(stderr, "dequant_tool: quantize: expected %llu floats on stdin\n", (unsigned long long)n);
        rc = 1;
    } else if (dsp_quantize_row((uint32_t)type, src, dst, n) != DSP_OK) {
        rc = fail("quantize");
    } else {
        rc = write_all(dst, nbytes);
    }
    free(src);
    free(dst);
    return rc;
}

static int cmd_gguf(const char *path) {
    dsp_gguf *g;
    if (dsp_gguf_open(path, &g) != DSP_OK) return fail(path);
    float *buf = malloc(CHUNK_ELEMS * sizeof(float));
    if (!buf) {
        dsp_gguf_destroy(g);
        fprintf(stderr, "dequant_tool: out of memory\n");
        return 1;
    }
    int rc = 0;
    for (uint64_t i = 0; i < dsp_gguf_n_tensors(g) && !rc; i++) {
        const dsp_gguf_tensor *t = dsp_gguf_tensor_at(g, i);
        const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
        uint32_t name_len = (uint32_t)t->name.len, status = 0;
        if (!tr || !tr->can_dequant) status = DSP_ERR_UNSUPPORTED;
        rc |= write_all(&name_len, 4) || write_all(t->name.ptr, name_len) ||
              write_all(&t->type, 4) || write_all(&t->n_elems, 8) || write_all(&status, 4);
        if (status) continue;
        const uint8_t *src = t->data;
        for (uint64_t done = 0; done < t->n_elems && !rc; done += CHUNK_ELEMS) {
            uint64_t n = t->n_elems - done < CHUNK_ELEMS ? t->n_elems - done : CHUNK_ELEMS;
            /* done is a multiple of the block size, so this is the byte offset of element done */
            size_t off = dsp_dtype_row_bytes(t->type, done);
            if (dsp_dequantize_row(t->type, src + off, buf, n) != DSP_OK) {
                rc = fail(path);
                break;
            }
            rc = write_all(buf, n * sizeof(float));
        }
    }
    free(buf);
    dsp_gguf_destroy(g);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}

static int cmd_sizes(void) {
    for (uint32_t id = 0; id < DSP_DTYPE_COUNT; id++) {
        const dsp_dtype_traits *t = dsp_dtype_get(id);
        if (t) printf("%u %s %u %u %d\n", id, t->name, t->block_elems, t->block_bytes, t->can_dequant);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "raw")) return cmd_raw(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "gguf")) return cmd_gguf(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "sizes")) return cmd_sizes();
    if (argc == 4 && !strcmp(argv[1], "quantize")) return cmd_quantize(argv[2], argv[3]);
    fprintf(stderr, "usage: dequant_tool raw TYPE N | gguf PATH | sizes | quantize TYPE N\n");
    return 2;
}
