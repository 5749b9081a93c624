/* tm_cuda_rope.cu -- RoPE on q and k fused with the write of k and v into their paged-cache slots. */
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_bf16.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <stdlib.h>

/* Semantics (as cpu_rope_kv_write / tm_cpu_rope_head): per token i, angle_j = (float)positions[i] * inv_freq[j]
 * in f32 and (cos, sin) of that f32 angle, accurate to the last bit of f32 (see load_angles); the pair
 * (a, b) = (x[2j], x[2j+1]) (llama) or (x[j], x[j + rope_dim/2]) (neox) becomes (a c - b s, a s + b c) in f32,
 * rounded to bf16 once; dims >= rope_dim pass through. q is rotated in place, or from q_src (every dim written);
 * q_src, k and v rows are src_stride elements apart when it is set (a fused q|k|v product); rotated k and v go to cache slot
 * slot_mapping[i] = block * block_size + offset at ((block * n_kv_heads + h) * block_size + offset) * head_dim.
 * A negative slot (a padding token) writes nothing to the cache (q is still rotated).
 *
 * One block per token: the block first puts the token's rope_dim/2 (cos, sin) pairs in shared memory (computed
 * once per pair, shared by all heads), then its threads walk the token's work items.
 * v2 (fast): work items of 8 elements moved as 16-byte vectors: per head, rope_dim/8 (llama: 4 adjacent pairs)
 * or rope_dim/16 (neox: 8 pairs = two 16-byte halves) rotation items, then (head_dim - rope_dim)/8 pass-through
 * items (nothing to do for q); v is copied in 16-byte items. Needs head_dim % 8 == 0, rope_dim % 8 == 0
 * (% 16 for neox) and 16-byte aligned q, k, v and caches.
 * v1 (simple): one thread per pair / element, any shape. TM_CUDA_ROPE_V=1 forces it.
 * kv_fp8: the cache holds e4m3 bytes; the bf16 value the bf16 cache would hold is rounded once more, to e4m3.
 * k_out, v_out: rows laid out as k and v (k and v themselves in place) get the values the cache holds (rotated k;
 * fp8: widened back), for a prefill attention that reads the step's own keys from them (tm_cuda_attn_args.k_rows). */

namespace {

using tmbf::bf;
using tmbf::to_bf;
using tmbf::unpack_bf16x8;
using tmbf::pack_bf16x2;
using tmbf::pack_bf16x8;

constexpr int kThreads = 256;

/* cs[j] = (cos, sin) of the f32 angle positions[tok] * inv_freq[j], j < half; ends with a barrier. The cos and
 * sin of that f32 angle are evaluated in double as sincospi(angle / pi): angle / pi is off by ~1e-16 relative,
 * ~4e-10 absolute at angle 2^20, and sincospi needs no large-argument reduction (sincosf's Payne-Hanek path
 * would put a local-memory array in the kernel), so the floats are those of a correctly rounded sincosf but for
 * rare double-rounding cases (1 ulp). */
__device__ __forceinline__ void load_angles(const int32_t *positions, const float *inv_freq, int half, int tok,
                                            float2 *cs) {
    const float pos = (float)positions[tok];
    for (int j = (int)threadIdx.x; j < half; j += kThreads) {
        const float th = __fmul_rn(pos, inv_freq[j]);
        double s, c;
        sincospi((double)th * 0.318309886183790671537767526745, &s, &c);
        cs[j] = make_float2((float)c, (float)s);
    }
    __syncthreads();
}

/* cache element (kv head h, dim 0) of slot; slot >= 0 */
__device__ __forceinline__ size_t cache_base(int64_t slot, int h, int n_kv_heads, int block_size, int head_dim) {
    const int64_t blk = slot / block_size, off = slot % block_size;
    return (((size_t)blk * (size_t)n_kv_heads + (size_t)h) * (size_t)block_size + (size_t)off) * (size_t)head_dim;
}

/* ---- v1: simple ---- */

__global__ void __launch_bounds__(kThreads) rope_kv_kernel_v1(tm_cuda_rope_args a) {
    extern __shared__ float2 cs[]; /* (rope_dim / 2) */
    const int tok = (int)blockIdx.x, hd = a.head_dim, half = a.rope_dim / 2;
    load_angles(a.positions, a.inv_freq, half, tok, cs);
    const size_t qw = (size_t)a.n_heads * (size_t)hd, kw = (size_t)a.n_kv_heads * (size_t)hd;
    uint16_t *q = a.q + (size_t)tok * qw;
    const uint16_t *qi = a.q_src ? a.q_src + (size_t)tok * (a.src_stride ? (size_t)a.src_stride : qw) : q;
    const size_t kv_ld = a.src_stride ? (size_t)a.src_stride : kw;
    const uint16_t *k = a.k + (size_t)tok * kv_ld, *v = a.v + (size_t)tok * kv_ld;
    uint16_t *ko = a.k_out ? a.k_out + (size_t)tok * kv_ld : nullptr, *vo = a.v_out ? a.v_out + (size_t)tok * kv_ld : nullptr;
    /* q pairs, in place or from q_src */
    for (int e = (int)threadIdx.x; e < a.n_heads * half; e += kThreads) {
        const int h = e / half, j = e % half;
        const int ia = a.neox ? j : 2 * j, ib = a.neox ? j + half : 2 * j + 1;
        const uint16_t *ps = qi + (size_t)h * hd;
        uint16_t *p = q + (size_t)h * hd;
        const float x0 = bf(ps[ia]), x1 = bf(ps[ib]), c = cs[j].x, s = cs[j].y;
        p[ia] = to_bf(x0 * c - x1 * s);
        p[ib] = to_bf(x0 * s + x1 * c);
    }
    const int rest = hd - a.rope_dim;
    if (a.q_src) /* q pass-through dims */
        for (int e = (int)threadIdx.x; e < a.n_heads * rest; e += kThreads) {
            const int h = e / rest, d = a.rope_dim + e % rest;
            q[(size_t)h * hd + d] = qi[(size_t)h * hd + d];
        }
    const int64_t slot = a.slot_mapping[tok];
    if (slot < 0) return;
    /* k pairs -> cache */
    for (int e = (int)threadIdx.x; e < a.n_kv_heads * half; e += kThreads) {
        const int h = e / half, j = e % half;
        const int ia = a.neox ? j : 2 * j, ib = a.neox ? j + half : 2 * j + 1;
        const uint16_t *p = k + (size_t)h * hd;
        const size_t o = cache_base(slot, h, a.n_kv_heads, a.block_size, hd);
        const float x0 = bf(p[ia]), x1 = bf(p[ib]), c = cs[j].x, s = cs[j].y;
        const uint16_t ya = to_bf(x0 * c - x1 * s), yb = to_bf(x0 * s + x1 * c);
        tm_kv_store1(a.k_cache, o + ia, ya, a.kv_fp8);
        tm_kv_store1(a.k_cache, o + ib, yb, a.kv_fp8);
        if (ko) {
            ko[(size_t)h * hd + ia] = tm_kv_held1(ya, a.kv_fp8);
            ko[(size_t)h * hd + ib] = tm_kv_held1(yb, a.kv_fp8);
        }
    }
    /* k pass-through dims -> cache */
    for (int e = (int)threadIdx.x; e < a.n_kv_heads * rest; e += kThreads) {
        const int h = e / rest, d = a.rope_dim + e % rest;
        tm_kv_store1(a.k_cache, cache_base(slot, h, a.n_kv_heads, a.block_size, hd) + d, k[(size_t)h * hd + d], a.kv_fp8);
        if (ko) ko[(size_t)h * hd + d] = tm_kv_held1(k[(size_t)h * hd + d], a.kv_fp8);
    }
    /* v -> cache */
    for (int e = (int)threadIdx.x; e < a.n_kv_heads * hd; e += kThreads) {
        const int h = e / hd, d = e % hd;
        tm_kv_store1(a.v_cache, cache_base(slot, h, a.n_kv_heads, a.block_size, hd) + d, v[(size_t)h * hd + d], a.kv_fp8);
        if (vo) vo[(size_t)h * hd + d] = tm_kv_held1(v[(size_t)h * hd + d], a.kv_fp8);
    }
}

/* ---- v2: 16-byte items ---- */

/* item u at element e of dst (bf16, or e4m3 bytes when fp8), and what dst holds at row + e when row is set */
__device__ __forceinline__ void store8(uint16_t *dst, size_t e, uint4 u, bool fp8, uint16_t *row) {
    tm_kv_store8(dst, e, u, fp8);
    if (row) *reinterpret_cast<uint4 *>(row + e) = tm_kv_held8(u, fp8);
}

/* rotate the 8-element item at src + d0 (llama: 4 adjacent pairs starting at pair d0 / 2) into dst + d0 (dst: bf16,
 * or e4m3 bytes when fp8; row: NULL or where the held values go, which may be src itself) */
__device__ __forceinline__ void rot_llama(const uint16_t *src, uint16_t *dst, int d0, const float2 *cs,
                                          bool fp8 = false, uint16_t *row = nullptr) {
    float x[8], y[8];
    unpack_bf16x8(*reinterpret_cast<const uint4 *>(src + d0), x);
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const float2 t = cs[d0 / 2 + p];
        y[2 * p] = x[2 * p] * t.x - x[2 * p + 1] * t.y;
        y[2 * p + 1] = x[2 * p] * t.y + x[2 * p + 1] * t.x;
    }
    store8(dst, (size_t)d0, pack_bf16x8(y), fp8, row);
}

/* rotate pairs j0..j0+7 (neox: x[j] with x[j + half]) of src into dst */
__device__ __forceinline__ void rot_neox(const uint16_t *src, uint16_t *dst, int j0, int half, const float2 *cs,
                                         bool fp8 = false, uint16_t *row = nullptr) {
    float x0[8], x1[8], y0[8], y1[8];
    unpack_bf16x8(*reinterpret_cast<const uint4 *>(src + j0), x0);
    unpack_bf16x8(*reinterpret_cast<const uint4 *>(src + half + j0), x1);
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const float2 t = cs[j0 + p];
        y0[p] = x0[p] * t.x - x1[p] * t.y;
        y1[p] = x0[p] * t.y + x1[p] * t.x;
    }
    store8(dst, (size_t)j0, pack_bf16x8(y0), fp8, row);
    store8(dst, (size_t)(half + j0), pack_bf16x8(y1), fp8, row);
}

__global__ void __launch_bounds__(kThreads) rope_kv_kernel_v2(tm_cuda_rope_args a) {
    tm_pdl_enter();
    extern __shared__ float2 cs[]; /* (rope_dim / 2) */
    const int tok = (int)blockIdx.x, hd = a.head_dim, half = a.rope_dim / 2;
    load_angles(a.positions, a.inv_freq, half, tok, cs);
    const int n_rot = a.neox ? half / 8 : a.rope_dim / 8; /* rotation items per head */
    const int n_pass = (hd - a.rope_dim) / 8;               /* pass-through items per head */
    const int per_head = n_rot + n_pass, hd8 = hd / 8;
    const size_t qw = (size_t)a.n_heads * (size_t)hd, kw = (size_t)a.n_kv_heads * (size_t)hd;
    uint16_t *q = a.q + (size_t)tok * qw;
    const uint16_t *qi = a.q_src ? a.q_src + (size_t)tok * (a.src_stride ? (size_t)a.src_stride : qw) : q;
    const size_t kv_ld = a.src_stride ? (size_t)a.src_stride : kw;
    const uint16_t *k = a.k + (size_t)tok * kv_ld, *v = a.v + (size_t)tok * kv_ld;
    uint16_t *ko = a.k_out ? a.k_out + (size_t)tok * kv_ld : nullptr, *vo = a.v_out ? a.v_out + (size_t)tok * kv_ld : nullptr;
    const int64_t slot = a.slot_mapping[tok];
    const int q_per = a.q_src ? per_head : n_rot;                    /* q items: rotations (+ pass-through) */
    const int n_q = a.n_heads * q_per;
    const int n_k = slot >= 0 ? a.n_kv_heads * per_head : 0;         /* k items */
    const int n_v = slot >= 0 ? a.n_kv_heads * hd8 : 0;              /* v items */
    for (int e = (int)threadIdx.x; e < n_q + n_k + n_v; e += kThreads) {
        if (e < n_q) {
            const int h = e / q_per, u = e % q_per;
            const uint16_t *ps = qi + (size_t)h * hd;
            uint16_t *p = q + (size_t)h * hd;
            if (u >= n_rot) {
                const int d0 = a.rope_dim + 8 * (u - n_rot);
                *reinterpret_cast<uint4 *>(p + d0) = *reinterpret_cast<const uint4 *>(ps + d0);
            } else if (a.neox) {
                rot_neox(ps, p, 8 * u, half, cs);
            } else {
                rot_llama(ps, p, 8 * u, cs);
            }
        } else if (e < n_q + n_k) {
            const int f = e - n_q, h = f / per_head, u = f % per_head;
            const uint16_t *p = k + (size_t)h * hd;
            uint16_t *row = ko ? ko + (size_t)h * hd : nullptr;
            const size_t cb = cache_base(slot, h, a.n_kv_heads, a.block_size, hd);
            uint16_t *o = a.kv_fp8 ? (uint16_t *)((uint8_t *)a.k_cache + cb) : a.k_cache + cb;
            if (u >= n_rot) {
                const int d0 = a.rope_dim + 8 * (u - n_rot);
                store8(o, (size_t)d0, *reinterpret_cast<const uint4 *>(p + d0), a.kv_fp8, row);
            } else if (a.neox) {
                rot_neox(p, o, 8 * u, half, cs, a.kv_fp8, row);
            } else {
                rot_llama(p, o, 8 * u, cs, a.kv_fp8, row);
            }
        } else {
            const int f = e - n_q - n_k, h = f / hd8, d0 = 8 * (f % hd8);
            const uint4 u = *reinterpret_cast<const uint4 *>(v + (size_t)h * hd + d0);
            tm_kv_store8(a.v_cache, cache_base(slot, h, a.n_kv_heads, a.block_size, hd) + (size_t)d0, u, a.kv_fp8);
            if (vo) *reinterpret_cast<uint4 *>(vo + (size_t)h * hd + d0) = tm_kv_held8(u, a.kv_fp8);
        }
    }
}

} // namespace

extern "C" cudaError_t tm_cuda_rope_kv_write(const tm_cuda_rope_args *a, cudaStream_t stream) {
    if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->head_dim <= 0 || a->rope_dim < 0 ||
        a->rope_dim % 2 || a->rope_dim > a->head_dim || a->block_size <= 0 || !a->positions || !a->slot_mapping ||
        !a->q || !a->k || !a->v || !a->k_cache || !a->v_cache || (a->rope_dim > 0 && !a->inv_freq))
        return cudaErrorInvalidValue;
    if (a->n_tokens == 0) return cudaSuccess;
    const size_t smem = (size_t)(a->rope_dim / 2) * sizeof(float2);
    if (smem > 48 * 1024) return cudaErrorInvalidValue;
    const bool v1 = tm_env_is_1("TM_CUDA_ROPE_V");
    if (a->src_stride < 0) return cudaErrorInvalidValue;
    const bool vec = a->head_dim % 8 == 0 && a->rope_dim % (a->neox ? 16 : 8) == 0 && tm_aligned16(a->q) &&
                     tm_aligned16(a->k) && tm_aligned16(a->v) && tm_aligned16(a->k_cache) && tm_aligned16(a->v_cache) &&
                     (!a->q_src || tm_aligned16(a->q_src)) && a->src_stride % 8 == 0 &&
                     (!a->k_out || tm_aligned16(a->k_out)) && (!a->v_out || tm_aligned16(a->v_out));
    if (vec && !v1)
        return tm_launch(rope_kv_kernel_v2, dim3((unsigned)a->n_tokens), dim3(kThreads), smem, stream, *a);
    else
        rope_kv_kernel_v1<<<(unsigned)a->n_tokens, kThreads, smem, stream>>>(*a);
    return cudaGetLastError();
}
