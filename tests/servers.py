"""`tandem serve` as a real process on 127.0.0.1 for the tests that need one (test_server,
test_server_parity, test_structured, test_page): the Server class and the request constants."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests import tiny

SERVE = [sys.executable, "-m", "tandem.cli", "serve"]
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `tandem serve` subprocess; stderr goes to a file (a full pipe would block it)."""

    def __init__(self, args: list[str], log_path: Path, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [*SERVE, *args, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.health_seen: list[tuple[int, dict]] = []

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            self.health_seen.append((r.status_code, r.json()))
            if r.status_code == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def model_rows(s: Server) -> dict[str, dict]:
    """A router's GET /models, by model id."""
    r = httpx.get(f"{s.url}/models", timeout=30)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


def same_weights_pair(d: Path) -> tuple[Path, Path]:
    """A tiny qwen2 target and a draft with its weights (greedy drafts are always accepted)."""
    model = tiny.hf_model("qwen2", seed=0)
    return (tiny.write_gguf(model, d / "target.gguf", "qwen2"),
            tiny.write_gguf(model, d / "draft.gguf", "qwen2"))
