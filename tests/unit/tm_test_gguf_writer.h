/* tm_test_gguf_writer.h -- header-only GGUF writer for tests: builds (possibly deliberately broken) files in memory. */
#ifndef TM_TEST_GGUF_WRITER_H
#define TM_TEST_GGUF_WRITER_H

/*
 * Usage:
 *     tm_gw *gw = tm_gw_new(3);
 *     tm_gw_kv_str(gw, "general.architecture", "llama");
 *     tm_gw_kv_u32(gw, "llama.block_count", 2);
 *     uint64_t ne[2] = {64, 8};
 *     tm_gw_tensor(gw, "tok_embd.weight", 0, 2, ne, floats, sizeof floats);  // type = ggml number (0 = f32)
 *     uint8_t *bytes; size_t size;
 *     tm_gw_finish(gw, &bytes, &size);   // bytes: malloc'd, free() it
 *     tm_gw_free(gw);
 *
 * The writer does no validation, so tests can write anything: tm_gw_kv_raw writes a key, a type number and
 * raw value bytes; tm_gw_tensor_info writes a tensor info with arbitrary fields and no data;
 * tm_gw_set_counts overrides the header counts. Version 1 writes 32-bit counts (as GGUF v1 did).
 * Tensor data is laid out in call order, each start padded to the alignment (tm_gw_alignment, default 32);
 * the general.alignment key is NOT written automatically: add it with tm_gw_kv_u32 when it is not 32.
 * Allocation failure aborts (test code only).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF value type numbers (same as tm_gguf_type). */
enum {
    TM_GW_U8 = 0, TM_GW_I8 = 1, TM_GW_U16 = 2, TM_GW_I16 = 3, TM_GW_U32 = 4, TM_GW_I32 = 5, TM_GW_F32 = 6,
    TM_GW_BOOL = 7, TM_GW_STRING = 8, TM_GW_ARRAY = 9, TM_GW_U64 = 10, TM_GW_I64 = 11, TM_GW_F64 = 12,
};

typedef struct tm_gw_buf {
    uint8_t *p;   /* (cap) bytes, n used */
    size_t n, cap;
} tm_gw_buf;

typedef struct tm_gw {
    uint32_t version;
    uint64_t alignment;    /* padding of the data section and of each tensor's data */
    uint64_t n_kv, n_tensors;
    bool counts_set;       /* header counts overridden by tm_gw_set_counts */
    uint64_t hdr_n_kv, hdr_n_tensors;
    tm_gw_buf kv;          /* serialized KV section */
    tm_gw_buf ti;          /* serialized tensor infos */
    tm_gw_buf data;        /* tensor data section, relative offsets */
} tm_gw;

static inline void tm_gw_buf_put(tm_gw_buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = (uint8_t *)realloc(b->p, cap);
        if (!q) abort();
        b->p = q;
        b->cap = cap;
    }
    if (n) {
        if (p) memcpy(b->p + b->n, p, n);
        else memset(b->p + b->n, 0, n);
    }
    b->n += n;
}
static inline void tm_gw_buf_u32(tm_gw_buf *b, uint32_t v) { tm_gw_buf_put(b, &v, 4); }
static inline void tm_gw_buf_u64(tm_gw_buf *b, uint64_t v) { tm_gw_buf_put(b, &v, 8); }
static inline void tm_gw_buf_strn(tm_gw_buf *b, const char *s, size_t n) {
    tm_gw_buf_u64(b, n);
    tm_gw_buf_put(b, s, n);
}
static inline void tm_gw_buf_str(tm_gw_buf *b, const char *s) { tm_gw_buf_strn(b, s, strlen(s)); }

static inline tm_gw *tm_gw_new(uint32_t version) {
    tm_gw *gw = (tm_gw *)calloc(1, sizeof *gw);
    if (!gw) abort();
    gw->version = version;
    gw->alignment = 32;
    return gw;
}

static inline void tm_gw_free(tm_gw *gw) {
    if (!gw) return;
    free(gw->kv.p);
    free(gw->ti.p);
    free(gw->data.p);
    free(gw);
}

/* Padding used for the data section and tensor starts (does not write general.alignment). */
static inline void tm_gw_alignment(tm_gw *gw, uint64_t a) { gw->alignment = a ? a : 1; }
/* Write these counts in the header instead of the real ones. */
static inline void tm_gw_set_counts(tm_gw *gw, uint64_t n_tensors, uint64_t n_kv) {
    gw->counts_set = true;
    gw->hdr_n_tensors = n_tensors;
    gw->hdr_n_kv = n_kv;
}

/* ---- key-value pairs ---- */

/* Key, type number, then nbytes raw value bytes (anything: broken values, nested arrays, ...). */
static inline void tm_gw_kv_raw(tm_gw *gw, const char *key, uint32_t type, const void *value, size_t nbytes) {
    tm_gw_buf_str(&gw->kv, key);
    tm_gw_buf_u32(&gw->kv, type);
    tm_gw_buf_put(&gw->kv, value, nbytes);
    gw->n_kv++;
}
static inline void tm_gw_kv_u8(tm_gw *gw, const char *k, uint8_t v) { tm_gw_kv_raw(gw, k, TM_GW_U8, &v, 1); }
static inline void tm_gw_kv_i8(tm_gw *gw, const char *k, int8_t v) { tm_gw_kv_raw(gw, k, TM_GW_I8, &v, 1); }
static inline void tm_gw_kv_u16(tm_gw *gw, const char *k, uint16_t v) { tm_gw_kv_raw(gw, k, TM_GW_U16, &v, 2); }
static inline void tm_gw_kv_i16(tm_gw *gw, const char *k, int16_t v) { tm_gw_kv_raw(gw, k, TM_GW_I16, &v, 2); }
static inline void tm_gw_kv_u32(tm_gw *gw, const char *k, uint32_t v) { tm_gw_kv_raw(gw, k, TM_GW_U32, &v, 4); }
static inline void tm_gw_kv_i32(tm_gw *gw, const char *k, int32_t v) { tm_gw_kv_raw(gw, k, TM_GW_I32, &v, 4); }
static inline void tm_gw_kv_f32(tm_gw *gw, const char *k, float v) { tm_gw_kv_raw(gw, k, TM_GW_F32, &v, 4); }
static inline void tm_gw_kv_u64(tm_gw *gw, const char *k, uint64_t v) { tm_gw_kv_raw(gw, k, TM_GW_U64, &v, 8); }
static inline void tm_gw_kv_i64(tm_gw *gw, const char *k, int64_t v) { tm_gw_kv_raw(gw, k, TM_GW_I64, &v, 8); }
static inline void tm_gw_kv_f64(tm_gw *gw, const char *k, double v) { tm_gw_kv_raw(gw, k, TM_GW_F64, &v, 8); }
static inline void tm_gw_kv_bool(tm_gw *gw, const char *k, bool v) {
    uint8_t b = v ? 1 : 0;
    tm_gw_kv_raw(gw, k, TM_GW_BOOL, &b, 1);
}
/* String value of n bytes (may hold NULs). */
static inline void tm_gw_kv_strn(tm_gw *gw, const char *key, const char *s, size_t n) {
    tm_gw_kv_raw(gw, key, TM_GW_STRING, NULL, 0);
    tm_gw_buf_strn(&gw->kv, s, n);
}
static inline void tm_gw_kv_str(tm_gw *gw, const char *key, const char *s) { tm_gw_kv_strn(gw, key, s, strlen(s)); }

/* Array of n scalars of element type elem, packed little-endian in data (n * element size bytes). */
static inline void tm_gw_kv_arr(tm_gw *gw, const char *key, uint32_t elem, uint64_t n, const void *data,
                                size_t nbytes) {
    tm_gw_kv_raw(gw, key, TM_GW_ARRAY, NULL, 0);
    tm_gw_buf_u32(&gw->kv, elem);
    tm_gw_buf_u64(&gw->kv, n);
    tm_gw_buf_put(&gw->kv, data, nbytes);
}
static inline void tm_gw_kv_arr_f32(tm_gw *gw, const char *key, const float *v, uint64_t n) {
    tm_gw_kv_arr(gw, key, TM_GW_F32, n, v, (size_t)n * 4);
}
static inline void tm_gw_kv_arr_i32(tm_gw *gw, const char *key, const int32_t *v, uint64_t n) {
    tm_gw_kv_arr(gw, key, TM_GW_I32, n, v, (size_t)n * 4);
}
static inline void tm_gw_kv_arr_u32(tm_gw *gw, const char *key, const uint32_t *v, uint64_t n) {
    tm_gw_kv_arr(gw, key, TM_GW_U32, n, v, (size_t)n * 4);
}
static inline void tm_gw_kv_arr_str(tm_gw *gw, const char *key, const char *const *strs, uint64_t n) {
    tm_gw_kv_arr(gw, key, TM_GW_STRING, n, NULL, 0);
    for (uint64_t i = 0; i < n; i++) tm_gw_buf_str(&gw->kv, strs[i]);
}

/* ---- tensors ---- */

/* A tensor info with arbitrary fields and no data (for broken files): n_dims values from ne are written. */
static inline void tm_gw_tensor_info(tm_gw *gw, const char *name, uint32_t n_dims, const uint64_t *ne,
                                     uint32_t type, uint64_t offset) {
    tm_gw_buf_str(&gw->ti, name);
    tm_gw_buf_u32(&gw->ti, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) tm_gw_buf_u64(&gw->ti, ne[d]);
    tm_gw_buf_u32(&gw->ti, type);
    tm_gw_buf_u64(&gw->ti, offset);
    gw->n_tensors++;
}

/* A tensor whose nbytes bytes of data (zeros when data is NULL) go at the next aligned offset.
 * Returns that offset, relative to the data section. type is the ggml type number. */
static inline uint64_t tm_gw_tensor(tm_gw *gw, const char *name, uint32_t type, uint32_t n_dims,
                                    const uint64_t *ne, const void *data, size_t nbytes) {
    size_t pad = (size_t)((gw->alignment - gw->data.n % gw->alignment) % gw->alignment);
    tm_gw_buf_put(&gw->data, NULL, pad);
    uint64_t off = gw->data.n;
    tm_gw_buf_put(&gw->data, data, nbytes);
    tm_gw_tensor_info(gw, name, n_dims, ne, type, off);
    return off;
}

/* Bytes before the data section of the finished file (header + KVs + tensor infos + padding). */
static inline size_t tm_gw_data_offset(const tm_gw *gw) {
    size_t counts = gw->version == 1 ? 8 : 16;
    size_t n = 8 + counts + gw->kv.n + gw->ti.n;
    return n + (size_t)((gw->alignment - n % gw->alignment) % gw->alignment);
}

/* Serialize: *bytes is malloc'd (free it), *size its length. The writer stays usable. */
static inline void tm_gw_finish(const tm_gw *gw, uint8_t **bytes, size_t *size) {
    tm_gw_buf out = {0};
    uint64_t n_t = gw->counts_set ? gw->hdr_n_tensors : gw->n_tensors;
    uint64_t n_kv = gw->counts_set ? gw->hdr_n_kv : gw->n_kv;
    tm_gw_buf_put(&out, "GGUF", 4);
    tm_gw_buf_u32(&out, gw->version);
    if (gw->version == 1) {
        tm_gw_buf_u32(&out, (uint32_t)n_t);
        tm_gw_buf_u32(&out, (uint32_t)n_kv);
    } else {
        tm_gw_buf_u64(&out, n_t);
        tm_gw_buf_u64(&out, n_kv);
    }
    tm_gw_buf_put(&out, gw->kv.p, gw->kv.n);
    tm_gw_buf_put(&out, gw->ti.p, gw->ti.n);
    tm_gw_buf_put(&out, NULL, tm_gw_data_offset(gw) - out.n);
    tm_gw_buf_put(&out, gw->data.p, gw->data.n);
    *bytes = out.p;
    *size = out.n;
}

/* Write bytes to path (for tests of file-based loading). Returns false on I/O failure. */
static inline bool tm_gw_write_file(const char *path, const uint8_t *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(bytes, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

#endif /* TM_TEST_GGUF_WRITER_H */
