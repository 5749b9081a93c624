/* tm_chat.h -- chat templates: detect the family from tokenizer.chat_template and render messages. */
#ifndef TM_CHAT_H
#define TM_CHAT_H

#include "core/tm_core.h"

/* Rendering reproduces, byte for byte, what the model's real Jinja template renders (as HF transformers'
 * apply_chat_template does), with these deliberate differences:
 *
 *  - BOS: the rendered string never starts with the BOS text ("<s>", "<|begin_of_text|>", "<bos>") that the
 *    llama2 / llama3 / mistral / gemma templates emit first. Encode it with add_bos = tm_tok_add_bos(tok)
 *    (true for these models) and parse_special = true. ChatML templates emit no BOS (SmolLM2 and Qwen2 set
 *    add_bos_token false). BOS/EOS text *inside* the conversation is rendered as text: llama2 opens every
 *    user turn after the first with "<s>", llama2 and mistral close assistant turns with "</s>".
 *  - Messages the real template rejects (raise_exception) or silently drops are errors (TM_ERR_INVALID):
 *    for llama2, mistral and gemma, a system message is allowed only first, then roles must alternate
 *    user/assistant starting with user, and there must be at least one user message. chatml and llama3
 *    accept the three roles in any order. Roles other than system/user/assistant are errors everywhere.
 *  - Gemma 1/2 and the legacy Mistral template reject a system message; it is folded into the first user
 *    turn instead, exactly as the Gemma 3 and Mistral v1 templates do ("<system>\n\n<user>").
 *  - Llama 3.1+ templates (same markers) are rendered in the Llama 3 format, without the "Cutting Knowledge
 *    Date" system preamble those templates add.
 * add_generation_prompt has no effect for llama2 and mistral: their templates end a user turn with
 * "[/INST]", after which the model answers. */
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
/* Names: chatml, llama3, llama2, mistral, gemma; anything else is TM_ERR_UNSUPPORTED listing them. */
tm_status tm_chat_from_name(const char *name, tm_chat_kind *out, tm_error *err);
/* Detect from the Jinja source; TM_ERR_UNSUPPORTED names no family when nothing matches. */
tm_status tm_chat_detect(const char *tmpl, size_t len, tm_chat_kind *out, tm_error *err);
/* Render msgs with the family's plain format (no default system prompt; mistral in the v1 format);
 * add_generation_prompt appends the assistant header. *out is malloc'ed, NUL-terminated. */
tm_status tm_chat_apply(tm_chat_kind k, const tm_chat_msg *msgs, size_t n, bool add_generation_prompt,
                        char **out, tm_error *err);

/* ---- a template with its variant details (what a model's own template needs) ------------------- */

typedef enum tm_chat_variant {
    TM_CHAT_VARIANT_NONE = 0,
    /* mistral: the pre-v1 Mistral-7B-Instruct template ("[INST] u [/INST]a</s>", no spaces around the
     * answer) that GGUF conversions of v0.1/v0.2 often carry; the default is Mistral's v1 template
     * (" [INST] u [/INST] a</s>"). Detected when the template has no "' [INST] '" literal. */
    TM_CHAT_VARIANT_MISTRAL_LEGACY,
} tm_chat_variant;

typedef struct tm_chat_template {
    tm_chat_kind kind;
    tm_chat_variant variant;
    /* chatml only: the system prompt the template inserts when the first message is not "system"
     * (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by Hugging Face"; Qwen2: "You are a
     * helpful assistant."). Found as the literal text between "<|im_start|>system\n" and "<|im_end|>" in a
     * string literal of the template (Jinja escapes \n \t \r \\ \' \" undone). NULL = none. Owned. */
    char *default_system;
} tm_chat_template;

/* Plain family format: no variant, no default system prompt (what --chat-template NAME selects). */
void tm_chat_template_init(tm_chat_template *t, tm_chat_kind kind);
/* Detect family, variant and default system prompt from the Jinja source. Detection follows llama.cpp's
 * llm_chat_detect_template: an exact family name; "<|im_start|>" -> chatml (but Phi-4's "<|im_sep|>"
 * and SmolVLM's "<end_of_utterance>" are not ChatML: unsupported); "[INST]" -> llama2 with "<<SYS>>",
 * else mistral (Mistral v3/v7 templates, with "[AVAILABLE_TOOLS]" or "[SYSTEM_PROMPT]", are unsupported);
 * "<start_of_turn>" -> gemma; "<|start_header_id|>" + "<|end_header_id|>" -> llama3. On error t is
 * left empty (safe to free). */
tm_status tm_chat_template_detect(const char *tmpl, size_t len, tm_chat_template *t, tm_error *err);
void tm_chat_template_free(tm_chat_template *t);
tm_status tm_chat_template_apply(const tm_chat_template *t, const tm_chat_msg *msgs, size_t n,
                                 bool add_generation_prompt, char **out, tm_error *err);

#endif /* TM_CHAT_H */
