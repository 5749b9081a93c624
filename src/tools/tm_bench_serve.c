/* tm_bench_serve.c -- `tokenmill bench serve`: open-loop Poisson load on an OpenAI-compatible server (libcurl multi). */
#include "tm_cli.h"
#include "tm_bench_serve.h"

#include "engine/tm_sampler.h"
#include "metrics/tm_metrics.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char *k_usage =
    "usage: tokenmill bench serve --base-url URL [--model NAME] [--endpoint /v1/completions|/v1/chat/completions]\n"
    "           [--num-prompts N] [--request-rate R|inf] [--max-concurrency C] [--input-len I] [--output-len O]\n"
    "           [--prompt-kind ids|text] [--vocab-size V] [--seed S] [--goodput ttft:MS,tpot:MS[,e2e:MS]]\n"
    "           [--api-key K] [--timeout S] [--extra-body JSON] [--no-ignore-eos] [--json] [--plot FILE.png]\n"
    "  Open-loop load on any OpenAI-compatible server: N streaming requests arrive as a Poisson process of\n"
    "  rate R per second (inf: all at once; default), at most C in flight (default: no cap; a request that\n"
    "  arrives at the cap waits, and its latencies count from when it is sent). Each asks for exactly O tokens\n"
    "  (max_tokens, plus ignore_eos and min_tokens unless --no-ignore-eos) at temperature 0.\n"
    "  Prompts: I random token ids in [100, V) sent as the `prompt` array (ids; default for /v1/completions,\n"
    "  V default 32000), or I random words (text; always for chat).\n"
    "  Reports request and token throughput, TTFT / TPOT / ITL / E2E mean, median, p90, p99 and failures;\n"
    "  --goodput: requests per second meeting every objective given (milliseconds). --model: default the\n"
    "  first id of GET /v1/models. --api-key: default $OPENAI_API_KEY. --timeout: seconds per request (600).\n"
    "  --extra-body: a JSON object merged into every request. --plot: latency CDFs and output throughput\n"
    "  over time, drawn by gnuplot.\n"
    "  defaults: --num-prompts 100 --input-len 128 --output-len 128 --seed 0\n";

/* ---- options ------------------------------------------------------------------------------------------ */

typedef struct bs_opts {
    const char *base_url, *model, *endpoint, *api_key, *plot;
    int64_t num_prompts, max_concurrency, input_len, output_len, vocab_size;
    double request_rate;   /* requests per second; INFINITY = all at once */
    double timeout_s;      /* per request */
    uint64_t seed;
    bool json, text_prompt, chat, ignore_eos;
    bool has_slo;
    tm_bs_slo slo;
    cJSON *extra_body;     /* owned; NULL when not given */
} bs_opts;

static int bs_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "tokenmill bench serve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", k_usage);
    return 2;
}

static bool parse_pos_double(const char *s, double *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v <= 0) return false;
    *out = v;
    return true;
}

/* Returns 0 or the exit status of a usage error (or -1 for --help, already printed). */
static int parse_opts(int argc, char **argv, bs_opts *o) {
    const char *prompt_kind = NULL;
    *o = (bs_opts){.endpoint = "/v1/completions", .num_prompts = 100, .input_len = 128, .output_len = 128,
                   .vocab_size = 32000, .request_rate = INFINITY, .timeout_s = 600, .ignore_eos = true};
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_usage, stdout);
            return -1;
        }
        if (!strcmp(a, "--json")) { o->json = true; continue; }
        if (!strcmp(a, "--no-ignore-eos")) { o->ignore_eos = false; continue; }
        if (strncmp(a, "--", 2) != 0) return bs_usage("unexpected argument '%s'", a);
        if (!v) return bs_usage("option %s needs a value", a);
        i++;
        if (!strcmp(a, "--base-url")) o->base_url = v;
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--endpoint")) o->endpoint = v;
        else if (!strcmp(a, "--api-key")) o->api_key = v;
        else if (!strcmp(a, "--plot")) o->plot = v;
        else if (!strcmp(a, "--prompt-kind")) prompt_kind = v;
        else if (!strcmp(a, "--num-prompts")) {
            if (!tm_cli_parse_i64(v, 1, 1000000, &o->num_prompts)) return bs_usage("bad --num-prompts '%s' (1..1000000)", v);
        } else if (!strcmp(a, "--max-concurrency")) {
            if (!tm_cli_parse_i64(v, 1, 10000000, &o->max_concurrency)) return bs_usage("bad --max-concurrency '%s'", v);
        } else if (!strcmp(a, "--input-len")) {
            if (!tm_cli_parse_i64(v, 1, 1 << 22, &o->input_len)) return bs_usage("bad --input-len '%s'", v);
        } else if (!strcmp(a, "--output-len")) {
            if (!tm_cli_parse_i64(v, 1, 1 << 22, &o->output_len)) return bs_usage("bad --output-len '%s'", v);
        } else if (!strcmp(a, "--vocab-size")) {
            if (!tm_cli_parse_i64(v, 200, INT32_MAX, &o->vocab_size)) return bs_usage("bad --vocab-size '%s' (>= 200)", v);
        } else if (!strcmp(a, "--seed")) {
            int64_t s;
            if (!tm_cli_parse_i64(v, 0, INT64_MAX, &s)) return bs_usage("bad --seed '%s'", v);
            o->seed = (uint64_t)s;
        } else if (!strcmp(a, "--request-rate")) {
            if (!strcmp(v, "inf") || !strcmp(v, "INF") || !strcmp(v, "Inf")) o->request_rate = INFINITY;
            else if (!parse_pos_double(v, &o->request_rate)) return bs_usage("bad --request-rate '%s' (> 0 or inf)", v);
        } else if (!strcmp(a, "--timeout")) {
            if (!parse_pos_double(v, &o->timeout_s) || o->timeout_s > 1e6) return bs_usage("bad --timeout '%s' (seconds)", v);
        } else if (!strcmp(a, "--goodput")) {
            char msg[160];
            if (!tm_bs_parse_goodput(v, &o->slo, msg, sizeof msg)) return bs_usage("%s", msg);
            o->has_slo = true;
        } else if (!strcmp(a, "--extra-body")) {
            cJSON_Delete(o->extra_body);
            o->extra_body = cJSON_Parse(v);
            if (!cJSON_IsObject(o->extra_body)) return bs_usage("--extra-body '%s' is not a JSON object", v);
        } else return bs_usage("unknown option '%s'", a);
    }
    if (!o->base_url || !*o->base_url) return bs_usage("--base-url is required%s", "");
    if (strncmp(o->base_url, "http://", 7) != 0 && strncmp(o->base_url, "https://", 8) != 0)
        return bs_usage("--base-url '%s' must start with http:// or https://", o->base_url);
    if (o->endpoint[0] != '/') return bs_usage("--endpoint '%s' must start with '/'", o->endpoint);
    o->chat = strstr(o->endpoint, "chat") != NULL;
    if (prompt_kind && strcmp(prompt_kind, "ids") != 0 && strcmp(prompt_kind, "text") != 0)
        return bs_usage("bad --prompt-kind '%s' (ids or text)", prompt_kind);
    if (o->chat && prompt_kind && !strcmp(prompt_kind, "ids"))
        return bs_usage("--prompt-kind ids needs a completions endpoint (chat messages are text), not '%s'", o->endpoint);
    o->text_prompt = o->chat || (prompt_kind && !strcmp(prompt_kind, "text"));
    if (!o->api_key) {
        const char *k = getenv("OPENAI_API_KEY");
        if (k && *k) o->api_key = k;
    }
    return 0;
}

/* ---- requests ----------------------------------------------------------------------------------------- */

typedef struct bs_bench bs_bench;

typedef struct bs_req {
    bs_bench *b;
    CURL *h;                 /* while in flight */
    char *body;              /* the request JSON */
    tm_bs_sse sse;
    double t_send, t_first, t_last, t_end; /* seconds since the benchmark started */
    int64_t n_chunks;        /* chunks that carried content */
    int64_t usage_out, usage_in; /* from the usage chunk; -1 when absent */
    double *itl;             /* (n_itl) seconds between consecutive content chunks */
    size_t n_itl, cap_itl;
    char *errbody;           /* (errbody_len) first bytes of a non-200 response */
    size_t errbody_len;
    long http_code;
    int64_t n_events;
    bool code_checked, done_seen, sent, finished, ok;
    char reason[40];         /* failure category, empty while fine */
    char detail[200];        /* one example of what went wrong */
    char curl_err[CURL_ERROR_SIZE];
} bs_req;

struct bs_bench {
    const bs_opts *o;
    char *url;                   /* base + endpoint */
    char *model;                 /* the model name sent (owned) */
    struct curl_slist *headers;  /* shared by every request */
    CURLM *multi;
    bs_req *reqs;                /* (num_prompts) */
    double *arrival;             /* (num_prompts) scheduled send times, seconds since start */
    double t0;                   /* monotonic seconds at the start */
    int64_t inflight, peak_inflight, n_finished;
    bool interrupted;
};

#define BS_ERRBODY_MAX 1024
#define BS_MAX_EVENT ((size_t)4 << 20)

static double bs_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_fail(bs_req *r, const char *reason, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_fail(bs_req *r, const char *reason, const char *fmt, ...) {
    if (r->reason[0]) return; /* the first cause wins */
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
}

static bool push_itl(bs_req *r, double gap) {
    if (r->n_itl == r->cap_itl) {
        size_t c = r->cap_itl ? 2 * r->cap_itl : 64;
        double *n = realloc(r->itl, c * sizeof *n);
        if (!n) return false;
        r->itl = n;
        r->cap_itl = c;
    }
    r->itl[r->n_itl++] = gap;
    return true;
}

/* One SSE event of a 200 response. Nonzero stops the transfer (the reason is set). */
static int on_event(void *ud, const char *data, size_t len) {
    bs_req *r = ud;
    double now = bs_now() - r->b->t0;
    tm_bs_chunk c;
    tm_bs_parse_chunk(data, len, &c);
    r->n_events++;
    switch (c.kind) {
    case TM_BS_CHUNK_DONE:
        r->done_seen = true;
        return 0;
    case TM_BS_CHUNK_BAD:
        set_fail(r, "malformed chunk", "not a JSON object: %s", c.msg);
        return 1;
    case TM_BS_CHUNK_ERROR:
        set_fail(r, "error event", "%s", c.msg);
        return 1;
    case TM_BS_CHUNK_DATA:
        break;
    }
    if (c.has_content) {
        if (r->n_chunks == 0) r->t_first = now;
        else if (!push_itl(r, now - r->t_last)) {
            set_fail(r, "out of memory", "recording inter-token latencies");
            return 1;
        }
        r->t_last = now;
        r->n_chunks++;
    }
    if (c.completion_tokens >= 0) r->usage_out = c.completion_tokens;
    if (c.prompt_tokens >= 0) r->usage_in = c.prompt_tokens;
    return 0;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    bs_req *r = ud;
    size_t n = size * nmemb;
    if (!r->code_checked) {
        curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->http_code);
        r->code_checked = true;
    }
    if (r->http_code != 200) { /* keep the start of the error body for the report */
        if (!r->errbody) r->errbody = malloc(BS_ERRBODY_MAX + 1);
        if (r->errbody && r->errbody_len < BS_ERRBODY_MAX) {
            size_t k = n < BS_ERRBODY_MAX - r->errbody_len ? n : BS_ERRBODY_MAX - r->errbody_len;
            memcpy(r->errbody + r->errbody_len, ptr, k);
            r->errbody_len += k;
            r->errbody[r->errbody_len] = '\0';
        }
        return n;
    }
    int rc = tm_bs_sse_feed(&r->sse, ptr, n, on_event, r);
    if (rc == 0) return n;
    if (rc < 0) set_fail(r, "malformed stream", "an SSE line or event over %zu bytes (or out of memory)", BS_MAX_EVENT);
    return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
}

static void launch(bs_bench *b, bs_req *r) {
    const bs_opts *o = b->o;
    r->sent = true;
    r->usage_in = r->usage_out = -1;
    tm_bs_sse_init(&r->sse, BS_MAX_EVENT);
    r->t_send = bs_now() - b->t0;
    CURL *h = curl_easy_init();
    if (!h) {
        set_fail(r, "client error", "curl_easy_init failed");
        goto fail;
    }
    r->h = h;
    long timeout_ms = (long)(o->timeout_s * 1000.0);
    curl_easy_setopt(h, CURLOPT_URL, b->url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(r->body));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, b->headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 30000 ? timeout_ms : 30000L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->curl_err);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    CURLMcode mc = curl_multi_add_handle(b->multi, h);
    if (mc != CURLM_OK) {
        set_fail(r, "client error", "curl_multi_add_handle: %s", curl_multi_strerror(mc));
        goto fail;
    }
    b->inflight++;
    if (b->inflight > b->peak_inflight) b->peak_inflight = b->inflight;
    return;
fail:
    if (r->h) curl_easy_cleanup(r->h);
    r->h = NULL;
    r->t_end = r->t_send;
    r->finished = true;
    b->n_finished++;
    tm_bs_sse_free(&r->sse);
}

/* The error message of an OpenAI-style error body, or the body itself. */
static void describe_error_body(const bs_req *r, char *out, size_t cap) {
    if (!r->errbody || !r->errbody_len) {
        snprintf(out, cap, "(empty body)");
        return;
    }
    cJSON *j = cJSON_ParseWithLength(r->errbody, r->errbody_len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
    if (!cJSON_IsString(m)) m = cJSON_GetObjectItemCaseSensitive(j, "detail");
    const char *s = cJSON_IsString(m) && m->valuestring ? m->valuestring : r->errbody;
    size_t k = 0;
    for (; s[k] && k + 1 < cap && k < 160; k++) out[k] = ((unsigned char)s[k] < 0x20) ? ' ' : s[k];
    out[k] = '\0';
    cJSON_Delete(j);
}

static void finish(bs_bench *b, bs_req *r, CURLcode res) {
    r->t_end = bs_now() - b->t0;
    long code = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &code);
    char *ctype = NULL;
    curl_easy_getinfo(r->h, CURLINFO_CONTENT_TYPE, &ctype);
    if (!r->reason[0] && code == 200 && res == CURLE_OK) tm_bs_sse_finish(&r->sse, on_event, r);
    if (!r->reason[0]) {
        if (code != 0 && code != 200) {
            char msg[176];
            describe_error_body(r, msg, sizeof msg);
            char cat[24];
            snprintf(cat, sizeof cat, "http %ld", code);
            set_fail(r, cat, "%s", msg);
        } else if (res == CURLE_OPERATION_TIMEDOUT) {
            set_fail(r, "timeout", "no complete response within %g s (%s)", b->o->timeout_s, r->curl_err);
        } else if (res == CURLE_COULDNT_CONNECT || res == CURLE_COULDNT_RESOLVE_HOST || res == CURLE_COULDNT_RESOLVE_PROXY) {
            set_fail(r, "connect failed", "%s", r->curl_err[0] ? r->curl_err : curl_easy_strerror(res));
        } else if (res == CURLE_GOT_NOTHING || res == CURLE_PARTIAL_FILE || res == CURLE_RECV_ERROR ||
                   res == CURLE_SEND_ERROR) {
            set_fail(r, "disconnected", "%s", r->curl_err[0] ? r->curl_err : curl_easy_strerror(res));
        } else if (res != CURLE_OK) {
            set_fail(r, "transfer error", "%s", r->curl_err[0] ? r->curl_err : curl_easy_strerror(res));
        } else if (r->n_events == 0) {
            set_fail(r, "not an event stream", "200 with content type '%s' and no SSE events", ctype ? ctype : "(none)");
        } else if (!r->done_seen) {
            set_fail(r, "incomplete stream", "the stream ended without data: [DONE] after %lld content chunks",
                     (long long)r->n_chunks);
        } else if (r->n_chunks == 0) {
            set_fail(r, "no tokens", "the stream carried no content chunk");
        }
    }
    r->ok = !r->reason[0];
    r->finished = true;
    curl_multi_remove_handle(b->multi, r->h);
    curl_easy_cleanup(r->h);
    r->h = NULL;
    tm_bs_sse_free(&r->sse);
    b->inflight--;
    b->n_finished++;
}

/* ---- model discovery ------------------------------------------------------------------------------------ */

typedef struct bs_buf {
    char *p;
    size_t len;
} bs_buf;

static size_t buf_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    bs_buf *b = ud;
    size_t n = size * nmemb;
    if (b->len + n > ((size_t)1 << 24)) return 0;
    char *np = realloc(b->p, b->len + n + 1);
    if (!np) return 0;
    memcpy(np + b->len, ptr, n);
    b->len += n;
    np[b->len] = '\0';
    b->p = np;
    return n;
}

/* The first id of GET {root}/v1/models ({root}/models when root already ends in /v1); NULL (and a message on
 * stderr) when there is none. */
static char *discover_model(const char *root, struct curl_slist *headers, double timeout_s) {
    char *url = NULL, *model = NULL;
    bs_buf buf = {0};
    cJSON *j = NULL;
    CURL *h = curl_easy_init();
    if (!h) goto cleanup;
    size_t rl = strlen(root);
    if (asprintf(&url, "%s%s", root, rl >= 3 && !strcmp(root + rl - 3, "/v1") ? "/models" : "/v1/models") < 0) {
        url = NULL;
        goto cleanup;
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    long tmo = (long)(fmin(timeout_s, 30.0) * 1000.0);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &buf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, tmo);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode res = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (res != CURLE_OK || code != 200) {
        fprintf(stderr, "tokenmill bench serve: GET %s failed (%s); give --model\n", url,
                res != CURLE_OK ? (errbuf[0] ? errbuf : curl_easy_strerror(res)) : code == 401 ? "HTTP 401" : "not 200");
        goto cleanup;
    }
    j = cJSON_ParseWithLength(buf.p ? buf.p : "", buf.len);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, 0), "id");
    if (!cJSON_IsString(id) || !id->valuestring[0]) {
        fprintf(stderr, "tokenmill bench serve: GET %s lists no model id; give --model\n", url);
        goto cleanup;
    }
    model = strdup(id->valuestring);
cleanup:
    cJSON_Delete(j);
    free(buf.p);
    free(url);
    if (h) curl_easy_cleanup(h);
    return model;
}

/* ---- prompts -------------------------------------------------------------------------------------------- */

static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "time", "river", "mill", "stone", "water", "green", "house", "light", "small", "road",
    "city", "world", "year", "day", "hand", "night",
};

/* The request body for one request: random ids or words drawn from rng. NULL when out of memory. */
static char *build_body(const bs_opts *o, const char *model, tm_rng *rng) {
    char *out = NULL, *text = NULL;
    cJSON *j = cJSON_CreateObject();
    if (!j || !cJSON_AddStringToObject(j, "model", model)) goto cleanup;
    if (o->text_prompt) {
        size_t nw = sizeof k_words / sizeof k_words[0], cap = (size_t)o->input_len * 8 + 1, len = 0;
        text = malloc(cap);
        if (!text) goto cleanup;
        for (int64_t i = 0; i < o->input_len; i++) {
            const char *w = k_words[tm_rng_next(rng) % nw];
            len += (size_t)snprintf(text + len, cap - len, "%s%s", i ? " " : "", w);
        }
        if (o->chat) {
            cJSON *msgs = cJSON_AddArrayToObject(j, "messages");
            cJSON *m = cJSON_CreateObject();
            if (!msgs || !m) {
                cJSON_Delete(m);
                goto cleanup;
            }
            cJSON_AddItemToArray(msgs, m);
            if (!cJSON_AddStringToObject(m, "role", "user") || !cJSON_AddStringToObject(m, "content", text)) goto cleanup;
        } else if (!cJSON_AddStringToObject(j, "prompt", text)) goto cleanup;
    } else {
        cJSON *ids = cJSON_AddArrayToObject(j, "prompt");
        if (!ids) goto cleanup;
        uint64_t lo = 100, span = (uint64_t)o->vocab_size - lo;
        for (int64_t i = 0; i < o->input_len; i++) {
            cJSON *n = cJSON_CreateNumber((double)(lo + tm_rng_next(rng) % span));
            if (!n) goto cleanup;
            cJSON_AddItemToArray(ids, n);
        }
    }
    cJSON *so = NULL;
    if (!cJSON_AddNumberToObject(j, "max_tokens", (double)o->output_len) ||
        !cJSON_AddNumberToObject(j, "temperature", 0.0) || !cJSON_AddTrueToObject(j, "stream") ||
        !(so = cJSON_AddObjectToObject(j, "stream_options")) || !cJSON_AddTrueToObject(so, "include_usage"))
        goto cleanup;
    if (o->ignore_eos &&
        (!cJSON_AddTrueToObject(j, "ignore_eos") || !cJSON_AddNumberToObject(j, "min_tokens", (double)o->output_len)))
        goto cleanup;
    const cJSON *x;
    cJSON_ArrayForEach(x, o->extra_body) {
        cJSON *dup = cJSON_Duplicate(x, 1);
        if (!dup) goto cleanup;
        cJSON_DeleteItemFromObjectCaseSensitive(j, x->string);
        cJSON_AddItemToObject(j, x->string, dup);
    }
    out = cJSON_PrintUnformatted(j);
cleanup:
    free(text);
    cJSON_Delete(j);
    return out;
}

/* ---- the run -------------------------------------------------------------------------------------------- */

static volatile sig_atomic_t g_bs_interrupted; /* set by SIGINT/SIGTERM: stop sending, report what finished */

static void on_signal(int sig) {
    (void)sig;
    g_bs_interrupted = 1;
}

static void run_loop(bs_bench *b) {
    const bs_opts *o = b->o;
    int64_t n = o->num_prompts, next = 0;
    b->t0 = bs_now();
    while (b->n_finished < n) {
        if (g_bs_interrupted) {
            b->interrupted = true;
            break;
        }
        double now = bs_now() - b->t0;
        while (next < n && b->arrival[next] <= now && (o->max_concurrency == 0 || b->inflight < o->max_concurrency))
            launch(b, &b->reqs[next++]);
        int running = 0;
        curl_multi_perform(b->multi, &running);
        CURLMsg *msg;
        int left;
        bool any = false;
        while ((msg = curl_multi_info_read(b->multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            bs_req *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            finish(b, r, msg->data.result);
            any = true;
        }
        if (any) continue; /* slots may have opened: launch before waiting */
        if (b->n_finished >= n) break;
        int wait_ms = 200;
        now = bs_now() - b->t0;
        if (next < n && (o->max_concurrency == 0 || b->inflight < o->max_concurrency)) {
            double dt = (b->arrival[next] - now) * 1000.0;
            if (dt < wait_ms) wait_ms = dt <= 0 ? 0 : (int)ceil(dt);
        }
        if (wait_ms > 0) curl_multi_poll(b->multi, NULL, 0, wait_ms, NULL);
    }
    if (b->interrupted) {
        for (int64_t i = 0; i < n; i++) {
            bs_req *r = &b->reqs[i];
            if (r->finished) continue;
            set_fail(r, "interrupted", "%s", r->sent ? "in flight at the interrupt" : "not sent before the interrupt");
            if (r->h) {
                curl_multi_remove_handle(b->multi, r->h);
                curl_easy_cleanup(r->h);
                r->h = NULL;
                b->inflight--;
                tm_bs_sse_free(&r->sse);
            }
            r->t_end = bs_now() - b->t0;
            r->finished = true;
        }
    }
}

/* ---- results -------------------------------------------------------------------------------------------- */

typedef struct bs_results {
    int64_t completed, failed, good;
    int64_t in_tokens, out_tokens;
    bool in_estimated;       /* some request had no usage.prompt_tokens: input_len counted instead */
    bool out_from_chunks;    /* some request had no usage.completion_tokens: content chunks counted */
    double duration;         /* seconds: start to the last finish */
    tm_summary ttft, tpot, itl, e2e; /* milliseconds */
    double *ttft_v, *tpot_v, *e2e_v; /* (completed) sorted values for the plot, ms; tpot_v has n_tpot */
    size_t n_tpot;
    struct {
        char reason[40];
        char example[200];
        int64_t count;
    } fails[16];
    int n_fail_kinds;
    int64_t fails_other;
} bs_results;

static int64_t req_out_tokens(const bs_req *r) { return r->usage_out >= 0 ? r->usage_out : r->n_chunks; }

static double req_tpot_ms(const bs_req *r) {
    int64_t out = req_out_tokens(r);
    return out > 1 ? (r->t_end - r->t_first) * 1000.0 / (double)(out - 1) : -1.0;
}

static bool compute_results(const bs_bench *b, bs_results *s) {
    const bs_opts *o = b->o;
    int64_t n = o->num_prompts;
    size_t n_itl = 0;
    for (int64_t i = 0; i < n; i++) {
        const bs_req *r = &b->reqs[i];
        if (r->t_end > s->duration) s->duration = r->t_end;
        if (r->ok) n_itl += r->n_itl;
    }
    double *itl_v = malloc((n_itl ? n_itl : 1) * sizeof(double));
    s->ttft_v = malloc((size_t)n * sizeof(double));
    s->tpot_v = malloc((size_t)n * sizeof(double));
    s->e2e_v = malloc((size_t)n * sizeof(double));
    if (!itl_v || !s->ttft_v || !s->tpot_v || !s->e2e_v) {
        free(itl_v);
        return false;
    }
    n_itl = 0;
    for (int64_t i = 0; i < n; i++) {
        const bs_req *r = &b->reqs[i];
        if (!r->ok) {
            s->failed++;
            int k = 0;
            while (k < s->n_fail_kinds && strcmp(s->fails[k].reason, r->reason) != 0) k++;
            if (k == s->n_fail_kinds) {
                if (k == (int)(sizeof s->fails / sizeof s->fails[0])) {
                    s->fails_other++;
                    continue;
                }
                s->n_fail_kinds++;
                snprintf(s->fails[k].reason, sizeof s->fails[k].reason, "%s", r->reason);
                snprintf(s->fails[k].example, sizeof s->fails[k].example, "%s", r->detail);
            }
            s->fails[k].count++;
            continue;
        }
        size_t c = (size_t)s->completed++;
        int64_t out = req_out_tokens(r);
        s->out_tokens += out;
        if (r->usage_out < 0) s->out_from_chunks = true;
        if (r->usage_in >= 0) s->in_tokens += r->usage_in;
        else {
            s->in_tokens += o->input_len;
            s->in_estimated = true;
        }
        double ttft = (r->t_first - r->t_send) * 1000.0, e2e = (r->t_end - r->t_send) * 1000.0, tpot = req_tpot_ms(r);
        s->ttft_v[c] = ttft;
        s->e2e_v[c] = e2e;
        if (tpot >= 0) s->tpot_v[s->n_tpot++] = tpot;
        for (size_t k = 0; k < r->n_itl; k++) itl_v[n_itl++] = r->itl[k] * 1000.0;
        if (o->has_slo && tm_bs_meets_slo(&o->slo, ttft, tpot, e2e)) s->good++;
    }
    s->ttft = tm_stats_summary(s->ttft_v, (size_t)s->completed);
    s->e2e = tm_stats_summary(s->e2e_v, (size_t)s->completed);
    s->tpot = tm_stats_summary(s->tpot_v, s->n_tpot);
    s->itl = tm_stats_summary(itl_v, n_itl);
    free(itl_v);
    return true;
}

static void results_free(bs_results *s) {
    free(s->ttft_v);
    free(s->tpot_v);
    free(s->e2e_v);
}

static double per_s(double x, double dur) { return dur > 0 ? x / dur : NAN; }

static void add_num(cJSON *j, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(j, k, v);
    else cJSON_AddNullToObject(j, k);
}

static void print_json(const bs_bench *b, const bs_results *s) {
    const bs_opts *o = b->o;
    cJSON *j = cJSON_CreateObject();
    if (!j) return;
    cJSON_AddStringToObject(j, "url", b->url);
    cJSON_AddStringToObject(j, "endpoint", o->endpoint);
    cJSON_AddStringToObject(j, "model", b->model);
    cJSON_AddNumberToObject(j, "num_prompts", (double)o->num_prompts);
    if (isinf(o->request_rate)) cJSON_AddStringToObject(j, "request_rate", "inf");
    else cJSON_AddNumberToObject(j, "request_rate", o->request_rate);
    if (o->max_concurrency) cJSON_AddNumberToObject(j, "max_concurrency", (double)o->max_concurrency);
    else cJSON_AddNullToObject(j, "max_concurrency");
    cJSON_AddNumberToObject(j, "input_len", (double)o->input_len);
    cJSON_AddNumberToObject(j, "output_len", (double)o->output_len);
    cJSON_AddStringToObject(j, "prompt_kind", o->text_prompt ? "text" : "ids");
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddBoolToObject(j, "interrupted", b->interrupted);
    add_num(j, "duration_s", s->duration);
    cJSON_AddNumberToObject(j, "completed", (double)s->completed);
    cJSON_AddNumberToObject(j, "failed", (double)s->failed);
    cJSON *fl = cJSON_AddArrayToObject(j, "failures");
    for (int k = 0; fl && k < s->n_fail_kinds; k++) {
        cJSON *f = cJSON_CreateObject();
        if (!f) break;
        cJSON_AddStringToObject(f, "reason", s->fails[k].reason);
        cJSON_AddNumberToObject(f, "count", (double)s->fails[k].count);
        cJSON_AddStringToObject(f, "example", s->fails[k].example);
        cJSON_AddItemToArray(fl, f);
    }
    if (s->fails_other) {
        cJSON *f = cJSON_CreateObject();
        if (f) {
            cJSON_AddStringToObject(f, "reason", "other");
            cJSON_AddNumberToObject(f, "count", (double)s->fails_other);
            cJSON_AddStringToObject(f, "example", "");
            cJSON_AddItemToArray(fl, f);
        }
    }
    cJSON_AddNumberToObject(j, "peak_concurrency", (double)b->peak_inflight);
    cJSON_AddNumberToObject(j, "total_input_tokens", (double)s->in_tokens);
    cJSON_AddNumberToObject(j, "total_output_tokens", (double)s->out_tokens);
    cJSON_AddBoolToObject(j, "input_tokens_estimated", s->in_estimated);
    cJSON_AddBoolToObject(j, "output_tokens_from_chunks", s->out_from_chunks);
    add_num(j, "request_throughput", per_s((double)s->completed, s->duration));
    add_num(j, "output_throughput", per_s((double)s->out_tokens, s->duration));
    add_num(j, "total_token_throughput", per_s((double)(s->in_tokens + s->out_tokens), s->duration));
    const struct {
        const char *name;
        const tm_summary *v;
    } rows[] = {{"ttft", &s->ttft}, {"tpot", &s->tpot}, {"itl", &s->itl}, {"e2e", &s->e2e}};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        char k[32];
        snprintf(k, sizeof k, "mean_%s_ms", rows[r].name);
        add_num(j, k, rows[r].v->mean);
        snprintf(k, sizeof k, "median_%s_ms", rows[r].name);
        add_num(j, k, rows[r].v->p50);
        snprintf(k, sizeof k, "p90_%s_ms", rows[r].name);
        add_num(j, k, rows[r].v->p90);
        snprintf(k, sizeof k, "p99_%s_ms", rows[r].name);
        add_num(j, k, rows[r].v->p99);
    }
    if (o->has_slo) {
        cJSON *slo = cJSON_AddObjectToObject(j, "goodput_slo_ms");
        if (slo) {
            if (o->slo.ttft_ms > 0) cJSON_AddNumberToObject(slo, "ttft", o->slo.ttft_ms);
            if (o->slo.tpot_ms > 0) cJSON_AddNumberToObject(slo, "tpot", o->slo.tpot_ms);
            if (o->slo.e2e_ms > 0) cJSON_AddNumberToObject(slo, "e2e", o->slo.e2e_ms);
        }
        cJSON_AddNumberToObject(j, "good_requests", (double)s->good);
        add_num(j, "goodput", per_s((double)s->good, s->duration));
    }
    char *txt = cJSON_Print(j);
    if (txt) printf("%s\n", txt);
    free(txt);
    cJSON_Delete(j);
}

static void print_row(const char *name, const tm_summary *v) {
    if (v->count == 0) printf("%-6s %10s %10s %10s %10s\n", name, "-", "-", "-", "-");
    else printf("%-6s %10.2f %10.2f %10.2f %10.2f\n", name, v->mean, v->p50, v->p90, v->p99);
}

static void print_text(const bs_bench *b, const bs_results *s) {
    const bs_opts *o = b->o;
    char rate[32], conc[32];
    if (isinf(o->request_rate)) snprintf(rate, sizeof rate, "inf (all at once)");
    else snprintf(rate, sizeof rate, "%g req/s (Poisson)", o->request_rate);
    if (o->max_concurrency) snprintf(conc, sizeof conc, "%lld", (long long)o->max_concurrency);
    else snprintf(conc, sizeof conc, "no cap");
    printf("============ bench serve ============\n");
    printf("%-28s %s (model %s)\n", "Server:", b->url, b->model);
    printf("%-28s %s, max concurrency %s%s\n", "Request rate:", rate, conc, b->interrupted ? "  [INTERRUPTED]" : "");
    printf("%-28s %lld x (%lld %s in, %lld tokens out)\n", "Requests:", (long long)o->num_prompts,
           (long long)o->input_len, o->text_prompt ? "words" : "token ids", (long long)o->output_len);
    printf("%-28s %lld\n", "Successful requests:", (long long)s->completed);
    printf("%-28s %lld\n", "Failed requests:", (long long)s->failed);
    for (int k = 0; k < s->n_fail_kinds; k++)
        printf("  %-26s %lld  (e.g. %s)\n", s->fails[k].reason, (long long)s->fails[k].count, s->fails[k].example);
    if (s->fails_other) printf("  %-26s %lld\n", "other", (long long)s->fails_other);
    printf("%-28s %.2f\n", "Benchmark duration (s):", s->duration);
    printf("%-28s %lld\n", "Peak concurrency:", (long long)b->peak_inflight);
    printf("%-28s %lld%s\n", "Total input tokens:", (long long)s->in_tokens, s->in_estimated ? " (estimated: no usage)" : "");
    printf("%-28s %lld%s\n", "Total generated tokens:", (long long)s->out_tokens,
           s->out_from_chunks ? " (counted chunks: no usage)" : "");
    printf("%-28s %.3f\n", "Request throughput (req/s):", per_s((double)s->completed, s->duration));
    printf("%-28s %.2f\n", "Output throughput (tok/s):", per_s((double)s->out_tokens, s->duration));
    printf("%-28s %.2f\n", "Total throughput (tok/s):", per_s((double)(s->in_tokens + s->out_tokens), s->duration));
    if (o->has_slo) {
        char slo[96] = "";
        size_t l = 0;
        if (o->slo.ttft_ms > 0) l += (size_t)snprintf(slo + l, sizeof slo - l, "ttft<=%gms ", o->slo.ttft_ms);
        if (o->slo.tpot_ms > 0) l += (size_t)snprintf(slo + l, sizeof slo - l, "tpot<=%gms ", o->slo.tpot_ms);
        if (o->slo.e2e_ms > 0) snprintf(slo + l, sizeof slo - l, "e2e<=%gms ", o->slo.e2e_ms);
        printf("%-28s %.3f  (%lld good requests; %s)\n", "Goodput (req/s):", per_s((double)s->good, s->duration),
               (long long)s->good, slo);
    }
    printf("%-6s %10s %10s %10s %10s   (ms)\n", "", "mean", "median", "p90", "p99");
    print_row("TTFT", &s->ttft);
    print_row("TPOT", &s->tpot);
    print_row("ITL", &s->itl);
    print_row("E2E", &s->e2e);
}

/* ---- plot ----------------------------------------------------------------------------------------------- */

static bool have_program(const char *prog) {
    const char *path = getenv("PATH");
    if (!path || !*path) return false;
    const char *p = path;
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char buf[4096];
        if (n > 0 && n + strlen(prog) + 2 < sizeof buf) {
            snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
            struct stat st;
            if (stat(buf, &st) == 0 && S_ISREG(st.st_mode) && access(buf, X_OK) == 0) return true;
        }
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* a gnuplot single-quoted string: '' stands for ' */
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static void write_cdf_block(FILE *f, const double *v, size_t n) {
    if (n == 0) fprintf(f, "0 0\n");
    for (size_t i = 0; i < n; i++) fprintf(f, "%.6f %.6f\n", v[i], (double)(i + 1) / (double)n);
    fprintf(f, "\n\n");
}

/* Write the data and a script into a temporary folder, run gnuplot, remove the folder. */
static bool plot(const bs_bench *b, const bs_results *s, const char *png) {
    const bs_opts *o = b->o;
    const char *tmp = getenv("TMPDIR");
    char dir[512], cdf[600], tput[600], gp[600];
    snprintf(dir, sizeof dir, "%s/tokenmill-plot-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "tokenmill bench serve: --plot: cannot create a temporary folder in %s: %s\n",
                tmp && *tmp ? tmp : "/tmp", strerror(errno));
        return false;
    }
    snprintf(cdf, sizeof cdf, "%s/cdf.dat", dir);
    snprintf(tput, sizeof tput, "%s/tput.dat", dir);
    snprintf(gp, sizeof gp, "%s/plot.gp", dir);
    bool ok = false;
    const char *step = cdf; /* what failed, for the message */
    double *tok = NULL;
    int64_t *flight = NULL;
    FILE *f = fopen(cdf, "w");
    if (!f) goto cleanup;
    write_cdf_block(f, s->ttft_v, (size_t)s->completed);
    write_cdf_block(f, s->tpot_v, s->n_tpot);
    write_cdf_block(f, s->e2e_v, (size_t)s->completed);
    if (fclose(f) != 0) goto cleanup;

    /* output tokens per time bucket (each content chunk carries out/n_chunks tokens) and requests in flight */
    double dur = s->duration > 0 ? s->duration : 1e-3;
    double w = dur >= 40.0 ? 1.0 : dur / 40.0;
    size_t nb = (size_t)ceil(dur / w) + 1;
    tok = calloc(nb, sizeof *tok);
    flight = calloc(nb, sizeof *flight);
    if (!tok || !flight) goto cleanup;
    for (int64_t i = 0; i < o->num_prompts; i++) {
        const bs_req *r = &b->reqs[i];
        if (r->sent)
            for (size_t k = 0; k < nb; k++) {
                double mid = (k + 0.5) * w;
                if (r->t_send <= mid && mid < r->t_end) flight[k]++;
            }
        if (!r->ok || r->n_chunks == 0) continue;
        double per = (double)req_out_tokens(r) / (double)r->n_chunks, t = r->t_first;
        for (int64_t c = 0; c < r->n_chunks; c++) {
            if (c > 0 && (size_t)(c - 1) < r->n_itl) t += r->itl[c - 1];
            size_t k = (size_t)(t / w);
            if (k < nb) tok[k] += per;
        }
    }
    step = tput;
    f = fopen(tput, "w");
    if (!f) goto cleanup;
    for (size_t k = 0; k < nb; k++) fprintf(f, "%.4f %.4f %lld\n", (k + 0.5) * w, tok[k] / w, (long long)flight[k]);
    if (fclose(f) != 0) goto cleanup;

    step = gp;
    f = fopen(gp, "w");
    if (!f) goto cleanup;
    fprintf(f, "set terminal pngcairo size 1400,1000 noenhanced font ',10'\nset output ");
    gp_quote(f, png);
    char rate[32];
    if (isinf(o->request_rate)) snprintf(rate, sizeof rate, "inf");
    else snprintf(rate, sizeof rate, "%g req/s", o->request_rate);
    fprintf(f, "\nset multiplot layout 2,2 title ");
    char title[600];
    snprintf(title, sizeof title, "bench serve %s: %lld requests (%lld in, %lld out), rate %s, %lld ok, %lld failed",
             b->url, (long long)o->num_prompts, (long long)o->input_len, (long long)o->output_len, rate,
             (long long)s->completed, (long long)s->failed);
    gp_quote(f, title);
    fprintf(f, "\nset grid\nset key bottom right\nset ylabel 'fraction of requests'\nset yrange [0:1.02]\n");
    const char *names[3] = {"TTFT", "TPOT", "E2E latency"};
    size_t counts[3] = {(size_t)s->completed, s->n_tpot, (size_t)s->completed};
    for (int k = 0; k < 3; k++) {
        fprintf(f, "set title '%s CDF%s'\nset xlabel 'ms'\nplot ", names[k], counts[k] ? "" : " (no data)");
        gp_quote(f, cdf);
        fprintf(f, " index %d using 1:2 with steps lw 2 notitle\n", k);
    }
    fprintf(f, "set title 'output throughput and requests in flight'\nset xlabel 's since start'\n"
               "set ylabel 'output tok/s'\nset yrange [0:*]\nset y2label 'requests in flight'\nset ytics nomirror\n"
               "set y2tics\nset y2range [0:%lld]\nset key top left\nplot ",
            (long long)(b->peak_inflight + b->peak_inflight / 10 + 1));
    gp_quote(f, tput);
    fprintf(f, " using 1:2 with lines lw 2 title 'output tok/s', '' using 1:3 axes x1y2 with steps title 'in flight'\n"
               "unset multiplot\n");
    if (fclose(f) != 0) goto cleanup;

    step = NULL;
    pid_t pid;
    char *args[] = {"gnuplot", gp, NULL};
    int rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, args, environ);
    if (rc != 0) {
        fprintf(stderr, "tokenmill bench serve: --plot: cannot run gnuplot: %s\n", strerror(rc));
        goto cleanup;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "tokenmill bench serve: --plot: gnuplot failed (status %d)\n", status);
        goto cleanup;
    }
    ok = true;
cleanup:
    if (!ok && step) fprintf(stderr, "tokenmill bench serve: --plot: writing %s failed: %s\n", step, strerror(errno));
    free(tok);
    free(flight);
    unlink(cdf);
    unlink(tput);
    unlink(gp);
    rmdir(dir);
    return ok;
}

/* ---- the command ---------------------------------------------------------------------------------------- */

/* Raise the soft open-file limit toward need (each stream holds a socket). */
static void raise_nofile(int64_t need) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= (rlim_t)need) return;
    rlim_t want = (rlim_t)need;
    if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) want = rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || want < (rlim_t)need)
        fprintf(stderr, "tokenmill bench serve: warning: open-file limit %llu is below the %lld sockets wanted\n",
                (unsigned long long)want, (long long)need);
}

int tm_cmd_bench_serve(int argc, char **argv) {
    bs_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) {
        cJSON_Delete(o.extra_body);
        return rc < 0 ? 0 : rc;
    }
    if (o.plot && !have_program("gnuplot")) {
        fprintf(stderr, "tokenmill bench serve: --plot needs gnuplot, which is not on PATH "
                        "(install the gnuplot-nox package, e.g. through scripts/deps.sh)\n");
        cJSON_Delete(o.extra_body);
        return 2;
    }
    bs_bench b = {.o = &o};
    bs_results s = {0};
    char *root = NULL, *auth = NULL;
    struct sigaction sa = {0}, old_int, old_term, old_pipe;
    bool sig_set = false;
    rc = 1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "tokenmill bench serve: curl_global_init failed\n");
        cJSON_Delete(o.extra_body);
        return 1;
    }
    /* root: the base URL without trailing '/' (and without a trailing /v1 when the endpoint has it) */
    root = strdup(o.base_url);
    if (!root) goto cleanup;
    size_t rl = strlen(root);
    while (rl > 0 && root[rl - 1] == '/') root[--rl] = '\0';
    if (rl >= 3 && !strcmp(root + rl - 3, "/v1") && !strncmp(o.endpoint, "/v1/", 4)) root[rl - 3] = '\0';
    if (asprintf(&b.url, "%s%s", root, o.endpoint) < 0) {
        b.url = NULL;
        goto cleanup;
    }
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    if (hl) b.headers = hl;
    hl = hl ? curl_slist_append(b.headers, "Accept: text/event-stream") : NULL;
    hl = hl ? curl_slist_append(b.headers, "Expect:") : NULL; /* no 100-continue round trip */
    if (hl && o.api_key) {
        if (asprintf(&auth, "Authorization: Bearer %s", o.api_key) < 0) {
            auth = NULL;
            goto cleanup;
        }
        hl = curl_slist_append(b.headers, auth);
    }
    if (!hl) goto cleanup;
    b.model = o.model ? strdup(o.model) : discover_model(root, b.headers, o.timeout_s);
    if (!b.model) goto cleanup;

    int64_t n = o.num_prompts;
    b.reqs = calloc((size_t)n, sizeof *b.reqs);
    b.arrival = calloc((size_t)n, sizeof *b.arrival);
    if (!b.reqs || !b.arrival) {
        fprintf(stderr, "tokenmill bench serve: out of memory for %lld requests\n", (long long)n);
        goto cleanup;
    }
    tm_bs_arrivals(o.request_rate, (size_t)n, o.seed, b.arrival);
    tm_rng prng;
    tm_rng_seed(&prng, o.seed ^ 0x9e3779b97f4a7c15ull);
    for (int64_t i = 0; i < n; i++) {
        b.reqs[i].b = &b;
        b.reqs[i].body = build_body(&o, b.model, &prng);
        if (!b.reqs[i].body) {
            fprintf(stderr, "tokenmill bench serve: out of memory building request %lld\n", (long long)i);
            goto cleanup;
        }
    }
    int64_t conc = o.max_concurrency ? (o.max_concurrency < n ? o.max_concurrency : n) : n;
    raise_nofile(conc + 64);
    b.multi = curl_multi_init();
    if (!b.multi) {
        fprintf(stderr, "tokenmill bench serve: curl_multi_init failed\n");
        goto cleanup;
    }
    curl_multi_setopt(b.multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)(o.max_concurrency ? conc : 0));
    curl_multi_setopt(b.multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    curl_multi_setopt(b.multi, CURLMOPT_MAXCONNECTS, (long)conc);

    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sa.sa_handler = SIG_IGN; /* a server closing mid-write must not kill us (transfers run with NOSIGNAL) */
    sigaction(SIGPIPE, &sa, &old_pipe);
    sig_set = true;
    g_bs_interrupted = 0;

    run_loop(&b);

    if (!compute_results(&b, &s)) {
        fprintf(stderr, "tokenmill bench serve: out of memory computing results\n");
        goto cleanup;
    }
    if (o.json) print_json(&b, &s);
    else print_text(&b, &s);
    fflush(stdout);
    rc = b.interrupted ? 130 : s.completed > 0 ? 0 : 1;
    if (o.plot && s.completed > 0) {
        if (!plot(&b, &s, o.plot)) rc = rc ? rc : 1;
        else if (!o.json) printf("plot written to %s\n", o.plot);
    } else if (o.plot) fprintf(stderr, "tokenmill bench serve: --plot: no successful request to draw\n");
cleanup:
    if (sig_set) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGPIPE, &old_pipe, NULL);
    }
    for (int64_t i = 0; b.reqs && i < o.num_prompts; i++) {
        bs_req *r = &b.reqs[i];
        if (r->h) {
            curl_multi_remove_handle(b.multi, r->h);
            curl_easy_cleanup(r->h);
        }
        tm_bs_sse_free(&r->sse);
        free(r->body);
        free(r->itl);
        free(r->errbody);
    }
    results_free(&s);
    if (b.multi) curl_multi_cleanup(b.multi);
    curl_slist_free_all(b.headers);
    free(b.reqs);
    free(b.arrival);
    free(b.model);
    free(b.url);
    free(auth);
    free(root);
    cJSON_Delete(o.extra_body);
    curl_global_cleanup();
    return rc;
}
