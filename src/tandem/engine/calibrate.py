"""The pass costs the controllers and the scheduler start from, timed once per engine."""

from __future__ import annotations

import math
import time

import torch

from ..models.decoder import KVCache
from ..models.loader import LoadedModel
from ..speculative.controller import CostModel
from ..speculative.draft import draft_step_seconds

PROMPT_MEASURE_ROWS = 16  # a prompt-only pass this large measures the per-row prompt cost


def calibrate(costs: CostModel, target: LoadedModel, cache: KVCache, slot: int, n: int,
              draft: LoadedModel | None = None, draft_cache: KVCache | None = None,
              draft_vocab: int = 0) -> bool:
    """Time target passes of up to n rows, a prompt chunk and a draft step in a free cache area
    after the slot's own tokens, so the controllers and the scheduler have costs before their
    first choice; False when the slot has no room for it. Two rounds over every row count,
    keeping each one's faster time: a slow spell of this shared machine during one pass would
    otherwise bend the cost curve the controller starts from."""
    base = cache.length(slot)
    if base + n + 1 >= cache.max_len:
        return False
    best: dict[int, float] = {}
    # every row count up to 9, then every fourth (costs in between are interpolated)
    counts = sorted({*range(1, min(n, 9) + 1), *range(13, n, 4), n})
    for _ in range(2):
        for rows in counts:
            t0 = time.perf_counter()
            target.model(torch.zeros(1, rows, dtype=torch.long), cache, [slot], [base])
            best[rows] = min(best.get(rows, math.inf), time.perf_counter() - t0)
    for rows, seconds in best.items():
        costs.record_verify(rows, seconds)
    rows = min(2 * PROMPT_MEASURE_ROWS, cache.max_len - base - 1)
    if rows >= PROMPT_MEASURE_ROWS:  # a prompt chunk's cost per row (no logits)
        t0 = time.perf_counter()
        target.model(torch.zeros(1, rows, dtype=torch.long), cache, [slot], [base],
                     logits="none")
        costs.record_prompt(rows, time.perf_counter() - t0)
    if draft is not None:
        _calibrate_draft(costs, draft, draft_cache, slot, draft_vocab)
    return True


def calibrate_head(costs: CostModel, head, cache: KVCache, slot: int) -> None:
    """An EAGLE-3 head's drafted token (one pair and its logits, the fastest of 3: the first
    call pays one-time costs) and its reading of target features, per pair, in the head's own
    cache slot (whose proposer starts it afresh)."""
    feats = torch.zeros(32, 3 * head.cfg.target_dim)
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        head.logits(head.forward([0], torch.zeros(1, head.cfg.dim), cache, slot, 0))
        best = min(best, time.perf_counter() - t0)
    costs.record_draft(1, best)
    costs.draft_step = best
    t0 = time.perf_counter()
    head.forward([0] * len(feats), head.encode(feats), cache, slot, 0)
    costs.record_draft_prefill(len(feats), time.perf_counter() - t0)
    cache.truncate(slot, 0)


def _calibrate_draft(costs: CostModel, draft: LoadedModel, cache: KVCache, slot: int,
                     vocab: int) -> None:
    """A drafted token's seconds (as propose makes it) and the draft's prompt cost per token."""
    at = cache.length(slot)
    step = draft_step_seconds(draft.model, cache, slot, at, vocab)
    costs.record_draft(1, step)
    costs.draft_step = step
    rows = min(32, cache.max_len - at - 1)
    if rows > 0:  # the draft reading a prompt chunk, per token
        t0 = time.perf_counter()
        draft.model(torch.zeros(1, rows, dtype=torch.long), cache, [slot], [at], logits="none")
        costs.record_draft_prefill(rows, time.perf_counter() - t0)
