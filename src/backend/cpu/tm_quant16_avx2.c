/* tm_quant16_avx2.c -- AVX2/FMA/F16C dot kernels against 16-bit activation blocks (only after tm_cpu_use_avx2()). */
#include "backend/cpu/tm_quant16.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Design. Weights are widened to int16 and multiplied with the int16 activations by vpmaddwd (16 products
 * -> 8 int32 pair sums), so every per-block sum is exact. One kernel body, instantiated for nr = 1..8
 * activation rows, serves vec_dot (nr = 1) and the multi-row entry: each weight block is unpacked once
 * and reused for all rows, and because every row runs the very same float operations in the same order,
 * the multi-row results are bit-identical to vec_dot.
 *  - 32-element blocks (Q8_0, Q4_0, Q4_1): a block's int32 lane sums are converted to f32 and scaled;
 *    four blocks are chained (one mul, three FMAs) before one add into the row's accumulator, which keeps
 *    the FMA latency chain of a single row short. Q8_0/Q4_0 scale by d_a (broadcast from the activation
 *    block) and then d_w (the group's four weight scales, shared by all rows); Q4_1 forms the group's
 *    [d_w d_a, m_w d_a] pairs per row with one vector multiply, and its m_w d_a sum_a terms ride in the
 *    odd lanes of the accumulator. Q4_0's offset 8 is subtracted from the int16 weights.
 *  - K-quants: the sub-block scales are integers, so the weights are multiplied by them in int16 (Q4_K:
 *    q * sc <= 945, Q6_K: |(q - 32) * sc| <= 4096) and a whole super-block (Q4_K; per lane at most
 *    8 * 4 * 945 * 32767 < 2^31) or half super-block (Q6_K; per lane at most 16 * 4096 * 32767 < 2^31)
 *    accumulates in int32 before one conversion. Q4_K's mins use the activation bsums (in f32).
 * Measured on the 2-core Zen 4 (bench/bench_quant16.c): the dot core needs two vpmaddwd and two 32-byte
 * activation loads per 32 elements where the 8-bit kernels need one vpmaddubsw and one load, so a single
 * row costs 1.1-2x the Q8 kernel; the multi-row tile gains 1.3-1.8x per row over separate vec_dot calls. */

#define TM_AI static inline __attribute__((always_inline))
#define TM_UNROLL _Pragma("GCC unroll 8")

/* ---- helpers ------------------------------------------------------------------------------------- */

TM_AI __m256i ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
TM_AI __m128i ld128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

TM_AI float ldf(const void *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

TM_AI uint64_t ldu16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

TM_AI uint64_t ldu32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

TM_AI float f16(const void *p) { return _cvtsh_ss((unsigned short)ldu16(p)); }

TM_AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TM_AI __m256i bcast32(const int32_t *p) { return _mm256_broadcastd_epi32(_mm_loadu_si32(p)); }

#define TM_ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

#define ACT(base, stride, r) ((const uint8_t *)(base) + (size_t)(r) * (stride))

/* ---- activation quantizers (bit-identical to tm_quant16.c) ---------------------------------------- */

/* 8 floats -> 8 int32 round-half-even(x / d), the quotient in double (bit-identical to the scalar code) */
TM_AI __m256i q16x8(const float *x, __m256d vd, __m256d lo, __m256d hi) {
    const __m256 v = _mm256_loadu_ps(x);
    const __m256d qa = _mm256_div_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vd);
    const __m256d qb = _mm256_div_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vd);
    const __m256d a = _mm256_min_pd(_mm256_max_pd(qa, lo), hi), b = _mm256_min_pd(_mm256_max_pd(qb, lo), hi);
    const __m128i ia = _mm256_cvtpd_epi32(_mm256_round_pd(a, TM_ROUND_NEAREST));
    const __m128i ib = _mm256_cvtpd_epi32(_mm256_round_pd(b, TM_ROUND_NEAREST));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(ia), ib, 1);
}

/* nq (a multiple of 16) floats -> qs with one scale; returns d. bsums (per 16 elements) may be NULL. */
static float quant16(const float *x, int nq, int16_t *qs, int32_t *sum, int32_t *bsums) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < nq; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
        const __m256 z = _mm256_sub_ps(v, v); /* NaN exactly where v is NaN or infinite */
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float d = _mm_cvtss_f32(h) / 32767.0f;
    const int finite = _mm256_movemask_ps(bad) == 0;
    if (!finite || d == 0.0f) {
        memset(qs, 0, (size_t)nq * sizeof *qs);
        *sum = 0;
        if (bsums) memset(bsums, 0, (size_t)(nq / 16) * sizeof *bsums);
        return finite ? 0.0f : NAN;
    }
    const __m256d vd = _mm256_set1_pd((double)d), lo = _mm256_set1_pd(-32767.0), hi = _mm256_set1_pd(32767.0);
    __m256i total = _mm256_setzero_si256();
    for (int j = 0; j < nq; j += 16) {
        const __m256i i0 = q16x8(x + j, vd, lo, hi), i1 = q16x8(x + j + 8, vd, lo, hi);
        /* packs works per 128-bit lane: [i0 lo, i1 lo | i0 hi, i1 hi] -> restore the element order */
        _mm256_storeu_si256((__m256i *)(qs + j), _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
        const __m256i s = _mm256_add_epi32(i0, i1);
        total = _mm256_add_epi32(total, s);
        if (bsums) {
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
            bsums[j / 16] = _mm_cvtsi128_si32(t);
        }
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
    *sum = _mm_cvtsi128_si32(t);
    return d;
}

static void act_q16(const float *x, void *vy, int64_t n) {
    tm_block_q16 *y = vy;
    for (int64_t i = 0; i < n / 32; i++) y[i].d = quant16(x + 32 * i, 32, y[i].qs, &y[i].sum, NULL);
}

static void act_q16_K(const float *x, void *vy, int64_t n) {
    tm_block_q16_K *y = vy;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        int32_t total;
        y[i].d = quant16(x + TM_QK_K * i, TM_QK_K, y[i].qs, &total, y[i].bsums);
    }
}

/* ---- 32-element blocks: Q8_0, Q4_0, Q4_1 ------------------------------------------------------------ */

enum { K32_Q8_0, K32_Q4_0, K32_Q4_1 };

TM_AI size_t wbytes32(const int T) {
    return T == K32_Q8_0 ? sizeof(tm_block_q8_0) : T == K32_Q4_0 ? sizeof(tm_block_q4_0) : sizeof(tm_block_q4_1);
}

/* one weight block -> int16 w[0] (elements 0..15), w[1] (16..31); Q4_0 already minus 8 */
TM_AI void unpack32(const int T, const uint8_t *b, __m256i *w) {
    if (T == K32_Q8_0) {
        const tm_block_q8_0 *x = (const tm_block_q8_0 *)b;
        w[0] = _mm256_cvtepi8_epi16(ld128(x->qs));
        w[1] = _mm256_cvtepi8_epi16(ld128(x->qs + 16));
    } else {
        const uint8_t *qs = T == K32_Q4_0 ? ((const tm_block_q4_0 *)b)->qs : ((const tm_block_q4_1 *)b)->qs;
        const __m256i t = _mm256_cvtepu8_epi16(ld128(qs));
        w[0] = _mm256_and_si256(t, _mm256_set1_epi16(15));
        w[1] = _mm256_srli_epi16(t, 4);
        if (T == K32_Q4_0) {
            w[0] = _mm256_sub_epi16(w[0], _mm256_set1_epi16(8));
            w[1] = _mm256_sub_epi16(w[1], _mm256_set1_epi16(8));
        }
    }
}

/* exact int32 lane sums of one block: |lane| <= 4 * 128 * 32767 */
TM_AI __m256i isum32(const __m256i *w, const uint8_t *a /* tm_block_q16 */) {
    const tm_block_q16 *y = (const tm_block_q16 *)a;
    return _mm256_add_epi32(_mm256_madd_epi16(w[0], ld256(y->qs)), _mm256_madd_epi16(w[1], ld256(y->qs + 16)));
}

/* four fp16 values stride bytes apart -> 4 floats */
TM_AI __m128 f16x4(const uint8_t *p, size_t stride) {
    const uint64_t v = ldu16(p) | ldu16(p + stride) << 16 | ldu16(p + 2 * stride) << 32 | ldu16(p + 3 * stride) << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/* four fp16 pairs stride bytes apart -> [a0 b0 a1 b1 | a2 b2 a3 b3] */
TM_AI __m256 f16x4x2(const uint8_t *p, size_t stride) {
    const uint64_t lo = ldu32(p) | ldu32(p + stride) << 32, hi = ldu32(p + 2 * stride) | ldu32(p + 3 * stride) << 32;
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* four activation blocks -> [d0 s0 d1 s1 | d2 s2 d3 s3] (d as float bits, s as int32) */
TM_AI __m256i dsum4(const uint8_t *a) {
    const size_t bs = sizeof(tm_block_q16);
    const __m128i lo = _mm_unpacklo_epi64(_mm_loadu_si64(a), _mm_loadu_si64(a + bs));
    const __m128i hi = _mm_unpacklo_epi64(_mm_loadu_si64(a + 2 * bs), _mm_loadu_si64(a + 3 * bs));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* one block outside a run of four (weight block x, its unpacked int16 w0, activation block a): the block's
 * exact sums scaled by d_w d_a into acc, and Q4_1's m_w d_a sum_a on lane 1 */
TM_AI __m256 leftover32(const int T, const uint8_t *x, const __m256i *w0, const uint8_t *a, __m256 acc) {
    const float da = ldf(a);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum32(w0, a)), _mm256_set1_ps(f16(x) * da), acc);
    if (T == K32_Q4_1) {
        int32_t s;
        memcpy(&s, a + offsetof(tm_block_q16, sum), 4);
        const float m = f16(x + 2) * da;
        acc = _mm256_add_ps(acc, _mm256_setr_ps(0.0f, m * (float)s, 0, 0, 0, 0, 0, 0));
    }
    return acc;
}

/* out[r] = dot(weight row w, activation row r) for r < NR. Per row and group of four blocks the float work is
 * fixed (this is what makes every nr give the same bits):
 *   Q8_0, Q4_0: u_k = S_k * d_a,k;  v = u_0 d_w,0 + u_1 d_w,1 + u_2 d_w,2 + u_3 d_w,3 (mul, 3 FMAs); acc += v
 *   Q4_1:       p = [d_w,k d_a,k, m_w,k d_a,k]; acc += (m_w,k d_a,k) * sum_a,k (one FMA on odd lanes);
 *               v = S_0 c_0 + S_1 c_1 + S_2 c_2 + S_3 c_3 with c_k = d_w,k d_a,k; acc += v
 * S_k is block k's exact int32 lane sums converted to f32. Leftover blocks: acc = fma(S, c, acc). */
TM_AI void kern32_at(const int T, const int NR, int64_t nb, const uint8_t *wg, size_t gs, const uint8_t *wt,
                      const uint8_t *act, size_t as, float *out) {
    const size_t wb = wbytes32(T), ab = sizeof(tm_block_q16);
    /* Q4_1, per row: the group's [d_w d_a, m_w d_a] pairs (c_k at index 2k); others: the group's d_w */
    float cst[TM_QUANT16_MULTI_MAX][8] __attribute__((aligned(32)));
    __m256 acc[TM_QUANT16_MULTI_MAX];
    TM_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        const uint8_t *x = wg + (size_t)(i / 4) * gs; /* this row's four blocks i .. i + 3, contiguous */
        if (T == K32_Q4_1) {
            const __m256 wp = f16x4x2(x, wb);
            const __m256 odd = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
            TM_UNROLL for (int r = 0; r < NR; r++) {
                const __m256i v = dsum4(ACT(act, as, r) + (size_t)i * ab);
                const __m256 p = _mm256_mul_ps(wp, _mm256_moveldup_ps(_mm256_castsi256_ps(v)));
                _mm256_store_ps(cst[r], p);
                acc[r] = _mm256_fmadd_ps(p, _mm256_and_ps(_mm256_cvtepi32_ps(v), odd), acc[r]);
            }
        } else {
            _mm_store_ps(cst[0], f16x4(x, wb));
        }
        __m256 t[TM_QUANT16_MULTI_MAX];
        for (int k = 0; k < 4; k++) {
            __m256i wk[2];
            unpack32(T, x + (size_t)k * wb, wk);
            TM_UNROLL for (int r = 0; r < NR; r++) {
                const uint8_t *a = ACT(act, as, r) + (size_t)(i + k) * ab;
                __m256 s = _mm256_cvtepi32_ps(isum32(wk, a));
                __m256 c;
                if (T == K32_Q4_1) {
                    c = _mm256_broadcast_ss(&cst[r][2 * k]);
                } else {
                    s = _mm256_mul_ps(s, _mm256_broadcast_ss((const float *)a));
                    c = _mm256_broadcast_ss(&cst[0][k]);
                }
                t[r] = k == 0 ? _mm256_mul_ps(s, c) : _mm256_fmadd_ps(s, c, t[r]);
            }
        }
        TM_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm256_add_ps(acc[r], t[r]);
    }
    for (const int64_t i0 = i; i < nb; i++) { /* leftover blocks, contiguous from wt */
        const uint8_t *x = wt + (size_t)(i - i0) * wb;
        __m256i w0[2];
        unpack32(T, x, w0);
        TM_UNROLL for (int r = 0; r < NR; r++) acc[r] = leftover32(T, x, w0, ACT(act, as, r) + (size_t)i * ab, acc[r]);
    }
    TM_UNROLL for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]);
}

/* A row-major weight row: runs of four blocks 4 wb apart, the leftover blocks right after them. */
TM_AI void kern32(const int T, const int NR, int64_t nb, const uint8_t *w, const uint8_t *act, size_t as, float *out) {
    const size_t wb = wbytes32(T);
    kern32_at(T, NR, nb, w, 4 * wb, w + (size_t)(nb / 4) * 4 * wb, act, as, out);
}

/* Row k of an x4 group (tm_quant16.h): its runs of four blocks 16 wb apart, its tail after the group's runs. */
TM_AI void kern32_x4row(const int T, const int NR, int64_t nb, const uint8_t *g, int k, const uint8_t *act, size_t as,
                        float *out) {
    const size_t wb = wbytes32(T), nq = (size_t)(nb / 4), tail = (size_t)(nb % 4);
    kern32_at(T, NR, nb, g + (size_t)k * 4 * wb, 16 * wb, g + nq * 16 * wb + (size_t)k * tail * wb, act, as, out);
}

/* The four rows of one x4 group (tm_quant16.h) against one activation row: per row exactly kern32's NR = 1 float
 * sequence (so the bits equal vec_dot's). The activation side of each block is loaded once for the four rows,
 * and the weights come as one sequential stream: run q of four blocks holds row 0's, then row 1's, ... */
TM_AI void kern32_x4(const int T, const int NR, int64_t nb, const uint8_t *g, const uint8_t *act, size_t as,
                      float *out) {
    const size_t wb = wbytes32(T), ab = sizeof(tm_block_q16);
    const int64_t nq = nb / 4, tail = nb % 4;
    float cst[4][2][8] __attribute__((aligned(32)));
    __m256 acc[4][2];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t q = 0; q < nq; q++) {
        const uint8_t *x = g + (size_t)q * 16 * wb;
        if (T == K32_Q4_1) {
            TM_UNROLL for (int c = 0; c < NR; c++) {
                const __m256i v = dsum4(ACT(act, as, c) + (size_t)(4 * q) * ab);
                const __m256 dup = _mm256_moveldup_ps(_mm256_castsi256_ps(v));
                const __m256 sa = _mm256_and_ps(_mm256_cvtepi32_ps(v),
                                                _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1)));
                TM_UNROLL for (int r = 0; r < 4; r++) {
                    const __m256 p = _mm256_mul_ps(f16x4x2(x + (size_t)r * 4 * wb, wb), dup);
                    _mm256_store_ps(cst[r][c], p);
                    acc[r][c] = _mm256_fmadd_ps(p, sa, acc[r][c]);
                }
            }
        } else {
            TM_UNROLL for (int r = 0; r < 4; r++) _mm_store_ps(cst[r][0], f16x4(x + (size_t)r * 4 * wb, wb));
        }
        __m256 t[4][2];
        for (int k = 0; k < 4; k++) {
            __m256i a0[2], a1[2];
            TM_UNROLL for (int c = 0; c < NR; c++) {
                const tm_block_q16 *ak = (const tm_block_q16 *)(ACT(act, as, c) + (size_t)(4 * q + k) * ab);
                a0[c] = ld256(ak->qs);
                a1[c] = ld256(ak->qs + 16);
            }
            TM_UNROLL for (int r = 0; r < 4; r++) {
                __m256i wk[2];
                unpack32(T, x + (size_t)(4 * r + k) * wb, wk);
                TM_UNROLL for (int c = 0; c < NR; c++) {
                    /* isum32's sums, with each activation block loaded once for the four rows */
                    __m256 sv = _mm256_cvtepi32_ps(
                        _mm256_add_epi32(_mm256_madd_epi16(wk[0], a0[c]), _mm256_madd_epi16(wk[1], a1[c])));
                    __m256 cf;
                    if (T == K32_Q4_1) {
                        cf = _mm256_broadcast_ss(&cst[r][c][2 * k]);
                    } else {
                        sv = _mm256_mul_ps(sv, _mm256_broadcast_ss((const float *)(ACT(act, as, c) + (size_t)(4 * q + k) * ab)));
                        cf = _mm256_broadcast_ss(&cst[r][0][k]);
                    }
                    t[r][c] = k == 0 ? _mm256_mul_ps(sv, cf) : _mm256_fmadd_ps(sv, cf, t[r][c]);
                }
            }
        }
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < NR; c++) acc[r][c] = _mm256_add_ps(acc[r][c], t[r][c]);
    }
    for (int64_t j = 0; j < tail; j++) { /* the row tails, as kern32's leftover blocks */
        for (int r = 0; r < 4; r++) {
            const uint8_t *x = g + (size_t)nq * 16 * wb + ((size_t)r * (size_t)tail + (size_t)j) * wb;
            __m256i w0[2];
            unpack32(T, x, w0);
            for (int c = 0; c < NR; c++)
                acc[r][c] = leftover32(T, x, w0, ACT(act, as, c) + (size_t)(4 * nq + j) * ab, acc[r][c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NR; c++) out[(size_t)c * 4 + (size_t)r] = hsum8(acc[r][c]);
}

#define DEF_X4(name, T)                                                                                        \
    static void x4_##name(int64_t n, const void *g, const void *a, size_t as, int nr, float *out) {            \
        if (nr == 2) kern32_x4(T, 2, n / 32, g, a, as, out);                                                   \
        else kern32_x4(T, 1, n / 32, g, a, as, out);                                                           \
    }
DEF_X4(q8_0, K32_Q8_0)
DEF_X4(q4_0, K32_Q4_0)
DEF_X4(q4_1, K32_Q4_1)

#define DEF_X4ROW(name, T)                                                                                     \
    static void x4row_##name(int64_t n, const void *g, int k, const void *a, size_t as, int nr, float *out) {  \
        switch (nr) {                                                                                          \
        case 1: kern32_x4row(T, 1, n / 32, g, k, a, as, out); break;                                           \
        case 2: kern32_x4row(T, 2, n / 32, g, k, a, as, out); break;                                           \
        case 3: kern32_x4row(T, 3, n / 32, g, k, a, as, out); break;                                           \
        case 4: kern32_x4row(T, 4, n / 32, g, k, a, as, out); break;                                           \
        case 5: kern32_x4row(T, 5, n / 32, g, k, a, as, out); break;                                           \
        case 6: kern32_x4row(T, 6, n / 32, g, k, a, as, out); break;                                           \
        case 7: kern32_x4row(T, 7, n / 32, g, k, a, as, out); break;                                           \
        case 8: kern32_x4row(T, 8, n / 32, g, k, a, as, out); break;                                           \
        default: break;                                                                                        \
        }                                                                                                      \
    }
DEF_X4ROW(q8_0, K32_Q8_0)
DEF_X4ROW(q4_0, K32_Q4_0)
DEF_X4ROW(q4_1, K32_Q4_1)

/* ---- Q4_K x Q16_K ------------------------------------------------------------------------------- */

/* Q4_K super-block decoding shared by the kernels: 6-bit scales and mins (ggml's get_scale_min_k4 layout) decoded
 * four at a time; scp holds the sub-block scales as int16 pairs (one 32-bit broadcast fills a vector with sc),
 * mf0/mf1 dmin * m_j once per bsum (each sub-block's two bsums; exact in f32: 6 x 11 bits), vd = d. */
TM_AI void q4K_head(const tm_block_q4_K *x, int32_t *scp, __m256 *mf0, __m256 *mf1, __m256 *vd) {
    const uint32_t w0 = (uint32_t)ldu32(x->scales), w1 = (uint32_t)ldu32(x->scales + 4), w2 = (uint32_t)ldu32(x->scales + 8);
    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)(sc_lo | (uint64_t)sc_hi << 32)));
    _mm_store_si128((__m128i *)scp, _mm_unpacklo_epi16(sc16, sc16));
    _mm_store_si128((__m128i *)(scp + 4), _mm_unpackhi_epi16(sc16, sc16));
    const __m128i mn = _mm_cvtsi64_si128((long long)(mn_lo | (uint64_t)mn_hi << 32));
    const __m128i mn2 = _mm_unpacklo_epi8(mn, mn);
    const __m256 vdmin = _mm256_set1_ps(f16(&x->dmin));
    *vd = _mm256_set1_ps(f16(&x->d));
    *mf0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn2)), vdmin);
    *mf1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn2, 8))), vdmin);
}

/* sub-block j's weights times its scale, as int16: sub-block 2j is the low nibbles of qs[32j .. 32j+31], 2j+1
 * the high nibbles */
TM_AI void q4K_sub(const tm_block_q4_K *x, const int32_t *scp, int j, __m256i *w0, __m256i *w1) {
    const __m256i t0 = _mm256_cvtepu8_epi16(ld128(x->qs + 32 * (j / 2)));
    const __m256i t1 = _mm256_cvtepu8_epi16(ld128(x->qs + 32 * (j / 2) + 16));
    const __m256i m4 = _mm256_set1_epi16(15), sc = bcast32(&scp[j]);
    *w0 = _mm256_mullo_epi16(j & 1 ? _mm256_srli_epi16(t0, 4) : _mm256_and_si256(t0, m4), sc);
    *w1 = _mm256_mullo_epi16(j & 1 ? _mm256_srli_epi16(t1, 4) : _mm256_and_si256(t1, m4), sc);
}

/* acc += d_a * (d * isum - sum_k dmin m_k bsums_k) for one activation super-block y */
TM_AI __m256 q4K_tail(const tm_block_q16_K *y, __m256i isum, __m256 mf0, __m256 mf1, __m256 vd, __m256 acc) {
    const __m256 m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ld256(y->bsums)), mf0,
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(ld256(y->bsums + 8)), mf1));
    const __m256 z = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum), vd, m);
    return _mm256_fmadd_ps(z, _mm256_broadcast_ss(&y->d), acc);
}

/* one weight row whose super-blocks stand ss bytes apart (row-major: sizeof(tm_block_q4_K); row k of an x4
 * group: 4 x that) against NR activation rows */
TM_AI void kern_q4_K(const int NR, int64_t nb, const uint8_t *w, size_t ss, const uint8_t *act, size_t as, float *out) {
    const size_t ab = sizeof(tm_block_q16_K);
    __m256 acc[TM_QUANT16_MULTI_MAX];
    TM_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const tm_block_q4_K *x = (const tm_block_q4_K *)(w + (size_t)i * ss);
        int32_t scp[8] __attribute__((aligned(32)));
        __m256 mf0, mf1, vd;
        q4K_head(x, scp, &mf0, &mf1, &vd);
        __m256i iacc[TM_QUANT16_MULTI_MAX];
        TM_UNROLL for (int r = 0; r < NR; r++) iacc[r] = _mm256_setzero_si256();
        /* one 32-element sub-block at a time (two weight registers live beside the row accumulators) */
        for (int j = 0; j < 8; j++) {
            __m256i w0, w1;
            q4K_sub(x, scp, j, &w0, &w1);
            TM_UNROLL for (int r = 0; r < NR; r++) {
                const int16_t *a = ((const tm_block_q16_K *)(ACT(act, as, r) + (size_t)i * ab))->qs + 32 * j;
                iacc[r] = _mm256_add_epi32(iacc[r], _mm256_add_epi32(_mm256_madd_epi16(w0, ld256(a)),
                                                                     _mm256_madd_epi16(w1, ld256(a + 16))));
            }
        }
        TM_UNROLL for (int r = 0; r < NR; r++)
            acc[r] = q4K_tail((const tm_block_q16_K *)(ACT(act, as, r) + (size_t)i * ab), iacc[r], mf0, mf1, vd, acc[r]);
    }
    TM_UNROLL for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]);
}

/* The four rows of a Q4_K x4 group (super-block i of rows 0..3 one after another) against NR (1..2) activation
 * rows: per (row, activation row) exactly kern_q4_K's integer and float sequence, each activation sub-block
 * loaded once for the four rows. out[c * 4 + k]. */
TM_AI void kern_q4_K_x4(const int NR, int64_t nb, const uint8_t *g, const uint8_t *act, size_t as, float *out) {
    const size_t ab = sizeof(tm_block_q16_K), sb = sizeof(tm_block_q4_K);
    __m256 acc[4][2];
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < NR; c++) acc[k][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        int32_t scp[4][8] __attribute__((aligned(32)));
        __m256 mf0[4], mf1[4], vd[4];
        TM_UNROLL for (int k = 0; k < 4; k++)
            q4K_head((const tm_block_q4_K *)(g + (size_t)(4 * i + k) * sb), scp[k], &mf0[k], &mf1[k], &vd[k]);
        __m256i iacc[4][2];
        for (int k = 0; k < 4; k++)
            for (int c = 0; c < NR; c++) iacc[k][c] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i a0[2], a1[2];
            TM_UNROLL for (int c = 0; c < NR; c++) {
                const int16_t *a = ((const tm_block_q16_K *)(ACT(act, as, c) + (size_t)i * ab))->qs + 32 * j;
                a0[c] = ld256(a);
                a1[c] = ld256(a + 16);
            }
            TM_UNROLL for (int k = 0; k < 4; k++) {
                __m256i w0, w1;
                q4K_sub((const tm_block_q4_K *)(g + (size_t)(4 * i + k) * sb), scp[k], j, &w0, &w1);
                TM_UNROLL for (int c = 0; c < NR; c++)
                    iacc[k][c] = _mm256_add_epi32(iacc[k][c], _mm256_add_epi32(_mm256_madd_epi16(w0, a0[c]),
                                                                               _mm256_madd_epi16(w1, a1[c])));
            }
        }
        for (int k = 0; k < 4; k++)
            for (int c = 0; c < NR; c++)
                acc[k][c] = q4K_tail((const tm_block_q16_K *)(ACT(act, as, c) + (size_t)i * ab), iacc[k][c], mf0[k],
                                     mf1[k], vd[k], acc[k][c]);
    }
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < NR; c++) out[c * 4 + k] = hsum8(acc[k][c]);
}

static void x4_q4_K(int64_t n, const void *g, const void *a, size_t as, int nr, float *out) {
    if (nr == 2) kern_q4_K_x4(2, n / TM_QK_K, g, a, as, out);
    else kern_q4_K_x4(1, n / TM_QK_K, g, a, as, out);
}

/* prefill over a Q4_K x4 group: row k's super-blocks stand 4 apart */
static void x4row_q4_K(int64_t n, const void *g, int k, const void *a, size_t as, int nr, float *out) {
    const uint8_t *w = (const uint8_t *)g + (size_t)k * sizeof(tm_block_q4_K);
    const size_t ss = 4 * sizeof(tm_block_q4_K);
    switch (nr) {
    case 1: kern_q4_K(1, n / TM_QK_K, w, ss, a, as, out); break;
    case 2: kern_q4_K(2, n / TM_QK_K, w, ss, a, as, out); break;
    case 3: kern_q4_K(3, n / TM_QK_K, w, ss, a, as, out); break;
    case 4: kern_q4_K(4, n / TM_QK_K, w, ss, a, as, out); break;
    case 5: kern_q4_K(5, n / TM_QK_K, w, ss, a, as, out); break;
    case 6: kern_q4_K(6, n / TM_QK_K, w, ss, a, as, out); break;
    case 7: kern_q4_K(7, n / TM_QK_K, w, ss, a, as, out); break;
    case 8: kern_q4_K(8, n / TM_QK_K, w, ss, a, as, out); break;
    default: break;
    }
}


/* ---- Q6_K x Q16_K ------------------------------------------------------------------------------- */

TM_AI void kern_q6_K(const int NR, int64_t nb, const uint8_t *w, const uint8_t *act, size_t as, float *out) {
    const size_t ab = sizeof(tm_block_q16_K);
    __m256 acc[TM_QUANT16_MULTI_MAX];
    TM_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const tm_block_q6_K *x = (const tm_block_q6_K *)(w + (size_t)i * sizeof(tm_block_q6_K));
        /* sub-block scales as int16 pairs: scp[k] for sub-block k */
        int32_t scp[16] __attribute__((aligned(32)));
        const __m128i sb = ld128(x->scales);
        const __m128i s_lo = _mm_cvtepi8_epi16(sb), s_hi = _mm_cvtepi8_epi16(_mm_srli_si128(sb, 8));
        _mm_store_si128((__m128i *)scp, _mm_unpacklo_epi16(s_lo, s_lo));
        _mm_store_si128((__m128i *)(scp + 4), _mm_unpackhi_epi16(s_lo, s_lo));
        _mm_store_si128((__m128i *)(scp + 8), _mm_unpacklo_epi16(s_hi, s_hi));
        _mm_store_si128((__m128i *)(scp + 12), _mm_unpackhi_epi16(s_hi, s_hi));
        const float d = f16(&x->d);
        for (int h = 0; h < 2; h++) {
            const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
            const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
            const __m256i l0 = ld256(ql), l1 = ld256(ql + 32), hb = ld256(qh);
            __m256i q[4]; /* signed q - 32 of elements 32c .. 32c+31 of this half */
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
            __m256i iacc[TM_QUANT16_MULTI_MAX];
            TM_UNROLL for (int r = 0; r < NR; r++) iacc[r] = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                const __m256i qc = _mm256_sub_epi8(q[c], k32);
                const __m256i w0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(qc)),
                                                      bcast32(&scp[8 * h + 2 * c]));
                const __m256i w1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(qc, 1)),
                                                      bcast32(&scp[8 * h + 2 * c + 1]));
                TM_UNROLL for (int r = 0; r < NR; r++) {
                    const tm_block_q16_K *y = (const tm_block_q16_K *)(ACT(act, as, r) + (size_t)i * ab);
                    const int16_t *a = y->qs + 128 * h + 32 * c;
                    iacc[r] = _mm256_add_epi32(iacc[r], _mm256_add_epi32(_mm256_madd_epi16(w0, ld256(a)),
                                                                         _mm256_madd_epi16(w1, ld256(a + 16))));
                }
            }
            TM_UNROLL for (int r = 0; r < NR; r++) {
                const float da = ldf(ACT(act, as, r) + (size_t)i * ab);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_set1_ps(da * d), acc[r]);
            }
        }
    }
    TM_UNROLL for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]);
}

/* ---- entry points ------------------------------------------------------------------------------- */

#define DEF_ENTRIES(name, CALL)                                                                                \
    static float dot_##name(int64_t n, const void *w, const void *a) {                                         \
        float out;                                                                                             \
        CALL(1, n, w, a, 0, &out);                                                                             \
        return out;                                                                                            \
    }                                                                                                          \
    static void multi_##name(int64_t n, const void *w, const void *a, size_t as, int nr, float *out) {          \
        switch (nr) {                                                                                          \
        case 1: CALL(1, n, w, a, as, out); break;                                                              \
        case 2: CALL(2, n, w, a, as, out); break;                                                              \
        case 3: CALL(3, n, w, a, as, out); break;                                                              \
        case 4: CALL(4, n, w, a, as, out); break;                                                              \
        case 5: CALL(5, n, w, a, as, out); break;                                                              \
        case 6: CALL(6, n, w, a, as, out); break;                                                              \
        case 7: CALL(7, n, w, a, as, out); break;                                                              \
        case 8: CALL(8, n, w, a, as, out); break;                                                              \
        default: break;                                                                                        \
        }                                                                                                      \
    }

#define CALL_Q8_0(NR, n, w, a, as, out) kern32(K32_Q8_0, NR, (n) / 32, w, a, as, out)
#define CALL_Q4_0(NR, n, w, a, as, out) kern32(K32_Q4_0, NR, (n) / 32, w, a, as, out)
#define CALL_Q4_1(NR, n, w, a, as, out) kern32(K32_Q4_1, NR, (n) / 32, w, a, as, out)
#define CALL_Q4_K(NR, n, w, a, as, out) kern_q4_K(NR, (n) / TM_QK_K, w, sizeof(tm_block_q4_K), a, as, out)
#define CALL_Q6_K(NR, n, w, a, as, out) kern_q6_K(NR, (n) / TM_QK_K, w, a, as, out)

DEF_ENTRIES(q8_0, CALL_Q8_0)
DEF_ENTRIES(q4_0, CALL_Q4_0)
DEF_ENTRIES(q4_1, CALL_Q4_1)
DEF_ENTRIES(q4_K, CALL_Q4_K)
DEF_ENTRIES(q6_K, CALL_Q6_K)

/* Activation rows per column chunk: a chunk stays in L2 while the weight rows stream past it. */
#define TM_Q16_ACT_CHUNK_BYTES (256u * 1024u)

/* Many dots: decode (one activation row) is one vec_dot per weight row; prefill runs the multi-row kernel
 * on tiles of one weight row x up to 8 activation rows, so each weight block is unpacked once per tile. */
#define DEF_MAT(name)                                                                                          \
    static void mat_##name(int64_t n, int64_t nr, const void *w, size_t ws, int64_t nc, const void *a, size_t as, \
                           float *out, size_t os) {                                                            \
        if (nc == 1) {                                                                                         \
            for (int64_t r = 0; r < nr; r++) out[r] = dot_##name(n, ACT(w, ws, r), a);                         \
            return;                                                                                            \
        }                                                                                                      \
        int64_t chunk = as ? (int64_t)(TM_Q16_ACT_CHUNK_BYTES / as) : nc;                                      \
        chunk -= chunk % TM_QUANT16_MULTI_MAX;                                                                 \
        if (chunk < TM_QUANT16_MULTI_MAX) chunk = TM_QUANT16_MULTI_MAX;                                        \
        for (int64_t c0 = 0; c0 < nc; c0 += chunk) {                                                           \
            const int64_t c1 = c0 + chunk < nc ? c0 + chunk : nc;                                              \
            for (int64_t r = 0; r < nr; r++) {                                                                 \
                for (int64_t c = c0; c < c1; c += TM_QUANT16_MULTI_MAX) {                                      \
                    const int k = (int)(c1 - c < TM_QUANT16_MULTI_MAX ? c1 - c : TM_QUANT16_MULTI_MAX);        \
                    float v[TM_QUANT16_MULTI_MAX];                                                             \
                    multi_##name(n, ACT(w, ws, r), ACT(a, as, c), as, k, v);                                   \
                    for (int j = 0; j < k; j++) out[(size_t)(c + j) * os + (size_t)r] = v[j];                  \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

DEF_MAT(q8_0)
DEF_MAT(q4_0)
DEF_MAT(q4_1)
DEF_MAT(q4_K)
DEF_MAT(q6_K)

static const tm_quant_ops k_avx2_16[] = {
    {TM_DT_Q8_0, TM_DT_Q16, act_q16, dot_q8_0, mat_q8_0},
    {TM_DT_Q4_0, TM_DT_Q16, act_q16, dot_q4_0, mat_q4_0},
    {TM_DT_Q4_1, TM_DT_Q16, act_q16, dot_q4_1, mat_q4_1},
    {TM_DT_Q4_K, TM_DT_Q16_K, act_q16_K, dot_q4_K, mat_q4_K},
    {TM_DT_Q6_K, TM_DT_Q16_K, act_q16_K, dot_q6_K, mat_q6_K},
};

const tm_quant_ops *tm_quant16_ops_avx2(tm_dtype t) {
    return tm_quant_ops_find(k_avx2_16, sizeof k_avx2_16 / sizeof k_avx2_16[0], t);
}

tm_vec_dot_x4_fn tm_quant16_x4_avx2(tm_dtype t) {
    switch (t) {
    case TM_DT_Q8_0: return x4_q8_0;
    case TM_DT_Q4_0: return x4_q4_0;
    case TM_DT_Q4_1: return x4_q4_1;
    case TM_DT_Q4_K: return x4_q4_K;
    default: return NULL;
    }
}

tm_vec_dot_x4row_fn tm_quant16_x4row_avx2(tm_dtype t) {
    switch (t) {
    case TM_DT_Q8_0: return x4row_q8_0;
    case TM_DT_Q4_0: return x4row_q4_0;
    case TM_DT_Q4_1: return x4row_q4_1;
    case TM_DT_Q4_K: return x4row_q4_K;
    default: return NULL;
    }
}

tm_vec_dot_multi_fn tm_quant16_multi_avx2(tm_dtype t) {
    switch (t) {
    case TM_DT_Q8_0: return multi_q8_0;
    case TM_DT_Q4_0: return multi_q4_0;
    case TM_DT_Q4_1: return multi_q4_1;
    case TM_DT_Q4_K: return multi_q4_K;
    case TM_DT_Q6_K: return multi_q6_K;
    default: return NULL;
    }
}

#else /* not built with AVX2/FMA/F16C */

const tm_quant_ops *tm_quant16_ops_avx2(tm_dtype t) {
    (void)t;
    return NULL;
}

tm_vec_dot_x4_fn tm_quant16_x4_avx2(tm_dtype t) {
    (void)t;
    return NULL;
}

tm_vec_dot_x4row_fn tm_quant16_x4row_avx2(tm_dtype t) {
    (void)t;
    return NULL;
}

tm_vec_dot_multi_fn tm_quant16_multi_avx2(tm_dtype t) {
    (void)t;
    return NULL;
}

#endif
