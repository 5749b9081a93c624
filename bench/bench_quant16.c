/* bench_quant16.c -- single-thread micro-benchmark: 16-bit-activation dots (Q16) against the 8-bit ones (Q8). */
/*
 * Build and run (from the repo root):
 *   gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc -mavx2 -mfma -mf16c -c src/backend/cpu/tm_quant_avx2.c -o /tmp/tq8.o
 *   gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc -mavx2 -mfma -mf16c -c src/backend/cpu/tm_quant16_avx2.c \
 *       -o /tmp/tq16.o
 *   gcc -std=c11 -O3 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_quant16.c src/backend/cpu/tm_quant.c \
 *       src/backend/cpu/tm_quant16.c src/core/tm_core.c src/core/tm_dtype.c /tmp/tq8.o /tmp/tq16.o -lm -lpthread \
 *       -o /tmp/bench_quant16 && /tmp/bench_quant16 [rows cols [type [quick]]]
 * For each weight type (4096 x 4096 by default) and activation format (q8 = tm_quant_ops_get_isa, q16 =
 * tm_quant16_ops_get_isa, both AVX2) prints one JSON object per kernel:
 *   vec_dot      one activation row, one vec_dot call per weight row
 *   mat_dot_b1   one activation row through mat_dot (decode's matmul: several weight rows per kernel call)
 *   vec_dot_bN   N activation rows as N separate vec_dot passes (the baseline batching has to beat)
 *   multi_bN     q16 only: tm_vec_dot_multi_fn on tiles of 1 weight row x 8 activation rows
 *   mat_dot_bN   the ops table's mat_dot with N activation rows (what a prefill matmul calls)
 * ms is per pass over the matrix, GBps = weight bytes / ms (weights counted once per pass), GMACps =
 * rows * cols * N / ms; "x_vec" is the per-row speed-up over vec_dot_bN. With a type and "quick" only the q16
 * vec_dot and multi_b8 run (x_vec then against 8 x vec_dot). Timing is the minimum over many
 * short samples, so a machine shared with other work still shows the kernel's own speed.
 */
#include "backend/cpu/tm_quant16.h"

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
    tm_vec_dot_multi_fn multi;
    int64_t rows, cols, nc;
    const uint8_t *w; /* (rows, wrb) */
    size_t wrb;
    const uint8_t *a; /* (nc, arb) */
    size_t arb;
    float *out;       /* (nc, rows) */
} job;

static void run_vec(const job *j) {
    for (int64_t c = 0; c < j->nc; c++)
        for (int64_t r = 0; r < j->rows; r++)
            j->out[c * j->rows + r] = j->o->vec_dot(j->cols, j->w + (size_t)r * j->wrb, j->a + (size_t)c * j->arb);
}

static void run_multi(const job *j) {
    float v[TM_QUANT16_MULTI_MAX];
    for (int64_t c = 0; c < j->nc; c += TM_QUANT16_MULTI_MAX) {
        const int k = (int)(j->nc - c < TM_QUANT16_MULTI_MAX ? j->nc - c : TM_QUANT16_MULTI_MAX);
        for (int64_t r = 0; r < j->rows; r++) {
            j->multi(j->cols, j->w + (size_t)r * j->wrb, j->a + (size_t)c * j->arb, j->arb, k, v);
            for (int q = 0; q < k; q++) j->out[(c + q) * j->rows + r] = v[q];
        }
    }
}

static void run_mat(const job *j) {
    j->o->mat_dot(j->cols, j->rows, j->w, j->wrb, j->nc, j->a, j->arb, j->out, (size_t)j->rows);
}

/* Seconds per call: the minimum over short samples (>= 2 ms each, ~0.4 s in all). */
static double time_it(void (*fn)(const job *), const job *j) {
    double best = 1e30, start = tm_time_s();
    fn(j); /* warm caches */
    for (int s = 0; s < 1000 && (s < 10 || tm_time_s() - start < 0.4); s++) {
        int reps = 0;
        double t0 = tm_time_s(), t1;
        do {
            fn(j);
            reps++;
            t1 = tm_time_s();
        } while (t1 - t0 < 0.002);
        const double per = (t1 - t0) / reps;
        if (per < best) best = per;
    }
    return best;
}

static void report(const char *type, const char *act, const char *kernel, const job *j, double t, double t_vec) {
    const double gb = (double)j->wrb * (double)j->rows * 1e-9;
    const double gmac = (double)j->rows * (double)j->cols * (double)j->nc * 1e-9;
    printf("{\"type\":\"%s\",\"act\":\"%s\",\"kernel\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"ms\":%.3f,\"GBps\":%.2f,"
           "\"GMACps\":%.2f",
           type, act, kernel, (long long)j->rows, (long long)j->cols, t * 1e3, gb / t, gmac / t);
    if (t_vec > 0) printf(",\"x_vec\":%.2f", t_vec / t);
    printf("}\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    const int64_t rows = argc > 2 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 4096;
    const char *only = argc > 3 ? argv[3] : NULL;
    const int quick = argc > 4 && strcmp(argv[4], "quick") == 0; /* vec_dot and multi_b8 only */
    if (rows <= 0 || cols <= 0 || cols % 256) {
        fprintf(stderr, "usage: bench_quant16 [rows cols [type [quick]]]  (cols a multiple of 256)\n");
        return 1;
    }
    if (!tm_cpu_use_avx2()) {
        fprintf(stderr, "bench_quant16: needs AVX2/FMA/F16C (and TM_FORCE_SCALAR unset)\n");
        return 1;
    }
    const tm_dtype types[] = {TM_DT_Q8_0, TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
    const int batches[] = {8, 32}, maxb = 32;
    uint64_t seed = 1;
    float *x = malloc((size_t)cols * sizeof(float) * maxb), *row = malloc((size_t)cols * sizeof(float));
    float *out = malloc((size_t)rows * sizeof(float) * maxb);
    if (!x || !row || !out) return 1;
    for (int64_t i = 0; i < cols * maxb; i++) x[i] = frand(&seed);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const tm_dtype t = types[k];
        if (only && strcmp(only, tm_dtype_name(t)) != 0) continue;
        const size_t wrb = (size_t)tm_dtype_row_bytes(t, (uint64_t)cols);
        uint8_t *w = malloc(wrb * (size_t)rows);
        if (!w) return 1;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < cols; i++) row[i] = frand(&seed) * 0.05f;
            tm_quant_row(t, row, w + (size_t)r * wrb, cols);
        }
        for (int q16 = quick; q16 < 2; q16++) {
            const tm_quant_ops *o = q16 ? tm_quant16_ops_get_isa(t, TM_ISA_AVX2) : tm_quant_ops_get_isa(t, TM_ISA_AVX2);
            if (!o) continue;
            const char *an = q16 ? "q16" : "q8";
            const size_t arb = (size_t)tm_dtype_row_bytes(o->act_type, (uint64_t)cols);
            uint8_t *a = malloc(arb * maxb);
            if (!a) return 1;
            for (int c = 0; c < maxb; c++) o->from_float(x + (size_t)c * (size_t)cols, a + (size_t)c * arb, cols);
            job j = {o, q16 ? tm_quant16_multi_get(t) : NULL, rows, cols, 1, w, wrb, a, arb, out};
            const double tv = time_it(run_vec, &j);
            report(tm_dtype_name(t), an, "vec_dot", &j, tv, 0);
            report(tm_dtype_name(t), an, "mat_dot_b1", &j, time_it(run_mat, &j), tv); /* decode's matmul */
            for (size_t b = 0; b < (quick ? 1 : sizeof batches / sizeof batches[0]); b++) {
                char name[32];
                j.nc = batches[b];
                if (quick) {
                    if (j.multi) report(tm_dtype_name(t), an, "multi_b8", &j, time_it(run_multi, &j), 8 * tv);
                    continue;
                }
                const double tvb = time_it(run_vec, &j);
                snprintf(name, sizeof name, "vec_dot_b%d", batches[b]);
                report(tm_dtype_name(t), an, name, &j, tvb, 0);
                if (j.multi) {
                    snprintf(name, sizeof name, "multi_b%d", batches[b]);
                    report(tm_dtype_name(t), an, name, &j, time_it(run_multi, &j), tvb);
                }
                snprintf(name, sizeof name, "mat_dot_b%d", batches[b]);
                report(tm_dtype_name(t), an, name, &j, time_it(run_mat, &j), tvb);
            }
            free(a);
        }
        free(w);
    }
    free(x);
    free(row);
    free(out);
    return 0;
}
