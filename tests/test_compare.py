"""`tandem compare`: medians, spreads, speed-ups and the equal-work check, from measured runs.

The end-to-end test runs the real benchmark client against two scripted servers (a slow
baseline, a faster candidate with draft statistics); the others build benchmark files by hand
so that client wall times, and hence every figure, are known exactly.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections import Counter

import pytest
from tandem import cli
from tandem.measure import compare

from .bench_helpers import FakeServer, bench_file, request, run_client, write_prompts

TASKS = ("code-edit", "summary", "story")
# per call: index 0 is the warm-up pass, which must never reach the figures
BASE_MS = [999.0, 200.0, 250.0, 400.0, 200.0, 125.0]  # 10 tokens: 50, 40, 25, 50, 80 tok/s
CAND_MS = [999.0, 100.0, 100.0, 125.0, 80.0, 100.0]  # 10 tokens: 100, 100, 80, 125, 100 tok/s


def scripted(ms: list[float], contents: dict[str, str], lengths: dict[str, int], drafts: bool):
    """A /completion answer per call: the task is the prompt, timings follow `ms` per task.

    Each answer takes ms / 10000 seconds of real time, so wall times differ like the timings.
    """
    calls: Counter[str] = Counter()

    def answer(body: dict) -> tuple[int, dict]:
        task = body["prompt"]
        call, calls[task] = calls[task], calls[task] + 1
        n = lengths[task]
        time.sleep(ms[call] / 10_000)
        timings = {"prompt_n": 5, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": ms[call],
                   "predicted_per_second": 1000 * n / ms[call]}
        if drafts:
            timings.update(draft_n=8, draft_n_accepted=6, draft_n_drafts=2)
        return 200, {"content": contents[task], "tokens_predicted": n, "tokens_evaluated": 5,
                     "stop_type": "limit", "truncated": False, "timings": timings}

    return answer


def benchmark_file(tmp_path, name: str, answer) -> str:
    prompts = write_prompts(tmp_path / "prompts.jsonl",
                            [json.dumps({"task": t, "prompt": t, "n_predict": 10}) for t in TASKS])
    with FakeServer(answer) as server:
        proc = run_client(server.url, tmp_path / f"{name}.json", "--prompts", str(prompts),
                          "--passes", "5", "--warmup", "1", label=name)
    assert proc.returncode == 0, proc.stderr
    return str(tmp_path / f"{name}.json")


def test_end_to_end_with_the_benchmark_client(tmp_path, capsys):
    same = {t: f"output of {t}\n" for t in TASKS}
    base = benchmark_file(tmp_path, "baseline", scripted(
        BASE_MS, same, {t: 10 for t in TASKS}, drafts=False))
    cand = benchmark_file(tmp_path, "candidate", scripted(
        CAND_MS, {**same, "summary": "output of summary, but not the same\n"},
        {"code-edit": 10, "summary": 10, "story": 12}, drafts=True))
    out_json, out_md, out_png = (tmp_path / f"report.{ext}" for ext in ("json", "md", "png"))
    code = cli.main(["compare", base, cand, "--json", str(out_json), "--markdown", str(out_md),
                     "--plot", str(out_png)])
    assert code == 0
    stdout = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    by_task = {t["task"]: t for t in report["tasks"]}
    assert list(by_task) == list(TASKS)

    edit = by_task["code-edit"]
    assert (edit["equal_work"], edit["reasons"]) == (True, [])
    assert edit["baseline"]["tokens_per_second"] == {"median": 50, "min": 25, "max": 80, "iqr": 10}
    assert edit["candidate"]["tokens_per_second"] == {"median": 100, "min": 80, "max": 125,
                                                      "iqr": 0}
    # predicted_ms times the 9 tokens after the first (as llama-server's timings)
    assert edit["arithmetic"] == pytest.approx({"useful_tokens": 9,
                                                "reference_ms_per_token": 200 / 9,
                                                "iteration_ms": 100.0, "speedup": 2.0})
    assert edit["candidate"]["acceptance_rate"] == 30 / 40
    assert edit["candidate"]["mean_acceptance_length"] == 1 + 30 / 10
    assert edit["baseline"]["acceptance_rate"] is None

    # wall times are whatever the client measured: check against the recorded seconds
    walls = {name: [r["wall_s"] for r in json.loads(open(path).read())["requests"]
                    if r["task"] == "code-edit"] for name, path in (("b", base), ("c", cand))}
    assert all(w >= ms / 10_000 for w, ms in zip(walls["b"], BASE_MS[1:]))  # the sleeps
    assert edit["baseline"]["wall_s"]["median"] == statistics.median(walls["b"])
    assert edit["candidate"]["wall_s"]["max"] == max(walls["c"])
    ratios = [b / c for b, c in zip(walls["b"], walls["c"])]
    medians = statistics.median(walls["b"]), statistics.median(walls["c"])
    assert edit["speedup"] == pytest.approx(medians[0] / medians[1])
    assert edit["speedup_range"] == pytest.approx([min(ratios), max(ratios)])

    summary, story = by_task["summary"], by_task["story"]
    assert summary["equal_work"] is False and story["equal_work"] is False
    assert summary["reasons"] == ["content differs from character 17: baseline '\\n', "
                                  "candidate ', but not the same\\n'"]
    assert story["reasons"] == ["tokens_predicted differs: baseline 10, candidate 12"]
    for task in (summary, story):
        assert task["speedup"] is None and task["speedup_range"] is None
        assert task["arithmetic"] is None

    overall = report["overall"]
    assert overall["tasks"] == ["code-edit"] and overall["equal_work"] is True
    assert overall["arithmetic"]["speedup"] == pytest.approx(2.0)
    assert overall["candidate"]["tokens_per_second"]["median"] == pytest.approx(90)

    assert "code-edit: 9 tokens x 22.222 ms/token / 100.0 ms = 2.00x decode speed-up" in stdout
    assert "story: not comparable: tokens_predicted differs: baseline 10, candidate 12" in stdout
    assert "overall: per-pass totals over code-edit only" in stdout
    rows = {line.split()[0]: line for line in stdout.splitlines() if line.split()}
    assert "not comparable" in rows["summary"] and "not comparable" in rows["story"]
    assert "100.0 (80.0-125.0) IQR 0.0" in rows["code-edit"]
    assert "75.0% (30/40), len 4.00" in rows["code-edit"]

    markdown = out_md.read_text().splitlines()
    assert "| task | baseline s | candidate s | speed-up (range) |" in markdown[2]
    md_rows = {line.split("|")[1].strip(): line for line in markdown if line.startswith("| ")}
    assert "not comparable" in md_rows["summary"]
    assert f"{edit['speedup']:.2f}x" in md_rows["code-edit"]
    assert "- story: not comparable: tokens_predicted differs" in out_md.read_text()

    from matplotlib.image import imread  # the plot extra, which the test extra includes

    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(out_png).shape
    assert height > 100 and width > 100


def compare_files(tmp_path, base: list[dict], cand: list[dict]) -> dict:
    b = compare.load_run(bench_file(tmp_path / "b.json", "base", base), "baseline")
    c = compare.load_run(bench_file(tmp_path / "c.json", "cand", cand), "candidate")
    *tasks, overall = compare.compare_runs(b, c)
    return {**{r.task: r for r in tasks}, "overall": overall}


def test_wall_time_spread_speedup_range_and_overall_totals(tmp_path):
    base = [request("a", p, w, ms=200.0) for p, w in enumerate([1.0, 1.2, 0.9, 1.1, 1.0], 1)]
    base += [request("b", p, 2.0, ms=200.0, n=20) for p in range(1, 6)]
    cand = [request("a", p, w, ms=100.0) for p, w in enumerate([0.5, 0.4, 0.6, 0.5, 0.5], 1)]
    cand += [request("b", p, 2.0, ms=200.0, n=20) for p in range(1, 6)]
    results = compare_files(tmp_path, base, cand)

    a = results["a"]
    wall = a.baseline.wall_s
    assert (wall.median, wall.min, wall.max) == (1.0, 0.9, 1.2)
    assert a.baseline.wall_s.iqr == pytest.approx(0.1)  # quartiles 1.0 and 1.1
    assert a.speedup == pytest.approx(2.0)
    assert a.speedup_range == pytest.approx((1.5, 3.0))  # pass 3: 0.9 / 0.6, pass 2: 1.2 / 0.4
    assert results["b"].speedup == pytest.approx(1.0)

    overall = results["overall"]
    # per-pass totals: baseline 3.0 3.2 2.9 3.1 3.0, candidate 2.5 2.4 2.6 2.5 2.5
    assert overall.baseline.wall_s.median == pytest.approx(3.0)
    assert overall.speedup == pytest.approx(3.0 / 2.5)
    assert overall.speedup_range == pytest.approx((2.9 / 2.6, 3.2 / 2.4))
    # each pass apart, in order: the first saw every prompt for the first time
    assert overall.per_pass == pytest.approx([3.0 / 2.5, 3.2 / 2.4, 2.9 / 2.6, 3.1 / 2.5, 1.2])
    assert "overall, pass by pass: 1.20x, 1.33x, 1.12x, 1.24x, 1.20x" in "\n".join(
        compare.notes(list(results.values())))
    # (9 tokens x 200/9 ms + 19 tokens x 200/19 ms) / (100 ms + 200 ms): predicted_ms times
    # the tokens after each answer's first
    assert overall.arithmetic.speedup == pytest.approx(400 / 300)
    assert overall.arithmetic.reference_ms_per_token == pytest.approx(400 / 28)
    assert overall.baseline.tokens_per_second.median == pytest.approx(1000 * 28 / 400)


def test_fewer_than_five_passes_have_no_iqr(tmp_path):
    base = [request("a", p, 1.0) for p in range(1, 5)]
    results = compare_files(tmp_path, base, base)
    assert results["a"].baseline.wall_s.iqr is None
    assert results["a"].speedup == 1.0 and results["a"].speedup_range == (1.0, 1.0)


def test_unequal_work_reasons(tmp_path):
    base = [request("varies", 1, 1.0, content="one"), request("varies", 2, 1.0, content="two"),
            request("stops", 1, 1.0), request("only-base", 1, 1.0)]
    cand = [request("varies", 1, 1.0, content="one"), request("varies", 2, 1.0, content="one"),
            request("stops", 1, 1.0, stop_type="eos")]
    results = compare_files(tmp_path, base, cand)
    assert results["varies"].reasons == ["content varies across the baseline's passes"]
    assert results["stops"].reasons == ["stop_type differs: baseline 'limit', candidate 'eos'"]
    assert results["only-base"].reasons == [f"task missing from 'cand' ({tmp_path / 'c.json'})"]
    assert results["only-base"].candidate is None
    overall = results["overall"]
    assert (overall.equal_work, overall.speedup) == (False, None)
    assert overall.reasons == ["no task did the same work in both runs"]


def test_prompt_difference_is_unequal_work(tmp_path):
    one = [request("a", 1, 1.0)]
    base = compare.load_run(bench_file(tmp_path / "b.json", "b", one), "baseline")
    cand = compare.load_run(bench_file(tmp_path / "c.json", "c", one), "candidate")
    base.prompts, cand.prompts = {"a": ("Rename f", 10)}, {"a": ("Rename g", 10)}
    assert compare.equal_work_reasons("a", base, cand) == ["the prompt or n_predict differs"]


def test_mean_acceptance_length_needs_the_number_of_drafts(tmp_path):
    with_drafts = [{**request("a", p, 1.0, draft_n=10, draft_n_accepted=7),
                    "speculative": {"n_drafts": 3}} for p in (1, 2)]
    no_drafts = [request("a", p, 1.0, draft_n=10, draft_n_accepted=7) for p in (1, 2)]
    results = compare_files(tmp_path, no_drafts, with_drafts)
    assert results["a"].candidate.acceptance_rate == 0.7
    assert results["a"].candidate.mean_acceptance_length == 1 + 14 / 6
    assert results["a"].baseline.acceptance_rate == 0.7
    assert results["a"].baseline.mean_acceptance_length is None


@pytest.mark.parametrize("content, phrase", [
    (None, "does not exist"),
    ("{not json", "is not JSON"),
    ('{"format": "tandem-bench-1", "label": "x", "requests": []}',
     '"requests" must be a non-empty list'),
    ('{"label": "x", "requests": []}', "\"format\" must be 'tandem-bench-1', got None"),
    (json.dumps({"format": "tandem-bench-1", "label": "x",
                 "requests": [{**request("a", 1, 1.0), "timings": {"predicted_ms": None}}]}),
     '"timings.predicted_per_second" must be a number, got None'),
    (json.dumps({"format": "tandem-bench-1", "label": "x",
                 "requests": [request("a", 1, 1.0), request("a", 1, 2.0)]}),
     "requests[1]: task 'a' pass 1 appears twice"),
])
def test_bad_input_file_is_a_clear_error(tmp_path, capsys, content, phrase):
    good = bench_file(tmp_path / "good.json", "good", [request("a", 1, 1.0)])
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert cli.main(["compare", good, str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tandem: error: candidate file '{bad}'")
    assert phrase in err


def test_command_line_reports_without_traceback(tmp_path):
    good = bench_file(tmp_path / "good.json", "good", [request("a", 1, 1.0)])
    command = [sys.executable, "-m", "tandem.cli", "compare"]
    proc = subprocess.run([*command, str(tmp_path / "x.json"), good],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("tandem: error: baseline file")
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([*command, good, good],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1.00x (1.00-1.00)" in proc.stdout


def test_plot_without_matplotlib_is_a_clear_error_before_any_output(tmp_path, capsys,
                                                                     no_matplotlib):
    good = bench_file(tmp_path / "good.json", "good", [request("a", 1, 1.0)])
    out_md, out_png = tmp_path / "report.md", tmp_path / "speedup.png"
    code = cli.main(["compare", good, good, "--markdown", str(out_md), "--plot", str(out_png)])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.err == ("tandem: error: --plot needs matplotlib, which is not installed: "
                            "pip install 'tandem[plot]'\n")
    assert captured.out == "" and not out_md.exists() and not out_png.exists()
    # without --plot the comparison needs no matplotlib
    assert cli.main(["compare", good, good, "--markdown", str(out_md)]) == 0
    assert "1.00x (1.00-1.00)" in capsys.readouterr().out and out_md.exists()
