/* tm_tp_forward.c -- the forward pass over N tensor-parallel ranks: the same op sequence on every rank's shard,
 * with an all-reduce (sum) of the attention and MLP outputs before each residual add. */
#include "model/tm_tp_forward.h"

tm_status tm_tp_forward(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err) {
    if (g->n_ranks < 1 || g->n_ranks > TM_TP_MAX_RANKS || !g->allreduce)
        return tm_err(err, TM_ERR_INVALID, "tensor-parallel group of %d ranks", g->n_ranks);
    const tm_hparams *hp = &g->ranks[0].model->hp;
    int32_t n = b->n_tokens, R = g->n_ranks;
    if (n < 1 || n > g->ranks[0].ws->max_tokens)
        return tm_err(err, TM_ERR_RANGE, "batch of %d tokens outside 1..%d", n, g->ranks[0].ws->max_tokens);
    if (b->n_logits < 0 || b->n_logits > n || b->n_logits > g->ranks[0].ws->max_logits)
        return tm_err(err, TM_ERR_RANGE, "bad logits count %d", b->n_logits);
    for (int32_t i = 0; i < n; i++)
        if (b->token_ids[i] < 0 || b->token_ids[i] >= hp->n_vocab)
            return tm_err(err, TM_ERR_RANGE, "token id %d outside the vocabulary (%d)", b->token_ids[i], hp->n_vocab);
    void *proj[TM_TP_MAX_RANKS];
    tm_attn_cfg acfg[TM_TP_MAX_RANKS];
    for (int32_t r = 0; r < R; r++) {
        proj[r] = g->ranks[r].ws->proj;
        acfg[r] = tm_model_attn_cfg(g->ranks[r].model);
    }
    size_t dimn = (size_t)n * (size_t)hp->dim;
#define EACH for (int32_t r = 0; r < R; r++)
#define OP(r) g->ranks[r].be->ops
#define BE(r) g->ranks[r].be
#define WS(r) g->ranks[r].ws
#define M(r) g->ranks[r].model
    tm_status st;
    EACH if (OP(r)->begin_step) { /* device ranks: the batch uploaded to each (graphs stay off: no padding) */
        tm_step_plan plan = {.n_tokens = n, .n_logits = b->n_logits, .replayed = false};
        if ((st = OP(r)->begin_step(BE(r), b, &plan, err)) != TM_OK) return st;
        if (plan.replayed || plan.n_tokens != n || plan.n_logits != b->n_logits)
            return tm_err(err, TM_ERR_INTERNAL, "tensor-parallel rank %d planned a graph; its backend needs graphs off", r);
    }
    EACH OP(r)->embed(BE(r), &M(r)->tok_embd, b->token_ids, n, WS(r)->x);
    EACH OP(r)->rmsnorm(BE(r), WS(r)->x, &M(r)->layers[0].attn_norm, hp->norm_eps, n, WS(r)->xb);
    for (int32_t l = 0; l < hp->n_layers; l++) {
        EACH {
            const tm_layer *L = &M(r)->layers[l];
            tm_matmul_job qkv[3] = {{&L->wq, L->bq.data ? &L->bq : NULL, WS(r)->q, false},
                                    {&L->wk, L->bk.data ? &L->bk : NULL, WS(r)->k, false},
                                    {&L->wv, L->bv.data ? &L->bv : NULL, WS(r)->v, false}};
            OP(r)->matmul(BE(r), qkv, 3, WS(r)->xb, n);
            OP(r)->rope_kv_write(BE(r), &acfg[r], l, b, WS(r)->q, WS(r)->k, WS(r)->v);
            OP(r)->attention(BE(r), &acfg[r], l, b, WS(r)->q, WS(r)->att);
            tm_matmul_job o = {&L->wo, NULL, WS(r)->proj, false};
            OP(r)->matmul(BE(r), &o, 1, WS(r)->att, n);
        }
        g->allreduce(g->user, proj, R, dimn); /* attention output: sum of the ranks' partial products */
        EACH {
            const tm_layer *L = &M(r)->layers[l];
            OP(r)->add_rmsnorm(BE(r), WS(r)->x, WS(r)->proj, &L->ffn_norm, hp->norm_eps, n, WS(r)->xb);
            tm_matmul_job gu[2] = {{&L->w_gate, NULL, WS(r)->hb, false}, {&L->w_up, NULL, WS(r)->hb2, false}};
            OP(r)->matmul(BE(r), gu, 2, WS(r)->xb, n);
            OP(r)->swiglu(BE(r), WS(r)->hb, WS(r)->hb2, n, M(r)->hp.ffn_dim, WS(r)->hb);
            tm_matmul_job down = {&L->w_down, NULL, WS(r)->proj, false};
            OP(r)->matmul(BE(r), &down, 1, WS(r)->hb, n);
        }
        g->allreduce(g->user, proj, R, dimn); /* MLP output */
        EACH {
            const tm_weight *next = l + 1 < hp->n_layers ? &M(r)->layers[l + 1].attn_norm : &M(r)->output_norm;
            OP(r)->add_rmsnorm(BE(r), WS(r)->x, WS(r)->proj, next, hp->norm_eps, n, WS(r)->xb);
        }
    }
    EACH if (OP(r)->end_step) {
        bool rerun = false;
        if ((st = OP(r)->end_step(BE(r), &rerun, err)) != TM_OK) return st;
    }
    EACH if (OP(r)->last_error && (st = OP(r)->last_error(BE(r), err)) != TM_OK) return st;
    if (b->n_logits == 0) return TM_OK;
    /* the output projection is replicated: rank 0 computes the logits */
    OP(0)->get_rows(BE(0), WS(0)->xb, b->logits_index, b->n_logits, hp->dim, WS(0)->hsel);
    tm_matmul_job head = {&M(0)->output, NULL, WS(0)->logits, true};
    OP(0)->matmul(BE(0), &head, 1, WS(0)->hsel, b->n_logits);
    OP(0)->to_host(BE(0), WS(0)->logits, (size_t)b->n_logits * (size_t)hp->n_vocab, logits_out);
    if (OP(0)->last_error && (st = OP(0)->last_error(BE(0), err)) != TM_OK) return st;
#undef EACH
#undef OP
#undef BE
#undef WS
#undef M
    return TM_OK;
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
