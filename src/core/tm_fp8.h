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
    const uint32_t E = (b >> 3) & 15u, M = b & 7u;
    float v;
    if (E == 15u && M == 7u) {
        v = NAN;
    } else if (E == 0u) {
        v = (float)M * 0.001953125f; /* M * 2^-9, exact */
    } else {
        const uint32_t u = ((E + 120u) << 23) | (M << 20); /* 2^(E - 7) * (1 + M / 8) */
        memcpy(&v, &u, sizeof v);
    }
    return (b & 0x80u) ? -v : v;
}

/* n e4m3 bytes -> f32 (scalar) */
static inline void tm_fp8_row_to_f32(const uint8_t *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = tm_fp8_to_f32(x[i]);
}

#endif /* TM_FP8_H */
