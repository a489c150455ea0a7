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


class _Generation:
    """Some earlier outputs in one index, END between them."""

    def __init__(self, depth: int) -> None:
        self.index = SuffixIndex(depth)
        self.starts: list[int] = []  # where each output begins in index.tokens
        self.docs: list[list[int]] = []
        self.copied: set[int] = set()  # outputs already carried into the newer generation
        self.size = 0

    def add(self, doc: list[int]) -> None:
        self.starts.append(len(self.index.tokens))
        self.docs.append(doc)
        self.index.extend([*doc, END])
        self.size += len(doc)

    def doc_at(self, position: int) -> int:
        return bisect_right(self.starts, position) - 1


class SuffixPool:
    """Earlier outputs, shared by every slot, under a budget of `max_tokens`, kept in two
    generations of at most half the budget each. An output joins the newer one; when that is
    full, the older generation is dropped whole and the newer one becomes the older, so no
    index is ever rebuilt (dropping costs nothing, while rebuilding a full pool's index would
    stall the step that does it). An output of the older generation that supplies a draft is copied into the
    newer one (once): what keeps being used stays, the least recently used leaves first."""

    def __init__(self, max_tokens: int, depth: int = DEPTH) -> None:
        self.max_tokens = max_tokens
        self.half = max(1, max_tokens // 2)
        self.depth = depth
        self.old, self.new = _Generation(depth), _Generation(depth)

    @property
    def docs(self) -> list[list[int]]:
        """The outputs held, oldest first."""
        return self.old.docs + self.new.docs

    @property
    def size(self) -> int:
        return self.old.size + self.new.size

    def add(self, tokens: list[int]) -> None:
        if not tokens or self.max_tokens <= 0:
            return
        tokens = [int(t) for t in tokens[-self.half:]]
        if self.new.size + len(tokens) > self.half:
            self.old, self.new = self.new, _Generation(self.depth)
        self.new.add(tokens)

    def touch(self, at: tuple[_Generation, int]) -> None:
        """The output holding position `at` supplied a draft: kept in the newer generation."""
        gen, position = at
        j = gen.doc_at(position)
        if gen is self.old and 0 <= j < len(gen.docs) and j not in gen.copied:
            gen.copied.add(j)
            self.add(gen.docs[j])

    def propose(self, end: list[int], k: int) -> tuple[list[int], list[float],
                                                       tuple[_Generation, int] | None]:
        """The better draft of the two generations (the newer on a tie), and where it came from
        (for `touch`)."""
        best: tuple[list[int], list[float], tuple[_Generation, int] | None] = ([], [], None)
        for gen in (self.new, self.old):
            cands, length = gen.index.match(end)
            if not cands:
                continue
            ids, conf = grow(gen.index.tokens, cands, length, k)
            if _expected(conf) > _expected(best[1]):
                best = (ids, conf, (gen, cands[-1]))
        return best


OWN, POOL = "suffix", "suffix-pool"  # the two kinds of draft (each calibrated apart under auto)


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
        self._pool_at = None  # where the last pool draft came from (SuffixPool.touch)

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = SuffixIndex(self.depth)
        self.index.extend(list(prompt_ids))
        self.n_prompt = len(prompt_ids)

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        self.index.extend(new_ids)

    def propose(self, k: int, extend=None) -> Draft:
        """The draft of the request's own tokens or of the pool, whichever is expected (by its
        confidences) to yield more."""
        own, pooled = self.options(k)
        if pooled.ids and _expected(pooled.conf) > _expected(own.conf):
            self.chosen(POOL)
            return pooled
        return own

    def options(self, k: int) -> tuple[Draft, Draft]:
        """The draft continuing the longest match in the request's own tokens, and the one
        continuing the longest match in the pool (empty without one), each stopped before
        its first token below `min_conf`. Under auto each has its own calibration: a match
        in another request's output says less than one in this request's own text."""
        k = min(k, self.n_max)
        s = self.index.tokens
        self._pool_at = None
        if k <= 0 or not s:
            return Draft([]), Draft([])
        end = s[-MAX_MATCH:]
        cands, length = self.index.match(end)
        ids, conf = grow(s, cands, length, k) if cands else ([], [])
        own = self._floor(ids, conf)
        pooled = Draft([])
        if self.pool is not None and self.pool.docs:
            p_ids, p_conf, self._pool_at = self.pool.propose(end, k)
            pooled = self._floor(p_ids, p_conf)
        return own, pooled

    def chosen(self, kind: str) -> None:
        """The draft of `kind` (OWN or POOL) is the one verified: a pool output that supplied
        it is kept as recently used."""
        if kind == POOL and self._pool_at is not None and self.pool is not None:
            self.pool.touch(self._pool_at)

    def _floor(self, ids: list[int], conf: list[float]) -> Draft:
        n = next((i for i, c in enumerate(conf) if c < self.min_conf), len(ids))
        return Draft(ids[:n], None, conf[:n])

    def shift(self, keep: int, discard: int) -> None:
        """Nothing to do: the dropped tokens stay earlier text it may match, and its matches
        are taken at its own end, which a shift leaves as it is."""

    def behind(self) -> int:
        return 0  # it reads each token as it arrives

    def catch_up(self, limit: int | None = None) -> int:
        return 0

    def end(self) -> None:
        """The sequence is over: its output joins the pool."""
        if self.pool is not None:
            self.pool.add(self.index.tokens[self.n_prompt:])
