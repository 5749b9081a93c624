/* test_metrics.c -- metrics tests: buckets, registration, concurrency, request timing, Prometheus text, percentiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/tm_metrics.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

static tm_metrics *make_empty(void) {
    tm_metrics *m = NULL;
    tm_error err = {0};
    tm_status st = tm_metrics_create_empty(&m, &err);
    if (st != TM_OK) fprintf(stderr, "create_empty: %s\n", err.msg);
    assert_int_equal(st, TM_OK);
    assert_non_null(m);
    return m;
}

static tm_metrics *make_std(uint64_t max_model_len) {
    tm_metrics *m = NULL;
    tm_error err = {0};
    tm_status st = tm_metrics_create(max_model_len, &m, &err);
    if (st != TM_OK) fprintf(stderr, "create: %s\n", err.msg);
    assert_int_equal(st, TM_OK);
    assert_non_null(m);
    assert_non_null(tm_metrics_get_std(m));
    return m;
}

static tm_histogram *add_hist(tm_metrics *m, const char *name, const char *label_name, const char *label_value,
                              const double *b, size_t n) {
    tm_histogram *h = NULL;
    tm_error err = {0};
    tm_metric_desc d = {.name = name, .help = "h", .label_name = label_name, .label_value = label_value};
    tm_status st = tm_metrics_add_histogram(m, &d, b, n, &h, &err);
    if (st != TM_OK) fprintf(stderr, "add_histogram: %s\n", err.msg);
    assert_int_equal(st, TM_OK);
    assert_non_null(h);
    return h;
}

/* index of the bucket whose bound equals v exactly */
static size_t bound_index(const double *b, size_t n, double v) {
    for (size_t i = 0; i < n; i++)
        if (b[i] == v) return i;
    fail_msg("bound %g not found", v);
    return n;
}

static char *render(const tm_metrics *m) {
    char *text = NULL;
    size_t len = 0;
    tm_error err = {0};
    tm_status st = tm_metrics_render_alloc(m, &text, &len, &err);
    if (st != TM_OK) fprintf(stderr, "render: %s\n", err.msg);
    assert_int_equal(st, TM_OK);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    return text;
}

/* the value on the line that starts with `series ` (exact series text), as a double; fails if absent */
static double sample_value(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol);
        if ((size_t)(eol - line) > n && strncmp(line, series, n) == 0 && line[n] == ' ') {
            char *end = NULL;
            double v = strtod(line + n + 1, &end);
            assert_ptr_equal(end, eol);
            return v;
        }
        line = eol + 1;
    }
    fail_msg("series '%s' not found", series);
    return NAN;
}

/* ---- buckets and basic objects ------------------------------------------------------------------- */

static void test_bucket_boundaries(void **state) {
    (void)state;
    tm_metrics *m = make_empty();
    const double b[3] = {0.1, 1.0, 10.0};
    tm_histogram *h = add_hist(m, "x_seconds", NULL, NULL, b, 3);
    tm_hist_snapshot s;

    tm_histogram_observe(h, 0.1); /* le is inclusive */
    tm_histogram_snapshot(h, &s);
    assert_int_equal(s.counts[0], 1);
    tm_histogram_observe(h, nextafter(0.1, 1.0)); /* just above: next bucket */
    tm_histogram_observe(h, 1.0);
    tm_histogram_observe(h, nextafter(1.0, 0.0)); /* just below 1: still bucket le=1 */
    tm_histogram_observe(h, 10.0);
    tm_histogram_observe(h, nextafter(10.0, 100.0)); /* above every bound: +Inf */
    tm_histogram_observe(h, 1e300);
    tm_histogram_observe(h, -5.0); /* negative: first bucket */
    tm_histogram_observe(h, 0.0);
    tm_histogram_observe(h, NAN); /* ignored */
    tm_histogram_observe(h, INFINITY);
    tm_histogram_observe(h, -INFINITY);
    tm_histogram_snapshot(h, &s);
    assert_int_equal(s.n_bounds, 3);
    assert_int_equal(s.counts[0], 3); /* 0.1, -5, 0 */
    assert_int_equal(s.counts[1], 3); /* 0.1+, 1, 1- */
    assert_int_equal(s.counts[2], 1); /* 10 */
    assert_int_equal(s.counts[3], 2); /* 10+, 1e300 */
    assert_int_equal(s.count, 9);
    double want = 0.1 + nextafter(0.1, 1.0) + 1.0 + nextafter(1.0, 0.0) + 10.0 + nextafter(10.0, 100.0) + 1e300 - 5.0;
    assert_true(fabs(s.sum - want) <= 1e-12 * fabs(want));

    /* every vLLM TTFT bound lands in its own bucket; one ulp above lands in the next */
    const double *tb = tm_metrics_ttft_bounds;
    size_t tn = tm_metrics_ttft_bounds_n;
    assert_int_equal(tn, 22);
    tm_histogram *t = add_hist(m, "ttft", NULL, NULL, tb, tn);
    for (size_t i = 0; i < tn; i++) {
        tm_histogram_observe(t, tb[i]);
        tm_histogram_observe(t, nextafter(tb[i], INFINITY));
    }
    tm_histogram_snapshot(t, &s);
    assert_int_equal(s.counts[0], 1);
    for (size_t i = 1; i < tn; i++) assert_int_equal(s.counts[i], 2);
    assert_int_equal(s.counts[tn], 1);
    assert_int_equal(s.count, 2 * tn);
    tm_metrics_free(m);
}

static void test_counter_gauge(void **state) {
    (void)state;
    tm_metrics *m = make_empty();
    tm_counter *c = NULL;
    tm_gauge *g = NULL;
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "c_total", .help = "c"}, &c, NULL), TM_OK);
    assert_int_equal(tm_metrics_add_gauge(m, &(tm_metric_desc){.name = "g", .help = "g"}, &g, NULL), TM_OK);
    assert_int_equal(tm_counter_get(c), 0);
    tm_counter_inc(c);
    tm_counter_add(c, 41);
    assert_int_equal(tm_counter_get(c), 42);
    assert_true(tm_gauge_get(g) == 0.0);
    tm_gauge_set(g, 2.5);
    tm_gauge_inc(g);
    tm_gauge_dec(g);
    tm_gauge_dec(g);
    tm_gauge_add(g, 0.25);
    assert_true(tm_gauge_get(g) == 1.75);
    tm_gauge_set(g, -3.0);
    assert_true(tm_gauge_get(g) == -3.0);

    tm_metrics *s = make_std(2048);
    tm_metrics_set_sched(s, 3, 5, 0.5);
    tm_metrics_std *sd = tm_metrics_get_std(s);
    assert_true(tm_gauge_get(sd->running) == 3.0);
    assert_true(tm_gauge_get(sd->waiting) == 5.0);
    assert_true(tm_gauge_get(sd->kv_usage) == 0.5);
    tm_metrics_set_sched(m, 1, 1, 1.0); /* no standard set: a no-op */
    assert_null(tm_metrics_get_std(m));
    tm_metrics_free(s);
    tm_metrics_free(m);
}

static void test_registration_errors(void **state) {
    (void)state;
    tm_metrics *m = make_empty();
    tm_error err = {0};
    tm_counter *c = NULL;
    tm_histogram *h = NULL;
    const double ok_b[2] = {1, 2};

    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "9bad"}, &c, &err), TM_ERR_INVALID);
    assert_null(c);
    assert_non_null(strstr(err.msg, "9bad"));
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "a-b"}, &c, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = ""}, &c, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = NULL}, &c, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_counter(m, NULL, &c, &err), TM_ERR_INVALID);

    /* unlabeled twice */
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "u_total", .help = "u"}, &c, &err), TM_OK);
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "u_total", .help = "u"}, &c, &err),
                     TM_ERR_INVALID);
    /* same name, another type */
    assert_int_equal(tm_metrics_add_gauge(m, &(tm_metric_desc){.name = "u_total", .help = "u"}, NULL, &err),
                     TM_ERR_INVALID);
    /* labeled family: distinct values ok, duplicate value, other label name, other help, missing value */
    tm_metric_desc d = {.name = "l_total", .help = "l", .label_name = "k", .label_value = "a"};
    assert_int_equal(tm_metrics_add_counter(m, &d, &c, &err), TM_OK);
    d.label_value = "b";
    assert_int_equal(tm_metrics_add_counter(m, &d, &c, &err), TM_OK);
    assert_int_equal(tm_metrics_add_counter(m, &d, &c, &err), TM_ERR_INVALID);
    d.label_value = "c";
    d.label_name = "j";
    assert_int_equal(tm_metrics_add_counter(m, &d, &c, &err), TM_ERR_INVALID);
    d.label_name = "k";
    d.help = "other";
    assert_int_equal(tm_metrics_add_counter(m, &d, &c, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "v_total", .label_name = "k"}, &c, &err),
                     TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "v_total", .label_value = "x"}, &c, &err),
                     TM_ERR_INVALID);
    assert_int_equal(
        tm_metrics_add_counter(m, &(tm_metric_desc){.name = "v_total", .label_name = "__r", .label_value = "x"}, &c,
                               &err),
        TM_ERR_INVALID);
    assert_int_equal(
        tm_metrics_add_counter(m, &(tm_metric_desc){.name = "v_total", .label_name = "a:b", .label_value = "x"}, &c,
                               &err),
        TM_ERR_INVALID);

    /* histogram bounds */
    tm_metric_desc hd = {.name = "h", .help = "h"};
    const double dec[3] = {1, 3, 2}, dup[2] = {1, 1}, inf[2] = {1, INFINITY}, nan_[2] = {NAN, 1};
    double many[TM_HIST_MAX_BOUNDS + 1];
    for (int i = 0; i <= TM_HIST_MAX_BOUNDS; i++) many[i] = i;
    assert_int_equal(tm_metrics_add_histogram(m, &hd, dec, 3, &h, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, dup, 2, &h, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, inf, 2, &h, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, nan_, 2, &h, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, ok_b, 0, &h, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, NULL, 2, &h, &err), TM_ERR_INVALID);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, many, TM_HIST_MAX_BOUNDS + 1, &h, &err), TM_ERR_INVALID);
    assert_null(h);
    assert_int_equal(tm_metrics_add_histogram(m, &hd, many, TM_HIST_MAX_BOUNDS, &h, &err), TM_OK);
    assert_non_null(h);
    tm_metric_desc le = {.name = "h2", .help = "h", .label_name = "le", .label_value = "1"};
    assert_int_equal(tm_metrics_add_histogram(m, &le, ok_b, 2, &h, &err), TM_ERR_INVALID);

    tm_metrics *x = NULL;
    assert_int_equal(tm_metrics_create(0, &x, &err), TM_ERR_INVALID);
    assert_null(x);
    tm_metrics_free(NULL);
    tm_metrics_free(m);
}

static void test_buckets_1_2_5(void **state) {
    (void)state;
    double b[TM_HIST_MAX_BOUNDS];
    const double want[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000};
    size_t n = tm_metrics_buckets_1_2_5(2048, b, TM_HIST_MAX_BOUNDS);
    assert_int_equal(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) assert_true(b[i] == want[i]);
    assert_int_equal(tm_metrics_buckets_1_2_5(1, b, TM_HIST_MAX_BOUNDS), 1);
    assert_int_equal(tm_metrics_buckets_1_2_5(2000, b, TM_HIST_MAX_BOUNDS), 11); /* max is inclusive */
    assert_int_equal(tm_metrics_buckets_1_2_5(1999, b, TM_HIST_MAX_BOUNDS), 10);
    assert_int_equal(tm_metrics_buckets_1_2_5(1000, b, 4), 4); /* capped */
    /* 10^0 .. 10^18 with all three mantissas, then 1e19 (2e19 overflows uint64) */
    n = tm_metrics_buckets_1_2_5(UINT64_MAX, b, TM_HIST_MAX_BOUNDS);
    assert_int_equal(n, 58);
    assert_true(b[57] == 1e19);
    /* the standard set takes the same list for the token histograms */
    tm_metrics *m = make_std(UINT64_MAX);
    tm_hist_snapshot s;
    tm_histogram_snapshot(tm_metrics_get_std(m)->prompt_tokens, &s);
    assert_int_equal(s.n_bounds, 58);
    tm_metrics_free(m);
}

/* ---- concurrency ----------------------------------------------------------------------------------- */

enum { N_WRITERS = 4, N_OBS = 100000 };

typedef struct {
    tm_histogram *h;
    tm_counter *c;
    tm_gauge *g;
    int id;
    pthread_barrier_t *start; /* all writers begin together, so their atomics really contend */
} writer_arg;

typedef struct {
    const tm_metrics *m;
    atomic_int *done;
    int renders;
    bool ok;
} reader_arg;

static void *writer(void *p) {
    writer_arg *a = p;
    static const double vals[4] = {0.25, 0.5, 1.0, 2.0};
    pthread_barrier_wait(a->start);
    for (int j = 0; j < N_OBS; j++) {
        tm_histogram_observe(a->h, vals[(j + a->id) & 3]);
        tm_counter_inc(a->c);
        tm_gauge_inc(a->g);
        if (j & 1) tm_gauge_dec(a->g);
    }
    return NULL;
}

/* Renders while the writers run: each text must be self-consistent (+Inf bucket == _count, buckets
 * cumulative) and counts must never go backwards between renders. */
static void *reader(void *p) {
    reader_arg *a = p;
    a->ok = true;
    size_t cap = 4096;
    char *buf = malloc(cap);
    if (!buf) {
        a->ok = false;
        return NULL;
    }
    double last_count = 0, last_counter = 0;
    do {
        size_t len = 0;
        if (tm_metrics_render(a->m, buf, cap, &len, NULL) != TM_OK) {
            a->ok = false;
            break;
        }
        double b0 = 0, b1 = 0, b2 = 0, binf = 0, cnt = 0, ctr = 0;
        if (sscanf(strstr(buf, "conc_seconds_bucket{le=\"0.25\"}"), "conc_seconds_bucket{le=\"0.25\"} %lf", &b0) != 1 ||
            sscanf(strstr(buf, "conc_seconds_bucket{le=\"0.5\"}"), "conc_seconds_bucket{le=\"0.5\"} %lf", &b1) != 1 ||
            sscanf(strstr(buf, "conc_seconds_bucket{le=\"1\"}"), "conc_seconds_bucket{le=\"1\"} %lf", &b2) != 1 ||
            sscanf(strstr(buf, "conc_seconds_bucket{le=\"+Inf\"}"), "conc_seconds_bucket{le=\"+Inf\"} %lf", &binf) != 1 ||
            sscanf(strstr(buf, "conc_seconds_count "), "conc_seconds_count %lf", &cnt) != 1 ||
            sscanf(strstr(buf, "\nconc_total "), "\nconc_total %lf", &ctr) != 1) {
            a->ok = false;
            break;
        }
        if (!(b0 <= b1 && b1 <= b2 && b2 <= binf && binf == cnt && cnt >= last_count && ctr >= last_counter)) {
            a->ok = false;
            break;
        }
        last_count = cnt;
        last_counter = ctr;
        a->renders++;
    } while (!atomic_load(a->done));
    free(buf);
    return NULL;
}

static void test_concurrent_exact(void **state) {
    (void)state;
    tm_metrics *m = make_empty();
    const double b[3] = {0.25, 0.5, 1.0};
    tm_histogram *h = add_hist(m, "conc_seconds", NULL, NULL, b, 3);
    tm_counter *c = NULL;
    tm_gauge *g = NULL;
    assert_int_equal(tm_metrics_add_counter(m, &(tm_metric_desc){.name = "conc_total", .help = "c"}, &c, NULL), TM_OK);
    assert_int_equal(tm_metrics_add_gauge(m, &(tm_metric_desc){.name = "conc_gauge", .help = "g"}, &g, NULL), TM_OK);

    atomic_int done = 0;
    reader_arg ra = {m, &done, 0, false};
    pthread_t rt, wt[N_WRITERS];
    writer_arg wa[N_WRITERS];
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, N_WRITERS), 0);
    assert_int_equal(pthread_create(&rt, NULL, reader, &ra), 0);
    for (int i = 0; i < N_WRITERS; i++) {
        wa[i] = (writer_arg){h, c, g, i, &start};
        assert_int_equal(pthread_create(&wt[i], NULL, writer, &wa[i]), 0);
    }
    for (int i = 0; i < N_WRITERS; i++) assert_int_equal(pthread_join(wt[i], NULL), 0);
    atomic_store(&done, 1);
    assert_int_equal(pthread_join(rt, NULL), 0);
    pthread_barrier_destroy(&start);
    assert_true(ra.ok);
    assert_true(ra.renders >= 1);

    tm_hist_snapshot s;
    tm_histogram_snapshot(h, &s);
    assert_int_equal(s.count, (uint64_t)N_WRITERS * N_OBS);
    for (int i = 0; i < 4; i++) assert_int_equal(s.counts[i], (uint64_t)N_WRITERS * N_OBS / 4);
    /* dyadic values: every partial sum is exact, whatever the interleaving */
    assert_true(s.sum == (double)N_WRITERS * N_OBS / 4 * (0.25 + 0.5 + 1.0 + 2.0));
    assert_int_equal(tm_counter_get(c), (uint64_t)N_WRITERS * N_OBS);
    assert_true(tm_gauge_get(g) == (double)N_WRITERS * N_OBS / 2);
    tm_metrics_free(m);
}

/* ---- per-request timing ------------------------------------------------------------------------ */

static void check_hist(tm_histogram *h, uint64_t count, double sum, const size_t *buckets, size_t n_buckets) {
    tm_hist_snapshot s;
    tm_histogram_snapshot(h, &s);
    assert_int_equal(s.count, count);
    if (fabs(s.sum - sum) > 1e-12) fail_msg("sum %.17g, want %.17g", s.sum, sum);
    /* the listed bucket indices (with repeats) hold exactly these observations */
    uint64_t want[TM_HIST_MAX_BOUNDS + 1] = {0};
    for (size_t i = 0; i < n_buckets; i++) want[buckets[i]]++;
    for (size_t i = 0; i <= s.n_bounds; i++)
        if (s.counts[i] != want[i]) fail_msg("bucket %zu: %llu, want %llu", i, (unsigned long long)s.counts[i],
                                             (unsigned long long)want[i]);
}

static void test_req_timing(void **state) {
    (void)state;
    tm_metrics *m = make_std(2048);
    tm_metrics_std *sd = tm_metrics_get_std(m);
    const double *tb = tm_metrics_ttft_bounds, *pb = tm_metrics_tpot_bounds, *lb = tm_metrics_latency_bounds;
    size_t tn = tm_metrics_ttft_bounds_n, pn = tm_metrics_tpot_bounds_n, ln = tm_metrics_latency_bounds_n;

    /* request 1: queued 0.5 s, first token at +1 s, three more tokens, stops on length */
    tm_req_timing t;
    tm_req_on_arrival(&t, 100.0, 7);
    tm_req_on_scheduled(&t, 100.5);
    tm_req_on_token(&t, m, 101.0);
    assert_int_equal(tm_counter_get(sd->prompt_tokens_total), 7); /* counted when prefill completes */
    tm_req_on_token(&t, m, 101.25);
    tm_req_on_token(&t, m, 101.5);
    tm_req_on_token(&t, m, 102.0);
    assert_true(tm_req_on_finish(&t, m, 102.0, TM_FINISH_LENGTH));
    assert_false(tm_req_on_finish(&t, m, 103.0, TM_FINISH_STOP)); /* once */
    tm_req_on_token(&t, m, 104.0);                                  /* ignored after finish */

    tm_req_stats r = tm_req_timing_stats(&t);
    assert_true(r.ttft == 1.0);
    assert_true(r.tpot == 1.0 / 3.0);
    assert_true(r.itl_mean == 1.0 / 3.0);
    assert_true(r.e2e == 2.0);
    assert_true(r.queue == 0.5);
    assert_int_equal(t.n_generated, 4);
    assert_int_equal(t.n_itl, 3);
    assert_true(t.itl_max == 0.5);

    check_hist(sd->ttft, 1, 1.0, (size_t[]){bound_index(tb, tn, 1.0)}, 1);
    check_hist(sd->itl, 3, 1.0,
               (size_t[]){bound_index(pb, pn, 0.3), bound_index(pb, pn, 0.3), bound_index(pb, pn, 0.5)}, 3);
    check_hist(sd->tpot, 1, 1.0 / 3.0, (size_t[]){bound_index(pb, pn, 0.4)}, 1);
    check_hist(sd->e2e, 1, 2.0, (size_t[]){bound_index(lb, ln, 2.0)}, 1);
    check_hist(sd->queue, 1, 0.5, (size_t[]){bound_index(lb, ln, 0.5)}, 1);
    check_hist(sd->prompt_tokens, 1, 7.0, (size_t[]){3}, 1); /* 1,2,5,[10] */
    check_hist(sd->gen_tokens, 1, 4.0, (size_t[]){2}, 1);    /* 1,2,[5] */
    assert_int_equal(tm_counter_get(sd->gen_tokens_total), 4);
    assert_int_equal(tm_counter_get(sd->success[TM_FINISH_LENGTH]), 1);
    assert_int_equal(tm_counter_get(sd->success[TM_FINISH_STOP]), 0);
    assert_int_equal(tm_counter_get(sd->success[TM_FINISH_ABORT]), 0);

    /* request 2: aborted while still queued: no TTFT/TPOT, queue time = whole life */
    tm_req_on_arrival(&t, 200.0, 3);
    assert_true(tm_req_on_finish(&t, m, 203.0, TM_FINISH_ABORT));
    r = tm_req_timing_stats(&t);
    assert_true(isnan(r.ttft) && isnan(r.tpot) && isnan(r.itl_mean));
    assert_true(r.e2e == 3.0 && r.queue == 3.0);
    check_hist(sd->ttft, 1, 1.0, (size_t[]){bound_index(tb, tn, 1.0)}, 1);
    check_hist(sd->tpot, 1, 1.0 / 3.0, (size_t[]){bound_index(pb, pn, 0.4)}, 1);
    check_hist(sd->e2e, 2, 5.0, (size_t[]){bound_index(lb, ln, 2.0), bound_index(lb, ln, 5.0)}, 2);
    check_hist(sd->queue, 2, 3.5, (size_t[]){bound_index(lb, ln, 0.5), bound_index(lb, ln, 5.0)}, 2);
    check_hist(sd->gen_tokens, 2, 4.0, (size_t[]){2, 0}, 2); /* 0 tokens: first bucket */
    assert_int_equal(tm_counter_get(sd->prompt_tokens_total), 7);
    assert_int_equal(tm_counter_get(sd->success[TM_FINISH_ABORT]), 1);

    /* request 3: preempted after its first token and re-admitted; a speculative step yields 3 tokens */
    tm_req_on_arrival(&t, 300.0, 1);
    tm_req_on_scheduled(&t, 301.0);
    tm_req_on_token(&t, m, 302.0);
    tm_counter_inc(sd->preemptions);
    tm_req_on_scheduled(&t, 305.0);
    tm_req_on_tokens(&t, m, 306.0, 3);
    tm_req_on_tokens(&t, m, 307.0, 0); /* no tokens: ignored */
    assert_true(tm_req_on_finish(&t, m, 306.0, TM_FINISH_STOP));
    r = tm_req_timing_stats(&t);
    assert_int_equal(t.n_scheduled, 2);
    assert_true(t.first_scheduled == 301.0 && t.last_scheduled == 305.0);
    assert_true(r.queue == 1.0);          /* until the first admission */
    assert_true(r.tpot == 4.0 / 3.0);     /* (306 - 302) / (4 - 1) */
    assert_true(r.itl_mean == 4.0);       /* one step, one gap */
    check_hist(sd->itl, 4, 5.0,
               (size_t[]){bound_index(pb, pn, 0.3), bound_index(pb, pn, 0.3), bound_index(pb, pn, 0.5),
                          bound_index(pb, pn, 5.0)},
               4);
    check_hist(sd->ttft, 2, 3.0, (size_t[]){bound_index(tb, tn, 1.0), bound_index(tb, tn, 2.5)}, 2);
    check_hist(sd->tpot, 2, 1.0 / 3.0 + 4.0 / 3.0, (size_t[]){bound_index(pb, pn, 0.4), bound_index(pb, pn, 2.5)}, 2);
    assert_int_equal(tm_counter_get(sd->gen_tokens_total), 8);
    assert_int_equal(tm_counter_get(sd->prompt_tokens_total), 8);
    assert_int_equal(tm_counter_get(sd->success[TM_FINISH_STOP]), 1);
    assert_int_equal(tm_counter_get(sd->preemptions), 1);

    /* a clock that goes backwards is clamped, never negative; NULL registry: record only */
    tm_req_on_arrival(&t, 50.0, 2);
    tm_req_on_scheduled(&t, 49.0);
    tm_req_on_token(&t, NULL, 48.0);
    assert_true(tm_req_on_finish(&t, NULL, 47.0, (tm_finish_reason)99)); /* bad reason -> abort */
    r = tm_req_timing_stats(&t);
    assert_true(r.ttft == 0.0 && r.queue == 0.0 && r.e2e == 0.0);
    assert_int_equal(t.reason, TM_FINISH_ABORT);
    assert_int_equal(tm_counter_get(sd->gen_tokens_total), 8); /* registry untouched */

    /* a record that never arrived ignores everything */
    tm_req_timing z = {0};
    tm_req_on_scheduled(&z, 1.0);
    tm_req_on_token(&z, m, 2.0);
    assert_false(tm_req_on_finish(&z, m, 3.0, TM_FINISH_STOP));
    assert_int_equal(z.n_generated, 0);
    assert_int_equal(z.n_scheduled, 0);
    assert_int_equal(tm_counter_get(sd->gen_tokens_total), 8);
    assert_int_equal(tm_counter_get(sd->success[TM_FINISH_STOP]), 1);
    tm_metrics_free(m);
}

/* ---- Prometheus text ---------------------------------------------------------------------------- */

static const char golden[] =
    "# HELP demo_requests_total Requests by \"reason\".\\nBackslash \\\\ here.\n"
    "# TYPE demo_requests_total counter\n"
    "demo_requests_total{reason=\"stop\"} 9007199254740993\n"
    "demo_requests_total{reason=\"we\\\"ird\\\\\\n\"} 1\n"
    "# HELP demo_temperature Temperature.\n"
    "# TYPE demo_temperature gauge\n"
    "demo_temperature -1.5\n"
    "# HELP demo_small tiny\n"
    "# TYPE demo_small gauge\n"
    "demo_small 1e-07\n"
    "# HELP demo_latency_seconds Latency.\n"
    "# TYPE demo_latency_seconds histogram\n"
    "demo_latency_seconds_bucket{stage=\"a\",le=\"0.125\"} 2\n"
    "demo_latency_seconds_bucket{stage=\"a\",le=\"1\"} 3\n"
    "demo_latency_seconds_bucket{stage=\"a\",le=\"2.5\"} 3\n"
    "demo_latency_seconds_bucket{stage=\"a\",le=\"+Inf\"} 4\n"
    "demo_latency_seconds_sum{stage=\"a\"} 4.1875\n"
    "demo_latency_seconds_count{stage=\"a\"} 4\n"
    "# HELP demo_plain_seconds Plain.\n"
    "# TYPE demo_plain_seconds histogram\n"
    "demo_plain_seconds_bucket{le=\"0.1\"} 1\n"
    "demo_plain_seconds_bucket{le=\"+Inf\"} 1\n"
    "demo_plain_seconds_sum 0.1\n"
    "demo_plain_seconds_count 1\n";

static tm_metrics *make_golden(void) {
    tm_metrics *m = make_empty();
    tm_counter *c1 = NULL, *c2 = NULL;
    tm_gauge *g1 = NULL, *g2 = NULL;
    tm_histogram *h = NULL, *p = NULL;
    const char *help = "Requests by \"reason\".\nBackslash \\ here.";
    assert_int_equal(tm_metrics_add_counter(m,
                                            &(tm_metric_desc){.name = "demo_requests_total", .help = help,
                                                              .label_name = "reason", .label_value = "stop"},
                                            &c1, NULL),
                     TM_OK);
    assert_int_equal(tm_metrics_add_gauge(m, &(tm_metric_desc){.name = "demo_temperature", .help = "Temperature."},
                                          &g1, NULL),
                     TM_OK);
    assert_int_equal(tm_metrics_add_counter(m,
                                            &(tm_metric_desc){.name = "demo_requests_total", .help = help,
                                                              .label_name = "reason", .label_value = "we\"ird\\\n"},
                                            &c2, NULL),
                     TM_OK);
    assert_int_equal(tm_metrics_add_gauge(m, &(tm_metric_desc){.name = "demo_small", .help = "tiny"}, &g2, NULL),
                     TM_OK);
    const double b[3] = {0.125, 1.0, 2.5};
    assert_int_equal(tm_metrics_add_histogram(m,
                                              &(tm_metric_desc){.name = "demo_latency_seconds", .help = "Latency.",
                                                                .label_name = "stage", .label_value = "a"},
                                              b, 3, &h, NULL),
                     TM_OK);
    const double pb[1] = {0.1};
    assert_int_equal(tm_metrics_add_histogram(m, &(tm_metric_desc){.name = "demo_plain_seconds", .help = "Plain."},
                                              pb, 1, &p, NULL),
                     TM_OK);
    tm_counter_add(c1, 9007199254740993ull); /* 2^53 + 1: not representable as a double */
    tm_counter_inc(c2);
    tm_gauge_set(g1, -1.5);
    tm_gauge_set(g2, 1e-7);
    tm_histogram_observe(h, 0.125);
    tm_histogram_observe(h, 0.0625);
    tm_histogram_observe(h, 1.0);
    tm_histogram_observe(h, 3.0);
    tm_histogram_observe(p, 0.1);
    return m;
}

static void test_render_golden(void **state) {
    (void)state;
    tm_metrics *m = make_golden();
    char *text = render(m);
    assert_string_equal(text, golden);
    free(text);

    /* an empty registry renders nothing */
    tm_metrics *e = make_empty();
    char buf[4] = "xyz";
    size_t len = 99;
    assert_int_equal(tm_metrics_render(e, buf, sizeof buf, &len, NULL), TM_OK);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    tm_metrics_free(e);
    tm_metrics_free(m);
}

static void test_render_too_small(void **state) {
    (void)state;
    tm_metrics *m = make_golden();
    size_t need = sizeof golden - 1;
    tm_error err = {0};
    size_t len = 0;

    /* measure only */
    assert_int_equal(tm_metrics_render(m, NULL, 0, &len, &err), TM_ERR_RANGE);
    assert_int_equal(len, need);
    assert_int_equal(err.code, TM_ERR_RANGE);
    assert_non_null(strstr(err.msg, "needs"));

    char *buf = malloc(need + 1);
    assert_non_null(buf);
    /* one byte short (no room for the NUL): error, truncated prefix, NUL-terminated */
    memset(buf, '#', need + 1);
    assert_int_equal(tm_metrics_render(m, buf, need, &len, &err), TM_ERR_RANGE);
    assert_int_equal(len, need);
    assert_int_equal(strlen(buf), need - 1);
    assert_memory_equal(buf, golden, need - 1);
    /* tiny buffer */
    assert_int_equal(tm_metrics_render(m, buf, 10, &len, &err), TM_ERR_RANGE);
    assert_string_equal(buf, "# HELP de");
    /* exact fit */
    assert_int_equal(tm_metrics_render(m, buf, need + 1, &len, &err), TM_OK);
    assert_int_equal(len, need);
    assert_string_equal(buf, golden);
    assert_int_equal(tm_metrics_render(m, NULL, 5, &len, &err), TM_ERR_INVALID);
    free(buf);
    tm_metrics_free(m);
}

/* Parse a label set {a="x",b="y"} starting at *p; returns le's value (unescaped) in le_out, if any. */
static bool parse_labels(const char **pp, char *le_out, size_t le_cap) {
    const char *p = *pp;
    le_out[0] = '\0';
    if (*p != '{') return true;
    p++;
    for (;;) {
        const char *name = p;
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_')) return false;
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (*p >= '0' && *p <= '9')) p++;
        bool is_le = (p - name == 2 && strncmp(name, "le", 2) == 0);
        if (*p++ != '=' || *p++ != '"') return false;
        size_t n = 0;
        while (*p != '"') {
            char ch = *p;
            if (ch == '\n' || ch == '\0') return false;
            if (ch == '\\') {
                p++;
                if (*p == 'n') ch = '\n';
                else if (*p == '\\' || *p == '"') ch = *p;
                else return false;
            }
            if (is_le && n + 1 < le_cap) le_out[n++] = ch;
            p++;
        }
        if (is_le) le_out[n] = '\0';
        p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p != '}') return false;
        *pp = p + 1;
        return true;
    }
}

static double parse_value(const char *s, const char *eol) {
    size_t n = (size_t)(eol - s);
    if (n == 4 && strncmp(s, "+Inf", 4) == 0) return INFINITY;
    if (n == 4 && strncmp(s, "-Inf", 4) == 0) return -INFINITY;
    if (n == 3 && strncmp(s, "NaN", 3) == 0) return NAN;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end != eol || n == 0) fail_msg("bad value '%.*s'", (int)n, s);
    return v;
}

/* A line-by-line parser of the 0.0.4 text format, enough to validate our own output. */
static void parse_exposition(const char *text, size_t *n_families, size_t *n_samples) {
    char fam[256] = "", type[32] = "";
    double last_cum = -1, inf_bucket = -1;
    bool want_type = false;
    *n_families = *n_samples = 0;
    assert_true(text[0] == '\0' || text[strlen(text) - 1] == '\n');
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol);
        assert_true(eol > line); /* no blank lines */
        if (strncmp(line, "# HELP ", 7) == 0) {
            assert_false(want_type);
            const char *sp = memchr(line + 7, ' ', (size_t)(eol - line - 7));
            assert_non_null(sp);
            snprintf(fam, sizeof fam, "%.*s", (int)(sp - line - 7), line + 7);
            for (const char *q = sp + 1; q < eol; q++)
                if (*q == '\\') {
                    assert_true(q[1] == '\\' || q[1] == 'n');
                    q++;
                }
            want_type = true;
            (*n_families)++;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            assert_true(want_type);
            size_t fl = strlen(fam);
            assert_true(strncmp(line + 7, fam, fl) == 0 && line[7 + fl] == ' ');
            snprintf(type, sizeof type, "%.*s", (int)(eol - line - 8 - fl), line + 8 + fl);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 || strcmp(type, "histogram") == 0);
            want_type = false;
            last_cum = -1;
            inf_bucket = -1;
        } else {
            assert_false(want_type);
            assert_true(line[0] != '#');
            const char *p = line;
            while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':' ||
                   (*p >= '0' && *p <= '9'))
                p++;
            char name[300];
            snprintf(name, sizeof name, "%.*s", (int)(p - line), line);
            char le[64];
            assert_true(parse_labels(&p, le, sizeof le));
            assert_true(*p == ' ');
            double v = parse_value(p + 1, eol);
            size_t fl = strlen(fam);
            assert_true(strncmp(name, fam, fl) == 0);
            const char *suffix = name + fl;
            if (strcmp(type, "histogram") == 0) {
                if (strcmp(suffix, "_bucket") == 0) {
                    assert_true(le[0] != '\0');
                    assert_true(v >= last_cum); /* cumulative */
                    last_cum = v;
                    if (strcmp(le, "+Inf") == 0) inf_bucket = v;
                    else assert_true(isfinite(parse_value(le, le + strlen(le))));
                } else if (strcmp(suffix, "_count") == 0) {
                    assert_true(v == inf_bucket);
                    last_cum = -1;
                } else {
                    assert_string_equal(suffix, "_sum");
                    assert_true(inf_bucket >= 0); /* buckets come first */
                }
            } else {
                assert_string_equal(suffix, "");
                assert_true(le[0] == '\0');
                if (strcmp(type, "counter") == 0) assert_true(v >= 0 && v == floor(v));
            }
            (*n_samples)++;
        }
        line = eol + 1;
    }
    assert_false(want_type);
}

static void test_render_standard_parses(void **state) {
    (void)state;
    tm_metrics *m = make_std(4096);
    tm_metrics_std *sd = tm_metrics_get_std(m);
    tm_req_timing t;
    tm_req_on_arrival(&t, 1.0, 300);
    tm_req_on_scheduled(&t, 1.0625);
    tm_req_on_token(&t, m, 1.25);
    tm_req_on_token(&t, m, 1.28125);
    tm_req_on_finish(&t, m, 1.28125, TM_FINISH_STOP);
    tm_metrics_set_sched(m, 2, 1, 0.375);
    tm_counter_add(sd->prefix_queries, 64);
    tm_counter_add(sd->prefix_hits, 48);

    char *text = render(m);
    size_t nf = 0, ns = 0;
    parse_exposition(text, &nf, &ns);
    assert_int_equal(nf, 16);
    /* 2 x 23 (TTFT) + 2 x 20 (TPOT, ITL) + 2 x 22 (E2E, queue) + 2 x 12 (tokens, 1..2000) bucket lines,
       7 x 2 sum/count, 3 gauges, 5 counters, 3 request_success series */
    assert_int_equal(ns, 23 + 2 * 20 + 2 * 22 + 2 * 12 + 7 * 2 + 3 + 5 + 3);
    assert_non_null(strstr(text, "# TYPE tokenmill:time_to_first_token_seconds histogram\n"));
    assert_non_null(strstr(text, "# TYPE tokenmill:request_success_total counter\n"));
    assert_true(sample_value(text, "tokenmill:request_success_total{finished_reason=\"stop\"}") == 1.0);
    assert_true(sample_value(text, "tokenmill:request_success_total{finished_reason=\"length\"}") == 0.0);
    assert_true(sample_value(text, "tokenmill:request_success_total{finished_reason=\"abort\"}") == 0.0);
    assert_true(sample_value(text, "tokenmill:time_to_first_token_seconds_bucket{le=\"0.25\"}") == 1.0);
    assert_true(sample_value(text, "tokenmill:time_to_first_token_seconds_bucket{le=\"0.1\"}") == 0.0);
    assert_true(sample_value(text, "tokenmill:time_to_first_token_seconds_sum") == 0.25);
    assert_true(sample_value(text, "tokenmill:inter_token_latency_seconds_bucket{le=\"0.025\"}") == 0.0);
    assert_true(sample_value(text, "tokenmill:inter_token_latency_seconds_bucket{le=\"0.05\"}") == 1.0);
    assert_true(sample_value(text, "tokenmill:request_queue_time_seconds_sum") == 0.0625);
    assert_true(sample_value(text, "tokenmill:request_prompt_tokens_bucket{le=\"200\"}") == 0.0);
    assert_true(sample_value(text, "tokenmill:request_prompt_tokens_bucket{le=\"500\"}") == 1.0);
    assert_true(sample_value(text, "tokenmill:request_prompt_tokens_bucket{le=\"2000\"}") == 1.0);
    assert_true(sample_value(text, "tokenmill:prompt_tokens_total") == 300.0);
    assert_true(sample_value(text, "tokenmill:generation_tokens_total") == 2.0);
    assert_true(sample_value(text, "tokenmill:prefix_cache_hits_total") == 48.0);
    assert_true(sample_value(text, "tokenmill:prefix_cache_queries_total") == 64.0);
    assert_true(sample_value(text, "tokenmill:num_preemptions_total") == 0.0);
    assert_true(sample_value(text, "tokenmill:kv_cache_usage_perc") == 0.375);
    assert_true(sample_value(text, "tokenmill:num_requests_running") == 2.0);
    assert_true(sample_value(text, "tokenmill:num_requests_waiting") == 1.0);
    free(text);

    /* the golden registry parses too */
    tm_metrics *g = make_golden();
    text = render(g);
    parse_exposition(text, &nf, &ns);
    assert_int_equal(nf, 5);
    assert_int_equal(ns, 2 + 1 + 1 + 6 + 4);
    free(text);
    tm_metrics_free(g);
    tm_metrics_free(m);
}

static void test_render_locale(void **state) {
    (void)state;
    static const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "ru_RU.UTF-8",
                                        "nl_NL.UTF-8", "es_ES.UTF-8", "it_IT.UTF-8", "pt_BR.UTF-8"};
    const char *name = NULL; /* setlocale's return value dies at the next call: keep our own pointer */
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !name; i++)
        if (setlocale(LC_NUMERIC, names[i])) name = names[i];
    char probe[16];
    snprintf(probe, sizeof probe, "%.1f", 1.5);
    if (!name || strcmp(probe, "1,5") != 0) {
        setlocale(LC_NUMERIC, "C");
        fprintf(stderr, "no locale with a ',' decimal point installed (e.g. localedef -i de_DE -f UTF-8 "
                        "de_DE.UTF-8); skipping\n");
        skip();
    }
    tm_metrics *m = make_golden();
    char *text = render(m);
    snprintf(probe, sizeof probe, "%.1f", 1.5);
    assert_string_equal(probe, "1,5"); /* the renderer left the caller's locale alone */
    setlocale(LC_NUMERIC, "C");
    assert_string_equal(text, golden);
    free(text);

    tm_metrics *s = make_std(1000);
    tm_metrics_set_sched(s, 1, 0, 0.5);
    assert_non_null(setlocale(LC_NUMERIC, name));
    text = render(s);
    setlocale(LC_NUMERIC, "C");
    for (const char *q = text; (q = strchr(q, ',')) != NULL; q++) assert_false(q[1] >= '0' && q[1] <= '9');
    assert_non_null(strstr(text, "tokenmill:kv_cache_usage_perc 0.5\n"));
    assert_non_null(strstr(text, "le=\"0.001\""));
    free(text);
    tm_metrics_free(s);
    tm_metrics_free(m);
}

/* ---- summaries ------------------------------------------------------------------------------------ */

static void test_hist_percentile(void **state) {
    (void)state;
    tm_metrics *m = make_empty();
    const double b[3] = {1.0, 2.0, 4.0};
    tm_histogram *h = add_hist(m, "p", NULL, NULL, b, 3);
    tm_summary e = tm_histogram_summary(h);
    assert_int_equal(e.count, 0);
    assert_true(isnan(e.mean) && isnan(e.p50) && isnan(e.p90) && isnan(e.p99));

    /* counts per bucket: [1, 2, 1, 1] (0.5 | 1.5 1.5 | 3 | 10) */
    const double obs[5] = {0.5, 1.5, 1.5, 3.0, 10.0};
    for (int i = 0; i < 5; i++) tm_histogram_observe(h, obs[i]);
    tm_hist_snapshot s;
    tm_histogram_snapshot(h, &s);
    /* rank = p/100*5; bucket (lo, hi] with count c and prev cumulative cp: lo + (hi-lo)*(rank-cp)/c */
    assert_true(tm_hist_snapshot_percentile(&s, 0) == 0.0);     /* rank 0: start of the first bucket */
    assert_true(tm_hist_snapshot_percentile(&s, 10) == 0.5);    /* rank .5 in (0,1]: 0 + 1*.5/1 */
    assert_true(tm_hist_snapshot_percentile(&s, 20) == 1.0);    /* rank 1: top of the first bucket */
    assert_true(tm_hist_snapshot_percentile(&s, 50) == 1.75);   /* rank 2.5 in (1,2]: 1 + 1*1.5/2 */
    assert_true(tm_hist_snapshot_percentile(&s, 60) == 2.0);    /* rank 3 */
    assert_true(tm_hist_snapshot_percentile(&s, 70) == 3.0);    /* rank 3.5 in (2,4]: 2 + 2*.5/1 */
    assert_true(tm_hist_snapshot_percentile(&s, 90) == 4.0);    /* rank 4.5: +Inf bucket -> largest bound */
    assert_true(tm_hist_snapshot_percentile(&s, 100) == 4.0);
    assert_true(isnan(tm_hist_snapshot_percentile(&s, -1)));
    assert_true(isnan(tm_hist_snapshot_percentile(&s, 100.5)));
    assert_true(isnan(tm_hist_snapshot_percentile(&s, NAN)));
    tm_summary r = tm_histogram_summary(h);
    assert_int_equal(r.count, 5);
    assert_true(r.mean == 16.5 / 5);
    assert_true(r.p50 == 1.75 && r.p90 == 4.0 && r.p99 == 4.0);

    /* empty buckets are skipped: all mass in (2,4] */
    const double b2[4] = {-1.0, 1.0, 2.0, 4.0};
    tm_histogram *h2 = add_hist(m, "p2", NULL, NULL, b2, 4);
    for (int i = 0; i < 4; i++) tm_histogram_observe(h2, 3.0);
    tm_histogram_snapshot(h2, &s);
    assert_true(tm_hist_snapshot_percentile(&s, 0) == 2.0);
    assert_true(tm_hist_snapshot_percentile(&s, 50) == 3.0);
    assert_true(tm_hist_snapshot_percentile(&s, 100) == 4.0);
    /* a first bound <= 0 is returned as is */
    tm_histogram_observe(h2, -7.0);
    tm_histogram_snapshot(h2, &s);
    assert_true(tm_hist_snapshot_percentile(&s, 10) == -1.0);
    tm_metrics_free(m);
}

static void test_stats_percentile(void **state) {
    (void)state;
    /* numpy.percentile([40, 15, 50, 35, 20], p) for p = 0, 25, 40, 50, 90, 99, 100 */
    double v[5] = {40, 15, 50, 35, 20};
    assert_true(tm_stats_percentile(v, 5, 0) == 15.0);
    assert_true(tm_stats_percentile(v, 5, 25) == 20.0);
    assert_true(fabs(tm_stats_percentile(v, 5, 40) - 29.0) < 1e-12);
    assert_true(tm_stats_percentile(v, 5, 50) == 35.0);
    assert_true(fabs(tm_stats_percentile(v, 5, 90) - 46.0) < 1e-12);
    assert_true(fabs(tm_stats_percentile(v, 5, 99) - 49.6) < 1e-12);
    assert_true(tm_stats_percentile(v, 5, 100) == 50.0);
    assert_true(v[0] == 15.0 && v[4] == 50.0); /* sorted in place */
    double one = 7.0;
    assert_true(tm_stats_percentile(&one, 1, 99) == 7.0);
    assert_true(isnan(tm_stats_percentile(v, 0, 50)));
    assert_true(isnan(tm_stats_percentile(NULL, 3, 50)));
    assert_true(isnan(tm_stats_percentile(v, 5, 101)));
    assert_true(isnan(tm_stats_percentile(v, 5, -0.5)));

    double w[4] = {4, 1, 3, 2};
    tm_summary s = tm_stats_summary(w, 4);
    assert_int_equal(s.count, 4);
    assert_true(s.mean == 2.5);
    assert_true(s.p50 == 2.5);                  /* 1 + 1.5 */
    assert_true(fabs(s.p90 - 3.7) < 1e-12);     /* pos 2.7 */
    assert_true(fabs(s.p99 - 3.97) < 1e-12);    /* pos 2.97 */
    s = tm_stats_summary(w, 0);
    assert_int_equal(s.count, 0);
    assert_true(isnan(s.mean) && isnan(s.p50));

    /* NaNs sort last, so the low percentiles stay finite */
    double x[3] = {NAN, 2.0, 1.0};
    assert_true(tm_stats_percentile(x, 3, 0) == 1.0);
    assert_true(tm_stats_percentile(x, 3, 50) == 2.0);
    assert_true(isnan(x[2]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_boundaries),
        cmocka_unit_test(test_counter_gauge),
        cmocka_unit_test(test_registration_errors),
        cmocka_unit_test(test_buckets_1_2_5),
        cmocka_unit_test(test_concurrent_exact),
        cmocka_unit_test(test_req_timing),
        cmocka_unit_test(test_render_golden),
        cmocka_unit_test(test_render_too_small),
        cmocka_unit_test(test_render_standard_parses),
        cmocka_unit_test(test_render_locale),
        cmocka_unit_test(test_hist_percentile),
        cmocka_unit_test(test_stats_percentile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
