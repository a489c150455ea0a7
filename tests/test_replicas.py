"""`tandem serve --replicas 2` on a local Ray instance bound to 127.0.0.1 (issue 58), a tiny
generated model, 2 replicas x 1 thread: the same greedy answers as one `tandem serve`, streams,
the API key, routing by prefix and by session, the fleet's /health and /metrics, Ray on
loopback only, a replica killed mid-stream, and bad input (exit 2, nothing left running).
One fleet for the module; the kill comes last."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import tiny
from tests.servers import AUTH, GREEDY, KEY, SERVE, Server

pytest.importorskip("ray.serve", reason="the cluster extra: pip install -e '.[cluster]'")

ARGS = ["--ctx-size", "2048", "--threads", "1", "--metrics", "--api-key", KEY,
        "--spec-type", "suffix"]
SYSTEM = "You are a careful assistant who answers in one short line. " * 3


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("replicas")
    return tiny.write_gguf(tiny.hf_model("qwen2", seed=0), d / "m.gguf", "qwen2")


@pytest.fixture(scope="module")
def fleet(model):
    s = Server(["-m", str(model), *ARGS, "--replicas", "2"], model.parent / "fleet.log")
    try:
        _wait_routes(s, 120)
        s.wait_ready(180)
        yield s
    finally:
        s.stop()
        assert _left_of(s.proc.pid) == [], "Ray processes left running after the fleet stopped"


@pytest.fixture(scope="module")
def single(model):
    s = Server(["-m", str(model), *ARGS], model.parent / "single.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def _wait_routes(s: Server, timeout: float) -> None:
    """Until Ray's proxy knows the ingress's routes (it answers 404 in text for a second or
    two after it listens)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert s.proc.poll() is None, s.log()
        try:
            if httpx.get(f"{s.url}/health", timeout=2).status_code != 404:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the ingress did not answer in {timeout} s:\n{s.log()}")


def _left_of(driver: int, timeout: float = 15) -> list[int]:
    """The processes of the fleet's local Ray instance (those holding files in its folder,
    /tmp/ray-tandem-PID) still running `timeout` s after it stopped."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and any(os.readlink(fd).startswith(
                        f"/tmp/ray-tandem-{driver}/") for fd in (p / "fd").iterdir()):
                    left.append(int(p.name))
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _ray_processes() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            name = (p / "comm").read_text().strip()
        except OSError:
            continue
        if p.name.isdigit() and (name in ("raylet", "gcs_server") or name.startswith("ray::")):
            pids.append(int(p.name))
    return pids


def post(s: Server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    r = httpx.post(f"{s.url}{path}", json=body, headers={**AUTH, **(headers or {})},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r


def stream(s: Server, path: str, body: dict, headers: dict | None = None) -> list[str]:
    """The `data:` payloads of an SSE answer."""
    with httpx.stream("POST", f"{s.url}{path}", json={**body, "stream": True},
                      headers={**AUTH, **(headers or {})}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]


def chat(messages: list[dict], n: int = 12) -> dict:
    return {"messages": messages, "max_tokens": n, **GREEDY}


# ---- the same server --------------------------------------------------------------------------


def test_greedy_answers_and_streams_are_one_servers(fleet, single):
    body = {"prompt": "def add(a, b):\n    return a + b\n", "n_predict": 24, **GREEDY}
    assert post(fleet, "/completion", body).json()["content"] == \
        post(single, "/completion", body).json()["content"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    one = post(single, "/v1/chat/completions", chat(messages)).json()
    many = post(fleet, "/v1/chat/completions", chat(messages)).json()
    assert many["choices"][0]["message"] == one["choices"][0]["message"]
    events = stream(fleet, "/completion", body)
    assert "".join(json.loads(e)["content"] for e in events) == \
        "".join(json.loads(e)["content"] for e in stream(single, "/completion", body))
    chunks = stream(fleet, "/v1/chat/completions", chat(messages))
    assert chunks[-1] == "[DONE]"
    text = "".join(json.loads(c)["choices"][0]["delta"].get("content") or ""
                   for c in chunks[:-1] if json.loads(c)["choices"])
    assert text == one["choices"][0]["message"]["content"]


def test_the_api_key_and_errors_are_the_replicas(fleet):
    r = httpx.post(f"{fleet.url}/completion", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    r = httpx.get(f"{fleet.url}/metrics", timeout=30)
    assert r.status_code == 401
    r = httpx.post(f"{fleet.url}/completion", json={"prompt": 3}, headers=AUTH, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = httpx.get(f"{fleet.url}/no-such-route", headers=AUTH, timeout=30)
    assert r.status_code == 404 and "no such endpoint" in r.json()["error"]["message"]
    page = httpx.get(f"{fleet.url}/", timeout=30)  # the web page, without the key
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_health_and_metrics_of_the_fleet(fleet, single):
    assert httpx.get(f"{fleet.url}/health", timeout=30).json() == \
        {"status": "ok", "replicas_ready": 2, "replicas": 2}
    for i in range(4):
        post(fleet, "/completion", {"prompt": f"count {i}" * 3, "n_predict": 5, **GREEDY},
             headers={"x-session": f"metrics-{i}"})
    r = httpx.get(f"{fleet.url}/metrics", headers=AUTH, timeout=30)  # at once: counted
    text = r.text
    assert int(r.headers["process-start-time-unix"]) > 0
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["llamacpp:tokens_predicted"].samples[0].value >= 20
    assert families["tandem:replicas_ready"].samples[0].value == 2
    depth = families["tandem:replica_queue_depth"].samples
    assert len(depth) == 2 and all(s.value == 0 for s in depth)
    kv = families["tandem:replica_kv_cache_usage_ratio"].samples
    assert len(kv) == 2 and all(0 <= s.value <= 1 for s in kv) and max(s.value for s in kv) > 0
    post(single, "/completion", {"prompt": "count", "n_predict": 2})
    one = httpx.get(f"{single.url}/metrics", headers=AUTH, timeout=30).text
    assert {f.name for f in text_string_to_metric_families(one)} <= set(families)


# ---- routing ----------------------------------------------------------------------------------


def test_a_conversation_goes_back_to_its_prefix(fleet):
    """Second turns land on the replica that answered the first, and reuse its cache."""
    firsts = {}
    for i in range(16):  # 6 first turns, more until both replicas answered one (2^-15 not)
        if i >= 6 and len({rep for rep, _ in firsts.values()}) == 2:
            break
        # (unlike from the first tokens on: a prompt sharing its first block with an earlier
        # one would go where that one went)
        messages = [{"role": "system", "content": f"{i}{i}{i} conversation. {SYSTEM}"},
                    {"role": "user", "content": f"question {i}"}]
        r = post(fleet, "/v1/chat/completions", chat(messages, 6))
        answer = r.json()["choices"][0]["message"]["content"]
        firsts[i] = (r.headers["x-tandem-replica"], [*messages,
                     {"role": "assistant", "content": answer}])
    assert len({rep for rep, _ in firsts.values()}) == 2  # two choices spread them
    for i, (replica, messages) in firsts.items():
        r = post(fleet, "/v1/chat/completions",
                 chat([*messages, {"role": "user", "content": "and then?"}], 4))
        assert r.headers["x-tandem-replica"] == replica, i
        assert r.json()["timings"]["cache_n"] > 0, i


def test_a_session_sticks_to_its_replica(fleet):
    for session in ("alice", "bob", "carol"):
        seen = {post(fleet, "/completion", {"prompt": f"{session} says {k}", "n_predict": 2},
                     headers={"x-session": session}).headers["x-tandem-replica"]
                for k in range(4)}
        assert len(seen) == 1, session
    seen = {post(fleet, "/completion", {"prompt": f"slot {k}", "n_predict": 2,
                                        "id_slot": 0}).headers["x-tandem-replica"]
            for k in range(4)}
    assert len(seen) == 1


def test_every_slot_named_is_one_replicas():
    """id_slot 0 and 1 are one server's slots: one session for every request naming a slot
    (the fixture's replicas have one slot each, so this is the ingress's rule alone)."""
    from tandem.cluster.ingress import _session

    assert _session(None, {"id_slot": 0}) == _session(None, {"id_slot": 1}) == "id_slot"
    assert _session(None, {"id_slot": -1}) is None and _session(None, {}) is None
    assert _session("alice", {"id_slot": 1}) == "alice"


def test_an_answer_given_on_one_replica_drafts_on_the_other(fleet):
    """The suffix pool across replicas: the same request on the replica that did not answer it
    is drafted from the answer the other gave (origin "suffix-pool")."""
    # sampled, seeded: the same answer again, and one the request's own suffix cannot draft
    # (the tiny model's greedy answers repeat themselves)
    body = {"prompt": "The shared pool, told once: " * 3, "n_predict": 160, "ignore_eos": True,
            "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7}
    first = post(fleet, "/completion", body)
    answered = first.headers["x-tandem-replica"]
    other = next(f"pool-{k}" for k in range(40) if post(
        fleet, "/completion", {"prompt": f"bind {k}", "n_predict": 1},
        headers={"x-session": f"pool-{k}"}).headers["x-tandem-replica"] != answered)
    time.sleep(1.5)  # a report each way: published, then taken by the other replica
    with httpx.stream("POST", f"{fleet.url}/completion", json={**body, "stream": True},
                      headers={**AUTH, "x-session": other}, timeout=60) as r:
        assert r.headers["x-tandem-replica"] != answered
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert "".join(e["content"] for e in events) == first.json()["content"]
    # the first time, nothing to draft from (a sampled answer does not repeat itself); the
    # second, on the other replica, most tokens come from drafts of the first answer
    assert first.json()["timings"]["draft_n_accepted"] < 0.1 * body["n_predict"]
    drafted = sum(o == "suffix" for e in events for o in e.get("origins", []))
    assert drafted > 0.5 * body["n_predict"], drafted


# ---- Ray on loopback ---------------------------------------------------------------------------


def test_ray_listens_on_loopback_only(fleet):
    ours = set(_descendants(fleet.proc.pid))
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True).stdout
    listening = [line.split()[3] for line in out.splitlines()
                 if any(int(p) in ours for p in re.findall(r"pid=(\d+)", line))]
    assert len(listening) > 5  # the GCS, the raylet, the workers, the proxy...
    assert [a for a in listening if not re.match(r"(\[::ffff:)?127\.0\.0\.1\]?:", a)] == []
    assert f"127.0.0.1:{fleet.port}" in listening


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, says", [
    (["--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["--ray", "auto"], "--ray auto: only with --replicas N"),
    (["--replicas", "2", "--ray", "127.0.0.1:9"], "--ray 127.0.0.1:9: nothing answers there"),
    (["--replicas", "64", "--threads", "1"], "--replicas 64 x --threads 1 needs 64 CPUs"),
])
def test_bad_input_is_one_line_and_exit_2(model, flags, says):
    before = set(_ray_processes())
    r = subprocess.run([*SERVE, "-m", str(model), "--port", "0", *flags], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("tandem: error:")]
    assert says in line
    time.sleep(1)
    assert set(_ray_processes()) - before == set()  # nothing of its left running


def test_a_model_that_cannot_load_is_said_before_ray_starts(model):
    bad = model.parent / "truncated.gguf"
    bad.write_bytes(model.read_bytes()[:100_000])
    r = subprocess.run([*SERVE, "-m", str(bad), "--port", "0", "--replicas", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is truncated" in r.stderr.splitlines()[-1]
    assert "Ray" not in r.stderr  # said before it started


def test_without_ray_replicas_says_how_to_install(model):
    code = ("import sys; sys.modules['ray'] = None; from tandem.cli import main; "
            f"sys.exit(main(['serve', '-m', {str(model)!r}, '--port', '0', '--replicas', '2']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "pip install 'tandem[cluster]'" in r.stderr


# ---- faults (last: the fleet is one replica short for a while) ---------------------------------


def test_a_killed_replica(fleet):
    """Killed mid-stream: the stream ends with an error event, a request waiting on it gets a
    502 that says so, other requests are answered, and Ray replaces the replica: the fleet
    reports two ready again."""
    body = {"prompt": "tell me everything", "n_predict": 1800, "ignore_eos": True,
            "stream": True, **GREEDY}
    victim = {**AUTH, "x-session": "victim"}
    with httpx.stream("POST", f"{fleet.url}/completion", json=body, headers=victim,
                      timeout=60) as r, ThreadPoolExecutor(1) as pool:
        replica = r.headers["x-tandem-replica"]
        lines = r.iter_lines()
        assert next(ln for ln in lines if ln.startswith("data: "))
        waiting = pool.submit(httpx.post, f"{fleet.url}/completion", headers=victim,
                              json={"prompt": "queued behind", "n_predict": 4}, timeout=60)
        time.sleep(0.5)  # it reaches the replica, behind the stream (one slot)
        os.kill(_pid_of(fleet, replica), signal.SIGKILL)
        rest = [ln[6:] for ln in lines if ln.startswith("data: ")]
        queued = waiting.result()
    last = json.loads(rest[-1])
    assert "error" in last and "failed" in last["error"]["message"], rest[-3:]
    assert queued.status_code == 502 and "failed" in queued.json()["error"]["message"]
    for i in range(4):  # none hangs: the survivor (or a retry) answers each
        post(fleet, "/completion", {"prompt": f"after {i}", "n_predict": 3, **GREEDY})
    deadline = time.monotonic() + 60
    while httpx.get(f"{fleet.url}/health", timeout=30).json()["replicas_ready"] < 2:
        assert time.monotonic() < deadline, "the killed replica was not replaced in 60 s"
        time.sleep(0.5)


def _pid_of(fleet: Server, replica: str) -> int:
    """The replica's process, from its 'ready' line in the fleet's log (Ray prefixes each
    replica's lines with its pid)."""
    pattern = re.compile(r"pid=(\d+)\).*tandem\[" + replica + r"\]: replica \w+ ready")
    [pid] = {int(m.group(1)) for m in pattern.finditer(fleet.log())}
    return pid


def test_a_verbose_replica_logs_its_debug_lines():
    """--verbose reaches each replica's loggers, as one server's (llama.cpp's
    test_kv_keep_only_active reads a debug line of the engine); without it, info only."""
    import logging

    from tandem.cluster.replica import _log_to_stderr

    loggers = [logging.getLogger(n) for n in ("tandem.server", "tandem.engine")]
    saved = [(lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    try:
        for lg in loggers:
            lg.handlers.clear()
        _log_to_stderr("r0", verbose=True)
        assert all(lg.isEnabledFor(logging.DEBUG) for lg in loggers)
        _log_to_stderr("r0")
        assert not any(lg.isEnabledFor(logging.DEBUG) for lg in loggers)
        assert all(lg.isEnabledFor(logging.INFO) for lg in loggers)
    finally:
        for lg, (level, handlers, propagate) in zip(loggers, saved):
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate
