/* tm_sched.c -- iteration-level scheduler: continuous or static batching, chunked prefill, preemption. */
#include "tm_sched.h"

#include <math.h>
#include <stdlib.h>

static tm_status grow(tm_sched_seq ***arr, int32_t *cap, int32_t need, tm_error *err) {
    if (need <= *cap) return TM_OK;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    tm_sched_seq **n = realloc(*arr, (size_t)c * sizeof(**arr));
    if (!n) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    *arr = n;
    *cap = c;
    return TM_OK;
}

tm_status tm_sched_init(tm_sched *s, const tm_sched_cfg *cfg, tm_kv_pool *pool, tm_error *err) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    if (s->cfg.max_batched_tokens <= 0) s->cfg.max_batched_tokens = 512;
    if (s->cfg.max_seqs <= 0) s->cfg.max_seqs = 64;
    if (s->cfg.aging_s < 0 || !isfinite(s->cfg.aging_s)) return tm_err(err, TM_ERR_INVALID, "bad aging interval");
    s->pool = pool;
    s->plan_cap = s->cfg.max_seqs;
    s->plan.seqs = tm_malloc_array((size_t)s->plan_cap, sizeof(tm_sched_seq *));
    s->plan.n_new = tm_malloc_array((size_t)s->plan_cap, sizeof(int32_t));
    if (!s->plan.seqs || !s->plan.n_new) {
        tm_sched_free(s);
        return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    return TM_OK;
}

void tm_sched_free(tm_sched *s) {
    free(s->waiting);
    free(s->running);
    free(s->plan.seqs);
    free(s->plan.n_new);
    free(s->plan.preempted);
    memset(s, 0, sizeof *s);
}

tm_status tm_sched_add(tm_sched *s, tm_sched_seq *q, tm_error *err) {
    /* Every array is sized for all live sequences here, so scheduling never allocates. */
    int32_t total = s->n_waiting + s->n_running + 1;
    tm_status st;
    if ((st = grow(&s->waiting, &s->cap_waiting, total, err)) != TM_OK ||
        (st = grow(&s->running, &s->cap_running, total, err)) != TM_OK ||
        (st = grow(&s->plan.preempted, &s->cap_preempted, total, err)) != TM_OK)
        return st;
    q->state = TM_SEQ_WAITING;
    q->n_computed = 0;
    q->order = s->next_order++;
    s->waiting[s->n_waiting++] = q;
    return TM_OK;
}

static void remove_at(tm_sched_seq **arr, int32_t *n, int32_t i, bool keep_order) {
    if (keep_order) memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof(*arr));
    else arr[i] = arr[*n - 1];
    (*n)--;
}

static int32_t index_of(tm_sched_seq *const *arr, int32_t n, const tm_sched_seq *q) {
    for (int32_t i = 0; i < n; i++)
        if (arr[i] == q) return i;
    return -1;
}

/* a is a worse victim than b: lower urgency (higher priority value), then later arrival */
static bool worse(const tm_sched_seq *a, const tm_sched_seq *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->order > b->order;
}

/* Preempt by recompute: free the blocks, keep the tokens, requeue. Drops q from this step's plan. */
static void preempt(tm_sched *s, tm_sched_seq *q) {
    int32_t i = index_of(s->running, s->n_running, q);
    remove_at(s->running, &s->n_running, i, true);
    int32_t j = index_of(s->plan.seqs, s->plan.n, q);
    if (j >= 0) {
        s->plan.n_tokens -= s->plan.n_new[j];
        memmove(s->plan.seqs + j, s->plan.seqs + j + 1, (size_t)(s->plan.n - j - 1) * sizeof(*s->plan.seqs));
        memmove(s->plan.n_new + j, s->plan.n_new + j + 1, (size_t)(s->plan.n - j - 1) * sizeof(*s->plan.n_new));
        s->plan.n--;
    }
    tm_kv_seq_release(s->pool, &q->kv);
    q->n_computed = 0;
    q->n_preempted++;
    q->state = TM_SEQ_PREEMPTED;
    s->waiting[s->n_waiting++] = q;
    s->plan.preempted[s->plan.n_preempted++] = q;
    s->n_preemptions++;
}

/* Effective priority of a waiting sequence: one level more urgent per aging_s seconds of waiting. */
static double effective_priority(const tm_sched *s, const tm_sched_seq *q, double now) {
    if (s->cfg.aging_s <= 0) return q->priority;
    double waited = now - q->arrival;
    return q->priority - (waited > 0 ? floor(waited / s->cfg.aging_s) : 0.0);
}

/* Index of the waiting sequence to admit next: most urgent effective priority, then FCFS. */
static int32_t next_waiting(const tm_sched *s, double now) {
    int32_t best = -1;
    double bp = 0;
    for (int32_t i = 0; i < s->n_waiting; i++) {
        double p = effective_priority(s, s->waiting[i], now);
        if (best < 0 || p < bp || (p == bp && s->waiting[i]->order < s->waiting[best]->order)) {
            best = i;
            bp = p;
        }
    }
    return best;
}

static void plan_add(tm_sched *s, tm_sched_seq *q, int32_t take) {
    s->plan.seqs[s->plan.n] = q;
    s->plan.n_new[s->plan.n] = take;
    s->plan.n++;
    s->plan.n_tokens += take;
}

tm_status tm_sched_schedule(tm_sched *s, double now, const tm_sched_plan **out, tm_error *err) {
    tm_sched_plan *p = &s->plan;
    p->n = 0;
    p->n_tokens = 0;
    p->n_preempted = 0;
    *out = p;
    int32_t budget = s->cfg.max_batched_tokens;

    /* 1. running sequences first, oldest admission first: decode tokens and unfinished prefill chunks */
    for (int32_t i = 0; i < s->n_running && budget > 0 && p->n < s->cfg.max_seqs;) {
        tm_sched_seq *q = s->running[i];
        int32_t need = q->n_tokens - q->n_computed;
        int32_t take = need < budget ? need : budget;
        if (take <= 0) {
            i++;
            continue;
        }
        bool self_preempted = false;
        while (tm_kv_seq_reserve(s->pool, &q->kv, q->n_computed + take - q->kv.n_tokens, NULL) != TM_OK) {
            /* out of blocks: preempt the worst running sequence (possibly q itself) */
            tm_sched_seq *victim = q;
            for (int32_t k = 0; k < s->n_running; k++)
                if (worse(s->running[k], victim)) victim = s->running[k];
            preempt(s, victim);
            if (victim == q) {
                self_preempted = true;
                break;
            }
        }
        if (self_preempted) continue; /* running[i] is now the next sequence */
        plan_add(s, q, take);
        budget -= take;
        i = index_of(s->running, s->n_running, q) + 1; /* preemptions may have shifted the array */
    }

    /* 2. admit waiting sequences (static batching: only into an empty engine, then none until it drains) */
    bool admit = s->cfg.policy == TM_SCHED_CONTINUOUS || s->n_running == 0;
    while (admit && budget > 0 && p->n < s->cfg.max_seqs && s->n_waiting > 0) {
        int32_t wi = next_waiting(s, now);
        tm_sched_seq *q = s->waiting[wi];
        if (index_of(p->preempted, p->n_preempted, q) >= 0) break; /* preempted this step: not back in it */
        if (q->kv.n_blocks == 0 && q->tokens) {
            /* prefix cache: attach the longest chain of cached full blocks (always leaving one token to run) */
            int32_t n_cached = 0;
            if (tm_kv_seq_match_prefix(s->pool, &q->kv, q->tokens, q->n_tokens, &n_cached, err) != TM_OK)
                return err ? err->code : TM_ERR_INTERNAL;
            q->n_computed = n_cached;
        }
        int32_t need = q->n_tokens - q->n_computed;
        int32_t take = need < budget ? need : budget;
        if (tm_kv_seq_reserve(s->pool, &q->kv, q->n_computed + take - q->kv.n_tokens, NULL) != TM_OK) {
            tm_kv_seq_release(s->pool, &q->kv); /* matched blocks go back to the cache */
            q->n_computed = 0;
            break;
        }
        remove_at(s->waiting, &s->n_waiting, wi, false);
        q->state = TM_SEQ_RUNNING;
        s->running[s->n_running++] = q;
        plan_add(s, q, take);
        budget -= take;
    }

    if (p->n == 0 && s->n_waiting > 0 && s->n_running == 0) {
        tm_sched_seq *q = s->waiting[next_waiting(s, now)];
        return tm_err(err, TM_ERR_RANGE, "sequence %llu needs more KV blocks than the pool has (%d free of %d)",
                      (unsigned long long)q->id, tm_kv_n_free(s->pool), s->pool->n_blocks);
    }
    return TM_OK;
}

void tm_sched_commit(tm_sched *s, const tm_sched_plan *p) {
    (void)s;
    for (int32_t i = 0; i < p->n; i++) p->seqs[i]->n_computed += p->n_new[i];
}

void tm_sched_finish(tm_sched *s, tm_sched_seq *q, tm_seq_state final_state) {
    int32_t i = index_of(s->running, s->n_running, q);
    if (i >= 0) remove_at(s->running, &s->n_running, i, true);
    i = index_of(s->waiting, s->n_waiting, q);
    if (i >= 0) remove_at(s->waiting, &s->n_waiting, i, false);
    tm_kv_seq_release(s->pool, &q->kv);
    q->state = final_state;
}
