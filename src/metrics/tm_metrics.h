/* tm_metrics.h -- lock-free counters, gauges, histograms, per-request timing, Prometheus text, percentiles. */
#ifndef TM_METRICS_H
#define TM_METRICS_H

#include "core/tm_core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Threading model: one registry (tm_metrics) per engine, created and freed explicitly (no globals).
 * Registration (tm_metrics_add_*) allocates and must happen before the metric is shared between
 * threads. Recording (tm_counter_add, tm_gauge_set, tm_histogram_observe, tm_req_on_*) never
 * allocates and never locks: a counter add is one relaxed atomic add, a histogram observation one
 * atomic add on its bucket plus a CAS loop on the bit pattern of the double sum. Readers (render,
 * snapshot, summary) may run on any thread at the same time as writers; a snapshot is consistent in
 * itself (its +Inf bucket equals its count) but its sum may lag or lead its buckets by in-flight
 * observations.
 */

#define TM_HIST_MAX_BOUNDS 64 /* finite bucket boundaries per histogram; +Inf is implicit */

typedef struct tm_metrics tm_metrics;
typedef struct tm_counter tm_counter;
typedef struct tm_gauge tm_gauge;
typedef struct tm_histogram tm_histogram;

/* ---- metric objects (hot path: no allocation, no locks) ------------------------------------- */

void tm_counter_add(tm_counter *c, uint64_t n); /* monotonic; wraps only after 2^64 */
static inline void tm_counter_inc(tm_counter *c) { tm_counter_add(c, 1); }
uint64_t tm_counter_get(const tm_counter *c);

void tm_gauge_set(tm_gauge *g, double v);
void tm_gauge_add(tm_gauge *g, double delta); /* CAS on the bit pattern */
static inline void tm_gauge_inc(tm_gauge *g) { tm_gauge_add(g, 1.0); }
static inline void tm_gauge_dec(tm_gauge *g) { tm_gauge_add(g, -1.0); }
double tm_gauge_get(const tm_gauge *g);

/* Count v in the first bucket whose upper bound satisfies v <= le (le is inclusive), or in +Inf.
 * Non-finite values (NaN, +-Inf) are ignored: they would poison the sum forever. */
void tm_histogram_observe(tm_histogram *h, double v);

typedef struct tm_hist_snapshot {
    size_t n_bounds;
    double bounds[TM_HIST_MAX_BOUNDS];     /* (n_bounds) strictly increasing, finite */
    uint64_t counts[TM_HIST_MAX_BOUNDS + 1]; /* (n_bounds + 1) per bucket, NOT cumulative; last = +Inf */
    uint64_t count;                        /* sum of counts[] */
    double sum;
} tm_hist_snapshot;
void tm_histogram_snapshot(const tm_histogram *h, tm_hist_snapshot *s);

/* ---- registry --------------------------------------------------------------------------------- */

typedef enum tm_finish_reason {
    TM_FINISH_STOP = 0, /* EOS or a stop string/token */
    TM_FINISH_LENGTH,   /* max_tokens or the context length */
    TM_FINISH_ABORT,    /* cancelled by the client, or an error */
    TM_FINISH_COUNT
} tm_finish_reason;
const char *tm_finish_reason_name(tm_finish_reason r); /* "stop", "length", "abort"; "unknown" */

/* A series: name (Prometheus syntax [a-zA-Z_:][a-zA-Z0-9_:]*), help text, and at most one label.
 * Series with the same name form one family (one # HELP/# TYPE); they must agree on type, help and
 * label name, and carry distinct label values. Strings are copied. */
typedef struct tm_metric_desc {
    const char *name;
    const char *help;
    const char *label_name;  /* NULL: unlabeled (then the family holds this one series) */
    const char *label_value; /* required when label_name is set; any bytes, escaped on output */
} tm_metric_desc;

/* An empty registry; add metrics with tm_metrics_add_*. */
tm_status tm_metrics_create_empty(tm_metrics **out, tm_error *err);
/* A registry holding the engine's standard set (tm_metrics_std). max_model_len >= 1 sets the upper
 * end of the 1-2-5 buckets of the prompt/generation token histograms. */
tm_status tm_metrics_create(uint64_t max_model_len, tm_metrics **out, tm_error *err);
void tm_metrics_free(tm_metrics *m);

tm_status tm_metrics_add_counter(tm_metrics *m, const tm_metric_desc *d, tm_counter **out, tm_error *err);
tm_status tm_metrics_add_gauge(tm_metrics *m, const tm_metric_desc *d, tm_gauge **out, tm_error *err);
/* bounds: (n_bounds) finite, strictly increasing, 1 <= n_bounds <= TM_HIST_MAX_BOUNDS; copied. */
tm_status tm_metrics_add_histogram(tm_metrics *m, const tm_metric_desc *d, const double *bounds, size_t n_bounds,
                                   tm_histogram **out, tm_error *err);

/* The standard set, named like vLLM's with the tokenmill: prefix; bucket boundaries as vLLM's. */
typedef struct tm_metrics_std {
    tm_histogram *ttft;          /* tokenmill:time_to_first_token_seconds */
    tm_histogram *tpot;          /* tokenmill:time_per_output_token_seconds (one per request) */
    tm_histogram *itl;           /* tokenmill:inter_token_latency_seconds (one per decode step) */
    tm_histogram *e2e;           /* tokenmill:e2e_request_latency_seconds */
    tm_histogram *queue;         /* tokenmill:request_queue_time_seconds */
    tm_histogram *prompt_tokens; /* tokenmill:request_prompt_tokens */
    tm_histogram *gen_tokens;    /* tokenmill:request_generation_tokens */
    tm_gauge *running;           /* tokenmill:num_requests_running */
    tm_gauge *waiting;           /* tokenmill:num_requests_waiting */
    tm_gauge *kv_usage;          /* tokenmill:kv_cache_usage_perc (0..1) */
    tm_counter *prefix_queries;  /* tokenmill:prefix_cache_queries_total (tokens queried) */
    tm_counter *prefix_hits;     /* tokenmill:prefix_cache_hits_total (tokens found cached) */
    tm_counter *preemptions;     /* tokenmill:num_preemptions_total */
    tm_counter *prompt_tokens_total;             /* tokenmill:prompt_tokens_total */
    tm_counter *gen_tokens_total;                /* tokenmill:generation_tokens_total */
    tm_counter *success[TM_FINISH_COUNT];        /* tokenmill:request_success_total{finished_reason} */
} tm_metrics_std;
/* The standard set, or NULL for a registry made by tm_metrics_create_empty. */
tm_metrics_std *tm_metrics_get_std(tm_metrics *m);
/* Scheduler gauges in one call (no-op without the standard set). */
void tm_metrics_set_sched(tm_metrics *m, uint64_t n_running, uint64_t n_waiting, double kv_usage);

/* vLLM's bucket lists, exposed for tests and tools. */
extern const double tm_metrics_ttft_bounds[];    /* (tm_metrics_ttft_bounds_n) */
extern const size_t tm_metrics_ttft_bounds_n;
extern const double tm_metrics_tpot_bounds[];    /* (tm_metrics_tpot_bounds_n), also ITL */
extern const size_t tm_metrics_tpot_bounds_n;
extern const double tm_metrics_latency_bounds[]; /* (tm_metrics_latency_bounds_n), E2E and queue */
extern const size_t tm_metrics_latency_bounds_n;
/* 1, 2, 5, 10, 20, 50, ... up to max_value inclusive; returns the count written (<= cap). */
size_t tm_metrics_buckets_1_2_5(uint64_t max_value, double *out, size_t cap);

/* ---- Prometheus text exposition format 0.0.4 ------------------------------------------------- */

/* Render into buf (cap bytes, NUL-terminated when cap > 0). *len (may be NULL) gets the full text
 * length without the NUL. If cap <= that length: TM_ERR_RANGE, buf holds a truncated prefix, and
 * *len tells how much to allocate (len + 1). Numbers never depend on the process locale. */
tm_status tm_metrics_render(const tm_metrics *m, char *buf, size_t cap, size_t *len, tm_error *err);
/* Render into a malloc'ed NUL-terminated string (free with free()); *len (may be NULL) = strlen. */
tm_status tm_metrics_render_alloc(const tm_metrics *m, char **out, size_t *len, tm_error *err);
/* The Content-Type header value for the /metrics response. */
#define TM_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- summaries ---------------------------------------------------------------------------------- */

typedef struct tm_summary {
    uint64_t count;
    double mean, p50, p90, p99; /* NaN when count == 0 */
} tm_summary;

/* Percentile p in [0, 100] from a histogram snapshot, interpolated linearly within the bucket that
 * holds rank p/100*count (as Prometheus' histogram_quantile; the first bucket starts at 0 when its
 * bound is positive; ranks in +Inf give the largest finite bound). NaN when empty or p invalid. */
double tm_hist_snapshot_percentile(const tm_hist_snapshot *s, double p);
tm_summary tm_histogram_summary(const tm_histogram *h);

/* Exact percentile p in [0, 100] of v[0..n), linear interpolation between closest ranks (numpy's
 * default): rank = p/100*(n-1). Sorts v in place (NaNs last). NaN when n == 0 or p invalid. */
double tm_stats_percentile(double *v, size_t n, double p);
/* mean/p50/p90/p99 of v (sorted in place). */
tm_summary tm_stats_summary(double *v, size_t n);

/* ---- per-request timing ----------------------------------------------------------------------- */

/* Times are caller-supplied seconds on one monotonic clock (tm_time_s() in the engine, a fake
 * clock in tests). The record is owned by one thread (the engine step loop); it feeds the registry
 * passed to each call (NULL: record only). Negative intervals (clock misuse) are clamped to 0.
 * A zeroed record that never saw tm_req_on_arrival ignores every other call. */
typedef struct tm_req_timing {
    double arrival;         /* seconds */
    double first_scheduled; /* first time the scheduler admitted it (valid when scheduled) */
    double last_scheduled;  /* latest admission (after a preemption) */
    double first_token;     /* valid when n_generated > 0 */
    double last_token;      /* valid when n_generated > 0 */
    double finish;          /* valid when finished */
    uint64_t n_prompt;
    uint64_t n_generated;
    uint64_t n_itl;         /* decode steps after the first token (= ITL samples) */
    double itl_sum;         /* seconds, sum of the inter-token gaps */
    double itl_max;         /* seconds */
    uint32_t n_scheduled;   /* admissions (1 + preemptions that were re-admitted) */
    bool arrived, finished;
    tm_finish_reason reason;
} tm_req_timing;

/* Reset the record and stamp the arrival. */
void tm_req_on_arrival(tm_req_timing *t, double now, uint64_t n_prompt);
/* Every admission by the scheduler; the first one ends the queue time. */
void tm_req_on_scheduled(tm_req_timing *t, double now);
/* n >= 1 tokens produced in one engine step at `now` (n > 1: speculative decoding). The first call
 * observes TTFT and adds the prompt to prompt_tokens_total; later calls observe one ITL gap each.
 * Every call adds n to generation_tokens_total. Ignored after finish or with n == 0. */
void tm_req_on_tokens(tm_req_timing *t, tm_metrics *m, double now, uint64_t n);
static inline void tm_req_on_token(tm_req_timing *t, tm_metrics *m, double now) { tm_req_on_tokens(t, m, now, 1); }
/* Finish once (later calls are ignored and return false): observes E2E, queue time (until the first
 * admission, or until finish when never admitted), TPOT = (last - first) / (n_generated - 1) when
 * n_generated > 1, the prompt/generation token histograms and request_success_total{reason}. */
bool tm_req_on_finish(tm_req_timing *t, tm_metrics *m, double now, tm_finish_reason reason);

/* Derived per-request numbers for reports; NaN where undefined. */
typedef struct tm_req_stats {
    double ttft, tpot, itl_mean, e2e, queue; /* seconds */
} tm_req_stats;
tm_req_stats tm_req_timing_stats(const tm_req_timing *t);

#endif /* TM_METRICS_H */
