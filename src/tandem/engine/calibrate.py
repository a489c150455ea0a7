"""The pass costs the controllers and the scheduler start from, timed once per engine."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from ..models.decoder import KVCache
from ..models.loader import LoadedModel
from ..speculative.controller import CostModel
from ..speculative.draft import draft_step_seconds
from ..speculative.eagle import head_step_seconds

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
    """An EAGLE-3 head's drafted token (as propose makes it) and its reading of target
    features per pair, in the free area after what its cache slot holds (written, not
    recorded: the slot keeps its length)."""
    feats = torch.zeros(32, 3 * head.cfg.target_dim)
    _calibrate_drafter(
        costs, cache, slot, lambda at: head_step_seconds(head, cache, slot, at),
        lambda at, rows: head.forward([0] * rows, head.encode(feats[:rows]), cache, slot, at))


def _calibrate_draft(costs: CostModel, draft: LoadedModel, cache: KVCache, slot: int,
                     vocab: int) -> None:
    """A drafted token's seconds (as propose makes it) and the draft's prompt cost per token."""
    _calibrate_drafter(
        costs, cache, slot, lambda at: draft_step_seconds(draft.model, cache, slot, at, vocab),
        lambda at, rows: draft.model(torch.zeros(1, rows, dtype=torch.long), cache, [slot],
                                     [at], logits="none"))


def _calibrate_drafter(costs: CostModel, cache: KVCache, slot: int,
                       step: Callable[[int], float], read: Callable[[int, int], object]) -> None:
    """A drafter's step (`step(at)`: seconds of one drafted token at position at) and its
    reading of up to 32 prompt rows (`read(at, rows)`), per row, after the slot's tokens."""
    at = cache.length(slot)
    seconds = step(at)
    costs.record_draft(1, seconds)
    costs.draft_step = seconds
    rows = min(32, cache.max_len - at - 1)
    if rows > 0:  # reading a prompt chunk, per token
        t0 = time.perf_counter()
        read(at, rows)
        costs.record_draft_prefill(rows, time.perf_counter() - t0)
