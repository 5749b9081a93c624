"""`tokenmill serve --tp N`: the server over tensor-parallel ranks (CPU ranks here) answers like one rank."""
import json

from srv_util import Server, request


def complete(url, prompt):
    st, _, body = request(url, "POST", "/v1/completions",
                          {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
    assert st == 200, body
    return json.loads(body)["choices"][0]["text"]


def test_serve_tp3_matches_one_rank(base):
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    one = [complete(base, p) for p in prompts]
    srv = Server("--tp", "3")
    try:
        three = [complete(srv.url, p) for p in prompts]
    finally:
        rc = srv.stop()
        logs = srv.logs()
        srv.cleanup()
    assert rc == 0, logs
    assert three == one


def test_serve_tp_refuses_an_indivisible_degree():
    try:
        Server("--tp", "2")  # SmolLM2 has 9 query heads and 3 KV heads
    except RuntimeError as e:
        assert "divide" in str(e) or "divisible" in str(e) or "heads" in str(e), str(e)
    else:
        raise AssertionError("--tp 2 was accepted for 9 heads")
