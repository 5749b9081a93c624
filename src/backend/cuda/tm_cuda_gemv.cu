/* tm_cuda_gemv.cu -- small-batch matrix-vector products with the weight dequantization fused into the read. */
#include "backend/cuda/tm_cuda_kernels.h"
#include "backend/cuda/tm_cuda_dequant.cuh"

#include <stdlib.h>

/* out (n, rows) = x (n, cols) bf16 . w^T for n <= 8: batch-1 decode, bound by the weight read.
 *
 * v2 (fast): a thread block of W = 1, 2 or 4 warps owns R output rows (R = 2; for SwiGLU one row of gate and the
 * same row of up) and splits the columns: lane `l` of warp `w` takes the units u = 32w + l, + 32W, ... of every
 * row (a unit is 8 to 32 elements, see tm_cuda_dequant.cuh). Each step issues the global loads of U units of all
 * of its rows at once (U = 4 for bf16/f16/q4_0/q4_1, 2 for the wider units: several 16-byte loads in flight per
 * lane), then, per run of 8 elements, loads the 8 matching bf16 of every batch row of x (one 16-byte load each,
 * through L1, where x stays: the weights bypass L1 when each byte is read by one load) and accumulates in f32
 * for all rows and all n at once; x is loaded once for the R rows. Quantized types first form sum(q * x) over
 * the 8 elements with q the exact small integers, then add scale * that (+ min * sum(x)). The column split ends
 * with a shuffle reduction per warp and a shared-memory one across warps. W is picked so that every lane has at
 * least two units per row when the row is long enough (W = 4 for 2048 bf16 columns: 2 units of 8 per lane).
 * Grid: ceil(rows / R) blocks, i.e. several waves of 132 SMs for rows >= 2048. Bytes in flight per SM: with
 * ~32 resident warps and 2 rows x 2-4 units x 16 B per lane, 64-128 KB, well above the ~40 KB that the copy
 * bandwidth needs at ~1 us of DRAM latency.
 *
 * v1 (simple, TM_CUDA_GEMV_V=1, also used when the alignment needs of v2 are not met): one block of 128 threads
 * per output row, each thread striding over the row's elements through tmq::deq_elem, a block reduction.
 *
 * TM_CUDA_PDL=1 launches v2 with programmatic dependent launch: a block first prefetches the start of its weight
 * rows into L2 (weights do not depend on the previous kernel), then waits for the previous kernel
 * (griddepcontrol.wait) before reading x and writing out. Off by default. */

namespace {

constexpr int kThreadsV1 = 128;
constexpr int kMaxWarps = 4;

bool env_is_1(const char *name) {
    const char *s = getenv(name);
    return s && s[0] == '1' && s[1] == '\0';
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

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
                   int64_t cols, int64_t row_bytes, const uint16_t *__restrict__ x, int n, const float *__restrict__ bias,
                   void *__restrict__ out, bool out_f32) {
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
                const float xv = tmq::bf16f(x[b * cols + j]);
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
        if (SWIGLU)
            store_out(out, false, b * rows + r, silu_mul(s0, s1));
        else
            store_out(out, out_f32, b * rows + r, s0 + (bias ? bias[r] : 0.0f));
    }
}

/* ---- v2 --------------------------------------------------------------------------------------------------------- */

template <class T, int N> constexpr int unroll_for() {
    return N <= 2 ? T::UNROLL : N <= 4 ? (T::UNROLL > 1 ? T::UNROLL / 2 : 1) : 1;
}

/* acc[i][b] += dot(unit u of weight row i, x[b]) for the NR rows of the block, all N batch rows */
template <class T, int N, int NR>
__device__ __forceinline__ void unit_dot(const typename T::Raw (&raw)[NR], int u, const uint16_t *__restrict__ x,
                                         int64_t cols, float (&acc)[NR][N]) {
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
        for (int b = 0; b < N; b++) xv[b] = __ldg((const uint4 *)(x + b * cols + off));
        float q[NR][8];
#pragma unroll
        for (int i = 0; i < NR; i++) T::qrun(raw[i], k, q[i]);
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
                    if constexpr (T::HAS_MIN) xs[b] += xf;
#pragma unroll
                    for (int i = 0; i < NR; i++) p[i][b] = fmaf(q[i][j], xf, p[i][b]);
                }
            }
#pragma unroll
            for (int i = 0; i < NR; i++) {
#pragma unroll
                for (int b = 0; b < N; b++) {
                    acc[i][b] = fmaf(s[i][k], p[i][b], acc[i][b]);
                    if constexpr (T::HAS_MIN) acc[i][b] = fmaf(m[i][k], xs[b], acc[i][b]);
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

/* K units per lane at once: units u, u + stride, ..., all < nu (the caller checks) */
template <class T, int N, int NR, int K>
__device__ __forceinline__ void gemv_step(const uint8_t *const (&wr)[NR], int u, int stride,
                                          const uint16_t *__restrict__ x, int64_t cols, float (&acc)[NR][N]) {
    typename T::Raw raw[K][NR];
#pragma unroll
    for (int k = 0; k < K; k++) {
#pragma unroll
        for (int i = 0; i < NR; i++) T::load(wr[i], u + k * stride, raw[k][i]);
    }
#pragma unroll
    for (int k = 0; k < K; k++) unit_dot<T, N, NR>(raw[k], u + k * stride, x, cols, acc);
}

/* resident blocks per SM asked of the register allocator: 8 (<= 64 registers) at n = 1, so that a whole 2048-row
 * matrix (1024 blocks) fits in one wave; fewer for larger n, whose accumulators need more registers */
constexpr int min_blocks_for(int n) { return n <= 1 ? 8 : n <= 2 ? 6 : n <= 4 ? 4 : 2; }

template <class T, int N, bool SWIGLU>
__global__ void __launch_bounds__(kMaxWarps * 32, min_blocks_for(N))
    gemv_kernel_v2(const uint8_t *__restrict__ wa, const uint8_t *__restrict__ wb, int rows, int cols,
                   int64_t row_bytes, const uint16_t *__restrict__ x, const float *__restrict__ bias,
                   void *__restrict__ out, bool out_f32, bool pdl) {
    constexpr int R = SWIGLU ? 1 : 2;    /* output rows per block */
    constexpr int NR = SWIGLU ? 2 : R;   /* weight rows per block */
    constexpr int U = unroll_for<T, N>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int r0 = blockIdx.x * R;

    const uint8_t *wr[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int r = SWIGLU ? r0 : min(r0 + i, rows - 1); /* a clamped row is computed and not written */
        wr[i] = (SWIGLU && i == 1 ? wb : wa) + (int64_t)r * row_bytes;
    }
    if (pdl) {
        /* programmatic dependent launch: start pulling this block's weights into L2 (up to 16 KB per row) while
         * the previous kernel finishes, then wait for it before touching x or out */
#pragma unroll
        for (int i = 0; i < NR; i++) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int o = (threadIdx.x + k * kMaxWarps * 32) * 128;
                if (o < row_bytes && o < 16384) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[i] + o));
            }
        }
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;");
    }

    float acc[NR][N];
#pragma unroll
    for (int i = 0; i < NR; i++) {
#pragma unroll
        for (int b = 0; b < N; b++) acc[i][b] = 0.0f;
    }
    const int nu = T::units(cols), stride = nwarps * 32;
    int u = warp * 32 + lane;
    for (; u + (U - 1) * stride < nu; u += U * stride) gemv_step<T, N, NR, U>(wr, u, stride, x, cols, acc);
    if constexpr (U >= 4) {
        if (u + stride < nu) {
            gemv_step<T, N, NR, 2>(wr, u, stride, x, cols, acc);
            u += 2 * stride;
        }
    }
    if constexpr (U >= 2) {
        if (u < nu) gemv_step<T, N, NR, 1>(wr, u, stride, x, cols, acc);
    }

    __shared__ float red[kMaxWarps][NR][N];
#pragma unroll
    for (int i = 0; i < NR; i++) {
#pragma unroll
        for (int b = 0; b < N; b++) {
            const float v = warp_sum(acc[i][b]);
            if (lane == 0) red[warp][i][b] = v;
        }
    }
    __syncthreads();
    if (threadIdx.x < R * N) {
        const int i = threadIdx.x / N, b = threadIdx.x % N, r = r0 + i;
        if (r < rows) {
            float s = 0.0f, s2 = 0.0f;
            for (int w = 0; w < nwarps; w++) {
                s += red[w][i][b];
                if (SWIGLU) s2 += red[w][1][b];
            }
            if (SWIGLU)
                store_out(out, false, (int64_t)b * rows + r, silu_mul(s, s2));
            else
                store_out(out, out_f32, (int64_t)b * rows + r, s + (bias ? bias[r] : 0.0f));
        }
    }
}

/* warps per block: enough lanes for the row's units, each lane with >= 2 units when possible */
int warps_for(int units) {
    int w = units / 64;
    return w < 1 ? 1 : w > kMaxWarps ? kMaxWarps : w;
}

template <class T, bool SWIGLU>
cudaError_t launch_v2(const uint8_t *wa, const uint8_t *wb, int n, int rows, int cols, int64_t row_bytes,
                      const uint16_t *x, const float *bias, void *out, bool out_f32, bool pdl, cudaStream_t stream) {
    constexpr int R = SWIGLU ? 1 : 2;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((rows + R - 1) / R));
    cfg.blockDim = dim3((unsigned)(32 * warps_for(cols / (T::RUNS * 8))));
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaErrorInvalidValue;
    switch (n) {
#define TM_GEMV_N(NN)                                                                                              \
    case NN:                                                                                                       \
        e = cudaLaunchKernelEx(&cfg, gemv_kernel_v2<T, NN, SWIGLU>, wa, wb, rows, cols, row_bytes, x, bias, out,   \
                               out_f32, pdl);                                                                      \
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
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear a launch error so it is reported once, here */
        return e;
    }
    return cudaGetLastError();
}

/* The v2 kernels' alignment needs: weights ALIGN-aligned (blocks at fixed offsets), x 16-byte aligned with
 * cols % 8 == 0 (16-byte loads of 8 activations), sizes in int. */
bool v2_ok(int32_t type, const void *wa, const void *wb, int64_t rows, int64_t cols, const uint16_t *x) {
    int align = 0;
    switch (type) {
#define TMQ_ALIGN(T) align = T::ALIGN
        TMQ_TYPE_CASES(type, TMQ_ALIGN)
#undef TMQ_ALIGN
    default: return false;
    }
    return (uintptr_t)wa % (uintptr_t)align == 0 && (uintptr_t)wb % (uintptr_t)align == 0 &&
           ((uintptr_t)x & 15u) == 0 && cols % 8 == 0 && cols <= INT32_MAX && rows <= INT32_MAX;
}

cudaError_t gemv_any(const void *w_a, const void *w_b, int32_t type, int64_t rows, int64_t cols, const uint16_t *x,
                     int32_t n, const float *bias, void *out, bool out_f32, bool swiglu, cudaStream_t stream) {
    tmq::info ti;
    if (!w_a || !w_b || !x || !out || n < 1 || n > TM_CUDA_GEMV_MAX_N || rows < 0 || rows > INT32_MAX || cols <= 0 ||
        !tmq::type_info(type, &ti) || cols % ti.qk)
        return cudaErrorInvalidValue;
    if (rows == 0) return cudaSuccess;
    const int64_t row_bytes = cols / ti.qk * ti.bytes;
    const uint8_t *wa = (const uint8_t *)w_a, *wb = (const uint8_t *)w_b;
    if (env_is_1("TM_CUDA_GEMV_V") || !v2_ok(type, wa, wb, rows, cols, x)) {
        if (swiglu)
            gemv_kernel_v1<true><<<(unsigned)rows, kThreadsV1, 0, stream>>>(wa, wb, type, rows, cols, row_bytes, x, n,
                                                                            NULL, out, false);
        else
            gemv_kernel_v1<false><<<(unsigned)rows, kThreadsV1, 0, stream>>>(wa, wb, type, rows, cols, row_bytes, x,
                                                                             n, bias, out, out_f32);
        return cudaGetLastError();
    }
    const bool pdl = env_is_1("TM_CUDA_PDL");
    switch (type) {
#define TMQ_LAUNCH(T)                                                                                              \
    return swiglu ? launch_v2<T, true>(wa, wb, n, (int)rows, (int)cols, row_bytes, x, NULL, out, false, pdl, stream) \
                  : launch_v2<T, false>(wa, wb, n, (int)rows, (int)cols, row_bytes, x, bias, out, out_f32, pdl, stream)
        TMQ_TYPE_CASES(type, TMQ_LAUNCH)
#undef TMQ_LAUNCH
    default: return cudaErrorInvalidValue;
    }
}

} /* namespace */

extern "C" cudaError_t tm_cuda_gemv(const void *w, int32_t type, int64_t rows, int64_t cols, const uint16_t *x,
                                    int32_t n, const float *bias, void *out, bool out_f32, cudaStream_t stream) {
    return gemv_any(w, w, type, rows, cols, x, n, bias, out, out_f32, false, stream);
}

extern "C" cudaError_t tm_cuda_gemv_swiglu(const void *w_gate, const void *w_up, int32_t type, int64_t rows,
                                           int64_t cols, const uint16_t *x, int32_t n, uint16_t *out,
                                           cudaStream_t stream) {
    return gemv_any(w_gate, w_up, type, rows, cols, x, n, NULL, out, false, true, stream);
}
