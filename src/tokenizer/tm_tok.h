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

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    TM_TOKTYPE_UNDEFINED = 0, TM_TOKTYPE_NORMAL = 1, TM_TOKTYPE_UNKNOWN = 2, TM_TOKTYPE_CONTROL = 3,
    TM_TOKTYPE_USER_DEFINED = 4, TM_TOKTYPE_UNUSED = 5, TM_TOKTYPE_BYTE = 6,
};

/* A vocabulary given as arrays: what tm_tok_load_gguf reads from the file, also usable directly (tests,
 * synthetic vocabularies). Every array is copied; nothing is kept after the call. */
typedef struct tm_tok_vocab {
    const char *model;          /* "gpt2" or "llama" */
    const char *pre;            /* gpt2 pre-tokenizer name (NULL: "default", as llama.cpp) */
    int32_t n_tokens;
    const char *const *tokens;  /* (n_tokens) token texts */
    const size_t *token_lens;   /* (n_tokens) byte lengths; NULL: texts are NUL-terminated */
    const float *scores;        /* (n_tokens) or NULL (all 0) */
    const int32_t *types;       /* (n_tokens) TM_TOKTYPE_* or NULL (all NORMAL) */
    int32_t n_merges;
    const char *const *merges;  /* (n_merges) "left right" (gpt2 only) */
    const size_t *merge_lens;   /* (n_merges) or NULL: NUL-terminated */
    /* special ids: -2 = absent from the metadata (the model's default applies), -1 = none */
    int32_t bos, eos, eot, eom, unk;
    int add_bos;                /* -1 absent (default: llama yes, gpt2 per pre type), else 0/1 */
    int add_space_prefix;       /* -1 absent (default: llama yes), else 0/1 */
} tm_tok_vocab;
/* A tm_tok_vocab with every optional field set to "absent". */
tm_tok_vocab tm_tok_vocab_init(void);
tm_status tm_tok_create_from_vocab(const tm_tok_vocab *v, tm_tokenizer **out, tm_error *err);

tm_tok_kind tm_tok_kind_of(const tm_tokenizer *t);
int32_t tm_tok_n_vocab(const tm_tokenizer *t);
int32_t tm_tok_bos(const tm_tokenizer *t);   /* -1 if none */
int32_t tm_tok_eos(const tm_tokenizer *t);   /* -1 if none */
int32_t tm_tok_eot(const tm_tokenizer *t);   /* -1 if none */
/* tokenizer.ggml.add_bos_token (default: SPM yes, gpt2 no; llama3 pre types yes), and the model has a BOS */
bool tm_tok_add_bos(const tm_tokenizer *t);
/* End of generation: eos, eot, eom and other end-of-turn ids found in the vocabulary. */
bool tm_tok_is_eog(const tm_tokenizer *t, int32_t id);
/* Control or unknown token (decodes to "" unless special is requested). */
bool tm_tok_is_control(const tm_tokenizer *t, int32_t id);
/* Look up a token by its exact vocabulary text; -1 if absent. */
int32_t tm_tok_find(const tm_tokenizer *t, const char *text);
/* The pre-tokenizer in use ("smollm", "llama3", ...; "" for SPM and byte tokenizers). */
const char *tm_tok_pre_name(const tm_tokenizer *t);

/* Encode text (len bytes, need not be valid UTF-8 but invalid bytes are errors) appending to out.
 * add_bos prepends BOS when the model has one; parse_special lets special/control tokens in the text
 * (e.g. "<|im_start|>") match as single ids. User-defined tokens always match (as in llama.cpp).
 * Thread-safe: t is not modified. */
tm_status tm_tok_encode(const tm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                        tm_ids *out, tm_error *err);

/* The bytes a token decodes to (byte-level decoding and SPM's U+2581 -> ' ' and <0xXX> applied).
 * Control tokens decode to their text only if `special` is true, otherwise to "". Never NULL; *len is
 * set (0 for an id out of range). */
const char *tm_tok_piece(const tm_tokenizer *t, int32_t id, bool special, size_t *len);
/* Raw vocabulary text of a token (NULL for an id out of range). */
const char *tm_tok_text(const tm_tokenizer *t, int32_t id);

/* Decode a whole id sequence into a NUL-terminated malloc'ed string (invalid UTF-8 is kept as bytes).
 * Pieces are concatenated as they are (no space clean-up, no leading-space strip). Ids out of range are
 * an error. */
tm_status tm_tok_decode(const tm_tokenizer *t, const int32_t *ids, size_t n, bool special, char **out,
                        tm_error *err);

/* Streaming detokenizer: push ids one by one; emits only complete, valid UTF-8: a partial sequence is held
 * back until it completes; bytes that can never form a valid sequence are emitted as U+FFFD (one per
 * maximal invalid subpart), and tm_detok_finish flushes a held-back partial sequence as one U+FFFD.
 * Zero-initialise the state ({0}) before the first push. */
typedef struct tm_detok {
    uint8_t pending[8]; /* bytes of an incomplete UTF-8 sequence, (n_pending) used, at most 3 */
    size_t n_pending;
} tm_detok;
#define TM_DETOK_TOO_SMALL ((size_t)-1)
/* The exact number of bytes tm_detok_push(t, st, id, special, ...) would write now (never more than
 * 3 * (piece length + 3)). */
size_t tm_detok_bound(const tm_tokenizer *t, const tm_detok *st, int32_t id, bool special);
/* Appends the text of id to out (cap bytes) and returns the number of bytes written. When cap is below
 * tm_detok_bound(), nothing is written, the state is unchanged and TM_DETOK_TOO_SMALL is returned (callers
 * with a fixed buffer must check for it); an id out of range writes nothing and returns 0. */
size_t tm_detok_push(const tm_tokenizer *t, tm_detok *st, int32_t id, bool special, char *out, size_t cap);
/* Flushes a held-back partial sequence as U+FFFD (3 bytes; needs cap >= 3, else TM_DETOK_TOO_SMALL) and
 * resets the state. */
size_t tm_detok_finish(tm_detok *st, char *out, size_t cap);

/* ---- internal: pre-tokenizer (tm_tok_pre.c), used by tm_tok.c and the unit test ------------------ */

/* The regex list of a gpt2 pre-tokenizer type, compiled with PCRE2 (UTF + UCP, JIT when available). */
typedef struct tm_tok_pre tm_tok_pre;
typedef struct tm_tok_pre_info {
    bool known;          /* false: the name was not recognised and gpt2 was used */
    bool ignore_merges;  /* a whole word that is a token is emitted as is (llama3 family) */
    int add_bos;         /* default add_bos of this type: -1 none (model default), 0, 1 */
    bool bos_none;       /* the type has no default BOS (chatglm) */
} tm_tok_pre_info;
/* name NULL or "" selects "default". */
tm_status tm_tok_pre_create(const char *name, tm_tok_pre **out, tm_tok_pre_info *info, tm_error *err);
void tm_tok_pre_free(tm_tok_pre *p);
const char *tm_tok_pre_canonical(const tm_tok_pre *p);

/* A byte span of the text being split. */
typedef struct tm_tok_span {
    size_t off, len;
} tm_tok_span;
/* Per-call scratch of the splitter (match data, span lists); reused across calls, freed with _free. */
typedef struct tm_tok_pre_work {
    void *md;            /* pcre2_match_data_8 * */
    tm_tok_span *a, *b;  /* (cap_a), (cap_b) span lists */
    size_t cap_a, cap_b;
} tm_tok_pre_work;
void tm_tok_pre_work_free(tm_tok_pre_work *w);
/* Split text[0..len) (valid UTF-8) by the regex list: each regex splits the pieces of the previous one
 * into matches and the unmatched gaps between them, as llama.cpp's unicode_regex_split does.
 * On success *spans points into w (valid until the next call) and *n_spans is set. */
tm_status tm_tok_pre_split(const tm_tok_pre *p, tm_tok_pre_work *w, const char *text, size_t len,
                           const tm_tok_span **spans, size_t *n_spans, tm_error *err);

/* Validate UTF-8 (no overlongs, surrogates or code points above U+10FFFF). Returns true when valid;
 * otherwise *bad_at gets the offset of the first invalid byte. */
bool tm_tok_utf8_valid(const char *s, size_t len, size_t *bad_at);

#endif /* TM_TOK_H */
