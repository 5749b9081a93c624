/* tm_threadpool.h -- a fixed pthread pool running one parallel-for at a time. */
#ifndef TM_THREADPOOL_H
#define TM_THREADPOOL_H

#include "tm_core.h"

typedef struct tm_threadpool tm_threadpool;

/* fn(arg, ith, nth): called exactly once per share ith in [0, nth); share 0 runs on the caller, share i normally
 * on worker i, but the caller runs any share whose worker has not started when the caller's own is done. Shares
 * must not wait for each other. */
typedef void (*tm_task_fn)(void *arg, int ith, int nth);

tm_status tm_threadpool_create(int n_threads, tm_threadpool **out, tm_error *err);
void tm_threadpool_free(tm_threadpool *tp);
int tm_threadpool_size(const tm_threadpool *tp);
/* Run fn on every thread and wait for all of them. tp may be NULL (runs fn(arg, 0, 1)). */
void tm_threadpool_run(tm_threadpool *tp, tm_task_fn fn, void *arg);
/* Run fn with share i on thread i, always (the caller is thread 0): shares may wait for each other (barriers,
 * collectives) and a thread keeps its per-thread state (a current GPU, a graph capture) across runs. */
void tm_threadpool_run_each(tm_threadpool *tp, tm_task_fn fn, void *arg);

/* fn(arg, lo, hi, ith): items [lo, hi) of a range run, on thread ith. */
typedef void (*tm_range_fn)(void *arg, int64_t lo, int64_t hi, int ith);
/* Run fn over the items [0, n): thread i owns the i-th near-equal contiguous part (tm_split_range) and takes it
 * front to back, up to grain items per call; a thread whose part is done takes the back half of the largest
 * part left (its stream stays contiguous) until nothing is left. Every item is passed exactly once. For work
 * whose share time varies by thread (memory contention, a descheduled core): no thread waits for another
 * longer than about one grain. */
void tm_threadpool_run_range(tm_threadpool *tp, int64_t n, int64_t grain, tm_range_fn fn, void *arg);

/* Split [0, n) into nth near-equal parts; returns the part of thread ith as [*lo, *hi). */
static inline void tm_split_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif /* TM_THREADPOOL_H */
