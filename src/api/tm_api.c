/* tm_api.c -- the public C API (include/tokenmill.h) over model, tokenizer, chat templates and runner. */
#include "api/tm_api.h"
#include "tokenmill.h"

#include "engine/tm_engine.h"
#include "gguf/tm_gguf.h"
#include "model/tm_model.h"
#include "tokenizer/tm_chat.h"
#include "tokenizer/tm_tok.h"

#include <stdio.h>
#include <stdlib.h>

struct tm_ctx {
    tm_model *model;     /* owned */
    tm_engine *engine;   /* owned (holds the runner) */
};

tm_load_params tm_load_params_default(void) {
    tm_load_params p = {0};
    return p;
}

tm_status tm_load(const tm_load_params *p, tm_ctx **out, tm_error *err) {
    *out = NULL;
    tm_ctx *c = tm_calloc(1, sizeof *c);
    if (!c) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_device dev;
    int32_t ordinal;
    tm_kv_dtype kvd = TM_KV_AUTO;
    tm_status s = tm_device_parse(p->device, &dev, &ordinal, err);
    if (s == TM_OK && !tm_kv_dtype_parse(p->kv_cache_dtype, &kvd))
        s = tm_err(err, TM_ERR_INVALID, "bad KV cache type '%s' (auto, f32, f16, bf16 or fp8)", p->kv_cache_dtype);
    if (s == TM_OK) s = tm_runner_load_model(p->model, dev, p->tp, &c->model, err);
    if (s == TM_OK) {
        int32_t ms = p->max_seqs > 0 ? p->max_seqs : 1;
        tm_engine_cfg ec = {.runner = {.device = dev, .cuda_device = ordinal, .no_graphs = p->no_graphs,
                                       .n_threads = p->n_threads, .n_ctx = p->n_ctx, .max_batch_tokens = p->max_batch_tokens,
                                       .block_size = p->block_size, .n_seqs = ms, .act_bits = p->act_bits,
                                       .no_prefix_cache = p->no_prefix_cache, .kv_blocks = p->kv_blocks,
                                       .tp = p->tp, .kv_dtype = kvd},
                            .sched = {.max_seqs = ms}, .no_pipeline = p->no_pipeline};
        s = tm_engine_create(c->model, &ec, &c->engine, err);
    }
    if (s != TM_OK) {
        tm_free(c);
        return s;
    }
    *out = c;
    return TM_OK;
}

void tm_free(tm_ctx *c) {
    if (!c) return;
    tm_engine_free(c->engine);
    tm_model_free(c->model);
    free(c);
}

tm_model_info tm_get_model_info(const tm_ctx *c) {
    const tm_hparams *hp = &c->model->hp;
    tm_model_info i = {
        .name = c->model->name,
        .arch = hp->arch == TM_ARCH_QWEN2 ? "qwen2" : "llama",
        .n_vocab = hp->n_vocab, .n_ctx = c->engine->runner->cfg.n_ctx, .n_ctx_train = hp->n_ctx_train,
        .n_layers = hp->n_layers, .dim = hp->dim, .n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads,
        .head_dim = hp->head_dim, .ffn_dim = hp->ffn_dim, .weight_bytes = c->model->weight_bytes,
        .bos = tm_tok_bos(c->model->tok), .eos = tm_tok_eos(c->model->tok),
        .n_threads = c->engine->runner->cfg.n_threads, .act_bits = c->engine->runner->cfg.act_bits ? c->engine->runner->cfg.act_bits : 16,
    };
    return i;
}

tm_status tm_tokenize(tm_ctx *c, const char *text, size_t len, bool add_bos, bool parse_special, int32_t **ids,
                      size_t *n_ids, tm_error *err) {
    *ids = NULL;
    *n_ids = 0;
    tm_ids v = {0};
    bool bos = add_bos && tm_tok_add_bos(c->model->tok);
    tm_status s = tm_tok_encode(c->model->tok, text, len, bos, parse_special, &v, err);
    if (s != TM_OK) {
        tm_ids_free(&v);
        return s;
    }
    *ids = v.ids;
    *n_ids = v.n;
    return TM_OK;
}

tm_status tm_detokenize(tm_ctx *c, const int32_t *ids, size_t n_ids, bool special, char **text, tm_error *err) {
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= tm_tok_n_vocab(c->model->tok))
            return tm_err(err, TM_ERR_RANGE, "token id %d outside the vocabulary (%d)", ids[i], tm_tok_n_vocab(c->model->tok));
    return tm_tok_decode(c->model->tok, ids, n_ids, special, text, err);
}

void tm_free_buf(void *p) { free(p); }

tm_status tm_apply_chat_template(tm_ctx *c, const char *template_name, const tm_chat_message *msgs, size_t n_msgs,
                                 bool add_generation_prompt, char **out, tm_error *err) {
    *out = NULL;
    tm_chat_template tmpl = {0};
    tm_status s = TM_OK;
    if (template_name) {
        tm_chat_kind kind;
        if ((s = tm_chat_from_name(template_name, &kind, err)) != TM_OK) return s;
        tm_chat_template_init(&tmpl, kind);
    } else if (c->model->chat_template) {
        s = tm_chat_template_detect(c->model->chat_template, strlen(c->model->chat_template), &tmpl, err);
    } else {
        s = tm_err(err, TM_ERR_UNSUPPORTED, "the model has no chat template; pass one by name (--chat-template)");
    }
    if (s != TM_OK) return s;
    tm_chat_msg *m = tm_malloc_array(n_msgs, sizeof *m);
    if (!m) {
        tm_chat_template_free(&tmpl);
        return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_msgs; i++) {
        m[i].role = msgs[i].role;
        m[i].content = msgs[i].content;
    }
    s = tm_chat_template_apply(&tmpl, m, n_msgs, add_generation_prompt, out, err);
    free(m);
    tm_chat_template_free(&tmpl);
    return s;
}

tm_generate_params tm_generate_params_default(void) {
    tm_generate_params p = {
        .max_tokens = 128, .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .seed = 0, .n_logprobs = 0, .repeat_last_n = 64,
    };
    return p;
}

typedef struct gen_bridge {
    tm_token_cb cb;
    void *user;
    tm_generate_result *res;
    tm_token_logprob top[TM_MAX_LOGPROBS];
} gen_bridge;

static void fill_result(tm_generate_result *res, const tm_gen_stats *st) {
    memset(res, 0, sizeof *res);
    res->prompt_tokens = st->prompt_tokens;
    res->cached_tokens = st->cached_tokens;
    res->tokens = st->gen_tokens;
    res->ttft_ms = st->ttft_s * 1e3;
    res->prefill_tok_s = st->prefill_s > 0 ? (double)(st->prompt_tokens - st->cached_tokens) / st->prefill_s : 0.0;
    res->decode_tok_s = st->decode_s > 0 && st->gen_tokens > 1 ? (double)(st->gen_tokens - 1) / st->decode_s : 0.0;
    res->finish_reason = st->finish_reason ? st->finish_reason : "abort";
}

static bool bridge_cb(void *user, const tm_gen_event *ev) {
    gen_bridge *gb = user;
    if (ev->finish_reason && gb->res) fill_result(gb->res, ev->stats);
    if (!gb->cb) return true;
    if (ev->finish_reason && ev->text_len == 0) return true; /* the final event carries no text */
    int32_t n = ev->n_top < TM_MAX_LOGPROBS ? ev->n_top : TM_MAX_LOGPROBS;
    for (int32_t i = 0; i < n; i++) {
        gb->top[i].id = ev->top[i].id;
        gb->top[i].logprob = ev->top[i].logprob;
    }
    tm_token_event te = {ev->token, ev->text, ev->text_len, ev->chosen.logprob, gb->top, n};
    return gb->cb(gb->user, &te);
}

tm_gen_params tm_api_gen_params(const tm_generate_params *p) {
    tm_gen_params gp = {0};
    gp.sampling = tm_sampling_default();
    gp.sampling.temperature = p->temperature;
    gp.sampling.top_k = p->top_k;
    gp.sampling.top_p = p->top_p;
    gp.sampling.min_p = p->min_p;
    gp.sampling.repeat_penalty = p->repeat_penalty;
    gp.sampling.repeat_last_n = p->repeat_last_n;
    gp.sampling.presence_penalty = p->presence_penalty;
    gp.sampling.frequency_penalty = p->frequency_penalty;
    gp.sampling.seed = p->seed;
    gp.sampling.n_logprobs = p->n_logprobs;
    gp.max_tokens = p->max_tokens;
    gp.ignore_eos = p->ignore_eos;
    gp.stop = p->stop;
    gp.n_stop = p->n_stop;
    gp.priority = p->priority;
    return gp;
}

tm_status tm_generate(tm_ctx *c, const int32_t *prompt, size_t n_prompt, const tm_generate_params *p, tm_token_cb cb,
                      void *user, tm_generate_result *res, tm_error *err) {
    tm_request_spec one = {prompt, n_prompt, p, cb, user, res};
    return tm_generate_batch(c, &one, 1, err);
}

tm_status tm_generate_batch(tm_ctx *c, const tm_request_spec *reqs, size_t n_reqs, tm_error *err) {
    gen_bridge *gb = tm_calloc(n_reqs, sizeof *gb);
    if (!gb) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_status s = TM_OK;
    for (size_t i = 0; i < n_reqs && s == TM_OK; i++) {
        gb[i].cb = reqs[i].cb;
        gb[i].user = reqs[i].user;
        gb[i].res = reqs[i].result;
        if (gb[i].res) memset(gb[i].res, 0, sizeof *gb[i].res);
        tm_gen_params gp = tm_api_gen_params(reqs[i].params);
        s = tm_engine_add(c->engine, reqs[i].prompt, reqs[i].n_prompt, &gp, bridge_cb, &gb[i], NULL, err);
        if (s != TM_OK) tm_err_prefix(err, "request %zu", i);
    }
    if (s != TM_OK) tm_engine_abort_all(c->engine); /* nothing runs: the whole batch is refused */
    while (s == TM_OK && tm_engine_has_work(c->engine)) s = tm_engine_step(c->engine, err);
    if (s != TM_OK) tm_engine_abort_all(c->engine);
    free(gb);
    return s;
}

tm_status tm_prompt_logits(tm_ctx *c, const int32_t *prompt, size_t n_prompt, float *out, tm_error *err) {
    return tm_runner_prompt_logits(c->engine->runner, prompt, n_prompt, out, err);
}

tm_status tm_inspect(const char *path, bool show_tensors, void *file, tm_error *err) {
    tm_gguf *g = NULL;
    tm_status s = tm_gguf_open(path, &g, err);
    if (s != TM_OK) return s;
    tm_gguf_print(g, file, show_tensors);
    tm_gguf_close(g);
    return TM_OK;
}
