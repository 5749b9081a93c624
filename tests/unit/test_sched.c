/* test_sched.c -- scheduler: token budgets, chunked prefill, priorities, preemption order, static batching,
 * starvation, and every KV block back in the pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>

#include "engine/tm_sched.h"

typedef struct fixture {
    tm_kv_pool pool;
    tm_sched s;
    tm_sched_seq q[64];
} fixture;

static fixture *setup(int32_t n_blocks, int32_t budget, int32_t max_seqs, tm_sched_policy pol, double aging) {
    fixture *f = calloc(1, sizeof *f);
    tm_error err = {0};
    assert_int_equal(tm_kv_pool_init(&f->pool, n_blocks, 16, &err), TM_OK);
    tm_sched_cfg cfg = {budget, max_seqs, pol, aging};
    assert_int_equal(tm_sched_init(&f->s, &cfg, &f->pool, &err), TM_OK);
    return f;
}

static void teardown(fixture *f) {
    for (int i = 0; i < 64; i++)
        if (f->q[i].state == TM_SEQ_WAITING || f->q[i].state == TM_SEQ_RUNNING || f->q[i].state == TM_SEQ_PREEMPTED)
            tm_sched_finish(&f->s, &f->q[i], TM_SEQ_ABORTED);
    assert_int_equal(tm_kv_n_free(&f->pool), f->pool.n_blocks); /* every block back */
    tm_sched_free(&f->s);
    tm_kv_pool_free(&f->pool);
    free(f);
}

static tm_sched_seq *add(fixture *f, int i, int32_t prompt, int32_t prio, double arrival) {
    tm_sched_seq *q = &f->q[i];
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)i;
    q->priority = prio;
    q->arrival = arrival;
    q->n_prompt = q->n_tokens = prompt;
    tm_error err = {0};
    assert_int_equal(tm_sched_add(&f->s, q, &err), TM_OK);
    return q;
}

/* Run the plan as the engine would: the KV entries are written, and every sequence whose prompt is
 * fully computed samples one token. */
static const tm_sched_plan *step(fixture *f, double now) {
    const tm_sched_plan *p;
    tm_error err = {0};
    assert_int_equal(tm_sched_schedule(&f->s, now, &p, &err), TM_OK);
    for (int32_t i = 0; i < p->n; i++) p->seqs[i]->kv.n_tokens += p->n_new[i];
    tm_sched_commit(&f->s, p);
    for (int32_t i = 0; i < p->n; i++)
        if (p->seqs[i]->n_computed == p->seqs[i]->n_tokens) p->seqs[i]->n_tokens++;
    return p;
}

static int32_t planned(const tm_sched_plan *p, const tm_sched_seq *q) {
    for (int32_t i = 0; i < p->n; i++)
        if (p->seqs[i] == q) return p->n_new[i];
    return 0;
}

static void test_budget_and_chunked_prefill(void **st) {
    (void)st;
    fixture *f = setup(256, 512, 64, TM_SCHED_CONTINUOUS, 0);
    tm_sched_seq *a = add(f, 0, 300, 0, 0), *b = add(f, 1, 300, 0, 0), *c = add(f, 2, 300, 0, 0);
    const tm_sched_plan *p = step(f, 0);
    assert_int_equal(p->n_tokens, 512);
    assert_int_equal(planned(p, a), 300);
    assert_int_equal(planned(p, b), 212); /* chunk: the rest of the budget */
    assert_int_equal(planned(p, c), 0);
    p = step(f, 1);
    assert_int_equal(planned(p, a), 1);   /* decode token first */
    assert_int_equal(planned(p, b), 88);  /* then the rest of b's prompt */
    assert_int_equal(planned(p, c), 300 < 512 - 89 ? 300 : 512 - 89);
    assert_true(p->n_tokens <= 512);
    teardown(f);
}

static void test_max_seqs(void **st) {
    (void)st;
    fixture *f = setup(256, 4096, 3, TM_SCHED_CONTINUOUS, 0);
    for (int i = 0; i < 5; i++) add(f, i, 10, 0, 0);
    const tm_sched_plan *p = step(f, 0);
    assert_int_equal(p->n, 3);
    assert_int_equal(tm_sched_n_waiting(&f->s), 2);
    teardown(f);
}

static void test_priority_then_fcfs(void **st) {
    (void)st;
    fixture *f = setup(256, 4096, 2, TM_SCHED_CONTINUOUS, 0);
    tm_sched_seq *lo1 = add(f, 0, 10, 5, 0), *hi1 = add(f, 1, 10, 0, 0), *lo2 = add(f, 2, 10, 5, 0), *hi2 = add(f, 3, 10, 0, 0);
    const tm_sched_plan *p = step(f, 0);
    assert_true(planned(p, hi1) && planned(p, hi2));
    assert_false(planned(p, lo1) || planned(p, lo2));
    tm_sched_finish(&f->s, hi1, TM_SEQ_FINISHED);
    p = step(f, 1);
    assert_true(planned(p, lo1)); /* FCFS within priority 5: lo1 arrived first */
    assert_false(planned(p, lo2));
    teardown(f);
}

static void test_preemption_order_and_resume(void **st) {
    (void)st;
    /* 6 blocks of 16 = 96 tokens; three sequences of 30 tokens fill 6 blocks after their prompts */
    fixture *f = setup(6, 512, 8, TM_SCHED_CONTINUOUS, 0);
    tm_sched_seq *a = add(f, 0, 30, 1, 0), *b = add(f, 1, 30, 0, 0), *c = add(f, 2, 30, 1, 0);
    step(f, 0); /* all three prefill: 2 blocks each */
    assert_int_equal(tm_kv_n_free(&f->pool), 0);
    /* decoding: positions 30, 31 fit in the second block; at 32 each needs a third block */
    step(f, 1);
    step(f, 2);
    const tm_sched_plan *p = step(f, 3);
    /* the worst victim is c (priority 1, latest arrival), then a; b (priority 0) keeps running */
    assert_int_equal(p->n_preempted, 1);
    assert_ptr_equal(p->preempted[0], c);
    assert_int_equal(c->state, TM_SEQ_PREEMPTED);
    assert_int_equal(c->n_computed, 0);
    assert_int_equal(c->n_tokens, 33); /* its output is kept for recompute */
    assert_true(planned(p, a) && planned(p, b));
    assert_int_equal(f->s.n_preemptions, 1);
    /* when a and b finish, c resumes and recomputes prompt + generated tokens in one chunk */
    tm_sched_finish(&f->s, a, TM_SEQ_FINISHED);
    tm_sched_finish(&f->s, b, TM_SEQ_FINISHED);
    p = step(f, 4);
    assert_int_equal(planned(p, c), 33);
    assert_int_equal(c->state, TM_SEQ_RUNNING);
    teardown(f);
}

static void test_static_batching_waits_for_drain(void **st) {
    (void)st;
    fixture *f = setup(256, 4096, 8, TM_SCHED_STATIC, 0);
    tm_sched_seq *a = add(f, 0, 10, 0, 0), *b = add(f, 1, 10, 0, 0);
    step(f, 0);
    tm_sched_seq *c = add(f, 2, 10, 0, 1);
    const tm_sched_plan *p = step(f, 1);
    assert_false(planned(p, c));
    tm_sched_finish(&f->s, a, TM_SEQ_FINISHED);
    p = step(f, 2);
    assert_false(planned(p, c)); /* b still running */
    tm_sched_finish(&f->s, b, TM_SEQ_FINISHED);
    p = step(f, 3);
    assert_int_equal(planned(p, c), 10);
    teardown(f);
}

static void test_continuous_admits_mid_flight(void **st) {
    (void)st;
    fixture *f = setup(256, 4096, 8, TM_SCHED_CONTINUOUS, 0);
    add(f, 0, 10, 0, 0);
    step(f, 0);
    tm_sched_seq *c = add(f, 1, 10, 0, 1);
    const tm_sched_plan *p = step(f, 1);
    assert_int_equal(planned(p, c), 10);
    teardown(f);
}

static void test_aging_prevents_starvation(void **st) {
    (void)st;
    /* one slot; a steady stream of priority-0 requests; a priority-3 request waits, but with aging of
     * 1 s per level it is admitted once it has waited > 3 s */
    fixture *f = setup(256, 4096, 1, TM_SCHED_CONTINUOUS, 1.0);
    tm_sched_seq *low = add(f, 0, 10, 3, 0.0);
    bool admitted = false;
    for (int t = 0; t < 20 && !admitted; t++) {
        tm_sched_seq *hi = add(f, 1 + t, 10, 0, (double)t);
        const tm_sched_plan *p = step(f, (double)t + 0.5);
        admitted = planned(p, low) > 0;
        if (!admitted) {
            assert_true(planned(p, hi) > 0);
            tm_sched_finish(&f->s, hi, TM_SEQ_FINISHED);
        }
    }
    assert_true(admitted);
    teardown(f);
}

static void test_without_aging_strict_priority(void **st) {
    (void)st;
    fixture *f = setup(256, 4096, 1, TM_SCHED_CONTINUOUS, 0);
    tm_sched_seq *low = add(f, 0, 10, 3, 0.0);
    for (int t = 0; t < 10; t++) {
        tm_sched_seq *hi = add(f, 1 + t, 10, 0, (double)t);
        const tm_sched_plan *p = step(f, (double)t + 0.5);
        assert_false(planned(p, low));
        tm_sched_finish(&f->s, hi, TM_SEQ_FINISHED);
    }
    teardown(f);
}

static void test_too_big_for_pool(void **st) {
    (void)st;
    fixture *f = setup(2, 4096, 8, TM_SCHED_CONTINUOUS, 0);
    add(f, 0, 100, 0, 0); /* needs 7 blocks, the pool has 2 */
    const tm_sched_plan *p;
    tm_error err = {0};
    assert_int_equal(tm_sched_schedule(&f->s, 0, &p, &err), TM_ERR_RANGE);
    assert_non_null(strstr(err.msg, "KV blocks"));
    teardown(f);
}

static void test_abort_releases_blocks(void **st) {
    (void)st;
    fixture *f = setup(16, 4096, 8, TM_SCHED_CONTINUOUS, 0);
    tm_sched_seq *a = add(f, 0, 100, 0, 0);
    step(f, 0);
    assert_true(tm_kv_n_free(&f->pool) < 16);
    tm_sched_finish(&f->s, a, TM_SEQ_ABORTED);
    assert_int_equal(tm_kv_n_free(&f->pool), 16);
    assert_int_equal(tm_sched_n_running(&f->s), 0);
    teardown(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_chunked_prefill),
        cmocka_unit_test(test_max_seqs),
        cmocka_unit_test(test_priority_then_fcfs),
        cmocka_unit_test(test_preemption_order_and_resume),
        cmocka_unit_test(test_static_batching_waits_for_drain),
        cmocka_unit_test(test_continuous_admits_mid_flight),
        cmocka_unit_test(test_aging_prevents_starvation),
        cmocka_unit_test(test_without_aging_strict_priority),
        cmocka_unit_test(test_too_big_for_pool),
        cmocka_unit_test(test_abort_releases_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
