/* tm_membw.c -- measured DRAM read bandwidth (the decode floor's denominator) for `tokenmill bench memory`. */
#include "tm_membw.h"

#include "core/tm_threadpool.h"

#include <stdlib.h>

typedef struct {
    const uint64_t *buf;   /* (n) words */
    size_t n;
    uint64_t sums[64];     /* per thread, keeps the reads alive */
} read_task;

static void read_fn(void *p, int ith, int nth) {
    read_task *t = p;
    int64_t lo, hi;
    tm_split_range((int64_t)(t->n / 8), ith, nth, &lo, &hi);
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (int64_t i = lo * 8; i < hi * 8; i += 8) {
        a += t->buf[i] ^ t->buf[i + 4];
        b += t->buf[i + 1] ^ t->buf[i + 5];
        c += t->buf[i + 2] ^ t->buf[i + 6];
        d += t->buf[i + 3] ^ t->buf[i + 7];
    }
    t->sums[ith % 64] = a + b + c + d;
}

tm_status tm_membw_measure(int n_threads, size_t bytes, int reps, double *gb_s, tm_error *err) {
    tm_threadpool *tp = NULL;
    tm_status s = tm_threadpool_create(n_threads, &tp, err);
    if (s != TM_OK) return s;
    uint64_t *buf = tm_aligned_alloc(4096, bytes);
    if (!buf) {
        tm_threadpool_free(tp);
        return tm_err(err, TM_ERR_NOMEM, "cannot allocate %zu bytes", bytes);
    }
    size_t n = bytes / sizeof(uint64_t);
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    read_task t = {buf, n, {0}};
    tm_threadpool_run(tp, read_fn, &t); /* warm-up */
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = tm_time_ns();
        tm_threadpool_run(tp, read_fn, &t);
        double gbs = (double)(n * sizeof(uint64_t)) / (double)(tm_time_ns() - t0);
        if (gbs > best) best = gbs;
    }
    *gb_s = best;
    tm_aligned_free(buf);
    tm_threadpool_free(tp);
    return TM_OK;
}
