/* tm_cpu_kernels.h -- row kernels of the CPU backend: norms, RoPE, online-softmax attention, SwiGLU. */
#ifndef TM_CPU_KERNELS_H
#define TM_CPU_KERNELS_H

#include "core/tm_core.h"

/* out = x / rms(x) * w ; x, w, out (dim) */
void tm_cpu_rmsnorm_row(const float *x, const float *w, float eps, int32_t dim, float *out);
/* res += x ; out = res / rms(res) * w   (one pass over res) */
void tm_cpu_add_rmsnorm_row(float *res, const float *x, const float *w, float eps, int32_t dim, float *out);
/* rotate one head in place; cs = (half) interleaved cos, sin. neox: pairs (i, i+half), else (2i, 2i+1) */
void tm_cpu_rope_head(float *x, const float *cs, int32_t half, bool neox);
/* out[i] = silu(g[i]) * u[i]  (out may alias g) */
void tm_cpu_swiglu(const float *g, const float *u, float *out, int64_t n);

/* Online softmax over key/value blocks (FlashAttention's recurrence, exact). */
typedef struct tm_cpu_attn_state {
    float m;      /* running max of scores */
    float l;      /* running sum of exp(score - m) */
    float *acc;   /* (head_dim) running sum of exp(score - m) * v, the output buffer */
    int32_t hd;
} tm_cpu_attn_state;
void tm_cpu_attn_begin(tm_cpu_attn_state *st, float *out, int32_t hd);
/* keys/values: (cnt, hd) contiguous; scores: scratch of cnt floats */
void tm_cpu_attn_block(tm_cpu_attn_state *st, const float *q, const float *k, const float *v, int32_t cnt, int32_t hd,
                       float scale, float *scores);
void tm_cpu_attn_end(tm_cpu_attn_state *st);
/* fold the state of the keys that follow st's (p) into st: st ends as if it had seen both key ranges */
void tm_cpu_attn_merge(tm_cpu_attn_state *st, const tm_cpu_attn_state *p);

/* AVX2/FMA versions (tm_cpu_kernels_avx2.c); call only when tm_cpu_use_avx2(). */
void tm_cpu_rmsnorm_row_avx2(const float *x, const float *w, float eps, int32_t dim, float *out);
void tm_cpu_add_rmsnorm_row_avx2(float *res, const float *x, const float *w, float eps, int32_t dim, float *out);
void tm_cpu_swiglu_avx2(const float *g, const float *u, float *out, int64_t n);
void tm_cpu_attn_block_avx2(tm_cpu_attn_state *st, const float *q, const float *k, const float *v, int32_t cnt,
                            int32_t hd, float scale, float *scores);

/* n fp8 e4m3 bytes -> f32, exactly (NaN stays NaN); the AVX2 version widens through F16C */
void tm_cpu_fp8_to_f32(const uint8_t *x, float *out, int64_t n);
void tm_cpu_fp8_to_f32_avx2(const uint8_t *x, float *out, int64_t n);
/* IEEE f16 <-> f32 (the f16 KV cache): widening is exact; narrowing rounds to nearest even (overflow to inf), the
 * AVX2 versions (F16C) give the scalar ones' bits for every non-NaN value */
void tm_cpu_f16_to_f32(const uint16_t *x, float *out, int64_t n);
void tm_cpu_f16_to_f32_avx2(const uint16_t *x, float *out, int64_t n);
void tm_cpu_f32_to_f16(const float *x, void *out, int64_t n);
void tm_cpu_f32_to_f16_avx2(const float *x, void *out, int64_t n);

/* The row kernels one backend uses, chosen once at creation. */
typedef struct tm_cpu_kernel_table {
    void (*rmsnorm_row)(const float *x, const float *w, float eps, int32_t dim, float *out);
    void (*add_rmsnorm_row)(float *res, const float *x, const float *w, float eps, int32_t dim, float *out);
    void (*swiglu)(const float *g, const float *u, float *out, int64_t n);
    void (*attn_block)(tm_cpu_attn_state *st, const float *q, const float *k, const float *v, int32_t cnt, int32_t hd,
                       float scale, float *scores);
    void (*fp8_to_f32)(const uint8_t *x, float *out, int64_t n);
    void (*f16_to_f32)(const uint16_t *x, float *out, int64_t n);
    void (*f32_to_f16)(const float *x, void *out, int64_t n);
} tm_cpu_kernel_table;
tm_cpu_kernel_table tm_cpu_kernels_select(bool avx2);

#endif /* TM_CPU_KERNELS_H */
