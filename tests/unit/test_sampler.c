/* test_sampler.c -- sampler tests: RNG vectors, validation, greedy, top-k/top-p/min-p sets, frequencies, penalties, logprobs, NaN/inf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/tm_sampler.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

static tm_sampler *make(const tm_sampling_params *p, int32_t n_vocab) {
    tm_sampler *s = NULL;
    tm_error err = {0};
    tm_status st = tm_sampler_create(p, n_vocab, &s, &err);
    if (st != TM_OK) fprintf(stderr, "create failed: %s\n", err.msg);
    assert_int_equal(st, TM_OK);
    assert_non_null(s);
    return s;
}

/* Parameters with every filter and penalty off. */
static tm_sampling_params plain(float temperature, uint64_t seed) {
    tm_sampling_params p = tm_sampling_default();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = seed;
    p.n_logprobs = 0;
    return p;
}

/* Gaussian-ish logits (sum of uniforms) from a test-local RNG stream. */
static void random_logits(float *x, int n, float scale, uint64_t seed) {
    tm_rng r;
    tm_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        double g = 0;
        for (int j = 0; j < 4; j++) g += tm_rng_uniform_f64(&r);
        x[i] = (float)((g - 2.0) * 1.7320508 * scale);
    }
}

static int ref_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) {
        float xi = isnan(x[i]) ? -INFINITY : x[i], xb = isnan(x[b]) ? -INFINITY : x[b];
        if (xi > xb) b = i;
    }
    return b;
}

/* Reference softmax(x / T) in double (x finite or -inf). */
static void ref_softmax(const float *x, int n, double T, double *p) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    double z = 0;
    for (int i = 0; i < n; i++) z += p[i] = exp(((double)x[i] - m) / T);
    for (int i = 0; i < n; i++) p[i] /= z;
}

/* Reference ordering: decreasing logit, ties by lower id. */
static const float *g_sort_key;
static int cmp_desc(const void *a, const void *b) {
    int ia = *(const int *)a, ib = *(const int *)b;
    float xa = g_sort_key[ia], xb = g_sort_key[ib];
    if (xa > xb) return -1;
    if (xa < xb) return 1;
    return (ia > ib) - (ia < ib);
}
static void ref_order(const float *x, int n, int *order) {
    for (int i = 0; i < n; i++) order[i] = i;
    g_sort_key = x;
    qsort(order, (size_t)n, sizeof *order, cmp_desc);
}

/* ---- RNG ---------------------------------------------------------------------------------------- */

static void test_rng_known_answers(void **state) {
    (void)state;
    /* splitmix64 with seed 1234567 (the Rosetta Code "SplitMix64" task's published outputs) seeds the state */
    tm_rng r;
    tm_rng_seed(&r, 1234567);
    assert_true(r.s[0] == 6457827717110365317ULL);
    assert_true(r.s[1] == 3203168211198807973ULL);
    assert_true(r.s[2] == 9817491932198370423ULL);
    assert_true(r.s[3] == 4593380528125082431ULL);
    /* xoshiro256** from state {1,2,3,4}: the test vector of the Rust crate rand_xoshiro */
    const uint64_t expect[10] = {11520ULL,
                                 0ULL,
                                 1509978240ULL,
                                 1215971899390074240ULL,
                                 1216172134540287360ULL,
                                 607988272756665600ULL,
                                 16172922978634559625ULL,
                                 8476171486693032832ULL,
                                 10595114339597558777ULL,
                                 2904607092377533576ULL};
    tm_rng x = {{1, 2, 3, 4}};
    for (int i = 0; i < 10; i++) assert_true(tm_rng_next(&x) == expect[i]);
}

static void test_rng_uniform(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 42);
    enum { N = 200000, B = 10 };
    int hf[B] = {0}, hd[B] = {0};
    double sf = 0, sd = 0;
    for (int i = 0; i < N; i++) {
        float f = tm_rng_uniform(&r);
        double d = tm_rng_uniform_f64(&r);
        assert_true(f >= 0.0f && f < 1.0f);
        assert_true(d >= 0.0 && d < 1.0);
        hf[(int)(f * B)]++;
        hd[(int)(d * B)]++;
        sf += f;
        sd += d;
    }
    /* mean of U(0,1): sd = 1/sqrt(12 N) ~ 6.5e-4; allow 5 sigma */
    assert_true(fabs(sf / N - 0.5) < 5 * 6.5e-4);
    assert_true(fabs(sd / N - 0.5) < 5 * 6.5e-4);
    const double e = (double)N / B, sig = sqrt(e * (1 - 1.0 / B));
    for (int b = 0; b < B; b++) {
        assert_true(fabs(hf[b] - e) < 5 * sig);
        assert_true(fabs(hd[b] - e) < 5 * sig);
    }
    /* different seeds give different streams */
    tm_rng a, b;
    tm_rng_seed(&a, 1);
    tm_rng_seed(&b, 2);
    int same = 0;
    for (int i = 0; i < 100; i++) same += tm_rng_next(&a) == tm_rng_next(&b);
    assert_int_equal(same, 0);
}

/* ---- validation --------------------------------------------------------------------------------- */

static void expect_invalid(tm_sampling_params p, const char *needle) {
    tm_error err = {0};
    assert_int_equal(tm_sampling_validate(&p, &err), TM_ERR_INVALID);
    assert_int_equal(err.code, TM_ERR_INVALID);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message '%s' lacks '%s'\n", err.msg, needle);
    assert_non_null(strstr(err.msg, needle));
    tm_sampler *s = (tm_sampler *)&err; /* non-NULL garbage: create must reset it */
    assert_int_equal(tm_sampler_create(&p, 100, &s, NULL), TM_ERR_INVALID);
    assert_null(s);
}

static void test_validate(void **state) {
    (void)state;
    tm_sampling_params d = tm_sampling_default();
    tm_error err = {0};
    assert_int_equal(tm_sampling_validate(&d, &err), TM_OK);
    assert_true(d.temperature > 0 && d.top_k == 40 && d.repeat_last_n == 64);
    tm_sampling_params p;
    p = d, p.temperature = -0.1f, expect_invalid(p, "temperature");
    p = d, p.temperature = NAN, expect_invalid(p, "temperature");
    p = d, p.temperature = INFINITY, expect_invalid(p, "temperature");
    p = d, p.top_k = -2, expect_invalid(p, "top_k");
    p = d, p.top_p = 0.0f, expect_invalid(p, "top_p");
    p = d, p.top_p = 1.5f, expect_invalid(p, "top_p");
    p = d, p.top_p = NAN, expect_invalid(p, "top_p");
    p = d, p.min_p = -0.01f, expect_invalid(p, "min_p");
    p = d, p.min_p = 1.01f, expect_invalid(p, "min_p");
    p = d, p.repeat_penalty = 0.0f, expect_invalid(p, "repeat_penalty");
    p = d, p.repeat_penalty = INFINITY, expect_invalid(p, "repeat_penalty");
    p = d, p.presence_penalty = 2.5f, expect_invalid(p, "presence_penalty");
    p = d, p.frequency_penalty = -2.5f, expect_invalid(p, "frequency_penalty");
    p = d, p.frequency_penalty = NAN, expect_invalid(p, "frequency_penalty");
    p = d, p.repeat_last_n = -2, expect_invalid(p, "repeat_last_n");
    p = d, p.n_logprobs = -1, expect_invalid(p, "n_logprobs");
    p = d, p.n_logprobs = 21, expect_invalid(p, "n_logprobs");
    /* edges that are allowed */
    p = d, p.top_k = -1, p.top_p = 1.0f, p.min_p = 1.0f, p.temperature = 0.0f, p.n_logprobs = 20;
    p.presence_penalty = -2.0f, p.frequency_penalty = 2.0f, p.repeat_last_n = -1;
    assert_int_equal(tm_sampling_validate(&p, &err), TM_OK);
    tm_sampler *s = NULL;
    assert_int_equal(tm_sampler_create(&d, 0, &s, &err), TM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "n_vocab"));
    assert_null(s);
    assert_int_equal(tm_sampling_validate(NULL, &err), TM_ERR_INVALID);
}

/* ---- greedy and top-k ---------------------------------------------------------------------------- */

static void test_greedy(void **state) {
    (void)state;
    enum { V = 1000 };
    float x[V], y[V];
    tm_sampling_params p = plain(0.0f, 7);
    p.top_k = 5; /* ignored by greedy */
    p.top_p = 0.5f;
    tm_sampler *s = make(&p, V);
    for (int t = 0; t < 50; t++) {
        random_logits(x, V, 2.0f, 100 + (uint64_t)t);
        memcpy(y, x, sizeof x);
        assert_int_equal(tm_sampler_sample(s, y, NULL, 0, NULL, NULL), ref_argmax(x, V));
        assert_memory_equal(x, y, sizeof x); /* no penalties: logits untouched */
    }
    /* ties go to the lowest id */
    for (int i = 0; i < V; i++) x[i] = 0.0f;
    x[700] = 3.0f;
    x[31] = 3.0f;
    x[900] = 3.0f;
    assert_int_equal(tm_sampler_sample(s, x, NULL, 0, NULL, NULL), 31);
    /* the one-pass greedy path sanitizes as the general one does: NaN -> -inf (never taken), +inf -> FLT_MAX
     * (the first +inf wins), all -inf or all NaN -> id 0 */
    for (int i = 0; i < V; i++) x[i] = 1.0f;
    x[3] = NAN;
    x[10] = INFINITY;
    x[20] = INFINITY;
    assert_int_equal(tm_sampler_sample(s, x, NULL, 0, NULL, NULL), 10);
    assert_true(x[3] == -INFINITY && x[10] == FLT_MAX && x[20] == FLT_MAX);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < V; i++) x[i] = pass ? NAN : -INFINITY;
        tm_logprob chosen = {-1, 1.0f};
        assert_int_equal(tm_sampler_sample(s, x, NULL, 0, &chosen, NULL), 0);
        assert_true(chosen.id == 0 && chosen.logprob == 0.0f);
    }
    tm_sampler_free(s);
}

static void test_topk1_is_greedy(void **state) {
    (void)state;
    enum { V = 777 };
    float x[V], y[V];
    const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 50.0f};
    for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++) {
        tm_sampling_params p = plain(temps[ti], 11 + ti);
        p.top_k = 1;
        tm_sampler *s = make(&p, V);
        for (int t = 0; t < 40; t++) {
            random_logits(x, V, 1.0f, 500 + (uint64_t)t);
            if (t % 4 == 0) x[V - 1] = x[ref_argmax(x, V)]; /* a tie with a later id */
            memcpy(y, x, sizeof x);
            assert_int_equal(tm_sampler_sample(s, y, NULL, 0, NULL, NULL), ref_argmax(x, V));
        }
        tm_sampler_free(s);
    }
}

static void test_topk_support(void **state) {
    (void)state;
    enum { V = 500, K = 10, N = 20000 };
    static float x[V], y[V], probs[V];
    static int order[V], hits[V];
    random_logits(x, V, 0.3f, 9); /* flat: every one of the K best gets drawn */
    ref_order(x, V, order);
    tm_sampling_params p = plain(1.5f, 1234);
    p.top_k = K;
    tm_sampler *s = make(&p, V);
    memset(hits, 0, sizeof hits);
    for (int i = 0; i < N; i++) {
        memcpy(y, x, sizeof x);
        int id = tm_sampler_sample(s, y, NULL, 0, NULL, NULL);
        assert_true(id >= 0 && id < V);
        hits[id]++;
    }
    int in_top = 0;
    for (int r = 0; r < K; r++) {
        assert_true(hits[order[r]] > 0); /* every one of the k best appears */
        in_top += hits[order[r]];
    }
    assert_int_equal(in_top, N); /* and nothing else ever does */
    /* the distribution is softmax(x/T) restricted to the k best, renormalised */
    memcpy(y, x, sizeof x);
    tm_sampler_probs(s, y, NULL, 0, probs);
    double ref[K], z = 0;
    for (int r = 0; r < K; r++) z += ref[r] = exp(((double)x[order[r]] - x[order[0]]) / 1.5);
    for (int r = 0; r < K; r++) {
        assert_true(fabs(probs[order[r]] - ref[r] / z) < 1e-5);
        const double e = N * ref[r] / z, sig = sqrt(e * (1 - ref[r] / z));
        assert_true(fabs(hits[order[r]] - e) < 5 * sig);
    }
    for (int r = K; r < V; r++) assert_true(probs[order[r]] == 0.0f);
    tm_sampler_free(s);
}

/* k above the heap-selection limit goes through quickselect: same contract */
static void test_topk_large_k(void **state) {
    (void)state;
    enum { V = 5000 };
    static float x[V], y[V], probs[V];
    static int order[V];
    const int ks[] = {1, 37, 512, 513, 700, 4999, 5000, 9000};
    for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
        random_logits(x, V, 1.0f, 60 + c);
        for (int i = 0; i < V; i += 97) x[i] = x[(i * 7) % V]; /* some exact ties */
        ref_order(x, V, order);
        tm_sampling_params p = plain(1.3f, 2);
        p.top_k = ks[c];
        tm_sampler *s = make(&p, V);
        memcpy(y, x, sizeof x);
        tm_sampler_probs(s, y, NULL, 0, probs);
        const int k = ks[c] < V ? ks[c] : V;
        double z = 0;
        for (int r = 0; r < k; r++) z += exp(((double)x[order[r]] - x[order[0]]) / 1.3);
        for (int r = 0; r < V; r++) {
            if (r < k)
                assert_true(fabs(probs[order[r]] - exp(((double)x[order[r]] - x[order[0]]) / 1.3) / z) < 1e-6);
            else
                assert_true(probs[order[r]] == 0.0f);
        }
        tm_sampler_free(s);
    }
}

/* ---- top-p and min-p ----------------------------------------------------------------------------- */

/* Checks that the kept set of probs is the minimal nucleus of softmax(x/T) restricted to the top_k best
 * (k = V when off): a prefix of the reference order whose mass reaches top_p, and minus its last member
 * does not. Returns the nucleus size. */
static int check_nucleus(const float *x, int V, double T, int k, double top_p, const float *probs) {
    int *order = malloc((size_t)V * sizeof *order);
    double *p = malloc((size_t)V * sizeof *p);
    assert_non_null(order);
    assert_non_null(p);
    ref_order(x, V, order);
    double z = 0;
    for (int r = 0; r < k; r++) z += p[r] = exp(((double)x[order[r]] - x[order[0]]) / T);
    int n = 0;
    while (n < V && probs[order[n]] > 0.0f) n++;
    for (int r = n; r < V; r++) assert_true(probs[order[r]] == 0.0f); /* kept set is a prefix */
    assert_true(n >= 1 && n <= k);
    double mass = 0;
    for (int r = 0; r < n; r++) mass += p[r] / z;
    const double tol = 1e-6 * (1 + n / 1000.0);
    assert_true(mass >= top_p - tol);
    assert_true(n == 1 || mass - p[n - 1] / z < top_p + tol);
    double psum = 0;
    for (int r = 0; r < n; r++) {
        assert_true(fabs(probs[order[r]] - p[r] / z / mass) < 1e-5); /* renormalised over the nucleus */
        psum += probs[order[r]];
    }
    assert_true(fabs(psum - 1.0) < 1e-4);
    free(order);
    free(p);
    return n;
}

static void test_topp_nucleus(void **state) {
    (void)state;
    enum { V = 3000 };
    static float x[V], y[V], probs[V];
    const float tops[] = {0.05f, 0.3f, 0.5f, 0.9f, 0.99f};
    const float temps[] = {0.5f, 1.0f, 2.0f};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 3; b++) {
            tm_sampling_params p = plain(temps[b], 3);
            p.top_p = tops[a];
            tm_sampler *s = make(&p, V);
            random_logits(x, V, 2.0f, 40 + a * 3 + b);
            memcpy(y, x, sizeof x);
            tm_sampler_probs(s, y, NULL, 0, probs);
            int n = check_nucleus(x, V, temps[b], V, tops[a], probs);
            /* draws stay inside the nucleus */
            for (int i = 0; i < 300; i++) {
                memcpy(y, x, sizeof x);
                int id = tm_sampler_sample(s, y, NULL, 0, NULL, NULL);
                assert_true(probs[id] > 0.0f);
            }
            (void)n;
            tm_sampler_free(s);
        }
    /* top-k then top-p: the nucleus of the renormalised top-k distribution */
    tm_sampling_params p = plain(1.0f, 5);
    p.top_k = 50;
    p.top_p = 0.6f;
    tm_sampler *s = make(&p, V);
    random_logits(x, V, 0.5f, 77);
    memcpy(y, x, sizeof x);
    tm_sampler_probs(s, y, NULL, 0, probs);
    int n = check_nucleus(x, V, 1.0, 50, 0.6, probs);
    assert_true(n > 1 && n < 50);
    tm_sampler_free(s);
    /* a hand-made case: probs 0.5, 0.3, 0.15, 0.05 -> top_p 0.7 keeps two, 0.85 keeps three */
    float h[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)}, hy[4], hp[4];
    p = plain(1.0f, 1);
    p.top_p = 0.7f;
    s = make(&p, 4);
    memcpy(hy, h, sizeof h);
    tm_sampler_probs(s, hy, NULL, 0, hp);
    assert_true(fabs(hp[0] - 0.625) < 1e-6 && fabs(hp[1] - 0.375) < 1e-6 && hp[2] == 0 && hp[3] == 0);
    tm_sampler_free(s);
    p.top_p = 0.85f;
    s = make(&p, 4);
    memcpy(hy, h, sizeof h);
    tm_sampler_probs(s, hy, NULL, 0, hp);
    assert_true(hp[2] > 0 && hp[3] == 0);
    tm_sampler_free(s);
}

/* Many small random cases, so that every branch of the mass-carrying selection (including the pivot being
 * the token that crosses top_p) is taken many times. */
static void test_topp_many_random(void **state) {
    (void)state;
    enum { MAXV = 400 };
    static float x[MAXV], y[MAXV], probs[MAXV];
    tm_rng r;
    tm_rng_seed(&r, 2024);
    for (int c = 0; c < 600; c++) {
        const int V = 30 + (int)(tm_rng_next(&r) % (MAXV - 30));
        tm_sampling_params p = plain(0.3f + 2.0f * tm_rng_uniform(&r), 1);
        p.top_p = 0.02f + 0.97f * tm_rng_uniform(&r);
        if (c % 3 == 0) p.top_k = 1 + (int)(tm_rng_next(&r) % (uint64_t)V);
        tm_sampler *s = make(&p, V);
        random_logits(x, V, 0.2f + 3.0f * tm_rng_uniform(&r), 7000 + (uint64_t)c);
        memcpy(y, x, (size_t)V * sizeof *x);
        tm_sampler_probs(s, y, NULL, 0, probs);
        check_nucleus(x, V, p.temperature, p.top_k > 0 ? p.top_k : V, p.top_p, probs);
        tm_sampler_free(s);
    }
}

/* Vocabulary of Llama 3 size, flat distribution: the nucleus is most of the vocabulary, so the growing
 * partial selection has to go through several rounds up to a full sort. */
static void test_topp_large_flat(void **state) {
    (void)state;
    enum { V = 128256 };
    float *x = malloc(V * sizeof *x), *y = malloc(V * sizeof *y), *probs = malloc(V * sizeof *probs);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(probs);
    const float tops[] = {0.2f, 0.9f};
    for (int a = 0; a < 2; a++) {
        tm_sampling_params p = plain(1.0f, 8);
        p.top_p = tops[a];
        tm_sampler *s = make(&p, V);
        random_logits(x, V, 0.05f, 31 + (uint64_t)a);
        memcpy(y, x, V * sizeof *x);
        tm_sampler_probs(s, y, NULL, 0, probs);
        int n = check_nucleus(x, V, 1.0, V, tops[a], probs);
        assert_true(n > 1000);
        tm_sampler_free(s);
    }
    free(x);
    free(y);
    free(probs);
}

static void test_minp(void **state) {
    (void)state;
    enum { V = 2000 };
    static float x[V], y[V], probs[V];
    static double p[V];
    const float temps[] = {0.5f, 1.0f, 1.7f};
    const float minps[] = {0.01f, 0.1f, 0.5f};
    for (int with_topp = 0; with_topp < 2; with_topp++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                tm_sampling_params sp = plain(temps[b], 2);
                sp.min_p = minps[a];
                if (with_topp) sp.top_p = 0.999999f; /* sorted path; the nucleus is everything here */
                tm_sampler *s = make(&sp, V);
                random_logits(x, V, 1.5f, 900 + (uint64_t)(a * 3 + b));
                ref_softmax(x, V, temps[b], p);
                double pmax = 0;
                for (int i = 0; i < V; i++) pmax = p[i] > pmax ? p[i] : pmax;
                memcpy(y, x, sizeof x);
                tm_sampler_probs(s, y, NULL, 0, probs);
                double z = 0;
                int kept = 0;
                for (int i = 0; i < V; i++) {
                    double rel = p[i] / pmax;
                    if (probs[i] > 0.0f) z += p[i], kept++;
                    if (fabs(rel - minps[a]) < 1e-4) continue; /* too close to call in float */
                    if (rel >= minps[a])
                        assert_true(probs[i] > 0.0f);
                    else
                        assert_true(probs[i] == 0.0f);
                }
                assert_true(kept >= 1);
                for (int i = 0; i < V; i++) /* renormalised over the kept set */
                    if (probs[i] > 0.0f) assert_true(fabs(probs[i] - p[i] / z) < 1e-4 * (p[i] / z) + 1e-7);
                tm_sampler_free(s);
            }
}

/* ---- empirical frequencies ---------------------------------------------------------------------- */

/* Draw n samples and require every token's count within 5 sigma of n * expect (a binomial), and the
 * chi-square statistic under the 99.99% quantile of its degrees of freedom (<= 9 here: 33.7). */
static void check_frequencies(const tm_sampling_params *p, const float *x, int V, const double *expect, int n) {
    tm_sampler *s = make(p, V);
    int hits[16] = {0};
    float y[16];
    assert_true(V <= 16);
    for (int i = 0; i < n; i++) {
        memcpy(y, x, (size_t)V * sizeof *x);
        int id = tm_sampler_sample(s, y, NULL, 0, NULL, NULL);
        assert_true(id >= 0 && id < V);
        hits[id]++;
    }
    double chi2 = 0;
    int df = -1;
    for (int i = 0; i < V; i++) {
        if (expect[i] == 0) {
            assert_int_equal(hits[i], 0);
            continue;
        }
        const double e = n * expect[i], sig = sqrt(e * (1 - expect[i]));
        if (fabs(hits[i] - e) >= 5 * sig)
            fprintf(stderr, "token %d: %d hits, expected %.1f +- %.1f\n", i, hits[i], e, sig);
        assert_true(fabs(hits[i] - e) < 5 * sig);
        chi2 += (hits[i] - e) * (hits[i] - e) / e;
        df++;
    }
    assert_true(df <= 9);
    assert_true(chi2 < 33.7);
    tm_sampler_free(s);
}

static void test_frequencies(void **state) {
    (void)state;
    enum { V = 8, N = 20000 };
    const float x[V] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 1.5f, 0.25f};
    double e[V];
    const float temps[] = {0.7f, 1.0f, 1.8f};
    for (int t = 0; t < 3; t++) {
        tm_sampling_params p = plain(temps[t], 1000 + (uint64_t)t);
        ref_softmax(x, V, temps[t], e);
        check_frequencies(&p, x, V, e, N);
    }
    /* top-k (sorted candidates) renormalises over the 3 best: ids 4, 6, 0 */
    tm_sampling_params p = plain(1.0f, 77);
    p.top_k = 3;
    double z = 0;
    for (int i = 0; i < V; i++) e[i] = (i == 4 || i == 6 || i == 0) ? exp(x[i]) : 0.0;
    for (int i = 0; i < V; i++) z += e[i];
    for (int i = 0; i < V; i++) e[i] /= z;
    check_frequencies(&p, x, V, e, N);
    /* min-p alone (unsorted candidates, id order): keep p >= 0.2 * pmax, i.e. x >= 2 + ln 0.2 = 0.39 */
    p = plain(1.0f, 78);
    p.min_p = 0.2f;
    z = 0;
    for (int i = 0; i < V; i++) e[i] = x[i] >= 2.0f + logf(0.2f) ? exp(x[i]) : 0.0;
    for (int i = 0; i < V; i++) z += e[i];
    for (int i = 0; i < V; i++) e[i] /= z;
    check_frequencies(&p, x, V, e, N);
}

/* ---- determinism --------------------------------------------------------------------------------- */

static void test_seed_determinism(void **state) {
    (void)state;
    enum { V = 300, N = 400 };
    static float x[V], y[V], probs[V];
    static int a[N], b[N], c[N];
    random_logits(x, V, 0.5f, 3);
    tm_sampling_params p = tm_sampling_default();
    p.temperature = 1.0f;
    p.top_k = 100;
    p.seed = 123456789;
    tm_sampler *s1 = make(&p, V), *s2 = make(&p, V);
    p.seed = 123456790;
    tm_sampler *s3 = make(&p, V);
    for (int i = 0; i < N; i++) {
        memcpy(y, x, sizeof x);
        a[i] = tm_sampler_sample(s1, y, NULL, 0, NULL, NULL);
        memcpy(y, x, sizeof x);
        if (i % 7 == 0) tm_sampler_probs(s2, y, NULL, 0, probs); /* draws nothing: sequence unchanged */
        memcpy(y, x, sizeof x);
        b[i] = tm_sampler_sample(s2, y, NULL, 0, NULL, NULL);
        memcpy(y, x, sizeof x);
        c[i] = tm_sampler_sample(s3, y, NULL, 0, NULL, NULL);
    }
    assert_memory_equal(a, b, sizeof a);
    int diff = 0;
    for (int i = 0; i < N; i++) diff += a[i] != c[i];
    assert_true(diff > N / 2);
    /* reseeding restarts the sequence */
    tm_sampler_reseed(s3, 123456789);
    for (int i = 0; i < N; i++) {
        memcpy(y, x, sizeof x);
        assert_int_equal(tm_sampler_sample(s3, y, NULL, 0, NULL, NULL), a[i]);
    }
    tm_sampler_free(s1);
    tm_sampler_free(s2);
    tm_sampler_free(s3);
}

/* ---- penalties ----------------------------------------------------------------------------------- */

static void test_penalties(void **state) {
    (void)state;
    enum { V = 10 };
    const float x0[V] = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f, 0.0f, 4.0f, -2.0f, 3.0f, -0.5f};
    const int32_t hist[] = {0, 1, 1, 3, 0, 0, 9, 42, -5}; /* 42 and -5 are out of range: ignored */
    const size_t nh = sizeof hist / sizeof *hist;
    float x[V], e[V];

    /* repetition penalty over the last 4 entries {0, 9, 42, -5}: ids 0 and 9, once each */
    tm_sampling_params p = plain(0.0f, 1);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 4;
    tm_sampler *s = make(&p, V);
    memcpy(x, x0, sizeof x);
    tm_sampler_sample(s, x, hist, nh, NULL, NULL);
    memcpy(e, x0, sizeof e);
    e[0] = 2.0f / 1.5f;
    e[9] = -0.5f * 1.5f;
    for (int i = 0; i < V; i++) assert_float_equal(x[i], e[i], 1e-6);
    /* the window does not leak into the next call */
    memcpy(x, x0, sizeof x);
    tm_sampler_sample(s, x, NULL, 0, NULL, NULL);
    assert_memory_equal(x, x0, sizeof x);
    tm_sampler_free(s);

    /* whole history (-1): every distinct valid id once, whatever its multiplicity */
    p.repeat_last_n = -1;
    s = make(&p, V);
    memcpy(x, x0, sizeof x);
    tm_sampler_sample(s, x, hist, nh, NULL, NULL);
    memcpy(e, x0, sizeof e);
    e[0] = 2.0f / 1.5f;
    e[1] = -1.0f * 1.5f;
    e[3] = -3.0f * 1.5f;
    e[9] = -0.5f * 1.5f;
    for (int i = 0; i < V; i++) assert_float_equal(x[i], e[i], 1e-6);
    tm_sampler_free(s);

    /* window 0: off */
    p.repeat_last_n = 0;
    s = make(&p, V);
    memcpy(x, x0, sizeof x);
    tm_sampler_sample(s, x, hist, nh, NULL, NULL);
    assert_memory_equal(x, x0, sizeof x);
    tm_sampler_free(s);

    /* presence + frequency over the whole history: counts 0:3, 1:2, 3:1, 9:1 */
    p = plain(0.0f, 1);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    s = make(&p, V);
    memcpy(x, x0, sizeof x);
    tm_sampler_sample(s, x, hist, nh, NULL, NULL);
    memcpy(e, x0, sizeof e);
    e[0] -= 3 * 0.25f + 0.5f;
    e[1] -= 2 * 0.25f + 0.5f;
    e[3] -= 1 * 0.25f + 0.5f;
    e[9] -= 1 * 0.25f + 0.5f;
    for (int i = 0; i < V; i++) assert_float_equal(x[i], e[i], 1e-6);
    memcpy(x, x0, sizeof x); /* counts were reset */
    tm_sampler_sample(s, x, hist, 0, NULL, NULL);
    assert_memory_equal(x, x0, sizeof x);
    tm_sampler_free(s);

    /* all three: repetition first, then frequency/presence */
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 3; /* {9, 42, -5} */
    s = make(&p, V);
    memcpy(x, x0, sizeof x);
    tm_sampler_sample(s, x, hist, nh, NULL, NULL);
    memcpy(e, x0, sizeof e);
    e[9] = -0.5f * 2.0f;
    e[0] -= 3 * 0.25f + 0.5f;
    e[1] -= 2 * 0.25f + 0.5f;
    e[3] -= 1 * 0.25f + 0.5f;
    e[9] -= 1 * 0.25f + 0.5f;
    for (int i = 0; i < V; i++) assert_float_equal(x[i], e[i], 1e-6);
    tm_sampler_free(s);

    /* penalties change the outcome: the repeated argmax loses to the runner-up */
    const float two[2] = {5.0f, 4.9f};
    const int32_t h0[1] = {0};
    p = plain(0.0f, 1);
    p.repeat_penalty = 1.1f;
    s = make(&p, 2);
    float t2[2];
    memcpy(t2, two, sizeof t2);
    assert_int_equal(tm_sampler_sample(s, t2, NULL, 0, NULL, NULL), 0);
    memcpy(t2, two, sizeof t2);
    assert_int_equal(tm_sampler_sample(s, t2, h0, 1, NULL, NULL), 1);
    tm_sampler_free(s);
    /* negative presence penalty (allowed by OpenAI) encourages repetition */
    const float neg[2] = {1.0f, 1.2f};
    p = plain(0.0f, 1);
    p.presence_penalty = -0.5f;
    s = make(&p, 2);
    memcpy(t2, neg, sizeof t2);
    assert_int_equal(tm_sampler_sample(s, t2, h0, 1, NULL, NULL), 0);
    assert_float_equal(t2[0], 1.5f, 1e-6);
    tm_sampler_free(s);
}

/* ---- logprobs ------------------------------------------------------------------------------------ */

static void ref_log_softmax(const float *x, int n, double *lp) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && x[i] > m) m = x[i];
    double z = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) z += exp((double)x[i] - m);
    for (int i = 0; i < n; i++) lp[i] = isnan(x[i]) ? -INFINITY : (double)x[i] - m - log(z);
}

static void test_logprobs(void **state) {
    (void)state;
    enum { V = 3000, K = 20 };
    static float x[V], y[V], xs[V];
    static double lp[V];
    static int order[V];
    const float scales[] = {3.0f, 4000.0f}; /* the second overflows a naive exp */
    for (int sc = 0; sc < 2; sc++) {
        random_logits(x, V, scales[sc], 555 + (uint64_t)sc);
        x[17] = NAN;
        x[18] = -INFINITY;
        ref_log_softmax(x, V, lp);
        for (int i = 0; i < V; i++) xs[i] = isnan(x[i]) ? -INFINITY : x[i];
        ref_order(xs, V, order);

        tm_sampling_params p = plain(0.9f, 99);
        p.n_logprobs = K;
        p.repeat_penalty = 3.0f; /* penalties must not leak into the reported logprobs */
        p.frequency_penalty = 1.0f;
        tm_sampler *s = make(&p, V);
        const int32_t hist[3] = {order[0], order[1], order[0]};
        for (int rep = 0; rep < 50; rep++) {
            tm_logprob top[K], chosen = {-7, 1.0f};
            memcpy(y, x, sizeof x);
            int id = tm_sampler_sample(s, y, hist, 3, &chosen, top);
            assert_int_equal(chosen.id, id);
            assert_true(fabs(chosen.logprob - lp[id]) < 1e-4 * (1 + fabs(lp[id])));
            double mass = 0;
            for (int k = 0; k < K; k++) {
                assert_int_equal(top[k].id, order[k]);
                assert_true(fabs(top[k].logprob - lp[order[k]]) < 1e-4 * (1 + fabs(lp[order[k]])));
                if (k > 0) assert_true(top[k].logprob <= top[k - 1].logprob);
                mass += exp((double)top[k].logprob);
            }
            assert_true(mass <= 1.0 + 1e-6);
            assert_true(isnan(y[17]) == 0 && y[17] == -INFINITY); /* NaN became -inf */
        }
        tm_sampler_free(s);
    }
    /* n_logprobs == 0: chosen gets the id and 0, top is not touched */
    tm_sampling_params p = plain(0.0f, 1);
    tm_sampler *s = make(&p, V);
    tm_logprob top[2] = {{-3, -3.0f}, {-3, -3.0f}}, chosen = {-7, 1.0f};
    memcpy(y, x, sizeof x);
    int id = tm_sampler_sample(s, y, NULL, 0, &chosen, top);
    assert_int_equal(chosen.id, id);
    assert_true(chosen.logprob == 0.0f);
    assert_int_equal(top[0].id, -3);
    tm_sampler_free(s);
}

/* ---- NaN and infinities --------------------------------------------------------------------------- */

static void test_nan_inf(void **state) {
    (void)state;
    enum { V = 64 };
    float x[V], probs[V];
    const float temps[] = {0.0f, 1.0f};
    for (int pass = 0; pass < 2; pass++) /* all -inf, then all NaN */
        for (int t = 0; t < 2; t++) {
            tm_sampling_params p = plain(temps[t], 5);
            p.top_k = 3;
            p.top_p = 0.5f;
            p.min_p = 0.1f;
            p.n_logprobs = 4;
            p.repeat_penalty = 1.3f;
            p.frequency_penalty = 0.5f;
            tm_sampler *s = make(&p, V);
            const int32_t hist[2] = {0, 5};
            for (int i = 0; i < V; i++) x[i] = pass ? NAN : -INFINITY;
            tm_logprob top[4], chosen;
            assert_int_equal(tm_sampler_sample(s, x, hist, 2, &chosen, top), 0);
            assert_int_equal(chosen.id, 0);
            assert_float_equal(chosen.logprob, -logf((float)V), 1e-5);
            for (int k = 0; k < 4; k++) {
                assert_int_equal(top[k].id, k);
                assert_float_equal(top[k].logprob, -logf((float)V), 1e-5);
            }
            for (int i = 0; i < V; i++) x[i] = pass ? NAN : -INFINITY;
            tm_sampler_probs(s, x, hist, 2, probs);
            assert_true(probs[0] == 1.0f);
            for (int i = 1; i < V; i++) assert_true(probs[i] == 0.0f);
            tm_sampler_free(s);
        }
    /* NaN is -inf: never drawn; the rest follows softmax over the finite logits */
    const float m4[4] = {NAN, 1.0f, NAN, 0.5f};
    double e[4] = {0, exp(1.0) / (exp(1.0) + exp(0.5)), 0, exp(0.5) / (exp(1.0) + exp(0.5))};
    tm_sampling_params p = plain(1.0f, 6);
    check_frequencies(&p, m4, 4, e, 20000);
    p = plain(0.0f, 6);
    tm_sampler *s = make(&p, 4);
    float y[4];
    memcpy(y, m4, sizeof y);
    assert_int_equal(tm_sampler_sample(s, y, NULL, 0, NULL, NULL), 1);
    tm_sampler_free(s);
    /* +inf: the +inf ids share all the mass equally; greedy takes the first */
    const float pinf[4] = {INFINITY, 3.0f, INFINITY, 2.0f};
    double e2[4] = {0.5, 0, 0.5, 0};
    p = plain(0.3f, 7);
    check_frequencies(&p, pinf, 4, e2, 20000);
    p = plain(0.0f, 7);
    p.n_logprobs = 2;
    s = make(&p, 4);
    tm_logprob top[2], chosen;
    memcpy(y, pinf, sizeof y);
    assert_int_equal(tm_sampler_sample(s, y, NULL, 0, &chosen, top), 0);
    assert_float_equal(chosen.logprob, -logf(2.0f), 1e-6);
    assert_int_equal(top[0].id, 0);
    assert_int_equal(top[1].id, 2);
    tm_sampler_free(s);
    /* a single finite logit among -inf is always drawn, at any temperature and filter */
    for (int i = 0; i < V; i++) x[i] = -INFINITY;
    p = plain(2.0f, 8);
    p.top_p = 0.3f;
    s = make(&p, V);
    for (int i = 0; i < 200; i++) {
        float z[V];
        memcpy(z, x, sizeof z);
        z[41] = -1e30f;
        assert_int_equal(tm_sampler_sample(s, z, NULL, 0, NULL, NULL), 41);
    }
    tm_sampler_free(s);
}

/* ---- cost on a 128k vocabulary ------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_large_vocab_cost(void **state) {
    (void)state;
    enum { V = 128256, N = 50 };
    float *x = malloc(V * sizeof *x), *y = malloc(V * sizeof *y);
    int *order = malloc(V * sizeof *order);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(order);
    random_logits(x, V, 3.0f, 4242);
    ref_order(x, V, order);
    struct {
        const char *name;
        int top_k;
        float top_p, min_p, temp;
        int n_logprobs;
    } cfg[] = {{"plain", 0, 1.0f, 0.0f, 0.8f, 0},
               {"top_k=40 top_p=0.95 min_p=0.05", 40, 0.95f, 0.05f, 0.8f, 0},
               {"top_p=0.95", 0, 0.95f, 0.0f, 0.8f, 0},
               {"min_p=0.05", 0, 1.0f, 0.05f, 0.8f, 0},
               {"top_k=1000", 1000, 1.0f, 0.0f, 0.8f, 0},
               {"greedy, logprobs=5", 0, 1.0f, 0.0f, 0.0f, 5},
               {"top_k=40 ..., logprobs=20", 40, 0.95f, 0.05f, 0.8f, 20}};
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        tm_sampling_params p = plain(cfg[c].temp, 1);
        p.top_k = cfg[c].top_k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.n_logprobs = cfg[c].n_logprobs;
        tm_sampler *s = make(&p, V);
        tm_logprob top[20], chosen;
        double t0 = now_s();
        for (int i = 0; i < N; i++) {
            memcpy(y, x, V * sizeof *x);
            int id = tm_sampler_sample(s, y, NULL, 0, &chosen, top);
            if (p.top_k == 40) { /* inside the 40 best */
                int r = 0;
                while (order[r] != id) r++;
                assert_true(r < 40);
            }
            for (int k = 0; k < p.n_logprobs; k++) assert_int_equal(top[k].id, order[k]); /* the best, in order */
        }
        double ms = (now_s() - t0) * 1e3 / N;
        printf("    sample, n_vocab %d, %-32s %.3f ms/token\n", V, cfg[c].name, ms);
        /* a full sort every step would still pass; this catches quadratic behaviour (seconds per step) */
        assert_true(ms < 250.0);
        tm_sampler_free(s);
    }
    free(x);
    free(y);
    free(order);
}

/* The backend's form of the penalties (tm_sampler_pen_entries, then tm_sampler_pen_apply, which a device kernel
 * mirrors) gives bit for bit the logits the sampler penalises itself, for every mix of penalties and windows. */
static void test_pen_entries(void **st) {
    (void)st;
    enum { V = 50, N_HIST = 40 };
    int32_t mark[V] = {0};
    tm_sample_pen ent[N_HIST + 1];
    uint64_t x = 99;
    const float rps[] = {1.0f, 1.3f, 0.7f};
    const float pps[] = {0.0f, 0.6f, -1.1f};
    const float fps[] = {0.0f, 0.35f, 1.7f};
    const int32_t lasts[] = {-1, 0, 1, 7, 64};
    int cases = 0, changed = 0, ahead_cases = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                for (int d = 0; d < 5; d++) {
                    tm_sampling_params p = tm_sampling_default();
                    p.temperature = 0.0f;
                    p.repeat_penalty = rps[a];
                    p.presence_penalty = pps[b];
                    p.frequency_penalty = fps[c];
                    p.repeat_last_n = lasts[d];
                    int32_t hist[N_HIST];
                    size_t n_hist = (size_t)(a * 13 + b * 5 + c * 3 + d) % N_HIST;
                    for (size_t i = 0; i < n_hist; i++) { /* few distinct ids: many repeats; one out of range */
                        x = x * 6364136223846793005ull + 1442695040888963407ull;
                        hist[i] = (int32_t)((x >> 33) % 12) * 3;
                    }
                    if (n_hist > 3) hist[2] = V + 4;
                    float want[V], got[V];
                    for (int i = 0; i < V; i++) {
                        x = x * 6364136223846793005ull + 1442695040888963407ull;
                        want[i] = got[i] = (float)((int64_t)(x >> 40) - (1 << 23)) / 777777.0f;
                    }
                    tm_sampler *s = NULL;
                    tm_error err;
                    assert_int_equal(tm_sampler_create(&p, V, &s, &err), TM_OK);
                    tm_sampler_sample(s, want, hist, n_hist, NULL, NULL); /* leaves the penalised logits */
                    tm_sampler_free(s);
                    size_t n = tm_sampler_pen_entries(&p, V, hist, n_hist, 0, mark, ent);
                    assert_int_equal(n > 0, n_hist > 0 && tm_sampling_has_penalties(&p));
                    for (size_t j = 0; j < n; j++) {
                        assert_true(ent[j].id >= 0 && ent[j].id < V);
                        for (size_t k = 0; k < j; k++) assert_int_not_equal(ent[j].id, ent[k].id);
                    }
                    for (int i = 0; i < V; i++) assert_int_equal(mark[i], 0); /* the scratch is left clean */
                    float before[V];
                    memcpy(before, got, sizeof got);
                    tm_sampler_pen_apply(&p, got, ent, n);
                    assert_memory_equal(got, want, sizeof want);
                    changed += memcmp(got, before, sizeof got) != 0;
                    cases++;
                    /* the same history with its last id in flight: entries over the rest (ahead 1), and the last
                     * id merged as a backend does (tm_sample_row.pen_src): the same logits */
                    if (n_hist == 0 || hist[n_hist - 1] >= V) continue;
                    n = tm_sampler_pen_entries(&p, V, hist, n_hist - 1, 1, mark, ent);
                    tm_sampling_params row = p; /* as the engine fills a row: no window, no repeat penalty */
                    if (row.repeat_last_n == 0) row.repeat_penalty = 1.0f;
                    n = tm_sampler_pen_merge(&row, ent, n, hist[n_hist - 1]);
                    memcpy(got, before, sizeof got);
                    tm_sampler_pen_apply(&p, got, ent, n);
                    assert_memory_equal(got, want, sizeof want);
                    ahead_cases++;
                }
    assert_int_equal(cases, 135);
    assert_true(changed > 60); /* most cases do penalise something */
    assert_true(ahead_cases > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_known_answers),
        cmocka_unit_test(test_rng_uniform),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_topk1_is_greedy),
        cmocka_unit_test(test_topk_support),
        cmocka_unit_test(test_topk_large_k),
        cmocka_unit_test(test_topp_nucleus),
        cmocka_unit_test(test_topp_many_random),
        cmocka_unit_test(test_topp_large_flat),
        cmocka_unit_test(test_minp),
        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_seed_determinism),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_pen_entries),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_nan_inf),
        cmocka_unit_test(test_large_vocab_cost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
