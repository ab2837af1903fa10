/* core/arena: a bump allocator with one lifetime. Everything allocated from an arena is freed by
 * one dsp_arena_destroy (or dropped by dsp_arena_reset). Used for per-request and per-file data
 * whose pieces all die together. Allocation fails (NULL) past the arena's cap rather than growing
 * without bound, so a client cannot make us allocate unlimited memory. */
#ifndef DSP_CORE_ARENA_H
#define DSP_CORE_ARENA_H

#include <stddef.h>

typedef struct dsp_arena_chunk dsp_arena_chunk;
typedef struct dsp_arena {
    dsp_arena_chunk *head;  /* newest chunk first */
    size_t chunk_size;      /* default size of a new chunk */
    size_t used_total;      /* bytes handed out so far */
    size_t cap;             /* 0 = unlimited; else dsp_arena_alloc fails past it */
} dsp_arena;

void  dsp_arena_init(dsp_arena *a, size_t chunk_size, size_t cap);
void *dsp_arena_alloc(dsp_arena *a, size_t size);            /* 16-byte aligned, zeroed */
char *dsp_arena_strndup(dsp_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void  dsp_arena_reset(dsp_arena *a);                          /* free everything, keep settings */
void  dsp_arena_destroy(dsp_arena *a);

#endif
