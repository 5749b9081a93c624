/* tb_gemv.c -- tm_cuda_gemv / _group / _swiglu (every weight type, n = 1..8) against a double CPU reference. */
#include "backend/cpu/tm_quant.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "tb_guard.h"

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
 * Robustness (tb_guard.h): every host allocation is checked; each case prints "CASE <name>" before it starts; a
 * crash or a hang (watchdog TB_WATCHDOG_S, default 170 s) prints "# CRASH|TIMEOUT in case <name>"; the timing
 * stops once the run has used TB_BUDGET_S seconds (default 25), printing how many timing cases it skipped. */

static const int32_t k_types[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0,
                                  TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
#define MAX_N TM_CUDA_GEMV_MAX_N
#define MAX_JOBS TM_CUDA_GEMV_MAX_JOBS

/* ---- weights and the reference --------------------------------------------------------------------------------- */

static bool is_quant(int32_t t) { return t != TM_DT_F32 && t != TM_DT_F16 && t != TM_DT_BF16; }
static int qk_of(int32_t t) { return (int)tm_dtype_get((uint32_t)t)->block; }
static size_t row_bytes_of(int32_t t, int64_t cols) { return (size_t)tm_dtype_row_bytes((uint32_t)t, (uint64_t)cols); }
static const char *type_name(int32_t t) { return tm_dtype_name((uint32_t)t); }

static void put_f16(uint8_t *p, float v) {
    uint16_t h = tm_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* a cheap approximately normal number (sum of four 16-bit uniforms, mean 0, variance 1): the large group cases
 * make tens of millions of weights */
static float fast_normal(void) {
    const uint64_t r = tb_rand_u64();
    const float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* rows x cols weights of type t in GGUF layout; random_bytes: raw random blocks with valid fp16 scales */
static uint8_t *make_weights(int32_t t, int64_t rows, int64_t cols, bool random_bytes) {
    const size_t rb = row_bytes_of(t, cols);
    uint8_t *w = tb_xmalloc(rb * (size_t)rows);
    float *tmp = tb_xmalloc((size_t)cols * sizeof(float));
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
            for (int64_t j = 0; j < cols; j++) tmp[j] = scale * fast_normal();
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
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, bias_d, out_d, true, 0));
        tb_download(out_f, out_d, no * 4);
        snprintf(name, sizeof name, "%s %s f32+b", kv, tag);
        tb_result("gemv", name, tb_rel_err(out_f, ref_bias, no), 1e-4, 0, 0, 0, 'm');
        /* bf16 out, no bias */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv(wg_d, t, rows, cols, x_d, n, NULL, out_d, false, 0));
        tb_download(out_h, out_d, no * 2);
        snprintf(name, sizeof name, "%s %s bf16", kv, tag);
        tb_result("gemv", name, tb_rel_err_bf16(out_h, ref_nob, no), 1e-2, 0, 0, 0, 'm');
        /* SwiGLU */
        tb_poison(out_d, no * 4);
        TB_RUN(tm_cuda_gemv_swiglu(wg_d, wu_d, t, rows, cols, x_d, n, out_d, 0));
        tb_download(out_h, out_d, no * 2);
        snprintf(name, sizeof name, "%s %s", kv, tag);
        tb_result("gemv_swiglu", name, tb_rel_err_bf16(out_h, ref_sw, no), 1e-2, 0, 0, 0, 'm');
    }
    set_version(2);
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
    char name[192];
    for (int v = 2; v >= 1; v--) {
        set_version(v);
        for (int pass = 0; pass < 2; pass++) {
            const bool f32 = pass == 0;
            const size_t es = f32 ? 4 : 2;
            double worst = 0.0;
            int not_same = 0, not_inv = 0;
            for (int n = MAX_N; n >= 1; n--) { /* n = 8 first: the other n compare with it */
                tm_cuda_gemv_job jobs[MAX_JOBS];
                for (int j = 0; j < nj; j++) {
                    jobs[j] = (tm_cuda_gemv_job){w_d[j], rows[j], f32 && j != 1 ? bias_d[j] : NULL, out_g[j]};
                    tb_poison(out_g[j], (size_t)MAX_N * (size_t)rows[j] * 4);
                    tb_poison(out_s[j], (size_t)MAX_N * (size_t)rows[j] * 4);
                }
                TB_RUN(tm_cuda_gemv_group(jobs, nj, t, cols, x_d, n, f32, 0));
                for (int j = 0; j < nj; j++)
                    TB_RUN(tm_cuda_gemv(w_d[j], t, rows[j], cols, x_d, n, jobs[j].bias, out_s[j], f32, 0));
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
                if (n == MAX_N) {
                    memcpy(h8, hg, o * es);
                } else { /* rows b < n of every job equal the n = 8 run's */
                    size_t o8 = 0, on = 0;
                    for (int j = 0; j < nj; j++) {
                        not_inv += memcmp(h8 + o8 * es, hg + on * es, (size_t)n * (size_t)rows[j] * es) != 0;
                        o8 += (size_t)MAX_N * (size_t)rows[j];
                        on += (size_t)n * (size_t)rows[j];
                    }
                }
            }
            snprintf(name, sizeof name, "v%d %s n1-8 %s", v, tag, f32 ? "f32+b" : "bf16");
            tb_result("gemv_group", name, worst, f32 ? 1e-4 : 1e-2, 0, 0, 0, 'm');
            if (not_same || not_inv) {
                snprintf(name, sizeof name, "v%d %s %s: %d n differ from gemv, %d from n=8", v, tag,
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
    const tm_cuda_gemv_job jobs[2] = {{w1_d, f, NULL, h_d}, {w3_d, e, b3_d, g_d}};
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
            TB_CHECK(tm_cuda_gemv(w2_d, t, d, f, h_d, n, NULL, o_d, true, s));
            TB_CHECK(cudaStreamEndCapture(s, &g));
            TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
            for (int rep = 0; rep < 3; rep++) TB_CHECK(cudaGraphLaunch(ge, s));
            TB_CHECK(cudaStreamSynchronize(s));
            TB_CHECK(cudaGraphExecDestroy(ge));
            TB_CHECK(cudaGraphDestroy(g));
        } else {
            TB_CHECK(tm_cuda_gemv_group(jobs, 2, t, d, x_d, n, false, s));
            TB_CHECK(tm_cuda_gemv(w2_d, t, d, f, h_d, n, NULL, o_d, true, s));
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

/* ---- argument checks ------------------------------------------------------------------------------------------- */

static void check_args(void) {
    tb_case("gemv argument checks");
    uint16_t *x = tb_dev(64 * 2);
    void *w = tb_dev(4096), *o = tb_dev(4096);
    int bad = 0;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 4, 8, x, 0, NULL, o, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 4, 8, x, MAX_N + 1, NULL, o, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_Q4_0, 4, 48, x, 1, NULL, o, true, 0) != cudaErrorInvalidValue; /* cols % 32 */
    bad += tm_cuda_gemv(w, TM_DT_Q5_0, 4, 32, x, 1, NULL, o, true, 0) != cudaErrorInvalidValue; /* unsupported */
    bad += tm_cuda_gemv(w, TM_DT_BF16, -1, 8, x, 1, NULL, o, true, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv_swiglu(w, NULL, TM_DT_BF16, 4, 8, x, 1, o, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_gemv(w, TM_DT_BF16, 0, 8, x, 1, NULL, o, true, 0) != cudaSuccess; /* nothing to do */
    tm_cuda_gemv_job jobs[MAX_JOBS + 1];
    for (int j = 0; j <= MAX_JOBS; j++) jobs[j] = (tm_cuda_gemv_job){w, 2, NULL, o};
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
    TB_CHECK(cudaDeviceSynchronize());
    TB_CHECK(cudaGetLastError());
    tb_result("gemv", "argument checks", bad, 0, 0, 0, 0, 'm');
    TB_CHECK(cudaFree(x));
    TB_CHECK(cudaFree(w));
    TB_CHECK(cudaFree(o));
}

/* ---- timing ---------------------------------------------------------------------------------------------------- */

enum { K_GEMV, K_SWIGLU, K_GROUP, K_SEPARATE }; /* what one timed call launches */

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
} targ;

static void run_timed(void *p) {
    targ *a = p;
    const uint8_t *w = a->w + (size_t)a->next * a->per;
    a->next = (a->next + 1) % a->copies;
    const size_t rb = row_bytes_of(a->t, a->cols);
    switch (a->kind) {
    case K_SWIGLU:
        TB_CHECK(tm_cuda_gemv_swiglu(w, w + rb * (size_t)a->rows[0], a->t, a->rows[0], a->cols, a->x, a->n, a->out,
                                     a->stream));
        break;
    case K_GROUP:
    case K_SEPARATE: {
        tm_cuda_gemv_job jobs[3];
        size_t wo = 0, oo = 0;
        for (int j = 0; j < 3; j++) {
            jobs[j] = (tm_cuda_gemv_job){w + wo, a->rows[j], NULL, (uint8_t *)a->out + oo};
            wo += rb * (size_t)a->rows[j];
            oo += (size_t)a->n * (size_t)a->rows[j] * (a->out_f32 ? 4 : 2);
        }
        if (a->kind == K_GROUP)
            TB_CHECK(tm_cuda_gemv_group(jobs, 3, a->t, a->cols, a->x, a->n, a->out_f32, a->stream));
        else
            for (int j = 0; j < 3; j++)
                TB_CHECK(tm_cuda_gemv(jobs[j].w, a->t, jobs[j].rows, a->cols, a->x, a->n, NULL, jobs[j].out,
                                      a->out_f32, a->stream));
        break;
    }
    default:
        TB_CHECK(tm_cuda_gemv(w, a->t, a->rows[0], a->cols, a->x, a->n, NULL, a->out, a->out_f32, a->stream));
        break;
    }
}

/* per-call microseconds of `calls` back-to-back calls captured in one CUDA graph (median of replays) */
#define GRAPH_CALLS 20
static double time_graph_us(targ *a, bool pdl) {
    set_pdl(pdl);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TB_CHECK(cudaStreamBeginCapture(a->stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < GRAPH_CALLS; i++) run_timed(a);
    TB_CHECK(cudaStreamEndCapture(a->stream, &g));
    TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
    set_pdl(false);
    cudaEvent_t e0, e1;
    TB_CHECK(cudaEventCreate(&e0));
    TB_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 2; i++) TB_CHECK(cudaGraphLaunch(ge, a->stream));
    TB_CHECK(cudaStreamSynchronize(a->stream));
    enum { REPS = 9 };
    float ms[REPS];
    for (int i = 0; i < REPS; i++) {
        TB_CHECK(cudaEventRecord(e0, a->stream));
        TB_CHECK(cudaGraphLaunch(ge, a->stream));
        TB_CHECK(cudaEventRecord(e1, a->stream));
        TB_CHECK(cudaEventSynchronize(e1));
        TB_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, REPS, sizeof(float), tb_cmp_f);
    TB_CHECK(cudaEventDestroy(e0));
    TB_CHECK(cudaEventDestroy(e1));
    TB_CHECK(cudaGraphExecDestroy(ge));
    TB_CHECK(cudaGraphDestroy(g));
    return (double)ms[REPS / 2] * 1000.0 / GRAPH_CALLS;
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
    targ a = {kind, t, {rows[0], nj > 1 ? rows[1] : 0, nj > 1 ? rows[2] : 0}, cols, n, out_f32, NULL, 0, 1, 0, NULL,
              NULL, NULL};
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

static void time_all(void) {
    const int all = M_SINGLE | M_GRAPH | M_PDL | M_KEY;
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
    check_args();
    check_all();
    printf("# checks of single products done in %.1f s\n", tb_elapsed_s());
    check_groups();
    check_chain(false);
    check_chain(true);
    printf("# all checks done in %.1f s\n", tb_elapsed_s());
    fflush(stdout);
    if (argc < 2) time_all(); /* any argument: checks only */
    tb_case("finish");
    tb_guard_report("tb_gemv");
    return tb_finish("tb_gemv");
}
