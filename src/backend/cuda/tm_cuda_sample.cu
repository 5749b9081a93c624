/* tm_cuda_sample.cu -- argmax and sampling (temperature, top-k, top-p, min-p) on the device, one block per row. */
#include "backend/cuda/tm_cuda_kernels.h"

#include <math.h>
#include <stdlib.h>

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
 * run over that list instead of the row. The first top-k histogram is built in the same pass as the row's
 * max / log-sum-exp.
 * v1 (simple): each threshold is built bit by bit from the top (keep bit b when the count / mass of the keys
 * >= the candidate is still enough), one block-wide reduction over the row per bit; ~50 passes per threshold.
 * Both versions select the same keys and draw the same token. TM_CUDA_SAMPLE_V=1 forces v1.
 * The logprob is (x - max) - log(sum exp(x - max)) at T = 1, from the same first pass. A row that is all -inf
 * gives id 0 and logprob -log(vocab) (as the CPU sampler); logits must not be NaN or +inf. */

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 2;       /* float4 loads in flight per thread in a row walk (64 registers at 1024 threads) */
constexpr int kMaxBins = 2048;   /* 11-bit digits */
constexpr int kListCap = 2048;   /* top-k sets up to this size are kept in shared memory */
constexpr float kFix = 1099511627776.0f; /* 2^40: W = round(w * 2^40) */

/* ---- keys, weights, random numbers ---- */

__device__ __forceinline__ uint32_t xkey(float x) {
    const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float xkey_inv(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }
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
};

template <int U = kUnroll, class F>
__device__ __forceinline__ void for_each(const RowSrc &s, F &&f) {
    if (s.vec) {
        const float4 *r4 = reinterpret_cast<const float4 *>(s.row);
        const int n4 = s.V >> 2;
        int c = (int)threadIdx.x;
        for (; c + (U - 1) * kThreads < n4; c += U * kThreads) { /* U loads in flight */
            float4 x[U];
#pragma unroll
            for (int u = 0; u < U; u++) x[u] = __ldg(r4 + c + u * kThreads);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = 4 * (c + u * kThreads);
                f(i, x[u].x);
                f(i + 1, x[u].y);
                f(i + 2, x[u].z);
                f(i + 3, x[u].w);
            }
        }
        for (; c < n4; c += kThreads) {
            const float4 x = __ldg(r4 + c);
            f(4 * c, x.x);
            f(4 * c + 1, x.y);
            f(4 * c + 2, x.z);
            f(4 * c + 3, x.w);
        }
        const int i = (n4 << 2) + (int)threadIdx.x;
        if (i < s.V) f(i, __ldg(s.row + i));
    } else {
        for (int i = (int)threadIdx.x; i < s.V; i += kThreads) f(i, __ldg(s.row + i));
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
    const RowSrc src = {logits + (size_t)blockIdx.x * (size_t)V, V, vec};
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
    int bin;
    uint64_t cum;
    int list_n;
};

enum SelMode { SEL_COUNT, SEL_TOPP, SEL_DRAW };

/* histogram of digit (shift, width) over the candidates: keys matching prefix on mask, in the filter */
template <bool MASS, class Src>
__device__ void hist_pass(const Src &src, uint64_t prefix, uint64_t mask, const Filter &flt, int shift, int width,
                          SampleSmem &sm) {
    __syncthreads(); /* the previous step's readers are done */
    for (int j = (int)threadIdx.x; j < (1 << width); j += kThreads) {
        sm.cnt[j] = 0;
        if (MASS) sm.mass[j] = 0;
    }
    __syncthreads();
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
}

/* The bin d, from the top, with cum(d) < target <= cum(d) + val(d), cum(d) = sum of the bins above d, into
 * sm.bin / sm.cum. With derive, target is computed from the total first (mode TOPP: ceil(p * total); DRAW:
 * floor(u * total) + 1 with u = r / 2^64). Returns the target used. */
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

/* v2 selection. COUNT: the key of rank `target` (>= 1) from the top, exits when the rest of the bin is taken.
 * TOPP / DRAW: the smallest top set whose mass reaches the target (derived in the first step). On return, the
 * selected set is {key >= *prefix} among the candidates, and for DRAW the selected element is the only candidate
 * with (key & *mask) == *prefix. hist_ready: the first histogram is already in sm (COUNT only). */
template <SelMode MODE, class Src>
__device__ void select_v2(const Src &src, const Filter &flt, int nb, uint64_t target, float p, uint64_t r,
                          bool hist_ready, SampleSmem &sm, uint64_t *prefix_out, uint64_t *mask_out) {
    constexpr bool MASS = MODE != SEL_COUNT;
    uint64_t prefix = 0, mask = 0;
    int shift, width;
    for (int step = 0; digit(step, nb, &shift, &width); step++) {
        if (!(step == 0 && hist_ready)) hist_pass<MASS>(src, prefix, mask, flt, shift, width, sm);
        target = find_bin<MASS>(width, target, MODE, MASS && step == 0, p, r, sm);
        const int d = sm.bin;
        target -= sm.cum;
        prefix |= (uint64_t)d << shift;
        mask = mask_above(shift);
        const uint32_t c = sm.cnt[d];
        const uint64_t w = MASS ? (uint64_t)sm.mass[d] : 0;
        if (MODE == SEL_COUNT ? c == target : MODE == SEL_TOPP ? (c == 1 || w == target) : c == 1) break;
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

/* the one candidate with (key & mask) == prefix writes the outputs */
template <class Src>
__device__ void emit_drawn(const Src &src, const Filter &flt, uint64_t prefix, uint64_t mask, float lse_m,
                           float lse_log_s, int32_t *out_id, float *out_lp) {
    const int V = src.V;
    for_each(src, [&](int i, float x) {
        const uint64_t key = key_of(x, i, V);
        if ((key & mask) != prefix || key < flt.floor) return;
        if (flt.minp > 0.0f && !(weight(flt, x) >= flt.minp)) return;
        *out_id = i;
        if (out_lp) *out_lp = (x - lse_m) - lse_log_s;
    });
}

template <int VER>
__global__ void __launch_bounds__(kThreads) sample_kernel(const float *logits, int V, bool vec,
                                                          const tm_cuda_sample_params *params, int32_t *out_ids,
                                                          float *out_logprob) {
    __shared__ SampleSmem sm;
    const int rowi = (int)blockIdx.x;
    const RowSrc src = {logits + (size_t)rowi * (size_t)V, V, vec};
    const tm_cuda_sample_params prm = params[rowi];
    const bool greedy = !(prm.temperature > 0.0f);
    const bool topk = !greedy && prm.top_k > 0 && prm.top_k < V;
    const int nb = V > 1 ? 32 - __clz(V - 1) : 0; /* significant bits of the id word */
    int32_t *out_id = out_ids + rowi;
    float *out_lp = out_logprob ? out_logprob + rowi : nullptr;

    /* pass 1: max, sum exp(x - max), argmax; (v2, top-k) the first count histogram too */
    const bool hist0 = VER == 2 && topk;
    if (hist0) {
        for (int j = (int)threadIdx.x; j < kMaxBins; j += kThreads) sm.cnt[j] = 0;
        __syncthreads();
    }
    Stats st = {-INFINITY, 0.0f, -1};
    for_each(src, [&](int i, float x) {
        stats_push(st, i, x);
        if (hist0) atomicAdd(&sm.cnt[xkey(x) >> 21], 1u); /* digit 0: key bits 53..63 */
    });
    st = block_stats(st, sm.stats);
    const float log_s = logf(st.s);
    if (st.m == -INFINITY) { /* every logit -inf */
        if (threadIdx.x == 0) {
            *out_id = 0;
            if (out_lp) *out_lp = -logf((float)V);
        }
        return;
    }
    if (greedy) {
        if (threadIdx.x == 0) {
            *out_id = st.a;
            if (out_lp) *out_lp = -log_s;
        }
        return;
    }

    Filter flt = {0, st.m, prm.temperature, 0.0f};
    const uint64_t r = rand64(prm.seed, prm.offset);
    uint64_t prefix, mask;
    if (VER == 1) {
        if (topk) flt.floor = select_v1<SEL_COUNT>(src, flt, nb, (uint64_t)prm.top_k, 0.0f, 0, sm);
        if (prm.top_p < 1.0f) {
            const uint64_t kp = select_v1<SEL_TOPP>(src, flt, nb, 0, prm.top_p, 0, sm);
            flt.floor = kp > flt.floor ? kp : flt.floor;
        }
        flt.minp = prm.min_p > 0.0f ? fminf(prm.min_p, 1.0f) : 0.0f;
        prefix = select_v1<SEL_DRAW>(src, flt, nb, 0, 0.0f, r, sm);
        emit_drawn(src, flt, prefix, ~0ull, st.m, log_s, out_id, out_lp);
        return;
    }

    bool listed = false;
    if (topk) {
        select_v2<SEL_COUNT>(src, flt, nb, (uint64_t)prm.top_k, 0.0f, 0, true, sm, &prefix, &mask);
        flt.floor = prefix; /* exactly top_k keys are >= prefix */
        if (prm.top_k <= kListCap) {
            if (threadIdx.x == 0) sm.list_n = 0;
            __syncthreads();
            for_each(src, [&](int i, float x) {
                const uint64_t key = key_of(x, i, V);
                if (key >= flt.floor) {
                    const int j = atomicAdd(&sm.list_n, 1);
                    if (j < kListCap) sm.list[j] = key; /* exactly top_k <= kListCap keys pass */
                }
            });
            __syncthreads();
            listed = true;
        }
    }
    const ListSrc lsrc = {sm.list, listed ? sm.list_n : 0, V};
    if (prm.top_p < 1.0f) {
        if (listed)
            select_v2<SEL_TOPP>(lsrc, flt, nb, 0, prm.top_p, 0, false, sm, &prefix, &mask);
        else
            select_v2<SEL_TOPP>(src, flt, nb, 0, prm.top_p, 0, false, sm, &prefix, &mask);
        flt.floor = prefix > flt.floor ? prefix : flt.floor;
    }
    flt.minp = prm.min_p > 0.0f ? fminf(prm.min_p, 1.0f) : 0.0f;
    if (listed) {
        select_v2<SEL_DRAW>(lsrc, flt, nb, 0, 0.0f, r, false, sm, &prefix, &mask);
        emit_drawn(lsrc, flt, prefix, mask, st.m, log_s, out_id, out_lp);
    } else {
        select_v2<SEL_DRAW>(src, flt, nb, 0, 0.0f, r, false, sm, &prefix, &mask);
        emit_drawn(src, flt, prefix, mask, st.m, log_s, out_id, out_lp);
    }
}

bool row_vec(const float *logits, int32_t vocab) { return vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0; }

} // namespace

extern "C" cudaError_t tm_cuda_argmax(const float *logits, int32_t n_rows, int32_t vocab, int32_t *out_ids,
                                      cudaStream_t stream) {
    if (n_rows < 0 || vocab <= 0 || !logits || !out_ids) return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    argmax_kernel_v1<<<(unsigned)n_rows, kThreads, 0, stream>>>(logits, vocab, row_vec(logits, vocab), out_ids);
    return cudaGetLastError();
}

extern "C" size_t tm_cuda_sample_work_bytes(int32_t n_rows, int32_t vocab) {
    (void)n_rows;
    (void)vocab;
    return 0; /* one block per row, everything in shared memory: work may be NULL */
}

extern "C" cudaError_t tm_cuda_sample(const float *logits, int32_t n_rows, int32_t vocab,
                                      const tm_cuda_sample_params *params, void *work, int32_t *out_ids,
                                      float *out_logprob, cudaStream_t stream) {
    (void)work;
    if (n_rows < 0 || vocab <= 0 || !logits || !params || !out_ids) return cudaErrorInvalidValue;
    if (n_rows == 0) return cudaSuccess;
    const char *env = getenv("TM_CUDA_SAMPLE_V");
    const bool vec = row_vec(logits, vocab);
    if (env && env[0] == '1' && env[1] == '\0')
        sample_kernel<1><<<(unsigned)n_rows, kThreads, 0, stream>>>(logits, vocab, vec, params, out_ids, out_logprob);
    else
        sample_kernel<2><<<(unsigned)n_rows, kThreads, 0, stream>>>(logits, vocab, vec, params, out_ids, out_logprob);
    return cudaGetLastError();
}
