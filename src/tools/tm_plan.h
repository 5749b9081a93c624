/* tm_plan.h -- the KV/memory planner: budget − weights − activation workspace = KV pool, in blocks and requests. */
#ifndef TM_PLAN_H
#define TM_PLAN_H

#include "core/tm_core.h"
#include "core/tm_dtype.h"
#include "model/tm_model.h"

typedef struct tm_plan_opts {
    uint64_t mem_bytes;       /* total memory budget (weights + workspace + KV) */
    int64_t ctx;              /* tokens per request (prompt + output) */
    tm_dtype kv_dtype;        /* TM_DT_F16, TM_DT_BF16, TM_DT_F32 or TM_DT_FP8_E4M3 */
    int32_t block_size;       /* tokens per KV block */
    int32_t workspace_tokens; /* tokens per forward pass (sizes the activation workspace) */
} tm_plan_opts;

typedef struct tm_plan {
    /* KV bytes per token = 2 (K,V) × n_layers × n_kv_heads × head_dim × kv_elem_bytes */
    uint64_t kv_elem_bytes;
    uint64_t kv_bytes_per_token;
    char kv_formula[192];          /* the product above with this model's numbers */
    uint64_t mem_bytes;            /* the budget (copied from the options) */
    uint64_t weight_bytes;         /* as given */
    uint64_t workspace_floats_per_token; /* f32 elements per token of the forward pass's buffers */
    uint64_t workspace_bytes;      /* workspace_floats_per_token × 4 × workspace_tokens */
    uint64_t kv_budget_bytes;      /* mem − weights − workspace */
    uint64_t block_bytes;          /* block_size × kv_bytes_per_token */
    uint64_t n_blocks;             /* floor(kv_budget / block_bytes) */
    uint64_t kv_tokens;            /* n_blocks × block_size: tokens the pool holds */
    uint64_t unused_bytes;         /* kv_budget − n_blocks × block_bytes (less than one block) */
    uint64_t blocks_per_seq;       /* ceil(ctx / block_size) */
    uint64_t bytes_per_seq;        /* blocks_per_seq × block_bytes: KV reserved by one ctx-token request */
    uint64_t max_seqs;             /* floor(n_blocks / blocks_per_seq): ctx-token requests that fit at once */
} tm_plan;

/* Defaults: f16 KV, 16-token blocks, 512 tokens per forward pass; mem_bytes and ctx are 0 (must be set). */
tm_plan_opts tm_plan_opts_default(void);

/* Plan the KV pool for a model of shape hp whose weights take weight_bytes. Fails with TM_ERR_INVALID on
 * bad options or shape, TM_ERR_RANGE (message naming the budget, weights and workspace) when the budget
 * does not cover weights + workspace, TM_ERR_RANGE on arithmetic overflow. Prints nothing. */
tm_status tm_plan_compute(const tm_hparams *hp, uint64_t weight_bytes, const tm_plan_opts *o, tm_plan *out,
                          tm_error *err);

/* Bytes of the weights the forward pass reads for a llama-layout model of shape hp with matrices (and the
 * token embedding) in type wtype and norms in f32 — the layout of dummy models ("dummy:NAME[:TYPE]"); with wtype
 * TM_DT_FP8_E4M3 only the layers' linears are fp8 and the embedding and output projection bf16 (dummy:NAME:fp8).
 * Fails when a row length is not a multiple of wtype's block, or on overflow. */
tm_status tm_plan_dense_weight_bytes(const tm_hparams *hp, tm_dtype wtype, uint64_t *out, tm_error *err);

/* Parse a memory size: plain bytes ("1048576") or a number with a unit, case-insensitive: B; K, KB, M, MB,
 * G, GB, T, TB (powers of 1000); KiB, MiB, GiB, TiB (powers of 1024). A fraction is allowed with a unit
 * ("1.5GB", at most 6 decimals; the result is floored to whole bytes). Zero, signs, spaces, exponents,
 * unknown units and overflow are refused. */
tm_status tm_plan_parse_size(const char *s, uint64_t *out, tm_error *err);

/* The `tokenmill plan` command: argv[0] is the program, argv[1] "plan", options from argv[2]. Returns the
 * exit status (0 ok, 1 planning/model error, 2 usage error). */
int tm_cmd_plan(int argc, char **argv);

#endif /* TM_PLAN_H */
