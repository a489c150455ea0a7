"""What goes into the next pass: the slot table, the waiting list, and one `StepPlan` per step.

The Scheduler owns every decision about who runs and how many rows each gets; the engine
carries the plan out (drafts, one packed target pass, verification) and never decides it.

- Admission: waiting requests take free slots first come, first served; a request that asked
  for a slot (id_slot) waits for that one without holding back the others; one that may take
  any takes the free slot whose cache shares the longest prefix with its prompt (so
  cache_prompt can reuse it).
- Prompt order: least slack first (`prompt_order`).
- Rows: generating sequences come first, one row each plus a draft. While any generates, a
  waiting prompt gets a chunk that takes about PROMPT_SHARE times the time of those rows
  (`prompt_share`), within --batch-size rows in all, and the generating rows carry no draft;
  with none generating, a prompt goes in chunks of --batch-size (llama-server's -b).
- The shared pool (--kv-unified): what a pass adds must fit (`_fit_pool`).

The plan is computed from the sequences, the measured costs and the caches' lengths alone:
the scheduler never calls back into the engine, so every rule here is testable without one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from .. import media as mediamod
from ..config import EngineConfig
from ..errors import TandemError
from ..speculative.controller import CostModel
from .sequence import Request, Sequence

# prompt rows beside generating rows take this many times the time those rows take alone
# (`Scheduler.prompt_share`): gaps at most 3x, prompts read at 2/3 speed
PROMPT_SHARE = 2.0
# seconds per prompt row before the engine has measured one (about a 1.5B model on 2 cores):
# only the order depends on it, never what is computed
ROW_SECONDS_GUESS = 0.015


class Waiting(Protocol):
    n_prompt: int  # prompt tokens
    prefill_at: int  # of them already in the cache
    t_start: float  # when the request was added (time.perf_counter)


def prompt_order(waiting: Seq[Waiting], row_seconds: float | None,
                 now: float | None = None) -> list:
    """The sequences still reading their prompts, the one to read first first: by remaining
    prompt rows times the measured seconds per row, less the seconds waited so far; ties (the
    same key) by arrival.

    On a CPU reading prompts is compute-bound: two prompts that arrive together take their sum
    to read however they are interleaved, so the order decides only who waits. Oldest first
    lets a short question that arrived a moment after a long document wait for all of it;
    shortest remaining first (SRPT, which minimizes the mean) reads the question first, and
    the document then waits only for the question. SRPT alone could keep a long prompt waiting
    while short ones keep arriving, so the key is the remaining time less the time waited
    (least slack first): a prompt moves ahead of a newer one once it has waited about as long
    as the difference of their remaining times.

    Example (10 ms a row): a 300-row prompt added at t=10.0 and a 20-row one at 10.001 are
    read short first; a 20-row prompt added at t=13.0 waits behind the long one, which has
    waited 3 s > 2.8 s (the difference of their reading times)."""
    now = time.perf_counter() if now is None else now
    t_row = row_seconds if row_seconds and row_seconds > 0 else ROW_SECONDS_GUESS

    def slack(s: Waiting) -> tuple[float, float]:
        left = s.n_prompt - 1 - s.prefill_at  # the last prompt token is read with the first row
        return left * t_row - (now - s.t_start), s.t_start

    return sorted(waiting, key=slack)


@dataclass(slots=True)
class Chunk:
    """Prompt tokens seq.tokens[start:end] read in this pass (no logits)."""

    seq: Sequence
    start: int
    end: int


@dataclass(slots=True)
class StepPlan:
    """One pass: the generating sequences (each a row [last, *draft], its draft at most
    budgets[i] tokens and all drafts together at most draft_room), the prompt chunks after
    them, and what must happen first under --kv-unified (idle slots' tokens evicted to the
    prompt cache; requests failed with their error, the pool being full)."""

    gen: list[Sequence]
    filling: list[Sequence]  # sequences still reading their prompts (in prompt order)
    chunks: list[Chunk]
    prompt_rows: int  # rows the chunks may take (what the drafts' controllers weigh)
    draft_room: int
    budgets: list[int] = field(default_factory=list)  # per gen: the most its draft may hold
    remaining: list[int] = field(default_factory=list)  # per gen: tokens it may still make
    evict: bool = False
    fail: list[tuple[Sequence, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.gen and not self.filling


class Scheduler:
    """The slot table (`slots`), the waiting list (`waiting`) and the plan of each pass."""

    def __init__(self, cfg: EngineConfig, max_k: int, full_speed_rows: int) -> None:
        self.cfg, self.max_k, self.full_speed_rows = cfg, max_k, full_speed_rows
        self.slots: list[Sequence | None] = [None] * cfg.n_parallel
        self.waiting: deque[Sequence] = deque()

    # -- admission -----------------------------------------------------------------------

    def free_slot(self, id_slot: int = -1) -> int | None:
        """id_slot if it is free (-1: the first free slot); None when none is."""
        if id_slot >= 0:
            if id_slot >= len(self.slots):
                raise TandemError(f"id_slot {id_slot} out of range (0..{len(self.slots) - 1})")
            return id_slot if self.slots[id_slot] is None else None
        return next((i for i, s in enumerate(self.slots) if s is None), None)

    def slot_for(self, req: Request, common_prefix) -> int | None:
        """A free slot for req: its own id_slot, else the free slot whose cache shares the
        longest prefix with the prompt (common_prefix(slot, ids)), else the first free."""
        if req.id_slot >= 0:
            return self.free_slot(req.id_slot)
        free = [i for i, s in enumerate(self.slots) if s is None]
        if not free or not req.cache_prompt:
            return free[0] if free else None
        return max(free, key=lambda i: common_prefix(i, req.prompt_ids[:-1]))

    def next_admissible(self, common_prefix) -> Sequence | None:
        """The oldest waiting sequence a free slot can take, out of the waiting list with
        that slot (seq.slot); first come, first served for those that take any slot."""
        for seq in self.waiting:
            slot = self.slot_for(seq.req, common_prefix)
            if slot is not None:
                self.drop(seq)
                seq.slot = seq.req.id_slot = slot
                return seq
            if seq.req.id_slot < 0:
                return None
        return None

    def drop(self, seq: Sequence) -> bool:
        """Take seq off the waiting list (True if it was there)."""
        for i, w in enumerate(self.waiting):
            if w is seq:
                del self.waiting[i]
                return True
        return False

    def active(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None and not s.done]

    # -- the plan of one pass --------------------------------------------------------------

    def plan(self, costs: CostModel, lengths: list[int]) -> StepPlan:
        """The next pass of the active sequences; lengths: each slot's cached tokens (for the
        shared pool)."""
        seqs = self.active()
        gen = [s for s in seqs if not s.prefilling]
        filling = prompt_order([s for s in seqs if s.prefilling], costs.prompt_token)
        limit = self.cfg.batch_size
        if not gen:  # the first prompt alone: it starts generating as soon as it is read
            prompt_rows, draft_room = min(_left(filling[0]), limit), 0
        elif filling:  # no drafts: the prompt's chunk takes their time (see prompt_share)
            waiting = sum(_left(s) for s in filling)
            prompt_rows = min(waiting, self.prompt_share(len(gen), limit - len(gen), costs))
            draft_room = 0
        else:  # nothing waits: each draft is bounded by its own budget and controller
            prompt_rows, draft_room = 0, self.max_k * len(gen)
        plan = StepPlan(gen, filling, [], prompt_rows, draft_room)
        if self.cfg.pool is not None:
            self._fit_pool(plan, lengths)
        plan.chunks = _chunks(plan.filling, plan.prompt_rows)
        plan.budgets = [self.budget(s) for s in plan.gen]
        plan.remaining = [self.remaining(s) for s in plan.gen]
        return plan

    def prompt_share(self, rows: int, room: int, costs: CostModel) -> int:
        """How many prompt rows go into a pass next to `rows` generating rows: as many as take
        PROMPT_SHARE (2) times what those rows take by themselves (measured costs), at most
        `room` (the --batch-size left), at least 1. The running streams' gaps then grow at most
        (1 + 2) = 3 times while the prompt is read, and the prompt reads at 2/3 of its speed
        alone (time to first token at most 1.5 times). On a CPU a prompt row costs about as
        much in a shared pass as alone, so no split does better on both; and a drafted row in
        such a pass would lengthen it without reading the prompt, so the generating rows carry
        no draft until the prompt is read. A pass holds at least the model's full-speed rows
        (the prompt kernel's): with fewer, every row costs more. Unmeasured costs: that floor
        alone."""
        room = max(1, room)
        floor = self.full_speed_rows - rows
        t_gen, t_row = costs.verify_time(rows), costs.prompt_token
        if t_gen is None or not t_row:  # unmeasured: the smallest chunk that reads at speed
            return max(1, min(room, floor))
        return max(1, min(room, max(int(PROMPT_SHARE * t_gen / t_row), floor)))

    def budget(self, seq: Sequence) -> int:
        """How many tokens one more pass may draft for seq."""
        left = self.cfg.ctx_size - len(seq.tokens)
        n = seq.req.sampling.n_predict
        if n >= 0:
            left = min(left, n - len(seq.output))
        return max(0, min(left - 1, self.max_k, len(seq.spec.synth or ()) or self.max_k))

    def remaining(self, seq: Sequence) -> int:
        """Tokens seq may still generate (n_predict, else the context left)."""
        n = seq.req.sampling.n_predict
        return n - len(seq.output) if n >= 0 else self.cfg.ctx_size - len(seq.tokens)

    def _fit_pool(self, plan: StepPlan, lengths: list[int]) -> None:
        """--kv-unified: the slots share ctx_size positions. A pass adds at least one token per
        generating sequence, its prompt rows, and at most its drafted tokens. When that does
        not fit, idle slots' cached tokens go first (plan.evict); then drafts and prompt rows
        shrink to what fits (a prompt waits for room); then, while the generating rows alone
        do not fit (or nothing could move), the newest request fails with the context size
        exceeded (plan.fail), as llama-server's requests do when its unified cache is full."""
        pool, held = self.cfg.pool, sum(lengths)
        idle = sum(n for i, n in enumerate(lengths) if self.slots[i] is None)
        while True:
            free = pool - held
            if free < len(plan.gen) + plan.prompt_rows + plan.draft_room and not plan.evict:
                plan.evict, held = True, held - idle
                free = pool - held
            room = free - len(plan.gen)
            if room >= 0 and (plan.gen or min(plan.prompt_rows, room) > 0):
                plan.prompt_rows = min(plan.prompt_rows, room)
                plan.draft_room = min(plan.draft_room, room - plan.prompt_rows)
                return
            victim = max(plan.gen + plan.filling, key=lambda q: q.t_start)
            plan.fail.append((victim, (
                f"the context size has been exceeded: with --kv-unified the "
                f"{self.cfg.n_parallel} slots share {pool} tokens and hold {held}; this "
                f"request held {lengths[victim.slot]}")))
            held -= lengths[victim.slot]
            plan.gen = [q for q in plan.gen if q is not victim]
            plan.filling = [q for q in plan.filling if q is not victim]
            if plan.empty:
                plan.prompt_rows = plan.draft_room = 0
                return
            if not plan.gen:  # the first waiting prompt alone
                plan.prompt_rows = min(_left(plan.filling[0]), self.cfg.batch_size)
            plan.draft_room = 0


def _left(s: Sequence) -> int:
    """Prompt tokens s has still to read (the last one is read with its first row)."""
    return s.n_prompt - 1 - s.prefill_at


def _chunks(filling: list[Sequence], rows: int) -> list[Chunk]:
    """The prompts' next chunks in prompt order, `rows` in all; a chunk never ends inside an
    image (media.chunk_end)."""
    chunks = []
    for s in filling:
        if rows <= 0:
            break
        end = min(s.n_prompt - 1, s.prefill_at + rows)
        end = mediamod.chunk_end(s.req.media, s.prefill_at, end)
        chunks.append(Chunk(s, s.prefill_at, end))
        rows -= end - s.prefill_at
    return chunks
