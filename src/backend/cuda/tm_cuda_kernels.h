/* tm_cuda_kernels.h -- extern "C" launchers of tokenmill's CUDA kernels (the contract between .cu files and C). */
#ifndef TM_CUDA_KERNELS_H
#define TM_CUDA_KERNELS_H

/* Conventions (every launcher):
 * - pointers are device memory unless the name says host; bf16 values travel as uint16_t bit patterns;
 * - activations are row-major (rows, width); the residual stream and logits are f32, every other activation
 *   bf16; norm weights and biases f32; weights keep their GGUF block layout (tm_dtype.h) or bf16/f16/f32;
 * - a launcher only enqueues work on `stream`: no allocation, no host synchronisation, no device-to-host copy,
 *   so every launcher can be captured into a CUDA graph (batch sizes and pointers fixed at capture; values
 *   such as context lengths read from device memory at replay);
 * - a launcher returns cudaSuccess or the error of its launch (cudaGetLastError()); it never exits. */

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise, norms, RoPE, sampling (tm_cuda_elementwise.cu, tm_cuda_norm.cu, tm_cuda_sample.cu) ---- */

/* out[i,:] (bf16) = x[i,:] / rms(x[i,:]) * w ; x (n, dim) f32, w (dim) f32 */
cudaError_t tm_cuda_rmsnorm(const float *x, const float *w, float eps, int32_t n, int32_t dim, uint16_t *out,
                            cudaStream_t stream);
/* residual (n, dim) f32 += x (n, dim) bf16 ; out (n, dim) bf16 = rmsnorm(residual) * w   (one pass) */
cudaError_t tm_cuda_add_rmsnorm(float *residual, const uint16_t *x, const float *w, float eps, int32_t n, int32_t dim,
                                uint16_t *out, cudaStream_t stream);
/* tm_cuda_add_rmsnorm (residual non-NULL: residual += x, x bf16) or tm_cuda_rmsnorm (residual NULL: of xf f32) that
 * also writes out8 (n, dim) = e4m3(out * inv), what tm_cuda_quant_fp8(out, inv) makes of its bf16 output (the next
 * fp8 product's input); dim % 8 == 0 and dim <= 8192, 16-byte aligned operands (cudaErrorInvalidValue otherwise).
 * out may be NULL: only out8 (and the residual) are written */
cudaError_t tm_cuda_rmsnorm_fp8(float *residual, const uint16_t *x, const float *xf, const float *w, float eps,
                                int32_t n, int32_t dim, uint16_t *out, uint8_t *out8, float inv, cudaStream_t stream);
/* out (n, ffn) = silu(gate) * up, all bf16; out may alias gate or up */
cudaError_t tm_cuda_swiglu(const uint16_t *gate, const uint16_t *up, int32_t n, int32_t ffn, uint16_t *out,
                           cudaStream_t stream);
/* SwiGLU of one fused product: gu (n, 2 ffn) bf16, each row [gate | up] -> out (n, ffn) = silu(gate) * up bf16;
 * out8 (n, ffn), when not NULL, = e4m3(out * inv) as tm_cuda_quant_fp8(out, inv) makes it (inv > 0); no aliasing;
 * out may be NULL when out8 is not (only the e4m3 values are written) */
cudaError_t tm_cuda_swiglu_rows(const uint16_t *gu, int32_t n, int32_t ffn, uint16_t *out, uint8_t *out8, float inv,
                                cudaStream_t stream);
/* out (n_idx, width) = x[idx[j], :] ; bf16 ; idx device */
cudaError_t tm_cuda_get_rows(const uint16_t *x, const int32_t *idx, int32_t n_idx, int32_t width, uint16_t *out,
                             cudaStream_t stream);
cudaError_t tm_cuda_bf16_to_f32(const uint16_t *x, size_t n, float *out, cudaStream_t stream);
/* out (n) e4m3 bytes = x (n) bf16 * inv, each rounded to nearest even and saturated at +-448 (the activations of an
 * fp8 GEMM: inv = 1 / act_scale, a power of two); inv > 0 */
cudaError_t tm_cuda_quant_fp8(const uint16_t *x, size_t n, float inv, uint8_t *out, cudaStream_t stream);
cudaError_t tm_cuda_f32_to_bf16(const float *x, size_t n, uint16_t *out, cudaStream_t stream);

/* RoPE on q and k of this step's tokens, then k and v written to their cache slots (fused: k never goes back
 * to global memory unrotated). Cache layout per layer: (n_blocks, n_kv_heads, block_size, head_dim) bf16;
 * token i goes to slot_mapping[i] = block * block_size + offset. Rotation: pairs (2j, 2j+1) when !neox,
 * (j, j + rope_dim/2) when neox, for j < rope_dim/2, angle = positions[i] * inv_freq[j]; dims >= rope_dim
 * pass through. */
typedef struct tm_cuda_rope_args {
    int32_t n_tokens, n_heads, n_kv_heads, head_dim, rope_dim, block_size;
    bool neox;
    const float *inv_freq;        /* (rope_dim / 2) */
    const int32_t *positions;     /* (n_tokens) */
    const int64_t *slot_mapping;  /* (n_tokens) */
    uint16_t *q;                  /* (n_tokens, n_heads * head_dim), rotated in place (or from q_src) */
    const uint16_t *k, *v;        /* (n_tokens, n_kv_heads * head_dim) rows, src_stride apart when it is set */
    uint16_t *k_cache, *v_cache;  /* this layer's (n_blocks, n_kv_heads, block_size, head_dim) */
    bool kv_fp8;                  /* the caches hold fp8 e4m3 bytes (the pointers are then read as bytes) */
    const uint16_t *q_src;        /* NULL, or q's input rows (src_stride apart): q then gets every dim from it */
    int32_t src_stride;           /* elements from one token's row of q_src, k and v to the next; 0: their widths
                                   * (one fused q|k|v product: q_src, k = q_src + q width, v = k + kv width) */
    uint16_t *k_out, *v_out;      /* NULL, or rows laid out as k and v (may be k and v themselves) that get the
                                   * values the cache holds (k rotated; fp8: widened back), for a prefill
                                   * attention that reads them (tm_cuda_attn_args.k_rows / v_rows) */
} tm_cuda_rope_args;
cudaError_t tm_cuda_rope_kv_write(const tm_cuda_rope_args *a, cudaStream_t stream);

/* out_ids[r] = argmax_j logits[r, j] (lowest index on ties); logits (n_rows, vocab) f32 */
cudaError_t tm_cuda_argmax(const float *logits, int32_t n_rows, int32_t vocab, int32_t *out_ids, cudaStream_t stream);

/* Per-row sampling parameters (device array, one per row). temperature <= 0 means greedy. */
typedef struct tm_cuda_sample_params {
    float temperature, top_p, min_p;
    int32_t top_k;                /* <= 0: off */
    uint64_t seed;                /* the row's random stream */
    uint64_t offset;              /* draw counter: (seed, offset) -> one uniform in [0, 1) */
} tm_cuda_sample_params;
/* Per-row penalties and logprobs (device array, one per row; tm_cuda_sample_prepare / _finish). */
typedef struct tm_cuda_sample_extra {
    float repeat_penalty, presence_penalty, frequency_penalty;
    int32_t pen_first, pen_n;     /* the row's penalty entries */
    int32_t pen_src;              /* -1, or the row of prev_ids whose id ends the row's history (after the entries') */
    int32_t n_top;                /* logprobs: 0 none, else the best n_top (<= TM_CUDA_SAMPLE_MAX_TOP) */
} tm_cuda_sample_extra;
/* One touched id of a row's history (the layout of backend.h's tm_sample_pen). */
typedef struct tm_cuda_sample_pen {
    int32_t id, count, in_window;
} tm_cuda_sample_pen;
#define TM_CUDA_SAMPLE_MAX_TOP 20
/* A row's logprobs (the layout of backend.h's tm_sample_lp). */
typedef struct tm_cuda_sample_lp {
    float chosen;
    int32_t top_id[TM_CUDA_SAMPLE_MAX_TOP];
    float top_lp[TM_CUDA_SAMPLE_MAX_TOP];
} tm_cuda_sample_lp;
/* One token per row from softmax(logits / T) restricted by top_k, then top_p (nucleus), then min_p; also the
 * chosen token's log-probability under the unrestricted softmax(logits) (T = 1) into out_logprob when not NULL.
 * work is unused (may be NULL). */
size_t tm_cuda_sample_work_bytes(int32_t n_rows, int32_t vocab);
cudaError_t tm_cuda_sample(const float *logits, int32_t n_rows, int32_t vocab, const tm_cuda_sample_params *params,
                           void *work, int32_t *out_ids, float *out_logprob, cudaStream_t stream);
/* Before tm_cuda_sample on the same logits: when want_lp, each row with n_top > 0 gets its n_top best ids (by
 * logit, ties by lower id; -1 past the vocabulary) and their log-softmax into out_lp, and its (max, log sum exp)
 * into work; then, when want_pen, each row's penalty entries pen[pen_first ..+ pen_n) change their logits in place
 * (the host sampler's float operations, tm_sampler_pen_apply; the repeat penalty applies where it is not 1), the
 * values before going to pen_raw (n_pen floats). A row with pen_src >= 0 also penalises prev_ids[pen_src], the id
 * the previous pipelined pass drew, as the last of its history: counted once more by presence and frequency
 * penalties and in the repeat window. work: tm_cuda_sample_work_bytes(n_rows, vocab) bytes. */
cudaError_t tm_cuda_sample_prepare(float *logits, int32_t n_rows, int32_t vocab, const tm_cuda_sample_extra *params,
                                   const tm_cuda_sample_pen *pen, int32_t n_pen, float *pen_raw, bool want_pen,
                                   const int32_t *prev_ids, bool want_lp, void *work, tm_cuda_sample_lp *out_lp,
                                   cudaStream_t stream);
/* After the draw (ids, n_rows): out_lp[r].chosen = the log-softmax of row r's logits before its penalties at ids[r],
 * for rows with n_top > 0 (work and pen_raw as tm_cuda_sample_prepare left them). */
cudaError_t tm_cuda_sample_finish(const float *logits, int32_t n_rows, int32_t vocab,
                                  const tm_cuda_sample_extra *params, const tm_cuda_sample_pen *pen, const float *pen_raw, const int32_t *ids,
                                  const void *work, tm_cuda_sample_lp *out_lp, cudaStream_t stream);

/* Fill n elements of type (TM_DT_F32, TM_DT_F16, TM_DT_BF16 or TM_DT_FP8_E4M3 numbers; fp8: e4m3 of the value)
 * with scale * uniform(-1, 1) from a counter-based hash of (seed, index), or with `constant` when constant != 0
 * (dummy weights made on device). */
cudaError_t tm_cuda_fill_random(void *dst, int32_t type, size_t n, uint64_t seed, float scale, float constant,
                                cudaStream_t stream);

/* *out = the XOR of the bytes / 4 32-bit words at p (bytes a multiple of 16, p 16-byte aligned): one read-only
 * stream over the buffer, 4 CTAs of 512 threads an SM with 64 bytes in flight a thread (tb_ceiling times it as the
 * read ceiling: a kernel that only reads, like decode attention, is not bound by the copy's read + write rate). */
cudaError_t tm_cuda_xor_u32(const void *p, size_t bytes, uint32_t *out, cudaStream_t stream);

/* ---- weights: dequantization, GEMV, embedding (tm_cuda_dequant.cu, tm_cuda_gemv.cu) ---- */

/* Weight types: TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K
 * (numbers of tm_dtype), and TM_DT_FP8_E4M3 (W8A8 with per-tensor scales, backend.h): the GEMVs take it with its
 * scales; dequant and embed do not (cudaErrorInvalidValue), larger batches run tm_cuda_quant_fp8 and the fp8 GEMM. */
bool tm_cuda_weight_type_supported(int32_t type);
/* x (n, cols) f32 = rows ids[i] of table (n_vocab, cols) dequantized */
cudaError_t tm_cuda_embed(const void *table, int32_t type, int64_t cols, const int32_t *ids, int32_t n, float *x,
                          cudaStream_t stream);
/* The same, where row i's id is prev[src[i]] when src (NULL: none) has src[i] >= 0: a pipelined step's ids, drawn by
 * the pass before it into prev (which must then be set); raw (NULL: none) (n, cols) bf16 also gets x rounded to
 * bf16, the raw residual of a product that norms its input (tm_cuda_gemv_job.norm_w) */
cudaError_t tm_cuda_embed_ex(const void *table, int32_t type, int64_t cols, const int32_t *ids, const int32_t *src,
                             const int32_t *prev, int32_t n, float *x, uint16_t *raw, cudaStream_t stream);
/* The scales of an fp8_e4m3 weight (backend.h's tm_weight scale and act_scale; w_up: the SwiGLU up weight's
 * scale). Launchers take NULL for the other types. Two optional buffers let a chain of small-batch fp8 products
 * skip rounding x in every product (both NULL: nothing changes):
 *   xq:   x (n, cols) already rounded, e4m3(x * (1 / act)) as tm_cuda_quant_fp8 makes it from x (the norms' and the
 *         decode attention's out8, the SwiGLU's out8 below). The tensor-core kernel reads it instead of rounding x
 *         (the same bytes, so the same results); x is still required (the CUDA-core kernels read it);
 *   out8: (tm_cuda_gemv_swiglu only) also receives e4m3(out * (1 / act)) (n, rows), what tm_cuda_quant_fp8 makes of
 *         the bf16 output: the down product's xq. It must not overlap xq. */
typedef struct tm_cuda_fp8_scales {
    float w, w_up, act;
    const uint8_t *xq;
    uint8_t *out8;
} tm_cuda_fp8_scales;
/* out (rows, cols) bf16 = dequant(w) ; for large batches, followed by a cuBLASLt GEMM */
cudaError_t tm_cuda_dequant_bf16(const void *w, int32_t type, int64_t rows, int64_t cols, uint16_t *out,
                                 cudaStream_t stream);
/* Small-batch matrix product with dequantization fused into the weight read (weights read once for all n rows):
 * out (n, rows) = x (n, cols) bf16 · wᵀ (+ bias f32 (rows) when non-NULL); out f32 when out_f32 else bf16.
 * 1 <= n <= TM_CUDA_GEMV_MAX_N. */
#define TM_CUDA_GEMV_MAX_N 8
cudaError_t tm_cuda_gemv(const void *w, int32_t type, int64_t rows, int64_t cols, const uint16_t *x, int32_t n,
                         const float *bias, void *out, bool out_f32, const tm_cuda_fp8_scales *fp8,
                         cudaStream_t stream);
/* The same over two weights of one shape sharing x, with SwiGLU in the epilogue:
 * out (n, rows) bf16 = silu(x · w_gateᵀ) * (x · w_upᵀ) */
cudaError_t tm_cuda_gemv_swiglu(const void *w_gate, const void *w_up, int32_t type, int64_t rows, int64_t cols,
                                const uint16_t *x, int32_t n, uint16_t *out, const tm_cuda_fp8_scales *fp8,
                                cudaStream_t stream);
/* tm_cuda_gemv_swiglu with norm-in (see tm_cuda_gemv_job): x raw, normed with norm_w (cols) and eps */
cudaError_t tm_cuda_gemv_swiglu_nin(const void *w_gate, const void *w_up, int32_t type, int64_t rows, int64_t cols,
                                    const uint16_t *x, int32_t n, uint16_t *out, const float *norm_w, float eps,
                                    cudaStream_t stream);
/* The fp8 GEMV's tensor-core kernel (tm_cuda_gemv_fp8tc.cu) from activations already rounded: out (n, rows) =
 * scale * xq · wᵀ (+ bias), w (rows, cols) and xq (n, cols) e4m3 (xq as tm_cuda_quant_fp8 makes it; scale = weight
 * scale * act_scale); n <= 8, rows % 16 == 0, cols % 64 == 0, w and xq 16-byte aligned. tm_cuda_gemv and the other
 * launchers run the same kernel on fp8 weights from bf16 x (rounded in the kernel) where the shapes fit. */
cudaError_t tm_cuda_gemv_fp8tc(const void *w, int64_t rows, int64_t cols, const uint8_t *xq, int32_t n, float scale,
                               const float *bias, void *out, bool out_f32, cudaStream_t stream);
/* The smallest batch n at which the GEMV launchers run weights of this type on the tensor cores where the shapes
 * fit (tm_cuda_gemv_fp8tc.cu; INT32_MAX: never): fp8 1 (TM_CUDA_GEMV_FP8TC=0: never), bf16 and f16 3
 * (TM_CUDA_GEMV_TC16=k: k, 0: never). Launches with norm-in (tm_cuda_gemv_job.norm_w) and
 * tm_cuda_gemv_add_rmsnorm stay on the CUDA cores at every n, so from this n on their products differ from
 * tm_cuda_gemv's in the order of the sums (the backend runs the unfused ops there). */
int32_t tm_cuda_gemv_tc_min_n(int32_t type);
/* Up to TM_CUDA_GEMV_MAX_JOBS tm_cuda_gemv products sharing type, cols and x in one launch (Q, K and V of a layer):
 * out_j (n, rows_j) = x · w_jᵀ (+ bias_j). jobs is a host array, read during the call (a captured graph keeps
 * its values); jobs with rows 0 are skipped. Every output row is bit-identical to tm_cuda_gemv on that job.
 * (gemv, gemv_group and gemv_swiglu use programmatic dependent launch when TM_CUDA_PDL=1: see tm_cuda_gemv.cu.) */
#define TM_CUDA_GEMV_MAX_JOBS 4
typedef struct tm_cuda_gemv_job {
    const void *w;                /* (rows, cols) weights of `type` */
    int64_t rows;
    const float *bias;            /* (rows) f32 or NULL */
    void *out;                    /* (n, rows) f32 when out_f32 else bf16 */
    float scale, act_scale;       /* fp8_e4m3 weights: the tm_weight's scales (a group shares act_scale) */
    /* norm-in (tm_cuda_gemv_group, tm_cuda_gemv_qkv_rope; f32, f16 and bf16 weights, else cudaErrorNotSupported):
     * when norm_w is set, x holds a raw residual rounded to bf16 (tm_cuda_gemv_add_rmsnorm with norm_w NULL) and
     * the product reads rmsnorm(x) * norm_w instead: out = (x · (norm_w ⊙ w)ᵀ) / rms(x) (+ bias), rms over x's
     * cols, each block summing whole rows of x in one order (so every output row sees the same scale). Every job
     * of a launch carries the same norm_w and norm_eps. */
    const float *norm_w;          /* (cols) f32, or NULL */
    float norm_eps;
    const uint8_t *xq;            /* fp8 weights: x already rounded (tm_cuda_fp8_scales.xq), or NULL; every job of a
                                   * launch carries the same */
} tm_cuda_gemv_job;
cudaError_t tm_cuda_gemv_group(const tm_cuda_gemv_job *jobs, int32_t n_jobs, int32_t type, int64_t cols,
                               const uint16_t *x, int32_t n, bool out_f32, cudaStream_t stream);
/* Mid-size batches of a GGUF-quantized weight (q8_0, q4_0, q4_1, q4_K, q6_K; tm_cuda_qgemm.cu): tm_cuda_gemv's
 * product for TM_CUDA_GEMV_MAX_N < n <= TM_CUDA_QGEMM_MAX_N (any 1 <= n <= it) on the tensor cores, the weights
 * decoded in registers (read once, rounded to bf16 as tm_cuda_dequant_bf16 rounds them, never written back). work: NULL (no
 * split of the columns: slow for matrices of few rows) or tm_cuda_qgemm_work_bytes() bytes of device memory,
 * zeroed once before the first call and then left to the kernel. cudaErrorNotSupported for what it does not take
 * (other types, rows % 16, cols not a multiple of 4 units, unaligned weights or x): dequantize instead. */
#define TM_CUDA_QGEMM_MAX_N 64
size_t tm_cuda_qgemm_work_bytes(void);
/* the largest n at which tm_cuda_qgemm is faster than dequantize + GEMM for this type (0: not taken) */
int32_t tm_cuda_qgemm_max_n(int32_t type);
cudaError_t tm_cuda_qgemm(const void *w, int32_t type, int64_t rows, int64_t cols, const uint16_t *x, int32_t n,
                          const float *bias, void *out, bool out_f32, void *work, cudaStream_t stream);

/* Fused decode epilogues (tm_cuda_gemv.cu). Both return cudaErrorNotSupported, having launched nothing, when a
 * shape, an alignment or the environment rules the fusion out (TM_CUDA_GEMV_V=1 included): the caller then runs
 * the unfused pair. Results equal the unfused pair's up to the order of the norm's sum of squares (the GEMV part
 * is the very kernel of tm_cuda_gemv, the residual add and the rotation round exactly as the unfused kernels). */

/* One launch of tm_cuda_gemv (bf16 output) followed by tm_cuda_add_rmsnorm:
 *   o = bf16(x · wᵀ (+ bias)) ; residual (n, rows) f32 += o ; norm_out (n, rows) bf16 = rmsnorm(residual) * norm_w
 * out: (n, rows) bf16 copy of o, or NULL (not written). Needs rows % 8 == 0 and 16-byte aligned residual, norm_w
 * and norm_out. The norm needs every row of the residual: each thread block adds its rows, then counts itself
 * done on a device counter; the last block to finish computes the norm over whole rows (a fixed-order tree sum,
 * so results are deterministic) and resets the counter. scratch: TM_CUDA_GEMV_NORM_SCRATCH_BYTES of device
 * memory, zeroed once when allocated; every launch leaves it zeroed. One scratch per stream (launches that can
 * run concurrently must not share one). norm_w NULL: no norm; norm_out receives the raw residual after the add,
 * rounded to bf16, for a product with norm-in (tm_cuda_gemv_job.norm_w) to norm; scratch is then unused. */
#define TM_CUDA_GEMV_NORM_SCRATCH_BYTES 256
cudaError_t tm_cuda_gemv_add_rmsnorm(const void *w, int32_t type, int64_t rows, int64_t cols, const uint16_t *x,
                                     int32_t n, const float *bias, uint16_t *out, float *residual,
                                     const float *norm_w, float eps, uint16_t *norm_out, void *scratch,
                                     const tm_cuda_fp8_scales *fp8, cudaStream_t stream);

/* The grouped Q/K/V GEMV (jobs[0] = q, [1] = k, [2] = v, bf16 outputs) with tm_cuda_rope_kv_write in its epilogue:
 * q, k, v = bf16(x · w_jᵀ (+ bias_j)), then q rotated into jobs[0].out, k rotated and v written to their cache
 * slots (rope->k_cache, rope->v_cache, slot_mapping < 0: not written), as tm_cuda_rope_kv_write does on the
 * bf16 q, k, v. jobs[1].out and jobs[2].out may be NULL; when set they receive the unrotated k and v.
 * rope: geometry, inv_freq, positions, slot_mapping and caches; rope->q, k, v are ignored; rope->n_tokens must
 * equal n. Supported: !neox, even head_dim and rope_dim, rows q = n_heads * head_dim, k = v = n_kv_heads *
 * head_dim (a block computes the two rows 2j, 2j + 1 of a head: one RoPE pair), 4-byte aligned outputs and
 * caches; anything else returns cudaErrorNotSupported. */
cudaError_t tm_cuda_gemv_qkv_rope(const tm_cuda_gemv_job *jobs, int32_t type, int64_t cols, const uint16_t *x,
                                  int32_t n, const tm_cuda_rope_args *rope, cudaStream_t stream);

/* ---- attention over the paged KV cache (tm_cuda_attn_decode.cu, tm_cuda_attn_prefill.cu) ---- */

/* One layer's attention for a ragged batch (see tm_batch in backend.h for the meaning of the arrays).
 * Token i of sequence s = seq_index[i] sits at cache index context_len[s] - (query_start[s+1] - i) and
 * attends causally to cache entries 0 .. that index. GQA: query head h reads kv head h / (n_heads / n_kv_heads). */
typedef struct tm_cuda_attn_args {
    int32_t n_heads, n_kv_heads, head_dim, block_size;
    float scale;                  /* 1/sqrt(head_dim) */
    int32_t n_tokens, n_seqs, max_blocks;
    const int32_t *seq_index;     /* (n_tokens) */
    const int32_t *query_start;   /* (n_seqs + 1) */
    const int32_t *context_len;   /* (n_seqs) */
    const int32_t *block_table;   /* (n_seqs, max_blocks) */
    int32_t max_query_len;        /* host-known bounds, for grid sizes (a graph fixes them at capture) */
    int32_t max_context_len;
    const uint16_t *q;            /* (n_tokens, n_heads * head_dim) bf16 */
    const uint16_t *k_cache;      /* this layer's (n_blocks, n_kv_heads, block_size, head_dim) bf16, or e4m3 */
    const uint16_t *v_cache;      /* bytes when kv_fp8 (the pointer is then read as bytes) */
    bool kv_fp8;                  /* the cache holds fp8 e4m3 elements (tm_cuda_fp8.cuh) */
    /* NULL, or (prefill) the keys and values of every sequence as bf16 rows of the step's tokens, when no
     * sequence has a cached prefix (context_len == query length): token i's kv head h at
     * k_rows + i * kv_row_stride + h * head_dim. They hold exactly what the cache holds for those keys (an fp8
     * cache's values widened), so the prefill kernel may read them instead of the cache (v5 over an fp8 cache) */
    const uint16_t *k_rows, *v_rows;
    int32_t kv_row_stride;
    uint16_t *out;                /* (n_tokens, n_heads * head_dim) bf16 */
    uint8_t *out8;                /* NULL, or (decode only) also e4m3(out * out8_inv) of every element, what
                                   * tm_cuda_quant_fp8(out, out8_inv) makes (the fp8 o product's input) */
    float out8_inv;
    void *work;                   /* scratch, work_bytes from the launcher's _work_bytes function */
    size_t work_bytes;
} tm_cuda_attn_args;

/* FlashDecoding: every sequence has exactly one query token (n_tokens == n_seqs). The KV range of each
 * (sequence, kv head) is split across thread blocks when there are too few sequences to fill the GPU, then a
 * second pass merges the partial softmaxes. Splits are sized from max_context_len; splits past a sequence's
 * actual context write an empty partial. */
size_t tm_cuda_attn_decode_work_bytes(int32_t n_seqs, int32_t n_heads, int32_t head_dim, int32_t max_context_len);
cudaError_t tm_cuda_attn_decode(const tm_cuda_attn_args *a, cudaStream_t stream);

/* FlashAttention for prefill chunks and mixed batches: any query lengths, causal, GQA, online softmax, Q/K/V
 * tiles in shared memory, tensor-core (mma) products. */
size_t tm_cuda_attn_prefill_work_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_dim);
cudaError_t tm_cuda_attn_prefill(const tm_cuda_attn_args *a, cudaStream_t stream);

/* ---- one whole decoder layer for one token (tm_cuda_layer.cu) ---- */

/* Batch-1 decode of a Llama-family layer as one persistent kernel: one block per SM, each streaming its share of
 * the layer's weights through a ring of shared-memory stages (bulk async copies issued by a producer warp, ahead
 * of the data dependencies), with four grid-wide barriers between the phases:
 *   A  xb = rmsnorm(x) * attn_norm (every block, from L2); q, k, v = xb . wq, wk, wv (bf16); RoPE on q and k;
 *      k and v written to the cache slot, q to `q`;
 *   B  attention of q over the paged cache (context_len[0] entries, including this token): (kv head, split)
 *      items, their partial softmaxes to `work`; the last item of a kv head merges its splits into `att`;
 *   C  att (every block, from L2); x += bf16(att . wo);
 *   D  xb = rmsnorm(x) * ffn_norm; h = bf16(silu(xb . w_gate) * (xb . w_up));
 *   E  x += bf16(h . w_down).
 * The roundings are those of the separate kernels (tm_cuda_gemv_qkv_rope, tm_cuda_attn_decode, tm_cuda_gemv,
 * tm_cuda_add_rmsnorm, tm_cuda_gemv_swiglu); only summation orders differ. Weights bf16 row-major, norms f32,
 * the cache bf16, head_dim 64 or 128, 4 or 8 query heads per kv head (at most 32 kv heads), llama (adjacent-pair)
 * RoPE, no biases, dim <= 4096, pointers 16-byte aligned; launched with programmatic dependent launch when pdl is set (and
 * TM_CUDA_PDL is not 0). Opt-in in the backend (TM_CUDA_LAYER=1): not yet faster than the separate kernels. */
typedef struct tm_cuda_layer_args {
    int32_t dim, ffn_dim, n_heads, n_kv_heads, head_dim, rope_dim, block_size, max_blocks;
    float eps, attn_scale;
    const uint16_t *wq, *wk, *wv;  /* (n_heads * head_dim, dim), (n_kv_heads * head_dim, dim) x 2 */
    const uint16_t *wo;            /* (dim, n_heads * head_dim) */
    const uint16_t *w_gate, *w_up; /* (ffn_dim, dim) */
    const uint16_t *w_down;        /* (dim, ffn_dim) */
    const float *attn_norm, *ffn_norm; /* (dim) */
    const float *inv_freq;         /* (rope_dim / 2) */
    const int32_t *position;       /* (1) the token's RoPE position */
    const int64_t *slot;           /* (1) the token's cache slot (< 0: none) */
    const int32_t *context_len;    /* (1) cache entries to attend to, this token's included */
    const int32_t *block_table;    /* (max_blocks) */
    uint16_t *k_cache, *v_cache;   /* this layer's (n_blocks, n_kv_heads, block_size, head_dim) bf16 */
    float *x;                      /* (dim) f32 residual, updated in place */
    uint16_t *q, *att, *h;         /* (n_heads * head_dim), (n_heads * head_dim), (ffn_dim) bf16 scratch */
    void *work;                    /* tm_cuda_layer_work_bytes, zeroed once; every launch leaves its counters at 0 */
    bool pdl;
    int32_t parity;                /* 0 or 1, alternating between launches that may overlap (the layer index's low
                                    * bit): the two sets of work counters */
    long long *trace;              /* NULL, or (TM_CUDA_LAYER_TRACE) clock64 stamps of block 0's phases (test beds) */
    long long *btrace;             /* NULL, or (grid, TM_CUDA_LAYER_BTRACE) every block's phase ends as %globaltimer
                                    * ns (comparable across SMs): 0 past the previous kernel, 1 A done, 2 past barrier
                                    * 1, 3 attention done, 4 C done, 5 D done, 6 E done; 7 the block's SM (test beds) */
} tm_cuda_layer_args;
#define TM_CUDA_LAYER_TRACE 24
#define TM_CUDA_LAYER_BTRACE 8
size_t tm_cuda_layer_work_bytes(int32_t n_heads, int32_t head_dim);
/* cudaErrorNotSupported (nothing launched) for a shape or device it does not take */
cudaError_t tm_cuda_layer_decode(const tm_cuda_layer_args *a, cudaStream_t stream);
/* *failed = whether a launch on `work` gave up waiting at a grid barrier (the launch's results are then wrong; it is
 * never expected, since the grid is co-resident). Waits for the stream. The flag stays set. */
cudaError_t tm_cuda_layer_failed(const void *work, bool *failed, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TM_CUDA_KERNELS_H */
