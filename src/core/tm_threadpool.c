/* tm_threadpool.c -- fixed pthread pool; one parallel-for at a time, caller participates as thread 0.
 * Workers spin briefly on a generation counter (an op dispatch costs well under a microsecond while
 * the pool is hot) and fall back to a condition variable when idle. Each share of a run is claimed once
 * (an atomic flag): when the caller finishes its own share it takes every share no worker has started, so a
 * worker that the OS has descheduled (other processes on the cores) delays nothing it has not begun. */
#include "tm_threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TM_CPU_RELAX() _mm_pause()
#else
#define TM_CPU_RELAX() ((void)0)
#endif

enum { TM_SPIN_ITERS = 1 << 17 }; /* ~ a millisecond of pause instructions before sleeping */

struct tm_threadpool {
    int n;                         /* threads including the caller */
    pthread_t *threads;            /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    atomic_uint_fast64_t generation; /* bumped per run; workers wait for it to change */
    atomic_int pending;            /* workers still running the current task */
    atomic_int n_sleeping;         /* workers blocked (or about to block) on cv_work */
    atomic_bool stop;
    atomic_int *claim;             /* (n) share i of the current run taken (by worker i or the caller) */
    tm_task_fn fn;
    void *arg;
};

typedef struct { tm_threadpool *tp; int ith; } worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    tm_threadpool *tp = wa.tp;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g = atomic_load(&tp->generation);
        for (int i = 0; g == seen && i < TM_SPIN_ITERS; i++) {
            TM_CPU_RELAX();
            g = atomic_load(&tp->generation);
        }
        if (g == seen) {
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->n_sleeping, 1);
            while ((g = atomic_load(&tp->generation)) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv_work, &tp->mu);
            atomic_fetch_sub(&tp->n_sleeping, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) break;
        seen = g;
        /* fn and arg are read only after the claim, which orders them after the run's set-up */
        if (atomic_exchange(&tp->claim[wa.ith], 1) == 0) {
            tp->fn(tp->arg, wa.ith, tp->n);
            atomic_fetch_sub(&tp->pending, 1);
        }
    }
    return NULL;
}

tm_status tm_threadpool_create(int n_threads, tm_threadpool **out, tm_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return tm_err(err, TM_ERR_INVALID, "thread count %d out of range 1..1024", n_threads);
    tm_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return tm_err(err, TM_ERR_NOMEM, "out of memory creating thread pool");
    tp->n = 1;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv_work, NULL);
    atomic_init(&tp->generation, 0);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->stop, false);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    tp->claim = calloc((size_t)n_threads, sizeof(atomic_int));
    if (!tp->threads || !tp->claim) {
        tm_threadpool_free(tp);
        return tm_err(err, TM_ERR_NOMEM, "out of memory creating thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || (wa->tp = tp, wa->ith = i, pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0)) {
            free(wa);
            tm_threadpool_free(tp);
            return tm_err(err, TM_ERR_IO, "cannot start worker thread %d", i);
        }
        tp->n = i + 1;
    }
    tp->n = n_threads;
    *out = tp;
    return TM_OK;
}

void tm_threadpool_free(tm_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    atomic_fetch_add(&tp->generation, 1);
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i - 1], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv_work);
    free(tp->threads);
    free((void *)tp->claim);
    free(tp);
}

int tm_threadpool_size(const tm_threadpool *tp) { return tp ? tp->n : 1; }

static void run(tm_threadpool *tp, tm_task_fn fn, void *arg, bool steal) {
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->pending, tp->n - 1);
    for (int i = 1; i < tp->n; i++) atomic_store(&tp->claim[i], 0); /* after fn/arg: see worker_main */
    atomic_fetch_add(&tp->generation, 1); /* publishes fn/arg (seq_cst) */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv_work);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(arg, 0, tp->n);
    for (int k = 1; steal && k < tp->n; k++) /* shares whose worker has not started: run them here */
        if (atomic_exchange(&tp->claim[k], 1) == 0) {
            fn(arg, k, tp->n);
            atomic_fetch_sub(&tp->pending, 1);
        }
    for (int i = 0; atomic_load(&tp->pending) > 0; i++) {
        if (i < TM_SPIN_ITERS) TM_CPU_RELAX();
        else sched_yield();
    }
}

void tm_threadpool_run(tm_threadpool *tp, tm_task_fn fn, void *arg) {
    if (!tp || tp->n == 1) fn(arg, 0, 1);
    else run(tp, fn, arg, true);
}

void tm_threadpool_run_each(tm_threadpool *tp, tm_task_fn fn, void *arg) {
    if (!tp || tp->n == 1) fn(arg, 0, 1);
    else run(tp, fn, arg, false);
}
