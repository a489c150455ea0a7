"""Which product's int8 rounding moves the target's next-token distributions most.

The same text, chunks and statistics as kl_divergence.py (the dense float32 reference, the second
half of each 512-token chunk scored), on the PyTorch layers (each GGUFLinear rounds its own
input, so one kind of product at a time can be switched to int16 while the rest stay int8).
Prints each variant's mean KL divergence and its paired difference from int8 everywhere.

    python experiments/kl_by_product.py --chunks 7 > bench/results/kl-divergence-mixed/by-product.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kl_divergence as K  # noqa: E402

MIX = {"int8": [], "int8+down16": ["w_down"], "int8+o16": ["wo"],
       "int8+down16+o16": ["w_down", "wo"], "int8+out16": ["output"],
       "int8+qkv16": ["wq", "wk", "wv"]}
PRODUCTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from tandem.config import Numerics
    from tandem.models.loader import load_model

    torch.set_num_threads(a.threads)
    ref = load_model(a.model, Numerics(weights="dense", dtype="float32", threads=a.threads),
                     max_len=a.ctx + 1)
    ids = ref.tokenizer.encode(K.build_text(9000), add_special=True, parse_special=False)
    m = load_model(a.model, Numerics(activations="int8", threads=a.threads, native_layers=False),
                   max_len=a.ctx + 1)

    def set_bits(names: list[str]) -> None:
        for blk in m.model.layers:
            for n in PRODUCTS:
                getattr(blk, n).bits = 16 if n in names else 8
        m.model.output.bits = 16 if "output" in names else 8

    stats = {k: K.Stats() for k in MIX}
    first = a.ctx // 2
    for c in range(min(a.chunks, len(ids) // a.ctx)):
        chunk = ids[c * a.ctx:(c + 1) * a.ctx]
        nxt = np.array(chunk[first + 1:])
        base = K.quantize_base(K.reference_logits(ref, chunk)[first:-1])
        for k, names in MIX.items():
            set_bits(names)
            stats[k].add(K.tandem_logits(m, chunk)[first:-1], base, nxt)
        print(c, {k: round(float(np.mean(s.kld)), 6) for k, s in stats.items()}, flush=True)
    kl0 = np.array(stats["int8"].kld)
    for k, s in stats.items():
        d = np.array(s.kld) - kl0
        print(f"{k:20} mean {np.mean(s.kld):.6f} ± {np.std(s.kld) / np.sqrt(len(s.kld)):.6f}  "
              f"diff vs int8 {d.mean():+.6f} ± {d.std() / np.sqrt(len(d)):.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
