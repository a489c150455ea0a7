"""`tandem bench --agent`'s parts without a real agent or model: the recording proxy against a
tiny fake upstream (a streamed and a plain answer), a task repository made, changed and checked,
and the report's transcript comparison."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tandem.errors import TandemError
from tandem.measure import agent, agentreport
from tandem.measure.recorder import Recorder

TASKS = Path(__file__).resolve().parents[1] / "bench" / "agent_tasks"
TIMINGS = {"draft_n": 7, "draft_n_accepted": 5, "cache_n": 100, "prompt_ms": 12.0}


def _chunk(delta: dict) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


class Upstream(BaseHTTPRequestHandler):
    """Chat completions as llama-server answers them: streamed with a pause before the first
    token, or whole."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            time.sleep(0.2)  # reading the prompt
            events = [_chunk({"role": "assistant", "content": None}), _chunk({"content": "Hel"}),
                      _chunk({"content": "lo"}),
                      _chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                              "function": {"name": "run_tests",
                                                           "arguments": "{}"}}]}),
                      b"data: " + json.dumps({"choices": [], "usage": {
                          "prompt_tokens": 30, "completion_tokens": 4},
                          "timings": TIMINGS}).encode() + b"\n\n", b"data: [DONE]\n\n"]
            for e in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(e), e))
                self.wfile.flush()
                time.sleep(0.02)
            self.wfile.write(b"0\r\n\r\n")
            return
        data = json.dumps({"choices": [{"index": 0, "message": {
            "role": "assistant", "content": "plain answer"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2},
            "timings": TIMINGS}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _post(url: str, body: dict) -> tuple[str, bytes]:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers["Content-Type"], r.read()


def test_the_proxy_records_a_streamed_and_a_plain_answer(upstream):
    with Recorder(upstream) as rec:
        rec.mark()
        ctype, data = _post(rec.url, {"messages": [{"role": "user", "content": "hi"}],
                                      "stream": True, "temperature": 0})
        assert "text/event-stream" in ctype
        assert data.count(b"data: ") == 6 and data.endswith(b"data: [DONE]\n\n")
        _, plain = _post(rec.url, {"messages": [], "stream": False})
        assert json.loads(plain)["choices"][0]["message"]["content"] == "plain answer"
        streamed, whole = rec.take()
        assert rec.take() == []
    assert streamed["stream"] and streamed["status"] == 200 and streamed["temperature"] == 0
    assert streamed["text"] == "Hello" and streamed["items"] == 1
    assert streamed["request_sha256"] != whole["request_sha256"]
    assert streamed["tool_calls"] == [{"name": "run_tests", "arguments": "{}"}]
    assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (30, 4)
    assert streamed["timings"] == TIMINGS
    # the first content came after the upstream's pause, before the end
    assert streamed["start_s"] + 0.15 < streamed["first_s"] < streamed["end_s"]
    assert not whole["stream"] and whole["text"] == "plain answer"
    assert whole["timings"]["draft_n_accepted"] == 5 and whole["completion_tokens"] == 2
    figures = agentreport.run_figures({"requests": [streamed, whole], "check": {"passed": True},
                                       "wall_s": 1.0, "rc": 0, "timed_out": False})
    assert (figures["turns"], figures["tool_calls"], figures["drafted"]) == (2, 1, 14)


def test_a_task_repository_is_made_and_checked(tmp_path):
    [task] = agent.load_tasks(TASKS, "fix-failing-test")
    assert task.files and "intervals.py" in task.instruction
    repo = tmp_path / "repo"
    agent.prepare_repo(task, repo)
    assert agent.left_diff(repo) == ""
    assert not agent.check_repo(task, repo)["passed"]  # the bug is there
    # an agent that edits the test instead of the code: check/ puts the test back
    (repo / "test_intervals.py").write_text("def test_nothing():\n    pass\n")
    assert not agent.check_repo(task, repo)["passed"]
    agent.prepare_repo(task, repo)  # afresh
    source = repo / "intervals.py"
    source.write_text(source.read_text().replace("start < merged", "start <= merged"))
    assert "start <= merged" in agent.left_diff(repo)
    result = agent.check_repo(task, repo)
    assert result["passed"] and "4 passed" in result["summary"]


def test_every_task_is_well_formed_and_fails_before_the_agent(tmp_path):
    tasks = agent.load_tasks(TASKS)
    assert len(tasks) >= 3
    for task in tasks:
        assert all((task.root / "repo" / f).is_file() for f in task.files), task.name
        repo = tmp_path / task.name
        agent.prepare_repo(task, repo)
        assert not agent.check_repo(task, repo)["passed"], task.name


def test_unknown_tasks_and_agents_are_refused(tmp_path):
    with pytest.raises(TandemError, match="no-such-task"):
        agent.load_tasks(TASKS, "no-such-task")
    args = type("A", (), {"agent_clients": "cursor", "agent_python": "/bin/sh"})()
    with pytest.raises(TandemError, match="unknown agent cursor"):
        agent.agent_pythons(args)


def _run(config: str, texts: list[str], wall: float) -> dict:
    return {"agent": "aider", "task": "t", "config": config, "wall_s": wall, "rc": 0,
            "timed_out": False, "check": {"passed": True},
            "requests": [{"status": 200, "start_s": 0.0, "first_s": 0.5, "end_s": 1.0,
                          "text_sha256": t, "tool_calls": []} for t in texts]}


def test_the_report_compares_transcripts_and_walls():
    runs = [_run("baseline", ["a", "b"], 10.0), _run("candidate", ["a", "b"], 5.0),
            _run("llama-none", ["a", "c"], 12.0), _run("llama-ngram-mod", ["a", "d"], 11.0)]
    configs = ["baseline", "candidate", "llama-none", "llama-ngram-mod"]
    rep = agentreport.report(runs, configs, {c: c for c in configs})
    assert rep["speculation_kept_transcripts"]
    over = {s["over"]: s for s in rep["speedups"]}
    assert over["baseline"]["speedup"] == 2.0 and over["baseline"]["same_work"]
    assert over["llama-ngram-mod"]["speedup"] == 2.2 and not over["llama-ngram-mod"]["same_work"]
    llama = [s for s in rep["transcripts"] if s["config"] == "llama-ngram-mod"]
    assert llama[0]["first_difference_turn"] == 2
    assert "**2.00x**" in agentreport.markdown(rep, "tandem bench --agent aider")
    assert llama[0]["same_request_there"] is None  # no request hashes recorded here
    runs[1] = _run("candidate", ["a"], 5.0)
    assert not agentreport.report(runs, configs, {})["speculation_kept_transcripts"]


def test_request_hashes_leave_out_the_ids_servers_make_up():
    from tandem.measure.recorder import _request_fields

    def body(call_id: str, text: str) -> bytes:
        return json.dumps({"messages": [
            {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": text}]}).encode()

    same = {_request_fields(body(c, "ok"))["request_sha256"] for c in ("call_1", "call_2")}
    assert len(same) == 1
    assert _request_fields(body("call_1", "no"))["request_sha256"] not in same


def test_an_agent_runs_with_a_fixed_hash_seed_and_its_own_home(tmp_path):
    """aider orders the chat's files by a set of strings: the same seed, the same prompt."""
    import sys

    code = "import os; print(os.environ['PYTHONHASHSEED'], os.environ['HOME'])"
    ran = agent.run_agent([sys.executable, "-c", code], tmp_path, tmp_path / "home", 60)
    assert ran["rc"] == 0 and ran["output"].split() == ["0", str(tmp_path / "home")]
