/* tm_cuda_bf16.cuh -- bf16 bit-pattern helpers shared by the CUDA kernels: scalar and 16-byte (8-value) packs. */
#ifndef TM_CUDA_BF16_CUH
#define TM_CUDA_BF16_CUH

#include <cuda_bf16.h>
#include <stdint.h>

namespace tmbf {

/* bf16 bits -> f32 (exact) */
__device__ __forceinline__ float bf(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* f32 -> bf16 bits, round to nearest even */
__device__ __forceinline__ uint16_t to_bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/* eight bf16 values of a 16-byte load -> f32 */
__device__ __forceinline__ void unpack_bf16x8(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(h.x) | ((uint32_t)__bfloat16_as_ushort(h.y) << 16);
}

/* eight f32 -> one 16-byte store of bf16 */
__device__ __forceinline__ uint4 pack_bf16x8(const float f[8]) {
    return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                      pack_bf16x2(f[6], f[7]));
}

} // namespace tmbf

#endif /* TM_CUDA_BF16_CUH */
