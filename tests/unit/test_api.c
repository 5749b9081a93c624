/* test_api.c -- the public C API: batch submission equals one-by-one generation, refusals, text helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tokenmill.h"
#include "tm_test_tiny_model.h"

typedef struct collect {
    char text[4096];
    size_t len;
    int32_t ids[64];
    int n;
} collect;

static bool on_tok(void *user, const tm_token_event *ev) {
    collect *c = user;
    if (ev->token >= 0 && c->n < 64) c->ids[c->n++] = ev->token;
    if (c->len + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->len, ev->text, ev->text_len);
        c->len += ev->text_len;
    }
    return true;
}

static void test_batch_equals_single(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    const char *path = write_tiny(&o);
    tm_error err = {0};
    tm_load_params lp = tm_load_params_default();
    lp.model = path;
    lp.n_ctx = 128;
    lp.max_seqs = 3;
    tm_ctx *ctx = NULL;
    assert_int_equal(tm_load(&lp, &ctx, &err), TM_OK);
    int32_t prompts[3][12];
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 12; i++) prompts[r][i] = 3 + (r * 13 + i * 7) % 250;
    tm_generate_params gp = tm_generate_params_default();
    gp.temperature = 0.0f;
    gp.ignore_eos = true;
    gp.max_tokens = 16;
    collect single[3], batch[3];
    memset(single, 0, sizeof single);
    memset(batch, 0, sizeof batch);
    tm_generate_result res[3];
    for (int r = 0; r < 3; r++) assert_int_equal(tm_generate(ctx, prompts[r], 12, &gp, on_tok, &single[r], &res[r], &err), TM_OK);
    tm_request_spec specs[3];
    for (int r = 0; r < 3; r++) specs[r] = (tm_request_spec){prompts[r], 12, &gp, on_tok, &batch[r], &res[r]};
    assert_int_equal(tm_generate_batch(ctx, specs, 3, &err), TM_OK);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(batch[r].n, 16);
        assert_memory_equal(batch[r].ids, single[r].ids, sizeof(int32_t) * 16);
        assert_int_equal(res[r].tokens, 16);
        assert_string_equal(res[r].finish_reason, "length");
    }
    /* one bad request refuses the batch before anything runs */
    collect c2 = {{0}, 0, {0}, 0};
    specs[0].user = &c2;
    specs[1].n_prompt = 0;
    assert_int_equal(tm_generate_batch(ctx, specs, 3, &err), TM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "request 1"));
    assert_int_equal(c2.n, 0);
    /* text helpers */
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tm_tokenize(ctx, "hello", 5, false, false, &ids, &n, &err), TM_OK);
    char *text = NULL;
    assert_int_equal(tm_detokenize(ctx, ids, n, false, &text, &err), TM_OK);
    assert_non_null(strstr(text, "hello")); /* the tiny vocabulary spells the SPM space prefix in byte tokens */
    tm_free_buf(text);
    tm_free_buf(ids);
    int32_t bad = 100000;
    assert_int_equal(tm_detokenize(ctx, &bad, 1, false, &text, &err), TM_ERR_RANGE);
    tm_model_info mi = tm_get_model_info(ctx);
    assert_int_equal(mi.n_layers, 2);
    assert_string_equal(mi.arch, "llama");
    tm_free(ctx);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_single),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
