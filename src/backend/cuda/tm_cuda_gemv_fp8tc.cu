/* tm_cuda_gemv_fp8tc.cu -- fp8 (W8A8) products of up to 8 rows on the tensor cores, from e4m3 activations. */
#include "tm_cuda_launch.cuh"
#include "backend/cuda/tm_cuda_kernels.h"

#include <cuda_bf16.h>
#include <limits.h>

/* out (n, rows) = scale * xq (n, cols) . w^T (+ bias), w (rows, cols) and xq e4m3 bytes, n <= 8 (experimental,
 * branch fp8-tc-gemv).
 *
 * Why: the fp8 GEMV of tm_cuda_gemv.cu widens every weight and rounds every activation on the CUDA cores, ~3
 * instructions a weight byte, so at batch 1 it moves 1.4-2.1 TB/s where the bf16 one moves 2.9 (1B fp8 batch-1
 * decode 1160 tok/s, 41% of its floor, below bf16's 1211). Here one mma.m16n8k32 (e4m3, f32 accumulation) takes
 * 512 weight bytes: 16 rows by 32 columns, with the batch rows as its 8 columns of B (rows of B past n are zero).
 *
 * v1: a block of W warps owns 16 weight rows (r0 .. r0 + 15); the columns go in chunks of 64, chunk c to warp c % W
 * (W = 4 .. 32, more for fewer blocks: the launcher).
 * In a chunk, lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of row r0 + g and of row r0 + g + 8 at columns
 * 64 c + 16 t .. + 15, and 16 bytes of xq row g there (g < n; else zeros). Since a dot product does not care about
 * the order of its terms, those bytes are given to two mma as they lie: for mma m (0, 1), the k slots 4 t .. 4 t + 3
 * of A (rows g, g + 8) and of B (column g) hold columns 64 c + 16 t + 8 m + 0..3, the slots 16 + 4 t .. + 3 the
 * columns + 4..7; A and B agree, so the products pair the right bytes. U chunks of a warp are loaded at once. The
 * four warps' accumulators meet in shared memory; thread i < 16 n writes row r0 + i % 16 of batch row i / 16.
 * Row counts must be multiples of 16, cols of 256, xq and w 16-byte aligned. */

namespace {

constexpr int kU = 4; /* chunks a lane loads at once */

__device__ __forceinline__ uint4 ld_w(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct tc_args {
    const uint8_t *w;     /* (rows, cols) e4m3 */
    const uint8_t *xq;    /* (n, cols) e4m3 */
    const float *bias;    /* (rows) or NULL */
    void *out;            /* (n, rows) f32 or bf16 */
    int rows, cols, n;
    float scale;
    bool out_f32, pdl;
};

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32) gemv_fp8tc_v1(const tc_args a) {
    __shared__ float red[kWarps][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * 16;
    const uint8_t *w0 = a.w + (r0 + g) * a.cols + 16 * t, *w1 = w0 + (int64_t)8 * a.cols;
    const bool has_x = g < a.n;
    const uint8_t *xr = a.xq + (int64_t)(has_x ? g : 0) * a.cols + 16 * t;
    const int nch = a.cols >> 6;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int ch = warp;
    bool waited = !a.pdl;
    for (; ch + (kU - 1) * kWarps < nch; ch += kU * kWarps) {
        uint4 wa[kU], wb[kU], xv[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const int64_t off = (int64_t)(ch + u * kWarps) << 6;
            wa[u] = ld_w(w0 + off);
            wb[u] = ld_w(w1 + off);
        }
        if (!waited) {
            asm volatile("griddepcontrol.wait;" ::: "memory");
            asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const int64_t off = (int64_t)(ch + u * kWarps) << 6;
            xv[u] = has_x ? __ldcg(reinterpret_cast<const uint4 *>(xr + off)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kU; u++) {
            mma_e4m3(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[u].x, xv[u].y);
            mma_e4m3(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[u].z, xv[u].w);
        }
    }
    if (!waited) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    for (; ch < nch; ch += kWarps) {
        const int64_t off = (int64_t)ch << 6;
        const uint4 wa = ld_w(w0 + off), wb = ld_w(w1 + off);
        const uint4 xv = has_x ? __ldcg(reinterpret_cast<const uint4 *>(xr + off)) : make_uint4(0, 0, 0, 0);
        mma_e4m3(c, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
        mma_e4m3(c, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) red[warp][lane][k] = c[k];
    __syncthreads();
    /* output (row i, batch b): lane (i % 8, b / 2), register (i >= 8 ? 2 : 0) + b % 2 */
    const int i = threadIdx.x & 15, b = threadIdx.x >> 4;
    if (b < a.n) { /* threads 0 .. 16 n - 1 (every block has >= 128 threads) */
        const int ln = (i & 7) * 4 + (b >> 1), k = (i >= 8 ? 2 : 0) + (b & 1);
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; w++) s += red[w][ln][k];
        const int64_t r = r0 + i;
        s = s * a.scale + (a.bias ? a.bias[r] : 0.0f);
        if (a.out_f32)
            ((float *)a.out)[(int64_t)b * a.rows + r] = s;
        else
            ((uint16_t *)a.out)[(int64_t)b * a.rows + r] = __bfloat16_as_ushort(__float2bfloat16_rn(s));
    }
}

} // namespace

extern "C" cudaError_t tm_cuda_gemv_fp8tc(const void *w, int64_t rows, int64_t cols, const uint8_t *xq, int32_t n,
                                          float scale, const float *bias, void *out, bool out_f32,
                                          cudaStream_t stream) {
    if (rows <= 0 || rows % 16 || rows > INT32_MAX || cols <= 0 || cols % 256 || cols > INT32_MAX || n < 1 ||
        n > 8 || !tm_aligned16(w) || !tm_aligned16(xq))
        return cudaErrorInvalidValue;
    tc_args a;
    a.w = (const uint8_t *)w;
    a.xq = xq;
    a.bias = bias;
    a.out = out;
    a.rows = (int)rows;
    a.cols = (int)cols;
    a.n = n;
    a.scale = scale;
    a.out_f32 = out_f32;
    a.pdl = tm_pdl_gemv_on();
    /* warps a block: enough for ~24 warps an SM over the grid (few 16-row blocks: long rows, split over more
     * warps); TM_CUDA_FP8TC_WARPS forces 4, 8, 16 or 32 */
    const int64_t blocks = rows / 16;
    int nwarps = 4;
    while (nwarps < 32 && blocks * nwarps < 132 * 24) nwarps *= 2;
    if (const char *e = getenv("TM_CUDA_FP8TC_WARPS")) nwarps = atoi(e);
    const dim3 grid((unsigned)blocks);
    switch (nwarps) {
    case 4: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<4>, grid, dim3(128), 0, stream, a);
    case 8: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<8>, grid, dim3(256), 0, stream, a);
    case 16: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<16>, grid, dim3(512), 0, stream, a);
    case 32: return tm_launch_ex(a.pdl, gemv_fp8tc_v1<32>, grid, dim3(1024), 0, stream, a);
    default: return cudaErrorInvalidValue;
    }
}
