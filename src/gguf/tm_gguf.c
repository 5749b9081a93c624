/* tm_gguf.c -- bounded, validating GGUF (v2, v3) reader: every count, length, type and offset is checked. */
#include "gguf/tm_gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tm_gguf reads GGUF (little-endian) files on little-endian hosts only"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24       /* magic, version, n_tensors, n_kv */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64           /* ggml's tensor name buffer, NUL included */
#define GGUF_KV_MIN_BYTES 13       /* key length (8), type (4), smallest value (1) */
#define GGUF_TI_MIN_BYTES 32       /* name length (8), n_dims (4), one dim (8), type (4), offset (8) */
#define NO_POS UINT64_MAX

/* Size in bytes of each scalar value type; 0 for STRING and ARRAY. */
static const uint8_t k_type_size[TM_GGUF_TYPE_COUNT] = {
    [TM_GGUF_U8] = 1, [TM_GGUF_I8] = 1, [TM_GGUF_U16] = 2, [TM_GGUF_I16] = 2, [TM_GGUF_U32] = 4,
    [TM_GGUF_I32] = 4, [TM_GGUF_F32] = 4, [TM_GGUF_BOOL] = 1, [TM_GGUF_U64] = 8, [TM_GGUF_I64] = 8,
    [TM_GGUF_F64] = 8,
};

/* The allocation behind every tm_gguf: the public part plus sorted indexes for lookup. */
typedef struct tm_gguf_full {
    tm_gguf pub;                          /* first, so a tm_gguf * is a tm_gguf_full * */
    const tm_gguf_kv **kv_sorted;         /* (n_kv) sorted by key */
    const tm_gguf_tensor **t_sorted;      /* (n_tensors) sorted by name */
} tm_gguf_full;

/* Parser state: a cursor over the file plus what is being read, for messages. */
typedef struct rd {
    const uint8_t *p;      /* file bytes, (size) */
    uint64_t size;
    uint64_t pos;
    tm_error *err;
    const char *item;      /* "header", "KV", "tensor info" */
    uint64_t item_idx;
    tm_str item_name;      /* key or tensor name once read; len 0 before */
} rd;

/* ---- strings ------------------------------------------------------------------------------------- */

bool tm_str_eq(tm_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static int str_cmp(tm_str a, tm_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one (overlongs and surrogates too). */
static size_t utf8_len(const uint8_t *s, uint64_t n) {
    uint8_t c = s[0];
    size_t len;
    uint32_t min, cp;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

char *tm_str_escape(char *dst, size_t cap, tm_str s, size_t max_chars) {
    if (!dst || cap == 0) return dst;
    const uint8_t *p = (const uint8_t *)s.ptr;
    uint64_t i = 0;
    size_t o = 0, chars = 0;
    dst[0] = '\0';
    while (p && i < s.len) {
        char tmp[8];
        size_t tn;
        size_t ul = utf8_len(p + i, s.len - i);
        uint8_t c = p[i];
        if (chars == max_chars) break;
        if (ul > 1) {
            memcpy(tmp, p + i, ul);
            tn = ul;
        } else if (c == '\n') { memcpy(tmp, "\\n", 2); tn = 2; ul = 1; }
        else if (c == '\t') { memcpy(tmp, "\\t", 2); tn = 2; ul = 1; }
        else if (c == '\r') { memcpy(tmp, "\\r", 2); tn = 2; ul = 1; }
        else if (c == '"') { memcpy(tmp, "\\\"", 2); tn = 2; ul = 1; }
        else if (c == '\\') { memcpy(tmp, "\\\\", 2); tn = 2; ul = 1; }
        else if (c >= 0x20 && c < 0x7F) { tmp[0] = (char)c; tn = 1; ul = 1; }
        else { snprintf(tmp, sizeof tmp, "\\x%02X", c); tn = 4; ul = 1; }
        if (o + tn + 4 > cap) break; /* keep room for "..." and the NUL */
        memcpy(dst + o, tmp, tn);
        o += tn;
        i += ul;
        chars++;
    }
    if (p && i < s.len && o + 4 <= cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
    return dst;
}

const char *tm_gguf_type_name(tm_gguf_type t) {
    static const char *const names[TM_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return (unsigned)t < TM_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* ---- low-level reads ------------------------------------------------------------------------------ */

/* Set a format error that says where: "KV #3 'key' at byte 120: <msg>". at = NO_POS omits the byte. */
static tm_status fail(rd *r, uint64_t at, const char *fmt, ...) TM_PRINTF(3, 4);
static tm_status fail(rd *r, uint64_t at, const char *fmt, ...) {
    char msg[320], name[100], where[160], pos[40] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!strcmp(r->item, "header")) snprintf(where, sizeof where, "header");
    else if (r->item_name.ptr)
        snprintf(where, sizeof where, "%s #%" PRIu64 " '%s'", r->item, r->item_idx,
                 tm_str_escape(name, sizeof name, r->item_name, 64));
    else snprintf(where, sizeof where, "%s #%" PRIu64, r->item, r->item_idx);
    if (at != NO_POS) snprintf(pos, sizeof pos, " at byte %" PRIu64, at);
    return tm_err(r->err, TM_ERR_FORMAT, "gguf: %s%s: %s", where, pos, msg);
}

static uint64_t left(const rd *r) { return r->size - r->pos; }

static tm_status rd_bytes(rd *r, uint64_t n, const char *field, const uint8_t **out) {
    if (n > left(r))
        return fail(r, r->pos, "truncated file: %s needs %" PRIu64 " bytes, only %" PRIu64 " left", field, n,
                    left(r));
    *out = r->p + r->pos;
    r->pos += n;
    return TM_OK;
}

static tm_status rd_u32(rd *r, const char *field, uint32_t *out) {
    const uint8_t *b = NULL;
    tm_status s = rd_bytes(r, 4, field, &b);
    if (s == TM_OK) memcpy(out, b, 4);
    return s;
}

static tm_status rd_u64(rd *r, const char *field, uint64_t *out) {
    const uint8_t *b = NULL;
    tm_status s = rd_bytes(r, 8, field, &b);
    if (s == TM_OK) memcpy(out, b, 8);
    return s;
}

/* A length-prefixed string; idx != NO_POS numbers the field in messages ("string array element 7"). */
static tm_status rd_str(rd *r, const char *field, uint64_t idx, tm_str *out) {
    uint64_t at = r->pos, n = 0;
    char name[80];
    if (left(r) >= 8) {
        memcpy(&n, r->p + r->pos, 8);
        r->pos += 8;
        if (n <= left(r)) {
            out->ptr = (const char *)(r->p + r->pos);
            out->len = n;
            r->pos += n;
            return TM_OK;
        }
    }
    /* the error path only: name the field */
    if (idx == NO_POS) snprintf(name, sizeof name, "%s", field);
    else snprintf(name, sizeof name, "%s %" PRIu64, field, idx);
    if (r->pos == at)
        return fail(r, at, "truncated file: %s length needs 8 bytes, only %" PRIu64 " left", name, left(r));
    return fail(r, at, "%s length %" PRIu64 " exceeds the %" PRIu64 " bytes left in the file", name, n, left(r));
}

/* ---- values --------------------------------------------------------------------------------------- */

/* Decode one scalar of type t from b into kv->v. */
static void decode_scalar(tm_gguf_type t, const uint8_t *b, tm_gguf_kv *kv) {
    switch (t) {
    case TM_GGUF_U8: case TM_GGUF_BOOL: kv->v.u = b[0]; break;
    case TM_GGUF_I8: { int8_t x; memcpy(&x, b, 1); kv->v.i = x; } break;
    case TM_GGUF_U16: { uint16_t x; memcpy(&x, b, 2); kv->v.u = x; } break;
    case TM_GGUF_I16: { int16_t x; memcpy(&x, b, 2); kv->v.i = x; } break;
    case TM_GGUF_U32: { uint32_t x; memcpy(&x, b, 4); kv->v.u = x; } break;
    case TM_GGUF_I32: { int32_t x; memcpy(&x, b, 4); kv->v.i = x; } break;
    case TM_GGUF_U64: { uint64_t x; memcpy(&x, b, 8); kv->v.u = x; } break;
    case TM_GGUF_I64: { int64_t x; memcpy(&x, b, 8); kv->v.i = x; } break;
    case TM_GGUF_F32: { float x; memcpy(&x, b, 4); kv->v.f = x; } break;
    case TM_GGUF_F64: { double x; memcpy(&x, b, 8); kv->v.f = x; } break;
    default: break;
    }
}

static tm_status read_array(rd *r, tm_gguf_kv *kv) {
    uint64_t at = r->pos, n;
    uint32_t et;
    tm_status s = rd_u32(r, "array element type", &et);
    if (s) return s;
    if (et == TM_GGUF_ARRAY) return fail(r, at, "nested array (array of arrays) is not allowed");
    if (et >= TM_GGUF_TYPE_COUNT) return fail(r, at, "unknown array element type %" PRIu32, et);
    at = r->pos;
    if ((s = rd_u64(r, "array length", &n))) return s;
    kv->v.arr.type = (tm_gguf_type)et;
    kv->v.arr.n = n;
    kv->v.arr.data = NULL;
    kv->v.arr.strs = NULL;
    if (et == TM_GGUF_STRING) {
        if (n > left(r) / 8)
            return fail(r, at, "string array length %" PRIu64 " exceeds what the %" PRIu64
                        " bytes left could hold (8 bytes per string at least)", n, left(r));
        kv->v.arr.strs = tm_malloc_array((size_t)n, sizeof(tm_str));
        if (!kv->v.arr.strs) return tm_err(r->err, TM_ERR_NOMEM, "gguf: no memory for %" PRIu64 " strings", n);
        for (uint64_t i = 0; i < n; i++)
            if ((s = rd_str(r, "string array element", i, &kv->v.arr.strs[i]))) return s;
        return TM_OK;
    }
    uint64_t esz = k_type_size[et];
    if (n > left(r) / esz)
        return fail(r, at, "array length %" PRIu64 " of %s exceeds the %" PRIu64 " bytes left in the file", n,
                    tm_gguf_type_name((tm_gguf_type)et), left(r));
    const uint8_t *b = NULL;
    if ((s = rd_bytes(r, n * esz, "array data", &b))) return s;
    if (et == TM_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (b[i] > 1)
                return fail(r, at + 8 + i, "bool array element %" PRIu64 " is %u, not 0 or 1", i, b[i]);
    kv->v.arr.data = b;
    return TM_OK;
}

static tm_status read_value(rd *r, tm_gguf_kv *kv) {
    uint64_t at = r->pos;
    uint32_t t;
    tm_status s = rd_u32(r, "value type", &t);
    if (s) return s;
    if (t >= TM_GGUF_TYPE_COUNT) return fail(r, at, "unknown value type %" PRIu32, t);
    kv->type = (tm_gguf_type)t;
    if (t == TM_GGUF_ARRAY) return read_array(r, kv);
    if (t == TM_GGUF_STRING) return rd_str(r, "string value", NO_POS, &kv->v.s);
    at = r->pos;
    const uint8_t *b = NULL;
    if ((s = rd_bytes(r, k_type_size[t], "value", &b))) return s;
    if (t == TM_GGUF_BOOL && b[0] > 1) return fail(r, at, "bool value is %u, not 0 or 1", b[0]);
    decode_scalar(kv->type, b, kv);
    return TM_OK;
}

/* general.alignment: any integer type, a nonzero power of two. */
static tm_status check_alignment(rd *r, const tm_gguf_kv *kv, uint64_t at, uint64_t *align) {
    uint64_t a;
    switch (kv->type) {
    case TM_GGUF_U8: case TM_GGUF_U16: case TM_GGUF_U32: case TM_GGUF_U64: a = kv->v.u; break;
    case TM_GGUF_I8: case TM_GGUF_I16: case TM_GGUF_I32: case TM_GGUF_I64:
        if (kv->v.i <= 0) return fail(r, at, "alignment %" PRId64 " is not a positive power of two", kv->v.i);
        a = (uint64_t)kv->v.i;
        break;
    default:
        return fail(r, at, "alignment has type %s, expected an integer", tm_gguf_type_name(kv->type));
    }
    if (a == 0 || (a & (a - 1)) != 0)
        return fail(r, at, "alignment %" PRIu64 " is not a nonzero power of two", a);
    *align = a;
    return TM_OK;
}

/* ---- tensor infos --------------------------------------------------------------------------------- */

static tm_status read_tensor_info(rd *r, uint64_t alignment, tm_gguf_tensor *t) {
    tm_status s = rd_str(r, "tensor name", NO_POS, &t->name);
    if (s) return s;
    r->item_name = t->name;
    if (t->name.len >= GGUF_MAX_NAME)
        return fail(r, r->pos - t->name.len - 8, "tensor name is %" PRIu64 " bytes long, the limit is %d",
                    t->name.len, GGUF_MAX_NAME - 1);
    uint64_t at = r->pos;
    uint32_t nd;
    if ((s = rd_u32(r, "n_dims", &nd))) return s;
    if (nd < 1 || nd > GGUF_MAX_DIMS) return fail(r, at, "n_dims %" PRIu32 " is not in 1..%d", nd, GGUF_MAX_DIMS);
    t->n_dims = nd;
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= nd) continue;
        at = r->pos;
        if ((s = rd_u64(r, "dimension", &t->ne[d]))) return s;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return fail(r, at, "dimension %" PRIu32 " is %" PRId64 ", must be at least 1", d, (int64_t)t->ne[d]);
        if (!tm_mul_u64(n, t->ne[d], &n) || n > (uint64_t)INT64_MAX)
            return fail(r, at, "element count overflows int64 at dimension %" PRIu32 " (%" PRIu64 ")", d,
                        t->ne[d]);
    }
    t->n_elems = n;
    at = r->pos;
    uint32_t type;
    if ((s = rd_u32(r, "tensor type", &type))) return s;
    const tm_dtype_info *ti = tm_dtype_get(type);
    if (!ti || type >= TM_DT_FIRST_INTERNAL) return fail(r, at, "unknown tensor type %" PRIu32, type);
    t->type = (tm_dtype)type;
    if (t->ne[0] % ti->block)
        return fail(r, at, "row of %" PRIu64 " elements is not a multiple of the %s block size %" PRIu32,
                    t->ne[0], ti->name, ti->block);
    uint64_t nb = t->ne[0] / ti->block * ti->bytes;
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        if (!tm_mul_u64(nb, t->ne[d], &nb)) return fail(r, at, "byte size of the tensor overflows 64 bits");
    t->nbytes = nb;
    at = r->pos;
    if ((s = rd_u64(r, "tensor data offset", &t->offset))) return s;
    if (t->offset % alignment)
        return fail(r, at, "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, t->offset,
                    alignment);
    return TM_OK;
}

/* ---- sorting / lookup ----------------------------------------------------------------------------- */

static int cmp_kv_key(const void *a, const void *b) {
    const tm_gguf_kv *x = *(const tm_gguf_kv *const *)a, *y = *(const tm_gguf_kv *const *)b;
    int c = str_cmp(x->key, y->key);
    return c ? c : (x > y) - (x < y);
}

static int cmp_tensor_name(const void *a, const void *b) {
    const tm_gguf_tensor *x = *(const tm_gguf_tensor *const *)a, *y = *(const tm_gguf_tensor *const *)b;
    int c = str_cmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const tm_gguf_tensor *x = *(const tm_gguf_tensor *const *)a, *y = *(const tm_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x > y) - (x < y);
}

/* ---- open ----------------------------------------------------------------------------------------- */

static void free_contents(tm_gguf_full *f) {
    tm_gguf *g = &f->pub;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            if (g->kv[i].type == TM_GGUF_ARRAY) free(g->kv[i].v.arr.strs);
    free(g->kv);
    free(g->tensors);
    free(f->kv_sorted);
    free(f->t_sorted);
    tm_mmap_close(&g->map);
}

static tm_status parse(tm_gguf_full *f, tm_error *err) {
    tm_gguf *g = &f->pub;
    rd r = {.p = g->base, .size = g->size, .pos = 0, .err = err, .item = "header"};
    uint64_t *kv_pos = NULL, *ti_pos = NULL; /* (n_kv), (n_tensors): where each entry starts */
    const tm_gguf_tensor **by_off = NULL;    /* (n_tensors) sorted by data offset */
    const uint8_t *magic = NULL;
    tm_status s = rd_bytes(&r, 4, "magic", &magic);
    if (s) goto done;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
        char m[40];
        s = fail(&r, 0, "bad magic '%s', expected 'GGUF' (not a GGUF file)",
                 tm_str_escape(m, sizeof m, (tm_str){(const char *)magic, 4}, 4));
        goto done;
    }
    if ((s = rd_u32(&r, "version", &g->version))) goto done;
    if (g->version == 1) {
        s = fail(&r, 4, "GGUF version 1 is not supported (it used 32-bit counts; re-convert the model to v2 or v3)");
        goto done;
    }
    if (g->version != 0 && (g->version & 0xFFFF) == 0) {
        s = fail(&r, 4, "version 0x%08" PRIX32 " looks byte-swapped: big-endian GGUF files are not supported",
                 g->version);
        goto done;
    }
    if (g->version < 2 || g->version > 3) {
        s = fail(&r, 4, "unsupported GGUF version %" PRIu32 " (supported: 2 and 3)", g->version);
        goto done;
    }
    if ((s = rd_u64(&r, "tensor count", &g->n_tensors))) goto done;
    if ((s = rd_u64(&r, "KV count", &g->n_kv))) goto done;
    if (g->n_tensors > left(&r) / GGUF_TI_MIN_BYTES) {
        s = fail(&r, 8, "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                 " bytes left (a tensor info takes at least %d bytes)", g->n_tensors, left(&r), GGUF_TI_MIN_BYTES);
        goto done;
    }
    if (g->n_kv > (left(&r) - g->n_tensors * GGUF_TI_MIN_BYTES) / GGUF_KV_MIN_BYTES) {
        s = fail(&r, 16, "KV count %" PRIu64 " cannot fit in the %" PRIu64
                 " bytes left (a KV takes at least %d bytes)", g->n_kv, left(&r), GGUF_KV_MIN_BYTES);
        goto done;
    }
    /* counts are now bounded by the file size, so the allocations below are too */
    g->kv = tm_calloc((size_t)g->n_kv, sizeof *g->kv);
    g->tensors = tm_calloc((size_t)g->n_tensors, sizeof *g->tensors);
    f->kv_sorted = tm_malloc_array((size_t)g->n_kv, sizeof *f->kv_sorted);
    f->t_sorted = tm_malloc_array((size_t)g->n_tensors, sizeof *f->t_sorted);
    kv_pos = tm_malloc_array((size_t)g->n_kv, sizeof *kv_pos);
    ti_pos = tm_malloc_array((size_t)g->n_tensors, sizeof *ti_pos);
    by_off = tm_malloc_array((size_t)g->n_tensors, sizeof *by_off);
    if (!g->kv || !g->tensors || !f->kv_sorted || !f->t_sorted || !kv_pos || !ti_pos || !by_off) {
        s = tm_err(err, TM_ERR_NOMEM, "gguf: no memory for %" PRIu64 " KVs and %" PRIu64 " tensors", g->n_kv,
                   g->n_tensors);
        goto done;
    }

    /* key-value pairs */
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    r.item = "KV";
    for (uint64_t i = 0; i < g->n_kv; i++) {
        tm_gguf_kv *kv = &g->kv[i];
        r.item_idx = i;
        r.item_name = (tm_str){NULL, 0};
        kv_pos[i] = r.pos;
        if ((s = rd_str(&r, "key", NO_POS, &kv->key))) goto done;
        r.item_name = kv->key;
        uint64_t vat = r.pos;
        kv->type = TM_GGUF_U8; /* until read_value succeeds: nothing to free */
        if ((s = read_value(&r, kv))) goto done;
        if (tm_str_eq(kv->key, "general.alignment") && (s = check_alignment(&r, kv, vat, &g->alignment)))
            goto done;
        f->kv_sorted[i] = kv;
    }
    qsort(f->kv_sorted, (size_t)g->n_kv, sizeof *f->kv_sorted, cmp_kv_key);
    for (uint64_t i = 1; i < g->n_kv; i++) {
        if (str_cmp(f->kv_sorted[i - 1]->key, f->kv_sorted[i]->key) == 0) {
            uint64_t a = (uint64_t)(f->kv_sorted[i - 1] - g->kv), b = (uint64_t)(f->kv_sorted[i] - g->kv);
            r.item_idx = b;
            r.item_name = g->kv[b].key;
            s = fail(&r, kv_pos[b], "duplicate key (also KV #%" PRIu64 " at byte %" PRIu64 ")", a, kv_pos[a]);
            goto done;
        }
    }

    /* tensor infos */
    r.item = "tensor info";
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        r.item_idx = i;
        r.item_name = (tm_str){NULL, 0};
        ti_pos[i] = r.pos;
        if ((s = read_tensor_info(&r, g->alignment, &g->tensors[i]))) goto done;
        f->t_sorted[i] = by_off[i] = &g->tensors[i];
    }
    qsort(f->t_sorted, (size_t)g->n_tensors, sizeof *f->t_sorted, cmp_tensor_name);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        if (str_cmp(f->t_sorted[i - 1]->name, f->t_sorted[i]->name) == 0) {
            uint64_t a = (uint64_t)(f->t_sorted[i - 1] - g->tensors), b = (uint64_t)(f->t_sorted[i] - g->tensors);
            r.item_idx = b;
            r.item_name = g->tensors[b].name;
            s = fail(&r, ti_pos[b], "duplicate tensor name (also tensor #%" PRIu64 " at byte %" PRIu64 ")", a,
                     ti_pos[a]);
            goto done;
        }
    }

    /* the data section starts at the next multiple of the alignment */
    r.item = "header";
    if (!tm_add_u64(r.pos, g->alignment - 1, &g->data_offset)) {
        s = fail(&r, r.pos, "data section offset overflows with alignment %" PRIu64, g->alignment);
        goto done;
    }
    g->data_offset -= g->data_offset % g->alignment;
    r.item = "tensor info";
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tm_gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        r.item_idx = i;
        r.item_name = t->name;
        if (!tm_add_u64(g->data_offset, t->offset, &start) || !tm_add_u64(start, t->nbytes, &end) ||
            end > g->size) {
            s = fail(&r, ti_pos[i], "tensor data (%" PRIu64 " bytes at data offset %" PRIu64
                     ", file bytes %" PRIu64 "..) runs past the end of the file (%" PRIu64 " bytes)",
                     t->nbytes, t->offset, g->data_offset + t->offset, g->size);
            goto done;
        }
        t->data = g->base + start;
    }
    qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, cmp_tensor_offset);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        const tm_gguf_tensor *a = by_off[i - 1], *b = by_off[i];
        if (a->offset + a->nbytes > b->offset) {
            char an[100];
            uint64_t bi = (uint64_t)(b - g->tensors);
            r.item_idx = bi;
            r.item_name = b->name;
            s = fail(&r, ti_pos[bi], "tensor data at data offset %" PRIu64 " overlaps tensor '%s' (%" PRIu64
                     " bytes at data offset %" PRIu64 ")", b->offset, tm_str_escape(an, sizeof an, a->name, 64),
                     a->nbytes, a->offset);
            goto done;
        }
    }
    s = TM_OK;
done:
    free(kv_pos);
    free(ti_pos);
    free(by_off);
    return s;
}

tm_status tm_gguf_open_bytes(const void *data, uint64_t size, tm_gguf **out, tm_error *err) {
    if (!out) return tm_err(err, TM_ERR_INVALID, "gguf: NULL output pointer");
    *out = NULL;
    if (!data && size) return tm_err(err, TM_ERR_INVALID, "gguf: NULL data with size %" PRIu64, size);
    tm_gguf_full *f = tm_calloc(1, sizeof *f);
    if (!f) return tm_err(err, TM_ERR_NOMEM, "gguf: out of memory");
    f->pub.base = data;
    f->pub.size = size;
    tm_status s = parse(f, err);
    if (s) {
        free_contents(f);
        free(f);
        return s;
    }
    *out = &f->pub;
    return TM_OK;
}

tm_status tm_gguf_open(const char *path, tm_gguf **out, tm_error *err) {
    if (!out) return tm_err(err, TM_ERR_INVALID, "gguf: NULL output pointer");
    *out = NULL;
    if (!path) return tm_err(err, TM_ERR_INVALID, "gguf: NULL path");
    tm_mmap m;
    tm_status s = tm_mmap_open(path, &m, err);
    if (s) return s;
    s = tm_gguf_open_bytes(m.data, m.size, out, err);
    if (s) {
        tm_mmap_close(&m);
        if (err) tm_err_prefix(err, "'%s'", path);
        return s;
    }
    (*out)->map = m;
    return TM_OK;
}

void tm_gguf_close(tm_gguf *g) {
    if (!g) return;
    tm_gguf_full *f = (tm_gguf_full *)g;
    free_contents(f);
    free(f);
}

/* ---- lookup --------------------------------------------------------------------------------------- */

const tm_gguf_kv *tm_gguf_find(const tm_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    const tm_gguf_full *f = (const tm_gguf_full *)g;
    tm_str k = {key, strlen(key)};
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(f->kv_sorted[mid]->key, k);
        if (c == 0) return f->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const tm_gguf_tensor *tm_gguf_tensor_find(const tm_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    const tm_gguf_full *f = (const tm_gguf_full *)g;
    tm_str k = {name, strlen(name)};
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(f->t_sorted[mid]->name, k);
        if (c == 0) return f->t_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- typed getters -------------------------------------------------------------------------------- */

static bool is_unsigned(tm_gguf_type t) {
    return t == TM_GGUF_U8 || t == TM_GGUF_U16 || t == TM_GGUF_U32 || t == TM_GGUF_U64;
}
static bool is_signed(tm_gguf_type t) {
    return t == TM_GGUF_I8 || t == TM_GGUF_I16 || t == TM_GGUF_I32 || t == TM_GGUF_I64;
}

static tm_status find_kv(const tm_gguf *g, const char *key, const tm_gguf_kv **kv, tm_error *err) {
    *kv = tm_gguf_find(g, key);
    if (!*kv) return tm_err(err, TM_ERR_INVALID, "gguf: missing key '%s'", key ? key : "(null)");
    return TM_OK;
}

static tm_status wrong_type(const tm_gguf_kv *kv, const char *key, const char *want, tm_error *err) {
    return tm_err(err, TM_ERR_FORMAT, "gguf: key '%s' has type %s, expected %s", key, tm_gguf_type_name(kv->type),
                  want);
}

/* Integer value of kv as (negative flag, magnitude-ish): fills either *u (non-negative) or *i (negative). */
static tm_status get_int(const tm_gguf *g, const char *key, bool *neg, uint64_t *u, int64_t *i,
                         const tm_gguf_kv **kvp, tm_error *err) {
    const tm_gguf_kv *kv;
    tm_status s = find_kv(g, key, &kv, err);
    if (s) return s;
    *kvp = kv;
    if (is_unsigned(kv->type)) {
        *neg = false;
        *u = kv->v.u;
    } else if (is_signed(kv->type)) {
        *neg = kv->v.i < 0;
        *i = kv->v.i;
        if (!*neg) *u = (uint64_t)kv->v.i;
    } else {
        return wrong_type(kv, key, "an integer", err);
    }
    return TM_OK;
}

tm_status tm_gguf_get_u64(const tm_gguf *g, const char *key, uint64_t *out, tm_error *err) {
    bool neg;
    uint64_t u = 0;
    int64_t i = 0;
    const tm_gguf_kv *kv;
    tm_status s = get_int(g, key, &neg, &u, &i, &kv, err);
    if (s) return s;
    if (neg) return tm_err(err, TM_ERR_FORMAT, "gguf: key '%s' = %" PRId64 " is negative", key, i);
    *out = u;
    return TM_OK;
}

tm_status tm_gguf_get_u32(const tm_gguf *g, const char *key, uint32_t *out, tm_error *err) {
    uint64_t u = 0;
    tm_status s = tm_gguf_get_u64(g, key, &u, err);
    if (s) return s;
    if (u > UINT32_MAX) return tm_err(err, TM_ERR_FORMAT, "gguf: key '%s' = %" PRIu64 " does not fit in u32", key, u);
    *out = (uint32_t)u;
    return TM_OK;
}

tm_status tm_gguf_get_i64(const tm_gguf *g, const char *key, int64_t *out, tm_error *err) {
    bool neg;
    uint64_t u = 0;
    int64_t i = 0;
    const tm_gguf_kv *kv;
    tm_status s = get_int(g, key, &neg, &u, &i, &kv, err);
    if (s) return s;
    if (neg) {
        *out = i;
        return TM_OK;
    }
    if (u > (uint64_t)INT64_MAX)
        return tm_err(err, TM_ERR_FORMAT, "gguf: key '%s' = %" PRIu64 " does not fit in i64", key, u);
    *out = (int64_t)u;
    return TM_OK;
}

tm_status tm_gguf_get_f32(const tm_gguf *g, const char *key, float *out, tm_error *err) {
    const tm_gguf_kv *kv;
    tm_status s = find_kv(g, key, &kv, err);
    if (s) return s;
    if (kv->type == TM_GGUF_F32 || kv->type == TM_GGUF_F64) *out = (float)kv->v.f;
    else if (is_unsigned(kv->type)) *out = (float)kv->v.u;
    else if (is_signed(kv->type)) *out = (float)kv->v.i;
    else return wrong_type(kv, key, "a number", err);
    return TM_OK;
}

tm_status tm_gguf_get_bool(const tm_gguf *g, const char *key, bool *out, tm_error *err) {
    const tm_gguf_kv *kv;
    tm_status s = find_kv(g, key, &kv, err);
    if (s) return s;
    if (kv->type != TM_GGUF_BOOL) return wrong_type(kv, key, "bool", err);
    *out = kv->v.u != 0;
    return TM_OK;
}

tm_status tm_gguf_get_str(const tm_gguf *g, const char *key, tm_str *out, tm_error *err) {
    const tm_gguf_kv *kv;
    tm_status s = find_kv(g, key, &kv, err);
    if (s) return s;
    if (kv->type != TM_GGUF_STRING) return wrong_type(kv, key, "string", err);
    *out = kv->v.s;
    return TM_OK;
}

tm_status tm_gguf_get_arr(const tm_gguf *g, const char *key, tm_gguf_type elem, const tm_gguf_kv **out,
                          tm_error *err) {
    const tm_gguf_kv *kv;
    tm_status s = find_kv(g, key, &kv, err);
    if (s) return s;
    if (kv->type != TM_GGUF_ARRAY) return wrong_type(kv, key, "array", err);
    if (kv->v.arr.type != elem)
        return tm_err(err, TM_ERR_FORMAT, "gguf: key '%s' is an array of %s, expected an array of %s", key,
                      tm_gguf_type_name(kv->v.arr.type), tm_gguf_type_name(elem));
    *out = kv;
    return TM_OK;
}

/* ---- array elements ------------------------------------------------------------------------------- */

bool tm_gguf_arr_int(const tm_gguf_kv *kv, uint64_t i, int64_t *out) {
    if (!kv || kv->type != TM_GGUF_ARRAY || i >= kv->v.arr.n || !kv->v.arr.data) return false;
    tm_gguf_type t = kv->v.arr.type;
    if (!is_unsigned(t) && !is_signed(t) && t != TM_GGUF_BOOL) return false;
    tm_gguf_kv one = {0};
    decode_scalar(t, (const uint8_t *)kv->v.arr.data + i * k_type_size[t], &one);
    if (is_signed(t)) {
        *out = one.v.i;
        return true;
    }
    if (one.v.u > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)one.v.u;
    return true;
}

bool tm_gguf_arr_float(const tm_gguf_kv *kv, uint64_t i, double *out) {
    if (!kv || kv->type != TM_GGUF_ARRAY || i >= kv->v.arr.n || !kv->v.arr.data) return false;
    tm_gguf_type t = kv->v.arr.type;
    if (t == TM_GGUF_STRING || t == TM_GGUF_ARRAY || t == TM_GGUF_BOOL) return false;
    tm_gguf_kv one = {0};
    decode_scalar(t, (const uint8_t *)kv->v.arr.data + i * k_type_size[t], &one);
    if (t == TM_GGUF_F32 || t == TM_GGUF_F64) *out = one.v.f;
    else if (is_signed(t)) *out = (double)one.v.i;
    else *out = (double)one.v.u;
    return true;
}
