/* core/tensor: dsp_str and the name index. See tensor.h. */
#include "core/tensor.h"

#include <stdlib.h>
#include <string.h>

bool dsp_str_eq(dsp_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

static uint64_t fnv1a(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

dsp_status dsp_name_index_init(dsp_name_index *ix, const void *base, size_t stride, uint64_t n) {
    uint64_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    ix->tab = calloc(cap, sizeof *ix->tab);
    ix->cap = ix->tab ? cap : 0;
    ix->base = base;
    ix->stride = stride;
    return ix->tab ? DSP_OK : DSP_ERR_NOMEM;
}

static const dsp_str *entry(const dsp_name_index *ix, uint64_t idx) {
    return (const dsp_str *)((const char *)ix->base + idx * ix->stride);
}

bool dsp_name_index_insert(dsp_name_index *ix, uint64_t idx) {
    const dsp_str *nm = entry(ix, idx);
    uint64_t h = fnv1a(nm->ptr, nm->len) & (ix->cap - 1);
    while (ix->tab[h]) {
        const dsp_str *o = entry(ix, ix->tab[h] - 1);
        if (o->len == nm->len && !memcmp(o->ptr, nm->ptr, nm->len)) return false;
        h = (h + 1) & (ix->cap - 1);
    }
    ix->tab[h] = idx + 1;
    return true;
}

const void *dsp_name_index_find(const dsp_name_index *ix, const char *name) {
    if (!ix->cap) return NULL;
    size_t n = strlen(name);
    uint64_t h = fnv1a(name, n) & (ix->cap - 1);
    while (ix->tab[h]) {
        const dsp_str *o = entry(ix, ix->tab[h] - 1);
        if (o->len == n && !memcmp(o->ptr, name, n)) return o;
        h = (h + 1) & (ix->cap - 1);
    }
    return NULL;
}

void dsp_name_index_free(dsp_name_index *ix) {
    free(ix->tab);
    memset(ix, 0, sizeof *ix);
}
