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
from collections import deque

import torch

from ..config import SamplingParams, SpecConfig
from ..models.decoder import KVCache
from ..models.eagle3 import Eagle3Head
from ..models.loader import LoadedModel
from ..grammar import Guide
from .account import Account
from .controller import AcceptanceTracker, Calibration, Controller, CostModel
from .draft import DraftModelProposer
from .eagle import Eagle3Proposer
from .drafters import FreeDrafter, ModelDrafter, PooledDrafter
from .ngram import NgramProposer
from .proposer import Draft, Proposer
from .stats import SpecStats
from .suffix import OWN, POOL, SuffixPool, SuffixProposer

Drafter = FreeDrafter | PooledDrafter | ModelDrafter


class Speculation:
    """What every sequence's speculation shares: `costs` (seconds per target pass by rows, per
    draft token; one machine, so one model of it), the draft model with its cache,
    `draft_history` (the draft model's acceptance over every request, to judge whether reading
    a prompt into it will pay) and the pool of earlier outputs (`--spec-suffix-pool`)."""

    def __init__(self, draft: LoadedModel | None, draft_cache: KVCache | None,
                 prefill_chunk: int, pool_tokens: int = 0, shared_catch_up: int = 64,
                 head: Eagle3Head | None = None, head_cache: KVCache | None = None,
                 eog: tuple[int, ...] = ()) -> None:
        self.draft, self.draft_cache, self.prefill_chunk = draft, draft_cache, prefill_chunk
        # an EAGLE-3 head (--model-draft HEAD) and its cache, instead of a draft model
        self.head, self.head_cache = head, head_cache
        self.eog = eog  # the target's end-of-generation ids (never drafted under ignore_eos)
        self.head_bases: dict[int, int | None] = {}  # per slot, where the head's pairs start
        # tokens a lazy draft reads per step while other rows share the pass: its catch-up
        # then spreads over steps instead of stalling every other stream at once
        self.shared_catch_up = shared_catch_up
        self.costs = CostModel()
        self.draft_history = AcceptanceTracker()
        self.pool = SuffixPool(pool_tokens) if pool_tokens > 0 else None
        # what each kind of proposer has shown so far, over every request: how often its
        # tokens are accepted by position and by confidence. A controller starts from these
        # rather than from its priors, so a short request does not pay to relearn them
        # (a server has a draft model or a head, not both: they share the history)
        self.learned: dict[str, tuple[AcceptanceTracker, Calibration]] = {
            "draft-simple": (self.draft_history, Calibration())}
        self.learned["draft-eagle3"] = self.learned["draft-simple"]
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
        entries: list[Drafter] = []
        for t in spec.types:
            p = self._proposer(t, spec, slot, sampling, gen, guide)
            if p is None:
                continue
            p.begin(list(prompt))
            entries.append(self._drafter(t, p, spec))
        account = None
        if spec.adaptive:
            account = Account(self.costs, prompt_read)
        return Speculator(self, entries, stats, guide if spec.enabled else None, account)

    def _proposer(self, t: str, spec: SpecConfig, slot: int, sampling: SamplingParams,
                  gen: torch.Generator | None, guide: Guide | None) -> Proposer | None:
        """The proposer of spec type t (None: a type that drafts nothing)."""
        if t == "ngram-simple":
            return NgramProposer(spec.ngram_min, spec.ngram_max, spec.ngram_m)
        if t == "suffix":  # under auto the controller cuts each draft; alone, a fixed floor
            return SuffixProposer(spec.suffix_max, self.pool,
                                  min_conf=0.0 if spec.adaptive else 0.5)
        if t == "draft-simple":  # resolved specs name it only when there is a draft
            return DraftModelProposer(
                self.draft.model, self.draft_cache, slot, sampling, gen, spec.n_max, spec.n_min,
                spec.draft_p_min, prefill_chunk=self.prefill_chunk, window=spec.draft_window,
                vocab=spec.draft_vocab, lazy=spec.adaptive, rejection=spec.draft_rejection,
                banned=tuple(self.draft.tokenizer.eog_ids) if sampling.ignore_eos else (),
                guide=guide)
        if t == "draft-eagle3":
            return Eagle3Proposer(
                self.head, self.head_cache, slot, sampling, gen, spec.n_max, spec.n_min,
                spec.draft_p_min, prefill_chunk=self.prefill_chunk,
                rejection=spec.draft_rejection, guide=guide,
                banned=tuple(self.eog) if sampling.ignore_eos else (), bases=self.head_bases)
        return None

    def _drafter(self, t: str, p: Proposer, spec: SpecConfig) -> Drafter:
        """p under its rule: under auto a controller per request, starting from every
        request's estimates and learning into them (its own drafts soon outweigh what other
        kinds of text showed); the suffix pool's drafts calibrated apart."""
        n_max = {"ngram-simple": spec.ngram_m, "suffix": spec.suffix_max}.get(t, spec.n_max)
        ctl = self._controller(t, n_max) if spec.adaptive else None
        if not p.free:
            return ModelDrafter(p, ctl)
        if ctl is not None and t == "suffix" and self.pool is not None:
            return PooledDrafter(p, ctl, self._controller(POOL, n_max))
        return FreeDrafter(p, ctl)

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


class Speculator:
    """One sequence's proposers, each under its rule (drafters.py; see `draft`)."""

    def __init__(self, shared: Speculation, entries: list[Drafter], stats: SpecStats,
                 guide: Guide | None = None, account: Account | None = None) -> None:
        self.shared, self.entries, self.stats = shared, entries, stats
        self.guide = guide  # the request's grammar (with speculation on)
        # under auto: how far ahead of the target alone, never more than RISK behind
        self.account = account
        self.drafting = 0.0  # the draft model's seconds (at the costs) for this step's draft
        self._by: Drafter | None = None  # the entry whose proposer drafted this step
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
        """The first draft that pays, of the proposers in order, at most `budget` tokens
        (each sized by its drafter; a free proposer's also within the request's account).
        remaining: tokens this sequence may still generate (with the lengths of earlier
        answers it says whether a lazy draft model's catch-up on the prompt can pay).
        batch: (rows, tokens) of the rest of the pass this draft joins (other sequences' rows
        and prompt chunks; the tokens those other sequences are sure to gain), so that a
        controller weighs its rows by what they cost in this pass, not in a pass of its own."""
        self._by = None
        self.drafting = 0.0
        if budget <= 0:
            return Draft([])
        self.steps += 1
        for e in self.entries:
            d = e.draft(self, budget, remaining, batch)
            if self.account is not None and e.proposer.free and d.ids:
                d = d.cut(self.account.affordable(len(d.ids)))
            if d.ids:
                self._by = e
                self.covered += e.proposer.free
                d.source = e.proposer.kind
                return d
        return Draft([])

    def accept(self, draft: Draft, n_accepted: int, tokens: list[int]) -> None:
        """The target kept n_accepted of the draft's tokens and appended `tokens`."""
        for p in self.proposers:
            p.accept(n_accepted, tokens)
        self.produced += len(tokens)
        k = len(draft.ids)
        if self.account is not None:
            self.account.step(k, len(tokens), self.drafting)
            self.drafting = 0.0
        if not k:
            return
        self.stats.record(k, n_accepted)
        if self._by is not None and self._by.used is not None:  # (the draft's: draft_history)
            self._by.used.update(k, n_accepted, draft.conf)

    def hidden(self, start: int, feats: torch.Tensor) -> None:
        """The target computed this sequence's rows start .. (their features for a head)."""
        for p in self.proposers:
            if isinstance(p, Eagle3Proposer):
                p.hidden(start, feats)

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
