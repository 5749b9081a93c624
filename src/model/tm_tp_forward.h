/* tm_tp_forward.h -- the forward pass over N tensor-parallel ranks (one shard model, backend and workspace each);
 * implemented with the one-rank forward in tm_forward.c. */
#ifndef TM_TP_FORWARD_H
#define TM_TP_FORWARD_H

#include "core/tm_threadpool.h"
#include "model/tm_model.h"

#define TM_TP_MAX_RANKS 8

/* Called by every rank's thread with its own buffer: sum the n_ranks buffers elementwise (n_elems activations
 * each) and leave the sum in every one of them -- NCCL's all-reduce on GPUs (tm_cuda_tp_allreduce), or
 * tm_tp_allreduce_host for cpu backends (host f32 activations; user = a tm_tp_host_reduce). */
typedef void (*tm_tp_allreduce_fn)(void *user, int32_t rank, void *buf, size_t n_elems);

/* The all-reduce of host f32 buffers among n_ranks threads: a barrier, each rank sums its slice of every buffer
 * in rank order (0, 1, ...), a barrier. */
typedef struct tm_tp_host_reduce tm_tp_host_reduce;
tm_status tm_tp_host_reduce_create(int32_t n_ranks, tm_tp_host_reduce **out, tm_error *err);
void tm_tp_host_reduce_free(tm_tp_host_reduce *h);
void tm_tp_allreduce_host(void *user, int32_t rank, void *buf, size_t n_elems);

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
    tm_threadpool *threads;  /* n_ranks threads, rank r on thread r (tm_threadpool_run_each); NULL: threads
                              * started for the call */
} tm_tp_group;

/* One forward pass of the batch on every rank, each on its own thread (each writes its own KV heads), the attention
 * and MLP outputs summed across ranks before each residual add, logits (replicated output projection) from rank 0
 * into logits_out (NULL: they stay in rank 0's ws->logits). The ranks agree after begin_step: all run the step or
 * none does. A rank whose graph capture failed runs its pass again on its own (its collectives then pair with the
 * other ranks' graph). */
tm_status tm_tp_forward(const tm_tp_group *g, const tm_batch *b, float *logits_out, tm_error *err);

#endif /* TM_TP_FORWARD_H */
