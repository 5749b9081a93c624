/* test_plan.c -- the KV/memory planner: KV bytes per token (MHA, GQA, dtypes), weights of the dummy layout (against
 * published parameter counts and the real dummy loader), workspace, block and request rounding, errors, size strings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* src/tools/ is built into the tokenmill binary, not into libtokenmill: compile the planner into this test. */
#include "tools/tm_plan.c"

/* ---- shapes (as the model cards state them) ----------------------------------------------------- */

static tm_hparams llama2_7b(void) {
    tm_hparams hp = {0};
    hp.n_vocab = 32000;
    hp.dim = 4096;
    hp.n_layers = 32;
    hp.n_heads = 32;
    hp.n_kv_heads = 32;
    hp.head_dim = 128;
    hp.ffn_dim = 11008;
    hp.n_ctx_train = 4096;
    return hp;
}

static tm_hparams llama3_8b(void) {
    tm_hparams hp = llama2_7b();
    hp.n_vocab = 128256;
    hp.n_kv_heads = 8;
    hp.ffn_dim = 14336;
    hp.n_ctx_train = 8192;
    return hp;
}

/* 2 layers x 2 kv heads x head_dim 4: 32 elements of K+V per token, 64 B in f16 */
static tm_hparams tiny(void) {
    tm_hparams hp = {0};
    hp.n_vocab = 64;
    hp.dim = 16;
    hp.n_layers = 2;
    hp.n_heads = 4;
    hp.n_kv_heads = 2;
    hp.head_dim = 4;
    hp.ffn_dim = 32;
    return hp;
}

static tm_plan_opts opts(uint64_t mem, int64_t ctx) {
    tm_plan_opts o = tm_plan_opts_default();
    o.mem_bytes = mem;
    o.ctx = ctx;
    return o;
}

static tm_plan plan_ok(const tm_hparams *hp, uint64_t weights, const tm_plan_opts *o) {
    tm_plan p;
    tm_error err = {0};
    if (tm_plan_compute(hp, weights, o, &p, &err) != TM_OK) fail_msg("plan: %s", err.msg);
    return p;
}

/* ---- the seed chapter's 7B example --------------------------------------------------------------- */

static void test_llama2_7b_example(void **state) {
    (void)state;
    tm_hparams hp = llama2_7b();
    /* the seed's 2 x L x h x 2 bytes (fp16), with h = n_heads x head_dim */
    const uint64_t L = 32, h = 4096;
    uint64_t w = 0;
    tm_error err = {0};
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_F16, &w, &err), TM_OK);
    /* Llama-2-7b has 6,738,415,616 parameters (Hugging Face model card / num_parameters()); all f16 except the
     * 65 f32 norm vectors, which take 2 more bytes per element */
    assert_int_equal(w, 2ull * 6738415616ull + 65ull * 4096 * 2);

    tm_plan_opts o = opts(80000000000ull, 4096);
    tm_plan p = plan_ok(&hp, w, &o);
    assert_int_equal(p.kv_bytes_per_token, 2 * L * h * 2);
    assert_int_equal(p.kv_bytes_per_token, 524288); /* 512 KiB */
    assert_int_equal(p.kv_elem_bytes, 2);
    assert_string_equal(p.kv_formula, "2 (K,V) x 32 layers x 32 kv_heads x 128 head_dim x 2 B (f16) = 524288 B");
    assert_int_equal(p.bytes_per_seq, 1ull << 31); /* 2 GiB per 4096-token request */
    assert_int_equal(p.blocks_per_seq, 256);
    assert_int_equal(p.block_bytes, 8ull << 20);  /* 16 tokens x 512 KiB */

    /* workspace: x, xb, proj, hsel (4096); q, att (4096); k, v (4096); hb, hb2 (11008); logits (32000); f32 */
    uint64_t per_tok = 4 * 4096 + 2 * 4096 + 2 * 4096 + 2 * 11008 + 32000;
    assert_int_equal(p.workspace_floats_per_token, per_tok);
    assert_int_equal(p.workspace_bytes, per_tok * 4 * 512);
    assert_int_equal(p.kv_budget_bytes, 80000000000ull - w - per_tok * 4 * 512);
    assert_int_equal(p.n_blocks, p.kv_budget_bytes / (8ull << 20));
    assert_int_equal(p.kv_tokens, p.n_blocks * 16);
    assert_int_equal(p.unused_bytes, p.kv_budget_bytes % (8ull << 20));
    /* ~66.3 GB of KV / 2 GiB per request: 30.9 -> 30 requests ("about 30") */
    assert_int_equal(p.max_seqs, 30);
    assert_int_equal(p.max_seqs, p.n_blocks / 256);
}

static void test_gqa_llama3_8b(void **state) {
    (void)state;
    tm_hparams hp = llama3_8b();
    uint64_t w = 0;
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_F16, &w, NULL), TM_OK);
    /* Meta-Llama-3-8B: 8,030,261,248 parameters; the design page's 16.06 GB in bf16 */
    assert_int_equal(w, 2ull * 8030261248ull + 65ull * 4096 * 2);
    tm_plan_opts o = opts(80000000000ull, 8192);
    tm_plan p = plan_ok(&hp, w, &o);
    /* 8 kv heads instead of 32: a quarter of the MHA figure, 128 KiB per token */
    assert_int_equal(p.kv_bytes_per_token, 2ull * 32 * 8 * 128 * 2);
    assert_int_equal(p.kv_bytes_per_token, 131072);
    assert_int_equal(p.bytes_per_seq, 8192ull * 131072); /* 1 GiB per 8k request */
    assert_int_equal(p.max_seqs, p.n_blocks / 512);
    assert_int_equal(p.max_seqs, 59); /* (80 - 16.06 weights - 0.38 workspace) GB / 1.074 GB = 59.2 */
}

static void test_kv_dtype_scales_bytes(void **state) {
    (void)state;
    tm_hparams hp = llama2_7b();
    tm_plan_opts o = opts(1ull << 40, 4096);
    tm_plan f16 = plan_ok(&hp, 0, &o);
    o.kv_dtype = TM_DT_BF16;
    tm_plan bf16 = plan_ok(&hp, 0, &o);
    o.kv_dtype = TM_DT_F32;
    tm_plan f32 = plan_ok(&hp, 0, &o);
    assert_int_equal(bf16.kv_bytes_per_token, f16.kv_bytes_per_token);
    assert_int_equal(f32.kv_bytes_per_token, 2 * f16.kv_bytes_per_token);
    assert_int_equal(f32.block_bytes, 2 * f16.block_bytes);
    assert_int_equal(f32.bytes_per_seq, 1ull << 32);
    assert_int_equal(f32.kv_budget_bytes, f16.kv_budget_bytes); /* the budget is the same; it buys half the blocks */
    assert_int_equal(f32.n_blocks, f16.kv_budget_bytes / (2 * f16.block_bytes));
    assert_true(f32.max_seqs * 2 <= f16.max_seqs && f16.max_seqs <= f32.max_seqs * 2 + 1);
    assert_non_null(strstr(f32.kv_formula, "x 4 B (f32) = 1048576 B"));
    assert_non_null(strstr(bf16.kv_formula, "(bf16)"));
}

static void test_block_rounding(void **state) {
    (void)state;
    tm_hparams hp = tiny(); /* 64 B per token in f16; 1024 B per 16-token block */
    tm_plan_opts o = opts(1ull << 20, 16);
    o.workspace_tokens = 1;
    tm_plan p0 = plan_ok(&hp, 0, &o);
    assert_int_equal(p0.kv_bytes_per_token, 64);
    assert_int_equal(p0.block_bytes, 1024);
    uint64_t ws = p0.workspace_bytes, weights = 1000;
    assert_int_equal(ws, 4 * (4 * 16 + 2 * 16 + 2 * 8 + 2 * 32 + 64));

    /* a KV budget of 3.5 blocks gives 3 blocks and half a block unused */
    o.mem_bytes = weights + ws + 3 * 1024 + 512;
    tm_plan p = plan_ok(&hp, weights, &o);
    assert_int_equal(p.kv_budget_bytes, 3 * 1024 + 512);
    assert_int_equal(p.n_blocks, 3);
    assert_int_equal(p.unused_bytes, 512);
    assert_int_equal(p.kv_tokens, 48);

    /* a request takes whole blocks: ceil(ctx / 16) */
    const int64_t ctxs[] = {1, 15, 16, 17, 32, 33};
    const uint64_t blocks[] = {1, 1, 1, 2, 2, 3};
    const uint64_t seqs[] = {3, 3, 3, 1, 1, 1};
    for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++) {
        o.ctx = ctxs[i];
        p = plan_ok(&hp, weights, &o);
        assert_int_equal(p.blocks_per_seq, blocks[i]);
        assert_int_equal(p.bytes_per_seq, blocks[i] * 1024);
        assert_int_equal(p.max_seqs, seqs[i]);
    }
    /* 49 tokens need 4 blocks: none fits in 3 */
    o.ctx = 49;
    assert_int_equal(plan_ok(&hp, weights, &o).max_seqs, 0);

    /* block size 1: no rounding at all; block size 5: 7 tokens take 2 blocks = 10 token slots */
    o.ctx = 7;
    o.block_size = 1;
    p = plan_ok(&hp, weights, &o);
    assert_int_equal(p.n_blocks, (3 * 1024 + 512) / 64);
    assert_int_equal(p.bytes_per_seq, 7 * 64);
    o.block_size = 5;
    p = plan_ok(&hp, weights, &o);
    assert_int_equal(p.block_bytes, 320);
    assert_int_equal(p.bytes_per_seq, 640);
    assert_int_equal(p.max_seqs, (3 * 1024 + 512) / 320 / 2);

    /* more tokens per forward pass: the workspace grows linearly and comes out of the KV budget */
    o.workspace_tokens = 2;
    tm_plan p2 = plan_ok(&hp, weights, &o);
    assert_int_equal(p2.workspace_bytes, 2 * ws);
    assert_int_equal(p2.kv_budget_bytes, p.kv_budget_bytes - ws);
}

static void test_budget_too_small(void **state) {
    (void)state;
    tm_hparams hp = llama2_7b();
    uint64_t w = 0;
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_F16, &w, NULL), TM_OK);
    tm_plan_opts o = opts(16000000000ull, 4096);
    tm_plan p = plan_ok(&hp, w, &o);
    uint64_t ws = p.workspace_bytes;

    /* exactly weights + workspace: a valid plan with an empty pool */
    o.mem_bytes = w + ws;
    p = plan_ok(&hp, w, &o);
    assert_int_equal(p.kv_budget_bytes, 0);
    assert_int_equal(p.n_blocks, 0);
    assert_int_equal(p.max_seqs, 0);

    /* one byte less, and 8 GB: an error naming the budget, the weights and the workspace */
    const uint64_t mems[] = {w + ws - 1, 8000000000ull, 1};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) {
        o.mem_bytes = mems[i];
        tm_error err = {0};
        memset(&p, 0x5a, sizeof p);
        assert_int_equal(tm_plan_compute(&hp, w, &o, &p, &err), TM_ERR_RANGE);
        char num[32];
        snprintf(num, sizeof num, "%llu B", (unsigned long long)mems[i]);
        assert_non_null(strstr(err.msg, num));
        snprintf(num, sizeof num, "weights %llu B", (unsigned long long)w);
        assert_non_null(strstr(err.msg, num));
        snprintf(num, sizeof num, "workspace %llu B", (unsigned long long)ws);
        assert_non_null(strstr(err.msg, num));
        assert_null(strchr(err.msg, '\n'));
        assert_int_equal(p.n_blocks, 0); /* no half-filled plan comes back */
    }
    /* weights + workspace overflowing 64 bits is the same error, not a wrap-around */
    o.mem_bytes = UINT64_MAX;
    assert_int_equal(tm_plan_compute(&hp, UINT64_MAX - 10, &o, &p, NULL), TM_ERR_RANGE);
}

static void test_bad_options_and_shapes(void **state) {
    (void)state;
    tm_hparams hp = tiny();
    tm_plan p;
    tm_error err = {0};
    tm_plan_opts o = opts(1 << 20, 16);
    assert_int_equal(tm_plan_compute(&hp, 0, &o, &p, &err), TM_OK);

    tm_plan_opts bad[6];
    for (int i = 0; i < 6; i++) bad[i] = o;
    bad[0].kv_dtype = TM_DT_Q8_0;
    bad[1].ctx = 0;
    bad[2].block_size = 0;
    bad[3].workspace_tokens = 0;
    bad[4].mem_bytes = 0;
    bad[5].ctx = -5;
    for (int i = 0; i < 6; i++) {
        err.msg[0] = '\0';
        assert_int_equal(tm_plan_compute(&hp, 0, &bad[i], &p, &err), TM_ERR_INVALID);
        assert_true(strlen(err.msg) > 0);
    }
    tm_hparams h2 = hp;
    h2.n_kv_heads = 0;
    assert_int_equal(tm_plan_compute(&h2, 0, &o, &p, &err), TM_ERR_INVALID);
    h2 = hp;
    h2.head_dim = -4;
    assert_int_equal(tm_plan_compute(&h2, 0, &o, &p, &err), TM_ERR_INVALID);
    /* absurd shapes overflow 64 bits: refused, not wrapped */
    h2 = hp;
    h2.n_layers = h2.n_kv_heads = h2.head_dim = INT32_MAX;
    assert_int_equal(tm_plan_compute(&h2, 0, &o, &p, &err), TM_ERR_RANGE);
    h2 = hp;
    h2.n_vocab = h2.dim = h2.ffn_dim = INT32_MAX;
    o.workspace_tokens = INT32_MAX;
    o.mem_bytes = UINT64_MAX;
    tm_status s = tm_plan_compute(&h2, 0, &o, &p, &err);
    assert_true(s == TM_ERR_RANGE);
}

/* ---- weights of the dummy layout ----------------------------------------------------------------- */

static void test_dense_weights_match_dummy_loader(void **state) {
    (void)state;
    /* the real loader generates these weights; the planner must count the same bytes without allocating */
    const char *specs[] = {"dummy:smollm2-135m:q4_0", "dummy:smollm2-135m:q8_0"};
    const tm_dtype types[] = {TM_DT_Q4_0, TM_DT_Q8_0};
    for (size_t i = 0; i < 2; i++) {
        tm_model *m = NULL;
        tm_error err = {0};
        if (tm_model_load(specs[i], &m, &err) != TM_OK) fail_msg("%s: %s", specs[i], err.msg);
        uint64_t w = 0;
        assert_int_equal(tm_plan_dense_weight_bytes(&m->hp, types[i], &w, &err), TM_OK);
        assert_int_equal(w, m->weight_bytes);
        assert_true(m->hp.tied_embeddings); /* the untied case is covered by the 7B/8B parameter counts */
        tm_model_free(m);
    }
    /* fp8: e4m3 linears with bf16 embedding and output (a deferred load counts the same bytes without making them) */
    const char *fp8_specs[] = {"dummy:smollm2-135m:fp8", "dummy:llama3-8b:fp8"};
    for (size_t i = 0; i < 2; i++) {
        tm_model *m = NULL;
        tm_error err = {0};
        tm_model_load_opts lo = {.defer_dummy = true};
        if (tm_model_load_ex(fp8_specs[i], &lo, &m, &err) != TM_OK) fail_msg("%s: %s", fp8_specs[i], err.msg);
        uint64_t w = 0;
        assert_int_equal(tm_plan_dense_weight_bytes(&m->hp, TM_DT_FP8_E4M3, &w, &err), TM_OK);
        assert_int_equal(w, m->weight_bytes);
        tm_model_free(m);
    }
    /* Llama-3-8B: 6,979,321,856 linear parameters in one byte, embedding and output (2 x 525,336,576) in two, 65 f32
     * norms */
    tm_hparams h8;
    tm_dtype wt8;
    assert_int_equal(tm_model_dummy_hparams("dummy:llama3-8b:fp8", &h8, &wt8, NULL), TM_OK);
    uint64_t w8 = 0;
    assert_int_equal(tm_plan_dense_weight_bytes(&h8, wt8, &w8, NULL), TM_OK);
    assert_int_equal(w8, 6979321856ull + 2ull * 2 * 525336576 + 65ull * 4096 * 4);
    /* untied output adds exactly one more (vocab, dim) matrix */
    tm_hparams hp = llama2_7b();
    uint64_t untied = 0, tied = 0;
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_Q8_0, &untied, NULL), TM_OK);
    hp.tied_embeddings = true;
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_Q8_0, &tied, NULL), TM_OK);
    assert_int_equal(untied - tied, 32000ull * (4096 / 32) * 34);
    /* rows that are not whole blocks cannot be stored in a block type */
    hp = tiny();
    hp.dim = 48;
    uint64_t w = 123;
    tm_error err = {0};
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_Q4_0, &w, &err), TM_ERR_INVALID);
    assert_int_equal(w, 0);
    assert_non_null(strstr(err.msg, "q4_0"));
    assert_int_equal(tm_plan_dense_weight_bytes(&hp, TM_DT_F16, &w, &err), TM_OK);
}

/* ---- size strings -------------------------------------------------------------------------------- */

static void test_parse_size(void **state) {
    (void)state;
    static const struct { const char *s; uint64_t v; } good[] = {
        {"80GB", 80000000000ull},      {"80G", 80000000000ull},    {"80gb", 80000000000ull},
        {"80GiB", 80ull << 30},        {"80gib", 80ull << 30},     {"512MiB", 512ull << 20},
        {"512MB", 512000000ull},       {"512M", 512000000ull},     {"4KiB", 4096},
        {"4K", 4000},                  {"2TB", 2000000000000ull},  {"1TiB", 1ull << 40},
        {"1048576", 1048576},          {"1048576B", 1048576},      {"1.5GB", 1500000000ull},
        {"0.5KiB", 512},               {".25MiB", 1ull << 18},     {"1.000001KB", 1000},
        {"141GB", 141000000000ull},    {"18446744073709551615", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 0;
        tm_error err = {0};
        if (tm_plan_parse_size(good[i].s, &v, &err) != TM_OK) fail_msg("'%s' refused: %s", good[i].s, err.msg);
        if (v != good[i].v) fail_msg("'%s' -> %llu, want %llu", good[i].s, (unsigned long long)v, (unsigned long long)good[i].v);
    }
    static const char *const bad[] = {
        "",       "GB",       "-5GB",      "+5GB",       "80XB",  "80 GB",  " 80GB", "80GB ", "1e9",
        "1.5",    "1.5B",     "0",         "0GB",        "0.0GiB", "1.",    ".",      "80GBs", "80GiBB",
        "1.1234567GB",        "18446744073709551616", "20000000TB", "16777216TiB", "0x10", "80Gi", "1,5GB",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 77;
        tm_error err = {0};
        if (tm_plan_parse_size(bad[i], &v, &err) != TM_ERR_INVALID) fail_msg("'%s' accepted as %llu", bad[i], (unsigned long long)v);
        assert_int_equal(v, 0);
        assert_true(strlen(err.msg) > 0);
    }
    uint64_t v;
    assert_int_equal(tm_plan_parse_size(NULL, &v, NULL), TM_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2_7b_example),
        cmocka_unit_test(test_gqa_llama3_8b),
        cmocka_unit_test(test_kv_dtype_scales_bytes),
        cmocka_unit_test(test_block_rounding),
        cmocka_unit_test(test_budget_too_small),
        cmocka_unit_test(test_bad_options_and_shapes),
        cmocka_unit_test(test_dense_weights_match_dummy_loader),
        cmocka_unit_test(test_parse_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
