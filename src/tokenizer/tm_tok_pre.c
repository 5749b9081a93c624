/* tm_tok_pre.c -- gpt2-style pre-tokenizers: llama.cpp's per-type regex lists, run through PCRE2. */
#include "tokenizer/tm_tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>

/*
 * How these regexes relate to llama.cpp (src/llama-vocab.cpp, src/unicode.cpp):
 *
 * llama.cpp keeps, per `tokenizer.ggml.pre` type, a list of regexes; each one splits every fragment left by
 * the previous one into its matches and the unmatched gaps between them (unicode_regex_split). Common
 * regexes run through hand-written matchers (gpt2, llama3, qwen2), the rest through std::regex on a text
 * where every code point is "collapsed" to one byte standing for its Unicode category. Its notion of a
 * category comes from its own Unicode 15.1 table, and `\s` means exactly the White_Space set below.
 *
 * To get the same fragments from PCRE2 (10.42 ships Unicode 14 tables, and its UCP `\s` also matches
 * U+180E), the regexes below are the llama.cpp ones rewritten with explicit classes:
 *   - WS: the White_Space set used by llama.cpp (its `\s`); `\S` becomes [^WS];
 *   - L, N, P, S: PCRE2's \p{..} plus the code points that Unicode 15.0/15.1 added to that category
 *     (found by comparing PCRE2 10.42 against llama.cpp's table code point by code point; all differences
 *     were in that direction, so the additions are harmless with a newer PCRE2);
 *   - the gpt2 regex gets llama.cpp's implicit trailing `|\s+` (its hand-written matcher has it);
 *   - llama3/qwen2 contractions are spelled case by case, as in llama.cpp's adapted regex;
 *   - regexes that llama.cpp runs through std::wregex see non-ASCII white space replaced by U+000B, so
 *     their literal code point classes never match white space: those classes are written with the WS code
 *     points removed (deepseek);
 *   - `$` only matches at the very end of a fragment (PCRE2_DOLLAR_ENDONLY), as in ECMAScript.
 */

/* llama.cpp's White_Space set (unicode_set_whitespace), for use inside a class. */
#define WS                                                                                                 \
    "\\t\\n\\x0B\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
    "\\x{3000}"
/* \p{L} plus the letters added in Unicode 15.0/15.1. */
#define LX                                                                                                 \
    "\\p{L}\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"              \
    "\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}" \
    "\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
/* \p{N} plus the numbers added in Unicode 15.0. */
#define NX "\\p{N}\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
/* \p{P} plus the punctuation added in Unicode 15.0. */
#define PX "\\p{P}\\x{11B00}-\\x{11B09}\\x{11F43}-\\x{11F4F}"

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
#define RE_GPT2                                                                                        \
    "'s|'t|'re|'ve|'m|'ll|'d| ?[" LX "]+| ?[" NX "]+| ?[^" WS LX NX "]+|[" WS "]+(?![^" WS "])|[" WS \
    "]+"
#define RE_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
#define RE_LLAMA3_WITH(num)                                                                                 \
    RE_CONTRACTIONS_CI "|[^\\r\\n" LX NX "]?[" LX "]+|[" NX "]" num "| ?[^" WS LX NX "]+[\\r\\n]*|[" WS \
    "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
/* [\p{P}\$\+<=>\^~\|]+ */
#define RE_PUNCT_RUN "[" PX "$+<=>^~|]+"
/* CJK and related ranges of deepseek ([一-龥ࠀ-一가-퟿]+) less the white space code points in them. */
#define RE_DEEPSEEK_CJK                                                                              \
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}" \
    "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

static const char *const re_gpt2[] = {RE_GPT2};
static const char *const re_default[] = {RE_PUNCT_RUN, RE_GPT2, "[" NX "]+", "[0-9][0-9][0-9]"};
static const char *const re_falcon[] = {RE_PUNCT_RUN, RE_GPT2, "[0-9][0-9][0-9]"};
static const char *const re_llama3[] = {RE_LLAMA3_WITH("{1,3}")};
static const char *const re_qwen2[] = {RE_LLAMA3_WITH("")};
static const char *const re_smollm[] = {"[" NX "]", RE_GPT2};
static const char *const re_deepseek_coder[] = {
    "[\\r\\n]",
    "[" WS "]?[" LX "]+",
    "[" WS "]?[" PX "]+",
    RE_DEEPSEEK_CJK,
    "[" NX "]",
};
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    "[" WS "]?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+",
    "[" WS "]?[\\x{21}-\\x{2F}\\x{3A}-\\x{7E}\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
    "\\x{3001}-\\x{3002}]+",
    "[" WS "]+$",
    RE_DEEPSEEK_CJK,
    "[" NX "]+",
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct pre_type {
    const char *canon;            /* name reported by tm_tok_pre_canonical */
    const char *names;            /* accepted tokenizer.ggml.pre values, '|'-separated */
    const char *const *regexes;   /* (n_regexes) */
    size_t n_regexes;
    bool ignore_merges;
    int add_bos;                  /* -1: model default */
    bool bos_none;
} pre_type;

/* Names as mapped by llama.cpp's llama_vocab::impl::load. */
static const pre_type pre_types[] = {
    {"default", "default", re_default, N_OF(re_default), false, -1, false},
    {"llama3", "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", re_llama3,
     N_OF(re_llama3), true, 1, false},
    {"dbrx", "dbrx|smaug-bpe", re_llama3, N_OF(re_llama3), false, -1, false},
    {"chatglm-bpe", "chatglm-bpe", re_llama3, N_OF(re_llama3), false, -1, true},
    {"glm4", "glm4|glm5", re_llama3, N_OF(re_llama3), true, -1, true},
    {"deepseek-llm", "deepseek-llm", re_deepseek_llm, N_OF(re_deepseek_llm), false, -1, false},
    {"deepseek-coder", "deepseek-coder", re_deepseek_coder, N_OF(re_deepseek_coder), false, -1, false},
    {"falcon", "falcon", re_falcon, N_OF(re_falcon), false, -1, false},
    {"smollm", "smollm|starcoder|refact|command-r|codeshell|exaone|minerva-7b|mellum2", re_smollm,
     N_OF(re_smollm), false, -1, false},
    {"gpt2",
     "gpt-2|gpt2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|mpt|olmo|jais|"
     "trillion|granite-docling|exaone4|jina-v1-en|jina-v2-code|roberta-bpe",
     re_gpt2, N_OF(re_gpt2), false, -1, false},
    {"qwen2", "qwen2|deepseek-r1-qwen|kormo|f2llmv2|stablelm2|hunyuan|solar-open|megrez", re_qwen2,
     N_OF(re_qwen2), false, -1, false},
};

struct tm_tok_pre {
    const pre_type *type;
    pcre2_code *re[8];  /* (type->n_regexes) compiled, JIT'ed where available */
    size_t n_re;
};

static bool name_in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    const char *p = list;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

void tm_tok_pre_free(tm_tok_pre *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p);
}

const char *tm_tok_pre_canonical(const tm_tok_pre *p) { return p ? p->type->canon : ""; }

tm_status tm_tok_pre_create(const char *name, tm_tok_pre **out, tm_tok_pre_info *info, tm_error *err) {
    *out = NULL;
    const pre_type *type = NULL;
    bool known = true;
    if (!name || !name[0]) name = "default";
    for (size_t i = 0; i < N_OF(pre_types) && !type; i++)
        if (name_in_list(pre_types[i].names, name)) type = &pre_types[i];
    if (!type) {
        known = false;
        for (size_t i = 0; i < N_OF(pre_types) && !type; i++)
            if (strcmp(pre_types[i].canon, "gpt2") == 0) type = &pre_types[i];
        if (!type) return tm_err(err, TM_ERR_INTERNAL, "pre-tokenizer table has no gpt2 entry");
    }
    tm_tok_pre *p = calloc(1, sizeof *p);
    if (!p) return tm_err(err, TM_ERR_NOMEM, "out of memory for the pre-tokenizer");
    p->type = type;
    if (type->n_regexes > N_OF(p->re)) {
        free(p);
        return tm_err(err, TM_ERR_INTERNAL, "pre-tokenizer '%s' has too many regexes", type->canon);
    }
    for (size_t i = 0; i < type->n_regexes; i++) {
        int ecode = 0;
        PCRE2_SIZE eoff = 0;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)type->regexes[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK, &ecode,
                                       &eoff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ecode, msg, sizeof msg);
            tm_tok_pre_free(p);
            return tm_err(err, TM_ERR_INTERNAL, "pre-tokenizer '%s' regex %zu: %s at offset %zu", type->canon, i,
                          (const char *)msg, (size_t)eoff);
        }
        p->re[p->n_re++] = re;
        /* JIT is an optimisation only: the interpreter gives the same matches where it is unavailable. */
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    }
    if (info) {
        info->known = known;
        info->ignore_merges = type->ignore_merges;
        info->add_bos = type->add_bos;
        info->bos_none = type->bos_none;
    }
    *out = p;
    return TM_OK;
}

void tm_tok_pre_work_free(tm_tok_pre_work *w) {
    if (!w) return;
    pcre2_match_data_free((pcre2_match_data *)w->md);
    free(w->a);
    free(w->b);
    memset(w, 0, sizeof *w);
}

static bool span_push(tm_tok_span **v, size_t *n, size_t *cap, size_t off, size_t len) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        tm_tok_span *nv = tm_malloc_array(nc, sizeof *nv);
        if (!nv) return false;
        if (*n) memcpy(nv, *v, *n * sizeof *nv);
        free(*v);
        *v = nv;
        *cap = nc;
    }
    (*v)[*n].off = off;
    (*v)[*n].len = len;
    (*n)++;
    return true;
}

static size_t utf8_char_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xF0) return 4;
    if (c >= 0xE0) return 3;
    return 2;
}

tm_status tm_tok_pre_split(const tm_tok_pre *p, tm_tok_pre_work *w, const char *text, size_t len,
                           const tm_tok_span **spans, size_t *n_spans, tm_error *err) {
    *spans = NULL;
    *n_spans = 0;
    if (!w->md) {
        w->md = pcre2_match_data_create(1, NULL);
        if (!w->md) return tm_err(err, TM_ERR_NOMEM, "out of memory for regex match data");
    }
    pcre2_match_data *md = (pcre2_match_data *)w->md;
    size_t n_cur = 0;
    if (len > 0 && !span_push(&w->a, &n_cur, &w->cap_a, 0, len))
        return tm_err(err, TM_ERR_NOMEM, "out of memory splitting text");
    tm_tok_span **cur = &w->a, **nxt = &w->b;
    size_t *cap_cur = &w->cap_a, *cap_nxt = &w->cap_b;
    for (size_t r = 0; r < p->n_re; r++) {
        size_t n_nxt = 0;
        for (size_t s = 0; s < n_cur; s++) {
            const size_t base = (*cur)[s].off, slen = (*cur)[s].len;
            const PCRE2_SPTR subj = (PCRE2_SPTR)(text + base);
            size_t pos = 0, last = 0;
            while (pos < slen) {
                int rc = pcre2_match(p->re[r], subj, slen, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[256];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    return tm_err(err, TM_ERR_INTERNAL, "pre-tokenizer '%s' regex %zu failed: %s", p->type->canon,
                                  r, (const char *)msg);
                }
                const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = ov[0], me = ov[1];
                if (me <= ms || ms < pos || me > slen) { /* empty match: step over one character */
                    pos += utf8_char_len((unsigned char)text[base + pos]);
                    continue;
                }
                if (ms > last && !span_push(nxt, &n_nxt, cap_nxt, base + last, ms - last))
                    return tm_err(err, TM_ERR_NOMEM, "out of memory splitting text");
                if (!span_push(nxt, &n_nxt, cap_nxt, base + ms, me - ms))
                    return tm_err(err, TM_ERR_NOMEM, "out of memory splitting text");
                last = pos = me;
            }
            if (last < slen && !span_push(nxt, &n_nxt, cap_nxt, base + last, slen - last))
                return tm_err(err, TM_ERR_NOMEM, "out of memory splitting text");
        }
        tm_tok_span **ts = cur;
        cur = nxt;
        nxt = ts;
        size_t *tc = cap_cur;
        cap_cur = cap_nxt;
        cap_nxt = tc;
        n_cur = n_nxt;
    }
    *spans = *cur;
    *n_spans = n_cur;
    return TM_OK;
}
