"""What --spec-draft-window and --spec-draft-vocab do to the draft's proposals, deterministically.

Greedy draft-simple (n-max 4, p-min 0.75) on the benchmark prompts, with the draft reading the
whole prompt, only its last 256 or 64 tokens, or proposing from the 32768-id shortlist: how many
draft calls, drafted and accepted tokens. Timing plays no part in these counts (no adaptive
controller), so they compare the options exactly on this noisy machine; their costs are
measured separately (a draft step, a prompt token).

    python experiments/draft_options.py --n-predict 64 --out bench/results/draft-options

Writes OUT/report.md and OUT/result.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {
    "whole prompt, whole vocabulary": dict(draft_vocab=0),
    "vocabulary shortlist 32768 (default)": dict(draft_vocab=32768),
    "prompt window 256": dict(draft_vocab=0, draft_window=256),
    "prompt window 64": dict(draft_vocab=0, draft_window=64),
}


def step_ms(draft, vocab: int, steps: int = 12) -> float:
    """Median ms of one draft token after a 256-token context, full or shortlisted output."""
    from tandem.models.decoder import KVCache
    from tandem.speculative.draft import Shortlist

    cache = KVCache(draft.args, 1, 512, torch.float32)
    ids = list(range(1000, 1256))
    draft.model(torch.tensor([ids]), cache, [0], [0], logits="none")
    cache.append(0, ids)
    short = Shortlist(draft.model.output, vocab, draft.args.vocab_size) if vocab else None
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        x = torch.tensor([[5]])
        if short is None:
            draft.model(x, cache, [0], [cache.length(0)], logits="last")
        else:
            short.logits(draft.model(x, cache, [0], [cache.length(0)], logits="hidden")[0])
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> int:
    from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
    from tandem.engine import Engine, Request
    from tandem.models.loader import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompts", default=str(ROOT / "bench/prompts/cpu-tasks.jsonl"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_model("default", max_len=4096)
    draft = load_model("default-draft", Numerics(activations="int8"), max_len=4096)
    tok = target.tokenizer
    tasks = [json.loads(line) for line in Path(a.prompts).read_text().splitlines() if line]
    results = {}
    for name, opts in OPTIONS.items():
        e = Engine(target, draft, EngineConfig(ctx_size=4096),
                   SpecConfig(types=["draft-simple"], **opts))
        per_task = {}
        for t in tasks:
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": t["prompt"]}]))
            seq = e.generate(Request(ids, SamplingParams(n_predict=a.n_predict, temperature=0.0),
                                     cache_prompt=False))
            st = seq.stats
            per_task[t["task"]] = {"drafts": st.n_drafts, "drafted": st.n_drafted,
                                   "accepted": st.n_accepted, "output": seq.output}
            print(name, t["task"], per_task[t["task"]]["drafted"],
                  per_task[t["task"]]["accepted"], flush=True)
        results[name] = per_task
    costs = {"draft step ms, whole vocabulary": [step_ms(draft, 0) for _ in range(2)],
             "draft step ms, shortlist 32768": [step_ms(draft, 32768) for _ in range(2)]}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    (out / "result.json").write_text(json.dumps({"command": f"python {cmd}", "results": results,
                                                 "costs": costs}, indent=1))
    base = results["whole prompt, whole vocabulary"]
    lines = ["# Draft options: proposals with a prompt window or a vocabulary shortlist", "",
             f"Command: `python {cmd}`", "",
             f"Greedy draft-simple, n-max 4, p-min 0.75, {a.n_predict} tokens per task.", "",
             "| option | drafts | drafted | accepted | acceptance | accepted per draft | "
             "same drafts as the whole prompt and vocabulary |", "|---|---|---|---|---|---|---|"]
    for name, per_task in results.items():
        d = sum(x["drafts"] for x in per_task.values())
        n = sum(x["drafted"] for x in per_task.values())
        acc = sum(x["accepted"] for x in per_task.values())
        same = all((per_task[k]["drafts"], per_task[k]["drafted"], per_task[k]["accepted"])
                   == (base[k]["drafts"], base[k]["drafted"], base[k]["accepted"])
                   for k in per_task)
        lines.append(f"| {name} | {d} | {n} | {acc} | {100 * acc / max(n, 1):.1f}% | "
                     f"{acc / max(d, 1):.2f} | {'yes' if same else 'no'} |")
    lines += ["", "Draft step after a 256-token context, median of 12, two rounds (ms): " +
              "; ".join(f"{k}: {', '.join(f'{v:.1f}' for v in vals)}" for k, vals in costs.items()),
              ""]
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
