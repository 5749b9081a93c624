/* tm_threadpool.c -- fixed pthread pool; one parallel-for at a time, caller participates as thread 0. */
#include "tm_threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct tm_threadpool {
    int n;                      /* threads including the caller */
    pthread_t *threads;         /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t generation;        /* bumped per run */
    int pending;                /* workers still running the current task */
    bool stop;
    tm_task_fn fn;
    void *arg;
};

typedef struct { tm_threadpool *tp; int ith; } worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    tm_threadpool *tp = wa.tp;
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->cv_work, &tp->mu);
        if (tp->stop) break;
        seen = tp->generation;
        tm_task_fn fn = tp->fn;
        void *arg = tp->arg;
        pthread_mutex_unlock(&tp->mu);
        fn(arg, wa.ith, tp->n);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->cv_done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

tm_status tm_threadpool_create(int n_threads, tm_threadpool **out, tm_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return tm_err(err, TM_ERR_INVALID, "thread count %d out of range 1..1024", n_threads);
    tm_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return tm_err(err, TM_ERR_NOMEM, "out of memory creating thread pool");
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv_work, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->threads) goto nomem;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { tp->n = i; goto nomem; }
        wa->tp = tp;
        wa->ith = i;
        if (pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            tp->n = i;
            tm_threadpool_free(tp);
            return tm_err(err, TM_ERR_IO, "cannot start thread %d", i);
        }
    }
    *out = tp;
    return TM_OK;
nomem:
    tm_threadpool_free(tp);
    return tm_err(err, TM_ERR_NOMEM, "out of memory creating thread pool");
}

void tm_threadpool_free(tm_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = true;
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i - 1], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv_work);
    pthread_cond_destroy(&tp->cv_done);
    free(tp->threads);
    free(tp);
}

int tm_threadpool_size(const tm_threadpool *tp) { return tp ? tp->n : 1; }

void tm_threadpool_run(tm_threadpool *tp, tm_task_fn fn, void *arg) {
    if (!tp || tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->arg = arg;
    tp->pending = tp->n - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0) pthread_cond_wait(&tp->cv_done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
