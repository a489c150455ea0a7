"""One packed pass: every generating sequence's row [last, *draft] with logits, then the
prompt chunks without, unpadded (Transformer.forward_packed). Each row is computed as it would
be alone, so what shares the pass never changes a row's bits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..models.decoder import KVCache, MediaRows
from ..speculative.proposer import Draft
from .scheduler import Chunk
from .sequence import Sequence


@dataclass(slots=True)
class Batch:
    tokens: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    want: list[int] = field(default_factory=list)  # the rows whose logits are needed
    media: MediaRows = field(default_factory=lambda: MediaRows([], [], []))

    def add(self, slot: int, start: int, ids: list[int], logits: bool) -> int:
        """Rows for ids at positions start.. of the slot; the index of the first."""
        at = len(self.tokens)
        if logits:
            self.want.extend(range(at, at + len(ids)))
        self.tokens.extend(ids)
        self.slots.extend([slot] * len(ids))
        self.positions.extend(range(start, start + len(ids)))
        return at

    def add_chunk(self, c: Chunk) -> None:
        """A prompt chunk, with the vectors of the images' rows in it."""
        s = c.seq
        at = self.add(s.slot, c.start, s.tokens[c.start: c.end], logits=False)
        for m in s.req.media:  # the chunk's image rows: their vectors, the image's end
            lo, hi = max(m.start, c.start), min(m.end, c.end)
            if lo < hi:
                self.media.rows.extend(range(at + lo - c.start, at + hi - c.start))
                self.media.vectors.append(m.vectors[lo - m.start: hi - m.start])
                self.media.ends.extend([m.end] * (hi - lo))

    def run(self, model, cache: KVCache,
            features: torch.Tensor | None = None) -> torch.Tensor | None:
        """The pass: logits of the `want` rows, (len(want), V); features: filled with every
        row's inputs to the model's feature_layers (an EAGLE-3 head's)."""
        media = None
        if self.media.rows:
            media = MediaRows(self.media.rows, torch.cat(self.media.vectors), self.media.ends)
        return model.forward_packed(self.tokens, cache, self.slots, self.positions, self.want,
                                    media, features)


def pack(gen: list[Sequence], drafts: list[Draft], chunks: list[Chunk],
         cache: KVCache) -> Batch:
    b = Batch()
    for s, d in zip(gen, drafts):
        b.add(s.slot, cache.length(s.slot), [s.tokens[-1], *d.ids], logits=True)
    for c in chunks:
        b.add_chunk(c)
    return b
