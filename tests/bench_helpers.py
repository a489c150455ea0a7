"""Helpers shared by the measurement tests (test_bench_client, test_compare, test_bench_run):
a scripted llama.cpp-style server, the benchmark client run as a user runs it, and benchmark
files written by hand so that every figure is known exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "speculative-benchmark.py"

Answer = Callable[[dict], tuple[int, object]]


class Stream(list):
    """An answer sent as server-sent events: (seconds to wait, event) pairs, in order."""


class FakeServer:
    """A /completion server on 127.0.0.1 whose answers come from `answer(body) -> (status, json)`.

    `received` keeps every /completion request body, in order. /health and /props answer with
    the given (status, json) pairs. An answer whose payload is a `Stream` goes out as events,
    each after its delay.
    """

    def __init__(self, answer: Answer, health=(200, {"status": "ok"}), props=(404, None)) -> None:
        self.received: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0  # the most requests it was answering at once
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                routes = {"/health": health, "/props": props}
                self.reply(*routes.get(self.path, (404, {"error": {"message": "not found"}})))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.received.append(body)
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    status, payload = answer(body)
                    if isinstance(payload, Stream):
                        self.stream(status, payload)
                    else:
                        self.reply(status, payload)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def stream(self, status: int, events: Stream) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for delay, event in events:
                    time.sleep(delay)
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()

            def reply(self, status: int, payload: object) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (its --timeout): nobody to answer

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FakeServer:
        thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def run_client(
    url: str, output: Path, *args: str, label: str = "run"
) -> subprocess.CompletedProcess[str]:
    """Run the benchmark client as a user would, isolated (-I) and without site-packages (-S),
    so that a third-party import would fail."""
    command = [sys.executable, "-I", "-S", str(SCRIPT), "--label", label, "--output", str(output),
               "--url", url, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def write_prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def request(task: str, p: int, wall_s: float, ms: float = 100.0, n: int = 10, content: str = "x",
            stop_type: str = "limit", **timings) -> dict:
    """One measured request as the client records it (extra keyword arguments: timings)."""
    return {"task": task, "pass": p, "wall_s": wall_s, "tokens_predicted": n,
            "stop_type": stop_type, "content": content, "truncated": False, "tokens_evaluated": 5,
            "timings": {"predicted_ms": ms, "predicted_n": n, "predicted_per_second": 1000 * n / ms,
                        **timings}}


def bench_file(path: Path, label: str, requests: list[dict]) -> str:
    """A minimal client file ("tandem-bench-1") with these requests; its path."""
    path.write_text(json.dumps({"format": "tandem-bench-1", "label": label, "requests": requests}))
    return str(path)
