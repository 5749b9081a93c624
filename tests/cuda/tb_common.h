/* tb_common.h -- shared helpers of the CUDA kernel test beds: checks, random inputs, poison, timing, result rows. */
#ifndef TB_COMMON_H
#define TB_COMMON_H

/* Every test bed (tests/cuda/tb_<kernel>.c) checks its kernel against a CPU reference on fresh random inputs
 * (outputs poisoned with NaN bit patterns before each run, so unwritten elements fail), over several shapes,
 * then times it with CUDA events (median of repeats after warm-up) and prints one RESULT line per case:
 *   RESULT <kernel> <case> err=<rel err> tol=<tol> <ok|FAIL> us=<median us> GB/s=<x> TFLOP/s=<y> pct=<% of ceiling>
 * scripts/gpu.sh collects the RESULT lines into the final table. Ceilings come from tb_ceiling through the
 * environment: TM_CEIL_COPY_GBS (device copy, bytes read + written per second) and TM_CEIL_GEMM_TFLOPS. */

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TB_CHECK(call)                                                                                          \
    do {                                                                                                        \
        cudaError_t tb_e_ = (call);                                                                             \
        if (tb_e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(tb_e_));           \
            exit(2);                                                                                            \
        }                                                                                                       \
    } while (0)

/* launch + synchronize + check the launch's and the run's errors */
#define TB_RUN(call)                                                                                            \
    do {                                                                                                        \
        TB_CHECK(call);                                                                                         \
        TB_CHECK(cudaDeviceSynchronize());                                                                      \
    } while (0)

static int tb_failures = 0;

/* ---- random numbers (xorshift64*, seeded per run from the clock unless TB_SEED is set) ---- */
static uint64_t tb_rng_state = 0x9e3779b97f4a7c15ull;
static inline void tb_seed(void) {
    const char *s = getenv("TB_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tb_rng_state = s ? strtoull(s, NULL, 0) : ((uint64_t)ts.tv_nsec * 2654435761ull) ^ (uint64_t)ts.tv_sec;
    if (!tb_rng_state) tb_rng_state = 1;
    printf("# seed %llu\n", (unsigned long long)tb_rng_state);
}
static inline uint64_t tb_rand_u64(void) {
    tb_rng_state ^= tb_rng_state >> 12;
    tb_rng_state ^= tb_rng_state << 25;
    tb_rng_state ^= tb_rng_state >> 27;
    return tb_rng_state * 2685821657736338717ull;
}
static inline float tb_uniform(void) { return (float)((double)(tb_rand_u64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }
static inline float tb_normal(void) {
    double u1 = ((double)(tb_rand_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(tb_rand_u64() >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- bf16 ---- */
static inline float tb_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t tb_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* fill host bf16 array with scale * normal, and its exact f32 values into ref (may be NULL) */
static inline void tb_fill_bf16(uint16_t *h, float *ref, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        h[i] = tb_f32_to_bf16(scale * tb_normal());
        if (ref) ref[i] = tb_bf16_to_f32(h[i]);
    }
}
static inline void tb_fill_f32(float *h, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) h[i] = scale * tb_normal();
}

/* ---- device buffers ---- */
static inline void *tb_dev(size_t bytes) {
    void *p = NULL;
    TB_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
static inline void *tb_upload(const void *h, size_t bytes) {
    void *d = tb_dev(bytes);
    TB_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static inline void tb_download(void *h, const void *d, size_t bytes) {
    TB_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}
/* 0xFF bytes: NaN in f32, bf16 and f16, -1 in integers */
static inline void tb_poison(void *d, size_t bytes) { TB_CHECK(cudaMemset(d, 0xFF, bytes)); }

/* ---- comparison: ||out - ref|| / ||ref|| in double; any NaN/Inf in out fails ---- */
static inline double tb_rel_err(const float *out, const float *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        double d = (double)out[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
static inline double tb_rel_err_bf16(const uint16_t *out, const float *ref, size_t n) {
    float *o = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) o[i] = tb_bf16_to_f32(out[i]);
    double e = tb_rel_err(o, ref, n);
    free(o);
    return e;
}

/* ---- timing: median of `reps` runs of fn(arg) after `warm` warm-ups, in microseconds ---- */
typedef void (*tb_fn)(void *arg);
static int tb_cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static inline double tb_time_us(tb_fn fn, void *arg, int warm, int reps) {
    cudaEvent_t e0, e1;
    TB_CHECK(cudaEventCreate(&e0));
    TB_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < warm; i++) fn(arg);
    TB_CHECK(cudaDeviceSynchronize());
    float *ms = (float *)malloc((size_t)reps * sizeof(float));
    for (int i = 0; i < reps; i++) {
        TB_CHECK(cudaEventRecord(e0, 0));
        fn(arg);
        TB_CHECK(cudaEventRecord(e1, 0));
        TB_CHECK(cudaEventSynchronize(e1));
        TB_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    TB_CHECK(cudaGetLastError());
    qsort(ms, (size_t)reps, sizeof(float), tb_cmp_f);
    double med = (double)ms[reps / 2] * 1000.0;
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return med;
}

static inline double tb_env_d(const char *name, double dflt) {
    const char *s = getenv(name);
    return s && *s ? atof(s) : dflt;
}

/* TB_SOAK_S=s (> 0): fn back to back for about s seconds, so that the clocks settle as they do under a sustained
 * load (the H200 holds its 700 W cap by lowering the SM clock); returns the mean microseconds per call over the
 * second half (0 when TB_SOAK_S is unset). Sample nvidia-smi beside it for the power and clock. */
static inline double tb_soak_us(tb_fn fn, void *arg) {
    const double secs = tb_env_d("TB_SOAK_S", 0.0);
    if (!(secs > 0.0)) return 0.0;
    cudaEvent_t e0, e1;
    TB_CHECK(cudaEventCreate(&e0));
    TB_CHECK(cudaEventCreate(&e1));
    double elapsed_ms = 0.0, half_ms = 0.0;
    long half_calls = 0;
    while (elapsed_ms < secs * 1e3) {
        enum { BATCH = 32 };
        TB_CHECK(cudaEventRecord(e0, 0));
        for (int i = 0; i < BATCH; i++) fn(arg);
        TB_CHECK(cudaEventRecord(e1, 0));
        TB_CHECK(cudaEventSynchronize(e1));
        float ms;
        TB_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        elapsed_ms += ms;
        if (elapsed_ms >= secs * 5e2) {
            half_ms += ms;
            half_calls += BATCH;
        }
    }
    TB_CHECK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return half_calls ? half_ms * 1e3 / (double)half_calls : 0.0;
}

/* One result line. bytes / flops: the minimum moved / computed by the case (0 when not meaningful); the
 * percentage is of the copy ceiling for memory-bound cases (flops == 0 or bound == 'm'), else of the GEMM one. */
static inline void tb_result(const char *kernel, const char *cas, double err, double tol, double us, double bytes,
                             double flops, char bound) {
    bool ok = err <= tol;
    if (!ok) tb_failures++;
    double gbs = us > 0 ? bytes / (us * 1e3) : 0.0, tfl = us > 0 ? flops / (us * 1e6) : 0.0;
    double ceil_bw = tb_env_d("TM_CEIL_COPY_GBS", 4300.0), ceil_mm = tb_env_d("TM_CEIL_GEMM_TFLOPS", 780.0);
    double pct = bound == 'm' ? 100.0 * gbs / ceil_bw : 100.0 * tfl / ceil_mm;
    printf("RESULT %-14s %-34s err=%.2e tol=%.0e %-4s us=%10.2f GB/s=%8.1f TFLOP/s=%7.2f pct=%5.1f\n", kernel, cas,
           err, tol, ok ? "ok" : "FAIL", us, gbs, tfl, pct);
    fflush(stdout);
}

static inline int tb_finish(const char *name) {
    printf("# %s: %s (%d failed)\n", name, tb_failures ? "FAIL" : "ok", tb_failures);
    return tb_failures ? 1 : 0;
}

#endif /* TB_COMMON_H */
