/* tm_cuda_launch.cuh -- what the launchers share: environment switches, the alignment test of the vector paths,
 * and programmatic dependent launch (sm_90) for the kernels of a decode step: a kernel launched by tm_launch while
 * TM_CUDA_PDL=1 may be scheduled while the kernel before it on the stream is still running; it calls
 * tm_pdl_enter() before its first access to global memory that another kernel writes or reads. */
#ifndef TM_CUDA_LAUNCH_CUH
#define TM_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

/* Wait until the previous kernel on the stream has completed and its writes are visible, then let the next
 * PDL kernel be scheduled (it too waits for this one to complete before touching memory, so triggering at once
 * is safe). Both are no-ops in a kernel launched without the attribute. */
__device__ __forceinline__ void tm_pdl_enter() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* an environment switch (TM_CUDA_<KERNEL>_V=1 and the like) is on when it is exactly "1" */
static inline bool tm_env_is_1(const char *name) {
    const char *s = getenv(name);
    return s && s[0] == '1' && s[1] == '\0';
}

/* the vector paths move 16 bytes per access */
static inline bool tm_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline bool tm_pdl_on() { return tm_env_is_1("TM_CUDA_PDL"); }

/* kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when pdl is set
 * (the kernel must then call tm_pdl_enter() before touching memory); returns the launch error. */
template <typename... KArgs, typename... Args>
static cudaError_t tm_launch_ex(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (e != cudaSuccess) (void)cudaGetLastError(); /* reported once, here */
    return e;
}

/* tm_launch_ex with the attribute when TM_CUDA_PDL=1 (every kernel launched through here calls tm_pdl_enter()
 * first) */
template <typename... KArgs, typename... Args>
static cudaError_t tm_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args... args) {
    return tm_launch_ex(tm_pdl_on(), kernel, grid, block, smem, stream, args...);
}

#endif /* TM_CUDA_LAUNCH_CUH */
