/* tm_cuda_attn_decode.cu -- paged FlashDecoding: one query token per sequence, split-KV across CTAs, merge pass. */
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Decode attention over the paged cache (n_tokens == n_seqs, token i is sequence i's newest entry and attends to
 * cache entries 0 .. context_len[i] - 1). Cache per layer: (n_blocks, n_kv_heads, block_size, head_dim) bf16, or
 * fp8 e4m3 bytes (kv_fp8: v3 and v1 read it; v2 is bf16 only, so an fp8 cache that v3 cannot take goes to v1);
 * logical block j of sequence s is block_table[s * max_blocks + j]. Three kernels behind one launcher;
 * TM_CUDA_ATTN_DECODE_V=1 or 2 forces the simpler ones, TM_CUDA_ATTN_DECODE_SPLITS=n forces the split count
 * (tests; clamped to what the work buffer holds).
 *
 * v1 -- simple, obviously correct: one CTA of 4 warps per (sequence, query head), no splits. Warp w takes the
 *   tokens t = w (mod 4); lanes own dims lane + 32 i; scalar bf16 loads, warp-sum dot product, online softmax in
 *   f32 (expf); the 4 warps' (max, sum, acc) are merged in shared memory. Any even head_dim <= 256, any block size.
 *
 * v2 -- split-KV on CUDA cores: the grid and the partials of v3 (below), with v1's inner loop extended to all
 *   (up to 8) query heads of the kv head's group, so K and V are read once per group; lanes own dims
 *   64 i + 2 lane (+1) with 4-byte loads. Any even head_dim <= 256, any block size. It shares the split/merge
 *   code with v3 but not the tensor-core path, which separates the two if a check fails.
 *
 * v3 -- fast (head_dim a multiple of 32 up to 256, block size a power of two):
 *   - grid (split, kv head x head chunk, sequence); a CTA of 4 warps computes the rows of up to 8 query heads of
 *     one kv head (GQA: the group shares every K/V load; group > 8 takes several head chunks);
 *   - the split's tokens run through a 3-stage ring of 64-token stages in shared memory, filled by 16-byte
 *     cp.async (zero-filled past the context, so masked tokens never read memory); the block ids of up to
 *     DEC_TBL blocks (DEC_TBL_SMALL at head_dim <= 64 over a bf16 cache: the 4th CTA an SM) are staged once in
 *     shared memory (long splits go chunk by chunk), so the table is read once
 *     per block; rows are padded by 16 bytes, which makes every ldmatrix conflict-free for any head_dim;
 *   - warp w owns tokens 16 w .. 16 w + 15 of each stage: S = Q K^T by mma.sync m16n8k16 (bf16 in, f32 out;
 *     A = Q fragments kept in registers for the whole CTA, rows 0..7 = heads, rows 8..15 zero; B = K rows by
 *     ldmatrix.x4), online softmax in the log2 domain (scale * log2 e applied to the f32 scores), then
 *     O += P V with P taken straight from the S accumulators (bf16) and V by ldmatrix.x4.trans;
 *   - each warp keeps its own (max, sum, acc) and the 4 warps merge in shared memory at the end;
 *   - the running max is lazy (as in prefill v5): a row keeps it until a score passes it by more than 2^8 (P <= 256,
 *     O and l share the stale max, so O / l is the same softmax), and a warp none of whose rows moved skips the
 *     rescale of O and l; TM_CUDA_ATTN_DECODE_LAZY=0 moves it on every growth (sixteenth session: fp8 8B 512 x
 *     1024..2047 380.4 against 382.6 us, 64 x 4096 135.1 against 136.4; 112 instead of 127 registers (W8); the
 *     throughput run the same within noise).
 *   Bytes in flight: 2 stages x 32 KB per CTA at head_dim 128, 2 CTAs per SM: ~4x what the copy bandwidth needs.
 *   fp8 cache: the ring holds the raw e4m3 rows (padded to HD + 16 bytes) and nothing is widened in shared
 *   memory: the products run in f16 (e4m3 -> f16x2 is one exact conversion). A lane's K operand is 4 adjacent
 *   bytes of its token's row (one 4-byte load, two conversions), the k index of S = Q K^T being permuted within
 *   every 16 dims, and Q's fragments permuted alike (a dot product does not depend on the order of its terms);
 *   S runs as two chains per n-tile (even and odd 16-dim steps, added at the end): half the dependent mma
 *   latency. The output is computed transposed, O^T += V^T P^T: V^T is the A operand (16 dims x 16 tokens, every
 *   row in use, where O = P V wastes the 8 zero rows of an 8-head group), P^T the B operand, which is the S
 *   accumulators' own layout (no shuffles); the dims of a row pair are chosen so that a lane's V operand of four
 *   tokens comes from four 4-byte loads per 32 dims, regrouped by byte permutes. Against O = P V with byte loads
 *   (the eighth session's kernel): 413 instead of 485 instructions a warp per 64-token stage, 105 instead of 128
 *   registers, +4% out tok/s on the 8B fp8 throughput run (tenth session). W8 (head_dim 128, the default there;
 *   TM_CUDA_DEC_W8=0 keeps the padded ring): unpadded 128-byte rows with XOR-swizzled 32-byte sectors (v3_at), so
 *   that every K and V load is 8 bytes wide and conflict-free (a lane's dims of one row: 8 adjacent bytes per 32
 *   of K, per 64 of V), and the high e4m3 pair of a word converted in place (no shift): 358 instructions a stage,
 *   8B 64 x 4096 145 -> 134.5 us (94.6% of copy), +5.4% out tok/s. Half the bytes of bf16, and a smaller ring and
 *   block-id table (DEC_TBL8): 4 CTAs per SM at head_dim 128.
 *   Nineteenth session, W8 only (the throughput run's kernel, power-capped, so every instruction a cache byte
 *   costs clock): S^T = K Q^T instead of S = Q K^T (K the A operand, every row a token; Q^T the B operand from the
 *   same registers: 8 products a slice instead of 16, and no zero A rows to rebuild every stage); a lane then holds
 *   tokens g, g + 8 of heads 2 t4, 2 t4 + 1, so the heads' max is a reduction over 8 lanes, taken only when some
 *   raw score passes the per-head threshold the lazy max allows (a warp vote; rare after the first stages); P^T
 *   reaches the P V product's B layout by one movmatrix.trans a token half; whole stages over 16-token blocks are
 *   copied with one block id a pass and one wide multiply-add an address, no zero-fill operand. ~230 instead of
 *   ~340 instructions a warp a stage, 116 registers; 512 x 1024..2047 under a sustained load 376-380 -> 370-371 us,
 *   +1.2% out tok/s (docs/PERFORMANCE.md).
 *   Twentieth session, the bf16 cache the same way (ST: W8 or bf16; only the padded fp8 ring keeps S = Q K^T): K
 *   rows by ldmatrix.x4 in the A operand's order, the threshold vote, P transposed back by movmatrix as the A
 *   operand of O += P V, whose rows 8..15 (zero, P's zero rows) are carried from product to product instead of
 *   zeroed every stage, and the whole-stage copies: 126 instead of 138 registers at head_dim 128, 1B 64 x 4096
 *   150.5-151.8 -> 148.4-148.8 us (the description of S = Q K^T above is what the padded fp8 ring still does).
 *
 * Splits (v2, v3): the launcher picks n_splits (grid.x) from the number of (sequence, kv head, chunk) CTAs and
 * the GPU's resident CTA slots: when the CTAs fill the slots, the count whose last wave is fullest (1 when the
 * waves come out whole; the fp8 kernel fits 4 CTAs per SM, 512 CTAs = 0.97 waves), else enough
 * to fill them once; at most half the 64-token stages of max_context_len, n_seqs * n_splits <= 1024, and never
 * more than the work buffer holds. Each sequence then cuts its own context (context_len, read on the device, so a captured graph replays
 * with other contexts) into n_splits pieces of a multiple of 64 tokens (dec_split_plan); splits past the end
 * exit at once, a sequence of one piece has its output written directly by split 0, and the other sequences'
 * splits write a normalized partial (o = acc / sum, lse = max + log2 sum) to the work buffer; the merge kernel
 * (one block per (sequence, head)) combines the non-empty ones: out = sum_k 2^(lse_k - M) o_k / sum_k 2^(lse_k - M). */

namespace {

constexpr int DEC_THREADS = 128;
constexpr int DEC_WARPS = 4;
constexpr int DEC_ROWS = 8;              /* query heads per CTA (v2, v3) */
constexpr int DEC_STAGE_TOK = 64;        /* tokens per pipeline stage (v3) = split granularity */
constexpr int DEC_NST = 3;               /* pipeline stages (v3) */
constexpr int DEC_TBL = 1024;            /* block ids staged in shared memory at a time (v3) */
constexpr int DEC_TBL_SMALL = 256;       /* the same at head_dim <= 64 over a bf16 cache when the CTAs fill the
                                            * slots without splits: 4 CTAs then fit an SM (4 x (54 KB ring + 1 KB
                                            * + 1 KB reserved); with 1024, 3 do). Thirty-second session, 1B
                                            * geometry: 512 x 1024..2047 449 -> 389-399 us, 64 x 4096 151 -> 143;
                                            * but one sequence of 4096 in 16 splits (128 CTAs) 17.2 -> 19.6, so
                                            * grids that splitting fills keep the large table. TM_CUDA_DEC_TBL=n
                                            * sets the table for every bf16 launch (measurements) */
constexpr int DEC_TBL8 = 512;            /* the same over an fp8 cache: 4 CTAs then fit an SM (4 x (54 KB ring + 2 KB
                                            * + 1 KB reserved) = 228 KB; at 3, ncu found the kernel short of eligible
                                            * warps: 49% of cycles without one) */
constexpr int DEC_MIN_SPLIT_STAGES = 4;  /* a split the launcher picks covers >= 256 tokens (below that the first
                                            * merge kernel cost more than the parallelism gained; with the present
                                            * one, pieces of >= 64 / 128 tokens ran 1B batch 1 at depth 3000-6000
                                            * 0.3-1.8% slower, thirtieth session)... */
constexpr int DEC_SHORT_SPLIT_STAGES = 16; /* ...but one sequence of at most this many stages takes pieces of >= 128
                                            * tokens (batch 1 at depth 896: 1B +3.6%, 8B +5.7% against unsplit) */
constexpr int64_t DEC_ONE_SPLIT_BYTES = 128 << 10; /* one sequence whose K and V of a kv head are at most this runs
                                            * unsplit: one CTA a kv head (launcher; thirtieth session) */
constexpr int DEC_MAX_SEQ_SPLITS = 1024; /* n_seqs * n_splits <= this (bounds the work buffer) */
constexpr int DEC_WORK_SLACK = 256;      /* alignment slack of the work buffer */
constexpr unsigned FULL = 0xffffffffu;

struct dec_params {
    const uint16_t *q;          /* (n_seqs, n_heads * head_dim) bf16 */
    const uint16_t *kc, *vc;    /* (n_blocks, n_kv, block_size, head_dim) bf16, or fp8 e4m3 bytes when fp8 */
    uint16_t *out;              /* (n_seqs, n_heads * head_dim) bf16 */
    uint8_t *out8;              /* NULL, or out's elements times out8_inv in e4m3 (tm_cuda_attn_args.out8) */
    float out8_inv;
    float *part_o;              /* (n_seqs * n_heads, n_splits, head_dim) normalized partial outputs */
    float *part_lse;            /* (n_seqs * n_heads, n_splits) max + log2(sum), log2 domain */
    const int32_t *ctx_len;     /* (n_seqs) */
    const int32_t *block_table; /* (n_seqs, max_blocks) */
    int n_seqs, n_heads, n_kv, group, hchunks, head_dim, max_blocks, block_size, bs_log2;
    int n_splits, chunk_tok;
    float scale, scale_log2;
    bool fp8;                   /* the cache holds fp8 e4m3 (v1, v3) */
    bool lazy;                  /* v3: the running max moves only past 2^8 (TM_CUDA_ATTN_DECODE_LAZY=0: on every growth) */
};

/* ---- device helpers ---- */

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/* output element i: bf16 into out, and into out8 (when set) that bf16 value times out8_inv rounded to e4m3, as
 * tm_cuda_quant_fp8 rounds it */
__device__ __forceinline__ void put_out(const dec_params &p, size_t i, float o) {
    const uint16_t b = f32_to_bf16_bits(o);
    p.out[i] = b;
    if (p.out8) p.out8[i] = tm_fp8_of(bf16_bits_to_f32(b) * p.out8_inv);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(h.x) | ((uint32_t)__bfloat16_as_ushort(h.y) << 16);
}

/* 2^x; ex2.approx gives +0 for -inf */
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

/* A sequence's tokens are cut into splits of split_tok = max(64, ceil(ctx / n_splits) rounded up to 64) tokens,
 * from its own context length (read on the device), so every sequence spreads over all the splits whatever
 * max_context_len was. Returns the number of non-empty splits (>= 1: split 0 always runs, also for ctx <= 0). */
__device__ __forceinline__ int dec_split_plan(int ctx, int n_splits, int *split_tok) {
    int per = ctx > 0 ? (ctx - 1) / n_splits + 1 : 1;
    per = (per + DEC_STAGE_TOK - 1) / DEC_STAGE_TOK * DEC_STAGE_TOK;
    *split_tok = per;
    return ctx > per ? (ctx - 1) / per + 1 : 1;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte global -> shared copy; src_bytes 0 writes 16 zero bytes and reads nothing */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
/* p, with ptxas kept from splitting it into a uniform base plus an offset (the copy addresses are then one wide
 * multiply-add from it instead of that plus a 64-bit add) */
__device__ __forceinline__ const uint8_t *opaque_ptr(const uint8_t *p) {
    asm("mov.b64 %0, %0;" : "+l"(p));
    return p;
}
/* x, with ptxas kept from recomputing it where it is used (it would rematerialize a thread-index expression) */
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
    asm("mov.b32 %0, %0;" : "+r"(x));
    return x;
}
/* the same without the zero-fill operand: all 16 bytes always copied */
__device__ __forceinline__ void cp_async16_all(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}
/* 8 bytes of shared memory */
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

/* D = A B + C for m16n8k16 (f16 in, f32 accumulate; the padded fp8 ring's S = Q K^T) where rows 8..15 of A are
 * zero and rows 8..15 of C/D are not kept: a0 = A[g][2t..2t+1], a2 = A[g][2t+8..2t+9]; b0 = B[2t..2t+1][g],
 * b1 = B[2t+8..2t+9][g]; c0 = C[g][2t], c1 = C[g][2t+1]   (g = lane / 4, t = lane % 4) */
__device__ __forceinline__ void mma_rows8_f16(float &c0, float &c1, uint32_t a0, uint32_t a2, uint32_t b0,
                                              uint32_t b1) {
    float j0 = 0.0f, j1 = 0.0f; /* rows 8..15: zero in, discarded out */
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c0), "+f"(c1), "+f"(j0), "+f"(j1)
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

/* the 8x8 b16 matrix whose row lane / 4 holds (x of lane 4 r + c) at columns 2 c, 2 c + 1, transposed */
__device__ __forceinline__ uint32_t movm_t(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* a full m16n8k16 bf16 product: c (rows g, g + 8; cols 2 t4, 2 t4 + 1) += A B */
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a full m16n8k16 f16 product: c (rows g, g + 8; cols 2 t4, 2 t4 + 1) += A B */
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return (uint32_t)__half_as_ushort(__low2half(h)) | ((uint32_t)__half_as_ushort(__high2half(h)) << 16);
}

/* Merge the DEC_WARPS warps' states of `rows` query rows and write them: out (direct) or the split's partial.
 * red_m, red_l: (DEC_WARPS, DEC_ROWS) log2-domain max and sum; red_acc: (DEC_WARPS, DEC_ROWS, hd) unnormalized. */
__device__ void dec_finish(const dec_params &p, const float *red_m, const float *red_l, const float *red_acc, int hd,
                           int seq, int h0, int rows, int split, bool direct) {
    for (int i = (int)threadIdx.x; i < rows * hd; i += (int)blockDim.x) {
        const int r = i / hd, d = i - r * hd;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, red_m[w * DEC_ROWS + r]);
        const size_t pair = (size_t)seq * (size_t)p.n_heads + (size_t)(h0 + r);
        float o = 0.0f, lse = -INFINITY;
        if (M != -INFINITY) { /* else no token at all (context_len <= 0): zeros */
            float L = 0.0f, O = 0.0f;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; w++) {
                const float e = fast_exp2(red_m[w * DEC_ROWS + r] - M);
                L += red_l[w * DEC_ROWS + r] * e;
                O += red_acc[(size_t)(w * DEC_ROWS + r) * (size_t)hd + (size_t)d] * e;
            }
            o = O / L;
            lse = M + log2f(L);
        }
        if (direct) {
            put_out(p, pair * (size_t)hd + (size_t)d, o);
        } else {
            const size_t ps = pair * (size_t)p.n_splits + (size_t)split;
            p.part_o[ps * (size_t)hd + (size_t)d] = o;
            if (d == 0) p.part_lse[ps] = lse;
        }
    }
}

/* ---- v1: simple ---- */

/* element idx of a cache of bf16 or (fp8) e4m3 elements */
__device__ __forceinline__ float kv_elem(const uint16_t *c, size_t idx, bool fp8) {
    return fp8 ? tm_fp8_to_f32(((const uint8_t *)c)[idx]) : bf16_bits_to_f32(c[idx]);
}

__global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel_v1(dec_params p) {
    __shared__ float s_m[DEC_WARPS], s_l[DEC_WARPS], s_acc[DEC_WARPS][256];
    const int h = (int)blockIdx.x, seq = (int)blockIdx.y;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int hd = p.head_dim, kvh = h / p.group, bs = p.block_size;
    const int ctx = p.ctx_len[seq];
    const uint16_t *qrow = p.q + ((size_t)seq * (size_t)p.n_heads + (size_t)h) * (size_t)hd;
    float q[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int d = lane + 32 * i;
        q[i] = d < hd ? bf16_bits_to_f32(qrow[d]) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = warp; t < ctx; t += DEC_WARPS) {
        const int blk = p.block_table[(size_t)seq * (size_t)p.max_blocks + (size_t)(t / bs)];
        const size_t row = (((size_t)blk * (size_t)p.n_kv + (size_t)kvh) * (size_t)bs + (size_t)(t % bs)) * (size_t)hd;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int d = lane + 32 * i;
            if (d < hd) s += q[i] * kv_elem(p.kc, row + (size_t)d, p.fp8);
        }
        s = warp_sum(s) * p.scale;
        const float m_new = fmaxf(m, s), alpha = expf(m - m_new), e = expf(s - m_new);
        l = l * alpha + e;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * alpha + e * kv_elem(p.vc, row + (size_t)d, p.fp8);
        }
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int d = lane + 32 * i;
        if (d < hd) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    for (int d = (int)threadIdx.x; d < hd; d += DEC_THREADS) {
        float M = -INFINITY;
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, s_m[w]);
        float o = 0.0f;
        if (M != -INFINITY) {
            float L = 0.0f, O = 0.0f;
            for (int w = 0; w < DEC_WARPS; w++) {
                const float e = expf(s_m[w] - M); /* a warp without tokens: expf(-inf) = 0 */
                L += s_l[w] * e;
                O += s_acc[w][d] * e;
            }
            o = O / L;
        }
        put_out(p, ((size_t)seq * (size_t)p.n_heads + (size_t)h) * (size_t)hd + (size_t)d, o);
    }
}

/* ---- v2: split-KV, GQA group per CTA, CUDA cores ---- */

/* NI = ceil(head_dim / 64): lane owns dims 64 i + 2 lane, +1 (those < head_dim) */
template <int NI> __global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel_v2(dec_params p) {
    tm_pdl_enter();
    __shared__ float s_m[DEC_WARPS * DEC_ROWS], s_l[DEC_WARPS * DEC_ROWS];
    __shared__ float s_acc[DEC_WARPS * DEC_ROWS * 64 * NI];
    const int split = (int)blockIdx.x, seq = (int)blockIdx.z;
    const int kvh = (int)blockIdx.y / p.hchunks, hc = (int)blockIdx.y % p.hchunks;
    const int h0 = kvh * p.group + hc * DEC_ROWS, rows = min(DEC_ROWS, p.group - hc * DEC_ROWS);
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int hd = p.head_dim, bs = p.block_size;
    const int ctx = p.ctx_len[seq];
    int split_tok;
    const int nv = dec_split_plan(ctx, p.n_splits, &split_tok);
    if (split >= nv) return;
    const bool direct = nv == 1;
    const int tb = split * split_tok, te = min(ctx, tb + split_tok);

    float q[DEC_ROWS][2 * NI], acc[DEC_ROWS][2 * NI], m[DEC_ROWS], l[DEC_ROWS];
#pragma unroll
    for (int r = 0; r < DEC_ROWS; r++) {
        const size_t qh = (size_t)seq * (size_t)p.n_heads + (size_t)(h0 + (r < rows ? r : 0));
        const uint32_t *qr = (const uint32_t *)(p.q + qh * (size_t)hd);
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int d = 64 * i + 2 * lane;
            const uint32_t w = (r < rows && d < hd) ? qr[d >> 1] : 0u;
            q[r][2 * i] = bf16_lo(w);
            q[r][2 * i + 1] = bf16_hi(w);
            acc[r][2 * i] = acc[r][2 * i + 1] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int t = tb + warp; t < te; t += DEC_WARPS) {
        const int blk = p.block_table[(size_t)seq * (size_t)p.max_blocks + (size_t)(t / bs)];
        const size_t row = (((size_t)blk * (size_t)p.n_kv + (size_t)kvh) * (size_t)bs + (size_t)(t % bs)) * (size_t)hd;
        const uint32_t *kr = (const uint32_t *)(p.kc + row), *vr = (const uint32_t *)(p.vc + row);
        float k[2 * NI], v[2 * NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int d = 64 * i + 2 * lane;
            const uint32_t kw = d < hd ? kr[d >> 1] : 0u, vw = d < hd ? vr[d >> 1] : 0u;
            k[2 * i] = bf16_lo(kw);
            k[2 * i + 1] = bf16_hi(kw);
            v[2 * i] = bf16_lo(vw);
            v[2 * i + 1] = bf16_hi(vw);
        }
#pragma unroll
        for (int r = 0; r < DEC_ROWS; r++) {
            if (r < rows) { /* warp-uniform */
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 2 * NI; j++) s += q[r][j] * k[j];
                s = warp_sum(s) * p.scale_log2;
                const float m_new = fmaxf(m[r], s);
                const float alpha = fast_exp2(m[r] - m_new), e = fast_exp2(s - m_new);
                l[r] = l[r] * alpha + e;
#pragma unroll
                for (int j = 0; j < 2 * NI; j++) acc[r][j] = acc[r][j] * alpha + e * v[j];
                m[r] = m_new;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DEC_ROWS; r++) {
        if (r < rows) {
            if (lane == 0) {
                s_m[warp * DEC_ROWS + r] = m[r];
                s_l[warp * DEC_ROWS + r] = l[r];
            }
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int d = 64 * i + 2 * lane;
                if (d < hd) {
                    s_acc[(warp * DEC_ROWS + r) * hd + d] = acc[r][2 * i];
                    s_acc[(warp * DEC_ROWS + r) * hd + d + 1] = acc[r][2 * i + 1];
                }
            }
        }
    }
    __syncthreads();
    dec_finish(p, s_m, s_l, s_acc, hd, seq, h0, rows, split, direct);
}

/* ---- v3: split-KV, cp.async ring, tensor cores ---- */

template <int HD> struct v3_cfg {
    static constexpr int RS = HD + 8;                      /* shared row stride (bf16): +16 bytes */
    static constexpr int CH = HD / 8;                      /* 16-byte chunks per row */
    static constexpr int STAGE = DEC_STAGE_TOK * RS;       /* bf16 per K (or V) stage */
    static constexpr int TPR = CH <= 4 ? 4 : CH <= 8 ? 8 : CH <= 16 ? 16 : 32; /* copy threads per row */
    static constexpr int RPP = DEC_THREADS / TPR;                               /* rows per copy pass */
    static constexpr int PASSES = DEC_STAGE_TOK / RPP;
    static constexpr size_t RING_BYTES = (size_t)DEC_NST * 2 * STAGE * 2;
    static constexpr size_t SMEM = RING_BYTES; /* + the block-id table (v3_kernel) */
    static_assert(HD % 32 == 0 && HD >= 32 && HD <= 256, "head_dim");
    static_assert(TPR >= CH && DEC_STAGE_TOK % RPP == 0, "copies");
    static_assert(DEC_STAGE_TOK == DEC_WARPS * 16, "a warp owns 16 tokens of a stage");
    static_assert(RING_BYTES >= (size_t)DEC_WARPS * DEC_ROWS * (HD + 2) * 4, "reduction fits the ring");
    /* fp8 cache: the ring holds the raw e4m3 rows, padded by 16 bytes (conflict-free 4-byte K loads and byte V
     * loads); the tensor cores get them widened to f16 in registers (every e4m3 value is an f16 value) */
    static constexpr int RS8 = HD + 16;                                          /* bytes per raw row */
    static constexpr int CH8 = HD / 16;                                          /* 16-byte chunks per raw row */
    static constexpr int TPR8 = CH8 <= 2 ? 2 : CH8 <= 4 ? 4 : CH8 <= 8 ? 8 : 16; /* copy threads per raw row */
    static constexpr int RPP8 = DEC_THREADS / TPR8;
    static constexpr int PASSES8 = DEC_STAGE_TOK / RPP8;
    static constexpr size_t RAW_STAGE = (size_t)DEC_STAGE_TOK * RS8;             /* bytes per K (or V) stage */
    static constexpr size_t RAW_BYTES = (size_t)DEC_NST * 2 * RAW_STAGE;
    static constexpr size_t SMEM8 = RAW_BYTES + (size_t)DEC_TBL8 * 4;
    static_assert(TPR8 >= CH8 && DEC_STAGE_TOK % RPP8 == 0, "fp8 copies");
    /* fp8, W8 (head_dim 128): unpadded rows, the 32-byte sectors of row r XOR-swizzled by (r ^ r >> 1) & 3, so
     * that the 8-byte K and V loads (4 rows of 32 bytes each half-warp) are conflict-free; a smaller ring */
    static constexpr size_t W8_STAGE = (size_t)DEC_STAGE_TOK * HD;
    static constexpr size_t W8_RING = (size_t)DEC_NST * 2 * W8_STAGE;
    static_assert(RAW_BYTES >= (size_t)DEC_WARPS * DEC_ROWS * (HD + 2) * 4, "reduction fits the raw ring");
};

/* one work item of v3: (split, kv head x head chunk yi, sequence) */
constexpr size_t DEC_W8_SMEM = 128 + v3_cfg<128>::W8_RING + (size_t)DEC_TBL8 * 4; /* the W8 kernel's (the ring is
                                                                                   * 128-aligned: see v3_item) */

/* byte b of row r of a W8 ring stage (see v3_cfg), else of a padded one (rows ROWB bytes apart) */
template <bool W8, int ROWB> __device__ __forceinline__ int v3_at(int r, int b) {
    if constexpr (W8) return r * ROWB + ((((b >> 5) ^ (r ^ (r >> 1))) & 3) << 5) + (b & 31);
    return r * ROWB + b;
}

template <int HD, bool FP8, bool W8 = false>
__device__ __forceinline__ void v3_item(const dec_params &p, unsigned char *smem, int split, int yi, int seq) {
    using C = v3_cfg<HD>;
    static_assert(!W8 || (FP8 && HD == 128), "W8: fp8, head_dim 128");
    if constexpr (W8) smem += (128u - (smem_u32(smem) & 127u)) & 127u; /* addresses XOR-ed in bits 5-6 below */
    /* bf16: ring (DEC_NST, 2 (K, V), DEC_STAGE_TOK, RS) bf16; fp8: ring (DEC_NST, 2, DEC_STAGE_TOK, RS8) e4m3;
     * W8: (DEC_NST, 2, DEC_STAGE_TOK, HD) e4m3, swizzled */
    int *tbl = (int *)(smem + (W8 ? C::W8_RING : FP8 ? C::RAW_BYTES : C::RING_BYTES)); /* (the launcher's tbl_n) */
    /* fp8: a lane's K and V bytes are words of WW x 4 bytes (W8: 8-byte loads) */
    constexpr int WW = W8 ? 2 : 1;
    /* the scores transposed, S^T = K Q^T (W8 and bf16; the padded fp8 ring keeps S = Q K^T): see st_m */
    constexpr bool ST = W8 || !FP8;
    const int kvh = yi / p.hchunks, hc = yi % p.hchunks;
    const int h0 = kvh * p.group + hc * DEC_ROWS, rows = min(DEC_ROWS, p.group - hc * DEC_ROWS);
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int ctx = p.ctx_len[seq];
    int split_tok;
    const int nv = dec_split_plan(ctx, p.n_splits, &split_tok);
    if (split >= nv) return;
    const bool direct = nv == 1;
    const int tb = split * split_tok, te = min(ctx, tb + split_tok);

    /* Q as the A operand: row g = head h0 + g (zero when g >= rows), qa0 = dims 16 ks + 2 t4 (+1), qa2 = +8.
     * fp8: f16 (the K fragments are f16), and the k index of the products permuted within each 16 dims so that a
     * lane's K values are 4 adjacent bytes: qa0 = dims 16 ks + 4 t4 (+1), qa2 = dims 16 ks + 4 t4 + 2 (+3) */
    uint32_t qa0[HD / 16], qa2[HD / 16];
    {
        const bool has = g < rows;
        const uint32_t *qr =
            (const uint32_t *)(p.q + ((size_t)seq * (size_t)p.n_heads + (size_t)(h0 + (has ? g : 0))) * (size_t)HD);
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            if constexpr (FP8) { /* step ks = WW pp + e: dims 16 WW pp + 4 WW t4 + 4 e .. + 3 */
                const int at = 8 * WW * (ks / WW) + 2 * WW * t4 + 2 * (ks % WW);
                const uint32_t w0 = has ? qr[at] : 0u, w1 = has ? qr[at + 1] : 0u;
                qa0[ks] = pack_f16x2(bf16_lo(w0), bf16_hi(w0));
                qa2[ks] = pack_f16x2(bf16_lo(w1), bf16_hi(w1));
            } else {
                qa0[ks] = has ? qr[ks * 8 + t4] : 0u;
                qa2[ks] = has ? qr[ks * 8 + 4 + t4] : 0u;
            }
        }
    }
    /* the padded fp8 ring (S = Q K^T): row g's running max (log2 domain) and this lane's partial sum */
    float m_run = -INFINITY, l_run = 0.0f;
    /* ST (W8 and bf16): S^T = K Q^T (A = the slice's 16 tokens x 16 dims, every row in use; B = Q^T, 8 heads), half
     * the products of S = Q K^T with its 8 zero rows, and no zero registers for them. A lane holds tokens g, g + 8 of
     * heads 2 t4, 2 t4 + 1: st_m is those heads' running max, st_l the lane's partial sums; P^T (W8) or P (bf16)
     * reaches the P V product's layout by one movmatrix a token half */
    float st_m[2] = {-INFINITY, -INFINITY}, st_l[2] = {0.0f, 0.0f};
    /* and per head: the max used (0 while nothing is visible), and the raw score past which the max moves */
    float st_mu[2] = {0.0f, 0.0f}, st_th[2] = {-INFINITY, -INFINITY};
    /* bf16: O[g][8 j + 2 t4 (+1)]; [2], [3] are the product's rows 8..15, which P's zero rows keep at 0: carried from
     * product to product, so no register is zeroed for them in every stage */
    float acc[FP8 ? 1 : HD / 8][4];
#pragma unroll
    for (int j = 0; j < (FP8 ? 1 : HD / 8); j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    /* fp8: O^T = V^T P^T, V^T the A operand (16 dims x 16 tokens), P^T the B operand (16 tokens x 8 heads: exactly
     * the S fragments), so every row of the product is a dim in use; m-tile (q, h) row g is dim 32 q + 4 g + 2 h,
     * row g + 8 dim 32 q + 4 g + 2 h + 1, so that a lane's V values of one token are 4 adjacent bytes (one load).
     * accT[q][h] = O^T (dim(g), heads 2 t4, 2 t4 + 1), (dim(g + 8), heads 2 t4, 2 t4 + 1) */
    constexpr int NQ = FP8 ? HD / (32 * WW) : 1; /* W8: m-tile (q, h) row g is dim 64 q + 8 g + 2 h (h < 4) */
    float accT[NQ][2 * WW][4];
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int h = 0; h < 2 * WW; h++) accT[q][h][0] = accT[q][h][1] = accT[q][h][2] = accT[q][h][3] = 0.0f;

    const int bsl = p.bs_log2, bmask = p.block_size - 1;
    const uint32_t n_kv = (uint32_t)p.n_kv;
    const float sl = p.scale_log2;
    const uint32_t ring_s = smem_u32(smem);
    /* per-lane ldmatrix offsets (bytes) inside a warp's 16-token slice */
    const uint32_t v_off = (uint32_t)((((lane & 7) + ((lane >> 3) & 1) * 8) * C::RS + (lane >> 4) * 8) * 2);
    /* the ring in bytes: a shared row (ROWB), a K (or V) stage (STAGEB); copies of 16 bytes = CHE elements of ES
     * bytes, TPRx threads per row of CHx chunks, RPPx rows per pass, PASSESx passes per stage */
    constexpr int ES = FP8 ? 1 : 2, CHE = 16 / ES;
    constexpr int ROWB = W8 ? HD : FP8 ? C::RS8 : C::RS * 2;
    constexpr int STAGEB = W8 ? (int)C::W8_STAGE : FP8 ? (int)C::RAW_STAGE : C::STAGE * 2;
    constexpr int CHx = FP8 ? C::CH8 : C::CH, TPRx = FP8 ? C::TPR8 : C::TPR;
    constexpr int RPPx = FP8 ? C::RPP8 : C::RPP, PASSESx = FP8 ? C::PASSES8 : C::PASSES;
    /* copies: thread owns chunk cp_ch of rows cp_r0 + k * RPPx of each stage */
    const int cp_ch = tid % TPRx, cp_r0 = tid / TPRx;
    const uint32_t cp_dst = (uint32_t)v3_at<W8, ROWB>(cp_r0, cp_ch * 16); /* W8: the key repeats every 16 rows */
    /* W8 loads, as offsets in a warp's slice XOR-ed with the 32-byte sector: K rows g (g + 8: +1024, the same key),
     * bytes 32 pp + 8 t4: kx ^ (pp << 5); V rows 2 t4 (vxa) and 2 t4 + 1 (vxb) (+ 8: +1024), bytes 64 q + 8 g:
     * vx ^ (q << 6) */
    const uint32_t kx = (uint32_t)v3_at<W8, ROWB>(g, 8 * t4);
    /* (opaque: ptxas would recompute them from the thread index in every stage, ~16 instructions) */
    const uint32_t vxa = opaque_u32((uint32_t)v3_at<W8, ROWB>(2 * t4, 8 * g));
    const uint32_t vxb = opaque_u32((uint32_t)v3_at<W8, ROWB>(2 * t4 + 1, 8 * g));
    const uint8_t *const kcb = (const uint8_t *)p.kc, *const vcb = (const uint8_t *)p.vc;
    /* whole stages over 16-token blocks (issue): bytes of one cache block (all kv heads); this thread's bytes of
     * block 0 (kv head, slot cp_r0, chunk cp_ch) in K and V */
    const uint32_t blk_bytes = (n_kv << bsl) * (uint32_t)(HD * ES);
    const uint32_t cp_thr = (((uint32_t)kvh << bsl) + (uint32_t)cp_r0) * (uint32_t)(HD * ES) + (uint32_t)cp_ch * 16u;
    const uint8_t *const kthr = opaque_ptr(kcb + cp_thr), *const vthr = opaque_ptr(vcb + cp_thr);

    /* fp8: O^T (columns: heads 2 t4, 2 t4 + 1) rescaled by those heads' alphas */
    auto rescale_t = [&](float al0, float al1) {
#pragma unroll
        for (int q = 0; q < NQ; q++)
#pragma unroll
            for (int h = 0; h < 2 * WW; h++) {
                accT[q][h][0] *= al0;
                accT[q][h][1] *= al1;
                accT[q][h][2] *= al0;
                accT[q][h][3] *= al1;
            }
    };
    /* fp8: O^T += V^T P^T over this warp's 16-token slice of the stage (V rows at sv, or v8 when padded); P^T as the
     * B operand: pa0 = (tokens 2 t4, 2 t4 + 1; head g), pa2 = (tokens 2 t4 + 8, 2 t4 + 9; head g) */
    auto pv8 = [&](uint32_t sv, const unsigned char *v8, uint32_t pa0, uint32_t pa2) {
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            /* rows 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 (tokens): dims 32 WW q + 4 WW g .. (WW words) */
            uint32_t w[4][WW];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if constexpr (W8) {
                    const uint32_t a = (sv + ((i & 1) ? vxb : vxa)) ^ (uint32_t)(q << 6);
                    const uint2 u = lds64(a + (uint32_t)(i >> 1) * 1024u);
                    w[i][0] = u.x;
                    w[i][WW - 1] = u.y;
                } else {
                    const int r = 2 * t4 + (i & 1) + 8 * (i >> 1);
                    w[i][0] = *(const uint32_t *)(v8 + r * ROWB + 32 * q + 4 * g);
                }
            }
#pragma unroll
            for (int h = 0; h < 2 * WW; h++) {
                /* (tok 2t4, tok 2t4+1) of dims 2h, 2h+1 (of word h / 2); the same of tokens 8 + 2 t4, 9 + 2 t4 */
                const int b = 2 * (h & 1), wi = h >> 1;
                const uint32_t sel = b | ((4 + b) << 4) | ((b + 1) << 8) | ((5 + b) << 12);
                const uint32_t lo = __byte_perm(w[0][wi], w[1][wi], sel);
                const uint32_t hi = __byte_perm(w[2][wi], w[3][wi], sel);
                float(&c)[4] = accT[q][h];
                mma_f16(c, tm_fp8x2_lo_to_f16x2(lo), tm_fp8x2_hi_to_f16x2(lo), tm_fp8x2_lo_to_f16x2(hi),
                        tm_fp8x2_hi_to_f16x2(hi), pa0, pa2);
            }
        }
    };
    /* bf16: O += P V over this warp's slice; P as the A operand: pa0 = (head g; tokens 2 t4, 2 t4 + 1), pa2 = (head g;
     * tokens 2 t4 + 8, 2 t4 + 9) */
    auto pv16 = [&](uint32_t sv, uint32_t pa0, uint32_t pa2) {
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b0r, b1r, b2r, b3r;
            ldsm_x4_t(sv + v_off + (uint32_t)(dp * 32), b0r, b1r, b2r, b3r);
            mma_bf16(acc[2 * dp], pa0, 0u, pa2, 0u, b0r, b1r);
            mma_bf16(acc[2 * dp + 1], pa0, 0u, pa2, 0u, b2r, b3r);
        }
    };
    for (int c0 = tb; c0 < te; c0 += p.chunk_tok) {
        const int c1 = min(te, c0 + p.chunk_tok);
        const int b0 = c0 >> bsl, nb = ((c1 - 1) >> bsl) - b0 + 1;
        __syncthreads(); /* the previous chunk is done with tbl and the ring */
        for (int i = tid; i < nb; i += DEC_THREADS)
            tbl[i] = p.block_table[(size_t)seq * (size_t)p.max_blocks + (size_t)(b0 + i)];
        __syncthreads();
        const int n_st = (c1 - c0 + DEC_STAGE_TOK - 1) / DEC_STAGE_TOK;

        /* stage st (tokens c0 + 64 st ..) -> ring buffer st % DEC_NST; a thread copies 16 bytes of K and V of
         * PASSES rows (threads with cp_ch >= CH idle when head_dim / 8 is not a power of two). Tokens >= c1 are
         * zero-filled (src-size 0) from an in-bounds address of block tbl[0]. Cache rows (block, kv head, slot)
         * are counted in 32 bits: 2^32 rows would be >= 512 GB of cache. */
        auto issue = [&](int st) {
            const uint32_t sk = ring_s + (uint32_t)((st % DEC_NST) * 2 * STAGEB) + cp_dst;
            const int tok_a = c0 + st * DEC_STAGE_TOK + cp_r0;
            /* a whole stage below c1 over 16-token blocks (the stage starts at a multiple of 64, so pass k's RPPx rows
             * are slots (k RPPx) % 16 + .. of block (c0 + 64 st) / 16 + k RPPx / 16, this thread's row being cp_r0
             * of them): the block ids read at one base, each address one wide multiply-add from this thread's fixed
             * offset (kthr, vthr) plus a constant, no zero-fill operand */
            if constexpr (ST && 16 % RPPx == 0) { /* (the padded fp8 ring keeps the general copies) */
                if (bsl == 4 && c0 + (st + 1) * DEC_STAGE_TOK <= c1) {
                    if (TPRx == CHx || cp_ch < CHx) {
                        const int *tb4 = tbl + (((c0 + st * DEC_STAGE_TOK) >> 4) - b0);
                        const uint8_t *ks[PASSESx], *vs[PASSESx];
#pragma unroll
                        for (int k = 0; k < PASSESx; k++) {
                            const size_t boff = (size_t)(uint32_t)tb4[k * RPPx / 16] * blk_bytes +
                                                (size_t)((k * RPPx % 16) * HD * ES);
                            ks[k] = kthr + boff;
                            vs[k] = vthr + boff;
                        }
#pragma unroll
                        for (int k = 0; k < PASSESx; k++) {
                            const uint32_t dst = sk + (uint32_t)(k * RPPx * ROWB);
                            cp_async16_all(dst, ks[k]);
                            cp_async16_all(dst + (uint32_t)STAGEB, vs[k]);
                        }
                    }
                    return;
                }
            }
#pragma unroll
            for (int k = 0; k < PASSESx; k++) {
                const int tok = tok_a + k * RPPx;
                const bool ok = tok < c1;
                const uint32_t blk = (uint32_t)tbl[ok ? (tok >> bsl) - b0 : 0];
                const uint32_t row = ((blk * n_kv + kvh) << bsl) + (uint32_t)(tok & bmask);
                const size_t off = ((size_t)row * HD + (size_t)cp_ch * CHE) * ES; /* bytes */
                const uint32_t dst = sk + (uint32_t)(k * RPPx * ROWB);
                if (TPRx == CHx || cp_ch < CHx) {
                    cp_async16(dst, kcb + off, ok ? 16 : 0);
                    cp_async16(dst + (uint32_t)STAGEB, vcb + off, ok ? 16 : 0);
                }
            }
        };

        for (int st = 0; st < DEC_NST - 1; st++) {
            if (st < n_st) issue(st);
            cp_async_commit();
        }
        for (int st = 0; st < n_st; st++) {
            cp_async_wait<DEC_NST - 2>(); /* this thread's copies of stage st have landed */
            __syncthreads();              /* everyone's have; everyone is done with stage st - 1's buffer */
            if (st + DEC_NST - 1 < n_st) issue(st + DEC_NST - 1);
            cp_async_commit();
            const int wt0 = c0 + st * DEC_STAGE_TOK + warp * 16; /* this warp's first token */
            if (wt0 < c1) {                                       /* warp-uniform */
                const uint32_t sk = ring_s + (uint32_t)((st % DEC_NST) * 2 * STAGEB + warp * 16 * ROWB);
                const uint32_t sv = sk + (uint32_t)STAGEB;
                if constexpr (ST) { /* S^T = K Q^T: see st_m */
                    float ce[4] = {0.0f, 0.0f, 0.0f, 0.0f}, co[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* even / odd ks */
                    if constexpr (W8) {
#pragma unroll
                        for (int ks = 0; ks < HD / 16; ks += 2) { /* one 8-byte load of row g (g + 8) for ks, ks + 1 */
                            const uint32_t ka = (sk + kx) ^ (uint32_t)(ks << 4);
                            const uint2 u0 = lds64(ka), u1 = lds64(ka + 1024u);
                            mma_f16(ce, tm_fp8x2_lo_to_f16x2(u0.x), tm_fp8x2_lo_to_f16x2(u1.x),
                                    tm_fp8x2_hi_to_f16x2(u0.x), tm_fp8x2_hi_to_f16x2(u1.x), qa0[ks], qa2[ks]);
                            mma_f16(co, tm_fp8x2_lo_to_f16x2(u0.y), tm_fp8x2_lo_to_f16x2(u1.y),
                                    tm_fp8x2_hi_to_f16x2(u0.y), tm_fp8x2_hi_to_f16x2(u1.y), qa0[ks + 1], qa2[ks + 1]);
                        }
                    } else { /* bf16: K rows by ldmatrix in the A operand's order (v_off's pattern: rows 0-7 and 8-15 of
                              * dims 0-7, then of dims 8-15) */
#pragma unroll
                        for (int ks = 0; ks < HD / 16; ks++) {
                            uint32_t a0, a1, a2, a3;
                            ldsm_x4(sk + v_off + (uint32_t)(ks * 32), a0, a1, a2, a3);
                            mma_bf16(ks & 1 ? co : ce, a0, a1, a2, a3, qa0[ks], qa2[ks]);
                        }
                    }
                    /* lane: tokens g (s0, s1) and g + 8 (s2, s3) of the slice, heads 2 t4 (s0, s2) and 2 t4 + 1;
                     * raw scores (st_th is in their units); only the last stage of a split masks */
                    float s0 = ce[0] + co[0], s1 = ce[1] + co[1], s2 = ce[2] + co[2], s3 = ce[3] + co[3];
                    if (wt0 + 16 > c1) { /* warp-uniform */
                        const bool va = wt0 + g < c1, vb = wt0 + g + 8 < c1;
                        s0 = va ? s0 : -INFINITY;
                        s1 = va ? s1 : -INFINITY;
                        s2 = vb ? s2 : -INFINITY;
                        s3 = vb ? s3 : -INFINITY;
                    }
                    /* a head's max is taken (over the 8 lanes holding its tokens) only when some score passes what
                     * the lazy max allows: every lane then moves the same heads by the same amount */
                    if (__any_sync(FULL, fmaxf(s0, s2) > st_th[0] || fmaxf(s1, s3) > st_th[1])) {
                        float mx0 = fmaxf(s0, s2), mx1 = fmaxf(s1, s3);
#pragma unroll
                        for (int o = 4; o < 32; o <<= 1) {
                            mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, o));
                            mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, o));
                        }
                        float al[2];
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const float mx = h ? mx1 : mx0;
                            const float n = mx > st_th[h] ? mx * sl : st_m[h]; /* the new max, log2 domain */
                            const float mu = n == -INFINITY ? 0.0f : n;
                            al[h] = fast_exp2(st_m[h] - mu);
                            st_m[h] = n;
                            st_mu[h] = mu;
                            st_th[h] = (p.lazy ? n + 8.0f : n) / sl;
                            st_l[h] *= al[h];
                        }
                        if constexpr (W8) {
                            rescale_t(al[0], al[1]);
                        } else { /* bf16: O's row is head g, whose alpha lane g / 2 holds */
                            const float a0 = __shfl_sync(FULL, al[0], g >> 1), a1 = __shfl_sync(FULL, al[1], g >> 1);
                            const float ag = g & 1 ? a1 : a0;
#pragma unroll
                            for (int j = 0; j < HD / 8; j++) {
                                acc[j][0] *= ag;
                                acc[j][1] *= ag;
                            }
                        }
                    }
                    const float p0 = fast_exp2(fmaf(s0, sl, -st_mu[0])), p1 = fast_exp2(fmaf(s1, sl, -st_mu[1]));
                    const float p2 = fast_exp2(fmaf(s2, sl, -st_mu[0])), p3 = fast_exp2(fmaf(s3, sl, -st_mu[1]));
                    st_l[0] += p0 + p2;
                    st_l[1] += p1 + p3;
                    /* (token g; heads 2 t4, 2 t4 + 1) transposed to (head g; tokens 2 t4, 2 t4 + 1): W8, P^T as the B
                     * operand of O^T += V^T P^T; bf16, P as the A operand of O += P V */
                    if constexpr (W8) {
                        pv8(sv, nullptr, movm_t(pack_f16x2(p0, p1)), movm_t(pack_f16x2(p2, p3)));
                    } else {
                        pv16(sv, movm_t(pack_bf16x2(p0, p1)), movm_t(pack_bf16x2(p2, p3)));
                    }
                } else { /* the padded fp8 ring (fp8, head_dim other than 128): S = Q K^T */
                    /* fp8: this warp's raw K and V rows (16 tokens, RS8 bytes apart) */
                    const unsigned char *k8 = smem + (sk - ring_s), *v8 = smem + (sv - ring_s);
                    /* S = Q K^T: n-tile 0 = tokens 0..7 of the slice, n-tile 1 = tokens 8..15 */
                    float s0[2] = {0.0f, 0.0f}, s1[2] = {0.0f, 0.0f};
                    float s2[2] = {0.0f, 0.0f}, s3[2] = {0.0f, 0.0f}; /* fp8: the odd ks in chains of their own */
#pragma unroll
                    for (int ks = 0; ks < HD / 16; ks++) {
                        /* token g (8 + g): the 4 bytes of step ks as (b0, b1), Q permuted alike */
                        uint32_t w0, w1;
                        w0 = *(const uint32_t *)(k8 + g * ROWB + ks * 16 + 4 * t4);
                        w1 = *(const uint32_t *)(k8 + (g + 8) * ROWB + ks * 16 + 4 * t4);
                        float *c0 = (ks & 1) ? s2 : s0, *c1 = (ks & 1) ? s3 : s1;
                        mma_rows8_f16(c0[0], c0[1], qa0[ks], qa2[ks], tm_fp8x2_lo_to_f16x2(w0),
                                      tm_fp8x2_hi_to_f16x2(w0));
                        mma_rows8_f16(c1[0], c1[1], qa0[ks], qa2[ks], tm_fp8x2_lo_to_f16x2(w1),
                                      tm_fp8x2_hi_to_f16x2(w1));
                    }
                    s0[0] += s2[0];
                    s0[1] += s2[1];
                    s1[0] += s3[0];
                    s1[1] += s3[1];
                    /* lane holds row g, tokens 2 t4, 2 t4 + 1 (s0) and 8 + 2 t4, 9 + 2 t4 (s1) */
                    const int ta = wt0 + 2 * t4, tbk = ta + 8;
                    const float x0 = ta < c1 ? s0[0] * sl : -INFINITY;
                    const float x1 = ta + 1 < c1 ? s0[1] * sl : -INFINITY;
                    const float x2 = tbk < c1 ? s1[0] * sl : -INFINITY;
                    const float x3 = tbk + 1 < c1 ? s1[1] * sl : -INFINITY;
                    float mx = fmaxf(fmaxf(x0, x1), fmaxf(x2, x3));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
                    /* lazy running max (dec_params.lazy): row g keeps its max until a score passes it by more than
                     * 2^8, so P <= 256 and O and l share the stale max (O / l is the same softmax); a warp none of
                     * whose rows moved skips the rescale of l and O (alpha = 1) */
                    const bool grow = p.lazy ? mx > m_run + 8.0f : mx > m_run;
                    const float m_new = grow ? mx : m_run;
                    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                    const bool rescale = __any_sync(FULL, grow);
                    const float alpha = rescale ? fast_exp2(m_run - m_use) : 1.0f;
                    const float p0 = fast_exp2(x0 - m_use), p1 = fast_exp2(x1 - m_use);
                    const float p2 = fast_exp2(x2 - m_use), p3 = fast_exp2(x3 - m_use);
                    l_run = l_run * alpha + ((p0 + p1) + (p2 + p3)); /* alpha is exactly 1 without a rescale */
                    m_run = m_new;
                    /* P as the A operand (k = the slice's 16 tokens): a0 = tokens 2 t4 (+1), a2 = 8 + 2 t4 (+1) */
                    const uint32_t pa0 = pack_f16x2(p0, p1), pa2 = pack_f16x2(p2, p3);
                    /* alpha of heads 2 t4, 2 t4 + 1 from the lanes holding rows 2 t4, 2 t4 + 1 */
                    if (rescale) { /* warp-uniform */
                        rescale_t(__shfl_sync(FULL, alpha, 8 * t4), __shfl_sync(FULL, alpha, 8 * t4 + 4));
                    }
                    pv8(sv, v8, pa0, pa2);
                }
            }
        }
        cp_async_wait<0>();
    }
    __syncthreads(); /* the ring is free: reuse it for the warps' merge */

    float *red_m = (float *)smem, *red_l = red_m + DEC_WARPS * DEC_ROWS, *red_acc = red_l + DEC_WARPS * DEC_ROWS;
    if constexpr (ST) { /* heads 2 t4, 2 t4 + 1: their sums over the 8 lanes of their tokens */
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            st_l[0] += __shfl_xor_sync(FULL, st_l[0], o);
            st_l[1] += __shfl_xor_sync(FULL, st_l[1], o);
        }
        if (g == 0) {
            red_m[warp * DEC_ROWS + 2 * t4] = st_m[0];
            red_m[warp * DEC_ROWS + 2 * t4 + 1] = st_m[1];
            red_l[warp * DEC_ROWS + 2 * t4] = st_l[0];
            red_l[warp * DEC_ROWS + 2 * t4 + 1] = st_l[1];
        }
    } else {
        float l_row = l_run + __shfl_xor_sync(FULL, l_run, 1);
        l_row += __shfl_xor_sync(FULL, l_row, 2);
        if (t4 == 0) {
            red_m[warp * DEC_ROWS + g] = m_run;
            red_l[warp * DEC_ROWS + g] = l_row;
        }
    }
    if constexpr (FP8) {
#pragma unroll
        for (int q = 0; q < NQ; q++)
#pragma unroll
            for (int h = 0; h < 2 * WW; h++) {
                const int d = 32 * WW * q + 4 * WW * g + 2 * h;
                *(float2 *)&red_acc[(warp * DEC_ROWS + 2 * t4) * HD + d] = make_float2(accT[q][h][0], accT[q][h][2]);
                *(float2 *)&red_acc[(warp * DEC_ROWS + 2 * t4 + 1) * HD + d] = make_float2(accT[q][h][1], accT[q][h][3]);
            }
    } else {
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *(float2 *)&red_acc[(warp * DEC_ROWS + g) * HD + 8 * j + 2 * t4] = make_float2(acc[j][0], acc[j][1]);
    }
    __syncthreads();
    dec_finish(p, red_m, red_l, red_acc, HD, seq, h0, rows, split, direct);
}

/* one CTA per item: grid (splits, kv heads x head chunks, sequences) */
template <int HD, bool FP8, bool W8 = false>
__global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel_v3(dec_params p) {
    tm_pdl_enter();
    extern __shared__ __align__(16) unsigned char smem[];
    v3_item<HD, FP8, W8>(p, smem, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z);
}

/* ---- merge of the splits' partials: one block per (sequence, query head) ---- */

/* v2: one block of DEC_MERGE_THREADS per (sequence, query head). v1 (removed) was one warp per pair, whose lanes
 * walked the splits one after the other for each of their dims, an L2 round trip a split: one 8B sequence of 16384
 * tokens over 64 splits took 68 us where the attention itself needs ~10 (thirtieth session). Here the weights
 * 2^(lse_k - M) are computed once into shared memory, and the block's threads take (dim pair, split group) cells:
 * G = DEC_MERGE_THREADS / (head_dim / 2) groups, group g summing splits g, g + G, ... of its two dims (8-byte loads,
 * unrolled so that they go out together); the groups are then added in order (deterministic). */
constexpr int DEC_MERGE_THREADS = 256;

__global__ void __launch_bounds__(DEC_MERGE_THREADS) attn_decode_merge_kernel_v2(dec_params p) {
    tm_pdl_enter();
    __shared__ float wk[DEC_MAX_SEQ_SPLITS]; /* 2^(lse_k - M) of the pair's non-empty splits */
    __shared__ float2 part[DEC_MERGE_THREADS];
    __shared__ float red[DEC_MERGE_THREADS / 32];
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t pair = (int64_t)blockIdx.x;
    const int seq = (int)(pair / p.n_heads), hd = p.head_dim;
    int split_tok;
    const int nv = dec_split_plan(p.ctx_len[seq], p.n_splits, &split_tok);
    if (nv <= 1) return; /* split 0 wrote it */
    const float *lse = p.part_lse + (size_t)pair * (size_t)p.n_splits;
    float m = -INFINITY;
    for (int k = tid; k < nv; k += DEC_MERGE_THREADS) m = fmaxf(m, lse[k]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    float M = red[0];
    for (int w = 1; w < DEC_MERGE_THREADS / 32; w++) M = fmaxf(M, red[w]);
    __syncthreads(); /* red is reused */
    float l = 0.0f;
    for (int k = tid; k < nv; k += DEC_MERGE_THREADS) {
        const float e = fast_exp2(lse[k] - M);
        wk[k] = e;
        l += e;
    }
    l = warp_sum(l);
    if (lane == 0) red[warp] = l;
    __syncthreads();
    float L = 0.0f;
    for (int w = 0; w < DEC_MERGE_THREADS / 32; w++) L += red[w];
    const int hd2 = hd >> 1, G = DEC_MERGE_THREADS / hd2, d2 = tid % hd2, g = tid / hd2;
    const float2 *po = reinterpret_cast<const float2 *>(p.part_o + (size_t)pair * (size_t)p.n_splits * (size_t)hd);
    float2 acc = make_float2(0.0f, 0.0f);
    if (g < G) {
#pragma unroll 8
        for (int k = g; k < nv; k += G) {
            const float2 v = po[(size_t)k * (size_t)hd2 + (size_t)d2];
            acc.x = fmaf(wk[k], v.x, acc.x);
            acc.y = fmaf(wk[k], v.y, acc.y);
        }
    }
    part[tid] = acc;
    __syncthreads();
    if (g != 0) return;
    float2 o = part[d2];
    for (int j = 1; j < G; j++) {
        o.x += part[j * hd2 + d2].x;
        o.y += part[j * hd2 + d2].y;
    }
    const float inv = 1.0f / L;
    const size_t at = (size_t)pair * (size_t)hd + 2 * (size_t)d2;
    put_out(p, at, o.x * inv);
    put_out(p, at + 1, o.y * inv);
}

/* ---- host side ---- */

typedef void (*dec_kernel_fn)(dec_params);

int dec_stages(int max_ctx) { return max_ctx <= 0 ? 1 : (max_ctx - 1) / DEC_STAGE_TOK + 1; }

/* the most splits the launcher picks by itself (the work buffer may allow fewer) */
int dec_split_cap(int n_seqs, int max_ctx) {
    const int L = dec_stages(max_ctx);
    int by_ctx = L / (n_seqs == 1 && L <= DEC_SHORT_SPLIT_STAGES ? 2 : DEC_MIN_SPLIT_STAGES);
    int by_seq = DEC_MAX_SEQ_SPLITS / (n_seqs > 0 ? n_seqs : 1);
    if (by_ctx < 1) by_ctx = 1;
    if (by_seq < 1) by_seq = 1;
    return by_ctx < by_seq ? by_ctx : by_seq;
}

int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

/* block ids a v3 CTA stages in shared memory at a time (after its ring), before the launcher's choice of the small
 * table; *forced: TM_CUDA_DEC_TBL=n set it (n, and no choice) */
int dec_tbl_entries(bool fp8, bool *forced) {
    const int n = fp8 ? 0 : env_int("TM_CUDA_DEC_TBL", 0);
    *forced = n > 0;
    if (fp8) return DEC_TBL8;
    if (n > 0) return n < 128 ? 128 : n > 4096 ? 4096 : n; /* >= 128: a chunk holds a stage at block size 1 */
    return DEC_TBL;
}

/* the v3 kernel and its shared memory with a block-id table of tbl_n entries over a bf16 cache (an fp8 cache's
 * table is DEC_TBL8) */
dec_kernel_fn v3_kernel(int hd, bool fp8, int tbl_n, size_t *smem) {
    if (fp8 && hd == 128 && !tm_env_is_0("TM_CUDA_DEC_W8")) {
        *smem = DEC_W8_SMEM;
        return attn_decode_kernel_v3<128, true, true>;
    }
    const size_t tbl = (size_t)tbl_n * 4;
    switch (hd) {
#define TM_DEC_V3_CASE(H)                                                                                            \
    case H:                                                                                                          \
        *smem = fp8 ? v3_cfg<H>::SMEM8 : v3_cfg<H>::SMEM + tbl;                                                      \
        return fp8 ? attn_decode_kernel_v3<H, true> : attn_decode_kernel_v3<H, false>;
        TM_DEC_V3_CASE(32)
        TM_DEC_V3_CASE(64)
        TM_DEC_V3_CASE(96)
        TM_DEC_V3_CASE(128)
        TM_DEC_V3_CASE(160)
        TM_DEC_V3_CASE(192)
        TM_DEC_V3_CASE(224)
        TM_DEC_V3_CASE(256)
#undef TM_DEC_V3_CASE
    default:
        return NULL;
    }
}

dec_kernel_fn v2_kernel(int hd) {
    switch ((hd + 63) / 64) {
    case 1: return attn_decode_kernel_v2<1>;
    case 2: return attn_decode_kernel_v2<2>;
    case 3: return attn_decode_kernel_v2<3>;
    case 4: return attn_decode_kernel_v2<4>;
    default: return NULL;
    }
}

int ilog2_exact(int x) { /* log2 of a power of two, else -1 */
    if (x <= 0 || (x & (x - 1))) return -1;
    int l = 0;
    while ((1 << l) < x) l++;
    return l;
}

} // namespace

extern "C" size_t tm_cuda_attn_decode_work_bytes(int32_t n_seqs, int32_t n_heads, int32_t head_dim,
                                                 int32_t max_context_len) {
    if (n_seqs <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
    /* dec_split_cap's split count for one sequence, monotone in max_context_len */
    const int L = dec_stages(max_context_len);
    int by_ctx = L / DEC_MIN_SPLIT_STAGES, short_ctx = (L < DEC_SHORT_SPLIT_STAGES ? L : DEC_SHORT_SPLIT_STAGES) / 2;
    if (by_ctx < short_ctx) by_ctx = short_ctx;
    if (by_ctx <= 1) return 0; /* never split */
    /* (sequence, split) pairs: n_seqs * n_splits <= min(n_seqs * by_ctx, DEC_MAX_SEQ_SPLITS); monotone in n_seqs
     * and max_context_len, so one buffer sized for the largest batch and context serves every smaller launch */
    int64_t pairs = (int64_t)n_seqs * by_ctx;
    if (pairs > DEC_MAX_SEQ_SPLITS) pairs = DEC_MAX_SEQ_SPLITS;
    return (size_t)pairs * (size_t)n_heads * ((size_t)head_dim + 1) * sizeof(float) + DEC_WORK_SLACK;
}

extern "C" cudaError_t tm_cuda_attn_decode(const tm_cuda_attn_args *a, cudaStream_t stream) {
    if (!a || a->n_seqs < 0 || a->n_tokens != a->n_seqs) return cudaErrorInvalidValue;
    if (a->n_seqs == 0) return cudaSuccess;
    if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim > 256 || a->head_dim % 2 || a->block_size <= 0 || a->max_blocks <= 0 || a->n_seqs > 65535)
        return cudaErrorInvalidValue;
    if (!a->q || !a->k_cache || !a->v_cache || !a->out || !a->context_len || !a->block_table)
        return cudaErrorInvalidValue;

    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    dec_params p;
    p.q = a->q;
    p.kc = a->k_cache;
    p.vc = a->v_cache;
    p.out = a->out;
    p.out8 = a->out8;
    p.out8_inv = a->out8_inv;
    p.part_o = NULL;
    p.part_lse = NULL;
    p.ctx_len = a->context_len;
    p.block_table = a->block_table;
    p.n_seqs = a->n_seqs;
    p.n_heads = a->n_heads;
    p.n_kv = a->n_kv_heads;
    p.group = group;
    p.hchunks = (group + DEC_ROWS - 1) / DEC_ROWS;
    p.head_dim = hd;
    p.max_blocks = a->max_blocks;
    p.block_size = a->block_size;
    p.bs_log2 = ilog2_exact(a->block_size);
    p.n_splits = 1;
    p.chunk_tok = 0;
    p.scale = a->scale;
    p.scale_log2 = a->scale * 1.4426950408889634f;
    p.fp8 = a->kv_fp8;
    p.lazy = env_int("TM_CUDA_ATTN_DECODE_LAZY", 1) != 0;

    int ver = env_int("TM_CUDA_ATTN_DECODE_V", 3);
    const bool q4 = ((uintptr_t)a->q & 3) == 0, kv4 = (((uintptr_t)a->k_cache | (uintptr_t)a->v_cache) & 3) == 0;
    const bool kv16 = (((uintptr_t)a->k_cache | (uintptr_t)a->v_cache) & 15) == 0;
    size_t smem = 0;
    dec_kernel_fn fn = NULL;
    bool tbl_forced = false;
    int tbl_n = dec_tbl_entries(p.fp8, &tbl_forced);
    if (ver >= 3) {
        fn = (p.bs_log2 >= 0 && a->block_size <= 65536 && q4 && kv16) ? v3_kernel(hd, p.fp8, tbl_n, &smem) : NULL;
        if (!fn) ver = 2;
    }
    if (ver == 2) {
        fn = (q4 && kv4 && !p.fp8) ? v2_kernel(hd) : NULL; /* v2 reads bf16 only */
        if (!fn) ver = 1;
    }
    if (ver <= 1) {
        attn_decode_kernel_v1<<<dim3((unsigned)a->n_heads, (unsigned)a->n_seqs), DEC_THREADS, 0, stream>>>(p);
        return cudaGetLastError();
    }

    cudaError_t e;
    if (smem > 0) {
        if ((e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
            return e;
        e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        if (e != cudaSuccess) return e;
    }
    /* resident CTA slots of the GPU */
    int dev = 0, sms = 0, occ = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, DEC_THREADS, smem)) != cudaSuccess) return e;
    if (occ < 1) occ = 1;
    const int64_t ctas = (int64_t)a->n_seqs * a->n_kv_heads * p.hchunks;
    if (ver >= 3 && !p.fp8 && hd <= 64 && !tbl_forced && ctas >= (int64_t)sms * occ) { /* DEC_TBL_SMALL */
        size_t small = 0;
        v3_kernel(hd, false, DEC_TBL_SMALL, &small);
        int occ_small = 0;
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_small, fn, DEC_THREADS, small)) != cudaSuccess)
            return e;
        if (occ_small > occ) {
            smem = small;
            occ = occ_small;
            tbl_n = DEC_TBL_SMALL;
        }
    }

    /* split count: fill the slots once when the CTAs alone don't, within the caps */
    const int L = dec_stages(a->max_context_len);
    const int64_t pairs = (int64_t)a->n_seqs * a->n_heads;
    int64_t cap_work = 0;
    if (a->work && a->work_bytes > (size_t)DEC_WORK_SLACK)
        cap_work = (int64_t)((a->work_bytes - DEC_WORK_SLACK) / ((size_t)pairs * ((size_t)hd + 1) * sizeof(float)));
    const int64_t slots = (int64_t)sms * occ;
    int64_t s;
    const int forced = env_int("TM_CUDA_ATTN_DECODE_SPLITS", 0);
    if (forced > 0) {
        s = forced;
    } else {
        const int cap = dec_split_cap(a->n_seqs, a->max_context_len);
        if (ctas < slots) {
            s = slots / ctas; /* fill the slots once */
            /* ...except one sequence whose K and V of a kv head are at most DEC_ONE_SPLIT_BYTES: it runs unsplit, one
             * CTA a kv head, without the merge kernel. bench latency --depth D, batch 1, tok/s unsplit against 8
             * splits (thirtieth session, the merge as one block a head): 1B bf16 (256 bytes a token) D 256 1186 /
             * 1152, D 512 1153 / 1147, D 896 1100 / 1142; 8B bf16 (512 bytes) D 256 242.8 / 243.4, D 512 237.0 /
             * 242.3, D 896 227.9 / 241.7 */
            const int64_t head_bytes = (int64_t)a->max_context_len * 2 * hd * (p.fp8 ? 1 : 2);
            if (a->n_seqs == 1 && head_bytes <= DEC_ONE_SPLIT_BYTES) s = 1;
        } else { /* several waves: the split count whose last wave is fullest (1 when the waves are whole), a
                  * point of efficiency per extra split preferred (each adds a partial to merge), and pieces of
                  * >= 1024 tokens (shorter ones measured slower: 256 x 1024 fp8, 163 -> 221 us at 3 splits) */
            s = 1;
            double best = -1.0;
            for (int64_t k = 1; k <= cap && k <= L / 16; k++) {
                const double w = (double)(ctas * k) / (double)slots, eff = w / ceil(w) - 0.01 * (double)(k - 1);
                if (eff > best + 1e-9) {
                    best = eff;
                    s = k;
                }
            }
        }
        if (s > cap) s = cap;
    }
    if (s > L) s = L;
    if (s > DEC_MAX_SEQ_SPLITS) s = DEC_MAX_SEQ_SPLITS; /* the merge's shared weights */
    if (s > cap_work) s = cap_work;
    if (s < 1) s = 1;
    p.n_splits = (int)s;
    if (p.bs_log2 >= 0) p.chunk_tok = ((tbl_n - 2) * a->block_size) / DEC_STAGE_TOK * DEC_STAGE_TOK;
    if (s > 1) {
        const uintptr_t base = ((uintptr_t)a->work + 15) & ~(uintptr_t)15;
        const size_t n_lse = (size_t)pairs * (size_t)s;
        p.part_lse = (float *)base;
        p.part_o = (float *)(base + ((n_lse * sizeof(float) + 15) & ~(size_t)15));
    }

    const dim3 grid((unsigned)s, (unsigned)(a->n_kv_heads * p.hchunks), (unsigned)a->n_seqs);
    if ((e = tm_launch(fn, grid, dim3(DEC_THREADS), smem, stream, p)) != cudaSuccess) return e;
    if (s > 1)
        return tm_launch(attn_decode_merge_kernel_v2, dim3((unsigned)pairs), dim3(DEC_MERGE_THREADS), 0, stream, p);
    return cudaSuccess;
}
