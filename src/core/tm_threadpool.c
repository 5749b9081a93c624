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

/* the items [lo, hi) of one thread's part, packed lo | hi << 32, on a cache line of its own (the owner
 * updates it per grain; others read it only when their own part is done) */
typedef struct {
    _Alignas(64) atomic_uint_fast64_t r;
} tm_range_slot;

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
    tm_range_slot *slots;          /* (n) each thread's part of the current range run */
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
    tp->slots = tm_aligned_alloc(64, (size_t)n_threads * sizeof(tm_range_slot));
    if (!tp->threads || !tp->claim || !tp->slots) {
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
    tm_aligned_free(tp->slots);
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

/* ---- range runs ---------------------------------------------------------------------------------- */

typedef struct {
    tm_threadpool *tp;
    int64_t n, grain;
    tm_range_fn fn;
    void *arg;
} range_run;

static inline uint64_t range_pack(int64_t lo, int64_t hi) { return (uint64_t)lo | (uint64_t)hi << 32; }
static inline int64_t range_lo(uint64_t r) { return (int64_t)(r & 0xffffffffu); }
static inline int64_t range_hi(uint64_t r) { return (int64_t)(r >> 32); }

static void range_task(void *p, int ith, int nth) {
    range_run *rr = p;
    tm_range_slot *slots = rr->tp->slots;
    atomic_uint_fast64_t *own = &slots[ith].r;
    for (;;) {
        uint64_t cur = atomic_load_explicit(own, memory_order_acquire);
        while (range_lo(cur) < range_hi(cur)) { /* the front of this thread's part, a grain at a time */
            int64_t lo = range_lo(cur), hi = range_hi(cur), e = hi - lo < rr->grain ? hi : lo + rr->grain;
            if (atomic_compare_exchange_weak_explicit(own, &cur, range_pack(e, hi), memory_order_acq_rel,
                                                      memory_order_acquire)) {
                rr->fn(rr->arg, lo, e, ith);
                cur = atomic_load_explicit(own, memory_order_acquire);
            }
        }
        /* done: take the back half of the largest part left (two items at least: one stays with its owner) */
        int best = -1;
        int64_t best_n = 1;
        for (int v = 0; v < nth; v++) {
            if (v == ith) continue;
            uint64_t r = atomic_load_explicit(&slots[v].r, memory_order_relaxed);
            if (range_hi(r) - range_lo(r) > best_n) {
                best = v;
                best_n = range_hi(r) - range_lo(r);
            }
        }
        if (best < 0) return;
        uint64_t r = atomic_load_explicit(&slots[best].r, memory_order_acquire);
        int64_t lo = range_lo(r), hi = range_hi(r);
        if (hi - lo < 2) continue; /* taken meanwhile: look again */
        int64_t mid = hi - (hi - lo) / 2;
        if (atomic_compare_exchange_strong_explicit(&slots[best].r, &r, range_pack(lo, mid), memory_order_acq_rel,
                                                    memory_order_acquire))
            atomic_store_explicit(own, range_pack(mid, hi), memory_order_release); /* others may take from it */
    }
}

static void range_static_task(void *p, int ith, int nth) { /* parts beyond the packing: no stealing */
    range_run *rr = p;
    int64_t lo, hi;
    tm_split_range(rr->n, ith, nth, &lo, &hi);
    for (; lo < hi; lo += rr->grain) rr->fn(rr->arg, lo, hi - lo < rr->grain ? hi : lo + rr->grain, ith);
}

void tm_threadpool_run_range(tm_threadpool *tp, int64_t n, int64_t grain, tm_range_fn fn, void *arg) {
    range_run rr = {tp, n, grain < 1 ? 1 : grain, fn, arg};
    if (n <= 0) return;
    if (!tp || tp->n == 1) {
        range_static_task(&rr, 0, 1);
        return;
    }
    if (n >= ((int64_t)1 << 31)) {
        run(tp, range_static_task, &rr, true);
        return;
    }
    for (int i = 0; i < tp->n; i++) {
        int64_t lo, hi;
        tm_split_range(n, i, tp->n, &lo, &hi);
        atomic_store_explicit(&tp->slots[i].r, range_pack(lo, hi), memory_order_relaxed);
    }
    run(tp, range_task, &rr, true); /* the generation bump publishes the slots */
}
