/* tm_forward.c -- the Llama-family forward pass over a ragged batch, as a straight sequence of backend ops. */
#include "tm_model.h"
#include "model/tm_tp_forward.h"

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

/* The forward pass on every rank of a group (one rank: the whole model). Each op runs on rank after rank; with
 * several ranks the attention and MLP outputs are summed across them (g->allreduce) before each residual add, so
 * the add+RMSNorm fusion, graphs and padding are used with one rank only. Logits come from rank 0. */
static tm_status forward_ranks(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err) {
    const int32_t R = g->n_ranks;
    if (R < 1 || R > TM_TP_MAX_RANKS || (R > 1 && !g->allreduce))
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
    tm_attn_cfg acfg[TM_TP_MAX_RANKS];
    void *proj[TM_TP_MAX_RANKS];
    for (int32_t r = 0; r < R; r++) {
        acfg[r] = tm_model_attn_cfg(g->ranks[r].model);
        proj[r] = g->ranks[r].ws->proj;
    }
    const bool fuse_norm = R == 1; /* a reduction must come between the product and the residual add */
    tm_backend *be = g->ranks[0].be; /* rank 0: logits */
    const tm_backend_ops *op = be->ops;
    tm_workspace *ws = g->ranks[0].ws;
    const tm_model *m = g->ranks[0].model;
    tm_step_plan plan = {.n_tokens = n, .n_logits = b->n_logits, .replayed = false};
    tm_status s;
    bool rerun = false;
#define EACH for (int32_t r = 0; r < R; r++)
#define OP g->ranks[r].be->ops
#define BE g->ranks[r].be
#define WS g->ranks[r].ws
#define M g->ranks[r].model
again:
    EACH if (OP->begin_step) {
        if ((s = OP->begin_step(BE, b, &plan, err)) != TM_OK) return s;
        if (R > 1 && (plan.replayed || plan.n_tokens != b->n_tokens || plan.n_logits != b->n_logits))
            return tm_err(err, TM_ERR_INTERNAL, "tensor-parallel rank %d planned a graph; its backend needs graphs off", r);
    }
    if (plan.replayed) goto logits;
    n = plan.n_tokens;

    EACH OP->embed(BE, &M->tok_embd, b->token_ids, n, WS->x);                      /* x = embed(ids) */
    EACH OP->rmsnorm(BE, WS->x, &M->layers[0].attn_norm, hp->norm_eps, n, WS->xb); /* xb = norm(x) */
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const tm_weight *next_norm[TM_TP_MAX_RANKS];
        bool fused = false;
        /* attention block */
        EACH {
            const tm_layer *L = &M->layers[l];
            tm_matmul_job qkv[3] = {{&L->wq, opt(&L->bq), WS->q, false}, {&L->wk, opt(&L->bk), WS->k, false},
                                    {&L->wv, opt(&L->bv), WS->v, false}};
            if (!OP->matmul_qkv_rope || !OP->matmul_qkv_rope(BE, qkv, WS->xb, n, &acfg[r], l, b, WS->q, WS->k, WS->v)) {
                OP->matmul(BE, qkv, 3, WS->xb, n);
                OP->rope_kv_write(BE, &acfg[r], l, b, WS->q, WS->k, WS->v);
            }
            OP->attention(BE, &acfg[r], l, b, WS->q, WS->att);
            tm_matmul_job o = {&L->wo, NULL, WS->proj, false};
            fused = fuse_norm && OP->matmul_add_rmsnorm &&
                    OP->matmul_add_rmsnorm(BE, &o, WS->att, n, WS->x, &L->ffn_norm, hp->norm_eps, WS->xb);
            if (!fused) OP->matmul(BE, &o, 1, WS->att, n);
        }
        if (R > 1) g->allreduce(g->user, proj, R, (size_t)n * (size_t)hp->dim); /* sum of the ranks' partial products */
        if (!fused) EACH OP->add_rmsnorm(BE, WS->x, WS->proj, &M->layers[l].ffn_norm, hp->norm_eps, n, WS->xb);
        /* feed-forward block: hb = silu(xb · gateᵀ) * (xb · upᵀ) */
        EACH {
            const tm_layer *L = &M->layers[l];
            if (OP->matmul_swiglu) {
                OP->matmul_swiglu(BE, &L->w_gate, &L->w_up, WS->xb, n, WS->hb);
            } else {
                tm_matmul_job gu[2] = {{&L->w_gate, NULL, WS->hb, false}, {&L->w_up, NULL, WS->hb2, false}};
                OP->matmul(BE, gu, 2, WS->xb, n);
                OP->swiglu(BE, WS->hb, WS->hb2, n, M->hp.ffn_dim, WS->hb);
            }
            tm_matmul_job down = {&L->w_down, NULL, WS->proj, false};
            next_norm[r] = l + 1 < hp->n_layers ? &M->layers[l + 1].attn_norm : &M->output_norm;
            fused = fuse_norm && OP->matmul_add_rmsnorm &&
                    OP->matmul_add_rmsnorm(BE, &down, WS->hb, n, WS->x, next_norm[r], hp->norm_eps, WS->xb);
            if (!fused) OP->matmul(BE, &down, 1, WS->hb, n);
        }
        if (R > 1) g->allreduce(g->user, proj, R, (size_t)n * (size_t)hp->dim);
        if (!fused) EACH OP->add_rmsnorm(BE, WS->x, WS->proj, next_norm[r], hp->norm_eps, n, WS->xb); /* x += ffn */
    }
#undef EACH
#undef OP
#undef BE
#undef WS
#undef M
    /* the output projection is replicated: rank 0 computes the logits */
    if (plan.n_logits > 0) {
        op->get_rows(be, ws->xb, b->logits_index, plan.n_logits, hp->dim, ws->hsel);
        tm_matmul_job head = {&m->output, NULL, ws->logits, true};
        op->matmul(be, &head, 1, ws->hsel, plan.n_logits);
    }
    for (int32_t r = 0; r < R; r++) {
        const tm_backend_ops *ro = g->ranks[r].be->ops;
        if (ro->end_step && (s = ro->end_step(g->ranks[r].be, &rerun, err)) != TM_OK) return s;
    }
    if (rerun && R == 1) {
        n = b->n_tokens;
        plan = (tm_step_plan){.n_tokens = n, .n_logits = b->n_logits, .replayed = false};
        goto again;
    }
logits:
    for (int32_t r = 0; r < R; r++) {
        const tm_backend_ops *ro = g->ranks[r].be->ops;
        if (ro->last_error && (s = ro->last_error(g->ranks[r].be, err)) != TM_OK) return s;
    }
    if (b->n_logits == 0 || !logits_out) return TM_OK; /* NULL: the logits stay in rank 0's ws->logits */
    op->to_host(be, ws->logits, (size_t)b->n_logits * (size_t)hp->n_vocab, logits_out);
    if (op->last_error && (s = op->last_error(be, err)) != TM_OK) return s;
    return TM_OK;
}

tm_status tm_model_forward(const tm_model *m, tm_backend *be, tm_workspace *ws, const tm_batch *b, float *logits_out,
                           tm_error *err) {
    tm_tp_rank one = {m, be, ws};
    tm_tp_group g = {1, &one, NULL, NULL};
    return forward_ranks(&g, b, logits_out, err);
}

tm_status tm_tp_forward(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err) {
    return forward_ranks(g, b, logits_out, err);
}

void tm_tp_allreduce_host(void *user, void *const *bufs, int32_t n_ranks, size_t n_elems) {
    (void)user;
    float *acc = bufs[0];
    for (int32_t r = 1; r < n_ranks; r++) {
        const float *x = bufs[r];
        for (size_t i = 0; i < n_elems; i++) acc[i] += x[i];
    }
    for (int32_t r = 1; r < n_ranks; r++) memcpy(bufs[r], acc, n_elems * sizeof(float));
}
