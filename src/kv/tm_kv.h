/* tm_kv.h -- paged KV cache metadata: a block pool with refcounts and a free list, per-sequence block tables.
 * Metadata only: the K/V storage lives in the backend, addressed by (block id, offset). */
#ifndef TM_KV_H
#define TM_KV_H

#include "core/tm_core.h"

typedef struct tm_kv_pool {
    int32_t n_blocks;
    int32_t block_size;     /* tokens per block */
    int32_t *refcount;      /* (n_blocks) */
    int32_t *free_list;     /* (n_blocks) stack of free block ids */
    int32_t n_free;
} tm_kv_pool;

tm_status tm_kv_pool_init(tm_kv_pool *p, int32_t n_blocks, int32_t block_size, tm_error *err);
void tm_kv_pool_free(tm_kv_pool *p);
/* A free block with refcount 1, or -1 when the pool is exhausted. */
int32_t tm_kv_block_alloc(tm_kv_pool *p);
void tm_kv_block_ref(tm_kv_pool *p, int32_t id);
void tm_kv_block_unref(tm_kv_pool *p, int32_t id);
static inline int32_t tm_kv_n_free(const tm_kv_pool *p) { return p->n_free; }

/* A sequence's cache: n_tokens entries spread over blocks[0 .. n_blocks). */
typedef struct tm_kv_seq {
    int32_t *blocks;        /* (cap) physical block ids */
    int32_t n_blocks, cap;
    int32_t n_tokens;       /* cache entries in use */
} tm_kv_seq;

/* Make room for n more entries (allocating blocks); TM_ERR_RANGE when the pool runs out (nothing changed). */
tm_status tm_kv_seq_reserve(tm_kv_pool *p, tm_kv_seq *s, int32_t n, tm_error *err);
/* Slot (block * block_size + offset) of cache entry idx. */
int64_t tm_kv_seq_slot(const tm_kv_pool *p, const tm_kv_seq *s, int32_t idx);
/* Drop entries from the end down to n_tokens (speculative rollback); blocks no longer used are released. */
void tm_kv_seq_truncate(tm_kv_pool *p, tm_kv_seq *s, int32_t n_tokens);
void tm_kv_seq_release(tm_kv_pool *p, tm_kv_seq *s);

#endif /* TM_KV_H */
