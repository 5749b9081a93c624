/* tm_cuda_elementwise.cu -- SwiGLU, row gather, bf16 <-> f32 and bf16 -> fp8 conversions, device-side random fills. */
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_bf16.cuh"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>

/* Every kernel here is a flat stream over memory: the fast paths move 16 bytes per load/store (8 bf16, or two
 * float4 for the f32 side), each thread handling a few chunks of 8 elements so that several loads are in
 * flight; the scalar paths take any size and alignment. A launcher picks the vector kernel when the pointers
 * are 16-byte aligned (cudaMalloc'd buffers are), and the tail of a length that is not a multiple of 8 is done
 * by the same kernel element by element. TM_CUDA_SWIGLU_V=1 forces the scalar SwiGLU. */

namespace {

using tmbf::bf;
using tmbf::to_bf;
using tmbf::unpack_bf16x8;
using tmbf::pack_bf16x2;
using tmbf::pack_bf16x8;

constexpr int kThreads = 256;
constexpr int kUnroll = 2; /* chunks of 8 per thread in the vector kernels */

/* silu(g) * u in f32: g / (1 + e^-g) with the fast exponential and division (relative error ~1e-6, far below
 * bf16's 4e-3; the IEEE division would cost ~8 more instructions per element). For g < -88, e^-g = inf and
 * __fdividef(g, inf) = g * rcp(inf) = -0, the right limit. */
__device__ __forceinline__ float swiglu1(float g, float u) { return __fdividef(g, 1.0f + __expf(-g)) * u; }

unsigned grid_for(size_t work, size_t per_block) {
    size_t g = (work + per_block - 1) / per_block;
    if (g < 1) g = 1;
    if (g > 65535u * 16u) g = 65535u * 16u; /* the kernels stride over the rest */
    return (unsigned)g;
}

/* ---- SwiGLU ---- */

/* v1: one element per thread and stride */
__global__ void __launch_bounds__(kThreads) swiglu_kernel_v1(const uint16_t *gate, const uint16_t *up, size_t n,
                                                             uint16_t *out) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = to_bf(swiglu1(bf(gate[i]), bf(up[i])));
}

/* v2: kUnroll chunks of 8 per thread (both loads of every chunk issued before any store); plain loads, not the
 * read-only path, because out may alias gate or up (each element is read and written by the same thread) */
__global__ void __launch_bounds__(kThreads) swiglu_kernel_v2(const uint16_t *gate, const uint16_t *up, size_t n,
                                                             uint16_t *out) {
    const size_t nch = n >> 3;
    const uint4 *g4 = reinterpret_cast<const uint4 *>(gate);
    const uint4 *u4 = reinterpret_cast<const uint4 *>(up);
    uint4 *o4 = reinterpret_cast<uint4 *>(out);
    const size_t step = (size_t)gridDim.x * kThreads * kUnroll;
    for (size_t base = (size_t)blockIdx.x * kThreads * kUnroll + threadIdx.x; base < nch; base += step) {
        uint4 gv[kUnroll], uv[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; k++) {
            const size_t c = base + (size_t)k * kThreads;
            if (c < nch) {
                gv[k] = g4[c];
                uv[k] = u4[c];
            }
        }
#pragma unroll
        for (int k = 0; k < kUnroll; k++) {
            const size_t c = base + (size_t)k * kThreads;
            if (c < nch) {
                float g[8], u[8];
                unpack_bf16x8(gv[k], g);
                unpack_bf16x8(uv[k], u);
#pragma unroll
                for (int e = 0; e < 8; e++) g[e] = swiglu1(g[e], u[e]);
                o4[c] = pack_bf16x8(g);
            }
        }
    }
    /* tail (n % 8 elements): the first threads of block 0 */
    if (blockIdx.x == 0 && threadIdx.x < (n & 7)) {
        const size_t i = (nch << 3) + threadIdx.x;
        out[i] = to_bf(swiglu1(bf(gate[i]), bf(up[i])));
    }
}

/* rows: SwiGLU over one fused [gate | up] product, gu (n, 2 ffn) -> out (n, ffn); out8 (optional) the same values
 * as e4m3(out * inv), what tm_cuda_quant_fp8 would make of out (the next fp8 product's input). Block row blockIdx.y;
 * vec: ffn % 8 == 0 and gu, out 16-byte aligned (out8 8-byte), one chunk of 8 a thread; else element by element. */
__global__ void __launch_bounds__(kThreads) swiglu_rows_kernel_v1(const uint16_t *__restrict__ gu, int ffn, bool vec,
                                                                  uint16_t *__restrict__ out,
                                                                  uint8_t *__restrict__ out8, float inv) {
    const size_t row = blockIdx.y;
    const uint16_t *g = gu + row * 2 * (size_t)ffn, *u = g + ffn;
    uint16_t *o = out ? out + row * (size_t)ffn : NULL;
    uint8_t *o8 = out8 ? out8 + row * (size_t)ffn : NULL;
    if (vec) {
        const int c = (int)(blockIdx.x * kThreads + threadIdx.x);
        if (c >= ffn / 8) return;
        float a[8], b[8];
        unpack_bf16x8(__ldg(reinterpret_cast<const uint4 *>(g) + c), a);
        unpack_bf16x8(__ldg(reinterpret_cast<const uint4 *>(u) + c), b);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] = swiglu1(a[e], b[e]);
        const uint4 ov = pack_bf16x8(a);
        if (o) reinterpret_cast<uint4 *>(o)[c] = ov;
        if (o8) reinterpret_cast<uint2 *>(o8)[c] = tm_fp8x8_of_bf16(ov, inv);
        return;
    }
    for (int j = (int)(blockIdx.x * kThreads + threadIdx.x); j < ffn; j += (int)(gridDim.x * kThreads)) {
        const uint16_t h = to_bf(swiglu1(bf(g[j]), bf(u[j])));
        if (o) o[j] = h;
        if (o8) o8[j] = tm_fp8_of(bf(h) * inv);
    }
}

/* ---- row gather ---- */

/* one block per output row; vec: width % 8 == 0 and x, out 16-byte aligned */
__global__ void __launch_bounds__(kThreads) get_rows_kernel_v1(const uint16_t *x, const int32_t *idx, int width,
                                                               bool vec, uint16_t *out) {
    tm_pdl_enter();
    const size_t src = (size_t)idx[blockIdx.x] * (size_t)width, dst = (size_t)blockIdx.x * (size_t)width;
    if (vec) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(x + src);
        uint4 *d4 = reinterpret_cast<uint4 *>(out + dst);
        for (int c = (int)threadIdx.x; c < width / 8; c += kThreads) d4[c] = s4[c];
    } else {
        for (int i = (int)threadIdx.x; i < width; i += kThreads) out[dst + i] = x[src + i];
    }
}

/* ---- conversions ---- */

__global__ void __launch_bounds__(kThreads) bf16_to_f32_kernel_v1(const uint16_t *x, size_t n, bool vec, float *out) {
    const size_t stride = (size_t)gridDim.x * kThreads;
    size_t done = 0;
    if (vec) {
        const size_t nch = n >> 3;
        const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
        float4 *o4 = reinterpret_cast<float4 *>(out);
        /* kUnroll chunks per thread and step, every load issued before the stores */
        for (size_t base = (size_t)blockIdx.x * kThreads * kUnroll + threadIdx.x; base < nch;
             base += stride * kUnroll) {
            uint4 u[kUnroll];
#pragma unroll
            for (int k = 0; k < kUnroll; k++)
                if (base + (size_t)k * kThreads < nch) u[k] = x4[base + (size_t)k * kThreads];
#pragma unroll
            for (int k = 0; k < kUnroll; k++) {
                const size_t c = base + (size_t)k * kThreads;
                if (c < nch) {
                    float f[8];
                    unpack_bf16x8(u[k], f);
                    o4[2 * c] = make_float4(f[0], f[1], f[2], f[3]);
                    o4[2 * c + 1] = make_float4(f[4], f[5], f[6], f[7]);
                }
            }
        }
        done = nch << 3;
    }
    for (size_t i = done + (size_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += stride) out[i] = bf(x[i]);
}

__global__ void __launch_bounds__(kThreads) f32_to_bf16_kernel_v1(const float *x, size_t n, bool vec, uint16_t *out) {
    const size_t stride = (size_t)gridDim.x * kThreads;
    size_t done = 0;
    if (vec) {
        const size_t nch = n >> 3;
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        uint4 *o4 = reinterpret_cast<uint4 *>(out);
        for (size_t c = (size_t)blockIdx.x * kThreads + threadIdx.x; c < nch; c += stride) {
            const float4 a = x4[2 * c], b = x4[2 * c + 1];
            const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            o4[c] = pack_bf16x8(f);
        }
        done = nch << 3;
    }
    for (size_t i = done + (size_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += stride) out[i] = to_bf(x[i]);
}

/* ---- random fill ---- */

/* splitmix64 of seed ^ (index * golden gamma) -> the top 24 bits -> uniform in [-1, 1) (exact in f32) */
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = (seed ^ (i * 0x9e3779b97f4a7c15ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(uint32_t)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T>
__device__ __forceinline__ T from_f32(float f);
template <>
__device__ __forceinline__ float from_f32<float>(float f) { return f; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float f) { return __float2half_rn(f); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
template <>
__device__ __forceinline__ uint8_t from_f32<uint8_t>(float f) { return tm_fp8_of(f); } /* e4m3 */

template <typename T>
__global__ void __launch_bounds__(kThreads) fill_random_kernel_v1(T *dst, size_t n, uint64_t seed, float scale,
                                                                  float constant) {
    const size_t stride = (size_t)gridDim.x * kThreads;
    for (size_t i = (size_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += stride)
        dst[i] = from_f32<T>(constant != 0.0f ? constant : scale * hash_uniform(seed, i));
}

/* ---- bf16 -> fp8 (the activations of an fp8 GEMM) ---- */

/* out = e4m3(x * inv): kUnroll chunks of 8 per thread (16-byte loads, 8-byte stores) when vec, then the tail (or
 * everything) element by element */
__global__ void __launch_bounds__(kThreads) quant_fp8_kernel_v1(const uint16_t *__restrict__ x, size_t n, float inv,
                                                                bool vec, uint8_t *__restrict__ out) {
    const size_t stride = (size_t)gridDim.x * kThreads;
    size_t done = 0;
    if (vec) {
        const size_t nch = n >> 3;
        const uint4 *x4 = reinterpret_cast<const uint4 *>(x);
        uint2 *o2 = reinterpret_cast<uint2 *>(out);
        for (size_t c = (size_t)blockIdx.x * kThreads + threadIdx.x; c < nch; c += stride)
            o2[c] = tm_fp8x8_of_bf16(__ldg(x4 + c), inv);
        done = nch << 3;
    }
    for (size_t i = done + (size_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += stride)
        out[i] = tm_fp8_of(bf(x[i]) * inv);
}

/* ---- XOR of a buffer's 32-bit words: a read-only stream (tb_ceiling's read ceiling) ---- */

constexpr int kXorThreads = 512, kXorUnroll = 4; /* 4 CTAs of 512 an SM, 4 loads of 16 bytes in flight a thread */

__global__ void __launch_bounds__(kXorThreads) xor_u32_kernel_v1(const uint4 *__restrict__ p, size_t n16,
                                                                 unsigned *__restrict__ out) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * kXorThreads * kXorUnroll;
    for (size_t i = (size_t)blockIdx.x * kXorThreads * kXorUnroll + threadIdx.x; i < n16; i += stride) {
        uint4 v[kXorUnroll];
#pragma unroll
        for (int u = 0; u < kXorUnroll; u++) {
            const size_t j = i + (size_t)u * kXorThreads;
            v[u] = j < n16 ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kXorUnroll; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc) atomicXor(out, acc);
}

} // namespace

extern "C" cudaError_t tm_cuda_xor_u32(const void *p, size_t bytes, uint32_t *out, cudaStream_t stream) {
    if (!p || !out || (bytes & 15) || !tm_aligned16(p)) return cudaErrorInvalidValue;
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof *out, stream);
    if (e != cudaSuccess || bytes == 0) return e;
    int dev = 0, sms = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    const size_t n16 = bytes / 16, per_cta = (size_t)kXorThreads * kXorUnroll;
    size_t grid = (n16 + per_cta - 1) / per_cta;
    if (grid > (size_t)sms * 4) grid = (size_t)sms * 4;
    xor_u32_kernel_v1<<<(unsigned)grid, kXorThreads, 0, stream>>>((const uint4 *)p, n16, (unsigned *)out);
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_quant_fp8(const uint16_t *x, size_t n, float inv, uint8_t *out, cudaStream_t stream) {
    if (!x || !out || !(inv > 0.0f)) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const bool vec = tm_aligned16(x) && ((uintptr_t)out & 7u) == 0;
    quant_fp8_kernel_v1<<<grid_for(vec && n >= 8 ? n / 8 : n, kThreads), kThreads, 0, stream>>>(x, n, inv, vec, out);
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_swiglu(const uint16_t *gate, const uint16_t *up, int32_t n, int32_t ffn, uint16_t *out,
                                      cudaStream_t stream) {
    if (n < 0 || ffn < 0 || !gate || !up || !out) return cudaErrorInvalidValue;
    const size_t total = (size_t)n * (size_t)ffn; /* rows are contiguous: one flat stream */
    if (total == 0) return cudaSuccess;
    if (tm_aligned16(gate) && tm_aligned16(up) && tm_aligned16(out) && !tm_env_is_1("TM_CUDA_SWIGLU_V"))
        swiglu_kernel_v2<<<grid_for(total / 8 ? total / 8 : 1, (size_t)kThreads * kUnroll), kThreads, 0, stream>>>(
            gate, up, total, out);
    else
        swiglu_kernel_v1<<<grid_for(total, kThreads), kThreads, 0, stream>>>(gate, up, total, out);
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_swiglu_rows(const uint16_t *gu, int32_t n, int32_t ffn, uint16_t *out, uint8_t *out8,
                                           float inv, cudaStream_t stream) {
    if (n < 0 || ffn < 0 || !gu || (!out && !out8) || (out8 && !(inv > 0.0f))) return cudaErrorInvalidValue;
    if (n == 0 || ffn == 0) return cudaSuccess;
    const bool vec = ffn % 8 == 0 && tm_aligned16(gu) && tm_aligned16(out) && ((uintptr_t)out8 & 7u) == 0;
    const unsigned bx = vec ? (unsigned)((ffn / 8 + kThreads - 1) / kThreads) : grid_for((size_t)ffn, kThreads);
    for (int32_t r = 0; r < n; r += 65535) { /* grid rows: at most 65535 a launch */
        const int32_t rows = n - r < 65535 ? n - r : 65535;
        swiglu_rows_kernel_v1<<<dim3(bx, (unsigned)rows), kThreads, 0, stream>>>(
            gu + (size_t)r * 2 * (size_t)ffn, ffn, vec, out ? out + (size_t)r * (size_t)ffn : NULL,
            out8 ? out8 + (size_t)r * (size_t)ffn : NULL, inv);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_get_rows(const uint16_t *x, const int32_t *idx, int32_t n_idx, int32_t width,
                                        uint16_t *out, cudaStream_t stream) {
    if (n_idx < 0 || width < 0 || !x || !idx || !out) return cudaErrorInvalidValue;
    if (n_idx == 0 || width == 0) return cudaSuccess;
    const bool vec = width % 8 == 0 && tm_aligned16(x) && tm_aligned16(out);
    return tm_launch(get_rows_kernel_v1, dim3((unsigned)n_idx), dim3(kThreads), 0, stream, x, idx, width, vec, out);
}

extern "C" cudaError_t tm_cuda_bf16_to_f32(const uint16_t *x, size_t n, float *out, cudaStream_t stream) {
    if (!x || !out) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const bool vec = tm_aligned16(x) && tm_aligned16(out);
    bf16_to_f32_kernel_v1<<<grid_for(vec && n >= 8 ? n / 8 : n, (size_t)kThreads * (vec ? kUnroll : 1)), kThreads, 0,
                            stream>>>(x, n, vec, out);
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_f32_to_bf16(const float *x, size_t n, uint16_t *out, cudaStream_t stream) {
    if (!x || !out) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const bool vec = tm_aligned16(x) && tm_aligned16(out);
    f32_to_bf16_kernel_v1<<<grid_for(vec && n >= 8 ? n / 8 : n, kThreads), kThreads, 0, stream>>>(x, n, vec, out);
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_fill_random(void *dst, int32_t type, size_t n, uint64_t seed, float scale,
                                           float constant, cudaStream_t stream) {
    if (!dst) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const unsigned grid = grid_for(n, kThreads);
    switch (type) {
    case TM_DT_F32:
        fill_random_kernel_v1<float><<<grid, kThreads, 0, stream>>>((float *)dst, n, seed, scale, constant);
        break;
    case TM_DT_F16:
        fill_random_kernel_v1<__half><<<grid, kThreads, 0, stream>>>((__half *)dst, n, seed, scale, constant);
        break;
    case TM_DT_BF16:
        fill_random_kernel_v1<__nv_bfloat16><<<grid, kThreads, 0, stream>>>((__nv_bfloat16 *)dst, n, seed, scale,
                                                                             constant);
        break;
    case TM_DT_FP8_E4M3:
        fill_random_kernel_v1<uint8_t><<<grid, kThreads, 0, stream>>>((uint8_t *)dst, n, seed, scale, constant);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
