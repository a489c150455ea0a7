"""Speculation's speed at a known acceptance, Tandem and llama.cpp side by side.

Both servers take llama-server's --spec-synth-len L: drafted tokens are kept at random so that
a step yields L tokens on average (the target's own token included), whatever the target says.
The output is then not valid, but the work is real: the draft model drafts n-max tokens per
step (p-min 0, n-min 0, so every draft is full), the target verifies n-max + 1 rows. So the
decode speed at each L measures each engine's machinery, drafting plus verification, apart
from how well any proposer guesses; L = 1 (nothing kept) is its pure cost. Each engine's
speed-up is over its own target alone, measured in the same round; configurations run in turns
(every round starts each server once, ABBA order between the engines), requests with
ignore_eos so every one generates exactly --n-predict tokens.

    python experiments/synthetic_acceptance.py --llama-server .../llama-server \\
        --lengths 1,2,3,4,5 --n-max 4 --rounds 3 --out bench/results/synthetic-acceptance
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import ROOT, cpu_line, free_port, post, serving

sys.path.insert(0, str(ROOT / "src"))
from tandem.registry import resolve  # noqa: E402

PROMPTS = ROOT / "bench" / "prompts" / "held-out-mix.jsonl"


def command(engine: str, length: float | None, a: argparse.Namespace, port: int) -> list[str]:
    target, draft = str(resolve(a.model, quiet=True)), str(resolve(a.model_draft, quiet=True))
    spec = [] if length is None else [
        "--model-draft", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(a.n_max),
        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "--spec-synth-len", f"{length:g}"]
    if engine == "tandem":
        return [a.tandem, "serve", "-m", target, "--threads", str(a.threads), "--ctx-size",
                str(a.ctx_size), "--port", str(port), "--host", "127.0.0.1",
                *(spec or ["--spec-type", "none"])]
    return [a.llama_server, "--model", target, "--threads", str(a.threads), "--ctx-size",
            str(a.ctx_size), "--port", str(port), "--host", "127.0.0.1",
            *(spec or ["--spec-type", "none"])]


def run_config(engine: str, length: float | None, tasks: list[dict], a: argparse.Namespace,
               log_dir: Path, rnd: int) -> list[dict]:
    port = free_port()
    cmd = command(engine, length, a, port)
    name = f"{engine}-{'alone' if length is None else f'L{length:g}'}"
    with serving(cmd, port, log_dir / f"{name}.log") as url:
        out = []
        for i, task in enumerate(tasks):
            t0 = time.perf_counter()
            # the seed draws the synthetic decisions: a new one per task and round, the
            # same for both engines (each draws with its own generator)
            res = post(url + "/completion", {
                "prompt": task["prompt"], "n_predict": a.n_predict, "temperature": 0.0,
                "ignore_eos": True, "cache_prompt": False, "seed": 1000 * rnd + i + 1})
            wall = time.perf_counter() - t0
            t = res["timings"]
            out.append({"task": task["task"], "wall_s": wall,
                        "predicted_n": t["predicted_n"], "predicted_ms": t["predicted_ms"],
                        "prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"],
                        "draft_n": t.get("draft_n", 0),
                        "draft_n_accepted": t.get("draft_n_accepted", 0)})
            if t["predicted_n"] != a.n_predict:
                raise RuntimeError(f"{name} {task['task']}: {t['predicted_n']} tokens")
        return out


def summary(records: list[dict]) -> dict:
    n = sum(r["predicted_n"] for r in records)
    ms = sum(r["predicted_ms"] for r in records)
    drafted = sum(r["draft_n"] for r in records)
    kept = sum(r["draft_n_accepted"] for r in records)
    # a step emits its kept tokens and one of the target's: steps = tokens - kept
    return {"decode_tok_s": 1e3 * n / ms, "tokens": n, "drafted": drafted, "kept": kept,
            "per_step": n / max(n - kept, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--tandem", default=str(Path(sys.executable).with_name("tandem")))
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("-md", "--model-draft", default="default-draft")
    ap.add_argument("--lengths", default="1,2,3,4,5", help="mean tokens per step (synth-len)")
    ap.add_argument("--n-max", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=4096)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--tasks", default="summarization-242,qa-322,mt-bench-writing,stdlib-edit-relpath",
                    help="comma-separated task names of --prompts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-only", action="store_true",
                    help="write the table from --out's results.json (the rounds done so far)")
    a = ap.parse_args()
    lengths = [float(x) for x in a.lengths.split(",")]
    want = a.tasks.split(",")
    tasks = [t for t in map(json.loads, open(a.prompts, encoding="utf-8")) if t["task"] in want]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [None, *lengths]
    results: dict[str, list] = {}
    if a.table_only:
        results = json.load(open(out / "results.json", encoding="utf-8"))["results"]
        n = min(len(v) for v in results.values())
        results = {k: v[:n] for k, v in results.items()}
        a.rounds = n
    for rnd in range(0 if a.table_only else a.rounds):
        engines = ["tandem", "llama.cpp"] if rnd % 2 == 0 else ["llama.cpp", "tandem"]
        for length in configs:
            for engine in engines:
                key = f"{engine} {'alone' if length is None else f'L={length:g}'}"
                recs = run_config(engine, length, tasks, a, out, rnd)
                results.setdefault(key, []).append(recs)
                s = summary(recs)
                print(f"round {rnd + 1} {key}: {s['decode_tok_s']:.2f} tok/s, "
                      f"{s['kept']}/{s['drafted']} kept", file=sys.stderr, flush=True)
        json.dump({"cpu": cpu_line(), "args": vars(a), "results": results},
                  open(out / "results.json", "w", encoding="utf-8"), indent=1)
    argv = [w for w in sys.argv[1:] if w != "--table-only"]
    lines = [f"CPU: {cpu_line()}", "",
             f"`python experiments/synthetic_acceptance.py {' '.join(argv)}`", "",
             f"n-max {a.n_max} (every draft full: p-min 0), {a.n_predict} tokens per request "
             f"(ignore_eos), tasks {a.tasks}, {a.rounds} rounds. Decode tok/s from the servers' "
             "timings (predicted_n / predicted_ms) summed over the tasks of a round; speed-up "
             "over the same engine's target alone in the same round, median (range).", "",
             "| L (tokens per step) | Tandem tok/s | Tandem speed-up | kept/drafted, "
             "tokens per step | llama.cpp tok/s | llama.cpp speed-up | kept/drafted, "
             "tokens per step |", "|---|---|---|---|---|---|---|"]
    for length in configs:
        row = ["alone" if length is None else f"{length:g}"]
        for engine in ("tandem", "llama.cpp"):
            key = f"{engine} {'alone' if length is None else f'L={length:g}'}"
            runs = [summary(r) for r in results[key]]
            alone = [summary(r) for r in results[f"{engine} alone"]]
            speeds = [r["decode_tok_s"] for r in runs]
            ratios = [r["decode_tok_s"] / b["decode_tok_s"] for r, b in zip(runs, alone)]
            row += [f"{statistics.median(speeds):.2f}",
                    f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                    f"{sum(r['kept'] for r in runs)}/{sum(r['drafted'] for r in runs)}, "
                    f"{statistics.median(r['per_step'] for r in runs):.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
