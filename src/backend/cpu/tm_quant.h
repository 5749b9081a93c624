/* tm_quant.h -- reference dequantization and dot-product kernels for GGUF tensor types (CPU). */
#ifndef TM_QUANT_H
#define TM_QUANT_H

#include "core/tm_core.h"
#include "core/tm_dtype.h"

typedef enum tm_isa { TM_ISA_SCALAR = 0, TM_ISA_AVX2 = 1 } tm_isa;

/* Reference dequantization of n elements of type t (n a multiple of the block size) to f32. */
void tm_dequant_row(tm_dtype t, const void *src, float *dst, int64_t n);
/* Reference quantization of f32 to t (for tests and dummy weights); t in F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q4_K,Q6_K,Q8_1,Q8_K */
void tm_quant_row(tm_dtype t, const float *src, void *dst, int64_t n);

/* The dot-product recipe for a weight type: activations are converted to act_type once per row of x,
 * then vec_dot(n, w_row, act_row) gives sum_i w[i] * x[i]. */
typedef struct tm_quant_ops {
    tm_dtype wtype;
    tm_dtype act_type;                                        /* F32, Q8_0, Q8_1 or Q8_K */
    void (*from_float)(const float *x, void *y, int64_t n);   /* quantize one activation row */
    float (*vec_dot)(int64_t n, const void *w, const void *a); /* n elements */
} tm_quant_ops;

/* Ops for weight type t using the best ISA this CPU has (AVX2 unless TM_FORCE_SCALAR=1); NULL if unsupported. */
const tm_quant_ops *tm_quant_ops_get(tm_dtype t);
/* Ops for an explicit ISA (tests compare them); NULL if unsupported or the ISA is not compiled in. */
const tm_quant_ops *tm_quant_ops_get_isa(tm_dtype t, tm_isa isa);

#endif /* TM_QUANT_H */
