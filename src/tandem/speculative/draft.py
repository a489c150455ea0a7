"""draft-simple: a second, smaller model with its own KV cache proposes tokens."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..config import SamplingParams
from ..grammar import Guide
from ..models.decoder import KVCache, Transformer
from ..sampling import logits_to_probs, sample
from .proposer import Draft


class Shortlist:
    """The draft's output projection restricted to some vocabulary rows: the first `prefix`
    ids (BPE vocabularies number tokens roughly by merge rank, so these are the common ones)
    plus every id the sequence has used (`add`), so words copied from the prompt stay
    proposable. On the 0.5B draft the full 151,936-row projection is about a third of the
    bytes a token reads.

    Only which tokens the draft can propose changes: a greedy draft takes the argmax over the
    shortlist, a sampled one draws from the distribution over it (zero elsewhere), and that
    distribution is what the verifier receives as q, so the output keeps the target's
    distribution exactly. The layer gives its own rows (`output.rows(idx)`): the prefix read
    in place, the extra rows copied once per change of the set.
    """

    def __init__(self, output: torch.nn.Module, prefix: int, vocab_size: int) -> None:
        self.output, self.prefix, self.vocab_size = output, prefix, vocab_size
        self.extra: list[int] = []
        self._known: set[int] = set()
        self._head = output.rows(slice(0, prefix))
        self._tail: torch.nn.Module | None = None  # the extra rows, built on first use
        self.ids = torch.arange(prefix)

    def add(self, ids: list[int]) -> None:
        new = [i for i in dict.fromkeys(ids) if self.prefix <= i < self.vocab_size
               and i not in self._known]
        if new:
            self.extra += new
            self._known.update(new)
            self._tail = None
            self.ids = torch.cat([torch.arange(self.prefix), torch.tensor(self.extra)])

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h (dim,) normed hidden state -> (len(self.ids),) float32 logits."""
        parts = [self._head(h)]
        if self.extra:
            if self._tail is None:
                self._tail = self.output.rows(self.extra)
            parts.append(self._tail(h))
        return torch.cat(parts).float()


def draw(logits: torch.Tensor, sampling: SamplingParams, gen: torch.Generator | None,
         rejection: bool) -> tuple[int, float, torch.Tensor | None]:
    """A drafted token from a proposer's logits: (index, confidence, q). Greedy: the top one,
    its probability; sampled: the top one, its probability under the request's sampling (what
    the target's own draw is expected to match); with rejection: drawn from that distribution,
    which is returned as q for rejection sampling (else None)."""
    if sampling.greedy:
        j = int(logits.argmax())
        return j, float(torch.softmax(logits.float(), -1)[j]), None
    q = logits_to_probs(logits[None], sampling)[0]
    if not rejection:
        j = int(logits.argmax())
        return j, float(q[j]), None
    j = sample(q, gen)
    return j, float(q[j]), q


# tokens a draft model reads before a context shift to hold what the target's cache holds
CATCH_UP_BEFORE_SHIFT = 16


def draft_step_seconds(model: Transformer, cache: KVCache, slot: int, at: int, vocab: int,
                       rounds: int = 3) -> float:
    """Seconds of one drafted token as `propose` makes it (one row at position `at` of the
    slot, logits over the shortlist of `vocab` first ids when vocab > 0), the fastest of
    `rounds`: the model's first call pays one-time costs, and a cost measured too high keeps
    the controller from ever drafting again to correct it."""
    n_vocab = model.args.vocab_size
    short = (Shortlist(model.output, vocab, n_vocab)
             if 0 < vocab < n_vocab and hasattr(model.output, "rows") else None)
    best = float("inf")
    for _ in range(rounds):
        x = torch.zeros(1, 1, dtype=torch.long)
        t0 = time.perf_counter()
        if short is None:
            model(x, cache, [slot], [at], logits="last")
        else:
            short.logits(model(x, cache, [slot], [at], logits="hidden")[0])
        best = min(best, time.perf_counter() - t0)
    return best


class DraftModelProposer:
    """Drafts up to n_max tokens with the draft model, one forward pass per token.

    Like llama.cpp's draft-simple: before each token it looks at the draft's own top-token
    probability (temperature 1) and stops when it falls below p_min; a draft shorter than n_min
    is dropped. It drafts its top token, as llama-server's draft does, greedy request or
    sampled: the verifier then draws the target's own sample at each row and keeps the draft
    while they match, so a seed gives the same text as without speculation; each token's
    confidence is its probability under the request's sampling settings, what the target's
    draw is expected to match. With `rejection` (--spec-draft-rejection) a sampled request's
    tokens are drawn from the draft's distribution under those settings and the rows are
    returned as q for rejection sampling: more accepted at high temperatures, the target's
    distribution, other draws.

    The draft's cache slot holds the sequence from token `base` on (0, or with a window the
    start of the prompt's last `window` tokens), at positions counted from there: `propose`
    first feeds what the draft has not seen (catch-up), and `accept` rolls its cache back to
    what the target kept.
    """

    free = False  # every drafted token is a pass of the draft model
    kind = "draft"  # how its accepted tokens are reported (Sequence.origins)

    def __init__(self, model: Transformer, cache: KVCache, slot: int, sampling: SamplingParams,
                 gen: torch.Generator | None, n_max: int, n_min: int, p_min: float,
                 prefill_chunk: int = 512, window: int = 0, vocab: int = 0,
                 lazy: bool = False, banned: tuple[int, ...] = (),
                 rejection: bool = False, guide: Guide | None = None) -> None:
        self.model, self.cache, self.slot = model, cache, slot
        self.rejection = rejection and not sampling.greedy  # drafts drawn, verified against q
        # ids never proposed: the end-of-generation tokens of a request that ignores EOS,
        # which the target's rows mask out (so proposing one would only waste the draft)
        self.banned = torch.tensor(sorted(banned), dtype=torch.long)
        self.lazy = lazy  # begin() only records the prompt; the first propose catches up
        self.vocab = vocab  # > 0: propose from a Shortlist of this many first ids (+ used ones)
        self.short: Shortlist | None = None
        self.window = window  # 0: the whole prompt
        self.base = 0  # index in tokens of the draft cache's position 0
        self.prefill_chunk = prefill_chunk  # the target's prompt chunk (EngineConfig)
        self.sampling, self.gen = sampling, gen
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min
        self.tokens: list[int] = []
        # the request's grammar: each token is drawn from the draft's distribution with what
        # the grammar forbids removed, so q is masked as the target's p
        self.guide = guide

    def begin(self, prompt_ids: list[int]) -> None:
        """Take the prompt and process it now, during prompt time, as the target does: all but
        the last token (which the first propose feeds), in chunks, without logits; with a window,
        only the last `window` of them."""
        self.tokens = list(prompt_ids)
        n_vocab = self.model.args.vocab_size
        self.short = None
        if 0 < self.vocab < n_vocab and hasattr(self.model.output, "rows"):
            self.short = Shortlist(self.model.output, self.vocab, n_vocab)
            self.short.add(prompt_ids)
        self.base = max(0, len(prompt_ids) - 1 - self.window) if self.window else 0
        ids = prompt_ids[self.base:-1]
        # a prefix the slot already holds from an earlier request is reused
        held = self.cache.common_prefix(self.slot, ids) if self.base == 0 else 0
        self.cache.truncate(self.slot, held)
        if not self.lazy:
            self._fill(ids[held:])

    def _fill(self, ids: list[int]) -> None:
        """Feed ids at the cache's end in prompt chunks, without logits."""
        chunk = self.prefill_chunk
        for s in range(0, len(ids), chunk):
            part = ids[s: s + chunk]
            start = self.cache.length(self.slot)
            self.model(torch.tensor([part]), self.cache, [self.slot], [start], logits="none")
            self.cache.append(self.slot, part)

    def catch_up(self, limit: int | None = None) -> int:
        """Catch up now on the tokens not yet seen but the last (which propose feeds, for its
        logits), in prompt chunks, at most `limit` of them; returns how many were fed."""
        ids = self.tokens[self._seen():-1]
        if limit is not None:
            ids = ids[:limit]
        self._fill(ids)
        return len(ids)

    def _seen(self) -> int:
        """Tokens of the sequence the draft's cache accounts for (skipped ones included)."""
        return self.base + self.cache.length(self.slot)

    def behind(self) -> int:
        """Tokens the next propose must feed before drafting (1 or 2 after a verification)."""
        return len(self.tokens) - self._seen()

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Run ids through the draft at its cache's end; the last position's logits over the
        vocabulary (V,), or over the shortlist's ids."""
        start = self.cache.length(self.slot)
        x = torch.tensor([ids], dtype=torch.long)
        if self.short is None:
            logits = self.model(x, self.cache, [self.slot], [start], logits="last")[0]
        else:
            h = self.model(x, self.cache, [self.slot], [start], logits="hidden")[0]
            logits = self.short.logits(h)
        self.cache.append(self.slot, ids)
        if len(self.banned):
            logits = logits.clone()
            where = (self.banned[self.banned < logits.shape[-1]] if self.short is None
                     else torch.isin(self.short.ids, self.banned).nonzero()[:, 0])
            logits[where] = float("-inf")
        return logits

    def propose(self, k: int, extend: Callable[[list[float]], bool] | None = None) -> Draft:
        """Up to k tokens, one pass each. extend (auto's controller, `Controller.extend`):
        asked after each token, with the confidences so far, whether one more pass pays."""
        k = min(k, self.n_max, self.cache.max_len - (len(self.tokens) - self.base) - 1)
        if k <= 0 or k < self.n_min:
            return Draft([])
        if self.behind() > self.prefill_chunk:  # a long catch-up goes in prompt chunks
            self.catch_up()
        logits = self._feed(self.tokens[self._seen():])
        ids: list[int] = []
        rows: list[torch.Tensor] = []
        conf: list[float] = []  # the draft's probability of each token it proposes
        for i in range(k):
            if self.guide is not None:
                allowed = self.guide.allowed(ids)
                n = min(len(allowed), self.model.args.vocab_size)
                keep = torch.zeros(logits.shape[-1] if self.short is None
                                   else self.model.args.vocab_size, dtype=torch.bool)
                keep[:n] = allowed[:n]
                if self.short is not None:
                    keep = keep[self.short.ids]
                if not keep.any():
                    break
                logits = logits.float().masked_fill(~keep, float("-inf"))
            top = torch.softmax(logits.float(), -1).max().item()
            if top < self.p_min:
                break
            j, c, q = draw(logits, self.sampling, self.gen, self.rejection)
            conf.append(c)
            if q is not None:
                if self.short is not None:  # the distribution over the whole vocabulary
                    q = torch.zeros(self.model.args.vocab_size, dtype=q.dtype).index_copy_(
                        0, self.short.ids, q)
                rows.append(q)
            ids.append(j if self.short is None else int(self.short.ids[j]))
            if self.guide is not None and ids[-1] in self.guide.eog:
                break  # the grammar's end: nothing follows
            if i + 1 < k and extend is not None and not extend(conf):
                break
            if i + 1 < k:
                logits = self._feed(ids[-1:])
        if len(ids) < max(self.n_min, 1):
            return Draft([])
        return Draft(ids, torch.stack(rows) if rows else None, conf)

    def accept(self, n_accepted: int, new_ids: list[int]) -> None:
        # the draft saw tokens + ids[:-1]; keep what the target kept
        keep = len(self.tokens) - self.base + n_accepted
        self.cache.truncate(self.slot, min(self.cache.length(self.slot), keep))
        self.tokens.extend(new_ids)
        if self.short is not None:
            self.short.add(new_ids)

    def shift(self, keep: int, discard: int) -> None:
        """The sequence lost tokens keep .. keep + discard - 1: the draft's cache loses them
        too, its later positions moved and their keys turned as the target's
        (KVCache.shift). It first reads the few tokens the target's cache holds and it has
        not seen yet (the target read them before the shift, attending to what was dropped):
        read after it, they would differ from the target's, and every draft after them too.
        A draft further behind (auto, idle) reads on from `keep` when it is next used; with a
        window, the last `window` tokens."""
        held = self.cache.length(self.slot)
        if self.base == 0 and 0 < len(self.tokens) - 1 - held <= CATCH_UP_BEFORE_SHIFT:
            self._fill(self.tokens[held:-1])
            held = self.cache.length(self.slot)
        del self.tokens[keep: keep + discard]
        if self.base > 0:
            self.base = max(0, len(self.tokens) - 1 - self.window)
            self.cache.truncate(self.slot, 0)
        elif held > keep + discard:
            self.cache.shift(self.slot, keep, discard)
        else:
            self.cache.truncate(self.slot, min(held, keep))

    def end(self) -> None:
        pass
