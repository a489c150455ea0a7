"""Micro-benchmark: one Qwen2.5-1.5B layer's seven projections, bf16 dense vs the int4 kernel.

Weights are random Q4_K blocks repacked by tandem.models.quant.pack_int4 (the loading path) and
their bf16 dequantization for the dense side. Prints the median (and min) time of the whole layer
set per call over --reps repetitions, for M = 1, 2, 4, 8 activation rows.

    python experiments/int4_linear.py --threads 2 --reps 50
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from tandem.models.gguf_file import RawTensor
from tandem.models.quant import QuantLinear, dequantize, pack_int4

# (name, N, K) for Qwen2.5-1.5B: hidden 1536, 2 KV heads of 128, FFN 8960
LAYER = [("q", 1536, 1536), ("k", 256, 1536), ("v", 256, 1536), ("o", 1536, 1536),
         ("gate", 8960, 1536), ("up", 8960, 1536), ("down", 1536, 8960)]


def random_q4_k(name: str, n: int, k: int, rng: np.random.Generator) -> RawTensor:
    blocks = rng.integers(0, 256, size=(n * k // 256, 144), dtype=np.uint8)
    for start in (0, 2):  # f16 d and dmin of a plausible size
        blocks[:, start:start + 2] = (
            rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8))
    return RawTensor(name, QT.Q4_K, (n, k), blocks.reshape(n, -1))


def timings_ms(fn, reps: int, warmup: int = 3) -> tuple[float, float]:
    """(median, min) milliseconds per call; the min is the less noisy one on a shared machine."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    raws = [random_q4_k(name, n, k, rng) for name, n, k in LAYER]
    dense = [dequantize(r).to(torch.bfloat16) for r in raws]
    int4 = [QuantLinear(pack_int4(r)) for r in raws]
    mb = sum(w.numel() * 2 for w in dense) / 2**20
    print(f"torch {torch.__version__}, {a.threads} threads, {a.reps} reps; one layer's weights: "
          f"bf16 {mb:.0f} MiB, int4 {sum(m.packed.numel() for m in int4) / 2**20:.0f} MiB + scales")
    print(f"{'M':>3} {'bf16 median ms':>15} {'int4 median ms':>15} {'speedup':>8}"
          f" {'bf16 min ms':>12} {'int4 min ms':>12}")
    for m in (1, 2, 4, 8):
        xs = [torch.randn(m, k, dtype=torch.bfloat16) for _, _, k in LAYER]

        def run_dense():
            for x, w in zip(xs, dense):
                torch.nn.functional.linear(x, w)

        def run_int4():
            for x, layer in zip(xs, int4):
                layer(x)

        (d, d_min), (q, q_min) = timings_ms(run_dense, a.reps), timings_ms(run_int4, a.reps)
        print(f"{m:>3} {d:>15.2f} {q:>15.2f} {d / q:>7.2f}x {d_min:>12.2f} {q_min:>12.2f}")


if __name__ == "__main__":
    main()
