/* tm_fp8.h -- OCP fp8 e4m3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, 0x7f/0xff NaN,
 * largest finite 448, smallest subnormal 2^-9), the 8-bit KV-cache element. Conversions on the host, bit-exact
 * with the CUDA intrinsics the kernels use (__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round to nearest
 * even, finite values beyond 448 saturate to +-448). */
#ifndef TM_FP8_H
#define TM_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint8_t tm_fp8_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (isnan(f)) return (uint8_t)(sign | 0x7fu);
    const float a = fabsf(f);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7eu); /* saturate (also +-inf) */
    int e;
    const float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    if (a == 0.0f || e - 1 < -6) { /* subnormal range: multiples of 2^-9 (8 of them reach 2^-6, the first normal) */
        const float q = nearbyintf(a * 512.0f);
        return (uint8_t)(sign | (uint8_t)q);
    }
    e -= 1; /* a = (2 m) * 2^e, 2 m in [1, 2) */
    float q = nearbyintf((2.0f * m - 1.0f) * 8.0f);
    if (q >= 8.0f) {
        q = 0.0f;
        e++;
    }
    if (e + 7 > 15 || (e + 7 == 15 && q >= 7.0f)) return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | (uint8_t)((e + 7) << 3) | (uint8_t)q);
}

static inline float tm_fp8_to_f32(uint8_t b) {
    const int E = (b >> 3) & 15, M = b & 7;
    float v;
    if (E == 15 && M == 7) v = NAN;
    else if (E == 0) v = ldexpf((float)M, -9);
    else v = ldexpf(1.0f + (float)M / 8.0f, E - 7);
    return (b & 0x80u) ? -v : v;
}

#endif /* TM_FP8_H */
