/* server/metrics: GET /metrics in Prometheus' text exposition format (version 0.0.4).
 *
 * Counters are updated lock-free (atomics) by the connection threads (requests by route and
 * status) and by the engine thread when a request finishes (tokens, latencies, speculation);
 * /metrics reads them without stopping anything. What only the engine knows (KV blocks used /
 * cached, prefix-cache hits, requests waiting and running) comes from dsp_engine_get_stats,
 * copied by the engine thread after every round into s->engine_stats.
 *
 * Names (all prefixed dspark_):
 *   requests_total{endpoint, status}       counter
 *   prompt_tokens_total, completion_tokens_total, prompt_tokens_cached_total   counters
 *   time_to_first_token_seconds            histogram (one observation per request)
 *   inter_token_latency_seconds            histogram (per request: its mean gap, counted once per gap)
 *   queue_depth, requests_running          gauges (the inbox + the engine's waiting; the engine's running)
 *   kv_blocks_used, kv_blocks_cached, kv_blocks_total, prefix_cache_hit_tokens_total (engine)
 *   spec_rounds_total, spec_drafted_tokens_total, spec_accepted_tokens_total  counters
 *   spec_accepted_length                   histogram of tokens decided per verify round (1 = no draft accepted)
 *   connections_open                       gauge (the front door's count) */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_endpoints[DSP_SRV_N_ENDPOINTS] = {"other", "chat_completions", "completions", "messages", "count_tokens",
                                                             "responses", "models", "metrics", "page"};
static const double k_ttft_b[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double k_itl_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

dsp_status dsp_srv_metrics_create(dsp_srv *s) {
    s->metrics = calloc(1, sizeof *s->metrics);
    return s->metrics ? DSP_OK : DSP_ERR_NOMEM;
}

void dsp_srv_metrics_destroy(dsp_srv *s) {
    free(s->metrics);
    s->metrics = NULL;
}

void dsp_srv_metrics_request(dsp_srv *s, int endpoint, int status) {
    if (!s || !s->metrics) return;
    if (endpoint < 0 || endpoint >= DSP_SRV_N_ENDPOINTS) endpoint = 0;
    if (status < 100 || status > 599) status = 500;
    atomic_fetch_add(&s->metrics->requests[endpoint][status - 100], 1);
}

static void observe(atomic_uint_fast64_t *buckets, const double *b, int nb, atomic_uint_fast64_t *sum_us, atomic_uint_fast64_t *count, double x,
                    uint64_t times) {
    int i = 0;
    while (i < nb && x > b[i]) i++;
    atomic_fetch_add(&buckets[i], times); /* [nb] = +Inf */
    atomic_fetch_add(sum_us, (uint64_t)(x * 1e6) * times);
    atomic_fetch_add(count, times);
}

void dsp_srv_metrics_finished(dsp_srv *s, const dsp_gen_result *g, double ttft_ms) {
    dsp_srv_metrics *m = s->metrics;
    if (!m) return;
    atomic_fetch_add(&m->prompt_tokens, g->n_prompt);
    atomic_fetch_add(&m->completion_tokens, g->n_generated);
    atomic_fetch_add(&m->cached_tokens, g->n_cached);
    if (g->n_generated > 0 && ttft_ms > 0)
        observe(m->ttft, k_ttft_b, (int)(sizeof k_ttft_b / sizeof *k_ttft_b), &m->ttft_sum_us, &m->ttft_count, ttft_ms / 1e3, 1);
    if (g->n_generated > 1 && g->decode_ms > 0)
        observe(m->itl, k_itl_b, (int)(sizeof k_itl_b / sizeof *k_itl_b), &m->itl_sum_us, &m->itl_count,
                g->decode_ms / 1e3 / (double)(g->n_generated - 1), g->n_generated - 1);
    atomic_fetch_add(&m->spec_rounds, g->n_rounds);
    atomic_fetch_add(&m->spec_drafted, g->n_drafted);
    atomic_fetch_add(&m->spec_accepted, g->n_accepted);
    for (int k = 1; k <= DSP_MAX_DRAFT + 1; k++)
        if (g->accept_hist[k]) atomic_fetch_add(&m->accept_hist[k], g->accept_hist[k]);
}

static void hist(dsp_srv_sbuf *b, const char *name, const char *help, const double *bounds, int nb, atomic_uint_fast64_t *buckets,
                 atomic_uint_fast64_t *sum_us, atomic_uint_fast64_t *count) {
    char line[256];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    dsp_srv_sb_add(b, line, strlen(line));
    uint64_t cum = 0;
    for (int i = 0; i <= nb; i++) {
        cum += atomic_load(&buckets[i]);
        if (i < nb) snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
        else snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
        dsp_srv_sb_add(b, line, strlen(line));
    }
    snprintf(line, sizeof line, "%s_sum %.6f\n%s_count %llu\n", name, (double)atomic_load(sum_us) / 1e6, name, (unsigned long long)atomic_load(count));
    dsp_srv_sb_add(b, line, strlen(line));
}

static void scalar(dsp_srv_sbuf *b, const char *name, const char *type, const char *help, double v) {
    char line[320];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    dsp_srv_sb_add(b, line, strlen(line));
}

char *dsp_srv_metrics_text(dsp_srv *s) {
    dsp_srv_metrics *m = s->metrics;
    dsp_srv_sbuf b = {0};
    char line[256];
    const char *h = "# HELP dspark_requests_total HTTP requests answered, by endpoint and status.\n# TYPE dspark_requests_total counter\n";
    dsp_srv_sb_add(&b, h, strlen(h));
    for (int e = 0; e < DSP_SRV_N_ENDPOINTS; e++)
        for (int c = 0; c < 500; c++) {
            uint64_t v = atomic_load(&m->requests[e][c]);
            if (!v) continue;
            snprintf(line, sizeof line, "dspark_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", k_endpoints[e], c + 100, (unsigned long long)v);
            dsp_srv_sb_add(&b, line, strlen(line));
        }
    scalar(&b, "dspark_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", (double)atomic_load(&m->prompt_tokens));
    scalar(&b, "dspark_completion_tokens_total", "counter", "Generated tokens of finished requests.", (double)atomic_load(&m->completion_tokens));
    scalar(&b, "dspark_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV was reused instead of computed.",
           (double)atomic_load(&m->cached_tokens));
    hist(&b, "dspark_time_to_first_token_seconds", "Time from enqueueing a request to its first token.", k_ttft_b,
         (int)(sizeof k_ttft_b / sizeof *k_ttft_b), m->ttft, &m->ttft_sum_us, &m->ttft_count);
    hist(&b, "dspark_inter_token_latency_seconds", "Time between generated tokens (each request's mean gap, once per gap).", k_itl_b,
         (int)(sizeof k_itl_b / sizeof *k_itl_b), m->itl, &m->itl_sum_us, &m->itl_count);
    pthread_mutex_lock(&s->q_mu);
    dsp_srv_engine_stats es = s->engine_stats;
    int q = s->q_len + (int)es.waiting, running = (int)es.running;
    pthread_mutex_unlock(&s->q_mu);
    scalar(&b, "dspark_queue_depth", "gauge", "Requests waiting for the engine.", q);
    scalar(&b, "dspark_requests_running", "gauge", "Requests the engine is generating.", running);
    scalar(&b, "dspark_connections_open", "gauge", "Client connections open.", dsp_srv_door_open(s));
    if (es.kv_valid) {
        scalar(&b, "dspark_kv_blocks_used", "gauge", "KV cache blocks holding live sequences.", (double)es.kv_blocks_used);
        scalar(&b, "dspark_kv_blocks_cached", "gauge", "KV cache blocks kept for prefix reuse.", (double)es.kv_blocks_cached);
        scalar(&b, "dspark_kv_blocks_total", "gauge", "KV cache blocks in the pool.", (double)es.kv_blocks_total);
        scalar(&b, "dspark_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.", (double)es.prefix_hit_tokens);
        scalar(&b, "dspark_rounds_total", "counter", "Engine rounds (one target forward each).", (double)es.rounds);
        scalar(&b, "dspark_forward_rows_total", "counter", "Rows (tokens) of the rounds' target forwards.", (double)es.forward_rows);
        scalar(&b, "dspark_forward_seconds_total", "counter", "Time in the rounds' target forwards.", es.forward_ms / 1e3);
        scalar(&b, "dspark_round_host_seconds_total", "counter",
               "Time in the rounds outside the forward (drafting, verification, sampling, detokenization, events).", es.host_ms / 1e3);
        h = "# HELP dspark_round_cost_scale --max-draft auto's calibration: measured / profiled time of recent decode-only rounds, by kind.\n"
            "# TYPE dspark_round_cost_scale gauge\n";
        dsp_srv_sb_add(&b, h, strlen(h));
        static const char *const kinds[3] = {"plain", "lookup", "block"};
        for (int k = 0; k < 3; k++) {
            snprintf(line, sizeof line, "dspark_round_cost_scale{kind=\"%s\"} %.4f\n", kinds[k], es.cost_scale[k]);
            dsp_srv_sb_add(&b, line, strlen(line));
        }
    }
    scalar(&b, "dspark_spec_rounds_total", "counter", "Target forwards that decided tokens (speculation rounds).", (double)atomic_load(&m->spec_rounds));
    scalar(&b, "dspark_spec_drafted_tokens_total", "counter", "Draft tokens proposed and verified.", (double)atomic_load(&m->spec_drafted));
    scalar(&b, "dspark_spec_accepted_tokens_total", "counter", "Draft tokens accepted.", (double)atomic_load(&m->spec_accepted));
    h = "# HELP dspark_spec_accepted_length Tokens decided per verify round (accepted drafts + 1).\n# TYPE dspark_spec_accepted_length histogram\n";
    dsp_srv_sb_add(&b, h, strlen(h));
    uint64_t cum = 0, sum = 0;
    for (int k = 1; k <= DSP_MAX_DRAFT + 1; k++) {
        uint64_t v = atomic_load(&m->accept_hist[k]);
        cum += v, sum += v * (uint64_t)k;
        if (k <= 8 || k == 16 || k == DSP_MAX_DRAFT + 1) {
            snprintf(line, sizeof line, "dspark_spec_accepted_length_bucket{le=\"%d\"} %llu\n", k, (unsigned long long)cum);
            dsp_srv_sb_add(&b, line, strlen(line));
        }
    }
    snprintf(line, sizeof line, "dspark_spec_accepted_length_bucket{le=\"+Inf\"} %llu\ndspark_spec_accepted_length_sum %llu\ndspark_spec_accepted_length_count %llu\n",
             (unsigned long long)cum, (unsigned long long)sum, (unsigned long long)cum);
    dsp_srv_sb_add(&b, line, strlen(line));
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
