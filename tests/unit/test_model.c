/* test_model.c -- the forward pass against a naive dense reference on tiny GGUF models; batching,
 * chunked prefill and multi-sequence steps give exactly the logits of single-sequence runs; bad models. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cpu/tm_quant.h"
#include "engine/tm_engine.h"
#include "model/tm_model.h"
#include "tm_test_ref.h"
#include "tm_test_tiny_model.h"

/* ---- naive dense reference ---------------------------------------------------------------------- */

static void ref_matvec(const tm_weight *w, const tm_weight *b, const double *x, double *out) {
    float *d = dense(w);
    for (int64_t r = 0; r < w->rows; r++) {
        double acc = b && b->data ? (double)((const float *)b->data)[r] : 0.0;
        for (int64_t c = 0; c < w->cols; c++) acc += (double)d[r * w->cols + c] * x[c];
        out[r] = acc;
    }
    free(d);
}

/* logits (n, vocab) for every position of ids */
static double *ref_forward(const tm_model *m, const int32_t *ids, int n) {
    const tm_hparams *hp = &m->hp;
    int dim = hp->dim, hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd, ffn = hp->ffn_dim;
    double *x = calloc((size_t)n * dim, sizeof(double)), *xb = malloc(sizeof(double) * dim);
    double *q = malloc(sizeof(double) * qd), *att = malloc(sizeof(double) * qd), *tmp = malloc(sizeof(double) * dim);
    double *K = malloc(sizeof(double) * (size_t)n * kvd), *V = malloc(sizeof(double) * (size_t)n * kvd);
    double *g = malloc(sizeof(double) * ffn), *u = malloc(sizeof(double) * ffn), *sc = malloc(sizeof(double) * n);
    float *emb = dense(&m->tok_embd);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) x[t * dim + i] = emb[(size_t)ids[t] * dim + i];
    free(emb);
    for (int l = 0; l < hp->n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++) { /* causal: token t only needs K, V of tokens <= t */
            double *xt = x + (size_t)t * dim;
            ref_rmsnorm(xt, &L->attn_norm, hp->norm_eps, dim, xb);
            ref_matvec(&L->wq, &L->bq, xb, q);
            ref_matvec(&L->wk, &L->bk, xb, K + (size_t)t * kvd);
            ref_matvec(&L->wv, &L->bv, xb, V + (size_t)t * kvd);
            for (int h = 0; h < hp->n_heads; h++) ref_rope(q + h * hd, t, m);
            for (int h = 0; h < hp->n_kv_heads; h++) ref_rope(K + (size_t)t * kvd + h * hd, t, m);
            ref_attention(q, K, V, t, hp->n_heads, hp->n_kv_heads, hd, sc, att);
            ref_matvec(&L->wo, NULL, att, tmp);
            for (int i = 0; i < dim; i++) xt[i] += tmp[i];
            ref_rmsnorm(xt, &L->ffn_norm, hp->norm_eps, dim, xb);
            ref_matvec(&L->w_gate, NULL, xb, g);
            ref_matvec(&L->w_up, NULL, xb, u);
            for (int i = 0; i < ffn; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(&L->w_down, NULL, g, tmp);
            for (int i = 0; i < dim; i++) xt[i] += tmp[i];
        }
    }
    double *logits = malloc(sizeof(double) * (size_t)n * hp->n_vocab);
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(x + (size_t)t * dim, &m->output_norm, hp->norm_eps, dim, xb);
        ref_matvec(&m->output, NULL, xb, logits + (size_t)t * hp->n_vocab);
    }
    free(x); free(xb); free(q); free(att); free(tmp); free(K); free(V); free(g); free(u); free(sc);
    return logits;
}

/* ---- helpers ----------------------------------------------------------------------------------- */

static tm_model *load(const char *path) {
    tm_model *m = NULL;
    tm_error err = {0};
    tm_status s = tm_model_load(path, &m, &err);
    if (s != TM_OK) fail_msg("load %s: %s", path, err.msg);
    return m;
}

static int g_act_bits = 16;

static tm_kv_dtype g_kv = TM_KV_F32; /* the runners' KV cache: f32 (the exactness checks), or the default f16 */

static tm_runner *runner(const tm_model *m, int threads, int batch, int n_seqs, int block) {
    tm_runner_cfg cfg = {.n_threads = threads, .n_ctx = 256, .max_batch_tokens = batch, .block_size = block, .n_seqs = n_seqs, .act_bits = g_act_bits,
                         .kv_dtype = g_kv};
    tm_runner *r = NULL;
    tm_error err = {0};
    if (tm_runner_create(m, &cfg, &r, &err) != TM_OK) fail_msg("runner: %s", err.msg);
    return r;
}

static void make_ids(int32_t *ids, int n, int vocab, unsigned seed) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((seed * 2654435761u + (unsigned)i * 40503u) % (unsigned)vocab);
}


/* ---- tests ------------------------------------------------------------------------------------- */

static void check_against_reference(tiny_opts o, double tol) {
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    tm_runner *r = runner(m, 2, 64, 1, 16);
    enum { N = 37 };
    int32_t ids[N];
    make_ids(ids, N, m->hp.n_vocab, 7);
    double *ref = ref_forward(m, ids, N);
    float *lg = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    tm_error err = {0};
    const int lens[] = {1, 2, 15, 16, 17, 33, N};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        assert_int_equal(tm_runner_prompt_logits(r, ids, (size_t)lens[k], lg, &err), TM_OK);
        double e = ref_rel_err(lg, ref + (size_t)(lens[k] - 1) * m->hp.n_vocab, (size_t)m->hp.n_vocab);
        if (e > tol) fail_msg("%s/%s prefix %d: relative error %g > %g", o.arch, tm_dtype_name(o.wtype), lens[k], e, tol);
    }
    assert_int_equal(tm_kv_n_free(&r->pool), r->pool.n_blocks); /* every block back in the pool */
    free(lg);
    free(ref);
    tm_runner_free(r);
    tm_model_free(m);
    unlink(path);
}

static void test_llama_f16_matches_reference(void **st) {
    (void)st;
    check_against_reference(tiny_default(), 2e-4);
}

static void test_llama_f32_tied_matches_reference(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_F32;
    o.tied = true;
    check_against_reference(o, 2e-5);
}

/* the default cpu cache (f16: K and V rounded to 11 significant bits) stays within 1e-3 of the f64 reference.
 * Last in the list: each tiny model draws its weights from one generator, so a test added earlier would hand
 * the quantized tests other weights. */
static void test_default_f16_cache_near_reference(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_F32;
    o.tied = true;
    g_kv = TM_KV_AUTO;
    check_against_reference(o, 1e-3);
    g_kv = TM_KV_F32;
}

static void test_qwen2_bias_neox_matches_reference(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.arch = "qwen2";
    check_against_reference(o, 2e-4);
}

/* Quantized weights: 16-bit activation blocks keep the result within ~1e-4 of the dense reference on
 * the same (dequantized) weights; 8-bit blocks (ggml's) within a few percent. */
static void check_quantized(int act_bits, double tol) {
    const tm_dtype types[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_BF16, TM_DT_Q4_K, TM_DT_Q6_K};
    g_act_bits = act_bits;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        tiny_opts o = tiny_default();
        o.wtype = types[i];
        if (types[i] == TM_DT_Q4_K || types[i] == TM_DT_Q6_K) {
            o.dim = 256;
            o.ffn = 512;
        }
        check_against_reference(o, types[i] == TM_DT_BF16 ? 2e-4 : tol);
    }
    g_act_bits = 16;
}

static void test_quantized_weights_q16_activations(void **st) {
    (void)st;
    check_quantized(16, 1e-3);
}

static void test_quantized_weights_q8_activations(void **st) {
    (void)st;
    check_quantized(8, 6e-2);
}

/* Running a prompt in chunks of any size, with any thread count, gives the same logits bit for bit (for a
 * given KV block size: the block size sets the online softmax's summation order, so other block sizes
 * agree to rounding only). */
static void test_chunked_prefill_is_exact(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_Q8_0;
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    enum { N = 50 };
    int32_t ids[N];
    make_ids(ids, N, m->hp.n_vocab, 3);
    int V = m->hp.n_vocab;
    float *base = malloc(sizeof(float) * V), *lg = malloc(sizeof(float) * V);
    tm_error err = {0};
    tm_runner *r = runner(m, 1, 64, 1, 16);
    assert_int_equal(tm_runner_prompt_logits(r, ids, N, base, &err), TM_OK);
    tm_runner_free(r);
    const int batches[] = {1, 7, 16, 49};
    const int threads[] = {1, 2, 3};
    for (size_t b = 0; b < 4; b++) {
        r = runner(m, threads[b % 3], batches[b], 1, 16);
        assert_int_equal(tm_runner_prompt_logits(r, ids, N, lg, &err), TM_OK);
        assert_memory_equal(base, lg, sizeof(float) * V);
        tm_runner_free(r);
    }
    const int blocks[] = {1, 5, 32};
    for (size_t b = 0; b < 3; b++) {
        r = runner(m, 2, 13, 1, blocks[b]);
        assert_int_equal(tm_runner_prompt_logits(r, ids, N, lg, &err), TM_OK);
        double md = 0, mx = 0;
        for (int i = 0; i < V; i++) {
            md = fmax(md, fabs((double)lg[i] - base[i]));
            mx = fmax(mx, fabs((double)base[i]));
        }
        if (md > 1e-4 * mx) fail_msg("block size %d: max diff %g of %g", blocks[b], md, mx);
        tm_runner_free(r);
    }
    free(base);
    free(lg);
    tm_model_free(m);
    unlink(path);
}

/* Several sequences in one ragged batch (prefill chunks and decode tokens mixed) give exactly the
 * logits each sequence gets alone: its prompt's last token there runs prefill attention, in the batch the
 * appended tokens run decode attention (context chunks spread over the threads, merged in order). */
enum { RAG_S = 3, RAG_MAX = 200 };
static void ragged_batch_equals_alone(const int lens[RAG_S], int32_t block_size) {
    tiny_opts o = tiny_default();
    o.wtype = TM_DT_Q4_1;
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    int V = m->hp.n_vocab;
    enum { S = RAG_S };
    static int32_t ids[S][RAG_MAX];
    for (int s = 0; s < S; s++) make_ids(ids[s], RAG_MAX, V, 11 + (unsigned)s);
    /* alone: logits after the prompt and after each of 3 appended tokens */
    float alone[S][4][300];
    tm_error err = {0};
    tm_runner *r = runner(m, 2, 64, 1, block_size);
    for (int s = 0; s < S; s++)
        for (int k = 0; k < 4; k++) assert_int_equal(tm_runner_prompt_logits(r, ids[s], (size_t)lens[s] + k, alone[s][k], &err), TM_OK);
    tm_runner_free(r);
    /* together: step 1 = all prompts (as chunks) in one batch; then 3 decode steps of all three */
    r = runner(m, 2, 512, S, block_size);
    tm_kv_seq seqs[S] = {{0}};
    tm_kv_seq *sp[S] = {&seqs[0], &seqs[1], &seqs[2]};
    const int32_t *np[S];
    int32_t nn[S];
    bool want[S] = {true, true, true};
    for (int s = 0; s < S; s++) {
        assert_int_equal(tm_kv_seq_reserve(&r->pool, &seqs[s], lens[s], &err), TM_OK);
        np[s] = ids[s];
        nn[s] = lens[s];
    }
    assert_int_equal(tm_runner_step(r, sp, np, nn, want, S, &err), TM_OK);
    for (int k = 0; k < 4; k++) {
        for (int s = 0; s < S; s++) assert_memory_equal(r->logits + (size_t)s * V, alone[s][k], sizeof(float) * V);
        if (k == 3) break;
        for (int s = 0; s < S; s++) {
            assert_int_equal(tm_kv_seq_reserve(&r->pool, &seqs[s], 1, &err), TM_OK);
            np[s] = &ids[s][lens[s] + k];
            nn[s] = 1;
        }
        assert_int_equal(tm_runner_step(r, sp, np, nn, want, S, &err), TM_OK);
    }
    for (int s = 0; s < S; s++) tm_kv_seq_release(&r->pool, &seqs[s]);
    assert_int_equal(tm_kv_n_free(&r->pool), r->pool.n_blocks);
    tm_runner_free(r);
    tm_model_free(m);
    unlink(path);
}

static void test_ragged_batch_equals_alone(void **st) {
    (void)st;
    const int short_lens[RAG_S] = {23, 5, 40}, long_lens[RAG_S] = {130, 5, 191}; /* up to 2 chunks; up to 7 */
    ragged_batch_equals_alone(short_lens, 16);
    ragged_batch_equals_alone(long_lens, 16);
    ragged_batch_equals_alone(long_lens, 5); /* chunks of 10 tokens, blocks not a power of two */
}

static void expect_load_error(const tiny_opts *o, tm_status code, const char *needle) {
    const char *path = write_tiny(o);
    tm_model *m = NULL;
    tm_error err = {0};
    tm_status s = tm_model_load(path, &m, &err);
    assert_null(m);
    assert_int_equal(s, code);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    unlink(path);
}

static void test_bad_models_are_refused(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    o.arch = "gpt9";
    expect_load_error(&o, TM_ERR_UNSUPPORTED, "architecture 'gpt9' is not supported");
    o = tiny_default();
    o.skip_tensor = "blk.1.ffn_up.weight";
    expect_load_error(&o, TM_ERR_FORMAT, "'blk.1.ffn_up.weight' is missing");
    o = tiny_default();
    o.bad_shape_tensor = "blk.0.attn_k.weight";
    expect_load_error(&o, TM_ERR_FORMAT, "'blk.0.attn_k.weight' has shape");
    o = tiny_default();
    o.arch = "qwen2";
    o.skip_tensor = "blk.0.attn_v.bias";
    expect_load_error(&o, TM_ERR_FORMAT, "'blk.0.attn_v.bias' is missing");
    o = tiny_default();
    o.kv_heads = 3; /* 4 heads not a multiple of 3 */
    o.dim = 96;
    o.ffn = 96;
    expect_load_error(&o, TM_ERR_FORMAT, "not a multiple of head_count_kv");
    tm_model *m = NULL;
    tm_error err = {0};
    assert_int_equal(tm_model_load("/nonexistent/model.gguf", &m, &err), TM_ERR_IO);
    assert_int_equal(tm_model_load("dummy:nope", &m, &err), TM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "unknown dummy model"));
    assert_int_equal(tm_model_load("dummy:llama3-8b:q9_9", &m, &err), TM_ERR_INVALID);
    /* K-quant dummies need whole 256-element super-blocks in every row: SmolLM2's 576 columns are not */
    assert_int_equal(tm_model_load("dummy:smollm2-135m:q4_K", &m, &err), TM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "576"));
    assert_null(m);
}

static void test_prompt_limits(void **st) {
    (void)st;
    tiny_opts o = tiny_default();
    const char *path = write_tiny(&o);
    tm_model *m = load(path);
    tm_runner_cfg cfg = {.n_threads = 1, .n_ctx = 32, .max_batch_tokens = 16, .block_size = 16, .n_seqs = 1, .act_bits = 16};
    tm_runner *r = NULL;
    tm_error err = {0};
    assert_int_equal(tm_runner_create(m, &cfg, &r, &err), TM_OK);
    int32_t ids[40];
    make_ids(ids, 40, m->hp.n_vocab, 1);
    float *lg = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    assert_int_equal(tm_runner_prompt_logits(r, ids, 40, lg, &err), TM_ERR_RANGE);
    assert_non_null(strstr(err.msg, "40 tokens"));
    assert_non_null(strstr(err.msg, "context is 32"));
    assert_int_equal(tm_runner_prompt_logits(r, ids, 0, lg, &err), TM_ERR_INVALID);
    ids[3] = 5000;
    assert_int_equal(tm_runner_prompt_logits(r, ids, 10, lg, &err), TM_ERR_RANGE);
    assert_int_equal(tm_kv_n_free(&r->pool), r->pool.n_blocks);
    /* generation stops at the context with "length" and frees its blocks */
    tm_engine_cfg ec = {cfg, {0}, NULL, false};
    tm_engine *e = NULL;
    assert_int_equal(tm_engine_create(m, &ec, &e, &err), TM_OK);
    ids[3] = 7;
    tm_gen_params gp = {0};
    gp.sampling = tm_sampling_default();
    gp.sampling.temperature = 0.0f;
    gp.max_tokens = 100;
    gp.ignore_eos = true;
    tm_gen_stats stats;
    assert_int_equal(tm_engine_generate(e, ids, 20, &gp, NULL, NULL, &stats, &err), TM_OK);
    assert_string_equal(stats.finish_reason, "length");
    assert_int_equal(stats.prompt_tokens + stats.gen_tokens, 32); /* the context holds 32 tokens */
    assert_int_equal(tm_kv_n_free(&e->runner->pool), e->runner->pool.n_blocks);
    tm_engine_free(e);
    free(lg);
    tm_runner_free(r);
    tm_model_free(m);
    unlink(path);
}

static void test_dummy_model_runs(void **st) {
    (void)st;
    tm_model *m = load("dummy:smollm2-135m:q4_0");
    assert_int_equal(m->hp.n_layers, 30);
    assert_int_equal(m->hp.n_kv_heads, 3);
    assert_true(m->hp.tied_embeddings);
    tm_runner *r = runner(m, 2, 16, 1, 16);
    int32_t ids[8] = {1, 50, 60, 70, 80, 90, 100, 110};
    float *lg = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    tm_error err = {0};
    assert_int_equal(tm_runner_prompt_logits(r, ids, 8, lg, &err), TM_OK);
    double ss = 0;
    for (int i = 0; i < m->hp.n_vocab; i++) {
        assert_true(isfinite(lg[i]));
        ss += (double)lg[i] * lg[i];
    }
    assert_true(ss > 0.0);
    free(lg);
    tm_runner_free(r);
    tm_model_free(m);
}

/* host dummy weights are made row by row from per-row seeds over several threads: the bytes do not depend on
 * the thread count (q8_0 and q4_0 here; the embedding, 49152 x 576, is split) */
static void test_dummy_weights_same_at_any_thread_count(void **st) {
    (void)st;
    const char *specs[] = {"dummy:smollm2-135m:q8_0", "dummy:smollm2-135m:q4_0"};
    for (int i = 0; i < 2; i++) {
        setenv("TM_DUMMY_THREADS", "1", 1);
        tm_model *a = load(specs[i]);
        setenv("TM_DUMMY_THREADS", "3", 1);
        tm_model *b = load(specs[i]);
        unsetenv("TM_DUMMY_THREADS");
        assert_non_null(a->dummy_mem);
        assert_int_equal(a->dummy_bytes, b->dummy_bytes);
        assert_memory_equal(a->dummy_mem, b->dummy_mem, (size_t)a->dummy_bytes);
        const uint8_t *p = a->tok_embd.data; /* not all zero: the rows were made */
        size_t nz = 0;
        for (size_t k = 0; k < 4096; k++) nz += p[k] != 0;
        assert_true(nz > 1000);
        tm_model_free(a);
        tm_model_free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f16_matches_reference),
        cmocka_unit_test(test_llama_f32_tied_matches_reference),
        cmocka_unit_test(test_qwen2_bias_neox_matches_reference),
        cmocka_unit_test(test_quantized_weights_q16_activations),
        cmocka_unit_test(test_quantized_weights_q8_activations),
        cmocka_unit_test(test_chunked_prefill_is_exact),
        cmocka_unit_test(test_ragged_batch_equals_alone),
        cmocka_unit_test(test_bad_models_are_refused),
        cmocka_unit_test(test_prompt_limits),
        cmocka_unit_test(test_dummy_model_runs),
        cmocka_unit_test(test_dummy_weights_same_at_any_thread_count),
        cmocka_unit_test(test_default_f16_cache_near_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
