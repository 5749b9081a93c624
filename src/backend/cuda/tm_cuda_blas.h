/* tm_cuda_blas.h -- dense bf16 and fp8 GEMMs through cuBLASLt: one handle, one workspace, cached algorithm choices. */
#ifndef TM_CUDA_BLAS_H
#define TM_CUDA_BLAS_H

#include <cuda_runtime_api.h>

#include "core/tm_core.h"

typedef struct tm_cuda_blas tm_cuda_blas;

tm_status tm_cuda_blas_create(size_t workspace_bytes, tm_cuda_blas **out, tm_error *err);
void tm_cuda_blas_free(tm_cuda_blas *b);

/* out (n, m) = x (n, k) bf16 · w (m, k) bf16 ᵀ (+ bias (m) f32 when non-NULL), f32 accumulation; out is f32 when
 * out_f32 else bf16. All row-major, device memory; enqueued on stream (graph-capturable). */
tm_status tm_cuda_blas_gemm(tm_cuda_blas *b, const uint16_t *x, const uint16_t *w, const float *bias, void *out,
                            bool out_f32, int64_t n, int64_t m, int64_t k, cudaStream_t stream, tm_error *err);

/* out (n, m) = alpha * xq (n, k) e4m3 · w (m, k) e4m3 ᵀ, f32 accumulation, out bf16 (f32 when out_f32): the W8A8
 * product of backend.h (xq = e4m3(x / act_scale), alpha = scale * act_scale). k and m multiples of 16, operands
 * 16-byte aligned (TM_ERR_UNSUPPORTED otherwise); no bias. */
tm_status tm_cuda_blas_gemm_fp8(tm_cuda_blas *b, const uint8_t *xq, const uint8_t *w, float alpha, void *out,
                                bool out_f32, int64_t n, int64_t m, int64_t k, cudaStream_t stream, tm_error *err);

/* fp8 GEMMs from now on with (on) or without cuBLASLt's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the
 * tensor cores' accumulator is not promoted to full f32 every few k-steps; faster, less precise). Off at creation. */
void tm_cuda_blas_set_fp8_fast_accum(tm_cuda_blas *b, bool on);

/* GEMMs planned from now on target sms SMs (cuBLASLt's CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: the heuristic picks,
 * and sizes, the kernel for that many SMs, for a GEMM that shares the device with work on a concurrent stream);
 * 0 (at creation): the device's count, the attribute left unset. Plans made before keep their target. */
void tm_cuda_blas_set_sm_target(tm_cuda_blas *b, int32_t sms);

/* GEMMs planned from now on take the heuristic's candidate of rank i (0, at creation: its first choice; clamped to
 * 0 .. TM_CUDA_BLAS_MAX_ALGOS - 1). A shape with no candidate of that rank fails with TM_ERR_UNSUPPORTED. For
 * sweeps (tb_fp8's TB_FP8_ALGOS) and TM_CUDA_BLAS_ALGO; plans made before keep theirs. */
#define TM_CUDA_BLAS_MAX_ALGOS 16
void tm_cuda_blas_set_algo_index(tm_cuda_blas *b, int32_t i);

#endif /* TM_CUDA_BLAS_H */
