/* tb_gemv.c -- tm_cuda_gemv / tm_cuda_gemv_swiglu (every weight type, n = 1..8) against a double CPU reference. */
#include "backend/cpu/tm_quant.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"

/* Checks, for each weight type (f32, f16, bf16, q8_0, q4_0, q4_1, q4_K, q6_K) and both kernels (v2, the default,
 * and v1 through TM_CUDA_GEMV_V=1): f32 output with a bias, bf16 output without, and the SwiGLU epilogue, over
 * cols = one block, a few blocks (so that lanes have 0, 1 or 2 units), 1184/1280 (odd unit counts), 4096 and
 * 14336 (long f32 accumulation), rows = 1, 7, 37, 130 (not multiples of the 2 rows per block), n = 1..8, and float
 * cols that are not a multiple of 8 (the launcher's fallback to v1). Weights are random floats quantized by the
 * CPU quantizer (tm_quant_row) or, for quantized types, random block bytes with sane fp16 scales (every bit
 * pattern of nibbles, 6-bit scales and high bits). The reference is sum_j dequant(w)[r, j] * x[b, j] in double,
 * dequant = tm_dequant_row on the same bytes; the error is the relative L2 error over the whole output, tolerance
 * 1e-4 for f32 output and 1e-2 for bf16. Then: a chain of two GEMVs (the second reads the first's output) run
 * directly and as a captured CUDA graph, with and without programmatic dependent launch (TM_CUDA_PDL=1).
 * Timing (default kernel, out bf16 except lm_head f32): bf16 on the Llama-3.2-1B and Llama-3-8B shapes, the
 * quantized and f16 types on the 8B shapes, SwiGLU pairs, n = 2/4/8 and v1 on a few. Bytes = weights + x +
 * output (+ bias); weights rotate over copies totalling >= 160 MB so that no case runs from L2. */

static const int32_t k_types[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0,
                                  TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))

static bool is_quant(int32_t t) { return t != TM_DT_F32 && t != TM_DT_F16 && t != TM_DT_BF16; }
static int qk_of(int32_t t) { return (int)tm_dtype_get((uint32_t)t)->block; }
static size_t row_bytes_of(int32_t t, int64_t cols) { return (size_t)tm_dtype_row_bytes((uint32_t)t, (uint64_t)cols); }

static void put_f16(uint8_t *p, float v) {
    uint16_t h = tm_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* rows x cols weights of type t in GGUF layout; random_bytes: raw random blocks with valid fp16 scales */
static uint8_t *make_weights(int32_t t, int64_t rows, int64_t cols, bool random_bytes) {
    const size_t rb = row_bytes_of(t, cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *tmp = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * rb;
        if (random_bytes && is_quant(t)) {
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)tb_rand_u64();
            const tm_dtype_info *ti = tm_dtype_get((uint32_t)t);
            for (size_t b = 0; b < rb / ti->bytes; b++) {
                uint8_t *blk = row + b * ti->bytes;
                const float d = 0.002f + 0.01f * (tb_uniform() + 1.0f);
                switch (t) {
                case TM_DT_Q8_0: put_f16(blk, d * 0.1f); break;
                case TM_DT_Q4_0: put_f16(blk, d); break;
                case TM_DT_Q4_1: put_f16(blk, d); put_f16(blk + 2, 0.05f * tb_uniform()); break;
                case TM_DT_Q4_K: put_f16(blk, d * 0.1f); put_f16(blk + 2, d * 0.05f); break;
                case TM_DT_Q6_K: put_f16(blk + 208, d * 0.01f); break;
                default: break;
                }
            }
        } else {
            const float scale = 0.02f * (1.0f + (float)(r % 5));
            for (int64_t j = 0; j < cols; j++) tmp[j] = scale * tb_normal();
            if (cols > 3) tmp[tb_rand_u64() % (uint64_t)cols] = 8.0f * scale; /* an outlier per row */
            tm_quant_row((tm_dtype)t, tmp, row, cols);
        }
    }
    free(tmp);
    return w;
}

/* (rows, cols) f32 values of the weights, through the CPU reference dequantization */
static float *dequant_all(int32_t t, const uint8_t *w, int64_t rows, int64_t cols) {
    const size_t rb = row_bytes_of(t, cols);
    float *f = malloc((size_t)rows * (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) tm_dequant_row((tm_dtype)t, w + (size_t)r * rb, f + (size_t)r * cols, cols);
    return f;
}

/* ref (n, rows) = x (n, cols) . wf^T in double */
static void ref_gemv(const float *wf, const float *xf, const float *bias, int64_t rows, int64_t cols, int n,
                     double *ref) {
    for (int b = 0; b < n; b++)
        for (int64_t r = 0; r < rows; r++) {
            double s = bias ? (double)bias[r] : 0.0;
            const float *wr = wf + (size_t)r * cols, *xr = xf + (size_t)b * cols;
            for (int64_t j = 0; j < cols; j++) s += (double)wr[j] * (double)xr[j];
            ref[(size_t)b * rows + r] = s;
        }
}

static const char *type_name(int32_t t) { return tm_dtype_name((uint32_t)t); }

static void set_version(int v) {
    if (v == 1)
        setenv("TM_CUDA_GEMV_V", "1", 1);
    else
        unsetenv("TM_CUDA_GEMV_V");
}

/* ---- correctness ---------------------------------------------------------------------------------------------- */

static void check_case(int32_t t, int64_t rows, int64_t cols, int n, bool random_bytes) {
    const size_t rb = row_bytes_of(t, cols), wbytes = rb * (size_t)rows;
    uint8_t *wg = make_weights(t, rows, cols, random_bytes), *wu = make_weights(t, rows, cols, random_bytes);
    float *fg = dequant_all(t, wg, rows, cols), *fu = dequant_all(t, wu, rows, cols);
    uint16_t *xh = malloc((size_t)n * cols * 2);
    float *xf = malloc((size_t)n * cols * sizeof(float)), *bias = malloc((size_t)rows * sizeof(float));
    tb_fill_bf16(xh, xf, (size_t)n * cols, 1.0f);
    tb_fill_f32(bias, (size_t)rows, 0.5f);
    const size_t no = (size_t)n * rows;
    double *rg = malloc(no * sizeof(double)), *ru = malloc(no * sizeof(double)), *rgb = malloc(no * sizeof(double));
    ref_gemv(fg, xf, bias, rows, cols, n, rgb);
    ref_gemv(fg, xf, NULL, rows, cols, n, rg);
    ref_gemv(fu, xf, NULL, rows, cols, n, ru);
    float *ref_bias = malloc(no * sizeof(float)), *ref_nob = malloc(no * sizeof(float)), *ref_sw = malloc(no * sizeof(float));
    for (size_t i = 0; i < no; i++) {
        ref_bias[i] = (float)rgb[i];
        ref_nob[i] = (float)rg[i];
        ref_sw[i] = (float)(rg[i] / (1.0 + exp(-rg[i])) * ru[i]);
    }
    void *wg_d = tb_upload(wg, wbytes), *wu_d = tb_upload(wu, wbytes);
    uint16_t *x_d = tb_upload(xh, (size_t)n * cols * 2);
    float *bias_d = tb_upload(bias, (size_t)rows * sizeof(float));
    void *out_d = tb_dev(no * 4);
    float *out_f = malloc(no * 4);
    uint16_t *out_h = malloc(no * 2);
    char name[96];
    for (int v = 2; v >= 1; v--) {
        set_version(v);
        const char *kv = v == 1 ? "v1" : "v2";
        /* f32 out + bias */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, bias_d, out_d, true, 0));
        tb_download(out_f, out_d, no * 4);
        snprintf(name, sizeof name, "%s %s%s %lldx%lld n%d f32+b", kv, type_name(t), random_bytes ? "r" : "",
                 (long long)rows, (long long)cols, n);
        tb_result("gemv", name, tb_rel_err(out_f, ref_bias, no), 1e-4, 0, 0, 0, 'm');
        /* bf16 out, no bias */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, NULL, out_d, false, 0));
        tb_download(out_h, out_d, no * 2);
        snprintf(name, sizeof name, "%s %s%s %lldx%lld n%d bf16", kv, type_name(t), random_bytes ? "r" : "",
                 (long long)rows, (long long)cols, n);
        tb_result("gemv", name, tb_rel_err_bf16(out_h, ref_nob, no), 1e-2, 0, 0, 0, 'm');
        /* SwiGLU */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv_swiglu(wg_d, wu_d, t, rows, cols, x_d, n, out_d, 0));
        tb_download(out_h, out_d, no * 2);
        snprintf(name, sizeof name, "%s %s%s %lldx%lld n%d", kv, type_name(t), random_bytes ? "r" : "",
                 (long long)rows, (long long)cols, n);
        tb_result("gemv_swiglu", name, tb_rel_err_bf16(out_h, ref_sw, no), 1e-2, 0, 0, 0, 'm');
    }
    set_version(2);
    cudaFree(wg_d);
    cudaFree(wu_d);
    cudaFree(x_d);
    cudaFree(bias_d);
    cudaFree(out_d);
    free(wg);
    free(wu);
    free(fg);
    free(fu);
    free(xh);
    free(xf);
    free(bias);
    free(rg);
    free(ru);
    free(rgb);
    free(ref_bias);
    free(ref_nob);
    free(ref_sw);
    free(out_f);
    free(out_h);
}

static void check_all(void) {
    int nn = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int32_t t = k_types[ti];
        const int qk = qk_of(t) > 1 ? qk_of(t) : 8;
        const int64_t one = qk_of(t) > 1 ? qk_of(t) : 8;
        const int64_t odd = qk == 256 ? 1280 : 1184; /* 5 K-blocks / 37 blocks or 148 units of 8 */
        struct {
            int64_t rows, cols;
        } sh[] = {{1, one}, {7, one}, {37, 3 * one}, {130, 8 * one}, {37, odd}, {7, 4096}, {130, 2048}, {5, 14336}};
        for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
            const int n = 1 + (nn++ % TM_CUDA_GEMV_MAX_N);
            check_case(t, sh[s].rows, sh[s].cols, n, false);
        }
        /* all n on one shape */
        for (int n = 1; n <= TM_CUDA_GEMV_MAX_N; n++) check_case(t, 9, 4 * one, n, false);
        if (is_quant(t)) {
            check_case(t, 37, odd, 3, true);
            check_case(t, 7, 4096, 1, true);
            check_case(t, 4, 2048, 8, true);
        } else {
            check_case(t, 7, 36, 2, false);  /* cols % 8 != 0: v1 fallback */
            check_case(t, 33, 1000, 5, false);
        }
    }
}

/* ---- a chain of two GEMVs, direct and in a CUDA graph, with and without PDL ------------------------------------ */

static void check_chain(bool pdl) {
    const int32_t t = TM_DT_BF16;
    const int64_t d = 2048, f = 4096;
    const int n = 2;
    uint8_t *w1 = make_weights(t, f, d, false), *w2 = make_weights(t, d, f, false);
    float *f1 = dequant_all(t, w1, f, d), *f2 = dequant_all(t, w2, d, f);
    uint16_t *xh = malloc((size_t)n * d * 2);
    float *xf = malloc((size_t)n * d * sizeof(float));
    tb_fill_bf16(xh, xf, (size_t)n * d, 1.0f);
    void *w1_d = tb_upload(w1, row_bytes_of(t, d) * f), *w2_d = tb_upload(w2, row_bytes_of(t, f) * d);
    uint16_t *x_d = tb_upload(xh, (size_t)n * d * 2), *h_d = tb_dev((size_t)n * f * 2);
    float *o_d = tb_dev((size_t)n * d * 4);
    uint16_t *hh = malloc((size_t)n * f * 2);
    float *hf = malloc((size_t)n * f * sizeof(float)), *of = malloc((size_t)n * d * 4), *ref = malloc((size_t)n * d * 4);
    double *rd = malloc((size_t)n * d * sizeof(double));
    if (pdl)
        setenv("TM_CUDA_PDL", "1", 1);
    else
        unsetenv("TM_CUDA_PDL");
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int graph = 0; graph < 2; graph++) {
        tb_poison(h_d, (size_t)n * f * 2);
        tb_poison(o_d, (size_t)n * d * 4);
        TB_CHECK(cudaDeviceSynchronize()); /* the poison runs on the legacy stream, s does not wait for it */
        if (graph) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            TB_CHECK(tm_cuda_gemv(w1_d, t, f, d, x_d, n, NULL, h_d, false, s));
            TB_CHECK(tm_cuda_gemv(w2_d, t, d, f, h_d, n, NULL, o_d, true, s));
            TB_CHECK(cudaStreamEndCapture(s, &g));
            TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
            for (int rep = 0; rep < 3; rep++) TB_CHECK(cudaGraphLaunch(ge, s));
            TB_CHECK(cudaStreamSynchronize(s));
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        } else {
            TB_CHECK(tm_cuda_gemv(w1_d, t, f, d, x_d, n, NULL, h_d, false, s));
            TB_CHECK(tm_cuda_gemv(w2_d, t, d, f, h_d, n, NULL, o_d, true, s));
            TB_CHECK(cudaStreamSynchronize(s));
        }
        /* reference for the second product from the first's actual bf16 output */
        tb_download(hh, h_d, (size_t)n * f * 2);
        for (size_t i = 0; i < (size_t)n * f; i++) hf[i] = tb_bf16_to_f32(hh[i]);
        ref_gemv(f2, hf, NULL, d, f, n, rd);
        for (size_t i = 0; i < (size_t)n * d; i++) ref[i] = (float)rd[i];
        tb_download(of, o_d, (size_t)n * d * 4);
        double e = tb_rel_err(of, ref, (size_t)n * d);
        /* and the first against its own reference */
        ref_gemv(f1, xf, NULL, f, d, n, rd);
        float *r1 = malloc((size_t)n * f * sizeof(float));
        for (size_t i = 0; i < (size_t)n * f; i++) r1[i] = (float)rd[i];
        double e1 = tb_rel_err_bf16(hh, r1, (size_t)n * f);
        free(r1);
        char name[64];
        snprintf(name, sizeof name, "chain %s%s 1st", graph ? "graph" : "direct", pdl ? " pdl" : "");
        tb_result("gemv", name, e1, 1e-2, 0, 0, 0, 'm');
        snprintf(name, sizeof name, "chain %s%s 2nd", graph ? "graph" : "direct", pdl ? " pdl" : "");
        tb_result("gemv", name, e, 1e-4, 0, 0, 0, 'm');
    }
    unsetenv("TM_CUDA_PDL");
    TB_CHECK(cudaStreamDestroy(s));
    cudaFree(w1_d);
    cudaFree(w2_d);
    cudaFree(x_d);
    cudaFree(h_d);
    cudaFree(o_d);
    free(w1);
    free(w2);
    free(f1);
    free(f2);
    free(xh);
    free(xf);
    free(hh);
    free(hf);
    free(of);
    free(ref);
    free(rd);
}

/* ---- argument checks ------------------------------------------------------------------------------------------- */

static void check_args(void) {
    uint16_t *x = tb_dev(64 * 2);
    void *w = tb_dev(4096), *o = tb_dev(4096);
    int bad = 0;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 4, 8, x, 0, NULL, o, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 4, 8, x, TM_CUDA_GEMV_MAX_N + 1, NULL, o, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_Q4_0, 4, 48, x, 1, NULL, o, true, 0) != cudaErrorInvalidValue; /* cols % 32 */
    bad += tm_cuda_gemv(w, TM_DT_Q5_0, 4, 32, x, 1, NULL, o, true, 0) != cudaErrorInvalidValue; /* unsupported */
    bad += tm_cuda_gemv_swiglu(w, NULL, TM_DT_BF16, 4, 8, x, 1, o, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 0, 8, x, 1, NULL, o, true, 0) != cudaSuccess; /* nothing to do */
    bad += tm_cuda_weight_type_supported(TM_DT_Q5_K) || !tm_cuda_weight_type_supported(TM_DT_Q6_K);
    TB_CHECK(cudaDeviceSynchronize());
    tb_result("gemv", "argument checks", bad, 0, 0, 0, 0, 'm');
    cudaFree(x);
    cudaFree(w);
    cudaFree(o);
}

/* ---- timing ---------------------------------------------------------------------------------------------------- */

typedef struct targ {
    int32_t t;
    int64_t rows, cols;
    int n;
    bool out_f32, swiglu;
    uint8_t *w;      /* (copies, [2,] rows, row_bytes) */
    size_t wbytes;   /* one weight */
    int copies, next;
    uint16_t *x;
    void *out;
} targ;

static void run_timed(void *p) {
    targ *a = p;
    const uint8_t *w = a->w + (size_t)a->next * a->wbytes * (a->swiglu ? 2 : 1);
    a->next = (a->next + 1) % a->copies;
    if (a->swiglu)
        TB_CHECK(tm_cuda_gemv_swiglu(w, w + a->wbytes, a->t, a->rows, a->cols, a->x, a->n, a->out, 0));
    else
        TB_CHECK(tm_cuda_gemv(w, a->t, a->rows, a->cols, a->x, a->n, NULL, a->out, a->out_f32, 0));
}

static void time_case(int32_t t, int64_t rows, int64_t cols, int n, bool out_f32, bool swiglu, int version,
                      const char *label) {
    targ a = {t, rows, cols, n, out_f32, swiglu, NULL, row_bytes_of(t, cols), 1, 0, NULL, NULL};
    const size_t per = a.wbytes * (swiglu ? 2 : 1);
    const size_t want = (size_t)160 << 20;
    a.copies = per >= want ? 1 : (int)((want + per - 1) / per);
    a.w = tb_dev(per * (size_t)a.copies);
    /* timing only: every byte 0x11 is a small finite number in every type (fp16 0x1111, bf16 0x1111, f32
     * 0x11111111, nibbles 1) */
    TB_CHECK(cudaMemset(a.w, 0x11, per * (size_t)a.copies));
    uint16_t *xh = malloc((size_t)n * cols * 2);
    tb_fill_bf16(xh, NULL, (size_t)n * cols, 1.0f);
    a.x = tb_upload(xh, (size_t)n * cols * 2);
    a.out = tb_dev((size_t)n * rows * 4);
    set_version(version);
    const double us = tb_time_us(run_timed, &a, 5, 40);
    set_version(2);
    const double bytes = (double)per + (double)n * (double)cols * 2.0 + (double)n * (double)rows * (out_f32 ? 4.0 : 2.0);
    const double flops = 2.0 * (double)n * (double)rows * (double)cols * (swiglu ? 2.0 : 1.0);
    char name[96];
    snprintf(name, sizeof name, "%s%s %s %lldx%lld n%d%s", version == 1 ? "v1 " : "", type_name(t), label,
             (long long)rows, (long long)cols, n, out_f32 ? " f32" : "");
    tb_result(swiglu ? "gemv_swiglu" : "gemv", name, 0.0, 0.0, us, bytes, flops, 'm');
    cudaFree(a.w);
    cudaFree(a.x);
    cudaFree(a.out);
    free(xh);
}

static void time_all(void) {
    /* bf16: Llama-3.2-1B then Llama-3-8B */
    time_case(TM_DT_BF16, 6144, 2048, 1, false, false, 2, "1b-qkv");
    time_case(TM_DT_BF16, 2048, 2048, 1, false, false, 2, "1b-o");
    time_case(TM_DT_BF16, 8192, 2048, 1, false, false, 2, "1b-gate");
    time_case(TM_DT_BF16, 8192, 2048, 1, false, true, 2, "1b-gate+up");
    time_case(TM_DT_BF16, 2048, 8192, 1, false, false, 2, "1b-down");
    time_case(TM_DT_BF16, 128256, 2048, 1, true, false, 2, "1b-lm_head");
    time_case(TM_DT_BF16, 4096, 4096, 1, false, false, 2, "8b-o");
    time_case(TM_DT_BF16, 6144, 4096, 1, false, false, 2, "8b-qkv");
    time_case(TM_DT_BF16, 14336, 4096, 1, false, false, 2, "8b-gate");
    time_case(TM_DT_BF16, 14336, 4096, 1, false, true, 2, "8b-gate+up");
    time_case(TM_DT_BF16, 4096, 14336, 1, false, false, 2, "8b-down");
    time_case(TM_DT_BF16, 128256, 4096, 1, true, false, 2, "8b-lm_head");
    for (int n = 2; n <= 8; n *= 2) {
        time_case(TM_DT_BF16, 6144, 2048, n, false, false, 2, "1b-qkv");
        time_case(TM_DT_BF16, 4096, 14336, n, false, false, 2, "8b-down");
    }
    time_case(TM_DT_BF16, 4096, 4096, 1, false, false, 1, "8b-o");
    /* other types on the 8B shapes (+ the 1B down projection for short rows) */
    const int32_t others[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K, TM_DT_F16, TM_DT_F32};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const int32_t t = others[i];
        time_case(t, 4096, 4096, 1, false, false, 2, "8b-o");
        time_case(t, 14336, 4096, 1, false, false, 2, "8b-gate");
        time_case(t, 14336, 4096, 1, false, true, 2, "8b-gate+up");
        time_case(t, 4096, 14336, 1, false, false, 2, "8b-down");
        time_case(t, 2048, 2048, 1, false, false, 2, "1b-o");
        if (t == TM_DT_Q6_K || t == TM_DT_Q8_0) time_case(t, 128256, 4096, 1, true, false, 2, "8b-lm_head");
        if (t != TM_DT_F32) {
            time_case(t, 4096, 4096, 4, false, false, 2, "8b-o");
            time_case(t, 4096, 4096, 8, false, false, 2, "8b-o");
            time_case(t, 4096, 4096, 1, false, false, 1, "8b-o");
        }
    }
}

int main(int argc, char **argv) {
    (void)argv;
    tb_seed();
    check_args();
    check_all();
    check_chain(false);
    check_chain(true);
    if (argc < 2) time_all(); /* any argument: checks only */
    return tb_finish("tb_gemv");
}
