/* tm_cuda_layer.cu -- one decoder layer for one token as a single persistent kernel (batch-1 decode). */
#include "tm_cuda_bf16.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

/* Why one kernel. At batch 1 a layer is five weight streams (QKV, o, gate+up, down) with small steps between
 * them (two norms, RoPE, attention). As separate kernels each stream starts from an empty memory pipeline and
 * ends in a tail, and the small steps sit on the critical path with the pipeline idle: the 1B shape runs at 67% of
 * its bandwidth floor that way. Here one block per SM runs the whole layer, and the weights, which no step
 * depends on, never wait for the data: a producer warp streams the block's rows of all four matrices, in the
 * order they are needed, through a ring of shared-memory stages (cp.async.bulk, completion counted on an
 * mbarrier per stage), while the consumer warps work through the phases. When the consumers stop at a grid
 * barrier or in attention, the producer keeps loading up to the ring's size (6 x 32 KB per SM, ~25 MB over the
 * GPU), so the memory pipe stays busy across the phase boundaries.
 *
 * Status: correct (tb_layer), and opt-in (TM_CUDA_LAYER=1), because it is not yet faster than the op path: 64 us
 * per 1B layer and 138 us per 8B layer in a chain of launches (seventeenth session), against ~44.5 and ~120 us for
 * the separate kernels. tb_layer's trace of block 0 shows where: the four weight streams take about their bytes' time
 * (1B: 32 of the 28.8 us floor), but the steps between them (the norms ~2 us, each barrier 1.5-6 us, attention ~3,
 * loaded memory latency being 1-2 us) add up to ~28 us a layer, more than the ring (~6 us of streaming) hides: the
 * producer waits on a full ring for half the layer. Prefetching stages into L2 beyond the ring made the streams
 * slower (docs/PERFORMANCE.md). What was learned on the way, kept in the code's comments below: the instruction
 * cache (code run once per phase is fetched from L2), claim latency in the producer, and the balance of the phases
 * across SMs.
 *
 * Phases (consumer warps; the producer's order is the same list of stages):
 *   A  the norm of x, computed by every block from L2 (dim floats; the sum of squares per thread, warp butterfly,
 *      across warps in order) into xs (bf16, shared memory); the block's QKV rows: a stage holds R consecutive
 *      rows of wq, wk or wv (R even, so the stage holds whole RoPE pairs); epilogue as tm_cuda_gemv_qkv_rope.
 *   B  attention, grid barrier 1 inside (see attend): (kv head, split) items, S = min(16, grid / n_kv_heads,
 *      ceil(ctx / 32)) splits; each item's (max, sum, acc) per q head to the work buffer; the last item of a kv
 *      head to finish merges that head's splits into att.
 *   -- grid barrier 2 --
 *   C  att into xs; the block's o rows; x[r] += bf16(sum).
 *   -- grid barrier 3 --
 *   D  the norm of x into xs; a stage holds R gate rows then the same R up rows; h[r] = bf16(silu(g) * u).
 *   -- grid barrier 4 --
 *   E  h into xs; the block's down rows; x[r] += bf16(sum).
 * Within a stage of NR weight rows (NR in 1, 2, 4, 8) warp w takes row w % NR and the (w / NR)-th of 8 / NR
 * column slices; lane l the 16-byte chunks l, l + 32, ... of its slice; the warps leave their sums in shared
 * memory and the epilogue adds them in slice order after the phase's last stage. Which units (stages) a block
 * takes: see produce.
 *
 * Memory ordering: everything a phase reads that another block wrote in this kernel (x, q, att, h, the new cache
 * entry, the attention partials) is read through L2 (ld.global.cg), never through L1 or the read-only path; the
 * grid barrier is a counter (fence, atomicAdd, then acquire loads until it reaches k * gridDim). The counters are
 * reset by the last block to exit. Under programmatic dependent launch the consumers wait for the previous
 * kernel before their first read; the producer does not wait (it reads weights only), so the next layer's first
 * stages load while this layer's last blocks finish. The dependents are triggered after barrier 1, when every
 * block of this grid is resident: a grid launched behind this one can then never take an SM this grid still
 * needs, which would deadlock the barriers. The grid is one block per SM (checked by occupancy). */

namespace {

constexpr int kCW = 8;                   /* consumer warps */
constexpr int kConsumers = kCW * 32;     /* consumer threads 0 .. 255; warp 8 is the producer */
constexpr int kThreads = kConsumers + 32;
constexpr int kStageBytes = 32768;
constexpr int kMaxStages = 8;
constexpr int kMaxSplits = 16;
constexpr int kWorkHeader = 256;         /* the counters (work_hdr), then the attention partials */
constexpr int kMaxKV = 32;               /* kv heads the split counters cover */

struct work_hdr {
    unsigned int bar;                    /* grid barrier arrivals in this launch */
    unsigned int exit;                   /* blocks done */
    unsigned int error;                  /* a barrier wait gave up (never expected: the grid is co-resident) */
    unsigned int pad;
    unsigned int next[2][4];             /* [launch parity][phase] units claimed so far (tm_cuda_layer_args) */
    unsigned int att_done[kMaxKV];       /* splits of a kv head done (the last one merges, then resets it) */
};
static_assert(sizeof(work_hdr) <= kWorkHeader, "work header");

/* per-phase geometry (A, C, D, E), fixed per model */
struct lay_plan {
    int rows[4];   /* weight rows per stage (D: gate rows; the stage holds as many up rows after them) */
    int units[4];  /* stages of the phase over the whole grid */
    int cols[4];   /* row length of the phase's weights, elements */
    int nst;       /* stages in the ring */
    int xoff;      /* byte offset of xs in dynamic shared memory */
    int poff;      /* byte offset of part (cap, kCW) floats, then ulist (cap) ints */
    int cap;       /* most stages of a phase one block may claim */
    int claims;    /* 1: the tail of the large phases is claimed; 0: fixed contiguous ranges (TM_CUDA_LAYER_CLAIMS=0) */
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
/* wait for the phase of parity `parity` to complete, sleeping briefly between tries (the producer waits most of
 * the time; sleeping instead of spinning measured neither faster nor slower) */
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    const uint32_t a = smem_u32(b);
    for (;;) {
        uint32_t done;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
        if (done) return;
        __nanosleep(40);
    }
}
/* bytes (multiple of 16, both ends 16-byte aligned) from global src to shared dst; completion counted on bar */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
/* the 256 consumer threads (named barrier 1; the producer warp never joins it) */
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* every consumer thread of every block: returns once all blocks have arrived k times in this launch */
__device__ __noinline__ void grid_sync(work_hdr *wh, unsigned k) {
    consumers_sync(); /* the block's writes of this phase are issued */
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(&wh->bar, 1u);
        const unsigned target = k * gridDim.x;
        unsigned spins = 0;
        while (ld_acquire(&wh->bar) < target) {
            __nanosleep(++spins > 64u ? 100 : 20);
            if (spins > (1u << 26)) { /* seconds: a block that never ran; give up rather than hang */
                atomicExch(&wh->error, 1u);
                break;
            }
        }
        __threadfence();
    }
    consumers_sync();
}

/* (cos, sin) of the f32 angle pos * inv_freq, as tm_cuda_rope.cu and the QKV GEMV's epilogue compute it */
__device__ __noinline__ float2 rope_cs(int32_t pos, float inv_freq) {
    const float th = __fmul_rn((float)pos, inv_freq);
    double sn, cs;
    sincospi((double)th * 0.318309886183790671537767526745, &sn, &cs);
    return make_float2((float)cs, (float)sn);
}

/* xs (dim bf16) = bf16(x * (1 / rms(x)) * w), x read through L2 once (dim <= 4 * kNormVec * kConsumers: the
 * launcher checks) */
constexpr int kNormVec = 4;
__device__ __noinline__ void norm_to_smem(const float *x, const float *w, int dim, float eps, uint16_t *xs,
                                          float *red) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, n4 = dim >> 2;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float4 v[kNormVec];
#pragma unroll
    for (int k = 0; k < kNormVec; k++)
        if (tid + k * kConsumers < n4) v[k] = __ldcg(x4 + tid + k * kConsumers);
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormVec; k++) {
        if (tid + k * kConsumers < n4) {
            ss += v[k].x * v[k].x;
            ss += v[k].y * v[k].y;
            ss += v[k].z * v[k].z;
            ss += v[k].w * v[k].w;
        }
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    consumers_sync();
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < kCW; k++) t += red[k];
    const float r = 1.0f / sqrtf(t / (float)dim + eps);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    uint2 *o = reinterpret_cast<uint2 *>(xs);
#pragma unroll
    for (int k = 0; k < kNormVec; k++) {
        const int i = tid + k * kConsumers;
        if (i < n4) {
            const float4 g = __ldg(w4 + i);
            o[i] = make_uint2(tmbf::pack_bf16x2(v[k].x * r * g.x, v[k].y * r * g.y),
                              tmbf::pack_bf16x2(v[k].z * r * g.z, v[k].w * r * g.w));
        }
    }
    consumers_sync(); /* xs complete; red free again */
}

/* xs (n bf16, n % 8 == 0) = src, read through L2 */
__device__ __noinline__ void copy_to_smem(const uint16_t *src, int n, uint16_t *xs) {
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
    uint4 *d4 = reinterpret_cast<uint4 *>(xs);
    for (int i = threadIdx.x; i < (n >> 3); i += kConsumers) d4[i] = __ldcg(s4 + i);
    consumers_sync();
}

__device__ __forceinline__ void dot8(uint4 w, uint4 x, float &a0, float &a1) {
    float wf[8], xf[8];
    tmbf::unpack_bf16x8(w, wf);
    tmbf::unpack_bf16x8(x, xf);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        a0 = fmaf(wf[j], xf[j], a0);
        a1 = fmaf(wf[j + 1], xf[j + 1], a1);
    }
}

/* sum over the lane's chunks c0 + lane + 32 i < c1 of dot(w chunk, x chunk), x from shared memory (holding a
 * lane's x chunks in registers for the whole phase measured the same) */
__device__ __forceinline__ float slice_dot(const uint16_t *w, const uint16_t *xs, int c0, int c1, int lane) {
    const uint4 *w4 = reinterpret_cast<const uint4 *>(w), *x4 = reinterpret_cast<const uint4 *>(xs);
    float a0 = 0.0f, a1 = 0.0f;
#pragma unroll 4
    for (int c = c0 + lane; c < c1; c += 32) dot8(w4[c], x4[c], a0, a1);
    return a0 + a1;
}

/* test beds: block 0's clock at point k (a.trace, see tm_cuda_kernels.h) */
__device__ __forceinline__ void stamp(const tm_cuda_layer_args &a, int k) {
    if (a.trace && blockIdx.x == 0) a.trace[k] = clock64();
}
/* test beds: this block's global time at point k (a.btrace; the caller is one thread of the block) */
__device__ __forceinline__ void bstamp(const tm_cuda_layer_args &a, int k) {
    if (!a.btrace) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    a.btrace[(size_t)blockIdx.x * TM_CUDA_LAYER_BTRACE + k] = (long long)t;
}
/* both: block 0's clock at point k of a.trace, this block's time at point kb of a.btrace */
__device__ __forceinline__ void stamp2(const tm_cuda_layer_args &a, int k, int kb) {
    stamp(a, k);
    bstamp(a, kb);
}

/* The producer: lane 0 of warp kCW streams the block's units of each phase through the ring. Three quarters of a
 * phase's units are dealt out in a fixed way (block b: units b, b + grid, ...); the rest are claimed one at a time
 * (an atomicAdd on the launch parity's phase counter), so that the SMs whose share of the memory bandwidth is larger
 * take more of the tail (a fixed split waited up to 14 us per layer at the barriers for the slowest SM; claiming
 * every unit put an atomic round trip in front of every stage). The first claim is issued when the phase starts,
 * so that its latency hides behind the fixed units. unit_of[stage] tells the consumers which unit a stage holds,
 * -1 for the end of the block's share of a phase (a stage without data, its full barrier completed by a plain
 * arrive). A block takes at most p.cap units of a phase (its part array; cap * grid >= units). */
__device__ __noinline__ void produce(const tm_cuda_layer_args &a, const lay_plan &p, uint8_t *smem, uint64_t *full,
                                     uint64_t *empty, int *unit_of) {
    const int64_t qd = (int64_t)a.n_heads * a.head_dim, kvd = (int64_t)a.n_kv_heads * a.head_dim;
    const int G = (int)gridDim.x, bid = (int)blockIdx.x;
    unsigned *next = reinterpret_cast<work_hdr *>(a.work)->next[a.parity & 1];
    int it = 0;
    long long stall = 0;
    stamp(a, 16);
    for (int ph = 0; ph < 4; ph++) {
        const int R = p.rows[ph], units = p.units[ph];
        /* fixed units per block: all of them for the small phases, whose share of a block (a few stages) is below
         * the ring's depth, so that claims made while prefetching would pile up on the first blocks to start */
        const bool all_fixed = units < 8 * G || !p.claims;
        const int fixed = all_fixed ? (units - bid + G - 1) / G : units * 3 / 4 / G;
        /* without claims (TM_CUDA_LAYER_CLAIMS=0, for comparison) the block's units are one contiguous range */
        const int first = (int)((int64_t)bid * units / G), count = (int)((int64_t)(bid + 1) * units / G) - first;
        const int cap = (units + G - 1) / G + 2; /* a block's units of the phase, at most */
        const unsigned bytes = (unsigned)R * (unsigned)p.cols[ph] * 2u; /* one matrix's rows of the stage */
        int claim = all_fixed ? INT_MAX : fixed * G + (int)atomicAdd(&next[ph], 1u);
        for (int n = 0;; n++, it++) {
            int cur = -1;
            if (!p.claims) {
                if (n < count) cur = first + n;
            } else if (n < fixed) {
                cur = n * G + bid;
            } else if (claim < units && n < cap) {
                cur = claim;
                claim = n + 1 < cap ? fixed * G + (int)atomicAdd(&next[ph], 1u) : INT_MAX;
            }
            const int s = it % p.nst, k = it / p.nst;
            if (k > 0) {
                const long long t0 = a.trace ? clock64() : 0;
                mbar_wait(&empty[s], (unsigned)(k - 1) & 1u);
                if (a.trace) stall += clock64() - t0;
            }
            unit_of[s] = cur;
            if (cur < 0) { /* the end of the phase: a stage without data */
                mbar_arrive(&full[s]);
                it++;
                break;
            }
            uint8_t *dst = smem + (size_t)s * kStageBytes;
            const int64_t r = (int64_t)cur * R;
            if (ph == 2) {
                mbar_expect_tx(&full[s], 2u * bytes);
                bulk_load(dst, a.w_gate + r * p.cols[2], bytes, &full[s]);
                bulk_load(dst + bytes, a.w_up + r * p.cols[2], bytes, &full[s]);
                continue;
            }
            const uint16_t *src = ph == 1   ? a.wo + r * p.cols[1]
                                  : ph == 3 ? a.w_down + r * p.cols[3]
                                  : r < qd  ? a.wq + r * a.dim
                                  : r < qd + kvd ? a.wk + (r - qd) * a.dim
                                                 : a.wv + (r - qd - kvd) * a.dim;
            mbar_expect_tx(&full[s], bytes);
            bulk_load(dst, src, bytes, &full[s]);
        }
    }
    stamp(a, 17);
    if (a.trace && blockIdx.x == 0) a.trace[18] = stall;
}

/* Phase A's epilogue, thread t < R / 2 of unit u: rows r0 = u * R + 2t and r0 + 1 (a RoPE pair) of the
 * concatenated q, k, v; rounded to bf16 as tm_cuda_gemv stores them, q and k rotated, q stored, k and v written
 * to the token's cache slot. */
__device__ __noinline__ void epi_qkv(const tm_cuda_layer_args &a, int64_t r0, float s0, float s1, int32_t pos,
                                     int64_t slot) {
    const int64_t hd = a.head_dim, qd = (int64_t)a.n_heads * hd, kvd = (int64_t)a.n_kv_heads * hd;
    const uint16_t o0 = tmbf::to_bf(s0), o1 = tmbf::to_bf(s1);
    const int job = r0 < qd ? 0 : r0 < qd + kvd ? 1 : 2;
    const int64_t rr = job == 0 ? r0 : job == 1 ? r0 - qd : r0 - qd - kvd;
    const int64_t h = rr / hd, d0 = rr - h * hd;
    uint32_t out = (uint32_t)o0 | ((uint32_t)o1 << 16);
    if (job < 2 && d0 < a.rope_dim) {
        const float2 t = rope_cs(pos, __ldg(a.inv_freq + (d0 >> 1)));
        const float x0 = tmbf::bf(o0), x1 = tmbf::bf(o1);
        out = tmbf::pack_bf16x2(x0 * t.x - x1 * t.y, x0 * t.y + x1 * t.x);
    }
    if (job == 0) {
        *reinterpret_cast<uint32_t *>(a.q + r0) = out;
    } else if (slot >= 0) {
        const int64_t blk = slot / a.block_size, off = slot - blk * a.block_size;
        const int64_t at = ((blk * a.n_kv_heads + h) * a.block_size + off) * hd + d0;
        *reinterpret_cast<uint32_t *>((job == 1 ? a.k_cache : a.v_cache) + at) = out;
    }
}

/* A phase's stages; returns n, the block's stages of the phase (`it` counts all the block's stages). Each warp works
 * through the stages on its own (no block barrier per stage): it leaves its slice's sum in part[n][warp] and
 * releases the stage; the stage marked -1 ends the phase; one barrier, then the epilogue takes all the block's rows
 * at once (the residual's read-modify-write costs one L2 round trip per phase, not one per stage). Inlined once per
 * phase (run_phase), while the parts that run once per layer are out-of-line functions: the kernel is far larger
 * than the instruction cache, and code run once per layer is fetched from L2 each time (fully inlined, about 20k
 * instructions, the attention alone took 17 us for 8 tokens per warp; with the stage loop out of line instead, it
 * spilled at the call and ran 1.5-2x slower). */
__device__ __forceinline__ int stage_loop(const tm_cuda_layer_args &a, const lay_plan &p, const uint8_t *smem,
                                       const uint16_t *xs, float *part, int *ulist, const int *unit_of, uint64_t *full,
                                       uint64_t *empty, int *it_io, int NR, int cols) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int nsl = kCW / NR, row = warp % NR, sl = warp / NR, chunks = cols / 8 / nsl;
    int it = *it_io;
    int n = 0;
    for (;; n++, it++) {
        const int s = it % p.nst, k = it / p.nst;
        const long long t0 = a.trace ? clock64() : 0;
        mbar_wait(&full[s], (unsigned)k & 1u);
        if (a.trace && tid == 0 && blockIdx.x == 0) a.trace[19] += clock64() - t0;
        const int u = unit_of[s];
        float v = 0.0f;
        if (u >= 0) {
            const uint16_t *w = reinterpret_cast<const uint16_t *>(smem + (size_t)s * kStageBytes) + (size_t)row * cols;
            v = warp_sum(slice_dot(w, xs, sl * chunks, (sl + 1) * chunks, lane));
        }
        __syncwarp();
        if (lane == 0) {
            if (u >= 0) part[n * kCW + warp] = v;
            mbar_arrive(&empty[s]); /* the warp is done with the stage */
        }
        if (u < 0) {
            it++;
            break;
        }
        if (tid == 0) ulist[n] = u;
    }
    consumers_sync();
    *it_io = it;
    return n;
}

/* The epilogue of phase ph (0 = A, 1 = C, 2 = D, 3 = E) over the block's n stages: row j of the block's rows
 * (j < n * R; D: the gate rows) is row j % R of its stage; warps q * NR + j % R, q < nsl, hold its slices (D: the
 * up row's are R further). */
__device__ __noinline__ void epilogue(const tm_cuda_layer_args &a, const lay_plan &p, const float *part,
                                      const int *ulist, int n, int ph, int32_t pos, int64_t slot) {
    const int tid = threadIdx.x;
    const int R = p.rows[ph], NR = ph == 2 ? 2 * R : R, nsl = kCW / NR;
    if (ph == 0) {
        for (int i = tid; 2 * i < n * R; i += kConsumers) {
            const int j = 2 * i, st = j / R, wr = j % R;
            float s0 = 0.0f, s1 = 0.0f;
            for (int q = 0; q < nsl; q++) {
                s0 += part[st * kCW + q * NR + wr];
                s1 += part[st * kCW + q * NR + wr + 1];
            }
            epi_qkv(a, (int64_t)ulist[st] * R + wr, s0, s1, pos, slot);
        }
        return;
    }
    for (int j = tid; j < n * R; j += kConsumers) {
        const int st = j / R, wr = j % R;
        float s0 = 0.0f, s1 = 0.0f;
        for (int q = 0; q < nsl; q++) {
            s0 += part[st * kCW + q * NR + wr];
            if (ph == 2) s1 += part[st * kCW + q * NR + R + wr];
        }
        const int64_t r = (int64_t)ulist[st] * R + wr;
        if (ph == 2) {
            a.h[r] = tmbf::to_bf(s0 / (1.0f + expf(-s0)) * s1);
        } else {
            const float o = tmbf::bf(tmbf::to_bf(s0));
            a.x[r] = __ldcg(a.x + r) + o;
        }
    }
}

/* one phase: its stages (the loop inlined with the phase's row count known), then its epilogue */
template <int PH>
__device__ __forceinline__ void run_phase(const tm_cuda_layer_args &a, const lay_plan &p, const uint8_t *smem,
                                          const uint16_t *xs, float *part, int *ulist, const int *unit_of,
                                          uint64_t *full, uint64_t *empty, int &it, int32_t pos, int64_t slot) {
    const int n = stage_loop(a, p, smem, xs, part, ulist, unit_of, full, empty, &it,
                             PH == 2 ? 2 * p.rows[PH] : p.rows[PH], p.cols[PH]);
    epilogue(a, p, part, ulist, n, PH, pos, slot);
}

/* tokens a warp loads at once in attention (one round: its K and V rows are loaded before any is used; more
 * rounds unrolled made the code too long for the instruction cache) */
constexpr int kTokUnroll = 4;

__device__ __forceinline__ int splits_of(int ctx, int kv_heads) {
    constexpr int per = kCW * kTokUnroll;
    const int S = min((ctx + per - 1) / per, min(kMaxSplits, (int)gridDim.x / kv_heads));
    return max(S, 1);
}

/* the S splits of q head qh merged at dims d0 .. d0 + 3 (bf16), read through L2, 8 splits at a time (all in flight) */
template <int HD>
__device__ __forceinline__ uint2 merge4(const float2 *pml, const float *pacc, int qh, int d0, int S) {
    constexpr int G8 = 8;
    float M = -INFINITY, L = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < S; k0 += G8) {
        float2 ml[G8];
        float4 av[G8];
#pragma unroll
        for (int k = 0; k < G8; k++) {
            if (k0 + k < S) {
                ml[k] = __ldcg(pml + qh * kMaxSplits + k0 + k);
                const float *src = pacc + ((int64_t)qh * kMaxSplits + k0 + k) * HD + d0;
                av[k] = __ldcg(reinterpret_cast<const float4 *>(src));
            }
        }
        float Mn = M;
#pragma unroll
        for (int k = 0; k < G8; k++)
            if (k0 + k < S) Mn = fmaxf(Mn, ml[k].x);
        const float c = exp2f(M - Mn); /* 0 on the first group (M = -inf) */
        L *= c;
#pragma unroll
        for (int j = 0; j < 4; j++) acc[j] *= c;
#pragma unroll
        for (int k = 0; k < G8; k++) {
            if (k0 + k < S) {
                const float e = exp2f(ml[k].x - Mn);
                L = fmaf(ml[k].y, e, L);
                acc[0] = fmaf(av[k].x, e, acc[0]);
                acc[1] = fmaf(av[k].y, e, acc[1]);
                acc[2] = fmaf(av[k].z, e, acc[2]);
                acc[3] = fmaf(av[k].w, e, acc[3]);
            }
        }
        M = Mn;
    }
    return make_uint2(tmbf::pack_bf16x2(acc[0] / L, acc[1] / L), tmbf::pack_bf16x2(acc[2] / L, acc[3] / L));
}

template <int DPL> struct kv_vec;
template <> struct kv_vec<2> {
    using T = unsigned int;
    __device__ static void unpack(T v, float (&f)[2]) {
        f[0] = __uint_as_float(v << 16);
        f[1] = __uint_as_float(v & 0xffff0000u);
    }
};
template <> struct kv_vec<4> {
    using T = uint2;
    __device__ static void unpack(T v, float (&f)[4]) {
        f[0] = __uint_as_float(v.x << 16);
        f[1] = __uint_as_float(v.x & 0xffff0000u);
        f[2] = __uint_as_float(v.y << 16);
        f[3] = __uint_as_float(v.y & 0xffff0000u);
    }
};

/* Phase B, with grid barrier 1 inside: one (kv head, split) item per block (the other blocks only pass the
 * barrier). Before the barrier an item's warps load their first round of K and V rows, all but this token's (cache
 * index ctx - 1, written in phase A): the block table and the past entries are not written by this kernel. After
 * it: q and this token's row, then the rest. GQ: q heads per kv head. sbuf: shared scratch of kCW * (2 + HD) * GQ
 * floats.
 * The item's (max, sum, acc) per q head go to the work buffer; the kv head's last item merges them into a.att. */
template <int HD, int GQ>
__device__ __noinline__ void attend(const tm_cuda_layer_args &a, float *sbuf, work_hdr *wh) {
    constexpr int DPL = HD / 32, TU = kTokUnroll;
    using V = kv_vec<DPL>;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, bid = (int)blockIdx.x;
    const int KVH = a.n_kv_heads, bs = a.block_size;
    const int ctx = __ldcg(a.context_len);
    const int S = splits_of(ctx, KVH);
    const bool item = bid < KVH * S;
    const int chunk = (ctx + S - 1) / S, g = bid / S, sp = bid - g * S;
    const int t0 = sp * chunk, t1 = item ? min(ctx, t0 + chunk) : 0;
    typename V::T kr[TU], vr[TU];
    auto load_kv = [&](int t, bool past, bool now) { /* tokens t + j * kCW: the past ones and/or this token's */
#pragma unroll
        for (int j = 0; j < TU; j++) {
            const int tok = t + j * kCW;
            if (tok < t1 && (tok < ctx - 1 ? past : now)) {
                const int64_t blk = a.block_table[tok / bs];
                const int64_t at = ((blk * KVH + g) * bs + tok % bs) * HD + lane * DPL;
                kr[j] = __ldcg(reinterpret_cast<const typename V::T *>(a.k_cache + at));
                vr[j] = __ldcg(reinterpret_cast<const typename V::T *>(a.v_cache + at));
            }
        }
    };
    load_kv(t0 + warp, true, false);
    grid_sync(wh, 1);
    if (tid == 0) stamp2(a, 4, 2);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); /* every block of this grid is resident */
    if (!item) return;
    const float qscale = a.attn_scale * 1.4426950408889634f; /* scores in log2 units: exp2 below */

    float qv[GQ][DPL], m[GQ], l[GQ], acc[GQ][DPL];
#pragma unroll
    for (int h = 0; h < GQ; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[h][d] = 0.0f;
        const typename V::T raw =
            __ldcg(reinterpret_cast<const typename V::T *>(a.q + ((int64_t)(g * GQ + h) * HD + lane * DPL)));
        float f[DPL];
        V::unpack(raw, f);
#pragma unroll
        for (int d = 0; d < DPL; d++) qv[h][d] = f[d] * qscale;
    }
    if (tid == 0) stamp(a, 20);
    for (int t = t0 + warp; t < t1; t += kCW * TU) {
        load_kv(t, t != t0 + warp, true); /* the first round's past rows are already in */
#pragma unroll
        for (int j = 0; j < TU; j++) {
            if (t + j * kCW >= t1) break;
            float kf[DPL], vf[DPL], sc[GQ];
            V::unpack(kr[j], kf);
            V::unpack(vr[j], vf);
#pragma unroll
            for (int h = 0; h < GQ; h++) {
                sc[h] = 0.0f;
#pragma unroll
                for (int d = 0; d < DPL; d++) sc[h] = fmaf(qv[h][d], kf[d], sc[h]);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
                for (int h = 0; h < GQ; h++) sc[h] += __shfl_xor_sync(0xffffffffu, sc[h], o);
            }
#pragma unroll
            for (int h = 0; h < GQ; h++) {
                const float mn = fmaxf(m[h], sc[h]), corr = exp2f(m[h] - mn), pr = exp2f(sc[h] - mn);
                l[h] = l[h] * corr + pr;
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[h][d] = fmaf(pr, vf[d], acc[h][d] * corr);
                m[h] = mn;
            }
        }
    }
    if (tid == 0) stamp(a, 21);
    /* merge the warps: sbuf = m (kCW, GQ) | l (kCW, GQ) | acc (kCW, GQ, HD) */
    float *sm = sbuf, *sl = sbuf + kCW * GQ, *sa = sbuf + 2 * kCW * GQ;
#pragma unroll
    for (int h = 0; h < GQ; h++) {
        if (lane == 0) {
            sm[warp * GQ + h] = m[h];
            sl[warp * GQ + h] = l[h];
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) sa[(warp * GQ + h) * HD + lane * DPL + d] = acc[h][d];
    }
    consumers_sync();
    float2 *pml = reinterpret_cast<float2 *>(reinterpret_cast<uint8_t *>(a.work) + kWorkHeader);
    float *pacc = reinterpret_cast<float *>(pml + (size_t)a.n_heads * kMaxSplits);
    for (int i = tid; i < GQ * HD; i += kConsumers) {
        const int h = i / HD, d = i - h * HD, qh = g * GQ + h;
        float M = -INFINITY, L = 0.0f, A = 0.0f;
        for (int w = 0; w < kCW; w++) M = fmaxf(M, sm[w * GQ + h]);
        for (int w = 0; w < kCW; w++) {
            const float mw = sm[w * GQ + h];
            if (mw == -INFINITY) continue; /* a warp without tokens */
            const float e = exp2f(mw - M);
            L = fmaf(sl[w * GQ + h], e, L);
            A = fmaf(sa[(w * GQ + h) * HD + d], e, A);
        }
        if (d == 0) pml[qh * kMaxSplits + sp] = make_float2(M, L);
        pacc[((int64_t)qh * kMaxSplits + sp) * HD + d] = A;
    }
    /* the last split of kv head g to finish merges its GQ heads into a.att, which every block copies after
     * barrier 2 (every block merging every head from the partials took 5.7 us of a 1B layer, this 0.85 + the copy) */
    __shared__ unsigned s_last;
    __threadfence();
    consumers_sync();
    if (tid == 0) s_last = atomicAdd(&wh->att_done[g], 1u) == (unsigned)(S - 1);
    consumers_sync();
    if (!s_last) return;
    __threadfence();
    for (int i = tid; i < GQ * HD / 4; i += kConsumers) {
        const int qh = g * GQ + i / (HD / 4), d0 = (i % (HD / 4)) * 4;
        reinterpret_cast<uint2 *>(a.att)[(qh * HD + d0) / 4] = merge4<HD>(pml, pacc, qh, d0, S);
    }
    if (tid == 0) wh->att_done[g] = 0u;
}

template <int HD, int GQ>
__global__ void __launch_bounds__(kThreads, 1) layer_kernel_v1(const tm_cuda_layer_args a, const lay_plan p) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
    __shared__ float red[kCW];
    __shared__ int unit_of[kMaxStages];
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < p.nst; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kCW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid >= kConsumers) { /* the producer warp: lane 0 streams, the others leave */
        if (tid == kConsumers) produce(a, p, smem, full, empty, unit_of);
        return;
    }
    uint16_t *xs = reinterpret_cast<uint16_t *>(smem + p.xoff);
    float *part = reinterpret_cast<float *>(smem + p.poff);
    int *ulist = reinterpret_cast<int *>(part + p.cap * kCW);
    work_hdr *wh = reinterpret_cast<work_hdr *>(a.work);
    const bool st = tid == 0; /* the thread that stamps (a.trace) */
    if (st) stamp(a, 0);
    asm volatile("griddepcontrol.wait;" ::: "memory"); /* the previous kernel's x (and everything) is visible */
    if (st) {
        stamp(a, 1);
        bstamp(a, 0);
        if (a.btrace) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            a.btrace[(size_t)blockIdx.x * TM_CUDA_LAYER_BTRACE + 7] = sm;
        }
        if (a.trace && blockIdx.x == 0) a.trace[19] = 0;
    }
    const int32_t pos = *a.position;
    const int64_t slot = *a.slot;
    int it = 0;

    norm_to_smem(a.x, a.attn_norm, a.dim, a.eps, xs, red);
    if (st) stamp(a, 2);
    run_phase<0>(a, p, smem, xs, part, ulist, unit_of, full, empty, it, pos, slot);
    if (st) stamp2(a, 3, 1);
    attend<HD, GQ>(a, reinterpret_cast<float *>(xs), wh); /* grid barrier 1 inside */
    if (st) stamp2(a, 5, 3);
    grid_sync(wh, 2);
    if (st) stamp(a, 6);
    copy_to_smem(a.att, a.n_heads * HD, xs);
    if (st) stamp(a, 7);
    run_phase<1>(a, p, smem, xs, part, ulist, unit_of, full, empty, it, pos, slot);
    if (st) stamp2(a, 8, 4);
    grid_sync(wh, 3);
    if (st) stamp(a, 9);
    norm_to_smem(a.x, a.ffn_norm, a.dim, a.eps, xs, red);
    if (st) stamp(a, 10);
    run_phase<2>(a, p, smem, xs, part, ulist, unit_of, full, empty, it, pos, slot);
    if (st) stamp2(a, 11, 5);
    grid_sync(wh, 4);
    if (st) stamp(a, 12);
    copy_to_smem(a.h, a.ffn_dim, xs);
    if (st) stamp(a, 13);
    run_phase<3>(a, p, smem, xs, part, ulist, unit_of, full, empty, it, pos, slot);
    if (st) stamp2(a, 14, 6);

    consumers_sync();
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(&wh->exit, 1u) == gridDim.x - 1u) { /* the last block out: every block is past barrier 4 */
            wh->bar = 0u;
            wh->exit = 0u;
            for (int k = 0; k < 4; k++) wh->next[a.parity & 1][k] = 0u;
        }
        stamp(a, 15);
    }
}

/* the most rows R in {8, 4, 2, 1} (at most `most`) whose R * bytes_per_row fit a stage; 0 if none */
int stage_rows(int64_t bytes_per_row, int most) {
    for (int r = most; r >= 1; r >>= 1)
        if ((int64_t)r * bytes_per_row <= kStageBytes) return r;
    return 0;
}

/* the column slices of a stage of nr rows split evenly into 16-byte chunks */
bool slices_ok(int nr, int64_t cols) { return nr >= 1 && kCW % nr == 0 && cols % (8 * (kCW / nr)) == 0; }

} /* namespace */

extern "C" size_t tm_cuda_layer_work_bytes(int32_t n_heads, int32_t head_dim) {
    if (n_heads <= 0 || head_dim <= 0) return kWorkHeader;
    return kWorkHeader + (size_t)n_heads * kMaxSplits * (sizeof(float) * 2 + sizeof(float) * (size_t)head_dim);
}

extern "C" cudaError_t tm_cuda_layer_failed(const void *work, bool *failed, cudaStream_t stream) {
    *failed = false;
    if (!work) return cudaErrorInvalidValue;
    unsigned int v = 0;
    cudaError_t e = cudaMemcpyAsync(&v, &static_cast<const work_hdr *>(work)->error, sizeof v, cudaMemcpyDeviceToHost,
                                    stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    *failed = e == cudaSuccess && v != 0;
    return e;
}

extern "C" cudaError_t tm_cuda_layer_decode(const tm_cuda_layer_args *a, cudaStream_t stream) {
    if (!a || !a->wq || !a->wk || !a->wv || !a->wo || !a->w_gate || !a->w_up || !a->w_down || !a->attn_norm ||
        !a->ffn_norm || !a->position || !a->slot || !a->context_len || !a->block_table || !a->k_cache ||
        !a->v_cache || !a->x || !a->q || !a->att || !a->h || !a->work || a->dim <= 0 || a->ffn_dim <= 0 ||
        a->n_heads <= 0 || a->n_kv_heads <= 0 || a->block_size <= 0 || a->max_blocks <= 0 || a->rope_dim < 0 ||
        (a->rope_dim > 0 && !a->inv_freq))
        return cudaErrorInvalidValue;
    const int64_t hd = a->head_dim, qd = (int64_t)a->n_heads * hd, kvd = (int64_t)a->n_kv_heads * hd;
    const int group = a->n_heads % a->n_kv_heads ? 0 : a->n_heads / a->n_kv_heads;
    if ((hd != 64 && hd != 128) || (group != 4 && group != 8) ||
        a->rope_dim % 2 || a->rope_dim > hd || a->dim % 8 || a->ffn_dim % 8 ||
        a->dim > 4 * kNormVec * kConsumers)
        return cudaErrorNotSupported;
    const void *ptrs[] = {a->wq, a->wk, a->wv, a->wo, a->w_gate, a->w_up, a->w_down, a->x, a->q, a->att, a->h,
                          a->attn_norm, a->ffn_norm, a->k_cache, a->v_cache, a->work};
    for (const void *ptr : ptrs)
        if (!tm_aligned16(ptr)) return cudaErrorNotSupported;

    lay_plan p = {};
    p.cols[0] = a->dim;
    p.cols[1] = (int)qd;
    p.cols[2] = a->dim;
    p.cols[3] = a->ffn_dim;
    p.rows[0] = stage_rows(2 * (int64_t)a->dim, 8);
    p.rows[1] = stage_rows(2 * qd, 8);
    p.rows[2] = stage_rows(4 * (int64_t)a->dim, 4); /* gate and up rows */
    p.rows[3] = stage_rows(2 * (int64_t)a->ffn_dim, 8);
    if (p.rows[0] < 2 || !p.rows[1] || !p.rows[2] || !p.rows[3] || qd % p.rows[0] || kvd % p.rows[0] ||
        a->dim % p.rows[1] || a->ffn_dim % p.rows[2] || a->dim % p.rows[3])
        return cudaErrorNotSupported;
    for (int ph = 0; ph < 4; ph++)
        if (!slices_ok(ph == 2 ? 2 * p.rows[2] : p.rows[ph], p.cols[ph])) return cudaErrorNotSupported;
    p.units[0] = (int)((qd + 2 * kvd) / p.rows[0]);
    p.units[1] = a->dim / p.rows[1];
    p.units[2] = a->ffn_dim / p.rows[2];
    p.units[3] = a->dim / p.rows[3];

    int dev = 0, sms = 0, optin = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess)
        return e;
    int cc = 0;
    if ((e = cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess) return e;
    if (cc < 9 || sms < a->n_kv_heads || a->n_kv_heads > kMaxKV) return cudaErrorNotSupported;

    int64_t xbytes = 2 * (qd > a->dim ? qd : a->dim);
    if (2 * (int64_t)a->ffn_dim > xbytes) xbytes = 2 * (int64_t)a->ffn_dim;
    const int64_t abytes = (int64_t)sizeof(float) * kCW * (2 + hd) * group;
    if (abytes > xbytes) xbytes = abytes;
    xbytes = (xbytes + 127) / 128 * 128;
    void (*kernel)(const tm_cuda_layer_args, const lay_plan) =
        hd == 64 ? (group == 4 ? layer_kernel_v1<64, 4> : layer_kernel_v1<64, 8>)
                 : (group == 4 ? layer_kernel_v1<128, 4> : layer_kernel_v1<128, 8>);
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, kernel)) != cudaSuccess) return e;
    int most = 0; /* stages of a phase per block on average, rounded up */
    for (int ph = 0; ph < 4; ph++)
        if ((p.units[ph] + sms - 1) / sms > most) most = (p.units[ph] + sms - 1) / sms;
    p.cap = most + 2; /* the producer's cap on a block's units of a phase */
    p.claims = !tm_env_is_0("TM_CUDA_LAYER_CLAIMS");

    const int64_t pbytes = ((int64_t)p.cap * (kCW + 1) * 4 + 127) / 128 * 128;
    const int64_t room = (int64_t)optin - (int64_t)fa.sharedSizeBytes - xbytes - pbytes;
    p.nst = (int)(room / kStageBytes);
    if (p.nst > kMaxStages) p.nst = kMaxStages;
    if (p.nst < 2) return cudaErrorNotSupported;
    p.xoff = p.nst * kStageBytes;
    p.poff = p.xoff + (int)xbytes;
    const size_t smem = (size_t)p.poff + (size_t)pbytes;
    if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
        return e;
    int per_sm = 0;
    if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem)) != cudaSuccess) return e;
    if (per_sm < 1) return cudaErrorNotSupported;
    e = tm_launch_ex(a->pdl && tm_pdl_gemv_on(), kernel, dim3((unsigned)sms), dim3(kThreads), smem, stream, *a, p);
    return e != cudaSuccess ? e : cudaGetLastError();
}
