/* tm_core.h -- status helpers, allocation, clocks, fp16/bf16 conversion, CPU features. */
#ifndef TM_CORE_H
#define TM_CORE_H

#include "tokenmill.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define TM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TM_PRINTF(a, b)
#endif

/* Set err (if non-NULL) to code + formatted message; returns code so callers can `return tm_err(...)`. */
tm_status tm_err(tm_error *err, tm_status code, const char *fmt, ...) TM_PRINTF(3, 4);
/* Prefix an existing error message with context ("loading x: <old msg>"). Returns err->code. */
tm_status tm_err_prefix(tm_error *err, const char *fmt, ...) TM_PRINTF(2, 3);

/* Allocation helpers: NULL on failure or on overflow of n*size. */
void *tm_malloc(size_t size);
void *tm_calloc(size_t n, size_t size);
void *tm_malloc_array(size_t n, size_t size);
void *tm_aligned_alloc(size_t align, size_t size); /* free with tm_aligned_free */
/* Large buffers streamed every step (decode copies of the weights, the KV cache): 2 MiB aligned and, on Linux,
 * advised to transparent huge pages (the 4 KiB TLB reach is tiny against ~100 MB read per token). The size is
 * rounded up to 2 MiB; untouched huge pages take no memory. Free with tm_huge_free. */
void *tm_huge_alloc(size_t size);
void tm_huge_free(void *p);
void tm_aligned_free(void *p);
char *tm_strndup(const char *s, size_t n);
/* checked arithmetic: return false on overflow */
static inline bool tm_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool tm_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

/* Monotonic clock in seconds / nanoseconds. */
double tm_time_s(void);
uint64_t tm_time_ns(void);

/* Half precision conversions (IEEE fp16 and bfloat16), scalar reference versions. */
float tm_f16_to_f32(uint16_t h);
uint16_t tm_f32_to_f16(float f);
static inline float tm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t tm_f32_to_bf16(float f); /* round to nearest even, NaN kept */

/* CPU features detected at run time. */
typedef struct tm_cpu_features {
    bool avx2, fma, f16c;
} tm_cpu_features;
tm_cpu_features tm_cpu_detect(void);
/* true when AVX2+FMA+F16C kernels can be used and TM_FORCE_SCALAR is not set in the environment */
bool tm_cpu_use_avx2(void);
int tm_cpu_count(void);

/* Read-only file mapping. */
typedef struct tm_mmap {
    void *data;    /* (size) bytes, read-only */
    uint64_t size;
} tm_mmap;
tm_status tm_mmap_open(const char *path, tm_mmap *m, tm_error *err);
void tm_mmap_close(tm_mmap *m);

/* Logging to stderr with a level; quiet by default, TM_LOG=debug|info raises it. */
typedef enum { TM_LOG_ERROR = 0, TM_LOG_WARN, TM_LOG_INFO, TM_LOG_DEBUG } tm_log_level;
void tm_log(tm_log_level lvl, const char *fmt, ...) TM_PRINTF(2, 3);

#endif /* TM_CORE_H */
