/* test_threadpool.c -- every share of every run executes exactly once, whoever runs it; oversubscribed pools;
 * run_each pins share i to thread i, so shares can wait for each other. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <string.h>
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

/* run_each: the shares meet at a barrier (with run(), the caller could take a share whose worker had not started
 * and wait at the barrier for itself), and share i runs on the same thread in every run */
typedef struct each_task {
    pthread_barrier_t bar;
    pthread_t who[8];        /* (nth) the thread that ran share i in the first run */
    atomic_int moved;        /* a share that ran on another thread in a later run */
    int run;
} each_task;

static void each_fn(void *p, int ith, int nth) {
    each_task *t = p;
    (void)nth;
    if (ith == 1) usleep(300); /* the caller is done with share 0 long before share 1 starts */
    pthread_barrier_wait(&t->bar);
    if (t->run == 0) t->who[ith] = pthread_self();
    else if (!pthread_equal(t->who[ith], pthread_self())) atomic_fetch_add(&t->moved, 1);
    pthread_barrier_wait(&t->bar);
}

static void test_run_each_pins_shares(void **st) {
    (void)st;
    for (int n = 2; n <= 4; n++) {
        tm_threadpool *tp = NULL;
        tm_error err;
        assert_int_equal(tm_threadpool_create(n, &tp, &err), TM_OK);
        each_task t = {.run = 0};
        atomic_init(&t.moved, 0);
        assert_int_equal(pthread_barrier_init(&t.bar, NULL, (unsigned)n), 0);
        for (t.run = 0; t.run < 50; t.run++) tm_threadpool_run_each(tp, each_fn, &t);
        assert_int_equal(atomic_load(&t.moved), 0);
        assert_true(pthread_equal(t.who[0], pthread_self()));
        for (int i = 1; i < n; i++)
            for (int j = 0; j < i; j++) assert_false(pthread_equal(t.who[i], t.who[j]));
        pthread_barrier_destroy(&t.bar);
        tm_threadpool_free(tp);
    }
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

/* run_range: every item is passed exactly once, in calls of at most `grain` items, whatever the thread count,
 * also when a thread is slow (its part is then taken over: the slow share runs fewer items than its part) */
typedef struct {
    atomic_int hits[1000];
    atomic_int calls_by[8];
    atomic_int items_by[8];
    atomic_int bad;
    int64_t grain;
    int slow;
} range_task_t;

static void range_fn(void *p, int64_t lo, int64_t hi, int ith) {
    range_task_t *t = p;
    if (lo < 0 || hi <= lo || hi - lo > t->grain || ith < 0 || ith >= 8) atomic_fetch_add(&t->bad, 1);
    for (int64_t i = lo; i < hi && i < 1000; i++) atomic_fetch_add(&t->hits[i], 1);
    atomic_fetch_add(&t->calls_by[ith], 1);
    atomic_fetch_add(&t->items_by[ith], (int)(hi - lo));
    if (ith == t->slow) {
        struct timespec ts = {0, 200000}; /* 0.2 ms per call */
        nanosleep(&ts, NULL);
    }
}

static void test_run_range_each_item_once(void **st) {
    (void)st;
    const int64_t ns[] = {0, 1, 2, 7, 64, 999};
    const int64_t grains[] = {1, 3, 1000};
    for (int nth = 1; nth <= 4; nth++) {
        tm_threadpool *tp = NULL;
        tm_error err;
        assert_int_equal(tm_threadpool_create(nth, &tp, &err), TM_OK);
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++)
                for (int slow = -1; slow < nth; slow++) {
                    static range_task_t t;
                    memset(&t, 0, sizeof t);
                    t.grain = grains[g];
                    t.slow = slow;
                    tm_threadpool_run_range(tp, ns[a], grains[g], range_fn, &t);
                    assert_int_equal(atomic_load(&t.bad), 0);
                    for (int64_t i = 0; i < 1000; i++) assert_int_equal(atomic_load(&t.hits[i]), i < ns[a] ? 1 : 0);
                    /* a slow thread's part is shared out: with grain 1 and 999 items it runs well under its part */
                    if (nth > 1 && slow >= 0 && ns[a] == 999 && grains[g] == 1)
                        assert_true(atomic_load(&t.items_by[slow]) < 999 / nth);
                }
        tm_threadpool_free(tp);
    }
    static range_task_t t; /* no pool: in grains, in order, on the caller */
    memset(&t, 0, sizeof t);
    t.grain = 4;
    t.slow = -1;
    tm_threadpool_run_range(NULL, 10, 4, range_fn, &t);
    assert_int_equal(atomic_load(&t.calls_by[0]), 3);
    for (int64_t i = 0; i < 10; i++) assert_int_equal(atomic_load(&t.hits[i]), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_share_once),
        cmocka_unit_test(test_oversubscribed),
        cmocka_unit_test(test_single_and_null),
        cmocka_unit_test(test_run_each_pins_shares),
        cmocka_unit_test(test_run_range_each_item_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
