"""Each proposer under its own rule for how much of its draft to verify (`Speculator` asks them
in order and verifies the first draft that pays).

    FreeDrafter     n-gram, suffix: drafting costs microseconds, so it drafts its most and its
                    controller keeps the prefix the confidences say will pay (`Controller.cut`)
    PooledDrafter   suffix with the pool under auto: the request's own draft and the pool's,
                    each calibrated apart; the one predicted to gain more is cut and verified
    ModelDrafter    the draft model: every token is a pass. Its controller says whether to call
                    it at all (`choose`), the request's `Account` what it may spend, whether a
                    lazy draft's catch-up on the prompt will be paid back (`catch_up_pays`),
                    and after each token whether one more pass pays (`extend`)

A drafter's `draft(sp, budget, remaining, batch)` returns a Draft (empty: nothing that pays);
`used` is the controller that sized it (None: the proposer's fixed rule), which learns from
what the target accepts (`Speculator.accept`).
"""

from __future__ import annotations

import time
from typing import Protocol

from .account import Account
from .controller import AcceptanceTracker, Controller, CostModel
from .proposer import Draft, Proposer
from .stats import SpecStats
from .suffix import OWN, POOL, SuffixProposer

# standard deviations above the draft model's estimated acceptance that judge a catch-up
CATCH_UP_OPTIMISM = 1.0
# tokens a costly proposer may be behind and still draft now: the one or two a verification
# leaves it (the last accepted token and the target's own)
BEHIND_AFTER_VERIFY = 2


class Shared(Protocol):
    """What every sequence's speculation shares (speculator.Speculation)."""

    costs: CostModel
    draft_history: AcceptanceTracker
    shared_catch_up: int

    def expected_remaining(self, produced: int, left: int) -> int: ...


class Speculator(Protocol):
    """What a drafter reads and writes of its sequence's speculation (speculator.Speculator)."""

    shared: Shared
    stats: SpecStats
    account: Account | None
    steps: int  # drafting opportunities so far
    covered: int  # ... where a free proposer's draft was verified
    produced: int  # tokens generated so far
    drafting: float  # the draft model's seconds (at the costs) for this step's draft


class FreeDrafter:
    """A proposer that costs next to nothing: its draft, cut by its controller (auto) by the
    confidences (`Controller.cut`), or, without confidences, to the per-position estimate."""

    def __init__(self, proposer: Proposer, controller: Controller | None) -> None:
        self.proposer, self.controller = proposer, controller
        self.used: Controller | None = None

    def draft(self, sp: Speculator, budget: int, remaining: int,
              batch: tuple[int, int]) -> Draft:
        ctl = self.used = self.controller
        t0 = time.perf_counter()
        d = self.proposer.propose(budget)
        sp.stats.t_draft += time.perf_counter() - t0
        if ctl is not None and d.ids:
            d = d.cut(ctl.cut(d.conf, *batch) if d.conf is not None else ctl.choose(0.0, *batch))
        return d


class PooledDrafter:
    """The suffix proposer's two drafts (the request's own tokens, the pool of earlier
    outputs), each weighed by its own calibration: the one whose best cut is predicted to
    beat plain decoding by more is cut and verified (the own draft on a tie)."""

    def __init__(self, proposer: SuffixProposer, controller: Controller,
                 pool: Controller) -> None:
        self.proposer, self.controller, self.pool = proposer, controller, pool
        self.used: Controller | None = None

    def draft(self, sp: Speculator, budget: int, remaining: int,
              batch: tuple[int, int]) -> Draft:
        t0 = time.perf_counter()
        own, pooled = self.proposer.options(budget)
        scored = [(c.gain(d.conf, *batch), kind, d, c)
                  for kind, d, c in ((OWN, own, self.controller), (POOL, pooled, self.pool))
                  if d.ids]
        self.used = self.controller
        d = Draft([])
        if scored:
            (k, gain), kind, d, self.used = max(scored, key=lambda x: x[0][1])
            d = d.cut(self.used.decide(k, gain, d.conf))
            if d.ids:
                self.proposer.chosen(kind)
        sp.stats.t_draft += time.perf_counter() - t0
        return d


class ModelDrafter:
    """A proposer whose every token is a model pass (the draft model). Without a controller it
    drafts `budget` tokens under its own rule (n_max, p_min); under auto see the module's
    docstring. Its cost per token verified is recorded for the controllers (calls that gave
    nothing count too; a call that first caught up on many skipped tokens would overstate it,
    so it is not recorded)."""

    def __init__(self, proposer: Proposer, controller: Controller | None) -> None:
        self.proposer, self.controller = proposer, controller
        self.used: Controller | None = None

    def draft(self, sp: Speculator, budget: int, remaining: int,
              batch: tuple[int, int]) -> Draft:
        ctl, account, costs = self.controller, sp.account, sp.shared.costs
        self.used = ctl
        k = budget if ctl is None or ctl.choose(None, *batch) > 0 else 0
        if account is not None and k > 0:
            k = account.affordable(k, costs.draft_token or 0.0)
        if k <= 0:
            return Draft([])
        behind = self.proposer.behind()
        if ctl is not None and behind > BEHIND_AFTER_VERIFY:
            k = self._catch_up(sp, k, behind, remaining, batch)
            if k <= 0:
                return Draft([])
            behind = self.proposer.behind()
        t0 = time.perf_counter()
        extend = None if ctl is None else (lambda conf: ctl.extend(conf, *batch))
        d = self.proposer.propose(k, extend)
        dt = time.perf_counter() - t0
        sp.stats.t_draft += dt
        sp.drafting = len(d.ids) * (costs.draft_token or 0.0)
        passes = max(1, len(d.ids))  # one per token drafted; a call that gave none: one
        if ctl is not None and d.ids and d.conf is not None:
            d = d.cut(ctl.cut(d.conf, *batch))  # the passes are spent: only verification counts
        if behind <= BEHIND_AFTER_VERIFY:
            costs.record_draft(len(d.ids), dt, passes)
        return d

    def _catch_up(self, sp: Speculator, k: int, behind: int, remaining: int,
                  batch: tuple[int, int]) -> int:
        """A lazy draft (auto) has not read the prompt, or fell behind while idle: read now if
        that is likely to pay (`catch_up_pays`) and the request's account can spend it; the
        tokens it may then draft (0: not now). The draft model can only help on the steps the
        free proposers leave empty: of the tokens still to come, that share (smoothed). In a
        shared pass it reads a bounded part per step, so no other stream stalls at once."""
        costs, account = sp.shared.costs, sp.account
        empty = (sp.steps - sp.covered + 1) / (sp.steps + 2)
        expected = sp.shared.expected_remaining(sp.produced, remaining) * empty
        if not catch_up_pays(sp, self.controller.n_max, behind, expected):
            return 0
        pre = costs.draft_prefill(behind)
        if account is not None and pre is not None and not account.can_spend(pre):
            return 0  # it could put the request behind the target alone
        t0 = time.perf_counter()
        fed = self.proposer.catch_up(sp.shared.shared_catch_up if batch[0] else None)
        dt = time.perf_counter() - t0
        sp.stats.t_draft += dt
        if account is not None:
            spent = costs.draft_prefill(fed)
            account.spend(spent if spent is not None else dt)
        costs.record_draft_prefill(fed, dt)
        if behind - fed > BEHIND_AFTER_VERIFY:  # still reading (a shared pass)
            return 0
        if account is not None:  # what the catch-up cost is not there to risk
            k = account.affordable(k, costs.draft_token or 0.0)
        return k


def catch_up_pays(sp: Speculator, n_max: int, n: int, remaining: float) -> bool:
    """Whether feeding the draft n unseen tokens now is likely to be paid back by the rest of
    this generation: the time the draft saves per remaining token (its best k against plain
    decoding, with the draft's acceptance so far over every request) times the tokens still to
    come, against what reading n tokens costs the draft (`CostModel.draft_prefill`).
    Unmeasured costs: yes (measure them).

    The acceptance is taken CATCH_UP_OPTIMISM standard deviations above its estimate: a draft
    model that was never read in has only its prior (2/3), which no catch-up of a mid-length
    answer pays for, so it would never be tried and its acceptance never learned; one try
    teaches every later request, and the request's `Account` still bounds what the try can
    lose. Once the draft has drafted a few hundred tokens the bound is within a few hundredths
    of the estimate (bench/results/validation-zen4-hopeful)."""
    c = sp.shared.costs
    t_plain, pre = c.verify_time(1), c.draft_prefill(n)
    if t_plain is None or pre is None:
        return True
    judge = Controller(c, n_max=n_max, acceptance=sp.shared.draft_history,
                       optimism=CATCH_UP_OPTIMISM)
    d = c.draft_token or 0.0
    plain = judge.rate(0, d)
    best = max((judge.rate(k, d) or 0.0 for k in range(1, n_max + 1)), default=0.0)
    if not plain or best <= plain:
        return False
    return remaining * (1 / plain - 1 / best) > pre
