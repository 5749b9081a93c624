/* tm_server.c -- the HTTP server: libmicrohttpd daemon, routes, generation over tm_async, SSE, shutdown. */
#include "server/tm_server.h"

#include "model/tm_model.h"
#include "tokenizer/tm_tok.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HK_PERIOD_S 0.05 /* how often suspended connections are checked for a client that hung up */
#define DRAIN_S 5.0      /* at shutdown, how long responses get to finish sending */

/* ---- routes ------------------------------------------------------------------------------------------ */

typedef enum route_id { RT_COMPLETIONS, RT_CHAT, RT_MODELS, RT_MODEL, RT_HEALTH, RT_METRICS, RT_TOKENIZE, RT_DETOKENIZE } route_id;

typedef struct route {
    const char *path;
    bool prefix;                /* path is a prefix (followed by an id) */
    bool post;                  /* POST; otherwise GET (and HEAD) */
    bool open;                  /* served without the API key */
    route_id id;
} route;

static const route k_routes[] = {
    {"/v1/completions", false, true, false, RT_COMPLETIONS},
    {"/v1/chat/completions", false, true, false, RT_CHAT},
    {"/v1/models", false, false, false, RT_MODELS},
    {"/v1/models/", true, false, false, RT_MODEL},
    {"/health", false, false, true, RT_HEALTH},
    {"/metrics", false, false, true, RT_METRICS},
    {"/tokenize", false, true, false, RT_TOKENIZE},
    {"/detokenize", false, true, false, RT_DETOKENIZE},
};

static const route *find_route(const char *url) {
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++) {
        const route *r = &k_routes[i];
        size_t L = strlen(r->path);
        if (r->prefix ? (!strncmp(url, r->path, L) && url[L] != '\0') : !strcmp(url, r->path)) return r;
    }
    return NULL;
}

/* ---- state --------------------------------------------------------------------------------------------- */

typedef struct srv_choice {
    tm_stream *stream;          /* owned */
    bool done;                  /* its final event was read */
    const char *finish;         /* "stop", "length", "abort" */
    int32_t gen_tokens;
    int32_t cached_tokens;      /* prompt tokens the prefix cache held (usage.prompt_tokens_details) */
    tm_srv_buf text;            /* non-streaming: the completion so far */
    size_t n_chars;             /* code points of the completion so far (completions' text_offset) */
    cJSON *lp;                  /* non-streaming logprobs: chat: the "content" array; completions: the object */
} srv_choice;

typedef struct srv_req srv_req;
struct srv_req {
    tm_server *srv;
    struct MHD_Connection *conn;
    const route *rt;
    int fd;                     /* the connection's socket (watched while suspended) */
    const char *method, *url;   /* MHD's, valid until the request completes */
    tm_srv_buf body;
    uint64_t received;          /* body bytes seen, kept or dropped */
    bool too_large;
    bool answered;              /* a response is queued */
    bool has_deferred;          /* refused at the headers; answered after the body is read (keeps the connection) */
    tm_srv_error deferred;
    /* generation */
    bool generating;            /* streams were submitted */
    bool streaming;
    tm_srv_request rq;
    srv_choice *ch;             /* (n_ch) */
    int32_t n_ch;
    int32_t n_prompt;
    bool aborted;               /* a choice ended with "abort" */
    char id[48];
    int64_t created;
    tm_srv_buf out;             /* SSE bytes not yet handed over */
    size_t out_off;
    bool out_end;               /* the last event is in out */
    /* wake-up: the notify hook resumes a suspended connection or leaves a note that an event came */
    pthread_mutex_t mu;
    bool suspended, pending;
    /* the server's list of generating requests (under srv->mu) */
    srv_req *prev, *next;
    bool listed;
};

struct tm_server {
    const tm_model *model;      /* borrowed */
    tm_metrics *metrics;        /* owned */
    tm_async *async;            /* owned */
    struct MHD_Daemon *daemon;
    int32_t n_ctx;
    tm_chat_template tmpl;
    bool has_tmpl;
    char tmpl_error[700];
    char *model_id, *alias, *api_key;
    size_t max_body;
    uint16_t port;
    pthread_mutex_t mu;         /* stopping, the list, housekeeping */
    pthread_cond_t cv;          /* housekeeping tick, drain progress */
    bool stopping, hk_stop, hk_started;
    pthread_t hk;
    srv_req *active;            /* generating requests */
    size_t n_active;
    _Atomic uint64_t next_id;
    _Atomic uint64_t seed_ctr;
};

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- responses ---------------------------------------------------------------------------------------- */

static enum MHD_Result queue_body(srv_req *r, unsigned status, char *body, const char *ctype) {
    if (!body) return MHD_NO; /* out of memory: close the connection */
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->rt && r->rt->post ? "POST" : "GET, HEAD");
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    r->answered = true;
    tm_log(TM_LOG_INFO, "http: %s %s %u", r->method ? r->method : "?", r->url ? r->url : "?", status);
    return ok;
}

static enum MHD_Result queue_json(srv_req *r, unsigned status, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return queue_body(r, status, s, "application/json");
}

static enum MHD_Result queue_error(srv_req *r, const tm_srv_error *e) {
    return queue_body(r, (unsigned)e->status, tm_srv_error_json(e), "application/json");
}

/* ---- wake-up --------------------------------------------------------------------------------------------- */

/* The streams' notify hook (engine thread, under the stream's lock). */
static void on_stream_event(void *user) {
    srv_req *r = user;
    pthread_mutex_lock(&r->mu);
    if (r->suspended) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    } else {
        r->pending = true;
    }
    pthread_mutex_unlock(&r->mu);
}

/* No event to send: suspend the connection (true), or false when one came meanwhile (poll again). Called
 * only from the access handler or the content reader, as MHD requires. */
static bool suspend_or_retry(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    bool suspend = !r->pending;
    r->pending = false;
    if (suspend) {
        r->suspended = true;
        MHD_suspend_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    return suspend;
}

/* ---- the model, tokens, prompts ----------------------------------------------------------------------- */

static bool model_known(const tm_server *s, const char *name) {
    return !name || !strcmp(name, s->model_id) || (s->alias && !strcmp(name, s->alias)) ||
           (s->model->name && !strcmp(name, s->model->name));
}

static bool check_model(const tm_server *s, const char *name, tm_srv_error *e) {
    if (model_known(s, name)) return true;
    return tm_srv_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                       "The model '%s' does not exist; this server serves '%s'", name, s->model_id);
}

/* Text -> ids (BOS as the model wants it, special tokens in the text recognised). */
static bool encode(const tm_server *s, const char *text, tm_ids *ids, const char *param, tm_srv_error *e) {
    tm_error err = {0};
    if (tm_tok_encode(s->model->tok, text, strlen(text), tm_tok_add_bos(s->model->tok), true, ids, &err) != TM_OK)
        return tm_srv_fail(e, err.code == TM_ERR_NOMEM ? 500 : 400, err.code == TM_ERR_NOMEM ? "server_error" : "invalid_request_error",
                           param, NULL, "cannot tokenize the %s: %s", param, err.msg);
    return true;
}

static bool render_chat(const tm_server *s, const tm_chat_msg *msgs, size_t n, bool add_gen, char **out, tm_srv_error *e) {
    *out = NULL;
    if (!s->has_tmpl) return tm_srv_fail(e, 400, "invalid_request_error", "messages", NULL, "%s", s->tmpl_error);
    tm_error err = {0};
    if (tm_chat_template_apply(&s->tmpl, msgs, n, add_gen, out, &err) != TM_OK)
        return tm_srv_fail(e, 400, "invalid_request_error", "messages", NULL, "cannot apply the chat template: %s", err.msg);
    return true;
}

static bool check_ids(const tm_server *s, const int32_t *ids, size_t n, const char *param, tm_srv_error *e) {
    int32_t nv = tm_tok_n_vocab(s->model->tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            return tm_srv_fail(e, 400, "invalid_request_error", param, NULL,
                               "token id %d at index %zu is outside the vocabulary (0..%d)", ids[i], i, nv - 1);
    return true;
}

/* The prompt of a generation request as ids. */
static bool request_prompt(const tm_server *s, const tm_srv_request *rq, tm_ids *ids, tm_srv_error *e) {
    if (rq->kind == TM_SRV_CHAT) {
        char *text = NULL;
        if (!render_chat(s, rq->msgs, rq->n_msgs, rq->add_generation_prompt, &text, e)) return false;
        bool ok = encode(s, text, ids, "messages", e);
        free(text);
        return ok;
    }
    if (rq->prompt_text) return encode(s, rq->prompt_text, ids, "prompt", e);
    if (!check_ids(s, rq->prompt_ids, rq->n_prompt_ids, "prompt", e)) return false;
    for (size_t i = 0; i < rq->n_prompt_ids; i++)
        if (tm_ids_push(ids, rq->prompt_ids[i]) != TM_OK)
            return tm_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

/* The API's text of one token (control tokens by name), valid UTF-8; raw bytes in *raw. */
static char *token_str(const tm_server *s, int32_t id, const char **raw, size_t *raw_len) {
    *raw = tm_tok_piece(s->model->tok, id, true, raw_len);
    return tm_srv_utf8_sanitize(*raw, *raw_len);
}

static double lp_value(float lp) { return isfinite(lp) ? (double)lp : -9999.0; }

static cJSON *bytes_array(const char *p, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]} */
static cJSON *chat_lp_entry(const tm_server *s, int32_t id, float lp, const tm_logprob *top, int32_t n_top) {
    cJSON *o = cJSON_CreateObject();
    const char *raw;
    size_t rl;
    char *t = token_str(s, id, &raw, &rl);
    cJSON_AddStringToObject(o, "token", t ? t : "");
    free(t);
    cJSON_AddNumberToObject(o, "logprob", lp_value(lp));
    cJSON_AddItemToObject(o, "bytes", bytes_array(raw, rl));
    cJSON *ta = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int32_t i = 0; ta && i < n_top; i++) {
        cJSON *x = cJSON_CreateObject();
        char *tt = token_str(s, top[i].id, &raw, &rl);
        cJSON_AddStringToObject(x, "token", tt ? tt : "");
        free(tt);
        cJSON_AddNumberToObject(x, "logprob", lp_value(top[i].logprob));
        cJSON_AddItemToObject(x, "bytes", bytes_array(raw, rl));
        cJSON_AddItemToArray(ta, x);
    }
    return o;
}

static size_t utf8_chars(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

/* completions: append one token to {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; the
 * alternatives map token text to logprob and always include the sampled token. */
static void completion_lp_add(const tm_server *s, cJSON *lp, int32_t id, float logprob, const tm_logprob *top,
                              int32_t n_top, size_t offset) {
    const char *raw;
    size_t rl;
    char *t = token_str(s, id, &raw, &rl);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "tokens"), cJSON_CreateString(t ? t : ""));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs"), cJSON_CreateNumber(lp_value(logprob)));
    cJSON *alt = cJSON_CreateObject();
    for (int32_t i = 0; alt && i < n_top; i++) {
        char *tt = token_str(s, top[i].id, &raw, &rl);
        if (tt && !cJSON_GetObjectItemCaseSensitive(alt, tt)) cJSON_AddNumberToObject(alt, tt, lp_value(top[i].logprob));
        free(tt);
    }
    if (alt && t && !cJSON_GetObjectItemCaseSensitive(alt, t)) cJSON_AddNumberToObject(alt, t, lp_value(logprob));
    free(t);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs"), alt);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *completion_lp_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

static int32_t total_gen(const srv_req *r) {
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_ch; i++) n += r->ch[i].gen_tokens;
    return n;
}

/* the request's usage; cached_tokens: what the first choice found of the prompt in the prefix cache */
static cJSON *usage_json(const srv_req *r) {
    const int32_t completion = total_gen(r);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)r->n_prompt + (double)completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", r->n_ch > 0 ? r->ch[0].cached_tokens : 0);
    return u;
}

/* ---- streaming (SSE) ------------------------------------------------------------------------------------ */

static cJSON *chunk_new(const srv_req *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", r->rq.kind == TM_SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", r->srv->model_id);
    cJSON_AddArrayToObject(j, "choices");
    return j;
}

static void emit(srv_req *r, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) {
        r->out.oom = true;
        return;
    }
    tm_srv_sse_event(&r->out, s, strlen(s));
    free(s);
}

/* One choice's piece: text (may be NULL), finish reason (NULL while running), logprobs (owned, may be NULL). */
static void emit_choice(srv_req *r, int32_t idx, const char *text, const char *finish, cJSON *logprobs, bool role) {
    cJSON *j = chunk_new(r), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", idx);
    if (r->rq.kind == TM_SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    if (logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(j, "choices"), c);
    emit(r, j);
}

static bool is_stopping(tm_server *s) {
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return stopping;
}

static void emit_error_event(srv_req *r) {
    tm_srv_error e;
    if (is_stopping(r->srv))
        tm_srv_fail(&e, 503, "server_error", NULL, NULL, "the request was aborted: the server is shutting down");
    else
        tm_srv_fail(&e, 500, "server_error", NULL, NULL, "the request was aborted by the engine");
    char *s = tm_srv_error_json(&e);
    if (!s) {
        r->out.oom = true;
        return;
    }
    tm_srv_sse_event(&r->out, s, strlen(s));
    free(s);
}

/* The logprobs of one streamed token, in the request's shape. */
static cJSON *stream_lp(srv_req *r, srv_choice *c, const tm_stream_event *ev) {
    const tm_server *s = r->srv;
    int32_t nt = r->rq.top_logprobs < ev->n_top ? r->rq.top_logprobs : ev->n_top;
    if (r->rq.kind == TM_SRV_CHAT) {
        cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "content");
        cJSON_AddItemToArray(a, chat_lp_entry(s, ev->token, ev->logprob, ev->top, nt));
        return o;
    }
    cJSON *lp = completion_lp_new();
    completion_lp_add(s, lp, ev->token, ev->logprob, ev->top, nt, c->n_chars);
    return lp;
}

/* Move every available event into the SSE buffer; after the last choice ends, the closing events. */
static void pump_stream(srv_req *r) {
    bool all_done = true;
    for (int32_t i = 0; i < r->n_ch; i++) {
        srv_choice *c = &r->ch[i];
        tm_stream_event ev;
        while (!c->done && tm_stream_next(c->stream, 0, &ev, NULL) == TM_OK) {
            if (ev.final) {
                c->done = true;
                c->finish = ev.finish_reason;
                c->gen_tokens = ev.stats.gen_tokens;
                c->cached_tokens = ev.stats.cached_tokens;
                if (!strcmp(ev.finish_reason, "abort")) r->aborted = true;
                else {
                    if (ev.text_len) emit_choice(r, i, ev.text, NULL, NULL, false);
                    emit_choice(r, i, r->rq.kind == TM_SRV_CHAT ? NULL : "", ev.finish_reason, NULL, false);
                }
            } else if (ev.text_len || r->rq.logprobs) {
                emit_choice(r, i, ev.text, NULL, r->rq.logprobs && ev.token >= 0 ? stream_lp(r, c, &ev) : NULL, false);
                c->n_chars += utf8_chars(ev.text, ev.text_len);
            }
            tm_stream_event_clear(&ev);
        }
        all_done &= c->done;
    }
    if (!all_done || r->out_end) return;
    if (r->aborted) {
        emit_error_event(r);
    } else if (r->rq.include_usage) {
        cJSON *j = chunk_new(r);
        cJSON_AddItemToObject(j, "usage", usage_json(r));
        emit(r, j);
    }
    tm_srv_buf_append(&r->out, "data: [DONE]\n\n", 14);
    r->out_end = true;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_req *r = cls;
    (void)pos;
    for (;;) {
        if (r->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r->out_off < r->out.len) {
            size_t n = r->out.len - r->out_off;
            if (n > max) n = max;
            memcpy(buf, r->out.p + r->out_off, n);
            r->out_off += n;
            if (r->out_off == r->out.len) r->out_off = r->out.len = 0;
            return (ssize_t)n;
        }
        if (r->out_end) return MHD_CONTENT_READER_END_OF_STREAM;
        pump_stream(r);
        if (r->out.len > 0 || r->out_end || r->out.oom) continue;
        if (suspend_or_retry(r)) return 0;
    }
}

/* ---- non-streaming ---------------------------------------------------------------------------------------- */

/* Drain available events into the choices; true when every choice has ended. */
static bool pump_collect(srv_req *r) {
    bool all_done = true;
    for (int32_t i = 0; i < r->n_ch; i++) {
        srv_choice *c = &r->ch[i];
        tm_stream_event ev;
        while (!c->done && tm_stream_next(c->stream, 0, &ev, NULL) == TM_OK) {
            if (r->rq.logprobs && !ev.final && ev.token >= 0) {
                int32_t nt = r->rq.top_logprobs < ev.n_top ? r->rq.top_logprobs : ev.n_top;
                if (r->rq.kind == TM_SRV_CHAT)
                    cJSON_AddItemToArray(c->lp, chat_lp_entry(r->srv, ev.token, ev.logprob, ev.top, nt));
                else
                    completion_lp_add(r->srv, c->lp, ev.token, ev.logprob, ev.top, nt, c->n_chars);
            }
            tm_srv_buf_append(&c->text, ev.text, ev.text_len);
            c->n_chars += utf8_chars(ev.text, ev.text_len);
            if (ev.final) {
                c->done = true;
                c->finish = ev.finish_reason;
                c->gen_tokens = ev.stats.gen_tokens;
                c->cached_tokens = ev.stats.cached_tokens;
                if (!strcmp(ev.finish_reason, "abort")) r->aborted = true;
            }
            tm_stream_event_clear(&ev);
        }
        all_done &= c->done;
    }
    return all_done;
}

static enum MHD_Result answer_collected(srv_req *r) {
    if (r->aborted) {
        tm_srv_error e;
        if (is_stopping(r->srv))
            tm_srv_fail(&e, 503, "server_error", NULL, NULL, "the request was aborted: the server is shutting down");
        else
            tm_srv_fail(&e, 500, "server_error", NULL, NULL, "the request was aborted by the engine");
        return queue_error(r, &e);
    }
    bool chat = r->rq.kind == TM_SRV_CHAT;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", r->srv->model_id);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    for (int32_t i = 0; i < r->n_ch; i++) {
        srv_choice *c = &r->ch[i];
        if (c->text.oom) {
            cJSON_Delete(j);
            return MHD_NO;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", i);
        const char *text = c->text.p ? c->text.p : "";
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(o, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text);
        } else {
            cJSON_AddStringToObject(o, "text", text);
        }
        if (c->lp) {
            if (chat) {
                cJSON *lo = cJSON_AddObjectToObject(o, "logprobs");
                cJSON_AddItemToObject(lo, "content", c->lp);
            } else {
                cJSON_AddItemToObject(o, "logprobs", c->lp);
            }
            c->lp = NULL; /* owned by j now */
        } else {
            cJSON_AddNullToObject(o, "logprobs");
        }
        cJSON_AddStringToObject(o, "finish_reason", c->finish);
        cJSON_AddItemToArray(choices, o);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(r));
    return queue_json(r, 200, j);
}

static enum MHD_Result continue_collect(srv_req *r) {
    for (;;) {
        if (pump_collect(r)) return answer_collected(r);
        if (suspend_or_retry(r)) return MHD_YES;
    }
}

/* ---- generation requests ------------------------------------------------------------------------------------ */

static void list_remove(tm_server *s, srv_req *r) {
    if (!r->listed) return;
    if (r->prev) r->prev->next = r->next;
    else s->active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->listed = false;
    s->n_active--;
    pthread_cond_broadcast(&s->cv);
}

static enum MHD_Result start_generation(srv_req *r) {
    tm_server *s = r->srv;
    tm_srv_error e = {0};
    tm_srv_request *rq = &r->rq;
    tm_ids ids = {0};
    if (!tm_srv_parse_request(r->rt->id == RT_CHAT ? TM_SRV_CHAT : TM_SRV_COMPLETIONS, r->body.p ? r->body.p : "",
                              r->body.len, rq, &e))
        return queue_error(r, &e);
    tm_srv_buf_free(&r->body); /* the parsed tree holds what is needed; a waiting request keeps no body */
    if (!check_model(s, rq->model, &e) || !request_prompt(s, rq, &ids, &e)) goto fail;
    if (ids.n == 0) {
        tm_srv_fail(&e, 400, "invalid_request_error", rq->kind == TM_SRV_CHAT ? "messages" : "prompt", NULL,
                    "the prompt is empty (0 tokens)");
        goto fail;
    }
    const char *pparam = rq->kind == TM_SRV_CHAT ? "messages" : "prompt";
    if (ids.n >= (size_t)s->n_ctx) {
        tm_srv_fail(&e, 400, "invalid_request_error", pparam, "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, your request has %zu input tokens "
                    "(no room for a completion token). Please reduce the length of the input.",
                    s->n_ctx, ids.n);
        goto fail;
    }
    int32_t room = s->n_ctx - (int32_t)ids.n;
    int32_t max_tokens = rq->max_tokens;
    if (max_tokens < 0) {
        max_tokens = rq->kind == TM_SRV_CHAT ? room : (room < 16 ? room : 16); /* OpenAI's defaults */
    } else if (max_tokens > room) {
        tm_srv_fail(&e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in the "
                    "%s, %d in the completion). Please reduce the length of the %s or completion.",
                    s->n_ctx, (long long)ids.n + max_tokens, ids.n, pparam, max_tokens, pparam);
        goto fail;
    }
    r->n_prompt = (int32_t)ids.n;
    r->n_ch = rq->n;
    r->ch = tm_calloc((size_t)r->n_ch, sizeof *r->ch);
    if (!r->ch) {
        tm_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < r->n_ch; i++)
        if (rq->logprobs && !(r->ch[i].lp = rq->kind == TM_SRV_CHAT ? cJSON_CreateArray() : completion_lp_new())) {
            tm_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
    tm_gen_params gp = {0};
    gp.sampling = rq->sampling;
    gp.max_tokens = max_tokens;
    gp.ignore_eos = rq->ignore_eos;
    gp.stop = rq->stop;
    gp.n_stop = rq->n_stop;
    gp.priority = rq->priority;
    uint64_t base_seed = rq->seed_given ? rq->sampling.seed : 0;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        tm_srv_fail(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
        goto fail;
    }
    for (int32_t i = 0; i < r->n_ch; i++) {
        gp.sampling.seed = rq->seed_given ? base_seed + (uint64_t)i : splitmix64(atomic_fetch_add(&s->seed_ctr, 1));
        tm_error err = {0};
        if (tm_async_submit(s->async, ids.ids, ids.n, &gp, &r->ch[i].stream, &err) != TM_OK) {
            pthread_mutex_unlock(&s->mu);
            tm_srv_fail(&e, err.code == TM_ERR_NOMEM ? 500 : 400, err.code == TM_ERR_NOMEM ? "server_error" : "invalid_request_error",
                        NULL, NULL, "%s", err.msg);
            goto fail; /* the streams already submitted are aborted when r is freed */
        }
    }
    r->next = s->active;
    if (s->active) s->active->prev = r;
    s->active = r;
    r->listed = true;
    s->n_active++;
    pthread_mutex_unlock(&s->mu);
    tm_ids_free(&ids);
    r->generating = true;
    r->streaming = rq->stream;
    r->created = (int64_t)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%016llx", rq->kind == TM_SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)splitmix64(atomic_fetch_add(&s->next_id, 1)));
    for (int32_t i = 0; i < r->n_ch; i++) tm_stream_set_notify(r->ch[i].stream, on_stream_event, r);
    if (!r->streaming) return continue_collect(r);
    if (rq->kind == TM_SRV_CHAT)
        for (int32_t i = 0; i < r->n_ch; i++) emit_choice(r, i, "", NULL, NULL, true); /* the role comes first */
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->answered = true;
    tm_log(TM_LOG_INFO, "http: %s %s 200 (%s, stream)", r->method, r->url, r->id);
    return ok;
fail:
    tm_ids_free(&ids);
    return queue_error(r, &e);
}

/* ---- small endpoints ------------------------------------------------------------------------------------------ */

static cJSON *model_object(const tm_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "tokenmill");
    cJSON_AddStringToObject(m, "root", s->model_id);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
    return m;
}

static enum MHD_Result handle_get(srv_req *r, const char *url) {
    tm_server *s = r->srv;
    switch (r->rt->id) {
    case RT_HEALTH: return queue_body(r, 200, tm_strndup("{\"status\":\"ok\"}", 15), "application/json");
    case RT_METRICS: {
        char *text = NULL;
        if (tm_metrics_render_alloc(s->metrics, &text, NULL, NULL) != TM_OK) return MHD_NO;
        return queue_body(r, 200, text, TM_METRICS_CONTENT_TYPE);
    }
    case RT_MODELS: {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "data"), model_object(s));
        return queue_json(r, 200, j);
    }
    case RT_MODEL: {
        tm_srv_error e;
        const char *name = url + strlen(r->rt->path);
        if (!check_model(s, name, &e)) return queue_error(r, &e);
        return queue_json(r, 200, model_object(s));
    }
    default: return MHD_NO;
    }
}

/* vLLM's shapes: {"prompt"} or {"messages"} -> {"count", "max_model_len", "tokens", "token_strs"} */
static enum MHD_Result handle_tokenize(srv_req *r) {
    tm_server *s = r->srv;
    tm_srv_error e;
    cJSON *j = tm_srv_parse_json_object(r->body.p ? r->body.p : "", r->body.len, &e);
    if (!j) return queue_error(r, &e);
    tm_ids ids = {0};
    tm_srv_request rq = {0};
    char *text = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *add_special = cJSON_GetObjectItemCaseSensitive(j, "add_special_tokens");
    const cJSON *strs = cJSON_GetObjectItemCaseSensitive(j, "return_token_strs");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) {
        tm_srv_fail(&e, 400, "invalid_request_error", "model", NULL, "'model' must be a string");
        goto fail;
    }
    if (cJSON_IsString(model) && !check_model(s, model->valuestring, &e)) goto fail;
    if ((add_special && !cJSON_IsBool(add_special) && !cJSON_IsNull(add_special)) ||
        (strs && !cJSON_IsBool(strs) && !cJSON_IsNull(strs))) {
        tm_srv_fail(&e, 400, "invalid_request_error", NULL, NULL,
                    "'add_special_tokens' and 'return_token_strs' must be booleans");
        goto fail;
    }
    bool bos = tm_tok_add_bos(s->model->tok);
    if (cJSON_IsString(prompt)) {
        if (cJSON_IsBool(add_special)) bos = bos && cJSON_IsTrue(add_special);
        tm_error err = {0};
        if (tm_tok_encode(s->model->tok, prompt->valuestring, strlen(prompt->valuestring), bos, true, &ids, &err) != TM_OK) {
            tm_srv_fail(&e, 400, "invalid_request_error", "prompt", NULL, "cannot tokenize the prompt: %s", err.msg);
            goto fail;
        }
    } else if (msgs) {
        /* reuse the chat request parser for the messages */
        cJSON *tmp = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(tmp, "messages", (cJSON *)msgs);
        const cJSON *agp = cJSON_GetObjectItemCaseSensitive(j, "add_generation_prompt");
        if (agp) cJSON_AddItemReferenceToObject(tmp, "add_generation_prompt", (cJSON *)agp);
        char *body = cJSON_PrintUnformatted(tmp);
        cJSON_Delete(tmp);
        bool ok = body && tm_srv_parse_request(TM_SRV_CHAT, body, strlen(body), &rq, &e);
        free(body);
        if (!ok) goto fail;
        if (!render_chat(s, rq.msgs, rq.n_msgs, rq.add_generation_prompt, &text, &e)) goto fail;
        if (cJSON_IsBool(add_special)) bos = bos && cJSON_IsTrue(add_special);
        tm_error err = {0};
        if (tm_tok_encode(s->model->tok, text, strlen(text), bos, true, &ids, &err) != TM_OK) {
            tm_srv_fail(&e, 400, "invalid_request_error", "messages", NULL, "cannot tokenize the messages: %s", err.msg);
            goto fail;
        }
    } else {
        tm_srv_fail(&e, 400, "invalid_request_error", "prompt", NULL, "'prompt' (a string) or 'messages' is required");
        goto fail;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "count", (double)ids.n);
    cJSON_AddNumberToObject(out, "max_model_len", s->n_ctx);
    cJSON *ta = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < ids.n; i++) cJSON_AddItemToArray(ta, cJSON_CreateNumber(ids.ids[i]));
    if (cJSON_IsTrue(strs)) {
        cJSON *sa = cJSON_AddArrayToObject(out, "token_strs");
        for (size_t i = 0; i < ids.n; i++) {
            const char *raw;
            size_t rl;
            char *t = token_str(s, ids.ids[i], &raw, &rl);
            cJSON_AddItemToArray(sa, cJSON_CreateString(t ? t : ""));
            free(t);
        }
    } else {
        cJSON_AddNullToObject(out, "token_strs");
    }
    tm_ids_free(&ids);
    tm_srv_request_free(&rq);
    free(text);
    cJSON_Delete(j);
    return queue_json(r, 200, out);
fail:
    tm_ids_free(&ids);
    tm_srv_request_free(&rq);
    free(text);
    cJSON_Delete(j);
    return queue_error(r, &e);
}

/* {"tokens": [ids]} -> {"prompt": text} */
static enum MHD_Result handle_detokenize(srv_req *r) {
    tm_server *s = r->srv;
    tm_srv_error e;
    cJSON *j = tm_srv_parse_json_object(r->body.p ? r->body.p : "", r->body.len, &e);
    if (!j) return queue_error(r, &e);
    int32_t *ids = NULL;
    char *text = NULL, *clean = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    if (cJSON_IsString(model) && !check_model(s, model->valuestring, &e)) goto fail;
    if (!cJSON_IsArray(toks)) {
        tm_srv_fail(&e, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be an array of token ids");
        goto fail;
    }
    size_t n = (size_t)cJSON_GetArraySize(toks), i = 0;
    ids = tm_malloc_array(n ? n : 1, sizeof *ids);
    if (!ids) {
        tm_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    for (const cJSON *t = toks->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < -1 ||
            t->valuedouble > INT32_MAX) {
            tm_srv_fail(&e, 400, "invalid_request_error", "tokens", NULL, "'tokens'[%zu] must be an integer token id", i);
            goto fail;
        }
        ids[i] = (int32_t)t->valuedouble;
    }
    if (!check_ids(s, ids, n, "tokens", &e)) goto fail;
    tm_error err = {0};
    if (tm_tok_decode(s->model->tok, ids, n, true, &text, &err) != TM_OK || !(clean = tm_srv_utf8_sanitize(text, strlen(text)))) {
        tm_srv_fail(&e, 500, "server_error", NULL, NULL, "cannot decode: %s", err.msg);
        goto fail;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "prompt", clean);
    free(ids);
    free(text);
    free(clean);
    cJSON_Delete(j);
    return queue_json(r, 200, out);
fail:
    free(ids);
    free(text);
    free(clean);
    cJSON_Delete(j);
    return queue_error(r, &e);
}

/* ---- the access handler ------------------------------------------------------------------------------------- */

/* A refusal decided from the headers: answered now when no body can follow, else once the body has been
 * read and dropped, so that the client is not cut off while it is still sending (a reset can lose the
 * answer) and the connection stays usable. */
static uint64_t content_length(const srv_req *r) {
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl) return 0;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(cl, &end, 10);
    return errno == 0 && *end == '\0' ? v : 0;
}

static enum MHD_Result refuse(srv_req *r, bool is_get, const tm_srv_error *e) {
    if (is_get || content_length(r) > r->srv->max_body) return queue_error(r, e); /* no body, or too much to read */
    r->deferred = *e;
    r->has_deferred = true;
    return MHD_YES;
}

static enum MHD_Result on_headers(srv_req *r, const char *url, const char *method) {
    tm_server *s = r->srv;
    tm_srv_error e;
    r->url = url;
    r->method = method;
    r->rt = find_route(url);
    bool is_get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    bool is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (!r->rt) {
        tm_srv_fail(&e, 404, "invalid_request_error", NULL, NULL, "Invalid URL (%s %s)", method, url);
        return refuse(r, is_get, &e);
    }
    if (r->rt->post ? !is_post : !is_get) {
        tm_srv_fail(&e, 405, "invalid_request_error", NULL, NULL, "Method %s is not allowed for %s (use %s)", method, url,
                    r->rt->post ? "POST" : "GET");
        return refuse(r, is_get, &e);
    }
    if (!r->rt->open && !tm_srv_auth_ok(s->api_key,
                                        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION))) {
        tm_srv_fail(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                    "Missing or incorrect API key: send it as 'Authorization: Bearer KEY'");
        return refuse(r, is_get, &e);
    }
    if (!r->rt->post) return handle_get(r, url);
    uint64_t cl = content_length(r);
    if (cl > s->max_body) {
        tm_srv_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                    "The request body has %llu bytes; the limit is %zu", (unsigned long long)cl, s->max_body);
        return queue_error(r, &e);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;
    return MHD_YES; /* the body follows */
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_req *r = *con_cls;
    if (!r) {
        r = tm_calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = cls;
        r->conn = conn;
        r->fd = -1;
        pthread_mutex_init(&r->mu, NULL);
        *con_cls = r;
        return on_headers(r, url, method);
    }
    if (r->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* a body of unannounced length that is refused anyway is read and dropped, but not forever */
        r->received += *upload_size;
        if (r->received > 2 * r->srv->max_body + ((size_t)16 << 20)) return MHD_NO; /* close the connection */
        if (!r->too_large && !r->has_deferred) {
            if (r->body.len + *upload_size > r->srv->max_body) {
                r->too_large = true;
                tm_srv_buf_free(&r->body);
            } else {
                tm_srv_buf_append(&r->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->generating) return continue_collect(r); /* resumed */
    if (r->has_deferred) return queue_error(r, &r->deferred);
    tm_srv_error e;
    if (r->too_large) {
        tm_srv_fail(&e, 413, "invalid_request_error", NULL, "request_too_large", "The request body is over the limit of %zu bytes",
                    r->srv->max_body);
        return queue_error(r, &e);
    }
    if (r->body.oom) {
        tm_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return queue_error(r, &e);
    }
    switch (r->rt->id) {
    case RT_TOKENIZE: return handle_tokenize(r);
    case RT_DETOKENIZE: return handle_detokenize(r);
    default: return start_generation(r);
    }
}

static void req_free(srv_req *r) {
    tm_server *s = r->srv;
    if (r->listed) {
        pthread_mutex_lock(&s->mu);
        list_remove(s, r);
        pthread_mutex_unlock(&s->mu);
    }
    for (int32_t i = 0; r->ch && i < r->n_ch; i++) {
        srv_choice *c = &r->ch[i];
        if (c->stream) {
            tm_stream_set_notify(c->stream, NULL, NULL);
            tm_stream_free(c->stream); /* aborts the request if it is still running */
        }
        tm_srv_buf_free(&c->text);
        cJSON_Delete(c->lp);
    }
    free(r->ch);
    tm_srv_request_free(&r->rq);
    tm_srv_buf_free(&r->body);
    tm_srv_buf_free(&r->out);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    srv_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (r->generating && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        tm_log(TM_LOG_INFO, "http: %s %s: the connection ended early (termination code %d): aborted", r->id, r->url,
               (int)toe);
    req_free(r);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n') buf[--n] = '\0';
    tm_log(TM_LOG_DEBUG, "microhttpd: %s", buf);
}

/* ---- housekeeping: clients that hung up while their connection was suspended ------------------------------ */

static void deadline_after(struct timespec *ts, double s) {
    clock_gettime(CLOCK_REALTIME, ts);
    double t = (double)ts->tv_sec + ts->tv_nsec * 1e-9 + s;
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

static void *hk_main(void *p) {
    tm_server *s = p;
    struct pollfd *pf = NULL; /* (cap) */
    srv_req **who = NULL;     /* (cap) */
    size_t cap = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->hk_stop) {
        if (cap < s->n_active) {
            size_t nc = s->n_active * 2;
            struct pollfd *np = realloc(pf, nc * sizeof *np);
            if (np) pf = np;
            srv_req **nw = realloc(who, nc * sizeof *nw);
            if (nw) who = nw;
            if (np && nw) cap = nc;
        }
        size_t n = 0;
        for (srv_req *r = s->active; r && n < cap; r = r->next) {
            pthread_mutex_lock(&r->mu);
            bool susp = r->suspended;
            pthread_mutex_unlock(&r->mu);
            if (!susp || r->fd < 0) continue;
            pf[n].fd = r->fd;
            pf[n].events = POLLRDHUP;
            pf[n].revents = 0;
            who[n++] = r;
        }
        /* suspended sockets are not touched by MHD, and a listed request's socket stays open (closing it
         * first unlists the request, which needs s->mu) */
        if (n && poll(pf, n, 0) > 0)
            for (size_t i = 0; i < n; i++)
                if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
                    tm_log(TM_LOG_INFO, "http: %s: the client hung up; aborting", who[i]->id);
                    for (int32_t c = 0; c < who[i]->n_ch; c++) tm_stream_abort(who[i]->ch[c].stream);
                }
        struct timespec dl;
        deadline_after(&dl, HK_PERIOD_S);
        pthread_cond_timedwait(&s->cv, &s->mu, &dl);
    }
    pthread_mutex_unlock(&s->mu);
    free(pf);
    free(who);
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------------------------------ */

static char *default_model_id(const tm_model *m, const char *spec) {
    if (spec && *spec) {
        const char *base = strrchr(spec, '/');
        base = base ? base + 1 : spec;
        size_t L = strlen(base);
        if (L > 5 && !strcmp(base + L - 5, ".gguf")) L -= 5;
        if (L) return tm_strndup(base, L);
    }
    const char *n = m->name && *m->name ? m->name : "tokenmill";
    return tm_strndup(n, strlen(n));
}

tm_status tm_server_create(const tm_model *m, const tm_engine_cfg *ec, const tm_server_cfg *cfg, tm_server **out,
                           tm_error *err) {
    *out = NULL;
    tm_status st = TM_OK;
    struct addrinfo *ai = NULL;
    tm_server *s = tm_calloc(1, sizeof *s);
    if (!s) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    s->model = m;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->next_id, tm_time_ns() ^ ((uint64_t)getpid() << 32));
    atomic_init(&s->seed_ctr, splitmix64(tm_time_ns() ^ (uint64_t)getpid()));
    s->max_body = cfg->max_body ? cfg->max_body : TM_SERVER_DEFAULT_MAX_BODY;
    s->model_id = cfg->model_id && *cfg->model_id ? tm_strndup(cfg->model_id, strlen(cfg->model_id))
                                                  : default_model_id(m, cfg->model_alias);
    s->alias = cfg->model_alias ? tm_strndup(cfg->model_alias, strlen(cfg->model_alias)) : NULL;
    s->api_key = cfg->api_key && *cfg->api_key ? tm_strndup(cfg->api_key, strlen(cfg->api_key)) : NULL;
    if (!s->model_id || (cfg->model_alias && !s->alias) || (cfg->api_key && *cfg->api_key && !s->api_key)) {
        st = tm_err(err, TM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* the chat template: by name, else the model's own; without one, chat requests get a clear 400 */
    if (cfg->chat_template) {
        tm_chat_kind kind;
        if ((st = tm_chat_from_name(cfg->chat_template, &kind, err)) != TM_OK) goto fail;
        tm_chat_template_init(&s->tmpl, kind);
        s->has_tmpl = true;
    } else if (m->chat_template) {
        tm_error terr = {0};
        if (tm_chat_template_detect(m->chat_template, strlen(m->chat_template), &s->tmpl, &terr) == TM_OK)
            s->has_tmpl = true;
        else
            snprintf(s->tmpl_error, sizeof s->tmpl_error,
                     "the model's chat template is not supported (%s); start the server with --chat-template NAME", terr.msg);
    } else {
        snprintf(s->tmpl_error, sizeof s->tmpl_error,
                 "the model has no chat template; start the server with --chat-template NAME");
    }
    if ((st = tm_metrics_create((uint64_t)m->hp.n_ctx_train, &s->metrics, err)) != TM_OK) goto fail;
    tm_engine_cfg ecfg = *ec;
    ecfg.metrics = s->metrics;
    if ((st = tm_async_create(m, &ecfg, &s->async, err)) != TM_OK) goto fail;
    s->n_ctx = tm_async_engine(s->async)->runner->cfg.n_ctx;
    /* the address */
    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%u", (unsigned)cfg->port);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        st = tm_err(err, TM_ERR_INVALID, "cannot resolve the address '%s': %s", host, gai_strerror(gai));
        goto fail;
    }
    /* poll(), not epoll: the HTTP library's epoll loop (0.9.75 and later) drains events 128 at a time and calls
     * epoll_wait again with the full connection timeout after a full batch. When exactly 128 (256, ...) requests
     * were ready at once, the second call sleeps with every one of them read but unhandled, until a new event or
     * the 300 s timeout: a burst of 512 streams stalled in 1 of 5-40 runs. Level-triggered poll() has no such
     * batch; it scans every live connection a wake-up, which cost no throughput at 512 streams (PERFORMANCE.md). */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    unsigned threads = cfg->http_threads ? cfg->http_threads : 1;
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)(cfg->max_connections ? cfg->max_connections : TM_SERVER_DEFAULT_MAX_CONNECTIONS), NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)(cfg->conn_timeout_s ? cfg->conn_timeout_s : 300), NULL},
        {MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, s},
        {MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, s},
        {threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    s->daemon = MHD_start_daemon(flags, cfg->port, NULL, NULL, on_access, s, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (!s->daemon) {
        st = tm_err(err, TM_ERR_IO, "cannot listen on %s port %u (in use, or not allowed?)", host, (unsigned)cfg->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    if (pthread_create(&s->hk, NULL, hk_main, s) != 0) {
        st = tm_err(err, TM_ERR_IO, "cannot start the housekeeping thread");
        goto fail;
    }
    s->hk_started = true;
    freeaddrinfo(ai);
    *out = s;
    return TM_OK;
fail:
    if (ai) freeaddrinfo(ai);
    tm_server_free(s);
    return st;
}

uint16_t tm_server_port(const tm_server *s) { return s->port; }
const char *tm_server_model_id(const tm_server *s) { return s->model_id; }

void tm_server_free(tm_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    s->hk_stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->hk_started) pthread_join(s->hk, NULL);
    MHD_socket lfd = s->daemon ? MHD_quiesce_daemon(s->daemon) : MHD_INVALID_SOCKET;
    /* every live request gets its final "abort" event; its connection wakes up and ends its response */
    tm_async_free(s->async);
    s->async = NULL;
    struct timespec dl;
    deadline_after(&dl, DRAIN_S);
    pthread_mutex_lock(&s->mu);
    while (s->n_active > 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT) break;
    if (s->n_active > 0) tm_log(TM_LOG_WARN, "server: %zu responses still sending at shutdown; closing them", s->n_active);
    for (srv_req *r = s->active; r; r = r->next) { /* MHD must not be stopped with suspended connections */
        pthread_mutex_lock(&r->mu);
        if (r->suspended) {
            r->suspended = false;
            MHD_resume_connection(r->conn);
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&s->mu);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    tm_metrics_free(s->metrics);
    tm_chat_template_free(&s->tmpl);
    free(s->model_id);
    free(s->alias);
    free(s->api_key);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
