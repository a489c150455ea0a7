"""draft-simple: a second, smaller model with its own KV cache proposes tokens."""

from __future__ import annotations

import torch

from ..config import SamplingParams
from ..models.decoder import KVCache, Transformer
from ..sampling import logits_to_probs, sample
from .proposer import Draft


class DraftModelProposer:
    """Drafts up to n_max tokens with the draft model, one forward pass per token.

    Like llama.cpp's draft-simple: before each token it looks at the draft's own top-token
    probability (temperature 1) and stops when it falls below p_min; a draft shorter than n_min
    is dropped. Greedy requests draft the argmax; sampled requests draw each token from the
    draft's distribution under the request's own sampling settings and return those rows as q,
    so the verifier can keep the target's distribution exactly.

    The draft's cache slot holds the sequence from token `base` on (0, or with a window the
    start of the prompt's last `window` tokens), at positions counted from there: `propose`
    first feeds what the draft has not seen (catch-up), and `accept` rolls its cache back to
    what the target kept.
    """

    def __init__(self, model: Transformer, cache: KVCache, slot: int, sampling: SamplingParams,
                 gen: torch.Generator | None, n_max: int, n_min: int, p_min: float,
                 prefill_chunk: int = 512, window: int = 0) -> None:
        self.model, self.cache, self.slot = model, cache, slot
        self.window = window  # 0: the whole prompt
        self.base = 0  # index in tokens of the draft cache's position 0
        self.prefill_chunk = prefill_chunk  # the target's prompt chunk (EngineConfig)
        self.sampling, self.gen = sampling, gen
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min
        self.tokens: list[int] = []

    def begin(self, prompt_ids: list[int]) -> None:
        """Take the prompt and process it now, during prompt time, as the target does: all but
        the last token (which the first propose feeds), in chunks, without logits; with a window,
        only the last `window` of them."""
        self.tokens = list(prompt_ids)
        self.base = max(0, len(prompt_ids) - 1 - self.window) if self.window else 0
        ids = prompt_ids[self.base:-1]
        # a prefix the slot already holds from an earlier request is reused
        held = self.cache.common_prefix(self.slot, ids) if self.base == 0 else 0
        self.cache.truncate(self.slot, held)
        chunk = self.prefill_chunk
        for s in range(held, len(ids), chunk):
            part = ids[s: s + chunk]
            self.model(torch.tensor([part]), self.cache, [self.slot], [s], logits="none")
            self.cache.append(self.slot, part)

    def _seen(self) -> int:
        """Tokens of the sequence the draft's cache accounts for (skipped ones included)."""
        return self.base + self.cache.length(self.slot)

    def unseen(self) -> int:
        """Tokens the next propose must feed before drafting (1 or 2 after a verification)."""
        return len(self.tokens) - self._seen()

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Run ids through the draft at its cache's end; the last position's logits (V,)."""
        start = self.cache.length(self.slot)
        x = torch.tensor([ids], dtype=torch.long)
        logits = self.model(x, self.cache, [self.slot], [start], logits="last")[0]
        self.cache.append(self.slot, ids)
        return logits

    def propose(self, k: int) -> Draft:
        k = min(k, self.n_max, self.cache.max_len - (len(self.tokens) - self.base) - 1)
        if k <= 0 or k < self.n_min:
            return Draft([])
        logits = self._feed(self.tokens[self._seen():])
        ids: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if torch.softmax(logits.float(), -1).max().item() < self.p_min:
                break
            if self.sampling.greedy:
                ids.append(int(logits.argmax()))
            else:
                q = logits_to_probs(logits[None], self.sampling)[0]
                ids.append(sample(q, self.gen))
                rows.append(q)
            if i + 1 < k:
                logits = self._feed(ids[-1:])
        if len(ids) < max(self.n_min, 1):
            return Draft([])
        return Draft(ids, torch.stack(rows) if rows else None)

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        # the draft saw tokens + ids[:-1]; keep what the target kept
        keep = len(self.tokens) - self.base + n_accepted
        self.cache.truncate(self.slot, min(self.cache.length(self.slot), keep))
        self.tokens.extend(new_ids)
