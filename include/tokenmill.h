/* tokenmill.h -- the public C API of tokenmill (prefix tm_). The only header a library user includes. */
#ifndef TOKENMILL_H
#define TOKENMILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---------------------------------------------------------------------------- */
typedef enum tm_status {
    TM_OK = 0,
    TM_ERR_IO,          /* file or OS error */
    TM_ERR_FORMAT,      /* malformed input file or data */
    TM_ERR_NOMEM,       /* allocation failed */
    TM_ERR_INVALID,     /* bad argument or value */
    TM_ERR_UNSUPPORTED, /* valid but not supported (architecture, tensor type, template) */
    TM_ERR_RANGE,       /* value out of range (prompt longer than the context, ...) */
    TM_ERR_INTERNAL,    /* a bug */
    TM_ERR_DEVICE,      /* accelerator error: no device, a failed launch or copy, a library call */
} tm_status;

/* An error: a code and one human-readable line. Every fallible call takes a `tm_error *` (may be NULL). */
typedef struct tm_error {
    tm_status code;
    char msg[512];
} tm_error;

const char *tm_status_name(tm_status s);

/* ---- models and contexts --------------------------------------------------------------------- */

/* A loaded model plus everything needed to run it (backend, KV cache, workspace). Not thread-safe:
 * use one tm_ctx per thread. */
typedef struct tm_ctx tm_ctx;

typedef struct tm_load_params {
    const char *model;          /* GGUF path, or "dummy:NAME[:TYPE]" */
    int32_t n_threads;          /* 0: all cores */
    int32_t n_ctx;              /* max tokens per sequence; 0: min(model's, 4096) */
    int32_t max_batch_tokens;   /* tokens per forward pass; 0: 512 */
    int32_t block_size;         /* KV cache block size in tokens; 0: 16 */
    int32_t act_bits;           /* cpu: activations quantized to 16-bit (default, fp32-accurate) or 8-bit blocks */
    int32_t max_seqs;           /* sequences batched together (continuous batching); the KV cache holds this many
                                 * full contexts; 0: 1 */
    bool no_prefix_cache;       /* turn off sharing of cached prompt blocks between requests */
    const char *device;         /* "cpu" (default), "cuda" or "cuda:N" */
    bool no_graphs;             /* cuda: run decode steps without CUDA graphs */
    int32_t kv_blocks;          /* KV pool size in blocks; 0: max_seqs full contexts (cuda: what fits) */
    int32_t tp;                 /* tensor-parallel ranks (Megatron sharding; cpu ranks for now); 0/1: none */
    const char *kv_cache_dtype; /* KV cache element type: NULL or "auto" (cpu f16, cuda bf16), "f32" (cpu), "f16" (cpu),
                                 * "bf16" (cuda), "fp8" (e4m3: half of bf16's bytes, a quarter of f32's) */
    bool no_pipeline;           /* cuda: finish each step before planning the next (by default a decode step whose
                                 * successor is certain has it queued before its tokens reach the host) */
} tm_load_params;

tm_load_params tm_load_params_default(void);
tm_status tm_load(const tm_load_params *p, tm_ctx **out, tm_error *err);
void tm_free(tm_ctx *ctx);

typedef struct tm_model_info {
    const char *name;           /* general.name or the spec */
    const char *arch;           /* "llama", "qwen2" */
    int32_t n_vocab, n_ctx, n_ctx_train, n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim;
    uint64_t weight_bytes;      /* bytes read per forward pass for weights */
    int32_t bos, eos;           /* -1 when absent */
    int32_t n_threads;          /* threads of this context's backend */
    int32_t act_bits;           /* cpu activation blocks: 16 or 8 */
} tm_model_info;
tm_model_info tm_get_model_info(const tm_ctx *ctx);

/* ---- text ------------------------------------------------------------------------------------ */

/* Encode text; *ids is malloc'ed (free with tm_free_buf). add_bos follows the model when true.
 * parse_special lets control tokens written in the text (e.g. "<|im_start|>") become single ids. */
tm_status tm_tokenize(tm_ctx *ctx, const char *text, size_t len, bool add_bos, bool parse_special, int32_t **ids,
                      size_t *n_ids, tm_error *err);
/* Decode ids to a NUL-terminated malloc'ed string (free with tm_free_buf); special: render control tokens. */
tm_status tm_detokenize(tm_ctx *ctx, const int32_t *ids, size_t n_ids, bool special, char **text, tm_error *err);
void tm_free_buf(void *p);

typedef struct tm_chat_message {
    const char *role;           /* "system", "user", "assistant" */
    const char *content;
} tm_chat_message;
/* Render a conversation with the model's chat template (or the named one: chatml, llama3, llama2,
 * mistral, gemma). *out is malloc'ed. */
tm_status tm_apply_chat_template(tm_ctx *ctx, const char *template_name, const tm_chat_message *msgs, size_t n_msgs,
                                 bool add_generation_prompt, char **out, tm_error *err);

/* ---- generation ------------------------------------------------------------------------------ */

typedef struct tm_generate_params {
    int32_t max_tokens;         /* tokens to generate (default 128) */
    float temperature;          /* 0 = greedy (default 0.8) */
    int32_t top_k;              /* <= 0 off (default 40) */
    float top_p;                /* 1 off (default 0.95) */
    float min_p;                /* 0 off (default 0.05) */
    float repeat_penalty;       /* 1 off (default 1) */
    float presence_penalty;     /* 0 off */
    float frequency_penalty;    /* 0 off */
    uint64_t seed;              /* same seed, same output */
    int32_t n_logprobs;         /* top-N logprobs per token, 0..20 */
    bool ignore_eos;
    const char *const *stop;    /* (n_stop) stop strings; output ends before the first match */
    size_t n_stop;
    int32_t priority;           /* lower = more urgent; FCFS within a priority (batch submission) */
    int32_t repeat_last_n;      /* generated ids the repeat penalty looks back over: -1 all, 0 none (default 64) */
} tm_generate_params;
tm_generate_params tm_generate_params_default(void);

typedef struct tm_token_logprob {
    int32_t id;
    float logprob;
} tm_token_logprob;

typedef struct tm_token_event {
    int32_t token;              /* -1 for a final flush of held-back text */
    const char *text;           /* text released with this token, text_len bytes, complete UTF-8 */
    size_t text_len;
    float logprob;              /* of the chosen token, when n_logprobs > 0 */
    const tm_token_logprob *top; /* (n_top) most likely tokens */
    int32_t n_top;
} tm_token_event;
/* Return false to stop generation early. */
typedef bool (*tm_token_cb)(void *user, const tm_token_event *ev);

typedef struct tm_generate_result {
    int32_t prompt_tokens, tokens;
    double ttft_ms;             /* start -> first token */
    double prefill_tok_s;       /* prompt tokens computed (not cached) / prompt time */
    double decode_tok_s;        /* (tokens - 1) / time after the first token */
    const char *finish_reason;  /* "stop", "length", "abort" (static string) */
    int32_t cached_tokens;      /* prompt tokens served from the prefix cache (a multiple of the block size) */
} tm_generate_result;

/* Generate a continuation of prompt ids, streaming text through cb (may be NULL). */
tm_status tm_generate(tm_ctx *ctx, const int32_t *prompt, size_t n_prompt, const tm_generate_params *p, tm_token_cb cb,
                      void *user, tm_generate_result *res, tm_error *err);

/* Batch submission: every request runs through the continuous-batching scheduler together (up to
 * max_seqs at a time); callbacks are called on the calling thread as tokens come. Each request's
 * result (may be NULL) is filled when it finishes. A request refused at submission (empty prompt,
 * over the context, ...) fails the whole call before anything runs. */
typedef struct tm_request_spec {
    const int32_t *prompt;      /* (n_prompt) */
    size_t n_prompt;
    const tm_generate_params *params;
    tm_token_cb cb;             /* may be NULL */
    void *user;
    tm_generate_result *result; /* may be NULL */
} tm_request_spec;
tm_status tm_generate_batch(tm_ctx *ctx, const tm_request_spec *reqs, size_t n_reqs, tm_error *err);

/* Run a prompt and copy the logits of its last token (n_vocab floats) to out (parity tests, scoring). */
tm_status tm_prompt_logits(tm_ctx *ctx, const int32_t *prompt, size_t n_prompt, float *out, tm_error *err);

/* Print a GGUF file's metadata and tensor table (validating it first). */
tm_status tm_inspect(const char *path, bool show_tensors, void *file /* FILE* */, tm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* TOKENMILL_H */
