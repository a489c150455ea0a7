"""draft-eagle3: an EAGLE-3 head (models/eagle3.py) drafts from the target's hidden states.

The target's passes hand the head, for every row they compute, the inputs of the head's three
target layers (`hidden`): prompt chunks as they are read, verification rows as they are
verified. The head holds, in its own KV cache slot, the pairs (token[P+1], g_P) from position
`base` on; a pair can be read once the token after P is known and the target kept row P, so
after a verification that kept n drafted tokens there are n + 1 new pairs, all complete
(llama.cpp defers the last one; here the target's own token is already known when the pairs
are read, at the next draft).

    propose: read the pending pairs in one pass of the head (prompt chunks when there are
             many), draft from the last one's output, then one pass per further token, each
             reading (drafted token, previous pre-norm output)
    accept:  the drafted positions of the head's cache are dropped (they held the head's own
             outputs, not the target's features); features of rejected rows are dropped
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..config import SamplingParams
from ..grammar import Guide
from ..models.decoder import KVCache
from ..models.eagle3 import Eagle3Head
from .draft import draw
from .proposer import Draft


# pairs a finished request still reads for the slot's next request (more: it starts afresh)
END_READ = 64


def head_step_seconds(head: Eagle3Head, cache: KVCache, slot: int, at: int,
                      rounds: int = 3) -> float:
    """Seconds of one drafted token as `propose` makes it (one pair at position `at` of the
    slot, its logits), the fastest of `rounds`: the first call pays one-time costs (as
    draft.draft_step_seconds for a draft model)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        head.logits(head.forward([0], torch.zeros(1, head.cfg.dim), cache, slot, at))
        best = min(best, time.perf_counter() - t0)
    return best


class Eagle3Proposer:
    """Drafts up to n_max tokens with the head, one head pass per token (the first also reads
    the pairs the last verification completed). Stops, as DraftModelProposer does, below
    p_min; drafts its top token, or with `rejection` samples it and returns q (over the whole
    vocabulary, zero outside the head's) for rejection sampling."""

    free = False  # every drafted token is a pass of the head
    kind = "eagle3"

    def __init__(self, head: Eagle3Head, cache: KVCache, slot: int, sampling: SamplingParams,
                 gen: torch.Generator | None, n_max: int, n_min: int, p_min: float,
                 prefill_chunk: int = 512, rejection: bool = False,
                 banned: tuple[int, ...] = (), guide: Guide | None = None,
                 bases: dict[int, int | None] | None = None) -> None:
        """bases: per cache slot, the sequence position its pairs start from (shared by the
        slot's successive proposers: a request whose prompt begins as the slot's last one did,
        a chat's next turn, keeps the pairs the head read, as the target keeps its cache)."""
        self.head, self.cache, self.slot = head, cache, slot
        self.bases = {} if bases is None else bases
        self.sampling, self.gen = sampling, gen
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min
        self.prefill_chunk = prefill_chunk
        self.rejection = rejection and not sampling.greedy
        self.guide = guide
        n = head.cfg.vocab_size
        d2t = head.d2t if head.d2t is not None else torch.arange(head.draft_vocab)
        self.d2t = d2t
        # draft ids whose target id is never proposed (end of generation, ignore_eos)
        ban = torch.zeros(n, dtype=torch.bool)
        if banned:
            ban[torch.tensor([b for b in banned if 0 <= b < n], dtype=torch.long)] = True
        self.banned = ban[d2t]
        self.tokens: list[int] = []
        self.base: int | None = None  # the sequence position of the cache's position 0
        self.held = 0  # pairs of the target's features in the cache (drafted ones after them)
        self.pend = torch.empty(0)  # features of positions fed() .. not yet read
        self.last: torch.Tensor | None = None  # pre-norm output of the last pair read

    # -- what has been read ----------------------------------------------------------------

    def _fed(self) -> int:
        """The next sequence position whose pair the head has not read."""
        return (self.base or 0) + self.held

    def begin(self, prompt_ids: list[int]) -> None:
        self.tokens = list(prompt_ids)
        keep = 0
        if self.bases.get(self.slot) == 0:  # the pairs of a common prefix are the same pairs
            keep = self.cache.common_prefix(self.slot, self.tokens[1:])
        self._restart(0 if keep else None, keep)

    def hidden(self, start: int, feats: torch.Tensor) -> None:
        """The target computed rows start .. start + len(feats) - 1 of this sequence: their
        features (the head's target layers' inputs, concatenated)."""
        fed = self._fed()
        if self.base is None or not self.base <= start <= fed + len(self.pend):
            self._restart(start)  # the first rows, or a gap (a prefix the target reused)
        elif start < fed:  # rows the head read already (kept from the slot's last request)
            self._restart(self.base, start - self.base)
        else:
            self.pend = self.pend[: start - fed]
        self.pend = torch.cat([self.pend, feats.float()]) if len(self.pend) else feats.float()

    def _restart(self, base: int | None, keep: int = 0) -> None:
        """Keep the first `keep` pairs the head read (none: forget them all), from sequence
        position base; it reads on from there."""
        self.cache.truncate(self.slot, keep)
        self.base, self.held, self.pend, self.last = base, keep, torch.empty(0), None
        self.bases[self.slot] = base

    def behind(self) -> int:
        """Pairs to read beyond what one draft reads with its first pass (a prompt not yet
        read): 0 after a verification."""
        n = self._readable()
        return n if n > self.n_max + 1 else 0

    def _readable(self) -> int:
        """Pending pairs whose next token is known (all but rows past the sequence)."""
        return max(0, min(len(self.pend), len(self.tokens) - 1 - self._fed()))

    def catch_up(self, limit: int | None = None) -> int:
        n = self._readable()
        n = n if limit is None else min(n, limit)
        self._read(n)
        return n

    def _read(self, n: int) -> None:
        """Read the next n pending pairs, in prompt chunks; keeps the last pre-norm output."""
        while n > 0:
            m = min(n, self.prefill_chunk)
            at = self._fed()
            ids = self.tokens[at + 1: at + 1 + m]
            g = self.head.encode(self.pend[:m])
            h = self.head.forward(ids, g, self.cache, self.slot, at - self.base)
            self.cache.append(self.slot, ids)
            self.held += m
            self.pend, self.last, n = self.pend[m:], h[-1], n - m

    # -- drafting ---------------------------------------------------------------------------

    def propose(self, k: int, extend: Callable[[list[float]], bool] | None = None) -> Draft:
        k = min(k, self.n_max, self.cache.max_len - self.cache.length(self.slot) - 1)
        if k <= 0 or k < self.n_min:
            return Draft([])
        self._read(self._readable())
        if self.last is None or self._fed() != len(self.tokens) - 1:
            return Draft([])  # the target has not computed the last rows yet
        h = self.last
        ids: list[int] = []
        rows: list[torch.Tensor] = []
        conf: list[float] = []
        for i in range(k):
            logits = self._masked(self.head.logits(h[None])[0], ids)
            if logits is None:
                break
            if float(torch.softmax(logits, -1).max()) < self.p_min:
                break
            j = self._choose(logits, conf, rows)
            ids.append(int(self.d2t[j]))
            if self.guide is not None and ids[-1] in self.guide.eog:
                break
            if i + 1 < k and extend is not None and not extend(conf):
                break
            if i + 1 < k:
                at = self.cache.length(self.slot)
                h = self.head.forward(ids[-1:], h[None], self.cache, self.slot, at)[0]
                self.cache.append(self.slot, ids[-1:])
        if len(ids) < max(self.n_min, 1):
            return Draft([])
        return Draft(ids, torch.stack(rows) if rows else None, conf)

    def _masked(self, logits: torch.Tensor, ids: list[int]) -> torch.Tensor | None:
        """The head's logits with banned ids and what the request's grammar forbids removed;
        None when nothing is left."""
        keep = ~self.banned
        if self.guide is not None:
            allowed = self.guide.allowed(ids)
            ok = self.d2t < len(allowed)
            keep = keep & ok & allowed[self.d2t.clamp(max=len(allowed) - 1)]
        if not keep.any():
            return None
        return logits.masked_fill(~keep, float("-inf")) if not keep.all() else logits

    def _choose(self, logits: torch.Tensor, conf: list[float],
                rows: list[torch.Tensor]) -> int:
        """The draft id to propose (draft.draw); with rejection sampling its q over the whole
        vocabulary (zero outside the head's)."""
        j, c, q = draw(logits, self.sampling, self.gen, self.rejection)
        conf.append(c)
        if q is not None:
            full = torch.zeros(self.head.cfg.vocab_size, dtype=q.dtype)
            rows.append(full.index_copy_(0, self.d2t, q))
        return j

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        """Drop the drafted positions from the head's cache; keep the features of the rows
        the target kept (positions before the new last token)."""
        fed = self._fed()
        self.cache.truncate(self.slot, self.held)
        self.tokens.extend(new_ids)
        if self.base is not None:
            self.pend = self.pend[: max(0, len(self.tokens) - 1 - fed)]

    def shift(self, keep: int, discard: int) -> None:
        """A context shift: the head starts again from the next rows the target computes
        (its cache's positions would no longer match the features')."""
        del self.tokens[keep: keep + discard]
        self._restart(None)

    def end(self) -> None:
        """Read the last verified rows' pairs (at most END_READ): a next request in this slot
        that continues this sequence (a chat's next turn) then finds every pair the target's
        cache keeps, and the head sees the whole conversation."""
        n = self._readable()
        if 0 < n <= END_READ:
            self._read(n)
