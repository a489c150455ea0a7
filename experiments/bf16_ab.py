"""BF16 weights: float32 activations (the BF16 kernels, rowdotn.c) against activations rounded
to bf16 (BF16d, rowdotb.c: vdpbf16ps where the build has it), product by product in turns.

One decoder layer of the default target (Qwen2.5-Coder-1.5B: q and o 1536 x 1536, k and v
256 x 1536, gate and up 8960 x 1536, down 1536 x 8960) as random BF16 weights, activation rows
M = 1 (decode), 9 (verification) and 512 (a prompt chunk); each round times the layer's seven
products on both paths, the order alternating by round; the median and best per path.

    python experiments/bf16_ab.py --rounds 10 --threads 2 [--build avx2]

(bench/results/gguf-types/README.md, "BF16 with bf16 activations")
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from common import cpu_line
from tandem import kernels

SHAPES = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536),
          (1536, 8960)]
ROWS = {1: 20, 9: 10, 512: 1}  # activation rows -> repetitions per round


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=None, help="a kernels.VARIANTS name (default: this CPU's)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    ws = [gguf_quants.quantize(rng.standard_normal(s).astype(np.float32) * 0.05, QT.BF16)
          for s in SHAPES]
    times: dict[tuple[int, str], list[float]] = {}
    for r in range(a.rounds):
        for m, reps in ROWS.items():
            xs = {k: torch.randn(m, k) for k in (1536, 8960)}
            for t in ("BF16", "BF16d") if r % 2 == 0 else ("BF16d", "BF16"):
                def layer() -> None:
                    for (n, k), b in zip(SHAPES, ws):
                        kernels.matmul(t, b, n, k, xs[k], threads=a.threads, build=a.build)
                layer()  # warm
                t0 = time.perf_counter()
                for _ in range(reps):
                    layer()
                times.setdefault((m, t), []).append((time.perf_counter() - t0) / reps)
    print(f"CPU: {cpu_line()}; build {a.build or kernels.in_use()}, {a.threads} threads, "
          f"{a.rounds} rounds")
    print("| rows | BF16 ms (median / best) | BF16d ms (median / best) | BF16d speed |")
    print("|---|---|---|---|")
    for m in ROWS:
        f, d = times[(m, "BF16")], times[(m, "BF16d")]
        print(f"| {m} | {statistics.median(f) * 1e3:.2f} / {min(f) * 1e3:.2f} | "
              f"{statistics.median(d) * 1e3:.2f} / {min(d) * 1e3:.2f} | "
              f"{statistics.median(f) / statistics.median(d):.2f}x |")


if __name__ == "__main__":
    main()
