/* tm_plan.c -- the KV/memory planner's arithmetic (no printing): KV bytes per token, workspace, blocks, requests. */
#include "tm_plan.h"

#include <ctype.h>
#include <stdio.h>

tm_plan_opts tm_plan_opts_default(void) {
    tm_plan_opts o = {0};
    o.kv_dtype = TM_DT_F16;
    o.block_size = 16;
    o.workspace_tokens = 512;
    return o;
}

static tm_status check_shape(const tm_hparams *hp, tm_error *err) {
    if (hp->n_vocab < 1 || hp->dim < 1 || hp->n_layers < 1 || hp->n_heads < 1 || hp->n_kv_heads < 1 ||
        hp->head_dim < 1 || hp->ffn_dim < 1)
        return tm_err(err, TM_ERR_INVALID, "bad model shape (vocab %d, dim %d, layers %d, heads %d/%d, head_dim %d, ffn %d)",
                      hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->ffn_dim);
    return TM_OK;
}

/* a = a * b, false on overflow */
static bool mul_in(uint64_t *a, uint64_t b) { return tm_mul_u64(*a, b, a); }
static bool add_in(uint64_t *a, uint64_t b) { return tm_add_u64(*a, b, a); }

tm_status tm_plan_compute(const tm_hparams *hp, uint64_t weight_bytes, const tm_plan_opts *o, tm_plan *out,
                          tm_error *err) {
    memset(out, 0, sizeof *out);
    tm_status s = check_shape(hp, err);
    if (s != TM_OK) return s;
    if (o->kv_dtype != TM_DT_F16 && o->kv_dtype != TM_DT_BF16 && o->kv_dtype != TM_DT_F32 && o->kv_dtype != TM_DT_FP8_E4M3)
        return tm_err(err, TM_ERR_INVALID, "unsupported KV cache type '%s' (f16, bf16, f32 or fp8)", tm_dtype_name(o->kv_dtype));
    if (o->mem_bytes == 0) return tm_err(err, TM_ERR_INVALID, "memory budget must be positive");
    if (o->ctx < 1) return tm_err(err, TM_ERR_INVALID, "context length must be at least 1 token (got %lld)", (long long)o->ctx);
    if (o->block_size < 1) return tm_err(err, TM_ERR_INVALID, "block size must be at least 1 token (got %d)", o->block_size);
    if (o->workspace_tokens < 1)
        return tm_err(err, TM_ERR_INVALID, "workspace needs at least 1 token per pass (got %d)", o->workspace_tokens);

    /* KV bytes per token: 2 (K and V) × layers × kv heads × head_dim × element size */
    uint64_t elem = tm_dtype_row_bytes(o->kv_dtype, 1);
    uint64_t per_tok = 2;
    if (!mul_in(&per_tok, (uint64_t)hp->n_layers) || !mul_in(&per_tok, (uint64_t)hp->n_kv_heads) ||
        !mul_in(&per_tok, (uint64_t)hp->head_dim) || !mul_in(&per_tok, elem))
        return tm_err(err, TM_ERR_RANGE, "KV bytes per token overflow");
    out->kv_elem_bytes = elem;
    out->kv_bytes_per_token = per_tok;
    snprintf(out->kv_formula, sizeof out->kv_formula,
             "2 (K,V) x %d layers x %d kv_heads x %d head_dim x %llu B (%s) = %llu B", hp->n_layers, hp->n_kv_heads,
             hp->head_dim, (unsigned long long)elem, tm_dtype_name(o->kv_dtype), (unsigned long long)per_tok);

    /* Activation workspace, as tm_workspace_init allocates it (f32 on every backend today):
     * x, xb, proj, hsel (dim); q, att (n_heads*hd); k, v (n_kv*hd); hb, hb2 (ffn); logits (n_vocab). */
    uint64_t qd = (uint64_t)hp->n_heads * (uint64_t)hp->head_dim, kvd = (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim;
    uint64_t floats = 4 * (uint64_t)hp->dim + 2 * qd + 2 * kvd + 2 * (uint64_t)hp->ffn_dim + (uint64_t)hp->n_vocab;
    uint64_t ws = floats;
    if (!mul_in(&ws, sizeof(float)) || !mul_in(&ws, (uint64_t)o->workspace_tokens))
        return tm_err(err, TM_ERR_RANGE, "workspace size overflow");
    out->workspace_floats_per_token = floats;
    out->workspace_bytes = ws;
    out->weight_bytes = weight_bytes;
    out->mem_bytes = o->mem_bytes;

    uint64_t fixed = weight_bytes;
    if (!add_in(&fixed, ws) || fixed > o->mem_bytes)
        return tm_err(err, TM_ERR_RANGE,
                      "memory budget %llu B (%.2f GB) is smaller than weights %llu B (%.2f GB) + activation workspace "
                      "%llu B (%.2f GB)",
                      (unsigned long long)o->mem_bytes, (double)o->mem_bytes / 1e9, (unsigned long long)weight_bytes,
                      (double)weight_bytes / 1e9, (unsigned long long)ws, (double)ws / 1e9);
    out->kv_budget_bytes = o->mem_bytes - fixed;

    uint64_t bb = per_tok;
    if (!mul_in(&bb, (uint64_t)o->block_size)) return tm_err(err, TM_ERR_RANGE, "KV block size overflow");
    out->block_bytes = bb;
    out->n_blocks = out->kv_budget_bytes / bb;
    out->unused_bytes = out->kv_budget_bytes - out->n_blocks * bb; /* n_blocks * bb <= kv_budget: no overflow */
    out->kv_tokens = out->n_blocks;
    if (!mul_in(&out->kv_tokens, (uint64_t)o->block_size)) return tm_err(err, TM_ERR_RANGE, "KV token count overflow");

    out->blocks_per_seq = ((uint64_t)o->ctx + (uint64_t)o->block_size - 1) / (uint64_t)o->block_size;
    out->bytes_per_seq = out->blocks_per_seq;
    if (!mul_in(&out->bytes_per_seq, bb)) return tm_err(err, TM_ERR_RANGE, "bytes per request overflow");
    out->max_seqs = out->n_blocks / out->blocks_per_seq;
    return TM_OK;
}

/* bytes of a (rows, cols) matrix of type t; false when cols is not a whole number of blocks, or on overflow */
static bool matrix_bytes(tm_dtype t, uint64_t rows, uint64_t cols, uint64_t *acc) {
    uint64_t rb = tm_dtype_row_bytes(t, cols);
    return rb != 0 && tm_mul_u64(rb, rows, &rb) && tm_add_u64(*acc, rb, acc);
}

tm_status tm_plan_dense_weight_bytes(const tm_hparams *hp, tm_dtype wtype, uint64_t *out, tm_error *err) {
    *out = 0;
    tm_status s = check_shape(hp, err);
    if (s != TM_OK) return s;
    uint64_t dim = (uint64_t)hp->dim, ffn = (uint64_t)hp->ffn_dim, vocab = (uint64_t)hp->n_vocab;
    uint64_t qd = (uint64_t)hp->n_heads * (uint64_t)hp->head_dim, kvd = (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim;
    /* one layer: attn_norm, ffn_norm (f32); wq, wk, wv (rows, dim); wo (dim, qd); gate, up (ffn, dim); down (dim, ffn) */
    uint64_t layer = 0;
    bool ok = matrix_bytes(TM_DT_F32, 2, dim, &layer) && matrix_bytes(wtype, qd + 2 * kvd, dim, &layer) &&
              matrix_bytes(wtype, dim, qd, &layer) && matrix_bytes(wtype, 2 * ffn, dim, &layer) &&
              matrix_bytes(wtype, dim, ffn, &layer);
    /* token embedding (vocab, dim), output_norm (f32), output (vocab, dim) unless tied to the embedding; fp8 models
     * keep these two bf16 (as FP8 checkpoints and fp8 dummies do) */
    const tm_dtype et = wtype == TM_DT_FP8_E4M3 ? TM_DT_BF16 : wtype;
    uint64_t total = layer;
    ok = ok && mul_in(&total, (uint64_t)hp->n_layers) && matrix_bytes(et, vocab, dim, &total) &&
         matrix_bytes(TM_DT_F32, 1, dim, &total) && (hp->tied_embeddings || matrix_bytes(et, vocab, dim, &total));
    if (!ok)
        return tm_err(err, TM_ERR_INVALID, "cannot size %s weights for dim %d / ffn %d / q %llu (not whole blocks, or overflow)",
                      tm_dtype_name(wtype), hp->dim, hp->ffn_dim, (unsigned long long)qd);
    *out = total;
    return TM_OK;
}

tm_status tm_plan_parse_size(const char *s, uint64_t *out, tm_error *err) {
    *out = 0;
    if (!s || !*s) return tm_err(err, TM_ERR_INVALID, "empty memory size");
    const char *p = s;
    uint64_t ip = 0, frac = 0, frac_div = 1;
    int n_int = 0, n_frac = 0;
    for (; isdigit((unsigned char)*p); p++, n_int++)
        if (!tm_mul_u64(ip, 10, &ip) || !tm_add_u64(ip, (uint64_t)(*p - '0'), &ip))
            return tm_err(err, TM_ERR_INVALID, "memory size '%s' is too large", s);
    bool has_point = *p == '.';
    if (has_point)
        for (p++; isdigit((unsigned char)*p); p++, n_frac++) {
            if (n_frac == 6) return tm_err(err, TM_ERR_INVALID, "memory size '%s' has more than 6 decimals", s);
            frac = frac * 10 + (uint64_t)(*p - '0');
            frac_div *= 10;
        }
    if (n_int == 0 && n_frac == 0)
        return tm_err(err, TM_ERR_INVALID, "bad memory size '%s' (expected e.g. 80GB, 80GiB, 512MiB or bytes)", s);
    if (has_point && n_frac == 0)
        return tm_err(err, TM_ERR_INVALID, "bad memory size '%s' (digits expected after the point)", s);

    static const struct { const char *name; uint64_t mult; } units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1000ull},
        {"kb", 1000ull},
        {"kib", 1ull << 10},
        {"m", 1000000ull},
        {"mb", 1000000ull},
        {"mib", 1ull << 20},
        {"g", 1000000000ull},
        {"gb", 1000000000ull},
        {"gib", 1ull << 30},
        {"t", 1000000000000ull},
        {"tb", 1000000000000ull},
        {"tib", 1ull << 40},
    };
    uint64_t mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0] && !mult; i++) {
        const char *u = units[i].name, *q = p;
        while (*u && *q && tolower((unsigned char)*q) == *u) u++, q++;
        if (!*u && !*q) mult = units[i].mult;
    }
    if (!mult)
        return tm_err(err, TM_ERR_INVALID, "unknown unit in memory size '%s' (B, KB, MB, GB, TB = powers of 1000; "
                      "KiB, MiB, GiB, TiB = powers of 1024)", s);
    if (has_point && mult == 1)
        return tm_err(err, TM_ERR_INVALID, "memory size '%s': a byte count must be a whole number", s);
    uint64_t v = ip, f = frac;
    /* frac < 10^6 and mult <= 2^40, so frac * mult < 2^60: no overflow */
    if (!tm_mul_u64(v, mult, &v) || !tm_add_u64(v, f * mult / frac_div, &v))
        return tm_err(err, TM_ERR_INVALID, "memory size '%s' is too large", s);
    if (v == 0) return tm_err(err, TM_ERR_INVALID, "memory size '%s' must be positive", s);
    *out = v;
    return TM_OK;
}
