/* tm_cuda_dequant.cu -- weight dequantization to bf16, embedding lookup (rows by id to f32), supported weight types. */
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"
#include "backend/cuda/tm_cuda_dequant.cuh"

#include <stdlib.h>

/* Both kernels are memory streams. v2 gives each thread one unit of a row (8 to 32 elements, see
 * tm_cuda_dequant.cuh): its loads, then per run of 8 elements one 16-byte store of 8 bf16 (dequant) or two of
 * 4 f32 (embed). Values round exactly like tm_dequant_row (no fused multiply-add), so the results are
 * bit-identical to the CPU. v1 decodes element by element with byte loads (any alignment, any cols);
 * TM_CUDA_DEQUANT_V=1 forces it. */

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

/* ---- dequant to bf16 -------------------------------------------------------------------------------------------- */

/* out (rows, cols) bf16, one element per thread (grid-stride) */
__global__ void dequant_bf16_kernel_v1(const uint8_t *__restrict__ w, int32_t type, int64_t rows, int64_t cols,
                                       int64_t row_bytes, uint16_t *__restrict__ out) {
    const int64_t total = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(tmq::deq_elem(type, w + r * row_bytes, c)));
    }
}

/* out (rows, cols) bf16, one unit per thread (grid-stride over rows * units) */
template <class T>
__global__ void __launch_bounds__(kThreads) dequant_bf16_kernel_v2(const uint8_t *__restrict__ w, int64_t rows,
                                                                   int cols, int64_t row_bytes,
                                                                   uint16_t *__restrict__ out) {
    const int nu = T::units(cols);
    const int64_t total = rows * nu;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nu;
        const int u = (int)(i - r * nu);
        typename T::Raw raw;
        T::load(w + r * row_bytes, u, raw);
        uint16_t *o = out + r * cols;
#pragma unroll
        for (int k = 0; k < T::RUNS; k++) {
            float v[8];
            T::vals(raw, k, v);
            *(uint4 *)(o + T::xoff(u, k)) = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                                       pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
        }
    }
}

/* ---- embedding ------------------------------------------------------------------------------------------------- */

/* row i's id: prev[src[i]] where src has src[i] >= 0 (a pipelined step's ids, drawn by the pass before), else ids[i] */
__device__ __forceinline__ int64_t embed_id(const int32_t *ids, const int32_t *src, const int32_t *prev, int64_t i) {
    const int32_t s = src ? src[i] : -1;
    return s >= 0 ? prev[s] : ids[i];
}

/* x (n, cols) f32 = table[id(i), :] (raw: also bf16); one block per token, one element per thread-iteration */
__global__ void embed_kernel_v1(const uint8_t *__restrict__ table, int32_t type, int64_t cols, int64_t row_bytes,
                                const int32_t *ids, const int32_t *src, const int32_t *prev, float *__restrict__ x,
                                uint16_t *__restrict__ raw) {
    const int64_t i = blockIdx.x;
    const uint8_t *row = table + embed_id(ids, src, prev, i) * row_bytes;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = tmq::deq_elem(type, row, c);
        x[i * cols + c] = v;
        if (raw) raw[i * cols + c] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
}

/* one block per token, one unit per thread-iteration */
template <class T>
__global__ void __launch_bounds__(kThreads) embed_kernel_v2(const uint8_t *__restrict__ table, int cols,
                                                            int64_t row_bytes, const int32_t *ids, const int32_t *src,
                                                            const int32_t *prev, float *__restrict__ x,
                                                            uint16_t *__restrict__ raw) {
    tm_pdl_enter(); /* prev: the previous pass's ids */
    const int64_t i = blockIdx.x;
    const uint8_t *row = table + embed_id(ids, src, prev, i) * row_bytes;
    float *o = x + i * cols;
    uint16_t *ob = raw ? raw + i * cols : nullptr;
    const int nu = T::units(cols);
    for (int u = threadIdx.x; u < nu; u += blockDim.x) {
        typename T::Raw r;
        T::load(row, u, r);
#pragma unroll
        for (int k = 0; k < T::RUNS; k++) {
            float v[8];
            T::vals(r, k, v);
            float4 *p = (float4 *)(o + T::xoff(u, k));
            p[0] = make_float4(v[0], v[1], v[2], v[3]);
            p[1] = make_float4(v[4], v[5], v[6], v[7]);
            if (ob)
                *(uint4 *)(ob + T::xoff(u, k)) = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                                            pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
        }
    }
}

/* true when the unit kernels may read w (ALIGN-aligned base, cols a multiple of 8 for float types) */
bool fast_ok(int32_t type, const void *w, int64_t cols) {
    const int align = tmq::unit_align(type);
    return align > 0 && ((uintptr_t)w % (uintptr_t)align) == 0 && cols % 8 == 0 && cols <= INT32_MAX;
}

unsigned grid_for(int64_t work) {
    int64_t g = (work + kThreads - 1) / kThreads;
    if (g < 1) g = 1;
    if (g > 65535 * 64) g = 65535 * 64; /* grid-stride over the rest */
    return (unsigned)g;
}

} /* namespace */

extern "C" bool tm_cuda_weight_type_supported(int32_t type) {
    tmq::info ti;
    return tmq::type_info(type, &ti);
}

extern "C" cudaError_t tm_cuda_dequant_bf16(const void *w, int32_t type, int64_t rows, int64_t cols, uint16_t *out,
                                            cudaStream_t stream) {
    tmq::info ti;
    /* fp8 rows do not carry their per-tensor scale: only the GEMV (which takes it) and the fp8 GEMM read them */
    if (!w || !out || rows < 0 || cols <= 0 || type == TM_DT_FP8_E4M3 || !tmq::type_info(type, &ti) || cols % ti.qk)
        return cudaErrorInvalidValue;
    if (rows == 0) return cudaSuccess;
    const int64_t row_bytes = cols / ti.qk * ti.bytes;
    const uint8_t *wb = (const uint8_t *)w;
    if (tm_env_is_1("TM_CUDA_DEQUANT_V") || !fast_ok(type, w, cols) || !tm_aligned16(out)) {
        dequant_bf16_kernel_v1<<<grid_for(rows * cols), kThreads, 0, stream>>>(wb, type, rows, cols, row_bytes, out);
        return cudaGetLastError();
    }
    switch (type) {
#define TMQ_LAUNCH(T)                                                                                              \
    dequant_bf16_kernel_v2<T>                                                                                      \
        <<<grid_for(rows * (cols / (int64_t)(T::RUNS * 8))), kThreads, 0, stream>>>(wb, rows, (int)cols, row_bytes, out)
        TMQ_TYPE_CASES(type, TMQ_LAUNCH)
#undef TMQ_LAUNCH
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_embed_ex(const void *table, int32_t type, int64_t cols, const int32_t *ids,
                                        const int32_t *src, const int32_t *prev, int32_t n, float *x, uint16_t *raw,
                                        cudaStream_t stream) {
    tmq::info ti;
    if (!table || !ids || !x || n < 0 || cols <= 0 || type == TM_DT_FP8_E4M3 || !tmq::type_info(type, &ti) ||
        cols % ti.qk || (src && !prev))
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const int64_t row_bytes = cols / ti.qk * ti.bytes;
    const uint8_t *tb = (const uint8_t *)table;
    if (tm_env_is_1("TM_CUDA_DEQUANT_V") || !fast_ok(type, table, cols) || !tm_aligned16(x) ||
        (raw && !tm_aligned16(raw))) {
        embed_kernel_v1<<<n, kThreads, 0, stream>>>(tb, type, cols, row_bytes, ids, src, prev, x, raw);
        return cudaGetLastError();
    }
    switch (type) {
#define TMQ_LAUNCH(T)                                                                                              \
    return tm_launch(embed_kernel_v2<T>, dim3((unsigned)n), dim3(kThreads), 0, stream, tb, (int)cols, row_bytes, ids, \
                     src, prev, x, raw)
        TMQ_TYPE_CASES(type, TMQ_LAUNCH)
#undef TMQ_LAUNCH
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_embed(const void *table, int32_t type, int64_t cols, const int32_t *ids, int32_t n,
                                     float *x, cudaStream_t stream) {
    return tm_cuda_embed_ex(table, type, cols, ids, NULL, NULL, n, x, NULL, stream);
}
