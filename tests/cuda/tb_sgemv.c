/* tb_sgemv.c -- tm_cuda_sgemv (batch-1 bf16 products through a shared-memory ring) against a double CPU reference,
 * and a decode layer's chain of products timed with it against tm_cuda_gemv. */
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "tb_guard.h"

/* Checks (bf16 weights and x, random in [-1, 1) and [-1, 1) / sqrt(cols)):
 *  - plain products with bf16 output and with f32 output plus a bias, on the Llama-3.2-1B / Llama-3-8B shapes
 *    (2048 / 4096 / 8192 / 14336 columns: every column-segment count), few rows (2, 130: CTAs with one stage, and
 *    rows not filling a stage) and a large vocabulary-like one (32000 x 2048, f32);
 *  - a group of three jobs (q, k, v: 2048 + 512 + 512 rows) with a bias on one;
 *  - SwiGLU on 8192 x 2048 and 14336 x 4096 (and 130 rows);
 *  - q|k|v with RoPE and the cache write (1B and 8B geometry, a bf16 and an fp8 cache) against tm_cuda_gemv_qkv_rope
 *    (v2): q and the cache within 2 bf16 ulps (another summation order), everything else in the cache untouched;
 *  - each run twice: bit-identical; outputs poisoned before each run (an unwritten element fails);
 *  - refusals: 576 columns (SmolLM2: no 256-column segments), odd rows, an unaligned x.
 * The error is the relative L2 error against sum_j w[r, j] x[j] in double (tolerance 1e-2 for bf16 outputs, 1e-4
 * for f32).
 * Timing: one decode layer's chain as the backend runs it at batch 1 (add+RMSNorm, q|k|v with RoPE, an add+RMSNorm
 * in attention's place, o, add+RMSNorm, gate/up with SwiGLU, down) over 16 (1B) or 8 (8B) layers of distinct
 * weights in one CUDA graph, with tm_cuda_gemv (v2) and with tm_cuda_sgemv, µs per layer against the floor (the
 * layer's weight bytes at the copy ceiling); and the output projection (128256 rows, f32) alone. */

static double ref_dot(const float *w, const float *x, int64_t cols) {
    double s = 0.0;
    for (int64_t j = 0; j < cols; j++) s += (double)w[j] * (double)x[j];
    return s;
}

typedef struct mat {
    uint16_t *h;   /* (rows, cols) bf16 */
    float *f;      /* (rows, cols) the same values */
    void *d;
} mat;

static mat mat_make(int64_t rows, int64_t cols, float scale) {
    mat m;
    m.h = tb_xmalloc((size_t)(rows * cols) * 2);
    m.f = tb_xmalloc((size_t)(rows * cols) * sizeof(float));
    tb_fill_bf16(m.h, m.f, (size_t)(rows * cols), scale);
    m.d = tb_upload(m.h, (size_t)(rows * cols) * 2);
    return m;
}

static void mat_free(mat *m) {
    free(m->h);
    free(m->f);
    TB_CHECK(cudaFree(m->d));
}

/* one plain product (or SwiGLU when swiglu), bf16 and f32(+bias) outputs, against the double reference */
static void check_plain(int64_t rows, int64_t cols, bool swiglu) {
    tb_case("sgemv %s %lldx%lld", swiglu ? "swiglu" : "plain", (long long)rows, (long long)cols);
    mat w = mat_make(rows, cols, 1.0f), u = mat_make(swiglu ? rows : 2, cols, 1.0f);
    uint16_t *xh = tb_xmalloc((size_t)cols * 2);
    float *xf = tb_xmalloc((size_t)cols * sizeof(float)), *bias = tb_xmalloc((size_t)rows * sizeof(float));
    tb_fill_bf16(xh, xf, (size_t)cols, 1.0f / sqrtf((float)cols));
    tb_fill_f32(bias, (size_t)rows, 0.5f);
    uint16_t *x_d = tb_upload(xh, (size_t)cols * 2);
    float *bias_d = tb_upload(bias, (size_t)rows * sizeof(float));
    float *ref = tb_xmalloc((size_t)rows * sizeof(float)), *refb = tb_xmalloc((size_t)rows * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const double g = ref_dot(w.f + r * cols, xf, cols);
        if (swiglu) {
            const double v = ref_dot(u.f + r * cols, xf, cols);
            ref[r] = (float)(g / (1.0 + exp(-g)) * v);
        } else {
            ref[r] = (float)g;
            refb[r] = (float)(g + bias[r]);
        }
    }
    void *out_d = tb_dev((size_t)rows * 4);
    uint16_t *o16 = tb_xmalloc((size_t)rows * 2), *o16b = tb_xmalloc((size_t)rows * 2);
    float *o32 = tb_xmalloc((size_t)rows * 4), *o32b = tb_xmalloc((size_t)rows * 4);
    char name[96];
    for (int variant = 0; variant < (swiglu ? 1 : 2); variant++) {
        const bool f32 = variant == 1;
        tm_cuda_sgemv_args a = {.n_jobs = 1, .cols = cols, .x = x_d, .w_up = swiglu ? u.d : NULL, .out_f32 = f32};
        a.jobs[0] = (tm_cuda_sgemv_job){w.d, rows, f32 ? bias_d : NULL, out_d};
        double err = 0.0;
        bool same = true;
        for (int rep = 0; rep < 2; rep++) {
            tb_poison(out_d, (size_t)rows * 4);
            TB_RUN(tm_cuda_sgemv(&a, 0));
            if (f32) {
                tb_download(rep ? o32b : o32, out_d, (size_t)rows * 4);
                if (rep) same = memcmp(o32, o32b, (size_t)rows * 4) == 0;
            } else {
                tb_download(rep ? o16b : o16, out_d, (size_t)rows * 2);
                if (rep) same = memcmp(o16, o16b, (size_t)rows * 2) == 0;
            }
        }
        err = f32 ? tb_rel_err(o32, refb, (size_t)rows) : tb_rel_err_bf16(o16, ref, (size_t)rows);
        snprintf(name, sizeof name, "%s %lldx%lld %s", swiglu ? "swiglu" : "plain", (long long)rows, (long long)cols,
                 f32 ? "f32+b" : "bf16");
        tb_result("sgemv", name, same ? err : INFINITY, f32 ? 1e-4 : 1e-2, 0.0, 0.0, 0.0, 'm');
    }
    free(xh);
    free(xf);
    free(bias);
    free(ref);
    free(refb);
    free(o16);
    free(o16b);
    free(o32);
    free(o32b);
    mat_free(&w);
    mat_free(&u);
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(bias_d));
    TB_CHECK(cudaFree(out_d));
}

/* q, k, v as one launch of three jobs (bias on k), bf16 outputs */
static void check_group(void) {
    tb_case("sgemv group");
    const int64_t cols = 2048, rows[3] = {2048, 512, 512};
    mat w[3];
    for (int j = 0; j < 3; j++) w[j] = mat_make(rows[j], cols, 1.0f);
    uint16_t *xh = tb_xmalloc((size_t)cols * 2);
    float *xf = tb_xmalloc((size_t)cols * sizeof(float)), *bias = tb_xmalloc((size_t)rows[1] * sizeof(float));
    tb_fill_bf16(xh, xf, (size_t)cols, 1.0f / sqrtf((float)cols));
    tb_fill_f32(bias, (size_t)rows[1], 0.5f);
    uint16_t *x_d = tb_upload(xh, (size_t)cols * 2);
    float *bias_d = tb_upload(bias, (size_t)rows[1] * sizeof(float));
    tm_cuda_sgemv_args a = {.n_jobs = 3, .cols = cols, .x = x_d};
    void *out_d[3];
    for (int j = 0; j < 3; j++) {
        out_d[j] = tb_dev((size_t)rows[j] * 2);
        tb_poison(out_d[j], (size_t)rows[j] * 2);
        a.jobs[j] = (tm_cuda_sgemv_job){w[j].d, rows[j], j == 1 ? bias_d : NULL, out_d[j]};
    }
    TB_RUN(tm_cuda_sgemv(&a, 0));
    for (int j = 0; j < 3; j++) {
        float *ref = tb_xmalloc((size_t)rows[j] * sizeof(float));
        uint16_t *o = tb_xmalloc((size_t)rows[j] * 2);
        for (int64_t r = 0; r < rows[j]; r++)
            ref[r] = (float)(ref_dot(w[j].f + r * cols, xf, cols) + (j == 1 ? bias[r] : 0.0));
        tb_download(o, out_d[j], (size_t)rows[j] * 2);
        char name[64];
        snprintf(name, sizeof name, "group job %d (%lld rows)", j, (long long)rows[j]);
        tb_result("sgemv", name, tb_rel_err_bf16(o, ref, (size_t)rows[j]), 1e-2, 0.0, 0.0, 0.0, 'm');
        free(ref);
        free(o);
        TB_CHECK(cudaFree(out_d[j]));
        mat_free(&w[j]);
    }
    free(xh);
    free(xf);
    free(bias);
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(bias_d));
}

static int max_ulps(const uint16_t *a, const uint16_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        const int d = abs((int)(int16_t)a[i] - (int)(int16_t)b[i]);
        if (((a[i] ^ b[i]) & 0x8000u) && (a[i] & 0x7fffu) + (b[i] & 0x7fffu) > 4) return 1 << 20; /* signs differ */
        if (d > m) m = d;
    }
    return m;
}

/* q|k|v with RoPE and the cache write against tm_cuda_gemv_qkv_rope (v2): q and the cache within 2 ulps (bf16) or
 * equal after e4m3 rounding up to one step (fp8); the rest of the cache untouched */
static void check_rope(int n_heads, int n_kv, int hd, int64_t cols, bool fp8) {
    tb_case("sgemv rope %dx%d hd%d %s", n_heads, n_kv, hd, fp8 ? "fp8" : "bf16");
    const int64_t qd = (int64_t)n_heads * hd, kvd = (int64_t)n_kv * hd;
    const int bs = 16, n_blocks = 4;
    const size_t cache_elems = (size_t)n_blocks * n_kv * bs * hd, cache_bytes = cache_elems * (fp8 ? 1 : 2);
    mat wq = mat_make(qd, cols, 1.0f), wk = mat_make(kvd, cols, 1.0f), wv = mat_make(kvd, cols, 1.0f);
    uint16_t *xh = tb_xmalloc((size_t)cols * 2);
    float *xf = tb_xmalloc((size_t)cols * sizeof(float));
    tb_fill_bf16(xh, xf, (size_t)cols, 1.0f / sqrtf((float)cols));
    uint16_t *x_d = tb_upload(xh, (size_t)cols * 2);
    float *inv = tb_xmalloc((size_t)hd / 2 * sizeof(float));
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(500000.0f, -2.0f * (float)i / (float)hd);
    float *inv_d = tb_upload(inv, (size_t)hd / 2 * sizeof(float));
    const int32_t pos = 1234;
    const int64_t slot = 2 * bs + 5;
    int32_t *pos_d = tb_upload(&pos, sizeof pos);
    int64_t *slot_d = tb_upload(&slot, sizeof slot);
    uint16_t *q_d[2], *kc_d[2], *vc_d[2], *k_d[2], *v_d[2];
    for (int run = 0; run < 2; run++) { /* 0: v2 (tm_cuda_gemv_qkv_rope), 1: sgemv */
        q_d[run] = tb_dev((size_t)qd * 2);
        k_d[run] = tb_dev((size_t)kvd * 2);
        v_d[run] = tb_dev((size_t)kvd * 2);
        kc_d[run] = tb_dev(cache_bytes);
        vc_d[run] = tb_dev(cache_bytes);
        tb_poison(q_d[run], (size_t)qd * 2);
        tb_poison(k_d[run], (size_t)kvd * 2);
        tb_poison(v_d[run], (size_t)kvd * 2);
        TB_CHECK(cudaMemset(kc_d[run], 0x5a, cache_bytes));
        TB_CHECK(cudaMemset(vc_d[run], 0x5a, cache_bytes));
        tm_cuda_rope_args r = {.n_tokens = 1, .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .rope_dim = hd,
                               .block_size = bs, .inv_freq = inv_d, .positions = pos_d, .slot_mapping = slot_d,
                               .k_cache = kc_d[run], .v_cache = vc_d[run], .kv_fp8 = fp8};
        if (run == 0) {
            const tm_cuda_gemv_job jobs[3] = {{wq.d, qd, NULL, q_d[0], 0, 0}, {wk.d, kvd, NULL, k_d[0], 0, 0},
                                              {wv.d, kvd, NULL, v_d[0], 0, 0}};
            TB_RUN(tm_cuda_gemv_qkv_rope(jobs, TM_DT_BF16, cols, x_d, 1, &r, 0));
        } else {
            tm_cuda_sgemv_args a = {.n_jobs = 3, .cols = cols, .x = x_d, .rope = &r};
            a.jobs[0] = (tm_cuda_sgemv_job){wq.d, qd, NULL, q_d[1]};
            a.jobs[1] = (tm_cuda_sgemv_job){wk.d, kvd, NULL, k_d[1]};
            a.jobs[2] = (tm_cuda_sgemv_job){wv.d, kvd, NULL, v_d[1]};
            TB_RUN(tm_cuda_sgemv(&a, 0));
        }
    }
    uint16_t *qa = tb_xmalloc((size_t)qd * 2), *qb = tb_xmalloc((size_t)qd * 2);
    uint16_t *ka = tb_xmalloc((size_t)kvd * 2), *kb = tb_xmalloc((size_t)kvd * 2);
    uint8_t *ca = tb_xmalloc(cache_bytes), *cb = tb_xmalloc(cache_bytes);
    tb_download(qa, q_d[0], (size_t)qd * 2);
    tb_download(qb, q_d[1], (size_t)qd * 2);
    int ulps = max_ulps(qa, qb, (size_t)qd);
    for (int which = 0; which < 2; which++) { /* k, v rows unrotated */
        tb_download(ka, which ? v_d[0] : k_d[0], (size_t)kvd * 2);
        tb_download(kb, which ? v_d[1] : k_d[1], (size_t)kvd * 2);
        const int u = max_ulps(ka, kb, (size_t)kvd);
        if (u > ulps) ulps = u;
    }
    int bad_cache = 0;
    for (int which = 0; which < 2; which++) {
        tb_download(ca, which ? vc_d[0] : kc_d[0], cache_bytes);
        tb_download(cb, which ? vc_d[1] : kc_d[1], cache_bytes);
        const size_t es = fp8 ? 1 : 2;
        for (size_t i = 0; i < cache_elems; i++) {
            const int64_t blk = (int64_t)(i / ((size_t)n_kv * bs * hd)), off = (int64_t)(i / (size_t)hd) % bs;
            const bool in_slot = blk * bs + off == slot;
            if (!in_slot) {
                if (memcmp(ca + i * es, cb + i * es, es) != 0 || cb[i * es] != 0x5a) bad_cache++;
                continue;
            }
            if (fp8) {
                if (abs((int)ca[i] - (int)cb[i]) > 1 || ((ca[i] ^ cb[i]) & 0x80)) bad_cache++;
            } else {
                uint16_t a16, b16;
                memcpy(&a16, ca + i * 2, 2);
                memcpy(&b16, cb + i * 2, 2);
                if (max_ulps(&a16, &b16, 1) > 2) bad_cache++;
            }
        }
    }
    char name[80];
    snprintf(name, sizeof name, "rope %dx%d hd%d %s: ulps %d, cache bad %d", n_heads, n_kv, hd, fp8 ? "fp8" : "bf16",
             ulps, bad_cache);
    tb_result("sgemv", name, ulps <= 2 && bad_cache == 0 ? 0.0 : INFINITY, 0.0, 0.0, 0.0, 0.0, 'm');
    for (int run = 0; run < 2; run++) {
        TB_CHECK(cudaFree(q_d[run]));
        TB_CHECK(cudaFree(k_d[run]));
        TB_CHECK(cudaFree(v_d[run]));
        TB_CHECK(cudaFree(kc_d[run]));
        TB_CHECK(cudaFree(vc_d[run]));
    }
    free(qa);
    free(qb);
    free(ka);
    free(kb);
    free(ca);
    free(cb);
    free(xh);
    free(xf);
    free(inv);
    mat_free(&wq);
    mat_free(&wk);
    mat_free(&wv);
    TB_CHECK(cudaFree(x_d));
    TB_CHECK(cudaFree(inv_d));
    TB_CHECK(cudaFree(pos_d));
    TB_CHECK(cudaFree(slot_d));
}

static void check_refusals(void) {
    tb_case("sgemv refusals");
    uint16_t *w = tb_dev((size_t)8 * 4096 * 2 + 16), *x = tb_dev(4096 * 2 + 16), *o = tb_dev(64);
    int bad = 0;
    tm_cuda_sgemv_args a = {.n_jobs = 1, .cols = 576, .x = x};
    a.jobs[0] = (tm_cuda_sgemv_job){w, 8, NULL, o};
    bad += tm_cuda_sgemv(&a, 0) != cudaErrorNotSupported; /* 576 columns */
    a.cols = 2048;
    a.jobs[0].rows = 7;
    bad += tm_cuda_sgemv(&a, 0) != cudaErrorNotSupported; /* odd rows */
    a.jobs[0].rows = 8;
    a.x = x + 1;
    bad += tm_cuda_sgemv(&a, 0) != cudaErrorNotSupported; /* unaligned x */
    a.x = x;
    a.jobs[0].w = w + 1;
    bad += tm_cuda_sgemv(&a, 0) != cudaErrorNotSupported; /* unaligned w */
    TB_CHECK(cudaDeviceSynchronize());
    tb_result("sgemv", "refusals", bad ? INFINITY : 0.0, 0.0, 0.0, 0.0, 0.0, 'm');
    TB_CHECK(cudaFree(w));
    TB_CHECK(cudaFree(x));
    TB_CHECK(cudaFree(o));
}

/* ---- timing ---------------------------------------------------------------------------------------------------- */

static double graph_replay_us(cudaGraph_t g, cudaStream_t s) {
    cudaGraphExec_t ge;
    TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
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
    TB_CHECK(cudaGraphExecDestroy(ge));
    TB_CHECK(cudaGraphDestroy(g));
    return (double)ms[REPS / 2] * 1000.0;
}

/* The chain of a batch-1 decode layer (see the top), `layers` layers of distinct weights in one graph. */
static void time_chain(const char *label, int64_t dim, int n_heads, int n_kv, int hd, int64_t ffn, int layers,
                       bool sg) {
    if (!tb_budget_ok()) return;
    tb_case("time chain %s %s", label, sg ? "sgemv" : "v2");
    enum { MAX_LAYERS = 16, NW = 7 };
    const int64_t qd = (int64_t)n_heads * hd, kvd = (int64_t)n_kv * hd;
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
    float *res = tb_dev((size_t)dim * 4), *nw = tb_dev((size_t)dim * 4), *inv = tb_dev((size_t)hd * 2);
    uint16_t *xn = tb_dev((size_t)dim * 2), *o = tb_dev((size_t)dim * 2);
    uint16_t *q = tb_dev((size_t)wide * 2), *h = tb_dev((size_t)wide * 2);
    uint16_t *kc = tb_dev((size_t)64 * kvd * 2), *vc = tb_dev((size_t)64 * kvd * 2);
    int32_t *pos = tb_dev(4);
    int64_t *slot = tb_dev(8);
    TB_CHECK(cudaMemset(res, 0, (size_t)dim * 4));
    TB_CHECK(cudaMemset(nw, 0, (size_t)dim * 4));
    TB_CHECK(cudaMemset(o, 0, (size_t)dim * 2));
    TB_CHECK(cudaMemset(inv, 0, (size_t)hd * 2));
    TB_CHECK(cudaMemset(pos, 0, 4));
    TB_CHECK(cudaMemset(slot, 0, 8));
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TB_CHECK(cudaDeviceSynchronize());
    cudaGraph_t g;
    int n_sm = 0;
    TB_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    unsigned long long *trace = NULL;
    const bool tracing = sg && getenv("TB_SGEMV_TRACE") && !strcmp(label, "1b");
    if (tracing) {
        trace = tb_dev((size_t)layers * 4 * (size_t)n_sm * 4 * 8);
        TB_CHECK(cudaMemset(trace, 0, (size_t)layers * 4 * (size_t)n_sm * 4 * 8));
        tm_cuda_sgemv_trace(trace, layers * 4, n_sm * 4);
    }
    TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < layers; l++) {
        tm_cuda_rope_args r = {.n_tokens = 1, .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd,
                               .rope_dim = hd, .block_size = 16, .inv_freq = inv, .positions = pos,
                               .slot_mapping = slot, .k_cache = kc, .v_cache = vc};
        TB_CHECK(tm_cuda_add_rmsnorm(res, o, nw, 1e-5f, 1, (int32_t)dim, xn, s));
        if (sg) {
            tm_cuda_sgemv_args a = {.n_jobs = 3, .cols = dim, .x = xn, .rope = &r};
            a.jobs[0] = (tm_cuda_sgemv_job){w[l][0], qd, NULL, q};
            a.jobs[1] = (tm_cuda_sgemv_job){w[l][1], kvd, NULL, NULL};
            a.jobs[2] = (tm_cuda_sgemv_job){w[l][2], kvd, NULL, NULL};
            TB_CHECK(tm_cuda_sgemv(&a, s));
        } else {
            const tm_cuda_gemv_job qkv[3] = {
                {w[l][0], qd, NULL, q, 0, 0}, {w[l][1], kvd, NULL, NULL, 0, 0}, {w[l][2], kvd, NULL, NULL, 0, 0}};
            TB_CHECK(tm_cuda_gemv_qkv_rope(qkv, TM_DT_BF16, dim, xn, 1, &r, s));
        }
        TB_CHECK(tm_cuda_add_rmsnorm(res, o, nw, 1e-5f, 1, (int32_t)dim, xn, s)); /* in attention's place */
        if (sg) {
            tm_cuda_sgemv_args a = {.n_jobs = 1, .cols = qd, .x = q};
            a.jobs[0] = (tm_cuda_sgemv_job){w[l][3], dim, NULL, o};
            TB_CHECK(tm_cuda_sgemv(&a, s));
        } else {
            TB_CHECK(tm_cuda_gemv(w[l][3], TM_DT_BF16, dim, qd, q, 1, NULL, o, false, NULL, s));
        }
        TB_CHECK(tm_cuda_add_rmsnorm(res, o, nw, 1e-5f, 1, (int32_t)dim, xn, s));
        if (sg) {
            tm_cuda_sgemv_args a = {.n_jobs = 1, .cols = dim, .x = xn, .w_up = w[l][5]};
            a.jobs[0] = (tm_cuda_sgemv_job){w[l][4], ffn, NULL, h};
            TB_CHECK(tm_cuda_sgemv(&a, s));
            tm_cuda_sgemv_args d = {.n_jobs = 1, .cols = ffn, .x = h};
            d.jobs[0] = (tm_cuda_sgemv_job){w[l][6], dim, NULL, o};
            TB_CHECK(tm_cuda_sgemv(&d, s));
        } else {
            TB_CHECK(tm_cuda_gemv_swiglu(w[l][4], w[l][5], TM_DT_BF16, ffn, dim, xn, 1, h, NULL, s));
            TB_CHECK(tm_cuda_gemv(w[l][6], TM_DT_BF16, dim, ffn, h, 1, NULL, o, false, NULL, s));
        }
    }
    TB_CHECK(cudaStreamEndCapture(s, &g));
    tm_cuda_sgemv_trace(NULL, 0, 0);
    const double us = graph_replay_us(g, s) / layers;
    if (tracing) { /* per launch: CTA start (min..max), x visible, first stage full, producer done (max), in us from
                    * the first launch's first start */
        const int nl = layers * 4;
        unsigned long long *h = tb_xmalloc((size_t)nl * n_sm * 4 * 8);
        tb_download(h, trace, (size_t)nl * n_sm * 4 * 8);
        unsigned long long t0 = ~0ull;
        for (int c = 0; c < n_sm; c++)
            if (h[c * 4] && h[c * 4] < t0) t0 = h[c * 4];
        const char *nm[4] = {"qkv", "o", "gu", "down"};
        for (int k = 0; k < nl && k < 12; k++) {
            unsigned long long mn[4] = {~0ull, ~0ull, ~0ull, ~0ull}, mx[4] = {0, 0, 0, 0};
            for (int c = 0; c < n_sm; c++)
                for (int f = 0; f < 4; f++) {
                    const unsigned long long v = h[((size_t)k * n_sm + c) * 4 + f];
                    if (!v) continue;
                    if (v < mn[f]) mn[f] = v;
                    if (v > mx[f]) mx[f] = v;
                }
            printf("# trace %2d %-4s start %7.2f..%7.2f  xvis %7.2f..%7.2f  full0 %7.2f..%7.2f  done %7.2f..%7.2f\n", k,
                   nm[k % 4], (mn[0] - t0) / 1e3, (mx[0] - t0) / 1e3, (mn[1] - t0) / 1e3, (mx[1] - t0) / 1e3,
                   (mn[2] - t0) / 1e3, (mx[2] - t0) / 1e3, (mn[3] - t0) / 1e3, (mx[3] - t0) / 1e3);
        }
        free(h);
        TB_CHECK(cudaFree(trace));
    }
    const double floor_us = layer_bytes / (tb_env_d("TM_CEIL_COPY_GBS", 4300.0) * 1e3);
    char name[96];
    snprintf(name, sizeof name, "%s chain %s (floor %.1f us)", label, sg ? "sgemv" : "v2", floor_us);
    tb_result("sgemv_chain", name, 0.0, 0.0, us, layer_bytes, 0.0, 'm');
    printf("# key %s %.2f us\n", name, us);
    TB_CHECK(cudaStreamDestroy(s));
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < NW; k++) TB_CHECK(cudaFree(w[l][k]));
    void *bufs[] = {res, nw, inv, xn, o, q, h, kc, vc, pos, slot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) TB_CHECK(cudaFree(bufs[i]));
}

/* the output projection (rows x cols, f32 out) alone, 4 launches over 2 copies in a graph */
static void time_head(const char *label, int64_t rows, int64_t cols, bool sg) {
    if (!tb_budget_ok()) return;
    tb_case("time head %s %s", label, sg ? "sgemv" : "v2");
    void *w[2];
    for (int i = 0; i < 2; i++) {
        w[i] = tb_dev((size_t)(rows * cols * 2));
        TB_CHECK(cudaMemset(w[i], 0x11, (size_t)(rows * cols * 2)));
    }
    uint16_t *x = tb_dev((size_t)cols * 2);
    float *out = tb_dev((size_t)rows * 4);
    TB_CHECK(cudaMemset(x, 0, (size_t)cols * 2));
    cudaStream_t s;
    TB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    TB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 4; i++) {
        if (sg) {
            tm_cuda_sgemv_args a = {.n_jobs = 1, .cols = cols, .x = x, .out_f32 = true};
            a.jobs[0] = (tm_cuda_sgemv_job){w[i & 1], rows, NULL, out};
            TB_CHECK(tm_cuda_sgemv(&a, s));
        } else {
            TB_CHECK(tm_cuda_gemv(w[i & 1], TM_DT_BF16, rows, cols, x, 1, NULL, out, true, NULL, s));
        }
    }
    TB_CHECK(cudaStreamEndCapture(s, &g));
    const double us = graph_replay_us(g, s) / 4;
    char name[96];
    snprintf(name, sizeof name, "%s head %s", label, sg ? "sgemv" : "v2");
    tb_result("sgemv_head", name, 0.0, 0.0, us, (double)(rows * cols * 2), 0.0, 'm');
    printf("# key %s %.2f us\n", name, us);
    TB_CHECK(cudaStreamDestroy(s));
    for (int i = 0; i < 2; i++) TB_CHECK(cudaFree(w[i]));
    TB_CHECK(cudaFree(x));
    TB_CHECK(cudaFree(out));
}

int main(void) {
    tb_guard_init(40);
    tb_seed();
    const bool time_only = getenv("TB_SGEMV_TIME_ONLY") != NULL;
    if (!time_only) {
    const int64_t plain[][2] = {{2048, 2048}, {512, 2048}, {2048, 8192}, {4096, 4096}, {1024, 4096},
                                {4096, 14336}, {130, 2048}, {2, 4096}, {32000, 2048}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) check_plain(plain[i][0], plain[i][1], false);
    const int64_t sw[][2] = {{8192, 2048}, {14336, 4096}, {130, 2048}};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) check_plain(sw[i][0], sw[i][1], true);
    check_group();
    check_rope(32, 8, 64, 2048, false);
    check_rope(32, 8, 64, 2048, true);
    check_rope(32, 8, 128, 4096, false);
    check_refusals();
    }
    for (int sg = 0; sg < 2; sg++) time_chain("1b", 2048, 32, 8, 64, 8192, 16, sg);
    for (int sg = 0; sg < 2; sg++) time_chain("8b", 4096, 32, 8, 128, 14336, 8, sg);
    if (!time_only) {
        for (int sg = 0; sg < 2; sg++) time_chain("1b", 2048, 32, 8, 64, 8192, 16, sg);
        for (int sg = 0; sg < 2; sg++) time_head("1b", 128256, 2048, sg);
        for (int sg = 0; sg < 2; sg++) time_head("8b", 128256, 4096, sg);
    }
    return tb_finish("tb_sgemv");
}
