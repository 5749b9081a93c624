/* test_backend_hooks.c -- the optional backend hooks a device backend uses, exercised on the CPU: weight placement
 * (copies, tied embeddings, deferred dummy recipes), begin/end_step with a failed graph capture that reruns the
 * pass, fused matmul_swiglu, whole layers taken by decoder_layer, and the engine's argmax-on-device path; plus
 * device names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>

#include "engine/tm_engine.h"
#include "engine/tm_runner.h"
#include "model/tm_model.h"
#include "model/tm_tp.h"
#include "model/tm_tp_forward.h"
#include "tm_test_tiny_model.h"

/* A backend that forwards every op to a CPU backend and implements the optional hooks on host memory. */
typedef struct hook_be {
    tm_backend base;
    tm_backend *cpu;
    tm_backend_ops ops;
    int placed, released, begins, ends, reruns_left, swiglus, embeds, gathers;
    bool fail_begin;  /* begin_step fails (a rank that cannot run the step) */
    float *tmp;       /* (tmp_n) scratch for matmul_swiglu */
    size_t tmp_n;
    uint32_t whole;   /* decoder_layer takes layer l when bit l is set */
    int layers_taken;
    float *lx[4];     /* decoder_layer's scratch: xb, k, v, proj, each (lx_n) */
    size_t lx_n;
    /* weight_place_group: groups placed (one allocation each), members still live per group, and a failing mode */
    int groups, group_frees;
    uint8_t *gbase[64];
    size_t gbytes[64];
    int glive[64];
    bool fail_group;
} hook_be;

static hook_be *H(tm_backend *be) { return (hook_be *)be; }
static void h_free(tm_backend *be) {
    if (H(be)->tmp) H(be)->cpu->ops->release(H(be)->cpu, H(be)->tmp);
    for (int i = 0; i < 4; i++)
        if (H(be)->lx[i]) H(be)->cpu->ops->release(H(be)->cpu, H(be)->lx[i]);
    H(be)->cpu->ops->free(H(be)->cpu);
    free(be);
}
static void *h_alloc(tm_backend *be, size_t n) { return H(be)->cpu->ops->alloc(H(be)->cpu, n); }
static void h_release(tm_backend *be, void *p) { H(be)->cpu->ops->release(H(be)->cpu, p); }
static tm_status h_kv_init(tm_backend *be, const tm_kv_cfg *c, tm_error *e) { return H(be)->cpu->ops->kv_init(H(be)->cpu, c, e); }
static void h_embed(tm_backend *be, const tm_weight *t, const int32_t *ids, int32_t n, void *x) {
    H(be)->embeds++;
    H(be)->cpu->ops->embed(H(be)->cpu, t, ids, n, x);
}
static void h_rmsnorm(tm_backend *be, const void *x, const tm_weight *w, float eps, int32_t n, void *out) {
    H(be)->cpu->ops->rmsnorm(H(be)->cpu, x, w, eps, n, out);
}
static void h_add_rmsnorm(tm_backend *be, void *r, const void *x, const tm_weight *w, float eps, int32_t n, void *out) {
    H(be)->cpu->ops->add_rmsnorm(H(be)->cpu, r, x, w, eps, n, out);
}
static void h_matmul(tm_backend *be, const tm_matmul_job *j, int32_t nj, const void *x, int32_t n) {
    H(be)->cpu->ops->matmul(H(be)->cpu, j, nj, x, n);
}
static void h_rope(tm_backend *be, const tm_attn_cfg *a, int32_t l, const tm_batch *b, void *q, void *k, const void *v) {
    H(be)->cpu->ops->rope_kv_write(H(be)->cpu, a, l, b, q, k, v);
}
static void h_attn(tm_backend *be, const tm_attn_cfg *a, int32_t l, const tm_batch *b, const void *q, void *out) {
    H(be)->cpu->ops->attention(H(be)->cpu, a, l, b, q, out);
}
static void h_swiglu(tm_backend *be, const void *g, const void *u, int32_t n, int32_t f, void *out) {
    H(be)->cpu->ops->swiglu(H(be)->cpu, g, u, n, f, out);
}
static void h_get_rows(tm_backend *be, const void *x, const int32_t *idx, int32_t ni, int32_t w, void *out) {
    H(be)->gathers++;
    H(be)->cpu->ops->get_rows(H(be)->cpu, x, idx, ni, w, out);
}
static void h_to_host(tm_backend *be, const void *x, size_t n, float *dst) { H(be)->cpu->ops->to_host(H(be)->cpu, x, n, dst); }
static void h_from_host(tm_backend *be, const float *s, size_t n, void *x) { H(be)->cpu->ops->from_host(H(be)->cpu, s, n, x); }

static tm_status h_begin(tm_backend *be, const tm_batch *b, tm_step_plan *plan, tm_error *err) {
    H(be)->begins++;
    if (H(be)->fail_begin) return tm_err(err, TM_ERR_NOMEM, "no room for the step");
    plan->n_tokens = b->n_tokens;
    plan->n_logits = b->n_logits;
    plan->replayed = false;
    return TM_OK;
}
static tm_status h_end(tm_backend *be, bool *rerun, tm_error *err) {
    (void)err;
    H(be)->ends++;
    *rerun = H(be)->reruns_left > 0; /* like a graph capture that failed: the pass must run again */
    if (*rerun) H(be)->reruns_left--;
    return TM_OK;
}
static void h_matmul_swiglu(tm_backend *be, const tm_weight *g, const tm_weight *u, const void *x, int32_t n, void *out) {
    hook_be *h = H(be);
    h->swiglus++;
    size_t need = (size_t)n * (size_t)u->rows;
    if (need > h->tmp_n) {
        if (h->tmp) h->cpu->ops->release(h->cpu, h->tmp);
        h->tmp = h->cpu->ops->alloc(h->cpu, need);
        h->tmp_n = need;
    }
    tm_matmul_job jobs[2] = {{g, NULL, out, false}, {u, NULL, h->tmp, false}};
    h->cpu->ops->matmul(h->cpu, jobs, 2, x, n);
    h->cpu->ops->swiglu(h->cpu, out, h->tmp, n, (int32_t)g->rows, out);
}
/* A whole layer from the CPU ops, the way a device backend's one-kernel layer would do it: the norm of x first (the
 * forward has not made xb), x updated, no xb left behind. */
static bool h_decoder_layer(tm_backend *be, const tm_layer_weights *L, const tm_attn_cfg *a, float eps, int32_t layer,
                            const tm_batch *b, void *x, int32_t n, void *q, void *att, void *h) {
    hook_be *hk = H(be);
    if (!(hk->whole >> layer & 1u)) return false;
    hk->layers_taken++;
    tm_backend *c = hk->cpu;
    const tm_backend_ops *op = c->ops;
    size_t need = (size_t)n * (size_t)(L->wk->rows > L->wq->cols ? L->wk->rows : L->wq->cols); /* xb, k, v, proj */
    if (need > hk->lx_n) {
        for (int i = 0; i < 4; i++) {
            if (hk->lx[i]) op->release(c, hk->lx[i]);
            hk->lx[i] = op->alloc(c, need);
        }
        hk->lx_n = need;
    }
    float *xb = hk->lx[0], *k = hk->lx[1], *v = hk->lx[2], *proj = hk->lx[3];
    op->rmsnorm(c, x, L->attn_norm, eps, n, xb);
    tm_matmul_job qkv[3] = {{L->wq, L->bq, q, false}, {L->wk, L->bk, k, false}, {L->wv, L->bv, v, false}};
    op->matmul(c, qkv, 3, xb, n);
    op->rope_kv_write(c, a, layer, b, q, k, v);
    op->attention(c, a, layer, b, q, att);
    tm_matmul_job o = {L->wo, NULL, proj, false};
    op->matmul(c, &o, 1, att, n);
    op->add_rmsnorm(c, x, proj, L->ffn_norm, eps, n, xb);
    h_matmul_swiglu(be, L->w_gate, L->w_up, xb, n, h);
    tm_matmul_job d = {L->w_down, NULL, proj, false};
    op->matmul(c, &d, 1, h, n);
    op->add_rmsnorm(c, x, proj, L->ffn_norm, eps, n, xb); /* x += ffn; this xb is dropped */
    return true;
}

static tm_status h_place(tm_backend *be, tm_weight *w, tm_error *err) {
    size_t bytes = (size_t)(tm_dtype_row_bytes(w->type, (uint64_t)w->cols) * (uint64_t)w->rows);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return tm_err(err, TM_ERR_NOMEM, "oom");
    if (w->dummy) { /* the recipe, made here in f32 or bf16 */
        assert_true(w->type == TM_DT_F32 || w->type == TM_DT_BF16);
        float v = w->dummy_constant != 0.0f ? w->dummy_constant : w->dummy_scale * 0.5f;
        if (w->type == TM_DT_F32)
            for (size_t i = 0; i < bytes / 4; i++) ((float *)p)[i] = v;
        else
            for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)p)[i] = tm_f32_to_bf16(v);
    } else {
        memcpy(p, w->data, bytes);
    }
    w->data = p;
    w->dummy = false;
    H(be)->placed++;
    return TM_OK;
}
static void h_unplace(tm_backend *be, tm_weight *w) {
    hook_be *h = H(be);
    const uint8_t *p = w->data;
    w->data = NULL;
    h->released++;
    for (int g = 0; g < h->groups; g++)
        if (h->gbase[g] && p >= h->gbase[g] && p < h->gbase[g] + h->gbytes[g]) {
            if (--h->glive[g] == 0) {
                free(h->gbase[g]);
                h->gbase[g] = NULL;
                h->group_frees++;
            }
            return;
        }
    free((void *)p);
}

/* weight_place_group on host memory: one allocation, the members' rows one after the other */
static tm_status h_place_group(tm_backend *be, tm_weight *const *ws, int32_t n, tm_error *err) {
    hook_be *h = H(be);
    if (h->fail_group || h->groups == 64) return tm_err(err, TM_ERR_UNSUPPORTED, "no groups here");
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(ws[i]->type, ws[0]->type); /* the model only asks for groups of one type and width */
        assert_int_equal(ws[i]->cols, ws[0]->cols);
        total += (size_t)(tm_dtype_row_bytes(ws[i]->type, (uint64_t)ws[i]->cols) * (uint64_t)ws[i]->rows);
    }
    uint8_t *base = malloc(total);
    if (!base) return tm_err(err, TM_ERR_NOMEM, "oom");
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t bytes = (size_t)(tm_dtype_row_bytes(ws[i]->type, (uint64_t)ws[i]->cols) * (uint64_t)ws[i]->rows);
        memcpy(base + off, ws[i]->data, bytes);
        ws[i]->data = base + off;
        off += bytes;
        h->placed++;
    }
    h->gbase[h->groups] = base;
    h->gbytes[h->groups] = total;
    h->glive[h->groups++] = n;
    return TM_OK;
}

static hook_be *hook_create(void) {
    hook_be *h = calloc(1, sizeof *h);
    tm_cpu_cfg cc = {2, 16};
    tm_error err;
    assert_int_equal(tm_backend_cpu_create(&cc, &h->cpu, &err), TM_OK);
    h->ops = (tm_backend_ops){
        .name = "hooks", .free = h_free, .alloc = h_alloc, .release = h_release, .kv_init = h_kv_init, .embed = h_embed,
        .rmsnorm = h_rmsnorm, .add_rmsnorm = h_add_rmsnorm, .matmul = h_matmul, .rope_kv_write = h_rope,
        .attention = h_attn, .swiglu = h_swiglu, .get_rows = h_get_rows, .to_host = h_to_host, .from_host = h_from_host,
        .begin_step = h_begin, .end_step = h_end, .matmul_swiglu = h_matmul_swiglu, .weight_place = h_place,
        .weight_release = h_unplace,
    };
    h->base.ops = &h->ops;
    return h;
}

static void test_device_parse(void **st) {
    (void)st;
    tm_device d;
    int32_t o;
    tm_error err;
    assert_int_equal(tm_device_parse(NULL, &d, &o, &err), TM_OK);
    assert_int_equal(d, TM_DEVICE_CPU);
    assert_int_equal(tm_device_parse("cpu", &d, &o, &err), TM_OK);
    assert_int_equal(d, TM_DEVICE_CPU);
    assert_int_equal(tm_device_parse("cuda", &d, &o, &err), TM_OK);
    assert_int_equal(d, TM_DEVICE_CUDA);
    assert_int_equal(o, 0);
    assert_int_equal(tm_device_parse("cuda:3", &d, &o, &err), TM_OK);
    assert_int_equal(o, 3);
    assert_int_equal(tm_device_parse("cuda:", &d, &o, &err), TM_ERR_INVALID);
    assert_int_equal(tm_device_parse("cuda:x", &d, &o, &err), TM_ERR_INVALID);
    assert_int_equal(tm_device_parse("gpu", &d, &o, &err), TM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "gpu"));
}

/* the tiny model of o, written and loaded */
static tm_model *load_tiny(const tiny_opts *o) {
    const char *path = write_tiny(o);
    tm_model *m = NULL;
    tm_error err;
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    unlink(path);
    return m;
}

/* One prompt's last-token logits through tm_model_forward on backend be. */
static void forward_logits(const tm_model *m, tm_backend *be, const int32_t *ids, int32_t n, float *out) {
    tm_error err;
    tm_workspace ws;
    assert_int_equal(tm_workspace_init(&ws, m, be, n, 1, &err), TM_OK);
    tm_kv_cfg kc = {m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim, 16, 4, TM_DT_F32};
    assert_int_equal(be->ops->kv_init(be, &kc, &err), TM_OK);
    int32_t pos[64], seq[64], qs[2] = {0, n}, ctx[1] = {n}, bt[4] = {0, 1, 2, 3}, li[1] = {n - 1};
    int64_t slots[64];
    for (int32_t i = 0; i < n; i++) pos[i] = i, seq[i] = 0, slots[i] = i;
    tm_batch b = {.n_tokens = n, .token_ids = ids, .positions = pos, .seq_index = seq, .n_seqs = 1, .query_start = qs,
                  .context_len = ctx, .max_blocks = 4, .block_table = bt, .slot_mapping = slots, .n_logits = 1,
                  .logits_index = li};
    assert_int_equal(tm_model_forward(m, be, &ws, &b, out, &err), TM_OK);
    tm_workspace_free(&ws, be);
}

/* the same on a CPU backend of its own: the reference */
static void cpu_logits(const tm_model *m, const int32_t *ids, int32_t n, float *out) {
    tm_cpu_cfg cc = {2, 16};
    tm_backend *cpu = NULL;
    tm_error err;
    assert_int_equal(tm_backend_cpu_create(&cc, &cpu, &err), TM_OK);
    forward_logits(m, cpu, ids, n, out);
    cpu->ops->free(cpu);
}

static void test_placed_model_forward_is_identical(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.tied = true;
    o.wtype = TM_DT_Q8_0;
    tm_model *m = load_tiny(&o);
    tm_error err;
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (i * 37 + 5) % m->hp.n_vocab;
    float *ref = malloc(sizeof(float) * (size_t)m->hp.n_vocab), *got = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    cpu_logits(m, ids, 20, ref);

    hook_be *h = hook_create();
    h->reruns_left = 1;
    tm_model *p = NULL;
    assert_int_equal(tm_model_place(m, &h->base, &p, &err), TM_OK);
    /* copies in "backend memory", the tied output shares the embedding's copy, absent biases stay absent */
    assert_ptr_not_equal(p->layers[0].wq.data, m->layers[0].wq.data);
    assert_memory_equal(p->layers[0].wq.data, m->layers[0].wq.data,
                        tm_dtype_row_bytes(m->layers[0].wq.type, (uint64_t)m->layers[0].wq.cols) * (size_t)m->layers[0].wq.rows);
    assert_ptr_equal(p->output.data, p->tok_embd.data);
    assert_null(p->layers[0].bq.data);
    int expect = 2 + 9 * m->hp.n_layers; /* tok_embd, output_norm, 9 per layer (no biases), output tied */
    assert_int_equal(h->placed, expect);
    forward_logits(p, &h->base, ids, 20, got);
    assert_memory_equal(got, ref, sizeof(float) * (size_t)m->hp.n_vocab); /* bit-identical, also after the rerun */
    assert_int_equal(h->begins, 2);                                          /* the failed "capture" ran again */
    assert_int_equal(h->ends, 2);
    assert_int_equal(h->swiglus, 2 * m->hp.n_layers);
    tm_model_unplace(p, &h->base);
    assert_int_equal(h->released, expect);
    h->base.ops->free(&h->base);
    free(ref);
    free(got);
    tm_model_free(m);
}

/* ops->weight_place_group: q|k|v and gate|up of every layer placed as one allocation each, rows concatenated (the
 * forward is unchanged: bit-identical logits); a layer whose q, k, v differ in scale is placed one by one; a
 * backend that refuses groups gets every weight placed singly; each group is freed once, with its last weight. */
static void test_grouped_placement(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_Q8_0;
    tm_model *m = load_tiny(&o);
    tm_error err;
    const int32_t L = m->hp.n_layers;
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (i * 53 + 7) % m->hp.n_vocab;
    float *ref = malloc(sizeof(float) * (size_t)m->hp.n_vocab), *got = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    cpu_logits(m, ids, 12, ref);
    m->layers[0].wk.scale = 2.0f; /* layer 0's q, k, v no longer share scales (Q8_0 ignores the field) */
    for (int fail = 0; fail <= 1; fail++) {
        hook_be *h = hook_create();
        h->ops.weight_place_group = h_place_group;
        h->fail_group = fail;
        tm_model *p = NULL;
        assert_int_equal(tm_model_place(m, &h->base, &p, &err), TM_OK);
        const int expect = 3 + 9 * L; /* tok_embd, output_norm, output, 9 per layer (no biases) */
        assert_int_equal(h->placed, expect);
        assert_int_equal(h->groups, fail ? 0 : 2 * L - 1); /* gate|up of every layer, q|k|v from layer 1 on */
        for (int32_t l = 0; l < L; l++) {
            const tm_layer *pl = &p->layers[l], *ml = &m->layers[l];
            const size_t qb = (size_t)(tm_dtype_row_bytes(pl->wq.type, (uint64_t)pl->wq.cols) * (uint64_t)pl->wq.rows);
            const size_t kb = (size_t)(tm_dtype_row_bytes(pl->wk.type, (uint64_t)pl->wk.cols) * (uint64_t)pl->wk.rows);
            const size_t gb = (size_t)(tm_dtype_row_bytes(pl->w_gate.type, (uint64_t)pl->w_gate.cols) * (uint64_t)pl->w_gate.rows);
            const bool qkv = !fail && l > 0;
            assert_true(((const uint8_t *)pl->wk.data == (const uint8_t *)pl->wq.data + qb) == qkv);
            assert_true(((const uint8_t *)pl->wv.data == (const uint8_t *)pl->wk.data + kb) == qkv);
            assert_true(((const uint8_t *)pl->w_up.data == (const uint8_t *)pl->w_gate.data + gb) == !fail);
            assert_memory_equal(pl->wv.data, ml->wv.data, kb);
            assert_memory_equal(pl->w_up.data, ml->w_up.data, gb);
        }
        forward_logits(p, &h->base, ids, 12, got);
        assert_memory_equal(got, ref, sizeof(float) * (size_t)m->hp.n_vocab);
        tm_model_unplace(p, &h->base);
        assert_int_equal(h->released, expect);
        assert_int_equal(h->group_frees, h->groups);
        h->base.ops->free(&h->base);
    }
    free(ref);
    free(got);
    tm_model_free(m);
}

/* ops->decoder_layer: whichever layers a backend takes whole (all, the first, the last, every other one, none),
 * the forward makes the norms the taken layers do not leave behind (before the next layer run as ops, before the
 * output projection) and the logits equal the op-by-op pass's. */
static void test_whole_layers(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.layers = 3;
    tm_model *m = load_tiny(&o);
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (i * 53 + 7) % m->hp.n_vocab;
    const size_t nv = (size_t)m->hp.n_vocab;
    float *ref = malloc(sizeof(float) * nv), *got = malloc(sizeof(float) * nv);
    hook_be *h = hook_create();
    h->ops.decoder_layer = h_decoder_layer;
    forward_logits(m, &h->base, ids, 12, ref); /* whole = 0: every layer as ops */
    assert_int_equal(h->layers_taken, 0);
    const uint32_t masks[] = {7u, 1u, 4u, 5u, 2u};
    for (size_t t = 0; t < sizeof masks / sizeof masks[0]; t++) {
        h->whole = masks[t];
        h->layers_taken = 0;
        forward_logits(m, &h->base, ids, 12, got);
        assert_int_equal(h->layers_taken, __builtin_popcount(masks[t]));
        double worst = 0.0, scale = 0.0;
        for (size_t i = 0; i < nv; i++) {
            worst = fmax(worst, fabs((double)got[i] - (double)ref[i]));
            scale = fmax(scale, fabs((double)ref[i]));
        }
        if (worst > 1e-5 * scale) fail_msg("layers %#x taken whole: logits off by %g (largest %g)", masks[t], worst, scale);
    }
    h->base.ops->free(&h->base);
    free(ref);
    free(got);
    tm_model_free(m);
}

/* Tensor-parallel ranks agree after begin_step: when one rank cannot run the step, no rank runs it (none is left
 * waiting in an all-reduce) and the error names the rank; the next step runs on both and matches the unsharded
 * model. */
static void test_tp_ranks_agree(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    tm_model *m = load_tiny(&o), *sh[2] = {NULL, NULL};
    tm_error err;
    enum { N = 8 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 29 + 3) % m->hp.n_vocab;
    float *ref = malloc(sizeof(float) * (size_t)m->hp.n_vocab), *got = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    cpu_logits(m, ids, N, ref);

    hook_be *h[2];
    tm_workspace ws[2];
    tm_tp_rank ranks[2];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(tm_tp_shard_model(m, 2, r, &sh[r], &err), TM_OK);
        h[r] = hook_create();
        assert_int_equal(tm_workspace_init(&ws[r], sh[r], &h[r]->base, N, 1, &err), TM_OK);
        tm_kv_cfg kc = {sh[r]->hp.n_layers, sh[r]->hp.n_kv_heads, sh[r]->hp.head_dim, 16, 4, TM_DT_F32};
        assert_int_equal(h[r]->base.ops->kv_init(&h[r]->base, &kc, &err), TM_OK);
        ranks[r] = (tm_tp_rank){sh[r], &h[r]->base, &ws[r]};
    }
    tm_tp_host_reduce *hr = NULL;
    assert_int_equal(tm_tp_host_reduce_create(2, &hr, &err), TM_OK);
    tm_threadpool *threads = NULL;
    assert_int_equal(tm_threadpool_create(2, &threads, &err), TM_OK);
    tm_tp_group g = {2, ranks, tm_tp_allreduce_host, hr, threads};
    int32_t pos[N], seq[N], qs[2] = {0, N}, ctx[1] = {N}, bt[4] = {0, 1, 2, 3}, li[1] = {N - 1};
    int64_t slots[N];
    for (int32_t i = 0; i < N; i++) pos[i] = i, seq[i] = 0, slots[i] = i;
    tm_batch b = {.n_tokens = N, .token_ids = ids, .positions = pos, .seq_index = seq, .n_seqs = 1, .query_start = qs,
                  .context_len = ctx, .max_blocks = 4, .block_table = bt, .slot_mapping = slots, .n_logits = 1,
                  .logits_index = li};

    h[1]->fail_begin = true;
    assert_int_equal(tm_tp_forward(&g, &b, got, &err), TM_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "rank 1"));
    assert_non_null(strstr(err.msg, "no room"));
    assert_int_equal(h[0]->embeds, 0); /* rank 0 did not start the pass */
    assert_int_equal(h[1]->embeds, 0);
    h[1]->fail_begin = false;
    assert_int_equal(tm_tp_forward(&g, &b, got, &err), TM_OK);
    assert_int_equal(h[0]->embeds, 1);
    assert_int_equal(h[1]->embeds, 1);
    for (int32_t v = 0; v < m->hp.n_vocab; v++) assert_true(fabsf(got[v] - ref[v]) <= 1e-4f * (1.0f + fabsf(ref[v])));

    tm_threadpool_free(threads);
    tm_tp_host_reduce_free(hr);
    for (int r = 0; r < 2; r++) {
        tm_workspace_free(&ws[r], &h[r]->base);
        h[r]->base.ops->free(&h[r]->base);
        tm_tp_shard_free(sh[r]);
    }
    free(ref);
    free(got);
    tm_model_free(m);
}

static void test_deferred_dummy_weights(void **st) {
    (void)st;
    tm_error err;
    tm_model *eager = NULL, *lazy = NULL;
    tm_model_load_opts lo = {.defer_dummy = true};
    assert_int_equal(tm_model_load("dummy:smollm2-135m:bf16", &eager, &err), TM_OK);
    assert_int_equal(tm_model_load_ex("dummy:smollm2-135m:bf16", &lo, &lazy, &err), TM_OK);
    assert_false(tm_model_has_deferred(eager));
    assert_true(tm_model_has_deferred(lazy));
    assert_null(lazy->layers[0].wq.data);
    assert_null(lazy->dummy_mem);
    assert_true(lazy->layers[0].attn_norm.dummy_constant == 1.0f); /* norms are ones, matrices random */
    assert_true(lazy->layers[0].wq.dummy_scale > 0.0f && lazy->layers[0].wq.dummy_constant == 0.0f);
    assert_true(lazy->layers[0].wq.dummy_seed != lazy->layers[0].wk.dummy_seed);
    assert_int_equal(lazy->weight_bytes, eager->weight_bytes);
    /* only a backend with memory of its own can run it */
    tm_runner *r = NULL;
    tm_runner_cfg rc = {.n_threads = 1, .n_ctx = 64, .max_batch_tokens = 16};
    assert_int_equal(tm_runner_create(lazy, &rc, &r, &err), TM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "dummy"));
    hook_be *h = hook_create();
    tm_model *p = NULL;
    assert_int_equal(tm_model_place(lazy, &h->base, &p, &err), TM_OK);
    assert_false(tm_model_has_deferred(p));
    assert_true(((const float *)p->layers[1].ffn_norm.data)[7] == 1.0f);
    tm_model_unplace(p, &h->base);
    assert_int_equal(h->placed, h->released);
    h->base.ops->free(&h->base);
    tm_model_free(eager);
    tm_model_free(lazy);
}

/* The engine's greedy-on-device path (only ids cross) gives the tokens of the host sampler. */
static int g_cpu_argmax_calls;
static tm_status cpu_argmax(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, int32_t *out,
                            tm_error *err) {
    (void)be;
    (void)err;
    g_cpu_argmax_calls++;
    const float *l = logits; /* cpu activations are host f32 */
    for (int32_t r = 0; r < n_rows; r++) {
        int32_t best = 0;
        for (int32_t j = 1; j < vocab; j++)
            if (l[(size_t)r * (size_t)vocab + (size_t)j] > l[(size_t)r * (size_t)vocab + (size_t)best]) best = j;
        out[r] = best;
    }
    return TM_OK;
}

/* a backend sampler that records the recipes it is given and draws the argmax */
static int g_sample_calls, g_seen_seed5, g_max_offset5, g_bad_rows;
static tm_status mock_sample(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                             const tm_sample_set *set, int32_t *out, tm_sample_lp *lp, tm_error *err) {
    (void)lp;
    const tm_sample_row *rows = set->rows;
    g_sample_calls++;
    for (int32_t r = 0; r < n_rows; r++) {
        if (rows[r].seed == 5) {
            g_seen_seed5++;
            if ((int)rows[r].offset > g_max_offset5) g_max_offset5 = (int)rows[r].offset;
            if (!(rows[r].temperature > 0.69f && rows[r].temperature < 0.71f)) g_bad_rows++;
        } else if (rows[r].temperature != 0.0f) {
            g_bad_rows++;
        }
    }
    return cpu_argmax(be, logits, n_rows, vocab, out, err);
}

typedef struct collect {
    int32_t ids[16];
    int n;
} collect;
static bool collect_cb(void *user, const tm_gen_event *ev) {
    collect *c = user;
    if (ev->token >= 0 && c->n < 16) c->ids[c->n++] = ev->token;
    return true;
}

static void test_engine_argmax_on_backend(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    tm_model *m = load_tiny(&o);
    tm_error err;
    int32_t prompts[4][6];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 6; i++) prompts[k][i] = (k * 11 + i * 7 + 1) % m->hp.n_vocab;
    collect out[2][5];
    memset(out, 0, sizeof out);
    for (int pass = 0; pass < 2; pass++) {
        tm_engine_cfg cfg = {.runner = {.n_threads = 2, .n_ctx = 64, .max_batch_tokens = 32, .n_seqs = 5},
                             .sched = {.max_batched_tokens = 32, .max_seqs = 5}};
        tm_engine *e = NULL;
        assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
        const tm_backend_ops *orig = e->runner->be->ops;
        tm_backend_ops ops = *orig;
        if (pass == 1) {
            ops.argmax = cpu_argmax;
            e->runner->be->ops = &ops;
        }
        tm_gen_params gp = {.sampling = tm_sampling_default(), .max_tokens = 12, .ignore_eos = true};
        gp.sampling.temperature = 0.0f;
        for (int k = 0; k < 4; k++)
            assert_int_equal(tm_engine_add(e, prompts[k], 6, &gp, collect_cb, &out[pass][k], NULL, &err), TM_OK);
        /* a sampled request in the mix sends its step's logits to the host sampler */
        tm_gen_params hot = gp;
        hot.sampling.temperature = 0.7f;
        hot.sampling.seed = 5;
        assert_int_equal(tm_engine_add(e, prompts[0], 6, &hot, collect_cb, &out[pass][4], NULL, &err), TM_OK);
        while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
        e->runner->be->ops = orig;
        tm_engine_free(e);
    }
    assert_int_equal(g_cpu_argmax_calls, 0); /* the sampled request ran alongside the greedy ones throughout */
    assert_memory_equal(out[0], out[1], sizeof out[0]);
    /* now greedy requests alone: the argmax path is taken and gives the same tokens */
    collect solo[4];
    memset(solo, 0, sizeof solo);
    tm_engine_cfg cfg = {.runner = {.n_threads = 2, .n_ctx = 64, .max_batch_tokens = 32, .n_seqs = 4},
                         .sched = {.max_batched_tokens = 32, .max_seqs = 4}};
    tm_engine *e = NULL;
    assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
    const tm_backend_ops *orig = e->runner->be->ops;
    tm_backend_ops ops = *orig;
    ops.argmax = cpu_argmax;
    e->runner->be->ops = &ops;
    tm_gen_params gp = {.sampling = tm_sampling_default(), .max_tokens = 12, .ignore_eos = true};
    gp.sampling.temperature = 0.0f;
    for (int k = 0; k < 4; k++) assert_int_equal(tm_engine_add(e, prompts[k], 6, &gp, collect_cb, &solo[k], NULL, &err), TM_OK);
    while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    /* the device-argmax flag of the last greedy step must not leak into a later logits request */
    float *lg = malloc(sizeof(float) * (size_t)m->hp.n_vocab), *lg_ref = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    e->runner->greedy_on_device = true;
    assert_int_equal(tm_runner_prompt_logits(e->runner, prompts[2], 6, lg, &err), TM_OK);
    e->runner->be->ops = orig;
    tm_engine_free(e);
    assert_true(g_cpu_argmax_calls > 0);
    tm_engine *e2 = NULL;
    assert_int_equal(tm_engine_create(m, &cfg, &e2, &err), TM_OK);
    assert_int_equal(tm_runner_prompt_logits(e2->runner, prompts[2], 6, lg_ref, &err), TM_OK);
    tm_engine_free(e2);
    assert_memory_equal(lg, lg_ref, sizeof(float) * (size_t)m->hp.n_vocab);
    free(lg);
    free(lg_ref);
    /* a sampled request next to greedy ones goes to the backend's sampler with its recipe: seed, temperature and
     * a draw counter that advances by one per generated token; the greedy rows still come out as the argmax */
    collect mixed[2];
    memset(mixed, 0, sizeof mixed);
    tm_engine *e3 = NULL;
    assert_int_equal(tm_engine_create(m, &cfg, &e3, &err), TM_OK);
    const tm_backend_ops *orig3 = e3->runner->be->ops;
    tm_backend_ops ops3 = *orig3;
    ops3.argmax = cpu_argmax;
    ops3.sample = mock_sample;
    e3->runner->be->ops = &ops3;
    tm_gen_params hot = gp;
    hot.sampling.temperature = 0.7f;
    hot.sampling.seed = 5;
    assert_int_equal(tm_engine_add(e3, prompts[0], 6, &gp, collect_cb, &mixed[0], NULL, &err), TM_OK);
    assert_int_equal(tm_engine_add(e3, prompts[1], 6, &hot, collect_cb, &mixed[1], NULL, &err), TM_OK);
    while (tm_engine_has_work(e3)) assert_int_equal(tm_engine_step(e3, &err), TM_OK);
    e3->runner->be->ops = orig3;
    tm_engine_free(e3);
    assert_true(g_sample_calls > 0);
    assert_int_equal(g_seen_seed5, 12);
    assert_int_equal(g_max_offset5, 11);
    assert_int_equal(g_bad_rows, 0);
    assert_memory_equal(mixed[0].ids, out[0][0].ids, sizeof mixed[0].ids);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(solo[k].n, 12);
        assert_memory_equal(solo[k].ids, out[0][k].ids, sizeof solo[k].ids);
    }
    tm_model_free(m);
}

/* ---- pipelined steps (tm_engine pipelining) on a mock backend whose "device" is host memory ---------------------
 * The mock keeps the last argmax_start/sample_start ids as its device ids (what tm_batch.token_src rows read), copies
 * them to a per-slot buffer for ids_wait, and substitutes the chained tokens in embed, as the cuda backend's gather
 * does before its pass. */
static int32_t g_dev_ids[64], g_slot_ids[2][64];
static const tm_batch *g_pipe_batch;
static const tm_backend_ops *g_pipe_cpu; /* the real cpu ops the mock forwards to */
static int g_chained_steps, g_pipe_launches;
static int g_offsets[64][2]; /* sample_start: (seed, offset) of each row of every call, appended */
static int g_n_offsets;

static tm_status pipe_begin(tm_backend *be, const tm_batch *b, tm_step_plan *plan, tm_error *err) {
    (void)be;
    (void)err;
    g_pipe_batch = b;
    if (b->token_src) g_chained_steps++;
    plan->n_tokens = b->n_tokens;
    plan->n_logits = b->n_logits;
    plan->replayed = false;
    return TM_OK;
}
static tm_status pipe_end(tm_backend *be, bool *rerun, tm_error *err) {
    (void)be;
    (void)err;
    *rerun = false;
    return TM_OK;
}
static void pipe_embed(tm_backend *be, const tm_weight *t, const int32_t *ids, int32_t n, void *x) {
    int32_t sub[256];
    const tm_batch *b = g_pipe_batch;
    if (b && ids == b->token_ids && b->token_src && n <= 256) {
        for (int32_t i = 0; i < n; i++) sub[i] = b->token_src[i] >= 0 ? g_dev_ids[b->token_src[i]] : ids[i];
        ids = sub;
    }
    g_pipe_cpu->embed(be, t, ids, n, x);
}
static tm_status pipe_argmax_start(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab, int32_t slot,
                                   tm_error *err) {
    assert_true(slot == 0 || slot == 1);
    assert_true(n_rows >= 1 && n_rows <= 64);
    g_pipe_launches++;
    tm_status s = cpu_argmax(be, logits, n_rows, vocab, g_dev_ids, err);
    memcpy(g_slot_ids[slot], g_dev_ids, (size_t)n_rows * sizeof(int32_t));
    return s;
}
static void pipe_record(const tm_sample_row *rows, int32_t n_rows) {
    for (int32_t r = 0; r < n_rows && g_n_offsets < 64; r++)
        if (rows[r].seed != 0) {
            g_offsets[g_n_offsets][0] = (int)rows[r].seed;
            g_offsets[g_n_offsets++][1] = (int)rows[r].offset;
        }
}
static tm_status pipe_sample(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                             const tm_sample_set *set, int32_t *out, tm_sample_lp *lp, tm_error *err) {
    (void)lp;
    pipe_record(set->rows, n_rows);
    return cpu_argmax(be, logits, n_rows, vocab, out, err);
}
static tm_status pipe_sample_start(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                                   const tm_sample_set *set, int32_t slot, tm_error *err) {
    pipe_record(set->rows, n_rows);
    return pipe_argmax_start(be, logits, n_rows, vocab, slot, err);
}
static tm_status pipe_ids_wait(tm_backend *be, int32_t slot, int32_t n_rows, int32_t *out, tm_sample_lp *lp,
                               tm_error *err) {
    (void)be;
    (void)err;
    (void)lp;
    memcpy(out, g_slot_ids[slot], (size_t)n_rows * sizeof(int32_t));
    return TM_OK;
}

typedef struct pipe_out {
    int32_t ids[32];
    int n, stop_after; /* stop_after > 0: the callback aborts the request after that many tokens */
    const char *reason;
} pipe_out;
static bool pipe_cb(void *user, const tm_gen_event *ev) {
    pipe_out *o = user;
    if (ev->finish_reason) o->reason = ev->finish_reason;
    if (ev->token >= 0 && o->n < 32) o->ids[o->n++] = ev->token;
    return !(o->stop_after > 0 && o->n >= o->stop_after);
}

/* Runs one workload with pipelining on or off; out[k] per request. kv_blocks small forces preemption. */
static void pipe_run(const tm_model *m, bool pipeline, int32_t kv_blocks, bool sampled, pipe_out *out,
                     tm_kv_stats *kv_stats, uint64_t *preemptions) {
    tm_error err;
    tm_engine_cfg cfg = {.runner = {.n_threads = 2, .n_ctx = 128, .max_batch_tokens = 64, .n_seqs = 4,
                                    .kv_blocks = kv_blocks},
                         .sched = {.max_batched_tokens = 64, .max_seqs = 4}};
    tm_engine *e = NULL;
    assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
    assert_false(e->pipeline); /* the cpu backend cannot pipeline */
    const tm_backend_ops *orig = e->runner->be->ops;
    tm_backend_ops ops = *orig;
    g_pipe_cpu = orig;
    g_pipe_batch = NULL;
    ops.begin_step = pipe_begin;
    ops.end_step = pipe_end;
    ops.embed = pipe_embed;
    ops.argmax = cpu_argmax;
    ops.sample = pipe_sample;
    ops.argmax_start = pipe_argmax_start;
    ops.sample_start = pipe_sample_start;
    ops.ids_wait = pipe_ids_wait;
    e->runner->be->ops = &ops;
    assert_true(tm_runner_can_pipeline(e->runner));
    e->pipeline = pipeline;
    /* six requests over four sequence slots: two wait; different lengths end at different steps, two are stopped
     * by their callback (an end the engine cannot foresee), prompts share a 20-token prefix (a full block) */
    int32_t prompt[6][24];
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < 24; i++) prompt[k][i] = i < 20 ? (i * 13 + 5) % m->hp.n_vocab : (k * 31 + i * 7 + 3) % m->hp.n_vocab;
    const int max_tokens[6] = {9, 14, 5, 20, 12, 7}, stop_after[6] = {0, 6, 0, 0, 3, 0};
    for (int k = 0; k < 6; k++) {
        tm_gen_params gp = {.sampling = tm_sampling_default(), .max_tokens = max_tokens[k], .ignore_eos = true};
        gp.sampling.temperature = 0.0f;
        if (sampled && k % 2) {
            gp.sampling.temperature = 0.7f;
            gp.sampling.seed = (uint64_t)(10 + k);
        }
        out[k].stop_after = stop_after[k];
        assert_int_equal(tm_engine_add(e, prompt[k], 24, &gp, pipe_cb, &out[k], NULL, &err), TM_OK);
    }
    while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    assert_int_equal(e->runner->n_pending, 0);
    /* a request continuing request 0's text: its prompt's full blocks were committed with the pipelined ids */
    int32_t cont[40];
    memcpy(cont, prompt[0], sizeof prompt[0]);
    memcpy(cont + 24, out[0].ids, (size_t)out[0].n * sizeof(int32_t));
    tm_gen_params gp = {.sampling = tm_sampling_default(), .max_tokens = 6, .ignore_eos = true};
    gp.sampling.temperature = 0.0f;
    assert_int_equal(tm_engine_add(e, cont, (size_t)(24 + out[0].n), &gp, pipe_cb, &out[6], NULL, &err), TM_OK);
    /* and one aborted from outside while its step is in flight */
    uint64_t id = 0;
    assert_int_equal(tm_engine_add(e, prompt[5], 24, &gp, pipe_cb, &out[7], &id, &err), TM_OK);
    for (int i = 0; i < 4 && tm_engine_has_work(e); i++) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    assert_true(tm_engine_abort(e, id));
    while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    assert_int_equal(tm_kv_pool_check(&e->runner->pool, &err), TM_OK);
    tm_kv_get_stats(&e->runner->pool, kv_stats);
    *preemptions = e->sched.n_preemptions;
    e->runner->be->ops = orig;
    tm_engine_free(e);
}

static void test_engine_pipelined(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    tm_model *m = load_tiny(&o);
    for (int variant = 0; variant < 3; variant++) { /* greedy; some rows sampled; a 3-block pool (preemption) */
        bool sampled = variant == 1;
        int32_t kv_blocks = variant == 2 ? 3 : 0;
        pipe_out ref[8], got[8];
        tm_kv_stats ks_ref, ks_got;
        uint64_t pre_ref, pre_got;
        memset(ref, 0, sizeof ref);
        memset(got, 0, sizeof got);
        g_chained_steps = g_pipe_launches = g_n_offsets = 0;
        pipe_run(m, false, kv_blocks, sampled, ref, &ks_ref, &pre_ref);
        assert_int_equal(g_chained_steps, 0);
        assert_int_equal(g_pipe_launches, 0);
        int ref_offsets[64][2], n_ref_offsets = g_n_offsets;
        memcpy(ref_offsets, g_offsets, sizeof g_offsets);
        g_chained_steps = g_pipe_launches = g_n_offsets = 0;
        pipe_run(m, true, kv_blocks, sampled, got, &ks_got, &pre_got);
        assert_int_equal(pre_got > 0, variant == 2); /* the small pool preempts (never inside a chain) */
        assert_int_equal(pre_ref > 0, variant == 2);
        print_message("pipelined variant %d: %d passes queued, %d of them chained, %llu preemptions\n", variant,
                      g_pipe_launches, g_chained_steps, (unsigned long long)pre_got);
        assert_true(g_chained_steps > (variant == 2 ? 4 : 10));
        for (int k = 0; k < 8; k++) { /* request 7 is aborted after 4 calls: a pipelined call collects a step later */
            if (k < 7) assert_int_equal(got[k].n, ref[k].n);
            assert_memory_equal(got[k].ids, ref[k].ids, (size_t)got[k].n * sizeof(int32_t));
            assert_non_null(got[k].reason);
            assert_string_equal(got[k].reason, ref[k].reason);
        }
        const int max_tokens[6] = {9, 14, 5, 20, 12, 7}, stop_after[6] = {0, 6, 0, 0, 3, 0};
        for (int k = 0; k < 6; k++) assert_int_equal(got[k].n, stop_after[k] ? stop_after[k] : max_tokens[k]);
        assert_int_equal(got[6].n, 6);
        assert_true(got[7].n < 6);
        assert_string_equal(got[7].reason, "abort");
        /* the prefix cache saw the same ids: the continuation hit as many blocks */
        if (variant != 2) assert_int_equal(ks_got.hit_tokens, ks_ref.hit_tokens);
        assert_true(variant == 2 || ks_got.hit_tokens >= 32);
        /* the sampled rows' draw counters: one per generated token, the same in both modes */
        assert_int_equal(g_n_offsets > 0, sampled);
        if (sampled) {
            int seen[64] = {0};
            for (int i = 0; i < g_n_offsets; i++) { /* each (seed, offset) of the pipelined run was drawn in the reference */
                bool found = false;
                for (int j = 0; j < n_ref_offsets && !found; j++)
                    if (!seen[j] && ref_offsets[j][0] == g_offsets[i][0] && ref_offsets[j][1] == g_offsets[i][1]) seen[j] = found = true;
                int k = g_offsets[i][0] - 10; /* or the row after the request's end, computed and dropped */
                assert_true(found || g_offsets[i][1] == (stop_after[k] ? stop_after[k] : max_tokens[k]));
            }
        }
    }
    tm_model_free(m);
}

/* tm_batch_fresh_from: where the trailing run of fresh sequences (no cached prefix) starts, not before lo */
/* ---- penalties and logprobs drawn "on the backend" ------------------------------------------------------------
 * A mock that implements ops->sample's whole contract on the host as a device backend must: each row's penalty
 * entries applied to a copy of its logits (tm_sampler_pen_apply, the operations the cuda kernel performs), the
 * argmax of the result (these requests are greedy), and the logprobs of the logits before penalties. The engine
 * must then give every request the tokens and logprobs the host sampler gives it. */
static int g_full_pen_rows, g_full_lp_rows, g_full_calls;
static tm_sample_lp g_slot_lp[2][64];

static int g_full_chained_pen_rows;
/* prev: the previous pass's ids (a pipelined row's pen_src reads them), or NULL */
static void full_draw(const float *logits, int32_t n_rows, int32_t vocab, const tm_sample_set *set,
                      const int32_t *prev, int32_t *out, tm_sample_lp *lp) {
    float *x = malloc((size_t)vocab * sizeof *x);
    tm_sample_pen *ent = malloc(((size_t)set->n_pen + 1) * sizeof *ent);
    int32_t *ids = malloc((size_t)n_rows * sizeof *ids);
    assert_true(x && ent && ids);
    g_full_calls++;
    for (int32_t r = 0; r < n_rows; r++) {
        const tm_sample_row *w = &set->rows[r];
        const float *raw = logits + (size_t)r * (size_t)vocab;
        memcpy(x, raw, (size_t)vocab * sizeof *x);
        size_t n = (size_t)w->pen_n;
        assert_true(w->pen_first >= 0 && w->pen_first + w->pen_n <= set->n_pen);
        if (n > 0) memcpy(ent, set->pen + w->pen_first, n * sizeof *ent);
        const tm_sampling_params p = {.repeat_penalty = w->repeat_penalty, .presence_penalty = w->presence_penalty,
                                      .frequency_penalty = w->frequency_penalty};
        if (w->pen_src >= 0) { /* the id in flight ends the history (backend.h) */
            assert_non_null(prev);
            n = tm_sampler_pen_merge(&p, ent, n, prev[w->pen_src]);
            g_full_chained_pen_rows++;
        }
        if (n > 0) {
            g_full_pen_rows++;
            tm_sampler_pen_apply(&p, x, ent, n);
        }
        assert_true(w->temperature == 0.0f);
        int32_t best = 0;
        for (int32_t j = 1; j < vocab; j++)
            if (x[j] > x[best]) best = j;
        ids[r] = best;
        if (!set->logprobs || w->n_logprobs <= 0) continue;
        g_full_lp_rows++;
        double m = raw[0], z = 0.0;
        for (int32_t j = 1; j < vocab; j++) m = raw[j] > m ? raw[j] : m;
        for (int32_t j = 0; j < vocab; j++) z += exp((double)raw[j] - m);
        const double lz = log(z);
        lp[r].chosen = (float)(((double)raw[best] - m) - lz);
        for (int32_t t = 0; t < w->n_logprobs; t++) { /* the t-th best by logit, ties to the lower id */
            int32_t b = -1;
            for (int32_t j = 0; j < vocab; j++) {
                bool taken = false;
                for (int32_t u = 0; u < t; u++) taken |= lp[r].top_id[u] == j;
                if (!taken && (b < 0 || raw[j] > raw[b])) b = j;
            }
            lp[r].top_id[t] = b;
            lp[r].top_lp[t] = (float)(((double)raw[b] - m) - lz);
        }
    }
    memcpy(out, ids, (size_t)n_rows * sizeof *ids); /* out may be prev */
    free(x);
    free(ent);
    free(ids);
}
static tm_status full_sample(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                             const tm_sample_set *set, int32_t *out, tm_sample_lp *lp, tm_error *err) {
    (void)be;
    (void)err;
    full_draw(logits, n_rows, vocab, set, NULL, out, lp);
    return TM_OK;
}
static tm_status full_sample_start(tm_backend *be, const void *logits, int32_t n_rows, int32_t vocab,
                                   const tm_sample_set *set, int32_t slot, tm_error *err) {
    (void)be;
    (void)err;
    assert_true(n_rows >= 1 && n_rows <= 64);
    g_pipe_launches++;
    full_draw(logits, n_rows, vocab, set, g_dev_ids, g_dev_ids, g_slot_lp[slot]);
    memcpy(g_slot_ids[slot], g_dev_ids, (size_t)n_rows * sizeof(int32_t));
    return TM_OK;
}
static tm_status full_ids_wait(tm_backend *be, int32_t slot, int32_t n_rows, int32_t *out, tm_sample_lp *lp,
                               tm_error *err) {
    (void)be;
    (void)err;
    memcpy(out, g_slot_ids[slot], (size_t)n_rows * sizeof(int32_t));
    if (lp) memcpy(lp, g_slot_lp[slot], (size_t)n_rows * sizeof(tm_sample_lp));
    return TM_OK;
}

typedef struct lp_out {
    int32_t ids[16];
    float lp[16];
    tm_logprob top[16][3];
    int n;
} lp_out;
static bool lp_cb(void *user, const tm_gen_event *ev) {
    lp_out *o = user;
    if (ev->token < 0 || o->n >= 16) return true;
    o->ids[o->n] = ev->token;
    o->lp[o->n] = ev->chosen.logprob;
    for (int32_t t = 0; t < ev->n_top && t < 3; t++) o->top[o->n][t] = ev->top[t];
    o->n++;
    return true;
}

/* mode 0: the host sampler; 1: the mock, one step at a time; 2: the mock with pipelined steps */
static void full_run(const tm_model *m, int mode, lp_out *out) {
    tm_error err;
    tm_engine_cfg cfg = {.runner = {.n_threads = 2, .n_ctx = 64, .max_batch_tokens = 32, .n_seqs = 5},
                         .sched = {.max_batched_tokens = 32, .max_seqs = 5}};
    tm_engine *e = NULL;
    assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
    const tm_backend_ops *orig = e->runner->be->ops;
    tm_backend_ops ops = *orig;
    g_pipe_cpu = orig;
    g_pipe_batch = NULL;
    if (mode > 0) {
        ops.argmax = cpu_argmax;
        ops.sample = full_sample;
    }
    if (mode == 2) {
        ops.begin_step = pipe_begin;
        ops.end_step = pipe_end;
        ops.embed = pipe_embed;
        ops.argmax_start = pipe_argmax_start;
        ops.sample_start = full_sample_start;
        ops.ids_wait = full_ids_wait;
    }
    e->runner->be->ops = &ops;
    e->pipeline = mode == 2;
    int32_t prompt[5][6];
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < 6; i++) prompt[k][i] = (k * 17 + i * 5 + 2) % m->hp.n_vocab;
    for (int k = 0; k < 5; k++) {
        tm_gen_params gp = {.sampling = tm_sampling_default(), .max_tokens = 14, .ignore_eos = true};
        tm_sampling_params *sp = &gp.sampling;
        sp->temperature = 0.0f;
        if (k == 0) sp->repeat_penalty = 3.0f, sp->repeat_last_n = 6;
        if (k == 1) sp->presence_penalty = 1.5f, sp->frequency_penalty = 0.75f;
        if (k == 2) sp->n_logprobs = 3;
        if (k == 3) sp->repeat_penalty = 2.0f, sp->repeat_last_n = -1, sp->n_logprobs = 2;
        /* k == 4: plain greedy, next to them */
        assert_int_equal(tm_engine_add(e, prompt[k], 6, &gp, lp_cb, &out[k], NULL, &err), TM_OK);
    }
    while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    assert_int_equal(e->runner->n_pending, 0);
    e->runner->be->ops = orig;
    tm_engine_free(e);
}

static void test_engine_penalties_logprobs_on_backend(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    tm_model *m = load_tiny(&o);
    lp_out out[3][5];
    memset(out, 0, sizeof out);
    full_run(m, 0, out[0]);
    assert_int_equal(g_full_calls, 0);
    full_run(m, 1, out[1]);
    assert_true(g_full_pen_rows > 0 && g_full_lp_rows > 0);
    const int calls1 = g_full_calls;
    g_pipe_launches = 0;
    full_run(m, 2, out[2]);
    assert_true(g_full_calls > calls1);
    assert_true(g_pipe_launches > 0);
    assert_true(g_full_chained_pen_rows > 0); /* penalty rows were queued behind their token in flight */
    for (int k = 0; k < 5; k++) assert_int_equal(out[0][k].n, 14);
    /* the penalties change what greedy decoding picks (else this test could not see them dropped) */
    assert_memory_not_equal(out[0][0].ids, out[0][4].ids, sizeof out[0][0].ids);
    for (int mode = 1; mode < 3; mode++)
        for (int k = 0; k < 5; k++) {
            assert_int_equal(out[mode][k].n, 14);
            assert_memory_equal(out[mode][k].ids, out[0][k].ids, sizeof out[0][k].ids);
            for (int i = 0; i < 14; i++) {
                assert_true(fabsf(out[mode][k].lp[i] - out[0][k].lp[i]) < 1e-5f);
                for (int t = 0; t < 3; t++) {
                    assert_int_equal(out[mode][k].top[i][t].id, out[0][k].top[i][t].id);
                    assert_true(fabsf(out[mode][k].top[i][t].logprob - out[0][k].top[i][t].logprob) < 1e-5f);
                }
            }
        }
    /* logprob requests did report something: a chosen logprob below 0 and top ids in the vocabulary */
    assert_true(out[0][2].lp[0] < 0.0f && out[0][2].top[0][0].id >= 0 && out[0][3].top[5][1].id >= 0);
    tm_model_free(m);
}

static void test_batch_fresh_from(void **state) {
    (void)state;
    /* decode token, a chunk continued from an earlier step, then three fresh prompts (the last one cut short) */
    const int32_t qs[] = {0, 1, 9, 13, 20, 23}, ctx[] = {40, 17, 4, 7, 3};
    tm_batch b = {.n_seqs = 5, .query_start = qs, .context_len = ctx};
    assert_int_equal(tm_batch_fresh_from(&b, 0), 2);
    assert_int_equal(tm_batch_fresh_from(&b, 1), 2);
    assert_int_equal(tm_batch_fresh_from(&b, 3), 3); /* not before lo */
    assert_int_equal(tm_batch_fresh_from(&b, 5), 5); /* nothing at or after lo */
    assert_int_equal(tm_batch_fresh_from(&b, -2), 2);
    /* a prefixed sequence after fresh ones: only what follows it counts */
    const int32_t ctx2[] = {1, 8, 4, 9, 3};
    b.context_len = ctx2;
    assert_int_equal(tm_batch_fresh_from(&b, 0), 4);
    /* the last sequence has a prefix: none */
    const int32_t ctx3[] = {1, 8, 4, 7, 5};
    b.context_len = ctx3;
    assert_int_equal(tm_batch_fresh_from(&b, 0), 5);
    /* every sequence fresh */
    const int32_t ctx4[] = {1, 8, 4, 7, 3};
    b.context_len = ctx4;
    assert_int_equal(tm_batch_fresh_from(&b, 0), 0);
}

/* The logits rows: a batch that wants every row in order (a decode step) projects xb itself, any other index goes
 * through the row gather; the rows are the same either way. */
static void test_logits_rows(void **state) {
    (void)state;
    const int32_t idx[] = {0, 1, 2, 3}, rev[] = {3, 2, 1, 0}, last[] = {3};
    tm_batch b = {.n_tokens = 4, .n_logits = 4, .logits_index = idx};
    assert_true(tm_batch_logits_all(&b));
    b.logits_index = rev;
    assert_false(tm_batch_logits_all(&b));
    b.logits_index = idx;
    b.n_logits = 3; /* a prefix of the rows */
    assert_false(tm_batch_logits_all(&b));

    tiny_opts o = tiny_default();
    tm_model *m = load_tiny(&o);
    hook_be *h = hook_create();
    tm_error err;
    const int32_t n = 4, V = m->hp.n_vocab;
    tm_workspace ws;
    assert_int_equal(tm_workspace_init(&ws, m, &h->base, n, n, &err), TM_OK);
    tm_kv_cfg kc = {m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim, 16, 4, TM_DT_F32};
    int32_t ids[4] = {5, 17, 2, 9}, pos[4], seq[4], qs[2] = {0, n}, ctx[1] = {n}, bt[4] = {0, 1, 2, 3};
    int64_t slots[4];
    for (int32_t i = 0; i < n; i++) pos[i] = i, seq[i] = 0, slots[i] = i;
    float *all = malloc(sizeof(float) * (size_t)(n * V)), *got = malloc(sizeof(float) * (size_t)(n * V));
    const int32_t *orders[3] = {idx, rev, last};
    const int32_t counts[3] = {4, 4, 1};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(h->base.ops->kv_init(&h->base, &kc, &err), TM_OK); /* the same cache state each pass */
        tm_batch p = {.n_tokens = n, .token_ids = ids, .positions = pos, .seq_index = seq, .n_seqs = 1,
                      .query_start = qs, .context_len = ctx, .max_blocks = 4, .block_table = bt,
                      .slot_mapping = slots, .n_logits = counts[k], .logits_index = orders[k]};
        h->gathers = 0;
        assert_int_equal(tm_model_forward(m, &h->base, &ws, &p, k == 0 ? all : got, &err), TM_OK);
        assert_int_equal(h->gathers, k == 0 ? 0 : 1);
        for (int32_t r = 0; k > 0 && r < counts[k]; r++)
            assert_memory_equal(got + (size_t)r * V, all + (size_t)orders[k][r] * V, sizeof(float) * (size_t)V);
    }
    free(all);
    free(got);
    tm_workspace_free(&ws, &h->base);
    h->base.ops->free(&h->base);
    tm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_rows),
        cmocka_unit_test(test_device_parse),
        cmocka_unit_test(test_batch_fresh_from),
        cmocka_unit_test(test_placed_model_forward_is_identical),
        cmocka_unit_test(test_grouped_placement),
        cmocka_unit_test(test_whole_layers),
        cmocka_unit_test(test_tp_ranks_agree),
        cmocka_unit_test(test_deferred_dummy_weights),
        cmocka_unit_test(test_engine_argmax_on_backend),
        cmocka_unit_test(test_engine_pipelined),
        cmocka_unit_test(test_engine_penalties_logprobs_on_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
