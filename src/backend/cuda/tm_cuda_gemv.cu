/* tm_cuda_gemv.cu -- small-batch matrix-vector products with the weight dequantization fused into the read. */
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_gemv_fp8tc.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"
#include "backend/cuda/tm_cuda_dequant.cuh"

#include <limits.h>
#include <stdlib.h>

#include <type_traits>

/* out (n, rows) = x (n, cols) bf16 . w^T for n <= 8: batch-1 decode, bound by the weight read.
 *
 * v2 (fast): a thread block of W = 1, 2 or 4 warps owns R output rows (R = 2; for SwiGLU one row of gate and the
 * same row of up) and splits the columns: lane `l` of warp `w` takes the units u = 32w + l, + 32W, ... of every
 * row (a unit is 8 to 32 elements, see tm_cuda_dequant.cuh). Each step issues the global loads of U units of all
 * of its rows at once (U = 4 for bf16/f16/q4_0/q4_1, 2 for the wider units: several 16-byte loads in flight per
 * lane), then, per run of 8 elements, loads the 8 matching bf16 of every batch row of x (one 16-byte load each,
 * from L2: ld.global.cg, since under PDL the kernel before writes x while this one starts; the weights bypass L1
 * as each byte is read by one load) and accumulates in f32 for all rows and all n at once; x is loaded once for
 * the R rows. The GGUF-quantized types stage x in shared memory instead (below). Quantized types form sum(q * x) over
 * the 8 elements with q the exact small integers, then add scale * that (+ min * sum(x)); q4_1 and q4_K take q as
 * the float 1 + q / 128 (one byte_perm) and recover sum(q * x) = 128 (sum((1 + q / 128) x) - sum(x)). The column
 * split ends with a shuffle reduction per warp and a shared-memory one across warps. W is picked so that every
 * lane has at least one full step (U units, at least 2) per row when the row is long enough: W = 2 for 2048 bf16
 * columns (4 units of 8 per lane), 4 for 4096 and more; the GGUF-quantized types at least 2 (quant_min_warps). Grid:
 * ceil(rows / R) blocks. At n = 1 the kernel has 64 registers (__launch_bounds__), so 16 blocks of 2 warps or 8
 * of 4 warps are resident per SM, each thread with 8 loads of 16 B in flight: ~128 KB in flight per SM, about
 * twice the ~50 KB that the copy bandwidth needs at ~1.5 us of loaded DRAM latency (with 4 warps and 2 units per
 * lane, as in the first version, 2048-column rows had only 64 KB in flight per SM; TM_CUDA_GEMV_WIDE=1 brings
 * that rule back for comparison).
 *
 * x staged (template XS; q8_0, q4_0, q4_1, q4_K, q6_K when n * cols * 2 <= kXsMaxBytes; TM_CUDA_GEMV_XS=0: off):
 * a quantized unit covers 16-32 elements, i.e. 2-4 runs of x, and ptxas places each run's L2 load between the
 * previous run's products, so a step paid 4-8 L2 round trips one after the other (ncu, twenty-fourth session: the
 * 1B q4_K products at 11-45% occupancy with 1-warp blocks, stalled on the long scoreboard, DRAM 7-13% busy). The
 * block instead issues the first step's weight loads, waits (PDL), copies all of x (n, cols) into dynamic shared
 * memory in one round of 16-byte loads, synchronizes, and reads x from there. Batch-1 decode of the dummy 1B:
 * q4_K 601 -> 1154 tok/s, q4_1 876 -> 1244, q6_K 799 -> 1139, q4_0 882 -> 1286, q8_0 1171 -> 1208 (the same
 * greedy text). The dense types keep the L2 loads: staged, bf16 batch-1 decode measured 18-22% slower (their unit
 * is one run, and their first loads go out before the wait). The sums are the same either way (same x values,
 * same order). The staged path is its own kernels (template XS), so that each kernel carries one x path: with
 * both behind a run-time flag the q4_0 / q4_1 kernels spilled, and q4_K / q4_0 decode 2% slower.
 *
 * Groups (tm_cuda_gemv_group): one v2 launch computes up to 4 products that share type, cols and x (Q, K, V).
 * The jobs travel by value in the kernel's parameter struct; job j owns the blocks blk0[j] .. blk0[j+1]-1
 * (ceil(rows_j / R) blocks, so no block straddles two jobs) and a block picks its job with compares against
 * blk0 (selects over constant indices: the arguments stay in parameter space, no local memory). A plain
 * tm_cuda_gemv is a group of one job and runs the very same kernel, and every per-row quantity (threads per
 * block, the lane -> unit map, the accumulation order) depends only on type, cols and the row itself, so a row's
 * result is bit-identical whether it is computed alone, in a group, or for any n (batch row b of an n-row call
 * equals the 1-row call on x[b]); tb_gemv checks all three.
 *
 * Fused epilogues (tm_cuda_gemv_add_rmsnorm, tm_cuda_gemv_qkv_rope): the same v2 kernel and launch shape (so the
 * GEMV sums are bit-identical to tm_cuda_gemv's), only the epilogue differs (template parameter EPI):
 *  - EPI_NORM: the R * N epilogue threads round their sums to bf16 (as tm_cuda_gemv stores them), add them into
 *    the residual (as tm_cuda_add_rmsnorm adds bf16 x) and fence; thread 0 then counts the block done with an
 *    atomicAdd on a device counter; the block that sees gridDim - 1 (the last) reads the whole (n, rows) residual
 *    back through L2 twice (sum of squares per batch row in a fixed order: per thread, warp butterfly, across
 *    warps; then residual * scale * norm_w in 16-byte vectors) and resets the counter. Deterministic: unlike
 *    per-block atomicAdd partial sums, which would make the norm depend on the blocks' finishing order. The cost
 *    is a serial tail on one block: two L2 passes over n * rows * 4 bytes (8 KB at 1B, n = 1).
 *  - EPI_ROPE: jobs q, k, v; thread b < N of a block holds rows r0, r0 + 1 of token b, i.e. the RoPE pair (2j,
 *    2j + 1) of a head (r0 even, head_dim even); it rounds both to bf16, rotates them in f32 with the (cos, sin)
 *    of tm_cuda_rope.cu's f32 angle (double sincospi), and stores 4 bytes: q to its output, k (rotated) and v to
 *    the cache slot of token b (none when slot < 0), the unrotated k and v to their outputs when those are set.
 *
 * Norm-in (template NIN; tm_cuda_gemv_job.norm_w, tm_cuda_gemv_swiglu_nin; f32/f16/bf16 weights): x is a raw
 * residual rounded to bf16 (EPI_NORM with a.norm_w NULL writes it: residual += o, norm_out = bf16(residual), no
 * counter, no last block) and the product reads rmsnorm(x) * nin_w instead. unit_dot multiplies each x element by
 * the norm weight (read through L1: every block of an SM reads the same cols) and adds its square to the lane's
 * ss[b]; ss is reduced with the sums, and the epilogue scales the sums by 1 / sqrt(ss / cols + eps) before the
 * bias, SwiGLU or RoPE. Every block covers whole rows of x with the same lane -> unit map and order, so all see
 * the same scale. Quantized and fp8 weights return cudaErrorNotSupported (fp8 rounds x before the scale is known).
 *
 * fp8 weights: where every job has a multiple of 16 rows and cols is a multiple of 64 (all the model shapes), the
 * plain, SwiGLU and q|k|v + RoPE launches run tm_cuda_gemv_fp8tc.cu's tensor-core kernel instead of v2 (one
 * mma.m16n8k32 e4m3 per 512 weight bytes; TM_CUDA_GEMV_FP8TC=0: v2); the same W8A8 sums in another order. bf16
 * and f16 weights go there too from batch 3 (tm_cuda_gemv_tc_min_n; cols a multiple of 32). Launches with
 * norm-in and the add+RMSNorm epilogue (TM_CUDA_FUSE_NORM=1) stay on v2.
 *
 * v1 (simple, TM_CUDA_GEMV_V=1, also used when the alignment needs of v2 are not met): one block of 128 threads
 * per output row, each thread striding over the row's elements through tmq::deq_elem, a block reduction. A group
 * falls back to one launch per job (each job exactly as tm_cuda_gemv would run it).
 *
 * v2 is launched with programmatic dependent launch by default (TM_CUDA_PDL=0: not; tm_cuda_launch.cuh), i.e.
 * cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization: the kernel may
 * start while the previous kernel on the stream is still running. Each lane issues its first step's weight loads,
 * waits for the previous kernel (griddepcontrol.wait: returns once the preceding grid has completed and its memory
 * is visible) before it reads x or bias or writes out, then allows the next PDL kernel to launch
 * (griddepcontrol.launch_dependents). A dependent grid is launched once every block of the preceding grid has
 * triggered or exited, so the GEMV's first blocks sit resident at their wait while the kernel before finishes.
 * How many loads go before the wait is a measured choice (docs/PERFORMANCE.md, twenty-third session):
 *  - the weights are read with ld.global.nc, and ptxas hoists the wait above such loads (it may reorder them
 *    freely): until the twenty-third session every load of a GEMV under PDL was issued after the wait, in the
 *    SASS, although the source put the first step's before it;
 *  - all of the first step's loads kept before the wait (8 a lane, ld.relaxed.gpu, which ptxas does not move
 *    past it): 1B batch 1 -1.6%, 8B -4.4% (up to ~17 MB over the resident blocks, asked for while the kernel
 *    before drains, most likely delays its last loads);
 *  - a few of them (2 to 4 a lane, up to ~4-8 MB): faster, as if enough to cover the DRAM latency after the wait
 *    without slowing the kernel before; batch-1 decode against none, same calls: 1 and 2 +1.8-2.1% (1B) and
 *    +1.8-1.9% (8B), 3 +2.9% and +1.9%, 4 +2.5-2.9% and +1.5%: kLoadsBeforeWait = 3;
 *  - by epilogue (twenty-sixth session): all 8 in the o product, whose blocks sit resident under the attention
 *    with the DRAM idle, +0.1% at 1B and -2.5% at 8B; all 8 in q|k|v too, -0.8% and -5%: one count for all;
 *  - an L2 prefetch of the rows before the wait (the first version): 13-15% slower (each line requested twice,
 *    and wasted for every block past the first wave).
 * The trigger's place was measured too: after the wait (here) beats at exit (-1.0%) and before the wait (-0.7%).
 * v1 is never launched with PDL. */

namespace {

constexpr int kThreadsV1 = 128;
constexpr int kMaxWarps = 4;
constexpr int kMaxJobs = TM_CUDA_GEMV_MAX_JOBS;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void store_out(void *out, bool out_f32, int64_t idx, float v) {
    if (out_f32)
        ((float *)out)[idx] = v;
    else
        ((uint16_t *)out)[idx] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* ---- v1 --------------------------------------------------------------------------------------------------------- */

/* One block per output row r: acc[b] = sum_j w[r, j] * x[b, j] (and the up row for SwiGLU). */
template <bool SWIGLU>
__global__ void __launch_bounds__(kThreadsV1)
    gemv_kernel_v1(const uint8_t *__restrict__ wa, const uint8_t *__restrict__ wb, int32_t type, int64_t rows,
                   int64_t cols, int64_t row_bytes, const uint16_t *__restrict__ x, int n,
                   const float *__restrict__ bias, void *__restrict__ out, bool out_f32, float x_inv, float sc_a,
                   float sc_b) {
    /* fp8 weights (x_inv != 0): x rounded to e4m3 after scaling by x_inv, the sums scaled by sc_a (sc_b: up) */
    const int64_t r = blockIdx.x;
    const uint8_t *ra = wa + r * row_bytes;
    const uint8_t *rb = SWIGLU ? wb + r * row_bytes : ra;
    float acc[2][TM_CUDA_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < TM_CUDA_GEMV_MAX_N; b++) acc[0][b] = acc[1][b] = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float va = tmq::deq_elem(type, ra, j);
        const float vb = SWIGLU ? tmq::deq_elem(type, rb, j) : 0.0f;
#pragma unroll
        for (int b = 0; b < TM_CUDA_GEMV_MAX_N; b++) {
            if (b < n) {
                float xv = tmq::bf16f(x[b * cols + j]);
                if (x_inv != 0.0f) xv = tm_fp8_to_f32(tm_fp8_of(xv * x_inv));
                acc[0][b] = fmaf(va, xv, acc[0][b]);
                if (SWIGLU) acc[1][b] = fmaf(vb, xv, acc[1][b]);
            }
        }
    }
    __shared__ float red[kThreadsV1 / 32][2][TM_CUDA_GEMV_MAX_N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int b = 0; b < TM_CUDA_GEMV_MAX_N; b++) {
        const float s0 = warp_sum(acc[0][b]);
        const float s1 = SWIGLU ? warp_sum(acc[1][b]) : 0.0f;
        if (lane == 0) {
            red[warp][0][b] = s0;
            red[warp][1][b] = s1;
        }
    }
    __syncthreads();
    if (threadIdx.x < n) {
        const int b = threadIdx.x;
        float s0 = 0.0f, s1 = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            s0 += red[w][0][b];
            s1 += red[w][1][b];
        }
        if (x_inv != 0.0f) {
            s0 *= sc_a;
            s1 *= sc_b;
        }
        if (SWIGLU)
            store_out(out, false, b * rows + r, tm_gemv_silu_mul(s0, s1));
        else
            store_out(out, out_f32, b * rows + r, s0 + (bias ? bias[r] : 0.0f));
    }
}

/* ---- v2 --------------------------------------------------------------------------------------------------------- */

template <class T, int N> __host__ __device__ constexpr int unroll_for() {
    return N <= 2 ? T::UNROLL : N <= 4 ? (T::UNROLL > 1 ? T::UNROLL / 2 : 1) : 1;
}

/* the dense types, whose products can read a norm's input raw (norm-in: x * norm_w, the sum of squares beside) */
template <class T> __host__ __device__ constexpr bool nin_ok() { return !T::HAS_SCALE && !tmq::act_fp8<T>::value; }

/* q4_1 and q4_K give the GEMV their runs as 1 + q / 128 (T::qrun1p, tm_cuda_dequant.cuh): one byte_perm an
 * element instead of a byte_perm and a subtraction, and sum(q x) = 128 (p - sum(x)) with the sum(x) their min
 * needs anyway (1B batch-1 decode q4_K +3.5%, q4_1 +2.0%, 8B q4_K +4.0%; twenty-fifth session) */
template <class T, class = void> struct has_qrun1p : std::false_type {};
template <class T> struct has_qrun1p<T, std::void_t<decltype(&T::qrun1p)>> : std::true_type {};

/* acc[i][b] += dot(unit u of weight row i, x[b]) for the NR rows of the block, all N batch rows. NIN (norm-in): x
 * is a raw residual; each element is multiplied by nw (the norm's weight) before the product, and its square is
 * added to ss[b] (the norm's scale is applied to the sums after the whole row) */
template <class T, int N, int NR, bool NIN = false, bool XS = false>
__device__ __forceinline__ void unit_dot(const typename T::Raw (&raw)[NR], int u, const uint16_t *x,
                                         int64_t cols, float (&acc)[NR][N], float x_inv, const float *nw = nullptr,
                                         float *ss = nullptr) {
    float s[NR][T::RUNS], m[NR][T::RUNS];
    if constexpr (T::HAS_SCALE) {
#pragma unroll
        for (int i = 0; i < NR; i++) T::scales(raw[i], s[i], m[i]);
    }
#pragma unroll
    for (int k = 0; k < T::RUNS; k++) {
        const int off = T::xoff(u, k);
        uint4 xv[N];
#pragma unroll
        for (int b = 0; b < N; b++) /* XS: x staged in shared memory; else L2 loads, see gemv_kernel_v2 */
            xv[b] = XS ? *(const uint4 *)(x + b * cols + off) : __ldcg((const uint4 *)(x + b * cols + off));
        constexpr bool Q1P = has_qrun1p<T>::value;
        float q[NR][8];
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if constexpr (Q1P)
                T::qrun1p(raw[i], k, q[i]);
            else
                T::qrun(raw[i], k, q[i]);
        }
        if constexpr (T::HAS_SCALE) {
            float p[NR][N], xs[N];
#pragma unroll
            for (int b = 0; b < N; b++) {
                xs[b] = 0.0f;
#pragma unroll
                for (int i = 0; i < NR; i++) p[i][b] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int b = 0; b < N; b++) {
                    const float xf = tmq::bf16_at(xv[b], j);
                    if constexpr (T::HAS_MIN || Q1P) xs[b] += xf;
#pragma unroll
                    for (int i = 0; i < NR; i++) p[i][b] = fmaf(q[i][j], xf, p[i][b]);
                }
            }
#pragma unroll
            for (int i = 0; i < NR; i++) {
#pragma unroll
                for (int b = 0; b < N; b++) {
                    if constexpr (Q1P) { /* p = sum((1 + q / 128) x), so sum(q x) = 128 p - 128 xs, rounded once */
                        const float qx = fmaf(-128.0f, xs[b], 128.0f * p[i][b]);
                        acc[i][b] = fmaf(s[i][k], qx, acc[i][b]);
                    } else {
                        acc[i][b] = fmaf(s[i][k], p[i][b], acc[i][b]);
                    }
                    if constexpr (T::HAS_MIN) acc[i][b] = fmaf(m[i][k], xs[b], acc[i][b]);
                }
            }
        } else if constexpr (tmq::act_fp8<T>::value) { /* W8A8: x / act_scale rounded to e4m3, once per run */
            float xq[N][8];
#pragma unroll
            for (int b = 0; b < N; b++) tm_fp8_round8(xv[b], x_inv, xq[b]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int b = 0; b < N; b++) {
#pragma unroll
                    for (int i = 0; i < NR; i++) acc[i][b] = fmaf(q[i][j], xq[b][j], acc[i][b]);
                }
            }
        } else if constexpr (NIN) {
            static_assert(nin_ok<T>(), "norm-in is for the dense types");
            const float4 wa = __ldg(reinterpret_cast<const float4 *>(nw + off));
            const float4 wb = __ldg(reinterpret_cast<const float4 *>(nw + off + 4));
            const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int b = 0; b < N; b++) {
                    const float xr = tmq::bf16_at(xv[b], j);
                    ss[b] = fmaf(xr, xr, ss[b]);
                    const float xf = xr * wv[j];
#pragma unroll
                    for (int i = 0; i < NR; i++) acc[i][b] = fmaf(q[i][j], xf, acc[i][b]);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int b = 0; b < N; b++) {
                    const float xf = tmq::bf16_at(xv[b], j);
#pragma unroll
                    for (int i = 0; i < NR; i++) acc[i][b] = fmaf(q[i][j], xf, acc[i][b]);
                }
            }
        }
    }
}

/* of a lane's first-step weight loads, how many are issued before the PDL wait (the header) */
constexpr int kLoadsBeforeWait = 3;

/* T::load_ordered where the type has one (the dense types), else T::load */
template <class T, class = void> struct has_load_ordered : std::false_type {};
template <class T> struct has_load_ordered<T, std::void_t<decltype(&T::load_ordered)>> : std::true_type {};

/* K units per lane at once: units u, u + stride, ..., all < nu (the caller checks). pdl_wait: wait for the
 * previous kernel after the weight loads are issued and before x is read. FIRST (a block's first step): the first
 * kLoadsBeforeWait loads by T::load_ordered, which ptxas keeps before the wait */
template <class T, int N, int NR, int K, bool NIN = false, bool FIRST = false, bool XS = false>
__device__ __forceinline__ void gemv_step(const uint8_t *const (&wr)[NR], int u, int stride,
                                          const uint16_t *x, int64_t cols, float (&acc)[NR][N], float x_inv,
                                          bool pdl_wait = false, const float *nw = nullptr, float *ss = nullptr) {
    typename T::Raw raw[K][NR];
#pragma unroll
    for (int k = 0; k < K; k++) {
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if constexpr (FIRST && has_load_ordered<T>::value) {
                if (k * NR + i < kLoadsBeforeWait)
                    T::load_ordered(wr[i], u + k * stride, raw[k][i]);
                else
                    T::load(wr[i], u + k * stride, raw[k][i]);
            } else {
                T::load(wr[i], u + k * stride, raw[k][i]);
            }
        }
    }
    if (pdl_wait) tm_pdl_wait_trigger();
#pragma unroll
    for (int k = 0; k < K; k++) unit_dot<T, N, NR, NIN, XS>(raw[k], u + k * stride, x, cols, acc, x_inv, nw, ss);
}

/* A lane's steps after its first (and the PDL wait when it had no full first step), then the shorter tail steps;
 * the staged path's. The unstaged path in gemv_kernel_v2 spells the same loop out: through this function its
 * kernels compile differently (171 of 522 in the SASS) and ran slower (8B bf16 batch 1 247.0 -> 243.9 tok/s,
 * twenty-sixth session) */
template <class T, int N, int NR, int U, bool NIN, bool XS>
__device__ __forceinline__ void gemv_rest(const uint8_t *const (&wr)[NR], int u, int stride, int nu, bool wait,
                                          const uint16_t *x, int64_t cols, float (&acc)[NR][N], float x_inv,
                                          const float *nw, float *ss) {
    for (; u + (U - 1) * stride < nu; u += U * stride)
        gemv_step<T, N, NR, U, NIN, false, XS>(wr, u, stride, x, cols, acc, x_inv, false, nw, ss);
    if (wait) tm_pdl_wait_trigger();
    if constexpr (U >= 4) {
        if (u + stride < nu) {
            gemv_step<T, N, NR, 2, NIN, false, XS>(wr, u, stride, x, cols, acc, x_inv, false, nw, ss);
            u += 2 * stride;
        }
    }
    if constexpr (U >= 2) {
        if (u < nu) gemv_step<T, N, NR, 1, NIN, false, XS>(wr, u, stride, x, cols, acc, x_inv, false, nw, ss);
    }
}

/* x staged in shared memory (template XS): the largest n * cols * 2 bytes staged (dynamic shared memory beside the
 * kernel's static arrays, within the 48 KB a launch gets without opting in) */
constexpr int kXsMaxBytes = 40 * 1024;

/* resident 4-warp blocks per SM asked of the register allocator: 8 (<= 64 registers) at n = 1, i.e. 32 warps per
 * SM (16 blocks when they have 2 warps); fewer for larger n, whose accumulators need more registers */
__host__ __device__ constexpr int min_blocks_for(int n) { return n <= 1 ? 8 : n <= 2 ? 6 : n <= 4 ? 4 : 2; }

/* v2's launch arguments, by value in kernel parameter space: up to kMaxJobs products sharing type, cols and x.
 * Block b belongs to the last job j with blk0[j] <= b (unused slots: blk0 = INT_MAX). */
struct v2_args {
    const uint8_t *w[kMaxJobs];   /* (rows_j, row_bytes) weights of job j; SwiGLU: the gate */
    const float *bias[kMaxJobs];  /* (rows_j) f32 or NULL */
    void *out[kMaxJobs];          /* (n, rows_j) f32 or bf16 */
    int rows[kMaxJobs];
    int blk0[kMaxJobs];           /* first block of job j */
    const uint8_t *w_up;          /* SwiGLU only: (rows_0, row_bytes) up weights of job 0 */
    const uint16_t *x;            /* (n, cols) bf16 */
    int64_t row_bytes;
    int cols;
    bool out_f32, pdl;
    /* fp8 weights (W8A8, backend.h): x is rounded to e4m3 after scaling by x_inv = 1 / act_scale; the sums of job j
     * are scaled by sc[j] = scale_j * act_scale (sc_up: the SwiGLU up weights') */
    float x_inv, sc_up;
    float sc[kMaxJobs];
    /* norm-in (template NIN): x is a raw residual, the product reads rmsnorm(x) * nin_w */
    const float *nin_w;           /* (cols) f32 */
    float nin_eps;
    /* EPI_NORM (one job; out[0] may be NULL) */
    float *residual;              /* (n, rows) f32 */
    const float *norm_w;          /* (rows) f32, or NULL: norm_out gets the raw residual, rounded to bf16 */
    uint16_t *norm_out;           /* (n, rows) bf16 */
    unsigned int *counter;        /* blocks done; 0 between launches */
    float eps;
    /* EPI_ROPE (jobs 0, 1, 2 = q, k, v; out[1], out[2] may be NULL) */
    tm_gemv_rope rope;
};

/* what the v2 kernel does with its sums (the GEMV part is the same for all) */
enum { EPI_PLAIN = 0, EPI_SWIGLU = 1, EPI_NORM = 2, EPI_ROPE = 3 };

__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(h.x) | ((uint32_t)__bfloat16_as_ushort(h.y) << 16);
}

/* EPI_NORM, after the block has added its rows into the residual: count the block done; the last block of the
 * grid computes norm_out = rmsnorm(residual) * norm_w over the whole (n, rows) residual, then resets the counter.
 * The last block reads the other blocks' residual values through L2 (ld.global.cg), after the writers' and its
 * own fences. Sum of squares: per thread over its chunks of 8 in order, then the warp butterfly, then across
 * warps in order: a fixed order, so the result does not depend on which block finished last. */
template <int N> __device__ __forceinline__ void norm_finish(const v2_args &a, int rows) {
    __shared__ unsigned int is_last;
    __shared__ float red2[kMaxWarps][N];
    __syncthreads(); /* every writer of this block has fenced its residual stores */
    if (threadIdx.x == 0) is_last = atomicAdd(a.counter, 1u) == gridDim.x - 1u ? 1u : 0u;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const int tid = (int)threadIdx.x, nthreads = (int)blockDim.x, nch = rows >> 3;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
    const float4 *res4 = reinterpret_cast<const float4 *>(a.residual);
    float ss[N];
#pragma unroll
    for (int b = 0; b < N; b++) ss[b] = 0.0f;
#pragma unroll 2
    for (int c = tid; c < nch; c += nthreads) {
#pragma unroll
        for (int b = 0; b < N; b++) {
            const float4 *p = res4 + 2 * ((int64_t)b * nch + c);
            const float4 u = __ldcg(p), v = __ldcg(p + 1);
            ss[b] += u.x * u.x;
            ss[b] += u.y * u.y;
            ss[b] += u.z * u.z;
            ss[b] += u.w * u.w;
            ss[b] += v.x * v.x;
            ss[b] += v.y * v.y;
            ss[b] += v.z * v.z;
            ss[b] += v.w * v.w;
        }
    }
#pragma unroll
    for (int b = 0; b < N; b++) {
        const float t = warp_sum(ss[b]);
        if (lane == 0) red2[warp][b] = t;
    }
    __syncthreads();
    float scale[N];
#pragma unroll
    for (int b = 0; b < N; b++) {
        float t = 0.0f;
        for (int w = 0; w < nwarps; w++) t += red2[w][b];
        scale[b] = 1.0f / sqrtf(t / (float)rows + a.eps);
    }
    const float4 *w4 = reinterpret_cast<const float4 *>(a.norm_w);
    uint4 *o4 = reinterpret_cast<uint4 *>(a.norm_out);
#pragma unroll 2
    for (int c = tid; c < nch; c += nthreads) {
        const float4 wa = __ldg(w4 + 2 * c), wb = __ldg(w4 + 2 * c + 1);
#pragma unroll
        for (int b = 0; b < N; b++) {
            const float4 *p = res4 + 2 * ((int64_t)b * nch + c);
            const float4 u = __ldcg(p), v = __ldcg(p + 1);
            const float r = scale[b];
            uint4 o;
            o.x = pack_bf16x2(u.x * r * wa.x, u.y * r * wa.y);
            o.y = pack_bf16x2(u.z * r * wa.z, u.w * r * wa.w);
            o.z = pack_bf16x2(v.x * r * wb.x, v.y * r * wb.y);
            o.w = pack_bf16x2(v.z * r * wb.z, v.w * r * wb.w);
            o4[(int64_t)b * nch + c] = o;
        }
    }
    if (tid == 0) atomicExch(a.counter, 0u); /* every other block has counted itself: ready for the next launch */
}

template <class T, int N, int EPI, bool NIN, bool XS>
__global__ void __launch_bounds__(kMaxWarps * 32, min_blocks_for(N)) gemv_kernel_v2(const v2_args a) {
    constexpr bool SWIGLU = EPI == EPI_SWIGLU;
    constexpr int R = SWIGLU ? 1 : 2;    /* output rows per block */
    constexpr int NR = SWIGLU ? 2 : R;   /* weight rows per block */
    constexpr int U = unroll_for<T, N>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int bid = (int)blockIdx.x;

    /* this block's job (constant indices only: no dynamic indexing of the parameter struct) */
    const uint8_t *wj = a.w[0];
    const float *bias = a.bias[0];
    void *out = a.out[0];
    int rows = a.rows[0], b0 = 0, jid = 0;
    float sc = 0.0f;
    if constexpr (tmq::act_fp8<T>::value) sc = a.sc[0];
    (void)sc;
    /* SwiGLU and norm launches are one job (gemv_run, fused_run): no selection, which also keeps the batch-1
     * gate/up kernel within its 64 registers without a spill (+0.4% 1B, +1.2% 8B batch-1 decode) */
#pragma unroll
    for (int k = 1; k < (SWIGLU || EPI == EPI_NORM ? 1 : kMaxJobs); k++) {
        if (bid >= a.blk0[k]) {
            if constexpr (tmq::act_fp8<T>::value) sc = a.sc[k];
            wj = a.w[k];
            bias = a.bias[k];
            out = a.out[k];
            rows = a.rows[k];
            b0 = a.blk0[k];
            jid = k;
        }
    }
    const int r0 = (bid - b0) * R;
    const int cols = a.cols;
    const int64_t row_bytes = a.row_bytes;
    const uint16_t *x = a.x; /* not __restrict__ nor __ldg: under PDL the previous kernel writes x while this one
                              * runs (read-only, non-coherent loads may be hoisted above the wait); L2 loads */

    const uint8_t *wr[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int r = SWIGLU ? r0 : min(r0 + i, rows - 1); /* a clamped row is computed and not written */
        wr[i] = (SWIGLU && i == 1 ? a.w_up : wj) + (int64_t)r * row_bytes;
    }
    float acc[NR][N];
#pragma unroll
    for (int i = 0; i < NR; i++) {
#pragma unroll
        for (int b = 0; b < N; b++) acc[i][b] = 0.0f;
    }
    const int nu = T::units(cols), stride = nwarps * 32;
    int u = warp * 32 + lane;
    /* under PDL the first step issues kLoadsBeforeWait of its loads before the wait (the header) */
    bool wait = a.pdl;
    float ss[N]; /* NIN: this lane's share of each batch row's sum of squares */
#pragma unroll
    for (int b = 0; b < N; b++) ss[b] = 0.0f;
    if constexpr (XS) {
        /* the GGUF-quantized types: a unit of 16-32 elements takes its x as 2-4 runs, whose L2 loads ptxas places
         * one after the other between the products (each an exposed L2 round trip; ncu: long-scoreboard stalls,
         * DRAM 7-13% busy); staged, the whole x is one round of loads issued at once, then read from shared
         * memory. The first step's weight loads are issued before the wait and the staging. */
        static_assert(T::HAS_SCALE, "x is staged for the GGUF-quantized types only");
        extern __shared__ uint4 xs_smem[];
        typename T::Raw raw0[U][NR];
        const bool full = u + (U - 1) * stride < nu;
        if (full) {
#pragma unroll
            for (int k = 0; k < U; k++) {
#pragma unroll
                for (int i = 0; i < NR; i++) T::load(wr[i], u + k * stride, raw0[k][i]);
            }
        }
        if (wait) tm_pdl_wait_trigger();
        const int nv = N * cols / 8;
        for (int v = (int)threadIdx.x; v < nv; v += (int)blockDim.x)
            xs_smem[v] = __ldcg(reinterpret_cast<const uint4 *>(x) + v);
        __syncthreads();
        const uint16_t *xsh = reinterpret_cast<const uint16_t *>(xs_smem);
        if (full) {
#pragma unroll
            for (int k = 0; k < U; k++)
                unit_dot<T, N, NR, NIN, true>(raw0[k], u + k * stride, xsh, cols, acc, a.x_inv, a.nin_w, ss);
            u += U * stride;
        }
        gemv_rest<T, N, NR, U, NIN, true>(wr, u, stride, nu, false, xsh, cols, acc, a.x_inv, a.nin_w, ss);
    } else {
        if (u + (U - 1) * stride < nu) { /* the first step: some of its loads before the wait (gemv_step) */
            gemv_step<T, N, NR, U, NIN, true>(wr, u, stride, x, cols, acc, a.x_inv, wait, a.nin_w, ss);
            wait = false;
            u += U * stride;
        }
        for (; u + (U - 1) * stride < nu; u += U * stride)
            gemv_step<T, N, NR, U, NIN>(wr, u, stride, x, cols, acc, a.x_inv, false, a.nin_w, ss);
        if (wait) tm_pdl_wait_trigger();
        if constexpr (U >= 4) {
            if (u + stride < nu) {
                gemv_step<T, N, NR, 2, NIN>(wr, u, stride, x, cols, acc, a.x_inv, false, a.nin_w, ss);
                u += 2 * stride;
            }
        }
        if constexpr (U >= 2) {
            if (u < nu) gemv_step<T, N, NR, 1, NIN>(wr, u, stride, x, cols, acc, a.x_inv, false, a.nin_w, ss);
        }
    }
    if constexpr (tmq::act_fp8<T>::value) { /* W8A8: the products of e4m3 values, times both scales */
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const float si = SWIGLU && i == 1 ? a.sc_up : sc;
#pragma unroll
            for (int b = 0; b < N; b++) acc[i][b] *= si;
        }
    }

    __shared__ float red[kMaxWarps][NR][N];
    __shared__ float red_ss[NIN ? kMaxWarps : 1][N];
#pragma unroll
    for (int i = 0; i < NR; i++) {
#pragma unroll
        for (int b = 0; b < N; b++) {
            const float v = warp_sum(acc[i][b]);
            if (lane == 0) red[warp][i][b] = v;
        }
    }
    if constexpr (NIN) {
#pragma unroll
        for (int b = 0; b < N; b++) {
            const float v = warp_sum(ss[b]);
            if (lane == 0) red_ss[warp][b] = v;
        }
    }
    __syncthreads();
    /* NIN: batch row b's 1 / rms (the same in every block: every block sums whole rows in the same order) */
    auto nin_scale = [&](int b) -> float {
        if constexpr (NIN) {
            float t = 0.0f;
            for (int w = 0; w < nwarps; w++) t += red_ss[w][b];
            return 1.0f / sqrtf(t / (float)cols + a.nin_eps);
        } else {
            (void)b;
            return 1.0f;
        }
    };
    if constexpr (EPI == EPI_NORM) {
        /* o = bf16(sum + bias) as tm_cuda_gemv stores it; residual += o as tm_cuda_add_rmsnorm adds it */
        if (threadIdx.x < R * N) {
            const int i = threadIdx.x / N, b = threadIdx.x % N, r = r0 + i;
            if (r < rows) {
                float s = 0.0f;
                for (int w = 0; w < nwarps; w++) s += red[w][i][b];
                const uint16_t o = bf16_bits(s + (bias ? bias[r] : 0.0f));
                const int64_t idx = (int64_t)b * rows + r;
                if (out) ((uint16_t *)out)[idx] = o;
                const float nr = a.residual[idx] + tmq::bf16f(o);
                a.residual[idx] = nr;
                if (!a.norm_w) a.norm_out[idx] = bf16_bits(nr); /* raw: the next product norms it (norm-in) */
            }
            if (a.norm_w) __threadfence();
        }
        if (a.norm_w) norm_finish<N>(a, rows);
        return;
    }
    if constexpr (EPI == EPI_ROPE) {
        /* thread b: rows r0, r0 + 1 (one RoPE pair: r0 even, head_dim even) of token b; q, k, v rounded to bf16
         * as tm_cuda_gemv stores them, then rotated as tm_cuda_rope_kv_write rotates the stored values */
        if (threadIdx.x < N) {
            const int b = threadIdx.x;
            float s0 = 0.0f, s1 = 0.0f;
            for (int w = 0; w < nwarps; w++) {
                s0 += red[w][0][b];
                s1 += red[w][1][b];
            }
            if constexpr (NIN) {
                const float sc = nin_scale(b);
                s0 *= sc;
                s1 *= sc;
            }
            const uint16_t o0 = bf16_bits(s0 + (bias ? bias[r0] : 0.0f));
            const uint16_t o1 = bf16_bits(s1 + (bias ? bias[r0 + 1] : 0.0f));
            tm_gemv_rope_store(a.rope, jid, b, r0, rows, o0, o1, out);
        }
        return;
    }
    if (threadIdx.x < R * N) {
        const int i = threadIdx.x / N, b = threadIdx.x % N, r = r0 + i;
        if (r < rows) {
            float s = 0.0f, s2 = 0.0f;
            for (int w = 0; w < nwarps; w++) {
                s += red[w][i][b];
                if (SWIGLU) s2 += red[w][1][b];
            }
            if constexpr (NIN) {
                const float sc = nin_scale(b);
                s *= sc;
                s2 *= sc;
            }
            if (SWIGLU)
                store_out(out, false, (int64_t)b * rows + r, tm_gemv_silu_mul(s, s2));
            else
                store_out(out, a.out_f32, (int64_t)b * rows + r, s + (bias ? bias[r] : 0.0f));
        }
    }
}

/* warps per block: enough lanes for the row's units, each lane with at least one full step of `unroll` (>= 2)
 * units when the row is long enough, so that the registers hold loads in flight rather than idle lanes (bf16,
 * 2048 columns: 2 warps, 4 units of 8 per lane = 8 loads of 16 B in flight per thread for the 2 rows; 16 blocks
 * of 64 threads per SM at 64 registers = 128 KB in flight per SM). A function of type and cols only: never of n
 * or of the job, so per-row results do not depend on them. */
int warps_for(int units, int unroll) {
    int w = units / (32 * (unroll > 2 ? unroll : 2));
    return w < 1 ? 1 : w > kMaxWarps ? kMaxWarps : w;
}

/* the GGUF-quantized types: at least this many warps a block (TM_CUDA_GEMV_QWARPS=W sets it, 1..kMaxWarps, for A/B
 * timing). With one warp, each lane of a 2048-column q4_K block takes 2 units of 32 of each of its 2 rows: one
 * step of ~820 instructions, in 1024 one-warp blocks at 12% occupancy for the 1B o product (ncu); two warps
 * halve each lane's share. Batch-1 decode of the dummy 1B, same call: 2 warps q4_K +8.0%, q4_0 +4.7%, q6_K
 * +4.3%, q4_1 +3.4%; 4 warps 5-8% slower than 1 (twenty-fifth session). 4096 columns and more get 2 or more
 * already. */
int quant_min_warps() {
    const char *e = getenv("TM_CUDA_GEMV_QWARPS");
    const int w = e ? atoi(e) : 2;
    return w < 1 ? 1 : w > kMaxWarps ? kMaxWarps : w;
}

template <class T, int EPI, bool NIN, bool XS>
cudaError_t launch_v2_nin(const v2_args &a, int n, int blocks, cudaStream_t stream);

template <class T, int EPI> cudaError_t launch_v2(const v2_args &a, int n, int blocks, cudaStream_t stream) {
    if (a.nin_w) {
        if constexpr (nin_ok<T>() && EPI != EPI_NORM) return launch_v2_nin<T, EPI, true, false>(a, n, blocks, stream);
        return cudaErrorNotSupported;
    }
    /* the GGUF-quantized types stage x when it fits (TM_CUDA_GEMV_XS=0: never, for A/B timing): their own kernels */
    if constexpr (T::HAS_SCALE) {
        if (!tm_env_is_0("TM_CUDA_GEMV_XS") && (int64_t)n * a.cols * 2 <= kXsMaxBytes)
            return launch_v2_nin<T, EPI, false, true>(a, n, blocks, stream);
    }
    return launch_v2_nin<T, EPI, false, false>(a, n, blocks, stream);
}

template <class T, int EPI, bool NIN, bool XS>
cudaError_t launch_v2_nin(const v2_args &a, int n, int blocks, cudaStream_t stream) {
    /* TM_CUDA_GEMV_WIDE=1: the first version's rule (>= 2 units per lane), for A/B timing */
    const int unroll = tm_env_is_1("TM_CUDA_GEMV_WIDE") ? 2 : T::UNROLL;
    const int units = a.cols / (T::RUNS * 8); /* RUNS runs of 8 */
    int warps = warps_for(units, unroll);
    if constexpr (T::HAS_SCALE) {
        const int qw = quant_min_warps();
        if (warps < qw) warps = qw;
    }
    const dim3 grid((unsigned)blocks), block((unsigned)(32 * warps));
    const size_t smem = XS ? (size_t)n * (size_t)a.cols * 2 : 0;
    cudaError_t e = cudaErrorInvalidValue;
    switch (n) {
#define TM_GEMV_N(NN)                                                                                              \
    case NN:                                                                                                       \
        e = tm_launch_ex(a.pdl, gemv_kernel_v2<T, NN, EPI, NIN, XS>, grid, block, smem, stream, a);                \
        break;
        TM_GEMV_N(1)
        TM_GEMV_N(2)
        TM_GEMV_N(3)
        TM_GEMV_N(4)
        TM_GEMV_N(5)
        TM_GEMV_N(6)
        TM_GEMV_N(7)
        TM_GEMV_N(8)
#undef TM_GEMV_N
    default: break;
    }
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* The v2 kernels' alignment needs: weights ALIGN-aligned (blocks at fixed offsets), x 16-byte aligned with
 * cols % 8 == 0 (16-byte loads of 8 activations), cols in int. */
bool v2_ok(int32_t type, const void *wa, const void *wb, int64_t cols, const uint16_t *x) {
    const int align = tmq::unit_align(type);
    return align > 0 && (uintptr_t)wa % (uintptr_t)align == 0 && (uintptr_t)wb % (uintptr_t)align == 0 &&
           tm_aligned16(x) && cols % 8 == 0 && cols <= INT32_MAX;
}

/* norm-in's needs of a launch: every job with the same norm_w and eps (InvalidValue), norm_w 16-byte aligned
 * (NotSupported) */
cudaError_t nin_jobs_ok(const tm_cuda_gemv_job *jobs, int32_t n_jobs) {
    for (int32_t j = 1; j < n_jobs; j++)
        if (jobs[j].norm_w != jobs[0].norm_w || jobs[j].norm_eps != jobs[0].norm_eps) return cudaErrorInvalidValue;
    return jobs[0].norm_w && !tm_aligned16(jobs[0].norm_w) ? cudaErrorNotSupported : cudaSuccess;
}

/* One product (job) through v1: one block per output row. */
cudaError_t launch_v1(const tm_cuda_gemv_job &j, const void *w_up, float up_scale, int32_t type, int64_t cols,
                      int64_t row_bytes, const uint16_t *x, int32_t n, bool out_f32, bool swiglu, cudaStream_t stream) {
    const uint8_t *wa = (const uint8_t *)j.w;
    const bool f8 = type == TM_DT_FP8_E4M3;
    const float x_inv = f8 ? 1.0f / j.act_scale : 0.0f, sa = j.scale * j.act_scale, sb = up_scale * j.act_scale;
    if (swiglu)
        gemv_kernel_v1<true><<<(unsigned)j.rows, kThreadsV1, 0, stream>>>(
            wa, (const uint8_t *)w_up, type, j.rows, cols, row_bytes, x, n, NULL, j.out, false, x_inv, sa, sb);
    else
        gemv_kernel_v1<false><<<(unsigned)j.rows, kThreadsV1, 0, stream>>>(wa, wa, type, j.rows, cols, row_bytes, x, n,
                                                                           j.bias, j.out, out_f32, x_inv, sa, sb);
    return cudaGetLastError();
}

/* fp8 weights need positive, finite scales (and up_scale for SwiGLU); other types ignore them */
bool fp8_scales_ok(int32_t type, const tm_cuda_gemv_job &j, bool swiglu, float up_scale) {
    if (type != TM_DT_FP8_E4M3) return true;
    return tm_fp8_scales_ok(j.scale, j.act_scale) && (!swiglu || tm_fp8_scales_ok(up_scale, j.act_scale));
}

/* Every launcher ends here: n_jobs products sharing type, cols and x (swiglu: exactly one job, whose w is the
 * gate, with w_up the up weights and up_scale their fp8 scale; out8: its e4m3 copy, tm_cuda_fp8_scales.out8).
 * Jobs with 0 rows are skipped. */
cudaError_t gemv_run(const tm_cuda_gemv_job *jobs, int32_t n_jobs, const void *w_up, float up_scale, int32_t type,
                     int64_t cols, const uint16_t *x, int32_t n, bool out_f32, bool swiglu, uint8_t *out8,
                     cudaStream_t stream) {
    tmq::info ti;
    if (!jobs || n_jobs < 1 || n_jobs > kMaxJobs || !x || n < 1 || n > TM_CUDA_GEMV_MAX_N || cols <= 0 ||
        cols > INT32_MAX || !tmq::type_info(type, &ti) || cols % ti.qk || (swiglu && (n_jobs != 1 || !w_up)) ||
        (out8 && (!swiglu || type != TM_DT_FP8_E4M3)) || (jobs[0].xq && type != TM_DT_FP8_E4M3))
        return cudaErrorInvalidValue;
    for (int32_t j = 0; j < n_jobs; j++)
        if (!jobs[j].w || !jobs[j].out || jobs[j].rows < 0 || jobs[j].rows > INT32_MAX ||
            !fp8_scales_ok(type, jobs[j], swiglu, up_scale))
            return cudaErrorInvalidValue;
    /* norm-in: every job alike, 16-byte aligned weights; v1 does not take it */
    const bool nin = jobs[0].norm_w != NULL;
    if (cudaError_t e = nin_jobs_ok(jobs, n_jobs); e != cudaSuccess) return e;
    if (nin && tm_env_is_1("TM_CUDA_GEMV_V")) return cudaErrorNotSupported;
    const int64_t row_bytes = cols / ti.qk * ti.bytes;
    /* fp8 weights: the tensor-core kernel (tm_cuda_gemv_fp8tc.cu) where its shapes fit */
    if (!tm_env_is_1("TM_CUDA_GEMV_V") && tm_fp8tc_ok(type, jobs, n_jobs, w_up, cols, x, n))
        return tm_fp8tc_run(swiglu ? TM_FP8TC_SWIGLU : TM_FP8TC_PLAIN, type, jobs, n_jobs, w_up, up_scale, cols, x,
                            n, out_f32, NULL, out8, stream);
    /* the CUDA-core kernels round x themselves and leave out8 to tm_cuda_quant_fp8 */
    if (out8) {
        if (cudaError_t e = gemv_run(jobs, 1, w_up, up_scale, type, cols, x, n, false, true, NULL, stream);
            e != cudaSuccess)
            return e;
        return tm_cuda_quant_fp8((const uint16_t *)jobs[0].out, (size_t)n * (size_t)jobs[0].rows,
                                 1.0f / jobs[0].act_scale, out8, stream);
    }

    /* v2 for all jobs at once when every job meets its alignment needs (and, fp8, all share the activation
     * scale), else each job on its own as tm_cuda_gemv would run it (v2 or v1), so that a job's results never
     * depend on its companions */
    bool all_v2 = !tm_env_is_1("TM_CUDA_GEMV_V");
    for (int32_t j = 0; j < n_jobs && all_v2; j++)
        if (jobs[j].rows > 0)
            all_v2 = v2_ok(type, jobs[j].w, swiglu ? w_up : jobs[j].w, cols, x) &&
                     (type != TM_DT_FP8_E4M3 || jobs[j].act_scale == jobs[0].act_scale);
    if (!all_v2) {
        if (nin) return cudaErrorNotSupported;
        for (int32_t j = 0; j < n_jobs; j++) {
            if (jobs[j].rows == 0) continue;
            cudaError_t e = (n_jobs > 1 && !tm_env_is_1("TM_CUDA_GEMV_V"))
                                ? gemv_run(&jobs[j], 1, w_up, up_scale, type, cols, x, n, out_f32, swiglu, NULL,
                                           stream)
                                : launch_v1(jobs[j], w_up, up_scale, type, cols, row_bytes, x, n, out_f32, swiglu,
                                            stream);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }

    constexpr int R_PLAIN = 2, R_SWIGLU = 1; /* output rows per v2 block (R in gemv_kernel_v2) */
    const int64_t R = swiglu ? R_SWIGLU : R_PLAIN;
    v2_args a = {};
    int nj = 0;
    int64_t blocks = 0;
    for (int32_t j = 0; j < n_jobs; j++) {
        if (jobs[j].rows == 0) continue;
        a.w[nj] = (const uint8_t *)jobs[j].w;
        a.bias[nj] = swiglu ? NULL : jobs[j].bias;
        a.out[nj] = jobs[j].out;
        a.rows[nj] = (int)jobs[j].rows;
        a.blk0[nj] = (int)blocks;
        a.sc[nj] = jobs[j].scale * jobs[j].act_scale;
        blocks += (jobs[j].rows + R - 1) / R;
        nj++;
    }
    if (nj == 0) return cudaSuccess;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    for (int j = nj; j < kMaxJobs; j++) {
        a.w[j] = a.w[0];
        a.out[j] = a.out[0];
        a.rows[j] = a.rows[0];
        a.blk0[j] = INT_MAX;
        a.sc[j] = a.sc[0];
    }
    if (type == TM_DT_FP8_E4M3) {
        a.x_inv = 1.0f / jobs[0].act_scale;
        a.sc_up = up_scale * jobs[0].act_scale;
    }
    a.w_up = (const uint8_t *)w_up;
    a.x = x;
    a.row_bytes = row_bytes;
    a.cols = (int)cols;
    a.out_f32 = swiglu ? false : out_f32;
    a.pdl = tm_pdl_gemv_on();
    a.nin_w = jobs[0].norm_w;
    a.nin_eps = jobs[0].norm_eps;
    switch (type) {
#define TMQ_LAUNCH(T)                                                                                              \
    return swiglu ? launch_v2<T, EPI_SWIGLU>(a, n, (int)blocks, stream) : launch_v2<T, EPI_PLAIN>(a, n, (int)blocks, stream)
        TMQ_GEMV_TYPE_CASES(type, TMQ_LAUNCH)
#undef TMQ_LAUNCH
    default: return cudaErrorInvalidValue;
    }
}

/* The fused launchers' common part: v2 over jobs (none empty) with epilogue EPI; extra fields of `a` already set.
 * cudaErrorNotSupported when v2 cannot run them (alignment, TM_CUDA_GEMV_V=1). */
template <int EPI>
cudaError_t fused_run(v2_args &a, const tm_cuda_gemv_job *jobs, int32_t n_jobs, int32_t type, int64_t cols,
                      const uint16_t *x, int32_t n, cudaStream_t stream) {
    tmq::info ti;
    if (!x || n < 1 || n > TM_CUDA_GEMV_MAX_N || cols <= 0 || cols > INT32_MAX || !tmq::type_info(type, &ti) ||
        cols % ti.qk || (jobs[0].xq && type != TM_DT_FP8_E4M3))
        return cudaErrorInvalidValue;
    if (tm_env_is_1("TM_CUDA_GEMV_V")) return cudaErrorNotSupported;
    int64_t blocks = 0;
    for (int32_t j = 0; j < n_jobs; j++) {
        if (!jobs[j].w || jobs[j].rows < 2 || jobs[j].rows % 2 || jobs[j].rows > INT32_MAX ||
            !fp8_scales_ok(type, jobs[j], false, 0.0f))
            return cudaErrorInvalidValue;
        if (!v2_ok(type, jobs[j].w, jobs[j].w, cols, x)) return cudaErrorNotSupported;
        if (type == TM_DT_FP8_E4M3 && jobs[j].act_scale != jobs[0].act_scale) return cudaErrorNotSupported;
        a.sc[j] = jobs[j].scale * jobs[j].act_scale;
        a.w[j] = (const uint8_t *)jobs[j].w;
        a.bias[j] = jobs[j].bias;
        a.out[j] = jobs[j].out;
        a.rows[j] = (int)jobs[j].rows;
        a.blk0[j] = (int)blocks;
        blocks += jobs[j].rows / 2; /* R = 2 rows per block: no block straddles two jobs */
    }
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    if constexpr (EPI == EPI_ROPE) { /* fp8 weights: the tensor-core kernel where its shapes fit */
        if (tm_fp8tc_ok(type, jobs, n_jobs, NULL, cols, x, n))
            return tm_fp8tc_run(TM_FP8TC_ROPE, type, jobs, n_jobs, NULL, 0.0f, cols, x, n, false, &a.rope, NULL,
                                stream);
    }
    for (int j = n_jobs; j < kMaxJobs; j++) {
        a.w[j] = a.w[0];
        a.bias[j] = NULL;
        a.out[j] = a.out[0];
        a.rows[j] = a.rows[0];
        a.blk0[j] = INT_MAX;
        a.sc[j] = a.sc[0];
    }
    if (type == TM_DT_FP8_E4M3) a.x_inv = 1.0f / jobs[0].act_scale;
    if (cudaError_t e = nin_jobs_ok(jobs, n_jobs); e != cudaSuccess) return e;
    a.nin_w = jobs[0].norm_w;
    a.nin_eps = jobs[0].norm_eps;
    a.w_up = NULL;
    a.x = x;
    a.row_bytes = cols / ti.qk * ti.bytes;
    a.cols = (int)cols;
    a.out_f32 = false;
    a.pdl = tm_pdl_gemv_on();
    switch (type) {
#define TMQ_LAUNCH(T) return launch_v2<T, EPI>(a, n, (int)blocks, stream)
        TMQ_GEMV_TYPE_CASES(type, TMQ_LAUNCH)
#undef TMQ_LAUNCH
    default: return cudaErrorInvalidValue;
    }
}

bool aligned(const void *p, uintptr_t k) { return ((uintptr_t)p & (k - 1)) == 0; }

} /* namespace */

extern "C" cudaError_t tm_cuda_gemv(const void *w, int32_t type, int64_t rows, int64_t cols, const uint16_t *x,
                                    int32_t n, const float *bias, void *out, bool out_f32,
                                    const tm_cuda_fp8_scales *fp8, cudaStream_t stream) {
    if (fp8 && fp8->out8) return cudaErrorInvalidValue; /* tm_cuda_gemv_swiglu's */
    const tm_cuda_gemv_job job = {w,    rows, bias, out, fp8 ? fp8->w : 0.0f, fp8 ? fp8->act : 0.0f, NULL, 0.0f,
                                  fp8 ? fp8->xq : NULL};
    return gemv_run(&job, 1, NULL, 0.0f, type, cols, x, n, out_f32, false, NULL, stream);
}

extern "C" cudaError_t tm_cuda_gemv_group(const tm_cuda_gemv_job *jobs, int32_t n_jobs, int32_t type, int64_t cols,
                                          const uint16_t *x, int32_t n, bool out_f32, cudaStream_t stream) {
    return gemv_run(jobs, n_jobs, NULL, 0.0f, type, cols, x, n, out_f32, false, NULL, stream);
}

extern "C" cudaError_t tm_cuda_gemv_swiglu(const void *w_gate, const void *w_up, int32_t type, int64_t rows,
                                           int64_t cols, const uint16_t *x, int32_t n, uint16_t *out,
                                           const tm_cuda_fp8_scales *fp8, cudaStream_t stream) {
    const tm_cuda_gemv_job job = {w_gate, rows, NULL, out, fp8 ? fp8->w : 0.0f, fp8 ? fp8->act : 0.0f, NULL, 0.0f,
                                  fp8 ? fp8->xq : NULL};
    return gemv_run(&job, 1, w_up, fp8 ? fp8->w_up : 0.0f, type, cols, x, n, false, true, fp8 ? fp8->out8 : NULL,
                    stream);
}

extern "C" cudaError_t tm_cuda_gemv_swiglu_nin(const void *w_gate, const void *w_up, int32_t type, int64_t rows,
                                               int64_t cols, const uint16_t *x, int32_t n, uint16_t *out,
                                               const float *norm_w, float eps, cudaStream_t stream) {
    if (!norm_w) return cudaErrorInvalidValue;
    tm_cuda_gemv_job job = {w_gate, rows, NULL, out, 0.0f, 0.0f, norm_w, eps, NULL};
    return gemv_run(&job, 1, w_up, 0.0f, type, cols, x, n, false, true, NULL, stream);
}

extern "C" cudaError_t tm_cuda_gemv_add_rmsnorm(const void *w, int32_t type, int64_t rows, int64_t cols,
                                                const uint16_t *x, int32_t n, const float *bias, uint16_t *out,
                                                float *residual, const float *norm_w, float eps, uint16_t *norm_out,
                                                void *scratch, const tm_cuda_fp8_scales *fp8, cudaStream_t stream) {
    if (!w || !residual || !norm_out || (norm_w && !scratch) || rows <= 0) return cudaErrorInvalidValue;
    if (rows % 8 || !aligned(residual, 16) || (norm_w && !aligned(norm_w, 16)) || !aligned(norm_out, 16) ||
        (norm_w && !aligned(scratch, 4)))
        return cudaErrorNotSupported;
    v2_args a = {};
    a.residual = residual;
    a.norm_w = norm_w;
    a.norm_out = norm_out;
    a.counter = (unsigned int *)scratch;
    a.eps = eps;
    const tm_cuda_gemv_job job = {w, rows, bias, out, fp8 ? fp8->w : 0.0f, fp8 ? fp8->act : 0.0f, NULL, 0.0f, NULL};
    return fused_run<EPI_NORM>(a, &job, 1, type, cols, x, n, stream);
}

extern "C" cudaError_t tm_cuda_gemv_qkv_rope(const tm_cuda_gemv_job *jobs, int32_t type, int64_t cols,
                                             const uint16_t *x, int32_t n, const tm_cuda_rope_args *rope,
                                             cudaStream_t stream) {
    if (!jobs || !rope || !jobs[0].out || !rope->positions || !rope->slot_mapping || !rope->k_cache ||
        !rope->v_cache || rope->n_tokens != n || rope->n_heads <= 0 || rope->n_kv_heads <= 0 || rope->head_dim <= 0 ||
        rope->block_size <= 0 || rope->rope_dim < 0 || rope->rope_dim > rope->head_dim ||
        (rope->rope_dim > 0 && !rope->inv_freq) || rope->q_src || rope->src_stride) /* q, k, v are its own outputs */
        return cudaErrorInvalidValue;
    const int64_t hd = rope->head_dim;
    if (rope->neox || hd % 2 || rope->rope_dim % 2 || jobs[0].rows != rope->n_heads * hd ||
        jobs[1].rows != rope->n_kv_heads * hd || jobs[2].rows != rope->n_kv_heads * hd)
        return cudaErrorNotSupported;
    for (int j = 0; j < 3; j++)
        if (!aligned(jobs[j].out, 4)) return cudaErrorNotSupported; /* NULL passes: k, v outputs are optional */
    if (!aligned(rope->k_cache, 4) || !aligned(rope->v_cache, 4)) return cudaErrorNotSupported;
    v2_args a = {};
    a.rope = {rope->inv_freq, rope->positions,  rope->slot_mapping, rope->k_cache,    rope->v_cache,
              rope->kv_fp8,   rope->head_dim,   rope->rope_dim,     rope->block_size, rope->n_kv_heads};
    return fused_run<EPI_ROPE>(a, jobs, 3, type, cols, x, n, stream);
}
