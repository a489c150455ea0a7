"""The servers of `tandem bench` and the turns they are measured in: one `tandem serve` (or
llama-server) subprocess per configuration, the benchmark client's command, ABBA turns
(`measure_interleaved`, request by request or pass by pass) and the merge of the client files."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from .. import flags
from ..errors import TandemError
from ..server import cli as serve_cli
from .plan import Plan, Variant, say

HOST = "127.0.0.1"
SERVE = [sys.executable, "-m", "tandem.cli", "serve"]  # `tandem serve`, with this interpreter


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """One `tandem serve` subprocess with its log in a file; stopped on every way out of `with`."""

    def __init__(self, command: list[str], port: int, log_path: Path) -> None:
        self.command, self.log_path = command, log_path
        self.url = f"http://{HOST}:{port}"
        self.process: subprocess.Popen | None = None
        self._echoed = 0  # bytes of the log already shown

    def __enter__(self) -> Server:
        # the benchmark client sends no API key: a TANDEM_API_KEY in the bench's environment
        # must not make the server refuse it
        env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        p = self.process
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def wait_ready(self, timeout: float) -> float:
        """Seconds until GET /health said 200; the log streams to stderr meanwhile."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            self._echo()
            if self.process.poll() is not None:
                raise TandemError(f"the server exited with status {self.process.returncode} "
                                  f"before it was ready; its last lines:\n{self.tail()}")
            if self.health() == 200:
                self._echo()
                return time.monotonic() - start
            time.sleep(0.25)
        raise TandemError(f"the server was not ready after --load-timeout {timeout:g} s; its "
                          f"last lines:\n{self.tail()}")

    def health(self) -> int | None:
        """GET /health's status: 200 ready, 503 loading, None when nothing listens."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code  # 503 while loading
        except OSError:
            return None  # not listening yet

    def _echo(self) -> None:
        with open(self.log_path, "rb") as f:
            f.seek(self._echoed)
            data = f.read()
        data = data[:data.rfind(b"\n") + 1]  # whole lines only
        self._echoed += len(data)
        for line in data.decode("utf-8", errors="replace").splitlines():
            print(f"    {line}", file=sys.stderr, flush=True)

    def tail(self, n: int = 20) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(f"    {line}" for line in text.splitlines()[-n:]) or "    (no output)"


def llama_command(plan: Plan, variant: Variant, port: int) -> list[str]:
    """llama-server on the same files, threads and slots, the same context per slot (its
    --ctx-size is shared by its slots); speculation at llama.cpp's own defaults (what its users
    get)."""
    from ..registry import resolve

    a = plan.args
    cmd = [a.llama_server, "--model", resolve(plan.target, quiet=True), "--threads", a.n_threads,
           "--ctx-size", a.ctx_size, "--parallel", a.n_parallel,
           "--host", HOST, "--port", port,
           "--spec-type", variant.spec_type]
    if variant.uses_draft:
        cmd += ["--model-draft", resolve(plan.draft, quiet=True)]
    return [str(c) for c in cmd]


def serve_command(plan: Plan, variant: Variant, port: int) -> list[str]:
    """The server of one configuration. For Tandem, `tandem serve`'s own flag definitions
    (server/cli.py add_arguments) write its command line from the configuration's values
    (`Plan.configuration`, checked by `plan.validate` before any server started), so every
    model, engine and speculation setting of the bench reaches the server under its own flag.
    Only the flags the bench shares with `tandem serve` are in that namespace: the model, engine
    and speculation ones, the host and the port."""
    if variant.engine != "tandem":
        return llama_command(plan, variant, port)
    config = plan.configuration(variant)
    config.host, config.port = HOST, port
    del config.n_predict  # the bench's tokens per request, sent with each request, not a flag
    return [*SERVE, *flags.to_argv(config, serve_cli.add_arguments)]


def client_command(plan: Plan, label: str, output: Path, url: str, passes: int | None = None,
                   warmup: int | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    a = plan.args
    passes = a.passes if passes is None else passes
    warmup = a.warmup if warmup is None else warmup
    cmd = [sys.executable, "-I", str(plan.client),  # isolated: standard library only
           "--label", label, "--output", str(output),
           "--url", url, "--passes", str(passes), "--warmup", str(warmup),
           "--n-predict", str(a.n_predict)]
    return cmd + (["--prompts", a.prompts] if a.prompts else []) + list(extra)


@contextlib.contextmanager
def serving(plan: Plan, todo: list[Variant]):
    """Start every configuration's server, wait until each is ready; yields (variant, label,
    server) per configuration and stops them all on the way out."""
    a = plan.args
    n = len(todo)
    with contextlib.ExitStack() as stack:
        servers = []
        for i, variant in enumerate(todo, start=1):
            label = variant.label(a.spec_n_max if variant.n_max is None else variant.n_max)
            port = a.port + i - 1 if a.port else free_port()
            command = serve_command(plan, variant, port)
            log_path = plan.out_dir / f"{variant.name}.server.log"
            say(f"[{i}/{n}] {variant.name} ({label}): starting the server, log in {log_path}")
            plan.note(f"# {variant.name}: server\n{shlex.join(command)}")
            server = stack.enter_context(Server(command, port, log_path))
            seconds = server.wait_ready(a.load_timeout)
            say(f"[{i}/{n}] {variant.name}: ready after {seconds:.1f} s")
            servers.append((variant, label, server))
        yield servers


def measure_interleaved(plan: Plan, todo: list[Variant]) -> list[Path]:
    """Serve every configuration at once and measure them in turns, so that a neighbour
    slowing this shared machine for a while slows them alike. Only one server works at a time;
    the others wait idle.

    `--interleave request` (the default): every server answers the same request before the
    next request is sent to any, the order reversed from one request to the next (ABBA), so
    each task's requests in the different configurations lie seconds apart, not a pass
    apart; every server still sees the requests in the same order, pass after pass (what a
    server remembers of earlier requests, as ngram-mod and the suffix pool do, is the same).
    The warm-up, if any, is a pass of its own on each server first. `--interleave pass`: a
    whole pass per server in turns. Each client run is one request (or one pass); the runs are
    then merged into one client file per configuration, passes numbered 0, 1, ..."""
    a = plan.args
    by_request = getattr(a, "interleave", "pass") == "request"
    with serving(plan, todo) as servers:
        parts: dict[str, list[tuple[int, Path]]] = {v.name: [] for v in todo}
        warm: dict[str, Path] = {}
        if by_request and a.warmup:
            for variant, label, server in servers:
                say(f"warm-up: {variant.name}")
                out = plan.out_dir / f"{variant.name}.warmup.json"
                client = client_command(plan, label, out, server.url, passes=0,
                                        warmup=a.warmup)
                plan.note(f"# {variant.name}: client, warm-up\n{shlex.join(client)}")
                run_client(client, server)
                warm[variant.name] = out
        tasks = task_names(plan) if by_request else [None]
        steps = [(r, t) for r in range(a.passes) for t in tasks]
        for i, (r, task) in enumerate(steps):
            order = servers if i % 2 == 0 else servers[::-1]
            for variant, label, server in order:
                what = f"pass {r + 1}/{a.passes}" + (f", {task}" if task else "")
                say(f"{what}: {variant.name}")
                out = plan.out_dir / (f"{variant.name}.pass{r}.json" if task is None
                                      else f"{variant.name}.pass{r}.{len(parts[variant.name])}.json")
                extra = () if task is None else ("--tasks", task)
                client = client_command(plan, label, out, server.url, passes=1,
                                        warmup=0 if by_request or r else a.warmup, extra=extra)
                plan.note(f"# {variant.name}: client, {what}\n{shlex.join(client)}")
                run_client(client, server)
                parts[variant.name].append((r, out))
    paths = []
    for variant in todo:
        path = plan.out_dir / f"{variant.name}.json"
        merge_passes(parts[variant.name], path, warm.get(variant.name))
        paths.append(path)
    return paths


def task_names(plan: Plan) -> list[str]:
    """The client's task names for --prompts (or its built-in tasks), in its order."""
    a = plan.args
    cmd = [sys.executable, "-I", str(plan.client), "--list-tasks"]
    cmd += ["--prompts", a.prompts] if a.prompts else []
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise TandemError(f"the benchmark client could not list its tasks: "
                          f"{p.stderr.strip() or p.returncode}")
    return [line for line in p.stdout.splitlines() if line]


def merge_passes(files: list[tuple[int, Path]], out: Path, warmup: Path | None = None) -> None:
    """One client file from per-pass or per-request client files, each given with its pass:
    the first file's header, its tasks joined with the other files' (by name, in order of
    first appearance), every file's requests with "pass" set to the given pass, the warm-up
    requests of `warmup` (a warm-up-only run) or else of the files (and, from load-mode runs,
    each run's "load" summary under "load_runs"); the merged files are removed."""
    merged = json.loads(files[0][1].read_text(encoding="utf-8"))
    merged["requests"], merged["warmup"], merged["tasks"] = [], [], []
    seen: set[str] = set()
    runs = []
    for r, f in files:
        data = json.loads(f.read_text(encoding="utf-8"))
        merged["requests"] += [dict(q, **{"pass": r}) for q in data["requests"]]
        merged["warmup"] += data.get("warmup", [])
        for t in data.get("tasks", []):
            if t.get("task") not in seen:
                seen.add(t.get("task"))
                merged["tasks"].append(t)
        if "load" in data:
            runs.append(data["load"])
    if warmup is not None:
        warm = json.loads(warmup.read_text(encoding="utf-8"))
        merged["warmup"] = warm.get("warmup", [])
    merged.pop("load", None)
    if runs:
        merged["load_runs"] = runs
    if isinstance(merged.get("settings"), dict):
        merged["settings"]["passes"] = len({r for r, _ in files})
        merged["settings"]["tasks"] = None
        if warmup is not None:
            merged["settings"]["warmup"] = (warm.get("settings") or {}).get("warmup", 0)
    out.write_text(json.dumps(merged, indent=1, ensure_ascii=False), encoding="utf-8")
    for _, f in files:
        f.unlink()
    if warmup is not None:
        warmup.unlink()


def run_client(command: list[str], server: Server) -> None:
    """Run the client with its progress streaming through; on failure, TandemError with its
    last lines and the server's."""
    last: deque[str] = deque(maxlen=5)
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL) as p:
        try:
            for line in p.stderr:
                print(f"    {line.rstrip()}", file=sys.stderr, flush=True)
                last.append(line.rstrip())
            p.wait()
        except BaseException:
            p.kill()
            raise
    if p.returncode != 0:
        said = "\n".join(f"    {x}" for x in last) or "    (no output)"
        raise TandemError(f"the benchmark client failed with status {p.returncode}:\n{said}\n"
                          f"the server's last lines:\n{server.tail(10)}")
