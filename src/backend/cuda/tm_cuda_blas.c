/* tm_cuda_blas.c -- dense bf16 GEMMs through cuBLASLt: one handle, one workspace, cached algorithm choices. */
#include "backend/cuda/tm_cuda_blas.h"

#include <cublasLt.h>
#include <stdlib.h>

/* One cached plan per (n, m, k, out type, bias): descriptors and the heuristic's first algorithm. */
typedef struct blas_plan {
    int64_t n, m, k;
    bool out_f32, bias;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} blas_plan;

struct tm_cuda_blas {
    cublasLtHandle_t h;
    void *ws;            /* (ws_bytes) device workspace */
    size_t ws_bytes;
    blas_plan *plans;    /* (n_plans) */
    int32_t n_plans, cap_plans;
};

tm_status tm_cuda_blas_create(size_t workspace_bytes, tm_cuda_blas **out, tm_error *err) {
    *out = NULL;
    tm_cuda_blas *b = tm_calloc(1, sizeof *b);
    if (!b) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    cublasStatus_t cs = cublasLtCreate(&b->h);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return tm_err(err, TM_ERR_DEVICE, "cublasLtCreate failed: %s", cublasLtGetStatusString(cs));
    }
    b->ws_bytes = workspace_bytes;
    cudaError_t ce = cudaMalloc(&b->ws, workspace_bytes);
    if (ce != cudaSuccess) {
        cublasLtDestroy(b->h);
        free(b);
        return tm_err(err, TM_ERR_NOMEM, "cuBLASLt workspace of %zu bytes: %s", workspace_bytes, cudaGetErrorString(ce));
    }
    *out = b;
    return TM_OK;
}

static void plan_destroy(blas_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
}

void tm_cuda_blas_free(tm_cuda_blas *b) {
    if (!b) return;
    for (int32_t i = 0; i < b->n_plans; i++) plan_destroy(&b->plans[i]);
    free(b->plans);
    cudaFree(b->ws);
    cublasLtDestroy(b->h);
    free(b);
}

/* Column-major view: C (m, n) = Aᵀ B with A = w as (k, m) col-major (lda k), B = x as (k, n) (ldb k),
 * C = out as (m, n) col-major (ldc m), which is out (n, m) row-major. */
static tm_status plan_make(tm_cuda_blas *b, blas_plan *p, tm_error *err) {
    cublasStatus_t cs;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ct = p->out_f32 ? CUDA_R_32F : CUDA_R_16BF;
#define LT(call)                                                                                              \
    do {                                                                                                      \
        if ((cs = (call)) != CUBLAS_STATUS_SUCCESS) goto fail;                                                \
    } while (0)
    LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (p->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, (uint64_t)p->k, (uint64_t)p->m, p->k));
    LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, (uint64_t)p->k, (uint64_t)p->n, p->k));
    LT(cublasLtMatrixLayoutCreate(&p->lc, ct, (uint64_t)p->m, (uint64_t)p->n, p->m));
    cublasLtMatmulPreference_t pref = NULL;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    cs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &b->ws_bytes,
                                              sizeof b->ws_bytes);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = cublasLtMatmulAlgoGetHeuristic(b->h, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (cs != CUBLAS_STATUS_SUCCESS) goto fail;
    if (!found) {
        plan_destroy(p);
        return tm_err(err, TM_ERR_DEVICE, "cuBLASLt has no algorithm for %lld x %lld x %lld", (long long)p->n,
                      (long long)p->m, (long long)p->k);
    }
    p->algo = res.algo;
    return TM_OK;
fail:
    plan_destroy(p);
    return tm_err(err, TM_ERR_DEVICE, "cuBLASLt plan for %lld x %lld x %lld: %s", (long long)p->n, (long long)p->m,
                  (long long)p->k, cublasLtGetStatusString(cs));
#undef LT
}

tm_status tm_cuda_blas_gemm(tm_cuda_blas *b, const uint16_t *x, const uint16_t *w, const float *bias, void *out,
                            bool out_f32, int64_t n, int64_t m, int64_t k, cudaStream_t stream, tm_error *err) {
    blas_plan *p = NULL;
    bool want_bias = bias != NULL;
    for (int32_t i = 0; i < b->n_plans && !p; i++) {
        blas_plan *q = &b->plans[i];
        if (q->n == n && q->m == m && q->k == k && q->out_f32 == out_f32 && q->bias == want_bias) p = q;
    }
    if (!p) {
        if (b->n_plans == b->cap_plans) {
            int32_t cap = b->cap_plans ? 2 * b->cap_plans : 32;
            blas_plan *np = realloc(b->plans, (size_t)cap * sizeof *np);
            if (!np) return tm_err(err, TM_ERR_NOMEM, "out of memory");
            b->plans = np;
            b->cap_plans = cap;
        }
        blas_plan fresh = {.n = n, .m = m, .k = k, .out_f32 = out_f32, .bias = want_bias};
        tm_status s = plan_make(b, &fresh, err);
        if (s != TM_OK) return s;
        b->plans[b->n_plans++] = fresh;
        p = &b->plans[b->n_plans - 1];
    }
    if (want_bias) {
        cublasStatus_t cs = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (cs != CUBLAS_STATUS_SUCCESS)
            return tm_err(err, TM_ERR_DEVICE, "cuBLASLt bias: %s", cublasLtGetStatusString(cs));
    }
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t cs = cublasLtMatmul(b->h, p->op, &alpha, w, p->la, x, p->lb, &beta, out, p->lc, out, p->lc, &p->algo,
                                       b->ws, b->ws_bytes, stream);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return tm_err(err, TM_ERR_DEVICE, "cublasLtMatmul %lld x %lld x %lld: %s", (long long)n, (long long)m,
                      (long long)k, cublasLtGetStatusString(cs));
    return TM_OK;
}
