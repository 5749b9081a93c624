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

#endif /* TM_TEST_REF_H */
