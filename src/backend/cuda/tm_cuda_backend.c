/* tm_cuda_backend.c -- the CUDA backend: device memory, one-copy batch upload, op dispatch, CUDA graphs. */
#include "backend/backend.h"
#include "backend/cuda/tm_cuda_blas.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "backend/cuda/tm_cuda_lazy.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

/* Activation buffers remember whether they currently hold f32 (residual, logits) or bf16 values. */
typedef struct cu_buf {
    void *p;
    size_t bytes;
    bool f32;
} cu_buf;

/* A captured decode pass: key = (padded tokens, padded logits, context bucket). */
typedef struct cu_graph {
    int32_t n_tokens, n_logits, ctx_bucket;
    cudaGraphExec_t exec;
} cu_graph;

#define CU_MAX_GRAPHS 256

typedef struct cu_wgroup {
    uint8_t *base;               /* (bytes) the weights' rows, one after the other */
    uint64_t bytes;
    int32_t live;                /* weights not yet released */
} cu_wgroup;

typedef struct cu_backend {
    tm_backend base;
    tm_cuda_cfg cfg;
    cudaStream_t stream;
    tm_cuda_blas *blas;
    /* first error since last_error() */
    tm_status err_code;
    tm_error err;
    /* activation buffers */
    cu_buf *bufs;                /* (n_bufs) */
    int32_t n_bufs, cap_bufs;
    /* KV pool: per layer K then V, each (n_blocks + 1, n_kv_heads, block_size, head_dim) bf16; block n_blocks
     * is the scratch block that padded tokens write */
    tm_kv_cfg kv;
    int32_t n_heads;             /* query heads (from the first attention call) */
    uint16_t *kv_mem;            /* (n_layers, 2, n_blocks + 1, n_kv_heads, block_size, head_dim) bf16 or e4m3 */
    bool kv_fp8;                 /* the cache holds fp8 e4m3 bytes (kv dtype TM_DT_FP8_E4M3) */
    size_t layer_elems;          /* elements of one layer's K (or V) */
    /* step metadata: pinned host staging and its device twin, one copy per step */
    uint8_t *meta_host, *meta_dev;
    size_t meta_cap;
    cudaEvent_t meta_done;
    bool meta_pending;
    /* device views of the current step (into meta_dev) */
    int32_t n_tokens, n_seqs, n_logits, stride, max_q, max_ctx, ctx_bucket;
    int32_t *d_ids, *d_pos, *d_seq, *d_qstart, *d_ctx, *d_btab, *d_lidx;
    int32_t *d_src;              /* (n_tokens) a pipelined step's sources in d_ids_out (-1: the id in d_ids), or NULL */
    /* a mixed step (decode sequences first, then prefill chunks): the first n_dec sequences go to the decode
     * kernel, the rest to the prefill kernel with their own query starts and sequence indices (rebased) */
    int32_t n_dec, max_ctx_dec;
    int32_t *d_qs_tail, *d_seq_tail;
    bool split_mixed;
    /* the step's sequences from fresh_from on (-1: none; never one of the n_dec decode sequences) have no cached
     * prefix (tm_batch_fresh_from), so with an fp8 cache their prefill attention may read the step's own keys
     * from the fused q|k|v product's rows (rope writes what the cache holds into them; tm_cuda_attn_args.k_rows)
     * and the sequences before them the cache: rows_layer is the layer whose rows are there (-1: none), consumed
     * by its attention; TM_CUDA_KV_ROWS=0 turns it off */
    bool kv_rows_off;
    bool attn_out8_off;          /* TM_CUDA_ATTN_OUT8=0: decode attention leaves no e4m3 copy of its output */
    int32_t fresh_from, rows_layer, rows_ld;
    const uint16_t *rows_k, *rows_v;
    int64_t *d_slots;
    const tm_batch *host_batch;
    /* scratch */
    float *d_inv_freq;           /* (rope_dim / 2) */
    const float *inv_freq_src;
    void *attn_work;
    size_t attn_work_bytes;
    uint16_t *deq;               /* (deq_elems) dequantized weight for large-batch GEMMs */
    size_t deq_elems, deq_need;
    uint8_t *xq8;                /* (xq8_bytes) e4m3 activations of the fp8 products: (max(max_tokens, 16),
                                  * max_fp8_cols); at batch <= 8 two slots (xq8_small_out) */
    size_t xq8_bytes;
    /* what xq8 holds: e4m3(src / act) for xq8_elems elements of the activation buffer src at xq8_at, left by the op
     * that wrote src (a norm, the attention, the SwiGLU: xq8_leave); NULL: nothing. Used once by the fp8 product
     * that reads src next (matmul_fp8, xq8_take), cleared when src is written again (buf_mark) and at each step's
     * start. */
    const void *xq8_src;
    const uint8_t *xq8_at;
    float xq8_act;
    size_t xq8_elems;
    /* bf16 outputs a producer that left the e4m3 copy did not write (TM_CUDA_FP8_ONLY, on by default;
     * tm_cuda_lazy.h): the fp8 product that follows reads the copy, and anything else that reads the buffer has it
     * written first (lazy_read), from what is still at hand: the norm's f32 input (after its add), or the SwiGLU's
     * [gate | up] product */
    tm_lazy lazy;
    bool fp8_only;
    /* weights placed together (weight_place_group): one allocation each, freed with its last weight */
    cu_wgroup *wgroups;          /* (n_wgroups) */
    int32_t n_wgroups, cap_wgroups;
    bool no_fuse_gemm;           /* TM_CUDA_NO_FUSE_GEMM=1: grouped weights still run one product each, and no
                                  * producer leaves an fp8 copy */
    bool no_fp8_left;            /* TM_CUDA_FP8_LEFT=0: the producers (norms, SwiGLU) leave no fp8 copy; every fp8
                                  * product rounds its own input */
    bool no_fp8_left_small;      /* TM_CUDA_FP8_LEFT_SMALL=0: not at batch <= 8 (the GEMV path) */
    float fp8_act;               /* the one act_scale of every fp8 weight placed (0: none, -1: several), which lets
                                  * the norms round their output for the products that follow (xq8_src) */
    int64_t max_fp8_cols;
    uint16_t *ffn_tmp;           /* (ffn_elems) up projection for large-batch SwiGLU */
    size_t ffn_elems;
    int64_t max_ffn_rows;
    int32_t max_tokens;
    int32_t *d_ids_out;          /* (cfg.max_logits) argmax / sampled ids */
    /* The sampling passes' copies run on a side stream (`copy`; TM_CUDA_SIDE_COPY=0: the compute stream), off the
     * compute stream's path: the step's sampling inputs go up in one copy per pass, issued when the pass is queued
     * (it runs under the forward), and the ids (and logprobs) come down while the next pass computes. Per slot
     * (0/1, the pipelined passes; the synchronous ops use 0): the inputs' pinned staging and device buffer,
     * [recipes (n_rows) | penalties and logprobs (n_rows) | penalty entries (n_pen)] (sin_room), and the events:
     * sp_ev the upload done, done_ev the pass's sampling kernels done (the slot's next upload waits for it),
     * ids_ev the copy to the host done (the next pass that rewrites d_ids_out / d_lp waits for it). */
    cudaStream_t copy;           /* the compute stream itself with TM_CUDA_SIDE_COPY=0 */
    uint8_t *h_sin[2];           /* (sin_cap[slot]) pinned */
    uint8_t *d_sin[2];           /* (sin_cap[slot]) */
    size_t sin_cap[2];
    int32_t *h_ids[2];           /* (cfg.max_logits) pinned */
    cudaEvent_t ids_ev[2], sp_ev[2], done_ev[2];
    bool sp_used[2], copied[2]; /* recorded: sp_ev; done_ev and ids_ev (ids_copy_start records both) */
    /* penalties and logprobs (tm_cuda_sample_prepare / _finish): the entries' values before the penalties; the
     * rows' logprobs on the device and per slot on the host */
    float *d_pen_raw;               /* (d_pen_cap) */
    int32_t d_pen_cap;
    tm_cuda_sample_lp *d_lp;        /* (cfg.max_logits) */
    void *d_swork;                  /* tm_cuda_sample_work_bytes(cfg.max_logits) */
    tm_cuda_sample_lp *h_lp[2];     /* (cfg.max_logits) pinned */
    bool lp_pend[2];                /* the slot's pass copies logprobs */
    float *host_stage;           /* (stage_elems) pinned staging for to_host / from_host */
    size_t stage_bytes;
    /* fused GEMV epilogues (off with TM_CUDA_NO_FUSE=1). The add+RMSNorm epilogue is opt-in
     * (TM_CUDA_FUSE_NORM=1): its last-block tail measured slower than the separate norm kernel on the H200.
     * norm_in (TM_CUDA_NORM_IN=0: off): with f32/f16/bf16 weights at n <= TM_CUDA_GEMV_MAX_N the down GEMV (and
     * with TM_CUDA_NORM_IN=1 the o GEMV too) adds into the residual and passes it on raw, and the next GEMV norms
     * it as it reads it (no norm kernel) */
    bool no_fuse, fuse_norm, norm_in;
    enum { NORM_IN_BOTH, NORM_IN_AFTER_DOWN, NORM_IN_AFTER_O } norm_in_sel; /* which norms (after down: default) */
    void *norm_scratch;          /* (TM_CUDA_GEMV_NORM_SCRATCH_BYTES) zeroed at creation; every launch leaves it so */
    /* quantized weights at 9..tm_cuda_qgemm_max_n rows: tm_cuda_qgemm (TM_CUDA_QGEMM=0: dequantize + cuBLASLt) */
    bool no_qgemm;
    void *qg_work;               /* (tm_cuda_qgemm_work_bytes) zeroed at creation; every launch leaves it so */
    /* whole-layer kernel for one-token steps (tm_cuda_layer_decode; opt-in: TM_CUDA_LAYER=1) */
    bool layer_on;
    void *layer_work;            /* (tm_cuda_layer_work_bytes) made and zeroed at kv_init when layer_on; every
                                  * launch leaves its counters at 0 */
    /* graphs */
    cu_graph graphs[CU_MAX_GRAPHS];
    int32_t n_graphs;
    bool capturing;
    cu_graph pending;
    bool graphs_off;
    /* TM_CUDA_STEP_TIMING=1: per replayed decode graph, the device time from its launch to the sampled ids' copy
     * (events) against the host time between two launches; the difference is the device idling between steps */
    bool timing, t_open;
    cudaEvent_t t_ev[2];  /* (launch, ids copied) of the open step */
    double t_launch;      /* host time of the last timed launch */
    double t_ids, t_entry; /* host times: the last timed step's ids back; this step's begin_step entered */
    int64_t t_steps, t_periods; /* closed steps; launch-to-launch periods between two of them */
    double t_dev_s, t_period_s;
    double t_engine_s, t_prep_s; /* of the periods: ids back -> next begin_step (the engine), begin_step -> launch */
    /* pipelined passes: a ring of events recorded when each pass's ids are copied; the device time between two
     * consecutive passes' copies (their period, idle time included) */
    cudaEvent_t t_pev[4];
    bool t_prep[4];          /* that pass was a replayed decode graph */
    bool t_replay;           /* the current step replays a graph */
    int64_t t_plaunched, t_pcollected, t_pperiods, t_rperiods;
    double t_pperiod_s, t_rperiod_s; /* all periods; those between two replayed decode steps */
} cu_backend;

/* The backend behind be, with its device made current when one thread drives several backends (the ranks of a
 * tensor-parallel group): every entry point switches to its own GPU first. */
static cu_backend *cu(tm_backend *be) {
    cu_backend *c = (cu_backend *)be;
    if (c->cfg.shared_thread) cudaSetDevice(c->cfg.device);
    return c;
}

/* Record the first error; ops after it do nothing until last_error() clears it. */
static bool cu_fail(cu_backend *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return false;
    if (c->err_code == TM_OK) c->err_code = tm_err(&c->err, TM_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    return true;
}
static bool cu_failed(cu_backend *c) { return c->err_code != TM_OK; }

/* an environment switch set to exactly `value` */
static bool env_is(const char *name, const char *value) {
    const char *s = getenv(name);
    return s && !strcmp(s, value);
}

static cu_buf *buf_find(cu_backend *c, const void *p) {
    for (int32_t i = 0; i < c->n_bufs; i++)
        if (c->bufs[i].p == p) return &c->bufs[i];
    return NULL;
}
/* p is being written: a record of p's own unwritten bf16 is void, and records remade from p can no longer be */
static void lazy_write(cu_backend *c, const void *p) { tm_lazy_write(&c->lazy, p); }

/* An op wrote buffer p (f32 or bf16): recorded, and xq8 no longer holds p's rounding */
static void buf_mark(cu_backend *c, const void *p, bool f32) {
    cu_buf *b = buf_find(c, p);
    if (b) b->f32 = f32;
    if (p == c->xq8_src) c->xq8_src = NULL;
    lazy_write(c, p);
}

/* p is about to be read as bf16: if its producer left it unwritten, write it now (bit for bit what the producer
 * would have written: the same kernels' arithmetic, tb_norm and tb_elementwise) */
static void lazy_read(cu_backend *c, const void *p) {
    tm_lazy_rec L;
    tm_lazy_state st = tm_lazy_read(&c->lazy, p, &L);
    if (st == TM_LAZY_LOST)
        cu_fail(c, cudaErrorInvalidValue, "read of a bf16 output its producer left unwritten, whose inputs are gone");
    else if (st == TM_LAZY_REMAKE && L.w)
        cu_fail(c, tm_cuda_rmsnorm(L.src, L.w->data, L.eps, L.n, L.dim, (uint16_t *)p, c->stream),
                "rmsnorm (deferred bf16 output)");
    else if (st == TM_LAZY_REMAKE)
        cu_fail(c, tm_cuda_swiglu_rows(L.src, L.n, L.dim, (uint16_t *)p, NULL, 0.0f, c->stream),
                "swiglu (deferred bf16 output)");
}

/* buf (n, dim) was not written; it can be remade from src (w: the norm's weight, NULL: the SwiGLU of src) */
static void lazy_add(cu_backend *c, const void *buf, const void *src, const tm_weight *w, float eps, int32_t n,
                     int32_t dim) {
    if (!tm_lazy_add(&c->lazy, (tm_lazy_rec){.buf = buf, .src = src, .w = w, .eps = eps, .n = n, .dim = dim}))
        cu_fail(c, cudaErrorInvalidValue, "more deferred bf16 outputs than records"); /* the forward has at most two */
}

/* buf (n, dim) holds src (f32) rounded to bf16 where the norm of src (weight w) belongs: a product with norm-in
 * reads it as it is (nin_take), any other reader gets the norm made first (lazy_read) */
static void lazy_add_raw(cu_backend *c, const void *buf, const void *src, const tm_weight *w, float eps, int32_t n,
                         int32_t dim) {
    if (!tm_lazy_add(&c->lazy, (tm_lazy_rec){.buf = buf, .src = src, .w = w, .eps = eps, .n = n, .dim = dim,
                                             .raw = true}))
        cu_fail(c, cudaErrorInvalidValue, "more deferred bf16 outputs than records");
}

/* the weight types whose GEMV takes norm-in */
static bool nin_type(int32_t t) { return t == TM_DT_F32 || t == TM_DT_F16 || t == TM_DT_BF16; }

/* a GEMV of weight type t at n rows can norm a raw residual as it reads it (norm-in) */
static bool nin_reads(const cu_backend *c, int32_t t, int32_t n) {
    return c->norm_in && !c->no_fuse && n >= 1 && n <= TM_CUDA_GEMV_MAX_N && nin_type(t);
}

/* x holds a raw residual (lazy_add_raw) and a GEMV of weight type t at n rows can norm it as it reads it: *r is the
 * record (left in place) */
static bool nin_take(cu_backend *c, const void *x, int32_t t, int32_t n, tm_lazy_rec *r) {
    return nin_reads(c, t, n) && tm_lazy_peek_raw(&c->lazy, x, r);
}

/* Captured graphs hold raw device addresses (metadata, scratch, KV pool, rope table): whenever one of those is
 * reallocated every graph is dropped, to be captured again on the next decode step. */
static void graphs_reset(cu_backend *c) {
    for (int32_t g = 0; g < c->n_graphs; g++) cudaGraphExecDestroy(c->graphs[g].exec);
    c->n_graphs = 0;
}

/* ---- memory ---------------------------------------------------------------------------------------- */

static void *cu_alloc(tm_backend *be, size_t n_elems) {
    cu_backend *c = cu(be);
    if (c->n_bufs == c->cap_bufs) {
        int32_t cap = c->cap_bufs ? 2 * c->cap_bufs : 32;
        cu_buf *nb = realloc(c->bufs, (size_t)cap * sizeof *nb);
        if (!nb) return NULL;
        c->bufs = nb;
        c->cap_bufs = cap;
    }
    void *p = NULL;
    size_t bytes = (n_elems ? n_elems : 1) * sizeof(float); /* room for f32 */
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    c->bufs[c->n_bufs++] = (cu_buf){p, bytes, false};
    return p;
}

static void cu_release(tm_backend *be, void *p) {
    cu_backend *c = cu(be);
    for (int32_t i = 0; i < c->n_bufs; i++) {
        if (c->bufs[i].p != p) continue;
        cudaFree(p);
        c->bufs[i] = c->bufs[--c->n_bufs];
        return;
    }
}

static uint64_t weight_bytes(const tm_weight *w) {
    return tm_dtype_row_bytes(w->type, (uint64_t)w->cols) * (uint64_t)w->rows;
}

/* Make w's values at device address d (weight_bytes(w)): a copy of its host data, or its deferred dummy values
 * made on the device; then w->data = d. Nothing changes on an error. */
static tm_status weight_fill(cu_backend *c, tm_weight *w, void *d, tm_error *err) {
    const uint64_t bytes = weight_bytes(w);
    cudaError_t e;
    if (w->dummy) {
        const bool f8 = w->type == TM_DT_FP8_E4M3;
        if ((w->type != TM_DT_F32 && w->type != TM_DT_F16 && w->type != TM_DT_BF16 && !f8) ||
            (f8 && (!(w->scale > 0.0f) || w->dummy_constant != 0.0f)))
            return tm_err(err, TM_ERR_UNSUPPORTED,
                          "deferred dummy weights are made on the device in f32/f16/bf16, or random fp8 with a scale");
        /* fp8: the bytes are e4m3(dummy_scale * uniform / scale), so the weight's values are dummy_scale * uniform
         * rounded to the fp8 grid */
        e = tm_cuda_fill_random(d, (int32_t)w->type, (size_t)w->rows * (size_t)w->cols, w->dummy_seed,
                                f8 ? w->dummy_scale / w->scale : w->dummy_scale, w->dummy_constant, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    } else {
        e = cudaMemcpy(d, w->data, bytes, cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tm_err(err, TM_ERR_DEVICE, "placing a weight: %s", cudaGetErrorString(e));
    }
    w->data = d;
    w->dummy = false;
    bool quant = w->type != TM_DT_BF16 && w->type != TM_DT_FP8_E4M3; /* fp8 GEMMs read the weight as it is */
    if (quant && (size_t)(w->rows * w->cols) > c->deq_need) c->deq_need = (size_t)(w->rows * w->cols);
    if (w->type == TM_DT_FP8_E4M3 && w->cols > c->max_fp8_cols) c->max_fp8_cols = w->cols;
    if (w->type == TM_DT_FP8_E4M3 && c->fp8_act != w->act_scale) c->fp8_act = c->fp8_act == 0.0f ? w->act_scale : -1.0f;
    if (w->rows > c->max_ffn_rows) c->max_ffn_rows = w->rows;
    return TM_OK;
}

static tm_status weight_malloc(const tm_weight *w, uint64_t bytes, void **d, tm_error *err) {
    *d = NULL;
    cudaError_t e = cudaMalloc(d, bytes ? bytes : 1);
    if (e == cudaSuccess) return TM_OK;
    cudaGetLastError();
    *d = NULL;
    return tm_err(err, TM_ERR_NOMEM, "device memory for a %lld x %lld %s weight (%.1f MB): %s", (long long)w->rows,
                  (long long)w->cols, tm_dtype_name(w->type), (double)bytes / 1e6, cudaGetErrorString(e));
}

static tm_status cu_weight_place(tm_backend *be, tm_weight *w, tm_error *err) {
    cu_backend *c = cu(be);
    if (!tm_cuda_weight_type_supported((int32_t)w->type))
        return tm_err(err, TM_ERR_UNSUPPORTED, "weight type %s has no CUDA kernels", tm_dtype_name(w->type));
    void *d = NULL;
    tm_status s = weight_malloc(w, weight_bytes(w), &d, err);
    if (s != TM_OK) return s;
    s = weight_fill(c, w, d, err);
    if (s != TM_OK) cudaFree(d);
    return s;
}

/* q|k|v and gate|up in one allocation each (backend.h): bf16 and fp8 weights whose sizes keep every member
 * 256-byte aligned; the products that share their input then run as one GEMM (larger batches) */
static tm_status cu_weight_place_group(tm_backend *be, tm_weight *const *ws, int32_t n, tm_error *err) {
    cu_backend *c = cu(be);
    uint64_t total = 0;
    int64_t rows = 0;
    for (int32_t i = 0; i < n; i++) {
        const tm_weight *w = ws[i];
        if ((w->type != TM_DT_BF16 && w->type != TM_DT_FP8_E4M3) || w->type != ws[0]->type ||
            w->cols != ws[0]->cols || weight_bytes(w) % 256)
            return tm_err(err, TM_ERR_UNSUPPORTED, "weights placed together: bf16 or fp8 of one width, 256-byte sizes");
        total += weight_bytes(w);
        rows += w->rows;
    }
    if (c->n_wgroups == c->cap_wgroups) {
        int32_t cap = c->cap_wgroups ? 2 * c->cap_wgroups : 64;
        cu_wgroup *ng = realloc(c->wgroups, (size_t)cap * sizeof *ng);
        if (!ng) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        c->wgroups = ng;
        c->cap_wgroups = cap;
    }
    void *mem = NULL;
    tm_status ms = weight_malloc(ws[0], total, &mem, err);
    if (ms != TM_OK) return ms;
    uint8_t *base = mem;
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        tm_status s = weight_fill(c, ws[i], base + off, err);
        if (s != TM_OK) { /* the caller places them again one by one */
            cudaFree(base);
            return s;
        }
        off += weight_bytes(ws[i]);
    }
    c->wgroups[c->n_wgroups++] = (cu_wgroup){base, total, n};
    if (rows > c->max_ffn_rows) c->max_ffn_rows = rows; /* a fused product's output goes to ffn_tmp */
    return TM_OK;
}

static void cu_weight_release(tm_backend *be, tm_weight *w) {
    cu_backend *c = cu(be);
    const uint8_t *p = w->data;
    w->data = NULL;
    for (int32_t g = 0; g < c->n_wgroups; g++) {
        cu_wgroup *G = &c->wgroups[g];
        if (p < G->base || p >= G->base + G->bytes) continue;
        if (--G->live == 0) {
            cudaFree(G->base);
            c->wgroups[g] = c->wgroups[--c->n_wgroups];
        }
        return;
    }
    cudaFree((void *)p);
}

/* b's rows start where a's end and b has a's type, width and scales: a and b can run as one product */
static bool weight_follows(const tm_weight *a, const tm_weight *b) {
    return b->type == a->type && b->cols == a->cols && b->scale == a->scale && b->act_scale == a->act_scale &&
           (const uint8_t *)b->data == (const uint8_t *)a->data + weight_bytes(a);
}

static tm_status cu_kv_init(tm_backend *be, const tm_kv_cfg *cfg, tm_error *err) {
    cu_backend *c = cu(be);
    graphs_reset(c);
    cudaStreamSynchronize(c->stream);
    cudaFree(c->kv_mem);
    c->kv_mem = NULL;
    if (cfg->dtype != TM_DT_BF16 && cfg->dtype != TM_DT_FP8_E4M3)
        return tm_err(err, TM_ERR_INVALID, "cuda backend: KV cache type %s (bf16 or fp8_e4m3)", tm_dtype_name(cfg->dtype));
    c->kv = *cfg;
    c->kv_fp8 = cfg->dtype == TM_DT_FP8_E4M3;
    c->layer_elems = (size_t)(cfg->n_blocks + 1) * (size_t)cfg->n_kv_heads * (size_t)cfg->block_size * (size_t)cfg->head_dim;
    size_t bytes = c->layer_elems * 2 * (size_t)cfg->n_layers * (c->kv_fp8 ? 1u : sizeof(uint16_t));
    cudaError_t e = cudaMalloc((void **)&c->kv_mem, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        c->kv_mem = NULL;
        return tm_err(err, TM_ERR_NOMEM, "KV cache of %.2f GB on the device: %s", (double)bytes / 1e9,
                      cudaGetErrorString(e));
    }
    /* zero, so that the scratch block of padded tokens never holds NaN bit patterns */
    if ((e = cudaMemset(c->kv_mem, 0, bytes)) != cudaSuccess)
        return tm_err(err, TM_ERR_DEVICE, "clearing the KV cache: %s", cudaGetErrorString(e));
    /* the whole-layer kernel's counters and attention partials (when it is on): up to 8 query heads per kv head */
    cudaFree(c->layer_work);
    c->layer_work = NULL;
    if (!c->layer_on) return TM_OK;
    const size_t work_bytes = tm_cuda_layer_work_bytes(cfg->n_kv_heads * 8, cfg->head_dim);
    if ((e = cudaMalloc(&c->layer_work, work_bytes)) != cudaSuccess ||
        (e = cudaMemset(c->layer_work, 0, work_bytes)) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(c->layer_work);
        c->layer_work = NULL;
        return tm_err(err, TM_ERR_NOMEM, "whole-layer kernel work buffer: %s", cudaGetErrorString(e));
    }
    return TM_OK;
}

/* layer's K (which 0) or V (1) cache; an e4m3 cache is addressed in bytes (the pointer type stays) */
static uint16_t *kv_layer(cu_backend *c, int32_t layer, int32_t which) {
    const size_t at = ((size_t)layer * 2 + (size_t)which) * c->layer_elems;
    return c->kv_fp8 ? (uint16_t *)((uint8_t *)c->kv_mem + at) : c->kv_mem + at;
}

/* ---- step planning and metadata upload -------------------------------------------------------------- */

static int32_t bucket_tokens(int32_t n) {
    if (n <= 8) {
        int32_t b = 1;
        while (b < n) b *= 2;
        return b;
    }
    if (n <= 64) return (n + 7) / 8 * 8;
    if (n <= 256) return (n + 31) / 32 * 32;
    return (n + 127) / 128 * 128;
}

static int32_t bucket_ctx(int32_t n, int32_t cap) {
    int32_t b = 256;
    while (b < n) b *= 2;
    return b < cap ? b : cap;
}

static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

/* Grow a device scratch buffer (never while capturing: begin_step runs before a capture starts). */
static tm_status grow(cu_backend *c, void **p, size_t *have, size_t need, const char *what, tm_error *err) {
    if (need <= *have) return TM_OK;
    graphs_reset(c);
    cudaStreamSynchronize(c->stream); /* the old buffer may still be in use by queued work */
    cudaFree(*p);
    *p = NULL;
    *have = 0;
    cudaError_t e = cudaMalloc(p, need);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return tm_err(err, TM_ERR_NOMEM, "device %s of %zu bytes: %s", what, need, cudaGetErrorString(e));
    }
    *have = need;
    return TM_OK;
}

/* TM_CUDA_STEP_TIMING: a replayed graph is about to launch. The period counts from the previous step's launch when
 * that was a timed replay whose ids were read back (t_prev > 0: cu_begin_step clears t_launch for every step). */
static void step_timing_launch(cu_backend *c, double t_prev, double t_ids_prev) {
    double now = tm_time_s();
    if (t_prev > 0.0 && !c->t_open && t_ids_prev > 0.0) {
        c->t_period_s += now - t_prev;
        c->t_engine_s += c->t_entry - t_ids_prev;
        c->t_prep_s += now - c->t_entry;
        c->t_periods++;
    }
    c->t_launch = now;
    c->t_open = cudaEventRecord(c->t_ev[0], c->stream) == cudaSuccess;
}

static tm_status cu_begin_step(tm_backend *be, const tm_batch *b, tm_step_plan *plan, tm_error *err) {
    cu_backend *c = cu(be);
    if (!c->kv_mem) return tm_err(err, TM_ERR_INVALID, "cuda backend: no KV cache (kv_init first)");
    if (cu_failed(c)) return tm_err(err, c->err_code, "%s", c->err.msg);
    const double t_prev = c->t_launch, t_ids_prev = c->t_ids;
    c->t_launch = c->t_ids = 0.0;
    c->t_replay = false;
    if (c->timing) c->t_entry = tm_time_s();
    int32_t n = b->n_tokens, ns = b->n_seqs, max_q = 0, max_ctx = 0, n_dec = 0, max_ctx_dec = 0;
    for (int32_t s = 0; s < ns; s++) {
        int32_t q = b->query_start[s + 1] - b->query_start[s];
        if (q > max_q) max_q = q;
        if (b->context_len[s] > max_ctx) max_ctx = b->context_len[s];
        if (q == 1 && n_dec == s) { /* the leading run of one-token sequences */
            n_dec++;
            if (b->context_len[s] > max_ctx_dec) max_ctx_dec = b->context_len[s];
        }
    }
    bool mixed = c->split_mixed && n_dec > 0 && n_dec < ns && b->query_start[n_dec] == n_dec;
    if (!mixed) n_dec = 0;
    const int32_t fresh_from = max_q > 1 ? tm_batch_fresh_from(b, n_dec) : ns;
    int32_t cap_ctx = b->max_blocks * c->kv.block_size;
    /* decode-only steps that want every row's logits, in row order, run as CUDA graphs padded to a bucket (the
     * forward skips the row gather there: tm_batch_logits_all) */
    bool graph = !c->cfg.no_graphs && !c->graphs_off && max_q == 1 && n == ns && tm_batch_logits_all(b);
    int32_t nt = graph ? bucket_tokens(n) : n, nsp = graph ? nt : ns, nl = graph ? nt : b->n_logits;
    if (nt > c->max_tokens || nl > c->cfg.max_logits) {
        graph = false;
        nt = n;
        nsp = ns;
        nl = b->n_logits;
    }
    int32_t ctxb = graph ? bucket_ctx(max_ctx, cap_ctx) : max_ctx;
    int32_t stride = graph ? (ctxb + c->kv.block_size - 1) / c->kv.block_size : (max_ctx + c->kv.block_size - 1) / c->kv.block_size;
    if (stride < 1) stride = 1;
    if (stride > b->max_blocks) stride = b->max_blocks;

    /* scratch sized before any capture: attention work, dequant buffer, SwiGLU temp, staging */
    tm_status s;
    size_t aw = 0;
    if (c->n_heads > 0) {
        size_t d = tm_cuda_attn_decode_work_bytes(c->max_tokens, c->n_heads, c->kv.head_dim, cap_ctx);
        size_t p = tm_cuda_attn_prefill_work_bytes(c->max_tokens, c->n_heads, c->kv.head_dim);
        aw = d > p ? d : p;
    }
    if ((s = grow(c, &c->attn_work, &c->attn_work_bytes, aw ? aw : 256, "attention work", err)) != TM_OK) return s;
    size_t deq_bytes = c->deq_elems * 2;
    if ((s = grow(c, (void **)&c->deq, &deq_bytes, c->deq_need * 2, "dequant buffer", err)) != TM_OK) return s;
    c->deq_elems = deq_bytes / 2;
    size_t ffn_bytes = c->ffn_elems * 2;
    if ((s = grow(c, (void **)&c->ffn_tmp, &ffn_bytes, (size_t)c->max_tokens * (size_t)c->max_ffn_rows * 2, "ffn buffer",
                  err)) != TM_OK)
        return s;
    c->ffn_elems = ffn_bytes / 2;
    const size_t xq8_rows = c->max_tokens > 2 * TM_CUDA_GEMV_MAX_N ? (size_t)c->max_tokens : 2 * TM_CUDA_GEMV_MAX_N;
    if ((s = grow(c, (void **)&c->xq8, &c->xq8_bytes, xq8_rows * (size_t)c->max_fp8_cols + 256, "fp8 activations",
                  err)) != TM_OK)
        return s;

    /* layout: slots (i64) | ids | pos | seq | lidx | qstart | ctx | btab */
    size_t o_slots = 0, o_ids = align8(o_slots + (size_t)nt * 8), o_pos = align8(o_ids + (size_t)nt * 4),
           o_seq = align8(o_pos + (size_t)nt * 4), o_lidx = align8(o_seq + (size_t)nt * 4),
           o_qs = align8(o_lidx + (size_t)(nl > 0 ? nl : 1) * 4), o_ctx = align8(o_qs + (size_t)(nsp + 1) * 4),
           o_bt = align8(o_ctx + (size_t)nsp * 4), o_qst = align8(o_bt + (size_t)nsp * (size_t)stride * 4),
           o_sqt = align8(o_qst + (size_t)(mixed ? ns - n_dec + 1 : 0) * 4),
           o_src = align8(o_sqt + (size_t)(mixed ? n - n_dec : 0) * 4),
           total = align8(o_src + (size_t)(b->token_src || graph ? nt : 0) * 4);
    if (total > c->meta_cap) {
        graphs_reset(c);
        cudaStreamSynchronize(c->stream);
        if (c->meta_pending) cudaEventSynchronize(c->meta_done);
        c->meta_pending = false;
        cudaFreeHost(c->meta_host);
        cudaFree(c->meta_dev);
        c->meta_host = c->meta_dev = NULL;
        c->meta_cap = 0;
        size_t cap = total * 2;
        if (cudaMallocHost((void **)&c->meta_host, cap) != cudaSuccess || cudaMalloc((void **)&c->meta_dev, cap) != cudaSuccess) {
            cudaGetLastError();
            return tm_err(err, TM_ERR_NOMEM, "batch metadata buffers of %zu bytes", cap);
        }
        c->meta_cap = cap;
    }
    if (c->meta_pending) { /* the previous step's copy must be done before the staging is rewritten */
        cudaEventSynchronize(c->meta_done);
        c->meta_pending = false;
    }
    uint8_t *h = c->meta_host;
    int64_t *slots = (int64_t *)(h + o_slots);
    int32_t *ids = (int32_t *)(h + o_ids), *pos = (int32_t *)(h + o_pos), *seq = (int32_t *)(h + o_seq),
            *lidx = (int32_t *)(h + o_lidx), *qs = (int32_t *)(h + o_qs), *ctx = (int32_t *)(h + o_ctx),
            *bt = (int32_t *)(h + o_bt);
    int64_t scratch_slot = (int64_t)c->kv.n_blocks * c->kv.block_size;
    for (int32_t i = 0; i < nt; i++) {
        bool real = i < n;
        slots[i] = real ? b->slot_mapping[i] : scratch_slot;
        ids[i] = real ? b->token_ids[i] : 0;
        pos[i] = real ? b->positions[i] : 0;
        seq[i] = real ? b->seq_index[i] : i;
    }
    for (int32_t j = 0; j < nl; j++) lidx[j] = j < b->n_logits ? b->logits_index[j] : j;
    for (int32_t k = 0; k <= nsp; k++) qs[k] = k <= ns ? b->query_start[k] : b->query_start[ns] + (k - ns);
    for (int32_t k = 0; k < nsp; k++) {
        int32_t *row = bt + (size_t)k * (size_t)stride;
        if (k < ns) {
            ctx[k] = b->context_len[k];
            int32_t used = (b->context_len[k] + c->kv.block_size - 1) / c->kv.block_size;
            if (used > stride) used = stride;
            memcpy(row, b->block_table + (size_t)k * (size_t)b->max_blocks, (size_t)used * 4);
            for (int32_t j = used; j < stride; j++) row[j] = c->kv.n_blocks;
        } else { /* padded sequence: one entry in the scratch block */
            ctx[k] = 1;
            for (int32_t j = 0; j < stride; j++) row[j] = c->kv.n_blocks;
        }
    }
    if (b->token_src || graph) { /* a pipelined step: these ids come from the previous pass's, on the device (a
                                  * graph reads the sources at every replay: -1 where there are none) */
        int32_t *src = (int32_t *)(h + o_src);
        for (int32_t i = 0; i < nt; i++) src[i] = i < n && b->token_src ? b->token_src[i] : -1;
    }
    if (mixed) { /* the prefill part as a batch of its own */
        int32_t *qst = (int32_t *)(h + o_qst), *sqt = (int32_t *)(h + o_sqt);
        for (int32_t k = n_dec; k <= ns; k++) qst[k - n_dec] = b->query_start[k] - n_dec;
        for (int32_t i = n_dec; i < n; i++) sqt[i - n_dec] = b->seq_index[i] - n_dec;
    }
    if (cu_fail(c, cudaMemcpyAsync(c->meta_dev, h, total, cudaMemcpyHostToDevice, c->stream), "batch upload") ||
        cu_fail(c, cudaEventRecord(c->meta_done, c->stream), "batch upload event"))
        return tm_err(err, c->err_code, "%s", c->err.msg);
    c->meta_pending = true;
    uint8_t *d = c->meta_dev;
    c->d_slots = (int64_t *)(d + o_slots);
    c->d_ids = (int32_t *)(d + o_ids);
    c->d_src = b->token_src || graph ? (int32_t *)(d + o_src) : NULL;
    c->d_pos = (int32_t *)(d + o_pos);
    c->d_seq = (int32_t *)(d + o_seq);
    c->d_lidx = (int32_t *)(d + o_lidx);
    c->d_qstart = (int32_t *)(d + o_qs);
    c->d_ctx = (int32_t *)(d + o_ctx);
    c->d_btab = (int32_t *)(d + o_bt);
    c->d_qs_tail = (int32_t *)(d + o_qst);
    c->d_seq_tail = (int32_t *)(d + o_sqt);
    c->n_dec = n_dec;
    c->max_ctx_dec = max_ctx_dec;
    c->fresh_from = fresh_from < ns ? fresh_from : -1;
    c->rows_layer = -1;
    c->n_tokens = nt;
    c->n_seqs = nsp;
    c->n_logits = nl;
    c->stride = stride;
    c->max_q = max_q;
    c->max_ctx = graph ? ctxb : max_ctx;
    c->ctx_bucket = ctxb;
    c->host_batch = b;
    c->xq8_src = NULL;
    tm_lazy_reset(&c->lazy); /* nothing of an earlier pass is read */
    plan->n_tokens = nt;
    plan->n_logits = nl;
    plan->replayed = false;
    if (!graph || c->n_heads == 0 || !c->d_inv_freq) return TM_OK; /* first pass runs eagerly (sets up scratch) */
    for (int32_t g = 0; g < c->n_graphs; g++) {
        cu_graph *G = &c->graphs[g];
        if (G->n_tokens == nt && G->n_logits == nl && G->ctx_bucket == ctxb) {
            if (c->timing) step_timing_launch(c, t_prev, t_ids_prev);
            if (cu_fail(c, cudaGraphLaunch(G->exec, c->stream), "graph launch")) return tm_err(err, c->err_code, "%s", c->err.msg);
            plan->replayed = true;
            c->t_replay = true;
            return TM_OK;
        }
    }
    if (c->n_graphs == CU_MAX_GRAPHS) return TM_OK;
    if (cu_fail(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "graph capture"))
        return tm_err(err, c->err_code, "%s", c->err.msg);
    c->capturing = true;
    c->pending = (cu_graph){.n_tokens = nt, .n_logits = nl, .ctx_bucket = ctxb, .exec = NULL};
    return TM_OK;
}

/* TM_CUDA_LAYER=1: a step is wrong if a whole-layer launch gave up at a grid barrier (never expected: the grid is
 * co-resident); checked after each step, which waits for it (the opt-in mode's cost) */
static tm_status layer_check(cu_backend *c, tm_error *err) {
    if (!c->layer_on || !c->layer_work || cu_failed(c)) return TM_OK;
    bool failed = false;
    cudaError_t e = tm_cuda_layer_failed(c->layer_work, &failed, c->stream);
    if (e != cudaSuccess) return tm_err(err, TM_ERR_DEVICE, "whole-layer kernel check: %s", cudaGetErrorString(e));
    if (failed)
        return tm_err(err, TM_ERR_DEVICE, "whole-layer kernel: a grid barrier gave up waiting; results are wrong");
    return TM_OK;
}

static tm_status cu_end_step(tm_backend *be, bool *rerun, tm_error *err) {
    cu_backend *c = cu(be);
    *rerun = false;
    if (!c->capturing) return layer_check(c, err);
    c->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    cudaGraphExec_t exec = NULL;
    if (e == cudaSuccess && !cu_failed(c)) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess || cu_failed(c)) {
        /* capture failed: graphs off for good, the pass runs again eagerly */
        cudaGetLastError();
        tm_log(TM_LOG_WARN, "cuda: graph capture failed (%s%s), running without graphs", cudaGetErrorString(e),
               cu_failed(c) ? c->err.msg : "");
        c->err_code = TM_OK;
        c->graphs_off = true;
        *rerun = true;
        return TM_OK;
    }
    c->pending.exec = exec;
    c->graphs[c->n_graphs++] = c->pending;
    tm_log(TM_LOG_INFO, "cuda: captured decode graph %d (%d tokens, %d logits, context bucket %d)", c->n_graphs,
           c->pending.n_tokens, c->pending.n_logits, c->pending.ctx_bucket);
    if (cu_fail(c, cudaGraphLaunch(exec, c->stream), "graph launch")) return tm_err(err, c->err_code, "%s", c->err.msg);
    return layer_check(c, err);
}

static tm_status cu_last_error(tm_backend *be, tm_error *err) {
    cu_backend *c = cu(be);
    if (c->err_code == TM_OK) return TM_OK;
    tm_status s = tm_err(err, c->err_code, "%s", c->err.msg);
    c->err_code = TM_OK;
    return s;
}

/* ---- ops --------------------------------------------------------------------------------------------- */

static const int32_t *dev_ids(cu_backend *c, const int32_t *host) {
    const tm_batch *b = c->host_batch;
    if (b && host == b->token_ids) return c->d_ids;
    if (b && host == b->logits_index) return c->d_lidx;
    return NULL;
}

/* x = the rows of ids (a pipelined step's from the previous pass's ids, d_src), and raw (or NULL) x in bf16 */
static void embed_run(cu_backend *c, const tm_weight *table, const int32_t *ids, int32_t n, void *x, uint16_t *raw) {
    const int32_t *d = dev_ids(c, ids);
    if (!d) {
        cu_fail(c, cudaErrorInvalidValue, "embed: ids are not the step's token ids");
        return;
    }
    cu_fail(c, tm_cuda_embed_ex(table->data, (int32_t)table->type, table->cols, d, c->d_src, c->d_ids_out, n, x, raw,
                                c->stream),
            "embed");
    buf_mark(c, x, true);
    if (raw) buf_mark(c, raw, false);
}

static void cu_embed(tm_backend *be, const tm_weight *table, const int32_t *ids, int32_t n, void *x) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    embed_run(c, table, ids, n, x, NULL);
}

/* src's op also wrote e4m3(src / act) for elems elements at `at` in xq8 (after its buf_mark of src) */
static void xq8_leave(cu_backend *c, const void *src, float act, size_t elems, const uint8_t *at) {
    c->xq8_src = src;
    c->xq8_at = at;
    c->xq8_act = act;
    c->xq8_elems = elems;
}

/* x's e4m3 copy for an fp8 product with activation scale act over elems elements of x, when x's producer left one
 * (used once), else NULL */
static const uint8_t *xq8_take(cu_backend *c, const void *x, float act, size_t elems) {
    if (c->xq8_src != x || c->xq8_act != act || c->xq8_elems != elems) return NULL;
    c->xq8_src = NULL;
    return c->xq8_at;
}

/* Batch <= 8: the second slot of xq8, which the SwiGLU GEMV writes its e4m3 output to while it reads its input's
 * copy from the first (one launch reads one and writes the other); the first when `in` is the second */
static uint8_t *xq8_small_out(cu_backend *c, const uint8_t *in) {
    uint8_t *second = c->xq8 + (((size_t)TM_CUDA_GEMV_MAX_N * (size_t)c->max_fp8_cols + 255) & ~(size_t)255);
    return in == second ? c->xq8 : second;
}

/* A norm (or the decode attention) at a GEMM-sized batch of an fp8 model (one activation scale) also leaves its
 * output rounded to e4m3 in xq8, for the fp8 products that take it next (matmul_fp8 then skips its own rounding) */
static bool leaves_fp8(const cu_backend *c, int64_t dim, int32_t n) {
    return !c->no_fuse_gemm && !c->no_fp8_left && n > TM_CUDA_GEMV_MAX_N && c->fp8_act > 0.0f && c->xq8 &&
           dim % 8 == 0 && dim <= 8192 &&
           (size_t)n * (size_t)dim <= c->xq8_bytes;
}

/* The same at batch <= 8 (the GEMV path), for the tensor-core GEMV (tm_cuda_fp8_scales.xq): the copy goes to xq8's
 * first slot, and the bf16 output is written too (a few KB; nothing is deferred). Rounding x in every product cost
 * it 1-14% (docs/PERFORMANCE.md, twenty-eighth session). */
static bool leaves_fp8_small(const cu_backend *c, int64_t dim, int32_t n) {
    return !c->no_fp8_left && !c->no_fp8_left_small && n >= 1 && n <= TM_CUDA_GEMV_MAX_N && c->fp8_act > 0.0f &&
           c->xq8 && dim % 64 == 0 && dim <= c->max_fp8_cols;
}

static void norm_run(cu_backend *c, float *residual, const void *x, const tm_weight *w, float eps, int32_t n, void *out) {
    const int32_t dim = (int32_t)w->cols;
    lazy_read(c, x);
    if (residual) lazy_write(c, residual); /* before the record below, whose source it is */
    if (leaves_fp8(c, dim, n)) { /* fp8_only: the e4m3 copy alone, the bf16 output when something reads it */
        if (cu_fail(c, tm_cuda_rmsnorm_fp8(residual, residual ? x : NULL, residual ? NULL : x, w->data, eps, n, dim,
                                           c->fp8_only ? NULL : out, c->xq8, 1.0f / c->fp8_act, c->stream),
                    "rmsnorm_fp8"))
            return;
        buf_mark(c, out, false);
        xq8_leave(c, out, c->fp8_act, (size_t)n * (size_t)dim, c->xq8);
        if (c->fp8_only) lazy_add(c, out, residual ? (const void *)residual : x, w, eps, n, dim);
        return;
    }
    if (dim <= 8192 && leaves_fp8_small(c, dim, n)) { /* both outputs: the same kernel as below, with the e4m3 copy */
        if (cu_fail(c, tm_cuda_rmsnorm_fp8(residual, residual ? x : NULL, residual ? NULL : x, w->data, eps, n, dim,
                                           out, c->xq8, 1.0f / c->fp8_act, c->stream),
                    "rmsnorm_fp8"))
            return;
        buf_mark(c, out, false);
        xq8_leave(c, out, c->fp8_act, (size_t)n * (size_t)dim, c->xq8);
        return;
    }
    if (residual)
        cu_fail(c, tm_cuda_add_rmsnorm(residual, x, w->data, eps, n, dim, out, c->stream), "add_rmsnorm");
    else
        cu_fail(c, tm_cuda_rmsnorm(x, w->data, eps, n, dim, out, c->stream), "rmsnorm");
    buf_mark(c, out, false);
}

static void cu_rmsnorm(tm_backend *be, const void *x, const tm_weight *w, float eps, int32_t n, void *out) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    norm_run(c, NULL, x, w, eps, n, out);
}

/* The pass's embedding and first norm. Where the first product norms its input (norm-in, as after down: a batch
 * the GEMV takes with 16-bit or f32 weights), the embedding kernel also writes x rounded to bf16 into out and no
 * norm kernel runs; any other reader of out gets the norm made first (lazy_read). */
static bool cu_embed_rmsnorm(tm_backend *be, const tm_weight *table, const int32_t *ids, int32_t n, void *x,
                             const tm_weight *norm_w, float eps, void *out, const tm_weight *next) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return true;
    const int32_t dim = (int32_t)table->cols;
    const bool raw = nin_reads(c, (int32_t)next->type, n) && c->norm_in_sel != NORM_IN_AFTER_O &&
                     n < tm_cuda_gemv_tc_min_n((int32_t)next->type) && next->cols == dim && norm_w->cols == dim;
    embed_run(c, table, ids, n, x, raw ? out : NULL);
    if (cu_failed(c)) return true;
    if (raw)
        lazy_add_raw(c, out, x, norm_w, eps, n, dim);
    else
        norm_run(c, NULL, x, norm_w, eps, n, out);
    return true;
}

static void cu_add_rmsnorm(tm_backend *be, void *residual, const void *x, const tm_weight *w, float eps, int32_t n,
                           void *out) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    norm_run(c, residual, x, w, eps, n, out);
}

/* the GEMV launchers' view of a weight: its fp8 scales (gate and up for SwiGLU), or NULL for the other types */
static const tm_cuda_fp8_scales *fp8_of(const tm_weight *w, const tm_weight *up, tm_cuda_fp8_scales *buf) {
    if (w->type != TM_DT_FP8_E4M3) return NULL;
    *buf = (tm_cuda_fp8_scales){.w = w->scale, .w_up = up ? up->scale : 0.0f, .act = w->act_scale, .xq = NULL,
                                .out8 = NULL};
    return buf;
}

/* nin: the raw record of x when the product norms its input as it reads it (norm-in), else NULL */
static tm_cuda_gemv_job gemv_job(const tm_weight *w, const tm_weight *bias, void *out, const tm_lazy_rec *nin) {
    return (tm_cuda_gemv_job){.w = w->data, .rows = w->rows, .bias = bias ? bias->data : NULL, .out = out,
                              .scale = w->scale, .act_scale = w->act_scale, .norm_w = nin ? nin->w->data : NULL,
                              .norm_eps = nin ? nin->eps : 0.0f, .xq = NULL};
}

/* the e4m3 copy of x (n, w's cols) that x's producer left for the GEMV of fp8 weight w (a group shares it), or NULL */
static const uint8_t *gemv_xq(cu_backend *c, const tm_weight *w, const void *x, int32_t n) {
    return w->type == TM_DT_FP8_E4M3 ? xq8_take(c, x, w->act_scale, (size_t)n * (size_t)w->cols) : NULL;
}

/* fp8 weights at large n (W8A8, backend.h): x (n, cols) rounded to e4m3 once for every product that shares its
 * act_scale, then one cuBLASLt fp8 GEMM per weight: outs[i] (n, ws[i]->rows) bf16 = scale * act_scale * xq · wqᵀ */
static void matmul_fp8(cu_backend *c, const tm_weight *const *ws, const tm_weight *const *biases, void *const *outs,
                       const bool *out_f32, int32_t count, const void *x, int32_t n) {
    float quantized_for = 0.0f; /* the act_scale xin holds x for, 0: none yet */
    const uint8_t *xin = c->xq8;  /* x in e4m3 */
    for (int32_t i = 0; i < count && !cu_failed(c); i++) {
        const tm_weight *w = ws[i];
        if (biases[i]) {
            cu_fail(c, cudaErrorNotSupported, "fp8 GEMM with a bias");
            return;
        }
        if ((size_t)n * (size_t)w->cols > c->xq8_bytes) {
            cu_fail(c, cudaErrorMemoryAllocation, "fp8 activation buffer too small");
            return;
        }
        if (w->act_scale != quantized_for) {
            const size_t elems = (size_t)n * (size_t)w->cols;
            xin = xq8_take(c, x, w->act_scale, elems);
            c->xq8_src = NULL; /* used once, or overwritten now */
            if (!xin) {
                lazy_read(c, x);
                if (cu_fail(c, tm_cuda_quant_fp8(x, elems, 1.0f / w->act_scale, c->xq8, c->stream), "quant_fp8"))
                    return;
                xin = c->xq8;
            }
            quantized_for = w->act_scale;
        }
        tm_error e;
        if (tm_cuda_blas_gemm_fp8(c->blas, xin, w->data, w->scale * w->act_scale, outs[i], out_f32[i], n, w->rows,
                                  w->cols, c->stream, &e) != TM_OK &&
            c->err_code == TM_OK)
            c->err_code = tm_err(&c->err, TM_ERR_DEVICE, "%s", e.msg);
    }
}

/* out (n, rows) = x · wᵀ: fused dequant GEMV for small n, cuBLASLt (after dequantizing to bf16) otherwise */
static void matmul_one(cu_backend *c, const tm_weight *w, const tm_weight *bias, const void *x, int32_t n, void *out,
                       bool out_f32) {
    const float *bd = bias ? bias->data : NULL;
    lazy_write(c, out);
    if (w->type != TM_DT_FP8_E4M3 || n <= TM_CUDA_GEMV_MAX_N) lazy_read(c, x); /* fp8 GEMMs: in matmul_fp8 */
    if (n <= TM_CUDA_GEMV_MAX_N) {
        tm_cuda_fp8_scales f8;
        const tm_cuda_fp8_scales *fs = fp8_of(w, NULL, &f8);
        if (fs) f8.xq = xq8_take(c, x, w->act_scale, (size_t)n * (size_t)w->cols);
        cu_fail(c, tm_cuda_gemv(w->data, (int32_t)w->type, w->rows, w->cols, x, n, bd, out, out_f32, fs, c->stream),
                "gemv");
        return;
    }
    if (w->type == TM_DT_FP8_E4M3) {
        matmul_fp8(c, &w, &bias, &out, &out_f32, 1, x, n);
        return;
    }
    if (n <= tm_cuda_qgemm_max_n((int32_t)w->type) && !c->no_qgemm) {
        /* GGUF-quantized: decoded in registers by a tensor-core kernel (the types and shapes it does not take are
         * dequantized below) */
        const cudaError_t e = tm_cuda_qgemm(w->data, (int32_t)w->type, w->rows, w->cols, x, n, bd, out, out_f32,
                                            c->qg_work, c->stream);
        if (e != cudaErrorNotSupported) {
            cu_fail(c, e, "qgemm");
            return;
        }
    }
    const uint16_t *wb = w->data;
    if (w->type != TM_DT_BF16) {
        if ((size_t)(w->rows * w->cols) > c->deq_elems) {
            cu_fail(c, cudaErrorMemoryAllocation, "dequant buffer too small");
            return;
        }
        if (cu_fail(c, tm_cuda_dequant_bf16(w->data, (int32_t)w->type, w->rows, w->cols, c->deq, c->stream), "dequant"))
            return;
        wb = c->deq;
    }
    tm_error e;
    if (tm_cuda_blas_gemm(c->blas, x, wb, bd, out, out_f32, n, w->rows, w->cols, c->stream, &e) != TM_OK &&
        c->err_code == TM_OK)
        c->err_code = tm_err(&c->err, TM_ERR_DEVICE, "%s", e.msg);
}

static void cu_matmul(tm_backend *be, const tm_matmul_job *jobs, int32_t n_jobs, const void *x, int32_t n) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    /* small batches: jobs of one type and width (q, k, v) go out as one grouped GEMV launch (one job too: the
     * output projection after a raw residual norms it as it reads it) */
    bool group = n_jobs >= 1 && n_jobs <= TM_CUDA_GEMV_MAX_JOBS && n <= TM_CUDA_GEMV_MAX_N;
    for (int32_t j = 1; j < n_jobs && group; j++)
        group = jobs[j].w->type == jobs[0].w->type && jobs[j].w->cols == jobs[0].w->cols &&
                jobs[j].out_f32 == jobs[0].out_f32;
    if (group) {
        tm_lazy_rec nr;
        const bool nin = nin_take(c, x, (int32_t)jobs[0].w->type, n, &nr);
        if (!nin) lazy_read(c, x);
        const uint8_t *xq = gemv_xq(c, jobs[0].w, x, n);
        tm_cuda_gemv_job gj[TM_CUDA_GEMV_MAX_JOBS];
        for (int32_t j = 0; j < n_jobs; j++) {
            gj[j] = gemv_job(jobs[j].w, jobs[j].bias, jobs[j].out, nin ? &nr : NULL);
            gj[j].xq = xq;
            buf_mark(c, jobs[j].out, jobs[j].out_f32);
        }
        cudaError_t e = tm_cuda_gemv_group(gj, n_jobs, (int32_t)jobs[0].w->type, jobs[0].w->cols, x, n,
                                           jobs[0].out_f32, c->stream);
        if (e == cudaErrorNotSupported && nin) { /* the launcher cannot norm (alignment, TM_CUDA_GEMV_V=1) */
            lazy_read(c, x);
            for (int32_t j = 0; j < n_jobs; j++) gj[j].norm_w = NULL;
            e = tm_cuda_gemv_group(gj, n_jobs, (int32_t)jobs[0].w->type, jobs[0].w->cols, x, n, jobs[0].out_f32,
                                   c->stream);
        }
        cu_fail(c, e, "gemv_group");
        return;
    }
    /* large batches of fp8 weights (q, k, v): x rounded to e4m3 once for all of them */
    bool all_fp8 = n > TM_CUDA_GEMV_MAX_N && n_jobs <= TM_MATMUL_MAX_JOBS;
    for (int32_t j = 0; j < n_jobs && all_fp8; j++) all_fp8 = jobs[j].w->type == TM_DT_FP8_E4M3;
    if (all_fp8) {
        const tm_weight *ws[TM_MATMUL_MAX_JOBS], *bs[TM_MATMUL_MAX_JOBS];
        void *outs[TM_MATMUL_MAX_JOBS];
        bool f32[TM_MATMUL_MAX_JOBS];
        for (int32_t j = 0; j < n_jobs; j++) {
            ws[j] = jobs[j].w;
            bs[j] = jobs[j].bias;
            outs[j] = jobs[j].out;
            f32[j] = jobs[j].out_f32;
            buf_mark(c, jobs[j].out, jobs[j].out_f32);
        }
        matmul_fp8(c, ws, bs, outs, f32, n_jobs, x, n);
        return;
    }
    for (int32_t j = 0; j < n_jobs && !cu_failed(c); j++) {
        matmul_one(c, jobs[j].w, jobs[j].bias, x, n, jobs[j].out, jobs[j].out_f32);
        buf_mark(c, jobs[j].out, jobs[j].out_f32);
    }
}

static void cu_matmul_swiglu(tm_backend *be, const tm_weight *gate, const tm_weight *up, const void *x, int32_t n,
                             void *out) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    buf_mark(c, out, false);
    if (n <= TM_CUDA_GEMV_MAX_N) {
        tm_lazy_rec nr;
        if (gate->type == up->type && nin_take(c, x, (int32_t)gate->type, n, &nr)) {
            cudaError_t e = tm_cuda_gemv_swiglu_nin(gate->data, up->data, (int32_t)gate->type, gate->rows, gate->cols,
                                                    x, n, out, nr.w->data, nr.eps, c->stream);
            if (e != cudaErrorNotSupported) {
                cu_fail(c, e, "gemv_swiglu");
                return;
            }
        }
        lazy_read(c, x);
        tm_cuda_fp8_scales f8;
        const tm_cuda_fp8_scales *fs = fp8_of(gate, up, &f8);
        if (fs) { /* fp8: x's e4m3 copy in, the output's (the down product's input) out, in the other slot */
            f8.xq = gemv_xq(c, gate, x, n);
            if (leaves_fp8_small(c, gate->rows, n) && gate->act_scale == c->fp8_act)
                f8.out8 = xq8_small_out(c, f8.xq);
        }
        if (!cu_fail(c, tm_cuda_gemv_swiglu(gate->data, up->data, (int32_t)gate->type, gate->rows, gate->cols, x, n,
                                            out, fs, c->stream),
                     "gemv_swiglu") &&
            fs && f8.out8)
            xq8_leave(c, out, gate->act_scale, (size_t)n * (size_t)gate->rows, f8.out8);
        return;
    }
    const bool fp8 = gate->type == TM_DT_FP8_E4M3 && up->type == TM_DT_FP8_E4M3;
    if (!c->no_fuse_gemm && (fp8 || gate->type == TM_DT_BF16) && weight_follows(gate, up)) {
        /* placed together (weight_place_group): one product of 2 ffn rows into ffn_tmp, then the SwiGLU of its
         * halves; with fp8 weights the SwiGLU also leaves its output rounded for the down product in xq8 */
        const int64_t ffn = gate->rows;
        if ((size_t)n * (size_t)(2 * ffn) > c->ffn_elems) {
            cu_fail(c, cudaErrorMemoryAllocation, "ffn buffer too small");
            return;
        }
        tm_weight gu = *gate;
        gu.rows = gate->rows + up->rows;
        matmul_one(c, &gu, NULL, x, n, c->ffn_tmp, false); /* fp8: matmul_fp8 */
        const bool left = fp8 && !c->no_fp8_left && (size_t)n * (size_t)ffn <= c->xq8_bytes;
        const bool only = left && c->fp8_only; /* the e4m3 copy alone; out written if something else reads it */
        if (cu_failed(c) ||
            cu_fail(c, tm_cuda_swiglu_rows(c->ffn_tmp, n, (int32_t)ffn, only ? NULL : out, left ? c->xq8 : NULL,
                                           left ? 1.0f / gate->act_scale : 0.0f, c->stream),
                    "swiglu_rows"))
            return;
        if (left) xq8_leave(c, out, gate->act_scale, (size_t)n * (size_t)ffn, c->xq8);
        if (only) lazy_add(c, out, c->ffn_tmp, NULL, 0.0f, n, (int32_t)ffn);
        return;
    }
    if ((size_t)n * (size_t)up->rows > c->ffn_elems) {
        cu_fail(c, cudaErrorMemoryAllocation, "ffn buffer too small");
        return;
    }
    lazy_write(c, c->ffn_tmp);
    if (fp8) { /* x rounded to e4m3 once for both */
        const tm_weight *ws[2] = {gate, up}, *bs[2] = {NULL, NULL};
        void *outs[2] = {out, c->ffn_tmp};
        const bool f32[2] = {false, false};
        matmul_fp8(c, ws, bs, outs, f32, 2, x, n);
    } else {
        matmul_one(c, gate, NULL, x, n, out, false);
        matmul_one(c, up, NULL, x, n, c->ffn_tmp, false);
    }
    if (!cu_failed(c)) cu_fail(c, tm_cuda_swiglu(out, c->ffn_tmp, n, (int32_t)gate->rows, out, c->stream), "swiglu");
}

static void cu_swiglu(tm_backend *be, const void *gate, const void *up, int32_t n, int32_t ffn, void *out) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    lazy_read(c, gate);
    lazy_read(c, up);
    cu_fail(c, tm_cuda_swiglu(gate, up, n, ffn, out, c->stream), "swiglu");
    buf_mark(c, out, false);
}

/* The RoPE frequency table on the device (uploaded on the first, eager, pass); false on an error (recorded). */
static bool rope_table(cu_backend *c, const tm_attn_cfg *a) {
    if (c->inv_freq_src == a->rope_inv_freq) return true;
    if (c->capturing) {
        cu_fail(c, cudaErrorStreamCaptureUnsupported, "rope table upload during capture");
        return false;
    }
    graphs_reset(c);
    cudaStreamSynchronize(c->stream);
    cudaFree(c->d_inv_freq);
    c->d_inv_freq = NULL;
    size_t bytes = (size_t)(a->rope_dim / 2) * sizeof(float);
    if (cu_fail(c, cudaMalloc((void **)&c->d_inv_freq, bytes), "rope table") ||
        cu_fail(c, cudaMemcpy(c->d_inv_freq, a->rope_inv_freq, bytes, cudaMemcpyHostToDevice), "rope table"))
        return false;
    c->inv_freq_src = a->rope_inv_freq;
    return true;
}

static void cu_rope_kv_write(tm_backend *be, const tm_attn_cfg *a, int32_t layer, const tm_batch *b, void *q, void *k,
                             const void *v) {
    cu_backend *c = cu(be);
    (void)b;
    if (cu_failed(c) || !rope_table(c, a)) return;
    lazy_read(c, q);
    lazy_read(c, k);
    lazy_read(c, v);
    tm_cuda_rope_args r = {
        .n_tokens = c->n_tokens, .n_heads = a->n_heads, .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
        .rope_dim = a->rope_dim, .block_size = c->kv.block_size, .neox = a->rope_neox, .inv_freq = c->d_inv_freq,
        .positions = c->d_pos, .slot_mapping = c->d_slots, .q = q, .k = k, .v = v,
        .k_cache = kv_layer(c, layer, 0), .v_cache = kv_layer(c, layer, 1), .kv_fp8 = c->kv_fp8,
    };
    cu_fail(c, tm_cuda_rope_kv_write(&r, c->stream), "rope_kv_write");
}

/* Fused epilogues for small batches (tm_cuda_gemv_add_rmsnorm, tm_cuda_gemv_qkv_rope): false when the launcher
 * does not take the case (cudaErrorNotSupported, nothing launched) so that the forward runs the unfused ops. */
static bool cu_matmul_add_rmsnorm(tm_backend *be, const tm_matmul_job *job, const void *x, int32_t n, void *residual,
                                  const tm_weight *norm_w, float eps, void *norm_out) {
    cu_backend *c = cu(be);
    const tm_weight *w = job->w;
    /* raw: the residual passed on for the next GEMV to norm (norm-in), no norm here */
    /* where the products take the tensor cores (fp8; 16-bit weights from batch 3), which neither norm their input
     * nor add into the residual: the unfused pair */
    if (n >= tm_cuda_gemv_tc_min_n((int32_t)w->type)) return false;
    const bool down = w->cols > w->rows; /* down (ffn -> dim) before the next layer's q|k|v, else o before gate/up */
    const bool raw =
        c->norm_in && nin_type((int32_t)w->type) &&
        (c->norm_in_sel == NORM_IN_BOTH || (c->norm_in_sel == NORM_IN_AFTER_DOWN) == down);
    if (c->no_fuse || (!c->fuse_norm && !raw) || (!raw && !c->norm_scratch) || n < 1 || n > TM_CUDA_GEMV_MAX_N ||
        job->out_f32 || norm_w->cols != w->rows || w->rows > INT32_MAX)
        return false;
    if (cu_failed(c)) return true; /* ops do nothing after an error */
    lazy_read(c, x);
    lazy_write(c, residual);
    tm_cuda_fp8_scales f8;
    cudaError_t e = tm_cuda_gemv_add_rmsnorm(w->data, (int32_t)w->type, w->rows, w->cols, x, n,
                                             job->bias ? job->bias->data : NULL, NULL, residual,
                                             raw ? NULL : norm_w->data, eps, norm_out, raw ? NULL : c->norm_scratch,
                                             fp8_of(w, NULL, &f8), c->stream);
    if (e == cudaErrorNotSupported) return false;
    cu_fail(c, e, "gemv_add_rmsnorm");
    buf_mark(c, norm_out, false);
    if (raw) lazy_add_raw(c, norm_out, residual, norm_w, eps, n, (int32_t)w->rows);
    return true;
}

/* Larger batches with q, k, v placed together (weight_place_group): one product of q + 2 kv rows into ffn_tmp,
 * then RoPE reads its rows (q rotated into q, k and v into the cache); k and v stay unwritten */
static bool qkv_rope_fused(cu_backend *c, const tm_matmul_job *jobs, const void *x, int32_t n, const tm_attn_cfg *a,
                           int32_t layer, void *q) {
    const tm_weight *wq = jobs[0].w, *wk = jobs[1].w, *wv = jobs[2].w;
    if (c->no_fuse_gemm || n <= TM_CUDA_GEMV_MAX_N || n != c->n_tokens || jobs[0].bias || jobs[1].bias ||
        jobs[2].bias || (wq->type != TM_DT_FP8_E4M3 && wq->type != TM_DT_BF16) || !weight_follows(wq, wk) ||
        !weight_follows(wk, wv) || wq->rows != (int64_t)a->n_heads * a->head_dim ||
        wk->rows != (int64_t)a->n_kv_heads * a->head_dim || wv->rows != wk->rows)
        return false;
    for (int32_t j = 0; j < 3; j++)
        if (jobs[j].out_f32) return false;
    const int64_t rows = wq->rows + wk->rows + wv->rows;
    if ((size_t)n * (size_t)rows > c->ffn_elems) return false;
    if (cu_failed(c) || !rope_table(c, a)) return true;
    tm_weight w = *wq;
    w.rows = rows;
    matmul_one(c, &w, NULL, x, n, c->ffn_tmp, false); /* fp8: matmul_fp8; marks ffn_tmp written */
    if (cu_failed(c)) return true;
    uint16_t *t = c->ffn_tmp; /* (n, rows): q | k | v a token */
    /* an fp8 cache and no cached prefix: the attention that follows reads k and v from these rows (in bf16, as
     * the cache holds them) instead of widening the cache */
    const bool kv_rows = c->kv_fp8 && c->fresh_from >= 0 && !c->kv_rows_off;
    tm_cuda_rope_args r = {
        .n_tokens = c->n_tokens, .n_heads = a->n_heads, .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
        .rope_dim = a->rope_dim, .block_size = c->kv.block_size, .neox = a->rope_neox, .inv_freq = c->d_inv_freq,
        .positions = c->d_pos, .slot_mapping = c->d_slots, .q = q, .k = t + wq->rows, .v = t + wq->rows + wk->rows,
        .k_cache = kv_layer(c, layer, 0), .v_cache = kv_layer(c, layer, 1), .kv_fp8 = c->kv_fp8, .q_src = t,
        .src_stride = (int32_t)rows, .k_out = kv_rows ? t + wq->rows : NULL,
        .v_out = kv_rows ? t + wq->rows + wk->rows : NULL,
    };
    if (cu_fail(c, tm_cuda_rope_kv_write(&r, c->stream), "rope_kv_write")) return true;
    if (kv_rows) {
        c->rows_layer = layer;
        c->rows_k = r.k_out;
        c->rows_v = r.v_out;
        c->rows_ld = (int32_t)rows;
    }
    buf_mark(c, q, false);
    return true;
}

static bool cu_matmul_qkv_rope(tm_backend *be, const tm_matmul_job *jobs, const void *x, int32_t n,
                               const tm_attn_cfg *a, int32_t layer, const tm_batch *b, void *q, void *k, void *v) {
    cu_backend *c = cu(be);
    (void)b;
    if (jobs[0].out != q || jobs[1].out != k || jobs[2].out != v) return false;
    if (n > TM_CUDA_GEMV_MAX_N) return qkv_rope_fused(c, jobs, x, n, a, layer, q);
    if (c->no_fuse || n < 1 || n != c->n_tokens || a->rope_neox)
        return false;
    for (int32_t j = 0; j < 3; j++)
        if (jobs[j].out_f32 || jobs[j].w->type != jobs[0].w->type || jobs[j].w->cols != jobs[0].w->cols) return false;
    if (cu_failed(c)) return true;
    if (!rope_table(c, a)) return true;
    tm_lazy_rec nr;
    const bool nin = nin_take(c, x, (int32_t)jobs[0].w->type, n, &nr);
    if (!nin) lazy_read(c, x);
    const uint8_t *xq = gemv_xq(c, jobs[0].w, x, n);
    tm_cuda_gemv_job gj[3];
    for (int32_t j = 0; j < 3; j++) {
        gj[j] = gemv_job(jobs[j].w, jobs[j].bias, j == 0 ? q : NULL, nin ? &nr : NULL);
        gj[j].xq = xq;
    }
    tm_cuda_rope_args r = {
        .n_tokens = c->n_tokens, .n_heads = a->n_heads, .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
        .rope_dim = a->rope_dim, .block_size = c->kv.block_size, .neox = a->rope_neox, .inv_freq = c->d_inv_freq,
        .positions = c->d_pos, .slot_mapping = c->d_slots, .q = q, .k = k, .v = v,
        .k_cache = kv_layer(c, layer, 0), .v_cache = kv_layer(c, layer, 1), .kv_fp8 = c->kv_fp8,
    };
    cudaError_t e = tm_cuda_gemv_qkv_rope(gj, (int32_t)jobs[0].w->type, jobs[0].w->cols, x, n, &r, c->stream);
    if (e == cudaErrorNotSupported) return false;
    cu_fail(c, e, "gemv_qkv_rope");
    buf_mark(c, q, false);
    return true;
}

/* The prefill attention of the batch's sequences lo.. (p: their arguments, q and out at sequence lo's first token).
 * With this layer's keys as rows (rows), the sequences from c->fresh_from on read them and those before it the
 * cache, in two launches. */
static void prefill_part(cu_backend *c, tm_cuda_attn_args *p, int32_t lo, bool rows, const char *what) {
    const int32_t *qs = c->host_batch->query_start, f = c->fresh_from;
    if (!rows || f < lo) {
        cu_fail(c, tm_cuda_attn_prefill(p, c->stream), what);
        return;
    }
    if (f > lo) { /* sequences with a cached prefix: the cache */
        tm_cuda_attn_args h = *p;
        h.n_seqs = f - lo;
        h.n_tokens = qs[f] - qs[lo];
        if (cu_fail(c, tm_cuda_attn_prefill(&h, c->stream), what)) return;
    }
    const size_t skip = (size_t)(f - lo);
    p->query_start += skip; /* still counted from token qs[lo], where q, out and the rows start */
    p->context_len += skip;
    p->block_table += skip * (size_t)c->stride;
    p->n_seqs -= (int32_t)skip;
    p->n_tokens = qs[c->host_batch->n_seqs] - qs[f];
    p->k_rows = c->rows_k + (size_t)qs[lo] * (size_t)c->rows_ld;
    p->v_rows = c->rows_v + (size_t)qs[lo] * (size_t)c->rows_ld;
    p->kv_row_stride = c->rows_ld;
    cu_fail(c, tm_cuda_attn_prefill(p, c->stream), what);
}

static void cu_attention(tm_backend *be, const tm_attn_cfg *a, int32_t layer, const tm_batch *b, const void *q,
                         void *out) {
    cu_backend *c = cu(be);
    (void)b;
    if (cu_failed(c)) return;
    if (c->n_heads != a->n_heads) c->n_heads = a->n_heads; /* sizes the work buffer from the next step on */
    lazy_read(c, q);
    tm_cuda_attn_args g = {
        .n_heads = a->n_heads, .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim, .block_size = c->kv.block_size,
        .scale = a->attn_scale, .n_tokens = c->n_tokens, .n_seqs = c->n_seqs, .max_blocks = c->stride,
        .seq_index = c->d_seq, .query_start = c->d_qstart, .context_len = c->d_ctx, .block_table = c->d_btab,
        .max_query_len = c->max_q, .max_context_len = c->max_ctx, .q = q, .k_cache = kv_layer(c, layer, 0),
        .v_cache = kv_layer(c, layer, 1), .kv_fp8 = c->kv_fp8, .out = out, .work = c->attn_work,
        .work_bytes = c->attn_work_bytes,
    };
    bool decode = c->max_q == 1 && c->n_tokens == c->n_seqs;
    const bool rows = c->rows_layer == layer && !decode; /* this layer's keys as rows (qkv_rope_fused) */
    c->rows_layer = -1;
    if (c->n_dec > 0 && !decode) { /* mixed step: decode kernel on the leading one-token sequences */
        tm_cuda_attn_args d = g;
        d.n_tokens = d.n_seqs = c->n_dec;
        d.max_query_len = 1;
        d.max_context_len = c->max_ctx_dec;
        size_t need_d = tm_cuda_attn_decode_work_bytes(d.n_seqs, a->n_heads, a->head_dim, d.max_context_len);
        if (need_d > c->attn_work_bytes) {
            d.work = NULL; /* fewer splits, never wrong */
            d.work_bytes = 0;
        }
        if (cu_fail(c, tm_cuda_attn_decode(&d, c->stream), "attention (decode part)")) return;
        size_t row = (size_t)a->n_heads * (size_t)a->head_dim;
        tm_cuda_attn_args p = g;
        p.n_tokens = c->n_tokens - c->n_dec;
        p.n_seqs = c->n_seqs - c->n_dec;
        p.seq_index = c->d_seq_tail;
        p.query_start = c->d_qs_tail;
        p.context_len = c->d_ctx + c->n_dec;
        p.block_table = c->d_btab + (size_t)c->n_dec * (size_t)c->stride;
        p.q = (const uint16_t *)q + (size_t)c->n_dec * row;
        p.out = (uint16_t *)out + (size_t)c->n_dec * row;
        prefill_part(c, &p, c->n_dec, rows, "attention (prefill part)");
        buf_mark(c, out, false);
        return;
    }
    size_t need = decode ? tm_cuda_attn_decode_work_bytes(c->n_seqs, a->n_heads, a->head_dim, c->max_ctx)
                         : tm_cuda_attn_prefill_work_bytes(c->n_tokens, a->n_heads, a->head_dim);
    if (need > c->attn_work_bytes) {
        if (c->capturing) {
            cu_fail(c, cudaErrorMemoryAllocation, "attention work buffer too small during capture");
            return;
        }
        size_t have = c->attn_work_bytes;
        tm_error e;
        if (grow(c, &c->attn_work, &have, need, "attention work", &e) != TM_OK) {
            cu_fail(c, cudaErrorMemoryAllocation, "attention work");
            return;
        }
        c->attn_work_bytes = have;
        g.work = c->attn_work;
        g.work_bytes = have;
    }
    const int64_t dim = (int64_t)a->n_heads * a->head_dim;
    const bool left = decode && !c->attn_out8_off &&
                      (leaves_fp8(c, dim, c->n_tokens) || leaves_fp8_small(c, dim, c->n_tokens));
    if (left) { /* the o product's e4m3 input too */
        g.out8 = c->xq8;
        g.out8_inv = 1.0f / c->fp8_act;
    }
    if (decode)
        cu_fail(c, tm_cuda_attn_decode(&g, c->stream), "attention");
    else
        prefill_part(c, &g, 0, rows, "attention");
    buf_mark(c, out, false);
    if (left) xq8_leave(c, out, c->fp8_act, (size_t)c->n_tokens * (size_t)dim, c->xq8);
}

/* The whole layer as one kernel for a one-token step (batch-1 decode): bf16 weights without biases, llama RoPE, a
 * bf16 cache, one sequence; anything else (or TM_CUDA_LAYER unset) runs the layer's ops. */
static bool cu_decoder_layer(tm_backend *be, const tm_layer_weights *L, const tm_attn_cfg *a, float eps, int32_t layer,
                             const tm_batch *b, void *x, int32_t n, void *q, void *att, void *h) {
    cu_backend *c = cu(be);
    (void)b;
    if (!c->layer_on || !c->layer_work || n != 1 || c->n_tokens != 1 || c->n_seqs != 1 || c->kv_fp8 ||
        a->rope_neox || L->bq || L->bk || L->bv)
        return false;
    const tm_weight *mats[] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        if (mats[i]->type != TM_DT_BF16) return false;
    if (L->attn_norm->type != TM_DT_F32 || L->ffn_norm->type != TM_DT_F32) return false;
    if (cu_failed(c)) return true; /* ops do nothing after an error */
    if (c->n_heads != a->n_heads) c->n_heads = a->n_heads; /* sizes the attention work of the op path */
    if (!rope_table(c, a)) return true;
    lazy_read(c, x);
    lazy_write(c, x);
    tm_cuda_layer_args g = {
        .dim = (int32_t)L->wq->cols, .ffn_dim = (int32_t)L->w_gate->rows, .n_heads = a->n_heads,
        .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim, .rope_dim = a->rope_dim,
        .block_size = c->kv.block_size, .max_blocks = c->stride, .eps = eps, .attn_scale = a->attn_scale,
        .wq = L->wq->data, .wk = L->wk->data, .wv = L->wv->data, .wo = L->wo->data, .w_gate = L->w_gate->data,
        .w_up = L->w_up->data, .w_down = L->w_down->data, .attn_norm = L->attn_norm->data,
        .ffn_norm = L->ffn_norm->data, .inv_freq = c->d_inv_freq, .position = c->d_pos, .slot = c->d_slots,
        .context_len = c->d_ctx, .block_table = c->d_btab, .k_cache = kv_layer(c, layer, 0),
        .v_cache = kv_layer(c, layer, 1), .x = x, .q = q, .att = att, .h = h, .work = c->layer_work,
        .pdl = true, /* unless TM_CUDA_PDL=0 */ .parity = layer & 1,
    };
    cudaError_t e = tm_cuda_layer_decode(&g, c->stream);
    if (e == cudaErrorNotSupported) return false;
    if (cu_fail(c, e, "whole-layer kernel")) return true;
    buf_mark(c, q, false);
    buf_mark(c, att, false);
    buf_mark(c, h, false);
    return true;
}

static void cu_get_rows(tm_backend *be, const void *x, const int32_t *idx, int32_t n_idx, int32_t width, void *out) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    const int32_t *d = dev_ids(c, idx);
    if (!d) {
        cu_fail(c, cudaErrorInvalidValue, "get_rows: indices are not the step's logits index");
        return;
    }
    lazy_read(c, x);
    cu_fail(c, tm_cuda_get_rows(x, d, n_idx, width, out, c->stream), "get_rows");
    buf_mark(c, out, false);
}

static bool stage(cu_backend *c, size_t bytes) {
    if (bytes <= c->stage_bytes) return true;
    cudaFreeHost(c->host_stage);
    c->host_stage = NULL;
    c->stage_bytes = 0;
    if (cu_fail(c, cudaMallocHost((void **)&c->host_stage, bytes), "host staging")) return false;
    c->stage_bytes = bytes;
    return true;
}

static void cu_to_host(tm_backend *be, const void *x, size_t n, float *dst) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    lazy_read(c, x);
    cu_buf *b = buf_find(c, x);
    bool f32 = !b || b->f32;
    size_t bytes = n * (f32 ? 4 : 2);
    if (!stage(c, bytes)) return;
    if (cu_fail(c, cudaMemcpyAsync(c->host_stage, x, bytes, cudaMemcpyDeviceToHost, c->stream), "to_host") ||
        cu_fail(c, cudaStreamSynchronize(c->stream), "to_host"))
        return;
    c->meta_pending = false;
    if (f32) {
        memcpy(dst, c->host_stage, bytes);
    } else {
        const uint16_t *h = (const uint16_t *)c->host_stage;
        for (size_t i = 0; i < n; i++) dst[i] = tm_bf16_to_f32(h[i]);
    }
}

static void cu_from_host(tm_backend *be, const float *src, size_t n, void *x) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return;
    lazy_write(c, x);
    cu_buf *b = buf_find(c, x);
    bool f32 = b && b->f32;
    size_t bytes = n * (f32 ? 4 : 2);
    if (!stage(c, bytes)) return;
    if (cu_fail(c, cudaStreamSynchronize(c->stream), "from_host")) return;
    if (f32) {
        memcpy(c->host_stage, src, bytes);
    } else {
        uint16_t *h = (uint16_t *)c->host_stage;
        for (size_t i = 0; i < n; i++) h[i] = tm_f32_to_bf16(src[i]);
    }
    cu_fail(c, cudaMemcpyAsync(x, c->host_stage, bytes, cudaMemcpyHostToDevice, c->stream), "from_host");
    cu_fail(c, cudaStreamSynchronize(c->stream), "from_host");
}

static void cu_free(tm_backend *be) {
    cu_backend *c = cu(be);
    if (!c) return;
    if (c->capturing) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->stream, &g);
        if (g) cudaGraphDestroy(g);
    }
    cudaStreamSynchronize(c->stream);
    if (c->copy) cudaStreamSynchronize(c->copy);
    if (c->timing) {
        if (c->t_steps > 0)
            tm_log(TM_LOG_WARN, "cuda step timing: %lld replayed decode steps, device %.3f ms a step (launch to ids); "
                   "%lld periods of %.3f ms between launches, of which %.3f ms from the ids' return to the next step "
                   "(the engine) and %.3f ms preparing the step (begin_step)", (long long)c->t_steps,
                   1e3 * c->t_dev_s / (double)c->t_steps, (long long)c->t_periods,
                   c->t_periods ? 1e3 * c->t_period_s / (double)c->t_periods : 0.0,
                   c->t_periods ? 1e3 * c->t_engine_s / (double)c->t_periods : 0.0,
                   c->t_periods ? 1e3 * c->t_prep_s / (double)c->t_periods : 0.0);
        if (c->t_pperiods > 0)
            tm_log(TM_LOG_WARN, "cuda step timing: %lld pipelined passes, %.3f ms a pass on the device (from one pass's "
                   "ids copied to the next's, idle time included); %lld of them between two replayed decode graphs, "
                   "%.3f ms each", (long long)c->t_plaunched, 1e3 * c->t_pperiod_s / (double)c->t_pperiods,
                   (long long)c->t_rperiods, c->t_rperiods ? 1e3 * c->t_rperiod_s / (double)c->t_rperiods : 0.0);
        for (int k = 0; k < 2; k++) cudaEventDestroy(c->t_ev[k]);
        for (int k = 0; k < 4; k++) cudaEventDestroy(c->t_pev[k]);
    }
    graphs_reset(c);
    for (int32_t i = 0; i < c->n_bufs; i++) cudaFree(c->bufs[i].p);
    free(c->bufs);
    cudaFree(c->kv_mem);
    cudaFreeHost(c->meta_host);
    cudaFree(c->meta_dev);
    cudaFree(c->d_inv_freq);
    cudaFree(c->attn_work);
    cudaFree(c->deq);
    cudaFree(c->xq8);
    cudaFree(c->ffn_tmp);
    cudaFreeHost(c->host_stage);
    cudaFree(c->d_ids_out);
    cudaFree(c->d_pen_raw);
    cudaFree(c->d_lp);
    cudaFree(c->d_swork);
    for (int k = 0; k < 2; k++) {
        cudaFreeHost(c->h_ids[k]);
        cudaFreeHost(c->h_sin[k]);
        cudaFree(c->d_sin[k]);
        cudaFreeHost(c->h_lp[k]);
        if (c->ids_ev[k]) cudaEventDestroy(c->ids_ev[k]);
        if (c->sp_ev[k]) cudaEventDestroy(c->sp_ev[k]);
        if (c->done_ev[k]) cudaEventDestroy(c->done_ev[k]);
    }
    cudaFree(c->norm_scratch);
    cudaFree(c->qg_work);
    cudaFree(c->layer_work);
    for (int32_t g = 0; g < c->n_wgroups; g++) cudaFree(c->wgroups[g].base); /* weights never released */
    free(c->wgroups);
    if (c->meta_done) cudaEventDestroy(c->meta_done);
    tm_cuda_blas_free(c->blas);
    if (c->copy && c->copy != c->stream) cudaStreamDestroy(c->copy);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

/* the first n_rows ids of d_ids to out_host (through the pinned staging), waiting for the stream */
static tm_status ids_to_host(cu_backend *c, int32_t n_rows, int32_t *out_host, tm_error *err) {
    size_t bytes = (size_t)n_rows * sizeof(int32_t);
    if (!stage(c, bytes) ||
        cu_fail(c, cudaMemcpyAsync(c->host_stage, c->d_ids_out, bytes, cudaMemcpyDeviceToHost, c->stream), "token ids"))
        return cu_last_error(&c->base, err);
    if (c->t_open) cudaEventRecord(c->t_ev[1], c->stream);
    if (cu_fail(c, cudaStreamSynchronize(c->stream), "token ids")) return cu_last_error(&c->base, err);
    if (c->t_open) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, c->t_ev[0], c->t_ev[1]) == cudaSuccess) {
            c->t_dev_s += ms * 1e-3;
            c->t_steps++;
        }
        c->t_ids = tm_time_s();
        c->t_open = false;
    }
    c->meta_pending = false;
    memcpy(out_host, c->host_stage, bytes);
    return TM_OK;
}

/* d_ids_out and d_lp are about to be rewritten on the compute stream: the earlier passes' copies of them to the host
 * (on the copy stream) come first; false on a device error (recorded) */
static bool outs_free(cu_backend *c) {
    for (int k = 0; k < 2; k++)
        if (c->copied[k] && cu_fail(c, cudaStreamWaitEvent(c->stream, c->ids_ev[k], 0), "token ids wait"))
            return false;
    return true;
}

static tm_status cu_argmax(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, int32_t *out_host,
                           tm_error *err) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return cu_last_error(be, err);
    if (n_rows > c->cfg.max_logits) return tm_err(err, TM_ERR_RANGE, "argmax over %d rows (at most %d)", n_rows, c->cfg.max_logits);
    if (!outs_free(c) || cu_fail(c, tm_cuda_argmax(logits, n_rows, vocab, c->d_ids_out, c->stream), "argmax"))
        return cu_last_error(be, err);
    return ids_to_host(c, n_rows, out_host, err);
}

_Static_assert(sizeof(tm_sample_pen) == sizeof(tm_cuda_sample_pen), "penalty entries are copied as they are");
_Static_assert(sizeof(tm_sample_lp) == sizeof(tm_cuda_sample_lp) && TM_SAMPLE_MAX_TOP == TM_CUDA_SAMPLE_MAX_TOP,
               "logprob rows are copied as they are");

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* a pass's sampling inputs in slot's buffers: [recipes | penalties and logprobs | penalty entries] */
typedef struct sin_layout {
    size_t extra_at, pen_at, bytes;
} sin_layout;

static sin_layout sin_plan(int32_t n_rows, int32_t n_pen) {
    sin_layout l;
    l.extra_at = align16((size_t)n_rows * sizeof(tm_cuda_sample_params));
    l.pen_at = l.extra_at + align16((size_t)n_rows * sizeof(tm_cuda_sample_extra));
    l.bytes = l.pen_at + (size_t)n_pen * sizeof(tm_cuda_sample_pen);
    return l;
}

/* room for `bytes` of sampling inputs in slot's pinned staging (its last upload waited for) and device buffer (grown
 * once both streams are idle: a queued pass may still read it), and for n_pen entries' raw values; grown
 * geometrically */
static bool sin_room(cu_backend *c, int32_t slot, size_t bytes, int32_t n_pen) {
    if (bytes > c->sin_cap[slot]) {
        size_t cap = bytes > 2 * c->sin_cap[slot] ? bytes : 2 * c->sin_cap[slot];
        if (cu_fail(c, cudaStreamSynchronize(c->stream), "sampling inputs") ||
            cu_fail(c, cudaStreamSynchronize(c->copy), "sampling inputs"))
            return false;
        cudaFreeHost(c->h_sin[slot]);
        cudaFree(c->d_sin[slot]);
        c->h_sin[slot] = c->d_sin[slot] = NULL;
        c->sin_cap[slot] = 0;
        if (cu_fail(c, cudaMallocHost((void **)&c->h_sin[slot], cap), "sampling inputs staging") ||
            cu_fail(c, cudaMalloc((void **)&c->d_sin[slot], cap), "sampling inputs"))
            return false;
        c->sin_cap[slot] = cap;
    }
    if (n_pen > c->d_pen_cap) {
        int32_t cap = n_pen > 2 * c->d_pen_cap ? n_pen : 2 * c->d_pen_cap;
        if (cu_fail(c, cudaStreamSynchronize(c->stream), "penalty entries")) return false;
        cudaFree(c->d_pen_raw);
        c->d_pen_raw = NULL;
        c->d_pen_cap = 0;
        if (cu_fail(c, cudaMalloc((void **)&c->d_pen_raw, (size_t)cap * sizeof(float)), "penalty entries")) return false;
        c->d_pen_cap = cap;
    }
    return true;
}

/* The pass's recipes and penalty entries into slot's pinned staging (its previous upload waited for first) and up
 * in one copy on the copy stream, after the slot's previous pass is done with its device buffer (done_ev); the
 * compute stream waits for the upload (sp_ev), then penalties and logprobs (tm_cuda_sample_prepare; a pipelined
 * row's in-flight id is read from d_ids_out, which still holds the previous pass's ids), one token per row into
 * d_ids_out, and the chosen ids' logprobs (tm_cuda_sample_finish); false on a device error (recorded) */
static bool sample_launch(cu_backend *c, const void *logits, int32_t n_rows, int32_t vocab, const tm_sample_set *set,
                          int32_t slot) {
    if (c->sp_used[slot] && cu_fail(c, cudaEventSynchronize(c->sp_ev[slot]), "sampling params")) return false;
    const tm_sample_row *rows = set->rows;
    const int32_t n_pen = set->n_pen > 0 ? set->n_pen : 0;
    bool chained_pen = false; /* a row penalises the id the previous pass drew */
    for (int32_t r = 0; r < n_rows; r++) chained_pen |= rows[r].pen_src >= 0;
    const bool want_pen = n_pen > 0 || chained_pen, extra = want_pen || set->logprobs;
    const sin_layout l = sin_plan(n_rows, n_pen);
    if (!sin_room(c, slot, l.bytes, n_pen)) return false;
    uint8_t *h = c->h_sin[slot], *d = c->d_sin[slot];
    tm_cuda_sample_params *hp = (tm_cuda_sample_params *)h;
    tm_cuda_sample_extra *hx = (tm_cuda_sample_extra *)(h + l.extra_at);
    for (int32_t r = 0; r < n_rows; r++) {
        const tm_sample_row *w = &rows[r];
        hp[r] = (tm_cuda_sample_params){.temperature = w->temperature, .top_p = w->top_p, .min_p = w->min_p,
                                        .top_k = w->top_k, .seed = w->seed, .offset = w->offset};
        hx[r] = (tm_cuda_sample_extra){.repeat_penalty = w->repeat_penalty, .presence_penalty = w->presence_penalty,
                                       .frequency_penalty = w->frequency_penalty, .pen_first = w->pen_first,
                                       .pen_n = n_pen > 0 ? w->pen_n : 0, .pen_src = w->pen_src,
                                       .n_top = set->logprobs ? w->n_logprobs : 0};
    }
    if (n_pen > 0) memcpy(h + l.pen_at, set->pen, (size_t)n_pen * sizeof(tm_cuda_sample_pen));
    const size_t bytes = extra ? l.bytes : (size_t)n_rows * sizeof(tm_cuda_sample_params);
    const tm_cuda_sample_params *d_params = (const tm_cuda_sample_params *)d;
    const tm_cuda_sample_extra *d_extra = (const tm_cuda_sample_extra *)(d + l.extra_at);
    const tm_cuda_sample_pen *d_pen = (const tm_cuda_sample_pen *)(d + l.pen_at);
    float *lg = (float *)(uintptr_t)logits; /* penalties apply in place (ops->sample) */
    c->sp_used[slot] = true;
    return !(c->copied[slot] && cu_fail(c, cudaStreamWaitEvent(c->copy, c->done_ev[slot], 0), "sampling wait")) &&
           !cu_fail(c, cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->copy), "sampling params") &&
           !cu_fail(c, cudaEventRecord(c->sp_ev[slot], c->copy), "sampling params event") &&
           !cu_fail(c, cudaStreamWaitEvent(c->stream, c->sp_ev[slot], 0), "sampling params wait") && outs_free(c) &&
           !(extra && cu_fail(c, tm_cuda_sample_prepare(lg, n_rows, vocab, d_extra, d_pen, n_pen, c->d_pen_raw,
                                                        want_pen, c->d_ids_out, set->logprobs, c->d_swork, c->d_lp,
                                                        c->stream), "sample prepare")) &&
           !cu_fail(c, tm_cuda_sample(lg, n_rows, vocab, d_params, NULL, c->d_ids_out, NULL, c->stream), "sample") &&
           !(set->logprobs &&
             cu_fail(c, tm_cuda_sample_finish(lg, n_rows, vocab, d_extra, d_pen, c->d_pen_raw, c->d_ids_out,
                                              c->d_swork, c->d_lp, c->stream), "sample logprobs"));
}

static tm_status cu_sample(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, const tm_sample_set *set,
                           int32_t *out_host, tm_sample_lp *lp_host, tm_error *err) {
    cu_backend *c = cu(be);
    if (cu_failed(c)) return cu_last_error(be, err);
    if (n_rows > c->cfg.max_logits) return tm_err(err, TM_ERR_RANGE, "sampling %d rows (at most %d)", n_rows, c->cfg.max_logits);
    if (!sample_launch(c, logits, n_rows, vocab, set, 0)) return cu_last_error(be, err);
    tm_status s = ids_to_host(c, n_rows, out_host, err); /* waits for the stream */
    if (s != TM_OK || !set->logprobs || !lp_host) return s;
    if (cu_fail(c, cudaMemcpy(lp_host, c->d_lp, (size_t)n_rows * sizeof(tm_cuda_sample_lp), cudaMemcpyDeviceToHost),
                "logprobs"))
        return cu_last_error(be, err);
    return TM_OK;
}

/* ---- pipelined sampling ---------------------------------------------------------------------------- */

/* The pass's sampling kernels are queued (done_ev[slot] recorded after them); the ids in d_ids_out (and with lp the
 * logprobs in d_lp) go to slot's pinned buffers on the copy stream (ids_ev[slot]); the pass's timing event */
static tm_status ids_copy_start(cu_backend *c, int32_t slot, int32_t n_rows, bool lp, tm_error *err) {
    c->lp_pend[slot] = lp;
    c->copied[slot] = true;
    if (cu_fail(c, cudaEventRecord(c->done_ev[slot], c->stream), "sampling done event") ||
        cu_fail(c, cudaStreamWaitEvent(c->copy, c->done_ev[slot], 0), "sampling done wait") ||
        cu_fail(c, cudaMemcpyAsync(c->h_ids[slot], c->d_ids_out, (size_t)n_rows * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, c->copy), "token ids") ||
        (lp && cu_fail(c, cudaMemcpyAsync(c->h_lp[slot], c->d_lp, (size_t)n_rows * sizeof(tm_cuda_sample_lp),
                                          cudaMemcpyDeviceToHost, c->copy), "logprobs")) ||
        cu_fail(c, cudaEventRecord(c->ids_ev[slot], c->copy), "token ids event"))
        return cu_last_error(&c->base, err);
    if (c->timing && cudaEventRecord(c->t_pev[c->t_plaunched % 4], c->copy) == cudaSuccess)
        c->t_prep[c->t_plaunched++ % 4] = c->t_replay;
    return TM_OK;
}

static tm_status start_check(cu_backend *c, int32_t n_rows, int32_t slot, tm_error *err) {
    if (cu_failed(c)) return cu_last_error(&c->base, err);
    if (slot < 0 || slot > 1) return tm_err(err, TM_ERR_INVALID, "ids slot %d (0 or 1)", slot);
    if (n_rows < 1 || n_rows > c->cfg.max_logits)
        return tm_err(err, TM_ERR_RANGE, "sampling %d rows (1 to %d)", n_rows, c->cfg.max_logits);
    return TM_OK;
}

static tm_status cu_argmax_start(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, int32_t slot,
                                 tm_error *err) {
    cu_backend *c = cu(be);
    tm_status s = start_check(c, n_rows, slot, err);
    if (s != TM_OK) return s;
    if (!outs_free(c) || cu_fail(c, tm_cuda_argmax(logits, n_rows, vocab, c->d_ids_out, c->stream), "argmax"))
        return cu_last_error(be, err);
    return ids_copy_start(c, slot, n_rows, false, err);
}

static tm_status cu_sample_start(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                                 const tm_sample_set *set, int32_t slot, tm_error *err) {
    cu_backend *c = cu(be);
    tm_status s = start_check(c, n_rows, slot, err);
    if (s != TM_OK) return s;
    if (!sample_launch(c, logits, n_rows, vocab, set, slot)) return cu_last_error(be, err);
    return ids_copy_start(c, slot, n_rows, set->logprobs, err);
}

static tm_status cu_ids_wait(tm_backend *be, int32_t slot, int32_t n_rows, int32_t *out_host, tm_sample_lp *lp_host,
                             tm_error *err) {
    cu_backend *c = cu(be);
    tm_status s = start_check(c, n_rows, slot, err);
    if (s != TM_OK) return s;
    if (cu_fail(c, cudaEventSynchronize(c->ids_ev[slot]), "token ids")) return cu_last_error(be, err);
    if (c->timing && c->t_pcollected < c->t_plaunched) {
        int64_t k = c->t_pcollected++;
        float ms = 0.0f;
        if (k > 0 && cudaEventElapsedTime(&ms, c->t_pev[(k - 1) % 4], c->t_pev[k % 4]) == cudaSuccess) {
            c->t_pperiod_s += ms * 1e-3;
            c->t_pperiods++;
            if (c->t_prep[(k - 1) % 4] && c->t_prep[k % 4]) {
                c->t_rperiod_s += ms * 1e-3;
                c->t_rperiods++;
            }
        }
    }
    memcpy(out_host, c->h_ids[slot], (size_t)n_rows * sizeof(int32_t));
    if (lp_host && c->lp_pend[slot]) memcpy(lp_host, c->h_lp[slot], (size_t)n_rows * sizeof(tm_cuda_sample_lp));
    return TM_OK;
}

static uint64_t cu_mem_free(tm_backend *be) {
    cu_backend *c = (cu_backend *)be;
    if (cudaSetDevice(c->cfg.device) != cudaSuccess) { /* this backend's GPU, whichever thread asks */
        cudaGetLastError();
        return 0;
    }
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (uint64_t)f;
}

void *tm_backend_cuda_stream(tm_backend *be) { return cu(be)->stream; }
int32_t tm_backend_cuda_device(tm_backend *be) { return cu(be)->cfg.device; }

static const tm_backend_ops k_cuda_ops = {
    .mem_free = cu_mem_free,
    .argmax = cu_argmax,
    .sample = cu_sample,
    .argmax_start = cu_argmax_start,
    .sample_start = cu_sample_start,
    .ids_wait = cu_ids_wait,
    .name = "cuda",
    .free = cu_free,
    .alloc = cu_alloc,
    .release = cu_release,
    .kv_init = cu_kv_init,
    .embed = cu_embed,
    .embed_rmsnorm = cu_embed_rmsnorm,
    .rmsnorm = cu_rmsnorm,
    .add_rmsnorm = cu_add_rmsnorm,
    .matmul = cu_matmul,
    .rope_kv_write = cu_rope_kv_write,
    .attention = cu_attention,
    .swiglu = cu_swiglu,
    .get_rows = cu_get_rows,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .begin_step = cu_begin_step,
    .end_step = cu_end_step,
    .matmul_swiglu = cu_matmul_swiglu,
    .matmul_add_rmsnorm = cu_matmul_add_rmsnorm,
    .matmul_qkv_rope = cu_matmul_qkv_rope,
    .decoder_layer = cu_decoder_layer,
    .weight_place = cu_weight_place,
    .weight_place_group = cu_weight_place_group,
    .weight_release = cu_weight_release,
    .last_error = cu_last_error,
};

bool tm_backend_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return n > 0;
}

tm_status tm_backend_cuda_create(const tm_cuda_cfg *cfg, tm_backend **out, tm_error *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return tm_err(err, TM_ERR_DEVICE, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    if (cfg->device < 0 || cfg->device >= n)
        return tm_err(err, TM_ERR_INVALID, "CUDA device %d does not exist (%d found)", cfg->device, n);
    if (cfg->max_tokens < 1) return tm_err(err, TM_ERR_INVALID, "cuda backend: max_tokens must be >= 1");
    if ((e = cudaSetDevice(cfg->device)) != cudaSuccess)
        return tm_err(err, TM_ERR_DEVICE, "cudaSetDevice(%d): %s", cfg->device, cudaGetErrorString(e));
    cu_backend *c = tm_calloc(1, sizeof *c);
    if (!c) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    c->base.ops = &k_cuda_ops;
    c->cfg = *cfg;
    c->max_tokens = cfg->max_tokens;
    if (getenv("TM_CUDA_NO_GRAPHS")) c->cfg.no_graphs = true;
    tm_status s;
    const bool side_copy = !env_is("TM_CUDA_SIDE_COPY", "0");
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (side_copy && (e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess) ||
        (e = cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming)) != cudaSuccess) {
        s = tm_err(err, TM_ERR_DEVICE, "cuda stream: %s", cudaGetErrorString(e));
        goto fail;
    }
    if ((s = tm_cuda_blas_create((size_t)64 << 20, &c->blas, err)) != TM_OK) goto fail;
    if (getenv("TM_CUDA_STEP_TIMING") && atoi(getenv("TM_CUDA_STEP_TIMING")) > 0)
        c->timing = cudaEventCreate(&c->t_ev[0]) == cudaSuccess && cudaEventCreate(&c->t_ev[1]) == cudaSuccess &&
                    cudaEventCreate(&c->t_pev[0]) == cudaSuccess && cudaEventCreate(&c->t_pev[1]) == cudaSuccess &&
                    cudaEventCreate(&c->t_pev[2]) == cudaSuccess && cudaEventCreate(&c->t_pev[3]) == cudaSuccess;
    /* fp8 GEMMs with fast accumulation unless TM_CUDA_FP8_FAST_ACCUM=0 (tm_cuda_blas.h): 6% more 8B throughput,
     * errors at the level of the bf16 output's rounding (tb_fp8) */
    tm_cuda_blas_set_fp8_fast_accum(c->blas, !env_is("TM_CUDA_FP8_FAST_ACCUM", "0"));
    /* TM_CUDA_BLAS_ALGO=i: every GEMM takes cuBLASLt's candidate of rank i instead of its first (for measurements) */
    if (getenv("TM_CUDA_BLAS_ALGO")) tm_cuda_blas_set_algo_index(c->blas, atoi(getenv("TM_CUDA_BLAS_ALGO")));
    size_t rows = (size_t)(cfg->max_logits > 0 ? cfg->max_logits : cfg->max_tokens);
    c->cfg.max_logits = (int32_t)rows;
    if (!side_copy) c->copy = c->stream;
    if ((e = cudaMalloc((void **)&c->d_ids_out, rows * sizeof(int32_t))) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->d_lp, rows * sizeof(tm_cuda_sample_lp))) != cudaSuccess ||
        (e = cudaMalloc(&c->d_swork, tm_cuda_sample_work_bytes((int32_t)rows, 1))) != cudaSuccess) {
        cudaGetLastError();
        s = tm_err(err, TM_ERR_NOMEM, "device buffers for %zu sampled rows: %s", rows, cudaGetErrorString(e));
        goto fail;
    }
    for (int k = 0; k < 2; k++)
        if ((e = cudaMallocHost((void **)&c->h_ids[k], rows * sizeof(int32_t))) != cudaSuccess ||
            (e = cudaMallocHost((void **)&c->h_sin[k], sin_plan((int32_t)rows, 0).bytes)) != cudaSuccess ||
            (e = cudaMalloc((void **)&c->d_sin[k], sin_plan((int32_t)rows, 0).bytes)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&c->h_lp[k], rows * sizeof(tm_cuda_sample_lp))) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&c->ids_ev[k], cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&c->sp_ev[k], cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&c->done_ev[k], cudaEventDisableTiming)) != cudaSuccess) {
            cudaGetLastError();
            s = tm_err(err, TM_ERR_NOMEM, "pipelined sampling buffers for %zu rows: %s", rows, cudaGetErrorString(e));
            goto fail;
        }
    c->sin_cap[0] = c->sin_cap[1] = sin_plan((int32_t)rows, 0).bytes;
    c->no_fuse_gemm = env_is("TM_CUDA_NO_FUSE_GEMM", "1"); /* weights placed together still run one product each */
    c->no_fp8_left = env_is("TM_CUDA_FP8_LEFT", "0");      /* no producer leaves the next product's e4m3 input */
    c->no_fp8_left_small = env_is("TM_CUDA_FP8_LEFT_SMALL", "0"); /* not at batch <= 8 */
    c->fp8_only = !env_is("TM_CUDA_FP8_ONLY", "0"); /* "0": producers that leave the e4m3 copy write bf16 too */
    c->no_fuse = env_is("TM_CUDA_NO_FUSE", "1");
    c->split_mixed = !env_is("TM_CUDA_NO_SPLIT_MIXED", "1"); /* "1": mixed steps: every token to prefill attention */
    c->kv_rows_off = env_is("TM_CUDA_KV_ROWS", "0");
    c->attn_out8_off = env_is("TM_CUDA_ATTN_OUT8", "0");
    c->rows_layer = -1;
    c->fuse_norm = env_is("TM_CUDA_FUSE_NORM", "1");
    c->norm_in = !env_is("TM_CUDA_NORM_IN", "0");
    /* unset or "attn": the norm after down only (norm-in after o too measured slower end to end, twenty-first
     * session); "1": both; "ffn": after o only */
    c->norm_in_sel = env_is("TM_CUDA_NORM_IN", "1")     ? NORM_IN_BOTH
                     : env_is("TM_CUDA_NORM_IN", "ffn") ? NORM_IN_AFTER_O
                                                        : NORM_IN_AFTER_DOWN;
    if ((e = cudaMalloc(&c->norm_scratch, TM_CUDA_GEMV_NORM_SCRATCH_BYTES)) != cudaSuccess ||
        (e = cudaMemsetAsync(c->norm_scratch, 0, TM_CUDA_GEMV_NORM_SCRATCH_BYTES, c->stream)) != cudaSuccess) {
        cudaGetLastError();
        s = tm_err(err, TM_ERR_DEVICE, "cuda fused-norm scratch: %s", cudaGetErrorString(e));
        goto fail;
    }
    c->no_qgemm = env_is("TM_CUDA_QGEMM", "0");
    if ((e = cudaMalloc(&c->qg_work, tm_cuda_qgemm_work_bytes())) != cudaSuccess ||
        (e = cudaMemsetAsync(c->qg_work, 0, tm_cuda_qgemm_work_bytes(), c->stream)) != cudaSuccess) {
        cudaGetLastError();
        s = tm_err(err, TM_ERR_NOMEM, "cuda quantized-GEMM work buffer: %s", cudaGetErrorString(e));
        goto fail;
    }
    /* opt-in ("1"): correct, but slower than the op path on the H200 so far (docs/PERFORMANCE.md, sixth session) */
    c->layer_on = env_is("TM_CUDA_LAYER", "1");
    *out = &c->base;
    return TM_OK;
fail:
    cu_free(&c->base);
    return s;
}
