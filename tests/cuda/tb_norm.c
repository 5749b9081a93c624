/* tb_norm.c -- test bed of tm_cuda_rmsnorm and tm_cuda_add_rmsnorm: CPU reference in double, both versions, timing. */
#include "tb_common.h"
#include "core/tm_fp8.h"

#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"

/* out = bf16(v / sqrt(mean(v^2) + eps) * w) with v = x (f32) or v = f32(res + x) (bf16 x), in double */
static void ref_norm(float *res, const float *xf, const uint16_t *xb, const float *w, float eps, int n, int dim,
                     float *out) {
    for (int i = 0; i < n; i++) {
        double ss = 0.0;
        for (int j = 0; j < dim; j++) {
            size_t o = (size_t)i * dim + j;
            float v = res ? res[o] + tb_bf16_to_f32(xb[o]) : xf[o]; /* the f32 add of the kernel */
            if (res) res[o] = v;
            ss += (double)v * v;
        }
        double r = 1.0 / sqrt(ss / dim + eps);
        for (int j = 0; j < dim; j++) {
            size_t o = (size_t)i * dim + j;
            double v = res ? res[o] : xf[o];
            out[o] = (float)(v * r * w[j]);
        }
    }
}

static void set_version(int v) {
    if (v == 1)
        setenv("TM_CUDA_RMSNORM_V", "1", 1);
    else
        unsetenv("TM_CUDA_RMSNORM_V");
}

/* One check of one launcher on a fresh (n, dim) problem; misalign shifts every device pointer by one element
 * (forces the scalar path). Returns nothing; records a RESULT line. */
static void check_case(bool add, int n, int dim, bool misalign, int version) {
    size_t ne = (size_t)n * dim, off = misalign ? 1 : 0;
    float *res = malloc(ne * sizeof(float)), *xf = malloc(ne * sizeof(float)), *w = malloc(dim * sizeof(float));
    float *ref = malloc(ne * sizeof(float)), *res_out = malloc(ne * sizeof(float));
    uint16_t *xb = malloc(ne * sizeof(uint16_t)), *out = malloc(ne * sizeof(uint16_t));
    if (ne <= (1u << 20)) {
        tb_fill_f32(res, ne, 3.0f);
        tb_fill_f32(xf, ne, 2.0f);
        tb_fill_bf16(xb, NULL, ne, 1.5f);
    } else { /* large: cheaper uniform inputs */
        for (size_t i = 0; i < ne; i++) {
            res[i] = 3.0f * tb_uniform();
            xf[i] = res[i];
            xb[i] = tb_f32_to_bf16(1.5f * tb_uniform());
        }
    }
    for (int j = 0; j < dim; j++) w[j] = 1.0f + 0.3f * tb_uniform();
    float *d_res = tb_dev((ne + off) * sizeof(float)), *d_xf = tb_dev((ne + off) * sizeof(float));
    float *d_w = tb_dev((dim + off) * sizeof(float));
    uint16_t *d_xb = tb_dev((ne + off) * sizeof(uint16_t)), *d_out = tb_dev((ne + off) * sizeof(uint16_t));
    TB_CHECK(cudaMemcpy(d_res + off, res, ne * sizeof(float), cudaMemcpyHostToDevice));
    TB_CHECK(cudaMemcpy(d_xf + off, xf, ne * sizeof(float), cudaMemcpyHostToDevice));
    TB_CHECK(cudaMemcpy(d_w + off, w, dim * sizeof(float), cudaMemcpyHostToDevice));
    TB_CHECK(cudaMemcpy(d_xb + off, xb, ne * sizeof(uint16_t), cudaMemcpyHostToDevice));
    tb_poison(d_out, (ne + off) * sizeof(uint16_t));
    const float eps = 1e-5f;
    set_version(version);
    if (add)
        TB_RUN(tm_cuda_add_rmsnorm(d_res + off, d_xb + off, d_w + off, eps, n, dim, d_out + off, 0));
    else
        TB_RUN(tm_cuda_rmsnorm(d_xf + off, d_w + off, eps, n, dim, d_out + off, 0));
    set_version(2);
    tb_download(out, d_out + off, ne * sizeof(uint16_t));
    tb_download(res_out, d_res + off, ne * sizeof(float));
    ref_norm(add ? res : NULL, xf, xb, w, eps, n, dim, ref);
    double err = tb_rel_err_bf16(out, ref, ne);
    if (add) { /* the new residual is one f32 add: bitwise */
        size_t bad = 0;
        for (size_t i = 0; i < ne; i++) bad += memcmp(&res_out[i], &res[i], sizeof(float)) != 0;
        if (bad) {
            printf("# residual differs in %zu of %zu elements\n", bad, ne);
            err = INFINITY;
        }
    }
    char name[96];
    snprintf(name, sizeof name, "v%d n=%d dim=%d%s", version, n, dim, misalign ? " misaligned" : "");
    tb_result(add ? "add_rmsnorm" : "rmsnorm", name, err, 1e-2, 0, 0, 0, 'm');
    cudaFree(d_res);
    cudaFree(d_xf);
    cudaFree(d_w);
    cudaFree(d_xb);
    cudaFree(d_out);
    free(res);
    free(xf);
    free(w);
    free(ref);
    free(res_out);
    free(xb);
    free(out);
}

/* tm_cuda_rmsnorm_fp8: the bf16 output (and the residual) bit for bit those of the plain launcher on the same
 * inputs, and every e4m3 byte the host rounding of that output times inv */
static void check_fp8(bool add, int n, int dim) {
    const size_t ne = (size_t)n * dim;
    const float inv = 16.0f, eps = 1e-5f;
    float *res = malloc(ne * sizeof(float)), *w = malloc(dim * sizeof(float));
    uint16_t *xb = malloc(ne * 2), *o1 = malloc(ne * 2), *o2 = malloc(ne * 2);
    uint8_t *o8 = malloc(ne);
    float *r1 = malloc(ne * sizeof(float)), *r2 = malloc(ne * sizeof(float));
    tb_fill_f32(res, ne, 3.0f);
    tb_fill_bf16(xb, NULL, ne, 1.5f);
    for (int j = 0; j < dim; j++) w[j] = 1.0f + 0.3f * tb_uniform();
    float *d_res = tb_dev(ne * sizeof(float)), *d_w = tb_dev(dim * sizeof(float));
    uint16_t *d_xb = tb_dev(ne * 2), *d_out = tb_dev(ne * 2);
    uint8_t *d_o8 = tb_dev(ne);
    TB_CHECK(cudaMemcpy(d_w, w, dim * sizeof(float), cudaMemcpyHostToDevice));
    TB_CHECK(cudaMemcpy(d_xb, xb, ne * 2, cudaMemcpyHostToDevice));
    for (int pass = 0; pass < 2; pass++) {
        TB_CHECK(cudaMemcpy(d_res, res, ne * sizeof(float), cudaMemcpyHostToDevice));
        tb_poison(d_out, ne * 2);
        tb_poison(d_o8, ne);
        if (pass == 0 && add) TB_RUN(tm_cuda_add_rmsnorm(d_res, d_xb, d_w, eps, n, dim, d_out, 0));
        if (pass == 0 && !add) TB_RUN(tm_cuda_rmsnorm(d_res, d_w, eps, n, dim, d_out, 0));
        if (pass == 1)
            TB_RUN(tm_cuda_rmsnorm_fp8(add ? d_res : NULL, add ? d_xb : NULL, add ? NULL : d_res, d_w, eps, n, dim, d_out,
                                       d_o8, inv, 0));
        tb_download(pass ? o2 : o1, d_out, ne * 2);
        tb_download(pass ? r2 : r1, d_res, ne * sizeof(float));
    }
    tb_download(o8, d_o8, ne);
    double bad = 0;
    for (size_t i = 0; i < ne; i++)
        bad += o1[i] != o2[i] || memcmp(&r1[i], &r2[i], sizeof(float)) != 0 ||
               o8[i] != tm_fp8_from_f32(tb_bf16_to_f32(o2[i]) * inv);
    /* the e4m3 copy alone (out NULL: out untouched), then the deferred bf16 output, the plain norm of the f32 input
     * after the add: the same residual, bytes and output as above */
    uint8_t *o8b = malloc(ne);
    TB_CHECK(cudaMemcpy(d_res, res, ne * sizeof(float), cudaMemcpyHostToDevice));
    tb_poison(d_out, ne * 2);
    tb_poison(d_o8, ne);
    TB_RUN(tm_cuda_rmsnorm_fp8(add ? d_res : NULL, add ? d_xb : NULL, add ? NULL : d_res, d_w, eps, n, dim, NULL, d_o8,
                               inv, 0));
    tb_download(o8b, d_o8, ne);
    tb_download(o2, d_out, ne * 2);
    tb_download(r2, d_res, ne * sizeof(float));
    for (size_t i = 0; i < ne; i++)
        bad += o8b[i] != o8[i] || o2[i] != 0xFFFF || memcmp(&r1[i], &r2[i], sizeof(float)) != 0;
    TB_RUN(tm_cuda_rmsnorm(d_res, d_w, eps, n, dim, d_out, 0));
    tb_download(o2, d_out, ne * 2);
    for (size_t i = 0; i < ne; i++) bad += o1[i] != o2[i];
    free(o8b);
    char name[96];
    snprintf(name, sizeof name, "fp8 copy, fp8-only, deferred n=%d dim=%d: differing", n, dim);
    tb_result(add ? "add_rmsnorm" : "rmsnorm", name, bad, 0, 0, 0, 0, 'm');
    cudaFree(d_res);
    cudaFree(d_w);
    cudaFree(d_xb);
    cudaFree(d_out);
    cudaFree(d_o8);
    free(res);
    free(w);
    free(xb);
    free(o1);
    free(o2);
    free(o8);
    free(r1);
    free(r2);
}

typedef struct {
    bool add;
    float *res, *xf, *w;
    uint16_t *xb, *out;
    int n, dim;
} norm_arg;

static void run_norm(void *p) {
    norm_arg *a = p;
    if (a->add)
        TB_CHECK(tm_cuda_add_rmsnorm(a->res, a->xb, a->w, 1e-5f, a->n, a->dim, a->out, 0));
    else
        TB_CHECK(tm_cuda_rmsnorm(a->xf, a->w, 1e-5f, a->n, a->dim, a->out, 0));
}

/* times one shape (fresh random data; the residual grows by x per call, harmless) */
static void time_case(bool add, int n, int dim, int version, const char *label) {
    size_t ne = (size_t)n * dim;
    norm_arg a = {add, NULL, NULL, NULL, NULL, NULL, n, dim};
    a.w = tb_dev(dim * sizeof(float));
    a.out = tb_dev(ne * sizeof(uint16_t));
    TB_CHECK(tm_cuda_fill_random(a.w, TM_DT_F32, (size_t)dim, 7, 0.5f, 0.0f, 0));
    if (add) {
        a.res = tb_dev(ne * sizeof(float));
        a.xb = tb_dev(ne * sizeof(uint16_t));
        TB_CHECK(tm_cuda_fill_random(a.res, TM_DT_F32, ne, 1, 1.0f, 0.0f, 0));
        TB_CHECK(tm_cuda_fill_random(a.xb, TM_DT_BF16, ne, 2, 0.01f, 0.0f, 0));
    } else {
        a.xf = tb_dev(ne * sizeof(float));
        TB_CHECK(tm_cuda_fill_random(a.xf, TM_DT_F32, ne, 3, 1.0f, 0.0f, 0));
    }
    TB_CHECK(cudaDeviceSynchronize());
    set_version(version);
    int reps = ne >= (1u << 24) ? 20 : 200;
    double us = tb_time_us(run_norm, &a, 3, reps);
    set_version(2);
    /* residual read + write (f32), x read (bf16), out write (bf16), w once; rmsnorm: x read (f32) + out */
    double bytes = add ? (double)ne * (4 + 4 + 2 + 2) + dim * 4.0 : (double)ne * (4 + 2) + dim * 4.0;
    char name[96];
    snprintf(name, sizeof name, "v%d %s n=%d dim=%d", version, label, n, dim);
    tb_result(add ? "add_rmsnorm" : "rmsnorm", name, 0, 0, us, bytes, 0, 'm');
    cudaFree(a.res);
    cudaFree(a.xf);
    cudaFree(a.w);
    cudaFree(a.xb);
    cudaFree(a.out);
}

int main(void) {
    tb_seed();
    static const int shapes[][2] = {{1, 4096}, {3, 576},  {7, 8},    {5, 4100}, {2, 8192}, {33, 2048},
                                    {2, 16384}, {2, 20000}, {4, 1000}, {1, 3},   {9, 5120}, {64, 3072}};
    for (int add = 0; add <= 1; add++)
        for (int v = 1; v <= 2; v++) {
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                check_case(add, shapes[s][0], shapes[s][1], false, v);
            check_case(add, 5, 4096, true, v);
        }
    for (int add = 0; add <= 1; add++) {
        check_fp8(add, 3, 576);
        check_fp8(add, 37, 4096);
        check_fp8(add, 9, 8192);
        check_fp8(add, 512, 2048);
    }
    /* the timed shape itself, once */
    check_case(true, 16384, 4096, false, 2);

    if (getenv("TB_CHECK_ONLY")) return tb_finish("tb_norm"); /* correctness only, no timing */
    time_case(true, 16384, 4096, 2, "8B-prefill");
    time_case(true, 16384, 4096, 1, "8B-prefill");
    time_case(true, 16384, 2048, 2, "1B-prefill");
    time_case(false, 16384, 4096, 2, "8B-prefill");
    for (int n = 1; n <= 64; n *= 2) time_case(true, n, 4096, 2, "8B-decode");
    for (int n = 1; n <= 64; n *= 4) time_case(true, n, 2048, 2, "1B-decode");
    return tb_finish("tb_norm");
}
