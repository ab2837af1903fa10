/* server/server: the server's lifetime: load the model, create the engine, start the engine
 * thread and the HTTP daemon; tear down in the reverse order. */
#include "server/server.h"

#include "core/file.h"
#include "core/version.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void dsp_srv_config_default(dsp_srv_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->default_max_tokens = 2048;
    c->max_tokens_cap = 32768;
    c->max_queue = 64;
    c->max_body = (size_t)8 << 20;
    c->idle_timeout_s = 60;
    c->request_timeout_s = 10;
    c->keepalive_s = 15;
    c->max_connections_per_client = 32;
    c->shutdown_timeout_s = 10;
    c->max_connections = 256;
    c->spec = dsp_gen_default_params();
    c->spec.mode = DSP_SPEC_AUTO;
    /* many requests share each forward: a fixed draft length costs more rows than it saves once the
     * batch fills (README "--max-draft auto"); auto drafts only what pays at the round's row count */
    c->spec.max_draft = DSP_DRAFT_AUTO;
    c->cp = dsp_engine_default_params();
    c->cp.max_batch = 8;
    c->cp.reserve_memory = true; /* the KV pool resident from the start: RSS does not grow with the cache */
}

dsp_status dsp_srv_create(const dsp_srv_config *cfg, dsp_srv **out) {
    *out = NULL;
    dsp_srv *s = calloc(1, sizeof *s);
    if (!s) return DSP_ERR_NOMEM;
    s->cfg = *cfg;
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    atomic_init(&s->draining, false);
    atomic_init(&s->hard_stop, false);
    atomic_init(&s->n_active, 0);
    json_object_seed(0); /* once, before any thread parses JSON */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_salt = ((uint64_t)ts.tv_sec * 1000000007ULL) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    atomic_init(&s->next_id, 1);
    s->created = (int64_t)ts.tv_sec;
    *out = s;
    if (dsp_srv_metrics_create(s)) return DSP_ERR_NOMEM;

    if (cfg->chat_template && dsp_file_read(cfg->chat_template, (size_t)1 << 24, &s->template_src, NULL)) {
        fprintf(stderr, "dspark serve: cannot read --chat-template: %s\n", dsp_last_error());
        return DSP_ERR_IO;
    }

    double t0 = dsp_srv_now_ms();
    fprintf(stderr, "dspark serve: loading %s ...\n", cfg->model_path);
    dsp_model_params mp = dsp_model_default_params();
    mp.progress = true;
    mp.quantize = cfg->quantize;
    mp.n_threads = cfg->cp.n_threads;
    dsp_status st = dsp_model_load(cfg->model_path, &mp, &s->model);
    if (st) {
        fprintf(stderr, "dspark serve: %s\n", dsp_last_error());
        return st;
    }
    dsp_gen_defaults gd;
    dsp_model_gen_defaults(s->model, &gd);
    fprintf(stderr, "dspark serve: sampling defaults for requests that omit them: temperature %g, top_p %g (%s)",
            gd.has & DSP_GEN_HAS_TEMPERATURE ? gd.temperature : 1.0, gd.has & DSP_GEN_HAS_TOP_P ? gd.top_p : 1.0,
            gd.has & (DSP_GEN_HAS_TEMPERATURE | DSP_GEN_HAS_TOP_P) ? gd.source : "OpenAI's defaults");
    if (gd.has & DSP_GEN_HAS_TOP_K) fprintf(stderr, ", top_k %d", (int)gd.top_k);
    if (gd.has & DSP_GEN_HAS_MIN_P) fprintf(stderr, ", min_p %g", gd.min_p);
    if (gd.has & DSP_GEN_HAS_REPETITION_PENALTY) fprintf(stderr, ", repetition_penalty %g", gd.repetition_penalty);
    fprintf(stderr, "%s%s\n", gd.has & (DSP_GEN_HAS_TOP_K | DSP_GEN_HAS_MIN_P | DSP_GEN_HAS_REPETITION_PENALTY) ? " from " : "",
            gd.has & (DSP_GEN_HAS_TOP_K | DSP_GEN_HAS_MIN_P | DSP_GEN_HAS_REPETITION_PENALTY) ? gd.source : "");
    s->tok = dsp_model_tokenizer(s->model);
    dsp_model_info info;
    dsp_model_get_info(s->model, &info);

    if ((st = dsp_engine_create(s->model, &cfg->cp, &s->engine))) {
        fprintf(stderr, "dspark serve: %s\n", dsp_last_error());
        return st;
    }
    s->n_ctx = dsp_engine_n_ctx(s->engine);
    dsp_engine_stats es;
    dsp_engine_get_stats(s->engine, &es);
    fprintf(stderr, "dspark serve: engine on %s: %u-token context, up to %d requests per round, KV cache %u tokens (%.0f MiB, reserved)%s\n",
            dsp_engine_backend(s->engine), s->n_ctx, cfg->cp.max_batch, es.kv_blocks * es.block_tokens, (double)es.kv_bytes / 1048576.0,
            cfg->cp.no_prefix_cache ? " (no prefix cache)" : " with prefix cache");
    size_t tl = 0;
    const char *tsrc = s->template_src ? s->template_src : dsp_model_chat_template(s->model, &tl);
    if (s->template_src) tl = strlen(s->template_src);
    s->tool_family = dsp_srv_tool_family_of(tsrc, tl);

    /* names: the first alias, else the file's base name without .gguf */
    const char *base = strrchr(cfg->model_path, '/');
    base = base ? base + 1 : cfg->model_path;
    snprintf(s->file_id, sizeof s->file_id, "%s", base);
    size_t bl = strlen(s->file_id);
    if (bl > 5 && !strcmp(s->file_id + bl - 5, ".gguf")) s->file_id[bl - 5] = '\0';
    snprintf(s->model_id, sizeof s->model_id, "%s", cfg->n_aliases ? cfg->aliases[0] : s->file_id);
    snprintf(s->fingerprint, sizeof s->fingerprint, "dspark-%s-%s", DSP_VERSION, dsp_git_commit);

    dsp_srv_spec_json(s);
    { /* now, not on the first request: the cost curve sizes --max-draft auto's drafts and the prefill
       * chunks next to decoding requests (--prefill-itl), in every mode */
        dsp_spec_profile prof;
        if (dsp_engine_profile(s->engine, &prof) == DSP_OK)
            fprintf(stderr, "dspark serve: cost profile: 1-row forward %.2f ms, drafter %.2f of it per block (%s)\n", prof.one_row_ms,
                    (double)prof.draft_rel, prof.cached ? prof.cache_path : "measured now");
    }
    if ((st = dsp_srv_sched_start(s))) {
        fprintf(stderr, "dspark serve: starting the engine: %s\n", dsp_last_error());
        return st;
    }
    if ((st = dsp_srv_http_start(s))) return st;
    fprintf(stderr, "dspark serve: model '%s' (%s, %u-token context, tool calls: %s) loaded in %.1f s; speculation %s\n", s->model_id, info.arch,
            s->n_ctx, dsp_srv_tool_family_name(s->tool_family), (dsp_srv_now_ms() - t0) / 1e3, s->spec_json);
    fprintf(stderr, "dspark serve: listening on http://%s%s%s:%d (OpenAI API under /v1)\n", strchr(cfg->host, ':') ? "[" : "", cfg->host,
            strchr(cfg->host, ':') ? "]" : "", s->port);
    return DSP_OK;
}

void dsp_srv_destroy(dsp_srv *s) {
    if (!s) return;
    /* engine first: that answers every waiting connection thread, so MHD can join them */
    dsp_srv_sched_stop(s);
    dsp_srv_http_flush(s, 5); /* let the replies to those go out before the sockets close */
    dsp_srv_http_stop(s);
    dsp_engine_destroy(s->engine);
    dsp_model_destroy(s->model);
    free(s->template_src);
    dsp_srv_metrics_destroy(s);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_cond_destroy(&s->idle_cv);
    free(s);
}
