/* tm_cuda_attn_prefill.cu -- paged FlashAttention for prefill chunks and mixed batches (causal, GQA, mma.sync / wgmma). */
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

/* Four kernels behind one launcher: v5 by default for head_dim 64 / 128 over a bf16 cache, v3 over an fp8 cache
 * (any other head_dim, a block_size that is no power of two or a pointer that is not 16-byte aligned takes v1;
 * v2, v3 and v5 cover the same cases); TM_CUDA_ATTN_PREFILL_V=1/2/3/5 forces that version (fp8: v1 or v3),
 * TM_CUDA_ATTN_PREFILL_BN=64/128 picks v5's key tile.
 *
 * v1 -- the simple one, any head_dim <= 256: one CTA of 4 warps per (16-token tile of one sequence, query head);
 *   32-key K/V tiles gathered through the block table into shared memory as f32; each warp owns 4 tokens, a lane
 *   scores one key of the tile, online softmax in f32 (expf), each lane accumulates head_dim/32 output dims.
 *
 * v2 -- FlashAttention-2 on tensor cores (head_dim 64 and 128):
 *   - a CTA of 8 warps owns a 128-row Q tile of one (sequence, kv head): rows are (token, query head) pairs of the
 *     kv head's GQA group, token-major (row r = token r / gh, head r % gh), so the group shares every K/V tile and
 *     a decode token mixed into the batch still fills `group` rows of the tile; each warp owns 16 rows and keeps
 *     its Q fragments in registers for the whole CTA;
 *   - tiles are enumerated per sequence from the end (the first tile of a sequence is its last 128/gh tokens, the
 *     most work), grid = (tile slot, kv head[, head chunk]) flattened with the heads fastest, and each CTA finds
 *     its (sequence, tile) by a block-wide scan of query_start (no work buffer, no host knowledge of lengths);
 *   - K/V tiles of 64 keys are gathered through the block table (any block_size) with 16-byte cp.async into a
 *     3-stage ring in XOR-swizzled shared memory (conflict-free ldmatrix); the block ids of the tile after next
 *     are loaded into registers one iteration ahead, so the table lookup never stalls the pipeline;
 *   - S = Q K^T and O += P V with mma.sync m16n8k16 bf16 / f32 accumulate: K fragments by ldmatrix.x4, V by
 *     ldmatrix.x4.trans, P reused straight from the S accumulators as the A operand (FA2 register layout);
 *   - online softmax in registers, log2 domain (scale * log2 e folded into one FMA before ex2.approx), per-thread
 *     partial row sums reduced across the quad once at the end; key tiles are visited from the diagonal down, the
 *     causal mask is applied only to tiles that cross some row's diagonal, fully masked tiles are never loaded;
 *   - the output goes through the (by then free) Q tile in shared memory and leaves in 16-byte stores.
 *   Per 64-key tile a warp issues (hd/16)*(64/8) + (64/16)*(hd/8) MMAs; shared memory traffic per tile is
 *   8 warps x (K + V) tile, i.e. 16 FLOP per byte of ldmatrix, which bounds mma.sync near 500 TFLOP/s on an
 *   H200 -- enough for the FA2-class 300-400 TFLOP/s this version aims at.
 *
 * v3 -- v2's tiling, gather and softmax with Hopper warpgroup MMAs (wgmma): 2 warpgroups x 64 rows; Q and K are
 *   read by the tensor cores straight from 128-byte-swizzled shared memory (no ldmatrix: the 16-FLOP-per-byte
 *   shared-memory bound of v2 goes away), P stays in registers as the A operand of O += P V, V is read N-major by
 *   descriptor. Products are waited for before use (the two warpgroups overlap each other, not yet themselves).
 *
 * (v4, a FlashAttention-3 structure with a producer warpgroup, setmaxnreg and named-barrier ping-pong, measured
 *   358 TFLOP/s against v3's 364 and was removed in the seventh session: its 384 threads cap ptxas at 168
 *   registers, too few for 128-key tiles; docs/PERFORMANCE.md.)
 *
 * v5 (default) -- v3 plus FlashAttention-3's intra-warpgroup overlap, 128-key tiles for head_dim 128, and the two
 *   warpgroups offset by giving every K/V copy to one of them (see the comment above the kernel): 455 TFLOP/s
 *   against v3's 364 in the same run (8B geometry, 4096 tokens; 467 against 371 at batch 4).
 *
 * Twelfth session: v5's copying threads each take consecutive keys of one block (one block-table load a tile
 * instead of one a row): +10%. v5 keeps a row's running max until it grows by more than 2^8 (prefill_geom.lazy;
 * TM_CUDA_ATTN_PREFILL_LAZY=0 moves it on every growth): O and l share the stale max, so O / l is the same softmax,
 * P stays below 256, and a warp whose rows all keep their max skips the O rescale (64 multiplies a thread a round):
 * +2%. The same in v3 (whose rescale sits inside the per-row loop) made it 7-11% slower and was taken out.
 * Eighteenth session: the tiles that cross no diagonal take no row max at all (prefill_geom.fastmax,
 * TM_CUDA_V5_FASTMAX=0 turns it off): P = 2^(x - m) against the max the masked tiles left, the row sums (which bound
 * every P) checked against 2^40, and a round that fails the check done again exactly at the next barrier: +3-5%.
 * (The lazy max, and TM_CUDA_ATTN_PREFILL_LAZY, then govern only the masked rounds and redone ones.)
 * Twentieth session: v5p, v5 as a persistent kernel (one CTA an SM taking tile after tile from a counter, the next
 * tile's first copies and Q overlapping this one's last round), taken for head_dim 128 from 8 tiles an SM
 * (TM_CUDA_PREFILL_PERSIST=1/0 forces it on / off): bit for bit v5's output; 8B 4096 at batch 2 / 3 / 4 +2 / +3 / +3%
 * (587 TFLOP/s at batch 4), 8 x 1024 +5%; at ~1 tile an SM (a 512-token chunk) it loses 3%, hence the threshold.
 * Measured and kept on branches only (docs/PERFORMANCE.md): K/V copied by tensor maps (v6: 257-303 TFLOP/s, one
 * box per 16-token block) and a producer warpgroup beside v5's consumers (v7: 379). */

namespace {

/* ---- small device helpers ---------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* 16-byte global -> shared copy; zero-fills the destination when !ok (src must still be a valid pointer) */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
/* the same without the zero-fill operand: all 16 bytes always copied */
__device__ __forceinline__ void cp_async16_all(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* d (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col) */
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* P = 2^(x * sl2 - mu) in place for row half h (rows lane / 4 and + 8) of a thread's S fragment (N = BN / 2 floats,
 * mma / wgmma C layout: element 4 n + 2 h + e is column 8 n + 2 (lane % 4) + e); returns the sum of those P */
template <int N> __device__ __forceinline__ float exp_row(float (&sc)[N], int h, float sl2, float mu) {
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < N / 4; n++) {
        sc[4 * n + 2 * h] = ex2(fmaf(sc[4 * n + 2 * h], sl2, -mu));
        sc[4 * n + 2 * h + 1] = ex2(fmaf(sc[4 * n + 2 * h + 1], sl2, -mu));
        sum += sc[4 * n + 2 * h] + sc[4 * n + 2 * h + 1];
    }
    return sum;
}

/* two floats -> bf16x2 (lo in the low half) */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* byte offset of 16-byte chunk `chunk` of row `row` in a (rows, HD) bf16 tile, chunks XOR-swizzled by row & 7:
 * the 8 rows an ldmatrix reads at one logical chunk land in 8 different bank groups */
template <int HD> __device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return (uint32_t)(row * (HD * 2) + ((chunk ^ (row & 7)) << 4));
}

/* Tile slot -> (sequence, tile index from the sequence's end). Sequence s has ceil(q_len / tq) tiles; slots are
 * numbered sequence by sequence (REV: from the last sequence back, which puts the prefill chunks of a batch laid
 * out decode tokens first ahead of the 1-token sequences). Every thread of the block calls it; false when the
 * slot is past the last tile. */
template <int NT, bool REV = false>
__device__ bool find_tile(const int32_t *query_start, int32_t n_seqs, int32_t tq, int32_t slot, int32_t *seq,
                          int32_t *tile) {
    __shared__ int32_t s_warp[NT / 32];
    __shared__ int32_t s_found[2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) s_found[0] = -1;
    __syncthreads();
    int32_t done = 0; /* tiles of the sequences before this chunk */
    for (int32_t c0 = 0; c0 < n_seqs; c0 += NT) {
        const int32_t s = REV ? n_seqs - 1 - (c0 + tid) : c0 + tid;
        int32_t nt = 0;
        if (c0 + tid < n_seqs) {
            const int32_t ql = query_start[s + 1] - query_start[s];
            nt = ql > 0 ? (ql + tq - 1) / tq : 0;
        }
        int32_t x = nt; /* inclusive scan within the warp */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) s_warp[warp] = x;
        __syncthreads();
        int32_t before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < NT / 32; w++) {
            const int32_t v = s_warp[w];
            before += w < warp ? v : 0;
            total += v;
        }
        const int32_t incl = done + before + x;
        if (nt > 0 && slot < incl && slot >= incl - nt) {
            s_found[0] = s;
            s_found[1] = slot - (incl - nt);
        }
        done += total;
        __syncthreads(); /* s_found visible, s_warp free for the next chunk */
        if (done > slot) break;
    }
    *seq = s_found[0];
    *tile = s_found[1];
    return *seq >= 0;
}

/* Host-derived tiling of the GQA group (same for every CTA of a launch). */
struct prefill_geom {
    int32_t group; /* query heads per kv head */
    int32_t gh;    /* query heads of one kv head in a tile: min(group, BM) */
    int32_t n_hc;  /* head chunks per kv head: ceil(group / gh) */
    int32_t tq;    /* tokens per tile: BM / gh */
    int32_t bs_log2; /* block_size = 1 << bs_log2 */
    float lazy;      /* v5: how far (log2 units) a row's max may grow before O is rescaled */
    int32_t rowg;    /* v5: a copying thread takes consecutive rows of one block (block_size >= its row count;
                      * TM_CUDA_V5_ROWG=0: rows spread over the tile, one block-table load each) */
    int32_t idpre;   /* v5 with rowg: that block id loaded one tile ahead (TM_CUDA_V5_IDPRE=0: when the copies go out) */
    int32_t fastmax; /* v5: the unmasked tiles' softmax without a row max (TM_CUDA_V5_FASTMAX=0: with it) */
};

/* The epilogue of v2, v3 and v5, after every product: O / l in bf16 staged through the Q tile (swz layout; each warp its
 * own 16 rows), then 16-byte stores of the rows that are real (token, query head) pairs of this tile */
template <int HD>
__device__ __forceinline__ void store_o_hu(const float (&o)[HD / 2], const float (&lrow)[2], uint32_t sQ, int warp,
                                           int lane, int32_t row0, int32_t n_rows_tok, const tm_cuda_attn_args &a,
                                           const prefill_geom &g, int32_t hu) {
    constexpr int CPR = HD / 8;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = lrow[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int r = warp * 16 + (lane >> 2) + h * 8;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            const uint32_t v = pack_bf16(o[4 * d + 2 * h] * inv, o[4 * d + 2 * h + 1] * inv);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sQ + swz<HD>(r, d) + (lane & 3) * 4), "r"(v));
        }
    }
    __syncwarp();
    const int32_t e_hc = hu % g.n_hc;
    const int32_t e_heads = min(g.gh, g.group - e_hc * g.gh);
    const size_t e_head0 = (size_t)(hu / g.n_hc) * (size_t)g.group + (size_t)e_hc * (size_t)g.gh;
#pragma unroll
    for (int it = 0; it < 16 * CPR / 32; it++) {
        const int i = lane + it * 32;
        const int r = warp * 16 + i / CPR, c = i % CPR;
        const int32_t tl = r / g.gh, hl = r % g.gh;
        if (tl < n_rows_tok && hl < e_heads) {
            uint32_t w0, w1, w2, w3;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                         : "r"(sQ + swz<HD>(r, c)));
            uint16_t *dst = a.out + (size_t)(row0 + tl) * ((size_t)a.n_heads * HD) + (e_head0 + (size_t)hl) * HD + c * 8;
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w0), "r"(w1), "r"(w2), "r"(w3)
                         : "memory");
        }
    }
}

/* store_o_hu for a CTA whose tile is its blockIdx.x (hu: the tile's kv head and head chunk) */
template <int HD>
__device__ __forceinline__ void store_o(const float (&o)[HD / 2], const float (&lrow)[2], uint32_t sQ, int warp,
                                        int lane, int32_t row0, int32_t n_rows_tok, const tm_cuda_attn_args &a,
                                        const prefill_geom &g, int32_t per_slot) {
    store_o_hu<HD>(o, lrow, sQ, warp, lane, row0, n_rows_tok, a, g, (int32_t)(blockIdx.x % (uint32_t)per_slot));
}

/* ---- v1: simple f32 kernel ----------------------------------------------------------------------- */

constexpr int V1_TQ = 16;   /* tokens per CTA */
constexpr int V1_KT = 32;   /* keys per shared-memory tile (one per lane) */
constexpr int V1_NW = 4;    /* warps; warp w owns tokens w, w + 4, ... */
constexpr int V1_MAXC = 8;  /* head_dim <= 32 * V1_MAXC */
constexpr int V1_TPW = V1_TQ / V1_NW;

size_t v1_smem_bytes(int32_t hd) {
    return (size_t)(V1_TQ * hd + V1_KT * (hd + 1) + V1_KT * hd) * sizeof(float);
}

/* grid: (n_seqs * n_qt, n_heads); block V1_NW * 32 */
__global__ void __launch_bounds__(V1_NW * 32) attn_prefill_kernel_v1(const tm_cuda_attn_args a, int32_t n_qt) {
    extern __shared__ float v1_smem[];
    const int32_t hd = a.head_dim;
    float *q_s = v1_smem;                  /* (V1_TQ, hd) */
    float *k_s = q_s + V1_TQ * hd;         /* (V1_KT, hd + 1) */
    float *v_s = k_s + V1_KT * (hd + 1);   /* (V1_KT, hd) */
    const __nv_bfloat16 *q = reinterpret_cast<const __nv_bfloat16 *>(a.q);
    const __nv_bfloat16 *kc = reinterpret_cast<const __nv_bfloat16 *>(a.k_cache);
    const __nv_bfloat16 *vc = reinterpret_cast<const __nv_bfloat16 *>(a.v_cache);
    __nv_bfloat16 *out = reinterpret_cast<__nv_bfloat16 *>(a.out);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t s = (int32_t)(blockIdx.x / (uint32_t)n_qt), t0 = (int32_t)(blockIdx.x % (uint32_t)n_qt) * V1_TQ;
    const int32_t h = (int32_t)blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
    const int32_t q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
    if (t0 >= ql) return;
    const int32_t nt = min(V1_TQ, ql - t0), base = a.context_len[s] - ql;
    const int32_t kv_end = base + t0 + nt; /* keys 0 .. kv_end-1 are needed by some token of the tile */
    const int32_t *bt = a.block_table + (size_t)s * (size_t)a.max_blocks;
    const size_t ld = (size_t)a.n_heads * (size_t)hd;

    for (int32_t i = tid; i < V1_TQ * hd; i += V1_NW * 32) {
        const int32_t t = i / hd, d = i % hd;
        q_s[i] = t < nt ? __bfloat162float(q[(size_t)(q0 + t0 + t) * ld + (size_t)h * hd + d]) : 0.0f;
    }

    float m[V1_TPW], l[V1_TPW], o[V1_TPW][V1_MAXC];
#pragma unroll
    for (int c = 0; c < V1_TPW; c++) {
        m[c] = -INFINITY;
        l[c] = 0.0f;
#pragma unroll
        for (int j = 0; j < V1_MAXC; j++) o[c][j] = 0.0f;
    }

    for (int32_t k0 = 0; k0 < kv_end; k0 += V1_KT) {
        __syncthreads(); /* previous tile consumed (and q_s written, the first time) */
        for (int32_t i = tid; i < V1_KT * hd; i += V1_NW * 32) {
            const int32_t kk = i / hd, d = i % hd, key = k0 + kk;
            float kv = 0.0f, vv = 0.0f;
            if (key < kv_end) {
                const size_t off =
                    (((size_t)bt[key / a.block_size] * (size_t)a.n_kv_heads + (size_t)kvh) * (size_t)a.block_size +
                     (size_t)(key % a.block_size)) * (size_t)hd + (size_t)d;
                if (a.kv_fp8) {
                    kv = tm_fp8_to_f32(reinterpret_cast<const uint8_t *>(a.k_cache)[off]);
                    vv = tm_fp8_to_f32(reinterpret_cast<const uint8_t *>(a.v_cache)[off]);
                } else {
                    kv = __bfloat162float(kc[off]);
                    vv = __bfloat162float(vc[off]);
                }
            }
            k_s[kk * (hd + 1) + d] = kv;
            v_s[kk * hd + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < V1_TPW; c++) {
            const int32_t t = warp + c * V1_NW;
            if (t >= nt) continue; /* warp-uniform */
            const int32_t lim = base + t0 + t, key = k0 + lane;
            float sc = -INFINITY;
            if (key <= lim) {
                float dot = 0.0f;
                for (int32_t d = 0; d < hd; d++) dot = fmaf(q_s[t * hd + d], k_s[lane * (hd + 1) + d], dot);
                sc = dot * a.scale;
            }
            float mt = sc;
#pragma unroll
            for (int x = 16; x > 0; x >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
            const float mn = fmaxf(m[c], mt); /* finite: key 0 <= lim is in the first tile */
            const float p = sc == -INFINITY ? 0.0f : expf(sc - mn);
            const float alpha = expf(m[c] - mn);
            float ps = p;
#pragma unroll
            for (int x = 16; x > 0; x >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, x);
            m[c] = mn;
            l[c] = l[c] * alpha + ps;
            float acc[V1_MAXC];
#pragma unroll
            for (int j = 0; j < V1_MAXC; j++) acc[j] = 0.0f;
            for (int kk = 0; kk < V1_KT; kk++) {
                const float pk = __shfl_sync(0xffffffffu, p, kk);
#pragma unroll
                for (int j = 0; j < V1_MAXC; j++) {
                    const int32_t d = lane + 32 * j;
                    if (d < hd) acc[j] = fmaf(pk, v_s[kk * hd + d], acc[j]);
                }
            }
#pragma unroll
            for (int j = 0; j < V1_MAXC; j++) o[c][j] = o[c][j] * alpha + acc[j];
        }
    }

#pragma unroll
    for (int c = 0; c < V1_TPW; c++) {
        const int32_t t = warp + c * V1_NW;
        if (t >= nt) continue;
        const float inv = l[c] > 0.0f ? 1.0f / l[c] : 0.0f;
#pragma unroll
        for (int j = 0; j < V1_MAXC; j++) {
            const int32_t d = lane + 32 * j;
            if (d < hd) out[(size_t)(q0 + t0 + t) * ld + (size_t)h * hd + d] = __float2bfloat16(o[c][j] * inv);
        }
    }
}

/* ---- v2: FlashAttention-2 with mma.sync ------------------------------------------------------------ */

/* HD head_dim, BN keys per K/V tile, NW warps (BM = 16 * NW query rows), STAGES K/V ring depth, MINB CTAs/SM,
 * QREG: Q fragments live in registers (else re-read from shared memory for every K tile).
 * grid: (n_slots * n_kv_heads * n_hc); block NW * 32; dynamic smem v2_smem_bytes. */
template <int HD, int BN, int NW, int STAGES, int MINB, bool QREG>
__global__ void __launch_bounds__(NW * 32, MINB) attn_prefill_kernel_v2(const tm_cuda_attn_args a,
                                                                        const prefill_geom g) {
    constexpr int NT = NW * 32, BM = NW * 16;
    constexpr int CPR = HD / 8;         /* 16-byte chunks per row */
    constexpr int RPP = NT / CPR;       /* rows covered by one pass of the block */
    constexpr int KV_ROWS = BN / RPP;   /* K (and V) rows this thread copies per tile */
    constexpr int Q_ROWS = BM / RPP;
    constexpr int TILE = BN * HD * 2;   /* bytes of one K or V tile */
    static_assert(HD % 16 == 0 && BN % 16 == 0 && NT % CPR == 0 && BN % RPP == 0 && BM % RPP == 0, "tile shape");
    static_assert(STAGES >= 2, "pipeline depth");

    extern __shared__ __align__(128) uint8_t v2_smem[];
    const uint32_t sQ = smem_u32(v2_smem);        /* (BM, HD) bf16, swizzled; later the output tile */
    const uint32_t sK = sQ + BM * HD * 2;         /* (STAGES, BN, HD) */
    const uint32_t sV = sK + STAGES * TILE;       /* (STAGES, BN, HD) */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t per_slot = a.n_kv_heads * g.n_hc;
    const int32_t slot = (int32_t)(blockIdx.x / (uint32_t)per_slot), hu = (int32_t)(blockIdx.x % (uint32_t)per_slot);
    const int32_t kvh = hu / g.n_hc, hc = hu % g.n_hc;
    int32_t s, ti;
    if (!find_tile<NT>(a.query_start, a.n_seqs, g.tq, slot, &s, &ti)) return;

    const int32_t q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
    const int32_t base = a.context_len[s] - ql;   /* cache index of the sequence's first query token */
    const int32_t t1 = ql - ti * g.tq, t0 = max(t1 - g.tq, 0); /* this tile's tokens t0 .. t1-1 */
    __shared__ int32_t s_epi[2]; /* (first batch row, tokens) of the tile, re-read by the epilogue: nothing of
                                  * the epilogue's addressing has to stay live in registers across the main loop */
    if (tid == 0) {
        s_epi[0] = q0 + t0;
        s_epi[1] = t1 - t0;
    }
    const int32_t kv_end = base + t1;               /* keys 0 .. kv_end-1 are needed by some row */
    const int32_t n_kt = (kv_end + BN - 1) / BN;
    const int32_t n_full = (base + t0 + 1) / BN;    /* key tiles below every row's diagonal: no mask */
    const int32_t *bt = a.block_table + (size_t)s * (size_t)a.max_blocks;
    const size_t ld = (size_t)a.n_heads * HD;       /* q / out row stride (elements) */
    const size_t head0 = (size_t)kvh * (size_t)g.group + (size_t)hc * (size_t)g.gh; /* first query head of the tile */
    const int32_t heads_here = min(g.gh, g.group - hc * g.gh);

    /* Q tile: row r = (token t0 + r / gh, head head0 + r % gh); rows past the tile's tokens or heads are zero */
#pragma unroll
    for (int p = 0; p < Q_ROWS; p++) {
        const int r = tid / CPR + p * RPP, c = tid % CPR;
        const int32_t tl = r / g.gh, hl = r % g.gh;
        const bool ok = tl < g.tq && t0 + tl < t1 && hl < heads_here;
        const uint16_t *src = ok ? a.q + (size_t)(q0 + t0 + tl) * ld + (head0 + (size_t)hl) * HD + c * 8 : a.q;
        cp_async16(sQ + swz<HD>(r, c), src, ok);
    }

    /* K/V tile j (visited order) covers keys kt*BN .. kt*BN+BN-1 with kt = n_kt-1-j; keys >= kv_end are zero */
    const int cchunk = tid % CPR, crow = tid / CPR;
    const int32_t bsl = g.bs_log2, bmask = (1 << g.bs_log2) - 1;
    const size_t blk_stride = ((size_t)a.n_kv_heads << bsl) * HD; /* elements of one cache block (all kv heads) */
    const size_t kv_head_off = ((size_t)kvh << bsl) * HD + (size_t)cchunk * 8;
    const uint16_t *const kc = a.k_cache + kv_head_off, *const vc = a.v_cache + kv_head_off;
    auto fetch_ids = [&](int32_t j, int32_t (&ids)[KV_ROWS]) {
        const int32_t k0 = (n_kt - 1 - j) * BN;
#pragma unroll
        for (int p = 0; p < KV_ROWS; p++) {
            const int32_t key = k0 + crow + p * RPP;
            ids[p] = (j < n_kt && key < kv_end) ? __ldg(bt + (key >> bsl)) : -1;
        }
    };
    auto issue = [&](int32_t j, const int32_t (&ids)[KV_ROWS]) {
        if (j < n_kt) {
            const int32_t k0 = (n_kt - 1 - j) * BN;
            const uint32_t st = (uint32_t)(j % STAGES) * TILE;
#pragma unroll
            for (int p = 0; p < KV_ROWS; p++) {
                const int row = crow + p * RPP;
                const int32_t key = k0 + row;
                const bool ok = ids[p] >= 0;
                const size_t off = ok ? (size_t)ids[p] * blk_stride + ((size_t)(key & bmask) * HD) : 0;
                cp_async16(sK + st + swz<HD>(row, cchunk), kc + off, ok);
                cp_async16(sV + st + swz<HD>(row, cchunk), vc + off, ok);
            }
        }
        cp_async_commit(); /* always: one group per tile keeps the wait counts uniform */
    };

    int32_t ids[KV_ROWS];
#pragma unroll
    for (int j = 0; j < STAGES - 1; j++) {
        fetch_ids(j, ids);
        issue(j, ids); /* the Q copies ride in the first group */
    }
    fetch_ids(STAGES - 1, ids);

    cp_async_wait<STAGES - 2>();
    __syncthreads();
    /* this warp's 16 Q rows as A fragments: kept in registers, or re-read per tile when registers are short */
    uint32_t qf[QREG ? HD / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < (QREG ? HD / 16 : 0); kk++)
            ldmatrix_x4(qf[kk], sQ + swz<HD>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    }

    /* this thread's two rows: ra and ra + 8 of the warp; their last visible key (any value for padding rows) */
    int32_t lim[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + (lane >> 2) + h * 8;
        const int32_t tl = r / g.gh;
        lim[h] = (tl < g.tq && t0 + tl < t1) ? base + t0 + tl : kv_end - 1;
    }

    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; /* max in log2 units; partial sums */

    for (int32_t j = 0; j < n_kt; j++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* tile j landed for everyone; stage (j-1) % STAGES is free */
        issue(j + STAGES - 1, ids);
        fetch_ids(j + STAGES, ids);

        const int32_t kt = n_kt - 1 - j;
        const uint32_t kS = sK + (uint32_t)(j % STAGES) * TILE, vS = sV + (uint32_t)(j % STAGES) * TILE;

        float sc[BN / 8][4];
#pragma unroll
        for (int n = 0; n < BN / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qt[4];
            if (!QREG) ldmatrix_x4(qt, sQ + swz<HD>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
            const uint32_t(&qa)[4] = QREG ? qf[QREG ? kk : 0] : qt;
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t b[4];
                ldmatrix_x4(b, kS + swz<HD>(np * 16 + (lane >> 4) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
                mma_bf16(sc[2 * np], qa, b[0], b[1]);
                mma_bf16(sc[2 * np + 1], qa, b[2], b[3]);
            }
        }

        if (kt >= n_full) { /* a tile crossing some row's diagonal (or past kv_end) */
            const int32_t kb = kt * BN + (lane & 3) * 2;
#pragma unroll
            for (int n = 0; n < BN / 8; n++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int32_t key = kb + n * 8 + e;
                    if (key > lim[0]) sc[n][e] = -INFINITY;
                    if (key > lim[1]) sc[n][2 + e] = -INFINITY;
                }
            }
        }

        /* online softmax: row h's values are sc[n][2h], sc[n][2h+1]; a row lives in the 4 threads of a quad */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < BN / 8; n++) mx = fmaxf(mx, fmaxf(sc[n][2 * h], sc[n][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(mrow[h], mx * sl2);
            const float mu = mn == -INFINITY ? 0.0f : mn; /* a row with nothing visible yet: keep p = 0 */
            const float alpha = ex2(mrow[h] - mu);
            mrow[h] = mn;
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < BN / 8; n++) {
                sc[n][2 * h] = ex2(fmaf(sc[n][2 * h], sl2, -mu));
                sc[n][2 * h + 1] = ex2(fmaf(sc[n][2 * h + 1], sl2, -mu));
                sum += sc[n][2 * h] + sc[n][2 * h + 1];
            }
            lrow[h] = lrow[h] * alpha + sum;
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                o[d][2 * h] *= alpha;
                o[d][2 * h + 1] *= alpha;
            }
        }

        /* O += P V: P's accumulators of key columns 16ks .. 16ks+15 are the A fragment of k-step ks */
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            const uint32_t pa[4] = {pack_bf16(sc[2 * ks][0], sc[2 * ks][1]), pack_bf16(sc[2 * ks][2], sc[2 * ks][3]),
                                    pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]),
                                    pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3])};
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vS + swz<HD>(ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), dp * 2 + (lane >> 4)));
                mma_bf16(o[2 * dp], pa, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>(); /* nothing real is in flight (only empty groups), but leave no copy behind */

    /* normalise, stage through this warp's own rows of the Q tile, 16-byte stores of the valid rows: o's
     * (HD/8, 4) layout is store_o's flat one */
    store_o<HD>(reinterpret_cast<const float(&)[HD / 2]>(o), lrow, sQ, warp, lane, s_epi[0], s_epi[1], a, g, per_slot);
}

/* ---- wgmma helpers (sm_90a) ---------------------------------------------------------------------- */

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* generic-proxy writes (cp.async) -> visible to the async proxy (wgmma operand reads) */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* pins accumulator registers at this point of the instruction stream (no use moves above a wgmma wait) */
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* shared-memory matrix descriptor: start address, leading / stride byte offsets, 128-byte swizzle */
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

/* the causal mask of a wgmma S tile (v3, v5, v5p): key tile kt; this thread's two rows see keys up to lim[0],
 * lim[1]; its S elements of n-tile n are keys kt * BN + 8 n + 2 (lane % 4) (+1) */
template <int BN>
__device__ __forceinline__ void mask_keys(float (&sc)[BN / 2], const int32_t (&lim)[2], int32_t kt, int lane) {
    const int32_t kb = kt * BN + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int32_t key = kb + n * 8 + e;
            if (key > lim[0]) sc[4 * n + e] = -INFINITY;
            if (key > lim[1]) sc[4 * n + 2 + e] = -INFINITY;
        }
    }
}

/* byte offset of 16-byte chunk `chunk` of row `row` in a (ROWS, HD) bf16 tile in wgmma's 128-byte-swizzle layout:
 * 64-column blocks of ROWS x 128 B one after the other, chunks XOR row & 7 inside a block (block bases 1 KB aligned) */
template <int ROWS> __device__ __forceinline__ uint32_t sw128(int row, int chunk) {
    return (uint32_t)((chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

/* d (64 x 64 f32, this warpgroup) += A (64 x 16, smem desc, K-major) * B (16 x 64, smem desc, K-major) */
__device__ __forceinline__ void wgmma_64x64_ss(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db));
}

/* d (64 x 64 f32) += A (64 x 16 bf16, registers, mma.sync A layout per warp) * B (16 x 64, smem desc, N-major) */
__device__ __forceinline__ void wgmma_64x64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* d (64 x 128 f32) += A (64 x 16 bf16, registers, mma.sync A layout per warp) * B (16 x 128, smem desc, N-major) */
__device__ __forceinline__ void wgmma_64x128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* ---- v3: wgmma (fp8 caches; TM_CUDA_ATTN_PREFILL_V=3) ---------------------------------------------- */

/* The v2 pipeline (tiles, block-table gather, 3-stage cp.async ring, softmax) with warpgroup MMAs: 2 warpgroups
 * of 64 rows; S = Q K^T by wgmma m64n64k16 with Q and K read by descriptor from 128-byte-swizzled shared memory,
 * O += P V by wgmma m64nHDk16 with P from registers and V read N-major (transposed) by descriptor. Each product
 * is waited for before its result is used (no intra-warpgroup overlap yet: the two warpgroups overlap each other).
 * grid / block / tile mapping as v2; dynamic smem (BM + 2 * STAGES * BN) * HD * 2 + 1024 (1 KB alignment). */
template <int HD, int STAGES, int MINB, bool FP8>
__global__ void __launch_bounds__(256, MINB) attn_prefill_kernel_v3(const tm_cuda_attn_args a, const prefill_geom g) {
    constexpr int NT = 256, BM = 128, BN = 64;
    constexpr int CPR = HD / 8, RPP = NT / CPR, Q_ROWS = BM / RPP;
    constexpr int TILE = BN * HD * 2;
    /* K/V copies: 16-byte chunks of 8 bf16 elements, or (FP8) of 16 e4m3 elements */
    constexpr int CPRC = FP8 ? HD / 16 : CPR, RPPC = NT / CPRC, KV_ROWS = BN / RPPC;
    constexpr int RAWT = BN * HD; /* FP8: bytes of a raw K (or V) tile */
    static_assert(HD == 64 || HD == 128, "v3 head_dim");

    extern __shared__ uint8_t v3_smem[];
    const uint32_t sQ = (smem_u32(v3_smem) + 1023u) & ~1023u; /* (HD/64, BM, 64) bf16, swizzled */
    /* bf16: K and V rings (STAGES, HD/64, BN, 64); FP8: one widened K tile and one V tile (HD/64, BN, 64) bf16,
     * then the raw ring (STAGES, 2 (K, V), BN, HD) e4m3, filled by cp.async and widened tile by tile */
    const uint32_t sK = sQ + BM * HD * 2;
    const uint32_t sV = sK + (FP8 ? 1 : STAGES) * TILE;
    const uint32_t sRaw = sV + TILE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int32_t per_slot = a.n_kv_heads * g.n_hc;
    const int32_t slot = (int32_t)(blockIdx.x / (uint32_t)per_slot), hu = (int32_t)(blockIdx.x % (uint32_t)per_slot);
    const int32_t kvh = hu / g.n_hc, hc = hu % g.n_hc;
    int32_t s, ti;
    if (!find_tile<NT>(a.query_start, a.n_seqs, g.tq, slot, &s, &ti)) return;

    const int32_t q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
    const int32_t base = a.context_len[s] - ql;
    const int32_t t1 = ql - ti * g.tq, t0 = max(t1 - g.tq, 0);
    __shared__ int32_t s_epi3[2];
    if (tid == 0) {
        s_epi3[0] = q0 + t0;
        s_epi3[1] = t1 - t0;
    }
    const int32_t kv_end = base + t1;
    const int32_t n_kt = (kv_end + BN - 1) / BN;
    const int32_t n_full = (base + t0 + 1) / BN;
    const int32_t *bt = a.block_table + (size_t)s * (size_t)a.max_blocks;
    const size_t ld = (size_t)a.n_heads * HD;
    const size_t head0 = (size_t)kvh * (size_t)g.group + (size_t)hc * (size_t)g.gh;
    const int32_t heads_here = min(g.gh, g.group - hc * g.gh);

#pragma unroll
    for (int p = 0; p < Q_ROWS; p++) {
        const int r = tid / CPR + p * RPP, c = tid % CPR;
        const int32_t tl = r / g.gh, hl = r % g.gh;
        const bool ok = tl < g.tq && t0 + tl < t1 && hl < heads_here;
        const uint16_t *src = ok ? a.q + (size_t)(q0 + t0 + tl) * ld + (head0 + (size_t)hl) * HD + c * 8 : a.q;
        cp_async16(sQ + sw128<BM>(r, c), src, ok);
    }

    const int cchunk = tid % CPRC, crow = tid / CPRC;
    const int32_t bsl = g.bs_log2, bmask = (1 << g.bs_log2) - 1;
    const size_t blk_stride = ((size_t)a.n_kv_heads << bsl) * HD;
    /* element offset of this thread's chunk in the kv head's rows (elements = bytes for FP8) */
    const size_t kv_head_off = ((size_t)kvh << bsl) * HD + (size_t)cchunk * (FP8 ? 16 : 8);
    const uint16_t *const kc = a.k_cache + kv_head_off, *const vc = a.v_cache + kv_head_off;
    const uint8_t *const kc8 = (const uint8_t *)a.k_cache + kv_head_off, *const vc8 = (const uint8_t *)a.v_cache + kv_head_off;
    auto fetch_ids = [&](int32_t j, int32_t (&ids)[KV_ROWS]) {
        const int32_t k0 = (n_kt - 1 - j) * BN;
#pragma unroll
        for (int p = 0; p < KV_ROWS; p++) {
            const int32_t key = k0 + crow + p * RPPC;
            ids[p] = (j < n_kt && key < kv_end) ? __ldg(bt + (key >> bsl)) : -1;
        }
    };
    auto issue = [&](int32_t j, const int32_t (&ids)[KV_ROWS]) {
        if (j < n_kt) {
            const int32_t k0 = (n_kt - 1 - j) * BN;
            const uint32_t st = (uint32_t)(j % STAGES) * (FP8 ? 2 * RAWT : TILE);
#pragma unroll
            for (int p = 0; p < KV_ROWS; p++) {
                const int row = crow + p * RPPC;
                const int32_t key = k0 + row;
                const bool ok = ids[p] >= 0;
                const size_t off = ok ? (size_t)ids[p] * blk_stride + ((size_t)(key & bmask) * HD) : 0;
                if constexpr (FP8) {
                    const uint32_t d = sRaw + st + (uint32_t)(row * HD + cchunk * 16);
                    cp_async16(d, kc8 + off, ok);
                    cp_async16(d + RAWT, vc8 + off, ok);
                } else {
                    cp_async16(sK + st + sw128<BN>(row, cchunk), kc + off, ok);
                    cp_async16(sV + st + sw128<BN>(row, cchunk), vc + off, ok);
                }
            }
        }
        cp_async_commit();
    };

    int32_t ids[KV_ROWS];
#pragma unroll
    for (int j = 0; j < STAGES - 1; j++) {
        fetch_ids(j, ids);
        issue(j, ids);
    }
    fetch_ids(STAGES - 1, ids);

    int32_t lim[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + (lane >> 2) + h * 8; /* = wg * 64 + 16 * (warp % 4) + ...: wgmma's row */
        const int32_t tl = r / g.gh;
        lim[h] = (tl < g.tq && t0 + tl < t1) ? base + t0 + tl : kv_end - 1;
    }

    const float sl2 = a.scale * 1.4426950408889634f;
    float o[HD / 2]; /* (HD/8 n-tiles) x 4, mma.sync C layout per warp */
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const uint32_t qrows = sQ + (uint32_t)wg * 64 * 128; /* this warpgroup's 64 rows in every 64-column block */

    for (int32_t j = 0; j < n_kt; j++) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        issue(j + STAGES - 1, ids);
        fetch_ids(j + STAGES, ids);
        if constexpr (FP8) {
            /* widen raw tile j into the bf16 K and V tiles (every product on the previous tile has been waited
             * for before the barrier above); 16 e4m3 -> two swizzled 16-byte bf16 chunks */
            const uint32_t raw = sRaw + (uint32_t)(j % STAGES) * (2 * RAWT);
#pragma unroll
            for (int it = 0; it < 2 * BN * (HD / 16) / NT; it++) {
                const int i = tid + it * NT;
                const int kv = i / (BN * (HD / 16)), rc = i % (BN * (HD / 16)), r = rc / (HD / 16), c = rc % (HD / 16);
                uint32_t w0, w1, w2, w3;
                asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                             : "r"(raw + (uint32_t)(kv * RAWT + r * HD + c * 16)));
                uint4 lo, hi;
                tm_fp8x16_to_bf16(make_uint4(w0, w1, w2, w3), lo, hi);
                const uint32_t t = kv ? sV : sK;
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(t + sw128<BN>(r, 2 * c)), "r"(lo.x),
                             "r"(lo.y), "r"(lo.z), "r"(lo.w)
                             : "memory");
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(t + sw128<BN>(r, 2 * c + 1)),
                             "r"(hi.x), "r"(hi.y), "r"(hi.z), "r"(hi.w)
                             : "memory");
            }
            fence_proxy_async();
            __syncthreads();
        }

        const int32_t kt = n_kt - 1 - j;
        const uint32_t kS = FP8 ? sK : sK + (uint32_t)(j % STAGES) * TILE;
        const uint32_t vS = FP8 ? sV : sV + (uint32_t)(j % STAGES) * TILE;

        float sc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) sc[i] = 0.0f;
        fence_regs(sc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_64x64_ss(sc, gmma_desc(qrows + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024),
                           gmma_desc(kS + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024));
        wgmma_commit();
        wgmma_wait0();
        fence_regs(sc);

        if (kt >= n_full) mask_keys<BN>(sc, lim, kt, lane);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < BN / 8; n++) mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * h], sc[4 * n + 2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(mrow[h], mx * sl2);
            const float mu = mn == -INFINITY ? 0.0f : mn;
            const float alpha = ex2(mrow[h] - mu);
            mrow[h] = mn;
            const float sum = exp_row(sc, h, sl2, mu);
            lrow[h] = lrow[h] * alpha + sum;
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                o[4 * d + 2 * h] *= alpha;
                o[4 * d + 2 * h + 1] *= alpha;
            }
        }

        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            pa[ks][0] = pack_bf16(sc[8 * ks + 0], sc[8 * ks + 1]);
            pa[ks][1] = pack_bf16(sc[8 * ks + 2], sc[8 * ks + 3]);
            pa[ks][2] = pack_bf16(sc[8 * ks + 4], sc[8 * ks + 5]);
            pa[ks][3] = pack_bf16(sc[8 * ks + 6], sc[8 * ks + 7]);
        }
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            const uint64_t dv = gmma_desc(vS + ks * 16 * 128, BN * 128, 1024);
            if constexpr (HD == 128) wgmma_64x128_rs(o, pa[ks], dv);
            else wgmma_64x64_rs(o, pa[ks], dv);
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(o);
    }
    cp_async_wait<0>();
    __syncthreads(); /* the Q tile is shared by both warpgroups' operand blocks: all products done before reuse */

    store_o<HD>(o, lrow, sQ, warp, lane, s_epi3[0], s_epi3[1], a, g, per_slot);
}

/* ---- wgmma helpers of v5: a second wait depth, register fences for P, products with a zeroing predicate ---- */

/* A store of values the softmax ends with, placed before a wgmma wait: ptxas keeps the wait after a shared-memory
 * store, so the softmax stays under the product in flight (without it ptxas hoists the wait to the softmax's
 * first instructions and the two run one after the other). The stored word is never read. */
__device__ __forceinline__ void pin_after(float2 &slot, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_u32(&slot)), "f"(a), "f"(b) : "memory");
}

__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void fence_regs_u(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) asm volatile("" : "+r"(r[i][k])::"memory");
}

/* d (64 x 64 f32) = (accumulate ? d : 0) + A (64 x 16, smem desc, K-major) * B (16 x 64, smem desc, K-major) */
__device__ __forceinline__ void wgmma_64x64_ss_acc(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* d (64 x 128 f32) = (accumulate ? d : 0) + A (64 x 16, smem desc, K-major) * B (16 x 128, smem desc, K-major) */
__device__ __forceinline__ void wgmma_64x128_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* ---- v5: v3 with intra-warpgroup overlap, 128-key tiles, offset warpgroups (the default) ------------------ */

/* ---- the pieces of a v5 round that v5 and v5p share: a warpgroup's 64 rows, S (sc), P (pa) and O (o) in the
 * wgmma register layouts; every thread holds two rows (h = 0, 1: lane / 4 and lane / 4 + 8 of its warp's 16) ---- */

/* S = Q K^T for this warpgroup's rows, issued (dq0: the Q rows' descriptor; kS: the K tile in shared memory); the
 * descriptors' start address is the low field (address >> 4; shared memory < 256 KB), so the k-steps' descriptors
 * are the tile's plus a constant */
template <int HD, int BN, int BM>
__device__ __forceinline__ void v5_issue_s(float (&sc)[BN / 2], uint64_t dq0, uint32_t kS) {
    const uint64_t dk0 = gmma_desc(kS, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint64_t dq = dq0 + (uint64_t)(((kk >> 2) * (BM * 128) + (kk & 3) * 32) >> 4);
        const uint64_t dk = dk0 + (uint64_t)(((kk >> 2) * (BN * 128) + (kk & 3) * 32) >> 4);
        if constexpr (BN == 128) wgmma_64x128_ss(sc, dq, dk, kk > 0);
        else wgmma_64x64_ss_acc(sc, dq, dk, kk > 0);
    }
    wgmma_commit();
}

/* O += P V, issued (vS: the V tile in shared memory, read N-major) */
template <int HD, int BN>
__device__ __forceinline__ void v5_issue_pv(float (&o)[HD / 2], const uint32_t (&pa)[BN / 16][4], uint32_t vS) {
    const uint64_t dv0 = gmma_desc(vS, BN * 128, 1024);
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
        const uint64_t dv = dv0 + (uint64_t)((ks * 16 * 128) >> 4);
        if constexpr (HD == 128) wgmma_64x128_rs(o, pa[ks], dv);
        else wgmma_64x64_rs(o, pa[ks], dv);
    }
    wgmma_commit();
}

/* the lazy-max softmax of a round: MASK (tiles crossing a diagonal or kv_end) masks keys past each row's lim,
 * then new row max, alpha, P = exp2 in place, row sums (kt: the key tile, lane: this thread's lane) */
template <int BN, bool MASK>
__device__ __forceinline__ void v5_softmax(float (&sc)[BN / 2], float (&mrow)[2], float (&lrow)[2], float (&alpha)[2],
                                           const int32_t (&lim)[2], int32_t kt, int lane, float sl2, float lazy) {
    if constexpr (MASK) mask_keys<BN>(sc, lim, kt, lane);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < BN / 8; n++) mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * h], sc[4 * n + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* the running max moves only when it grows by more than `lazy` (log2 units): P may then reach 2^lazy,
         * O and l share the stale max, so O / l is unchanged, and most rounds skip the O rescale */
        const float mc = fmaxf(mrow[h], mx * sl2);
        const bool upd = mc > mrow[h] + lazy; /* -inf + lazy = -inf: the first visible key always moves it */
        const float mn = upd ? mc : mrow[h];
        const float mu = mn == -INFINITY ? 0.0f : mn; /* nothing visible yet: p = 0, alpha = 0 */
        /* ex2(0) = 1 exactly; a select on the argument, not on ex2: `upd ? ex2(..) : 1` compiles to a
         * divergent branch around the ex2, and ptxas then waits for the P V product before the softmax */
        alpha[h] = ex2(upd ? mrow[h] - mu : 0.0f);
        mrow[h] = mn;
        const float sum = exp_row(sc, h, sl2, mu);
        lrow[h] = lrow[h] * alpha[h] + sum;
    }
}

/* a fastmax round's softmax (prefill_geom.fastmax): P = 2^(x - m) against the row's stored m, no row max; l before
 * the round kept in lsave (for a redo), ovf set where a partial row sum reaches 2^40 (or is inf / NaN) */
template <int BN>
__device__ __forceinline__ void v5_softmax_fast(float (&sc)[BN / 2], float (&mrow)[2], float (&lrow)[2],
                                                float (&lsave)[2], int &ovf, float sl2) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float mu = mrow[h] == -INFINITY ? 0.0f : mrow[h];
        mrow[h] = mu;
        const float sum = exp_row(sc, h, sl2, mu);
        lsave[h] = lrow[h];
        lrow[h] += sum;
        ovf |= !(sum < 0x1p40f);
    }
}

/* P (bf16, the A operand of O += P V) from the exponentiated S */
template <int BN>
__device__ __forceinline__ void v5_pack_p(uint32_t (&pa)[BN / 16][4], const float (&sc)[BN / 2]) {
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
        pa[ks][0] = pack_bf16(sc[8 * ks + 0], sc[8 * ks + 1]);
        pa[ks][1] = pack_bf16(sc[8 * ks + 2], sc[8 * ks + 3]);
        pa[ks][2] = pack_bf16(sc[8 * ks + 4], sc[8 * ks + 5]);
        pa[ks][3] = pack_bf16(sc[8 * ks + 6], sc[8 * ks + 7]);
    }
}

/* O *= alpha only where some row of the warp has a new maximum (alpha is exactly 1 elsewhere: ex2(0)) */
template <int HD>
__device__ __forceinline__ void v5_rescale_o(float (&o)[HD / 2], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            o[4 * d + 0] *= alpha[0];
            o[4 * d + 1] *= alpha[0];
            o[4 * d + 2] *= alpha[1];
            o[4 * d + 3] *= alpha[1];
        }
    }
}

/* v3's CTA (2 warpgroups x 64 rows, 256 threads, one barrier a round), with FlashAttention-3's intra-warpgroup
 * overlap: in round j a warpgroup issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back, takes S_j back with
 * wgmma.wait_group 1 while the P V product still runs, does the softmax of S_j (mask, row max, exp2, row sums)
 * under it, then waits for the product, rescales O by the new max and packs P_j.
 *   - Warpgroup 1 makes every K/V copy (16 rows a thread, block-table gather with cp.async) before it issues its
 *     products (a thread's rows are consecutive keys of one block, so one block id a tile instead of one a row,
 *     when block_size allows: prefill_geom.rowg, TM_CUDA_V5_ROWG=0 spreads them over the tile as before; 8B 4096
 *     tokens 446 -> 487-493 TFLOP/s, twelfth session; that id loaded one tile ahead, prefill_geom.idpre, +1.5%,
 *     seventeenth); warpgroup 0 issues its products right after the barrier.
 *     That offsets the two: warpgroup 0's softmax runs under warpgroup 1's products and the other way round,
 *     instead of both softmaxes contending for the exp2 unit while the tensor cores wait (the ping-pong of
 *     FlashAttention-3 without its named barriers; a hand-over by named barriers instead of the round's
 *     __syncthreads measured slower, and so did a producer warpgroup, v7 on a branch). With all threads
 *     copying, v5 measured 395-407 TFLOP/s; with warpgroup 1 alone, 449-455 (8B geometry, 4096 tokens).
 *   - BN keys per tile: 128 for head_dim 128, 64 for 64. With 256 threads ptxas may give each thread up to 255
 *     registers: O (64), S (64) and P (32) stay live together. 384 threads (a producer warpgroup, as in
 *     FlashAttention-3) cap them at 168 (three warps on one of the four SM sub-partitions), where ptxas
 *     serialises the 128-key products (C7512); setmaxnreg did not lift that cap for the consumer code.
 *   - Issue cost matters (the SM issues ~1 instruction per cycle per sub-partition and the softmax needs ~5 per
 *     score): the wgmma descriptors are the tile's plus constants, and every tile but the first (the only one
 *     that can reach past kv_end) is copied without zero-fill predicates (v5 went from 382 to 405 TFLOP/s).
 *   - fastmax (prefill_geom.fastmax, default; eighteenth session): the rounds of the tiles that cross no diagonal
 *     (after the masked ones, which set every row's max) skip the row max: P = 2^(x - m) against the stored m, no
 *     max tree, no shuffles, no O rescale (the softmax under the P V product: 201 instructions a thread instead of
 *     291; removing the whole softmax was measured to make the kernel 22% faster, so it is the largest cost besides
 *     the products). Nothing bounds x - m then, except the row sum: every P is at most its row's sum, so a thread
 *     whose partial sum of a round reaches 2^40 (or inf / NaN) sets a flag, the next round's barrier is a
 *     __syncthreads_or, and if any thread set it, every warpgroup restores l and redoes that round exactly (S once
 *     more from the ring, the lazy-max softmax, O rescaled) before going on. P stays below 2^40, far from f32 or
 *     bf16 overflow. The flag is broadcast from lane 0 before the branch: a branch ptxas takes for divergent moved
 *     the loop's descriptor arithmetic out of the uniform registers (+65 instructions a round).
 * Ring: STAGES slots of (K, V); tile j is copied during round j - STAGES + 2, into the slot that tile j - STAGES
 * left: its V was last read by the P V product of round j - STAGES + 1, which every warp has waited for before
 * the barrier that opens round j - STAGES + 2. So STAGES - 2 tiles are in flight behind the one in use.
 * grid / tile mapping as v3; dynamic smem (BM + 2 * STAGES * BN) * HD * 2 + 1024.
 * head_dim 64 with 64-key tiles: two CTAs an SM (81 KB of shared memory each) when the kernel fits in 128 registers,
 * which the launch bounds hold it to (at 131-147 registers, one CTA an SM: 296 against 395 TFLOP/s on the 1B shape).
 * ROWS: K and V from tm_cuda_attn_args.k_rows / v_rows (every sequence fresh) instead of the paged cache. */
template <int HD, int BN, int STAGES, bool ROWS>
__global__ void __launch_bounds__(256, HD == 64 && BN == 64 ? 2 : 1) attn_prefill_kernel_v5(const tm_cuda_attn_args a, const prefill_geom g) {
    constexpr int NT = 256, BM = 128;
    constexpr int CPR = HD / 8, RPP = NT / CPR, Q_ROWS = BM / RPP;
    constexpr int LT = NT / 2, LRPP = LT / CPR, KV_ROWS = BN / LRPP; /* K/V copies: warpgroup 1's threads */
    constexpr int TILE = BN * HD * 2;
    static_assert((HD == 64 || HD == 128) && (BN == 64 || BN == 128) && STAGES >= 3, "v5 shapes");

    extern __shared__ uint8_t v5_smem[];
    const uint32_t sQ = (smem_u32(v5_smem) + 1023u) & ~1023u; /* (HD/64, BM, 64) bf16, swizzled */
    const uint32_t sK = sQ + BM * HD * 2;                      /* (STAGES, HD/64, BN, 64) */
    const uint32_t sV = sK + STAGES * TILE;                    /* (STAGES, HD/64, BN, 64) */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* the warpgroup, broadcast from lane 0: ptxas then sees it warp-uniform, and the Q descriptors built from it stay
     * in uniform registers (taken from warp >> 2, each of the round's 8 S products first moved them over, R2UR) */
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
    const int32_t per_slot = a.n_kv_heads * g.n_hc;
    const int32_t slot = (int32_t)(blockIdx.x / (uint32_t)per_slot), hu = (int32_t)(blockIdx.x % (uint32_t)per_slot);
    const int32_t kvh = hu / g.n_hc, hc = hu % g.n_hc;
    int32_t s, ti;
    if (!find_tile<NT, true>(a.query_start, a.n_seqs, g.tq, slot, &s, &ti)) return;

    const int32_t q0 = a.query_start[s], ql = a.query_start[s + 1] - q0;
    const int32_t base = a.context_len[s] - ql;
    const int32_t t1 = ql - ti * g.tq, t0 = max(t1 - g.tq, 0);
    __shared__ int32_t s_epi5[2];
    __shared__ float2 s_pin;
    if (tid == 0) {
        s_epi5[0] = q0 + t0;
        s_epi5[1] = t1 - t0;
    }
    const int32_t kv_end = base + t1;
    const int32_t n_kt = (kv_end + BN - 1) / BN;
    const int32_t n_full = (base + t0 + 1) / BN;
    const int32_t *bt = a.block_table + (size_t)s * (size_t)a.max_blocks;
    const size_t ld = (size_t)a.n_heads * HD;
    const size_t head0 = (size_t)kvh * (size_t)g.group + (size_t)hc * (size_t)g.gh;
    const int32_t heads_here = min(g.gh, g.group - hc * g.gh);

#pragma unroll
    for (int p = 0; p < Q_ROWS; p++) {
        const int r = tid / CPR + p * RPP, c = tid % CPR;
        const int32_t tl = r / g.gh, hl = r % g.gh;
        const bool ok = tl < g.tq && t0 + tl < t1 && hl < heads_here;
        const uint16_t *src = ok ? a.q + (size_t)(q0 + t0 + tl) * ld + (head0 + (size_t)hl) * HD + c * 8 : a.q;
        cp_async16(sQ + sw128<BM>(r, c), src, ok);
    }

    /* warpgroup 1 makes every K/V copy (see above); warpgroup 0's ltid is negative, and issue() tests `loader`
     * before any address below is used. (tid & 127 reads better but reschedules the whole loop, which was
     * measured as it is.) */
    const int ltid = tid - NT / 2;
    const int cchunk = ltid % CPR, crow = ltid / CPR;
    const bool loader = wg == 1;
    const int32_t bsl = g.bs_log2, bmask = (1 << g.bs_log2) - 1;
    const size_t blk_stride = ((size_t)a.n_kv_heads << bsl) * HD;
    /* ROWS: keys from a.k_rows / a.v_rows (every sequence fresh: key c is token q0 + c), ld elements a row */
    const uint32_t ld_kv = ROWS ? (uint32_t)a.kv_row_stride : (uint32_t)HD;
    const size_t kv_head_off = ROWS ? (size_t)q0 * ld_kv + (size_t)kvh * HD + (size_t)cchunk * 8
                                    : ((size_t)kvh << bsl) * HD + (size_t)cchunk * 8;
    const uint16_t *const kc = (ROWS ? a.k_rows : a.k_cache) + kv_head_off;
    const uint16_t *const vc = (ROWS ? a.v_rows : a.v_cache) + kv_head_off;
    /* tile j (visited order: from the diagonal down) covers keys (n_kt-1-j)*BN ..; one commit group per call */
    const ptrdiff_t v_minus_k = vc - kc; /* V rows sit at the same offsets from vc as K rows from kc */
    /* rowg: the block id of this thread's rows in tile j (idpre: loaded for the next tile a call ahead, into nid, so
     * the copies do not wait for it; else as the copies go out) */
    auto id_of = [&](int32_t j) {
        return (uint32_t)__ldg(bt + ((uint32_t)((n_kt - 1 - j) * BN + crow * KV_ROWS) >> bsl));
    };
    uint32_t nid = 0;
    auto issue = [&](int32_t j) {
        if (loader && j < n_kt) {
            const int32_t k0 = (n_kt - 1 - j) * BN;
            const uint32_t st = (uint32_t)(j % STAGES) * TILE;
            if (j == 0) { /* the only tile that can reach past kv_end: zero-fill those keys */
#pragma unroll
                for (int p = 0; p < KV_ROWS; p++) {
                    const int row = crow + p * LRPP;
                    const int32_t key = k0 + row;
                    const bool ok = key < kv_end;
                    const size_t off = !ok  ? 0
                                       : ROWS ? (size_t)key * ld_kv
                                              : (size_t)__ldg(bt + (key >> bsl)) * blk_stride +
                                                    (size_t)(key & bmask) * HD;
                    cp_async16(sK + st + sw128<BN>(row, cchunk), kc + off, ok);
                    cp_async16(sV + st + sw128<BN>(row, cchunk), vc + off, ok);
                }
            } else if (ROWS || g.rowg) { /* this thread's KV_ROWS rows are consecutive keys of one block (ROWS:
                                          * consecutive tokens): one block id a tile */
                const uint32_t key0 = (uint32_t)(k0 + crow * KV_ROWS);
                const uint16_t *src = ROWS ? kc + (size_t)key0 * ld_kv
                                           : kc + (size_t)(g.idpre ? nid : id_of(j)) * blk_stride +
                                                 (key0 & (uint32_t)bmask) * (uint32_t)HD;
                auto row_off = [&](int p) { /* element offset of the thread's p-th row from src */
                    if constexpr (ROWS) return (size_t)p * ld_kv;
                    else return p * HD;
                };
#pragma unroll
                for (int p = 0; p < KV_ROWS; p++) {
                    const int row = crow * KV_ROWS + p;
                    cp_async16_all(sK + st + sw128<BN>(row, cchunk), src + row_off(p));
                    cp_async16_all(sV + st + sw128<BN>(row, cchunk), src + row_off(p) + v_minus_k);
                }
            } else { /* every key below kv_end: no predicates, 32-bit key arithmetic, one wide multiply a row */
#pragma unroll
                for (int p = 0; p < KV_ROWS; p++) {
                    const int row = crow + p * LRPP;
                    const uint32_t key = (uint32_t)(k0 + row);
                    const uint32_t id = (uint32_t)__ldg(bt + (key >> bsl));
                    const uint16_t *src = kc + (size_t)id * blk_stride + (key & (uint32_t)bmask) * (uint32_t)HD;
                    cp_async16_all(sK + st + sw128<BN>(row, cchunk), src);
                    cp_async16_all(sV + st + sw128<BN>(row, cchunk), src + v_minus_k);
                }
            }
            if constexpr (!ROWS)
                if (g.idpre && j + 1 < n_kt) nid = id_of(j + 1); /* used by the next call, a round from now */
        }
        cp_async_commit();
    };
#pragma unroll
    for (int j = 0; j < STAGES - 2; j++) issue(j); /* with Q in the first group */

    int32_t lim[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + (lane >> 2) + h * 8; /* = wg * 64 + 16 * (warp % 4) + ...: wgmma's row */
        const int32_t tl = r / g.gh;
        lim[h] = (tl < g.tq && t0 + tl < t1) ? base + t0 + tl : kv_end - 1;
    }
    const float sl2 = a.scale * 1.4426950408889634f;
    const uint32_t qrows = sQ + (uint32_t)wg * 64 * 128; /* this warpgroup's 64 rows in every 64-column block */

    float o[HD / 2]; /* (HD/8 n-tiles) x 4, mma.sync C layout per warp */
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    float sc[BN / 2];
    uint32_t pa[BN / 16][4];
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};

    /* the round's pieces (shared with v5p, above the kernel) */
    const uint64_t dq0 = gmma_desc(qrows, 16, 1024);
    auto issue_s = [&](uint32_t kS) { v5_issue_s<HD, BN, BM>(sc, dq0, kS); };
    auto issue_pv = [&](uint32_t vS) { v5_issue_pv<HD, BN>(o, pa, vS); };
    auto softmax = [&](int32_t kt, auto mask_c) {
        v5_softmax<BN, decltype(mask_c)::value>(sc, mrow, lrow, alpha, lim, kt, lane, sl2, g.lazy);
    };
    auto pack_p = [&]() { v5_pack_p<BN>(pa, sc); };
    auto rescale_o = [&]() { v5_rescale_o<HD>(o, alpha); };

    /* fastmax rounds (prefill_geom.fastmax; the unmasked tiles): P = 2^(x - m) against the row's stored m, with no
     * row max (no max tree, no shuffles, no rescale of O); the row sum bounds every P, so a thread whose partial sum
     * reaches 2^40 (or is inf / NaN) flags the round, and the next round's barrier (__syncthreads_or) has every
     * warpgroup redo it exactly (redo). A row with nothing visible yet (m = -inf) takes m = 0. */
    float lsave[2] = {0.0f, 0.0f}; /* l before the last fastmax round's sums */
    int ovf = 0;
    auto softmax_fast = [&]() { v5_softmax_fast<BN>(sc, mrow, lrow, lsave, ovf, sl2); };
    /* round jp (a fastmax one) again, exactly: l as before it, S_jp once more (its K is still in the ring: the copy
     * issued in round jp + 1 refills tile jp - 1's slot, tile jp's is refilled a round later), the lazy-max softmax, O
     * rescaled, P_jp packed. Called at the top of round jp + 1 (or after the last), with no product in flight. */
    auto redo = [&](int32_t jp) {
        lrow[0] = lsave[0];
        lrow[1] = lsave[1];
        ovf = 0;
        fence_regs(sc);
        wgmma_fence();
        issue_s(sK + (uint32_t)(jp % STAGES) * TILE);
        wgmma_wait0();
        fence_regs(sc);
        softmax(n_kt - 1 - jp, std::false_type{});
        rescale_o();
        pack_p();
    };
    /* the barrier after fastmax round jp, and that round again if some thread flagged it (the flag broadcast from lane
     * 0: ptxas then sees a warp-uniform branch and keeps the loop's descriptors in uniform registers) */
    auto barrier_redo = [&](int32_t jp) {
        if (__shfl_sync(0xffffffffu, __syncthreads_or(ovf), 0)) redo(jp);
    };

    /* One round. MASK (the tiles that cross a diagonal or kv_end, visited first), FIRST (no P V product to
     * issue yet) and FAST (fastmax) are compile-time, so no branch sits between the products' issue and their
     * waits: at the merge of a possibly divergent branch ptxas waits for every product in flight, which put the
     * softmax after the P V product instead of under it. */
    auto round = [&](int32_t j, auto mask_c, auto first_c, auto fast_c) {
        cp_async_wait<STAGES - 3>(); /* this thread's copies of tile j (and Q) have landed */
        fence_proxy_async();
        if constexpr (decltype(fast_c)::value) {
            barrier_redo(j - 1);
        } else {
            __syncthreads(); /* everyone's have; and every product of round j - 1 is done */
        }
        issue(j + STAGES - 2); /* warpgroup 1 only, before its products: issued after them, 2-10% slower */
        fence_regs(sc);
        fence_regs(o);
        fence_regs_u(pa);
        wgmma_fence();
        issue_s(sK + (uint32_t)(j % STAGES) * TILE);
        if constexpr (!decltype(first_c)::value) {
            issue_pv(sV + (uint32_t)((j - 1) % STAGES) * TILE);
            wgmma_wait1(); /* S_j is ready; O += P_{j-1} V_{j-1} may still run */
        } else {
            wgmma_wait0();
        }
        fence_regs(sc);
        if constexpr (decltype(fast_c)::value) softmax_fast();
        else softmax(n_kt - 1 - j, mask_c);
        pin_after(s_pin, lrow[0], lrow[1]);
        wgmma_wait0();
        fence_regs(o);
        fence_regs_u(pa); /* P_{j-1} stays untouched until its product is done */
        if constexpr (!decltype(fast_c)::value) rescale_o();
        pack_p();
    };
    using yes = std::true_type;
    using no = std::false_type;
    const int32_t n_mask = n_kt - n_full; /* rounds 0 .. n_mask - 1 visit the tiles kt >= n_full */
    round(0, yes{}, yes{}, no{});         /* masked even when n_mask is 0: a full tile loses nothing to the mask */
    int32_t j = 1;
    for (; j < n_mask; j++) round(j, yes{}, no{}, no{});
    if (g.fastmax) {
        for (; j < n_kt; j++) round(j, no{}, no{}, yes{});
        barrier_redo(n_kt - 1);
    } else {
        for (; j < n_kt; j++) round(j, no{}, no{}, no{});
    }
    /* the last tile's O += P V */
    fence_regs(o);
    fence_regs_u(pa);
    wgmma_fence();
    issue_pv(sV + (uint32_t)((n_kt - 1) % STAGES) * TILE);
    wgmma_wait0();
    fence_regs(o);
    cp_async_wait<0>();
    __syncthreads(); /* the Q tile is shared by both warpgroups' operand blocks: all products done before reuse */

    store_o<HD>(o, lrow, sQ, warp, lane, s_epi5[0], s_epi5[1], a, g, per_slot);
}

/* ---- v5p: v5 as a persistent kernel (from 8 tiles an SM; TM_CUDA_PREFILL_PERSIST=1/0) ------------------------ */

/* One tile of v5p, as thread 0 finds it for the block (kept in shared memory, read where needed: the kernel has
 * no registers to spare): the (sequence, tile) of a tile id (what blockIdx.x is to v5), what the rounds need of it
 * and the addresses its copies start from. s < 0: no tile (the id is past the last one). */
struct v5p_tile {
    const uint16_t *kc;  /* K of the tile's kv head: the cache's (block 0) or the rows' (the sequence's first token) */
    ptrdiff_t v_minus_k; /* V's elements from K's */
    const int32_t *bt;   /* the sequence's block-table row */
    const uint16_t *q;   /* Q of the tile's first token and first query head */
    int32_t s, q0, t0, t1, n_kt, n_full, hu, kv_end, heads_here, base;
};

/* every thread of the block calls it (find_tile synchronises); thread 0 fills *dst */
template <int NT, int HD, int BN, bool ROWS>
__device__ __forceinline__ void v5p_find(const tm_cuda_attn_args &a, const prefill_geom &g, int32_t per_slot,
                                         int32_t id, int32_t n_ids, v5p_tile *dst) {
    int32_t s = -1, ti = 0;
    const bool ok = id < n_ids && find_tile<NT, true>(a.query_start, a.n_seqs, g.tq, id / per_slot, &s, &ti);
    if (threadIdx.x != 0) return;
    v5p_tile t;
    t.s = ok ? s : -1;
    t.hu = id % per_slot;
    t.q0 = t.t0 = t.t1 = t.base = t.n_kt = t.n_full = t.kv_end = t.heads_here = 0;
    t.kc = ROWS ? a.k_rows : a.k_cache;
    t.v_minus_k = 0;
    t.bt = a.block_table;
    t.q = a.q;
    if (ok) {
        t.q0 = a.query_start[s];
        const int32_t ql = a.query_start[s + 1] - t.q0;
        t.base = a.context_len[s] - ql;
        t.t1 = ql - ti * g.tq;
        t.t0 = max(t.t1 - g.tq, 0);
        t.kv_end = t.base + t.t1;
        t.n_kt = (t.kv_end + BN - 1) / BN;
        t.n_full = (t.base + t.t0 + 1) / BN;
        const int32_t kvh = t.hu / g.n_hc, hc = t.hu % g.n_hc;
        t.heads_here = min(g.gh, g.group - hc * g.gh);
        t.q = a.q + (size_t)(t.q0 + t.t0) * ((size_t)a.n_heads * HD) +
              ((size_t)kvh * (size_t)g.group + (size_t)hc * (size_t)g.gh) * HD;
        const size_t koff = ROWS ? (size_t)t.q0 * (size_t)a.kv_row_stride + (size_t)kvh * HD
                                 : ((size_t)kvh << g.bs_log2) * HD;
        t.kc = (ROWS ? a.k_rows : a.k_cache) + koff;
        t.v_minus_k = ((ROWS ? a.v_rows : a.v_cache) + koff) - t.kc;
        t.bt = a.block_table + (size_t)s * (size_t)a.max_blocks;
    }
    *dst = t;
}

/* v5 with the CTAs kept resident (a grid of one CTA an SM), each taking tile after tile: the first tile is its
 * blockIdx.x, the next ones are claimed from a counter in `ctr` (zeroed by the launcher), so they go out in v5's
 * order, heaviest first. What v5 pays once a tile -- a CTA's start, its Q tile and first K/V tile arriving with the
 * tensor cores idle, the epilogue with no copy in flight -- overlaps the tile before: the copies of the next tile's
 * first K/V tile go out in the last round of this one (the ring runs on across tiles), its Q rows right after this
 * tile's last product that reads them, and the output is staged through a K slot of the ring that no copy is using.
 * Rounds, softmax and products as v5 (head_dim 128, 128-key tiles, 3 stages), with v5's later changes (ported in the
 * nineteenth session, measured in the twentieth): fastmax rounds and their redo (the K slot of the redone round is
 * `prev` at the top of the next round and after the last one), the warp-uniform warpgroup index, exp_row and the
 * block id loaded a call ahead (idpre; a tile's first K/V tile takes the per-row path). */
template <int HD, int BN, int STAGES, bool ROWS>
__global__ void __launch_bounds__(256, 1) attn_prefill_kernel_v5p(const tm_cuda_attn_args a, const prefill_geom g,
                                                                  int32_t n_ids, int32_t *ctr) {
    constexpr int NT = 256, BM = 128;
    constexpr int CPR = HD / 8, LT = NT / 2, LRPP = LT / CPR, KV_ROWS = BN / LRPP;
    constexpr int TILE = BN * HD * 2;
    static_assert(HD == 128 && BN == 128 && STAGES == 3, "v5p: head_dim 128, 128-key tiles, 3 stages");

    extern __shared__ uint8_t v5_smem[];
    const uint32_t sQ = (smem_u32(v5_smem) + 1023u) & ~1023u; /* (HD/64, BM, 64) bf16, swizzled */
    const uint32_t sK = sQ + BM * HD * 2;                      /* (STAGES, HD/64, BN, 64) */
    const uint32_t sV = sK + STAGES * TILE;                    /* (STAGES, HD/64, BN, 64) */
    __shared__ v5p_tile s_t[2]; /* the tile in hand and the next one */
    __shared__ int32_t s_claim;
    __shared__ float2 s_pin;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0); /* warp-uniform to ptxas, as in v5 */
    const int32_t per_slot = a.n_kv_heads * g.n_hc;
    v5p_find<NT, HD, BN, ROWS>(a, g, per_slot, (int32_t)blockIdx.x, n_ids, &s_t[0]);
    __syncthreads();
    if (s_t[0].s < 0) return;

    /* Q rows of tile t: the whole tile (wgq < 0, every thread) or warpgroup wgq's 64 rows (its 128 threads);
     * rows past the tile are zero-filled. No branch: it runs between a product's issue and its wait. */
    auto load_q = [&](const v5p_tile &t, int wgq) {
        const size_t ld = (size_t)a.n_heads * HD;
        const int32_t n_tok = t.s >= 0 ? t.t1 - t.t0 : 0, heads = t.heads_here;
        const uint16_t *q = t.q;
        const int nthr = wgq < 0 ? NT : NT / 2, r0 = wgq < 0 ? 0 : wgq * 64, qt = wgq < 0 ? tid : tid & 127;
#pragma unroll
        for (int p = 0; p < BM * CPR / NT; p++) {
            const int r = r0 + qt / CPR + p * (nthr / CPR), c = qt % CPR;
            const int32_t tl = r / g.gh, hl = r % g.gh;
            const bool ok = tl < g.tq && tl < n_tok && hl < heads;
            const uint16_t *src = ok ? q + (size_t)tl * ld + (size_t)hl * HD + c * 8 : a.q;
            cp_async16(sQ + sw128<BM>(r, c), src, ok);
        }
    };

    /* warpgroup 1 makes every K/V copy, as in v5. The copy paths repeat v5's on purpose: taken into one device
     * function for both kernels they left v5's SASS as it was but made v5p's 5-8% longer and v5p 2% slower
     * (twentieth session, same call) */
    const int ltid = tid - NT / 2;
    const int cchunk = ltid % CPR, crow = ltid / CPR;
    const bool loader = wg == 1;
    const int32_t bsl = g.bs_log2, bmask = (1 << g.bs_log2) - 1;
    const size_t blk_stride = ((size_t)a.n_kv_heads << bsl) * HD;
    const uint32_t ld_kv = ROWS ? (uint32_t)a.kv_row_stride : (uint32_t)HD;
    uint32_t nid = 0; /* idpre: the block id of the next call's rows */
    /* K/V tile j of tile t (visited order: from the diagonal down) into ring slot `slot`; one commit group a call */
    auto issue = [&](const v5p_tile &t, int32_t j, uint32_t slot) {
        if (loader && j < t.n_kt) { /* n_kt is 0 when there is no tile */
            const uint16_t *const kc = t.kc + cchunk * 8;
            const ptrdiff_t v_minus_k = t.v_minus_k;
            const int32_t *bt = t.bt;
            const int32_t k0 = (t.n_kt - 1 - j) * BN;
            const uint32_t st = slot * TILE;
            if (j == 0) { /* the only tile that can reach past kv_end: zero-fill those keys */
                const int32_t kv_end = t.kv_end;
#pragma unroll
                for (int p = 0; p < KV_ROWS; p++) {
                    const int row = crow + p * LRPP;
                    const int32_t key = k0 + row;
                    const bool ok = key < kv_end;
                    const size_t off = !ok  ? 0
                                       : ROWS ? (size_t)key * ld_kv
                                              : (size_t)__ldg(bt + (key >> bsl)) * blk_stride +
                                                    (size_t)(key & bmask) * HD;
                    cp_async16(sK + st + sw128<BN>(row, cchunk), kc + off, ok);
                    cp_async16(sV + st + sw128<BN>(row, cchunk), kc + off + v_minus_k, ok);
                }
            } else if (ROWS || g.rowg) { /* consecutive keys of one block (ROWS: consecutive tokens) */
                const uint32_t key0 = (uint32_t)(k0 + crow * KV_ROWS);
                const uint16_t *src = ROWS ? kc + (size_t)key0 * ld_kv
                                           : kc +
                                                 (size_t)(g.idpre ? nid : (uint32_t)__ldg(bt + (key0 >> bsl))) *
                                                     blk_stride +
                                                 (key0 & (uint32_t)bmask) * (uint32_t)HD;
                auto row_off = [&](int p) {
                    if constexpr (ROWS) return (size_t)p * ld_kv;
                    else return p * HD;
                };
#pragma unroll
                for (int p = 0; p < KV_ROWS; p++) {
                    const int row = crow * KV_ROWS + p;
                    cp_async16_all(sK + st + sw128<BN>(row, cchunk), src + row_off(p));
                    cp_async16_all(sV + st + sw128<BN>(row, cchunk), src + row_off(p) + v_minus_k);
                }
            } else {
#pragma unroll
                for (int p = 0; p < KV_ROWS; p++) {
                    const int row = crow + p * LRPP;
                    const uint32_t key = (uint32_t)(k0 + row);
                    const uint32_t id = (uint32_t)__ldg(bt + (key >> bsl));
                    const uint16_t *src = kc + (size_t)id * blk_stride + (key & (uint32_t)bmask) * (uint32_t)HD;
                    cp_async16_all(sK + st + sw128<BN>(row, cchunk), src);
                    cp_async16_all(sV + st + sw128<BN>(row, cchunk), src + v_minus_k);
                }
            }
            /* idpre: the block id of this thread's rows in the tile's next K/V tile, for the next call (the first
             * K/V tile of a tile takes the per-row path above) */
            if constexpr (!ROWS)
                if (g.idpre && g.rowg && j + 1 < t.n_kt)
                    nid = (uint32_t)__ldg(bt + ((uint32_t)((t.n_kt - 2 - j) * BN + crow * KV_ROWS) >> bsl));
        }
        cp_async_commit();
    };
    load_q(s_t[0], -1);
    issue(s_t[0], 0, 0); /* with Q in the first group */

    const float sl2 = a.scale * 1.4426950408889634f;
    const uint32_t qrows = sQ + (uint32_t)wg * 64 * 128;
    float o[HD / 2];
    float sc[BN / 2];
    uint32_t pa[BN / 16][4];
    float mrow[2], lrow[2], alpha[2];
    int32_t lim[2];

    const uint64_t dq0 = gmma_desc(qrows, 16, 1024);
    auto issue_s = [&](uint32_t kS) { v5_issue_s<HD, BN, BM>(sc, dq0, kS); };
    auto issue_pv = [&](uint32_t vS) { v5_issue_pv<HD, BN>(o, pa, vS); };
    auto softmax = [&](int32_t kt, auto mask_c) {
        v5_softmax<BN, decltype(mask_c)::value>(sc, mrow, lrow, alpha, lim, kt, lane, sl2, g.lazy);
    };
    auto pack_p = [&]() { v5_pack_p<BN>(pa, sc); };
    auto rescale_o = [&]() { v5_rescale_o<HD>(o, alpha); };
    /* fastmax rounds, the check and the redo: as in v5 (the redo's S from the K slot of round jp, `prev` at the top
     * of round jp + 1 or after the last round) */
    float lsave[2] = {0.0f, 0.0f};
    int ovf = 0;
    auto softmax_fast = [&]() { v5_softmax_fast<BN>(sc, mrow, lrow, lsave, ovf, sl2); };

    uint32_t slot = 0; /* ring slot of the round in hand: the rounds of all tiles are one sequence */
    int par = 0;       /* s_t[par]: the tile in hand */
    /* Tiles are claimed two ahead: the next one's addresses are needed in this tile's last round (its first K/V
     * copies), and the claim of the one after it is an atomic whose round trip runs under this tile (thread 0
     * holds it in a register until the tile's end). */
    if (tid == 0) s_claim = (int32_t)gridDim.x + atomicAdd(ctr, 1);
    int32_t pending = 0;
    for (;;) {
        __syncthreads(); /* s_claim visible */
        v5p_find<NT, HD, BN, ROWS>(a, g, per_slot, s_claim, n_ids, &s_t[par ^ 1]);
        if (tid == 0) pending = atomicAdd(ctr, 1);
        __syncthreads(); /* s_t[par ^ 1] visible */

        const int32_t n_kt = s_t[par].n_kt, n_mask = n_kt - s_t[par].n_full;
        {
            const int32_t t0 = s_t[par].t0, t1 = s_t[par].t1, base = s_t[par].base;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = warp * 16 + (lane >> 2) + h * 8;
                const int32_t tl = r / g.gh;
                lim[h] = (tl < g.tq && t0 + tl < t1) ? base + t0 + tl : base + t1 - 1;
            }
        }
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
        mrow[0] = mrow[1] = -INFINITY;
        lrow[0] = lrow[1] = 0.0f;
        alpha[0] = alpha[1] = 1.0f;
        uint32_t prev = 0;

        auto redo = [&](int32_t jp, uint32_t kslot) {
            lrow[0] = lsave[0];
            lrow[1] = lsave[1];
            ovf = 0;
            fence_regs(sc);
            wgmma_fence();
            issue_s(sK + kslot * TILE);
            wgmma_wait0();
            fence_regs(sc);
            softmax(n_kt - 1 - jp, std::false_type{});
            rescale_o();
            pack_p();
        };
        auto barrier_redo = [&](int32_t jp, uint32_t kslot) {
            if (__shfl_sync(0xffffffffu, __syncthreads_or(ovf), 0)) redo(jp, kslot);
        };
        auto round = [&](int32_t j, auto mask_c, auto first_c, auto fast_c) {
            cp_async_wait<0>(); /* this thread's copies of tile j (and Q) have landed */
            fence_proxy_async();
            if constexpr (decltype(fast_c)::value) barrier_redo(j - 1, prev);
            else __syncthreads();
            const uint32_t nslot = slot == STAGES - 1 ? 0 : slot + 1;
            const bool more = j + 1 < n_kt; /* else: the next tile's first K/V tile */
            issue(s_t[more ? par : par ^ 1], more ? j + 1 : 0, nslot);
            fence_regs(sc);
            fence_regs(o);
            fence_regs_u(pa);
            wgmma_fence();
            issue_s(sK + slot * TILE);
            if constexpr (!decltype(first_c)::value) {
                issue_pv(sV + prev * TILE);
                wgmma_wait1();
            } else {
                wgmma_wait0();
            }
            fence_regs(sc);
            if constexpr (decltype(fast_c)::value) softmax_fast();
            else softmax(n_kt - 1 - j, mask_c);
            pin_after(s_pin, lrow[0], lrow[1]);
            wgmma_wait0();
            fence_regs(o);
            fence_regs_u(pa);
            if constexpr (!decltype(fast_c)::value) rescale_o();
            pack_p();
            prev = slot;
            slot = nslot;
        };
        using yes = std::true_type;
        using no = std::false_type;
        round(0, yes{}, yes{}, no{});
        int32_t j = 1;
        for (; j < n_mask; j++) round(j, yes{}, no{}, no{});
        if (g.fastmax) {
            for (; j < n_kt; j++) round(j, no{}, no{}, yes{});
            barrier_redo(n_kt - 1, prev);
        } else {
            for (; j < n_kt; j++) round(j, no{}, no{}, no{});
        }
        /* the last tile's O += P V; under it, this warpgroup's Q rows of the next tile (the last S is done) */
        fence_regs(o);
        fence_regs_u(pa);
        wgmma_fence();
        issue_pv(sV + prev * TILE);
        load_q(s_t[par ^ 1], wg);
        cp_async_commit();
        wgmma_wait0();
        fence_regs(o);
        /* stage O through the K slot after the one the next tile's first copies went to: its last reader was the
         * S product of this tile's second-to-last round, done by both warpgroups before the last round's barrier;
         * the next copy into it goes out after the next round's barrier */
        const uint32_t stage = sK + (slot == STAGES - 1 ? 0 : slot + 1) * TILE;
        store_o_hu<HD>(o, lrow, stage, warp, lane, s_t[par].q0 + s_t[par].t0, s_t[par].t1 - s_t[par].t0, a, g,
                       s_t[par].hu);
        if (tid == 0) s_claim = (int32_t)gridDim.x + pending;
        if (s_t[par ^ 1].s < 0) break;
        par ^= 1;
    }
    cp_async_wait<0>();
}

/* ---- launchers ------------------------------------------------------------------------------------ */

cudaError_t launch_v1(const tm_cuda_attn_args *a, cudaStream_t stream) {
    const int32_t max_q = a->max_query_len > 0 ? min(a->max_query_len, a->n_tokens) : a->n_tokens;
    const int32_t n_qt = (max_q + V1_TQ - 1) / V1_TQ;
    const int64_t gx = (int64_t)n_qt * a->n_seqs;
    if (gx > INT32_MAX || a->n_heads > 65535) return cudaErrorInvalidValue;
    const size_t smem = v1_smem_bytes(a->head_dim);
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel_v1, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    attn_prefill_kernel_v1<<<dim3((unsigned)gx, (unsigned)a->n_heads), V1_NW * 32, smem, stream>>>(*a, n_qt);
    return cudaGetLastError();
}

/* The tile geometry of v2, v3 and v5 (BM rows a CTA) and their grid: tile slots (an upper bound on the sum over
 * sequences of ceil(q_len / tq)) x kv heads x head chunks. */
int64_t prefill_grid(const tm_cuda_attn_args *a, int32_t bm, prefill_geom *g) {
    g->group = a->n_heads / a->n_kv_heads;
    g->gh = g->group < bm ? g->group : bm;
    g->n_hc = (g->group + g->gh - 1) / g->gh;
    g->tq = bm / g->gh;
    g->bs_log2 = 0;
    g->rowg = 0;
    g->idpre = 0;
    g->fastmax = 0;
    /* TM_CUDA_ATTN_PREFILL_LAZY: how far a row's max may grow before O is rescaled (log2 units, default 8; P then
     * stays below 2^lazy <= 2^16, far from bf16 or f32 overflow); 0 rescales on every growth */
    const char *lz = getenv("TM_CUDA_ATTN_PREFILL_LAZY");
    g->lazy = lz ? (float)atof(lz) : 8.0f;
    if (!(g->lazy >= 0.0f && g->lazy <= 16.0f)) g->lazy = 8.0f;
    while ((1 << g->bs_log2) < a->block_size) g->bs_log2++;
    int64_t slots = ((int64_t)a->n_tokens + g->tq - 1) / g->tq + a->n_seqs;
    if (slots > a->n_tokens) slots = a->n_tokens;
    if (a->max_query_len > 0) {
        const int64_t by_max = (int64_t)a->n_seqs * ((a->max_query_len + g->tq - 1) / g->tq);
        if (by_max < slots) slots = by_max;
    }
    return slots * a->n_kv_heads * g->n_hc;
}

template <int HD, int BN, int NW, int STAGES, int MINB, bool QREG>
cudaError_t launch_v2(const tm_cuda_attn_args *a, cudaStream_t stream) {
    constexpr int BM = NW * 16;
    prefill_geom g;
    const int64_t grid = prefill_grid(a, BM, &g);
    if (grid > INT32_MAX) return cudaErrorInvalidValue;
    if (grid == 0) return cudaSuccess;
    const size_t smem = (size_t)(BM + 2 * STAGES * BN) * HD * 2;
    auto kern = attn_prefill_kernel_v2<HD, BN, NW, STAGES, MINB, QREG>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<(unsigned)grid, NW * 32, smem, stream>>>(*a, g);
    return cudaGetLastError();
}

template <int HD>
cudaError_t launch_v3(const tm_cuda_attn_args *a, cudaStream_t stream) {
    constexpr int BM = 128, BN = 64, STAGES = 3;
    prefill_geom g;
    const int64_t grid = prefill_grid(a, BM, &g);
    if (grid > INT32_MAX) return cudaErrorInvalidValue;
    if (grid == 0) return cudaSuccess;
    /* fp8: Q, one widened K and V tile, the raw ring */
    const size_t smem = a->kv_fp8 ? (size_t)(BM + 2 * BN) * HD * 2 + (size_t)STAGES * 2 * BN * HD + 1024
                                  : (size_t)(BM + 2 * STAGES * BN) * HD * 2 + 1024;
    auto kern = a->kv_fp8 ? attn_prefill_kernel_v3<HD, STAGES, HD == 64 ? 2 : 1, true>
                          : attn_prefill_kernel_v3<HD, STAGES, HD == 64 ? 2 : 1, false>; /* hd 64: two CTAs per SM */
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<(unsigned)grid, 256, smem, stream>>>(*a, g);
    return cudaGetLastError();
}

/* v5's ring depth: 3 stages of 128-key tiles at head_dim 128 (shared memory), else 4 */
template <int HD, int BN> constexpr int v5_stages() { return BN == 128 && HD == 128 ? 3 : 4; }

/* v5's and v5p's tiling and switches: returns the tile count (v5's grid) with *g filled, and *smem, the dynamic shared
 * memory a CTA takes */
template <int HD, int BN>
int64_t v5_setup(const tm_cuda_attn_args *a, prefill_geom *g, size_t *smem) {
    constexpr int BM = 128, STAGES = v5_stages<HD, BN>();
    const int64_t n = prefill_grid(a, BM, g);
    *smem = (size_t)(BM + 2 * STAGES * BN) * HD * 2 + 1024; /* hd 128, BN 128: 230400 B */
    constexpr int KV_ROWS = BN / (128 / (HD / 8)); /* rows a copying thread of warpgroup 1 takes in a tile */
    g->rowg = a->block_size >= KV_ROWS && !tm_env_is_0("TM_CUDA_V5_ROWG");
    g->idpre = g->rowg && !tm_env_is_0("TM_CUDA_V5_IDPRE");
    g->fastmax = !tm_env_is_0("TM_CUDA_V5_FASTMAX");
    return n;
}

/* v5 over `grid` tiles (one CTA a tile), set up by v5_setup */
template <int HD, int BN, bool ROWS>
cudaError_t run_v5(const tm_cuda_attn_args *a, const prefill_geom &g, int64_t grid, size_t smem, cudaStream_t stream) {
    auto kern = attn_prefill_kernel_v5<HD, BN, v5_stages<HD, BN>(), ROWS>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<(unsigned)grid, 256, smem, stream>>>(*a, g);
    return cudaGetLastError();
}

template <int HD, int BN, bool ROWS = false>
cudaError_t launch_v5(const tm_cuda_attn_args *a, cudaStream_t stream) {
    prefill_geom g;
    size_t smem = 0;
    const int64_t grid = v5_setup<HD, BN>(a, &g, &smem);
    if (grid > INT32_MAX) return cudaErrorInvalidValue;
    if (grid == 0) return cudaSuccess;
    return run_v5<HD, BN, ROWS>(a, g, grid, smem, stream);
}

/* v5p: one CTA an SM (at most the tiles v5 would launch), the tile counter zeroed in a->work first. Taken when
 * TM_CUDA_PREFILL_PERSIST=1, or when it is unset and there are at least V5P_MIN_TILES_PER_SM tiles an SM: the CTA
 * start that v5p hides is paid once a tile, so it only adds up with many tiles an SM (TM_CUDA_PREFILL_PERSIST=0:
 * always v5). Needs a work buffer for the counter; without one, v5. */
constexpr int V5P_MIN_TILES_PER_SM = 8;

template <bool ROWS>
cudaError_t launch_v5p_or_v5(const tm_cuda_attn_args *a, cudaStream_t stream) {
    constexpr int HD = 128, BN = 128;
    prefill_geom g;
    size_t smem = 0;
    const int64_t n_ids = v5_setup<HD, BN>(a, &g, &smem);
    if (n_ids > INT32_MAX) return cudaErrorInvalidValue;
    if (n_ids == 0) return cudaSuccess;
    const bool can = a->work && a->work_bytes >= sizeof(int32_t) && tm_aligned16(a->work);
    if (!can || tm_env_is_0("TM_CUDA_PREFILL_PERSIST")) return run_v5<HD, BN, ROWS>(a, g, n_ids, smem, stream);
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    if (!tm_env_is_1("TM_CUDA_PREFILL_PERSIST") && n_ids < (int64_t)V5P_MIN_TILES_PER_SM * sms)
        return run_v5<HD, BN, ROWS>(a, g, n_ids, smem, stream);
    auto kern = attn_prefill_kernel_v5p<HD, BN, v5_stages<HD, BN>(), ROWS>;
    if ((e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
        return e;
    if ((e = cudaMemsetAsync(a->work, 0, sizeof(int32_t), stream)) != cudaSuccess) return e;
    const int64_t grid = n_ids < sms ? n_ids : sms;
    kern<<<(unsigned)grid, 256, smem, stream>>>(*a, g, (int32_t)n_ids, (int32_t *)a->work);
    return cudaGetLastError();
}

} /* namespace */

extern "C" size_t tm_cuda_attn_prefill_work_bytes(int32_t n_tokens, int32_t n_heads, int32_t head_dim) {
    (void)n_tokens;
    (void)n_heads;
    (void)head_dim;
    return 256; /* v5p's tile counter */
}

extern "C" cudaError_t tm_cuda_attn_prefill(const tm_cuda_attn_args *a, cudaStream_t stream) {
    if (!a || a->n_tokens < 0 || a->n_seqs < 0) return cudaErrorInvalidValue;
    if (a->n_tokens == 0 || a->n_seqs == 0) return cudaSuccess;
    if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || a->head_dim <= 0 ||
        a->head_dim > 32 * V1_MAXC || a->block_size <= 0 || a->max_blocks <= 0 || !a->query_start ||
        !a->context_len || !a->block_table || !a->q || !a->k_cache || !a->v_cache || !a->out)
        return cudaErrorInvalidValue;
    /* TM_CUDA_ATTN_PREFILL_V=1/2/3/5 forces a version; unset (or anything else): v5 (v3 for an fp8 cache) */
    const char *v = getenv("TM_CUDA_ATTN_PREFILL_V");
    const int ver = v && v[0] >= '1' && v[0] <= '5' && v[0] != '4' && v[1] == '\0' ? v[0] - '0' : 5;
    const bool fast = ver != 1 && tm_aligned16(a->q) && tm_aligned16(a->k_cache) && tm_aligned16(a->v_cache) &&
                      tm_aligned16(a->out) && (a->block_size & (a->block_size - 1)) == 0 && a->block_size <= (1 << 20);
    if (fast && (a->head_dim == 128 || a->head_dim == 64)) {
        const bool hd128 = a->head_dim == 128;
        /* the step's own keys as bf16 rows (no cached prefix): v5 reads them, whatever the cache's type
         * (TM_CUDA_KV_ROWS=0: the cache) */
        if (a->k_rows && a->v_rows && tm_aligned16(a->k_rows) && tm_aligned16(a->v_rows) && a->kv_row_stride % 8 == 0 &&
            a->kv_row_stride >= a->n_kv_heads * a->head_dim && !tm_env_is_0("TM_CUDA_KV_ROWS"))
            return hd128 ? launch_v5p_or_v5<true>(a, stream) : launch_v5<64, 64, true>(a, stream);
        if (a->kv_fp8) return hd128 ? launch_v3<128>(a, stream) : launch_v3<64>(a, stream); /* fp8: v3 only */
        if (ver == 5) { /* key tile: TM_CUDA_ATTN_PREFILL_BN=64/128, else 128 for head_dim 128, 64 for 64 */
            const char *bn = getenv("TM_CUDA_ATTN_PREFILL_BN");
            const bool big = bn && strcmp(bn, "128") == 0 ? true : bn && strcmp(bn, "64") == 0 ? false : hd128;
            if (hd128) return big ? launch_v5p_or_v5<false>(a, stream) : launch_v5<128, 64>(a, stream);
            return big ? launch_v5<64, 128>(a, stream) : launch_v5<64, 64>(a, stream);
        }
        if (ver == 3) return hd128 ? launch_v3<128>(a, stream) : launch_v3<64>(a, stream);
        return hd128 ? launch_v2<128, 64, 8, 3, 1, true>(a, stream) : launch_v2<64, 64, 8, 3, 2, false>(a, stream);
    }
    return launch_v1(a, stream);
}
