/* tm_cuda_fp8.cuh -- fp8 e4m3 KV-cache elements on the device: stores round the f32 value (itself from the bf16
 * the unquantized path would store) to nearest even and saturate at +-448; loads widen exactly (every e4m3 value
 * is a bf16 value). Host twins: src/core/tm_fp8.h. */
#ifndef TM_CUDA_FP8_CUH
#define TM_CUDA_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

__device__ __forceinline__ uint8_t tm_fp8_of(float f) {
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}
/* two values -> two bytes (lo in the low byte) */
__device__ __forceinline__ uint16_t tm_fp8x2_of(float lo, float hi) {
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float tm_fp8_to_f32(uint8_t b) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}
/* two e4m3 bytes (bits 0..15 of two, the low byte first) -> f16x2 bits (exact: one conversion) */
__device__ __forceinline__ uint32_t tm_fp8x2_to_f16x2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
/* the low (high) two e4m3 bytes of a word -> f16x2 bits (exact); the high half is read as the register's upper
 * 16 bits by the conversion itself (F2FP ... R.H1), no shift */
__device__ __forceinline__ uint32_t tm_fp8x2_lo_to_f16x2(uint32_t w) {
    uint32_t r;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(r) : "r"(w));
    return r;
}
__device__ __forceinline__ uint32_t tm_fp8x2_hi_to_f16x2(uint32_t w) {
    uint32_t r;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(r) : "r"(w));
    return r;
}
/* two e4m3 bytes (lo byte first) -> bf16x2 bits (exact) */
__device__ __forceinline__ uint32_t tm_fp8x2_to_bf16x2(uint16_t two) {
    const uint32_t h = tm_fp8x2_to_f16x2(two);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return (uint32_t)__bfloat16_as_ushort(b.x) | ((uint32_t)__bfloat16_as_ushort(b.y) << 16);
}
/* 16 e4m3 bytes -> 16 bf16 (lo: elements 0..7, hi: 8..15) */
__device__ __forceinline__ void tm_fp8x16_to_bf16(uint4 in, uint4 &lo, uint4 &hi) {
    const uint32_t w[4] = {in.x, in.y, in.z, in.w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = tm_fp8x2_to_bf16x2((uint16_t)(w[i] & 0xffffu));
        o[2 * i + 1] = tm_fp8x2_to_bf16x2((uint16_t)(w[i] >> 16));
    }
    lo = make_uint4(o[0], o[1], o[2], o[3]);
    hi = make_uint4(o[4], o[5], o[6], o[7]);
}

/* W8A8 activations: the eight bf16 of a 16-byte item times inv (1 / act_scale, a power of two: exact), each rounded
 * to e4m3 (nearest even, saturating at +-448) and widened back to f32 (exact) */
__device__ __forceinline__ void tm_fp8_round8(uint4 u, float inv, float *out) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t h =
            tm_fp8x2_to_f16x2(tm_fp8x2_of(__uint_as_float(w[i] << 16) * inv, __uint_as_float(w[i] & 0xffff0000u) * inv));
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

/* eight bf16 (a 16-byte item), each times mul (the cache writers: 1, folded away; an fp8 GEMM's activations:
 * 1 / act_scale) -> eight e4m3 bytes (an 8-byte store) */
__device__ __forceinline__ uint2 tm_fp8x8_of_bf16(uint4 u, float mul = 1.0f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    uint32_t o[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint16_t a =
            tm_fp8x2_of(__uint_as_float(w[2 * i] << 16) * mul, __uint_as_float(w[2 * i] & 0xffff0000u) * mul);
        const uint16_t b =
            tm_fp8x2_of(__uint_as_float(w[2 * i + 1] << 16) * mul, __uint_as_float(w[2 * i + 1] & 0xffff0000u) * mul);
        o[i] = (uint32_t)a | ((uint32_t)b << 16);
    }
    return make_uint2(o[0], o[1]);
}

/* store the 16-byte bf16 item u at element e of a cache of bf16 elements or (fp8) e4m3 bytes */
__device__ __forceinline__ void tm_kv_store8(uint16_t *cache, size_t e, uint4 u, bool fp8) {
    if (fp8)
        *reinterpret_cast<uint2 *>(reinterpret_cast<uint8_t *>(cache) + e) = tm_fp8x8_of_bf16(u);
    else
        *reinterpret_cast<uint4 *>(cache + e) = u;
}

/* the bf16 values a cache holds for the item u: u itself, or (fp8) u rounded to e4m3 and widened back (exact) */
__device__ __forceinline__ uint4 tm_kv_held8(uint4 u, bool fp8) {
    if (!fp8) return u;
    const uint2 b = tm_fp8x8_of_bf16(u);
    return make_uint4(tm_fp8x2_to_bf16x2((uint16_t)(b.x & 0xffffu)), tm_fp8x2_to_bf16x2((uint16_t)(b.x >> 16)),
                      tm_fp8x2_to_bf16x2((uint16_t)(b.y & 0xffffu)), tm_fp8x2_to_bf16x2((uint16_t)(b.y >> 16)));
}
__device__ __forceinline__ uint16_t tm_kv_held1(uint16_t bf16_bits, bool fp8) {
    if (!fp8) return bf16_bits;
    return (uint16_t)(tm_fp8x2_to_bf16x2(tm_fp8_of(__uint_as_float((uint32_t)bf16_bits << 16))) & 0xffffu);
}

/* store one bf16 value (bits) at element e of a bf16 or e4m3 cache */
__device__ __forceinline__ void tm_kv_store1(uint16_t *cache, size_t e, uint16_t bf16_bits, bool fp8) {
    if (fp8)
        reinterpret_cast<uint8_t *>(cache)[e] = tm_fp8_of(__uint_as_float((uint32_t)bf16_bits << 16));
    else
        cache[e] = bf16_bits;
}

#endif /* TM_CUDA_FP8_CUH */
