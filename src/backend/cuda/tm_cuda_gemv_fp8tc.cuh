/* tm_cuda_gemv_fp8tc.cuh -- the tensor-core GEMV (fp8, bf16 and f16 weights) as tm_cuda_gemv.cu's launchers call
 * it, and the SwiGLU and q|k|v RoPE epilogues both GEMV kernels share (CUDA C++ only). */
#ifndef TM_CUDA_GEMV_FP8TC_CUH
#define TM_CUDA_GEMV_FP8TC_CUH

#include "tm_cuda_fp8.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* what the kernel does with its sums */
enum { TM_FP8TC_PLAIN = 0, TM_FP8TC_SWIGLU = 1, TM_FP8TC_ROPE = 2 };

/* The SwiGLU epilogue's value, silu(g) * u, as both GEMV kernels compute it */
__device__ __forceinline__ float tm_gemv_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* The q|k|v RoPE epilogue's arguments (tm_cuda_gemv_qkv_rope: jobs 0, 1, 2 = q, k, v) */
struct tm_gemv_rope {
    const float *inv_freq;        /* (rope_dim / 2) */
    const int32_t *positions;     /* (n) */
    const int64_t *slot_mapping;  /* (n) */
    uint16_t *k_cache, *v_cache;  /* (n_blocks, n_kv_heads, block_size, head_dim) bf16, or e4m3 bytes */
    bool kv_fp8;
    int head_dim, rope_dim, block_size, n_kv_heads;
};

/* One RoPE pair of token b, rows r, r + 1 (r even, within a head: head_dim even) of job jid, whose sums are already
 * rounded to bf16 as tm_cuda_gemv stores them (o0, o1): rotated in f32 with the (cos, sin) of tm_cuda_rope.cu's f32
 * angle (double sincospi) as tm_cuda_rope_kv_write rotates the stored values, then 4 bytes stored: q (jid 0) to out,
 * k (rotated) and v to the cache slot of token b (none when the slot is < 0; an fp8 cache gets the bf16 pair rounded
 * once more, to e4m3), the unrotated k and v to out when it is set. out: (n, rows) bf16. */
__device__ __forceinline__ void tm_gemv_rope_store(const tm_gemv_rope &rp, int jid, int b, int r, int rows,
                                                   uint16_t o0, uint16_t o1, void *out) {
    const uint32_t plain = (uint32_t)o0 | ((uint32_t)o1 << 16);
    const int hd = rp.head_dim, h = r / hd, d0 = r - h * hd;
    uint32_t rot = plain;
    if (jid < 2 && d0 < rp.rope_dim) {
        const float th = __fmul_rn((float)rp.positions[b], rp.inv_freq[d0 >> 1]);
        double sn, cs;
        sincospi((double)th * 0.318309886183790671537767526745, &sn, &cs);
        const float x0 = __uint_as_float((uint32_t)o0 << 16), x1 = __uint_as_float((uint32_t)o1 << 16);
        const float c = (float)cs, s = (float)sn;
        const __nv_bfloat162 v = __floats2bfloat162_rn(x0 * c - x1 * s, x0 * s + x1 * c);
        rot = (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
    }
    const int64_t idx = (int64_t)b * rows + r; /* even: a 4-byte store */
    if (jid == 0) {
        *reinterpret_cast<uint32_t *>((uint16_t *)out + idx) = rot;
        return;
    }
    if (out) *reinterpret_cast<uint32_t *>((uint16_t *)out + idx) = plain;
    const int64_t slot = rp.slot_mapping[b];
    if (slot < 0) return;
    const int64_t blk = slot / rp.block_size, off = slot - blk * rp.block_size;
    const int64_t at = ((blk * rp.n_kv_heads + h) * rp.block_size + off) * hd + d0;
    uint16_t *cache = jid == 1 ? rp.k_cache : rp.v_cache;
    if (rp.kv_fp8)
        *reinterpret_cast<uint16_t *>(reinterpret_cast<uint8_t *>(cache) + at) =
            tm_fp8x2_of(__uint_as_float((rot & 0xffffu) << 16), __uint_as_float(rot & 0xffff0000u));
    else
        *reinterpret_cast<uint32_t *>(cache + at) = rot;
}

/* Whether the tensor-core path takes these jobs of weight type `type` at batch n: n >= tm_cuda_gemv_tc_min_n(type)
 * (fp8: one act_scale for all jobs, cols % 64 == 0; bf16, f16: cols % 32 == 0); every non-empty job has a multiple
 * of 16 rows, no norm-in and 16-byte aligned weights (and w_up for SwiGLU), x 16-byte aligned. The caller has
 * checked everything else (gemv_run, fused_run). */
bool tm_fp8tc_ok(int32_t type, const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, int64_t cols,
                 const uint16_t *x, int32_t n);

/* The products of jobs (non-empty ones; SwiGLU: one job, the gate, with w_up / up_scale) from bf16 x (n, cols);
 * fp8 weights: each block rounding its slice of x to e4m3 as tm_cuda_quant_fp8 does, or reading jobs[0].xq (x
 * rounded before) when it is set and 16-byte aligned. rope: for TM_FP8TC_ROPE. out8: SwiGLU only, NULL or the
 * e4m3 copy of out (tm_cuda_fp8_scales.out8). */
cudaError_t tm_fp8tc_run(int epi, int32_t type, const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up,
                         float up_scale, int64_t cols, const uint16_t *x, int32_t n, bool out_f32,
                         const tm_gemv_rope *rope, uint8_t *out8, cudaStream_t stream);

#endif /* TM_CUDA_GEMV_FP8TC_CUH */
