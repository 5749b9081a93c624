"""Clients that hang up: the request is aborted and its KV blocks come back (seen through /metrics); and a
shutdown (SIGINT/SIGTERM) with requests in flight: each gets a final event, the server exits cleanly."""
import json
import signal
import socket
import threading
import time

import pytest

from srv_util import Server, metrics, request, sse_events, wait_idle


def open_request(base, body):
    host, port = base.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def read_until(s, needle, timeout=60):
    buf = b""
    deadline = time.time() + timeout
    while needle not in buf and time.time() < deadline:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    return buf


def read_to_eof(s):
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d


def aborts(base):
    return metrics(base)['tokenmill:request_success_total{finished_reason="abort"}']


def wait_running(base, timeout=30):
    deadline = time.time() + timeout
    while metrics(base)["tokenmill:num_requests_running"] < 1 and time.time() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_and_frees_blocks(base, stream):
    wait_idle(base)
    before = aborts(base)
    s = open_request(base, {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True, "stream": stream})
    if stream:
        got = read_until(s, b'"text":"')
        assert b"HTTP/1.1 200" in got and b'"text":"' in got
    wait_running(base)
    m = metrics(base)
    assert m["tokenmill:num_requests_running"] == 1 and m["tokenmill:kv_cache_usage_perc"] > 0
    t0 = time.time()
    s.close()
    m = wait_idle(base)
    assert m["tokenmill:num_requests_running"] == 0 and m["tokenmill:num_requests_waiting"] == 0
    assert m["tokenmill:kv_cache_usage_perc"] == 0  # every block is back in the pool
    assert aborts(base) == before + 1
    assert time.time() - t0 < 5
    assert m["tokenmill:generation_tokens_total"] > 0


def test_disconnect_while_waiting_in_the_queue(base):
    """Connections that hang up before their request was scheduled are dropped from the queue too."""
    wait_idle(base)
    before = aborts(base)
    socks = [open_request(base, {"prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": True, "stream": True})
             for _ in range(20)]  # 16 run, 4 wait
    deadline = time.time() + 30
    while metrics(base)["tokenmill:num_requests_waiting"] < 1 and time.time() < deadline:
        time.sleep(0.02)
    assert metrics(base)["tokenmill:num_requests_waiting"] >= 1
    for s in socks:
        s.close()
    m = wait_idle(base, timeout=15)
    assert m["tokenmill:num_requests_running"] == 0 and m["tokenmill:num_requests_waiting"] == 0
    assert m["tokenmill:kv_cache_usage_perc"] == 0
    assert aborts(base) == before + 20


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_shutdown_with_requests_in_flight(sig):
    srv = Server()
    try:
        streams = [open_request(srv.url, {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True,
                                          "stream": True}) for _ in range(3)]
        heads = [read_until(s, b'"text":"') for s in streams]
        plain = {}

        def non_stream():
            plain["r"] = request(srv.url, "POST", "/v1/completions",
                                 {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True})

        t = threading.Thread(target=non_stream)
        t.start()
        deadline = time.time() + 30
        while metrics(srv.url)["tokenmill:num_requests_running"] < 4 and time.time() < deadline:
            time.sleep(0.02)
        t0 = time.time()
        srv.proc.send_signal(sig)
        for s, head in zip(streams, heads):
            body = head + read_to_eof(s)
            s.close()
            events = sse_events(body.split(b"\r\n\r\n", 1)[1].replace(b"\r\n", b"\n"))
            assert events[-1] == "[DONE]"
            err = json.loads(events[-2])["error"]
            assert "shutting down" in err["message"] and err["type"] == "server_error"
        t.join(30)
        status, _, data = plain["r"]
        assert status == 503 and "shutting down" in json.loads(data)["error"]["message"]
        assert srv.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 10
        assert "stopped" in srv.logs()
    finally:
        srv.cleanup()
