"""The default draft as published (Q5_0 linears) against the same file requantized to Q4_0
(variants.requantize), loaded side by side and timed alternately: a prompt of 600 tokens
read in one pass (seconds per token) and a drafted token at a 600-token context through the
32768-id shortlist (`draft_step_seconds`, as `propose` makes it). Medians of 6 rounds.

    python bench/results/policy-plateau/q4_0_timing.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variants import requantize  # noqa: E402

from tandem.config import EngineConfig  # noqa: E402
from tandem.models.decoder import KVCache  # noqa: E402
from tandem.models.loader import load_model  # noqa: E402
from tandem.speculative.draft import draft_step_seconds  # noqa: E402

torch.set_num_threads(2)
cfg = EngineConfig(ctx_size=4096, n_threads=2)
models = {t: load_model("default-draft", cfg.numerics("draft"), max_len=4096)
          for t in ("Q5_0", "Q4_0")}
print("requantized", requantize(models["Q4_0"].model), "linears")
caches = {}
for t, m in models.items():
    m.prepare_kernels()
    caches[t] = KVCache.of_types(m.args, 1, 4096, cfg.cache_types("draft"))
ids = torch.randint(0, 50000, (1, 600), generator=torch.Generator().manual_seed(0))
pre: dict[str, list[float]] = {t: [] for t in models}
step: dict[str, list[float]] = {t: [] for t in models}
for _ in range(6):
    for t, m in models.items():
        t0 = time.perf_counter()
        m.model(ids, caches[t], [0], [0], logits="none")
        pre[t].append((time.perf_counter() - t0) / 600)
        step[t] += [draft_step_seconds(m.model, caches[t], 0, 600, 32768, rounds=1)
                    for _ in range(10)]
for t in models:
    print(f"{t}: prompt {1e3 * statistics.median(pre[t]):.3f} ms/token, drafted token "
          f"{1e3 * statistics.median(step[t]):.2f} ms (best {1e3 * min(step[t]):.2f})")
