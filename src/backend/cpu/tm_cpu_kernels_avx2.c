/* tm_cpu_kernels_avx2.c -- AVX2/FMA versions of the CPU row kernels (reached only after tm_cpu_use_avx2()). */
#include "tm_cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x in [-87.3, 88.7] (clamped outside): x = k ln2 + r, |r| <= ln2/2, exp(r) by a degree-6
 * polynomial (relative error < 2e-7), scaled by 2^k through the exponent bits. */
static inline __m256 exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void tm_cpu_swiglu_avx2(const float *g, const float *u, float *out, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), v));
        __m256 s = _mm256_div_ps(v, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static inline float sumsq(const float *x, int32_t dim) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= dim; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    float ss = hsum256(_mm256_add_ps(a0, a1));
    for (; i < dim; i++) ss += x[i] * x[i];
    return ss;
}

static inline void scale_mul(const float *x, const float *w, float r, int32_t dim, float *out) {
    __m256 rv = _mm256_set1_ps(r);
    int32_t i = 0;
    for (; i + 8 <= dim; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
    for (; i < dim; i++) out[i] = x[i] * r * w[i];
}

void tm_cpu_rmsnorm_row_avx2(const float *x, const float *w, float eps, int32_t dim, float *out) {
    float r = 1.0f / sqrtf(sumsq(x, dim) / (float)dim + eps);
    scale_mul(x, w, r, dim, out);
}

void tm_cpu_add_rmsnorm_row_avx2(float *res, const float *x, const float *w, float eps, int32_t dim, float *out) {
    int32_t i = 0;
    for (; i + 8 <= dim; i += 8)
        _mm256_storeu_ps(res + i, _mm256_add_ps(_mm256_loadu_ps(res + i), _mm256_loadu_ps(x + i)));
    for (; i < dim; i++) res[i] += x[i];
    tm_cpu_rmsnorm_row_avx2(res, w, eps, dim, out);
}

static inline float dot_f32(const float *a, const float *b, int32_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *acc, float p, const float *v, int32_t n) {
    __m256 pv = _mm256_set1_ps(p);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] += p * v[i];
}

static inline void scale(float *acc, float c, int32_t n) {
    __m256 cv = _mm256_set1_ps(c);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(cv, _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] *= c;
}

/* [sum(s0), sum(s1), ..., sum(s7)]: the eight horizontal sums in one transposing tree */
static inline __m256 hsum8(const __m256 s[8]) {
    const __m256 t0 = _mm256_hadd_ps(s[0], s[1]), t1 = _mm256_hadd_ps(s[2], s[3]);
    const __m256 t2 = _mm256_hadd_ps(s[4], s[5]), t3 = _mm256_hadd_ps(s[6], s[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* (s0..s3 low, s0..s3 high), ... */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* The block's keys eight at a time: scores by eight dot products sharing each q load and one transposing sum
 * (a group's missing keys repeat its last one and are dropped); probabilities by the vector exp; then each
 * 8-dim slice of the accumulator is loaded once, rescaled, and takes every key's p * v in key order. head_dim
 * not a multiple of 8 (or above 256) takes the one-key-at-a-time loop. Deterministic: a key's arithmetic
 * depends only on the block's count and its place in it. */
void tm_cpu_attn_block_avx2(tm_cpu_attn_state *st, const float *q, const float *k, const float *v, int32_t cnt,
                            int32_t hd, float sc, float *scores) {
    if (hd % 8 != 0 || hd > 256 || cnt <= 0) {
        float bm = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            float s = dot_f32(q, k + (size_t)j * (size_t)hd, hd) * sc;
            scores[j] = s;
            if (s > bm) bm = s;
        }
        float m_new = bm > st->m ? bm : st->m;
        float corr = expf(st->m - m_new);
        if (corr != 1.0f) {
            st->l *= corr;
            scale(st->acc, corr, hd);
        }
        st->m = m_new;
        for (int32_t j = 0; j < cnt; j++) {
            float p = expf(scores[j] - m_new);
            st->l += p;
            axpy(st->acc, p, v + (size_t)j * (size_t)hd, hd);
        }
        return;
    }
    const int32_t nv = hd / 8;
    const __m256 vsc = _mm256_set1_ps(sc);
    float bm = -INFINITY;
    for (int32_t j0 = 0; j0 < cnt; j0 += 8) {
        const float *kr[8];
        for (int i = 0; i < 8; i++) kr[i] = k + (size_t)(j0 + i < cnt ? j0 + i : cnt - 1) * (size_t)hd;
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int32_t c = 0; c < nv; c++) {
            const __m256 qc = _mm256_loadu_ps(q + 8 * c);
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kr[i] + 8 * c), a[i]);
        }
        _mm256_storeu_ps(scores + j0, _mm256_mul_ps(hsum8(a), vsc));
        for (int32_t j = j0; j < cnt && j < j0 + 8; j++) bm = scores[j] > bm ? scores[j] : bm;
    }
    const float m_new = bm > st->m ? bm : st->m, corr = expf(st->m - m_new);
    const __m256 vm = _mm256_set1_ps(m_new);
    for (int32_t j0 = 0; j0 < cnt; j0 += 8) /* p = exp(s - m); the group's dropped keys come out too, unread */
        _mm256_storeu_ps(scores + j0, exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + j0), vm)));
    float l = st->l * corr;
    for (int32_t j = 0; j < cnt; j++) l += scores[j];
    st->l = l;
    st->m = m_new;
    /* acc = acc * corr + sum_j p_j v_j, keys in order per element; 64 dims at a time in 8 registers, so that
     * the 8 FMA chains run side by side (one chain per slice would wait out the FMA latency key after key) */
    const __m256 vc = _mm256_set1_ps(corr);
    int32_t c0 = 0;
    for (; c0 + 8 <= nv; c0 += 8) {
        float *acc = st->acc + 8 * c0;
        const float *vr = v + 8 * c0;
        __m256 r[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), vc);
        for (int32_t j = 0; j < cnt; j++, vr += hd) {
            const __m256 pj = _mm256_broadcast_ss(scores + j);
            for (int i = 0; i < 8; i++) r[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * i), r[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + 8 * i, r[i]);
    }
    for (; c0 < nv; c0 += 2) { /* the rest, two slices at a time (nv - c0 is then even or the last one) */
        const int two = c0 + 1 < nv;
        __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(st->acc + 8 * c0), vc), r1 = _mm256_setzero_ps();
        if (two) r1 = _mm256_mul_ps(_mm256_loadu_ps(st->acc + 8 * c0 + 8), vc);
        for (int32_t j = 0; j < cnt; j++) {
            const __m256 pj = _mm256_broadcast_ss(scores + j);
            const float *vr = v + (size_t)j * (size_t)hd + 8 * c0;
            r0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr), r0);
            if (two) r1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8), r1);
        }
        _mm256_storeu_ps(st->acc + 8 * c0, r0);
        if (two) _mm256_storeu_ps(st->acc + 8 * c0 + 8, r1);
    }
}

/* e4m3 byte b, with its sign moved to bit 15 and the other 7 bits to bits 7..13, is an f16 whose value is
 * b's value times 2^-8, for normal and subnormal b alike (bias 15 vs 7, the same 3 mantissa bits); 0x7f / 0xff
 * (NaN) would read as +-480, so they are blended to NaN. */
void tm_cpu_fp8_to_f32_avx2(const uint8_t *x, float *out, int64_t n) {
    int64_t i = 0;
    const __m128i m7f = _mm_set1_epi16(0x7f), m80 = _mm_set1_epi16(0x80);
    const __m256 k256 = _mm256_set1_ps(256.0f), nan = _mm256_set1_ps(NAN);
    for (; i + 8 <= n; i += 8) {
        const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(x + i)));
        const __m128i mag = _mm_and_si128(w, m7f);
        const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, m80), 8), _mm_slli_epi16(mag, 7));
        const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), k256);
        const __m256 is_nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, m7f)));
        _mm256_storeu_ps(out + i, _mm256_blendv_ps(f, nan, is_nan));
    }
    if (i < n) tm_cpu_fp8_to_f32(x + i, out + i, n - i);
}

void tm_cpu_f16_to_f32_avx2(const uint16_t *x, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    if (i < n) tm_cpu_f16_to_f32(x + i, out + i, n - i);
}

void tm_cpu_f32_to_f16_avx2(const float *x, void *out, int64_t n) {
    uint16_t *o = out;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) tm_cpu_f32_to_f16(x + i, o + i, n - i);
}

#else
typedef int tm_cpu_kernels_avx2_unused; /* non-x86 builds: the scalar kernels are used */
#endif
