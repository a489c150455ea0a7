"""suffix: draft the continuation of the longest earlier match of the sequence's end, each token
with a confidence (after SuffixDecoding, Oliaro et al. 2024).

The n-gram proposer copies what followed the most recent earlier occurrence of the last few
tokens. This one looks at every earlier occurrence of the longest context that occurred before
(up to `depth` tokens indexed, then compared further back), and grows the draft one token at a
time along the continuation those occurrences agree on most:

    position  0  1  2  3  4  5  6  7  8  9 10 11 12
    token     4  1  2  3  7  1  2  3  7  8  1  2  3

    The end (1, 2, 3) occurred at 1 and 5 (contexts ending before positions 4 and 8); both
    were followed by 7, so the first token is 7 with confidence (2 + prior) / (2 + 1). Then
    (1, 2, 3, 7) was followed by 1 (at 5) and by 8 (at 9): one each, the most recent wins (8),
    with confidence (1 + prior) / (2 + 1), lower.

A drafted token's confidence is the observed frequency of that continuation given the matched
context, smoothed towards a prior that grows with the match length L (L / (L + 2)): one earlier
occurrence after a 2-token match says less than one after a 30-token match (a copied line of
code). The controller turns confidences into acceptance probabilities calibrated online
(controller.Calibration), so the scale only has to be monotone, not exact.

`SuffixPool` holds earlier outputs (any request, any slot) under a token budget, least recently
used first out, so repeated structure across requests is found too; the proposer searches its
own sequence and the pool and keeps the draft expected to yield more tokens.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict

from .proposer import Draft

DEPTH = 8  # contexts of 1..DEPTH tokens are indexed; longer matches are found by comparing
MAX_MATCH = 64  # how far back a match is measured
MAX_CANDIDATES = 64  # the most recent occurrences of a context considered
END = -1  # separates documents in the pool; never a token


class SuffixIndex:
    """Every context of 1..depth tokens of a growing token list -> the positions that followed it.

    where[hash(ctx)] lists, ascending, each i < len(tokens) with tokens[i - len(ctx):i] == ctx
    (a hash collision only gives a bad draft, which verification rejects; matches are compared
    token by token before they are trusted for their length)."""

    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth
        self.tokens: list[int] = []
        self.where: dict[int, list[int]] = {}

    def extend(self, ids: list[int]) -> None:
        s, where = self.tokens, self.where
        for t in ids:
            s.append(int(t))
            i = len(s) - 1  # the contexts ending just before i now have a follower
            for n in range(1, min(self.depth, i) + 1):
                key = hash(tuple(s[i - n:i]))
                lst = where.get(key)
                if lst is None:
                    where[key] = [i]
                else:
                    lst.append(i)

    def match(self, end: list[int]) -> tuple[list[int], int]:
        """The positions that followed the longest earlier occurrences of end's last tokens,
        and that match's length (0, [] when even the last token never occurred)."""
        for n in range(min(self.depth, len(end)), 0, -1):
            found = self.where.get(hash(tuple(end[len(end) - n:])))
            if not found:
                continue
            cands = found[-MAX_CANDIDATES:]
            s = self.tokens
            best, length = [], 0
            for i in cands:  # the true match length, compared token by token
                m = 0
                while m < MAX_MATCH and m < i and m < len(end) and s[i - 1 - m] == end[-1 - m]:
                    m += 1
                if m < n:
                    continue  # a hash collision
                if m > length:
                    best, length = [i], m
                elif m == length:
                    best.append(i)
            if best:
                return best, length
        return [], 0


def grow(tokens: list[int], cands: list[int], length: int, k: int) -> tuple[list[int], list[float]]:
    """Up to k tokens continuing the occurrences `cands` (positions in tokens) of a match of
    `length` tokens, each the continuation most of them agree on (the most recent on a tie),
    with its smoothed frequency. A continuation may run into the draft itself (a repetition
    that overlaps the end)."""
    ids: list[int] = []
    conf: list[float] = []
    n = len(tokens)
    cur = cands
    while cur and len(ids) < k:
        counts: dict[int, list[int]] = {}  # token -> [count, most recent position]
        for i in cur:
            t = tokens[i] if i < n else (ids[i - n] if i - n < len(ids) else END)
            if t == END:
                continue
            c = counts.get(t)
            if c is None:
                counts[t] = [1, i]
            else:
                c[0] += 1
                c[1] = i
        if not counts:
            break
        tok, (c, _) = max(counts.items(), key=lambda kv: (kv[1][0], kv[1][1]))
        prior = length / (length + 2)
        ids.append(tok)
        conf.append((c + prior) / (len(cur) + 1))
        cur = [i + 1 for i in cur
               if (tokens[i] if i < n else (ids[i - n] if i - n < len(ids) else END)) == tok]
        length += 1
    return ids, conf


def _expected(conf: list[float]) -> float:
    """Tokens a draft is expected to yield if each confidence were its acceptance."""
    total, p = 0.0, 1.0
    for c in conf:
        p *= c
        total += p
    return total


class SuffixPool:
    """Earlier outputs, shared by every slot, under a budget of `max_tokens`; the least recently
    used output leaves first (one that supplied a draft counts as used). Eviction rebuilds the
    index over what stays (amortized: it drops down to three quarters of the budget)."""

    def __init__(self, max_tokens: int, depth: int = DEPTH) -> None:
        self.max_tokens = max_tokens
        self.depth = depth
        self.docs: OrderedDict[int, list[int]] = OrderedDict()
        self._next_id = 0
        self._rebuild()

    def _rebuild(self) -> None:
        self.index = SuffixIndex(self.depth)
        self.starts: list[int] = []
        self.ids: list[int] = []
        for doc_id, doc in self.docs.items():
            self._append(doc_id, doc)

    def _append(self, doc_id: int, doc: list[int]) -> None:
        self.starts.append(len(self.index.tokens))
        self.ids.append(doc_id)
        self.index.extend([*doc, END])

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.docs.values())

    def add(self, tokens: list[int]) -> None:
        if not tokens or self.max_tokens <= 0:
            return
        tokens = list(tokens[-self.max_tokens:])
        doc_id = self._next_id
        self._next_id += 1
        self.docs[doc_id] = tokens
        if self.size > self.max_tokens:
            while self.docs and self.size > self.max_tokens * 3 // 4:
                self.docs.popitem(last=False)
            if not self.docs:  # one output larger than the budget's three quarters
                self.docs[doc_id] = tokens[-(self.max_tokens * 3 // 4):]
            self._rebuild()
        else:
            self._append(doc_id, tokens)

    def touch(self, position: int) -> None:
        """The output holding `position` supplied a draft: it is now the most recently used."""
        j = bisect_right(self.starts, position) - 1
        if 0 <= j < len(self.ids) and self.ids[j] in self.docs:
            self.docs.move_to_end(self.ids[j])

    def propose(self, end: list[int], k: int) -> tuple[list[int], list[float], int]:
        cands, length = self.index.match(end)
        if not cands:
            return [], [], -1
        ids, conf = grow(self.index.tokens, cands, length, k)
        return ids, conf, cands[-1]


class SuffixProposer:
    """Drafts up to k (≤ n_max) tokens from the longest earlier match in this sequence (prompt
    and output) or in the shared pool of earlier outputs, whichever draft is expected to yield
    more tokens; each drafted token carries its confidence (Draft.conf). The draft stops before
    the first token below `min_conf` (0.5 for `--spec-type suffix` alone; 0 under auto, whose
    controller cuts drafts by their calibrated confidences)."""

    free = True  # proposing costs microseconds, not a model pass
    kind = "suffix"  # how its accepted tokens are reported (Sequence.origins)

    def __init__(self, n_max: int = 16, pool: SuffixPool | None = None,
                 min_conf: float = 0.5, depth: int = DEPTH) -> None:
        self.n_max, self.pool, self.min_conf, self.depth = n_max, pool, min_conf, depth
        self.index = SuffixIndex(depth)
        self.n_prompt = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = SuffixIndex(self.depth)
        self.index.extend(list(prompt_ids))
        self.n_prompt = len(prompt_ids)

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        self.index.extend(new_ids)

    def propose(self, k: int) -> Draft:
        k = min(k, self.n_max)
        s = self.index.tokens
        if k <= 0 or not s:
            return Draft([])
        end = s[-MAX_MATCH:]
        cands, length = self.index.match(end)
        ids, conf = grow(s, cands, length, k) if cands else ([], [])
        if self.pool is not None and self.pool.docs:
            p_ids, p_conf, at = self.pool.propose(end, k)
            if _expected(p_conf) > _expected(conf):
                ids, conf = p_ids, p_conf
                self.pool.touch(at)
        n = next((i for i, c in enumerate(conf) if c < self.min_conf), len(ids))
        return Draft(ids[:n], None, conf[:n])

    def shift(self, keep: int, discard: int) -> None:
        """Nothing to do: the dropped tokens stay earlier text it may match, and its matches
        are taken at its own end, which a shift leaves as it is."""

    def end(self) -> None:
        """The sequence is over: its output joins the pool."""
        if self.pool is not None:
            self.pool.add(self.index.tokens[self.n_prompt:])
