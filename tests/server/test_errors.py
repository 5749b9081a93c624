"""Bad input over raw HTTP: every error is an OpenAI error object with the right status, and one bad request
never affects another."""
import concurrent.futures
import json
import socket

import pytest

from srv_util import Server, post_json, request

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def error_of(status, data, want_status):
    assert status == want_status, data
    j = json.loads(data)
    e = j["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    return e


@pytest.mark.parametrize("path", [COMP, CHAT])
def test_malformed_json(base, path):
    for body in (b'{"prompt": "x"', b"{bad", b'{"prompt": "x"} trailing', b"", b"[1, 2]", b'"str"'):
        status, _, data = request(base, "POST", path, body)
        e = error_of(status, data, 400)
        assert e["type"] == "invalid_request_error"
        assert "JSON" in e["message"] or "empty" in e["message"]


def test_invalid_utf8(base):
    status, _, data = request(base, "POST", COMP, b'{"prompt": "caf\xe9 \xff"}')
    e = error_of(status, data, 400)
    assert "UTF-8" in e["message"]
    status, _, data = request(base, "POST", CHAT, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}')
    assert "UTF-8" in error_of(status, data, 400)["message"]  # an encoded surrogate


@pytest.mark.parametrize("body, param", [
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": 3}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": 2.5}, "top_k"),
    ({"prompt": "x", "min_p": -0.1}, "min_p"),
    ({"prompt": "x", "presence_penalty": 5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": "a"}, "frequency_penalty"),
    ({"prompt": "x", "seed": "s"}, "seed"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": ["a", None]}, "stop"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 100}, "n"),
    ({"prompt": "x", "max_tokens": "7"}, "max_tokens"),
    ({"prompt": "x", "model": 7}, "model"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 10 ** 8]}, "prompt"),
])
def test_wrong_field_types_and_values(base, body, param):
    status, _, data = request(base, "POST", COMP, body)
    e = error_of(status, data, 400)
    assert e["param"] == param, e


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages"),
    ({"messages": MSG, "logprobs": 2}, "logprobs"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "max_completion_tokens": -1}, "max_completion_tokens"),
])
def test_chat_wrong_fields(base, body, param):
    status, _, data = request(base, "POST", CHAT, body)
    assert error_of(status, data, 400)["param"] == param


def test_unknown_model(base):
    for path, body in ((COMP, {"model": "gpt-9", "prompt": "x"}), (CHAT, {"model": "gpt-9", "messages": MSG})):
        status, _, data = request(base, "POST", path, body)
        e = error_of(status, data, 404)
        assert e["code"] == "model_not_found" and "gpt-9" in e["message"]
    status, _, data = request(base, "GET", "/v1/models/gpt-9")
    error_of(status, data, 404)


def n_tokens(base, text):
    status, t = post_json(base, "/tokenize", {"prompt": text})
    assert status == 200
    return t["count"]


def test_prompt_longer_than_context(base):
    long = "hello " * 1100
    n = n_tokens(base, long)
    assert n > 1024
    status, _, data = request(base, "POST", COMP, {"prompt": long, "max_tokens": 1})
    e = error_of(status, data, 400)
    assert "1024" in e["message"] and str(n) in e["message"]  # the context and the prompt's length
    assert e["code"] == "context_length_exceeded" and e["param"] == "prompt"
    status, _, data = request(base, "POST", CHAT, {"messages": [{"role": "user", "content": long}]})
    e = error_of(status, data, 400)
    assert "1024" in e["message"] and e["param"] == "messages"
    # exactly the context: no room for one token either
    status, tok = post_json(base, "/tokenize", {"prompt": long})
    status, _, data = request(base, "POST", COMP, {"prompt": tok["tokens"][:1024], "max_tokens": 1})
    assert "1024 input tokens" in error_of(status, data, 400)["message"]


def test_max_tokens_out_of_range(base):
    for mt in (0, -3):
        status, _, data = request(base, "POST", COMP, {"prompt": "hi", "max_tokens": mt})
        assert error_of(status, data, 400)["param"] == "max_tokens"
    status, tok = post_json(base, "/tokenize", {"prompt": "hello " * 1100})
    assert status == 200
    prompt = tok["tokens"][:1000]  # fits the context of 1024, not with 100 more (any tokenizer)
    n = len(prompt)
    status, _, data = request(base, "POST", COMP, {"prompt": prompt, "max_tokens": 100})
    e = error_of(status, data, 400)
    assert e["param"] == "max_tokens" and e["code"] == "context_length_exceeded"
    assert "1024" in e["message"] and f"requested {n + 100} tokens ({n} in the prompt, 100 in the completion)" in e["message"]
    status, _, data = request(base, "POST", CHAT, {"messages": MSG, "max_tokens": 5000})
    e = error_of(status, data, 400)
    assert "1024" in e["message"] and "5000 in the completion" in e["message"]
    # the largest that fits is accepted, one more is not
    status, tok = post_json(base, "/tokenize", {"prompt": "hello " * 1100})
    ids = tok["tokens"][:1020]
    status, j = post_json(base, COMP, {"prompt": ids, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    u = j["usage"]
    assert status == 200 and (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (1020, 4, 1024)
    assert 0 <= u["prompt_tokens_details"]["cached_tokens"] <= 1008
    assert j["choices"][0]["finish_reason"] == "length"
    status, _, data = request(base, "POST", COMP, {"prompt": ids, "max_tokens": 5})
    assert "requested 1025 tokens" in error_of(status, data, 400)["message"]


def raw_exchange(base, head, chunks=()):
    """Send raw request bytes, read the answer until the server closes the connection."""
    host, port = base.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(head)
        for c in chunks:
            s.sendall(c)
        resp = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            resp += d
    return resp


def test_body_over_the_limit(base):
    # announced by Content-Length: refused before the body is sent
    resp = raw_exchange(base, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3145728\r\n"
                              b"Expect: 100-continue\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 413")
    e = json.loads(resp.split(b"\r\n\r\n", 1)[1])["error"]
    assert "2097152" in e["message"] and "3145728" in e["message"] and e["code"] == "request_too_large"
    # a chunked upload (no length up front): refused once it passes the limit
    chunk = b"a" * 65536
    resp = raw_exchange(base, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                              b"Connection: close\r\n\r\n",
                        [b"%x\r\n" % len(chunk) + chunk + b"\r\n"] * 40 + [b"0\r\n\r\n"])  # 2.5 MiB
    assert resp.startswith(b"HTTP/1.1 413")
    assert b'"request_too_large"' in resp
    # just under the limit is read and judged as usual (here: a prompt far over the context)
    body = b'{"prompt": "' + b"a " * ((2 << 20) // 2 - 20) + b'"}'
    assert len(body) <= 2 << 20
    status, _, data = request(base, "POST", COMP, body)
    assert status == 400 and b"context" in data


def test_unknown_route_and_wrong_method(base):
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/completions"), ("GET", "/"),
                         ("POST", "/v1/models/")):
        status, _, data = request(base, method, path)
        error_of(status, data, 404)
    for method, path, allow in (("GET", COMP, "POST"), ("PUT", CHAT, "POST"), ("POST", "/v1/models", "GET"),
                                ("DELETE", "/health", "GET"), ("POST", "/metrics", "GET"), ("GET", "/tokenize", "POST")):
        status, hd, data = request(base, method, path, b"{}" if method != "GET" else None)
        error_of(status, data, 405)
        assert allow in hd["allow"]


def test_api_key():
    s = Server("--api-key", "s3cret-key")
    try:
        good = {"Authorization": "Bearer s3cret-key"}
        body = {"prompt": "hi", "max_tokens": 2}
        for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret-ke"},
                  {"Authorization": "Bearer s3cret-keyy"}, {"Authorization": "s3cret-key"}):
            for method, path, b in (("POST", COMP, body), ("POST", CHAT, {"messages": MSG}), ("GET", "/v1/models", None),
                                    ("POST", "/tokenize", {"prompt": "x"})):
                status, hd, data = request(s.url, method, path, b, headers=h)
                e = error_of(status, data, 401)
                assert e["code"] == "invalid_api_key"
        status, _, data = request(s.url, "POST", COMP, body, headers=good)
        assert status == 200 and json.loads(data)["usage"]["completion_tokens"] >= 1
        # health and metrics stay open for probes and scrapers
        assert request(s.url, "GET", "/health")[0] == 200
        assert request(s.url, "GET", "/metrics")[0] == 200
        # the openai client sends the key as a bearer token (where the client is installed: `make test` installs
        # it; scripts/gpu.sh runs this file on a machine without it)
        openai = pytest.importorskip("openai")
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret-key", max_retries=0)
        assert c.completions.create(model=c.models.list().data[0].id, prompt="hi", max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0).models.list()
    finally:
        assert s.stop() == 0
        s.cleanup()


def test_bad_requests_do_not_affect_good_ones(base):
    good = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    status, ref = post_json(base, COMP, good)
    assert status == 200
    bads = [b"{bad", b'{"prompt": 5}', b'{"prompt": "\xff"}', b'{"prompt": "x", "max_tokens": 0}',
            json.dumps({"prompt": "hello " * 1100}).encode(), json.dumps({"prompt": "x", "model": "nope"}).encode()]

    def one(i):
        if i % 2:
            return request(base, "POST", COMP, bads[(i // 2) % len(bads)])[0]
        status, j = post_json(base, COMP, good)
        assert status == 200
        return j["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(24) as ex:
        out = list(ex.map(one, range(48)))
    assert all(t == ref["choices"][0]["text"] for t in out[0::2])
    assert all(s in (400, 404) for s in out[1::2])
    # a bad request in the middle of a stream's life changes nothing either
    status, j = post_json(base, COMP, good)
    assert j["choices"][0]["text"] == ref["choices"][0]["text"]
