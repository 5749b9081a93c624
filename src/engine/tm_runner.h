/* tm_runner.h -- runs the model over sequences: owns backend, workspace and the KV pool, builds the ragged
 * batch of a step. Generation (sampling, stops, streaming, scheduling) is the engine's (tm_engine.h). */
#ifndef TM_RUNNER_H
#define TM_RUNNER_H

#include "backend/backend.h"
#include "kv/tm_kv.h"
#include "model/tm_model.h"
#include "model/tm_tp_forward.h"

typedef enum tm_device { TM_DEVICE_CPU = 0, TM_DEVICE_CUDA = 1 } tm_device;

/* KV cache element type. auto: f16 on the cpu (half of f32's bytes; llama.cpp's default), bf16 on cuda; the cpu
 * backend also takes f32 and fp8, cuda bf16 and fp8 */
typedef enum tm_kv_dtype { TM_KV_AUTO = 0, TM_KV_F32, TM_KV_F16, TM_KV_BF16, TM_KV_FP8 } tm_kv_dtype;
/* "auto", "f32", "f16", "bf16", "fp8" or "fp8_e4m3" (NULL: auto); false for anything else */
bool tm_kv_dtype_parse(const char *s, tm_kv_dtype *out);
/* the tm_dtype a KV type takes on a device (TM_KV_AUTO resolved) */
tm_dtype tm_kv_dtype_resolve(tm_kv_dtype k, tm_device dev);

typedef struct tm_runner_cfg {
    int32_t n_threads;          /* cpu threads (default: all cores) */
    int32_t n_ctx;              /* max tokens per sequence (default: min(model's, 4096)) */
    int32_t max_batch_tokens;   /* tokens per forward pass (prefill chunk), default 512 */
    int32_t block_size;         /* KV block size, default 16 */
    int32_t n_seqs;             /* sequences the KV pool is sized for, default 1 */
    int32_t act_bits;           /* cpu activation blocks for integer dots: 16 (default) or 8 */
    int32_t kv_blocks;          /* KV pool size in blocks; 0 = n_seqs full contexts */
    bool no_prefix_cache;       /* true: full blocks are not hashed and shared (prefix caching off) */
    tm_device device;           /* cpu (default) or cuda */
    int32_t cuda_device;        /* CUDA device ordinal */
    bool no_graphs;             /* cuda: no CUDA graphs for decode steps */
    int32_t tp;                 /* tensor-parallel ranks (<= 1: none): cpu ranks in one process (an in-process sum)
                                 * or one GPU per rank (cuda_device + r) with NCCL all-reduces */
    tm_kv_dtype kv_dtype;       /* the KV cache's element type (TM_KV_AUTO: cpu f16, cuda bf16) */
} tm_runner_cfg;

typedef struct tm_runner {
    const tm_model *model;      /* the model rank 0's forward runs: borrowed, a shard, or a placed copy */
    /* tensor parallelism (cfg.tp > 1): rank 0 is be/ws/model; ranks 1.. have their own backend and workspace */
    tm_model *tp_shard[TM_TP_MAX_RANKS];     /* owned shard models */
    tm_backend *tp_be[TM_TP_MAX_RANKS];      /* [0] unused (be) */
    tm_workspace tp_ws[TM_TP_MAX_RANKS];     /* [0] unused (ws) */
    tm_model *tp_placed[TM_TP_MAX_RANKS];    /* each rank's model (shard or whole) placed by its backend (cuda: on its GPU; cpu: with decode copies) */
    tm_cuda_tp *cuda_tp;                     /* cuda: the NCCL communicators, or NULL */
    tm_tp_host_reduce *tp_host;              /* cpu ranks: the all-reduce of host activations, or NULL */
    tm_threadpool *tp_threads;               /* (tp > 1) one thread per rank, rank 0 the caller's */
    tm_backend *be;             /* owned */
    tm_workspace ws;
    tm_kv_pool pool;
    tm_runner_cfg cfg;
    float *logits;              /* (max_logits, n_vocab) host logits of the last pass */
    bool logits_borrowed;       /* logits is the workspace's own buffer (a host backend): not freed here */
    int32_t *greedy;            /* (max_logits) argmax ids of the last pass when it ran with greedy_on_device */
    bool greedy_on_device;      /* the next step only: argmax on the backend, only ids to the host (r->logits
                                 * unset); cleared by tm_runner_step */
    bool sample_on_device;      /* the next step only: draw each row per sample_rows on the backend (ids in greedy) */
    tm_sample_row *sample_rows; /* (max_logits) recipes of the next step's logits rows */
    tm_sample_pen *sample_pen;  /* (cap_sample_pen) the next step's penalty entries (rows' pen_first / pen_n) */
    int32_t n_sample_pen, cap_sample_pen;
    bool host_sampling;         /* TM_HOST_SAMPLING=1: every row drawn by the host sampler (for comparisons) */
    bool sample_logprobs;       /* the next step only: some row wants logprobs (into sample_lp) */
    tm_sample_lp *sample_lp;    /* (max_logits) logprobs of the last pass's rows drawn on the backend with
                                 * sample_logprobs (collected with its ids) */
    /* batch staging, (max_batch_tokens) each unless noted */
    int32_t *b_ids, *b_src, *b_pos, *b_seq, *b_logits_idx;
    int64_t *b_slots;
    int32_t *b_qstart;          /* (max_seqs + 1) */
    int32_t *b_ctx;             /* (max_seqs) */
    int32_t *b_last;            /* (max_seqs) batch row of each caller sequence's last new token */
    int32_t *b_btab;            /* (max_seqs, max_blocks) */
    int32_t max_seqs, max_blocks;
    /* pipelined passes (tm_runner_launch) whose ids are not collected yet: at most two, in slots pend_first and
     * pend_first ^ 1 (the backend's ids slots), pend_rows[slot] ids each */
    int32_t n_pending, pend_first, pend_rows[2];
    double pass_s;              /* seconds inside forward passes, from the first op until the logits or sampled ids
                                 * are on the host (what is left of a step is host work with the device idle) */
} tm_runner;

/* "cpu", "cuda" or "cuda:N" (NULL or "" = cpu) */
tm_status tm_device_parse(const char *spec, tm_device *dev, int32_t *ordinal, tm_error *err);

/* Load spec for a runner on `dev` with `tp` ranks: dummy weights are left for the device to make (deferred) on a
 * single GPU, and generated on the host when sharded (shards are cut on the host) or when TM_DUMMY_HOST=1 asks for
 * the host generator (the same weights on every device and rank count, for comparisons). */
tm_status tm_runner_load_model(const char *spec, tm_device dev, int32_t tp, tm_model **out, tm_error *err);

tm_status tm_runner_create(const tm_model *m, const tm_runner_cfg *cfg, tm_runner **out, tm_error *err);
void tm_runner_free(tm_runner *r);

/* One forward pass for several sequences: seq k appends new_ids[k][0..n_new[k]) to its cache
 * (whose blocks must already be reserved), and if want_logits[k] the logits of its last new token go
 * to r->logits row k' where k' counts sequences with want_logits before k. Positions = cache index. */
tm_status tm_runner_step(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                         const bool *want_logits, int32_t n_seqs, tm_error *err);

/* Pipelined steps: the host plans and queues the next pass while the backend still runs this one.
 * tm_runner_can_pipeline: the backend has argmax_start, sample_start and ids_wait (one rank).
 * tm_runner_launch: tm_runner_step with greedy_on_device or sample_on_device set (at least one logits row), except
 * that it returns once the pass is queued; its ids are collected later, oldest first, by tm_runner_collect (into
 * r->greedy; *n_rows = the pass's logits rows). At most two passes are pending. src_row (n_seqs) or NULL: where
 * src_row[k] >= 0 (n_new[k] must be 1), sequence k's token is row src_row[k] of the newest pending pass's ids, which
 * the host has not seen (new_ids[k] is not read): its cache entry is advanced (tm_kv_seq_advance), and the caller
 * records its id with tm_kv_seq_set_ids once that pass is collected. tm_runner_step refuses to run while passes
 * are pending. */
bool tm_runner_can_pipeline(const tm_runner *r);
tm_status tm_runner_launch(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                           const bool *want_logits, int32_t n_seqs, const int32_t *src_row, tm_error *err);
tm_status tm_runner_collect(tm_runner *r, int32_t *n_rows, tm_error *err);

/* Room for n more penalty entries in sample_pen (after n_sample_pen). */
tm_status tm_runner_pen_reserve(tm_runner *r, int32_t n, tm_error *err);
/* True when the backend can take the argmax itself (set r->greedy_on_device per step). */
bool tm_runner_can_argmax(const tm_runner *r);
bool tm_runner_can_sample(const tm_runner *r);

/* A prompt the runner can take: non-empty, shorter than the context, ids inside the vocabulary. Reads
 * only fields fixed at creation, so any thread may call it. */
tm_status tm_runner_check_prompt(const tm_runner *r, const int32_t *prompt, size_t n_prompt, tm_error *err);

/* Logits of the prompt's last token only (for parity tests): writes n_vocab floats. */
tm_status tm_runner_prompt_logits(tm_runner *r, const int32_t *prompt, size_t n_prompt, float *out, tm_error *err);

#endif /* TM_RUNNER_H */
