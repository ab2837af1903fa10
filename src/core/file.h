/* core/file: read-only file mappings and whole-file reads, with errors naming the path.
 *
 * Weight files are mmapped (never read into memory) and live as long as their mapping; small files
 * (config.json, tokenizer.json, templates, prompts, contexts) are read whole, up to a caller-given
 * size limit that is checked before the data grows past it. */
#ifndef DSP_CORE_FILE_H
#define DSP_CORE_FILE_H

#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsp_file_map {
    const uint8_t *data;
    uint64_t size;
    void *map;        /* the mmap (NULL for an empty file) */
    size_t map_size;
} dsp_file_map;

/* Map a regular, non-empty file read-only. On failure *m is zeroed and the message names path. */
dsp_status dsp_file_map_open(const char *path, dsp_file_map *m);
void dsp_file_map_close(dsp_file_map *m);

/* Give back this process's resident pages of [p, p + n) when the range lies inside a mapping made by
 * dsp_file_map_open (the whole pages within it; MADV_DONTNEED): a later read faults them in again
 * from the file, unchanged. For data that was copied elsewhere (a backend's repacked weights) and is
 * read rarely or never after. Anything else (heap memory, an unknown range) is left alone; returns
 * whether pages were given back. */
bool dsp_file_drop_pages(const void *p, size_t n);

/* Make every page of [p, p + n) resident now (MADV_POPULATE_WRITE; where the kernel lacks it, a
 * read-and-write-back of one byte per page: the contents are unchanged), so that memory allocated
 * lazily (a large calloc) is counted and committed at once rather than as it is first used. False
 * when the kernel reports it cannot provide the pages (ENOMEM). Under overcommit the kernel's OOM
 * killer may act instead; either way now, not later under load. */
bool dsp_mem_populate(void *p, size_t n);

/* n zeroed bytes in their own anonymous mapping (NULL when none): a large buffer that never lands
 * in malloc's heap, so its pages go back to the system when it is released (dsp_mem_unmap with the
 * same n) instead of staying resident as free heap that later allocations reuse. An inaccessible
 * page on either side keeps the kernel from merging it with a neighbouring mapping (so
 * /proc/PID/smaps shows it at its own size: test_engine finds the K/V pool that way) and turns an
 * overrun into a fault. */
void *dsp_mem_map(size_t n);
void dsp_mem_unmap(void *p, size_t n);

/* Read all of `path` ("-" reads standard input) into a malloc'd buffer with a NUL after the last
 * byte (the data itself may contain NULs); *len (may be NULL) gets the byte count. A file larger
 * than max_bytes is refused with DSP_ERR_RANGE; errors name the path. Works on pipes too. */
dsp_status dsp_file_read(const char *path, size_t max_bytes, char **out, size_t *len);

bool dsp_file_is_dir(const char *path);
bool dsp_file_exists(const char *path); /* a regular file (after following links) */
/* dir + "/" + name into a malloc'd string (NULL on no memory) */
char *dsp_path_join(const char *dir, const char *name);

#endif
