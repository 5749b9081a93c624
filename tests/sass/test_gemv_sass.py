"""What ptxas makes of the batch-1 GEMV kernels (and the fp8 tensor-core GEMV), checked without a GPU (tests/sass;
run by `make test`).

Two findings of the twenty-third session (docs/PERFORMANCE.md) that a compiler upgrade or a small edit can undo
silently, each worth 1-3% of batch-1 decode on an H200:
  - the hot batch-1 kernels (bf16 and fp8 weights: q|k|v with RoPE, o and down with the residual, gate/up with
    SwiGLU, the output projection) compile without register spills beyond the known, measured ones (KNOWN_SPILLS);
  - under programmatic dependent launch each lane issues exactly kLoadsBeforeWait weight loads before
    griddepcontrol.wait (SASS ACQBULK); ptxas hoists the wait above .nc loads, which is where every load sat before.
The tensor-core GEMV (tm_cuda_gemv_fp8tc.cu, twenty-eighth session: fp8 weights, x rounded in the kernel or before;
twenty-ninth: bf16 and f16 weights at batch 3-8) is held to the same two: no spills, and all of its first round's
weight loads before the PDL wait (measured best for fp8).
Compiles src/backend/cuda/tm_cuda_gemv.cu for sm_90a as CMake does (about a minute on two cores); the SASS check
uses nvdisasm from the nvidia-cuda-nvdisasm wheel (scripts/deps.sh --test installs it where nvcc is present).
Skipped on a machine without nvcc."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src/backend/cuda/tm_cuda_gemv.cu")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cuda_spills  # noqa: E402  (the ptxas -v parser)

# (weight type, epilogue, norm-in) of the kernels a batch-1 decode step runs (EPI_PLAIN 0, SWIGLU 1, NORM 2, ROPE 3)
HOT = [("t_bf16", 3, 1), ("t_bf16", 2, 0), ("t_bf16", 1, 0), ("t_bf16", 0, 1),
       ("t_fp8", 3, 0), ("t_fp8", 2, 0), ("t_fp8", 1, 0), ("t_fp8", 0, 0)]
# spills known and measured with (bytes stored, loaded): the output projection with norm-in has spilled 4 bytes
# since the first loads moved before the PDL wait (debe711); the end-to-end gain was measured with it. A kernel
# may not spill more than this
KNOWN_SPILLS = {("t_bf16", 0, 1): (4, 4)}


def nvcc_path():
    return shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.access(p, os.X_OK)), None)


def nvdisasm_path():
    found = shutil.which("nvdisasm")
    if found:
        return found
    wheel = os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cu*", "bin", "nvdisasm")
    for p in glob.glob(wheel):
        if os.access(p, os.X_OK):
            return p
    return None


def mangled(t, epi, nin):
    """the Itanium name fragment of gemv_kernel_v2<tmq::T, 1, EPI, NIN, false> (XS: x not staged, as for every
    dense type)"""
    return f"gemv_kernel_v2IN3tmq{len(t)}{t}ELi1ELi{epi}ELb{nin}ELb0EE"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    nvcc = nvcc_path()
    if not nvcc:
        pytest.skip("no nvcc: the CUDA backend is not built on this machine")
    out = tmp_path_factory.mktemp("sass") / "gemv.cubin"
    cmd = [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-DNDEBUG", "-D_GNU_SOURCE", "-std=c++17",
           "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "include"), "-I", os.path.join(ROOT, "src"),
           "-Xptxas", "-v", "-o", str(out), SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r.stderr


def find(names, frag):
    hits = [n for n in names if frag in n]
    assert len(hits) == 1, f"{frag}: {len(hits)} kernels match"
    return hits[0]


def test_hot_kernels_do_not_spill(build):
    info = cuda_spills.ptxas_entries(build[1])
    assert len(info) > 100, "ptxas -v listed too few kernels"
    spilled = []
    for t, e, n in HOT:
        frame, st, ld = info[find(info, mangled(t, e, n))][:3]
        known = KNOWN_SPILLS.get((t, e, n), (0, 0))
        if st > known[0] or ld > known[1]:
            spilled.append(f"{t} epi {e} nin {n}: frame {frame}, stores {st}, loads {ld} (known {known})")
    assert not spilled, "batch-1 GEMV kernels that spill more than known: " + "; ".join(spilled)


def test_first_loads_before_pdl_wait(build):
    dis = nvdisasm_path()
    if not dis:
        pytest.skip("no nvdisasm (pip install nvidia-cuda-nvdisasm)")
    want = int(re.search(r"constexpr int kLoadsBeforeWait = (\d+);", open(SRC).read()).group(1))
    r = subprocess.run([dis, "-c", str(build[0])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    sections = {}
    for part in r.stdout.split("//--------------------- .text.")[1:]:
        sections[part.split(" ", 1)[0]] = part.splitlines()
    for t, e, n in HOT:
        lines = sections[find(sections, mangled(t, e, n))]
        wait = next(i for i, l in enumerate(lines) if "ACQBULK" in l)
        # weight loads carry the 256-byte L2 prefetch hint (tmq::ld_stream_v4 and its ordered twin); x's do not
        before = sum(1 for l in lines[:wait] if "LDG" in l and "LTC256B" in l)
        total = sum(1 for l in lines if "LDG" in l and "LTC256B" in l)
        assert total > want, f"{t} epi {e} nin {n}: {total} weight loads in all"
        assert before == want, f"{t} epi {e} nin {n}: {before} weight loads before the PDL wait, want {want}"


TC_SRC = os.path.join(ROOT, "src/backend/cuda/tm_cuda_gemv_fp8tc.cu")
# the tensor-core GEMV (tm_cuda_gemv_fp8tc.cu), gemv_fp8tc_v1<W, EPI, MODE>: known spills (bytes stored, loaded);
# none since the twenty-ninth session (the 1024-thread SwiGLU kernel, held to 64 registers, spilled 4 bytes before)
TC_KNOWN_SPILLS = {}


def test_fp8_tensor_core_kernels_do_not_spill(tmp_path):
    """every instance of the tensor-core GEMV (8 and 32 warps; plain, SwiGLU, RoPE; fp8 weights with x rounded in
    the kernel or before, bf16, f16) compiles without register spills beyond TC_KNOWN_SPILLS"""
    nvcc = nvcc_path()
    if not nvcc:
        pytest.skip("no nvcc: the CUDA backend is not built on this machine")
    cmd = [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-DNDEBUG", "-D_GNU_SOURCE", "-std=c++17",
           "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "include"), "-I", os.path.join(ROOT, "src"),
           "-Xptxas", "-v", "-o", str(tmp_path / "tc.cubin"), TC_SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    info = cuda_spills.ptxas_entries(r.stderr)
    names = [n for n in info if "gemv_fp8tc_v1" in n]
    assert len(names) == 24, f"{len(names)} instances of gemv_fp8tc_v1: {names}"
    spilled = []
    for n in names:
        frame, st, ld = info[n][:3]
        known = next((v for k, v in TC_KNOWN_SPILLS.items() if k in n), (0, 0))
        if st > known[0] or ld > known[1]:
            spilled.append(f"{n}: frame {frame}, stores {st}, loads {ld} (known {known})")
    assert not spilled, "fp8 tensor-core GEMV kernels that spill more than known: " + "; ".join(spilled)


def test_fp8_tensor_core_first_loads_before_pdl_wait(tmp_path):
    """every instance of the tensor-core GEMV keeps each weight load of its first round before griddepcontrol.wait:
    8 a lane at 8 warps, 4 at 32 (U halved); measured best for fp8 (docs/PERFORMANCE.md, twenty-eighth session: 8
    before the wait against 3 or 0). With fp8 x rounded in the kernel (MODE 0) ptxas leaves its .nc loads there
    (LDG ... CONSTANT); in the other modes it moved them past the wait, so their first round is ordered loads
    (LDG ... STRONG.GPU; the later rounds' .nc loads, predicated off in the first, may sit above the wait)"""
    nvcc, dis = nvcc_path(), nvdisasm_path()
    if not nvcc:
        pytest.skip("no nvcc: the CUDA backend is not built on this machine")
    if not dis:
        pytest.skip("no nvdisasm (pip install nvidia-cuda-nvdisasm)")
    out = tmp_path / "tc.cubin"
    cmd = [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-DNDEBUG", "-D_GNU_SOURCE", "-std=c++17",
           "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "include"), "-I", os.path.join(ROOT, "src"),
           "-o", str(out), TC_SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([dis, "-c", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = 0
    for part in r.stdout.split("//--------------------- .text.")[1:]:
        name = part.split(" ", 1)[0]
        m = re.search(r"gemv_fp8tc_v1ILi(\d+)ELi(\d)ELi(\d)E", name)
        if not m:
            continue
        warps, epi, mode = int(m.group(1)), int(m.group(2)), int(m.group(3))
        lines = part.splitlines()
        wait = next(i for i, l in enumerate(lines) if "ACQBULK" in l)
        kind = "CONSTANT" if mode == 0 else "STRONG.GPU"
        before = sum(1 for l in lines[:wait] if "LDG" in l and ".NA." in l and kind in l)
        want = 8 if warps == 8 else 4
        assert before == want, (f"{warps} warps, epilogue {epi}, mode {mode}: {before} {kind} loads before the PDL "
                                f"wait, want {want}")
        seen += 1
    assert seen == 24, f"{seen} instances"
