#!/usr/bin/env python3
"""Measure a llama.cpp-compatible server on the same work, pass after pass.

Standard library only: this file must run under `python3 -I` against Tandem or llama-server
alike, so it imports nothing from tandem. Compare two runs with `tandem compare`.

    python scripts/speculative-benchmark.py --label baseline --output baseline.json
    python scripts/speculative-benchmark.py --label ngram --output ngram.json --url http://127.0.0.1:8081
    tandem compare baseline.json ngram.json

Output (format "tandem-bench-1"): label, settings, timestamp, the server's /props (null when it
does not answer), the tasks with their prompts, `warmup` (warm-up requests, kept for inspection
and never measured) and `requests` (the measured ones), each with task, pass, wall_s, timings
as returned, tokens_predicted, tokens_evaluated, stop_type, truncated, content, speculative.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

FORMAT = "tandem-bench-1"
EXIT_SERVER = 1  # the server is unreachable, not ready, or answered with an error
EXIT_USAGE = 2  # bad arguments or a bad --prompts file

CODE_EDIT_PROMPT = r'''You are editing a Python module. Apply the requested change and output the complete edited code, nothing else.

Change: rename the function `parse_log_line` to `parse_access_log_line` and its parameter `line` to `raw_line`, and make it return None instead of raising ValueError when the line does not match. Update every caller. Keep everything else exactly as it is, including comments and docstrings.

Original code:
```python
import re
from dataclasses import dataclass
from datetime import datetime

_LOG_PATTERN = re.compile(
    r'(?P<host>\S+) \S+ (?P<user>\S+) \[(?P<time>[^\]]+)\] '
    r'"(?P<method>[A-Z]+) (?P<path>\S+) (?P<protocol>[^"]+)" '
    r'(?P<status>\d{3}) (?P<size>\d+|-)'
)


@dataclass
class AccessLogEntry:
    host: str
    user: str | None
    time: datetime
    method: str
    path: str
    status: int
    size: int


def parse_log_line(line: str) -> AccessLogEntry:
    """Parse one line of an Apache or Nginx access log in the common log format.

    >>> entry = parse_log_line('127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /a.gif HTTP/1.0" 200 2326')
    >>> entry.status, entry.size
    (200, 2326)
    """
    match = _LOG_PATTERN.match(line.strip())
    if match is None:
        raise ValueError(f"not a common log format line: {line!r}")
    user = match["user"]
    size = match["size"]
    return AccessLogEntry(
        host=match["host"],
        user=None if user == "-" else user,
        time=datetime.strptime(match["time"], "%d/%b/%Y:%H:%M:%S %z"),
        method=match["method"],
        path=match["path"],
        status=int(match["status"]),
        size=0 if size == "-" else int(size),
    )


def count_statuses(lines: list[str]) -> dict[int, int]:
    """Count responses per HTTP status, skipping lines that do not parse."""
    counts: dict[int, int] = {}
    for line in lines:
        try:
            entry = parse_log_line(line)
        except ValueError:
            continue
        counts[entry.status] = counts.get(entry.status, 0) + 1
    return counts
```

Edited code:
```python
'''

SUMMARY_PROMPT = """Riverside Bike Share: results of the eighteen-month pilot

The city launched the Riverside Bike Share pilot in April of last year with 40 docking stations and 420 bicycles, a third of them electric-assisted, spread along the river corridor between the central station and the university campus. The pilot was funded by a regional transport grant that covered the stations, the bicycles and two years of operation, on the condition that the city publish ridership, cost and safety figures before deciding whether to make the service permanent.

Ridership grew faster than forecast. The operator recorded 612,000 trips over the eighteen months, against a forecast of 450,000, with a median trip of 2.7 kilometres and 14 minutes. Electric bicycles made up a third of the fleet but carried 52 percent of all trips, and they were the only bicycles used in significant numbers on the hilly routes to the northern districts. Weekday use peaked between 7 and 9 in the morning and between 4 and 6 in the afternoon, which the operator reads as commuting; weekend use was spread more evenly through the day and concentrated near the parks.

Costs were higher than planned. Rebalancing, the work of moving bicycles from full stations to empty ones with vans, cost 38 percent more than budgeted because the morning flow toward the centre left the residential stations empty by 8 o'clock almost every weekday. Vandalism and theft were lower than feared: 23 bicycles were lost, about five percent of the fleet. Revenue from memberships and single trips covered 61 percent of operating costs, compared with the 55 percent assumed in the grant application.

Safety figures were reassuring but incomplete. Eleven collisions involving shared bicycles were reported to the police, none fatal, which is a lower rate per trip than for privately owned bicycles in the same area. Several of the collisions happened at the two junctions on the ring road where the cycle lane ends abruptly, and the transport department has proposed protected crossings there regardless of the decision on the pilot.

The council must now decide whether to make the service permanent, expand it to the eastern districts, or end it when the grant runs out next spring. The operator proposes adding 25 stations and replacing the remaining conventional bicycles with electric ones, which it estimates would raise cost recovery to 70 percent within three years.

Write a one-paragraph summary of the report above for a council member who has two minutes to read it. Give the key figures and the decision to be made.

Summary:"""

STORY_PROMPT = """The Lighthouse Keeper's Ledger

For forty-one years the lighthouse on Carrow Point had been kept by a Maddox, and for forty-one years every Maddox had written in the same ledger: the weather at dawn and dusk, the ships that passed, the oil burned, and, in a smaller hand at the bottom of each page, anything that did not fit in the columns. Elin Maddox had read the whole ledger twice before she turned twelve. She knew that her grandfather had seen a whale beach itself on the north shingle in the winter of the great storm, that her great-aunt had rowed out alone to a fishing boat with a broken mast, and that on one night, a night in October, someone had written only four words in the small hand at the bottom of the page: The light answered back.

Nobody in the family would talk about that page. Her father closed the ledger when she asked about it, and her mother said that old keepers were lonely people who wrote strange things. But Elin had noticed that the handwriting on that line belonged to no one else in the book, and that the oil column for that night was empty, as if the lamp had not been lit at all.

The winter Elin turned sixteen, her father fell ill and the keeping of the light passed to her. The first nights were long and cold and uneventful. She trimmed the wick, wound the clockwork that turned the lens, and wrote the weather in the columns as she had been taught. Then, on the ninth night of October, a little after two in the morning, she looked out from the gallery and saw, far out beyond the reef where no ship should be, a light blinking back at her, matching the rhythm of her own lamp beat for beat.

She went down the iron stairs, opened the ledger, and began to write."""

BUILTIN_TASKS = [
    {"task": "code-edit", "prompt": CODE_EDIT_PROMPT},
    {"task": "summary", "prompt": SUMMARY_PROMPT},
    {"task": "story", "prompt": STORY_PROMPT},
]

DESCRIPTION = """\
Measure a llama.cpp-compatible server (Tandem or llama-server) on the same work: each task's raw
prompt (no chat template) is sent to POST /completion with greedy sampling (temperature 0,
top_k 1) and cache_prompt false, so no prompt prefix is reused between requests. After --warmup
unmeasured passes, --passes passes over all tasks are recorded with the client's wall time and
the server's own timings, then compared with `tandem compare baseline.json candidate.json`."""

EPILOG = """\
What this does not measure: time to the first token (requests are not streamed; wall time
covers prompt processing and generation together), memory use, and concurrent requests (one
request at a time). Warm-up requests are kept in the output under "warmup", never in
"requests". Exit status: 0 on success, 1 when the server is unreachable or answers with an
error, 2 for bad arguments or a bad --prompts file."""


class BenchError(Exception):
    """A failure to report on stderr as one line, with an exit status."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--label", required=True, help="name of this run, e.g. baseline or ngram")
    add("--output", required=True, help="JSON file to write the results to")
    add("--url", default="http://127.0.0.1:8080", help="server base URL (default: %(default)s)")
    add("--prompts", help='JSONL file, one {"task": ..., "prompt": ..., "n_predict": ...} per '
        "line, n_predict optional (default: the 3 built-in tasks)")
    add("--passes", type=int, default=5, help="measured passes (default: %(default)s)")
    add("--warmup", type=int, default=1, help="unmeasured passes first (default: %(default)s)")
    add("--n-predict", type=int, default=256, help="tokens per request (default: %(default)s)")
    add("--seed", type=int, default=1234, help="seed sent with each request (default: %(default)s)")
    add("--timeout", type=float, default=600.0,
        help="seconds to wait for one request (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.passes < 1:
        parser.error(f"--passes must be at least 1, got {args.passes}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.n_predict < 1:
        parser.error(f"--n-predict must be at least 1, got {args.n_predict}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        parser.error(f"--output {args.output!r}: folder {out_dir!r} does not exist")
    return args


def load_tasks(path: str | None, n_predict: int) -> list[dict]:
    """The built-in tasks, or those of a JSONL file; each gets its n_predict."""
    raw = BUILTIN_TASKS if path is None else read_prompts_file(path)
    return [{**t, "n_predict": t.get("n_predict", n_predict)} for t in raw]


def read_prompts_file(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"cannot read --prompts file {path!r}: {exc}", EXIT_USAGE) from None
    tasks: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            tasks.append(parse_prompt_line(line, f"{path}:{number}", {t["task"] for t in tasks}))
    if not tasks:
        raise BenchError(f"--prompts file {path!r} has no tasks; "
                         "expected one JSON object per line", EXIT_USAGE)
    return tasks


def parse_prompt_line(line: str, where: str, seen: set[str]) -> dict:
    def bad(what: str) -> BenchError:
        expected = '{"task": "name", "prompt": "text", "n_predict": 256} (n_predict optional)'
        return BenchError(f"{where}: {what}; expected {expected}", EXIT_USAGE)

    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise bad(f"not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise bad(f"a JSON {type(item).__name__}, not an object")
    task, prompt, n_predict = item.get("task"), item.get("prompt"), item.get("n_predict")
    if not isinstance(task, str) or not task.strip():
        raise bad(f'"task" must be a non-empty string, got {task!r}')
    if task in seen:
        raise bad(f'task {task!r} appears twice')
    if not isinstance(prompt, str) or not prompt:
        raise bad(f'"prompt" must be a non-empty string, got {prompt!r}')
    unknown = sorted(set(item) - {"task", "prompt", "n_predict"})
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}")
    if n_predict is None:
        return {"task": task, "prompt": prompt}
    if not isinstance(n_predict, int) or isinstance(n_predict, bool) or n_predict < 1:
        raise bad(f'"n_predict" must be a positive integer, got {n_predict!r}')
    return {"task": task, "prompt": prompt, "n_predict": n_predict}


def http_json(url: str, body: dict | None, timeout: float) -> tuple[int, object]:
    """GET (body None) or POST JSON: (status, parsed JSON or the raw text). Raises OSError."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def error_text(answer: object) -> str:
    """The message of an OpenAI/llama.cpp-style error answer, else the answer itself, shortened."""
    if isinstance(answer, dict) and "error" in answer:
        error = answer["error"]
        answer = error.get("message", error) if isinstance(error, dict) else error
    text = answer if isinstance(answer, str) else json.dumps(answer)
    return text if len(text) <= 300 else text[:300] + "..."


def unreachable(url: str, exc: Exception) -> BenchError:
    reason = getattr(exc, "reason", exc)
    return BenchError(f"cannot reach the server at {url}: {reason}. "
                      "Is it running, and is --url right?", EXIT_SERVER)


def check_health(base: str, timeout: float) -> None:
    try:
        status, answer = http_json(f"{base}/health", None, timeout)
    except (OSError, http.client.HTTPException) as exc:
        raise unreachable(base, exc) from None
    if status == 503:
        raise BenchError(f"the server at {base} is not ready (GET /health: HTTP 503: "
                         f"{error_text(answer)}); try again once it has loaded", EXIT_SERVER)


def fetch_props(base: str, timeout: float) -> dict | None:
    """What the server says about itself; None when /props does not answer with a JSON object."""
    try:
        status, answer = http_json(f"{base}/props", None, timeout)
    except (OSError, http.client.HTTPException):
        return None
    return answer if 200 <= status < 300 and isinstance(answer, dict) else None


def completion_body(task: dict, seed: int) -> dict:
    return {
        "prompt": task["prompt"],
        "n_predict": task["n_predict"],
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": seed,
        "stream": False,
        "cache_prompt": False,
    }


def run_request(base: str, task: dict, pass_index: int, args: argparse.Namespace) -> dict:
    """One timed POST /completion; the record keeps the server's answer as returned."""
    where = f"POST {base}/completion (task {task['task']!r}, pass {pass_index})"
    start = time.perf_counter()
    try:
        body = completion_body(task, args.seed)
        status, answer = http_json(f"{base}/completion", body, args.timeout)
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise BenchError(f"{where}: no answer within --timeout {args.timeout:g} s",
                             EXIT_SERVER) from None
        raise unreachable(base, exc) from None
    wall_s = time.perf_counter() - start
    if not 200 <= status < 300 or (isinstance(answer, dict) and "error" in answer):
        raise BenchError(f"{where}: the server answered HTTP {status}: {error_text(answer)}",
                         EXIT_SERVER)
    if not (isinstance(answer, dict) and isinstance(answer.get("content"), str)
            and isinstance(answer.get("timings"), dict)):
        raise BenchError(f"{where}: the answer lacks llama.cpp's fields content and timings: "
                         f"{error_text(answer)}", EXIT_SERVER)
    return {
        "task": task["task"],
        "pass": pass_index,
        "wall_s": wall_s,
        "timings": answer["timings"],
        "tokens_predicted": answer.get("tokens_predicted"),
        "tokens_evaluated": answer.get("tokens_evaluated"),
        "stop_type": answer.get("stop_type"),
        "truncated": answer.get("truncated"),
        "content": answer["content"],
        "speculative": answer.get("speculative"),
    }


def progress(kind: str, pass_index: int, total: int, record: dict) -> None:
    t = record["timings"]
    line = (f"[{kind} {pass_index}/{total}] {record['task']}: "
            f"{record['tokens_predicted']} tokens, {record['wall_s']:.2f} s wall")
    if isinstance(t.get("predicted_per_second"), (int, float)):
        line += f", {t['predicted_per_second']:.1f} tok/s (server)"
    if t.get("draft_n"):
        line += f", {t.get('draft_n_accepted', 0)}/{t['draft_n']} drafted tokens accepted"
    print(line, file=sys.stderr, flush=True)


def run_passes(base: str, tasks: list[dict], args: argparse.Namespace) -> tuple[list, list]:
    warmup, measured = [], []
    for kind, count, records in (("warmup", args.warmup, warmup), ("pass", args.passes, measured)):
        for pass_index in range(1, count + 1):
            for task in tasks:
                record = run_request(base, task, pass_index, args)
                progress(kind, pass_index, count, record)
                records.append(record)
    return warmup, measured


def write_json(path: str, result: dict) -> None:
    """Write atomically, so an interrupted run never leaves a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def benchmark(args: argparse.Namespace) -> dict:
    tasks = load_tasks(args.prompts, args.n_predict)
    base = args.url.rstrip("/")
    check_health(base, args.timeout)
    props = fetch_props(base, args.timeout)
    print(f"benchmarking {base} ({args.label}): {len(tasks)} tasks, {args.warmup} warm-up "
          f"+ {args.passes} measured passes", file=sys.stderr)
    timestamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    warmup, measured = run_passes(base, tasks, args)
    names = ("url", "prompts", "passes", "warmup", "n_predict", "seed", "timeout")
    settings = {name: getattr(args, name) for name in names}
    body = completion_body(tasks[0], args.seed)
    settings["request"] = {k: v for k, v in body.items() if k not in ("prompt", "n_predict")}
    return {
        "format": FORMAT,
        "label": args.label,
        "settings": settings,
        "timestamp": timestamp,
        "props": props,
        "tasks": tasks,
        "warmup": warmup,
        "requests": measured,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = benchmark(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; nothing written", file=sys.stderr)
        return 130
    try:
        write_json(args.output, result)
    except OSError as exc:
        print(f"error: cannot write --output {args.output!r}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {len(result['requests'])} measured requests to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
