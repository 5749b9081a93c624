/* tm_forward.c -- the Llama-family forward pass over a ragged batch, as a straight sequence of backend ops. */
#include "tm_model.h"

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

tm_status tm_model_forward(const tm_model *m, tm_backend *be, tm_workspace *ws, const tm_batch *b, float *logits_out,
                           tm_error *err) {
    const tm_hparams *hp = &m->hp;
    const tm_backend_ops *op = be->ops;
    int32_t n = b->n_tokens;
    if (n < 1 || n > ws->max_tokens)
        return tm_err(err, TM_ERR_RANGE, "batch of %d tokens outside 1..%d", n, ws->max_tokens);
    if (b->n_logits < 0 || b->n_logits > n || b->n_logits > ws->max_logits)
        return tm_err(err, TM_ERR_RANGE, "bad logits count %d (workspace: %d)", b->n_logits, ws->max_logits);
    for (int32_t i = 0; i < n; i++)
        if (b->token_ids[i] < 0 || b->token_ids[i] >= hp->n_vocab)
            return tm_err(err, TM_ERR_RANGE, "token id %d outside the vocabulary (%d)", b->token_ids[i], hp->n_vocab);
    tm_attn_cfg acfg = tm_model_attn_cfg(m);
    tm_step_plan plan = {.n_tokens = n, .n_logits = b->n_logits, .replayed = false};
    tm_status s;
    bool rerun = false;
again:
    if (op->begin_step && (s = op->begin_step(be, b, &plan, err)) != TM_OK) return s;
    if (plan.replayed) goto logits;
    n = plan.n_tokens;

    op->embed(be, &m->tok_embd, b->token_ids, n, ws->x);                             /* x = embed(ids) */
    op->rmsnorm(be, ws->x, &m->layers[0].attn_norm, hp->norm_eps, n, ws->xb);        /* xb = norm(x) */
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        /* attention block */
        tm_matmul_job qkv[3] = {{&L->wq, opt(&L->bq), ws->q, false}, {&L->wk, opt(&L->bk), ws->k, false},
                                {&L->wv, opt(&L->bv), ws->v, false}};
        if (!op->matmul_qkv_rope || !op->matmul_qkv_rope(be, qkv, ws->xb, n, &acfg, l, b, ws->q, ws->k, ws->v)) {
            op->matmul(be, qkv, 3, ws->xb, n);
            op->rope_kv_write(be, &acfg, l, b, ws->q, ws->k, ws->v);
        }
        op->attention(be, &acfg, l, b, ws->q, ws->att);
        tm_matmul_job o = {&L->wo, NULL, ws->proj, false};
        if (!op->matmul_add_rmsnorm ||
            !op->matmul_add_rmsnorm(be, &o, ws->att, n, ws->x, &L->ffn_norm, hp->norm_eps, ws->xb)) {
            op->matmul(be, &o, 1, ws->att, n);
            op->add_rmsnorm(be, ws->x, ws->proj, &L->ffn_norm, hp->norm_eps, n, ws->xb); /* x += attn; xb = norm(x) */
        }
        /* feed-forward block: hb = silu(xb · gateᵀ) * (xb · upᵀ) */
        if (op->matmul_swiglu) {
            op->matmul_swiglu(be, &L->w_gate, &L->w_up, ws->xb, n, ws->hb);
        } else {
            tm_matmul_job gu[2] = {{&L->w_gate, NULL, ws->hb, false}, {&L->w_up, NULL, ws->hb2, false}};
            op->matmul(be, gu, 2, ws->xb, n);
            op->swiglu(be, ws->hb, ws->hb2, n, hp->ffn_dim, ws->hb);
        }
        tm_matmul_job down = {&L->w_down, NULL, ws->proj, false};
        const tm_weight *next_norm = l + 1 < hp->n_layers ? &m->layers[l + 1].attn_norm : &m->output_norm;
        if (!op->matmul_add_rmsnorm ||
            !op->matmul_add_rmsnorm(be, &down, ws->hb, n, ws->x, next_norm, hp->norm_eps, ws->xb)) {
            op->matmul(be, &down, 1, ws->hb, n);
            op->add_rmsnorm(be, ws->x, ws->proj, next_norm, hp->norm_eps, n, ws->xb); /* x += ffn; xb = norm(x) */
        }
    }
    if (plan.n_logits > 0) {
        op->get_rows(be, ws->xb, b->logits_index, plan.n_logits, hp->dim, ws->hsel);
        tm_matmul_job head = {&m->output, NULL, ws->logits, true};
        op->matmul(be, &head, 1, ws->hsel, plan.n_logits);
    }
    if (op->end_step && (s = op->end_step(be, &rerun, err)) != TM_OK) return s;
    if (rerun) {
        n = b->n_tokens;
        goto again;
    }
logits:
    if (op->last_error && (s = op->last_error(be, err)) != TM_OK) return s;
    if (b->n_logits == 0 || !logits_out) return TM_OK; /* NULL: the logits stay in ws->logits */
    op->to_host(be, ws->logits, (size_t)b->n_logits * (size_t)hp->n_vocab, logits_out);
    if (op->last_error && (s = op->last_error(be, err)) != TM_OK) return s;
    return TM_OK;
}
