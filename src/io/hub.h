/* io/hub: Hugging Face repo ids and the hub cache that transformers, vLLM and mlx-lm share.
 *
 * A repo id is "org/name" with an optional "@revision" (a branch, a tag or a 40-hex commit).
 * The cache root is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub. A repo lives in ROOT/models--org--name/ with
 *   refs/REV          the commit a branch or tag points at (one line of 40 hex digits)
 *   snapshots/COMMIT/ the files of that commit (links into blobs/)
 *   blobs/ETAG        the file contents, named by their etag (the LFS SHA-256 or the git blob id)
 * dsp_hub_resolve_cached finds a snapshot without any network; `dspark pull` (pull.c) fills the
 * cache in the same layout. */
#ifndef DSP_IO_HUB_H
#define DSP_IO_HUB_H

#include "core/status.h"

#include <stdbool.h>

#define DSP_HUB_MAX_ID 200

typedef struct dsp_hub_repo {
    char org[DSP_HUB_MAX_ID], name[DSP_HUB_MAX_ID];
    char rev[DSP_HUB_MAX_ID]; /* "main" when not given */
} dsp_hub_repo;

/* true if s has the shape of a repo id (it may still not be in the cache) */
bool dsp_hub_is_repo_id(const char *s);
dsp_status dsp_hub_parse(const char *s, dsp_hub_repo *r);
bool dsp_hub_is_commit(const char *rev); /* 40 lowercase hex digits */
/* malloc'd cache root (need not exist) */
dsp_status dsp_hub_cache_root(char **out);
/* malloc'd ROOT/models--org--name */
dsp_status dsp_hub_repo_dir(const dsp_hub_repo *r, char **out);
/* malloc'd snapshot directory of the repo id s; DSP_ERR_NOT_FOUND naming what is missing. */
dsp_status dsp_hub_resolve_cached(const char *s, char **out);

#endif
