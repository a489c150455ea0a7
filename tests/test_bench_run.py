"""`tandem bench`: real `tandem serve` subprocesses on tiny GGUF models, the real benchmark client.

The tiny target and draft share a tokenizer (tests/tiny.py) but not their weights, so with
--spec-draft-p-min 0 the draft proposes on every step and the target rejects most of it: the
speculative server does real drafting and verification, and greedy output must still equal the
target's own. Each server start costs a few seconds (Python, torch, the server's warm-up), which
sets the time of these tests; flag errors are checked without any server.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
from pathlib import Path

import pytest

from tandem import flags
from tandem.errors import TandemError
from tandem.measure import bench, compare, plan, ranking, servers, sidebyside
from tandem.server import cli as serve_cli

from . import tiny
from .bench_helpers import bench_file, request

PROMPTS = [
    {"task": "fox", "prompt": "The quick brown fox jumps over the lazy dog. The quick"},
    {"task": "code", "prompt": "def add(a, b):\n    return", "n_predict": 6},
]
SWEEP_NAMES = {"draft-n2", "draft-n4", "draft-n8", "ngram", "suffix", "auto"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("models")
    target = tiny.write_gguf(tiny.hf_model("qwen2", 0), d / "target.gguf", "qwen2")
    draft = tiny.write_gguf(tiny.hf_model("qwen2", 1), d / "draft.gguf", "qwen2")
    return str(target), str(draft)


def prompts_file(path: Path, tasks: list[dict]) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")
    return str(path)


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(list(argv))
    args.argv = ["tandem", "bench", *argv]
    return args


def quick(models, tmp_path, tasks=PROMPTS, *extra: str) -> list[str]:
    target, draft = models
    return ["--model", target, "--model-draft", draft, "--ctx-size", "256", "--passes", "1",
            "--warmup", "0", "--n-predict", "8",
            "--prompts", prompts_file(tmp_path / "prompts.jsonl", tasks),
            "--out-dir", str(tmp_path / "out"), *extra]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def assert_servers_stopped(out: Path) -> None:
    """Every port a server was started on (command.txt) refuses connections now."""
    ports = re.findall(r"--port (\d+)", (out / "command.txt").read_text(encoding="utf-8"))
    assert ports
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()


def test_baseline_then_draft_on_equal_work(models, tmp_path, capsys):
    out = tmp_path / "out"
    args = quick(models, tmp_path, PROMPTS, "--spec-type", "draft-simple", "--spec-draft-p-min", "0")
    args[args.index("--passes") + 1] = "2"
    args[args.index("--warmup") + 1] = "1"
    assert bench.run(bench_args(*args)) == 0
    captured = capsys.readouterr()

    expected = {"command.txt", "baseline.json", "candidate.json", "report.md", "report.json",
                "speedup.png", "baseline.server.log", "candidate.server.log"}
    assert expected <= {p.name for p in out.iterdir()}
    base, cand = load(out / "baseline.json"), load(out / "candidate.json")
    # each side served what it says: the target alone, then the target with the draft
    assert base["props"]["speculative"]["enabled"] is False
    assert cand["props"]["speculative"]["type"] == "draft-simple"
    assert cand["props"]["draft_model_path"].endswith("draft.gguf")
    assert all(r["timings"]["draft_n"] > 0 for r in cand["requests"])
    # greedy speculation did the same work, and the report says so with a speed-up figure
    contents = [{r["task"]: r["content"] for r in run["requests"]} for run in (base, cand)]
    assert contents[0] == contents[1] and set(contents[0]) == {"fox", "code"}
    report = load(out / "report.json")
    assert [t["equal_work"] for t in report["tasks"]] == [True, True]
    assert report["overall"]["speedup"] > 0
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the command that made the results travels with them
    command = (out / "command.txt").read_text(encoding="utf-8")
    assert "tandem bench --model" in command and "--spec-draft-p-min 0" in command
    assert "--spec-type none" in command and "--spec-type draft-simple" in command
    # both servers up, a warm-up pass each, then measured request by request in turns, ABBA:
    # each task answered by both servers before the next task, the order reversed every turn
    assert command.count("speculative-benchmark.py") == 2 + 8
    warm = re.findall(r"# (baseline|candidate): client, warm-up\n.*--passes 0 --warmup 1", command)
    assert warm == ["baseline", "candidate"]
    order = re.findall(r"# (baseline|candidate): client, pass (\d)/2, (\w+)\n.*--tasks (\w+)",
                       command)
    assert [o[:3] for o in order] == [
        ("baseline", "1", "fox"), ("candidate", "1", "fox"),
        ("candidate", "1", "code"), ("baseline", "1", "code"),
        ("baseline", "2", "fox"), ("candidate", "2", "fox"),
        ("candidate", "2", "code"), ("baseline", "2", "code")]
    assert all(o[2] == o[3] for o in order)  # each run sent that one task
    # the client ran isolated (python -I) against the live server and wrote complete files
    assert command.count(" -I ") == 10
    for name in ("baseline.json", "candidate.json"):
        run = json.loads((out / name).read_text(encoding="utf-8"))
        assert run["requests"] and all(r["content"] and r["timings"] and r["stop_type"]
                                       for r in run["requests"])
        # the per-request files merged into one, passes numbered 0 and 1 for every task, the
        # tasks listed in the prompts file's order, the warm-up's requests kept apart
        assert [(r["task"], r["pass"]) for r in run["requests"]] == [
            ("fox", 0), ("code", 0), ("fox", 1), ("code", 1)]
        assert [t["task"] for t in run["tasks"]] == ["fox", "code"]
        assert [r["task"] for r in run["warmup"]] == ["fox", "code"]
        assert (run["settings"]["passes"], run["settings"]["warmup"]) == (2, 1)
    assert not list(out.glob("*.pass*.json")) and not list(out.glob("*.warmup.json"))
    assert (out / "report.md").read_text(encoding="utf-8").startswith("Made by `tandem bench")
    assert "overall" in captured.out and "speed-up" in captured.out
    for phase in ("[1/2] baseline", "[2/2] candidate", "ready after",
                  "pass 2/2, code: baseline", "warm-up: candidate", "[pass 1/1] fox"):
        assert phase in captured.err
    assert_servers_stopped(out)


def test_sweep_ranks_every_configuration_against_one_baseline(models, tmp_path, capsys):
    out = tmp_path / "out"
    assert bench.run(bench_args(*quick(models, tmp_path, PROMPTS[:1], "--sweep"))) == 0
    captured = capsys.readouterr()

    names = {p.stem for p in out.glob("*.json")} - {"report"}
    assert names == {"baseline", *SWEEP_NAMES}
    served = {n: load(out / f"{n}.json")["props"]["speculative"] for n in SWEEP_NAMES}
    assert [served[f"draft-n{k}"]["n_max"] for k in (2, 4, 8)] == [2, 4, 8]
    assert served["ngram"]["type"] == "ngram-simple"
    assert served["suffix"]["type"] == "suffix"
    assert served["auto"]["type"] == "suffix,draft-simple" and served["auto"]["adaptive"]
    assert not served["suffix"]["adaptive"]
    rows = load(out / "report.json")["configurations"]
    assert {r["name"] for r in rows} == SWEEP_NAMES
    assert all(r["equal_work"] for r in rows)  # greedy: every configuration matches the baseline
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5, 6]
    speedups = [r["speedup"] for r in rows]
    assert speedups == sorted(speedups, reverse=True)
    assert "rank" in captured.out and "draft-simple n-max 8" in captured.out
    assert "## ngram-simple (ngram.json)" in (out / "report.md").read_text(encoding="utf-8")
    assert_servers_stopped(out)


def test_configurations_with_unequal_work_are_listed_but_not_ranked(tmp_path):
    base = compare.load_run(bench_file(tmp_path / "b.json", "none", [
        request("a", 1, 1.0, content="same"), request("b", 1, 1.0, content="same")]), "baseline")
    variants = {"slow": (0.8, "same"), "fast": (0.4, "same"), "wrong": (0.1, "other")}
    entries = []
    for name, (wall, content) in variants.items():
        reqs = [request("a", 1, wall, content=content), request("b", 1, wall, content="same")]
        cand = compare.load_run(bench_file(tmp_path / f"{name}.json", name, reqs), name)
        variant = plan.Variant(name, "ngram-simple")
        entries.append((variant, cand, compare.compare_runs(base, cand)))

    rows = ranking.ranking(entries)
    assert [(r["name"], r["rank"]) for r in rows] == [("fast", 1), ("slow", 2), ("wrong", None)]
    assert rows[0]["speedup"] == pytest.approx(2.0 / 0.8)
    assert rows[2]["speedup"] is None and "a: content differs" in rows[2]["reasons"][0]
    text = ranking.render_ranking(rows)
    assert "not comparable" in text and "wrong: not comparable: a: content differs" in text


def test_server_that_fails_to_load_is_reported_with_its_log(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    args = bench_args("--model", str(missing), "--spec-type", "ngram-simple", "--passes", "1",
                      "--out-dir", str(tmp_path / "out"), "--load-timeout", "120")
    with pytest.raises(TandemError, match="exited with status") as e:
        bench.run(args)
    assert "no-such-model.gguf" in str(e.value)
    assert (tmp_path / "out" / "baseline.server.log").exists()
    assert not (tmp_path / "out" / "candidate.json").exists()


def test_failed_client_run_shows_why_and_stops_the_server(models, tmp_path):
    long_prompt = [{"task": "long", "prompt": "The quick brown fox jumps over the lazy dog. " * 8}]
    args = quick(models, tmp_path, long_prompt, "--spec-type", "ngram-simple")
    args[args.index("--ctx-size") + 1] = "64"
    with pytest.raises(TandemError, match="benchmark client failed") as e:
        bench.run(bench_args(*args))
    assert "--ctx-size" in str(e.value)  # the server's answer, relayed by the client
    assert_servers_stopped(tmp_path / "out")


def test_ctrl_c_stops_the_server(models, tmp_path, monkeypatch, capsys):
    seen = []

    def interrupted(command, server):
        seen.append((server, server.health()))
        raise KeyboardInterrupt

    monkeypatch.setattr(servers, "run_client", interrupted)
    assert bench.run(bench_args(*quick(models, tmp_path, PROMPTS, "--spec-type", "none"))) == 130
    [(server, health)] = seen
    assert health == 200  # it was serving when the interrupt came
    assert server.process.poll() is not None
    assert "interrupted; servers stopped" in capsys.readouterr().err
    assert_servers_stopped(tmp_path / "out")


def no_server(*args) -> None:
    raise AssertionError("a server was started although the flags are bad")


@pytest.mark.parametrize("argv, phrase", [
    (["--passes", "0"], "--passes must be >= 1, got 0"),
    (["--sweep", "--spec-type", "ngram-simple"], "--sweep chooses the spec types itself"),
    (["--model", "t.gguf"], "nothing to speculate with"),
    (["--model", "t.gguf", "--spec-type", "draft-simple"], "needs a draft model"),
    (["--spec-type", "medusa"], "unknown spec type 'medusa'"),
    (["--spec-draft-n-min", "6", "--spec-draft-n-max", "4"], "n-min <= n-max"),
    (["--client", "nowhere.py"], "'nowhere.py' does not exist"),
    (["--prompts", "BAD"], "prompts.jsonl:1: not valid JSON"),
])
def test_bad_flags_fail_before_any_server_starts(tmp_path, monkeypatch, argv, phrase):
    monkeypatch.setattr(servers, "measure_interleaved", no_server)
    bad = tmp_path / "prompts.jsonl"
    bad.write_text("{not json\n", encoding="utf-8")
    argv = [str(bad) if a == "BAD" else a for a in argv]
    with pytest.raises(TandemError, match=re.escape(phrase)):
        bench.run(bench_args(*argv, "--out-dir", str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_results_are_never_written_over(tmp_path, monkeypatch):
    monkeypatch.setattr(servers, "measure_interleaved", no_server)
    out = tmp_path / "out"
    out.mkdir()
    (out / "baseline.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TandemError, match="exists and is not an empty folder"):
        bench.run(bench_args("--spec-type", "ngram-simple", "--out-dir", str(out)))
    assert (out / "baseline.json").read_text(encoding="utf-8") == "{}"


def test_each_server_gets_the_bench_settings_under_tandem_serves_own_flags(tmp_path):
    args = bench_args("--model", "t.gguf", "--model-draft", "d.gguf", "--sweep",
                      "--ctx-size", "300", "--threads", "2", "--dtype", "float32",
                      "--weights", "dense", "--activations", "int8", "--spec-draft-n-min", "3",
                      "--spec-draft-p-min", "0.5", "--spec-draft-window", "64",
                      "--spec-ngram-size-m", "5", "--out-dir", str(tmp_path / "out"))
    p = plan.make_plan(args)
    parser = flags.Parser(prog="tandem serve")
    serve_cli.add_arguments(parser)

    def served(name: str):
        variant = next(v for v in p.variants if v.name == name)
        command = servers.serve_command(p, variant, 8123)
        assert command[:len(servers.SERVE)] == servers.SERVE
        ns = parser.parse_args(command[len(servers.SERVE):])  # what `tandem serve` will read
        return command, ns, flags.engine_config(ns), flags.spec_config(ns)

    command, ns, engine, spec = served("draft-n2")
    assert (ns.model, ns.model_draft, ns.host, ns.port) == ("t.gguf", "d.gguf", "127.0.0.1", 8123)
    assert (engine.ctx_size, engine.n_parallel, engine.n_threads) == (300, 1, 2)
    assert (engine.dtype, engine.weights, engine.activations) == ("float32", "dense", "int8")
    assert spec.types == ["draft-simple"]
    # the sweep's n-max 2, with n-min lowered to fit it; the other settings as given
    assert (spec.n_max, spec.n_min, spec.p_min, spec.draft_window) == (2, 2, 0.5, 64)
    assert "--api-key" not in command and "--passes" not in command  # bench-only flags stay

    command, ns, engine, spec = served("ngram")
    assert ns.model_draft is None and "--model-draft" not in command  # nothing to load
    assert (spec.types, spec.ngram_m, spec.n_min) == (["ngram-simple"], 5, 3)
    assert served("auto")[3].adaptive


def test_report_without_matplotlib_skips_the_plot_and_says_so(tmp_path, monkeypatch, capsys,
                                                              no_matplotlib):
    def measured(p, todo):  # the client files of a finished run, without any server
        walls = {"baseline": 1.0, "candidate": 0.5}
        return [Path(bench_file(p.out_dir / f"{v.name}.json", v.name,
                                [request("a", r, walls[v.name]) for r in (0, 1)])) for v in todo]

    monkeypatch.setattr(servers, "measure_interleaved", measured)
    out = tmp_path / "out"
    assert bench.run(bench_args("--spec-type", "ngram-simple", "--out-dir", str(out))) == 0
    err = capsys.readouterr().err
    assert "tandem bench: skipped speedup.png: matplotlib is not installed " \
           "(pip install 'tandem[plot]')" in err.splitlines()
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.json", "command.txt"}
    assert not (out / "speedup.png").exists()
    assert load(out / "report.json")["overall"]["speedup"] == pytest.approx(2.0)


def test_client_is_found_in_the_source_tree():
    client = plan.find_client(None)
    assert client.name == "speculative-benchmark.py" and client.is_file()


# ---- --llama-server: llama.cpp on the same client ----------------------------------------------


def fake_llama_server(tmp_path: Path) -> str:
    """An executable that takes llama-server's command line: `tandem serve` is llama-server
    compatible, so the whole --llama-server path runs here without a llama.cpp build."""
    exe = tmp_path / "llama-server"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m tandem.cli serve "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def test_llama_server_configurations_run_in_the_same_turns(models, tmp_path):
    out = tmp_path / "out"
    exe = fake_llama_server(tmp_path)
    args = quick(models, tmp_path, PROMPTS, "--passes", "2", "--llama-server", exe,
                 "--interleave", "pass")
    assert bench.run(bench_args(*args)) == 0

    names = {p.stem for p in out.glob("*.json")} - {"report"}
    assert names == {"baseline", "candidate", "llama-none", "llama-draft", "llama-ngram"}
    commands = (out / "command.txt").read_text(encoding="utf-8")
    target, draft = models
    for spec in ("none", "ngram-simple"):
        assert f"{exe} --model {target} --threads" in commands
        assert f"--spec-type {spec}" in commands
    assert f"--spec-type draft-simple --model-draft {draft}" in commands
    # every configuration was measured in both passes, in turns (--interleave pass: a whole
    # pass per server): pass 1 in order, pass 2 reversed
    assert "--tasks" not in commands
    order = re.findall(r"# (\S+): client, pass (\d)", commands)
    first = [n for n, p in order if p == "1"]
    assert first == ["baseline", "candidate", "llama-none", "llama-draft", "llama-ngram"]
    assert [n for n, p in order if p == "2"] == first[::-1]
    rows = load(out / "report.json")["llama_cpp"]
    assert [r["name"] for r in rows] == ["baseline", "candidate", "llama-none", "llama-draft",
                                         "llama-ngram"]
    llama_alone = rows[2]
    assert llama_alone["vs_llama_alone"] == pytest.approx(1.0)
    assert all(r["same_text_as_llama"] == r["tasks"] == 2 for r in rows)  # all greedy Tandem
    assert all(r["tokens"] == rows[0]["tokens"] for r in rows)  # the same budget everywhere
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## llama.cpp on the same client" in report
    assert "| llama.cpp draft-simple (llama-draft.json) |" in report
    assert_servers_stopped(out)


def test_llama_server_must_be_an_executable(models, tmp_path):
    missing = tmp_path / "no-llama-server"
    with pytest.raises(TandemError, match="--llama-server .* is not an executable file"):
        bench.run(bench_args(*quick(models, tmp_path, PROMPTS, "--llama-server", str(missing))))
    assert not (tmp_path / "out").exists()  # refused before any folder or server


def test_llama_spec_types_choose_llama_cpp_configurations(models, tmp_path):
    exe = fake_llama_server(tmp_path)
    args = bench_args(*quick(models, tmp_path, PROMPTS, "--llama-server", exe,
                             "--llama-spec-types", "ngram-mod,ngram-map-k"))
    p = plan.make_plan(args)
    got = [(v.name, v.spec_type, v.uses_draft) for v in p.llama_variants()]
    assert got == [("llama-none", "none", False), ("llama-ngram-mod", "ngram-mod", False),
                   ("llama-ngram-map-k", "ngram-map-k", False)]
    assert "--spec-type ngram-mod" in " ".join(servers.llama_command(p, p.llama_variants()[1],
                                                                     8080))
    (tmp_path / "b").mkdir()
    bad = bench_args(*quick(models, tmp_path / "b", PROMPTS, "--llama-server", exe,
                            "--llama-spec-types", "ngram-simple,eagle"))
    with pytest.raises(TandemError, match="--llama-spec-types: unknown type 'eagle'"):
        plan.make_plan(bad)


def test_side_by_side_is_against_llama_cpp_alone(tmp_path):
    def run(name, walls, contents=("a", "b"), **prompt):
        reqs = [request(t, p, w / 2, ms=500.0, n=10, content=c, **prompt)
                for p, w in enumerate(walls) for t, c in zip("ab", contents)]
        return name, compare.load_run(bench_file(tmp_path / f"{name}.json", name, reqs), name)

    runs = [run("baseline", [2.5, 2.6]), run("candidate", [1.6, 1.1], ("a", "other")),
            run("llama-none", [2.0, 2.2], prompt_ms=250.0, prompt_n=50)]
    rows = {r["name"]: r for r in sidebyside.side_by_side(runs)}
    cand = rows["candidate"]
    assert cand["vs_llama_alone"] == pytest.approx(2.1 / 1.35)  # medians of the pass totals
    assert cand["range"] == pytest.approx((2.0 / 1.6, 2.2 / 1.1))  # pass by pass
    assert rows["baseline"]["vs_llama_alone"] == pytest.approx(2.1 / 2.55)
    # 2 x 9 tokens after each answer's first per 1000 ms of predicted_ms
    assert cand["decode_tokens_per_second"] == pytest.approx(18.0)
    assert (cand["same_text_as_llama"], cand["same_text_as_tandem"]) == (1, 1)
    assert rows["llama-none"]["same_text_as_tandem"] == 2
    assert rows["llama-none"]["prompt_tokens_per_second"] == pytest.approx(200.0)
    assert cand["prompt_tokens_per_second"] is None  # not reported: shown as "-"
    text = sidebyside.side_by_side_markdown(sidebyside.side_by_side(runs))
    # over each engine's own target alone, the first pass apart from the later ones (where
    # a configuration remembering earlier requests may answer a repeated prompt from memory)
    assert cand["vs_own_first"] == pytest.approx(2.5 / 1.6)
    assert cand["vs_own_later"] == pytest.approx(2.6 / 1.1)
    assert rows["llama-none"]["vs_own_first"] == pytest.approx(1.0)
    assert ("| candidate (candidate.json) | 1.35 (1.10-1.60) | 1.56x (1.25-2.00) | "
            "1.56x / 2.36x | - | 18.0 |") in text
    assert ("| llama-none (llama-none.json) | 2.10 (2.00-2.20) | 1.00x (1.00-1.00) | "
            "1.00x / 1.00x | 200.0 |") in text


def test_side_by_side_speedup_over_own_target_alone(tmp_path):
    """A llama.cpp configuration is measured against llama.cpp alone, Tandem's against Tandem
    alone; one pass gives no later figure."""
    def run(name, walls):
        reqs = [request(t, p, w / 2, ms=500.0, n=10, content="x")
                for p, w in enumerate(walls) for t in "ab"]
        return name, compare.load_run(bench_file(tmp_path / f"{name}.json", name, reqs), name)

    runs = [run("baseline", [3.0, 3.0, 3.0]), run("candidate", [2.0, 1.5, 1.0]),
            run("llama-none", [4.0, 4.0, 4.0]), run("llama-ngram-mod", [3.2, 2.0, 1.6])]
    rows = {r["name"]: r for r in sidebyside.side_by_side(runs)}
    assert rows["candidate"]["vs_own_first"] == pytest.approx(1.5)
    assert rows["candidate"]["vs_own_later"] == pytest.approx((2.0 + 3.0) / 2)
    assert rows["llama-ngram-mod"]["vs_own_first"] == pytest.approx(1.25)
    assert rows["llama-ngram-mod"]["vs_own_later"] == pytest.approx((2.0 + 2.5) / 2)
    one = [(n, compare.load_run(bench_file(tmp_path / f"{n}1.json", n, [
        request(t, 0, 1.0, ms=500.0, n=10, content="x") for t in "ab"]), n))
        for n in ("baseline", "llama-none")]
    (row, _) = sidebyside.side_by_side(one)
    assert row["vs_own_later"] is None
    assert "| 1.00x / - |" in sidebyside.side_by_side_markdown([row])


# ---- --load: concurrent streamed requests -------------------------------------------------------


def test_load_mode_measures_every_server_at_every_concurrency_level(models, tmp_path, capsys):
    out = tmp_path / "out"
    exe = fake_llama_server(tmp_path)
    args = quick(models, tmp_path, PROMPTS, "--spec-type", "suffix", "--load", "-np", "2",
                 "--concurrency", "1,2", "--llama-server", exe, "--llama-spec-types",
                 "ngram-simple")
    assert bench.run(bench_args(*args)) == 0
    captured = capsys.readouterr()
    commands = (out / "command.txt").read_text(encoding="utf-8")
    # every server got two slots sharing the same total context (llama-server's meaning)
    assert commands.count("--parallel 2") == 4
    assert commands.count("--ctx-size 256 --parallel 2") == 4
    # each level: one streamed client run per server, in turns that flip from level to level
    runs = re.findall(r"# (\S+): client, pass 1, concurrency (\d)", commands)
    names = ["baseline", "candidate", "llama-none", "llama-ngram"]
    assert [n for n, c in runs if c == "1"] == names
    assert [n for n, c in runs if c == "2"] == names[::-1]
    assert commands.count("--stream --concurrency 2") == 4
    rows = load(out / "load.json")["rows"]
    assert [(r["concurrency"], r["configuration"]) for r in rows] == \
        [(c, n) for c in (1, 2) for n in names]
    for r in rows:
        assert r["requests"] == 2 and r["output_tokens"] == 8 + 6
        assert r["throughput_tok_s"] > 0 and r["ttft_s"]["p50"] > 0
        assert r["equal_text"]  # greedy: slots and speculation never change a text
    assert rows[0]["vs_alone"] == pytest.approx(1.0)
    for c in (1, 2):
        run = load(out / f"load-c{c}-candidate.json")
        assert len(run["load_runs"]) == 1 and run["settings"]["concurrency"] == c
        assert all(isinstance(r["ttft_s"], float) for r in run["requests"])
    assert "## Under load (--parallel 2" in (out / "load.md").read_text(encoding="utf-8")
    assert "output tok/s" in captured.out
    assert_servers_stopped(out)


def test_load_mode_flags_are_checked_before_any_server_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(servers, "serving", no_server)
    for argv, phrase in ((["--load", "--sweep"], "--load and --sweep are separate runs"),
                         (["--load", "--concurrency", "0,2"], "--concurrency must list")):
        with pytest.raises(TandemError, match=re.escape(phrase)):
            bench.run(bench_args("--spec-type", "ngram-simple", *argv,
                                 "--out-dir", str(tmp_path / "out")))
