/* test_server.c -- the server's pure parts (request parsing and validation, error objects, the key check, SSE
 * framing, UTF-8 clean-up) and the server itself in-process: requests over a socket, a client that hangs up
 * mid-stream, and a shutdown with a live stream (ASan: nothing leaks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "model/tm_model.h"
#include "server/tm_server.h"
#include "tm_test_tiny_model.h"

/* ---- parsing ------------------------------------------------------------------------------------------ */

static bool parse(tm_srv_kind k, const char *body, tm_srv_request *r, tm_srv_error *e) {
    memset(e, 0, sizeof *e);
    return tm_srv_parse_request(k, body, strlen(body), r, e);
}

/* Parse must fail with status 400, naming param (may be NULL) and a message containing needle. */
static void expect_bad(tm_srv_kind k, const char *body, const char *param, const char *needle) {
    tm_srv_request r;
    tm_srv_error e;
    bool ok = parse(k, body, &r, &e);
    if (ok) {
        tm_srv_request_free(&r);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (param) {
        assert_non_null(e.param);
        assert_string_equal(e.param, param);
    }
    if (!strstr(e.message, needle)) fail_msg("message '%s' lacks '%s' (body %s)", e.message, needle, body);
    assert_null(r.json); /* nothing kept */
}

static void test_parse_completion_fields(void **st) {
    (void)st;
    tm_srv_request r;
    tm_srv_error e;
    const char *body = "{\"model\": \"m\", \"prompt\": \"Hello\", \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9,"
                       " \"top_k\": 20, \"min_p\": 0.1, \"seed\": 42, \"stop\": [\"a\", \"bc\"], \"presence_penalty\": 0.5,"
                       " \"frequency_penalty\": -0.25, \"logprobs\": 3, \"stream\": true,"
                       " \"stream_options\": {\"include_usage\": true}, \"n\": 2, \"priority\": -3, \"ignore_eos\": true,"
                       " \"user\": \"u\", \"echo\": false, \"logit_bias\": {}}";
    assert_true(parse(TM_SRV_COMPLETIONS, body, &r, &e));
    assert_string_equal(r.model, "m");
    assert_string_equal(r.prompt_text, "Hello");
    assert_int_equal(r.max_tokens, 7);
    assert_float_equal(r.sampling.temperature, 0.5f, 1e-6);
    assert_float_equal(r.sampling.top_p, 0.9f, 1e-6);
    assert_int_equal(r.sampling.top_k, 20);
    assert_float_equal(r.sampling.min_p, 0.1f, 1e-6);
    assert_true(r.seed_given);
    assert_int_equal(r.sampling.seed, 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_float_equal(r.sampling.presence_penalty, 0.5f, 1e-6);
    assert_float_equal(r.sampling.frequency_penalty, -0.25f, 1e-6);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_int_equal(r.sampling.n_logprobs, 3);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.priority, -3);
    assert_true(r.ignore_eos);
    tm_srv_request_free(&r);

    /* OpenAI's defaults; token-id prompts; a one-element batch; nulls are "not given" */
    assert_true(parse(TM_SRV_COMPLETIONS, "{\"prompt\": [[1, 2, 3]], \"temperature\": null, \"stop\": \"x\"}", &r, &e));
    assert_null(r.prompt_text);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 3);
    assert_int_equal(r.max_tokens, -1);
    assert_float_equal(r.sampling.temperature, 1.0f, 0);
    assert_float_equal(r.sampling.top_p, 1.0f, 0);
    assert_int_equal(r.sampling.top_k, 0);
    assert_float_equal(r.sampling.min_p, 0.0f, 0);
    assert_false(r.seed_given);
    assert_false(r.logprobs);
    assert_int_equal(r.sampling.n_logprobs, 0);
    assert_int_equal(r.n_stop, 1);
    assert_int_equal(r.n, 1);
    tm_srv_request_free(&r);

    /* logprobs 0: the sampled token's logprob only (the engine is asked for one alternative) */
    assert_true(parse(TM_SRV_COMPLETIONS, "{\"prompt\": \"x\", \"logprobs\": 0, \"seed\": -1}", &r, &e));
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    assert_int_equal(r.sampling.n_logprobs, 1);
    assert_int_equal(r.sampling.seed, UINT64_MAX); /* -1 wraps like an int64 */
    tm_srv_request_free(&r);
}

static void test_parse_chat_fields(void **st) {
    (void)st;
    tm_srv_request r;
    tm_srv_error e;
    const char *body = "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be terse.\"},"
                       " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hel\"}, {\"type\": \"text\", \"text\": \"lo\"}]},"
                       " {\"role\": \"assistant\", \"content\": null}],"
                       " \"max_completion_tokens\": 5, \"max_tokens\": 9, \"logprobs\": true, \"top_logprobs\": 4,"
                       " \"response_format\": {\"type\": \"text\"}, \"tools\": []}";
    assert_true(parse(TM_SRV_CHAT, body, &r, &e));
    assert_int_equal(r.n_msgs, 3);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[0].content, "Be terse.");
    assert_string_equal(r.msgs[1].content, "Hello");
    assert_string_equal(r.msgs[2].role, "assistant");
    assert_string_equal(r.msgs[2].content, "");
    assert_int_equal(r.max_tokens, 5); /* max_completion_tokens wins */
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 4);
    assert_int_equal(r.sampling.n_logprobs, 4);
    assert_true(r.add_generation_prompt);
    tm_srv_request_free(&r);
}

static void test_parse_errors(void **st) {
    (void)st;
    const tm_srv_kind C = TM_SRV_COMPLETIONS, H = TM_SRV_CHAT;
    expect_bad(C, "{\"prompt\": \"x\"", NULL, "invalid JSON");
    expect_bad(C, "{\"prompt\": \"x\"} trailing", NULL, "invalid JSON");
    expect_bad(C, "", NULL, "empty");
    expect_bad(C, "[1, 2]", NULL, "must be a JSON object");
    expect_bad(C, "{\"prompt\": \"\xff\"}", NULL, "not valid UTF-8");
    expect_bad(C, "{\"prompt\": \"\xc0\xaf\"}", NULL, "not valid UTF-8"); /* overlong */
    expect_bad(C, "{}", "prompt", "required");
    expect_bad(C, "{\"prompt\": 5}", "prompt", "string or an array");
    expect_bad(C, "{\"prompt\": []}", "prompt", "empty");
    expect_bad(C, "{\"prompt\": [1, -2]}", "prompt", "token id");
    expect_bad(C, "{\"prompt\": [1, 2.5]}", "prompt", "token id");
    expect_bad(C, "{\"prompt\": [\"a\", \"b\"]}", "prompt", "batched");
    expect_bad(C, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature", "must be a number");
    expect_bad(C, "{\"prompt\": \"x\", \"temperature\": 2.5}", "temperature", "[0, 2]");
    expect_bad(C, "{\"prompt\": \"x\", \"top_p\": 0}", "top_p", "(0, 1]");
    expect_bad(C, "{\"prompt\": \"x\", \"top_k\": 1.5}", "top_k", "integer");
    expect_bad(C, "{\"prompt\": \"x\", \"top_k\": -2}", "top_k", "[-1,");
    expect_bad(C, "{\"prompt\": \"x\", \"min_p\": 1.5}", "min_p", "[0, 1]");
    expect_bad(C, "{\"prompt\": \"x\", \"presence_penalty\": 3}", "presence_penalty", "[-2, 2]");
    expect_bad(C, "{\"prompt\": \"x\", \"frequency_penalty\": true}", "frequency_penalty", "must be a number");
    expect_bad(C, "{\"prompt\": \"x\", \"max_tokens\": 0}", "max_tokens", "at least 1");
    expect_bad(C, "{\"prompt\": \"x\", \"max_tokens\": -5}", "max_tokens", "at least 1");
    expect_bad(C, "{\"prompt\": \"x\", \"max_tokens\": \"7\"}", "max_tokens", "integer");
    expect_bad(C, "{\"prompt\": \"x\", \"seed\": 1.5}", "seed", "integer");
    expect_bad(C, "{\"prompt\": \"x\", \"seed\": 1e30}", "seed", "integer");
    expect_bad(C, "{\"prompt\": \"x\", \"stop\": 3}", "stop", "string or an array");
    expect_bad(C, "{\"prompt\": \"x\", \"stop\": [\"a\", 1]}", "stop", "must be strings");
    expect_bad(C, "{\"prompt\": \"x\", \"stop\": \"\"}", "stop", "empty");
    expect_bad(C, "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
               "stop", "at most 16");
    expect_bad(C, "{\"prompt\": \"x\", \"n\": 0}", "n", "[1, 16]");
    expect_bad(C, "{\"prompt\": \"x\", \"n\": 17}", "n", "[1, 16]");
    expect_bad(C, "{\"prompt\": \"x\", \"stream\": \"yes\"}", "stream", "boolean");
    expect_bad(C, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", "stream_options", "only allowed");
    expect_bad(C, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", "include_usage", "boolean");
    expect_bad(C, "{\"prompt\": \"x\", \"logprobs\": 21}", "logprobs", "[0, 20]");
    expect_bad(C, "{\"prompt\": \"x\", \"logprobs\": true}", "logprobs", "integer");
    expect_bad(C, "{\"prompt\": \"x\", \"echo\": true}", "echo", "not supported");
    expect_bad(C, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 10}}", "logit_bias", "not supported");
    expect_bad(C, "{\"prompt\": \"x\", \"best_of\": 3}", "best_of", "not supported");
    expect_bad(C, "{\"prompt\": \"x\", \"model\": 3}", "model", "must be a string");
    expect_bad(C, "{\"prompt\": \"x\", \"priority\": 1e12}", "priority", "must be in");
    expect_bad(H, "{}", "messages", "required");
    expect_bad(H, "{\"messages\": {}}", "messages", "must be an array");
    expect_bad(H, "{\"messages\": []}", "messages", "empty");
    expect_bad(H, "{\"messages\": [5]}", "messages", "must be an object");
    expect_bad(H, "{\"messages\": [{\"content\": \"x\"}]}", "messages", "role must be a string");
    expect_bad(H, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "messages", "not supported");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\"}]}", "messages", "content is required");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages", "must be a string or an array");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages", "not supported");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 3}", "logprobs", "boolean");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", "top_logprobs", "needs 'logprobs'");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 0}",
               "max_completion_tokens", "at least 1");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}", "tools",
               "not supported");
    expect_bad(H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_object\"}}",
               "response_format", "not supported");
    /* a NUL byte inside the body */
    tm_srv_request r;
    tm_srv_error e;
    const char nul[] = "{\"prompt\": \"a\0b\"}";
    assert_false(tm_srv_parse_request(C, nul, sizeof nul - 1, &r, &e));
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "NUL"));
}

static void test_error_json_shape(void **st) {
    (void)st;
    tm_srv_error e;
    assert_false(tm_srv_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "no model '%s'", "x"));
    char *s = tm_srv_error_json(&e);
    cJSON *j = cJSON_Parse(s);
    assert_non_null(j);
    cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "error");
    assert_true(cJSON_IsObject(o));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring, "no model 'x'");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "type")->valuestring, "invalid_request_error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "param")->valuestring, "model");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "code")->valuestring, "model_not_found");
    cJSON_Delete(j);
    free(s);
    tm_srv_fail(&e, 400, "invalid_request_error", NULL, NULL, "quote \" and newline \n");
    s = tm_srv_error_json(&e);
    j = cJSON_Parse(s);
    o = cJSON_GetObjectItemCaseSensitive(j, "error");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "param")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "code")));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring, "quote \" and newline \n");
    cJSON_Delete(j);
    free(s);
}

static void test_auth(void **st) {
    (void)st;
    assert_true(tm_srv_auth_ok(NULL, NULL));
    assert_true(tm_srv_auth_ok("", "whatever"));
    assert_true(tm_srv_auth_ok("sekret", "Bearer sekret"));
    assert_true(tm_srv_auth_ok("sekret", "bearer sekret"));
    assert_false(tm_srv_auth_ok("sekret", NULL));
    assert_false(tm_srv_auth_ok("sekret", ""));
    assert_false(tm_srv_auth_ok("sekret", "sekret"));
    assert_false(tm_srv_auth_ok("sekret", "Bearer sekreT"));
    assert_false(tm_srv_auth_ok("sekret", "Bearer sekre"));
    assert_false(tm_srv_auth_ok("sekret", "Bearer sekrets"));
    assert_false(tm_srv_auth_ok("sekret", "Bearer "));
    assert_false(tm_srv_auth_ok("sekret", "Basic sekret"));
}

static void check_sse(const char *data, size_t n, const char *want) {
    tm_srv_buf b = {0};
    tm_srv_sse_event(&b, data, n);
    assert_false(b.oom);
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.p, want, b.len);
    tm_srv_buf_free(&b);
}

static void test_sse_framing(void **st) {
    (void)st;
    check_sse("{\"a\":1}", 7, "data: {\"a\":1}\n\n");
    check_sse("[DONE]", 6, "data: [DONE]\n\n");
    check_sse("", 0, "data: \n\n");
    check_sse("one\ntwo", 7, "data: one\ndata: two\n\n");
    check_sse("one\r\ntwo\rthree", 14, "data: one\ndata: two\ndata: three\n\n");
    check_sse("end\n", 4, "data: end\ndata: \n\n");
    /* events append */
    tm_srv_buf b = {0};
    tm_srv_sse_event(&b, "x", 1);
    tm_srv_sse_event(&b, "y", 1);
    assert_string_equal(b.p, "data: x\n\ndata: y\n\n");
    tm_srv_buf_free(&b);
}

static void test_utf8_sanitize(void **st) {
    (void)st;
    char *s = tm_srv_utf8_sanitize("ok \xc3\xa9", 5);
    assert_string_equal(s, "ok \xc3\xa9");
    free(s);
    s = tm_srv_utf8_sanitize("a\xe2\x80", 3); /* a truncated sequence: each bad byte becomes U+FFFD */
    assert_string_equal(s, "a\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
    s = tm_srv_utf8_sanitize("", 0);
    assert_string_equal(s, "");
    free(s);
}

/* ---- the server in-process ------------------------------------------------------------------------------ */

static int connect_to(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_request(int fd, const char *method, const char *path, const char *body) {
    char head[512];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n", method,
                     path, body ? strlen(body) : 0);
    assert_int_equal(write(fd, head, (size_t)n), n);
    if (body) assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
}

/* Read until EOF (or cap); returns a malloc'ed NUL-terminated string. */
static char *read_all(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    buf[len] = '\0';
    return buf;
}

/* Read until needle appears (5 s at most); returns what was read. */
static char *read_until(int fd, const char *needle) {
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    double t0 = tm_time_s();
    while (!strstr(buf, needle) && tm_time_s() - t0 < 5.0) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
        buf[len] = '\0';
    }
    return buf;
}

static char *http(uint16_t port, const char *method, const char *path, const char *body) {
    int fd = connect_to(port);
    send_request(fd, method, path, body);
    char *r = read_all(fd);
    close(fd);
    return r;
}

static double metric(uint16_t port, const char *name) {
    char *m = http(port, "GET", "/metrics", NULL);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(m, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1.0;
    free(m);
    return v;
}

typedef struct live_server {
    tm_model *m;
    tm_server *s;
    uint16_t port;
    bool tiny; /* the tiny random model (TM_MODEL not set): fast enough to finish a stream before a shutdown */
} live_server;

static void start_server(live_server *ls) {
    const char *path = getenv("TM_MODEL");
    ls->tiny = !path || access(path, R_OK) != 0;
    if (ls->tiny) {
        tiny_opts o = tiny_default();
        path = write_tiny(&o);
    }
    tm_error err = {0};
    if (tm_model_load(path, &ls->m, &err) != TM_OK) fail_msg("model: %s", err.msg);
    tm_engine_cfg ec = {.runner = {.n_threads = 2, .n_ctx = 256, .max_batch_tokens = 64, .block_size = 16, .n_seqs = 2},
                        .sched = {.max_seqs = 2}};
    tm_server_cfg sc = {.host = "127.0.0.1", .port = 0, .model_id = "test-model", .chat_template = "chatml"};
    if (tm_server_create(ls->m, &ec, &sc, &ls->s, &err) != TM_OK) fail_msg("server: %s", err.msg);
    ls->port = tm_server_port(ls->s);
    assert_true(ls->port > 0);
}

static void stop_server(live_server *ls) {
    tm_server_free(ls->s);
    tm_model_free(ls->m);
}

static void test_server_requests(void **st) {
    (void)st;
    live_server ls;
    start_server(&ls);
    char *r = http(ls.port, "GET", "/health", NULL);
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    free(r);
    r = http(ls.port, "GET", "/v1/models", NULL);
    assert_non_null(strstr(r, "\"id\":\"test-model\""));
    free(r);
    r = http(ls.port, "POST", "/v1/completions", "{\"prompt\": [5, 6, 7, 8], \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(r, "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":4,\"total_tokens\":8,"
                              "\"prompt_tokens_details\":{\"cached_tokens\":0}}"));
    free(r);
    r = http(ls.port, "POST", "/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 3, \"stream\": true, \"seed\": 1}");
    assert_non_null(strstr(r, "text/event-stream"));
    assert_non_null(strstr(r, "\"role\":\"assistant\""));
    assert_non_null(strstr(r, "data: [DONE]"));
    free(r);
    r = http(ls.port, "POST", "/v1/completions", "{\"prompt\": \"x\", \"model\": \"other\"}");
    assert_non_null(strstr(r, "HTTP/1.1 404"));
    assert_non_null(strstr(r, "model_not_found"));
    free(r);
    r = http(ls.port, "PUT", "/v1/completions", "{}");
    assert_non_null(strstr(r, "HTTP/1.1 405"));
    free(r);
    r = http(ls.port, "GET", "/nope", NULL);
    assert_non_null(strstr(r, "HTTP/1.1 404"));
    free(r);
    r = http(ls.port, "POST", "/detokenize", "{\"tokens\": [5, 6]}");
    assert_non_null(strstr(r, "\"prompt\":"));
    free(r);
    stop_server(&ls);
}

/* A client that hangs up mid-stream: its request is aborted and its blocks go back to the pool. */
static void test_server_disconnect(void **st) {
    (void)st;
    live_server ls;
    start_server(&ls);
    int fd = connect_to(ls.port);
    send_request(fd, "POST", "/v1/completions",
                 "{\"prompt\": [5, 6, 7, 8, 9, 10], \"max_tokens\": 200, \"ignore_eos\": true, \"stream\": true}");
    char *got = read_until(fd, "\"text\":");
    assert_non_null(strstr(got, "\"text\":"));
    free(got);
    close(fd);
    double t0 = tm_time_s(), running = -1, kv = -1;
    while (tm_time_s() - t0 < 10.0) {
        running = metric(ls.port, "tokenmill:num_requests_running");
        kv = metric(ls.port, "tokenmill:kv_cache_usage_perc");
        if (running == 0 && kv == 0) break;
        usleep(20000);
    }
    assert_true(running == 0);
    assert_true(kv == 0);
    assert_true(metric(ls.port, "tokenmill:request_success_total{finished_reason=\"abort\"}") == 1);
    stop_server(&ls);
}

/* Shutdown with a live stream: the client gets a final event and [DONE]; nothing leaks. */
static void test_server_shutdown_live_stream(void **st) {
    (void)st;
    live_server ls;
    start_server(&ls);
    int fd = connect_to(ls.port);
    send_request(fd, "POST", "/v1/completions",
                 "{\"prompt\": [5, 6, 7, 8, 9, 10], \"max_tokens\": 240, \"ignore_eos\": true, \"stream\": true}");
    char *got = read_until(fd, "\"text\":");
    assert_non_null(strstr(got, "\"text\":"));
    stop_server(&ls); /* the stream either finished by now or is aborted with an error event */
    char *rest = read_all(fd);
    close(fd);
    size_t L = strlen(got) + strlen(rest);
    char *all = malloc(L + 1);
    snprintf(all, L + 1, "%s%s", got, rest);
    assert_non_null(strstr(all, "data: [DONE]"));
    if (ls.tiny) assert_true(strstr(all, "shutting down") || strstr(all, "\"finish_reason\":\"length\""));
    else assert_non_null(strstr(all, "the request was aborted: the server is shutting down"));
    free(all);
    free(got);
    free(rest);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_completion_fields),
        cmocka_unit_test(test_parse_chat_fields),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_error_json_shape),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_sse_framing),
        cmocka_unit_test(test_utf8_sanitize),
        cmocka_unit_test(test_server_requests),
        cmocka_unit_test(test_server_disconnect),
        cmocka_unit_test(test_server_shutdown_live_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
