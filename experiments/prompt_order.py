"""Two prompts that arrive together: who waits (issue 18, `schedule.prompt_order`).

    python experiments/prompt_order.py --rounds 3 --long 600 --short 60 \
        --out bench/results/prompt-order/prompt-order.json

In process, on the default target (no speculation: only prompt reading is measured), 2 slots.
Each round, in turns: the short prompt alone, the long prompt alone, then both added at once
(the long one first, as if it arrived a moment earlier) under each order: `fifo` (oldest
first, the scheduler before this change) and `slack` (least slack first, the default). Time
to first token of each request, and over its own time alone; prompts are Python standard
library source (`--source`) cut to that many tokens, each asking for 8 tokens.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from pathlib import Path

from common import command_line, cpu_line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long", type=int, default=600)
    ap.add_argument("--short", type=int, default=60)
    ap.add_argument("--source", default="textwrap", help="stdlib module for the prompts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from tandem import engine as engine_mod
    from tandem import registry
    from tandem.config import EngineConfig, SamplingParams, SpecConfig
    from tandem.engine import Request
    from tandem.flags import load_engine
    from tandem.schedule import prompt_order

    def fifo(waiting, row_seconds, now=None):
        return sorted(waiting, key=lambda s: s.t_start)

    orders = {"fifo": fifo, "slack": prompt_order}
    e = load_engine(str(registry.resolve("default")), None,
                    EngineConfig(n_parallel=2, ctx_size=8192, n_threads=a.threads),
                    SpecConfig(types=SpecConfig.parse_types("none")).resolved(False))
    text = inspect.getsource(__import__(a.source))
    ids = e.tok.encode(text)
    long_ids = e.tok.encode("Explain this code.\n\n")[:8] + ids[: a.long - 8]
    short_ids = e.tok.encode("What does this do?\n\n")[:8] + ids[a.long: a.long + a.short - 8]
    sp = SamplingParams(n_predict=8, temperature=0.0, ignore_eos=True)

    def ttft(reqs: list[list[int]], order) -> list[float]:
        engine_mod.prompt_order = order
        t0 = time.perf_counter()
        seqs = [e.add(Request(list(r), sp, cache_prompt=False)) for r in reqs]
        first = [None] * len(seqs)
        while not all(s.done for s in seqs):
            e.step()
            for i, s in enumerate(seqs):
                if first[i] is None and s.output:
                    first[i] = time.perf_counter() - t0
        for s in seqs:
            e.release(s)
        engine_mod.prompt_order = prompt_order
        return first

    e.generate(Request(list(short_ids), sp, cache_prompt=False))  # warm up, measure costs
    runs = []
    for r in range(a.rounds):
        row = {"round": r,
               "alone_short": ttft([short_ids], prompt_order)[0],
               "alone_long": ttft([long_ids], prompt_order)[0]}
        names = list(orders) if r % 2 == 0 else list(orders)[::-1]
        for name in names:
            t_long, t_short = ttft([long_ids, short_ids], orders[name])
            row[name] = {"long": t_long, "short": t_short}
        runs.append(row)
        print(json.dumps(row), flush=True)

    def med(xs):
        return statistics.median(xs)

    summary = {"alone": {"long": med([x["alone_long"] for x in runs]),
                         "short": med([x["alone_short"] for x in runs])}}
    for name in orders:
        s = {}
        for which in ("long", "short"):
            ratios = [x[name][which] / x[f"alone_{which}"] for x in runs]
            s[which] = {"ttft_s": med([x[name][which] for x in runs]),
                        "over_alone": med(ratios), "range": [min(ratios), max(ratios)]}
        summary[name] = s
    out = {"cpu": cpu_line(), "command": command_line(),
           "tokens": {"long": len(long_ids), "short": len(short_ids)}, "runs": runs,
           "summary": summary}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
