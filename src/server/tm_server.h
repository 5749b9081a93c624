/* tm_server.h -- the OpenAI-compatible HTTP server (libmicrohttpd + cJSON) over the engine thread (tm_async). */
#ifndef TM_SERVER_H
#define TM_SERVER_H

#include "engine/tm_async.h"
#include "tokenizer/tm_chat.h"

/*
 * Threads: libmicrohttpd's internal poll() thread (or a small pool) owns every connection; no thread per
 * connection. A generation request submits to tm_async and suspends its connection; the stream's notify
 * hook (engine thread) resumes it, and the connection drains the stream without blocking: streaming
 * responses through a content-reader callback (SSE), the others by answering once every stream has
 * ended. A housekeeping thread watches suspended connections for a client that hung up and aborts their
 * requests. tm_server_free stops accepting, aborts what is running (streams get a final error event and
 * `data: [DONE]`, waiting requests a 503), lets the responses drain, then stops the daemon.
 */

typedef struct tm_server tm_server;

typedef struct tm_server_cfg {
    const char *host;           /* numeric address or host name to bind; NULL = "127.0.0.1" (loopback) */
    uint16_t port;              /* 0 = a free port (tm_server_port tells which) */
    const char *api_key;        /* NULL or "": no authentication */
    size_t max_body;            /* request body limit in bytes (413 above it); 0 = TM_SERVER_DEFAULT_MAX_BODY */
    unsigned max_connections;   /* 0 = TM_SERVER_DEFAULT_MAX_CONNECTIONS */
    unsigned http_threads;      /* polling threads (poll() each); 0 = 1 */
    unsigned conn_timeout_s;    /* idle keep-alive timeout; 0 = 300 */
    const char *model_id;       /* the id in /v1/models and responses; NULL = the model file's base name */
    const char *model_alias;    /* another accepted name (the -m argument), may be NULL */
    const char *chat_template;  /* template family by name (chatml, llama3, ...); NULL = the model's own */
} tm_server_cfg;

#define TM_SERVER_DEFAULT_MAX_BODY ((size_t)2 << 20)
#define TM_SERVER_DEFAULT_MAX_CONNECTIONS 4096u

/* Start the engine thread over m (borrowed: must outlive the server) with engine cfg ec (its metrics
 * field is replaced by the server's own registry) and start listening. */
tm_status tm_server_create(const tm_model *m, const tm_engine_cfg *ec, const tm_server_cfg *cfg, tm_server **out,
                           tm_error *err);
uint16_t tm_server_port(const tm_server *s);
const char *tm_server_model_id(const tm_server *s);
/* Graceful stop (see above); waits up to 5 s for the last responses to finish sending. */
void tm_server_free(tm_server *s);

/* ---- the pure parts: request parsing and validation, response pieces (tested on their own) -------- */

typedef enum tm_srv_kind { TM_SRV_COMPLETIONS = 0, TM_SRV_CHAT = 1 } tm_srv_kind;

#define TM_SRV_MAX_STOP 16     /* stop strings per request */
#define TM_SRV_MAX_N 16        /* choices per request */

/* An error as OpenAI returns it: {"error": {"message", "type", "param", "code"}} with an HTTP status. */
typedef struct tm_srv_error {
    int status;                 /* 400, 401, 404, 405, 413, 500, 503 */
    const char *type;           /* "invalid_request_error", "server_error", ... (static) */
    const char *param;          /* the offending field or NULL (static or in the request's JSON) */
    const char *code;           /* "invalid_api_key", "model_not_found", ... or NULL (static) */
    char message[512];
} tm_srv_error;

/* Fill e; returns false so parsers can `return srv_fail(...)`. */
bool tm_srv_fail(tm_srv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                 ...) TM_PRINTF(6, 7);
/* The error body, malloc'ed NUL-terminated JSON (NULL when out of memory). */
char *tm_srv_error_json(const tm_srv_error *e);

/* A parsed /v1/completions or /v1/chat/completions body. Strings point into `json` (owned). */
typedef struct tm_srv_request {
    tm_srv_kind kind;
    void *json;                 /* cJSON * of the body, owned */
    const char *model;          /* NULL: not given */
    /* completions: the prompt as text or as token ids */
    const char *prompt_text;    /* NUL-terminated (JSON strings cannot hold NUL here: refused) */
    int32_t *prompt_ids;        /* (n_prompt_ids) malloc'ed, or NULL */
    size_t n_prompt_ids;
    /* chat */
    tm_chat_msg *msgs;          /* (n_msgs) malloc'ed; content strings are the text parts joined (owned in parts) */
    size_t n_msgs;
    char **parts;               /* (n_parts) joined content strings made for array contents, malloc'ed */
    size_t n_parts;
    bool add_generation_prompt;
    /* generation */
    int32_t max_tokens;         /* -1: not given */
    tm_sampling_params sampling;
    bool seed_given;
    const char *stop[TM_SRV_MAX_STOP]; /* (n_stop) */
    size_t n_stop;
    int32_t n;                  /* choices, 1..TM_SRV_MAX_N */
    bool stream, include_usage;
    bool logprobs;              /* report logprobs of the sampled tokens */
    int32_t top_logprobs;       /* alternatives per token, 0..TM_MAX_LOGPROBS */
    int32_t priority;           /* extension: lower = sooner */
    bool ignore_eos;            /* extension */
} tm_srv_request;

/* Parse and validate a body (len bytes, need not be NUL-terminated): UTF-8, JSON syntax, field types
 * and ranges that do not depend on the model. On failure e is filled (status 400) and *r is empty. */
bool tm_srv_parse_request(tm_srv_kind kind, const char *body, size_t len, tm_srv_request *r, tm_srv_error *e);
void tm_srv_request_free(tm_srv_request *r);

/* Parse a JSON body for the small endpoints (/tokenize, /detokenize): UTF-8, syntax, an object at the top.
 * Returns the cJSON * (free with tm_srv_json_free) or NULL with e filled. */
void *tm_srv_parse_json_object(const char *body, size_t len, tm_srv_error *e);
void tm_srv_json_free(void *json);

/* The key check, in time independent of where the strings differ (and of the given key's length beyond
 * the expected one's). header: the Authorization value ("Bearer KEY"), may be NULL. */
bool tm_srv_auth_ok(const char *expected_key, const char *header);

/* Append an SSE event to buf: every line of data becomes "data: LINE\n", then an empty line. */
typedef struct tm_srv_buf {
    char *p;                    /* (cap) */
    size_t len, cap;
    bool oom;                   /* an append failed; the content is incomplete */
} tm_srv_buf;
void tm_srv_buf_append(tm_srv_buf *b, const char *s, size_t n);
void tm_srv_sse_event(tm_srv_buf *b, const char *data, size_t n);
void tm_srv_buf_free(tm_srv_buf *b);

/* Token text for logprobs: bytes made valid UTF-8 (each invalid byte becomes U+FFFD), malloc'ed. */
char *tm_srv_utf8_sanitize(const char *s, size_t n);

#endif /* TM_SERVER_H */
