/* tm_quant_avx2.c -- AVX2/FMA/F16C dot kernels and activation quantizers (reached only after tm_cpu_use_avx2()). */
#include "backend/cpu/tm_quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------------- */

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* horizontal sums of four vectors -> one __m128 {sum(a), sum(b), sum(c), sum(d)} */
static inline __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31) */
static inline __m256i nibbles32(const uint8_t *p) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(t, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

static inline __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

#define PW(base, stride, r) ((const uint8_t *)(base) + (size_t)(r) * (stride))

/* prefill: activation rows of up to this many bytes per column chunk stay in L2 while weight rows stream */
#define TM_ACT_CHUNK_BYTES (192u * 1024u)

/* ---- activation quantizers (bit-identical to tm_quant_act_* in tm_quant.c) ----------------------- */

static inline float amax32(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8)));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 16)));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 24)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* quantize 32 floats by id (round half to even) into 32 int8; returns the 8 int32 partial sums */
static inline __m256i q8_32(const float *x, float id, int8_t *out) {
    const __m256 m = _mm256_set1_ps(id);
#define TM_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), m), TM_RNE));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), m), TM_RNE));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16), m), TM_RNE));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 24), m), TM_RNE));
#undef TM_RNE
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    /* packs work per 128-bit lane: fix the order with a dword permute */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
    return sum;
}

/* tm_f32_to_f16 (round to nearest even) through F16C; NaNs take the scalar path (its payload rule) */
static inline uint16_t f32_to_f16(float f) {
    return f == f ? (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT) : tm_f32_to_f16(f);
}

static void act_q8_0(const float *x, void *vy, int64_t n) {
    tm_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / TM_QK8_0; i++, x += TM_QK8_0) {
        const float amax = amax32(x);
        y[i].d = f32_to_f16(amax / 127.0f);
        (void)q8_32(x, amax != 0.0f ? 127.0f / amax : 0.0f, y[i].qs);
    }
}

static void act_q8_1(const float *x, void *vy, int64_t n) {
    tm_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / TM_QK8_1; i++, x += TM_QK8_1) {
        const float amax = amax32(x);
        const float d = amax / 127.0f;
        const __m256i s8 = q8_32(x, amax != 0.0f ? 127.0f / amax : 0.0f, y[i].qs);
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        y[i].d = f32_to_f16(d);
        y[i].s = f32_to_f16(d * (float)_mm_cvtsi128_si32(s));
    }
}

static void act_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

/* ---- float weights ------------------------------------------------------------------------------- */

static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 ld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define FLOAT_DOT(name, T, LOAD, SCALAR)                                                                    \
    static float name(int64_t n, const void *vw, const void *va) {                                          \
        const T *w = vw;                                                                                     \
        const float *a = va;                                                                                 \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                                          \
        int64_t i = 0;                                                                                       \
        for (; i + 32 <= n; i += 32) {                                                                       \
            s0 = _mm256_fmadd_ps(LOAD(w + i), _mm256_loadu_ps(a + i), s0);                                   \
            s1 = _mm256_fmadd_ps(LOAD(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);                           \
            s2 = _mm256_fmadd_ps(LOAD(w + i + 16), _mm256_loadu_ps(a + i + 16), s2);                         \
            s3 = _mm256_fmadd_ps(LOAD(w + i + 24), _mm256_loadu_ps(a + i + 24), s3);                         \
        }                                                                                                    \
        for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(LOAD(w + i), _mm256_loadu_ps(a + i), s0);            \
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));                         \
        for (; i < n; i++) s += SCALAR(w[i]) * a[i];                                                         \
        return s;                                                                                            \
    }

static inline float id_f32(float v) { return v; }
FLOAT_DOT(dot_f32, float, _mm256_loadu_ps, id_f32)
FLOAT_DOT(dot_f16, uint16_t, ld_f16, f16)
FLOAT_DOT(dot_bf16, uint16_t, ld_bf16, tm_bf16_to_f32)

/* Prefill tile for float weights: one weight row x four activation rows, each weight vector converted
 * once for four FMAs (eight accumulators hide the FMA latency). Decode is one vec_dot per row, in order. */
#define FLOAT_MAT(name, dot, T, LOAD, SCALAR)                                                                 \
    static __m128 name##_cols4(int64_t n, const T *w, const float *a0, size_t as) {                           \
        const float *a1 = a0 + as, *a2 = a1 + as, *a3 = a2 + as;                                              \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;        \
        int64_t i = 0;                                                                                         \
        for (; i + 16 <= n; i += 16) {                                                                         \
            const __m256 w0 = LOAD(w + i), w1 = LOAD(w + i + 8);                                               \
            s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a0 + i), s0);                                             \
            s1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a1 + i), s1);                                             \
            s2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a2 + i), s2);                                             \
            s3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a3 + i), s3);                                             \
            t0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a0 + i + 8), t0);                                         \
            t1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a1 + i + 8), t1);                                         \
            t2 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a2 + i + 8), t2);                                         \
            t3 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a3 + i + 8), t3);                                         \
        }                                                                                                      \
        for (; i + 8 <= n; i += 8) {                                                                           \
            const __m256 w0 = LOAD(w + i);                                                                     \
            s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a0 + i), s0);                                             \
            s1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a1 + i), s1);                                             \
            s2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a2 + i), s2);                                             \
            s3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a3 + i), s3);                                             \
        }                                                                                                      \
        __m128 r = hsum8x4(_mm256_add_ps(s0, t0), _mm256_add_ps(s1, t1), _mm256_add_ps(s2, t2), _mm256_add_ps(s3, t3)); \
        if (i < n) {                                                                                           \
            float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                          \
            for (; i < n; i++) {                                                                               \
                const float wi = SCALAR(w[i]);                                                                 \
                tail[0] += wi * a0[i];                                                                         \
                tail[1] += wi * a1[i];                                                                         \
                tail[2] += wi * a2[i];                                                                         \
                tail[3] += wi * a3[i];                                                                         \
            }                                                                                                  \
            r = _mm_add_ps(r, _mm_loadu_ps(tail));                                                             \
        }                                                                                                      \
        return r;                                                                                              \
    }                                                                                                          \
    static void name(int64_t n, int64_t nr, const void *w, size_t ws, int64_t nc, const void *a, size_t as,   \
                     float *out, size_t os) {                                                                  \
        int64_t chunk = as ? (int64_t)(TM_ACT_CHUNK_BYTES / as) & ~(int64_t)3 : nc;                            \
        if (chunk < 4) chunk = 4;                                                                              \
        for (int64_t c0 = 0; c0 < nc; c0 += chunk) {                                                           \
            const int64_t c1 = c0 + chunk < nc ? c0 + chunk : nc;                                              \
            for (int64_t r = 0; r < nr; r++) {                                                                 \
                const T *x = (const T *)PW(w, ws, r);                                                          \
                int64_t c = c0;                                                                                \
                for (; c + 4 <= c1 && as % sizeof(float) == 0; c += 4) {                                       \
                    float v[4];                                                                                \
                    _mm_storeu_ps(v, name##_cols4(n, x, (const float *)PW(a, as, c), as / sizeof(float)));     \
                    for (int k = 0; k < 4; k++) out[(size_t)(c + k) * os + (size_t)r] = v[k];                  \
                }                                                                                              \
                for (; c < c1; c++) out[(size_t)c * os + (size_t)r] = dot(n, x, PW(a, as, c));                 \
            }                                                                                                  \
        }                                                                                                      \
    }

/* ---- 32-element block types: four blocks per step --------------------------------------------------
 * Per group of four blocks the fp16 scales are packed in general-purpose registers (idle integer ALUs)
 * and converted with one vcvtph2ps; the four blocks' partial sums are folded (unpack/add or hadd tree)
 * into one vector [b0 b1 b2 b3 | b0 b1 b2 b3] that takes a single FMA with the matching scale vector.
 * Leftover blocks (a pair, then a single one) add their own scaled vectors to the same accumulator:
 * only the total of all lanes matters. Integer sums are exact, so results differ from the scalar
 * kernels only by float summation order. */

#define TM_AI static inline __attribute__((always_inline))

TM_AI int ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

TM_AI int ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Keep a value in a general-purpose register: scale gathers are cheaper as integer shifts/ors (idle
 * ALUs) plus one vmovq than as vpinsr chains, which compete with the dot products for vector ports. */
#define TM_IN_GPR(v) __asm__("" : "+r"(v))

/* four fp16 scales (stride bytes apart) -> [s0 s1 s2 s3 | s0 s1 s2 s3] */
TM_AI __m256 scales4(const void *vp, size_t stride) {
    const uint8_t *p = vp;
    uint64_t a = (uint64_t)ld16(p), b = (uint64_t)ld16(p + stride), c = (uint64_t)ld16(p + 2 * stride),
             d = (uint64_t)ld16(p + 3 * stride);
    TM_IN_GPR(a);
    TM_IN_GPR(b);
    TM_IN_GPR(c);
    TM_IN_GPR(d);
    uint64_t v = a | (b << 16) | (c << 32) | (d << 48);
    TM_IN_GPR(v);
    const __m128i h = _mm_cvtsi64_si128((long long)v);
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(h, h));
}

/* four pairs of fp16 (d and m, or d and s; stride bytes apart) -> [d0 m0 d1 m1 d2 m2 d3 m3] */
TM_AI __m256 pairs4(const void *vp, size_t stride) {
    const uint8_t *p = vp;
    uint64_t a = (uint32_t)ld32(p), b = (uint32_t)ld32(p + stride), c = (uint32_t)ld32(p + 2 * stride),
             d = (uint32_t)ld32(p + 3 * stride);
    TM_IN_GPR(a);
    TM_IN_GPR(b);
    TM_IN_GPR(c);
    TM_IN_GPR(d);
    uint64_t lo = a | (b << 32), hi = c | (d << 32);
    TM_IN_GPR(lo);
    TM_IN_GPR(hi);
    return _mm256_cvtph_ps(_mm_insert_epi64(_mm_cvtsi64_si128((long long)lo), (long long)hi, 1));
}

/* two fp16 scales -> [s0 s0 s1 s1] */
TM_AI __m128 scales2(const void *vp, size_t stride) {
    const uint8_t *p = vp;
    uint64_t a = (uint64_t)ld16(p), b = (uint64_t)ld16(p + stride);
    TM_IN_GPR(a);
    TM_IN_GPR(b);
    uint64_t v = (a | (a << 16)) | ((b | (b << 16)) << 32);
    TM_IN_GPR(v);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/* two pairs of fp16 -> [d0 m0 d1 m1] */
TM_AI __m128 pairs2(const void *vp, size_t stride) {
    const uint8_t *p = vp;
    return _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(ld32(p)), ld32(p + stride), 1));
}

TM_AI __m256 dup128(__m128 v) { return _mm256_insertf128_ps(_mm256_castps128_ps256(v), v, 1); }

TM_AI __m256i madd1(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

/* 8 int32 lanes each of four blocks -> [b0 b1 b2 b3 | b0 b1 b2 b3] partial sums (the halves add up) */
TM_AI __m256 fold4(__m256i s0, __m256i s1, __m256i s2, __m256i s3) {
    /* unpack/add tree: shuffles and adds spread over more ports than vphaddd (measured faster) */
    const __m256i u01 = _mm256_add_epi32(_mm256_unpacklo_epi32(s0, s1), _mm256_unpackhi_epi32(s0, s1));
    const __m256i u23 = _mm256_add_epi32(_mm256_unpacklo_epi32(s2, s3), _mm256_unpackhi_epi32(s2, s3));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_unpacklo_epi64(u01, u23), _mm256_unpackhi_epi64(u01, u23)));
}

/* the same from int16 pair sums whose groups of four cannot overflow int16 (|pair| <= 8191) */
TM_AI __m256 fold4_16(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    return _mm256_cvtepi32_ps(madd1(_mm256_hadd_epi16(_mm256_hadd_epi16(p0, p1), _mm256_hadd_epi16(p2, p3))));
}

/* signed x signed int8 (|x| <= 128, y > -128): int32 partial sums */
TM_AI __m256i isum_ss(__m256i x, __m256i y) {
    return madd1(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
}

/* Four unpacked blocks: quants and the scale vector (layout depends on the type). aux: Q8_0 activations
 * keep maddubs(8, q) for Q4_0's offset. */
typedef struct {
    __m256i q[4], aux[4];
    __m256 s;
} g4;

/* Q8_0 weights: |quants| in q, the signed quants in aux (to sign the activations), scales4 */
TM_AI void w4_q8_0(const void *vx, g4 *g) {
    const tm_block_q8_0 *x = vx;
    g->aux[0] = loadu(x[0].qs);
    g->aux[1] = loadu(x[1].qs);
    g->aux[2] = loadu(x[2].qs);
    g->aux[3] = loadu(x[3].qs);
    g->q[0] = _mm256_sign_epi8(g->aux[0], g->aux[0]);
    g->q[1] = _mm256_sign_epi8(g->aux[1], g->aux[1]);
    g->q[2] = _mm256_sign_epi8(g->aux[2], g->aux[2]);
    g->q[3] = _mm256_sign_epi8(g->aux[3], g->aux[3]);
    g->s = scales4(&x[0].d, sizeof *x);
}

/* Q4_0 weights: unsigned nibbles (offset 8 handled with the activation sums), scales4 */
TM_AI void w4_q4_0(const void *vx, g4 *g) {
    const tm_block_q4_0 *x = vx;
    g->q[0] = nibbles32(x[0].qs);
    g->q[1] = nibbles32(x[1].qs);
    g->q[2] = nibbles32(x[2].qs);
    g->q[3] = nibbles32(x[3].qs);
    g->s = scales4(&x[0].d, sizeof *x);
}

/* Q4_1 weights: unsigned nibbles, pairs4 [d m ...] */
TM_AI void w4_q4_1(const void *vx, g4 *g) {
    const tm_block_q4_1 *x = vx;
    g->q[0] = nibbles32(x[0].qs);
    g->q[1] = nibbles32(x[1].qs);
    g->q[2] = nibbles32(x[2].qs);
    g->q[3] = nibbles32(x[3].qs);
    g->s = pairs4(x, sizeof *x);
}

/* The same four blocks from a run of the 8-bit x4 copy (tm_quant.h: tm_quant_x4_pack): row k's scales are
 * contiguous ([d0 d1 d2 d3] or [d0 m0 .. d3 m3]: one load and one conversion instead of four scalar loads), and
 * a Q4 pair's 32 bytes give block 2p's nibbles in their low halves and block 2p + 1's in their high halves. The
 * vectors equal the row-major preps' bit for bit. */
TM_AI __m256 x4_scales4(const uint8_t *p) { /* [s0 s1 s2 s3 | s0 s1 s2 s3] */
    uint64_t v;
    memcpy(&v, p, 8);
    return _mm256_cvtph_ps(_mm_set1_epi64x((long long)v));
}

TM_AI void x4_nibbles(const uint8_t *q, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), v = loadu(q);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
}

TM_AI void w4x_q8_0(const uint8_t *run, int k, g4 *g) {
    const uint8_t *q = run + 16 * 2 + (size_t)k * 128;
    g->aux[0] = loadu(q);
    g->aux[1] = loadu(q + 32);
    g->aux[2] = loadu(q + 64);
    g->aux[3] = loadu(q + 96);
    g->q[0] = _mm256_sign_epi8(g->aux[0], g->aux[0]);
    g->q[1] = _mm256_sign_epi8(g->aux[1], g->aux[1]);
    g->q[2] = _mm256_sign_epi8(g->aux[2], g->aux[2]);
    g->q[3] = _mm256_sign_epi8(g->aux[3], g->aux[3]);
    g->s = x4_scales4(run + (size_t)k * 8);
}

TM_AI void w4x_q4_0(const uint8_t *run, int k, g4 *g) {
    const uint8_t *q = run + 16 * 2 + (size_t)k * 64;
    x4_nibbles(q, &g->q[0], &g->q[1]);
    x4_nibbles(q + 32, &g->q[2], &g->q[3]);
    g->s = x4_scales4(run + (size_t)k * 8);
}

TM_AI void w4x_q4_1(const uint8_t *run, int k, g4 *g) {
    const uint8_t *q = run + 16 * 4 + (size_t)k * 64;
    x4_nibbles(q, &g->q[0], &g->q[1]);
    x4_nibbles(q + 32, &g->q[2], &g->q[3]);
    g->s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(run + (size_t)k * 16))); /* [d0 m0 d1 m1 ..] */
}

/* Q8_0 activations (for Q8_0 weights): quants; scales4 */
TM_AI void a4q_q8_0(const void *vy, g4 *g) {
    const tm_block_q8_0 *y = vy;
    g->q[0] = loadu(y[0].qs);
    g->q[1] = loadu(y[1].qs);
    g->q[2] = loadu(y[2].qs);
    g->q[3] = loadu(y[3].qs);
}

/* Q8_0 activations (for Q4_0 weights): also 8 * pair sums */
TM_AI void a4q_q8_0o(const void *vy, g4 *g) {
    const __m256i k8 = _mm256_set1_epi8(8);
    a4q_q8_0(vy, g);
    g->aux[0] = _mm256_maddubs_epi16(k8, g->q[0]);
    g->aux[1] = _mm256_maddubs_epi16(k8, g->q[1]);
    g->aux[2] = _mm256_maddubs_epi16(k8, g->q[2]);
    g->aux[3] = _mm256_maddubs_epi16(k8, g->q[3]);
}

TM_AI __m256 a4s_q8_0(const void *vy) { return scales4(&((const tm_block_q8_0 *)vy)->d, sizeof(tm_block_q8_0)); }

/* Q8_1 activations: quants; pairs4 [d s ...] */
TM_AI void a4q_q8_1(const void *vy, g4 *g) {
    const tm_block_q8_1 *y = vy;
    g->q[0] = loadu(y[0].qs);
    g->q[1] = loadu(y[1].qs);
    g->q[2] = loadu(y[2].qs);
    g->q[3] = loadu(y[3].qs);
}

TM_AI __m256 a4s_q8_1(const void *vy) { return pairs4(vy, sizeof(tm_block_q8_1)); }

TM_AI void mac_q8_0(const g4 *w, const g4 *a, __m256 *acc, __m256 *accm) {
    (void)accm;
    const __m256 h = fold4(madd1(_mm256_maddubs_epi16(w->q[0], _mm256_sign_epi8(a->q[0], w->aux[0]))),
                           madd1(_mm256_maddubs_epi16(w->q[1], _mm256_sign_epi8(a->q[1], w->aux[1]))),
                           madd1(_mm256_maddubs_epi16(w->q[2], _mm256_sign_epi8(a->q[2], w->aux[2]))),
                           madd1(_mm256_maddubs_epi16(w->q[3], _mm256_sign_epi8(a->q[3], w->aux[3]))));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(w->s, a->s), h, *acc);
}

TM_AI void mac_q4_0(const g4 *w, const g4 *a, __m256 *acc, __m256 *accm) {
    (void)accm;
    /* (q - 8) . y pair sums: |pair| <= 2032 */
    const __m256i p0 = _mm256_sub_epi16(_mm256_maddubs_epi16(w->q[0], a->q[0]), a->aux[0]);
    const __m256i p1 = _mm256_sub_epi16(_mm256_maddubs_epi16(w->q[1], a->q[1]), a->aux[1]);
    const __m256i p2 = _mm256_sub_epi16(_mm256_maddubs_epi16(w->q[2], a->q[2]), a->aux[2]);
    const __m256i p3 = _mm256_sub_epi16(_mm256_maddubs_epi16(w->q[3], a->q[3]), a->aux[3]);
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(w->s, a->s), fold4_16(p0, p1, p2, p3), *acc);
}

TM_AI void mac_q4_1(const g4 *w, const g4 *a, __m256 *acc, __m256 *accm) {
    /* [d0 m0 d1 m1 ...] * [D0 S0 D1 S1 ...]: even lanes scale the int sums, odd lanes are the m*s terms */
    const __m256 p = _mm256_mul_ps(w->s, a->s);
    *accm = _mm256_add_ps(*accm, p);
    const __m256 h = fold4_16(_mm256_maddubs_epi16(w->q[0], a->q[0]), _mm256_maddubs_epi16(w->q[1], a->q[1]),
                              _mm256_maddubs_epi16(w->q[2], a->q[2]), _mm256_maddubs_epi16(w->q[3], a->q[3]));
    *acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(p, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)), h, *acc);
}

/* single leftover blocks */
TM_AI void mac1_q8_0(const void *vx, const void *vy, __m256 *acc, __m256 *accm) {
    const tm_block_q8_0 *x = vx, *y = vy;
    (void)accm;
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x->d) * f16(y->d)), _mm256_cvtepi32_ps(isum_ss(loadu(x->qs), loadu(y->qs))),
                           *acc);
}

TM_AI void mac1_q4_0(const void *vx, const void *vy, __m256 *acc, __m256 *accm) {
    const tm_block_q4_0 *x = vx;
    const tm_block_q8_0 *y = vy;
    (void)accm;
    const __m256i q = loadu(y->qs);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles32(x->qs), q), _mm256_maddubs_epi16(_mm256_set1_epi8(8), q));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x->d) * f16(y->d)), _mm256_cvtepi32_ps(madd1(p)), *acc);
}

TM_AI void mac1_q4_1(const void *vx, const void *vy, __m256 *acc, __m256 *accm) {
    const tm_block_q4_1 *x = vx;
    const tm_block_q8_1 *y = vy;
    *accm = _mm256_add_ps(*accm, _mm256_setr_ps(0.0f, f16(x->m) * f16(y->s), 0, 0, 0, 0, 0, 0));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x->d) * f16(y->d)),
                           _mm256_cvtepi32_ps(madd1(_mm256_maddubs_epi16(nibbles32(x->qs), loadu(y->qs)))), *acc);
}

/* two leftover blocks: partial sums laid out [b0 b0 b1 b1 | b0 b0 b1 b1] */
TM_AI void mac2_q8_0(const void *vx, const void *vy, __m256 *acc, __m256 *accm) {
    const tm_block_q8_0 *x = vx, *y = vy;
    (void)accm;
    const __m256i h = _mm256_hadd_epi32(isum_ss(loadu(x[0].qs), loadu(y[0].qs)), isum_ss(loadu(x[1].qs), loadu(y[1].qs)));
    const __m128 d = _mm_mul_ps(scales2(&x[0].d, sizeof *x), scales2(&y[0].d, sizeof *y));
    *acc = _mm256_fmadd_ps(dup128(d), _mm256_cvtepi32_ps(h), *acc);
}

TM_AI void mac2_q4_0(const void *vx, const void *vy, __m256 *acc, __m256 *accm) {
    const tm_block_q4_0 *x = vx;
    const tm_block_q8_0 *y = vy;
    (void)accm;
    const __m256i k8 = _mm256_set1_epi8(8), y0 = loadu(y[0].qs), y1 = loadu(y[1].qs);
    const __m256i p0 = _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles32(x[0].qs), y0), _mm256_maddubs_epi16(k8, y0));
    const __m256i p1 = _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles32(x[1].qs), y1), _mm256_maddubs_epi16(k8, y1));
    const __m128 d = _mm_mul_ps(scales2(&x[0].d, sizeof *x), scales2(&y[0].d, sizeof *y));
    *acc = _mm256_fmadd_ps(dup128(d), _mm256_cvtepi32_ps(madd1(_mm256_hadd_epi16(p0, p1))), *acc);
}

TM_AI void mac2_q4_1(const void *vx, const void *vy, __m256 *acc, __m256 *accm) {
    const tm_block_q4_1 *x = vx;
    const tm_block_q8_1 *y = vy;
    const __m128 p = _mm_mul_ps(pairs2(x, sizeof *x), pairs2(y, sizeof *y)); /* [dd0 ms0 dd1 ms1] */
    *accm = _mm256_add_ps(*accm, _mm256_insertf128_ps(_mm256_setzero_ps(), p, 0));
    const __m256i p0 = _mm256_maddubs_epi16(nibbles32(x[0].qs), loadu(y[0].qs));
    const __m256i p1 = _mm256_maddubs_epi16(nibbles32(x[1].qs), loadu(y[1].qs));
    *acc = _mm256_fmadd_ps(dup128(_mm_moveldup_ps(p)), _mm256_cvtepi32_ps(madd1(_mm256_hadd_epi16(p0, p1))), *acc);
}

/* final sums: odd lanes of accm hold Q4_1's min terms (zero for the other types). fin1 is lane 0 of fin4 (the same
 * additions: ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)) for acc and for accm, then their sum), so a row gives
 * the same bits whether it runs alone (vec_dot, leftover rows and columns), in a group of four weight rows
 * (decode), against four activation rows (prefill) or in the x4 kernel: 8-bit mode is batch invariant too. */
TM_AI float fin1(__m256 acc, __m256 accm) {
    /* h = [a01 a23 m01 m23 | a45 a67 m45 m67] */
    const __m256 h = _mm256_hadd_ps(acc, _mm256_blend_ps(accm, _mm256_setzero_ps(), 0x55));
    const __m256 h2 = _mm256_hadd_ps(h, h);
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)); /* [S(acc) S(accm) ..] */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
TM_AI __m128 fin4(const __m256 *acc, const __m256 *accm) {
    const __m256 z = _mm256_setzero_ps();
    return _mm_add_ps(hsum8x4(acc[0], acc[1], acc[2], acc[3]),
                      hsum8x4(_mm256_blend_ps(accm[0], z, 0x55), _mm256_blend_ps(accm[1], z, 0x55),
                              _mm256_blend_ps(accm[2], z, 0x55), _mm256_blend_ps(accm[3], z, 0x55)));
}

/* A weight row's 32-element blocks: runs of four at g, g + gs, g + 2 gs, ..., the nb % 4 leftover blocks
 * contiguous at t. Row-major: the runs back to back, the leftovers after them; row k of an x4 group
 * (tm_quant.h: tm_quant_x4_pack): the group's runs 16 blocks apart (row k's part of each found by WPREPX), its
 * leftovers after the group's runs, the four rows' tails one after another. */
typedef struct {
    const uint8_t *g, *t;
    size_t gs;
    int k; /* x4: the row within its group (g: the group's first run) */
} wrow;

TM_AI wrow wrow_rm(const void *x, int64_t nb, size_t wb) {
    const uint8_t *p = x;
    return (wrow){p, p + (size_t)(nb / 4) * 4 * wb, 4 * wb, 0};
}

TM_AI wrow wrow_x4(const void *group, int k, int64_t nb, size_t wb) {
    const uint8_t *p = group;
    const size_t nq = (size_t)(nb / 4), tail = (size_t)(nb % 4);
    return (wrow){p, p + nq * 16 * wb + (size_t)k * tail * wb, 16 * wb, k};
}

/* Prefill over an x4 copy reads a group's four rows one after another, each touching part of every run: a
 * pattern with gaps that the hardware prefetcher follows badly from DRAM (Q8_0 24576 x 576 against 8 tokens:
 * 0.72x the row-major speed). So each row prefetches a quarter of the next group (the whole group in one burst
 * at the group's first row was still 0.77x; spread over its four rows: 1.02x). */
TM_AI void x4_prefetch_group(const uint8_t *g, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(g + o, 0, 3);
}

/* floats of precomputed activation scales per column chunk (16 KiB of stack) */
#define TM_YS_FLOATS 4096u

/* Defines dot_<T> (one row), mat_<T> and matx4_<T> (mat_dot over the x4 copy). Row-major decode (one
 * activation row) walks the weight rows strictly in memory order, four rows per call with one combined
 * reduction: interleaving several row-major weight rows would be cheaper in instructions but measured ~30%
 * slower once the weights come from DRAM (prefetchers track one sequential stream far better than four);
 * the x4 copy interleaves them in memory instead (tm_quant.h), so its four-row kernel reads one stream.
 * WPREP reads four row-major blocks, WPREPX row k's four blocks of an x4 run. Prefill tiles 1 weight row x 4
 * activation rows so each weight block is unpacked once for four tokens. */
#define DEFINE_BLOCK32(T, WB, AB, WPREP, WPREPX, AQ, AS, MAC, MAC2, MAC1)                                      \
    /* ys: the activation row's group scale vectors, precomputed (8 floats per group), or NULL */              \
    TM_AI void row_##T(const bool X4, int64_t nb, wrow x, const AB *y, const float *ys, __m256 *acc,           \
                       __m256 *accm) {                                                                         \
        int64_t i = 0;                                                                                         \
        for (; i + 4 <= nb; i += 4) {                                                                          \
            g4 w, a;                                                                                           \
            if (X4) WPREPX(x.g + (size_t)(i / 4) * x.gs, x.k, &w);                                             \
            else WPREP(x.g + (size_t)(i / 4) * x.gs, &w);                                                      \
            AQ(y + i, &a);                                                                                     \
            a.s = ys ? _mm256_loadu_ps(ys + 2 * i) : AS(y + i);                                                \
            MAC(&w, &a, acc, accm);                                                                            \
        }                                                                                                      \
        const WB *xt = (const WB *)x.t;                                                                        \
        if (i + 2 <= nb) {                                                                                     \
            MAC2(xt, y + i, acc, accm);                                                                        \
            xt += 2;                                                                                           \
            i += 2;                                                                                            \
        }                                                                                                      \
        if (i < nb) MAC1(xt, y + i, acc, accm);                                                                \
    }                                                                                                          \
    static float dot_##T(int64_t n, const void *vw, const void *va) {                                          \
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();                                          \
        row_##T(false, n / 32, wrow_rm(vw, n / 32, sizeof(WB)), va, NULL, &acc, &accm);                        \
        return fin1(acc, accm);                                                                                \
    }                                                                                                          \
    /* one weight row against activation rows y0..y3: results 4 floats. ys: the activation rows' group         \
     * scale vectors, precomputed (8 floats per group of 4 blocks, ys_stride floats per row) */                \
    static __m128 cols4_##T(const bool X4, int64_t nb, wrow x, const AB *y0, size_t as, const float *ys,       \
                            size_t yss) {                                                                      \
        const AB *y1 = (const AB *)PW(y0, as, 1), *y2 = (const AB *)PW(y0, as, 2), *y3 = (const AB *)PW(y0, as, 3); \
        __m256 acc[4], accm[4];                                                                                \
        acc[0] = acc[1] = acc[2] = acc[3] = accm[0] = accm[1] = accm[2] = accm[3] = _mm256_setzero_ps();       \
        int64_t i = 0;                                                                                         \
        for (; i + 4 <= nb; i += 4, ys += 8) {                                                                 \
            g4 w, a;                                                                                           \
            if (X4) WPREPX(x.g + (size_t)(i / 4) * x.gs, x.k, &w);                                             \
            else WPREP(x.g + (size_t)(i / 4) * x.gs, &w);                                                      \
            AQ(y0 + i, &a);                                                                                    \
            a.s = _mm256_loadu_ps(ys);                                                                         \
            MAC(&w, &a, &acc[0], &accm[0]);                                                                    \
            AQ(y1 + i, &a);                                                                                    \
            a.s = _mm256_loadu_ps(ys + yss);                                                                   \
            MAC(&w, &a, &acc[1], &accm[1]);                                                                    \
            AQ(y2 + i, &a);                                                                                    \
            a.s = _mm256_loadu_ps(ys + 2 * yss);                                                               \
            MAC(&w, &a, &acc[2], &accm[2]);                                                                    \
            AQ(y3 + i, &a);                                                                                    \
            a.s = _mm256_loadu_ps(ys + 3 * yss);                                                               \
            MAC(&w, &a, &acc[3], &accm[3]);                                                                    \
        }                                                                                                      \
        const WB *xt = (const WB *)x.t;                                                                        \
        if (i + 2 <= nb) {                                                                                     \
            MAC2(xt, y0 + i, &acc[0], &accm[0]);                                                               \
            MAC2(xt, y1 + i, &acc[1], &accm[1]);                                                               \
            MAC2(xt, y2 + i, &acc[2], &accm[2]);                                                               \
            MAC2(xt, y3 + i, &acc[3], &accm[3]);                                                               \
            xt += 2;                                                                                           \
            i += 2;                                                                                            \
        }                                                                                                      \
        if (i < nb) {                                                                                          \
            MAC1(xt, y0 + i, &acc[0], &accm[0]);                                                               \
            MAC1(xt, y1 + i, &acc[1], &accm[1]);                                                               \
            MAC1(xt, y2 + i, &acc[2], &accm[2]);                                                               \
            MAC1(xt, y3 + i, &acc[3], &accm[3]);                                                               \
        }                                                                                                      \
        return fin4(acc, accm);                                                                                \
    }                                                                                                          \
    /* prefill tiles: rows 0..nr-1 (row-major ws bytes apart, or X4: packed groups) x activation rows in       \
     * L2-sized chunks; the activation scales of a chunk are converted once, into the 16 KiB stack buffer */   \
    TM_AI void tiles_##T(const bool X4, int64_t n, int64_t nr, const void *w, size_t ws, int64_t nc, const void *a, \
                         size_t as, float *out, size_t os, float *ys /* (TM_YS_FLOATS) */) {                   \
        const int64_t nb = n / 32;                                                                             \
        const int64_t ng = nb / 4;                                                                             \
        const size_t yss = (size_t)(8 * ng);                                                                   \
        int64_t chunk = as ? (int64_t)(TM_ACT_CHUNK_BYTES / as) : nc;                                          \
        if (yss > 0 && chunk > (int64_t)(TM_YS_FLOATS / yss)) chunk = (int64_t)(TM_YS_FLOATS / yss);           \
        chunk &= ~(int64_t)3;                                                                                  \
        if (chunk < 4) chunk = 4;                                                                              \
        const bool pre = yss * 4 <= TM_YS_FLOATS;                                                              \
        for (int64_t c0 = 0; c0 < nc; c0 += chunk) {                                                           \
            const int64_t c1 = c0 + chunk < nc ? c0 + chunk : nc;                                              \
            const int64_t c4 = pre ? c0 + ((c1 - c0) & ~(int64_t)3) : c0;                                      \
            for (int64_t c = c0; c < c4; c++)                                                                  \
                for (int64_t g = 0; g < ng; g++)                                                               \
                    _mm256_storeu_ps(ys + (size_t)(c - c0) * yss + 8 * (size_t)g,                              \
                                     AS((const AB *)PW(a, as, c) + 4 * g));                                    \
            for (int64_t r = 0; r < nr; r++) {                                                                 \
                if (X4 && r + 4 < nr) x4_prefetch_group(PW(w, ws, r + 4), ws); /* a quarter of the next group */ \
                const wrow x = X4 ? wrow_x4(PW(w, ws, r & ~(int64_t)3), (int)(r & 3), nb, sizeof(WB))          \
                                  : wrow_rm(PW(w, ws, r), nb, sizeof(WB));                                     \
                int64_t c = c0;                                                                                \
                for (; c < c4; c += 4) {                                                                       \
                    float v[4];                                                                                \
                    const float *yc = ys + (size_t)(c - c0) * yss;                                             \
                    _mm_storeu_ps(v, cols4_##T(X4, nb, x, (const AB *)PW(a, as, c), as, yc, yss));             \
                    for (int k = 0; k < 4; k++) out[(size_t)(c + k) * os + (size_t)r] = v[k];                  \
                }                                                                                              \
                for (; c < c1; c++) {                                                                          \
                    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();                              \
                    row_##T(X4, nb, x, (const AB *)PW(a, as, c), NULL, &acc, &accm);                           \
                    out[(size_t)c * os + (size_t)r] = fin1(acc, accm);                                         \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    static void mat_##T(int64_t n, int64_t nr, const void *w, size_t ws, int64_t nc, const void *a, size_t as, \
                        float *out, size_t os) {                                                               \
        const int64_t nb = n / 32;                                                                             \
        float ys[TM_YS_FLOATS];                                                                                \
        const int64_t ng = nb / 4;                                                                             \
        const size_t yss = (size_t)(8 * ng);                                                                   \
        if (nc == 1) {                                                                                         \
            /* one activation row: convert its scales once for all weight rows */                              \
            const float *pys = yss <= TM_YS_FLOATS ? ys : NULL;                                                \
            if (pys)                                                                                           \
                for (int64_t g = 0; g < ng; g++) _mm256_storeu_ps(ys + 8 * g, AS((const AB *)a + 4 * g));      \
            int64_t r = 0;                                                                                     \
            for (; r + 4 <= nr; r += 4) {                                                                      \
                __m256 acc[4], accm[4];                                                                        \
                acc[0] = acc[1] = acc[2] = acc[3] = accm[0] = accm[1] = accm[2] = accm[3] = _mm256_setzero_ps(); \
                row_##T(false, nb, wrow_rm(PW(w, ws, r + 0), nb, sizeof(WB)), a, pys, &acc[0], &accm[0]);      \
                row_##T(false, nb, wrow_rm(PW(w, ws, r + 1), nb, sizeof(WB)), a, pys, &acc[1], &accm[1]);      \
                row_##T(false, nb, wrow_rm(PW(w, ws, r + 2), nb, sizeof(WB)), a, pys, &acc[2], &accm[2]);      \
                row_##T(false, nb, wrow_rm(PW(w, ws, r + 3), nb, sizeof(WB)), a, pys, &acc[3], &accm[3]);      \
                _mm_storeu_ps(out + r, fin4(acc, accm));                                                       \
            }                                                                                                  \
            for (; r < nr; r++) out[r] = dot_##T(n, PW(w, ws, r), a);                                          \
            return;                                                                                            \
        }                                                                                                      \
        tiles_##T(false, n, nr, w, ws, nc, a, as, out, os, ys);                                                \
    }                                                                                                          \
    /* The four rows of the x4 group at g against NR (1..2) activation rows: per (row, activation row)         \
     * exactly row_T's float sequence and fin4's reduction (the bits of dot_T and mat_T). Each activation      \
     * group of four blocks (quants, scales) is loaded once for the four rows, and the weights arrive as one   \
     * sequential stream (run q: row 0's four blocks, row 1's, row 2's, row 3's; then the row tails).          \
     * ys: the NR rows' group scale vectors (yss floats apart) or NULL. out[c * os + k]. */                    \
    TM_AI void x4k_##T(const int NR, int64_t nb, const uint8_t *g, const AB *y0, size_t as, const float *ys,   \
                       size_t yss, float *out, size_t os) {                                                    \
        const size_t wb = sizeof(WB);                                                                          \
        const int64_t ng = nb / 4, tail = nb % 4;                                                              \
        __m256 acc[2][4], accm[2][4];                                                                          \
        for (int c = 0; c < NR; c++)                                                                           \
            for (int k = 0; k < 4; k++) acc[c][k] = accm[c][k] = _mm256_setzero_ps();                          \
        for (int64_t q = 0; q < ng; q++) {                                                                     \
            const uint8_t *x = g + (size_t)q * 16 * wb;                                                        \
            g4 av[2];                                                                                          \
            for (int c = 0; c < NR; c++) {                                                                     \
                const AB *y = (const AB *)PW(y0, as, c) + 4 * q;                                               \
                AQ(y, &av[c]);                                                                                 \
                av[c].s = ys ? _mm256_loadu_ps(ys + (size_t)c * yss + 8 * (size_t)q) : AS(y);                  \
            }                                                                                                  \
            for (int k = 0; k < 4; k++) {                                                                      \
                g4 wv;                                                                                         \
                WPREPX(x, k, &wv);                                                                             \
                for (int c = 0; c < NR; c++) MAC(&wv, &av[c], &acc[c][k], &accm[c][k]);                        \
            }                                                                                                  \
        }                                                                                                      \
        if (tail) { /* the row tails, as row_T's leftover pair and single block */                             \
            const uint8_t *xt = g + (size_t)ng * 16 * wb;                                                      \
            for (int k = 0; k < 4; k++) {                                                                      \
                const WB *x = (const WB *)(xt + (size_t)k * (size_t)tail * wb);                                \
                for (int c = 0; c < NR; c++) {                                                                 \
                    const AB *y = (const AB *)PW(y0, as, c) + 4 * ng;                                          \
                    if (tail >= 2) MAC2(x, y, &acc[c][k], &accm[c][k]);                                        \
                    if (tail & 1) MAC1(x + tail - 1, y + tail - 1, &acc[c][k], &accm[c][k]);                   \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int c = 0; c < NR; c++) {                                                                         \
            float v[4];                                                                                        \
            _mm_storeu_ps(v, fin4(acc[c], accm[c]));                                                           \
            for (int k = 0; k < 4; k++) out[(size_t)c * os + (size_t)k] = v[k];                                \
        }                                                                                                      \
    }                                                                                                          \
    /* mat_dot over x4-packed weights (nr a multiple of 4, w at a group): one or two activation rows run the   \
     * fused four-row kernel, more run the prefill tiles reading each row where the layout puts it */          \
    static void matx4_##T(int64_t n, int64_t nr, const void *w, int64_t nc, const void *a, size_t as, float *out, \
                          size_t os) {                                                                         \
        const int64_t nb = n / 32, ng = nb / 4;                                                                \
        const size_t rb = (size_t)nb * sizeof(WB), yss = (size_t)(8 * ng);                                     \
        float ys[TM_YS_FLOATS];                                                                                \
        if (nc > 2) {                                                                                          \
            tiles_##T(true, n, nr, w, rb, nc, a, as, out, os, ys);                                             \
            return;                                                                                            \
        }                                                                                                      \
        const float *pys = yss * (size_t)nc <= TM_YS_FLOATS ? ys : NULL;                                       \
        if (pys)                                                                                               \
            for (int64_t c = 0; c < nc; c++)                                                                   \
                for (int64_t q = 0; q < ng; q++)                                                               \
                    _mm256_storeu_ps(ys + (size_t)c * yss + 8 * (size_t)q, AS((const AB *)PW(a, as, c) + 4 * q)); \
        for (int64_t r = 0; r + 4 <= nr; r += 4) {                                                             \
            if (nc == 2) x4k_##T(2, nb, (const uint8_t *)w + (size_t)r * rb, a, as, pys, yss, out + r, os);    \
            else x4k_##T(1, nb, (const uint8_t *)w + (size_t)r * rb, a, as, pys, yss, out + r, os);            \
        }                                                                                                      \
    }

DEFINE_BLOCK32(q8_0, tm_block_q8_0, tm_block_q8_0, w4_q8_0, w4x_q8_0, a4q_q8_0, a4s_q8_0, mac_q8_0, mac2_q8_0,
               mac1_q8_0)
DEFINE_BLOCK32(q4_0, tm_block_q4_0, tm_block_q8_0, w4_q4_0, w4x_q4_0, a4q_q8_0o, a4s_q8_0, mac_q4_0, mac2_q4_0,
               mac1_q4_0)
DEFINE_BLOCK32(q4_1, tm_block_q4_1, tm_block_q8_1, w4_q4_1, w4x_q4_1, a4q_q8_1, a4s_q8_1, mac_q4_1, mac2_q4_1,
               mac1_q4_1)

/* ---- K-quants (256-element super-blocks) x Q8_K ----------------------------------------------------
 * Sub-block scales are applied with vpmaddwd against a vector holding each sub-block's scale in the
 * int16 lanes of its products (broadcast with vpshufb). That work depends only on the weights, so the
 * prefill tile (one weight row x four activation rows) unpacks quants and scales once for four tokens. */

/* vpshufb controls: broadcast int16 element j of each 128-bit lane */
static const uint8_t k_bcast16[8][32] __attribute__((aligned(32))) = {
#define TM_B16(j) {2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1,             \
                   2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1,             \
                   2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1,             \
                   2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1}
    TM_B16(0), TM_B16(1), TM_B16(2), TM_B16(3), TM_B16(4), TM_B16(5), TM_B16(6), TM_B16(7),
#undef TM_B16
};

/* vpshufb controls for Q6_K: low lane broadcasts int16 element 2k, high lane element 2k+1 */
static const uint8_t k_bcast16x2[4][32] __attribute__((aligned(32))) = {
#define TM_B2(k) {4 * (k), 4 * (k) + 1, 4 * (k), 4 * (k) + 1, 4 * (k), 4 * (k) + 1, 4 * (k), 4 * (k) + 1,             \
                  4 * (k), 4 * (k) + 1, 4 * (k), 4 * (k) + 1, 4 * (k), 4 * (k) + 1, 4 * (k), 4 * (k) + 1,             \
                  4 * (k) + 2, 4 * (k) + 3, 4 * (k) + 2, 4 * (k) + 3, 4 * (k) + 2, 4 * (k) + 3, 4 * (k) + 2, 4 * (k) + 3, \
                  4 * (k) + 2, 4 * (k) + 3, 4 * (k) + 2, 4 * (k) + 3, 4 * (k) + 2, 4 * (k) + 3, 4 * (k) + 2, 4 * (k) + 3}
    TM_B2(0), TM_B2(1), TM_B2(2), TM_B2(3),
#undef TM_B2
};

TM_AI __m256i bcast16(__m256i v, int j) { return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)k_bcast16[j])); }
TM_AI __m256i bcast16x2(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)k_bcast16x2[k]));
}

/* lane 0 of hsum8x4 (((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))) and of the 4-lane hadd tree
 * ((v0 + v1) + (v2 + v3)): a K-quant vec_dot finishes like a column of its prefill tile, bit for bit */
TM_AI float hsum8_tree(__m256 v) {
    const __m256 h = _mm256_hadd_ps(v, v);
    const __m256 h2 = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}
TM_AI float hsum4_tree(__m128 v) {
    const __m128 h = _mm_hadd_ps(v, v);
    return _mm_cvtss_f32(_mm_hadd_ps(h, h));
}

/* 12 packed bytes -> 16 int16: six-bit scales sc0..sc7 then mins m0..m7 */
TM_AI __m256i q4k_scales_mins(const uint8_t *s) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t k6 = 0x3f3f3f3fu, k4 = 0x0f0f0f0fu, k2 = 0x03030303u;
    const uint32_t sc_lo = w0 & k6, mn_lo = w1 & k6;
    const uint32_t sc_hi = (w2 & k4) | (((w0 >> 6) & k2) << 4);
    const uint32_t mn_hi = ((w2 >> 4) & k4) | (((w1 >> 6) & k2) << 4);
    return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi));
}

/* One 64-element chunk j of a Q4_K super-block: quants of sub-block 2j (lo) and 2j+1 (hi) and their
 * scales broadcast to int16 lanes. sc = the eight scales in both halves. */
typedef struct {
    __m256i lo, hi, slo, shi;
} q4k_chunk;

TM_AI void q4k_chunk_prep(const tm_block_q4_K *x, int j, __m256i sc, q4k_chunk *c) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i q = loadu(x->qs + 32 * j);
    c->lo = _mm256_and_si256(q, m4);
    c->hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    c->slo = bcast16(sc, 2 * j);
    c->shi = bcast16(sc, 2 * j + 1);
}

/* sumi += scaled products of chunk j with activation quants q8 (the whole super-block's) */
TM_AI __m256i q4k_chunk_mac(const q4k_chunk *c, const int8_t *q8, int j, __m256i sumi) {
    const __m256i pl = _mm256_madd_epi16(c->slo, _mm256_maddubs_epi16(c->lo, loadu(q8 + 64 * j)));
    const __m256i ph = _mm256_madd_epi16(c->shi, _mm256_maddubs_epi16(c->hi, loadu(q8 + 64 * j + 32)));
    return _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
}

/* mins term: -dmin_w * d_y * sum_j m_j * (bsums[2j] + bsums[2j+1]) accumulated in 4 lanes */
TM_AI __m128 q4k_mins(__m128i mins, float dmin, const tm_block_q8_K *y, __m128 accm) {
    const __m256i bs = loadu(y->bsums);
    const __m128i bs8 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    return _mm_fmadd_ps(_mm_set1_ps(-y->d * dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs8)), accm);
}

/* one Q4_K weight row whose super-blocks stand ss apart (row-major: 1; row k of an x4 group: 4) */
TM_AI float row_q4_K(int64_t nb, const tm_block_q4_K *x, int64_t ss, const tm_block_q8_K *y) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const tm_block_q4_K *xi = x + i * ss;
        const __m256i sm = q4k_scales_mins(xi->scales);
        const __m256i sc = _mm256_permute4x64_epi64(sm, 0x44);
        accm = q4k_mins(_mm256_extracti128_si256(sm, 1), f16(xi->dmin), &y[i], accm);
        __m256i sumi = _mm256_setzero_si256();
        q4k_chunk c;
        q4k_chunk_prep(xi, 0, sc, &c);
        sumi = q4k_chunk_mac(&c, y[i].qs, 0, sumi);
        q4k_chunk_prep(xi, 1, sc, &c);
        sumi = q4k_chunk_mac(&c, y[i].qs, 1, sumi);
        q4k_chunk_prep(xi, 2, sc, &c);
        sumi = q4k_chunk_mac(&c, y[i].qs, 2, sumi);
        q4k_chunk_prep(xi, 3, sc, &c);
        sumi = q4k_chunk_mac(&c, y[i].qs, 3, sumi);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(xi->d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8_tree(acc) + hsum4_tree(accm);
}

static float dot_q4_K(int64_t n, const void *vw, const void *va) { return row_q4_K(n / TM_QK_K, vw, 1, va); }

/* one weight row (super-blocks ss apart) against activation rows y0..y3 */
TM_AI __m128 cols4s_q4_K(int64_t nb, const tm_block_q4_K *x, int64_t ss, const tm_block_q8_K *y0, size_t as) {
    const tm_block_q8_K *y1 = (const void *)PW(y0, as, 1), *y2 = (const void *)PW(y0, as, 2),
                        *y3 = (const void *)PW(y0, as, 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
    for (int64_t i = 0; i < nb; i++) {
        const __m256i sm = q4k_scales_mins(x[i * ss].scales);
        const __m256i sc = _mm256_permute4x64_epi64(sm, 0x44);
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        const float dmin = f16(x[i * ss].dmin), d = f16(x[i * ss].d);
        m0 = q4k_mins(mins, dmin, &y0[i], m0);
        m1 = q4k_mins(mins, dmin, &y1[i], m1);
        m2 = q4k_mins(mins, dmin, &y2[i], m2);
        m3 = q4k_mins(mins, dmin, &y3[i], m3);
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
#define TM_Q4K_COLS(j)                                                                                         \
    do {                                                                                                       \
        q4k_chunk c;                                                                                           \
        q4k_chunk_prep(&x[i * ss], j, sc, &c);                                                                 \
        s0 = q4k_chunk_mac(&c, y0[i].qs, j, s0);                                                               \
        s1 = q4k_chunk_mac(&c, y1[i].qs, j, s1);                                                               \
        s2 = q4k_chunk_mac(&c, y2[i].qs, j, s2);                                                               \
        s3 = q4k_chunk_mac(&c, y3[i].qs, j, s3);                                                               \
    } while (0)
        TM_Q4K_COLS(0);
        TM_Q4K_COLS(1);
        TM_Q4K_COLS(2);
        TM_Q4K_COLS(3);
#undef TM_Q4K_COLS
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(y0[i].d * d), _mm256_cvtepi32_ps(s0), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(y1[i].d * d), _mm256_cvtepi32_ps(s1), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(y2[i].d * d), _mm256_cvtepi32_ps(s2), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(y3[i].d * d), _mm256_cvtepi32_ps(s3), a3);
    }
    const __m128 mm = _mm_hadd_ps(_mm_hadd_ps(m0, m1), _mm_hadd_ps(m2, m3));
    return _mm_add_ps(hsum8x4(a0, a1, a2, a3), mm);
}

static __m128 cols4_q4_K(int64_t nb, const tm_block_q4_K *x, const tm_block_q8_K *y0, size_t as) {
    return cols4s_q4_K(nb, x, 1, y0, as);
}

/* One 32-element chunk k of a Q6_K half super-block h: 6-bit quants (stored +32) and the scales of its two
 * 16-element sub-blocks broadcast (sub-block 2k in the low lane, 2k+1 in the high lane). s = the half's
 * eight scales as int16 in both lanes. */
TM_AI __m256i q6k_quants(const tm_block_q6_K *x, int h, int k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i l = loadu(x->ql + 64 * h + 32 * (k & 1)), hb = loadu(x->qh + 32 * h);
    const __m256i lo = (k & 2) ? _mm256_and_si256(_mm256_srli_epi16(l, 4), m4) : _mm256_and_si256(l, m4);
    __m256i hi;
    switch (k) { /* bits 2k..2k+1 of qh moved to bits 4..5 */
    case 0: hi = _mm256_slli_epi16(hb, 4); break;
    case 1: hi = _mm256_slli_epi16(hb, 2); break;
    case 2: hi = hb; break;
    default: hi = _mm256_srli_epi16(hb, 2); break;
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}

TM_AI __m256i q6k_half_scales(__m256i sc16, int h) {
    return h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
}

TM_AI __m256i q6k_mac(__m256i q, __m256i s, const int8_t *q8, __m256i sumi) {
    return _mm256_add_epi32(sumi, _mm256_madd_epi16(s, _mm256_maddubs_epi16(q, loadu(q8))));
}

/* quants are stored +32: 32 * sum_j sc_j * bsums_j to subtract */
TM_AI __m256i q6k_offset(__m256i sc16, const tm_block_q8_K *y) {
    return _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu(y->bsums)), 5);
}

TM_AI __m256i q6k_sc16(const tm_block_q6_K *x) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
}

static float dot_q6_K(int64_t n, const void *vw, const void *va) {
    const tm_block_q6_K *x = vw;
    const tm_block_q8_K *y = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const __m256i sc16 = q6k_sc16(&x[i]);
        __m256i s0 = _mm256_sub_epi32(_mm256_setzero_si256(), q6k_offset(sc16, &y[i])), s1 = _mm256_setzero_si256();
#define TM_Q6K_HALF(h)                                                                                         \
    do {                                                                                                       \
        const __m256i s = q6k_half_scales(sc16, h);                                                            \
        const int8_t *q8 = y[i].qs + 128 * (h);                                                                \
        s0 = q6k_mac(q6k_quants(&x[i], h, 0), bcast16x2(s, 0), q8, s0);                                        \
        s1 = q6k_mac(q6k_quants(&x[i], h, 1), bcast16x2(s, 1), q8 + 32, s1);                                   \
        s0 = q6k_mac(q6k_quants(&x[i], h, 2), bcast16x2(s, 2), q8 + 64, s0);                                   \
        s1 = q6k_mac(q6k_quants(&x[i], h, 3), bcast16x2(s, 3), q8 + 96, s1);                                   \
    } while (0)
        TM_Q6K_HALF(0);
        TM_Q6K_HALF(1);
#undef TM_Q6K_HALF
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum8_tree(acc);
}

static __m128 cols4_q6_K(int64_t nb, const tm_block_q6_K *x, const tm_block_q8_K *y0, size_t as) {
    const tm_block_q8_K *y1 = (const void *)PW(y0, as, 1), *y2 = (const void *)PW(y0, as, 2),
                        *y3 = (const void *)PW(y0, as, 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < nb; i++) {
        const __m256i sc16 = q6k_sc16(&x[i]);
        const float d = f16(x[i].d);
        __m256i s0 = _mm256_sub_epi32(_mm256_setzero_si256(), q6k_offset(sc16, &y0[i]));
        __m256i s1 = _mm256_sub_epi32(_mm256_setzero_si256(), q6k_offset(sc16, &y1[i]));
        __m256i s2 = _mm256_sub_epi32(_mm256_setzero_si256(), q6k_offset(sc16, &y2[i]));
        __m256i s3 = _mm256_sub_epi32(_mm256_setzero_si256(), q6k_offset(sc16, &y3[i]));
#define TM_Q6K_CHUNK(h, k)                                                                                     \
    do {                                                                                                       \
        const __m256i q = q6k_quants(&x[i], h, k), sk = bcast16x2(q6k_half_scales(sc16, h), k);                \
        s0 = q6k_mac(q, sk, y0[i].qs + 128 * (h) + 32 * (k), s0);                                              \
        s1 = q6k_mac(q, sk, y1[i].qs + 128 * (h) + 32 * (k), s1);                                              \
        s2 = q6k_mac(q, sk, y2[i].qs + 128 * (h) + 32 * (k), s2);                                              \
        s3 = q6k_mac(q, sk, y3[i].qs + 128 * (h) + 32 * (k), s3);                                              \
    } while (0)
        TM_Q6K_CHUNK(0, 0);
        TM_Q6K_CHUNK(0, 1);
        TM_Q6K_CHUNK(0, 2);
        TM_Q6K_CHUNK(0, 3);
        TM_Q6K_CHUNK(1, 0);
        TM_Q6K_CHUNK(1, 1);
        TM_Q6K_CHUNK(1, 2);
        TM_Q6K_CHUNK(1, 3);
#undef TM_Q6K_CHUNK
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(y0[i].d * d), _mm256_cvtepi32_ps(s0), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(y1[i].d * d), _mm256_cvtepi32_ps(s1), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(y2[i].d * d), _mm256_cvtepi32_ps(s2), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(y3[i].d * d), _mm256_cvtepi32_ps(s3), a3);
    }
    return hsum8x4(a0, a1, a2, a3);
}

/* K-quant many-dot: decode walks the rows in order (one vec_dot each: rows are long), prefill uses the
 * 1 x 4 tile with the activation rows chunked to stay in L2 */
#define DEFINE_KMAT(T, WB)                                                                                     \
    static void mat_##T(int64_t n, int64_t nr, const void *w, size_t ws, int64_t nc, const void *a, size_t as, \
                        float *out, size_t os) {                                                               \
        const int64_t nb = n / TM_QK_K;                                                                        \
        int64_t chunk = as ? (int64_t)(TM_ACT_CHUNK_BYTES / as) & ~(int64_t)3 : nc;                            \
        if (chunk < 4) chunk = 4;                                                                              \
        for (int64_t c0 = 0; c0 < nc; c0 += chunk) {                                                           \
            const int64_t c1 = c0 + chunk < nc ? c0 + chunk : nc;                                              \
            for (int64_t r = 0; r < nr; r++) {                                                                 \
                const WB *x = (const WB *)PW(w, ws, r);                                                        \
                int64_t c = c0;                                                                                \
                for (; c + 4 <= c1; c += 4) {                                                                  \
                    float v[4];                                                                                \
                    _mm_storeu_ps(v, cols4_##T(nb, x, (const tm_block_q8_K *)PW(a, as, c), as));               \
                    for (int k = 0; k < 4; k++) out[(size_t)(c + k) * os + (size_t)r] = v[k];                  \
                }                                                                                              \
                for (; c < c1; c++) out[(size_t)c * os + (size_t)r] = dot_##T(n, x, PW(a, as, c));             \
            }                                                                                                  \
        }                                                                                                      \
    }

DEFINE_KMAT(q4_K, tm_block_q4_K)
DEFINE_KMAT(q6_K, tm_block_q6_K)

/* The four rows of a Q4_K x4 group (super-block i of rows 0..3 one after another) against NR (1..2)
 * activation rows: per (row, activation row) exactly row_q4_K's float sequence (so dot_q4_K's bits); each
 * activation super-block's bsums are folded once for the four rows. out[c * os + k]. */
TM_AI void x4k_q4_K(const int NR, int64_t nb, const tm_block_q4_K *g, const tm_block_q8_K *y0, size_t as, float *out,
                    size_t os) {
    __m256 acc[2][4];
    __m128 accm[2][4];
    for (int c = 0; c < NR; c++)
        for (int k = 0; k < 4; k++) {
            acc[c][k] = _mm256_setzero_ps();
            accm[c][k] = _mm_setzero_ps();
        }
    for (int64_t i = 0; i < nb; i++) {
        const tm_block_q8_K *y[2];
        __m128i bs8[2];
        for (int c = 0; c < NR; c++) {
            y[c] = (const tm_block_q8_K *)PW(y0, as, c) + i;
            const __m256i bs = loadu(y[c]->bsums);
            bs8[c] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        }
        for (int k = 0; k < 4; k++) {
            const tm_block_q4_K *x = g + 4 * i + k;
            const __m256i sm = q4k_scales_mins(x->scales);
            const __m256i sc = _mm256_permute4x64_epi64(sm, 0x44);
            const __m128i mins = _mm256_extracti128_si256(sm, 1);
            const float dmin = f16(x->dmin), d = f16(x->d);
            __m256i sumi[2];
            for (int c = 0; c < NR; c++) {
                accm[c][k] = _mm_fmadd_ps(_mm_set1_ps(-y[c]->d * dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs8[c])),
                                          accm[c][k]);
                sumi[c] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 4; j++) {
                q4k_chunk ch;
                q4k_chunk_prep(x, j, sc, &ch);
                for (int c = 0; c < NR; c++) sumi[c] = q4k_chunk_mac(&ch, y[c]->qs, j, sumi[c]);
            }
            for (int c = 0; c < NR; c++)
                acc[c][k] = _mm256_fmadd_ps(_mm256_set1_ps(y[c]->d * d), _mm256_cvtepi32_ps(sumi[c]), acc[c][k]);
        }
    }
    for (int c = 0; c < NR; c++)
        for (int k = 0; k < 4; k++) out[(size_t)c * os + (size_t)k] = hsum8_tree(acc[c][k]) + hsum4_tree(accm[c][k]);
}

/* mat_dot over a Q4_K x4 weight (tm_quant.h): one or two activation rows run the fused four-row kernel, more
 * run mat_q4_K's tiles with each row's super-blocks 4 apart */
static void matx4_q4_K(int64_t n, int64_t nr, const void *w, int64_t nc, const void *a, size_t as, float *out,
                       size_t os) {
    const int64_t nb = n / TM_QK_K;
    const tm_block_q4_K *wb = w;
    if (nc <= 2) {
        for (int64_t r = 0; r + 4 <= nr; r += 4) {
            if (nc == 2) x4k_q4_K(2, nb, wb + r * nb, a, as, out + r, os);
            else x4k_q4_K(1, nb, wb + r * nb, a, as, out + r, os);
        }
        return;
    }
    int64_t chunk = as ? (int64_t)(TM_ACT_CHUNK_BYTES / as) & ~(int64_t)3 : nc;
    if (chunk < 4) chunk = 4;
    for (int64_t c0 = 0; c0 < nc; c0 += chunk) {
        const int64_t c1 = c0 + chunk < nc ? c0 + chunk : nc;
        for (int64_t r = 0; r < nr; r++) {
            if (r + 4 < nr) /* a quarter of the next group per row */
                x4_prefetch_group((const uint8_t *)(wb + (r + 4) * nb), (size_t)nb * sizeof *wb);
            const tm_block_q4_K *x = wb + (r & ~(int64_t)3) * nb + (r & 3); /* row r's super-block 0 */
            int64_t c = c0;
            for (; c + 4 <= c1; c += 4) {
                float v[4];
                _mm_storeu_ps(v, cols4s_q4_K(nb, x, 4, (const tm_block_q8_K *)PW(a, as, c), as));
                for (int k = 0; k < 4; k++) out[(size_t)(c + k) * os + (size_t)r] = v[k];
            }
            for (; c < c1; c++) out[(size_t)c * os + (size_t)r] = row_q4_K(nb, x, 4, (const tm_block_q8_K *)PW(a, as, c));
        }
    }
}

/* ---- float weights: many dots -------------------------------------------------------------------- */

FLOAT_MAT(mat_f32, dot_f32, float, _mm256_loadu_ps, id_f32)
FLOAT_MAT(mat_f16, dot_f16, uint16_t, ld_f16, f16)
FLOAT_MAT(mat_bf16, dot_bf16, uint16_t, ld_bf16, tm_bf16_to_f32)

/* ---- table --------------------------------------------------------------------------------------- */

static const tm_quant_ops k_avx2[] = {
    {TM_DT_F32, TM_DT_F32, act_f32, dot_f32, mat_f32},
    {TM_DT_F16, TM_DT_F32, act_f32, dot_f16, mat_f16},
    {TM_DT_BF16, TM_DT_F32, act_f32, dot_bf16, mat_bf16},
    {TM_DT_Q8_0, TM_DT_Q8_0, act_q8_0, dot_q8_0, mat_q8_0},
    {TM_DT_Q4_0, TM_DT_Q8_0, act_q8_0, dot_q4_0, mat_q4_0},
    {TM_DT_Q4_1, TM_DT_Q8_1, act_q8_1, dot_q4_1, mat_q4_1},
    {TM_DT_Q4_K, TM_DT_Q8_K, tm_quant_act_q8_K, dot_q4_K, mat_q4_K},
    {TM_DT_Q6_K, TM_DT_Q8_K, tm_quant_act_q8_K, dot_q6_K, mat_q6_K},
};

const tm_quant_ops *tm_quant_ops_avx2(tm_dtype t) {
    return tm_quant_ops_find(k_avx2, sizeof k_avx2 / sizeof k_avx2[0], t);
}

tm_mat_dot_x4_fn tm_quant_x4_avx2(tm_dtype t) {
    switch (t) {
    case TM_DT_Q8_0: return matx4_q8_0;
    case TM_DT_Q4_0: return matx4_q4_0;
    case TM_DT_Q4_1: return matx4_q4_1;
    case TM_DT_Q4_K: return matx4_q4_K;
    default: return NULL;
    }
}

#else /* not built with AVX2/FMA/F16C */

const tm_quant_ops *tm_quant_ops_avx2(tm_dtype t) {
    (void)t;
    return NULL;
}

tm_mat_dot_x4_fn tm_quant_x4_avx2(tm_dtype t) {
    (void)t;
    return NULL;
}

#endif
