/* tb_dequant.c -- tm_cuda_dequant_bf16 and tm_cuda_embed(_ex) (every weight type) against the CPU tm_dequant_row. */
#include "backend/cpu/tm_quant.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "tb_guard.h"
#include "tb_quant.h"

/* Both kernels round like tm_dequant_row (no fused multiply-add), so the expected result is bit-exact: dequant
 * is compared with the CPU values rounded to bf16 (tolerance 1e-5 on the relative L2 error, i.e. at most a stray
 * last-bit difference in a large matrix; the count of differing elements is printed), embed with the CPU f32
 * values (tolerance 1e-6). Weights: random floats through the CPU quantizer, and random block bytes with sane
 * fp16 scales for the quantized types. Shapes: one block, several blocks, 1184/1280 columns, 4096; rows 1, 5, 33;
 * float cols that are not a multiple of 8 (fallback to v1); both versions (TM_CUDA_DEQUANT_V=1 and the default).
 * Embed: ids in random order with repeats, the first and last rows, n = 1 and 37; tm_cuda_embed_ex with a
 * pipelined step's sources (a quarter of the rows keep their own id, the rest take prev[src]) and the raw bf16
 * copy, which must be the expected rows rounded to bf16 bit for bit. Timing: dequant of the 8B
 * shapes per type (bytes = weights + bf16 output) and embedding 512 tokens of a 128256 x 4096 table (bytes = the
 * rows read + f32 output). Robustness (tb_guard.h): checked allocations, "CASE <name>" before each case, crash and
 * hang reports naming the case, timing skipped past TB_BUDGET_S seconds (default 25). */

static void set_version(int v) {
    if (v == 1)
        setenv("TM_CUDA_DEQUANT_V", "1", 1);
    else
        unsetenv("TM_CUDA_DEQUANT_V");
}

static void check_case(int32_t t, int64_t rows, int64_t cols, bool random_bytes) {
    tb_case("dequant %s%s %lldx%lld", type_name(t), random_bytes ? "r" : "", (long long)rows, (long long)cols);
    const size_t rb = row_bytes_of(t, cols), ne = (size_t)rows * cols;
    uint8_t *w = make_weights(t, rows, cols, random_bytes);
    float *ref = tb_xmalloc(ne * sizeof(float)), *refb = tb_xmalloc(ne * sizeof(float));
    float *got = tb_xmalloc(ne * sizeof(float));
    uint16_t *out_h = tb_xmalloc(ne * 2);
    for (int64_t r = 0; r < rows; r++) tm_dequant_row((tm_dtype)t, w + (size_t)r * rb, ref + (size_t)r * cols, cols);
    for (size_t i = 0; i < ne; i++) refb[i] = tb_bf16_to_f32(tb_f32_to_bf16(ref[i]));
    void *w_d = tb_upload(w, rb * (size_t)rows);
    uint16_t *out_d = tb_dev(ne * 2);
    /* embed: ids in random order with repeats plus the first and the last row */
    const int n_ids = rows > 1 ? 37 : 1;
    int32_t *ids = tb_xmalloc((size_t)n_ids * sizeof(int32_t));
    for (int i = 0; i < n_ids; i++) ids[i] = (int32_t)(tb_rand_u64() % (uint64_t)rows);
    ids[0] = (int32_t)(rows - 1);
    if (n_ids > 1) ids[1] = 0;
    int32_t *ids_d = tb_upload(ids, (size_t)n_ids * sizeof(int32_t));
    float *x_d = tb_dev((size_t)n_ids * cols * sizeof(float));
    float *xh = tb_xmalloc((size_t)n_ids * cols * sizeof(float));
    float *xref = tb_xmalloc((size_t)n_ids * cols * sizeof(float));
    for (int i = 0; i < n_ids; i++) memcpy(xref + (size_t)i * cols, ref + (size_t)ids[i] * cols, (size_t)cols * sizeof(float));
    char name[96];
    for (int v = 2; v >= 1; v--) {
        set_version(v);
        tb_poison(out_d, ne * 2);
        TB_RUN(tm_cuda_dequant_bf16(w_d, t, rows, cols, out_d, 0));
        tb_download(out_h, out_d, ne * 2);
        size_t diff = 0;
        for (size_t i = 0; i < ne; i++) {
            got[i] = tb_bf16_to_f32(out_h[i]);
            diff += out_h[i] != tb_f32_to_bf16(ref[i]);
        }
        snprintf(name, sizeof name, "v%d %s%s %lldx%lld (%zu differ)", v, type_name(t), random_bytes ? "r" : "",
                 (long long)rows, (long long)cols, diff);
        tb_result("dequant_bf16", name, tb_rel_err(got, refb, ne), 1e-5, 0, 0, 0, 'm');

        tb_poison(x_d, (size_t)n_ids * cols * sizeof(float));
        TB_RUN(tm_cuda_embed(w_d, t, cols, ids_d, n_ids, x_d, 0));
        tb_download(xh, x_d, (size_t)n_ids * cols * sizeof(float));
        snprintf(name, sizeof name, "v%d %s%s %lldx%lld n%d", v, type_name(t), random_bytes ? "r" : "",
                 (long long)rows, (long long)cols, n_ids);
        tb_result("embed", name, tb_rel_err(xh, xref, (size_t)n_ids * cols), 1e-6, 0, 0, 0, 'm');

        /* chained ids and the raw copy: row i is prev[src[i]] (src[i] >= 0) or ids[i] */
        int32_t *src = tb_xmalloc((size_t)n_ids * sizeof(int32_t)), *prev = tb_xmalloc((size_t)n_ids * sizeof(int32_t));
        float *xref2 = tb_xmalloc((size_t)n_ids * cols * sizeof(float));
        uint16_t *rawh = tb_xmalloc((size_t)n_ids * cols * 2);
        for (int i = 0; i < n_ids; i++) {
            prev[i] = (int32_t)(tb_rand_u64() % (uint64_t)rows);
            src[i] = tb_rand_u64() % 4 == 0 ? -1 : (int32_t)(tb_rand_u64() % (uint64_t)n_ids);
        }
        for (int i = 0; i < n_ids; i++) {
            const int32_t id = src[i] >= 0 ? prev[src[i]] : ids[i];
            memcpy(xref2 + (size_t)i * cols, ref + (size_t)id * cols, (size_t)cols * sizeof(float));
        }
        int32_t *src_d = tb_upload(src, (size_t)n_ids * 4), *prev_d = tb_upload(prev, (size_t)n_ids * 4);
        uint16_t *raw_d = tb_dev((size_t)n_ids * cols * 2);
        tb_poison(x_d, (size_t)n_ids * cols * sizeof(float));
        tb_poison(raw_d, (size_t)n_ids * cols * 2);
        TB_RUN(tm_cuda_embed_ex(w_d, t, cols, ids_d, src_d, prev_d, n_ids, x_d, raw_d, 0));
        tb_download(xh, x_d, (size_t)n_ids * cols * sizeof(float));
        tb_download(rawh, raw_d, (size_t)n_ids * cols * 2);
        size_t raw_bad = 0;
        for (size_t i = 0; i < (size_t)n_ids * cols; i++) raw_bad += rawh[i] != tb_f32_to_bf16(xref2[i]);
        snprintf(name, sizeof name, "v%d %s%s %lldx%lld n%d chained", v, type_name(t), random_bytes ? "r" : "",
                 (long long)rows, (long long)cols, n_ids);
        tb_result("embed", name, tb_rel_err(xh, xref2, (size_t)n_ids * cols), 1e-6, 0, 0, 0, 'm');
        snprintf(name, sizeof name, "v%d %s%s %lldx%lld n%d raw bf16 (%zu differ)", v, type_name(t),
                 random_bytes ? "r" : "", (long long)rows, (long long)cols, n_ids, raw_bad);
        tb_result("embed", name, (double)raw_bad, 0, 0, 0, 0, 'm');
        TB_CHECK(cudaFree(src_d));
        TB_CHECK(cudaFree(prev_d));
        TB_CHECK(cudaFree(raw_d));
        free(src);
        free(prev);
        free(xref2);
        free(rawh);
    }
    set_version(2);
    TB_CHECK(cudaFree(w_d));
    TB_CHECK(cudaFree(out_d));
    TB_CHECK(cudaFree(ids_d));
    TB_CHECK(cudaFree(x_d));
    free(w);
    free(ref);
    free(refb);
    free(got);
    free(out_h);
    free(ids);
    free(xh);
    free(xref);
}

static void check_all(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int32_t t = k_types[ti];
        const int64_t one = qk_of(t) > 1 ? qk_of(t) : 8;
        const int64_t odd = qk_of(t) == 256 ? 1280 : 1184;
        check_case(t, 1, one, false);
        check_case(t, 5, 3 * one, false);
        check_case(t, 33, odd, false);
        check_case(t, 5, 4096, false);
        if (is_quant(t)) {
            check_case(t, 33, odd, true);
            check_case(t, 5, 4096, true);
        } else {
            check_case(t, 5, 36, false); /* cols % 8 != 0 */
        }
    }
    tb_case("dequant argument checks");
    int bad = 0;
    uint16_t *o = tb_dev(4096);
    bad += tm_cuda_dequant_bf16(o, TM_DT_Q4_K, 1, 128, o, 0) != cudaErrorInvalidValue; /* cols % 256 */
    bad += tm_cuda_dequant_bf16(o, TM_DT_Q5_1, 1, 32, o, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_embed(o, TM_DT_Q8_0, 48, (const int32_t *)o, 1, (float *)o, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_embed(o, TM_DT_BF16, 8, NULL, 1, (float *)o, 0) != cudaErrorInvalidValue;
    bad += tm_cuda_embed_ex(o, TM_DT_BF16, 8, (const int32_t *)o, (const int32_t *)o, NULL, 1, (float *)o, NULL, 0) !=
           cudaErrorInvalidValue; /* sources without the ids they index */
    bad += tm_cuda_dequant_bf16(o, TM_DT_BF16, 0, 8, o, 0) != cudaSuccess;
    TB_CHECK(cudaDeviceSynchronize());
    tb_result("dequant_bf16", "argument checks", bad, 0, 0, 0, 0, 'm');
    TB_CHECK(cudaFree(o));
}

/* ---- timing ---------------------------------------------------------------------------------------------------- */

typedef struct darg {
    int32_t t;
    int64_t rows, cols;
    const void *w;
    uint16_t *out;
    const int32_t *ids;
    int n;
    float *x;
} darg;

static void run_dequant(void *p) {
    darg *a = p;
    TB_CHECK(tm_cuda_dequant_bf16(a->w, a->t, a->rows, a->cols, a->out, 0));
}
static void run_embed(void *p) {
    darg *a = p;
    TB_CHECK(tm_cuda_embed(a->w, a->t, a->cols, a->ids, a->n, a->x, 0));
}

static void time_dequant(int32_t t, int64_t rows, int64_t cols, int version) {
    if (!tb_budget_ok()) return;
    tb_case("time dequant %s%s %lldx%lld", version == 1 ? "v1 " : "", type_name(t), (long long)rows, (long long)cols);
    const size_t wb = row_bytes_of(t, cols) * (size_t)rows, ob = (size_t)rows * cols * 2;
    darg a = {t, rows, cols, tb_dev(wb), tb_dev(ob), NULL, 0, NULL};
    TB_CHECK(cudaMemset((void *)a.w, 0x11, wb)); /* timing only: small finite numbers in every type */
    set_version(version);
    const double us = tb_time_us(run_dequant, &a, 3, 20);
    set_version(2);
    char name[96];
    snprintf(name, sizeof name, "%s%s %lldx%lld", version == 1 ? "v1 " : "", type_name(t), (long long)rows, (long long)cols);
    tb_result("dequant_bf16", name, 0.0, 0.0, us, (double)(wb + ob), 0.0, 'm');
    TB_CHECK(cudaFree((void *)a.w));
    TB_CHECK(cudaFree(a.out));
}

static void time_embed(int32_t t, int64_t vocab, int64_t cols, int n) {
    if (!tb_budget_ok()) return;
    tb_case("time embed %s %lldx%lld n%d", type_name(t), (long long)vocab, (long long)cols, n);
    const size_t rb = row_bytes_of(t, cols);
    int32_t *ids = tb_xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64() % (uint64_t)vocab);
    darg a = {t, vocab, cols, tb_dev(rb * (size_t)vocab), NULL, tb_upload(ids, (size_t)n * 4), n,
              tb_dev((size_t)n * cols * 4)};
    TB_CHECK(cudaMemset((void *)a.w, 0x11, rb * (size_t)vocab));
    const double us = tb_time_us(run_embed, &a, 3, 20);
    char name[96];
    snprintf(name, sizeof name, "%s %lldx%lld n%d", type_name(t), (long long)vocab, (long long)cols, n);
    tb_result("embed", name, 0.0, 0.0, us, (double)n * (double)(rb + (size_t)cols * 4), 0.0, 'm');
    TB_CHECK(cudaFree((void *)a.w));
    TB_CHECK(cudaFree((void *)a.ids));
    TB_CHECK(cudaFree(a.x));
    free(ids);
}

int main(int argc, char **argv) {
    (void)argv;
    tb_guard_init(25.0);
    tb_seed();
    check_all();
    if (argc < 2) {
        for (int ti = 0; ti < N_TYPES; ti++) {
            time_dequant(k_types[ti], 14336, 4096, 2);
            time_dequant(k_types[ti], 4096, 14336, 2);
        }
        time_dequant(TM_DT_Q4_K, 14336, 4096, 1);
        time_dequant(TM_DT_BF16, 128256, 4096, 2);
        time_embed(TM_DT_BF16, 128256, 4096, 512);
        time_embed(TM_DT_Q4_K, 128256, 4096, 512);
        time_embed(TM_DT_Q6_K, 128256, 4096, 512);
    }
    tb_case("finish");
    tb_guard_report("tb_dequant");
    return tb_finish("tb_dequant");
}
