"""The policy variants of this folder's README, each a patch over the tree's own policy, run
through experiments/spec_policy.py on the same frozen costs (none of them was kept).

    python bench/results/policy-plateau/variants.py VARIANT [spec_policy.py arguments]

VARIANT:
  none                the tree as it is (the baseline)
  no-catch-up-bound   a lazy draft model's catch-up is not held to the request's Account
  projected-median    Account bound over elapsed + the expected rest of the answer at plain
                      cost (Speculation.expected_remaining: the median of how much longer
                      earlier answers that got this far went on; Gott's estimate, as long
                      as it has run, while fewer than 3 did)
  projected-quartile  the same with the rest at its lower quartile (Gott's: a third of what it
                      has produced; else the earlier answers' 25th percentile)
  projected-min       the same with the rest the smaller of the two medians
  draft-q4_0          the draft model's Q5_0 linears requantized to Q4_0 (gguf.quants'
                      reference rounding) after loading; pass it a costs table whose draft
                      costs are the Q4_0 draft's (q4_0_timing.py)
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]


def requantize(model, src: str = "Q5_0", dst: str = "Q4_0") -> int:
    """Replace every GGUFLinear of type src in model by one of type dst (before kernels are
    laid out); returns how many."""
    from gguf import GGMLQuantizationType as QT, quants

    from tandem.models.gguf_file import RawTensor
    from tandem.models.quant import GGUFLinear

    n = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, GGUFLinear) and child.type_name == src:
                raw = child.raw
                w = quants.dequantize(np.asarray(raw.data), QT[src]).reshape(raw.shape)
                q = quants.quantize(w.astype(np.float32), QT[dst])
                new = RawTensor(raw.name, QT[dst], raw.shape, np.ascontiguousarray(q))
                setattr(mod, name, GGUFLinear(new, child.bias, child.bits, child.threads,
                                              child.prompt_rows, child.act_block))
                n += 1
    return n


def patch(variant: str) -> None:
    from tandem.speculative import account, speculator

    if variant == "none":
        return
    if variant == "no-catch-up-bound":
        account.Account.can_spend = lambda self, seconds: True
        return
    if variant.startswith("projected-"):
        how = variant.split("-", 1)[1]
        future: dict[int, float] = {}

        def fits(self, loss, seconds):
            return self.ahead - loss >= -account.RISK * (self.elapsed + seconds
                                                         + future.get(id(self), 0.0))

        def rest(sp, left: int) -> float:
            produced, shared = sp.produced, sp.shared
            if how == "median":
                return shared.expected_remaining(produced, left)
            if how == "min":
                return min(produced, shared.expected_remaining(produced, left))
            longer = sorted(n - produced for n in shared.lengths if n > produced)
            if len(longer) < 3:
                return min(left, produced / 3)
            return min(left, longer[int(0.25 * len(longer))])

        propose = speculator.Speculator._propose

        def _propose(self, budget, remaining, batch=(0, 0)):
            if self.account is not None:
                t1 = self.shared.costs.verify_time(1) or 0.0
                future[id(self.account)] = rest(self, remaining) * t1
            return propose(self, budget, remaining, batch)

        account.Account._fits = fits
        speculator.Speculator._propose = _propose
        return
    if variant == "draft-q4_0":
        from tandem.models import loader

        load = loader.load_model

        def load_model(name, *args, **kwargs):
            m = load(name, *args, **kwargs)
            if str(name) == "default-draft":
                t0 = time.perf_counter()
                n = requantize(m.model)
                print(f"requantized {n} linears of {m.path.name} to Q4_0 in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
            return m

        loader.load_model = load_model
        return
    raise SystemExit(f"unknown variant {variant!r}; see the module docstring")


if __name__ == "__main__":
    patch(sys.argv[1])
    sys.argv = ["spec_policy.py"] + sys.argv[2:]
    runpy.run_path(str(ROOT / "experiments" / "spec_policy.py"), run_name="__main__")
