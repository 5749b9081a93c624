/* test_engine.c -- requests run together (continuous batching, chunked prefill, shared prefixes, forced
 * preemption from a tiny KV pool) give exactly the greedy outputs they give alone; aborts free blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/tm_engine.h"
#include "tm_test_tiny_model.h"

enum { NREQ = 7, MAXOUT = 40 };

typedef struct out_rec {
    int32_t ids[MAXOUT + 1];
    int32_t n;
    const char *finish;
    int32_t n_preempted;
} out_rec;

static bool record(void *user, const tm_gen_event *ev) {
    out_rec *o = user;
    if (ev->finish_reason) {
        o->finish = ev->finish_reason;
        o->n_preempted = ev->stats->n_preempted;
        return true;
    }
    if (o->n < MAXOUT + 1) o->ids[o->n++] = ev->token;
    return true;
}

static tm_kv_dtype g_kv = TM_KV_F32; /* the KV cache type of the engines made by engine() */

static tm_engine *engine(const tm_model *m, int32_t n_ctx, int32_t batch, int32_t kv_blocks, int32_t max_seqs,
                         tm_sched_policy pol) {
    tm_engine_cfg cfg = {{2, n_ctx, batch, 16, max_seqs, 16, kv_blocks, false, TM_DEVICE_CPU, 0, false, 0, g_kv},
                         {batch, max_seqs, pol, 0}, NULL, false};
    tm_engine *e = NULL;
    tm_error err = {0};
    if (tm_engine_create(m, &cfg, &e, &err) != TM_OK) fail_msg("engine: %s", err.msg);
    return e;
}

static void make_prompts(int32_t prompts[NREQ][80], int32_t *lens, int32_t *maxt, int vocab) {
    const int32_t L[NREQ] = {5, 17, 40, 33, 64, 3, 48};
    const int32_t T[NREQ] = {12, 30, 8, 25, 20, 40, 16};
    for (int r = 0; r < NREQ; r++) {
        lens[r] = L[r];
        maxt[r] = T[r];
        for (int i = 0; i < L[r]; i++) prompts[r][i] = (int32_t)((r * 7919u + (unsigned)i * 104729u) % (unsigned)vocab);
    }
    /* requests 2, 3 and 6 share a 32-token prefix (two full blocks) */
    for (int i = 0; i < 32; i++) prompts[3][i] = prompts[6][i] = prompts[2][i];
}

static void run_all(tm_engine *e, int32_t prompts[NREQ][80], const int32_t *lens, const int32_t *maxt, out_rec *out,
                    bool staggered) {
    tm_error err = {0};
    int added = 0;
    for (int step = 0; added < NREQ || tm_engine_has_work(e); step++) {
        /* staggered arrivals: one new request every other step */
        while (added < NREQ && (!staggered || step >= 2 * added)) {
            tm_gen_params gp = {0};
            gp.sampling = tm_sampling_default();
            gp.sampling.temperature = 0.0f;
            gp.max_tokens = maxt[added];
            gp.ignore_eos = true;
            assert_int_equal(tm_engine_add(e, prompts[added], (size_t)lens[added], &gp, record, &out[added], NULL, &err), TM_OK);
            added++;
            if (staggered) break;
        }
        if (tm_engine_step(e, &err) != TM_OK) fail_msg("step: %s", err.msg);
        assert_true(step < 10000);
    }
}

static void concurrent_equals_alone(tm_kv_dtype kv) {
    g_kv = kv;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_Q8_0;
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    int32_t prompts[NREQ][80], lens[NREQ], maxt[NREQ];
    make_prompts(prompts, lens, maxt, m->hp.n_vocab);

    out_rec alone[NREQ] = {{{0}, 0, NULL, 0}};
    tm_engine *e = engine(m, 128, 512, 0, 1, TM_SCHED_CONTINUOUS);
    for (int r = 0; r < NREQ; r++) {
        tm_gen_params gp = {0};
        gp.sampling = tm_sampling_default();
        gp.sampling.temperature = 0.0f;
        gp.max_tokens = maxt[r];
        gp.ignore_eos = true;
        assert_int_equal(tm_engine_generate(e, prompts[r], (size_t)lens[r], &gp, record, &alone[r], NULL, &err), TM_OK);
        assert_int_equal(alone[r].n, maxt[r]);
        assert_string_equal(alone[r].finish, "length");
    }
    tm_engine_free(e);

    /* together: 24-token steps (chunked prefill), up to 4 sequences, a pool of 8 blocks (128 tokens) for
     * requests needing up to 6 blocks each: preemption is forced */
    struct { int32_t batch, kv_blocks, max_seqs; tm_sched_policy pol; bool stagger; } cfgs[] = {
        {24, 8, 4, TM_SCHED_CONTINUOUS, false},
        {24, 8, 4, TM_SCHED_CONTINUOUS, true},
        {512, 0, 8, TM_SCHED_CONTINUOUS, false},
        {64, 0, 3, TM_SCHED_STATIC, false},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        out_rec tog[NREQ] = {{{0}, 0, NULL, 0}};
        e = engine(m, 128, cfgs[c].batch, cfgs[c].kv_blocks, cfgs[c].max_seqs, cfgs[c].pol);
        run_all(e, prompts, lens, maxt, tog, cfgs[c].stagger);
        int preempted = 0;
        for (int r = 0; r < NREQ; r++) {
            if (tog[r].n != alone[r].n || memcmp(tog[r].ids, alone[r].ids, sizeof(int32_t) * (size_t)alone[r].n))
                fail_msg("config %zu: request %d differs from its run alone", c, r);
            preempted += tog[r].n_preempted;
        }
        if (c < 2) assert_true(preempted > 0); /* the tiny pool did force preemption */
        assert_int_equal(tm_kv_n_free(&e->runner->pool), e->runner->pool.n_blocks);
        tm_engine_free(e);
    }
    tm_model_free(m);
    unlink(path);
    g_kv = TM_KV_F32;
}

static void test_concurrent_equals_alone(void **st) {
    (void)st;
    concurrent_equals_alone(TM_KV_F32);
}

/* the same with an fp8 e4m3 KV cache: rounding the cache changes the numbers, not their independence from the
 * batch */
static void test_concurrent_equals_alone_fp8_kv(void **st) {
    (void)st;
    concurrent_equals_alone(TM_KV_FP8);
}

/* and with an f16 cache (half of f32's bytes) */
static void test_concurrent_equals_alone_f16_kv(void **st) {
    (void)st;
    concurrent_equals_alone(TM_KV_F16);
}

static void test_abort_frees_blocks(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    tm_engine *e = engine(m, 128, 64, 0, 4, TM_SCHED_CONTINUOUS);
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = 3 + i;
    out_rec a = {{0}, 0, NULL, 0}, b = {{0}, 0, NULL, 0};
    tm_gen_params gp = {0};
    gp.sampling = tm_sampling_default();
    gp.max_tokens = 30;
    gp.ignore_eos = true;
    uint64_t ida, idb;
    assert_int_equal(tm_engine_add(e, p, 40, &gp, record, &a, &ida, &err), TM_OK);
    assert_int_equal(tm_engine_add(e, p, 20, &gp, record, &b, &idb, &err), TM_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    int32_t free_before = tm_kv_n_free(&e->runner->pool);
    assert_true(tm_engine_abort(e, ida));
    assert_string_equal(a.finish, "abort");
    assert_true(tm_kv_n_free(&e->runner->pool) > free_before); /* back at once, not at the next step */
    assert_false(tm_engine_abort(e, ida));                     /* already gone */
    while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    assert_string_equal(b.finish, "length");
    assert_int_equal(b.n, 30);
    assert_int_equal(tm_kv_n_free(&e->runner->pool), e->runner->pool.n_blocks);
    /* bad requests are refused and change nothing */
    assert_int_equal(tm_engine_add(e, p, 0, &gp, record, &a, NULL, &err), TM_ERR_INVALID);
    int32_t big[130] = {0};
    assert_int_equal(tm_engine_add(e, big, 130, &gp, record, &a, NULL, &err), TM_ERR_RANGE);
    assert_non_null(strstr(err.msg, "context is 128"));
    assert_false(tm_engine_has_work(e));
    tm_engine_free(e);
    tm_model_free(m);
    unlink(path);
}

static void test_metrics_follow_requests(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    tm_metrics *mx = NULL;
    assert_int_equal(tm_metrics_create(128, &mx, &err), TM_OK);
    tm_engine_cfg cfg = {{2, 128, 64, 16, 4, 16, 0, false, TM_DEVICE_CPU, 0, false, 0, TM_KV_AUTO}, {64, 4, TM_SCHED_CONTINUOUS, 0}, mx, false};
    tm_engine *e = NULL;
    assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
    int32_t p[10] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    out_rec a = {{0}, 0, NULL, 0}, b = {{0}, 0, NULL, 0};
    tm_gen_params gp = {0};
    gp.sampling = tm_sampling_default();
    gp.sampling.temperature = 0.0f;
    gp.ignore_eos = true;
    gp.max_tokens = 7;
    assert_int_equal(tm_engine_add(e, p, 10, &gp, record, &a, NULL, &err), TM_OK);
    gp.max_tokens = 5;
    assert_int_equal(tm_engine_add(e, p, 4, &gp, record, &b, NULL, &err), TM_OK);
    while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
    tm_metrics_std *ms = tm_metrics_get_std(mx);
    assert_int_equal(tm_counter_get(ms->gen_tokens_total), 12);
    assert_int_equal(tm_counter_get(ms->prompt_tokens_total), 14);
    assert_int_equal(tm_counter_get(ms->success[TM_FINISH_LENGTH]), 2);
    char *text = NULL;
    assert_int_equal(tm_metrics_render_alloc(mx, &text, NULL, &err), TM_OK);
    assert_non_null(strstr(text, "tokenmill:time_to_first_token_seconds_count 2"));
    assert_non_null(strstr(text, "tokenmill:e2e_request_latency_seconds_count 2"));
    assert_non_null(strstr(text, "tokenmill:num_requests_running"));
    free(text);
    tm_engine_free(e);
    tm_metrics_free(mx);
    tm_model_free(m);
    unlink(path);
}

/* A repeated prompt reuses the cached full blocks of the first run and produces the same tokens. */
static void test_prefix_cache_hits_and_matches(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_Q8_0;
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    int32_t p[50];
    for (int i = 0; i < 50; i++) p[i] = (int32_t)((i * 31 + 7) % 300);
    for (int off = 0; off < 2; off++) {
        bool no_cache = off == 1;
        tm_metrics *mx = NULL;
        assert_int_equal(tm_metrics_create(128, &mx, &err), TM_OK);
        tm_engine_cfg cfg = {{2, 128, 64, 16, 4, 16, 0, no_cache, TM_DEVICE_CPU, 0, false, 0, TM_KV_AUTO}, {64, 4, TM_SCHED_CONTINUOUS, 0}, mx, false};
        tm_engine *e = NULL;
        assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
        out_rec a = {{0}, 0, NULL, 0}, b = {{0}, 0, NULL, 0};
        tm_gen_params gp = {0};
        gp.sampling = tm_sampling_default();
        gp.sampling.temperature = 0.0f;
        gp.ignore_eos = true;
        gp.max_tokens = 10;
        tm_gen_stats sa, sb;
        assert_int_equal(tm_engine_generate(e, p, 50, &gp, record, &a, &sa, &err), TM_OK);
        assert_int_equal(tm_engine_generate(e, p, 50, &gp, record, &b, &sb, &err), TM_OK);
        assert_int_equal(a.n, 10);
        /* the request's own count of cached prompt tokens (the server's usage.prompt_tokens_details) */
        assert_int_equal(sa.cached_tokens, 0);
        assert_int_equal(sb.cached_tokens, no_cache ? 0 : 48);
        /* both were admitted at once: their queue times are ~0, not their whole lives (an admission with a prefix
         * hit counts as one) */
        tm_hist_snapshot qs;
        tm_histogram_snapshot(tm_metrics_get_std(mx)->queue, &qs);
        assert_int_equal(qs.count, 2);
        assert_true(qs.sum < 0.5 * (sb.finish_s - sb.arrival_s));
        assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 10);
        tm_metrics_std *ms = tm_metrics_get_std(mx);
        uint64_t hits = tm_counter_get(ms->prefix_hits);
        if (no_cache) assert_int_equal(hits, 0);
        else assert_int_equal(hits, 48); /* 3 full blocks of the 50-token prompt (the 4th is partial) */
        assert_int_equal(tm_kv_n_free(&e->runner->pool), e->runner->pool.n_blocks);
        tm_engine_free(e);
        tm_metrics_free(mx);
    }
    tm_model_free(m);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_equals_alone),
        cmocka_unit_test(test_concurrent_equals_alone_fp8_kv),
        cmocka_unit_test(test_concurrent_equals_alone_f16_kv),
        cmocka_unit_test(test_abort_frees_blocks),
        cmocka_unit_test(test_metrics_follow_requests),
        cmocka_unit_test(test_prefix_cache_hits_and_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
