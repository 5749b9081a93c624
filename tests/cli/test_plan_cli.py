"""End-to-end tests of `tokenmill plan`, the KV/memory planner (budget - weights - workspace = KV pool)."""
import json
import os
import resource
import subprocess
import sys

import pytest

from conftest import MODEL, TOKENMILL


def tm(*args, timeout=120):
    return subprocess.run([TOKENMILL, *args], capture_output=True, text=True, timeout=timeout)


def _plan_wired():
    if not os.path.exists(TOKENMILL):
        return False
    r = tm("plan")
    return "unknown command" not in r.stderr


pytestmark = pytest.mark.skipif(not _plan_wired(), reason="`tokenmill plan` is not built or not wired into main.c yet")


def plan_json(*args):
    r = tm("plan", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---- the seed chapter's 7B example ----------------------------------------------------------------

def test_llama2_7b_on_80gb():
    j = plan_json("-m", "dummy:llama2-7b", "--mem", "80GB", "--ctx", "4096")
    # 2 (K,V) x L x h x 2 bytes with L = 32, h = 4096
    assert j["kv_bytes_per_token"] == 2 * 32 * 4096 * 2 == 512 * 1024
    assert "32 layers" in j["kv_formula"] and "32 kv_heads" in j["kv_formula"] and "128 head_dim" in j["kv_formula"]
    assert j["bytes_per_seq"] == 2 * 1024**3  # 2 GiB per 4096-token request
    assert j["mem_bytes"] == 80 * 10**9
    # Llama-2-7b: 6,738,415,616 parameters in f16, the 65 norm vectors kept in f32
    assert j["weight_bytes"] == 2 * 6738415616 + 65 * 4096 * 2
    # the forward pass's f32 buffers: x, xb, proj, hsel, q, att (4096 each), k, v (4096), hb, hb2 (11008), logits (32000)
    assert j["workspace_bytes"] == 512 * 4 * (8 * 4096 + 2 * 11008 + 32000)
    assert j["kv_budget_bytes"] == j["mem_bytes"] - j["weight_bytes"] - j["workspace_bytes"]
    assert j["block_bytes"] == 16 * j["kv_bytes_per_token"]
    assert j["n_blocks"] == j["kv_budget_bytes"] // j["block_bytes"]
    assert j["max_seqs"] == j["n_blocks"] // (4096 // 16)
    assert j["max_seqs"] == 30  # "about 30 concurrent requests": 66.3 GB / 2.15 GB = 30.9


def test_text_output_shows_the_breakdown():
    r = tm("plan", "-m", "dummy:llama2-7b", "--mem", "80GB", "--ctx", "4096")
    assert r.returncode == 0, r.stderr
    j = plan_json("-m", "dummy:llama2-7b", "--mem", "80GB", "--ctx", "4096")
    out = r.stdout
    assert "= 524288 B = 512 KiB" in out
    assert "4096 tokens = 256 blocks = 2 GiB" in out
    assert "max concurrent requests of 4096 tokens: 30" in out
    for key in ("mem_bytes", "weight_bytes", "workspace_bytes", "kv_budget_bytes", "n_blocks"):
        assert str(j[key]) in out, key


def test_dummy_shapes_are_not_generated():
    # planning llama3-8b must not allocate its 16 GB of weights: measure the child's peak memory
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True);"
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code, TOKENMILL, "plan", "-m", "dummy:llama3-8b", "--mem", "80GB"],
                       capture_output=True, text=True, timeout=60)
    rc, maxrss_kb = map(int, r.stdout.split())
    assert rc == 0
    assert maxrss_kb < 200 * 1024


def test_gqa_and_kv_dtypes():
    f16 = plan_json("-m", "dummy:llama3-8b", "--mem", "80GB", "--ctx", "8192")
    assert f16["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 128 * 1024  # 8 kv heads: a quarter of MHA
    assert f16["weight_bytes"] == 2 * 8030261248 + 65 * 4096 * 2
    assert f16["ctx"] == 8192 and f16["bytes_per_seq"] == 1024**3
    bf16 = plan_json("-m", "dummy:llama3-8b", "--mem", "80GB", "--ctx", "8192", "--kv-dtype", "bf16")
    f32 = plan_json("-m", "dummy:llama3-8b", "--mem", "80GB", "--ctx", "8192", "--kv-dtype", "f32")
    assert bf16["kv_bytes_per_token"] == f16["kv_bytes_per_token"]
    assert f32["kv_bytes_per_token"] == 2 * f16["kv_bytes_per_token"]
    assert f32["kv_budget_bytes"] == f16["kv_budget_bytes"]
    assert f32["n_blocks"] == f16["kv_budget_bytes"] // (2 * f16["block_bytes"])
    fp8 = plan_json("-m", "dummy:llama3-8b", "--mem", "80GB", "--ctx", "8192", "--kv-dtype", "fp8")
    assert fp8["kv_bytes_per_token"] * 2 == f16["kv_bytes_per_token"] and fp8["kv_dtype"] == "fp8_e4m3"
    assert fp8["n_blocks"] == f16["kv_budget_bytes"] // (f16["block_bytes"] // 2)
    assert fp8["max_seqs"] >= 2 * f16["max_seqs"]
    # weight type of a dummy: q8_0 is 34 bytes per 32 weights
    q8 = plan_json("-m", "dummy:llama3-8b:q8_0", "--mem", "80GB")
    assert abs(q8["weight_bytes"] / f16["weight_bytes"] - 34 / 64) < 0.001
    # fp8 (W8A8): the linears in one byte each, embedding and output projection bf16, norms f32
    w8 = plan_json("-m", "dummy:llama3-8b:fp8", "--mem", "80GB")
    assert w8["weight_bytes"] == 6979321856 + 2 * 2 * 525336576 + 65 * 4096 * 4
    r = tm("plan", "-m", "dummy:llama3-8b:fp8", "--mem", "80GB")
    assert r.returncode == 0 and "fp8_e4m3 linears (W8A8), bf16 embedding and output" in r.stdout


def test_units_block_rounding_and_defaults():
    gib = plan_json("-m", "dummy:llama2-7b", "--mem", "80GiB", "--ctx", "4097", "--block-size", "32",
                    "--workspace-tokens", "1024")
    assert gib["mem_bytes"] == 80 * 2**30
    assert gib["block_size"] == 32 and gib["blocks_per_seq"] == 129  # ceil(4097 / 32)
    assert gib["bytes_per_seq"] == 129 * 32 * 512 * 1024
    assert gib["workspace_tokens"] == 1024 and gib["workspace_bytes"] == 1024 * 4 * (8 * 4096 + 2 * 11008 + 32000)
    assert gib["max_seqs"] == gib["n_blocks"] // 129
    assert plan_json("-m", "dummy:llama2-7b", "--mem", "80G")["mem_bytes"] == 80 * 10**9
    assert plan_json("-m", "dummy:llama2-7b", "--mem", "85899345920")["mem_bytes"] == 80 * 2**30
    d = plan_json("-m", "dummy:llama2-7b", "--mem", "80GB")  # defaults: training context, f16, 16-token blocks
    assert d["ctx"] == 4096 and d["kv_dtype"] == "f16" and d["block_size"] == 16 and d["workspace_tokens"] == 512


def test_gguf_model_matches_its_file():
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(MODEL)

    def field(name):
        f = reader.fields[name]
        return int(f.parts[f.data[0]][0])

    layers, heads, kv_heads, dim = (field("llama.block_count"), field("llama.attention.head_count"),
                                    field("llama.attention.head_count_kv"), field("llama.embedding_length"))
    j = plan_json("-m", MODEL, "--mem", "4GiB", "--ctx", "2048")
    assert j["n_layers"] == layers and j["n_kv_heads"] == kv_heads
    assert j["kv_bytes_per_token"] == 2 * layers * kv_heads * (dim // heads) * 2
    # every tensor of this (tied, bias-free) model is a weight of the forward pass
    assert j["weight_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)


# ---- errors ---------------------------------------------------------------------------------------

def test_budget_smaller_than_weights_is_an_error():
    j = plan_json("-m", "dummy:llama2-7b", "--mem", "80GB")
    r = tm("plan", "-m", "dummy:llama2-7b", "--mem", "10GB")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "10000000000" in lines[0] and str(j["weight_bytes"]) in lines[0] and str(j["workspace_bytes"]) in lines[0]


@pytest.mark.parametrize("args", [
    ["--mem", "80XB"], ["--mem", "-5GB"], ["--mem", "0"], ["--mem", "1.5"], ["--mem", ""], [],
    ["--mem", "80GB", "--kv-dtype", "q4_0"], ["--mem", "80GB", "--block-size", "0"], ["--mem", "80GB", "--ctx", "0"],
    ["--mem", "80GB", "--ctx", "abc"], ["--mem", "80GB", "--workspace-tokens", "-1"], ["--mem", "80GB", "--frobnicate"],
    ["--mem"],
])
def test_bad_flags_are_usage_errors(args):
    r = tm("plan", "-m", "dummy:llama2-7b", *args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stdout == "" and "tokenmill plan:" in r.stderr


def test_bad_model_is_an_error():
    for m in ("dummy:nosuch", "dummy:llama2-7b:q9", "/nonexistent.gguf"):
        r = tm("plan", "-m", m, "--mem", "80GB")
        assert r.returncode == 1, m
        assert r.stdout == "" and r.stderr.startswith("tokenmill plan: ")
