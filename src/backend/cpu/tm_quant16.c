/* tm_quant16.c -- 16-bit activation quantizers, scalar dot kernels against Q16/Q16_K, ops tables and dispatch. */
#include "backend/cpu/tm_quant16.h"

#include <math.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------------- */

/* round half to even for |v| <= 2^50 (the AVX2 twin uses _MM_FROUND_TO_NEAREST_INT) */
static inline int32_t round_even(double v) {
    const double t = v + 6755399441055744.0; /* 1.5 * 2^52: the integer part lands in the low mantissa bits */
    int64_t i;
    memcpy(&i, &t, 8);
    return (int32_t)((i & 0x000fffffffffffffll) - 0x0008000000000000ll);
}

/* Q4_K's 12 packed bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4 layout). */
static inline void q4k_scales(const uint8_t *q, int *sc, int *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- activation quantizers ----------------------------------------------------------------------- */

/* Per block: d = amax / 32767 (f32), qs = round-half-even(x / d) with the quotient formed in double. */

/* Quantizes nq floats with one scale. Returns the scale; writes qs and their sum. */
static float quant16_block(const float *x, int nq, int16_t *qs, int32_t *sum) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < nq; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
        finite &= isfinite(x[j]) != 0;
    }
    const float d = amax / 32767.0f;
    *sum = 0;
    if (!finite || d == 0.0f) {
        memset(qs, 0, (size_t)nq * sizeof *qs);
        return finite ? 0.0f : NAN;
    }
    int32_t s = 0;
    for (int j = 0; j < nq; j++) {
        /* the quotient in double, so q is the nearest integer to x / d (|x - d q| <= d / 2); the clamp only
         * matters when d is subnormal */
        const double v = fmin(fmax((double)x[j] / (double)d, -32767.0), 32767.0);
        const int32_t q = round_even(v);
        qs[j] = (int16_t)q;
        s += q;
    }
    *sum = s;
    return d;
}

void tm_quant_act_q16(const float *x, void *vy, int64_t n) {
    tm_block_q16 *y = vy;
    for (int64_t i = 0; i < n / 32; i++) y[i].d = quant16_block(x + 32 * i, 32, y[i].qs, &y[i].sum);
}

void tm_quant_act_q16_K(const float *x, void *vy, int64_t n) {
    tm_block_q16_K *y = vy;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        int32_t total;
        y[i].d = quant16_block(x + TM_QK_K * i, TM_QK_K, y[i].qs, &total);
        for (int j = 0; j < TM_QK_K / 16; j++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = s;
        }
    }
}

/* ---- scalar dot kernels -------------------------------------------------------------------------- */

static float dot_q8_0(int64_t n, const void *vw, const void *va) {
    const tm_block_q8_0 *x = vw;
    const tm_block_q16 *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += (int32_t)x[i].qs[j] * y[i].qs[j];
        sumf += (tm_f16_to_f32(x[i].d) * y[i].d) * (float)s;
    }
    return sumf;
}

static float dot_q4_0(int64_t n, const void *vw, const void *va) {
    const tm_block_q4_0 *x = vw;
    const tm_block_q16 *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) {
            s += (int32_t)(x[i].qs[j] & 0xF) * y[i].qs[j];
            s += (int32_t)(x[i].qs[j] >> 4) * y[i].qs[j + 16];
        }
        sumf += (tm_f16_to_f32(x[i].d) * y[i].d) * (float)(s - 8 * y[i].sum);
    }
    return sumf;
}

static float dot_q4_1(int64_t n, const void *vw, const void *va) {
    const tm_block_q4_1 *x = vw;
    const tm_block_q16 *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) {
            s += (int32_t)(x[i].qs[j] & 0xF) * y[i].qs[j];
            s += (int32_t)(x[i].qs[j] >> 4) * y[i].qs[j + 16];
        }
        sumf += (tm_f16_to_f32(x[i].d) * y[i].d) * (float)s + (tm_f16_to_f32(x[i].m) * y[i].d) * (float)y[i].sum;
    }
    return sumf;
}

static float dot_q4_K(int64_t n, const void *vw, const void *va) {
    const tm_block_q4_K *x = vw;
    const tm_block_q16_K *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        int sc[8], mn[8];
        q4k_scales(x[i].scales, sc, mn);
        const uint8_t *q = x[i].qs;
        const int16_t *a = y[i].qs;
        int64_t isum = 0, msum = 0; /* |isum| <= 8 * 63 * 32 * 15 * 32767: needs 64 bits */
        for (int j = 0; j < 4; j++) {  /* 32 bytes: sub-block 2j in the low nibbles, 2j+1 in the high */
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (int32_t)(q[32 * j + l] & 0xF) * a[64 * j + l];
                s1 += (int32_t)(q[32 * j + l] >> 4) * a[64 * j + 32 + l];
            }
            isum += (int64_t)s0 * sc[2 * j] + (int64_t)s1 * sc[2 * j + 1];
        }
        for (int j = 0; j < 8; j++) msum += (int64_t)mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sumf += (y[i].d * tm_f16_to_f32(x[i].d)) * (float)isum - (y[i].d * tm_f16_to_f32(x[i].dmin)) * (float)msum;
    }
    return sumf;
}

static float dot_q6_K(int64_t n, const void *vw, const void *va) {
    const tm_block_q6_K *x = vw;
    const tm_block_q16_K *y = va;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int16_t *a = y[i].qs;
        int32_t sub[16] = {0}; /* per 16-element sub-block: sum q * a with q in 0..63 (offset not applied) */
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                const int is = 8 * h + l / 16;
                const int32_t q1 = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
                const int32_t q2 = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                const int32_t q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                const int32_t q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                sub[is + 0] += q1 * a[l];
                sub[is + 2] += q2 * a[l + 32];
                sub[is + 4] += q3 * a[l + 64];
                sub[is + 6] += q4 * a[l + 96];
            }
            ql += 64;
            qh += 32;
            a += 128;
        }
        int64_t isum = 0;
        for (int k = 0; k < 16; k++) isum += (int64_t)x[i].scales[k] * (sub[k] - 32 * y[i].bsums[k]);
        sumf += (y[i].d * tm_f16_to_f32(x[i].d)) * (float)isum;
    }
    return sumf;
}

TM_GENERIC_MAT_DOT(mat_q8_0, dot_q8_0)
TM_GENERIC_MAT_DOT(mat_q4_0, dot_q4_0)
TM_GENERIC_MAT_DOT(mat_q4_1, dot_q4_1)
TM_GENERIC_MAT_DOT(mat_q4_K, dot_q4_K)
TM_GENERIC_MAT_DOT(mat_q6_K, dot_q6_K)

/* ---- tables and dispatch ------------------------------------------------------------------------- */

static const tm_quant_ops k_scalar16[] = {
    {TM_DT_Q8_0, TM_DT_Q16, tm_quant_act_q16, dot_q8_0, mat_q8_0},
    {TM_DT_Q4_0, TM_DT_Q16, tm_quant_act_q16, dot_q4_0, mat_q4_0},
    {TM_DT_Q4_1, TM_DT_Q16, tm_quant_act_q16, dot_q4_1, mat_q4_1},
    {TM_DT_Q4_K, TM_DT_Q16_K, tm_quant_act_q16_K, dot_q4_K, mat_q4_K},
    {TM_DT_Q6_K, TM_DT_Q16_K, tm_quant_act_q16_K, dot_q6_K, mat_q6_K},
};

static bool is_float_type(tm_dtype t) { return t == TM_DT_F32 || t == TM_DT_F16 || t == TM_DT_BF16; }

const tm_quant_ops *tm_quant16_ops_get_isa(tm_dtype t, tm_isa isa) {
    if (is_float_type(t)) return tm_quant_ops_get_isa(t, isa);
    if (isa == TM_ISA_AVX2) return tm_quant16_ops_avx2(t);
    if (isa != TM_ISA_SCALAR) return NULL;
    return tm_quant_ops_find(k_scalar16, sizeof k_scalar16 / sizeof k_scalar16[0], t);
}

const tm_quant_ops *tm_quant16_ops_get(tm_dtype t) {
    if (is_float_type(t)) return tm_quant_ops_get(t);
    if (tm_cpu_use_avx2()) {
        const tm_quant_ops *o = tm_quant16_ops_avx2(t);
        if (o) return o;
    }
    return tm_quant16_ops_get_isa(t, TM_ISA_SCALAR);
}

tm_vec_dot_multi_fn tm_quant16_multi_get(tm_dtype t) { return tm_cpu_use_avx2() ? tm_quant16_multi_avx2(t) : NULL; }

/* ---- the decode layout (x4) --------------------------------------------------------------------- */

static size_t block32_bytes(tm_dtype t) {
    return t == TM_DT_Q8_0 ? sizeof(tm_block_q8_0) : t == TM_DT_Q4_0 ? sizeof(tm_block_q4_0) : sizeof(tm_block_q4_1);
}

bool tm_quant16_x4_eligible(tm_dtype t, int64_t rows, int64_t cols) {
    const int64_t blk = t == TM_DT_Q4_K ? TM_QK_K : 32;
    return (t == TM_DT_Q8_0 || t == TM_DT_Q4_0 || t == TM_DT_Q4_1 || t == TM_DT_Q4_K) && rows > 0 && rows % 4 == 0 &&
           cols >= blk && cols % blk == 0;
}

void tm_quant16_x4_pack(tm_dtype t, int64_t rows, int64_t cols, const void *src, void *dst) {
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (t == TM_DT_Q4_K) { /* super-block i of rows 0..3, one after another */
        const size_t sb = sizeof(tm_block_q4_K), nb = (size_t)cols / TM_QK_K, rb = nb * sb;
        for (int64_t g = 0; g < rows / 4; g++)
            for (size_t i = 0; i < nb; i++)
                for (size_t r = 0; r < 4; r++)
                    memcpy(d + (size_t)g * 4 * rb + (4 * i + r) * sb, s + ((size_t)g * 4 + r) * rb + i * sb, sb);
        return;
    }
    const size_t wb = block32_bytes(t), nb = (size_t)cols / 32, rb = nb * wb, ng = nb / 4, tail = nb % 4;
    for (int64_t g = 0; g < rows / 4; g++) {
        const uint8_t *sg = s + (size_t)g * 4 * rb;
        uint8_t *dg = d + (size_t)g * 4 * rb;
        for (size_t q = 0; q < ng; q++)
            for (size_t r = 0; r < 4; r++) memcpy(dg + (q * 4 + r) * 4 * wb, sg + r * rb + q * 4 * wb, 4 * wb);
        for (size_t r = 0; r < 4 && tail; r++) memcpy(dg + ng * 16 * wb + r * tail * wb, sg + r * rb + ng * 4 * wb, tail * wb);
    }
}

tm_vec_dot_x4_fn tm_quant16_x4_get(tm_dtype t) { return tm_cpu_use_avx2() ? tm_quant16_x4_avx2(t) : NULL; }
