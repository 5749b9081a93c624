/* backend.h -- the op table between the model's forward pass and a compute backend (cpu, cuda). */
#ifndef TM_BACKEND_H
#define TM_BACKEND_H

#include "core/tm_core.h"
#include "core/tm_dtype.h"

/* A weight matrix (rows, cols) of `type`, row-major, rows of tm_dtype_row_bytes(type, cols) bytes.
 * 1-D weights (norms, biases) have rows = 1. data is backend memory (host memory for cpu). */
typedef struct tm_weight {
    const void *data;   /* (rows, cols) of type */
    tm_dtype type;
    int64_t rows, cols;
    /* A deferred dummy weight (data NULL until a backend places it): scale * uniform(-1, 1) from a hash of
     * (dummy_seed, index), or dummy_constant everywhere when it is non-zero. */
    bool dummy;
    uint64_t dummy_seed;
    float dummy_scale, dummy_constant;
    const void *aux;    /* a backend's companion copy made by weight_place, or NULL (cpu: the decode layout) */
    /* fp8_e4m3 weights (W8A8 with static per-tensor scales, as FP8 checkpoints carry them): element value =
     * scale * e4m3. A product first rounds each activation to e4m3 after dividing it by act_scale (a power of two,
     * so act_scale * e4m3(x / act_scale) is exact in bf16), then out = scale * act_scale * sum(e4m3(x / act_scale)
     * * e4m3(w)) (+ bias). Every backend and every batch size computes this; 0 for the other types. */
    float scale, act_scale;
} tm_weight;

/* One engine step's batch: flat and ragged. Token i belongs to sequence seq_index[i]; the tokens of
 * sequence s are query_start[s] .. query_start[s+1]-1, contiguous and in order. context_len[s] counts
 * the sequence's cache entries *including* this step's tokens, so token i sits at cache index
 * context_len[s] - (query_start[s+1] - i) and attends (causally) to cache entries 0 .. that index.
 * positions[] are the RoPE positions (equal to the cache index unless entries were evicted). */
typedef struct tm_batch {
    int32_t n_tokens;
    const int32_t *token_ids;    /* (n_tokens) */
    const int32_t *positions;    /* (n_tokens) */
    const int32_t *seq_index;    /* (n_tokens) */
    int32_t n_seqs;
    const int32_t *query_start;  /* (n_seqs + 1) */
    const int32_t *context_len;  /* (n_seqs) */
    int32_t max_blocks;          /* row stride of block_table */
    const int32_t *block_table;  /* (n_seqs, max_blocks) physical block ids */
    const int64_t *slot_mapping; /* (n_tokens) cache slot = block * block_size + offset for each new token */
    int32_t n_logits;
    const int32_t *logits_index; /* (n_logits) rows of the batch that need logits, in the order the logits rows
                                  * are wanted (the runner puts single-token sequences first in the batch) */
    const int32_t *token_src;    /* (n_tokens) or NULL. A pipelined step (ops->ids_wait): token i's id is row
                                  * token_src[i] of the ids the previous pass sampled on the backend (argmax_start or
                                  * sample_start), not yet seen by the host, where token_src[i] >= 0; token_ids[i]
                                  * where it is -1 (token_ids[i] is then a placeholder inside the vocabulary) */
} tm_batch;

/* The first sequence, not before lo, from which every sequence to the end of the batch is fresh (no cached prefix:
 * context_len equals its query length); n_seqs when the last one is not (or lo >= n_seqs). */
int32_t tm_batch_fresh_from(const tm_batch *b, int32_t lo);
/* Every row wants its logits, in row order (logits_index is 0 .. n_tokens - 1): the logits rows are the batch's
 * rows, with no gather between the last norm and the output projection. */
bool tm_batch_logits_all(const tm_batch *b);

/* Attention geometry and RoPE parameters, fixed per model. */
typedef struct tm_attn_cfg {
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t rope_dim;            /* rotated dims per head (<= head_dim) */
    bool rope_neox;              /* false: rotate adjacent pairs (llama); true: halves (qwen2/neox) */
    const float *rope_inv_freq;  /* (rope_dim / 2) inverse frequencies, scaling already applied */
    float attn_scale;            /* 1/sqrt(head_dim) */
} tm_attn_cfg;

/* KV cache geometry: one pool, per layer K and V of (n_blocks, n_kv_heads, block_size, head_dim). */
typedef struct tm_kv_cfg {
    int32_t n_layers, n_kv_heads, head_dim;
    int32_t block_size, n_blocks;
    tm_dtype dtype;              /* element type of the cache (cpu: f32 or f16) */
} tm_kv_cfg;

typedef struct tm_backend tm_backend;

/* One row's sampling recipe for a backend that samples on its own (ops->sample): temperature <= 0 is argmax;
 * top_k <= 0, top_p >= 1, min_p <= 0 are off; the draw is a function of (seed, offset). Penalties come first:
 * the row's entries pen[pen_first .. pen_first + pen_n) of the step's tm_sample_set each change one logit as the
 * host sampler does (tm_sampler.h step 3): x = x > 0 ? x / repeat_penalty : x * repeat_penalty where in_window,
 * then x -= count * frequency_penalty + presence_penalty where count > 0 (plain float operations, no fused
 * multiply-add). pen_src >= 0 (a pipelined step, sample_start): the history ends with one more id, the one the
 * previous pass drew in row pen_src, not yet on the host; the entries cover the history before it (the repeat
 * window one shorter), and the backend adds that id: once more in its count when presence_penalty or
 * frequency_penalty is not 0, and in the window when repeat_penalty is not 1. n_logprobs > 0: the row's
 * tm_sample_lp, from the log-softmax of the logits before penalties. */
typedef struct tm_sample_row {
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed, offset;
    float repeat_penalty, presence_penalty, frequency_penalty;
    int32_t pen_first, pen_n;    /* the row's penalty entries (pen_n = 0: none) */
    int32_t pen_src;             /* -1, or the previous pass's row whose id ends the history (see above) */
    int32_t n_logprobs;          /* 0 .. TM_SAMPLE_MAX_TOP */
} tm_sample_row;

/* One distinct id of a row's history, as its penalties see it (tm_sampler_pen_entries builds them). */
typedef struct tm_sample_pen {
    int32_t id;                  /* in [0, vocab) */
    int32_t count;               /* occurrences in the history when presence or frequency penalties apply, else 0 */
    int32_t in_window;           /* 1: among the last repeat_last_n ids and the repeat penalty applies */
} tm_sample_pen;

/* A step's sampling recipes: one row per logits row, and every row's penalty entries. */
typedef struct tm_sample_set {
    const tm_sample_row *rows;   /* (n_rows) */
    const tm_sample_pen *pen;    /* (n_pen) */
    int32_t n_pen;
    bool logprobs;               /* some row has n_logprobs > 0 (then ops fill a tm_sample_lp per row) */
} tm_sample_set;

#define TM_SAMPLE_MAX_TOP 20
/* A row's logprobs: log-softmax of its logits before penalties (rows with n_logprobs = 0: unset). */
typedef struct tm_sample_lp {
    float chosen;                      /* of the id drawn */
    int32_t top_id[TM_SAMPLE_MAX_TOP]; /* the n_logprobs best ids, by logit then lower id (-1 past the vocabulary) */
    float top_lp[TM_SAMPLE_MAX_TOP];
} tm_sample_lp;

/* One matrix product of a group sharing an input (see ops->matmul). */
typedef struct tm_matmul_job {
    const tm_weight *w;
    const tm_weight *bias;       /* (1, w->rows) f32 or NULL */
    void *out;                   /* (n, w->rows) */
    bool out_f32;                /* keep the output in f32 (logits) where activations are narrower */
} tm_matmul_job;
#define TM_MATMUL_MAX_JOBS 4

/* The weights of one decoder layer (see ops->decoder_layer); absent biases are NULL. */
typedef struct tm_layer_weights {
    const tm_weight *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
} tm_layer_weights;

/* What a backend does with a forward pass (begin_step): the sizes its ops run at, and whether a captured graph
 * already ran the whole pass. A graph pads a batch to a bucket of tokens: padded tokens write a scratch cache
 * block and their rows are ignored. */
typedef struct tm_step_plan {
    int32_t n_tokens;            /* rows the ops run on (>= batch n_tokens) */
    int32_t n_logits;            /* rows of logits computed (>= batch n_logits) */
    bool replayed;               /* true: the pass already ran (graph replay); skip the ops */
} tm_step_plan;

/* Activations are backend buffers of `act` elements, row-major (n_tokens, width). cpu: f32 everywhere; cuda:
 * the residual stream (x) and logits f32, every other activation bf16 (tm_cuda_kernels.h). Ops that take token
 * ids or row indices (embed, get_rows) get pointers into the step's tm_batch, which a device backend already
 * holds in device memory after begin_step. */
typedef struct tm_backend_ops {
    const char *name;
    void (*free)(tm_backend *be);
    /* activation buffer of n elements; NULL on failure */
    void *(*alloc)(tm_backend *be, size_t n_elems);
    void (*release)(tm_backend *be, void *buf);
    /* KV cache pool (replaces any previous one) */
    tm_status (*kv_init)(tm_backend *be, const tm_kv_cfg *cfg, tm_error *err);

    /* x[i,:] = dequant(table[ids[i], :]) ; x (n, table->cols) */
    void (*embed)(tm_backend *be, const tm_weight *table, const int32_t *ids, int32_t n, void *x);
    /* out[i,:] = rmsnorm(x[i,:]) * w */
    void (*rmsnorm)(tm_backend *be, const void *x, const tm_weight *w, float eps, int32_t n, void *out);
    /* residual += x, then out = rmsnorm(residual) * w   (fused: one pass) */
    void (*add_rmsnorm)(tm_backend *be, void *residual, const void *x, const tm_weight *w, float eps, int32_t n,
                        void *out);
    /* for each job j: out_j (n, w_j->rows) = x (n, cols) · w_jᵀ (+ bias_j) ; all w_j share cols; the input is
     * converted once for the group (q, k, v share xb; gate and up share xb) and one dispatch covers it */
    void (*matmul)(tm_backend *be, const tm_matmul_job *jobs, int32_t n_jobs, const void *x, int32_t n);
    /* RoPE on q (n, n_heads*head_dim) and k (n, n_kv_heads*head_dim), then write k and v (n, kv width)
     * to the cache slots of layer `layer` */
    void (*rope_kv_write)(tm_backend *be, const tm_attn_cfg *a, int32_t layer, const tm_batch *b, void *q, void *k,
                          const void *v);
    /* out (n, n_heads*head_dim) = causal attention of q over the paged cache of layer `layer` */
    void (*attention)(tm_backend *be, const tm_attn_cfg *a, int32_t layer, const tm_batch *b, const void *q,
                      void *out);
    /* out (n, ffn) = silu(gate) * up */
    void (*swiglu)(tm_backend *be, const void *gate, const void *up, int32_t n, int32_t ffn, void *out);
    /* out (n_idx, width) = x[idx[j], :] */
    void (*get_rows)(tm_backend *be, const void *x, const int32_t *idx, int32_t n_idx, int32_t width, void *out);
    /* copy n elements of an activation buffer to host f32 */
    void (*to_host)(tm_backend *be, const void *x, size_t n, float *dst);
    /* copy n host f32 elements into an activation buffer (tests) */
    void (*from_host)(tm_backend *be, const float *src, size_t n, void *x);

    /* ---- optional (NULL on the cpu backend) ---- */
    /* Before a forward pass: upload the batch metadata (one copy) and plan the pass; end_step after the last
     * op (finishes a graph capture and runs it; *rerun = true when the capture failed and the pass must be
     * issued again, eagerly). */
    tm_status (*begin_step)(tm_backend *be, const tm_batch *b, tm_step_plan *plan, tm_error *err);
    tm_status (*end_step)(tm_backend *be, bool *rerun, tm_error *err);
    /* out (n, gate->rows) = silu(x · gateᵀ) * (x · upᵀ), fused where the backend can */
    void (*matmul_swiglu)(tm_backend *be, const tm_weight *gate, const tm_weight *up, const void *x, int32_t n,
                          void *out);
    /* Fused small-batch epilogues; each returns false, having done nothing, when it does not take the case (the
     * forward then runs the unfused ops). matmul_add_rmsnorm: the product of `job` on x (n rows) added into
     * residual, then norm_out = rmsnorm(residual) * norm_w, i.e. matmul(job) + add_rmsnorm(residual, job->out,
     * norm_w, eps, n, norm_out); job->out may be left unwritten. */
    bool (*matmul_add_rmsnorm)(tm_backend *be, const tm_matmul_job *job, const void *x, int32_t n, void *residual,
                               const tm_weight *norm_w, float eps, void *norm_out);
    /* matmul(jobs, 3, x, n) (q, k, v; jobs[j].out = q, k, v) then rope_kv_write(a, layer, b, q, k, v); k and v may be
     * left unwritten (their values reach the cache only). */
    bool (*matmul_qkv_rope)(tm_backend *be, const tm_matmul_job *jobs, const void *x, int32_t n, const tm_attn_cfg *a,
                            int32_t layer, const tm_batch *b, void *q, void *k, void *v);
    /* embed(table, ids, n, x) then rmsnorm(x, norm_w, eps, n, out): the pass's first two ops. `next` is the weight
     * of the product that reads out first (cuda: one of up to 8 rows and 16-bit or f32 weights norms x as it reads
     * it, and out holds x rounded to bf16 until another op reads it: tm_cuda_lazy.h). */
    bool (*embed_rmsnorm)(tm_backend *be, const tm_weight *table, const int32_t *ids, int32_t n, void *x,
                          const tm_weight *norm_w, float eps, void *out, const tm_weight *next);
    /* A whole decoder layer as one unit, where the backend can (cuda: a one-token step, tm_cuda_layer_decode): x (n,
     * dim) is the residual stream before the layer; on true it holds the stream after the layer (attention and MLP
     * added) and the layer's K and V are in the cache; q, att and h are activation buffers of the pass used as
     * scratch (widths n_heads * head_dim, the same, ffn_dim). False: nothing done; the forward runs the layer's ops. */
    bool (*decoder_layer)(tm_backend *be, const tm_layer_weights *L, const tm_attn_cfg *a, float eps, int32_t layer,
                          const tm_batch *b, void *x, int32_t n, void *q, void *att, void *h);
    /* Move a weight into backend memory: w->data (host) is copied, or a deferred dummy weight is made there;
     * w->data then points to backend memory, released with weight_release. */
    tm_status (*weight_place)(tm_backend *be, tm_weight *w, tm_error *err);
    void (*weight_release)(tm_backend *be, tm_weight *w);
    /* Optional: place n weights of one type, width and scales (as weight_place does each) in one allocation, their
     * rows concatenated in order: ws[i + 1]->data starts where ws[i]'s rows end. Products that share an input
     * (q, k, v; gate, up) can then run as one. Each is released with weight_release; the allocation goes with the
     * last. NULL, or an error: the caller places them one by one. */
    tm_status (*weight_place_group)(tm_backend *be, tm_weight *const *ws, int32_t n, tm_error *err);
    /* out_host (n_rows) = argmax of each row of an f32 logits buffer (ties: lowest id); only ids cross to the host */
    tm_status (*argmax)(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, int32_t *out_host,
                        tm_error *err);
    /* out_host (n_rows) = one token per row of an f32 logits buffer drawn per set->rows[r], after the rows'
     * penalties; with set->logprobs, lp_host (n_rows) gets each row's logprobs. Only ids and logprobs cross to the
     * host. The logits may be left with the penalties applied. */
    tm_status (*sample)(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, const tm_sample_set *set,
                        int32_t *out_host, tm_sample_lp *lp_host, tm_error *err);
    /* Pipelined sampling (optional, all three or none; the backend then takes tm_batch.token_src): argmax or sample
     * as above, but the calls return once the work is queued (set is copied). The ids stay on the backend as the
     * rows the next pass's token_src reads, and their copy to the host goes to `slot` (0 or 1: the host may begin
     * the next pass, sampling into the other slot, before it collects these); ids_wait(slot) waits for that copy
     * and writes the n_rows ids to out_host, and the logprobs to lp_host when that pass had set->logprobs. */
    tm_status (*argmax_start)(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, int32_t slot,
                              tm_error *err);
    tm_status (*sample_start)(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                              const tm_sample_set *set, int32_t slot, tm_error *err);
    tm_status (*ids_wait)(tm_backend *be, int32_t slot, int32_t n_rows, int32_t *out_host, tm_sample_lp *lp_host,
                          tm_error *err);
    /* bytes of backend memory still free */
    uint64_t (*mem_free)(tm_backend *be);
    /* ops stopped early on a device error: the first error since the last call (TM_OK if none), then cleared */
    tm_status (*last_error)(tm_backend *be, tm_error *err);
} tm_backend_ops;

struct tm_backend {
    const tm_backend_ops *ops;
};

/* CPU backend with its own thread pool. act_bits: 16 (default) quantizes activations to 16-bit blocks
 * for the integer dot products (matches an fp32 reference to ~1e-5), 8 to ggml's 8-bit blocks (faster
 * where compute-bound, ~1e-2 error). */
typedef struct tm_cpu_cfg {
    int32_t n_threads;           /* >= 1 */
    int32_t act_bits;            /* 8 or 16; 0 = 16 */
} tm_cpu_cfg;
tm_status tm_backend_cpu_create(const tm_cpu_cfg *cfg, tm_backend **out, tm_error *err);

/* CUDA backend on device `device` (TM_ERR_UNSUPPORTED in a build without CUDA, TM_ERR_DEVICE without a GPU). */
typedef struct tm_cuda_cfg {
    int32_t device;              /* CUDA device ordinal */
    int32_t max_tokens;          /* most tokens of a step (sizes scratch buffers) */
    int32_t max_logits;          /* rows of the workspace's logits buffer (graph padding stays within it) */
    bool no_graphs;              /* true: never capture CUDA graphs */
    bool shared_thread;          /* one thread drives several such backends (tensor-parallel ranks): every entry
                                  * point makes this backend's device current first */
} tm_cuda_cfg;
tm_status tm_backend_cuda_create(const tm_cuda_cfg *cfg, tm_backend **out, tm_error *err);
bool tm_backend_cuda_available(void);
/* a cuda backend's stream (cudaStream_t) and device ordinal (NULL / -1 without CUDA) */
void *tm_backend_cuda_stream(tm_backend *be);
int32_t tm_backend_cuda_device(tm_backend *be);

/* Tensor parallelism over cuda backends (one per GPU) in one process: NCCL communicators (NVLS off) and the
 * all-reduce callback of tm_tp_forward (bf16 activations, sum, on each rank's stream; called by each rank's thread
 * with its own buffer, so a rank's collectives are captured into its decode graphs like its kernels). */
typedef struct tm_cuda_tp tm_cuda_tp;
tm_status tm_cuda_tp_create(int32_t n_ranks, tm_backend *const *bes, tm_cuda_tp **out, tm_error *err);
void tm_cuda_tp_free(tm_cuda_tp *t);
void tm_cuda_tp_allreduce(void *user, int32_t rank, void *buf, size_t n_elems);
/* the first error an all-reduce met since the last call (TM_OK if none), then cleared */
tm_status tm_cuda_tp_last_error(tm_cuda_tp *t, tm_error *err);

#endif /* TM_BACKEND_H */
