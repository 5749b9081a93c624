/* tm_test_ref.h -- pieces of the naive dense f64 reference forward shared by the model tests. */
#ifndef TM_TEST_REF_H
#define TM_TEST_REF_H

#include <math.h>
#include <stdlib.h>

#include "backend/cpu/tm_quant.h"
#include "model/tm_model.h"

/* (rows, cols) f32 values of a weight, through the CPU dequantization; free() it */
static inline float *dense(const tm_weight *w) {
    float *d = malloc(sizeof(float) * (size_t)w->rows * (size_t)w->cols);
    uint64_t rb = tm_dtype_row_bytes(w->type, (uint64_t)w->cols);
    for (int64_t r = 0; r < w->rows; r++)
        tm_dequant_row(w->type, (const uint8_t *)w->data + rb * (uint64_t)r, d + r * w->cols, w->cols);
    return d;
}

static inline void ref_rmsnorm(const double *x, const tm_weight *w, double eps, int dim, double *out) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++) out[i] = x[i] * r * ((const float *)w->data)[i];
}

/* RoPE of one head in place at position pos (adjacent pairs, or halves for neox) */
static inline void ref_rope(double *x, int pos, const tm_model *m) {
    int half = m->hp.rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double th = (double)pos * (double)m->rope_inv_freq[i], c = cos(th), s = sin(th);
        int a = m->hp.rope_neox ? i : 2 * i, b = m->hp.rope_neox ? i + half : 2 * i + 1;
        double xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}

/* Causal attention of token t: att (n_heads, hd) = softmax(q · K[0..t]ᵀ / sqrt(hd)) · V[0..t] per head, K and V
 * (t + 1, n_kv_heads * hd) with query head h reading KV head h / (n_heads / n_kv_heads); sc: (t + 1) scratch */
static inline void ref_attention(const double *q, const double *K, const double *V, int t, int n_heads, int n_kv_heads,
                                 int hd, double *sc, double *att) {
    const int kvd = n_kv_heads * hd, group = n_heads / n_kv_heads;
    for (int h = 0; h < n_heads; h++) {
        int kh = h / group;
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s <= t; s++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += q[h * hd + i] * K[(size_t)s * kvd + kh * hd + i];
            sc[s] = d / sqrt((double)hd);
            if (sc[s] > mx) mx = sc[s];
        }
        for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int s = 0; s <= t; s++) a += sc[s] * V[(size_t)s * kvd + kh * hd + i];
            att[h * hd + i] = a / sum;
        }
    }
}

/* max |a - b| / max |b|: a (n) from a backend against the f64 reference b */
static inline double ref_rel_err(const float *a, const double *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs(b[i]));
    }
    return md / mb;
}

#endif /* TM_TEST_REF_H */
