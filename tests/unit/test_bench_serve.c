/* test_bench_serve.c -- bench serve's pure helpers: SSE parsing, chunk reading, goodput SLOs, Poisson arrivals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the helpers live in the tool, not the library: compile them here */
#include "tools/tm_bench_serve_util.c"

/* ---- SSE ---------------------------------------------------------------------------------------------- */

typedef struct events {
    char data[16][128];
    int n;
    int stop_at; /* return nonzero on this event (1-based); 0 = never */
} events;

static int collect(void *ud, const char *data, size_t len) {
    events *e = ud;
    assert_int_equal(strlen(data), len); /* NUL-terminated at len */
    assert_true(e->n < 16);
    assert_true(len < sizeof e->data[0]);
    memcpy(e->data[e->n], data, len + 1);
    e->n++;
    return e->n == e->stop_at ? 7 : 0;
}

static void feed_all(tm_bs_sse *p, const char *s, size_t piece, events *e) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i += piece) {
        size_t k = n - i < piece ? n - i : piece;
        assert_int_equal(tm_bs_sse_feed(p, s + i, k, collect, e), 0);
    }
}

static const char *k_stream =
    ": keep-alive comment\r\n"
    "event: message\r\n"
    "data: {\"a\":1}\r\n"
    "\r\n"
    "data:{\"b\":2}\n"
    "id: 7\n"
    "\n"
    "data: line one\n"
    "data: line two\n"
    "retry: 100\n"
    "\n"
    "\n" /* a blank line with no data dispatches nothing */
    "data\n"
    "\n"
    "data: [DONE]\n"
    "\n";

static void test_sse_any_split(void **state) {
    (void)state;
    /* every piece size, down to one byte at a time (\r\n split between feeds included) */
    for (size_t piece = 1; piece <= strlen(k_stream); piece++) {
        tm_bs_sse p;
        tm_bs_sse_init(&p, 1024);
        events e = {0};
        feed_all(&p, k_stream, piece, &e);
        assert_int_equal(tm_bs_sse_finish(&p, collect, &e), 0);
        assert_int_equal(e.n, 5);
        assert_string_equal(e.data[0], "{\"a\":1}");
        assert_string_equal(e.data[1], "{\"b\":2}");
        assert_string_equal(e.data[2], "line one\nline two");
        assert_string_equal(e.data[3], ""); /* "data" without a colon: an empty data line */
        assert_string_equal(e.data[4], "[DONE]");
        tm_bs_sse_free(&p);
    }
}

static void test_sse_finish_and_stop(void **state) {
    (void)state;
    tm_bs_sse p;
    tm_bs_sse_init(&p, 1024);
    events e = {0};
    /* the stream ends without the final blank line, even mid-line */
    assert_int_equal(tm_bs_sse_feed(&p, "data: x\n\ndata: tail", 19, collect, &e), 0);
    assert_int_equal(e.n, 1);
    assert_int_equal(tm_bs_sse_finish(&p, collect, &e), 0);
    assert_int_equal(e.n, 2);
    assert_string_equal(e.data[1], "tail");
    assert_int_equal(tm_bs_sse_finish(&p, collect, &e), 0); /* nothing pending any more */
    assert_int_equal(e.n, 2);
    tm_bs_sse_free(&p);

    /* a callback's nonzero return stops the feed and comes back */
    tm_bs_sse_init(&p, 1024);
    events s = {.stop_at = 2};
    assert_int_equal(tm_bs_sse_feed(&p, "data: 1\n\ndata: 2\n\ndata: 3\n\n", 27, collect, &s), 7);
    assert_int_equal(s.n, 2);
    tm_bs_sse_free(&p);
}

static void test_sse_limits(void **state) {
    (void)state;
    tm_bs_sse p;
    tm_bs_sse_init(&p, 16);
    events e = {0};
    /* a line longer than the limit, in one piece or spread over feeds */
    assert_int_equal(tm_bs_sse_feed(&p, "data: 0123456789abcdef\n", 23, collect, &e), -1);
    tm_bs_sse_free(&p);
    tm_bs_sse_init(&p, 16);
    assert_int_equal(tm_bs_sse_feed(&p, "data: 01234", 11, collect, &e), 0);
    assert_int_equal(tm_bs_sse_feed(&p, "56789abcdef", 11, collect, &e), -1);
    tm_bs_sse_free(&p);
    /* an event of many short lines over the limit */
    tm_bs_sse_init(&p, 16);
    assert_int_equal(tm_bs_sse_feed(&p, "data: 0123\ndata: 4567\ndata: 89ab\ndata: cdef\n", 44, collect, &e), -1);
    assert_int_equal(e.n, 0);
    tm_bs_sse_free(&p);
}

/* ---- chunks ------------------------------------------------------------------------------------------- */

static tm_bs_chunk parse(const char *s) {
    tm_bs_chunk c;
    tm_bs_parse_chunk(s, strlen(s), &c);
    return c;
}

static void test_chunks(void **state) {
    (void)state;
    tm_bs_chunk c = parse("[DONE]");
    assert_int_equal(c.kind, TM_BS_CHUNK_DONE);
    assert_int_equal(parse(" [DONE]\r").kind, TM_BS_CHUNK_DONE);

    c = parse("{\"choices\":[{\"index\":0,\"text\":\"Hello\",\"finish_reason\":null}]}");
    assert_int_equal(c.kind, TM_BS_CHUNK_DATA);
    assert_true(c.has_content);
    assert_int_equal(c.completion_tokens, -1);
    assert_int_equal(c.prompt_tokens, -1);

    c = parse("{\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}");
    assert_int_equal(c.kind, TM_BS_CHUNK_DATA);
    assert_false(c.has_content);

    c = parse("{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}");
    assert_false(c.has_content);
    c = parse("{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}");
    assert_true(c.has_content);
    c = parse("{\"choices\":[{\"delta\":{\"content\":null,\"reasoning_content\":\"hmm\"}}]}");
    assert_true(c.has_content);

    c = parse("{\"choices\":[],\"usage\":{\"prompt_tokens\":128,\"completion_tokens\":64,\"total_tokens\":192}}");
    assert_int_equal(c.kind, TM_BS_CHUNK_DATA);
    assert_false(c.has_content);
    assert_int_equal(c.prompt_tokens, 128);
    assert_int_equal(c.completion_tokens, 64);
    /* usage: null (vLLM's content chunks with include_usage) and garbage counts are "absent" */
    c = parse("{\"choices\":[{\"text\":\"x\"}],\"usage\":null}");
    assert_true(c.has_content);
    assert_int_equal(c.completion_tokens, -1);
    c = parse("{\"usage\":{\"prompt_tokens\":-3,\"completion_tokens\":\"9\"}}");
    assert_int_equal(c.prompt_tokens, -1);
    assert_int_equal(c.completion_tokens, -1);

    c = parse("{\"error\":{\"message\":\"out of \\\"memory\\\"\",\"code\":500}}");
    assert_int_equal(c.kind, TM_BS_CHUNK_ERROR);
    assert_string_equal(c.msg, "out of ?memory?");
    c = parse("{\"error\":\"plain\"}");
    assert_int_equal(c.kind, TM_BS_CHUNK_ERROR);
    assert_string_equal(c.msg, "plain");
    assert_int_equal(parse("{\"error\":null,\"choices\":[{\"text\":\"a\"}]}").kind, TM_BS_CHUNK_DATA);

    c = parse("{not json");
    assert_int_equal(c.kind, TM_BS_CHUNK_BAD);
    assert_string_equal(c.msg, "{not json");
    assert_int_equal(parse("[1,2]").kind, TM_BS_CHUNK_BAD);
    assert_int_equal(parse("").kind, TM_BS_CHUNK_BAD);
    assert_int_equal(parse("\"text\"").kind, TM_BS_CHUNK_BAD);
}

/* ---- goodput ------------------------------------------------------------------------------------------ */

static void test_goodput_parse(void **state) {
    (void)state;
    tm_bs_slo s;
    char err[160];
    assert_true(tm_bs_parse_goodput("ttft:500,tpot:50", &s, err, sizeof err));
    assert_true(s.ttft_ms == 500 && s.tpot_ms == 50 && s.e2e_ms == 0);
    assert_true(tm_bs_parse_goodput("e2e:2500.5,ttft:0.25", &s, err, sizeof err));
    assert_true(s.ttft_ms == 0.25 && s.tpot_ms == 0 && s.e2e_ms == 2500.5);
    assert_true(tm_bs_parse_goodput("e2el:10", &s, err, sizeof err));
    assert_true(s.e2e_ms == 10);
    const char *bad[] = {"", "ttft", "ttft:", "ttft:0", "ttft:-5", "ttft:abc", "ttft:5ms", "itl:5", "ttft:5,",
                         "ttft:5,,tpot:3", "ttft:5,ttft:6", "ttft:inf", "ttft:nan", ",ttft:5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_false(tm_bs_parse_goodput(bad[i], &s, err, sizeof err));
        assert_true(err[0] != '\0');
    }
}

static void test_goodput_meets(void **state) {
    (void)state;
    tm_bs_slo s = {.ttft_ms = 100, .tpot_ms = 10};
    assert_true(tm_bs_meets_slo(&s, 100, 10, 1e9));  /* bounds are inclusive; e2e not set */
    assert_false(tm_bs_meets_slo(&s, 100.01, 5, 1));
    assert_false(tm_bs_meets_slo(&s, 50, 10.5, 1));
    assert_true(tm_bs_meets_slo(&s, 50, -1, 1));     /* one-token answer: no TPOT */
    assert_false(tm_bs_meets_slo(&s, NAN, 5, 1));
    tm_bs_slo e = {.e2e_ms = 300};
    assert_true(tm_bs_meets_slo(&e, 1e9, 1e9, 300));
    assert_false(tm_bs_meets_slo(&e, 0, 0, 301));
    tm_bs_slo none = {0};
    assert_true(tm_bs_meets_slo(&none, 1e9, 1e9, 1e9));
}

/* ---- arrivals ----------------------------------------------------------------------------------------- */

static void test_arrivals_poisson(void **state) {
    (void)state;
    enum { N = 20001 };
    double *t = malloc(N * sizeof *t);
    assert_non_null(t);
    const double rate = 4.0;
    tm_bs_arrivals(rate, N, 42, t);
    assert_true(t[0] == 0.0);
    double sum = 0, sum2 = 0, below = 0;
    for (int i = 1; i < N; i++) {
        double g = t[i] - t[i - 1];
        assert_true(g >= 0 && isfinite(g));
        sum += g;
        sum2 += g * g;
        below += g < log(2.0) / rate; /* the median of an exponential */
    }
    double n = N - 1, mean = sum / n, var = sum2 / n - mean * mean;
    /* mean 1/rate = 0.25 (standard error 0.25/sqrt(20000) = 0.0018), sd = mean (exponential),
     * half the gaps below the median: a constant or uniform spacing fails all three */
    assert_true(fabs(mean - 0.25) < 0.01);
    assert_true(fabs(sqrt(var) / mean - 1.0) < 0.05);
    assert_true(fabs(below / n - 0.5) < 0.02);
    /* the same seed gives the same schedule, another seed another one */
    double *u = malloc(N * sizeof *u);
    assert_non_null(u);
    tm_bs_arrivals(rate, N, 42, u);
    assert_memory_equal(t, u, N * sizeof *t);
    tm_bs_arrivals(rate, N, 43, u);
    assert_true(u[1] != t[1]);
    free(u);
    free(t);
}

static void test_arrivals_all_at_once(void **state) {
    (void)state;
    double t[5] = {1, 1, 1, 1, 1};
    tm_bs_arrivals(INFINITY, 5, 1, t);
    for (int i = 0; i < 5; i++) assert_true(t[i] == 0.0);
    double u[3] = {1, 1, 1};
    tm_bs_arrivals(0.0, 3, 1, u);
    for (int i = 0; i < 3; i++) assert_true(u[i] == 0.0);
    tm_bs_arrivals(1.0, 0, 1, NULL); /* nothing to do */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_any_split),    cmocka_unit_test(test_sse_finish_and_stop),
        cmocka_unit_test(test_sse_limits),       cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_goodput_parse),    cmocka_unit_test(test_goodput_meets),
        cmocka_unit_test(test_arrivals_poisson), cmocka_unit_test(test_arrivals_all_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
