/* test_cpu_kernels.c -- CPU row kernels: AVX2 against scalar, online-softmax attention against a naive softmax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "backend/cpu/tm_cpu_kernels.h"
#include "core/tm_fp8.h"

#include <string.h>

static uint64_t g_s = 99;
static float frand(float a) {
    g_s = g_s * 6364136223846793005ull + 1442695040888963407ull;
    return a * (float)((double)(g_s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void check_close(const float *a, const float *b, int n, double rtol, const char *what) {
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), m = fmax(fabs((double)b[i]), 1e-6);
        if (d > rtol * m + 1e-7) fail_msg("%s[%d]: %.9g vs %.9g", what, i, (double)a[i], (double)b[i]);
    }
}

static void each_table(void (*fn)(const tm_cpu_kernel_table *k, const char *name)) {
    tm_cpu_kernel_table s = tm_cpu_kernels_select(false);
    fn(&s, "scalar");
    if (tm_cpu_use_avx2()) {
        tm_cpu_kernel_table a = tm_cpu_kernels_select(true);
        fn(&a, "avx2");
    }
}

static void norms(const tm_cpu_kernel_table *k, const char *name) {
    const int dims[] = {1, 7, 8, 16, 63, 576, 4096};
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; t++) {
        int d = dims[t];
        float *x = malloc(sizeof(float) * d), *w = malloc(sizeof(float) * d), *o = malloc(sizeof(float) * d);
        float *res = malloc(sizeof(float) * d), *ref = malloc(sizeof(float) * d), *res2 = malloc(sizeof(float) * d);
        for (int i = 0; i < d; i++) { x[i] = frand(3); w[i] = frand(2); res[i] = res2[i] = frand(5); }
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
        for (int i = 0; i < d; i++) ref[i] = (float)(x[i] / sqrt(ss / d + 1e-5) * w[i]);
        k->rmsnorm_row(x, w, 1e-5f, d, o);
        check_close(o, ref, d, 1e-5, name);
        /* fused add + norm: res += x; o = norm(res) */
        k->add_rmsnorm_row(res, x, w, 1e-5f, d, o);
        ss = 0;
        for (int i = 0; i < d; i++) { res2[i] += x[i]; ss += (double)res2[i] * res2[i]; }
        for (int i = 0; i < d; i++) ref[i] = (float)(res2[i] / sqrt(ss / d + 1e-5) * w[i]);
        check_close(res, res2, d, 1e-7, name);
        check_close(o, ref, d, 1e-5, name);
        free(x); free(w); free(o); free(res); free(ref); free(res2);
    }
}

static void swiglu(const tm_cpu_kernel_table *k, const char *name) {
    enum { N = 1003 };
    float g[N], u[N], o[N], ref[N];
    for (int i = 0; i < N; i++) { g[i] = frand(30); u[i] = frand(4); }
    g[0] = -100.0f; g[1] = 100.0f; g[2] = 0.0f; g[3] = -87.0f; g[4] = 89.0f;
    for (int i = 0; i < N; i++) ref[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    k->swiglu(g, u, o, N);
    check_close(o, ref, N, 2e-6, name);
    k->swiglu(g, u, g, N); /* out may alias g */
    check_close(g, ref, N, 2e-6, name);
}

static void attention(const tm_cpu_kernel_table *k, const char *name) {
    const int hds[] = {16, 64, 80, 128};
    for (size_t t = 0; t < sizeof hds / sizeof hds[0]; t++) {
        int hd = hds[t], n = 77, bs = 16;
        float *q = malloc(sizeof(float) * hd), *K = malloc(sizeof(float) * n * hd), *V = malloc(sizeof(float) * n * hd);
        float *o = malloc(sizeof(float) * hd), sc[16];
        double *ref = calloc((size_t)hd, sizeof(double)), *s = malloc(sizeof(double) * n);
        for (int i = 0; i < hd; i++) q[i] = frand(2);
        for (int i = 0; i < n * hd; i++) { K[i] = frand(2); V[i] = frand(1); }
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n; j++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[i] * K[j * hd + i];
            s[j] = d / sqrt((double)hd);
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < hd; i++) ref[i] += s[j] / sum * V[j * hd + i];
        tm_cpu_attn_state st;
        tm_cpu_attn_begin(&st, o, hd);
        for (int j0 = 0; j0 < n; j0 += bs) /* blocks of 16, the last partial */
            k->attn_block(&st, q, K + j0 * hd, V + j0 * hd, n - j0 < bs ? n - j0 : bs, hd, 1.0f / sqrtf((float)hd), sc);
        tm_cpu_attn_end(&st);
        float rf[128];
        for (int i = 0; i < hd; i++) rf[i] = (float)ref[i];
        check_close(o, rf, hd, 1e-4, name);
        free(q); free(K); free(V); free(o); free(ref); free(s);
    }
}

/* fp8 e4m3 widening (the cpu KV cache's reads): every byte, at every offset of a vector, equals the reference
 * conversion bit for bit (NaN as NaN); lengths that leave a scalar tail */
static void fp8_widen(const tm_cpu_kernel_table *k, const char *name) {
    uint8_t b[256 + 7];
    float got[256 + 7];
    for (int shift = 0; shift < 8; shift++) {
        const int n = 256 - shift;
        for (int i = 0; i < n; i++) b[i] = (uint8_t)(i + shift * 37);
        k->fp8_to_f32(b, got, n);
        for (int i = 0; i < n; i++) {
            const float want = tm_fp8_to_f32(b[i]);
            if (isnan(want)) {
                if (!isnan(got[i])) fail_msg("%s: byte 0x%02x -> %g, want NaN", name, b[i], (double)got[i]);
            } else if (memcmp(&want, &got[i], sizeof want) != 0) {
                fail_msg("%s: byte 0x%02x -> %.9g, want %.9g", name, b[i], (double)got[i], (double)want);
            }
        }
    }
}

static void test_norms(void **st) { (void)st; each_table(norms); }
/* f16 (the cpu KV cache's f16 mode): every one of the 65,536 halves widens to the reference value (NaN as NaN), at
 * every vector offset; narrowing rounds to nearest even like the reference for normal, subnormal, halfway,
 * overflowing and zero values (NaN stays NaN) */
static void f16_convert(const tm_cpu_kernel_table *k, const char *name) {
    enum { N = 65536 };
    uint16_t *h = malloc(sizeof(uint16_t) * (N + 7)), *h2 = malloc(sizeof(uint16_t) * (N + 7));
    float *f = malloc(sizeof(float) * (N + 7)), *x = malloc(sizeof(float) * (N + 7));
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    for (int shift = 0; shift < 3; shift++) {
        k->f16_to_f32(h + shift, f, N - shift);
        for (int i = 0; i < N - shift; i++) {
            const float want = tm_f16_to_f32(h[i + shift]);
            if (isnan(want) ? !isnan(f[i]) : memcmp(&want, &f[i], sizeof want) != 0)
                fail_msg("%s: half 0x%04x -> %.9g, want %.9g", name, h[i + shift], (double)f[i], (double)want);
        }
    }
    /* narrowing: the halves' own values and the points halfway between neighbours (ties), a bit above and below,
     * values past the largest half (65504) and below the smallest subnormal */
    int n = 0;
    for (int i = 0; i < N && n + 4 <= N; i += 16) {
        const float a = tm_f16_to_f32((uint16_t)i), b = tm_f16_to_f32((uint16_t)(i + 1));
        if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) continue;
        const float mid = (float)(((double)a + (double)b) / 2);
        x[n++] = a;
        x[n++] = mid;
        x[n++] = nextafterf(mid, INFINITY);
        x[n++] = nextafterf(mid, -INFINITY);
    }
    const float extra[] = {65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f, 2.9e-8f, 3.0e-8f, 1e-10f, -0.0f, 0.0f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0] && n < N; i++) x[n++] = extra[i];
    k->f32_to_f16(x, h2, n);
    for (int i = 0; i < n; i++) {
        const uint16_t want = tm_f32_to_f16(x[i]);
        if (h2[i] != want) fail_msg("%s: %.9g -> 0x%04x, want 0x%04x", name, (double)x[i], h2[i], want);
    }
    x[0] = NAN;
    k->f32_to_f16(x, h2, 1);
    assert_true(isnan(tm_f16_to_f32(h2[0])));
    free(h);
    free(h2);
    free(f);
    free(x);
}

static void test_fp8_widen(void **st) { (void)st; each_table(fp8_widen); }
static void test_f16_convert(void **st) { (void)st; each_table(f16_convert); }
static void test_swiglu(void **st) { (void)st; each_table(swiglu); }
static void test_attention_online_softmax(void **st) { (void)st; each_table(attention); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_attention_online_softmax),
        cmocka_unit_test(test_fp8_widen),
        cmocka_unit_test(test_f16_convert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
