/* test_cuda_lazy.c -- the cuda backend's records of bf16 outputs left unwritten (tm_cuda_lazy.h), on the host: the
 * order in which the forward pass of an fp8 model writes and reads its buffers remakes only the last norm's output
 * (for the output projection), a record whose source was overwritten reports the loss, and the records run out;
 * norm-in's raw records: found in place by the products that norm their input, remade for any other reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/cuda/tm_cuda_lazy.h"

/* stand-ins for the pass's buffers: only their addresses matter */
static char x[1], xb[1], q[1], att[1], proj[1], hb[1], ffn_tmp[1], hsel[1];
static tm_weight attn_norm[2], ffn_norm[2], out_norm;

typedef struct sim {
    tm_lazy l;
    int remakes, lost;
    const void *remade_src;
    const tm_weight *remade_w;
} sim;

static void rd(sim *s, const void *p) {
    tm_lazy_rec r;
    tm_lazy_state st = tm_lazy_read(&s->l, p, &r);
    if (st == TM_LAZY_REMAKE) {
        s->remakes++;
        s->remade_src = r.src;
        s->remade_w = r.w;
    }
    if (st == TM_LAZY_LOST) s->lost++;
}

/* an op writes p (its output, or the residual it updates) */
static void wr(sim *s, const void *p) { tm_lazy_write(&s->l, p); }

/* add+RMSNorm of an fp8 model: residual += x_in, out's e4m3 copy only */
static void norm(sim *s, const void *x_in, const tm_weight *w) {
    rd(s, x_in);
    wr(s, xb);
    wr(s, x);
    assert_true(tm_lazy_add(&s->l, (tm_lazy_rec){.buf = xb, .src = x, .w = w, .eps = 1e-5f, .n = 16, .dim = 64}));
}

static void test_forward_order(void **st) {
    (void)st;
    sim s = {0};
    tm_lazy_reset(&s.l);
    wr(&s, x); /* embed */
    rd(&s, x);
    wr(&s, xb); /* the first layer's plain norm (no residual add), e4m3 copy only */
    assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = xb, .src = x, .w = &attn_norm[0], .n = 16, .dim = 64}));
    for (int l = 0; l < 2; l++) {
        wr(&s, ffn_tmp); /* q|k|v as one product from xb's e4m3 copy (no bf16 read), into ffn_tmp */
        wr(&s, q);       /* RoPE: q from the product's rows */
        rd(&s, q);
        wr(&s, att); /* attention */
        rd(&s, att);
        wr(&s, proj);               /* o, from its own rounding of att */
        norm(&s, proj, &ffn_norm[l]); /* x += proj; xb = norm(x), e4m3 only */
        wr(&s, hb);                 /* gate|up as one product into ffn_tmp, then the SwiGLU's e4m3 copy only */
        wr(&s, ffn_tmp);
        assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = hb, .src = ffn_tmp, .n = 16, .dim = 96}));
        wr(&s, proj); /* down, from hb's copy */
        norm(&s, proj, l == 1 ? &out_norm : &attn_norm[l + 1]);
    }
    assert_int_equal(s.remakes, 0); /* nothing read a bf16 output left unwritten */
    rd(&s, xb); /* the output projection's get_rows: the final norm's output, made now from the residual */
    wr(&s, hsel);
    assert_int_equal(s.remakes, 1);
    assert_ptr_equal(s.remade_src, x);
    assert_ptr_equal(s.remade_w, &out_norm);
    rd(&s, xb); /* written now: nothing more to do */
    assert_int_equal(s.remakes, 1);
    assert_int_equal(s.lost, 0);
    /* hb is still unwritten and its product still in ffn_tmp: a read remakes it */
    rd(&s, hb);
    assert_int_equal(s.remakes, 2);
    assert_ptr_equal(s.remade_src, ffn_tmp);
    assert_null(s.remade_w);
}

static void test_lost_and_full(void **st) {
    (void)st;
    sim s = {0};
    tm_lazy_reset(&s.l);
    assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = hb, .src = ffn_tmp, .n = 4, .dim = 8}));
    wr(&s, ffn_tmp); /* the next q|k|v product overwrites the SwiGLU's input */
    rd(&s, hb);
    assert_int_equal(s.lost, 1);
    assert_int_equal(s.remakes, 0);
    rd(&s, hb); /* reported once: the record is gone */
    assert_int_equal(s.lost, 1);
    rd(&s, NULL);
    assert_int_equal(s.lost + s.remakes, 1);
    /* a buffer written again drops its record without a remake */
    assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = xb, .src = x, .w = &attn_norm[0], .n = 4, .dim = 8}));
    wr(&s, xb);
    rd(&s, xb);
    assert_int_equal(s.remakes, 0);
    /* four records at most */
    static char b[5][1];
    for (int k = 0; k < TM_LAZY_MAX; k++) assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = b[k], .src = x}));
    assert_false(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = b[4], .src = x}));
    wr(&s, b[2]);
    assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = b[4], .src = x}));
    tm_lazy_reset(&s.l); /* a new pass */
    for (int k = 0; k < 5; k++) rd(&s, b[k]);
    assert_int_equal(s.remakes + s.lost, 1);
}

/* norm-in (bf16 weights at a decode step): o and down add into x and leave x rounded in xb with a raw record; q|k|v
 * and gate/up peek at it and read xb raw (no remake); the output projection's get_rows reads xb: remade then */
static void test_raw_records(void **st) {
    (void)st;
    sim s = {0};
    tm_lazy_reset(&s.l);
    tm_lazy_rec r;
    assert_false(tm_lazy_peek_raw(&s.l, xb, &r)); /* the first layer's plain norm wrote xb: nothing recorded */
    for (int l = 0; l < 2; l++) {
        wr(&s, q); /* q|k|v, reading xb (raw from layer 1 on: peeked, not read) */
        wr(&s, att);
        rd(&s, att);
        wr(&s, x);  /* o's epilogue: x += o */
        wr(&s, xb); /* ... and xb = bf16(x) */
        assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = xb, .src = x, .w = &ffn_norm[l], .eps = 1e-5f, .n = 1,
                                                    .dim = 64, .raw = true}));
        assert_true(tm_lazy_peek_raw(&s.l, xb, &r)); /* gate/up norms xb as it reads it */
        assert_ptr_equal(r.w, &ffn_norm[l]);
        assert_ptr_equal(r.src, x);
        assert_true(tm_lazy_peek_raw(&s.l, xb, &r)); /* still there: the peek leaves it */
        wr(&s, hb);
        rd(&s, hb);
        wr(&s, x); /* down's epilogue */
        wr(&s, xb);
        assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = xb, .src = x, .w = l == 1 ? &out_norm : &attn_norm[l + 1],
                                                    .eps = 1e-5f, .n = 1, .dim = 64, .raw = true}));
    }
    assert_int_equal(s.remakes, 0);
    rd(&s, xb); /* get_rows: the final norm made from x */
    assert_int_equal(s.remakes, 1);
    assert_ptr_equal(s.remade_w, &out_norm);
    assert_false(tm_lazy_peek_raw(&s.l, xb, &r)); /* made: no record left */
    /* a non-raw record (fp8: xb left unwritten) is never taken as raw; a raw one whose source is gone is not either */
    assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = xb, .src = x, .w = &attn_norm[0], .n = 1, .dim = 64}));
    assert_false(tm_lazy_peek_raw(&s.l, xb, &r));
    wr(&s, xb);
    assert_true(tm_lazy_add(&s.l, (tm_lazy_rec){.buf = xb, .src = x, .w = &attn_norm[0], .n = 1, .dim = 64,
                                                .raw = true}));
    wr(&s, x);
    assert_false(tm_lazy_peek_raw(&s.l, xb, &r));
    rd(&s, xb);
    assert_int_equal(s.lost, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_order),
        cmocka_unit_test(test_lost_and_full),
        cmocka_unit_test(test_raw_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
