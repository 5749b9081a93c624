/* tm_cuda_blas.c -- dense bf16 GEMMs through cuBLASLt: one handle, one workspace, cached algorithm choices. */
#include "backend/cuda/tm_cuda_blas.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdlib.h>

/* cuBLASLt is loaded at run time (dlopen) when a CUDA backend is created, so the binary starts, and runs on the
 * CPU, without the library (which also costs ~200 MB of resident memory just by being mapped at start). */
typedef struct lt_api {
    void *lib;
    cublasStatus_t (*create)(cublasLtHandle_t *);
    cublasStatus_t (*destroy)(cublasLtHandle_t);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t);
    cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t);
    cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t);
    cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                             const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,
                             void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
                             cudaStream_t);
} lt_api;

static tm_status lt_load(lt_api *a, tm_error *err) {
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so", NULL};
    for (int i = 0; names[i] && !a->lib; i++) a->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) return tm_err(err, TM_ERR_DEVICE, "cannot load cuBLASLt (libcublasLt.so.13): %s", dlerror());
#define SYM(field, name)                                                                                      \
    do {                                                                                                      \
        *(void **)&a->field = dlsym(a->lib, name);                                                            \
        if (!a->field) {                                                                                      \
            dlclose(a->lib);                                                                                  \
            a->lib = NULL;                                                                                    \
            return tm_err(err, TM_ERR_DEVICE, "cuBLASLt lacks %s", name);                                     \
        }                                                                                                     \
    } while (0)
    SYM(create, "cublasLtCreate");
    SYM(destroy, "cublasLtDestroy");
    SYM(status_string, "cublasLtGetStatusString");
    SYM(desc_create, "cublasLtMatmulDescCreate");
    SYM(desc_set, "cublasLtMatmulDescSetAttribute");
    SYM(desc_destroy, "cublasLtMatmulDescDestroy");
    SYM(layout_create, "cublasLtMatrixLayoutCreate");
    SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
    SYM(pref_create, "cublasLtMatmulPreferenceCreate");
    SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute");
    SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy");
    SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    SYM(matmul, "cublasLtMatmul");
#undef SYM
    return TM_OK;
}

/* One cached plan per (n, m, k, input type, out type, bias, SM target, candidate): descriptors and the
 * heuristic's algorithm of that rank (0: its first choice). */
typedef struct blas_plan {
    int64_t n, m, k;
    bool fp8, fast, out_f32, bias; /* fp8: e4m3 x and w (else bf16); fast: fp8 fast accumulation */
    int32_t sms;                   /* CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 0: unset */
    int32_t algo_i;                /* rank of the heuristic's candidate used */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} blas_plan;

struct tm_cuda_blas {
    lt_api lt;
    cublasLtHandle_t h;
    void *ws;            /* (ws_bytes) device workspace */
    size_t ws_bytes;
    blas_plan *plans;    /* (n_plans) */
    int32_t n_plans, cap_plans;
    bool fp8_fast;       /* fp8 GEMMs with fast accumulation (tm_cuda_blas_set_fp8_fast_accum) */
    int32_t sm_target;   /* SMs the GEMMs planned from now on target, 0: the device's (tm_cuda_blas_set_sm_target) */
    int32_t algo_i;      /* the heuristic's candidate GEMMs planned from now on take (tm_cuda_blas_set_algo_index) */
};

void tm_cuda_blas_set_fp8_fast_accum(tm_cuda_blas *b, bool on) { b->fp8_fast = on; }

void tm_cuda_blas_set_sm_target(tm_cuda_blas *b, int32_t sms) { b->sm_target = sms > 0 ? sms : 0; }

void tm_cuda_blas_set_algo_index(tm_cuda_blas *b, int32_t i) {
    b->algo_i = i < 0 ? 0 : i < TM_CUDA_BLAS_MAX_ALGOS ? i : TM_CUDA_BLAS_MAX_ALGOS - 1;
}

tm_status tm_cuda_blas_create(size_t workspace_bytes, tm_cuda_blas **out, tm_error *err) {
    *out = NULL;
    tm_cuda_blas *b = tm_calloc(1, sizeof *b);
    if (!b) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_status st = lt_load(&b->lt, err);
    if (st != TM_OK) {
        free(b);
        return st;
    }
    cublasStatus_t cs = b->lt.create(&b->h);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        st = tm_err(err, TM_ERR_DEVICE, "cublasLtCreate failed: %s", b->lt.status_string(cs));
        dlclose(b->lt.lib);
        free(b);
        return st;
    }
    b->ws_bytes = workspace_bytes;
    cudaError_t ce = cudaMalloc(&b->ws, workspace_bytes);
    if (ce != cudaSuccess) {
        b->lt.destroy(b->h);
        dlclose(b->lt.lib);
        free(b);
        return tm_err(err, TM_ERR_NOMEM, "cuBLASLt workspace of %zu bytes: %s", workspace_bytes, cudaGetErrorString(ce));
    }
    *out = b;
    return TM_OK;
}

static void plan_destroy(const lt_api *lt, blas_plan *p) {
    if (p->op) lt->desc_destroy(p->op);
    if (p->la) lt->layout_destroy(p->la);
    if (p->lb) lt->layout_destroy(p->lb);
    if (p->lc) lt->layout_destroy(p->lc);
    p->op = NULL;
    p->la = p->lb = p->lc = NULL;
}

void tm_cuda_blas_free(tm_cuda_blas *b) {
    if (!b) return;
    for (int32_t i = 0; i < b->n_plans; i++) plan_destroy(&b->lt, &b->plans[i]);
    free(b->plans);
    cudaFree(b->ws);
    b->lt.destroy(b->h);
    dlclose(b->lt.lib);
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
    const lt_api *lt = &b->lt;
    LT(lt->desc_create(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(lt->desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(lt->desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (p->fp8) {
        const int8_t fast = p->fast ? 1 : 0;
        LT(lt->desc_set(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    }
    if (p->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        LT(lt->desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LT(lt->desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    /* set only when asked: without it the descriptor, and so the heuristic's choice, is what it always was */
    if (p->sms > 0) LT(lt->desc_set(p->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &p->sms, sizeof p->sms));
    /* fp8 (Hopper): A transposed, B not ("TN"), k and the leading dimensions multiples of 16, C of D's type */
    const cudaDataType_t it = p->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    LT(lt->layout_create(&p->la, it, (uint64_t)p->k, (uint64_t)p->m, p->k));
    LT(lt->layout_create(&p->lb, it, (uint64_t)p->k, (uint64_t)p->n, p->k));
    LT(lt->layout_create(&p->lc, ct, (uint64_t)p->m, (uint64_t)p->n, p->m));
    cublasLtMatmulPreference_t pref = NULL;
    LT(lt->pref_create(&pref));
    cs = lt->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &b->ws_bytes, sizeof b->ws_bytes);
    cublasLtMatmulHeuristicResult_t res[TM_CUDA_BLAS_MAX_ALGOS];
    int found = 0;
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = lt->heuristic(b->h, p->op, p->la, p->lb, p->lc, p->lc, pref, p->algo_i + 1, res, &found);
    lt->pref_destroy(pref);
    if (cs != CUBLAS_STATUS_SUCCESS) goto fail;
    if (found <= p->algo_i) {
        plan_destroy(lt, p);
        return tm_err(err, found ? TM_ERR_UNSUPPORTED : TM_ERR_DEVICE,
                      "cuBLASLt has %d %s algorithm(s) for %lld x %lld x %lld (candidate %d asked)", found,
                      p->fp8 ? "fp8" : "bf16", (long long)p->n, (long long)p->m, (long long)p->k, (int)p->algo_i);
    }
    p->algo = res[p->algo_i].algo;
    return TM_OK;
fail:
    plan_destroy(&b->lt, p);
    return tm_err(err, TM_ERR_DEVICE, "cuBLASLt plan for %lld x %lld x %lld: %s", (long long)p->n, (long long)p->m,
                  (long long)p->k, b->lt.status_string(cs));
#undef LT
}

/* out (n, m) = alpha * x · wᵀ (+ bias): the bf16 and the fp8 products */
static tm_status gemm_run(tm_cuda_blas *b, const void *x, const void *w, bool fp8, float alpha, const float *bias,
                          void *out, bool out_f32, int64_t n, int64_t m, int64_t k, cudaStream_t stream, tm_error *err) {
    blas_plan *p = NULL;
    bool want_bias = bias != NULL, fast = fp8 && b->fp8_fast;
    for (int32_t i = 0; i < b->n_plans && !p; i++) {
        blas_plan *q = &b->plans[i];
        if (q->n == n && q->m == m && q->k == k && q->fp8 == fp8 && q->fast == fast && q->out_f32 == out_f32 &&
            q->bias == want_bias && q->sms == b->sm_target && q->algo_i == b->algo_i)
            p = q;
    }
    if (!p) {
        if (b->n_plans == b->cap_plans) {
            int32_t cap = b->cap_plans ? 2 * b->cap_plans : 32;
            blas_plan *np = realloc(b->plans, (size_t)cap * sizeof *np);
            if (!np) return tm_err(err, TM_ERR_NOMEM, "out of memory");
            b->plans = np;
            b->cap_plans = cap;
        }
        blas_plan fresh = {.n = n, .m = m, .k = k, .fp8 = fp8, .fast = fast, .out_f32 = out_f32, .bias = want_bias,
                           .sms = b->sm_target, .algo_i = b->algo_i};
        tm_status s = plan_make(b, &fresh, err);
        if (s != TM_OK) return s;
        b->plans[b->n_plans++] = fresh;
        p = &b->plans[b->n_plans - 1];
    }
    if (want_bias) {
        cublasStatus_t cs = b->lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (cs != CUBLAS_STATUS_SUCCESS) return tm_err(err, TM_ERR_DEVICE, "cuBLASLt bias: %s", b->lt.status_string(cs));
    }
    const float beta = 0.0f;
    cublasStatus_t cs = b->lt.matmul(b->h, p->op, &alpha, w, p->la, x, p->lb, &beta, out, p->lc, out, p->lc, &p->algo,
                                     b->ws, b->ws_bytes, stream);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return tm_err(err, TM_ERR_DEVICE, "cublasLtMatmul %lld x %lld x %lld: %s", (long long)n, (long long)m,
                      (long long)k, b->lt.status_string(cs));
    return TM_OK;
}

tm_status tm_cuda_blas_gemm(tm_cuda_blas *b, const uint16_t *x, const uint16_t *w, const float *bias, void *out,
                            bool out_f32, int64_t n, int64_t m, int64_t k, cudaStream_t stream, tm_error *err) {
    return gemm_run(b, x, w, false, 1.0f, bias, out, out_f32, n, m, k, stream, err);
}

tm_status tm_cuda_blas_gemm_fp8(tm_cuda_blas *b, const uint8_t *xq, const uint8_t *w, float alpha, void *out,
                                bool out_f32, int64_t n, int64_t m, int64_t k, cudaStream_t stream, tm_error *err) {
    if (k % 16 || m % 16 || ((uintptr_t)xq & 15u) || ((uintptr_t)w & 15u))
        return tm_err(err, TM_ERR_UNSUPPORTED, "fp8 GEMM %lld x %lld x %lld: needs k and m multiples of 16 and 16-byte "
                      "aligned operands", (long long)n, (long long)m, (long long)k);
    return gemm_run(b, xq, w, true, alpha, NULL, out, out_f32, n, m, k, stream, err);
}
