"""A request's account under auto: never more than RISK behind the target alone, by the costs.

auto's controllers verify the draft whose expected gain is largest, and over many drafts the
expectation holds. On a short answer it need not: a short translation that verified two
2-token drafts and kept neither took longer than decoding alone, a bet with a positive
expectation lost with nothing yet won to cover it. So each request keeps an account in the
`CostModel`'s seconds:

    ahead    what its tokens would have cost one plain pass each, minus what its passes,
             its draft model's tokens and its catch-up on the prompt cost
    elapsed  its prompt (the rows it read, at the measured per-row prompt cost) and its steps

A draft is cut to the longest prefix whose worst case (nothing accepted) keeps the request no
more than RISK behind:  ahead - (t(k + 1) - t(1) + k t_draft) >= -RISK (elapsed + t(k + 1) +
k t_draft); a lazy draft model's catch-up on the prompt must fit the same bound. After a long
prompt (a document to summarize, a file to edit) the bound allows long drafts from the first
token; after a short one only short drafts, until verified drafts have put the request ahead.
What is won is then risked again, never more than RISK of the time spent.

An estimate, not a clock: the costs are the controllers' own (measured passes; a machine that
slows down slows every row count, so the bound scales with it). The account is the request's
alone; rows other requests add to the same pass are theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .controller import CostModel

RISK = 0.05  # the most a request may fall behind the target alone, of the time it has run


@dataclass(slots=True)
class Account:
    costs: CostModel
    prompt_rows: int = 0  # prompt tokens the request read (those its cached prefix lacked)
    ahead: float = 0.0  # seconds ahead of the target alone (negative: behind)
    steps: float = 0.0  # seconds of its steps (passes, drafts, catch-ups)

    @property
    def elapsed(self) -> float:
        """Seconds the request has run: its prompt at the per-row prompt cost (measured
        once the first prompt chunk was timed), and its steps."""
        return self.prompt_rows * (self.costs.prompt_token or 0.0) + self.steps

    def _fits(self, loss: float, seconds: float) -> bool:
        return self.ahead - loss >= -RISK * (self.elapsed + seconds)

    @property
    def measured(self) -> bool:
        """Whether the costs it needs are known (the engine's calibration measures them before
        a request's first step); until then it does not bind: the costs get measured."""
        return self.costs.prompt_token is not None and self.costs.verify_time(1) is not None

    def affordable(self, k: int, per_token: float = 0.0) -> int:
        """The longest k' <= k whose draft (per_token seconds to make each token) may be
        verified: nothing accepted would still keep the bound. Unmeasured costs: k."""
        if not self.measured:
            return k
        t1 = self.costs.verify_time(1)
        while k > 0:
            tk = self.costs.verify_time(k + 1)
            if t1 is None or tk is None:
                return k
            cost = tk + k * per_token
            if self._fits(cost - t1, cost):
                return k
            k -= 1
        return 0

    def can_spend(self, seconds: float) -> bool:
        """Whether `seconds` spent on nothing else (a catch-up) keep the bound."""
        return not self.measured or self._fits(seconds, seconds)

    def spend(self, seconds: float) -> None:
        self.ahead -= seconds
        self.steps += seconds

    def step(self, k: int, tokens: int, drafting: float = 0.0) -> None:
        """A pass verified k drafted tokens (drafting: seconds the draft model took to make
        them) and gave `tokens` tokens."""
        t1, tk = self.costs.verify_time(1), self.costs.verify_time(k + 1)
        if t1 is None or tk is None:
            return
        cost = tk + drafting
        self.steps += cost
        self.ahead += tokens * t1 - cost
