/* tb_elementwise.c -- test bed of SwiGLU (flat and over a fused [gate | up] product), get_rows, bf16 <-> f32
 * conversions and fill_random (CPU references). */
#include "tb_common.h"

#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_core.h"
#include "core/tm_dtype.h"
#include "core/tm_fp8.h"

static void set_swiglu_version(int v) {
    if (v == 1)
        setenv("TM_CUDA_SWIGLU_V", "1", 1);
    else
        unsetenv("TM_CUDA_SWIGLU_V");
}

/* ---- SwiGLU ---- */

/* alias: 0 none, 1 out = gate, 2 out = up; misalign shifts every pointer by one element (scalar path) */
static void check_swiglu(int n, int ffn, int alias, bool misalign, int version) {
    size_t ne = (size_t)n * ffn, off = misalign ? 1 : 0;
    uint16_t *g = malloc(ne * 2 + 2), *u = malloc(ne * 2 + 2), *out = malloc(ne * 2 + 2);
    float *ref = malloc(ne * sizeof(float) + 4);
    tb_fill_bf16(g, NULL, ne, 3.0f);
    tb_fill_bf16(u, NULL, ne, 1.0f);
    if (ne > 2) g[0] = tb_f32_to_bf16(-100.0f), g[1] = tb_f32_to_bf16(60.0f); /* both tails of silu */
    for (size_t i = 0; i < ne; i++) {
        double x = tb_bf16_to_f32(g[i]);
        ref[i] = (float)(x / (1.0 + exp(-x)) * tb_bf16_to_f32(u[i]));
    }
    uint16_t *d_g = tb_dev((ne + off) * 2), *d_u = tb_dev((ne + off) * 2), *d_o = tb_dev((ne + off) * 2);
    TB_CHECK(cudaMemcpy(d_g + off, g, ne * 2, cudaMemcpyHostToDevice));
    TB_CHECK(cudaMemcpy(d_u + off, u, ne * 2, cudaMemcpyHostToDevice));
    tb_poison(d_o, (ne + off) * 2);
    uint16_t *dst = alias == 1 ? d_g : alias == 2 ? d_u : d_o;
    set_swiglu_version(version);
    TB_RUN(tm_cuda_swiglu(d_g + off, d_u + off, n, ffn, dst + off, 0));
    set_swiglu_version(2);
    tb_download(out, dst + off, ne * 2);
    double err = tb_rel_err_bf16(out, ref, ne);
    char name[96];
    snprintf(name, sizeof name, "v%d n=%d ffn=%d%s%s", version, n, ffn,
             alias == 1   ? " out=gate"
             : alias == 2 ? " out=up"
                          : "",
             misalign ? " misaligned" : "");
    tb_result("swiglu", name, err, 1e-2, 0, 0, 0, 'm');
    cudaFree(d_g);
    cudaFree(d_u);
    cudaFree(d_o);
    free(g);
    free(u);
    free(out);
    free(ref);
}

/* tm_cuda_swiglu_rows: gu (n, 2 ffn) -> out (n, ffn) against the double reference, and (with8) every e4m3 byte of
 * out8 equal to the host rounding of the kernel's own bf16 output times inv; misalign: gu one element off (the
 * element path) */
static void check_swiglu_rows(int n, int ffn, bool with8, bool misalign) {
    const size_t ne = (size_t)n * ffn, off = misalign ? 1 : 0;
    const float inv = 16.0f;
    uint16_t *gu = malloc(2 * ne * 2), *out = malloc(ne * 2);
    uint8_t *o8 = malloc(ne + 1);
    float *ref = malloc(ne * sizeof(float));
    tb_fill_bf16(gu, NULL, 2 * ne, 3.0f);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < ffn; j++) {
            const double g = tb_bf16_to_f32(gu[(size_t)t * 2 * ffn + j]), u = tb_bf16_to_f32(gu[(size_t)t * 2 * ffn + ffn + j]);
            ref[(size_t)t * ffn + j] = (float)(g / (1.0 + exp(-g)) * u);
        }
    uint16_t *d_gu = tb_dev((2 * ne + off) * 2), *d_o = tb_dev(ne * 2);
    uint8_t *d_o8 = tb_dev(ne + 8);
    TB_CHECK(cudaMemcpy(d_gu + off, gu, 2 * ne * 2, cudaMemcpyHostToDevice));
    tb_poison(d_o, ne * 2);
    tb_poison(d_o8, ne + 8);
    TB_RUN(tm_cuda_swiglu_rows(d_gu + off, n, ffn, d_o, with8 ? d_o8 : NULL, inv, 0));
    tb_download(out, d_o, ne * 2);
    double err = tb_rel_err_bf16(out, ref, ne), bad = 0;
    if (with8) {
        tb_download(o8, d_o8, ne);
        for (size_t i = 0; i < ne; i++) bad += o8[i] != tm_fp8_from_f32(tb_bf16_to_f32(out[i]) * inv);
        /* the e4m3 copy alone (out NULL): the same bytes; out, made afterwards without the copy: the same bf16 */
        uint16_t *out2 = malloc(ne * 2);
        uint8_t *o8b = malloc(ne);
        tb_poison(d_o8, ne + 8);
        tb_poison(d_o, ne * 2);
        TB_RUN(tm_cuda_swiglu_rows(d_gu + off, n, ffn, NULL, d_o8, inv, 0));
        tb_download(o8b, d_o8, ne);
        tb_download(out2, d_o, ne * 2);
        for (size_t i = 0; i < ne; i++) bad += o8b[i] != o8[i] || out2[i] != 0xFFFF; /* out untouched */
        TB_RUN(tm_cuda_swiglu_rows(d_gu + off, n, ffn, d_o, NULL, 0.0f, 0));
        tb_download(out2, d_o, ne * 2);
        for (size_t i = 0; i < ne; i++) bad += out2[i] != out[i];
        free(out2);
        free(o8b);
    }
    char name[96];
    snprintf(name, sizeof name, "rows n=%d ffn=%d%s%s", n, ffn, with8 ? " +fp8" : "", misalign ? " misaligned" : "");
    tb_result("swiglu", name, err, 1e-2, 0, 0, 0, 'm');
    if (with8) {
        snprintf(name, sizeof name, "rows n=%d ffn=%d fp8 bytes, fp8-only, deferred bf16: differing", n, ffn);
        tb_result("swiglu", name, bad, 0, 0, 0, 0, 'm');
    }
    cudaFree(d_gu);
    cudaFree(d_o);
    cudaFree(d_o8);
    free(gu);
    free(out);
    free(o8);
    free(ref);
}

typedef struct {
    uint16_t *g, *u, *o;
    int n, ffn;
} swiglu_arg;

static void run_swiglu(void *p) {
    swiglu_arg *a = p;
    TB_CHECK(tm_cuda_swiglu(a->g, a->u, a->n, a->ffn, a->o, 0));
}

static void run_swiglu_rows(void *p) {
    swiglu_arg *a = p;
    TB_CHECK(tm_cuda_swiglu_rows(a->g, a->n, a->ffn, a->o, (uint8_t *)a->u, 16.0f, 0));
}

/* the fused SwiGLU with the fp8 copy: reads 2 ffn bf16, writes ffn bf16 + ffn e4m3 a row */
static void time_swiglu_rows(int n, int ffn) {
    size_t ne = (size_t)n * ffn;
    swiglu_arg a = {tb_dev(2 * ne * 2), tb_dev(ne), tb_dev(ne * 2), n, ffn};
    TB_CHECK(tm_cuda_fill_random(a.g, TM_DT_BF16, 2 * ne, 1, 4.0f, 0.0f, 0));
    double us = tb_time_us(run_swiglu_rows, &a, 3, ne >= (1u << 24) ? 30 : 200);
    char name[96];
    snprintf(name, sizeof name, "rows+fp8 n=%d ffn=%d", n, ffn);
    tb_result("swiglu", name, 0, 0, us, 7.0 * ne, 0, 'm');
    cudaFree(a.g);
    cudaFree(a.u);
    cudaFree(a.o);
}

static void time_swiglu(const char *label, int n, int ffn, int version) {
    size_t ne = (size_t)n * ffn;
    swiglu_arg a = {tb_dev(ne * 2), tb_dev(ne * 2), tb_dev(ne * 2), n, ffn};
    TB_CHECK(tm_cuda_fill_random(a.g, TM_DT_BF16, ne, 1, 4.0f, 0.0f, 0));
    TB_CHECK(tm_cuda_fill_random(a.u, TM_DT_BF16, ne, 2, 1.0f, 0.0f, 0));
    set_swiglu_version(version);
    double us = tb_time_us(run_swiglu, &a, 3, ne >= (1u << 24) ? 30 : 200);
    set_swiglu_version(2);
    char name[96];
    snprintf(name, sizeof name, "v%d %s n=%d ffn=%d", version, label, n, ffn);
    tb_result("swiglu", name, 0, 0, us, 3.0 * ne * 2, 0, 'm');
    cudaFree(a.g);
    cudaFree(a.u);
    cudaFree(a.o);
}

/* ---- get_rows ---- */

static void check_get_rows(int rows, int width, int n_idx, bool misalign) {
    size_t nx = (size_t)rows * width, no = (size_t)n_idx * width, off = misalign ? 1 : 0;
    uint16_t *x = malloc(nx * 2), *out = malloc(no * 2 + 2);
    int32_t *idx = malloc(n_idx * sizeof(int32_t));
    tb_fill_bf16(x, NULL, nx, 1.0f);
    for (int j = 0; j < n_idx; j++) idx[j] = j == 0 ? rows - 1 : (int32_t)(tb_rand_u64() % rows); /* repeats too */
    uint16_t *d_x = tb_dev((nx + off) * 2), *d_o = tb_dev((no + off) * 2);
    TB_CHECK(cudaMemcpy(d_x + off, x, nx * 2, cudaMemcpyHostToDevice));
    int32_t *d_idx = tb_upload(idx, n_idx * sizeof(int32_t));
    tb_poison(d_o, (no + off) * 2);
    TB_RUN(tm_cuda_get_rows(d_x + off, d_idx, n_idx, width, d_o + off, 0));
    tb_download(out, d_o + off, no * 2);
    size_t bad = 0;
    for (int j = 0; j < n_idx; j++)
        bad += memcmp(out + (size_t)j * width, x + (size_t)idx[j] * width, (size_t)width * 2) != 0;
    char name[96];
    snprintf(name, sizeof name, "rows=%d width=%d n_idx=%d%s", rows, width, n_idx, misalign ? " misaligned" : "");
    tb_result("get_rows", name, (double)bad, 0, 0, 0, 0, 'm');
    cudaFree(d_x);
    cudaFree(d_o);
    cudaFree(d_idx);
    free(x);
    free(out);
    free(idx);
}

typedef struct {
    uint16_t *x, *o;
    int32_t *idx;
    int n_idx, width;
} rows_arg;

static void run_rows(void *p) {
    rows_arg *a = p;
    TB_CHECK(tm_cuda_get_rows(a->x, a->idx, a->n_idx, a->width, a->o, 0));
}

static void time_get_rows(int rows, int width, int n_idx) {
    int32_t *idx = malloc(n_idx * sizeof(int32_t));
    for (int j = 0; j < n_idx; j++) idx[j] = (int32_t)((size_t)j * rows / n_idx);
    rows_arg a = {tb_dev((size_t)rows * width * 2), tb_dev((size_t)n_idx * width * 2),
                  tb_upload(idx, n_idx * sizeof(int32_t)), n_idx, width};
    TB_CHECK(cudaMemset(a.x, 0, (size_t)rows * width * 2));
    double us = tb_time_us(run_rows, &a, 3, 200);
    char name[96];
    snprintf(name, sizeof name, "rows=%d width=%d n_idx=%d", rows, width, n_idx);
    tb_result("get_rows", name, 0, 0, us, 2.0 * n_idx * width * 2 + n_idx * 4.0, 0, 'm');
    cudaFree(a.x);
    cudaFree(a.o);
    cudaFree(a.idx);
    free(idx);
}

/* ---- conversions ---- */

static void check_convert(size_t n, bool misalign) {
    size_t off = misalign ? 1 : 0;
    uint16_t *h = malloc(n * 2), *h_out = malloc(n * 2);
    float *f = malloc(n * sizeof(float)), *f_out = malloc(n * sizeof(float));
    tb_fill_bf16(h, NULL, n, 10.0f);
    for (size_t i = 0; i < n; i++) f[i] = 10.0f * tb_normal();
    if (n > 4) f[0] = 1.00390625f, f[1] = 1.01171875f, f[2] = -3.0e38f, f[3] = 1e-40f; /* ties, huge, subnormal */
    uint16_t *d_h = tb_dev((n + off) * 2), *d_h2 = tb_dev((n + off) * 2);
    float *d_f = tb_dev((n + off) * 4), *d_f2 = tb_dev((n + off) * 4);
    TB_CHECK(cudaMemcpy(d_h + off, h, n * 2, cudaMemcpyHostToDevice));
    TB_CHECK(cudaMemcpy(d_f + off, f, n * 4, cudaMemcpyHostToDevice));
    tb_poison(d_h2, (n + off) * 2);
    tb_poison(d_f2, (n + off) * 4);
    TB_RUN(tm_cuda_bf16_to_f32(d_h + off, n, d_f2 + off, 0));
    TB_RUN(tm_cuda_f32_to_bf16(d_f + off, n, d_h2 + off, 0));
    tb_download(f_out, d_f2 + off, n * 4);
    tb_download(h_out, d_h2 + off, n * 2);
    size_t bad1 = 0, bad2 = 0;
    for (size_t i = 0; i < n; i++) {
        float e = tb_bf16_to_f32(h[i]);
        bad1 += memcmp(&f_out[i], &e, 4) != 0;
        bad2 += h_out[i] != tb_f32_to_bf16(f[i]);
    }
    char name[96];
    snprintf(name, sizeof name, "n=%zu%s", n, misalign ? " misaligned" : "");
    tb_result("bf16_to_f32", name, (double)bad1, 0, 0, 0, 0, 'm');
    tb_result("f32_to_bf16", name, (double)bad2, 0, 0, 0, 0, 'm');
    cudaFree(d_h);
    cudaFree(d_h2);
    cudaFree(d_f);
    cudaFree(d_f2);
    free(h);
    free(h_out);
    free(f);
    free(f_out);
}

typedef struct {
    void *in, *out;
    size_t n;
    bool to_f32;
} conv_arg;

static void run_conv(void *p) {
    conv_arg *a = p;
    if (a->to_f32)
        TB_CHECK(tm_cuda_bf16_to_f32(a->in, a->n, a->out, 0));
    else
        TB_CHECK(tm_cuda_f32_to_bf16(a->in, a->n, a->out, 0));
}

static void time_convert(size_t n) {
    conv_arg a = {tb_dev(n * 4), tb_dev(n * 4), n, true};
    TB_CHECK(cudaMemset(a.in, 0, n * 4));
    char name[64];
    snprintf(name, sizeof name, "n=%zu", n);
    tb_result("bf16_to_f32", name, 0, 0, tb_time_us(run_conv, &a, 3, 50), 6.0 * n, 0, 'm');
    a.to_f32 = false;
    tb_result("f32_to_bf16", name, 0, 0, tb_time_us(run_conv, &a, 3, 50), 6.0 * n, 0, 'm');
    cudaFree(a.in);
    cudaFree(a.out);
}

/* ---- fill_random ---- */

/* the kernel's hash, on the CPU: splitmix64(seed ^ i * gamma) -> top 24 bits -> [-1, 1) */
static float ref_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = (seed ^ (i * 0x9e3779b97f4a7c15ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(uint32_t)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static float elem_f32(const void *buf, int type, size_t i) {
    if (type == TM_DT_F32) return ((const float *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    return type == TM_DT_F16 ? tm_f16_to_f32(h) : tb_bf16_to_f32(h);
}

static bool same_elem(const void *buf, int type, size_t i, float want) {
    if (type == TM_DT_F32) return memcmp((const float *)buf + i, &want, 4) == 0;
    uint16_t h = ((const uint16_t *)buf)[i];
    return h == (type == TM_DT_F16 ? tm_f32_to_f16(want) : tb_f32_to_bf16(want));
}

static void check_fill(int type, const char *tname, size_t n) {
    size_t es = type == TM_DT_F32 ? 4 : 2;
    void *a = malloc(n * es), *b = malloc(n * es), *c = malloc(n * es);
    void *d = tb_dev(n * es);
    const float scale = 0.5f;
    tb_poison(d, n * es);
    TB_RUN(tm_cuda_fill_random(d, type, n, 1234, scale, 0.0f, 0));
    tb_download(a, d, n * es);
    tb_poison(d, n * es);
    TB_RUN(tm_cuda_fill_random(d, type, n, 1234, scale, 0.0f, 0));
    tb_download(b, d, n * es);
    TB_RUN(tm_cuda_fill_random(d, type, n, 1235, scale, 0.0f, 0));
    tb_download(c, d, n * es);
    size_t bad_ref = 0, same_seed_diff = 0, other_seed_same = 0;
    double sum = 0.0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        bad_ref += !same_elem(a, type, i, scale * ref_uniform(1234, i));
        same_seed_diff += memcmp((char *)a + i * es, (char *)b + i * es, es) != 0;
        other_seed_same += memcmp((char *)a + i * es, (char *)c + i * es, es) == 0;
        double x = elem_f32(a, type, i);
        sum += x;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    double mean = sum / n;
    /* uniform(-1, 1) * scale: sd of the mean = scale / sqrt(3 n); 6 sd, plus the range hitting both ends */
    bool stats_ok = lo >= -scale && hi <= scale &&
                    (n < 1000 || (fabs(mean) < 6.0 * scale / sqrt(3.0 * n) && lo < -0.99 * scale && hi > 0.99 * scale));
    bool seeds_ok = same_seed_diff == 0 && other_seed_same < n / 100 + 10;
    if (!stats_ok || !seeds_ok || bad_ref)
        printf("# fill %s: mean %.3g range [%.4g, %.4g], %zu differ from the CPU hash, same seed %zu differ, "
               "other seed %zu equal\n",
               tname, mean, lo, hi, bad_ref, same_seed_diff, other_seed_same);
    char name[64];
    snprintf(name, sizeof name, "%s random n=%zu", tname, n);
    tb_result("fill_random", name, (double)bad_ref + !stats_ok + !seeds_ok, 0, 0, 0, 0, 'm');
    /* constant mode */
    const float k = 0.3f;
    TB_RUN(tm_cuda_fill_random(d, type, n, 99, scale, k, 0));
    tb_download(a, d, n * es);
    size_t bad_k = 0;
    for (size_t i = 0; i < n; i++) bad_k += !same_elem(a, type, i, k);
    snprintf(name, sizeof name, "%s constant n=%zu", tname, n);
    tb_result("fill_random", name, (double)bad_k, 0, 0, 0, 0, 'm');
    cudaFree(d);
    free(a);
    free(b);
    free(c);
}

typedef struct {
    void *d;
    size_t n;
} fill_arg;

static void run_fill(void *p) {
    fill_arg *a = p;
    TB_CHECK(tm_cuda_fill_random(a->d, TM_DT_BF16, a->n, 5, 0.02f, 0.0f, 0));
}

int main(void) {
    tb_seed();
    for (int v = 1; v <= 2; v++) {
        check_swiglu(1, 14336, 0, false, v);
        check_swiglu(3, 8192, 0, false, v);
        check_swiglu(5, 13, 0, false, v);
        check_swiglu(1, 7, 0, false, v);
        check_swiglu(2, 4104, 1, false, v);
        check_swiglu(2, 4104, 2, false, v);
        check_swiglu(3, 1001, 0, true, v);
        check_swiglu(64, 8200, 0, false, v);
    }
    check_swiglu_rows(1, 14336, true, false);
    check_swiglu_rows(37, 8192, true, false);
    check_swiglu_rows(5, 13, true, false);
    check_swiglu_rows(3, 1001, false, true);
    check_swiglu_rows(64, 4104, false, false);
    check_get_rows(100, 4096, 7, false);
    check_get_rows(10, 13, 5, false);
    check_get_rows(50, 2048, 64, true);
    check_get_rows(3, 8, 1, false);
    check_convert(1, false);
    check_convert(7, false);
    check_convert(8, false);
    check_convert(1000003, false);
    check_convert(4099, true);
    check_fill(TM_DT_F32, "f32", 1000003);
    check_fill(TM_DT_F16, "f16", 1000003);
    check_fill(TM_DT_BF16, "bf16", 1000003);
    check_fill(TM_DT_BF16, "bf16", 5);

    if (getenv("TB_CHECK_ONLY")) return tb_finish("tb_elementwise"); /* correctness only, no timing */
    time_swiglu("8B-prefill", 4096, 14336, 2);
    time_swiglu("8B-prefill", 4096, 14336, 1);
    time_swiglu("1B-prefill", 4096, 8192, 2);
    time_swiglu("8B-decode", 1, 14336, 2);
    time_swiglu("8B-decode", 64, 14336, 2);
    time_swiglu_rows(512, 14336);
    time_swiglu_rows(4096, 14336);
    time_get_rows(4096, 4096, 256);
    time_get_rows(4096, 4096, 1);
    time_convert((size_t)1 << 26);
    fill_arg fa = {tb_dev((size_t)1 << 28), (size_t)1 << 27};
    tb_result("fill_random", "bf16 n=2^27", 0, 0, tb_time_us(run_fill, &fa, 2, 20), 2.0 * fa.n, 0, 'm');
    cudaFree(fa.d);
    return tb_finish("tb_elementwise");
}
