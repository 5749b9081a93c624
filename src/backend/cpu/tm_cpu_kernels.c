/* tm_cpu_kernels.c -- row kernels of the CPU backend (portable C the compiler vectorises). */
#include "tm_cpu_kernels.h"
#include "core/tm_fp8.h"

#include <math.h>

void tm_cpu_rmsnorm_row(const float *x, const float *w, float eps, int32_t dim, float *out) {
    float ss = 0.0f;
    for (int32_t i = 0; i < dim; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int32_t i = 0; i < dim; i++) out[i] = x[i] * r * w[i];
}

void tm_cpu_add_rmsnorm_row(float *res, const float *x, const float *w, float eps, int32_t dim, float *out) {
    float ss = 0.0f;
    for (int32_t i = 0; i < dim; i++) {
        float v = res[i] + x[i];
        res[i] = v;
        ss += v * v;
    }
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int32_t i = 0; i < dim; i++) out[i] = res[i] * r * w[i];
}

void tm_cpu_rope_head(float *x, const float *cs, int32_t half, bool neox) {
    if (neox) {
        for (int32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1], a = x[i], b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = a * s + b * c;
        }
    } else {
        for (int32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1], a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    }
}

void tm_cpu_swiglu(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = g[i];
        out[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

void tm_cpu_attn_begin(tm_cpu_attn_state *st, float *out, int32_t hd) {
    st->m = -INFINITY;
    st->l = 0.0f;
    st->acc = out;
    st->hd = hd;
    for (int32_t i = 0; i < hd; i++) out[i] = 0.0f;
}

void tm_cpu_attn_block(tm_cpu_attn_state *st, const float *q, const float *k, const float *v, int32_t cnt, int32_t hd,
                       float scale, float *scores) {
    float bm = -INFINITY;
    for (int32_t j = 0; j < cnt; j++) {
        const float *kj = k + (size_t)j * (size_t)hd;
        float s = 0.0f;
        for (int32_t d = 0; d < hd; d++) s += q[d] * kj[d];
        s *= scale;
        scores[j] = s;
        if (s > bm) bm = s;
    }
    float m_new = bm > st->m ? bm : st->m;
    float corr = expf(st->m - m_new); /* 0 on the first block (m = -inf) */
    if (corr != 1.0f) {
        st->l *= corr;
        for (int32_t d = 0; d < hd; d++) st->acc[d] *= corr;
    }
    st->m = m_new;
    for (int32_t j = 0; j < cnt; j++) {
        float p = expf(scores[j] - m_new);
        st->l += p;
        const float *vj = v + (size_t)j * (size_t)hd;
        for (int32_t d = 0; d < hd; d++) st->acc[d] += p * vj[d];
    }
}

void tm_cpu_attn_merge(tm_cpu_attn_state *st, const tm_cpu_attn_state *p) {
    const float m = p->m > st->m ? p->m : st->m;
    if (m == -INFINITY) return; /* neither has seen a finite score */
    const float a = expf(st->m - m), b = expf(p->m - m);
    st->l = st->l * a + p->l * b;
    for (int32_t d = 0; d < st->hd; d++) st->acc[d] = st->acc[d] * a + p->acc[d] * b;
    st->m = m;
}

void tm_cpu_attn_end(tm_cpu_attn_state *st) {
    float inv = st->l > 0.0f ? 1.0f / st->l : 0.0f;
    for (int32_t d = 0; d < st->hd; d++) st->acc[d] *= inv;
}

void tm_cpu_fp8_to_f32(const uint8_t *x, float *out, int64_t n) { tm_fp8_row_to_f32(x, out, n); }

void tm_cpu_f16_to_f32(const uint16_t *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = tm_f16_to_f32(x[i]);
}

void tm_cpu_f32_to_f16(const float *x, void *out, int64_t n) {
    uint16_t *o = out;
    for (int64_t i = 0; i < n; i++) o[i] = tm_f32_to_f16(x[i]);
}

tm_cpu_kernel_table tm_cpu_kernels_select(bool avx2) {
    tm_cpu_kernel_table t = {tm_cpu_rmsnorm_row, tm_cpu_add_rmsnorm_row, tm_cpu_swiglu, tm_cpu_attn_block,
                             tm_cpu_fp8_to_f32, tm_cpu_f16_to_f32, tm_cpu_f32_to_f16};
#if defined(__x86_64__) || defined(__i386__)
    if (avx2) {
        t.fp8_to_f32 = tm_cpu_fp8_to_f32_avx2;
        t.f16_to_f32 = tm_cpu_f16_to_f32_avx2;
        t.f32_to_f16 = tm_cpu_f32_to_f16_avx2;
        t.rmsnorm_row = tm_cpu_rmsnorm_row_avx2;
        t.add_rmsnorm_row = tm_cpu_add_rmsnorm_row_avx2;
        t.swiglu = tm_cpu_swiglu_avx2;
        t.attn_block = tm_cpu_attn_block_avx2;
    }
#else
    (void)avx2;
#endif
    return t;
}
