"""Load: hundreds of concurrent streams, each complete and (at temperature 0) identical to a sequential run;
and a thousand streams open at once, without a thread per connection."""
import asyncio
import json
import os
import resource
import selectors
import signal
import socket
import time

import httpx

from srv_util import Server, post_json, wait_idle

PROMPTS = [f"Say {w}" for w in ("yes", "no", "hello", "maybe", "why", "when", "blue", "seven")]
MAX_TOKENS = 6


def sequential(base):
    """The reference: one request at a time, not streamed."""
    out = []
    for p in PROMPTS:
        status, j = post_json(base, "/v1/completions", {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0})
        assert status == 200
        out.append((j["choices"][0]["text"], j["choices"][0]["finish_reason"], j["usage"]["completion_tokens"]))
    return out


async def stream_one(client, base, prompt, chat=False):
    body = {"max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    text, finish, usage, done = "", None, None, False
    async with client.stream("POST", base + path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            j = json.loads(data)
            assert "error" not in j, j
            if j.get("usage"):
                usage = j["usage"]
            for c in j["choices"]:
                text += (c["delta"].get("content") or "") if chat else c["text"]
                finish = c["finish_reason"] or finish
    assert done, "the stream did not end with [DONE]"
    return text, finish, usage["completion_tokens"]


def test_hundreds_of_concurrent_streams_match_sequential(base):
    ref = sequential(base)
    n = 256

    async def main():
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as client:
            return await asyncio.gather(*(stream_one(client, base, PROMPTS[i % len(PROMPTS)]) for i in range(n)))

    t0 = time.time()
    results = asyncio.run(main())
    elapsed = time.time() - t0
    assert len(results) == n
    for i, got in enumerate(results):
        assert got == ref[i % len(PROMPTS)], (i, got, ref[i % len(PROMPTS)])
    m = wait_idle(base)
    assert m["tokenmill:num_requests_running"] == 0 and m["tokenmill:kv_cache_usage_perc"] == 0
    print(f"{n} streams in {elapsed:.1f} s")


def test_concurrent_chat_streams_match_sequential(base):
    ref = []
    for p in PROMPTS[:4]:
        status, j = post_json(base, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": p}], "max_tokens": MAX_TOKENS, "temperature": 0})
        ref.append((j["choices"][0]["message"]["content"], j["choices"][0]["finish_reason"],
                    j["usage"]["completion_tokens"]))

    async def main():
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=100), timeout=300.0) as client:
            return await asyncio.gather(*(stream_one(client, base, PROMPTS[i % 4], chat=True) for i in range(64)))

    for i, got in enumerate(asyncio.run(main())):
        assert got == ref[i % 4]


async def raw_stream(host, port, body, state, go):
    """One streaming request over a plain socket; the last byte waits for `go`, so that every request
    arrives at about the same moment. Returns the raw response."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n" % len(data) + data)
    writer.write(req[:-1])
    await writer.drain()
    state["connected"] += 1
    await go.wait()
    writer.write(req[-1:])
    await writer.drain()
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    state["open"] += 1
    state["peak"] = max(state["peak"], state["open"])
    raw = await reader.read()  # until the server closes
    state["open"] -= 1
    writer.close()
    return raw


def test_a_thousand_concurrent_streams():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    srv = Server("--max-seqs", "64")
    try:
        n = 1000
        # 32 shared ids (two full KV blocks, served from the prefix cache after the first request) + 1 own id
        _, tok = post_json(srv.url, "/tokenize", {"prompt": "The quick brown fox jumps over the lazy dog. " * 6})
        prefix = tok["tokens"][:32]
        host, port = "127.0.0.1", srv.port
        state = {"open": 0, "peak": 0, "connected": 0}

        async def main():
            go = asyncio.Event()
            bodies = [{"prompt": prefix + [100 + i % 10], "max_tokens": 1, "temperature": 0, "stream": True,
                       "ignore_eos": True} for i in range(n)]
            tasks = [asyncio.create_task(raw_stream(host, port, b, state, go)) for b in bodies]
            while state["connected"] < n:
                await asyncio.sleep(0.01)
            t_go = time.time()
            go.set()
            r = await asyncio.gather(*tasks)
            print(f"connected in {t_go - t0:.2f} s, served in {time.time() - t_go:.2f} s, peak {state['peak']}")
            return r

        t0 = time.time()
        results = asyncio.run(main())
        texts = {}
        for i, raw in enumerate(results):
            assert b"\n\ndata: [DONE]\n\n" in raw, raw[-200:]
            events = [l[6:] for l in raw.decode().splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
            chunks = [json.loads(e) for e in events]
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            text = "".join(c["choices"][0]["text"] for c in chunks)
            texts.setdefault(i % 10, set()).add(text)
        assert all(len(v) == 1 for v in texts.values())  # greedy: the same prompt, the same text, every time
        assert state["peak"] >= 900, state  # the streams really were open together
        m = wait_idle(srv.url)
        assert m["tokenmill:kv_cache_usage_perc"] == 0
        assert m['tokenmill:request_success_total{finished_reason="length"}'] == n
        assert m["tokenmill:prefix_cache_hits_total"] > 0
        assert srv.stop() == 0
    finally:
        srv.cleanup()


def test_a_burst_of_exactly_128_ready_requests_is_answered(server):
    """128 requests that become readable at once, while the server cannot run (SIGSTOP), all get their answers.
    An event loop that drains readiness in batches of 128 and then waits again with the full connection timeout
    (the HTTP library's epoll loop) leaves every one of them unanswered until a new event comes: the server once
    stalled this way under a burst of 512 streams."""
    host, port = "127.0.0.1", server.port
    socks = []
    try:
        for _ in range(128):
            socks.append(socket.create_connection((host, port), timeout=10))
        deadline = time.time() + 10  # every connection accepted: the server holds 128 more sockets
        while time.time() < deadline and len(_server_sockets(server.proc.pid)) < 129:
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.time() + 10  # every thread stopped, the polling one too
            while time.time() < deadline and not _stopped(server.proc.pid):
                time.sleep(0.01)
            for s in socks:
                s.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            time.sleep(0.3)  # every request in its socket's queue before the server runs again
        finally:
            server.proc.send_signal(signal.SIGCONT)
        sel = selectors.DefaultSelector()
        data = {}
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            data[s] = b""
        deadline = time.time() + 10  # one deadline for all: a stalled server fails in 10 s, not 128 x 10
        while sel.get_map() and time.time() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.time())):
                chunk = key.fileobj.recv(4096)
                data[key.fileobj] += chunk
                if not chunk:
                    sel.unregister(key.fileobj)
        sel.close()
        answered = sum(d.startswith(b"HTTP/1.1 200") for d in data.values())
        assert answered == 128, f"{128 - answered} of 128 requests unanswered"
    finally:
        for s in socks:
            s.close()
    wait_idle(server.url)


def _server_sockets(pid):
    """The process's open sockets (from /proc)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                out.append(fd)
        except OSError:
            pass
    return out


def _stopped(pid):
    """Every thread of the process stopped by a signal."""
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                    return False
        except OSError:
            pass
    return True
