"""`tandem bench`: serve the target alone and with speculation, measure both on the same work.

    tandem bench --model target.gguf --model-draft draft.gguf --passes 5 --out-dir bench/results/x

Each configuration gets its own `tandem serve` (127.0.0.1, a free port), waits for GET /health
200 and is measured by scripts/speculative-benchmark.py (a subprocess, as a user would run it).
Every configuration of a run (baseline and candidate, or the sweep's seven) is served at once
and measured in turns, request by request (--interleave request, the default: each task is
answered by every server before the next task is sent; --interleave pass: a whole pass per
server), the order reversed every turn (servers.py `measure_interleaved`): only one server works
at a time, and a slow spell of this shared machine hits all alike, each task's measurements in
the configurations lying seconds apart. The comparison is `tandem compare`'s, in-process. The out dir keeps everything
needed to check the figures:

    command.txt            the bench command line and every server and client command it ran
    baseline.json          the client's file for the target alone (--spec-type none)
    candidate.json         ... for the speculative configuration (one run: --spec-type, else
                           auto, the server's default with a draft), or one file per
                           configuration (--sweep: draft-n2.json, ..., auto.json)
    report.md, report.json the comparison (one run) or the ranking (--sweep)
    speedup.png            speed-up per task (one run; when matplotlib is installed, else
                           bench says on stderr that it skipped it)
    *.server.log           each server's log

--llama-server PATH adds llama.cpp's llama-server with the same GGUF files to the same turns:
target alone and, each with llama.cpp's own defaults, the types of --llama-spec-types
(draft-simple and ngram-simple unless told: llama-draft.json, llama-ngram.json; ngram-mod and
ngram-map-k: llama-ngram-mod.json, llama-ngram-map-k.json), and report.md gets a side-by-side section measured by the
same client: wall time per pass, decode tokens/s, acceptance, each configuration against
llama.cpp's target alone, and whether its text equals llama.cpp's.

--agent aider,openai-agents runs small coding tasks end to end with real agent clients against
the same configurations, in the same turns (agent.py, agentreport.py; report.md).

--load measures the same servers (each with -np/--parallel slots) under concurrent streamed
requests, level by level (--concurrency 1,2,4): throughput, time to first token and the gaps
between streamed tokens (measure/load.py; load.md).

--sweep measures draft-simple with n-max 2, 4 and 8, ngram-simple, suffix, and auto against
one baseline, and ranks them by the median wall-time speed-up of
a whole pass. A configuration whose output differs from the baseline's (the equal-work check) is
listed with the reasons and never ranked: its "speed-up" would compare different work.

Exit status: 0; 1 when some output differed from the baseline's (everything is still written);
2 for a bad flag or --prompts file; 130 when interrupted (Ctrl-C or SIGTERM; servers stopped).
A server that fails to load or a failed client run is a TandemError with their last log lines.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from .. import flags
from . import agent, compare, servers
from .load import run_load
from .plan import BASELINE, CLIENT, Plan, Variant, make_plan, say
from .ranking import ranking, ranking_markdown, render_ranking, summary
from .sidebyside import side_by_side, side_by_side_markdown

EXIT_NOT_EQUAL = 1  # everything was measured and written, but some output differed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_model_args(parser, default_model=None, parallel=True)
    flags.add_spec_args(parser)
    g = parser.add_argument_group("benchmark")
    g.add_argument("--passes", type=int, default=5, help="measured passes per server (5)")
    g.add_argument("--warmup", type=int, default=1, help="unmeasured passes first (1)")
    g.add_argument("--n-predict", type=int, default=256, help="tokens per request (256)")
    g.add_argument("--prompts", default=None, help='JSONL, one {"task", "prompt", "n_predict"} '
                   "per line (default: the client's 3 built-in tasks)")
    g.add_argument("--interleave", choices=("request", "pass"), default="request",
                   help="turns between the servers: each request on every server before the "
                        "next (request, the default), or a whole pass per server (pass)")
    g.add_argument("--out-dir", default=None,
                   help="new or empty folder for the results (default: bench/results/<time>)")
    g.add_argument("--port", type=int, default=None, help="port for the servers (default: free)")
    g.add_argument("--sweep", action="store_true",
                   help="measure draft n-max 2/4/8, ngram-simple, suffix and auto against one "
                        "baseline and rank them")
    g.add_argument("--load", action="store_true",
                   help="measure under concurrent streamed requests at each --concurrency level "
                        "(with -np/--parallel slots on every server): throughput, time to first "
                        "token and gaps between tokens, side by side (load.md)")
    g.add_argument("--concurrency", default="1,2,4",
                   help="--load: requests in flight, comma-separated levels (1,2,4)")
    g.add_argument("--load-timeout", type=float, default=900.0,
                   help="seconds a server may take to load before bench gives up (900)")
    g.add_argument("--client", default=None,
                   help=f"the benchmark client script (default: {CLIENT} in the source tree)")
    g.add_argument("--llama-server", metavar="PATH", default=None,
                   help="also measure llama.cpp's llama-server (this binary) on the same GGUF "
                        "files and work, in the same turns: target alone and the types of "
                        "--llama-spec-types, each at llama.cpp's defaults")
    g.add_argument("--llama-spec-types", default="draft-simple,ngram-simple",
                   help="llama.cpp's speculative types measured with --llama-server, "
                        "comma-separated: draft-simple, draft-eagle3 (-md a head), "
                        "ngram-simple, ngram-mod, ngram-map-k "
                        "(default: draft-simple,ngram-simple)")
    agent.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Measure; 0 when every comparison did equal work, 1 when one did not, 130 on Ctrl-C.

    Raises TandemError for a bad flag, a server that fails to load, or a failed client run.
    Servers are stopped on every way out, SIGTERM included.
    """
    plan = make_plan(args)
    with _sigterm_as_interrupt():
        try:
            if getattr(args, "agent_clients", None):
                return agent.run_agents(plan)
            if args.load:
                return run_load(plan)
            return run_sweep(plan) if args.sweep else run_pair(plan)
        except KeyboardInterrupt:
            print(f"tandem bench: interrupted; servers stopped; partial results in {plan.out_dir}",
                  file=sys.stderr)
            return 130


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


# ---- the two modes ---------------------------------------------------------------------------


def run_pair(plan: Plan) -> int:
    """Baseline, then the one candidate; prints compare's table and writes the report."""
    (variant,) = plan.variants
    llama = plan.llama_variants()
    base_path, cand_path, *llama_paths = servers.measure_interleaved(
        plan, [BASELINE, variant, *llama])
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
    _plot(out / "speedup.png", base, cand, results)
    return _verdict(all(r.equal_work for r in results), out / "report.md")


def run_sweep(plan: Plan) -> int:
    """The baseline and every sweep configuration, served at once and measured in turns;
    prints and writes the ranking."""
    todo = plan.variants
    llama = plan.llama_variants()
    base_path, *paths = servers.measure_interleaved(plan, [BASELINE, *todo, *llama])
    paths, llama_paths = paths[:len(todo)], paths[len(todo):]
    base = compare.load_run(str(base_path), "baseline")
    entries = []
    for variant, path in zip(todo, paths):
        cand = compare.load_run(str(path), variant.name)
        entries.append((variant, cand, compare.compare_runs(base, cand)))
        say(f"{variant.name}: {summary(entries[-1][2])}")
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


def _plot(path: Path, base: compare.Run, cand: compare.Run,
          results: list[compare.TaskResult]) -> None:
    """speedup.png; matplotlib is optional, so without it the run says so and goes on."""
    try:
        compare.write_plot(str(path), base, cand, results)
    except compare.PlotUnavailable:
        say(f"skipped {path.name}: matplotlib is not installed (pip install 'tandem[plot]')")


def _made_by(plan: Plan) -> str:
    """The report's first line: the command that made it, so committed results carry it."""
    return f"Made by `{plan.command}` (every server and client command: command.txt).\n\n"


def _verdict(equal: bool, report: Path) -> int:
    if equal:
        say(f"results in {report.parent}")
        return 0
    say(f"WARNING: some output differs from the baseline's (greedy speculation must not change "
        f"it); those tasks are not comparable, see {report}")
    return EXIT_NOT_EQUAL
