/* tm_backend.c -- backend entry points that exist in every build (the CUDA ones answer "not built" without CUDA). */
#include "backend/backend.h"

#ifndef TM_HAVE_CUDA
tm_status tm_backend_cuda_create(const tm_cuda_cfg *cfg, tm_backend **out, tm_error *err) {
    (void)cfg;
    *out = NULL;
    return tm_err(err, TM_ERR_UNSUPPORTED, "this build of tokenmill has no CUDA backend (nvcc was not found at build time)");
}
bool tm_backend_cuda_available(void) { return false; }
#endif
