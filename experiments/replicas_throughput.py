"""Two replicas of one thread against one server of two threads (issue 58's goal: 2 x 1 >= 1.0x
the throughput of 1 x 2 at concurrency 4), measured in turns (ABBA...), each layout a fresh
server: `tandem serve --threads 2 --parallel C` and `tandem serve --replicas 2 --threads 1
--parallel C/2`, the same requests (prompts of bench/prompts/held-out-mix.jsonl, greedy, a
fixed number of tokens each), C at a time, closed loop.

    python experiments/replicas_throughput.py --out OUT   (bench/results/cluster-sim has one run)
    python experiments/replicas_throughput.py --model m.gguf --requests 8 --n-predict 32 \\
        --rounds 1 --prompt-chars 100 --serve-args "--ctx-size 2048"   (a quick look)

Throughput is generated tokens over the wall time of the whole batch; TTFT is not measured
here (experiments/cluster_sim.py simulates it). Writes results.json and report.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import ROOT, command_line, cpu_line, free_port, post, serving, spread

PROMPTS = ROOT / "bench" / "prompts" / "held-out-mix.jsonl"


def layouts(model: str, concurrency: int, extra: list[str]) -> dict[str, list[str]]:
    base = [sys.executable, "-m", "tandem.cli", "serve", "-m", model, "--host", "127.0.0.1",
            *extra]
    return {"1x2": [*base, "--threads", "2", "--parallel", str(concurrency)],
            "2x1": [*base, "--replicas", "2", "--threads", "1",
                    "--parallel", str(max(1, concurrency // 2))]}


def run_batch(url: str, prompts: list[str], n_predict: int, concurrency: int) -> dict:
    body = {"n_predict": n_predict, "ignore_eos": True, "temperature": 0.0, "top_k": 1}

    def one(prompt: str) -> int:
        return post(f"{url}/completion", {**body, "prompt": prompt})["tokens_predicted"]

    one(prompts[0])  # warm: the first request's costs (the tokenizer, the first pass) are not
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, prompts))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": wall, "tokens_per_second": tokens / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each layout twice)")
    p.add_argument("--serve-args", default="", help="more flags for both layouts")
    p.add_argument("--prompt-chars", type=int, default=0,
                   help="cut each prompt to its first N characters (0: whole)")
    p.add_argument("--out", type=Path, default=Path("/tmp/replicas-throughput"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    prompts = [r["prompt"] for r in rows][:a.requests]
    prompts += prompts * (a.requests // max(1, len(prompts)))  # repeats, if the file is short
    prompts = [q[:a.prompt_chars] if a.prompt_chars else q for q in prompts[:a.requests]]
    cmds = layouts(a.model, a.concurrency, shlex.split(a.serve_args))
    order = [name for _ in range(a.rounds) for name in ("1x2", "2x1", "2x1", "1x2")]
    results: dict[str, list[dict]] = {name: [] for name in cmds}
    for name in order:
        port = free_port()
        with serving([*cmds[name], "--port", str(port)], port, a.out / "servers.log") as url:
            r = run_batch(url, prompts, a.n_predict, a.concurrency)
        results[name].append(r)
        print(f"{name}: {r['tokens_per_second']:.1f} tokens/s", flush=True)
    rate = {n: [r["tokens_per_second"] for r in rs] for n, rs in results.items()}
    ratio = statistics.median(rate["2x1"]) / statistics.median(rate["1x2"])
    (a.out / "results.json").write_text(json.dumps(
        {"command": command_line(), "cpu": cpu_line(), "results": results}, indent=1))
    report = [f"# 2 replicas x 1 thread against 1 x 2 threads, concurrency {a.concurrency}", "",
              f"`{command_line()}`", "", f"CPU: {cpu_line()}", "",
              "| layout | tokens/s, median (range) |", "|---|---|",
              *(f"| {n} | {spread(v, 1)} |" for n, v in rate.items()), "",
              f"2x1 / 1x2 = {ratio:.2f}"]
    (a.out / "report.md").write_text("\n".join(report) + "\n")
    print("\n".join(report))


if __name__ == "__main__":
    main()
