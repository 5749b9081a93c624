/* test_chat.c -- chat templates: detection on real template texts, byte-exact goldens rendered by Jinja, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tm_chat.h"

#define DATA "tests/data/chat/"

/* ---- file helpers --------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fprintf(stderr, "cannot open %s (run from the repository root)\n", path);
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

/* conversations.txt: "== NAME" then "ROLE HEX" lines */
enum { MAX_CONV = 32, MAX_MSG = 16 };
typedef struct conv {
    char name[64];
    size_t n;
    tm_chat_msg msg[MAX_MSG];
    char role[MAX_MSG][16];
    char *content[MAX_MSG];
} conv;

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static size_t load_conversations(conv *cv) {
    char *text = read_file(DATA "conversations.txt", NULL);
    size_t nc = 0;
    conv *cur = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "== ", 3) == 0) {
            assert_true(nc < MAX_CONV);
            cur = &cv[nc++];
            memset(cur, 0, sizeof *cur);
            snprintf(cur->name, sizeof cur->name, "%s", line + 3);
            continue;
        }
        assert_non_null(cur);
        assert_true(cur->n < MAX_MSG);
        char *sp = strchr(line, ' ');
        if (!sp) sp = line + strlen(line); /* empty content: "ROLE " may lose nothing, but be lenient */
        size_t rl = (size_t)(sp - line), hl = *sp ? strlen(sp + 1) : 0;
        assert_true(rl < sizeof cur->role[0] && hl % 2 == 0);
        memcpy(cur->role[cur->n], line, rl);
        cur->role[cur->n][rl] = '\0';
        char *c = malloc(hl / 2 + 1);
        assert_non_null(c);
        for (size_t i = 0; i < hl / 2; i++) {
            int hi = hexval(sp[1 + 2 * i]), lo = hexval(sp[2 + 2 * i]);
            assert_true(hi >= 0 && lo >= 0);
            c[i] = (char)(hi * 16 + lo);
        }
        c[hl / 2] = '\0';
        cur->content[cur->n] = c;
        cur->msg[cur->n].role = cur->role[cur->n];
        cur->msg[cur->n].content = c;
        cur->n++;
    }
    free(text);
    return nc;
}

static void free_conversations(conv *cv, size_t nc) {
    for (size_t i = 0; i < nc; i++)
        for (size_t j = 0; j < cv[i].n; j++) free(cv[i].content[j]);
}

static const conv *find_conv(const conv *cv, size_t nc, const char *name) {
    for (size_t i = 0; i < nc; i++)
        if (strcmp(cv[i].name, name) == 0) return &cv[i];
    fail_msg("no conversation '%s'", name);
    return NULL;
}

static tm_chat_kind kind_named(const char *name) {
    tm_chat_kind k = TM_CHAT_COUNT;
    assert_int_equal(tm_chat_from_name(name, &k, NULL), TM_OK);
    return k;
}

/* ---- goldens ------------------------------------------------------------------------------------- */

/* For every template in templates.tsv: detection gives the listed family/variant/default, and every
 * golden record matches the render byte for byte (or is an error where the record says so). */
static void test_goldens(void **state) {
    (void)state;
    static conv cv[MAX_CONV];
    size_t nc = load_conversations(cv);
    assert_true(nc >= 10);
    char *tsv = read_file(DATA "templates.tsv", NULL);
    int n_templates = 0, n_cases = 0, n_errors = 0;
    char *save = NULL;
    for (char *line = strtok_r(tsv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char file[64], family[16], variant[16];
        int has_default = -1;
        assert_int_equal(sscanf(line, "%63s %15s %15s %d", file, family, variant, &has_default), 4);
        char path[256];
        snprintf(path, sizeof path, DATA "%s", file);
        size_t tlen;
        char *tmpl = read_file(path, &tlen);

        tm_chat_template t;
        tm_error err = {0};
        assert_int_equal(tm_chat_template_detect(tmpl, tlen, &t, &err), TM_OK);
        if (t.kind != kind_named(family)) fail_msg("%s: detected %s, expected %s", file, tm_chat_name(t.kind), family);
        assert_int_equal(t.variant, strcmp(variant, "legacy") == 0 ? TM_CHAT_VARIANT_MISTRAL_LEGACY : TM_CHAT_VARIANT_NONE);
        assert_int_equal(t.default_system != NULL, has_default);
        tm_chat_kind k2 = TM_CHAT_COUNT;
        assert_int_equal(tm_chat_detect(tmpl, tlen, &k2, &err), TM_OK);
        assert_int_equal(k2, t.kind);

        /* golden records */
        char stem[64];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(file) - strlen(".jinja")), file);
        snprintf(path, sizeof path, DATA "%s.golden", stem);
        size_t glen;
        char *g = read_file(path, &glen);
        size_t pos = 0;
        while (pos < glen) {
            char *nl = memchr(g + pos, '\n', glen - pos);
            assert_non_null(nl);
            *nl = '\0';
            char cname[64], what[32];
            int gen = -1;
            assert_int_equal(sscanf(g + pos, "== %63s %d %31s", cname, &gen, what), 3);
            pos = (size_t)(nl - g) + 1;
            const conv *c = find_conv(cv, nc, cname);
            char *out = (char *)&err; /* must be reset to NULL on error */
            tm_status st = tm_chat_template_apply(&t, c->msg, c->n, gen != 0, &out, &err);
            n_cases++;
            if (strcmp(what, "error") == 0) {
                if (st != TM_ERR_INVALID) fail_msg("%s/%s/%d: expected an error, rendered '%s'", stem, cname, gen, out);
                assert_null(out);
                assert_true(strlen(err.msg) > 0);
                n_errors++;
                continue;
            }
            size_t n = strtoul(what, NULL, 10);
            assert_true(pos + n < glen + 1 && g[pos + n] == '\n');
            if (st != TM_OK) fail_msg("%s/%s/%d: %s", stem, cname, gen, err.msg);
            if (strlen(out) != n || memcmp(out, g + pos, n) != 0)
                fail_msg("%s/%s/%d mismatch:\n--- got (%zu bytes)\n%s\n--- want (%zu bytes)\n%.*s\n", stem, cname, gen,
                         strlen(out), out, n, (int)n, g + pos);
            free(out);
            pos += n + 1;
        }
        free(g);
        tm_chat_template_free(&t);
        free(tmpl);
        n_templates++;
    }
    free(tsv);
    free_conversations(cv, nc);
    assert_true(n_templates >= 9);
    assert_true(n_cases > 150 && n_errors > 20);
}

/* ---- detection ------------------------------------------------------------------------------------ */

static void test_detect_markers(void **state) {
    (void)state;
    struct {
        const char *tmpl;
        tm_status st;
        tm_chat_kind kind;
    } cases[] = {
        {"chatml", TM_OK, TM_CHAT_CHATML}, /* a family name is accepted as the template text */
        {"llama3", TM_OK, TM_CHAT_LLAMA3},
        {"gemma", TM_OK, TM_CHAT_GEMMA},
        {"{{'<|im_start|>' + m['role'] }}", TM_OK, TM_CHAT_CHATML},
        {"{{ '<|start_header_id|>' + r + '<|end_header_id|>' }}", TM_OK, TM_CHAT_LLAMA3},
        {"{{ '[INST] <<SYS>>' }}", TM_OK, TM_CHAT_LLAMA2},
        {"{{ '[INST] ' + c + ' [/INST]' }}", TM_OK, TM_CHAT_MISTRAL},
        {"{{ '<start_of_turn>user' }}", TM_OK, TM_CHAT_GEMMA},
        /* ChatML wins over markers that come later in llama.cpp's order */
        {"<|im_start|> [INST] <start_of_turn>", TM_OK, TM_CHAT_CHATML},
        /* unsupported look-alikes and unknowns */
        {"{{ '<|im_start|>' + role + '<|im_sep|>' }}", TM_ERR_UNSUPPORTED, 0},    /* Phi-4 */
        {"<|im_start|>User:<end_of_utterance>", TM_ERR_UNSUPPORTED, 0},            /* SmolVLM */
        {"[SYSTEM_PROMPT]{{ s }}[/SYSTEM_PROMPT][INST]", TM_ERR_UNSUPPORTED, 0},   /* Mistral v7 */
        {"[AVAILABLE_TOOLS] [INST]", TM_ERR_UNSUPPORTED, 0},                       /* Mistral v3 */
        {"{{ '<|user|>\\n' + m + '<|end|>\\n<|assistant|>' }}", TM_ERR_UNSUPPORTED, 0}, /* Phi-3 */
        {"<|start_header_id|> without its partner", TM_ERR_UNSUPPORTED, 0},
        {"chatml2", TM_ERR_UNSUPPORTED, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tm_chat_kind k = TM_CHAT_COUNT;
        tm_error err = {0};
        tm_status st = tm_chat_detect(cases[i].tmpl, strlen(cases[i].tmpl), &k, &err);
        if (st != cases[i].st) fail_msg("'%s': status %d, expected %d (%s)", cases[i].tmpl, st, cases[i].st, err.msg);
        if (st == TM_OK)
            assert_int_equal(k, cases[i].kind);
        else
            assert_true(strlen(err.msg) > 0);
    }
    /* the unknown-template message lists the families */
    tm_chat_kind k;
    tm_error err = {0};
    assert_int_equal(tm_chat_detect("{{ messages }}", 14, &k, &err), TM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "chatml, llama3, llama2, mistral, gemma"));
    assert_int_equal(tm_chat_detect("", 0, &k, &err), TM_ERR_UNSUPPORTED);
    assert_int_equal(tm_chat_detect(NULL, 0, &k, &err), TM_ERR_UNSUPPORTED);
    /* length-bounded: the marker past len is not seen */
    const char *s = "{{ x }}<start_of_turn>";
    assert_int_equal(tm_chat_detect(s, 7, &k, &err), TM_ERR_UNSUPPORTED);
    assert_int_equal(tm_chat_detect(s, strlen(s), &k, &err), TM_OK);
    assert_int_equal(k, TM_CHAT_GEMMA);
}

static void test_default_system_extraction(void **state) {
    (void)state;
    struct {
        const char *tmpl, *want; /* want NULL: no default */
    } cases[] = {
        /* escaped newline and an escaped quote inside the literal */
        {"{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nDon\\'t panic.\\tOk<|im_end|>\\n' }}{% endif %}",
         "Don't panic.\tOk"},
        /* the first occurrence is not a literal (content comes from the message), the second is */
        {"{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{% else %}"
         "{{ '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}",
         "You are Qwen."},
        {"{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>' }}", NULL},
        {"{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}", NULL},
        {"{{ '<|im_start|>system\\n<|im_end|>' }}", NULL}, /* empty */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tm_chat_template t;
        assert_int_equal(tm_chat_template_detect(cases[i].tmpl, strlen(cases[i].tmpl), &t, NULL), TM_OK);
        assert_int_equal(t.kind, TM_CHAT_CHATML);
        if (!cases[i].want)
            assert_null(t.default_system);
        else
            assert_string_equal(t.default_system, cases[i].want);
        tm_chat_template_free(&t);
    }
    /* the SmolLM2 template, read from the GGUF by gen_chat_golden.py */
    size_t len;
    char *tmpl = read_file(DATA "smollm2.jinja", &len);
    tm_chat_template t;
    assert_int_equal(tm_chat_template_detect(tmpl, len, &t, NULL), TM_OK);
    assert_string_equal(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    /* the default goes in only when the first message is not a system message */
    tm_chat_msg m1[] = {{"user", "Hi"}}, m2[] = {{"system", "Mine"}, {"user", "Hi"}};
    char *out = NULL;
    assert_int_equal(tm_chat_template_apply(&t, m1, 1, true, &out, NULL), TM_OK);
    assert_string_equal(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                             "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    assert_int_equal(tm_chat_template_apply(&t, m2, 2, false, &out, NULL), TM_OK);
    assert_string_equal(out, "<|im_start|>system\nMine<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    free(out);
    /* --chat-template chatml (by name) is plain ChatML: no default */
    assert_int_equal(tm_chat_apply(TM_CHAT_CHATML, m1, 1, true, &out, NULL), TM_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    tm_chat_template_free(&t);
    tm_chat_template_free(&t); /* idempotent */
    free(tmpl);
}

/* ---- names ---------------------------------------------------------------------------------------- */

static void test_names(void **state) {
    (void)state;
    const char *names[] = {"chatml", "llama3", "llama2", "mistral", "gemma"};
    for (int k = 0; k < TM_CHAT_COUNT; k++) {
        tm_chat_kind got = TM_CHAT_COUNT;
        assert_int_equal(tm_chat_from_name(names[k], &got, NULL), TM_OK);
        assert_int_equal(got, (tm_chat_kind)k);
        assert_string_equal(tm_chat_name((tm_chat_kind)k), names[k]);
    }
    const char *bad[] = {"ChatML", "llama", "mistral-v3", "", "vicuna"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tm_chat_kind got = TM_CHAT_COUNT;
        tm_error err = {0};
        assert_int_equal(tm_chat_from_name(bad[i], &got, &err), TM_ERR_UNSUPPORTED);
        assert_int_equal(got, TM_CHAT_COUNT);
        assert_non_null(strstr(err.msg, "known: chatml, llama3, llama2, mistral, gemma"));
    }
    tm_chat_kind got;
    assert_int_equal(tm_chat_from_name(NULL, &got, NULL), TM_ERR_UNSUPPORTED);
    assert_string_equal(tm_chat_name(TM_CHAT_COUNT), "unknown");
}

/* ---- errors and documented choices ---------------------------------------------------------------- */

static void expect_invalid(tm_chat_kind k, const tm_chat_msg *m, size_t n, const char *needle) {
    tm_error err = {0};
    char *out = (char *)&err;
    assert_int_equal(tm_chat_apply(k, m, n, true, &out, &err), TM_ERR_INVALID);
    assert_null(out);
    if (!strstr(err.msg, needle)) fail_msg("%s: message '%s' lacks '%s'", tm_chat_name(k), err.msg, needle);
}

static void test_errors(void **state) {
    (void)state;
    tm_chat_msg ok[] = {{"user", "hi"}};
    tm_chat_msg bad_role[] = {{"user", "hi"}, {"tool", "x"}};
    tm_chat_msg upper_role[] = {{"User", "hi"}};
    tm_chat_msg null_role[] = {{NULL, "hi"}};
    tm_chat_msg null_content[] = {{"user", NULL}};
    for (int k = 0; k < TM_CHAT_COUNT; k++) {
        expect_invalid((tm_chat_kind)k, ok, 0, "empty");
        expect_invalid((tm_chat_kind)k, NULL, 3, "empty");
        expect_invalid((tm_chat_kind)k, bad_role, 2, "'tool'");
        expect_invalid((tm_chat_kind)k, upper_role, 1, "'User'");
        expect_invalid((tm_chat_kind)k, null_role, 1, "role");
        expect_invalid((tm_chat_kind)k, null_content, 1, "content");
    }
    tm_chat_msg mid_sys[] = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}, {"user", "d"}};
    tm_chat_msg only_sys[] = {{"system", "a"}};
    tm_chat_msg two_asst[] = {{"user", "a"}, {"assistant", "b"}, {"assistant", "c"}};
    const tm_chat_kind strict[] = {TM_CHAT_LLAMA2, TM_CHAT_MISTRAL, TM_CHAT_GEMMA};
    for (int i = 0; i < 3; i++) {
        expect_invalid(strict[i], mid_sys, 4, "system message only as the first");
        expect_invalid(strict[i], only_sys, 1, "needs a user message");
        expect_invalid(strict[i], two_asst, 3, "alternating");
    }
    /* chatml and llama3 render any order of the three roles */
    char *out = NULL;
    assert_int_equal(tm_chat_apply(TM_CHAT_LLAMA3, two_asst, 3, false, &out, NULL), TM_OK);
    free(out);
    tm_error err = {0};
    assert_int_equal(tm_chat_template_apply(NULL, ok, 1, false, &out, &err), TM_ERR_INVALID);
    assert_int_equal(tm_chat_apply((tm_chat_kind)99, ok, 1, false, &out, &err), TM_ERR_INVALID);
    assert_int_equal(tm_chat_apply(TM_CHAT_CHATML, ok, 1, false, NULL, &err), TM_ERR_INVALID);
}

static void test_bos_and_folding(void **state) {
    (void)state;
    tm_chat_msg m[] = {{"system", "Sys "}, {"user", " Hi "}, {"assistant", " Yo "}, {"user", "More"}};
    const char *bos[] = {"<s>", "<|begin_of_text|>", "<bos>"};
    for (int k = 0; k < TM_CHAT_COUNT; k++) {
        char *out = NULL;
        assert_int_equal(tm_chat_apply((tm_chat_kind)k, m, 4, true, &out, NULL), TM_OK);
        for (size_t b = 0; b < 3; b++) /* the tokenizer adds BOS: never in the rendered text */
            assert_true(strncmp(out, bos[b], strlen(bos[b])) != 0);
        free(out);
    }
    /* legacy Mistral and Gemma 1/2 fold a system message into the first user turn (their templates raise) */
    size_t len;
    char *tmpl = read_file(DATA "mistral-legacy.jinja", &len);
    tm_chat_template t;
    assert_int_equal(tm_chat_template_detect(tmpl, len, &t, NULL), TM_OK);
    assert_int_equal(t.variant, TM_CHAT_VARIANT_MISTRAL_LEGACY);
    char *out = NULL;
    assert_int_equal(tm_chat_template_apply(&t, m, 4, true, &out, NULL), TM_OK);
    assert_string_equal(out, "[INST] Sys \n\n Hi  [/INST] Yo </s>[INST] More [/INST]");
    free(out);
    tm_chat_template_free(&t);
    free(tmpl);
    tmpl = read_file(DATA "gemma.jinja", &len);
    assert_int_equal(tm_chat_template_detect(tmpl, len, &t, NULL), TM_OK);
    assert_int_equal(tm_chat_template_apply(&t, m, 4, true, &out, NULL), TM_OK);
    assert_string_equal(out, "<start_of_turn>user\nSys \n\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"
                             "<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    tm_chat_template_free(&t);
    free(tmpl);
    /* llama3 strips contents the way Jinja's trim does; invalid UTF-8 bytes are content, not space */
    tm_chat_msg w[] = {{"user", "\xa0\x85 x \xc2"}, {"user", "\xe3\x80\x80y\xc2\xa0"}};
    assert_int_equal(tm_chat_apply(TM_CHAT_LLAMA3, w, 2, false, &out, NULL), TM_OK);
    assert_string_equal(out, "<|start_header_id|>user<|end_header_id|>\n\n\xa0\x85 x \xc2<|eot_id|>"
                             "<|start_header_id|>user<|end_header_id|>\n\ny<|eot_id|>");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_detect_markers),
        cmocka_unit_test(test_default_system_extraction),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_bos_and_folding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
