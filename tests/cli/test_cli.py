"""End-to-end tests of the tokenmill command line on the default model."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import MODEL, ROOT, TOKENMILL


def tm(*args, input=None, timeout=300):
    return subprocess.run([TOKENMILL, *args], capture_output=True, text=True, input=input, timeout=timeout)


def run_json(*args):
    r = tm("run", "-m", MODEL, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_greedy_run_is_deterministic_and_reports_stats():
    a = run_json("-p", "The capital of France is", "-n", "12", "--temp", "0")
    b = run_json("-p", "The capital of France is", "-n", "12", "--temp", "0")
    assert a["text"] == b["text"]
    assert "Paris" in a["text"]
    for k in ("prompt_tokens", "tokens", "text", "ttft_ms", "prefill_tok_s", "decode_tok_s", "finish_reason"):
        assert k in a
    assert a["prompt_tokens"] == 5 and a["tokens"] == 12 and a["finish_reason"] == "length"
    assert a["ttft_ms"] > 0 and a["decode_tok_s"] > 0


def test_seed_reproducible_and_different_seeds_differ():
    args = ["-p", "Once upon a time", "-n", "24", "--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
    a = run_json(*args, "--seed", "7")
    b = run_json(*args, "--seed", "7")
    c = run_json(*args, "--seed", "8")
    assert a["text"] == b["text"]
    assert a["text"] != c["text"]


def test_stop_string_truncates_output():
    full = run_json("-p", "The capital of France is", "-n", "12", "--temp", "0")["text"]
    assert "." in full
    r = run_json("-p", "The capital of France is", "-n", "12", "--temp", "0", "--stop", ".")
    assert r["finish_reason"] == "stop"
    assert r["text"] == full[: full.index(".")]


def test_chat_answers_and_stops_at_end_of_turn():
    r = run_json("--chat", "-p", "What is the capital of France?", "-n", "40", "--temp", "0")
    assert "Paris" in r["text"]
    assert r["finish_reason"] == "stop" and r["tokens"] < 40
    assert "<|im_end|>" not in r["text"]


def test_plain_stdout_is_only_the_completion():
    r = tm("run", "-m", MODEL, "-p", "The capital of France is", "-n", "6", "--temp", "0")
    assert r.returncode == 0
    j = run_json("-p", "The capital of France is", "-n", "6", "--temp", "0")
    assert r.stdout == j["text"] + "\n"
    assert "tok/s" in r.stderr


def test_tokenize_matches_known_ids():
    r = tm("tokenize", "-m", MODEL, "Hello, world!")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [19556, 28, 905, 17]
    r = tm("tokenize", "-m", MODEL, "<|im_start|>hi")
    assert json.loads(r.stdout)[0] == 1
    r = tm("tokenize", "-m", MODEL, "--no-special", "<|im_start|>hi")
    assert json.loads(r.stdout)[0] != 1


def test_inspect_lists_metadata_and_tensors():
    r = tm("inspect", MODEL)
    assert r.returncode == 0, r.stderr
    assert "llama.block_count" in r.stdout and "token_embd.weight" in r.stdout and "q4_1" in r.stdout


def test_inspect_refuses_corrupt_file(tmp_path):
    data = open(MODEL, "rb").read(4096)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data)  # truncated: the tensor data is missing
    r = tm("inspect", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith("tokenmill: ") and len(r.stderr.strip().splitlines()) == 1
    r = tm("run", "-m", str(bad), "-p", "x")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["run", "-p", "x", "--temp", "abc"], "bad temperature"),
    (["run", "-p", "x", "-n", "-5"], "bad token count"),
    (["run", "-p", "x", "--top-p", "1.5"], "bad top-p"),
    (["run", "-p", "x", "--bogus"], "unknown option"),
    (["run", "-p"], "needs a value"),
    (["run"], "needs a prompt"),
    (["run", "-p", "x", "-t", "0"], "bad thread count"),
    (["frobnicate"], "unknown command"),
    (["tokenize"], "needs TEXT"),
    (["run", "-p", "x", "--kv-cache-dtype", "int4"], "bad KV cache type"),
])
def test_bad_flags_get_one_line_error_and_usage(args, needle):
    r = tm(*args)
    assert r.returncode == 2
    first = r.stderr.splitlines()[0]
    assert first.startswith("tokenmill: ") and needle in first
    assert "usage:" in r.stderr


def test_fp8_kv_cache_on_the_cpu():
    # K and V rounded to e4m3 (a quarter of the f32 cache's bytes): deterministic, and on this prompt the same
    # greedy text as the f32 cache for 24 tokens (rounding can part them later, after a near-tie)
    args = ["-p", "The capital of France is", "-n", "24", "--temp", "0"]
    f32 = run_json(*args, "--kv-cache-dtype", "f32")
    a = run_json(*args, "--kv-cache-dtype", "fp8")
    b = run_json(*args, "--kv-cache-dtype", "fp8_e4m3")
    assert a["text"] == b["text"] and a["tokens"] == 24
    assert a["text"] == f32["text"] and "Paris" in a["text"]


def test_f16_kv_cache_on_the_cpu():
    # the cpu default (auto): K and V rounded to f16, half of the f32 cache's bytes; on this prompt the f32
    # cache's greedy text; the KV cache type in the throughput report; bf16 is refused on the cpu
    args = ["-p", "The capital of France is", "-n", "24", "--temp", "0"]
    f32 = run_json(*args, "--kv-cache-dtype", "f32")
    h = run_json(*args, "--kv-cache-dtype", "f16")
    auto = run_json(*args)
    assert h["tokens"] == 24 and h["text"] == f32["text"] == auto["text"] and "Paris" in h["text"]
    r = tm("run", "-m", MODEL, "-p", "x", "-n", "1", "--kv-cache-dtype", "bf16")
    assert r.returncode == 1 and "cpu KV cache supports f32, f16 and fp8_e4m3, not bf16" in r.stderr
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "2", "--input-len", "8", "--output-len", "3",
           "--kv-cache-dtype", "f16", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv_cache_dtype"] == "f16"
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "2", "--input-len", "8", "--output-len", "3", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["kv_cache_dtype"] == "f16"  # the cpu's auto


def test_unknown_chat_template_and_long_prompt_are_clear_errors():
    r = tm("run", "-m", MODEL, "--chat", "--chat-template", "nope", "-p", "hi")
    assert r.returncode == 1 and "nope" in r.stderr
    r = tm("run", "-m", MODEL, "-c", "64", "-p", "word " * 100)
    assert r.returncode == 1 and "context is 64" in r.stderr


def test_dummy_model_generates():
    r = tm("run", "-m", "dummy:smollm2-135m:q8_0", "-p", "abc", "-n", "4", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == 4


def test_dummy_fp8_model_generates():
    # fp8 e4m3 linears (W8A8) on the cpu: greedy text does not depend on the prefill chunk (-b 2: 2 tokens a pass)
    args = ("run", "-m", "dummy:smollm2-135m:fp8", "-p", "abc", "-n", "4", "--ignore-eos", "--json", "--temp", "0",
            "-c", "64")
    a, b = tm(*args), tm(*args, "-b", "2")
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert json.loads(a.stdout)["tokens"] == 4
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"]
    r = tm("run", "-m", "dummy:smollm2-135m:fp9", "-p", "abc")
    assert r.returncode == 1 and "fp8" in r.stderr


def test_interactive_chat_keeps_the_conversation():
    r = tm("chat", "-m", MODEL, "--temp", "0", "-n", "24",
           input="What is the capital of France?\nAnd of Germany?\n\n")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert "Paris" in lines[0]
    assert "Berlin" in r.stdout


def test_dummy_llama32_shape_generates():
    r = tm("run", "-m", "dummy:llama3.2-1b:q4_0", "-p", "xyz", "-n", "2", "--ignore-eos", "--json", "-c", "64")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == 2


def test_bench_latency_reports_json():
    r = tm("bench", "latency", "-m", MODEL, "--input-len", "32", "--output-len", "4", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["pp"] == 32 and j["tg"] == 4 and j["depth"] == 0 and j["pp_tok_s"] > 0 and j["tg_tok_s"] > 0
    # --depth D: the decode after a D-token prompt, and the prefill of I more tokens after D cached ones (llama-bench's
    # tg and pp at depth: the D tokens' full blocks come from the prefix cache, in every rep, and no more of them);
    # past the context, a clear error
    r = tm("bench", "latency", "-m", MODEL, "--input-len", "16", "--output-len", "4", "--depth", "300", "-r", "2",
           "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["depth"] == 300 and j["tg"] == 4 and j["tg_tok_s"] > 0
    assert j["pp_cached"] == 288 and j["pp_tok_s"] > 0
    r = tm("bench", "latency", "-m", MODEL, "--input-len", "16", "--output-len", "4", "--depth", "8190", "-r", "1")
    assert r.returncode != 0 and "larger than the model's" in r.stderr
    r = tm("bench", "latency", "-m", MODEL, "--batch", "2", "--depth", "8")
    assert r.returncode != 0 and "--depth is for the single-stream" in r.stderr


def test_repeat_window():
    # --repeat-last-n: 0 turns the repeat penalty off (the greedy text of no penalty), 4 changes the greedy text,
    # out of range is a usage error
    base = ["-p", "one two one two one two", "-n", "24", "--temp", "0"]
    plain = run_json(*base)["text"]
    assert run_json(*base, "--repeat-penalty", "3", "--repeat-last-n", "0")["text"] == plain
    assert run_json(*base, "--repeat-penalty", "3", "--repeat-last-n", "4")["text"] != plain
    r = tm("run", "-m", MODEL, *base, "--repeat-last-n", "-2")
    assert r.returncode != 0 and "bad repeat window" in r.stderr


def test_logprobs_in_json():
    r = run_json("-p", "The capital of France is", "-n", "3", "--temp", "0", "--logprobs", "5")
    assert len(r["logprobs"]) == 3
    for e in r["logprobs"]:
        tops = [t["logprob"] for t in e["top"]]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert e["top"][0]["id"] == e["id"] and e["logprob"] == tops[0]  # greedy picks the most likely
        assert sum(2.718281828 ** t for t in tops) <= 1.0 + 1e-6


def test_bench_throughput_and_batched_latency_json():
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "6", "--input-len", "24", "--output-len-dist",
           "uniform:2:6", "--shared-prefix", "16", "--max-seqs", "3", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["num_prompts"] == 6 and 12 <= j["output_tokens"] <= 36
    assert j["prefix_hit_tokens"] >= 16  # later prompts reuse the shared 16-token block
    assert j["ttft_ms_p50"] <= j["ttft_ms_p99"] and j["output_tok_s"] > 0
    assert j["greedy"] is True
    # a sampling option makes every request sampled with it (penalties and logprobs included); --seed alone is the
    # prompts' seed and keeps the run greedy
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "3", "--input-len", "8", "--output-len", "4",
           "--temp", "0.7", "--repeat-penalty", "1.2", "--logprobs", "2", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["greedy"] is False and j["output_tokens"] == 12
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "2", "--input-len", "8", "--output-len", "2",
           "--seed", "5", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["greedy"] is True
    r = tm("bench", "latency", "-m", MODEL, "--batch", "2", "--input-len", "16", "--output-len", "4", "--bw", "20",
           "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["batch"] == 2 and j["tg_tok_s"] > 0 and j["bound"] in ("memory", "compute")
    assert j["floor_ms"] == max(j["floor_mem_ms"], j["floor_compute_ms"])
    assert j["bw_groups"] == 0 and j["pct_of_floor_min"] == j["pct_of_floor"] == j["pct_of_floor_max"]
    # --bw auto: the bandwidth probed next to every group of 8 timed decode steps, each after an untimed one
    # (19 steps: 1 + 8, 1 + 8, 1: 2 groups, 3 probes)
    r = tm("bench", "latency", "-m", MODEL, "--batch", "1", "--input-len", "8", "--output-len", "20", "--bw", "auto",
           "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["bw_groups"] == 2 and j["bw_gb_s"] > 0.1
    assert 0 < j["pct_of_floor_min"] <= j["pct_of_floor"] <= j["pct_of_floor_max"]
    r = tm("bench", "latency", "-m", MODEL, "--batch", "1", "--input-len", "8", "--output-len", "2", "--bw", "auto")
    assert r.returncode != 0 and "--output-len >= 3" in r.stderr


def load_bench(name):
    """bench/NAME.py as a module (the scripts are not a package)"""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_throughput_step_trace(tmp_path):
    trace = tmp_path / "steps.txt"
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "5", "--input-len", "20", "--output-len", "4",
           "--max-seqs", "2", "-b", "16", "--no-prefix-cache", "--step-trace", str(trace), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    rows = [ln.split() for ln in trace.read_text().splitlines() if not ln.startswith("#")]
    assert len(rows) == j["steps"]
    # every prompt token is prefilled once; every output token but each request's first is one decode token
    assert sum(int(x[5]) for x in rows) == 5 * 20
    assert sum(int(x[4]) for x in rows) == 5 * 20 + j["output_tokens"] - 5
    assert all(int(x[4]) <= 16 and int(x[3]) <= 2 for x in rows)  # the step budget and --max-seqs
    assert abs(sum(float(x[1]) for x in rows) - j["duration_s"]) < 0.05
    st = load_bench("step_trace")
    s = st.summarize(trace.read_text().splitlines())
    assert sum(c["tokens"] for c in s["classes"].values()) == 5 * 20 + j["output_tokens"] - 5
    assert abs(s["wall_s"] - j["duration_s"]) < 0.05
    # the one-line form scripts/gpu.sh puts in its table: decode-only steps | steps with prompt tokens
    d = s["classes"].get("decode", {"steps": 0})
    line = st.row(s)
    assert line.startswith(f'{d["steps"]} steps ') and f'| {j["steps"] - d["steps"]} steps ' in line
    # --row-file: that line written to a file, the summary printed, from one read of the trace
    rf = tmp_path / "row.txt"
    script = os.path.join(ROOT, "bench", "step_trace.py")
    r = subprocess.run([sys.executable, script, str(trace), "--row-file", str(rf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert rf.read_text() == line + "\n" and r.stdout.startswith("wall ")
    # pipelined kinds: 'l' is charged to the step it launches, 'c' and 'w' to the step launched before them
    s = st.summarize(["0.1 0.1 l 4 4 0 4 0", "0.3 0.2 c 4 4 0 4 0", "0.6 0.3 w 0 0 0 4 0", "1.0 0.4 s 2 9 8 2 0",
                      "1.1 0.1 - 0 0 0 0 0"])
    assert s["idle_s"] == pytest.approx(0.1) and s["classes"]["decode"]["steps"] == 2
    assert s["classes"]["decode"]["s"] == pytest.approx(0.6) and s["classes"]["mixed"]["s"] == pytest.approx(0.4)
    r = tm("bench", "throughput", "-m", MODEL, "--num-prompts", "1", "--input-len", "4", "--output-len", "1",
           "--step-trace", str(tmp_path / "no" / "such" / "dir" / "t.txt"))
    assert r.returncode != 0 and "step trace" in r.stderr


def test_smi_summary_counts_busy_power_capped_samples():
    smi = load_bench("smi_summary")
    lines = ["77.1, 345, 0x0000000000000001",             # idle: not counted
             "690.0, 1500, 0x0000000000000004",           # capped
             "700 W, 1600 MHz, 0x0000000000000004",       # units tolerated
             "500.0, 1980, 0x0000000000000000",
             "garbage", "nan, x, 0x4"]
    r = smi.summarize(lines)
    assert r["samples"] == 3 and r["power_capped"] == pytest.approx(2 / 3)
    assert r["watts"] == pytest.approx((690 + 700 + 500) / 3) and r["sm_mhz"] == pytest.approx((1500 + 1600 + 1980) / 3)
    assert smi.summarize(["80, 345, 0x1"]) is None


def test_bench_rejects_bad_shapes():
    r = tm("bench", "throughput", "-m", MODEL, "--output-len-dist", "uniform:9:3")
    assert r.returncode == 2 and "bad output length distribution" in r.stderr
    r = tm("bench", "nope")
    assert r.returncode == 2
