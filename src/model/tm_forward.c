/* tm_forward.c -- the Llama-family forward pass over a ragged batch, as a straight sequence of backend ops. */
#include "tm_model.h"

#include <stdlib.h>

tm_status tm_workspace_init(tm_workspace *ws, const tm_model *m, tm_backend *be, int32_t max_tokens, tm_error *err) {
    memset(ws, 0, sizeof *ws);
    if (max_tokens < 1) return tm_err(err, TM_ERR_INVALID, "workspace needs at least one token");
    const tm_hparams *hp = &m->hp;
    size_t T = (size_t)max_tokens, qd = (size_t)hp->n_heads * (size_t)hp->head_dim,
           kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    ws->max_tokens = max_tokens;
    ws->x = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->xb = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->q = be->ops->alloc(be, T * qd);
    ws->k = be->ops->alloc(be, T * kvd);
    ws->v = be->ops->alloc(be, T * kvd);
    ws->att = be->ops->alloc(be, T * qd);
    ws->proj = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->hb = be->ops->alloc(be, T * (size_t)hp->ffn_dim);
    ws->hb2 = be->ops->alloc(be, T * (size_t)hp->ffn_dim);
    ws->hsel = be->ops->alloc(be, T * (size_t)hp->dim);
    ws->logits = be->ops->alloc(be, T * (size_t)hp->n_vocab);
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
    if (b->n_logits < 0 || b->n_logits > n) return tm_err(err, TM_ERR_RANGE, "bad logits count %d", b->n_logits);
    for (int32_t i = 0; i < n; i++)
        if (b->token_ids[i] < 0 || b->token_ids[i] >= hp->n_vocab)
            return tm_err(err, TM_ERR_RANGE, "token id %d outside the vocabulary (%d)", b->token_ids[i], hp->n_vocab);
    tm_attn_cfg acfg = tm_model_attn_cfg(m);

    op->embed(be, &m->tok_embd, b->token_ids, n, ws->x);                             /* x = embed(ids) */
    op->rmsnorm(be, ws->x, &m->layers[0].attn_norm, hp->norm_eps, n, ws->xb);        /* xb = norm(x) */
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        /* attention block */
        tm_matmul_job qkv[3] = {{&L->wq, opt(&L->bq), ws->q}, {&L->wk, opt(&L->bk), ws->k}, {&L->wv, opt(&L->bv), ws->v}};
        op->matmul(be, qkv, 3, ws->xb, n);
        op->rope_kv_write(be, &acfg, l, b, ws->q, ws->k, ws->v);
        op->attention(be, &acfg, l, b, ws->q, ws->att);
        tm_matmul_job o = {&L->wo, NULL, ws->proj};
        op->matmul(be, &o, 1, ws->att, n);
        op->add_rmsnorm(be, ws->x, ws->proj, &L->ffn_norm, hp->norm_eps, n, ws->xb);  /* x += attn; xb = norm(x) */
        /* feed-forward block */
        tm_matmul_job gu[2] = {{&L->w_gate, NULL, ws->hb}, {&L->w_up, NULL, ws->hb2}};
        op->matmul(be, gu, 2, ws->xb, n);
        op->swiglu(be, ws->hb, ws->hb2, n, hp->ffn_dim, ws->hb);
        tm_matmul_job down = {&L->w_down, NULL, ws->proj};
        op->matmul(be, &down, 1, ws->hb, n);
        const tm_weight *next_norm = l + 1 < hp->n_layers ? &m->layers[l + 1].attn_norm : &m->output_norm;
        op->add_rmsnorm(be, ws->x, ws->proj, next_norm, hp->norm_eps, n, ws->xb);    /* x += ffn; xb = norm(x) */
    }
    if (b->n_logits == 0) return TM_OK;
    op->get_rows(be, ws->xb, b->logits_index, b->n_logits, hp->dim, ws->hsel);
    tm_matmul_job head = {&m->output, NULL, ws->logits};
    op->matmul(be, &head, 1, ws->hsel, b->n_logits);
    op->to_host(be, ws->logits, (size_t)b->n_logits * (size_t)hp->n_vocab, logits_out);
    return TM_OK;
}
