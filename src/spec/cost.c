/* spec/cost: see cost.h. */
#include "spec/cost.h"

#include "core/log.h"
#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define DECAY 0.9f

void dsp_accept_round(dsp_accept *a, int32_t k, int32_t acc) {
    a->s *= DECAY, a->t *= DECAY;
    if (k <= 0) return;
    a->s += (float)acc;
    a->t += (float)acc + (acc < k ? 1.0f : 0.0f);
}

float dsp_accept_p(const dsp_accept *a) { return (a->s + 1.0f) / (a->t + 2.0f); }

#define DECAY_POOL 0.99f

void dsp_accept_pool(dsp_accept *pool, int32_t k, int32_t acc) {
    if (k <= 0) return; /* rounds without drafts say nothing about the drafter */
    pool->s = pool->s * DECAY_POOL + (float)acc;
    pool->t = pool->t * DECAY_POOL + (float)acc + (acc < k ? 1.0f : 0.0f);
}

void dsp_accept_init_prior(dsp_accept *a, const dsp_accept *pool) {
    float p = dsp_accept_p(pool);
    a->s = DSP_ACCEPT_PRIOR_W * p, a->t = DSP_ACCEPT_PRIOR_W;
}

float dsp_cost_time(const dsp_spec_profile *p, int rows, double extra_keys) {
    float t;
    if (p->n <= 0) { /* no curve: a mild linear guess */
        t = 1.0f + 0.1f * (float)(rows - 1);
    } else if (rows <= p->rows[0]) {
        t = p->rel[0];
    } else if (rows >= p->rows[p->n - 1]) { /* extrapolate with the last segment's slope */
        int i = p->n - 1;
        float slope = i > 0 ? (p->rel[i] - p->rel[i - 1]) / (float)(p->rows[i] - p->rows[i - 1]) : 0.1f;
        t = p->rel[i] + slope * (float)(rows - p->rows[i]);
    } else {
        int i = 1;
        while (p->rows[i] < rows) i++;
        float f = (float)(rows - p->rows[i - 1]) / (float)(p->rows[i] - p->rows[i - 1]);
        t = p->rel[i - 1] + f * (p->rel[i] - p->rel[i - 1]);
    }
    double ctx = (double)p->ctx_rel_per_key * extra_keys;
    return t + (float)(ctx > 0 ? ctx : 0);
}

static float surv(const dsp_cost_req *r, int i) { /* expected survival of draft i (1-based) */
    return r->a ? r->a[i - 1] : powf(r->p, (float)i);
}

double dsp_cost_rate(const dsp_spec_profile *p, int base_rows, float cost, float acc_p, int32_t k) {
    if (base_rows < 1) base_rows = 1;
    double tokens = base_rows, a = 1, best = 0;
    for (int32_t j = 1; j <= k; j++) {
        tokens += (a *= acc_p);
        double r = tokens / ((double)cost + dsp_cost_time(p, base_rows + j, 0));
        if (r > best) best = r;
    }
    return k > 0 ? best : (double)base_rows / ((double)cost + dsp_cost_time(p, base_rows, 0));
}

/* The next candidate of the ranking: the largest survival, ties to the shorter prefix (then the
 * earlier request); -1 when none is left. */
static int next_candidate(const dsp_cost_req *reqs, int n, float *aq) {
    int q = -1;
    *aq = 0;
    for (int j = 0; j < n; j++) {
        const dsp_cost_req *r = &reqs[j];
        if (r->k >= r->kmax) continue;
        float a = surv(r, r->k + 1);
        if (a > *aq || (a == *aq && q >= 0 && r->k < reqs[q].k)) q = j, *aq = a;
    }
    return *aq > 0 ? q : -1;
}

static double extra_keys_of(const dsp_spec_profile *p, const dsp_cost_req *r) {
    return (double)r->ctx > (double)p->ctx_tokens ? (double)r->ctx - (double)p->ctx_tokens : 0;
}

void dsp_cost_choose(const dsp_spec_profile *p, int base_rows, double base_extra_keys, int n_tokens, float sunk_cost, float draft_cost,
                     dsp_cost_req *reqs, int n) {
    dsp_cost_choose_max(p, base_rows, base_extra_keys, n_tokens, sunk_cost, draft_cost, 1.0f, reqs, n, -1);
}

void dsp_cost_choose_max(const dsp_spec_profile *p, int base_rows, double base_extra_keys, int n_tokens, float sunk_cost, float draft_cost,
                         float draft_scale, dsp_cost_req *reqs, int n, int max_drafts) {
    for (int j = 0; j < n; j++) reqs[j].k = 0;
    /* pass 1: walk the whole ranking, remember the length of its best prefix */
    double tokens = n_tokens, extra = base_extra_keys;
    int rows = base_rows, taken = 0, best_taken = 0;
    const double base = tokens / ((double)sunk_cost + dsp_cost_time(p, rows, extra));
    double best = base;
    for (;;) {
        float aq;
        int q = max_drafts >= 0 && taken >= max_drafts ? -1 : next_candidate(reqs, n, &aq);
        if (q < 0) break;
        tokens += aq, extra += extra_keys_of(p, &reqs[q]), rows++, taken++;
        reqs[q].k++;
        double rate = tokens / ((double)draft_scale * ((double)sunk_cost + (double)draft_cost + dsp_cost_time(p, rows, extra)));
        if (rate > best) best = rate, best_taken = taken;
    }
    /* drafting at all must promise a margin over drafting nothing: the drafts that win the ranking
     * are the ones whose estimates came out high, so their realized acceptance is lower (without it,
     * 8 clients on the default model: about 0.6 tokens per draft row, break-even there, 0.98x baseline) */
    if (best_taken > 0 && best < (1.0 + DSP_COST_MARGIN) * base) best_taken = 0;
    /* pass 2: take that prefix (the ranking is deterministic, so it is the same one) */
    for (int j = 0; j < n; j++) reqs[j].k = 0;
    for (int t = 0; t < best_taken; t++) {
        float aq;
        int q = next_candidate(reqs, n, &aq);
        reqs[q].k++;
    }
}

/* ---- the profile cache ------------------------------------------------------------------------ */

void dsp_cost_cache_path(const char *key, char *path, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[400];
    if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/dspark", xdg);
    else snprintf(dir, sizeof dir, "%s/.cache/dspark", home && *home ? home : ".");
    snprintf(path, cap, "%s/profile-%016llx.json", dir, (unsigned long long)XXH64(key, strlen(key), 0));
}

bool dsp_cost_cache_read(const char *path, const char *key, dsp_spec_profile *p) {
    json_t *j = NULL;
    if (access(path, R_OK) || dsp_json_load_file(path, 1 << 20, &j)) {
        dsp_error_clear();
        return false;
    }
    dsp_spec_profile q;
    memset(&q, 0, sizeof q);
    const char *k = NULL;
    const json_t *rows = dsp_json_at(j, "rows"), *rel = dsp_json_at(j, "rel");
    double v[6];
    bool ok = !dsp_json_str(j, "key", &k) && !strcmp(k, key) && json_is_array(rows) && json_is_array(rel) &&
              json_array_size(rows) == json_array_size(rel) && json_array_size(rows) >= 1 && json_array_size(rows) <= DSP_PROFILE_MAX &&
              !dsp_json_num(j, "one_row_ms", &v[0]) && !dsp_json_num(j, "ctx_tokens", &v[1]) && !dsp_json_num(j, "ctx_rel_per_key", &v[2]) &&
              !dsp_json_num(j, "draft_rel", &v[3]) && !dsp_json_num(j, "draft_rel_per_req", &v[4]) && !dsp_json_num(j, "draft_ctx_rel", &v[5]);
    if (ok) {
        q.n = (int32_t)json_array_size(rows);
        for (int i = 0; i < q.n && ok; i++) {
            const json_t *a = json_array_get(rows, (size_t)i), *b = json_array_get(rel, (size_t)i);
            ok = json_is_integer(a) && json_is_number(b) && json_integer_value(a) >= 1 && json_integer_value(a) <= 65536 &&
                 (i == 0 || json_integer_value(a) > q.rows[i - 1]) && json_number_value(b) > 0 && json_number_value(b) < 1e6;
            if (ok) q.rows[i] = (int32_t)json_integer_value(a), q.rel[i] = (float)json_number_value(b);
        }
        ok = ok && v[0] > 0 && v[1] >= 0 && v[1] < 1e9 && v[2] >= 0 && v[2] < 1 && v[3] >= 0 && v[3] < 1e3 && v[4] >= 0 && v[4] < 1e3 && v[5] >= 0 && v[5] < 1e3;
    }
    json_decref(j);
    if (!ok) return false;
    q.one_row_ms = v[0], q.ctx_tokens = (uint32_t)v[1], q.ctx_rel_per_key = (float)v[2], q.draft_rel = (float)v[3], q.draft_rel_per_req = (float)v[4];
    q.draft_ctx_rel = (float)v[5];
    q.cached = true;
    snprintf(q.cache_path, sizeof q.cache_path, "%s", path);
    *p = q;
    return true;
}

void dsp_cost_cache_write(const char *path, const char *key, const dsp_spec_profile *p) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return;
    *slash = '\0';
    char *parent = strrchr(dir, '/');
    if (parent) { /* ~/.cache may not exist yet */
        *parent = '\0';
        if (mkdir(dir, 0755) && errno != EEXIST) return;
        *parent = '/';
    }
    if (mkdir(dir, 0755) && errno != EEXIST) return;
    json_t *rows = json_array(), *rel = json_array();
    for (int i = 0; i < p->n; i++) json_array_append_new(rows, json_integer(p->rows[i])), json_array_append_new(rel, json_real(p->rel[i]));
    json_t *j = json_pack("{s:s, s:o, s:o, s:f, s:i, s:f, s:f, s:f, s:f}", "key", key, "rows", rows, "rel", rel, "one_row_ms", p->one_row_ms,
                          "ctx_tokens", (int)p->ctx_tokens, "ctx_rel_per_key", (double)p->ctx_rel_per_key, "draft_rel",
                          (double)p->draft_rel, "draft_rel_per_req", (double)p->draft_rel_per_req, "draft_ctx_rel", (double)p->draft_ctx_rel);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (j && !json_dump_file(j, tmp, JSON_INDENT(1)) && rename(tmp, path)) unlink(tmp);
    json_decref(j);
    DSP_LOGD("spec profile written to %s", path);
}
