/* tm_cuda_gemv_fp8tc.cuh -- the tensor-core fp8 GEMV as tm_cuda_gemv.cu's launchers call it (C++ only). */
#ifndef TM_CUDA_GEMV_FP8TC_CUH
#define TM_CUDA_GEMV_FP8TC_CUH

#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* what the kernel does with its sums */
enum { TM_FP8TC_PLAIN = 0, TM_FP8TC_SWIGLU = 1, TM_FP8TC_ROPE = 2 };

/* TM_FP8TC_ROPE: jobs q, k, v; as v2_args' EPI_ROPE fields (tm_cuda_gemv.cu) */
struct tm_fp8tc_rope {
    const float *inv_freq;        /* (rope_dim / 2) */
    const int32_t *positions;     /* (n) */
    const int64_t *slot_mapping;  /* (n) */
    uint16_t *k_cache, *v_cache;  /* (n_blocks, n_kv_heads, block_size, head_dim) bf16, or e4m3 bytes */
    bool kv_fp8;
    int head_dim, rope_dim, block_size, n_kv_heads;
};

/* Whether the tensor-core path takes these fp8 jobs: TM_CUDA_GEMV_FP8TC is not "0", every non-empty job has a
 * multiple of 16 rows and 16-byte aligned weights (and w_up for SwiGLU), cols % 64 == 0, x 16-byte aligned, one
 * act_scale for all jobs. The caller has checked everything else (gemv_run, fused_run). */
bool tm_fp8tc_ok(const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, int64_t cols, const uint16_t *x);

/* The products of jobs (non-empty ones; SwiGLU: one job, the gate, with w_up / up_scale) from bf16 x (n, cols),
 * each block rounding its slice of x to e4m3 as tm_cuda_quant_fp8 does. rope: for TM_FP8TC_ROPE. */
cudaError_t tm_fp8tc_run(int epi, const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, float up_scale,
                         int64_t cols, const uint16_t *x, int32_t n, bool out_f32, const tm_fp8tc_rope *rope,
                         cudaStream_t stream);

#endif /* TM_CUDA_GEMV_FP8TC_CUH */
