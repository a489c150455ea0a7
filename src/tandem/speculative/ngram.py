"""ngram-simple: draft by token repetition (prompt lookup decoding), no second model."""

from __future__ import annotations

from .proposer import Draft


class NgramProposer:
    """Proposes the tokens that followed the most recent earlier occurrence of the longest suffix.

    For n from ngram_max down to ngram_min, take the last n tokens of prompt+output (the suffix)
    and look for an earlier occurrence of the same n tokens: one that starts before the suffix
    does (the suffix itself does not count; an occurrence overlapping the suffix does). The first
    n that has one wins, and the draft is the up to min(m, k) tokens that followed its most recent
    such occurrence (fewer when the sequence ends sooner). No n has one: the draft is empty.

    Worked example, ngram_min=2, ngram_max=3, m=2:

        position  0  1  2  3  4  5  6  7  8  9 10 11
        token     5  6  7  8  9  5  6  7  1  5  6  7

        n=3: the suffix (5, 6, 7) starts at 9; earlier it starts at 0 and 5. The most recent
        is 5, followed by 1, 5, 6, 7, so propose(4) gives [1, 5] (m=2) and propose(1) gives [1].
        (n=2 is not tried: the longest suffix with an earlier occurrence wins.)

    Overlap: in [3, 3, 3] the suffix (3, 3) at 1 has an earlier occurrence at 0, which is
    followed by [3] (the token at 2, inside the suffix), so the draft is [3].

    Each propose is O(ngram_max - ngram_min + 1) dict lookups, whatever the context length:
    `_last` maps each n-gram that has a following token (starts at p with p + n <= len - 1) to
    its last such start, and is updated as tokens arrive. Looking the suffix up in it finds
    exactly the most recent start before the suffix's own.
    """

    free = True  # a few dict lookups per draft
    kind = "ngram"  # how its accepted tokens are reported (Sequence.origins)

    def __init__(self, ngram_min: int = 2, ngram_max: int = 4, m: int = 8) -> None:
        # the sizes come from a SpecConfig, which checked them (1 <= min <= max, m >= 1)
        assert 1 <= ngram_min <= ngram_max and m >= 1, (ngram_min, ngram_max, m)
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.m = m
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}

    def begin(self, prompt_ids: list[int]) -> None:
        self.tokens = []
        self._last = {}
        self._extend(prompt_ids)

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        # Only the appended tokens matter here; n_accepted is part of the shared interface.
        self._extend(new_ids)

    def shift(self, keep: int, discard: int) -> None:
        """Nothing to do: it matches the end of its own copy of the tokens, which a shift
        leaves as it is; the dropped tokens stay text it may repeat."""

    def behind(self) -> int:
        return 0  # it reads each token as it arrives

    def catch_up(self, limit: int | None = None) -> int:
        return 0

    def end(self) -> None:
        pass

    def propose(self, k: int, extend=None) -> Draft:
        s = self.tokens
        want = min(self.m, k)
        if want <= 0:
            return Draft([])
        for n in range(min(self.ngram_max, len(s) - 1), self.ngram_min - 1, -1):
            p = self._last.get(tuple(s[len(s) - n:]))
            if p is not None:
                return Draft(s[p + n: p + n + want])
        return Draft([])

    def _extend(self, ids: list[int]) -> None:
        s = self.tokens
        for t in ids:
            s.append(int(t))
            # The n-grams ending just before the new token now have a following token.
            end = len(s) - 1
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._last[tuple(s[end - n: end])] = end - n
