/* test_tp_runner.c -- the runner with --tp N on cpu ranks: shard models, per-rank backends and KV heads, an
 * in-process all-reduce; logits and greedy outputs equal the unsharded runner's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>

#include "engine/tm_engine.h"
#include "engine/tm_runner.h"
#include "tm_test_tiny_model.h"

static tm_runner *make_runner(const tm_model *m, int32_t tp) {
    tm_runner_cfg rc = {.n_threads = 2, .n_ctx = 128, .max_batch_tokens = 32, .n_seqs = 2, .tp = tp};
    tm_runner *r = NULL;
    tm_error err = {0};
    if (tm_runner_create(m, &rc, &r, &err) != TM_OK) fail_msg("runner tp=%d: %s", tp, err.msg);
    return r;
}

static void check_model(tiny_opts o, int32_t tp) {
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    unlink(path);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 29 + 3) % m->hp.n_vocab;
    float *a = malloc(sizeof(float) * (size_t)m->hp.n_vocab), *b = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    tm_runner *r1 = make_runner(m, 1), *rt = make_runner(m, tp);
    /* 40 tokens through 32-token chunks: the second chunk attends to cached entries of every rank */
    assert_int_equal(tm_runner_prompt_logits(r1, prompt, 40, a, &err), TM_OK);
    assert_int_equal(tm_runner_prompt_logits(rt, prompt, 40, b, &err), TM_OK);
    double num = 0, den = 0;
    for (int32_t i = 0; i < m->hp.n_vocab; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    assert_true(sqrt(num / den) < 1e-4); /* only the order of the partial sums differs */
    tm_runner_free(r1);
    tm_runner_free(rt);
    free(a);
    free(b);
    tm_model_free(m);
}

static void test_tp2_llama_f32(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_F32;
    check_model(o, 2);
}

static void test_tp2_qwen2_bias_q8(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.arch = "qwen2";
    o.wtype = TM_DT_Q8_0;
    o.ffn = 128; /* each rank's down-projection columns (64) a whole number of 32-element blocks */
    check_model(o, 2);
}

static void test_tp_refusals(void **st) {
    (void)st;
    tiny_opts o = tiny_default(); /* 4 heads, 2 kv heads */
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    unlink(path);
    tm_runner *r = NULL;
    tm_runner_cfg rc = {.n_threads = 2, .n_ctx = 64, .max_batch_tokens = 16, .n_seqs = 1, .tp = 3};
    assert_int_equal(tm_runner_create(m, &rc, &r, &err), TM_ERR_UNSUPPORTED); /* 4 heads over 3 ranks */
    rc.tp = 16;
    assert_int_equal(tm_runner_create(m, &rc, &r, &err), TM_ERR_RANGE);
    rc.tp = 2;
    rc.device = TM_DEVICE_CUDA; /* no GPU here (or no CUDA in this build): a clear error, nothing leaked */
    assert_int_not_equal(tm_runner_create(m, &rc, &r, &err), TM_OK);
    assert_null(r);
    assert_true(strlen(err.msg) > 0);
    tm_model_free(m);
}

/* greedy generation through the engine: the same tokens with 2 ranks as with 1 */
typedef struct collect {
    int32_t ids[24];
    int n;
} collect;
static bool collect_cb(void *user, const tm_gen_event *ev) {
    collect *c = user;
    if (ev->token >= 0 && c->n < 24) c->ids[c->n++] = ev->token;
    return true;
}

static void test_tp2_engine_greedy(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_F32;
    const char *path = write_tiny(&o);
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load(path, &m, &err), TM_OK);
    unlink(path);
    collect out[2][3];
    memset(out, 0, sizeof out);
    for (int pass = 0; pass < 2; pass++) {
        tm_engine_cfg cfg = {.runner = {.n_threads = 2, .n_ctx = 128, .max_batch_tokens = 32, .n_seqs = 3,
                                        .tp = pass ? 2 : 1},
                             .sched = {.max_batched_tokens = 32, .max_seqs = 3}};
        tm_engine *e = NULL;
        assert_int_equal(tm_engine_create(m, &cfg, &e, &err), TM_OK);
        tm_gen_params gp = {.sampling = tm_sampling_default(), .max_tokens = 24, .ignore_eos = true};
        gp.sampling.temperature = 0.0f;
        for (int k = 0; k < 3; k++) {
            int32_t p[7];
            for (int i = 0; i < 7; i++) p[i] = (k * 13 + i * 5 + 2) % m->hp.n_vocab;
            assert_int_equal(tm_engine_add(e, p, 7, &gp, collect_cb, &out[pass][k], NULL, &err), TM_OK);
        }
        while (tm_engine_has_work(e)) assert_int_equal(tm_engine_step(e, &err), TM_OK);
        tm_engine_free(e);
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(out[1][k].n, 24);
        assert_memory_equal(out[0][k].ids, out[1][k].ids, sizeof out[0][k].ids);
    }
    tm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_llama_f32),
        cmocka_unit_test(test_tp2_qwen2_bias_q8),
        cmocka_unit_test(test_tp_refusals),
        cmocka_unit_test(test_tp2_engine_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
