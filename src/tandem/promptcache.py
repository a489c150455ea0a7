"""The host-memory prompt cache (llama-server's --cache-ram): what a slot held when a request
with another prompt took it, kept in RAM so a later request that starts the same way reads
only what follows instead of the whole prompt again.

A slot reuses the common prefix of its cached tokens with a new prompt; what lies beyond that
prefix is lost when the new prompt is read. Two conversations alternating in one slot, or an
agent that comes back to a file it read earlier, would re-read their whole context each time:
on a CPU a few thousand tokens take tens of seconds. So before the slot's tokens are dropped
`save` copies their keys and values here (least recently used entries leave first when the
byte limit is reached), and `Engine.add` takes the entry with the longest common prefix when
it beats the slot's own.

A restored position holds exactly what reading its token again would compute: the kernels
give each row the same bits whatever else shares its pass, so the answer is the same with or
without the cache (tested). The draft model's cache is not kept: it catches up by itself.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

MIB = 1 << 20
# a displaced slot is kept only if this many of its tokens would be lost: fewer are cheap to
# read again
MIN_TOKENS = 16


@dataclass(slots=True)
class Entry:
    tokens: tuple[int, ...]
    k: torch.Tensor  # (n_layers, n_kv_heads, n, head_dim)
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """Entries of tokens with their keys and values, at most `limit` bytes in all (None: no
    limit), least recently used first out."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.nbytes = 0
        self.saved = self.restored = 0  # entries, over the cache's life

    def __len__(self) -> int:
        return len(self.entries)

    def save(self, tokens: list[int], k: torch.Tensor, v: torch.Tensor) -> bool:
        """Keep a copy of tokens with their keys and values (k, v: (layers, kv heads, n,
        head_dim) views of a slot). An entry that is a prefix of the new one is replaced by it;
        the new one is not kept if it is a prefix of one already here, or larger than the limit.
        Returns whether it was kept."""
        key = tuple(tokens)
        size = 2 * k.nbytes
        if self.limit is not None and size > self.limit:
            return False
        for old in list(self.entries):
            n = common(old, key)
            if n == len(key):  # already here (the same tokens or more)
                self.entries.move_to_end(old)
                return False
            if n == len(old):  # the new one holds all of it and more
                self._remove(old)
        self.entries[key] = Entry(key, k.clone(), v.clone())
        self.nbytes += size
        self.saved += 1
        while self.limit is not None and self.nbytes > self.limit:
            self._remove(next(iter(self.entries)))
        return True

    def best(self, ids: list[int]) -> tuple[int, Entry | None]:
        """The entry sharing the longest prefix with ids, and that length (0, None: none)."""
        best_n, best = 0, None
        for key, e in self.entries.items():
            n = common(key, ids)
            if n > best_n:
                best_n, best = n, e
        return best_n, best

    def take(self, e: Entry) -> None:
        """The entry was loaded into a slot, which holds it now (it comes back here when the
        slot is taken by another prompt)."""
        self._remove(e.tokens)
        self.restored += 1

    def _remove(self, key: tuple[int, ...]) -> None:
        e = self.entries.pop(key)
        self.nbytes -= e.nbytes

    def keep(self, cache, slot: int, keep: int) -> bool:
        """Before the slot of `cache` (models.decoder.KVCache) keeps only its first `keep`
        tokens: keep what it holds here, if that loses at least MIN_TOKENS (only positions
        that reading their tokens again would give: `exact` after a context shift). Returns
        whether it was kept (not when it is here already)."""
        n = cache.length(slot)
        if cache.exact[slot] is not None:
            n = min(n, cache.exact[slot])
        if n - keep < MIN_TOKENS:
            return False
        return self.save(cache.tokens[slot][:n], cache.k[:, slot, :, :n],
                         cache.v[:, slot, :, :n])

    def restore(self, cache, slot: int, ids: list[int], keep: int) -> int:
        """The entry with the longest common prefix with ids, loaded into the slot where it
        reuses more than the slot's own `keep` tokens; returns the tokens the slot now reuses.
        (Its first `keep` positions are the same already: the same tokens at the same
        positions give the same bits.)"""
        n, e = self.best(ids)
        if e is None or n <= keep:
            return keep
        cache.k[:, slot, :, keep:n] = e.k[:, :, keep:n]
        cache.v[:, slot, :, keep:n] = e.v[:, :, keep:n]
        cache.tokens[slot] = list(e.tokens[:n])
        cache.exact[slot] = None
        if n == len(e.tokens):  # the slot holds all of it now; it comes back when displaced
            self.take(e)
        return n
