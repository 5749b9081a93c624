/* tm_cuda_pdl.cuh -- programmatic dependent launch (sm_90) for the kernels of a decode step: a kernel launched by
 * tm_launch while TM_CUDA_PDL=1 may be scheduled while the kernel before it on the stream is still running; it
 * calls tm_pdl_enter() before its first access to global memory that another kernel writes or reads. */
#ifndef TM_CUDA_PDL_CUH
#define TM_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

/* Wait until the previous kernel on the stream has completed and its writes are visible, then let the next
 * PDL kernel be scheduled (it too waits for this one to complete before touching memory, so triggering at once
 * is safe). Both are no-ops in a kernel launched without the attribute. */
__device__ __forceinline__ void tm_pdl_enter() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

static inline bool tm_pdl_on() {
    const char *v = getenv("TM_CUDA_PDL");
    return v && !strcmp(v, "1");
}

/* kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when
 * TM_CUDA_PDL=1 (every kernel launched through here must call tm_pdl_enter() first); returns the launch error. */
template <typename... KArgs, typename... Args>
static cudaError_t tm_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = tm_pdl_on() ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (e != cudaSuccess) (void)cudaGetLastError(); /* reported once, here */
    return e;
}

#endif /* TM_CUDA_PDL_CUH */
