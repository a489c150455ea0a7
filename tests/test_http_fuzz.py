"""The server under generated requests: schemathesis from the server's own OpenAPI description
(every route, its real request body, valid and invalid data), and a hypothesis property test
that puts random JSON values of every type into each field of /completion and
/v1/chat/completions. Every answer is a 2xx or a 4xx error in OpenAI's shape ({"error":
{"message", "type", "code"}}), streamed errors too; never a 500, never a dropped connection;
the server stays healthy and lets every slot go.

The one 5xx allowed is llama-server's 501 for a feature this server or model lacks (here /infill:
the tiny model has no fill-in-the-middle tokens). experiments/fuzz_http.sh runs the same
checks with more examples.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import httpx
import pytest
import schemathesis
from schemathesis.generation import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

from tandem.server.schemas import ChatBody, CompletionBody
from tests.servers import AUTH, KEY, Server, same_weights_pair

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
# examples per route and per field test: the tests' few, or as many as a longer run asks for
# (experiments/fuzz_http.sh); TANDEM_FUZZ_REPORT names a JSON file for the counts
SCALE = int(os.environ.get("TANDEM_FUZZ_SCALE", "1"))
STATUSES: Counter = Counter()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    target, draft = same_weights_pair(d)
    (d / "slots").mkdir()
    s = Server(["--model", str(target), "--model-draft", str(draft), "-c", "256", "-np", "2",
                "--api-key", KEY, "--metrics", "--embedding", "--slot-save-path",
                str(d / "slots"), "--timeout", "30", "-t", "1"], d / "fuzz.log")
    s.wait_ready(120)
    yield s
    s.stop()


def check_answer(status: int, content_type: str, text: str) -> None:
    """2xx, or an OpenAI-shaped error whose code is its status (501: a feature it lacks)."""
    STATUSES[status] += 1
    assert status < 500 or status == 501, (status, text[:500])
    if "text/event-stream" in content_type:
        # events end at "\n" only (SSE): splitlines() would also cut at U+2028 or U+0085,
        # which a generated text may hold (found by the longer run)
        for line in text.split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if "error" in event:  # an error after the stream began
                    assert 400 <= event["error"]["code"] < 500, event
        return
    if status >= 400:
        err = json.loads(text)["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str) and err["code"] == status, err


def still_healthy(srv: Server) -> None:
    assert srv.proc.poll() is None, srv.log()
    assert httpx.get(f"{srv.url}/health").status_code == 200
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in httpx.get(f"{srv.url}/slots", headers=AUTH).json()):
        assert time.monotonic() < deadline, "a slot is still busy: a request was leaked"
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_route_against_its_openapi_description(srv, mode):
    """Bodies, paths and queries that fit each route's description (positive) and that do not
    (negative), a dozen of each per route."""
    schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json", headers=AUTH)
    routes = [r.ok() for r in schema.get_all_operations()]
    assert len(routes) >= 25 and any(op.path == "/v1/chat/completions" for op in routes)
    tested = 0
    for op in routes:
        @settings(FUZZ, max_examples=12 * SCALE)
        @given(case=op.as_strategy(generation_mode=GenerationMode(mode)))
        def one(case):
            r = case.call(base_url=srv.url, headers=AUTH, timeout=60)
            check_answer(r.status_code, r.headers.get("content-type", ""), r.text)

        try:
            one()
            tested += 1
        except Unsatisfiable:  # negative: a route with nothing to make invalid (GET /health)
            assert mode == "negative" and op.method.upper() == "GET", op.path
    assert tested >= (len(routes) if mode == "positive" else 15)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=8)

BASES = {
    "/completion": ({"prompt": "def add(a, b):", "n_predict": 4}, sorted(CompletionBody.model_fields)),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                             sorted(ChatBody.model_fields)),
}


@pytest.mark.parametrize("path", sorted(BASES))
@settings(FUZZ, max_examples=120 * SCALE)
@given(data=st.data())
def test_random_values_in_every_field(srv, path, data):
    base, fields = BASES[path]
    body = dict(base)
    for name in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3)):
        body[name] = data.draw(JSON)
    if data.draw(st.booleans()):
        body["stream"] = True
    raw = json.dumps(body)  # NaN and Infinity as Python writes them: not JSON, refused as such
    r = httpx.post(f"{srv.url}{path}", content=raw, timeout=60,
                   headers={**AUTH, "Content-Type": "application/json"})
    check_answer(r.status_code, r.headers.get("content-type", ""), r.text)


def test_the_server_is_healthy_after_the_fuzzing(srv):
    still_healthy(srv)
    r = httpx.post(f"{srv.url}/completion", headers=AUTH, timeout=60,
                   json={"prompt": "def add(a, b):", "n_predict": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    assert "Traceback" not in srv.log()
    if os.environ.get("TANDEM_FUZZ_REPORT"):
        with open(os.environ["TANDEM_FUZZ_REPORT"], "w") as f:
            json.dump({"scale": SCALE, "requests": sum(STATUSES.values()),
                       "statuses": dict(sorted(STATUSES.items()))}, f, indent=1)
