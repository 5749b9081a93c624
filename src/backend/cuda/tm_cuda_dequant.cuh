/* tm_cuda_dequant.cuh -- device-side decoding of weight blocks (GGUF f32, f16, bf16, q8_0, q4_0, q4_1, q4_K, q6_K; fp8 e4m3). */
#ifndef TM_CUDA_DEQUANT_CUH
#define TM_CUDA_DEQUANT_CUH

/* Two ways to read a weight row (layouts in core/tm_dtype.h, identical to GGUF):
 *
 * 1. tmq::deq_elem(type, row, j): element j of a row, any type, any alignment, byte loads. Obviously correct and
 *    slow: the v1 kernels and the reference semantics.
 *
 * 2. Per-type "unit" traits (tmq::t_bf16, ... tmq::t_q6_K) for the fast kernels. A row is cut into units (8 to
 *    32 elements each, a lane's share of one step); a unit is made of RUNS runs of 8 consecutive elements that
 *    start at row element xoff(u, k) (so the matching activations are one 16-byte load of 8 bf16 per run).
 *      load(row, u, raw)        global loads of unit u of a row into registers (no arithmetic on loaded values
 *                               beyond funnel shifts, so the loads of several units can all be in flight)
 *      scales(raw, s, m)        per run: value = s * q + m (m = 0 unless HAS_MIN); only when HAS_SCALE
 *      qrun(raw, k, q)          the 8 "q" values of run k (exact small integers for quantized types, the values
 *                               themselves for float types)
 *      vals(raw, k, v)          the 8 dequantized f32 values of run k rounded exactly like the CPU reference
 *                               tm_dequant_row (no fused multiply-add), for dequant/embed
 *    Alignment needs (checked by the launchers, which fall back to v1 otherwise): the weight base is ALIGN-byte
 *    aligned; float types also need cols % 8 == 0. Quantized blocks are only 2-byte aligned inside a row
 *    (18/34/210-byte blocks), so words are read as aligned 32-bit loads plus a funnel shift (ld_words_a2), never
 *    touching a byte outside the row's blocks except the 2 bytes before a 2-mod-4 address (inside the matrix
 *    since the base is 4-byte aligned).
 *
 * Integers become floats through the 2^23 trick: the byte b placed in the low mantissa of 0x4B000000 is the float
 * 2^23 + b exactly, and subtracting 2^23 + offset gives b - offset exactly (one PRMT + one FADD per element). */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "core/tm_dtype.h"
#include "tm_cuda_fp8.cuh"

namespace tmq {

/* ---- loads -------------------------------------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) { return __ldg((const unsigned int *)p); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) { return __ldg((const unsigned short *)p); }
__device__ __forceinline__ uint4 ld_v4(const uint8_t *p) { return __ldg((const uint4 *)p); }

/* 16 bytes read once: not kept in L1 (the activations live there), with a 256-byte L2 prefetch hint */
__device__ __forceinline__ uint4 ld_stream_v4(const uint8_t *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* the same 16 bytes by a relaxed (strong) load, which keeps its place before a griddepcontrol.wait: ptxas hoists
 * the wait above .nc loads, whose order it is free to change (tm_cuda_gemv.cu: the first loads of a PDL GEMV) */
__device__ __forceinline__ uint4 ld_stream_v4_ordered(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

/* K little-endian 32-bit words starting at a 2-byte aligned address p: K aligned word loads, plus one 16-bit load
 * of the last two bytes when p is 2 mod 4 (so nothing past p + 4K is read). */
template <int K> __device__ __forceinline__ void ld_words_a2(const uint8_t *p, uint32_t (&out)[K]) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t s = (uint32_t)(a & 2u) * 8u; /* 0 or 16 */
    const uint8_t *wp = (const uint8_t *)(a & ~(uintptr_t)3);
    uint32_t w[K + 1];
#pragma unroll
    for (int k = 0; k < K; k++) w[k] = ld_u32(wp + 4 * k);
    w[K] = s ? ld_u16(p + 4 * K - 2) : 0u;
#pragma unroll
    for (int k = 0; k < K; k++) out[k] = __funnelshift_r(w[k], w[k + 1], s);
}

/* ---- scalar helpers ----------------------------------------------------------------------------------------- */

__device__ __forceinline__ float f16f(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
__device__ __forceinline__ float bf16f(uint32_t h) { return __uint_as_float(h << 16); }

/* byte j (0..3) of w as the float 2^23 + byte */
__device__ __forceinline__ float magic_byte(uint32_t w, int j) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)j));
}
/* 4 bytes of w, each < 16 -> 4 floats 1 + byte / 128 (exact): byte | 0x80 as bits 16..23 under 0x3F, i.e. one
 * byte_perm a value and no subtraction (the GEMV takes sum(q x) = 128 (sum((1 + q / 128) x) - sum(x))) */
__device__ __forceinline__ void nib4_1p(uint32_t w, float *q) {
    const uint32_t v = w | 0x80808080u;
#pragma unroll
    for (int j = 0; j < 4; j++) q[j] = __uint_as_float(__byte_perm(v, 0x3Fu, 0x4055u | ((uint32_t)j << 8)));
}
/* 4 bytes of w -> 4 floats byte - off (exact) */
__device__ __forceinline__ void bytes4(uint32_t w, float off, float *q) {
    const float c = 8388608.0f + off;
#pragma unroll
    for (int j = 0; j < 4; j++) q[j] = magic_byte(w, j) - c;
}

/* element j (0..7) of 8 packed bf16 */
__device__ __forceinline__ float bf16_at(const uint4 &v, int j) {
    const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
}

/* q4_K: 6-bit scale and min of sub-block s (0..7) from the 12 scale bytes (ggml's get_scale_min_k4), bytes read
 * one at a time (for the element-wise path) */
__device__ __forceinline__ void q4k_scale_min_bytes(const uint8_t *sc, int s, int &d, int &m) {
    if (s < 4) {
        d = sc[s] & 63;
        m = sc[s + 4] & 63;
    } else {
        d = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
        m = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}
/* the same from the three scale words (bytes 0-3, 4-7, 8-11) with a run-time s */
__device__ __forceinline__ void q4k_scale_min_words(uint32_t w0, uint32_t w1, uint32_t w2, int s, int &d, int &m) {
    const uint32_t sel = 0x4440u | (uint32_t)(s & 3);
    const int b0 = (int)__byte_perm(w0, 0, sel), b1 = (int)__byte_perm(w1, 0, sel), b2 = (int)__byte_perm(w2, 0, sel);
    const bool lo = s < 4;
    d = lo ? (b0 & 63) : ((b2 & 0xF) | ((b0 >> 6) << 4));
    m = lo ? (b1 & 63) : ((b2 >> 4) | ((b1 >> 6) << 4));
}

/* ---- type table (block elements and bytes), mirrors tm_dtype_get for the weight types ------------------------- */

struct info {
    int qk, bytes;
};
__host__ __device__ __forceinline__ bool type_info(int32_t type, info *i) {
    switch (type) {
    case TM_DT_F32: *i = {1, 4}; return true;
    case TM_DT_F16: *i = {1, 2}; return true;
    case TM_DT_BF16: *i = {1, 2}; return true;
    case TM_DT_Q8_0: *i = {TM_QK8_0, (int)sizeof(tm_block_q8_0)}; return true;
    case TM_DT_Q4_0: *i = {TM_QK4_0, (int)sizeof(tm_block_q4_0)}; return true;
    case TM_DT_Q4_1: *i = {TM_QK4_1, (int)sizeof(tm_block_q4_1)}; return true;
    case TM_DT_Q4_K: *i = {TM_QK_K, (int)sizeof(tm_block_q4_K)}; return true;
    case TM_DT_Q6_K: *i = {TM_QK_K, (int)sizeof(tm_block_q6_K)}; return true;
    case TM_DT_FP8_E4M3: *i = {16, 16}; return true; /* rows of whole 16-byte units (t_fp8) */
    default: return false;
    }
}

/* ---- element-wise reference decoding (v1) --------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

/* element j of a row of `type`; rounding identical to tm_dequant_row */
__device__ __forceinline__ float deq_elem(int32_t type, const uint8_t *row, int64_t j) {
    switch (type) {
    case TM_DT_F32: {
        const uint8_t *p = row + 4 * j;
        return __uint_as_float(rd16(p) | (rd16(p + 2) << 16));
    }
    case TM_DT_F16: return f16f(rd16(row + 2 * j));
    case TM_DT_BF16: return bf16f(rd16(row + 2 * j));
    case TM_DT_Q8_0: {
        const uint8_t *b = row + (j / 32) * 34;
        return __fmul_rn((float)(int8_t)b[2 + j % 32], f16f(rd16(b)));
    }
    case TM_DT_Q4_0: {
        const uint8_t *b = row + (j / 32) * 18;
        const int i = (int)(j % 32);
        const int q = i < 16 ? (b[2 + i] & 0xF) : (b[2 + i - 16] >> 4);
        return __fmul_rn((float)(q - 8), f16f(rd16(b)));
    }
    case TM_DT_Q4_1: {
        const uint8_t *b = row + (j / 32) * 20;
        const int i = (int)(j % 32);
        const int q = i < 16 ? (b[4 + i] & 0xF) : (b[4 + i - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, f16f(rd16(b))), f16f(rd16(b + 2)));
    }
    case TM_DT_Q4_K: {
        const uint8_t *b = row + (j / 256) * 144;
        const int e = (int)(j % 256), jj = e / 64, hi = (e % 64) >= 32, l = e % 32;
        const int q = (b[16 + 32 * jj + l] >> (4 * hi)) & 0xF;
        int sc, mn;
        q4k_scale_min_bytes(b + 4, 2 * jj + hi, sc, mn);
        const float d1 = __fmul_rn(f16f(rd16(b)), (float)sc), m1 = __fmul_rn(f16f(rd16(b + 2)), (float)mn);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    case TM_DT_Q6_K: {
        const uint8_t *b = row + (j / 256) * 210;
        const int e = (int)(j % 256), h = e / 128, g = (e % 128) / 32, l = e % 32;
        const int ql = b[64 * h + l + 32 * (g & 1)];
        const int nib = (g >> 1) ? (ql >> 4) : (ql & 0xF);
        const int qh = (b[128 + 32 * h + l] >> (2 * g)) & 3;
        const int q = (nib | (qh << 4)) - 32;
        const int sc = (int8_t)b[192 + 8 * h + l / 16 + 2 * g];
        return __fmul_rn(__fmul_rn(f16f(rd16(b + 208)), (float)sc), (float)q);
    }
    case TM_DT_FP8_E4M3: return tm_fp8_to_f32(row[j]); /* the e4m3 value: the per-tensor scale is the caller's */
    default: return 0.0f;
    }
}

/* ---- unit traits (fast paths) --------------------------------------------------------------------------------- */

/* bf16: unit = 8 elements = 16 bytes */
struct t_bf16 {
    static constexpr int QK = 1, RUNS = 1, ALIGN = 16, UNROLL = 4;
    static constexpr bool HAS_SCALE = false, HAS_MIN = false;
    struct Raw {
        uint4 v;
    };
    __device__ static int units(int cols) { return cols / 8; }
    __device__ static int xoff(int u, int) { return 8 * u; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) { r.v = ld_stream_v4(row + 16 * (int64_t)u); }
    __device__ static void load_ordered(const uint8_t *row, int u, Raw &r) {
        r.v = ld_stream_v4_ordered(row + 16 * (int64_t)u);
    }
    __device__ static void scales(const Raw &, float *, float *) {}
    __device__ static void qrun(const Raw &r, int, float *q) {
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = bf16_at(r.v, j);
    }
    __device__ static void vals(const Raw &r, int k, float *v) { qrun(r, k, v); }
};

/* f16: unit = 8 elements = 16 bytes */
struct t_f16 {
    static constexpr int QK = 1, RUNS = 1, ALIGN = 16, UNROLL = 4;
    static constexpr bool HAS_SCALE = false, HAS_MIN = false;
    struct Raw {
        uint4 v;
    };
    __device__ static int units(int cols) { return cols / 8; }
    __device__ static int xoff(int u, int) { return 8 * u; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) { r.v = ld_stream_v4(row + 16 * (int64_t)u); }
    __device__ static void load_ordered(const uint8_t *row, int u, Raw &r) {
        r.v = ld_stream_v4_ordered(row + 16 * (int64_t)u);
    }
    __device__ static void scales(const Raw &, float *, float *) {}
    __device__ static void qrun(const Raw &r, int, float *q) {
        const uint32_t w[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
            q[2 * i] = f.x;
            q[2 * i + 1] = f.y;
        }
    }
    __device__ static void vals(const Raw &r, int k, float *v) { qrun(r, k, v); }
};

/* f32: unit = 8 elements = 32 bytes */
struct t_f32 {
    static constexpr int QK = 1, RUNS = 1, ALIGN = 16, UNROLL = 2;
    static constexpr bool HAS_SCALE = false, HAS_MIN = false;
    struct Raw {
        uint4 a, b;
    };
    __device__ static int units(int cols) { return cols / 8; }
    __device__ static int xoff(int u, int) { return 8 * u; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) {
        r.a = ld_stream_v4(row + 32 * (int64_t)u);
        r.b = ld_stream_v4(row + 32 * (int64_t)u + 16);
    }
    __device__ static void load_ordered(const uint8_t *row, int u, Raw &r) {
        r.a = ld_stream_v4_ordered(row + 32 * (int64_t)u);
        r.b = ld_stream_v4_ordered(row + 32 * (int64_t)u + 16);
    }
    __device__ static void scales(const Raw &, float *, float *) {}
    __device__ static void qrun(const Raw &r, int, float *q) {
        q[0] = __uint_as_float(r.a.x);
        q[1] = __uint_as_float(r.a.y);
        q[2] = __uint_as_float(r.a.z);
        q[3] = __uint_as_float(r.a.w);
        q[4] = __uint_as_float(r.b.x);
        q[5] = __uint_as_float(r.b.y);
        q[6] = __uint_as_float(r.b.z);
        q[7] = __uint_as_float(r.b.w);
    }
    __device__ static void vals(const Raw &r, int k, float *v) { qrun(r, k, v); }
};

/* q4_0 (18 B: d, qs[16]; element i < 16 = low nibble of qs[i] - 8, element 16 + i = high nibble - 8):
 * unit = half a block's qs bytes (h = u & 1: qs[8h .. 8h+7]) = 16 elements, run 0 = low nibbles (elements 8h..),
 * run 1 = high nibbles (elements 16 + 8h ..). */
struct t_q4_0 {
    static constexpr int QK = 32, RUNS = 2, ALIGN = 4, UNROLL = 4;
    static constexpr bool HAS_SCALE = true, HAS_MIN = false;
    struct Raw {
        uint32_t d, q[2];
    };
    __device__ static int units(int cols) { return cols / 16; }
    __device__ static int xoff(int u, int k) { return 32 * (u >> 1) + 8 * (u & 1) + 16 * k; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) {
        const uint8_t *b = row + 18 * (int64_t)(u >> 1);
        r.d = ld_u16(b);
        ld_words_a2<2>(b + 2 + 8 * (u & 1), r.q);
    }
    __device__ static void scales(const Raw &r, float *s, float *) { s[0] = s[1] = f16f(r.d); }
    __device__ static void qrun(const Raw &r, int k, float *q) {
#pragma unroll
        for (int i = 0; i < 2; i++) bytes4(k ? (r.q[i] >> 4) & 0x0F0F0F0Fu : r.q[i] & 0x0F0F0F0Fu, 8.0f, q + 4 * i);
    }
    /* no qrun1p: q4_0's runs have no sum(x) to share (no min), and measured 0.4% slower with it */
    __device__ static void vals(const Raw &r, int k, float *v) {
        const float d = f16f(r.d);
        qrun(r, k, v);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fmul_rn(v[j], d);
    }
};

/* q4_1 (20 B: d, m, qs[16]; value = d * nibble + m): units as q4_0 */
struct t_q4_1 {
    static constexpr int QK = 32, RUNS = 2, ALIGN = 4, UNROLL = 4;
    static constexpr bool HAS_SCALE = true, HAS_MIN = true;
    struct Raw {
        uint32_t d, m, q[2];
    };
    __device__ static int units(int cols) { return cols / 16; }
    __device__ static int xoff(int u, int k) { return 32 * (u >> 1) + 8 * (u & 1) + 16 * k; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) {
        const uint8_t *b = row + 20 * (int64_t)(u >> 1);
        r.d = ld_u16(b);
        r.m = ld_u16(b + 2);
        ld_words_a2<2>(b + 4 + 8 * (u & 1), r.q);
    }
    __device__ static void scales(const Raw &r, float *s, float *m) {
        s[0] = s[1] = f16f(r.d);
        m[0] = m[1] = f16f(r.m);
    }
    __device__ static void qrun(const Raw &r, int k, float *q) {
#pragma unroll
        for (int i = 0; i < 2; i++) bytes4(k ? (r.q[i] >> 4) & 0x0F0F0F0Fu : r.q[i] & 0x0F0F0F0Fu, 0.0f, q + 4 * i);
    }
    __device__ static void qrun1p(const Raw &r, int k, float *q) {
#pragma unroll
        for (int i = 0; i < 2; i++) nib4_1p(k ? (r.q[i] >> 4) & 0x0F0F0F0Fu : r.q[i] & 0x0F0F0F0Fu, q + 4 * i);
    }
    __device__ static void vals(const Raw &r, int k, float *v) {
        const float d = f16f(r.d), m = f16f(r.m);
        qrun(r, k, v);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fadd_rn(__fmul_rn(v[j], d), m);
    }
};

/* fp8 e4m3 (W8A8 weights, backend.h): unit = 16 elements = 16 bytes, 2 runs of 8. q = the e4m3 values themselves
 * (exact in f32); the weight's per-tensor scale is not in the row: the GEMV applies it, with the activation scale,
 * to its sums (so vals() is the unscaled value too, and dequant/embed do not take this type). */
struct t_fp8 {
    static constexpr int QK = 16, RUNS = 2, ALIGN = 16, UNROLL = 4;
    static constexpr bool HAS_SCALE = false, HAS_MIN = false;
    struct Raw {
        uint4 v;
    };
    __device__ static int units(int cols) { return cols / 16; }
    __device__ static int xoff(int u, int k) { return 16 * u + 8 * k; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) { r.v = ld_stream_v4(row + 16 * (int64_t)u); }
    __device__ static void load_ordered(const uint8_t *row, int u, Raw &r) {
        r.v = ld_stream_v4_ordered(row + 16 * (int64_t)u);
    }
    __device__ static void scales(const Raw &, float *, float *) {}
    __device__ static void qrun(const Raw &r, int k, float *q) {
        const uint32_t w[2] = {k ? r.v.z : r.v.x, k ? r.v.w : r.v.y};
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t f = tm_fp8x2_to_f16x2(w[i] >> (16 * h));
                const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&f));
                q[4 * i + 2 * h] = v.x;
                q[4 * i + 2 * h + 1] = v.y;
            }
        }
    }
    __device__ static void vals(const Raw &r, int k, float *v) { qrun(r, k, v); }
};

/* the traits whose activations are rounded to e4m3 too (W8A8): the GEMV scales x and the sums (tm_cuda_gemv.cu) */
template <class T> struct act_fp8 {
    static constexpr bool value = false;
};
template <> struct act_fp8<t_fp8> {
    static constexpr bool value = true;
};

/* q8_0 (34 B: d, qs[32] int8): unit = half a block (h = u & 1: elements 16h .. 16h+15), 2 runs of 8 */
struct t_q8_0 {
    static constexpr int QK = 32, RUNS = 2, ALIGN = 4, UNROLL = 2;
    static constexpr bool HAS_SCALE = true, HAS_MIN = false;
    struct Raw {
        uint32_t d, q[4];
    };
    __device__ static int units(int cols) { return cols / 16; }
    __device__ static int xoff(int u, int k) { return 32 * (u >> 1) + 16 * (u & 1) + 8 * k; }
    __device__ static void load(const uint8_t *row, int u, Raw &r) {
        const uint8_t *b = row + 34 * (int64_t)(u >> 1);
        r.d = ld_u16(b);
        ld_words_a2<4>(b + 2 + 16 * (u & 1), r.q);
    }
    __device__ static void scales(const Raw &r, float *s, float *) { s[0] = s[1] = f16f(r.d); }
    __device__ static void qrun(const Raw &r, int k, float *q) {
        /* signed bytes: flip the sign bit to get q + 128 as an unsigned byte */
        bytes4(r.q[2 * k] ^ 0x80808080u, 128.0f, q);
        bytes4(r.q[2 * k + 1] ^ 0x80808080u, 128.0f, q + 4);
    }
    __device__ static void vals(const Raw &r, int k, float *v) {
        const float d = f16f(r.d);
        qrun(r, k, v);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fmul_rn(v[j], d);
    }
};

/* q4_K (144 B: d, dmin, scales[12], qs[128]; qs[32jj + l] holds element 64jj + l (low nibble, sub-block 2jj) and
 * 64jj + 32 + l (high nibble, sub-block 2jj + 1); value = d*sc*q - dmin*m per 32-element sub-block).
 * unit = one 16-byte chunk c = u & 7 of qs (bytes 16c ..: jj = c/2, l0 = 16(c&1)) = 32 elements; runs: 0/1 low
 * nibbles of bytes 0-7 / 8-15 (sub-block 2jj), 2/3 high nibbles (sub-block 2jj+1). Blocks are 16-byte aligned
 * when the base is (144 = 9 * 16): the header (d, dmin, scales) is one 16-byte load shared by 8 lanes. */
struct t_q4_K {
    static constexpr int QK = 256, RUNS = 4, ALIGN = 16, UNROLL = 2;
    static constexpr bool HAS_SCALE = true, HAS_MIN = true;
    struct Raw {
        uint4 h, q;
        int c;
    };
    __device__ static int units(int cols) { return cols / 32; }
    __device__ static int xoff(int u, int k) {
        const int c = u & 7;
        return 256 * (u >> 3) + 64 * (c >> 1) + 16 * (c & 1) + 8 * (k & 1) + 32 * (k >> 1);
    }
    __device__ static void load(const uint8_t *row, int u, Raw &r) {
        const uint8_t *b = row + 144 * (int64_t)(u >> 3);
        r.c = u & 7;
        r.h = ld_v4(b);
        r.q = ld_v4(b + 16 + 16 * r.c);
    }
    __device__ static void scales(const Raw &r, float *s, float *m) {
        const float d = f16f(r.h.x & 0xffffu), dmin = f16f(r.h.x >> 16);
        const int s0 = 2 * (r.c >> 1);
        int sc0, mn0, sc1, mn1;
        q4k_scale_min_words(r.h.y, r.h.z, r.h.w, s0, sc0, mn0);
        q4k_scale_min_words(r.h.y, r.h.z, r.h.w, s0 + 1, sc1, mn1);
        s[0] = s[1] = d * (float)sc0;
        s[2] = s[3] = d * (float)sc1;
        m[0] = m[1] = -dmin * (float)mn0;
        m[2] = m[3] = -dmin * (float)mn1;
    }
    __device__ static void qrun(const Raw &r, int k, float *q) {
        const uint32_t w0 = (k & 1) ? r.q.z : r.q.x, w1 = (k & 1) ? r.q.w : r.q.y;
        const int sh = 4 * (k >> 1);
        bytes4((w0 >> sh) & 0x0F0F0F0Fu, 0.0f, q);
        bytes4((w1 >> sh) & 0x0F0F0F0Fu, 0.0f, q + 4);
    }
    __device__ static void qrun1p(const Raw &r, int k, float *q) {
        const uint32_t w0 = (k & 1) ? r.q.z : r.q.x, w1 = (k & 1) ? r.q.w : r.q.y;
        const int sh = 4 * (k >> 1);
        nib4_1p((w0 >> sh) & 0x0F0F0F0Fu, q);
        nib4_1p((w1 >> sh) & 0x0F0F0F0Fu, q + 4);
    }
    __device__ static void vals(const Raw &r, int k, float *v) {
        const int s = 2 * (r.c >> 1) + (k >> 1);
        int sc, mn;
        q4k_scale_min_words(r.h.y, r.h.z, r.h.w, s, sc, mn);
        const float d1 = __fmul_rn(f16f(r.h.x & 0xffffu), (float)sc), m1 = __fmul_rn(f16f(r.h.x >> 16), (float)mn);
        qrun(r, k, v);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fsub_rn(__fmul_rn(d1, v[j]), m1);
    }
};

/* q6_K (210 B: ql[128], qh[64], scales[16] int8, d; element 128h + 32g + l (h < 2, g < 4, l < 32) has low 4 bits
 * in ql[64h + l + 32(g&1)] (high nibble when g >= 2), high 2 bits at bit 2g of qh[32h + l], scale
 * scales[8h + l/16 + 2g]; value = d * scale * (q - 32)).
 * unit = (h, l-quarter lq) of a block: c = u & 7, h = c/4, lq = c%4, l in 8lq .. 8lq+7 = 32 elements; run g covers
 * elements 128h + 32g + 8lq .. +7. */
struct t_q6_K {
    static constexpr int QK = 256, RUNS = 4, ALIGN = 4, UNROLL = 1; /* 13 loads per unit already */
    static constexpr bool HAS_SCALE = true, HAS_MIN = false;
    struct Raw {
        uint32_t qa[2], qb[2], qh[2], sc[2], d;
        int c;
    };
    __device__ static int units(int cols) { return cols / 32; }
    __device__ static int xoff(int u, int k) {
        const int c = u & 7;
        return 256 * (u >> 3) + 128 * (c >> 2) + 32 * k + 8 * (c & 3);
    }
    __device__ static void load(const uint8_t *row, int u, Raw &r) {
        const uint8_t *b = row + 210 * (int64_t)(u >> 3);
        const int c = u & 7, h = c >> 2, lq = c & 3;
        r.c = c;
        ld_words_a2<2>(b + 64 * h + 8 * lq, r.qa);
        ld_words_a2<2>(b + 64 * h + 32 + 8 * lq, r.qb);
        ld_words_a2<2>(b + 128 + 32 * h + 8 * lq, r.qh);
        ld_words_a2<2>(b + 192 + 8 * h, r.sc);
        r.d = ld_u16(b + 208);
    }
    /* signed scale of run g: scales[8h + lq/2 + 2g] = byte (lq/2 + 2(g&1)) of word g/2 of r.sc */
    __device__ static int scale_of(const Raw &r, int g) {
        const uint32_t w = (g >> 1) ? r.sc[1] : r.sc[0];
        const int byte = ((r.c & 3) >> 1) + 2 * (g & 1);
        return (int)(w << (24 - 8 * byte)) >> 24;
    }
    __device__ static void scales(const Raw &r, float *s, float *) {
        const float d = f16f(r.d);
#pragma unroll
        for (int g = 0; g < 4; g++) s[g] = d * (float)scale_of(r, g);
    }
    __device__ static void qrun(const Raw &r, int g, float *q) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t ql = (g & 1) ? r.qb[i] : r.qa[i];
            const uint32_t lo = (ql >> (4 * (g >> 1))) & 0x0F0F0F0Fu;
            const uint32_t hi = ((r.qh[i] >> (2 * g)) & 0x03030303u) << 4;
            bytes4(lo | hi, 32.0f, q + 4 * i);
        }
    }
    __device__ static void vals(const Raw &r, int g, float *v) {
        const float ds = __fmul_rn(f16f(r.d), (float)scale_of(r, g));
        qrun(r, g, v);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fmul_rn(ds, v[j]);
    }
};

} /* namespace tmq */

/* Expands F(trait) for the weight type number t (a switch; `default:` is left to the caller). The GGUF types, whose
 * rows carry their scales: dequant and embed take these; the GEMV also takes fp8 (TMQ_GEMV_TYPE_CASES). */
#define TMQ_TYPE_CASES(t, F)                                                                                       \
    case TM_DT_F32: F(tmq::t_f32); break;                                                                          \
    case TM_DT_F16: F(tmq::t_f16); break;                                                                          \
    case TM_DT_BF16: F(tmq::t_bf16); break;                                                                        \
    case TM_DT_Q8_0: F(tmq::t_q8_0); break;                                                                        \
    case TM_DT_Q4_0: F(tmq::t_q4_0); break;                                                                        \
    case TM_DT_Q4_1: F(tmq::t_q4_1); break;                                                                        \
    case TM_DT_Q4_K: F(tmq::t_q4_K); break;                                                                        \
    case TM_DT_Q6_K: F(tmq::t_q6_K); break;

#define TMQ_GEMV_TYPE_CASES(t, F)                                                                                  \
    TMQ_TYPE_CASES(t, F)                                                                                           \
    case TM_DT_FP8_E4M3: F(tmq::t_fp8); break;

namespace tmq {
/* the byte alignment the unit (v2) kernels need for a row of weight type t (blocks read at fixed offsets); 0 for a
 * type they do not know */
static inline int unit_align(int32_t type) {
    int align = 0;
    switch (type) {
#define TMQ_ALIGN(T) align = T::ALIGN
        TMQ_GEMV_TYPE_CASES(type, TMQ_ALIGN)
#undef TMQ_ALIGN
    default: break;
    }
    return align;
}
} /* namespace tmq */

#endif /* TM_CUDA_DEQUANT_CUH */
