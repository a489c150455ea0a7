"""How fine the int8 activation blocks of the down projection must be for int8 everywhere to be
no worse than llama.cpp: the target's next-token KL divergence from float32 activations.

The same text, chunks and statistics as kl_divergence.py (the dense float32 reference, the second
half of each 512-token chunk scored), on the PyTorch layers. Variants:
  mixed       int8 activations, the down projection int16 (the default, `--activations mixed`)
  int8        int8 everywhere, blocks of 256 (llama.cpp's Q8_K)
  down8/B     int8 everywhere, the down projection's input rounded to int8 per block of B values
              (scale amax / 127, round half to even as quantize_row8) and multiplied in float32
              with the dequantized weights (what an exact kernel computes, up to the float order)
Prints each variant's mean KL divergence and its paired difference from mixed.

    python experiments/kl_down_scales.py --chunks 7 --blocks 32 64 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kl_divergence as K  # noqa: E402


def round_int8(x: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded to int8 steps per `block` consecutive values of each row (quantize_row8)."""
    shape = x.shape
    g = x.float().reshape(-1, shape[-1] // block, block)
    amax = g.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(g * inv)
    return (q * (amax / 127.0)).reshape(shape)


class Down8(torch.nn.Module):
    """A down projection whose input is rounded per `block` and multiplied in float32."""

    def __init__(self, lin, block: int) -> None:
        super().__init__()
        self.block, self.bias = block, lin.bias
        self.w = lin.weight_float()

    def forward(self, x: torch.Tensor, *a, **k) -> torch.Tensor:
        y = torch.nn.functional.linear(round_int8(x, self.block), self.w, self.bias)
        return y.to(x.dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 64])
    a = ap.parse_args()
    from tandem.config import Numerics
    from tandem.models.loader import load_model

    torch.set_num_threads(a.threads)
    ref = load_model(a.model, Numerics(weights="dense", dtype="float32", threads=a.threads),
                     max_len=a.ctx + 1)
    ids = ref.tokenizer.encode(K.build_text(9000), add_special=True, parse_special=False)
    m = load_model(a.model, Numerics(activations="int8", threads=a.threads, native_layers=False),
                   max_len=a.ctx + 1)
    layers = m.model.layers
    orig = [blk.w_down for blk in layers]
    down8 = {b: [Down8(lin, b) for lin in orig] for b in a.blocks}

    def setup(name: str) -> None:
        for i, blk in enumerate(layers):
            blk.w_down = down8[int(name.split("/")[1])][i] if name.startswith("down8/") else orig[i]
            orig[i].bits = 16 if name == "mixed" else 8

    variants = ["mixed", "int8"] + [f"down8/{b}" for b in a.blocks]
    stats = {k: K.Stats() for k in variants}
    first = a.ctx // 2
    for c in range(min(a.chunks, len(ids) // a.ctx)):
        chunk = ids[c * a.ctx:(c + 1) * a.ctx]
        nxt = np.array(chunk[first + 1:])
        base = K.quantize_base(K.reference_logits(ref, chunk)[first:-1])
        for k in variants:
            setup(k)
            stats[k].add(K.tandem_logits(m, chunk, "f16")[first:-1], base, nxt)
        print(c, {k: round(float(np.mean(s.kld)), 6) for k, s in stats.items()}, flush=True)
    kl0 = np.array(stats["mixed"].kld)
    for k, s in stats.items():
        d = np.array(s.kld) - kl0
        print(f"{k:12} mean {np.mean(s.kld):.6f} ± {np.std(s.kld) / np.sqrt(len(s.kld)):.6f}  "
              f"diff vs mixed {d.mean():+.6f} ± {d.std() / np.sqrt(len(d)):.6f}  "
              f"same top {100 * s.same_top / len(s.kld):.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
