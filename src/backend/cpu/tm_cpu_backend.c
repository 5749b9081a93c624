/* tm_cpu_backend.c -- the CPU backend: backend.h ops over host memory with a thread pool. */
#include "backend/backend.h"
#include "backend/cpu/tm_cpu_kernels.h"
#include "backend/cpu/tm_quant.h"
#include "backend/cpu/tm_quant16.h"
#include "core/tm_fp8.h"
#include "core/tm_threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* a chunk of huge pages the decode copies of the weights are cut from (x4_alloc) */
typedef struct x4_chunk {
    uint8_t *base;
    size_t cap, used;
} x4_chunk;

typedef struct tm_cpu_backend {
    tm_backend base;
    tm_threadpool *tp;
    int32_t act_bits;        /* 8 or 16: activation blocks for the integer dots */
    tm_isa isa;              /* resolved once: CPUID traps (~14 us) inside a VM */
    tm_cpu_kernel_table k;   /* row kernels for this CPU */
    uint8_t *scratch;        /* (scratch_bytes) quantized activation rows for matmul */
    size_t scratch_bytes;
    tm_kv_cfg kv;
    void *kv_k;              /* (n_layers, n_blocks, n_kv_heads, block_size, head_dim) f32, f16 (kv_f16) or e4m3 bytes
                              * (kv_fp8) */
    void *kv_v;              /* same */
    bool kv_fp8;             /* the cache holds fp8 e4m3 (kv dtype TM_DT_FP8_E4M3): a quarter of f32's bytes */
    bool kv_f16;             /* the cache holds IEEE f16 (TM_DT_F16): half of f32's bytes */
    size_t kv_es;            /* bytes per cache element: 4, 2 or 1 */
    float *rope_cs;          /* (rope_cs_cap) floats: per token rope_dim interleaved cos, sin */
    size_t rope_cs_cap;
    int32_t *rope_pos;       /* (rope_cs_cap) the position row i of rope_cs holds (INT32_MIN: none): layers after
                              * the first reuse the pass's rows instead of 2 * rope_dim / 2 libm calls a token */
    const float *rope_key;   /* the inv_freq table the rows were made with */
    float *att_tmp;          /* (n_threads, att_tmp_per) softmax scratch per thread */
    size_t att_tmp_per;
    struct attn_dec *att_dec; /* (att_dec_cap) a pass's one-token sequences (decode attention) */
    size_t att_dec_cap;
    float *att_part;         /* (att_part_cap) their chunk states: (item, head of the group, att_part_stride) */
    size_t att_part_cap;
    atomic_int *att_done;    /* (att_done_cap) chunks ended per (one-token sequence, KV head) */
    size_t att_done_cap;
    struct x4_chunk *x4c;    /* (n_x4c) huge-page chunks the decode copies are cut from (freed with the backend) */
    int32_t n_x4c, cap_x4c;
    float fp8_lut[256];      /* the value of every e4m3 byte (fp8 weights on the scalar path) */
} tm_cpu_backend;

static tm_cpu_backend *cpu(tm_backend *be) { return (tm_cpu_backend *)be; }

/* ---- buffers ----------------------------------------------------------------------------------- */

static void *cpu_alloc(tm_backend *be, size_t n) {
    tm_cpu_backend *c = cpu(be);
    /* any activation row converts to at most 4 bytes per element (q16: 2.25, q8: 1.13, f32: 4, fp8 weights' rounded
     * activations: 4, kept as f32), so the scratch holds the conversion of any buffer handed out here */
    size_t need = n * sizeof(float) + 4096;
    if (need > c->scratch_bytes) {
        uint8_t *s = tm_aligned_alloc(64, need);
        if (!s) return NULL;
        tm_aligned_free(c->scratch);
        c->scratch = s;
        c->scratch_bytes = need;
    }
    /* rope tables need (tokens, rope_dim) <= any (tokens, dim) activation */
    if (n > c->rope_cs_cap) {
        float *cs = tm_aligned_alloc(64, n * sizeof(float));
        int32_t *pos = malloc(n * sizeof(int32_t));
        if (!cs || !pos) {
            tm_aligned_free(cs);
            free(pos);
            return NULL;
        }
        for (size_t i = 0; i < n; i++) pos[i] = INT32_MIN;
        tm_aligned_free(c->rope_cs);
        free(c->rope_pos);
        c->rope_cs = cs;
        c->rope_pos = pos;
        c->rope_cs_cap = n;
    }
    return tm_aligned_alloc(64, n * sizeof(float));
}

static void cpu_release(tm_backend *be, void *buf) {
    (void)be;
    tm_aligned_free(buf);
}

/* floats of a thread's softmax scratch before its fp8 widening area: one block of scores and slack, rounded to
 * 64 bytes (the widened rows start aligned) */
/* Per-thread attention scratch (att_tmp): a block of scores, then (fp8, f16) the block's K and V widened to f32, then
 * the chunk accumulators of a prefill tile (TM_ATTN_PAIRS, head_dim). Decode chunk states: att_part, slots of
 * att_part_stride floats (head_dim accumulators, then m and l). */
#define TM_ATTN_HEADS 8  /* heads carried at once */
#define TM_ATTN_PAIRS 32 /* (token, head) states carried at once */
static inline size_t att_scores_len(int32_t block_size) { return ((size_t)block_size + 16 + 15) / 16 * 16; }
static inline size_t att_wide_len(int32_t block_size, int32_t head_dim, bool narrow /* fp8 or f16 */) {
    return narrow ? 2 * (size_t)block_size * (size_t)head_dim : 0;
}
static inline size_t att_tmp_len(int32_t block_size, int32_t head_dim, bool narrow) {
    return att_scores_len(block_size) + att_wide_len(block_size, head_dim, narrow) + TM_ATTN_PAIRS * (size_t)head_dim;
}
static inline size_t att_part_stride(int32_t head_dim) { return ((size_t)head_dim + 2 + 15) / 16 * 16; }

static tm_status cpu_kv_init(tm_backend *be, const tm_kv_cfg *cfg, tm_error *err) {
    tm_cpu_backend *c = cpu(be);
    if (cfg->dtype != TM_DT_F32 && cfg->dtype != TM_DT_F16 && cfg->dtype != TM_DT_FP8_E4M3)
        return tm_err(err, TM_ERR_UNSUPPORTED, "cpu KV cache supports f32, f16 and fp8_e4m3, not %s",
                      tm_dtype_name(cfg->dtype));
    const bool fp8 = cfg->dtype == TM_DT_FP8_E4M3, f16 = cfg->dtype == TM_DT_F16;
    const size_t es = fp8 ? 1 : f16 ? 2 : sizeof(float); /* bytes per element */
    if (cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->block_size < 1 || cfg->n_blocks < 1)
        return tm_err(err, TM_ERR_INVALID, "bad KV cache geometry");
    uint64_t per_layer = (uint64_t)cfg->n_blocks * (uint64_t)cfg->n_kv_heads * (uint64_t)cfg->block_size *
                         (uint64_t)cfg->head_dim;
    uint64_t total = per_layer * (uint64_t)cfg->n_layers;
    tm_huge_free(c->kv_k);
    tm_huge_free(c->kv_v);
    c->kv_k = tm_huge_alloc(total * es);
    c->kv_v = tm_huge_alloc(total * es);
    size_t att_per = att_tmp_len(cfg->block_size, cfg->head_dim, fp8 || f16);
    float *att = tm_aligned_alloc(64, (size_t)tm_threadpool_size(c->tp) * att_per * sizeof(float));
    if (!c->kv_k || !c->kv_v || !att) {
        tm_huge_free(c->kv_k);
        tm_huge_free(c->kv_v);
        tm_aligned_free(att);
        c->kv_k = c->kv_v = NULL;
        return tm_err(err, TM_ERR_NOMEM, "cannot allocate %.1f MiB of KV cache",
                      (double)(2 * total * es) / (1024.0 * 1024.0));
    }
    tm_aligned_free(c->att_tmp);
    c->att_tmp = att;
    c->att_tmp_per = att_per;
    c->kv = *cfg;
    c->kv_fp8 = fp8;
    c->kv_f16 = f16;
    c->kv_es = es;
    return TM_OK;
}

/* ---- embed ------------------------------------------------------------------------------------- */

typedef struct { const tm_weight *w; const int32_t *ids; int32_t n; float *x; } embed_task;

static void embed_fn(void *p, int ith, int nth) {
    embed_task *t = p;
    int64_t lo, hi;
    tm_split_range(t->n, ith, nth, &lo, &hi);
    uint64_t rb = tm_dtype_row_bytes(t->w->type, (uint64_t)t->w->cols);
    const bool fp8 = t->w->type == TM_DT_FP8_E4M3; /* element = scale * e4m3 (tm_dequant_row gives the e4m3) */
    for (int64_t i = lo; i < hi; i++) {
        float *xi = t->x + i * t->w->cols;
        tm_dequant_row(t->w->type, (const uint8_t *)t->w->data + (uint64_t)t->ids[i] * rb, xi, t->w->cols);
        if (fp8)
            for (int64_t c = 0; c < t->w->cols; c++) xi[c] *= t->w->scale;
    }
}

static void cpu_embed(tm_backend *be, const tm_weight *table, const int32_t *ids, int32_t n, void *x) {
    embed_task t = {table, ids, n, x};
    tm_threadpool_run(cpu(be)->tp, embed_fn, &t);
}

/* ---- norms ------------------------------------------------------------------------------------- */

typedef struct {
    const tm_cpu_kernel_table *k;
    float *res;
    const float *x, *w;
    float eps;
    int32_t n, dim;
    float *out;
} norm_task;

static void norm_fn(void *p, int ith, int nth) {
    norm_task *t = p;
    int64_t lo, hi;
    tm_split_range(t->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const float *xi = t->x + i * t->dim;
        float *oi = t->out + i * t->dim;
        if (t->res) {
            float *ri = t->res + i * t->dim;
            t->k->add_rmsnorm_row(ri, xi, t->w, t->eps, t->dim, oi);
        } else {
            t->k->rmsnorm_row(xi, t->w, t->eps, t->dim, oi);
        }
    }
}

static void cpu_rmsnorm(tm_backend *be, const void *x, const tm_weight *w, float eps, int32_t n, void *out) {
    norm_task t = {&cpu(be)->k, NULL, x, w->data, eps, n, (int32_t)w->cols, out};
    if (n < 2) norm_fn(&t, 0, 1); /* rows are split over the threads: one row runs here */
    else tm_threadpool_run(cpu(be)->tp, norm_fn, &t);
}

static void cpu_add_rmsnorm(tm_backend *be, void *residual, const void *x, const tm_weight *w, float eps, int32_t n,
                            void *out) {
    norm_task t = {&cpu(be)->k, residual, x, w->data, eps, n, (int32_t)w->cols, out};
    if (n < 2) norm_fn(&t, 0, 1);
    else tm_threadpool_run(cpu(be)->tp, norm_fn, &t);
}

/* ---- matmul ------------------------------------------------------------------------------------ */

enum { TM_ROW_BLOCK = 16, TM_TOKEN_TILE = 64, TM_MULTI_MAX = 8 };

typedef struct {
    const tm_quant_ops *qo;     /* dot recipe for the group's weight type */
    tm_vec_dot_multi_fn multi;  /* q16: one weight row against up to 8 activation rows (bit-identical to
                                 * vec_dot, so results never depend on the batch), or NULL */
    bool mat;                   /* q8: the ops' mat_dot tiles (rows x tokens; bit-identical to vec_dot for
                                 * the quantized types, so q8 results do not depend on the batch either) */
    tm_vec_dot_x4_fn x4;        /* q16 decode: four rows of a weight's x4 copy (w->aux) at once, or NULL */
    tm_vec_dot_x4row_fn x4row;  /* q16 prefill: one row of the x4 copy against up to 8 activation rows */
    tm_mat_dot_x4_fn x4mat;     /* q8: mat_dot over the x4 copy (decode: fused four-row kernel), or NULL */
    bool fp8;                   /* fp8_e4m3 weights (W8A8, matmul_rows_fp8): qo and the kernels above unused; xq holds
                                 * e4m3(x / act_scale) as f32 */
    float act_scale;            /* fp8: the group's activation scale */
    void (*fp8_to_f32)(const uint8_t *x, float *out, int64_t n); /* fp8, AVX2: widens weight bytes (exact, F16C) */
    const float *fp8_lut;       /* fp8, scalar: the 256 e4m3 values instead (a look-up beats the branchy decode) */
    const tm_matmul_job *jobs;
    int32_t n_jobs;
    int64_t blk_start[TM_MATMUL_MAX_JOBS + 1]; /* first global row block of each job */
    int64_t cols;
    const float *x;             /* (n, cols) */
    const uint8_t *xq;          /* (n, arb) converted activations (x itself for f32 dots) */
    size_t arb;                 /* activation row bytes */
    int32_t n;
} matmul_task;

/* fp8 weights: each activation divided by the activation scale and rounded to e4m3 (nearest even, saturating at
 * +-448), stored as its f32 value; x, y (n) */
static void fp8_act_row(const float *x, float act_scale, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = tm_fp8_to_f32(tm_fp8_from_f32(x[i] / act_scale));
}

static void quant_act_fn(void *p, int ith, int nth) {
    matmul_task *t = p;
    int64_t lo, hi;
    tm_split_range(t->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        uint8_t *y = (uint8_t *)t->xq + (size_t)i * t->arb;
        if (t->fp8) fp8_act_row(t->x + i * t->cols, t->act_scale, (float *)y, t->cols);
        else t->qo->from_float(t->x + i * t->cols, y, t->cols);
    }
}

/* ---- matmul: fp8_e4m3 weights (W8A8) ------------------------------------------------------------ */

/* Semantics (backend.h, tm_weight): out = scale * act_scale * sum(e4m3(x / act_scale) * e4m3(w)) (+ bias). The
 * activations arrive rounded (quant_act_fn, once per row for the group); a weight row is widened to f32 a chunk
 * at a time (AVX2: the kernel table's fp8_to_f32; scalar: a 256-entry table; both exact) once per tile of tokens,
 * and each (row, token) pair sums its products in double, chunk by chunk in column order. e4m3 values are multiples of 2^-9 below 2^9 with 4
 * significant bits, so every product is exact in f32 (8 bits, a multiple of 2^-18 below 2^18) and every partial
 * sum of up to 2^17 columns is exact in double: the sum is the exact one whatever the order, the lanes or the
 * thread, and the result rounds once to f32 (times scale * act_scale), then adds the bias. A pair's bits therefore
 * depend on its weight row and activation row only (never on the batch), and equal a double reference's. */
enum { TM_FP8_CHUNK = 256 };

static inline double fp8_dot_chunk(const float *w, const float *x, int64_t n) {
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        a0 += (double)(w[c] * x[c]);
        a1 += (double)(w[c + 1] * x[c + 1]);
        a2 += (double)(w[c + 2] * x[c + 2]);
        a3 += (double)(w[c + 3] * x[c + 3]);
    }
    for (; c < n; c++) a0 += (double)(w[c] * x[c]);
    return (a0 + a1) + (a2 + a3);
}

/* rows [r0, r1) of one fp8 job, all tokens */
static void matmul_rows_fp8(const matmul_task *t, const tm_matmul_job *job, int64_t r0, int64_t r1) {
    const int64_t rows = job->w->rows, cols = t->cols;
    const uint8_t *wbase = job->w->data; /* (rows, cols) e4m3 bytes */
    const float *bias = job->bias ? job->bias->data : NULL;
    const double sc = (double)(job->w->scale * job->w->act_scale); /* act_scale a power of two: exact */
    float *out = job->out;
    float wf[TM_FP8_CHUNK];        /* a chunk of the weight row, widened */
    double acc[TM_TOKEN_TILE];     /* the tile's sums for the current row */
    for (int32_t t0 = 0; t0 < t->n; t0 += TM_TOKEN_TILE) {
        int32_t t1 = t0 + TM_TOKEN_TILE < t->n ? t0 + TM_TOKEN_TILE : t->n;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = wbase + (uint64_t)r * (uint64_t)cols;
            for (int32_t i = t0; i < t1; i++) acc[i - t0] = 0.0;
            for (int64_t c0 = 0; c0 < cols; c0 += TM_FP8_CHUNK) {
                const int64_t cn = cols - c0 < TM_FP8_CHUNK ? cols - c0 : TM_FP8_CHUNK;
                if (t->fp8_lut)
                    for (int64_t c = 0; c < cn; c++) wf[c] = t->fp8_lut[wr[c0 + c]];
                else
                    t->fp8_to_f32(wr + c0, wf, cn);
                for (int32_t i = t0; i < t1; i++)
                    acc[i - t0] += fp8_dot_chunk(wf, (const float *)(t->xq + (size_t)i * t->arb) + c0, cn);
            }
            const float b = bias ? bias[r] : 0.0f;
            for (int32_t i = t0; i < t1; i++) out[(int64_t)i * rows + r] = (float)(acc[i - t0] * sc) + b;
        }
    }
}

/* rows [r0, r1) of one job, all tokens, tiled so a tile of activation rows stays in L2 */
static void matmul_rows(const matmul_task *t, const tm_matmul_job *job, int64_t r0, int64_t r1) {
    const int64_t rows = job->w->rows;
    const uint64_t rb = tm_dtype_row_bytes(job->w->type, (uint64_t)t->cols);
    const uint8_t *wbase = job->w->data;
    const float *bias = job->bias ? job->bias->data : NULL;
    float *out = job->out;
    float tmp[TM_MULTI_MAX];
    if (t->fp8) {
        matmul_rows_fp8(t, job, r0, r1);
        return;
    }
    if (t->n <= TM_QUANT16_X4_MAX_ROWS && t->x4 && job->w->aux) { /* decode: four weight rows per call from the
                                                                     * sequential x4 copy; r0, r1: multiples of 4 */
        const uint8_t *g = (const uint8_t *)job->w->aux + (uint64_t)r0 * rb;
        for (int64_t r = r0; r < r1; r += 4, g += 4 * rb) {
            t->x4(t->cols, g, t->xq, t->arb, t->n, tmp);
            for (int32_t c = 0; c < t->n; c++)
                for (int k = 0; k < 4; k++) out[(int64_t)c * rows + r + k] = tmp[c * 4 + k] + (bias ? bias[r + k] : 0.0f);
        }
        return;
    }
    if (t->x4mat && job->w->aux) { /* 8-bit activations over the x4 copy: decode fused four rows per step, prefill
                                    * row by row from it; r0, r1: multiples of 4 */
        t->x4mat(t->cols, r1 - r0, (const uint8_t *)job->w->aux + (uint64_t)r0 * rb, t->n, t->xq, t->arb, out + r0,
                 (size_t)rows);
        if (bias)
            for (int32_t i = 0; i < t->n; i++)
                for (int64_t r = r0; r < r1; r++) out[(int64_t)i * rows + r] += bias[r];
        return;
    }
    if (t->mat) {
        t->qo->mat_dot(t->cols, r1 - r0, wbase + (uint64_t)r0 * rb, rb, t->n, t->xq, t->arb, out + r0, (size_t)rows);
        if (bias)
            for (int32_t i = 0; i < t->n; i++)
                for (int64_t r = r0; r < r1; r++) out[(int64_t)i * rows + r] += bias[r];
        return;
    }
    for (int32_t t0 = 0; t0 < t->n; t0 += TM_TOKEN_TILE) {
        int32_t t1 = t0 + TM_TOKEN_TILE < t->n ? t0 + TM_TOKEN_TILE : t->n;
        if (t->x4row && job->w->aux) { /* the x4 copy serves prefill too: the row-major one goes cold */
            for (int64_t r = r0; r < r1; r++) {
                const uint8_t *g = (const uint8_t *)job->w->aux + (uint64_t)(r / 4) * 4 * rb;
                /* a quarter of the next group per row: the rows' interleaved reads defeat the hardware
                 * prefetcher (as in tm_quant_avx2.c's x4 tiles) */
                if (r + 4 < r1)
                    for (uint64_t o = 0; o < rb; o += 64) __builtin_prefetch(g + (4 + (uint64_t)(r % 4)) * rb + o, 0, 3);
                float b = bias ? bias[r] : 0.0f;
                for (int32_t i = t0; i < t1; i += TM_MULTI_MAX) {
                    int nr = t1 - i < TM_MULTI_MAX ? t1 - i : TM_MULTI_MAX;
                    t->x4row(t->cols, g, (int)(r % 4), t->xq + (size_t)i * t->arb, t->arb, nr, tmp);
                    for (int k = 0; k < nr; k++) out[(int64_t)(i + k) * rows + r] = tmp[k] + b;
                }
            }
            continue;
        }
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = wbase + (uint64_t)r * rb;
            float b = bias ? bias[r] : 0.0f;
            int32_t i = t0;
            if (t->multi)
                for (; i + 1 < t1; i += TM_MULTI_MAX) {
                    int nr = t1 - i < TM_MULTI_MAX ? t1 - i : TM_MULTI_MAX;
                    t->multi(t->cols, wr, t->xq + (size_t)i * t->arb, t->arb, nr, tmp);
                    for (int k = 0; k < nr; k++) out[(int64_t)(i + k) * rows + r] = tmp[k] + b;
                }
            for (; i < t1; i++) out[(int64_t)i * rows + r] = t->qo->vec_dot(t->cols, wr, t->xq + (size_t)i * t->arb) + b;
        }
    }
}

/* global row blocks [blo, bhi) across the group's jobs */
static void matmul_blocks(matmul_task *t, int64_t blo, int64_t bhi) {
    for (int32_t j = 0; j < t->n_jobs && blo < bhi; j++) {
        int64_t s = t->blk_start[j], e = t->blk_start[j + 1];
        if (bhi <= s || blo >= e) continue;
        int64_t b0 = blo > s ? blo : s, b1 = bhi < e ? bhi : e;
        int64_t rows = t->jobs[j].w->rows;
        int64_t r0 = (b0 - s) * TM_ROW_BLOCK, r1 = (b1 - s) * TM_ROW_BLOCK;
        matmul_rows(t, &t->jobs[j], r0, r1 < rows ? r1 : rows);
    }
}

static void matmul_fn(void *p, int64_t blo, int64_t bhi, int ith) {
    (void)ith;
    matmul_blocks(p, blo, bhi);
}

static const tm_quant_ops *cpu_dot_ops(const tm_cpu_backend *c, tm_dtype t) {
    return c->act_bits == 8 ? tm_quant_ops_get_isa(t, c->isa) : tm_quant16_ops_get_isa(t, c->isa);
}

static void cpu_matmul(tm_backend *be, const tm_matmul_job *jobs, int32_t n_jobs, const void *x, int32_t n) {
    tm_cpu_backend *c = cpu(be);
    const bool fp8 = jobs[0].w->type == TM_DT_FP8_E4M3;
    /* one conversion of x serves the group only when every weight has the same type (fp8: and activation scale) */
    for (int32_t j = 1; j < n_jobs; j++)
        if (jobs[j].w->type != jobs[0].w->type || (fp8 && jobs[j].w->act_scale != jobs[0].w->act_scale)) {
            for (int32_t k = 0; k < n_jobs; k++) cpu_matmul(be, &jobs[k], 1, x, n);
            return;
        }
    matmul_task t = {0};
    t.jobs = jobs;
    t.n_jobs = n_jobs;
    t.cols = jobs[0].w->cols;
    t.x = x;
    t.n = n;
    for (int32_t j = 0; j < n_jobs; j++)
        t.blk_start[j + 1] = t.blk_start[j] + (jobs[j].w->rows + TM_ROW_BLOCK - 1) / TM_ROW_BLOCK;
    const int64_t nblk = t.blk_start[n_jobs];
    if (fp8) { /* the tm_quant_ops tables have no fp8 entry: matmul_rows_fp8 */
        t.fp8 = true;
        t.act_scale = jobs[0].w->act_scale;
        t.fp8_to_f32 = c->k.fp8_to_f32;
        t.fp8_lut = c->isa == TM_ISA_AVX2 ? NULL : c->fp8_lut;
        /* x is an activation buffer of at least n * cols floats (cpu_alloc), which keeps the scratch at least that
         * large: the rounded rows, f32 too, fit */
        t.arb = (size_t)t.cols * sizeof(float);
        t.xq = c->scratch;
        if (n < 4) quant_act_fn(&t, 0, 1);
        else tm_threadpool_run(c->tp, quant_act_fn, &t);
        tm_threadpool_run_range(c->tp, nblk, n <= 2 ? 1 : nblk, matmul_fn, &t);
        return;
    }
    t.qo = cpu_dot_ops(c, jobs[0].w->type);
    t.multi = c->act_bits == 16 && c->isa == TM_ISA_AVX2 ? tm_quant16_multi_avx2(jobs[0].w->type) : NULL;
    t.mat = c->act_bits == 8;
    t.x4 = c->act_bits == 16 && c->isa == TM_ISA_AVX2 ? tm_quant16_x4_avx2(jobs[0].w->type) : NULL;
    t.x4row = t.x4 ? tm_quant16_x4row_avx2(jobs[0].w->type) : NULL;
    t.x4mat = c->act_bits == 8 && c->isa == TM_ISA_AVX2 ? tm_quant_x4_avx2(jobs[0].w->type) : NULL;
    if (t.qo->act_type == TM_DT_F32) {
        t.xq = x;
        t.arb = (size_t)t.cols * sizeof(float);
    } else {
        t.arb = (size_t)tm_dtype_row_bytes(t.qo->act_type, (uint64_t)t.cols);
        t.xq = c->scratch;
        if (n < 4) quant_act_fn(&t, 0, 1); /* a few rows: converting them here beats a dispatch */
        else tm_threadpool_run(c->tp, quant_act_fn, &t);
    }
    /* each thread's row blocks as one contiguous stream (static parts beat interleaved chunks: the hardware
     * prefetcher follows one stream per thread), the back half of a slow thread's rest taken by a done one */
    /* decode: a row block per claim; prefill: a quarter of a part (each call re-reads the activation tiles) */
    const int64_t grain = n <= 2 ? 1 : nblk;
    tm_threadpool_run_range(c->tp, nblk, grain, matmul_fn, &t);
}

/* ---- rope + kv write --------------------------------------------------------------------------- */

/* the cache entry (layer, block, kv head, slot off): f32 elements, or e4m3 bytes */
static inline void *kv_slot(const tm_cpu_backend *c, void *base, int32_t layer, int64_t block, int32_t kvh,
                            int64_t off) {
    const tm_kv_cfg *k = &c->kv;
    size_t hd = (size_t)k->head_dim, bs = (size_t)k->block_size, nkv = (size_t)k->n_kv_heads;
    size_t idx = ((((size_t)layer * (size_t)k->n_blocks + (size_t)block) * nkv + (size_t)kvh) * bs + (size_t)off) * hd;
    return (uint8_t *)base + idx * c->kv_es;
}

/* write n f32 values to a cache entry (f16: rounded to nearest even; fp8: each rounded to e4m3, to nearest even,
 * saturating at +-448) */
static inline void kv_put(const tm_cpu_backend *c, void *dst, const float *x, int32_t n) {
    if (c->kv_f16) {
        c->k.f32_to_f16(x, dst, n);
        return;
    }
    if (!c->kv_fp8) {
        memcpy(dst, x, (size_t)n * sizeof(float));
        return;
    }
    uint8_t *d = dst;
    for (int32_t i = 0; i < n; i++) d[i] = tm_fp8_from_f32(x[i]);
}

typedef struct { tm_cpu_backend *c; const tm_attn_cfg *a; int32_t layer; const tm_batch *b; float *q, *k; const float *v; } rope_task;

static void rope_fn(void *p, int ith, int nth) {
    rope_task *t = p;
    const tm_attn_cfg *a = t->a;
    int64_t lo, hi;
    tm_split_range(t->b->n_tokens, ith, nth, &lo, &hi);
    int32_t hd = a->head_dim, half = a->rope_dim / 2;
    int32_t qw = a->n_heads * hd, kw = a->n_kv_heads * hd;
    for (int64_t i = lo; i < hi; i++) {
        float *cs = t->c->rope_cs + (size_t)i * (size_t)a->rope_dim;
        if (t->c->rope_pos[i] != t->b->positions[i]) { /* else made by an earlier layer of this pass */
            float pos = (float)t->b->positions[i];
            for (int32_t j = 0; j < half; j++) {
                float th = pos * a->rope_inv_freq[j];
                cs[2 * j] = cosf(th);
                cs[2 * j + 1] = sinf(th);
            }
            t->c->rope_pos[i] = t->b->positions[i];
        }
        for (int32_t h = 0; h < a->n_heads; h++) tm_cpu_rope_head(t->q + i * qw + h * hd, cs, half, a->rope_neox);
        for (int32_t h = 0; h < a->n_kv_heads; h++) tm_cpu_rope_head(t->k + i * kw + h * hd, cs, half, a->rope_neox);
        int64_t slot = t->b->slot_mapping[i];
        int64_t blk = slot / t->c->kv.block_size, off = slot % t->c->kv.block_size;
        for (int32_t h = 0; h < a->n_kv_heads; h++) {
            kv_put(t->c, kv_slot(t->c, t->c->kv_k, t->layer, blk, h, off), t->k + i * kw + h * hd, hd);
            kv_put(t->c, kv_slot(t->c, t->c->kv_v, t->layer, blk, h, off), t->v + i * kw + h * hd, hd);
        }
    }
}

static void cpu_rope_kv_write(tm_backend *be, const tm_attn_cfg *a, int32_t layer, const tm_batch *b, void *q, void *k,
                              const void *v) {
    tm_cpu_backend *c = cpu(be);
    rope_task t = {c, a, layer, b, q, k, v};
    if (c->rope_key != a->rope_inv_freq) { /* another table: no row is valid */
        for (size_t i = 0; i < c->rope_cs_cap; i++) c->rope_pos[i] = INT32_MIN;
        c->rope_key = a->rope_inv_freq;
    }
    if (b->n_tokens < 2) rope_fn(&t, 0, 1); /* one token: a dispatch costs more than the work */
    else tm_threadpool_run(c->tp, rope_fn, &t);
}

/* ---- attention --------------------------------------------------------------------------------- */

/* A (token, head) pair's attention is a fold over its context in chunks of TM_ATTN_CHUNK blocks, in order: the
 * first chunk's online softmax runs in the output row, each later chunk's from an empty state, merged into the
 * running state when the chunk ends (tm_cpu_attn_merge). Prefill tiles walk a sequence's chunks one after the
 * other; a sequence with one token in the pass (decode) spreads its (KV head, chunk) items over the threads, as
 * FlashDecoding does, and whichever thread ends a (sequence, KV head)'s last chunk merges its chunks in order.
 * The arithmetic is the same either way: a pair's result does not depend on the batch, the pass or the threads. */
enum { TM_ATTN_CHUNK = 2 }; /* blocks per chunk (32 tokens at the default block size) */

typedef struct attn_dec {
    int32_t seq, tok;   /* batch sequence, its token */
    int32_t n_chunks;   /* ceil(context / chunk tokens) */
    int64_t item0;      /* its first item: items (KV head, chunk), KV head major */
} attn_dec;

typedef struct {
    tm_cpu_backend *c;
    const tm_attn_cfg *a;
    int32_t layer;
    const tm_batch *b;
    const float *q;
    float *out;
    const attn_dec *dec;  /* (n_dec) the one-token sequences */
    int32_t n_dec;
    int64_t n_items;      /* their (KV head, chunk) items */
} attn_task;

/* software prefetch of the first cnt entries of KV head kvh's K and V in cache block blk (l2: into L2 only) */
static inline void kv_prefetch(const tm_cpu_backend *c, int32_t layer, int32_t blk, int32_t kvh, int32_t cnt, bool l2) {
    const char *kp = kv_slot(c, c->kv_k, layer, blk, kvh, 0), *vp = kv_slot(c, c->kv_v, layer, blk, kvh, 0);
    const size_t nb = (size_t)cnt * (size_t)c->kv.head_dim * c->kv_es;
    for (size_t o = 0; o < nb; o += 64) {
        if (l2) {
            __builtin_prefetch(kp + o, 0, 2);
            __builtin_prefetch(vp + o, 0, 2);
        } else {
            __builtin_prefetch(kp + o);
            __builtin_prefetch(vp + o);
        }
    }
}

/* the K and V rows of block `blk` (logical block j0 / bs of the table bt) of KV head kvh, cnt entries of which are
 * read: f32 in the cache, or fp8 / f16 widened into `wide`; the next block (when it is read too, up to key index cmax)
 * is prefetched: it lies a page or more away (the other KV heads' entries sit between) */
static void kv_block(const attn_task *t, const int32_t *bt, int32_t j0, int32_t cmax, int32_t kvh, float *wide,
                     const float **kb, const float **vb) {
    const tm_cpu_backend *c = t->c;
    const int32_t bs = c->kv.block_size, hd = t->a->head_dim, cnt = cmax - j0 + 1 < bs ? cmax - j0 + 1 : bs;
    *kb = kv_slot(c, c->kv_k, t->layer, bt[j0 / bs], kvh, 0);
    *vb = kv_slot(c, c->kv_v, t->layer, bt[j0 / bs], kvh, 0);
    if (j0 + bs <= cmax)
        kv_prefetch(c, t->layer, bt[j0 / bs + 1], kvh, cmax - j0 - bs + 1 < bs ? cmax - j0 - bs + 1 : bs, false);
    if (c->kv_fp8 || c->kv_f16) { /* widen the entries anyone reads (exact), then the f32 kernel */
        float *wk = wide, *wv = wide + (size_t)bs * (size_t)hd;
        if (c->kv_fp8) {
            c->k.fp8_to_f32((const uint8_t *)*kb, wk, (int64_t)cnt * hd);
            c->k.fp8_to_f32((const uint8_t *)*vb, wv, (int64_t)cnt * hd);
        } else {
            c->k.f16_to_f32((const uint16_t *)*kb, wk, (int64_t)cnt * hd);
            c->k.f16_to_f32((const uint16_t *)*vb, wv, (int64_t)cnt * hd);
        }
        *kb = wide;
        *vb = wide + (size_t)bs * (size_t)hd;
    }
}

/* Query heads ha .. hb - 1 (all of KV head kvh) of tokens i0 .. i1 - 1 (all of one sequence, in cache order):
 * each block is visited once for all of them (an fp8 block widened once), a tile of up to TM_ATTN_PAIRS pairs at
 * a time; a pair past its first chunk runs the chunk in `part` (TM_ATTN_PAIRS, head_dim) and merges it at the
 * chunk's end or its own last key. */
static void attn_heads(const attn_task *t, int32_t i0, int32_t i1, int32_t kvh, int32_t ha, int32_t hb,
                       float *scores /* (block_size) */, float *wide /* fp8: (2, block_size, head_dim) */,
                       float *part /* (TM_ATTN_PAIRS, head_dim) */) {
    const tm_attn_cfg *a = t->a;
    const tm_batch *b = t->b;
    const tm_cpu_backend *c = t->c;
    const int32_t hd = a->head_dim, bs = c->kv.block_size, chunk = bs * TM_ATTN_CHUNK, s = b->seq_index[i0];
    const int32_t last = b->context_len[s] - b->query_start[s + 1]; /* cache index of token i is last + i */
    const int32_t *bt = b->block_table + (size_t)s * (size_t)b->max_blocks;
    tm_cpu_attn_state st[TM_ATTN_PAIRS], ps[TM_ATTN_PAIRS];
    for (int32_t h0 = ha; h0 < hb; h0 += TM_ATTN_HEADS) {
        const int32_t nh = hb - h0 < TM_ATTN_HEADS ? hb - h0 : TM_ATTN_HEADS, tt = TM_ATTN_PAIRS / nh;
        for (int32_t k0 = i0; k0 < i1; k0 += tt) {
            const int32_t k1 = i1 - k0 < tt ? i1 : k0 + tt, cmax = last + k1 - 1; /* the tile's last cache index */
            for (int32_t k = k0; k < k1; k++)
                for (int32_t h = 0; h < nh; h++)
                    tm_cpu_attn_begin(&st[(k - k0) * nh + h],
                                      t->out + ((size_t)k * (size_t)a->n_heads + (size_t)(h0 + h)) * (size_t)hd, hd);
            for (int32_t j0 = 0; j0 <= cmax; j0 += bs) {
                const float *kb, *vb;
                kv_block(t, bt, j0, cmax, kvh, wide, &kb, &vb);
                const bool later = j0 >= chunk, starts = j0 % chunk == 0, ends = (j0 + bs) % chunk == 0;
                for (int32_t k = k0; k < k1; k++) {
                    const int32_t cidx = last + k; /* token k's own cache index */
                    if (cidx < j0) continue;
                    const int32_t cnt = cidx - j0 + 1 < bs ? cidx - j0 + 1 : bs;
                    for (int32_t h = 0; h < nh; h++) {
                        const int32_t pi = (k - k0) * nh + h;
                        const float *qk = t->q + ((size_t)k * (size_t)a->n_heads + (size_t)(h0 + h)) * (size_t)hd;
                        tm_cpu_attn_state *cur = &st[pi];
                        if (later) {
                            cur = &ps[pi];
                            if (starts) tm_cpu_attn_begin(cur, part + (size_t)pi * (size_t)hd, hd);
                        }
                        c->k.attn_block(cur, qk, kb, vb, cnt, hd, a->attn_scale, scores);
                        if (later && (ends || cidx < j0 + bs)) tm_cpu_attn_merge(&st[pi], cur);
                    }
                }
            }
            for (int32_t k = 0; k < (k1 - k0) * nh; k++) tm_cpu_attn_end(&st[k]);
        }
    }
}

/* Prefill (sequences with two or more tokens in the pass, and the one-token ones when the decode path does not
 * take them: t->n_dec == 0): each thread takes a contiguous range of every token's
 * heads: the heads of one KV head stay together, so a thread reads the K/V of about n_kv_heads / nth + 1 KV heads
 * instead of all of them, once for all its heads of that KV head and for a tile of the sequence's tokens, and
 * every thread gets a share of every token (causal prefill stays balanced). More threads than heads: (token,
 * head) pairs round-robin. */
static void attn_fn(void *p, int ith, int nth) {
    attn_task *t = p;
    const int32_t nh = t->a->n_heads, nt = t->b->n_tokens, group = nh / t->a->n_kv_heads;
    float *scores = t->c->att_tmp + (size_t)ith * t->c->att_tmp_per; /* (block_size) */
    float *wide = scores + att_scores_len(t->c->kv.block_size);    /* fp8: (2, block_size, head_dim) */
    float *part = wide + att_wide_len(t->c->kv.block_size, t->a->head_dim, t->c->kv_fp8 || t->c->kv_f16); /* (PAIRS, hd) */
    if (nth <= nh) {
        int64_t h0, h1;
        tm_split_range(nh, ith, nth, &h0, &h1);
        for (int32_t i = 0; i < nt;) {
            int32_t i1 = i + 1; /* the run of tokens of i's sequence */
            while (i1 < nt && t->b->seq_index[i1] == t->b->seq_index[i]) i1++;
            for (int32_t ha = (int32_t)h0; ha < (int32_t)h1 && !(t->n_dec && i1 - i == 1);) { /* by KV head */
                const int32_t kvh = ha / group, end = (kvh + 1) * group < (int32_t)h1 ? (kvh + 1) * group : (int32_t)h1;
                attn_heads(t, i, i1, kvh, ha, end, scores, wide, part);
                ha = end;
            }
            i = i1;
        }
        return;
    }
    for (int64_t item = ith; item < (int64_t)nt * nh; item += nth) {
        const int32_t i = (int32_t)(item / nh), h = (int32_t)(item % nh), s = t->b->seq_index[i];
        if (!t->n_dec || t->b->query_start[s + 1] - t->b->query_start[s] > 1)
            attn_heads(t, i, i + 1, h / group, h, h + 1, scores, wide, part);
    }
}

/* Decode items [lo, hi): (sequence, KV head, chunk). A chunk's state: the first chunk's accumulator is the output
 * row, a later one's is its slot of c->att_part; m and l of every chunk go to its slot. */
/* decode item it of one-token sequence d: its KV head, chunk, the chunk's end (key index) and the block table */
typedef struct {
    int32_t kvh, ch, j1;
    const int32_t *bt;
} dec_item;

static dec_item dec_item_of(const attn_task *t, int32_t d, int64_t it) {
    const attn_dec *dd = &t->dec[d];
    const int32_t chunk = t->c->kv.block_size * TM_ATTN_CHUNK, ctx = t->b->context_len[dd->seq];
    dec_item r = {(int32_t)((it - dd->item0) / dd->n_chunks), (int32_t)((it - dd->item0) % dd->n_chunks), 0,
                  t->b->block_table + (size_t)dd->seq * (size_t)t->b->max_blocks};
    r.j1 = (r.ch + 1) * chunk < ctx ? (r.ch + 1) * chunk : ctx;
    return r;
}

/* prefetch decode item it (of one-token sequence d) into L2: its chunk's K and V rows */
static void dec_prefetch(const attn_task *t, int32_t d, int64_t it) {
    const int32_t bs = t->c->kv.block_size;
    const dec_item di = dec_item_of(t, d, it);
    for (int32_t j0 = di.ch * bs * TM_ATTN_CHUNK; j0 < di.j1; j0 += bs)
        kv_prefetch(t->c, t->layer, di.bt[j0 / bs], di.kvh, di.j1 - j0 < bs ? di.j1 - j0 : bs, true);
}

static void attn_dec_fn(void *p, int64_t lo, int64_t hi, int ith) {
    attn_task *t = p;
    tm_cpu_backend *c = t->c;
    const tm_attn_cfg *a = t->a;
    const int32_t hd = a->head_dim, bs = c->kv.block_size, chunk = bs * TM_ATTN_CHUNK;
    const int32_t group = a->n_heads / a->n_kv_heads, ps = (int32_t)att_part_stride(hd);
    float *scores = c->att_tmp + (size_t)ith * c->att_tmp_per;
    float *wide = scores + att_scores_len(bs);
    tm_cpu_attn_state st[TM_ATTN_PAIRS];
    int32_t d = 0, dh = t->n_dec; /* the sequence of item lo: the last with item0 <= lo */
    while (dh - d > 1) {
        const int32_t mid = (d + dh) / 2;
        if (t->dec[mid].item0 <= lo) d = mid;
        else dh = mid;
    }
    for (int64_t it = lo; it < hi; it++) {
        while (it >= t->dec[d].item0 + (int64_t)a->n_kv_heads * t->dec[d].n_chunks) d++;
        const attn_dec *dd = &t->dec[d];
        const dec_item di = dec_item_of(t, d, it);
        const int32_t kvh = di.kvh, ch = di.ch, j1 = di.j1, *bt = di.bt;
        float *slot = c->att_part + (size_t)(dd->item0 + (int64_t)kvh * dd->n_chunks) * (size_t)group * (size_t)ps;
        for (int32_t h = 0; h < group; h++) { /* group <= TM_ATTN_PAIRS: checked in cpu_attention */
            float *acc = ch == 0 ? t->out + ((size_t)dd->tok * (size_t)a->n_heads + (size_t)(kvh * group + h)) * (size_t)hd
                                 : slot + ((size_t)ch * (size_t)group + (size_t)h) * (size_t)ps;
            tm_cpu_attn_begin(&st[h], acc, hd);
        }
        /* the next item's K and V (most often this thread's next claim) into L2 while this one runs: the blocks
         * lie apart, and one block at a time leaves too few lines in flight (decode attention is bound by the
         * latency of these loads, not their bytes). This item's were fetched by the call before (kv_block still
         * fetches a block ahead for a thread's first item). */
        if (it + 1 < t->n_items) dec_prefetch(t, it + 1 < dd->item0 + (int64_t)a->n_kv_heads * dd->n_chunks ? d : d + 1, it + 1);
        for (int32_t j0 = ch * chunk; j0 < j1; j0 += bs) {
            const float *kb, *vb;
            kv_block(t, bt, j0, j1 - 1, kvh, wide, &kb, &vb);
            const int32_t cnt = j1 - j0 < bs ? j1 - j0 : bs;
            for (int32_t h = 0; h < group; h++) {
                const float *qh = t->q + ((size_t)dd->tok * (size_t)a->n_heads + (size_t)(kvh * group + h)) * (size_t)hd;
                c->k.attn_block(&st[h], qh, kb, vb, cnt, hd, a->attn_scale, scores);
            }
        }
        for (int32_t h = 0; h < group; h++) {
            float *ml = slot + ((size_t)ch * (size_t)group + (size_t)h) * (size_t)ps + hd;
            ml[0] = st[h].m;
            ml[1] = st[h].l;
        }
        /* the last of the (sequence, KV head)'s chunks to end merges them all, in chunk order */
        if (atomic_fetch_add_explicit(&c->att_done[d * a->n_kv_heads + kvh], 1, memory_order_acq_rel) + 1 < dd->n_chunks)
            continue;
        for (int32_t h = 0; h < group; h++) {
            tm_cpu_attn_state tot = {slot[(size_t)h * (size_t)ps + (size_t)hd], slot[(size_t)h * (size_t)ps + (size_t)hd + 1],
                                     t->out + ((size_t)dd->tok * (size_t)a->n_heads + (size_t)(kvh * group + h)) * (size_t)hd, hd};
            for (int32_t k = 1; k < dd->n_chunks; k++) {
                float *sk = slot + ((size_t)k * (size_t)group + (size_t)h) * (size_t)ps;
                tm_cpu_attn_state pk = {sk[hd], sk[hd + 1], sk, hd};
                tm_cpu_attn_merge(&tot, &pk);
            }
            tm_cpu_attn_end(&tot);
        }
    }
}

/* *buf holds at least need elements of elem bytes (64-byte aligned, grown to twice the need); false (unchanged)
 * when out of memory */
static bool buf_reserve(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    void *nb = tm_aligned_alloc(64, 2 * need * elem);
    if (!nb) return false;
    tm_aligned_free(*buf);
    *buf = nb;
    *cap = 2 * need;
    return true;
}

/* room for n_dec one-token sequences with `items` decode items; false when out of memory */
static bool attn_reserve(tm_cpu_backend *c, const tm_attn_cfg *a, int32_t n_dec, int64_t items) {
    const size_t dec = (size_t)n_dec, done = dec * (size_t)a->n_kv_heads;
    const size_t part = (size_t)items * (size_t)(a->n_heads / a->n_kv_heads) * att_part_stride(a->head_dim);
    return buf_reserve((void **)&c->att_dec, &c->att_dec_cap, dec, sizeof *c->att_dec) &&
           buf_reserve((void **)&c->att_done, &c->att_done_cap, done, sizeof *c->att_done) &&
           buf_reserve((void **)&c->att_part, &c->att_part_cap, part, sizeof *c->att_part);
}

static void cpu_attention(tm_backend *be, const tm_attn_cfg *a, int32_t layer, const tm_batch *b, const void *q,
                          void *out) {
    tm_cpu_backend *c = cpu(be);
    const int32_t chunk = c->kv.block_size * TM_ATTN_CHUNK;
    attn_task t = {c, a, layer, b, q, out, NULL, 0, 0};
    int32_t n_dec = 0;
    int64_t items = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->query_start[s + 1] - b->query_start[s] == 1) {
            n_dec++;
            items += (int64_t)a->n_kv_heads * ((b->context_len[s] + chunk - 1) / chunk);
        }
    if (n_dec > 0 && a->n_heads / a->n_kv_heads <= TM_ATTN_PAIRS && attn_reserve(c, a, n_dec, items)) {
        items = 0;
        for (int32_t s = 0; s < b->n_seqs; s++)
            if (b->query_start[s + 1] - b->query_start[s] == 1) {
                attn_dec *d = &c->att_dec[t.n_dec++];
                *d = (attn_dec){s, b->query_start[s], (b->context_len[s] + chunk - 1) / chunk, items};
                items += (int64_t)a->n_kv_heads * d->n_chunks;
            }
        t.dec = c->att_dec;
        t.n_items = items;
    }
    if (b->n_tokens > t.n_dec) tm_threadpool_run(c->tp, attn_fn, &t); /* prefill tokens (or every token) */
    if (t.n_dec) {
        for (int64_t i = 0; i < (int64_t)t.n_dec * a->n_kv_heads; i++) atomic_init(&c->att_done[i], 0);
        tm_threadpool_run_range(c->tp, items, 1, attn_dec_fn, &t);
    }
}

/* ---- swiglu, rows, copies ---------------------------------------------------------------------- */

typedef struct { const tm_cpu_kernel_table *k; const float *g, *u; float *out; int32_t n, ffn; } swiglu_task;

enum { TM_SWIGLU_CHUNK = 256 };

/* Work items are (row, 256-column chunk): an element's arithmetic (vector body or scalar tail) never
 * depends on the thread count or the batch size. */
static void swiglu_fn(void *p, int ith, int nth) {
    swiglu_task *t = p;
    int64_t per_row = (t->ffn + TM_SWIGLU_CHUNK - 1) / TM_SWIGLU_CHUNK, lo, hi;
    tm_split_range((int64_t)t->n * per_row, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        int64_t row = it / per_row, c0 = it % per_row * TM_SWIGLU_CHUNK;
        int64_t cn = t->ffn - c0 < TM_SWIGLU_CHUNK ? t->ffn - c0 : TM_SWIGLU_CHUNK;
        size_t off = (size_t)row * (size_t)t->ffn + (size_t)c0;
        t->k->swiglu(t->g + off, t->u + off, t->out + off, cn);
    }
}

static void cpu_swiglu(tm_backend *be, const void *gate, const void *up, int32_t n, int32_t ffn, void *out) {
    swiglu_task t = {&cpu(be)->k, gate, up, out, n, ffn};
    if ((int64_t)n * ffn <= 4096) swiglu_fn(&t, 0, 1); /* a decode row or two: less work than a dispatch */
    else tm_threadpool_run(cpu(be)->tp, swiglu_fn, &t);
}

static void cpu_get_rows(tm_backend *be, const void *x, const int32_t *idx, int32_t n_idx, int32_t width, void *out) {
    (void)be;
    for (int32_t j = 0; j < n_idx; j++)
        memmove((float *)out + (size_t)j * (size_t)width, (const float *)x + (size_t)idx[j] * (size_t)width,
                (size_t)width * sizeof(float));
}

static void cpu_to_host(tm_backend *be, const void *x, size_t n, float *dst) {
    (void)be;
    if (dst != x) memcpy(dst, x, n * sizeof(float));
}

static void cpu_from_host(tm_backend *be, const float *src, size_t n, void *x) {
    (void)be;
    if (src != x) memcpy(x, src, n * sizeof(float));
}

static void cpu_free(tm_backend *be) {
    tm_cpu_backend *c = cpu(be);
    if (!c) return;
    tm_threadpool_free(c->tp);
    tm_aligned_free(c->scratch);
    tm_huge_free(c->kv_k);
    tm_huge_free(c->kv_v);
    tm_aligned_free(c->rope_cs);
    free(c->rope_pos);
    tm_aligned_free(c->att_tmp);
    tm_aligned_free(c->att_dec);
    tm_aligned_free(c->att_part);
    tm_aligned_free((void *)c->att_done);
    for (int32_t i = 0; i < c->n_x4c; i++) tm_huge_free(c->x4c[i].base);
    free(c->x4c);
    free(c);
}

/* ---- weights: the decode layout -------------------------------------------------------------------- */

/* A weight stays where it is (mapped file or host memory); on AVX2 a matrix whose rows divide by 4 and whose type
 * has a four-row kernel (Q8_0/Q4_0/Q4_1/Q4_K) also gets an x4 copy, laid out for the activation mode's kernels
 * (16-bit: tm_quant16.h, 8-bit: tm_quant.h), that every matmul then reads -- decode four rows per kernel call from
 * one sequential stream, prefill row by row from it -- with the same bits as the row-major kernels. The row-major
 * data is then only read for embedding rows (a mapped file's pages go cold). TM_CPU_NO_X4=1 turns it off. */
/* The decode copies come from 64 MiB chunks of huge pages (tm_huge_alloc), cut in order of placement: every
 * decode step streams all of them, and with 4 KiB pages that is ~25,000 TLB misses a token (about 3% of a
 * SmolLM2 batch-1 step here). A copy stays until the backend is freed. */
static void *x4_alloc(tm_cpu_backend *c, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    x4_chunk *last = c->n_x4c ? &c->x4c[c->n_x4c - 1] : NULL;
    if (last && last->cap - last->used >= bytes) {
        void *p = last->base + last->used;
        last->used += bytes;
        return p;
    }
    if (c->n_x4c == c->cap_x4c) {
        int32_t cap = c->cap_x4c ? 2 * c->cap_x4c : 8;
        x4_chunk *nc = realloc(c->x4c, (size_t)cap * sizeof *nc);
        if (!nc) return NULL;
        c->x4c = nc;
        c->cap_x4c = cap;
    }
    const size_t cap = bytes > ((size_t)64 << 20) ? bytes : (size_t)64 << 20;
    uint8_t *base = tm_huge_alloc(cap);
    if (!base) return NULL;
    c->x4c[c->n_x4c++] = (x4_chunk){base, cap, bytes};
    return base;
}

static tm_status cpu_weight_place(tm_backend *be, tm_weight *w, tm_error *err) {
    tm_cpu_backend *c = cpu(be);
    w->aux = NULL;
    if (!w->data) return tm_err(err, TM_ERR_INVALID, "cpu backend: weight without data (deferred dummy)");
    if (w->type == TM_DT_FP8_E4M3) { /* read row-major as it is (matmul_rows_fp8): no decode copy */
        if (!tm_fp8_scales_ok(w->scale, w->act_scale))
            return tm_err(err, TM_ERR_INVALID,
                          "cpu backend: fp8_e4m3 weight (%lld x %lld) needs a positive finite scale and a power-of-two "
                          "activation scale (has %g and %g)",
                          (long long)w->rows, (long long)w->cols, (double)w->scale, (double)w->act_scale);
        return TM_OK;
    }
    const char *off = getenv("TM_CPU_NO_X4");
    const bool kern = c->act_bits == 16 ? tm_quant16_x4_avx2(w->type) != NULL : tm_quant_x4_avx2(w->type) != NULL;
    if (c->isa != TM_ISA_AVX2 || !kern || !tm_quant16_x4_eligible(w->type, w->rows, w->cols) || (off && !strcmp(off, "1")))
        return TM_OK;
    size_t bytes = (size_t)(tm_dtype_row_bytes(w->type, (uint64_t)w->cols) * (uint64_t)w->rows);
    void *p = x4_alloc(c, bytes);
    if (!p) return tm_err(err, TM_ERR_NOMEM, "cpu backend: no memory for the decode copy of a %lld x %lld weight",
                          (long long)w->rows, (long long)w->cols);
    if (c->act_bits == 16) tm_quant16_x4_pack(w->type, w->rows, w->cols, w->data, p);
    else tm_quant_x4_pack(w->type, w->rows, w->cols, w->data, p);
    w->aux = p;
    return TM_OK;
}

static void cpu_weight_release(tm_backend *be, tm_weight *w) {
    (void)be;
    w->aux = NULL; /* its chunk goes with the backend */
}

static const tm_backend_ops k_cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .kv_init = cpu_kv_init,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul = cpu_matmul,
    .rope_kv_write = cpu_rope_kv_write,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .get_rows = cpu_get_rows,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .weight_place = cpu_weight_place,
    .weight_release = cpu_weight_release,
};

tm_status tm_backend_cpu_create(const tm_cpu_cfg *cfg, tm_backend **out, tm_error *err) {
    *out = NULL;
    int32_t bits = cfg->act_bits ? cfg->act_bits : 16;
    if (bits != 8 && bits != 16) return tm_err(err, TM_ERR_INVALID, "activation bits must be 8 or 16, not %d", bits);
    tm_cpu_backend *c = tm_calloc(1, sizeof *c);
    if (!c) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    c->base.ops = &k_cpu_ops;
    c->act_bits = bits;
    c->isa = tm_cpu_use_avx2() ? TM_ISA_AVX2 : TM_ISA_SCALAR;
    c->k = tm_cpu_kernels_select(c->isa == TM_ISA_AVX2);
    for (int b = 0; b < 256; b++) c->fp8_lut[b] = tm_fp8_to_f32((uint8_t)b);
    tm_status s = tm_threadpool_create(cfg->n_threads, &c->tp, err);
    if (s != TM_OK) {
        free(c);
        return s;
    }
    *out = &c->base;
    return TM_OK;
}
