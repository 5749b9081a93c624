/* tm_dtype.c -- the table of GGUF tensor element types and their block layouts. */
#include "tm_dtype.h"

static const tm_dtype_info k_types[TM_DT_COUNT] = {
    [TM_DT_F32] = {"f32", 1, 4},
    [TM_DT_F16] = {"f16", 1, 2},
    [TM_DT_Q4_0] = {"q4_0", 32, 18},
    [TM_DT_Q4_1] = {"q4_1", 32, 20},
    [TM_DT_Q5_0] = {"q5_0", 32, 22},
    [TM_DT_Q5_1] = {"q5_1", 32, 24},
    [TM_DT_Q8_0] = {"q8_0", 32, 34},
    [TM_DT_Q8_1] = {"q8_1", 32, 36},
    [TM_DT_Q2_K] = {"q2_K", 256, 84},
    [TM_DT_Q3_K] = {"q3_K", 256, 110},
    [TM_DT_Q4_K] = {"q4_K", 256, 144},
    [TM_DT_Q5_K] = {"q5_K", 256, 176},
    [TM_DT_Q6_K] = {"q6_K", 256, 210},
    [TM_DT_Q8_K] = {"q8_K", 256, 292},
    [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},
    [18] = {"iq3_xxs", 256, 98},
    [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},
    [21] = {"iq3_s", 256, 110},
    [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136},
    [TM_DT_I8] = {"i8", 1, 1},
    [TM_DT_I16] = {"i16", 1, 2},
    [TM_DT_I32] = {"i32", 1, 4},
    [TM_DT_I64] = {"i64", 1, 8},
    [TM_DT_F64] = {"f64", 1, 8},
    [TM_DT_BF16] = {"bf16", 1, 2},
    [29] = {"iq1_m", 256, 56},
    [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},
    [39] = {"mxfp4", 32, 17},
    [TM_DT_Q16] = {"q16", 32, 72},
    [TM_DT_Q16_K] = {"q16_K", 256, 580},
    [TM_DT_FP8_E4M3] = {"fp8_e4m3", 1, 1},
};

const tm_dtype_info *tm_dtype_get(uint32_t t) {
    if (t >= TM_DT_COUNT || !k_types[t].name) return NULL;
    return &k_types[t];
}

bool tm_dtype_supported(uint32_t t) {
    switch (t) {
    case TM_DT_F32: case TM_DT_F16: case TM_DT_BF16: case TM_DT_Q8_0: case TM_DT_Q4_0: case TM_DT_Q4_1:
    case TM_DT_Q4_K: case TM_DT_Q6_K:
        return true;
    default:
        return false;
    }
}

const char *tm_dtype_name(uint32_t t) {
    const tm_dtype_info *i = tm_dtype_get(t);
    return i ? i->name : "unknown";
}

uint64_t tm_dtype_row_bytes(uint32_t t, uint64_t n) {
    const tm_dtype_info *i = tm_dtype_get(t);
    if (!i || n % i->block) return 0;
    return n / i->block * i->bytes;
}
