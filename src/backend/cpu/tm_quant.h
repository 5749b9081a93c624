/* tm_quant.h -- reference dequantization and dot-product kernels for GGUF tensor types (CPU). */
#ifndef TM_QUANT_H
#define TM_QUANT_H

#include "core/tm_core.h"
#include "core/tm_dtype.h"

typedef enum tm_isa { TM_ISA_SCALAR = 0, TM_ISA_AVX2 = 1 } tm_isa;

/* Reference dequantization of n elements of type t (n a multiple of the block size) to f32. FP8_E4M3 gives the
 * e4m3 values themselves: an fp8 weight's per-tensor scale (tm_weight.scale) is for the caller to apply. */
void tm_dequant_row(tm_dtype t, const void *src, float *dst, int64_t n);
/* Reference quantization of f32 to t (for tests and dummy weights); t in F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q4_K,Q6_K,Q8_1,
 * Q8_K,FP8_E4M3 (tm_fp8_from_f32 of each value: divide by the weight's scale first). There are no dot-product ops
 * (tm_quant_ops) for FP8_E4M3: the CPU backend computes fp8 weights (W8A8) on its own path. */
void tm_quant_row(tm_dtype t, const float *src, void *dst, int64_t n);

/* The dot-product recipe for a weight type: activations are converted to act_type once per row of x,
 * then vec_dot(n, w_row, act_row) gives sum_i w[i] * x[i]. */
typedef struct tm_quant_ops {
    tm_dtype wtype;
    tm_dtype act_type;                                        /* F32, Q8_0, Q8_1 or Q8_K */
    void (*from_float)(const float *x, void *y, int64_t n);   /* quantize one activation row */
    float (*vec_dot)(int64_t n, const void *w, const void *a); /* n elements */
    /* Many dots at once (never NULL): out[c * out_stride + r] = dot(w row r, act row c) for r < nr, c < nc.
     * Weight rows are w_stride bytes apart, activation rows a_stride bytes apart, out_stride counts floats.
     * Results equal vec_dot's up to float summation order. Faster than nr*nc vec_dot calls:
     *  - decode (nc == 1): weight rows are read strictly in memory order (one prefetch-friendly stream);
     *    Q8_0/Q4_0/Q4_1 do four rows per pass with one combined reduction and no per-row call;
     *  - prefill (nc > 1, quantized types): 1 weight row x 4 activation rows tiles, each weight block
     *    unpacked once for four tokens, activation rows taken in chunks that stay in L2.
     * Give each thread a slice of rows (r) and all columns: it reads only its own share of the weights. */
    void (*mat_dot)(int64_t n, int64_t nr, const void *w, size_t w_stride, int64_t nc, const void *a, size_t a_stride,
                    float *out, size_t out_stride);
} tm_quant_ops;

/* Ops for weight type t using the best ISA this CPU has (AVX2 unless TM_FORCE_SCALAR=1); NULL if unsupported.
 * This runs tm_cpu_use_avx2() (CPUID + getenv) on every call -- about 14 us inside a VM, where CPUID traps:
 * resolve the ops once per weight (or the ISA once per backend, then tm_quant_ops_get_isa), never per matmul. */
const tm_quant_ops *tm_quant_ops_get(tm_dtype t);
/* Ops for an explicit ISA (tests compare them); NULL if unsupported or the ISA is not compiled in. Does not
 * check the CPU: TM_ISA_AVX2 ops may only be called when tm_cpu_use_avx2() is true. */
const tm_quant_ops *tm_quant_ops_get_isa(tm_dtype t, tm_isa isa);

/* The decode layout for 8-bit activations ("x4"; Q8_0/Q4_0/Q4_1/Q4_K with rows % 4 == 0: tm_quant16_x4_eligible):
 * rows in groups of four (a group is 4 x row_bytes, so the copy keeps the weight's size); a group holds
 * nb / 4 runs of 16 blocks (blocks 4q .. 4q + 3 of its four rows), then the row tails (nb % 4 blocks each, in
 * the blocks' own format) one row after another. A run is its 16 blocks' scales (fp16 d, or d and m for Q4_1:
 * row 0's four blocks, row 1's, row 2's, row 3's), then their quants in the same order: Q8_0 the 32 bytes of
 * each block; Q4_0/Q4_1 32 bytes per pair of blocks (2p, 2p + 1), byte i holding element i of block 2p in its
 * low nibble and element i of block 2p + 1 in its high nibble (i < 32, element order as dequantized). So a
 * row's four scales are one load and a 32-byte load with a mask and a shift gives two blocks' quants, and the
 * four-row decode kernel reads one sequential stream. (tm_quant16_x4_pack's layout for 16-bit activations
 * keeps the blocks whole.) Q4_K (256-element super-blocks): super-block i of rows 0, 1, 2, 3, then i + 1 (as
 * tm_quant16_x4_pack). */
void tm_quant_x4_pack(tm_dtype t, int64_t rows, int64_t cols, const void *src, void *dst);
/* mat_dot over a weight in the 8-bit decode layout (tm_quant_x4_pack):
 * out[c * out_stride + r] = dot(row r, act row c) for r < nr (a multiple of 4; w points at a group, rows
 * start there), c < nc. nc <= 2 (decode) runs a fused kernel over each group's four rows: each activation
 * block is loaded once for them and the weights are read as one sequential stream; nc > 2 (prefill) runs
 * mat_dot's tiles reading each row where the layout puts it. Bit-identical to vec_dot and mat_dot. */
typedef void (*tm_mat_dot_x4_fn)(int64_t n, int64_t nr, const void *w, int64_t nc, const void *a, size_t a_stride,
                                 float *out, size_t out_stride);
tm_mat_dot_x4_fn tm_quant_x4_get(tm_dtype t); /* Q8_0, Q4_0, Q4_1, Q4_K with AVX2; NULL otherwise */

/* Internal: the AVX2 tables (tm_quant_avx2.c); only valid after tm_cpu_use_avx2(). NULL if not built for x86. */
const tm_quant_ops *tm_quant_ops_avx2(tm_dtype t);
tm_mat_dot_x4_fn tm_quant_x4_avx2(tm_dtype t);

/* Activation quantizers (the from_float of the scalar tables; the AVX2 ones produce identical bytes).
 * Q8_0/Q8_1 round like ggml's SIMD quantize_row_q8_0/q8_1 (x * 127/amax, half to even; Q8_1's s is
 * fp16(d * sum(q)) with the unrounded d), Q8_K like ggml's quantize_row_q8_K_ref. tm_quant_row uses
 * ggml's reference rounding for the weight types (Q8_0: x / d, half away from zero) so its bytes match
 * gguf-py's quantizer; for Q8_K it equals tm_quant_act_q8_K. */
void tm_quant_act_q8_0(const float *x, void *y, int64_t n);
void tm_quant_act_q8_1(const float *x, void *y, int64_t n);
void tm_quant_act_q8_K(const float *x, void *y, int64_t n);

/* Generic many-dot loop over a vec_dot (the scalar tables' mat_dot). */
#define TM_GENERIC_MAT_DOT(name, dot)                                                                          \
    static void name(int64_t n, int64_t nr, const void *w, size_t w_stride, int64_t nc, const void *a,         \
                     size_t a_stride, float *out, size_t out_stride) {                                        \
        for (int64_t c = 0; c < nc; c++)                                                                       \
            for (int64_t r = 0; r < nr; r++)                                                                   \
                out[(size_t)c * out_stride + (size_t)r] =                                                      \
                    dot(n, (const uint8_t *)w + (size_t)r * w_stride, (const uint8_t *)a + (size_t)c * a_stride); \
    }

/* The entry for weight type t in an ops table of n entries, or NULL. */
static inline const tm_quant_ops *tm_quant_ops_find(const tm_quant_ops *tab, size_t n, tm_dtype t) {
    for (size_t i = 0; i < n; i++)
        if (tab[i].wtype == t) return &tab[i];
    return NULL;
}

#endif /* TM_QUANT_H */
