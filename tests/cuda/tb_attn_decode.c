/* tb_attn_decode.c -- paged FlashDecoding (tm_cuda_attn_decode) against a double-precision CPU reference. */
#include "backend/cuda/tm_cuda_kernels.h"
#include "tb_common.h"
#include "core/tm_fp8.h"

/* Checks every version (TM_CUDA_ATTN_DECODE_V=1, 2, 3 and the default) and forced split counts on random q and
 * caches, random block tables (a shuffled pool; in the checked cases full blocks are shared across sequences),
 * contexts of 1, block_size - 1, block_size, non-multiples and 4096+, GQA ratios 1, 3, 4, 8 and 16, head dims
 * 32..256 (80 and block size 12 take the fallback paths), a graph captured once and replayed with shorter and
 * then longer contexts, and a launch without a work buffer. The slots of each sequence's last block past its
 * context hold NaN and the unused block-table entries a block id far out of range, so a kernel that reads them
 * fails. max_context_len may exceed every context (8b-maxctx8192, 8b-replay: each sequence still spreads over
 * all the splits). The error is the largest relative L2 error of a (sequence, head) row; non-finite output fails.
 * Timing: Llama-3-8B layer geometry (32/8 heads, head_dim 128, block 16) at 64 x 4096 (the target: >= 90% of
 * copy bandwidth), 1 x 4096, 8 x 4096, 256 x 1024, 1 x 32768, and Llama-3.2-1B's (32/8, head_dim 64) at 1 x 4096
 * and 64 x 4096, for v3 (default), v2 and v1 (3 sequences of each checked). Bytes = K and V of every context
 * + q + out; block tables rotate over a pool of >= 512 MB so small cases do not run from L2. */

#define KCH ((size_t)(1u << 22) + 1001u) /* the pool repeats a random chunk of this many elements */
static uint16_t *g_kh, *g_vh;            /* (KCH) bf16 chunks of K and V */
static float *g_kf, *g_vf;               /* (KCH) their values */
static uint16_t *g_kd, *g_vd;            /* (KCH) on the device */
static uint8_t *g_k8h, *g_v8h;           /* (KCH) the chunks rounded to fp8 e4m3 (fp8 cases) */
static float *g_k8f, *g_v8f;             /* (KCH) their values */
static uint8_t *g_k8d, *g_v8d;           /* (KCH) on the device */

typedef struct dcase {
    const char *name;
    int n_seqs, n_heads, n_kv, hd, bs;
    const int *ctx;     /* (n_seqs) host context lengths */
    int max_ctx;        /* passed as max_context_len (>= every ctx) */
    float q_scale;
    bool share;         /* full blocks drawn with replacement (shared across sequences) */
    bool fp8;           /* the caches hold fp8 e4m3 (the bf16 chunks rounded) */
    /* built */
    int n_rot, max_blocks;
    int64_t n_blocks;
    int32_t *tbl_h;     /* (n_rot, n_seqs, max_blocks) */
    uint16_t *q_h;      /* (n_seqs, n_heads * hd) */
    uint16_t *q_d, *k_d, *v_d, *out_d;
    int32_t *ctx_d, *tbl_d;
    void *work_d;
    size_t work_api, work_big;
    double kv_bytes;
} dcase;

static dcase mk(const char *name, int n_seqs, int n_heads, int n_kv, int hd, int bs, const int *ctx, int max_ctx,
                float q_scale, bool share) {
    dcase c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.n_seqs = n_seqs;
    c.n_heads = n_heads;
    c.n_kv = n_kv;
    c.hd = hd;
    c.bs = bs;
    c.ctx = ctx;
    c.max_ctx = max_ctx;
    c.q_scale = q_scale;
    c.share = share;
    return c;
}

static int cdiv(int a, int b) { return (a + b - 1) / b; }

static void shuffle_i64(int64_t *a, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tb_rand_u64() % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* mk with an fp8 cache */
static dcase mk8(const char *name, int n_seqs, int n_heads, int n_kv, int hd, int bs, const int *ctx, int max_ctx,
                 float q_scale, bool share) {
    dcase c = mk(name, n_seqs, n_heads, n_kv, hd, bs, ctx, max_ctx, q_scale, share);
    c.fp8 = true;
    return c;
}

/* fill a device pool of n elements of es bytes with the chunk, repeated */
static void fill_pool(void *dst, const void *chunk_d, size_t n, size_t es) {
    for (size_t off = 0; off < n; off += KCH) {
        size_t c = n - off < KCH ? n - off : KCH;
        TB_CHECK(cudaMemcpy((uint8_t *)dst + off * es, chunk_d, c * es, cudaMemcpyDeviceToDevice));
    }
}

static void build(dcase *c, bool timing) {
    const size_t es = c->fp8 ? 1 : 2; /* bytes per cache element */
    int64_t per_rot = 0;
    c->max_blocks = 0;
    c->kv_bytes = 0.0;
    for (int s = 0; s < c->n_seqs; s++) {
        int nb = cdiv(c->ctx[s] > 0 ? c->ctx[s] : 1, c->bs);
        per_rot += nb;
        if (nb > c->max_blocks) c->max_blocks = nb;
        c->kv_bytes += (double)c->ctx[s] * c->n_kv * c->hd * 2.0 * (double)es;
    }
    c->max_blocks += 2; /* poisoned entries past the end */
    double rot_bytes = (double)per_rot * c->n_kv * c->bs * c->hd * 2.0 * (double)es;
    c->n_rot = timing ? (int)ceil(512e6 / rot_bytes) : 1;
    if (c->n_rot < 1) c->n_rot = 1;
    int64_t n_shared = per_rot / 2 > 0 ? per_rot / 2 : 1;
    c->n_blocks = c->share ? n_shared + c->n_seqs : per_rot * c->n_rot;
    size_t tbl_n = (size_t)c->n_rot * c->n_seqs * c->max_blocks;
    c->tbl_h = malloc(tbl_n * sizeof(int32_t));
    for (size_t i = 0; i < tbl_n; i++) c->tbl_h[i] = 0x40000000; /* far out of range */
    int64_t *perm = malloc((size_t)c->n_blocks * sizeof(int64_t));
    for (int64_t i = 0; i < c->n_blocks; i++) perm[i] = i;
    shuffle_i64(perm, c->n_blocks);
    int64_t next = 0;
    for (int r = 0; r < c->n_rot; r++)
        for (int s = 0; s < c->n_seqs; s++) {
            int ctx = c->ctx[s] > 0 ? c->ctx[s] : 1, nb = cdiv(ctx, c->bs);
            int32_t *row = c->tbl_h + ((size_t)r * c->n_seqs + s) * c->max_blocks;
            for (int j = 0; j < nb; j++) {
                if (c->share) {
                    bool last_partial = j == nb - 1 && ctx % c->bs;
                    row[j] = last_partial ? (int32_t)perm[n_shared + s]
                                          : (int32_t)perm[tb_rand_u64() % (uint64_t)n_shared];
                } else {
                    row[j] = (int32_t)perm[next++];
                }
            }
        }
    free(perm);

    size_t pool = (size_t)c->n_blocks * c->n_kv * c->bs * c->hd;
    c->k_d = tb_dev(pool * es);
    c->v_d = tb_dev(pool * es);
    fill_pool(c->k_d, c->fp8 ? (const void *)g_k8d : g_kd, pool, es);
    fill_pool(c->v_d, c->fp8 ? (const void *)g_v8d : g_vd, pool, es);
    /* NaN in the slots past each context of rotation 0 (those blocks belong to one sequence) */
    for (int s = 0; s < c->n_seqs; s++) {
        int ctx = c->ctx[s], used = ctx % c->bs;
        if (ctx <= 0 || !used) continue;
        int32_t blk = c->tbl_h[(size_t)s * c->max_blocks + (size_t)(ctx - 1) / c->bs];
        for (int h = 0; h < c->n_kv; h++) {
            size_t off = (((size_t)blk * c->n_kv + h) * c->bs + used) * c->hd;
            size_t bytes = (size_t)(c->bs - used) * c->hd * es; /* 0xFF: NaN in bf16 and in e4m3 */
            TB_CHECK(cudaMemset((uint8_t *)c->k_d + off * es, 0xFF, bytes));
            TB_CHECK(cudaMemset((uint8_t *)c->v_d + off * es, 0xFF, bytes));
        }
    }
    size_t nq = (size_t)c->n_seqs * c->n_heads * c->hd;
    c->q_h = malloc(nq * 2);
    tb_fill_bf16(c->q_h, NULL, nq, c->q_scale);
    c->q_d = tb_upload(c->q_h, nq * 2);
    c->out_d = tb_dev(nq * 2);
    c->ctx_d = tb_upload(c->ctx, (size_t)c->n_seqs * 4);
    c->tbl_d = tb_upload(c->tbl_h, tbl_n * 4);
    c->work_api = tm_cuda_attn_decode_work_bytes(c->n_seqs, c->n_heads, c->hd, c->max_ctx);
    int stages = cdiv(c->max_ctx, 64);
    c->work_big = (size_t)c->n_seqs * c->n_heads * (size_t)stages * (c->hd + 1) * 4 + 256;
    if (c->work_big < c->work_api) c->work_big = c->work_api;
    c->work_d = tb_dev(c->work_big);
}

static void release(dcase *c) {
    cudaFree(c->q_d);
    cudaFree(c->k_d);
    cudaFree(c->v_d);
    cudaFree(c->out_d);
    cudaFree(c->ctx_d);
    cudaFree(c->tbl_d);
    cudaFree(c->work_d);
    free(c->tbl_h);
    free(c->q_h);
}

static tm_cuda_attn_args args_of(const dcase *c, int rot, bool work) {
    tm_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_heads = c->n_heads;
    a.n_kv_heads = c->n_kv;
    a.head_dim = c->hd;
    a.block_size = c->bs;
    a.scale = 1.0f / sqrtf((float)c->hd);
    a.n_tokens = a.n_seqs = c->n_seqs;
    a.max_blocks = c->max_blocks;
    a.seq_index = NULL;
    a.query_start = NULL;
    a.context_len = c->ctx_d;
    a.block_table = c->tbl_d + (size_t)rot * c->n_seqs * c->max_blocks;
    a.max_query_len = 1;
    a.max_context_len = c->max_ctx;
    a.q = c->q_d;
    a.k_cache = c->k_d;
    a.v_cache = c->v_d;
    a.kv_fp8 = c->fp8;
    a.out = c->out_d;
    a.work = work ? c->work_d : NULL;
    a.work_bytes = work ? c->work_big : 0;
    return a;
}

/* row t of a pool as values: elements base .. base + n - 1 of the repeated chunk */
static void pool_row(const float *chunk, size_t base, int n, double *dst) {
    size_t i = base % KCH;
    for (int j = 0; j < n; j++, i = i + 1 == KCH ? 0 : i + 1) dst[j] = chunk[i];
}

/* softmax(q K^T * scale) V in double for the sequences seqs[0 .. n_check-1] with contexts ctx:
 * returns (n_check, n_heads, hd) */
static double *reference(const dcase *c, const int *ctx, const int *seqs, int n_check) {
    int group = c->n_heads / c->n_kv, hd = c->hd;
    double scale = (double)(1.0f / sqrtf((float)hd));
    int max_ctx = 1;
    for (int s = 0; s < c->n_seqs; s++) max_ctx = ctx[s] > max_ctx ? ctx[s] : max_ctx;
    double *ref = calloc((size_t)n_check * c->n_heads * hd, sizeof(double));
    double *sc = malloc((size_t)max_ctx * sizeof(double)), *kv = malloc((size_t)hd * sizeof(double));
    double *q = malloc((size_t)hd * sizeof(double));
    const float *kf = c->fp8 ? g_k8f : g_kf, *vf = c->fp8 ? g_v8f : g_vf; /* the values the cache holds */
    for (int ci = 0; ci < n_check; ci++) {
        int s = seqs[ci];
        const int32_t *row = c->tbl_h + (size_t)s * c->max_blocks;
        for (int h = 0; h < c->n_heads; h++) {
            int kvh = h / group;
            double *r = ref + ((size_t)ci * c->n_heads + h) * hd, mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < hd; j++) q[j] = tb_bf16_to_f32(c->q_h[((size_t)s * c->n_heads + h) * hd + j]);
            for (int t = 0; t < ctx[s]; t++) {
                pool_row(kf, (((size_t)row[t / c->bs] * c->n_kv + kvh) * c->bs + t % c->bs) * hd, hd, kv);
                double d = 0.0;
                for (int j = 0; j < hd; j++) d += q[j] * kv[j];
                sc[t] = d * scale;
                if (sc[t] > mx) mx = sc[t];
            }
            for (int t = 0; t < ctx[s]; t++) {
                pool_row(vf, (((size_t)row[t / c->bs] * c->n_kv + kvh) * c->bs + t % c->bs) * hd, hd, kv);
                double p = exp(sc[t] - mx);
                sum += p;
                for (int j = 0; j < hd; j++) r[j] += p * kv[j];
            }
            for (int j = 0; j < hd; j++) r[j] = sum > 0.0 ? r[j] / sum : 0.0;
        }
    }
    free(sc);
    free(kv);
    free(q);
    return ref;
}

/* max over the checked (sequence, head) rows of ||out - ref|| / ||ref||; every output element must be finite */
static double compare(const dcase *c, const double *ref, const int *seqs, int n_check) {
    size_t nq = (size_t)c->n_seqs * c->n_heads * c->hd;
    uint16_t *o = malloc(nq * 2);
    tb_download(o, c->out_d, nq * 2);
    double worst = 0.0;
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(tb_bf16_to_f32(o[i]))) worst = INFINITY;
    for (int ci = 0; ci < n_check; ci++)
        for (int h = 0; h < c->n_heads; h++) {
            const double *r = ref + ((size_t)ci * c->n_heads + h) * c->hd;
            const uint16_t *oo = o + ((size_t)seqs[ci] * c->n_heads + h) * c->hd;
            double num = 0.0, den = 0.0;
            for (int j = 0; j < c->hd; j++) {
                double d = (double)tb_bf16_to_f32(oo[j]) - r[j];
                num += d * d;
                den += r[j] * r[j];
            }
            double e = den > 0.0 ? sqrt(num / den) : sqrt(num);
            if (!(e <= worst)) worst = e; /* NaN-safe */
        }
    free(o);
    return worst;
}

static void set_env(const char *ver, const char *splits) {
    if (ver) setenv("TM_CUDA_ATTN_DECODE_V", ver, 1);
    else unsetenv("TM_CUDA_ATTN_DECODE_V");
    if (splits) setenv("TM_CUDA_ATTN_DECODE_SPLITS", splits, 1);
    else unsetenv("TM_CUDA_ATTN_DECODE_SPLITS");
}

typedef struct variant {
    const char *label, *ver, *splits;
    bool work;
    bool eager; /* TM_CUDA_ATTN_DECODE_LAZY=0: v3's running max moves on every growth */
} variant;

static const variant k_variants[] = {
    {"v1", "1", NULL, true, false},        {"v2", "2", NULL, true, false},      {"v2-s3", "2", "3", true, false},
    {"v3", "3", NULL, true, false},        {"v3-s1", "3", "1", true, false},    {"v3-s3", "3", "3", true, false},
    {"v3-s7", "3", "7", true, false},      {"v3-s64", "3", "64", true, false},  {"v3-nowork", "3", NULL, false, false},
    {"v3-eager", "3", NULL, true, true},   {"v3-s3-eager", "3", "3", true, true},
    {"default", NULL, NULL, true, false},
};

static void all_seqs(const dcase *c, int *seqs) {
    for (int s = 0; s < c->n_seqs; s++) seqs[s] = s;
}

static void correctness_case(dcase *c) {
    build(c, false);
    int seqs[64];
    all_seqs(c, seqs);
    double *ref = reference(c, c->ctx, seqs, c->n_seqs);
    for (size_t v = 0; v < sizeof k_variants / sizeof k_variants[0]; v++) {
        const variant *vr = &k_variants[v];
        set_env(vr->ver, vr->splits);
        if (vr->eager) setenv("TM_CUDA_ATTN_DECODE_LAZY", "0", 1);
        else unsetenv("TM_CUDA_ATTN_DECODE_LAZY");
        tm_cuda_attn_args a = args_of(c, 0, vr->work);
        /* v3-nowork: no buffer at all */
        tb_poison(c->out_d, (size_t)c->n_seqs * c->n_heads * c->hd * 2);
        tb_poison(c->work_d, c->work_big);
        TB_RUN(tm_cuda_attn_decode(&a, 0));
        char name[96];
        snprintf(name, sizeof name, "%s%s %s", c->name, c->fp8 ? " fp8" : "", vr->label);
        tb_result("attn_decode", name, compare(c, ref, seqs, c->n_seqs), 1e-2, 0.0, 0.0, 0.0, 'm');
        /* the e4m3 copy (out8): the same bf16 output, and each byte the e4m3 rounding of that bf16 value times
         * out8_inv, as tm_cuda_quant_fp8 makes it */
        const size_t nq = (size_t)c->n_seqs * c->n_heads * c->hd;
        uint16_t *o1 = malloc(nq * 2), *o2 = malloc(nq * 2);
        uint8_t *o8 = malloc(nq), *o8_d = tb_dev(nq);
        tb_download(o1, c->out_d, nq * 2);
        tb_poison(c->out_d, nq * 2);
        tb_poison(o8_d, nq);
        a.out8 = o8_d;
        a.out8_inv = 1.0f / 3.0f;
        TB_RUN(tm_cuda_attn_decode(&a, 0));
        tb_download(o2, c->out_d, nq * 2);
        tb_download(o8, o8_d, nq);
        size_t bad = 0;
        for (size_t i = 0; i < nq; i++)
            bad += o1[i] != o2[i] || o8[i] != tm_fp8_from_f32(tb_bf16_to_f32(o2[i]) * a.out8_inv);
        snprintf(name, sizeof name, "%s%s %s out8", c->name, c->fp8 ? " fp8" : "", vr->label);
        tb_result("attn_decode", name, (double)bad, 0.0, 0.0, 0.0, 0.0, 'm');
        TB_CHECK(cudaFree(o8_d));
        free(o1);
        free(o2);
        free(o8);
    }
    set_env(NULL, NULL);
    unsetenv("TM_CUDA_ATTN_DECODE_LAZY");
    free(ref);
    release(c);
}

/* capture once, then replay with random shorter contexts and with the full ones (longer than the previous
 * replay), written to the same device array between replays, as a backend's decode steps do */
static void graph_case(dcase *c) {
    build(c, false);
    int seqs[64], ctx2[64];
    all_seqs(c, seqs);
    const char *vers[] = {"2", "3"};
    for (int v = 0; v < 2; v++) {
        set_env(vers[v], NULL);
        cudaStream_t st;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        TB_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        tm_cuda_attn_args a = args_of(c, 0, true);
        a.work_bytes = c->work_api; /* what a backend would allocate */
        TB_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        TB_CHECK(tm_cuda_attn_decode(&a, st));
        TB_CHECK(cudaStreamEndCapture(st, &g));
        TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 0; rep < 2; rep++) {
            for (int s = 0; s < c->n_seqs; s++)
                ctx2[s] = rep == 1 ? c->ctx[s] : 1 + (int)(tb_rand_u64() % (uint64_t)c->ctx[s]);
            TB_CHECK(cudaMemcpy(c->ctx_d, ctx2, (size_t)c->n_seqs * 4, cudaMemcpyHostToDevice));
            double *ref = reference(c, ctx2, seqs, c->n_seqs);
            tb_poison(c->out_d, (size_t)c->n_seqs * c->n_heads * c->hd * 2);
            TB_CHECK(cudaGraphLaunch(ge, st));
            TB_CHECK(cudaStreamSynchronize(st));
            char name[96];
            snprintf(name, sizeof name, "%s%s v%s graph-%s", c->name, c->fp8 ? " fp8" : "", vers[v],
                     rep ? "longer" : "shorter");
            tb_result("attn_decode", name, compare(c, ref, seqs, c->n_seqs), 1e-2, 0.0, 0.0, 0.0, 'm');
            free(ref);
        }
        TB_CHECK(cudaMemcpy(c->ctx_d, c->ctx, (size_t)c->n_seqs * 4, cudaMemcpyHostToDevice));
        TB_CHECK(cudaGraphExecDestroy(ge));
        TB_CHECK(cudaGraphDestroy(g));
        TB_CHECK(cudaStreamDestroy(st));
    }
    set_env(NULL, NULL);
    release(c);
}

typedef struct time_arg {
    dcase *c;
    int rot;
} time_arg;

static void run_rot(void *p) {
    time_arg *t = p;
    tm_cuda_attn_args a = args_of(t->c, t->rot % t->c->n_rot, true);
    a.work_bytes = t->c->work_api;
    t->rot++;
    TB_CHECK(tm_cuda_attn_decode(&a, 0));
}

static void timing_case(dcase *c) {
    build(c, true);
    int seqs[3] = {0, c->n_seqs / 2, c->n_seqs - 1}, n_check = c->n_seqs < 3 ? c->n_seqs : 3;
    const char *vers[] = {"3", "2", "1"};
    double io = (double)c->n_seqs * c->n_heads * c->hd * 2.0 * 2.0;
    double *ref = reference(c, c->ctx, seqs, n_check);
    for (int v = 0; v < 3; v++) {
        if (c->fp8 && v == 1) continue; /* v2 reads bf16 only (an fp8 cache takes v1) */
        set_env(vers[v], NULL);
        time_arg t = {c, 0};
        tb_poison(c->out_d, (size_t)c->n_seqs * c->n_heads * c->hd * 2);
        run_rot(&t); /* rotation 0: checked */
        TB_CHECK(cudaDeviceSynchronize());
        double err = compare(c, ref, seqs, n_check);
        int reps = v == 2 ? 5 : 30;
        double us = tb_time_us(run_rot, &t, 2, reps);
        char name[96];
        snprintf(name, sizeof name, "%s%s v%s", c->name, c->fp8 ? " fp8" : "", vers[v]);
        tb_result("attn_decode", name, err, 1e-2, us, c->kv_bytes + io, 0.0, 'm');
    }
    free(ref);
    set_env(NULL, NULL);
    release(c);
}

/* TB_DEC_SPLIT_SWEEP=1: one sequence at long contexts (batch-1 decode at depth), v3 with the launcher's split count
 * and with each forced count, checked then timed; GB/s of K and V */
static void split_sweep(void) {
    static int ctx[1];
    static const int lens[] = {4096, 16384, 32768, 65536};
    static const char *const forced[] = {NULL, "8", "16", "24", "32", "48", "64", "96", "128", "192", "256"};
    for (int f8 = 0; f8 < 2; f8++)
        for (int shape = 0; shape < 2; shape++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                ctx[0] = lens[l];
                char name[64];
                snprintf(name, sizeof name, "%s 1x%d", shape ? "1b" : "8b", lens[l]);
                dcase c = f8 ? mk8(name, 1, 32, 8, shape ? 64 : 128, 16, ctx, lens[l], 1.0f, false)
                             : mk(name, 1, 32, 8, shape ? 64 : 128, 16, ctx, lens[l], 1.0f, false);
                build(&c, true);
                int seq0 = 0;
                double *ref = reference(&c, c.ctx, &seq0, 1);
                for (size_t k = 0; k < sizeof forced / sizeof forced[0]; k++) {
                    set_env("3", forced[k]);
                    time_arg t = {&c, 0};
                    tb_poison(c.out_d, (size_t)c.n_heads * c.hd * 2);
                    run_rot(&t);
                    TB_CHECK(cudaDeviceSynchronize());
                    const double err = compare(&c, ref, &seq0, 1), us = tb_time_us(run_rot, &t, 2, 30);
                    char nm[96];
                    snprintf(nm, sizeof nm, "%s%s splits %s", name, f8 ? " fp8" : "", forced[k] ? forced[k] : "auto");
                    tb_result("attn_decode", nm, err, 1e-2, us, c.kv_bytes, 0.0, 'm');
                }
                free(ref);
                set_env(NULL, NULL);
                release(&c);
            }
}

/* work_bytes must be monotone in n_seqs and max_context_len (one buffer for the largest batch serves all) */
static void work_bytes_checks(void) {
    int bad = 0;
    for (int ctx = 1; ctx <= 70000; ctx = ctx * 3 + 7)
        for (int n = 1; n < 2100; n += 1 + n / 7) {
            size_t w = tm_cuda_attn_decode_work_bytes(n, 32, 128, ctx);
            if (w > tm_cuda_attn_decode_work_bytes(n + 1, 32, 128, ctx) ||
                w > tm_cuda_attn_decode_work_bytes(n, 32, 128, ctx + 100))
                bad++;
        }
    tb_result("attn_decode", "work_bytes monotone", bad ? 1.0 : 0.0, 0.0, 0.0, 0.0, 0.0, 'm');
    tm_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_seqs = 2;
    a.n_tokens = 3;
    tb_result("attn_decode", "n_tokens != n_seqs refused",
              tm_cuda_attn_decode(&a, 0) == cudaErrorInvalidValue ? 0.0 : 1.0, 0.0, 0.0, 0.0, 0.0, 'm');
    (void)cudaGetLastError();
}

int main(void) {
    tb_seed();
    g_kh = malloc(KCH * 2);
    g_vh = malloc(KCH * 2);
    g_kf = malloc(KCH * sizeof(float));
    g_vf = malloc(KCH * sizeof(float));
    tb_fill_bf16(g_kh, g_kf, KCH, 1.0f);
    tb_fill_bf16(g_vh, g_vf, KCH, 1.0f);
    g_kd = tb_upload(g_kh, KCH * 2);
    g_vd = tb_upload(g_vh, KCH * 2);
    g_k8h = malloc(KCH);
    g_v8h = malloc(KCH);
    g_k8f = malloc(KCH * sizeof(float));
    g_v8f = malloc(KCH * sizeof(float));
    for (size_t i = 0; i < KCH; i++) {
        g_k8h[i] = tm_fp8_from_f32(g_kf[i]);
        g_v8h[i] = tm_fp8_from_f32(g_vf[i]);
        g_k8f[i] = tm_fp8_to_f32(g_k8h[i]);
        g_v8f[i] = tm_fp8_to_f32(g_v8h[i]);
    }
    g_k8d = tb_upload(g_k8h, KCH);
    g_v8d = tb_upload(g_v8h, KCH);

    work_bytes_checks();
    if (getenv("TB_DEC_SPLIT_SWEEP")) {
        split_sweep();
        goto done;
    }

    if (getenv("TB_TIME_ONLY")) goto timing; /* the timings alone (an A/B of a launch setting) */
    static const int c8b[] = {1, 15, 16, 17, 100, 1000, 4100};
    static const int csm[] = {1, 2, 63, 64, 65, 777, 2048, 4097};
    static const int cmha[] = {1, 7, 8, 9, 513, 3000};
    static const int cg8[] = {31, 32, 33, 1500, 5000};
    static const int c96[] = {1, 63, 64, 65, 2000};
    static const int cg16[] = {5, 300, 4096};
    static const int c256[] = {1, 129, 1025};
    static const int c80[] = {3, 200, 1000};
    static const int codd[] = {11, 12, 13, 500};
    static const int crep[] = {10, 700, 64, 3000};
    static const int cpk[] = {2000, 50, 4096};
    static const int clong[] = {20000};
    dcase cc[] = {
        mk("8b-mix", 7, 32, 8, 128, 16, c8b, 4100, 1.0f, true),
        mk("smollm2-9/3", 8, 9, 3, 64, 16, csm, 4097, 1.0f, true),
        mk("mha-hd128-bs8", 6, 8, 8, 128, 8, cmha, 3000, 1.0f, true),
        mk("gqa8-hd64-bs32", 5, 16, 2, 64, 32, cg8, 5000, 1.0f, true),
        mk("hd96-bs64", 5, 12, 4, 96, 64, c96, 2000, 1.0f, true),
        mk("g16-hd32", 3, 16, 1, 32, 16, cg16, 4096, 1.0f, true),
        mk("hd256-g2", 3, 8, 4, 256, 16, c256, 1025, 1.0f, true),
        mk("hd80-fallback", 3, 4, 2, 80, 16, c80, 1000, 1.0f, true),
        mk("bs12-fallback", 4, 4, 2, 64, 12, codd, 500, 1.0f, true),
        mk("8b-maxctx8192", 4, 32, 8, 128, 16, crep, 8192, 1.0f, true),
        mk("8b-peaky-q8", 3, 32, 8, 128, 16, cpk, 4096, 8.0f, true),
        mk("8b-1x20000", 1, 32, 8, 128, 16, clong, 20000, 1.0f, true),
        mk8("8b-mix", 7, 32, 8, 128, 16, c8b, 4100, 1.0f, true),
        mk8("smollm2-9/3", 8, 9, 3, 64, 16, csm, 4097, 1.0f, true),
        mk8("hd96-bs64", 5, 12, 4, 96, 64, c96, 2000, 1.0f, true),
        mk8("g16-hd32", 3, 16, 1, 32, 16, cg16, 4096, 1.0f, true),
        mk8("hd256-g2", 3, 8, 4, 256, 16, c256, 1025, 1.0f, true),
        mk8("hd80-fallback", 3, 4, 2, 80, 16, c80, 1000, 1.0f, true),
        mk8("bs12-fallback", 4, 4, 2, 64, 12, codd, 500, 1.0f, true),
        mk8("8b-peaky-q8", 3, 32, 8, 128, 16, cpk, 4096, 8.0f, true),
    };
    for (size_t i = 0; i < sizeof cc / sizeof cc[0]; i++) correctness_case(&cc[i]);
    /* one split a sequence, so that a split runs chunk by chunk through the staged block ids (chunks of 16320 tokens
     * over a bf16 cache, 4032 with the small table, 8128 over fp8) */
    setenv("TM_CUDA_ATTN_DECODE_SPLITS", "1", 1);
    static const int cchk[] = {9000, 4033, 4032, 17000};
    dcase ck[] = {mk("hd64-chunks", 4, 32, 8, 64, 16, cchk, 17000, 1.0f, true),
                  mk("8b-chunks", 4, 32, 8, 128, 16, cchk, 17000, 1.0f, true),
                  mk8("8b-chunks", 4, 32, 8, 128, 16, cchk, 17000, 1.0f, true)};
    for (size_t i = 0; i < sizeof ck / sizeof ck[0]; i++) correctness_case(&ck[i]);
    /* the small table (the launcher's at head_dim <= 64 when the CTAs fill every slot unsplit) */
    setenv("TM_CUDA_DEC_TBL", "256", 1);
    dcase ck256 = mk("hd64-chunks tbl256", 4, 32, 8, 64, 16, cchk, 17000, 1.0f, true);
    correctness_case(&ck256);
    unsetenv("TM_CUDA_DEC_TBL");
    unsetenv("TM_CUDA_ATTN_DECODE_SPLITS");
    dcase gc = mk("8b-replay", 4, 32, 8, 128, 16, crep, 8192, 1.0f, true);
    graph_case(&gc);
    dcase gc8 = mk8("8b-replay", 4, 32, 8, 128, 16, crep, 8192, 1.0f, true);
    graph_case(&gc8);

timing:;
    /* timing */
    static int c64[64], c1[1], c8[8], c256x[256], c32k[1];
    for (int i = 0; i < 64; i++) c64[i] = 4096;
    for (int i = 0; i < 8; i++) c8[i] = 4096;
    for (int i = 0; i < 256; i++) c256x[i] = 1024;
    c1[0] = 4096;
    c32k[0] = 32768;
    dcase tc[] = {
        mk("8b 64x4096", 64, 32, 8, 128, 16, c64, 4096, 1.0f, false),
        mk("8b 1x4096", 1, 32, 8, 128, 16, c1, 4096, 1.0f, false),
        mk("8b 8x4096", 8, 32, 8, 128, 16, c8, 4096, 1.0f, false),
        mk("8b 256x1024", 256, 32, 8, 128, 16, c256x, 1024, 1.0f, false),
        mk("8b 1x32768", 1, 32, 8, 128, 16, c32k, 32768, 1.0f, false),
        mk("1b 1x4096", 1, 32, 8, 64, 16, c1, 4096, 1.0f, false),
        mk("1b 64x4096", 64, 32, 8, 64, 16, c64, 4096, 1.0f, false),
        mk8("8b 64x4096", 64, 32, 8, 128, 16, c64, 4096, 1.0f, false),
        mk8("8b 256x1024", 256, 32, 8, 128, 16, c256x, 1024, 1.0f, false),
        mk8("8b 64x4096 bs32", 64, 32, 8, 128, 32, c64, 4096, 1.0f, false),
        mk8("8b 64x4096 bs64", 64, 32, 8, 128, 64, c64, 4096, 1.0f, false),
        mk8("8b 256x1024 bs32", 256, 32, 8, 128, 32, c256x, 1024, 1.0f, false),
        mk8("8b 1x4096", 1, 32, 8, 128, 16, c1, 4096, 1.0f, false),
        mk8("1b 64x4096", 64, 32, 8, 64, 16, c64, 4096, 1.0f, false),
    };
    for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++) timing_case(&tc[i]);
    /* the throughput run's decode step: 512 sequences of 1024..2047 tokens in random order (sixteenth session: the
     * same within 0.5% with the longest or the shortest first, so the order of the CTAs costs nothing) */
    static int cr[512];
    for (int i = 0; i < 512; i++) cr[i] = 1024 + (int)(tb_rand_u64() % 1024);
    dcase oc = mk8("8b 512x1024..2047", 512, 32, 8, 128, 16, cr, 2048, 1.0f, false);
    timing_case(&oc);
    dcase oc1[] = {mk("1b 512x1024..2047", 512, 32, 8, 64, 16, cr, 2048, 1.0f, false),
                   mk8("1b 512x1024..2047", 512, 32, 8, 64, 16, cr, 2048, 1.0f, false)};
    for (size_t i = 0; i < sizeof oc1 / sizeof oc1[0]; i++) timing_case(&oc1[i]);
    /* the same two key shapes with the running max moved on every growth (the rescale every stage) */
    setenv("TM_CUDA_ATTN_DECODE_LAZY", "0", 1);
    dcase ec[] = {mk8("8b 512x1024..2047 eager max", 512, 32, 8, 128, 16, cr, 2048, 1.0f, false),
                  mk8("8b 64x4096 eager max", 64, 32, 8, 128, 16, c64, 4096, 1.0f, false),
                  mk("8b 64x4096 eager max", 64, 32, 8, 128, 16, c64, 4096, 1.0f, false)};
    for (size_t i = 0; i < sizeof ec / sizeof ec[0]; i++) timing_case(&ec[i]);
    unsetenv("TM_CUDA_ATTN_DECODE_LAZY");
    if (tb_env_d("TB_SOAK_S", 0.0) > 0.0) { /* that shape under a sustained load (tb_soak_us), fp8 and bf16 caches */
        dcase ob = mk("8b 512x1024..2047", 512, 32, 8, 128, 16, cr, 2048, 1.0f, false);
        dcase *sc[3] = {&oc, &oc, &ob};
        for (int i = 0; i < 3; i++) {
            if (i == 1) setenv("TM_CUDA_ATTN_DECODE_LAZY", "0", 1); /* fp8 with the running max moved every growth */
            build(sc[i], true);
            time_arg t = {sc[i], 0};
            const double us = tb_soak_us(run_rot, &t);
            printf("# soak attn_decode 8b 512x1024..2047 %s v3: %.1f us a call, %.0f GB/s\n",
                   i == 2 ? "bf16" : i ? "fp8 eager max" : "fp8", us, sc[i]->kv_bytes / (us * 1e3));
            fflush(stdout);
            release(sc[i]);
            unsetenv("TM_CUDA_ATTN_DECODE_LAZY");
        }
    }

done:
    cudaFree(g_kd);
    cudaFree(g_vd);
    cudaFree(g_k8d);
    cudaFree(g_v8d);
    free(g_k8h);
    free(g_v8h);
    free(g_k8f);
    free(g_v8f);
    free(g_kh);
    free(g_vh);
    free(g_kf);
    free(g_vf);
    return tb_finish("tb_attn_decode");
}
