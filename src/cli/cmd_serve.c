/* cli/cmd_serve: `dspark serve`: options, signals and the shutdown sequence of the OpenAI server
 * (src/server/). The main thread only waits for SIGINT/SIGTERM: on the first it stops accepting,
 * lets queued and running requests finish for --shutdown-timeout seconds, then cancels what is
 * left and exits 0; a second signal cancels at once. */
#include "cli/cli.h"

#include "dspark.h"
#include "server/server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark serve -m MODEL [options]\n\n"
            "An OpenAI- and Anthropic-compatible HTTP server: POST /v1/chat/completions, /v1/completions,\n"
            "/v1/responses, /v1/messages, /v1/messages/count_tokens (streaming and not; tool calling);\n"
            "GET /v1/models, /metrics, /health, and a chat page at /. Omitted sampling fields take the\n"
            "model's generation_config.json values, else OpenAI's defaults (temperature 1, top_p 1); the\n"
            "startup log says which. Send temperature 0 for greedy decoding.\n\n"
            "  -m, --model MODEL          GGUF file, Hugging Face directory, or repo id org/name[@rev] (HF cache)\n"
            "      --quantize Q           quantize F32/F16/BF16 weights at load: q8_0, q4_0 or q4_k\n"
            "      --host ADDR            address to listen on (default 127.0.0.1)\n"
            "      --port N               port (default 8000; 0 = any free port, printed at start)\n"
            "      --alias NAME           model name clients use (repeatable; default: the file's name)\n"
            "      --api-key KEY          require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (every route but /health)\n"
            DSP_CLI_SPEC_HELP
            "      --default-max-tokens N max_tokens when a request gives none (default 2048)\n"
            "      --max-tokens-cap N     a request asking for more tokens gets a 400 (default 32768)\n"
            "      --max-batch N          requests decoded together in each forward (default 8); more wait\n"
            "                             (FIFO). A request is admitted when its prompt + max_tokens fit in\n"
            "                             the free KV; a running request is never evicted\n"
            "      --max-queue N          requests waiting at most; more get a 503 (default 64)\n"
            "      --max-body BYTES       request body size limit; more gets a 413 (default 8 MiB)\n"
            "      --max-connections N    open connections at most (default 256); when full, the oldest\n"
            "                             connection that has not sent a whole request is closed\n"
            "      --max-connections-per-client N  from one address at most, by the same rule (default 32)\n"
            "      --request-timeout SEC  a request's head and body must arrive within SEC (default 10)\n"
            "      --timeout SEC          close a connection whose client stops reading after SEC (default 60)\n"
            "      --keepalive SEC        a stream with nothing to send for SEC gets an SSE comment (default 15)\n"
            "      --shutdown-timeout SEC on SIGINT/SIGTERM, let requests finish this long (default 10)\n"
            "      --chat-template F      use this Jinja template instead of the model's (tool calling needs\n"
            "                             one that reads 'tools'; the syntax is taken from it)\n"
            "      --no-thinking          reasoning models answer without thinking unless a request asks\n"
            "                             (chat_template_kwargs.enable_thinking, Anthropic's thinking)\n"
            DSP_CLI_ENGINE_HELP
            "  -h, --help                 this help\n",
            "auto");
}

static bool num(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "dspark serve: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

int dsp_cmd_serve(int argc, char **argv) {
    if (dsp_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    dsp_srv_config cfg;
    dsp_srv_config_default(&cfg);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-thinking")) {
            cfg.no_thinking = true;
            continue;
        }
        bool handled;
        int erc = dsp_cli_parse_engine_opt(argc, argv, &i, &cfg.cp, &handled);
        if (!erc && !handled) erc = dsp_cli_parse_spec_opt(argc, argv, &i, &cfg.spec, &handled);
        if (erc) return erc;
        if (handled) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "dspark serve: unknown option or missing value '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        double x;
#define NUM(lo, hi) \
    if (!num(a, v, lo, hi, &x)) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) cfg.model_path = v;
        else if (!strcmp(a, "--host")) cfg.host = v;
        else if (!strcmp(a, "--port")) { NUM(0, 65535) cfg.port = (int)x; }
        else if (!strcmp(a, "--api-key")) cfg.api_key = v;
        else if (!strcmp(a, "--alias")) {
            if (cfg.n_aliases == DSP_SRV_MAX_ALIASES) {
                fprintf(stderr, "dspark serve: at most %d --alias\n", DSP_SRV_MAX_ALIASES);
                return 2;
            }
            cfg.aliases[cfg.n_aliases++] = v;
        } else if (!strcmp(a, "--default-max-tokens")) { NUM(1, 1 << 30) cfg.default_max_tokens = (int32_t)x; }
        else if (!strcmp(a, "--max-tokens-cap")) { NUM(1, 1 << 30) cfg.max_tokens_cap = (int32_t)x; }
        else if (!strcmp(a, "--max-queue")) { NUM(1, 1 << 20) cfg.max_queue = (int)x; }
        else if (!strcmp(a, "--max-body")) { NUM(1024, 1LL << 32) cfg.max_body = (size_t)x; }
        else if (!strcmp(a, "--max-connections")) { NUM(1, 100000) cfg.max_connections = (int)x; }
        else if (!strcmp(a, "--max-connections-per-client")) { NUM(1, 100000) cfg.max_connections_per_client = (int)x; }
        else if (!strcmp(a, "--request-timeout")) { NUM(1, 3600) cfg.request_timeout_s = (int)x; }
        else if (!strcmp(a, "--timeout")) { NUM(1, 86400) cfg.idle_timeout_s = (int)x; }
        else if (!strcmp(a, "--keepalive")) { NUM(0.1, 3600) cfg.keepalive_s = x; }
        else if (!strcmp(a, "--shutdown-timeout")) { NUM(0, 86400) cfg.shutdown_timeout_s = x; }
        else if (!strcmp(a, "--chat-template")) cfg.chat_template = v;
        else if (!strcmp(a, "--quantize")) cfg.quantize = v;
        else {
            fprintf(stderr, "dspark serve: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
#undef NUM
    }
    if (!cfg.model_path) {
        fprintf(stderr, "dspark serve: need -m MODEL\n\n");
        usage(stderr);
        return 2;
    }
    if (cfg.default_max_tokens > cfg.max_tokens_cap) cfg.default_max_tokens = cfg.max_tokens_cap;

    /* every thread created from here on inherits this mask; the main thread takes the signals */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    dsp_srv *s = NULL;
    if (dsp_srv_create(&cfg, &s)) {
        dsp_srv_destroy(s);
        return 1;
    }
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "dspark serve: %s: no new requests; waiting up to %.0f s for the ones in flight\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            cfg.shutdown_timeout_s);
    atomic_store(&s->draining, true); /* new requests get a 503 with Retry-After */

    /* wait for the queue to drain, in slices so that a second signal cancels at once */
    double waited = 0;
    bool idle = false;
    struct timespec zero = {0, 0};
    while (!(idle = dsp_srv_sched_wait_idle(s, 0.1)) && waited < cfg.shutdown_timeout_s) {
        waited += 0.1;
        if (sigtimedwait(&set, NULL, &zero) > 0) {
            fprintf(stderr, "dspark serve: second signal: cancelling now\n");
            break;
        }
    }
    if (!idle) fprintf(stderr, "dspark serve: cancelling the requests still in flight\n");
    dsp_srv_sched_stop(s); /* cancels what is left */
    fprintf(stderr, "dspark serve: %llu requests served; bye\n", (unsigned long long)s->n_served);
    dsp_srv_destroy(s);
    return 0;
}
