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
import random
import sys
import threading
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
Latency and load: --stream sends streamed requests and records, per request, the time to the
first token (TTFT: the first event that carries text or tokens), the gaps between the events
that followed (mean, max, all of them), and the end-to-end time. --concurrency N keeps N requests
in flight, --rate R sends them at Poisson arrivals of R per second (seeded by --seed); both
send --requests requests (default: every task once per pass) within --max-time seconds, and add
a "load" summary: output tokens per second over the run, and p50/p90/p99 of TTFT, mean and
largest gap, and end-to-end time (TTFT and gaps only with --stream).
What this does not measure: time to the first token without --stream (wall time then covers
prompt processing and generation together), memory use, and concurrent requests without
--concurrency or --rate (one request at a time). Warm-up requests are kept in the output
under "warmup", never in "requests". Exit status: 0 on success, 1 when the server is
unreachable or answers with an error, 2 for bad arguments or a bad --prompts file."""


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
    add("--label", help="name of this run, e.g. baseline or ngram (required)")
    add("--output", help="JSON file to write the results to (required)")
    add("--url", default="http://127.0.0.1:8080", help="server base URL (default: %(default)s)")
    add("--prompts", help='JSONL file, one {"task": ..., "prompt": ..., "n_predict": ...} per '
        "line, n_predict optional (default: the 3 built-in tasks)")
    add("--tasks", default=None,
        help="only these tasks, comma-separated names (default: every task)")
    add("--list-tasks", action="store_true",
        help="print the task names, one per line, and exit (no server needed)")
    add("--passes", type=int, default=5,
        help="measured passes (default: %(default)s; 0 with --warmup: warm-up only)")
    add("--warmup", type=int, default=1, help="unmeasured passes first (default: %(default)s)")
    add("--n-predict", type=int, default=256, help="tokens per request (default: %(default)s)")
    add("--seed", type=int, default=1234, help="seed sent with each request (default: %(default)s)")
    add("--timeout", type=float, default=600.0,
        help="seconds to wait for one request (default: %(default)s)")
    add("--stream", action="store_true",
        help="streamed requests: time to first token and the gaps between events")
    add("--concurrency", type=int, default=0,
        help="load mode: keep N requests in flight (with --rate: at most N)")
    add("--rate", type=float, default=0.0,
        help="load mode: Poisson arrivals, R requests per second on average")
    add("--requests", type=int, default=0,
        help="load mode: how many measured requests (default: every task once per pass)")
    add("--max-time", type=float, default=0.0,
        help="load mode: send no request after this many seconds (default: no limit)")
    args = parser.parse_args(argv)
    if args.list_tasks:
        return args
    for name in ("label", "output"):
        if getattr(args, name) is None:
            parser.error(f"--{name} is required")
    if args.concurrency < 0:
        parser.error(f"--concurrency must be 0 (off) or more, got {args.concurrency}")
    if args.rate < 0:
        parser.error(f"--rate must be 0 (off) or positive, got {args.rate}")
    if args.requests < 0 or args.max_time < 0:
        parser.error("--requests and --max-time must be 0 (unset) or positive")
    if (args.requests or args.max_time) and not (args.concurrency or args.rate):
        parser.error("--requests and --max-time need load mode: --concurrency or --rate")
    if args.passes < 0 or (args.passes == 0 and args.warmup == 0):
        parser.error(f"--passes must be at least 1 (or 0 with --warmup, a warm-up only), "
                     f"got {args.passes}")
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


def load_tasks(path: str | None, n_predict: int, names: str | None = None) -> list[dict]:
    """The built-in tasks, or those of a JSONL file, in their order; with `names` (comma-
    separated) only those; each gets its n_predict."""
    raw = BUILTIN_TASKS if path is None else read_prompts_file(path)
    if names is not None:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        known = [t["task"] for t in raw]
        where = "the built-in tasks" if path is None else f"--prompts file {path!r}"
        for n in wanted:
            if n not in known:
                raise BenchError(f"--tasks: no task named {n!r} in {where}; its tasks: "
                                 f"{', '.join(known)}", EXIT_USAGE)
        if not wanted:
            raise BenchError("--tasks: no task named; expected comma-separated task names",
                             EXIT_USAGE)
        raw = [t for t in raw if t["task"] in wanted]
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
        expected = ('{"task": "name", "prompt": "text", "n_predict": 256, "request": {...}} '
                    '(n_predict optional; request: more fields for the request body, e.g. '
                    '"json_schema")')
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
    unknown = sorted(set(item) - {"task", "prompt", "n_predict", "request"})
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}")
    out = {"task": task, "prompt": prompt}
    extra = item.get("request")
    if extra is not None:
        if not isinstance(extra, dict):
            raise bad(f'"request" must be an object of request fields, got {extra!r}')
        out["request"] = extra
    if n_predict is None:
        return out
    if not isinstance(n_predict, int) or isinstance(n_predict, bool) or n_predict < 1:
        raise bad(f'"n_predict" must be a positive integer, got {n_predict!r}')
    return {**out, "n_predict": n_predict}


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


def completion_body(task: dict, seed: int, stream: bool = False) -> dict:
    return {
        "prompt": task["prompt"],
        "n_predict": task["n_predict"],
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": seed,
        "stream": stream,
        "cache_prompt": False,
        **task.get("request", {}),  # e.g. a json_schema or grammar
    }


def post_stream(url: str, body: dict, timeout: float) -> tuple[int, object, list[float]]:
    """POST a streamed request and read its server-sent events: (status, the final event with
    the whole text as "content", arrival times of the events that carried text or tokens)."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode("utf-8", errors="replace")
        try:
            return exc.code, json.loads(raw), []
        except json.JSONDecodeError:
            return exc.code, raw, []
    arrivals: list[float] = []
    pieces: list[str] = []
    final: object = None
    with response:
        for raw_line in response:
            line = raw_line.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            now = time.perf_counter()
            try:
                event = json.loads(payload)
            except json.JSONDecodeError:
                return response.status, f"an event that is not JSON: {payload[:200]}", arrivals
            if not isinstance(event, dict) or "error" in event:
                return 500, event, arrivals
            if event.get("content") or event.get("tokens"):
                arrivals.append(now)
                pieces.append(event.get("content") or "")
            if event.get("stop"):
                final = event
                break
    if not isinstance(final, dict):
        return response.status, "the stream ended without a final event (stop: true)", arrivals
    return response.status, {**final, "content": "".join(pieces)}, arrivals


def run_request(base: str, task: dict, pass_index: int, args: argparse.Namespace) -> dict:
    """One timed POST /completion; the record keeps the server's answer as returned (streamed:
    the text of every event joined, the final event's fields, and the latency figures)."""
    where = f"POST {base}/completion (task {task['task']!r}, pass {pass_index})"
    stream = getattr(args, "stream", False)
    start = time.perf_counter()
    arrivals: list[float] = []
    try:
        body = completion_body(task, args.seed, stream)
        if stream:
            status, answer, arrivals = post_stream(f"{base}/completion", body, args.timeout)
        else:
            status, answer = http_json(f"{base}/completion", body, args.timeout)
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise BenchError(f"{where}: no answer within --timeout {args.timeout:g} s",
                             EXIT_SERVER) from None
        raise unreachable(base, exc) from None
    end = time.perf_counter()
    wall_s = end - start
    if not 200 <= status < 300 or (isinstance(answer, dict) and "error" in answer):
        raise BenchError(f"{where}: the server answered HTTP {status}: {error_text(answer)}",
                         EXIT_SERVER)
    if not (isinstance(answer, dict) and isinstance(answer.get("content"), str)
            and isinstance(answer.get("timings"), dict)):
        raise BenchError(f"{where}: the answer lacks llama.cpp's fields content and timings: "
                         f"{error_text(answer)}", EXIT_SERVER)
    record = {
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
    if stream:
        record.update(latency(start, arrivals, end))
    return record


def latency(start: float, arrivals: list[float], end: float) -> dict:
    """A streamed request's latency figures from the arrival times of its events."""
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {
        "ttft_s": arrivals[0] - start if arrivals else None,
        "events": len(arrivals),
        "gap_mean_s": sum(gaps) / len(gaps) if gaps else None,
        "gap_max_s": max(gaps) if gaps else None,
        "gaps_s": [round(g, 6) for g in gaps],
        "e2e_s": end - start,
    }


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    at = (len(xs) - 1) * q / 100
    lo = int(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def load_summary(records: list[dict], elapsed_s: float) -> dict:
    """Throughput over the run and p50/p90/p99 of each latency figure."""
    tokens = sum(r.get("tokens_predicted") or 0 for r in records)
    out: dict = {"requests": len(records), "elapsed_s": elapsed_s, "output_tokens": tokens,
                 "throughput_tok_s": tokens / elapsed_s if elapsed_s > 0 else None}
    for name in ("ttft_s", "gap_mean_s", "gap_max_s", "e2e_s", "wall_s"):
        values = [r[name] for r in records if isinstance(r.get(name), (int, float))]
        if values:
            out[name] = {f"p{q}": percentile(values, q) for q in (50, 90, 99)}
    return out


def load_line(load: dict) -> str:
    def ms(name: str) -> str:
        q = load.get(name)
        return "-" if q is None else "/".join(f"{1e3 * q[p]:.0f}" for p in ("p50", "p90", "p99"))

    rate = load["throughput_tok_s"]
    return (f"load: {load['requests']} requests in {load['elapsed_s']:.1f} s, "
            f"{rate:.2f} output tok/s; p50/p90/p99 ms: TTFT {ms('ttft_s')}, "
            f"mean gap {ms('gap_mean_s')}, largest gap {ms('gap_max_s')}, "
            f"end to end {ms('e2e_s')}" if rate is not None else "load: no request finished")


def run_load(base: str, tasks: list[dict], args: argparse.Namespace) -> tuple[list, dict]:
    """Load mode: the measured requests (every task once per pass, or --requests of them in
    that order) sent N at a time (--concurrency) or at Poisson arrivals (--rate), none after
    --max-time. Each record adds start_s (its send time from the run's start)."""
    count = args.requests or args.passes * len(tasks)
    work = [(tasks[i % len(tasks)], i // len(tasks) + 1) for i in range(count)]
    records: list[dict] = []
    errors: list[BenchError] = []
    lock = threading.Lock()
    slots = threading.Semaphore(args.concurrency) if args.concurrency else None
    t0 = time.perf_counter()

    def one(task: dict, pass_index: int) -> None:
        try:
            sent = time.perf_counter() - t0
            record = run_request(base, task, pass_index, args)
            record["start_s"] = sent
            with lock:
                records.append(record)
            progress("load", len(records), count, record)
        except BenchError as exc:
            with lock:
                errors.append(exc)
        finally:
            if slots is not None:
                slots.release()

    rng = random.Random(args.seed)
    threads = []
    next_at = 0.0
    for task, pass_index in work:
        if args.rate:
            next_at += rng.expovariate(args.rate)
            delay = next_at - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
        if slots is not None:
            slots.acquire()
        if errors or (args.max_time and time.perf_counter() - t0 > args.max_time):
            if slots is not None:
                slots.release()
            break
        thread = threading.Thread(target=one, args=(task, pass_index), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    records.sort(key=lambda r: r["start_s"])
    return records, load_summary(records, elapsed)


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
    tasks = load_tasks(args.prompts, args.n_predict, args.tasks)
    base = args.url.rstrip("/")
    check_health(base, args.timeout)
    props = fetch_props(base, args.timeout)
    print(f"benchmarking {base} ({args.label}): {len(tasks)} tasks, {args.warmup} warm-up "
          f"+ {args.passes} measured passes", file=sys.stderr)
    timestamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load = None
    if args.concurrency or args.rate:
        warm = argparse.Namespace(**{**vars(args), "passes": 0})
        warmup, _ = run_passes(base, tasks, warm)  # the warm-up stays one request at a time
        measured, load = run_load(base, tasks, args)
    else:
        warmup, measured = run_passes(base, tasks, args)
    names = ("url", "prompts", "tasks", "passes", "warmup", "n_predict", "seed", "timeout", "stream",
             "concurrency", "rate", "requests", "max_time")
    settings = {name: getattr(args, name) for name in names}
    body = completion_body(tasks[0], args.seed, args.stream)
    settings["request"] = {k: v for k, v in body.items() if k not in ("prompt", "n_predict")}
    extra = {} if load is None else {"load": load}
    return {
        "format": FORMAT,
        "label": args.label,
        "settings": settings,
        "timestamp": timestamp,
        "props": props,
        "tasks": tasks,
        "warmup": warmup,
        "requests": measured,
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_tasks:
        try:
            tasks = load_tasks(args.prompts, args.n_predict, args.tasks)
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        print("\n".join(t["task"] for t in tasks))
        return 0
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
    if "load" in result:
        print(load_line(result["load"]), file=sys.stderr)
    print(f"wrote {len(result['requests'])} measured requests to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
