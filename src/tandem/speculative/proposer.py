"""The interface every proposer shares: begin, propose, accept (llama.cpp's common/speculative.h).

One iteration of the engine, for one slot:

    draft = proposer.propose(k)                 # up to k guessed tokens
    ... the target verifies [last, *draft.ids] in one pass ...
    proposer.accept(n_accepted, new_ids)        # new_ids = draft.ids[:n_accepted] + [target's token]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(slots=True)
class Draft:
    """Proposed tokens and, for a sampling proposer, the distributions they were drawn from.

    ids: the drafted token ids, at most k of them; empty = nothing to propose this time.
    probs: (len(ids), V) float tensor, row i the distribution ids[i] was drawn from;
        None = a deterministic proposer (n-gram): the verifier treats q(ids[i]) as 1.
    conf: per token, the proposer's own confidence in [0, 1] that the target will agree (the
        draft model's probability of its token, the suffix proposer's smoothed frequency);
        None = no opinion. The controller calibrates it against what was accepted.
    source: which proposer drafted it (its `kind`: "draft", "suffix", "ngram"; "grammar" for
        tokens a grammar forced), reported per accepted token (Sequence.origins).
    """

    ids: list[int]
    probs: torch.Tensor | None = None
    conf: list[float] | None = None
    source: str = ""

    def cut(self, k: int) -> Draft:
        """The first k tokens of this draft."""
        if k >= len(self.ids):
            return self
        return Draft(self.ids[:k], None if self.probs is None else self.probs[:k],
                     None if self.conf is None else self.conf[:k], self.source)

    def __len__(self) -> int:
        return len(self.ids)


@runtime_checkable
class Proposer(Protocol):
    """A source of draft tokens for one sequence (one slot).

    free: True when proposing costs next to nothing (n-gram, suffix: the controller may look at
    a whole draft before deciding how much of it to verify), False when each token costs a
    model pass (the draft model: the controller decides whether to draft, and `propose(k,
    extend)` asks `extend(confidences so far)` after each token whether to draft on).
    kind: the name its accepted tokens are reported under ("draft" for the draft model;
    "suffix", "ngram": repetition). How each kind's drafts are sized is drafters.py's."""

    free: bool
    kind: str

    def begin(self, prompt_ids: list[int]) -> None:
        """Start a new sequence whose tokens so far are prompt_ids (forgets any earlier one)."""
        ...

    def propose(self, k: int, extend: Callable[[list[float]], bool] | None = None) -> Draft:
        """Up to k tokens that may follow the sequence so far; k <= 0 gives an empty draft.
        A costly proposer asks extend(confidences so far), if given, before each further
        token; a free one drafts its most and ignores it."""
        ...

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        """The target kept the first n_accepted draft tokens; new_ids were appended to the
        sequence this iteration (those accepted tokens followed by the target's own token)."""
        ...

    def behind(self) -> int:
        """Tokens of the sequence it has not read yet (a lazy draft model that has not read the
        prompt, or fell behind while idle); 0 for one that reads tokens as they arrive."""
        ...

    def catch_up(self, limit: int | None = None) -> int:
        """Read up to `limit` (None: all) of the tokens it is behind now; how many it read."""
        ...

    def shift(self, keep: int, discard: int) -> None:
        """The sequence lost tokens keep .. keep + discard - 1 (a full context was shifted)."""
        ...

    def end(self) -> None:
        """The sequence is over (a proposer may keep what it learned for later requests)."""
        ...
