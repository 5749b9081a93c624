/* tm_dtype.h -- tensor element types (numbered as in GGUF) and their block layouts. */
#ifndef TM_DTYPE_H
#define TM_DTYPE_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Values are GGUF's ggml_type numbers. */
typedef enum tm_dtype {
    TM_DT_F32 = 0,
    TM_DT_F16 = 1,
    TM_DT_Q4_0 = 2,
    TM_DT_Q4_1 = 3,
    TM_DT_Q5_0 = 6,
    TM_DT_Q5_1 = 7,
    TM_DT_Q8_0 = 8,
    TM_DT_Q8_1 = 9,
    TM_DT_Q2_K = 10,
    TM_DT_Q3_K = 11,
    TM_DT_Q4_K = 12,
    TM_DT_Q5_K = 13,
    TM_DT_Q6_K = 14,
    TM_DT_Q8_K = 15,
    TM_DT_I8 = 24,
    TM_DT_I16 = 25,
    TM_DT_I32 = 26,
    TM_DT_I64 = 27,
    TM_DT_F64 = 28,
    TM_DT_BF16 = 30,
    /* internal activation formats (never valid in a file): 16-bit integer blocks for precise dots */
    TM_DT_FIRST_INTERNAL = 64,
    TM_DT_Q16 = 64,   /* tm_block_q16: 32 elements */
    TM_DT_Q16_K = 65, /* tm_block_q16_K: 256 elements, for K-quant weights */
    TM_DT_FP8_E4M3 = 66, /* OCP fp8 e4m3 (1 sign, 4 exponent, 3 mantissa bits, max 448): the KV cache's 8-bit type */
    TM_DT_COUNT = 67,
} tm_dtype;

typedef struct tm_dtype_info {
    const char *name;   /* "q4_1"; NULL when the number is not a known type */
    uint32_t block;     /* elements per block */
    uint32_t bytes;     /* bytes per block */
} tm_dtype_info;

/* Known layout for t (including ones tokenmill cannot compute with, and internal activation formats),
 * or NULL for an unknown number. Files may only use numbers below TM_DT_FIRST_INTERNAL. */
const tm_dtype_info *tm_dtype_get(uint32_t t);
/* True for the types that have dequantization and dot kernels. */
bool tm_dtype_supported(uint32_t t);
const char *tm_dtype_name(uint32_t t); /* "unknown" for unknown numbers */
/* Bytes of a row of n elements; 0 if n is not a multiple of the block or the type is unknown. */
uint64_t tm_dtype_row_bytes(uint32_t t, uint64_t n);

/* The scales a TM_DT_FP8_E4M3 weight needs (tm_weight in backend/backend.h): a positive finite weight scale and a
 * power-of-two activation scale (so that x / act_scale is exact). */
static inline bool tm_fp8_scales_ok(float scale, float act_scale) {
    int e;
    return isfinite(scale) && scale > 0.0f && isfinite(act_scale) && act_scale > 0.0f && frexpf(act_scale, &e) == 0.5f;
}

/* Block layouts (identical to GGUF's). QK = elements per block. */
#define TM_QK4_0 32
#define TM_QK4_1 32
#define TM_QK8_0 32
#define TM_QK8_1 32
#define TM_QK_K 256
#define TM_K_SCALE_SIZE 12

typedef struct { uint16_t d; uint8_t qs[TM_QK4_0 / 2]; } tm_block_q4_0;              /* 18 B */
typedef struct { uint16_t d, m; uint8_t qs[TM_QK4_1 / 2]; } tm_block_q4_1;           /* 20 B */
typedef struct { uint16_t d; int8_t qs[TM_QK8_0]; } tm_block_q8_0;                   /* 34 B */
typedef struct { uint16_t d, s; int8_t qs[TM_QK8_1]; } tm_block_q8_1;                /* 36 B: s = d*sum(qs) */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[TM_K_SCALE_SIZE];
    uint8_t qs[TM_QK_K / 2];
} tm_block_q4_K;                                                                     /* 144 B */
typedef struct {
    uint8_t ql[TM_QK_K / 2];
    uint8_t qh[TM_QK_K / 4];
    int8_t scales[TM_QK_K / 16];
    uint16_t d;
} tm_block_q6_K;                                                                     /* 210 B */
typedef struct {
    float d;
    int8_t qs[TM_QK_K];
    int16_t bsums[TM_QK_K / 16];
} tm_block_q8_K;                                                                     /* 292 B */

/* 16-bit activation blocks: x[i] ~= d * qs[i] with |qs| <= 32767 (relative error ~1.5e-5 of the block
 * max, against ~4e-3 for 8-bit blocks). Sums let dots with offset/min weight formats stay exact integers. */
typedef struct { float d; int32_t sum; int16_t qs[32]; } tm_block_q16;               /* 72 B: sum = sum(qs) */
typedef struct {
    float d;
    int16_t qs[TM_QK_K];
    int32_t bsums[TM_QK_K / 16];                                                      /* sums of qs per 16 */
} tm_block_q16_K;                                                                    /* 580 B */

#endif /* TM_DTYPE_H */
