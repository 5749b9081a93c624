/* tm_sched.h -- the iteration-level scheduler: which sequences run in the next step, with how many tokens.
 * Continuous batching (every step admits waiting sequences as budget and KV blocks allow, mixing decode
 * tokens with prefill chunks), preemption by recompute when blocks run out, priorities with FCFS inside
 * a priority and aging against starvation, and static batching as the baseline. Pure logic over the
 * KV block pool: no model, no threads. */
#ifndef TM_SCHED_H
#define TM_SCHED_H

#include "core/tm_core.h"
#include "kv/tm_kv.h"

typedef enum tm_seq_state {
    TM_SEQ_WAITING = 0, /* queued, never scheduled yet */
    TM_SEQ_RUNNING,     /* holds KV blocks; gets tokens every step */
    TM_SEQ_PREEMPTED,   /* queued again after preemption: no blocks, n_computed = 0, tokens kept for recompute */
    TM_SEQ_FINISHED,    /* done (stop, length); blocks released */
    TM_SEQ_ABORTED,     /* aborted by the client; blocks released */
} tm_seq_state;

/* The scheduler's view of a sequence. tokens = prompt followed by generated tokens. */
typedef struct tm_sched_seq {
    uint64_t id;
    int32_t priority;       /* lower value = more urgent (as in vLLM) */
    double arrival;         /* seconds, caller's clock */
    uint64_t order;         /* submission order: FCFS tie-break */
    tm_seq_state state;
    int32_t n_prompt;
    int32_t n_tokens;       /* prompt + generated so far */
    int32_t n_computed;     /* tokens whose K/V are in the cache */
    int32_t n_preempted;    /* times preempted */
    tm_kv_seq kv;
    const int32_t *tokens;  /* (n_tokens) the sequence's tokens, for prefix-cache lookups; may be NULL */
    void *user;             /* the engine's request */
} tm_sched_seq;

typedef enum tm_sched_policy { TM_SCHED_CONTINUOUS = 0, TM_SCHED_STATIC = 1 } tm_sched_policy;

typedef struct tm_sched_cfg {
    int32_t max_batched_tokens; /* tokens per step (default 512) */
    int32_t max_seqs;           /* sequences per step (default 64) */
    tm_sched_policy policy;
    double aging_s;             /* a waiting sequence gains one priority level per aging_s seconds (0 = off) */
} tm_sched_cfg;

/* One step's plan: seqs[i] computes n_new[i] tokens starting at its n_computed. */
typedef struct tm_sched_plan {
    tm_sched_seq **seqs;        /* (n) */
    int32_t *n_new;             /* (n) */
    int32_t n;
    int32_t n_tokens;           /* sum of n_new */
    tm_sched_seq **preempted;   /* (n_preempted) sequences preempted in this step (now waiting again) */
    int32_t n_preempted;
} tm_sched_plan;

typedef struct tm_sched {
    tm_sched_cfg cfg;
    tm_kv_pool *pool;           /* borrowed */
    tm_sched_seq **waiting;     /* (n_waiting) unordered; the policy picks */
    int32_t n_waiting, cap_waiting;
    tm_sched_seq **running;     /* (n_running) in admission order */
    int32_t n_running, cap_running;
    uint64_t next_order;
    bool static_batch_open;     /* static policy: a batch is running, admit nothing until it drains */
    tm_sched_plan plan;         /* buffers reused every step */
    int32_t plan_cap;           /* capacity of plan.seqs / plan.n_new (= max_seqs) */
    int32_t cap_preempted;      /* capacity of plan.preempted */
    uint64_t n_preemptions;
} tm_sched;

tm_status tm_sched_init(tm_sched *s, const tm_sched_cfg *cfg, tm_kv_pool *pool, tm_error *err);
void tm_sched_free(tm_sched *s);
/* Queue a sequence (state WAITING, n_computed 0). Its prompt must fit the context (checked by the engine). */
tm_status tm_sched_add(tm_sched *s, tm_sched_seq *q, tm_error *err);
/* Plan the next step. The plan points into s and is valid until the next call. KV blocks for every
 * planned token are reserved; sequences that could not keep their blocks are preempted (recompute:
 * blocks released, n_computed = 0, back to waiting with their tokens kept). An empty plan with waiting
 * sequences means even one sequence does not fit: TM_ERR_RANGE. */
tm_status tm_sched_schedule(tm_sched *s, double now, const tm_sched_plan **out, tm_error *err);
/* After the step ran: account the computed tokens (the engine then appends sampled tokens to n_tokens). */
void tm_sched_commit(tm_sched *s, const tm_sched_plan *p);
/* Finish or abort a sequence in any state: its blocks go back to the pool now. */
void tm_sched_finish(tm_sched *s, tm_sched_seq *q, tm_seq_state final_state);
static inline int32_t tm_sched_n_waiting(const tm_sched *s) { return s->n_waiting; }
static inline int32_t tm_sched_n_running(const tm_sched *s) { return s->n_running; }

#endif /* TM_SCHED_H */
