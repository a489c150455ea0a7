#!/usr/bin/env python3
"""One coding task, done by the `openai-agents` SDK's own agent loop (Agent + Runner) against a
llama.cpp-compatible server: the agent `tandem bench --agent openai-agents` runs.

The loop, the tool-call handling and the requests are the SDK's; this file only gives it four
function tools over one repository (list_files, read_file, write_file, run_tests) and the task.
It runs with the Python of a separate environment that has the SDK (`pip install
openai-agents pytest`), never Tandem's:

    AGENT_PYTHON scripts/openai-agents-runner.py --base-url http://127.0.0.1:8080/v1 \
        --repo TASK_REPO --instruction "Fix the failing test." [--api responses|chat]

--api responses (the SDK's default model, OpenAIResponsesModel: POST /v1/responses) or chat
(OpenAIChatCompletionsModel: POST /v1/chat/completions). Greedy (temperature 0), streamed
(Runner.run_streamed, so a proxy in between sees each turn's first token). run_tests runs
pytest -qq, whose output has no durations, so that two runs that did the same work read the
same.

Exit status: 0 when the agent finished; 3 when it ran out of --max-turns; 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

INSTRUCTIONS = (
    "You are a coding agent working in a small Python repository. Use the tools: list_files to "
    "see the files, read_file to read one, write_file to replace a file's whole content, and "
    "run_tests to run the repository's tests. Make the change the user asks for, then run the "
    "tests, and stop when they pass. Answer briefly when you are done.")
OUTPUT_LIMIT = 6000  # characters of a tool's output given back to the model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="the server's OpenAI base URL (…/v1)")
    p.add_argument("--repo", required=True, help="the task's repository (the tools' root)")
    p.add_argument("--instruction", required=True)
    p.add_argument("--api", choices=("responses", "chat"), default="responses")
    p.add_argument("--model", default="tandem", help="the model name sent (servers ignore it)")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=2048, help="per model turn")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    return p.parse_args()


def make_tools(root: Path, function_tool):
    def inside(path: str) -> Path:
        target = (root / path).resolve()
        if root != target and root not in target.parents:
            raise ValueError(f"{path} is outside the repository")
        return target

    @function_tool
    def list_files() -> str:
        """List the repository's files, one path a line."""
        return "\n".join(sorted(str(p.relative_to(root)) for p in root.rglob("*")
                                if p.is_file() and ".git" not in p.parts
                                and "__pycache__" not in p.parts))

    @function_tool
    def read_file(path: str) -> str:
        """Read one file of the repository.

        Args:
            path: the file's path, relative to the repository root.
        """
        return inside(path).read_text(encoding="utf-8")[:OUTPUT_LIMIT]

    @function_tool
    def write_file(path: str, content: str) -> str:
        """Write a file of the repository, replacing its whole content.

        Args:
            path: the file's path, relative to the repository root.
            content: the file's new, complete content.
        """
        target = inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {path} ({len(content)} characters)"

    @function_tool
    def run_tests() -> str:
        """Run the repository's tests (python -m pytest -qq) and return their output."""
        done = subprocess.run([sys.executable, "-m", "pytest", "-qq", "-p", "no:cacheprovider"],
                              cwd=root, capture_output=True, text=True, timeout=300)
        out = done.stdout + done.stderr
        return f"exit status {done.returncode}\n{out[-OUTPUT_LIMIT:]}"

    return [list_files, read_file, write_file, run_tests]


async def run(args: argparse.Namespace) -> int:
    from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel,
                        OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.base_url, api_key="none", max_retries=0,
                         timeout=args.timeout)
    kind = OpenAIResponsesModel if args.api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(name="coder", instructions=INSTRUCTIONS,
                  tools=make_tools(Path(args.repo).resolve(), function_tool),
                  model=kind(model=args.model, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=args.max_tokens))
    result = Runner.run_streamed(agent, input=args.instruction, max_turns=args.max_turns)
    try:
        async for event in result.stream_events():
            if event.type == "run_item_stream_event":
                print(f"[{event.name}] {_describe(event.item)}", flush=True)
    except MaxTurnsExceeded as e:
        print(f"stopped: {e}", flush=True)
        return 3
    print(f"final: {result.final_output}", flush=True)
    return 0


def _describe(item) -> str:
    raw = getattr(item, "raw_item", None)
    name = getattr(raw, "name", None) or (raw.get("name") if isinstance(raw, dict) else None)
    text = getattr(item, "output", None)
    return (name or "") + ("" if text is None else " -> " + str(text)[:200].replace("\n", " | "))


def main() -> int:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    args = parse_args()
    try:
        return asyncio.run(run(args))
    except Exception as e:  # the SDK's or the server's error: said, and a failed run
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
