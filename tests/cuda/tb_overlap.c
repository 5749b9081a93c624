/* tb_overlap.c -- does the memory-bound paged decode attention overlap the compute-bound fp8 GEMMs when the two
 * run on two CUDA streams at once? (the question behind a NanoFlow-style decode step: two micro-batches, one's
 * attention running beside the other's GEMMs) */
#include "backend/cuda/tm_cuda_blas.h"
#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "tb_guard.h"

/* Llama-3-8B geometry (32 query heads, 8 kv heads, head_dim 128, block 16, fp8 e4m3 KV cache), one micro-batch of
 * a 512-sequence decode step:
 *  A: one layer's decode attention (tm_cuda_attn_decode) for 256 sequences of 1536 tokens of context (805 MB of
 *     K and V read: memory-bound);
 *  G: that micro-batch's fp8 GEMMs of one layer at n = 256 tokens, back to back: qkv (m 6144, k 4096), o (4096,
 *     4096), gate+up (28672, 4096), down (4096, 14336), through tm_cuda_blas_gemm_fp8 with fast accumulation
 *     (alpha 1e-4, bf16 out; 112 GFLOP over 218 MB of weights: compute-bound).
 * Times (CUDA events, median of repeats after warm-up, microseconds):
 *  t_A   A alone on stream s1;      t_G   G alone on stream s2;      t_seq  A then G on s1;
 *  t_par A on s1 and G on s2 at once: a fork event on s1 that s2 waits for, both enqueued, s1 waits for s2's
 *        join event; the wall time of both.
 * saved = (t_A + t_G - t_par) / min(t_A, t_G): 100% when the shorter one hides entirely under the longer one,
 * 0% when running them together gains nothing over running them one after the other (negative: it loses).
 * gain = (t_seq0 - t_par) / t_seq0, t_seq0 the sequential time with the default GEMMs (SM target 0, the same
 * variant): what the step would win over today's, since a lower target can make G slower (and saved larger).
 * Each of the GEMM SM targets 0 (off: the device's SM count), 100, 88, 76 and 66 (tm_cuda_blas_set_sm_target,
 * cuBLASLt's CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: kernels sized to leave SMs to the attention) gets its own
 * tm_cuda_blas handle (fresh plans; its own workspace, which concurrent GEMMs must not share) and five lines:
 *  A|G         eager launches, A enqueued first (as above);
 *  G|A         eager, G enqueued first (the first kernel takes the SMs; the other fills what it leaves);
 *  2A|G        eager, A launched twice against one G (does the longer stream hide the shorter one?);
 *  graph A|G   the same fork/join captured once into a CUDA graph and replayed (as a backend's decode step runs:
 *              no host launch gaps, both branches released together); t_A, t_G and t_seq from graphs too;
 *  graph 2A|G.
 * Checks: after every concurrent run (outputs poisoned with 0xFF before it), the attention output and the four
 * GEMM outputs equal, bit for bit, those of the standalone runs with the same handle (whose outputs must be
 * finite: an unwritten element fails); err = the number of differing (or non-finite) bf16 elements, tol 0. A
 * second standalone run of each must repeat the first ("alone repeatable"), which separates a kernel that is not
 * deterministic at all from one that is disturbed by the concurrent stream.
 * TB_BUDGET_S (default 30) bounds the run: SM targets past it are skipped.
 * Measured (ninth and tenth sessions): nothing to gain. Launched together the pair saves at most 3% of the
 * sequential time (eager, G enqueued first, no SM target: 307 against 317 us) and nothing as a graph (314 against
 * 308); lower SM targets only slow the GEMMs. An attention held to 44, 33 or 22 SMs by a persistent grid
 * (measured, then removed) took 355, 371 and 547 us alone against 216 on the whole GPU. */

#define N_SEQ 256
#define CTX 1536
#define N_HEADS 32
#define N_KV 8
#define HD 128
#define BS 16
#define BLK_PER_SEQ (CTX / BS)
#define N_TOK 256 /* GEMM rows: one micro-batch's decode tokens */
#define N_GEMM 4
#define TIME_WARM 5
#define TIME_REPS 31

static const int64_t k_gemm_mk[N_GEMM][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
static const char *k_gemm_name[N_GEMM] = {"qkv", "o", "gate+up", "down"};

typedef enum { W_A, W_G, W_SEQ, W_PAR } work_kind;

typedef struct bed {
    cudaStream_t s1, s2;
    cudaEvent_t e0, e1, fork, join;
    /* attention */
    uint16_t *q, *out;
    uint8_t *kc, *vc;
    int32_t *ctx, *tbl;
    void *work;
    size_t work_bytes;
    double kv_bytes;
    /* GEMMs: x4 (N_TOK, 4096) for the first three, x14 (N_TOK, 14336) for down */
    uint8_t *x4, *x14, *w[N_GEMM];
    uint16_t *o[N_GEMM];
    size_t o_elems[N_GEMM], o_total;
    double flops;
    tm_cuda_blas *blas; /* the current SM target's handle */
    /* reference outputs of the standalone runs (host) */
    uint16_t *ref_attn, *ref_gemm, *got;
} bed;

typedef struct spec {
    work_kind kind;
    int n_attn;   /* attention launches (1 or 2) */
    bool g_first; /* W_PAR: G enqueued before A */
} spec;

static void attn_once(bed *b, cudaStream_t st) {
    tm_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_heads = N_HEADS;
    a.n_kv_heads = N_KV;
    a.head_dim = HD;
    a.block_size = BS;
    a.scale = 1.0f / sqrtf((float)HD);
    a.n_tokens = a.n_seqs = N_SEQ;
    a.max_blocks = BLK_PER_SEQ;
    a.context_len = b->ctx;
    a.block_table = b->tbl;
    a.max_query_len = 1;
    a.max_context_len = CTX;
    a.q = b->q;
    a.k_cache = (const uint16_t *)b->kc; /* read as bytes (kv_fp8) */
    a.v_cache = (const uint16_t *)b->vc;
    a.kv_fp8 = true;
    a.out = b->out;
    a.work = b->work;
    a.work_bytes = b->work_bytes;
    TB_CHECK(tm_cuda_attn_decode(&a, st));
}

/* G on st; false (after a '#' line) when cuBLASLt refuses a product (its plan is made at the first call) */
static bool gemms_try(bed *b, cudaStream_t st) {
    for (int g = 0; g < N_GEMM; g++) {
        const int64_t m = k_gemm_mk[g][0], k = k_gemm_mk[g][1];
        tm_error err;
        if (tm_cuda_blas_gemm_fp8(b->blas, k == 4096 ? b->x4 : b->x14, b->w[g], 1e-4f, b->o[g], false, N_TOK, m, k, st,
                                  &err) != TM_OK) {
            printf("# gemm %s in case %s: %s\n", k_gemm_name[g], tb_case_name, err.msg);
            fflush(stdout);
            return false;
        }
    }
    return true;
}

static void gemms_once(bed *b, cudaStream_t st) {
    if (!gemms_try(b, st)) exit(2);
}

static void attn_n(bed *b, int n, cudaStream_t st) {
    for (int i = 0; i < n; i++) attn_once(b, st);
}

/* the work of sp, enqueued: A on s1, G on s2 (alone) or s1 (sequential); W_PAR forks s2 from s1 and joins it back,
 * so that it begins and ends on s1 (which a graph capture on s1 also needs) */
static void enqueue(bed *b, const spec *sp) {
    switch (sp->kind) {
    case W_A: attn_n(b, sp->n_attn, b->s1); break;
    case W_G: gemms_once(b, b->s2); break;
    case W_SEQ:
        attn_n(b, sp->n_attn, b->s1);
        gemms_once(b, b->s1);
        break;
    case W_PAR:
        TB_CHECK(cudaEventRecord(b->fork, b->s1));
        TB_CHECK(cudaStreamWaitEvent(b->s2, b->fork, 0));
        if (sp->g_first) {
            gemms_once(b, b->s2);
            attn_n(b, sp->n_attn, b->s1);
        } else {
            attn_n(b, sp->n_attn, b->s1);
            gemms_once(b, b->s2);
        }
        TB_CHECK(cudaEventRecord(b->join, b->s2));
        TB_CHECK(cudaStreamWaitEvent(b->s1, b->join, 0));
        break;
    }
}

static cudaStream_t home_stream(const bed *b, const spec *sp) { return sp->kind == W_G ? b->s2 : b->s1; }

/* sp captured once into a graph (launched on its home stream) */
static cudaGraphExec_t capture(bed *b, const spec *sp) {
    cudaStream_t st = home_stream(b, sp);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TB_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    enqueue(b, sp);
    TB_CHECK(cudaStreamEndCapture(st, &g));
    TB_CHECK(cudaGraphInstantiate(&ge, g, 0));
    TB_CHECK(cudaGraphDestroy(g));
    return ge;
}

static void run_once(bed *b, const spec *sp, cudaGraphExec_t ge) {
    if (ge) TB_CHECK(cudaGraphLaunch(ge, home_stream(b, sp)));
    else enqueue(b, sp);
}

/* median wall time of sp (eager, or its graph replayed), events on its home stream */
static double time_spec(bed *b, const spec *sp, bool graph) {
    cudaStream_t st = home_stream(b, sp);
    cudaGraphExec_t ge = NULL;
    if (graph) {
        run_once(b, sp, NULL); /* the GEMM plans exist before the capture */
        TB_CHECK(cudaDeviceSynchronize());
        ge = capture(b, sp);
    }
    for (int i = 0; i < TIME_WARM; i++) run_once(b, sp, ge);
    TB_CHECK(cudaDeviceSynchronize());
    float ms[TIME_REPS];
    for (int i = 0; i < TIME_REPS; i++) {
        TB_CHECK(cudaEventRecord(b->e0, st));
        run_once(b, sp, ge);
        TB_CHECK(cudaEventRecord(b->e1, st));
        TB_CHECK(cudaEventSynchronize(b->e1));
        TB_CHECK(cudaEventElapsedTime(&ms[i], b->e0, b->e1));
    }
    TB_CHECK(cudaGetLastError());
    if (ge) TB_CHECK(cudaGraphExecDestroy(ge));
    qsort(ms, TIME_REPS, sizeof(float), tb_cmp_f);
    return (double)ms[TIME_REPS / 2] * 1000.0;
}

/* ---- outputs: poison, download, compare ---- */

static void poison_outputs(bed *b) {
    tb_poison(b->out, (size_t)N_SEQ * N_HEADS * HD * 2);
    for (int g = 0; g < N_GEMM; g++) tb_poison(b->o[g], b->o_elems[g] * 2);
    TB_CHECK(cudaDeviceSynchronize()); /* the memsets ran on the legacy stream; s1 and s2 are non-blocking */
}

static void download_attn(bed *b, uint16_t *dst) { tb_download(dst, b->out, (size_t)N_SEQ * N_HEADS * HD * 2); }

static void download_gemm(bed *b, uint16_t *dst) {
    size_t off = 0;
    for (int g = 0; g < N_GEMM; g++) {
        tb_download(dst + off, b->o[g], b->o_elems[g] * 2);
        off += b->o_elems[g];
    }
}

/* elements of got differing from ref, plus the non-finite elements of ref (unwritten by the standalone run) */
static size_t count_diff(const uint16_t *got, const uint16_t *ref, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += got[i] != ref[i] || (ref[i] & 0x7f80u) == 0x7f80u;
    return d;
}

/* one concurrent run of sp (eager or its graph), outputs poisoned first, against the standalone references:
 * adds the differing elements to *d_attn and *d_gemm */
static void check_par(bed *b, const spec *sp, bool graph, size_t *d_attn, size_t *d_gemm) {
    cudaGraphExec_t ge = graph ? capture(b, sp) : NULL;
    poison_outputs(b);
    run_once(b, sp, ge);
    TB_CHECK(cudaDeviceSynchronize());
    if (ge) TB_CHECK(cudaGraphExecDestroy(ge));
    download_attn(b, b->got);
    *d_attn += count_diff(b->got, b->ref_attn, (size_t)N_SEQ * N_HEADS * HD);
    download_gemm(b, b->got);
    *d_gemm += count_diff(b->got, b->ref_gemm, b->o_total);
}

/* ---- setup ---- */

static void fill(void *dst, int32_t type, size_t n, float scale) {
    TB_CHECK(tm_cuda_fill_random(dst, type, n, tb_rand_u64(), scale, 0.0f, 0));
}

static void bed_init(bed *b) {
    memset(b, 0, sizeof *b);
    TB_CHECK(cudaStreamCreateWithFlags(&b->s1, cudaStreamNonBlocking));
    TB_CHECK(cudaStreamCreateWithFlags(&b->s2, cudaStreamNonBlocking));
    TB_CHECK(cudaEventCreate(&b->e0));
    TB_CHECK(cudaEventCreate(&b->e1));
    TB_CHECK(cudaEventCreateWithFlags(&b->fork, cudaEventDisableTiming));
    TB_CHECK(cudaEventCreateWithFlags(&b->join, cudaEventDisableTiming));
    /* attention: sequence s owns blocks s * BLK_PER_SEQ ..; e4m3 of uniform(-1, 1) (saturating conversion: never
     * the NaN patterns 0x7f / 0xff), q bf16 uniform(-1, 1) */
    const size_t nq = (size_t)N_SEQ * N_HEADS * HD, pool = (size_t)N_SEQ * BLK_PER_SEQ * N_KV * BS * HD;
    b->q = tb_dev(nq * 2);
    b->out = tb_dev(nq * 2);
    b->kc = tb_dev(pool);
    b->vc = tb_dev(pool);
    fill(b->q, TM_DT_BF16, nq, 1.0f);
    fill(b->kc, TM_DT_FP8_E4M3, pool, 1.0f);
    fill(b->vc, TM_DT_FP8_E4M3, pool, 1.0f);
    int32_t *ctx = tb_xmalloc(N_SEQ * sizeof(int32_t));
    int32_t *tbl = tb_xmalloc((size_t)N_SEQ * BLK_PER_SEQ * sizeof(int32_t));
    for (int s = 0; s < N_SEQ; s++) {
        ctx[s] = CTX;
        for (int j = 0; j < BLK_PER_SEQ; j++) tbl[s * BLK_PER_SEQ + j] = s * BLK_PER_SEQ + j;
    }
    b->ctx = tb_upload(ctx, N_SEQ * sizeof(int32_t));
    b->tbl = tb_upload(tbl, (size_t)N_SEQ * BLK_PER_SEQ * sizeof(int32_t));
    free(ctx);
    free(tbl);
    b->work_bytes = tm_cuda_attn_decode_work_bytes(N_SEQ, N_HEADS, HD, CTX);
    b->work = b->work_bytes ? tb_dev(b->work_bytes) : NULL;
    b->kv_bytes = 2.0 * (double)N_SEQ * CTX * N_KV * HD + 2.0 * 2.0 * (double)nq; /* K + V (bytes), q + out */
    /* GEMMs: e4m3 of 448 * uniform(-1, 1), the whole e4m3 range (as tb_fp8's make_fp8) */
    b->x4 = tb_dev((size_t)N_TOK * 4096);
    b->x14 = tb_dev((size_t)N_TOK * 14336);
    fill(b->x4, TM_DT_FP8_E4M3, (size_t)N_TOK * 4096, 448.0f);
    fill(b->x14, TM_DT_FP8_E4M3, (size_t)N_TOK * 14336, 448.0f);
    for (int g = 0; g < N_GEMM; g++) {
        const int64_t m = k_gemm_mk[g][0], k = k_gemm_mk[g][1];
        b->w[g] = tb_dev((size_t)(m * k));
        fill(b->w[g], TM_DT_FP8_E4M3, (size_t)(m * k), 448.0f);
        b->o_elems[g] = (size_t)(N_TOK * m);
        b->o[g] = tb_dev(b->o_elems[g] * 2);
        b->o_total += b->o_elems[g];
        b->flops += 2.0 * N_TOK * (double)m * (double)k;
    }
    TB_CHECK(cudaDeviceSynchronize());
    const size_t most = b->o_total > nq ? b->o_total : nq;
    b->ref_attn = tb_xmalloc(nq * 2);
    b->ref_gemm = tb_xmalloc(b->o_total * 2);
    b->got = tb_xmalloc(most * 2);
}

static void bed_free(bed *b) {
    cudaFree(b->q);
    cudaFree(b->out);
    cudaFree(b->kc);
    cudaFree(b->vc);
    cudaFree(b->ctx);
    cudaFree(b->tbl);
    cudaFree(b->work);
    cudaFree(b->x4);
    cudaFree(b->x14);
    for (int g = 0; g < N_GEMM; g++) {
        cudaFree(b->w[g]);
        cudaFree(b->o[g]);
    }
    free(b->ref_attn);
    free(b->ref_gemm);
    free(b->got);
    cudaEventDestroy(b->e0);
    cudaEventDestroy(b->e1);
    cudaEventDestroy(b->fork);
    cudaEventDestroy(b->join);
    cudaStreamDestroy(b->s1);
    cudaStreamDestroy(b->s2);
}

/* ---- measurements ---- */

typedef struct attn_times {
    double a1, a2, a1g, a2g;     /* one and two launches, eager and graph */
    double seq0[4];              /* t_seq at SM target 0: A;G, 2A;G, A;G graph, 2A;G graph (0: not yet measured) */
} attn_times;

/* the key lines, kept for the end of the log (after every RESULT line, so that a log's tail holds all of them) */
#define MAX_KEYS 48
static char g_keys[MAX_KEYS][192];
static int g_n_keys;

static void key_line(const char *label, double ta, double tg, double tseq, double tpar, double tseq0) {
    if (g_n_keys == MAX_KEYS) return;
    const double shorter = ta < tg ? ta : tg;
    snprintf(g_keys[g_n_keys++], sizeof g_keys[0],
             "# key overlap %-18s t_A=%8.1f t_G=%8.1f t_seq=%8.1f t_par=%8.1f us  saved=%6.1f %%  gain=%5.1f %%",
             label, ta, tg, tseq, tpar, shorter > 0 ? 100.0 * (ta + tg - tpar) / shorter : 0.0,
             tseq0 > 0 ? 100.0 * (tseq0 - tpar) / tseq0 : 0.0);
}

static void timed(const char *cas, double us, double bytes, double flops, char bound) {
    tb_result("overlap", cas, 0, 0, us, bytes, flops, bound);
}

/* one SM target: its handle, G's standalone reference, then the five pairings */
static void run_target(bed *b, attn_times *at, int32_t sms) {
    if (!tb_budget_ok()) return;
    char tag[24];
    snprintf(tag, sizeof tag, "sms=%d", (int)sms);
    tb_case("overlap %s", tag);
    tm_error err;
    if (tm_cuda_blas_create((size_t)64 << 20, &b->blas, &err) != TM_OK) {
        printf("# cuBLASLt: %s\n", err.msg);
        tb_failures++;
        return;
    }
    tm_cuda_blas_set_fp8_fast_accum(b->blas, true);
    tm_cuda_blas_set_sm_target(b->blas, sms);
    char lab[48];
    const spec g = {W_G, 1, false}, seq1 = {W_SEQ, 1, false}, seq2 = {W_SEQ, 2, false};
    const spec p1 = {W_PAR, 1, false}, p1g = {W_PAR, 1, true}, p2 = {W_PAR, 2, false};
    /* G's reference on s2 with this handle (its plans made here: a refused SM target fails this target only) */
    poison_outputs(b);
    if (!gemms_try(b, b->s2)) {
        snprintf(lab, sizeof lab, "%s plans", tag);
        tb_result("overlap", lab, 1, 0, 0, 0, 0, 'c');
        TB_CHECK(cudaDeviceSynchronize());
        tm_cuda_blas_free(b->blas);
        b->blas = NULL;
        return;
    }
    TB_CHECK(cudaDeviceSynchronize());
    download_gemm(b, b->ref_gemm);
    poison_outputs(b);
    run_once(b, &g, NULL);
    TB_CHECK(cudaDeviceSynchronize());
    download_gemm(b, b->got);
    const size_t d_rep = count_diff(b->got, b->ref_gemm, b->o_total);

    const double tg = time_spec(b, &g, false), tgg = time_spec(b, &g, true);
    const double ts1 = time_spec(b, &seq1, false), ts2 = time_spec(b, &seq2, false);
    const double ts1g = time_spec(b, &seq1, true), ts2g = time_spec(b, &seq2, true);
    const double tp1 = time_spec(b, &p1, false), tp1g = time_spec(b, &p1g, false), tp2 = time_spec(b, &p2, false);
    const double tp1gr = time_spec(b, &p1, true), tp2gr = time_spec(b, &p2, true);

    size_t da = 0, dg = 0;
    char name[64];
    check_par(b, &p1, false, &da, &dg);
    check_par(b, &p1g, false, &da, &dg);
    check_par(b, &p2, false, &da, &dg);
    check_par(b, &p1, true, &da, &dg);
    check_par(b, &p2, true, &da, &dg);

#define RES(what, us, bytes, flops, bound)                                                                     \
    do {                                                                                                      \
        snprintf(name, sizeof name, "%s %s", tag, what);                                             \
        timed(name, us, bytes, flops, bound);                                                                 \
    } while (0)
    RES("G", tg, 0, b->flops, 'c');
    RES("G graph", tgg, 0, b->flops, 'c');
    RES("seq A;G", ts1, 0, 0, 'm');
    RES("seq 2A;G", ts2, 0, 0, 'm');
    RES("seq A;G graph", ts1g, 0, 0, 'm');
    RES("seq 2A;G graph", ts2g, 0, 0, 'm');
    RES("par A|G", tp1, 0, 0, 'm');
    RES("par G|A", tp1g, 0, 0, 'm');
    RES("par 2A|G", tp2, 0, 0, 'm');
    RES("par A|G graph", tp1gr, 0, 0, 'm');
    RES("par 2A|G graph", tp2gr, 0, 0, 'm');
#undef RES
    snprintf(name, sizeof name, "%s gemm alone repeatable", tag);
    tb_result("overlap", name, (double)d_rep, 0, 0, 0, 0, 'c');
    snprintf(name, sizeof name, "%s par attn == alone", tag);
    tb_result("overlap", name, (double)da, 0, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "%s par gemm == alone", tag);
    tb_result("overlap", name, (double)dg, 0, 0, 0, 0, 'c');

    if (at->seq0[0] <= 0) { /* the first target (0) sets the baseline */
        at->seq0[0] = ts1;
        at->seq0[1] = ts2;
        at->seq0[2] = ts1g;
        at->seq0[3] = ts2g;
    }
    snprintf(lab, sizeof lab, "%s A|G", tag);
    key_line(lab, at->a1, tg, ts1, tp1, at->seq0[0]);
    snprintf(lab, sizeof lab, "%s G|A", tag);
    key_line(lab, at->a1, tg, ts1, tp1g, at->seq0[0]);
    snprintf(lab, sizeof lab, "%s 2A|G", tag);
    key_line(lab, at->a2, tg, ts2, tp2, at->seq0[1]);
    snprintf(lab, sizeof lab, "%s graph A|G", tag);
    key_line(lab, at->a1g, tgg, ts1g, tp1gr, at->seq0[2]);
    snprintf(lab, sizeof lab, "%s graph 2A|G", tag);
    key_line(lab, at->a2g, tgg, ts2g, tp2gr, at->seq0[3]);

    tm_cuda_blas_free(b->blas);
    b->blas = NULL;
}

int main(void) {
    tb_guard_init(45.0);
    tb_seed();
    int dev = 0, n_sm = 0;
    TB_CHECK(cudaGetDevice(&dev));
    TB_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    printf("# %d SMs; A: %d seqs x %d ctx fp8 KV (%d/%d heads, hd %d, block %d); G: n=%d qkv, o, gate+up, down fp8\n",
           n_sm, N_SEQ, CTX, N_HEADS, N_KV, HD, BS, N_TOK);
    tb_case("setup");
    bed b;
    bed_init(&b);

    /* A alone: its reference output, then its times (they do not depend on the GEMMs' handle) */
    tb_case("attention alone");
    const spec a1 = {W_A, 1, false}, a2 = {W_A, 2, false};
    poison_outputs(&b);
    run_once(&b, &a1, NULL);
    TB_CHECK(cudaDeviceSynchronize());
    download_attn(&b, b.ref_attn);
    attn_times at;
    memset(&at, 0, sizeof at);
    at.a1 = time_spec(&b, &a1, false);
    at.a2 = time_spec(&b, &a2, false);
    at.a1g = time_spec(&b, &a1, true);
    at.a2g = time_spec(&b, &a2, true);
    timed("A", at.a1, b.kv_bytes, 0, 'm');
    timed("2A", at.a2, 2.0 * b.kv_bytes, 0, 'm');
    timed("A graph", at.a1g, b.kv_bytes, 0, 'm');
    timed("2A graph", at.a2g, 2.0 * b.kv_bytes, 0, 'm');
    /* the standalone output is deterministic (and finite): a second run gives the same bits */
    poison_outputs(&b);
    run_once(&b, &a1, NULL);
    TB_CHECK(cudaDeviceSynchronize());
    download_attn(&b, b.got);
    tb_result("overlap", "attn alone repeatable", (double)count_diff(b.got, b.ref_attn, (size_t)N_SEQ * N_HEADS * HD),
              0, 0, 0, 0, 'm');

    const int32_t targets[] = {0, 100, 88, 76, 66};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) run_target(&b, &at, targets[i]);


    bed_free(&b);
    tb_case("finish");
    for (int i = 0; i < g_n_keys; i++) printf("%s\n", g_keys[i]);
    tb_guard_report("tb_overlap");
    return tb_finish("tb_overlap");
}
