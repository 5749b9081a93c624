/* tm_cuda_gemv_fp8tc.cu -- fp8 (W8A8) products of up to 8 rows on the tensor cores. */
#include "tm_cuda_gemv_fp8tc.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <limits.h>

/* out (n, rows) = scale * act_scale * e4m3(x / act_scale) . w^T (+ bias), w (rows, cols) e4m3, n <= 8: the W8A8
 * product of backend.h at batch sizes the GEMV path takes, with tm_cuda_gemv.cu's epilogues (plain, SwiGLU, q|k|v
 * with RoPE and the cache write).
 *
 * Why: tm_cuda_gemv.cu's fp8 kernel (v2) widens every weight and rounds every activation on the CUDA cores, ~3
 * instructions a weight byte, so at batch 1 its products moved 1.3-2.3 TB/s where the bf16 ones move 2.9-3.9 (1B
 * fp8 batch-1 decode 1212 tok/s, 43% of its floor, no faster than bf16 with half the bytes), and at n = 8 it is 3x
 * slower again. One mma.m16n8k32 (e4m3 x e4m3, f32 accumulation) takes 512 weight bytes: 16 rows by 32 columns,
 * with the batch rows as the 8 columns of B (columns past n are zero). Measured (docs/PERFORMANCE.md, twenty-eighth
 * session): batch-1 decode 1B 1212 -> 1427, 8B 267 -> 332 tok/s; batch 8 1B 3678 -> 7648, 8B 775 -> 1855.
 *
 * v1: a block of W warps owns 16 weight rows (SwiGLU: 16 rows of gate and the same 16 of up) of one job; the
 * columns go in chunks of 64, chunk c to warp c % W (W = 8, 32 for rows of 8192 columns and more, where the grid
 * is short). In a chunk, lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of row g and of row g + 8 at columns
 * 64 c + 16 t .. + 15, and for batch row g (g < n) the 16 activations there: e4m3 bytes (XQ), or 16 bf16 it rounds
 * to e4m3(x * inv) as tm_cuda_quant_fp8 does. A dot product does not care about the order of its terms, so the
 * bytes go to two mma as they lie: for mma m (0, 1), the k slots 4 t .. 4 t + 3 of A (rows g, g + 8) and of B
 * (column g) hold columns 64 c + 16 t + 8 m + 0..3, the slots 16 + 4 t .. + 3 columns + 4..7; A and B agree, so
 * each product pairs a weight with its activation. U chunks are loaded at once (4; SwiGLU, two tiles: 2; halved at
 * 32 warps, whose threads have 64 registers). The warps' accumulators meet in shared memory; thread i + 16 b takes
 * (row i, batch row b) (ROPE: thread p + 8 b the pair of rows 2 p, 2 p + 1, through tm_gemv_rope_store as v2 does).
 * The sums are exact products added in f32 (tb_fp8: within 1e-7 of the double sums). Under PDL, the source issues
 * the first U chunks' weight loads before the wait: in the SASS (nvdisasm, this session's nvcc) all 8 of them stay
 * there at 8 warps and 4 at 32 (U = 2), for every epilogue with x rounded in the kernel; with x rounded before
 * (tm_cuda_gemv_fp8tc) ptxas moves them past the wait. All of them before the wait measured best (docs/PERFORMANCE.md,
 * twenty-eighth session: 8 against 3 or 0, unlike v2's bf16 products, which keep 3 of 8); tests/sass checks it. */

namespace {

constexpr int kMaxJobs = TM_CUDA_GEMV_MAX_JOBS;

__device__ __forceinline__ uint4 ld_w(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* ld_w that ptxas keeps where the source puts it against griddepcontrol.wait (ld.relaxed.gpu: it moves .nc loads
 * past the wait freely) */
__device__ __forceinline__ uint4 ld_w_ordered(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void mma_e4m3(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

struct tc_args {
    const uint8_t *w[kMaxJobs];   /* (rows_j, cols) e4m3; SwiGLU: the gate */
    const float *bias[kMaxJobs];  /* (rows_j) or NULL */
    void *out[kMaxJobs];          /* (n, rows_j) f32 or bf16 (ROPE: k and v may be NULL) */
    int rows[kMaxJobs];
    int blk0[kMaxJobs];           /* first block of job j; unused slots INT_MAX */
    float sc[kMaxJobs];           /* scale_j * act_scale */
    const uint8_t *w_up;          /* SwiGLU: (rows_0, cols) */
    float sc_up;
    const uint8_t *xq;            /* (n, cols) e4m3 (XQ) */
    const uint16_t *x;            /* (n, cols) bf16 (!XQ) */
    float x_inv;                  /* 1 / act_scale */
    uint8_t *out8;                /* SwiGLU: NULL, or (n, rows_0) e4m3(out * x_inv) as well */
    int cols, n;
    bool out_f32, pdl;
    tm_gemv_rope rope;
};

/* (row i, batch b) of a warp's m16n8 accumulator: lane (i % 8) * 4 + b / 2, register (i >= 8 ? 2 : 0) + b % 2 */
__device__ __forceinline__ int acc_lane(int i, int b) { return (i & 7) * 4 + (b >> 1); }
__device__ __forceinline__ int acc_reg(int i, int b) { return (i >= 8 ? 2 : 0) + (b & 1); }

/* the 16 activations of batch row g at columns off .. off + 15 as e4m3 bytes */
template <bool XQ>
__device__ __forceinline__ uint4 x_chunk(const tc_args &a, const uint8_t *xr, const uint16_t *xb, int64_t off,
                                         bool has_x) {
    if (!has_x) return make_uint4(0u, 0u, 0u, 0u);
    if constexpr (XQ) {
        return __ldcg(reinterpret_cast<const uint4 *>(xr + off));
    } else {
        const uint4 lo = __ldcg(reinterpret_cast<const uint4 *>(xb + off));
        const uint4 hi = __ldcg(reinterpret_cast<const uint4 *>(xb + off + 8));
        const uint2 l = tm_fp8x8_of_bf16(lo, a.x_inv), h = tm_fp8x8_of_bf16(hi, a.x_inv);
        return make_uint4(l.x, l.y, h.x, h.y);
    }
}

template <int W, int EPI, bool XQ>
__global__ void __launch_bounds__(W * 32) gemv_fp8tc_v1(const tc_args a) {
    constexpr bool SW = EPI == TM_FP8TC_SWIGLU;
    constexpr int NT = SW ? 2 : 1; /* weight tiles: gate and up */
    constexpr int U = (SW ? 2 : 4) / (W >= 32 ? 2 : 1); /* 1024-thread blocks: 64 registers */
    __shared__ float red[W][32][4 * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int bid = (int)blockIdx.x;

    /* this block's job (constant indices: the arguments stay in parameter space) */
    const uint8_t *wj = a.w[0];
    const float *bias = a.bias[0];
    void *out = a.out[0];
    int rows = a.rows[0], b0 = 0, jid = 0;
    float sc = a.sc[0];
#pragma unroll
    for (int k = 1; k < (SW ? 1 : kMaxJobs); k++) {
        if (bid >= a.blk0[k]) {
            wj = a.w[k];
            bias = a.bias[k];
            out = a.out[k];
            rows = a.rows[k];
            b0 = a.blk0[k];
            sc = a.sc[k];
            jid = k;
        }
    }
    const int64_t r0 = (int64_t)(bid - b0) * 16, cols = a.cols;
    const uint8_t *wr[NT][2];
    wr[0][0] = wj + (r0 + g) * cols + 16 * t;
    wr[0][1] = wr[0][0] + 8 * cols;
    if constexpr (SW) {
        wr[1][0] = a.w_up + (r0 + g) * cols + 16 * t;
        wr[1][1] = wr[1][0] + 8 * cols;
    }
    const bool has_x = g < a.n;
    const uint8_t *xr = a.xq + (int64_t)(has_x ? g : 0) * cols + 16 * t;
    const uint16_t *xb = a.x + (int64_t)(has_x ? g : 0) * cols + 16 * t;
    const int nch = (int)(cols >> 6);
    float c[NT][4];
#pragma unroll
    for (int s = 0; s < NT; s++) c[s][0] = c[s][1] = c[s][2] = c[s][3] = 0.0f;
    bool wait = a.pdl;
    int ch = warp;
    for (; ch + (U - 1) * W < nch; ch += U * W) {
        uint4 wa[U][NT], wb[U][NT], xv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t off = (int64_t)(ch + u * W) << 6;
#pragma unroll
            for (int s = 0; s < NT; s++) {
                if (XQ && wait) { /* else ptxas issues them after the wait (nvdisasm) */
                    wa[u][s] = ld_w_ordered(wr[s][0] + off);
                    wb[u][s] = ld_w_ordered(wr[s][1] + off);
                } else {
                    wa[u][s] = ld_w(wr[s][0] + off);
                    wb[u][s] = ld_w(wr[s][1] + off);
                }
            }
        }
        if (wait) {
            tm_pdl_wait_trigger();
            wait = false;
        }
#pragma unroll
        for (int u = 0; u < U; u++) xv[u] = x_chunk<XQ>(a, xr, xb, (int64_t)(ch + u * W) << 6, has_x);
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int s = 0; s < NT; s++) {
                mma_e4m3(c[s], wa[u][s].x, wb[u][s].x, wa[u][s].y, wb[u][s].y, xv[u].x, xv[u].y);
                mma_e4m3(c[s], wa[u][s].z, wb[u][s].z, wa[u][s].w, wb[u][s].w, xv[u].z, xv[u].w);
            }
        }
    }
    if (wait) tm_pdl_wait_trigger();
    for (; ch < nch; ch += W) {
        const int64_t off = (int64_t)ch << 6;
        const uint4 xv = x_chunk<XQ>(a, xr, xb, off, has_x);
#pragma unroll
        for (int s = 0; s < NT; s++) {
            const uint4 wa = ld_w(wr[s][0] + off), wb = ld_w(wr[s][1] + off);
            mma_e4m3(c[s], wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
            mma_e4m3(c[s], wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
        }
    }
#pragma unroll
    for (int s = 0; s < NT; s++) {
#pragma unroll
        for (int k = 0; k < 4; k++) red[warp][lane][4 * s + k] = c[s][k];
    }
    __syncthreads();
    /* the sum over the warps of (row i, batch b) of tile s */
    auto sum_of = [&](int i, int b, int s) -> float {
        const int ln = acc_lane(i, b), k = 4 * s + acc_reg(i, b);
        float v = 0.0f;
#pragma unroll 8
        for (int w = 0; w < W; w++) v += red[w][ln][k];
        return v;
    };
    if constexpr (EPI == TM_FP8TC_ROPE) {
        /* thread p + 8 b: rows r0 + 2 p, r0 + 2 p + 1 (one RoPE pair: head_dim even) of token b */
        const int p = threadIdx.x & 7, b = threadIdx.x >> 3;
        if (b >= a.n) return;
        const int64_t ra = r0 + 2 * p;
        const float s0 = sum_of(2 * p, b, 0) * sc, s1 = sum_of(2 * p + 1, b, 0) * sc;
        const uint16_t o0 = bf16_bits(s0 + (bias ? bias[ra] : 0.0f));
        const uint16_t o1 = bf16_bits(s1 + (bias ? bias[ra + 1] : 0.0f));
        tm_gemv_rope_store(a.rope, jid, b, (int)ra, rows, o0, o1, out);
        return;
    }
    const int i = threadIdx.x & 15, b = threadIdx.x >> 4;
    if (b >= a.n) return;
    const int64_t r = r0 + i, idx = (int64_t)b * rows + r;
    if constexpr (SW) {
        const float gs = sum_of(i, b, 0) * sc, us = sum_of(i, b, 1) * a.sc_up;
        const uint16_t h = bf16_bits(tm_gemv_silu_mul(gs, us));
        ((uint16_t *)out)[idx] = h;
        if (a.out8) a.out8[idx] = tm_fp8_of(__uint_as_float((uint32_t)h << 16) * a.x_inv); /* tm_cuda_quant_fp8's */
    } else {
        const float s = sum_of(i, b, 0) * sc + (bias ? bias[r] : 0.0f);
        if (a.out_f32)
            ((float *)out)[idx] = s;
        else
            ((uint16_t *)out)[idx] = bf16_bits(s);
    }
}

/* TM_CUDA_FP8TC_WARPS forces 8 or 32 warps a block (A/B); else 32 for rows of >= 8192 columns */
int warps_for(int64_t cols) {
    if (const char *e = getenv("TM_CUDA_FP8TC_WARPS")) return atoi(e);
    return cols >= 8192 ? 32 : 8;
}

template <int EPI, bool XQ> cudaError_t launch(const tc_args &a, int blocks, cudaStream_t s) {
    const dim3 grid((unsigned)blocks);
    switch (warps_for(a.cols)) {
    case 8: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<8, EPI, XQ>, grid, dim3(256), 0, s, a);
    case 32: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<32, EPI, XQ>, grid, dim3(1024), 0, s, a);
    default: return cudaErrorInvalidValue;
    }
}

/* tc_args over the non-empty jobs: blocks of 16 rows; false when there are more than INT_MAX blocks */
bool fill_jobs(tc_args &a, const tm_cuda_gemv_job *jobs, int32_t n_jobs, int *blocks_out) {
    int nj = 0;
    int64_t blocks = 0;
    for (int32_t j = 0; j < n_jobs; j++) {
        if (jobs[j].rows == 0) continue;
        a.w[nj] = (const uint8_t *)jobs[j].w;
        a.bias[nj] = jobs[j].bias;
        a.out[nj] = jobs[j].out;
        a.rows[nj] = (int)jobs[j].rows;
        a.blk0[nj] = (int)blocks;
        a.sc[nj] = jobs[j].scale * jobs[j].act_scale;
        blocks += jobs[j].rows / 16;
        nj++;
    }
    for (int j = nj; j < kMaxJobs; j++) {
        a.w[j] = a.w[0];
        a.bias[j] = NULL;
        a.out[j] = a.out[0];
        a.rows[j] = a.rows[0];
        a.blk0[j] = INT_MAX;
        a.sc[j] = a.sc[0];
    }
    *blocks_out = (int)blocks;
    return blocks <= INT_MAX;
}

} // namespace

bool tm_fp8tc_ok(const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, int64_t cols, const uint16_t *x) {
    if (tm_env_is_0("TM_CUDA_GEMV_FP8TC") || cols <= 0 || cols % 64 || cols > INT32_MAX || !tm_aligned16(x) ||
        (w_up && !tm_aligned16(w_up)))
        return false;
    for (int32_t j = 0; j < n_jobs; j++) {
        if (jobs[j].rows == 0) continue;
        if (jobs[j].rows % 16 || !tm_aligned16(jobs[j].w) || jobs[j].act_scale != jobs[0].act_scale ||
            jobs[j].norm_w)
            return false;
    }
    return true;
}

cudaError_t tm_fp8tc_run(int epi, const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, float up_scale,
                         int64_t cols, const uint16_t *x, int32_t n, bool out_f32, const tm_gemv_rope *rope,
                         uint8_t *out8, cudaStream_t stream) {
    if (out8 && epi != TM_FP8TC_SWIGLU) return cudaErrorInvalidValue;
    tc_args a = {};
    int blocks = 0;
    if (!fill_jobs(a, jobs, n_jobs, &blocks)) return cudaErrorInvalidValue;
    if (blocks == 0) return cudaSuccess;
    a.w_up = (const uint8_t *)w_up;
    a.sc_up = up_scale * jobs[0].act_scale;
    a.x = x;
    a.xq = jobs[0].xq && tm_aligned16(jobs[0].xq) ? jobs[0].xq : NULL; /* NULL or unaligned: x rounded in the kernel */
    a.x_inv = 1.0f / jobs[0].act_scale;
    a.out8 = out8;
    a.cols = (int)cols;
    a.n = n;
    a.out_f32 = out_f32;
    a.pdl = tm_pdl_gemv_on();
    if (rope) a.rope = *rope;
    const bool xq = a.xq != NULL;
    switch (epi) {
    case TM_FP8TC_PLAIN: return xq ? launch<TM_FP8TC_PLAIN, true>(a, blocks, stream)
                                   : launch<TM_FP8TC_PLAIN, false>(a, blocks, stream);
    case TM_FP8TC_SWIGLU: return xq ? launch<TM_FP8TC_SWIGLU, true>(a, blocks, stream)
                                    : launch<TM_FP8TC_SWIGLU, false>(a, blocks, stream);
    case TM_FP8TC_ROPE:
        if (!rope) return cudaErrorInvalidValue;
        return xq ? launch<TM_FP8TC_ROPE, true>(a, blocks, stream) : launch<TM_FP8TC_ROPE, false>(a, blocks, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t tm_cuda_gemv_fp8tc(const void *w, int64_t rows, int64_t cols, const uint8_t *xq, int32_t n,
                                          float scale, const float *bias, void *out, bool out_f32,
                                          cudaStream_t stream) {
    if (rows <= 0 || rows % 16 || rows > INT32_MAX || cols <= 0 || cols % 64 || cols > INT32_MAX || n < 1 ||
        n > 8 || !w || !xq || !tm_aligned16(w) || !tm_aligned16(xq))
        return cudaErrorInvalidValue;
    tc_args a = {};
    const tm_cuda_gemv_job job = {w, rows, bias, out, scale, 1.0f, NULL, 0.0f, xq};
    int blocks = 0;
    fill_jobs(a, &job, 1, &blocks);
    a.xq = job.xq;
    a.cols = (int)cols;
    a.n = n;
    a.out_f32 = out_f32;
    a.pdl = tm_pdl_gemv_on();
    return launch<TM_FP8TC_PLAIN, true>(a, blocks, stream);
}
