/* tm_runner.c -- batch building over the paged KV cache, forward passes, and the generation loop. */
#include "tm_runner.h"

#include <stdlib.h>

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
    tm_runner *r = tm_calloc(1, sizeof *r);
    if (!r) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    r->model = m;
    r->cfg = cfg;
    tm_cpu_cfg cc = {cfg.n_threads, cfg.act_bits};
    tm_status s = tm_backend_cpu_create(&cc, &r->be, err);
    if (s != TM_OK) goto fail;
    if ((s = tm_workspace_init(&r->ws, m, r->be, cfg.max_batch_tokens, err)) != TM_OK) goto fail;
    r->max_blocks = (cfg.n_ctx + cfg.block_size - 1) / cfg.block_size;
    int64_t n_blocks = (int64_t)r->max_blocks * cfg.n_seqs;
    if (n_blocks > INT32_MAX) { s = tm_err(err, TM_ERR_RANGE, "KV pool too large"); goto fail; }
    if ((s = tm_kv_pool_init(&r->pool, (int32_t)n_blocks, cfg.block_size, err)) != TM_OK) goto fail;
    tm_kv_cfg kc = {m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim, cfg.block_size, (int32_t)n_blocks, TM_DT_F32};
    if ((s = r->be->ops->kv_init(r->be, &kc, err)) != TM_OK) goto fail;
    size_t T = (size_t)cfg.max_batch_tokens;
    r->max_seqs = cfg.max_batch_tokens < cfg.n_seqs ? cfg.max_batch_tokens : cfg.n_seqs;
    r->logits = tm_malloc_array(T * (size_t)m->hp.n_vocab, sizeof(float));
    r->b_ids = tm_malloc_array(T, sizeof(int32_t));
    r->b_pos = tm_malloc_array(T, sizeof(int32_t));
    r->b_seq = tm_malloc_array(T, sizeof(int32_t));
    r->b_logits_idx = tm_malloc_array(T, sizeof(int32_t));
    r->b_slots = tm_malloc_array(T, sizeof(int64_t));
    r->b_qstart = tm_malloc_array((size_t)r->max_seqs + 1, sizeof(int32_t));
    r->b_ctx = tm_malloc_array((size_t)r->max_seqs, sizeof(int32_t));
    r->b_btab = tm_malloc_array((size_t)r->max_seqs * (size_t)r->max_blocks, sizeof(int32_t));
    if (!r->logits || !r->b_ids || !r->b_pos || !r->b_seq || !r->b_logits_idx || !r->b_slots || !r->b_qstart ||
        !r->b_ctx || !r->b_btab) {
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
    if (r->be) {
        tm_workspace_free(&r->ws, r->be);
        r->be->ops->free(r->be);
    }
    tm_kv_pool_free(&r->pool);
    free(r->logits);
    free(r->b_ids);
    free(r->b_pos);
    free(r->b_seq);
    free(r->b_logits_idx);
    free(r->b_slots);
    free(r->b_qstart);
    free(r->b_ctx);
    free(r->b_btab);
    free(r);
}

tm_status tm_runner_step(tm_runner *r, tm_kv_seq *const *seqs, const int32_t *const *new_ids, const int32_t *n_new,
                         const bool *want_logits, int32_t n_seqs, tm_error *err) {
    if (n_seqs < 1 || n_seqs > r->max_seqs)
        return tm_err(err, TM_ERR_RANGE, "step with %d sequences (limit %d)", n_seqs, r->max_seqs);
    int32_t n = 0, nl = 0;
    r->b_qstart[0] = 0;
    for (int32_t k = 0; k < n_seqs; k++) {
        tm_kv_seq *s = seqs[k];
        if (n_new[k] < 1 || n_new[k] > r->cfg.max_batch_tokens - n)
            return tm_err(err, TM_ERR_RANGE, "step of more than %d tokens", r->cfg.max_batch_tokens);
        int32_t ctx = s->n_tokens + n_new[k];
        if (ctx > r->cfg.n_ctx) return tm_err(err, TM_ERR_RANGE, "sequence of %d tokens exceeds the context %d", ctx, r->cfg.n_ctx);
        if ((int64_t)s->n_blocks * r->pool.block_size < ctx)
            return tm_err(err, TM_ERR_INTERNAL, "KV blocks not reserved for %d tokens", ctx);
        for (int32_t j = 0; j < n_new[k]; j++, n++) {
            int32_t c = s->n_tokens + j;
            r->b_ids[n] = new_ids[k][j];
            r->b_pos[n] = c;
            r->b_seq[n] = k;
            r->b_slots[n] = tm_kv_seq_slot(&r->pool, s, c);
        }
        r->b_qstart[k + 1] = n;
        r->b_ctx[k] = ctx;
        memcpy(r->b_btab + (size_t)k * (size_t)r->max_blocks, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
        if (want_logits[k]) r->b_logits_idx[nl++] = n - 1;
    }
    tm_batch b = {
        .n_tokens = n, .token_ids = r->b_ids, .positions = r->b_pos, .seq_index = r->b_seq, .n_seqs = n_seqs,
        .query_start = r->b_qstart, .context_len = r->b_ctx, .max_blocks = r->max_blocks, .block_table = r->b_btab,
        .slot_mapping = r->b_slots, .n_logits = nl, .logits_index = r->b_logits_idx,
    };
    tm_status st = tm_model_forward(r->model, r->be, &r->ws, &b, r->logits, err);
    if (st != TM_OK) return st;
    for (int32_t k = 0; k < n_seqs; k++) seqs[k]->n_tokens += n_new[k];
    return TM_OK;
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

static tm_status check_prompt(const tm_runner *r, const int32_t *prompt, size_t n_prompt, tm_error *err) {
    if (n_prompt == 0) return tm_err(err, TM_ERR_INVALID, "the prompt is empty");
    if (n_prompt >= (size_t)r->cfg.n_ctx)
        return tm_err(err, TM_ERR_RANGE, "the prompt has %zu tokens but the context is %d", n_prompt, r->cfg.n_ctx);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= r->model->hp.n_vocab)
            return tm_err(err, TM_ERR_RANGE, "prompt token %d outside the vocabulary (%d)", prompt[i], r->model->hp.n_vocab);
    return TM_OK;
}

tm_status tm_runner_prompt_logits(tm_runner *r, const int32_t *prompt, size_t n_prompt, float *out, tm_error *err) {
    tm_status s = check_prompt(r, prompt, n_prompt, err);
    if (s != TM_OK) return s;
    tm_kv_seq seq = {0};
    s = prefill(r, &seq, prompt, n_prompt, err);
    if (s == TM_OK) memcpy(out, r->logits, (size_t)r->model->hp.n_vocab * sizeof(float));
    tm_kv_seq_release(&r->pool, &seq);
    return s;
}

/* ---- output text with stop strings ------------------------------------------------------------- */

typedef struct out_text {
    char *buf;          /* (cap) generated text so far */
    size_t len, cap;
    size_t emitted;     /* bytes already released to the caller */
} out_text;

/* Make room for n more bytes plus a NUL. */
static tm_status out_reserve(out_text *o, size_t n, tm_error *err) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->len + n + 1) cap *= 2;
        char *nb = realloc(o->buf, cap);
        if (!nb) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        o->buf = nb;
        o->cap = cap;
    }
    return TM_OK;
}

/* Append the text of token id (complete UTF-8 only) or, for id < 0, flush a held-back partial sequence. */
static tm_status out_push(out_text *o, const tm_tokenizer *tok, tm_detok *dt, int32_t id, tm_error *err) {
    size_t need = id >= 0 ? tm_detok_bound(tok, dt, id, false) : 3;
    tm_status s = out_reserve(o, need, err);
    if (s != TM_OK) return s;
    size_t n = id >= 0 ? tm_detok_push(tok, dt, id, false, o->buf + o->len, o->cap - o->len - 1)
                       : tm_detok_finish(dt, o->buf + o->len, o->cap - o->len - 1);
    if (n == TM_DETOK_TOO_SMALL) return tm_err(err, TM_ERR_INTERNAL, "detokenizer bound too small");
    o->len += n;
    o->buf[o->len] = '\0';
    return TM_OK;
}

/* Find the first stop string in the unreleased tail; *hold = bytes at the end that may start a stop. */
static bool find_stop(const out_text *o, const tm_gen_params *gp, size_t *stop_at, size_t *hold) {
    size_t maxlen = 0;
    for (size_t i = 0; i < gp->n_stop; i++) {
        size_t L = strlen(gp->stop[i]);
        if (L > maxlen) maxlen = L;
    }
    size_t from = o->emitted > maxlen ? o->emitted - maxlen : 0;
    bool found = false;
    size_t best = o->len;
    for (size_t i = 0; i < gp->n_stop; i++) {
        size_t L = strlen(gp->stop[i]);
        if (L == 0) continue;
        const char *p = memmem(o->buf + from, o->len - from, gp->stop[i], L);
        if (p && (size_t)(p - o->buf) < best) {
            best = (size_t)(p - o->buf);
            found = true;
        }
    }
    *stop_at = best;
    *hold = 0;
    if (found) return true;
    for (size_t i = 0; i < gp->n_stop; i++) {
        size_t L = strlen(gp->stop[i]);
        for (size_t k = L > 1 ? L - 1 : 0; k > *hold; k--) /* longest suffix of buf that is a prefix of stop */
            if (k <= o->len && !memcmp(o->buf + o->len - k, gp->stop[i], k)) {
                *hold = k;
                break;
            }
    }
    return false;
}

tm_status tm_runner_generate(tm_runner *r, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp, tm_gen_cb cb,
                             void *user, tm_gen_stats *stats, tm_error *err) {
    const tm_model *m = r->model;
    memset(stats, 0, sizeof *stats);
    stats->prompt_tokens = (int32_t)n_prompt;
    tm_status s = check_prompt(r, prompt, n_prompt, err);
    if (s != TM_OK) return s;
    if (gp->max_tokens < 0) return tm_err(err, TM_ERR_INVALID, "max_tokens must be >= 0");
    if ((s = tm_sampling_validate(&gp->sampling, err)) != TM_OK) return s;
    tm_sampler *smp = NULL;
    tm_kv_seq seq = {0};
    int32_t *hist = NULL;
    out_text ot = {0};
    tm_logprob top[32];
    int32_t n_vocab = m->hp.n_vocab;
    if ((s = tm_sampler_create(&gp->sampling, n_vocab, &smp, err)) != TM_OK) goto done;
    hist = tm_malloc_array((size_t)gp->max_tokens + 1, sizeof(int32_t));
    if (!hist) { s = tm_err(err, TM_ERR_NOMEM, "out of memory"); goto done; }

    double t0 = tm_time_s();
    if ((s = prefill(r, &seq, prompt, n_prompt, err)) != TM_OK) goto done;
    double t_prefill = tm_time_s();
    stats->prefill_s = t_prefill - t0;
    stats->finish_reason = "length";
    tm_detok dt = {0};
    bool stopped_by_string = false;
    for (int32_t g = 0; g < gp->max_tokens; g++) {
        tm_logprob chosen = {0};
        int32_t tok = tm_sampler_sample(smp, r->logits, hist, (size_t)g, &chosen, top);
        if (g == 0) stats->ttft_s = tm_time_s() - t0;
        if (!gp->ignore_eos && tm_tok_is_eog(m->tok, tok)) {
            stats->finish_reason = "stop";
            break;
        }
        hist[g] = tok;
        stats->gen_tokens = g + 1;
        if ((s = out_push(&ot, m->tok, &dt, tok, err)) != TM_OK) goto done;
        size_t stop_at, hold;
        bool stop = find_stop(&ot, gp, &stop_at, &hold);
        size_t release_to = stop ? stop_at : ot.len - hold;
        if (release_to < ot.emitted) release_to = ot.emitted;
        tm_gen_event ev = {tok, ot.buf + ot.emitted, release_to - ot.emitted, chosen, top, gp->sampling.n_logprobs};
        ot.emitted = release_to;
        bool go_on = cb ? cb(user, &ev) : true;
        if (stop) {
            stats->finish_reason = "stop";
            stopped_by_string = true;
            break;
        }
        if (!go_on) {
            stats->finish_reason = "abort";
            break;
        }
        if (g + 1 == gp->max_tokens) break;
        if (seq.n_tokens + 1 > r->cfg.n_ctx) break; /* context full: "length" */
        if ((s = tm_kv_seq_reserve(&r->pool, &seq, 1, err)) != TM_OK) goto done;
        const int32_t *ids = &tok;
        int32_t one = 1;
        bool want = true;
        tm_kv_seq *sp = &seq;
        if ((s = tm_runner_step(r, &sp, &ids, &one, &want, 1, err)) != TM_OK) goto done;
    }
    /* release held-back text (a partial stop-string prefix or a partial UTF-8 sequence) */
    if (!stopped_by_string) {
        if ((s = out_push(&ot, m->tok, &dt, -1, err)) != TM_OK) goto done;
        size_t stop_at, hold;
        bool stop = gp->n_stop && find_stop(&ot, gp, &stop_at, &hold);
        size_t end = stop ? stop_at : ot.len;
        if (stop) stats->finish_reason = "stop";
        if (end > ot.emitted && cb) {
            tm_gen_event ev = {-1, ot.buf + ot.emitted, end - ot.emitted, {0}, NULL, 0};
            cb(user, &ev);
        }
        ot.emitted = end;
    }
    stats->decode_s = tm_time_s() - t_prefill;
done:
    tm_kv_seq_release(&r->pool, &seq);
    tm_sampler_free(smp);
    free(hist);
    free(ot.buf);
    return s;
}
