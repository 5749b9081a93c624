/* tm_sampler.c -- logits processing and sampling: penalties, temperature, top-k/top-p/min-p, seeded RNG, logprobs. */
#include "engine/tm_sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tm_sampler {
    tm_sampling_params p;
    int32_t n_vocab;
    tm_rng rng;
    int32_t *idx;    // (n_vocab) candidate token ids, reordered by the selection steps
    float *w;        // (n_vocab) unnormalised weights exp((logit - max) / T), indexed by token id
    float *raw;      // (n_vocab) sanitised raw logits, kept for the chosen token's logprob
    uint32_t *count; // (n_vocab) occurrences of each id in hist; all zero between calls
    uint8_t *mark;   // (n_vocab) 1 = id already penalised in the repeat window; all zero between calls
};

/* ---- RNG: splitmix64 seeding, xoshiro256** ------------------------------------------------------ */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void tm_rng_seed(tm_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64_next(&x);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tm_rng_next(tm_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

float tm_rng_uniform(tm_rng *r) { return (float)(tm_rng_next(r) >> 40) * 0x1.0p-24f; }

double tm_rng_uniform_f64(tm_rng *r) { return (double)(tm_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- parameters --------------------------------------------------------------------------------- */

tm_sampling_params tm_sampling_default(void) {
    tm_sampling_params p = {
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .repeat_last_n = 64,
        .seed = 0,
        .n_logprobs = 0,
    };
    return p;
}

tm_status tm_sampling_validate(const tm_sampling_params *p, tm_error *err) {
    if (!p) return tm_err(err, TM_ERR_INVALID, "sampling parameters missing");
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return tm_err(err, TM_ERR_INVALID, "temperature must be a finite number >= 0 (0 = greedy), got %g",
                      (double)p->temperature);
    if (p->top_k < -1)
        return tm_err(err, TM_ERR_INVALID, "top_k must be >= 0 (0 or -1 = off), got %d", (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return tm_err(err, TM_ERR_INVALID, "top_p must be in (0, 1] (1 = off), got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return tm_err(err, TM_ERR_INVALID, "min_p must be in [0, 1] (0 = off), got %g", (double)p->min_p);
    if (!isfinite(p->repeat_penalty) || !(p->repeat_penalty > 0.0f))
        return tm_err(err, TM_ERR_INVALID, "repeat_penalty must be a finite number > 0 (1 = off), got %g",
                      (double)p->repeat_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return tm_err(err, TM_ERR_INVALID, "presence_penalty must be in [-2, 2] (0 = off), got %g",
                      (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return tm_err(err, TM_ERR_INVALID, "frequency_penalty must be in [-2, 2] (0 = off), got %g",
                      (double)p->frequency_penalty);
    if (p->repeat_last_n < -1)
        return tm_err(err, TM_ERR_INVALID, "repeat_last_n must be >= -1 (-1 = whole history, 0 = off), got %d",
                      (int)p->repeat_last_n);
    if (p->n_logprobs < 0 || p->n_logprobs > TM_MAX_LOGPROBS)
        return tm_err(err, TM_ERR_INVALID, "n_logprobs must be in [0, %d], got %d", TM_MAX_LOGPROBS,
                      (int)p->n_logprobs);
    return TM_OK;
}

/* ---- create / free ------------------------------------------------------------------------------ */

tm_status tm_sampler_create(const tm_sampling_params *p, int32_t n_vocab, tm_sampler **out, tm_error *err) {
    if (!out) return tm_err(err, TM_ERR_INVALID, "tm_sampler_create: out is NULL");
    *out = NULL;
    tm_status st = tm_sampling_validate(p, err);
    if (st != TM_OK) return st;
    if (n_vocab <= 0) return tm_err(err, TM_ERR_INVALID, "sampler: n_vocab must be > 0, got %d", (int)n_vocab);
    tm_sampler *s = tm_calloc(1, sizeof *s);
    if (!s) return tm_err(err, TM_ERR_NOMEM, "sampler: out of memory");
    size_t n = (size_t)n_vocab;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->idx = tm_malloc_array(n, sizeof *s->idx);
    s->w = tm_malloc_array(n, sizeof *s->w);
    s->raw = tm_malloc_array(n, sizeof *s->raw);
    s->count = tm_calloc(n, sizeof *s->count);
    s->mark = tm_calloc(n, sizeof *s->mark);
    if (!s->idx || !s->w || !s->raw || !s->count || !s->mark) {
        st = tm_err(err, TM_ERR_NOMEM, "sampler: out of memory for %d-entry buffers", (int)n_vocab);
        goto fail;
    }
    tm_rng_seed(&s->rng, p->seed);
    *out = s;
    return TM_OK;
fail:
    tm_sampler_free(s);
    return st;
}

void tm_sampler_free(tm_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->w);
    free(s->raw);
    free(s->count);
    free(s->mark);
    free(s);
}

void tm_sampler_reseed(tm_sampler *s, uint64_t seed) {
    s->p.seed = seed;
    tm_rng_seed(&s->rng, seed);
}

/* ---- ordering helpers: "a before b" = larger key, ties by lower id (keys are never NaN here) ------ */

static inline bool before(const float *key, int32_t a, int32_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

static inline void swap_i32(int32_t *a, int32_t *b) {
    int32_t t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(int32_t *a, size_t n, const float *key) {
    for (size_t i = 1; i < n; i++) {
        int32_t v = a[i];
        size_t j = i;
        while (j > 0 && before(key, v, a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* Heap whose root is the element that comes last in `before` order; used to sort best-first. */
static void sift_down(int32_t *a, size_t root, size_t n, const float *key) {
    for (;;) {
        size_t c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && before(key, a[c], a[c + 1])) c++; /* the child that comes later */
        if (!before(key, a[root], a[c])) return;
        swap_i32(&a[root], &a[c]);
        root = c;
    }
}

/* Sort a[0..n) best-first, in place, O(n log n) worst case, no allocation. */
static void sort_best_first(int32_t *a, size_t n, const float *key) {
    if (n < 2) return;
    if (n <= 24) {
        insertion_sort(a, n, key);
        return;
    }
    for (size_t i = n / 2; i-- > 0;) sift_down(a, i, n, key);
    for (size_t end = n - 1; end > 0; end--) {
        swap_i32(&a[0], &a[end]);
        sift_down(a, 0, end, key);
    }
}

/* The quickselects' recursion budget: 2 log2(n) rounds before they fall back to a sort. */
static int select_depth(size_t n) {
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    return depth;
}

/* Median-of-three pivot of a[lo..hi) (hi - lo >= 3): orders a[lo], a[mid], a[hi - 1] best to worst, moves the
 * median to a[hi - 1] and returns it. */
static int32_t median3_pivot(int32_t *a, size_t lo, size_t hi, const float *key) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (before(key, a[mid], a[lo])) swap_i32(&a[mid], &a[lo]);
    if (before(key, a[last], a[lo])) swap_i32(&a[last], &a[lo]);
    if (before(key, a[last], a[mid])) swap_i32(&a[last], &a[mid]);
    swap_i32(&a[mid], &a[last]);
    return a[last];
}

/* Rearrange a[0..n) so that a[0..k) holds the k best ids (in no particular order), 0 < k < n.
 * Quickselect with a median-of-three pivot; falls back to a heap sort of the remaining range when the
 * recursion gets too deep, so the worst case is O(n log n). */
static void select_best(int32_t *a, size_t n, size_t k, const float *key) {
    size_t lo = 0, hi = n; /* invariant: [0,lo) before everything in [lo,n); [hi,n) after everything in [0,hi) */
    int depth = select_depth(n);
    while (hi - lo > 24) {
        if (depth-- <= 0) {
            sort_best_first(a + lo, hi - lo, key);
            return;
        }
        const size_t last = hi - 1;
        const int32_t pivot = median3_pivot(a, lo, hi, key);
        size_t store = lo;
        for (size_t i = lo; i < last; i++)
            if (before(key, a[i], pivot)) swap_i32(&a[i], &a[store++]);
        swap_i32(&a[store], &a[last]); /* pivot now at its final rank `store` */
        if (store == k) return;
        if (store > k)
            hi = store;
        else
            lo = store + 1;
    }
    insertion_sort(a + lo, hi - lo, key);
}

/* The k best of x[0..n) into out[0..k) (in no particular order), 0 < k < n: one sequential pass keeping a
 * k-heap whose root is the worst kept id; O(n) compares plus O(log k) per replacement. */
static void select_best_heap(const float *x, int32_t n, int32_t *out, size_t k) {
    for (size_t i = 0; i < k; i++) out[i] = (int32_t)i;
    for (size_t i = k / 2; i-- > 0;) sift_down(out, i, k, x);
    for (int32_t i = (int32_t)k; i < n; i++) {
        if (!before(x, i, out[0])) continue;
        out[0] = i;
        sift_down(out, 0, k, x);
    }
}

/* ---- the pipeline ------------------------------------------------------------------------------- */

static void sanitize(float *x, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            x[i] = -INFINITY;
        else if (x[i] == INFINITY)
            x[i] = FLT_MAX;
    }
}

/* Index of the largest logit, ties to the lowest id; -1 if all are -inf. */
static int32_t argmax(const float *x, int32_t n) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    return best;
}

static inline float pen_one(const tm_sampling_params *p, float x, int32_t count, bool in_window) {
    if (in_window) x = x > 0.0f ? x / p->repeat_penalty : x * p->repeat_penalty;
    if (count > 0) {
        const float sub = (float)count * p->frequency_penalty; /* two roundings, as the device does */
        x -= sub + p->presence_penalty;
    }
    return x;
}

static void apply_penalties(tm_sampler *s, float *x, const int32_t *hist, size_t n_hist) {
    const tm_sampling_params *p = &s->p;
    const int32_t V = s->n_vocab;
    if (!hist || n_hist == 0) return;
    if (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) {
        size_t start = 0;
        if (p->repeat_last_n > 0 && (size_t)p->repeat_last_n < n_hist) start = n_hist - (size_t)p->repeat_last_n;
        for (size_t i = start; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= V || s->mark[id]) continue;
            s->mark[id] = 1;
            x[id] = pen_one(p, x[id], 0, true);
        }
        for (size_t i = start; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->mark[hist[i]] = 0;
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (size_t i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->count[hist[i]]++;
        for (size_t i = 0; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= V || s->count[id] == 0) continue;
            x[id] = pen_one(p, x[id], s->count[id], false);
            s->count[id] = 0; /* applied once; also restores the all-zero invariant */
        }
    }
}

bool tm_sampling_has_penalties(const tm_sampling_params *p) {
    return (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

size_t tm_sampler_pen_entries(const tm_sampling_params *p, int32_t n_vocab, const int32_t *hist, size_t n_hist,
                              size_t ahead, int32_t *mark, tm_sample_pen *out) {
    const bool rep = p->repeat_penalty != 1.0f && p->repeat_last_n != 0;
    const bool pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!hist || n_hist == 0 || (!rep && !pf)) return 0;
    size_t start = 0; /* the repeat penalty's window: hist[start ..) (with the ids ahead, the last repeat_last_n) */
    if (p->repeat_last_n > 0) {
        const size_t win = (size_t)p->repeat_last_n > ahead ? (size_t)p->repeat_last_n - ahead : 0;
        start = win < n_hist ? n_hist - win : 0;
    }
    size_t n = 0;
    for (size_t i = pf ? 0 : start; i < n_hist; i++) { /* the repeat penalty alone reads its window only */
        const int32_t id = hist[i];
        const bool win = rep && i >= start;
        if (id < 0 || id >= n_vocab || (!pf && !win)) continue;
        if (!mark[id]) {
            out[n] = (tm_sample_pen){id, 0, 0};
            mark[id] = (int32_t)++n;
        }
        tm_sample_pen *e = &out[mark[id] - 1];
        if (pf) e->count++;
        if (win) e->in_window = 1;
    }
    for (size_t j = 0; j < n; j++) mark[out[j].id] = 0;
    return n;
}

void tm_sampler_pen_apply(const tm_sampling_params *p, float *x, const tm_sample_pen *e, size_t n) {
    for (size_t j = 0; j < n; j++) x[e[j].id] = pen_one(p, x[e[j].id], e[j].count, e[j].in_window != 0);
}

size_t tm_sampler_pen_merge(const tm_sampling_params *p, tm_sample_pen *e, size_t n, int32_t id) {
    const bool rep = p->repeat_penalty != 1.0f, pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!rep && !pf) return n;
    size_t j = 0;
    while (j < n && e[j].id != id) j++;
    if (j == n) e[n++] = (tm_sample_pen){id, 0, 0};
    e[j].count += pf;
    e[j].in_window |= rep;
    return n;
}

/* log-softmax normaliser kept as (max, log sum exp(x - max)): x - lse computed as (x - max) - log_z keeps
 * the precision that max + log_z would lose when max is huge (FLT_MAX for +inf logits). */
typedef struct lse_t {
    double max;   /* -inf when every logit is -inf */
    double log_z;
} lse_t;

/* e^d for d <= 0, within a few ulp of expf (below -87, where e^d nears FLT_MIN, e^-87): d = n ln2 + g, n an integer
 * (rounded to nearest through the 1.5 * 2^23 shift), g in [-ln2 / 2, ln2 / 2] (ln2 in two parts, so that n ln2 is
 * exact), e^g by its Taylor polynomial to g^6 (remainder < 1.2e-7 relative), 2^n through the exponent bits.
 * Branch-free, so that a loop over a vocabulary vectorizes: with libm's exp in double, log_sum_exp took ~0.3-0.4 ms
 * more a token of a 128k vocabulary with logprobs on (thirtieth session). */
static inline float exp_nonpos(float d) {
    uint32_t u; /* d clamped at -87 on its bits (a float compare would keep the loop from vectorizing) */
    memcpy(&u, &d, sizeof u);
    u |= 0x80000000u;                      /* -|d|: d <= 0, and x - x is +0 */
    u = u < 0xC2AE0000u ? u : 0xC2AE0000u; /* past -87 (also -inf and NaN): -87 */
    memcpy(&d, &u, sizeof d);
    const float nf = (d * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float g = (d - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * g + 1.0f / 120.0f;
    p = p * g + 1.0f / 24.0f;
    p = p * g + 1.0f / 6.0f;
    p = p * g + 0.5f;
    p = p * g + 1.0f;
    p = p * g + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)nf + 127) << 23; /* nf in [-126, 0]: a normal 2^nf */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* e: (n) scratch for the terms */
static lse_t log_sum_exp(const float *x, int32_t n, float *e) {
    lse_t r = {-INFINITY, 0.0};
    int32_t am = argmax(x, n);
    if (am < 0) return r;
    const float m = x[am];
    r.max = m;
    for (int32_t i = 0; i < n; i++) e[i] = exp_nonpos(x[i] - m);
    /* eight running sums in double, added in a fixed order */
    double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)e[i + j];
    for (; i < n; i++) acc[0] += (double)e[i];
    double sum = 0.0;
    for (int j = 0; j < 8; j++) sum += acc[j];
    r.log_z = log(sum);
    return r;
}

static float logprob_of(const float *x, int32_t id, lse_t lse, int32_t n_vocab) {
    if (lse.max == -INFINITY) return (float)-log((double)n_vocab); /* all -inf: uniform */
    return (float)(((double)x[id] - lse.max) - lse.log_z);
}

static void top_logprobs(tm_sampler *s, const float *x, lse_t lse, tm_logprob *top, int32_t n_top) {
    const int32_t V = s->n_vocab;
    size_t k = (size_t)(n_top < V ? n_top : V);
    if (k < (size_t)V) { /* k <= 20: one pass with a k-heap (a quickselect over the ids took ~1.6 ms at 128k) */
        select_best_heap(x, V, s->idx, k);
    } else {
        for (int32_t i = 0; i < V; i++) s->idx[i] = i;
    }
    sort_best_first(s->idx, k, x);
    for (size_t i = 0; i < k; i++) {
        top[i].id = s->idx[i];
        top[i].logprob = logprob_of(x, s->idx[i], lse, V);
    }
    for (size_t i = k; i < (size_t)n_top; i++) { /* n_top > n_vocab: pad with nothing sensible */
        top[i].id = -1;
        top[i].logprob = -INFINITY;
    }
}

/* Top-p without sorting: rearrange a[0..n) so that a[0..j) is the smallest set of best ids whose weights
 * reach `target` (j is returned; a[0..j) are the j best, in no particular order). A quickselect that
 * carries the mass of the side it keeps, so O(n) expected; depth-limited with a sort as the fallback.
 * If rounding keeps the running mass short of target, everything is kept (returns n). */
static size_t select_mass(int32_t *a, size_t n, double target, const float *w, const float *key) {
    size_t lo = 0, hi = n; /* [0,lo) taken (their mass is already subtracted from t); the cut is in (lo,hi] */
    double t = target;
    int depth = select_depth(n);
    while (hi - lo > 24 && depth-- > 0) {
        const size_t last = hi - 1;
        const int32_t pivot = median3_pivot(a, lo, hi, key);
        size_t store = lo;
        double mb = 0.0; /* mass of the ids better than the pivot */
        for (size_t i = lo; i < last; i++)
            if (before(key, a[i], pivot)) {
                mb += w[a[i]];
                swap_i32(&a[i], &a[store++]);
            }
        swap_i32(&a[store], &a[last]);
        if (mb >= t) {
            hi = store;
        } else if (mb + w[pivot] >= t) {
            return store + 1;
        } else {
            t -= mb + w[pivot];
            lo = store + 1;
            if (lo >= hi) return hi;
        }
    }
    sort_best_first(a + lo, hi - lo, key);
    for (size_t i = lo; i < hi; i++) {
        t -= w[a[i]];
        if (t <= 0.0) return i + 1;
    }
    return hi;
}

static double weight_sum(const int32_t *idx, size_t n, const float *w) {
    double z = 0.0;
    for (size_t i = 0; i < n; i++) z += w[idx[i]];
    return z;
}

/* Step 5 short of the draw: fill s->idx[0..n) with the kept ids (in no particular order), return n and
 * their weight sum. x are the penalised logits, at least one of them finite, m their max (prepare's argmax; the
 * pass is not repeated here: ~0.1 ms a token of a 128k vocabulary). The selections order by x
 * (finer than w, which can underflow to equal zeros), ties by lower id. */
static size_t build_candidates(tm_sampler *s, const float *x, float m, double *wsum_out) {
    const tm_sampling_params *p = &s->p;
    const int32_t V = s->n_vocab;
    const float T = p->temperature;
    float *w = s->w;
    int32_t *idx = s->idx;
    size_t n = (size_t)V;
    /* weights exp((x - m) / T): (x - m) <= 0 and never inf - inf, m being finite (FLT_MAX at most) */
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        n = (size_t)p->top_k;
        if (n <= 512) {
            select_best_heap(x, V, idx, n);
        } else {
            for (int32_t i = 0; i < V; i++) idx[i] = i;
            select_best(idx, (size_t)V, n, x);
        }
        for (size_t i = 0; i < n; i++) w[idx[i]] = expf((x[idx[i]] - m) / T); /* only the k are needed */
    } else {
        for (int32_t i = 0; i < V; i++) {
            w[i] = expf((x[i] - m) / T);
            idx[i] = i;
        }
    }
    double z = weight_sum(idx, n, w);
    if (p->top_p < 1.0f) {
        n = select_mass(idx, n, (double)p->top_p * z, w, x);
        z = weight_sum(idx, n, w);
    }
    if (p->min_p > 0.0f) {
        /* the max is kept by every step above and has weight exp(0) = 1, so the threshold is min_p */
        const float thr = p->min_p;
        size_t j = 0;
        for (size_t i = 0; i < n; i++)
            if (w[idx[i]] >= thr) idx[j++] = idx[i];
        n = j;
        z = weight_sum(idx, n, w);
    }
    *wsum_out = z;
    return n;
}

/* Steps 3-5 short of the draw; returns the greedy/fallback id, or -1 with candidates built. */
static int32_t prepare(tm_sampler *s, float *logits, const int32_t *hist, size_t n_hist, size_t *n_cand,
                       double *wsum) {
    apply_penalties(s, logits, hist, n_hist);
    int32_t am = argmax(logits, s->n_vocab);
    if (am < 0) return 0;                         /* all -inf: fallback to the first id */
    if (s->p.temperature == 0.0f) return am;      /* greedy */
    *n_cand = build_candidates(s, logits, logits[am], wsum);
    return -1;
}

/* sanitize, then argmax, in one pass (greedy without penalties or logprobs: the decode loop's common case) */
static int32_t sanitize_argmax(float *x, int32_t n) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        float v = x[i];
        if (isnan(v)) x[i] = v = -INFINITY;
        else if (v == INFINITY) x[i] = v = FLT_MAX;
        if (v > bv) {
            bv = v;
            best = i;
        }
    }
    return best;
}

static bool penalties_apply(const tm_sampler *s, size_t n_hist) {
    const tm_sampling_params *p = &s->p;
    return n_hist > 0 && tm_sampling_has_penalties(p);
}

int32_t tm_sampler_sample(tm_sampler *s, float *logits, const int32_t *hist, size_t n_hist, tm_logprob *chosen,
                          tm_logprob *top) {
    const int32_t V = s->n_vocab;
    if (s->p.temperature == 0.0f && s->p.n_logprobs <= 0 && !penalties_apply(s, hist ? n_hist : 0)) {
        int32_t am = sanitize_argmax(logits, V);
        if (am < 0) am = 0; /* all -inf: the first id, as prepare() falls back */
        if (chosen) {
            chosen->id = am;
            chosen->logprob = 0.0f;
        }
        return am;
    }
    sanitize(logits, V);
    const bool want_lp = s->p.n_logprobs > 0;
    lse_t lse = {0.0, 0.0};
    if (want_lp) {
        lse = log_sum_exp(logits, V, s->w); /* w is scratch until build_candidates */
        if (top) top_logprobs(s, logits, lse, top, s->p.n_logprobs);
        if (chosen) memcpy(s->raw, logits, (size_t)V * sizeof *logits);
    }
    size_t n = 0;
    double z = 0.0;
    int32_t id = prepare(s, logits, hist, n_hist, &n, &z);
    if (id < 0) {
        const double u = tm_rng_uniform_f64(&s->rng) * z;
        double acc = 0.0;
        for (size_t i = 0; i < n; i++) {
            const float wi = s->w[s->idx[i]];
            if (wi <= 0.0f) continue;
            id = s->idx[i]; /* also the fallback if rounding leaves u >= the final sum */
            acc += wi;
            if (u < acc) break;
        }
        if (id < 0) id = s->idx[0]; /* unreachable: the max always has weight 1 */
    }
    if (chosen) {
        chosen->id = id;
        chosen->logprob = want_lp ? logprob_of(s->raw, id, lse, V) : 0.0f;
    }
    return id;
}

void tm_sampler_probs(tm_sampler *s, float *logits, const int32_t *hist, size_t n_hist, float *probs) {
    const int32_t V = s->n_vocab;
    sanitize(logits, V);
    size_t n = 0;
    double z = 0.0;
    int32_t id = prepare(s, logits, hist, n_hist, &n, &z);
    memset(probs, 0, (size_t)V * sizeof *probs);
    if (id >= 0) {
        probs[id] = 1.0f;
        return;
    }
    for (size_t i = 0; i < n; i++) probs[s->idx[i]] = (float)((double)s->w[s->idx[i]] / z);
}
