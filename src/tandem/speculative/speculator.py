"""One sequence's speculation: which proposers draft, under which controller, and what they learn.

The engine asks a `Speculator` for a draft, has the target verify it, and tells it what was
accepted; everything about how drafts are made and sized lives here:

    draft = speculator.draft(budget, remaining)   proposers in order, the first useful draft
    ... target verifies [last, *draft] ...
    speculator.accept(draft, n_accepted, tokens)  proposers roll back, controllers calibrate
    speculator.end()                              the output joins the shared suffix pool

`Speculation` is what all sequences share: the measured pass costs (one machine), the draft
model and its cache, what each kind of proposer has shown over every request (acceptance by
position and by confidence: the controllers' estimates, so they need not be relearned per
request), the suffix pool.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..config import SamplingParams, SpecConfig
from ..models.decoder import KVCache
from ..models.loader import LoadedModel
from .account import Account
from .controller import AcceptanceTracker, Calibration, Controller, CostModel
from ..grammar import Guide
from .draft import DraftModelProposer
from .ngram import NgramProposer
from .proposer import Draft, Proposer
from .stats import SpecStats
from .suffix import OWN, POOL, SuffixPool, SuffixProposer


@dataclass(slots=True)
class _Entry:
    proposer: Proposer
    controller: Controller | None  # None: the proposer's own fixed rule (no auto)
    pool: Controller | None = None  # the suffix pool's drafts, calibrated apart (auto)


class Speculation:
    """What every sequence's speculation shares: `costs` (seconds per target pass by rows, per
    draft token; one machine, so one model of it), the draft model with its cache,
    `draft_history` (the draft model's acceptance over every request, to judge whether reading
    a prompt into it will pay) and the pool of earlier outputs (`--spec-suffix-pool`)."""

    def __init__(self, draft: LoadedModel | None, draft_cache: KVCache | None,
                 prefill_chunk: int, pool_tokens: int = 0, shared_catch_up: int = 64) -> None:
        self.draft, self.draft_cache, self.prefill_chunk = draft, draft_cache, prefill_chunk
        # tokens a lazy draft reads per step while other rows share the pass: its catch-up
        # then spreads over steps instead of stalling every other stream at once
        self.shared_catch_up = shared_catch_up
        self.costs = CostModel()
        self.draft_history = AcceptanceTracker()
        self.pool = SuffixPool(pool_tokens) if pool_tokens > 0 else None
        # what each kind of proposer has shown so far, over every request: how often its
        # tokens are accepted by position and by confidence. A controller starts from these
        # rather than from its priors, so a short request does not pay to relearn them
        self.learned: dict[str, tuple[AcceptanceTracker, Calibration]] = {
            "draft-simple": (self.draft_history, Calibration())}
        # how long the last answers were (tokens), to judge how many tokens are still to come
        self.lengths: deque[int] = deque(maxlen=64)

    def expected_remaining(self, produced: int, left: int) -> int:
        """Tokens a generation that has produced `produced` is expected to still produce, at
        most `left` (its budget): the median of how much longer the earlier answers that got
        this far went on (an answer that ends at 10 tokens tells nothing about one at 50).
        While fewer than 3 earlier answers got this far, as many as it has produced: with
        nothing else known, a generation is as likely to be past its middle as before it
        (Gott's Copernican estimate), so a fresh server does not bet a draft model's catch-up
        on the whole budget of an answer that may end after a few tokens; the bet grows with
        the answer."""
        longer = [n - produced for n in self.lengths if n > produced]
        if len(longer) < 3:
            return min(left, produced)
        return min(left, int(statistics.median(longer)))

    def start(self, spec: SpecConfig, slot: int, sampling: SamplingParams,
              gen: torch.Generator | None, prompt: list[int], stats: SpecStats,
              guide: Guide | None = None, prompt_read: int = 0) -> Speculator:
        """The speculation of a new sequence whose tokens so far are prompt (spec resolved).
        guide: the request's grammar; with speculation on, it drafts the tokens the grammar
        forces, cuts the other proposers' drafts where it forbids a token, and masks what the
        draft model samples from. prompt_read: the prompt tokens the target reads (not
        cached), where the request's account under auto starts (account.Account)."""
        entries: list[_Entry] = []
        for t in spec.types:
            if t == "ngram-simple":
                p: Proposer = NgramProposer(spec.ngram_min, spec.ngram_max, spec.ngram_m)
                n_max = spec.ngram_m
            elif t == "suffix":
                # under auto the controller cuts each draft; alone, a fixed confidence floor
                p = SuffixProposer(spec.suffix_max, self.pool,
                                   min_conf=0.0 if spec.adaptive else 0.5)
                n_max = spec.suffix_max
            elif t == "draft-simple":  # resolved specs name it only when there is a draft
                p = DraftModelProposer(self.draft.model, self.draft_cache, slot, sampling, gen,
                                       spec.n_max, spec.n_min, spec.draft_p_min,
                                       prefill_chunk=self.prefill_chunk,
                                       window=spec.draft_window, vocab=spec.draft_vocab,
                                       lazy=spec.adaptive, rejection=spec.draft_rejection,
                                       banned=tuple(self.draft.tokenizer.eog_ids)
                                       if sampling.ignore_eos else ())
                n_max = spec.n_max
            else:
                continue
            if isinstance(p, DraftModelProposer):
                p.guide = guide
            p.begin(list(prompt))
            ctl = pool = None
            if spec.adaptive:
                # this request's estimates, starting from every request's and learning into
                # them: its own drafts soon outweigh what other kinds of text showed
                ctl = self._controller(t, n_max)
                if t == "suffix" and self.pool is not None:
                    pool = self._controller(POOL, n_max)
            entries.append(_Entry(p, ctl, pool))
        account = None
        if spec.adaptive:
            account = Account(self.costs, prompt_read)
        return Speculator(self, entries, stats, guide if spec.enabled else None, account)

    def _controller(self, kind: str, n_max: int) -> Controller:
        if kind not in self.learned:
            # the pool's drafts start from what the requests' own drafts showed (see Calibration)
            prior = (self.learned.setdefault(OWN, (AcceptanceTracker(), Calibration()))[1]
                     if kind == POOL else None)
            self.learned[kind] = (AcceptanceTracker(), Calibration(prior=prior))
        acceptance, calibration = self.learned[kind]
        return Controller(self.costs, n_max=n_max,
                          acceptance=AcceptanceTracker(parent=acceptance),
                          calibration=Calibration(parent=calibration))


# standard deviations above the draft model's estimated acceptance that judge a catch-up
CATCH_UP_OPTIMISM = 1.0


class Speculator:
    """One sequence's proposers, each with its controller under auto (see `draft`)."""

    def __init__(self, shared: Speculation, entries: list[_Entry], stats: SpecStats,
                 guide: Guide | None = None, account: Account | None = None) -> None:
        self.shared, self.entries, self.stats = shared, entries, stats
        self.guide = guide  # the request's grammar (with speculation on)
        # under auto: how far ahead of the target alone, never more than RISK behind
        self.account = account
        self._drafting = 0.0  # the draft model's seconds (at the costs) for this step's draft
        self._by: _Entry | None = None  # the entry whose proposer drafted this step
        self._ctl: Controller | None = None  # ... and the controller that sized its draft
        self._ended = False
        self.produced = 0  # tokens generated so far
        self.steps = 0  # drafting opportunities so far
        self.covered = 0  # ... where a free proposer's draft was verified (the draft model's
        # catch-up can only pay on the others)

    @property
    def proposers(self) -> list[Proposer]:
        return [e.proposer for e in self.entries]

    def draft(self, budget: int, remaining: int, batch: tuple[int, int] = (0, 0)) -> Draft:
        """The proposers' draft (`_propose`) under the request's grammar, if it has one: cut
        at the first token the grammar forbids (the draft model's tokens never are: it samples
        under the same mask), and where the grammar forces tokens, those, unless the draft
        begins with them and goes further. Forced tokens are the grammar's draft, confidence 1:
        the only way on, verified with the rest, so a pass yields them all."""
        g = self.guide
        if g is None:
            return self._propose(budget, remaining, batch)
        self._by = None
        forced = g.forced(budget)
        d = self._propose(budget, remaining, batch)
        if d.ids:
            d = d.cut(g.valid(d.ids))
        if forced and not (len(d.ids) > len(forced) and d.ids[:len(forced)] == forced):
            if self._by is not None:  # its draft is not verified: roll the proposer back
                self._by.proposer.accept(0, [])
                self._by = None
            d = Draft(forced, None, [1.0] * len(forced), "grammar")
        if forced:
            self.stats.n_forced += len(forced)
        return d

    def _propose(self, budget: int, remaining: int, batch: tuple[int, int] = (0, 0)) -> Draft:
        """The first useful draft of the proposers in order, at most `budget` tokens.

        A free proposer (suffix, n-gram) drafts its most and its controller keeps the prefix
        the confidences say will pay (`Controller.cut`; a draft without confidences is capped
        by the per-position estimate). The draft model is costly per token: its controller
        chooses whether to call it (from its measured cost per token verified and its
        acceptance), then after each token whether one more pass pays (`Controller.extend`,
        from the calibrated confidences), and the confidences of what it drafted may cut it
        further (only verification counts then: the passes are spent).
        remaining: tokens this sequence may still generate (its budget; with the lengths of
        earlier answers it says whether a lazy draft model's catch-up on the prompt can pay).
        batch: (rows, tokens) of the rest of the pass this draft joins (other sequences' rows and
        prompt chunks; the tokens those other sequences are sure to gain), so that a controller
        weighs its rows by what they cost in this pass, not in a pass of its own."""
        self._by = None
        self._drafting = 0.0
        if budget <= 0:
            return Draft([])
        self.steps += 1
        costs = self.shared.costs
        account = self.account
        for e in self.entries:
            p, ctl = e.proposer, e.controller
            if p.free and e.pool is not None:
                t0 = time.perf_counter()
                d, ctl = self._own_or_pool(e, budget, batch)
                self.stats.t_draft += time.perf_counter() - t0
            elif p.free:
                t0 = time.perf_counter()
                d = p.propose(budget)
                self.stats.t_draft += time.perf_counter() - t0
                if ctl is not None and d.ids:
                    k = (ctl.cut(d.conf, *batch) if d.conf is not None
                         else ctl.choose(0.0, *batch))
                    d = d.cut(k)
            else:
                # under auto its controller says whether to call it at all (`choose`, from
                # its measured cost per token verified and acceptance), and then, token by
                # token, whether one more pass pays (`extend`, from the confidences)
                k = budget if ctl is None or ctl.choose(None, *batch) > 0 else 0
                if account is not None and k > 0:
                    k = account.affordable(k, costs.draft_token or 0.0)
                if k <= 0:
                    continue
                catch_up = p.unseen()
                if ctl is not None and catch_up > 2:
                    # a lazy draft (auto) has not read the prompt, or fell behind while idle
                    # the draft model can only help on the steps the free proposers leave
                    # empty: of the tokens still to come, that share (smoothed)
                    empty = (self.steps - self.covered + 1) / (self.steps + 2)
                    expected = self.shared.expected_remaining(self.produced, remaining) * empty
                    if not self._catch_up_pays(ctl.n_max, catch_up, expected):
                        continue
                    pre = costs.draft_prefill(catch_up)
                    if account is not None and pre is not None \
                            and not account.can_spend(pre):
                        continue  # it could put the request behind the target alone
                    t0 = time.perf_counter()
                    fed = p.prepare(self.shared.shared_catch_up if batch[0] else None)
                    dt = time.perf_counter() - t0
                    self.stats.t_draft += dt
                    if account is not None:
                        spent = costs.draft_prefill(fed)
                        account.spend(spent if spent is not None else dt)
                    costs.record_draft_prefill(fed, dt)
                    catch_up -= fed
                    if catch_up > 2:  # still reading (a shared pass): draft once caught up
                        continue
                    if account is not None:  # what the catch-up cost is not there to risk
                        k = account.affordable(k, costs.draft_token or 0.0)
                        if k <= 0:
                            continue
                t0 = time.perf_counter()
                if ctl is None:
                    d = p.propose(k)
                else:  # its controller says, token by token, whether one more pass pays
                    d = p.propose(k, lambda conf, c=ctl: c.extend(conf, *batch))
                dt = time.perf_counter() - t0
                self.stats.t_draft += dt
                self._drafting = len(d.ids) * (costs.draft_token or 0.0)
                passes = max(1, len(d.ids))  # one per token drafted; a call that gave none: one
                if ctl is not None and d.ids and d.conf is not None:
                    d = d.cut(ctl.cut(d.conf, *batch))
                # the cost of drafting per token verified (calls that gave none count too); a
                # draft that first caught up on many tokens it skipped while idle (k = 0 steps)
                # would overstate it: not recorded
                if catch_up <= 2:
                    costs.record_draft(len(d.ids), dt, passes)
            if account is not None and p.free and d.ids:
                d = d.cut(account.affordable(len(d.ids)))
            if d.ids:
                self._by, self._ctl = e, ctl
                self.covered += p.free
                d.source = p.kind
                return d
        return Draft([])

    def _own_or_pool(self, e: _Entry, budget: int,
                     batch: tuple[int, int]) -> tuple[Draft, Controller]:
        """The suffix proposer's two drafts (the request's own tokens, the pool of earlier
        outputs), each weighed by its own calibration: the one whose best cut is predicted to
        beat plain decoding by more is cut and verified (the own draft on a tie)."""
        own, pooled = e.proposer.options(budget)
        scored = [(c.gain(d.conf, *batch), kind, d, c)
                  for kind, d, c in ((OWN, own, e.controller), (POOL, pooled, e.pool))
                  if d.ids]
        if not scored:
            return Draft([]), e.controller
        (k, gain), kind, d, ctl = max(scored, key=lambda x: x[0][1])
        d = d.cut(ctl.decide(k, gain, d.conf))
        if d.ids:
            e.proposer.chosen(kind)
        return d, ctl

    def _catch_up_pays(self, n_max: int, n: int, remaining: float) -> bool:
        """Whether feeding the draft n unseen tokens now is likely to be paid back by the rest
        of this generation: the time the draft saves per remaining token (its best k against
        plain decoding, with the draft's acceptance so far over every request) times the
        tokens still to come, against what reading n tokens costs the draft (`CostModel.
        draft_prefill`). Unmeasured costs: yes (measure them).

        The acceptance is taken CATCH_UP_OPTIMISM standard deviations above its estimate: a
        draft model that was never read in has only its prior (2/3), which no catch-up of a
        mid-length answer pays for, so it would never be tried and its acceptance (0.85 for
        the default pair) never learned; one try teaches every later request, and the
        request's `Account` still bounds what the try can lose. Once the draft has drafted a
        few hundred tokens the bound is within a few hundredths of the estimate."""
        c = self.shared.costs
        t_plain, pre = c.verify_time(1), c.draft_prefill(n)
        if t_plain is None or pre is None:
            return True
        judge = Controller(c, n_max=n_max, acceptance=self.shared.draft_history,
                           optimism=CATCH_UP_OPTIMISM)
        d = c.draft_token or 0.0
        plain = judge.rate(0, d)
        best = max((judge.rate(k, d) or 0.0 for k in range(1, n_max + 1)), default=0.0)
        if not plain or best <= plain:
            return False
        return remaining * (1 / plain - 1 / best) > pre

    def accept(self, draft: Draft, n_accepted: int, tokens: list[int]) -> None:
        """The target kept n_accepted of the draft's tokens and appended `tokens`."""
        for p in self.proposers:
            p.accept(n_accepted, tokens)
        self.produced += len(tokens)
        k = len(draft.ids)
        if self.account is not None:
            self.account.step(k, len(tokens), self._drafting)
            self._drafting = 0.0
        if not k:
            return
        self.stats.record(k, n_accepted)
        if self._by is not None and self._ctl is not None:  # (the draft's: draft_history)
            self._ctl.update(k, n_accepted, draft.conf)

    def shift(self, keep: int, discard: int) -> None:
        """The sequence lost tokens keep .. keep + discard - 1 (the engine's context shift)."""
        for p in self.proposers:
            p.shift(keep, discard)

    def end(self, finished: bool = True) -> None:
        """The sequence is over (once): proposers may keep what it taught them, and its length
        joins the earlier answers' unless it was cut short (cancelled: finished False)."""
        if not self._ended:
            self._ended = True
            if finished:
                self.shared.lengths.append(self.produced)
            for p in self.proposers:
                p.end()
