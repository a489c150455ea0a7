"""What several experiment scripts need, written once: the repository root, the CPU line every
report names, a busy neighbour, a git revision's sources, the command line as run, a median
with its range, and a local server's port, health, JSON answers and lifetime (`serving`).

Standard library only, so that the stdlib-only scripts (aa_noise.py, synthetic_acceptance.py)
stay so. The scripts run as `python experiments/NAME.py`, which puts this folder first on
sys.path: `from common import ...` needs nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the flags a report names: the kernels' builds read these (kernels.VARIANTS), AMX for the prototype
SIMD = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "avx512_vbmi", "avx_vnni", "amx_int8")


def cpu_line() -> str:
    """'MODEL; N CPUs; flags...': the CPU a result was measured on, as every report names it."""
    model, flags = "", set()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return (f"{model or platform.processor() or 'unknown'}; {os.cpu_count()} CPUs; "
            + " ".join(f for f in SIMD if f in flags))


def command_line() -> str:
    """This process's command line as a user would type it again."""
    return "python " + shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def busy(seconds: float = float("inf")) -> None:
    """Spin on one CPU, as a neighbour on a shared machine would (run it in a Process)."""
    end = time.time() + seconds
    while time.time() < end:
        pass


def export_rev(rev: str, dest: Path, path: str = "src") -> Path:
    """Git revision REV's `path` (a folder of this repository) extracted under dest; returns
    dest / path."""
    archive = dest / "rev.tar"
    subprocess.run(["git", "archive", "-o", str(archive), rev, path], cwd=ROOT, check=True)
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    archive.unlink()
    return dest / path


def short_rev(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def spread(xs: list[float], digits: int = 2) -> str:
    """'median (min-max)', the form every report uses."""
    f = f"{{:.{digits}f}}"
    return f"{f.format(statistics.median(xs))} ({f.format(min(xs))}-{f.format(max(xs))})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 600, headers: dict | None = None) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 300) -> None:
    """Until GET url/health answers 200; raises if proc exits first or timeout passes."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout:.0f} s")


@contextlib.contextmanager
def serving(cmd: list[str], port: int, log: Path):
    """The server `cmd` started (its command line and output appended to the file log) and
    healthy on 127.0.0.1:port: yields its URL; stopped on leaving."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
