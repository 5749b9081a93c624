/* tm_cuda_norm.cu -- RMSNorm and fused residual-add + RMSNorm: one block per row, the row kept in registers. */
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_bf16.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <stdlib.h>

/* Semantics (as tm_cpu_rmsnorm_row / tm_cpu_add_rmsnorm_row): in f32, v = x (rmsnorm) or v = residual +
 * float(x) stored back into residual (add_rmsnorm); r = 1 / sqrtf(sum(v^2) / dim + eps); out = bf16(v * r * w),
 * rounded once. The sum of squares is a tree sum (per thread, warp butterfly, then across warps), so it differs
 * from the CPU's sequential sum in the last bits only.
 *
 * v2 (fast): BS threads per row, each owning NC chunks of 8 elements (chunk c = threadIdx.x + k * BS): 16-byte
 * loads (two float4 of f32, one uint4 of 8 bf16), the 8 * NC values kept in registers between the
 * sum-of-squares pass and the scale pass, so the row is read once and written once. Needs dim % 8 == 0,
 * 16-byte aligned pointers and dim / 8 <= 4 * 512.
 * v1 (simple): any dim and alignment; a strided scalar loop that reads the row twice (the second read of the
 * residual sees this thread's own writes). TM_CUDA_RMSNORM_V=1 forces it for both launchers. */

namespace {

using tmbf::unpack_bf16x8;
using tmbf::pack_bf16x2;

__device__ __forceinline__ float warp_sum(float v) {
    /* xor butterfly: every lane ends with the bitwise-same sum */
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the same value. red: (32). */
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31), nw = (int)(blockDim.x >> 5);
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f; /* each warp reduces the partials itself: no second barrier */
    return warp_sum(v);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* ---- v1: simple ---- */

template <bool ADD>
__global__ void __launch_bounds__(256) rmsnorm_kernel_v1(float *res, const uint16_t *xb, const float *xf,
                                                         const float *w, float eps, int dim, uint16_t *out) {
    __shared__ float red[32];
    const size_t base = (size_t)blockIdx.x * (size_t)dim;
    float ss = 0.0f;
    for (int i = (int)threadIdx.x; i < dim; i += (int)blockDim.x) {
        float v;
        if (ADD) {
            v = res[base + i] + bf16_bits_to_f32(xb[base + i]);
            res[base + i] = v;
        } else {
            v = xf[base + i];
        }
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = (int)threadIdx.x; i < dim; i += (int)blockDim.x) {
        const float v = ADD ? res[base + i] : xf[base + i];
        out[base + i] = __bfloat16_as_ushort(__float2bfloat16_rn(v * r * w[i]));
    }
}

/* ---- v2: 16-byte vectors, row in registers ---- */

/* Q8: out8 (n, dim) also gets e4m3(out * inv), what tm_cuda_quant_fp8(out, inv) makes (the next fp8 product's input) */
template <bool ADD, int BS, int NC, bool Q8 = false>
__global__ void __launch_bounds__(BS) rmsnorm_kernel_v2(float *res, const uint16_t *xb, const float *xf,
                                                        const float *w, float eps, int dim, uint16_t *out,
                                                        uint8_t *out8 = nullptr, float inv = 0.0f) {
    tm_pdl_enter();
    __shared__ float red[32];
    const int nch = dim >> 3;                                   /* chunks of 8 in a row */
    const size_t row = (size_t)blockIdx.x * (size_t)nch;        /* first chunk of this row */
    float v[NC][8];
    uint4 xu[NC]; /* ADD: the bf16 chunks of x */
    /* every load first, then the residual stores: a store between two loads of res would make the compiler
     * (which cannot rule out aliasing) wait for the first load before issuing the second */
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int c = (int)threadIdx.x + k * BS;
        if (c < nch) {
            const float4 *s4 = reinterpret_cast<const float4 *>(ADD ? res : xf) + 2 * (row + c);
            const float4 a = s4[0], b = s4[1];
            v[k][0] = a.x;
            v[k][1] = a.y;
            v[k][2] = a.z;
            v[k][3] = a.w;
            v[k][4] = b.x;
            v[k][5] = b.y;
            v[k][6] = b.z;
            v[k][7] = b.w;
            if (ADD) xu[k] = reinterpret_cast<const uint4 *>(xb)[row + c];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int c = (int)threadIdx.x + k * BS;
        if (c < nch) {
            if (ADD) {
                float xv[8];
                unpack_bf16x8(xu[k], xv);
#pragma unroll
                for (int e = 0; e < 8; e++) v[k][e] += xv[e];
                float4 *r4 = reinterpret_cast<float4 *>(res) + 2 * (row + c);
                r4[0] = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
                r4[1] = make_float4(v[k][4], v[k][5], v[k][6], v[k][7]);
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[k][e] * v[k][e];
        }
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    /* w (dim floats, shared by every row) mostly hits L1/L2 */
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int c = (int)threadIdx.x + k * BS;
        if (c < nch) {
            const float4 *w4 = reinterpret_cast<const float4 *>(w) + 2 * c;
            const float4 wa = __ldg(w4), wb = __ldg(w4 + 1);
            uint4 o;
            o.x = pack_bf16x2(v[k][0] * r * wa.x, v[k][1] * r * wa.y);
            o.y = pack_bf16x2(v[k][2] * r * wa.z, v[k][3] * r * wa.w);
            o.z = pack_bf16x2(v[k][4] * r * wb.x, v[k][5] * r * wb.y);
            o.w = pack_bf16x2(v[k][6] * r * wb.z, v[k][7] * r * wb.w);
            if (!Q8 || out) reinterpret_cast<uint4 *>(out)[row + c] = o; /* Q8: out may be NULL (e4m3 only) */
            if (Q8) reinterpret_cast<uint2 *>(out8)[row + c] = tm_fp8x8_of_bf16(o, inv);
        }
    }
}

/* v2's block shape by row width, one choice for both variants: the plain norm of the f32 input after an add gives,
 * bit for bit, the output the fused add+norm with the fp8 copy would have written (the backend's deferred bf16
 * outputs rely on it). Q8 (the fp8 copy) stops at 1024 chunks (dim 8192, the fp8 models' widths). */
template <bool ADD, bool Q8>
cudaError_t launch_norm_v2(float *res, const uint16_t *xb, const float *xf, const float *w, float eps, int32_t n,
                           int32_t dim, uint16_t *out, uint8_t *out8, float inv, cudaStream_t stream) {
    const dim3 grid((unsigned)n);
    const int nch = dim / 8;
    if (nch <= 128)
        return tm_launch(rmsnorm_kernel_v2<ADD, 128, 1, Q8>, grid, dim3(128), 0, stream, res, xb, xf, w, eps, dim, out,
                         out8, inv);
    if (nch <= 256)
        return tm_launch(rmsnorm_kernel_v2<ADD, 256, 1, Q8>, grid, dim3(256), 0, stream, res, xb, xf, w, eps, dim, out,
                         out8, inv);
    if (nch <= 512) /* one chunk a thread: 16384 x 4096 add+norm 204.4-208.5 us, against 210.4-214.3 with 256 x 2 and
                     * 218.9-220.1 with 128 x 4 (nineteenth session) */
        return tm_launch(rmsnorm_kernel_v2<ADD, 512, 1, Q8>, grid, dim3(512), 0, stream, res, xb, xf, w, eps, dim, out,
                         out8, inv);
    if (Q8 || nch <= 1024)
        return tm_launch(rmsnorm_kernel_v2<ADD, 512, 2, Q8>, grid, dim3(512), 0, stream, res, xb, xf, w, eps, dim, out,
                         out8, inv);
    if constexpr (!Q8)
        return tm_launch(rmsnorm_kernel_v2<ADD, 512, 4>, grid, dim3(512), 0, stream, res, xb, xf, w, eps, dim, out,
                         out8, inv);
    return cudaErrorInvalidValue;
}

template <bool ADD>
cudaError_t launch_norm(float *res, const uint16_t *xb, const float *xf, const float *w, float eps, int32_t n,
                        int32_t dim, uint16_t *out, cudaStream_t stream, uint8_t *out8 = nullptr, float inv = 0.0f) {
    if (n < 0 || dim <= 0 || !w || (!out && !out8) || (ADD ? (!res || !xb) : !xf) || (out8 && !(inv > 0.0f)))
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const int nch = dim / 8;
    const bool vec = dim % 8 == 0 && tm_aligned16(w) && tm_aligned16(out) &&
                     (ADD ? tm_aligned16(res) && tm_aligned16(xb) : tm_aligned16(xf)) && nch <= 2048 && !tm_env_is_1("TM_CUDA_RMSNORM_V");
    if (out8) { /* the fp8 copy exists on the vector path only */
        if (!vec || nch > 1024 || ((uintptr_t)out8 & 7u)) return cudaErrorInvalidValue;
        return launch_norm_v2<ADD, true>(res, xb, xf, w, eps, n, dim, out, out8, inv, stream);
    }
    if (vec) return launch_norm_v2<ADD, false>(res, xb, xf, w, eps, n, dim, out, nullptr, 0.0f, stream);
    rmsnorm_kernel_v1<ADD><<<dim3((unsigned)n), 256, 0, stream>>>(res, xb, xf, w, eps, dim, out);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t tm_cuda_rmsnorm(const float *x, const float *w, float eps, int32_t n, int32_t dim,
                                       uint16_t *out, cudaStream_t stream) {
    return launch_norm<false>(nullptr, nullptr, x, w, eps, n, dim, out, stream);
}

extern "C" cudaError_t tm_cuda_add_rmsnorm(float *residual, const uint16_t *x, const float *w, float eps, int32_t n,
                                           int32_t dim, uint16_t *out, cudaStream_t stream) {
    return launch_norm<true>(residual, x, nullptr, w, eps, n, dim, out, stream);
}

extern "C" cudaError_t tm_cuda_rmsnorm_fp8(float *residual, const uint16_t *x, const float *xf, const float *w, float eps,
                                          int32_t n, int32_t dim, uint16_t *out, uint8_t *out8, float inv,
                                          cudaStream_t stream) {
    if (!out8) return cudaErrorInvalidValue;
    return residual ? launch_norm<true>(residual, x, nullptr, w, eps, n, dim, out, stream, out8, inv)
                    : launch_norm<false>(nullptr, nullptr, xf, w, eps, n, dim, out, stream, out8, inv);
}
