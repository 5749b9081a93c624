/* tm_kv.c -- paged KV cache metadata: refcounted block pool, prefix-cache hash table + LRU, per-sequence block tables. */
#include "tm_kv.h"

#include <assert.h>
#include <stdlib.h>
#define XXH_INLINE_ALL /* header-only xxHash: no link dependency (libxxhash-dev's header) */
#include <xxhash.h>

#define TM_KV_MAX_BLOCKS (1 << 28)

/* ---- LRU list of cached-free blocks ------------------------------------------------------------- */

static void lru_remove(tm_kv_pool *p, int32_t id) {
    int32_t a = p->lru_prev[id], b = p->lru_next[id];
    if (a >= 0) p->lru_next[a] = b;
    else p->lru_head = b;
    if (b >= 0) p->lru_prev[b] = a;
    else p->lru_tail = a;
    p->lru_prev[id] = p->lru_next[id] = -1;
    p->n_cached_free--;
}

static void lru_push_tail(tm_kv_pool *p, int32_t id) {
    p->lru_prev[id] = p->lru_tail;
    p->lru_next[id] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->n_cached_free++;
}

/* ---- hash table: block ids keyed by chained hash (linear probing, backward-shift deletion) -------- */

static uint64_t block_hash(const tm_kv_pool *p, uint64_t parent_hash, const int32_t *tok) {
    return XXH3_64bits_withSeed(tok, (size_t)p->block_size * sizeof(int32_t), parent_hash) & p->hash_mask;
}

static const int32_t *block_tokens(const tm_kv_pool *p, int32_t id) {
    return p->tokens + (size_t)id * (size_t)p->block_size;
}

/* The committed block with hash h, this parent (at its current generation) and these token ids, or -1. */
static int32_t table_find(tm_kv_pool *p, uint64_t h, int32_t parent, const int32_t *tok) {
    uint64_t pgen = parent >= 0 ? p->gen[parent] : 0;
    size_t nbytes = (size_t)p->block_size * sizeof(int32_t);
    for (uint64_t i = h & p->table_mask;; i = (i + 1) & p->table_mask) {
        int32_t e = p->table[i];
        if (e < 0) return -1;
        if (p->hash[e] != h) continue;
        if (p->parent[e] == parent && p->parent_gen[e] == pgen && memcmp(block_tokens(p, e), tok, nbytes) == 0) return e;
        p->st.collisions++;
    }
}

static void table_insert(tm_kv_pool *p, int32_t id) {
    uint64_t i = p->hash[id] & p->table_mask;
    while (p->table[i] >= 0) i = (i + 1) & p->table_mask; /* never full: >= 2 entries per block */
    p->table[i] = id;
    p->committed[id] = 1;
    p->n_committed++;
}

/* Un-commit id: drop its table entry and bump its generation (links from children become stale). */
static void table_remove(tm_kv_pool *p, int32_t id) {
    uint64_t m = p->table_mask, i = p->hash[id] & m;
    while (p->table[i] != id) {
        assert(p->table[i] >= 0);
        i = (i + 1) & m;
    }
    /* shift later entries of the probe run back into the hole unless their home lies in (hole, j] */
    for (uint64_t j = (i + 1) & m; p->table[j] >= 0; j = (j + 1) & m) {
        uint64_t home = p->hash[p->table[j]] & m;
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            p->table[i] = p->table[j];
            i = j;
        }
    }
    p->table[i] = -1;
    p->committed[id] = 0;
    p->n_committed--;
    p->gen[id]++;
    p->hash[id] = 0;
    p->parent[id] = -1;
    p->parent_gen[id] = 0;
}

static bool is_committed(const tm_kv_pool *p, int32_t id) { return p->committed && p->committed[id]; }

/* ---- pool --------------------------------------------------------------------------------------- */

tm_status tm_kv_pool_init(tm_kv_pool *p, int32_t n_blocks, int32_t block_size, tm_error *err) {
    tm_kv_pool_cfg cfg = {.n_blocks = n_blocks, .block_size = block_size};
    return tm_kv_pool_init_cfg(p, &cfg, err);
}

tm_status tm_kv_pool_init_cfg(tm_kv_pool *p, const tm_kv_pool_cfg *cfg, tm_error *err) {
    memset(p, 0, sizeof *p);
    int32_t nb = cfg->n_blocks, bs = cfg->block_size;
    if (nb < 1 || nb > TM_KV_MAX_BLOCKS || bs < 1 || bs > 1024)
        return tm_err(err, TM_ERR_INVALID, "bad KV pool geometry: %d blocks of %d tokens", nb, bs);
    if (cfg->test_hash_bits < 0 || cfg->test_hash_bits > 63)
        return tm_err(err, TM_ERR_INVALID, "test_hash_bits %d outside 0..63", cfg->test_hash_bits);
    size_t n = (size_t)nb;
    p->refcount = tm_calloc(n, sizeof(int32_t));
    p->free_list = tm_malloc_array(n, sizeof(int32_t));
    bool ok = p->refcount && p->free_list;
    p->lru_head = p->lru_tail = -1;
    if (ok && !cfg->disable_prefix_cache) {
        uint64_t cap = 2;
        while (cap < 2 * (uint64_t)nb) cap <<= 1;
        p->tokens = tm_calloc(n * (size_t)bs, sizeof(int32_t));
        p->hash = tm_calloc(n, sizeof(uint64_t));
        p->parent = tm_malloc_array(n, sizeof(int32_t));
        p->parent_gen = tm_calloc(n, sizeof(uint64_t));
        p->gen = tm_calloc(n, sizeof(uint64_t));
        p->committed = tm_calloc(n, sizeof(uint8_t));
        p->lru_prev = tm_malloc_array(n, sizeof(int32_t));
        p->lru_next = tm_malloc_array(n, sizeof(int32_t));
        p->table = tm_malloc_array((size_t)cap, sizeof(int32_t));
        ok = p->tokens && p->hash && p->parent && p->parent_gen && p->gen && p->committed && p->lru_prev &&
             p->lru_next && p->table;
        if (ok) {
            for (size_t i = 0; i < n; i++) p->parent[i] = p->lru_prev[i] = p->lru_next[i] = -1;
            for (uint64_t i = 0; i < cap; i++) p->table[i] = -1;
            p->table_mask = cap - 1;
            p->prefix_cache = true;
            p->hash_mask = cfg->test_hash_bits ? (UINT64_C(1) << cfg->test_hash_bits) - 1 : UINT64_MAX;
        }
    }
    if (!ok) {
        tm_kv_pool_free(p);
        return tm_err(err, TM_ERR_NOMEM, "out of memory for a KV pool of %d blocks", nb);
    }
    p->n_blocks = nb;
    p->block_size = bs;
    for (int32_t i = 0; i < nb; i++) p->free_list[i] = nb - 1 - i; /* pop gives 0, 1, 2, ... */
    p->n_unused = nb;
    return TM_OK;
}

void tm_kv_pool_free(tm_kv_pool *p) {
    free(p->refcount);
    free(p->free_list);
    free(p->tokens);
    free(p->hash);
    free(p->parent);
    free(p->parent_gen);
    free(p->gen);
    free(p->committed);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->table);
    memset(p, 0, sizeof *p);
    p->lru_head = p->lru_tail = -1;
}

int32_t tm_kv_block_alloc(tm_kv_pool *p) {
    int32_t id;
    if (p->n_unused > 0) {
        id = p->free_list[--p->n_unused];
    } else if (p->lru_head >= 0) {
        id = p->lru_head;
        lru_remove(p, id);
        table_remove(p, id);
        p->st.evictions++;
    } else {
        return -1;
    }
    p->refcount[id] = 1;
    return id;
}

void tm_kv_block_ref(tm_kv_pool *p, int32_t id) {
    assert(id >= 0 && id < p->n_blocks);
    if (p->refcount[id] == 0) { /* revive a cached-free block; an unused one cannot be referenced */
        assert(is_committed(p, id));
        lru_remove(p, id);
    }
    p->refcount[id]++;
}

void tm_kv_block_unref(tm_kv_pool *p, int32_t id) {
    assert(id >= 0 && id < p->n_blocks && p->refcount[id] > 0);
    if (--p->refcount[id] > 0) return;
    if (is_committed(p, id)) lru_push_tail(p, id);
    else p->free_list[p->n_unused++] = id;
}

double tm_kv_usage(const tm_kv_pool *p) {
    if (p->n_blocks <= 0) return 0.0;
    return (double)(p->n_blocks - tm_kv_n_free(p)) / (double)p->n_blocks;
}

void tm_kv_get_stats(const tm_kv_pool *p, tm_kv_stats *out) {
    *out = p->st;
    out->blocks_total = p->n_blocks;
    out->blocks_unused = p->n_unused;
    out->blocks_cached_free = p->n_cached_free;
    out->blocks_used = p->n_blocks - p->n_unused - p->n_cached_free;
    out->blocks_committed = p->n_committed;
}

tm_status tm_kv_pool_check(const tm_kv_pool *p, tm_error *err) {
    int32_t nb = p->n_blocks;
    uint8_t *seen = tm_calloc((size_t)nb, 1); /* bits: 1 = on the free stack, 2 = on the LRU list, 4 = in the table */
    if (!seen) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_status s = TM_OK;
    if (p->n_unused < 0 || p->n_unused > nb || p->n_cached_free < 0 || p->n_unused + p->n_cached_free > nb) {
        s = tm_err(err, TM_ERR_INTERNAL, "bad counts: %d unused, %d cached-free of %d", p->n_unused, p->n_cached_free, nb);
        goto done;
    }
    for (int32_t i = 0; i < p->n_unused; i++) {
        int32_t id = p->free_list[i];
        if (id < 0 || id >= nb || seen[id] || p->refcount[id] != 0 || is_committed(p, id)) {
            s = tm_err(err, TM_ERR_INTERNAL, "free stack entry %d: block %d is not an unused block", i, id);
            goto done;
        }
        seen[id] = 1;
    }
    if (!p->prefix_cache) {
        if (p->n_cached_free != 0 || p->n_committed != 0 || p->committed || p->table) {
            s = tm_err(err, TM_ERR_INTERNAL, "prefix cache off but cache state present");
            goto done;
        }
    } else {
        int32_t n = 0, prev = -1;
        for (int32_t id = p->lru_head; id >= 0; prev = id, id = p->lru_next[id], n++) {
            if (id >= nb || n >= nb || seen[id] || p->refcount[id] != 0 || !p->committed[id] || p->lru_prev[id] != prev) {
                s = tm_err(err, TM_ERR_INTERNAL, "LRU entry %d: block %d is not a cached-free block", n, id);
                goto done;
            }
            seen[id] = 2;
        }
        if (n != p->n_cached_free || p->lru_tail != prev) {
            s = tm_err(err, TM_ERR_INTERNAL, "LRU list has %d blocks (tail %d), counted %d (tail %d)", n, prev,
                       p->n_cached_free, p->lru_tail);
            goto done;
        }
        int32_t in_table = 0;
        for (uint64_t i = 0; i <= p->table_mask; i++) {
            int32_t e = p->table[i];
            if (e < 0) continue;
            if (e >= nb || (seen[e] & 4) || !p->committed[e] || (p->hash[e] & ~p->hash_mask) != 0) {
                s = tm_err(err, TM_ERR_INTERNAL, "table slot %llu: bad entry %d", (unsigned long long)i, e);
                goto done;
            }
            for (uint64_t j = p->hash[e] & p->table_mask; j != i; j = (j + 1) & p->table_mask)
                if (p->table[j] < 0) {
                    s = tm_err(err, TM_ERR_INTERNAL, "table slot %llu: block %d unreachable from its home",
                               (unsigned long long)i, e);
                    goto done;
                }
            if (p->parent[e] < -1 || p->parent[e] >= nb || p->parent[e] == e) {
                s = tm_err(err, TM_ERR_INTERNAL, "block %d has parent %d", e, p->parent[e]);
                goto done;
            }
            seen[e] |= 4;
            in_table++;
        }
        int32_t flagged = 0;
        for (int32_t id = 0; id < nb; id++) flagged += p->committed[id] != 0;
        if (in_table != p->n_committed || flagged != p->n_committed) {
            s = tm_err(err, TM_ERR_INTERNAL, "table holds %d blocks, %d flagged, counted %d", in_table, flagged,
                       p->n_committed);
            goto done;
        }
    }
    for (int32_t id = 0; id < nb; id++) {
        bool free_now = (seen[id] & 3) != 0;
        if (p->refcount[id] < 0 || (p->refcount[id] == 0) != free_now) {
            s = tm_err(err, TM_ERR_INTERNAL, "block %d: refcount %d but %s", id, p->refcount[id],
                       free_now ? "on a free list" : "on no free list");
            goto done;
        }
    }
done:
    free(seen);
    return s;
}

/* ---- sequences ---------------------------------------------------------------------------------- */

static tm_status seq_grow(tm_kv_seq *s, int64_t want, tm_error *err) {
    if (want <= s->cap) return TM_OK;
    if (want > INT32_MAX) return tm_err(err, TM_ERR_RANGE, "block table of %lld entries", (long long)want);
    int64_t cap = s->cap ? s->cap : 8;
    while (cap < want) cap *= 2;
    if (cap > INT32_MAX) cap = INT32_MAX;
    int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof(int32_t));
    if (!nb) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    s->blocks = nb;
    s->cap = (int32_t)cap;
    return TM_OK;
}

tm_status tm_kv_seq_match_prefix(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n, int32_t *n_cached,
                                 tm_error *err) {
    *n_cached = 0;
    if (n < 0 || (n > 0 && !tokens)) return tm_err(err, TM_ERR_INVALID, "prefix match of %d tokens", n);
    if (s->n_blocks != 0 || s->n_tokens != 0)
        return tm_err(err, TM_ERR_INVALID, "prefix match needs an empty sequence (it holds %d blocks)", s->n_blocks);
    int32_t bs = p->block_size;
    int32_t eligible = n > 0 ? (n - 1) / bs : 0; /* leave at least one token to compute */
    int32_t max = p->prefix_cache && !s->no_cache ? eligible : 0;
    if (max > 0) {
        tm_status st = seq_grow(s, max, err);
        if (st != TM_OK) return st;
    }
    p->st.prefix_queries++;
    p->st.query_tokens += (uint64_t)n;
    p->st.query_blocks += (uint64_t)eligible;
    int32_t k = 0, parent = -1;
    uint64_t ph = TM_KV_ROOT_HASH;
    while (k < max) {
        const int32_t *t = tokens + (size_t)k * (size_t)bs;
        uint64_t h = block_hash(p, ph, t);
        int32_t b = table_find(p, h, parent, t);
        if (b < 0) break;
        tm_kv_block_ref(p, b);
        s->blocks[k++] = b;
        parent = b;
        ph = h;
    }
    s->n_blocks = s->n_hashed = k;
    s->n_tokens = s->n_ids = k * bs;
    p->st.hit_blocks += (uint64_t)k;
    p->st.hit_tokens += (uint64_t)k * (uint64_t)bs;
    *n_cached = k * bs;
    return TM_OK;
}

int32_t tm_kv_seq_blocks_needed(const tm_kv_pool *p, const tm_kv_seq *s, int32_t n) {
    if (n <= 0) return 0;
    int64_t want_tokens = (int64_t)s->n_tokens + n;
    int64_t extra = (want_tokens + p->block_size - 1) / p->block_size - s->n_blocks;
    if (extra <= 0) return 0;
    return extra > INT32_MAX ? INT32_MAX : (int32_t)extra;
}

tm_status tm_kv_seq_reserve(tm_kv_pool *p, tm_kv_seq *s, int32_t n, tm_error *err) {
    int32_t extra = tm_kv_seq_blocks_needed(p, s, n);
    if (extra == 0) return TM_OK;
    if (!tm_kv_can_allocate(p, extra))
        return tm_err(err, TM_ERR_RANGE, "KV cache full: need %d more blocks, %d free", extra, tm_kv_n_free(p));
    tm_status st = seq_grow(s, (int64_t)s->n_blocks + extra, err);
    if (st != TM_OK) return st;
    for (int32_t i = 0; i < extra; i++) s->blocks[s->n_blocks++] = tm_kv_block_alloc(p);
    return TM_OK;
}

int64_t tm_kv_seq_slot(const tm_kv_pool *p, const tm_kv_seq *s, int32_t idx) {
    return (int64_t)s->blocks[idx / p->block_size] * p->block_size + idx % p->block_size;
}

/* Commit every block of s that is full of recorded token ids, in order (each needs its parent's hash). */
static void commit_full_blocks(tm_kv_pool *p, tm_kv_seq *s) {
    int32_t bs = p->block_size;
    while ((int64_t)(s->n_hashed + 1) * bs <= s->n_ids) {
        int32_t j = s->n_hashed, b = s->blocks[j];
        int32_t parent = j > 0 ? s->blocks[j - 1] : -1;
        const int32_t *tok = block_tokens(p, b);
        uint64_t h = block_hash(p, parent >= 0 ? p->hash[parent] : TM_KV_ROOT_HASH, tok);
        int32_t twin = table_find(p, h, parent, tok);
        if (twin >= 0) { /* the same K/V is already cached: share it, give this block back */
            tm_kv_block_ref(p, twin);
            s->blocks[j] = twin;
            tm_kv_block_unref(p, b);
            p->st.dedups++;
        } else {
            p->hash[b] = h;
            p->parent[b] = parent;
            p->parent_gen[b] = parent >= 0 ? p->gen[parent] : 0;
            table_insert(p, b);
        }
        s->n_hashed++;
    }
}

/* record ids for entries [n_ids, n_ids + n) (all written) and commit the blocks that became full */
static void record_ids(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n) {
    int32_t bs = p->block_size;
    for (int32_t i = 0; i < n;) {
        int32_t idx = s->n_ids + i, b = s->blocks[idx / bs], off = idx % bs;
        int32_t len = bs - off < n - i ? bs - off : n - i;
        assert(!p->committed[b]); /* entries are only written into private blocks */
        memcpy(p->tokens + (size_t)b * (size_t)bs + (size_t)off, tokens + i, (size_t)len * sizeof(int32_t));
        i += len;
    }
    s->n_ids += n;
    commit_full_blocks(p, s);
}

/* ids are recorded while they come in order: none skipped by hand, caching on for this sequence */
static bool records(const tm_kv_pool *p, const tm_kv_seq *s) {
    return p->prefix_cache && !s->no_cache && s->n_ids + s->n_pending == s->n_tokens;
}

static tm_status check_room(const tm_kv_pool *p, const tm_kv_seq *s, int32_t n, tm_error *err) {
    if ((int64_t)s->n_tokens + n > (int64_t)s->n_blocks * p->block_size)
        return tm_err(err, TM_ERR_RANGE, "append of %d entries after %d: only %d blocks reserved", n, s->n_tokens,
                      s->n_blocks);
    return TM_OK;
}

tm_status tm_kv_seq_append_tokens(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n, tm_error *err) {
    if (n < 0 || (n > 0 && !tokens)) return tm_err(err, TM_ERR_INVALID, "append of %d tokens", n);
    if (s->n_pending > 0)
        return tm_err(err, TM_ERR_INVALID, "append of %d tokens before the ids of %d pending entries", n, s->n_pending);
    tm_status st = check_room(p, s, n, err);
    if (st != TM_OK) return st;
    bool record = records(p, s);
    s->n_tokens += n;
    if (record) record_ids(p, s, tokens, n);
    return TM_OK;
}

tm_status tm_kv_seq_advance(tm_kv_pool *p, tm_kv_seq *s, int32_t n, tm_error *err) {
    if (n < 0) return tm_err(err, TM_ERR_INVALID, "advance of %d entries", n);
    tm_status st = check_room(p, s, n, err);
    if (st != TM_OK) return st;
    s->n_tokens += n;
    s->n_pending += n;
    return TM_OK;
}

tm_status tm_kv_seq_set_ids(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n, tm_error *err) {
    if (n < 0 || n > s->n_pending || (n > 0 && !tokens))
        return tm_err(err, TM_ERR_INVALID, "ids of %d entries (%d pending)", n, s->n_pending);
    bool record = records(p, s);
    s->n_pending -= n;
    if (record) record_ids(p, s, tokens, n);
    return TM_OK;
}

int32_t tm_kv_seq_truncate(tm_kv_pool *p, tm_kv_seq *s, int32_t n_tokens) {
    int32_t n = n_tokens < 0 ? 0 : n_tokens, bs = p->block_size;
    if (n > s->n_tokens) return s->n_tokens;
    int32_t keep = (n + bs - 1) / bs;
    while (s->n_blocks > keep) tm_kv_block_unref(p, s->blocks[--s->n_blocks]);
    if (n % bs != 0) { /* the block holding the cut becomes the partial tail: it must be private */
        int32_t b = s->blocks[keep - 1];
        if (p->refcount[b] > 1) {
            tm_kv_block_unref(p, b);
            s->n_blocks--;
            n -= n % bs;
        } else if (is_committed(p, b)) {
            table_remove(p, b);
        }
    }
    s->n_tokens = n;
    if (s->n_ids > n) s->n_ids = n;
    if (s->n_ids + s->n_pending > n) s->n_pending = n - s->n_ids;
    if (s->n_hashed > n / bs) s->n_hashed = n / bs;
    return n;
}

void tm_kv_seq_release(tm_kv_pool *p, tm_kv_seq *s) {
    while (s->n_blocks > 0) tm_kv_block_unref(p, s->blocks[--s->n_blocks]);
    free(s->blocks);
    bool no_cache = s->no_cache;
    memset(s, 0, sizeof *s);
    s->no_cache = no_cache;
}
