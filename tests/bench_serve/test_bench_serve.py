"""End-to-end tests of `tokenmill bench serve` against a mock OpenAI streaming server with known timing."""
import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from bs_harness import TOKENMILL, bench, mock  # noqa: F401 (mock is a fixture)


def test_counts_latencies_and_throughput(mock):
    m = mock("--ttft-ms", 200, "--itl-ms", 20)
    r = bench("--base-url", m.url, "--num-prompts", 8, "--input-len", 32, "--output-len", 12)
    assert r.rc == 0, r.err
    j = r.j
    assert j["completed"] == 8 and j["failed"] == 0 and j["failures"] == []
    assert j["total_output_tokens"] == 8 * 12
    assert j["total_input_tokens"] == 8 * 32          # usage.prompt_tokens of the mock = len(ids)
    assert not j["input_tokens_estimated"] and not j["output_tokens_from_chunks"]
    assert j["model"] == "mock-model"                  # discovered through GET /v1/models
    assert j["url"] == m.url + "/v1/completions"
    # TTFT = the mock's first-chunk delay (+ connection and scheduling overhead), ITL/TPOT = its chunk gap
    assert 195 <= j["median_ttft_ms"] <= 400, j
    assert 195 <= j["p99_ttft_ms"] <= 600, j
    assert 17 <= j["median_itl_ms"] <= 40, j
    assert 18 <= j["mean_tpot_ms"] <= 50, j
    e2e = 200 + 11 * 20
    assert e2e - 5 <= j["median_e2e_ms"] <= e2e + 300, j
    # throughput is counts over the run time
    d = j["duration_s"]
    assert e2e / 1000 - 0.01 <= d <= 2.0
    assert j["request_throughput"] == pytest.approx(8 / d, rel=1e-9)
    assert j["output_throughput"] == pytest.approx(96 / d, rel=1e-9)
    assert j["total_token_throughput"] == pytest.approx((96 + 256) / d, rel=1e-9)
    assert j["peak_concurrency"] == 8
    for k in ("num_prompts", "request_rate", "max_concurrency", "input_len", "output_len", "prompt_kind", "seed",
              "interrupted", "p90_ttft_ms", "p90_itl_ms", "p99_e2e_ms", "mean_e2e_ms", "median_tpot_ms"):
        assert k in j
    assert j["request_rate"] == "inf" and j["max_concurrency"] is None and j["interrupted"] is False
    assert "goodput" not in j


def test_request_bodies_ids(mock):
    m = mock("--ttft-ms", 5, "--itl-ms", 1)
    r = bench("--base-url", m.url + "/v1/", "--num-prompts", 6, "--input-len", 50, "--output-len", 4,
              "--vocab-size", 1000, "--seed", 3)
    assert r.rc == 0, r.err
    assert r.j["url"] == m.url + "/v1/completions"    # a base URL ending in /v1 is not doubled
    bodies = m.stats()["bodies"]
    assert len(bodies) == 6
    for b in bodies:
        assert b["model"] == "mock-model"
        assert b["prompt_kind"] == "ids" and b["prompt_len"] == 50 and b["prompt_ids_ok"]
        assert 100 <= b["prompt_min"] and b["prompt_max"] < 1000
        assert b["stream"] is True and b["include_usage"] is True
        assert b["max_tokens"] == 4 and b["min_tokens"] == 4 and b["ignore_eos"] is True
        assert b["temperature"] == 0
        assert b["expect"] is None                     # no 100-continue round trip
    assert len({b["prompt_sig"] for b in bodies}) == 6  # every prompt differs
    # the same seed sends the same prompts, another seed others
    again = mock("--ttft-ms", 5, "--itl-ms", 1)
    assert bench("--base-url", again.url, "--num-prompts", 6, "--input-len", 50, "--output-len", 4,
                 "--vocab-size", 1000, "--seed", 3, "--max-concurrency", 1).rc == 0
    other = mock("--ttft-ms", 5, "--itl-ms", 1)
    assert bench("--base-url", other.url, "--num-prompts", 6, "--input-len", 50, "--output-len", 4,
                 "--vocab-size", 1000, "--seed", 4, "--max-concurrency", 1).rc == 0
    sigs = {b["prompt_sig"] for b in bodies}
    assert {b["prompt_sig"] for b in again.stats()["bodies"]} == sigs
    assert not ({b["prompt_sig"] for b in other.stats()["bodies"]} & sigs)


def test_extra_body_no_ignore_eos_and_model(mock):
    m = mock("--ttft-ms", 5, "--itl-ms", 1)
    r = bench("--base-url", m.url, "--model", "my-model", "--num-prompts", 2, "--input-len", 4, "--output-len", 3,
              "--no-ignore-eos", "--extra-body", '{"extra_field": 5, "temperature": 0.7}')
    assert r.rc == 0, r.err
    for b in m.stats()["bodies"]:
        assert b["model"] == "my-model"
        assert b["ignore_eos"] is None and b["min_tokens"] is None and b["max_tokens"] == 3
        assert b["extra"] == 5 and b["temperature"] == 0.7


def test_text_prompts_and_chat(mock):
    m = mock("--ttft-ms", 5, "--itl-ms", 1, "--prompt-tokens", 9)
    r = bench("--base-url", m.url, "--num-prompts", 4, "--input-len", 20, "--output-len", 5, "--prompt-kind", "text")
    assert r.rc == 0, r.err
    assert r.j["prompt_kind"] == "text"
    assert r.j["total_input_tokens"] == 4 * 9          # the server's count, not the word count
    for b in m.stats()["bodies"]:
        assert b["prompt_kind"] == "text" and b["prompt_len"] == 20
    c = mock("--ttft-ms", 5, "--itl-ms", 1)
    r = bench("--base-url", c.url, "--endpoint", "/v1/chat/completions", "--num-prompts", 3, "--input-len", 10,
              "--output-len", 6)
    assert r.rc == 0, r.err
    assert r.j["completed"] == 3 and r.j["total_output_tokens"] == 18 and r.j["prompt_kind"] == "text"
    for b in c.stats()["bodies"]:
        assert b["prompt_kind"] is None
        msgs = b["messages"]
        assert len(msgs) == 1 and msgs[0]["role"] == "user" and len(msgs[0]["content"].split()) == 10
    r = bench("--base-url", c.url, "--endpoint", "/v1/chat/completions", "--prompt-kind", "ids")
    assert r.rc == 2 and "chat" in r.err


def test_server_rejecting_ids_then_text(mock):
    m = mock("--ttft-ms", 5, "--itl-ms", 1, "--reject-ids")
    r = bench("--base-url", m.url, "--num-prompts", 3, "--input-len", 8, "--output-len", 2)
    assert r.rc == 1 and r.j["completed"] == 0
    assert r.failures() == {"http 400": 3}
    assert r.j["failures"][0]["example"] == "token ids not supported"
    r = bench("--base-url", m.url, "--num-prompts", 3, "--input-len", 8, "--output-len", 2, "--prompt-kind", "text")
    assert r.rc == 0 and r.j["completed"] == 3


def test_token_counts_from_usage_or_chunks(mock):
    m = mock("--ttft-ms", 20, "--itl-ms", 20, "--tokens-per-chunk", 2)
    r = bench("--base-url", m.url, "--num-prompts", 4, "--input-len", 8, "--output-len", 10)
    assert r.rc == 0, r.err
    j = r.j
    assert j["total_output_tokens"] == 4 * 20 and not j["output_tokens_from_chunks"]
    # TPOT divides by the usage count: 9 gaps of 20 ms over 19 tokens
    assert 9 * 20 / 19 * 0.9 <= j["mean_tpot_ms"] <= 9 * 20 / 19 * 1.6, j
    assert 18 <= j["median_itl_ms"] <= 40
    n = mock("--ttft-ms", 20, "--itl-ms", 20, "--tokens-per-chunk", 2, "--no-usage")
    j = bench("--base-url", n.url, "--num-prompts", 4, "--input-len", 8, "--output-len", 10).j
    assert j["completed"] == 4
    assert j["total_output_tokens"] == 4 * 10 and j["output_tokens_from_chunks"]
    assert j["input_tokens_estimated"] and j["total_input_tokens"] == 4 * 8
    assert 18 <= j["mean_tpot_ms"] <= 40


def test_poisson_arrivals(mock):
    m = mock("--ttft-ms", 5, "--itl-ms", 1)
    n, rate = 40, 20.0
    r = bench("--base-url", m.url, "--num-prompts", n, "--request-rate", rate, "--input-len", 8, "--output-len", 2,
              "--seed", 1)
    assert r.rc == 0, r.err
    assert r.j["request_rate"] == rate and r.j["completed"] == n
    arr = sorted(m.stats()["arrivals"])
    gaps = np.diff(arr)
    # the run takes about N/R (39 exponential gaps of mean 50 ms: sd of the sum 0.31 s)
    assert 1.0 <= arr[-1] - arr[0] <= 3.3
    assert abs(r.j["duration_s"] - (arr[-1] - arr[0])) < 0.5
    assert 0.025 <= gaps.mean() <= 0.08
    # exponential, not evenly spaced: the coefficient of variation is about 1 (0 for a fixed interval)
    assert gaps.std() / gaps.mean() > 0.6
    # rate inf: everything at once
    a = mock("--ttft-ms", 5, "--itl-ms", 1)
    assert bench("--base-url", a.url, "--num-prompts", 20, "--input-len", 8, "--output-len", 2).rc == 0
    arr = a.stats()["arrivals"]
    assert max(arr) - min(arr) < 0.5


def test_max_concurrency(mock):
    m = mock("--ttft-ms", 300, "--itl-ms", 10, "--chunks", 4)
    r = bench("--base-url", m.url, "--num-prompts", 12, "--max-concurrency", 3, "--input-len", 8, "--output-len", 4)
    assert r.rc == 0, r.err
    assert r.j["completed"] == 12 and r.j["max_concurrency"] == 3
    assert m.stats()["max_active"] == 3 and r.j["peak_concurrency"] == 3
    assert r.j["duration_s"] >= 4 * 0.33 - 0.05        # four waves of three
    # latencies count from the send, not from the (all at once) arrival
    assert r.j["p99_ttft_ms"] < 900
    u = mock("--ttft-ms", 300, "--itl-ms", 10, "--chunks", 4)
    r = bench("--base-url", u.url, "--num-prompts", 12, "--input-len", 8, "--output-len", 4)
    assert u.stats()["max_active"] == 12 and r.j["peak_concurrency"] == 12


def test_failures_are_counted_with_reasons(mock):
    m = mock("--ttft-ms", 10, "--itl-ms", 2, "--fail", "500:5,drop:7,malformed:11,error:13,nodone:17")
    r = bench("--base-url", m.url, "--num-prompts", 20, "--input-len", 8, "--output-len", 6)
    assert r.rc == 0, r.err
    assert r.j["completed"] == 11 and r.j["failed"] == 9
    assert r.failures() == {"http 500": 4, "disconnected": 2, "malformed chunk": 1, "error event": 1,
                            "incomplete stream": 1}
    ex = {f["reason"]: f["example"] for f in r.j["failures"]}
    assert ex["http 500"] == "mock internal error"
    assert ex["error event"] == "mock failed mid-stream"
    assert "{this is not json" in ex["malformed chunk"]
    assert r.j["total_output_tokens"] == 11 * 6        # only successful requests count
    # the human report lists them too
    t = bench("--base-url", m.url, "--num-prompts", 20, "--input-len", 8, "--output-len", 6, json_out=False)
    assert "Failed requests:" in t.out and "http 500" in t.out and "disconnected" in t.out


def test_timeouts_never_hang(mock):
    m = mock("--ttft-ms", 10, "--itl-ms", 2, "--fail", "hang:2,stall:3")
    t0 = time.monotonic()
    r = bench("--base-url", m.url, "--num-prompts", 6, "--input-len", 8, "--output-len", 4, "--timeout", 1.5,
              timeout=30)
    took = time.monotonic() - t0
    assert r.rc == 0, r.err
    assert r.j["completed"] == 2 and r.failures() == {"timeout": 4}
    assert 1.4 <= r.j["duration_s"] <= 4 and took < 8


def test_unreachable_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                         # nothing listens there now
    r = bench("--base-url", "http://127.0.0.1:%d" % port, "--model", "m", "--num-prompts", 5, timeout=30)
    assert r.rc == 1
    assert r.j["completed"] == 0 and r.failures() == {"connect failed": 5}
    assert r.j["mean_ttft_ms"] is None and r.j["request_throughput"] == 0
    r = bench("--base-url", "http://127.0.0.1:%d" % port, "--num-prompts", 5, timeout=30)
    assert r.rc == 1 and "give --model" in r.err


def test_goodput(mock):
    # odd requests (by arrival) get their first token after 50 ms, even ones after 450 ms
    m = mock("--ttft-ms", 50, "--ttft-step-ms", 400, "--ttft-cycle", 2, "--itl-ms", 10, "--chunks", 4)
    r = bench("--base-url", m.url, "--num-prompts", 10, "--input-len", 8, "--output-len", 4, "--goodput", "ttft:250")
    assert r.rc == 0, r.err
    j = r.j
    assert j["goodput_slo_ms"] == {"ttft": 250}
    assert j["good_requests"] == 5
    assert j["goodput"] == pytest.approx(5 / j["duration_s"], rel=1e-9)
    j = bench("--base-url", m.url, "--num-prompts", 10, "--input-len", 8, "--output-len", 4,
              "--goodput", "ttft:1000,tpot:1").j     # TPOT ~10 ms misses 1 ms
    assert j["good_requests"] == 0 and j["goodput"] == 0
    j = bench("--base-url", m.url, "--num-prompts", 10, "--input-len", 8, "--output-len", 4,
              "--goodput", "e2e:5000,tpot:100").j
    assert j["good_requests"] == 10 and j["goodput_slo_ms"] == {"tpot": 100, "e2e": 5000}
    t = bench("--base-url", m.url, "--num-prompts", 10, "--input-len", 8, "--output-len", 4, "--goodput", "ttft:250",
              json_out=False)
    assert "Goodput (req/s):" in t.out and "5 good requests" in t.out


def test_percentiles_match_numpy(mock):
    # ten requests with first-token delays 100, 150, ..., 550 ms
    m = mock("--ttft-ms", 100, "--ttft-step-ms", 50, "--ttft-cycle", 10, "--itl-ms", 5, "--chunks", 2)
    r = bench("--base-url", m.url, "--num-prompts", 10, "--input-len", 8, "--output-len", 2)
    assert r.rc == 0, r.err
    v = np.arange(100, 551, 50, dtype=float)
    for key, want in (("mean", v.mean()), ("median", np.percentile(v, 50)), ("p90", np.percentile(v, 90)),
                      ("p99", np.percentile(v, 99))):
        got = r.j["%s_ttft_ms" % key]
        assert want - 1 <= got <= want + 80, (key, got, want)


def test_thousand_concurrent_streams(mock):
    m = mock("--ttft-ms", 3000, "--itl-ms", 50, "--chunks", 3)
    r = bench("--base-url", m.url, "--num-prompts", 1000, "--input-len", 8, "--output-len", 3, timeout=120)
    assert r.rc == 0, r.err
    assert r.j["completed"] == 1000 and r.j["failed"] == 0
    assert r.j["total_output_tokens"] == 3000
    assert m.stats()["max_active"] == 1000 and r.j["peak_concurrency"] == 1000


def test_human_report(mock):
    m = mock("--ttft-ms", 20, "--itl-ms", 5)
    r = bench("--base-url", m.url, "--num-prompts", 4, "--input-len", 8, "--output-len", 4, "--request-rate", 50,
              json_out=False)
    assert r.rc == 0, r.err
    for s in ("Successful requests:", "Failed requests:", "Benchmark duration (s):", "Request throughput (req/s):",
              "Output throughput (tok/s):", "Total throughput (tok/s):", "50 req/s (Poisson)", "mean", "median",
              "p90", "p99"):
        assert s in r.out, s
    rows = {line.split()[0]: line.split()[1:] for line in r.out.splitlines() if line.split()[:1] in
            (["TTFT"], ["TPOT"], ["ITL"], ["E2E"])}
    assert set(rows) == {"TTFT", "TPOT", "ITL", "E2E"}
    assert 18 <= float(rows["TTFT"][1]) <= 150


def test_usage_errors():
    for args in ([], ["--base-url", "ftp://x"], ["--base-url", "http://x", "--request-rate", "0"],
                 ["--base-url", "http://x", "--request-rate", "fast"], ["--base-url", "http://x", "--goodput", "ttft"],
                 ["--base-url", "http://x", "--goodput", "itl:5"], ["--base-url", "http://x", "--bogus", "1"],
                 ["--base-url", "http://x", "--num-prompts", "0"], ["--base-url", "http://x", "--extra-body", "[1]"],
                 ["--base-url", "http://x", "--prompt-kind", "bytes"], ["--base-url", "http://x", "--endpoint", "v1"],
                 ["--base-url", "http://x", "--max-concurrency"], ["--base-url", "http://x", "stray"]):
        r = bench(*args, json_out=False, timeout=10)
        assert r.rc == 2, args
        assert "usage: tokenmill bench serve" in r.err, args
    r = bench("--help", json_out=False, timeout=10)
    assert r.rc == 0 and "--request-rate" in r.out


def test_api_key(mock):
    m = mock("--ttft-ms", 5, "--itl-ms", 1, "--api-key", "sekrit")
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    r = bench("--base-url", m.url, "--model", "x", "--num-prompts", 2, "--input-len", 4, "--output-len", 2, env=env)
    assert r.rc == 1 and r.failures() == {"http 401": 2}
    r = bench("--base-url", m.url, "--num-prompts", 2, "--input-len", 4, "--output-len", 2, "--api-key", "sekrit",
              env=env)
    assert r.rc == 0 and r.j["completed"] == 2 and r.j["model"] == "mock-model"
    r = bench("--base-url", m.url, "--num-prompts", 2, "--input-len", 4, "--output-len", 2,
              env=dict(env, OPENAI_API_KEY="sekrit"))
    assert r.rc == 0 and r.j["completed"] == 2


def test_plot(mock, tmp_path):
    m = mock("--ttft-ms", 20, "--itl-ms", 5)
    png = tmp_path / "serve.png"
    r = bench("--base-url", m.url, "--num-prompts", 10, "--request-rate", 40, "--input-len", 8, "--output-len", 6,
              "--plot", png, json_out=False)
    assert r.rc == 0, r.err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000
    assert "plot written to" in r.out
    # no gnuplot on PATH: a clear message before any request is sent
    sent = m.stats()["requests"]
    env = dict(os.environ, PATH=str(tmp_path))
    r = bench("--base-url", m.url, "--num-prompts", 3, "--plot", tmp_path / "x.png", env=env)
    assert r.rc == 2 and "gnuplot" in r.err
    assert m.stats()["requests"] == sent and not (tmp_path / "x.png").exists()


def test_sigint_reports_what_finished(mock):
    m = mock("--ttft-ms", 10, "--itl-ms", 2, "--fail", "hang:2")
    p = subprocess.Popen([TOKENMILL, "bench", "serve", "--base-url", m.url, "--num-prompts", "6", "--input-len", "8",
                          "--output-len", "3", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while m.stats()["requests"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 130, err
    j = json.loads(out)
    assert j["interrupted"] is True
    assert j["completed"] == 3 and {f["reason"]: f["count"] for f in j["failures"]} == {"interrupted": 3}

