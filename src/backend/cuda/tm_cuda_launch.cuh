/* tm_cuda_launch.cuh -- what the launchers share: environment switches, the alignment test of the vector paths,
 * and programmatic dependent launch (sm_90) for the kernels of a decode step: a kernel launched with the attribute
 * (the GEMVs by default, every kernel launched by tm_launch with TM_CUDA_PDL=1) may be scheduled while the kernel
 * before it on the stream is still running; it waits (tm_pdl_enter, or the GEMV's own wait) before its first
 * access to global memory that another kernel writes or reads, and never reads such memory through the
 * read-only path (__ldg, const __restrict__), which may be hoisted above the wait. */
#ifndef TM_CUDA_LAUNCH_CUH
#define TM_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

/* Let the next PDL kernel be scheduled, then wait until the previous kernel has completed and its writes are
 * visible. Triggering first is safe: the next kernel waits in turn for this one to complete (and so, transitively,
 * for the one before) before it touches memory; it lets a GEMV behind this kernel issue its weight loads while
 * this one runs. Only the small kernels trigger first; the GEMVs trigger after their wait, so what waits ahead of
 * a running kernel is at most one small kernel and one GEMV. Both are no-ops in a kernel launched without the
 * attribute. */
__device__ __forceinline__ void tm_pdl_enter() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

/* The other order, for the GEMVs (tm_cuda_gemv.cu, tm_cuda_gemv_fp8tc.cu), whose first weight loads go before it:
 * wait for the previous kernel to complete (its writes visible), then let the next PDL kernel be scheduled (it waits
 * for this one in turn before it touches what this one writes). */
__device__ __forceinline__ void tm_pdl_wait_trigger() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* an environment switch (TM_CUDA_<KERNEL>_V=1 and the like) is on when it is exactly "1" */
static inline bool tm_env_is_1(const char *name) {
    const char *s = getenv(name);
    return s && s[0] == '1' && s[1] == '\0';
}

/* ... and off when it is exactly "0" */
static inline bool tm_env_is_0(const char *name) {
    const char *s = getenv(name);
    return s && s[0] == '0' && s[1] == '\0';
}

/* the vector paths move 16 bytes per access */
static inline bool tm_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* TM_CUDA_PDL: unset (or "gemv") launches the GEMVs with programmatic dependent launch, "1" every kernel of a
 * decode step (measured slower than the GEMVs alone), "0" none */
static inline int tm_pdl_mode() {
    if (tm_env_is_0("TM_CUDA_PDL")) return 0;
    if (tm_env_is_1("TM_CUDA_PDL")) return 2;
    return 1;
}
static inline bool tm_pdl_on() { return tm_pdl_mode() == 2; }
static inline bool tm_pdl_gemv_on() { return tm_pdl_mode() >= 1; }

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
