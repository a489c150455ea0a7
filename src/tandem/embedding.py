"""The target's final-normed hidden states for an input, pooled (`Embedder.embed`): what
llama-server's /embeddings and /rerank read.

"none" (T, dim): one row per token; "mean", "cls" (the first token's) or "last" (the last
token's, the one that has read the whole input in a causal model) (dim,). The input is read into
a scratch cache of its own, never a slot's, so generation in the slots is untouched.

As llama-server's: an input pooled "last" (and so a causal reranker's) is read in chunks of
--batch-size tokens, up to a slot's context, into a cache made for it and let go after; the
other poolings need every row of one pass, so their input must fit --batch-size (a scratch
cache of --batch-size positions, made on first use). The layers' numerics do not depend on how
rows are split into passes, so a chunked input's last row has the bits one pass would give.
"""

from __future__ import annotations

import torch

from .config import EngineConfig
from .errors import TandemError
from .models.decoder import KVCache
from .models.loader import LoadedModel

POOLINGS = ("none", "mean", "cls", "last")


def longest(cfg: EngineConfig, pooling: str) -> int:
    """The most tokens an input pooled this way may have: a slot's context for "last", else
    --batch-size."""
    return cfg.ctx_size if pooling == "last" else cfg.batch_size


class Embedder:
    """Embeddings from `target`, its scratch caches laid out as the slots' `cache`."""

    def __init__(self, target: LoadedModel, cache: KVCache) -> None:
        self.target, self.cache = target, cache
        self._scratch: KVCache | None = None

    def _cache(self, n: int) -> KVCache:
        return KVCache(self.target.args, 1, n + 1, self.cache.k.dtype, v_dtype=self.cache.v.dtype)

    def embed(self, ids: list[int], pooling: str, cfg: EngineConfig) -> torch.Tensor:
        if pooling not in POOLINGS:
            raise TandemError(f"pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
        n, chunk, most = len(ids), cfg.batch_size, longest(cfg, pooling)
        if not 0 < n <= most:
            raise TandemError(f"an embedding input of {n} tokens; 1..{most} fit ("
                              + ("a slot's context" if pooling == "last" else "--batch-size")
                              + ", pooling " + pooling + ")")
        model = self.target.model
        if n > chunk:  # "last": chunks into a cache of this input's length
            cache = self._cache(n)
            for s in range(0, n, chunk):
                part = ids[s:s + chunk]
                h = model(torch.tensor([part]), cache, [0], [s], logits="hidden")[0]  # last row
                cache.append(0, part)
            return h
        if self._scratch is None:
            self._scratch = self._cache(chunk)
        h = model(torch.tensor([ids]), self._scratch, [0], [0], logits="hidden_all")[0]
        if pooling == "none":
            return h
        return {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]
