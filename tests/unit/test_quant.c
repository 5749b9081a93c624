/* test_quant.c -- quantization round trips, scalar vs AVX2 dot kernels, ggml/gguf-py golden dequantization. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/tm_quant.h"
#include "backend/cpu/tm_quant16.h" /* the x4 layout */

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

/* Gaussian data whose scale changes every 32 elements (exercises per-block scales), with rare outliers */
static void fill(rng_t *r, float *x, int64_t n) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = (float)exp(rng_unif(r) * 6.0 - 4.0);
        x[i] = rng_gauss(r) * scale;
        if (rng_next(r) % 97 == 0) x[i] *= 6.0f;
    }
}

static size_t row_bytes(tm_dtype t, int64_t n) { return (size_t)tm_dtype_row_bytes((uint32_t)t, (uint64_t)n); }

static const tm_dtype k_wtypes[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0,
                                    TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
#define N_WTYPES (sizeof k_wtypes / sizeof k_wtypes[0])

static bool have_avx2(void) { return tm_quant_ops_get_isa(TM_DT_Q4_1, TM_ISA_AVX2) != NULL && tm_cpu_use_avx2(); }

/* ---- f16 / bf16 ----------------------------------------------------------------------------------- */

static void test_half_roundtrip(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tm_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff));
            assert_true((tm_f32_to_f16(f) & 0x7c00) == 0x7c00 && (tm_f32_to_f16(f) & 0x3ff)); /* stays NaN */
            continue;
        }
        assert_int_equal(tm_f32_to_f16(f), h);
        float b = tm_bf16_to_f32((uint16_t)h);
        if (!isnan(b)) assert_int_equal(tm_f32_to_bf16(b), h);
    }
    /* rounding: the nearest half, ties to even */
    assert_int_equal(tm_f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00);               /* tie -> even (down) */
    assert_int_equal(tm_f32_to_f16(1.0f + 3 * 0x1.0p-11f), 0x3c02);           /* tie -> even (up) */
    assert_int_equal(tm_f32_to_f16(1.0f + 0x1.0p-11f + 0x1.0p-20f), 0x3c01); /* above the tie */
    assert_int_equal(tm_f32_to_f16(65520.0f), 0x7c00);                         /* overflows to inf */
    assert_int_equal(tm_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(tm_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);               /* tie -> even */
    assert_int_equal(tm_f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
    /* dequant_row of f16/bf16 uses the same conversion */
    uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    float out[4];
    tm_dequant_row(TM_DT_F16, h, out, 4);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0x1.0p-24f && out[3] == 65504.0f);
    tm_dequant_row(TM_DT_BF16, h, out, 4);
    assert_true(out[0] == 0x1.0p-7f && out[1] == -2.0f && out[2] == 0x1.0p-133f);
}

/* Every finite f16 / bf16 weight value reaches the dot kernels exactly: one non-zero weight h against a
 * one-hot activation, placed in the vector body (element 0 of 16) and in the scalar tail (element 8 of 9). */
static void test_half_dot_all_values(void **state) {
    (void)state;
    const tm_dtype types[] = {TM_DT_F16, TM_DT_BF16};
    for (size_t k = 0; k < 2; k++) {
        for (int isa = 0; isa < 2; isa++) {
            const tm_quant_ops *o = tm_quant_ops_get_isa(types[k], (tm_isa)isa);
            if (isa == TM_ISA_AVX2 && !have_avx2()) continue;
            assert_non_null(o);
            for (uint32_t h = 0; h < 65536; h++) {
                const float want = types[k] == TM_DT_F16 ? tm_f16_to_f32((uint16_t)h) : tm_bf16_to_f32((uint16_t)h);
                if (isnan(want) || isinf(want)) continue;
                for (int pos = 0; pos <= 8; pos += 8) {
                    uint16_t w[16] = {0};
                    float x[16] = {0};
                    w[pos] = (uint16_t)h;
                    x[pos] = 1.0f;
                    const float got = o->vec_dot(pos ? 9 : 16, w, x);
                    if (got != want)
                        fprintf(stderr, "%s isa %d h=%04x pos %d: got %g want %g\n", tm_dtype_name(types[k]), isa, h, pos, got, want);
                    assert_true(got == want);
                }
            }
        }
    }
}

/* ---- quantize -> dequantize error bounds ---------------------------------------------------------- */

static void check_block_bounds(tm_dtype t, const float *x, const float *y, int64_t n) {
    const int bs = (t == TM_DT_Q4_K || t == TM_DT_Q6_K || t == TM_DT_Q8_K) ? 256 : 32;
    double se = 0.0, sx = 0.0;
    for (int64_t b = 0; b < n / bs; b++) {
        const float *xb = x + b * bs, *yb = y + b * bs;
        float amax = 0.0f, mn = INFINITY, mx = -INFINITY;
        for (int j = 0; j < bs; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
            mn = fminf(mn, xb[j]);
            mx = fmaxf(mx, xb[j]);
        }
        double bound;
        switch (t) {
        case TM_DT_Q8_0: case TM_DT_Q8_1: bound = 0.5 * amax / 127.0 + amax * 0x1.0p-10; break;
        case TM_DT_Q8_K: bound = 0.5 * amax / 127.0 + amax * 1e-6; break;
        case TM_DT_Q4_0: bound = amax / 8.0 + amax * 0x1.0p-9; break; /* +amax can only reach q = 7 */
        case TM_DT_Q4_1: bound = 0.5 * (mx - mn) / 15.0 + (fabsf(mn) + (mx - mn)) * 0x1.0p-9; break;
        case TM_DT_Q4_K: bound = 2.0 * (mx - fminf(mn, 0.0f)) / 15.0; break; /* 6-bit sub-block scales */
        case TM_DT_Q6_K: bound = 2.0 * amax / 32.0; break;
        default: bound = 0.0; break;
        }
        for (int j = 0; j < bs; j++) {
            double e = fabs((double)xb[j] - yb[j]);
            if (e > bound) fprintf(stderr, "%s block %lld elem %d: x=%g y=%g bound=%g\n", tm_dtype_name(t), (long long)b, j, xb[j], yb[j], bound);
            assert_true(e <= bound);
            se += e * e;
            sx += (double)xb[j] * xb[j];
        }
    }
    /* relative RMS error: typical for each format on this data */
    double rel = sqrt(se / sx), lim;
    switch (t) {
    case TM_DT_Q8_0: case TM_DT_Q8_1: lim = 0.01; break;
    case TM_DT_Q8_K: case TM_DT_Q6_K: lim = 0.03; break; /* one scale per 256 elements */
    default: lim = 0.12; break;
    }
    if (rel > lim) fprintf(stderr, "%s rel rms %g > %g\n", tm_dtype_name(t), rel, lim);
    assert_true(rel < lim);
}

static void test_quant_roundtrip(void **state) {
    (void)state;
    const tm_dtype types[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0, TM_DT_Q8_1,
                              TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K, TM_DT_Q8_K};
    const int64_t n = 4096;
    rng_t r = {42};
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    void *q = malloc(row_bytes(TM_DT_F32, n));
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(q);
    fill(&r, x, n);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        tm_dtype t = types[k];
        memset(q, 0xAB, row_bytes(TM_DT_F32, n));
        tm_quant_row(t, x, q, n);
        tm_dequant_row(t, q, y, n);
        if (t == TM_DT_F32) {
            assert_memory_equal(x, y, n * sizeof(float));
        } else if (t == TM_DT_F16 || t == TM_DT_BF16) {
            double ulp = t == TM_DT_F16 ? 0x1.0p-11 : 0x1.0p-8;
            for (int64_t i = 0; i < n; i++)
                assert_true(fabs((double)x[i] - y[i]) <= fabs((double)x[i]) * ulp + 0x1.0p-25);
        } else {
            check_block_bounds(t, x, y, n);
        }
        /* Q8_K bsums are the sums of 16 quants */
        if (t == TM_DT_Q8_K) {
            const tm_block_q8_K *b = q;
            for (int64_t i = 0; i < n / 256; i++)
                for (int j = 0; j < 16; j++) {
                    int s = 0;
                    for (int l = 0; l < 16; l++) s += b[i].qs[16 * j + l];
                    assert_int_equal(s, b[i].bsums[j]);
                }
        }
        /* Q8_1: s = d * sum(qs) */
        if (t == TM_DT_Q8_1) {
            const tm_block_q8_1 *b = q;
            for (int64_t i = 0; i < n / 32; i++) {
                int s = 0;
                for (int l = 0; l < 32; l++) s += b[i].qs[l];
                float d = tm_f16_to_f32(b[i].d), sv = tm_f16_to_f32(b[i].s);
                assert_true(fabsf(sv - d * (float)s) <= fabsf(d * (float)s) * 0x1.0p-10f + d * 0.02f);
            }
        }
    }
    /* all-zero input: zero scales, exact zeros back, no NaN */
    memset(x, 0, n * sizeof(float));
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        tm_quant_row(types[k], x, q, n);
        tm_dequant_row(types[k], q, y, n);
        for (int64_t i = 0; i < n; i++) assert_true(y[i] == 0.0f);
    }
    free(x);
    free(y);
    free(q);
}

/* ---- dot products: scalar vs AVX2 vs double reference --------------------------------------------- */

typedef struct {
    double ref_q;   /* sum dequant(w) * dequant(act) in double */
    double ref_x;   /* sum dequant(w) * x in double */
    double mag;     /* sum |dequant(w) * dequant(act)| */
    double act_err; /* sum |dequant(w)| * |x - dequant(act)| */
} dot_ref;

static dot_ref reference(tm_dtype act, const float *wd, const float *x, const void *aq, int64_t n) {
    float *ad = malloc((size_t)n * sizeof(float));
    assert_non_null(ad);
    tm_dequant_row(act, aq, ad, n);
    dot_ref r = {0};
    for (int64_t i = 0; i < n; i++) {
        r.ref_q += (double)wd[i] * ad[i];
        r.ref_x += (double)wd[i] * x[i];
        r.mag += fabs((double)wd[i] * ad[i]);
        r.act_err += fabs((double)wd[i]) * fabs((double)x[i] - ad[i]);
    }
    free(ad);
    return r;
}

static void check_dot(tm_dtype t, int64_t n, rng_t *r) {
    const tm_quant_ops *so = tm_quant_ops_get_isa(t, TM_ISA_SCALAR);
    const tm_quant_ops *vo = have_avx2() ? tm_quant_ops_get_isa(t, TM_ISA_AVX2) : NULL;
    assert_non_null(so);
    assert_int_equal(so->wtype, t);
    if (vo) assert_int_equal(vo->act_type, so->act_type);
    size_t wb = row_bytes(t, n), ab = so->act_type == TM_DT_F32 ? (size_t)n * 4 : row_bytes(so->act_type, n);
    assert_true(wb > 0 && ab > 0);
    float *w = malloc((size_t)n * 4), *wd = malloc((size_t)n * 4), *x = malloc((size_t)n * 4);
    void *wq = malloc(wb), *aq = malloc(ab), *aq2 = malloc(ab);
    assert_true(w && wd && x && wq && aq && aq2);
    fill(r, w, n);
    fill(r, x, n);
    tm_quant_row(t, w, wq, n);
    tm_dequant_row(t, wq, wd, n);
    so->from_float(x, aq, n);
    if (vo) {
        vo->from_float(x, aq2, n);
        assert_memory_equal(aq, aq2, ab); /* the activation bytes do not depend on the ISA */
    }
    dot_ref ref = reference(so->act_type, wd, x, aq, n);
    double tol = 1e-6 * (double)(n < 64 ? 64 : n) / 8.0 * ref.mag + 1e-30;
    if (t == TM_DT_Q4_1) { /* the min term uses Q8_1's fp16 s = d * sum(q), not the exact sum */
        const tm_block_q4_1 *wb4 = wq;
        const tm_block_q8_1 *ab8 = aq;
        for (int64_t b = 0; b < n / 32; b++) {
            int sum = 0;
            for (int l = 0; l < 32; l++) sum += ab8[b].qs[l];
            tol += fabs(tm_f16_to_f32(wb4[b].m)) *
                   fabs((double)tm_f16_to_f32(ab8[b].s) - (double)tm_f16_to_f32(ab8[b].d) * sum);
        }
    }
    float ds = so->vec_dot(n, wq, aq);
    if (fabs(ds - ref.ref_q) > tol)
        fprintf(stderr, "%s n=%lld scalar %.9g ref %.9g tol %g\n", tm_dtype_name(t), (long long)n, ds, ref.ref_q, tol);
    assert_true(fabs(ds - ref.ref_q) <= tol);
    assert_true(fabs(ds - ref.ref_x) <= ref.act_err + tol);
    if (vo) {
        float dv = vo->vec_dot(n, wq, aq);
        if (fabs(dv - ref.ref_q) > tol)
            fprintf(stderr, "%s n=%lld avx2 %.9g ref %.9g tol %g\n", tm_dtype_name(t), (long long)n, dv, ref.ref_q, tol);
        assert_true(fabs(dv - ref.ref_q) <= tol);
        assert_true(fabs(dv - ds) <= tol);
    }
    free(w);
    free(wd);
    free(x);
    free(wq);
    free(aq);
    free(aq2);
}

static void test_dot_lengths(void **state) {
    (void)state;
    rng_t r = {7};
    const int64_t n32[] = {32, 64, 96, 576, 1536, 4096, 4128};
    const int64_t nk[] = {256, 512, 768, 1536, 4096};
    const int64_t nf[] = {1, 7, 8, 31, 33, 576, 4099};
    for (size_t k = 0; k < N_WTYPES; k++) {
        tm_dtype t = k_wtypes[k];
        const int64_t *ns = t == TM_DT_Q4_K || t == TM_DT_Q6_K ? nk : t <= TM_DT_F16 || t == TM_DT_BF16 ? nf : n32;
        size_t cnt = t == TM_DT_Q4_K || t == TM_DT_Q6_K ? sizeof nk / sizeof nk[0] : sizeof n32 / sizeof n32[0];
        if (ns == nf) cnt = sizeof nf / sizeof nf[0];
        for (size_t i = 0; i < cnt; i++) check_dot(t, ns[i], &r);
    }
}

/* Extreme activations: saturating int8 activations and weights must not overflow int16 partial sums. */
static void test_dot_extremes(void **state) {
    (void)state;
    const int64_t n = 512;
    float *w = malloc(n * 4), *x = malloc(n * 4);
    assert_true(w && x);
    for (int64_t i = 0; i < n; i++) {
        w[i] = (i & 1) ? -1.0f : 1.0f;
        x[i] = (i & 2) ? -3.0f : 3.0f;
    }
    for (size_t k = 0; k < N_WTYPES; k++) {
        tm_dtype t = k_wtypes[k];
        for (int isa = 0; isa < 2; isa++) {
            const tm_quant_ops *o = tm_quant_ops_get_isa(t, (tm_isa)isa);
            if (isa == TM_ISA_AVX2 && !have_avx2()) continue;
            assert_non_null(o);
            void *wq = malloc(row_bytes(t, n) + 1), *aq = malloc(o->act_type == TM_DT_F32 ? n * 4 : row_bytes(o->act_type, n));
            float *wd = malloc(n * 4);
            assert_true(wq && aq && wd);
            tm_quant_row(t, w, wq, n);
            tm_dequant_row(t, wq, wd, n);
            o->from_float(x, aq, n);
            dot_ref ref = reference(o->act_type, wd, x, aq, n);
            float d = o->vec_dot(n, wq, aq);
            assert_true(fabs(d - ref.ref_q) <= 1e-5 * ref.mag + 1e-6);
            free(wq);
            free(aq);
            free(wd);
        }
    }
    free(w);
    free(x);
}

/* The activation quantizers' fp16 scales across fp16's whole range (subnormal d, rounding ties, overflow to
 * infinity, zero blocks): the AVX2 bytes equal the scalar ones. */
static void test_act_scales_range(void **state) {
    (void)state;
    if (!have_avx2()) skip();
    rng_t r = {5150};
    const int64_t nb = 96, n = 32 * nb;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int rep = 0; rep < 20; rep++) {
        for (int64_t b = 0; b < nb; b++) {
            const float scale = b == 7 ? 0.0f : ldexpf(1.0f + (float)rng_unif(&r), (int)b - 40 + rep % 4);
            for (int64_t i = 0; i < 32; i++) x[b * 32 + i] = (float)(rng_unif(&r) * 2.0 - 1.0) * scale;
        }
        const tm_dtype acts[] = {TM_DT_Q8_0, TM_DT_Q4_1}; /* Q8_0 and Q8_1 activation blocks */
        for (size_t k = 0; k < 2; k++) {
            const tm_quant_ops *so = tm_quant_ops_get_isa(acts[k], TM_ISA_SCALAR), *vo = tm_quant_ops_get_isa(acts[k], TM_ISA_AVX2);
            const size_t ab = row_bytes(so->act_type, n);
            uint8_t *a0 = malloc(ab), *a1 = malloc(ab);
            assert_true(a0 && a1);
            so->from_float(x, a0, n);
            vo->from_float(x, a1, n);
            assert_memory_equal(a0, a1, ab);
            free(a0);
            free(a1);
        }
    }
    free(x);
}

/* mat_dot (tiled many-dot entry) equals vec_dot per element for odd row/column counts: bit for bit for the
 * quantized types (a row's float operations do not depend on how many rows or columns run with it) */
static void test_mat_dot(void **state) {
    (void)state;
    rng_t r = {99};
    /* (n, weight rows, activation rows): odd block counts (tails of 1-3 blocks), odd row/column counts, and
     * enough long activation rows to span several L2 column chunks */
    const int64_t shapes[][3] = {{256, 1, 1}, {512, 7, 1},  {256, 5, 6},  {768, 9, 4},
                                 {1024, 4, 9}, {224, 6, 5}, {96, 9, 1}, {4096, 3, 50}, {16640, 2, 5},
                                 {37, 5, 6},   {1000, 3, 5}}; /* the last two: float types only */
    for (size_t k = 0; k < N_WTYPES; k++) {
        tm_dtype t = k_wtypes[k];
        for (int isa = 0; isa < 2; isa++) {
            if (isa == TM_ISA_AVX2 && !have_avx2()) continue;
            const tm_quant_ops *o = tm_quant_ops_get_isa(t, (tm_isa)isa);
            assert_non_null(o);
            assert_non_null(o->mat_dot);
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                int64_t n = shapes[s][0], nr = shapes[s][1], nc = shapes[s][2];
                size_t wb = row_bytes(t, n), ab = o->act_type == TM_DT_F32 ? (size_t)n * 4 : row_bytes(o->act_type, n);
                if (wb == 0 || ab == 0) continue; /* n not a multiple of this type's block */
                size_t out_stride = (size_t)nr + 3;
                float *x = malloc((size_t)n * 4);
                uint8_t *wq = malloc(wb * (size_t)nr), *aq = malloc(ab * (size_t)nc);
                float *out = malloc(sizeof(float) * out_stride * (size_t)nc);
                assert_true(x && wq && aq && out);
                for (int64_t i = 0; i < nr; i++) {
                    fill(&r, x, n);
                    tm_quant_row(t, x, wq + (size_t)i * wb, n);
                }
                for (int64_t c = 0; c < nc; c++) {
                    fill(&r, x, n);
                    o->from_float(x, aq + (size_t)c * ab, n);
                }
                for (size_t i = 0; i < out_stride * (size_t)nc; i++) out[i] = -12345.0f;
                o->mat_dot(n, nr, wq, wb, nc, aq, ab, out, out_stride);
                for (int64_t c = 0; c < nc; c++) {
                    for (int64_t i = 0; i < nr; i++) {
                        float want = o->vec_dot(n, wq + (size_t)i * wb, aq + (size_t)c * ab);
                        float got = out[(size_t)c * out_stride + (size_t)i];
                        if (o->act_type != TM_DT_F32) { /* quantized: the same bits (8-bit batch invariance) */
                            if (memcmp(&got, &want, sizeof got) != 0)
                                fail_msg("%s isa %d n=%lld nr=%lld nc=%lld [%lld,%lld]: mat_dot %.9g != vec_dot %.9g",
                                         tm_dtype_name(t), isa, (long long)n, (long long)nr, (long long)nc, (long long)c,
                                         (long long)i, (double)got, (double)want);
                        }
                        assert_true(fabsf(got - want) <= 1e-5f * (fabsf(want) + 1.0f) * (float)n / 64.0f);
                    }
                    for (size_t i = (size_t)nr; i < out_stride; i++) assert_true(out[(size_t)c * out_stride + i] == -12345.0f);
                }
                free(x);
                free(wq);
                free(aq);
                free(out);
            }
        }
    }
}

/* ---- the x4 decode layout with 8-bit activations ------------------------------------------------- */

/* Block i of row k (0..3) of an x4 group packed by tm_quant_x4_pack, put back together in its own format. */
static void x4_block(tm_dtype t, const uint8_t *group, int64_t nb, int k, int64_t i, uint8_t *blk) {
    if (t == TM_DT_Q4_K) { /* super-block i of rows 0..3 one after another */
        memcpy(blk, group + ((size_t)i * 4 + (size_t)k) * sizeof(tm_block_q4_K), sizeof(tm_block_q4_K));
        return;
    }
    const size_t wb = row_bytes(t, 32), sb = t == TM_DT_Q4_1 ? 4 : 2, nq = (size_t)(nb / 4), tail = (size_t)(nb % 4);
    if ((size_t)i >= 4 * nq) { /* a row tail: whole blocks */
        memcpy(blk, group + nq * 16 * wb + ((size_t)k * tail + (size_t)i - 4 * nq) * wb, wb);
        return;
    }
    const uint8_t *run = group + (size_t)(i / 4) * 16 * wb, *qs = run + 16 * sb;
    const size_t j = (size_t)(i % 4);
    memcpy(blk, run + ((size_t)k * 4 + j) * sb, sb);
    if (t == TM_DT_Q8_0) {
        memcpy(blk + 2, qs + ((size_t)k * 4 + j) * 32, 32);
        return;
    }
    const uint8_t *pair = qs + ((size_t)k * 2 + j / 2) * 32; /* element e of block 2p: low nibble of byte e */
    for (int e = 0; e < 16; e++) {
        const int lo = j % 2 ? pair[e] >> 4 : pair[e] & 0x0F, hi = j % 2 ? pair[16 + e] >> 4 : pair[16 + e] & 0x0F;
        blk[sb + (size_t)e] = (uint8_t)(lo | (hi << 4));
    }
}

/* tm_quant_x4_pack puts every block where tm_quant.h says, and tm_quant_x4_get(t) over the packed weights
 * equals vec_dot of the row-major rows (and so mat_dot) bit for bit: 1..11 blocks per row (run tails of 0..3
 * blocks; Q4_K 1..5 super-blocks), 4..12 rows, starting at any group,
 * 1..9 activation rows (1 and 2: the fused decode kernel; more: the prefill tiles, with leftover columns), a
 * zero activation row, padded strides; output padding stays untouched. */
static void test_x4_kernel(void **state) {
    (void)state;
    const tm_dtype types[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K};
    const int ncs[] = {1, 2, 3, 4, 5, 9};
    rng_t r = {4711};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const tm_dtype t = types[ti];
        tm_mat_dot_x4_fn x4 = tm_quant_x4_get(t);
        if (!have_avx2()) {
            assert_null(x4);
            continue;
        }
        assert_non_null(x4);
        const tm_quant_ops *o = tm_quant_ops_get_isa(t, TM_ISA_AVX2);
        const int64_t blk = t == TM_DT_Q4_K ? TM_QK_K : 32;
        for (int nb = 1; nb <= (t == TM_DT_Q4_K ? 5 : 11); nb++) {
            const int64_t n = blk * nb, rows = 4 * (1 + nb % 3);
            const size_t rb = row_bytes(t, n), as = row_bytes(o->act_type, n) + 4; /* padded activation stride */
            float *x = malloc((size_t)n * sizeof *x);
            uint8_t *w = malloc(rb * (size_t)rows), *pk = malloc(rb * (size_t)rows), *a = malloc(9 * as);
            assert_true(x && w && pk && a);
            for (int64_t i = 0; i < rows; i++) {
                fill(&r, x, n);
                tm_quant_row(t, x, w + (size_t)i * rb, n);
            }
            assert_true(tm_quant16_x4_eligible(t, rows, n));
            tm_quant_x4_pack(t, rows, n, w, pk);
            for (int64_t row = 0; row < rows; row++)
                for (int64_t i = 0; i < nb; i++) {
                    uint8_t b[sizeof(tm_block_q4_K)];
                    const size_t wb = row_bytes(t, blk);
                    x4_block(t, pk + (size_t)(row / 4) * 4 * rb, nb, (int)(row % 4), i, b);
                    assert_memory_equal(b, w + (size_t)row * rb + (size_t)i * wb, wb);
                }
            for (int c = 0; c < 9; c++) {
                fill(&r, x, n);
                if (c == 1) memset(x, 0, (size_t)n * sizeof *x);
                o->from_float(x, a + (size_t)c * as, n);
            }
            for (size_t q = 0; q < sizeof ncs / sizeof ncs[0]; q++)
                for (int64_t g0 = 0; g0 < rows / 4; g0++) { /* rows [4 g0, rows) */
                    const int nc = ncs[q];
                    const int64_t nr = rows - 4 * g0;
                    const size_t os = (size_t)nr + 3;
                    float *out = malloc(sizeof(float) * os * (size_t)nc);
                    assert_non_null(out);
                    for (size_t i = 0; i < os * (size_t)nc; i++) out[i] = -12345.0f;
                    x4(n, nr, pk + (size_t)(4 * g0) * rb, nc, a, as, out, os);
                    for (int c = 0; c < nc; c++) {
                        for (int64_t k = 0; k < nr; k++) {
                            const float want = o->vec_dot(n, w + (size_t)(4 * g0 + k) * rb, a + (size_t)c * as);
                            const float got = out[(size_t)c * os + (size_t)k];
                            if (memcmp(&got, &want, sizeof got) != 0)
                                fail_msg("%s nb=%d nc=%d row %lld act %d: x4 %.9g != vec_dot %.9g", tm_dtype_name(t), nb,
                                         nc, (long long)(4 * g0 + k), c, (double)got, (double)want);
                        }
                        for (size_t k = (size_t)nr; k < os; k++) assert_true(out[(size_t)c * os + k] == -12345.0f);
                    }
                    free(out);
                }
            free(x);
            free(w);
            free(pk);
            free(a);
        }
    }
    assert_null(tm_quant_x4_get(TM_DT_Q6_K));
    assert_null(tm_quant_x4_get(TM_DT_Q8_1));
    assert_null(tm_quant_x4_get(TM_DT_F32));
}

/* ---- ops tables and dispatch --------------------------------------------------------------------- */

static void test_ops_tables(void **state) {
    (void)state;
    const struct { tm_dtype w, act; } want[] = {
        {TM_DT_F32, TM_DT_F32},   {TM_DT_F16, TM_DT_F32},   {TM_DT_BF16, TM_DT_F32},  {TM_DT_Q8_0, TM_DT_Q8_0},
        {TM_DT_Q4_0, TM_DT_Q8_0}, {TM_DT_Q4_1, TM_DT_Q8_1}, {TM_DT_Q4_K, TM_DT_Q8_K}, {TM_DT_Q6_K, TM_DT_Q8_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const tm_quant_ops *o = tm_quant_ops_get(want[i].w);
        assert_non_null(o);
        assert_int_equal(o->wtype, want[i].w);
        assert_int_equal(o->act_type, want[i].act);
        assert_true(o->from_float && o->vec_dot && o->mat_dot);
        assert_true(tm_dtype_supported(want[i].w));
    }
    assert_null(tm_quant_ops_get(TM_DT_Q5_0));
    assert_null(tm_quant_ops_get(TM_DT_Q8_K));
    assert_null(tm_quant_ops_get_isa(TM_DT_Q4_1, (tm_isa)7));
    /* dispatch: AVX2 when the CPU has it, scalar when forced */
    const char *old = getenv("TM_FORCE_SCALAR");
    char *saved = old ? strdup(old) : NULL;
    unsetenv("TM_FORCE_SCALAR");
    if (have_avx2()) assert_ptr_equal(tm_quant_ops_get(TM_DT_Q4_1), tm_quant_ops_get_isa(TM_DT_Q4_1, TM_ISA_AVX2));
    setenv("TM_FORCE_SCALAR", "1", 1);
    assert_ptr_equal(tm_quant_ops_get(TM_DT_Q4_1), tm_quant_ops_get_isa(TM_DT_Q4_1, TM_ISA_SCALAR));
    if (saved) setenv("TM_FORCE_SCALAR", saved, 1);
    else unsetenv("TM_FORCE_SCALAR");
    free(saved);
}

/* ---- golden files from gguf-py (tests/py/gen_quant_golden.py) ------------------------------------ */

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = sz > 0 ? malloc((size_t)sz) : NULL;
    if (buf && fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = buf ? (size_t)sz : 0;
    return buf;
}

static void check_golden(const char *name, tm_dtype want_type) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/quant/%s.bin", name);
    size_t len = 0;
    uint8_t *buf = read_file(path, &len);
    if (!buf) fprintf(stderr, "missing golden %s (run from the repo root)\n", path);
    assert_non_null(buf);
    assert_true(len >= 24);
    assert_memory_equal(buf, "TMQG", 4);
    uint32_t hdr[5];
    memcpy(hdr, buf + 4, sizeof hdr);
    const uint32_t version = hdr[0], type = hdr[1], n = hdr[2], nbytes = hdr[3], has_src = hdr[4];
    assert_int_equal(version, 1);
    assert_int_equal(type, want_type);
    assert_int_equal(nbytes, tm_dtype_row_bytes(type, n));
    assert_int_equal(len, 24 + (size_t)nbytes + (has_src ? 2u : 1u) * (size_t)n * 4);
    const uint8_t *raw = buf + 24;
    float *src = has_src ? malloc((size_t)n * 4) : NULL, *expect = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    assert_true(expect && got && (!has_src || src));
    if (has_src) memcpy(src, raw + nbytes, (size_t)n * 4);
    memcpy(expect, raw + nbytes + (has_src ? (size_t)n * 4 : 0), (size_t)n * 4);
    tm_dequant_row((tm_dtype)type, raw, got, n);
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &expect[i], 4);
        if (a != b && !(isnan(got[i]) && isnan(expect[i]))) {
            if (bad++ < 5) fprintf(stderr, "%s dequant[%u]: got %.9g (%08x) want %.9g (%08x)\n", name, i, got[i], a, expect[i], b);
        }
    }
    assert_int_equal(bad, 0);
    if (has_src) { /* tokenmill's quantizer must produce gguf-py's bytes */
        uint8_t *q = malloc(nbytes);
        assert_non_null(q);
        tm_quant_row((tm_dtype)type, src, q, n);
        for (uint32_t i = 0; i < nbytes; i++) {
            if (q[i] != raw[i] && bad++ < 5) fprintf(stderr, "%s quant byte %u: got %02x want %02x\n", name, i, q[i], raw[i]);
        }
        assert_int_equal(bad, 0);
        free(q);
    }
    free(src);
    free(expect);
    free(got);
    free(buf);
}

static void test_golden(void **state) {
    (void)state;
    check_golden("f32", TM_DT_F32);
    check_golden("f16", TM_DT_F16);
    check_golden("bf16", TM_DT_BF16);
    check_golden("q8_0", TM_DT_Q8_0);
    check_golden("q4_0", TM_DT_Q4_0);
    check_golden("q4_1", TM_DT_Q4_1);
    check_golden("q4_K", TM_DT_Q4_K);
    check_golden("q6_K", TM_DT_Q6_K);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_roundtrip), cmocka_unit_test(test_half_dot_all_values),
        cmocka_unit_test(test_quant_roundtrip),
        cmocka_unit_test(test_dot_lengths),    cmocka_unit_test(test_dot_extremes),
        cmocka_unit_test(test_act_scales_range), cmocka_unit_test(test_mat_dot), cmocka_unit_test(test_x4_kernel),
        cmocka_unit_test(test_ops_tables),
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
