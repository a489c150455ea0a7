"""Peak resident memory of `tandem serve` against what `tandem check` predicted.

Runs `tandem check` with the server's settings, starts `tandem serve` with them, waits until it
is ready, sends the benchmark prompts (bench/prompts/cpu-tasks.jsonl, 128 tokens each, greedy)
to /completion, then reads the server's VmHWM (peak resident set) from /proc and stops it.

    python experiments/memory_check.py --out bench/results/memory [-- extra serve/check flags]

Writes OUT/report.md and OUT/result.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from common import ROOT, command_line, free_port, post, wait_healthy

GiB = 1 << 30


def planned_total(check_out: str) -> int:
    """The 'total' line of tandem check's plan, in bytes."""
    m = re.search(r"^\s*total\s+([\d.]+) (GiB|MiB)", check_out, re.M)
    if m is None:
        raise SystemExit(f"no total in tandem check's output:\n{check_out}")
    return int(float(m[1]) * (GiB if m[2] == "GiB" else 1 << 20))


def vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("rest", nargs="*", help="extra flags for both tandem check and tandem serve")
    a = ap.parse_args()
    flags = ["-m", "default", "-md", "default-draft", "--threads", str(a.threads), *a.rest]
    tandem = [sys.executable, "-m", "tandem.cli"]
    check = subprocess.run([*tandem, "check", *flags], capture_output=True, text=True)
    predicted = planned_total(check.stdout + check.stderr)
    port = free_port()
    srv = subprocess.Popen([*tandem, "serve", *flags, "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, srv)
        tasks = [json.loads(x) for x in (ROOT / "bench/prompts/cpu-tasks.jsonl").open()]
        for t in tasks:
            post(url + "/completion", {"prompt": t["prompt"], "n_predict": 128,
                                       "temperature": 0, "top_k": 1, "cache_prompt": False})
        peak = vm_hwm(srv.pid)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    err = (peak - predicted) / predicted
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = command_line()
    res = {"command": cmd, "flags": flags, "predicted_bytes": predicted, "peak_rss_bytes": peak,
           "relative_error": err, "check_output": check.stdout + check.stderr}
    (out / "result.json").write_text(json.dumps(res, indent=1))
    report = (f"# Server peak memory against `tandem check`\n\nCommand: `{cmd}`\n\n"
              f"Server: `tandem serve {' '.join(flags)}`, {len(tasks)} requests of 128 tokens "
              f"(bench/prompts/cpu-tasks.jsonl).\n\n"
              f"| predicted (tandem check total) | measured peak RSS (VmHWM) | difference |\n"
              f"|---|---|---|\n| {predicted / GiB:.2f} GiB | {peak / GiB:.2f} GiB | "
              f"{100 * err:+.1f}% |\n\n```\n{check.stdout}{check.stderr}```\n")
    (out / "report.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
