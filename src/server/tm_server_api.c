/* tm_server_api.c -- OpenAI request parsing and validation, error objects, SSE framing, the key check. */
#include "server/tm_server.h"

#include "tokenizer/tm_tok.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* cJSON records the last parse error in a global; parses are serialised so that threads never race on it. */
static pthread_mutex_t g_parse_mu = PTHREAD_MUTEX_INITIALIZER;

bool tm_srv_fail(tm_srv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                 ...) {
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(e, param, ...) tm_srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

char *tm_srv_error_json(const tm_srv_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_CreateObject();
    if (!root || !o) {
        cJSON_Delete(root);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToObject(root, "error", o);
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char *json_type_name(const cJSON *j) {
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsNull(j)) return "null";
    return "invalid";
}

/* Body checks shared by every JSON endpoint: UTF-8, no NUL, syntax, an object at the top. */
static cJSON *parse_body(const char *body, size_t len, tm_srv_error *e) {
    size_t bad = 0;
    if (len == 0) {
        BAD(e, NULL, "the request body is empty; expected a JSON object");
        return NULL;
    }
    if (!tm_tok_utf8_valid(body, len, &bad)) {
        BAD(e, NULL, "the request body is not valid UTF-8 (invalid byte at offset %zu)", bad);
        return NULL;
    }
    const char *nul = memchr(body, '\0', len);
    if (nul) {
        BAD(e, NULL, "invalid JSON in the request body: NUL byte at offset %zu", (size_t)(nul - body));
        return NULL;
    }
    char *copy = tm_strndup(body, len); /* NUL-terminated, so trailing garbage is detected */
    if (!copy) {
        tm_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    const char *end = NULL;
    pthread_mutex_lock(&g_parse_mu);
    cJSON *j = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 1);
    pthread_mutex_unlock(&g_parse_mu);
    size_t at = end && end >= copy ? (size_t)(end - copy) : 0;
    free(copy);
    if (!j) {
        BAD(e, NULL, "invalid JSON in the request body (error at byte %zu of %zu)", at > len ? len : at, len);
        return NULL;
    }
    if (!cJSON_IsObject(j)) {
        BAD(e, NULL, "the request body must be a JSON object, got %s", json_type_name(j));
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

void *tm_srv_parse_json_object(const char *body, size_t len, tm_srv_error *e) { return parse_body(body, len, e); }
void tm_srv_json_free(void *json) { cJSON_Delete(json); }

/* ---- typed field getters: absent and null are "not given" -------------------------------------------- */

static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return j && !cJSON_IsNull(j) ? j : NULL;
}

static bool get_bool(const cJSON *o, const char *key, bool *out, bool *given, tm_srv_error *e) {
    const cJSON *j = field(o, key);
    if (given) *given = j != NULL;
    if (!j) return true;
    if (!cJSON_IsBool(j)) return BAD(e, key, "'%s' must be a boolean, got %s", key, json_type_name(j));
    *out = cJSON_IsTrue(j);
    return true;
}

static bool get_num(const cJSON *o, const char *key, double lo, double hi, double *out, bool *given, tm_srv_error *e) {
    const cJSON *j = field(o, key);
    if (given) *given = j != NULL;
    if (!j) return true;
    if (!cJSON_IsNumber(j)) return BAD(e, key, "'%s' must be a number, got %s", key, json_type_name(j));
    double v = j->valuedouble;
    if (!isfinite(v) || v < lo || v > hi) return BAD(e, key, "'%s' must be in [%g, %g], got %g", key, lo, hi, v);
    *out = v;
    return true;
}

static bool is_integer(double v) { return isfinite(v) && v == floor(v); }

static bool get_int(const cJSON *o, const char *key, double lo, double hi, int64_t *out, bool *given, tm_srv_error *e) {
    const cJSON *j = field(o, key);
    if (given) *given = j != NULL;
    if (!j) return true;
    if (!cJSON_IsNumber(j) || !is_integer(j->valuedouble))
        return BAD(e, key, "'%s' must be an integer, got %s", key,
                   cJSON_IsNumber(j) ? "a fractional number" : json_type_name(j));
    double v = j->valuedouble;
    if (v < lo || v > hi) return BAD(e, key, "'%s' must be in [%.0f, %.0f], got %.0f", key, lo, hi, v);
    *out = (int64_t)v;
    return true;
}

static bool get_str(const cJSON *o, const char *key, const char **out, tm_srv_error *e) {
    const cJSON *j = field(o, key);
    if (!j) return true;
    if (!cJSON_IsString(j)) return BAD(e, key, "'%s' must be a string, got %s", key, json_type_name(j));
    *out = j->valuestring;
    return true;
}

/* ---- requests ------------------------------------------------------------------------------------- */

void tm_srv_request_free(tm_srv_request *r) {
    if (!r) return;
    cJSON_Delete(r->json);
    free(r->prompt_ids);
    free(r->msgs);
    for (size_t i = 0; i < r->n_parts; i++) free(r->parts[i]);
    free(r->parts);
    memset(r, 0, sizeof *r);
}

static bool parse_prompt(tm_srv_request *r, const cJSON *root, tm_srv_error *e) {
    const cJSON *p = field(root, "prompt");
    if (!p) return BAD(e, "prompt", "'prompt' is required");
    /* a one-element batch is the same as its element */
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    if (cJSON_IsString(p)) {
        r->prompt_text = p->valuestring;
        return true;
    }
    if (!cJSON_IsArray(p)) return BAD(e, "prompt", "'prompt' must be a string or an array of token ids, got %s", json_type_name(p));
    int n = cJSON_GetArraySize(p);
    if (n == 0) return BAD(e, "prompt", "'prompt' is empty");
    if (cJSON_IsString(p->child) || cJSON_IsArray(p->child))
        return BAD(e, "prompt", "batched prompts (%d) are not supported: send one request per prompt", n);
    r->prompt_ids = tm_malloc_array((size_t)n, sizeof(int32_t));
    if (!r->prompt_ids) return tm_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i = 0;
    for (const cJSON *t = p->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || !is_integer(t->valuedouble) || t->valuedouble < 0 || t->valuedouble > INT32_MAX)
            return BAD(e, "prompt", "'prompt' token %zu must be a non-negative integer token id, got %s", i,
                       cJSON_IsNumber(t) ? "another number" : json_type_name(t));
        r->prompt_ids[i] = (int32_t)t->valuedouble;
    }
    r->n_prompt_ids = i;
    return true;
}

/* content: a string, or an array of {"type": "text", "text": ...} parts (joined) */
static bool message_content(tm_srv_request *r, const cJSON *c, size_t idx, const char **out, tm_srv_error *e) {
    if (!c) {
        *out = "";
        return true;
    }
    if (cJSON_IsString(c)) {
        *out = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return BAD(e, "messages", "messages[%zu].content must be a string or an array of text parts, got %s", idx,
                   json_type_name(c));
    size_t total = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type))
            return BAD(e, "messages", "messages[%zu].content parts must be objects with a 'type'", idx);
        if (strcmp(type->valuestring, "text") != 0)
            return BAD(e, "messages", "messages[%zu].content: part type '%s' is not supported (text only)", idx,
                       type->valuestring);
        if (!cJSON_IsString(text)) return BAD(e, "messages", "messages[%zu].content: a text part needs a string 'text'", idx);
        total += strlen(text->valuestring);
    }
    char *joined = tm_malloc(total + 1);
    char **np = realloc(r->parts, (r->n_parts + 1) * sizeof *np);
    if (!joined || !np) {
        free(joined);
        if (np) r->parts = np;
        return tm_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    r->parts = np;
    r->parts[r->n_parts++] = joined;
    size_t off = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t L = strlen(t);
        memcpy(joined + off, t, L);
        off += L;
    }
    joined[off] = '\0';
    *out = joined;
    return true;
}

static bool parse_messages(tm_srv_request *r, const cJSON *root, tm_srv_error *e) {
    const cJSON *m = field(root, "messages");
    if (!m) return BAD(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(m)) return BAD(e, "messages", "'messages' must be an array, got %s", json_type_name(m));
    int n = cJSON_GetArraySize(m);
    if (n == 0) return BAD(e, "messages", "'messages' is empty");
    r->msgs = tm_calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) return tm_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i = 0;
    for (const cJSON *it = m->child; it; it = it->next, i++) {
        if (!cJSON_IsObject(it)) return BAD(e, "messages", "messages[%zu] must be an object, got %s", i, json_type_name(it));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(role)) return BAD(e, "messages", "messages[%zu].role must be a string", i);
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            return BAD(e, "messages", "messages[%zu].role '%s' is not supported (system, developer, user, assistant)", i,
                       role->valuestring);
        const cJSON *c = field(it, "content");
        if (!c && strcmp(rs, "assistant") != 0) return BAD(e, "messages", "messages[%zu].content is required", i);
        const cJSON *tc = field(it, "tool_calls");
        if (tc && !(cJSON_IsArray(tc) && cJSON_GetArraySize(tc) == 0))
            return BAD(e, "messages", "messages[%zu]: tool calls are not supported", i);
        r->msgs[i].role = rs;
        if (!message_content(r, c, i, &r->msgs[i].content, e)) return false;
    }
    r->n_msgs = i;
    return true;
}

static bool parse_stop(tm_srv_request *r, const cJSON *root, tm_srv_error *e) {
    const cJSON *s = field(root, "stop");
    if (!s) return true;
    if (cJSON_IsString(s)) {
        if (!*s->valuestring) return BAD(e, "stop", "'stop' must not be an empty string");
        r->stop[r->n_stop++] = s->valuestring;
        return true;
    }
    if (!cJSON_IsArray(s)) return BAD(e, "stop", "'stop' must be a string or an array of strings, got %s", json_type_name(s));
    if (cJSON_GetArraySize(s) > TM_SRV_MAX_STOP)
        return BAD(e, "stop", "'stop' has %d strings; at most %d are allowed", cJSON_GetArraySize(s), TM_SRV_MAX_STOP);
    for (const cJSON *it = s->child; it; it = it->next) {
        if (!cJSON_IsString(it)) return BAD(e, "stop", "'stop' entries must be strings, got %s", json_type_name(it));
        if (!*it->valuestring) return BAD(e, "stop", "'stop' entries must not be empty");
        r->stop[r->n_stop++] = it->valuestring;
    }
    return true;
}

/* Fields we cannot honour: refuse them when they would change the answer, accept their neutral values. */
static bool check_unsupported(const cJSON *root, tm_srv_kind kind, tm_srv_error *e) {
    const cJSON *j;
    if ((j = field(root, "echo")) && !cJSON_IsFalse(j)) return BAD(e, "echo", "'echo' is not supported");
    if ((j = field(root, "suffix")) && !(cJSON_IsString(j) && !*j->valuestring))
        return BAD(e, "suffix", "'suffix' is not supported");
    if ((j = field(root, "logit_bias")) && !(cJSON_IsObject(j) && !j->child))
        return BAD(e, "logit_bias", "'logit_bias' is not supported");
    if ((j = field(root, "tools")) && !(cJSON_IsArray(j) && !j->child)) return BAD(e, "tools", "'tools' are not supported");
    if ((j = field(root, "functions")) && !(cJSON_IsArray(j) && !j->child))
        return BAD(e, "functions", "'functions' are not supported");
    if ((j = field(root, "response_format"))) {
        const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "type") : NULL;
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0)
            return BAD(e, "response_format", "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    (void)kind;
    return true;
}

bool tm_srv_parse_request(tm_srv_kind kind, const char *body, size_t len, tm_srv_request *r, tm_srv_error *e) {
    memset(r, 0, sizeof *r);
    cJSON *root = parse_body(body, len, e);
    if (!root) return false;
    r->kind = kind;
    r->json = root;
    r->max_tokens = -1;
    r->n = 1;
    r->add_generation_prompt = true;
    /* OpenAI's defaults: plain sampling from the model's distribution */
    tm_sampling_params *sp = &r->sampling;
    *sp = tm_sampling_default();
    sp->temperature = 1.0f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
    sp->repeat_penalty = 1.0f;
    sp->presence_penalty = sp->frequency_penalty = 0.0f;
    sp->n_logprobs = 0;
    double d;
    int64_t v;
    bool given;
    if (!get_str(root, "model", &r->model, e)) goto fail;
    if (kind == TM_SRV_COMPLETIONS ? !parse_prompt(r, root, e) : !parse_messages(r, root, e)) goto fail;
    if (kind == TM_SRV_CHAT && !get_bool(root, "add_generation_prompt", &r->add_generation_prompt, NULL, e)) goto fail;
    if (!check_unsupported(root, kind, e)) goto fail;
    /* max_completion_tokens (chat's newer name) wins over max_tokens */
    const char *mt_key = field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (!get_int(root, mt_key, -1e18, 1e18, &v, &given, e)) goto fail;
    if (given) {
        if (v < 1) {
            BAD(e, mt_key, "'%s' must be at least 1, got %lld", mt_key, (long long)v);
            goto fail;
        }
        r->max_tokens = v > INT32_MAX ? INT32_MAX : (int32_t)v;
    }
    if (!get_num(root, "temperature", 0.0, 2.0, &d, &given, e)) goto fail;
    if (given) sp->temperature = (float)d;
    if (!get_num(root, "top_p", 0.0, 1.0, &d, &given, e)) goto fail;
    if (given) {
        if (d <= 0.0) {
            BAD(e, "top_p", "'top_p' must be in (0, 1], got %g", d);
            goto fail;
        }
        sp->top_p = (float)d;
    }
    if (!get_int(root, "top_k", -1, INT32_MAX, &v, &given, e)) goto fail;
    if (given) sp->top_k = (int32_t)v;
    if (!get_num(root, "min_p", 0.0, 1.0, &d, &given, e)) goto fail;
    if (given) sp->min_p = (float)d;
    if (!get_num(root, "presence_penalty", -2.0, 2.0, &d, &given, e)) goto fail;
    if (given) sp->presence_penalty = (float)d;
    if (!get_num(root, "frequency_penalty", -2.0, 2.0, &d, &given, e)) goto fail;
    if (given) sp->frequency_penalty = (float)d;
    if (!get_num(root, "repetition_penalty", 0.0, 100.0, &d, &given, e)) goto fail; /* extension (vLLM's name) */
    if (given) {
        if (d <= 0.0) {
            BAD(e, "repetition_penalty", "'repetition_penalty' must be > 0, got %g", d);
            goto fail;
        }
        sp->repeat_penalty = (float)d;
    }
    if (!get_int(root, "repeat_last_n", -1, INT32_MAX, &v, &given, e)) goto fail; /* extension (llama.cpp's name) */
    if (given) sp->repeat_last_n = (int32_t)v;
    const cJSON *seed = field(root, "seed");
    if ((r->seed_given = seed != NULL)) { /* any integer in [-2^63, 2^64): negative ones wrap like int64 */
        double sd = seed->valuedouble;
        if (!cJSON_IsNumber(seed) || !is_integer(sd) || sd < -9223372036854775808.0 || sd >= 18446744073709551616.0) {
            BAD(e, "seed", "'seed' must be an integer in [-2^63, 2^64), got %s",
                cJSON_IsNumber(seed) ? "another number" : json_type_name(seed));
            goto fail;
        }
        sp->seed = sd < 0 ? (uint64_t)(int64_t)sd : (uint64_t)sd;
    }
    if (!parse_stop(r, root, e)) goto fail;
    if (!get_int(root, "n", 1, TM_SRV_MAX_N, &v, &given, e)) goto fail;
    if (given) r->n = (int32_t)v;
    if (!get_int(root, "best_of", 1, TM_SRV_MAX_N, &v, &given, e)) goto fail;
    if (given && v != r->n) {
        BAD(e, "best_of", "'best_of' other than n is not supported");
        goto fail;
    }
    if (!get_bool(root, "stream", &r->stream, NULL, e)) goto fail;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) {
            BAD(e, "stream_options", "'stream_options' must be an object, got %s", json_type_name(so));
            goto fail;
        }
        if (!r->stream) {
            BAD(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto fail;
        }
        if (!get_bool(so, "include_usage", &r->include_usage, NULL, e)) goto fail;
    }
    if (kind == TM_SRV_COMPLETIONS) {
        /* legacy: logprobs = number of alternatives, the sampled token's logprob always included */
        if (!get_int(root, "logprobs", 0, TM_MAX_LOGPROBS, &v, &given, e)) goto fail;
        if (given) {
            r->logprobs = true;
            r->top_logprobs = (int32_t)v;
        }
    } else {
        if (!get_bool(root, "logprobs", &r->logprobs, NULL, e)) goto fail;
        if (!get_int(root, "top_logprobs", 0, TM_MAX_LOGPROBS, &v, &given, e)) goto fail;
        if (given) {
            if (!r->logprobs && v > 0) {
                BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
                goto fail;
            }
            r->top_logprobs = (int32_t)v;
        }
    }
    /* the engine reports the sampled token's logprob only alongside at least one alternative */
    sp->n_logprobs = r->logprobs ? (r->top_logprobs > 0 ? r->top_logprobs : 1) : 0;
    if (!get_int(root, "priority", INT32_MIN, INT32_MAX, &v, &given, e)) goto fail;
    if (given) r->priority = (int32_t)v;
    if (!get_bool(root, "ignore_eos", &r->ignore_eos, NULL, e)) goto fail;
    if (!get_str(root, "user", &(const char *){NULL}, e)) goto fail;
    return true;
fail:
    tm_srv_request_free(r);
    return false;
}

/* ---- auth ------------------------------------------------------------------------------------------- */

bool tm_srv_auth_ok(const char *expected, const char *header) {
    if (!expected || !*expected) return true;
    if (!header) return false;
    static const char prefix[] = "Bearer ";
    if (strncasecmp(header, prefix, sizeof prefix - 1) != 0) return false;
    const volatile unsigned char *given = (const unsigned char *)header + sizeof prefix - 1;
    size_t n = strlen(expected), gl = strlen((const char *)given);
    /* compare every byte of the expected key; the given key is read no further than its own end */
    unsigned diff = gl != n;
    for (size_t i = 0; i < n; i++) {
        unsigned char g = i < gl ? given[i] : 0;
        diff |= (unsigned)(g ^ (unsigned char)expected[i]);
    }
    return diff == 0;
}

/* ---- buffers and SSE ------------------------------------------------------------------------------- */

void tm_srv_buf_append(tm_srv_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void tm_srv_sse_event(tm_srv_buf *b, const char *data, size_t n) {
    size_t i = 0;
    for (;;) { /* lines end at \n, \r\n or \r (the SSE rule); a trailing newline leaves an empty last line */
        size_t j = i;
        while (j < n && data[j] != '\n' && data[j] != '\r') j++;
        tm_srv_buf_append(b, "data: ", 6);
        tm_srv_buf_append(b, data + i, j - i);
        tm_srv_buf_append(b, "\n", 1);
        if (j >= n) break;
        if (data[j] == '\r' && j + 1 < n && data[j + 1] == '\n') j++;
        i = j + 1;
    }
    tm_srv_buf_append(b, "\n", 1);
}

void tm_srv_buf_free(tm_srv_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------ */

char *tm_srv_utf8_sanitize(const char *s, size_t n) {
    tm_srv_buf b = {0};
    tm_srv_buf_append(&b, "", 0);
    size_t i = 0;
    while (i < n) {
        size_t bad = 0;
        if (tm_tok_utf8_valid(s + i, n - i, &bad)) {
            tm_srv_buf_append(&b, s + i, n - i);
            break;
        }
        tm_srv_buf_append(&b, s + i, bad);
        tm_srv_buf_append(&b, "\xEF\xBF\xBD", 3); /* U+FFFD */
        i += bad + 1;
    }
    if (b.oom) {
        tm_srv_buf_free(&b);
        return NULL;
    }
    return b.p;
}
