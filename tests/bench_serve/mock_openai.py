"""mock_openai.py -- a small OpenAI-compatible streaming server for bench serve's tests.

Serves POST /v1/completions and /v1/chat/completions as SSE streams (chunked transfer, like real servers)
with known timing: the first content chunk after --ttft-ms (plus --ttft-step-ms x ((k-1) % --ttft-cycle)
for the k-th request), then one chunk every --itl-ms; --chunks content chunks (default: max_tokens), each
worth --tokens-per-chunk tokens in the usage chunk. --fail "KIND:K,..." makes every K-th request (by arrival,
first matching rule) misbehave: 500, drop (connection closed after 2 chunks), malformed (a non-JSON chunk),
error (an error object mid-stream), nodone (no [DONE]), hang (headers, then silence), stall (silence
before the headers). GET /v1/models lists "mock-model"; GET /mock/stats returns what was seen: request
count, peak concurrency, arrival times and a summary of every request body. Prints "PORT n" when ready.
"""
import argparse
import asyncio
import hashlib
import json
import resource
import sys
import time


class Mock:
    def __init__(self, args):
        self.a = args
        self.rules = []
        for item in filter(None, args.fail.split(",")):
            kind, k = item.split(":")
            self.rules.append((kind, int(k)))
        self.n = 0
        self.active = 0
        self.max_active = 0
        self.arrivals = []
        self.bodies = []
        self.t0 = time.monotonic()

    def behavior(self, k):
        for kind, every in self.rules:
            if k % every == 0:
                return kind
        return "ok"

    async def handle(self, reader, writer):
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = h.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                keep = await self.route(method, path, headers, body, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def send_json(self, writer, code, obj):
        data = json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}
        writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (code, reason.get(code, "X").encode(), len(data)) + data)
        await writer.drain()
        return True

    def authorized(self, headers):
        return not self.a.api_key or headers.get("authorization") == "Bearer " + self.a.api_key

    async def route(self, method, path, headers, body, writer):
        if method == "GET" and path == "/mock/stats":
            return await self.send_json(writer, 200, {
                "requests": self.n, "max_active": self.max_active, "arrivals": self.arrivals, "bodies": self.bodies})
        if not self.authorized(headers):
            return await self.send_json(writer, 401, {"error": {"message": "bad api key", "type": "auth", "code": 401}})
        if method == "GET" and path == "/v1/models":
            return await self.send_json(writer, 200, {"object": "list", "data": [{"id": "mock-model", "object": "model"}]})
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self.complete(path, headers, body, writer)
        return await self.send_json(writer, 404, {"error": {"message": "no route " + path}})

    async def complete(self, path, headers, body, writer):
        self.n += 1
        k = self.n
        self.arrivals.append(time.monotonic() - self.t0)
        req = json.loads(body)
        prompt = req.get("prompt")
        self.bodies.append({
            "model": req.get("model"), "stream": req.get("stream"),
            "include_usage": (req.get("stream_options") or {}).get("include_usage"),
            "max_tokens": req.get("max_tokens"), "min_tokens": req.get("min_tokens"),
            "ignore_eos": req.get("ignore_eos"), "temperature": req.get("temperature"),
            "prompt_kind": "ids" if isinstance(prompt, list) else "text" if isinstance(prompt, str) else None,
            "prompt_len": len(prompt) if isinstance(prompt, list) else len(prompt.split()) if isinstance(prompt, str) else None,
            "prompt_ids_ok": isinstance(prompt, list) and all(isinstance(i, int) for i in prompt),
            "prompt_min": min(prompt) if isinstance(prompt, list) and prompt else None,
            "prompt_max": max(prompt) if isinstance(prompt, list) and prompt else None,
            "prompt_sig": hashlib.sha1(json.dumps(prompt if prompt is not None else req.get("messages")).encode()).hexdigest(),
            "messages": req.get("messages"), "extra": req.get("extra_field"), "expect": headers.get("expect"),
        })
        if self.a.reject_ids and isinstance(prompt, list):
            return await self.send_json(writer, 400, {"error": {"message": "token ids not supported"}})
        kind = self.behavior(k)
        if kind == "500":
            return await self.send_json(writer, 500, {"error": {"message": "mock internal error", "type": "server_error"}})
        chat = "chat" in path
        n_chunks = self.a.chunks or int(req.get("max_tokens") or 16)
        ttft = (self.a.ttft_ms + self.a.ttft_step_ms * ((k - 1) % self.a.ttft_cycle)) / 1000.0
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if kind == "stall":
                await asyncio.sleep(3600)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            await writer.drain()

            async def event(text):
                data = ("data: " + text + "\n\n").encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()

            if kind == "hang":
                await asyncio.sleep(3600)
            await asyncio.sleep(ttft)
            for i in range(n_chunks):
                if i:
                    await asyncio.sleep(self.a.itl_ms / 1000.0)
                if kind == "drop" and i == 2:
                    writer.transport.abort()
                    return False
                if kind == "malformed" and i == 1:
                    await event("{this is not json")
                    continue
                if kind == "error" and i == 1:
                    await event(json.dumps({"error": {"message": "mock failed mid-stream", "code": 500}}))
                    continue
                piece = "tok%d " % i
                if chat:
                    ch = {"id": "c%d" % k, "object": "chat.completion.chunk", "model": req.get("model"),
                          "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                else:
                    ch = {"id": "c%d" % k, "object": "text_completion", "model": req.get("model"),
                          "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                await event(json.dumps(ch))
            fin = {"id": "c%d" % k, "choices": [{"index": 0, "text": "", "delta": {}, "finish_reason": "length"}]}
            await event(json.dumps(fin))
            include_usage = (req.get("stream_options") or {}).get("include_usage")
            if include_usage and not self.a.no_usage:
                plen = len(prompt) if isinstance(prompt, list) else self.a.prompt_tokens
                await event(json.dumps({"id": "c%d" % k, "choices": [], "usage": {
                    "prompt_tokens": plen, "completion_tokens": n_chunks * self.a.tokens_per_chunk,
                    "total_tokens": plen + n_chunks * self.a.tokens_per_chunk}}))
            if kind != "nodone":
                await event("[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        finally:
            self.active -= 1


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50)
    p.add_argument("--ttft-step-ms", type=float, default=0)
    p.add_argument("--ttft-cycle", type=int, default=1)
    p.add_argument("--itl-ms", type=float, default=10)
    p.add_argument("--chunks", type=int, default=0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=7, help="usage.prompt_tokens for text prompts")
    p.add_argument("--no-usage", action="store_true")
    p.add_argument("--reject-ids", action="store_true")
    p.add_argument("--api-key", default="")
    p.add_argument("--fail", default="")
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    mock = Mock(a)
    server = await asyncio.start_server(mock.handle, "127.0.0.1", a.port, backlog=4096)
    print("PORT %d" % server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
