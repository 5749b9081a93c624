/* tb_quant.h -- weight helpers shared by the weight-kernel test beds: the types, and random GGUF-layout weights. */
#ifndef TB_QUANT_H
#define TB_QUANT_H

#include "backend/cpu/tm_quant.h"
#include "core/tm_dtype.h"
#include "tb_common.h"
#include "tb_guard.h"

static const int32_t k_types[] = {TM_DT_F32, TM_DT_F16, TM_DT_BF16, TM_DT_Q8_0,
                                  TM_DT_Q4_0, TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))
static inline bool is_quant(int32_t t) { return t != TM_DT_F32 && t != TM_DT_F16 && t != TM_DT_BF16; }
static inline int qk_of(int32_t t) { return (int)tm_dtype_get((uint32_t)t)->block; }
static inline size_t row_bytes_of(int32_t t, int64_t cols) { return (size_t)tm_dtype_row_bytes((uint32_t)t, (uint64_t)cols); }
static inline const char *type_name(int32_t t) { return tm_dtype_name((uint32_t)t); }

static inline void put_f16(uint8_t *p, float v) {
    uint16_t h = tm_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* a cheap approximately normal number (sum of four 16-bit uniforms, mean 0, variance 1): the large group cases
 * make tens of millions of weights */
static inline float fast_normal(void) {
    const uint64_t r = tb_rand_u64();
    const float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* rows x cols weights of type t in GGUF layout; random_bytes: raw random blocks with valid fp16 scales */
static inline uint8_t *make_weights(int32_t t, int64_t rows, int64_t cols, bool random_bytes) {
    const size_t rb = row_bytes_of(t, cols);
    uint8_t *w = tb_xmalloc(rb * (size_t)rows);
    float *tmp = tb_xmalloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * rb;
        if (random_bytes && is_quant(t)) {
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)tb_rand_u64();
            const tm_dtype_info *ti = tm_dtype_get((uint32_t)t);
            for (size_t b = 0; b < rb / ti->bytes; b++) {
                uint8_t *blk = row + b * ti->bytes;
                const float d = 0.002f + 0.01f * (tb_uniform() + 1.0f);
                switch (t) {
                case TM_DT_Q8_0: put_f16(blk, d * 0.1f); break;
                case TM_DT_Q4_0: put_f16(blk, d); break;
                case TM_DT_Q4_1: put_f16(blk, d); put_f16(blk + 2, 0.05f * tb_uniform()); break;
                case TM_DT_Q4_K: put_f16(blk, d * 0.1f); put_f16(blk + 2, d * 0.05f); break;
                case TM_DT_Q6_K: put_f16(blk + 208, d * 0.01f); break;
                default: break;
                }
            }
        } else {
            const float scale = 0.02f * (1.0f + (float)(r % 5));
            for (int64_t j = 0; j < cols; j++) tmp[j] = scale * fast_normal();
            if (cols > 3) tmp[tb_rand_u64() % (uint64_t)cols] = 8.0f * scale; /* an outlier per row */
            tm_quant_row((tm_dtype)t, tmp, row, cols);
        }
    }
    free(tmp);
    return w;
}

#endif /* TB_QUANT_H */
