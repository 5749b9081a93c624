/* tm_cuda_tp.c -- tensor parallelism over CUDA backends in one process: NCCL communicators and the all-reduce. */
#include "backend/backend.h"
#include "backend/cuda/tm_nccl.h"

#include <stdlib.h>

struct tm_cuda_tp {
    tm_nccl *lib;
    int32_t n;
    tm_nccl_comm *comms[8];   /* (n) rank r on its backend's device */
    cudaStream_t streams[8];  /* (n) each backend's stream */
    tm_status err_code[8];    /* (n) the first error of rank r's all-reduces since its last check */
    tm_error err[8];
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

/* buf is rank r's bf16 activations (cuda activations other than the residual and logits are bf16); called from
 * rank r's thread, with its device current */
void tm_cuda_tp_allreduce(void *user, int32_t rank, void *buf, size_t n_elems) {
    tm_cuda_tp *t = user;
    if (t->err_code[rank] != TM_OK) return;
    tm_error e;
    tm_status s = tm_nccl_all_reduce_sum(t->comms[rank], buf, buf, n_elems, TM_NCCL_BF16, t->streams[rank], &e);
    if (s != TM_OK) t->err_code[rank] = tm_err(&t->err[rank], s, "all-reduce on rank %d: %s", rank, e.msg);
}

tm_status tm_cuda_tp_last_error(tm_cuda_tp *t, tm_error *err) {
    if (!t) return TM_OK;
    tm_status s = TM_OK;
    for (int32_t r = 0; r < t->n; r++) {
        if (t->err_code[r] != TM_OK && s == TM_OK) s = tm_err(err, t->err_code[r], "%s", t->err[r].msg);
        t->err_code[r] = TM_OK;
    }
    return s;
}
