/* tm_runner.c -- batch building over the paged KV cache and forward passes. */
#include "tm_runner.h"

#include "model/tm_tp.h"

#include <stdlib.h>

tm_status tm_device_parse(const char *spec, tm_device *dev, int32_t *ordinal, tm_error *err) {
    *dev = TM_DEVICE_CPU;
    *ordinal = 0;
    if (!spec || !*spec || !strcmp(spec, "cpu")) return TM_OK;
    if (!strncmp(spec, "cuda", 4) && (spec[4] == 0 || spec[4] == ':')) {
        *dev = TM_DEVICE_CUDA;
        if (spec[4] == ':') {
            char *end;
            long v = strtol(spec + 5, &end, 10);
            if (end == spec + 5 || *end || v < 0 || v > 64)
                return tm_err(err, TM_ERR_INVALID, "bad device '%s' (cpu, cuda or cuda:N)", spec);
            *ordinal = (int32_t)v;
        }
        return TM_OK;
    }
    return tm_err(err, TM_ERR_INVALID, "unknown device '%s' (cpu, cuda or cuda:N)", spec);
}

tm_status tm_runner_load_model(const char *spec, tm_device dev, int32_t tp, tm_model **out, tm_error *err) {
    tm_model_load_opts lo = {.defer_dummy = dev == TM_DEVICE_CUDA && tp <= 1 && !getenv("TM_DUMMY_HOST")};
    return tm_model_load_ex(spec, &lo, out, err);
}

bool tm_kv_dtype_parse(const char *s, tm_kv_dtype *out) {
    static const struct { const char *name; tm_kv_dtype k; } names[] = {
        {"auto", TM_KV_AUTO}, {"f32", TM_KV_F32}, {"f16", TM_KV_F16}, {"bf16", TM_KV_BF16},
        {"fp8", TM_KV_FP8},   {"fp8_e4m3", TM_KV_FP8},
    };
    if (!s) {
        *out = TM_KV_AUTO;
        return true;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].k;
            return true;
        }
    return false;
}

tm_dtype tm_kv_dtype_resolve(tm_kv_dtype k, tm_device dev) {
    switch (k) {
    case TM_KV_F32: return TM_DT_F32;
    case TM_KV_F16: return TM_DT_F16;
    case TM_KV_BF16: return TM_DT_BF16;
    case TM_KV_FP8: return TM_DT_FP8_E4M3;
    default: return dev == TM_DEVICE_CUDA ? TM_DT_BF16 : TM_DT_F16;
    }
}

tm_status tm_runner_create(const tm_model *m, const tm_runner_cfg *cfg_in, tm_runner **out, tm_error *err) {
    *out = NULL;
    tm_runner_cfg cfg = *cfg_in;
    if (cfg.n_threads <= 0) cfg.n_threads = tm_cpu_count();
    if (cfg.n_ctx <= 0) cfg.n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    if (cfg.max_batch_tokens <= 0) cfg.max_batch_tokens = 512;
    if (cfg.block_size <= 0) cfg.block_size = 16;
    if (cfg.n_seqs <= 0) cfg.n_seqs = 1;
    if (cfg.n_ctx > m->hp.n_ctx_train)
        return tm_err(err, TM_ERR_RANGE, "context %d is larger than the model's %d", cfg.n_ctx, m->hp.n_ctx_train);
    if (cfg.block_size > 256 || cfg.max_batch_tokens > 65536 || cfg.n_seqs > 4096 || cfg.n_threads > 1024)
        return tm_err(err, TM_ERR_RANGE, "runner limits exceeded (block %d, batch %d, seqs %d, threads %d)",
                      cfg.block_size, cfg.max_batch_tokens, cfg.n_seqs, cfg.n_threads);
    if (cfg.tp > TM_TP_MAX_RANKS) return tm_err(err, TM_ERR_RANGE, "--tp %d: at most %d ranks", cfg.tp, TM_TP_MAX_RANKS);
    tm_runner *r = tm_calloc(1, sizeof *r);
    if (!r) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    r->model = m;
    r->cfg = cfg;
    r->max_seqs = cfg.max_batch_tokens < cfg.n_seqs ? cfg.max_batch_tokens : cfg.n_seqs;
    /* logits rows: one per sequence, rounded up to 32 so a device backend can pad a decode step into a graph */
    int32_t max_logits = (r->max_seqs + 31) / 32 * 32;
    if (max_logits > cfg.max_batch_tokens) max_logits = cfg.max_batch_tokens;
    /* One rank, or one per tensor-parallel shard: rank rk has a backend (GPU cuda_device + rk, or its share of
     * the cpu threads), its model (the shard, or the whole model) placed in that backend's memory on a GPU, and a
     * workspace (rank 0's is r->ws). */
    const int32_t R = cfg.tp > 1 ? cfg.tp : 1;
    const bool cuda = cfg.device == TM_DEVICE_CUDA;
    tm_status s;
    if (tm_model_has_deferred(m) && (!cuda || R > 1)) {
        s = cuda ? tm_err(err, TM_ERR_UNSUPPORTED, "--tp needs the weights on the host to shard them (dummy weights "
                                                   "made on the device cannot be sharded yet)")
                 : tm_err(err, TM_ERR_INVALID, "the model's dummy weights were left for a device backend to make");
        goto fail;
    }
    for (int32_t rk = 0; rk < R; rk++) {
        tm_backend *be = NULL;
        const tm_model *rm = m;
        if (R > 1) {
            if ((s = tm_tp_shard_model(m, R, rk, &r->tp_shard[rk], err)) != TM_OK) goto fail;
            rm = r->tp_shard[rk];
        }
        if (cuda) { /* under tensor parallelism each backend is driven by its rank's thread and the runner's */
            tm_cuda_cfg cc = {.device = cfg.cuda_device + rk, .max_tokens = cfg.max_batch_tokens,
                              .max_logits = max_logits, .no_graphs = cfg.no_graphs, .shared_thread = R > 1};
            s = tm_backend_cuda_create(&cc, &be, err);
        } else {
            tm_cpu_cfg cc = {cfg.n_threads / R > 0 ? cfg.n_threads / R : 1, cfg.act_bits};
            s = tm_backend_cpu_create(&cc, &be, err);
        }
        if (s != TM_OK) goto fail;
        if (rk == 0) r->be = be;
        else r->tp_be[rk] = be;
        if (be->ops->weight_place) { /* cuda: weights to the GPU; cpu: the decode layout beside them */
            if ((s = tm_model_place(rm, be, &r->tp_placed[rk], err)) != TM_OK) goto fail;
            rm = r->tp_placed[rk];
        }
        if (rk == 0) r->model = rm;
        else if ((s = tm_workspace_init(&r->tp_ws[rk], rm, be, cfg.max_batch_tokens, max_logits, err)) != TM_OK)
            goto fail;
    }
    if (R > 1) { /* the rank threads and the all-reduce: NCCL between GPUs, a shared-memory sum between cpu ranks */
        tm_backend *bes[TM_TP_MAX_RANKS];
        for (int32_t rk = 0; rk < R; rk++) bes[rk] = rk ? r->tp_be[rk] : r->be;
        if ((s = tm_threadpool_create(R, &r->tp_threads, err)) != TM_OK) goto fail;
        s = cuda ? tm_cuda_tp_create(R, bes, &r->cuda_tp, err) : tm_tp_host_reduce_create(R, &r->tp_host, err);
        if (s != TM_OK) goto fail;
    }
    if ((s = tm_workspace_init(&r->ws, r->model, r->be, cfg.max_batch_tokens, max_logits, err)) != TM_OK) goto fail;
    r->max_blocks = (cfg.n_ctx + cfg.block_size - 1) / cfg.block_size;
    int64_t n_blocks = cfg.kv_blocks > 0 ? cfg.kv_blocks : (int64_t)r->max_blocks * cfg.n_seqs;
    tm_dtype kv_type = tm_kv_dtype_resolve(cfg.kv_dtype, cfg.device);
    if (cfg.device == TM_DEVICE_CUDA && cfg.kv_blocks <= 0 && r->be->ops->mem_free) {
        /* what the device has left after weights and activations, less a margin, bounds the pool */
        /* every rank holds its share of the KV heads (r->model is rank 0's shard): the fullest GPU bounds it */
        uint64_t free_b = r->be->ops->mem_free(r->be), margin = (uint64_t)2 << 30;
        for (int32_t rk = 1; rk < R; rk++) {
            uint64_t f = r->tp_be[rk]->ops->mem_free(r->tp_be[rk]);
            if (f < free_b) free_b = f;
        }
        uint64_t per_block = 2ull * (uint64_t)m->hp.n_layers * (uint64_t)r->model->hp.n_kv_heads *
                             (uint64_t)m->hp.head_dim * (uint64_t)cfg.block_size * tm_dtype_row_bytes(kv_type, 1);
        uint64_t fit = free_b > margin ? (uint64_t)((double)(free_b - margin) * 0.92) / per_block : 0;
        if ((uint64_t)n_blocks > fit) n_blocks = (int64_t)fit;
        if (n_blocks < r->max_blocks) {
            s = tm_err(err, TM_ERR_NOMEM, "device memory holds %lld KV blocks, fewer than one %d-token context",
                       (long long)n_blocks, cfg.n_ctx);
            goto fail;
        }
    }
    if (n_blocks > INT32_MAX) { s = tm_err(err, TM_ERR_RANGE, "KV pool too large"); goto fail; }
    tm_kv_pool_cfg pc = {(int32_t)n_blocks, cfg.block_size, cfg.no_prefix_cache, 0};
    if ((s = tm_kv_pool_init_cfg(&r->pool, &pc, err)) != TM_OK) goto fail;
    tm_kv_cfg kc = {m->hp.n_layers, r->model->hp.n_kv_heads, m->hp.head_dim, cfg.block_size, (int32_t)n_blocks, kv_type};
    if ((s = r->be->ops->kv_init(r->be, &kc, err)) != TM_OK) goto fail;
    for (int32_t rk = 1; rk < cfg.tp; rk++) /* each rank caches its own KV heads */
        if ((s = r->tp_be[rk]->ops->kv_init(r->tp_be[rk], &kc, err)) != TM_OK) goto fail;
    size_t T = (size_t)cfg.max_batch_tokens;
    /* a host backend's logits buffer is host memory already: the runner reads it in place (no copy per step) */
    r->logits_borrowed = cfg.device == TM_DEVICE_CPU;
    r->logits = r->logits_borrowed ? (float *)r->ws.logits
                                   : tm_malloc_array((size_t)max_logits * (size_t)m->hp.n_vocab, sizeof(float));
    r->greedy = tm_malloc_array((size_t)max_logits, sizeof(int32_t));
    r->sample_rows = tm_malloc_array((size_t)max_logits, sizeof(tm_sample_row));
    r->sample_lp = tm_malloc_array((size_t)max_logits, sizeof(tm_sample_lp));
    r->host_sampling = getenv("TM_HOST_SAMPLING") && !strcmp(getenv("TM_HOST_SAMPLING"), "1");
    r->b_ids = tm_malloc_array(T, sizeof(int32_t));
    r->b_src = tm_malloc_array(T, sizeof(int32_t));
    r->b_pos = tm_malloc_array(T, sizeof(int32_t));
    r->b_seq = tm_malloc_array(T, sizeof(int32_t));
    r->b_logits_idx = tm_malloc_array(T, sizeof(int32_t));
    r->b_slots = tm_malloc_array(T, sizeof(int64_t));
    r->b_qstart = tm_malloc_array((size_t)r->max_seqs + 1, sizeof(int32_t));
    r->b_ctx = tm_malloc_array((size_t)r->max_seqs, sizeof(int32_t));
    r->b_last = tm_malloc_array((size_t)r->max_seqs, sizeof(int32_t));
    r->b_btab = tm_malloc_array((size_t)r->max_seqs * (size_t)r->max_blocks, sizeof(int32_t));
    if (!r->logits || !r->greedy || !r->sample_rows || !r->sample_lp || !r->b_ids || !r->b_src || !r->b_pos ||
        !r->b_seq || !r->b_logits_idx || !r->b_slots || !r->b_qstart ||
        !r->b_ctx || !r->b_last || !r->b_btab) {
        s = tm_err(err, TM_ERR_NOMEM, "out of memory allocating batch buffers");
        goto fail;
    }
    *out = r;
    return TM_OK;
fail:
    tm_runner_free(r);
    return s;
}

void tm_runner_free(tm_runner *r) {
    if (!r) return;
    tm_threadpool_free(r->tp_threads); /* first: no rank thread runs below */
    if (r->be) {
        tm_workspace_free(&r->ws, r->be);
        tm_model_unplace(r->tp_placed[0], r->be);
        r->be->ops->free(r->be);
    }
    for (int32_t rk = 0; rk < TM_TP_MAX_RANKS; rk++) {
        if (r->tp_be[rk]) {
            tm_workspace_free(&r->tp_ws[rk], r->tp_be[rk]);
            tm_model_unplace(r->tp_placed[rk], r->tp_be[rk]);
            r->tp_be[rk]->ops->free(r->tp_be[rk]);
        }
        tm_tp_shard_free(r->tp_shard[rk]);
    }
    /* the communicators after the backends: the decode graphs hold collectives of theirs */
    tm_cuda_tp_free(r->cuda_tp);
    tm_tp_host_reduce_free(r->tp_host);
    tm_kv_pool_free(&r->pool);
    if (!r->logits_borrowed) free(r->logits);
    free(r->greedy);
    free(r->sample_rows);
    free(r->sample_lp);
    free(r->sample_pen);
    free(r->b_ids);
    free(r->b_src);
    free(r->b_pos);
    free(r->b_seq);
    free(r->b_logits_idx);
    free(r->b_slots);
    free(r->b_qstart);
    free(r->b_ctx);
    free(r->b_last);
    free(r->b_btab);
    free(r);
}

tm_status tm_runner_pen_reserve(tm_runner *r, int32_t n, tm_error *err) {
    if (n < 0 || n > INT32_MAX - r->n_sample_pen) return tm_err(err, TM_ERR_RANGE, "%d penalty entries", n);
    int32_t need = r->n_sample_pen + n;
    if (need <= r->cap_sample_pen) return TM_OK;
    int32_t cap = r->cap_sample_pen > 0 ? r->cap_sample_pen : 256;
    while (cap < need) cap = cap > INT32_MAX / 2 ? need : 2 * cap;
    tm_sample_pen *p = realloc(r->sample_pen, (size_t)cap * sizeof *p);
    if (!p) return tm_err(err, TM_ERR_NOMEM, "out of memory for %d penalty entries", cap);
    r->sample_pen = p;
    r->cap_sample_pen = cap;
    return TM_OK;
}

bool tm_runner_can_argmax(const tm_runner *r) { return !r->host_sampling && r->be->ops->argmax != NULL; }
bool tm_runner_can_sample(const tm_runner *r) { return !r->host_sampling && r->be->ops->sample != NULL; }

/* The step's ragged batch in the staging buffers. src_row (n_seqs) or NULL: where src_row[k] >= 0, sequence k's one
 * new token is that row of the previous pipelined pass's ids (its id here is a placeholder). */
static tm_status build_batch(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                             const bool *want_logits, int32_t n_seqs, const int32_t *src_row, tm_batch *out,
                             tm_error *err) {
    if (n_seqs < 1 || n_seqs > r->max_seqs)
        return tm_err(err, TM_ERR_RANGE, "step with %d sequences (limit %d)", n_seqs, r->max_seqs);
    int32_t n = 0, nl = 0;
    r->b_qstart[0] = 0;
    /* Sequences that decode one token go first, then prefill chunks: a device backend runs decode attention on
     * that prefix and prefill attention on the rest. Logits rows stay in the caller's order. */
    int32_t bk = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t k = 0; k < n_seqs; k++) {
            if ((n_new[k] == 1) != (pass == 0)) continue;
            tm_kv_seq *s = seqs[k];
            if (n_new[k] < 1 || n_new[k] > r->cfg.max_batch_tokens - n)
                return tm_err(err, TM_ERR_RANGE, "step of more than %d tokens", r->cfg.max_batch_tokens);
            int32_t ctx = s->n_tokens + n_new[k];
            if (ctx > r->cfg.n_ctx)
                return tm_err(err, TM_ERR_RANGE, "sequence of %d tokens exceeds the context %d", ctx, r->cfg.n_ctx);
            if ((int64_t)s->n_blocks * r->pool.block_size < ctx)
                return tm_err(err, TM_ERR_INTERNAL, "KV blocks not reserved for %d tokens", ctx);
            bool chained = src_row && src_row[k] >= 0;
            for (int32_t j = 0; j < n_new[k]; j++, n++) {
                int32_t c = s->n_tokens + j;
                r->b_ids[n] = chained ? 0 : new_ids[k][j];
                r->b_src[n] = chained ? src_row[k] : -1;
                r->b_pos[n] = c;
                r->b_seq[n] = bk;
                r->b_slots[n] = tm_kv_seq_slot(&r->pool, s, c);
            }
            r->b_qstart[bk + 1] = n;
            r->b_ctx[bk] = ctx;
            memcpy(r->b_btab + (size_t)bk * (size_t)r->max_blocks, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
            r->b_last[k] = n - 1;
            bk++;
        }
    for (int32_t k = 0; k < n_seqs; k++)
        if (want_logits[k]) r->b_logits_idx[nl++] = r->b_last[k];
    *out = (tm_batch){
        .n_tokens = n, .token_ids = r->b_ids, .positions = r->b_pos, .seq_index = r->b_seq, .n_seqs = n_seqs,
        .query_start = r->b_qstart, .context_len = r->b_ctx, .max_blocks = r->max_blocks, .block_table = r->b_btab,
        .slot_mapping = r->b_slots, .n_logits = nl, .logits_index = r->b_logits_idx,
        .token_src = src_row ? r->b_src : NULL,
    };
    return TM_OK;
}

/* The next step's sampling inputs (sample_rows, sample_pen, sample_logprobs), taken: the flags are for one step */
static tm_sample_set take_sampling(tm_runner *r) {
    const tm_sample_set set = {r->sample_rows, r->sample_pen, r->n_sample_pen, r->sample_logprobs};
    r->n_sample_pen = 0;
    r->sample_logprobs = false;
    return set;
}

/* The forward pass of b (its time added to pass_s); logits to r->logits unless the ids are drawn on the backend
 * (argmax or sample). slot < 0: the ids are waited for (r->greedy); slot 0/1: only queued, for tm_runner_collect. */
static tm_status run_pass(tm_runner *r, const tm_batch *b, bool dev_argmax, bool dev_sample,
                          const tm_sample_set *set, int32_t slot, tm_error *err) {
    const tm_backend_ops *op = r->be->ops;
    int32_t nl = b->n_logits, vocab = r->model->hp.n_vocab;
    const double t_pass = tm_time_s();
    tm_status st;
    if (r->cfg.tp > 1) {
        tm_tp_rank ranks[TM_TP_MAX_RANKS];
        for (int32_t rk = 0; rk < r->cfg.tp; rk++)
            ranks[rk] = (tm_tp_rank){rk ? (r->tp_placed[rk] ? r->tp_placed[rk] : r->tp_shard[rk]) : r->model,
                                     rk ? r->tp_be[rk] : r->be, rk ? &r->tp_ws[rk] : &r->ws};
        tm_tp_group g = {r->cfg.tp, ranks, r->cuda_tp ? tm_cuda_tp_allreduce : tm_tp_allreduce_host,
                         r->cuda_tp ? (void *)r->cuda_tp : (void *)r->tp_host, r->tp_threads};
        st = tm_tp_forward(&g, b, dev_argmax || dev_sample ? NULL : r->logits, err); /* rank 0 holds the logits */
        if (st == TM_OK && r->cuda_tp) st = tm_cuda_tp_last_error(r->cuda_tp, err);
    } else {
        st = tm_model_forward(r->model, r->be, &r->ws, b, dev_argmax || dev_sample ? NULL : r->logits, err);
    }
    if (st == TM_OK && slot >= 0)
        st = dev_argmax ? op->argmax_start(r->be, r->ws.logits, nl, vocab, slot, err)
                        : op->sample_start(r->be, r->ws.logits, nl, vocab, set, slot, err);
    else if (st == TM_OK && dev_argmax)
        st = op->argmax(r->be, r->ws.logits, nl, vocab, r->greedy, err);
    else if (st == TM_OK && dev_sample)
        st = op->sample(r->be, r->ws.logits, nl, vocab, set, r->greedy, r->sample_lp, err);
    r->pass_s += tm_time_s() - t_pass;
    return st;
}

/* The pass wrote the entries of the new tokens: record their ids (full blocks become shareable prefix-cache blocks);
 * a chained token's (src_row[k] >= 0) id comes when the pass that samples it is collected */
static tm_status enter_tokens(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                              int32_t n_seqs, const int32_t *src_row, tm_error *err) {
    for (int32_t k = 0; k < n_seqs; k++) {
        bool chained = src_row && src_row[k] >= 0;
        tm_status st = chained ? tm_kv_seq_advance(&r->pool, seqs[k], n_new[k], err)
                               : tm_kv_seq_append_tokens(&r->pool, seqs[k], new_ids[k], n_new[k], err);
        if (st != TM_OK) return st;
    }
    return TM_OK;
}

tm_status tm_runner_step(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                         const bool *want_logits, int32_t n_seqs, tm_error *err) {
    bool want_argmax = r->greedy_on_device, want_sample = r->sample_on_device;
    r->greedy_on_device = r->sample_on_device = false; /* one step only: the next caller gets logits */
    const tm_sample_set set = take_sampling(r);
    if (r->n_pending > 0)
        return tm_err(err, TM_ERR_INVALID, "a step while %d pipelined passes are pending", r->n_pending);
    tm_batch b;
    tm_status st = build_batch(r, seqs, new_ids, n_new, want_logits, n_seqs, NULL, &b, err);
    if (st != TM_OK) return st;
    bool dev_argmax = want_argmax && r->be->ops->argmax && b.n_logits > 0;
    bool dev_sample = !dev_argmax && want_sample && r->be->ops->sample && b.n_logits > 0;
    if ((st = run_pass(r, &b, dev_argmax, dev_sample, &set, -1, err)) != TM_OK) return st;
    return enter_tokens(r, seqs, new_ids, n_new, n_seqs, NULL, err);
}

bool tm_runner_can_pipeline(const tm_runner *r) {
    const tm_backend_ops *op = r->be->ops;
    return r->cfg.tp <= 1 && op->argmax_start && op->sample_start && op->ids_wait;
}

tm_status tm_runner_launch(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                           const bool *want_logits, int32_t n_seqs, const int32_t *src_row, tm_error *err) {
    bool want_argmax = r->greedy_on_device, want_sample = r->sample_on_device;
    r->greedy_on_device = r->sample_on_device = false;
    const tm_sample_set set = take_sampling(r);
    if (!tm_runner_can_pipeline(r)) return tm_err(err, TM_ERR_UNSUPPORTED, "the backend cannot pipeline steps");
    if (r->n_pending == 2) return tm_err(err, TM_ERR_INVALID, "two pipelined passes are pending already");
    if (!want_argmax && !want_sample) return tm_err(err, TM_ERR_INVALID, "a pipelined pass samples on the backend");
    if (src_row && r->n_pending == 0) return tm_err(err, TM_ERR_INVALID, "chained tokens without a pending pass");
    tm_batch b;
    tm_status st = build_batch(r, seqs, new_ids, n_new, want_logits, n_seqs, src_row, &b, err);
    if (st != TM_OK) return st;
    if (b.n_logits == 0) return tm_err(err, TM_ERR_INVALID, "a pipelined pass without logits rows");
    if (src_row) /* the rows read must exist in the newest pending pass */
        for (int32_t k = 0; k < n_seqs; k++)
            if (src_row[k] >= r->pend_rows[(r->pend_first + r->n_pending - 1) % 2] ||
                (src_row[k] >= 0 && n_new[k] != 1))
                return tm_err(err, TM_ERR_INVALID, "chained token of sequence %d reads row %d", k, src_row[k]);
    int32_t slot = (r->pend_first + r->n_pending) % 2;
    if ((st = run_pass(r, &b, want_argmax, !want_argmax, &set, slot, err)) != TM_OK) return st;
    r->pend_rows[slot] = b.n_logits;
    r->n_pending++;
    return enter_tokens(r, seqs, new_ids, n_new, n_seqs, src_row, err);
}

tm_status tm_runner_collect(tm_runner *r, int32_t *n_rows, tm_error *err) {
    *n_rows = 0;
    if (r->n_pending == 0) return tm_err(err, TM_ERR_INVALID, "no pipelined pass to collect");
    int32_t slot = r->pend_first;
    r->pend_first = (r->pend_first + 1) % 2;
    r->n_pending--;
    const double t_wait = tm_time_s();
    tm_status st = r->be->ops->ids_wait(r->be, slot, r->pend_rows[slot], r->greedy, r->sample_lp, err);
    r->pass_s += tm_time_s() - t_wait;
    if (st == TM_OK) *n_rows = r->pend_rows[slot];
    return st;
}

/* Run the prompt through the model in chunks; logits of its last token land in r->logits row 0. */
static tm_status prefill(tm_runner *r, tm_kv_seq *seq, const int32_t *prompt, size_t n_prompt, tm_error *err) {
    tm_status s = tm_kv_seq_reserve(&r->pool, seq, (int32_t)n_prompt, err);
    if (s != TM_OK) return s;
    for (size_t done = 0; done < n_prompt;) {
        int32_t chunk = (int32_t)(n_prompt - done < (size_t)r->cfg.max_batch_tokens ? n_prompt - done
                                                                                      : (size_t)r->cfg.max_batch_tokens);
        const int32_t *ids = prompt + done;
        bool last = done + (size_t)chunk == n_prompt;
        if ((s = tm_runner_step(r, &seq, &ids, &chunk, &last, 1, err)) != TM_OK) return s;
        done += (size_t)chunk;
    }
    return TM_OK;
}

tm_status tm_runner_check_prompt(const tm_runner *r, const int32_t *prompt, size_t n_prompt, tm_error *err) {
    if (n_prompt == 0) return tm_err(err, TM_ERR_INVALID, "the prompt is empty");
    if (n_prompt >= (size_t)r->cfg.n_ctx)
        return tm_err(err, TM_ERR_RANGE, "the prompt has %zu tokens but the context is %d", n_prompt, r->cfg.n_ctx);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= r->model->hp.n_vocab)
            return tm_err(err, TM_ERR_RANGE, "prompt token %d outside the vocabulary (%d)", prompt[i], r->model->hp.n_vocab);
    return TM_OK;
}

tm_status tm_runner_prompt_logits(tm_runner *r, const int32_t *prompt, size_t n_prompt, float *out, tm_error *err) {
    r->greedy_on_device = r->sample_on_device = false;
    (void)take_sampling(r);
    tm_status s = tm_runner_check_prompt(r, prompt, n_prompt, err);
    if (s != TM_OK) return s;
    tm_kv_seq seq = {0};
    s = prefill(r, &seq, prompt, n_prompt, err);
    if (s == TM_OK) memcpy(out, r->logits, (size_t)r->model->hp.n_vocab * sizeof(float));
    tm_kv_seq_release(&r->pool, &seq);
    return s;
}
