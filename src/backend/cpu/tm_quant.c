/* tm_quant.c -- reference (de)quantization of GGUF block types, scalar dot kernels, ops tables and dispatch. */
#include "backend/cpu/tm_quant.h"
#include "core/tm_fp8.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* dequantization must round like ggml: no fused multiply-add */
#endif

/* ---- small helpers ------------------------------------------------------------------------------ */

/* fp16 -> f32 without branches on the exponent (exact for every non-NaN input; NaNs stay NaN). */
static inline float f16_fast(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    uint32_t u = (two_w >> 4) + (0xE0u << 23);
    float normalized;
    memcpy(&normalized, &u, 4);
    normalized *= 0x1.0p-112f;
    u = (two_w >> 17) | (126u << 23);
    float denormalized;
    memcpy(&denormalized, &u, 4);
    denormalized -= 0.5f;
    uint32_t rn, rd;
    memcpy(&rn, &normalized, 4);
    memcpy(&rd, &denormalized, 4);
    const uint32_t den = 0u - (uint32_t)(two_w < (1u << 27)); /* all ones for zero/subnormal inputs */
    const uint32_t r = sign | (rd & den) | (rn & ~den);
    float f;
    memcpy(&f, &r, 4);
    return f;
}

/* round half to even for |v| < 2^22 (ggml's nearest_int / _MM_ROUND_NEAREST) */
static inline int round_even(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static inline uint16_t u16le(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Q4_K's 12 packed bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4). */
static inline void q4k_scales(const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- reference dequantization -------------------------------------------------------------------- */

static void deq_q8_0(const tm_block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tm_f16_to_f32(x[i].d);
        for (int j = 0; j < TM_QK8_0; j++) y[i * TM_QK8_0 + j] = (float)x[i].qs[j] * d;
    }
}

static void deq_q8_1(const tm_block_q8_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tm_f16_to_f32(x[i].d);
        for (int j = 0; j < TM_QK8_1; j++) y[i * TM_QK8_1 + j] = (float)x[i].qs[j] * d;
    }
}

static void deq_q4_0(const tm_block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tm_f16_to_f32(x[i].d);
        float *o = y + i * TM_QK4_0;
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            o[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            o[j + TM_QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const tm_block_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tm_f16_to_f32(x[i].d), m = tm_f16_to_f32(x[i].m);
        float *o = y + i * TM_QK4_1;
        for (int j = 0; j < TM_QK4_1 / 2; j++) {
            o[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            o[j + TM_QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q4_K(const tm_block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tm_f16_to_f32(x[i].d), dmin = tm_f16_to_f32(x[i].dmin);
        uint8_t sc[8], mn[8];
        q4k_scales(x[i].scales, sc, mn);
        const uint8_t *q = x[i].qs;
        float *o = y + i * TM_QK_K;
        for (int j = 0; j < 4; j++) { /* 64 elements: 32 low nibbles (sub-block 2j), 32 high (2j+1) */
            const float d1 = d * (float)sc[2 * j], m1 = dmin * (float)mn[2 * j];
            const float d2 = d * (float)sc[2 * j + 1], m2 = dmin * (float)mn[2 * j + 1];
            for (int l = 0; l < 32; l++) o[64 * j + l] = d1 * (float)(q[32 * j + l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) o[64 * j + 32 + l] = d2 * (float)(q[32 * j + l] >> 4) - m2;
        }
    }
}

static void deq_q6_K(const tm_block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = tm_f16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        float *o = y + i * TM_QK_K;
        for (int h = 0; h < 2; h++) { /* two halves of 128 elements */
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                o[l] = d * (float)sc[is + 0] * (float)q1;
                o[l + 32] = d * (float)sc[is + 2] * (float)q2;
                o[l + 64] = d * (float)sc[is + 4] * (float)q3;
                o[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            o += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

static void deq_q8_K(const tm_block_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < TM_QK_K; j++) y[i * TM_QK_K + j] = x[i].d * (float)x[i].qs[j];
}

void tm_dequant_row(tm_dtype t, const void *src, float *dst, int64_t n) {
    const tm_dtype_info *info = tm_dtype_get((uint32_t)t);
    if (!info || n <= 0 || n % info->block) return;
    const int64_t nb = n / info->block;
    const uint8_t *s = src;
    switch (t) {
    case TM_DT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TM_DT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = tm_f16_to_f32(u16le(s + 2 * i));
        break;
    case TM_DT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = tm_bf16_to_f32(u16le(s + 2 * i));
        break;
    case TM_DT_Q8_0: deq_q8_0(src, dst, nb); break;
    case TM_DT_Q8_1: deq_q8_1(src, dst, nb); break;
    case TM_DT_Q4_0: deq_q4_0(src, dst, nb); break;
    case TM_DT_Q4_1: deq_q4_1(src, dst, nb); break;
    case TM_DT_Q4_K: deq_q4_K(src, dst, nb); break;
    case TM_DT_Q6_K: deq_q6_K(src, dst, nb); break;
    case TM_DT_Q8_K: deq_q8_K(src, dst, nb); break;
    case TM_DT_FP8_E4M3: tm_fp8_row_to_f32(s, dst, n); break; /* the e4m3 values; a weight's scale is the caller's */
    default: break;
    }
}

/* ---- reference quantization (weights) ------------------------------------------------------------ */

/* ggml's quantize_row_q8_0_ref: d = amax/127, q = roundf(x / d) */
static void quant_q8_0_ref(const float *x, tm_block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TM_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < TM_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tm_f32_to_f16(d);
        for (int j = 0; j < TM_QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ggml's quantize_row_q8_1_ref: like q8_0 plus s = sum(q) * d */
static void quant_q8_1_ref(const float *x, tm_block_q8_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TM_QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < TM_QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < TM_QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = tm_f32_to_f16(d);
        y[i].s = tm_f32_to_f16((float)sum * d);
    }
}

/* ggml's quantize_row_q4_0_ref: the value of largest magnitude maps to -8 */
static void quant_q4_0_ref(const float *x, tm_block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TM_QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < TM_QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tm_f32_to_f16(d);
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[j + TM_QK4_0 / 2] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ggml's quantize_row_q4_1_ref: x = d * q + m with m = block min */
static void quant_q4_1_ref(const float *x, tm_block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TM_QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < TM_QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tm_f32_to_f16(d);
        y[i].m = tm_f32_to_f16(min);
        for (int j = 0; j < TM_QK4_1 / 2; j++) {
            int q0 = (int)(int8_t)((x[j] - min) * id + 0.5f);
            int q1 = (int)(int8_t)((x[j + TM_QK4_1 / 2] - min) * id + 0.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K: per 32-element sub-block x ~ d*sc*q - dmin*m with q in 0..15 and 6-bit sc, m. Not ggml's iterative
 * search, but valid blocks whose range always covers the sub-block (scales and mins rounded outwards). */
static void quant_q4_K(const float *x, tm_block_q4_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TM_QK_K) {
        float mins[8], need[8], max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = 0.0f, hi = -FLT_MAX;
            for (int l = 0; l < 32; l++) {
                lo = fminf(lo, x[32 * j + l]);
                hi = fmaxf(hi, x[32 * j + l]);
            }
            mins[j] = -lo; /* >= 0 */
            need[j] = hi;
            max_min = fmaxf(max_min, mins[j]);
        }
        /* 6-bit mins, rounded up so -dmin*m <= the sub-block minimum */
        float dmin = max_min / 63.0f;
        uint16_t dmin16 = tm_f32_to_f16(dmin);
        dmin = tm_f16_to_f32(dmin16);
        uint8_t lm[8], ls[8];
        float max_scale = 0.0f;
        for (int j = 0; j < 8; j++) {
            lm[j] = dmin > 0.0f ? (uint8_t)clampi((int)ceilf(mins[j] / dmin - 1e-4f), 0, 63) : 0;
            need[j] = (need[j] + dmin * (float)lm[j]) / 15.0f; /* scale needed to reach the sub-block max */
            if (need[j] < 0.0f) need[j] = 0.0f;
            max_scale = fmaxf(max_scale, need[j]);
        }
        float d = max_scale / 63.0f;
        uint16_t d16 = tm_f32_to_f16(d);
        d = tm_f16_to_f32(d16);
        for (int j = 0; j < 8; j++) ls[j] = d > 0.0f ? (uint8_t)clampi((int)ceilf(need[j] / d - 1e-4f), 0, 63) : 0;
        y[i].d = d16;
        y[i].dmin = dmin16;
        memset(y[i].scales, 0, sizeof y[i].scales);
        for (int j = 0; j < 4; j++) {
            y[i].scales[j] = ls[j];
            y[i].scales[j + 4] = lm[j];
        }
        for (int j = 4; j < 8; j++) {
            y[i].scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            y[i].scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            y[i].scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
        uint8_t q[TM_QK_K];
        for (int j = 0; j < 8; j++) {
            const float ds = d * (float)ls[j], dm = dmin * (float)lm[j];
            const float ids = ds > 0.0f ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 32; l++)
                q[32 * j + l] = (uint8_t)clampi((int)lrintf((x[32 * j + l] + dm) * ids), 0, 15);
        }
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * j + l] = (uint8_t)(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
    }
}

/* Q6_K: per 16-element sub-block x ~ d*sc*(q-32) with signed 8-bit sc; the value of largest magnitude
 * maps to -32 (like Q4_0), the sub-block scales share one fp16 d. */
static void quant_q6_K(const float *x, tm_block_q6_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TM_QK_K) {
        float s[16], amax_s = 0.0f;
        int imax = 0;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f, max = 0.0f;
            for (int l = 0; l < 16; l++) {
                if (amax < fabsf(x[16 * j + l])) {
                    amax = fabsf(x[16 * j + l]);
                    max = x[16 * j + l];
                }
            }
            s[j] = max / -32.0f;
            if (fabsf(s[j]) > amax_s) {
                amax_s = fabsf(s[j]);
                imax = j;
            }
        }
        /* the largest sub-scale maps to -128 .. 127: use -128 for the extreme one when it is negative */
        float d = s[imax] < 0.0f ? s[imax] / -128.0f : s[imax] / 127.0f;
        uint16_t d16 = tm_f32_to_f16(d);
        d = tm_f16_to_f32(d16);
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        uint8_t L[TM_QK_K];
        for (int j = 0; j < 16; j++) {
            int sc = clampi(round_even(s[j] * id), -128, 127);
            y[i].scales[j] = (int8_t)sc;
            const float ds = d * (float)sc;
            const float ids = ds != 0.0f ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)(clampi(round_even(x[16 * j + l] * ids), -32, 31) + 32);
        }
        y[i].d = d16;
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int h = 0; h < TM_QK_K; h += 128) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[h + l], q2 = L[h + l + 32], q3 = L[h + l + 64], q4 = L[h + l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}

void tm_quant_row(tm_dtype t, const float *src, void *dst, int64_t n) {
    const tm_dtype_info *info = tm_dtype_get((uint32_t)t);
    if (!info || n <= 0 || n % info->block) return;
    const int64_t nb = n / info->block;
    uint8_t *d = dst;
    switch (t) {
    case TM_DT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TM_DT_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = tm_f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case TM_DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = tm_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case TM_DT_Q8_0: quant_q8_0_ref(src, dst, nb); break;
    case TM_DT_Q8_1: quant_q8_1_ref(src, dst, nb); break;
    case TM_DT_Q4_0: quant_q4_0_ref(src, dst, nb); break;
    case TM_DT_Q4_1: quant_q4_1_ref(src, dst, nb); break;
    case TM_DT_Q4_K: quant_q4_K(src, dst, nb); break;
    case TM_DT_Q6_K: quant_q6_K(src, dst, nb); break;
    case TM_DT_Q8_K: tm_quant_act_q8_K(src, dst, n); break;
    case TM_DT_FP8_E4M3: /* each value rounded to e4m3 (nearest even, saturating at +-448); no scale */
        for (int64_t i = 0; i < n; i++) d[i] = tm_fp8_from_f32(src[i]);
        break;
    default: break;
    }
}

/* ---- activation quantizers (shared by scalar and AVX2 tables; AVX2 has bit-identical twins) ------ */

static float block_amax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

void tm_quant_act_q8_0(const float *x, void *vy, int64_t n) {
    tm_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / TM_QK8_0; i++, x += TM_QK8_0) {
        const float amax = block_amax(x, TM_QK8_0);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = tm_f32_to_f16(amax / 127.0f);
        for (int j = 0; j < TM_QK8_0; j++) y[i].qs[j] = (int8_t)round_even(x[j] * id);
    }
}

void tm_quant_act_q8_1(const float *x, void *vy, int64_t n) {
    tm_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / TM_QK8_1; i++, x += TM_QK8_1) {
        const float amax = block_amax(x, TM_QK8_1);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < TM_QK8_1; j++) {
            y[i].qs[j] = (int8_t)round_even(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = tm_f32_to_f16(d);
        y[i].s = tm_f32_to_f16(d * (float)sum);
    }
}

/* ggml's quantize_row_q8_K_ref: the value of largest magnitude maps to -127, d = 1/iscale (f32) */
void tm_quant_act_q8_K(const float *x, void *vy, int64_t n) {
    tm_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / TM_QK_K; i++, x += TM_QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < TM_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < TM_QK_K; j++) {
            int v = round_even(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < TM_QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

static void act_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

/* ---- scalar dot kernels -------------------------------------------------------------------------- */

static float dot_f32(int64_t n, const void *vw, const void *va) {
    const float *w = vw, *a = va;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += w[i + k] * a[i + k];
    for (; i < n; i++) s[0] += w[i] * a[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static float dot_f16(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += f16_fast(w[i + k]) * a[i + k];
    for (; i < n; i++) s[0] += f16_fast(w[i]) * a[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static float dot_bf16(int64_t n, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += tm_bf16_to_f32(w[i + k]) * a[i + k];
    for (; i < n; i++) s[0] += tm_bf16_to_f32(w[i]) * a[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static float dot_q8_0(int64_t n, const void *vw, const void *va) {
    const tm_block_q8_0 *x = vw, *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < TM_QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += (float)sumi * (f16_fast(x[i].d) * f16_fast(y[i].d));
    }
    return sumf;
}

static float dot_q4_0(int64_t n, const void *vw, const void *va) {
    const tm_block_q4_0 *x = vw;
    const tm_block_q8_0 *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + TM_QK4_0 / 2];
        }
        sumf += (float)sumi * (f16_fast(x[i].d) * f16_fast(y[i].d));
    }
    return sumf;
}

static float dot_q4_1(int64_t n, const void *vw, const void *va) {
    const tm_block_q4_1 *x = vw;
    const tm_block_q8_1 *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK4_1; i++) {
        int sumi = 0;
        for (int j = 0; j < TM_QK4_1 / 2; j++) {
            sumi += (x[i].qs[j] & 0xF) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + TM_QK4_1 / 2];
        }
        sumf += (float)sumi * (f16_fast(x[i].d) * f16_fast(y[i].d)) + f16_fast(x[i].m) * f16_fast(y[i].s);
    }
    return sumf;
}

static float dot_q4_K(int64_t n, const void *vw, const void *va) {
    const tm_block_q4_K *x = vw;
    const tm_block_q8_K *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        uint8_t sc[8], mn[8];
        q4k_scales(x[i].scales, sc, mn);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 4; j++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q[32 * j + l] & 0xF) * a[64 * j + l];
                s1 += (q[32 * j + l] >> 4) * a[64 * j + 32 + l];
            }
            sumi += s0 * sc[2 * j] + s1 * sc[2 * j + 1];
        }
        for (int j = 0; j < 8; j++) summ += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sumf += y[i].d * f16_fast(x[i].d) * (float)sumi - y[i].d * f16_fast(x[i].dmin) * (float)summ;
    }
    return sumf;
}

static float dot_q6_K(int64_t n, const void *vw, const void *va) {
    const tm_block_q6_K *x = vw;
    const tm_block_q8_K *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        /* unpack to signed 6-bit values first: the per-sub-block loops below then vectorize */
        int8_t q[TM_QK_K];
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        for (int h = 0; h < 2; h++) {
            int8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (int8_t)((int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                o[l + 32] = (int8_t)((int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                o[l + 64] = (int8_t)((int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                o[l + 96] = (int8_t)((int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            ql += 64;
            qh += 32;
        }
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int sub = 0;
            for (int l = 0; l < 16; l++) sub += q[16 * j + l] * y[i].qs[16 * j + l];
            sumi += sub * x[i].scales[j];
        }
        sumf += y[i].d * f16_fast(x[i].d) * (float)sumi;
    }
    return sumf;
}

TM_GENERIC_MAT_DOT(mat_f32, dot_f32)
TM_GENERIC_MAT_DOT(mat_f16, dot_f16)
TM_GENERIC_MAT_DOT(mat_bf16, dot_bf16)
TM_GENERIC_MAT_DOT(mat_q8_0, dot_q8_0)
TM_GENERIC_MAT_DOT(mat_q4_0, dot_q4_0)
TM_GENERIC_MAT_DOT(mat_q4_1, dot_q4_1)
TM_GENERIC_MAT_DOT(mat_q4_K, dot_q4_K)
TM_GENERIC_MAT_DOT(mat_q6_K, dot_q6_K)

/* ---- tables and dispatch ------------------------------------------------------------------------- */

static const tm_quant_ops k_scalar[] = {
    {TM_DT_F32, TM_DT_F32, act_f32, dot_f32, mat_f32},
    {TM_DT_F16, TM_DT_F32, act_f32, dot_f16, mat_f16},
    {TM_DT_BF16, TM_DT_F32, act_f32, dot_bf16, mat_bf16},
    {TM_DT_Q8_0, TM_DT_Q8_0, tm_quant_act_q8_0, dot_q8_0, mat_q8_0},
    {TM_DT_Q4_0, TM_DT_Q8_0, tm_quant_act_q8_0, dot_q4_0, mat_q4_0},
    {TM_DT_Q4_1, TM_DT_Q8_1, tm_quant_act_q8_1, dot_q4_1, mat_q4_1},
    {TM_DT_Q4_K, TM_DT_Q8_K, tm_quant_act_q8_K, dot_q4_K, mat_q4_K},
    {TM_DT_Q6_K, TM_DT_Q8_K, tm_quant_act_q8_K, dot_q6_K, mat_q6_K},
};

const tm_quant_ops *tm_quant_ops_get_isa(tm_dtype t, tm_isa isa) {
    if (isa == TM_ISA_AVX2) return tm_quant_ops_avx2(t);
    if (isa != TM_ISA_SCALAR) return NULL;
    return tm_quant_ops_find(k_scalar, sizeof k_scalar / sizeof k_scalar[0], t);
}

const tm_quant_ops *tm_quant_ops_get(tm_dtype t) {
    if (tm_cpu_use_avx2()) {
        const tm_quant_ops *o = tm_quant_ops_avx2(t);
        if (o) return o;
    }
    return tm_quant_ops_get_isa(t, TM_ISA_SCALAR);
}

tm_mat_dot_x4_fn tm_quant_x4_get(tm_dtype t) { return tm_cpu_use_avx2() ? tm_quant_x4_avx2(t) : NULL; }

/* ---- the 8-bit decode layout (x4) ------------------------------------------------------------------ */

void tm_quant_x4_pack(tm_dtype t, int64_t rows, int64_t cols, const void *src, void *dst) {
    if (t == TM_DT_Q4_K) { /* super-block i of rows 0..3, one after another */
        const size_t sb = sizeof(tm_block_q4_K), nb = (size_t)cols / TM_QK_K, rb = nb * sb;
        for (int64_t g = 0; g < rows / 4; g++)
            for (size_t i = 0; i < nb; i++)
                for (size_t r = 0; r < 4; r++)
                    memcpy((uint8_t *)dst + (size_t)g * 4 * rb + (4 * i + r) * sb,
                           (const uint8_t *)src + ((size_t)g * 4 + r) * rb + i * sb, sb);
        return;
    }
    const size_t wb = t == TM_DT_Q8_0   ? sizeof(tm_block_q8_0)
                      : t == TM_DT_Q4_0 ? sizeof(tm_block_q4_0)
                                        : sizeof(tm_block_q4_1);
    const size_t sb = t == TM_DT_Q4_1 ? 4 : 2;     /* scale bytes per block: d (and m) */
    const size_t nb = (size_t)cols / 32, rb = nb * wb, nq = nb / 4, tail = nb % 4;
    for (int64_t g = 0; g < rows / 4; g++) {
        const uint8_t *sg = (const uint8_t *)src + (size_t)g * 4 * rb;
        uint8_t *dg = (uint8_t *)dst + (size_t)g * 4 * rb;
        for (size_t q = 0; q < nq; q++) {
            uint8_t *run = dg + q * 16 * wb, *qs = run + 16 * sb; /* (16, sb) scales, then the quants */
            for (size_t k = 0; k < 4; k++) {
                const uint8_t *b = sg + k * rb + q * 4 * wb; /* row k's blocks 4q .. 4q + 3 */
                for (size_t j = 0; j < 4; j++) memcpy(run + (k * 4 + j) * sb, b + j * wb, sb);
                if (t == TM_DT_Q8_0) {
                    for (size_t j = 0; j < 4; j++) memcpy(qs + (k * 4 + j) * 32, b + j * wb + 2, 32);
                    continue;
                }
                for (size_t p = 0; p < 2; p++) { /* blocks 2p, 2p + 1 -> 32 bytes */
                    const uint8_t *lo = b + 2 * p * wb + (wb - 16), *hi = b + (2 * p + 1) * wb + (wb - 16);
                    uint8_t *o = qs + (k * 2 + p) * 32;
                    for (size_t i = 0; i < 16; i++) {
                        o[i] = (uint8_t)((lo[i] & 0x0F) | (hi[i] << 4));
                        o[16 + i] = (uint8_t)((lo[i] >> 4) | (hi[i] & 0xF0));
                    }
                }
            }
        }
        for (size_t k = 0; k < 4 && tail; k++) /* the row tails, whole blocks */
            memcpy(dg + nq * 16 * wb + k * tail * wb, sg + k * rb + nq * 4 * wb, tail * wb);
    }
}
