/* simple.c -- the public C API in one page: load a model, tokenize a prompt, stream a completion. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenmill.h"

static bool print_token(void *user, const tm_token_event *ev) {
    (void)user;
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    return true; /* false would stop generation */
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N]\n", argv[0]);
        return 2;
    }
    tm_error err = {0};
    tm_load_params lp = tm_load_params_default();
    lp.model = argv[1];
    tm_ctx *ctx = NULL;
    if (tm_load(&lp, &ctx, &err) != TM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    tm_generate_params gp = tm_generate_params_default();
    gp.temperature = 0.0f; /* greedy */
    gp.max_tokens = argc > 3 ? (int32_t)strtol(argv[3], NULL, 10) : 32;
    tm_generate_result res;
    int rc = 0;
    if (tm_tokenize(ctx, argv[2], strlen(argv[2]), true, false, &ids, &n, &err) != TM_OK ||
        tm_generate(ctx, ids, n, &gp, print_token, NULL, &res, &err) != TM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
    } else {
        printf("\n[%d prompt tokens, %d generated, %.1f tok/s, finish: %s]\n", res.prompt_tokens, res.tokens,
               res.decode_tok_s, res.finish_reason);
    }
    tm_free_buf(ids);
    tm_free(ctx);
    return rc;
}
