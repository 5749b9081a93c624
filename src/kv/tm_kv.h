/* tm_kv.h -- paged KV cache metadata: refcounted block pool, per-sequence block tables, prefix caching with LRU reuse.
 *
 * Metadata only: the K/V storage lives in the backend, addressed by slot = block id * block_size + offset.
 *
 * Blocks. Every block is in exactly one of three states:
 *   used         refcount >= 1, held by one or more sequences (or by a caller of tm_kv_block_alloc/ref);
 *   cached-free  refcount 0 but committed: it keeps its hash, token ids and K/V, waits on an LRU list and can
 *                be revived by a prefix hit; it is evicted (hash dropped) only when no unused block is left;
 *   unused       refcount 0, never used or not committed: on a free stack, taken first by allocation.
 * "Free" in this API (tm_kv_n_free, tm_kv_can_allocate, tm_kv_usage) means unused + cached-free.
 *
 * Prefix caching (on unless tm_kv_pool_cfg.disable_prefix_cache). A block is *committed* when it is full and
 * its K/V has been written (tm_kv_seq_append_tokens): it gets a chained hash
 *     h(block j) = XXH3_64bits_withSeed(token ids of block j, h(block j-1)),  h(block -1) = TM_KV_ROOT_HASH
 * and an entry in an open-addressing hash table (linear probing, backward-shift deletion, 2^k >= 2 n_blocks
 * entries, allocated once at init). A committed block records its parent (block id and the parent's
 * generation) and its token ids. A lookup accepts a candidate only when hash, parent id, parent generation
 * and every token id are equal, so a hash collision can never alias a different prefix: the parent link
 * proves (by induction from the first block) that the candidate's K/V was computed over exactly the matched
 * prefix, and the generation (bumped whenever a block is un-committed: eviction, rollback) makes links to a
 * reused parent stale. Committed blocks are immutable: nothing is ever written into them, so full blocks are
 * shared by refcount and never copied; the partially filled last block of a sequence is always private.
 *
 * Typical engine flow for one request:
 *     tm_kv_seq s = {0};
 *     tm_kv_seq_match_prefix(pool, &s, prompt, n_prompt, &n_cached, err);  // s.n_tokens = n_cached
 *     tm_kv_seq_reserve(pool, &s, n_prompt - n_cached, err);               // or release + retry later
 *     ... forward over prompt[n_cached ..) writing K/V at tm_kv_seq_slot(pool, &s, n_cached + i) ...
 *     tm_kv_seq_append_tokens(pool, &s, prompt + n_cached, n_prompt - n_cached, err);  // commits full blocks
 *     ... each decode step: reserve 1, forward, append 1 ...
 *     tm_kv_seq_release(pool, &s);
 *
 * Speculative rollback: run the draft tokens (reserve, forward, append), then tm_kv_seq_truncate to the
 * accepted length. Whole blocks past the cut are released (committed ones stay cached: their K/V is valid for
 * their own tokens); a cut inside a block makes that block the partial tail again: it is un-committed when
 * this sequence is its only holder, and when it is shared the cut moves down to the block start (the
 * caller recomputes those entries; tm_kv_seq_truncate returns the length actually kept).
 *
 * KV eviction (planned: drop chosen cache entries, e.g. H2O/StreamingLLM, while RoPE positions stay true)
 * fits without a redesign because a sequence's cache is addressed by *entry index* (tm_kv_seq_slot), never
 * by position: the engine already passes positions separately (tm_batch.positions). Eviction will add
 *   - a position counter next to n_tokens (next RoPE position = tokens ever seen, n_tokens = entries held);
 *   - tm_kv_seq_evict(pool, seq, keep_mask, moves_out): compacts the surviving entries downwards and returns
 *     the (src slot -> dst slot) moves for the backend to execute, then truncates the freed tail with the
 *     rules above. Entries are only moved into private blocks: a block that is shared or committed and would
 *     receive moved entries is first replaced by a fresh private block (that K/V move is in the same list);
 *     whole evicted blocks are simply unreferenced, so shared prefixes stay intact for other sequences;
 *   - seq->no_cache = true from the first evicted entry on: K/V computed over a gapped context is not the
 *     K/V of the plain prefix, so such blocks are never committed (blocks committed before stay valid).
 * A per-request cache key (LoRA adapter, tenant salt, multimodal hash) would go into the root seed.
 */
#ifndef TM_KV_H
#define TM_KV_H

#include "core/tm_core.h"

#define TM_KV_ROOT_HASH UINT64_C(0x9e3779b97f4a7c15) /* parent hash of a sequence's first block */

typedef struct tm_kv_pool_cfg {
    int32_t n_blocks;           /* 1 .. 2^28 */
    int32_t block_size;         /* tokens per block, 1 .. 1024 */
    bool disable_prefix_cache;  /* true: no hashing, no sharing through the cache (refcounts still work) */
    int32_t test_hash_bits;     /* test hook: keep only the low N bits (1..63) of every hash to force
                                 * collisions; 0 = the full 64-bit hash */
} tm_kv_pool_cfg;

/* Counters and a snapshot of the block states (tm_kv_get_stats). */
typedef struct tm_kv_stats {
    int32_t blocks_total;
    int32_t blocks_used;        /* refcount >= 1 */
    int32_t blocks_cached_free; /* refcount 0, committed, on the LRU list */
    int32_t blocks_unused;      /* refcount 0, uncommitted, on the free stack */
    int32_t blocks_committed;   /* entries in the hash table (used or cached-free) */
    uint64_t prefix_queries;    /* tm_kv_seq_match_prefix calls */
    uint64_t query_tokens;      /* tokens offered to lookups (whole prompts) */
    uint64_t query_blocks;      /* full blocks eligible for a hit ((n - 1) / block_size per query) */
    uint64_t hit_tokens;        /* tokens served from the cache */
    uint64_t hit_blocks;        /* blocks served from the cache */
    uint64_t evictions;         /* cached-free blocks whose contents were dropped to serve an allocation */
    uint64_t dedups;            /* blocks filled by a sequence that already existed committed (swapped) */
    uint64_t collisions;        /* table entries with an equal hash rejected by the parent/token check */
} tm_kv_stats;

typedef struct tm_kv_pool {
    int32_t n_blocks;
    int32_t block_size;         /* tokens per block */
    bool prefix_cache;          /* prefix caching on */
    uint64_t hash_mask;         /* applied to every hash (all ones unless test_hash_bits) */
    int32_t *refcount;          /* (n_blocks) */
    int32_t *free_list;         /* (n_blocks) stack of unused block ids; pop order 0, 1, 2, ... at init */
    int32_t n_unused;           /* entries on free_list */
    /* prefix cache; all NULL when prefix caching is off */
    int32_t *tokens;            /* (n_blocks, block_size) token ids of the entries written into each block */
    uint64_t *hash;             /* (n_blocks) chained hash of a committed block */
    int32_t *parent;            /* (n_blocks) committed block: the block before it in its sequence, -1 first */
    uint64_t *parent_gen;       /* (n_blocks) committed block: gen[parent] when it was committed */
    uint64_t *gen;              /* (n_blocks) bumped each time the block is un-committed */
    uint8_t *committed;         /* (n_blocks) 1 = in the hash table */
    int32_t *lru_prev;          /* (n_blocks) cached-free list links, -1 = none */
    int32_t *lru_next;          /* (n_blocks) */
    int32_t lru_head, lru_tail; /* head = least recently freed (evicted first), -1 when empty */
    int32_t n_cached_free;      /* blocks on the LRU list */
    int32_t n_committed;        /* entries in table */
    int32_t *table;             /* (table_mask + 1) block ids, -1 = empty slot */
    uint64_t table_mask;
    tm_kv_stats st;             /* counters (the block-state fields are filled in by tm_kv_get_stats) */
} tm_kv_pool;

/* A pool with prefix caching on (the defaults of tm_kv_pool_init_cfg). */
tm_status tm_kv_pool_init(tm_kv_pool *p, int32_t n_blocks, int32_t block_size, tm_error *err);
/* A pool from a full configuration. TM_ERR_INVALID on bad geometry, TM_ERR_NOMEM. */
tm_status tm_kv_pool_init_cfg(tm_kv_pool *p, const tm_kv_pool_cfg *cfg, tm_error *err);
/* Free the pool's arrays (sequences must have been released; their block arrays are theirs to free). */
void tm_kv_pool_free(tm_kv_pool *p);

/* A block with refcount 1 and no cached contents: an unused block, else the least recently freed
 * cached-free block (evicted: its hash and table entry are dropped); -1 when every block is used. */
int32_t tm_kv_block_alloc(tm_kv_pool *p);
/* One more reference to block id. id must be used, or cached-free (then it is revived off the LRU list). */
void tm_kv_block_ref(tm_kv_pool *p, int32_t id);
/* Drop a reference to a used block. At 0 a committed block becomes cached-free (LRU tail, most recent),
 * any other block goes back to the unused stack. */
void tm_kv_block_unref(tm_kv_pool *p, int32_t id);
/* Blocks an allocation can get: unused + cached-free. */
static inline int32_t tm_kv_n_free(const tm_kv_pool *p) { return p->n_unused + p->n_cached_free; }
/* true when n more blocks can be allocated now (cached-free blocks count as available). */
static inline bool tm_kv_can_allocate(const tm_kv_pool *p, int32_t n) { return n <= tm_kv_n_free(p); }
/* Fraction of blocks in use, 0..1 (cached-free blocks count as free). */
double tm_kv_usage(const tm_kv_pool *p);
/* Counters plus the current block-state counts. */
void tm_kv_get_stats(const tm_kv_pool *p, tm_kv_stats *out);
/* Check every invariant of the pool (states partition the blocks, lists, table <-> committed flags);
 * TM_ERR_INTERNAL with the first violation. O(n_blocks); for tests and debugging. */
tm_status tm_kv_pool_check(const tm_kv_pool *p, tm_error *err);

/* A sequence's cache: n_tokens entries spread over blocks[0 .. n_blocks); zero-initialise before use.
 * blocks[0 .. n_hashed) are full and committed (shared or not); the block holding entry n_tokens (if any)
 * and every block after it are private. Blocks past ceil(n_tokens / block_size) are reserved ahead. */
typedef struct tm_kv_seq {
    int32_t *blocks;        /* (cap) physical block ids */
    int32_t n_blocks, cap;
    int32_t n_tokens;       /* cache entries written */
    int32_t n_ids;          /* entries whose token ids were recorded (== n_tokens - n_pending unless n_tokens was
                             * advanced by hand, which stops committing for this sequence) */
    int32_t n_pending;      /* entries written whose ids are still to come (tm_kv_seq_advance), after n_ids */
    int32_t n_hashed;       /* leading blocks committed */
    bool no_cache;          /* set by the caller: never commit this sequence's blocks (opt-out; eviction) */
} tm_kv_seq;

/* Attach to an empty sequence (n_blocks == 0) the longest chain of committed blocks that matches
 * tokens[0 .. k * block_size), with k <= (n - 1) / block_size so at least one token is left to compute (its
 * logits are needed). Matched blocks get a reference (cached-free ones are revived); s->n_tokens = n_ids =
 * k * block_size. *n_cached = k * block_size (0 when caching is off or s->no_cache). Counts a query.
 * TM_ERR_INVALID (non-empty sequence, n < 0, NULL tokens), TM_ERR_NOMEM; nothing changes on error. */
tm_status tm_kv_seq_match_prefix(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n, int32_t *n_cached,
                                 tm_error *err);
/* Blocks tm_kv_seq_reserve(p, s, n) would allocate. */
int32_t tm_kv_seq_blocks_needed(const tm_kv_pool *p, const tm_kv_seq *s, int32_t n);
/* Make room for n more entries after n_tokens (allocating blocks; n <= 0: nothing to do); TM_ERR_RANGE when
 * the pool runs out (nothing changed), TM_ERR_NOMEM. Does not change n_tokens. */
tm_status tm_kv_seq_reserve(tm_kv_pool *p, tm_kv_seq *s, int32_t n, tm_error *err);
/* Slot (block * block_size + offset) of cache entry idx (0 <= idx < n_blocks * block_size). */
int64_t tm_kv_seq_slot(const tm_kv_pool *p, const tm_kv_seq *s, int32_t idx);
/* Record that the K/V of entries [n_tokens, n_tokens + n) has been written for these token ids: n_tokens
 * += n, and every block that became full is committed (with caching on and !s->no_cache). A full block
 * whose identical twin (same parent, same tokens) is already committed is swapped for the twin (dedup: the
 * twin gets the reference, this one goes back unused), so s->blocks may change below the new n_tokens: read
 * the block table after this call. Call it after the forward pass that wrote the entries.
 * TM_ERR_RANGE when the entries were not reserved, TM_ERR_INVALID for n < 0, NULL tokens or pending entries
 * (tm_kv_seq_advance) whose ids have not come yet. */
tm_status tm_kv_seq_append_tokens(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n, tm_error *err);
/* A pipelined step: the K/V of entries [n_tokens, n_tokens + n) is being written for token ids the host does not
 * know yet (they are being sampled on the device). n_tokens += n; n_pending += n. The ids follow, in order, with
 * tm_kv_seq_set_ids; blocks are committed only then. TM_ERR_RANGE when the entries were not reserved. */
tm_status tm_kv_seq_advance(tm_kv_pool *p, tm_kv_seq *s, int32_t n, tm_error *err);
/* The ids of the first n pending entries (n <= n_pending): recorded, and full blocks committed as by
 * tm_kv_seq_append_tokens. TM_ERR_INVALID for n < 0, n > n_pending or NULL tokens. */
tm_status tm_kv_seq_set_ids(tm_kv_pool *p, tm_kv_seq *s, const int32_t *tokens, int32_t n, tm_error *err);
/* Speculative rollback: drop entries from the end down to n_tokens (clamped to 0 .. s->n_tokens) and release
 * every block past the new tail, reserved-ahead ones included. A cut inside a block that this sequence holds
 * alone un-commits it (it becomes the private partial tail); a cut inside a shared block releases it too and
 * moves the cut down to the block start. Returns the new n_tokens (<= the requested one). */
int32_t tm_kv_seq_truncate(tm_kv_pool *p, tm_kv_seq *s, int32_t n_tokens);
/* Release every block (last block first, so a prefix outlives its tail on the LRU list) and free the block
 * table; the sequence is zeroed except no_cache (an opt-out survives preemption) and can be reused. */
void tm_kv_seq_release(tm_kv_pool *p, tm_kv_seq *s);

#endif /* TM_KV_H */
