"""scripts/speculative-benchmark.py against a scripted llama.cpp-style server.

The client runs as a subprocess under `python -I -S`: isolated and without site-packages, so a
third-party import would fail (bench_helpers.run_client; FakeServer is the scripted server).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from .bench_helpers import SCRIPT, FakeServer, Stream, run_client, write_prompts


def completion(content: str = "def f():\n    pass\n", n: int = 8, ms: float = 80.0) -> dict:
    """A llama-server style answer for a greedy request that hit n_predict."""
    return {
        "content": content, "tokens_predicted": n, "tokens_evaluated": 30, "stop_type": "limit",
        "truncated": False,
        "timings": {"prompt_n": 30, "prompt_ms": 12.0, "predicted_n": n, "predicted_ms": ms,
                    "predicted_per_second": 1000 * n / ms},
    }


def assert_clean_failure(proc: subprocess.CompletedProcess, code: int, *phrases: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr


def test_records_every_measured_request_with_the_servers_answer(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", [
        json.dumps({"task": "edit", "prompt": "Rename f to g:\n", "n_predict": 8}),
        "",
        json.dumps({"task": "tale", "prompt": "Once upon a time"}),
    ])
    props = {"model_path": "target.gguf", "total_slots": 1}
    with FakeServer(lambda body: (200, completion()), props=(200, props)) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--prompts", str(prompts),
                          "--passes", "3", "--warmup", "2", "--n-predict", "16", "--seed", "7",
                          label="base")
    assert proc.returncode == 0, proc.stderr
    assert "[pass 3/3] tale: 8 tokens" in proc.stderr
    # 2 warm-up passes then 3 measured ones, each over both tasks, with greedy, uncached requests
    assert [b["prompt"] for b in server.received] == ["Rename f to g:\n", "Once upon a time"] * 5
    assert [b["n_predict"] for b in server.received[:2]] == [8, 16]
    for body in server.received:
        assert (body["temperature"], body["top_k"], body["seed"]) == (0.0, 1, 7)
        assert body["cache_prompt"] is False and body["stream"] is False

    out = json.loads((tmp_path / "out.json").read_text())
    assert out["format"] == "tandem-bench-1" and out["label"] == "base"
    assert out["props"] == props
    assert out["settings"]["passes"] == 3 and out["settings"]["warmup"] == 2
    assert [t["n_predict"] for t in out["tasks"]] == [8, 16]
    assert [(r["task"], r["pass"]) for r in out["warmup"]] == [("edit", 1), ("tale", 1),
                                                               ("edit", 2), ("tale", 2)]
    assert [(r["task"], r["pass"]) for r in out["requests"]] == [
        (task, p) for p in (1, 2, 3) for task in ("edit", "tale")]
    first = out["requests"][0]
    assert first["timings"] == completion()["timings"]
    assert first["content"] == "def f():\n    pass\n"
    assert (first["tokens_predicted"], first["tokens_evaluated"]) == (8, 30)
    assert (first["stop_type"], first["truncated"]) == ("limit", False)
    assert 0 < first["wall_s"] < 10


def test_builtin_tasks_and_props_null_when_the_server_has_none(tmp_path):
    with FakeServer(lambda body: (200, completion())) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--passes", "1", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["props"] is None and out["warmup"] == []
    assert [t["task"] for t in out["tasks"]] == ["code-edit", "summary", "story"]
    assert all(len(t["prompt"]) > 1000 and t["n_predict"] == 256 for t in out["tasks"])
    assert [b["prompt"] for b in server.received] == [t["prompt"] for t in out["tasks"]]


def test_unreachable_server_fails_cleanly(tmp_path):
    with socket.socket() as sock:  # bound but not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        proc = run_client(url, tmp_path / "out.json")
    assert_clean_failure(proc, 1, f"cannot reach the server at {url}", "--url")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("status", [400, 200])
def test_error_answer_fails_cleanly_with_the_servers_message(tmp_path, status):
    error = {"error": {"message": "n_predict must be at most 128, got 256",
                       "type": "invalid_request_error", "code": 400}}
    with FakeServer(lambda body: (status, error)) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--warmup", "0")
    assert_clean_failure(proc, 1, f"answered HTTP {status}", "n_predict must be at most 128",
                         "task 'code-edit', pass 1")
    assert len(server.received) == 1
    assert not (tmp_path / "out.json").exists()


def test_answer_without_llama_cpp_fields_fails_cleanly(tmp_path):
    with FakeServer(lambda body: (200, {"text": "hello"})) as server:
        proc = run_client(server.url, tmp_path / "out.json")
    assert_clean_failure(proc, 1, "lacks llama.cpp's fields content and timings")


def test_server_still_loading_fails_cleanly(tmp_path):
    loading = (503, {"error": {"message": "Loading model", "code": 503}})
    with FakeServer(lambda body: (200, completion()), health=loading) as server:
        proc = run_client(server.url, tmp_path / "out.json")
    assert_clean_failure(proc, 1, "not ready", "Loading model")
    assert server.received == []


def test_request_timeout_fails_cleanly(tmp_path):
    def slow(body):
        time.sleep(1.0)
        return 200, completion()

    with FakeServer(slow) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--timeout", "0.2")
    assert_clean_failure(proc, 1, "no answer within --timeout 0.2 s")


@pytest.mark.parametrize("line, phrase", [
    ('{"task": "a", "prompt": "x"', "p.jsonl:2: not valid JSON"),
    ('["a", "x"]', "p.jsonl:2: a JSON list, not an object"),
    ('{"task": "a"}', 'p.jsonl:2: "prompt" must be a non-empty string, got None'),
    ('{"task": "", "prompt": "x"}', 'p.jsonl:2: "task" must be a non-empty string'),
    ('{"task": "ok", "prompt": "x"}', "p.jsonl:2: task 'ok' appears twice"),
    ('{"task": "b", "prompt": "x", "n_predict": 0}', '"n_predict" must be a positive integer'),
    ('{"task": "b", "prompt": "x", "temp": 1}', "unknown field(s) temp"),
    ('{"task": "b", "prompt": "x", "request": [1]}', '"request" must be an object'),
])
def test_bad_prompts_file_is_refused_before_any_request(tmp_path, line, phrase):
    prompts = write_prompts(tmp_path / "p.jsonl", ['{"task": "ok", "prompt": "fine"}', line])
    with FakeServer(lambda body: (200, completion())) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--prompts", str(prompts))
    assert_clean_failure(proc, 2, phrase, '{"task": "name", "prompt": "text"')
    assert server.received == []


def test_a_tasks_request_fields_reach_the_server(tmp_path):
    """A task's "request" (e.g. a JSON schema) goes into its request body, as sent."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    prompts = write_prompts(tmp_path / "p.jsonl", [
        json.dumps({"task": "s", "prompt": "x", "request": {"json_schema": schema}}),
        json.dumps({"task": "plain", "prompt": "y"})])
    with FakeServer(lambda body: (200, completion())) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--prompts", str(prompts))
    assert proc.returncode == 0, proc.stderr
    by_prompt = {b["prompt"]: b for b in server.received}
    assert by_prompt["x"]["json_schema"] == schema and "json_schema" not in by_prompt["y"]


def test_missing_or_empty_prompts_file_is_refused(tmp_path):
    missing = tmp_path / "no.jsonl"
    proc = run_client("http://127.0.0.1:9", tmp_path / "out.json", "--prompts", str(missing))
    assert_clean_failure(proc, 2, "cannot read --prompts file")
    empty = write_prompts(tmp_path / "empty.jsonl", ["", "  "])
    proc = run_client("http://127.0.0.1:9", tmp_path / "out.json", "--prompts", str(empty))
    assert_clean_failure(proc, 2, "has no tasks")


def test_help_names_what_is_not_measured():
    proc = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--help"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    phrases = ("time to the first token without --stream", "memory",
               "concurrent requests without --concurrency or --rate", "cache_prompt false")
    for phrase in phrases:
        assert phrase in text


def test_imports_only_the_standard_library():
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='bench'); "
            "top = {name.partition('.')[0] for name in sys.modules}; "
            "stdlib = {*sys.stdlib_module_names, *sys.builtin_module_names, '__main__'}; "
            "print(sorted(top - stdlib))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(SCRIPT)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def streamed(pieces: list[tuple[float, str]], n: int) -> Stream:
    """A llama-server /completion stream: a chunk per (delay, text), then the final event."""
    events = Stream((delay, {"content": text, "tokens": [1], "stop": False})
                    for delay, text in pieces)
    final = {**completion("", n=n), "stop": True}
    events.append((0.0, final))
    return events


def test_stream_records_time_to_first_token_and_the_gaps_between_events(tmp_path):
    pieces = [(0.30, "def"), (0.05, " f"), (0.05, "():"), (0.40, "\n    pass"), (0.05, "\n")]
    with FakeServer(lambda body: (200, streamed(pieces, n=5))) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--passes", "1", "--warmup", "0",
                          "--stream", "--prompts",
                          str(write_prompts(tmp_path / "p.jsonl", ['{"task": "t", "prompt": "x"}'])))
    assert proc.returncode == 0, proc.stderr
    assert server.received[0]["stream"] is True
    (r,) = json.loads((tmp_path / "out.json").read_text())["requests"]
    assert r["content"] == "def f():\n    pass\n"  # the events' text joined
    assert r["tokens_predicted"] == 5 and r["events"] == 5
    assert 0.30 <= r["ttft_s"] < 0.30 + 0.15
    assert len(r["gaps_s"]) == 4
    for got, want in zip(r["gaps_s"], [0.05, 0.05, 0.40, 0.05]):
        assert want - 0.005 <= got < want + 0.1
    assert r["gap_max_s"] == pytest.approx(max(r["gaps_s"]), abs=1e-5) and r["gap_max_s"] >= 0.395
    assert r["gap_mean_s"] == pytest.approx(sum(r["gaps_s"]) / 4, abs=1e-5)
    assert r["e2e_s"] >= r["ttft_s"] + sum(r["gaps_s"]) - 1e-3


def test_load_mode_keeps_n_requests_in_flight_and_summarizes_percentiles(tmp_path):
    pieces = [(0.10, "a"), (0.05, "b")]
    prompts = write_prompts(tmp_path / "p.jsonl", ['{"task": "t1", "prompt": "x"}',
                                                   '{"task": "t2", "prompt": "y"}'])
    with FakeServer(lambda body: (200, streamed(pieces, n=2))) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--passes", "3", "--warmup", "1",
                          "--stream", "--concurrency", "2", "--prompts", str(prompts))
    assert proc.returncode == 0, proc.stderr
    assert server.most_in_flight == 2  # the warm-up went one at a time, then 2 at once
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["warmup"]) == 2 and len(out["requests"]) == 6
    assert sorted((r["task"], r["pass"]) for r in out["requests"]) == \
        [(t, p) for t in ("t1", "t2") for p in (1, 2, 3)]
    load = out["load"]
    assert load["requests"] == 6 and load["output_tokens"] == 12
    assert load["throughput_tok_s"] == pytest.approx(12 / load["elapsed_s"])
    # 6 requests of ~0.15 s, two at a time: about 0.45 s, not the 0.9 s of one at a time
    assert 0.3 <= load["elapsed_s"] < 0.85
    assert set(load["ttft_s"]) == {"p50", "p90", "p99"}
    assert 0.1 <= load["ttft_s"]["p50"] <= load["ttft_s"]["p90"] <= load["ttft_s"]["p99"]
    assert "output tok/s" in proc.stderr and "TTFT" in proc.stderr


def test_rate_mode_sends_a_bounded_number_of_requests(tmp_path):
    with FakeServer(lambda body: (200, completion())) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--warmup", "0", "--rate", "50",
                          "--requests", "7")
    assert proc.returncode == 0, proc.stderr
    assert len(server.received) == 7
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["load"]["requests"] == 7 and "ttft_s" not in out["load"]  # not streamed
    assert out["settings"]["rate"] == 50.0


def test_percentiles_and_load_flags():
    import runpy

    bench = runpy.run_path(str(SCRIPT), run_name="bench")
    pct = bench["percentile"]
    assert pct([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert pct([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert pct([7.0], 99) == 7.0 and pct([], 50) is None
    proc = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--label", "x", "--output",
                           "/tmp/x.json", "--requests", "5"], capture_output=True, text=True,
                          timeout=30)
    assert_clean_failure(proc, 2, "need load mode")


def test_tasks_picks_some_tasks_and_lists_them(tmp_path):
    """`tandem bench --interleave request` sends one task per client run (--tasks) after asking
    the client for the names (--list-tasks, no server needed), and warms up with --passes 0."""
    prompts = write_prompts(tmp_path / "p.jsonl", [
        json.dumps({"task": t, "prompt": f"prompt {t}"}) for t in ("a", "b", "c")])
    listed = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--list-tasks",
                             "--prompts", str(prompts)], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.split() == ["a", "b", "c"]
    builtin = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--list-tasks"],
                             capture_output=True, text=True)
    assert builtin.stdout.split() == ["code-edit", "summary", "story"]
    with FakeServer(lambda body: (200, completion())) as server:
        proc = run_client(server.url, tmp_path / "out.json", "--prompts", str(prompts),
                          "--tasks", "c,a", "--passes", "2", "--warmup", "0")
        assert proc.returncode == 0, proc.stderr
        # the file's order, whatever the order asked
        assert [b["prompt"] for b in server.received] == ["prompt a", "prompt c"] * 2
        out = json.loads((tmp_path / "out.json").read_text())
        assert [t["task"] for t in out["tasks"]] == ["a", "c"]
        assert out["settings"]["tasks"] == "c,a"
        server.received.clear()
        proc = run_client(server.url, tmp_path / "warm.json", "--prompts", str(prompts),
                          "--tasks", "b", "--passes", "0", "--warmup", "1")
        assert proc.returncode == 0, proc.stderr
        assert [b["prompt"] for b in server.received] == ["prompt b"]
        warm = json.loads((tmp_path / "warm.json").read_text())
        assert warm["requests"] == [] and [r["task"] for r in warm["warmup"]] == ["b"]
        bad = run_client(server.url, tmp_path / "x.json", "--prompts", str(prompts),
                         "--tasks", "a,zz")
        assert_clean_failure(bad, 2, "--tasks: no task named 'zz'", "its tasks: a, b, c")
        nothing = run_client(server.url, tmp_path / "x.json", "--passes", "0", "--warmup", "0")
        assert_clean_failure(nothing, 2, "--passes must be at least 1 (or 0 with --warmup")
    missing = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--url", "x"],
                             capture_output=True, text=True)
    assert_clean_failure(missing, 2, "--label is required")
