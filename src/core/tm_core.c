/* tm_core.c -- status helpers, allocation, clocks, fp16/bf16 conversion, CPU features, mmap, logging. */
#include "tm_core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

const char *tm_status_name(tm_status s) {
    switch (s) {
    case TM_OK: return "ok";
    case TM_ERR_IO: return "io error";
    case TM_ERR_FORMAT: return "format error";
    case TM_ERR_NOMEM: return "out of memory";
    case TM_ERR_INVALID: return "invalid argument";
    case TM_ERR_UNSUPPORTED: return "unsupported";
    case TM_ERR_RANGE: return "out of range";
    case TM_ERR_INTERNAL: return "internal error";
    case TM_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

tm_status tm_err(tm_error *err, tm_status code, const char *fmt, ...) {
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

tm_status tm_err_prefix(tm_error *err, const char *fmt, ...) {
    if (!err) return TM_ERR_INTERNAL;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t np = strlen(prefix);
    if (np > sizeof err->msg - 3) np = sizeof err->msg - 3;
    memcpy(err->msg, prefix, np);
    memcpy(err->msg + np, ": ", 2);
    size_t room = sizeof err->msg - np - 3, no = strnlen(old, sizeof old - 1);
    if (no > room) no = room;
    memcpy(err->msg + np + 2, old, no);
    err->msg[np + 2 + no] = '\0';
    return err->code;
}

void *tm_malloc(size_t size) { return malloc(size ? size : 1); }
void *tm_calloc(size_t n, size_t size) { return calloc(n ? n : 1, size ? size : 1); }
void *tm_malloc_array(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return NULL;
    return malloc(total ? total : 1);
}
void *tm_aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : align) != 0) return NULL;
    return p;
}
void tm_aligned_free(void *p) { free(p); }

void *tm_huge_alloc(size_t size) {
    const size_t huge = (size_t)2 << 20;
    if (size > SIZE_MAX - huge) return NULL;
    const size_t sz = (size ? size + huge - 1 : huge) / huge * huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, sz) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, sz, MADV_HUGEPAGE); /* advice only: without THP the buffer keeps 4 KiB pages */
#endif
    return p;
}
void tm_huge_free(void *p) { free(p); }
char *tm_strndup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

double tm_time_s(void) { return (double)tm_time_ns() * 1e-9; }
uint64_t tm_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

float tm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t tm_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff);
    uint32_t mant = u & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into exponent: correct */
    return (uint16_t)(sign | half);
}

uint16_t tm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

tm_cpu_features tm_cpu_detect(void) {
    tm_cpu_features f = {0};
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        f.fma = (c >> 12) & 1;
        f.f16c = (c >> 29) & 1;
        bool osxsave = (c >> 27) & 1;
        bool avx = (c >> 28) & 1;
        if (osxsave && avx) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            bool ymm_ok = (lo & 6) == 6;
            if (ymm_ok && __get_cpuid_count(7, 0, &a, &b, &c, &d)) f.avx2 = (b >> 5) & 1;
            if (!ymm_ok) f.fma = f.f16c = false;
        } else {
            f.fma = f.f16c = false;
        }
    }
#endif
    return f;
}

bool tm_cpu_use_avx2(void) {
    const char *force = getenv("TM_FORCE_SCALAR");
    if (force && *force && strcmp(force, "0") != 0) return false;
    tm_cpu_features f = tm_cpu_detect();
    return f.avx2 && f.fma && f.f16c;
}

int tm_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

tm_status tm_mmap_open(const char *path, tm_mmap *m, tm_error *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tm_err(err, TM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        tm_status s = tm_err(err, TM_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tm_err(err, TM_ERR_IO, "'%s' is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return tm_err(err, TM_ERR_FORMAT, "'%s' is empty", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return tm_err(err, TM_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    m->data = p;
    m->size = (uint64_t)st.st_size;
    return TM_OK;
}

void tm_mmap_close(tm_mmap *m) {
    if (m && m->data) munmap(m->data, (size_t)m->size);
    if (m) { m->data = NULL; m->size = 0; }
}

void tm_log(tm_log_level lvl, const char *fmt, ...) {
    const char *env = getenv("TM_LOG");
    tm_log_level max = TM_LOG_WARN;
    if (env) {
        if (!strcmp(env, "debug")) max = TM_LOG_DEBUG;
        else if (!strcmp(env, "info")) max = TM_LOG_INFO;
        else if (!strcmp(env, "error")) max = TM_LOG_ERROR;
    }
    if (lvl > max) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "tokenmill: %s: ", names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
