/* core/file: reading a whole file into memory, written once (templates, prompts, contexts). */
#ifndef DSP_CORE_FILE_H
#define DSP_CORE_FILE_H

#include "core/status.h"

#include <stddef.h>

/* Read all of `path` ("-" reads standard input) into a malloc'd buffer with a NUL after the last
 * byte (the data itself may contain NULs); *len (may be NULL) gets the byte count. A file larger
 * than max_bytes is refused with DSP_ERR_RANGE; errors name the path. Works on pipes too. */
dsp_status dsp_file_read(const char *path, size_t max_bytes, char **out, size_t *len);

#endif
