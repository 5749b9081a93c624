/* tm_chat.c -- chat templates: detect the family from tokenizer.chat_template and render messages. */
#include "tokenizer/tm_chat.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const k_names[TM_CHAT_COUNT] = {"chatml", "llama3", "llama2", "mistral", "gemma"};
#define TM_CHAT_KNOWN "chatml, llama3, llama2, mistral, gemma"

const char *tm_chat_name(tm_chat_kind k) { return (unsigned)k < TM_CHAT_COUNT ? k_names[k] : "unknown"; }

tm_status tm_chat_from_name(const char *name, tm_chat_kind *out, tm_error *err) {
    for (int k = 0; name && k < TM_CHAT_COUNT; k++)
        if (strcmp(name, k_names[k]) == 0) {
            *out = (tm_chat_kind)k;
            return TM_OK;
        }
    return tm_err(err, TM_ERR_UNSUPPORTED, "unknown chat template '%.64s' (known: " TM_CHAT_KNOWN ")",
                  name ? name : "(null)");
}

/* ---- detection ---------------------------------------------------------------------------------- */

static bool has(const char *t, size_t len, const char *needle) {
    return memmem(t, len, needle, strlen(needle)) != NULL;
}

/* Undo the Jinja/Python string escapes a literal may carry (\n \t \r \\ \' \"); others stay as written. */
static char *unescape(const char *s, size_t n) {
    char *o = tm_malloc(n + 1);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[i + 1], r = 0;
            switch (c) {
            case 'n': r = '\n'; break;
            case 't': r = '\t'; break;
            case 'r': r = '\r'; break;
            case '\\': r = '\\'; break;
            case '\'': r = '\''; break;
            case '"': r = '"'; break;
            default: break;
            }
            if (r) {
                o[j++] = r;
                i++;
                continue;
            }
        }
        o[j++] = s[i];
    }
    o[j] = '\0';
    return o;
}

/* A ChatML default system prompt: literal text right after "<|im_start|>system" + newline (a real one or
 * the escape \n) up to "<|im_end|>", inside one string literal (no unescaped quote or template
 * delimiter in between). *out = NULL when the template has none. */
static tm_status find_default_system(const char *t, size_t len, char **out, tm_error *err) {
    static const char open[] = "<|im_start|>system", close[] = "<|im_end|>";
    const char *end = t + len, *p = t;
    *out = NULL;
    while (p < end && (p = memmem(p, (size_t)(end - p), open, sizeof open - 1)) != NULL) {
        const char *q = p + sizeof open - 1;
        p = q;
        if (q < end && *q == '\n')
            q++;
        else if (end - q >= 2 && q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *e = memmem(q, (size_t)(end - q), close, sizeof close - 1);
        if (!e || e == q) continue;
        bool literal = true;
        for (const char *c = q; c < e && literal; c++) {
            if (*c == '\\') {
                c++; /* an escaped character, quotes included, is part of the literal */
                continue;
            }
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}') literal = false;
        }
        if (!literal) continue;
        *out = unescape(q, (size_t)(e - q));
        if (!*out) return tm_err(err, TM_ERR_NOMEM, "chat template: out of memory");
        return TM_OK;
    }
    return TM_OK;
}

void tm_chat_template_init(tm_chat_template *t, tm_chat_kind kind) {
    t->kind = kind;
    t->variant = TM_CHAT_VARIANT_NONE;
    t->default_system = NULL;
}

void tm_chat_template_free(tm_chat_template *t) {
    if (!t) return;
    free(t->default_system);
    t->default_system = NULL;
}

tm_status tm_chat_template_detect(const char *tmpl, size_t len, tm_chat_template *t, tm_error *err) {
    tm_chat_template_init(t, TM_CHAT_CHATML);
    if (!tmpl || len == 0) return tm_err(err, TM_ERR_UNSUPPORTED, "empty chat template (known: " TM_CHAT_KNOWN ")");
    for (int k = 0; k < TM_CHAT_COUNT; k++) /* the template text may be a family name */
        if (len == strlen(k_names[k]) && memcmp(tmpl, k_names[k], len) == 0) {
            t->kind = (tm_chat_kind)k;
            return TM_OK;
        }
    if (has(tmpl, len, "<|im_start|>")) {
        if (has(tmpl, len, "<|im_sep|>"))
            return tm_err(err, TM_ERR_UNSUPPORTED,
                          "chat template uses <|im_sep|> (Phi-4), which is not ChatML; pass --chat-template NAME "
                          "(known: " TM_CHAT_KNOWN ")");
        if (has(tmpl, len, "<end_of_utterance>"))
            return tm_err(err, TM_ERR_UNSUPPORTED,
                          "chat template uses <end_of_utterance> (SmolVLM), which is not ChatML; pass "
                          "--chat-template NAME (known: " TM_CHAT_KNOWN ")");
        t->kind = TM_CHAT_CHATML;
        return find_default_system(tmpl, len, &t->default_system, err);
    }
    if ((len >= 7 && memcmp(tmpl, "mistral", 7) == 0) || has(tmpl, len, "[INST]")) {
        if (has(tmpl, len, "<<SYS>>")) {
            t->kind = TM_CHAT_LLAMA2;
            return TM_OK;
        }
        if (has(tmpl, len, "[SYSTEM_PROMPT]") || has(tmpl, len, "[AVAILABLE_TOOLS]"))
            return tm_err(err, TM_ERR_UNSUPPORTED,
                          "Mistral v3/v7 chat templates ([AVAILABLE_TOOLS]/[SYSTEM_PROMPT]) are not supported; "
                          "--chat-template mistral forces the v1 format");
        t->kind = TM_CHAT_MISTRAL;
        if (!has(tmpl, len, "' [INST] '") && !has(tmpl, len, "\" [INST] \""))
            t->variant = TM_CHAT_VARIANT_MISTRAL_LEGACY;
        return TM_OK;
    }
    if (has(tmpl, len, "<start_of_turn>")) {
        t->kind = TM_CHAT_GEMMA;
        return TM_OK;
    }
    if (has(tmpl, len, "<|start_header_id|>") && has(tmpl, len, "<|end_header_id|>")) {
        t->kind = TM_CHAT_LLAMA3;
        return TM_OK;
    }
    return tm_err(err, TM_ERR_UNSUPPORTED,
                  "unrecognised chat template (known: " TM_CHAT_KNOWN "); pass --chat-template NAME");
}

tm_status tm_chat_detect(const char *tmpl, size_t len, tm_chat_kind *out, tm_error *err) {
    tm_chat_template t;
    tm_status s = tm_chat_template_detect(tmpl, len, &t, err);
    if (s == TM_OK) *out = t.kind;
    tm_chat_template_free(&t);
    return s;
}

/* ---- a growable output string ------------------------------------------------------------------- */

typedef struct sbuf {
    char *buf;  // (cap) bytes, NUL-terminated at len when not failed
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (n > SIZE_MAX - b->len - 1) {
        b->failed = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->failed = true;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Byte length of the Python str.isspace() code point starting at s (n bytes available), 0 if none.
 * Python's (and so Jinja's trim and str.strip()) whitespace: \t \n \v \f \r, \x1c-\x1f, space, U+0085,
 * U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
static size_t py_space_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (n < 2) return 0;
    if (c == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    if (c == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;
    if (c == 0xe2 && s[1] == 0x80 && ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;
    if (c == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;
    if (c == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

/* Python's str.strip() applied to buf[start..len), in place. */
static void sb_strip_from(sbuf *b, size_t start) {
    if (b->failed) return;
    const unsigned char *s = (const unsigned char *)b->buf;
    size_t lo = start, hi = b->len, k;
    while (lo < hi && (k = py_space_len(s + lo, hi - lo)) > 0) lo += k;
    while (hi > lo) {
        size_t cut = 0;
        for (size_t w = 1; w <= 3 && w <= hi - lo; w++)
            if (py_space_len(s + hi - w, w) == w) {
                cut = w;
                break;
            }
        if (!cut) break;
        hi -= cut;
    }
    memmove(b->buf + start, b->buf + lo, hi - lo);
    b->len = start + (hi - lo);
    b->buf[b->len] = '\0';
}

/* Append s, then strip what was appended. */
static void sb_put_stripped(sbuf *b, const char *s) {
    size_t start = b->len;
    sb_puts(b, s);
    sb_strip_from(b, start);
}

/* ---- rendering ---------------------------------------------------------------------------------- */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int role_of(const char *r) {
    if (!r) return -1;
    if (strcmp(r, "system") == 0) return ROLE_SYSTEM;
    if (strcmp(r, "user") == 0) return ROLE_USER;
    if (strcmp(r, "assistant") == 0) return ROLE_ASSISTANT;
    return -1;
}

static tm_status check_messages(tm_chat_kind k, const tm_chat_msg *msgs, size_t n, tm_error *err) {
    if (!msgs || n == 0) return tm_err(err, TM_ERR_INVALID, "chat: the message list is empty");
    for (size_t i = 0; i < n; i++) {
        if (role_of(msgs[i].role) < 0)
            return tm_err(err, TM_ERR_INVALID, "chat: message %zu has role '%.32s' (expected system, user or assistant)",
                          i, msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content) return tm_err(err, TM_ERR_INVALID, "chat: message %zu has no content", i);
    }
    if (k == TM_CHAT_CHATML || k == TM_CHAT_LLAMA3) return TM_OK;
    /* llama2, mistral, gemma: optional system first, then user/assistant alternating from user */
    size_t i0 = role_of(msgs[0].role) == ROLE_SYSTEM ? 1 : 0;
    if (i0 == n)
        return tm_err(err, TM_ERR_INVALID, "chat: the %s template needs a user message after the system message",
                      tm_chat_name(k));
    for (size_t i = i0; i < n; i++) {
        int r = role_of(msgs[i].role), want = (i - i0) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        if (r == ROLE_SYSTEM)
            return tm_err(err, TM_ERR_INVALID,
                          "chat: message %zu: the %s template accepts a system message only as the first message", i,
                          tm_chat_name(k));
        if (r != want)
            return tm_err(err, TM_ERR_INVALID,
                          "chat: message %zu: the %s template needs roles alternating user/assistant after the "
                          "optional system message, starting with user (got '%s')",
                          i, tm_chat_name(k), msgs[i].role);
    }
    return TM_OK;
}

static void render_chatml(sbuf *b, const tm_chat_template *t, const tm_chat_msg *m, size_t n, bool gen) {
    if (t->default_system && role_of(m[0].role) != ROLE_SYSTEM) {
        sb_puts(b, "<|im_start|>system\n");
        sb_puts(b, t->default_system);
        sb_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|im_start|>");
        sb_puts(b, m[i].role);
        sb_puts(b, "\n");
        sb_puts(b, m[i].content);
        sb_puts(b, "<|im_end|>\n");
    }
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
}

static void render_llama3(sbuf *b, const tm_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|start_header_id|>");
        sb_puts(b, m[i].role);
        sb_puts(b, "<|end_header_id|>\n\n");
        sb_put_stripped(b, m[i].content);
        sb_puts(b, "<|eot_id|>");
    }
    if (gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_llama2(sbuf *b, const tm_chat_msg *m, size_t n) {
    size_t i0 = role_of(m[0].role) == ROLE_SYSTEM ? 1 : 0;
    for (size_t i = i0; i < n; i++) {
        if (role_of(m[i].role) == ROLE_USER) {
            if (i > i0) sb_puts(b, "<s>"); /* the first BOS is the tokenizer's */
            sb_puts(b, "[INST] ");
            size_t start = b->len; /* the template strips system block + content as one string */
            if (i == i0 && i0 == 1) {
                sb_puts(b, "<<SYS>>\n");
                sb_puts(b, m[0].content);
                sb_puts(b, "\n<</SYS>>\n\n");
            }
            sb_puts(b, m[i].content);
            sb_strip_from(b, start);
            sb_puts(b, " [/INST]");
        } else {
            sb_puts(b, " ");
            sb_put_stripped(b, m[i].content);
            sb_puts(b, " </s>");
        }
    }
}

static void render_mistral(sbuf *b, const tm_chat_msg *m, size_t n, bool legacy) {
    size_t i0 = role_of(m[0].role) == ROLE_SYSTEM ? 1 : 0;
    for (size_t i = i0; i < n; i++) {
        if (role_of(m[i].role) == ROLE_USER) {
            sb_puts(b, legacy ? "[INST] " : " [INST] ");
            if (i == i0 && i0 == 1) {
                sb_puts(b, m[0].content);
                sb_puts(b, "\n\n");
            }
            sb_puts(b, m[i].content);
            sb_puts(b, " [/INST]");
        } else {
            if (!legacy) sb_puts(b, " ");
            sb_puts(b, m[i].content);
            sb_puts(b, "</s>");
        }
    }
}

static void render_gemma(sbuf *b, const tm_chat_msg *m, size_t n, bool gen) {
    size_t i0 = role_of(m[0].role) == ROLE_SYSTEM ? 1 : 0;
    for (size_t i = i0; i < n; i++) {
        sb_puts(b, role_of(m[i].role) == ROLE_USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == i0 && i0 == 1) { /* Gemma 3: the system text, untrimmed, opens the first user turn */
            sb_puts(b, m[0].content);
            sb_puts(b, "\n\n");
        }
        sb_put_stripped(b, m[i].content);
        sb_puts(b, "<end_of_turn>\n");
    }
    if (gen) sb_puts(b, "<start_of_turn>model\n");
}

tm_status tm_chat_template_apply(const tm_chat_template *t, const tm_chat_msg *msgs, size_t n,
                                 bool add_generation_prompt, char **out, tm_error *err) {
    if (!out) return tm_err(err, TM_ERR_INVALID, "chat: out is NULL");
    *out = NULL;
    if (!t || (unsigned)t->kind >= TM_CHAT_COUNT) return tm_err(err, TM_ERR_INVALID, "chat: invalid template");
    tm_status s = check_messages(t->kind, msgs, n, err);
    if (s != TM_OK) return s;
    sbuf b = {0};
    sb_put(&b, "", 0);
    switch (t->kind) {
    case TM_CHAT_CHATML: render_chatml(&b, t, msgs, n, add_generation_prompt); break;
    case TM_CHAT_LLAMA3: render_llama3(&b, msgs, n, add_generation_prompt); break;
    case TM_CHAT_LLAMA2: render_llama2(&b, msgs, n); break;
    case TM_CHAT_MISTRAL: render_mistral(&b, msgs, n, t->variant == TM_CHAT_VARIANT_MISTRAL_LEGACY); break;
    case TM_CHAT_GEMMA: render_gemma(&b, msgs, n, add_generation_prompt); break;
    default: break;
    }
    if (b.failed) {
        free(b.buf);
        return tm_err(err, TM_ERR_NOMEM, "chat: out of memory rendering %zu messages", n);
    }
    *out = b.buf;
    return TM_OK;
}

tm_status tm_chat_apply(tm_chat_kind k, const tm_chat_msg *msgs, size_t n, bool add_generation_prompt,
                        char **out, tm_error *err) {
    tm_chat_template t;
    tm_chat_template_init(&t, k);
    return tm_chat_template_apply(&t, msgs, n, add_generation_prompt, out, err);
}
