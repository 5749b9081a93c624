/* tm_chat.h -- chat templates: detect the family from tokenizer.chat_template and render messages. */
#ifndef TM_CHAT_H
#define TM_CHAT_H

#include "core/tm_core.h"

typedef enum tm_chat_kind {
    TM_CHAT_CHATML = 0, /* <|im_start|>role\n...<|im_end|>\n  (SmolLM2, Qwen2) */
    TM_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    TM_CHAT_LLAMA2,     /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
    TM_CHAT_MISTRAL,    /* [INST] ... [/INST] (system folded into the first user turn) */
    TM_CHAT_GEMMA,      /* <start_of_turn>user\n...<end_of_turn>\n (system folded into first user turn) */
    TM_CHAT_COUNT,
} tm_chat_kind;

typedef struct tm_chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} tm_chat_msg;

const char *tm_chat_name(tm_chat_kind k);                                 /* "chatml", "llama3", ... */
tm_status tm_chat_from_name(const char *name, tm_chat_kind *out, tm_error *err);
/* Detect from the Jinja source; TM_ERR_UNSUPPORTED names no family when nothing matches. */
tm_status tm_chat_detect(const char *tmpl, size_t len, tm_chat_kind *out, tm_error *err);
/* Render msgs; add_generation_prompt appends the assistant header. *out is malloc'ed, NUL-terminated.
 * bos_text (may be NULL) is prepended where the family's template includes BOS text itself. */
tm_status tm_chat_apply(tm_chat_kind k, const tm_chat_msg *msgs, size_t n, bool add_generation_prompt,
                        char **out, tm_error *err);

#endif /* TM_CHAT_H */
