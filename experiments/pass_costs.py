"""What one target pass of 1..N rows costs: the price of a verification of N - 1 drafted tokens
against a plain one-row decode step.

In process, the default target alone (no speculation), one slot: a PREFIX-token context is
read, then every round times a pass of 1, 2, ..., N rows at that position (the rows are not
appended: the same context every time). Writes the median milliseconds per row count as JSON
and prints them with each one's ratio to one row.

    python experiments/pass_costs.py --out /tmp/passes.json --rounds 9

To compare two trees, run it from each in separate processes, alternated
(`PYTHONPATH=<tree>/src python experiments/pass_costs.py ...`), as
bench/results/verify-row-blocks did.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from common import ROOT

sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rows", type=int, default=10, help="time passes of 1..ROWS rows")
    ap.add_argument("--prefix", type=int, default=600, help="context positions before the pass")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from tandem.config import EngineConfig, SpecConfig
    from tandem.flags import load_engine

    torch.set_num_threads(a.threads)
    cfg = EngineConfig(ctx_size=4096, n_threads=a.threads)
    engine = load_engine(a.model, None, cfg, SpecConfig(types=["none"]).resolved(False))
    cache, model = engine.cache, engine.target.model
    model(torch.zeros(1, a.prefix, dtype=torch.long), cache, [0], [0], logits="none")
    times: dict[int, list[float]] = {}
    for _ in range(a.rounds):
        for r in range(1, a.rows + 1):
            t0 = time.perf_counter()
            model(torch.zeros(1, r, dtype=torch.long), cache, [0], [a.prefix])
            times.setdefault(r, []).append(time.perf_counter() - t0)
    ms = {r: statistics.median(v) * 1e3 for r, v in times.items()}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(ms, f)
    for r, t in ms.items():
        print(f"{r:3d} rows: {t:7.1f} ms  ({t / ms[1]:.2f}x one row)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
