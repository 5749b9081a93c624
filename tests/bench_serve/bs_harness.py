"""bs_harness.py -- bench serve test helpers: the mock OpenAI server (mock_openai.py) as a fixture, a runner for the
binary. (No conftest.py here: tests/cli's conftest is imported by name, and a second one would shadow it.)"""
import json
import os
import select
import subprocess
import sys
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TOKENMILL = os.environ.get("TOKENMILL_BIN", os.path.join(ROOT, "build", "tokenmill"))
MOCK = os.path.join(HERE, "mock_openai.py")


class MockServer:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, MOCK, "--port", "0", *args], stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError("mock server did not start: %r" % line)
        self.port = int(line.split()[1])
        self.url = "http://127.0.0.1:%d" % self.port

    def stats(self):
        with urllib.request.urlopen(self.url + "/mock/stats", timeout=10) as r:
            return json.load(r)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def mock():
    """mock(*args) starts a mock server with those options; all are stopped at the end of the test."""
    servers = []

    def start(*args):
        s = MockServer(*[str(a) for a in args])
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


class Result:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.j = None
        if self.out.lstrip().startswith("{"):
            self.j = json.loads(self.out)

    def failures(self):
        return {f["reason"]: f["count"] for f in self.j["failures"]}


def bench(*args, json_out=True, timeout=120, env=None):
    cmd = [TOKENMILL, "bench", "serve", *[str(a) for a in args]] + (["--json"] if json_out else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return Result(p)
