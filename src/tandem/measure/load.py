"""`tandem bench --load`: the same servers under concurrent, streamed requests.

    tandem bench --load -np 2 --concurrency 1,2 --passes 2 --out-dir bench/results/load-x

Every configuration (Tandem alone, the candidate, and with --llama-server llama.cpp's target
alone and its --llama-spec-types, all with the same --parallel) is served at once. For each pass
and each concurrency level the benchmark client runs once against each server in turns (the
order flips every turn), streamed, with that many requests in flight (`--stream
--concurrency N`): every task once. Per level and configuration the report gives the output
tokens per second over the runs (total tokens over the runs' total time), that against Tandem
alone at the same level, and p50/p99 of time to first token, of the mean and of the largest gap
between streamed events, and of the end-to-end time; and whether every text equals its own
engine's target alone (greedy: speculation and batching must not change it).

Files: load-c{N}-{configuration}.json (the client's, passes merged, each run's summary under
"load_runs"), load.md and load.json (the table), command.txt, the servers' logs.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np

from . import servers
from .plan import BASELINE, Plan, concurrency_levels, say

EXIT_NOT_EQUAL = 1


def run_load(plan: Plan) -> int:
    """Measure every configuration at every level; 0, or 1 when a Tandem configuration's text
    differed from Tandem alone's (everything is still written)."""
    a = plan.args
    levels = concurrency_levels(a.concurrency)
    todo = [BASELINE, *plan.variants, *plan.llama_variants()]
    parts: dict[tuple[int, str], list[tuple[int, Path]]] = {
        (c, v.name): [] for c in levels for v in todo}
    turn = 0
    with servers.serving(plan, todo) as running:
        for r in range(a.passes):
            for c in levels:
                order = running if turn % 2 == 0 else running[::-1]
                turn += 1
                for variant, label, server in order:
                    say(f"pass {r + 1}/{a.passes}, concurrency {c}: {variant.name}")
                    out = plan.out_dir / f"load-c{c}-{variant.name}.pass{r}.json"
                    first = r == 0 and c == levels[0]
                    client = servers.client_command(
                        plan, label, out, server.url, passes=1, warmup=a.warmup if first else 0,
                        extra=("--stream", "--concurrency", str(c)))
                    plan.note(f"# {variant.name}: client, pass {r + 1}, concurrency {c}\n"
                              f"{shlex.join(client)}")
                    servers.run_client(client, server)
                    parts[(c, variant.name)].append((r, out))
    for c in levels:
        for variant in todo:
            servers.merge_passes(parts[(c, variant.name)],
                                 plan.out_dir / f"load-c{c}-{variant.name}.json")
    rows = report(plan.out_dir, levels, [(v.name, v.engine) for v in todo], a.n_parallel,
                  plan.command)
    unequal = [r for r in rows if r["engine"] == "tandem" and not r["equal_text"]]
    if unequal:
        say("WARNING: some Tandem output differs from Tandem alone's (greedy; see load.md)")
        return EXIT_NOT_EQUAL
    say(f"results in {plan.out_dir}")
    return 0


def report(out_dir: Path, levels: list[int], configurations: list[tuple[str, str]],
           parallel: int, command: str) -> list[dict]:
    """load.md and load.json from the merged client files (load-c{N}-{name}.json); prints the
    table. configurations: (name, engine) in order, each engine's target alone first (its
    texts are what the engine's other configurations must equal)."""
    rows = []
    for c in levels:
        runs = {name: json.loads((out_dir / f"load-c{c}-{name}.json").read_text(encoding="utf-8"))
                for name, _ in configurations}
        alone: dict[str, dict] = {}
        for name, engine in configurations:
            alone.setdefault(engine, runs[name])
        base = runs[configurations[0][0]]
        for name, engine in configurations:
            rows.append(load_row(c, name, engine, runs[name], base, alone[engine]))
    table = load_markdown(rows, parallel)
    sys.stdout.write(table)
    (out_dir / "load.md").write_text(
        f"Made by `{command}` (every server and client command: command.txt).\n\n" + table,
        encoding="utf-8")
    (out_dir / "load.json").write_text(json.dumps({"parallel": parallel, "rows": rows},
                                                  indent=1) + "\n", encoding="utf-8")
    return rows


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def load_row(level: int, name: str, engine: str, run: dict, base: dict, alone: dict) -> dict:
    """One configuration at one level: throughput over its runs, latency percentiles over its
    requests, the ratio to Tandem alone's throughput (`base`) and whether its texts equal its
    own engine's target alone (`alone`: greedy, so speculation and batching must not change
    them)."""
    reqs = run["requests"]
    runs = run.get("load_runs") or []
    tokens = sum(r["output_tokens"] for r in runs)
    elapsed = sum(r["elapsed_s"] for r in runs)
    row = {"concurrency": level, "configuration": name, "engine": engine,
           "requests": len(reqs), "output_tokens": tokens, "elapsed_s": elapsed,
           "throughput_tok_s": tokens / elapsed if elapsed > 0 else None}
    for key in ("ttft_s", "gap_mean_s", "gap_max_s", "e2e_s"):
        values = [r[key] for r in reqs if isinstance(r.get(key), (int, float))]
        row[key] = {"p50": _pct(values, 50), "p99": _pct(values, 99)}
    base_runs = base.get("load_runs") or []
    b_tok = sum(r["output_tokens"] for r in base_runs)
    b_el = sum(r["elapsed_s"] for r in base_runs)
    b_rate = b_tok / b_el if b_el > 0 else None
    row["vs_alone"] = (row["throughput_tok_s"] / b_rate
                       if row["throughput_tok_s"] and b_rate else None)
    want = {r["task"]: r["content"] for r in alone["requests"]}
    row["equal_text"] = all(r["content"] == want.get(r["task"]) for r in reqs)
    return row


def load_markdown(rows: list[dict], parallel: int) -> str:
    def ms(q: dict, p: str) -> str:
        return "-" if q.get(p) is None else f"{1e3 * q[p]:.0f}"

    lines = [f"## Under load (--parallel {parallel}, streamed, every task once per pass)", "",
             "| concurrency | configuration | output tok/s | vs Tandem alone | TTFT p50 / p99 ms "
             "| mean gap p50 ms | largest gap p50 / p99 ms | end to end p50 ms | text = its engine alone |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = "-" if r["throughput_tok_s"] is None else f"{r['throughput_tok_s']:.2f}"
        vs = "-" if r["vs_alone"] is None else f"{r['vs_alone']:.2f}x"
        lines.append(
            f"| {r['concurrency']} | {r['configuration']} | {rate} | {vs} "
            f"| {ms(r['ttft_s'], 'p50')} / {ms(r['ttft_s'], 'p99')} "
            f"| {ms(r['gap_mean_s'], 'p50')} "
            f"| {ms(r['gap_max_s'], 'p50')} / {ms(r['gap_max_s'], 'p99')} "
            f"| {ms(r['e2e_s'], 'p50')} | {'yes' if r['equal_text'] else 'NO'} |")
    return "\n".join(lines) + "\n"
