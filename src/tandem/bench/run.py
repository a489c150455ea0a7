"""`tandem bench`: serve the target alone and with speculation, measure both on the same work.

    tandem bench --model target.gguf --model-draft draft.gguf --passes 5 --out-dir bench/results/x

Each configuration gets its own `tandem serve` (127.0.0.1, a free port), waits for GET /health
200 and is measured by scripts/speculative-benchmark.py (a subprocess, as a user would run it).
Every configuration of a run (baseline and candidate, or the sweep's seven) is served at once
and measured pass by pass in turns, the order reversed every pass (`measure_interleaved`): only
one server works at a time, and a slow spell of this shared machine hits all alike. The
comparison is `tandem compare`'s, in-process. The out dir keeps everything needed to check the figures:

    command.txt            the bench command line and every server and client command it ran
    baseline.json          the client's file for the target alone (--spec-type none)
    candidate.json         ... for the speculative configuration (one run: --spec-type, else
                           auto, the server's default with a draft), or one file per
                           configuration (--sweep: draft-n2.json, ..., auto.json)
    report.md, report.json the comparison (one run) or the ranking (--sweep)
    speedup.png            speed-up per task (one run)
    *.server.log           each server's log

--llama-server PATH adds llama.cpp's llama-server with the same GGUF files to the same turns:
target alone, draft-simple and ngram-simple, each with llama.cpp's own defaults (llama-none.json,
llama-draft.json, llama-ngram.json), and report.md gets a side-by-side section measured by the
same client: wall time per pass, decode tokens/s, acceptance, each configuration against
llama.cpp's target alone, and whether its text equals llama.cpp's.

--sweep measures draft-simple with n-max 2, 4 and 8, ngram-simple, ngram-simple then
draft-simple, and auto against one baseline, and ranks them by the median wall-time speed-up of a whole
pass. A configuration whose output differs from the baseline's (the equal-work check) is listed
with the reasons and never ranked: its "speed-up" would compare different work.

Exit status: 0; 1 when some output differed from the baseline's (everything is still written);
2 for a bad flag or --prompts file; 130 when interrupted (Ctrl-C or SIGTERM; servers stopped).
A server that fails to load or a failed client run is a TandemError with their last log lines.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from ..errors import TandemError
from . import compare

HOST = "127.0.0.1"
CLIENT = Path("scripts") / "speculative-benchmark.py"  # relative to the repository root
SERVE = [sys.executable, "-m", "tandem.cli", "serve"]  # `tandem serve`, with this interpreter
EXIT_NOT_EQUAL = 1  # everything was measured and written, but some output differed


@dataclass(slots=True, frozen=True)
class Variant:
    """One server configuration: the file stem of its results and its speculation flags."""

    name: str
    spec_type: str
    n_max: int | None = None  # None: the --spec-draft-n-max flag
    engine: str = "tandem"  # or "llama.cpp": --llama-server, with llama.cpp's own defaults

    @property
    def uses_draft(self) -> bool:
        return bool({"draft-simple", "auto"} & set(self.spec_type.split(",")))

    def label(self, n_max: int) -> str:
        if self.engine != "tandem":
            return f"{self.engine} {self.spec_type}"
        return f"{self.spec_type} n-max {n_max}" if self.uses_draft else self.spec_type


BASELINE = Variant("baseline", "none")
SWEEP = (
    Variant("draft-n2", "draft-simple", 2),
    Variant("draft-n4", "draft-simple", 4),
    Variant("draft-n8", "draft-simple", 8),
    Variant("ngram", "ngram-simple"),
    Variant("ngram-draft", "ngram-simple,draft-simple"),
    Variant("auto", "auto"),
)
LLAMA = (  # --llama-server: the same client against llama.cpp, in the same turns
    Variant("llama-none", "none", engine="llama.cpp"),
    Variant("llama-draft", "draft-simple", engine="llama.cpp"),
    Variant("llama-ngram", "ngram-simple", engine="llama.cpp"),
)


@dataclass(slots=True)
class Plan:
    """What to run, resolved from the flags once: models, client, out dir, the command record."""

    args: argparse.Namespace
    target: str
    draft: str | None
    variants: list[Variant]  # the speculative configurations, measured after the baseline
    client: Path
    out_dir: Path
    command: str  # the bench command line, as typed
    record: list[str]  # lines of command.txt, written again after every command

    def note(self, line: str) -> None:
        self.record.append(line)
        (self.out_dir / "command.txt").write_text("\n".join(self.record) + "\n", encoding="utf-8")


# ---- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..cli import add_model_args, add_spec_args

    add_model_args(parser, default_model=None)
    add_spec_args(parser)
    g = parser.add_argument_group("benchmark")
    g.add_argument("--passes", type=int, default=5, help="measured passes per server (5)")
    g.add_argument("--warmup", type=int, default=1, help="unmeasured passes first (1)")
    g.add_argument("--n-predict", type=int, default=256, help="tokens per request (256)")
    g.add_argument("--prompts", default=None, help='JSONL, one {"task", "prompt", "n_predict"} '
                   "per line (default: the client's 3 built-in tasks)")
    g.add_argument("--out-dir", default=None,
                   help="new or empty folder for the results (default: bench/results/<time>)")
    g.add_argument("--port", type=int, default=None, help="port for the servers (default: free)")
    g.add_argument("--sweep", action="store_true",
                   help="measure draft n-max 2/4/8, ngram-simple and ngram-simple,draft-simple "
                        "against one baseline and rank them")
    g.add_argument("--load-timeout", type=float, default=900.0,
                   help="seconds a server may take to load before bench gives up (900)")
    g.add_argument("--client", default=None,
                   help=f"the benchmark client script (default: {CLIENT} in the source tree)")
    g.add_argument("--llama-server", metavar="PATH", default=None,
                   help="also measure llama.cpp's llama-server (this binary) on the same GGUF "
                        "files and work, in the same turns: target alone, draft-simple and "
                        "ngram-simple with llama.cpp's defaults")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = ["tandem", "bench", *(sys.argv[1:] if argv is None else argv)]
    try:
        return run(args)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code


def run(args: argparse.Namespace) -> int:
    """Measure; 0 when every comparison did equal work, 1 when one did not, 130 on Ctrl-C.

    Raises TandemError for a bad flag, a server that fails to load, or a failed client run.
    Servers are stopped on every way out, SIGTERM included.
    """
    plan = make_plan(args)
    with _sigterm_as_interrupt():
        try:
            return run_sweep(plan) if args.sweep else run_pair(plan)
        except KeyboardInterrupt:
            print(f"tandem bench: interrupted; servers stopped; partial results in {plan.out_dir}",
                  file=sys.stderr)
            return 130


def make_plan(args: argparse.Namespace) -> Plan:
    """Check every flag and the prompts before any server loads, then create the out dir."""
    for name, low in (("passes", 1), ("warmup", 0), ("n_predict", 1)):
        if getattr(args, name) < low:
            flag = "--" + name.replace("_", "-")
            raise TandemError(f"{flag} must be >= {low}, got {getattr(args, name)}")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise TandemError(f"--port must be 1..65535, got {args.port}")
    if not args.load_timeout > 0:
        raise TandemError(f"--load-timeout must be > 0 seconds, got {args.load_timeout:g}")
    if args.sweep and args.spec_type is not None:
        raise TandemError(f"--sweep chooses the spec types itself; drop --spec-type "
                          f"{args.spec_type} (or drop --sweep to measure just that one)")
    target, draft = resolve_models(args)
    todo = variants(args, draft)
    for variant in [BASELINE, *todo]:
        _validate(args, variant, draft)
    if args.llama_server is not None:
        check_llama_server(args.llama_server, target, draft)
    client = find_client(args.client)
    check_prompts(client, args)
    out_dir = make_out_dir(args.out_dir)
    command = shlex.join(getattr(args, "argv", None) or sys.argv)
    plan = Plan(args, target, draft, todo, client, out_dir, command, [])
    for line in _header(command):
        plan.note(line)
    return plan


def resolve_models(args: argparse.Namespace) -> tuple[str, str | None]:
    """The target and draft to serve; no --model and no --model-draft is the default pair."""
    target = args.model or "default"
    draft = args.model_draft or ("default-draft" if args.model is None else None)
    return target, draft


def variants(args: argparse.Namespace, draft: str | None) -> list[Variant]:
    """The speculative configurations to measure against the baseline."""
    if args.sweep:
        usable = [v for v in SWEEP if draft is not None or not v.uses_draft]
        if len(usable) < len(SWEEP):
            print("tandem bench: no --model-draft: the sweep measures ngram-simple only",
                  file=sys.stderr)
        return usable
    if args.spec_type is not None:
        return [Variant("candidate", args.spec_type)]
    if draft is None:
        raise TandemError(f"nothing to speculate with: --model {args.model} has no draft; add "
                          "--model-draft PATH or --spec-type ngram-simple")
    return [Variant("candidate", "auto")]  # what the server runs with a draft and no --spec-type


def _validate(args: argparse.Namespace, variant: Variant, draft: str | None) -> None:
    """The checks `tandem serve` makes at start-up, made now so a typo costs no loading time."""
    from ..cli import engine_config, spec_config

    engine_config(args)
    spec_config(_spec_namespace(args, variant, draft))


def _spec_namespace(args: argparse.Namespace, variant: Variant, draft: str | None):
    """The flags of one configuration; a sweep's n-max lowers --spec-draft-n-min to fit."""
    n_max, n_min = args.spec_draft_n_max, args.spec_draft_n_min
    if variant.n_max is not None:
        n_max, n_min = variant.n_max, min(n_min, variant.n_max)
    return argparse.Namespace(**{
        **vars(args), "spec_type": variant.spec_type,
        "model_draft": draft if variant.uses_draft else None,
        "spec_draft_n_max": n_max, "spec_draft_n_min": n_min,
    })


def llama_variants(plan: Plan) -> list[Variant]:
    """llama.cpp's configurations for --llama-server (draft-simple only with a draft)."""
    if plan.args.llama_server is None:
        return []
    return [v for v in LLAMA if plan.draft is not None or not v.uses_draft]


def check_llama_server(path: str, target: str, draft: str | None) -> None:
    """--llama-server must be an executable, and the models GGUF files (llama.cpp reads no
    safetensors folder)."""
    from ..registry import resolve

    exe = Path(path)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise TandemError(f"--llama-server {path!r} is not an executable file")
    for flag, model in (("--model", target), ("--model-draft", draft)):
        if model is not None and resolve(model, quiet=True).is_dir():
            raise TandemError(f"--llama-server needs GGUF files; {flag} {model} is a folder")


def find_client(path: str | None) -> Path:
    """--client, or scripts/speculative-benchmark.py of the source tree tandem is imported from."""
    import tandem

    client = Path(path) if path else Path(tandem.__file__).resolve().parents[2] / CLIENT
    if not client.is_file():
        how = "pass --client PATH" if path else (
            "tandem bench needs the source tree (pip install -e .), or pass --client "
            "PATH/TO/scripts/speculative-benchmark.py")
        raise TandemError(f"the benchmark client {str(client)!r} does not exist; {how}")
    return client


def check_prompts(client: Path, args: argparse.Namespace) -> None:
    """Read --prompts with the client's own reader, so a bad file fails before any loading."""
    spec = importlib.util.spec_from_file_location("tandem_bench_client", client)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.load_tasks(args.prompts, args.n_predict)
    except module.BenchError as e:
        raise TandemError(str(e)) from None


def make_out_dir(path: str | None) -> Path:
    """A new (or empty) folder, so results committed under bench/ are never overwritten."""
    out = Path(path) if path else Path("bench", "results", datetime.now().strftime("%Y%m%d-%H%M%S"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TandemError(f"--out-dir {str(out)!r} exists and is not an empty folder; pick a new "
                          "one, so earlier results are kept")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TandemError(f"cannot create --out-dir {str(out)!r}: {e.strerror or e}") from None
    return out


def _header(command: str) -> list[str]:
    lines = [f"# {datetime.now().astimezone().isoformat(timespec='seconds')}, cwd {Path.cwd()}",
             command]
    commit = _git_commit()
    if commit:
        lines.insert(1, f"# source: {commit}")
    return lines


def _git_commit() -> str | None:
    import tandem

    root = Path(tandem.__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src",
                                "scripts"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"git {sha}{' with uncommitted changes' if dirty.strip() else ''}" if sha else None


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM unwinds like Ctrl-C, so the finally blocks stop the servers."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


# ---- one server, one client run --------------------------------------------------------------


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
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
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
            if self._health() == 200:
                self._echo()
                return time.monotonic() - start
            time.sleep(0.25)
        raise TandemError(f"the server was not ready after --load-timeout {timeout:g} s; its "
                          f"last lines:\n{self.tail()}")

    def _health(self) -> int | None:
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
    """llama-server on the same files, threads and context; speculation at llama.cpp's own
    defaults (what its users get), one slot."""
    from ..registry import resolve

    a = plan.args
    cmd = [a.llama_server, "--model", resolve(plan.target, quiet=True), "--threads", a.threads,
           "--ctx-size", a.ctx_size, "--parallel", 1, "--host", HOST, "--port", port,
           "--spec-type", variant.spec_type]
    if variant.uses_draft:
        cmd += ["--model-draft", resolve(plan.draft, quiet=True)]
    return [str(c) for c in cmd]


def serve_command(plan: Plan, variant: Variant, port: int) -> list[str]:
    if variant.engine != "tandem":
        return llama_command(plan, variant, port)
    a = _spec_namespace(plan.args, variant, plan.draft)
    cmd = [*SERVE, "--model", plan.target]
    if a.model_draft:
        cmd += ["--model-draft", a.model_draft]
    cmd += ["--spec-type", variant.spec_type]
    if variant.uses_draft:
        cmd += ["--spec-draft-n-max", a.spec_draft_n_max, "--spec-draft-n-min",
                a.spec_draft_n_min, "--spec-draft-p-min", a.spec_draft_p_min,
                "--spec-draft-window", a.spec_draft_window,
                "--spec-draft-vocab", a.spec_draft_vocab]
    if "ngram-simple" in variant.spec_type.split(","):
        cmd += ["--spec-ngram-size-n", a.spec_ngram_size_n, "--spec-ngram-min-n",
                a.spec_ngram_min_n, "--spec-ngram-size-m", a.spec_ngram_size_m]
    cmd += ["--ctx-size", a.ctx_size, "--threads", a.threads, "--dtype", a.dtype, "--weights",
            a.weights, "--activations", a.activations, "--activations-draft",
            a.activations_draft, "--parallel", 1, "--host", HOST,
            "--port", port]
    return [str(c) for c in cmd]


def client_command(plan: Plan, label: str, output: Path, url: str, passes: int | None = None,
                   warmup: int | None = None) -> list[str]:
    a = plan.args
    passes = a.passes if passes is None else passes
    warmup = a.warmup if warmup is None else warmup
    cmd = [sys.executable, "-I", str(plan.client),  # isolated: standard library only
           "--label", label, "--output", str(output),
           "--url", url, "--passes", str(passes), "--warmup", str(warmup),
           "--n-predict", str(a.n_predict)]
    return cmd + (["--prompts", a.prompts] if a.prompts else [])


def measure_interleaved(plan: Plan, todo: list[Variant]) -> list[Path]:
    """Serve every configuration at once and measure them pass by pass, taking turns (ABBA:
    the order flips every pass), so that a neighbour slowing this shared machine for a while
    slows them alike. Only one server works at a time; the others wait idle. Each pass is one
    client run with --passes 1; the passes are then merged into one client file per
    configuration, numbered 0, 1, ... as the client numbers them."""
    a = plan.args
    n = len(todo)
    with contextlib.ExitStack() as stack:
        servers = []
        for i, variant in enumerate(todo, start=1):
            label = variant.label(a.spec_draft_n_max if variant.n_max is None else variant.n_max)
            port = a.port + i - 1 if a.port else free_port()
            command = serve_command(plan, variant, port)
            log_path = plan.out_dir / f"{variant.name}.server.log"
            _say(f"[{i}/{n}] {variant.name} ({label}): starting the server, log in {log_path}")
            plan.note(f"# {variant.name}: server\n{shlex.join(command)}")
            server = stack.enter_context(Server(command, port, log_path))
            seconds = server.wait_ready(a.load_timeout)
            _say(f"[{i}/{n}] {variant.name}: ready after {seconds:.1f} s")
            servers.append((variant, label, server))
        parts: dict[str, list[Path]] = {v.name: [] for v in todo}
        for r in range(a.passes):
            order = servers if r % 2 == 0 else servers[::-1]
            for variant, label, server in order:
                _say(f"pass {r + 1}/{a.passes}: {variant.name}")
                out = plan.out_dir / f"{variant.name}.pass{r}.json"
                client = client_command(plan, label, out, server.url, passes=1,
                                        warmup=a.warmup if r == 0 else 0)
                plan.note(f"# {variant.name}: client, pass {r + 1}\n{shlex.join(client)}")
                run_client(client, server)
                parts[variant.name].append(out)
    paths = []
    for variant in todo:
        path = plan.out_dir / f"{variant.name}.json"
        merge_passes(parts[variant.name], path)
        paths.append(path)
    return paths


def merge_passes(files: list[Path], out: Path) -> None:
    """One client file from per-pass client files: the first file's header and warm-up, every
    file's requests with "pass" set to the file's index; the per-pass files are removed."""
    merged = json.loads(files[0].read_text(encoding="utf-8"))
    merged["requests"] = []
    for r, f in enumerate(files):
        data = json.loads(f.read_text(encoding="utf-8"))
        merged["requests"] += [dict(q, **{"pass": r}) for q in data["requests"]]
    if isinstance(merged.get("settings"), dict):
        merged["settings"]["passes"] = len(files)
    out.write_text(json.dumps(merged, indent=1, ensure_ascii=False), encoding="utf-8")
    for f in files:
        f.unlink()


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


def _say(message: str) -> None:
    print(f"tandem bench: {message}", file=sys.stderr, flush=True)


# ---- the two modes ---------------------------------------------------------------------------


def run_pair(plan: Plan) -> int:
    """Baseline, then the one candidate; prints compare's table and writes the report."""
    (variant,) = plan.variants
    llama = llama_variants(plan)
    base_path, cand_path, *llama_paths = measure_interleaved(plan, [BASELINE, variant, *llama])
    base = compare.load_run(str(base_path), "baseline")
    cand = compare.load_run(str(cand_path), "candidate")
    results = compare.compare_runs(base, cand)
    sys.stdout.write(compare.render_text(base, cand, results))
    out = plan.out_dir
    markdown = _made_by(plan) + compare.render_markdown(base, cand, results)
    if llama:
        rows = side_by_side([("baseline", base), ("candidate", cand),
                             *_load_runs(llama, llama_paths)])
        markdown += "\n" + side_by_side_markdown(rows)
    (out / "report.md").write_text(markdown, encoding="utf-8")
    report = compare.to_json(base, cand, results)
    if llama:
        report["llama_cpp"] = rows
    report = json.dumps(report, indent=1) + "\n"
    (out / "report.json").write_text(report, encoding="utf-8")
    compare.write_plot(str(out / "speedup.png"), base, cand, results)
    return _verdict(all(r.equal_work for r in results), out / "report.md")


def run_sweep(plan: Plan) -> int:
    """The baseline and every sweep configuration, served at once and measured in turns;
    prints and writes the ranking."""
    todo = plan.variants
    llama = llama_variants(plan)
    base_path, *paths = measure_interleaved(plan, [BASELINE, *todo, *llama])
    paths, llama_paths = paths[:len(todo)], paths[len(todo):]
    base = compare.load_run(str(base_path), "baseline")
    entries = []
    for variant, path in zip(todo, paths):
        cand = compare.load_run(str(path), variant.name)
        entries.append((variant, cand, compare.compare_runs(base, cand)))
        _say(f"{variant.name}: {_summary(entries[-1][2])}")
    rows = ranking(entries)
    sys.stdout.write(render_ranking(rows))
    markdown = _made_by(plan) + ranking_markdown(rows, base, entries)
    if llama:
        side = side_by_side([("baseline", base), *((v.name, cand) for v, cand, _ in entries),
                             *_load_runs(llama, llama_paths)])
        markdown += "\n" + side_by_side_markdown(side)
    (plan.out_dir / "report.md").write_text(markdown, encoding="utf-8")
    report = {"baseline": {"label": base.label, "file": Path(base.path).name},
              "configurations": rows}
    if llama:
        report["llama_cpp"] = side
    (plan.out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n",
                                              encoding="utf-8")
    return _verdict(all(r["equal_work"] for r in rows), plan.out_dir / "report.md")


def _load_runs(variants: list[Variant], paths: list[Path]) -> list[tuple[str, compare.Run]]:
    return [(v.name, compare.load_run(str(p), v.name)) for v, p in zip(variants, paths)]


def _made_by(plan: Plan) -> str:
    """The report's first line: the command that made it, so committed results carry it."""
    return f"Made by `{plan.command}` (every server and client command: command.txt).\n\n"


def _verdict(equal: bool, report: Path) -> int:
    if equal:
        _say(f"results in {report.parent}")
        return 0
    _say(f"WARNING: some output differs from the baseline's (greedy speculation must not change "
         f"it); those tasks are not comparable, see {report}")
    return EXIT_NOT_EQUAL


def _summary(results: list[compare.TaskResult]) -> str:
    overall = results[-1]
    if not all(r.equal_work for r in results[:-1]) or overall.speedup is None:
        return "not comparable (output differs from the baseline's)"
    return f"{overall.speedup:.2f}x median wall-time speed-up over a pass"


def ranking(entries: list[tuple[Variant, compare.Run, list[compare.TaskResult]]]) -> list[dict]:
    """One row per configuration; those that did equal work ranked by overall speed-up.

    A configuration is comparable only when every task did equal work: a speed-up over the
    tasks that happened to match would hide that speculation changed the answer.
    """
    rows = []
    for variant, cand, results in entries:
        *tasks, overall = results
        equal = all(r.equal_work for r in tasks) and overall.speedup is not None
        side = overall.candidate
        rows.append({
            "rank": None, "name": variant.name, "label": cand.label, "file": Path(cand.path).name,
            "spec_type": variant.spec_type, "equal_work": equal,
            "speedup": overall.speedup if equal else None,
            "speedup_range": overall.speedup_range if equal else None,
            "decode_speedup": overall.arithmetic.speedup if equal and overall.arithmetic else None,
            "acceptance_rate": side.acceptance_rate if side else None,
            "mean_acceptance_length": side.mean_acceptance_length if side else None,
            "tokens_per_second": side.tokens_per_second.median if side else None,
            "reasons": [f"{r.task}: {reason}" for r in tasks for reason in r.reasons],
        })
    ranked = sorted((r for r in rows if r["equal_work"]), key=lambda r: -r["speedup"])
    for rank, row in enumerate(ranked, start=1):
        row["rank"] = rank
    return ranked + [r for r in rows if not r["equal_work"]]


RANK_HEADER = ["rank", "configuration", "speed-up (range)", "decode arithmetic", "acceptance",
               "tok/s"]


def _rank_cells(row: dict) -> list[str]:
    def num(x, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    if row["equal_work"]:
        lo, hi = row["speedup_range"] or (row["speedup"], row["speedup"])
        speed = f"{row['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"
    else:
        speed = "not comparable"
    return [str(row["rank"] or "-"), row["label"], speed, num(row["decode_speedup"], ".2f"),
            num(row["acceptance_rate"], ".1%"), num(row["tokens_per_second"], ".1f")]


def render_ranking(rows: list[dict]) -> str:
    table = [RANK_HEADER, *(_rank_cells(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(RANK_HEADER))]
    lines = ["speed-up: baseline / configuration median wall seconds of a whole pass", ""]
    lines += ["  ".join(c.ljust(w) if i == 1 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))) for row in table]
    lines += [f"{r['label']}: not comparable: {'; '.join(r['reasons'])}"
              for r in rows if not r["equal_work"]]
    return "\n".join(lines) + "\n"


def ranking_markdown(rows: list[dict], base: compare.Run, entries) -> str:
    lines = ["# Speculation sweep", "",
             f"Against baseline `{base.label}` ({Path(base.path).name}). Speed-up: baseline / "
             "configuration median wall seconds of a whole pass, range over passes; "
             "configurations whose output differs from the baseline's are not ranked.", "",
             "| " + " | ".join(RANK_HEADER) + " |", "|" + "---|" * len(RANK_HEADER)]
    lines += ["| " + " | ".join(_rank_cells(r)) + " |" for r in rows]
    lines += [f"- {r['label']}: not comparable: {'; '.join(r['reasons'])}"
              for r in rows if not r["equal_work"]]
    for variant, cand, results in entries:
        lines += ["", f"## {cand.label} ({Path(cand.path).name})", "",
                  compare.render_markdown(base, cand, results).rstrip()]
    return "\n".join(lines) + "\n"


# ---- llama.cpp side by side -------------------------------------------------------------------


def side_by_side(runs: list[tuple[str, compare.Run]]) -> list[dict]:
    """Every run's figures over the tasks and passes all runs have, against the llama-none run
    (llama.cpp's target alone): wall seconds of a whole pass (median, range), the ratio of
    llama.cpp's median to this run's (with the per-pass range), decode tokens/s over the pass,
    acceptance, and on how many tasks the text equals llama.cpp's and Tandem's baseline's.

    Across engines the text can differ (other float arithmetic), so these are speeds on the
    same prompts and token budget, not an equal-work check; `tokens` says how much each
    generated per pass."""
    ref = dict(runs)["llama-none"]
    own = runs[0][1]  # Tandem's target alone
    tasks = [t for t in ref.samples if all(t in r.samples for _, r in runs)]
    passes = set.intersection(
        *({s.pass_index for s in r.samples[t]} for _, r in runs for t in tasks)) if tasks else set()
    if not tasks or not passes:
        return []
    ref_walls = [s.wall_s for s in compare._pass_totals(ref, tasks, passes)]
    rows = []
    for name, run in runs:
        totals = compare._pass_totals(run, tasks, passes)
        walls = [s.wall_s for s in totals]
        speedup, span = compare.speedup_of(ref_walls, walls, list(zip(ref_walls, walls)))
        stats = compare.side_stats(totals)

        # prompt tokens/s of each pass whose requests all report their prompt time
        prompt = [1000 * s.prompt_n / s.prompt_ms for s in totals
                  if s.prompt_ms and s.prompt_n is not None]

        def same_text(other: compare.Run) -> int:
            return sum({s.content for s in run.samples[t]} == {s.content for s in other.samples[t]}
                       for t in tasks)

        rows.append({
            "name": name, "label": run.label, "file": Path(run.path).name,
            "wall_s": asdict(compare.Spread.of(walls)), "vs_llama_alone": speedup, "range": span,
            "decode_tokens_per_second": stats.tokens_per_second.median,
            "prompt_tokens_per_second": statistics.median(prompt) if prompt else None,
            "tokens": stats.tokens_predicted, "acceptance_rate": stats.acceptance_rate,
            "same_text_as_llama": same_text(ref), "same_text_as_tandem": same_text(own),
            "tasks": len(tasks),
        })
    return rows


def side_by_side_markdown(rows: list[dict]) -> str:
    """report.md's section for side_by_side's rows."""
    lines = ["## llama.cpp on the same client", "",
             "The same benchmark client, prompts and token budget against llama.cpp's "
             "llama-server on the same GGUF files, threads and context, measured in the same "
             "turns. `vs llama.cpp alone`: llama.cpp target-alone median wall seconds of a "
             "pass / this configuration's (range over passes). Decode tok/s: tokens / decode "
             "time over a pass; prompt tok/s likewise. The engines round differently, so their texts may differ: the "
             "last columns count the tasks whose text is identical.", ""]
    if not rows:
        return "\n".join(lines + ["(no task and pass measured by every configuration)"]) + "\n"
    lines += ["| configuration | wall s per pass, median (range) | vs llama.cpp alone (range) "
              "| prompt tok/s | decode tok/s | tokens | acceptance | same text as llama.cpp | "
              "same text as Tandem alone |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w, span = r["wall_s"], r["range"] or (r["vs_llama_alone"], r["vs_llama_alone"])
        w = compare.Spread(**w)
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.1%}"
        pp = r["prompt_tokens_per_second"]
        pp = "-" if pp is None else f"{pp:.1f}"
        lines.append(
            f"| {r['label']} ({r['file']}) | {w.median:.2f} ({w.min:.2f}-{w.max:.2f}) | "
            f"{r['vs_llama_alone']:.2f}x ({span[0]:.2f}-{span[1]:.2f}) | {pp} | "
            f"{r['decode_tokens_per_second']:.1f} | {r['tokens']:g} | {acc} | "
            f"{r['same_text_as_llama']}/{r['tasks']} | {r['same_text_as_tandem']}/{r['tasks']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
