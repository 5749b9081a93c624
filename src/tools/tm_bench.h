/* tm_bench.h -- `tokenmill bench throughput`: an offline load through the engine (all requests at t=0). */
#ifndef TM_BENCH_H
#define TM_BENCH_H

#include "core/tm_core.h"

typedef struct tm_bench_tp_cfg {
    const char *model;
    int32_t n_threads;
    int32_t num_prompts;
    int32_t input_len;
    int32_t output_len;          /* fixed output length, unless out_min/out_max > 0 */
    int32_t out_min, out_max;    /* uniform:A:B */
    int32_t shared_prefix;       /* leading tokens common to every prompt */
    bool static_batching;
    int32_t max_seqs;            /* sequences per step (0 = 32) */
    int32_t max_batched_tokens;  /* tokens per step (0 = 512) */
    int32_t act_bits;
    bool no_prefix_cache;
    bool json;
    uint64_t seed;
} tm_bench_tp_cfg;

/* Runs the benchmark and prints the report (text or one JSON object) to stdout. */
tm_status tm_bench_throughput(const tm_bench_tp_cfg *cfg, tm_error *err);

#endif /* TM_BENCH_H */
