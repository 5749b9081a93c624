/* tm_async.c -- the engine's thread, its submit/abort queues, and per-request output streams. */
#include "tm_async.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct ev_node {
    tm_stream_event ev;
    struct ev_node *next;
} ev_node;

struct tm_stream {
    tm_async *a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_node *head, *tail;       /* events not yet read */
    bool final_queued, final_read;
    atomic_int refs;            /* reader + engine side */
    atomic_bool abort_requested;
    uint64_t id;                /* engine request id (engine thread only) */
    tm_stream_notify_fn notify; /* under mu */
    void *notify_user;
};

typedef struct submission {
    int32_t *prompt;            /* (n_prompt) copy */
    size_t n_prompt;
    tm_gen_params gp;           /* stop strings still the caller's: the engine copies them at add time */
    char **stops;               /* (gp.n_stop) copies owned here until added */
    tm_stream *stream;
    struct submission *next;
} submission;

typedef struct abort_node {
    tm_stream *stream;
    struct abort_node *next;
} abort_node;

struct tm_async {
    tm_engine *engine;          /* owned; engine thread only after start */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    submission *subs, *subs_tail;
    abort_node *aborts;
    bool stop;
};

static void stream_unref(tm_stream *s) {
    if (atomic_fetch_sub(&s->refs, 1) != 1) return;
    for (ev_node *n = s->head, *nx; n; n = nx) {
        nx = n->next;
        tm_stream_event_clear(&n->ev);
        free(n);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Append an event (engine thread). A final event releases the engine's reference. */
static void stream_push(tm_stream *s, const tm_gen_event *ev) {
    ev_node *n = calloc(1, sizeof *n);
    char *text = malloc(ev->text_len + 1);
    int32_t n_top = ev->finish_reason || !ev->top || ev->n_top < 0 ? 0 : ev->n_top;
    tm_logprob *top = n_top ? malloc((size_t)n_top * sizeof *top) : NULL; /* (n_top) */
    pthread_mutex_lock(&s->mu);
    if (n && text && (top || !n_top)) {
        memcpy(text, ev->text, ev->text_len);
        text[ev->text_len] = '\0';
        n->ev.token = ev->token;
        n->ev.text = text;
        n->ev.text_len = ev->text_len;
        n->ev.logprob = ev->chosen.logprob;
        n->ev.final = ev->finish_reason != NULL;
        n->ev.finish_reason = ev->finish_reason;
        if (ev->stats) n->ev.stats = *ev->stats;
        if (n_top) memcpy(top, ev->top, (size_t)n_top * sizeof *top);
        n->ev.top = top;
        n->ev.n_top = n_top;
        if (s->tail) s->tail->next = n;
        else s->head = n;
        s->tail = n;
    } else {
        free(n);
        free(text);
        free(top);
        n = NULL;
    }
    bool final = ev->finish_reason != NULL;
    if (final) s->final_queued = true;
    pthread_cond_broadcast(&s->cv);
    if (s->notify && (n || final)) s->notify(s->notify_user);
    pthread_mutex_unlock(&s->mu);
    if (!n && !final) atomic_store(&s->abort_requested, true); /* out of memory: end the request */
    if (final) stream_unref(s);
}

static bool stream_cb(void *user, const tm_gen_event *ev) {
    tm_stream *s = user;
    stream_push(s, ev);
    return ev->finish_reason || !atomic_load(&s->abort_requested);
}

/* A submission that never reached the engine: final "abort" event. */
static void fail_submission(submission *sub) {
    tm_gen_stats st = {0};
    st.prompt_tokens = (int32_t)sub->n_prompt;
    st.finish_reason = "abort";
    tm_gen_event ev = {0, -1, "", 0, {0, 0}, NULL, 0, "abort", &st};
    stream_push(sub->stream, &ev);
}

static void free_submission(submission *sub) {
    for (size_t i = 0; sub->stops && i < sub->gp.n_stop; i++) free(sub->stops[i]);
    free(sub->stops);
    free(sub->prompt);
    free(sub);
}

static void *engine_main(void *p) {
    tm_async *a = p;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (!a->stop && !a->subs && !a->aborts && !tm_engine_has_work(a->engine)) pthread_cond_wait(&a->cv, &a->mu);
        submission *subs = a->subs;
        abort_node *aborts = a->aborts;
        bool stop = a->stop;
        a->subs = a->subs_tail = NULL;
        a->aborts = NULL;
        pthread_mutex_unlock(&a->mu);
        for (submission *sub = subs, *nx; sub; sub = nx) {
            nx = sub->next;
            tm_error err = {0};
            if (stop || tm_engine_add(a->engine, sub->prompt, sub->n_prompt, &sub->gp, stream_cb, sub->stream,
                                      &sub->stream->id, &err) != TM_OK)
                fail_submission(sub);
            free_submission(sub);
        }
        for (abort_node *an = aborts, *nx; an; an = nx) {
            nx = an->next;
            tm_engine_abort(a->engine, an->stream->id); /* false when it already finished */
            stream_unref(an->stream);
            free(an);
        }
        if (stop) break;
        if (tm_engine_has_work(a->engine)) {
            tm_error err = {0};
            if (tm_engine_step(a->engine, &err) != TM_OK) {
                tm_log(TM_LOG_ERROR, "engine step failed: %s; aborting all requests", err.msg);
                tm_engine_abort_all(a->engine);
            }
        }
    }
    return NULL;
}

tm_status tm_async_create(const tm_model *m, const tm_engine_cfg *cfg, tm_async **out, tm_error *err) {
    *out = NULL;
    tm_async *a = tm_calloc(1, sizeof *a);
    if (!a) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_status s = tm_engine_create(m, cfg, &a->engine, err);
    if (s != TM_OK) {
        free(a);
        return s;
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, engine_main, a) != 0) {
        tm_engine_free(a->engine);
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        free(a);
        return tm_err(err, TM_ERR_IO, "cannot start the engine thread");
    }
    *out = a;
    return TM_OK;
}

void tm_async_free(tm_async *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    /* submissions that raced with the stop */
    for (submission *sub = a->subs, *nx; sub; sub = nx) {
        nx = sub->next;
        fail_submission(sub);
        free_submission(sub);
    }
    for (abort_node *an = a->aborts, *nx; an; an = nx) {
        nx = an->next;
        stream_unref(an->stream);
        free(an);
    }
    tm_engine_free(a->engine); /* live requests get their final "abort" events */
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

const tm_engine *tm_async_engine(const tm_async *a) { return a->engine; }

tm_status tm_async_submit(tm_async *a, const int32_t *prompt, size_t n_prompt, const tm_gen_params *gp, tm_stream **out,
                          tm_error *err) {
    *out = NULL;
    tm_status st = tm_engine_check_request(a->engine, prompt, n_prompt, gp, err); /* immutable fields only */
    if (st != TM_OK) return st;
    submission *sub = tm_calloc(1, sizeof *sub);
    tm_stream *s = tm_calloc(1, sizeof *s);
    if (!sub || !s) goto nomem;
    sub->prompt = tm_malloc_array(n_prompt, sizeof(int32_t));
    sub->stops = gp->n_stop ? tm_calloc(gp->n_stop, sizeof(char *)) : NULL;
    if (!sub->prompt || (gp->n_stop && !sub->stops)) goto nomem;
    sub->gp = *gp;
    for (size_t i = 0; i < gp->n_stop; i++)
        if (!(sub->stops[i] = tm_strndup(gp->stop[i], strlen(gp->stop[i])))) {
            sub->gp.n_stop = i;
            goto nomem;
        }
    sub->gp.stop = (const char *const *)sub->stops;
    memcpy(sub->prompt, prompt, n_prompt * sizeof(int32_t));
    sub->n_prompt = n_prompt;
    s->a = a;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->refs, 2);
    atomic_init(&s->abort_requested, false);
    sub->stream = s;
    pthread_mutex_lock(&a->mu);
    if (a->subs_tail) a->subs_tail->next = sub;
    else a->subs = sub;
    a->subs_tail = sub;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    *out = s;
    return TM_OK;
nomem:
    if (sub) free_submission(sub);
    free(s);
    return tm_err(err, TM_ERR_NOMEM, "out of memory");
}

tm_status tm_stream_next(tm_stream *s, double timeout_s, tm_stream_event *ev, tm_error *err) {
    memset(ev, 0, sizeof *ev);
    pthread_mutex_lock(&s->mu);
    if (s->final_read) {
        pthread_mutex_unlock(&s->mu);
        return tm_err(err, TM_ERR_INVALID, "the stream has ended");
    }
    if (!s->head && timeout_s == 0) {
        pthread_mutex_unlock(&s->mu);
        return tm_err(err, TM_ERR_RANGE, "no event yet");
    }
    struct timespec dl;
    if (timeout_s >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        double t = (double)dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
        dl.tv_sec = (time_t)t;
        dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    }
    while (!s->head) {
        int rc = timeout_s < 0 ? pthread_cond_wait(&s->cv, &s->mu) : pthread_cond_timedwait(&s->cv, &s->mu, &dl);
        if (rc == ETIMEDOUT && !s->head) {
            pthread_mutex_unlock(&s->mu);
            return tm_err(err, TM_ERR_RANGE, "no event within %.3f s", timeout_s);
        }
    }
    ev_node *n = s->head;
    s->head = n->next;
    if (!s->head) s->tail = NULL;
    if (n->ev.final) s->final_read = true;
    pthread_mutex_unlock(&s->mu);
    *ev = n->ev;
    free(n);
    return TM_OK;
}

void tm_stream_set_notify(tm_stream *s, tm_stream_notify_fn fn, void *user) {
    pthread_mutex_lock(&s->mu);
    s->notify = fn;
    s->notify_user = fn ? user : NULL;
    pthread_mutex_unlock(&s->mu);
}

void tm_stream_abort(tm_stream *s) {
    if (atomic_exchange(&s->abort_requested, true)) return;
    abort_node *an = malloc(sizeof *an);
    if (!an) return; /* the flag alone still stops it at its next token */
    atomic_fetch_add(&s->refs, 1);
    an->stream = s;
    tm_async *a = s->a;
    pthread_mutex_lock(&a->mu);
    an->next = a->aborts;
    a->aborts = an;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void tm_stream_free(tm_stream *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    bool done = s->final_queued;
    pthread_mutex_unlock(&s->mu);
    if (!done) tm_stream_abort(s);
    stream_unref(s);
}

void tm_stream_event_clear(tm_stream_event *ev) {
    free(ev->text);
    free(ev->top);
    memset(ev, 0, sizeof *ev);
}
