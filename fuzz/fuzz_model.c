/* fuzz/fuzz_model: libFuzzer target for model loading from untrusted files. The input is not a file
 * but the recipe of one: it picks an architecture, sets hyper-parameters (kept, absent, small,
 * powers of two, near-wrapping or raw 32-bit values, a head size whose product with the head count
 * wraps), optionally adds a tokenizer (its size and special token ids fuzzed) and then mutates tensors (shapes, types,
 * dimensions, removal) of a valid tiny model (tests/gguf_build.h, whose consistent shapes use
 * 32-bit products that wrap as an attacker would make them). The GGUF written from it is loaded
 * and, if accepted, run (fuzz_common.h). An empty input is the valid model itself. */
#include "fuzz_common.h"
#include "gguf_build.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
} rd;

static uint8_t next8(rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static uint32_t next32(rd *r) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) v |= (uint32_t)next8(r) << (8 * k);
    return v;
}

/* a value for a dimension or hyper-parameter; 0 keeps `keep` */
static uint64_t pick(rd *r, uint64_t keep) {
    uint8_t mode = next8(r);
    switch (mode % 8) {
    case 3: return 0;                                       /* absent / zero */
    case 4: return next8(r) % 33;                          /* small */
    case 5: return (uint64_t)1 << (next8(r) % 25);         /* a power of two */
    case 6: return ((uint64_t)1 << (next8(r) % 25)) + (next8(r) % 4); /* just past one: wraps when multiplied */
    case 7: return next32(r);                               /* anything */
    default: return keep;                                   /* mostly: leave it valid */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "mistral", "gpt2"};
    static gb_model m;
    rd r = {data, size, 0};
    gb_model_init(&m, archs[next8(&r) % 5]);
    for (int k = 0; k < GB_N_HP; k++) m.hp[k] = (uint32_t)pick(&r, m.hp[k]);
    if (next8(&r) % 4 == 0 && m.hp[GB_HEADS]) { /* a head size whose product with head_count wraps */
        uint64_t h = m.hp[GB_HEADS];
        m.hp[GB_KEY_LEN] = (uint32_t)((((uint64_t)1 << 32) + h - 1) / h + next8(&r) % 3);
    }
    uint64_t v = pick(&r, m.n_vocab);
    m.n_vocab = (uint32_t)(v ? v : 1);
    if (next8(&r) & 1) { /* a tokenizer, its size and special ids fuzzed too */
        m.n_tokens = (uint32_t)pick(&r, m.n_vocab) % 4096;
        uint64_t *ids[3] = {&m.bos_id, &m.eos_id, &m.eot_id};
        for (int k = 0; k < 3; k++)
            if (next8(&r) & 1) *ids[k] = (uint32_t)pick(&r, 1);
    }
    gb_model_tensors(&m);
    for (int k = 0; k < 16 && r.i < r.n && m.n_t > 0; k++) {
        gb_tensor *t = &m.t[next8(&r) % m.n_t];
        switch (next8(&r) % 6) {
        case 0: t->ne[0] = pick(&r, t->ne[0]); break;
        case 1: t->ne[1] = pick(&r, t->ne[1]); break;
        case 2: t->type = next8(&r) % 40; break;
        case 3: t->n_dims = next8(&r) % 5; break;
        case 4: *t = m.t[--m.n_t]; break; /* remove it */
        default: t->ne[next8(&r) % 4] = next32(&r); break;
        }
    }
    buf f = gb_model_write(&m, (size_t)256 << 10);
    if (f.n) fuzz_load_and_run(f.p, f.n);
    free(f.p);
    return 0;
}
