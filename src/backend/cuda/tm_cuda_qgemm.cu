/* tm_cuda_qgemm.cu -- mid-size batches of GGUF-quantized weights: dequantization fused into a tensor-core GEMM. */
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_bf16.cuh"
#include "backend/cuda/tm_cuda_kernels.h"
#include "backend/cuda/tm_cuda_dequant.cuh"

#include <stdlib.h>

/* out (n, rows) = x (n, cols) bf16 · dequant(w)ᵀ (+ bias), for TM_CUDA_GEMV_MAX_N < n <= TM_CUDA_QGEMM_MAX_N.
 *
 * Why. Up to 8 rows the GEMV reads each weight once for all rows on the CUDA cores; past that its FMAs cost more
 * than the weight stream, and the backend used to dequantize the whole matrix to bf16 and run a cuBLASLt GEMM:
 * per 8B Q4_K step ~4 GB read, 14 GB written and 14 GB read again, where the weights alone are 4 GB (batch 9 was
 * several times slower than batch 8). Here each weight is read once, decoded in registers and fed to mma.sync as
 * it is: nothing is written back.
 *
 * v1: a CTA of 8 warps takes 128 weight rows (warp w: rows 16w .. 16w + 15) against every token (n <= 64, up to
 * eight n-tiles of 8) over one split of the columns (split-K, below). The warps never wait for each other in
 * the main loop. Instantiated for 2, 4 and 8 n-tiles of accumulators (n <= 16, 32, 64): fewer registers for
 * small n, three CTAs an SM where they fit (2 n-tiles, 16-element units), and up to 4 n-tiles x for the next run
 * in flight during a run's products (n = 16: the four products of an 8B q4_K layer 190 -> 156 us, q6_K 261 ->
 * 200).
 *   - The columns go by chunks of 4 units (T::RUNS * 8 elements a unit: 64 or 128 columns): in a chunk, lane
 *     (g = lane / 4, c = lane % 4) decodes unit c of the chunk for rows 16w + g and 16w + g + 8 (T::load,
 *     T::vals: bf16 values exactly as tm_cuda_dequant_bf16 rounds them) and holds them as mma A fragments; the
 *     next chunk's units are loaded into registers before the current chunk's products.
 *   - The k order inside a product is permuted (a dot product does not depend on the order of its terms): in the
 *     k16 step (run k, half h) lane c supplies the elements 4h .. 4h + 3 of run k of its unit, as the A
 *     fragment's columns 2c, 2c + 1 (elements 4h, 4h + 1) and 2c + 8, 2c + 9 (4h + 2, 4h + 3). The B fragment
 *     (x, token 8j + g) takes x at the same columns: one 16-byte load per (run, n-tile) serves both halves. x is
 *     read from global memory with plain (L1-cached) loads: the CTA's 8 warps read the same x, and a
 *     shared-memory ring of x chunks with a barrier a chunk (the first version) measured 1.5-2x slower.
 *   - Split-K: with fewer row blocks than the SMs hold at once (two CTAs an SM) the columns are cut into S splits
 *     (grid.y, one wave). Each CTA writes its f32 tile to the work buffer and counts itself on its row block's
 *     counter; the last one sums the S tiles in split order (the result does not depend on which CTA finishes
 *     last), adds the bias, writes out and resets the counter for the next launch (graph replays included).
 * Measured (tb_qgemm, H200, 8B shapes; docs/PERFORMANCE.md): 1.5-2.9x faster than dequantize + GEMM at n = 16
 * (450-1300 GB/s of weights), break-even between 32 and 64 by type (tm_cuda_qgemm_max_n). Still latency-bound
 * (ncu of the first 8-n-tile version: 16 warps an SM, DRAM 18% busy).
 * Shapes: rows % 16 == 0, cols a multiple of 4 units, weights ALIGN-aligned, x 16-byte aligned; else cudaErrorNotSupported and
 * the caller dequantizes. */

namespace {

constexpr int QG_WARPS = 8, QG_THREADS = QG_WARPS * 32, QG_BM = QG_WARPS * 16, QG_MAXN = TM_CUDA_QGEMM_MAX_N;
constexpr int QG_MAX_SPLIT_CTAS = 512; /* row blocks x splits when split (bounds the work buffer) */

using tmbf::pack_bf16x2;

/* d (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col) */
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct qg_args {
    const uint8_t *w;   /* (rows, row_bytes) GGUF blocks */
    const uint16_t *x;  /* (n, cols) bf16 */
    const float *bias;  /* (rows) or NULL */
    void *out;          /* (n, rows) bf16, or f32 when out_f32 */
    float *part;        /* (row blocks, splits, QG_MAXN, QG_BM) f32 split tiles, when splits > 1 */
    int32_t *cnt;       /* (row blocks) arrival counters, zero between launches */
    int64_t rows, row_bytes;
    int32_t cols, n, splits, chunks_per_split;
    bool out_f32;
};

/* columns a chunk: 4 units of T::RUNS * 8 elements */
template <class T> __host__ __device__ constexpr int qg_kc() { return 4 * T::RUNS * 8; }

/* CTAs an SM: 3 with up to two n-tiles of accumulators and the 16-element units (their raw blocks are small), else
 * 2 (the 128 registers a thread the products and the raw units of the K-quants need without spilling) */
template <class T, int NT> constexpr int qg_minb() { return NT <= 2 && T::RUNS == 2 ? 3 : 2; }

/* NT: n-tiles of accumulators (n <= 8 NT) */
template <class T, int NT>
__global__ void __launch_bounds__(QG_THREADS, qg_minb<T, NT>()) qgemm_kernel_v1(const qg_args a) {
    constexpr int KC = qg_kc<T>();

    tm_pdl_enter();
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int64_t rb = blockIdx.x;
    const int32_t split = (int32_t)blockIdx.y;
    const int32_t n_chunks = a.cols / KC;
    const int32_t ch0 = split * a.chunks_per_split, ch1 = min(n_chunks, ch0 + a.chunks_per_split);
    const int nt = (a.n + 7) >> 3;
    const int64_t r0 = rb * QG_BM + warp * 16 + g; /* this lane's rows r0 and r0 + 8 */
    const bool live = rb * QG_BM + warp * 16 < a.rows; /* the warp has rows (rows % 16 == 0: all 16 or none) */
    const uint8_t *w0 = a.w + (live ? r0 : 0) * a.row_bytes, *w1 = w0 + (live ? 8 * a.row_bytes : 0);
    /* x rows of this lane's tokens 8j + g (clamped to n - 1: the products of tokens past n are not stored);
     * plain loads (x is the previous kernel's output: not through the read-only path), L1-cached: the 8 warps of
     * the CTA read the same x */
    auto x_at = [&](int j, int col) { /* x[token 8j + g][col .. col + 7] */
        return *reinterpret_cast<const uint4 *>(a.x + (size_t)min(8 * j + g, a.n - 1) * (size_t)a.cols + col);
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    typename T::Raw raw0{}, raw1{}, nraw0{}, nraw1{};
    if (live && ch0 < ch1) {
        T::load(w0, ch0 * 4 + c, raw0);
        T::load(w1, ch0 * 4 + c, raw1);
    }
    if (live) {
        for (int32_t ch = ch0; ch < ch1; ch++) {
            const int u = ch * 4 + c;
            if (ch + 1 < ch1) { /* the next chunk's units in flight during this chunk's products */
                T::load(w0, u + 4, nraw0);
                T::load(w1, u + 4, nraw1);
            }
            /* up to four n-tiles: x of run k + 1 in flight during run k's products; eight: four at a time */
            constexpr int NB = NT <= 4 ? NT : 0;
            uint4 b[NB > 0 ? NB : 1], bn[NB > 0 ? NB : 1];
#pragma unroll
            for (int j = 0; j < NB; j++)
                if (j < nt) bn[j] = x_at(j, T::xoff(u, 0));
#pragma unroll
            for (int k = 0; k < T::RUNS; k++) {
                const int col = T::xoff(u, k); /* the run's first column */
#pragma unroll
                for (int j = 0; j < NB; j++) b[j] = bn[j];
                if (k + 1 < T::RUNS) {
#pragma unroll
                    for (int j = 0; j < NB; j++)
                        if (j < nt) bn[j] = x_at(j, T::xoff(u, k + 1));
                }
                float v0[8], v1[8];
                T::vals(raw0, k, v0);
                T::vals(raw1, k, v1);
                uint32_t af[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    af[h][0] = pack_bf16x2(v0[4 * h], v0[4 * h + 1]);
                    af[h][1] = pack_bf16x2(v1[4 * h], v1[4 * h + 1]);
                    af[h][2] = pack_bf16x2(v0[4 * h + 2], v0[4 * h + 3]);
                    af[h][3] = pack_bf16x2(v1[4 * h + 2], v1[4 * h + 3]);
                }
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    if (j < nt) {
                        mma_bf16(acc[j], af[0], b[j].x, b[j].y);
                        mma_bf16(acc[j], af[1], b[j].z, b[j].w);
                    }
                }
#pragma unroll
                for (int j0 = NB; j0 < NT; j0 += 4) { /* n-tiles past the first four */
                    uint4 b2[4];
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        if (j0 + j < nt) b2[j] = x_at(j0 + j, col);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (j0 + j < nt) {
                            mma_bf16(acc[j0 + j], af[0], b2[j].x, b2[j].y);
                            mma_bf16(acc[j0 + j], af[1], b2[j].z, b2[j].w);
                        }
                    }
                }
            }
            raw0 = nraw0;
            raw1 = nraw1;
        }
    }

    /* C fragment: acc[j] = (row r0, tokens 8j + 2c, 8j + 2c + 1), (row r0 + 8, the same tokens) */
    auto store = [&](int64_t row, int tok, float v) {
        if (a.bias) v += a.bias[row];
        if (a.out_f32) ((float *)a.out)[(size_t)tok * (size_t)a.rows + (size_t)row] = v;
        else ((uint16_t *)a.out)[(size_t)tok * (size_t)a.rows + (size_t)row] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    };
    if (a.splits == 1) {
        if (!live) return;
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = 8 * j + 2 * c + (e & 1);
                if (j < nt && tok < a.n) store(r0 + 8 * (e >> 1), tok, acc[j][e]);
            }
        }
        return;
    }
    /* split-K: this split's tile, then the last CTA of the row block sums the splits in order */
    const int rl = warp * 16 + g; /* row within the block */
    float *tile = a.part + ((size_t)rb * (size_t)a.splits + (size_t)split) * (size_t)(QG_MAXN * QG_BM);
    if (live) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = 8 * j + 2 * c + (e & 1);
                if (j < nt) tile[(size_t)tok * QG_BM + rl + 8 * (e >> 1)] = acc[j][e];
            }
        }
    }
    __threadfence();
    __syncthreads();
    __shared__ int s_last;
    if (tid == 0) s_last = atomicAdd(&a.cnt[rb], 1) == a.splits - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (live) {
        const float *t0 = a.part + (size_t)rb * (size_t)a.splits * (size_t)(QG_MAXN * QG_BM);
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = 8 * j + 2 * c + (e & 1);
                if (j < nt && tok < a.n) {
                    const size_t off = (size_t)tok * QG_BM + rl + 8 * (e >> 1);
                    float v = 0.0f;
                    for (int s = 0; s < a.splits; s++) v += __ldcg(t0 + (size_t)s * (QG_MAXN * QG_BM) + off);
                    store(r0 + 8 * (e >> 1), tok, v);
                }
            }
        }
    }
    if (tid == 0) a.cnt[rb] = 0; /* ready for the next launch */
}

template <class T, int NT>
cudaError_t launch_v1(qg_args &a, int64_t n_rb, int32_t sms, cudaStream_t stream) {
    constexpr int KC = qg_kc<T>();
    if (a.cols % KC) return cudaErrorNotSupported;
    const int32_t n_chunks = a.cols / KC;
    /* splits: as many CTAs as fit the SMs at once (two an SM: a second, partial wave would double the time),
     * at most QG_MAX_SPLIT_CTAS in all, each split at least 4 chunks */
    const int64_t target = qg_minb<T, NT>() * (int64_t)sms;
    int32_t splits = 1;
    if (n_rb < target && a.part && a.cnt) {
        splits = (int32_t)(target / n_rb);
        splits = min(splits, max(1, n_chunks / 4));
        while (splits > 1 && n_rb * splits > QG_MAX_SPLIT_CTAS) splits--;
    }
    a.chunks_per_split = (n_chunks + splits - 1) / splits;
    a.splits = (n_chunks + a.chunks_per_split - 1) / a.chunks_per_split; /* no empty split */
    return tm_launch(qgemm_kernel_v1<T, NT>, dim3((unsigned)n_rb, (unsigned)a.splits), dim3(QG_THREADS), 0, stream, a);
}

} /* namespace */

extern "C" int32_t tm_cuda_qgemm_max_n(int32_t type) {
    /* where it beats dequantize + cuBLASLt on the 8B shapes (tb_qgemm, H200, the four products of a layer summed):
     * q4_K 1.97x at n = 32, 1.10x at 64; q8_0 / q4_0 / q4_1 / q6_K 1.28-1.34x at 32, 0.65-0.87x at 64 */
    switch (type) {
    case TM_DT_Q4_K: return 64;
    case TM_DT_Q8_0:
    case TM_DT_Q4_0:
    case TM_DT_Q4_1:
    case TM_DT_Q6_K: return 32;
    default: return 0;
    }
}

extern "C" size_t tm_cuda_qgemm_work_bytes(void) {
    return (size_t)QG_MAX_SPLIT_CTAS * QG_MAXN * QG_BM * sizeof(float) + (size_t)QG_MAX_SPLIT_CTAS * sizeof(int32_t);
}

extern "C" cudaError_t tm_cuda_qgemm(const void *w, int32_t type, int64_t rows, int64_t cols, const uint16_t *x,
                                     int32_t n, const float *bias, void *out, bool out_f32, void *work,
                                     cudaStream_t stream) {
    tmq::info ti;
    if (!w || !x || !out || rows <= 0 || cols <= 0 || n < 1 || n > QG_MAXN || !tmq::type_info(type, &ti) ||
        cols % ti.qk)
        return cudaErrorInvalidValue;
    const int align = tmq::unit_align(type);
    if (rows % 16 || cols > INT32_MAX || align <= 0 || (uintptr_t)w % (uintptr_t)align || !tm_aligned16(x) ||
        (type != TM_DT_Q8_0 && type != TM_DT_Q4_0 && type != TM_DT_Q4_1 && type != TM_DT_Q4_K && type != TM_DT_Q6_K))
        return cudaErrorNotSupported;
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    qg_args a = {};
    a.w = (const uint8_t *)w;
    a.x = x;
    a.bias = bias;
    a.out = out;
    a.rows = rows;
    a.row_bytes = cols / ti.qk * ti.bytes;
    a.cols = (int32_t)cols;
    a.n = n;
    a.out_f32 = out_f32;
    if (work) {
        a.part = (float *)work;
        a.cnt = (int32_t *)((uint8_t *)work + (size_t)QG_MAX_SPLIT_CTAS * QG_MAXN * QG_BM * sizeof(float));
    }
    const int64_t n_rb = (rows + QG_BM - 1) / QG_BM;
    if (n_rb > INT32_MAX) return cudaErrorInvalidValue;
    /* accumulators for the n-tiles in use: n <= 16, 32 or 64 */
    switch (type) {
#define QG_LAUNCH(T)                                                                                                \
    return n <= 16 ? launch_v1<T, 2>(a, n_rb, sms, stream)                                                          \
                   : n <= 32 ? launch_v1<T, 4>(a, n_rb, sms, stream) : launch_v1<T, 8>(a, n_rb, sms, stream)
    case TM_DT_Q8_0: QG_LAUNCH(tmq::t_q8_0);
    case TM_DT_Q4_0: QG_LAUNCH(tmq::t_q4_0);
    case TM_DT_Q4_1: QG_LAUNCH(tmq::t_q4_1);
    case TM_DT_Q4_K: QG_LAUNCH(tmq::t_q4_K);
    case TM_DT_Q6_K: QG_LAUNCH(tmq::t_q6_K);
#undef QG_LAUNCH
    default: return cudaErrorNotSupported;
    }
}
