/* tb_fp8.c -- fp8 e4m3 weights (W8A8, backend.h): tm_cuda_quant_fp8, the fp8 GEMVs and the cuBLASLt fp8 GEMM
 * against a double CPU reference, then their speed on Llama-3-8B shapes beside the bf16 ones. */
#include "backend/cuda/tm_cuda_blas.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "core/tm_fp8.h"
#include "tb_common.h"
#include "tb_guard.h"

/* The W8A8 product (backend.h): out = scale * act_scale * sum_j e4m3(x_j / act_scale) * e4m3(w_j) (+ bias), with
 * x the bf16 activations and act_scale a power of two.
 * Checks:
 *  - tm_cuda_quant_fp8: every byte equal to the host rounding tm_fp8_from_f32(bf16(x) / act_scale) (values up to
 *    ~20x the saturation point, so +-448 is hit), lengths 1, 7, 8, 4099, 1 Mi, aligned and not (scalar path);
 *  - the GEMVs (tm_cuda_gemv with a bias and f32 output, bf16 output, SwiGLU with different gate and up scales,
 *    a Q/K/V group with bit-identity to the single products), n = 1..8, v2 and v1 (TM_CUDA_GEMV_V=1), odd row
 *    counts and cols of 16 .. 14336; tolerance 1e-4 (f32 out: the sums of exact products differ only in order)
 *    and 1e-2 (bf16). "v2" is the tensor-core kernel (tm_cuda_gemv_fp8tc.cu) where the rows are a multiple of 16
 *    and cols of 64 (1024 x 4096, 64 x 14336), the CUDA-core one elsewhere;
 *  - the tensor-core kernel from pre-rounded x (tm_cuda_gemv_fp8tc) at 8 and 32 warps a block and the launcher's
 *    choice, n = 1..8, against the double reference (1e-3 f32, 1e-2 bf16), and its q|k|v RoPE epilogue (q and the
 *    bf16 or fp8 cache entries) against the CUDA-core kernel's (1e-2, fp8 cache 3e-2);
 *  - the fp8 GEMM (tm_cuda_quant_fp8 then tm_cuda_blas_gemm_fp8, as the backend runs it for n > 8) on 8B shapes,
 *    n = 9 .. 2048, on 512 sampled outputs against the double reference of the same quantized operands, with and
 *    without fast accumulation; tolerance 1e-2 (bf16 out) and, f32 out, 1e-3 (cuBLASLt's fp8 sums are not f32-exact:
 *    1.2e-4 measured without fast accumulation) or 1e-2 (fast);
 *  - bad arguments: a missing or non-power-of-two activation scale, fp8 through dequant/embed, a k that is not a
 *    multiple of 16.
 * Timing: the fp8 GEMM (with and without fast accumulation) against the bf16 GEMM on the 8B layer's shapes (q = o,
 * k = v, qkv as one product, gate = up, gate+up as one, down) at n = 256 and 512 (decode batches), 2048 and 8192
 * (prefill chunks), TFLOP/s against the measured bf16 ceiling (the fp8 tensor-core peak is twice the bf16 one);
 * the activation rounding kernel (GB/s); the fp8 GEMV at n = 1 on the 8B shapes (GB/s against the copy ceiling;
 * weights rotate over >= 160 MB of copies so that L2 does not serve them); the fp8 GEMV on the CUDA cores, on the
 * tensor cores, and on the tensor cores from pre-rounded x, n = 1 and 8, 1B and 8B shapes, in chains of one shape
 * under PDL (TB_FP8_TC_ONLY=1: the tensor-core checks and these times only). */

#define ACT_SCALE (1.0f / 16.0f)

static float fp8_val(uint8_t b) { return tm_fp8_to_f32(b); }

/* (rows, cols) random e4m3 bytes: values of scale * uniform(-1, 1) / scale -> the whole e4m3 range */
static uint8_t *make_fp8(int64_t rows, int64_t cols) {
    uint8_t *w = tb_xmalloc((size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) w[i] = tm_fp8_from_f32(tb_uniform() * 448.0f);
    return w;
}

/* xq (n, cols) = the e4m3 values of bf16(x) / act, as the kernels round them */
static float *quant_ref(const uint16_t *xh, size_t count, float act) {
    float *q = tb_xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) q[i] = fp8_val(tm_fp8_from_f32(tb_bf16_to_f32(xh[i]) / act));
    return q;
}

/* one output of the W8A8 product in double */
static double ref_dot(const uint8_t *w, const float *xq, int64_t cols, double scale) {
    double s = 0.0;
    for (int64_t j = 0; j < cols; j++) s += (double)fp8_val(w[j]) * (double)xq[j];
    return s * scale;
}

/* ---- quantization kernel ------------------------------------------------------------------------------------- */

static void check_quant(size_t n, int offset, float act) {
    tb_case("quant_fp8 n=%zu off=%d", n, offset);
    uint16_t *xh = tb_xmalloc((n + 8) * 2);
    for (size_t i = 0; i < n + 8; i++) /* a few values far beyond 448 * act so that saturation is exercised */
        xh[i] = tb_f32_to_bf16(tb_normal() * (i % 97 == 0 ? 200.0f * 448.0f * act : 2.0f));
    uint16_t *x_d = tb_upload(xh, (n + 8) * 2);
    uint8_t *o_d = tb_dev(n + 8), *o = tb_xmalloc(n + 8);
    tb_poison(o_d, n + 8);
    TB_RUN(tm_cuda_quant_fp8(x_d + offset, n, 1.0f / act, o_d + offset, 0));
    tb_download(o, o_d, n + 8);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += o[offset + i] != tm_fp8_from_f32(tb_bf16_to_f32(xh[offset + i]) / act);
    for (int i = 0; i < offset; i++) bad += o[i] != 0xFF; /* nothing written before the start */
    char name[96];
    snprintf(name, sizeof name, "n=%zu off=%d act=1/%g", n, offset, 1.0 / act);
    tb_result("quant_fp8", name, (double)bad, 0, 0, 0, 0, 'm');
    cudaFree(x_d);
    cudaFree(o_d);
    free(xh);
    free(o);
}

/* ---- GEMVs ---------------------------------------------------------------------------------------------------- */

static void set_version(int v) {
    if (v == 1) setenv("TM_CUDA_GEMV_V", "1", 1);
    else unsetenv("TM_CUDA_GEMV_V");
}

static void check_gemv(int64_t rows, int64_t cols, int n) {
    tb_case("gemv fp8 %lldx%lld n%d", (long long)rows, (long long)cols, n);
    const float sg = 0.04f / 448.0f, su = 0.013f / 448.0f; /* gate and up scales differ */
    uint8_t *wg = make_fp8(rows, cols), *wu = make_fp8(rows, cols);
    uint16_t *xh = tb_xmalloc((size_t)(n * cols) * 2);
    tb_fill_bf16(xh, NULL, (size_t)(n * cols), 3.0f);
    float *bias = tb_xmalloc((size_t)rows * sizeof(float));
    tb_fill_f32(bias, (size_t)rows, 0.5f);
    float *xq = quant_ref(xh, (size_t)(n * cols), ACT_SCALE);
    const size_t no = (size_t)(n * rows);
    float *ref_b = tb_xmalloc(no * 4), *ref = tb_xmalloc(no * 4), *ref_sw = tb_xmalloc(no * 4);
    for (int b = 0; b < n; b++)
        for (int64_t r = 0; r < rows; r++) {
            const double g = ref_dot(wg + r * cols, xq + b * cols, cols, (double)sg * ACT_SCALE);
            const double u = ref_dot(wu + r * cols, xq + b * cols, cols, (double)su * ACT_SCALE);
            ref[b * rows + r] = (float)g;
            ref_b[b * rows + r] = (float)(g + bias[r]);
            ref_sw[b * rows + r] = (float)(g / (1.0 + exp(-g)) * u);
        }
    void *wg_d = tb_upload(wg, (size_t)(rows * cols)), *wu_d = tb_upload(wu, (size_t)(rows * cols));
    uint16_t *x_d = tb_upload(xh, (size_t)(n * cols) * 2);
    float *bias_d = tb_upload(bias, (size_t)rows * 4);
    void *out_d = tb_dev(no * 4);
    float *of = tb_xmalloc(no * 4);
    uint16_t *oh = tb_xmalloc(no * 2);
    const tm_cuda_fp8_scales sc = {.w = sg, .w_up = su, .act = ACT_SCALE};
    char name[128];
    for (int v = 2; v >= 1; v--) {
        set_version(v);
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, bias_d, out_d, true, &sc, 0));
        tb_download(of, out_d, no * 4);
        snprintf(name, sizeof name, "v%d %lldx%lld n%d f32+b", v, (long long)rows, (long long)cols, n);
        tb_result("gemv_fp8", name, tb_rel_err(of, ref_b, no), 1e-4, 0, 0, 0, 'm');
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, NULL, out_d, false, &sc, 0));
        tb_download(oh, out_d, no * 2);
        snprintf(name, sizeof name, "v%d %lldx%lld n%d bf16", v, (long long)rows, (long long)cols, n);
        tb_result("gemv_fp8", name, tb_rel_err_bf16(oh, ref, no), 1e-2, 0, 0, 0, 'm');
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv_swiglu(wg_d, wu_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, out_d, &sc, 0));
        tb_download(oh, out_d, no * 2);
        snprintf(name, sizeof name, "v%d %lldx%lld n%d", v, (long long)rows, (long long)cols, n);
        tb_result("gemv_fp8_swiglu", name, tb_rel_err_bf16(oh, ref_sw, no), 1e-2, 0, 0, 0, 'm');
    }
    set_version(2);
    /* a group of three (q, k, v-like: the gate twice, with different scales, and the up weights): each output
     * bit-identical to the single product with that job's scale */
    const tm_cuda_gemv_job jobs[3] = {{wg_d, rows, NULL, NULL, sg, ACT_SCALE, NULL, 0, NULL},
                                      {wu_d, rows, bias_d, NULL, su, ACT_SCALE, NULL, 0, NULL},
                                      {wg_d, rows, NULL, NULL, 2.0f * sg, ACT_SCALE, NULL, 0, NULL}};
    tm_cuda_gemv_job gj[3];
    float *single = tb_xmalloc(no * 4);
    size_t diff = 0;
    void *outs[3];
    for (int j = 0; j < 3; j++) {
        outs[j] = tb_dev(no * 4);
        tb_poison(outs[j], no * 4);
        gj[j] = jobs[j];
        gj[j].out = outs[j];
    }
    TB_RUN(tm_cuda_gemv_group(gj, 3, TM_DT_FP8_E4M3, cols, x_d, n, true, 0));
    for (int j = 0; j < 3; j++) {
        const tm_cuda_fp8_scales s1 = {.w = jobs[j].scale, .act = ACT_SCALE};
        TB_RUN(tm_cuda_gemv(jobs[j].w, TM_DT_FP8_E4M3, rows, cols, x_d, n, jobs[j].bias, out_d, true, &s1, 0));
        tb_download(single, out_d, no * 4);
        tb_download(of, outs[j], no * 4);
        diff += memcmp(single, of, no * 4) != 0;
        cudaFree(outs[j]);
    }
    snprintf(name, sizeof name, "group %lldx%lld n%d (jobs differing)", (long long)rows, (long long)cols, n);
    tb_result("gemv_fp8_group", name, (double)diff, 0, 0, 0, 0, 'm');
    cudaFree(wg_d);
    cudaFree(wu_d);
    cudaFree(x_d);
    cudaFree(bias_d);
    cudaFree(out_d);
    free(wg);
    free(wu);
    free(xh);
    free(bias);
    free(xq);
    free(ref_b);
    free(ref);
    free(ref_sw);
    free(of);
    free(oh);
    free(single);
}

/* ---- GEMM ----------------------------------------------------------------------------------------------------- */

static void check_gemm(tm_cuda_blas *blas, int64_t n, int64_t m, int64_t k, bool out_f32, bool fast) {
    tb_case("gemm fp8 %lldx%lldx%lld%s", (long long)n, (long long)m, (long long)k, fast ? " fast" : "");
    tm_cuda_blas_set_fp8_fast_accum(blas, fast);
    const float scale = 0.04f / 448.0f;
    uint8_t *w = make_fp8(m, k);
    uint16_t *xh = tb_xmalloc((size_t)(n * k) * 2);
    tb_fill_bf16(xh, NULL, (size_t)(n * k), 2.0f);
    float *xq = quant_ref(xh, (size_t)(n * k), ACT_SCALE);
    void *w_d = tb_upload(w, (size_t)(m * k));
    uint16_t *x_d = tb_upload(xh, (size_t)(n * k) * 2);
    uint8_t *xq_d = tb_dev((size_t)(n * k));
    const size_t no = (size_t)(n * m), es = out_f32 ? 4 : 2;
    void *o_d = tb_dev(no * es);
    void *o = tb_xmalloc(no * es);
    tb_poison(o_d, no * es);
    TB_RUN(tm_cuda_quant_fp8(x_d, (size_t)(n * k), 1.0f / ACT_SCALE, xq_d, 0));
    tm_error err;
    if (tm_cuda_blas_gemm_fp8(blas, xq_d, w_d, scale * ACT_SCALE, o_d, out_f32, n, m, k, 0, &err) != TM_OK) {
        printf("# gemm_fp8: %s\n", err.msg);
        tb_failures++;
    }
    TB_CHECK(cudaDeviceSynchronize());
    tb_download(o, o_d, no * es);
    double num = 0, den = 0;
    for (int s = 0; s < 512; s++) {
        const int64_t i = (int64_t)(tb_rand_u64() % (uint64_t)n), j = (int64_t)(tb_rand_u64() % (uint64_t)m);
        const double ref = ref_dot(w + j * k, xq + i * k, k, (double)scale * ACT_SCALE);
        const double got = out_f32 ? (double)((float *)o)[i * m + j] : (double)tb_bf16_to_f32(((uint16_t *)o)[i * m + j]);
        if (!isfinite(got)) num = INFINITY;
        num += (got - ref) * (got - ref);
        den += ref * ref;
    }
    char name[96];
    snprintf(name, sizeof name, "%lldx%lldx%lld %s%s", (long long)n, (long long)m, (long long)k,
             out_f32 ? "f32" : "bf16", fast ? " fast" : "");
    tb_result("gemm_fp8", name, sqrt(num / den), out_f32 && !fast ? 1e-3 : 1e-2, 0, 0, 0, 'c');
    tm_cuda_blas_set_fp8_fast_accum(blas, false);
    cudaFree(w_d);
    cudaFree(x_d);
    cudaFree(xq_d);
    cudaFree(o_d);
    free(w);
    free(xh);
    free(xq);
    free(o);
}

static void check_args(tm_cuda_blas *blas) {
    tb_case("arguments");
    uint8_t *w = tb_dev(4096);
    uint16_t *x = tb_dev(4096), *o = tb_dev(4096);
    int bad = 0;
    const tm_cuda_fp8_scales ok = {.w = 1.0f, .w_up = 1.0f, .act = 0.25f}, third = {.w = 1.0f, .act = 1.0f / 3.0f};
    bad += tm_cuda_gemv(w, TM_DT_FP8_E4M3, 4, 32, x, 1, NULL, o, true, NULL, 0) != cudaErrorInvalidValue; /* no scales */
    bad += tm_cuda_gemv(w, TM_DT_FP8_E4M3, 4, 32, x, 1, NULL, o, true, &third, 0) != cudaErrorInvalidValue; /* not 2^k */
    bad += tm_cuda_gemv(w, TM_DT_FP8_E4M3, 4, 24, x, 1, NULL, o, true, &ok, 0) != cudaErrorInvalidValue; /* cols % 16 */
    bad += tm_cuda_gemv(w, TM_DT_FP8_E4M3, 4, 32, x, 1, NULL, o, true, &ok, 0) != cudaSuccess;
    bad += tm_cuda_gemv_swiglu(w, w, TM_DT_FP8_E4M3, 4, 32, x, 1, o, &third, 0) != cudaErrorInvalidValue;
    const tm_cuda_fp8_scales o8 = {.w = 1.0f, .w_up = 1.0f, .act = 0.25f, .out8 = w + 2048};
    bad += tm_cuda_gemv(w, TM_DT_FP8_E4M3, 4, 32, x, 1, NULL, o, true, &o8, 0) != cudaErrorInvalidValue; /* swiglu's */
    const tm_cuda_gemv_job xqb = {w, 4, NULL, o, 1.0f, 0.25f, NULL, 0.0f, w + 2048}; /* xq with bf16 weights */
    bad += tm_cuda_gemv_group(&xqb, 1, TM_DT_BF16, 32, x, 1, false, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_dequant_bf16(w, TM_DT_FP8_E4M3, 4, 32, o, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_quant_fp8(x, 16, 0.0f, w, 0) != cudaErrorInvalidValue;
    tm_error err;
    bad += tm_cuda_blas_gemm_fp8(blas, w, w, 1.0f, o, false, 16, 16, 24, 0, &err) != TM_ERR_UNSUPPORTED; /* k % 16 */
    TB_CHECK(cudaDeviceSynchronize());
    tb_result("fp8_args", "refusals", bad, 0, 0, 0, 0, 'm');
    cudaFree(w);
    cudaFree(x);
    cudaFree(o);
}

/* ---- timing --------------------------------------------------------------------------------------------------- */

typedef struct mm_arg {
    tm_cuda_blas *blas;
    bool fp8;
    const void *x, *w;
    uint8_t *xq;
    const uint16_t *xb;
    void *out;
    int64_t n, m, k;
} mm_arg;

static void run_mm(void *p) {
    mm_arg *a = p;
    tm_error err;
    tm_status s = a->fp8 ? tm_cuda_blas_gemm_fp8(a->blas, a->x, a->w, 1e-4f, a->out, false, a->n, a->m, a->k, 0, &err)
                         : tm_cuda_blas_gemm(a->blas, a->x, a->w, NULL, a->out, false, a->n, a->m, a->k, 0, &err);
    if (s != TM_OK) {
        fprintf(stderr, "gemm: %s\n", err.msg);
        exit(2);
    }
}
static void run_quant(void *p) {
    mm_arg *a = p;
    TB_CHECK(tm_cuda_quant_fp8(a->xb, (size_t)(a->n * a->k), 16.0f, a->xq, 0));
}

static void time_gemm(tm_cuda_blas *blas, int64_t n, int64_t m, int64_t k, const char *shape) {
    if (!tb_budget_ok()) return;
    tb_case("time gemm %s n=%lld", shape, (long long)n);
    const size_t nx = (size_t)(n * k), nw = (size_t)(m * k), no = (size_t)(n * m);
    uint8_t *w8 = make_fp8(m, k), *x8 = make_fp8(n, k);
    uint16_t *wb = tb_xmalloc(nw * 2), *xb = tb_xmalloc(nx * 2);
    tb_fill_bf16(wb, NULL, nw, 0.05f);
    tb_fill_bf16(xb, NULL, nx, 1.0f);
    void *w8_d = tb_upload(w8, nw), *x8_d = tb_upload(x8, nx), *wb_d = tb_upload(wb, nw * 2), *xb_d = tb_upload(xb, nx * 2);
    void *o_d = tb_dev(no * 2);
    mm_arg a8 = {blas, true, x8_d, w8_d, x8_d, xb_d, o_d, n, m, k}, ab = {blas, false, xb_d, wb_d, NULL, NULL, o_d, n, m, k};
    const double flops = 2.0 * (double)n * (double)m * (double)k;
    char name[96];
    const double us8 = tb_time_us(run_mm, &a8, 3, 15), usb = tb_time_us(run_mm, &ab, 3, 15);
    tm_cuda_blas_set_fp8_fast_accum(blas, true);
    const double usf = tb_time_us(run_mm, &a8, 3, 15);
    tm_cuda_blas_set_fp8_fast_accum(blas, false);
    const double usq = tb_time_us(run_quant, &a8, 3, 15);
    if (n == 512 && m == 28672) { /* the decode step's largest product under a sustained load (tb_soak_us) */
        tm_cuda_blas_set_fp8_fast_accum(blas, true);
        const double us = tb_soak_us(run_mm, &a8);
        tm_cuda_blas_set_fp8_fast_accum(blas, false);
        if (us > 0.0) printf("# soak gemm_fp8 %s n=512 fp8 fast: %.1f us a call, %.0f TFLOP/s\n", shape, us, flops / (us * 1e6));
    }
    snprintf(name, sizeof name, "%s n=%lld fp8", shape, (long long)n);
    tb_result("gemm_fp8", name, 0, 0, us8, (double)(nx + nw + 2 * no), flops, 'c');
    snprintf(name, sizeof name, "%s n=%lld fp8 fast", shape, (long long)n);
    tb_result("gemm_fp8", name, 0, 0, usf, (double)(nx + nw + 2 * no), flops, 'c');
    snprintf(name, sizeof name, "%s n=%lld bf16", shape, (long long)n);
    tb_result("gemm_fp8", name, 0, 0, usb, (double)(2 * nx + 2 * nw + 2 * no), flops, 'c');
    snprintf(name, sizeof name, "%s n=%lld quant x", shape, (long long)n);
    tb_result("quant_fp8", name, 0, 0, usq, (double)(3 * nx), 0, 'm');
    printf("# key gemm %-8s n=%-5lld fp8 %7.1f us (%4.0f TF)  fast %7.1f us (%4.0f TF)  bf16 %7.1f us (%4.0f TF)  "
           "quant %.1f us\n", shape, (long long)n, us8, flops / us8 / 1e6, usf, flops / usf / 1e6, usb,
           flops / usb / 1e6, usq);
    cudaFree(w8_d);
    cudaFree(x8_d);
    cudaFree(wb_d);
    cudaFree(xb_d);
    cudaFree(o_d);
    free(w8);
    free(x8);
    free(wb);
    free(xb);
}

typedef struct gv_arg {
    void **w;
    int nw, i;
    const uint16_t *x;
    void *out;
    int64_t rows, cols;
    tm_cuda_fp8_scales sc;
} gv_arg;
static void run_gv(void *p) {
    gv_arg *a = p;
    TB_CHECK(tm_cuda_gemv(a->w[a->i], TM_DT_FP8_E4M3, a->rows, a->cols, a->x, 1, NULL, a->out, false, &a->sc, 0));
    a->i = (a->i + 1) % a->nw;
}

/* nw >= 1 device copies of one (rows, cols) random e4m3 matrix, >= 160 MB in all, so that a timing loop that walks
 * them is not served by L2; free with free_copies */
static void **fp8_copies(int64_t rows, int64_t cols, int *nw_out) {
    const size_t wb = (size_t)(rows * cols);
    const int nw = (int)((160u << 20) / wb) + 1;
    uint8_t *w = make_fp8(rows, cols);
    void **wd = tb_xmalloc((size_t)nw * sizeof(void *));
    for (int i = 0; i < nw; i++) wd[i] = tb_upload(w, wb);
    free(w);
    *nw_out = nw;
    return wd;
}

static void free_copies(void **wd, int nw) {
    for (int i = 0; i < nw; i++) cudaFree(wd[i]);
    free(wd);
}

static void time_gemv(int64_t rows, int64_t cols, const char *shape) {
    if (!tb_budget_ok()) return;
    tb_case("time gemv %s", shape);
    const size_t wb = (size_t)(rows * cols);
    int nw;
    void **wd = fp8_copies(rows, cols, &nw);
    uint16_t *xh = tb_xmalloc((size_t)cols * 2);
    tb_fill_bf16(xh, NULL, (size_t)cols, 1.0f);
    gv_arg a = {wd, nw, 0, tb_upload(xh, (size_t)cols * 2), tb_dev((size_t)rows * 2), rows, cols,
                {.w = 1e-4f, .act = ACT_SCALE}};
    const double us = tb_time_us(run_gv, &a, 5, 40);
    char name[96];
    snprintf(name, sizeof name, "%s n=1", shape);
    tb_result("gemv_fp8", name, 0, 0, us, (double)wb + (double)cols * 2 + (double)rows * 2, 0, 'm');
    free_copies(wd, nw);
    cudaFree((void *)a.x);
    cudaFree(a.out);
    free(xh);
}

/* ---- the tensor-core GEMV (tm_cuda_gemv_fp8tc.cu) ------------------------------------------------------------- */

/* tm_cuda_gemv_fp8tc from tm_cuda_quant_fp8's xq against the double reference (f32 out with a bias, bf16 out) */
static void check_tc(int64_t rows, int64_t cols, int n) {
    tb_case("gemv fp8tc %lldx%lld n%d", (long long)rows, (long long)cols, n);
    const float sg = 0.04f / 448.0f;
    uint8_t *w = make_fp8(rows, cols);
    uint16_t *xh = tb_xmalloc((size_t)(n * cols) * 2);
    tb_fill_bf16(xh, NULL, (size_t)(n * cols), 3.0f);
    float *bias = tb_xmalloc((size_t)rows * sizeof(float));
    tb_fill_f32(bias, (size_t)rows, 0.5f);
    float *xq = quant_ref(xh, (size_t)(n * cols), ACT_SCALE);
    const size_t no = (size_t)(n * rows);
    float *ref_b = tb_xmalloc(no * 4), *ref = tb_xmalloc(no * 4);
    for (int b = 0; b < n; b++)
        for (int64_t r = 0; r < rows; r++) {
            const double v = ref_dot(w + r * cols, xq + b * cols, cols, (double)sg * ACT_SCALE);
            ref[b * rows + r] = (float)v;
            ref_b[b * rows + r] = (float)(v + bias[r]);
        }
    void *w_d = tb_upload(w, (size_t)(rows * cols));
    uint16_t *x_d = tb_upload(xh, (size_t)(n * cols) * 2);
    uint8_t *xq_d = tb_dev((size_t)(n * cols));
    TB_RUN(tm_cuda_quant_fp8(x_d, (size_t)(n * cols), 1.0f / ACT_SCALE, xq_d, 0));
    float *bias_d = tb_upload(bias, (size_t)rows * 4);
    void *out_d = tb_dev(no * 4);
    float *of = tb_xmalloc(no * 4);
    uint16_t *oh = tb_xmalloc(no * 2);
    char name[128];
    tb_poison(out_d, no * 4);
    TB_RUN(tm_cuda_gemv_fp8tc(w_d, rows, cols, xq_d, n, sg * ACT_SCALE, bias_d, out_d, true, 0));
    tb_download(of, out_d, no * 4);
    snprintf(name, sizeof name, "%lldx%lld n%d f32+b", (long long)rows, (long long)cols, n);
    tb_result("gemv_fp8tc", name, tb_rel_err(of, ref_b, no), 1e-3, 0, 0, 0, 'm');
    tb_poison(out_d, no * 4);
    TB_RUN(tm_cuda_gemv_fp8tc(w_d, rows, cols, xq_d, n, sg * ACT_SCALE, NULL, out_d, false, 0));
    tb_download(oh, out_d, no * 2);
    snprintf(name, sizeof name, "%lldx%lld n%d bf16", (long long)rows, (long long)cols, n);
    tb_result("gemv_fp8tc", name, tb_rel_err_bf16(oh, ref, no), 1e-2, 0, 0, 0, 'm');
    cudaFree(w_d);
    cudaFree(x_d);
    cudaFree(xq_d);
    cudaFree(bias_d);
    cudaFree(out_d);
    free(w);
    free(xh);
    free(bias);
    free(xq);
    free(ref_b);
    free(ref);
    free(of);
    free(oh);
}

/* tm_cuda_gemv_qkv_rope with fp8 weights: the tensor-core kernel against the CUDA-core one (TM_CUDA_GEMV_FP8TC=0,
 * checked against the double reference by the W8A8 math above): the same products in another order, so q and the
 * cache entries agree within bf16 rounding; H / KV heads of hd dims, n tokens at slots 3, 20, 37, ... */
static void check_tc_rope(int H, int KV, int hd, int64_t cols, bool kv_fp8) {
    tb_case("gemv_qkv_rope fp8tc %d/%dx%d cols %lld%s", H, KV, hd, (long long)cols, kv_fp8 ? " fp8 cache" : "");
    const int64_t rq = (int64_t)H * hd, rk = (int64_t)KV * hd;
    const int bs = 16, nblk = 10, n = 8;
    const size_t n_slots = (size_t)nblk * bs, cache_el = n_slots * (size_t)rk, esz = kv_fp8 ? 1 : 2;
    uint8_t *wq = make_fp8(rq, cols), *wk = make_fp8(rk, cols), *wv = make_fp8(rk, cols);
    void *wd[3] = {tb_upload(wq, (size_t)(rq * cols)), tb_upload(wk, (size_t)(rk * cols)),
                   tb_upload(wv, (size_t)(rk * cols))};
    uint16_t *xh = tb_xmalloc((size_t)(n * cols) * 2);
    tb_fill_bf16(xh, NULL, (size_t)(n * cols), 3.0f);
    uint16_t *x_d = tb_upload(xh, (size_t)(n * cols) * 2);
    float *inv = tb_xmalloc((size_t)hd / 2 * sizeof(float));
    for (int j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    int32_t pos[8];
    int64_t slot[8];
    for (int b = 0; b < n; b++) {
        pos[b] = 5 + 97 * b;
        slot[b] = 3 + 17 * b;
    }
    float *inv_d = tb_upload(inv, (size_t)hd / 2 * sizeof(float));
    int32_t *pos_d = tb_upload(pos, sizeof pos);
    int64_t *slot_d = tb_upload(slot, sizeof slot);
    uint16_t *q_d[2], *kc_d[2], *vc_d[2], *qh[2];
    uint8_t *kch[2], *vch[2];
    for (int m = 0; m < 2; m++) {
        q_d[m] = tb_dev((size_t)(n * rq) * 2);
        kc_d[m] = tb_dev(cache_el * esz);
        vc_d[m] = tb_dev(cache_el * esz);
        TB_CHECK(cudaMemset(kc_d[m], 0, cache_el * esz));
        TB_CHECK(cudaMemset(vc_d[m], 0, cache_el * esz));
        if (m == 0) setenv("TM_CUDA_GEMV_FP8TC", "0", 1);
        const float sq = 0.02f / 448.0f, sk = 0.03f / 448.0f, sv = 0.01f / 448.0f;
        const tm_cuda_gemv_job jobs[3] = {{wd[0], rq, NULL, q_d[m], sq, ACT_SCALE, NULL, 0, NULL},
                                          {wd[1], rk, NULL, NULL, sk, ACT_SCALE, NULL, 0, NULL},
                                          {wd[2], rk, NULL, NULL, sv, ACT_SCALE, NULL, 0, NULL}};
        const tm_cuda_rope_args r = {.n_tokens = n, .n_heads = H, .n_kv_heads = KV, .head_dim = hd, .rope_dim = hd,
                                     .block_size = bs, .inv_freq = inv_d, .positions = pos_d, .slot_mapping = slot_d,
                                     .q = q_d[m], .k_cache = kc_d[m], .v_cache = vc_d[m], .kv_fp8 = kv_fp8};
        TB_RUN(tm_cuda_gemv_qkv_rope(jobs, TM_DT_FP8_E4M3, cols, x_d, n, &r, 0));
        unsetenv("TM_CUDA_GEMV_FP8TC");
        qh[m] = tb_xmalloc((size_t)(n * rq) * 2);
        kch[m] = tb_xmalloc(cache_el * esz);
        vch[m] = tb_xmalloc(cache_el * esz);
        tb_download(qh[m], q_d[m], (size_t)(n * rq) * 2);
        tb_download(kch[m], kc_d[m], cache_el * esz);
        tb_download(vch[m], vc_d[m], cache_el * esz);
    }
    /* every value as f32: q, then the cache (bf16 or e4m3) */
    const size_t nq = (size_t)(n * rq);
    float *a = tb_xmalloc((nq + 2 * cache_el) * sizeof(float)), *bref = tb_xmalloc((nq + 2 * cache_el) * sizeof(float));
    for (size_t i = 0; i < nq; i++) {
        a[i] = tb_bf16_to_f32(qh[1][i]);
        bref[i] = tb_bf16_to_f32(qh[0][i]);
    }
    for (size_t i = 0; i < 2 * cache_el; i++) {
        const uint8_t *s1 = i < cache_el ? kch[1] : vch[1], *s0 = i < cache_el ? kch[0] : vch[0];
        const size_t k = i % cache_el;
        a[nq + i] = kv_fp8 ? fp8_val(s1[k]) : tb_bf16_to_f32(((const uint16_t *)s1)[k]);
        bref[nq + i] = kv_fp8 ? fp8_val(s0[k]) : tb_bf16_to_f32(((const uint16_t *)s0)[k]);
    }
    char name[128];
    snprintf(name, sizeof name, "%d/%dx%d cols %lld%s: q, k, v cache vs cuda cores", H, KV, hd, (long long)cols,
             kv_fp8 ? " fp8 cache" : "");
    tb_result("gemv_fp8tc_rope", name, tb_rel_err(a, bref, nq + 2 * cache_el), kv_fp8 ? 3e-2 : 1e-2, 0, 0, 0, 'm');
    for (int m = 0; m < 2; m++) {
        cudaFree(q_d[m]);
        cudaFree(kc_d[m]);
        cudaFree(vc_d[m]);
        free(qh[m]);
        free(kch[m]);
        free(vch[m]);
    }
    for (int j = 0; j < 3; j++) cudaFree(wd[j]);
    cudaFree(x_d);
    cudaFree(inv_d);
    cudaFree(pos_d);
    cudaFree(slot_d);
    free(wq);
    free(wk);
    free(wv);
    free(xh);
    free(inv);
    free(a);
    free(bref);
}

/* x rounded before (tm_cuda_fp8_scales.xq, tm_cuda_gemv_job.xq) through every launcher, as the engine passes it at
 * batch <= 8: the same bytes as the kernel's own rounding, so every output bit-identical to the launch from bf16 x
 * (tensor cores; the CUDA cores ignore xq); the SwiGLU's out8 bit-identical to tm_cuda_quant_fp8 of its bf16 output,
 * from either kernel; an unaligned xq ignored. Outputs poisoned before each launch. */
static void check_xq(int64_t rows, int64_t cols, int n, bool cuda_cores) {
    tb_case("gemv fp8 xq %lldx%lld n%d%s", (long long)rows, (long long)cols, n, cuda_cores ? " cuda cores" : "");
    if (cuda_cores) setenv("TM_CUDA_GEMV_FP8TC", "0", 1);
    const float sg = 0.04f / 448.0f, su = 0.013f / 448.0f;
    uint8_t *wg = make_fp8(rows, cols), *wu = make_fp8(rows, cols);
    uint16_t *xh = tb_xmalloc((size_t)(n * cols) * 2);
    tb_fill_bf16(xh, NULL, (size_t)(n * cols), 3.0f);
    void *wg_d = tb_upload(wg, (size_t)(rows * cols)), *wu_d = tb_upload(wu, (size_t)(rows * cols));
    uint16_t *x_d = tb_upload(xh, (size_t)(n * cols) * 2);
    uint8_t *xq_d = tb_dev((size_t)(n * cols)), *xu_d = tb_dev((size_t)(n * cols) + 16),
            *o8_d = tb_dev((size_t)(n * rows)), *q8_d = tb_dev((size_t)(n * rows));
    TB_RUN(tm_cuda_quant_fp8(x_d, (size_t)(n * cols), 1.0f / ACT_SCALE, xq_d, 0));
    TB_RUN(tm_cuda_quant_fp8(x_d, (size_t)(n * cols), 1.0f / ACT_SCALE, xu_d + 1, 0)); /* an unaligned copy */
    const uint8_t *xqs[2] = {xq_d, xu_d + 1};
    const size_t no = (size_t)(n * rows);
    void *a_d = tb_dev(no * 4), *b_d = tb_dev(no * 4);
    uint8_t *ah = tb_xmalloc(no * 4), *bh = tb_xmalloc(no * 4);
    size_t diff = 0;
    /* launch `what` from bf16 x into a_d, then with xq into b_d; bytes compared */
#define XQ_PAIR(bytes, LAUNCH_A, LAUNCH_B)                                                                              do {                                                                                                                    tb_poison(a_d, no * 4);                                                                                             tb_poison(b_d, no * 4);                                                                                             TB_RUN(LAUNCH_A);                                                                                                   TB_RUN(LAUNCH_B);                                                                                                   tb_download(ah, a_d, (bytes));                                                                                      tb_download(bh, b_d, (bytes));                                                                                      diff += memcmp(ah, bh, (bytes)) != 0;                                                                           } while (0)
    const tm_cuda_fp8_scales sx = {.w = sg, .w_up = su, .act = ACT_SCALE};
    for (int u = 0; u < 2; u++) { /* aligned xq, then the unaligned one (ignored) */
        tm_cuda_fp8_scales sq = sx;
        sq.xq = xqs[u];
        XQ_PAIR(no * 4, tm_cuda_gemv(wg_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, NULL, a_d, true, &sx, 0),
                tm_cuda_gemv(wg_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, NULL, b_d, true, &sq, 0));
        XQ_PAIR(no * 2, tm_cuda_gemv_swiglu(wg_d, wu_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, a_d, &sx, 0),
                tm_cuda_gemv_swiglu(wg_d, wu_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, b_d, &sq, 0));
        tm_cuda_gemv_job ja[2] = {{wg_d, rows, NULL, a_d, sg, ACT_SCALE, NULL, 0, NULL},
                                  {wu_d, rows, NULL, (uint16_t *)a_d + no, su, ACT_SCALE, NULL, 0, NULL}};
        tm_cuda_gemv_job jb[2] = {ja[0], ja[1]};
        jb[0].out = b_d;
        jb[1].out = (uint16_t *)b_d + no;
        jb[0].xq = jb[1].xq = xqs[u];
        XQ_PAIR(no * 4, tm_cuda_gemv_group(ja, 2, TM_DT_FP8_E4M3, cols, x_d, n, false, 0),
                tm_cuda_gemv_group(jb, 2, TM_DT_FP8_E4M3, cols, x_d, n, false, 0));
    }
    char name[128];
    snprintf(name, sizeof name, "%lldx%lld n%d%s: gemv, swiglu, group with xq vs without (launches differing)",
             (long long)rows, (long long)cols, n, cuda_cores ? " cuda cores" : "");
    tb_result("gemv_fp8_xq", name, (double)diff, 0, 0, 0, 0, 'm');
    /* the SwiGLU's e4m3 output, with and without xq in */
    size_t d8 = 0;
    for (int u = 0; u < 2; u++) {
        tm_cuda_fp8_scales so = sx;
        so.xq = u ? xq_d : NULL;
        so.out8 = o8_d;
        tb_poison(a_d, no * 4);
        tb_poison(o8_d, no);
        tb_poison(q8_d, no);
        TB_RUN(tm_cuda_gemv_swiglu(wg_d, wu_d, TM_DT_FP8_E4M3, rows, cols, x_d, n, a_d, &so, 0));
        TB_RUN(tm_cuda_quant_fp8(a_d, no, 1.0f / ACT_SCALE, q8_d, 0));
        tb_download(ah, o8_d, no);
        tb_download(bh, q8_d, no);
        d8 += memcmp(ah, bh, no) != 0;
    }
    snprintf(name, sizeof name, "%lldx%lld n%d%s: swiglu out8 vs quant_fp8(out) (launches differing)", (long long)rows,
             (long long)cols, n, cuda_cores ? " cuda cores" : "");
    tb_result("gemv_fp8_out8", name, (double)d8, 0, 0, 0, 0, 'm');
#undef XQ_PAIR
    unsetenv("TM_CUDA_GEMV_FP8TC");
    cudaFree(wg_d);
    cudaFree(wu_d);
    cudaFree(x_d);
    cudaFree(xq_d);
    cudaFree(xu_d);
    cudaFree(o8_d);
    cudaFree(q8_d);
    cudaFree(a_d);
    cudaFree(b_d);
    free(wg);
    free(wu);
    free(xh);
    free(ah);
    free(bh);
}

/* one replay of a graph on the legacy stream, which tb_time_us's events time */
static void run_graph(void *p) { TB_CHECK(cudaGraphLaunch(*(cudaGraphExec_t *)p, 0)); }

/* a chain of `len` products of one shape in one graph (PDL as the backend launches them), each over another copy of
 * the weights (>= 160 MB in all, so that L2 does not serve them): us a product, the median of 9 replays. kind 0:
 * tm_cuda_gemv on the CUDA cores (TM_CUDA_GEMV_FP8TC=0), 1: tm_cuda_gemv (the tensor cores, x rounded in the
 * kernel), 2: tm_cuda_gemv_fp8tc (the tensor cores, x rounded before) */
static double chain_us(int kind, void **wd, int nw, int64_t rows, int64_t cols, const uint16_t *x, const uint8_t *xq,
                       int n, void *out) {
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int len = nw < 16 ? 16 : nw;
    const tm_cuda_fp8_scales sc = {.w = 1e-4f, .act = ACT_SCALE};
    cudaGraph_t g;
    if (kind == 0) setenv("TM_CUDA_GEMV_FP8TC", "0", 1);
    TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < len; i++) {
        if (kind < 2)
            TB_CHECK(tm_cuda_gemv(wd[i % nw], TM_DT_FP8_E4M3, rows, cols, x, n, NULL, out, false, &sc, s));
        else
            TB_CHECK(tm_cuda_gemv_fp8tc(wd[i % nw], rows, cols, xq, n, 1e-4f, NULL, out, false, s));
    }
    TB_CHECK(cudaStreamEndCapture(s, &g));
    unsetenv("TM_CUDA_GEMV_FP8TC");
    cudaGraphExec_t ge;
    TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
    const double us = tb_time_us(run_graph, &ge, 2, 9);
    TB_CHECK(cudaGraphExecDestroy(ge));
    TB_CHECK(cudaGraphDestroy(g));
    TB_CHECK(cudaStreamDestroy(s));
    return us / len;
}

/* the fp8 GEMV three ways (chain_us's kinds), n = 1 and 8, in chains of one shape; TB_FP8_TC_WARPS="8 32" also
 * times the tensor-core kernel at those warp counts (TM_CUDA_FP8TC_WARPS); GB/s of the weights */
static void time_tc(int64_t rows, int64_t cols, const char *shape) {
    if (!tb_budget_ok()) return;
    tb_case("time gemv fp8tc %s", shape);
    const size_t wb = (size_t)(rows * cols);
    int nw;
    void **wd = fp8_copies(rows, cols, &nw);
    uint16_t *xh = tb_xmalloc((size_t)(8 * cols) * 2);
    tb_fill_bf16(xh, NULL, (size_t)(8 * cols), 1.0f);
    uint16_t *x_d = tb_upload(xh, (size_t)(8 * cols) * 2);
    uint8_t *xq_d = tb_dev((size_t)(8 * cols));
    TB_CHECK(tm_cuda_quant_fp8(x_d, (size_t)(8 * cols), 1.0f / ACT_SCALE, xq_d, 0));
    void *out = tb_dev((size_t)(8 * rows) * 2);
    static const char *const kinds[3] = {"cuda cores", "tensor cores", "tensor cores, x rounded before"};
    char name[96];
    const char *ws = getenv("TB_FP8_TC_WARPS");
    for (int n = 1; n <= 8; n += 7) {
        for (int k = 0; k < 3; k++) {
            const double us = chain_us(k, wd, nw, rows, cols, x_d, xq_d, n, out);
            snprintf(name, sizeof name, "%s n=%d %s", shape, n, kinds[k]);
            tb_result("gemv_fp8tc", name, 0, 0, us, (double)wb, 0, 'm');
        }
        for (const char *p = ws; p && *p;) {
            char *end;
            const long wv = strtol(p, &end, 10);
            if (end == p) break;
            p = end;
            char v[8];
            snprintf(v, sizeof v, "%ld", wv);
            setenv("TM_CUDA_FP8TC_WARPS", v, 1);
            const double uw = chain_us(1, wd, nw, rows, cols, x_d, xq_d, n, out);
            unsetenv("TM_CUDA_FP8TC_WARPS");
            snprintf(name, sizeof name, "%s n=%d tensor cores, %ld warps", shape, n, wv);
            tb_result("gemv_fp8tc", name, 0, 0, uw, (double)wb, 0, 'm');
        }
    }
    free_copies(wd, nw);
    cudaFree(x_d);
    cudaFree(xq_d);
    cudaFree(out);
    free(xh);
}

/* one fp8 product (fast accumulation) with the heuristic's candidate of rank i: its time and its largest
 * difference from candidate 0's output (both bf16; the candidates differ only in summation order) */
static void sweep_algo(tm_cuda_blas *blas, int i, int64_t n, int64_t m, int64_t k) {
    if (!tb_budget_ok()) return;
    tb_case("algo %d n=%lld m=%lld k=%lld", i, (long long)n, (long long)m, (long long)k);
    const size_t nx = (size_t)(n * k), nw = (size_t)(m * k), no = (size_t)(n * m);
    uint8_t *w8 = make_fp8(m, k), *x8 = make_fp8(n, k);
    void *w8_d = tb_upload(w8, nw), *x8_d = tb_upload(x8, nx), *o_d = tb_dev(no * 2), *r_d = tb_dev(no * 2);
    tm_error err;
    tm_cuda_blas_set_fp8_fast_accum(blas, true);
    tm_cuda_blas_set_algo_index(blas, 0);
    tm_status s0 = tm_cuda_blas_gemm_fp8(blas, x8_d, w8_d, 1e-4f, r_d, false, n, m, k, 0, &err);
    tm_cuda_blas_set_algo_index(blas, i);
    tm_status s1 = s0 == TM_OK ? tm_cuda_blas_gemm_fp8(blas, x8_d, w8_d, 1e-4f, o_d, false, n, m, k, 0, &err) : s0;
    if (s1 == TM_OK) {
        TB_CHECK(cudaDeviceSynchronize());
        uint16_t *ro = tb_xmalloc(no * 2), *oo = tb_xmalloc(no * 2);
        tb_download(ro, r_d, no * 2);
        tb_download(oo, o_d, no * 2);
        double dmax = 0, rmax = 0;
        for (size_t e = 0; e < no; e++) {
            const double r = tb_bf16_to_f32(ro[e]), d = fabs((double)tb_bf16_to_f32(oo[e]) - r);
            dmax = d > dmax || d != d ? d : dmax;
            rmax = fabs(r) > rmax ? fabs(r) : rmax;
        }
        mm_arg a8 = {blas, true, x8_d, w8_d, x8_d, NULL, o_d, n, m, k};
        const double us = tb_time_us(run_mm, &a8, 3, 15), flops = 2.0 * (double)n * (double)m * (double)k;
        char name[96];
        snprintf(name, sizeof name, "algo%d n=%lld m=%lld k=%lld", i, (long long)n, (long long)m, (long long)k);
        tb_result("gemm_fp8_algo", name, dmax / (rmax > 0 ? rmax : 1), 1e-2, us, (double)(nx + nw + 2 * no), flops, 'c');
        printf("# key algo %2d n=%-5lld m=%-5lld k=%-5lld %8.1f us %5.0f TF\n", i, (long long)n, (long long)m,
               (long long)k, us, flops / us / 1e6);
        free(ro);
        free(oo);
    } else {
        printf("# key algo %2d n=%-5lld m=%-5lld k=%-5lld none (%s)\n", i, (long long)n, (long long)m, (long long)k,
               err.msg);
    }
    tm_cuda_blas_set_algo_index(blas, 0);
    tm_cuda_blas_set_fp8_fast_accum(blas, false);
    cudaFree(w8_d);
    cudaFree(x8_d);
    cudaFree(o_d);
    cudaFree(r_d);
    free(w8);
    free(x8);
}

int main(int argc, char **argv) {
    (void)argv;
    tb_guard_init(25.0);
    tb_seed();
    tm_cuda_blas *blas = NULL;
    tm_error err;
    if (tm_cuda_blas_create((size_t)64 << 20, &blas, &err) != TM_OK) {
        printf("# cuBLASLt: %s\n", err.msg);
        return 1;
    }
    check_args(blas);
    /* the tensor-core kernel from pre-rounded x at each warp count, then the launcher's; its RoPE epilogue against
     * the CUDA cores' (tm_cuda_gemv's own fp8 path is checked by check_gemv below, on the tensor cores where the
     * shapes fit) */
    const int64_t ts[][2] = {{16, 256}, {48, 1280}, {1024, 4096}, {64, 14336}, {2048, 2048}, {576, 576}};
    static const char *const wv[] = {"8", "32", NULL};
    for (int k = 0; k < 3; k++) {
        if (wv[k]) setenv("TM_CUDA_FP8TC_WARPS", wv[k], 1);
        else unsetenv("TM_CUDA_FP8TC_WARPS");
        for (size_t s = 0; s < sizeof ts / sizeof ts[0]; s++)
            for (int n = 1; n <= 8; n += (k < 2 ? 3 : 1)) check_tc(ts[s][0], ts[s][1], n);
    }
    check_tc_rope(9, 3, 64, 576, false);
    check_tc_rope(32, 8, 64, 2048, true);
    check_tc_rope(32, 8, 128, 4096, false);
    for (int cc = 0; cc < 2; cc++) {
        check_xq(64, 2048, 1, cc);
        check_xq(1024, 4096, 8, cc);
        check_xq(4096, 14336, 3, cc); /* 32 warps */
        check_xq(48, 1280, 5, cc);
    }
    const int64_t tsh[][2] = {{6144, 4096}, {28672, 4096}, {4096, 4096}, {4096, 14336},
                              {3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}};
    static const char *const tnm[] = {"8b-qkv", "8b-gateup", "8b-o", "8b-down", "1b-qkv", "1b-o", "1b-gateup",
                                      "1b-down"};
    const bool tc_only = getenv("TB_FP8_TC_ONLY") != NULL; /* the tensor-core GEMV's checks and times only */
    if (tc_only) {
        for (size_t s = 0; s < 8; s++) time_tc(tsh[s][0], tsh[s][1], tnm[s]);
        tm_cuda_blas_free(blas);
        tb_case("finish");
        return tb_finish("tb_fp8");
    }
    const size_t qn[] = {1, 7, 8, 4099, (size_t)1 << 20};
    for (size_t i = 0; i < sizeof qn / sizeof qn[0]; i++) {
        check_quant(qn[i], 0, ACT_SCALE);
        check_quant(qn[i], 1, 0.25f);
    }
    const int64_t shapes[][2] = {{7, 16}, {37, 1184}, {130, 2048}, {1024, 4096}, {64, 14336}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int n = 1; n <= TM_CUDA_GEMV_MAX_N; n += (s < 2 ? 1 : 3)) check_gemv(shapes[s][0], shapes[s][1], n);
    const int64_t gm[][3] = {{16, 1024, 4096}, {100, 6144, 4096}, {256, 14336, 4096}, {512, 4096, 14336},
                             {2048, 4096, 4096}, {9, 4096, 2048}};
    for (int fast = 0; fast <= 1; fast++)
        for (size_t s = 0; s < sizeof gm / sizeof gm[0]; s++)
            check_gemm(blas, gm[s][0], gm[s][1], gm[s][2], s == 1 || s == 5, fast);
    printf("# checks done in %.1f s\n", tb_elapsed_s());
    fflush(stdout);
    if (argc < 2) { /* any argument: checks only */
        const int64_t ns[] = {256, 512, 8192, 2048};
        for (size_t i = 0; i < 4; i++) {
            time_gemm(blas, ns[i], 6144, 4096, "8b-qkv");
            time_gemm(blas, ns[i], 1024, 4096, "8b-k");
            time_gemm(blas, ns[i], 28672, 4096, "8b-gateup");
            time_gemm(blas, ns[i], 4096, 4096, "8b-o");
            time_gemm(blas, ns[i], 14336, 4096, "8b-gate");
            time_gemm(blas, ns[i], 4096, 14336, "8b-down");
        }
        /* TB_FP8_ALGOS=N: the fp8 (fast accumulation) products of the throughput run's shapes with each of the
         * heuristic's first N candidates, checked against the first */
        const int n_alg = getenv("TB_FP8_ALGOS") ? atoi(getenv("TB_FP8_ALGOS")) : 0;
        for (int i = 0; i < n_alg && i < TM_CUDA_BLAS_MAX_ALGOS; i++) {
            const int64_t sn[] = {512, 8192};
            const int64_t sm[][2] = {{6144, 4096}, {28672, 4096}, {4096, 4096}, {4096, 14336}};
            for (size_t a = 0; a < 2; a++)
                for (size_t q = 0; q < 4; q++) sweep_algo(blas, i, sn[a], sm[q][0], sm[q][1]);
        }
        time_gemv(6144, 4096, "8b-qkv");
        time_gemv(14336, 4096, "8b-gate");
        time_gemv(4096, 14336, "8b-down");
        for (size_t s = 0; s < 8; s++) time_tc(tsh[s][0], tsh[s][1], tnm[s]);
    }
    tm_cuda_blas_free(blas);
    tb_case("finish");
    tb_guard_report("tb_fp8");
    return tb_finish("tb_fp8");
}
