/* test_threadpool.c -- every share of every run executes exactly once, whoever runs it; oversubscribed pools. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/tm_threadpool.h"

typedef struct count_task {
    atomic_int hits[16];     /* (nth) executions of each share in this run */
    atomic_int bad_nth;
    int expect_nth;
    int sleep_share;         /* this share sleeps a little (a slow or descheduled worker) */
} count_task;

static void count_fn(void *p, int ith, int nth) {
    count_task *t = p;
    if (nth != t->expect_nth) atomic_fetch_add(&t->bad_nth, 1);
    if (ith == t->sleep_share) usleep(200);
    atomic_fetch_add(&t->hits[ith], 1);
}

static void run_many(int n_threads, int runs, int sleep_share) {
    tm_threadpool *tp = NULL;
    tm_error err;
    assert_int_equal(tm_threadpool_create(n_threads, &tp, &err), TM_OK);
    assert_int_equal(tm_threadpool_size(tp), n_threads);
    for (int r = 0; r < runs; r++) {
        count_task t = {.expect_nth = n_threads, .sleep_share = (r % 7 == 0) ? sleep_share : -1};
        for (int i = 0; i < 16; i++) atomic_init(&t.hits[i], 0);
        atomic_init(&t.bad_nth, 0);
        tm_threadpool_run(tp, count_fn, &t);
        /* when run returns, every share ran exactly once and nothing touches t any more */
        for (int i = 0; i < n_threads; i++) assert_int_equal(atomic_load(&t.hits[i]), 1);
        assert_int_equal(atomic_load(&t.bad_nth), 0);
    }
    tm_threadpool_free(tp);
}

static void test_each_share_once(void **st) {
    (void)st;
    run_many(2, 20000, -1);
    run_many(4, 5000, 2);
}

/* more threads than cores: workers are descheduled often, the caller takes their shares */
static void test_oversubscribed(void **st) {
    (void)st;
    run_many(12, 3000, 5);
}

static void test_single_and_null(void **st) {
    (void)st;
    count_task t = {.expect_nth = 1, .sleep_share = -1};
    for (int i = 0; i < 16; i++) atomic_init(&t.hits[i], 0);
    atomic_init(&t.bad_nth, 0);
    tm_threadpool_run(NULL, count_fn, &t);
    assert_int_equal(atomic_load(&t.hits[0]), 1);
    tm_threadpool *tp = NULL;
    tm_error err;
    assert_int_equal(tm_threadpool_create(0, &tp, &err), TM_ERR_INVALID);
    run_many(1, 100, -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_share_once),
        cmocka_unit_test(test_oversubscribed),
        cmocka_unit_test(test_single_and_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
