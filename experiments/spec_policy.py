"""The speculation policy on fixed pass costs: what `auto` chose, and what it would cost.

On this shared machine two timed runs of the same policy differ by more than most policy
changes do. Greedy decoding makes the texts and the drafts deterministic; only the
controllers' cost estimates make the runs differ. So: measure the target's pass time for
1..N rows, a draft-model token and a draft prompt token once (medians), freeze the engine's
`CostModel` at those values, run every prompt with `--spec-type auto`, and count what the
policy did: passes by rows, drafted and accepted tokens by proposer, draft tokens read, and
every pass the draft model made while drafting (also those whose tokens were cut or gave
none). The modeled decode time is the sum of those at the frozen costs; the target alone's is
tokens x t(1). The speed-ups are what the policy would give on a machine with these costs,
without the noise (per-step overheads outside the passes are not in it). The draft model's
cost per token verified is learned as in service, from its passes at the frozen step cost.
(Before 2026-12-04 the model charged only drafted tokens that were verified, which flattered
a draft whose calls often gave nothing.)

    python experiments/spec_policy.py --prompts bench/prompts/held-out-mix.jsonl \\
        --n-predict 256 --out /tmp/policy.json

Run it at two revisions (PYTHONPATH=<worktree>/src) to compare policies on the same costs:
`--costs FILE` reuses a table an earlier run wrote. `--pool N` gives the suffix proposer a pool
of N earlier output tokens (`--spec-suffix-pool`); `--passes P` runs the prompts P times in one
engine (a later pass may answer a repeated prompt from the pool), each pass reported apart.
`--trace` prints every draft verified with what the controller believed of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tandem.speculative.draft import draft_step_seconds


def measure(engine, rows_max: int, vocab: int, rounds: int = 5) -> dict:
    """Median seconds of target passes of 1..rows_max rows, a draft token, a draft prompt
    token (in a free cache area of slot 0)."""
    cache, model = engine.cache, engine.target.model
    base = 600  # a context of 600 tokens: the mix's typical
    ids = torch.zeros(1, base, dtype=torch.long)
    model(ids, cache, [0], [0], logits="none")
    t: dict[int, list[float]] = {}
    for _ in range(rounds):
        for r in range(1, rows_max + 1):
            t0 = time.perf_counter()
            model(torch.zeros(1, r, dtype=torch.long), cache, [0], [base])
            t.setdefault(r, []).append(time.perf_counter() - t0)
    out = {"verify": {r: statistics.median(v) for r, v in t.items()}}
    chunk = []  # the target reading a 512-token prompt chunk, per row
    for _ in range(rounds):
        t0 = time.perf_counter()
        model(torch.zeros(1, 512, dtype=torch.long), cache, [0], [base], logits="none")
        chunk.append((time.perf_counter() - t0) / 512)
    out["prompt_token"] = statistics.median(chunk)
    d = engine.speculation.draft
    if d is not None:
        dc = engine.speculation.draft_cache
        t0 = time.perf_counter()
        d.model(ids, dc, [0], [0], logits="none")
        out["draft_prefill_token"] = (time.perf_counter() - t0) / base
        # one drafted token as `propose` makes it: logits over the shortlist of vocab ids
        steps = [draft_step_seconds(d.model, dc, 0, base, vocab, rounds=1)
                 for _ in range(5 * rounds)]
        out["draft_token"] = statistics.median(steps)
    return out


def main() -> int:
    from tandem.config import EngineConfig, SamplingParams, SpecConfig
    from tandem.engine import Request
    from tandem.flags import load_engine
    from tandem.speculative import controller, speculator
    from tandem.speculative.draft import DraftModelProposer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--costs", help="a costs table written by an earlier run (JSON)")
    ap.add_argument("--pool", type=int, default=0, help="--spec-suffix-pool (0: off)")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--draft-n-max", type=int, default=4, help="--spec-draft-n-max")
    ap.add_argument("--draft-window", type=int, default=0,
                    help="--spec-draft-window (0: the draft reads the whole prompt)")
    ap.add_argument("--trace", action="store_true",
                    help="print every verified draft: own or pool, k, accepted, the proposer's "
                         "confidences and the calibrated probabilities the controller used")
    ap.add_argument("--prompt-token", type=float,
                    help="seconds per prompt row (a costs table measured before it had one)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = EngineConfig(ctx_size=4096, n_threads=a.threads)
    spec = SpecConfig(types=["auto"], suffix_pool=a.pool, n_max=a.draft_n_max,
                      draft_window=a.draft_window).resolved(True)
    engine = load_engine("default", "default-draft", cfg, spec)
    rows_max = spec.max_k + 1
    if a.costs:
        costs = json.loads(Path(a.costs).read_text())["costs"]
        costs["verify"] = {int(r): s for r, s in costs["verify"].items()}
    else:
        costs = measure(engine, rows_max, spec.draft_vocab)
    # frozen: every decision is taken on these costs, in every run
    cm = engine.costs
    cm.verify = dict(costs["verify"])
    cm.draft_token, cm.draft_prefill_token = costs["draft_token"], costs["draft_prefill_token"]
    cm.draft_step = costs["draft_token"]
    if a.prompt_token is not None:
        costs["prompt_token"] = a.prompt_token
    cm.prompt_token = costs.get("prompt_token")
    engine._calibrated = True
    for name in ("record_verify", "record_draft_prefill", "record_prompt"):
        setattr(controller.CostModel, name, lambda self, *args: None)
    # the draft model's cost per token verified is learned as in service (calls that gave no
    # token, tokens drafted and then cut, count), from its passes at the frozen step cost
    in_call = [0]  # draft model passes (forward calls while drafting) of the current call
    record_draft = controller.CostModel.record_draft
    controller.CostModel.record_draft = lambda self, tokens, seconds, passes=0: record_draft(
        self, tokens, in_call[0] * costs["draft_token"])  # (the step stays frozen)

    steps: list[tuple[str, int, int]] = []
    fed: list[int] = []
    accept = speculator.Speculator.accept

    def logged_accept(self, draft, n, tokens):
        steps.append((draft.source or "-", len(draft.ids), n))
        if a.trace and draft.ids and self._ctl is not None and draft.conf:
            kind = "pool" if self._ctl is self._by.pool else "own"
            print(f"   {draft.source} {kind} k {len(draft.ids)} accepted {n} conf "
                  f"{[round(c, 2) for c in draft.conf]} p "
                  f"{[round(self._ctl.calibration.p(c), 2) for c in draft.conf]} "
                  f"at {self.produced}", flush=True)
        return accept(self, draft, n, tokens)

    speculator.Speculator.accept = logged_accept
    prepare = DraftModelProposer.prepare

    def logged_prepare(self, limit=None):
        n = prepare(self, limit)
        fed.append(n)
        return n

    DraftModelProposer.prepare = logged_prepare
    feed = DraftModelProposer._feed
    feeds: list[int] = []  # every draft model pass made while drafting (not catch-up reads)

    def counted_feed(self, ids):
        in_call[0] += 1
        feeds.append(len(ids))
        return feed(self, ids)

    DraftModelProposer._feed = counted_feed
    propose = DraftModelProposer.propose

    def counted_propose(self, k, *args):
        in_call[0] = 0
        return propose(self, k, *args)

    DraftModelProposer.propose = counted_propose
    tok = engine.target.tokenizer
    tasks = [json.loads(line) for line in Path(a.prompts).read_text().splitlines() if line]
    v = costs["verify"]
    results = []
    for t in [dict(t, run=i) for i in range(a.passes) for t in tasks]:
        steps.clear()
        fed.clear()
        feeds.clear()
        seq = engine.generate(Request(tok.encode(t["prompt"]),
                                      SamplingParams(n_predict=a.n_predict, temperature=0.0),
                                      cache_prompt=False))
        n = len(seq.output)
        passes = sum(v[k + 1] for _, k, _ in steps)
        # every pass of the draft model, also those whose tokens were not verified
        drafting = costs["draft_token"] * len(feeds)
        reading = costs["draft_prefill_token"] * sum(fed)
        by = {}
        for s, k, acc in steps:
            if k:
                e = by.setdefault(s, [0, 0, 0])
                e[0] += 1
                e[1] += k
                e[2] += acc
        alone = n * v[1]
        model = passes + drafting + reading
        prompt = seq.n_prompt_processed * (costs.get("prompt_token") or 0.0)
        results.append({"task": t["task"], "pass": t["run"], "tokens": n, "steps": len(steps), "drafts": by,
                        "draft_read": sum(fed), "draft_passes": len(feeds), "alone_s": alone, "auto_s": model,
                        "prompt_s": prompt,
                        "speedup": alone / model if model else None,
                        "wall_speedup": (prompt + alone) / (prompt + model) if model else None})
        r = results[-1]
        print(f"{t['run']} {t['task']:32s} {n:4d} tokens {len(steps):4d} passes  modeled {r['speedup']:.3f}x"
              f" (with the prompt {r['wall_speedup']:.3f}x)  {by}  read {sum(fed)} passes {len(feeds)}", flush=True)
    for i in range(a.passes):
        rs = [r for r in results if r["pass"] == i]
        total_alone = sum(r["alone_s"] for r in rs)
        total = sum(r["auto_s"] for r in rs)
        prompt = sum(r["prompt_s"] for r in rs)
        print(f"pass {i}: overall modeled decode speed-up {total_alone / total:.3f}x; "
              f"lowest {min(r['speedup'] for r in rs):.3f}x; with the prompt "
              f"{(prompt + total_alone) / (prompt + total):.3f}x, lowest "
              f"{min(r['wall_speedup'] for r in rs):.3f}x")
    Path(a.out).write_text(json.dumps({"costs": costs, "results": results,
                                       "command": " ".join(sys.argv)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
