/* test_tp.c -- tensor-parallel shard plans: shards reassemble every weight byte for byte; a sharded forward with an
 * in-process sum of the wo / w_down partials equals the unsharded one (dense f64 and on the cpu backend's ops);
 * indivisible head counts and misaligned quantized column splits are refused; the TCP exchange of the collective
 * library's id between ranks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cpu/tm_quant.h"
#include "model/tm_model.h"
#include "model/tm_tp.h"
#include "model/tm_tp_forward.h"
#include "tm_test_ref.h"
#include "tm_test_tiny_model.h"

enum { MAX_RANKS = 4, N_TOK = 21 };

/* ---- helpers ----------------------------------------------------------------------------------- */

static tm_model *load(const char *path) {
    tm_model *m = NULL;
    tm_error err = {0};
    tm_status s = tm_model_load(path, &m, &err);
    if (s != TM_OK) fail_msg("load %s: %s", path, err.msg);
    return m;
}

static tm_model *shard(const tm_model *m, int n, int r) {
    tm_model *s = NULL;
    tm_error err = {0};
    if (tm_tp_shard_model(m, n, r, &s, &err) != TM_OK) fail_msg("shard %d/%d: %s", r, n, err.msg);
    return s;
}

/* weight k (0..11) of layer l, or of the model (l < 0: 0 tok_embd, 1 output_norm, 2 output) */
static const tm_weight *wt(const tm_model *m, int l, int k) {
    if (l < 0) return k == 0 ? &m->tok_embd : k == 1 ? &m->output_norm : &m->output;
    const tm_layer *L = &m->layers[l];
    const tm_weight *ws[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk,
                             &L->bv,        &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
    return ws[k];
}
/* how the test expects layer weight k to be split: 0 replicated, 1 rows, 2 columns (biases: columns of (1, n)) */
static const int k_layer_split[12] = {0, 1, 1, 1, 2, 2, 2, 2, 0, 1, 1, 2};

static uint64_t wbytes(const tm_weight *w) {
    return tm_dtype_row_bytes(w->type, (uint64_t)w->cols) * (uint64_t)w->rows;
}

/* max |a-b| / max |b| (float against double: ref_rel_err) */
static double rel_err_dd(const double *a, const double *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - b[i]));
        mb = fmax(mb, fabs(b[i]));
    }
    return md / mb;
}
static double rel_err_ff(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - (double)b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return md / mb;
}

static void make_ids(int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((7u * 2654435761u + (unsigned)i * 40503u) % (unsigned)vocab);
}

/* ---- (a) shards reassemble the original ------------------------------------------------------- */

/* Concatenating the ranks' row slices in rank order, or each row's column slices in rank order, gives back the
 * original bytes; replicated weights are identical on every rank. */
static void check_reassembly(const tm_model *m, int n) {
    tm_model *sh[MAX_RANKS];
    for (int r = 0; r < n; r++) sh[r] = shard(m, n, r);
    const tm_hparams *hp = &m->hp;
    for (int r = 0; r < n; r++) {
        assert_int_equal(sh[r]->hp.n_heads, hp->n_heads / n);
        assert_int_equal(sh[r]->hp.n_kv_heads, hp->n_kv_heads / n);
        assert_int_equal(sh[r]->hp.ffn_dim, hp->ffn_dim / n);
        assert_int_equal(sh[r]->hp.dim, hp->dim);
        assert_int_equal(sh[r]->hp.head_dim, hp->head_dim);
        assert_int_equal(sh[r]->hp.n_layers, hp->n_layers);
        assert_null(sh[r]->tok);
        assert_memory_equal(sh[r]->rope_inv_freq, m->rope_inv_freq, sizeof(float) * (size_t)(hp->rope_dim / 2));
        if (hp->tied_embeddings) assert_ptr_equal(sh[r]->output.data, sh[r]->tok_embd.data);
        else assert_ptr_not_equal(sh[r]->output.data, sh[r]->tok_embd.data);
        assert_true(sh[r]->weight_bytes > 0);
    }
    for (int l = -1; l < hp->n_layers; l++) {
        int nk = l < 0 ? 3 : 12;
        for (int k = 0; k < nk; k++) {
            const tm_weight *w = wt(m, l, k);
            int split = l < 0 ? 0 : k_layer_split[k];
            if (!w->data) { /* absent bias: absent everywhere */
                for (int r = 0; r < n; r++) assert_null(wt(sh[r], l, k)->data);
                continue;
            }
            uint64_t total = wbytes(w), rb = tm_dtype_row_bytes(w->type, (uint64_t)w->cols);
            uint8_t *buf = calloc(1, total);
            uint64_t off = 0, col_off = 0;
            for (int r = 0; r < n; r++) {
                const tm_weight *s = wt(sh[r], l, k);
                assert_non_null(s->data);
                assert_int_equal(s->type, w->type);
                uint64_t sb = wbytes(s), srb = tm_dtype_row_bytes(s->type, (uint64_t)s->cols);
                if (split == 0) {
                    assert_int_equal(s->rows, w->rows);
                    assert_int_equal(s->cols, w->cols);
                    assert_memory_equal(s->data, w->data, total);
                } else if (split == 1) {
                    assert_int_equal(s->rows, w->rows / n);
                    assert_int_equal(s->cols, w->cols);
                    assert_true(off + sb <= total);
                    memcpy(buf + off, s->data, sb);
                    off += sb;
                } else {
                    assert_int_equal(s->rows, w->rows);
                    assert_int_equal(s->cols, w->cols / n);
                    for (int64_t row = 0; row < w->rows; row++)
                        memcpy(buf + rb * (uint64_t)row + col_off, (const uint8_t *)s->data + srb * (uint64_t)row, srb);
                    col_off += srb;
                }
            }
            if (split == 1) assert_int_equal(off, total);
            if (split == 2) assert_int_equal(col_off, rb);
            if (split != 0 && memcmp(buf, w->data, total))
                fail_msg("layer %d weight %d (%s) does not reassemble at N=%d", l, k, tm_dtype_name(w->type), n);
            free(buf);
        }
    }
    for (int r = 0; r < n; r++) tm_tp_shard_free(sh[r]);
}

typedef struct model_case {
    const char *arch;
    tm_dtype wtype;
    bool tied;
    int dim, heads, kv_heads, ffn;
    int max_ranks; /* shard at N = 1, 2, 4 up to this */
} model_case;

static const model_case k_cases[] = {
    {"llama", TM_DT_F32, true, 64, 4, 2, 96, 2},
    {"llama", TM_DT_F16, false, 64, 8, 4, 128, 4},
    {"qwen2", TM_DT_F16, false, 64, 4, 2, 96, 2},
    {"qwen2", TM_DT_F32, true, 64, 8, 4, 96, 4},
    {"llama", TM_DT_Q8_0, false, 128, 8, 4, 256, 4},  /* wo slice 64 / 32 cols, down 128 / 64 */
    {"qwen2", TM_DT_Q8_0, false, 128, 4, 4, 128, 4},  /* N=4: wo slice 32, down 32 */
    {"llama", TM_DT_Q4_K, false, 512, 4, 2, 512, 2},  /* wo slice 256, down 256 */
};

static tiny_opts case_opts(const model_case *c) {
    tiny_opts o = tiny_default();
    o.arch = c->arch;
    o.wtype = c->wtype;
    o.tied = c->tied;
    o.dim = c->dim;
    o.heads = c->heads;
    o.kv_heads = c->kv_heads;
    o.ffn = c->ffn;
    return o;
}

static void test_shards_reassemble(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        tiny_opts o = case_opts(&k_cases[i]);
        const char *path = write_tiny(&o);
        tm_model *m = load(path);
        for (int n = 1; n <= k_cases[i].max_ranks; n *= 2) check_reassembly(m, n);
        tm_model_free(m);
        unlink(path);
    }
}

/* ---- (b) sharded forward == unsharded forward -------------------------------------------------- */

/* dense f64 reference: ref_forward of test_model.c, generalised to n_ranks shard models whose wo and w_down
 * partial products are summed before the residual add (one shard at N=1: the unsharded model) */

typedef struct dlayer {
    float *wq, *wk, *wv, *wo, *wg, *wu, *wd; /* dense (rows, cols) */
} dlayer;

static void ref_matvec(const float *d, int64_t rows, int64_t cols, const tm_weight *b, const double *x, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        double acc = b && b->data ? (double)((const float *)b->data)[r] : 0.0;
        for (int64_t c = 0; c < cols; c++) acc += (double)d[r * cols + c] * x[c];
        out[r] = acc;
    }
}

/* logits (n, vocab) for every position of ids */
static double *ref_forward_tp(tm_model *const *sh, int n_ranks, const int32_t *ids, int n) {
    const tm_hparams *hp = &sh[0]->hp; /* per-rank heads / ffn */
    int dim = hp->dim, hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd, ffn = hp->ffn_dim;
    double *x = calloc((size_t)n * dim, sizeof(double)), *xb = malloc(sizeof(double) * dim);
    double *q = malloc(sizeof(double) * qd), *att = malloc(sizeof(double) * qd), *tmp = malloc(sizeof(double) * dim);
    double *acc = malloc(sizeof(double) * dim);
    double *K = malloc(sizeof(double) * (size_t)n_ranks * n * kvd); /* (rank, token, kv width) */
    double *V = malloc(sizeof(double) * (size_t)n_ranks * n * kvd); /* (rank, token, kv width) */
    double *g = malloc(sizeof(double) * ffn), *u = malloc(sizeof(double) * ffn), *sc = malloc(sizeof(double) * n);
    dlayer *D = calloc((size_t)n_ranks, sizeof(dlayer));
    float *emb = dense(&sh[0]->tok_embd);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) x[t * dim + i] = emb[(size_t)ids[t] * dim + i];
    free(emb);
    for (int l = 0; l < hp->n_layers; l++) {
        for (int r = 0; r < n_ranks; r++) {
            const tm_layer *L = &sh[r]->layers[l];
            D[r] = (dlayer){dense(&L->wq), dense(&L->wk), dense(&L->wv), dense(&L->wo),
                            dense(&L->w_gate), dense(&L->w_up), dense(&L->w_down)};
        }
        for (int t = 0; t < n; t++) { /* causal: token t only needs K, V of tokens <= t */
            double *xt = x + (size_t)t * dim;
            memset(acc, 0, sizeof(double) * dim);
            for (int r = 0; r < n_ranks; r++) { /* attention: each rank its own heads, partial wo product */
                const tm_layer *L = &sh[r]->layers[l];
                double *Kr = K + (size_t)r * n * kvd, *Vr = V + (size_t)r * n * kvd;
                ref_rmsnorm(xt, &L->attn_norm, hp->norm_eps, dim, xb);
                ref_matvec(D[r].wq, qd, dim, &L->bq, xb, q);
                ref_matvec(D[r].wk, kvd, dim, &L->bk, xb, Kr + (size_t)t * kvd);
                ref_matvec(D[r].wv, kvd, dim, &L->bv, xb, Vr + (size_t)t * kvd);
                for (int h = 0; h < hp->n_heads; h++) ref_rope(q + h * hd, t, sh[r]);
                for (int h = 0; h < hp->n_kv_heads; h++) ref_rope(Kr + (size_t)t * kvd + h * hd, t, sh[r]);
                ref_attention(q, Kr, Vr, t, hp->n_heads, hp->n_kv_heads, hd, sc, att);
                ref_matvec(D[r].wo, dim, qd, NULL, att, tmp);
                for (int i = 0; i < dim; i++) acc[i] += tmp[i]; /* the all-reduce */
            }
            for (int i = 0; i < dim; i++) xt[i] += acc[i];
            memset(acc, 0, sizeof(double) * dim);
            for (int r = 0; r < n_ranks; r++) { /* feed-forward: each rank its ffn columns, partial down product */
                const tm_layer *L = &sh[r]->layers[l];
                ref_rmsnorm(xt, &L->ffn_norm, hp->norm_eps, dim, xb);
                ref_matvec(D[r].wg, ffn, dim, NULL, xb, g);
                ref_matvec(D[r].wu, ffn, dim, NULL, xb, u);
                for (int i = 0; i < ffn; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
                ref_matvec(D[r].wd, dim, ffn, NULL, g, tmp);
                for (int i = 0; i < dim; i++) acc[i] += tmp[i];
            }
            for (int i = 0; i < dim; i++) xt[i] += acc[i];
        }
        for (int r = 0; r < n_ranks; r++) {
            free(D[r].wq); free(D[r].wk); free(D[r].wv); free(D[r].wo); free(D[r].wg); free(D[r].wu); free(D[r].wd);
        }
    }
    double *logits = malloc(sizeof(double) * (size_t)n * hp->n_vocab);
    float *out = dense(&sh[0]->output);
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(x + (size_t)t * dim, &sh[0]->output_norm, hp->norm_eps, dim, xb);
        ref_matvec(out, hp->n_vocab, dim, NULL, xb, logits + (size_t)t * hp->n_vocab);
    }
    free(out);
    free(x); free(xb); free(q); free(att); free(tmp); free(acc); free(K); free(V); free(g); free(u); free(sc); free(D);
    return logits;
}

/* one sequence of n tokens in a fresh cache, logits for every row */
typedef struct one_seq {
    int32_t ids[N_TOK], pos[N_TOK], seq[N_TOK], qs[2], ctx[1], table[8], lidx[N_TOK];
    int64_t slots[N_TOK];
    tm_batch b;
} one_seq;

enum { BLOCK = 8 };

static void one_seq_init(one_seq *o, int vocab) {
    make_ids(o->ids, N_TOK, vocab);
    for (int i = 0; i < N_TOK; i++) {
        o->pos[i] = i;
        o->seq[i] = 0;
        o->slots[i] = i;
        o->lidx[i] = i;
    }
    for (int i = 0; i < 8; i++) o->table[i] = i;
    o->qs[0] = 0;
    o->qs[1] = N_TOK;
    o->ctx[0] = N_TOK;
    o->b = (tm_batch){.n_tokens = N_TOK, .token_ids = o->ids, .positions = o->pos, .seq_index = o->seq, .n_seqs = 1,
                      .query_start = o->qs, .context_len = o->ctx, .max_blocks = 8, .block_table = o->table,
                      .slot_mapping = o->slots, .n_logits = N_TOK, .logits_index = o->lidx};
}

static tm_backend *cpu_for(const tm_model *m) {
    tm_backend *be = NULL;
    tm_error err = {0};
    tm_cpu_cfg cfg = {.n_threads = 1, .act_bits = 16};
    if (tm_backend_cpu_create(&cfg, &be, &err) != TM_OK) fail_msg("cpu backend: %s", err.msg);
    tm_kv_cfg kv = {.n_layers = m->hp.n_layers, .n_kv_heads = m->hp.n_kv_heads, .head_dim = m->hp.head_dim,
                    .block_size = BLOCK, .n_blocks = 8, .dtype = TM_DT_F32};
    if (be->ops->kv_init(be, &kv, &err) != TM_OK) fail_msg("kv_init: %s", err.msg);
    return be;
}

/* tm_model_forward on the unsharded model: logits (N_TOK, vocab) */
static float *cpu_forward(const tm_model *m, const tm_batch *b) {
    tm_backend *be = cpu_for(m);
    tm_workspace ws;
    tm_error err = {0};
    assert_int_equal(tm_workspace_init(&ws, m, be, N_TOK, N_TOK, &err), TM_OK);
    float *lg = malloc(sizeof(float) * (size_t)N_TOK * (size_t)m->hp.n_vocab);
    if (tm_model_forward(m, be, &ws, b, lg, &err) != TM_OK) fail_msg("forward: %s", err.msg);
    tm_workspace_free(&ws, be);
    be->ops->free(be);
    return lg;
}

/* The library's tensor-parallel forward (tm_tp_forward) with one cpu backend per rank. Returns the logits
 * (N_TOK, vocab) of rank 0 and checks that every rank's residual stream stays identical. */
static float *cpu_forward_tp(tm_model *const *sh, int n_ranks, const tm_batch *b) {
    tm_backend *be[MAX_RANKS];
    tm_workspace ws[MAX_RANKS];
    tm_tp_rank ranks[MAX_RANKS];
    tm_error err = {0};
    const tm_hparams *hp = &sh[0]->hp;
    size_t nd = (size_t)b->n_tokens * (size_t)hp->dim;
    float *tmp = malloc(sizeof(float) * nd), *x0 = malloc(sizeof(float) * nd);
    for (int r = 0; r < n_ranks; r++) {
        be[r] = cpu_for(sh[r]);
        assert_int_equal(tm_workspace_init(&ws[r], sh[r], be[r], N_TOK, N_TOK, &err), TM_OK);
        ranks[r] = (tm_tp_rank){sh[r], be[r], &ws[r]};
    }
    tm_tp_host_reduce *hr = NULL;
    assert_int_equal(tm_tp_host_reduce_create(n_ranks, &hr, &err), TM_OK);
    tm_tp_group g = {n_ranks, ranks, tm_tp_allreduce_host, hr, NULL}; /* a thread per rank for the pass */
    size_t nlg = (size_t)b->n_logits * (size_t)hp->n_vocab;
    float *lg = malloc(sizeof(float) * nlg), *lg2 = malloc(sizeof(float) * nlg);
    if (tm_tp_forward(&g, b, lg, &err) != TM_OK) fail_msg("tensor-parallel forward: %s", err.msg);
    /* again on a pool of rank threads (what the runner uses): the same pass rewrites the same KV entries and gives
     * the same logits bit for bit (the host all-reduce sums in rank order) */
    assert_int_equal(tm_threadpool_create(n_ranks, &g.threads, &err), TM_OK);
    if (tm_tp_forward(&g, b, lg2, &err) != TM_OK) fail_msg("tensor-parallel forward on rank threads: %s", err.msg);
    assert_memory_equal(lg, lg2, sizeof(float) * nlg);
    tm_threadpool_free(g.threads);
    tm_tp_host_reduce_free(hr);
    free(lg2);
    /* the residual stream is replicated: bit-identical on every rank */
    be[0]->ops->to_host(be[0], ws[0].x, nd, x0);
    for (int r = 1; r < n_ranks; r++) {
        be[r]->ops->to_host(be[r], ws[r].x, nd, tmp);
        assert_memory_equal(x0, tmp, sizeof(float) * nd);
    }
    for (int r = 0; r < n_ranks; r++) {
        tm_workspace_free(&ws[r], be[r]);
        be[r]->ops->free(be[r]);
    }
    free(tmp);
    free(x0);
    return lg;
}

static void check_forward(const model_case *c, double tol) {
    tiny_opts o = case_opts(c);
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    size_t nl = (size_t)N_TOK * (size_t)m->hp.n_vocab;
    one_seq seq;
    one_seq_init(&seq, m->hp.n_vocab);
    tm_model *whole[1] = {m};
    double *ref = ref_forward_tp(whole, 1, seq.ids, N_TOK);
    float *full = cpu_forward(m, &seq.b);
    double e = ref_rel_err(full, ref, nl);
    if (e > tol) fail_msg("%s/%s unsharded forward: error %g > %g", c->arch, tm_dtype_name(c->wtype), e, tol);
    for (int n = 1; n <= c->max_ranks; n *= 2) {
        tm_model *sh[MAX_RANKS];
        for (int r = 0; r < n; r++) sh[r] = shard(m, n, r);
        /* dense: the sum of the partials equals the unsharded reference up to summation order */
        double *tp_ref = ref_forward_tp(sh, n, seq.ids, N_TOK);
        e = rel_err_dd(tp_ref, ref, nl);
        if (e > 1e-9) fail_msg("%s/%s N=%d: dense sharded reference off by %g", c->arch, tm_dtype_name(c->wtype), n, e);
        /* cpu ops per rank + in-process all-reduce vs the dense reference and vs tm_model_forward */
        float *tp = cpu_forward_tp(sh, n, &seq.b);
        e = ref_rel_err(tp, ref, nl);
        if (e > tol)
            fail_msg("%s/%s N=%d: sharded cpu forward error %g > %g", c->arch, tm_dtype_name(c->wtype), n, e, tol);
        e = rel_err_ff(tp, full, nl);
        if (e > tol)
            fail_msg("%s/%s N=%d: sharded vs unsharded cpu forward %g > %g", c->arch, tm_dtype_name(c->wtype), n, e,
                     tol);
        if (n == 1) { /* one rank is the model itself: identical bits, and tm_model_forward runs the shard */
            assert_memory_equal(tp, full, sizeof(float) * nl);
            float *self = cpu_forward(sh[0], &seq.b);
            assert_memory_equal(self, full, sizeof(float) * nl);
            free(self);
        }
        free(tp);
        free(tp_ref);
        for (int r = 0; r < n; r++) tm_tp_shard_free(sh[r]);
    }
    free(full);
    free(ref);
    tm_model_free(m);
    unlink(path);
}

static void test_sharded_forward_equals_unsharded(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        tm_dtype t = k_cases[i].wtype;
        check_forward(&k_cases[i], t == TM_DT_F32 ? 2e-5 : t == TM_DT_F16 ? 2e-4 : 1e-3);
    }
}

/* A sharded forward that forgets the all-reduce (each rank adds only its own partial) is far off: the comparison
 * above can fail. */
static void test_missing_allreduce_is_detected(void **st) {
    (void)st;
    tiny_opts o = case_opts(&k_cases[1]);
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    one_seq seq;
    one_seq_init(&seq, m->hp.n_vocab);
    tm_model *whole[1] = {m};
    double *ref = ref_forward_tp(whole, 1, seq.ids, N_TOK);
    tm_model *sh = shard(m, 2, 0);
    float *lone = cpu_forward(sh, &seq.b); /* rank 0 alone, no sum */
    double e = ref_rel_err(lone, ref, (size_t)N_TOK * (size_t)m->hp.n_vocab);
    assert_true(e > 1e-2);
    free(lone);
    free(ref);
    tm_tp_shard_free(sh);
    tm_model_free(m);
    unlink(path);
}

/* ---- plans, KV geometry, slices ---------------------------------------------------------------- */

static void test_plan_and_kv_geometry(void **st) {
    (void)st;
    tiny_opts o = case_opts(&k_cases[1]); /* 8 heads, 4 kv heads, ffn 128, head_dim 8, 2 layers */
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    tm_error err = {0};
    tm_tp_plan p;
    assert_int_equal(tm_tp_plan_make(m, 4, 3, &p, &err), TM_OK);
    assert_int_equal(p.n_q_heads, 2);
    assert_int_equal(p.q_head_begin, 6);
    assert_int_equal(p.n_kv_heads, 1);
    assert_int_equal(p.kv_head_begin, 3);
    assert_int_equal(p.ffn_dim, 32);
    assert_int_equal(p.ffn_begin, 96);
    tm_tp_slice s = tm_tp_slice_of(&p, TM_TP_WQ, &m->layers[0].wq);
    assert_int_equal(s.split, TM_TP_ROWS);
    assert_int_equal(s.begin, 48);
    assert_int_equal(s.count, 16);
    s = tm_tp_slice_of(&p, TM_TP_WK, &m->layers[0].wk);
    assert_int_equal(s.begin, 24);
    assert_int_equal(s.count, 8);
    s = tm_tp_slice_of(&p, TM_TP_WO, &m->layers[0].wo);
    assert_int_equal(s.split, TM_TP_COLS);
    assert_int_equal(s.begin, 48);
    s = tm_tp_slice_of(&p, TM_TP_W_DOWN, &m->layers[0].w_down);
    assert_int_equal(s.split, TM_TP_COLS);
    assert_int_equal(s.begin, 96);
    assert_int_equal(s.count, 32);
    s = tm_tp_slice_of(&p, TM_TP_FFN_NORM, &m->layers[0].ffn_norm);
    assert_int_equal(s.split, TM_TP_REPLICATED);
    tm_kv_cfg full = {.n_layers = 2, .n_kv_heads = 4, .head_dim = 8, .block_size = 16, .n_blocks = 100,
                      .dtype = TM_DT_F32};
    tm_kv_cfg kv = tm_tp_kv_cfg(&p, &full);
    assert_int_equal(kv.n_kv_heads, 1);
    assert_int_equal(kv.n_blocks, 100);
    assert_int_equal(kv.head_dim, 8);
    assert_int_equal(tm_tp_kv_bytes_per_token(m, &p, 2), 2 * 2 * 1 * 8 * 2);
    /* rank / degree out of range */
    assert_int_equal(tm_tp_plan_make(m, 4, 4, &p, &err), TM_ERR_INVALID);
    assert_int_equal(tm_tp_plan_make(m, 4, -1, &p, &err), TM_ERR_INVALID);
    assert_int_equal(tm_tp_plan_make(m, 0, 0, &p, &err), TM_ERR_INVALID);
    /* slice byte counts: out of range and misaligned */
    tm_weight q8 = {.data = NULL, .type = TM_DT_Q8_0, .rows = 4, .cols = 128};
    assert_int_equal(tm_tp_slice_bytes(&q8, (tm_tp_slice){TM_TP_COLS, 32, 64}), 4 * 2 * 34);
    assert_int_equal(tm_tp_slice_bytes(&q8, (tm_tp_slice){TM_TP_COLS, 16, 32}), 0);
    assert_int_equal(tm_tp_slice_bytes(&q8, (tm_tp_slice){TM_TP_COLS, 0, 48}), 0);
    assert_int_equal(tm_tp_slice_bytes(&q8, (tm_tp_slice){TM_TP_COLS, 96, 64}), 0);
    assert_int_equal(tm_tp_slice_bytes(&q8, (tm_tp_slice){TM_TP_ROWS, 3, 2}), 0);
    assert_int_equal(tm_tp_slice_bytes(&q8, (tm_tp_slice){TM_TP_ROWS, 2, 2}), 2 * 4 * 34);
    uint8_t dst[16];
    assert_int_equal(tm_tp_slice_copy(&q8, (tm_tp_slice){TM_TP_ROWS, 0, 1}, dst, sizeof dst, &err), TM_ERR_INVALID);
    tm_tp_shard_free(NULL);
    tm_model_free(m);
    unlink(path);
}

/* ---- (c) errors -------------------------------------------------------------------------------- */

static void expect_refused(const model_case *c, int n, const char *needle) {
    tiny_opts o = case_opts(c);
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    tm_error err = {0};
    tm_model *sh = (tm_model *)(uintptr_t)1;
    assert_int_equal(tm_tp_shard_model(m, n, 0, &sh, &err), TM_ERR_UNSUPPORTED);
    assert_null(sh);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
    memset(&err, 0, sizeof err);
    assert_int_equal(tm_tp_check(m, n, &err), TM_ERR_UNSUPPORTED);
    tm_model_free(m);
    unlink(path);
}

static void test_indivisible_heads_refused(void **st) {
    (void)st;
    model_case c = {"llama", TM_DT_F32, false, 64, 4, 2, 96, 1};
    expect_refused(&c, 4, "4 query heads and 2 KV heads"); /* kv heads 2 over 4 ranks */
    expect_refused(&c, 3, "4 query heads and 2 KV heads"); /* both */
    model_case f = {"llama", TM_DT_F32, false, 64, 4, 4, 98, 1};
    expect_refused(&f, 4, "feed-forward width divisible by 4: it is 98");
}

static void test_misaligned_quantized_columns_refused(void **st) {
    (void)st;
    /* q8_0, head_dim 8: wo slice at N=4 is 2 heads x 8 = 16 columns, half a block */
    model_case wo = {"llama", TM_DT_Q8_0, false, 64, 8, 4, 128, 1};
    expect_refused(&wo, 4, "wo (2 heads x 8 per rank) is q8_0 (blocks of 32 elements)");
    /* q8_0: ffn 96 over 2 ranks is 48 columns of w_down */
    model_case down = {"llama", TM_DT_Q8_0, false, 64, 4, 2, 96, 1};
    expect_refused(&down, 2, "w_down is q8_0 (blocks of 32 elements); its column slice per rank, 48");
    /* q4_K: a 256-element block; head_dim 64 x 2 heads = 128 */
    model_case k = {"llama", TM_DT_Q4_K, false, 256, 4, 2, 512, 1};
    expect_refused(&k, 2, "is q4_K (blocks of 256 elements)");
    /* the same shape splits at N=2 once the blocks fit (q8_0) */
    model_case ok = {"llama", TM_DT_Q8_0, false, 256, 4, 2, 512, 1};
    tiny_opts o = case_opts(&ok);
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    tm_error err = {0};
    assert_int_equal(tm_tp_check(m, 2, &err), TM_OK);
    tm_model_free(m);
    unlink(path);
}

/* ---- bootstrap: the id over TCP ---------------------------------------------------------------- */

enum { ID_BYTES = 128 };

typedef struct serve_arg {
    tm_tp_listener *l;
    int32_t n_ranks;
    const uint8_t *id;
    int timeout_ms;
    tm_status s;
    tm_error err;
} serve_arg;

static void *serve_main(void *p) {
    serve_arg *a = p;
    a->s = tm_tp_serve_id(a->l, a->n_ranks, a->id, ID_BYTES, a->timeout_ms, &a->err);
    return NULL;
}

typedef struct fetch_arg {
    int port;
    int32_t n_ranks, rank;
    uint8_t id[ID_BYTES];
    tm_status s;
    tm_error err;
} fetch_arg;

static void *fetch_main(void *p) {
    fetch_arg *a = p;
    a->s = tm_tp_fetch_id("127.0.0.1", a->port, a->n_ranks, a->rank, a->id, ID_BYTES, 5000, &a->err);
    return NULL;
}

static void test_bootstrap_id_over_tcp(void **st) {
    (void)st;
    uint8_t id[ID_BYTES];
    for (int i = 0; i < ID_BYTES; i++) id[i] = (uint8_t)(i * 37 + 11);
    tm_error err = {0};
    tm_tp_listener l;
    assert_int_equal(tm_tp_listen("127.0.0.1", 0, &l, &err), TM_OK);
    assert_true(l.port > 0);
    /* rank 0 serves ranks 1..3, which connect in any order */
    serve_arg sa = {&l, 4, id, 5000, TM_OK, {0}};
    fetch_arg fa[3];
    pthread_t ts, tf[3];
    assert_int_equal(pthread_create(&ts, NULL, serve_main, &sa), 0);
    for (int i = 0; i < 3; i++) {
        fa[i] = (fetch_arg){.port = l.port, .n_ranks = 4, .rank = 3 - i};
        memset(fa[i].id, 0, ID_BYTES);
        assert_int_equal(pthread_create(&tf[i], NULL, fetch_main, &fa[i]), 0);
    }
    pthread_join(ts, NULL);
    for (int i = 0; i < 3; i++) pthread_join(tf[i], NULL);
    if (sa.s != TM_OK) fail_msg("serve: %s", sa.err.msg);
    for (int i = 0; i < 3; i++) {
        if (fa[i].s != TM_OK) fail_msg("fetch rank %d: %s", fa[i].rank, fa[i].err.msg);
        assert_memory_equal(fa[i].id, id, ID_BYTES);
    }
    /* a rank configured with another degree is refused by rank 0 (and learns it: the connection closes) */
    serve_arg sb = {&l, 2, id, 5000, TM_OK, {0}};
    assert_int_equal(pthread_create(&ts, NULL, serve_main, &sb), 0);
    fetch_arg bad = {.port = l.port, .n_ranks = 3, .rank = 1};
    fetch_main(&bad);
    pthread_join(ts, NULL);
    assert_int_equal(sb.s, TM_ERR_INVALID);
    if (!strstr(sb.err.msg, "rank 1 runs with 3 ranks, rank 0 with 2")) fail_msg("%s", sb.err.msg);
    assert_int_equal(bad.s, TM_ERR_IO);
    /* nobody comes: a deadline, not a hang */
    assert_int_equal(tm_tp_serve_id(&l, 3, id, ID_BYTES, 100, &err), TM_ERR_IO);
    if (!strstr(err.msg, "1 of 3 ranks connected")) fail_msg("%s", err.msg);
    int port = l.port;
    tm_tp_listener_close(&l);
    tm_tp_listener_close(&l); /* idempotent */
    /* rank 0 is not there */
    uint8_t got[ID_BYTES];
    assert_int_equal(tm_tp_fetch_id("127.0.0.1", port, 2, 1, got, ID_BYTES, 150, &err), TM_ERR_IO);
    /* bad arguments */
    assert_int_equal(tm_tp_fetch_id("127.0.0.1", port, 2, 2, got, ID_BYTES, 150, &err), TM_ERR_INVALID);
    assert_int_equal(tm_tp_fetch_id("127.0.0.1", port, 2, 0, got, ID_BYTES, 150, &err), TM_ERR_INVALID);
    assert_int_equal(tm_tp_serve_id(&l, 2, id, ID_BYTES, 100, &err), TM_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_reassemble),
        cmocka_unit_test(test_sharded_forward_equals_unsharded),
        cmocka_unit_test(test_missing_allreduce_is_detected),
        cmocka_unit_test(test_plan_and_kv_geometry),
        cmocka_unit_test(test_indivisible_heads_refused),
        cmocka_unit_test(test_misaligned_quantized_columns_refused),
        cmocka_unit_test(test_bootstrap_id_over_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
