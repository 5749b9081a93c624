/* tb_gemv.c -- tm_cuda_gemv / _group / _swiglu (every weight type, n = 1..8) against a double CPU reference. */
#include "backend/cpu/tm_quant.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "core/tm_fp8.h"
#include "tb_guard.h"
#include "tb_quant.h"

/* Checks, for each weight type (f32, f16, bf16, q8_0, q4_0, q4_1, q4_K, q6_K) and both kernels (v2, the default,
 * and v1 through TM_CUDA_GEMV_V=1): f32 output with a bias, bf16 output without, and the SwiGLU epilogue, over
 * cols = one block, a few blocks (lanes with 0 or 1 unit), 1184/1280 (odd unit counts), 4096 and
 * 14336 (long f32 accumulation), rows = 1, 7, 37, 130 (not multiples of the 2 rows per block), n = 1..8, and float
 * cols that are not a multiple of 8 (the launcher's fallback to v1). Weights are random floats quantized by the
 * CPU quantizer (tm_quant_row) or, for quantized types, random block bytes with sane fp16 scales (every bit
 * pattern of nibbles, 6-bit scales and high bits). The reference is sum_j dequant(w)[r, j] * x[b, j] in double,
 * dequant = tm_dequant_row on the same bytes; the error is the relative L2 error over the whole output, tolerance
 * 1e-4 for f32 output and 1e-2 for bf16.
 * Groups (tm_cuda_gemv_group): every type on uneven jobs (576+192+192 SmolLM2-like, 2048+512+512, four odd jobs,
 * an empty job; 4096+1024+1024 for bf16, q8_0, q4_K, q6_K), n = 1..8, f32 output with a bias on some jobs and
 * bf16 without; each output is checked against the reference AND for bit-identity with tm_cuda_gemv run per job,
 * and every n's rows with the n = 8 run's (a row's result must not depend on its companions: jobs or batch rows).
 * Then: a chain (group -> GEMV) run directly and as a captured CUDA graph, with and without programmatic dependent
 * launch (TM_CUDA_PDL=1).
 * Timing (default kernel, out bf16 except lm_head f32): bf16 on the Llama-3.2-1B and Llama-3-8B shapes, single
 * launches (event pair around one launch: includes the launch latency) and in a CUDA graph of 20 back-to-back
 * launches (the decode situation; per launch), without and with PDL; the 2048-column shapes with the first
 * version's block shape (TM_CUDA_GEMV_WIDE=1); the QKV group against three launches; the quantized and f16 types
 * on the 8B shapes, SwiGLU pairs, n = 2/4/8 and v1 on a few. Bytes = weights + x + output (+ bias); weights rotate
 * over copies totalling >= 160 MB so that no case runs from L2. The "# key" lines at the end repeat the main ones.
 * Fused epilogues (tm_cuda_gemv_add_rmsnorm, tm_cuda_gemv_qkv_rope) on bf16, q4_1 and q8_0 weights, SmolLM2 / 1B /
 * 8B shapes plus small odd ones, n = 1..8, each run directly, 3 times in a row and as a captured graph replayed 3
 * times (the last-block counter must come back to zero): against the CPU reference (GEMV in double, then the
 * residual add + RMSNorm, or the bf16 rounding + RoPE in double + cache slots with a poisoned cache) and against
 * the unfused pair (bit-identical GEMV outputs, residual and v; the norm and the rotation within one bf16 step).
 * They are timed first, at n = 1 (and 8 on the 8B shape), single launches and in a graph, against the pairs.
 * The GGUF-quantized types stage x in shared memory by default: every single-product case also runs with
 * TM_CUDA_GEMV_XS=0 (x from L2) and the two f32 outputs must be bitwise equal.
 * Robustness (tb_guard.h): every host allocation is checked; each case prints "CASE <name>" before it starts; a
 * crash or a hang (watchdog TB_WATCHDOG_S, default 170 s) prints "# CRASH|TIMEOUT in case <name>"; the timing
 * stops once the run has used TB_BUDGET_S seconds (default 25), printing how many timing cases it skipped. */

#define MAX_N TM_CUDA_GEMV_MAX_N
#define MAX_JOBS TM_CUDA_GEMV_MAX_JOBS

/* (rows, cols) f32 values of the weights, through the CPU reference dequantization */
static float *dequant_all(int32_t t, const uint8_t *w, int64_t rows, int64_t cols) {
    const size_t rb = row_bytes_of(t, cols);
    float *f = tb_xmalloc((size_t)rows * (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) tm_dequant_row((tm_dtype)t, w + (size_t)r * rb, f + (size_t)r * cols, cols);
    return f;
}

/* ref (n, rows) = x (n, cols) . wf^T (+ bias) in double */
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

/* out (n, dim) = rmsnorm of each row of x (n, dim) times w, in double: x * (1 / sqrt(mean(x^2) + eps)) * w */
static void ref_rmsnorm(const float *x, const float *w, double eps, int n, int64_t dim, float *out) {
    for (int b = 0; b < n; b++) {
        const float *xr = x + (size_t)b * dim;
        double ss = 0.0;
        for (int64_t i = 0; i < dim; i++) ss += (double)xr[i] * (double)xr[i];
        const double sc = 1.0 / sqrt(ss / (double)dim + eps);
        for (int64_t i = 0; i < dim; i++) out[(size_t)b * dim + i] = (float)((double)xr[i] * sc * w[i]);
    }
}

static void set_version(int v) {
    if (v == 1)
        setenv("TM_CUDA_GEMV_V", "1", 1);
    else
        unsetenv("TM_CUDA_GEMV_V");
}

static void set_pdl(bool on) {
    if (on)
        setenv("TM_CUDA_PDL", "1", 1);
    else
        unsetenv("TM_CUDA_PDL");
}

/* ---- correctness: one product ---------------------------------------------------------------------------------- */

static void check_case(int32_t t, int64_t rows, int64_t cols, int n, bool random_bytes) {
    char tag[96];
    snprintf(tag, sizeof tag, "%s%s %lldx%lld n%d", type_name(t), random_bytes ? "r" : "", (long long)rows,
             (long long)cols, n);
    tb_case("gemv %s", tag);
    const size_t rb = row_bytes_of(t, cols), wbytes = rb * (size_t)rows;
    uint8_t *wg = make_weights(t, rows, cols, random_bytes), *wu = make_weights(t, rows, cols, random_bytes);
    float *fg = dequant_all(t, wg, rows, cols), *fu = dequant_all(t, wu, rows, cols);
    uint16_t *xh = tb_xmalloc((size_t)n * cols * 2);            /* (n, cols) */
    float *xf = tb_xmalloc((size_t)n * cols * sizeof(float));   /* (n, cols) */
    float *bias = tb_xmalloc((size_t)rows * sizeof(float));     /* (rows) */
    tb_fill_bf16(xh, xf, (size_t)n * cols, 1.0f);
    tb_fill_f32(bias, (size_t)rows, 0.5f);
    const size_t no = (size_t)n * rows;
    double *rg = tb_xmalloc(no * sizeof(double)), *ru = tb_xmalloc(no * sizeof(double));
    double *rgb = tb_xmalloc(no * sizeof(double));
    ref_gemv(fg, xf, bias, rows, cols, n, rgb);
    ref_gemv(fg, xf, NULL, rows, cols, n, rg);
    ref_gemv(fu, xf, NULL, rows, cols, n, ru);
    float *ref_bias = tb_xmalloc(no * sizeof(float)), *ref_nob = tb_xmalloc(no * sizeof(float));
    float *ref_sw = tb_xmalloc(no * sizeof(float));
    for (size_t i = 0; i < no; i++) {
        ref_bias[i] = (float)rgb[i];
        ref_nob[i] = (float)rg[i];
        ref_sw[i] = (float)(rg[i] / (1.0 + exp(-rg[i])) * ru[i]);
    }
    void *wg_d = tb_upload(wg, wbytes), *wu_d = tb_upload(wu, wbytes);
    uint16_t *x_d = tb_upload(xh, (size_t)n * cols * 2);
    float *bias_d = tb_upload(bias, (size_t)rows * sizeof(float));
    void *out_d = tb_dev(no * 4);
    float *out_f = tb_xmalloc(no * 4);
    uint16_t *out_h = tb_xmalloc(no * 2);
    char name[128];
    for (int v = 2; v >= 1; v--) {
        set_version(v);
        const char *kv = v == 1 ? "v1" : "v2";
        /* f32 out + bias */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, bias_d, out_d, true, NULL, 0));
        tb_download(out_f, out_d, no * 4);
        snprintf(name, sizeof name, "%s %s f32+b", kv, tag);
        tb_result("gemv", name, tb_rel_err(out_f, ref_bias, no), 1e-4, 0, 0, 0, 'm');
        /* bf16 out, no bias */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, NULL, out_d, false, NULL, 0));
        tb_download(out_h, out_d, no * 2);
        snprintf(name, sizeof name, "%s %s bf16", kv, tag);
        tb_result("gemv", name, tb_rel_err_bf16(out_h, ref_nob, no), 1e-2, 0, 0, 0, 'm');
        /* SwiGLU */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv_swiglu(wg_d, wu_d, t, rows, cols, x_d, n, out_d, NULL, 0));
        tb_download(out_h, out_d, no * 2);
        snprintf(name, sizeof name, "%s %s", kv, tag);
        tb_result("gemv_swiglu", name, tb_rel_err_bf16(out_h, ref_sw, no), 1e-2, 0, 0, 0, 'm');
    }
    set_version(2);
    if (is_quant(t)) { /* x staged in shared memory (the default for these types) or read from L2: the same sums */
        float *staged = tb_xmalloc(no * 4);
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, bias_d, out_d, true, NULL, 0));
        tb_download(staged, out_d, no * 4);
        setenv("TM_CUDA_GEMV_XS", "0", 1);
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, bias_d, out_d, true, NULL, 0));
        unsetenv("TM_CUDA_GEMV_XS");
        tb_download(out_f, out_d, no * 4);
        snprintf(name, sizeof name, "v2 %s staged x = L2 x (bitwise)", tag);
        tb_result("gemv", name, memcmp(staged, out_f, no * 4) != 0, 0, 0, 0, 0, 'm');
        free(staged);
    }
    TB_CHECK(cudaFree(wg_d));
    TB_CHECK(cudaFree(wu_d));
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(bias_d));
    TB_CHECK(cudaFree(out_d));
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
        const int64_t one = qk_of(t) > 1 ? qk_of(t) : 8;
        const int64_t odd = one == 256 ? 1280 : 1184; /* 5 K-blocks / 37 blocks or 148 units of 8 */
        struct {
            int64_t rows, cols;
        } sh[] = {{1, one}, {7, one}, {37, 3 * one}, {130, 8 * one}, {37, odd}, {7, 4096}, {130, 2048}, {5, 14336}};
        for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
            const int n = 1 + (nn++ % MAX_N);
            check_case(t, sh[s].rows, sh[s].cols, n, false);
        }
        /* all n on one shape */
        for (int n = 1; n <= MAX_N; n++) check_case(t, 9, 4 * one, n, false);
        if (is_quant(t)) {
            check_case(t, 37, odd, 3, true);
            check_case(t, 7, 4096, 1, true);
            check_case(t, 4, 2048, 8, true);
        } else {
            check_case(t, 7, 36, 2, false); /* cols % 8 != 0: v1 fallback */
            check_case(t, 33, 1000, 5, false);
        }
    }
}

/* ---- correctness: groups --------------------------------------------------------------------------------------- */

/* Jobs of `rows[j]` rows (0 allowed) sharing type t, cols and x; for every n in 1..8 and both kernel versions:
 * f32 out with a bias on every job but job 1, then bf16 out without bias; against the reference, bitwise against
 * tm_cuda_gemv per job, and bitwise against the n = 8 run's first n batch rows. */
static void check_group(int32_t t, int64_t cols, const int64_t *rows, int nj, bool random_bytes) {
    char tag[128];
    int len = snprintf(tag, sizeof tag, "%s%s ", type_name(t), random_bytes ? "r" : "");
    for (int j = 0; j < nj; j++)
        len += snprintf(tag + len, sizeof tag - (size_t)len, "%s%lld", j ? "+" : "", (long long)rows[j]);
    snprintf(tag + len, sizeof tag - (size_t)len, "x%lld", (long long)cols);
    tb_case("gemv_group %s", tag);

    const size_t rb = row_bytes_of(t, cols);
    int64_t tot = 0;
    for (int j = 0; j < nj; j++) tot += rows[j];
    uint16_t *xh = tb_xmalloc((size_t)MAX_N * cols * 2);          /* (8, cols) */
    float *xf = tb_xmalloc((size_t)MAX_N * cols * sizeof(float)); /* (8, cols) */
    tb_fill_bf16(xh, xf, (size_t)MAX_N * cols, 1.0f);
    uint16_t *x_d = tb_upload(xh, (size_t)MAX_N * cols * 2);
    /* per job: weights, bias, the reference for n = 8 with and without bias, device outputs */
    void *w_d[MAX_JOBS], *out_g[MAX_JOBS], *out_s[MAX_JOBS];
    float *bias_d[MAX_JOBS];
    float *ref_b = tb_xmalloc((size_t)MAX_N * (size_t)(tot ? tot : 1) * sizeof(float)); /* (job, n, rows_j) */
    float *ref_n = tb_xmalloc((size_t)MAX_N * (size_t)(tot ? tot : 1) * sizeof(float));
    int64_t off = 0;
    for (int j = 0; j < nj; j++) {
        const int64_t r = rows[j];
        uint8_t *w = make_weights(t, r, cols, random_bytes);
        float *wf = dequant_all(t, w, r, cols);
        float *bias = tb_xmalloc((size_t)(r ? r : 1) * sizeof(float)); /* (rows_j) */
        tb_fill_f32(bias, (size_t)r, 0.5f);
        double *rd = tb_xmalloc((size_t)MAX_N * (size_t)(r ? r : 1) * sizeof(double)); /* (8, rows_j) */
        ref_gemv(wf, xf, NULL, r, cols, MAX_N, rd);
        for (int64_t i = 0; i < MAX_N * r; i++) {
            ref_n[MAX_N * off + i] = (float)rd[i];
            ref_b[MAX_N * off + i] = (float)(rd[i] + (j == 1 ? 0.0 : (double)bias[i % r]));
        }
        w_d[j] = tb_upload(w, rb * (size_t)r);
        bias_d[j] = tb_upload(bias, (size_t)r * sizeof(float));
        out_g[j] = tb_dev((size_t)MAX_N * (size_t)r * 4);
        out_s[j] = tb_dev((size_t)MAX_N * (size_t)r * 4);
        off += r;
        free(w);
        free(wf);
        free(bias);
        free(rd);
    }
    const size_t tot_b = (size_t)MAX_N * (size_t)(tot ? tot : 1) * 4;
    uint8_t *hg = tb_xmalloc(tot_b), *hs = tb_xmalloc(tot_b), *h8 = tb_xmalloc(tot_b); /* (job, n, rows_j) outputs */
    float *got = tb_xmalloc((size_t)MAX_N * (size_t)(tot ? tot : 1) * sizeof(float));
    float *want = tb_xmalloc((size_t)MAX_N * (size_t)(tot ? tot : 1) * sizeof(float));
    char name[256];
    for (int v = 2; v >= 1; v--) {
        set_version(v);
        for (int pass = 0; pass < 2; pass++) {
            const bool f32 = pass == 0;
            const size_t es = f32 ? 4 : 2;
            double worst = 0.0;
            int not_same = 0, not_inv = 0;
            /* batch invariance within a kernel: n from 8 down, each compared with the largest n run on the same
             * kernel (the tensor cores from tm_cuda_gemv_tc_min_n(t) on where the shapes fit, the CUDA cores below) */
            const int32_t tc_n = tm_cuda_gemv_tc_min_n(t);
            int inv_n = 0; /* the n whose outputs h8 holds */
            for (int n = MAX_N; n >= 1; n--) {
                tm_cuda_gemv_job jobs[MAX_JOBS];
                for (int j = 0; j < nj; j++) {
                    jobs[j] = (tm_cuda_gemv_job){w_d[j], rows[j], f32 && j != 1 ? bias_d[j] : NULL, out_g[j], 0, 0,
                                                 NULL, 0, NULL};
                    tb_poison(out_g[j], (size_t)MAX_N * (size_t)rows[j] * 4);
                    tb_poison(out_s[j], (size_t)MAX_N * (size_t)rows[j] * 4);
                }
                TB_RUN(tm_cuda_gemv_group(jobs, nj, t, cols, x_d, n, f32, 0));
                for (int j = 0; j < nj; j++)
                    TB_RUN(tm_cuda_gemv(w_d[j], t, rows[j], cols, x_d, n, jobs[j].bias, out_s[j], f32, NULL, 0));
                size_t o = 0, k = 0;
                for (int j = 0; j < nj; j++) {
                    const size_t cnt = (size_t)n * (size_t)rows[j];
                    tb_download(hg + o * es, out_g[j], cnt * es);
                    tb_download(hs + o * es, out_s[j], cnt * es);
                    const float *rf = (f32 ? ref_b : ref_n) + (size_t)MAX_N * (size_t)(k);
                    for (size_t i = 0; i < cnt; i++) {
                        if (f32)
                            memcpy(&got[o + i], hg + (o + i) * 4, 4);
                        else {
                            uint16_t h;
                            memcpy(&h, hg + (o + i) * 2, 2);
                            got[o + i] = tb_bf16_to_f32(h);
                        }
                        want[o + i] = rf[i];
                    }
                    o += cnt;
                    k += (size_t)rows[j];
                }
                const double e = tb_rel_err(got, want, o);
                if (!isnan(worst) && (isnan(e) || e > worst)) worst = e; /* a NaN sticks */
                not_same += memcmp(hg, hs, o * es) != 0;
                if (inv_n == 0 || (n >= tc_n) != (inv_n >= tc_n)) {
                    memcpy(h8, hg, o * es);
                    inv_n = n;
                } else { /* rows b < n of every job equal the inv_n run's */
                    size_t o8 = 0, on = 0;
                    for (int j = 0; j < nj; j++) {
                        not_inv += memcmp(h8 + o8 * es, hg + on * es, (size_t)n * (size_t)rows[j] * es) != 0;
                        o8 += (size_t)inv_n * (size_t)rows[j];
                        on += (size_t)n * (size_t)rows[j];
                    }
                }
            }
            snprintf(name, sizeof name, "v%d %s n1-8 %s", v, tag, f32 ? "f32+b" : "bf16");
            tb_result("gemv_group", name, worst, f32 ? 1e-4 : 1e-2, 0, 0, 0, 'm');
            if (not_same || not_inv) {
                snprintf(name, sizeof name, "v%d %s %s: %d n differ from gemv, %d from larger n", v, tag,
                         f32 ? "f32" : "bf16", not_same, not_inv);
                tb_result("gemv_group", name, 1.0, 0.0, 0, 0, 0, 'm');
            }
        }
    }
    set_version(2);
    for (int j = 0; j < nj; j++) {
        TB_CHECK(cudaFree(w_d[j]));
        TB_CHECK(cudaFree(bias_d[j]));
        TB_CHECK(cudaFree(out_g[j]));
        TB_CHECK(cudaFree(out_s[j]));
    }
    TB_CHECK(cudaFree(x_d));
    free(xh);
    free(xf);
    free(ref_b);
    free(ref_n);
    free(hg);
    free(hs);
    free(h8);
    free(got);
    free(want);
}

static void check_groups(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int32_t t = k_types[ti];
        const int64_t qk = qk_of(t) > 1 ? qk_of(t) : 8;
        const int64_t smol = 576 % qk == 0 ? 576 : 768; /* SmolLM2's dim; K-quants need 256 | cols */
        const int64_t s1[] = {576, 192, 192}, s2[] = {2048, 512, 512}, s3[] = {4096, 1024, 1024};
        const int64_t s4[] = {7, 1, 130, 37}, s5[] = {5, 0, 3};
        check_group(t, smol, s1, 3, false);
        check_group(t, 2048, s2, 3, false);
        if (t == TM_DT_BF16 || t == TM_DT_Q8_0 || t == TM_DT_Q4_K || t == TM_DT_Q6_K)
            check_group(t, 4096, s3, 3, false); /* the 8B shape (costly references): the types 8B models use */
        check_group(t, qk == 256 ? 1280 : 1184, s4, 4, false);
        check_group(t, 3 * qk, s5, 3, false);
        if (is_quant(t)) check_group(t, 2048, s2, 3, true);
        else check_group(t, 36, s1, 3, false); /* cols % 8 != 0: every job through v1 */
    }
}

/* ---- a chain (group -> GEMV), direct and in a CUDA graph, with and without PDL -------------------------------- */

static void check_chain(bool pdl) {
    tb_case("gemv chain%s", pdl ? " pdl" : "");
    const int32_t t = TM_DT_BF16;
    const int64_t d = 2048, f = 4096, e = 512;
    const int n = 2;
    /* group: h (n, f) = x . w1^T, g (n, e) = x . w3^T + b3 ; then o (n, d) = h . w2^T in f32 */
    uint8_t *w1 = make_weights(t, f, d, false), *w2 = make_weights(t, d, f, false), *w3 = make_weights(t, e, d, false);
    float *f1 = dequant_all(t, w1, f, d), *f2 = dequant_all(t, w2, d, f), *f3 = dequant_all(t, w3, e, d);
    uint16_t *xh = tb_xmalloc((size_t)n * d * 2);              /* (n, d) */
    float *xf = tb_xmalloc((size_t)n * d * sizeof(float));     /* (n, d) */
    float *b3 = tb_xmalloc((size_t)e * sizeof(float));         /* (e) */
    tb_fill_bf16(xh, xf, (size_t)n * d, 1.0f);
    tb_fill_f32(b3, (size_t)e, 0.5f);
    void *w1_d = tb_upload(w1, row_bytes_of(t, d) * f), *w2_d = tb_upload(w2, row_bytes_of(t, f) * d);
    void *w3_d = tb_upload(w3, row_bytes_of(t, d) * e);
    float *b3_d = tb_upload(b3, (size_t)e * sizeof(float));
    uint16_t *x_d = tb_upload(xh, (size_t)n * d * 2);
    uint16_t *h_d = tb_dev((size_t)n * f * 2), *g_d = tb_dev((size_t)n * e * 2);
    float *o_d = tb_dev((size_t)n * d * 4);
    uint16_t *hh = tb_xmalloc((size_t)n * f * 2), *gh = tb_xmalloc((size_t)n * e * 2);
    float *hf = tb_xmalloc((size_t)n * f * sizeof(float)), *of = tb_xmalloc((size_t)n * d * 4);
    float *ref = tb_xmalloc((size_t)n * f * sizeof(float));    /* the largest of the three outputs: (n, f) */
    double *rd = tb_xmalloc((size_t)n * f * sizeof(double));   /* (n, f) */
    set_pdl(pdl);
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const tm_cuda_gemv_job jobs[2] = {{w1_d, f, NULL, h_d, 0, 0, NULL, 0, NULL}, {w3_d, e, b3_d, g_d, 0, 0, NULL, 0, NULL}};
    for (int graph = 0; graph < 2; graph++) {
        tb_poison(h_d, (size_t)n * f * 2);
        tb_poison(g_d, (size_t)n * e * 2);
        tb_poison(o_d, (size_t)n * d * 4);
        TB_CHECK(cudaDeviceSynchronize()); /* the poison runs on the legacy stream, s does not wait for it */
        if (graph) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            TB_CHECK(tm_cuda_gemv_group(jobs, 2, t, d, x_d, n, false, s));
            TB_CHECK(tm_cuda_gemv(w2_d, t, d, f, h_d, n, NULL, o_d, true, NULL, s));
            TB_CHECK(cudaStreamEndCapture(s, &g));
            TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
            for (int rep = 0; rep < 3; rep++) TB_CHECK(cudaGraphLaunch(ge, s));
            TB_CHECK(cudaStreamSynchronize(s));
            TB_CHECK(cudaGraphExecDestroy(ge));
            TB_CHECK(cudaGraphDestroy(g));
        } else {
            TB_CHECK(tm_cuda_gemv_group(jobs, 2, t, d, x_d, n, false, s));
            TB_CHECK(tm_cuda_gemv(w2_d, t, d, f, h_d, n, NULL, o_d, true, NULL, s));
            TB_CHECK(cudaStreamSynchronize(s));
        }
        TB_CHECK(cudaGetLastError());
        char name[64];
        /* the second product against a reference from the first's actual bf16 output */
        tb_download(hh, h_d, (size_t)n * f * 2);
        for (size_t i = 0; i < (size_t)n * f; i++) hf[i] = tb_bf16_to_f32(hh[i]);
        ref_gemv(f2, hf, NULL, d, f, n, rd); /* (n, d) */
        for (size_t i = 0; i < (size_t)n * d; i++) ref[i] = (float)rd[i];
        tb_download(of, o_d, (size_t)n * d * 4);
        const double e2 = tb_rel_err(of, ref, (size_t)n * d);
        /* the group's two outputs against their own references */
        ref_gemv(f1, xf, NULL, f, d, n, rd); /* (n, f) */
        for (size_t i = 0; i < (size_t)n * f; i++) ref[i] = (float)rd[i];
        const double e1 = tb_rel_err_bf16(hh, ref, (size_t)n * f);
        ref_gemv(f3, xf, b3, e, d, n, rd); /* (n, e) */
        for (size_t i = 0; i < (size_t)n * e; i++) ref[i] = (float)rd[i];
        tb_download(gh, g_d, (size_t)n * e * 2);
        const double e3 = tb_rel_err_bf16(gh, ref, (size_t)n * e);
        snprintf(name, sizeof name, "chain %s%s group", graph ? "graph" : "direct", pdl ? " pdl" : "");
        tb_result("gemv", name, e1 > e3 || e1 != e1 ? e1 : e3, 1e-2, 0, 0, 0, 'm');
        snprintf(name, sizeof name, "chain %s%s 2nd", graph ? "graph" : "direct", pdl ? " pdl" : "");
        tb_result("gemv", name, e2, 1e-4, 0, 0, 0, 'm');
    }
    set_pdl(false);
    TB_CHECK(cudaStreamDestroy(s));
    TB_CHECK(cudaFree(w1_d));
    TB_CHECK(cudaFree(w2_d));
    TB_CHECK(cudaFree(w3_d));
    TB_CHECK(cudaFree(b3_d));
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(h_d));
    TB_CHECK(cudaFree(g_d));
    TB_CHECK(cudaFree(o_d));
    free(w1);
    free(w2);
    free(w3);
    free(f1);
    free(f2);
    free(f3);
    free(xh);
    free(xf);
    free(b3);
    free(hh);
    free(gh);
    free(hf);
    free(of);
    free(ref);
    free(rd);
}

/* ---- fused epilogues: GEMV + add_rmsnorm, Q/K/V GEMV + RoPE + cache write ------------------------------------- */

/* distance between two finite bf16 values in representable steps */
static int bf16_ulps(uint16_t a, uint16_t b) {
    const int32_t ia = (a & 0x8000) ? -(int32_t)(a & 0x7fff) : (int32_t)a;
    const int32_t ib = (b & 0x8000) ? -(int32_t)(b & 0x7fff) : (int32_t)b;
    return ia > ib ? ia - ib : ib - ia;
}

/* max bf16 distance over n values (a NaN bit pattern on either side counts as far) */
static int max_ulps(const uint16_t *a, const uint16_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        const bool na = (a[i] & 0x7fff) > 0x7f80, nb = (b[i] & 0x7fff) > 0x7f80;
        const int d = (na || nb) ? (a[i] == b[i] ? 0 : 1 << 20) : bf16_ulps(a[i], b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* a captured graph of fn(arg) on s, replayed `reps` times */
static void graph_replay(void (*fn)(void *, cudaStream_t), void *arg, cudaStream_t s, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    fn(arg, s);
    TB_CHECK(cudaStreamEndCapture(s, &g));
    TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < reps; i++) TB_CHECK(cudaGraphLaunch(ge, s));
    TB_CHECK(cudaStreamSynchronize(s));
    TB_CHECK(cudaGraphExecDestroy(ge));
    TB_CHECK(cudaGraphDestroy(g));
}

typedef struct norm_run {
    const void *w;
    int32_t t;
    int64_t rows, cols;
    const uint16_t *x;
    int n;
    const float *bias, *nw;
    float *res;
    uint16_t *out, *nout;
    void *scratch;
    bool poison_in_graph;
} norm_run;

#define NORM_EPS 1e-5f

static void norm_launch(void *p, cudaStream_t s) {
    norm_run *r = p;
    if (r->poison_in_graph) TB_CHECK(cudaMemsetAsync(r->nout, 0xFF, (size_t)r->n * (size_t)r->rows * 2, s));
    TB_CHECK(tm_cuda_gemv_add_rmsnorm(r->w, r->t, r->rows, r->cols, r->x, r->n, r->bias, r->out, r->res, r->nw,
                                      NORM_EPS, r->nout, r->scratch, NULL, s));
}

/* tm_cuda_gemv_add_rmsnorm on (rows, cols) weights of type t for n = 1..8, each n run directly, 3 times in a row
 * and as a captured graph (poison + launch) replayed 3 times. Checks: out against the double GEMV reference; the
 * residual bit-exactly against residual0 + out (added once per launch, in f32, as tm_cuda_add_rmsnorm adds);
 * norm_out against rmsnorm of the kernel's own residual in double; the scratch back to zero after every run; and
 * on the direct runs against the unfused pair (tm_cuda_gemv + tm_cuda_add_rmsnorm): out and residual bit-identical,
 * norm_out within 1 bf16 step (only the sum of squares' order differs). */
static void check_fused_norm(int32_t t, int64_t rows, int64_t cols, bool with_bias, const char *label) {
    tb_case("gemv_add_rmsnorm %s %s %lldx%lld", type_name(t), label, (long long)rows, (long long)cols);
    /* the fused op's GEMV is the CUDA-core kernel at every n: its unfused twin too (tm_cuda_gemv_tc_min_n) */
    setenv("TM_CUDA_GEMV_TC16", "0", 1);
    setenv("TM_CUDA_GEMV_FP8TC", "0", 1);
    const size_t nr = (size_t)MAX_N * (size_t)rows, nx = (size_t)MAX_N * (size_t)cols;
    uint8_t *w = make_weights(t, rows, cols, false);
    float *wf = dequant_all(t, w, rows, cols);                  /* (rows, cols) */
    uint16_t *xh = tb_xmalloc(nx * 2);                           /* (8, cols) */
    float *xf = tb_xmalloc(nx * sizeof(float));                  /* (8, cols) */
    float *bias = tb_xmalloc((size_t)rows * sizeof(float));      /* (rows) */
    float *nw = tb_xmalloc((size_t)rows * sizeof(float));        /* (rows) */
    float *res0 = tb_xmalloc(nr * sizeof(float));                /* (8, rows) */
    double *rd = tb_xmalloc(nr * sizeof(double));                /* (8, rows) GEMV reference */
    float *want = tb_xmalloc(nr * sizeof(float));
    float *res_h = tb_xmalloc(nr * sizeof(float)), *res2_h = tb_xmalloc(nr * sizeof(float));
    float *res_x = tb_xmalloc(nr * sizeof(float));               /* expected residual */
    uint16_t *out_h = tb_xmalloc(nr * 2), *out2_h = tb_xmalloc(nr * 2), *nout_h = tb_xmalloc(nr * 2),
             *nout2_h = tb_xmalloc(nr * 2);
    tb_fill_bf16(xh, xf, nx, 1.0f);
    tb_fill_f32(bias, (size_t)rows, 0.5f);
    tb_fill_f32(res0, nr, 1.0f);
    for (int64_t i = 0; i < rows; i++) nw[i] = 1.0f + 0.25f * tb_normal();
    ref_gemv(wf, xf, with_bias ? bias : NULL, rows, cols, MAX_N, rd);
    void *w_d = tb_upload(w, row_bytes_of(t, cols) * (size_t)rows);
    uint16_t *x_d = tb_upload(xh, nx * 2);
    float *b_d = tb_upload(bias, (size_t)rows * sizeof(float)), *nw_d = tb_upload(nw, (size_t)rows * sizeof(float));
    float *res_d = tb_dev(nr * sizeof(float)), *res2_d = tb_dev(nr * sizeof(float));
    uint16_t *out_d = tb_dev(nr * 2), *out2_d = tb_dev(nr * 2), *nout_d = tb_dev(nr * 2), *nout2_d = tb_dev(nr * 2);
    void *scr_d = tb_dev(TM_CUDA_GEMV_NORM_SCRATCH_BYTES);
    uint8_t scr_h[TM_CUDA_GEMV_NORM_SCRATCH_BYTES];
    TB_CHECK(cudaMemset(scr_d, 0, TM_CUDA_GEMV_NORM_SCRATCH_BYTES));
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double worst_o = 0.0, worst_n = 0.0;
    int exact_bad = 0, ulps = 0;
    for (int n = 1; n <= MAX_N; n++) {
        const size_t cnt = (size_t)n * (size_t)rows;
        for (int mode = 0; mode < 3; mode++) {
            const int reps = mode ? 3 : 1;
            TB_CHECK(cudaMemcpy(res_d, res0, cnt * sizeof(float), cudaMemcpyHostToDevice));
            tb_poison(out_d, nr * 2);
            tb_poison(nout_d, nr * 2);
            TB_CHECK(cudaDeviceSynchronize()); /* s does not wait for the legacy stream */
            norm_run r = {w_d, t, rows, cols, x_d, n, with_bias ? b_d : NULL, nw_d, res_d, out_d, nout_d, scr_d,
                          mode == 2};
            if (mode == 2)
                graph_replay(norm_launch, &r, s, reps);
            else
                for (int i = 0; i < reps; i++) norm_launch(&r, s);
            TB_CHECK(cudaStreamSynchronize(s));
            TB_CHECK(cudaGetLastError());
            tb_download(out_h, out_d, cnt * 2);
            tb_download(res_h, res_d, cnt * sizeof(float));
            tb_download(nout_h, nout_d, cnt * 2);
            tb_download(scr_h, scr_d, sizeof scr_h);
            for (size_t i = 0; i < sizeof scr_h; i++) exact_bad += scr_h[i] != 0;
            /* out against the double reference */
            for (size_t i = 0; i < cnt; i++) want[i] = (float)rd[i];
            double e = tb_rel_err_bf16(out_h, want, cnt);
            if (!(e <= worst_o)) worst_o = e;
            /* residual: res0 + out once per launch, exactly */
            for (size_t i = 0; i < cnt; i++) {
                float v = res0[i];
                for (int k = 0; k < reps; k++) v = v + tb_bf16_to_f32(out_h[i]);
                res_x[i] = v;
            }
            exact_bad += memcmp(res_x, res_h, cnt * sizeof(float)) != 0;
            /* norm_out against rmsnorm of the kernel's residual, in double */
            ref_rmsnorm(res_h, nw, (double)NORM_EPS, n, rows, want);
            e = tb_rel_err_bf16(nout_h, want, cnt);
            if (!(e <= worst_n)) worst_n = e;
            if (mode) continue;
            /* the unfused pair on the same inputs */
            TB_CHECK(cudaMemcpy(res2_d, res0, cnt * sizeof(float), cudaMemcpyHostToDevice));
            tb_poison(out2_d, nr * 2);
            tb_poison(nout2_d, nr * 2);
            TB_CHECK(cudaDeviceSynchronize());
            TB_CHECK(tm_cuda_gemv(w_d, t, rows, cols, x_d, n, with_bias ? b_d : NULL, out2_d, false, NULL, s));
            TB_CHECK(tm_cuda_add_rmsnorm(res2_d, out2_d, nw_d, NORM_EPS, n, (int32_t)rows, nout2_d, s));
            TB_CHECK(cudaStreamSynchronize(s));
            tb_download(out2_h, out2_d, cnt * 2);
            tb_download(res2_h, res2_d, cnt * sizeof(float));
            tb_download(nout2_h, nout2_d, cnt * 2);
            exact_bad += memcmp(out_h, out2_h, cnt * 2) != 0;
            exact_bad += memcmp(res_h, res2_h, cnt * sizeof(float)) != 0;
            const int u = max_ulps(nout_h, nout2_h, cnt);
            if (u > ulps) ulps = u;
        }
    }
    char name[128];
    snprintf(name, sizeof name, "%s %s %lldx%lld%s n1-8 out", type_name(t), label, (long long)rows, (long long)cols,
             with_bias ? " +b" : "");
    tb_result("gemv_add_rmsnorm", name, worst_o, 1e-2, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s %s %lldx%lld n1-8 norm", type_name(t), label, (long long)rows, (long long)cols);
    tb_result("gemv_add_rmsnorm", name, worst_n, 1e-2, 0, 0, 0, 'm');
    if (exact_bad || ulps > 1)
        printf("# %s: %d exact mismatches (residual, out vs gemv, scratch), norm_out %d bf16 steps from unfused\n",
               name, exact_bad, ulps);
    snprintf(name, sizeof name, "%s %s %lldx%lld exact+reps+graph", type_name(t), label, (long long)rows,
             (long long)cols);
    tb_result("gemv_add_rmsnorm", name, (double)exact_bad + (ulps > 1 ? (double)ulps : 0.0), 0, 0, 0, 0, 'm');
    TB_CHECK(cudaStreamDestroy(s));
    TB_CHECK(cudaFree(w_d));
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(b_d));
    TB_CHECK(cudaFree(nw_d));
    TB_CHECK(cudaFree(res_d));
    TB_CHECK(cudaFree(res2_d));
    TB_CHECK(cudaFree(out_d));
    TB_CHECK(cudaFree(out2_d));
    TB_CHECK(cudaFree(nout_d));
    TB_CHECK(cudaFree(nout2_d));
    TB_CHECK(cudaFree(scr_d));
    free(w);
    free(wf);
    free(xh);
    free(xf);
    free(bias);
    free(nw);
    free(res0);
    free(rd);
    free(want);
    free(res_h);
    free(res2_h);
    free(res_x);
    free(out_h);
    free(out2_h);
    free(nout_h);
    free(nout2_h);
    unsetenv("TM_CUDA_GEMV_TC16");
    unsetenv("TM_CUDA_GEMV_FP8TC");
}

typedef struct qkv_shape {
    const char *name;
    int H, KV, hd, rope_dim;
    int64_t cols;
    bool bias;
} qkv_shape;

typedef struct rope_run {
    tm_cuda_gemv_job jobs[3];
    int32_t t;
    int64_t cols;
    const uint16_t *x;
    int n;
    tm_cuda_rope_args rope;
    size_t cache_bytes;
    bool poison_in_graph;
} rope_run;

static void rope_launch(void *p, cudaStream_t s) {
    rope_run *r = p;
    if (r->poison_in_graph) {
        TB_CHECK(cudaMemsetAsync(r->rope.k_cache, 0xFF, r->cache_bytes, s));
        TB_CHECK(cudaMemsetAsync(r->rope.v_cache, 0xFF, r->cache_bytes, s));
        TB_CHECK(cudaMemsetAsync(r->jobs[0].out, 0xFF, (size_t)r->n * (size_t)r->jobs[0].rows * 2, s));
    }
    TB_CHECK(tm_cuda_gemv_qkv_rope(r->jobs, r->t, r->cols, r->x, r->n, &r->rope, s));
}

/* rotate one head (hd bf16-valued floats) in double with the f32 angle, as tb_rope's reference */
static void ref_rope_head(const float *x, float *out, const float *inv, int pos, int hd, int rope_dim) {
    for (int d = 0; d < hd; d++) out[d] = x[d];
    for (int j = 0; j < rope_dim / 2; j++) {
        const float th = (float)pos * inv[j];
        const double c = cos((double)th), s = sin((double)th), a = x[2 * j], b = x[2 * j + 1];
        out[2 * j] = (float)(a * c - b * s);
        out[2 * j + 1] = (float)(a * s + b * c);
    }
}

/* QKV+RoPE results of n tokens against the double reference ref[0..2] ((n, rq) and (n, rk) rows): q is the rotated
 * bf16 of the reference; the caches are checked slot by slot (k rotated, v plain), and slots that no token maps to
 * (the padding token's among them) must keep their 0xFFFF poison. got, want: (n * rq) scratch floats. Returns the
 * poison violations; e[0..2]: the q, k and v relative errors. */
static size_t rope_errs(int n, int H, int KV, int hd, int rdim, size_t rq, size_t rk, size_t bs, size_t n_slots,
                        const int64_t *slot, const int32_t *pos, const float *inv, double *const ref[3],
                        const uint16_t *q, const uint16_t *kc, const uint16_t *vc, float *got, float *want,
                        double e[3]) {
    float *hb = tb_xmalloc((size_t)hd * sizeof(float)), *hr = tb_xmalloc((size_t)hd * sizeof(float));
    for (int b = 0; b < n; b++)
        for (int h = 0; h < H; h++) {
            const size_t o = (size_t)b * rq + (size_t)h * hd;
            for (int d = 0; d < hd; d++) hb[d] = tb_bf16_to_f32(tb_f32_to_bf16((float)ref[0][o + d]));
            ref_rope_head(hb, want + o, inv, pos[b], hd, rdim);
            for (int d = 0; d < hd; d++) got[o + d] = tb_bf16_to_f32(q[o + d]);
        }
    e[0] = tb_rel_err(got, want, (size_t)n * rq);
    size_t nk = 0, nv = 0, bad = 0;
    const size_t ncv = (size_t)n * (size_t)KV * (size_t)hd;
    float *gv = tb_xmalloc(ncv * sizeof(float)), *wv = tb_xmalloc(ncv * sizeof(float));
    for (size_t sl = 0; sl < n_slots; sl++) {
        int tok = -1;
        for (int b = 0; b < n; b++)
            if (slot[b] == (int64_t)sl) tok = b;
        const size_t blk = sl / bs, so = sl % bs;
        for (int h = 0; h < KV; h++) {
            const size_t co = ((blk * (size_t)KV + (size_t)h) * bs + so) * (size_t)hd;
            if (tok < 0) {
                for (int d = 0; d < hd; d++) bad += (kc[co + d] != 0xFFFF) + (vc[co + d] != 0xFFFF);
                continue;
            }
            const size_t ko = (size_t)tok * rk + (size_t)h * hd;
            for (int d = 0; d < hd; d++) hb[d] = tb_bf16_to_f32(tb_f32_to_bf16((float)ref[1][ko + d]));
            ref_rope_head(hb, hr, inv, pos[tok], hd, rdim);
            for (int d = 0; d < hd; d++) {
                want[nk] = hr[d];
                got[nk++] = tb_bf16_to_f32(kc[co + d]);
                wv[nv] = (float)ref[2][ko + d];
                gv[nv++] = tb_bf16_to_f32(vc[co + d]);
            }
        }
    }
    e[1] = nk ? tb_rel_err(got, want, nk) : 0.0;
    e[2] = nv ? tb_rel_err(gv, wv, nv) : 0.0;
    free(gv);
    free(wv);
    free(hb);
    free(hr);
    return bad;
}

/* tm_cuda_gemv_qkv_rope for n = 1..8: direct (with k, v outputs), 3 times in a row and a graph (poison + launch)
 * replayed 3 times (without). Against a CPU reference (double GEMV, rounded to bf16, rotated in double with the
 * f32 angle; k, v in the cache slots; slots outside the mapping and the padding token's keep their poison) and
 * against the unfused pair (tm_cuda_gemv_group + tm_cuda_rope_kv_write): v cache and k, v outputs bit-identical,
 * q and the k cache within 1 bf16 step. nin: x is a raw residual and both paths norm it as they read it (norm-in,
 * tm_cuda_gemv_job.norm_w); the reference is on the normed x. */
static void check_fused_rope(int32_t t, const qkv_shape *c, bool nin) {
    tb_case("gemv_qkv_rope %s %s%s", type_name(t), c->name, nin ? " norm-in" : "");
    const int H = c->H, KV = c->KV, hd = c->hd, rdim = c->rope_dim, bs = 16, nblk = 5;
    const int64_t cols = c->cols, rq = (int64_t)H * hd, rk = (int64_t)KV * hd, rows[3] = {rq, rk, rk};
    const size_t nx = (size_t)MAX_N * (size_t)cols, n_slots = (size_t)nblk * bs, ncache = n_slots * (size_t)rk;
    uint8_t *w[3];
    float *wf[3], *bias[3];
    double *rd[3];
    void *w_d[3];
    float *b_d[3];
    for (int j = 0; j < 3; j++) {
        w[j] = make_weights(t, rows[j], cols, false);
        wf[j] = dequant_all(t, w[j], rows[j], cols);
        bias[j] = tb_xmalloc((size_t)rows[j] * sizeof(float));
        tb_fill_f32(bias[j], (size_t)rows[j], 0.5f);
        rd[j] = tb_xmalloc((size_t)MAX_N * (size_t)rows[j] * sizeof(double));
        w_d[j] = tb_upload(w[j], row_bytes_of(t, cols) * (size_t)rows[j]);
        b_d[j] = tb_upload(bias[j], (size_t)rows[j] * sizeof(float));
    }
    uint16_t *xh = tb_xmalloc(nx * 2);
    float *xf = tb_xmalloc(nx * sizeof(float));
    tb_fill_bf16(xh, xf, nx, 1.0f);
    const float eps = 1e-5f;
    float *nw = tb_xmalloc((size_t)cols * sizeof(float)); /* (cols) norm-in's weight */
    tb_fill_f32(nw, (size_t)cols, 0.5f);
    for (int64_t j = 0; j < cols; j++) nw[j] += 1.0f;
    float *xr = tb_xmalloc(nx * sizeof(float)); /* (8, cols) the reference's input: x, or x normed */
    if (nin)
        ref_rmsnorm(xf, nw, (double)eps, MAX_N, cols, xr);
    else
        memcpy(xr, xf, nx * sizeof(float));
    float *nw_d = tb_upload(nw, (size_t)cols * sizeof(float));
    const float *nwj = nin ? nw_d : NULL;
    for (int j = 0; j < 3; j++) ref_gemv(wf[j], xr, c->bias ? bias[j] : NULL, rows[j], cols, MAX_N, rd[j]);
    float *inv = tb_xmalloc((size_t)(rdim / 2 + 1) * sizeof(float));
    for (int j = 0; j < rdim / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / rdim);
    int32_t pos[MAX_N];
    int64_t slot[MAX_N];
    int64_t *perm = tb_xmalloc(n_slots * sizeof(int64_t));
    for (size_t i = 0; i < n_slots; i++) perm[i] = (int64_t)i;
    for (size_t i = n_slots - 1; i > 0; i--) {
        const size_t j = tb_rand_u64() % (i + 1);
        const int64_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int b = 0; b < MAX_N; b++) {
        slot[b] = b == 2 ? -1 : perm[b]; /* token 2: padding */
        pos[b] = b == 0 ? 0 : b == 1 ? 5 : (int32_t)(tb_rand_u64() % 140000);
    }
    uint16_t *x_d = tb_upload(xh, nx * 2);
    float *inv_d = tb_upload(inv, (size_t)(rdim / 2 + 1) * sizeof(float));
    int32_t *pos_d = tb_upload(pos, sizeof pos);
    int64_t *slot_d = tb_upload(slot, sizeof slot);
    uint16_t *o_d[3], *o2_d[3], *oh[3], *o2h[3];
    for (int j = 0; j < 3; j++) {
        o_d[j] = tb_dev((size_t)MAX_N * (size_t)rows[j] * 2);
        o2_d[j] = tb_dev((size_t)MAX_N * (size_t)rows[j] * 2);
        oh[j] = tb_xmalloc((size_t)MAX_N * (size_t)rows[j] * 2);
        o2h[j] = tb_xmalloc((size_t)MAX_N * (size_t)rows[j] * 2);
    }
    uint16_t *kc_d = tb_dev(ncache * 2), *vc_d = tb_dev(ncache * 2), *kc2_d = tb_dev(ncache * 2),
             *vc2_d = tb_dev(ncache * 2);
    uint16_t *kc = tb_xmalloc(ncache * 2), *vc = tb_xmalloc(ncache * 2), *kc2 = tb_xmalloc(ncache * 2),
             *vc2 = tb_xmalloc(ncache * 2);
    const size_t nq = (size_t)MAX_N * (size_t)rq;
    float *got = tb_xmalloc(nq * sizeof(float)), *want = tb_xmalloc(nq * sizeof(float));
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double worst_q = 0.0, worst_k = 0.0, worst_v = 0.0;
    size_t bad = 0; /* exact mismatches: poison kept, bit-identity with the unfused pair */
    size_t bad8 = 0; /* fp8 cache bytes that are not the e4m3 rounding of the bf16 cache's */
    int ulps = 0;
    char name[128];
    for (int n = 1; n <= MAX_N; n++) {
        for (int mode = 0; mode < 3; mode++) {
            const bool kv_out = mode == 0;
            for (int j = 0; j < 3; j++) tb_poison(o_d[j], (size_t)MAX_N * (size_t)rows[j] * 2);
            tb_poison(kc_d, ncache * 2);
            tb_poison(vc_d, ncache * 2);
            TB_CHECK(cudaDeviceSynchronize());
            rope_run r = {{{w_d[0], rq, c->bias ? b_d[0] : NULL, o_d[0], 0, 0, nwj, eps, NULL},
                           {w_d[1], rk, c->bias ? b_d[1] : NULL, kv_out ? o_d[1] : NULL, 0, 0, nwj, eps, NULL},
                           {w_d[2], rk, c->bias ? b_d[2] : NULL, kv_out ? o_d[2] : NULL, 0, 0, nwj, eps, NULL}},
                          t, cols, x_d, n,
                          {n, H, KV, hd, rdim, bs, false, inv_d, pos_d, slot_d, NULL, NULL, NULL, kc_d, vc_d, false, NULL, 0, NULL, NULL},
                          ncache * 2, mode == 2};
            if (mode == 2)
                graph_replay(rope_launch, &r, s, 3);
            else
                for (int i = 0; i < (mode ? 3 : 1); i++) rope_launch(&r, s);
            TB_CHECK(cudaStreamSynchronize(s));
            TB_CHECK(cudaGetLastError());
            for (int j = 0; j < 3; j++) tb_download(oh[j], o_d[j], (size_t)n * (size_t)rows[j] * 2);
            tb_download(kc, kc_d, ncache * 2);
            tb_download(vc, vc_d, ncache * 2);
            /* q: rotated bf16(reference); caches slot by slot, k rotated, v plain, unmapped slots poisoned */
            double e3[3];
            bad += rope_errs(n, H, KV, hd, rdim, (size_t)rq, (size_t)rk, (size_t)bs, n_slots, slot, pos, inv, rd, oh[0],
                             kc, vc, got, want, e3);
            if (!(e3[0] <= worst_q)) worst_q = e3[0];
            if (!(e3[1] <= worst_k)) worst_k = e3[1];
            if (!(e3[2] <= worst_v)) worst_v = e3[2];
            if (mode) {
                /* k and v outputs were not asked for: still poisoned */
                for (int j = 1; j < 3; j++)
                    for (size_t i = 0; i < (size_t)n * (size_t)rk; i++) bad += oh[j][i] != 0xFFFF;
                continue;
            }
            /* the unfused pair */
            for (int j = 0; j < 3; j++) tb_poison(o2_d[j], (size_t)MAX_N * (size_t)rows[j] * 2);
            tb_poison(kc2_d, ncache * 2);
            tb_poison(vc2_d, ncache * 2);
            TB_CHECK(cudaDeviceSynchronize());
            tm_cuda_gemv_job gj[3];
            for (int j = 0; j < 3; j++)
                gj[j] = (tm_cuda_gemv_job){w_d[j], rows[j], c->bias ? b_d[j] : NULL, o2_d[j], 0, 0, nwj, eps, NULL};
            TB_CHECK(tm_cuda_gemv_group(gj, 3, t, cols, x_d, n, false, s));
            tm_cuda_rope_args ra = {n, H, KV, hd, rdim, bs, false, inv_d, pos_d, slot_d, o2_d[0], o2_d[1], o2_d[2],
                                    kc2_d, vc2_d, false, NULL, 0, NULL, NULL};
            TB_CHECK(tm_cuda_rope_kv_write(&ra, s));
            TB_CHECK(cudaStreamSynchronize(s));
            for (int j = 0; j < 3; j++) tb_download(o2h[j], o2_d[j], (size_t)n * (size_t)rows[j] * 2);
            tb_download(kc2, kc2_d, ncache * 2);
            tb_download(vc2, vc2_d, ncache * 2);
            bad += memcmp(vc, vc2, ncache * 2) != 0;
            bad += memcmp(oh[1], o2h[1], (size_t)n * (size_t)rk * 2) != 0; /* unrotated k: the GEMV's */
            bad += memcmp(oh[2], o2h[2], (size_t)n * (size_t)rk * 2) != 0;
            int u = max_ulps(oh[0], o2h[0], (size_t)n * (size_t)rq);
            if (u > ulps) ulps = u;
            u = max_ulps(kc, kc2, ncache);
            if (u > ulps) ulps = u;
            if (mode == 0) { /* fp8 e4m3 caches: the e4m3 rounding of the bf16 caches, byte for byte */
                rope_run r8 = r;
                r8.rope.kv_fp8 = true;
                r8.rope.k_cache = kc2_d; /* reused as byte caches */
                r8.rope.v_cache = vc2_d;
                tb_poison(kc2_d, ncache);
                tb_poison(vc2_d, ncache);
                rope_launch(&r8, s);
                TB_CHECK(cudaStreamSynchronize(s));
                uint8_t *k8 = (uint8_t *)kc2, *v8 = (uint8_t *)vc2;
                tb_download(k8, kc2_d, ncache);
                tb_download(v8, vc2_d, ncache);
                for (size_t i = 0; i < ncache; i++) {
                    const uint8_t ek = kc[i] == 0xFFFF ? 0xFF : tm_fp8_from_f32(tb_bf16_to_f32(kc[i]));
                    const uint8_t ev = vc[i] == 0xFFFF ? 0xFF : tm_fp8_from_f32(tb_bf16_to_f32(vc[i]));
                    bad8 += (k8[i] != ek) + (v8[i] != ev);
                }
            }
        }
    }
    const char *tag = nin ? " norm-in" : "";
    snprintf(name, sizeof name, "%s %s%s n1-8 fp8 k/v-cache", type_name(t), c->name, tag);
    if (bad8) printf("# %s %s: %zu fp8 cache bytes differ from the e4m3 rounding of the bf16 cache\n", type_name(t),
                     c->name, bad8);
    tb_result("gemv_qkv_rope", name, bad8 ? 1.0 : 0.0, 0, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s %s%s n1-8 q", type_name(t), c->name, tag);
    tb_result("gemv_qkv_rope", name, worst_q, 1e-2, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s %s%s n1-8 k-cache", type_name(t), c->name, tag);
    tb_result("gemv_qkv_rope", name, worst_k, 1e-2, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s %s%s n1-8 v-cache", type_name(t), c->name, tag);
    tb_result("gemv_qkv_rope", name, worst_v, 1e-2, 0, 0, 0, 'm');
    if (bad || ulps > 1)
        printf("# %s %s: %zu exact mismatches (poison, v/k/v-out vs unfused), q/k %d bf16 steps from unfused\n",
               type_name(t), c->name, bad, ulps);
    snprintf(name, sizeof name, "%s %s%s exact+reps+graph", type_name(t), c->name, tag);
    tb_result("gemv_qkv_rope", name, (double)bad + (ulps > 1 ? (double)ulps : 0.0), 0, 0, 0, 0, 'm');
    TB_CHECK(cudaStreamDestroy(s));
    for (int j = 0; j < 3; j++) {
        TB_CHECK(cudaFree(w_d[j]));
        TB_CHECK(cudaFree(b_d[j]));
        TB_CHECK(cudaFree(o_d[j]));
        TB_CHECK(cudaFree(o2_d[j]));
        free(w[j]);
        free(wf[j]);
        free(bias[j]);
        free(rd[j]);
        free(oh[j]);
        free(o2h[j]);
    }
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(nw_d));
    TB_CHECK(cudaFree(inv_d));
    TB_CHECK(cudaFree(pos_d));
    TB_CHECK(cudaFree(slot_d));
    TB_CHECK(cudaFree(kc_d));
    TB_CHECK(cudaFree(vc_d));
    TB_CHECK(cudaFree(kc2_d));
    TB_CHECK(cudaFree(vc2_d));
    free(xh);
    free(xf);
    free(nw);
    free(xr);
    free(inv);
    free(perm);
    free(kc);
    free(vc);
    free(kc2);
    free(vc2);
    free(got);
    free(want);
}

/* launcher refusals: shapes the fusions do not take come back as cudaErrorNotSupported with nothing launched */
static int fused_refusals(void) {
    uint16_t *x = tb_dev(4096 * 2);
    void *w = tb_dev(1 << 20), *o = tb_dev(1 << 16), *sc = tb_dev(TM_CUDA_GEMV_NORM_SCRATCH_BYTES);
    float *res = tb_dev(1 << 16), *nw = tb_dev(1 << 16);
    TB_CHECK(cudaMemset(sc, 0, TM_CUDA_GEMV_NORM_SCRATCH_BYTES));
    int bad = 0;
    bad += tm_cuda_gemv_add_rmsnorm(w, TM_DT_BF16, 12, 64, x, 1, NULL, NULL, res, nw, 1e-5f, o, sc, NULL, 0) !=
           cudaErrorNotSupported; /* rows % 8 */
    bad += tm_cuda_gemv_add_rmsnorm(w, TM_DT_BF16, 16, 64, x, 1, NULL, NULL, res + 1, nw, 1e-5f, o, sc, NULL, 0) !=
           cudaErrorNotSupported; /* residual alignment */
    bad += tm_cuda_gemv_add_rmsnorm(w, TM_DT_BF16, 16, 64, x, 0, NULL, NULL, res, nw, 1e-5f, o, sc, NULL, 0) !=
           cudaErrorInvalidValue;
    bad += tm_cuda_gemv_add_rmsnorm(w, TM_DT_BF16, 16, 64, x, 1, NULL, NULL, res, nw, 1e-5f, o, NULL, NULL, 0) !=
           cudaErrorInvalidValue;
    setenv("TM_CUDA_GEMV_V", "1", 1);
    bad += tm_cuda_gemv_add_rmsnorm(w, TM_DT_BF16, 16, 64, x, 1, NULL, NULL, res, nw, 1e-5f, o, sc, NULL, 0) !=
           cudaErrorNotSupported;
    unsetenv("TM_CUDA_GEMV_V");
    int32_t *pos = tb_dev(64);
    int64_t *sl = tb_dev(64);
    TB_CHECK(cudaMemset(pos, 0, 64));
    TB_CHECK(cudaMemset(sl, 0xFF, 64)); /* slot -1: the valid call writes no cache entry */
    tm_cuda_gemv_job jobs[3] = {{w, 4 * 64, NULL, o, 0, 0, NULL, 0, NULL}, {w, 2 * 64, NULL, NULL, 0, 0, NULL, 0, NULL},
                                {w, 2 * 64, NULL, NULL, 0, 0, NULL, 0, NULL}};
    tm_cuda_rope_args ra = {1, 4, 2, 64, 64, 16, false, nw, pos, sl, NULL, NULL, NULL, (uint16_t *)res,
                            (uint16_t *)res, false, NULL, 0, NULL, NULL};
    bad += tm_cuda_gemv_qkv_rope(jobs, TM_DT_BF16, 64, x, 1, &ra, 0) != cudaSuccess;
    ra.neox = true;
    bad += tm_cuda_gemv_qkv_rope(jobs, TM_DT_BF16, 64, x, 1, &ra, 0) != cudaErrorNotSupported;
    ra.neox = false;
    jobs[1].rows = 64;
    bad += tm_cuda_gemv_qkv_rope(jobs, TM_DT_BF16, 64, x, 1, &ra, 0) != cudaErrorNotSupported; /* rows != geometry */
    jobs[1].rows = 128;
    ra.n_tokens = 2;
    bad += tm_cuda_gemv_qkv_rope(jobs, TM_DT_BF16, 64, x, 1, &ra, 0) != cudaErrorInvalidValue;
    ra.n_tokens = 1;
    ra.head_dim = 63; /* odd head_dim (rows made to match) */
    ra.rope_dim = 62;
    jobs[0].rows = 4 * 63;
    jobs[1].rows = jobs[2].rows = 2 * 63;
    bad += tm_cuda_gemv_qkv_rope(jobs, TM_DT_BF16, 64, x, 1, &ra, 0) != cudaErrorNotSupported;
    TB_CHECK(cudaDeviceSynchronize());
    TB_CHECK(cudaGetLastError());
    TB_CHECK(cudaFree(x));
    TB_CHECK(cudaFree(w));
    TB_CHECK(cudaFree(o));
    TB_CHECK(cudaFree(sc));
    TB_CHECK(cudaFree(res));
    TB_CHECK(cudaFree(nw));
    TB_CHECK(cudaFree(pos));
    TB_CHECK(cudaFree(sl));
    return bad;
}

static void check_fused(void) {
    const int32_t types[] = {TM_DT_BF16, TM_DT_Q4_1, TM_DT_Q8_0};
    for (int i = 0; i < 3; i++) {
        const int32_t t = types[i];
        check_fused_norm(t, 576, 576, false, "smol-o");
        check_fused_norm(t, 576, 1536, true, "smol-down");
        check_fused_norm(t, 2048, 2048, false, "1b-o");
        check_fused_norm(t, 2048, 8192, false, "1b-down");
        check_fused_norm(t, 8, 64, true, "tiny");  /* one chunk of 8, 4 blocks */
        check_fused_norm(t, 1000, 256, false, "odd"); /* 125 chunks */
        if (t != TM_DT_Q4_1) check_fused_norm(t, 4096, 4096, false, "8b-o");
        const qkv_shape sh[] = {{"smol 9/3x64", 9, 3, 64, 64, 576, false},
                                {"1b 32/8x64", 32, 8, 64, 64, 2048, false},
                                {"partial 4/2x64 rot32 +b", 4, 2, 64, 32, 256, true},
                                {"odd 3/1x10 rot6 +b", 3, 1, 10, 6, 128, true},
                                {"8b 32/8x128", 32, 8, 128, 128, 4096, false}};
        for (int k = 0; k < 5; k++)
            if (k < 4 || t != TM_DT_Q4_1) check_fused_rope(t, &sh[k], false);
    }
}

/* ---- argument checks ------------------------------------------------------------------------------------------- */

static void check_args(void) {
    tb_case("gemv argument checks");
    uint16_t *x = tb_dev(64 * 2);
    void *w = tb_dev(4096), *o = tb_dev(4096);
    int bad = 0;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 4, 8, x, 0, NULL, o, true, NULL, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 4, 8, x, MAX_N + 1, NULL, o, true, NULL, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_Q4_0, 4, 48, x, 1, NULL, o, true, NULL, 0) != cudaErrorInvalidValue; /* cols % 32 */
    bad += tm_cuda_gemv(w, TM_DT_Q5_0, 4, 32, x, 1, NULL, o, true, NULL, 0) != cudaErrorInvalidValue; /* unsupported */
    bad += tm_cuda_gemv(w, TM_DT_BF16, -1, 8, x, 1, NULL, o, true, NULL, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv_swiglu(w, NULL, TM_DT_BF16, 4, 8, x, 1, o, NULL, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 0, 8, x, 1, NULL, o, true, NULL, 0) != cudaSuccess; /* nothing to do */
    tm_cuda_gemv_job jobs[MAX_JOBS + 1];
    for (int j = 0; j <= MAX_JOBS; j++) jobs[j] = (tm_cuda_gemv_job){w, 2, NULL, o, 0, 0, NULL, 0, NULL};
    bad += tm_cuda_gemv_group(jobs, 0, TM_DT_BF16, 8, x, 1, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv_group(jobs, MAX_JOBS + 1, TM_DT_BF16, 8, x, 1, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv_group(NULL, 1, TM_DT_BF16, 8, x, 1, true, 0) != cudaErrorInvalidValue;
    jobs[1].w = NULL;
    bad += tm_cuda_gemv_group(jobs, 3, TM_DT_BF16, 8, x, 1, true, 0) != cudaErrorInvalidValue;
    jobs[1].w = w;
    jobs[2].rows = -3;
    bad += tm_cuda_gemv_group(jobs, 3, TM_DT_BF16, 8, x, 1, true, 0) != cudaErrorInvalidValue;
    jobs[0].rows = jobs[1].rows = jobs[2].rows = 0;
    bad += tm_cuda_gemv_group(jobs, 3, TM_DT_BF16, 8, x, 1, true, 0) != cudaSuccess; /* nothing to do */
    bad += tm_cuda_weight_type_supported(TM_DT_Q5_K) || !tm_cuda_weight_type_supported(TM_DT_Q6_K);
    bad += fused_refusals();
    TB_CHECK(cudaDeviceSynchronize());
    TB_CHECK(cudaGetLastError());
    tb_result("gemv", "argument checks", bad, 0, 0, 0, 0, 'm');
    TB_CHECK(cudaFree(x));
    TB_CHECK(cudaFree(w));
    TB_CHECK(cudaFree(o));
}

/* ---- timing ---------------------------------------------------------------------------------------------------- */

/* what one timed call launches; the last four: the fused epilogues and their unfused pairs */
enum { K_GEMV, K_SWIGLU, K_GROUP, K_SEPARATE, K_NORM_FUSED, K_NORM_PAIR, K_ROPE_FUSED, K_ROPE_PAIR };

typedef struct targ {
    int kind;
    int32_t t;
    int64_t rows[3], cols;    /* K_GROUP / K_SEPARATE: three jobs; else rows[0] */
    int n;
    bool out_f32;
    uint8_t *w;               /* (copies, per) weights: the matrix (or gate, up; or the 3 jobs) back to back */
    size_t per;               /* bytes of one copy */
    int copies, next;
    uint16_t *x;              /* (n, cols) */
    void *out;                /* (n, sum rows) */
    cudaStream_t stream;
    /* K_NORM_*: residual (n, rows[0]) f32, norm weight (rows[0]), norm output (n, rows[0]) bf16, scratch */
    float *res, *nw;
    uint16_t *nout;
    void *scratch;
    /* K_ROPE_*: geometry, positions, slots and caches (q, k, v: set per call) */
    tm_cuda_rope_args rope;
} targ;

static void run_timed(void *p) {
    targ *a = p;
    const uint8_t *w = a->w + (size_t)a->next * a->per;
    a->next = (a->next + 1) % a->copies;
    const size_t rb = row_bytes_of(a->t, a->cols);
    switch (a->kind) {
    case K_SWIGLU:
        TB_CHECK(tm_cuda_gemv_swiglu(w, w + rb * (size_t)a->rows[0], a->t, a->rows[0], a->cols, a->x, a->n, a->out, NULL,
                                     a->stream));
        break;
    case K_NORM_FUSED:
        TB_CHECK(tm_cuda_gemv_add_rmsnorm(w, a->t, a->rows[0], a->cols, a->x, a->n, NULL, NULL, a->res, a->nw, 1e-5f,
                                          a->nout, a->scratch, NULL, a->stream));
        break;
    case K_NORM_PAIR:
        TB_CHECK(tm_cuda_gemv(w, a->t, a->rows[0], a->cols, a->x, a->n, NULL, a->out, false, NULL, a->stream));
        TB_CHECK(tm_cuda_add_rmsnorm(a->res, a->out, a->nw, 1e-5f, a->n, (int32_t)a->rows[0], a->nout, a->stream));
        break;
    case K_ROPE_FUSED:
    case K_ROPE_PAIR: {
        tm_cuda_gemv_job jobs[3];
        size_t wo = 0, oo = 0;
        for (int j = 0; j < 3; j++) {
            jobs[j] = (tm_cuda_gemv_job){w + wo, a->rows[j], NULL, (uint8_t *)a->out + oo, 0, 0, NULL, 0, NULL};
            wo += rb * (size_t)a->rows[j];
            oo += (size_t)a->n * (size_t)a->rows[j] * 2;
        }
        tm_cuda_rope_args r = a->rope;
        if (a->kind == K_ROPE_FUSED) {
            jobs[1].out = jobs[2].out = NULL; /* as the backend runs it: k and v only to the cache */
            TB_CHECK(tm_cuda_gemv_qkv_rope(jobs, a->t, a->cols, a->x, a->n, &r, a->stream));
        } else {
            TB_CHECK(tm_cuda_gemv_group(jobs, 3, a->t, a->cols, a->x, a->n, false, a->stream));
            r.q = jobs[0].out;
            r.k = jobs[1].out;
            r.v = jobs[2].out;
            TB_CHECK(tm_cuda_rope_kv_write(&r, a->stream));
        }
        break;
    }
    case K_GROUP:
    case K_SEPARATE: {
        tm_cuda_gemv_job jobs[3];
        size_t wo = 0, oo = 0;
        for (int j = 0; j < 3; j++) {
            jobs[j] = (tm_cuda_gemv_job){w + wo, a->rows[j], NULL, (uint8_t *)a->out + oo, 0, 0, NULL, 0, NULL};
            wo += rb * (size_t)a->rows[j];
            oo += (size_t)a->n * (size_t)a->rows[j] * (a->out_f32 ? 4 : 2);
        }
        if (a->kind == K_GROUP)
            TB_CHECK(tm_cuda_gemv_group(jobs, 3, a->t, a->cols, a->x, a->n, a->out_f32, a->stream));
        else
            for (int j = 0; j < 3; j++)
                TB_CHECK(tm_cuda_gemv(jobs[j].w, a->t, jobs[j].rows, a->cols, a->x, a->n, NULL, jobs[j].out,
                                      a->out_f32, NULL, a->stream));
        break;
    }
    default:
        TB_CHECK(tm_cuda_gemv(w, a->t, a->rows[0], a->cols, a->x, a->n, NULL, a->out, a->out_f32, NULL, a->stream));
        break;
    }
}

/* microseconds of one replay of an instantiated graph on s (median of 9 after 2 warm-ups) */
static double exec_replay_us(cudaGraphExec_t ge, cudaStream_t s) {
    cudaEvent_t e0, e1;
    TB_CHECK(cudaEventCreate(&e0));
    TB_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 2; i++) TB_CHECK(cudaGraphLaunch(ge, s));
    TB_CHECK(cudaStreamSynchronize(s));
    enum { REPS = 9 };
    float ms[REPS];
    for (int i = 0; i < REPS; i++) {
        TB_CHECK(cudaEventRecord(e0, s));
        TB_CHECK(cudaGraphLaunch(ge, s));
        TB_CHECK(cudaEventRecord(e1, s));
        TB_CHECK(cudaEventSynchronize(e1));
        TB_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, REPS, sizeof(float), tb_cmp_f);
    TB_CHECK(cudaEventDestroy(e0));
    TB_CHECK(cudaEventDestroy(e1));
    return (double)ms[REPS / 2] * 1000.0;
}

/* microseconds of one replay of graph g on s (median of 9 after 2 warm-ups); g and its instance are destroyed */
static double graph_replay_us(cudaGraph_t g, cudaStream_t s) {
    cudaGraphExec_t ge;
    TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
    const double us = exec_replay_us(ge, s);
    TB_CHECK(cudaGraphExecDestroy(ge));
    TB_CHECK(cudaGraphDestroy(g));
    return us;
}

/* per-call microseconds of `calls` back-to-back calls captured in one CUDA graph (median of replays) */
#define GRAPH_CALLS 20
static double time_graph_us(targ *a, bool pdl) {
    set_pdl(pdl);
    cudaGraph_t g;
    TB_CHECK(cudaStreamBeginCapture(a->stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < GRAPH_CALLS; i++) run_timed(a);
    TB_CHECK(cudaStreamEndCapture(a->stream, &g));
    set_pdl(false);
    return graph_replay_us(g, a->stream) / GRAPH_CALLS;
}

/* ---- norm-in: the product norms its raw input as it reads it ------------------------------------------------- */

/* A group of one job (bf16 and f32 output: the output projection's) and a SwiGLU pair with norm-in against the double
 * reference on the normed input (x rounded to bf16 is the raw residual; xn = x * norm_w / rms(x)), at n = 1..8 (row b of an n-row call equals the 8-row call's);
 * the o/down epilogue's raw mode (gemv_add_rmsnorm with norm_w NULL): the same residual as the norming mode, bit for
 * bit, and norm_out = that residual rounded to bf16; a type that cannot norm (q4_K) answers NotSupported. */
static void check_nin(int32_t t, int64_t rows, int64_t cols) {
    if (!tb_budget_ok()) return;
    char tag[96];
    snprintf(tag, sizeof tag, "%s %lldx%lld", type_name(t), (long long)rows, (long long)cols);
    tb_case("gemv norm-in %s", tag);
    const float eps = 1e-5f;
    uint16_t *xh = tb_xmalloc((size_t)MAX_N * cols * 2);          /* (8, cols) raw residual, bf16 */
    float *xf = tb_xmalloc((size_t)MAX_N * cols * sizeof(float)); /* (8, cols) its values */
    float *xn = tb_xmalloc((size_t)MAX_N * cols * sizeof(float)); /* (8, cols) normed */
    float *nw = tb_xmalloc((size_t)cols * sizeof(float));         /* (cols) */
    tb_fill_bf16(xh, xf, (size_t)MAX_N * cols, 3.0f);
    tb_fill_f32(nw, (size_t)cols, 0.5f);
    for (int64_t j = 0; j < cols; j++) nw[j] += 1.0f;
    ref_rmsnorm(xf, nw, (double)eps, MAX_N, cols, xn);
    uint8_t *wg = make_weights(t, rows, cols, false), *wu = make_weights(t, rows, cols, false);
    float *wgf = dequant_all(t, wg, rows, cols), *wuf = dequant_all(t, wu, rows, cols);
    double *rg = tb_xmalloc((size_t)MAX_N * rows * sizeof(double));  /* (8, rows) gate reference */
    double *ru = tb_xmalloc((size_t)MAX_N * rows * sizeof(double));  /* (8, rows) up reference */
    ref_gemv(wgf, xn, NULL, rows, cols, MAX_N, rg);
    ref_gemv(wuf, xn, NULL, rows, cols, MAX_N, ru);
    const size_t rb = row_bytes_of(t, cols);
    void *wg_d = tb_upload(wg, rb * (size_t)rows), *wu_d = tb_upload(wu, rb * (size_t)rows);
    uint16_t *x_d = tb_upload(xh, (size_t)MAX_N * cols * 2);
    float *nw_d = tb_upload(nw, (size_t)cols * sizeof(float));
    uint16_t *o_d = tb_dev((size_t)MAX_N * rows * 4); /* room for an f32 output */
    uint16_t *o8 = tb_xmalloc((size_t)MAX_N * rows * 4), *on = tb_xmalloc((size_t)MAX_N * rows * 4);
    float *got = tb_xmalloc((size_t)MAX_N * rows * sizeof(float));  /* (8, rows) */
    float *want = tb_xmalloc((size_t)MAX_N * rows * sizeof(float)); /* (8, rows) */
    char name[160];
    for (int way = 0; way < 3; way++) { /* the group with a bf16 output, the SwiGLU pair, the group with f32 */
        const bool sw = way == 1, f32 = way == 2;
        const size_t esz = f32 ? 4 : 2;
        const char *what = sw ? "swiglu" : f32 ? "group f32" : "group";
        double worst = 0.0;
        int not_inv = 0;
        for (int n = MAX_N; n >= 1; n--) {
            tb_poison(o_d, (size_t)MAX_N * rows * 4);
            if (sw) {
                TB_RUN(tm_cuda_gemv_swiglu_nin(wg_d, wu_d, t, rows, cols, x_d, n, o_d, nw_d, eps, 0));
            } else {
                const tm_cuda_gemv_job job = {wg_d, rows, NULL, o_d, 0, 0, nw_d, eps, NULL};
                TB_RUN(tm_cuda_gemv_group(&job, 1, t, cols, x_d, n, f32, 0));
            }
            tb_download(on, o_d, (size_t)n * rows * esz);
            for (int64_t i = 0; i < n * rows; i++) {
                got[i] = f32 ? ((const float *)on)[i] : tb_bf16_to_f32(on[i]);
                const double g = rg[i], u = ru[i];
                want[i] = (float)(sw ? g / (1.0 + exp(-g)) * u : g);
            }
            const double e = tb_rel_err(got, want, (size_t)(n * rows));
            if (!isnan(worst) && (isnan(e) || e > worst)) worst = e;
            if (n == MAX_N)
                memcpy(o8, on, (size_t)MAX_N * rows * esz);
            else
                not_inv += memcmp(o8, on, (size_t)n * rows * esz) != 0;
        }
        snprintf(name, sizeof name, "%s %s n1-8", what, tag);
        tb_result("gemv_nin", name, worst, 1e-2, 0, 0, 0, 'm');
        snprintf(name, sizeof name, "%s %s: %d n differ from n=8", what, tag, not_inv);
        tb_result("gemv_nin", name, not_inv ? 1.0 : 0.0, 0.0, 0, 0, 0, 'm');
    }
    /* the raw epilogue: rows = cols here (o-like), residual as the norming mode leaves it, norm_out its bf16 */
    if (rows == cols && rows % 8 == 0) {
        float *res = tb_xmalloc((size_t)MAX_N * rows * sizeof(float));
        tb_fill_f32(res, (size_t)MAX_N * rows, 2.0f);
        float *res_a = tb_upload(res, (size_t)MAX_N * rows * 4), *res_b = tb_upload(res, (size_t)MAX_N * rows * 4);
        uint16_t *no_a = tb_dev((size_t)MAX_N * rows * 2), *no_b = tb_dev((size_t)MAX_N * rows * 2);
        void *sc = tb_dev(TM_CUDA_GEMV_NORM_SCRATCH_BYTES);
        TB_CHECK(cudaMemset(sc, 0, TM_CUDA_GEMV_NORM_SCRATCH_BYTES));
        tb_poison(no_b, (size_t)MAX_N * rows * 2);
        TB_RUN(tm_cuda_gemv_add_rmsnorm(wg_d, t, rows, cols, x_d, MAX_N, NULL, NULL, res_a, nw_d, eps, no_a, sc, NULL,
                                        0));
        TB_RUN(tm_cuda_gemv_add_rmsnorm(wg_d, t, rows, cols, x_d, MAX_N, NULL, NULL, res_b, NULL, eps, no_b, NULL, NULL,
                                        0));
        float *ra = tb_xmalloc((size_t)MAX_N * rows * 4), *rbh = tb_xmalloc((size_t)MAX_N * rows * 4);
        tb_download(ra, res_a, (size_t)MAX_N * rows * 4);
        tb_download(rbh, res_b, (size_t)MAX_N * rows * 4);
        tb_download(on, no_b, (size_t)MAX_N * rows * 2);
        int bad = memcmp(ra, rbh, (size_t)MAX_N * rows * 4) != 0;
        for (int64_t i = 0; i < MAX_N * rows; i++) bad += on[i] != tb_f32_to_bf16(rbh[i]);
        snprintf(name, sizeof name, "raw epilogue %s: %d differ", tag, bad);
        tb_result("gemv_nin", name, bad ? 1.0 : 0.0, 0.0, 0, 0, 0, 'm');
        free(res);
        free(ra);
        free(rbh);
        void *bufs[] = {res_a, res_b, no_a, no_b, sc};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) TB_CHECK(cudaFree(bufs[i]));
    }
    if (t == TM_DT_BF16) { /* a type that cannot norm its input says so, having launched nothing */
        uint8_t *wq = make_weights(TM_DT_Q4_K, 256, 256, false);
        void *wq_d = tb_upload(wq, row_bytes_of(TM_DT_Q4_K, 256) * 256);
        const tm_cuda_gemv_job job = {wq_d, 256, NULL, o_d, 0, 0, nw_d, eps, NULL};
        const cudaError_t e = tm_cuda_gemv_group(&job, 1, TM_DT_Q4_K, 256, x_d, 1, false, 0);
        snprintf(name, sizeof name, "q4_K norm-in refused (%s)", cudaGetErrorName(e));
        tb_result("gemv_nin", name, e == cudaErrorNotSupported ? 0.0 : 1.0, 0.0, 0, 0, 0, 'm');
        free(wq);
        TB_CHECK(cudaFree(wq_d));
    }
    free(xh);
    free(xf);
    free(xn);
    free(nw);
    free(wg);
    free(wu);
    free(wgf);
    free(wuf);
    free(rg);
    free(ru);
    free(o8);
    free(on);
    free(got);
    free(want);
    void *bufs[] = {wg_d, wu_d, x_d, nw_d, o_d};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) TB_CHECK(cudaFree(bufs[i]));
}

/* every norm-in check: the plain and SwiGLU products over the dense types (odd widths too: lanes with fewer units,
 * the tail steps), then through the q|k|v + RoPE epilogue, the backend's default consumer (with and without bias) */
static void check_nin_all(void) {
    const int32_t types[] = {TM_DT_BF16, TM_DT_F16, TM_DT_F32};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_nin(types[i], 2048, 2048);
        check_nin(types[i], 96, 4104);
    }
    const qkv_shape sh[] = {{"1b 32/8x64", 32, 8, 64, 64, 2048, false},
                            {"partial 4/2x64 rot32 +b", 4, 2, 64, 32, 256, true},
                            {"odd 3/1x10 rot6 +b", 3, 1, 10, 6, 128, true}};
    for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) check_fused_rope(TM_DT_BF16, &sh[k], true);
}

/* ---- a decode layer's GEMV chain ------------------------------------------------------------------------------- */

static void timed_result(const char *kern, const char *name, double us, double bytes, double flops, bool key);

/* One batch-1 decode layer as the backend runs it, minus attention: add+RMSNorm, QKV group, an add+RMSNorm in
 * attention's place (a small latency-bound kernel, as attention is at short contexts), o, add+RMSNorm, gate/up with
 * SwiGLU, down; `layers` layers of distinct weights (more than L2 holds), captured in one graph with the default
 * PDL and replayed. Prints microseconds per layer against the floor (the layer's weight bytes at the copy
 * ceiling): what the kernels between the weight streams and each launch's ramp cost a layer. */
static void time_layer_chain(const char *label, int64_t dim, int64_t qd, int64_t kvd, int64_t ffn, int layers) {
    if (!tb_budget_ok()) return;
    tb_case("time layer chain %s", label);
    enum { MAX_LAYERS = 64, NW = 7 };
    const int32_t t = TM_DT_BF16;
    /* q, k, v, o, gate, up, down: (rows, cols) */
    const int64_t rows[NW] = {qd, kvd, kvd, dim, ffn, ffn, dim}, cols[NW] = {dim, dim, dim, qd, dim, dim, ffn};
    uint8_t *w[MAX_LAYERS][NW];
    double layer_bytes = 0;
    for (int k = 0; k < NW; k++) layer_bytes += (double)(rows[k] * cols[k] * 2);
    if (layers > MAX_LAYERS) layers = MAX_LAYERS;
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < NW; k++) {
            w[l][k] = tb_dev((size_t)(rows[k] * cols[k] * 2));
            TB_CHECK(cudaMemset(w[l][k], 0x11, (size_t)(rows[k] * cols[k] * 2)));
        }
    const int64_t wide = ffn > qd ? ffn : qd;
    float *res = tb_dev((size_t)dim * 4), *nw = tb_dev((size_t)dim * 4);          /* (dim) */
    uint16_t *xn = tb_dev((size_t)dim * 2), *o = tb_dev((size_t)dim * 2);        /* (dim) */
    uint16_t *q = tb_dev((size_t)wide * 2), *h = tb_dev((size_t)wide * 2);       /* (qd), (ffn) */
    uint16_t *kv = tb_dev((size_t)kvd * 4);                                       /* (2, kvd) */
    TB_CHECK(cudaMemset(res, 0, (size_t)dim * 4));
    TB_CHECK(cudaMemset(nw, 0, (size_t)dim * 4));
    TB_CHECK(cudaMemset(o, 0, (size_t)dim * 2));
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TB_CHECK(cudaDeviceSynchronize());
    cudaGraph_t g;
    TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < layers; l++) {
        const tm_cuda_gemv_job qkv[3] = {
            {w[l][0], qd, NULL, q, 0, 0, NULL, 0, NULL}, {w[l][1], kvd, NULL, kv, 0, 0, NULL, 0, NULL},
            {w[l][2], kvd, NULL, kv + kvd, 0, 0, NULL, 0, NULL}};
        TB_CHECK(tm_cuda_add_rmsnorm(res, o, nw, 1e-5f, 1, (int32_t)dim, xn, s));
        TB_CHECK(tm_cuda_gemv_group(qkv, 3, t, dim, xn, 1, false, s));
        TB_CHECK(tm_cuda_add_rmsnorm(res, o, nw, 1e-5f, 1, (int32_t)dim, xn, s)); /* in attention's place */
        TB_CHECK(tm_cuda_gemv(w[l][3], t, dim, qd, q, 1, NULL, o, false, NULL, s));
        TB_CHECK(tm_cuda_add_rmsnorm(res, o, nw, 1e-5f, 1, (int32_t)dim, xn, s));
        TB_CHECK(tm_cuda_gemv_swiglu(w[l][4], w[l][5], t, ffn, dim, xn, 1, h, NULL, s));
        TB_CHECK(tm_cuda_gemv(w[l][6], t, dim, ffn, h, 1, NULL, o, false, NULL, s));
    }
    TB_CHECK(cudaStreamEndCapture(s, &g));
    const double us = graph_replay_us(g, s) / layers;
    const double floor_us = layer_bytes / (tb_env_d("TM_CEIL_COPY_GBS", 4300.0) * 1e3);
    char name[80];
    snprintf(name, sizeof name, "%s layer chain (floor %.1f us)", label, floor_us);
    timed_result("gemv_chain", name, us, layer_bytes, 0.0, true);
    TB_CHECK(cudaStreamDestroy(s));
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < NW; k++) TB_CHECK(cudaFree(w[l][k]));
    TB_CHECK(cudaFree(res));
    TB_CHECK(cudaFree(nw));
    TB_CHECK(cudaFree(xn));
    TB_CHECK(cudaFree(o));
    TB_CHECK(cudaFree(q));
    TB_CHECK(cudaFree(h));
    TB_CHECK(cudaFree(kv));
}

/* mode bits: 1 = single launches (event pair around each call), 2 = graph, 4 = graph with PDL; 8 = a key case,
 * repeated as a "# key" line at the end of the run (where a log's tail shows it) */
enum { M_SINGLE = 1, M_GRAPH = 2, M_PDL = 4, M_KEY = 8 };

#define MAX_KEYS 64
static char g_keys[MAX_KEYS][160];
static int g_nkeys;

/* tb_result for a timed case, remembered when `key` */
static void timed_result(const char *kern, const char *name, double us, double bytes, double flops, bool key) {
    tb_result(kern, name, 0.0, 0.0, us, bytes, flops, 'm');
    if (key && g_nkeys < MAX_KEYS) {
        const double gbs = us > 0 ? bytes / (us * 1e3) : 0.0;
        snprintf(g_keys[g_nkeys++], sizeof g_keys[0], "%-12s %-44s us=%8.2f GB/s=%7.1f pct=%5.1f", kern, name, us, gbs,
                 100.0 * gbs / tb_env_d("TM_CEIL_COPY_GBS", 4300.0));
    }
}

static void time_kind(int kind, int32_t t, const int64_t *rows, int64_t cols, int n, bool out_f32, int version,
                      int modes, const char *label) {
    if (!tb_budget_ok()) return;
    const int nj = (kind == K_GROUP || kind == K_SEPARATE) ? 3 : 1;
    targ a = {.kind = kind, .t = t, .rows = {rows[0], nj > 1 ? rows[1] : 0, nj > 1 ? rows[2] : 0}, .cols = cols,
              .n = n, .out_f32 = out_f32, .copies = 1};
    int64_t rows_tot = 0;
    for (int j = 0; j < nj; j++) rows_tot += rows[j];
    const size_t rb = row_bytes_of(t, cols);
    a.per = rb * (size_t)rows_tot * (kind == K_SWIGLU ? 2 : 1);
    const size_t want = (size_t)160 << 20;
    a.copies = a.per >= want ? 1 : (int)((want + a.per - 1) / a.per);
    char name[128];
    int len = snprintf(name, sizeof name, "%s%s %s ", version == 1 ? "v1 " : "", type_name(t), label);
    for (int j = 0; j < nj; j++)
        len += snprintf(name + len, sizeof name - (size_t)len, "%s%lld", j ? "+" : "", (long long)rows[j]);
    len += snprintf(name + len, sizeof name - (size_t)len, "x%lld n%d%s", (long long)cols, n, out_f32 ? " f32" : "");
    tb_case("time %s", name);
    a.w = tb_dev(a.per * (size_t)a.copies);
    /* timing only: every byte 0x11 is a small finite number in every type (fp16 0x1111, bf16 0x1111, f32
     * 0x11111111, nibbles 1) */
    TB_CHECK(cudaMemset(a.w, 0x11, a.per * (size_t)a.copies));
    uint16_t *xh = tb_xmalloc((size_t)n * cols * 2);
    tb_fill_bf16(xh, NULL, (size_t)n * cols, 1.0f);
    a.x = tb_upload(xh, (size_t)n * cols * 2);
    a.out = tb_dev((size_t)n * (size_t)rows_tot * 4);
    TB_CHECK(cudaStreamCreateWithFlags(&a.stream, cudaStreamNonBlocking));
    TB_CHECK(cudaDeviceSynchronize());
    set_version(version);
    const double bytes = (double)a.per + (double)n * (double)cols * 2.0 +
                         (double)n * (double)rows_tot * (out_f32 ? 4.0 : 2.0);
    const double flops = 2.0 * (double)n * (double)rows_tot * (double)cols * (kind == K_SWIGLU ? 2.0 : 1.0);
    const char *kern = kind == K_SWIGLU     ? "gemv_swiglu"
                       : kind == K_GROUP    ? "gemv_group"
                       : kind == K_SEPARATE ? "gemv_3sep"
                                            : "gemv";
    char full[160];
    if (modes & M_SINGLE) {
        /* tb_time_us records its events on the legacy stream, which waits for and is waited on by a.stream
         * (a.stream is non-blocking: use the legacy stream for this mode) */
        cudaStream_t keep = a.stream;
        a.stream = 0;
        const double us = tb_time_us(run_timed, &a, 5, 40);
        a.stream = keep;
        timed_result(kern, name, us, bytes, flops, modes & M_KEY);
    }
    if ((modes & M_GRAPH) && tb_budget_ok()) {
        snprintf(full, sizeof full, "%s graph", name);
        timed_result(kern, full, time_graph_us(&a, false), bytes, flops, modes & M_KEY);
    }
    if ((modes & M_PDL) && tb_budget_ok()) {
        snprintf(full, sizeof full, "%s graph+pdl", name);
        timed_result(kern, full, time_graph_us(&a, true), bytes, flops, modes & M_KEY);
    }
    set_version(2);
    TB_CHECK(cudaStreamDestroy(a.stream));
    TB_CHECK(cudaFree(a.w));
    TB_CHECK(cudaFree(a.x));
    TB_CHECK(cudaFree(a.out));
    free(xh);
}

static void time_case(int32_t t, int64_t rows, int64_t cols, int n, bool out_f32, bool swiglu, int version,
                      int modes, const char *label) {
    const int64_t r[1] = {rows};
    time_kind(swiglu ? K_SWIGLU : K_GEMV, t, r, cols, n, out_f32, version, modes, label);
}

/* a fused epilogue (kind K_NORM_FUSED or K_ROPE_FUSED) and its unfused pair, n = 1, single launches and in a
 * graph. norm: rows[0] x cols; rope: q, k, v rows with head_dim hd. Bytes: weights + x + (norm: residual read and
 * written, norm weight, norm output; rope: q written, k and v written to the cache) */
static void time_fused(int fused_kind, int32_t t, const int64_t *rows, int64_t cols, int hd, int n, const char *label) {
    const bool norm = fused_kind == K_NORM_FUSED;
    const int nj = norm ? 1 : 3;
    int64_t rows_tot = 0;
    for (int j = 0; j < nj; j++) rows_tot += rows[j];
    const size_t rb = row_bytes_of(t, cols), per = rb * (size_t)rows_tot, want = (size_t)160 << 20;
    const int copies = per >= want ? 1 : (int)((want + per - 1) / per);
    for (int pair = 0; pair < 2 && tb_budget_ok(); pair++) {
        targ a;
        memset(&a, 0, sizeof a);
        a.kind = norm ? (pair ? K_NORM_PAIR : K_NORM_FUSED) : (pair ? K_ROPE_PAIR : K_ROPE_FUSED);
        a.t = t;
        for (int j = 0; j < nj; j++) a.rows[j] = rows[j];
        a.cols = cols;
        a.n = n;
        a.per = per;
        a.copies = copies;
        char name[128];
        snprintf(name, sizeof name, "%s %s %s n%d", type_name(t), label, pair ? "unfused" : "fused", n);
        tb_case("time %s", name);
        a.w = tb_dev(per * (size_t)copies);
        TB_CHECK(cudaMemset(a.w, 0x11, per * (size_t)copies)); /* small finite numbers in every type */
        uint16_t *xh = tb_xmalloc((size_t)n * (size_t)cols * 2);
        tb_fill_bf16(xh, NULL, (size_t)n * (size_t)cols, 1.0f);
        a.x = tb_upload(xh, (size_t)n * (size_t)cols * 2);
        a.out = tb_dev((size_t)n * (size_t)rows_tot * 2);
        size_t cache_bytes = 0;
        int32_t *pos_d = NULL;
        int64_t *slot_d = NULL;
        float *inv_d = NULL;
        if (norm) {
            a.res = tb_dev((size_t)n * (size_t)rows[0] * 4);
            a.nw = tb_dev((size_t)rows[0] * 4);
            a.nout = tb_dev((size_t)n * (size_t)rows[0] * 2);
            a.scratch = tb_dev(TM_CUDA_GEMV_NORM_SCRATCH_BYTES);
            TB_CHECK(cudaMemset(a.res, 0, (size_t)n * (size_t)rows[0] * 4));
            TB_CHECK(cudaMemset(a.nw, 0, (size_t)rows[0] * 4));
            TB_CHECK(cudaMemset(a.scratch, 0, TM_CUDA_GEMV_NORM_SCRATCH_BYTES));
        } else {
            const int bs = 16, nblk = 64;
            int32_t pos[MAX_N];
            int64_t slot[MAX_N];
            float inv[256];
            for (int b = 0; b < MAX_N; b++) pos[b] = 1000 + 37 * b, slot[b] = 5 + 3 * b;
            for (int j = 0; j < hd / 2 && j < 256; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
            pos_d = tb_upload(pos, sizeof pos);
            slot_d = tb_upload(slot, sizeof slot);
            inv_d = tb_upload(inv, sizeof inv);
            cache_bytes = (size_t)nblk * bs * (size_t)rows[1] * 2;
            a.rope = (tm_cuda_rope_args){n, (int32_t)(rows[0] / hd), (int32_t)(rows[1] / hd), hd, hd, bs, false, inv_d,
                                         pos_d, slot_d, NULL, NULL, NULL, tb_dev(cache_bytes), tb_dev(cache_bytes),
                                         false, NULL, 0, NULL, NULL};
            TB_CHECK(cudaMemset(a.rope.k_cache, 0, cache_bytes));
            TB_CHECK(cudaMemset(a.rope.v_cache, 0, cache_bytes));
        }
        TB_CHECK(cudaStreamCreateWithFlags(&a.stream, cudaStreamNonBlocking));
        TB_CHECK(cudaDeviceSynchronize());
        const double bytes = (double)per + (double)n * (double)cols * 2.0 +
                             (norm ? (double)n * (double)rows[0] * 10.0 + (double)rows[0] * 4.0
                                   : (double)n * (double)rows_tot * 2.0);
        const double flops = 2.0 * (double)n * (double)rows_tot * (double)cols;
        const char *kern = norm ? "gemv_add_rmsnorm" : "gemv_qkv_rope";
        cudaStream_t keep = a.stream;
        a.stream = 0; /* tb_time_us records on the legacy stream */
        const double us = tb_time_us(run_timed, &a, 5, 40);
        a.stream = keep;
        timed_result(kern, name, us, bytes, flops, true);
        if (tb_budget_ok()) {
            char full[160];
            snprintf(full, sizeof full, "%s graph", name);
            timed_result(kern, full, time_graph_us(&a, false), bytes, flops, true);
        }
        TB_CHECK(cudaStreamDestroy(a.stream));
        TB_CHECK(cudaFree(a.w));
        TB_CHECK(cudaFree(a.x));
        TB_CHECK(cudaFree(a.out));
        if (norm) {
            TB_CHECK(cudaFree(a.res));
            TB_CHECK(cudaFree(a.nw));
            TB_CHECK(cudaFree(a.nout));
            TB_CHECK(cudaFree(a.scratch));
        } else {
            TB_CHECK(cudaFree(a.rope.k_cache));
            TB_CHECK(cudaFree(a.rope.v_cache));
            TB_CHECK(cudaFree(pos_d));
            TB_CHECK(cudaFree(slot_d));
            TB_CHECK(cudaFree(inv_d));
        }
        free(xh);
    }
}

typedef struct norm_chain_bufs {
    float *res;          /* (dim) f32 residual */
    const float *nw;     /* (dim) norm weight */
    uint16_t *xn, *po;   /* (dim) the norm's output (norm-in: the raw residual); the product before the add */
    void *scratch;       /* the last-block norm's counter */
    float eps;
} norm_chain_bufs;

/* o (down = false) or down followed by the next norm, as norm chain way `way` runs it: 0 the product then the norm
 * kernel, 1 the last-block norm epilogue, 2 norm-in after both, 3 norm-in after down only (the backend's default) */
static void add_norm(int way, bool down, const void *w, int64_t dim, int64_t cols, const uint16_t *x,
                     const norm_chain_bufs *c, cudaStream_t s) {
    const bool raw = way == 2 || (way == 3 && down);
    if (way == 0 || (way == 3 && !down)) {
        TB_CHECK(tm_cuda_gemv(w, TM_DT_BF16, dim, cols, x, 1, NULL, c->po, false, NULL, s));
        TB_CHECK(tm_cuda_add_rmsnorm(c->res, c->po, c->nw, c->eps, 1, (int32_t)dim, c->xn, s));
    } else {
        TB_CHECK(tm_cuda_gemv_add_rmsnorm(w, TM_DT_BF16, dim, cols, x, 1, NULL, NULL, c->res, raw ? NULL : c->nw,
                                          c->eps, c->xn, raw ? NULL : c->scratch, NULL, s));
    }
}

/* One batch-1 layer's products and norms (no attention: o reads q) as the backend runs them, three ways, `layers`
 * layers of distinct random weights in one graph each (default PDL), four ways (add_norm): the separate add+RMSNorm
 * kernels, the o / down epilogue that norms in its last block (TM_CUDA_FUSE_NORM=1), norm-in after both (the o /
 * down epilogue passes the residual on raw, q|k|v and gate/up norm it as they read it), and norm-in after down only
 * (the backend's default). From the same state, the final residuals compared; then each timed, alternating. */
static void time_norm_chain(const char *label, int64_t dim, int64_t qd, int64_t kvd, int64_t ffn, int layers) {
    if (!tb_budget_ok()) return;
    tb_case("norm chain %s", label);
    enum { MAX_LAYERS = 32, NW = 7, WAYS = 4 };
    if (layers > MAX_LAYERS) layers = MAX_LAYERS;
    const int32_t t = TM_DT_BF16;
    const float eps = 1e-5f;
    /* q, k, v, o, gate, up, down: (rows, cols) */
    const int64_t rows[NW] = {qd, kvd, kvd, dim, ffn, ffn, dim}, cols[NW] = {dim, dim, dim, qd, dim, dim, ffn};
    uint16_t *w[MAX_LAYERS][NW];
    double layer_bytes = 0;
    for (int k = 0; k < NW; k++) layer_bytes += (double)(rows[k] * cols[k] * 2);
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < NW; k++) {
            w[l][k] = tb_dev((size_t)(rows[k] * cols[k] * 2));
            TB_CHECK(tm_cuda_fill_random(w[l][k], t, (size_t)(rows[k] * cols[k]), (uint64_t)(l * 16 + k + 101),
                                         (float)(1.0 / sqrt((double)cols[k])), 0.0f, 0));
        }
    float *res = tb_dev((size_t)dim * 4), *res0 = tb_dev((size_t)dim * 4), *nw = tb_dev((size_t)dim * 4); /* (dim) */
    uint16_t *xn = tb_dev((size_t)dim * 2), *zo = tb_dev((size_t)dim * 2), *po = tb_dev((size_t)dim * 2); /* (dim) */
    uint16_t *qo = tb_dev((size_t)qd * 2), *ko = tb_dev((size_t)kvd * 2), *vo = tb_dev((size_t)kvd * 2);
    uint16_t *h = tb_dev((size_t)ffn * 2); /* (ffn) */
    void *scratch = tb_dev(TM_CUDA_GEMV_NORM_SCRATCH_BYTES);
    TB_CHECK(cudaMemset(scratch, 0, TM_CUDA_GEMV_NORM_SCRATCH_BYTES));
    TB_CHECK(tm_cuda_fill_random(res0, TM_DT_F32, (size_t)dim, 7, 1.0f, 0.0f, 0));
    TB_CHECK(tm_cuda_fill_random(nw, TM_DT_F32, (size_t)dim, 9, 0.25f, 0.0f, 0));
    TB_CHECK(cudaMemset(zo, 0, (size_t)dim * 2));
    {   /* norm weights 0.75..1.25 */
        float *hw = tb_xmalloc((size_t)dim * 4);
        tb_download(hw, nw, (size_t)dim * 4);
        for (int64_t j = 0; j < dim; j++) hw[j] += 1.0f;
        TB_CHECK(cudaMemcpy(nw, hw, (size_t)dim * 4, cudaMemcpyHostToDevice));
        free(hw);
    }
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TB_CHECK(cudaDeviceSynchronize());
    cudaGraphExec_t ge[WAYS];
    static const char *const way_name[WAYS] = {"norm kernels", "norm in last block", "norm-in", "norm-in after down"};
    const norm_chain_bufs nc = {res, nw, xn, po, scratch, eps};
    for (int way = 0; way < WAYS; way++) {
        cudaGraph_t g;
        TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < layers; l++) {
            const bool nin = way >= 2 && l > 0; /* layer 0 reads the first norm (below), made as in the other ways */
            const tm_cuda_gemv_job qkv[3] = {{w[l][0], qd, NULL, qo, 0, 0, nin ? nw : NULL, eps, NULL},
                                             {w[l][1], kvd, NULL, ko, 0, 0, nin ? nw : NULL, eps, NULL},
                                             {w[l][2], kvd, NULL, vo, 0, 0, nin ? nw : NULL, eps, NULL}};
            TB_CHECK(tm_cuda_gemv_group(qkv, 3, t, dim, xn, 1, false, s));
            add_norm(way, false, w[l][3], dim, qd, qo, &nc, s);
            if (way == 2)
                TB_CHECK(tm_cuda_gemv_swiglu_nin(w[l][4], w[l][5], t, ffn, dim, xn, 1, h, nw, eps, s));
            else
                TB_CHECK(tm_cuda_gemv_swiglu(w[l][4], w[l][5], t, ffn, dim, xn, 1, h, NULL, s));
            add_norm(way, true, w[l][6], dim, ffn, h, &nc, s);
        }
        TB_CHECK(cudaStreamEndCapture(s, &g));
        TB_CHECK(cudaGraphInstantiate(&ge[way], g, 0));
        TB_CHECK(cudaGraphDestroy(g));
    }
    /* the same state through each way: xn = the first norm */
    float *rr[WAYS];
    char name[128];
    for (int way = 0; way < WAYS; way++) {
        TB_CHECK(cudaMemcpy(res, res0, (size_t)dim * 4, cudaMemcpyDeviceToDevice));
        TB_CHECK(tm_cuda_add_rmsnorm(res, zo, nw, eps, 1, (int32_t)dim, xn, s));
        TB_CHECK(cudaGraphLaunch(ge[way], s));
        TB_CHECK(cudaStreamSynchronize(s));
        rr[way] = tb_xmalloc((size_t)dim * 4);
        tb_download(rr[way], res, (size_t)dim * 4);
        if (way) {
            snprintf(name, sizeof name, "%s %s vs norm kernels: residual", label, way_name[way]);
            tb_result("gemv_nin", name, tb_rel_err(rr[way], rr[0], (size_t)dim), 1e-2, 0, 0, 0, 'm');
        }
    }
    const double floor_us = layer_bytes / (tb_env_d("TM_CEIL_COPY_GBS", 4300.0) * 1e3);
    for (int rep = 0; rep < 2; rep++)
        for (int way = 0; way < WAYS; way++) {
            snprintf(name, sizeof name, "%s %s (floor %.1f us)", label, way_name[way], floor_us);
            timed_result("gemv_chain", name, exec_replay_us(ge[way], s) / layers, layer_bytes, 0.0, true);
        }
    for (int way = 0; way < WAYS; way++) {
        TB_CHECK(cudaGraphExecDestroy(ge[way]));
        free(rr[way]);
    }
    TB_CHECK(cudaStreamDestroy(s));
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < NW; k++) TB_CHECK(cudaFree(w[l][k]));
    void *bufs[] = {res, res0, nw, xn, zo, po, qo, ko, vo, h, scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) TB_CHECK(cudaFree(bufs[i]));
}

static void time_all(void) {
    const int all = M_SINGLE | M_GRAPH | M_PDL | M_KEY;
    /* the norms of a layer three ways (norm-in against the norm kernels) */
    time_norm_chain("1b", 2048, 2048, 512, 8192, 16);
    time_norm_chain("8b", 4096, 4096, 1024, 14336, 8);
    /* a decode layer's GEMV chain (1B: 16 layers = 1.9 GB, 8B: 8 layers = 3.5 GB of weights) */
    time_layer_chain("1b", 2048, 2048, 512, 8192, 16);
    time_layer_chain("8b", 4096, 4096, 1024, 14336, 8);
    /* the fused epilogues against their unfused pairs first (key cases), bf16 at n = 1 */
    const int64_t o1[1] = {2048}, o8[1] = {4096}, qkv1[3] = {2048, 512, 512}, qkv8[3] = {4096, 1024, 1024};
    time_fused(K_NORM_FUSED, TM_DT_BF16, o1, 2048, 0, 1, "1b-o");
    time_fused(K_NORM_FUSED, TM_DT_BF16, o1, 8192, 0, 1, "1b-down");
    time_fused(K_ROPE_FUSED, TM_DT_BF16, qkv1, 2048, 64, 1, "1b-qkv");
    time_fused(K_NORM_FUSED, TM_DT_BF16, o8, 4096, 0, 1, "8b-o");
    time_fused(K_NORM_FUSED, TM_DT_BF16, o8, 14336, 0, 1, "8b-down");
    time_fused(K_ROPE_FUSED, TM_DT_BF16, qkv8, 4096, 128, 1, "8b-qkv");
    time_fused(K_NORM_FUSED, TM_DT_BF16, o8, 4096, 0, 8, "8b-o");
    time_fused(K_ROPE_FUSED, TM_DT_BF16, qkv8, 4096, 128, 8, "8b-qkv");
    /* bf16 at n = 1: Llama-3.2-1B then Llama-3-8B; single launches, in a graph, in a graph with PDL */
    time_case(TM_DT_BF16, 2048, 2048, 1, false, false, 2, all, "1b-o");
    time_case(TM_DT_BF16, 6144, 2048, 1, false, false, 2, all, "1b-qkv");
    time_case(TM_DT_BF16, 8192, 2048, 1, false, true, 2, all, "1b-gate+up");
    time_case(TM_DT_BF16, 2048, 8192, 1, false, false, 2, all, "1b-down");
    time_case(TM_DT_BF16, 128256, 2048, 1, true, false, 2, all, "1b-lm_head");
    time_case(TM_DT_BF16, 4096, 4096, 1, false, false, 2, all, "8b-o");
    time_case(TM_DT_BF16, 6144, 4096, 1, false, false, 2, all, "8b-qkv");
    time_case(TM_DT_BF16, 14336, 4096, 1, false, false, 2, M_SINGLE | M_KEY, "8b-gate");
    time_case(TM_DT_BF16, 14336, 4096, 1, false, true, 2, all, "8b-gate+up");
    time_case(TM_DT_BF16, 4096, 14336, 1, false, false, 2, all, "8b-down");
    time_case(TM_DT_BF16, 128256, 4096, 1, true, false, 2, M_SINGLE | M_GRAPH | M_KEY, "8b-lm_head");
    /* the first version's block shape (4 warps, 2 units per lane on 2048 columns) for comparison */
    setenv("TM_CUDA_GEMV_WIDE", "1", 1);
    time_case(TM_DT_BF16, 2048, 2048, 1, false, false, 2, M_SINGLE | M_GRAPH | M_KEY, "1b-o wide");
    time_case(TM_DT_BF16, 6144, 2048, 1, false, false, 2, M_SINGLE | M_GRAPH | M_KEY, "1b-qkv wide");
    time_case(TM_DT_BF16, 8192, 2048, 1, false, true, 2, M_SINGLE | M_GRAPH | M_KEY, "1b-gate+up wide");
    time_case(TM_DT_BF16, 128256, 2048, 1, true, false, 2, M_SINGLE | M_KEY, "1b-lm_head wide");
    unsetenv("TM_CUDA_GEMV_WIDE");
    /* the QKV group against three launches */
    const int64_t q1[3] = {2048, 512, 512}, q8[3] = {4096, 1024, 1024};
    for (int n = 1; n <= 8; n *= 8) {
        const int m = n == 1 ? all : M_SINGLE | M_KEY;
        time_kind(K_GROUP, TM_DT_BF16, q1, 2048, n, false, 2, m, "1b-qkv");
        time_kind(K_SEPARATE, TM_DT_BF16, q1, 2048, n, false, 2, m, "1b-qkv");
        time_kind(K_GROUP, TM_DT_BF16, q8, 4096, n, false, 2, m, "8b-qkv");
        time_kind(K_SEPARATE, TM_DT_BF16, q8, 4096, n, false, 2, m, "8b-qkv");
    }
    time_kind(K_GROUP, TM_DT_Q4_K, q8, 4096, 1, false, 2, M_SINGLE | M_GRAPH | M_KEY, "8b-qkv");
    time_kind(K_SEPARATE, TM_DT_Q4_K, q8, 4096, 1, false, 2, M_SINGLE | M_GRAPH | M_KEY, "8b-qkv");
    for (int n = 2; n <= 8; n *= 2) {
        time_case(TM_DT_BF16, 6144, 2048, n, false, false, 2, M_SINGLE, "1b-qkv");
        time_case(TM_DT_BF16, 4096, 14336, n, false, false, 2, M_SINGLE, "8b-down");
    }
    time_case(TM_DT_BF16, 4096, 4096, 1, false, false, 1, M_SINGLE, "8b-o");
    /* other types on the 8B shapes (+ the 1B o projection for short rows) */
    const int32_t others[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K, TM_DT_F16, TM_DT_F32};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const int32_t t = others[i];
        time_case(t, 4096, 4096, 1, false, false, 2, M_SINGLE, "8b-o");
        time_case(t, 14336, 4096, 1, false, false, 2, M_SINGLE, "8b-gate");
        time_case(t, 14336, 4096, 1, false, true, 2, M_SINGLE, "8b-gate+up");
        time_case(t, 4096, 14336, 1, false, false, 2, M_SINGLE, "8b-down");
        time_case(t, 2048, 2048, 1, false, false, 2, M_SINGLE, "1b-o");
        if (t == TM_DT_Q6_K || t == TM_DT_Q8_0) time_case(t, 128256, 4096, 1, true, false, 2, M_SINGLE, "8b-lm_head");
        if (t != TM_DT_F32) {
            time_case(t, 4096, 4096, 4, false, false, 2, M_SINGLE, "8b-o");
            time_case(t, 4096, 4096, 8, false, false, 2, M_SINGLE, "8b-o");
            time_case(t, 4096, 4096, 1, false, false, 1, M_SINGLE, "8b-o");
        }
    }
    for (int i = 0; i < g_nkeys; i++) printf("# key %s\n", g_keys[i]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    (void)argv;
    tb_guard_init(25.0);
    tb_seed();
    if (getenv("TB_NIN_ONLY")) { /* norm-in: its checks and the norm chain only */
        check_nin_all();
        time_norm_chain("1b", 2048, 2048, 512, 8192, 16);
        time_norm_chain("8b", 4096, 4096, 1024, 14336, 8);
        for (int i = 0; i < g_nkeys; i++) printf("# key %s\n", g_keys[i]);
        return tb_finish("tb_gemv");
    }
    check_args();
    check_all();
    printf("# checks of single products done in %.1f s\n", tb_elapsed_s());
    check_groups();
    check_fused();
    printf("# fused checks done in %.1f s\n", tb_elapsed_s());
    check_chain(false);
    check_chain(true);
    check_nin_all();
    printf("# all checks done in %.1f s\n", tb_elapsed_s());
    fflush(stdout);
    if (argc < 2) time_all(); /* any argument: checks only */
    tb_case("finish");
    tb_guard_report("tb_gemv");
    return tb_finish("tb_gemv");
}
