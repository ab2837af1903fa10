/* io/gguf: see gguf.h.
 *
 * One pass over the header builds the kv and tensor tables; every read goes through the bounds
 * checked cursor below, so a corrupt file ends in an error naming the field, never in a read past
 * the mapping. Counts are checked against the bytes left before anything is allocated for them. */
#include "io/gguf.h"

#include "core/file.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NESTING 8 /* arrays of arrays of ...: deeper is certainly not a real model file */

struct dsp_gguf {
    const uint8_t *base;
    uint64_t size;
    dsp_file_map file; /* the mapping when we own one (dsp_gguf_open) */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv, n_tensors;
    dsp_gguf_kv *kv;
    dsp_gguf_tensor *tensors;
    dsp_name_index tensor_ix, kv_ix; /* name -> entry (names are the structs' first member) */
};

/* ---- bounds-checked cursor ---------------------------------------------------------------- */

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
} cursor;

static uint64_t left(const cursor *c) { return c->size - c->pos; }

static dsp_status need(const cursor *c, uint64_t n, const char *what) {
    if (n > left(c))
        return dsp_error(DSP_ERR_FORMAT, "%s: needs %" PRIu64 " bytes at offset %" PRIu64 ", past end of file (%" PRIu64 " bytes)",
                         what, n, c->pos, c->size);
    return DSP_OK;
}

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static dsp_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    dsp_status st = need(c, 4, what);
    if (st) return st;
    *v = (uint32_t)rd_le(c->base + c->pos, 4);
    c->pos += 4;
    return DSP_OK;
}

static dsp_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    dsp_status st = need(c, 8, what);
    if (st) return st;
    *v = rd_le(c->base + c->pos, 8);
    c->pos += 8;
    return DSP_OK;
}

static dsp_status rd_str(cursor *c, dsp_str *s, const char *what) {
    uint64_t len;
    dsp_status st = rd_u64(c, &len, what);
    if (st) return st;
    if (len > left(c))
        return dsp_error(DSP_ERR_FORMAT, "%s: string length %" PRIu64 " at offset %" PRIu64 " runs past end of file (%" PRIu64 " bytes)",
                         what, len, c->pos - 8, c->size);
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return DSP_OK;
}

/* size in bytes of a fixed-size value type, 0 for STRING/ARRAY/unknown */
static uint64_t type_size(uint32_t t) {
    switch (t) {
    case DSP_GGUF_U8: case DSP_GGUF_I8: case DSP_GGUF_BOOL: return 1;
    case DSP_GGUF_U16: case DSP_GGUF_I16: return 2;
    case DSP_GGUF_U32: case DSP_GGUF_I32: case DSP_GGUF_F32: return 4;
    case DSP_GGUF_U64: case DSP_GGUF_I64: case DSP_GGUF_F64: return 8;
    default: return 0;
    }
}

const char *dsp_gguf_type_name(dsp_gguf_type t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < DSP_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* ---- metadata values ---------------------------------------------------------------------- */

/* Skip one value of type t at the cursor (validating it); used for array elements. For STRING
 * and ARRAY elements the caller records the element start. `depth` bounds nesting. */
static dsp_status skip_value(cursor *c, uint32_t t, int depth, const char *key) {
    uint64_t sz = type_size(t);
    if (sz) {
        dsp_status st = need(c, sz, key);
        if (st) return st;
        c->pos += sz;
        return DSP_OK;
    }
    if (t == DSP_GGUF_STRING) {
        dsp_str s;
        return rd_str(c, &s, key);
    }
    if (t == DSP_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_NESTING)
            return dsp_error(DSP_ERR_FORMAT, "key '%s': arrays nested deeper than %d", key, GGUF_MAX_NESTING);
        uint32_t et;
        uint64_t n;
        dsp_status st = rd_u32(c, &et, key);
        if (!st) st = rd_u64(c, &n, key);
        if (st) return st;
        if (et >= DSP_GGUF_TYPE_COUNT)
            return dsp_error(DSP_ERR_FORMAT, "key '%s': nested array has unknown element type %u", key, et);
        uint64_t esz = type_size(et);
        if (esz) {
            if (n > left(c) / esz)
                return dsp_error(DSP_ERR_FORMAT, "key '%s': nested array of %" PRIu64 " %s runs past end of file", key, n,
                                 dsp_gguf_type_name(et));
            c->pos += n * esz;
            return DSP_OK;
        }
        /* every string or array element takes at least 8 (or 12) bytes */
        if (n > left(c) / 8)
            return dsp_error(DSP_ERR_FORMAT, "key '%s': nested array count %" PRIu64 " exceeds the bytes left (%" PRIu64 ")", key, n,
                             left(c));
        for (uint64_t i = 0; i < n; i++) {
            st = skip_value(c, et, depth + 1, key);
            if (st) return st;
        }
        return DSP_OK;
    }
    return dsp_error(DSP_ERR_FORMAT, "key '%s': unknown value type %u", key, t);
}

static dsp_status read_kv(cursor *c, dsp_gguf_kv *kv, uint64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "metadata entry %" PRIu64 " key", idx);
    dsp_status st = rd_str(c, &kv->key, what);
    if (st) return st;
    /* a key name for messages: keys are untrusted bytes, print at most 200 of them */
    char key[201];
    size_t kl = kv->key.len < 200 ? (size_t)kv->key.len : 200;
    memcpy(key, kv->key.ptr, kl);
    key[kl] = '\0';
    if (kv->key.len == 0) return dsp_error(DSP_ERR_FORMAT, "metadata entry %" PRIu64 ": empty key", idx);
    if (memchr(kv->key.ptr, 0, kv->key.len))
        return dsp_error(DSP_ERR_FORMAT, "metadata entry %" PRIu64 ": key contains a NUL byte", idx);
    uint32_t t;
    st = rd_u32(c, &t, key);
    if (st) return st;
    if (t >= DSP_GGUF_TYPE_COUNT) return dsp_error(DSP_ERR_FORMAT, "key '%s': unknown value type %u", key, t);
    kv->type = (dsp_gguf_type)t;
    if (t != DSP_GGUF_ARRAY) {
        uint64_t start = c->pos;
        kv->data = c->base + c->pos;
        st = skip_value(c, t, 0, key);
        if (st) return st;
        kv->nbytes = c->pos - start;
        if (t == DSP_GGUF_BOOL && kv->data[0] > 1)
            return dsp_error(DSP_ERR_FORMAT, "key '%s': bool value %u is neither 0 nor 1", key, kv->data[0]);
        return DSP_OK;
    }
    uint32_t et;
    st = rd_u32(c, &et, key);
    if (!st) st = rd_u64(c, &kv->arr_n, key);
    if (st) return st;
    if (et >= DSP_GGUF_TYPE_COUNT) return dsp_error(DSP_ERR_FORMAT, "key '%s': array has unknown element type %u", key, et);
    kv->arr_type = (dsp_gguf_type)et;
    kv->data = c->base + c->pos;
    uint64_t start = c->pos, esz = type_size(et);
    if (esz) {
        if (kv->arr_n > left(c) / esz)
            return dsp_error(DSP_ERR_FORMAT, "key '%s': array of %" PRIu64 " %s (%" PRIu64 " bytes each) runs past end of file (%" PRIu64 " bytes left)",
                             key, kv->arr_n, dsp_gguf_type_name(et), esz, left(c));
        c->pos += kv->arr_n * esz;
        if (et == DSP_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if (kv->data[i] > 1)
                    return dsp_error(DSP_ERR_FORMAT, "key '%s': bool element %" PRIu64 " is %u", key, i, kv->data[i]);
    } else {
        if (kv->arr_n > left(c) / 8)
            return dsp_error(DSP_ERR_FORMAT, "key '%s': array count %" PRIu64 " exceeds the bytes left in the file (%" PRIu64 ")", key,
                             kv->arr_n, left(c));
        kv->elem_offs = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *kv->elem_offs);
        if (!kv->elem_offs) return dsp_error(DSP_ERR_NOMEM, "key '%s': no memory for %" PRIu64 " array offsets", key, kv->arr_n);
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            kv->elem_offs[i] = c->pos - start;
            st = skip_value(c, et, 1, key);
            if (st) return st;
        }
    }
    kv->nbytes = c->pos - start;
    return DSP_OK;
}

/* ---- open --------------------------------------------------------------------------------- */

static void format_mb(char *buf, size_t n, uint64_t bytes) {
    if (bytes >= 10u * 1024 * 1024) snprintf(buf, n, "%" PRIu64 " MB", bytes >> 20);
    else snprintf(buf, n, "%" PRIu64 " bytes", bytes);
}

static dsp_status read_tensor(cursor *c, dsp_gguf_tensor *t, uint64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "tensor %" PRIu64 " name", idx);
    dsp_status st = rd_str(c, &t->name, what);
    if (st) return st;
    char name[201];
    size_t nl = t->name.len < 200 ? (size_t)t->name.len : 200;
    memcpy(name, t->name.ptr, nl);
    name[nl] = '\0';
    if (t->name.len == 0) return dsp_error(DSP_ERR_FORMAT, "tensor %" PRIu64 ": empty name", idx);
    if (memchr(t->name.ptr, 0, t->name.len)) return dsp_error(DSP_ERR_FORMAT, "tensor %" PRIu64 ": name contains a NUL byte", idx);
    st = rd_u32(c, &t->n_dims, name);
    if (st) return st;
    if (t->n_dims == 0 || t->n_dims > DSP_GGUF_MAX_DIMS)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%s': %u dimensions (must be 1..%d)", name, t->n_dims, DSP_GGUF_MAX_DIMS);
    uint64_t n = 1;
    for (int d = 0; d < DSP_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        st = rd_u64(c, &t->ne[d], name);
        if (st) return st;
        if (t->ne[d] == 0) return dsp_error(DSP_ERR_FORMAT, "tensor '%s': dimension %u is zero", name, d);
        if (t->ne[d] > INT64_MAX / n)
            return dsp_error(DSP_ERR_FORMAT, "tensor '%s': element count overflows at dimension %u (%" PRIu64 ")", name, d, t->ne[d]);
        n *= t->ne[d];
    }
    t->n_elems = n;
    st = rd_u32(c, &t->type, name);
    if (!st) st = rd_u64(c, &t->offset, name);
    if (st) return st;
    const dsp_dtype_traits *tr = dsp_dtype_get(t->type);
    if (!tr) return dsp_error(DSP_ERR_FORMAT, "tensor '%s': unknown tensor type id %u", name, t->type);
    if (t->ne[0] % tr->block_elems)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%s': row length %" PRIu64 " is not a multiple of the %s block size %u", name, t->ne[0],
                         tr->name, tr->block_elems);
    uint64_t rows = n / t->ne[0], row_blocks = t->ne[0] / tr->block_elems;
    /* ne[0] alone may be up to 2^63: the row's byte size can overflow before the row count does */
    if (row_blocks > UINT64_MAX / tr->block_bytes || row_blocks * tr->block_bytes > UINT64_MAX / rows)
        return dsp_error(DSP_ERR_FORMAT, "tensor '%s': byte size overflows", name);
    uint64_t row_bytes = row_blocks * tr->block_bytes;
    t->nbytes = rows * row_bytes;
    return DSP_OK;
}

typedef struct {
    uint64_t begin, end, idx;
} extent;

static int extent_cmp(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Tensors must not share bytes: every writer lays them out one after the other, and a file whose
 * tensors alias each other is corrupt (or crafted), not a model. Bounds are already checked. */
static dsp_status check_overlap(const dsp_gguf *g) {
    if (g->n_tensors < 2) return DSP_OK;
    extent *ex = malloc(g->n_tensors * sizeof *ex);
    if (!ex) return dsp_error(DSP_ERR_NOMEM, "no memory to check %" PRIu64 " tensor extents", g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        ex[i] = (extent){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i};
    qsort(ex, g->n_tensors, sizeof *ex, extent_cmp);
    dsp_status st = DSP_OK;
    uint64_t far = 0; /* the extent reaching furthest so far */
    for (uint64_t i = 1; i < g->n_tensors && !st; i++) {
        if (ex[i - 1].end > ex[far].end) far = i - 1;
        if (ex[i].begin < ex[far].end) {
            const dsp_gguf_tensor *a = &g->tensors[ex[far].idx], *b = &g->tensors[ex[i].idx];
            st = dsp_error(DSP_ERR_FORMAT, "tensor '%.*s': data at offset %" PRIu64 " overlaps tensor '%.*s' (offsets %" PRIu64 "..%" PRIu64 ")",
                           (int)(b->name.len > 200 ? 200 : b->name.len), b->name.ptr, b->offset,
                           (int)(a->name.len > 200 ? 200 : a->name.len), a->name.ptr, a->offset, a->offset + a->nbytes);
        }
    }
    free(ex);
    return st;
}

static dsp_status parse(dsp_gguf *g) {
    cursor c = {g->base, g->size, 0};
    dsp_status st;
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        return dsp_error(DSP_ERR_FORMAT, "not a GGUF file (magic %s)",
                         g->size < 4 ? "missing: file shorter than 4 bytes" : "is not \"GGUF\"");
    }
    c.pos = 4;
    st = rd_u32(&c, &g->version, "header version");
    if (st) return st;
    if (g->version == 1) return dsp_error(DSP_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version)
            return dsp_error(DSP_ERR_UNSUPPORTED, "big-endian GGUF files are not supported (version field 0x%08x)", g->version);
        return dsp_error(DSP_ERR_UNSUPPORTED, "GGUF version %u is not supported (only 2 and 3)", g->version);
    }
    st = rd_u64(&c, &g->n_tensors, "header tensor count");
    if (!st) st = rd_u64(&c, &g->n_kv, "header metadata count");
    if (st) return st;
    /* every kv takes >= 8 (key len) + 1 + 4 + 1 bytes; every tensor info >= 8 + 1 + 4 + 8 + 4 + 8 */
    if (g->n_kv > left(&c) / 14)
        return dsp_error(DSP_ERR_FORMAT, "header metadata count %" PRIu64 " is impossible for a file of %" PRIu64 " bytes", g->n_kv, g->size);
    if (g->n_tensors > left(&c) / 33)
        return dsp_error(DSP_ERR_FORMAT, "header tensor count %" PRIu64 " is impossible for a file of %" PRIu64 " bytes", g->n_tensors,
                         g->size);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return dsp_error(DSP_ERR_NOMEM, "no memory for the GGUF tables");

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (dsp_name_index_init(&g->kv_ix, g->kv, sizeof *g->kv, g->n_kv) ||
        dsp_name_index_init(&g->tensor_ix, g->tensors, sizeof *g->tensors, g->n_tensors))
        return dsp_error(DSP_ERR_NOMEM, "no memory for the GGUF indexes");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        st = read_kv(&c, &g->kv[i], i);
        if (st) return st;
        if (!dsp_name_index_insert(&g->kv_ix, i))
            return dsp_error(DSP_ERR_FORMAT, "metadata key '%.*s' appears twice", (int)(g->kv[i].key.len > 200 ? 200 : g->kv[i].key.len),
                             g->kv[i].key.ptr);
        if (dsp_str_eq(g->kv[i].key, "general.alignment")) {
            uint32_t a;
            if (g->kv[i].type != DSP_GGUF_U32)
                return dsp_error(DSP_ERR_FORMAT, "key 'general.alignment' has type %s (must be u32)", dsp_gguf_type_name(g->kv[i].type));
            a = (uint32_t)rd_le(g->kv[i].data, 4);
            if (a == 0 || (a & (a - 1)))
                return dsp_error(DSP_ERR_FORMAT, "key 'general.alignment' is %u (must be a non-zero power of two)", a);
            g->alignment = a;
        }
    }

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        dsp_gguf_tensor *t = &g->tensors[i];
        st = read_tensor(&c, t, i);
        if (st) return st;
        if (!dsp_name_index_insert(&g->tensor_ix, i))
            return dsp_error(DSP_ERR_FORMAT, "tensor name '%.*s' appears twice", (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr);
    }

    /* data section: aligned end of the header; an empty data section may end the file early */
    uint64_t off = c.pos, pad = (g->alignment - off % g->alignment) % g->alignment;
    g->data_offset = off + pad;
    uint64_t data_size = g->data_offset <= g->size ? g->size - g->data_offset : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        dsp_gguf_tensor *t = &g->tensors[i];
        char name[201];
        size_t nl = t->name.len < 200 ? (size_t)t->name.len : 200;
        memcpy(name, t->name.ptr, nl);
        name[nl] = '\0';
        if (t->offset % g->alignment)
            return dsp_error(DSP_ERR_FORMAT, "tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, name, t->offset,
                             g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            char end[32], fsz[32];
            /* saturate: offset and nbytes are untrusted and their sum may wrap */
            uint64_t e = t->offset > UINT64_MAX - g->data_offset ? UINT64_MAX : g->data_offset + t->offset;
            e = t->nbytes > UINT64_MAX - e ? UINT64_MAX : e + t->nbytes;
            format_mb(end, sizeof end, e);
            format_mb(fsz, sizeof fsz, g->size);
            return dsp_error(DSP_ERR_FORMAT, "tensor '%s': data ends at %s, past end of file (%s)", name, end, fsz);
        }
        t->data = g->base + g->data_offset + t->offset;
    }
    return check_overlap(g);
}

static dsp_status open_common(dsp_gguf *g, dsp_gguf **out) {
    dsp_status st = parse(g);
    if (st) {
        dsp_gguf_destroy(g);
        return st;
    }
    *out = g;
    return DSP_OK;
}

dsp_status dsp_gguf_open_memory(const void *buf, size_t size, dsp_gguf **out) {
    *out = NULL;
    if (!buf && size) return dsp_error(DSP_ERR_INVALID_ARG, "dsp_gguf_open_memory: NULL buffer");
    dsp_gguf *g = calloc(1, sizeof *g);
    if (!g) return dsp_error(DSP_ERR_NOMEM, "no memory");
    g->base = buf;
    g->size = size;
    return open_common(g, out);
}

dsp_status dsp_gguf_open(const char *path, dsp_gguf **out) {
    *out = NULL;
    dsp_file_map fm;
    dsp_status st = dsp_file_map_open(path, &fm);
    if (st) return st;
    dsp_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        dsp_file_map_close(&fm);
        return dsp_error(DSP_ERR_NOMEM, "no memory");
    }
    g->file = fm;
    g->base = fm.data;
    g->size = fm.size;
    st = open_common(g, out);
    if (st) dsp_error_prefix("%s", path);
    return st;
}

void dsp_gguf_destroy(dsp_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].elem_offs);
    free(g->kv);
    free(g->tensors);
    dsp_name_index_free(&g->tensor_ix);
    dsp_name_index_free(&g->kv_ix);
    dsp_file_map_close(&g->file);
    free(g);
}

/* ---- accessors ---------------------------------------------------------------------------- */

uint32_t dsp_gguf_version(const dsp_gguf *g) { return g->version; }
uint64_t dsp_gguf_file_size(const dsp_gguf *g) { return g->size; }
uint64_t dsp_gguf_alignment(const dsp_gguf *g) { return g->alignment; }
uint64_t dsp_gguf_data_offset(const dsp_gguf *g) { return g->data_offset; }
uint64_t dsp_gguf_n_kv(const dsp_gguf *g) { return g->n_kv; }
uint64_t dsp_gguf_n_tensors(const dsp_gguf *g) { return g->n_tensors; }

const dsp_gguf_kv *dsp_gguf_kv_at(const dsp_gguf *g, uint64_t i) { return i < g->n_kv ? &g->kv[i] : NULL; }
const dsp_gguf_tensor *dsp_gguf_tensor_at(const dsp_gguf *g, uint64_t i) { return i < g->n_tensors ? &g->tensors[i] : NULL; }

/* key and name are the first member of their structs, so the tables hold dsp_str pointers */
const dsp_gguf_kv *dsp_gguf_find_kv(const dsp_gguf *g, const char *key) {
    return dsp_name_index_find(&g->kv_ix, key);
}

const dsp_gguf_tensor *dsp_gguf_find_tensor(const dsp_gguf *g, const char *name) {
    return dsp_name_index_find(&g->tensor_ix, name);
}

static bool is_int_type(dsp_gguf_type t) {
    return t == DSP_GGUF_U8 || t == DSP_GGUF_I8 || t == DSP_GGUF_U16 || t == DSP_GGUF_I16 || t == DSP_GGUF_U32 ||
           t == DSP_GGUF_I32 || t == DSP_GGUF_U64 || t == DSP_GGUF_I64;
}
static bool is_signed(dsp_gguf_type t) {
    return t == DSP_GGUF_I8 || t == DSP_GGUF_I16 || t == DSP_GGUF_I32 || t == DSP_GGUF_I64;
}

/* integer value of an int/bool element at p; *neg set if negative */
static uint64_t int_at(const uint8_t *p, dsp_gguf_type t, bool *neg) {
    uint64_t sz = type_size(t), v = rd_le(p, (int)sz);
    *neg = false;
    if (is_signed(t) && sz < 8 && (v >> (sz * 8 - 1)) & 1) {
        *neg = true;
        return v | (~0ull << (sz * 8)); /* sign-extended two's complement */
    }
    if (is_signed(t) && sz == 8 && (v >> 63)) *neg = true;
    return v;
}

static double float_at(const uint8_t *p, dsp_gguf_type t) {
    if (t == DSP_GGUF_F32) {
        uint32_t b = (uint32_t)rd_le(p, 4);
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    if (t == DSP_GGUF_F64) {
        uint64_t b = rd_le(p, 8);
        double d;
        memcpy(&d, &b, 8);
        return d;
    }
    bool neg;
    uint64_t v = int_at(p, t, &neg);
    return neg ? (double)(int64_t)v : (double)v;
}

static dsp_status get_scalar(const dsp_gguf *g, const char *key, const dsp_gguf_kv **kv) {
    *kv = dsp_gguf_find_kv(g, key);
    if (!*kv) return DSP_ERR_NOT_FOUND;
    if ((*kv)->type == DSP_GGUF_ARRAY) return dsp_error(DSP_ERR_FORMAT, "key '%s' is an array, expected a scalar", key);
    return DSP_OK;
}

static dsp_status get_int(const dsp_gguf *g, const char *key, int64_t lo, uint64_t hi, uint64_t *out, bool *neg) {
    const dsp_gguf_kv *kv;
    dsp_status st = get_scalar(g, key, &kv);
    if (st) return st;
    if (!is_int_type(kv->type) && kv->type != DSP_GGUF_BOOL)
        return dsp_error(DSP_ERR_FORMAT, "key '%s' has type %s, expected an integer", key, dsp_gguf_type_name(kv->type));
    uint64_t v = int_at(kv->data, kv->type, neg);
    if (*neg ? (int64_t)v < lo : v > hi)
        return dsp_error(DSP_ERR_FORMAT, "key '%s': value %s%" PRIu64 " out of range", key, *neg ? "-" : "", *neg ? -v : v);
    *out = v;
    return DSP_OK;
}

dsp_status dsp_gguf_get_u32(const dsp_gguf *g, const char *key, uint32_t *out) {
    uint64_t v = 0;
    bool neg;
    dsp_status st = get_int(g, key, 0, UINT32_MAX, &v, &neg);
    if (!st) *out = (uint32_t)v;
    return st;
}
dsp_status dsp_gguf_get_i32(const dsp_gguf *g, const char *key, int32_t *out) {
    uint64_t v = 0;
    bool neg;
    dsp_status st = get_int(g, key, INT32_MIN, INT32_MAX, &v, &neg);
    if (!st) *out = (int32_t)(int64_t)v;
    return st;
}
dsp_status dsp_gguf_get_u64(const dsp_gguf *g, const char *key, uint64_t *out) {
    uint64_t v = 0;
    bool neg;
    dsp_status st = get_int(g, key, 0, UINT64_MAX, &v, &neg);
    if (!st) *out = v;
    return st;
}

dsp_status dsp_gguf_get_f32(const dsp_gguf *g, const char *key, float *out) {
    const dsp_gguf_kv *kv;
    dsp_status st = get_scalar(g, key, &kv);
    if (st) return st;
    if (kv->type != DSP_GGUF_F32 && kv->type != DSP_GGUF_F64 && !is_int_type(kv->type))
        return dsp_error(DSP_ERR_FORMAT, "key '%s' has type %s, expected a number", key, dsp_gguf_type_name(kv->type));
    *out = (float)float_at(kv->data, kv->type);
    return DSP_OK;
}

dsp_status dsp_gguf_get_bool(const dsp_gguf *g, const char *key, bool *out) {
    const dsp_gguf_kv *kv;
    dsp_status st = get_scalar(g, key, &kv);
    if (st) return st;
    if (kv->type != DSP_GGUF_BOOL) return dsp_error(DSP_ERR_FORMAT, "key '%s' has type %s, expected bool", key, dsp_gguf_type_name(kv->type));
    *out = kv->data[0] != 0;
    return DSP_OK;
}

dsp_status dsp_gguf_get_str(const dsp_gguf *g, const char *key, dsp_str *out) {
    const dsp_gguf_kv *kv;
    dsp_status st = get_scalar(g, key, &kv);
    if (st) return st;
    if (kv->type != DSP_GGUF_STRING)
        return dsp_error(DSP_ERR_FORMAT, "key '%s' has type %s, expected string", key, dsp_gguf_type_name(kv->type));
    out->len = rd_le(kv->data, 8);
    out->ptr = (const char *)kv->data + 8;
    return DSP_OK;
}

dsp_status dsp_gguf_get_arr(const dsp_gguf *g, const char *key, dsp_gguf_type elem_type, const dsp_gguf_kv **out) {
    const dsp_gguf_kv *kv = dsp_gguf_find_kv(g, key);
    if (!kv) return DSP_ERR_NOT_FOUND;
    if (kv->type != DSP_GGUF_ARRAY) return dsp_error(DSP_ERR_FORMAT, "key '%s' has type %s, expected an array", key, dsp_gguf_type_name(kv->type));
    bool ok = kv->arr_type == elem_type ||
              (is_int_type(elem_type) && (is_int_type(kv->arr_type) || kv->arr_type == DSP_GGUF_BOOL)) ||
              ((elem_type == DSP_GGUF_F32 || elem_type == DSP_GGUF_F64) && (kv->arr_type == DSP_GGUF_F32 || kv->arr_type == DSP_GGUF_F64));
    if (!ok)
        return dsp_error(DSP_ERR_FORMAT, "key '%s' is an array of %s, expected %s", key, dsp_gguf_type_name(kv->arr_type),
                         dsp_gguf_type_name(elem_type));
    *out = kv;
    return DSP_OK;
}

/* Bytes that a value of type t at p occupies. Only for values validated at open. */
static uint64_t value_bytes(const uint8_t *p, uint32_t t) {
    uint64_t sz = type_size(t);
    if (sz) return sz;
    if (t == DSP_GGUF_STRING) return 8 + rd_le(p, 8);
    uint32_t et = (uint32_t)rd_le(p, 4); /* ARRAY: u32 type, u64 count, elements */
    uint64_t n = rd_le(p + 4, 8), esz = type_size(et), off = 12;
    if (esz) return off + n * esz;
    for (uint64_t i = 0; i < n; i++) off += value_bytes(p + off, et);
    return off;
}

/* Start of element i of a STRING or ARRAY array. A nested array (from dsp_gguf_arr_sub) keeps no
 * offsets: walk it (validated at open, nesting bounded by GGUF_MAX_NESTING). */
static const uint8_t *arr_elem(const dsp_gguf_kv *kv, uint64_t i) {
    if (kv->elem_offs) return kv->data + kv->elem_offs[i];
    const uint8_t *p = kv->data;
    for (uint64_t j = 0; j < i; j++) p += value_bytes(p, kv->arr_type);
    return p;
}

dsp_str dsp_gguf_arr_str(const dsp_gguf_kv *kv, uint64_t i) {
    DSP_ASSERT(kv->type == DSP_GGUF_ARRAY && kv->arr_type == DSP_GGUF_STRING && i < kv->arr_n);
    const uint8_t *p = arr_elem(kv, i);
    dsp_str s = {(const char *)p + 8, rd_le(p, 8)};
    return s;
}

int64_t dsp_gguf_arr_int(const dsp_gguf_kv *kv, uint64_t i) {
    DSP_ASSERT(kv->type == DSP_GGUF_ARRAY && i < kv->arr_n && (is_int_type(kv->arr_type) || kv->arr_type == DSP_GGUF_BOOL));
    bool neg;
    return (int64_t)int_at(kv->data + i * type_size(kv->arr_type), kv->arr_type, &neg);
}

double dsp_gguf_arr_float(const dsp_gguf_kv *kv, uint64_t i) {
    DSP_ASSERT(kv->type == DSP_GGUF_ARRAY && i < kv->arr_n && type_size(kv->arr_type) > 0);
    return float_at(kv->data + i * type_size(kv->arr_type), kv->arr_type);
}

dsp_gguf_kv dsp_gguf_arr_sub(const dsp_gguf_kv *kv, uint64_t i) {
    DSP_ASSERT(kv->type == DSP_GGUF_ARRAY && kv->arr_type == DSP_GGUF_ARRAY && i < kv->arr_n);
    /* validated at open; a nested array's element offsets are not stored, so arr_elem walks */
    const uint8_t *p = arr_elem(kv, i);
    dsp_gguf_kv sub;
    memset(&sub, 0, sizeof sub);
    sub.type = DSP_GGUF_ARRAY;
    sub.arr_type = (dsp_gguf_type)rd_le(p, 4);
    sub.arr_n = rd_le(p + 4, 8);
    sub.data = p + 12;
    return sub;
}

void dsp_gguf_kv_format(const dsp_gguf_kv *kv, char *buf, size_t size) {
    if (!size) return;
    switch (kv->type) {
    case DSP_GGUF_STRING: {
        uint64_t n = rd_le(kv->data, 8);
        const char *s = (const char *)kv->data + 8;
        size_t shown = n > 60 ? 60 : (size_t)n, o = 0;
        o += (size_t)snprintf(buf, size, "\"");
        for (size_t i = 0; i < shown && o + 5 < size; i++) {
            unsigned char ch = (unsigned char)s[i];
            if (ch == '\n') o += (size_t)snprintf(buf + o, size - o, "\\n");
            else if (ch < 0x20 || ch == '"' || ch == '\\') o += (size_t)snprintf(buf + o, size - o, "\\x%02x", ch);
            else buf[o++] = (char)ch, buf[o] = '\0';
        }
        if (o + 2 < size) snprintf(buf + o, size - o, n > shown ? "\"... (%" PRIu64 " bytes)" : "\"", n);
        break;
    }
    case DSP_GGUF_ARRAY:
        snprintf(buf, size, "[array of %" PRIu64 " %s]", kv->arr_n, dsp_gguf_type_name(kv->arr_type));
        break;
    case DSP_GGUF_BOOL: snprintf(buf, size, "%s", kv->data[0] ? "true" : "false"); break;
    case DSP_GGUF_F32: case DSP_GGUF_F64: snprintf(buf, size, "%g", float_at(kv->data, kv->type)); break;
    default: {
        bool neg;
        uint64_t v = int_at(kv->data, kv->type, &neg);
        if (neg) snprintf(buf, size, "%" PRId64, (int64_t)v);
        else snprintf(buf, size, "%" PRIu64, v);
    }
    }
}
