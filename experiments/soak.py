"""A soak under faults: `tandem serve --parallel 2` on a tiny model (a draft with the target's
weights, speculation on) takes mixed traffic from several clients for a fixed time, loopback
only: plain and streamed completions and chats, clients that leave mid-stream, requests
cancelled while they wait, slow readers, bad requests, oversized bodies, wrong keys.

Checked: every finished greedy answer equals its reference (the same request alone, before the
load); every refusal is the expected 4xx; no 5xx, no dropped connection; afterwards no slot is
busy, nothing waits in the queue, the server is healthy; its RSS after warm-up (the first
quarter of the run) grew by less than --rss-growth (5%). The report (JSON) has the requests
and errors by kind, the RSS over time and the slots at the end; the exit code is 0 when every
check passed.

    python experiments/soak.py --seconds 1200 --out bench/results/soak/report.json
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from common import ROOT, free_port, wait_healthy

sys.path.insert(0, str(ROOT))

KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0.0, "top_k": 1}
PROMPTS = ["def add(a, b):", "The quick brown fox", "import os\nimport sys\n",
           "for i in range(10):", "Once upon a time there was", "one two three one two three"]
CHATS = ["hello", "Write a function that adds two numbers", "count to ten"]
N = 24  # tokens per answer


def start_server(d: Path) -> tuple[subprocess.Popen, str]:
    from tests import tiny

    model = tiny.hf_model("qwen2", seed=0)
    target = tiny.write_gguf(model, d / "target.gguf", "qwen2")
    draft = tiny.write_gguf(model, d / "draft.gguf", "qwen2")
    port = free_port()
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "serve", "-m", str(target), "-md", str(draft),
         "-np", "2", "-c", "2048", "--api-key", KEY, "--metrics", "-t", "1", "--port",
         str(port), "--timeout", "60"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=120)
    except (RuntimeError, TimeoutError) as e:
        raise SystemExit(f"soak: {e}:\n{(d / 'server.log').read_text()}") from None
    return proc, url


def completion(prompt: str) -> dict:
    return {"prompt": prompt, "n_predict": N, **GREEDY}


def chat(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": N, **GREEDY}


def sse_text(lines, chat_stream: bool) -> str:
    out = []
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        if chat_stream:
            if event.get("choices"):
                out.append(event["choices"][0]["delta"].get("content") or "")
        else:
            out.append(event.get("content", ""))
    return "".join(out)


class Soak:
    def __init__(self, url: str, refs: dict, seed: int) -> None:
        self.url, self.refs = url, refs
        self.counts: Counter = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.rng = random.Random(seed)

    def note(self, kind: str, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.counts[f"{kind}:{'ok' if ok else 'FAILED'}"] += 1
            if not ok and len(self.failures) < 50:
                self.failures.append(f"{kind}: {detail}")

    def one(self, rng: random.Random) -> None:
        kind = rng.choices(
            ["complete", "stream", "chat", "chat_stream", "leave_mid_stream", "cancel_waiting",
             "slow_reader", "bad_request", "oversized", "wrong_key"],
            weights=[4, 4, 3, 3, 2, 2, 1, 2, 1, 1])[0]
        try:
            getattr(self, kind)(rng)
        except Exception as e:  # a dropped connection, a timeout, a bad answer
            self.note(kind, False, f"{type(e).__name__}: {e}")

    def complete(self, rng):
        p = rng.choice(PROMPTS)
        r = httpx.post(f"{self.url}/completion", json=completion(p), headers=AUTH, timeout=120)
        self.note("complete", r.status_code == 200 and r.json()["content"] == self.refs[p],
                  f"{r.status_code} {r.text[:200]}")

    def stream(self, rng):
        p = rng.choice(PROMPTS)
        with httpx.stream("POST", f"{self.url}/completion", json={**completion(p), "stream": True},
                          headers=AUTH, timeout=120) as r:
            text = sse_text(r.iter_lines(), False)
        self.note("stream", r.status_code == 200 and text == self.refs[p], repr(text[:80]))

    def chat(self, rng):
        c = rng.choice(CHATS)
        r = httpx.post(f"{self.url}/v1/chat/completions", json=chat(c), headers=AUTH, timeout=120)
        ok = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == \
            self.refs["chat:" + c]
        self.note("chat", ok, f"{r.status_code} {r.text[:200]}")

    def chat_stream(self, rng):
        c = rng.choice(CHATS)
        with httpx.stream("POST", f"{self.url}/v1/chat/completions",
                          json={**chat(c), "stream": True}, headers=AUTH, timeout=120) as r:
            text = sse_text(r.iter_lines(), True)
        self.note("chat_stream", r.status_code == 200 and text == self.refs["chat:" + c],
                  repr(text[:80]))

    def leave_mid_stream(self, rng):
        body = {**completion(rng.choice(PROMPTS)), "n_predict": 400, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{self.url}/completion", json=body, headers=AUTH,
                          timeout=120) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= rng.randint(1, 4):
                    break  # the client leaves; the server must free the slot
        self.note("leave_mid_stream", r.status_code == 200, str(r.status_code))

    def cancel_waiting(self, rng):
        body = {**completion(rng.choice(PROMPTS)), "n_predict": 300, "ignore_eos": True}
        try:
            httpx.post(f"{self.url}/completion", json=body, headers=AUTH,
                       timeout=rng.uniform(0.05, 0.5))
            self.note("cancel_waiting", True)  # it finished first: fine
        except httpx.TimeoutException:
            self.note("cancel_waiting", True)

    def slow_reader(self, rng):
        p = rng.choice(PROMPTS)
        with httpx.stream("POST", f"{self.url}/completion", json={**completion(p), "stream": True},
                          headers=AUTH, timeout=120) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                time.sleep(0.05)
        self.note("slow_reader", sse_text(lines, False) == self.refs[p], "text differs")

    def bad_request(self, rng):
        body = rng.choice([b"{not json", b"[1, 2]", json.dumps({"prompt": 5}).encode(),
                           json.dumps({"prompt": "x", "n_predict": "many"}).encode(),
                           json.dumps({"messages": []}).encode()])
        path = "/v1/chat/completions" if b"messages" in body else "/completion"
        r = httpx.post(f"{self.url}{path}", content=body, timeout=30,
                       headers={**AUTH, "Content-Type": "application/json"})
        self.note("bad_request", r.status_code == 400 and "error" in r.json(), r.text[:200])

    def oversized(self, rng):
        body = json.dumps({"prompt": "x" * (11 * 1024 * 1024)}).encode()
        try:
            r = httpx.post(f"{self.url}/completion", content=body, timeout=30,
                           headers={**AUTH, "Content-Type": "application/json"})
            self.note("oversized", r.status_code == 413, str(r.status_code))
        except httpx.WriteError:  # the server answered 413 and closed before it all went
            self.note("oversized", True)

    def wrong_key(self, rng):
        r = httpx.post(f"{self.url}/completion", json=completion("x"), timeout=30,
                       headers={"Authorization": "Bearer wrong"})
        self.note("wrong_key", r.status_code == 401, str(r.status_code))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rss-growth", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="soak-"))
    proc, url = start_server(d)
    try:
        refs = {p: httpx.post(f"{url}/completion", json=completion(p), headers=AUTH,
                              timeout=120).json()["content"] for p in PROMPTS}
        refs |= {"chat:" + c: httpx.post(f"{url}/v1/chat/completions", json=chat(c),
                                         headers=AUTH, timeout=120).json()["choices"][0]
                 ["message"]["content"] for c in CHATS}
        soak = Soak(url, refs, args.seed)
        t0 = time.monotonic()
        end = t0 + args.seconds
        rss: list[tuple[float, int]] = []

        def client(i: int) -> None:
            rng = random.Random(args.seed * 1000 + i)
            while time.monotonic() < end:
                soak.one(rng)

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        while time.monotonic() < end:
            rss.append((round(time.monotonic() - t0, 1), rss_kib(proc.pid)))
            time.sleep(min(5.0, max(0.5, args.seconds / 100)))
        for t in threads:
            t.join(timeout=180)
        # idle: every slot free, nothing queued, still healthy
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            slots = httpx.get(f"{url}/slots", headers=AUTH, timeout=10).json()
            if not any(s["is_processing"] for s in slots):
                break
            time.sleep(0.2)
        metrics = httpx.get(f"{url}/metrics", headers=AUTH, timeout=10).text
        deferred = next(float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("llamacpp:requests_deferred "))
        healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
        rss.append((round(time.monotonic() - t0, 1), rss_kib(proc.pid)))
        warm = [kib for t, kib in rss if t >= args.seconds / 4]
        growth = (warm[-1] - warm[0]) / warm[0] if warm and warm[0] else 0.0
        log = (d / "server.log").read_text()
        checks = {
            "answers": not soak.failures,
            "slots free": not any(s["is_processing"] for s in slots),
            "queue empty": deferred == 0,
            "healthy": healthy and proc.poll() is None,
            "rss growth": growth < args.rss_growth,
            "no traceback in the log": "Traceback" not in log,
        }
        report = {
            "command": " ".join([sys.executable, *sys.argv]), "seconds": args.seconds,
            "clients": args.clients, "requests": sum(soak.counts.values()),
            "by_kind": dict(sorted(soak.counts.items())), "failures": soak.failures,
            "rss_kib": rss, "rss_growth_after_warmup": round(growth, 4),
            "slots_at_end": [{"id": s["id"], "is_processing": s["is_processing"]} for s in slots],
            "requests_deferred_at_end": deferred, "checks": checks,
        }
        text = json.dumps(report, indent=1)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        print(json.dumps({k: report[k] for k in ("requests", "by_kind", "failures",
                                                 "rss_growth_after_warmup", "checks")}))
        return 0 if all(checks.values()) else 1
    finally:
        proc.terminate()
        proc.wait(timeout=20)


if __name__ == "__main__":
    sys.exit(main())
