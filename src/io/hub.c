/* io/hub: see hub.h. */
#include "io/hub.h"

#include "core/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool id_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

/* a name part: 1..96 id characters, not starting with '.' or '-', no "..", not ending with '.' */
static bool part_ok(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-' || s[n - 1] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!id_char(s[i]) || (i && s[i] == '.' && s[i - 1] == '.')) return false;
    return true;
}

static bool rev_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= DSP_HUB_MAX_ID || s[0] == '.' || strstr(s, "..")) return false;
    for (size_t i = 0; i < n; i++)
        if (!id_char(s[i]) && s[i] != '/') return false; /* branches may contain '/' (refs/pr/1) */
    return true;
}

dsp_status dsp_hub_parse(const char *s, dsp_hub_repo *r) {
    memset(r, 0, sizeof *r);
    const char *slash = strchr(s, '/'), *at = strchr(s, '@');
    size_t end = at ? (size_t)(at - s) : strlen(s);
    if (!slash || (size_t)(slash - s) >= end || memchr(slash + 1, '/', end - (size_t)(slash - s) - 1))
        return dsp_error(DSP_ERR_INVALID_ARG, "'%.200s' is not a repo id of the form org/name[@revision]", s);
    size_t lo = (size_t)(slash - s), ln = end - lo - 1;
    if (!part_ok(s, lo) || !part_ok(slash + 1, ln))
        return dsp_error(DSP_ERR_INVALID_ARG, "'%.200s': repo ids are letters, digits, '-', '_' and '.'", s);
    memcpy(r->org, s, lo);
    memcpy(r->name, slash + 1, ln);
    snprintf(r->rev, sizeof r->rev, "%s", at ? at + 1 : "main");
    if (!rev_ok(r->rev)) return dsp_error(DSP_ERR_INVALID_ARG, "'%.200s': bad revision '%.100s'", s, r->rev);
    return DSP_OK;
}

bool dsp_hub_is_repo_id(const char *s) {
    dsp_hub_repo r;
    if (s[0] == '.' || s[0] == '/' || s[0] == '~') return false; /* a path */
    bool ok = dsp_hub_parse(s, &r) == DSP_OK;
    dsp_error_clear();
    return ok;
}

bool dsp_hub_is_commit(const char *rev) {
    if (strlen(rev) != 40) return false;
    for (int i = 0; i < 40; i++)
        if (!((rev[i] >= '0' && rev[i] <= '9') || (rev[i] >= 'a' && rev[i] <= 'f'))) return false;
    return true;
}

dsp_status dsp_hub_cache_root(char **out) {
    const char *e;
    char *p = NULL;
    if ((e = getenv("HF_HUB_CACHE")) && *e) p = strdup(e);
    else if ((e = getenv("HF_HOME")) && *e) p = dsp_path_join(e, "hub");
    else if ((e = getenv("XDG_CACHE_HOME")) && *e) p = dsp_path_join(e, "huggingface/hub");
    else if ((e = getenv("HOME")) && *e) p = dsp_path_join(e, ".cache/huggingface/hub");
    else return dsp_error(DSP_ERR_NOT_FOUND, "no Hugging Face cache: set HF_HOME (or HOME)");
    *out = p;
    return p ? DSP_OK : dsp_error(DSP_ERR_NOMEM, "no memory");
}

dsp_status dsp_hub_repo_dir(const dsp_hub_repo *r, char **out) {
    char *root;
    dsp_status st = dsp_hub_cache_root(&root);
    if (st) return st;
    char leaf[2 * DSP_HUB_MAX_ID + 16];
    snprintf(leaf, sizeof leaf, "models--%s--%s", r->org, r->name);
    *out = dsp_path_join(root, leaf);
    free(root);
    return *out ? DSP_OK : dsp_error(DSP_ERR_NOMEM, "no memory");
}

dsp_status dsp_hub_resolve_cached(const char *s, char **out) {
    *out = NULL;
    dsp_hub_repo r;
    dsp_status st = dsp_hub_parse(s, &r);
    if (st) return st;
    char *repo;
    if ((st = dsp_hub_repo_dir(&r, &repo))) return st;
    char commit[64] = "";
    if (dsp_hub_is_commit(r.rev)) {
        snprintf(commit, sizeof commit, "%.40s", r.rev); /* a commit id: 40 hex digits */
    } else {
        char ref[DSP_HUB_MAX_ID + 8];
        snprintf(ref, sizeof ref, "refs/%s", r.rev);
        char *rp = dsp_path_join(repo, ref), *txt = NULL;
        size_t n = 0;
        st = rp ? dsp_file_read(rp, 4096, &txt, &n) : dsp_error(DSP_ERR_NOMEM, "no memory");
        free(rp);
        if (st) {
            dsp_error(DSP_ERR_NOT_FOUND, "%s is not in the Hugging Face cache (%s/%s missing); `dspark pull %s` downloads it", s, repo, ref, s);
            free(repo);
            return DSP_ERR_NOT_FOUND;
        }
        while (n && (txt[n - 1] == '\n' || txt[n - 1] == '\r' || txt[n - 1] == ' ')) txt[--n] = '\0';
        bool ok = dsp_hub_is_commit(txt);
        if (ok) snprintf(commit, sizeof commit, "%.40s", txt);
        free(txt);
        if (!ok) {
            free(repo);
            return dsp_error(DSP_ERR_FORMAT, "%s: the cache's refs/%s does not hold a commit id", s, r.rev);
        }
    }
    char snap[128];
    snprintf(snap, sizeof snap, "snapshots/%s", commit);
    *out = dsp_path_join(repo, snap);
    free(repo);
    if (!*out) return dsp_error(DSP_ERR_NOMEM, "no memory");
    if (!dsp_file_is_dir(*out)) {
        st = dsp_error(DSP_ERR_NOT_FOUND, "%s: snapshot %s is not in the Hugging Face cache; `dspark pull %s` downloads it", s, *out, s);
        free(*out);
        *out = NULL;
        return st;
    }
    return DSP_OK;
}
