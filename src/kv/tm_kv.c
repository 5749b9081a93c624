/* tm_kv.c -- block pool and per-sequence block tables of the paged KV cache (metadata only). */
#include "tm_kv.h"

#include <stdlib.h>

tm_status tm_kv_pool_init(tm_kv_pool *p, int32_t n_blocks, int32_t block_size, tm_error *err) {
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || block_size < 1 || block_size > 1024)
        return tm_err(err, TM_ERR_INVALID, "bad KV pool geometry: %d blocks of %d tokens", n_blocks, block_size);
    p->refcount = tm_calloc((size_t)n_blocks, sizeof(int32_t));
    p->free_list = tm_malloc_array((size_t)n_blocks, sizeof(int32_t));
    if (!p->refcount || !p->free_list) {
        tm_kv_pool_free(p);
        return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    for (int32_t i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i; /* pop gives 0, 1, 2, ... */
    p->n_free = n_blocks;
    return TM_OK;
}

void tm_kv_pool_free(tm_kv_pool *p) {
    free(p->refcount);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}

int32_t tm_kv_block_alloc(tm_kv_pool *p) {
    if (p->n_free == 0) return -1;
    int32_t id = p->free_list[--p->n_free];
    p->refcount[id] = 1;
    return id;
}

void tm_kv_block_ref(tm_kv_pool *p, int32_t id) { p->refcount[id]++; }

void tm_kv_block_unref(tm_kv_pool *p, int32_t id) {
    if (--p->refcount[id] == 0) p->free_list[p->n_free++] = id;
}

tm_status tm_kv_seq_reserve(tm_kv_pool *p, tm_kv_seq *s, int32_t n, tm_error *err) {
    int64_t want_tokens = (int64_t)s->n_tokens + n;
    int64_t want_blocks = (want_tokens + p->block_size - 1) / p->block_size;
    int64_t extra = want_blocks - s->n_blocks;
    if (extra <= 0) return TM_OK;
    if (extra > p->n_free)
        return tm_err(err, TM_ERR_RANGE, "KV cache full: need %lld more blocks, %d free", (long long)extra, p->n_free);
    if (want_blocks > s->cap) {
        int64_t cap = s->cap ? s->cap : 8;
        while (cap < want_blocks) cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof(int32_t));
        if (!nb) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        s->blocks = nb;
        s->cap = (int32_t)cap;
    }
    while (s->n_blocks < want_blocks) s->blocks[s->n_blocks++] = tm_kv_block_alloc(p);
    return TM_OK;
}

int64_t tm_kv_seq_slot(const tm_kv_pool *p, const tm_kv_seq *s, int32_t idx) {
    return (int64_t)s->blocks[idx / p->block_size] * p->block_size + idx % p->block_size;
}

void tm_kv_seq_truncate(tm_kv_pool *p, tm_kv_seq *s, int32_t n_tokens) {
    if (n_tokens < 0) n_tokens = 0;
    if (n_tokens > s->n_tokens) return;
    s->n_tokens = n_tokens;
    int32_t keep = (n_tokens + p->block_size - 1) / p->block_size;
    while (s->n_blocks > keep) tm_kv_block_unref(p, s->blocks[--s->n_blocks]);
}

void tm_kv_seq_release(tm_kv_pool *p, tm_kv_seq *s) {
    while (s->n_blocks > 0) tm_kv_block_unref(p, s->blocks[--s->n_blocks]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
