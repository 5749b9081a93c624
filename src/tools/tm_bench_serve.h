/* tm_bench_serve.h -- `tokenmill bench serve`: an open-loop load generator for OpenAI-compatible servers. */
#ifndef TM_BENCH_SERVE_H
#define TM_BENCH_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The command: argv[0] is the program, argv[1] "bench", argv[2] "serve", options from argv[3]. Returns the
 * exit status: 0 when at least one request succeeded, 1 when none did (or the run could not start),
 * 2 on a usage error. */
int tm_cmd_bench_serve(int argc, char **argv);

/* ---- pure helpers (tm_bench_serve_util.c: no network, unit-tested) ------------------------------------ */

/* Incremental Server-Sent Events parser. Bytes arrive in arbitrary pieces; lines end in "\n" or "\r\n";
 * "data:" lines (one optional space after the colon is dropped) accumulate into the event, joined by
 * "\n"; a blank line dispatches it; comments (":...") and other fields (event:, id:, retry:) are ignored. */
typedef struct tm_bs_sse {
    char *line;        /* (line_cap) bytes: the unfinished line */
    size_t line_len, line_cap;
    char *data;        /* (data_cap) bytes: the current event's data, NUL-terminated when dispatched */
    size_t data_len, data_cap;
    bool has_data;     /* a data: line was seen since the last dispatch */
    size_t max_line;   /* longest accepted line / event, in bytes */
} tm_bs_sse;

/* Called once per event with its data (NUL-terminated, len bytes). Return 0 to go on, nonzero to stop:
 * the feed then returns that value. */
typedef int (*tm_bs_event_fn)(void *ud, const char *data, size_t len);

void tm_bs_sse_init(tm_bs_sse *p, size_t max_line);
void tm_bs_sse_free(tm_bs_sse *p);
/* Feed n bytes. Returns 0, a callback's nonzero value, or -1 when a line or an event exceeds max_line or
 * memory runs out. */
int tm_bs_sse_feed(tm_bs_sse *p, const char *buf, size_t n, tm_bs_event_fn fn, void *ud);
/* End of stream: dispatch the pending line and event, if any, as if a blank line had come. */
int tm_bs_sse_finish(tm_bs_sse *p, tm_bs_event_fn fn, void *ud);

/* One streamed chunk of /v1/completions or /v1/chat/completions, interpreted. */
typedef enum tm_bs_chunk_kind {
    TM_BS_CHUNK_DATA = 0, /* a JSON chunk (maybe with content, maybe only usage) */
    TM_BS_CHUNK_DONE,     /* "[DONE]" */
    TM_BS_CHUNK_ERROR,    /* a JSON object with an "error" member: the server gave up mid-stream */
    TM_BS_CHUNK_BAD,      /* not JSON, or not an object */
} tm_bs_chunk_kind;

typedef struct tm_bs_chunk {
    tm_bs_chunk_kind kind;
    bool has_content;          /* some choice carries non-empty text / delta.content / delta.reasoning_content */
    int64_t prompt_tokens;     /* usage.prompt_tokens, -1 when absent */
    int64_t completion_tokens; /* usage.completion_tokens, -1 when absent */
    char msg[160];             /* ERROR: the server's message; BAD: the start of the data */
} tm_bs_chunk;

void tm_bs_parse_chunk(const char *data, size_t len, tm_bs_chunk *out);

/* Service-level objectives for goodput, in milliseconds; 0 = not set. */
typedef struct tm_bs_slo {
    double ttft_ms, tpot_ms, e2e_ms;
} tm_bs_slo;

/* Parse "ttft:MS,tpot:MS,e2e:MS" (any subset, any order, each at most once, MS > 0). On failure returns
 * false with a message in err. */
bool tm_bs_parse_goodput(const char *spec, tm_bs_slo *out, char *err, size_t err_cap);
/* Whether a successful request meets every objective that is set. tpot_ms < 0 (a one-token answer has
 * no TPOT) meets any TPOT objective. */
bool tm_bs_meets_slo(const tm_bs_slo *slo, double ttft_ms, double tpot_ms, double e2e_ms);

/* Open-loop arrival times in seconds from the start: t[0] = 0, then exponential gaps of mean 1/rate
 * (a Poisson process of `rate` requests per second) from a seeded generator. rate <= 0 or infinite:
 * every t[i] = 0 (all at once). */
void tm_bs_arrivals(double rate, size_t n, uint64_t seed, double *t);

#endif /* TM_BENCH_SERVE_H */
