/* tb_layer.c -- tm_cuda_layer_decode (one whole Llama decoder layer, batch-1 decode) against a double CPU reference. */
#include "backend/cuda/tm_cuda_kernels.h"
#include "tb_common.h"
#include "tb_guard.h"

/* Llama-3.2-1B and Llama-3-8B layer shapes (bf16 weights, cache blocks of 16), contexts of 1, 17, 100, 384, 1000
 * and 4096 entries (this token's included; RoPE position ctx - 1) and ctx 100 at position 105 (RoPE position past
 * the cache index). Per case: "<shape>_ctx<N>" x_out - x_in against the reference's x2 - x (rel L2, 1e-2); "kv" the
 * token's new K (rotated) and V rows (1e-2); "q+att+h" the scratch, documented to hold the layer's values (2e-2);
 * "exact" the count of bitwise differences: every other cache element (past entries, the NaN slots after the
 * token's, spare blocks) unchanged, and x_out, att, h of 4 more runs on the same inputs (pdl on, off, on, off; the
 * work buffer never re-zeroed, so its counters must come back reusable) equal to the first (pdl off) run's.
 * The block table maps logical blocks to a shuffled pool with spare blocks; its entries past the context name a
 * block far out of range and the slots after the token's in its block hold NaN, so reading past the context
 * fails. Before each launch x is re-uploaded, the token's slot (K and V, every kv head) and q, att, h are poisoned.
 * The reference (double) rounds where the header says the kernel does: xb, q, k, v, rotated q and k, att, o, xb2,
 * h, d to bf16; gate and up not; residual adds in f32; RoPE with the f32 angle pos * inv_freq[j], cos/sin in double.
 * Timing (ctx 384, while tb_budget_ok; any argument: checks only): single launches (median of 50 after 5 warm-ups,
 * bytes = the layer's bf16 weights) and per layer in a CUDA graph of 16 chained pdl launches, then block 0's phases
 * (clock64) and every block's phase ends (%globaltimer: how long each grid barrier waits for its slowest block).
 * tb_guard.h: CASE lines, checked allocations, watchdog, TB_BUDGET_S (default 30 s). */

#define BS 16          /* cache block size */
#define EPS 1e-5f
#define CHAIN 16       /* launches per graph in the chained timing */
#define FAR 0x40000000 /* block-table entries past the context: far out of range */

typedef struct shape {
    const char *name;
    int dim, ffn, H, KV, hd, rope_dim;
} shape;

enum { WQ, WK, WV, WO, WGATE, WUP, WDOWN, NW };

typedef struct layer { /* one layer's parameters, host and device */
    const shape *s;
    int64_t rows[NW], cols[NW];
    uint16_t *w[NW], *w_d[NW];   /* (rows[i], cols[i]) bf16: wq, wk, wv, wo, w_gate, w_up, w_down */
    float *attn_norm, *ffn_norm; /* (dim) */
    float *inv_freq;             /* (rope_dim / 2) */
    float *attn_norm_d, *ffn_norm_d, *inv_freq_d;
    float scale;                 /* 1 / sqrt(head_dim) */
    void *work_d;                /* (work_bytes) zeroed once, at allocation */
    size_t work_bytes;
    double weight_bytes;         /* the seven bf16 matrices */
} layer;

typedef struct lcase { /* one context: inputs, device buffers, reference */
    int ctx, pos, nb, max_blocks;
    int64_t n_blocks, slot;
    size_t pool;                 /* elements of one cache: n_blocks * KV * BS * hd */
    float *x;                    /* (dim) the input residual */
    uint16_t *kc, *vc;           /* (n_blocks, KV, BS, hd) bf16 as uploaded (the token's slot and later: 0xFFFF) */
    int32_t *tbl;                /* (max_blocks) logical -> physical block */
    float *x_d;                  /* (dim) */
    uint16_t *kc_d, *vc_d;       /* (n_blocks, KV, BS, hd) */
    uint16_t *q_d, *att_d, *h_d; /* (H * hd), (H * hd), (ffn) scratch */
    int32_t *tbl_d, *pos_d, *ctx_d; /* (max_blocks), (1), (1) */
    int64_t *slot_d;             /* (1) */
    float *r_delta;              /* (dim) reference x2 - x */
    float *r_q, *r_att;          /* (H * hd) reference rotated q, attention output */
    float *r_k, *r_v;            /* (KV * hd) reference new cache rows */
    float *r_h;                  /* (ffn) reference silu(g) * u */
} lcase;

/* element offset of (slot, kv head g) in a cache: ((block * KV + g) * BS + offset) * hd */
static size_t row_off(const shape *s, int64_t slot, int g) {
    return (((size_t)(slot / BS) * (size_t)s->KV + (size_t)g) * BS + (size_t)(slot % BS)) * (size_t)s->hd;
}
static int64_t phys(const lcase *c, int t) { return (int64_t)c->tbl[t / BS] * BS + t % BS; }

/* elements of es bytes that differ bitwise */
static size_t ndiff(const void *a, const void *b, size_t n, size_t es) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0;
    return bad;
}

/* ---- the CPU reference (double) --------------------------------------------------------------------------------- */

static double bfr(double v) { return tb_bf16_to_f32(tb_f32_to_bf16((float)v)); }
static void to_f32(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

/* out (rows) = w (rows, cols) bf16 . x, rounded to bf16 when `round` */
static void ref_mv(const uint16_t *w, int64_t rows, int64_t cols, const double *x, bool round, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *wr = w + (size_t)r * (size_t)cols;
        double s = 0.0;
        for (int64_t j = 0; j < cols; j++) s += (double)tb_bf16_to_f32(wr[j]) * x[j];
        out[r] = round ? bfr(s) : s;
    }
}

/* out (dim) = bf16(x / sqrt(mean(x^2) + eps) * w) */
static void ref_norm(const float *x, const float *w, int dim, double *out) {
    double ss = 0.0;
    for (int j = 0; j < dim; j++) ss += (double)x[j] * x[j];
    const double r = 1.0 / sqrt(ss / dim + EPS);
    for (int j = 0; j < dim; j++) out[j] = bfr(x[j] * r * w[j]);
}

/* llama RoPE on n_heads heads (bf16 values) of v: pairs (2j, 2j + 1), f32 angle, double cos/sin, bf16 result */
static void ref_rope(double *v, int n_heads, int hd, int rope_dim, const float *inv, int pos) {
    for (int h = 0; h < n_heads; h++)
        for (int j = 0; j < rope_dim / 2; j++) {
            const float th = (float)pos * inv[j];
            const double cs = cos((double)th), sn = sin((double)th);
            double *p = v + (size_t)h * hd + 2 * j;
            const double a = p[0], b = p[1];
            p[0] = bfr(a * cs - b * sn);
            p[1] = bfr(a * sn + b * cs);
        }
}

/* row (hd) = cache entry t of kv head g: the pool's values, or the token's new row (from nw (KV * hd)) */
static void kv_row(const lcase *c, const shape *s, const uint16_t *cache, const double *nw, int t, int g,
                   double *row) {
    if (t == c->ctx - 1) {
        memcpy(row, nw + (size_t)g * s->hd, (size_t)s->hd * sizeof(double));
        return;
    }
    const uint16_t *p = cache + row_off(s, phys(c, t), g);
    for (int d = 0; d < s->hd; d++) row[d] = tb_bf16_to_f32(p[d]);
}

static void ref_layer(const layer *L, lcase *c) {
    const shape *s = L->s;
    const size_t dim = (size_t)s->dim, qd = (size_t)s->H * s->hd, kd = (size_t)s->KV * s->hd, ffn = (size_t)s->ffn;
    const int hd = s->hd, ctx = c->ctx, grp = s->H / s->KV;
    double *xb = tb_xmalloc((2 * dim + 2 * qd + 2 * kd + ffn + (size_t)ctx + (size_t)hd) * sizeof(double));
    double *od = xb + dim, *q = od + dim, *k = q + qd, *v = k + kd, *att = v + kd, *hh = att + qd;
    double *sc = hh + ffn, *row = sc + ctx;         /* (ctx) scores, (hd) a cache row */
    float *x1 = tb_xmalloc(dim * sizeof(float));    /* (dim) residual after attention */
    /* A: norm, q/k/v, RoPE */
    ref_norm(c->x, L->attn_norm, s->dim, xb);
    ref_mv(L->w[WQ], L->rows[WQ], L->cols[WQ], xb, true, q);
    ref_mv(L->w[WK], L->rows[WK], L->cols[WK], xb, true, k);
    ref_mv(L->w[WV], L->rows[WV], L->cols[WV], xb, true, v);
    ref_rope(q, s->H, hd, s->rope_dim, L->inv_freq, c->pos);
    ref_rope(k, s->KV, hd, s->rope_dim, L->inv_freq, c->pos);
    /* B: attention of each q head over its kv head's entries 0 .. ctx - 1 */
    for (int h = 0; h < s->H; h++) {
        const int g = h / grp;
        const double *qh = q + (size_t)h * hd;
        double mx = -INFINITY, sum = 0.0, *acc = att + (size_t)h * hd;
        for (int t = 0; t < ctx; t++) {
            kv_row(c, s, c->kc, k, t, g, row);
            double dot = 0.0;
            for (int d = 0; d < hd; d++) dot += qh[d] * row[d];
            sc[t] = dot * (double)L->scale;
            if (sc[t] > mx) mx = sc[t];
        }
        for (int d = 0; d < hd; d++) acc[d] = 0.0;
        for (int t = 0; t < ctx; t++) {
            const double p = exp(sc[t] - mx);
            sum += p;
            kv_row(c, s, c->vc, v, t, g, row);
            for (int d = 0; d < hd; d++) acc[d] += p * row[d];
        }
        for (int d = 0; d < hd; d++) acc[d] = bfr(acc[d] / sum);
    }
    /* C: o projection, residual add (f32) */
    ref_mv(L->w[WO], L->rows[WO], L->cols[WO], att, true, od);
    for (size_t i = 0; i < dim; i++) x1[i] = c->x[i] + (float)od[i];
    /* D: norm, gate/up (unrounded), SwiGLU rounded */
    ref_norm(x1, L->ffn_norm, s->dim, xb);
    for (size_t i = 0; i < ffn; i++) {
        double gu[2];
        ref_mv(L->w[WGATE] + i * dim, 1, s->dim, xb, false, &gu[0]);
        ref_mv(L->w[WUP] + i * dim, 1, s->dim, xb, false, &gu[1]);
        hh[i] = bfr(gu[0] / (1.0 + exp(-gu[0])) * gu[1]);
    }
    /* E: down projection, residual add (f32) */
    ref_mv(L->w[WDOWN], L->rows[WDOWN], L->cols[WDOWN], hh, true, od);
    for (size_t i = 0; i < dim; i++) c->r_delta[i] = (float)((double)(x1[i] + (float)od[i]) - (double)c->x[i]);
    to_f32(c->r_q, q, qd);
    to_f32(c->r_att, att, qd);
    to_f32(c->r_k, k, kd);
    to_f32(c->r_v, v, kd);
    to_f32(c->r_h, hh, ffn);
    free(xb);
    free(x1);
}

/* ---- set-up --------------------------------------------------------------------------------------------------- */

static void make_layer(layer *L, const shape *s) {
    memset(L, 0, sizeof *L);
    L->s = s;
    const int64_t qd = (int64_t)s->H * s->hd, kd = (int64_t)s->KV * s->hd;
    const int64_t rows[NW] = {qd, kd, kd, s->dim, s->ffn, s->ffn, s->dim};
    const int64_t cols[NW] = {s->dim, s->dim, s->dim, qd, s->dim, s->dim, s->ffn};
    for (int i = 0; i < NW; i++) {
        const size_t n = (size_t)rows[i] * (size_t)cols[i];
        L->rows[i] = rows[i];
        L->cols[i] = cols[i];
        L->w[i] = tb_xmalloc(n * sizeof(uint16_t));
        tb_fill_bf16(L->w[i], NULL, n, 0.02f);
        L->w_d[i] = tb_upload(L->w[i], n * sizeof(uint16_t));
        L->weight_bytes += 2.0 * (double)n;
    }
    L->attn_norm = tb_xmalloc((size_t)s->dim * sizeof(float));
    L->ffn_norm = tb_xmalloc((size_t)s->dim * sizeof(float));
    for (int j = 0; j < s->dim; j++) {
        L->attn_norm[j] = 1.0f + 0.1f * tb_normal();
        L->ffn_norm[j] = 1.0f + 0.1f * tb_normal();
    }
    L->inv_freq = tb_xmalloc((size_t)(s->rope_dim / 2) * sizeof(float));
    for (int j = 0; j < s->rope_dim / 2; j++) L->inv_freq[j] = (float)pow(500000.0, -2.0 * j / s->rope_dim);
    L->attn_norm_d = tb_upload(L->attn_norm, (size_t)s->dim * sizeof(float));
    L->ffn_norm_d = tb_upload(L->ffn_norm, (size_t)s->dim * sizeof(float));
    L->inv_freq_d = tb_upload(L->inv_freq, (size_t)(s->rope_dim / 2) * sizeof(float));
    L->scale = 1.0f / sqrtf((float)s->hd);
    L->work_bytes = tm_cuda_layer_work_bytes(s->H, s->hd);
    L->work_d = tb_dev(L->work_bytes);
    TB_CHECK(cudaMemset(L->work_d, 0, L->work_bytes ? L->work_bytes : 1));
    TB_CHECK(cudaDeviceSynchronize());
}

static void free_layer(layer *L) {
    for (int i = 0; i < NW; i++) {
        free(L->w[i]);
        TB_CHECK(cudaFree(L->w_d[i]));
    }
    void *dev[] = {L->attn_norm_d, L->ffn_norm_d, L->inv_freq_d, L->work_d};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) TB_CHECK(cudaFree(dev[i]));
    free(L->attn_norm);
    free(L->ffn_norm);
    free(L->inv_freq);
}

static void build(const layer *L, lcase *c, int ctx, int pos) {
    const shape *s = L->s;
    const size_t qd = (size_t)s->H * s->hd, kd = (size_t)s->KV * s->hd;
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->pos = pos;
    c->nb = (ctx + BS - 1) / BS;
    c->max_blocks = c->nb + 2;
    c->n_blocks = c->nb + 3; /* spare blocks the table never names */
    c->pool = (size_t)c->n_blocks * (size_t)s->KV * BS * (size_t)s->hd;
    c->x = tb_xmalloc((size_t)s->dim * sizeof(float));
    tb_fill_f32(c->x, (size_t)s->dim, 1.0f);
    c->kc = tb_xmalloc(c->pool * sizeof(uint16_t));
    c->vc = tb_xmalloc(c->pool * sizeof(uint16_t));
    tb_fill_bf16(c->kc, NULL, c->pool, 1.0f);
    tb_fill_bf16(c->vc, NULL, c->pool, 1.0f);
    int32_t *perm = tb_xmalloc((size_t)c->n_blocks * sizeof(int32_t)); /* (n_blocks) shuffled block ids */
    for (int64_t i = 0; i < c->n_blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = c->n_blocks - 1; i > 0; i--) {
        const int64_t j = (int64_t)(tb_rand_u64() % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    c->tbl = tb_xmalloc((size_t)c->max_blocks * sizeof(int32_t));
    for (int i = 0; i < c->max_blocks; i++) c->tbl[i] = i < c->nb ? perm[i] : FAR;
    free(perm);
    c->slot = phys(c, ctx - 1);
    /* the token's slot and the slots after it in its block: NaN (no kernel may read them before writing) */
    for (int t = ctx - 1; t < c->nb * BS; t++)
        for (int g = 0; g < s->KV; g++) {
            memset(c->kc + row_off(s, phys(c, t), g), 0xFF, (size_t)s->hd * sizeof(uint16_t));
            memset(c->vc + row_off(s, phys(c, t), g), 0xFF, (size_t)s->hd * sizeof(uint16_t));
        }
    c->x_d = tb_dev((size_t)s->dim * sizeof(float));
    c->kc_d = tb_upload(c->kc, c->pool * sizeof(uint16_t));
    c->vc_d = tb_upload(c->vc, c->pool * sizeof(uint16_t));
    c->q_d = tb_dev(qd * sizeof(uint16_t));
    c->att_d = tb_dev(qd * sizeof(uint16_t));
    c->h_d = tb_dev((size_t)s->ffn * sizeof(uint16_t));
    c->tbl_d = tb_upload(c->tbl, (size_t)c->max_blocks * sizeof(int32_t));
    c->pos_d = tb_upload(&c->pos, sizeof(int32_t));
    c->ctx_d = tb_upload(&c->ctx, sizeof(int32_t));
    c->slot_d = tb_upload(&c->slot, sizeof(int64_t));
    c->r_delta = tb_xmalloc(((size_t)s->dim + 2 * qd + 2 * kd + (size_t)s->ffn) * sizeof(float)); /* r_*, one block */
    c->r_q = c->r_delta + s->dim;
    c->r_att = c->r_q + qd;
    c->r_k = c->r_att + qd;
    c->r_v = c->r_k + kd;
    c->r_h = c->r_v + kd;
}

static void release(lcase *c) {
    void *dev[] = {c->x_d, c->kc_d, c->vc_d, c->q_d, c->att_d, c->h_d, c->tbl_d, c->pos_d, c->ctx_d, c->slot_d};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) TB_CHECK(cudaFree(dev[i]));
    void *host[] = {c->x, c->kc, c->vc, c->tbl, c->r_delta};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

static tm_cuda_layer_args args_of(const layer *L, const lcase *c, bool pdl) {
    const shape *s = L->s;
    return (tm_cuda_layer_args){
        .dim = s->dim, .ffn_dim = s->ffn, .n_heads = s->H, .n_kv_heads = s->KV, .head_dim = s->hd,
        .rope_dim = s->rope_dim, .block_size = BS, .max_blocks = c->max_blocks, .eps = EPS, .attn_scale = L->scale,
        .wq = L->w_d[WQ], .wk = L->w_d[WK], .wv = L->w_d[WV], .wo = L->w_d[WO], .w_gate = L->w_d[WGATE],
        .w_up = L->w_d[WUP], .w_down = L->w_d[WDOWN], .attn_norm = L->attn_norm_d, .ffn_norm = L->ffn_norm_d,
        .inv_freq = L->inv_freq_d, .position = c->pos_d, .slot = c->slot_d, .context_len = c->ctx_d,
        .block_table = c->tbl_d, .k_cache = c->kc_d, .v_cache = c->vc_d, .x = c->x_d, .q = c->q_d, .att = c->att_d,
        .h = c->h_d, .work = L->work_d, .pdl = pdl};
}

/* x re-uploaded, the token's cache slot and the scratch poisoned, then one launch on s (synchronized) */
static cudaError_t launch(const layer *L, lcase *c, bool pdl, cudaStream_t st) {
    const shape *s = L->s;
    const size_t qd = (size_t)s->H * s->hd;
    TB_CHECK(cudaMemcpy(c->x_d, c->x, (size_t)s->dim * sizeof(float), cudaMemcpyHostToDevice));
    for (int g = 0; g < s->KV; g++) {
        tb_poison(c->kc_d + row_off(s, c->slot, g), (size_t)s->hd * sizeof(uint16_t));
        tb_poison(c->vc_d + row_off(s, c->slot, g), (size_t)s->hd * sizeof(uint16_t));
    }
    tb_poison(c->q_d, qd * sizeof(uint16_t));
    tb_poison(c->att_d, qd * sizeof(uint16_t));
    tb_poison(c->h_d, (size_t)s->ffn * sizeof(uint16_t));
    TB_CHECK(cudaDeviceSynchronize()); /* the legacy-stream copies and memsets are done before s starts */
    const tm_cuda_layer_args a = args_of(L, c, pdl);
    const cudaError_t e = tm_cuda_layer_decode(&a, st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
    }
    TB_CHECK(cudaStreamSynchronize(st));
    bool failed = false;
    TB_CHECK(tm_cuda_layer_failed(L->work_d, &failed, st));
    if (failed) printf("# layer: a grid barrier gave up waiting\n");
    return failed ? cudaErrorLaunchTimeout : cudaSuccess;
}

/* ---- timing --------------------------------------------------------------------------------------------------- */

typedef struct targ {
    tm_cuda_layer_args a;
    cudaStream_t st;
    cudaGraphExec_t ge;
} targ;

static void run_layer(void *p) {
    targ *t = p;
    TB_CHECK(tm_cuda_layer_decode(&t->a, t->st));
}
static void run_graph(void *p) { TB_CHECK(cudaGraphLaunch(((targ *)p)->ge, 0)); }
/* CHAIN launches in a row, alternating the work counters as consecutive layers do (their launches overlap) */
static void run_chain(targ *t) {
    for (int i = 0; i < CHAIN; i++) {
        t->a.parity = i & 1;
        run_layer(t);
    }
}

/* every block's phase ends in the last of CHAIN chained launches (%globaltimer, comparable across SMs): per point,
 * the earliest, median and latest block (us from the earliest block's start) and the latest block's SM -- how long
 * each grid barrier waits for its slowest block */
static void block_spread(const layer *L, targ *t, cudaStream_t st) {
    int dev = 0, sms = 0;
    TB_CHECK(cudaGetDevice(&dev));
    TB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t n = (size_t)sms * TM_CUDA_LAYER_BTRACE;
    long long *bt_d = tb_dev(n * sizeof(long long));
    long long *bt = tb_xmalloc(n * sizeof(long long));
    float *col = tb_xmalloc((size_t)sms * sizeof(float)); /* one point of every block, us from t0 */
    TB_CHECK(cudaMemset(bt_d, 0, n * sizeof(long long)));
    TB_CHECK(cudaDeviceSynchronize());
    t->a.btrace = bt_d;
    run_chain(t);
    TB_CHECK(cudaStreamSynchronize(st));
    t->a.btrace = NULL;
    tb_download(bt, bt_d, n * sizeof(long long));
    TB_CHECK(cudaFree(bt_d));
    static const char *what[] = {"start", "A done", "past bar1", "attn done", "C done", "D done", "E done"};
    long long t0 = bt[0];
    for (int b = 1; b < sms; b++)
        if (bt[(size_t)b * TM_CUDA_LAYER_BTRACE] < t0) t0 = bt[(size_t)b * TM_CUDA_LAYER_BTRACE];
    printf("# %s blocks (us from the first start: earliest / median / latest, latest block's SM):", L->s->name);
    for (int k = 0; k < 7; k++) {
        int late = 0;
        for (int b = 0; b < sms; b++) {
            col[b] = (float)(bt[(size_t)b * TM_CUDA_LAYER_BTRACE + k] - t0) * 1e-3f;
            if (col[b] > col[late]) late = b;
        }
        const long long sm = bt[(size_t)late * TM_CUDA_LAYER_BTRACE + 7];
        qsort(col, (size_t)sms, sizeof col[0], tb_cmp_f);
        printf(" %s %.2f / %.2f / %.2f (SM %lld) |", what[k], col[0], col[sms / 2], col[sms - 1], sm);
    }
    printf("\n");
    free(col);
    free(bt);
}

/* single launches (x changes from launch to launch: harmless), then per layer in a graph of CHAIN pdl launches
 * (captured on the non-blocking stream; tb_time_us launches it and records its events on the legacy stream) */
static void time_layer(const layer *L, lcase *c, cudaStream_t st) {
    char name[64];
    snprintf(name, sizeof name, "%s_ctx%d single", L->s->name, c->ctx);
    tb_case("time layer %s", name);
    targ t = {args_of(L, c, false), 0, NULL};
    tb_result("layer", name, 0.0, 0.0, tb_time_us(run_layer, &t, 5, 50), L->weight_bytes, 0.0, 'm');
    if (!tb_budget_ok()) return;
    snprintf(name, sizeof name, "%s_chain%d", L->s->name, CHAIN);
    tb_case("time layer %s", name);
    t.a.pdl = true;
    t.st = st;
    cudaGraph_t g;
    TB_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    run_chain(&t);
    TB_CHECK(cudaStreamEndCapture(st, &g));
    TB_CHECK(cudaGraphInstantiate(&t.ge, g, 0));
    const double us = tb_time_us(run_graph, &t, 2, 11) / CHAIN;
    tb_result("layer", name, 0.0, 0.0, us, L->weight_bytes, 0.0, 'm');
    /* where block 0's time goes: the last of CHAIN chained launches, stamped (clock64, at the SM clock) */
    long long *tr_d = tb_dev(TM_CUDA_LAYER_TRACE * sizeof(long long)), tr[TM_CUDA_LAYER_TRACE];
    TB_CHECK(cudaMemset(tr_d, 0, TM_CUDA_LAYER_TRACE * sizeof(long long)));
    TB_CHECK(cudaDeviceSynchronize());
    t.a.trace = tr_d;
    run_chain(&t);
    TB_CHECK(cudaStreamSynchronize(st));
    t.a.trace = NULL;
    tb_download(tr, tr_d, sizeof tr);
    TB_CHECK(cudaFree(tr_d));
    int khz = 0;
    TB_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    static const char *what[] = {"wait prev", "norm", "A qkv", "bar1", "attn", "bar2", "att to smem", "C o",
                                 "bar3", "norm", "D gate/up", "bar4", "copy h", "E down", "exit"};
    printf("# %s trace (us, block 0, %d MHz):", L->s->name, khz / 1000);
    for (int k = 1; k < 16; k++) printf(" %s %.2f |", what[k - 1], (double)(tr[k] - tr[k - 1]) * 1e3 / khz);
    printf(" total %.2f; producer issued its last stage at %.2f, stalled on a full ring %.2f, consumer thread 0 "
           "waited for stages %.2f\n", (double)(tr[15] - tr[0]) * 1e3 / khz, (double)(tr[17] - tr[0]) * 1e3 / khz,
           (double)tr[18] * 1e3 / khz, (double)tr[19] * 1e3 / khz);
    printf("# %s attention (us): q and the first K/V in %.2f, tokens %.2f, merge %.2f\n", L->s->name,
           (double)(tr[20] - tr[4]) * 1e3 / khz, (double)(tr[21] - tr[20]) * 1e3 / khz,
           (double)(tr[5] - tr[21]) * 1e3 / khz);
    block_spread(L, &t, st);
    TB_CHECK(cudaGraphExecDestroy(t.ge));
    TB_CHECK(cudaGraphDestroy(g));
}

/* ---- one case ------------------------------------------------------------------------------------------------- */

static void check_case(const layer *L, int ctx, int pos, cudaStream_t st, bool timed) {
    const shape *s = L->s;
    const size_t dim = (size_t)s->dim, qd = (size_t)s->H * s->hd, kd = (size_t)s->KV * s->hd, ffn = (size_t)s->ffn;
    const size_t hd = (size_t)s->hd;
    char name[64], full[80];
    int len = snprintf(name, sizeof name, "%s_ctx%d", s->name, ctx);
    if (pos != ctx - 1) snprintf(name + len, sizeof name - (size_t)len, "_pos%d", pos);
    tb_case("layer %s", name);
    lcase c;
    build(L, &c, ctx, pos);
    ref_layer(L, &c);
    cudaError_t e = launch(L, &c, false, st);
    if (e == cudaErrorNotSupported) {
        printf("# layer: not supported on this device/shape\n");
        tb_result("layer", name, INFINITY, 1e-2, 0.0, 0.0, 0.0, 'm');
        release(&c);
        return;
    }
    TB_CHECK(e);
    float *x1 = tb_xmalloc(3 * dim * sizeof(float)), *x2 = x1 + dim, *got = x2 + dim; /* (dim) x_out 1st, nth; dx */
    uint16_t *kc = tb_xmalloc(2 * c.pool * sizeof(uint16_t)), *vc = kc + c.pool;     /* the pools as downloaded */
    uint16_t *q = tb_xmalloc((3 * qd + 2 * ffn + 2 * kd) * sizeof(uint16_t));         /* one block, carved: */
    uint16_t *att = q + qd, *att2 = att + qd, *h = att2 + qd, *h2 = h + ffn;         /* (H * hd) x 3, (ffn) x 2 */
    uint16_t *nk = h2 + ffn, *nv = nk + kd;                                            /* (KV * hd) new K, V rows */
    tb_download(x1, c.x_d, dim * sizeof(float));
    tb_download(kc, c.kc_d, c.pool * sizeof(uint16_t));
    tb_download(vc, c.vc_d, c.pool * sizeof(uint16_t));
    tb_download(q, c.q_d, qd * sizeof(uint16_t));
    tb_download(att, c.att_d, qd * sizeof(uint16_t));
    tb_download(h, c.h_d, ffn * sizeof(uint16_t));
    for (size_t i = 0; i < dim; i++) got[i] = (float)((double)x1[i] - (double)c.x[i]);
    const double e_x = tb_rel_err(got, c.r_delta, dim);
    /* the token's rows out of the pools (replaced by the uploaded poison), then the whole pools bitwise */
    for (int g = 0; g < s->KV; g++) {
        const size_t o = row_off(s, c.slot, g);
        memcpy(nk + (size_t)g * hd, kc + o, hd * sizeof(uint16_t));
        memcpy(nv + (size_t)g * hd, vc + o, hd * sizeof(uint16_t));
        memcpy(kc + o, c.kc + o, hd * sizeof(uint16_t));
        memcpy(vc + o, c.vc + o, hd * sizeof(uint16_t));
    }
    const double e_k = tb_rel_err_bf16(nk, c.r_k, kd), e_v = tb_rel_err_bf16(nv, c.r_v, kd);
    const size_t bad_cache = ndiff(kc, c.kc, c.pool, 2) + ndiff(vc, c.vc, c.pool, 2);
    const double e_q = tb_rel_err_bf16(q, c.r_q, qd), e_att = tb_rel_err_bf16(att, c.r_att, qd);
    const double e_h = tb_rel_err_bf16(h, c.r_h, ffn);
    /* the same inputs again: pdl=true, then 3 more in a row (the work buffer as the last launch left it) */
    size_t bad_runs = 0;
    for (int run = 0; run < 4; run++) {
        const bool pdl = run % 2 == 0;
        e = launch(L, &c, pdl, st);
        if (e != cudaSuccess) {
            printf("# %s: run %d (pdl=%d) returned %s\n", name, run + 2, pdl, cudaGetErrorString(e));
            bad_runs += dim;
            continue;
        }
        tb_download(x2, c.x_d, dim * sizeof(float));
        tb_download(att2, c.att_d, qd * sizeof(uint16_t));
        tb_download(h2, c.h_d, ffn * sizeof(uint16_t));
        const size_t b = ndiff(x1, x2, dim, 4) + ndiff(att, att2, qd, 2) + ndiff(h, h2, ffn, 2);
        if (b) printf("# %s: run %d (pdl=%d) differs from run 1 in %zu elements\n", name, run + 2, pdl, b);
        bad_runs += b;
    }
    printf("# %s: x %.2e k %.2e v %.2e q %.2e att %.2e h %.2e; cache elements changed %zu, run differences %zu\n",
           name, e_x, e_k, e_v, e_q, e_att, e_h, bad_cache, bad_runs);
    tb_result("layer", name, e_x, 1e-2, 0.0, 0.0, 0.0, 'm');
    snprintf(full, sizeof full, "%s kv", name);
    tb_result("layer", full, fmax(e_k, e_v), 1e-2, 0.0, 0.0, 0.0, 'm');
    snprintf(full, sizeof full, "%s q+att+h", name);
    tb_result("layer", full, fmax(e_q, fmax(e_att, e_h)), 2e-2, 0.0, 0.0, 0.0, 'm');
    snprintf(full, sizeof full, "%s exact", name);
    tb_result("layer", full, (double)(bad_cache + bad_runs), 0.0, 0.0, 0.0, 0.0, 'm');
    if (timed && tb_budget_ok()) time_layer(L, &c, st);
    void *host[] = {x1, kc, q};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    release(&c);
}

int main(int argc, char **argv) {
    (void)argv;
    tb_guard_init(30.0);
    tb_seed();
    static const shape shapes[] = {
        {"1b", 2048, 8192, 32, 8, 64, 64},     /* Llama-3.2-1B */
        {"8b", 4096, 14336, 32, 8, 128, 128},  /* Llama-3-8B */
    };
    static const int ctxs[] = {1, 17, 100, 384, 1000, 4096};
    cudaStream_t st;
    TB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        tb_case("layer %s weights", shapes[i].name);
        layer L;
        make_layer(&L, &shapes[i]);
        for (size_t j = 0; j < sizeof ctxs / sizeof ctxs[0]; j++)
            check_case(&L, ctxs[j], ctxs[j] - 1, st, argc < 2 && ctxs[j] == 384);
        check_case(&L, 100, 105, st, false); /* RoPE position past the cache index */
        free_layer(&L);
    }
    TB_CHECK(cudaStreamDestroy(st));
    tb_case("finish");
    tb_guard_report("tb_layer");
    return tb_finish("tb_layer");
}
