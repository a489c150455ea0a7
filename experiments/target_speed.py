"""Target-alone prefill and decode speed of one model under several weight paths, side by side.

Each run is a fresh `tandem generate --json` process (greedy, no speculation) on the same prompt;
the paths take turns run after run, so that a noisy neighbour on this shared machine slows them
alike. Reports the median, min and max of prompt and generation tokens/s per path, and whether
each path's output text is the same in every run.

    python experiments/target_speed.py --model default --threads 2 --runs 5 --n-predict 128 \
        --out /tmp/target-speed

`--against REV` adds the first of --paths as the source at git revision REV computes it (its `src/`
exported to a temporary folder and put first on PYTHONPATH; its kernels build from its own C
files), so that a change is timed against the code before it in the same turns.

Writes OUT/results.json (every run's timings) and OUT/report.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, busy, command_line, export_rev, short_rev, spread

# The paths: label -> extra flags for `tandem generate` (and environment variables).
PATHS = {
    "native C layers (default activations)": ["--weights", "native"],
    "native int8-down64 C layers": ["--weights", "native", "--activations", "int8-down64"],
    "native mixed C layers": ["--weights", "native", "--activations", "mixed"],
    "native mixed C layers (row-by-row prompt kernel)": [
        "--weights", "native", "--activations", "mixed", "TANDEM_PROMPT_KERNEL=0"],
    "native mixed C layers (AVX2 build)": ["--weights", "native", "--activations", "mixed",
                                          "TANDEM_KERNEL_BUILD=avx2"],
    "native int16 C layers": ["--weights", "native", "--activations", "int16"],
    "native int16 C layers (row-by-row prompt kernel)": [
        "--weights", "native", "--activations", "int16", "TANDEM_PROMPT_KERNEL=0"],
    "native int8 C layers": ["--weights", "native", "--activations", "int8"],
    "native int16 PyTorch layers": ["--weights", "native", "--activations", "int16",
                                    "TANDEM_NATIVE_LAYERS=0"],
    "int4 repack (fallback)": ["--weights", "int4"],
}


def prompt_text() -> str:
    """An instruction plus the first 1800 characters of a source file of this repository."""
    code = (ROOT / "src/tandem/speculative/ngram.py").read_text()[:1800]
    return f"Rewrite this code with type hints everywhere and shorter comments:\n{code}"


def run_once(model: str, flags: list[str], threads: int, n_predict: int) -> dict:
    env = dict(os.environ, **dict(f.split("=", 1) for f in flags if "=" in f))
    flags = [f for f in flags if "=" not in f]
    cmd = [sys.executable, "-m", "tandem.cli", "generate", "-m", model, "-t", str(threads),
           "-p", prompt_text(), "-n", str(n_predict), "--temp", "0", "--json", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated labels")
    ap.add_argument("--against", metavar="REV",
                    help="also time the default path as git revision REV computes it")
    ap.add_argument("--busy", action="store_true",
                    help="a busy process beside the runs (a neighbour on a shared machine)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    labels = a.paths.split(",")
    if a.busy:
        neighbour = multiprocessing.Process(target=busy, daemon=True)
        neighbour.start()
    tmp = None
    if a.against:
        rev = short_rev(a.against)
        tmp = tempfile.TemporaryDirectory(prefix="tandem-against-")
        label = f"{labels[0]} (at {rev})"
        PATHS[label] = [*PATHS[labels[0]], f"PYTHONPATH={export_rev(rev, Path(tmp.name))}"]
        labels.append(label)
    runs: dict[str, list[dict]] = {lab: [] for lab in labels}
    for r in range(a.runs):
        for lab in labels:
            res = run_once(a.model, PATHS[lab], a.threads, a.n_predict)
            runs[lab].append({"timings": res["timings"], "content": res["content"]})
            t = res["timings"]
            print(f"run {r + 1}/{a.runs} {lab}: prompt {t['prompt_per_second']:.1f} tok/s, "
                  f"decode {t['predicted_per_second']:.2f} tok/s", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = command_line()
    (out / "results.json").write_text(json.dumps(
        {"command": cmd, "model": a.model, "threads": a.threads,
         "n_predict": a.n_predict, "runs": runs}, indent=1))
    lines = [f"# Target-alone speed: {a.model}, {a.threads} threads", "",
             f"Command: `{cmd}`", "",
             f"Prompt: {runs[labels[0]][0]['timings']['prompt_n']} tokens; "
             f"{a.n_predict} generated tokens, greedy; {a.runs} runs per path, interleaved"
             + ("; a busy process beside them." if a.busy else "."), "",
             "| path | prefill tok/s median (min-max) | decode tok/s median (min-max) | "
             "same output every run |", "|---|---|---|---|"]
    for lab in labels:
        pp = [x["timings"]["prompt_per_second"] for x in runs[lab]]
        tg = [x["timings"]["predicted_per_second"] for x in runs[lab]]
        same = len({x["content"] for x in runs[lab]}) == 1
        lines.append(f"| {lab} | {spread(pp, 1)} | {spread(tg)} | {'yes' if same else 'no'} |")
    first = {lab: runs[lab][0]["content"] for lab in labels}
    base = first[labels[0]]
    lines += ["", "Output compared with the first path's: " + ", ".join(
        f"{lab}: {'identical' if c == base else 'differs'}" for lab, c in first.items()), ""]
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
