/* tm_async.h -- the engine on its own thread: a thread-safe submit queue and per-request output streams.
 * Front ends (server, C API, benchmarks) submit and read streams; only the engine thread touches
 * sequences and blocks. */
#ifndef TM_ASYNC_H
#define TM_ASYNC_H

#include "engine/tm_engine.h"

typedef struct tm_async tm_async;
typedef struct tm_stream tm_stream;

/* One streamed event, owned by the reader after tm_stream_next (text copied). */
typedef struct tm_stream_event {
    int32_t token;              /* -1 on the final event */
    char *text;                 /* (text_len) bytes + NUL, malloc'ed: free with free() */
    size_t text_len;
    float logprob;
    bool final;
    const char *finish_reason;  /* static string on the final event */
    tm_gen_stats stats;         /* on the final event */
    tm_logprob *top;            /* (n_top) most likely tokens when sampling.n_logprobs > 0, malloc'ed; else NULL */
    int32_t n_top;
} tm_stream_event;

/* Told that a stream has a new event: called on the engine's thread (or, for the final events of
 * tm_async_free, on its caller's thread) with the stream's lock held, so once tm_stream_set_notify
 * returns, the previous hook is never called again. It must be quick, must not block and must not call
 * tm_stream_* on this stream. */
typedef void (*tm_stream_notify_fn)(void *user);

/* Start the step loop on a new thread over an engine made from cfg (the model is borrowed). */
tm_status tm_async_create(const tm_model *m, const tm_engine_cfg *cfg, tm_async **out, tm_error *err);
/* Stop: every live request is aborted (its stream gets a final "abort" event), the thread joins. Streams
 * must still be freed by their owners. */
void tm_async_free(tm_async *a);
/* The engine, for reading what is fixed at its creation (runner->cfg, model) from any thread; everything
 * else in it belongs to the engine thread. */
const tm_engine *tm_async_engine(const tm_async *a);
/* Queue a request (any thread). The prompt and stop strings are copied. Validation errors (empty prompt,
 * over the context, bad sampling values) come back here, synchronously. */
tm_status tm_async_submit(tm_async *a, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp,
                          tm_stream **out, tm_error *err);
/* Next event; waits up to timeout_s (< 0: forever; 0: never, a poll). TM_ERR_RANGE on timeout; TM_ERR_INVALID
 * after the final event was read. */
tm_status tm_stream_next(tm_stream *s, double timeout_s, tm_stream_event *ev, tm_error *err);
/* Install (fn != NULL) or remove (fn == NULL) the stream's notify hook (any thread). Events queued before
 * the call are not announced: poll with tm_stream_next(s, 0, ...) after installing. */
void tm_stream_set_notify(tm_stream *s, tm_stream_notify_fn fn, void *user);
/* Ask the engine to abort (any thread); the blocks return to the pool at its next step and the stream
 * gets a final "abort" event. */
void tm_stream_abort(tm_stream *s);
/* Release the reader's handle (aborting the request if it is still running). */
void tm_stream_free(tm_stream *s);
void tm_stream_event_clear(tm_stream_event *ev);

#endif /* TM_ASYNC_H */
