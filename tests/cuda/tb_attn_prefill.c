/* tb_attn_prefill.c -- test bed of the paged prefill FlashAttention (v1, v2, v3, default v5 / v5p) against a double
 * reference, and timings. */
/* TB_PREFILL_ONLY=5: only v5 and v5p (their checks and timings, with each switch, and over the step's keys as token
 * rows: fresh sequences, bf16 and fp8 caches) and stop. TB_PREFILL_QUICK=1: v5's and v5p's checks, the spike checks
 * and a few timings only (an A/B of builds in one device call). TB_PREFILL_SWEEP=1: v5p bit for bit against v5, then
 * v5, v5p and the launcher's choice timed twice over the batch. TB_PREFILL_PROFILE=<sweep shape>: that shape three
 * times, unchecked (for ncu). */
#include "backend/cuda/tm_cuda_kernels.h"
#include "tb_common.h"
#include "core/tm_fp8.h"

/* One ragged batch over a paged cache: per sequence (query length, context length), optionally sharing its first
 * blocks with an earlier sequence (a cached prefix). Cache slots that no sequence owns hold NaN, so a kernel that
 * reads past a sequence's context (or through an unused block-table entry) fails. */
#define TB_MAX_SEQS 80

typedef struct tb_seq {
    int32_t q_len, ctx;
    int32_t share_with, share_blocks; /* first share_blocks blocks are those of sequence share_with (-1: none) */
} tb_seq;

typedef struct tb_shape {
    const char *name;
    int32_t n_heads, n_kv_heads, head_dim, block_size;
    int32_t n_seqs;
    tb_seq seqs[TB_MAX_SEQS];
} tb_shape;

typedef struct tb_prob {
    const tb_shape *sh;
    int32_t n_tokens, n_blocks, max_blocks, max_q, max_ctx;
    int32_t *seq_index;   /* (n_tokens) host */
    int32_t *query_start; /* (n_seqs + 1) */
    int32_t *context_len; /* (n_seqs) */
    int32_t *block_table; /* (n_seqs, max_blocks), unused entries -1 */
    float *qf;            /* (n_tokens, n_heads * hd) exact bf16 values */
    float *kf, *vf;       /* (n_blocks, n_kv_heads, block_size, hd) exact bf16 values (NaN where unowned) */
    uint16_t *out_h;      /* (n_tokens, n_heads * hd) */
    tm_cuda_attn_args a;  /* device pointers */
    uint16_t *rows_dev;   /* g_rows: (n_tokens, (n_heads + 2 n_kv_heads) hd) q | k | v rows (k_rows, v_rows) */
    double flops, bytes;
} tb_prob;

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

/* true: problems are made with an fp8 e4m3 cache (the bf16 values rounded; kf, vf hold the rounded values) */
static bool g_fp8;
/* true: problems whose sequences are all fresh (q_len == ctx) also get the keys as rows of the step's tokens (as
 * the fused q|k|v product lays them out), and their cache is poisoned: the kernel must read the rows */
static bool g_rows;
/* every 97th key of a sequence 40x larger (uniform in +-60): rows whose scores jump far past their running max in a
 * late tile, which v5's fastmax rounds must catch and redo */
static bool g_spike;

/* like tb_fill_bf16 with unit-variance uniform values: the large timed shapes need ~10^8 of them */
static void fill_bf16_u(uint16_t *h, float *ref, size_t n, float scale) {
    const float k = 1.7320508f * scale;
    for (size_t i = 0; i < n; i++) {
        h[i] = tb_f32_to_bf16(k * tb_uniform());
        if (ref) ref[i] = tb_bf16_to_f32(h[i]);
    }
}

static void prob_make(tb_prob *p, const tb_shape *sh) {
    memset(p, 0, sizeof *p);
    p->sh = sh;
    const int32_t ns = sh->n_seqs, hd = sh->head_dim, bs = sh->block_size, nkv = sh->n_kv_heads;
    p->query_start = calloc((size_t)ns + 1, sizeof(int32_t));
    p->context_len = calloc((size_t)ns, sizeof(int32_t));
    int32_t own_blocks = 0;
    for (int32_t s = 0; s < ns; s++) {
        const tb_seq *q = &sh->seqs[s];
        if (q->q_len < 1 || q->ctx < q->q_len) {
            fprintf(stderr, "bad shape %s seq %d\n", sh->name, s);
            exit(2);
        }
        p->query_start[s + 1] = p->query_start[s] + q->q_len;
        p->context_len[s] = q->ctx;
        if (q->q_len > p->max_q) p->max_q = q->q_len;
        if (q->ctx > p->max_ctx) p->max_ctx = q->ctx;
        int32_t nb = cdiv(q->ctx, bs);
        if (nb > p->max_blocks) p->max_blocks = nb;
        own_blocks += nb - (q->share_with >= 0 ? q->share_blocks : 0);
    }
    p->n_tokens = p->query_start[ns];
    p->max_blocks += 2;                 /* room for unused (-1) entries */
    p->n_blocks = own_blocks + 5;       /* some blocks nobody owns */

    /* physical block ids in shuffled order */
    int32_t *perm = malloc((size_t)p->n_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < p->n_blocks; i++) perm[i] = i;
    for (int32_t i = p->n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(tb_rand_u64() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    p->block_table = malloc((size_t)ns * (size_t)p->max_blocks * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)ns * (size_t)p->max_blocks; i++) p->block_table[i] = -1;
    int32_t next = 0;
    for (int32_t s = 0; s < ns; s++) {
        const tb_seq *q = &sh->seqs[s];
        int32_t *row = p->block_table + (size_t)s * (size_t)p->max_blocks;
        int32_t nb = cdiv(q->ctx, bs), j = 0;
        if (q->share_with >= 0) {
            const tb_seq *o = &sh->seqs[q->share_with];
            if (q->share_with >= s || q->share_blocks * bs > o->ctx || q->share_blocks * bs > q->ctx) {
                fprintf(stderr, "bad sharing in %s seq %d\n", sh->name, s);
                exit(2);
            }
            for (; j < q->share_blocks; j++) row[j] = p->block_table[(size_t)q->share_with * (size_t)p->max_blocks + (size_t)j];
        }
        for (; j < nb; j++) row[j] = perm[next++];
    }

    /* cache: NaN everywhere, then random values in the slots below some owner's context */
    const size_t per_block = (size_t)nkv * (size_t)bs * (size_t)hd, cache_n = (size_t)p->n_blocks * per_block;
    uint16_t *kh = malloc(cache_n * sizeof(uint16_t)), *vh = malloc(cache_n * sizeof(uint16_t));
    p->kf = malloc(cache_n * sizeof(float));
    p->vf = malloc(cache_n * sizeof(float));
    for (size_t i = 0; i < cache_n; i++) {
        kh[i] = vh[i] = 0x7fc0;
        p->kf[i] = p->vf[i] = NAN;
    }
    for (int32_t s = 0; s < ns; s++) {
        const tb_seq *q = &sh->seqs[s];
        const int32_t *row = p->block_table + (size_t)s * (size_t)p->max_blocks;
        int32_t first = q->share_with >= 0 ? q->share_blocks * bs : 0; /* shared slots were filled by their owner */
        for (int32_t c = first; c < q->ctx; c++)
            for (int32_t h = 0; h < nkv; h++) {
                size_t off = (size_t)row[c / bs] * per_block + ((size_t)h * (size_t)bs + (size_t)(c % bs)) * (size_t)hd;
                fill_bf16_u(kh + off, p->kf + off, (size_t)hd, g_spike && c % 97 == 5 ? 60.0f : 1.5f);
                fill_bf16_u(vh + off, p->vf + off, (size_t)hd, 1.0f);
            }
    }

    const size_t qn = (size_t)p->n_tokens * (size_t)sh->n_heads * (size_t)hd;
    uint16_t *qh = malloc(qn * sizeof(uint16_t));
    p->qf = malloc(qn * sizeof(float));
    fill_bf16_u(qh, p->qf, qn, 1.0f);
    p->out_h = malloc(qn * sizeof(uint16_t));

    p->seq_index = malloc((size_t)p->n_tokens * sizeof(int32_t));
    for (int32_t s = 0; s < ns; s++)
        for (int32_t i = p->query_start[s]; i < p->query_start[s + 1]; i++) p->seq_index[i] = s;

    /* minimum work and traffic: 4 * hd FLOPs per (token, head, visible key); q read, out written, each owned
     * cache entry of K and V read once */
    double keys = 0.0, cache_entries = 0.0;
    for (int32_t s = 0; s < ns; s++) {
        const tb_seq *q = &sh->seqs[s];
        for (int32_t t = 0; t < q->q_len; t++) keys += (double)(q->ctx - q->q_len + t + 1);
        cache_entries += (double)(q->ctx - (q->share_with >= 0 ? q->share_blocks * bs : 0));
    }
    p->flops = 4.0 * hd * sh->n_heads * keys;
    p->bytes = 2.0 * (double)qn * 2.0 + cache_entries * 2.0 * nkv * hd * (g_fp8 ? 1.0 : 2.0);

    tm_cuda_attn_args *a = &p->a;
    a->n_heads = sh->n_heads;
    a->n_kv_heads = nkv;
    a->head_dim = hd;
    a->block_size = bs;
    a->scale = 1.0f / sqrtf((float)hd);
    a->n_tokens = p->n_tokens;
    a->n_seqs = ns;
    a->max_blocks = p->max_blocks;
    a->seq_index = tb_upload(p->seq_index, (size_t)p->n_tokens * sizeof(int32_t));
    a->query_start = tb_upload(p->query_start, ((size_t)ns + 1) * sizeof(int32_t));
    a->context_len = tb_upload(p->context_len, (size_t)ns * sizeof(int32_t));
    a->block_table = tb_upload(p->block_table, (size_t)ns * (size_t)p->max_blocks * sizeof(int32_t));
    a->max_query_len = p->max_q;
    a->max_context_len = p->max_ctx;
    a->q = tb_upload(qh, qn * sizeof(uint16_t));
    if (g_fp8) { /* NaN (unowned slots) stays NaN: 0x7f */
        uint8_t *k8 = malloc(cache_n), *v8 = malloc(cache_n);
        for (size_t i = 0; i < cache_n; i++) {
            k8[i] = tm_fp8_from_f32(p->kf[i]);
            v8[i] = tm_fp8_from_f32(p->vf[i]);
            p->kf[i] = tm_fp8_to_f32(k8[i]);
            p->vf[i] = tm_fp8_to_f32(v8[i]);
        }
        a->k_cache = tb_upload(k8, cache_n);
        a->v_cache = tb_upload(v8, cache_n);
        a->kv_fp8 = true;
        free(k8);
        free(v8);
    } else {
        a->k_cache = tb_upload(kh, cache_n * sizeof(uint16_t));
        a->v_cache = tb_upload(vh, cache_n * sizeof(uint16_t));
    }
    bool fresh = g_rows;
    for (int32_t s = 0; s < ns; s++) fresh = fresh && sh->seqs[s].q_len == sh->seqs[s].ctx && sh->seqs[s].share_with < 0;
    if (fresh) {
        const int32_t ld = (sh->n_heads + 2 * nkv) * hd;
        const size_t rn = (size_t)p->n_tokens * (size_t)ld;
        uint16_t *rh = malloc(rn * sizeof(uint16_t));
        for (size_t i = 0; i < rn; i++) rh[i] = 0x7fc0; /* NaN: q's columns and anything not a key */
        for (int32_t s = 0; s < ns; s++) {
            const int32_t *row = p->block_table + (size_t)s * (size_t)p->max_blocks;
            for (int32_t c = 0; c < sh->seqs[s].ctx; c++)
                for (int32_t h = 0; h < nkv; h++) {
                    const size_t src = (size_t)row[c / bs] * per_block + ((size_t)h * (size_t)bs + (size_t)(c % bs)) * (size_t)hd;
                    uint16_t *dst = rh + (size_t)(p->query_start[s] + c) * (size_t)ld + (size_t)sh->n_heads * (size_t)hd +
                                    (size_t)h * (size_t)hd;
                    for (int32_t x = 0; x < hd; x++) { /* kf, vf hold exact bf16 (or e4m3) values */
                        dst[x] = tb_f32_to_bf16(p->kf[src + (size_t)x]);
                        dst[(size_t)nkv * (size_t)hd + (size_t)x] = tb_f32_to_bf16(p->vf[src + (size_t)x]);
                    }
                }
        }
        p->rows_dev = tb_upload(rh, rn * sizeof(uint16_t));
        free(rh);
        a->k_rows = p->rows_dev + (size_t)sh->n_heads * (size_t)hd;
        a->v_rows = a->k_rows + (size_t)nkv * (size_t)hd;
        a->kv_row_stride = ld;
        const size_t cache_bytes = cache_n * (g_fp8 ? 1 : sizeof(uint16_t));
        tb_poison((void *)a->k_cache, cache_bytes);
        tb_poison((void *)a->v_cache, cache_bytes);
    }
    a->out = tb_dev(qn * sizeof(uint16_t));
    a->work_bytes = tm_cuda_attn_prefill_work_bytes(p->n_tokens, sh->n_heads, hd);
    a->work = a->work_bytes ? tb_dev(a->work_bytes) : NULL;
    free(perm);
    free(kh);
    free(vh);
    free(qh);
}

static void prob_free(tb_prob *p) {
    TB_CHECK(cudaFree((void *)p->a.seq_index));
    TB_CHECK(cudaFree((void *)p->a.query_start));
    TB_CHECK(cudaFree((void *)p->a.context_len));
    TB_CHECK(cudaFree((void *)p->a.block_table));
    TB_CHECK(cudaFree((void *)p->a.q));
    TB_CHECK(cudaFree((void *)p->a.k_cache));
    TB_CHECK(cudaFree((void *)p->a.v_cache));
    TB_CHECK(cudaFree(p->a.out));
    if (p->a.work) TB_CHECK(cudaFree(p->a.work));
    if (p->rows_dev) TB_CHECK(cudaFree(p->rows_dev));
    free(p->seq_index);
    free(p->query_start);
    free(p->context_len);
    free(p->block_table);
    free(p->qf);
    free(p->kf);
    free(p->vf);
    free(p->out_h);
}

/* reference row: out (hd) = softmax(scale * q·K[0..lim]) V, in double over the bf16 inputs */
static void ref_row(const tb_prob *p, int32_t i, int32_t h, double *sc, float *out) {
    const tb_shape *sh = p->sh;
    const int32_t hd = sh->head_dim, bs = sh->block_size, s = p->seq_index[i];
    const int32_t kvh = h / (sh->n_heads / sh->n_kv_heads);
    const int32_t lim = p->context_len[s] - (p->query_start[s + 1] - i);
    const int32_t *row = p->block_table + (size_t)s * (size_t)p->max_blocks;
    const size_t per_block = (size_t)sh->n_kv_heads * (size_t)bs * (size_t)hd;
    const float *q = p->qf + ((size_t)i * (size_t)sh->n_heads + (size_t)h) * (size_t)hd;
    double mx = -INFINITY;
    for (int32_t c = 0; c <= lim; c++) {
        const float *k = p->kf + (size_t)row[c / bs] * per_block + ((size_t)kvh * (size_t)bs + (size_t)(c % bs)) * (size_t)hd;
        double d = 0.0;
        for (int32_t x = 0; x < hd; x++) d += (double)q[x] * (double)k[x];
        sc[c] = d * (double)p->a.scale;
        if (sc[c] > mx) mx = sc[c];
    }
    double sum = 0.0, acc[256];
    for (int32_t x = 0; x < hd; x++) acc[x] = 0.0;
    for (int32_t c = 0; c <= lim; c++) {
        const double e = exp(sc[c] - mx);
        sum += e;
        const float *v = p->vf + (size_t)row[c / bs] * per_block + ((size_t)kvh * (size_t)bs + (size_t)(c % bs)) * (size_t)hd;
        for (int32_t x = 0; x < hd; x++) acc[x] += e * (double)v[x];
    }
    for (int32_t x = 0; x < hd; x++) out[x] = (float)(acc[x] / sum);
}

/* A set of (token, head) rows to check and their reference values. */
typedef struct tb_rows {
    int32_t n;
    int32_t *tok, *head; /* (n) */
    float *ref;          /* (n, hd) */
} tb_rows;

/* all rows when n_sample <= 0, else the first and last token of every sequence plus random ones */
static void rows_make(tb_rows *r, const tb_prob *p, int32_t n_sample) {
    const tb_shape *sh = p->sh;
    const int32_t hd = sh->head_dim, nh = sh->n_heads;
    int32_t cap = n_sample > 0 ? n_sample + 2 * sh->n_seqs : p->n_tokens * nh;
    r->tok = malloc((size_t)cap * sizeof(int32_t));
    r->head = malloc((size_t)cap * sizeof(int32_t));
    r->n = 0;
    if (n_sample <= 0) {
        for (int32_t i = 0; i < p->n_tokens; i++)
            for (int32_t h = 0; h < nh; h++) {
                r->tok[r->n] = i;
                r->head[r->n++] = h;
            }
    } else {
        for (int32_t s = 0; s < sh->n_seqs; s++) {
            r->tok[r->n] = p->query_start[s];
            r->head[r->n++] = (int32_t)(tb_rand_u64() % (uint64_t)nh);
            r->tok[r->n] = p->query_start[s + 1] - 1;
            r->head[r->n++] = (int32_t)(tb_rand_u64() % (uint64_t)nh);
        }
        for (int32_t k = 0; k < n_sample; k++) {
            r->tok[r->n] = (int32_t)(tb_rand_u64() % (uint64_t)p->n_tokens);
            r->head[r->n++] = (int32_t)(tb_rand_u64() % (uint64_t)nh);
        }
    }
    r->ref = malloc((size_t)r->n * (size_t)hd * sizeof(float));
    double *sc = malloc((size_t)p->max_ctx * sizeof(double));
    for (int32_t k = 0; k < r->n; k++) ref_row(p, r->tok[k], r->head[k], sc, r->ref + (size_t)k * (size_t)hd);
    free(sc);
}

static void rows_free(tb_rows *r) {
    free(r->tok);
    free(r->head);
    free(r->ref);
}

/* version codes: 1, 2, 3, 5 force that kernel, 0 the launcher's default (variable unset), 50 v5 with 64-key tiles */
#define V_DEFAULT 0
#define V5_BN64 50
static void set_version(int v) {
    unsetenv("TM_CUDA_ATTN_PREFILL_BN");
    if (v == V_DEFAULT) {
        unsetenv("TM_CUDA_ATTN_PREFILL_V");
        return;
    }
    setenv("TM_CUDA_ATTN_PREFILL_V", v == 1 ? "1" : v == 2 ? "2" : v == 3 ? "3" : "5", 1);
    if (v == V5_BN64) setenv("TM_CUDA_ATTN_PREFILL_BN", "64", 1);
}

static void version_name(char *buf, size_t n, const char *shape, int v) {
    const char *lz = getenv("TM_CUDA_ATTN_PREFILL_LAZY"), *rg = getenv("TM_CUDA_V5_ROWG"), *ip = getenv("TM_CUDA_V5_IDPRE");
    const char *fm = getenv("TM_CUDA_V5_FASTMAX");
    const char *f = g_rows && g_fp8             ? "_rows_fp8"
                    : g_rows                   ? "_rows"
                    : g_fp8                    ? "_fp8"
                    : lz && strcmp(lz, "0") == 0 ? "_lazy0"
                    : rg && strcmp(rg, "0") == 0 ? "_rowg0"
                    : ip && strcmp(ip, "0") == 0 ? "_idpre0"
                                                 : "";
    const char *pe = getenv("TM_CUDA_PREFILL_PERSIST");
    const char *pp = pe && strcmp(pe, "1") == 0 ? "_persist" : pe && strcmp(pe, "0") == 0 ? "_nopersist" : "";
    char suf[64];
    const char *fm0 = fm && strcmp(fm, "0") == 0 ? "_fastmax0" : "";
    snprintf(suf, sizeof suf, "%s%s%s%s", f, fm0, g_spike ? "_spike" : "", pp);
    if (v == V_DEFAULT) snprintf(buf, n, "%s%s_vdef", shape, suf);
    else if (v == V5_BN64) snprintf(buf, n, "%s%s_v5bn64", shape, suf);
    else snprintf(buf, n, "%s%s_v%d", shape, suf, v);
}

/* run once on a poisoned output, download, relative error over the rows */
static double run_check(tb_prob *p, const tb_rows *r, int v) {
    const tb_shape *sh = p->sh;
    const int32_t hd = sh->head_dim;
    const size_t qn = (size_t)p->n_tokens * (size_t)sh->n_heads * (size_t)hd;
    set_version(v);
    tb_poison(p->a.out, qn * sizeof(uint16_t));
    TB_RUN(tm_cuda_attn_prefill(&p->a, 0));
    tb_download(p->out_h, p->a.out, qn * sizeof(uint16_t));
    uint16_t *got = malloc((size_t)r->n * (size_t)hd * sizeof(uint16_t));
    for (int32_t k = 0; k < r->n; k++)
        memcpy(got + (size_t)k * (size_t)hd,
               p->out_h + ((size_t)r->tok[k] * (size_t)sh->n_heads + (size_t)r->head[k]) * (size_t)hd,
               (size_t)hd * sizeof(uint16_t));
    double e = tb_rel_err_bf16(got, r->ref, (size_t)r->n * (size_t)hd);
    free(got);
    /* every element of the output must have been written (poison is NaN), sampled or not */
    for (size_t i = 0; i < qn; i++)
        if (!isfinite(tb_bf16_to_f32(p->out_h[i]))) return INFINITY;
    return e;
}

static void fn_run(void *arg) {
    tb_prob *p = arg;
    TB_CHECK(tm_cuda_attn_prefill(&p->a, 0));
}

#define TOL 1e-2
#define S1(q, c) {q, c, -1, 0}

/* correctness shapes: fresh prompts, chunks on top of context, decode tokens (q_len 1), shared prefixes, lengths
 * that are no multiple of the tile or block, GQA 1/3/4/8 and a group wider than a tile, head_dim 64/128 (v2) and
 * 96 (v1 path), block sizes 8..128 */
static const tb_shape check_shapes[] = {
    {"smol_gqa3_hd64_bs16", 9, 3, 64, 16, 6,
     {S1(77, 77), S1(1, 129), S1(50, 300), S1(1, 1), {133, 160, 0, 4}, S1(200, 1000)}},
    {"gqa4_hd128_bs16", 32, 8, 128, 16, 7,
     {S1(300, 300), S1(1, 517), S1(64, 64), S1(1, 1), S1(129, 700), S1(17, 33), {1, 301, 0, 18}}},
    {"mha_hd128_bs32", 8, 8, 128, 32, 4, {S1(200, 200), S1(1, 64), S1(190, 450), S1(1, 2)}},
    {"gqa8_hd64_bs8", 16, 2, 64, 8, 4, {S1(255, 255), S1(1, 100), S1(100, 356), S1(3, 3)}},
    {"gqa8_hd128_bs64", 32, 4, 128, 64, 4, {S1(130, 130), S1(1, 1000), S1(65, 129), S1(1, 65)}},
    {"gqa4_hd128_bs128", 16, 4, 128, 128, 3, {S1(300, 700), S1(1, 300), {40, 296, 0, 2}}},
    {"decode_only_gqa4_hd128", 32, 8, 128, 16, 6, {S1(1, 1), S1(1, 17), S1(1, 64), S1(1, 65), S1(1, 300), S1(1, 1023)}},
    {"mqa136_hd64_bs16", 136, 1, 64, 16, 3, {S1(5, 5), S1(1, 20), S1(3, 40)}},
    {"gqa2_hd96_bs16_v1path", 8, 4, 96, 16, 3, {S1(70, 70), S1(1, 90), S1(33, 200)}},
    /* every sequence fresh (g_rows gives them their keys as token rows) */
    {"fresh_gqa4_hd128_bs16", 32, 8, 128, 16, 4, {S1(300, 300), S1(64, 64), S1(1, 1), S1(129, 129)}},
    {"fresh_gqa3_hd64_bs16", 9, 3, 64, 16, 3, {S1(77, 77), S1(200, 200), S1(5, 5)}},
    {"fresh_mha_hd128_bs8", 8, 8, 128, 8, 2, {S1(200, 200), S1(33, 33)}},
};

/* timed shapes (v2, v3, v5 with either key tile; the first also with v1): Llama-3-8B and Llama-3.2-1B geometry */
static tb_shape time_shapes[] = {
    {"8b_prefill_4096", 32, 8, 128, 16, 1, {S1(4096, 4096)}},
    {"8b_prefill_4096_b4", 32, 8, 128, 16, 4, {S1(4096, 4096), S1(4096, 4096), S1(4096, 4096), S1(4096, 4096)}},
    {"1b_prefill_4096", 32, 8, 64, 16, 1, {S1(4096, 4096)}},
    {"8b_chunk_512_ctx_4096", 32, 8, 128, 16, 1, {S1(512, 4096)}},
    {"1b_chunk_512_ctx_4096", 32, 8, 64, 16, 1, {S1(512, 4096)}},
    {"8b_mixed_64dec_1024chunk", 32, 8, 128, 16, 0, {{0}}}, /* filled in main */
};

/* TB_PREFILL_SWEEP=1: v5p against v5 over the batch (where the launcher's tiles-an-SM rule switches) */
static tb_shape sweep_shapes[] = {
    {"8b_prefill_4096", 32, 8, 128, 16, 1, {S1(4096, 4096)}},
    {"8b_prefill_4096_b2", 32, 8, 128, 16, 2, {S1(4096, 4096), S1(4096, 4096)}},
    {"8b_prefill_4096_b3", 32, 8, 128, 16, 3, {S1(4096, 4096), S1(4096, 4096), S1(4096, 4096)}},
    {"8b_prefill_4096_b4", 32, 8, 128, 16, 4, {S1(4096, 4096), S1(4096, 4096), S1(4096, 4096), S1(4096, 4096)}},
    {"8b_prefill_2048_b8", 32, 8, 128, 16, 8, {S1(2048, 2048), S1(2048, 2048), S1(2048, 2048), S1(2048, 2048),
                                               S1(2048, 2048), S1(2048, 2048), S1(2048, 2048), S1(2048, 2048)}},
    {"8b_prefill_1024_b8", 32, 8, 128, 16, 8, {S1(1024, 1024), S1(1024, 1024), S1(1024, 1024), S1(1024, 1024),
                                               S1(1024, 1024), S1(1024, 1024), S1(1024, 1024), S1(1024, 1024)}},
    {"8b_chunk_1024_ctx_4096_b4", 32, 8, 128, 16, 4, {S1(1024, 4096), S1(1024, 4096), S1(1024, 4096), S1(1024, 4096)}},
    {"8b_chunk_512_ctx_4096", 32, 8, 128, 16, 1, {S1(512, 4096)}},
};

/* correctness of the given versions on every check shape (one problem and one reference per shape) */
static void run_checks(const int *versions, int n_versions, bool wgmma_shapes_only) {
    for (size_t c = 0; c < sizeof check_shapes / sizeof check_shapes[0]; c++) {
        const tb_shape *sh = &check_shapes[c];
        if (wgmma_shapes_only && sh->head_dim != 64 && sh->head_dim != 128) continue;
        tb_prob p;
        prob_make(&p, sh);
        tb_rows r;
        rows_make(&r, &p, 0);
        for (int k = 0; k < n_versions; k++) {
            double e = run_check(&p, &r, versions[k]);
            char name[96];
            version_name(name, sizeof name, sh->name, versions[k]);
            tb_result("attn_prefill", name, e, TOL, 0.0, 0.0, 0.0, 'c');
        }
        rows_free(&r);
        prob_free(&p);
    }
}

/* v5p (TM_CUDA_PREFILL_PERSIST=1) against v5 on every head_dim-128 check shape, bit for bit: the same tiles, rounds
 * and products, only which CTA runs a tile and when differ */
static void persist_bitwise(void) {
    for (size_t c = 0; c < sizeof check_shapes / sizeof check_shapes[0]; c++) {
        const tb_shape *sh = &check_shapes[c];
        if (sh->head_dim != 128) continue;
        tb_prob p;
        prob_make(&p, sh);
        tb_rows r;
        rows_make(&r, &p, 0);
        const size_t qn = (size_t)p.n_tokens * (size_t)sh->n_heads * (size_t)sh->head_dim;
        uint16_t *ref = malloc(qn * sizeof(uint16_t));
        setenv("TM_CUDA_PREFILL_PERSIST", "0", 1);
        run_check(&p, &r, 5);
        memcpy(ref, p.out_h, qn * sizeof(uint16_t));
        setenv("TM_CUDA_PREFILL_PERSIST", "1", 1);
        run_check(&p, &r, 5);
        size_t diff = 0;
        for (size_t i = 0; i < qn; i++) diff += ref[i] != p.out_h[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s_persist_bitwise", sh->name, g_rows ? "_rows" : "");
        tb_result("attn_prefill", name, (double)diff, 0.0, 0.0, 0.0, 0.0, 'c');
        free(ref);
        rows_free(&r);
        prob_free(&p);
    }
    unsetenv("TM_CUDA_PREFILL_PERSIST");
}

/* timed shapes with version v (checked on sampled rows first); v1 only on the first shape (the issue's: 8B
 * geometry, 4096 tokens, causal) */
static void run_timing_on(const tb_shape *shapes, size_t n, int v) {
    for (size_t c = 0; c < n; c++) {
        if (v == 1 && c != 0) continue;
        tb_prob p;
        prob_make(&p, &shapes[c]);
        tb_rows r;
        rows_make(&r, &p, 48);
        double e = run_check(&p, &r, v);
        set_version(v);
        double us = tb_time_us(fn_run, &p, v == 1 ? 1 : 3, v == 1 ? 3 : 20);
        char name[96];
        version_name(name, sizeof name, shapes[c].name, v);
        tb_result("attn_prefill", name, e, TOL, us, p.bytes, p.flops, 'c');
        rows_free(&r);
        prob_free(&p);
    }
}

static void run_timing(int v) { run_timing_on(time_shapes, sizeof time_shapes / sizeof time_shapes[0], v); }

int main(void) {
    tb_seed();
    int dev = 0;
    TB_CHECK(cudaGetDevice(&dev));

    /* mixed step: 64 decode tokens at context 2048 and one 1024-token prefill chunk */
    tb_shape *mixed = &time_shapes[sizeof time_shapes / sizeof time_shapes[0] - 1];
    mixed->n_seqs = 65;
    for (int s = 0; s < 64; s++) mixed->seqs[s] = (tb_seq)S1(1, 2048);
    mixed->seqs[64] = (tb_seq)S1(1024, 1024);

    const char *prof = getenv("TB_PREFILL_PROFILE"); /* a sweep shape by name, run 3 times unchecked (for ncu) */
    for (size_t c = 0; prof && c < sizeof sweep_shapes / sizeof sweep_shapes[0]; c++) {
        if (strcmp(prof, sweep_shapes[c].name) != 0) continue;
        tb_prob p;
        prob_make(&p, &sweep_shapes[c]);
        set_version(V_DEFAULT);
        for (int i = 0; i < 3; i++) fn_run(&p);
        TB_CHECK(cudaDeviceSynchronize());
        prob_free(&p);
        return 0;
    }
    if (prof) {
        fprintf(stderr, "tb_attn_prefill: no sweep shape named %s\n", prof);
        return 1;
    }
    if (getenv("TB_PREFILL_SWEEP")) { /* v5p bit for bit against v5, then both timed twice over the batch */
        persist_bitwise();
        g_rows = true;
        persist_bitwise();
        g_rows = false;
        for (int rep = 0; rep < 2; rep++)
            for (int m = 0; m < 3; m++) {
                if (m == 2) unsetenv("TM_CUDA_PREFILL_PERSIST");
                else setenv("TM_CUDA_PREFILL_PERSIST", m ? "1" : "0", 1);
                run_timing_on(sweep_shapes, sizeof sweep_shapes / sizeof sweep_shapes[0], V_DEFAULT);
            }
        unsetenv("TM_CUDA_PREFILL_PERSIST");
        return tb_finish("tb_attn_prefill");
    }
    /* the default (v5: intra-warpgroup overlap, 128-key tiles for head_dim 128, 64 for 64), forced with either key
     * tile and as the launcher's default (variable unset) */
    const int v5[] = {5, V5_BN64, V_DEFAULT};
    run_checks(v5, 3, true);
    run_timing(5);
    /* v5p: v5 as a persistent kernel, checked against the reference (the spike cases too: fastmax's redo) and bit for
     * bit against v5, and timed */
    persist_bitwise();
    setenv("TM_CUDA_PREFILL_PERSIST", "1", 1);
    run_checks(v5, 3, true);
    g_spike = true;
    run_checks(v5, 1, true);
    g_spike = false;
    run_timing(5);
    g_rows = true;
    persist_bitwise();
    setenv("TM_CUDA_PREFILL_PERSIST", "1", 1);
    const int vdp[] = {V_DEFAULT};
    run_checks(vdp, 1, true);
    run_timing(V_DEFAULT);
    g_rows = false;
    unsetenv("TM_CUDA_PREFILL_PERSIST");
    if (getenv("TB_PREFILL_QUICK")) { /* an A/B of builds: the default's checks, the spike checks, one more timing */
        g_spike = true;
        run_checks(v5, 1, true);
        g_spike = false;
        run_timing(5);
        g_rows = true;
        run_timing(V_DEFAULT);
        g_rows = false;
        return tb_finish("tb_attn_prefill");
    }
    /* the running max moved on every growth (TM_CUDA_ATTN_PREFILL_LAZY=0) instead of past 2^8 */
    setenv("TM_CUDA_ATTN_PREFILL_LAZY", "0", 1);
    run_checks(v5, 1, true);
    run_timing(5);
    unsetenv("TM_CUDA_ATTN_PREFILL_LAZY");
    /* warpgroup 1's copies with the rows of a thread spread over the tile's blocks (one block id a row) */
    setenv("TM_CUDA_V5_ROWG", "0", 1);
    run_checks(v5, 1, true);
    run_timing(5);
    unsetenv("TM_CUDA_V5_ROWG");
    /* that block id loaded when the copies go out instead of one tile ahead */
    setenv("TM_CUDA_V5_IDPRE", "0", 1);
    run_checks(v5, 1, true);
    run_timing(5);
    unsetenv("TM_CUDA_V5_IDPRE");
    const int vd[] = {V_DEFAULT};
    /* the unmasked tiles' softmax with its row max (TM_CUDA_V5_FASTMAX=0) instead of against the stored one */
    setenv("TM_CUDA_V5_FASTMAX", "0", 1);
    run_checks(v5, 1, true);
    run_timing(5);
    unsetenv("TM_CUDA_V5_FASTMAX");
    /* keys of a large norm now and then: scores that jump far past a row's running max in a late tile, which the
     * fastmax rounds must detect and redo (without the redo these rows come out inf / NaN); both modes, over the
     * cache and over the step's rows */
    g_spike = true;
    run_checks(v5, 1, true);
    setenv("TM_CUDA_V5_FASTMAX", "0", 1);
    run_checks(v5, 1, true);
    unsetenv("TM_CUDA_V5_FASTMAX");
    g_rows = true;
    run_checks(vd, 1, true);
    g_rows = false;
    g_spike = false;
    /* the step's keys as token rows (fresh sequences; the cache poisoned), over a bf16 and an fp8 cache: v5 reads
     * the rows; other shapes take the cache as before */
    g_rows = true;
    run_checks(vd, 1, true);
    run_timing(V_DEFAULT);
    g_fp8 = true;
    run_checks(vd, 1, true);
    run_timing(V_DEFAULT);
    g_fp8 = g_rows = false;
    if (getenv("TB_PREFILL_ONLY") && strcmp(getenv("TB_PREFILL_ONLY"), "5") == 0) return tb_finish("tb_attn_prefill");
    run_timing(V5_BN64);

    /* the simple fallback (v1) and the mma.sync version (v2) */
    const int v12[] = {1, 2};
    run_checks(v12, 2, false);
    run_timing(2);
    run_timing(1);

    /* the wgmma version without the overlap (v3) */
    const int v3[] = {3};
    run_checks(v3, 1, true);
    run_timing(3);

    /* an fp8 e4m3 cache: v1 and v3 (the launcher takes v3 for fp8 whatever version is asked for) */
    g_fp8 = true;
    const int v8[] = {1, 3, V_DEFAULT};
    run_checks(v8, 3, false);
    run_timing(3);
    g_fp8 = false;

    unsetenv("TM_CUDA_ATTN_PREFILL_V");
    unsetenv("TM_CUDA_ATTN_PREFILL_BN");
    return tb_finish("tb_attn_prefill");
}
