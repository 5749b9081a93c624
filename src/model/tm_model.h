/* tm_model.h -- hyper-parameters from GGUF keys, weight binding, dummy models, the forward pass. */
#ifndef TM_MODEL_H
#define TM_MODEL_H

#include "backend/backend.h"
#include "core/tm_core.h"
#include "gguf/tm_gguf.h"
#include "tokenizer/tm_tok.h"

typedef enum tm_arch { TM_ARCH_LLAMA = 0, TM_ARCH_QWEN2 = 1 } tm_arch;

typedef struct tm_hparams {
    tm_arch arch;
    int32_t n_vocab;
    int32_t dim;             /* embedding width */
    int32_t n_layers;
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t ffn_dim;
    int32_t n_ctx_train;     /* context length the model was trained for */
    float norm_eps;
    float rope_theta;
    int32_t rope_dim;
    bool rope_neox;
    float rope_scale_linear; /* positions divided by this (1 = none) */
    bool qkv_bias;
    bool tied_embeddings;
} tm_hparams;

typedef struct tm_layer {
    tm_weight attn_norm;            /* (1, dim) */
    tm_weight wq, wk, wv;           /* (n_heads*hd, dim), (n_kv*hd, dim), (n_kv*hd, dim) */
    tm_weight bq, bk, bv;           /* (1, ...) biases, data NULL when absent */
    tm_weight wo;                   /* (dim, n_heads*hd) */
    tm_weight ffn_norm;             /* (1, dim) */
    tm_weight w_gate, w_up;         /* (ffn, dim) */
    tm_weight w_down;               /* (dim, ffn) */
} tm_layer;

typedef struct tm_model {
    tm_hparams hp;
    tm_gguf *gguf;                  /* owned; NULL for dummy models */
    tm_tokenizer *tok;              /* owned */
    char *chat_template;            /* tokenizer.chat_template (NUL-terminated copy) or NULL */
    char *name;                     /* display name */
    tm_weight tok_embd;             /* (n_vocab, dim) */
    tm_weight output_norm;          /* (1, dim) */
    tm_weight output;               /* (n_vocab, dim); == tok_embd when tied */
    tm_layer *layers;               /* (n_layers) */
    float *rope_inv_freq;           /* (rope_dim / 2) */
    void *dummy_mem;                /* owned weight memory of a dummy model, (dummy_bytes) */
    uint64_t dummy_bytes;
    uint64_t weight_bytes;          /* bytes of all weights used by the forward pass */
} tm_model;

/* Load a GGUF file (path) or a dummy model ("dummy:NAME[:TYPE]", NAME in smollm2-135m, llama3.2-1b,
 * llama3-8b, llama2-7b, tiny; TYPE in f32,f16,bf16,q8_0,q4_0,q4_1,q4_K,q6_K,fp8 (= fp8_e4m3) (default f16)). fp8: the seven
 * linear weights of each layer are e4m3 with per-tensor scales (W8A8, tm_weight's scale and act_scale); the token
 * embedding and the output projection are bf16. */
tm_status tm_model_load(const char *spec, tm_model **out, tm_error *err);
void tm_model_free(tm_model *m);
typedef struct tm_model_load_opts {
    bool defer_dummy;           /* dummy weights are left as recipes (data NULL) for a backend to make */
} tm_model_load_opts;
tm_status tm_model_load_ex(const char *spec, const tm_model_load_opts *opts, tm_model **out, tm_error *err);
/* A copy of m whose weights live in the backend's memory (ops->weight_place: uploaded, or dummy recipes made
 * there). It borrows everything else from m (tokenizer, names, rope table), so m must outlive it. */
tm_status tm_model_place(const tm_model *m, tm_backend *be, tm_model **out, tm_error *err);
void tm_model_unplace(tm_model *placed, tm_backend *be);
/* true when some weight is a deferred dummy recipe (only a device backend can run the model) */
bool tm_model_has_deferred(const tm_model *m);
/* Hyper-parameters and weight type of a dummy spec ("dummy:NAME[:TYPE]") without allocating its weights
 * (for planning); the shape tm_model_load would give. weight_type is the linears' type (TM_DT_FP8_E4M3 for fp8,
 * whose embedding and output projection are bf16). */
tm_status tm_model_dummy_hparams(const char *spec, tm_hparams *hp, tm_dtype *weight_type, tm_error *err);

/* Activation workspace of a forward pass for up to max_tokens tokens per step. */
typedef struct tm_workspace {
    int32_t max_tokens;
    int32_t max_logits;
    void *x;       /* (max_tokens, dim) residual stream */
    void *xb;      /* (max_tokens, dim) normed input */
    void *q;       /* (max_tokens, n_heads*hd) */
    void *k;       /* (max_tokens, n_kv*hd) */
    void *v;       /* (max_tokens, n_kv*hd) */
    void *att;     /* (max_tokens, n_heads*hd) */
    void *proj;    /* (max_tokens, dim) */
    void *hb;      /* (max_tokens, ffn) */
    void *hb2;     /* (max_tokens, ffn) */
    void *hsel;    /* (max_logits, dim) rows that need logits */
    void *logits;  /* (max_logits, n_vocab) */
} tm_workspace;

/* max_logits: most rows of logits a pass computes (<= max_tokens; <= 0 means max_tokens) */
tm_status tm_workspace_init(tm_workspace *ws, const tm_model *m, tm_backend *be, int32_t max_tokens, int32_t max_logits,
                            tm_error *err);
void tm_workspace_free(tm_workspace *ws, tm_backend *be);
tm_attn_cfg tm_model_attn_cfg(const tm_model *m);

/* One forward pass over a ragged batch; writes b->n_logits rows of n_vocab logits to logits_out (host), or leaves
 * them in ws->logits when logits_out is NULL. */
tm_status tm_model_forward(const tm_model *m, tm_backend *be, tm_workspace *ws, const tm_batch *b, float *logits_out,
                           tm_error *err);

#endif /* TM_MODEL_H */
