/* tm_tok.c -- vocabulary, BPE/SPM encoders, special tokens, pieces and streaming detokenization. */
#include "tokenizer/tm_tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/*
 * The encoders follow llama.cpp (src/llama-vocab.cpp) step by step, so that ids match it exactly:
 *   - special tokens (CONTROL / USER_DEFINED / UNKNOWN) are cut out of the text first, longest text first,
 *     each token claiming all its left-to-right occurrences in the still-raw fragments; CONTROL and UNKNOWN
 *     ones only with parse_special, USER_DEFINED ones always;
 *   - gpt2: the pre-tokenizer regex list (tm_tok_pre.c) splits each raw fragment into words; each word is
 *     byte-level encoded and merged pairwise by merge rank (lowest first, leftmost on ties); a final
 *     symbol that is not a token falls back to its encoded characters' bytes looked up one by one;
 *   - llama (SPM): the fragment gets a leading space when add_space_prefix is set and the previous fragment
 *     was a special token (or it is the first), spaces become U+2581, characters are merged pairwise by the
 *     score of the merged token (highest first, leftmost on ties), leftovers become <0xXX> byte tokens.
 * Merges are looked up on interned string ids (pair -> rank, result) rather than on strings, which gives
 * the same result as llama.cpp's string-pair map: every merge side and result is interned at load time.
 */

/* llama.cpp token attributes (llama_token_attr). */
enum {
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
};

#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_MERGES (1 << 24)
#define TOK_MAX_TEXT (1u << 20)

struct tm_tokenizer {
    tm_tok_kind kind;
    int32_t n_vocab;
    /* string table: ids < n_vocab are the vocabulary, ids >= n_vocab strings interned from merges */
    int32_t n_strs, cap_strs;
    char *pool;              /* (pool_cap) bytes, pool_len used: every string, NUL-terminated */
    size_t pool_len, pool_cap;
    size_t *str_off;         /* (cap_strs) offset of each string in pool */
    uint32_t *str_len;       /* (cap_strs) */
    int32_t *hslots;         /* (hcap) string id or -1; text -> id, last duplicate wins (as llama.cpp) */
    size_t hcap;
    float *scores;           /* (n_vocab) */
    uint16_t *attr;          /* (n_vocab) ATTR_* bits */
    uint8_t *eog;            /* (n_vocab) 1 = end of generation */
    char *ppool;             /* (ppool_len) decoded pieces (special = true), NUL-separated */
    size_t ppool_len;
    size_t *poff;            /* (n_vocab) */
    uint32_t *plen;          /* (n_vocab) */
    /* merges: open addressing on (left id << 32 | right id) */
    uint64_t *mkey;          /* (mcap), UINT64_MAX = empty */
    int32_t *mrank;          /* (mcap) */
    int32_t *mres;           /* (mcap) string id of left+right */
    size_t mcap;
    int32_t n_merges;
    int32_t *special;        /* (n_special) special token ids, longest text first */
    int32_t n_special;
    /* trie over the special texts, to find which of them occur in a text in one pass */
    uint64_t *tkey;          /* (tcap) (node << 8 | byte) + 1, 0 = empty */
    int32_t *tchild;         /* (tcap) child node */
    size_t tcap;
    int32_t *tterm;          /* (n_tnodes) index into special[] of the text ending at the node, or -1 */
    int32_t n_tnodes;
    int32_t byte_sym[256];   /* gpt2: string id of the byte's GPT-2 character, -1 if none */
    int32_t byte_fb[256][2]; /* gpt2: token of each UTF-8 byte of that character as a 1-byte string, -1 */
    uint8_t byte_enc[256][2];
    uint8_t byte_enc_len[256];
    int32_t spm_byte[256];   /* llama: <0xXX> token (or the 1-byte token), -1 if none */
    int32_t bos, eos, eot, eom, unk;
    bool add_bos, add_space_prefix, ignore_merges;
    tm_tok_pre *pre;
};

/* ---- small helpers ------------------------------------------------------------------------------ */

tm_status tm_ids_push(tm_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        if (nc < v->cap) return TM_ERR_NOMEM;
        int32_t *p = realloc(v->ids, nc * sizeof *p);
        if (!p) return TM_ERR_NOMEM;
        v->ids = p;
        v->cap = nc;
    }
    v->ids[v->n++] = id;
    return TM_OK;
}

void tm_ids_free(tm_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

bool tm_tok_utf8_valid(const char *s, size_t len, size_t *bad_at) {
    const uint8_t *b = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        uint8_t c = b[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else {
            if (bad_at) *bad_at = i;
            return false;
        }
        if (len - i <= need) {
            if (bad_at) *bad_at = i;
            return false;
        }
        if (b[i + 1] < lo || b[i + 1] > hi) {
            if (bad_at) *bad_at = i;
            return false;
        }
        for (size_t k = 2; k <= need; k++) {
            if ((b[i + k] & 0xC0) != 0x80) {
                if (bad_at) *bad_at = i;
                return false;
            }
        }
        i += need + 1;
    }
    return true;
}

/* llama.cpp's lenient decoder (unicode_cpt_from_utf8 + fallback): returns the code point, advances *i. */
static uint32_t utf8_next_lenient(const uint8_t *b, size_t n, size_t *i) {
    size_t o = *i;
    uint8_t c = b[o];
    if (!(c & 0x80)) {
        *i = o + 1;
        return c;
    }
    if ((c & 0x40) && !(c & 0x20)) {
        if (o + 1 < n && (b[o + 1] & 0xC0) == 0x80) {
            *i = o + 2;
            return ((uint32_t)(c & 0x1F) << 6) | (b[o + 1] & 0x3F);
        }
    } else if ((c & 0x40) && !(c & 0x10)) {
        if (o + 2 < n && (b[o + 1] & 0xC0) == 0x80 && (b[o + 2] & 0xC0) == 0x80) {
            *i = o + 3;
            return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(b[o + 1] & 0x3F) << 6) | (b[o + 2] & 0x3F);
        }
    } else if ((c & 0x40) && !(c & 0x08)) {
        if (o + 3 < n && (b[o + 1] & 0xC0) == 0x80 && (b[o + 2] & 0xC0) == 0x80 && (b[o + 3] & 0xC0) == 0x80) {
            *i = o + 4;
            return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(b[o + 1] & 0x3F) << 12) |
                   ((uint32_t)(b[o + 2] & 0x3F) << 6) | (b[o + 3] & 0x3F);
        }
    }
    *i = o + 1;
    return 0xFFFD;
}

static size_t utf8_put(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 bytes <-> unicode: printable bytes map to themselves, the others to U+0100 + n in byte order. */
static uint32_t gpt2_byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 256u + (uint32_t)n;
}

/* ---- string table --------------------------------------------------------------------------------- */

static int32_t str_lookup(const tm_tokenizer *t, const char *s, size_t n) {
    if (!t->hcap) return -1;
    size_t mask = t->hcap - 1, i = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        int32_t id = t->hslots[i];
        if (id < 0) return -1;
        if (t->str_len[id] == n && memcmp(t->pool + t->str_off[id], s, n) == 0) return id;
        i = (i + 1) & mask;
    }
}

/* Vocabulary token with this exact text, or -1. */
static int32_t tok_lookup(const tm_tokenizer *t, const char *s, size_t n) {
    int32_t id = str_lookup(t, s, n);
    return id < t->n_vocab ? id : -1;
}

static tm_status hash_grow(tm_tokenizer *t, size_t need, tm_error *err) {
    if (need * 2 <= t->hcap) return TM_OK;
    size_t nc = t->hcap ? t->hcap : 1024;
    while (nc < need * 2) nc *= 2;
    int32_t *ns = tm_malloc_array(nc, sizeof *ns);
    if (!ns) return tm_err(err, TM_ERR_NOMEM, "out of memory for the token hash");
    for (size_t i = 0; i < nc; i++) ns[i] = -1;
    for (size_t i = 0; i < t->hcap; i++) {
        int32_t id = t->hslots[i];
        if (id < 0) continue;
        size_t j = (size_t)hash_bytes(t->pool + t->str_off[id], t->str_len[id]) & (nc - 1);
        while (ns[j] >= 0) j = (j + 1) & (nc - 1);
        ns[j] = id;
    }
    free(t->hslots);
    t->hslots = ns;
    t->hcap = nc;
    return TM_OK;
}

/* Append a string to the table (no hashing). */
static tm_status str_append(tm_tokenizer *t, const char *s, size_t n, tm_error *err) {
    if (t->n_strs == t->cap_strs) {
        int32_t nc = t->cap_strs ? t->cap_strs * 2 : 1024;
        size_t *no = realloc(t->str_off, (size_t)nc * sizeof *no);
        if (!no) return tm_err(err, TM_ERR_NOMEM, "out of memory for the string table");
        t->str_off = no;
        uint32_t *nl = realloc(t->str_len, (size_t)nc * sizeof *nl);
        if (!nl) return tm_err(err, TM_ERR_NOMEM, "out of memory for the string table");
        t->str_len = nl;
        t->cap_strs = nc;
    }
    if (t->pool_cap - t->pool_len < n + 1) {
        size_t nc = t->pool_cap ? t->pool_cap : 65536;
        while (nc - t->pool_len < n + 1) nc *= 2;
        char *np = realloc(t->pool, nc);
        if (!np) return tm_err(err, TM_ERR_NOMEM, "out of memory for the string pool");
        t->pool = np;
        t->pool_cap = nc;
    }
    memcpy(t->pool + t->pool_len, s, n);
    t->pool[t->pool_len + n] = '\0';
    t->str_off[t->n_strs] = t->pool_len;
    t->str_len[t->n_strs] = (uint32_t)n;
    t->pool_len += n + 1;
    t->n_strs++;
    return TM_OK;
}

/* Insert id (already appended) into the hash; an equal text already there is replaced. */
static tm_status hash_insert(tm_tokenizer *t, int32_t id, tm_error *err) {
    tm_status st = hash_grow(t, (size_t)t->n_strs, err);
    if (st != TM_OK) return st;
    const char *s = t->pool + t->str_off[id];
    size_t n = t->str_len[id], mask = t->hcap - 1, i = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        int32_t o = t->hslots[i];
        if (o < 0 || (t->str_len[o] == n && memcmp(t->pool + t->str_off[o], s, n) == 0)) {
            t->hslots[i] = id;
            return TM_OK;
        }
        i = (i + 1) & mask;
    }
}

/* String id of s, interning it (as a non-vocabulary string) when new. */
static tm_status str_intern(tm_tokenizer *t, const char *s, size_t n, int32_t *id, tm_error *err) {
    *id = str_lookup(t, s, n);
    if (*id >= 0) return TM_OK;
    if (t->n_strs >= INT32_MAX / 2) return tm_err(err, TM_ERR_RANGE, "too many interned merge strings");
    tm_status st = str_append(t, s, n, err);
    if (st != TM_OK) return st;
    *id = t->n_strs - 1;
    return hash_insert(t, *id, err);
}

/* ---- merges ------------------------------------------------------------------------------------- */

static bool merge_find(const tm_tokenizer *t, int32_t l, int32_t r, int32_t *rank, int32_t *res) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t mask = t->mcap - 1, i = (size_t)hash_u64(key) & mask;
    for (;;) {
        uint64_t k = t->mkey[i];
        if (k == UINT64_MAX) return false;
        if (k == key) {
            *rank = t->mrank[i];
            *res = t->mres[i];
            return true;
        }
        i = (i + 1) & mask;
    }
}

static tm_status build_merges(tm_tokenizer *t, const tm_tok_vocab *v, tm_error *err) {
    if (v->n_merges < 0 || v->n_merges > TOK_MAX_MERGES)
        return tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.merges: %d merges is out of range", v->n_merges);
    if (v->n_merges > 0 && !v->merges) return tm_err(err, TM_ERR_INVALID, "merges array is NULL");
    size_t cap = 1024;
    while (cap < (size_t)v->n_merges * 2) cap *= 2;
    t->mkey = tm_malloc_array(cap, sizeof *t->mkey);
    t->mrank = tm_malloc_array(cap, sizeof *t->mrank);
    t->mres = tm_malloc_array(cap, sizeof *t->mres);
    if (!t->mkey || !t->mrank || !t->mres) return tm_err(err, TM_ERR_NOMEM, "out of memory for merges");
    for (size_t i = 0; i < cap; i++) t->mkey[i] = UINT64_MAX;
    t->mcap = cap;
    char *cat = NULL;
    size_t cat_cap = 0;
    tm_status st = TM_OK;
    for (int32_t m = 0; m < v->n_merges; m++) {
        const char *s = v->merges[m];
        if (!s) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.merges[%d] is missing", m);
            break;
        }
        size_t n = v->merge_lens ? v->merge_lens[m] : strlen(s);
        /* "left right": the separator is the first space after the first byte (as llama.cpp). */
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp || (size_t)(sp - s) + 1 >= n || n > TOK_MAX_TEXT) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.merges[%d] is not of the form \"left right\"", m);
            break;
        }
        size_t nl = (size_t)(sp - s), nr = n - nl - 1;
        int32_t l, r, res;
        if ((st = str_intern(t, s, nl, &l, err)) != TM_OK) break;
        if ((st = str_intern(t, sp + 1, nr, &r, err)) != TM_OK) break;
        if (cat_cap < nl + nr) {
            free(cat);
            cat_cap = (nl + nr) * 2;
            cat = malloc(cat_cap);
            if (!cat) {
                st = tm_err(err, TM_ERR_NOMEM, "out of memory for merges");
                break;
            }
        }
        memcpy(cat, s, nl);
        memcpy(cat + nl, sp + 1, nr);
        if ((st = str_intern(t, cat, nl + nr, &res, err)) != TM_OK) break;
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
        size_t i = (size_t)hash_u64(key) & (cap - 1);
        while (t->mkey[i] != UINT64_MAX && t->mkey[i] != key) i = (i + 1) & (cap - 1);
        if (t->mkey[i] == key) continue; /* duplicate pair: the first (best) rank stays, as llama.cpp */
        t->mkey[i] = key;
        t->mrank[i] = m;
        t->mres[i] = res;
    }
    free(cat);
    t->n_merges = v->n_merges;
    return st;
}

/* ---- building ----------------------------------------------------------------------------------- */

tm_tok_vocab tm_tok_vocab_init(void) {
    tm_tok_vocab v;
    memset(&v, 0, sizeof v);
    v.bos = v.eos = v.eot = v.eom = v.unk = -2;
    v.add_bos = -1;
    v.add_space_prefix = -1;
    return v;
}

void tm_tok_free(tm_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->str_off);
    free(t->str_len);
    free(t->hslots);
    free(t->scores);
    free(t->attr);
    free(t->eog);
    free(t->ppool);
    free(t->poff);
    free(t->plen);
    free(t->mkey);
    free(t->mrank);
    free(t->mres);
    free(t->special);
    free(t->tkey);
    free(t->tchild);
    free(t->tterm);
    tm_tok_pre_free(t->pre);
    free(t);
}

static const char *tok_str(const tm_tokenizer *t, int32_t id) { return t->pool + t->str_off[id]; }

static bool text_is(const tm_tokenizer *t, int32_t id, const char *s) {
    size_t n = strlen(s);
    return t->str_len[id] == n && memcmp(tok_str(t, id), s, n) == 0;
}

/* First token (lowest id) whose text is one of list (NULL-terminated), or -1. */
static int32_t find_first_of(const tm_tokenizer *t, const char *const *list) {
    int32_t best = -1;
    for (size_t i = 0; list[i]; i++) {
        int32_t id = tok_lookup(t, list[i], strlen(list[i]));
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

/* End-of-generation and control-looking tokens, as llama.cpp's load() derives them from token texts. */
static void derive_special(tm_tokenizer *t, bool eot_given, bool eom_given) {
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                            "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                            "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
                                            "<end_of_utterance>", NULL};
    static const char *const eom_texts[] = {"<|eom_id|>", NULL};
    static const char *const fim_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                          "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                          "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
    static const char *const fim_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                          "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>",
                                          "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
    static const char *const fim_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                          "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                          "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
    static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
    static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
                                          NULL};
    static const char *const fim_sep[] = {"<|file_sep|>", NULL};
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[", NULL};
    static const char *const user_defined[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};

    if (!eot_given) {
        t->eot = find_first_of(t, eot_texts);
        if (t->eot >= 0) t->attr[t->eot] |= ATTR_CONTROL;
    }
    if (!eom_given) {
        t->eom = find_first_of(t, eom_texts);
        if (t->eom >= 0) t->attr[t->eom] |= ATTR_CONTROL;
    }
    const char *const *fims[] = {fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep};
    for (int k = 0; k < 6; k++) {
        int32_t id = find_first_of(t, fims[k]);
        if (id < 0) continue;
        t->attr[id] |= ATTR_CONTROL;
        if (k >= 3) t->eog[id] = 1; /* fim pad, repo and file separator end generation */
    }
    for (size_t i = 0; eog_texts[i]; i++) {
        int32_t id = tok_lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (id < 0) continue;
        t->eog[id] = 1;
        t->attr[id] |= ATTR_CONTROL;
    }
    for (size_t i = 0; user_defined[i]; i++) {
        int32_t id = tok_lookup(t, user_defined[i], strlen(user_defined[i]));
        if (id >= 0) t->attr[id] = ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    /* o200k_harmony / solar-open: "<|end|>" is not an end of generation there */
    int32_t end_id = -1;
    bool has_return = false, has_call = false, has_flush = false;
    bool has_s_marker = false;
    int32_t s_id = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!t->eog[id]) continue;
        if (text_is(t, id, "<|return|>")) has_return = true;
        else if (text_is(t, id, "<|call|>") || text_is(t, id, "<|calls|>")) has_call = true;
        else if (text_is(t, id, "<|flush|>")) has_flush = true;
        else if (text_is(t, id, "<|end|>")) end_id = id;
        if (text_is(t, id, "<|tool_response>") || text_is(t, id, "<|plamo:eos|>")) has_s_marker = true;
        else if (text_is(t, id, "</s>")) s_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        t->eog[end_id] = 0;
        t->attr[end_id] = ATTR_USER_DEFINED;
    }
    if (has_s_marker && s_id >= 0) {
        t->eog[s_id] = 0;
        t->attr[s_id] = ATTR_NORMAL;
    }
}

/* The piece of a token with special = true (llama.cpp's token_to_piece cache). */
static tm_status piece_of(const tm_tokenizer *t, const int16_t *inv, int32_t id, char **buf, size_t *cap, size_t *n,
                          tm_error *err) {
    const char *s = tok_str(t, id);
    size_t len = t->str_len[id];
    uint16_t a = t->attr[id];
    size_t need = len * 4 + 64 + (len + 32); /* worst case of the [UNK_BYTE_..] form below */
    if (*cap < need) {
        char *nb = realloc(*buf, need);
        if (!nb) return tm_err(err, TM_ERR_NOMEM, "out of memory building pieces");
        *buf = nb;
        *cap = need;
    }
    char *o = *buf;
    *n = 0;
    if (t->kind == TM_TOK_BYTES) {
        memcpy(o, s, len);
        *n = len;
        return TM_OK;
    }
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        memcpy(o, s, len);
        *n = len;
    } else if (a & ATTR_NORMAL) {
        if (t->kind == TM_TOK_SPM) {
            for (size_t i = 0; i < len;) {
                if (i + 2 < len && (uint8_t)s[i] == 0xE2 && (uint8_t)s[i + 1] == 0x96 && (uint8_t)s[i + 2] == 0x81) {
                    o[(*n)++] = ' ';
                    i += 3;
                } else {
                    o[(*n)++] = s[i++];
                }
            }
        } else {
            /* byte-level decoding; a character outside the byte map gives llama.cpp's [UNK_BYTE_0x..] marker */
            size_t i = 0;
            size_t cap_left = *cap;
            while (i < len) {
                uint32_t cp = utf8_next_lenient((const uint8_t *)s, len, &i);
                int byte = cp < 0x144 ? inv[cp] : -1;
                if (byte >= 0) {
                    o[(*n)++] = (char)byte;
                    continue;
                }
                uint8_t u[4];
                size_t un = utf8_put(cp, u);
                size_t add = 12 + un * 2 + len + 1;
                if (cap_left < *n + add) {
                    size_t nc = (*n + add) * 2;
                    char *nb = realloc(*buf, nc);
                    if (!nb) return tm_err(err, TM_ERR_NOMEM, "out of memory building pieces");
                    *buf = nb;
                    o = nb;
                    *cap = cap_left = nc;
                }
                memcpy(o + *n, "[UNK_BYTE_0x", 12);
                *n += 12;
                for (size_t k = 0; k < un; k++) *n += (size_t)snprintf(o + *n, 3, "%02x", u[k]);
                memcpy(o + *n, s, len);
                *n += len;
                o[(*n)++] = ']';
            }
        }
    } else if (a & ATTR_BYTE) {
        unsigned v = 0;
        bool ok = len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
        for (int k = 3; ok && k < 5; k++) {
            char c = s[k];
            if (c >= '0' && c <= '9') v = v * 16 + (unsigned)(c - '0');
            else if (c >= 'a' && c <= 'f') v = v * 16 + (unsigned)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v = v * 16 + (unsigned)(c - 'A' + 10);
            else ok = false;
        }
        if (ok) o[(*n)++] = (char)v;
    }
    return TM_OK;
}

static tm_status build_pieces(tm_tokenizer *t, tm_error *err) {
    t->poff = tm_malloc_array((size_t)t->n_vocab, sizeof *t->poff);
    t->plen = tm_malloc_array((size_t)t->n_vocab, sizeof *t->plen);
    if (!t->poff || !t->plen) return tm_err(err, TM_ERR_NOMEM, "out of memory for pieces");
    int16_t inv[0x144]; /* GPT-2 code point -> byte, -1 if none */
    for (int c = 0; c < 0x144; c++) inv[c] = -1;
    for (int b = 0; b < 256; b++) inv[gpt2_byte_to_cp(b)] = (int16_t)b;
    char *buf = NULL;
    size_t cap = 0, pcap = 0;
    tm_status st = TM_OK;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n = 0;
        if ((st = piece_of(t, inv, id, &buf, &cap, &n, err)) != TM_OK) break;
        if (pcap - t->ppool_len < n + 1) {
            size_t nc = pcap ? pcap : 65536;
            while (nc - t->ppool_len < n + 1) nc *= 2;
            char *np = realloc(t->ppool, nc);
            if (!np) {
                st = tm_err(err, TM_ERR_NOMEM, "out of memory for pieces");
                break;
            }
            t->ppool = np;
            pcap = nc;
        }
        memcpy(t->ppool + t->ppool_len, buf, n);
        t->ppool[t->ppool_len + n] = '\0';
        t->poff[id] = t->ppool_len;
        t->plen[id] = (uint32_t)n;
        t->ppool_len += n + 1;
    }
    free(buf);
    return st;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const tm_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->str_len[x] != t->str_len[y]) return t->str_len[x] > t->str_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static tm_status build_special(tm_tokenizer *t, tm_error *err) {
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) n++;
    t->special = tm_malloc_array((size_t)n, sizeof *t->special);
    if (!t->special) return tm_err(err, TM_ERR_NOMEM, "out of memory for special tokens");
    t->n_special = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))) continue;
        /* a text that is not valid UTF-8 could cut the input inside a character: never match it */
        if (!tm_tok_utf8_valid(tok_str(t, id), t->str_len[id], NULL)) {
            tm_log(TM_LOG_WARN, "tokenizer: special token %d is not valid UTF-8; it will not be matched in text",
                   id);
            continue;
        }
        if (t->str_len[id] == 0) continue;
        t->special[t->n_special++] = id;
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);

    size_t total = 1;
    for (int32_t k = 0; k < t->n_special; k++) total += t->str_len[t->special[k]];
    if (total > (size_t)INT32_MAX / 2) return tm_err(err, TM_ERR_RANGE, "special token texts are too long");
    size_t cap = 64;
    while (cap < total * 2) cap *= 2;
    t->tkey = tm_calloc(cap, sizeof *t->tkey);
    t->tchild = tm_malloc_array(cap, sizeof *t->tchild);
    t->tterm = tm_malloc_array(total, sizeof *t->tterm);
    if (!t->tkey || !t->tchild || !t->tterm) return tm_err(err, TM_ERR_NOMEM, "out of memory for special tokens");
    t->tcap = cap;
    t->n_tnodes = 1;
    t->tterm[0] = -1;
    for (int32_t k = 0; k < t->n_special; k++) {
        const uint8_t *s = (const uint8_t *)tok_str(t, t->special[k]);
        int32_t node = 0;
        for (uint32_t i = 0; i < t->str_len[t->special[k]]; i++) {
            uint64_t key = (((uint64_t)node << 8) | s[i]) + 1;
            size_t h = (size_t)hash_u64(key) & (cap - 1);
            while (t->tkey[h] && t->tkey[h] != key) h = (h + 1) & (cap - 1);
            if (!t->tkey[h]) {
                t->tkey[h] = key;
                t->tchild[h] = t->n_tnodes;
                t->tterm[t->n_tnodes++] = -1;
            }
            node = t->tchild[h];
        }
        if (t->tterm[node] < 0) t->tterm[node] = k; /* a repeated text: the first claims every occurrence */
    }
    return TM_OK;
}

static int32_t trie_next(const tm_tokenizer *t, int32_t node, uint8_t c) {
    uint64_t key = (((uint64_t)node << 8) | c) + 1;
    size_t h = (size_t)hash_u64(key) & (t->tcap - 1);
    for (;;) {
        if (t->tkey[h] == key) return t->tchild[h];
        if (!t->tkey[h]) return -1;
        h = (h + 1) & (t->tcap - 1);
    }
}

static tm_status check_id(const char *key, int32_t id, int32_t n_vocab, tm_error *err) {
    if (id < -2 || id >= n_vocab)
        return tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.%s = %d is out of range (vocabulary of %d tokens)", key,
                      id, n_vocab);
    return TM_OK;
}

tm_status tm_tok_create_from_vocab(const tm_tok_vocab *v, tm_tokenizer **out, tm_error *err) {
    *out = NULL;
    if (!v || !v->model) return tm_err(err, TM_ERR_INVALID, "tokenizer: no model type given");
    tm_tok_kind kind;
    if (strcmp(v->model, "gpt2") == 0) kind = TM_TOK_BPE_GPT2;
    else if (strcmp(v->model, "llama") == 0) kind = TM_TOK_SPM;
    else
        return tm_err(err, TM_ERR_UNSUPPORTED, "tokenizer.ggml.model '%.64s' is not supported (gpt2 and llama are)",
                      v->model);
    if (v->n_tokens <= 0 || v->n_tokens > TOK_MAX_VOCAB)
        return tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.tokens: %d tokens is out of range", v->n_tokens);
    if (!v->tokens) return tm_err(err, TM_ERR_INVALID, "tokenizer: tokens array is NULL");
    const int32_t n = v->n_tokens;
    tm_status st;
    if ((st = check_id("bos_token_id", v->bos, n, err)) != TM_OK) return st;
    if ((st = check_id("eos_token_id", v->eos, n, err)) != TM_OK) return st;
    if ((st = check_id("eot_token_id", v->eot, n, err)) != TM_OK) return st;
    if ((st = check_id("eom_token_id", v->eom, n, err)) != TM_OK) return st;
    if ((st = check_id("unknown_token_id", v->unk, n, err)) != TM_OK) return st;

    tm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tm_err(err, TM_ERR_NOMEM, "out of memory for the tokenizer");
    t->kind = kind;
    t->n_vocab = n;
    t->scores = tm_malloc_array((size_t)n, sizeof *t->scores);
    t->attr = tm_malloc_array((size_t)n, sizeof *t->attr);
    t->eog = tm_calloc((size_t)n, 1);
    if (!t->scores || !t->attr || !t->eog) {
        st = tm_err(err, TM_ERR_NOMEM, "out of memory for the vocabulary");
        goto fail;
    }
    if ((st = hash_grow(t, (size_t)n, err)) != TM_OK) goto fail;
    for (int32_t i = 0; i < n; i++) {
        const char *s = v->tokens[i];
        if (!s) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.tokens[%d] is missing", i);
            goto fail;
        }
        size_t len = v->token_lens ? v->token_lens[i] : strlen(s);
        if (len > TOK_MAX_TEXT) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.tokens[%d] is %zu bytes long (limit %u)", i, len,
                        TOK_MAX_TEXT);
            goto fail;
        }
        char empty[32];
        if (len == 0) { /* as llama.cpp: an empty token gets a placeholder text */
            snprintf(empty, sizeof empty, "[EMPTY_%d]", i);
            s = empty;
            len = strlen(empty);
        }
        if ((st = str_append(t, s, len, err)) != TM_OK) goto fail;
        if (str_lookup(t, s, len) >= 0)
            tm_log(TM_LOG_DEBUG, "tokenizer: token %d repeats the text of an earlier token; the later id wins", i);
        if ((st = hash_insert(t, i, err)) != TM_OK) goto fail;
        float sc = v->scores ? v->scores[i] : 0.0f;
        if (isnan(sc)) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.scores[%d] is NaN", i);
            goto fail;
        }
        t->scores[i] = sc;
        int32_t ty = v->types ? v->types[i] : TM_TOKTYPE_NORMAL;
        switch (ty) {
        case TM_TOKTYPE_UNDEFINED: t->attr[i] = 0; break;
        case TM_TOKTYPE_NORMAL: t->attr[i] = ATTR_NORMAL; break;
        case TM_TOKTYPE_UNKNOWN: t->attr[i] = ATTR_UNKNOWN; break;
        case TM_TOKTYPE_CONTROL: t->attr[i] = ATTR_CONTROL; break;
        case TM_TOKTYPE_USER_DEFINED: t->attr[i] = ATTR_USER_DEFINED; break;
        case TM_TOKTYPE_UNUSED: t->attr[i] = ATTR_UNUSED; break;
        case TM_TOKTYPE_BYTE: t->attr[i] = ATTR_BYTE; break;
        default:
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.token_type[%d] = %d is not a token type (0..6)", i, ty);
            goto fail;
        }
    }

    /* model defaults, then the metadata */
    tm_tok_pre_info info = {.known = true, .ignore_merges = false, .add_bos = -1, .bos_none = false};
    if (kind == TM_TOK_BPE_GPT2) {
        if (!v->pre || !v->pre[0]) tm_log(TM_LOG_WARN, "tokenizer: no tokenizer.ggml.pre, using 'default'");
        if ((st = tm_tok_pre_create(v->pre, &t->pre, &info, err)) != TM_OK) goto fail;
        if (!info.known)
            tm_log(TM_LOG_WARN, "tokenizer: unknown pre-tokenizer '%.64s', falling back to gpt2", v->pre);
        t->ignore_merges = info.ignore_merges;
        /* llama.cpp defaults BPE bos/eos to 11; a comma is no sensible end of generation: none instead */
        t->bos = t->eos = t->unk = -1;
        t->add_bos = info.add_bos == 1;
        t->add_space_prefix = false;
        if ((st = build_merges(t, v, err)) != TM_OK) goto fail;
    } else {
        t->bos = n > 1 ? 1 : -1;
        t->eos = n > 2 ? 2 : -1;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    }
    t->eot = t->eom = -1;
    if (v->bos != -2) t->bos = v->bos;
    else if (info.bos_none) t->bos = -1;
    if (v->eos != -2) t->eos = v->eos;
    if (v->unk != -2) t->unk = v->unk;
    if (v->eot != -2) t->eot = v->eot;
    if (v->eom != -2) t->eom = v->eom;
    if (v->add_bos >= 0) t->add_bos = v->add_bos != 0;
    if (v->add_space_prefix >= 0) t->add_space_prefix = v->add_space_prefix != 0;

    derive_special(t, v->eot != -2, v->eom != -2);

    for (int b = 0; b < 256; b++) {
        if (kind == TM_TOK_BPE_GPT2) {
            uint8_t u[4];
            size_t un = utf8_put(gpt2_byte_to_cp(b), u);
            t->byte_enc_len[b] = (uint8_t)un;
            memcpy(t->byte_enc[b], u, un);
            t->byte_sym[b] = str_lookup(t, (const char *)u, un);
            for (size_t k = 0; k < 2; k++) t->byte_fb[b][k] = k < un ? tok_lookup(t, (const char *)&u[k], 1) : -1;
            t->spm_byte[b] = -1;
        } else {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            int32_t id = tok_lookup(t, hex, 6);
            if (id < 0) {
                char c = (char)b;
                id = tok_lookup(t, &c, 1);
            }
            t->spm_byte[b] = id;
            t->byte_sym[b] = -1;
        }
    }
    if ((st = build_special(t, err)) != TM_OK) goto fail;
    if ((st = build_pieces(t, err)) != TM_OK) goto fail;
    *out = t;
    return TM_OK;
fail:
    tm_tok_free(t);
    return st;
}

tm_status tm_tok_create_bytes(int32_t n_vocab, tm_tokenizer **out, tm_error *err) {
    *out = NULL;
    if (n_vocab < 260 || n_vocab > TOK_MAX_VOCAB)
        return tm_err(err, TM_ERR_INVALID, "byte tokenizer: n_vocab %d is out of range (260..%d)", n_vocab,
                      TOK_MAX_VOCAB);
    tm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tm_err(err, TM_ERR_NOMEM, "out of memory for the tokenizer");
    tm_status st;
    t->kind = TM_TOK_BYTES;
    t->n_vocab = n_vocab;
    t->scores = tm_calloc((size_t)n_vocab, sizeof *t->scores);
    t->attr = tm_malloc_array((size_t)n_vocab, sizeof *t->attr);
    t->eog = tm_calloc((size_t)n_vocab, 1);
    if (!t->scores || !t->attr || !t->eog) {
        st = tm_err(err, TM_ERR_NOMEM, "out of memory for the vocabulary");
        goto fail;
    }
    if ((st = hash_grow(t, (size_t)n_vocab, err)) != TM_OK) goto fail;
    for (int32_t i = 0; i < n_vocab; i++) {
        char s[32];
        size_t len;
        if (i < 256) {
            s[0] = (char)i;
            len = 1;
        } else {
            len = (size_t)snprintf(s, sizeof s, "<t%d>", i);
        }
        if ((st = str_append(t, s, len, err)) != TM_OK) goto fail;
        if ((st = hash_insert(t, i, err)) != TM_OK) goto fail;
        t->attr[i] = i < 256 ? ATTR_BYTE : ATTR_NORMAL;
    }
    t->bos = n_vocab - 2;
    t->eos = n_vocab - 1;
    t->eot = t->eom = t->unk = -1;
    t->attr[t->bos] = ATTR_CONTROL;
    t->attr[t->eos] = ATTR_CONTROL;
    t->eog[t->eos] = 1;
    t->add_bos = true;
    for (int b = 0; b < 256; b++) t->byte_sym[b] = t->spm_byte[b] = -1;
    if ((st = build_special(t, err)) != TM_OK) goto fail;
    if ((st = build_pieces(t, err)) != TM_OK) goto fail;
    *out = t;
    return TM_OK;
fail:
    tm_tok_free(t);
    return st;
}

/* ---- GGUF --------------------------------------------------------------------------------------- */

static tm_status gguf_opt_id(const tm_gguf *g, const char *key, int32_t *out, tm_error *err) {
    *out = -2;
    if (!tm_gguf_find(g, key)) return TM_OK;
    uint32_t v;
    tm_status st = tm_gguf_get_u32(g, key, &v, err);
    if (st != TM_OK) return st;
    *out = v > (uint32_t)INT32_MAX ? INT32_MAX : (int32_t)v;
    return TM_OK;
}

static tm_status gguf_opt_bool(const tm_gguf *g, const char *key, int *out, tm_error *err) {
    *out = -1;
    if (!tm_gguf_find(g, key)) return TM_OK;
    bool b;
    tm_status st = tm_gguf_get_bool(g, key, &b, err);
    if (st != TM_OK) return st;
    *out = b ? 1 : 0;
    return TM_OK;
}

tm_status tm_tok_load_gguf(const tm_gguf *g, tm_tokenizer **out, tm_error *err) {
    *out = NULL;
    tm_tok_vocab v = tm_tok_vocab_init();
    const char **texts = NULL, **merges = NULL;
    size_t *lens = NULL, *mlens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    char model[64] = "", pre[128] = "";
    tm_status st;
    tm_str s;
    if ((st = tm_gguf_get_str(g, "tokenizer.ggml.model", &s, err)) != TM_OK) goto done;
    if (s.len >= sizeof model) {
        st = tm_err(err, TM_ERR_UNSUPPORTED, "tokenizer.ggml.model is %llu bytes long: not a known model",
                    (unsigned long long)s.len);
        goto done;
    }
    memcpy(model, s.ptr, s.len);
    model[s.len] = '\0';
    v.model = model;
    if (tm_gguf_find(g, "tokenizer.ggml.pre")) {
        if ((st = tm_gguf_get_str(g, "tokenizer.ggml.pre", &s, err)) != TM_OK) goto done;
        size_t n = s.len < sizeof pre - 1 ? (size_t)s.len : sizeof pre - 1;
        memcpy(pre, s.ptr, n);
        pre[n] = '\0';
        if (memchr(pre, '\0', n)) pre[0] = '\0';
        v.pre = pre;
    }
    const tm_gguf_kv *kt;
    if ((st = tm_gguf_get_arr(g, "tokenizer.ggml.tokens", TM_GGUF_STRING, &kt, err)) != TM_OK) goto done;
    if (kt->v.arr.n == 0 || kt->v.arr.n > TOK_MAX_VOCAB) {
        st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries (1..%d allowed)",
                    (unsigned long long)kt->v.arr.n, TOK_MAX_VOCAB);
        goto done;
    }
    const uint64_t n = kt->v.arr.n;
    v.n_tokens = (int32_t)n;
    texts = tm_malloc_array(n, sizeof *texts);
    lens = tm_malloc_array(n, sizeof *lens);
    if (!texts || !lens) {
        st = tm_err(err, TM_ERR_NOMEM, "out of memory reading the vocabulary");
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        texts[i] = kt->v.arr.strs[i].ptr;
        lens[i] = (size_t)kt->v.arr.strs[i].len;
        if (kt->v.arr.strs[i].len > TOK_MAX_TEXT) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.tokens[%llu] is too long", (unsigned long long)i);
            goto done;
        }
    }
    v.tokens = texts;
    v.token_lens = lens;
    const tm_gguf_kv *ks = tm_gguf_find(g, "tokenizer.ggml.scores");
    if (ks) {
        if (ks->type != TM_GGUF_ARRAY || (ks->v.arr.type != TM_GGUF_F32 && ks->v.arr.type != TM_GGUF_I32)) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.scores must be an array of f32 or i32");
            goto done;
        }
        if (ks->v.arr.n != n) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.scores has %llu entries for %llu tokens",
                        (unsigned long long)ks->v.arr.n, (unsigned long long)n);
            goto done;
        }
        scores = tm_malloc_array(n, sizeof *scores);
        if (!scores) {
            st = tm_err(err, TM_ERR_NOMEM, "out of memory reading scores");
            goto done;
        }
        for (uint64_t i = 0; i < n; i++) {
            double d;
            if (!tm_gguf_arr_float(ks, i, &d)) {
                st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.scores[%llu] is unreadable", (unsigned long long)i);
                goto done;
            }
            scores[i] = (float)d;
        }
        v.scores = scores;
    }
    const tm_gguf_kv *ky = tm_gguf_find(g, "tokenizer.ggml.token_type");
    if (ky) {
        if (ky->type != TM_GGUF_ARRAY || ky->v.arr.type != TM_GGUF_I32) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.token_type must be an array of i32");
            goto done;
        }
        if (ky->v.arr.n != n) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries for %llu tokens",
                        (unsigned long long)ky->v.arr.n, (unsigned long long)n);
            goto done;
        }
        types = tm_malloc_array(n, sizeof *types);
        if (!types) {
            st = tm_err(err, TM_ERR_NOMEM, "out of memory reading token types");
            goto done;
        }
        for (uint64_t i = 0; i < n; i++) {
            int64_t x;
            if (!tm_gguf_arr_int(ky, i, &x) || x < INT32_MIN || x > INT32_MAX) {
                st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.token_type[%llu] is unreadable",
                            (unsigned long long)i);
                goto done;
            }
            types[i] = (int32_t)x;
        }
        v.types = types;
    }
    if (strcmp(model, "gpt2") == 0) {
        const tm_gguf_kv *km;
        if ((st = tm_gguf_get_arr(g, "tokenizer.ggml.merges", TM_GGUF_STRING, &km, err)) != TM_OK) goto done;
        if (km->v.arr.n > TOK_MAX_MERGES) {
            st = tm_err(err, TM_ERR_FORMAT, "tokenizer.ggml.merges has %llu entries (at most %d allowed)",
                        (unsigned long long)km->v.arr.n, TOK_MAX_MERGES);
            goto done;
        }
        uint64_t nm = km->v.arr.n;
        merges = tm_malloc_array(nm, sizeof *merges);
        mlens = tm_malloc_array(nm, sizeof *mlens);
        if (!merges || !mlens) {
            st = tm_err(err, TM_ERR_NOMEM, "out of memory reading merges");
            goto done;
        }
        for (uint64_t i = 0; i < nm; i++) {
            merges[i] = km->v.arr.strs[i].ptr;
            mlens[i] = km->v.arr.strs[i].len > TOK_MAX_TEXT ? TOK_MAX_TEXT + 1 : (size_t)km->v.arr.strs[i].len;
        }
        v.n_merges = (int32_t)nm;
        v.merges = merges;
        v.merge_lens = mlens;
    }
    if ((st = gguf_opt_id(g, "tokenizer.ggml.bos_token_id", &v.bos, err)) != TM_OK) goto done;
    if ((st = gguf_opt_id(g, "tokenizer.ggml.eos_token_id", &v.eos, err)) != TM_OK) goto done;
    if ((st = gguf_opt_id(g, "tokenizer.ggml.eot_token_id", &v.eot, err)) != TM_OK) goto done;
    if ((st = gguf_opt_id(g, "tokenizer.ggml.eom_token_id", &v.eom, err)) != TM_OK) goto done;
    if ((st = gguf_opt_id(g, "tokenizer.ggml.unknown_token_id", &v.unk, err)) != TM_OK) goto done;
    if ((st = gguf_opt_bool(g, "tokenizer.ggml.add_bos_token", &v.add_bos, err)) != TM_OK) goto done;
    if ((st = gguf_opt_bool(g, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix, err)) != TM_OK) goto done;
    st = tm_tok_create_from_vocab(&v, out, err);
done:
    free(texts);
    free(lens);
    free(merges);
    free(mlens);
    free(scores);
    free(types);
    return st;
}

/* ---- accessors ---------------------------------------------------------------------------------- */

tm_tok_kind tm_tok_kind_of(const tm_tokenizer *t) { return t->kind; }
int32_t tm_tok_n_vocab(const tm_tokenizer *t) { return t->n_vocab; }
int32_t tm_tok_bos(const tm_tokenizer *t) { return t->bos; }
int32_t tm_tok_eos(const tm_tokenizer *t) { return t->eos; }
int32_t tm_tok_eot(const tm_tokenizer *t) { return t->eot; }
bool tm_tok_add_bos(const tm_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool tm_tok_is_eog(const tm_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->eog[id]; }
bool tm_tok_is_control(const tm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN));
}
int32_t tm_tok_find(const tm_tokenizer *t, const char *text) { return tok_lookup(t, text, strlen(text)); }
const char *tm_tok_pre_name(const tm_tokenizer *t) { return t->pre ? tm_tok_pre_canonical(t->pre) : ""; }

const char *tm_tok_text(const tm_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return tok_str(t, id);
}

const char *tm_tok_piece(const tm_tokenizer *t, int32_t id, bool special, size_t *len) {
    if (id < 0 || id >= t->n_vocab || (!special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN)))) {
        *len = 0;
        return "";
    }
    *len = t->plen[id];
    return t->ppool + t->poff[id];
}

/* ---- encoding ----------------------------------------------------------------------------------- */

typedef struct sym {
    int32_t prev, next;
    uint32_t start, n;  /* byte range in the word / escaped text */
    int32_t id;         /* string id of the symbol's text, -1 unknown */
} sym;

typedef struct bigram {
    double key;         /* bpe: rank; spm: -score (smaller pops first) */
    int32_t left, right;
    uint32_t size;      /* left.n + right.n when queued */
    int32_t res;        /* string id of the merged text */
} bigram;

typedef struct fragment {
    size_t off, len;    /* raw text span, or */
    int32_t id;         /* a special token (>= 0); -1 for raw text */
} fragment;

typedef struct enc_work {
    sym *syms;          /* (cap_syms) */
    size_t cap_syms;
    bigram *heap;       /* (cap_heap) */
    size_t n_heap, cap_heap;
    char *buf;          /* (cap_buf) scratch: escaped SPM text, encoded words */
    size_t cap_buf;
    fragment *fa, *fb;  /* (cap_fa), (cap_fb) */
    size_t cap_fa, cap_fb;
    tm_tok_pre_work pre;
} enc_work;

static void enc_work_free(enc_work *w) {
    free(w->syms);
    free(w->heap);
    free(w->buf);
    free(w->fa);
    free(w->fb);
    tm_tok_pre_work_free(&w->pre);
}

/* Grow an array to hold need elements, keeping its contents. */
static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    size_t bytes;
    if (__builtin_mul_overflow(nc, elem, &bytes)) return false;
    void *np = realloc(*p, bytes);
    if (!np) return false;
    *p = np;
    *cap = nc;
    return true;
}

static bool heap_less(const bigram *a, const bigram *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static bool heap_push(enc_work *w, bigram b) {
    if (w->n_heap == w->cap_heap) {
        size_t nc = w->cap_heap ? w->cap_heap * 2 : 256;
        bigram *nh = realloc(w->heap, nc * sizeof *nh);
        if (!nh) return false;
        w->heap = nh;
        w->cap_heap = nc;
    }
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&b, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return true;
}

static bigram heap_pop(enc_work *w) {
    bigram top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!heap_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static bool bpe_add_bigram(const tm_tokenizer *t, enc_work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *a = &w->syms[l], *b = &w->syms[r];
    if (a->id < 0 || b->id < 0) return true;
    int32_t rank, res;
    if (!merge_find(t, a->id, b->id, &rank, &res)) return true;
    bigram g = {.key = (double)rank, .left = l, .right = r, .size = a->n + b->n, .res = res};
    return heap_push(w, g);
}

#define PUSH(id_)                                                                           \
    do {                                                                                    \
        if (tm_ids_push(out, (id_)) != TM_OK) return tm_err(err, TM_ERR_NOMEM, "out of memory for ids"); \
    } while (0)

/* Byte-level BPE on one pre-tokenized word (raw bytes). */
static tm_status bpe_word(const tm_tokenizer *t, enc_work *w, const uint8_t *word, size_t n, tm_ids *out,
                          tm_error *err) {
    if (n == 0) return TM_OK;
    if (n > UINT32_MAX / 2) return tm_err(err, TM_ERR_RANGE, "word of %zu bytes is too long", n);
    if (t->ignore_merges) {
        if (!grow((void **)&w->buf, &w->cap_buf, n * 2, 1)) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->buf + m, t->byte_enc[word[i]], t->byte_enc_len[word[i]]);
            m += t->byte_enc_len[word[i]];
        }
        int32_t id = tok_lookup(t, w->buf, m);
        if (id >= 0) {
            PUSH(id);
            return TM_OK;
        }
    }
    if (!grow((void **)&w->syms, &w->cap_syms, n, sizeof(sym))) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    sym *s = w->syms;
    for (size_t i = 0; i < n; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        s[i].start = (uint32_t)i;
        s[i].n = 1;
        s[i].id = t->byte_sym[word[i]];
    }
    w->n_heap = 0;
    for (size_t i = 1; i < n; i++)
        if (!bpe_add_bigram(t, w, (int32_t)i - 1, (int32_t)i)) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    while (w->n_heap) {
        bigram g = heap_pop(w);
        sym *l = &s[g.left], *r = &s[g.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != g.size) continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->id = g.res;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = g.left;
        if (!bpe_add_bigram(t, w, l->prev, g.left) || !bpe_add_bigram(t, w, g.left, l->next))
            return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i].n == 0) continue;
        if (s[i].id >= 0 && s[i].id < t->n_vocab) {
            PUSH(s[i].id);
            continue;
        }
        /* not a token: each byte of the encoded text looked up alone (llama.cpp's fallback) */
        for (uint32_t k = 0; k < s[i].n; k++) {
            uint8_t b = word[s[i].start + k];
            for (uint8_t j = 0; j < t->byte_enc_len[b] && j < 2; j++)
                if (t->byte_fb[b][j] >= 0) PUSH(t->byte_fb[b][j]);
        }
    }
    return TM_OK;
}

static bool spm_add_bigram(const tm_tokenizer *t, enc_work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *a = &w->syms[l], *b = &w->syms[r];
    int32_t id = tok_lookup(t, w->buf + a->start, (size_t)a->n + b->n);
    if (id < 0) return true;
    bigram g = {.key = -(double)t->scores[id], .left = l, .right = r, .size = a->n + b->n, .res = id};
    return heap_push(w, g);
}

/* SentencePiece-style BPE on one raw fragment. */
static tm_status spm_fragment(const tm_tokenizer *t, enc_work *w, const char *text, size_t len, bool prefix,
                              tm_ids *out, tm_error *err) {
    size_t spaces = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t m = len + (prefix ? 1 : 0) + spaces * 2;
    if (m > UINT32_MAX / 2) return tm_err(err, TM_ERR_RANGE, "text of %zu bytes is too long", len);
    if (!grow((void **)&w->buf, &w->cap_buf, m, 1)) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    char *b = w->buf;
    size_t o = 0;
    if (prefix) {
        memcpy(b, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(b + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            b[o++] = text[i];
        }
    }
    if (o == 0) return TM_OK;
    if (!grow((void **)&w->syms, &w->cap_syms, o, sizeof(sym))) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    sym *s = w->syms;
    int32_t ns = 0;
    for (size_t i = 0; i < o;) {
        uint8_t c = (uint8_t)b[i];
        size_t cl = c < 0x80 ? 1 : c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (cl > o - i) cl = o - i;
        s[ns].prev = ns - 1;
        s[ns].next = i + cl < o ? ns + 1 : -1;
        s[ns].start = (uint32_t)i;
        s[ns].n = (uint32_t)cl;
        s[ns].id = -2; /* looked up at the end */
        ns++;
        i += cl;
    }
    w->n_heap = 0;
    for (int32_t i = 1; i < ns; i++)
        if (!spm_add_bigram(t, w, i - 1, i)) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    while (w->n_heap) {
        bigram g = heap_pop(w);
        sym *l = &s[g.left], *r = &s[g.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != g.size) continue;
        l->n += r->n;
        r->n = 0;
        l->id = g.res;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = g.left;
        if (!spm_add_bigram(t, w, l->prev, g.left) || !spm_add_bigram(t, w, g.left, l->next))
            return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i != -1; i = s[i].next) {
        int32_t id = s[i].id >= 0 ? s[i].id : tok_lookup(t, b + s[i].start, s[i].n);
        if (id >= 0) {
            PUSH(id);
            continue;
        }
        for (uint32_t k = 0; k < s[i].n; k++) {
            int32_t bid = t->spm_byte[(uint8_t)b[s[i].start + k]];
            if (bid < 0) bid = t->unk; /* llama.cpp throws here; the unknown token is the kinder answer */
            if (bid >= 0) PUSH(bid);
        }
    }
    return TM_OK;
}

/* Cut special tokens out of the text (llama.cpp's tokenizer_st_partition). */
static tm_status partition(const tm_tokenizer *t, enc_work *w, const char *text, size_t len, bool parse_special,
                           size_t *n_frag, tm_error *err) {
    size_t nf = 0;
    if (!grow((void **)&w->fa, &w->cap_fa, 16, sizeof(fragment))) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    if (len == 0) {
        *n_frag = 0;
        return TM_OK;
    }
    w->fa[nf++] = (fragment){.off = 0, .len = len, .id = -1};
    /* which special texts occur in the text at all (one pass over the trie) */
    uint8_t *occurs = tm_calloc((size_t)t->n_special, 1);
    if (!occurs) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        int32_t node = 0;
        for (size_t j = i; j < len; j++) {
            node = trie_next(t, node, (uint8_t)text[j]);
            if (node < 0) break;
            if (t->tterm[node] >= 0) occurs[t->tterm[node]] = 1;
        }
    }
    tm_status st = TM_OK;
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!occurs[k]) continue;
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *needle = tok_str(t, id);
        size_t nl = t->str_len[id];
        /* any occurrence in a raw fragment? */
        bool found = false;
        for (size_t f = 0; f < nf && !found; f++)
            if (w->fa[f].id < 0 && memmem(text + w->fa[f].off, w->fa[f].len, needle, nl)) found = true;
        if (!found) continue;
        size_t nb = 0;
        for (size_t f = 0; f < nf; f++) {
            fragment fr = w->fa[f];
            if (fr.id >= 0) {
                if (!grow((void **)&w->fb, &w->cap_fb, nb + 1, sizeof(fragment))) goto oom;
                w->fb[nb++] = fr;
                continue;
            }
            size_t off = fr.off, end = fr.off + fr.len;
            while (off < end) {
                const char *hit = memmem(text + off, end - off, needle, nl);
                size_t at = hit ? (size_t)(hit - text) : end;
                if (!grow((void **)&w->fb, &w->cap_fb, nb + 2, sizeof(fragment))) goto oom;
                if (at > off) w->fb[nb++] = (fragment){.off = off, .len = at - off, .id = -1};
                if (!hit) break;
                w->fb[nb++] = (fragment){.off = at, .len = nl, .id = id};
                off = at + nl;
            }
        }
        fragment *tf = w->fa;
        w->fa = w->fb;
        w->fb = tf;
        size_t tc = w->cap_fa;
        w->cap_fa = w->cap_fb;
        w->cap_fb = tc;
        nf = nb;
    }
    *n_frag = nf;
    free(occurs);
    return st;
oom:
    free(occurs);
    return tm_err(err, TM_ERR_NOMEM, "out of memory");
}

tm_status tm_tok_encode(const tm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                        tm_ids *out, tm_error *err) {
    if (!t || !out || (!text && len)) return tm_err(err, TM_ERR_INVALID, "tm_tok_encode: NULL argument");
    size_t bad = 0;
    if (!tm_tok_utf8_valid(text, len, &bad))
        return tm_err(err, TM_ERR_INVALID, "text is not valid UTF-8 (byte %zu: 0x%02x)", bad, (uint8_t)text[bad]);
    const size_t n0 = out->n;
    if (add_bos && t->bos >= 0) PUSH(t->bos);
    if (t->kind == TM_TOK_BYTES) {
        for (size_t i = 0; i < len; i++) PUSH((int32_t)(uint8_t)text[i]);
        return TM_OK;
    }
    enc_work w;
    memset(&w, 0, sizeof w);
    size_t nf = 0;
    tm_status st = partition(t, &w, text, len, parse_special, &nf, err);
    bool prev_special = true; /* SPM: the first fragment gets the space prefix too */
    for (size_t f = 0; f < nf && st == TM_OK; f++) {
        fragment fr = w.fa[f];
        if (fr.id >= 0) {
            if (tm_ids_push(out, fr.id) != TM_OK) st = tm_err(err, TM_ERR_NOMEM, "out of memory for ids");
            prev_special = true;
            continue;
        }
        if (t->kind == TM_TOK_SPM) {
            st = spm_fragment(t, &w, text + fr.off, fr.len, t->add_space_prefix && prev_special, out, err);
            prev_special = false;
            continue;
        }
        const tm_tok_span *spans;
        size_t ns;
        st = tm_tok_pre_split(t->pre, &w.pre, text + fr.off, fr.len, &spans, &ns, err);
        for (size_t i = 0; i < ns && st == TM_OK; i++)
            st = bpe_word(t, &w, (const uint8_t *)text + fr.off + spans[i].off, spans[i].len, out, err);
    }
    enc_work_free(&w);
    if (st != TM_OK) out->n = n0;
    return st;
}

/* ---- decoding ----------------------------------------------------------------------------------- */

tm_status tm_tok_decode(const tm_tokenizer *t, const int32_t *ids, size_t n, bool special, char **out,
                        tm_error *err) {
    *out = NULL;
    if (n && !ids) return tm_err(err, TM_ERR_INVALID, "tm_tok_decode: NULL ids");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return tm_err(err, TM_ERR_RANGE, "token id %d at position %zu is out of range (vocabulary of %d)",
                          ids[i], i, t->n_vocab);
        size_t pl;
        tm_tok_piece(t, ids[i], special, &pl);
        total += pl;
    }
    char *s = malloc(total + 1);
    if (!s) return tm_err(err, TM_ERR_NOMEM, "out of memory decoding %zu tokens", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = tm_tok_piece(t, ids[i], special, &pl);
        memcpy(s + o, p, pl);
        o += pl;
    }
    s[o] = '\0';
    *out = s;
    return TM_OK;
}

static const uint8_t REPL[3] = {0xEF, 0xBF, 0xBD};

/* Emit the valid UTF-8 of the concatenation a[0..na) b[0..nb) (a: held-back bytes, b: the new piece) with
 * U+FFFD for each maximal invalid subpart; an incomplete tail is kept in st. With o == NULL only the
 * number of bytes is returned and st is left alone. */
static size_t detok_run(tm_detok *st, const uint8_t *a, size_t na, const uint8_t *b, size_t nb, uint8_t *o) {
#define AT(k) ((k) < na ? a[(k)] : b[(k) - na])
    const size_t n = na + nb;
    size_t w = 0, i = 0, keep = 0;
    uint8_t tail[4];
    while (i < n) {
        uint8_t c = AT(i);
        if (c < 0x80) {
            if (o) o[w] = c;
            w++;
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else {
            if (o) memcpy(o + w, REPL, 3);
            w += 3;
            i++;
            continue;
        }
        size_t k = 1;
        bool bad = false;
        for (; k <= need && i + k < n; k++) {
            uint8_t x = AT(i + k);
            if (k == 1 ? (x < lo || x > hi) : (x & 0xC0) != 0x80) {
                bad = true;
                break;
            }
        }
        if (bad) { /* the maximal subpart [i, i+k) can never complete */
            if (o) memcpy(o + w, REPL, 3);
            w += 3;
            i += k;
            continue;
        }
        if (k <= need) { /* ran out of input: hold the partial sequence back */
            keep = n - i;
            for (size_t j = 0; j < keep; j++) tail[j] = AT(i + j);
            break;
        }
        if (o)
            for (size_t j = 0; j <= need; j++) o[w + j] = AT(i + j);
        w += need + 1;
        i += need + 1;
    }
#undef AT
    if (o) {
        memcpy(st->pending, tail, keep);
        st->n_pending = keep;
    }
    return w;
}

size_t tm_detok_bound(const tm_tokenizer *t, const tm_detok *st, int32_t id, bool special) {
    if (id < 0 || id >= t->n_vocab) return 0;
    size_t pl;
    const char *p = tm_tok_piece(t, id, special, &pl);
    if (pl == 0) return 0;
    size_t np = st->n_pending > 3 ? 3 : st->n_pending;
    return detok_run(NULL, st->pending, np, (const uint8_t *)p, pl, NULL);
}

size_t tm_detok_push(const tm_tokenizer *t, tm_detok *st, int32_t id, bool special, char *out, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    size_t pl;
    const char *p = tm_tok_piece(t, id, special, &pl);
    if (pl == 0) return 0;
    size_t np = st->n_pending > 3 ? 3 : st->n_pending;
    uint8_t held[4];
    memcpy(held, st->pending, np);
    if (cap < 3 * (pl + np) && cap < detok_run(st, held, np, (const uint8_t *)p, pl, NULL)) return TM_DETOK_TOO_SMALL;
    return detok_run(st, held, np, (const uint8_t *)p, pl, (uint8_t *)out);
}

size_t tm_detok_finish(tm_detok *st, char *out, size_t cap) {
    if (st->n_pending == 0) return 0;
    if (cap < 3) return TM_DETOK_TOO_SMALL;
    memcpy(out, REPL, 3);
    st->n_pending = 0;
    return 3;
}
