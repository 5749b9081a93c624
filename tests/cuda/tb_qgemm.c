/* tb_qgemm.c -- tm_cuda_qgemm (GGUF-quantized weights, 1..64 rows of x, tensor cores) against a double reference. */
#include "backend/cpu/tm_quant.h"
#include "backend/cuda/tm_cuda_blas.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "tb_guard.h"
#include "tb_quant.h"

/* Reference: the weights dequantized on the CPU (tm_dequant_row) and rounded to bf16, as the kernel rounds them,
 * times the bf16 x, summed in double, plus the bias. Outputs poisoned before each run (NaN: an unwritten element
 * fails). Cases: every quantized type, weights from the CPU quantizer and raw random blocks; n = 1, 9, 16, 33, 64;
 * shapes with one row block and many, the SmolLM2 width (576 columns: q4_0/q4_1/q8_0 only), column counts that
 * split and that do not; bias; f32 and bf16 outputs; with the work buffer (split-K) and without; a second run must
 * repeat the first bit for bit (the split-K sum's order is fixed). Refusals: rows % 16, an f16 weight, n = 65.
 * Timing (8B shapes, n = 16 / 32 / 64): the fused product against what the backend did before for n > 8:
 * tm_cuda_dequant_bf16 + a cuBLASLt bf16 GEMM; GB/s counts the quantized weight bytes. */

typedef struct {
    void *work;
    tm_cuda_blas *blas;
} ctx;

static void check_case(ctx *cx, int32_t t, int64_t rows, int64_t cols, int n, bool random_bytes, bool bias,
                       bool out_f32, bool use_work) {
    tb_case("qgemm %s%s %lldx%lld n%d", type_name(t), random_bytes ? "r" : "", (long long)rows, (long long)cols, n);
    const size_t rb = row_bytes_of(t, cols);
    uint8_t *w = make_weights(t, rows, cols, random_bytes);
    float *wf = tb_xmalloc((size_t)rows * (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        float *row = wf + (size_t)r * (size_t)cols;
        tm_dequant_row((tm_dtype)t, w + (size_t)r * rb, row, cols);
        for (int64_t j = 0; j < cols; j++) row[j] = tb_bf16_to_f32(tb_f32_to_bf16(row[j]));
    }
    uint16_t *x = tb_xmalloc((size_t)n * (size_t)cols * 2);
    float *xf = tb_xmalloc((size_t)n * (size_t)cols * sizeof(float));
    tb_fill_bf16(x, xf, (size_t)n * (size_t)cols, 1.0f);
    float *bh = NULL;
    if (bias) {
        bh = tb_xmalloc((size_t)rows * sizeof(float));
        tb_fill_f32(bh, (size_t)rows, 0.5f);
    }
    float *ref = tb_xmalloc((size_t)n * (size_t)rows * sizeof(float));
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double s = bias ? bh[r] : 0.0;
            const float *wr = wf + (size_t)r * (size_t)cols, *xr = xf + (size_t)i * (size_t)cols;
            for (int64_t j = 0; j < cols; j++) s += (double)wr[j] * (double)xr[j];
            ref[(size_t)i * (size_t)rows + (size_t)r] = (float)s;
        }
    void *w_d = tb_upload(w, rb * (size_t)rows), *x_d = tb_upload(x, (size_t)n * (size_t)cols * 2);
    float *b_d = bias ? tb_upload(bh, (size_t)rows * sizeof(float)) : NULL;
    const size_t ob = (size_t)n * (size_t)rows * (out_f32 ? 4 : 2);
    void *o_d = tb_dev(ob);
    uint8_t *o1 = tb_xmalloc(ob), *o2 = tb_xmalloc(ob);
    for (int rep = 0; rep < 2; rep++) {
        tb_poison(o_d, ob);
        TB_RUN(tm_cuda_qgemm(w_d, t, rows, cols, x_d, n, b_d, o_d, out_f32, use_work ? cx->work : NULL, 0));
        tb_download(rep ? o2 : o1, o_d, ob);
    }
    float *got = tb_xmalloc((size_t)n * (size_t)rows * sizeof(float));
    for (size_t i = 0; i < (size_t)n * (size_t)rows; i++)
        got[i] = out_f32 ? ((float *)o1)[i] : tb_bf16_to_f32(((uint16_t *)o1)[i]);
    char name[128];
    snprintf(name, sizeof name, "%s%s %lldx%lld n%d%s%s%s", type_name(t), random_bytes ? "r" : "", (long long)rows,
             (long long)cols, n, bias ? " bias" : "", out_f32 ? " f32" : "", use_work ? "" : " nowork");
    tb_result("qgemm", name, tb_rel_err(got, ref, (size_t)n * (size_t)rows), out_f32 ? 1e-5 : 4e-3, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s %lldx%lld n%d repeat", type_name(t), (long long)rows, (long long)cols, n);
    tb_result("qgemm", name, memcmp(o1, o2, ob) != 0, 0, 0, 0, 0, 'm');
    free(w);
    free(wf);
    free(x);
    free(xf);
    free(bh);
    free(ref);
    free(o1);
    free(o2);
    free(got);
    TB_CHECK(cudaFree(w_d));
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(o_d));
    if (b_d) TB_CHECK(cudaFree(b_d));
}

static void check_refusals(ctx *cx) {
    tb_case("refusals");
    void *w = tb_dev(1 << 20), *x = tb_dev(1 << 20), *o = tb_dev(1 << 20);
    int bad = 0;
    bad += tm_cuda_qgemm(w, TM_DT_Q4_K, 40, 256, x, 9, NULL, o, false, cx->work, 0) != cudaErrorNotSupported;
    bad += tm_cuda_qgemm(w, TM_DT_F16, 64, 256, x, 9, NULL, o, false, cx->work, 0) != cudaErrorNotSupported;
    bad += tm_cuda_qgemm(w, TM_DT_Q4_K, 64, 256, x, 65, NULL, o, false, cx->work, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_qgemm(w, TM_DT_Q4_K, 64, 200, x, 9, NULL, o, false, cx->work, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_qgemm(w, TM_DT_Q4_0, 64, 96, x, 9, NULL, o, false, cx->work, 0) != cudaErrorNotSupported;
    TB_CHECK(cudaDeviceSynchronize());
    tb_result("qgemm", "refusals", bad, 0, 0, 0, 0, 'm');
    TB_CHECK(cudaFree(w));
    TB_CHECK(cudaFree(x));
    TB_CHECK(cudaFree(o));
}

typedef struct {
    ctx *cx;
    int32_t t;
    int64_t rows, cols;
    int n;
    void *w, *x, *out, *deq;
} targ;

static void run_fused(void *p) {
    targ *a = p;
    TB_CHECK(tm_cuda_qgemm(a->w, a->t, a->rows, a->cols, a->x, a->n, NULL, a->out, false, a->cx->work, 0));
}
static void run_deq(void *p) { /* the backend's path before: the whole matrix to bf16, then cuBLASLt */
    targ *a = p;
    TB_CHECK(tm_cuda_dequant_bf16(a->w, a->t, a->rows, a->cols, a->deq, 0));
    tm_error err;
    if (tm_cuda_blas_gemm(a->cx->blas, a->x, a->deq, NULL, a->out, false, a->n, a->rows, a->cols, 0, &err) != TM_OK) {
        fprintf(stderr, "cuBLASLt: %s\n", err.msg);
        exit(2);
    }
}

static void time_case(ctx *cx, int32_t t, int64_t rows, int64_t cols, int n, const char *shape) {
    if (!tb_budget_ok()) return;
    /* TB_QG_ONLY="<type> <shape> <n>" (e.g. "q4_K 8b-gateup 16"): that case alone (profiling) */
    const char *only = getenv("TB_QG_ONLY");
    char me[64];
    snprintf(me, sizeof me, "%s %s %d", type_name(t), shape, n);
    if (only && strcmp(only, me) != 0) return;
    tb_case("time %s %s n%d", type_name(t), shape, n);
    const size_t wb = row_bytes_of(t, cols) * (size_t)rows;
    targ a = {cx, t, rows, cols, n, tb_dev(wb), tb_dev((size_t)n * (size_t)cols * 2), tb_dev((size_t)n * (size_t)rows * 2),
              tb_dev((size_t)rows * (size_t)cols * 2)};
    TB_CHECK(cudaMemset(a.w, 0x11, wb)); /* timing only: small finite numbers in every type */
    TB_CHECK(cudaMemset(a.x, 0x11, (size_t)n * (size_t)cols * 2));
    const double us = tb_time_us(run_fused, &a, 3, 20), usd = tb_time_us(run_deq, &a, 2, 10);
    char name[96];
    snprintf(name, sizeof name, "%s %s n%d", type_name(t), shape, n);
    tb_result("qgemm", name, 0, 0, us, (double)wb, 2.0 * (double)n * (double)rows * (double)cols, 'm');
    snprintf(name, sizeof name, "%s %s n%d dequant+gemm", type_name(t), shape, n);
    tb_result("qgemm", name, 0, 0, usd, (double)wb, 2.0 * (double)n * (double)rows * (double)cols, 'm');
    printf("# key qgemm %-5s %-9s n=%-3d fused %8.1f us (%5.0f GB/s of weights)  dequant+gemm %8.1f us  %.2fx\n",
           type_name(t), shape, n, us, (double)wb / us / 1e3, usd, usd / us);
    TB_CHECK(cudaFree(a.w));
    TB_CHECK(cudaFree(a.x));
    TB_CHECK(cudaFree(a.out));
    TB_CHECK(cudaFree(a.deq));
}

int main(int argc, char **argv) {
    (void)argv;
    tb_guard_init(40.0);
    tb_seed();
    ctx cx = {tb_dev(tm_cuda_qgemm_work_bytes()), NULL};
    TB_CHECK(cudaMemset(cx.work, 0, tm_cuda_qgemm_work_bytes()));
    tm_error err;
    if (tm_cuda_blas_create((size_t)64 << 20, &cx.blas, &err) != TM_OK) {
        printf("# cuBLASLt: %s\n", err.msg);
        return 1;
    }
    const bool checks = !getenv("TB_QG_ONLY");
    if (checks) check_refusals(&cx);
    const int32_t types[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
    const int ns[] = {1, 9, 16, 33, 64};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0] && checks; ti++) {
        const int32_t t = types[ti];
        const bool k_quant = t == TM_DT_Q4_K || t == TM_DT_Q6_K;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            check_case(&cx, t, 256, 1024, ns[i], false, false, false, true);          /* two row blocks, split */
            check_case(&cx, t, 1040, 2048, ns[i], i % 2 == 1, i == 2, i == 3, true); /* a partial row block */
        }
        check_case(&cx, t, 4096, 512, 64, true, true, false, true);  /* 32 row blocks, a short split */
        check_case(&cx, t, 16, 4096, 20, false, false, false, true); /* one warp of rows, many splits */
        check_case(&cx, t, 272, 1536, 33, false, true, false, false); /* no work buffer: one split */
        if (!k_quant) check_case(&cx, t, 576, 576, 17, false, false, false, true); /* SmolLM2's width */
    }
    printf("# checks done in %.1f s\n", tb_elapsed_s());
    fflush(stdout);
    if (argc < 2) { /* any argument: checks only */
        const int tn[] = {16, 32, 64};
        for (size_t i = 0; i < 3; i++)
            for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
                time_case(&cx, types[ti], 6144, 4096, tn[i], "8b-qkv");
                time_case(&cx, types[ti], 28672, 4096, tn[i], "8b-gateup");
                time_case(&cx, types[ti], 4096, 4096, tn[i], "8b-o");
                time_case(&cx, types[ti], 4096, 14336, tn[i], "8b-down");
            }
    }
    tm_cuda_blas_free(cx.blas);
    TB_CHECK(cudaFree(cx.work));
    tb_case("finish");
    tb_guard_report("tb_qgemm");
    return tb_finish("tb_qgemm");
}
