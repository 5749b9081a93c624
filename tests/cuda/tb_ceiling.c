/* tb_ceiling.c -- this GPU's ceilings: device copy bandwidth, a read-only stream, the bf16 cuBLASLt GEMM rate. */
#include "backend/cuda/tm_cuda_blas.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "tb_common.h"

/* Prints `CEILING copy_gbs=<x> gemm_tflops=<y>` (scripts/gpu.sh exports them as TM_CEIL_COPY_GBS and
 * TM_CEIL_GEMM_TFLOPS for the other test beds) plus RESULT lines. Copy: 4 GiB device-to-device, counting bytes
 * read + written; read: tm_cuda_xor_u32 over the same 4 GiB (bytes read; printed beside, not exported: decode
 * attention, which mostly reads, is still reported against the copy as the issue asks). GEMM: 8192 x 8192 x 8192 bf16 -> bf16 on random data (f32 accumulation), and the two shapes
 * of a large decode batch against 8B weights. */

typedef struct copy_arg {
    void *dst, *src;
    size_t bytes;
} copy_arg;
static void run_copy(void *p) {
    copy_arg *a = p;
    TB_CHECK(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, 0));
}

typedef struct xor_arg {
    const void *p;
    size_t bytes;
    uint32_t *out;
} xor_arg;
static void run_xor(void *p) {
    xor_arg *a = p;
    TB_CHECK(tm_cuda_xor_u32(a->p, a->bytes, a->out, 0));
}

typedef struct gemm_arg {
    tm_cuda_blas *blas;
    uint16_t *x, *w, *out;
    int64_t n, m, k;
} gemm_arg;
static void run_gemm(void *p) {
    gemm_arg *a = p;
    tm_error err;
    if (tm_cuda_blas_gemm(a->blas, a->x, a->w, NULL, a->out, false, a->n, a->m, a->k, 0, &err) != TM_OK) {
        fprintf(stderr, "gemm: %s\n", err.msg);
        exit(2);
    }
}

static double gemm_case(tm_cuda_blas *blas, int64_t n, int64_t m, int64_t k, const char *name) {
    size_t nx = (size_t)(n * k), nw = (size_t)(m * k), no = (size_t)(n * m);
    uint16_t *hx = malloc(nx * 2), *hw = malloc(nw * 2), *ho = malloc(no * 2);
    tb_fill_bf16(hx, NULL, nx, 1.0f);
    tb_fill_bf16(hw, NULL, nw, 0.05f);
    gemm_arg a = {blas, tb_upload(hx, nx * 2), tb_upload(hw, nw * 2), tb_dev(no * 2), n, m, k};
    /* correctness on a sample of outputs against a double reference */
    tb_poison(a.out, no * 2);
    run_gemm(&a);
    TB_CHECK(cudaDeviceSynchronize());
    tb_download(ho, a.out, no * 2);
    double num = 0, den = 0;
    for (int s = 0; s < 256; s++) {
        int64_t i = (int64_t)(tb_rand_u64() % (uint64_t)n), j = (int64_t)(tb_rand_u64() % (uint64_t)m);
        double ref = 0;
        for (int64_t t = 0; t < k; t++)
            ref += (double)tb_bf16_to_f32(hx[i * k + t]) * (double)tb_bf16_to_f32(hw[j * k + t]);
        double got = tb_bf16_to_f32(ho[i * m + j]);
        if (!isfinite(got)) num = INFINITY;
        num += (got - ref) * (got - ref);
        den += ref * ref;
    }
    double err = sqrt(num / den);
    double us = tb_time_us(run_gemm, &a, 5, 20);
    double flops = 2.0 * (double)n * (double)m * (double)k, bytes = (double)(nx + nw + no) * 2;
    tb_result("gemm_bf16", name, err, 1e-2, us, bytes, flops, 'c');
    cudaFree(a.x);
    cudaFree(a.w);
    cudaFree(a.out);
    free(hx);
    free(hw);
    free(ho);
    return flops / (us * 1e6);
}

int main(void) {
    tb_seed();
    struct cudaDeviceProp prop;
    TB_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("# device %s, %d SMs, L2 %d MB, smem/SM %zu KB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, prop.sharedMemPerMultiprocessor >> 10);
    size_t bytes = (size_t)4 << 30;
    copy_arg c = {tb_dev(bytes), tb_dev(bytes), bytes};
    TB_CHECK(cudaMemset(c.src, 0x3c, bytes));
    double us = tb_time_us(run_copy, &c, 3, 10);
    double copy_gbs = 2.0 * (double)bytes / (us * 1e3);
    tb_result("copy", "4GiB d2d (read+write)", 0.0, 0.0, us, 2.0 * (double)bytes, 0, 'm');
    const double soak = tb_soak_us(run_copy, &c); /* TB_SOAK_S: the copy under a sustained load */
    if (soak > 0.0) printf("# soak copy 4GiB d2d: %.1f us a call, %.0f GB/s\n", soak, 2.0 * (double)bytes / (soak * 1e3));
    /* read ceiling: the XOR of every word of 4 GiB of random bytes, checked against the host's */
    {
        size_t nw = bytes / 4, chunk = (size_t)1 << 24;
        uint32_t *hw = malloc(chunk * 4), want = 0;
        for (size_t off = 0; off < nw; off += chunk) {
            for (size_t i = 0; i < chunk; i++) want ^= (hw[i] = (uint32_t)tb_rand_u64());
            TB_CHECK(cudaMemcpy((uint32_t *)c.src + off, hw, chunk * 4, cudaMemcpyHostToDevice));
        }
        free(hw);
        xor_arg x = {c.src, bytes, (uint32_t *)c.dst};
        uint32_t got = 0;
        run_xor(&x);
        TB_CHECK(cudaMemcpy(&got, x.out, 4, cudaMemcpyDeviceToHost));
        double rus = tb_time_us(run_xor, &x, 3, 10);
        tb_result("read", "4GiB xor of words (read only)", got == want ? 0.0 : 1.0, 0.0, rus, (double)bytes, 0, 'm');
        printf("# read ceiling %.1f GB/s (copy %.1f)\n", (double)bytes / (rus * 1e3), copy_gbs);
    }
    cudaFree(c.dst);
    cudaFree(c.src);

    tm_cuda_blas *blas = NULL;
    tm_error err;
    if (tm_cuda_blas_create((size_t)64 << 20, &blas, &err) != TM_OK) {
        fprintf(stderr, "blas: %s\n", err.msg);
        return 2;
    }
    double tf = gemm_case(blas, 8192, 8192, 8192, "8192^3");
    gemm_case(blas, 256, 14336, 4096, "256x14336x4096 (8B up, B=256)");
    gemm_case(blas, 256, 4096, 14336, "256x4096x14336 (8B down, B=256)");
    gemm_case(blas, 4096, 6144, 4096, "4096x6144x4096 (8B qkv prefill)");
    tm_cuda_blas_free(blas);
    printf("CEILING copy_gbs=%.1f gemm_tflops=%.1f\n", copy_gbs, tf);
    return tb_finish("tb_ceiling");
}
