/* tb_sample.c -- test bed of tm_cuda_argmax and tm_cuda_sample: exact CPU distributions, statistics, timing. */
#include "tb_common.h"
#include "tb_guard.h"

#include "backend/cuda/tm_cuda_kernels.h"
#include "engine/tm_sampler.h"

/* version 1: the bit-by-bit selection; 2: radix selection, blocks per row chosen by the launcher; 2CL (21, 22,
 * 24, 28): radix selection with CL blocks per row forced (a cluster when CL > 1) */
static void set_version(int v) {
    unsetenv("TM_CUDA_SAMPLE_V");
    unsetenv("TM_CUDA_SAMPLE_CLUSTER");
    if (v == 1) setenv("TM_CUDA_SAMPLE_V", "1", 1);
    if (v > 20) {
        char cl[16];
        snprintf(cl, sizeof cl, "%d", v - 20);
        setenv("TM_CUDA_SAMPLE_CLUSTER", cl, 1);
    }
}

static int ref_argmax(const float *x, int V) {
    int a = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* log softmax(x)[id] in double */
static double ref_logprob(const float *x, int V, int id) {
    double m = x[ref_argmax(x, V)], s = 0.0;
    for (int i = 0; i < V; i++) s += exp((double)x[i] - m);
    return ((double)x[id] - m) - log(s);
}

/* ---- the kernel's restricted distribution, on the CPU ---- */

static const float *g_sort_x; /* qsort context */
static int cmp_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float xi = g_sort_x[i], xj = g_sort_x[j];
    if (xi != xj) return xi > xj ? -1 : 1;
    return (i > j) - (i < j); /* ties: lower id first */
}

/* prob[i] = probability that the sampler draws i: weights w = expf((x - max) / T) as integers round(w * 2^40),
 * top_k (count), then top_p (the shortest prefix in (x desc, id asc) order whose mass reaches ceil(p * Z)),
 * then min_p (w >= min_p), renormalized. Returns the number of tokens kept. */
static int ref_distribution(const float *x, int V, tm_cuda_sample_params p, double *prob) {
    int *ord = malloc(V * sizeof(int));
    float *w = malloc(V * sizeof(float));
    unsigned long long *W = malloc(V * sizeof(unsigned long long));
    for (int i = 0; i < V; i++) ord[i] = i;
    g_sort_x = x;
    qsort(ord, V, sizeof(int), cmp_desc);
    float m = x[ord[0]];
    for (int i = 0; i < V; i++) {
        w[i] = expf((x[i] - m) / p.temperature);
        W[i] = (unsigned long long)llrintf(w[i] * 1099511627776.0f);
    }
    int n = V;
    if (p.top_k > 0 && p.top_k < V) n = p.top_k;
    if (p.top_p < 1.0f) {
        unsigned long long z = 0, cum = 0;
        for (int j = 0; j < n; j++) z += W[ord[j]];
        double t = ceil((double)p.top_p * (double)z);
        unsigned long long target = t <= 1.0 ? 1 : (unsigned long long)t;
        if (target > z) target = z;
        for (int j = 0; j < n; j++) {
            cum += W[ord[j]];
            if (cum >= target) {
                n = j + 1;
                break;
            }
        }
    }
    float minp = p.min_p > 1.0f ? 1.0f : p.min_p;
    double zs = 0.0;
    int kept = 0;
    for (int i = 0; i < V; i++) prob[i] = 0.0;
    for (int j = 0; j < n; j++) {
        int i = ord[j];
        if (minp > 0.0f && !(w[i] >= minp)) continue;
        prob[i] = (double)W[i];
        zs += (double)W[i];
        kept += W[i] > 0;
    }
    for (int i = 0; i < V; i++) prob[i] /= zs;
    free(ord);
    free(w);
    free(W);
    return kept;
}

/* ---- one launch ---- */

typedef struct {
    float *logits; /* device (rows, V) */
    tm_cuda_sample_params *params;
    int32_t *ids;
    float *lp;
    int rows, V;
} sample_arg;

static void run_sample(void *p) {
    sample_arg *a = p;
    TB_CHECK(tm_cuda_sample(a->logits, a->rows, a->V, a->params, NULL, a->ids, a->lp, 0));
}

static void run_argmax(void *p) {
    sample_arg *a = p;
    TB_CHECK(tm_cuda_argmax(a->logits, a->rows, a->V, a->ids, 0));
}

static void sample_once(sample_arg *a, const tm_cuda_sample_params *hp, int version, int32_t *ids, float *lp) {
    TB_CHECK(cudaMemcpy(a->params, hp, a->rows * sizeof *hp, cudaMemcpyHostToDevice));
    tb_poison(a->ids, a->rows * sizeof(int32_t));
    tb_poison(a->lp, a->rows * sizeof(float));
    set_version(version);
    TB_RUN(tm_cuda_sample(a->logits, a->rows, a->V, a->params, NULL, a->ids, a->lp, 0));
    set_version(2);
    tb_download(ids, a->ids, a->rows * sizeof(int32_t));
    if (lp) tb_download(lp, a->lp, a->rows * sizeof(float));
}

static sample_arg make_arg(const float *logits, int rows, int V) {
    sample_arg a = {tb_upload(logits, (size_t)rows * V * sizeof(float)), tb_dev(rows * sizeof(tm_cuda_sample_params)),
                    tb_dev(rows * sizeof(int32_t)), tb_dev(rows * sizeof(float)), rows, V};
    return a;
}

static void free_arg(sample_arg *a) {
    cudaFree(a->logits);
    cudaFree(a->params);
    cudaFree(a->ids);
    cudaFree(a->lp);
}

/* ---- argmax ---- */

static void check_argmax(int rows, int V, bool ties) {
    size_t n = (size_t)rows * V;
    float *x = malloc(n * sizeof(float));
    int32_t *ids = malloc(rows * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) x[i] = ties ? (float)(int)(3.0f * tb_uniform()) : 5.0f * tb_normal();
    if (rows > 1) /* a row of -inf but one, and one all -inf */
        for (int j = 0; j < V; j++) x[(size_t)V + j] = j == V / 2 ? -1e30f : -INFINITY;
    if (rows > 2)
        for (int j = 0; j < V; j++) x[(size_t)2 * V + j] = -INFINITY;
    sample_arg a = make_arg(x, rows, V);
    int bad = 0;
    static const char *const blocks[] = {NULL, "1", "2", "4", "8"}; /* the launcher's choice, then forced */
    for (int b = 0; b < 5; b++) {
        if (blocks[b])
            setenv("TM_CUDA_ARGMAX_CLUSTER", blocks[b], 1);
        else
            unsetenv("TM_CUDA_ARGMAX_CLUSTER");
        tb_poison(a.ids, rows * sizeof(int32_t));
        TB_RUN(tm_cuda_argmax(a.logits, rows, V, a.ids, 0));
        tb_download(ids, a.ids, rows * sizeof(int32_t));
        for (int r = 0; r < rows; r++) bad += ids[r] != ref_argmax(x + (size_t)r * V, V);
    }
    unsetenv("TM_CUDA_ARGMAX_CLUSTER");
    char name[64];
    snprintf(name, sizeof name, "rows=%d V=%d%s (1-8 blocks)", rows, V, ties ? " ties" : "");
    tb_result("argmax", name, bad, 0, 0, 0, 0, 'm');
    free_arg(&a);
    free(x);
    free(ids);
}

/* ---- sampling: exactness over large vocabularies ---- */

static const tm_cuda_sample_params k_sets[] = {
    /* T, top_p, min_p, top_k, seed, offset */
    {0.7f, 0.9f, 0.05f, 40, 1, 0},   {1.0f, 0.95f, 0.0f, 0, 2, 0},  {1.2f, 1.0f, 0.0f, 500, 3, 0},
    {0.8f, 0.9f, 0.0f, 3000, 4, 0},  {1.0f, 1.0f, 0.1f, 0, 5, 0},   {0.05f, 1.0f, 0.0f, 0, 6, 0},
    {1.0f, 1.0f, 0.0f, 0, 7, 0},     {1.5f, 0.5f, 0.02f, 2048, 8, 0}, {1.0f, 0.3f, 0.0f, 2049, 9, 0},
    {0.9f, 0.99f, 0.3f, 100, 10, 0}, {1.0f, 1.0f, 1.0f, 0, 11, 0},  {2.0f, 0.8f, 0.0f, 1, 12, 0},
};
enum { N_SETS = sizeof k_sets / sizeof k_sets[0] };

/* rows of V logits, each with params k_sets[r % N_SETS] (several offsets each); checks that every drawn token
 * has nonzero probability under the reference, the logprob, and that v1 == v2 and reruns are identical.
 * Flat logits make top-p sets far larger than the shared-memory list (the v2 path over the row). */
enum { LOGITS_NORMAL, LOGITS_TIES, LOGITS_FLAT };
static void check_exact(int rows, int V, int kind, const char *label) {
    size_t n = (size_t)rows * V;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = kind == LOGITS_TIES ? (float)(int)(4.0f * tb_uniform())
                                   : (kind == LOGITS_FLAT ? 0.05f : 3.0f) * tb_normal();
    for (int r = 0; r < rows; r += 5) x[(size_t)r * V + (size_t)(tb_rand_u64() % V)] = -INFINITY; /* masked */
    tm_cuda_sample_params *hp = malloc(rows * sizeof *hp);
    for (int r = 0; r < rows; r++) {
        hp[r] = k_sets[r % N_SETS];
        hp[r].offset = (uint64_t)r * 7919u;
    }
    int32_t *ids1 = malloc((size_t)rows * 4), *ids2 = malloc((size_t)rows * 4), *ids3 = malloc((size_t)rows * 4);
    float *lp = malloc((size_t)rows * 4);
    double *prob = malloc((size_t)V * sizeof(double));
    sample_arg a = make_arg(x, rows, V);
    sample_once(&a, hp, 2, ids2, lp);
    sample_once(&a, hp, 2, ids3, NULL);
    sample_once(&a, hp, 1, ids1, NULL);
    int bad_set = 0, bad_lp = 0, bad_det = 0, bad_v1 = 0;
    static const int forced[] = {21, 22, 24, 28}; /* every group size draws what v1 draws */
    for (size_t f = 0; f < sizeof forced / sizeof forced[0]; f++) {
        sample_once(&a, hp, forced[f], ids3, NULL);
        for (int r = 0; r < rows; r++)
            if (ids3[r] != ids1[r] && bad_v1++ < 5)
                printf("# row %d: %d blocks per row drew %d, v1 %d\n", r, forced[f] - 20, ids3[r], ids1[r]);
    }
    sample_once(&a, hp, 2, ids3, NULL);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * V;
        ref_distribution(xr, V, hp[r], prob);
        if (ids2[r] < 0 || ids2[r] >= V || !(prob[ids2[r]] > 0.0)) {
            if (bad_set++ < 5) printf("# row %d: token %d outside the allowed set\n", r, ids2[r]);
            continue;
        }
        double want = ref_logprob(xr, V, ids2[r]);
        if (!(fabs(lp[r] - want) <= 1e-4 * (1.0 + fabs(want)))) {
            if (bad_lp++ < 5) printf("# row %d: logprob %.7g, want %.7g\n", r, lp[r], want);
        }
        bad_det += ids3[r] != ids2[r];
        if (ids1[r] != ids2[r] && bad_v1++ < 5) printf("# row %d: v1 drew %d, v2 %d\n", r, ids1[r], ids2[r]);
    }
    char name[96];
    snprintf(name, sizeof name, "%s allowed-set rows=%d V=%d", label, rows, V);
    tb_result("sample", name, bad_set, 0, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s logprob rows=%d V=%d", label, rows, V);
    tb_result("sample", name, bad_lp, 0, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s rerun, v1 == v2 (1-8 blocks) rows=%d V=%d", label, rows, V);
    tb_result("sample", name, bad_det + bad_v1, 0, 0, 0, 0, 'm');
    free_arg(&a);
    free(x);
    free(hp);
    free(ids1);
    free(ids2);
    free(ids3);
    free(lp);
    free(prob);
}

/* greedy (T = 0) and top_k = 1 are the argmax; logprob of the greedy token */
static void check_greedy(int rows, int V) {
    size_t n = (size_t)rows * V;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(int)(8.0f * tb_normal()); /* ties at the max, often */
    tm_cuda_sample_params *hp = malloc(rows * sizeof *hp);
    for (int r = 0; r < rows; r++) {
        tm_cuda_sample_params g = {r % 2 ? 0.0f : -1.0f, 0.9f, 0.1f, 50, 42, (uint64_t)r};
        tm_cuda_sample_params k1 = {1.0f + r % 3, 1.0f, 0.0f, 1, 43, (uint64_t)r};
        hp[r] = r % 4 < 2 ? g : k1;
    }
    int32_t *ids = malloc((size_t)rows * 4), *ids1 = malloc((size_t)rows * 4);
    float *lp = malloc((size_t)rows * 4);
    sample_arg a = make_arg(x, rows, V);
    int32_t *ids8 = malloc((size_t)rows * 4);
    sample_once(&a, hp, 2, ids, lp);
    sample_once(&a, hp, 1, ids1, NULL);
    sample_once(&a, hp, 28, ids8, NULL);
    int bad = 0, bad_lp = 0;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * V;
        int want = ref_argmax(xr, V);
        bad += (ids[r] != want) + (ids1[r] != want) + (ids8[r] != want);
        double wl = ref_logprob(xr, V, want);
        if (r % 4 < 2 && !(fabs(lp[r] - wl) <= 1e-4 * (1.0 + fabs(wl)))) bad_lp++;
    }
    char name[64];
    snprintf(name, sizeof name, "greedy+top_k=1 rows=%d V=%d", rows, V);
    tb_result("sample", name, bad + bad_lp, 0, 0, 0, 0, 'm');
    free_arg(&a);
    free(x);
    free(hp);
    free(ids);
    free(ids1);
    free(ids8);
    free(lp);
}

/* edges: V = 1; a row of -inf but one; a row of all -inf (id 0, logprob -log V) */
static void check_edges(void) {
    int bad = 0;
    {
        float x[3] = {0.5f, -2.0f, 7.0f};
        sample_arg a = make_arg(x, 3, 1);
        tm_cuda_sample_params hp[3] = {
            {1.0f, 0.9f, 0.1f, 5, 1, 1}, {0.0f, 1.0f, 0.0f, 0, 1, 2}, {2.0f, 1.0f, 0.0f, 1, 1, 3}};
        int32_t ids[3];
        float lp[3];
        sample_once(&a, hp, 2, ids, lp);
        for (int r = 0; r < 3; r++) bad += ids[r] != 0 || fabs(lp[r]) > 1e-6;
        free_arg(&a);
    }
    {
        enum { V = 1000 };
        float *x = malloc(2 * V * sizeof(float));
        for (int j = 0; j < V; j++) x[j] = j == 777 ? -50.0f : -INFINITY, x[V + j] = -INFINITY;
        sample_arg a = make_arg(x, 2, V);
        tm_cuda_sample_params hp[2] = {{1.0f, 0.5f, 0.0f, 0, 9, 9}, {1.0f, 0.5f, 0.0f, 0, 9, 9}};
        int32_t ids[2];
        float lp[2];
        static const int vs[] = {1, 2, 21, 28};
        for (int k = 0; k < 4; k++) {
            sample_once(&a, hp, vs[k], ids, lp);
            bad += ids[0] != 777 || fabs(lp[0]) > 1e-6 || ids[1] != 0 || fabs(lp[1] + logf((float)V)) > 1e-4;
        }
        free_arg(&a);
        free(x);
    }
    tb_result("sample", "edges V=1, -inf rows", bad, 0, 0, 0, 0, 'm');
}

/* ---- sampling: statistics on a small vocabulary ---- */

/* rows copies of one logit row, draws with distinct offsets over `launches` launches; every token's frequency
 * within 5 sd (+ 2/N) of the exact probability, tokens of probability 0 never drawn */
static void check_stats(const float *x, int V, tm_cuda_sample_params p, int version, const char *label) {
    const int rows = 1024, launches = 64;
    float *xs = malloc((size_t)rows * V * sizeof(float));
    for (int r = 0; r < rows; r++) memcpy(xs + (size_t)r * V, x, V * sizeof(float));
    double *prob = malloc(V * sizeof(double));
    long *count = calloc(V, sizeof(long));
    int kept = ref_distribution(x, V, p, prob);
    tm_cuda_sample_params *hp = malloc(rows * sizeof *hp);
    int32_t *ids = malloc((size_t)rows * 4);
    sample_arg a = make_arg(xs, rows, V);
    for (int l = 0; l < launches; l++) {
        for (int r = 0; r < rows; r++) {
            hp[r] = p;
            hp[r].offset = (uint64_t)l * rows + r;
        }
        sample_once(&a, hp, version, ids, NULL);
        for (int r = 0; r < rows; r++)
            if (ids[r] >= 0 && ids[r] < V) count[ids[r]]++;
    }
    double N = (double)rows * launches, chi2 = 0.0;
    int bad = 0;
    long total = 0;
    for (int i = 0; i < V; i++) {
        total += count[i];
        double f = count[i] / N, pi = prob[i];
        if (pi == 0.0) {
            if (count[i]) {
                if (bad++ < 5) printf("# %s: token %d drawn %ld times, probability 0\n", label, i, count[i]);
            }
            continue;
        }
        chi2 += (count[i] - N * pi) * (count[i] - N * pi) / (N * pi);
        if (fabs(f - pi) > 5.0 * sqrt(pi * (1.0 - pi) / N) + 2.0 / N) {
            if (bad++ < 5) printf("# %s: token %d frequency %.5f, probability %.5f\n", label, i, f, pi);
        }
    }
    bad += total != (long)N;
    printf("# %s: %d tokens allowed, chi2 %.1f (dof %d), N %.0f\n", label, kept, chi2, kept - 1, N);
    char name[96];
    snprintf(name, sizeof name, "%s%d stats %s", version > 20 ? "blocks=" : "v", version > 20 ? version - 20 : version,
             label);
    tb_result("sample", name, bad, 0, 0, 0, 0, 'm');
    free_arg(&a);
    free(xs);
    free(prob);
    free(count);
    free(hp);
    free(ids);
}

static void stats_suite(void) {
    enum { V = 50, VT = 64 };
    float x[V], xt[VT];
    for (int i = 0; i < V; i++) x[i] = 1.5f * tb_normal();
    x[17] = -INFINITY; /* a masked token */
    for (int i = 0; i < VT; i++) xt[i] = (float)(int)(3.0f * tb_uniform()); /* many exact ties */
    static const struct {
        const char *name;
        tm_cuda_sample_params p;
        bool ties;
    } cases[] = {
        {"plain T=1", {1.0f, 1.0f, 0.0f, 0, 11, 0}, false},
        {"T=0.7 top_k=10", {0.7f, 1.0f, 0.0f, 10, 12, 0}, false},
        {"T=1 top_p=0.8", {1.0f, 0.8f, 0.0f, 0, 13, 0}, false},
        {"T=1.3 min_p=0.1", {1.3f, 1.0f, 0.1f, 0, 14, 0}, false},
        {"T=0.9 k=20 p=0.9 min_p=0.05", {0.9f, 0.9f, 0.05f, 20, 15, 0}, false},
        {"ties T=1 top_k=5", {1.0f, 1.0f, 0.0f, 5, 16, 0}, true},
        {"ties T=2 top_p=0.4", {2.0f, 0.4f, 0.0f, 0, 17, 0}, true},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int v = 2; v >= 1; v--)
            check_stats(cases[c].ties ? xt : x, cases[c].ties ? VT : V, cases[c].p, v, cases[c].name);
    check_stats(x, V, cases[4].p, 28, cases[4].name); /* a cluster of 8 blocks per row */
    check_stats(xt, VT, cases[5].p, 24, cases[5].name);
    /* seeds: the same (seed, offset) gives the same token (checked by the reruns); another seed changes draws */
    {
        const int rows = 256;
        float *xs = malloc((size_t)rows * V * sizeof(float));
        for (int r = 0; r < rows; r++) memcpy(xs + (size_t)r * V, x, V * sizeof(float));
        tm_cuda_sample_params *hp = malloc(rows * sizeof *hp);
        int32_t *a1 = malloc((size_t)rows * 4), *a2 = malloc((size_t)rows * 4);
        sample_arg a = make_arg(xs, rows, V);
        for (int r = 0; r < rows; r++) hp[r] = (tm_cuda_sample_params){1.0f, 1.0f, 0.0f, 0, 100, (uint64_t)r};
        sample_once(&a, hp, 2, a1, NULL);
        for (int r = 0; r < rows; r++) hp[r].seed = 101;
        sample_once(&a, hp, 2, a2, NULL);
        int same = 0;
        for (int r = 0; r < rows; r++) same += a1[r] == a2[r];
        printf("# seeds 100 / 101: %d of %d draws equal\n", same, rows);
        tb_result("sample", "another seed changes draws", same > rows / 2, 0, 0, 0, 0, 'm');
        free_arg(&a);
        free(xs);
        free(hp);
        free(a1);
        free(a2);
    }
}

/* ---- penalties and logprobs (tm_cuda_sample_prepare, then the draw, then tm_cuda_sample_finish) ---- */

enum { PEN_PREV = 8 }; /* ids of a "previous pass" that pipelined rows (pen_src) read */

typedef struct pen_case {
    int rows, V;
    float *x;                    /* (rows, V) host logits */
    tm_cuda_sample_params *hp;   /* (rows) greedy */
    tm_cuda_sample_extra *hx;    /* (rows) */
    tm_cuda_sample_pen *pen;     /* (n_pen) */
    int n_pen;
    float *d_x, *d_raw;
    tm_cuda_sample_params *d_p;
    tm_cuda_sample_extra *d_xp;
    tm_cuda_sample_pen *d_pen;
    int32_t *d_ids;
    tm_cuda_sample_lp *d_lp;
    void *d_work;
    int32_t prev[PEN_PREV];      /* the previous pass's ids: every other one an id the row's entries hold */
    int32_t *d_prev;
} pen_case;

/* rows of logits (ties: small integers) with per-row penalties over up to 48 distinct ids each and n_top in 0, 1, 5,
 * 20; every seventh row boosts one id by 50 (a presence penalty of -50), so that the drawn id is one the penalties
 * touched and its logprob must come from the value before them */
static pen_case pen_make(int rows, int V, bool ties) {
    pen_case c;
    memset(&c, 0, sizeof c);
    c.rows = rows;
    c.V = V;
    size_t n = (size_t)rows * V;
    c.x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) c.x[i] = ties ? (float)(int)(3.0f * tb_normal()) : 4.0f * tb_normal();
    c.hp = malloc(rows * sizeof *c.hp);
    c.hx = malloc(rows * sizeof *c.hx);
    c.pen = malloc((size_t)rows * 48 * sizeof *c.pen);
    int32_t *mark = calloc((size_t)V, sizeof(int32_t));
    const int tops[4] = {0, 1, 5, 20};
    for (int r = 0; r < rows; r++) {
        const bool boost = r % 7 == 2;
        tm_cuda_sample_extra e = {r % 3 == 0 ? 1.0f : 1.3f, boost ? -50.0f : r % 2 ? 0.5f : 0.0f,
                                  r % 5 == 1 ? 0.25f : 0.0f, c.n_pen, 0, -1, tops[r % 4]};
        if (r % 4 == 1) e.pen_src = (r * 5 + 1) % PEN_PREV; /* an id in flight ends the history */
        if (boost && e.n_top == 0) e.n_top = 3;
        const bool pf = e.presence_penalty != 0.0f || e.frequency_penalty != 0.0f;
        const int want = boost ? 1 : (r * 13) % 49;
        for (int j = 0; j < want; j++) {
            int id = (int)(tb_rand_u64() % (uint64_t)V);
            if (mark[id]) continue;
            mark[id] = 1;
            tm_cuda_sample_pen pe = {id, pf ? 1 + (int)(tb_rand_u64() % 3) : 0,
                                     e.repeat_penalty != 1.0f && (tb_rand_u64() & 1)};
            if (pe.count == 0 && !pe.in_window) pe.in_window = e.repeat_penalty != 1.0f;
            c.pen[c.n_pen++] = pe;
            e.pen_n++;
        }
        if (e.pen_src >= 0) /* half the time an id among the entries, else a fresh one (may still collide) */
            c.prev[e.pen_src] = e.pen_src % 2 && e.pen_n > 0 ? c.pen[e.pen_first + (r % e.pen_n)].id
                                                             : (int32_t)(tb_rand_u64() % (uint64_t)V);
        for (int j = e.pen_first; j < c.n_pen; j++) mark[c.pen[j].id] = 0;
        c.hx[r] = e;
        c.hp[r] = (tm_cuda_sample_params){0.0f, 1.0f, 0.0f, 0, (uint64_t)r, 0};
    }
    free(mark);
    c.d_x = tb_upload(c.x, n * sizeof(float));
    c.d_raw = tb_dev((size_t)(c.n_pen > 0 ? c.n_pen : 1) * sizeof(float));
    c.d_p = tb_upload(c.hp, rows * sizeof *c.hp);
    c.d_xp = tb_upload(c.hx, rows * sizeof *c.hx);
    c.d_pen = tb_upload(c.pen, (size_t)(c.n_pen > 0 ? c.n_pen : 1) * sizeof *c.pen);
    c.d_ids = tb_dev(rows * sizeof(int32_t));
    c.d_lp = tb_dev(rows * sizeof(tm_cuda_sample_lp));
    c.d_work = tb_dev(tm_cuda_sample_work_bytes(rows, V));
    c.d_prev = tb_upload(c.prev, sizeof c.prev);
    return c;
}

static void pen_free(pen_case *c) {
    free(c->x);
    free(c->hp);
    free(c->hx);
    free(c->pen);
    cudaFree(c->d_x);
    cudaFree(c->d_raw);
    cudaFree(c->d_p);
    cudaFree(c->d_xp);
    cudaFree(c->d_pen);
    cudaFree(c->d_ids);
    cudaFree(c->d_lp);
    cudaFree(c->d_work);
    cudaFree(c->d_prev);
}

static void pen_run(void *p) { /* what the backend's sample op queues */
    pen_case *c = p;
    TB_CHECK(tm_cuda_sample_prepare(c->d_x, c->rows, c->V, c->d_xp, c->d_pen, c->n_pen, c->d_raw, true, c->d_prev,
                                    true, c->d_work, c->d_lp, 0));
    TB_CHECK(tm_cuda_sample(c->d_x, c->rows, c->V, c->d_p, NULL, c->d_ids, NULL, 0));
    TB_CHECK(tm_cuda_sample_finish(c->d_x, c->rows, c->V, c->d_xp, c->d_pen, c->d_raw, c->d_ids, c->d_work, c->d_lp,
                                   0));
}

/* against the host sampler's operations: the penalised logits bit for bit (tm_sampler_pen_apply), the greedy id of
 * them, the top ids exactly (by logit, ties to the lower id) and every logprob (of the logits before penalties)
 * within 1e-4 (float sums on the device). cluster: TM_CUDA_LOGPROBS_CLUSTER, or NULL for the launcher's choice. */
static void check_pen_logprobs(int rows, int V, bool ties, const char *cluster) {
    pen_case c = pen_make(rows, V, ties);
    size_t n = (size_t)rows * V;
    if (cluster) setenv("TM_CUDA_LOGPROBS_CLUSTER", cluster, 1);
    tb_poison(c.d_ids, rows * sizeof(int32_t));
    tb_poison(c.d_lp, rows * sizeof(tm_cuda_sample_lp));
    tb_poison(c.d_work, tm_cuda_sample_work_bytes(rows, V));
    pen_run(&c);
    TB_CHECK(cudaDeviceSynchronize());
    unsetenv("TM_CUDA_LOGPROBS_CLUSTER");
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    int32_t *ids = malloc(rows * sizeof(int32_t));
    tm_cuda_sample_lp *lp = malloc(rows * sizeof *lp);
    tb_download(got, c.d_x, n * sizeof(float));
    tb_download(ids, c.d_ids, rows * sizeof(int32_t));
    tb_download(lp, c.d_lp, rows * sizeof *lp);
    memcpy(want, c.x, n * sizeof(float));
    int bad = 0, boosted = 0, merged = 0;
    double lp_err = 0.0;
    int *ord = malloc((size_t)V * sizeof(int));
    tm_sample_pen *ent = malloc(((size_t)c.n_pen + 1) * sizeof *ent);
    for (int r = 0; r < rows; r++) {
        const tm_cuda_sample_extra *e = &c.hx[r];
        const float *xr = c.x + (size_t)r * V;
        float *wr = want + (size_t)r * V;
        tm_sampling_params sp = {.repeat_penalty = e->repeat_penalty, .presence_penalty = e->presence_penalty,
                                 .frequency_penalty = e->frequency_penalty};
        size_t ne = (size_t)e->pen_n;
        memcpy(ent, c.pen + e->pen_first, ne * sizeof *ent);
        if (e->pen_src >= 0) { /* the id in flight, merged as backend.h describes */
            ne = tm_sampler_pen_merge(&sp, ent, ne, c.prev[e->pen_src]);
            merged++;
        }
        tm_sampler_pen_apply(&sp, wr, ent, ne);
        bad += memcmp(wr, got + (size_t)r * V, (size_t)V * sizeof(float)) != 0;
        const int id = ref_argmax(wr, V);
        bad += ids[r] != id;
        if (e->n_top <= 0) continue;
        boosted += e->presence_penalty < -1.0f && wr[id] != xr[id];
        lp_err = fmax(lp_err, fabs(lp[r].chosen - ref_logprob(xr, V, id)));
        for (int i = 0; i < V; i++) ord[i] = i;
        g_sort_x = xr;
        qsort(ord, V, sizeof(int), cmp_desc);
        for (int t = 0; t < e->n_top; t++) {
            if (t >= V) {
                bad += lp[r].top_id[t] != -1;
                continue;
            }
            bad += lp[r].top_id[t] != ord[t];
            lp_err = fmax(lp_err, fabs(lp[r].top_lp[t] - ref_logprob(xr, V, ord[t])));
        }
    }
    if (rows >= 7) bad += boosted == 0 || merged == 0; /* the raw-value and in-flight paths were taken */
    char name[80];
    snprintf(name, sizeof name, "pen+logprobs%s%s rows=%d V=%d%s", cluster ? " blocks=" : "", cluster ? cluster : "",
             rows, V, ties ? " ties" : "");
    tb_result("sample", name, bad ? 1.0 : lp_err, 1e-4, 0, 0, 0, 'm');
    free(ord);
    free(ent);
    free(got);
    free(want);
    free(ids);
    free(lp);
    pen_free(&c);
}

static void time_pen(int rows, int V) {
    pen_case c = pen_make(rows, V, false);
    double us = tb_time_us(pen_run, &c, 3, 50);
    char name[80];
    snprintf(name, sizeof name, "pen+logprobs+greedy rows=%d V=%d", rows, V);
    tb_result("sample", name, 0, 0, us, 4.0 * rows * V, 0, 'm');
    pen_free(&c);
}

/* ---- timing ---- */

static void time_sample(const char *label, int rows, int V, tm_cuda_sample_params p, int version, bool argmax) {
    size_t n = (size_t)rows * V;
    float *x = malloc(n * sizeof(float));
    const bool flat = strstr(label, "flat") != NULL; /* a top-p set far beyond the shared-memory list */
    for (size_t i = 0; i < n; i++)
        x[i] = flat ? 0.05f * tb_uniform() : 3.0f * tb_uniform() + (i % 97 == 0 ? 8.0f : 0.0f);
    tm_cuda_sample_params *hp = malloc(rows * sizeof *hp);
    for (int r = 0; r < rows; r++) hp[r] = p, hp[r].offset = (uint64_t)r;
    sample_arg a = make_arg(x, rows, V);
    TB_CHECK(cudaMemcpy(a.params, hp, rows * sizeof *hp, cudaMemcpyHostToDevice));
    set_version(version);
    if (argmax && version > 20) {
        char cl[16];
        snprintf(cl, sizeof cl, "%d", version - 20);
        setenv("TM_CUDA_ARGMAX_CLUSTER", cl, 1);
    }
    double us = tb_time_us(argmax ? run_argmax : run_sample, &a, 3, version == 1 ? 5 : 50);
    unsetenv("TM_CUDA_ARGMAX_CLUSTER");
    set_version(2);
    char name[96];
    snprintf(name, sizeof name, "%s%d %s rows=%d V=%d", version > 20 ? "blocks=" : "v",
             version > 20 ? version - 20 : version, label, rows, V);
    tb_result(argmax ? "argmax" : "sample", name, 0, 0, us, 4.0 * n, 0, 'm');
    free_arg(&a);
    free(x);
    free(hp);
}

int main(void) {
    tb_seed();
    check_argmax(1, 128256, false);
    check_argmax(7, 32000, false);
    check_argmax(3, 50, true);
    check_argmax(5, 257, true);
    check_argmax(4, 262144, false);
    check_edges();
    check_greedy(64, 128256);
    check_greedy(16, 1001);
    check_exact(96, 128256, LOGITS_NORMAL, "normal");
    check_exact(48, 32003, LOGITS_NORMAL, "normal-odd-V");
    check_exact(24, 128256, LOGITS_FLAT, "flat");
    check_exact(48, 4000, LOGITS_TIES, "ties");
    stats_suite();
    check_pen_logprobs(1, 128256, false, NULL);
    check_pen_logprobs(3, 128256, false, "8");
    check_pen_logprobs(64, 128256, false, NULL);
    check_pen_logprobs(200, 32003, false, NULL);
    check_pen_logprobs(29, 4000, true, "2");
    check_pen_logprobs(29, 4000, true, "1");
    check_pen_logprobs(9, 17, false, NULL);

    if (getenv("TB_CHECK_ONLY")) return tb_finish("tb_sample"); /* correctness only, no timing */
    const tm_cuda_sample_params typical = {0.7f, 0.9f, 0.05f, 40, 1, 0};
    const tm_cuda_sample_params nucleus = {1.0f, 0.95f, 0.0f, 0, 1, 0};
    const tm_cuda_sample_params greedy = {0.0f, 1.0f, 0.0f, 0, 1, 0};
    time_sample("argmax", 1, 128256, greedy, 2, true);
    time_sample("argmax", 1, 128256, greedy, 21, true);
    time_sample("argmax", 256, 128256, greedy, 2, true);
    time_sample("greedy", 1, 128256, greedy, 2, false);
    time_sample("T=0.7 k=40 p=0.9 min_p=0.05", 1, 128256, typical, 2, false);
    time_sample("T=1 p=0.95", 1, 128256, nucleus, 2, false);
    time_sample("T=0.7 k=40 p=0.9 min_p=0.05", 1, 128256, typical, 21, false);
    time_sample("T=1 p=0.95", 1, 128256, nucleus, 21, false);
    time_sample("T=1 p=0.95 flat", 1, 128256, nucleus, 2, false);
    time_sample("T=0.7 k=40 p=0.9 min_p=0.05", 16, 128256, typical, 2, false);
    time_sample("T=0.7 k=40 p=0.9 min_p=0.05", 256, 128256, typical, 2, false);
    time_sample("T=1 p=0.95", 256, 128256, nucleus, 2, false);
    time_sample("T=0.7 k=40 p=0.9 min_p=0.05", 1024, 128256, typical, 2, false);
    time_sample("T=0.7 k=40 p=0.9 min_p=0.05", 1, 128256, typical, 1, false);
    time_pen(1, 128256);
    time_pen(64, 128256);
    return tb_finish("tb_sample");
}
