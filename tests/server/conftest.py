"""Fixtures for the server end-to-end tests: one `tokenmill serve` (default model, 2 threads) for the session."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from srv_util import MODEL, ROOT, TOKENMILL, Server  # noqa: E402,F401  (the same names as tests/cli/conftest.py)


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    rc = s.stop()
    assert rc == 0, s.logs()
    s.cleanup()


@pytest.fixture(scope="session")
def base(server):
    return server.url


@pytest.fixture(scope="session")
def model_id(base):
    from srv_util import request
    import json
    _, _, data = request(base, "GET", "/v1/models")
    return json.loads(data)["data"][0]["id"]


@pytest.fixture(scope="session")
def client(base):
    import openai
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
