"""The ranking of `tandem bench --sweep`: every configuration against one baseline, those that
did equal work ranked by their median wall-time speed-up over a whole pass; text and Markdown."""

from __future__ import annotations

from pathlib import Path

from . import compare
from .plan import Variant

Entry = tuple[Variant, compare.Run, list[compare.TaskResult]]  # a configuration, measured


def summary(results: list[compare.TaskResult]) -> str:
    """One line for the progress log: the overall speed-up, or why there is none."""
    overall = results[-1]
    if not all(r.equal_work for r in results[:-1]) or overall.speedup is None:
        return "not comparable (output differs from the baseline's)"
    return f"{overall.speedup:.2f}x median wall-time speed-up over a pass"


def ranking(entries: list[Entry]) -> list[dict]:
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


def ranking_markdown(rows: list[dict], base: compare.Run, entries: list[Entry]) -> str:
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
