/* tm_tp_forward.h -- the forward pass over N tensor-parallel ranks (one shard model, backend and workspace each);
 * implemented with the one-rank forward in tm_forward.c. */
#ifndef TM_TP_FORWARD_H
#define TM_TP_FORWARD_H

#include "model/tm_model.h"

#define TM_TP_MAX_RANKS 8

/* Sum bufs[0..n_ranks) elementwise (n_elems activations each) and leave the sum in every one of them: NCCL's
 * all-reduce on GPUs, tm_tp_allreduce_host for host f32 activations (cpu backends). */
typedef void (*tm_tp_allreduce_fn)(void *user, void *const *bufs, int32_t n_ranks, size_t n_elems);
void tm_tp_allreduce_host(void *user, void *const *bufs, int32_t n_ranks, size_t n_elems);

typedef struct tm_tp_rank {
    const tm_model *model;   /* the rank's shard (tm_tp_shard_model), placed in its backend's memory */
    tm_backend *be;
    tm_workspace *ws;        /* sized for the shard */
} tm_tp_rank;

typedef struct tm_tp_group {
    int32_t n_ranks;
    tm_tp_rank *ranks;       /* (n_ranks) */
    tm_tp_allreduce_fn allreduce;
    void *user;
} tm_tp_group;

/* One forward pass of the batch on every rank (each writes its own KV heads), the attention and MLP outputs summed
 * across ranks before each residual add, logits (replicated output projection) from rank 0 into logits_out. */
tm_status tm_tp_forward(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err);

#endif /* TM_TP_FORWARD_H */
