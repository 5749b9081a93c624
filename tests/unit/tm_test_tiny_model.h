/* tm_test_tiny_model.h -- tiny random Llama/Qwen2 GGUF models written to temp files, for tests. */
#ifndef TM_TEST_TINY_MODEL_H
#define TM_TEST_TINY_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cpu/tm_quant.h"
#include "tm_test_gguf_writer.h"

/* ---- tiny model files -------------------------------------------------------------------------- */

typedef struct tiny_opts {
    const char *arch;     /* "llama" or "qwen2" */
    tm_dtype wtype;       /* matrix weight type */
    bool tied;
    int dim, layers, heads, kv_heads, ffn, vocab;
    const char *skip_tensor;      /* leave this tensor out */
    const char *bad_shape_tensor; /* write this tensor with a wrong shape */
    int ctx;                      /* context_length (0: 256) */
} tiny_opts;

static inline tiny_opts tiny_default(void) {
    tiny_opts o = {"llama", TM_DT_F16, false, 64, 2, 4, 2, 96, 300, NULL, NULL, 0};
    return o;
}

static uint64_t g_rng = 12345;
static inline float frand(void) { /* uniform [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static inline void add_matrix(tm_gw *gw, const tiny_opts *o, const char *name, tm_dtype t, int rows, int cols, float scale,
                       float constant) {
    if (o->skip_tensor && !strcmp(name, o->skip_tensor)) return;
    float *f = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    for (int i = 0; i < rows * cols; i++) f[i] = constant != 0.0f ? constant + 0.1f * frand() : scale * frand();
    uint64_t rb = tm_dtype_row_bytes(t, (uint64_t)cols);
    uint8_t *q = malloc(rb * (size_t)rows);
    for (int r = 0; r < rows; r++) tm_quant_row(t, f + (size_t)r * (size_t)cols, q + rb * (size_t)r, cols);
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    if (o->bad_shape_tensor && !strcmp(name, o->bad_shape_tensor)) ne[1] = (uint64_t)rows / 2;
    tm_gw_tensor(gw, name, t, rows == 1 ? 1 : 2, ne, q, rows == 1 ? rb : rb * (size_t)(ne[1]));
    free(f);
    free(q);
}

/* Writes a tiny model to a temp file and returns its path (static inline buffer). */
static inline const char *write_tiny(const tiny_opts *o) {
    static char path[256];
    static int counter;
    snprintf(path, sizeof path, "/tmp/tm_test_model_%d_%d.gguf", (int)getpid(), counter++);
    tm_gw *gw = tm_gw_new(3);
    char k[128];
    tm_gw_kv_str(gw, "general.architecture", o->arch);
    tm_gw_kv_str(gw, "general.name", "tiny");
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", o->arch, s), k)
    tm_gw_kv_u32(gw, KEY("block_count"), (uint32_t)o->layers);
    tm_gw_kv_u32(gw, KEY("embedding_length"), (uint32_t)o->dim);
    tm_gw_kv_u32(gw, KEY("feed_forward_length"), (uint32_t)o->ffn);
    tm_gw_kv_u32(gw, KEY("attention.head_count"), (uint32_t)o->heads);
    tm_gw_kv_u32(gw, KEY("attention.head_count_kv"), (uint32_t)o->kv_heads);
    tm_gw_kv_u32(gw, KEY("context_length"), (uint32_t)(o->ctx > 0 ? o->ctx : 256));
    tm_gw_kv_f32(gw, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    tm_gw_kv_f32(gw, KEY("rope.freq_base"), 10000.0f);
#undef KEY
    /* SPM vocabulary: <unk>, <s>, </s>, 256 byte tokens, then letters */
    const char **toks = calloc((size_t)o->vocab, sizeof(char *));
    char (*store)[16] = calloc((size_t)o->vocab, 16);
    float *scores = calloc((size_t)o->vocab, sizeof(float));
    int32_t *types = calloc((size_t)o->vocab, sizeof(int32_t));
    for (int i = 0; i < o->vocab; i++) {
        if (i < 3) snprintf(store[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259) snprintf(store[i], 16, "<0x%02X>", i - 3);
        else snprintf(store[i], 16, "w%d", i);
        toks[i] = store[i];
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
        scores[i] = -(float)i;
    }
    tm_gw_kv_str(gw, "tokenizer.ggml.model", "llama");
    tm_gw_kv_arr_str(gw, "tokenizer.ggml.tokens", toks, (uint64_t)o->vocab);
    tm_gw_kv_arr_f32(gw, "tokenizer.ggml.scores", scores, (uint64_t)o->vocab);
    tm_gw_kv_arr_i32(gw, "tokenizer.ggml.token_type", types, (uint64_t)o->vocab);
    tm_gw_kv_u32(gw, "tokenizer.ggml.bos_token_id", 1);
    tm_gw_kv_u32(gw, "tokenizer.ggml.eos_token_id", 2);
    free(toks);
    free(store);
    free(scores);
    free(types);

    int hd = o->dim / o->heads, qd = o->heads * hd, kvd = o->kv_heads * hd;
    add_matrix(gw, o, "token_embd.weight", o->wtype, o->vocab, o->dim, 1.0f, 0.0f);
    add_matrix(gw, o, "output_norm.weight", TM_DT_F32, 1, o->dim, 0.0f, 1.0f);
    if (!o->tied) add_matrix(gw, o, "output.weight", o->wtype, o->vocab, o->dim, 0.2f, 0.0f);
    for (int l = 0; l < o->layers; l++) {
        char n[64];
#define T(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        add_matrix(gw, o, T("attn_norm.weight"), TM_DT_F32, 1, o->dim, 0.0f, 1.0f);
        add_matrix(gw, o, T("attn_q.weight"), o->wtype, qd, o->dim, 0.3f, 0.0f);
        add_matrix(gw, o, T("attn_k.weight"), o->wtype, kvd, o->dim, 0.3f, 0.0f);
        add_matrix(gw, o, T("attn_v.weight"), o->wtype, kvd, o->dim, 0.3f, 0.0f);
        if (!strcmp(o->arch, "qwen2")) {
            add_matrix(gw, o, T("attn_q.bias"), TM_DT_F32, 1, qd, 0.5f, 0.0f);
            add_matrix(gw, o, T("attn_k.bias"), TM_DT_F32, 1, kvd, 0.5f, 0.0f);
            add_matrix(gw, o, T("attn_v.bias"), TM_DT_F32, 1, kvd, 0.5f, 0.0f);
        }
        add_matrix(gw, o, T("attn_output.weight"), o->wtype, o->dim, qd, 0.2f, 0.0f);
        add_matrix(gw, o, T("ffn_norm.weight"), TM_DT_F32, 1, o->dim, 0.0f, 1.0f);
        add_matrix(gw, o, T("ffn_gate.weight"), o->wtype, o->ffn, o->dim, 0.3f, 0.0f);
        add_matrix(gw, o, T("ffn_up.weight"), o->wtype, o->ffn, o->dim, 0.3f, 0.0f);
        add_matrix(gw, o, T("ffn_down.weight"), o->wtype, o->dim, o->ffn, 0.2f, 0.0f);
#undef T
    }
    uint8_t *bytes;
    size_t size;
    tm_gw_finish(gw, &bytes, &size);
    tm_gw_free(gw);
    assert_true(tm_gw_write_file(path, bytes, size));
    free(bytes);
    return path;
}

#endif /* TM_TEST_TINY_MODEL_H */
