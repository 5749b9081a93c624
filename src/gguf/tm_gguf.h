/* tm_gguf.h -- bounded, validating GGUF (v2, v3) reader over a read-only mapping. */
#ifndef TM_GGUF_H
#define TM_GGUF_H

#include "core/tm_core.h"
#include "core/tm_dtype.h"

#include <stdio.h>

/* GGUF metadata value types. */
typedef enum tm_gguf_type {
    TM_GGUF_U8 = 0, TM_GGUF_I8 = 1, TM_GGUF_U16 = 2, TM_GGUF_I16 = 3, TM_GGUF_U32 = 4, TM_GGUF_I32 = 5,
    TM_GGUF_F32 = 6, TM_GGUF_BOOL = 7, TM_GGUF_STRING = 8, TM_GGUF_ARRAY = 9, TM_GGUF_U64 = 10,
    TM_GGUF_I64 = 11, TM_GGUF_F64 = 12, TM_GGUF_TYPE_COUNT = 13,
} tm_gguf_type;

/* A string inside the file: not NUL-terminated, validated to lie inside the mapping. */
typedef struct tm_str {
    const char *ptr;
    uint64_t len;
} tm_str;

typedef struct tm_gguf_kv {
    tm_str key;
    tm_gguf_type type;       /* value type; for arrays TM_GGUF_ARRAY */
    union {
        uint64_t u;          /* U8..U64, BOOL (zero-extended) */
        int64_t i;           /* I8..I64 (sign-extended) */
        double f;            /* F32, F64 */
        tm_str s;            /* STRING */
        struct {
            tm_gguf_type type;      /* element type (never ARRAY: nested arrays are refused) */
            uint64_t n;             /* element count */
            const void *data;       /* scalar elements, packed little-endian, (n * elem size) bytes */
            tm_str *strs;           /* STRING elements: (n) parsed strings, owned by the tm_gguf */
        } arr;
    } v;
} tm_gguf_kv;

typedef struct tm_gguf_tensor {
    tm_str name;
    uint32_t n_dims;         /* 1..4 */
    uint64_t ne[4];          /* elements per dim, ne[0] fastest; unused dims are 1 */
    uint64_t n_elems;
    tm_dtype type;
    uint64_t offset;         /* relative to the data section */
    uint64_t nbytes;
    const void *data;        /* inside the mapping, (nbytes) bytes */
} tm_gguf_tensor;

typedef struct tm_gguf {
    tm_mmap map;             /* owned when opened from a path; map.data NULL when borrowed */
    const uint8_t *base;     /* file bytes, (size) */
    uint64_t size;
    uint32_t version;        /* 2 or 3 */
    uint64_t n_kv;
    tm_gguf_kv *kv;          /* (n_kv) */
    uint64_t n_tensors;
    tm_gguf_tensor *tensors; /* (n_tensors) */
    uint64_t alignment;      /* general.alignment or 32 */
    uint64_t data_offset;    /* start of the tensor data section */
} tm_gguf;

/* Open and validate a file. On failure *out is NULL and err says exactly what is wrong. */
tm_status tm_gguf_open(const char *path, tm_gguf **out, tm_error *err);
/* Same over caller-owned bytes (must outlive the tm_gguf). Used by tests and by in-memory models. */
tm_status tm_gguf_open_bytes(const void *data, uint64_t size, tm_gguf **out, tm_error *err);
void tm_gguf_close(tm_gguf *g);

const tm_gguf_kv *tm_gguf_find(const tm_gguf *g, const char *key);
const tm_gguf_tensor *tm_gguf_tensor_find(const tm_gguf *g, const char *name);

/* Typed getters. Return TM_OK, TM_ERR_INVALID when absent (message names the key) or TM_ERR_FORMAT on
 * a type that cannot be converted (any integer type converts to another if the value fits). */
tm_status tm_gguf_get_u32(const tm_gguf *g, const char *key, uint32_t *out, tm_error *err);
tm_status tm_gguf_get_u64(const tm_gguf *g, const char *key, uint64_t *out, tm_error *err);
tm_status tm_gguf_get_i64(const tm_gguf *g, const char *key, int64_t *out, tm_error *err);
tm_status tm_gguf_get_f32(const tm_gguf *g, const char *key, float *out, tm_error *err);  /* f32/f64/int */
tm_status tm_gguf_get_bool(const tm_gguf *g, const char *key, bool *out, tm_error *err);
tm_status tm_gguf_get_str(const tm_gguf *g, const char *key, tm_str *out, tm_error *err);
/* Array of the given element type (TM_GGUF_STRING gives kv->v.arr.strs). */
tm_status tm_gguf_get_arr(const tm_gguf *g, const char *key, tm_gguf_type elem, const tm_gguf_kv **out,
                          tm_error *err);

/* Element i of a scalar array kv, converted: integer types (bool as 0/1) to int64 (false for a u64 above
 * INT64_MAX), float types and integers to double. False when kv is not such an array or i is out of range. */
bool tm_gguf_arr_int(const tm_gguf_kv *kv, uint64_t i, int64_t *out);
bool tm_gguf_arr_float(const tm_gguf_kv *kv, uint64_t i, double *out);

/* Compare a tm_str with a C string. */
bool tm_str_eq(tm_str s, const char *c);
const char *tm_gguf_type_name(tm_gguf_type t); /* "u8", ..., "string", "array"; "unknown" otherwise */
/* Write s into dst (cap bytes, always NUL-terminated when cap > 0) for display: valid UTF-8 kept, control
 * and invalid bytes escaped (\n, \t, \", \\, \xNN), cut after max_chars characters with "...".
 * Returns dst. */
char *tm_str_escape(char *dst, size_t cap, tm_str s, size_t max_chars);

/* Print a human-readable summary to f: header, every key = value (long arrays abbreviated with their
 * count, long strings cut), and with show_tensors the tensor table (name, type, dims, bytes, offset).
 * Backs `tokenmill inspect`. */
void tm_gguf_print(const tm_gguf *g, FILE *f, bool show_tensors);

#endif /* TM_GGUF_H */
