/* tm_bench.h -- `tokenmill bench throughput`: an offline load through the engine (all requests at t=0). */
#ifndef TM_BENCH_H
#define TM_BENCH_H

#include "core/tm_core.h"
#include "engine/tm_runner.h"
#include "engine/tm_sampler.h"

typedef struct tm_bench_tp_cfg {
    const char *model;
    const char *device;          /* "cpu" (NULL) or "cuda[:N]" */
    int32_t tp;                  /* tensor-parallel ranks (0/1: none) */
    bool no_graphs;
    tm_kv_dtype kv_dtype;        /* the KV cache's element type */
    int32_t n_threads;
    int32_t num_prompts;
    int32_t input_len;
    int32_t output_len;          /* fixed output length, unless out_min/out_max > 0 */
    int32_t out_min, out_max;    /* uniform:A:B */
    int32_t shared_prefix;       /* leading tokens common to every prompt */
    bool static_batching;
    int32_t max_seqs;            /* sequences per step (0 = 32) */
    int32_t max_batched_tokens;  /* tokens per step (0 = 512) */
    int32_t block_size;          /* KV cache tokens per block (0 = 16) */
    bool no_pipeline;            /* every step finished before the next is planned */
    int32_t act_bits;
    bool no_prefix_cache;
    bool json;
    bool sequential;             /* each request arrives when the previous one finished (TTFT = pure prefill) */
    uint64_t seed;
    const char *step_trace;      /* throughput: a file that gets one line per engine step, or NULL */
    const tm_sampling_params *sampling; /* throughput: each request's recipe (its seed plus the request's index),
                                         * or NULL for greedy */
    double ceiling_gflop_s;      /* latency --batch: compute ceiling in GFLOP/s (0 = this run's prefill rate) */
} tm_bench_tp_cfg;

/* Runs the benchmark and prints the report (text or one JSON object) to stdout. */
tm_status tm_bench_throughput(const tm_bench_tp_cfg *cfg, tm_error *err);

/* Batched latency: B sequences of input_len random tokens prefilled together, then output_len decode
 * steps of B tokens each. Uses num_prompts as B and output_len; reports pp and tg tok/s, the step time,
 * and the roofline floor of a decode step: max(weight bytes / DRAM bandwidth (GB/s, 0 = skip),
 * step FLOPs / compute ceiling). Step FLOPs count the matmuls, the output projection of every row and
 * attention over the average context; the ceiling is ceiling_gflop_s when given, else the FLOP rate of
 * this run's prefill (a GEMM-shaped pass). */
tm_status tm_bench_latency_batch(const tm_bench_tp_cfg *cfg, double bw_gb_s, tm_error *err);

#endif /* TM_BENCH_H */
