/* io/pull: `dspark pull`: download a Hugging Face repo into the hub cache that transformers, vLLM
 * and mlx-lm share (the layout of io/hub.h), with libcurl.
 *
 * The protocol is the hub's, as huggingface_hub speaks it:
 *  1. GET {endpoint}/api/models/{org}/{name}/revision/{rev}?blobs=true: the commit ("sha") the
 *     revision points at and the files ("siblings": rfilename, size, blobId, lfs.sha256);
 *  2. per file, HEAD {endpoint}/{org}/{name}/resolve/{commit}/{file} without following absolute
 *     redirects (relative ones, a renamed repo, are followed): X-Repo-Commit, the etag
 *     (X-Linked-Etag for LFS files, else ETag), the size (X-Linked-Size, else Content-Length) and
 *     Location (the CDN URL of an LFS file);
 *  3. GET the bytes into blobs/{etag}.incomplete, resuming a partial file with Range, retrying a
 *     dropped connection from where it stopped; verify the size and the etag: the SHA-256 of the
 *     bytes for an LFS file (64 hex digits), the git blob SHA-1 ("blob <size>\0" + bytes) for
 *     the others (40); rename into blobs/{etag} (atomic), link snapshots/{commit}/{file} to it
 *     (relative symlink), and write refs/{rev} = commit when rev is a branch or tag.
 * A blob already in the cache is not downloaded again. Environment: HF_ENDPOINT (default
 * https://huggingface.co), HF_TOKEN (else the token file $HF_TOKEN_PATH or $HF_HOME/token) sent as
 * "Authorization: Bearer" to the endpoint only, HF_HUB_OFFLINE (1/ON/YES/TRUE: no network at all;
 * the revision must already be in the cache), HF_HUB_CACHE / HF_HOME (the cache, io/hub.h), and
 * libcurl's usual proxy variables. Everything the server sends is untrusted: file names must be
 * plain relative paths, etags hex digests, sizes and JSON bounded. */
#ifndef DSP_IO_PULL_H
#define DSP_IO_PULL_H

#include "core/status.h"

#include <stdbool.h>

typedef struct dsp_pull_params {
    const char *const *include; /* (n_include) shell globs (fnmatch, '*' also matches '/'): files
                                   matching one are pulled; none given = every file */
    int n_include;
    int report;                 /* on stderr: 0 nothing, 1 a line per file, 2 a progress bar per file
                                   (the CLI's choice on a terminal) */
    int retries;                /* attempts after a dropped or stalled transfer (0: the default, 5) */
} dsp_pull_params;

/* Pull repo_id ("org/name[@revision]") into the cache; *snapshot (malloc'd) is its snapshot
 * directory, which dsp_model_load accepts, as it accepts the repo id. Errors name the repo, the
 * file and what the server said (401: a token is needed; 403: not granted; 404: no such repo,
 * revision or file), or what did not verify. A failed file leaves its .incomplete part for the
 * next pull to resume, unless its bytes were wrong. */
dsp_status dsp_pull_repo(const char *repo_id, const dsp_pull_params *p, char **snapshot);

#endif
