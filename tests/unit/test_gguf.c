/* test_gguf.c -- GGUF reader: round trips of every value type, and refusal of every kind of broken file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/tm_gguf.h"
#include "tm_test_gguf_writer.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

#define assert_msg_has(err, sub)                                                                           \
    do {                                                                                                   \
        if (!strstr((err).msg, (sub))) fail_msg("message \"%s\" does not contain \"%s\"", (err).msg, (sub)); \
    } while (0)

/* Finish gw, open the bytes, expect TM_ERR_FORMAT with a message containing sub. Frees gw. */
static void expect_refused(tm_gw *gw, const char *sub) {
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    tm_gguf *g = (tm_gguf *)1;
    tm_error err = {0};
    tm_status s = tm_gguf_open_bytes(bytes, size, &g, &err);
    if (s != TM_ERR_FORMAT)
        fail_msg("status %d (%s), expected format error; msg \"%s\"", s, tm_status_name(s), err.msg);
    assert_null(g);
    assert_int_equal(err.code, TM_ERR_FORMAT);
    assert_true(strncmp(err.msg, "gguf: ", 6) == 0);
    assert_msg_has(err, sub);
    free(bytes);
}

/* A writer holding one valid tensor (so tensor-info tests start from a sane file). */
static tm_gw *small_gw(void) {
    tm_gw *gw = tm_gw_new(3);
    tm_gw_kv_str(gw, "general.architecture", "llama");
    return gw;
}

static const char *const k_strs[3] = {"alpha", "", "g\xC3\xA9n\xC3\xA9ral \xE2\x9C\x93"};
static const float k_f32s[4] = {0.5f, -1.25f, 3.0e10f, -0.0f};
static const int32_t k_i32s[5] = {-2147483647 - 1, -1, 0, 7, 2147483647};
static const uint8_t k_u8s[3] = {0, 128, 255};
static const uint8_t k_bools[4] = {1, 0, 0, 1};
static const uint64_t k_u64s[2] = {UINT64_MAX, 42};

/* Tensor contents used by the full file. */
typedef struct full_data {
    float f32[6];        /* (3, 2) */
    uint8_t q8[2 * 68];  /* q8_0 (64, 2): 2 rows of 2 blocks of 34 bytes */
    uint16_t f16[5];     /* (5) */
    int8_t i8[16];       /* (2, 2, 2, 2) */
} full_data;

static void fill_full_data(full_data *d) {
    for (int i = 0; i < 6; i++) d->f32[i] = (float)i * 0.25f - 1.0f;
    for (int i = 0; i < (int)sizeof d->q8; i++) d->q8[i] = (uint8_t)(i * 7 + 3);
    for (int i = 0; i < 5; i++) d->f16[i] = (uint16_t)(0x3C00 + i);
    for (int i = 0; i < 16; i++) d->i8[i] = (int8_t)(i - 8);
}

/* A valid file with a KV of every value type and four tensors. alignment 0 = default (no key). */
static tm_gw *full_gw(uint32_t version, uint32_t alignment, const full_data *d) {
    tm_gw *gw = tm_gw_new(version);
    tm_gw_kv_str(gw, "general.architecture", "llama");
    if (alignment) {
        tm_gw_kv_u32(gw, "general.alignment", alignment);
        tm_gw_alignment(gw, alignment);
    }
    tm_gw_kv_str(gw, "general.name", "tiny\n\"model\"");
    tm_gw_kv_u8(gw, "t.u8", 200);
    tm_gw_kv_i8(gw, "t.i8", -100);
    tm_gw_kv_u16(gw, "t.u16", 60000);
    tm_gw_kv_i16(gw, "t.i16", -30000);
    tm_gw_kv_u32(gw, "t.u32", 4000000000u);
    tm_gw_kv_i32(gw, "t.i32", -2000000000);
    tm_gw_kv_f32(gw, "t.f32", 1.5f);
    tm_gw_kv_bool(gw, "t.bool", true);
    tm_gw_kv_bool(gw, "t.bool_false", false);
    tm_gw_kv_u64(gw, "t.u64", 9223372036854775813ull);
    tm_gw_kv_i64(gw, "t.i64", -4611686018427387904ll);
    tm_gw_kv_f64(gw, "t.f64", 3.141592653589793);
    tm_gw_kv_strn(gw, "t.str_nul", "a\0b", 3);
    tm_gw_kv_str(gw, "t.str_empty", "");
    tm_gw_kv_arr_str(gw, "t.arr_str", k_strs, 3);
    tm_gw_kv_arr_f32(gw, "t.arr_f32", k_f32s, 4);
    tm_gw_kv_arr_i32(gw, "t.arr_i32", k_i32s, 5);
    tm_gw_kv_arr(gw, "t.arr_u8", TM_GW_U8, 3, k_u8s, 3);
    tm_gw_kv_arr(gw, "t.arr_bool", TM_GW_BOOL, 4, k_bools, 4);
    tm_gw_kv_arr(gw, "t.arr_u64", TM_GW_U64, 2, k_u64s, 16);
    tm_gw_kv_arr(gw, "t.arr_empty", TM_GW_I16, 0, NULL, 0);
    tm_gw_kv_arr_str(gw, "t.arr_str_empty", NULL, 0);
    uint64_t ne_f32[2] = {3, 2}, ne_q8[2] = {64, 2}, ne_f16[1] = {5}, ne_i8[4] = {2, 2, 2, 2};
    tm_gw_tensor(gw, "w.f32", TM_DT_F32, 2, ne_f32, d->f32, sizeof d->f32);
    tm_gw_tensor(gw, "w.q8", TM_DT_Q8_0, 2, ne_q8, d->q8, sizeof d->q8);
    tm_gw_tensor(gw, "w.f16", TM_DT_F16, 1, ne_f16, d->f16, sizeof d->f16);
    tm_gw_tensor(gw, "w.i8", TM_DT_I8, 4, ne_i8, d->i8, sizeof d->i8);
    return gw;
}

static void check_full(const tm_gguf *g, uint32_t version, uint32_t alignment, const full_data *d,
                       const uint8_t *bytes, size_t size, size_t data_offset) {
    tm_error err = {0};
    uint64_t align = alignment ? alignment : 32;
    assert_int_equal(g->version, version);
    assert_int_equal(g->n_kv, alignment ? 25 : 24);
    assert_int_equal(g->n_tensors, 4);
    assert_int_equal(g->alignment, align);
    assert_int_equal(g->data_offset, data_offset);
    assert_int_equal(g->data_offset % align, 0);
    assert_true(g->base == bytes);
    assert_int_equal(g->size, size);

    /* scalars, raw */
    const tm_gguf_kv *kv = tm_gguf_find(g, "t.u8");
    assert_non_null(kv);
    assert_int_equal(kv->type, TM_GGUF_U8);
    assert_int_equal(kv->v.u, 200);
    assert_int_equal(tm_gguf_find(g, "t.i8")->v.i, -100);
    assert_int_equal(tm_gguf_find(g, "t.u16")->v.u, 60000);
    assert_int_equal(tm_gguf_find(g, "t.i16")->v.i, -30000);
    assert_int_equal(tm_gguf_find(g, "t.u32")->v.u, 4000000000u);
    assert_int_equal(tm_gguf_find(g, "t.i32")->v.i, -2000000000);
    assert_true(tm_gguf_find(g, "t.f32")->v.f == 1.5);
    assert_int_equal(tm_gguf_find(g, "t.bool")->type, TM_GGUF_BOOL);
    assert_true(tm_gguf_find(g, "t.u64")->v.u == 9223372036854775813ull);
    assert_true(tm_gguf_find(g, "t.i64")->v.i == -4611686018427387904ll);
    assert_true(tm_gguf_find(g, "t.f64")->v.f == 3.141592653589793);
    assert_null(tm_gguf_find(g, "t.missing"));
    assert_null(tm_gguf_find(g, "t.u"));    /* prefix of a key */
    assert_null(tm_gguf_find(g, "t.u88")); /* key is a prefix of it */

    /* typed getters and conversions */
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    tm_str s;
    assert_int_equal(tm_gguf_get_u32(g, "t.u8", &u32, &err), TM_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(tm_gguf_get_u32(g, "t.u32", &u32, &err), TM_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(tm_gguf_get_u32(g, "t.i8", &u32, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "negative");
    assert_int_equal(tm_gguf_get_u32(g, "t.u64", &u32, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "does not fit in u32");
    assert_int_equal(tm_gguf_get_u64(g, "t.u64", &u64, &err), TM_OK);
    assert_true(u64 == 9223372036854775813ull);
    assert_int_equal(tm_gguf_get_i64(g, "t.u64", &i64, &err), TM_ERR_FORMAT);
    assert_int_equal(tm_gguf_get_i64(g, "t.i16", &i64, &err), TM_OK);
    assert_int_equal(i64, -30000);
    assert_int_equal(tm_gguf_get_i64(g, "t.u16", &i64, &err), TM_OK);
    assert_int_equal(i64, 60000);
    assert_int_equal(tm_gguf_get_f32(g, "t.f64", &f32, &err), TM_OK);
    assert_true(fabsf(f32 - 3.14159265f) < 1e-6f);
    assert_int_equal(tm_gguf_get_f32(g, "t.i32", &f32, &err), TM_OK);
    assert_true(f32 == -2000000000.0f);
    assert_int_equal(tm_gguf_get_f32(g, "general.name", &f32, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "general.name");
    assert_int_equal(tm_gguf_get_u32(g, "t.f32", &u32, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "expected an integer");
    assert_int_equal(tm_gguf_get_bool(g, "t.bool", &b, &err), TM_OK);
    assert_true(b);
    assert_int_equal(tm_gguf_get_bool(g, "t.bool_false", &b, &err), TM_OK);
    assert_false(b);
    assert_int_equal(tm_gguf_get_bool(g, "t.u8", &b, &err), TM_ERR_FORMAT);
    assert_int_equal(tm_gguf_get_u32(g, "no.such.key", &u32, &err), TM_ERR_INVALID);
    assert_msg_has(err, "missing key 'no.such.key'");
    assert_int_equal(tm_gguf_get_str(g, "general.name", &s, &err), TM_OK);
    assert_true(tm_str_eq(s, "tiny\n\"model\""));
    assert_false(tm_str_eq(s, "tiny"));
    assert_int_equal(tm_gguf_get_str(g, "t.str_nul", &s, &err), TM_OK);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "a\0b", 3);
    assert_int_equal(tm_gguf_get_str(g, "t.str_empty", &s, &err), TM_OK);
    assert_int_equal(s.len, 0);
    assert_true(tm_str_eq(s, ""));
    assert_int_equal(tm_gguf_get_str(g, "t.u8", &s, &err), TM_ERR_FORMAT);

    /* arrays */
    const tm_gguf_kv *a;
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_str", TM_GGUF_STRING, &a, &err), TM_OK);
    assert_int_equal(a->v.arr.n, 3);
    for (int i = 0; i < 3; i++) assert_true(tm_str_eq(a->v.arr.strs[i], k_strs[i]));
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_str", TM_GGUF_I32, &a, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "array of string");
    assert_int_equal(tm_gguf_get_arr(g, "t.u8", TM_GGUF_U8, &a, &err), TM_ERR_FORMAT);
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_f32", TM_GGUF_F32, &a, &err), TM_OK);
    assert_int_equal(a->v.arr.n, 4);
    assert_memory_equal(a->v.arr.data, k_f32s, sizeof k_f32s);
    double dv;
    int64_t iv;
    for (int i = 0; i < 4; i++) {
        assert_true(tm_gguf_arr_float(a, (uint64_t)i, &dv));
        assert_true(dv == (double)k_f32s[i]);
    }
    assert_false(tm_gguf_arr_float(a, 4, &dv));
    assert_false(tm_gguf_arr_int(a, 0, &iv));
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_i32", TM_GGUF_I32, &a, &err), TM_OK);
    assert_int_equal(a->v.arr.n, 5);
    for (int i = 0; i < 5; i++) {
        assert_true(tm_gguf_arr_int(a, (uint64_t)i, &iv));
        assert_int_equal(iv, k_i32s[i]);
    }
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_u8", TM_GGUF_U8, &a, &err), TM_OK);
    for (int i = 0; i < 3; i++) assert_true(tm_gguf_arr_int(a, (uint64_t)i, &iv) && iv == k_u8s[i]);
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_bool", TM_GGUF_BOOL, &a, &err), TM_OK);
    for (int i = 0; i < 4; i++) assert_true(tm_gguf_arr_int(a, (uint64_t)i, &iv) && iv == k_bools[i]);
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_u64", TM_GGUF_U64, &a, &err), TM_OK);
    assert_false(tm_gguf_arr_int(a, 0, &iv)); /* UINT64_MAX does not fit */
    assert_true(tm_gguf_arr_int(a, 1, &iv) && iv == 42);
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_empty", TM_GGUF_I16, &a, &err), TM_OK);
    assert_int_equal(a->v.arr.n, 0);
    assert_false(tm_gguf_arr_int(a, 0, &iv));
    assert_int_equal(tm_gguf_get_arr(g, "t.arr_str_empty", TM_GGUF_STRING, &a, &err), TM_OK);
    assert_int_equal(a->v.arr.n, 0);

    /* tensors */
    struct {
        const char *name;
        tm_dtype type;
        uint32_t nd;
        uint64_t ne[4];
        const void *data; /* (nbytes) */
        size_t nbytes;
    } want[4] = {
        {"w.f32", TM_DT_F32, 2, {3, 2, 1, 1}, d->f32, sizeof d->f32},
        {"w.q8", TM_DT_Q8_0, 2, {64, 2, 1, 1}, d->q8, sizeof d->q8},
        {"w.f16", TM_DT_F16, 1, {5, 1, 1, 1}, d->f16, sizeof d->f16},
        {"w.i8", TM_DT_I8, 4, {2, 2, 2, 2}, d->i8, sizeof d->i8},
    };
    uint64_t expect_off = 0;
    for (int i = 0; i < 4; i++) {
        const tm_gguf_tensor *t = tm_gguf_tensor_find(g, want[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, &g->tensors[i]);
        assert_true(tm_str_eq(t->name, want[i].name));
        assert_int_equal(t->type, want[i].type);
        assert_int_equal(t->n_dims, want[i].nd);
        uint64_t n = 1;
        for (int k = 0; k < 4; k++) {
            assert_int_equal(t->ne[k], want[i].ne[k]);
            n *= want[i].ne[k];
        }
        assert_int_equal(t->n_elems, n);
        assert_int_equal(t->nbytes, want[i].nbytes);
        assert_int_equal(t->offset, expect_off);
        assert_ptr_equal(t->data, bytes + data_offset + t->offset);
        assert_memory_equal(t->data, want[i].data, want[i].nbytes);
        expect_off = (t->offset + t->nbytes + align - 1) / align * align;
    }
    assert_null(tm_gguf_tensor_find(g, "w"));
    assert_null(tm_gguf_tensor_find(g, "w.f32x"));
}

static void roundtrip(uint32_t version, uint32_t alignment) {
    full_data d;
    fill_full_data(&d);
    tm_gw *gw = full_gw(version, alignment, &d);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    size_t data_offset = tm_gw_data_offset(gw);
    tm_gw_free(gw);
    tm_gguf *g = NULL;
    tm_error err = {0};
    tm_status s = tm_gguf_open_bytes(bytes, size, &g, &err);
    if (s) fail_msg("open failed: %s", err.msg);
    check_full(g, version, alignment, &d, bytes, size, data_offset);
    tm_gguf_close(g);
    free(bytes);
}

/* ---- valid files ---------------------------------------------------------------------------------- */

static void test_roundtrip_v3(void **state) { (void)state; roundtrip(3, 0); }
static void test_roundtrip_v2(void **state) { (void)state; roundtrip(2, 0); }
static void test_roundtrip_align64(void **state) { (void)state; roundtrip(3, 64); }
static void test_roundtrip_align1(void **state) { (void)state; roundtrip(2, 1); }

static void test_empty_file_ok(void **state) {
    (void)state;
    tm_gw *gw = tm_gw_new(3);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    tm_gguf *g = NULL;
    tm_error err = {0};
    assert_int_equal(tm_gguf_open_bytes(bytes, size, &g, &err), TM_OK);
    assert_int_equal(g->n_kv, 0);
    assert_int_equal(g->n_tensors, 0);
    assert_null(tm_gguf_find(g, "x"));
    assert_null(tm_gguf_tensor_find(g, "x"));
    tm_gguf_close(g);
    /* only the 24 header bytes, no padding: still valid (nothing refers to the data section) */
    assert_int_equal(tm_gguf_open_bytes(bytes, 24, &g, &err), TM_OK);
    tm_gguf_close(g);
    free(bytes);
}

static void test_open_file(void **state) {
    (void)state;
    full_data d;
    fill_full_data(&d);
    tm_gw *gw = full_gw(3, 0, &d);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    char path[] = "/tmp/tm_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_true(tm_gw_write_file(path, bytes, size));
    tm_gguf *g = NULL;
    tm_error err = {0};
    tm_status s = tm_gguf_open(path, &g, &err);
    if (s) fail_msg("open failed: %s", err.msg);
    assert_non_null(g->map.data);
    assert_int_equal(g->size, size);
    assert_memory_equal(g->base, bytes, size);
    const tm_gguf_tensor *t = tm_gguf_tensor_find(g, "w.q8");
    assert_non_null(t);
    assert_memory_equal(t->data, d.q8, sizeof d.q8);
    tm_gguf_close(g);

    /* a broken file: the message names the path */
    bytes[0] = 'X';
    assert_true(tm_gw_write_file(path, bytes, size));
    g = (tm_gguf *)1;
    assert_int_equal(tm_gguf_open(path, &g, &err), TM_ERR_FORMAT);
    assert_null(g);
    assert_msg_has(err, path);
    assert_msg_has(err, "bad magic");
    unlink(path);
    free(bytes);

    assert_int_equal(tm_gguf_open("/nonexistent/dir/model.gguf", &g, &err), TM_ERR_IO);
    assert_null(g);
    assert_msg_has(err, "/nonexistent/dir/model.gguf");
    assert_int_equal(tm_gguf_open_bytes(NULL, 10, &g, &err), TM_ERR_INVALID);
    tm_gguf_close(NULL);
}

static void test_print(void **state) {
    (void)state;
    full_data d;
    fill_full_data(&d);
    tm_gw *gw = full_gw(3, 0, &d);
    char longs[400];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    tm_gw_kv_str(gw, "t.long", longs);
    int32_t many[100];
    for (int i = 0; i < 100; i++) many[i] = i * 3;
    tm_gw_kv_arr_i32(gw, "t.many", many, 100);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    tm_gguf *g = NULL;
    tm_error err = {0};
    assert_int_equal(tm_gguf_open_bytes(bytes, size, &g, &err), TM_OK);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    tm_gguf_print(g, f, true);
    fclose(f);
    const char *want[] = {
        "GGUF v3",
        "26 metadata keys, 4 tensors",
        "  general.architecture = \"llama\"\n",
        "  general.name = \"tiny\\n\\\"model\\\"\"\n",
        "  t.u8 = 200\n",
        "  t.i64 = -4611686018427387904\n",
        "  t.u64 = 9223372036854775813\n",
        "  t.f32 = 1.5\n",
        "  t.bool = true\n",
        "  t.bool_false = false\n",
        "  t.str_nul = \"a\\x00b\"\n",
        "  t.arr_str = [string x 3] [\"alpha\", \"\", \"g\xC3\xA9n\xC3\xA9ral \xE2\x9C\x93\"]\n",
        "  t.arr_i32 = [i32 x 5] [-2147483648, -1, 0, 7, 2147483647]\n",
        "  t.arr_u64 = [u64 x 2] [18446744073709551615, 42]\n",
        "  t.arr_bool = [bool x 4] [true, false, false, true]\n",
        "  t.many = [i32 x 100] [0, 3, 6, 9, 12, 15, 18, 21, ... 92 more]\n",
        "...\" (399 bytes)\n",
        "w.q8",
        "q8_0",
        "64 x 2",
        "2 x 2 x 2 x 2",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i])) fail_msg("print output lacks \"%s\":\n%s", want[i], text);
    assert_null(strstr(text, longs)); /* the long string was cut */
    free(text);

    /* without the tensor table */
    text = NULL;
    f = open_memstream(&text, &len);
    tm_gguf_print(g, f, false);
    fclose(f);
    assert_null(strstr(text, "w.q8"));
    assert_non_null(strstr(text, "t.u8 = 200"));
    free(text);
    tm_gguf_close(g);
    free(bytes);
}

static void test_escape(void **state) {
    (void)state;
    char buf[64];
    tm_str s = {"a\tb\x01\xFF\xC3\xA9\"\\", 9};
    assert_string_equal(tm_str_escape(buf, sizeof buf, s, 100), "a\\tb\\x01\\xFF\xC3\xA9\\\"\\\\");
    tm_str l = {"abcdefgh", 8};
    assert_string_equal(tm_str_escape(buf, sizeof buf, l, 3), "abc...");
    assert_string_equal(tm_str_escape(buf, 8, l, 100), "abcd..."); /* cut by the buffer */
    tm_str bad_utf8 = {"\xC3(", 2};                                 /* lead byte without continuation */
    assert_string_equal(tm_str_escape(buf, sizeof buf, bad_utf8, 100), "\\xC3(");
    tm_str overlong = {"\xC0\xAF", 2};
    assert_string_equal(tm_str_escape(buf, sizeof buf, overlong, 100), "\\xC0\\xAF");
    assert_string_equal(tm_gguf_type_name(TM_GGUF_STRING), "string");
    assert_string_equal(tm_gguf_type_name((tm_gguf_type)77), "unknown");
}

/* ---- truncation ----------------------------------------------------------------------------------- */

static void test_truncation_everywhere(void **state) {
    (void)state;
    full_data d;
    fill_full_data(&d);
    tm_gw *gw = full_gw(3, 0, &d);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    /* every prefix shorter than the file is refused: those cut in the header region, and those cut in
     * the data section. The prefix is copied into an exact-size buffer so ASan sees any over-read. */
    for (size_t n = 0; n < size; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        assert_non_null(cut);
        memcpy(cut, bytes, n);
        tm_gguf *g = (tm_gguf *)1;
        tm_error err = {0};
        tm_status s = tm_gguf_open_bytes(cut, n, &g, &err);
        if (s != TM_ERR_FORMAT) fail_msg("prefix of %zu bytes: status %d, msg \"%s\"", n, s, err.msg);
        assert_null(g);
        assert_true(err.msg[0] != '\0');
        free(cut);
    }
    free(bytes);
}

/* ---- header ------------------------------------------------------------------------------------------ */

static void test_bad_magic(void **state) {
    (void)state;
    uint8_t b[24] = "GGML";
    tm_gguf *g;
    tm_error err;
    assert_int_equal(tm_gguf_open_bytes(b, sizeof b, &g, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "bad magic 'GGML'");
    assert_int_equal(tm_gguf_open_bytes(b, 3, &g, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "truncated");
    assert_int_equal(tm_gguf_open_bytes(b, 0, &g, &err), TM_ERR_FORMAT);
    memcpy(b, "\x7F" "ELF", 4);
    assert_int_equal(tm_gguf_open_bytes(b, sizeof b, &g, &err), TM_ERR_FORMAT);
    assert_msg_has(err, "bad magic '\\x7FELF'");
}

static void test_versions(void **state) {
    (void)state;
    expect_refused(tm_gw_new(1), "version 1 is not supported");
    expect_refused(tm_gw_new(4), "unsupported GGUF version 4");
    expect_refused(tm_gw_new(0), "unsupported GGUF version 0");
    expect_refused(tm_gw_new(0x03000000), "byte-swapped");
}

static void test_bogus_counts(void **state) {
    (void)state;
    tm_gw *gw = small_gw();
    tm_gw_set_counts(gw, 0, 1000000);
    expect_refused(gw, "KV count 1000000 cannot fit");
    gw = small_gw();
    tm_gw_set_counts(gw, 1000000000000ull, 1);
    expect_refused(gw, "tensor count 1000000000000 cannot fit");
    gw = small_gw();
    tm_gw_set_counts(gw, UINT64_MAX, UINT64_MAX);
    expect_refused(gw, "tensor count");
    /* a count that fits the byte budget but is larger than the real one: runs into the next section */
    gw = small_gw();
    uint64_t ne[1] = {8};
    tm_gw_tensor(gw, "a", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_set_counts(gw, 1, 2); /* KV #1 eats the tensor info: its n_dims is then read from the data */
    expect_refused(gw, "tensor info #0 '' at byte 91: n_dims 0 is not in 1..4");
}

/* ---- key-value pairs -------------------------------------------------------------------------------- */

static void test_bogus_strings(void **state) {
    (void)state;
    /* string value length */
    tm_gw *gw = small_gw();
    uint64_t huge = 1000000000ull;
    uint8_t v[12] = {0};
    memcpy(v, &huge, 8);
    tm_gw_kv_raw(gw, "bad.str", TM_GW_STRING, v, sizeof v);
    expect_refused(gw, "KV #1 'bad.str' at byte");
    gw = small_gw();
    tm_gw_kv_raw(gw, "bad.str", TM_GW_STRING, v, sizeof v);
    tm_gw_alignment(gw, 1); /* no padding after the KVs: the 4 value bytes are all that is left */
    expect_refused(gw, "string value length 1000000000 exceeds the 4 bytes left");
    /* key length, including one that would overflow pos + len */
    gw = tm_gw_new(3);
    tm_gw_buf_u64(&gw->kv, UINT64_MAX);
    tm_gw_buf_put(&gw->kv, "padding-padding-", 16);
    gw->n_kv++;
    expect_refused(gw, "KV #0 at byte 24: key length 18446744073709551615 exceeds");
    /* a string inside a string array */
    gw = small_gw();
    tm_gw_kv_arr(gw, "bad.arr", TM_GW_STRING, 2, NULL, 0);
    tm_gw_buf_str(&gw->kv, "ok");
    tm_gw_buf_u64(&gw->kv, 99);
    tm_gw_buf_put(&gw->kv, "short", 5);
    expect_refused(gw, "string array element 1 length 99 exceeds");
}

static void test_bogus_arrays(void **state) {
    (void)state;
    int32_t few[2] = {1, 2};
    tm_gw *gw = small_gw();
    tm_gw_kv_arr(gw, "bad.arr", TM_GW_I32, 1ull << 40, few, sizeof few);
    expect_refused(gw, "array length 1099511627776 of i32 exceeds");
    gw = small_gw();
    tm_gw_kv_arr(gw, "bad.arr", TM_GW_I64, UINT64_MAX / 4, few, sizeof few); /* n * 8 would wrap */
    expect_refused(gw, "array length");
    gw = small_gw();
    tm_gw_kv_arr(gw, "bad.arr", TM_GW_STRING, 1ull << 60, few, sizeof few);
    expect_refused(gw, "string array length 1152921504606846976 exceeds");
    /* nested array: array of arrays of u8 */
    gw = small_gw();
    uint8_t inner[13] = {0};
    inner[0] = TM_GW_U8;
    inner[4] = 1;
    tm_gw_kv_arr(gw, "bad.nested", TM_GW_ARRAY, 1, inner, sizeof inner);
    expect_refused(gw, "nested array");
    /* unknown element type */
    gw = small_gw();
    tm_gw_kv_arr(gw, "bad.elem", 13, 1, few, 4);
    expect_refused(gw, "'bad.elem' at byte");
    gw = small_gw();
    tm_gw_kv_arr(gw, "bad.elem", 0x80000000u, 1, few, 4);
    expect_refused(gw, "unknown array element type 2147483648");
    /* bool elements other than 0/1 */
    gw = small_gw();
    uint8_t bools[3] = {1, 0, 2};
    tm_gw_kv_arr(gw, "bad.bools", TM_GW_BOOL, 3, bools, 3);
    expect_refused(gw, "bool array element 2 is 2, not 0 or 1");
}

static void test_bogus_values(void **state) {
    (void)state;
    uint32_t x = 0;
    /* first KV of an empty header: key "k" at 24 (8 + 1 bytes), type at 33 */
    tm_gw *gw = tm_gw_new(3);
    tm_gw_kv_raw(gw, "k", 13, &x, 4);
    expect_refused(gw, "KV #0 'k' at byte 33: unknown value type 13");
    gw = small_gw();
    tm_gw_kv_raw(gw, "k", 0xFFFFFFFFu, &x, 4);
    expect_refused(gw, "unknown value type 4294967295");
    gw = small_gw();
    uint8_t two = 2;
    tm_gw_kv_raw(gw, "bad.bool", TM_GW_BOOL, &two, 1);
    expect_refused(gw, "bool value is 2, not 0 or 1");
    /* a value cut by the end of the KV section runs into the tensor infos / end of file */
    gw = tm_gw_new(3);
    tm_gw_alignment(gw, 1);
    tm_gw_kv_raw(gw, "k", TM_GW_U64, &x, 4);
    expect_refused(gw, "truncated file: value needs 8 bytes, only 4 left");
}

static void test_duplicate_key(void **state) {
    (void)state;
    tm_gw *gw = small_gw();
    tm_gw_kv_str(gw, "general.name", "a");
    tm_gw_kv_u32(gw, "x.y", 1);
    tm_gw_kv_str(gw, "general.name", "b");
    expect_refused(gw, "'general.name'");
    gw = small_gw();
    tm_gw_kv_u32(gw, "x.y", 1);
    tm_gw_kv_u8(gw, "x.y", 1);
    expect_refused(gw, "duplicate key (also KV #1");
    /* keys that share a prefix or differ only after a NUL are not duplicates */
    gw = small_gw();
    tm_gw_kv_u32(gw, "x.y", 1);
    tm_gw_kv_u32(gw, "x.yz", 2);
    tm_gw_buf_strn(&gw->kv, "x.y\0a", 5);
    tm_gw_buf_u32(&gw->kv, TM_GW_U8);
    tm_gw_buf_put(&gw->kv, "\x03", 1);
    gw->n_kv++;
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    tm_gguf *g = NULL;
    tm_error err = {0};
    tm_status s = tm_gguf_open_bytes(bytes, size, &g, &err);
    if (s) fail_msg("%s", err.msg);
    assert_int_equal(tm_gguf_find(g, "x.y")->v.u, 1);
    assert_int_equal(tm_gguf_find(g, "x.yz")->v.u, 2);
    tm_gguf_close(g);
    free(bytes);
}

static void test_bad_alignment(void **state) {
    (void)state;
    tm_gw *gw = small_gw();
    tm_gw_kv_u32(gw, "general.alignment", 3);
    expect_refused(gw, "'general.alignment' at byte");
    gw = small_gw();
    tm_gw_kv_u32(gw, "general.alignment", 48);
    expect_refused(gw, "alignment 48 is not a nonzero power of two");
    gw = small_gw();
    tm_gw_kv_u32(gw, "general.alignment", 0);
    expect_refused(gw, "alignment 0 is not");
    gw = small_gw();
    tm_gw_kv_i32(gw, "general.alignment", -32);
    expect_refused(gw, "alignment -32 is not");
    gw = small_gw();
    tm_gw_kv_str(gw, "general.alignment", "32");
    expect_refused(gw, "alignment has type string, expected an integer");
    /* a huge (valid power of two) alignment puts the data section past the end of any file */
    gw = small_gw();
    tm_gw_kv_u64(gw, "general.alignment", 1ull << 63);
    uint64_t ne[1] = {8};
    tm_gw_tensor_info(gw, "t", 1, ne, TM_DT_F32, 0);
    expect_refused(gw, "runs past the end of the file");
}

/* ---- tensor infos ------------------------------------------------------------------------------------- */

static void test_bad_dims(void **state) {
    (void)state;
    uint64_t ne[5] = {32, 1, 1, 1, 1};
    tm_gw *gw = small_gw();
    tm_gw_tensor(gw, "t.nd0", TM_DT_F32, 0, ne, NULL, 4);
    expect_refused(gw, "tensor info #0 't.nd0' at byte");
    gw = small_gw();
    tm_gw_tensor(gw, "t.nd0", TM_DT_F32, 0, ne, NULL, 4);
    expect_refused(gw, "n_dims 0 is not in 1..4");
    gw = small_gw();
    tm_gw_tensor(gw, "t.nd5", TM_DT_F32, 5, ne, NULL, 128);
    expect_refused(gw, "n_dims 5 is not in 1..4");
    gw = small_gw();
    uint64_t ne0[3] = {4, 0, 2};
    tm_gw_tensor(gw, "t.zero", TM_DT_F32, 3, ne0, NULL, 32);
    expect_refused(gw, "'t.zero' at byte");
    gw = small_gw();
    tm_gw_tensor(gw, "t.zero", TM_DT_F32, 3, ne0, NULL, 32);
    expect_refused(gw, "dimension 1 is 0, must be at least 1");
    gw = small_gw();
    uint64_t neg[2] = {4, UINT64_MAX};
    tm_gw_tensor(gw, "t.neg", TM_DT_F32, 2, neg, NULL, 32);
    expect_refused(gw, "dimension 1 is -1");
    gw = small_gw();
    uint64_t big[2] = {1ull << 32, 1ull << 32};
    tm_gw_tensor(gw, "t.big", TM_DT_F32, 2, big, NULL, 32);
    expect_refused(gw, "element count overflows int64 at dimension 1");
    gw = small_gw();
    uint64_t big4[4] = {1ull << 16, 1ull << 16, 1ull << 16, 1ull << 16};
    tm_gw_tensor(gw, "t.big4", TM_DT_F32, 4, big4, NULL, 32);
    expect_refused(gw, "element count overflows int64 at dimension 3");
    /* element count fits int64 but the byte size does not fit 64 bits */
    gw = small_gw();
    uint64_t bigb[2] = {1ull << 31, 1ull << 31};
    tm_gw_tensor(gw, "t.bytes", TM_DT_F64, 2, bigb, NULL, 32);
    expect_refused(gw, "byte size of the tensor overflows");
}

static void test_bad_tensor_type(void **state) {
    (void)state;
    uint64_t ne[2] = {32, 2};
    tm_gw *gw = small_gw();
    tm_gw_tensor(gw, "t.q42", 4, 2, ne, NULL, 64); /* Q4_2: removed from ggml */
    expect_refused(gw, "'t.q42' at byte");
    gw = small_gw();
    tm_gw_tensor(gw, "t.q42", 4, 2, ne, NULL, 64);
    expect_refused(gw, "unknown tensor type 4");
    gw = small_gw();
    tm_gw_tensor(gw, "t.x", 0xDEADBEEFu, 2, ne, NULL, 64);
    expect_refused(gw, "unknown tensor type 3735928559");
    /* internal formats (activation blocks, fp8 e4m3 weights and KV) are never valid in a file */
    gw = small_gw();
    tm_gw_tensor(gw, "t.fp8", TM_DT_FP8_E4M3, 2, ne, NULL, 64);
    expect_refused(gw, "unknown tensor type 66");
    gw = small_gw();
    tm_gw_tensor(gw, "t.q16", TM_DT_Q16, 2, ne, NULL, 144);
    expect_refused(gw, "unknown tensor type 64");
    /* row not a multiple of the block */
    gw = small_gw();
    uint64_t ne33[2] = {33, 2};
    tm_gw_tensor(gw, "t.q8", TM_DT_Q8_0, 2, ne33, NULL, 68);
    expect_refused(gw, "row of 33 elements is not a multiple of the q8_0 block size 32");
    /* types tokenmill cannot compute with are still readable */
    gw = small_gw();
    uint64_t ne256[1] = {512};
    tm_gw_tensor(gw, "t.q2k", TM_DT_Q2_K, 1, ne256, NULL, 2 * 84);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    tm_gguf *g = NULL;
    tm_error err = {0};
    tm_status s = tm_gguf_open_bytes(bytes, size, &g, &err);
    if (s) fail_msg("%s", err.msg);
    assert_false(tm_dtype_supported(TM_DT_Q2_K));
    assert_int_equal(tm_gguf_tensor_find(g, "t.q2k")->nbytes, 168);
    tm_gguf_close(g);
    free(bytes);
}

static void test_bad_offsets(void **state) {
    (void)state;
    uint64_t ne[1] = {8};
    tm_gw *gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 64);
    tm_gw_tensor_info(gw, "t.mis", 1, ne, TM_DT_F32, 8);
    expect_refused(gw, "tensor info #1 't.mis' at byte");
    gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 64);
    tm_gw_tensor_info(gw, "t.mis", 1, ne, TM_DT_F32, 8);
    expect_refused(gw, "data offset 8 is not a multiple of the alignment 32");
    /* with general.alignment = 8 the same offset is fine, but the data overlaps t.a */
    gw = small_gw();
    tm_gw_kv_u32(gw, "general.alignment", 8);
    tm_gw_alignment(gw, 8);
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 64);
    tm_gw_tensor_info(gw, "t.mis", 1, ne, TM_DT_F32, 8);
    expect_refused(gw, "overlaps tensor 't.a'");
    /* data past the end of the file */
    gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_tensor_info(gw, "t.eof", 1, ne, TM_DT_F32, 4096);
    expect_refused(gw, "'t.eof' at byte");
    gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_tensor_info(gw, "t.eof", 1, ne, TM_DT_F32, 4096);
    expect_refused(gw, "runs past the end of the file");
    gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 31); /* one byte of its data missing */
    expect_refused(gw, "runs past the end of the file");
    gw = small_gw();
    tm_gw_tensor_info(gw, "t.wrap", 1, ne, TM_DT_F32, UINT64_MAX - 31); /* start + size wraps */
    expect_refused(gw, "runs past the end of the file");
    /* two tensors on the same bytes */
    gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_tensor_info(gw, "t.b", 1, ne, TM_DT_F32, 0);
    expect_refused(gw, "tensor info #1 't.b'");
}

static void test_bad_tensor_names(void **state) {
    (void)state;
    uint64_t ne[1] = {8};
    tm_gw *gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_tensor(gw, "t.b", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    expect_refused(gw, "tensor info #2 't.a'");
    gw = small_gw();
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    tm_gw_tensor(gw, "t.a", TM_DT_F32, 1, ne, NULL, 32);
    expect_refused(gw, "duplicate tensor name (also tensor #0");
    gw = small_gw();
    char name[65];
    memset(name, 'n', 64);
    name[64] = '\0';
    tm_gw_tensor(gw, name, TM_DT_F32, 1, ne, NULL, 32);
    expect_refused(gw, "tensor name is 64 bytes long, the limit is 63");
    gw = small_gw();
    tm_gw_buf_u64(&gw->ti, 1ull << 62); /* name length */
    tm_gw_buf_put(&gw->ti, NULL, 40);
    gw->n_tensors++;
    expect_refused(gw, "tensor name length 4611686018427387904 exceeds");
}

/* ---- fuzz ---------------------------------------------------------------------------------------------- */

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Exercise everything a caller may touch on an accepted file. */
static void use_everything(const tm_gguf *g, FILE *devnull) {
    tm_error err;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tm_gguf_kv *kv = &g->kv[i];
        char key[256];
        if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, (size_t)kv->key.len)) continue;
        memcpy(key, kv->key.ptr, (size_t)kv->key.len);
        key[kv->key.len] = '\0';
        assert_ptr_equal(tm_gguf_find(g, key), kv); /* keys are unique */
        uint32_t u32;
        int64_t i64;
        float f;
        bool b;
        tm_str s;
        const tm_gguf_kv *a;
        (void)tm_gguf_get_u32(g, key, &u32, &err);
        (void)tm_gguf_get_i64(g, key, &i64, &err);
        (void)tm_gguf_get_f32(g, key, &f, &err);
        (void)tm_gguf_get_bool(g, key, &b, &err);
        (void)tm_gguf_get_str(g, key, &s, &err);
        if (tm_gguf_get_arr(g, key, kv->type == TM_GGUF_ARRAY ? kv->v.arr.type : TM_GGUF_U8, &a, &err) == TM_OK) {
            double dv;
            for (uint64_t k = 0; k < a->v.arr.n && k < 16; k++) {
                (void)tm_gguf_arr_int(a, k, &i64);
                (void)tm_gguf_arr_float(a, k, &dv);
            }
        }
    }
    uint64_t sum = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tm_gguf_tensor *t = &g->tensors[i];
        assert_true((const uint8_t *)t->data >= g->base + g->data_offset);
        assert_true((const uint8_t *)t->data + t->nbytes <= g->base + g->size);
        assert_int_equal(tm_dtype_row_bytes(t->type, t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3], t->nbytes);
        const uint8_t *p = t->data;
        sum += p[0] + p[t->nbytes - 1];
    }
    tm_gguf_print(g, devnull, true);
    fprintf(devnull, "%" PRIu64, sum);
}

static void test_fuzz_byte_flips(void **state) {
    (void)state;
    full_data d;
    fill_full_data(&d);
    tm_gw *gw = full_gw(3, 0, &d);
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    size_t header = tm_gw_data_offset(gw);
    tm_gw_free(gw);
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    uint8_t *buf = malloc(size);
    assert_non_null(buf);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int n_ok = 0, n_err = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(buf, bytes, size);
        int flips = 1 + (int)(xorshift(&seed) % 3);
        for (int k = 0; k < flips; k++) {
            uint64_t r = xorshift(&seed);
            /* mostly the header region, where the structure is; sometimes anywhere */
            size_t pos = (r & 3) ? (size_t)((r >> 8) % header) : (size_t)((r >> 8) % size);
            uint64_t how = xorshift(&seed);
            if (how & 1) buf[pos] ^= (uint8_t)(1u << ((how >> 8) % 8)); /* one bit */
            else buf[pos] = (uint8_t)(how >> 16);                        /* any value */
        }
        size_t n = (it % 5 == 0) ? size - (size_t)(xorshift(&seed) % 64) : size; /* sometimes cut too */
        tm_gguf *g = NULL;
        tm_error err = {0};
        tm_status s = tm_gguf_open_bytes(buf, n, &g, &err);
        if (s == TM_OK) {
            n_ok++;
            use_everything(g, devnull);
            tm_gguf_close(g);
        } else {
            n_err++;
            if (s != TM_ERR_FORMAT) fail_msg("iteration %d: status %d: %s", it, s, err.msg);
            assert_null(g);
            assert_true(strncmp(err.msg, "gguf: ", 6) == 0);
        }
    }
    /* both outcomes happened: the loop exercised accepted (mutated) files and refusals */
    assert_true(n_ok > 100);
    assert_true(n_err > 100);
    fclose(devnull);
    free(buf);
    free(bytes);
}

/* ---- the real model ------------------------------------------------------------------------------------ */

static void test_real_model(void **state) {
    (void)state;
    const char *path = getenv("TM_MODEL");
    if (!path || !*path || access(path, R_OK) != 0) {
        skip();
        return;
    }
    tm_gguf *g = NULL;
    tm_error err = {0};
    tm_status s = tm_gguf_open(path, &g, &err);
    if (s) fail_msg("%s", err.msg);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_tensors, 272);
    uint32_t n_layer;
    assert_int_equal(tm_gguf_get_u32(g, "llama.block_count", &n_layer, &err), TM_OK);
    assert_int_equal(n_layer, 30);
    tm_str arch;
    assert_int_equal(tm_gguf_get_str(g, "general.architecture", &arch, &err), TM_OK);
    assert_true(tm_str_eq(arch, "llama"));
    const tm_gguf_kv *tokens;
    assert_int_equal(tm_gguf_get_arr(g, "tokenizer.ggml.tokens", TM_GGUF_STRING, &tokens, &err), TM_OK);
    assert_int_equal(tokens->v.arr.n, 49152);
    const tm_gguf_kv *types;
    assert_int_equal(tm_gguf_get_arr(g, "tokenizer.ggml.token_type", TM_GGUF_I32, &types, &err), TM_OK);
    assert_int_equal(types->v.arr.n, 49152);
    const tm_gguf_tensor *t = tm_gguf_tensor_find(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, TM_DT_Q8_0);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 576);
    assert_int_equal(t->ne[1], 49152);
    assert_int_equal(t->nbytes, 576 / 32 * 34 * 49152ull);
    /* every tensor lies in the mapping, in order, aligned; per-layer names resolve */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tm_gguf_tensor *x = &g->tensors[i];
        assert_int_equal(x->offset % g->alignment, 0);
        assert_true(g->data_offset + x->offset + x->nbytes <= g->size);
        char name[80];
        assert_true(x->name.len < sizeof name);
        memcpy(name, x->name.ptr, (size_t)x->name.len);
        name[x->name.len] = '\0';
        assert_ptr_equal(tm_gguf_tensor_find(g, name), x);
    }
    for (int l = 0; l < 30; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        const tm_gguf_tensor *q = tm_gguf_tensor_find(g, name);
        if (!q) fail_msg("missing %s", name);
        assert_int_equal(q->ne[0], 576);
    }
    /* the printout backs `tokenmill inspect` */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tm_gguf_print(g, f, true);
    fclose(f);
    assert_non_null(strstr(text, "  llama.block_count = 30\n"));
    assert_non_null(strstr(text, "tokenizer.ggml.tokens = [string x 49152]"));
    assert_non_null(strstr(text, "token_embd.weight"));
    free(text);
    tm_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_v3),
        cmocka_unit_test(test_roundtrip_v2),
        cmocka_unit_test(test_roundtrip_align64),
        cmocka_unit_test(test_roundtrip_align1),
        cmocka_unit_test(test_empty_file_ok),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_print),
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_truncation_everywhere),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_bogus_counts),
        cmocka_unit_test(test_bogus_strings),
        cmocka_unit_test(test_bogus_arrays),
        cmocka_unit_test(test_bogus_values),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_dims),
        cmocka_unit_test(test_bad_tensor_type),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_bad_tensor_names),
        cmocka_unit_test(test_fuzz_byte_flips),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
