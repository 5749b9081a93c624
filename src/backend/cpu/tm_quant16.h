/* tm_quant16.h -- dot kernels with 16-bit activation blocks (Q16, Q16_K): near-fp32 accuracy on quantized weights. */
#ifndef TM_QUANT16_H
#define TM_QUANT16_H

#include "backend/cpu/tm_quant.h"

/* Activation quantizers: per block d = amax / 32767 (f32), qs = round-half-even(x / d) with the quotient in
 * double (so |x - d qs| <= d / 2 ~ amax / 65534), clamped to +-32767.
 * A block whose d is 0 (all zeros, or so tiny that amax / 32767 underflows) gets d = 0, qs = 0; a block
 * holding a NaN or an infinity gets d = NaN, qs = 0 (dots with it are NaN). The scalar and AVX2 versions
 * produce identical bytes. */
void tm_quant_act_q16(const float *x, void *y, int64_t n);   /* n a multiple of 32: n / 32 tm_block_q16 */
void tm_quant_act_q16_K(const float *x, void *y, int64_t n); /* n a multiple of 256: n / 256 tm_block_q16_K */

/* Ops with 16-bit activations for weight type t: Q4_0, Q4_1, Q8_0 -> act_type TM_DT_Q16; Q4_K, Q6_K ->
 * TM_DT_Q16_K; F32/F16/BF16 -> the f32-activation ops of tm_quant_ops_get(t) (already exact). NULL if
 * unsupported. vec_dot is exact integer arithmetic per block (per sub-block for K-quants) scaled in f32:
 *   Q8_0: d_w d_a sum(q_w q_a)            Q4_0: d_w d_a (sum(q_w q_a) - 8 sum_a)
 *   Q4_1: d_w d_a sum(q_w q_a) + m_w d_a sum_a
 *   Q4_K: d_a (d sc_j sum_j(q q_a) - dmin m_j bsums_j)   Q6_K: d_a d sc_k (sum_k(q q_a) - 32 bsums_k)
 * mat_dot is never NULL. The AVX2 and scalar tables give the same integer sums (f32 order may differ). */
const tm_quant_ops *tm_quant16_ops_get(tm_dtype t); /* best ISA (AVX2 unless TM_FORCE_SCALAR=1) */
const tm_quant_ops *tm_quant16_ops_get_isa(tm_dtype t, tm_isa isa);

/* out[j] = dot(w_row, act row j) for j = 0..nr-1, activation rows act_stride bytes apart, 1 <= nr <= 8.
 * Each weight block is unpacked once for all nr rows; results are bit-identical to the AVX2 vec_dot. */
typedef void (*tm_vec_dot_multi_fn)(int64_t n, const void *w, const void *act, size_t act_stride, int nr, float *out);
#define TM_QUANT16_MULTI_MAX 8
tm_vec_dot_multi_fn tm_quant16_multi_get(tm_dtype t); /* AVX2 only; NULL when not available */

/* The decode layout ("x4"): a weight's rows in groups of four, and within a group the blocks of its four rows
 * interleaved. Q8_0/Q4_0/Q4_1 (32-element blocks): four blocks at a time -- for each run of four blocks: row 0's
 * four, row 1's, row 2's, row 3's; then the row tails (nb % 4 blocks each) one row after another. Q4_K
 * (256-element super-blocks): super-block i of rows 0, 1, 2, 3, then super-block i + 1. A group is
 * 4 x row_bytes, so the whole weight keeps its size, and decode's four-row kernels read one sequential stream
 * (four separate row streams defeat the hardware prefetcher). For those types when the rows divide by 4. */
bool tm_quant16_x4_eligible(tm_dtype t, int64_t rows, int64_t cols);
void tm_quant16_x4_pack(tm_dtype t, int64_t rows, int64_t cols, const void *src, void *dst);
/* out[c * 4 + k] = dot(row 4g + k of the packed weight, activation row c) for the group at `group` and nr = 1 or
 * 2 activation rows act_stride bytes apart: bit-identical to the AVX2 vec_dot of each pair (the same float
 * operations in the same order). */
typedef void (*tm_vec_dot_x4_fn)(int64_t n, const void *group, const void *act, size_t act_stride, int nr, float *out);
#define TM_QUANT16_X4_MAX_ROWS 2
/* Prefill over an x4 weight: out[c] = dot(row k (0..3) of the group at `group`, activation row c) for 1 <= nr <= 8,
 * the multi-row kernel reading the row's blocks where the layout puts them (bit-identical to vec_dot too). */
typedef void (*tm_vec_dot_x4row_fn)(int64_t n, const void *group, int k, const void *act, size_t act_stride, int nr,
                                    float *out);
tm_vec_dot_x4_fn tm_quant16_x4_get(tm_dtype t); /* AVX2 only; NULL when not available */

/* Internal: the AVX2 tables (tm_quant16_avx2.c); only valid after tm_cpu_use_avx2(). NULL if not built for x86. */
const tm_quant_ops *tm_quant16_ops_avx2(tm_dtype t);
tm_vec_dot_multi_fn tm_quant16_multi_avx2(tm_dtype t);
tm_vec_dot_x4_fn tm_quant16_x4_avx2(tm_dtype t);
tm_vec_dot_x4row_fn tm_quant16_x4row_avx2(tm_dtype t);

#endif /* TM_QUANT16_H */
