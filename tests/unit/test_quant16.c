/* test_quant16.c -- 16-bit activation quantizers and dots: error bounds, exact references, scalar vs AVX2, multi. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/tm_quant16.h"

/* ---- helpers ------------------------------------------------------------------------------------- */

typedef struct { uint64_t s; } rng_t;

static uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unif(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }
static float rng_gauss(rng_t *r) {
    double u = rng_unif(r), v = rng_unif(r);
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Gaussian data whose scale changes every 32 elements (exercises per-block scales), with rare outliers,
 * all multiplied by `scale` */
static void fill(rng_t *r, float *x, int64_t n, float scale) {
    float s = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) s = (float)exp(rng_unif(r) * 6.0 - 4.0);
        x[i] = rng_gauss(r) * s * scale;
        if (rng_next(r) % 97 == 0) x[i] *= 6.0f;
    }
}

static size_t row_bytes(tm_dtype t, int64_t n) { return (size_t)tm_dtype_row_bytes((uint32_t)t, (uint64_t)n); }

static const tm_dtype k_qtypes[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
#define N_QTYPES (sizeof k_qtypes / sizeof k_qtypes[0])

static bool have_avx2(void) { return tm_quant16_ops_avx2(TM_DT_Q4_1) != NULL && tm_cpu_use_avx2(); }

static int64_t block_of(tm_dtype t) { return (t == TM_DT_Q4_K || t == TM_DT_Q6_K) ? TM_QK_K : 32; }

static float f16v(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tm_f16_to_f32(h);
}

/* Exact dequantization in double, written from the block layouts (independent of tm_quant.c). */
static void deq_exact(tm_dtype t, const uint8_t *w, int64_t n, double *out) {
    for (int64_t b = 0; b < n / block_of(t); b++) {
        if (t == TM_DT_Q8_0) {
            const tm_block_q8_0 *x = (const tm_block_q8_0 *)w + b;
            for (int j = 0; j < 32; j++) out[32 * b + j] = (double)f16v((const uint8_t *)&x->d) * x->qs[j];
        } else if (t == TM_DT_Q4_0 || t == TM_DT_Q4_1) {
            const uint8_t *blk = w + (size_t)b * (t == TM_DT_Q4_0 ? sizeof(tm_block_q4_0) : sizeof(tm_block_q4_1));
            const double d = f16v(blk), m = t == TM_DT_Q4_1 ? f16v(blk + 2) : -8.0 * d;
            const uint8_t *qs = blk + (t == TM_DT_Q4_0 ? 2 : 4);
            for (int j = 0; j < 16; j++) {
                out[32 * b + j] = d * (qs[j] & 0xF) + m;
                out[32 * b + j + 16] = d * (qs[j] >> 4) + m;
            }
        } else if (t == TM_DT_Q4_K) {
            const tm_block_q4_K *x = (const tm_block_q4_K *)w + b;
            const double d = f16v((const uint8_t *)&x->d), dmin = f16v((const uint8_t *)&x->dmin);
            const uint8_t *s = x->scales;
            for (int j = 0; j < 8; j++) {
                const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                for (int l = 0; l < 32; l++) {
                    const uint8_t q = x->qs[32 * (j / 2) + l];
                    out[256 * b + 32 * j + l] = d * sc * ((j & 1) ? q >> 4 : q & 0xF) - dmin * mn;
                }
            }
        } else { /* Q6_K */
            const tm_block_q6_K *x = (const tm_block_q6_K *)w + b;
            const double d = f16v((const uint8_t *)&x->d);
            for (int e = 0; e < 256; e++) {
                const int h = e / 128, c = (e % 128) / 32, l = e % 32;
                const uint8_t lb = x->ql[64 * h + 32 * (c & 1) + l], hb = x->qh[32 * h + l];
                const int q = ((c < 2 ? lb & 0xF : lb >> 4) | (((hb >> (2 * c)) & 3) << 4)) - 32;
                out[256 * b + e] = d * x->scales[8 * h + 2 * c + l / 16] * q;
            }
        }
    }
}

/* Dequantized activations (x ~ d * qs), exact in double. */
static void deq_act(tm_dtype at, const uint8_t *a, int64_t n, double *out) {
    if (at == TM_DT_Q16) {
        const tm_block_q16 *y = (const tm_block_q16 *)a;
        for (int64_t i = 0; i < n; i++) out[i] = (double)y[i / 32].d * y[i / 32].qs[i % 32];
    } else {
        const tm_block_q16_K *y = (const tm_block_q16_K *)a;
        for (int64_t i = 0; i < n; i++) out[i] = (double)y[i / 256].d * y[i / 256].qs[i % 256];
    }
}

/* A weight row of type t for n elements (tm_quant_row of Gaussian data). */
static uint8_t *make_weights(rng_t *r, tm_dtype t, int64_t n, int rows) {
    float *x = malloc((size_t)n * sizeof *x);
    uint8_t *w = malloc(row_bytes(t, n) * (size_t)rows);
    assert_non_null(x);
    assert_non_null(w);
    for (int k = 0; k < rows; k++) {
        fill(r, x, n, 0.05f);
        tm_quant_row(t, x, w + (size_t)k * row_bytes(t, n), n);
    }
    free(x);
    return w;
}

/* ---- activation quantization --------------------------------------------------------------------- */

/* d = amax / 32767 in f32 and |x - d q| <= d / 2: at most amax / 65534 up to the rounding of d; a subnormal d
 * (rounded by up to 2^-150) adds at most 32767 * 2^-150. */
static void check_act_block(const float *x, int nq, float d, const int16_t *qs) {
    double amax = 0.0;
    for (int j = 0; j < nq; j++) amax = fmax(amax, fabs((double)x[j]));
    assert_true(d == (float)amax / 32767.0f);
    const double bound = amax / 65534.0 * (1.0 + 0x1.0p-20) + 32767.0 * 0x1.0p-150;
    for (int j = 0; j < nq; j++) {
        if (d == 0.0f) assert_int_equal(qs[j], 0);
        assert_true(qs[j] >= -32767 && qs[j] <= 32767);
        const double err = fabs((double)x[j] - (double)d * qs[j]);
        if (err > bound)
            fail_msg("element %d: x %.9g d %.9g q %d err %.3g > %.3g", j, (double)x[j], (double)d, qs[j], err, bound);
    }
}

static void check_q16_row(const float *x, int64_t n, const tm_block_q16 *y) {
    for (int64_t b = 0; b < n / 32; b++) {
        check_act_block(x + 32 * b, 32, y[b].d, y[b].qs);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += y[b].qs[j];
        assert_int_equal(s, y[b].sum);
    }
}

static void check_q16_K_row(const float *x, int64_t n, const tm_block_q16_K *y) {
    for (int64_t b = 0; b < n / 256; b++) {
        check_act_block(x + 256 * b, 256, y[b].d, y[b].qs);
        for (int k = 0; k < 16; k++) {
            int32_t s = 0;
            for (int j = 0; j < 16; j++) s += y[b].qs[16 * k + j];
            assert_int_equal(s, y[b].bsums[k]);
        }
    }
}

/* quantize with the reference and (if present) the AVX2 quantizer; both must give the same bytes */
static void quant_both(tm_dtype at, const float *x, int64_t n, uint8_t *ref) {
    const size_t bytes = row_bytes(at, n);
    if (at == TM_DT_Q16) tm_quant_act_q16(x, ref, n);
    else tm_quant_act_q16_K(x, ref, n);
    if (!have_avx2()) return;
    const tm_quant_ops *o = tm_quant16_ops_get_isa(at == TM_DT_Q16 ? TM_DT_Q8_0 : TM_DT_Q4_K, TM_ISA_AVX2);
    uint8_t *v = malloc(bytes);
    assert_non_null(v);
    memset(v, 0xAB, bytes);
    o->from_float(x, v, n);
    assert_memory_equal(ref, v, bytes);
    free(v);
}

static void test_act_error_bound(void **state) {
    (void)state;
    rng_t r = {11};
    const float scales[] = {1.0f, 1e-3f, 300.0f, 1e-20f, 1e20f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        for (int64_t n = 256; n <= 2048; n *= 2) {
            float *x = malloc((size_t)n * sizeof *x);
            uint8_t *a = malloc(row_bytes(TM_DT_Q16, n)), *k = malloc(row_bytes(TM_DT_Q16_K, n));
            assert_true(x && a && k);
            fill(&r, x, n, scales[si]);
            quant_both(TM_DT_Q16, x, n, a);
            check_q16_row(x, n, (const tm_block_q16 *)a);
            quant_both(TM_DT_Q16_K, x, n, k);
            check_q16_K_row(x, n, (const tm_block_q16_K *)k);
            free(x);
            free(a);
            free(k);
        }
    }
}

/* zero blocks, the block maximum exactly representable, fp16-range extremes, ties, subnormals, non-finite */
static void test_act_edge_values(void **state) {
    (void)state;
    const int64_t n = 512;
    float x[512];
    uint8_t a[512 / 32 * sizeof(tm_block_q16)], k[2 * sizeof(tm_block_q16_K)];
    for (int64_t i = 0; i < n; i++) {
        const int64_t b = i / 32, j = i % 32;
        switch (b) {
        case 0: x[i] = 0.0f; break;                                            /* all-zero block */
        case 1: x[i] = j == 5 ? -0.0f : 0.0f; break;                           /* negative zero */
        case 2: x[i] = (j % 2 ? -65504.0f : 65504.0f) * (float)(j + 1) / 32.0f; break; /* fp16 max */
        case 3: x[i] = (float)(j - 16) * 0.5f; break;                          /* exact multiples */
        case 4: x[i] = (j % 3 ? 1.0f : -1.0f) * 0x1.0p-140f * (float)(j + 1); break; /* subnormal */
        case 5: x[i] = 0x1.0p-149f * (float)(j % 3); break;                    /* d underflows to 0 */
        case 6: x[i] = j == 7 ? 1e-38f : 3e-39f * (float)(j % 4); break;        /* d subnormal */
        case 7: x[i] = 32767.0f * (float)(j - 15) / 16.0f + 0.5f; break;       /* near ties */
        case 8: x[i] = FLT_MAX * (j % 2 ? -1.0f : 0.5f); break;               /* huge but finite */
        default: x[i] = (float)sin((double)i) * 1e-3f; break;
        }
    }
    quant_both(TM_DT_Q16, x, n, a);
    quant_both(TM_DT_Q16_K, x, n, k);
    const tm_block_q16 *y = (const tm_block_q16 *)a;
    check_q16_row(x, n, y);
    check_q16_K_row(x, n, (const tm_block_q16_K *)k);
    assert_true(y[0].d == 0.0f && y[0].sum == 0);
    assert_true(y[1].d == 0.0f && y[1].sum == 0);
    assert_true(y[2].d == 65504.0f / 32767.0f && y[2].qs[31] == -32767 && y[2].qs[30] == 31743);
    assert_true(y[5].d == 0.0f); /* 2^-148 / 32767 rounds to zero: stored as a zero block */
    assert_true(y[6].d > 0.0f && y[6].d < FLT_MIN);
    assert_true(isfinite(y[8].d) && y[8].qs[0] == 16383 && y[8].qs[1] == -32767); /* 16383.499 */
    /* a NaN or an infinity poisons its block (d = NaN, qs = 0) and only its block */
    x[3 * 32 + 4] = NAN;
    x[9 * 32 + 1] = -INFINITY;
    quant_both(TM_DT_Q16, x, n, a);
    assert_true(isnan(y[3].d) && isnan(y[9].d) && y[3].sum == 0 && y[3].qs[4] == 0 && y[9].qs[0] == 0);
    assert_true(y[2].d == 65504.0f / 32767.0f && y[4].d > 0.0f && isfinite(y[10].d));
    quant_both(TM_DT_Q16_K, x, n, k);
    const tm_block_q16_K *yk = (const tm_block_q16_K *)k;
    assert_true(isnan(yk[0].d) && isnan(yk[1].d) && yk[0].bsums[3] == 0);
}

/* ---- dots ------------------------------------------------------------------------------------------ */

typedef struct {
    double ref;  /* sum dequant(w) * dequant(a) in double */
    double mag;  /* sum |w_i a_i|: the scale for tolerances */
} ref_t;

static ref_t ref_dot(tm_dtype t, tm_dtype at, const uint8_t *w, const uint8_t *a, int64_t n) {
    double *dw = malloc((size_t)n * sizeof *dw), *da = malloc((size_t)n * sizeof *da);
    assert_true(dw && da);
    deq_exact(t, w, n, dw);
    deq_act(at, a, n, da);
    ref_t r = {0.0, 0.0};
    for (int64_t i = 0; i < n; i++) {
        r.ref += dw[i] * da[i];
        r.mag += fabs(dw[i] * da[i]);
    }
    free(dw);
    free(da);
    return r;
}

static void expect_close(const char *what, tm_dtype t, int64_t n, double got, double want, double mag, double rel) {
    if (!(fabs(got - want) <= rel * mag + 1e-30))
        fail_msg("%s %s n=%lld: got %.9g want %.9g (|diff| %.3g, allowed %.3g)", what, tm_dtype_name(t), (long long)n,
                 got, want, fabs(got - want), rel * mag);
}

/* Every type and length: scalar and AVX2 dots against the double reference and each other. */
static void test_dot_reference(void **state) {
    (void)state;
    rng_t r = {2024};
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const tm_dtype t = k_qtypes[ti];
        const tm_quant_ops *s = tm_quant16_ops_get_isa(t, TM_ISA_SCALAR), *v = tm_quant16_ops_get_isa(t, TM_ISA_AVX2);
        assert_non_null(s);
        assert_int_equal(s->wtype, t);
        assert_int_equal(s->act_type, block_of(t) == 32 ? TM_DT_Q16 : TM_DT_Q16_K);
        if (!have_avx2()) v = NULL;
        const int64_t bk = block_of(t);
        for (int64_t nb = 1; nb <= 40; nb += (nb < 9 ? 1 : 13)) {
            const int64_t n = nb * bk;
            float *x = malloc((size_t)n * sizeof *x);
            uint8_t *a = malloc(row_bytes(s->act_type, n));
            uint8_t *w = make_weights(&r, t, n, 1);
            assert_true(x && a);
            fill(&r, x, n, 1.0f);
            s->from_float(x, a, n);
            const ref_t ref = ref_dot(t, s->act_type, w, a, n);
            const double ds = s->vec_dot(n, w, a);
            expect_close("scalar vs double", t, n, ds, ref.ref, ref.mag, 1e-6);
            if (v) {
                const double dv = v->vec_dot(n, w, a);
                expect_close("avx2 vs double", t, n, dv, ref.ref, ref.mag, 1e-6);
                expect_close("avx2 vs scalar", t, n, dv, ds, ref.mag, 1e-6);
            }
            free(x);
            free(a);
            free(w);
        }
    }
}

/* The 16-bit path is what makes the dot track f32 math: compare both activation formats against the f32
 * activations (not their quantized forms) on the same weights. */
static void test_dot_beats_q8(void **state) {
    (void)state;
    rng_t r = {77};
    const int64_t n = 4096;
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const tm_dtype t = k_qtypes[ti];
        const tm_quant_ops *o16 = tm_quant16_ops_get(t), *o8 = tm_quant_ops_get(t);
        assert_non_null(o16);
        assert_non_null(o8);
        float *x = malloc((size_t)n * sizeof *x);
        double *dw = malloc((size_t)n * sizeof *dw);
        uint8_t *a16 = malloc(row_bytes(o16->act_type, n)), *a8 = malloc(row_bytes(o8->act_type, n));
        assert_true(x && dw && a16 && a8);
        double err16 = 0.0, err8 = 0.0;
        for (int rep = 0; rep < 8; rep++) {
            uint8_t *w = make_weights(&r, t, n, 1);
            fill(&r, x, n, 1.0f);
            deq_exact(t, w, n, dw);
            double exact = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                exact += dw[i] * x[i];
                mag += fabs(dw[i] * x[i]);
            }
            o16->from_float(x, a16, n);
            o8->from_float(x, a8, n);
            err16 = fmax(err16, fabs(o16->vec_dot(n, w, a16) - exact) / mag);
            err8 = fmax(err8, fabs(o8->vec_dot(n, w, a8) - exact) / mag);
            free(w);
        }
        if (!(err16 < 2e-5 && err16 * 20.0 < err8))
            fail_msg("%s: relative error q16 %.3g, q8 %.3g", tm_dtype_name(t), err16, err8);
        free(x);
        free(dw);
        free(a16);
        free(a8);
    }
}

/* Hand-built extreme blocks: the largest integer sums each kernel can meet (no int32 overflow) and
 * activations at +-32767 with fp16-max-like scales. */
static void test_dot_extremes(void **state) {
    (void)state;
    const int64_t n = 1024;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const tm_dtype t = k_qtypes[ti];
        const size_t wb = row_bytes(t, n);
        uint8_t *w = malloc(wb);
        assert_non_null(w);
        for (int variant = 0; variant < 4; variant++) {
            /* weights: every quant at its most negative (variant 0, 2) or most positive (1, 3) value */
            const int hi = variant & 1;
            memset(w, 0, wb);
            for (int64_t b = 0; b < n / block_of(t); b++) {
                if (t == TM_DT_Q8_0) {
                    tm_block_q8_0 *q = (tm_block_q8_0 *)w + b;
                    q->d = tm_f32_to_f16(0.01f);
                    memset(q->qs, hi ? 0x7F : 0x80, 32); /* +127 / -128 */
                } else if (t == TM_DT_Q4_0) {
                    tm_block_q4_0 *q = (tm_block_q4_0 *)w + b;
                    q->d = tm_f32_to_f16(0.01f);
                    memset(q->qs, hi ? 0xFF : 0x00, 16); /* +7 / -8 */
                } else if (t == TM_DT_Q4_1) {
                    tm_block_q4_1 *q = (tm_block_q4_1 *)w + b;
                    q->d = tm_f32_to_f16(0.01f);
                    q->m = tm_f32_to_f16(hi ? 0.5f : -0.5f);
                    memset(q->qs, hi ? 0xFF : 0x00, 16);
                } else if (t == TM_DT_Q4_K) {
                    tm_block_q4_K *q = (tm_block_q4_K *)w + b;
                    q->d = tm_f32_to_f16(0.001f);
                    q->dmin = tm_f32_to_f16(hi ? 0.0f : 0.002f);
                    memset(q->scales, 0xFF, 12); /* all six-bit scales and mins 63 */
                    memset(q->qs, hi ? 0xFF : 0x00, 128);
                } else {
                    tm_block_q6_K *q = (tm_block_q6_K *)w + b;
                    q->d = tm_f32_to_f16(0.001f);
                    memset(q->scales, hi ? 0x7F : 0x80, 16); /* +127 / -128 */
                    memset(q->ql, hi ? 0xFF : 0x00, 128);     /* q = 63 / 0 (-32 after the offset) */
                    memset(q->qh, hi ? 0xFF : 0x00, 64);
                }
            }
            /* activations: all at +-amax (variant < 2: same sign everywhere; else alternating) */
            for (int64_t i = 0; i < n; i++)
                x[i] = (variant < 2 || i % 2 == 0 ? 60000.0f : -60000.0f) * (float)(1 + i / 256);
            const tm_quant_ops *s = tm_quant16_ops_get_isa(t, TM_ISA_SCALAR);
            uint8_t *a = malloc(row_bytes(s->act_type, n));
            assert_non_null(a);
            s->from_float(x, a, n);
            const ref_t ref = ref_dot(t, s->act_type, w, a, n);
            const double ds = s->vec_dot(n, w, a);
            expect_close("extreme scalar", t, n, ds, ref.ref, ref.mag, 1e-6);
            if (have_avx2()) {
                const tm_quant_ops *v = tm_quant16_ops_get_isa(t, TM_ISA_AVX2);
                expect_close("extreme avx2", t, n, v->vec_dot(n, w, a), ref.ref, ref.mag, 1e-6);
                float m[2];
                tm_quant16_multi_get(t)(n, w, a, 0, 2, m); /* stride 0: the same row twice */
                expect_close("extreme multi", t, n, m[1], ref.ref, ref.mag, 1e-6);
            }
            free(a);
        }
        free(w);
    }
    free(x);
}

/* Zero activation blocks, tiny and huge scales: results stay finite and scalar == AVX2 (to 1e-6 of the
 * magnitude); a NaN block makes the dot NaN. */
static void test_dot_special_activations(void **state) {
    (void)state;
    rng_t r = {5};
    const int64_t n = 1024;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const tm_dtype t = k_qtypes[ti];
        const tm_quant_ops *s = tm_quant16_ops_get_isa(t, TM_ISA_SCALAR);
        const tm_quant_ops *v = have_avx2() ? tm_quant16_ops_get_isa(t, TM_ISA_AVX2) : NULL;
        uint8_t *w = make_weights(&r, t, n, 1), *a = malloc(row_bytes(s->act_type, n));
        assert_non_null(a);
        for (int c = 0; c < 4; c++) {
            fill(&r, x, n, c == 1 ? 1e-25f : c == 2 ? 1e-36f : 1.0f);
            if (c == 0) memset(x, 0, (size_t)n * sizeof *x);          /* everything zero */
            if (c == 3) memset(x + 256, 0, 256 * sizeof *x);          /* some zero blocks */
            s->from_float(x, a, n);
            const ref_t ref = ref_dot(t, s->act_type, w, a, n);
            const double ds = s->vec_dot(n, w, a);
            assert_true(isfinite(ds));
            if (c == 0) assert_true(ds == 0.0);
            if (c != 2) expect_close("special scalar", t, n, ds, ref.ref, ref.mag, 1e-6); /* c == 2: d subnormal */
            if (v) {
                const double dv = v->vec_dot(n, w, a);
                assert_true(isfinite(dv));
                if (c == 0) assert_true(dv == 0.0);
                expect_close("special avx2 vs scalar", t, n, dv, ds, fmax(ref.mag, fabs(ds)), 1e-6);
            }
        }
        fill(&r, x, n, 1.0f);
        x[300] = NAN;
        s->from_float(x, a, n);
        assert_true(isnan(s->vec_dot(n, w, a)));
        if (v) assert_true(isnan(v->vec_dot(n, w, a)));
        free(w);
        free(a);
    }
    free(x);
}

/* The multi-row entry equals vec_dot bit for bit, for 1..8 rows, padded and odd row strides; mat_dot too. */
static void test_multi_and_mat(void **state) {
    (void)state;
    if (!have_avx2()) {
        for (size_t ti = 0; ti < N_QTYPES; ti++) assert_null(tm_quant16_multi_get(k_qtypes[ti]));
        skip();
    }
    rng_t r = {99};
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const tm_dtype t = k_qtypes[ti];
        const tm_quant_ops *v = tm_quant16_ops_get_isa(t, TM_ISA_AVX2), *s = tm_quant16_ops_get_isa(t, TM_ISA_SCALAR);
        tm_vec_dot_multi_fn multi = tm_quant16_multi_get(t);
        assert_non_null(multi);
        const int64_t lens[] = {block_of(t), 3 * block_of(t), 7 * block_of(t), 18 * block_of(t)};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li];
            const int nc = 19, nr = 6;
            const size_t arb = row_bytes(v->act_type, n), as = arb + (li % 2 ? 4 : 76); /* unaligned strides */
            const size_t wrb = row_bytes(t, n), ws = wrb + 2;
            float *x = malloc((size_t)n * sizeof *x);
            uint8_t *a = malloc(as * nc), *w = malloc(ws * nr), *wt = make_weights(&r, t, n, nr);
            float *out = malloc(sizeof(float) * nc * (nr + 3)), *outs = malloc(sizeof(float) * nc * (nr + 3));
            assert_true(x && a && w && out && outs);
            for (int c = 0; c < nc; c++) {
                fill(&r, x, n, c == 4 ? 0.0f : 1.0f); /* one all-zero row */
                v->from_float(x, a + (size_t)c * as, n);
            }
            for (int k = 0; k < nr; k++) memcpy(w + (size_t)k * ws, wt + (size_t)k * wrb, wrb);
            for (int k = 0; k < nr; k++) {
                const uint8_t *wr = w + (size_t)k * ws;
                for (int rows = 1; rows <= TM_QUANT16_MULTI_MAX; rows++) {
                    float m[TM_QUANT16_MULTI_MAX];
                    const int c0 = (k * 3 + rows) % (nc - rows + 1);
                    multi(n, wr, a + (size_t)c0 * as, as, rows, m);
                    for (int j = 0; j < rows; j++) {
                        const float single = v->vec_dot(n, wr, a + (size_t)(c0 + j) * as);
                        if (memcmp(&single, &m[j], sizeof single) != 0)
                            fail_msg("%s n=%lld rows=%d j=%d: multi %.9g != vec_dot %.9g", tm_dtype_name(t),
                                     (long long)n, rows, j, (double)m[j], (double)single);
                    }
                }
            }
            /* mat_dot: out[c * os + r] == vec_dot exactly, for decode (nc = 1) and prefill tiles */
            const size_t os = (size_t)nr + 3;
            const int ncs[] = {1, 5, nc};
            for (size_t q = 0; q < sizeof ncs / sizeof ncs[0]; q++) {
                memset(out, 0, sizeof(float) * nc * os);
                memset(outs, 0, sizeof(float) * nc * os);
                v->mat_dot(n, nr, w, ws, ncs[q], a, as, out, os);
                s->mat_dot(n, nr, w, ws, ncs[q], a, as, outs, os);
                for (int c = 0; c < ncs[q]; c++) {
                    for (int k = 0; k < nr; k++) {
                        const float want = v->vec_dot(n, w + (size_t)k * ws, a + (size_t)c * as);
                        const float got = out[(size_t)c * os + (size_t)k];
                        assert_memory_equal(&got, &want, sizeof got);
                        const float want_s = s->vec_dot(n, w + (size_t)k * ws, a + (size_t)c * as);
                        assert_true(outs[(size_t)c * os + (size_t)k] == want_s);
                    }
                    for (size_t k = (size_t)nr; k < os; k++) /* padding columns stay untouched */
                        assert_true(out[(size_t)c * os + k] == 0.0f);
                }
            }
            free(x);
            free(a);
            free(w);
            free(wt);
            free(out);
            free(outs);
        }
    }
}

/* Dispatch: act types, float types delegate to tm_quant_ops, unsupported types, TM_FORCE_SCALAR. */
/* The decode layout: tm_quant16_x4_pack puts row r's block i where tm_quant16.h says, and the four-row kernel
 * over a packed group, against one or two activation rows, equals vec_dot of each pair bit for bit (run tails
 * of 0..3 blocks, a zero activation row); so does one row of a group against 1..8 activation rows (prefill). */
static void test_x4_layout_and_kernel(void **state) {
    (void)state;
    const tm_dtype types[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K};
    assert_false(tm_quant16_x4_eligible(TM_DT_Q4_K, 4, 128));
    assert_false(tm_quant16_x4_eligible(TM_DT_Q6_K, 4, 256));
    assert_true(tm_quant16_x4_eligible(TM_DT_Q4_K, 4, 512));
    assert_false(tm_quant16_x4_eligible(TM_DT_Q4_1, 6, 64));
    assert_false(tm_quant16_x4_eligible(TM_DT_Q8_0, 4, 48));
    assert_true(tm_quant16_x4_eligible(TM_DT_Q8_0, 8, 96));
    rng_t r = {4242};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const tm_dtype t = types[ti];
        const bool kq = t == TM_DT_Q4_K;
        const int64_t blk = block_of(t);
        const size_t wb = row_bytes(t, blk);
        for (int nb = 1; nb <= (kq ? 4 : 11); nb++) {
            const int64_t n = blk * nb, rows = 8;
            const size_t rb = row_bytes(t, n);
            uint8_t *w = make_weights(&r, t, n, (int)rows), *pk = malloc(rb * (size_t)rows);
            assert_non_null(pk);
            assert_true(tm_quant16_x4_eligible(t, rows, n));
            tm_quant16_x4_pack(t, rows, n, w, pk);
            const int nq = nb / 4, tail = nb % 4;
            for (int64_t row = 0; row < rows; row++)
                for (int i = 0; i < nb; i++) {
                    const uint8_t *g = pk + (size_t)(row / 4) * 4 * rb;
                    const int k = (int)(row % 4);
                    const size_t off = kq           ? ((size_t)i * 4 + (size_t)k) * wb /* super-block i of rows 0..3 */
                                       : i < 4 * nq ? ((size_t)(i / 4) * 16 + (size_t)k * 4 + (size_t)(i % 4)) * wb
                                                    : ((size_t)nq * 16 + (size_t)k * (size_t)tail + (size_t)(i - 4 * nq)) * wb;
                    assert_memory_equal(g + off, w + (size_t)row * rb + (size_t)i * wb, wb);
                }
            tm_vec_dot_x4_fn x4 = tm_quant16_x4_get(t);
            if (!have_avx2()) {
                assert_null(x4);
            } else {
                const tm_quant_ops *v = tm_quant16_ops_get_isa(t, TM_ISA_AVX2);
                float *x = malloc((size_t)n * sizeof *x);
                const size_t as = row_bytes(v->act_type, n) + 8; /* activation rows, padded stride */
                uint8_t *a = malloc(TM_QUANT16_MULTI_MAX * as);
                /* prefill: one row of a group against 1..8 activation rows */
                tm_vec_dot_x4row_fn x4row = tm_quant16_x4row_avx2(t);
                assert_non_null(x4row);
                for (int c = 0; c < TM_QUANT16_MULTI_MAX; c++) {
                    fill(&r, x, n, c == 3 ? 0.0f : 1.0f);
                    v->from_float(x, a + (size_t)c * as, n);
                }
                for (int64_t row = 0; row < rows; row++)
                    for (int nr = 1; nr <= TM_QUANT16_MULTI_MAX; nr++) {
                        float out[TM_QUANT16_MULTI_MAX];
                        x4row(n, pk + (size_t)(row / 4) * 4 * rb, (int)(row % 4), a, as, nr, out);
                        for (int c = 0; c < nr; c++) {
                            const float want = v->vec_dot(n, w + (size_t)row * rb, a + (size_t)c * as);
                            if (memcmp(&want, &out[c], sizeof want) != 0)
                                fail_msg("%s nb=%d x4row row %lld nr=%d act %d: %.9g != vec_dot %.9g",
                                         tm_dtype_name(t), nb, (long long)row, nr, c, (double)out[c], (double)want);
                        }
                    }
                for (int rep = 0; rep < 2; rep++) {
                    fill(&r, x, n, rep ? 0.0f : 1.0f);
                    v->from_float(x, a, n);
                    fill(&r, x, n, 1.0f);
                    v->from_float(x, a + as, n);
                    for (int nr = 1; nr <= TM_QUANT16_X4_MAX_ROWS; nr++)
                        for (int64_t g = 0; g < rows / 4; g++) {
                            float out[4 * TM_QUANT16_X4_MAX_ROWS];
                            x4(n, pk + (size_t)g * 4 * rb, a, as, nr, out);
                            for (int c = 0; c < nr; c++)
                                for (int k = 0; k < 4; k++) {
                                    const float want = v->vec_dot(n, w + (size_t)(4 * g + k) * rb, a + (size_t)c * as);
                                    if (memcmp(&want, &out[c * 4 + k], sizeof want) != 0)
                                        fail_msg("%s nb=%d nr=%d row %lld act %d: x4 %.9g != vec_dot %.9g",
                                                 tm_dtype_name(t), nb, nr, (long long)(4 * g + k), c,
                                                 (double)out[c * 4 + k], (double)want);
                                }
                        }
                }
                free(x);
                free(a);
            }
            free(w);
            free(pk);
        }
    }
}

static void test_dispatch(void **state) {
    (void)state;
    const tm_dtype floats[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16};
    for (size_t i = 0; i < 3; i++) {
        assert_ptr_equal(tm_quant16_ops_get(floats[i]), tm_quant_ops_get(floats[i]));
        assert_ptr_equal(tm_quant16_ops_get_isa(floats[i], TM_ISA_SCALAR),
                         tm_quant_ops_get_isa(floats[i], TM_ISA_SCALAR));
        assert_int_equal(tm_quant16_ops_get(floats[i])->act_type, TM_DT_F32);
        assert_null(tm_quant16_multi_get(floats[i]));
    }
    const tm_dtype unsupported[] = {TM_DT_Q5_0, TM_DT_Q8_1, TM_DT_Q8_K, TM_DT_Q16, TM_DT_Q2_K, TM_DT_I32};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        assert_null(tm_quant16_ops_get(unsupported[i]));
        assert_null(tm_quant16_ops_get_isa(unsupported[i], TM_ISA_SCALAR));
        assert_null(tm_quant16_ops_get_isa(unsupported[i], TM_ISA_AVX2));
        assert_null(tm_quant16_multi_get(unsupported[i]));
    }
    assert_null(tm_quant16_ops_get_isa(TM_DT_Q4_1, (tm_isa)7));
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const tm_dtype t = k_qtypes[ti];
        const tm_quant_ops *best = tm_quant16_ops_get(t);
        assert_non_null(best);
        assert_ptr_equal(best, tm_quant16_ops_get_isa(t, have_avx2() ? TM_ISA_AVX2 : TM_ISA_SCALAR));
        assert_int_equal(best->act_type, block_of(t) == 32 ? TM_DT_Q16 : TM_DT_Q16_K);
        assert_non_null(best->mat_dot);
    }
    if (have_avx2()) {
        setenv("TM_FORCE_SCALAR", "1", 1);
        assert_ptr_equal(tm_quant16_ops_get(TM_DT_Q4_K), tm_quant16_ops_get_isa(TM_DT_Q4_K, TM_ISA_SCALAR));
        assert_null(tm_quant16_multi_get(TM_DT_Q4_K));
        unsetenv("TM_FORCE_SCALAR");
        assert_non_null(tm_quant16_multi_get(TM_DT_Q4_K));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_act_error_bound),
        cmocka_unit_test(test_act_edge_values),
        cmocka_unit_test(test_dot_reference),
        cmocka_unit_test(test_dot_beats_q8),
        cmocka_unit_test(test_dot_extremes),
        cmocka_unit_test(test_dot_special_activations),
        cmocka_unit_test(test_multi_and_mat),
        cmocka_unit_test(test_x4_layout_and_kernel),
        cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
