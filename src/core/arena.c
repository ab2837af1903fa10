/* core/arena: see arena.h. */
#include "core/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct dsp_arena_chunk {
    dsp_arena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void dsp_arena_init(dsp_arena *a, size_t chunk_size, size_t cap) {
    a->head = NULL;
    a->chunk_size = chunk_size ? chunk_size : 64 * 1024;
    a->used_total = 0;
    a->cap = cap;
}

void *dsp_arena_alloc(dsp_arena *a, size_t size) {
    size_t need = (size + 15) & ~(size_t)15;
    if (need < size) return NULL; /* overflow */
    if (a->cap && (need > a->cap || a->used_total > a->cap - need)) return NULL;
    dsp_arena_chunk *c = a->head;
    if (!c || c->size - c->used < need) {
        size_t csz = need > a->chunk_size ? need : a->chunk_size;
        if (csz > SIZE_MAX - sizeof *c) return NULL;
        c = malloc(sizeof *c + csz);
        if (!c) return NULL;
        c->size = csz;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += need;
    a->used_total += need;
    memset(p, 0, size);
    return p;
}

char *dsp_arena_strndup(dsp_arena *a, const char *s, size_t n) {
    if (n == SIZE_MAX) return NULL;
    char *p = dsp_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void dsp_arena_reset(dsp_arena *a) {
    dsp_arena_chunk *c = a->head;
    while (c) {
        dsp_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used_total = 0;
}

void dsp_arena_destroy(dsp_arena *a) { dsp_arena_reset(a); }
