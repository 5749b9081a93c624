/* tm_forward.c -- the Llama-family forward pass over a ragged batch, as a straight sequence of backend ops. */
#include "tm_model.h"
#include "model/tm_tp_forward.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

tm_status tm_workspace_init(tm_workspace *ws, const tm_model *m, tm_backend *be, int32_t max_tokens, int32_t max_logits,
                            tm_error *err) {
    memset(ws, 0, sizeof *ws);
    if (max_tokens < 1) return tm_err(err, TM_ERR_INVALID, "workspace needs at least one token");
    if (max_logits < 1 || max_logits > max_tokens) max_logits = max_tokens;
    const tm_hparams *hp = &m->hp;
    size_t T = (size_t)max_tokens, qd = (size_t)hp->n_heads * (size_t)hp->head_dim,
           kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    ws->max_tokens = max_tokens;
    ws->max_logits = max_logits;
    ws->x = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->xb = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->q = be->ops->alloc(be, T * qd);
    ws->k = be->ops->alloc(be, T * kvd);
    ws->v = be->ops->alloc(be, T * kvd);
    ws->att = be->ops->alloc(be, T * qd);
    ws->proj = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->hb = be->ops->alloc(be, T * (size_t)hp->ffn_dim);
    ws->hb2 = be->ops->alloc(be, T * (size_t)hp->ffn_dim);
    ws->hsel = be->ops->alloc(be, (size_t)max_logits * (size_t)hp->dim);
    ws->logits = be->ops->alloc(be, (size_t)max_logits * (size_t)hp->n_vocab);
    if (!ws->x || !ws->xb || !ws->q || !ws->k || !ws->v || !ws->att || !ws->proj || !ws->hb || !ws->hb2 || !ws->hsel ||
        !ws->logits) {
        tm_workspace_free(ws, be);
        return tm_err(err, TM_ERR_NOMEM, "cannot allocate the activation workspace for %d tokens", max_tokens);
    }
    return TM_OK;
}

void tm_workspace_free(tm_workspace *ws, tm_backend *be) {
    void *bufs[] = {ws->x, ws->xb, ws->q, ws->k, ws->v, ws->att, ws->proj, ws->hb, ws->hb2, ws->hsel, ws->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->release(be, bufs[i]);
    memset(ws, 0, sizeof *ws);
}

static const tm_weight *opt(const tm_weight *w) { return w->data ? w : NULL; }

/* One forward pass, shared by the ranks of a group (one rank: the whole model). */
typedef struct tp_pass {
    const tm_tp_group *g;
    const tm_batch *b;
    float *logits_out;
    pthread_barrier_t agree;                /* (n_ranks > 1) after begin_step */
    tm_status st[TM_TP_MAX_RANKS];          /* each rank's begin_step, then its pass */
    tm_error err[TM_TP_MAX_RANKS];
    tm_step_plan plan[TM_TP_MAX_RANKS];
} tp_pass;

/* Rank r's forward pass. With several ranks the attention and MLP outputs are summed across them (g->allreduce)
 * before each residual add, so the matmul+add+RMSNorm fusion is for one rank only. Logits come from rank 0. */
static tm_status forward_rank(tp_pass *p, int32_t r, tm_error *err) {
    const tm_tp_group *g = p->g;
    const tm_batch *b = p->b;
    const int32_t R = g->n_ranks;
    const tm_model *m = g->ranks[r].model;
    tm_backend *be = g->ranks[r].be;
    const tm_backend_ops *op = be->ops;
    tm_workspace *ws = g->ranks[r].ws;
    const tm_hparams *hp = &m->hp;
    const tm_attn_cfg acfg = tm_model_attn_cfg(m);
    const bool fuse_norm = R == 1; /* a reduction must come between the product and the residual add */
    bool first = true, rerun = false;
    tm_status s;
again:;
    tm_step_plan plan = {.n_tokens = b->n_tokens, .n_logits = b->n_logits, .replayed = false};
    s = op->begin_step ? op->begin_step(be, b, &plan, err) : TM_OK;
    if (first && R > 1) { /* every rank runs the step, or none does: a rank that stopped would leave the others'
                           * collectives waiting for it */
        p->st[r] = s;
        p->plan[r] = plan;
        pthread_barrier_wait(&p->agree);
        for (int32_t q = 0; q < R && s == TM_OK; q++) {
            if (p->st[q] != TM_OK) s = tm_err(err, p->st[q], "tensor-parallel rank %d: %s", q, p->err[q].msg);
            else if (p->plan[q].n_tokens != plan.n_tokens || p->plan[q].n_logits != plan.n_logits)
                s = tm_err(err, TM_ERR_INTERNAL, "tensor-parallel ranks 0 and %d planned different steps", q);
        }
    }
    first = false;
    if (s != TM_OK) return s;
    if (plan.replayed) goto done;
    const int32_t n = plan.n_tokens;

    /* x = embed(ids); xb = norm(x) for the next layer (or the output) */
    bool have_xb = hp->n_layers > 0 && op->embed_rmsnorm &&
                   op->embed_rmsnorm(be, &m->tok_embd, b->token_ids, n, ws->x, &m->layers[0].attn_norm, hp->norm_eps,
                                     ws->xb, &m->layers[0].wq);
    if (!have_xb) op->embed(be, &m->tok_embd, b->token_ids, n, ws->x);
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        const tm_layer_weights lw = {&L->attn_norm, &L->wq, &L->wk, &L->wv, opt(&L->bq), opt(&L->bk), opt(&L->bv),
                                     &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        if (R == 1 && op->decoder_layer &&
            op->decoder_layer(be, &lw, &acfg, hp->norm_eps, l, b, ws->x, n, ws->q, ws->att, ws->hb)) {
            have_xb = false; /* the whole layer ran as one unit: x updated, xb not made */
            continue;
        }
        if (!have_xb) op->rmsnorm(be, ws->x, &L->attn_norm, hp->norm_eps, n, ws->xb); /* xb = norm(x) */
        /* attention block: q, k, v = xb · wqᵀ, wkᵀ, wvᵀ (+ biases), RoPE, KV write; att; proj = att · woᵀ */
        tm_matmul_job qkv[3] = {{&L->wq, opt(&L->bq), ws->q, false}, {&L->wk, opt(&L->bk), ws->k, false},
                                {&L->wv, opt(&L->bv), ws->v, false}};
        if (!op->matmul_qkv_rope || !op->matmul_qkv_rope(be, qkv, ws->xb, n, &acfg, l, b, ws->q, ws->k, ws->v)) {
            op->matmul(be, qkv, 3, ws->xb, n);
            op->rope_kv_write(be, &acfg, l, b, ws->q, ws->k, ws->v);
        }
        op->attention(be, &acfg, l, b, ws->q, ws->att);
        tm_matmul_job o = {&L->wo, NULL, ws->proj, false};
        bool fused = fuse_norm && op->matmul_add_rmsnorm &&
                     op->matmul_add_rmsnorm(be, &o, ws->att, n, ws->x, &L->ffn_norm, hp->norm_eps, ws->xb);
        if (!fused) {
            op->matmul(be, &o, 1, ws->att, n);
            if (R > 1) g->allreduce(g->user, r, ws->proj, (size_t)n * (size_t)hp->dim); /* sum of the partials */
            op->add_rmsnorm(be, ws->x, ws->proj, &L->ffn_norm, hp->norm_eps, n, ws->xb); /* x += attn; xb = norm */
        }
        /* feed-forward block: hb = silu(xb · gateᵀ) * (xb · upᵀ); proj = hb · downᵀ */
        if (op->matmul_swiglu) {
            op->matmul_swiglu(be, &L->w_gate, &L->w_up, ws->xb, n, ws->hb);
        } else {
            tm_matmul_job gu[2] = {{&L->w_gate, NULL, ws->hb, false}, {&L->w_up, NULL, ws->hb2, false}};
            op->matmul(be, gu, 2, ws->xb, n);
            op->swiglu(be, ws->hb, ws->hb2, n, hp->ffn_dim, ws->hb);
        }
        tm_matmul_job down = {&L->w_down, NULL, ws->proj, false};
        const tm_weight *next_norm = l + 1 < hp->n_layers ? &m->layers[l + 1].attn_norm : &m->output_norm;
        fused = fuse_norm && op->matmul_add_rmsnorm &&
                op->matmul_add_rmsnorm(be, &down, ws->hb, n, ws->x, next_norm, hp->norm_eps, ws->xb);
        if (!fused) {
            op->matmul(be, &down, 1, ws->hb, n);
            if (R > 1) g->allreduce(g->user, r, ws->proj, (size_t)n * (size_t)hp->dim);
            op->add_rmsnorm(be, ws->x, ws->proj, next_norm, hp->norm_eps, n, ws->xb); /* x += ffn; xb = norm */
        }
        have_xb = true;
    }
    if (!have_xb) op->rmsnorm(be, ws->x, &m->output_norm, hp->norm_eps, n, ws->xb); /* the last layer ran whole */
    /* the output projection is replicated: rank 0 computes the logits */
    if (r == 0 && plan.n_logits > 0) {
        const void *h = ws->xb; /* every row wants its logits, in order (a decode step): xb's rows are the ones */
        if (plan.n_logits != plan.n_tokens || !tm_batch_logits_all(b)) {
            op->get_rows(be, ws->xb, b->logits_index, plan.n_logits, hp->dim, ws->hsel);
            h = ws->hsel;
        }
        tm_matmul_job head = {&m->output, NULL, ws->logits, true};
        op->matmul(be, &head, 1, h, plan.n_logits);
    }
    if (op->end_step && (s = op->end_step(be, &rerun, err)) != TM_OK) return s;
    if (rerun) goto again; /* this rank's graph capture failed: run the pass eagerly (its collectives pair with
                            * the ones in the other ranks' graphs) */
done:
    if (op->last_error && (s = op->last_error(be, err)) != TM_OK) return s;
    if (r != 0 || b->n_logits == 0 || !p->logits_out) return TM_OK; /* NULL: the logits stay in ws->logits */
    op->to_host(be, ws->logits, (size_t)b->n_logits * (size_t)hp->n_vocab, p->logits_out);
    if (op->last_error && (s = op->last_error(be, err)) != TM_OK) return s;
    return TM_OK;
}

static void rank_task(void *arg, int ith, int nth) {
    (void)nth;
    tp_pass *p = arg;
    p->st[ith] = forward_rank(p, ith, &p->err[ith]);
}

static void *rank_thread(void *arg) {
    void **a = arg;
    rank_task(a[0], (int)(intptr_t)a[1], 0);
    return NULL;
}

static tm_status forward_group(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err) {
    const int32_t R = g->n_ranks;
    if (R < 1 || R > TM_TP_MAX_RANKS || (R > 1 && !g->allreduce) ||
        (R > 1 && g->threads && tm_threadpool_size(g->threads) != R))
        return tm_err(err, TM_ERR_INVALID, "tensor-parallel group of %d ranks", R);
    const tm_hparams *hp = &g->ranks[0].model->hp;
    int32_t n = b->n_tokens;
    if (n < 1 || n > g->ranks[0].ws->max_tokens)
        return tm_err(err, TM_ERR_RANGE, "batch of %d tokens outside 1..%d", n, g->ranks[0].ws->max_tokens);
    if (b->n_logits < 0 || b->n_logits > n || b->n_logits > g->ranks[0].ws->max_logits)
        return tm_err(err, TM_ERR_RANGE, "bad logits count %d (workspace: %d)", b->n_logits, g->ranks[0].ws->max_logits);
    for (int32_t i = 0; i < n; i++)
        if (b->token_ids[i] < 0 || b->token_ids[i] >= hp->n_vocab)
            return tm_err(err, TM_ERR_RANGE, "token id %d outside the vocabulary (%d)", b->token_ids[i], hp->n_vocab);
    if (R == 1) {
        tp_pass p = {.g = g, .b = b, .logits_out = logits_out};
        return forward_rank(&p, 0, err);
    }
    tp_pass *p = tm_calloc(1, sizeof *p);
    if (!p) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    *p = (tp_pass){.g = g, .b = b, .logits_out = logits_out};
    if (pthread_barrier_init(&p->agree, NULL, (unsigned)R) != 0) {
        free(p);
        return tm_err(err, TM_ERR_IO, "cannot create a barrier for %d ranks", R);
    }
    tm_status s = TM_OK;
    if (g->threads) {
        tm_threadpool_run_each(g->threads, rank_task, p);
    } else { /* no rank threads given: one per rank for this pass */
        pthread_t th[TM_TP_MAX_RANKS];
        void *args[TM_TP_MAX_RANKS][2];
        int32_t started = 1;
        for (; started < R; started++) {
            args[started][0] = p;
            args[started][1] = (void *)(intptr_t)started;
            if (pthread_create(&th[started], NULL, rank_thread, args[started]) != 0) break;
        }
        if (started == R) rank_task(p, 0, R);
        else s = tm_err(err, TM_ERR_IO, "cannot start the thread of tensor-parallel rank %d", started);
        /* a rank thread that started waits at the barrier for ranks that never came: not reachable unless
         * pthread_create fails midway, which leaves the process without threads to finish the pass anyway */
        for (int32_t q = 1; q < started; q++) pthread_join(th[q], NULL);
    }
    for (int32_t q = 0; q < R && s == TM_OK; q++)
        if (p->st[q] != TM_OK) s = tm_err(err, p->st[q], "%s", p->err[q].msg);
    pthread_barrier_destroy(&p->agree);
    free(p);
    return s;
}

tm_status tm_model_forward(const tm_model *m, tm_backend *be, tm_workspace *ws, const tm_batch *b, float *logits_out,
                           tm_error *err) {
    tm_tp_rank one = {m, be, ws};
    tm_tp_group g = {1, &one, NULL, NULL, NULL};
    return forward_group(&g, b, logits_out, err);
}

tm_status tm_tp_forward(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err) {
    return forward_group(g, b, logits_out, err);
}

/* ---- the all-reduce of host f32 activations among rank threads ---------------------------------------- */

struct tm_tp_host_reduce {
    int32_t n_ranks;
    pthread_barrier_t bar;
    float *bufs[TM_TP_MAX_RANKS]; /* (n_ranks) posted by each rank before the first barrier */
};

tm_status tm_tp_host_reduce_create(int32_t n_ranks, tm_tp_host_reduce **out, tm_error *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > TM_TP_MAX_RANKS) return tm_err(err, TM_ERR_RANGE, "all-reduce over %d ranks", n_ranks);
    tm_tp_host_reduce *h = tm_calloc(1, sizeof *h);
    if (!h) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    h->n_ranks = n_ranks;
    if (pthread_barrier_init(&h->bar, NULL, (unsigned)n_ranks) != 0) {
        free(h);
        return tm_err(err, TM_ERR_IO, "cannot create a barrier for %d ranks", n_ranks);
    }
    *out = h;
    return TM_OK;
}

void tm_tp_host_reduce_free(tm_tp_host_reduce *h) {
    if (!h) return;
    pthread_barrier_destroy(&h->bar);
    free(h);
}

void tm_tp_allreduce_host(void *user, int32_t rank, void *buf, size_t n_elems) {
    tm_tp_host_reduce *h = user;
    const int32_t R = h->n_ranks;
    h->bufs[rank] = buf;
    pthread_barrier_wait(&h->bar); /* every rank's partial is ready */
    int64_t lo, hi;
    tm_split_range((int64_t)n_elems, rank, R, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) { /* in rank order: the same sum on every rank and in every run */
        float acc = h->bufs[0][i];
        for (int32_t q = 1; q < R; q++) acc += h->bufs[q][i];
        for (int32_t q = 0; q < R; q++) h->bufs[q][i] = acc;
    }
    pthread_barrier_wait(&h->bar); /* every slice is summed before any rank reads its buffer */
}
