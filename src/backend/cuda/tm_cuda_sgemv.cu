/* tm_cuda_sgemv.cu -- batch-1 bf16 products streamed through a shared-memory ring, one CTA per SM, prefetching
 * ahead of the kernel before it. */
#include "tm_cuda_bf16.cuh"
#include "tm_cuda_fp8.cuh"
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <stdint.h>

/* Why: at batch 1 every decode kernel reads its weights once, and the time between two weight streams (the tail
 * of one product, the kernels in between, the ramp of the next) is what keeps the 1B shape at ~68% of its floor.
 * tm_cuda_gemv (v2) issues its first loads before its programmatic-dependent-launch wait, but its many small
 * blocks fill every SM's registers, so the next product cannot become resident until the current one drains.
 *
 * This kernel is one CTA per SM (288 threads, ~97 KB of shared memory, few registers), so two of them and a small
 * kernel fit an SM together. Launched with programmatic dependent launch, it triggers its dependents at entry
 * and, before it waits for the previous kernel (griddepcontrol.wait), fills its whole ring with its first
 * weights: while the kernel before it still streams, this one's first ~12.7 MB (3 stages x 32 KB x 132 SMs) are
 * already on their way into shared memory, so the DRAM stays busy across the boundary and the product starts on
 * data at hand once x is visible.
 *
 * Layout: the work rows (the rows of jobs 0..n_jobs-1 one after the other; SwiGLU: gate row r with up row r) are
 * cut into even, contiguous ranges, one per CTA. A stage holds SR work rows of one job (SR = 8 / NSEG rows of
 * row_bytes, times two for SwiGLU, at most 32 KB), copied by one cp.async.bulk per weight matrix, completion
 * counted on the stage's `full` mbarrier. Warp w of the 8 consumer warps takes row w / NSEG of the stage and
 * column segment w % NSEG (cols / NSEG columns, a multiple of 256: ch = cols / NSEG / 256 chunks of 8 bf16 per
 * lane, lane l taking chunks l, l + 32, ...; x's chunks of that segment stay in the lane's registers for the
 * whole launch), sums in f32 (two chains per lane), reduces over the warp, leaves the partial in shared memory and
 * arrives on the stage's `empty` mbarrier. The producer warp (lane 0 issues the copies) waits on `empty`, sums
 * each row's NSEG partials in segment order (deterministic: the same bits on every run), runs the epilogue
 * (bias, bf16 or f32 store; SwiGLU; q|k|v with RoPE and the cache write, as tm_cuda_gemv_qkv_rope) and refills
 * the slot. The summation order differs from tm_cuda_gemv's, so results agree with it to rounding, not bits.
 * The last 25% of the rows of a one-job product (plain or SwiGLU) form a pool that the CTAs done with their static
 * share claim SR rows at a time (an atomic counter pair per launch slot, reset by the launch's last CTA).
 *
 * Measured (fifteenth session, docs/PERFORMANCE.md): slower than tm_cuda_gemv on a decode layer's chain (1B 47.9-51
 * against 42.1-42.6 us a layer, 8B 132-136 against 119-120) and end to end (1B 1036 against 1159 tok/s); faster on
 * the output projection alone (1B 122.4 against 124.9 us, 8B 238.2 against 243.6) but not measurably end to end.
 * A globaltimer trace per CTA (tm_cuda_sgemv_trace) shows why: the small products (q|k|v, o) start behind the
 * non-PDL norm kernel, so their 8-12 MB arrive in one burst 2-4 us after launch; static shares finish up to 20%
 * apart (the pool halves that); and each norm between two products costs 1.3-3.8 us. Hence opt-in only
 * (TM_CUDA_SGEMV=1, =head for the output projection). */

namespace {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kStageBytes = 32 * 1024; /* measured against 2 x 32 KB and 4 x 16 KB: this is the fastest */
constexpr int kStages = 3;
constexpr int kMaxJobs = TM_CUDA_GEMV_MAX_JOBS;
constexpr int kMaxCh = 8;  /* chunks of 8 bf16 per lane per segment: x held in 32 registers */
size_t smem_bytes(int nst, int stage_bytes) { /* the ring, the partial sums, the barriers, the stage records */
    return (size_t)nst * stage_bytes + (size_t)nst * kConsumerWarps * 2 * sizeof(float) + 2 * nst * sizeof(uint64_t) +
           (size_t)nst * (sizeof(int64_t) + 2 * sizeof(int));
}

enum { EPI_PLAIN = 0, EPI_SWIGLU = 1, EPI_ROPE = 2 };

struct sg_args {
    const uint8_t *w[kMaxJobs];   /* (rows_j, cols) bf16; SwiGLU: the gate */
    const uint8_t *w_up;          /* SwiGLU: (rows_0, cols) */
    const float *bias[kMaxJobs];  /* (rows_j) f32 or NULL */
    void *out[kMaxJobs];          /* (rows_j) bf16 or f32 (out_f32); ROPE: out[1], out[2] may be NULL */
    int64_t start[kMaxJobs + 1];  /* first work row of job j; start[n_jobs] = all work rows (unused jobs: = it) */
    const uint16_t *x;            /* (cols) bf16 */
    int64_t row_bytes;
    int cols, seg_cols, ch;
    int nst, stage_bytes;         /* ring: nst stages of stage_bytes */
    unsigned long long *trace;    /* test beds: (gridDim, 4) globaltimer stamps of this launch, or NULL */
    int64_t pool_start;           /* > 0: rows from here on are claimed SR at a time by the CTAs that finish their
                                   * static rows first (one job only); 0: every row static */
    int pool_slot;                /* this launch's pair of g_pool counters */
    bool out_f32;
    /* ROPE (jobs 0, 1, 2 = q, k, v; one token) */
    const float *inv_freq;
    const int32_t *positions;
    const int64_t *slot_mapping;
    uint16_t *k_cache, *v_cache;
    bool kv_fp8;
    int head_dim, rope_dim, block_size, n_kv_heads;
};

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
    }
}
/* bytes (a multiple of 16, both ends 16-byte aligned) from global src to shared dst, completion counted on bar */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
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

/* the stage that starts at work row cur of a CTA whose range ends at r1: its job, its first row in that job, its
 * row count (<= SR; never across a job's end) */
struct stage_geom {
    int job;
    int64_t row;
    int n;
};
template <int SR> __device__ __forceinline__ stage_geom geom_at(const sg_args &a, int64_t cur, int64_t r1) {
    int j = 0;
#pragma unroll
    for (int k = 1; k < kMaxJobs; k++)
        if (cur >= a.start[k]) j = k;
    int64_t end = a.start[kMaxJobs];
#pragma unroll
    for (int k = 1; k <= kMaxJobs; k++)
        if (k == j + 1) end = a.start[k];
    const int64_t lim = min(end, r1);
    stage_geom g;
    g.job = j;
    g.row = cur - a.start[j];
    g.n = (int)min((int64_t)SR, lim - cur);
    return g;
}

/* job j's pointers without dynamic indexing of the parameter struct (it stays in parameter space) */
template <typename T> __device__ __forceinline__ T pick(const T (&arr)[kMaxJobs], int j) {
    T v = arr[0];
#pragma unroll
    for (int k = 1; k < kMaxJobs; k++)
        if (j == k) v = arr[k];
    return v;
}

__device__ __forceinline__ float2 rope_cs(int32_t pos, float inv_freq) { /* as tm_cuda_rope.cu's angles */
    const float th = __fmul_rn((float)pos, inv_freq);
    double sn, cs;
    sincospi((double)th * 0.318309886183790671537767526745, &sn, &cs);
    return make_float2((float)cs, (float)sn);
}

/* the producer warp's epilogue of one stage (PLAIN, SWIGLU): lane i < g.n finishes row g.row + i */
template <int NSEG, int EPI>
__device__ __forceinline__ void epilogue(const sg_args &a, const stage_geom &g, const float *red, int lane) {
    if (lane >= g.n) return;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int k = 0; k < NSEG; k++) {
        s0 += red[(lane * NSEG + k) * 2];
        s1 += red[(lane * NSEG + k) * 2 + 1];
    }
    const int64_t r = g.row + lane;
    if constexpr (EPI == EPI_SWIGLU) {
        reinterpret_cast<uint16_t *>(a.out[0])[r] = tmbf::to_bf(s0 / (1.0f + expf(-s0)) * s1);
        return;
    }
    const float *bias = pick(a.bias, g.job);
    void *out = pick(a.out, g.job);
    const float v = s0 + (bias ? bias[r] : 0.0f);
    if (a.out_f32)
        reinterpret_cast<float *>(out)[r] = v;
    else
        reinterpret_cast<uint16_t *>(out)[r] = tmbf::to_bf(v);
}

/* ROPE's epilogue needs both rows of a pair on one lane: done by the whole producer warp with a shuffle */
__device__ __forceinline__ void rope_epilogue(const sg_args &a, const stage_geom &g, const float *red, int nseg,
                                              int lane) {
    float s = 0.0f;
    if (lane < g.n)
        for (int k = 0; k < nseg; k++) s += red[(lane * nseg + k) * 2];
    const float s_next = __shfl_down_sync(0xffffffffu, s, 1);
    if (lane >= g.n || (lane & 1)) return;
    const int64_t r0 = g.row + lane;
    const float *bias = pick(a.bias, g.job);
    void *out = pick(a.out, g.job);
    const uint16_t o0 = tmbf::to_bf(s + (bias ? bias[r0] : 0.0f));
    const uint16_t o1 = tmbf::to_bf(s_next + (bias ? bias[r0 + 1] : 0.0f));
    const uint32_t plain = (uint32_t)o0 | ((uint32_t)o1 << 16);
    const int hd = a.head_dim, h = (int)(r0 / hd), d0 = (int)(r0 - (int64_t)h * hd);
    uint32_t rot = plain;
    if (g.job < 2 && d0 < a.rope_dim) {
        const float2 t = rope_cs(a.positions[0], a.inv_freq[d0 >> 1]);
        const float x0 = tmbf::bf(o0), x1 = tmbf::bf(o1);
        rot = tmbf::pack_bf16x2(x0 * t.x - x1 * t.y, x0 * t.y + x1 * t.x);
    }
    if (g.job == 0) {
        *reinterpret_cast<uint32_t *>((uint16_t *)out + r0) = rot;
        return;
    }
    if (out) *reinterpret_cast<uint32_t *>((uint16_t *)out + r0) = plain;
    const int64_t slot = a.slot_mapping[0];
    if (slot < 0) return;
    const int64_t blk = slot / a.block_size, off = slot - blk * a.block_size;
    const int64_t at = ((blk * a.n_kv_heads + h) * a.block_size + off) * hd + d0;
    uint16_t *cache = g.job == 1 ? a.k_cache : a.v_cache;
    if (a.kv_fp8) /* the bf16 pair rounded once more, to e4m3 */
        *reinterpret_cast<uint16_t *>(reinterpret_cast<uint8_t *>(cache) + at) =
            tm_fp8x2_of(tmbf::bf((uint16_t)(rot & 0xffffu)), tmbf::bf((uint16_t)(rot >> 16)));
    else
        *reinterpret_cast<uint32_t *>(cache + at) = rot;
}

/* claim counters of the row pool, a pair (claimed chunks, CTAs done) per launch slot; the last CTA of a launch
 * resets its pair, so every launch finds it at zero (the launcher cycles through the slots: launches that run
 * at the same time under programmatic dependent launch use different pairs) */
constexpr int kCounterSlots = 32;
__device__ unsigned int g_pool[kCounterSlots][2];

template <int NSEG, int EPI>
__global__ void __launch_bounds__(kThreads, 2) sgemv_kernel_v1(const sg_args a) {
    constexpr int SR = kConsumerWarps / NSEG;
    constexpr int NW = EPI == EPI_SWIGLU ? 2 : 1;
    extern __shared__ __align__(128) uint8_t smem[];
    const int nst = a.nst;
    float *red = reinterpret_cast<float *>(smem + (size_t)nst * a.stage_bytes); /* (stage, warp, 2) */
    uint64_t *full = reinterpret_cast<uint64_t *>(red + nst * kConsumerWarps * 2);
    uint64_t *empty = full + nst;
    int64_t *st_row = reinterpret_cast<int64_t *>(empty + nst); /* (stage) the slot's first row in its job */
    int *st_job = reinterpret_cast<int *>(st_row + nst), *st_n = st_job + nst; /* its job, its rows (0: the end) */
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    if (a.trace && threadIdx.x == 0) a.trace[blockIdx.x * 4] = gtime();
    /* static rows: an even range per CTA over all rows, or over the first pool_start rows when a pool is used */
    const int64_t stat = a.pool_start > 0 ? a.pool_start : a.start[kMaxJobs];
    const int64_t units = stat >> 1;
    const int64_t r0 = 2 * (units * blockIdx.x / gridDim.x), r1 = 2 * (units * (blockIdx.x + 1) / gridDim.x);
    if (threadIdx.x == 0) {
        for (int s = 0; s < nst; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kConsumerWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* the next kernel may be scheduled now: it waits for this one before it touches what this one writes */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    if (warp == kConsumerWarps) { /* the producer warp: lane 0 issues, the warp runs the epilogues */
        const int64_t rb = a.row_bytes, total = a.start[kMaxJobs];
        unsigned int *pool = a.pool_start > 0 ? g_pool[a.pool_slot] : nullptr;
        unsigned int claimed = 0; /* lane 0: the next pool chunk, claimed one ahead of its use */
        if (pool && lane == 0) claimed = atomicAdd(&pool[0], 1u);
        int64_t cur = r0;
        int s = 0, es = 0;
        bool more = true, waited = false;
        while (more || es < s) {
            if (more && s - es < nst) { /* a free slot: the next stage, or the end marker */
                stage_geom g = {0, 0, 0};
                if (cur < r1) {
                    g = geom_at<SR>(a, cur, r1);
                    cur += g.n;
                } else if (pool) {
                    const int64_t row = a.pool_start + (int64_t)__shfl_sync(0xffffffffu, claimed, 0) * SR;
                    if (row < total) { /* one job: the pool is used only then */
                        g.row = row;
                        g.n = (int)min((int64_t)SR, total - row);
                        if (lane == 0) claimed = atomicAdd(&pool[0], 1u);
                    }
                }
                const int slot = s % nst;
                if (lane == 0) {
                    st_row[slot] = g.row;
                    st_job[slot] = g.job;
                    st_n[slot] = g.n;
                    if (g.n > 0) {
                        uint8_t *dst = smem + (size_t)slot * a.stage_bytes;
                        const unsigned bytes = (unsigned)(g.n * rb);
                        mbar_expect_tx(&full[slot], bytes * NW);
                        bulk_load(dst, pick(a.w, g.job) + g.row * rb, bytes, &full[slot]);
                        if constexpr (NW == 2) bulk_load(dst + (size_t)SR * rb, a.w_up + g.row * rb, bytes, &full[slot]);
                    } else {
                        mbar_arrive(&full[slot]); /* the end: the consumers stop at this slot */
                    }
                }
                __syncwarp();
                if (g.n > 0)
                    s++;
                else
                    more = false;
                continue;
            }
            /* the ring is full (or all is issued): finish the oldest stage */
            if (!waited) { /* outputs may still be read by the kernels before: wait for them */
                asm volatile("griddepcontrol.wait;" ::: "memory");
                waited = true;
            }
            const int slot = es % nst;
            mbar_wait(&empty[slot], (unsigned)(es / nst) & 1u);
            const stage_geom g = {st_job[slot], st_row[slot], st_n[slot]};
            const float *rs = red + slot * kConsumerWarps * 2;
            if constexpr (EPI == EPI_ROPE)
                rope_epilogue(a, g, rs, NSEG, lane);
            else
                epilogue<NSEG, EPI>(a, g, rs, lane);
            __syncwarp();
            es++;
        }
        if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
        if (pool && lane == 0) { /* every claim of this CTA is made: count it done; the last one resets */
            __threadfence();
            if (atomicAdd(&pool[1], 1u) == gridDim.x - 1) {
                atomicExch(&pool[0], 0u);
                atomicExch(&pool[1], 0u);
            }
        }
        if (a.trace && lane == 0) a.trace[blockIdx.x * 4 + 3] = gtime();
        return;
    }

    /* consumer warps */
    asm volatile("griddepcontrol.wait;" ::: "memory"); /* x is visible */
    if (a.trace && threadIdx.x == 0) a.trace[blockIdx.x * 4 + 1] = gtime();
    const int row = warp / NSEG, seg = warp % NSEG, ch = a.ch;
    uint4 xr[kMaxCh];
    const uint4 *x4 = reinterpret_cast<const uint4 *>(a.x + (size_t)seg * a.seg_cols);
#pragma unroll
    for (int i = 0; i < kMaxCh; i++)
        if (i < ch) xr[i] = __ldcg(x4 + i * 32 + lane);
    const size_t seg_off = (size_t)seg * a.seg_cols * 2 + (size_t)lane * 16;
    for (int s = 0;; s++) {
        const int slot = s % nst;
        mbar_wait(&full[slot], (unsigned)(s / nst) & 1u);
        if (a.trace && threadIdx.x == 0 && s == 0) a.trace[blockIdx.x * 4 + 2] = gtime();
        const int n = st_n[slot];
        if (n == 0) break;
        if (row < n) {
            const uint8_t *wr = smem + (size_t)slot * a.stage_bytes + (size_t)row * a.row_bytes + seg_off;
            float g0 = 0.0f, g1 = 0.0f, u0 = 0.0f, u1 = 0.0f;
#pragma unroll
            for (int i = 0; i < kMaxCh; i++) {
                if (i < ch) {
                    dot8(*reinterpret_cast<const uint4 *>(wr + i * 512), xr[i], g0, g1);
                    if constexpr (NW == 2)
                        dot8(*reinterpret_cast<const uint4 *>(wr + (size_t)SR * a.row_bytes + i * 512), xr[i], u0, u1);
                }
            }
            const float gs = warp_sum(g0 + g1);
            const float us = NW == 2 ? warp_sum(u0 + u1) : 0.0f;
            if (lane == 0) {
                red[(slot * kConsumerWarps + warp) * 2] = gs;
                red[(slot * kConsumerWarps + warp) * 2 + 1] = us;
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
    }
}

/* rows per stage (SR) for rows of row_bytes (times nw weight matrices), or 0 */
int rows_per_stage(int64_t row_bytes, int nw, int stage_bytes) {
    for (int sr = kConsumerWarps; sr >= 1; sr >>= 1)
        if ((int64_t)sr * nw * row_bytes <= stage_bytes) return sr;
    return 0;
}

template <int NSEG, int EPI> cudaError_t launch_one(const sg_args &a, int grid, cudaStream_t stream) {
    static unsigned long long attr_set = 0; /* per instantiation, a bit per device (<= 64) */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaErrorInvalidDevice;
    }
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(attr_set & bit)) {
        const cudaError_t e = cudaFuncSetAttribute(sgemv_kernel_v1<NSEG, EPI>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)smem_bytes(kStages, kStageBytes));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return e;
        }
        attr_set |= bit;
    }
    return tm_launch_ex(tm_pdl_gemv_on(), sgemv_kernel_v1<NSEG, EPI>, dim3((unsigned)grid), dim3(kThreads),
                        smem_bytes(a.nst, a.stage_bytes), stream, a);
}

template <int EPI> cudaError_t launch_epi(const sg_args &a, int nseg, int grid, cudaStream_t stream) {
    switch (nseg) {
    case 1: return launch_one<1, EPI>(a, grid, stream);
    case 2: return launch_one<2, EPI>(a, grid, stream);
    case 4: return launch_one<4, EPI>(a, grid, stream);
    case 8: return launch_one<8, EPI>(a, grid, stream);
    default: return cudaErrorNotSupported;
    }
}

int sm_count() {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        n = 0;
    (void)cudaGetLastError();
    return n > 0 ? n : 1;
}

} // namespace

/* ---- launcher ---------------------------------------------------------------------------------------------------- */

static unsigned long long *g_trace; /* test beds (tm_cuda_sgemv_trace) */
static int g_trace_left, g_trace_stride;
extern "C" void tm_cuda_sgemv_trace(unsigned long long *buf, int launches, int stride) {
    g_trace = buf;
    g_trace_left = launches;
    g_trace_stride = stride;
}

extern "C" cudaError_t tm_cuda_sgemv(const tm_cuda_sgemv_args *in, cudaStream_t stream) {
    if (!in || in->n_jobs < 1 || in->n_jobs > kMaxJobs || !in->x || in->cols <= 0 || (in->w_up && in->n_jobs != 1) ||
        (in->rope && (in->n_jobs != 3 || in->w_up || in->out_f32)))
        return cudaErrorNotSupported;
    const int epi = in->w_up ? EPI_SWIGLU : in->rope ? EPI_ROPE : EPI_PLAIN;
    const int64_t row_bytes = in->cols * 2;
    const int nst = kStages, stage_bytes = kStageBytes;
    const int sr = rows_per_stage(row_bytes, epi == EPI_SWIGLU ? 2 : 1, stage_bytes);
    if (sr == 0 || (epi == EPI_ROPE && sr < 2)) return cudaErrorNotSupported;
    const int nseg = kConsumerWarps / sr;
    if (in->cols % ((int64_t)nseg * 256) != 0 || in->cols / nseg / 256 > kMaxCh) return cudaErrorNotSupported;
    if (!tm_aligned16(in->x)) return cudaErrorNotSupported;
    sg_args a = {};
    int64_t total = 0;
    for (int j = 0; j < kMaxJobs; j++) {
        a.start[j] = total;
        if (j >= in->n_jobs) continue;
        const tm_cuda_sgemv_job *jb = &in->jobs[j];
        if (jb->rows < 0 || (jb->rows & 1) || (jb->rows > 0 && (!jb->w || !tm_aligned16(jb->w))) ||
            (jb->rows > 0 && !jb->out && !(epi == EPI_ROPE && j > 0)) || (jb->bias && epi == EPI_SWIGLU))
            return cudaErrorNotSupported;
        a.w[j] = (const uint8_t *)jb->w;
        a.bias[j] = jb->bias;
        a.out[j] = jb->out;
        total += jb->rows;
    }
    a.start[kMaxJobs] = total;
    if (total == 0) return cudaSuccess;
    if (epi == EPI_SWIGLU) {
        if (!tm_aligned16(in->w_up)) return cudaErrorNotSupported;
        a.w_up = (const uint8_t *)in->w_up;
    }
    if (epi == EPI_ROPE) {
        const tm_cuda_rope_args *r = in->rope;
        const int64_t qd = (int64_t)r->n_heads * r->head_dim, kvd = (int64_t)r->n_kv_heads * r->head_dim;
        if (r->neox || r->n_tokens != 1 || (r->head_dim & 1) || (r->rope_dim & 1) || r->rope_dim > r->head_dim ||
            in->jobs[0].rows != qd || in->jobs[1].rows != kvd || in->jobs[2].rows != kvd || !r->inv_freq ||
            !r->positions || !r->slot_mapping || !r->k_cache || !r->v_cache || ((uintptr_t)in->jobs[0].out & 3) ||
            ((uintptr_t)in->jobs[1].out & 3) || ((uintptr_t)in->jobs[2].out & 3) || ((uintptr_t)r->k_cache & 3) ||
            ((uintptr_t)r->v_cache & 3))
            return cudaErrorNotSupported;
        a.inv_freq = r->inv_freq;
        a.positions = r->positions;
        a.slot_mapping = r->slot_mapping;
        a.k_cache = r->k_cache;
        a.v_cache = r->v_cache;
        a.kv_fp8 = r->kv_fp8;
        a.head_dim = r->head_dim;
        a.rope_dim = r->rope_dim;
        a.block_size = r->block_size;
        a.n_kv_heads = r->n_kv_heads;
    }
    a.x = in->x;
    a.row_bytes = row_bytes;
    a.cols = (int)in->cols;
    a.seg_cols = (int)(in->cols / nseg);
    a.ch = a.seg_cols / 256;
    a.out_f32 = in->out_f32;
    a.nst = nst;
    if (g_trace && g_trace_left > 0) {
        a.trace = g_trace;
        g_trace += g_trace_stride;
        g_trace_left--;
    }
    a.stage_bytes = stage_bytes;
    const int64_t units = total / 2;
    const int grid = (int)(units < sm_count() ? units : sm_count());
    /* a pool of the last rows (one job, SwiGLU or plain): the CTAs that finish their static share first take them,
     * SR rows at a time (static contiguous shares alone finished up to 20% apart: DRAM does not serve every SM
     * alike) */
    const int pool_pct = 25; /* measured: 8B layer chain 140 us without a pool, 132 with 25%, 134 with 40% */
    if (in->n_jobs == 1 && epi != EPI_ROPE && total >= (int64_t)grid * 2 * sr * 4) {
        static unsigned int next_slot = 0;
        int64_t stat = (int64_t)((double)total * (100 - pool_pct) / 100.0);
        stat = stat / ((int64_t)2 * grid) * 2 * grid; /* whole even shares */
        if (stat > 0 && stat < total) {
            a.pool_start = stat;
            a.pool_slot = (int)(next_slot++ % kCounterSlots);
        }
    }
    switch (epi) {
    case EPI_SWIGLU: return launch_epi<EPI_SWIGLU>(a, nseg, grid, stream);
    case EPI_ROPE: return launch_epi<EPI_ROPE>(a, nseg, grid, stream);
    default: return launch_epi<EPI_PLAIN>(a, nseg, grid, stream);
    }
}
