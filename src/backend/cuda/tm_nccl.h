/* tm_nccl.h -- NCCL for tensor parallelism: communicators (one process or many nodes), all-reduce, broadcast. */
#ifndef TM_NCCL_H
#define TM_NCCL_H

#include <cuda_runtime_api.h>

#include "core/tm_core.h"

/* libnccl.so.2 is loaded at run time (dlopen) by tm_nccl_open, so the binary starts, and runs on one GPU or the
 * CPU, without NCCL. tm_nccl_open sets NCCL_NVLS_ENABLE=0 (overwriting any value) before the library is loaded:
 * NVLink SHARP / multicast stays off, and nothing here calls cuMulticastCreate. Call it before starting threads
 * (setenv). */
typedef struct tm_nccl tm_nccl;           /* the loaded library */
typedef struct tm_nccl_comm tm_nccl_comm; /* one rank's communicator */

#define TM_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef enum tm_nccl_type { TM_NCCL_F32 = 0, TM_NCCL_BF16 = 1 } tm_nccl_type;

tm_status tm_nccl_open(tm_nccl **out, tm_error *err);
void tm_nccl_close(tm_nccl *lib);
/* NCCL's version code (e.g. 22803 for 2.28.3) */
int tm_nccl_version(const tm_nccl *lib);

/* One process driving n GPUs: comms[i] is rank i on device devs[i] (ncclCommInitAll). Collectives on these from one
 * thread must be issued between tm_nccl_group_start and tm_nccl_group_end. */
tm_status tm_nccl_init_all(tm_nccl *lib, int32_t n, const int32_t *devs, tm_nccl_comm **comms, tm_error *err);
/* Many processes (or nodes): rank 0 makes the id, every rank calls tm_nccl_init_rank with it on its own device
 * (ncclCommInitRank blocks until all n_ranks have joined). */
tm_status tm_nccl_unique_id(tm_nccl *lib, uint8_t id[TM_NCCL_ID_BYTES], tm_error *err);
tm_status tm_nccl_init_rank(tm_nccl *lib, int32_t n_ranks, int32_t rank, int32_t device,
                            const uint8_t id[TM_NCCL_ID_BYTES], tm_nccl_comm **out, tm_error *err);
/* Both steps with the id carried over TCP (tm_tp_listen / tm_tp_serve_id / tm_tp_fetch_id): rank 0 listens on
 * host:port (host NULL: every address) and serves the id to the n_ranks - 1 others, which connect to host:port;
 * then every rank joins. timeout_ms bounds the exchange, not NCCL's own initialisation. */
tm_status tm_nccl_init_tcp(tm_nccl *lib, int32_t n_ranks, int32_t rank, int32_t device, const char *host, int port,
                           int timeout_ms, tm_nccl_comm **out, tm_error *err);
void tm_nccl_comm_free(tm_nccl_comm *c);
int32_t tm_nccl_comm_rank(const tm_nccl_comm *c);
int32_t tm_nccl_comm_size(const tm_nccl_comm *c);

tm_status tm_nccl_group_start(tm_nccl *lib, tm_error *err);
tm_status tm_nccl_group_end(tm_nccl *lib, tm_error *err);
/* recv (count) = sum over ranks of send (count), device memory, enqueued on stream (in place when send == recv;
 * capturable in a CUDA graph). */
tm_status tm_nccl_all_reduce_sum(tm_nccl_comm *c, const void *send, void *recv, size_t count, tm_nccl_type type,
                                 cudaStream_t stream, tm_error *err);
/* buf (bytes) of rank root copied to every rank (the step's batch metadata), device memory, on stream. */
tm_status tm_nccl_broadcast(tm_nccl_comm *c, void *buf, size_t bytes, int32_t root, cudaStream_t stream,
                            tm_error *err);
/* An error NCCL met asynchronously (a peer gone, a network failure): TM_ERR_DEVICE with NCCL's message. */
tm_status tm_nccl_check(tm_nccl_comm *c, tm_error *err);

#endif /* TM_NCCL_H */
