"""The report of `tandem bench --agent` (agent.py): from the runs' records, per agent, task and
configuration: success, wall time, model turns, tool calls, the first-token delay of the first
turn and of the later ones, tokens drafted and accepted; the wall-time speed-ups of Tandem with
speculation over Tandem alone and over each llama.cpp configuration; and whether speculation
left each transcript (every answer's text and tool calls, turn by turn) unchanged."""

from __future__ import annotations

import statistics
from collections import defaultdict

BASE, CAND = "baseline", "candidate"


def turn_delays(requests: list[dict]) -> list[float]:
    """Each model turn's first-token delay (seconds from its request to its first content; for
    an answer that was not streamed, to its end)."""
    out = []
    for q in requests:
        if q.get("status") != 200:
            continue
        first = q.get("first_s") if q.get("first_s") is not None else q.get("end_s")
        out.append(first - q["start_s"])
    return out


def transcript(run: dict) -> list[tuple]:
    """The answers of a run, turn by turn: text (its hash) and tool calls (names, arguments)."""
    return [(q.get("status"), q.get("text_sha256"),
             tuple((c["name"], c["arguments"]) for c in q.get("tool_calls") or []))
            for q in run["requests"]]


def first_difference(a: dict, b: dict) -> int | None:
    """The first turn (1-based) where two runs' transcripts differ; None when equal."""
    ta, tb = transcript(a), transcript(b)
    for i, (x, y) in enumerate(zip(ta, tb), start=1):
        if x != y:
            return i
    return None if len(ta) == len(tb) else min(len(ta), len(tb)) + 1


def run_figures(run: dict) -> dict:
    """The figures of one run."""
    qs = run["requests"]
    delays = turn_delays(qs)
    timings = [q.get("timings") or {} for q in qs]
    later = statistics.median(delays[1:]) if len(delays) > 1 else None
    prompt_ms = [t.get("prompt_ms") for t in timings if t.get("prompt_ms") is not None]
    return {
        "passed": run["check"]["passed"], "wall_s": run["wall_s"], "rc": run["rc"],
        "timed_out": run["timed_out"], "turns": len(qs),
        "errors": sum(1 for q in qs if q.get("status") != 200),
        "tool_calls": sum(len(q.get("tool_calls") or []) for q in qs),
        "prompt_tokens": sum(q.get("prompt_tokens") or 0 for q in qs),
        "completion_tokens": sum(q.get("completion_tokens") or 0 for q in qs),
        "cached_tokens": sum(t.get("cache_n") or 0 for t in timings),
        "drafted": sum(t.get("draft_n") or 0 for t in timings),
        "accepted": sum(t.get("draft_n_accepted") or 0 for t in timings),
        "first_turn_delay_s": delays[0] if delays else None,
        "later_turn_delay_s": later,
        "later_over_first": later / delays[0] if later is not None and delays[0] > 0 else None,
        # the server's own time to read each turn's prompt (its time to the first token)
        "first_turn_prompt_s": prompt_ms[0] / 1000 if prompt_ms else None,
        "later_turn_prompt_s": (statistics.median(prompt_ms[1:]) / 1000
                                if len(prompt_ms) > 1 else None),
    }


def spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def _cell(runs: list[dict]) -> dict:
    figures = [run_figures(r) for r in runs]
    out = {"runs": len(runs), "passed": sum(f["passed"] for f in figures)}
    for key in ("wall_s", "turns", "tool_calls", "completion_tokens", "first_turn_delay_s",
                "later_turn_delay_s", "later_over_first", "first_turn_prompt_s",
                "later_turn_prompt_s"):
        out[key] = spread([f[key] for f in figures])
    for key in ("drafted", "accepted", "errors", "prompt_tokens", "cached_tokens"):
        out[key] = sum(f[key] for f in figures)
    return out


def report(runs: list[dict], configs: list[str], labels: dict[str, str]) -> dict:
    """Everything report.md shows, as JSON."""
    by = defaultdict(list)
    for r in runs:
        by[(r["agent"], r["task"], r["config"])].append(r)
    agents = list(dict.fromkeys(r["agent"] for r in runs))
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    cells = {f"{a}/{t}/{c}": _cell(by[(a, t, c)]) for a in agents for t in tasks
             for c in configs if by[(a, t, c)]}
    speedups, same = [], []
    for a in agents:
        for t in tasks:
            speedups += _speedups(by, a, t, configs)
            same += _equal(by, a, t)
    totals = {c: _cell([r for r in runs if r["config"] == c]) for c in configs}
    return {"configs": configs, "labels": labels, "agents": agents, "tasks": tasks,
            "cells": cells, "totals": totals, "speedups": speedups, "transcripts": same,
            "speculation_kept_transcripts": all(s["equal"] for s in same
                                                if s["against"] == BASE)}


def _walls(runs: list[dict]) -> float | None:
    s = spread([r["wall_s"] for r in runs])
    return s and s["median"]


def _speedups(by: dict, agent: str, task: str, configs: list[str]) -> list[dict]:
    """Tandem with speculation over every other configuration: median wall over median wall,
    and whether both did the same work (equal transcripts)."""
    cand = by[(agent, task, CAND)]
    if not cand:
        return []
    out = []
    for c in configs:
        if c == CAND or not by[(agent, task, c)]:
            continue
        other = by[(agent, task, c)]
        out.append({"agent": agent, "task": task, "over": c,
                    "speedup": _walls(other) / _walls(cand),
                    "per_round": [o["wall_s"] / k["wall_s"] for o, k in zip(other, cand)],
                    "both_passed": all(r["check"]["passed"] for r in cand + other),
                    "same_work": all(first_difference(o, k) is None
                                     for o, k in zip(other, cand))})
    return out


def _equal(by: dict, agent: str, task: str) -> list[dict]:
    """Speculation against the same engine alone, round by round: Tandem's candidate against
    its baseline, llama.cpp's speculative types against llama.cpp alone."""
    out = []
    pairs = [(CAND, BASE)] + [(c, "llama-none") for (a, t, c) in list(by)
                              if a == agent and t == task and c.startswith("llama-")
                              and c != "llama-none"]
    for spec, alone in pairs:
        for i, (x, y) in enumerate(zip(by[(agent, task, spec)], by[(agent, task, alone)])):
            diff = first_difference(x, y)
            out.append({"agent": agent, "task": task, "config": spec, "against": alone,
                        "round": i, "equal": diff is None, "first_difference_turn": diff,
                        "same_request_there": _same_request(x, y, diff)})
    return out


def _same_request(a: dict, b: dict, turn: int | None) -> bool | None:
    """Whether both runs sent the same request at `turn` (so the answers, not the agents'
    prompts, differ there); None when unknown (no such turn, no hash recorded)."""
    if turn is None or turn > min(len(a["requests"]), len(b["requests"])):
        return None
    x, y = (r["requests"][turn - 1].get("request_sha256") for r in (a, b))
    return None if x is None or y is None else x == y


# ---- Markdown ------------------------------------------------------------------------------------


def _s(sp: dict | None, fmt: str = "{:.1f}") -> str:
    if sp is None:
        return "-"
    if sp["n"] == 1 or sp["min"] == sp["max"]:
        return fmt.format(sp["median"])
    return f"{fmt.format(sp['median'])} ({fmt.format(sp['min'])}-{fmt.format(sp['max'])})"


def markdown(rep: dict, command: str) -> str:
    labels = rep["labels"]
    lines = [f"Made by `{command}` (every server and agent command: command.txt; every request: "
             "results.json).", "", "## Success and wall time, per configuration", "",
             "| configuration | tasks passed | wall s per task, median (range) | turns | "
             "tool calls | drafted | accepted |", "|---|---|---|---|---|---|---|"]
    for c in rep["configs"]:
        t = rep["totals"][c]
        if t["runs"]:
            lines.append(f"| {labels.get(c, c)} | {t['passed']}/{t['runs']} | "
                         f"{_s(t['wall_s'])} | {_s(t['turns'], '{:g}')} | "
                         f"{_s(t['tool_calls'], '{:g}')} | {t['drafted']} | {t['accepted']} |")
    lines += _speedup_lines(rep) + _cell_lines(rep) + _transcript_lines(rep)
    return "\n".join(lines) + "\n"


def _speedup_lines(rep: dict) -> list[str]:
    labels = rep["labels"]
    out = ["", f"## Wall-time speed-up of {labels.get(CAND, CAND)}, per task", "",
           "Median wall over median wall; 'same work': the two transcripts are equal (else the "
           "agents did different work and the ratio compares different runs).", "",
           "| agent | task | over | speed-up | per round | both passed | same work |",
           "|---|---|---|---|---|---|---|"]
    for s in rep["speedups"]:
        rounds = ", ".join(f"{x:.2f}" for x in s["per_round"])
        out.append(f"| {s['agent']} | {s['task']} | {labels.get(s['over'], s['over'])} | "
                   f"**{s['speedup']:.2f}x** | {rounds} | {'yes' if s['both_passed'] else 'no'} "
                   f"| {'yes' if s['same_work'] else 'no'} |")
    return out


def _cell_lines(rep: dict) -> list[str]:
    labels = rep["labels"]
    out = ["", "## Per task and configuration", "",
           "First-token delay: seconds from a model request to its first streamed content "
           "(as the agent saw it); later turns: the median of turns 2.., and its ratio to the "
           "first turn's. Prompt s: the server's own prompt time (timings.prompt_ms), first "
           "turn / later turns' median.", "",
           "| agent | task | configuration | passed | wall s | turns | tool calls | "
           "completion tokens | first turn s | later turns s | later/first | prompt s | cached "
           "prompt tokens | drafted | accepted |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, c in rep["cells"].items():
        agent, task, config = key.split("/")
        out.append(f"| {agent} | {task} | {labels.get(config, config)} | "
                   f"{c['passed']}/{c['runs']} | {_s(c['wall_s'])} | {_s(c['turns'], '{:g}')} | "
                   f"{_s(c['tool_calls'], '{:g}')} | {_s(c['completion_tokens'], '{:g}')} | "
                   f"{_s(c['first_turn_delay_s'], '{:.2f}')} | "
                   f"{_s(c['later_turn_delay_s'], '{:.2f}')} | "
                   f"{_s(c['later_over_first'], '{:.2f}')} | "
                   f"{_s(c['first_turn_prompt_s'], '{:.2f}')} / "
                   f"{_s(c['later_turn_prompt_s'], '{:.2f}')} | {c['cached_tokens']} | "
                   f"{c['drafted']} | {c['accepted']} |")
    return out


def _transcript_lines(rep: dict) -> list[str]:
    labels = rep["labels"]
    out = ["", "## Transcripts with and without speculation", "",
           "| agent | task | configuration | against | round | equal |", "|---|---|---|---|---|---|"]
    for s in rep["transcripts"]:
        verdict = "yes" if s["equal"] else f"no: from turn {s['first_difference_turn']}"
        if s.get("same_request_there") is not None:
            verdict += (", the same request answered differently" if s["same_request_there"]
                        else ", after a different request")
        out.append(f"| {s['agent']} | {s['task']} | {labels.get(s['config'], s['config'])} | "
                   f"{labels.get(s['against'], s['against'])} | {s['round'] + 1} | {verdict} |")
    return out
