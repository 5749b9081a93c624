/* tm_tok.h -- tokenizers built from GGUF metadata: byte-level BPE (gpt2) and SentencePiece-style BPE (llama). */
#ifndef TM_TOK_H
#define TM_TOK_H

#include "core/tm_core.h"
#include "gguf/tm_gguf.h"

typedef struct tm_tokenizer tm_tokenizer;

typedef enum tm_tok_kind { TM_TOK_BPE_GPT2 = 0, TM_TOK_SPM = 1, TM_TOK_BYTES = 2 } tm_tok_kind;

/* A growable id vector (the encoder appends to it). */
typedef struct tm_ids {
    int32_t *ids;   /* (cap) */
    size_t n, cap;
} tm_ids;
tm_status tm_ids_push(tm_ids *v, int32_t id);
void tm_ids_free(tm_ids *v);

/* Build from tokenizer.ggml.* keys (model, pre, tokens, scores, token_type, merges, bos/eos/eot/...). */
tm_status tm_tok_load_gguf(const tm_gguf *g, tm_tokenizer **out, tm_error *err);
/* Byte-level tokenizer for dummy models: ids 0..255 are the bytes, ids >= 256 decode to "<tN>";
 * bos = n_vocab-2, eos = n_vocab-1 (n_vocab >= 260). */
tm_status tm_tok_create_bytes(int32_t n_vocab, tm_tokenizer **out, tm_error *err);
void tm_tok_free(tm_tokenizer *t);

tm_tok_kind tm_tok_kind_of(const tm_tokenizer *t);
int32_t tm_tok_n_vocab(const tm_tokenizer *t);
int32_t tm_tok_bos(const tm_tokenizer *t);   /* -1 if none */
int32_t tm_tok_eos(const tm_tokenizer *t);   /* -1 if none */
bool tm_tok_add_bos(const tm_tokenizer *t);  /* tokenizer.ggml.add_bos_token (default: SPM yes, gpt2 no) */
/* End of generation: eos, eot, eom and other end-of-turn ids found in the vocabulary. */
bool tm_tok_is_eog(const tm_tokenizer *t, int32_t id);
/* Look up a token by its exact vocabulary text; -1 if absent. */
int32_t tm_tok_find(const tm_tokenizer *t, const char *text);

/* Encode text (len bytes, need not be valid UTF-8 but invalid bytes are errors) appending to out.
 * add_bos prepends BOS when the model has one; parse_special lets special/control tokens in the text
 * (e.g. "<|im_start|>") match as single ids. */
tm_status tm_tok_encode(const tm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                        tm_ids *out, tm_error *err);

/* The bytes a token decodes to (byte-level decoding and SPM's U+2581 -> ' ' and <0xXX> applied).
 * Control tokens decode to their text only if `special` is true, otherwise to "". */
const char *tm_tok_piece(const tm_tokenizer *t, int32_t id, bool special, size_t *len);
/* Raw vocabulary text of a token. */
const char *tm_tok_text(const tm_tokenizer *t, int32_t id);

/* Decode a whole id sequence into a NUL-terminated malloc'ed string (invalid UTF-8 is kept as bytes). */
tm_status tm_tok_decode(const tm_tokenizer *t, const int32_t *ids, size_t n, bool special, char **out,
                        tm_error *err);

/* Streaming detokenizer: push ids one by one; emits only complete UTF-8 sequences, holding back a
 * partial one until it completes (or flushing it as U+FFFD on finish / when it can never complete). */
typedef struct tm_detok {
    uint8_t pending[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t n_pending;
} tm_detok;
/* Appends the text of id to out (cap bytes); returns the number of bytes written (<= cap; cap >= 64
 * plus the piece length is always enough); *need gets the required size if cap was too small. */
size_t tm_detok_push(const tm_tokenizer *t, tm_detok *st, int32_t id, bool special, char *out, size_t cap);
size_t tm_detok_finish(tm_detok *st, char *out, size_t cap);

#endif /* TM_TOK_H */
