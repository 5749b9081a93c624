/* tm_cuda_tp.c -- tensor parallelism over CUDA backends in one process: NCCL communicators and the all-reduce. */
#include "backend/backend.h"
#include "backend/cuda/tm_nccl.h"

#include <stdlib.h>

struct tm_cuda_tp {
    tm_nccl *lib;
    int32_t n;
    tm_nccl_comm *comms[8];   /* (n) rank r on its backend's device */
    cudaStream_t streams[8];  /* (n) each backend's stream */
    tm_status err_code;
    tm_error err;
};

tm_status tm_cuda_tp_create(int32_t n_ranks, tm_backend *const *bes, tm_cuda_tp **out, tm_error *err) {
    *out = NULL;
    if (n_ranks < 2 || n_ranks > 8) return tm_err(err, TM_ERR_RANGE, "tensor-parallel group of %d GPUs", n_ranks);
    tm_cuda_tp *t = tm_calloc(1, sizeof *t);
    if (!t) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    t->n = n_ranks;
    int32_t devs[8];
    for (int32_t r = 0; r < n_ranks; r++) {
        devs[r] = tm_backend_cuda_device(bes[r]);
        t->streams[r] = (cudaStream_t)tm_backend_cuda_stream(bes[r]);
    }
    tm_status s = tm_nccl_open(&t->lib, err);
    if (s == TM_OK) s = tm_nccl_init_all(t->lib, n_ranks, devs, t->comms, err);
    if (s != TM_OK) {
        tm_cuda_tp_free(t);
        return s;
    }
    *out = t;
    return TM_OK;
}

void tm_cuda_tp_free(tm_cuda_tp *t) {
    if (!t) return;
    for (int32_t r = 0; r < t->n; r++) tm_nccl_comm_free(t->comms[r]);
    tm_nccl_close(t->lib);
    free(t);
}

/* bufs[r] are rank r's bf16 activations (cuda activations other than the residual and logits are bf16) */
void tm_cuda_tp_allreduce(void *user, void *const *bufs, int32_t n_ranks, size_t n_elems) {
    tm_cuda_tp *t = user;
    if (t->err_code != TM_OK) return;
    tm_error e;
    tm_status s = tm_nccl_group_start(t->lib, &e);
    for (int32_t r = 0; r < n_ranks && s == TM_OK; r++)
        s = tm_nccl_all_reduce_sum(t->comms[r], bufs[r], bufs[r], n_elems, TM_NCCL_BF16, t->streams[r], &e);
    tm_status s2 = tm_nccl_group_end(t->lib, s == TM_OK ? &e : NULL);
    if (s == TM_OK) s = s2;
    if (s != TM_OK) t->err_code = tm_err(&t->err, s, "all-reduce: %s", e.msg);
}

tm_status tm_cuda_tp_last_error(tm_cuda_tp *t, tm_error *err) {
    if (!t || t->err_code == TM_OK) return TM_OK;
    tm_status s = tm_err(err, t->err_code, "%s", t->err.msg);
    t->err_code = TM_OK;
    return s;
}
