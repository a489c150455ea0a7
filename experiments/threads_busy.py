"""The target alone with threads that yield to other processes (default) against --threads-fixed,
quiet and with a busy process beside them, in turns.

Each run is one `tandem generate --json` (target_speed.py's prompt, greedy); the two settings
alternate (ABBA), and --busy starts a process that spins on one CPU for the whole run, as a
neighbour on a shared machine would. Writes OUT/results.json and OUT/report.md.

    python experiments/threads_busy.py --runs 4 --out bench/results/threads-busy/quiet
    python experiments/threads_busy.py --runs 4 --busy --out bench/results/threads-busy/busy
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from target_speed import prompt_text  # noqa: E402

SETTINGS = {"adaptive (default)": [], "--threads-fixed": ["--threads-fixed"]}


def busy() -> None:
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.busy:
        multiprocessing.Process(target=busy, daemon=True).start()
    runs: dict[str, list[dict]] = {k: [] for k in SETTINGS}
    for r in range(a.runs):
        for k in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
            p = subprocess.run([sys.executable, "-m", "tandem.cli", "generate", "-m", a.model,
                                "-p", prompt_text(), "-n", str(a.n_predict), "--temp", "0",
                                "--json", "--threads", str(a.threads), *SETTINGS[k]],
                               capture_output=True, text=True, check=True)
            res = json.loads(p.stdout)
            runs[k].append({"timings": res["timings"], "content": res["content"]})
            t = res["timings"]
            print(f"run {r + 1} {k}: prompt {t['prompt_per_second']:.1f} tok/s, decode "
                  f"{t['predicted_per_second']:.2f} tok/s", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python " + shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    (out / "results.json").write_text(json.dumps({"command": cmd, "busy": a.busy, "cpu": cpu,
                                                  "cpus": os.cpu_count(), "runs": runs},
                                                 indent=1))
    same = len({x["content"] for v in runs.values() for x in v}) == 1
    lines = [f"# Threads that yield against --threads-fixed, {a.threads} threads"
             + (", a busy process beside them" if a.busy else ", quiet"), "",
             f"Command: `{cmd}`", "", f"CPU: {cpu}, {os.cpu_count()} CPUs. {a.runs} runs each, "
             f"in turns; {a.n_predict} tokens, greedy. Same text in every run: "
             f"{'yes' if same else 'NO'}.", "",
             "| setting | prompt tok/s median (min-max) | decode tok/s median (min-max) |",
             "|---|---|---|"]
    for k, v in runs.items():
        pp = [x["timings"]["prompt_per_second"] for x in v]
        tg = [x["timings"]["predicted_per_second"] for x in v]
        lines.append(f"| {k} | {statistics.median(pp):.1f} ({min(pp):.1f}-{max(pp):.1f}) | "
                     f"{statistics.median(tg):.2f} ({min(tg):.2f}-{max(tg):.2f}) |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
