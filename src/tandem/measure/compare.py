"""`tandem compare baseline.json candidate.json`: is the candidate faster on the same work?

Reads two runs of scripts/speculative-benchmark.py and reports, per task and overall, the spread
of client wall time and of server tokens/s, the speed-up, the draft acceptance, and whether both
runs did the same work (same prompt, identical content, same tokens_predicted, same stop_type).
A task that fails the equal-work check gets no speed-up, only "not comparable" and the reasons.

The speed-up is shown twice, from measured figures only:
- wall time: baseline median / candidate median of the client's wall seconds, with the range of
  the per-pass ratios (pass i of the baseline over pass i of the candidate);
- decode arithmetic: useful tokens × baseline ms per token ÷ candidate decode ms
  ((tokens_predicted - 1) × median(predicted_ms / (predicted_n - 1)) ÷ median(predicted_ms)):
  both servers time the generation from the first token, which the prompt's pass gives, so
  predicted_ms covers the n - 1 tokens after it.

`tandem bench` reports with the same functions: load_run, compare_runs, render_text,
render_markdown, to_json and write_plot for one comparison; pass_totals, speedup_of, side_stats
and Spread for its sweep ranking (ranking.py) and llama.cpp side by side (sidebyside.py).
The plot needs matplotlib, an optional extra (`pip install 'tandem[plot]'`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import TandemError

FORMAT = "tandem-bench-1"  # what scripts/speculative-benchmark.py writes
DESCRIPTION = ("Is the candidate faster than the baseline on the same work? Compares two JSON "
               "files written by scripts/speculative-benchmark.py.")


@dataclass(slots=True)
class Sample:
    """One measured request, as the benchmark client recorded it."""

    pass_index: int
    wall_s: float
    tokens_per_second: float  # timings.predicted_per_second
    predicted_ms: float
    predicted_n: int
    tokens_predicted: int
    stop_type: str
    content: str
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    n_drafts: int | None = None  # timings.draft_n_drafts or speculative.n_drafts, when reported
    prompt_ms: float | None = None  # timings.prompt_ms / prompt_n, when reported
    prompt_n: int | None = None


@dataclass(slots=True)
class Run:
    label: str
    path: str
    prompts: dict[str, object]  # task -> (prompt, n_predict); empty when the file has no tasks
    samples: dict[str, list[Sample]]  # task -> samples ordered by pass


@dataclass(slots=True)
class Spread:
    median: float
    min: float
    max: float
    iqr: float | None  # only with >= 5 samples

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        """Spread.of([1, 2, 3, 4, 10]) -> median 3, min 1, max 10, iqr 4 - 2 = 2."""
        iqr = None
        if len(values) >= 5:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
            iqr = q3 - q1
        return cls(statistics.median(values), min(values), max(values), iqr)


@dataclass(slots=True)
class SideStats:
    """One run's figures for one task (or for the whole pass, in the overall row)."""

    samples: int
    wall_s: Spread
    tokens_per_second: Spread
    tokens_predicted: float  # median
    ms_per_token: float | None  # median of predicted_ms / (predicted_n - 1)
    predicted_ms: float  # median
    draft_n: int | None
    draft_n_accepted: int | None
    acceptance_rate: float | None  # draft_n_accepted / draft_n
    mean_acceptance_length: float | None  # 1 + accepted / drafts: tokens per verify step


@dataclass(slots=True)
class Arithmetic:
    useful_tokens: float
    reference_ms_per_token: float
    iteration_ms: float
    speedup: float


@dataclass(slots=True)
class TaskResult:
    task: str
    equal_work: bool
    reasons: list[str]
    baseline: SideStats | None
    candidate: SideStats | None
    speedup: float | None = None  # baseline median wall / candidate median wall
    speedup_range: tuple[float, float] | None = None  # min, max of per-pass ratios
    arithmetic: Arithmetic | None = None
    tasks: list[str] = field(default_factory=list)  # overall row only: tasks included
    # overall row only: each pass's speed-up, in pass order (the first saw every prompt first)
    per_pass: list[float] = field(default_factory=list)


# ---- loading ---------------------------------------------------------------------------------


def load_run(path: str, role: str) -> Run:
    """Read and check one benchmark file; TandemError naming the file and field otherwise."""
    hint = "expected a JSON file written by scripts/speculative-benchmark.py"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TandemError(f"{role} file {path!r} does not exist; {hint}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TandemError(f"cannot read {role} file {path!r}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TandemError(f"{role} file {path!r} is not JSON ({exc.msg}, line {exc.lineno}); "
                          f"{hint}") from None
    where = f"{role} file {path!r}"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise TandemError(f'{where}: "format" must be {FORMAT!r}, got {got!r}; {hint}')
    label, requests = data.get("label"), data.get("requests")
    _need(isinstance(label, str), where, '"label" must be a string')
    _need(isinstance(requests, list) and requests, where, '"requests" must be a non-empty list')
    samples: dict[str, list[Sample]] = {}
    for i, request in enumerate(requests):
        task, sample = _parse_request(request, f"{where}: requests[{i}]")
        if any(s.pass_index == sample.pass_index for s in samples.get(task, [])):
            raise TandemError(f"{where}: requests[{i}]: task {task!r} pass {sample.pass_index} "
                              "appears twice")
        samples.setdefault(task, []).append(sample)
    for task_samples in samples.values():
        task_samples.sort(key=lambda s: s.pass_index)
    return Run(label, path, _parse_prompts(data.get("tasks"), where), samples)


def _need(ok: object, where: str, what: str) -> None:
    if not ok:
        raise TandemError(f"{where}: {what}; expected a file from scripts/speculative-benchmark.py")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _parse_request(r: object, where: str) -> tuple[str, Sample]:
    _need(isinstance(r, dict), where, "must be an object")
    t = r.get("timings")
    _need(isinstance(t, dict), where, '"timings" must be an object')
    checks = [
        (isinstance(r.get("task"), str), "task", "a string"),
        (_is_int(r.get("pass")), "pass", "an integer"),
        (_is_number(r.get("wall_s")) and r["wall_s"] >= 0, "wall_s", "a number >= 0"),
        (_is_number(t.get("predicted_per_second")), "timings.predicted_per_second", "a number"),
        (_is_number(t.get("predicted_ms")), "timings.predicted_ms", "a number"),
        (_is_int(t.get("predicted_n")), "timings.predicted_n", "an integer"),
        (_is_int(r.get("tokens_predicted")), "tokens_predicted", "an integer"),
        (isinstance(r.get("stop_type"), str), "stop_type", "a string"),
        (isinstance(r.get("content"), str), "content", "a string"),
    ]
    for name in ("draft_n", "draft_n_accepted", "draft_n_drafts"):
        checks.append((t.get(name) is None or _is_int(t[name]), f"timings.{name}", "an integer"))
    spec = r.get("speculative")
    checks.append((spec is None or isinstance(spec, dict), "speculative", "an object or null"))
    for ok, name, kind in checks:
        if not ok:
            value = r.get(name, t.get(name.removeprefix("timings.")))
            _need(False, where, f'"{name}" must be {kind}, got {value!r}')
    n_drafts = t.get("draft_n_drafts")
    if n_drafts is None and spec is not None and _is_int(spec.get("n_drafts")):
        n_drafts = spec["n_drafts"]
    return r["task"], Sample(
        r["pass"], r["wall_s"], t["predicted_per_second"], t["predicted_ms"], t["predicted_n"],
        r["tokens_predicted"], r["stop_type"], r["content"],
        t.get("draft_n"), t.get("draft_n_accepted"), n_drafts,
        t["prompt_ms"] if _is_number(t.get("prompt_ms")) else None,
        t["prompt_n"] if _is_int(t.get("prompt_n")) else None,
    )


def _parse_prompts(tasks: object, where: str) -> dict[str, object]:
    if tasks is None:
        return {}
    _need(isinstance(tasks, list) and all(isinstance(t, dict) for t in tasks), where,
          '"tasks" must be a list of objects')
    return {t.get("task"): (t.get("prompt"), t.get("n_predict")) for t in tasks}


# ---- statistics ------------------------------------------------------------------------------


def side_stats(samples: list[Sample]) -> SideStats:
    per_token = [s.predicted_ms / (s.predicted_n - 1) for s in samples if s.predicted_n > 1]
    draft_n = _sum_reported(s.draft_n for s in samples)
    accepted = _sum_reported(s.draft_n_accepted for s in samples)
    n_drafts = _sum_reported(s.n_drafts for s in samples)
    rate = accepted / draft_n if draft_n and accepted is not None else None
    length = 1 + accepted / n_drafts if n_drafts and accepted is not None else None
    return SideStats(
        samples=len(samples),
        wall_s=Spread.of([s.wall_s for s in samples]),
        tokens_per_second=Spread.of([s.tokens_per_second for s in samples]),
        tokens_predicted=statistics.median(s.tokens_predicted for s in samples),
        ms_per_token=statistics.median(per_token) if per_token else None,
        predicted_ms=statistics.median(s.predicted_ms for s in samples),
        draft_n=draft_n,
        draft_n_accepted=accepted,
        acceptance_rate=rate,
        mean_acceptance_length=length,
    )


def _sum_reported(values) -> int | None:
    """Sum over samples when every sample reports the figure, else None."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def equal_work_reasons(task: str, base: Run, cand: Run) -> list[str]:
    """Why the two runs did not do the same work on this task; empty when they did."""
    missing = [r for r in (base, cand) if task not in r.samples]
    if missing:
        return [f"task missing from {r.label!r} ({r.path})" for r in missing]
    reasons = []
    if task in base.prompts and task in cand.prompts and base.prompts[task] != cand.prompts[task]:
        reasons.append("the prompt or n_predict differs")
    for name in ("content", "tokens_predicted", "stop_type"):
        b = {getattr(s, name) for s in base.samples[task]}
        c = {getattr(s, name) for s in cand.samples[task]}
        for label, values in (("baseline", b), ("candidate", c)):
            if len(values) > 1:
                reasons.append(f"{name} varies across the {label}'s passes")
        if len(b) == 1 and len(c) == 1 and b != c:
            reasons.append(_difference(name, b.pop(), c.pop()))
    return reasons


def _difference(name: str, b: object, c: object) -> str:
    if name != "content":
        return f"{name} differs: baseline {b!r}, candidate {c!r}"
    at = next((i for i, (x, y) in enumerate(zip(b, c)) if x != y), min(len(b), len(c)))
    return (f"content differs from character {at}: baseline {b[at:at + 20]!r}, "
            f"candidate {c[at:at + 20]!r}")


def speedup_of(base: list[float], cand: list[float], pairs: list[tuple[float, float]]) -> tuple:
    """(baseline median / candidate median, (min, max) of the per-pass ratios b_i / c_i)."""
    ratios = [b / c for b, c in pairs if c > 0]
    median_c = statistics.median(cand)
    speedup = statistics.median(base) / median_c if median_c > 0 else None
    return speedup, (min(ratios), max(ratios)) if ratios else None


def arithmetic_of(base: SideStats, cand: SideStats) -> Arithmetic | None:
    """useful tokens × baseline ms/token ÷ candidate ms: 256 × 20 ms ÷ 2560 ms = 2.0×."""
    if base.ms_per_token is None or cand.predicted_ms <= 0:
        return None
    tokens = max(cand.tokens_predicted - 1, 0)  # the tokens predicted_ms timed
    return Arithmetic(tokens, base.ms_per_token, cand.predicted_ms,
                      tokens * base.ms_per_token / cand.predicted_ms)


def compare_task(task: str, base: Run, cand: Run) -> TaskResult:
    reasons = equal_work_reasons(task, base, cand)
    b, c = base.samples.get(task), cand.samples.get(task)
    result = TaskResult(task, not reasons, reasons,
                        side_stats(b) if b else None, side_stats(c) if c else None)
    if reasons:
        return result
    c_by_pass = {s.pass_index: s.wall_s for s in c}
    pairs = [(s.wall_s, c_by_pass[s.pass_index]) for s in b if s.pass_index in c_by_pass]
    result.speedup, result.speedup_range = speedup_of(
        [s.wall_s for s in b], [s.wall_s for s in c], pairs)
    result.arithmetic = arithmetic_of(result.baseline, result.candidate)
    return result


def compare_overall(tasks: list[str], base: Run, cand: Run) -> TaskResult:
    """The whole pass over the comparable tasks: per-pass totals, then the same figures."""
    if not tasks:
        return TaskResult("overall", False, ["no task did the same work in both runs"], None, None)
    passes = set.intersection(
        *({s.pass_index for s in r.samples[t]} for r in (base, cand) for t in tasks))
    if not passes:
        reason = "no pass is present for every task in both runs"
        return TaskResult("overall", False, [reason], None, None)
    b, c = pass_totals(base, tasks, passes), pass_totals(cand, tasks, passes)
    result = TaskResult("overall", True, [], side_stats(b), side_stats(c), tasks=tasks)
    pairs = [(x.wall_s, y.wall_s) for x, y in zip(b, c)]
    result.per_pass = [x / y for x, y in pairs if y > 0]
    result.speedup, result.speedup_range = speedup_of(
        [x.wall_s for x in b], [y.wall_s for y in c], pairs)
    per_task = [compare_task(t, base, cand).arithmetic for t in tasks]
    if all(per_task):
        tokens = sum(a.useful_tokens for a in per_task)
        reference_ms = sum(a.useful_tokens * a.reference_ms_per_token for a in per_task)
        iteration_ms = sum(a.iteration_ms for a in per_task)
        result.arithmetic = Arithmetic(tokens, reference_ms / tokens, iteration_ms,
                                       reference_ms / iteration_ms)
    return result


def pass_totals(run: Run, tasks: list[str], passes: set[int]) -> list[Sample]:
    """One Sample per pass summing the tasks; tokens/s is total tokens / total decode time."""
    totals = []
    for p in sorted(passes):
        group = [s for t in tasks for s in run.samples[t] if s.pass_index == p]
        ms, n = sum(s.predicted_ms for s in group), sum(s.predicted_n for s in group)
        steps = sum(max(s.predicted_n - 1, 0) for s in group)  # what predicted_ms timed
        totals.append(Sample(
            p, sum(s.wall_s for s in group), 1000 * steps / ms if ms > 0 else 0.0, ms, n,
            sum(s.tokens_predicted for s in group), "", "",
            _sum_reported(s.draft_n for s in group),
            _sum_reported(s.draft_n_accepted for s in group),
            _sum_reported(s.n_drafts for s in group),
            _sum_reported(s.prompt_ms for s in group),
            _sum_reported(s.prompt_n for s in group),
        ))
    return totals


def compare_runs(base: Run, cand: Run) -> list[TaskResult]:
    """One result per task (baseline's order, then the candidate's extra tasks), then overall."""
    tasks = list(dict.fromkeys([*base.samples, *cand.samples]))
    results = [compare_task(t, base, cand) for t in tasks]
    return [*results, compare_overall([r.task for r in results if r.equal_work], base, cand)]


# ---- output ----------------------------------------------------------------------------------


def _spread(s: Spread, fmt: str) -> str:
    text = f"{s.median:{fmt}} ({s.min:{fmt}}-{s.max:{fmt}})"
    return text if s.iqr is None else f"{text} IQR {s.iqr:{fmt}}"


def _side(stats: SideStats | None, attr: str, fmt: str) -> str:
    return "-" if stats is None else _spread(getattr(stats, attr), fmt)


def _acceptance(stats: SideStats | None) -> str:
    if stats is None or stats.acceptance_rate is None:
        return "-"
    text = f"{stats.acceptance_rate:.1%} ({stats.draft_n_accepted}/{stats.draft_n})"
    if stats.mean_acceptance_length is not None:
        text += f", len {stats.mean_acceptance_length:.2f}"
    return text


HEADER = ["task", "baseline s", "candidate s", "speed-up (range)",
          "baseline tok/s", "candidate tok/s", "candidate acceptance"]


def table_rows(results: list[TaskResult]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.speedup is None:
            speedup = "not comparable" if not r.equal_work else "-"
        else:
            lo, hi = r.speedup_range or (r.speedup, r.speedup)
            speedup = f"{r.speedup:.2f}x ({lo:.2f}-{hi:.2f})"
        rows.append([
            r.task, _side(r.baseline, "wall_s", ".3f"), _side(r.candidate, "wall_s", ".3f"),
            speedup, _side(r.baseline, "tokens_per_second", ".1f"),
            _side(r.candidate, "tokens_per_second", ".1f"), _acceptance(r.candidate),
        ])
    return rows


def notes(results: list[TaskResult]) -> list[str]:
    """The decode arithmetic of comparable tasks and the reasons of the others."""
    lines = []
    for r in results:
        if a := r.arithmetic:
            lines.append(f"{r.task}: {a.useful_tokens:g} tokens x {a.reference_ms_per_token:.3f} "
                         f"ms/token / {a.iteration_ms:.1f} ms = {a.speedup:.2f}x decode speed-up")
        if not r.equal_work:
            lines.append(f"{r.task}: not comparable: {'; '.join(r.reasons)}")
    *tasks, overall = results
    if overall.tasks and len(overall.tasks) < len(tasks):
        lines.append(f"overall: per-pass totals over {', '.join(overall.tasks)} only")
    if len(overall.per_pass) > 1:
        lines.append("overall, pass by pass: " + ", ".join(f"{x:.2f}x" for x in overall.per_pass)
                     + " (the first pass saw every prompt for the first time; a server that "
                     "remembers earlier answers, --spec-suffix-pool, may draft a repeated "
                     "prompt's answer from memory in later ones)")
    return lines


def render_text(base: Run, cand: Run, results: list[TaskResult]) -> str:
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [f"baseline: {base.label} ({base.path})", f"candidate: {cand.label} ({cand.path})",
             "times: client wall seconds, median (min-max), IQR with >= 5 passes", ""]
    for row in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells))
    return "\n".join([*lines, "", *notes(results)]) + "\n"


def render_markdown(base: Run, cand: Run, results: list[TaskResult]) -> str:
    lines = [f"Baseline: `{base.label}`, candidate: `{cand.label}`. Times are client wall seconds, "
             "median (min-max), IQR with >= 5 passes.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return "\n".join([*lines, "", *(f"- {n}" for n in notes(results))]) + "\n"


def to_json(base: Run, cand: Run, results: list[TaskResult]) -> dict:
    *tasks, overall = results
    return {
        "baseline": {"label": base.label, "file": base.path},
        "candidate": {"label": cand.label, "file": cand.path},
        "tasks": [{k: v for k, v in asdict(r).items() if k != "tasks"} for r in tasks],
        "overall": asdict(overall),
    }


class PlotUnavailable(TandemError):
    """matplotlib, which only the plot needs, is not installed (an optional extra)."""


PLOT_NEEDS = "--plot needs matplotlib, which is not installed: pip install 'tandem[plot]'"


def require_matplotlib() -> type:
    """matplotlib's Figure (Agg canvas, no pyplot global state); PlotUnavailable without it."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(PLOT_NEEDS) from None
    return Figure


def write_plot(path: str, base: Run, cand: Run, results: list[TaskResult]) -> None:
    """Bar chart of the wall-time speed-up per task, error bars spanning the per-pass range.

    matplotlib is optional (`pip install 'tandem[plot]'`): without it, PlotUnavailable."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(1.4 * len(results) + 2, 4))
    ax = fig.add_subplot()
    for x, r in enumerate(results):
        if r.speedup is None:
            ax.text(x, 0.03, "not comparable", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", rotation=90, color="gray")
            continue
        lo, hi = r.speedup_range or (r.speedup, r.speedup)
        err = [[max(0.0, r.speedup - lo)], [max(0.0, hi - r.speedup)]]
        color = "tab:gray" if r.task == "overall" else "tab:blue"
        ax.bar(x, r.speedup, yerr=err, capsize=4, color=color)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(results)), [r.task for r in results])
    ax.set_ylabel("speed-up (baseline time / candidate time)")
    ax.set_title(f"{cand.label} vs {base.label}: median wall time ratio, range over passes")
    fig.tight_layout()
    fig.savefig(path, format="png")


# ---- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", help="speculative-benchmark.py JSON, the reference")
    parser.add_argument("candidate", help="speculative-benchmark.py JSON, to compare")
    parser.add_argument("--markdown", metavar="OUT.md", help="also write the table as Markdown")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="also write a PNG of speed-up per task (needs matplotlib: "
                             "pip install 'tandem[plot]')")
    parser.add_argument("--json", metavar="OUT.json", help="also write the figures as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the comparison; raises TandemError for a bad input file, an unwritable output, or
    --plot without matplotlib (checked first, before anything is printed or written)."""
    if args.plot:
        require_matplotlib()
    base, cand = load_run(args.baseline, "baseline"), load_run(args.candidate, "candidate")
    results = compare_runs(base, cand)
    sys.stdout.write(render_text(base, cand, results))
    outputs = [
        (args.markdown, lambda: render_markdown(base, cand, results)),
        (args.json, lambda: json.dumps(to_json(base, cand, results), indent=1) + "\n"),
        (args.plot, None),
    ]
    for path, render in outputs:
        if not path:
            continue
        try:
            if render is None:
                write_plot(path, base, cand, results)
            else:
                Path(path).write_text(render(), encoding="utf-8")
        except OSError as exc:
            raise TandemError(f"cannot write {path!r}: {exc}") from None
    return 0
