/* core/file: read-only file mappings and small whole-file reads, with errors naming the path.
 *
 * Weight files are mmapped (never read into memory) and live as long as their mapping; JSON side
 * files (config.json, tokenizer.json, ...) are read whole, up to a caller-given size limit that is
 * checked before anything is allocated. */
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

/* Read a whole regular file into a malloc'd, NUL-terminated buffer. A file larger than max_bytes
 * is DSP_ERR_RANGE (nothing is read). */
dsp_status dsp_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len);

bool dsp_file_is_dir(const char *path);
bool dsp_file_exists(const char *path); /* a regular file (after following links) */
/* dir + "/" + name into a malloc'd string (NULL on no memory) */
char *dsp_path_join(const char *dir, const char *name);

#endif
