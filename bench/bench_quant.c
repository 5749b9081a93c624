/* bench_quant.c -- single-thread GB/s of weight bytes for each type's dot kernels over a 4096x4096 matrix. */
/*
 * Build and run (from the repo root):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc -c src/backend/cpu/tm_quant_avx2.c -mavx2 -mfma -mf16c -o /tmp/tq_avx2.o
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_quant.c src/backend/cpu/tm_quant.c src/core/tm_core.c \
 *       src/core/tm_dtype.c /tmp/tq_avx2.o -lm -lpthread -o /tmp/bench_quant && /tmp/bench_quant [rows cols]
 * Prints one JSON object per (type, isa, kernel): "vec_dot" is one vec_dot call per row, "mat_dot" is the tiled
 * entry for one activation row (decode), "mat_dot_b8" the tiled entry for 8 activation rows (prefill; GB/s
 * counts the weight bytes once per pass, GFLOP/s counts 2*rows*cols*8).
 */
#include "backend/cpu/tm_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float frand(uint64_t *s) { return (float)((double)(rng(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

typedef struct {
    const tm_quant_ops *o;
    int64_t rows, cols, nc;
    const uint8_t *w; /* (rows, wrb) */
    size_t wrb;
    const uint8_t *a; /* (nc, arb) */
    size_t arb;
    float *out;       /* (nc, rows) */
} job;

static void run_vec(const job *j) {
    for (int64_t r = 0; r < j->rows; r++) j->out[r] = j->o->vec_dot(j->cols, j->w + (size_t)r * j->wrb, j->a);
}

static void run_mat(const job *j) {
    j->o->mat_dot(j->cols, j->rows, j->w, j->wrb, j->nc, j->a, j->arb, j->out, (size_t)j->rows);
}

/* Seconds per call: the minimum over many short samples (>= 2 ms each, ~0.6 s in all), so that a
 * machine shared with other work still shows the kernel's own speed. */
static double time_it(void (*fn)(const job *), const job *j) {
    double best = 1e30, start = tm_time_s();
    fn(j); /* warm caches */
    for (int s = 0; s < 1000 && (s < 20 || tm_time_s() - start < 0.6); s++) {
        int reps = 0;
        double t0 = tm_time_s(), t1;
        do {
            fn(j);
            reps++;
            t1 = tm_time_s();
        } while (t1 - t0 < 0.002);
        double per = (t1 - t0) / reps;
        if (per < best) best = per;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t rows = argc > 2 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 4096;
    if (rows <= 0 || cols <= 0 || cols % 32) {
        fprintf(stderr, "usage: bench_quant [rows cols]  (cols a multiple of 32; K-quants need 256)\n");
        return 1;
    }
    const tm_dtype types[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
    const int nb = 8;
    uint64_t seed = 1;
    float *x = malloc((size_t)cols * sizeof(float) * nb), *row = malloc((size_t)cols * sizeof(float));
    float *out = malloc((size_t)rows * sizeof(float) * nb);
    if (!x || !row || !out) return 1;
    for (int64_t i = 0; i < cols * nb; i++) x[i] = frand(&seed);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const tm_dtype t = types[k];
        const size_t wrb = (size_t)tm_dtype_row_bytes(t, (uint64_t)cols);
        if (wrb == 0) continue; /* cols not a multiple of this type's block */
        uint8_t *w = malloc(wrb * (size_t)rows);
        if (!w) return 1;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < cols; i++) row[i] = frand(&seed) * 0.05f;
            tm_quant_row(t, row, w + (size_t)r * wrb, cols);
        }
        for (int isa = 0; isa < 2; isa++) {
            const tm_quant_ops *o = tm_quant_ops_get_isa(t, (tm_isa)isa);
            if (!o || (isa == TM_ISA_AVX2 && !tm_cpu_use_avx2())) continue;
            const size_t arb = o->act_type == TM_DT_F32 ? (size_t)cols * sizeof(float)
                                                        : (size_t)tm_dtype_row_bytes(o->act_type, (uint64_t)cols);
            uint8_t *a = malloc(arb * nb);
            if (!a) return 1;
            for (int c = 0; c < nb; c++) o->from_float(x + (size_t)c * (size_t)cols, a + (size_t)c * arb, cols);
            const double gb = (double)wrb * (double)rows * 1e-9;
            job j = {o, rows, cols, 1, w, wrb, a, arb, out};
            double tv = time_it(run_vec, &j), tm = time_it(run_mat, &j);
            j.nc = nb;
            double tb = time_it(run_mat, &j);
            const char *isan = isa ? "avx2" : "scalar";
            printf("{\"type\":\"%s\",\"isa\":\"%s\",\"kernel\":\"vec_dot\",\"rows\":%lld,\"cols\":%lld,\"ms\":%.3f,\"GBps\":%.2f}\n",
                   tm_dtype_name(t), isan, (long long)rows, (long long)cols, tv * 1e3, gb / tv);
            printf("{\"type\":\"%s\",\"isa\":\"%s\",\"kernel\":\"mat_dot\",\"rows\":%lld,\"cols\":%lld,\"ms\":%.3f,\"GBps\":%.2f}\n",
                   tm_dtype_name(t), isan, (long long)rows, (long long)cols, tm * 1e3, gb / tm);
            printf("{\"type\":\"%s\",\"isa\":\"%s\",\"kernel\":\"mat_dot_b8\",\"rows\":%lld,\"cols\":%lld,\"ms\":%.3f,\"GBps\":%.2f,"
                   "\"GFLOPs\":%.1f}\n",
                   tm_dtype_name(t), isan, (long long)rows, (long long)cols, tb * 1e3, gb / tb,
                   2.0 * (double)rows * (double)cols * nb / tb * 1e-9);
            fflush(stdout);
            free(a);
        }
        free(w);
    }
    free(x);
    free(row);
    free(out);
    return 0;
}
