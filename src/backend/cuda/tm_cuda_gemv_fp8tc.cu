/* tm_cuda_gemv_fp8tc.cu -- products of up to 8 rows on the tensor cores: fp8 (W8A8) weights, and bf16 / f16 ones. */
#include "tm_cuda_gemv_fp8tc.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"

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
 * The sums are exact products added in f32 (tb_fp8: within 1e-7 of the double sums). (On sm_90 mma.sync with e4m3
 * operands runs as conversions to f16 and HMMA, in the SASS: only wgmma takes fp8 natively; the products are
 * exact either way.) Under PDL, the source issues the first U chunks' weight loads before the wait: in the SASS
 * (nvdisasm) all 8 of them stay there at 8 warps and 4 at 32 (U = 2) with x rounded in the kernel; in the other
 * modes ptxas moved them past the wait, so there the first round is ordered loads (ld.relaxed.gpu), which it keeps
 * in place. All of them before the wait measured best for fp8 (docs/PERFORMANCE.md, twenty-eighth session: 8 against
 * 3 or 0, unlike v2's bf16 products, which keep 3 of 8); tests/sass checks it.
 *
 * x rounded before (MODE TC_F8Q, twenty-ninth session): at batch <= 8 the norms, the decode attention and the
 * SwiGLU epilogue (out8) leave the e4m3 copy of their output, the same bytes as the rounding here, which cost
 * 1-14% of a product (1B / 8B fp8 batch-1 decode 1444 -> 1495, 335 -> 357 tok/s).
 *
 * 16-bit weights (TC_BF16, TC_F16; twenty-ninth session): the same kernel with mma.m16n8k16 (bf16, or f16 with x
 * converted to f16), a chunk being 32 columns (64 bytes a row), the lane's 8 weights of each row and its 8
 * activations handed over as they lie (k slots 2 t, 2 t + 1, 2 t + 8, 2 t + 9 of mma m hold columns 32 c + 8 t + 4 m
 * + 0..3). The CUDA-core kernel (v2) multiplies every weight by every batch row, so its step grows with n (1B decode
 * 0.82 ms a step at batch 1, 1.62 at 8); this one reads each weight once for all rows (1.10 at 8) but streams less
 * well at n = 1 (0.97 ms), so tm_cuda_gemv_tc_min_n sends 16-bit weights here from batch 3. */

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

/* one mma.m16n8k16 with f32 accumulation over A and B of the 16-bit type T ("bf16" or "f16") */
#define TM_MMA16(T)                                                                                                \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "   \
                 "{%0,%1,%2,%3};"                                                                                  \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                  \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
__device__ __forceinline__ void mma_bf16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    TM_MMA16("bf16");
}
__device__ __forceinline__ void mma_f16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    TM_MMA16("f16");
}
#undef TM_MMA16

/* what the weights and x are (the kernel's MODE): fp8 weights with bf16 x rounded in the kernel, fp8 weights with
 * x rounded before (e4m3), bf16 weights with bf16 x, f16 weights with bf16 x converted to f16 (exact in f16's
 * range; beyond +-65504 clamped to it, as cvt.satfinite would) */
enum { TC_F8 = 0, TC_F8Q = 1, TC_BF16 = 2, TC_F16 = 3 };

/* two bf16 (a word) -> two f16 (a word) */
__device__ __forceinline__ uint32_t f16x2_of_bf16x2(uint32_t w) {
    const float lo = fminf(fmaxf(__uint_as_float(w << 16), -65504.0f), 65504.0f);
    const float hi = fminf(fmaxf(__uint_as_float(w & 0xffff0000u), -65504.0f), 65504.0f);
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
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
    const uint8_t *xq;            /* (n, cols) e4m3 (TC_F8Q) */
    const uint16_t *x;            /* (n, cols) bf16 (TC_F8, TC_BF16, TC_F16) */
    float x_inv;                  /* 1 / act_scale */
    uint8_t *out8;                /* SwiGLU: NULL, or (n, rows_0) e4m3(out * x_inv) as well */
    int cols, n;
    bool out_f32, pdl;
    tm_gemv_rope rope;
};

/* (row i, batch b) of a warp's m16n8 accumulator: lane (i % 8) * 4 + b / 2, register (i >= 8 ? 2 : 0) + b % 2 */
__device__ __forceinline__ int acc_lane(int i, int b) { return (i & 7) * 4 + (b >> 1); }
__device__ __forceinline__ int acc_reg(int i, int b) { return (i >= 8 ? 2 : 0) + (b & 1); }

/* a lane's activations of batch row g in chunk ch (xr, xb: the lane's first): fp8 weights, the 16 at columns
 * 64 ch + 16 t .. + 15 as e4m3 bytes; 16-bit weights, the 8 at columns 32 ch + 8 t .. + 7 (bf16, or f16 for f16
 * weights) */
template <int MODE>
__device__ __forceinline__ uint4 x_chunk(const tc_args &a, const uint8_t *xr, const uint16_t *xb, int64_t ch,
                                         bool has_x) {
    if (!has_x) return make_uint4(0u, 0u, 0u, 0u);
    if constexpr (MODE == TC_F8Q) {
        return __ldcg(reinterpret_cast<const uint4 *>(xr + (ch << 6)));
    } else if constexpr (MODE == TC_BF16) {
        return __ldcg(reinterpret_cast<const uint4 *>(xb + (ch << 5)));
    } else if constexpr (MODE == TC_F16) {
        const uint4 v = __ldcg(reinterpret_cast<const uint4 *>(xb + (ch << 5)));
        return make_uint4(f16x2_of_bf16x2(v.x), f16x2_of_bf16x2(v.y), f16x2_of_bf16x2(v.z), f16x2_of_bf16x2(v.w));
    } else {
        const int64_t off = ch << 6;
        const uint4 lo = __ldcg(reinterpret_cast<const uint4 *>(xb + off));
        const uint4 hi = __ldcg(reinterpret_cast<const uint4 *>(xb + off + 8));
        const uint2 l = tm_fp8x8_of_bf16(lo, a.x_inv), h = tm_fp8x8_of_bf16(hi, a.x_inv);
        return make_uint4(l.x, l.y, h.x, h.y);
    }
}

template <int W, int EPI, int MODE>
__global__ void __launch_bounds__(W * 32) gemv_fp8tc_v1(const tc_args a) {
    constexpr bool W16 = MODE == TC_BF16 || MODE == TC_F16; /* 16-bit weights: 32 columns a chunk */
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
    const int64_t r0 = (int64_t)(bid - b0) * 16, cols = a.cols, rb = W16 ? 2 * cols : cols; /* rb: row bytes */
    const uint8_t *wr[NT][2];
    wr[0][0] = wj + (r0 + g) * rb + 16 * t;
    wr[0][1] = wr[0][0] + 8 * rb;
    if constexpr (SW) {
        wr[1][0] = a.w_up + (r0 + g) * rb + 16 * t;
        wr[1][1] = wr[1][0] + 8 * rb;
    }
    const bool has_x = g < a.n;
    const uint8_t *xr = a.xq + (int64_t)(has_x ? g : 0) * cols + 16 * t;
    const uint16_t *xb = a.x + (int64_t)(has_x ? g : 0) * cols + (W16 ? 8 : 16) * t;
    const int nch = (int)(rb >> 6); /* chunks of 64 weight bytes a row */
    /* one chunk's products: the lane's 16 bytes of rows g and g + 8 against its x, as they lie (the header) */
    auto mma2 = [](float *acc, const uint4 &wa, const uint4 &wb, const uint4 &xv) {
        if constexpr (MODE == TC_BF16) {
            mma_bf16(acc, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
            mma_bf16(acc, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
        } else if constexpr (MODE == TC_F16) {
            mma_f16(acc, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
            mma_f16(acc, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
        } else {
            mma_e4m3(acc, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
            mma_e4m3(acc, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
        }
    };
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
                if (MODE != TC_F8 && wait) { /* else ptxas issues them after the wait (nvdisasm) */
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
        for (int u = 0; u < U; u++) xv[u] = x_chunk<MODE>(a, xr, xb, ch + u * W, has_x);
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int s = 0; s < NT; s++) mma2(c[s], wa[u][s], wb[u][s], xv[u]);
        }
    }
    if (wait) tm_pdl_wait_trigger();
    for (; ch < nch; ch += W) {
        const int64_t off = (int64_t)ch << 6;
        const uint4 xv = x_chunk<MODE>(a, xr, xb, ch, has_x);
#pragma unroll
        for (int s = 0; s < NT; s++) mma2(c[s], ld_w(wr[s][0] + off), ld_w(wr[s][1] + off), xv);
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

template <int EPI, int MODE> cudaError_t launch(const tc_args &a, int blocks, cudaStream_t s) {
    const dim3 grid((unsigned)blocks);
    switch (warps_for(a.cols)) {
    case 8: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<8, EPI, MODE>, grid, dim3(256), 0, s, a);
    case 32: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<32, EPI, MODE>, grid, dim3(1024), 0, s, a);
    default: return cudaErrorInvalidValue;
    }
}

template <int MODE> cudaError_t launch_epi(int epi, const tc_args &a, int blocks, cudaStream_t s) {
    switch (epi) {
    case TM_FP8TC_PLAIN: return launch<TM_FP8TC_PLAIN, MODE>(a, blocks, s);
    case TM_FP8TC_SWIGLU: return launch<TM_FP8TC_SWIGLU, MODE>(a, blocks, s);
    case TM_FP8TC_ROPE: return launch<TM_FP8TC_ROPE, MODE>(a, blocks, s);
    default: return cudaErrorInvalidValue;
    }
}

/* tc_args over the non-empty jobs: blocks of 16 rows; false when there are more than INT_MAX blocks */
bool fill_jobs(tc_args &a, const tm_cuda_gemv_job *jobs, int32_t n_jobs, bool w16, int *blocks_out) {
    int nj = 0;
    int64_t blocks = 0;
    for (int32_t j = 0; j < n_jobs; j++) {
        if (jobs[j].rows == 0) continue;
        a.w[nj] = (const uint8_t *)jobs[j].w;
        a.bias[nj] = jobs[j].bias;
        a.out[nj] = jobs[j].out;
        a.rows[nj] = (int)jobs[j].rows;
        a.blk0[nj] = (int)blocks;
        a.sc[nj] = w16 ? 1.0f : jobs[j].scale * jobs[j].act_scale;
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

/* the smallest batch 16-bit (bf16, f16) weights take the tensor cores at: TM_CUDA_GEMV_TC16=k (0: never), else 3
 * (twenty-ninth session, batch-n decode steps against the CUDA cores: 1B / 8B 10% / 17% slower at n = 1, 9% / 17%
 * at 2, 7% / 5% faster at 3, 8% / 5% at 4, 32-48% / 37-60% at 8) */
static int32_t w16_min_n() {
    const char *e = getenv("TM_CUDA_GEMV_TC16");
    if (!e) return 3;
    const int v = atoi(e);
    return v <= 0 ? INT32_MAX : v;
}

static bool is_w16(int32_t type) { return type == TM_DT_BF16 || type == TM_DT_F16; }

extern "C" int32_t tm_cuda_gemv_tc_min_n(int32_t type) {
    if (is_w16(type)) return w16_min_n();
    return type == TM_DT_FP8_E4M3 && !tm_env_is_0("TM_CUDA_GEMV_FP8TC") ? 1 : INT32_MAX;
}

bool tm_fp8tc_ok(int32_t type, const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, int64_t cols,
                 const uint16_t *x, int32_t n) {
    if (n < tm_cuda_gemv_tc_min_n(type)) return false; /* also every type but fp8, bf16 and f16 */
    const bool w16 = is_w16(type);
    if (cols <= 0 || cols % (w16 ? 32 : 64) || cols > INT32_MAX / 2 || !tm_aligned16(x) ||
        (w_up && !tm_aligned16(w_up)))
        return false;
    for (int32_t j = 0; j < n_jobs; j++) {
        if (jobs[j].rows == 0) continue;
        if (jobs[j].rows % 16 || !tm_aligned16(jobs[j].w) || (!w16 && jobs[j].act_scale != jobs[0].act_scale) ||
            jobs[j].norm_w)
            return false;
    }
    return true;
}

cudaError_t tm_fp8tc_run(int epi, int32_t type, const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up,
                         float up_scale, int64_t cols, const uint16_t *x, int32_t n, bool out_f32,
                         const tm_gemv_rope *rope, uint8_t *out8, cudaStream_t stream) {
    const bool w16 = is_w16(type);
    if ((out8 && (epi != TM_FP8TC_SWIGLU || w16)) || (epi == TM_FP8TC_ROPE && !rope)) return cudaErrorInvalidValue;
    tc_args a = {};
    int blocks = 0;
    if (!fill_jobs(a, jobs, n_jobs, w16, &blocks)) return cudaErrorInvalidValue;
    if (blocks == 0) return cudaSuccess;
    a.w_up = (const uint8_t *)w_up;
    a.sc_up = w16 ? 1.0f : up_scale * jobs[0].act_scale;
    a.x = x;
    /* fp8: NULL or unaligned: x rounded in the kernel */
    a.xq = !w16 && jobs[0].xq && tm_aligned16(jobs[0].xq) ? jobs[0].xq : NULL;
    a.x_inv = w16 ? 0.0f : 1.0f / jobs[0].act_scale;
    a.out8 = out8;
    a.cols = (int)cols;
    a.n = n;
    a.out_f32 = out_f32;
    a.pdl = tm_pdl_gemv_on();
    if (rope) a.rope = *rope;
    if (type == TM_DT_BF16) return launch_epi<TC_BF16>(epi, a, blocks, stream);
    if (type == TM_DT_F16) return launch_epi<TC_F16>(epi, a, blocks, stream);
    return a.xq ? launch_epi<TC_F8Q>(epi, a, blocks, stream) : launch_epi<TC_F8>(epi, a, blocks, stream);
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
    fill_jobs(a, &job, 1, false, &blocks);
    a.xq = job.xq;
    a.cols = (int)cols;
    a.n = n;
    a.out_f32 = out_f32;
    a.pdl = tm_pdl_gemv_on();
    return launch<TM_FP8TC_PLAIN, TC_F8Q>(a, blocks, stream);
}
