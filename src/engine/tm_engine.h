/* tm_engine.h -- the step loop: requests become sequences, the scheduler plans each step, the runner
 * executes it, the sampler picks tokens, and outputs stream back (schedule → run → postprocess). */
#ifndef TM_ENGINE_H
#define TM_ENGINE_H

#include "engine/tm_runner.h"
#include "engine/tm_sampler.h"
#include "engine/tm_sched.h"
#include "metrics/tm_metrics.h"

typedef struct tm_gen_params {
    tm_sampling_params sampling;
    int32_t max_tokens;         /* generated tokens (>= 0) */
    bool ignore_eos;
    const char *const *stop;    /* (n_stop) stop strings; the output ends before the first match (copied) */
    size_t n_stop;
    int32_t priority;           /* lower = more urgent */
} tm_gen_params;

typedef struct tm_gen_event {
    uint64_t request;           /* request id */
    int32_t token;              /* -1 for the final event / a flush of held-back text */
    const char *text;           /* text released by this token (may be empty: held back for UTF-8 or a stop prefix) */
    size_t text_len;
    tm_logprob chosen;          /* when sampling.n_logprobs > 0 */
    const tm_logprob *top;      /* (n_top) */
    int32_t n_top;
    const char *finish_reason;  /* NULL while running; "stop", "length", "abort" on the final event */
    const struct tm_gen_stats *stats; /* the request's timings, on the final event only */
} tm_gen_event;

/* Called on the engine's thread for every token and once more with finish_reason set. Return false to
 * abort the request (finish reason "abort"). Must not block. */
typedef bool (*tm_gen_cb)(void *user, const tm_gen_event *ev);

typedef struct tm_gen_stats {
    int32_t prompt_tokens, gen_tokens;
    int32_t cached_tokens;      /* prompt tokens found in the prefix cache at the first admission (not computed) */
    double arrival_s, first_scheduled_s, first_token_s, finish_s; /* engine clock (tm_time_s) */
    double ttft_s;              /* arrival -> first token */
    double prefill_s, decode_s; /* first scheduled -> first token, first token -> finish */
    int32_t n_preempted;
    const char *finish_reason;  /* "stop", "length", "abort" */
} tm_gen_stats;

typedef struct tm_engine_cfg {
    tm_runner_cfg runner;       /* runner.n_seqs sizes the KV pool (n_seqs full contexts) */
    tm_sched_cfg sched;         /* max_batched_tokens defaults to runner.max_batch_tokens */
    tm_metrics *metrics;        /* borrowed; NULL = no metrics. Recorded on the engine thread, lock-free */
    bool no_pipeline;           /* run each step to completion before planning the next (pipelining is on where the
                                 * backend can: tm_runner_can_pipeline) */
} tm_engine_cfg;

typedef struct tm_request tm_request;

/* A pipelined step queued on the backend whose sampled ids the host has not collected yet. */
typedef struct tm_engine_pass {
    tm_request **rows;          /* (max_seqs) the request of each logits row; NULL once it finished */
    int32_t n_rows;
} tm_engine_pass;

/* What the last tm_engine_step call put on the device (for step traces; bench throughput --step-trace). */
typedef struct tm_engine_step_info {
    char kind;          /* 's': a step run and postprocessed in the call; 'l': launched, collected by the next call;
                         * 'c': a certain decode step chained behind the one in flight, whose tokens were then
                         * collected; 'w': only the step in flight collected; '-': nothing to do */
    int32_t n_seqs;     /* sequences in the step launched by this call (0 for 'w' and '-') */
    int32_t n_tokens;   /* tokens in it */
    int32_t n_prefill;  /* of which prompt tokens (prefill chunks) */
} tm_engine_step_info;

typedef struct tm_engine {
    const tm_model *model;      /* borrowed */
    tm_runner *runner;          /* owned */
    tm_sched sched;
    tm_metrics *metrics;        /* borrowed, may be NULL */
    tm_kv_stats kv_seen;        /* pool counters already added to the metrics */
    tm_request **live;          /* (n_live, cap_live) requests not yet finished */
    int32_t n_live, cap_live;
    uint64_t next_id;
    /* per-step staging, (max_seqs) each */
    tm_kv_seq **st_kv;
    const int32_t **st_ids;
    int32_t *st_n;
    bool *st_logits;
    int32_t *st_src;            /* (max_seqs) a chained step's rows of the pass before it */
    tm_sched_seq **st_seq;      /* (max_seqs) a chained step's sequences */
    int32_t *pen_mark;          /* (n_vocab) zeros between uses, or NULL until a step's penalties go to the backend */
    /* Pipelining: a decode step whose next step is certain (every running sequence decodes one token, nothing is
     * waiting to be admitted, blocks are free) is queued before the host has seen the tokens it samples; the next
     * tm_engine_step queues the step after it, reading those tokens on the device (tm_batch.token_src), and only
     * then collects them. Sequences that turn out to have stopped get one token computed and dropped. */
    bool pipeline;
    tm_engine_pass pass[2];     /* in flight (runner->n_pending of them), indexed by the runner's slot (oldest:
                                 * runner->pend_first) */
    tm_engine_step_info last;   /* the last tm_engine_step call's launch */
} tm_engine;

tm_status tm_engine_create(const tm_model *m, const tm_engine_cfg *cfg, tm_engine **out, tm_error *err);
void tm_engine_free(tm_engine *e);
/* The checks tm_engine_add makes (prompt length and ids, max_tokens, sampling values); reads only fields
 * fixed at creation, so any thread may call it. */
tm_status tm_engine_check_request(const tm_engine *e, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp,
                                  tm_error *err);
/* Queue a request; cb gets its tokens and final event. *id (may be NULL) gets its id. The prompt is copied. */
tm_status tm_engine_add(tm_engine *e, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp, tm_gen_cb cb,
                        void *user, uint64_t *id, tm_error *err);
/* Abort a request in any state; its blocks return to the pool now and its callback gets the final event. */
bool tm_engine_abort(tm_engine *e, uint64_t id);
/* Abort every live request (final "abort" events). */
void tm_engine_abort_all(tm_engine *e);
/* One step: schedule -> forward -> sample -> postprocess. Finished requests free their blocks. When pipelining, a
 * call queues the next step (if it is certain) and then collects and postprocesses the previous one. */
tm_status tm_engine_step(tm_engine *e, tm_error *err);
static inline bool tm_engine_has_work(const tm_engine *e) { return e->n_live > 0 || e->runner->n_pending > 0; }

/* Convenience: one request run to completion (the CLI's `run`). */
tm_status tm_engine_generate(tm_engine *e, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp,
                             tm_gen_cb cb, void *user, tm_gen_stats *stats, tm_error *err);

#endif /* TM_ENGINE_H */
