"""Issue 59's goal "a request for a model that is not loaded answers within its load time plus
its generation", measured: in each round, in turns (the order alternating),

  single:  after IDLE seconds of an idle machine, `tandem serve --model M` started, /health
           polled every 20 ms until 200 (its load time), then one greedy /completion (its
           generation); the sum is the bar;
  router:  `tandem serve --models-dir D` (D holding only M) up and idle IDLE seconds, then
           the same /completion naming the model: the router plans its memory, starts the
           child, waits for it and forwards the request.

Prints each round, the medians (ranges) and router / (load + generation); the texts must be
equal (greedy).

    python experiments/router_cold.py --rounds 5 [--model PATH] [--threads 2] [--n-predict 64]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import command_line, cpu_line, free_port, post, serving, spread

PROMPT = "def quicksort(xs):"
# seconds of an idle machine before each timed start, the same for both: after an idle spell
# this VM's first weight layout runs slower (measured: 2.0 s after 6 s idle, 1.5 s after 1 s,
# 1.2 s right after another process's work), so both sides start from the same state
IDLE = 2.0


def _healthy_after(url: str, proc: subprocess.Popen, t0: float) -> float:
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"server exited with {proc.returncode}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def single(a, body: dict, log) -> tuple[float, float, str]:
    port = free_port()
    time.sleep(IDLE)  # the machine idle as long as the router's before its request
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "serve", "--model", a.model,
                             "--threads", str(a.threads), "--port", str(port), "--no-ui"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        load = _healthy_after(f"http://127.0.0.1:{port}", proc, t0)
        t1 = time.perf_counter()
        text = post(f"http://127.0.0.1:{port}/completion", body)["content"]
        return load, time.perf_counter() - t1, text
    finally:
        _stop(proc)


def router(a, body: dict, models_dir: Path) -> tuple[float, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tandem.cli", "serve", "--models-dir", str(models_dir),
           "--threads", str(a.threads), "--port", str(port)]
    with serving(cmd, port, Path(a.log)) as url:
        time.sleep(IDLE)  # idle, as a router is when a request arrives
        t0 = time.perf_counter()
        out = post(f"{url}/completion", dict(body, model=Path(a.model).stem))
        return time.perf_counter() - t0, out["content"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: the default target)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--log", default="/tmp/router_cold.log")
    a = ap.parse_args()
    if a.model is None:
        from tandem.registry import resolve

        a.model = str(resolve("default"))
    body = {"prompt": PROMPT, "n_predict": a.n_predict, "temperature": 0, "cache_prompt": False}
    print(f"# {command_line()}\n# {cpu_line()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, open(a.log, "a", encoding="utf-8") as log:
        (Path(tmp) / Path(a.model).name).symlink_to(Path(a.model).resolve())
        for r in range(a.rounds):
            for which in (("single", "router") if r % 2 == 0 else ("router", "single")):
                if which == "single":
                    load, gen, text_s = single(a, body, log)
                else:
                    cold, text_r = router(a, body, Path(tmp))
            rows.append((load, gen, cold, text_s == text_r))
            print(f"round {r}: single load {load:.2f} s + answer {gen:.2f} s = {load + gen:.2f} s;"
                  f" router {cold:.2f} s ({cold / (load + gen):.2f}x); same text: {rows[-1][3]}",
                  flush=True)
    bar = [l + g for l, g, _, _ in rows]
    cold = [c for _, _, c, _ in rows]
    print(f"single load {spread([l for l, _, _, _ in rows])} s, answer "
          f"{spread([g for _, g, _, _ in rows])} s, sum {spread(bar)} s")
    print(f"router {spread(cold)} s; router / sum {spread([c / b for c, b in zip(cold, bar)])}"
          f" (median of sums: {statistics.median(cold) / statistics.median(bar):.2f}x); "
          f"same text {sum(r[3] for r in rows)}/{len(rows)}")


if __name__ == "__main__":
    main()
