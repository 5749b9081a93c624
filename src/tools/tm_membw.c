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

struct tm_membw_probe {
    tm_threadpool *tp;
    uint64_t *buf; /* (n) words */
    size_t n;
};

tm_status tm_membw_probe_create(int n_threads, size_t bytes, tm_membw_probe **out, tm_error *err) {
    *out = NULL;
    tm_membw_probe *p = calloc(1, sizeof *p);
    if (!p) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_status s = tm_threadpool_create(n_threads, &p->tp, err);
    if (s != TM_OK) {
        free(p);
        return s;
    }
    p->buf = tm_huge_alloc(bytes); /* the same pages as the weights it is compared with */
    if (!p->buf) {
        tm_membw_probe_free(p);
        return tm_err(err, TM_ERR_NOMEM, "cannot allocate %zu bytes", bytes);
    }
    p->n = bytes / sizeof(uint64_t);
    for (size_t i = 0; i < p->n; i++) p->buf[i] = i * 0x9e3779b97f4a7c15ull;
    *out = p;
    return TM_OK;
}

double tm_membw_probe_run(tm_membw_probe *p, int reps) {
    read_task t = {p->buf, p->n, {0}};
    tm_threadpool_run(p->tp, read_fn, &t); /* warm-up: threads awake, TLBs filled */
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = tm_time_ns();
        tm_threadpool_run(p->tp, read_fn, &t);
        double gbs = (double)(p->n * sizeof(uint64_t)) / (double)(tm_time_ns() - t0);
        if (gbs > best) best = gbs;
    }
    return best;
}

void tm_membw_probe_free(tm_membw_probe *p) {
    if (!p) return;
    tm_huge_free(p->buf);
    tm_threadpool_free(p->tp);
    free(p);
}

tm_status tm_membw_measure(int n_threads, size_t bytes, int reps, double *gb_s, tm_error *err) {
    tm_membw_probe *p = NULL;
    tm_status s = tm_membw_probe_create(n_threads, bytes, &p, err);
    if (s != TM_OK) return s;
    *gb_s = tm_membw_probe_run(p, reps);
    tm_membw_probe_free(p);
    return TM_OK;
}
