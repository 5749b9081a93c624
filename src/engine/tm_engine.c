/* tm_engine.c -- requests, the step loop (schedule → run → sample → postprocess), output text and stops. */
#include "tm_engine.h"

#include <stdlib.h>

/* ---- output text with stop strings --------------------------------------------------------------- */

typedef struct out_text {
    char *buf;          /* (cap) generated text so far */
    size_t len, cap;
    size_t emitted;     /* bytes already released to the caller */
} out_text;

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

/* First stop string in the unreleased tail (*stop_at); else *hold = bytes at the end that may start one. */
static bool find_stop(const out_text *o, char *const *stop, size_t n_stop, size_t *stop_at, size_t *hold) {
    size_t maxlen = 0;
    for (size_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        if (L > maxlen) maxlen = L;
    }
    size_t from = o->emitted > maxlen ? o->emitted - maxlen : 0;
    bool found = false;
    size_t best = o->len;
    for (size_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        const char *p = L ? memmem(o->buf + from, o->len - from, stop[i], L) : NULL;
        if (p && (size_t)(p - o->buf) < best) {
            best = (size_t)(p - o->buf);
            found = true;
        }
    }
    *stop_at = best;
    *hold = 0;
    if (found) return true;
    for (size_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        for (size_t k = L > 1 ? L - 1 : 0; k > *hold; k--) /* longest suffix of buf that is a prefix of stop */
            if (k <= o->len && !memcmp(o->buf + o->len - k, stop[i], k)) {
                *hold = k;
                break;
            }
    }
    return false;
}

/* ---- requests ------------------------------------------------------------------------------------ */

struct tm_request {
    tm_sched_seq seq;           /* the scheduler's view; seq.user = this */
    int32_t *tokens;            /* (cap) prompt followed by generated tokens */
    int32_t cap;
    tm_gen_params gp;           /* gp.stop points at stops */
    char **stops;               /* (gp.n_stop) owned copies */
    tm_sampler *sampler;
    tm_detok dt;
    out_text ot;
    bool stopped_by_string;
    tm_gen_cb cb;
    void *user;
    tm_gen_stats stats;
    tm_req_timing timing;       /* feeds the metrics histograms */
    tm_logprob top[TM_MAX_LOGPROBS];
    int32_t row_in[2];          /* its logits row in e->pass[k] while that step is in flight, else -1 */
    bool in_run;                /* admitted and not preempted since */
};

static void request_free(tm_request *q) {
    if (!q) return;
    for (size_t i = 0; q->stops && i < q->gp.n_stop; i++) free(q->stops[i]);
    free(q->stops);
    tm_sampler_free(q->sampler);
    free(q->tokens);
    free(q->ot.buf);
    free(q);
}

/* ---- engine ------------------------------------------------------------------------------------- */

tm_status tm_engine_create(const tm_model *m, const tm_engine_cfg *cfg, tm_engine **out, tm_error *err) {
    *out = NULL;
    tm_engine *e = tm_calloc(1, sizeof *e);
    if (!e) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    e->model = m;
    e->next_id = 1;
    e->metrics = cfg->metrics;
    tm_status s = tm_runner_create(m, &cfg->runner, &e->runner, err);
    if (s != TM_OK) goto fail;
    tm_sched_cfg sc = cfg->sched;
    tm_runner *r = e->runner;
    if (sc.max_batched_tokens <= 0 || sc.max_batched_tokens > r->cfg.max_batch_tokens)
        sc.max_batched_tokens = r->cfg.max_batch_tokens;
    if (sc.max_seqs <= 0 || sc.max_seqs > r->max_seqs) sc.max_seqs = r->max_seqs;
    if ((s = tm_sched_init(&e->sched, &sc, &r->pool, err)) != TM_OK) goto fail;
    size_t ms = (size_t)sc.max_seqs;
    e->st_kv = tm_malloc_array(ms, sizeof(*e->st_kv));
    e->st_ids = tm_malloc_array(ms, sizeof(*e->st_ids));
    e->st_n = tm_malloc_array(ms, sizeof(*e->st_n));
    e->st_logits = tm_malloc_array(ms, sizeof(*e->st_logits));
    e->st_src = tm_malloc_array(ms, sizeof(*e->st_src));
    e->st_seq = tm_malloc_array(ms, sizeof(*e->st_seq));
    for (int k = 0; k < 2; k++) e->pass[k].rows = tm_calloc(ms, sizeof(tm_request *));
    e->pipeline = !cfg->no_pipeline && tm_runner_can_pipeline(r);
    if (!e->st_kv || !e->st_ids || !e->st_n || !e->st_logits || !e->st_src || !e->st_seq || !e->pass[0].rows ||
        !e->pass[1].rows) {
        s = tm_err(err, TM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *out = e;
    return TM_OK;
fail:
    tm_engine_free(e);
    return s;
}

void tm_engine_free(tm_engine *e) {
    if (!e) return;
    if (e->runner) tm_engine_abort_all(e); /* callbacks get their final events */
    free(e->live);
    if (e->runner) tm_sched_free(&e->sched);
    tm_runner_free(e->runner);
    free(e->st_kv);
    free(e->st_ids);
    free(e->st_n);
    free(e->st_logits);
    free(e->st_src);
    free(e->st_seq);
    free(e->pass[0].rows);
    free(e->pass[1].rows);
    free(e->pen_mark);
    free(e);
}

/* The scheduler gauges (running, waiting, KV usage) as they are now: after every admission, finish and
 * abort, so an idle engine does not keep reporting the last step's numbers. */
static void publish_sched_gauges(tm_engine *e) {
    if (e->metrics)
        tm_metrics_set_sched(e->metrics, (uint64_t)e->sched.n_running, (uint64_t)e->sched.n_waiting,
                             tm_kv_usage(&e->runner->pool));
}

/* Final event, blocks back to the pool, request freed. */
static void finish(tm_engine *e, int32_t live_idx, const char *reason) {
    tm_request *q = e->live[live_idx];
    tm_error ignore = {0};
    if (!q->stopped_by_string && out_push(&q->ot, e->model->tok, &q->dt, -1, &ignore) == TM_OK && q->gp.n_stop) {
        size_t stop_at, hold; /* a stop string may complete only in the flushed text */
        if (find_stop(&q->ot, q->stops, q->gp.n_stop, &stop_at, &hold)) {
            q->ot.len = stop_at;
            reason = "stop";
        }
    }
    if (q->ot.len < q->ot.emitted) q->ot.len = q->ot.emitted;
    q->stats.finish_s = tm_time_s();
    if (q->stats.first_token_s > 0) q->stats.decode_s = q->stats.finish_s - q->stats.first_token_s;
    q->stats.finish_reason = reason;
    q->stats.n_preempted = q->seq.n_preempted;
    tm_finish_reason fr = !strcmp(reason, "stop") ? TM_FINISH_STOP : !strcmp(reason, "length") ? TM_FINISH_LENGTH
                                                                                            : TM_FINISH_ABORT;
    tm_req_on_finish(&q->timing, e->metrics, q->stats.finish_s, fr);
    for (int k = 0; k < 2; k++) /* a step in flight computes its row for nothing now */
        if (q->row_in[k] >= 0) {
            e->pass[k].rows[q->row_in[k]] = NULL;
            q->row_in[k] = -1;
        }
    tm_sched_finish(&e->sched, &q->seq, fr == TM_FINISH_ABORT ? TM_SEQ_ABORTED : TM_SEQ_FINISHED);
    publish_sched_gauges(e);
    if (q->cb) {
        tm_gen_event ev = {q->seq.id, -1, q->ot.buf ? q->ot.buf + q->ot.emitted : "", q->ot.len - q->ot.emitted, {0, 0},
                           NULL, 0, reason, &q->stats};
        q->cb(q->user, &ev);
    }
    e->live[live_idx] = e->live[--e->n_live];
    request_free(q);
}

tm_status tm_engine_check_request(const tm_engine *e, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp,
                                  tm_error *err) {
    tm_status s = tm_runner_check_prompt(e->runner, prompt, n_prompt, err);
    if (s != TM_OK) return s;
    if (gp->max_tokens < 0) return tm_err(err, TM_ERR_INVALID, "max_tokens must be >= 0");
    return tm_sampling_validate(&gp->sampling, err);
}

tm_status tm_engine_add(tm_engine *e, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp, tm_gen_cb cb,
                        void *user, uint64_t *id, tm_error *err) {
    const tm_runner *r = e->runner;
    tm_status s = tm_engine_check_request(e, prompt, n_prompt, gp, err);
    if (s != TM_OK) return s;
    if (e->n_live == e->cap_live) {
        int32_t c = e->cap_live ? e->cap_live * 2 : 16;
        tm_request **nl = realloc(e->live, (size_t)c * sizeof(*nl));
        if (!nl) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        e->live = nl;
        e->cap_live = c;
    }
    tm_request *q = tm_calloc(1, sizeof *q);
    if (!q) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    int64_t cap = (int64_t)n_prompt + gp->max_tokens + 1;
    q->cap = (int32_t)(cap < r->cfg.n_ctx + 1 ? cap : r->cfg.n_ctx + 1);
    q->tokens = tm_malloc_array((size_t)q->cap, sizeof(int32_t));
    q->gp = *gp;
    q->stops = gp->n_stop ? tm_calloc(gp->n_stop, sizeof(char *)) : NULL;
    if (!q->tokens || (gp->n_stop && !q->stops)) goto nomem;
    for (size_t i = 0; i < gp->n_stop; i++)
        if (!(q->stops[i] = tm_strndup(gp->stop[i], strlen(gp->stop[i])))) goto nomem;
    q->gp.stop = (const char *const *)q->stops;
    /* the sampler (a few n_vocab-sized buffers) is made when the request first samples, so queued requests
     * stay small; its parameters were validated above */
    memcpy(q->tokens, prompt, n_prompt * sizeof(int32_t));
    q->cb = cb;
    q->user = user;
    q->seq.id = e->next_id++;
    q->seq.priority = gp->priority;
    q->seq.arrival = tm_time_s();
    q->seq.n_prompt = q->seq.n_tokens = (int32_t)n_prompt;
    q->seq.user = q;
    q->seq.tokens = q->tokens;
    q->row_in[0] = q->row_in[1] = -1;
    q->stats.prompt_tokens = (int32_t)n_prompt;
    q->stats.arrival_s = q->seq.arrival;
    tm_req_on_arrival(&q->timing, q->seq.arrival, n_prompt);
    if ((s = tm_sched_add(&e->sched, &q->seq, err)) != TM_OK) {
        request_free(q);
        return s;
    }
    e->live[e->n_live++] = q;
    publish_sched_gauges(e);
    if (id) *id = q->seq.id;
    if (gp->max_tokens == 0) finish(e, e->n_live - 1, "length");
    return TM_OK;
nomem:
    request_free(q);
    return tm_err(err, TM_ERR_NOMEM, "out of memory");
}

static int32_t live_index(const tm_engine *e, const tm_request *q) {
    for (int32_t i = 0; i < e->n_live; i++)
        if (e->live[i] == q) return i;
    return -1;
}

bool tm_engine_abort(tm_engine *e, uint64_t id) {
    for (int32_t i = 0; i < e->n_live; i++)
        if (e->live[i]->seq.id == id) {
            finish(e, i, "abort");
            return true;
        }
    return false;
}

void tm_engine_abort_all(tm_engine *e) {
    while (e->n_live > 0) finish(e, e->n_live - 1, "abort");
    while (e->runner && e->runner->n_pending > 0) { /* wait for the steps in flight; their rows are all dropped */
        int32_t n_rows;
        tm_error ignore = {0};
        tm_runner_collect(e->runner, &n_rows, &ignore);
    }
    e->pass[0].n_rows = e->pass[1].n_rows = 0;
}

/* A sampled token: append, stream its text, decide whether the request is done (returns the reason). */
static const char *postprocess(tm_engine *e, tm_request *q, int32_t tok, const tm_logprob *chosen, double now,
                               tm_error *err, tm_status *st) {
    const tm_runner *r = e->runner;
    if (q->stats.gen_tokens == 0) {
        q->stats.first_token_s = now;
        q->stats.ttft_s = now - q->stats.arrival_s;
        q->stats.prefill_s = now - q->stats.first_scheduled_s;
    }
    tm_req_on_token(&q->timing, e->metrics, now);
    if (!q->gp.ignore_eos && tm_tok_is_eog(e->model->tok, tok)) return "stop";
    q->tokens[q->seq.n_tokens++] = tok;
    q->stats.gen_tokens++;
    if ((*st = out_push(&q->ot, e->model->tok, &q->dt, tok, err)) != TM_OK) return "abort";
    size_t stop_at, hold;
    bool stop = find_stop(&q->ot, q->stops, q->gp.n_stop, &stop_at, &hold);
    size_t release_to = stop ? stop_at : q->ot.len - hold;
    if (release_to < q->ot.emitted) release_to = q->ot.emitted;
    bool go_on = true;
    if (q->cb) {
        tm_gen_event ev = {q->seq.id, tok, q->ot.buf + q->ot.emitted, release_to - q->ot.emitted, *chosen, q->top,
                           q->gp.sampling.n_logprobs, NULL, NULL};
        go_on = q->cb(q->user, &ev);
    }
    q->ot.emitted = release_to;
    if (stop) {
        q->stopped_by_string = true;
        q->ot.len = stop_at;
        return "stop";
    }
    if (!go_on) return "abort";
    if (q->stats.gen_tokens >= q->gp.max_tokens) return "length";
    if (q->seq.n_tokens >= r->cfg.n_ctx || q->seq.n_tokens >= q->cap) return "length"; /* context full */
    return NULL;
}

/* A sampled token to its request (postprocess), which is finished when that says it is done. */
static tm_status take_token(tm_engine *e, tm_request *q, int32_t tok, const tm_logprob *chosen, double now,
                            tm_error *err) {
    tm_status s = TM_OK;
    const char *reason = postprocess(e, q, tok, chosen, now, err, &s);
    if (reason) finish(e, live_index(e, q), reason);
    return s;
}

/* temperature 0 (or top-k 1) with no penalties and no logprobs: the token is the argmax of the raw logits */
static bool sampling_is_plain_greedy(const tm_sampling_params *sp) {
    return (sp->temperature == 0.0f || sp->top_k == 1) && !tm_sampling_has_penalties(sp) && sp->n_logprobs == 0;
}

/* A row's penalty entries for request q's history (hist as the host sampler takes it: the ids generated so far;
 * ahead: one more in flight, which the backend adds) appended to the runner's; false when memory runs out (the step
 * is then drawn on the host) */
static bool add_pen_entries(tm_engine *e, const tm_request *q, size_t ahead, tm_sample_row *row) {
    tm_runner *r = e->runner;
    const int32_t V = e->model->hp.n_vocab;
    const size_t n_hist = (size_t)(q->seq.n_tokens - q->seq.n_prompt);
    if (n_hist == 0) return true; /* nothing before the id in flight, if any */
    tm_error ignore = {0};
    const int32_t room = n_hist < (size_t)V ? (int32_t)n_hist : V;
    if (!e->pen_mark && !(e->pen_mark = tm_calloc((size_t)V, sizeof *e->pen_mark))) return false;
    if (tm_runner_pen_reserve(r, room, &ignore) != TM_OK) return false;
    row->pen_n = (int32_t)tm_sampler_pen_entries(&q->gp.sampling, V, q->tokens + q->seq.n_prompt, n_hist, ahead,
                                                 e->pen_mark, r->sample_pen + r->n_sample_pen);
    r->n_sample_pen += row->pen_n;
    return true;
}

/* Where the logits rows of a step's sequences (want[i]) are drawn: plain greedy everywhere: the backend's argmax;
 * else the backend's sampler, penalties and logprobs included; else the host. A step queued behind one in flight
 * (src != NULL) has each sequence's last token in that pass's row src[i], not yet seen by the host: the draw
 * counter counts it, and the backend adds it to the penalties' history. Sets the runner's flags and recipes for
 * the next pass; true when the backend draws every row. */
static bool choose_sampling(tm_engine *e, tm_sched_seq *const *seqs, const bool *want, int32_t n, const int32_t *src) {
    tm_runner *r = e->runner;
    /* plain greedy requests let a device backend take the argmax itself: only ids leave the device */
    bool dev_greedy = tm_runner_can_argmax(r);
    for (int32_t i = 0; i < n && dev_greedy; i++)
        if (want[i] && !sampling_is_plain_greedy(&((tm_request *)seqs[i]->user)->gp.sampling)) dev_greedy = false;
    r->greedy_on_device = dev_greedy;
    /* otherwise the device's sampler draws from a per-request stream keyed by (seed, tokens generated):
     * reproducible for a seed, but not the host sampler's sequence */
    bool dev_sample = !dev_greedy && tm_runner_can_sample(r);
    r->n_sample_pen = 0;
    r->sample_logprobs = false;
    const int32_t ahead = src ? 1 : 0;
    for (int32_t i = 0, row = 0; i < n && dev_sample; i++) {
        if (!want[i]) continue;
        tm_request *q = seqs[i]->user;
        const tm_sampling_params *sp = &q->gp.sampling;
        const bool pen = tm_sampling_has_penalties(sp);
        tm_sample_row *w = &r->sample_rows[row++];
        *w = (tm_sample_row){
            .temperature = sp->top_k == 1 ? 0.0f : sp->temperature, .top_p = sp->top_p, .min_p = sp->min_p,
            .top_k = sp->top_k, .seed = sp->seed, .offset = (uint64_t)(q->seq.n_tokens - q->seq.n_prompt + ahead),
            .repeat_penalty = sp->repeat_last_n == 0 ? 1.0f : sp->repeat_penalty, /* no window: no penalty */
            .presence_penalty = sp->presence_penalty, .frequency_penalty = sp->frequency_penalty,
            .pen_first = r->n_sample_pen, .pen_n = 0, .pen_src = pen && src ? src[i] : -1,
            .n_logprobs = sp->n_logprobs};
        if (sp->n_logprobs > 0) r->sample_logprobs = true;
        if (pen && !add_pen_entries(e, q, (size_t)ahead, w)) dev_sample = false;
    }
    if (!dev_sample) {
        r->n_sample_pen = 0;
        r->sample_logprobs = false;
    }
    r->sample_on_device = dev_sample;
    return dev_greedy || dev_sample;
}

/* a row drawn on the backend: its logprobs (when the request asks for them) into chosen and q->top */
static void take_logprobs(tm_request *q, const tm_sample_lp *lp, tm_logprob *chosen) {
    const int32_t n = q->gp.sampling.n_logprobs;
    if (n <= 0) return;
    chosen->logprob = lp->chosen;
    for (int32_t j = 0; j < n && j < TM_SAMPLE_MAX_TOP; j++) q->top[j] = (tm_logprob){lp->top_id[j], lp->top_lp[j]};
}

/* A pipelined step was just queued (the runner's newest slot): its logits rows' requests, in row order. */
static void record_pass(tm_engine *e, tm_sched_seq *const *seqs, const bool *want, int32_t n) {
    const tm_runner *r = e->runner;
    int32_t slot = (r->pend_first + r->n_pending - 1) % 2; /* the runner's newest */
    tm_engine_pass *P = &e->pass[slot];
    P->n_rows = 0;
    for (int32_t i = 0; i < n; i++)
        if (want[i]) {
            tm_request *q = seqs[i]->user;
            q->row_in[slot] = P->n_rows;
            P->rows[P->n_rows++] = q;
        }
}

/* The request cannot go on after its next token, whatever that token is (the checks of postprocess that do not
 * look at the token). */
static bool ends_after_next(const tm_engine *e, const tm_request *q) {
    return q->stats.gen_tokens + 1 >= q->gp.max_tokens || q->seq.n_tokens + 1 >= e->runner->cfg.n_ctx ||
           q->seq.n_tokens + 1 >= q->cap;
}

/* One pass is in flight: queue the step after it when that step is certain, i.e. what the scheduler would plan
 * once the pass's tokens are in: every running sequence is in the pass and decodes one more token (those that end
 * after this token for sure drop out), nothing waiting could be admitted, the blocks for the new entries are free
 * (no preemption), and every row is drawn on the backend. Otherwise queue nothing (the step after the collection
 * is planned as usual). */
static tm_status chain_next(tm_engine *e, tm_error *err) {
    tm_runner *r = e->runner;
    tm_sched *S = &e->sched;
    if (r->n_pending != 1) return TM_OK;
    if (S->n_waiting > 0 && S->n_running < S->cfg.max_seqs && S->cfg.policy == TM_SCHED_CONTINUOUS) return TM_OK;
    int32_t n = 0, live = 0, blocks = 0;
    const tm_engine_pass *P = &e->pass[r->pend_first];
    for (int32_t row = 0; row < P->n_rows; row++) {
        tm_request *q = P->rows[row];
        if (!q) continue;
        live++;
        if (q->seq.state != TM_SEQ_RUNNING || q->seq.n_computed != q->seq.n_tokens) return TM_OK;
        if (ends_after_next(e, q)) continue;
        e->st_src[n] = row;
        e->st_seq[n] = &q->seq;
        blocks += tm_kv_seq_blocks_needed(&r->pool, &q->seq.kv, 1);
        n++;
    }
    if (live != S->n_running || n == 0 || n > S->cfg.max_batched_tokens || !tm_kv_can_allocate(&r->pool, blocks))
        return TM_OK;
    tm_sched_seq **seqs = e->st_seq;
    for (int32_t i = 0; i < n; i++) {
        tm_request *q = seqs[i]->user;
        e->st_kv[i] = &q->seq.kv;
        e->st_ids[i] = q->tokens + q->seq.n_tokens; /* not read: the token is on the device */
        e->st_n[i] = 1;
        e->st_logits[i] = true;
    }
    if (!choose_sampling(e, seqs, e->st_logits, n, e->st_src)) return TM_OK; /* it left both runner flags off */
    tm_status s;
    for (int32_t i = 0; i < n; i++) /* cannot fail: the blocks were counted */
        if ((s = tm_kv_seq_reserve(&r->pool, e->st_kv[i], 1, err)) != TM_OK) return s;
    if ((s = tm_runner_launch(r, e->st_kv, e->st_ids, e->st_n, e->st_logits, n, e->st_src, err)) != TM_OK) return s;
    const tm_sched_plan chained = {.seqs = seqs, .n_new = e->st_n, .n = n, .n_tokens = n};
    tm_sched_commit(S, &chained);
    record_pass(e, seqs, e->st_logits, n);
    e->last = (tm_engine_step_info){'c', n, n, 0};
    return TM_OK;
}

/* Collect the oldest pass in flight: its tokens, postprocessed in row order. A request whose next token is being
 * computed by the pass after it gets this token's id recorded for that cache entry. */
static tm_status collect_pass(tm_engine *e, tm_error *err) {
    tm_runner *r = e->runner;
    int32_t slot = r->pend_first, n_rows = 0; /* the runner's oldest */
    tm_engine_pass *P = &e->pass[slot];
    tm_status s = tm_runner_collect(r, &n_rows, err);
    for (int32_t row = 0; row < P->n_rows; row++)
        if (P->rows[row]) P->rows[row]->row_in[slot] = -1;
    if (s == TM_OK && n_rows != P->n_rows)
        s = tm_err(err, TM_ERR_INTERNAL, "pass of %d rows gave %d ids", P->n_rows, n_rows);
    double now = tm_time_s();
    for (int32_t row = 0; row < P->n_rows && s == TM_OK; row++) {
        tm_request *q = P->rows[row];
        if (!q) continue;
        int32_t tok = r->greedy[row];
        if (q->row_in[slot ^ 1] >= 0 && (s = tm_kv_seq_set_ids(&r->pool, &q->seq.kv, &tok, 1, err)) != TM_OK) break;
        tm_logprob chosen = {tok, 0};
        take_logprobs(q, &r->sample_lp[row], &chosen);
        s = take_token(e, q, tok, &chosen, now, err);
    }
    P->n_rows = 0;
    return s;
}

tm_status tm_engine_step(tm_engine *e, tm_error *err) {
    e->last = (tm_engine_step_info){'-', 0, 0, 0};
    if (e->runner->n_pending > 0) { /* pipelined: queue the next step if it is certain, then take in the previous one */
        e->last.kind = 'w';
        tm_status s = chain_next(e, err);
        if (s != TM_OK) return s;
        return collect_pass(e, err);
    }
    tm_runner *r = e->runner;
    double now = tm_time_s();
    const tm_sched_plan *p;
    tm_status s = tm_sched_schedule(&e->sched, now, &p, err);
    if (s != TM_OK) return s;
    if (e->metrics) {
        tm_metrics_std *ms = tm_metrics_get_std(e->metrics);
        if (ms && p->n_preempted) tm_counter_add(ms->preemptions, (uint64_t)p->n_preempted);
        tm_kv_stats ks;
        tm_kv_get_stats(&r->pool, &ks);
        if (ms) {
            tm_counter_add(ms->prefix_queries, ks.query_tokens - e->kv_seen.query_tokens);
            tm_counter_add(ms->prefix_hits, ks.hit_tokens - e->kv_seen.hit_tokens);
        }
        e->kv_seen = ks;
        tm_metrics_set_sched(e->metrics, (uint64_t)e->sched.n_running, (uint64_t)e->sched.n_waiting,
                             tm_kv_usage(&r->pool));
    }
    for (int32_t k = 0; k < p->n_preempted; k++) ((tm_request *)p->preempted[k]->user)->in_run = false;
    if (p->n == 0) return TM_OK;
    int32_t n_want = 0;
    for (int32_t i = 0; i < p->n; i++) {
        tm_request *q = p->seqs[i]->user;
        if (!q->in_run) { /* an admission (or a re-admission after a preemption) */
            q->in_run = true;
            tm_req_on_scheduled(&q->timing, now);
            if (q->stats.first_scheduled_s == 0) {
                q->stats.first_scheduled_s = now;
                q->stats.cached_tokens = q->seq.n_computed; /* what the prefix cache held of the prompt */
            }
        }
        e->st_kv[i] = &q->seq.kv;
        e->st_ids[i] = q->tokens + q->seq.n_computed;
        e->st_n[i] = p->n_new[i];
        e->st_logits[i] = q->seq.n_computed + p->n_new[i] == q->seq.n_tokens;
        n_want += e->st_logits[i];
        e->last.n_tokens += p->n_new[i];
        if (q->seq.n_computed < q->seq.n_prompt) e->last.n_prefill += p->n_new[i];
    }
    e->last.n_seqs = p->n;
    bool on_device = choose_sampling(e, p->seqs, e->st_logits, p->n, NULL);
    if (e->pipeline && on_device && n_want > 0) { /* queued; collected by the next call, after it queues the next */
        if ((s = tm_runner_launch(r, e->st_kv, e->st_ids, e->st_n, e->st_logits, p->n, NULL, err)) != TM_OK) return s;
        tm_sched_commit(&e->sched, p);
        record_pass(e, p->seqs, e->st_logits, p->n);
        e->last.kind = 'l';
        return TM_OK;
    }
    e->last.kind = 's';
    if ((s = tm_runner_step(r, e->st_kv, e->st_ids, e->st_n, e->st_logits, p->n, err)) != TM_OK) return s;
    tm_sched_commit(&e->sched, p);
    now = tm_time_s();
    /* sample; finishing reorders e->live but not the plan */
    int32_t row = 0, n = p->n;
    for (int32_t i = 0; i < n; i++) {
        if (!e->st_logits[i]) continue;
        tm_request *q = p->seqs[i]->user;
        tm_logprob chosen = {0, 0};
        if (on_device) { /* drawn on the device (a greedy sampler draws no random numbers) */
            int32_t tok = r->greedy[row];
            chosen.id = tok;
            take_logprobs(q, &r->sample_lp[row++], &chosen);
            if ((s = take_token(e, q, tok, &chosen, now, err)) != TM_OK) return s;
            continue;
        }
        float *logits = r->logits + (size_t)row++ * (size_t)e->model->hp.n_vocab;
        if (!q->sampler) {
            tm_error serr = {0};
            if (tm_sampler_create(&q->gp.sampling, e->model->hp.n_vocab, &q->sampler, &serr) != TM_OK) {
                tm_log(TM_LOG_ERROR, "request %llu: %s; aborting it", (unsigned long long)q->seq.id, serr.msg);
                finish(e, live_index(e, q), "abort");
                continue;
            }
        }
        int32_t tok = tm_sampler_sample(q->sampler, logits, q->tokens + q->seq.n_prompt,
                                        (size_t)(q->seq.n_tokens - q->seq.n_prompt), &chosen, q->top);
        if ((s = take_token(e, q, tok, &chosen, now, err)) != TM_OK) return s;
    }
    return TM_OK;
}

typedef struct gen_capture {
    tm_gen_cb cb;
    void *user;
    tm_gen_stats *stats;
} gen_capture;

static bool capture_cb(void *user, const tm_gen_event *ev) {
    gen_capture *c = user;
    if (ev->finish_reason && c->stats) *c->stats = *ev->stats;
    return c->cb ? c->cb(c->user, ev) : true;
}

tm_status tm_engine_generate(tm_engine *e, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp,
                             tm_gen_cb cb, void *user, tm_gen_stats *stats, tm_error *err) {
    gen_capture cap = {cb, user, stats};
    if (stats) memset(stats, 0, sizeof *stats);
    tm_status s = tm_engine_add(e, prompt, n_prompt, gp, capture_cb, &cap, NULL, err);
    while (s == TM_OK && tm_engine_has_work(e)) s = tm_engine_step(e, err);
    return s;
}
