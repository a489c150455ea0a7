"""`tandem bench --agent`: small coding tasks done end to end by real agent clients against
Tandem alone, Tandem with speculation and llama-server, in the same turns.

    tandem bench --agent aider,openai-agents \
        --agent-python /venvs/aider/bin/python,/venvs/sdk/bin/python \
        --agent-tasks bench/agent_tasks --llama-server PATH/llama-server \
        --llama-spec-types ngram-mod --ctx-size 8192 --passes 1 --out-dir OUT

The agents are not written here and Tandem does not depend on them: each runs as a subprocess
with the Python of its own environment (--agent-python):
- `aider` (pip install aider-chat): `python -m aider --message INSTRUCTION FILES...` against the
  OpenAI-compatible chat completions API, edit format `whole`, temperature 0, no repository map,
  no commits, analytics or update checks;
- `openai-agents` (pip install openai-agents pytest): the SDK's Agent and Runner with four
  function tools over the task repository (scripts/openai-agents-runner.py), temperature 0, at
  most --agent-max-turns model turns; its model speaks the Responses API (--agent-api
  responses, the SDK's default) or chat completions (--agent-api chat).

A task is a folder of --agent-tasks: `task.json` ({"instruction", "files", "what"}), `repo/` (the
files of a throw-away git repository made afresh for every run, always at the same path so
that every configuration's agent sees the same prompt) and `check/` (files copied over the
repository after the agent has finished: hidden tests, or the original tests back). Success:
`python -m pytest -q` in the repository passes afterwards.

Every configuration (Tandem alone = `baseline`, Tandem with speculation = `candidate`: --spec-type,
else `auto` with the draft; with --llama-server, the types of --llama-spec-types, and llama.cpp
alone with --agent-llama-alone) is served at once; each agent talks to its server through a recording proxy
(recorder.py) that times every request: its first content (the turn's first-token delay), its
end, its tokens, tool calls and the server's timings (tokens drafted and accepted). The runs go
task by task and agent by agent, every configuration before the next, the order reversed every
step (servers.py's ABBA turns); --passes repeats the whole round (repetitions).

The out dir: command.txt (every server and agent command), results.json (one record per run,
rewritten after each: the requests as recorded, the agent's last output lines, the diff it left,
the check's verdict), report.md / report.json (agentreport.py: success, wall time, speed-ups,
first-token delays, drafts, and whether speculation left each transcript unchanged), the
servers' logs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError
from . import agentreport, servers
from .plan import BASELINE, Plan, say
from .recorder import Recorder

AGENTS = ("aider", "openai-agents")
TASKS = Path("bench") / "agent_tasks"  # relative to the repository root
SDK_RUNNER = Path("scripts") / "openai-agents-runner.py"
MODEL_NAME = "bench-model"  # the name the agents send; both servers ignore it
TAIL = 1500  # characters of an agent's output kept per run
DIFF_LIMIT = 4000  # characters of the diff an agent left, kept per run


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    root: Path  # the task's folder: task.json, repo/, check/
    instruction: str
    files: tuple[str, ...]  # the files named to the agent (aider's chat files)
    what: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("agent benchmark (--agent)")
    # dest agent_clients: `tandem serve` has an --agent flag (its tools), and bench writes the
    # servers' command lines from its own namespace
    g.add_argument("--agent", dest="agent_clients", default=None, metavar="NAMES",
                   help="run coding tasks end to end with these agent clients instead of the "
                        "prompts, comma-separated: aider, openai-agents (--passes: repetitions)")
    g.add_argument("--agent-python", default=None, metavar="PATHS",
                   help="--agent: the Python of each agent's own environment, comma-separated "
                        "in --agent's order (one path: the same for all)")
    g.add_argument("--agent-tasks", default=None, metavar="DIR",
                   help=f"--agent: the task folders (default: {TASKS} in the source tree)")
    g.add_argument("--agent-task-names", default=None, metavar="NAMES",
                   help="--agent: only these tasks, comma-separated (default: every task)")
    g.add_argument("--agent-api", choices=("responses", "chat"), default="responses",
                   help="--agent openai-agents: the API its model speaks (responses)")
    g.add_argument("--agent-max-turns", type=int, default=8,
                   help="--agent openai-agents: model turns per task (8)")
    g.add_argument("--agent-max-tokens", type=int, default=2048,
                   help="--agent: tokens per model turn (2048)")
    g.add_argument("--agent-llama-alone", action="store_true",
                   help="--agent with --llama-server: also llama.cpp's target alone (default: "
                        "only the types of --llama-spec-types)")
    g.add_argument("--agent-timeout", type=float, default=900.0,
                   help="--agent: seconds one agent run may take before it is stopped (900)")


# ---- tasks and their repositories -------------------------------------------------------------


def task_folder(args: argparse.Namespace) -> Path:
    import tandem

    if args.agent_tasks:
        return Path(args.agent_tasks)
    return Path(tandem.__file__).resolve().parents[2] / TASKS


def load_tasks(folder: Path, names: str | None = None) -> list[Task]:
    """Every task of `folder` (sorted by name), or those of `names` in that order."""
    if not folder.is_dir():
        raise TandemError(f"--agent-tasks {str(folder)!r} is not a folder")
    found = {p.parent.name: p.parent for p in sorted(folder.glob("*/task.json"))}
    wanted = [n.strip() for n in names.split(",") if n.strip()] if names else sorted(found)
    missing = [n for n in wanted if n not in found]
    if missing or not wanted:
        raise TandemError(f"--agent-task-names: no task {', '.join(missing) or '(none given)'} "
                          f"in {folder}; there are: {', '.join(sorted(found)) or 'none'}")
    tasks = []
    for name in wanted:
        try:
            spec = json.loads((found[name] / "task.json").read_text(encoding="utf-8"))
            task = Task(name, found[name], spec["instruction"], tuple(spec["files"]),
                        spec.get("what", ""))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TandemError(f"{found[name] / 'task.json'}: {e}") from None
        if not (task.root / "repo").is_dir():
            raise TandemError(f"task {name}: no repo/ folder in {task.root}")
        tasks.append(task)
    return tasks


def _git(repo: Path, *words: str) -> str:
    cmd = ["git", "-c", "user.name=tandem-bench", "-c", "user.email=bench@localhost",
           "-c", "commit.gpgsign=false", *words]
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise TandemError(f"git {' '.join(words)} in {repo}: {done.stderr.strip()}")
    return done.stdout


def prepare_repo(task: Task, repo: Path) -> None:
    """A fresh git repository at `repo` with the task's files, committed."""
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(task.root / "repo", repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "tandem-bench")  # aider reads them
    _git(repo, "config", "user.email", "bench@localhost")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"task {task.name}")


def left_diff(repo: Path) -> str:
    """What the agent changed: the diff against the task's commit, new files included."""
    _git(repo, "add", "-A")
    return _git(repo, "diff", "--cached", "--stat", "-p")


def check_repo(task: Task, repo: Path, python: str = sys.executable,
               timeout: float = 300.0) -> dict:
    """Copy the task's check/ files over the repository and run its tests: passed, pytest's
    last line, the output's tail."""
    check = task.root / "check"
    if check.is_dir():
        shutil.copytree(check, repo, dirs_exist_ok=True)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    except subprocess.TimeoutExpired:
        return {"passed": False, "summary": f"timed out after {timeout:g} s", "output": ""}
    out = (done.stdout + done.stderr).strip()
    last = out.splitlines()[-1] if out else ""
    return {"passed": done.returncode == 0, "summary": last, "output": out[-TAIL:]}


# ---- the agents --------------------------------------------------------------------------------


def agent_pythons(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(agent, its Python) for --agent and --agent-python, checked."""
    agents = [a.strip() for a in args.agent_clients.split(",") if a.strip()]
    bad = [a for a in agents if a not in AGENTS]
    if bad or not agents:
        raise TandemError(f"--agent: unknown agent {', '.join(bad) or '(none)'}; choose from "
                          f"{', '.join(AGENTS)}")
    if not args.agent_python:
        raise TandemError("--agent needs --agent-python: the Python of the environment where "
                          "the agent is installed (never Tandem's own)")
    paths = [p.strip() for p in args.agent_python.split(",") if p.strip()]
    if len(paths) == 1:
        paths *= len(agents)
    if len(paths) != len(agents):
        raise TandemError(f"--agent-python names {len(paths)} paths for {len(agents)} agents")
    for path in paths:
        if not (Path(path).is_file() and os.access(path, os.X_OK)):
            raise TandemError(f"--agent-python {path!r} is not an executable file")
    return list(zip(agents, paths))


def write_aider_settings(home: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """aider's model settings (whole-file edits, temperature 0, the token cap) and metadata
    (context size, no cost) for the model name the agents send."""
    home.mkdir(parents=True, exist_ok=True)
    name = f"openai/{MODEL_NAME}"
    settings = home / "aider-model-settings.yml"
    settings.write_text(f"- name: {name}\n  edit_format: whole\n  use_temperature: true\n"
                        f"  extra_params:\n    max_tokens: {args.agent_max_tokens}\n",
                        encoding="utf-8")
    metadata = home / "aider-model-metadata.json"
    metadata.write_text(json.dumps({name: {
        "max_input_tokens": int(args.ctx_size), "max_output_tokens": args.agent_max_tokens,
        "max_tokens": int(args.ctx_size), "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}}),
        encoding="utf-8")
    return settings, metadata


def agent_command(agent: str, python: str, task: Task, repo: Path, url: str,
                  args: argparse.Namespace, home: Path) -> list[str]:
    """The agent's command line for one run (it runs in `repo`)."""
    if agent == "aider":
        settings, metadata = write_aider_settings(home, args)
        return [python, "-m", "aider", "--model", f"openai/{MODEL_NAME}",
                "--openai-api-base", f"{url}/v1", "--openai-api-key", "none",
                "--model-settings-file", str(settings), "--model-metadata-file", str(metadata),
                "--edit-format", "whole", "--map-tokens", "0", "--yes-always",
                "--no-auto-commits", "--no-dirty-commits", "--no-gitignore", "--no-analytics",
                "--no-check-update", "--no-show-release-notes", "--no-show-model-warnings",
                "--no-pretty", "--no-fancy-input", "--no-detect-urls",
                "--no-suggest-shell-commands", "--no-notifications", "--no-restore-chat-history",
                # no summaries of the chat in a background thread, beside the turns
                "--max-chat-history-tokens", str(int(args.ctx_size)),
                "--chat-history-file", str(home / "chat.md"),
                "--input-history-file", str(home / "input.txt"),
                "--timeout", str(int(args.agent_timeout)), "--auto-test", "--test-cmd",
                shlex.join([sys.executable, "-m", "pytest", "-qq", "-p", "no:cacheprovider"]),
                "--message", task.instruction, *task.files]
    import tandem

    runner = Path(tandem.__file__).resolve().parents[2] / SDK_RUNNER
    return [python, str(runner), "--base-url", f"{url}/v1", "--repo", str(repo),
            "--instruction", task.instruction, "--api", args.agent_api, "--model", MODEL_NAME,
            "--max-turns", str(args.agent_max_turns), "--max-tokens", str(args.agent_max_tokens),
            "--timeout", str(int(args.agent_timeout))]


def run_agent(command: list[str], cwd: Path, home: Path, timeout: float) -> dict:
    """Run one agent to its end (or stop its process group at `timeout`): exit status, wall
    seconds, the tail of what it printed."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "AIDER_", "TANDEM_", "LITELLM_"))}
    # PYTHONHASHSEED: aider lists the chat's files in the order of a set of strings, which
    # Python's per-process hash seed would change from run to run (another prompt)
    env.update(HOME=str(home), LITELLM_LOCAL_MODEL_COST_MAP="True", NO_COLOR="1",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONHASHSEED="0",
               OPENAI_AGENTS_DISABLE_TRACING="1", PYTHONUNBUFFERED="1", TERM="dumb")
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc, timed_out = p.wait(), True
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise
        wall = time.monotonic() - start
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(wall, 3), "output": text[-TAIL:]}


# ---- the runs ------------------------------------------------------------------------------------


def run_agents(plan: Plan) -> int:
    """Every task with every agent on every configuration, in turns; writes results.json after
    each run and the report at the end. 0 when Tandem's speculation left every transcript
    unchanged, 1 when not."""
    a = plan.args
    if a.sweep or a.load:
        raise TandemError("--agent runs its own configurations; drop --sweep / --load")
    tasks = load_tasks(task_folder(a), a.agent_task_names)
    agents = agent_pythons(a)
    scratch = Path(tempfile.gettempdir()) / f"tandem-agent-bench-{os.getpid()}"
    runs: list[dict] = []
    todo = [BASELINE, *plan.variants, *(v for v in plan.llama_variants()
                                         if a.agent_llama_alone or v.spec_type != "none")]
    try:
        with servers.serving(plan, todo) as served, _recorders(served) as recorders:
            steps = [(r, t, ag) for r in range(a.passes) for t in tasks for ag in agents]
            for i, (r, task, (agent, python)) in enumerate(steps):
                order = list(zip(served, recorders))
                for (variant, _label, server), rec in (order if i % 2 == 0 else order[::-1]):
                    say(f"round {r + 1}/{a.passes}, {task.name}, {agent}: {variant.name}")
                    run = run_one(plan, task, agent, python, variant.name, rec,
                                  scratch / task.name)
                    runs.append({"round": r, **run})
                    say(f"    {'passed' if run['check']['passed'] else 'FAILED'} in "
                        f"{run['wall_s']:.1f} s, {len(run['requests'])} requests; "
                        f"{run['check']['summary']}")
                    _write_results(plan, runs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    names = {v.name: ("Tandem " if v.engine == "tandem" else "llama.cpp ")
             + ("alone" if v.spec_type == "none" else v.spec_type) for v in todo}
    report = agentreport.report(runs, [v.name for v in todo], names)
    (plan.out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n",
                                              encoding="utf-8")
    markdown = agentreport.markdown(report, plan.command)
    (plan.out_dir / "report.md").write_text(markdown, encoding="utf-8")
    sys.stdout.write(markdown)
    say(f"results in {plan.out_dir}")
    return 0 if report["speculation_kept_transcripts"] else 1


def run_one(plan: Plan, task: Task, agent: str, python: str, variant: str, rec: Recorder,
            repo: Path) -> dict:
    """One agent run on one configuration: a fresh repository, the agent through the proxy,
    the check. The record of results.json."""
    a = plan.args
    home = repo.parent / f"home-{agent}"
    prepare_repo(task, repo)
    command = agent_command(agent, python, task, repo, rec.url, a, home)
    plan.note(f"# {task.name}, {agent}, {variant}: agent (in {repo})\n{shlex.join(command)}")
    rec.take()  # nothing from earlier runs
    rec.mark()
    ran = run_agent(command, repo, home, a.agent_timeout)
    requests = rec.take()
    diff = left_diff(repo)
    check = check_repo(task, repo)
    return {"task": task.name, "agent": agent, "config": variant, **ran,
            "diff": diff[:DIFF_LIMIT], "diff_chars": len(diff), "check": check,
            "requests": requests}


class _recorders:
    """One recording proxy per served configuration, closed on the way out."""

    def __init__(self, served: list) -> None:
        self.recorders = [Recorder(server.url) for _, _, server in served]

    def __enter__(self) -> list[Recorder]:
        for rec in self.recorders:
            rec.__enter__()
        return self.recorders

    def __exit__(self, *exc) -> None:
        for rec in self.recorders:
            rec.__exit__(*exc)


def _write_results(plan: Plan, runs: list[dict]) -> None:
    """results.json: the runs so far, one JSON object a line inside the list (small diffs)."""
    lines = ",\n".join(json.dumps(r, ensure_ascii=False) for r in runs)
    (plan.out_dir / "results.json").write_text(f"[\n{lines}\n]\n", encoding="utf-8")
