/* tm_cuda_sample.cu -- argmax and sampling (temperature, top-k, top-p, min-p) on the device, 1-8 blocks per row. */
#include "backend/cuda/tm_cuda_kernels.h"

#include <cooperative_groups.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

/* Sampling without sorting. Every token gets a unique 64-bit key: the high word orders the logits (the float's
 * bits made monotone, -0 taken as +0), the low word is vocab - 1 - id, so a larger key means a larger logit
 * or, on a tie, a lower id -- the CPU sampler's order. Each restriction is then one threshold on that key:
 *  - top-k: the k-th largest key (a selection by counts);
 *  - top-p: within the top-k set, the key where the mass in key order first reaches ceil(top_p * Z);
 *  - min-p: a filter w >= min_p on the weights (the max has w = 1);
 *  - the draw: u = hash(seed, offset) / 2^64, target = floor(u * Z_S) + 1, and the token is the one where the
 *    mass of the kept set S, in descending key order, first reaches the target.
 * Weights are w = expf((x - max) / T) (as the CPU sampler) and masses are sums of W = round(w * 2^40) in 64-bit
 * integers: exact and independent of the summation order, so the result is a deterministic function of
 * (logits, params), whatever the thread scheduling (float atomics would not be). Tokens with w < 2^-41 get
 * W = 0 and are never drawn (probability < 1e-12 of the max's).
 *
 * v2 (fast): the thresholds are found by radix selection over the key, digits of 11, 11, 10 bits of the logit
 * word then 11-bit digits of the id word (only when ties remain): each step is a pass over the candidates
 * building a shared-memory histogram (counts, and masses with integer atomics), then a block scan finds the bin
 * holding the threshold; a step stops early when the rest of that bin is decided (whole bin, or one element).
 * When top_k <= kListCap, the k kept keys are gathered into shared memory once found, and top-p and the draw
 * run over that list instead of the row; without such a top-k, the kListCap best keys are gathered (with the
 * total mass, in the same pass) and used the same way when they hold the top-p mass. The first count histogram
 * is built in the same pass as the row's max / log-sum-exp.
 * Blocks per row: one block reads a 128k row in ~10 us, so when the rows leave SMs idle (small batches) a row
 * is split over a thread-block cluster of 2, 4 or 8 blocks: each block walks its share, and histograms, sums,
 * row stats and the candidate list are merged in the leader block's shared memory through distributed shared
 * memory (DSMEM atomics), with cluster barriers where one block barrier was. Once the list is complete the
 * leader finishes alone. TM_CUDA_SAMPLE_V=2 keeps one block per row; TM_CUDA_SAMPLE_CLUSTER=N forces N.
 * v1 (simple): each threshold is built bit by bit from the top (keep bit b when the count / mass of the keys
 * >= the candidate is still enough), one block-wide reduction over the row per bit; ~50 passes per threshold.
 * Every version and group size selects the same keys and draws the same token. TM_CUDA_SAMPLE_V=1 forces v1.
 * argmax: the same row walk and grouping (TM_CUDA_ARGMAX_V=1: one block per row; TM_CUDA_ARGMAX_CLUSTER=N).
 * The logprob is (x - max) - log(sum exp(x - max)) at T = 1, from the same first pass. A row that is all -inf
 * gives id 0 and logprob -log(vocab) (as the CPU sampler); logits must not be NaN or +inf. */

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 2;       /* float4 loads in flight per thread in a row walk (64 registers at 1024 threads) */
constexpr int kMaxBins = 2048;   /* 11-bit digits */
constexpr int kListCap = 2048;   /* top-k sets up to this size are kept in shared memory */
constexpr int kMaxCluster = 8;   /* blocks per row at small batch */
constexpr float kFix = 1099511627776.0f; /* 2^40: W = round(w * 2^40) */

/* ---- keys, weights, random numbers ---- */

__device__ __forceinline__ uint32_t xkey(float x) {
    const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float xkey_inv(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ uint64_t key_of(float x, int i, int V) {
    return ((uint64_t)xkey(x) << 32) | (uint32_t)(V - 1 - i);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* the draw's 64 random bits: u = rand64 / 2^64 in [0, 1) */
__device__ __forceinline__ uint64_t rand64(uint64_t seed, uint64_t offset) { return mix64(seed ^ mix64(offset)); }

/* ---- a row, walked by every thread over its own elements in a fixed order ---- */

struct RowSrc {
    const float *row; /* (V) */
    int V;
    bool vec;         /* V % 4 == 0 and row 16-byte aligned: float4 loads */
    int part, nparts; /* this block's share of the row: the blocks of a cluster split it (0, 1: all of it) */
};

template <int U = kUnroll, class F>
__device__ __forceinline__ void for_each(const RowSrc &s, F &&f) {
    const int g = s.part * kThreads + (int)threadIdx.x, stride = s.nparts * kThreads;
    if (s.vec) {
        const float4 *r4 = reinterpret_cast<const float4 *>(s.row);
        const int n4 = s.V >> 2;
        int c = g;
        for (; c + (U - 1) * stride < n4; c += U * stride) { /* U loads in flight */
            float4 x[U];
#pragma unroll
            for (int u = 0; u < U; u++) x[u] = __ldg(r4 + c + u * stride);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = 4 * (c + u * stride);
                f(i, x[u].x);
                f(i + 1, x[u].y);
                f(i + 2, x[u].z);
                f(i + 3, x[u].w);
            }
        }
        for (; c < n4; c += stride) {
            const float4 x = __ldg(r4 + c);
            f(4 * c, x.x);
            f(4 * c + 1, x.y);
            f(4 * c + 2, x.z);
            f(4 * c + 3, x.w);
        }
        const int i = (n4 << 2) + g;
        if (i < s.V) f(i, __ldg(s.row + i));
    } else {
        for (int i = g; i < s.V; i += stride) f(i, __ldg(s.row + i));
    }
}

/* keys of a candidate list in shared memory (the top-k set) */
struct ListSrc {
    const uint64_t *keys; /* (n) */
    int n, V;
};

template <class F>
__device__ __forceinline__ void for_each(const ListSrc &s, F &&f) {
    for (int j = (int)threadIdx.x; j < s.n; j += kThreads) {
        const uint64_t k = s.keys[j];
        f(s.V - 1 - (int)(uint32_t)k, xkey_inv((uint32_t)(k >> 32)));
    }
}

/* ---- block-wide primitives (kThreads threads) ---- */

/* exclusive prefix sum over the block in thread order; *total = the sum; ends with a barrier */
__device__ __forceinline__ uint64_t block_excl_scan(uint64_t v, uint64_t *sh /* (kWarps) */, uint64_t *total) {
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    uint64_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint64_t t = sh[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint64_t y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        sh[lane] = t;
    }
    __syncthreads();
    const uint64_t r = x - v + (warp ? sh[warp - 1] : 0);
    *total = sh[kWarps - 1];
    __syncthreads();
    return r;
}

__device__ __forceinline__ uint64_t block_sum_u64(uint64_t v, uint64_t *sh) {
    uint64_t t;
    block_excl_scan(v, sh, &t);
    return t;
}

/* running max, sum of exp(x - max) and lowest index of the max */
struct Stats {
    float m, s;
    int a; /* -1: none yet */
};

__device__ __forceinline__ void stats_push(Stats &st, int i, float x) {
    if (x > st.m) { /* st.m = -inf at first: expf(-inf) = 0 */
        st.s = st.s * expf(st.m - x) + 1.0f;
        st.m = x;
        st.a = i;
    } else if (x > -INFINITY) {
        st.s += expf(x - st.m); /* equal values keep the earlier (lower) index */
    }
}

/* symmetric in p, q (bitwise), so a butterfly leaves the same result in every lane */
__device__ __forceinline__ Stats stats_merge(Stats p, Stats q) {
    Stats r;
    r.m = fmaxf(p.m, q.m);
    r.a = p.m > q.m ? p.a : q.m > p.m ? q.a : (int)min((unsigned)p.a, (unsigned)q.a);
    if (r.m == -INFINITY)
        r.s = 0.0f;
    else
        r.s = (p.m == -INFINITY ? 0.0f : p.s * expf(p.m - r.m)) + (q.m == -INFINITY ? 0.0f : q.s * expf(q.m - r.m));
    return r;
}

__device__ __forceinline__ Stats stats_shfl(Stats st, int o) {
    Stats r;
    r.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    r.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    r.a = __shfl_xor_sync(0xffffffffu, st.a, o);
    return r;
}

/* every thread gets the same row stats; ends with a barrier */
__device__ __forceinline__ Stats block_stats(Stats st, Stats *sh /* (kWarps) */) {
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) st = stats_merge(st, stats_shfl(st, o));
    if (lane == 0) sh[warp] = st;
    __syncthreads();
    st = sh[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) st = stats_merge(st, stats_shfl(st, o));
    __syncthreads();
    return st;
}

/* the blocks working on one row: a thread-block cluster of CL blocks (sm_90), or one block when CL == 1. Block
 * rank 0 (the leader) holds the merged histograms, sums and the candidate list in its shared memory; the others
 * reach it through distributed shared memory. */
template <int CL>
struct Group {
    static __device__ __forceinline__ int rank() {
        if constexpr (CL == 1)
            return 0;
        else
            return (int)cg::this_cluster().block_rank();
    }
    static __device__ __forceinline__ void sync() {
        if constexpr (CL == 1)
            __syncthreads();
        else
            cg::this_cluster().sync();
    }
    template <class T>
    static __device__ __forceinline__ T *leader(T *p) {
        if constexpr (CL == 1)
            return p;
        else
            return cg::this_cluster().map_shared_rank(p, 0);
    }
};

/* ---- argmax ---- */

struct Best {
    float v;
    int i; /* -1: none */
};

__device__ __forceinline__ Best best_merge(Best p, Best q) {
    if (p.v > q.v) return p;
    if (q.v > p.v) return q;
    return (unsigned)p.i < (unsigned)q.i ? p : q;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel_v1(const float *logits, int V, bool vec, int32_t *out_ids) {
    __shared__ Best sh[kWarps];
    const RowSrc src = {logits + (size_t)blockIdx.x * (size_t)V, V, vec, 0, 1};
    Best b = {-INFINITY, -1};
    for_each<4>(src, [&](int i, float x) {
        if (x > b.v || b.i < 0) { /* indices grow along a thread's walk: the first max is kept */
            b.v = x;
            b.i = i;
        }
    });
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Best q;
        q.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        q.i = __shfl_xor_sync(0xffffffffu, b.i, o);
        b = best_merge(b, q);
    }
    if (lane == 0) sh[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = sh[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            Best q;
            q.v = __shfl_xor_sync(0xffffffffu, b.v, o);
            q.i = __shfl_xor_sync(0xffffffffu, b.i, o);
            b = best_merge(b, q);
        }
        if (lane == 0) out_ids[blockIdx.x] = b.i < 0 ? 0 : b.i;
    }
}

/* v2: CL blocks per row (a cluster), each over its share of the row; the leader merges */
template <int CL>
__global__ void __launch_bounds__(kThreads) argmax_kernel_v2(const float *logits, int V, bool vec, int32_t *out_ids) {
    extern __shared__ uint4 argmax_smem[]; /* (kWarps + CL) Best */
    Best *sh = reinterpret_cast<Best *>(argmax_smem);
    const int rowi = (int)blockIdx.x / CL, rank = Group<CL>::rank();
    const RowSrc src = {logits + (size_t)rowi * (size_t)V, V, vec, rank, CL};
    Best b = {-INFINITY, -1};
    for_each<4>(src, [&](int i, float x) {
        if (x > b.v || b.i < 0) {
            b.v = x;
            b.i = i;
        }
    });
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Best q;
        q.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        q.i = __shfl_xor_sync(0xffffffffu, b.i, o);
        b = best_merge(b, q);
    }
    if (lane == 0) sh[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = sh[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            Best q;
            q.v = __shfl_xor_sync(0xffffffffu, b.v, o);
            q.i = __shfl_xor_sync(0xffffffffu, b.i, o);
            b = best_merge(b, q);
        }
        if (lane == 0) Group<CL>::leader(sh + kWarps)[rank] = b;
    }
    Group<CL>::sync();
    if (rank == 0 && threadIdx.x == 0) {
        b = sh[kWarps];
        for (int k = 1; k < CL; k++) b = best_merge(b, sh[kWarps + k]);
        out_ids[rowi] = b.i < 0 ? 0 : b.i;
    }
}

/* ---- sampling ---- */

/* which keys are in the set a selection works on */
struct Filter {
    uint64_t floor;  /* keys >= floor (the top-k threshold; 0 = all) */
    float m, T;      /* weights w = expf((x - m) / T) */
    float minp;      /* w >= minp when > 0 */
};

__device__ __forceinline__ float weight(const Filter &f, float x) { return expf((x - f.m) / f.T); }
__device__ __forceinline__ uint64_t fixw(float w) { return (uint64_t)__float2ull_rn(w * kFix); }

/* ceil(p * z) in [1, z] */
__device__ __forceinline__ uint64_t mass_target(float p, uint64_t z) {
    const double t = ceil((double)p * (double)z);
    uint64_t r = t <= 1.0 ? 1 : (uint64_t)t;
    return r > z ? z : r;
}

/* digit `step` of the key: the logit word in 11, 11, 10 bits, then the id word (nb significant bits) in 11-bit
 * digits from the top; false when there is none left */
__device__ __forceinline__ bool digit(int step, int nb, int *shift, int *width) {
    if (step < 3) {
        *shift = step == 0 ? 53 : step == 1 ? 42 : 32;
        *width = step == 2 ? 10 : 11;
        return true;
    }
    const int hi = nb - 11 * (step - 3);
    if (hi <= 0) return false;
    *width = hi < 11 ? hi : 11;
    *shift = hi - *width;
    return true;
}

__device__ __forceinline__ uint64_t mask_above(int shift) { return shift ? ~((1ull << shift) - 1ull) : ~0ull; }

struct SampleSmem {
    uint32_t cnt[kMaxBins];
    unsigned long long mass[kMaxBins];
    uint64_t list[kListCap];
    uint64_t scan[kWarps];
    Stats stats[kWarps];
    int bin;           /* find_bin's answer */
    uint64_t cum;
    int list_n;
    /* cluster merges (the leader block's copy is the one used); for one block, the step results only */
    Stats part_stats[kMaxCluster];
    uint64_t part_sum[kMaxCluster];
    uint64_t res_target, res_cum, res_mass;
    uint32_t res_cnt;
    int res_bin, res_listed;
    float keep_log_s; /* this block's copy of the row's log sum exp and argmax, for the end (fewer live registers) */
    int keep_argmax;
};

/* sum over the group of one value per thread, in a fixed order; every thread gets it */
template <int CL>
__device__ uint64_t group_sum(uint64_t v, SampleSmem &sm) {
    const uint64_t b = block_sum_u64(v, sm.scan);
    if constexpr (CL == 1) {
        return b;
    } else {
        if (threadIdx.x == 0) Group<CL>::leader(sm.part_sum)[Group<CL>::rank()] = b;
        Group<CL>::sync();
        const uint64_t *ps = Group<CL>::leader(sm.part_sum);
        uint64_t t = 0;
        for (int k = 0; k < CL; k++) t += ps[k];
        Group<CL>::sync(); /* part_sum is free again, and nobody reads the leader any more */
        return t;
    }
}

/* the group's row stats, merged in block order; every thread gets the same */
template <int CL>
__device__ Stats group_stats(Stats st, SampleSmem &sm) {
    st = block_stats(st, sm.stats);
    if constexpr (CL > 1) {
        if (threadIdx.x == 0) Group<CL>::leader(sm.part_stats)[Group<CL>::rank()] = st;
        Group<CL>::sync();
        const Stats *ps = Group<CL>::leader(sm.part_stats);
        Stats r = ps[0];
        for (int k = 1; k < CL; k++) r = stats_merge(r, ps[k]);
        st = r;
        Group<CL>::sync();
    }
    return st;
}

/* the non-leaders add their histogram (cnt, and mass when MASS) into the leader's; ends with a group barrier */
template <bool MASS, int CL>
__device__ void merge_hist(int nbins, SampleSmem &sm) {
    if constexpr (CL > 1) {
        if (Group<CL>::rank() != 0) {
            uint32_t *lc = Group<CL>::leader(sm.cnt);
            unsigned long long *lm = Group<CL>::leader(sm.mass);
            for (int j = (int)threadIdx.x; j < nbins; j += kThreads) {
                const uint32_t c = sm.cnt[j];
                if (c) atomicAdd(lc + j, c);
                if (MASS) {
                    const unsigned long long w = sm.mass[j];
                    if (w) atomicAdd(lm + j, w);
                }
            }
        }
    }
    Group<CL>::sync();
}

enum SelMode { SEL_COUNT, SEL_TOPP, SEL_DRAW };

/* histogram of digit (shift, width) over the group's candidates (keys matching prefix on mask, in the filter),
 * merged in the leader */
template <bool MASS, int CL, class Src>
__device__ void hist_pass(const Src &src, uint64_t prefix, uint64_t mask, const Filter &flt, int shift, int width,
                          SampleSmem &sm) {
    __syncthreads(); /* this block's readers of the previous step are done */
    for (int j = (int)threadIdx.x; j < (1 << width); j += kThreads) {
        sm.cnt[j] = 0;
        if (MASS) sm.mass[j] = 0;
    }
    Group<CL>::sync(); /* every histogram is clear before anyone adds into the leader's */
    const int V = src.V;
    const uint32_t dmask = (1u << width) - 1u;
    for_each(src, [&](int i, float x) {
        const uint64_t key = key_of(x, i, V);
        if ((key & mask) != prefix || key < flt.floor) return;
        uint64_t W = 0;
        if (MASS) {
            const float w = weight(flt, x);
            if (flt.minp > 0.0f && !(w >= flt.minp)) return;
            W = fixw(w);
        }
        const uint32_t d = (uint32_t)(key >> shift) & dmask;
        atomicAdd(&sm.cnt[d], 1u);
        if (MASS && W) atomicAdd(&sm.mass[d], (unsigned long long)W);
    });
    __syncthreads();
    merge_hist<MASS, CL>(1 << width, sm);
}

/* The bin d, from the top, with cum(d) < target <= cum(d) + val(d), cum(d) = sum of the bins above d, into
 * sm.bin / sm.cum (one block). With derive, target is computed from the total first (mode TOPP: ceil(p * total);
 * DRAW: floor(u * total) + 1 with u = r / 2^64). Returns the target used. */
template <bool MASS>
__device__ uint64_t find_bin(int width, uint64_t target, SelMode mode, bool derive, float p, uint64_t r,
                             SampleSmem &sm) {
    constexpr int per = kMaxBins / kThreads; /* bins per thread */
    const int nbins = 1 << width;
    uint64_t local = 0;
#pragma unroll
    for (int j = 0; j < per; j++) {
        const int pos = (int)threadIdx.x * per + j;
        if (pos < nbins) local += MASS ? (uint64_t)sm.mass[nbins - 1 - pos] : (uint64_t)sm.cnt[nbins - 1 - pos];
    }
    uint64_t total;
    if (threadIdx.x == 0) { /* a bin always exists (1 <= target <= total); this keeps a broken invariant visible */
        sm.bin = 0;
        sm.cum = 0;
    }
    uint64_t cum = block_excl_scan(local, sm.scan, &total);
    if (derive) target = mode == SEL_TOPP ? mass_target(p, total) : __umul64hi(r, total) + 1;
#pragma unroll
    for (int j = 0; j < per; j++) {
        const int pos = (int)threadIdx.x * per + j;
        if (pos < nbins) {
            const uint64_t v = MASS ? (uint64_t)sm.mass[nbins - 1 - pos] : (uint64_t)sm.cnt[nbins - 1 - pos];
            if (cum < target && target <= cum + v) {
                sm.bin = nbins - 1 - pos;
                sm.cum = cum;
            }
            cum += v;
        }
    }
    __syncthreads();
    return target;
}

struct StepRes {
    uint64_t target, cum, mass;
    uint32_t cnt;
    int bin;
};

/* the leader finds the bin in the merged histogram; every block of the group gets the answer */
template <bool MASS, int CL>
__device__ StepRes find_step(int width, uint64_t target, SelMode mode, bool derive, float p, uint64_t r,
                             SampleSmem &sm) {
    if (Group<CL>::rank() == 0) {
        target = find_bin<MASS>(width, target, mode, derive, p, r, sm);
        if (threadIdx.x == 0) {
            sm.res_bin = sm.bin;
            sm.res_cum = sm.cum;
            sm.res_cnt = sm.cnt[sm.bin];
            sm.res_mass = MASS ? (uint64_t)sm.mass[sm.bin] : 0;
            sm.res_target = target;
        }
    }
    Group<CL>::sync();
    const SampleSmem *L = Group<CL>::leader(&sm);
    return StepRes{L->res_target, L->res_cum, L->res_mass, L->res_cnt, L->res_bin};
}

/* v2 selection. COUNT: the key of rank `target` (>= 1) from the top, exits when the rest of the bin is taken.
 * TOPP / DRAW: the smallest top set whose mass reaches the target (derived from the first step's total when
 * `derive`, else given). On return, the selected set is {key >= *prefix} among the candidates, and for DRAW the
 * selected element is the only candidate with (key & *mask) == *prefix. hist_ready: the first histogram is
 * already merged in the leader (COUNT only). */
template <SelMode MODE, int CL, class Src>
__device__ void select_v2(const Src &src, const Filter &flt, int nb, uint64_t target, float p, uint64_t r,
                          bool hist_ready, bool derive, SampleSmem &sm, uint64_t *prefix_out, uint64_t *mask_out) {
    constexpr bool MASS = MODE != SEL_COUNT;
    uint64_t prefix = 0, mask = 0;
    int shift, width;
    for (int step = 0; digit(step, nb, &shift, &width); step++) {
        if (!(step == 0 && hist_ready)) hist_pass<MASS, CL>(src, prefix, mask, flt, shift, width, sm);
        const StepRes res = find_step<MASS, CL>(width, target, MODE, MASS && derive && step == 0, p, r, sm);
        target = res.target - res.cum;
        prefix |= (uint64_t)res.bin << shift;
        mask = mask_above(shift);
        if (MODE == SEL_COUNT ? res.cnt == target
                              : MODE == SEL_TOPP ? (res.cnt == 1 || res.mass == target) : res.cnt == 1)
            break;
    }
    *prefix_out = prefix;
    *mask_out = mask;
}

/* v1 selection, bit by bit from the top: the largest K with count(keys >= K) >= target (COUNT) or
 * mass(keys >= K) >= target (TOPP, DRAW; target derived from the total mass first); returns that exact key. */
template <SelMode MODE>
__device__ uint64_t select_v1(const RowSrc &src, const Filter &flt, int nb, uint64_t target, float p, uint64_t r,
                              SampleSmem &sm) {
    constexpr bool MASS = MODE != SEL_COUNT;
    const int V = src.V;
    auto measure = [&](uint64_t lo) { /* count or mass of the candidates with key >= lo */
        uint64_t acc = 0;
        for_each(src, [&](int i, float x) {
            const uint64_t key = key_of(x, i, V);
            if (key < lo || key < flt.floor) return;
            if (!MASS) {
                acc++;
                return;
            }
            const float w = weight(flt, x);
            if (flt.minp > 0.0f && !(w >= flt.minp)) return;
            acc += fixw(w);
        });
        return block_sum_u64(acc, sm.scan);
    };
    if (MASS) {
        const uint64_t total = measure(0);
        target = MODE == SEL_TOPP ? mass_target(p, total) : __umul64hi(r, total) + 1;
    }
    uint64_t K = 0;
    for (int b = 63; b >= 0; b--) {
        if (b < 32 && b >= nb) continue; /* id bits above the vocabulary's are 0 in every key */
        const uint64_t cand = K | (1ull << b);
        if (measure(cand) >= target) K = cand;
    }
    return K;
}

/* the one candidate with (key & mask) == prefix writes the outputs, over the argmax written first by the leader
 * (which would only remain if that invariant were broken) */
template <int CL, class Src>
__device__ void emit_drawn(const Src &src, const Filter &flt, uint64_t prefix, uint64_t mask, float lse_m,
                           float lse_log_s, int argmax, int32_t *out_id, float *out_lp) {
    const int V = src.V;
    if (Group<CL>::rank() == 0 && threadIdx.x == 0) {
        *out_id = argmax;
        if (out_lp) *out_lp = -lse_log_s;
    }
    Group<CL>::sync();
    for_each(src, [&](int i, float x) {
        const uint64_t key = key_of(x, i, V);
        if ((key & mask) != prefix || key < flt.floor) return;
        if (flt.minp > 0.0f && !(weight(flt, x) >= flt.minp)) return;
        *out_id = i;
        if (out_lp) *out_lp = (x - lse_m) - lse_log_s;
    });
}

/* Pass 1 over the group's row: the row stats (max, sum exp(x - max), argmax; every thread gets them) and, when
 * hist0, the count histogram of the first digit of a selection (key bits 53..63), merged in the leader */
template <int CL>
__device__ Stats first_pass(const RowSrc &src, bool hist0, SampleSmem &sm) {
    if (hist0) {
        for (int j = (int)threadIdx.x; j < kMaxBins; j += kThreads) sm.cnt[j] = 0;
        Group<CL>::sync();
    }
    Stats st = {-INFINITY, 0.0f, -1};
    for_each(src, [&](int i, float x) {
        stats_push(st, i, x);
        if (hist0) atomicAdd(&sm.cnt[xkey(x) >> 21], 1u);
    });
    if (hist0 && CL > 1) {
        __syncthreads();
        merge_hist<false, CL>(kMaxBins, sm);
    }
    return group_stats<CL>(st, sm);
}

/* v1: one block per row, thresholds bit by bit */
__global__ void __launch_bounds__(kThreads) sample_kernel_v1(const float *logits, int V, bool vec,
                                                             const tm_cuda_sample_params *params, int32_t *out_ids,
                                                             float *out_logprob) {
    __shared__ SampleSmem sm;
    const int rowi = (int)blockIdx.x;
    const RowSrc src = {logits + (size_t)rowi * (size_t)V, V, vec, 0, 1};
    const tm_cuda_sample_params prm = params[rowi];
    const int nb = V > 1 ? 32 - __clz(V - 1) : 0; /* significant bits of the id word */
    int32_t *out_id = out_ids + rowi;
    float *out_lp = out_logprob ? out_logprob + rowi : nullptr;
    Stats st = {-INFINITY, 0.0f, -1};
    for_each(src, [&](int i, float x) { stats_push(st, i, x); });
    st = block_stats(st, sm.stats);
    const float log_s = logf(st.s);
    if (st.m == -INFINITY || !(prm.temperature > 0.0f)) { /* every logit -inf, or greedy */
        if (threadIdx.x == 0) {
            *out_id = st.m == -INFINITY ? 0 : st.a;
            if (out_lp) *out_lp = st.m == -INFINITY ? -logf((float)V) : -log_s;
        }
        return;
    }
    Filter flt = {0, st.m, prm.temperature, 0.0f};
    if (prm.top_k > 0 && prm.top_k < V)
        flt.floor = select_v1<SEL_COUNT>(src, flt, nb, (uint64_t)prm.top_k, 0.0f, 0, sm);
    if (prm.top_p < 1.0f) {
        const uint64_t kp = select_v1<SEL_TOPP>(src, flt, nb, 0, prm.top_p, 0, sm);
        flt.floor = kp > flt.floor ? kp : flt.floor;
    }
    flt.minp = prm.min_p > 0.0f ? fminf(prm.min_p, 1.0f) : 0.0f;
    const uint64_t key = select_v1<SEL_DRAW>(src, flt, nb, 0, 0.0f, rand64(prm.seed, prm.offset), sm);
    emit_drawn<1>(src, flt, key, ~0ull, st.m, log_s, st.a, out_id, out_lp);
}

/* v2: radix selection by a group of CL blocks per row (grid = n_rows * CL; a cluster when CL > 1) */
template <int CL>
__global__ void __launch_bounds__(kThreads) sample_kernel_v2(const float *logits, int V, bool vec,
                                                             const tm_cuda_sample_params *params, int32_t *out_ids,
                                                             float *out_logprob) {
    extern __shared__ uint4 sample_smem[]; /* (sizeof(SampleSmem)) */
    SampleSmem &sm = *reinterpret_cast<SampleSmem *>(sample_smem);
    const int rowi = (int)blockIdx.x / CL, rank = Group<CL>::rank();
    const RowSrc src = {logits + (size_t)rowi * (size_t)V, V, vec, rank, CL};
    const tm_cuda_sample_params prm = params[rowi];
    const bool greedy = !(prm.temperature > 0.0f);
    const bool topk = !greedy && prm.top_k > 0 && prm.top_k < V;
    const bool topp = !greedy && prm.top_p < 1.0f;
    const int nb = V > 1 ? 32 - __clz(V - 1) : 0; /* significant bits of the id word */
    int32_t *out_id = out_ids + rowi;
    float *out_lp = out_logprob ? out_logprob + rowi : nullptr;

    /* pass 1: max, sum exp(x - max), argmax, and the first count histogram of the first selection */
    const Stats st = first_pass<CL>(src, topk || (topp && V > kListCap), sm);
    if (st.m == -INFINITY || greedy) { /* every logit -inf (id 0, uniform logprob), or greedy */
        if (rank == 0 && threadIdx.x == 0) {
            *out_id = st.m == -INFINITY ? 0 : st.a;
            if (out_lp) *out_lp = st.m == -INFINITY ? -logf((float)V) : -logf(st.s);
        }
        return;
    }
    if (threadIdx.x == 0) { /* read back after the selections, behind their barriers */
        sm.keep_log_s = logf(st.s);
        sm.keep_argmax = st.a;
    }

    Filter flt = {0, st.m, prm.temperature, 0.0f};
    const uint64_t r = rand64(prm.seed, prm.offset);
    uint64_t prefix, mask;
    /* the candidate keys go to the leader's shared memory when they are few (top_k <= kListCap), or when the
     * kListCap best keys already hold the top-p mass: then top-p and the draw never read the row again */
    bool listed = false;
    uint64_t topp_target = 0;
    auto gather = [&](uint64_t lo, bool want_z) { /* list = keys >= lo; returns the mass of keys >= flt.floor */
        if (rank == 0 && threadIdx.x == 0) sm.list_n = 0;
        Group<CL>::sync();
        int *list_n = Group<CL>::leader(&sm.list_n);
        uint64_t *list = Group<CL>::leader(sm.list);
        uint64_t z = 0;
        for_each(src, [&](int i, float x) {
            const uint64_t key = key_of(x, i, V);
            if (want_z && key >= flt.floor) z += fixw(weight(flt, x));
            if (key >= lo) {
                const int j = atomicAdd(list_n, 1);
                if (j < kListCap) list[j] = key; /* at most kListCap keys pass, by construction */
            }
        });
        return group_sum<CL>(z, sm); /* its barriers also complete the list */
    };
    if (topk) {
        select_v2<SEL_COUNT, CL>(src, flt, nb, (uint64_t)prm.top_k, 0.0f, 0, true, false, sm, &prefix, &mask);
        flt.floor = prefix; /* exactly top_k keys are >= prefix */
        if (prm.top_k <= kListCap) {
            gather(flt.floor, false);
            listed = true;
        }
    }
    if (topp && !listed) {
        uint64_t lo = flt.floor;
        if ((topk ? prm.top_k : V) > kListCap) { /* the kListCap best keys (inside the top-k set) */
            select_v2<SEL_COUNT, CL>(src, flt, nb, (uint64_t)kListCap, 0.0f, 0, !topk, false, sm, &prefix, &mask);
            lo = prefix > lo ? prefix : lo;
        }
        const uint64_t z_all = gather(lo, true);
        topp_target = mass_target(prm.top_p, z_all);
        if (rank == 0) { /* the leader holds the list: does the top-p prefix end inside it? */
            uint64_t z_list = 0;
            for (int j = (int)threadIdx.x; j < min(sm.list_n, kListCap); j += kThreads)
                z_list += fixw(weight(flt, xkey_inv((uint32_t)(sm.list[j] >> 32))));
            z_list = block_sum_u64(z_list, sm.scan);
            if (threadIdx.x == 0) sm.res_listed = z_list >= topp_target;
        }
        Group<CL>::sync();
        listed = Group<CL>::leader(&sm)->res_listed;
        if (!listed) topp_target = 0;
    }
    flt.minp = prm.min_p > 0.0f ? fminf(prm.min_p, 1.0f) : 0.0f;
    const Filter flt_topp = {flt.floor, flt.m, flt.T, 0.0f}; /* min_p applies after top-p */
    if (listed) { /* the leader alone, over its list */
        if (rank != 0) return;
        const ListSrc lsrc = {sm.list, min(sm.list_n, kListCap), V};
        if (topp) {
            select_v2<SEL_TOPP, 1>(lsrc, flt_topp, nb, topp_target, prm.top_p, 0, false, topp_target == 0, sm,
                                   &prefix, &mask);
            flt.floor = prefix > flt.floor ? prefix : flt.floor;
        }
        select_v2<SEL_DRAW, 1>(lsrc, flt, nb, 0, 0.0f, r, false, true, sm, &prefix, &mask);
        emit_drawn<1>(lsrc, flt, prefix, mask, st.m, sm.keep_log_s, sm.keep_argmax, out_id, out_lp);
        return;
    }
    if (topp) {
        select_v2<SEL_TOPP, CL>(src, flt_topp, nb, 0, prm.top_p, 0, false, true, sm, &prefix, &mask);
        flt.floor = prefix > flt.floor ? prefix : flt.floor;
    }
    select_v2<SEL_DRAW, CL>(src, flt, nb, 0, 0.0f, r, false, true, sm, &prefix, &mask);
    emit_drawn<CL>(src, flt, prefix, mask, st.m, sm.keep_log_s, sm.keep_argmax, out_id, out_lp);
}

/* ---- logprobs and penalties ---- */

/* a row's scratch between tm_cuda_sample_prepare and _finish */
struct RowWork {
    float m, log_s; /* log-softmax stats of the logits before penalties (logprob rows) */
    float t_raw;    /* the in-flight id's logit before penalties, when no entry holds it */
    int t;          /* that id, or -1 */
};

/* rows with n_top > 0: the n_top best keys, in order, and the row's log-softmax stats (max, log sum exp), by a
 * group of CL blocks per row: one pass for the stats and the first count histogram (as sample_kernel_v2), the
 * radix selection of the k-th best key (select_v2, COUNT), one pass gathering the k keys >= it into the leader's
 * list, which its first thread sorts (k <= 20) */
template <int CL>
__global__ void __launch_bounds__(kThreads) logprobs_kernel_v1(const float *logits, int V, bool vec,
                                                               const tm_cuda_sample_extra *params, RowWork *work,
                                                               tm_cuda_sample_lp *out_lp) {
    extern __shared__ uint4 sample_smem[]; /* (sizeof(SampleSmem)) */
    SampleSmem &sm = *reinterpret_cast<SampleSmem *>(sample_smem);
    const int rowi = (int)blockIdx.x / CL, rank = Group<CL>::rank();
    const int n_top = min(params[rowi].n_top, TM_CUDA_SAMPLE_MAX_TOP);
    if (n_top <= 0) return; /* every block of the group alike */
    const RowSrc src = {logits + (size_t)rowi * (size_t)V, V, vec, rank, CL};
    const int nb = V > 1 ? 32 - __clz(V - 1) : 0;
    const int k = min(n_top, V);
    const bool sel = k < V;
    const Stats st = first_pass<CL>(src, sel, sm);
    uint64_t lo = 0;
    if (sel) {
        uint64_t mask;
        const Filter flt = {0, st.m, 1.0f, 0.0f};
        select_v2<SEL_COUNT, CL>(src, flt, nb, (uint64_t)k, 0.0f, 0, true, false, sm, &lo, &mask);
    }
    if (rank == 0 && threadIdx.x == 0) sm.list_n = 0;
    Group<CL>::sync();
    int *list_n = Group<CL>::leader(&sm.list_n);
    uint64_t *list = Group<CL>::leader(sm.list);
    for_each(src, [&](int i, float x) { /* exactly k keys pass (keys are unique) */
        const uint64_t key = key_of(x, i, V);
        if (key >= lo) {
            const int j = atomicAdd(list_n, 1);
            if (j < kListCap) list[j] = key;
        }
    });
    Group<CL>::sync();
    if (rank != 0 || threadIdx.x != 0) return;
    const int n = min(sm.list_n, k);
    for (int a = 1; a < n; a++) { /* insertion sort, best first */
        const uint64_t key = sm.list[a];
        int b = a;
        for (; b > 0 && sm.list[b - 1] < key; b--) sm.list[b] = sm.list[b - 1];
        sm.list[b] = key;
    }
    const bool none = st.m == -INFINITY; /* every logit -inf: uniform */
    const float log_s = none ? logf((float)V) : logf(st.s);
    tm_cuda_sample_lp *o = out_lp + rowi;
    for (int j = 0; j < n_top; j++) {
        if (j < n) {
            const uint64_t key = sm.list[j];
            const float x = xkey_inv((uint32_t)(key >> 32));
            o->top_id[j] = V - 1 - (int)(uint32_t)key;
            o->top_lp[j] = none ? -log_s : (x - st.m) - log_s;
        } else {
            o->top_id[j] = -1;
            o->top_lp[j] = -INFINITY;
        }
    }
    o->chosen = 0.0f;
    work[rowi] = RowWork{st.m, log_s, 0.0f, -1};
}

constexpr int kPenThreads = 128;

__device__ __forceinline__ float pen_apply(float x, float rp, float pp, float fp, int count, bool in_window) {
    if (in_window) x = x > 0.0f ? __fdiv_rn(x, rp) : __fmul_rn(x, rp);
    if (count > 0) x = __fsub_rn(x, __fadd_rn(__fmul_rn((float)count, fp), pp));
    return x;
}

/* Each row's penalty entries (distinct ids) change their logits in place; the values before go to pen_raw. The
 * host sampler's operations, each rounded on its own (no contraction into a fused multiply-add). A row with
 * pen_src >= 0 (a pipelined step) also has the id the previous pass drew in that row (prev_ids[pen_src]) at the
 * end of its history: counted once more when presence or frequency penalties apply, and in the repeat window
 * when the repeat penalty applies; applied with its entry, or alone when no entry holds it (its value before then
 * goes to the row's work). */
__global__ void __launch_bounds__(kPenThreads) penalty_kernel_v1(float *logits, int V,
                                                                 const tm_cuda_sample_extra *params,
                                                                 const tm_cuda_sample_pen *pen, float *pen_raw,
                                                                 const int32_t *prev_ids, RowWork *work,
                                                                 bool lp) {
    __shared__ int hit;
    const int rowi = (int)blockIdx.x;
    const tm_cuda_sample_extra *p = params + rowi;
    const int first = p->pen_first, n = p->pen_n;
    const float rp = p->repeat_penalty, pp = p->presence_penalty, fp = p->frequency_penalty;
    const bool pf = pp != 0.0f || fp != 0.0f, rep = rp != 1.0f;
    float *row = logits + (size_t)rowi * (size_t)V;
    int t = -1;
    if (p->pen_src >= 0) {
        t = prev_ids[p->pen_src];
        if (t < 0 || t >= V || (!pf && !rep)) t = -1;
    }
    if (t >= 0) {
        if (threadIdx.x == 0) hit = -1;
        __syncthreads();
        for (int j = (int)threadIdx.x; j < n; j += kPenThreads)
            if (pen[first + j].id == t) hit = j; /* ids are distinct within a row: one writer */
        __syncthreads();
    }
    for (int j = (int)threadIdx.x; j < n; j += kPenThreads) {
        const tm_cuda_sample_pen e = pen[first + j];
        if (e.id < 0 || e.id >= V) continue;
        const bool mine = t >= 0 && j == hit;
        const float x = row[e.id];
        pen_raw[first + j] = x;
        row[e.id] = pen_apply(x, rp, pp, fp, e.count + (mine && pf), e.in_window || (mine && rep));
    }
    if (t >= 0 && threadIdx.x == 0 && hit < 0) {
        const float x = row[t];
        if (lp) {
            work[rowi].t_raw = x;
            work[rowi].t = t;
        }
        row[t] = pen_apply(x, rp, pp, fp, pf ? 1 : 0, rep);
    }
}

/* rows with n_top > 0: the drawn id's log-softmax before the penalties (its value from pen_raw when an entry
 * touched it, from the row's work when it is the in-flight id penalised alone) */
__global__ void __launch_bounds__(kPenThreads) logprob_chosen_kernel_v1(const float *logits, int V,
                                                                        const tm_cuda_sample_extra *params,
                                                                        const tm_cuda_sample_pen *pen,
                                                                        const float *pen_raw, const int32_t *ids,
                                                                        const RowWork *work,
                                                                        tm_cuda_sample_lp *out_lp) {
    __shared__ float raw;
    __shared__ int found;
    const int rowi = (int)blockIdx.x;
    const tm_cuda_sample_extra *p = params + rowi;
    if (p->n_top <= 0) return;
    const int id = ids[rowi], first = p->pen_first, n = p->pen_n;
    if (threadIdx.x == 0) found = 0;
    __syncthreads();
    for (int j = (int)threadIdx.x; j < n; j += kPenThreads)
        if (pen[first + j].id == id) { /* ids are distinct within a row: one writer */
            raw = pen_raw[first + j];
            found = 1;
        }
    __syncthreads();
    if (threadIdx.x == 0) {
        const RowWork w = work[rowi];
        const float x = found ? raw : id == w.t ? w.t_raw : logits[(size_t)rowi * (size_t)V + (size_t)id];
        out_lp[rowi].chosen = w.m == -INFINITY ? -w.log_s : (x - w.m) - w.log_s;
    }
}

/* grid = n_rows * cl blocks of kThreads, as clusters of cl blocks when cl > 1; cudaErrorNotSupported (nothing
 * launched) when such clusters cannot be resident, so that the caller falls back instead of failing a launch
 * (which would also spoil a graph capture) */
template <class... P, class... A>
cudaError_t launch_group(void (*kernel)(P...), int cl, int32_t n_rows, size_t smem, cudaStream_t stream, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)n_rows * (unsigned)cl);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cl;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cl > 1) {
        int n_clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&n_clusters, kernel, &cfg) != cudaSuccess || n_clusters < 1) {
            cudaGetLastError();
            return cudaErrorNotSupported;
        }
    }
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* blocks per row: TM_CUDA_<KERNEL>_CLUSTER=N forces N; else a cluster of up to 8 when the rows leave SMs idle
 * and the rows are long enough to share (1 when `single`) */
int blocks_per_row(int32_t n_rows, int32_t vocab, const char *force_env, bool single) {
    const char *force = getenv(force_env);
    if (force && *force) return atoi(force);
    if (single || vocab < 8 * kThreads) return 1;
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    return n_rows * 8 <= sms ? 8 : n_rows * 4 <= sms ? 4 : n_rows * 2 <= sms ? 2 : 1;
}

bool env_is(const char *name, const char *value) {
    const char *s = getenv(name);
    return s && !strcmp(s, value);
}

bool row_vec(const float *logits, int32_t vocab) { return vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0; }

} // namespace

extern "C" cudaError_t tm_cuda_argmax(const float *logits, int32_t n_rows, int32_t vocab, int32_t *out_ids,
                                      cudaStream_t stream) {
    if (n_rows < 0 || vocab <= 0 || !logits || !out_ids) return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    const bool vec = row_vec(logits, vocab);
    const int cl = blocks_per_row(n_rows, vocab, "TM_CUDA_ARGMAX_CLUSTER", env_is("TM_CUDA_ARGMAX_V", "1"));
    cudaError_t e = cudaErrorNotSupported;
    const size_t smem = (kWarps + kMaxCluster) * sizeof(Best);
    if (cl == 8) e = launch_group(argmax_kernel_v2<8>, 8, n_rows, smem, stream, logits, (int)vocab, vec, out_ids);
    if (cl == 4) e = launch_group(argmax_kernel_v2<4>, 4, n_rows, smem, stream, logits, (int)vocab, vec, out_ids);
    if (cl == 2) e = launch_group(argmax_kernel_v2<2>, 2, n_rows, smem, stream, logits, (int)vocab, vec, out_ids);
    if (e == cudaErrorNotSupported) /* one block per row */
        argmax_kernel_v1<<<(unsigned)n_rows, kThreads, 0, stream>>>(logits, vocab, vec, out_ids);
    else if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

extern "C" size_t tm_cuda_sample_work_bytes(int32_t n_rows, int32_t vocab) {
    (void)vocab;
    return (size_t)(n_rows > 0 ? n_rows : 0) * sizeof(RowWork);
}

extern "C" cudaError_t tm_cuda_sample(const float *logits, int32_t n_rows, int32_t vocab,
                                      const tm_cuda_sample_params *params, void *work, int32_t *out_ids,
                                      float *out_logprob, cudaStream_t stream) {
    (void)work;
    if (n_rows < 0 || vocab <= 0 || !logits || !params || !out_ids) return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    const bool vec = row_vec(logits, vocab);
    if (env_is("TM_CUDA_SAMPLE_V", "1")) {
        sample_kernel_v1<<<(unsigned)n_rows, kThreads, 0, stream>>>(logits, vocab, vec, params, out_ids, out_logprob);
        return cudaGetLastError();
    }
    const int cl = blocks_per_row(n_rows, vocab, "TM_CUDA_SAMPLE_CLUSTER", env_is("TM_CUDA_SAMPLE_V", "2"));
    cudaError_t e = cudaErrorNotSupported;
    const size_t smem = sizeof(SampleSmem);
    if (cl == 8)
        e = launch_group(sample_kernel_v2<8>, 8, n_rows, smem, stream, logits, (int)vocab, vec, params, out_ids,
                         out_logprob);
    if (cl == 4)
        e = launch_group(sample_kernel_v2<4>, 4, n_rows, smem, stream, logits, (int)vocab, vec, params, out_ids,
                         out_logprob);
    if (cl == 2)
        e = launch_group(sample_kernel_v2<2>, 2, n_rows, smem, stream, logits, (int)vocab, vec, params, out_ids,
                         out_logprob);
    if (e == cudaErrorNotSupported) /* one block per row */
        sample_kernel_v2<1><<<(unsigned)n_rows, kThreads, sizeof(SampleSmem), stream>>>(logits, vocab, vec, params,
                                                                                       out_ids, out_logprob);
    else if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_sample_prepare(float *logits, int32_t n_rows, int32_t vocab,
                                              const tm_cuda_sample_extra *params, const tm_cuda_sample_pen *pen,
                                              int32_t n_pen, float *pen_raw, bool want_pen, const int32_t *prev_ids,
                                              bool want_lp, void *work, tm_cuda_sample_lp *out_lp,
                                              cudaStream_t stream) {
    if (n_rows < 0 || vocab <= 0 || n_pen < 0 || !logits || !params || (n_pen > 0 && (!pen || !pen_raw)) ||
        (want_pen && !prev_ids) || (want_lp && (!work || !out_lp)))
        return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    RowWork *rw = (RowWork *)work;
    if (want_lp) {
        const bool vec = row_vec(logits, vocab);
        const int cl = blocks_per_row(n_rows, vocab, "TM_CUDA_LOGPROBS_CLUSTER", false);
        const size_t smem = sizeof(SampleSmem);
        const float *x = logits;
        cudaError_t e = cudaErrorNotSupported;
        if (cl == 8)
            e = launch_group(logprobs_kernel_v1<8>, 8, n_rows, smem, stream, x, (int)vocab, vec, params, rw, out_lp);
        if (cl == 4)
            e = launch_group(logprobs_kernel_v1<4>, 4, n_rows, smem, stream, x, (int)vocab, vec, params, rw, out_lp);
        if (cl == 2)
            e = launch_group(logprobs_kernel_v1<2>, 2, n_rows, smem, stream, x, (int)vocab, vec, params, rw, out_lp);
        if (e == cudaErrorNotSupported) /* one block per row */
            e = launch_group(logprobs_kernel_v1<1>, 1, n_rows, smem, stream, x, (int)vocab, vec, params, rw, out_lp);
        if (e != cudaSuccess) return e;
    }
    if (want_pen)
        penalty_kernel_v1<<<(unsigned)n_rows, kPenThreads, 0, stream>>>(logits, vocab, params, pen, pen_raw, prev_ids,
                                                                       rw, want_lp);
    return cudaGetLastError();
}

extern "C" cudaError_t tm_cuda_sample_finish(const float *logits, int32_t n_rows, int32_t vocab,
                                             const tm_cuda_sample_extra *params, const tm_cuda_sample_pen *pen,
                                             const float *pen_raw, const int32_t *ids, const void *work,
                                             tm_cuda_sample_lp *out_lp, cudaStream_t stream) {
    if (n_rows < 0 || vocab <= 0 || !logits || !params || !ids || !work || !out_lp) return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    logprob_chosen_kernel_v1<<<(unsigned)n_rows, kPenThreads, 0, stream>>>(logits, vocab, params, pen, pen_raw, ids,
                                                                         (const RowWork *)work, out_lp);
    return cudaGetLastError();
}
