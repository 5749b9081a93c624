/* test_kv.c -- KV block pool and prefix cache: accounting, refcounts and sharing, prefix hits, the leave-one-token
 * rule, LRU eviction order, forced hash collisions, rollback, exhaustion, caching off, and a randomized run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/tm_fp8.h"
#include "kv/tm_kv.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

static void pool_cfg(tm_kv_pool *p, int32_t n_blocks, int32_t bs, bool off, int32_t hash_bits) {
    tm_kv_pool_cfg cfg = {.n_blocks = n_blocks, .block_size = bs, .disable_prefix_cache = off, .test_hash_bits = hash_bits};
    tm_error err = {0};
    tm_status s = tm_kv_pool_init_cfg(p, &cfg, &err);
    if (s != TM_OK) fail_msg("pool init: %s", err.msg);
}

static void check(const tm_kv_pool *p) {
    tm_error err = {0};
    if (tm_kv_pool_check(p, &err) != TM_OK) fail_msg("pool invariant: %s", err.msg);
}

static tm_kv_stats stats(const tm_kv_pool *p) {
    tm_kv_stats s;
    tm_kv_get_stats(p, &s);
    return s;
}

/* n token ids from a small LCG: distinct prompts per seed */
static void make_tokens(int32_t *t, int32_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)(x >> 8) % 50000;
    }
}

/* What the engine does with a prompt: look up the prefix, reserve the rest, "run" it, record it. */
static int32_t admit(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tok, int32_t n) {
    tm_error err = {0};
    int32_t cached = -1;
    assert_int_equal(tm_kv_seq_match_prefix(p, s, tok, n, &cached, &err), TM_OK);
    assert_int_equal(s->n_tokens, cached);
    assert_int_equal(tm_kv_seq_reserve(p, s, n - cached, &err), TM_OK);
    assert_int_equal(tm_kv_seq_append_tokens(p, s, tok + cached, n - cached, &err), TM_OK);
    assert_int_equal(s->n_tokens, n);
    check(p);
    return cached;
}

/* One decode step: reserve and record one token. */
static void decode(tm_kv_pool *p, tm_kv_seq *s, int32_t tok) {
    tm_error err = {0};
    assert_int_equal(tm_kv_seq_reserve(p, s, 1, &err), TM_OK);
    assert_int_equal(tm_kv_seq_append_tokens(p, s, &tok, 1, &err), TM_OK);
}

/* The chained hash as documented in tm_kv.h, for building forced collisions. */
static uint64_t chain_hash(uint64_t parent, const int32_t *tok, int32_t bs, uint64_t mask) {
    return XXH3_64bits_withSeed(tok, (size_t)bs * sizeof(int32_t), parent) & mask;
}

/* ---- accounting --------------------------------------------------------------------------------- */

static void test_alloc_accounting(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 8, 4, false, 0);
    assert_int_equal(tm_kv_n_free(&p), 8);
    assert_true(tm_kv_usage(&p) == 0.0);
    int32_t ids[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = tm_kv_block_alloc(&p);
        assert_int_equal(ids[i], i); /* fresh pool hands out 0, 1, 2, ... */
        assert_int_equal(p.refcount[i], 1);
    }
    assert_int_equal(tm_kv_block_alloc(&p), -1);
    assert_int_equal(tm_kv_n_free(&p), 0);
    assert_false(tm_kv_can_allocate(&p, 1));
    assert_true(tm_kv_can_allocate(&p, 0));
    assert_true(tm_kv_usage(&p) == 1.0);
    check(&p);
    tm_kv_block_ref(&p, ids[3]);
    assert_int_equal(p.refcount[3], 2);
    for (int i = 0; i < 8; i++) tm_kv_block_unref(&p, ids[i]);
    assert_int_equal(tm_kv_n_free(&p), 7); /* block 3 still held once */
    assert_true(tm_kv_usage(&p) == 1.0 / 8.0);
    tm_kv_stats s = stats(&p);
    assert_int_equal(s.blocks_used, 1);
    assert_int_equal(s.blocks_unused, 7);
    assert_int_equal(s.blocks_cached_free, 0);
    tm_kv_block_unref(&p, ids[3]);
    assert_int_equal(tm_kv_n_free(&p), 8);
    assert_int_equal(stats(&p).blocks_used, 0);
    check(&p);
    tm_kv_pool_free(&p);

    tm_error err = {0};
    assert_int_equal(tm_kv_pool_init(&p, 0, 16, &err), TM_ERR_INVALID);
    assert_int_equal(tm_kv_pool_init(&p, 4, 0, &err), TM_ERR_INVALID);
    assert_int_equal(tm_kv_pool_init(&p, 4, 2048, &err), TM_ERR_INVALID);
    tm_kv_pool_cfg bad = {.n_blocks = 4, .block_size = 4, .test_hash_bits = 64};
    assert_int_equal(tm_kv_pool_init_cfg(&p, &bad, &err), TM_ERR_INVALID);
}

static void test_seq_reserve_slot_release(void **st) {
    (void)st;
    tm_kv_pool p;
    tm_error err = {0};
    assert_int_equal(tm_kv_pool_init(&p, 10, 4, &err), TM_OK);
    tm_kv_seq a = {0}, b = {0};
    assert_int_equal(tm_kv_seq_blocks_needed(&p, &a, 10), 3);
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 10, &err), TM_OK);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(a.n_tokens, 0); /* reserve does not write */
    assert_int_equal(tm_kv_seq_reserve(&p, &b, 5, &err), TM_OK);
    assert_int_equal(tm_kv_n_free(&p), 5);
    /* slots follow the block table */
    for (int32_t i = 0; i < 12; i++)
        assert_int_equal(tm_kv_seq_slot(&p, &a, i), (int64_t)a.blocks[i / 4] * 4 + i % 4);
    assert_int_equal(tm_kv_seq_slot(&p, &b, 5), (int64_t)b.blocks[1] * 4 + 1);
    /* the runner's way: reserve, then advance n_tokens itself; reserve inside the last block allocates nothing */
    a.n_tokens = 10;
    assert_int_equal(tm_kv_seq_blocks_needed(&p, &a, 2), 0);
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 2, &err), TM_OK);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 3, &err), TM_OK);
    assert_int_equal(a.n_blocks, 4);
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 0, &err), TM_OK);
    assert_int_equal(tm_kv_seq_reserve(&p, &a, -3, &err), TM_OK);
    assert_int_equal(a.n_blocks, 4);
    check(&p);
    tm_kv_seq_release(&p, &a);
    assert_null(a.blocks);
    assert_int_equal(a.n_blocks, 0);
    tm_kv_seq_release(&p, &b);
    assert_int_equal(tm_kv_n_free(&p), 10); /* every block back in the pool */
    assert_int_equal(stats(&p).blocks_committed, 0); /* nothing was recorded, nothing cached */
    check(&p);
    tm_kv_pool_free(&p);
}

/* ---- prefix caching ----------------------------------------------------------------------------- */

static void test_identical_prompts_share_blocks(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 16, 4, false, 0);
    int32_t tok[10];
    make_tokens(tok, 10, 1);
    tm_kv_seq a = {0}, b = {0}, c = {0};
    assert_int_equal(admit(&p, &a, tok, 10), 0);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(a.n_hashed, 2); /* two full blocks committed, the partial third is not */
    assert_int_equal(stats(&p).blocks_committed, 2);
    assert_int_equal(admit(&p, &b, tok, 10), 8);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    assert_int_not_equal(b.blocks[2], a.blocks[2]); /* the partial tail is private */
    assert_int_equal(p.refcount[a.blocks[0]], 2);
    assert_int_equal(p.refcount[a.blocks[1]], 2);
    assert_int_equal(p.refcount[a.blocks[2]], 1);
    assert_int_equal(tm_kv_n_free(&p), 12); /* 4 blocks for 2 sequences of 3 */
    tm_kv_stats s = stats(&p);
    assert_int_equal(s.prefix_queries, 2);
    assert_int_equal(s.query_tokens, 20);
    assert_int_equal(s.query_blocks, 4);
    assert_int_equal(s.hit_tokens, 8);
    assert_int_equal(s.hit_blocks, 2);
    assert_int_equal(s.blocks_used, 4);
    /* both decode the same tokens: the third block fills in both, the second fill is deduplicated */
    decode(&p, &a, 7);
    decode(&p, &a, 9);
    decode(&p, &b, 7);
    int32_t b_tail = b.blocks[2];
    decode(&p, &b, 9);
    assert_int_equal(b.blocks[2], a.blocks[2]);
    assert_int_equal(p.refcount[a.blocks[2]], 2);
    assert_int_equal(p.refcount[b_tail], 0);
    assert_int_equal(stats(&p).dedups, 1);
    check(&p);
    /* release A: the shared blocks stay with B */
    int32_t shared0 = a.blocks[0];
    tm_kv_seq_release(&p, &a);
    assert_int_equal(p.refcount[shared0], 1);
    tm_kv_seq_release(&p, &b);
    assert_int_equal(tm_kv_n_free(&p), 16); /* every block back */
    s = stats(&p);
    assert_int_equal(s.blocks_cached_free, 3); /* the committed blocks keep their contents */
    assert_int_equal(s.blocks_used, 0);
    assert_true(tm_kv_usage(&p) == 0.0);
    /* a third request revives them */
    int32_t tok2[13];
    memcpy(tok2, tok, sizeof tok);
    tok2[10] = 7, tok2[11] = 9, tok2[12] = 1;
    assert_int_equal(admit(&p, &c, tok2, 13), 12);
    assert_int_equal(c.blocks[0], shared0);
    assert_int_equal(stats(&p).blocks_cached_free, 0);
    assert_int_equal(stats(&p).evictions, 0);
    tm_kv_seq_release(&p, &c);
    assert_int_equal(tm_kv_n_free(&p), 16);
    check(&p);
    tm_kv_pool_free(&p);
}

static void test_partial_prefix_and_first_token(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 32, 4, false, 0);
    int32_t ta[20], tb[20], tc[20];
    make_tokens(ta, 20, 2);
    memcpy(tb, ta, sizeof ta);
    tb[10] ^= 1; /* diverges inside the third block */
    memcpy(tc, ta, sizeof ta);
    tc[0] += 1; /* diverges at the first token */
    tm_kv_seq a = {0}, b = {0}, c = {0};
    assert_int_equal(admit(&p, &a, ta, 20), 0);
    assert_int_equal(stats(&p).blocks_committed, 5);
    assert_int_equal(admit(&p, &b, tb, 20), 8);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    for (int j = 2; j < 5; j++) assert_int_not_equal(b.blocks[j], a.blocks[j]);
    /* B's later blocks have A's tokens (blocks 3, 4) but a different parent chain: committed separately */
    assert_int_equal(stats(&p).blocks_committed, 8);
    tm_kv_stats before = stats(&p);
    assert_int_equal(admit(&p, &c, tc, 20), 0);
    tm_kv_stats after = stats(&p);
    assert_int_equal(after.hit_tokens, before.hit_tokens);
    assert_int_equal(after.hit_blocks, before.hit_blocks);
    assert_int_equal(after.prefix_queries, before.prefix_queries + 1);
    for (int j = 0; j < 5; j++) {
        assert_int_not_equal(c.blocks[j], a.blocks[j]);
        assert_int_equal(p.refcount[c.blocks[j]], 1);
    }
    tm_kv_seq_release(&p, &a);
    tm_kv_seq_release(&p, &b);
    tm_kv_seq_release(&p, &c);
    assert_int_equal(tm_kv_n_free(&p), 32);
    check(&p);
    tm_kv_pool_free(&p);
}

static void test_leave_one_token(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 16, 4, false, 0);
    int32_t tok[9];
    make_tokens(tok, 9, 3);
    tm_kv_seq a = {0}, s = {0};
    tm_error err = {0};
    int32_t cached;
    assert_int_equal(admit(&p, &a, tok, 8), 0); /* two full blocks, both committed */
    assert_int_equal(a.n_hashed, 2);
    /* the same 8-token prompt: only the first block is served, 4 tokens are left to compute */
    assert_int_equal(admit(&p, &s, tok, 8), 4);
    tm_kv_seq_release(&p, &s);
    /* one more token: both blocks served, the 9th is computed */
    assert_int_equal(admit(&p, &s, tok, 9), 8);
    tm_kv_seq_release(&p, &s);
    /* shorter prompts */
    for (int32_t n = 0; n <= 4; n++) {
        assert_int_equal(tm_kv_seq_match_prefix(&p, &s, tok, n, &cached, &err), TM_OK);
        assert_int_equal(cached, 0);
        assert_int_equal(s.n_blocks, 0);
    }
    assert_int_equal(tm_kv_seq_match_prefix(&p, &s, tok, 5, &cached, &err), TM_OK);
    assert_int_equal(cached, 4);
    tm_kv_seq_release(&p, &s);
    tm_kv_seq_release(&p, &a);
    assert_int_equal(tm_kv_n_free(&p), 16);
    check(&p);
    tm_kv_pool_free(&p);
}

static void test_lru_eviction_order(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 8, 2, false, 0);
    int32_t ta[5], tb[5];
    make_tokens(ta, 5, 10);
    make_tokens(tb, 5, 11);
    tm_kv_seq a = {0}, b = {0}, s = {0};
    admit(&p, &a, ta, 4);
    admit(&p, &b, tb, 4);
    int32_t a0 = a.blocks[0], a1 = a.blocks[1], b0 = b.blocks[0], b1 = b.blocks[1];
    tm_kv_seq_release(&p, &a); /* freed in order a1, a0 */
    tm_kv_seq_release(&p, &b); /* then b1, b0 */
    assert_int_equal(stats(&p).blocks_cached_free, 4);
    assert_int_equal(p.lru_head, a1);
    assert_int_equal(p.lru_tail, b0);
    /* B comes back: its blocks are revived and leave the LRU list */
    assert_int_equal(admit(&p, &s, tb, 5), 4);
    assert_int_equal(s.blocks[0], b0);
    assert_int_equal(s.blocks[1], b1);
    assert_int_equal(stats(&p).blocks_cached_free, 2);
    /* allocation takes never-used blocks first: 8 - 4 cached - 1 (s's tail) = 3 */
    int32_t held[8], n_held = 0;
    for (int i = 0; i < 3; i++) held[n_held++] = tm_kv_block_alloc(&p);
    assert_int_equal(stats(&p).evictions, 0);
    assert_int_equal(stats(&p).blocks_cached_free, 2);
    /* then the least recently freed cached block: a1, then a0; the revived b blocks are never evicted */
    held[n_held++] = tm_kv_block_alloc(&p);
    assert_int_equal(held[n_held - 1], a1);
    assert_int_equal(stats(&p).evictions, 1);
    assert_int_equal(stats(&p).blocks_committed, 3);
    /* a1's hash is gone: A's prompt now hits only its first block (and revives it) */
    tm_kv_seq a2 = {0};
    int32_t cached;
    tm_error err = {0};
    assert_int_equal(tm_kv_seq_match_prefix(&p, &a2, ta, 5, &cached, &err), TM_OK);
    assert_int_equal(cached, 2);
    assert_int_equal(a2.blocks[0], a0);
    tm_kv_seq_release(&p, &a2); /* a0 is the most recently freed now, and the only cached-free block */
    held[n_held++] = tm_kv_block_alloc(&p);
    assert_int_equal(held[n_held - 1], a0);
    assert_int_equal(stats(&p).evictions, 2);
    assert_int_equal(tm_kv_block_alloc(&p), -1); /* b0, b1 held by s */
    assert_int_equal(p.refcount[b0], 1);
    check(&p);
    for (int i = 0; i < n_held; i++) tm_kv_block_unref(&p, held[i]);
    tm_kv_seq_release(&p, &s);
    assert_int_equal(tm_kv_n_free(&p), 8);
    check(&p);
    tm_kv_pool_free(&p);
}

/* Release order decides eviction order: the sequence freed first is evicted first. */
static void test_lru_least_recently_freed_first(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 4, 2, false, 0);
    int32_t ta[4], tb[4];
    make_tokens(ta, 4, 20);
    make_tokens(tb, 4, 21);
    tm_kv_seq a = {0}, b = {0};
    admit(&p, &a, ta, 4);
    admit(&p, &b, tb, 4);
    int32_t a0 = a.blocks[0], a1 = a.blocks[1], b0 = b.blocks[0], b1 = b.blocks[1];
    tm_kv_seq_release(&p, &b); /* b first this time */
    tm_kv_seq_release(&p, &a);
    assert_int_equal(tm_kv_block_alloc(&p), b1);
    assert_int_equal(tm_kv_block_alloc(&p), b0);
    assert_int_equal(tm_kv_block_alloc(&p), a1);
    assert_int_equal(tm_kv_block_alloc(&p), a0);
    assert_int_equal(stats(&p).evictions, 4);
    assert_int_equal(stats(&p).blocks_committed, 0);
    for (int i = 0; i < 4; i++) tm_kv_block_unref(&p, i);
    assert_int_equal(stats(&p).blocks_unused, 4); /* evicted blocks come back as plain unused blocks */
    check(&p);
    tm_kv_pool_free(&p);
}

/* With a 1-bit hash every lookup meets colliding entries; the token check must reject them. */
static void test_forced_collision_token_check(void **st) {
    (void)st;
    const int32_t bs = 4;
    tm_kv_pool p;
    pool_cfg(&p, 16, bs, false, 1);
    int32_t ta[5], tb[5];
    make_tokens(ta, 5, 30);
    tm_kv_seq a = {0}, b = {0};
    admit(&p, &a, ta, 5);
    /* a different first block with the same (1-bit) hash */
    uint64_t ha = chain_hash(TM_KV_ROOT_HASH, ta, bs, 1);
    assert_int_equal(p.hash[a.blocks[0]], ha); /* the pool hashes as documented */
    memcpy(tb, ta, sizeof ta);
    for (int32_t v = 1;; v++) {
        tb[3] = ta[3] + v;
        if (chain_hash(TM_KV_ROOT_HASH, tb, bs, 1) == ha) break;
    }
    uint64_t coll = stats(&p).collisions;
    assert_int_equal(admit(&p, &b, tb, 5), 0);
    assert_true(stats(&p).collisions > coll);
    assert_int_not_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(stats(&p).blocks_committed, 2); /* both committed under the same hash */
    /* and each still finds its own block */
    tm_kv_seq a2 = {0}, b2 = {0};
    assert_int_equal(admit(&p, &a2, ta, 5), 4);
    assert_int_equal(admit(&p, &b2, tb, 5), 4);
    assert_int_equal(a2.blocks[0], a.blocks[0]);
    assert_int_equal(b2.blocks[0], b.blocks[0]);
    tm_kv_seq_release(&p, &a);
    tm_kv_seq_release(&p, &b);
    tm_kv_seq_release(&p, &a2);
    tm_kv_seq_release(&p, &b2);
    assert_int_equal(tm_kv_n_free(&p), 16);
    check(&p);
    tm_kv_pool_free(&p);
}

/* Equal tokens in a block but a different prefix, with colliding chain hashes: the parent check rejects it. */
static void test_forced_collision_parent_check(void **st) {
    (void)st;
    const int32_t bs = 2;
    tm_kv_pool p;
    pool_cfg(&p, 16, bs, false, 1);
    int32_t tq[5] = {100, 101, 7, 8, 0}, tp[5] = {200, 201, 7, 8, 0};
    /* make h(Y | Q) == h(Y | P) under the 1-bit hash */
    for (;; tq[1]++) {
        uint64_t hq = chain_hash(TM_KV_ROOT_HASH, tq, bs, 1), hp = chain_hash(TM_KV_ROOT_HASH, tp, bs, 1);
        if (chain_hash(hq, tq + 2, bs, 1) == chain_hash(hp, tp + 2, bs, 1)) break;
    }
    tm_kv_seq c = {0}, a = {0}, b = {0};
    admit(&p, &c, tq, 4); /* [Q, Y] first: its Y sits earlier in the probe run */
    admit(&p, &a, tp, 4); /* [P, Y] */
    assert_int_not_equal(a.blocks[1], c.blocks[1]);
    assert_int_equal(p.hash[a.blocks[1]], p.hash[c.blocks[1]]);
    uint64_t coll = stats(&p).collisions;
    assert_int_equal(admit(&p, &b, tp, 5), 4);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]); /* not C's Y, computed after Q */
    assert_true(stats(&p).collisions > coll);
    tm_kv_seq_release(&p, &a);
    tm_kv_seq_release(&p, &b);
    tm_kv_seq_release(&p, &c);
    assert_int_equal(tm_kv_n_free(&p), 16);
    check(&p);
    tm_kv_pool_free(&p);
}

/* A child whose parent block was evicted and reused must not match through the reused block id. */
static void test_stale_parent_generation(void **st) {
    (void)st;
    const int32_t bs = 2;
    tm_kv_pool p;
    pool_cfg(&p, 4, bs, false, 1);
    int32_t ta[4] = {10, 11, 20, 21}; /* [P, Y] */
    tm_kv_seq a = {0}, r = {0}, b = {0};
    admit(&p, &a, ta, 4);
    int32_t P = a.blocks[0], Y = a.blocks[1];
    tm_kv_seq_release(&p, &a);
    tm_kv_block_ref(&p, Y); /* hold Y alone (revived); P stays cached-free */
    int32_t x0 = tm_kv_block_alloc(&p), x1 = tm_kv_block_alloc(&p); /* use up the unused blocks */
    assert_int_equal(tm_kv_n_free(&p), 1);
    /* R's first block, with h(Y | R) == h(Y | P), lands in P's evicted block */
    int32_t tr[5] = {30, 31, 20, 21, 0};
    uint64_t hp = chain_hash(TM_KV_ROOT_HASH, ta, bs, 1);
    while (chain_hash(chain_hash(TM_KV_ROOT_HASH, tr, bs, 1), tr + 2, bs, 1) != chain_hash(hp, ta + 2, bs, 1)) tr[1]++;
    admit(&p, &r, tr, 2);
    assert_int_equal(r.blocks[0], P);
    assert_int_equal(stats(&p).evictions, 1);
    tm_kv_block_unref(&p, Y); /* Y cached-free again, its parent link now stale */
    tm_kv_block_unref(&p, x0);
    tm_kv_block_unref(&p, x1);
    /* [R, Y]: block R matches, Y has the same hash, parent id and tokens but was computed after P */
    assert_int_equal(admit(&p, &b, tr, 5), 2);
    assert_int_equal(b.blocks[0], P);
    assert_int_not_equal(b.blocks[1], Y);
    tm_kv_seq_release(&p, &b);
    tm_kv_seq_release(&p, &r);
    assert_int_equal(tm_kv_n_free(&p), 4);
    check(&p);
    tm_kv_pool_free(&p);
}

/* ---- rollback ----------------------------------------------------------------------------------- */

static void test_truncate_rollback(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 16, 4, false, 0);
    tm_error err = {0};
    int32_t t[16], draft[6] = {1, 2, 3, 4, 5, 6}, fix[3] = {9, 9, 9};
    make_tokens(t, 16, 40);
    tm_kv_seq a = {0};
    admit(&p, &a, t, 6);
    /* speculative: 6 draft tokens, then keep 3 of them */
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 6, &err), TM_OK);
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, draft, 6, &err), TM_OK);
    assert_int_equal(a.n_tokens, 12);
    assert_int_equal(a.n_hashed, 3);
    assert_int_equal(stats(&p).blocks_committed, 3);
    int32_t blk2 = a.blocks[2];
    assert_int_equal(tm_kv_seq_truncate(&p, &a, 9), 9);
    assert_int_equal(a.n_tokens, 9);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(a.n_hashed, 2);
    assert_int_equal(a.blocks[2], blk2);
    assert_false(p.committed[blk2]); /* un-committed: it is the private partial tail again */
    assert_int_equal(stats(&p).blocks_committed, 2);
    check(&p);
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, fix, 3, &err), TM_OK);
    assert_int_equal(a.n_hashed, 3);
    assert_true(p.committed[blk2]);
    /* the cache now holds the corrected third block, not the draft one */
    int32_t q_draft[13], q_fix[13];
    memcpy(q_draft, t, 6 * sizeof(int32_t));
    memcpy(q_draft + 6, draft, sizeof draft);
    memcpy(q_fix, q_draft, 9 * sizeof(int32_t));
    memcpy(q_fix + 9, fix, sizeof fix);
    q_draft[12] = q_fix[12] = 0;
    tm_kv_seq s = {0};
    int32_t cached;
    assert_int_equal(tm_kv_seq_match_prefix(&p, &s, q_draft, 13, &cached, &err), TM_OK);
    assert_int_equal(cached, 8);
    tm_kv_seq_release(&p, &s);
    assert_int_equal(tm_kv_seq_match_prefix(&p, &s, q_fix, 13, &cached, &err), TM_OK);
    assert_int_equal(cached, 12);
    /* s shares all three blocks: a cut inside the shared third block moves down to its start */
    assert_int_equal(tm_kv_seq_reserve(&p, &s, 1, &err), TM_OK); /* a reserved-ahead block goes too */
    assert_int_equal(s.n_blocks, 4);
    assert_int_equal(tm_kv_seq_truncate(&p, &s, 10), 8);
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(s.n_tokens, 8);
    assert_int_equal(s.n_hashed, 2);
    assert_int_equal(p.refcount[blk2], 1);
    assert_true(p.committed[blk2]); /* a still holds it committed */
    /* a cut on a block boundary keeps full blocks committed */
    assert_int_equal(tm_kv_seq_truncate(&p, &s, 4), 4);
    assert_int_equal(s.n_blocks, 1);
    assert_int_equal(stats(&p).blocks_committed, 3);
    /* growing is not truncating */
    assert_int_equal(tm_kv_seq_truncate(&p, &s, 7), 4);
    assert_int_equal(tm_kv_seq_truncate(&p, &s, -5), 0);
    assert_int_equal(s.n_blocks, 0);
    check(&p);
    /* a sole holder of a block it got from the cache may cut into it: un-committed */
    tm_kv_seq_release(&p, &a); /* all three blocks cached-free */
    assert_int_equal(tm_kv_seq_match_prefix(&p, &s, q_fix, 13, &cached, &err), TM_OK);
    assert_int_equal(cached, 12);
    assert_int_equal(tm_kv_seq_truncate(&p, &s, 6), 6);
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(stats(&p).blocks_committed, 2); /* block 1 un-committed, block 2 back cached-free */
    assert_int_equal(stats(&p).blocks_cached_free, 1);
    tm_kv_seq_release(&p, &s);
    assert_int_equal(tm_kv_seq_match_prefix(&p, &s, q_fix, 13, &cached, &err), TM_OK);
    assert_int_equal(cached, 4); /* the chain now ends after block 0 (block 2's parent link is stale) */
    tm_kv_seq_release(&p, &s);
    assert_int_equal(tm_kv_n_free(&p), 16);
    check(&p);
    tm_kv_pool_free(&p);
}

/* ---- exhaustion, caching off, misuse ------------------------------------------------------------ */

static void test_exhaustion_changes_nothing(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 4, 4, false, 0);
    tm_error err = {0};
    int32_t t[12];
    make_tokens(t, 12, 50);
    tm_kv_seq a = {0}, b = {0};
    admit(&p, &a, t, 12); /* 3 blocks */
    assert_int_equal(tm_kv_seq_reserve(&p, &b, 2, &err), TM_OK);
    tm_kv_seq b_before = b;
    int32_t b_blocks[1] = {b.blocks[0]};
    int32_t ref_before[4];
    memcpy(ref_before, p.refcount, sizeof ref_before);
    tm_kv_stats s_before = stats(&p);
    assert_int_equal(tm_kv_seq_reserve(&p, &b, 8, &err), TM_ERR_RANGE);
    assert_non_null(strstr(err.msg, "KV cache full"));
    assert_memory_equal(&b, &b_before, sizeof b);
    assert_int_equal(b.blocks[0], b_blocks[0]);
    assert_memory_equal(p.refcount, ref_before, sizeof ref_before);
    tm_kv_stats s_after = stats(&p);
    assert_memory_equal(&s_after, &s_before, sizeof s_after);
    assert_int_equal(tm_kv_n_free(&p), 0);
    check(&p);
    /* cached-free blocks are available: after A leaves, B gets them by eviction */
    tm_kv_seq_release(&p, &a);
    assert_int_equal(stats(&p).blocks_cached_free, 3);
    assert_true(tm_kv_can_allocate(&p, 3));
    assert_false(tm_kv_can_allocate(&p, 4));
    assert_int_equal(tm_kv_seq_reserve(&p, &b, 16, &err), TM_OK);
    assert_int_equal(stats(&p).evictions, 3);
    assert_true(tm_kv_usage(&p) == 1.0);
    tm_kv_seq_release(&p, &b);
    assert_int_equal(tm_kv_n_free(&p), 4);
    check(&p);
    tm_kv_pool_free(&p);
}

static void test_prefix_cache_off(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 16, 4, true, 0);
    int32_t t[10];
    make_tokens(t, 10, 60);
    tm_kv_seq a = {0}, b = {0};
    assert_int_equal(admit(&p, &a, t, 10), 0);
    assert_int_equal(admit(&p, &b, t, 10), 0);
    for (int j = 0; j < 3; j++) assert_int_not_equal(a.blocks[j], b.blocks[j]);
    tm_kv_stats s = stats(&p);
    assert_int_equal(s.prefix_queries, 2);
    assert_int_equal(s.hit_tokens, 0);
    assert_int_equal(s.blocks_committed, 0);
    tm_kv_seq_release(&p, &a);
    tm_kv_seq_release(&p, &b);
    s = stats(&p);
    assert_int_equal(s.blocks_unused, 16);
    assert_int_equal(s.blocks_cached_free, 0);
    check(&p);
    tm_kv_pool_free(&p);

    /* caching on, but a sequence that opts out commits nothing and keeps the flag across release */
    pool_cfg(&p, 16, 4, false, 0);
    a.no_cache = true;
    assert_int_equal(admit(&p, &a, t, 10), 0);
    assert_int_equal(stats(&p).blocks_committed, 0);
    tm_kv_seq_release(&p, &a);
    assert_true(a.no_cache);
    assert_int_equal(admit(&p, &b, t, 10), 0);
    tm_kv_seq_release(&p, &b);
    assert_int_equal(tm_kv_n_free(&p), 16);
    check(&p);
    tm_kv_pool_free(&p);
}

static void test_misuse_is_refused(void **st) {
    (void)st;
    tm_kv_pool p;
    pool_cfg(&p, 8, 4, false, 0);
    tm_error err = {0};
    int32_t t[8], cached = 5;
    make_tokens(t, 8, 70);
    tm_kv_seq a = {0};
    assert_int_equal(tm_kv_seq_match_prefix(&p, &a, t, -1, &cached, &err), TM_ERR_INVALID);
    assert_int_equal(cached, 0);
    assert_int_equal(tm_kv_seq_match_prefix(&p, &a, NULL, 3, &cached, &err), TM_ERR_INVALID);
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 4, &err), TM_OK);
    assert_int_equal(tm_kv_seq_match_prefix(&p, &a, t, 8, &cached, &err), TM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "empty sequence"));
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, t, 5, &err), TM_ERR_RANGE); /* only 4 entries reserved */
    assert_int_equal(a.n_tokens, 0);
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, t, -1, &err), TM_ERR_INVALID);
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, NULL, 2, &err), TM_ERR_INVALID);
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, t, 0, &err), TM_OK);
    /* n_tokens advanced by hand (no token ids): nothing of this sequence is ever committed */
    a.n_tokens = 2;
    assert_int_equal(tm_kv_seq_reserve(&p, &a, 6, &err), TM_OK);
    assert_int_equal(tm_kv_seq_append_tokens(&p, &a, t + 2, 6, &err), TM_OK);
    assert_int_equal(a.n_tokens, 8);
    assert_int_equal(a.n_hashed, 0);
    assert_int_equal(stats(&p).blocks_committed, 0);
    tm_kv_seq_release(&p, &a);
    assert_int_equal(tm_kv_n_free(&p), 8);
    check(&p);
    tm_kv_pool_free(&p);
}

/* ---- randomized: many sequences over a few shared prefixes, with rollback and eviction pressure ---- */

enum { R_SEQS = 6, R_MAXTOK = 64 };

typedef struct rseq {
    tm_kv_seq kv;
    int32_t hist[R_MAXTOK]; /* (n) the token ids this sequence has in its cache */
    int32_t n;
    bool live;
} rseq;

static uint32_t rnd(uint32_t *x) {
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* Every cache entry of every sequence holds the token id the sequence put there (no aliasing). */
static void check_contents(const tm_kv_pool *p, const rseq *q) {
    for (int i = 0; i < R_SEQS; i++) {
        if (!q[i].live) continue;
        assert_int_equal(q[i].kv.n_tokens, q[i].n);
        for (int32_t k = 0; k < q[i].n; k++)
            if (p->tokens[tm_kv_seq_slot(p, &q[i].kv, k)] != q[i].hist[k])
                fail_msg("seq %d entry %d holds token %d, expected %d", i, k, p->tokens[tm_kv_seq_slot(p, &q[i].kv, k)],
                         q[i].hist[k]);
        for (int32_t j = 0; j < q[i].kv.n_hashed; j++) assert_true(p->committed[q[i].kv.blocks[j]]);
        if (q[i].n % p->block_size) assert_int_equal(p->refcount[q[i].kv.blocks[q[i].n / p->block_size]], 1);
    }
}

static void run_random(int32_t hash_bits, uint32_t seed) {
    const int32_t bs = 4;
    tm_kv_pool p;
    pool_cfg(&p, 40, bs, false, hash_bits);
    rseq q[R_SEQS];
    memset(q, 0, sizeof q);
    int32_t base[3][R_MAXTOK];
    for (int i = 0; i < 3; i++) make_tokens(base[i], R_MAXTOK, 100 + (uint32_t)i);
    uint32_t x = seed;
    tm_error err = {0};
    for (int it = 0; it < 3000; it++) {
        rseq *s = &q[rnd(&x) % R_SEQS];
        uint32_t op = rnd(&x) % 10;
        if (!s->live) { /* admit: a prefix of one base prompt, sometimes perturbed at one token */
            int32_t n = 1 + (int32_t)(rnd(&x) % 30);
            memcpy(s->hist, base[rnd(&x) % 3], (size_t)n * sizeof(int32_t));
            if (rnd(&x) % 3 == 0) s->hist[rnd(&x) % (uint32_t)n] = (int32_t)(rnd(&x) % 4);
            int32_t cached;
            assert_int_equal(tm_kv_seq_match_prefix(&p, &s->kv, s->hist, n, &cached, &err), TM_OK);
            assert_true(cached < n && cached % bs == 0);
            if (tm_kv_seq_reserve(&p, &s->kv, n - cached, &err) != TM_OK) {
                assert_int_equal(err.code, TM_ERR_RANGE);
                tm_kv_seq_release(&p, &s->kv);
            } else {
                assert_int_equal(tm_kv_seq_append_tokens(&p, &s->kv, s->hist + cached, n - cached, &err), TM_OK);
                s->n = n;
                s->live = true;
            }
        } else if (op < 5 && s->n < R_MAXTOK - 4) { /* decode 1..4 tokens (draft runs), from a base or random */
            int32_t m = 1 + (int32_t)(rnd(&x) % 4);
            const int32_t *src = base[rnd(&x) % 3];
            for (int32_t k = 0; k < m; k++) s->hist[s->n + k] = rnd(&x) % 2 ? src[s->n + k] : (int32_t)(rnd(&x) % 4);
            if (tm_kv_seq_reserve(&p, &s->kv, m, &err) == TM_OK) {
                assert_int_equal(tm_kv_seq_append_tokens(&p, &s->kv, s->hist + s->n, m, &err), TM_OK);
                s->n += m;
            }
        } else if (op < 7) { /* rollback */
            int32_t want = s->n - (int32_t)(rnd(&x) % 6);
            int32_t got = tm_kv_seq_truncate(&p, &s->kv, want);
            assert_true(got <= (want < 0 ? 0 : want) && got > want - bs);
            s->n = got;
        } else if (op < 9) {
            tm_kv_seq_release(&p, &s->kv);
            s->live = false;
            s->n = 0;
        }
        check(&p);
        check_contents(&p, q);
    }
    tm_kv_stats st = stats(&p);
    assert_true(st.hit_blocks > 0);
    assert_true(st.evictions > 0);
    if (hash_bits) assert_true(st.collisions > 0);
    for (int i = 0; i < R_SEQS; i++) tm_kv_seq_release(&p, &q[i].kv);
    assert_int_equal(tm_kv_n_free(&p), 40);
    check(&p);
    tm_kv_pool_free(&p);
}

static void test_random_full_hash(void **st) {
    (void)st;
    run_random(0, 1);
}

static void test_random_weak_hash(void **st) {
    (void)st;
    run_random(2, 2);
}

/* ---- fp8 e4m3 KV elements (the CUDA cache's 8-bit type; the host side rounds test references) ------- */


/* A pipelined decode: each entry is advanced before its id is known and gets the id one step later, the way the
 * engine runs a step queued before the previous step's token came back. The pool ends up as with plain appends:
 * the same blocks committed, the same prefix hits, and ids out of order or appends over pending entries refused. */
static void test_advance_then_set_ids(void **st) {
    (void)st;
    tm_error err = {0};
    int32_t tok[70];
    make_tokens(tok, 70, 9);
    tm_kv_pool pa, pb;
    assert_int_equal(tm_kv_pool_init(&pa, 16, 8, &err), TM_OK);
    assert_int_equal(tm_kv_pool_init(&pb, 16, 8, &err), TM_OK);
    tm_kv_seq a = {0}, b = {0};
    admit(&pa, &a, tok, 20);
    admit(&pb, &b, tok, 20);
    for (int32_t i = 20; i < 70; i++) decode(&pb, &b, tok[i]);
    /* a: the entry of token i is written (advanced) in the step after the one that sampled token i - 1 */
    assert_int_equal(tm_kv_seq_reserve(&pa, &a, 1, &err), TM_OK);
    assert_int_equal(tm_kv_seq_advance(&pa, &a, 1, &err), TM_OK);
    for (int32_t i = 21; i < 70; i++) {
        assert_int_equal(tm_kv_seq_reserve(&pa, &a, 1, &err), TM_OK);
        assert_int_equal(tm_kv_seq_advance(&pa, &a, 1, &err), TM_OK); /* entry i, its id still on the device */
        assert_int_equal(a.n_pending, 2);
        assert_int_equal(tm_kv_seq_append_tokens(&pa, &a, &tok[i], 1, &err), TM_ERR_INVALID);
        assert_int_equal(tm_kv_seq_set_ids(&pa, &a, &tok[i - 1], 1, &err), TM_OK); /* entry i - 1's id comes back */
        assert_int_equal(a.n_pending, 1);
        check(&pa);
    }
    assert_int_equal(tm_kv_seq_set_ids(&pa, &a, &tok[69], 2, &err), TM_ERR_INVALID); /* only one is pending */
    assert_int_equal(tm_kv_seq_set_ids(&pa, &a, &tok[69], 1, &err), TM_OK);
    assert_int_equal(a.n_pending, 0);
    assert_int_equal(tm_kv_seq_set_ids(&pa, &a, &tok[69], 1, &err), TM_ERR_INVALID);
    assert_int_equal(a.n_tokens, 70);
    assert_int_equal(a.n_ids, b.n_ids);
    assert_int_equal(a.n_hashed, b.n_hashed);
    assert_int_equal(a.n_hashed, 8);
    tm_kv_stats sa, sb;
    tm_kv_get_stats(&pa, &sa);
    tm_kv_get_stats(&pb, &sb);
    assert_int_equal(sa.blocks_committed, sb.blocks_committed);
    /* a new sequence with the same 70 tokens hits 64 of them in both pools */
    tm_kv_seq a2 = {0}, b2 = {0};
    assert_int_equal(admit(&pa, &a2, tok, 70), 64);
    assert_int_equal(admit(&pb, &b2, tok, 70), 64);
    /* truncating below pending entries drops them */
    tm_kv_seq c = {0};
    admit(&pa, &c, tok + 1, 5);
    assert_int_equal(tm_kv_seq_reserve(&pa, &c, 2, &err), TM_OK);
    assert_int_equal(tm_kv_seq_advance(&pa, &c, 2, &err), TM_OK);
    assert_int_equal(tm_kv_seq_truncate(&pa, &c, 6), 6);
    assert_int_equal(c.n_pending, 1);
    assert_int_equal(tm_kv_seq_advance(&pa, &c, 100, &err), TM_ERR_RANGE); /* not reserved */
    tm_kv_seq_release(&pa, &c);
    tm_kv_seq_release(&pa, &a);
    tm_kv_seq_release(&pa, &a2);
    tm_kv_seq_release(&pb, &b);
    tm_kv_seq_release(&pb, &b2);
    check(&pa);
    tm_kv_pool_free(&pa);
    tm_kv_pool_free(&pb);
}

static void test_fp8_e4m3_conversions(void **state) {
    (void)state;
    static const struct { float f; uint8_t b; } k[] = {
        {0.0f, 0x00}, {1.0f, 0x38}, {-1.0f, 0xb8}, {448.0f, 0x7e}, {1000.0f, 0x7e}, {-1e30f, 0xfe},
        {0.001953125f, 0x01},  /* 2^-9, the smallest subnormal */
        {0.0009765625f, 0x00}, /* 2^-10: a tie, to even (0) */
        {0.0029296875f, 0x02}, /* 1.5 * 2^-9: a tie, to even (2) */
        {1.0625f, 0x38},       /* 1 + 1/16: a tie, to even (1) */
        {1.1875f, 0x3a},       /* 1 + 3/16: a tie, to even (1.25) */
        {0.015625f, 0x08},     /* 2^-6, the smallest normal */
        {240.0f, 0x77}, {0.3333333f, 0x2b}, {-0.0f, 0x80},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) assert_int_equal(tm_fp8_from_f32(k[i].f), k[i].b);
    assert_true(isnan(tm_fp8_to_f32(0x7f)) && isnan(tm_fp8_to_f32(0xff)));
    assert_int_equal(tm_fp8_from_f32(NAN) & 0x7f, 0x7f);
    for (int b = 0; b < 256; b++) { /* every finite byte round-trips; values ascend with the byte */
        const float f = tm_fp8_to_f32((uint8_t)b);
        if (isnan(f)) continue;
        assert_int_equal(tm_fp8_from_f32(f), (uint8_t)b);
        if ((b & 0x7f) > 0 && (b & 0x7f) < 0x7f) assert_true(fabsf(f) > fabsf(tm_fp8_to_f32((uint8_t)(b - 1))));
    }
    /* round to nearest: no representable value is closer than the chosen one */
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float f = ldexpf((float)(x >> 40) / (float)(1u << 24) - 0.5f, (int)(x % 24) - 12);
        const float g = tm_fp8_to_f32(tm_fp8_from_f32(f));
        for (int b = 0; b < 256; b++) {
            const float h = tm_fp8_to_f32((uint8_t)b);
            if (!isnan(h)) assert_true(fabsf(f - g) <= fabsf(f - h));
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_e4m3_conversions),
        cmocka_unit_test(test_alloc_accounting),
        cmocka_unit_test(test_seq_reserve_slot_release),
        cmocka_unit_test(test_identical_prompts_share_blocks),
        cmocka_unit_test(test_partial_prefix_and_first_token),
        cmocka_unit_test(test_leave_one_token),
        cmocka_unit_test(test_lru_eviction_order),
        cmocka_unit_test(test_lru_least_recently_freed_first),
        cmocka_unit_test(test_forced_collision_token_check),
        cmocka_unit_test(test_forced_collision_parent_check),
        cmocka_unit_test(test_stale_parent_generation),
        cmocka_unit_test(test_truncate_rollback),
        cmocka_unit_test(test_advance_then_set_ids),
        cmocka_unit_test(test_exhaustion_changes_nothing),
        cmocka_unit_test(test_prefix_cache_off),
        cmocka_unit_test(test_misuse_is_refused),
        cmocka_unit_test(test_random_full_hash),
        cmocka_unit_test(test_random_weak_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
