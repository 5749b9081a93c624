/* tm_bench.c -- `tokenmill bench throughput`: offline throughput and latency through the engine. */
#include "tm_bench.h"
#include "tm_membw.h"

#include "engine/tm_engine.h"
#include "model/tm_model.h"
#include "metrics/tm_metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct req_result {
    double ttft, tpot, e2e;
    int32_t n_gen;
    bool done;
} req_result;

static bool on_event(void *user, const tm_gen_event *ev) {
    req_result *r = user;
    if (!ev->finish_reason) return true;
    const tm_gen_stats *s = ev->stats;
    r->done = true;
    r->n_gen = s->gen_tokens;
    r->ttft = s->ttft_s;
    r->tpot = s->gen_tokens > 1 ? s->decode_s / (s->gen_tokens - 1) : NAN;
    r->e2e = s->finish_s - s->arrival_s;
    return true;
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void print_summary(const char *name, tm_summary s, double scale, bool json, bool last) {
    if (json)
        printf("\"%s_ms_mean\": %.3f, \"%s_ms_p50\": %.3f, \"%s_ms_p99\": %.3f%s", name, s.mean * scale, name, s.p50 * scale, name,
               s.p99 * scale, last ? "" : ", ");
    else
        printf("%-6s mean %9.2f ms   p50 %9.2f ms   p99 %9.2f ms\n", name, s.mean * scale, s.p50 * scale, s.p99 * scale);
}

tm_status tm_bench_throughput(const tm_bench_tp_cfg *c, tm_error *err) {
    if (c->num_prompts < 1 || c->input_len < 1 || (c->out_max <= 0 && c->output_len < 1) || c->shared_prefix < 0 ||
        c->shared_prefix > c->input_len || (c->out_max > 0 && (c->out_min < 1 || c->out_min > c->out_max)))
        return tm_err(err, TM_ERR_INVALID, "bad benchmark shape (prompts %d, input %d, output %d or %d..%d, prefix %d)",
                      c->num_prompts, c->input_len, c->output_len, c->out_min, c->out_max, c->shared_prefix);
    tm_model *m = NULL;
    tm_engine *e = NULL;
    int32_t *prompts = NULL, *outlen = NULL;
    req_result *res = NULL;
    double *v = NULL;
    FILE *trace = NULL;
    tm_device dev;
    int32_t ordinal;
    tm_status s = tm_device_parse(c->device, &dev, &ordinal, err);
    if (s != TM_OK) return s;
    if ((s = tm_runner_load_model(c->model, dev, c->tp, &m, err)) != TM_OK) return s;
    int32_t omax = c->out_max > 0 ? c->out_max : c->output_len;
    int32_t max_seqs = c->max_seqs > 0 ? c->max_seqs : 32;
    tm_engine_cfg ec = {
        .runner = {.device = dev, .cuda_device = ordinal, .no_graphs = c->no_graphs, .tp = c->tp, .kv_dtype = c->kv_dtype,
                   .n_threads = c->n_threads, .n_ctx = c->input_len + omax + 1,
                   .max_batch_tokens = c->max_batched_tokens > 0 ? c->max_batched_tokens : 512,
                   .block_size = c->block_size,
                   .n_seqs = max_seqs, .act_bits = c->act_bits, .no_prefix_cache = c->no_prefix_cache},
        .sched = {.max_seqs = max_seqs, .policy = c->static_batching ? TM_SCHED_STATIC : TM_SCHED_CONTINUOUS},
        .no_pipeline = c->no_pipeline,
    };
    if (ec.runner.n_ctx > m->hp.n_ctx_train) {
        s = tm_err(err, TM_ERR_RANGE, "input %d + output %d exceeds the model's context %d", c->input_len, omax,
                   m->hp.n_ctx_train);
        goto done;
    }
    if ((s = tm_engine_create(m, &ec, &e, err)) != TM_OK) goto done;
    size_t N = (size_t)c->num_prompts, I = (size_t)c->input_len;
    prompts = tm_malloc_array(N * I, sizeof(int32_t));
    outlen = tm_malloc_array(N, sizeof(int32_t));
    res = tm_calloc(N, sizeof(req_result));
    v = tm_malloc_array(N, sizeof(double));
    if (!prompts || !outlen || !res || !v) {
        s = tm_err(err, TM_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t st = c->seed ? c->seed : 1;
    int32_t lo_id = m->hp.n_vocab > 1000 ? 256 : 0; /* random ids away from the specials */
    for (size_t r = 0; r < N; r++) {
        for (size_t i = 0; i < I; i++)
            prompts[r * I + i] = (int64_t)i < c->shared_prefix && r > 0
                                     ? prompts[i]
                                     : lo_id + (int32_t)(rng_next(&st) % (uint64_t)(m->hp.n_vocab - lo_id));
        outlen[r] = c->out_max > 0 ? c->out_min + (int32_t)(rng_next(&st) % (uint64_t)(c->out_max - c->out_min + 1))
                                   : c->output_len;
    }
    if (c->step_trace && !(trace = fopen(c->step_trace, "w"))) {
        s = tm_err(err, TM_ERR_IO, "cannot write the step trace '%s'", c->step_trace);
        goto done;
    }
    if (trace) fprintf(trace, "# t_s dt_s kind n_seqs n_tokens n_prefill running waiting\n");
    double t0 = tm_time_s(), pass0 = e->runner->pass_s, t_prev = t0;
    int64_t steps = 0;
    for (size_t r = 0; r < N; r++) {
        tm_gen_params gp = {0};
        gp.sampling = tm_sampling_default();
        gp.sampling.temperature = 0.0f;
        if (c->sampling) {
            gp.sampling = *c->sampling;
            gp.sampling.seed = c->sampling->seed + (uint64_t)r; /* a stream of its own */
        }
        gp.max_tokens = outlen[r];
        gp.ignore_eos = true;
        if ((s = tm_engine_add(e, prompts + r * I, I, &gp, on_event, &res[r], NULL, err)) != TM_OK) goto done;
        while ((c->sequential || r + 1 == N) && tm_engine_has_work(e)) {
            if ((s = tm_engine_step(e, err)) != TM_OK) goto done;
            steps++;
            if (trace) {
                const double t = tm_time_s();
                const tm_engine_step_info *li = &e->last;
                fprintf(trace, "%.6f %.6f %c %d %d %d %d %d\n", t - t0, t - t_prev, li->kind, li->n_seqs,
                        li->n_tokens, li->n_prefill, e->sched.n_running, e->sched.n_waiting);
                t_prev = t;
            }
        }
    }
    double wall = tm_time_s() - t0, pass = e->runner->pass_s - pass0;
    uint64_t out_tokens = 0;
    for (size_t r = 0; r < N; r++) out_tokens += (uint64_t)res[r].n_gen;
    uint64_t total_tokens = out_tokens + (uint64_t)N * I;
    tm_kv_stats ks;
    tm_kv_get_stats(&e->runner->pool, &ks);
    if (c->json)
        printf("{\"model\": \"%s\", \"sequential\": %s, \"schedule\": \"%s\", \"num_prompts\": %d, \"input_len\": %d, \"output_len_max\": %d, "
               "\"shared_prefix\": %d, \"threads\": %d, \"max_seqs\": %d, \"kv_cache_dtype\": \"%s\", \"kv_blocks\": %d, "
               "\"block_size\": %d, \"pipelined\": %s, \"greedy\": %s, \"duration_s\": %.3f, \"pass_s\": %.3f, \"steps\": %lld, "
               "\"requests_per_s\": %.4f, \"output_tok_s\": %.2f, \"total_tok_s\": %.2f, \"output_tokens\": %llu, "
               "\"prefix_hit_tokens\": %llu, \"preemptions\": %llu, ",
               m->name, c->sequential ? "true" : "false", c->static_batching ? "static" : "continuous", c->num_prompts, c->input_len, omax,
               c->shared_prefix, e->runner->cfg.n_threads, max_seqs, tm_dtype_name(tm_kv_dtype_resolve(c->kv_dtype, dev)),
               e->runner->pool.n_blocks, e->runner->pool.block_size, e->pipeline ? "true" : "false",
               c->sampling ? "false" : "true", wall, pass,
               (long long)steps, (double)N / wall,
               (double)out_tokens / wall, (double)total_tokens / wall, (unsigned long long)out_tokens,
               (unsigned long long)ks.hit_tokens, (unsigned long long)e->sched.n_preemptions);
    else
        printf("%s: %d requests (input %d, output %s%d), %s batching%s, %s, %d threads, max %d seqs\n"
               "duration %.2f s (%.2f s in forward passes), %lld steps: %.3f req/s, output %.1f tok/s, total %.1f tok/s; "
               "prefix hits %llu tokens, preemptions %llu\n",
               m->name, c->num_prompts, c->input_len, c->out_max > 0 ? "<=" : "", omax,
               c->static_batching ? "static" : "continuous", e->pipeline ? " (pipelined steps)" : "",
               c->sampling ? "sampled" : "greedy", e->runner->cfg.n_threads,
               max_seqs, wall, pass, (long long)steps,
               (double)N / wall, (double)out_tokens / wall, (double)total_tokens / wall,
               (unsigned long long)ks.hit_tokens, (unsigned long long)e->sched.n_preemptions);
    for (size_t r = 0; r < N; r++) v[r] = res[r].ttft;
    print_summary("ttft", tm_stats_summary(v, N), 1e3, c->json, false);
    size_t n_tpot = 0;
    for (size_t r = 0; r < N; r++)
        if (!isnan(res[r].tpot)) v[n_tpot++] = res[r].tpot;
    print_summary("tpot", tm_stats_summary(v, n_tpot), 1e3, c->json, false);
    for (size_t r = 0; r < N; r++) v[r] = res[r].e2e;
    print_summary("e2e", tm_stats_summary(v, N), 1e3, c->json, true);
    if (c->json) printf("}\n");
done:
    if (trace && fclose(trace) != 0 && s == TM_OK) s = tm_err(err, TM_ERR_IO, "cannot write the step trace '%s'", c->step_trace);
    free(prompts);
    free(outlen);
    free(res);
    free(v);
    tm_engine_free(e);
    tm_model_free(m);
    return s;
}

/* The matmul ceiling of this backend: every layer's projections (q, k, v, o, gate, up, down) and the output
 * projection over n tokens of random activations, best of reps passes, in FLOP/s: the GEMM-shaped rate of
 * tokenmill's own dot kernels on the same weights, in the same proportions, as a decode step's matmuls (the
 * output projection is a fifth of SmolLM2's MACs, and often of another type: Q8_0 there). */
static double gemm_ceiling(tm_engine *e, int32_t n, int reps) {
    const tm_model *m = e->model;
    tm_backend *be = e->runner->be;
    tm_workspace *ws = &e->runner->ws;
    if (n > ws->max_tokens) n = ws->max_tokens;
    const tm_hparams *hp = &m->hp;
    size_t nx = (size_t)n * (size_t)(hp->ffn_dim > hp->dim ? hp->ffn_dim : hp->dim);
    float *host = tm_malloc_array(nx, sizeof(float));
    if (!host) return 0.0;
    uint64_t st = 99;
    for (size_t i = 0; i < nx; i++) host[i] = (float)((double)rng_next(&st) / 2147483648.0 - 1.0);
    be->ops->from_host(be, host, (size_t)n * (size_t)hp->dim, ws->xb);
    be->ops->from_host(be, host, (size_t)n * (size_t)hp->ffn_dim, ws->hb);
    be->ops->from_host(be, host, (size_t)n * (size_t)hp->n_heads * (size_t)hp->head_dim, ws->att);
    free(host);
    double qd = (double)hp->n_heads * hp->head_dim, kvd = (double)hp->n_kv_heads * hp->head_dim;
    double flops = 2.0 * n * (hp->n_layers * ((double)hp->dim * (2 * qd + 2 * kvd) + 3.0 * hp->dim * hp->ffn_dim) +
                              (double)hp->n_vocab * hp->dim);
    const int32_t n_out = n < ws->max_logits ? n : ws->max_logits; /* the logits buffer's rows */
    flops -= 2.0 * (n - n_out) * (double)hp->n_vocab * hp->dim;
    double best = 0.0;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = tm_time_s();
        for (int32_t l = 0; l < hp->n_layers; l++) {
            const tm_layer *L = &m->layers[l];
            tm_matmul_job qkv[3] = {{&L->wq, NULL, ws->q, false}, {&L->wk, NULL, ws->k, false}, {&L->wv, NULL, ws->v, false}};
            tm_matmul_job o = {&L->wo, NULL, ws->proj, false};
            tm_matmul_job gu[2] = {{&L->w_gate, NULL, ws->hb2, false}, {&L->w_up, NULL, ws->hb2, false}};
            tm_matmul_job down = {&L->w_down, NULL, ws->proj, false};
            be->ops->matmul(be, qkv, 3, ws->xb, n);
            be->ops->matmul(be, &o, 1, ws->att, n);
            be->ops->matmul(be, gu, 2, ws->xb, n);
            be->ops->matmul(be, &down, 1, ws->hb, n);
        }
        tm_matmul_job head = {&m->output, NULL, ws->logits, true};
        be->ops->matmul(be, &head, 1, ws->xb, n_out);
        double r = flops / (tm_time_s() - t0);
        if (r > best) best = r;
    }
    return best;
}

/* the ceiling: the better of 16- and 64-token passes (the kernels' rate falls as the activation tile outgrows
 * the caches: a 64-token pass alone read below what 16-token decode steps reached) */
static double gemm_ceiling_best(tm_engine *e, int reps) {
    double a = gemm_ceiling(e, 16, reps), b = gemm_ceiling(e, 64, reps);
    return a > b ? a : b;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void pause_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* --bw auto's probes around a group of decode steps: the bandwidth, then (ceiling != NULL) the compute ceiling,
 * each 12 ms away from other work (the thread pools spin ~4 ms after theirs) */
static void probe_machine(tm_membw_probe *probe, tm_engine *e, double *bw, double *ceiling) {
    pause_ms(12);
    *bw = tm_membw_probe_run(probe, 2);
    if (ceiling) {
        pause_ms(12);
        *ceiling = gemm_ceiling_best(e, 1);
    }
    pause_ms(12);
}

tm_status tm_bench_latency_batch(const tm_bench_tp_cfg *c, double bw_gb_s, tm_error *err) {
    int32_t B = c->num_prompts, I = c->input_len, O = c->output_len;
    if (B < 1 || I < 1 || O < 2) return tm_err(err, TM_ERR_INVALID, "bad batch %d / input %d / output %d (>= 2)", B, I, O);
    tm_model *m = NULL;
    tm_engine *e = NULL;
    int32_t *prompts = NULL;
    double *gbw = NULL, *gms = NULL, *gce = NULL; /* --bw auto: (groups + 1) bandwidth and compute-ceiling probes,
                                                   * (groups) step times */
    bool probe_ceiling = false;
    int32_t n_groups = 0;
    tm_device dev;
    int32_t ordinal;
    tm_status s = tm_device_parse(c->device, &dev, &ordinal, err);
    if (s != TM_OK) return s;
    if ((s = tm_runner_load_model(c->model, dev, c->tp, &m, err)) != TM_OK) return s;
    int64_t pp_budget = (int64_t)B * I;
    tm_engine_cfg ec = {
        .runner = {.device = dev, .cuda_device = ordinal, .no_graphs = c->no_graphs, .tp = c->tp, .kv_dtype = c->kv_dtype,
                   .n_threads = c->n_threads, .n_ctx = I + O + 1,
                   .max_batch_tokens = (int32_t)(pp_budget < 4096 ? pp_budget : 4096), .block_size = c->block_size, .n_seqs = B,
                   .act_bits = c->act_bits, .no_prefix_cache = true},
        .sched = {.max_seqs = B},
        .no_pipeline = c->no_pipeline,
    };
    if (ec.runner.max_batch_tokens < B) ec.runner.max_batch_tokens = B;
    if ((s = tm_engine_create(m, &ec, &e, err)) != TM_OK) goto done;
    prompts = tm_malloc_array((size_t)B * (size_t)I, sizeof(int32_t));
    if (!prompts) {
        s = tm_err(err, TM_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t st = c->seed ? c->seed : 7;
    for (int64_t i = 0; i < (int64_t)B * I; i++) prompts[i] = 256 + (int32_t)(rng_next(&st) % (uint64_t)(m->hp.n_vocab - 256));
    {   /* warm-up: page the weights in, spin the threads up, and run the timed pass's shapes once (the prefill at
         * its batch size, a decode step of B), so that one-time costs (a GEMM plan, kernels loaded on first use)
         * fall outside the timed spans; every request ends after 2 tokens */
        tm_gen_params wp = {0};
        wp.sampling = tm_sampling_default();
        wp.max_tokens = 2;
        wp.ignore_eos = true;
        for (int32_t b = 0; b < B && s == TM_OK; b++)
            s = tm_engine_add(e, prompts + (size_t)b * (size_t)I, (size_t)I, &wp, NULL, NULL, NULL, err);
        while (s == TM_OK && tm_engine_has_work(e)) s = tm_engine_step(e, err);
        if (s != TM_OK) goto done;
    }
    for (int32_t b = 0; b < B; b++) {
        tm_gen_params gp = {0};
        gp.sampling = tm_sampling_default();
        gp.sampling.temperature = 0.0f;
        gp.max_tokens = O;
        gp.ignore_eos = true;
        if ((s = tm_engine_add(e, prompts + (size_t)b * (size_t)I, (size_t)I, &gp, NULL, NULL, NULL, err)) != TM_OK)
            goto done;
    }
    /* prefill: steps until every sequence has its first token (all are decoding after that) */
    double t0 = tm_time_s();
    int64_t steps = 0;
    bool all_decoding = false;
    while (!all_decoding) {
        if ((s = tm_engine_step(e, err)) != TM_OK) goto done;
        steps++;
        all_decoding = e->sched.n_waiting == 0;
        for (int32_t i = 0; i < e->sched.n_running && all_decoding; i++)
            if (e->sched.running[i]->n_computed < e->sched.running[i]->n_prompt) all_decoding = false;
    }
    /* --bw auto: the read bandwidth measured next to every group of TM_BW_GROUP decode steps (this machine's
     * bandwidth drifts by tens of percent within seconds): a probe before each group and after the last, each
     * group's step time compared with the mean of the two probes around it; the % of floor reported is the
     * median over the groups. The probe's threads and the engine's spin for a while after their work, so each
     * probe is separated from the steps by a sleep longer than the spin (~4 ms here), and one untimed step follows it (outside the timed
     * spans: tg and the step time count the timed steps). */
    enum { TM_BW_GROUP = 8 };
    const size_t max_groups = (size_t)O; /* each group takes at least two of the O - 1 decode steps */
    double t1 = tm_time_s(), dec_time = 0.0, t2 = t1; /* t1: the prefill's end */
    int64_t dec_steps = 0, all_steps = 0; /* timed steps; all decode steps (with --bw auto's warm-up ones) */
    tm_membw_probe *probe = NULL;
    if (bw_gb_s < 0) {
        gbw = tm_malloc_array(max_groups + 1, sizeof(double));
        gms = tm_malloc_array(max_groups, sizeof(double));
        gce = tm_malloc_array(max_groups + 1, sizeof(double));
        probe_ceiling = c->ceiling_gflop_s <= 0; /* the compute ceiling drifts with the VM's state too */
        if (!gbw || !gms || !gce) {
            s = tm_err(err, TM_ERR_NOMEM, "out of memory");
            goto probe_done;
        }
        if ((s = tm_membw_probe_create(e->runner->cfg.n_threads, (size_t)128 << 20, &probe, err)) != TM_OK) goto probe_done;
        probe_machine(probe, e, &gbw[0], probe_ceiling ? &gce[0] : NULL);
    }
    while (tm_engine_has_work(e)) {
        if (probe) { /* a warm-up step after each probe, untimed: the probe evicted the caches and let the
                      * workers fall asleep, which a real decode never sees */
            if ((s = tm_engine_step(e, err)) != TM_OK) goto probe_done;
            all_steps++;
            if (!tm_engine_has_work(e)) break;
        }
        double g0 = tm_time_s();
        int32_t k = 0;
        for (; k < TM_BW_GROUP && tm_engine_has_work(e); k++)
            if ((s = tm_engine_step(e, err)) != TM_OK) goto probe_done;
        double gt = tm_time_s() - g0;
        dec_time += gt;
        dec_steps += k;
        all_steps += k;
        if (probe) {
            gms[n_groups++] = gt / k * 1e3;
            probe_machine(probe, e, &gbw[n_groups], probe_ceiling ? &gce[n_groups] : NULL);
        }
    }
    if (dec_steps == 0) {
        s = tm_err(err, TM_ERR_INVALID, "--bw auto times the decode steps after a warm-up one: --output-len >= 3");
        goto probe_done;
    }
    t2 = t1 + dec_time; /* the decode steps' own time, without the probes */
probe_done:
    tm_membw_probe_free(probe);
    probe = NULL;
    if (s != TM_OK) goto done;
    double pp = (double)B * I / (t1 - t0), step_ms = (t2 - t1) / (double)dec_steps * 1e3;
    double tg = (double)B * (double)dec_steps / (t2 - t1);
    /* FLOPs (2 per MAC): matmuls per token, the output projection per logits row, attention per
     * (token, layer) over its context (QK and PV). The compute ceiling: gemm_ceiling's GEMM-shaped pass, run next
     * to every group with --bw auto (the best one reported), else three times after the decode. */
    const tm_hparams *hp = &m->hp;
    double qd = (double)hp->n_heads * hp->head_dim, kvd = (double)hp->n_kv_heads * hp->head_dim;
    double mm = (double)hp->n_layers * ((double)hp->dim * (2 * qd + 2 * kvd) + 3.0 * hp->dim * hp->ffn_dim);
    double out = (double)hp->n_vocab * hp->dim, attn_tok = 2.0 * qd * hp->n_layers; /* x context length */
    double pre_flops = 2.0 * ((double)B * I * mm + (double)B * out + (double)B * attn_tok * I * (I + 1) / 2.0);
    double avg_ctx = I + all_steps / 2.0;
    double step_flops = 2.0 * ((double)B * (mm + out) + (double)B * attn_tok * avg_ctx);
    double ceiling = 0.0;
    if (c->ceiling_gflop_s > 0) ceiling = c->ceiling_gflop_s * 1e9;
    else if (n_groups > 0 && probe_ceiling) /* the reported ceiling: the best probe */
        for (int32_t g = 0; g <= n_groups; g++) ceiling = gce[g] > ceiling ? gce[g] : ceiling;
    else ceiling = gemm_ceiling_best(e, 3);
    double comp_ms = step_flops / ceiling * 1e3;
    if (n_groups > 0) { /* each group against the floor at its own bandwidth and ceiling (gms: step ms -> %) */
        for (int32_t g = 0; g < n_groups; g++) {
            double gmem = (double)m->weight_bytes / (0.5 * (gbw[g] + gbw[g + 1]) * 1e9) * 1e3;
            double gcomp = probe_ceiling ? step_flops / (0.5 * (gce[g] + gce[g + 1])) * 1e3 : comp_ms;
            gms[g] = 100.0 * (gmem > gcomp ? gmem : gcomp) / gms[g];
        }
        qsort(gms, (size_t)n_groups, sizeof(double), cmp_double);
        qsort(gbw, (size_t)n_groups + 1, sizeof(double), cmp_double);
        bw_gb_s = gbw[(n_groups + 1) / 2]; /* the reported bandwidth: the median probe */
    }
    double mem_ms = bw_gb_s > 0 ? (double)m->weight_bytes / (bw_gb_s * 1e9) * 1e3 : 0.0;
    double floor_ms = mem_ms > comp_ms ? mem_ms : comp_ms;
    double pct = 100.0 * floor_ms / step_ms, pct_lo = pct, pct_hi = pct;
    if (n_groups > 0) { /* the median group */
        pct = gms[n_groups / 2];
        pct_lo = gms[0];
        pct_hi = gms[n_groups - 1];
    }
    if (c->json)
        printf("{\"model\": \"%s\", \"prefill_gflop_s\": %.2f, \"batch\": %d, \"input_len\": %d, \"output_len\": %d, \"threads\": %d, "
               "\"pp_tok_s\": %.2f, \"ceiling_gflop_s\": %.2f, \"step_gflop\": %.4f, \"tg_tok_s\": %.2f, \"step_ms\": %.3f, \"floor_mem_ms\": %.3f, "
               "\"floor_compute_ms\": %.3f, \"floor_ms\": %.3f, \"pct_of_floor\": %.1f, \"pct_of_floor_min\": %.1f, "
               "\"pct_of_floor_max\": %.1f, \"bw_groups\": %d, \"bound\": \"%s\", \"bw_gb_s\": %.2f}\n",
               m->name, pre_flops / (t1 - t0) / 1e9, B, I, O, e->runner->cfg.n_threads, pp, ceiling / 1e9, step_flops / 1e9, tg, step_ms, mem_ms, comp_ms,
               floor_ms, pct, pct_lo, pct_hi, n_groups, mem_ms >= comp_ms ? "memory" : "compute", bw_gb_s);
    else
        printf("batch %d: pp %.1f tok/s (%.1f GFLOP/s), tg %.1f tok/s, decode step %.2f ms (floor %.2f ms: memory %.2f, "
               "compute %.2f; %.0f%% of floor, %s bound)\n",
               B, pp, ceiling / 1e9, tg, step_ms, floor_ms, mem_ms, comp_ms, pct, mem_ms >= comp_ms ? "memory" : "compute");
    if (!c->json && n_groups > 0)
        printf("  bandwidth probed next to each of %d groups of %d steps: %% of floor per group %.0f (median), %.0f .. %.0f\n",
               n_groups, TM_BW_GROUP, pct, pct_lo, pct_hi);
done:
    free(gbw);
    free(gms);
    free(gce);
    free(prompts);
    tm_engine_free(e);
    tm_model_free(m);
    return s;
}
