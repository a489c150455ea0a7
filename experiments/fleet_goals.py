"""Issue 58's goals 1 and 3-5 measured on a real fleet (`tandem serve --replicas 2 --threads
1`, the default model), each against its target:

  1. goal 4's first answers (greedy) against one `tandem serve` of the same flags.
  3. conversations: K two-turn chats (a shared system prompt, a distinct 300-600-token user
     text each); the first turns two at a time, then each second turn alone, streamed.
     Landing = the second turn on the replica that answered the first, with `timings.cache_n`
     over half its prompt (its conversation's prefix reused, not only the shared system
     prompt, which a replica that never saw the conversation also holds); TTFT = time to the
     first content chunk. The same trace is run again, first, on a fleet
     whose engines sit behind Ray Serve's own default router (power of two choices on queue
     length: TANDEM_FLEET_ROUTER=pow2, cluster/settings.py), the baseline.
     Target: >= 90% landed, TTFT median <= 0.5x the baseline's.
  4. a repeated answer: the same greedy request on replica A, then (pinned by `x-session`) on
     replica B and again on A, both repeats drafted by suffix speculation from the pool
     (--spec-type suffix: the shared pool feeds it). Acceptance = draft_n_accepted /
     predicted_n. Target: B's within 10% of A's repeat.
  5. a replica killed (SIGKILL of its Ray worker, found among the server's descendants by its
     process title) under load, concurrency 4, streamed requests: each request's outcome
     (answer / error text / hang = nothing for --hang-s), then the seconds until a request
     succeeds and until /health says 2 ready. Target: 0 hangs, ready within 60 s.

    python experiments/fleet_goals.py --out /tmp/fleet-goals
    python experiments/fleet_goals.py --conversations 4 --goals 3 --serve-args "--ctx-size 2048"

Standard library only (plus common.py). Writes results.json and report.md in --out.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import ROOT, command_line, cpu_line, free_port, post, serving, short_rev, spread

SYSTEM = ("You are a careful senior engineer reviewing Python code for a team. Answer briefly "
          "and precisely; name functions and lines when you refer to them.")


PROMPTS = [f"Write a Python function that {t}." for t in
           ("reverses the words of a sentence", "checks if a number is prime",
            "merges two sorted lists", "counts vowels in a string")]


def user_texts(k: int, chars: int) -> list[str]:
    """K distinct chunks of this repository's own sources (about chars/4 tokens each)."""
    out = []
    for path in sorted((ROOT / "src" / "tandem").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text) >= chars:
            out.append(f"Explain what this code does ({path.name}):\n\n{text[:chars]}")
        if len(out) == k:
            return out
    raise SystemExit(f"fewer than {k} source files of {chars} characters")


def stream(url: str, path: str, body: dict, headers: dict | None = None,
           timeout: float = 300) -> dict:
    """One streamed request: replica, status, TTFT (first content), text, timings, error."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    t0 = time.perf_counter()
    out = {"ttft": None, "text": "", "timings": None, "error": None}
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        out.update(status=r.status, replica=r.getheader("x-tandem-replica"))
        if r.status != 200:
            out["error"] = r.read().decode(errors="replace")[:300]
            return out
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                out["error"] = json.dumps(ev["error"])[:300]
            piece = ev.get("content") or "".join(
                (c.get("delta") or {}).get("content") or "" for c in ev.get("choices", []))
            if piece and out["ttft"] is None:
                out["ttft"] = time.perf_counter() - t0
            out["text"] += piece
            out["timings"] = ev.get("timings") or out["timings"]
    except OSError as e:  # a timeout (hang) or a dropped connection
        out["error"] = f"{type(e).__name__}: {e}"
        out["hang"] = isinstance(e, TimeoutError)
    finally:
        out["seconds"] = time.perf_counter() - t0
        conn.close()
    return out


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def wait_ready(url: str, n: int = 2, timeout: float = 600) -> None:
    t0 = time.time()
    while health(url).get("replicas_ready", 0) < n:
        if time.time() - t0 > timeout:
            raise TimeoutError(f"{n} replicas not ready in {timeout:.0f} s")
        time.sleep(1)


def conversations(url: str, texts: list[str], n1: int, n2: int) -> list[dict]:
    """Goal 3's trace: every first turn (two at a time), then every second turn, one by one."""
    def chat(messages, n):
        return {"messages": messages, "max_tokens": n, "temperature": 0.0, "top_k": 1,
                "stream_options": {"include_usage": True}}

    firsts = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}]
              for t in texts]
    with ThreadPoolExecutor(2) as pool:
        ones = list(pool.map(lambda m: stream(url, "/v1/chat/completions", chat(m, n1)), firsts))
    rows = []
    for m, one in zip(firsts, ones):
        second = [*m, {"role": "assistant", "content": one["text"]},
                  {"role": "user", "content": "Now say in one sentence what could go wrong."}]
        two = stream(url, "/v1/chat/completions", chat(second, n2))
        t = two["timings"] or {}
        rows.append({"replica_1": one["replica"], "replica_2": two["replica"],
                     "ttft_1": one["ttft"], "ttft_2": two["ttft"], "cache_n_2": t.get("cache_n"),
                     "prompt_n_2": t.get("prompt_n"), "error": one["error"] or two["error"]})
    return rows


def sessions_apart(url: str) -> tuple[str, str]:
    """Two x-session names bound to different replicas."""
    seen: dict[str, str] = {}
    for k in range(40):
        s = f"goal4-{k}-{os.getpid()}"
        r = stream(url, "/completion", {"prompt": f"bind {k}", "n_predict": 1},
                   {"x-session": s})
        seen.setdefault(r["replica"], s)
        if len(seen) == 2:
            return tuple(seen.values())
    raise RuntimeError("every session went to one replica")


def repeats(url: str, prompts: list[str], n: int) -> list[dict]:
    """Goal 4: each prompt answered on A, then repeated on B and on A (order alternating)."""
    a, b = sessions_apart(url)
    rows = []
    for i, prompt in enumerate(prompts):
        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1}
        first = post(f"{url}/completion", body, headers={"x-session": a})
        time.sleep(1.5)  # a report each way (0.5 s): published, taken by B
        row = {"first": first["timings"], "text_same": {}, "content": first["content"]}
        for side in (("B", "A") if i % 2 == 0 else ("A", "B")):
            r = post(f"{url}/completion", body, headers={"x-session": a if side == "A" else b})
            row[side] = r["timings"]
            row["text_same"][side] = r["content"] == first["content"]
        rows.append(row)
    return rows


def replica_pids(root: int) -> list[int]:
    """The server's descendant processes titled as Ray Serve engine replicas."""
    parent = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    ours, grew = {root}, True
    while grew:
        new = {pid for pid, pp in parent.items() if pp in ours} - ours
        ours |= new
        grew = bool(new)
    found = []
    for pid in sorted(ours):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "ServeReplica:tandem-engines:Engine" in title:
            found.append(pid)
    return found


def kill_under_load(url: str, root: int, n: int, hang_s: float, kill_after: float,
                    linger: float) -> dict:
    """Goal 5: four clients each sending streamed completions back to back; one replica
    SIGKILLed after kill_after seconds; the load goes on until /health said 2 ready again
    (then `linger` seconds more); a probe request every half second from the kill on says when
    a new request first succeeds."""
    stop, results = threading.Event(), []

    def client(c: int) -> None:
        i = 0
        while not stop.is_set():
            t = time.time()
            r = stream(url, "/completion", {"prompt": f"Write a Python function number "
                                                      f"{c}.{i} that parses a date.",
                                            "n_predict": n, "temperature": 0.0, "top_k": 1},
                       timeout=hang_s)
            r["t_start"], r["t_end"] = t, time.time()
            results.append(r)
            i += 1

    pids = replica_pids(root)
    workers = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    t0 = time.time()
    for w in workers:
        w.start()
    time.sleep(kill_after)
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    t_kill = time.time()
    first_ok = ready2 = None
    dipped = False  # /health said 1 ready (the board calls a replica gone after 3 s)
    while time.time() - t_kill < 180 and (first_ok is None or ready2 is None):
        ready = health(url).get("replicas_ready", 0)
        dipped = dipped or ready < 2
        if ready2 is None and dipped and ready >= 2:
            ready2 = time.time() - t_kill
        if first_ok is None:
            probe = stream(url, "/completion", {"prompt": "ok", "n_predict": 2}, timeout=hang_s)
            if probe["error"] is None and probe.get("status") == 200:
                first_ok = time.time() - t_kill
        time.sleep(0.5)
    time.sleep(linger)
    stop.set()
    for w in workers:
        w.join()
    outcome = []
    for r in results:
        kind = "hang" if r.get("hang") else "error" if r["error"] else "answer"
        outcome.append({"outcome": kind, "replica": r.get("replica"), "status": r.get("status"),
                        "error": r["error"], "seconds": round(r["seconds"], 2),
                        "start": round(r["t_start"] - t_kill, 2),
                        "end": round(r["t_end"] - t_kill, 2)})
    return {"pids": pids, "victim": victim, "kill_at_s": round(t_kill - t0, 2),
            "first_success_s": first_ok, "two_ready_s": ready2,
            "in_flight_at_kill": sum(r["start"] < 0 < r["end"] for r in outcome),
            "requests": outcome}


def fleet_cmd(a, port: int, replicas: int = 2) -> list[str]:
    """The fleet's command line (replicas=0: one server of the same flags)."""
    fleet = ["--replicas", str(replicas)] if replicas else []
    return [sys.executable, "-m", "tandem.cli", "serve", "-m", a.model, "--host", "127.0.0.1",
            "--port", str(port), *fleet, "--threads", "1", "--parallel", "2",
            "--spec-type", "suffix", *shlex.split(a.serve_args)]


class Fleet:
    """`tandem serve --replicas 2` started (TANDEM_FLEET_ROUTER=router), both replicas ready;
    stopped (SIGTERM: it stops its own Ray instance) on leaving."""

    def __init__(self, a, router: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd, self.router, self.log = fleet_cmd(a, self.port), router, log

    def __enter__(self) -> Fleet:
        import subprocess

        with open(self.log, "a", encoding="utf-8") as f:
            f.write(f"TANDEM_FLEET_ROUTER={self.router} {shlex.join(self.cmd)}\n")
            f.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT,
                                         env={**os.environ, "TANDEM_FLEET_ROUTER": self.router})
        t0 = time.time()
        try:
            wait_ready(self.url)
        except BaseException:
            self.__exit__()
            raise
        self.started_s = time.time() - t0
        return self

    def __exit__(self, *_) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except Exception:
            self.proc.kill()


def landed_on(row: dict) -> bool:
    """A second turn on its first turn's replica, reusing more than half its prompt from the
    cache (the conversation's prefix, not only the system prompt every conversation shares)."""
    cached, new = row["cache_n_2"] or 0, row["prompt_n_2"] or 0
    return row["replica_2"] == row["replica_1"] and cached > new


def summary(res: dict, a) -> list[str]:
    """The report's lines: each goal's numbers against its target."""
    out = []
    if "conversations" in res:
        c = res["conversations"]
        for router, rows in c.items():
            landed = [r for r in rows if landed_on(r)]
            ttft = [r["ttft_2"] for r in rows if r["ttft_2"] is not None]
            out.append(f"- goal 3, {router}: {len(landed)}/{len(rows)} second turns on their "
                       f"replica reusing > half their prompt (landed); second-turn TTFT {spread(ttft, 2)} s; "
                       f"cache_n {[r['cache_n_2'] for r in rows]}")
        if {"prefix", "pow2"} <= c.keys():
            med = {k: statistics.median(r["ttft_2"] for r in v if r["ttft_2"] is not None)
                   for k, v in c.items()}
            land = sum(map(landed_on, c["prefix"])) / len(c["prefix"])
            ratio = med["prefix"] / med["pow2"]
            out.append(f"- goal 3: landed {land:.0%} (target >= 90%: "
                       f"{'met' if land >= 0.9 else 'NOT met'}); TTFT prefix / pow2 = "
                       f"{ratio:.2f} (target <= 0.5: {'met' if ratio <= 0.5 else 'NOT met'})")
    if "repeats" in res:
        def acc(side):
            return [r[side]["draft_n_accepted"] / r[side]["predicted_n"] for r in res["repeats"]]
        a_, b_ = acc("A"), acc("B")
        ratio = statistics.median(b_) / max(1e-9, statistics.median(a_))
        out.append(f"- goal 4: accepted drafts per generated token, repeat on B (other "
                   f"replica, shared pool) {spread(b_)} vs on A {spread(a_)}; first answers "
                   f"{spread(acc('first'))}; B/A = {ratio:.2f} (target >= 0.90: "
                   f"{'met' if ratio >= 0.9 else 'NOT met'}); same text: "
                   f"{[r['text_same'] for r in res['repeats']]}")
    if "single" in res and "repeats" in res:
        same = [x == r["content"] for x, r in zip(res["single"], res["repeats"])]
        out.append(f"- goal 1: greedy answers through the fleet = one server's: "
                   f"{sum(same)}/{len(same)} ({a.n_repeat} tokens each)")
    if "kill" in res:
        k = res["kill"]
        kinds = [r["outcome"] for r in k["requests"]]
        out.append(f"- goal 5: {k['in_flight_at_kill']} requests in flight at the kill; "
                   f"{kinds.count('answer')} answered, {kinds.count('error')} "
                   f"errors, {kinds.count('hang')} hangs (target 0) of {len(kinds)}; first "
                   f"success {k['first_success_s']:.1f} s after the kill, 2 ready after "
                   f"{k['two_ready_s'] or float('nan'):.1f} s (target <= 60 s: "
                   f"{'met' if (k['two_ready_s'] or 1e9) <= 60 and not kinds.count('hang') else 'NOT met'})")
        out += [f"  - error: {r['error']}" for r in k["requests"] if r["error"]][:4]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--user-chars", type=int, default=1800, help="each first turn's user text")
    p.add_argument("--n-first", type=int, default=24)
    p.add_argument("--n-second", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n-repeat", type=int, default=64)
    p.add_argument("--linger", type=float, default=10.0,
                   help="goal 5: seconds of load after the fleet is whole again")
    p.add_argument("--kill-n-predict", type=int, default=32)
    p.add_argument("--kill-after", type=float, default=8.0)
    p.add_argument("--hang-s", type=float, default=180.0)
    p.add_argument("--goals", default="1,3,4,5",
                   help="1 needs 4 (its answers are compared with one server's)")
    p.add_argument("--serve-args", default="--ctx-size 2048")
    p.add_argument("--out", type=Path, default=Path("/tmp/fleet-goals"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    goals = set(a.goals.split(","))
    texts = user_texts(a.conversations, a.user_chars)
    res: dict = {"command": command_line(), "cpu": cpu_line(), "commit": short_rev("HEAD"),
                 "load_before": os.getloadavg()}
    log = a.out / "fleet.log"
    if "1" in goals:  # one server of the same flags (1 thread): goal 4's first answers' reference
        port = free_port()
        with serving(fleet_cmd(a, port, replicas=0), port, log) as url:
            res["single"] = [post(f"{url}/completion", {"prompt": q, "n_predict": a.n_repeat,
                                                        "temperature": 0.0, "top_k": 1}
                                  )["content"] for q in PROMPTS[:a.repeats]]
    if "3" in goals:
        res["conversations"] = {}
        with Fleet(a, "pow2", log) as f:
            res["conversations"]["pow2"] = conversations(f.url, texts, a.n_first, a.n_second)
    with Fleet(a, "prefix", log) as f:
        res["fleet_start_s"] = f.started_s
        if "3" in goals:
            res["conversations"]["prefix"] = conversations(f.url, texts, a.n_first, a.n_second)
        if "4" in goals:
            res["repeats"] = repeats(f.url, PROMPTS[:a.repeats], a.n_repeat)
        if "5" in goals:
            res["kill"] = kill_under_load(f.url, f.proc.pid, a.kill_n_predict, a.hang_s,
                                          a.kill_after, a.linger)
    res["load_after"] = os.getloadavg()
    (a.out / "results.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Issue 58's goals on a 2 x 1-thread fleet ({a.model})", "",
             f"`{res['command']}`", "", f"commit {res['commit']}; CPU: {res['cpu']}; load "
             f"average before {res['load_before'][0]:.1f}, after {res['load_after'][0]:.1f}",
             "", *summary(res, a)]
    (a.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
