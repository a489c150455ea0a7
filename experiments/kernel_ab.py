"""The kernels of the working tree against those of a git revision, product by product, in turns.

Builds `experiments/kernel_bench.c` twice (this tree's `src/tandem/kernels/`, and REV's exported
to a temporary folder) for this CPU's build (kernels.variant()'s flags), then runs every shape
with each binary in turns (old, new, then new, old on the next round), `--rounds` times; each run
prints the best of 200 products. `--busy` runs a busy loop in another process meanwhile, as a
neighbour on a shared machine would. Reports the median (min-max) milliseconds per shape and the
ratio of medians, and writes OUT/results.json and OUT/report.md.

    python experiments/kernel_ab.py --against HEAD --rounds 6 --out bench/results/prompt-kernel-dynamic/quiet
    python experiments/kernel_ab.py --against HEAD --rounds 6 --busy --out bench/results/prompt-kernel-dynamic/busy
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, busy, command_line, cpu_line, export_rev, spread

sys.path.insert(0, str(ROOT / "src"))
from tandem import kernels  # noqa: E402

# ggml type, rows, bits, N, K: the default target's products for a 512-token prompt chunk
SHAPES = [(12, 512, 16, 8960, 1536), (14, 512, 16, 1536, 8960), (12, 512, 16, 1536, 1536),
          (12, 512, 16, 256, 1536)]
NAMES = {SHAPES[0]: "ffn_gate/up Q4_K", SHAPES[1]: "ffn_down Q6_K", SHAPES[2]: "attn_q/o Q4_K",
         SHAPES[3]: "attn_k Q4_K"}


def build(src: Path, out: Path) -> None:
    flags = [*kernels.CFLAGS[:-2], *kernels.VARIANTS[kernels.variant()][0]]  # no -shared -fPIC
    cmd = ["gcc", *flags, "-o", str(out), str(ROOT / "experiments/kernel_bench.c"),
           *sorted(map(str, src.glob("*.c"))), "-lm"]
    subprocess.run(cmd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, metavar="REV")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="a busy process beside the runs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    bins = {"old": tmp / "kb-old", "new": tmp / "kb-new"}
    build(export_rev(a.against, tmp, "src/tandem/kernels"), bins["old"])
    build(ROOT / "src/tandem/kernels", bins["new"])
    neighbour = None
    if a.busy:
        neighbour = multiprocessing.Process(target=busy, daemon=True)
        neighbour.start()
    env = dict(os.environ, THREADS=str(a.threads))
    times: dict[str, dict[str, list[float]]] = {NAMES[s]: {"old": [], "new": []} for s in SHAPES}
    try:
        for r in range(a.rounds):
            for shape in SHAPES:
                for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    p = subprocess.run([str(bins[side]), *map(str, shape)], env=env, check=True,
                                       capture_output=True, text=True)
                    ms = float(p.stdout.split(": ")[1].split(" ms")[0])
                    times[NAMES[shape]][side].append(ms)
                    print(f"round {r + 1} {NAMES[shape]} {side}: {ms:.2f} ms", flush=True)
    finally:
        if neighbour is not None:
            neighbour.terminate()
    lines = [f"# Kernels: working tree against {a.against}, {a.threads} threads"
             + (", a busy process beside them" if a.busy else ""), "",
             f"Command: `{command_line()}`", "",
             f"CPU: {cpu_line()}; build "
             f"{kernels.variant()}. Each figure is the best of 200 products (random blocks, "
             f"experiments/kernel_bench.c); {a.rounds} rounds, the two sides in turns.", "",
             "| product (512 rows, N x K) | before, ms median (min-max) | after | before / after |",
             "|---|---|---|---|"]
    for shape in SHAPES:
        o, n = times[NAMES[shape]]["old"], times[NAMES[shape]]["new"]
        lines.append(f"| {NAMES[shape]} {shape[3]}x{shape[4]} | {spread(o)} | {spread(n)} | "
                     f"{statistics.median(o) / statistics.median(n):.3f}x |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"against": a.against, "busy": a.busy,
                                                  "threads": a.threads, "times_ms": times},
                                                 indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
