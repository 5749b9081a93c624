/* tm_backend.c -- backend entry points and batch helpers that exist in every build (the CUDA entry points answer
 * "not built" without CUDA). */
#include "backend/backend.h"

int32_t tm_batch_fresh_from(const tm_batch *b, int32_t lo) {
    int32_t f = b->n_seqs;
    if (lo < 0) lo = 0;
    while (f > lo && b->context_len[f - 1] == b->query_start[f] - b->query_start[f - 1]) f--;
    return f;
}

bool tm_batch_logits_all(const tm_batch *b) {
    if (b->n_logits != b->n_tokens) return false;
    for (int32_t i = 0; i < b->n_logits; i++)
        if (b->logits_index[i] != i) return false;
    return true;
}

#ifndef TM_HAVE_CUDA
tm_status tm_backend_cuda_create(const tm_cuda_cfg *cfg, tm_backend **out, tm_error *err) {
    (void)cfg;
    *out = NULL;
    return tm_err(err, TM_ERR_UNSUPPORTED, "this build of tokenmill has no CUDA backend (nvcc was not found at build time)");
}
bool tm_backend_cuda_available(void) { return false; }
void *tm_backend_cuda_stream(tm_backend *be) {
    (void)be;
    return NULL;
}
int32_t tm_backend_cuda_device(tm_backend *be) {
    (void)be;
    return -1;
}
tm_status tm_cuda_tp_create(int32_t n_ranks, tm_backend *const *bes, tm_cuda_tp **out, tm_error *err) {
    (void)n_ranks;
    (void)bes;
    *out = NULL;
    return tm_err(err, TM_ERR_UNSUPPORTED, "this build of tokenmill has no CUDA backend");
}
void tm_cuda_tp_free(tm_cuda_tp *t) { (void)t; }
void tm_cuda_tp_allreduce(void *user, int32_t rank, void *buf, size_t n_elems) {
    (void)user;
    (void)rank;
    (void)buf;
    (void)n_elems;
}
tm_status tm_cuda_tp_last_error(tm_cuda_tp *t, tm_error *err) {
    (void)t;
    (void)err;
    return TM_OK;
}
#endif
