"""Slots, the step loop, and per-request statistics.

Every active sequence keeps its prompt cached except its last token. One iteration (`step`):

    draft = speculator.draft(budget)             for each active sequence (proposers, sizes and
                                                 controllers: speculative/speculator.py)
    logits = target([last, *draft])              every sequence in one pass (rows padded to the
                                                 longest; each row computed as if alone)
    res = verify(draft, logits)                  accepted + 1 tokens (recovered or bonus)
    cache.append(slot, [last, *accepted])        the rejected positions are never recorded
    speculator.accept(draft, n, tokens)          proposers roll back what the target rejected
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .config import EngineConfig, SamplingParams, SpecConfig
from .errors import TandemError
from .models.decoder import KVCache
from .models.loader import LoadedModel
from .sampling import make_generator
from .speculative.controller import AcceptanceTracker, CostModel
from .speculative.speculator import Speculation, Speculator
from .speculative.stats import SpecStats
from .speculative.verify import verify


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    spec: SpecConfig | None = None  # None = the engine's default
    cache_prompt: bool = True
    id_slot: int = -1
    n_probs: int = 0  # > 0: keep the target's top n_probs log-probabilities per output token


@dataclass(slots=True)
class TokenLogprobs:
    """The target's log-probability of an output token (raw logits, temperature 1), and the
    n most likely tokens at that position as (id, logprob), most likely first."""

    id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class Sequence:
    """One request in a slot: its tokens, text, stop state and statistics."""

    req: Request
    slot: int
    spec: SpecConfig
    speculator: Speculator | None
    gen: torch.Generator | None
    seed: int
    detok: object
    tokens: list[int]  # prompt + generated
    n_prompt: int
    n_prompt_processed: int = 0
    output: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)  # per output token
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # per output token, if n_probs
    text: str = ""  # decoded output (incl. held-back part)
    emitted: int = 0  # characters of text already handed out
    stop_type: str = ""  # "" while running, then eos | limit | word | cancel
    stopping_word: str = ""
    stats: SpecStats = field(default_factory=SpecStats)
    t_start: float = 0.0
    t_prompt_ms: float = 0.0
    t_gen_start: float = 0.0
    t_gen_ms: float = 0.0
    n_new: int = 0  # tokens produced by the last step

    @property
    def done(self) -> bool:
        return bool(self.stop_type)

    def take_text(self) -> str:
        """Text that is safe to stream now: never part of a possible stop string."""
        hold = 0 if self.done else _partial_stop(self.text, self.req.sampling.stop)
        end = len(self.text) - hold
        out = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out

    def timings(self) -> dict:
        n = len(self.output)
        t = {
            "prompt_n": self.n_prompt_processed,
            "prompt_ms": self.t_prompt_ms,
            "prompt_per_token_ms": self.t_prompt_ms / max(self.n_prompt_processed, 1),
            "prompt_per_second": 1e3 * self.n_prompt_processed / self.t_prompt_ms
            if self.t_prompt_ms > 0 else 0.0,
            "predicted_n": n,
            "predicted_ms": self.t_gen_ms,
            "predicted_per_token_ms": self.t_gen_ms / max(n, 1),
            "predicted_per_second": 1e3 * n / self.t_gen_ms if self.t_gen_ms > 0 else 0.0,
        }
        if self.spec.enabled:
            t["draft_n"] = self.stats.n_drafted
            t["draft_n_accepted"] = self.stats.n_accepted
        return t


def _partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest tail of text that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def _logprobs(rows: torch.Tensor, ids: list[int], n: int) -> list[TokenLogprobs]:
    """(T, V) logits, the T tokens chosen from them -> their log-probabilities and top n."""
    lp = torch.log_softmax(rows.float(), dim=-1)  # (T, V)
    top_v, top_i = lp.topk(min(n, lp.shape[-1]), dim=-1)  # (T, n)
    chosen = lp[torch.arange(len(ids)), torch.tensor(ids)].tolist()
    return [TokenLogprobs(t, c, list(zip(ti, tv)))
            for t, c, ti, tv in zip(ids, chosen, top_i.tolist(), top_v.tolist())]


class Engine:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None, cfg: EngineConfig,
                 spec: SpecConfig) -> None:
        spec = spec.resolved(has_draft=draft is not None)  # draft-simple needs a draft
        if cfg.n_threads > 0:  # PyTorch's own operations (the kernels are told per model)
            torch.set_num_threads(cfg.n_threads)
        self.target, self.draft, self.cfg, self.spec = target, draft, cfg, spec
        self.tok = target.tokenizer
        # room for the largest verification batch beyond the context: [last, *draft]
        self.max_k = spec.spare_positions
        max_len = cfg.max_len(spec)
        kv_dtype = target.dtype
        self.cache = KVCache(target.args, cfg.n_parallel, max_len, kv_dtype)
        self.draft_cache = None
        if draft is not None:
            self.draft_cache = KVCache(draft.args, cfg.n_parallel, max_len, draft.dtype)
        self.slots: list[Sequence | None] = [None] * cfg.n_parallel
        # what every sequence's speculation shares: pass costs, the draft model, the pool
        self.speculation = Speculation(draft, self.draft_cache, cfg.prefill_chunk,
                                       spec.suffix_pool)

    @property
    def costs(self) -> CostModel:
        """Measured seconds per target pass by rows and per draft token (this machine)."""
        return self.speculation.costs

    @property
    def draft_history(self) -> AcceptanceTracker:
        """The draft model's acceptance over every request so far."""
        return self.speculation.draft_history

    # -- requests -------------------------------------------------------------------------

    def free_slot(self, id_slot: int = -1) -> int | None:
        if id_slot >= 0:
            if id_slot >= len(self.slots):
                raise TandemError(f"id_slot {id_slot} out of range (0..{len(self.slots) - 1})")
            return id_slot if self.slots[id_slot] is None else None
        free = [i for i, s in enumerate(self.slots) if s is None]
        return free[0] if free else None

    def add(self, req: Request) -> Sequence:
        """Put a request in a free slot and process its prompt (all but the last token)."""
        ids = req.prompt_ids
        if not ids:
            raise TandemError("the prompt is empty; give at least one token")
        if len(ids) >= self.cfg.ctx_size:
            raise TandemError(
                f"the prompt has {len(ids)} tokens but the context holds {self.cfg.ctx_size}; "
                "shorten the prompt or raise --ctx-size"
            )
        bad = [t for t in ids if not 0 <= t < self.target.args.vocab_size]
        if bad:
            raise TandemError(f"token id {bad[0]} is outside the vocabulary "
                              f"(0..{self.target.args.vocab_size - 1})")
        slot = self.free_slot(req.id_slot)
        if slot is None:
            raise TandemError("no free slot")
        spec = self.spec if req.spec is None else req.spec.resolved(self.draft is not None)
        gen = make_generator(req.sampling.seed)
        seed = gen.initial_seed()
        seq = Sequence(req, slot, spec, None, gen, seed, self.tok.incremental(), list(ids),
                       len(ids))
        seq.t_start = time.perf_counter()
        if req.sampling.n_predict == 0:
            seq.stop_type = "limit"
            return seq
        self.slots[slot] = seq
        try:
            self._prefill(seq)
            seq.speculator = self.speculation.start(spec, slot, req.sampling, gen, list(ids),
                                                    seq.stats)
            if spec.adaptive and len(self.costs.verify) < 2:
                self.calibrate(slot)
        except BaseException:
            self.slots[slot] = None
            raise
        seq.t_prompt_ms = 1e3 * (time.perf_counter() - seq.t_start)
        seq.t_gen_start = time.perf_counter()
        return seq

    def _prefill(self, seq: Sequence) -> None:
        ids = seq.tokens[:-1]
        keep = self.cache.common_prefix(seq.slot, ids) if seq.req.cache_prompt else 0
        self.cache.truncate(seq.slot, keep)
        chunk = self.cfg.prefill_chunk
        for s in range(keep, len(ids), chunk):
            part = ids[s:s + chunk]
            self.target.model(torch.tensor([part]), self.cache, [seq.slot], [s], logits="none")
            self.cache.append(seq.slot, part)
        seq.n_prompt_processed = len(ids) - keep + 1

    def calibrate(self, slot: int) -> None:
        """Time target passes of up to max_k+1 rows (and a draft step) in a free cache area after
        the slot's own tokens, so the controller has costs before its first choice. Two rounds
        over every row count, keeping each one's faster time: a slow spell of this shared
        machine during one pass would otherwise bend the cost curve the controller starts
        from."""
        base = self.cache.length(slot)
        n = min(self.max_k, self.spec.max_k) + 1
        if base + n + 1 >= self.cache.max_len:
            return
        best: dict[int, float] = {}
        # every row count up to 9, then every fourth (costs in between are interpolated)
        counts = sorted({*range(1, min(n, 9) + 1), *range(13, n, 4), n})
        for _ in range(2):
            for rows in counts:
                t0 = time.perf_counter()
                self.target.model(torch.zeros(1, rows, dtype=torch.long), self.cache, [slot],
                                  [base])
                best[rows] = min(best.get(rows, math.inf), time.perf_counter() - t0)
        for rows, seconds in best.items():
            self.costs.record_verify(rows, seconds)
        if self.draft is not None:
            at = self.draft_cache.length(slot)
            t0 = time.perf_counter()
            self.draft.model(torch.zeros(1, 1, dtype=torch.long), self.draft_cache, [slot],
                             [at], logits="last")
            self.costs.record_draft(1, time.perf_counter() - t0)
            rows = min(32, self.draft_cache.max_len - at - 1)
            if rows > 0:  # the draft reading a prompt chunk, per token
                t0 = time.perf_counter()
                self.draft.model(torch.zeros(1, rows, dtype=torch.long), self.draft_cache,
                                 [slot], [at], logits="none")
                self.costs.record_draft_prefill(rows, time.perf_counter() - t0)

    def release(self, seq: Sequence) -> None:
        if self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
            if seq.speculator is not None:
                seq.speculator.end(finished=seq.stop_type in ("eos", "word", "limit"))

    def cancel(self, seq: Sequence) -> None:
        if not seq.done:
            seq.stop_type = "cancel"
        self.release(seq)

    # -- the step -------------------------------------------------------------------------

    def active(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None and not s.done]

    def _budget(self, seq: Sequence) -> int:
        """How many tokens one more iteration may draft for seq."""
        left = self.cfg.ctx_size - len(seq.tokens)
        n = seq.req.sampling.n_predict
        if n >= 0:
            left = min(left, n - len(seq.output))
        return max(0, min(left - 1, self.max_k))

    def _remaining(self, seq: Sequence) -> int:
        """Tokens seq may still generate (n_predict, else the context left)."""
        n = seq.req.sampling.n_predict
        return n - len(seq.output) if n >= 0 else self.cfg.ctx_size - len(seq.tokens)

    def step(self) -> list[Sequence]:
        """One iteration for every active sequence; returns them (check .done, take_text())."""
        seqs = self.active()
        if not seqs:
            return []
        drafts = [s.speculator.draft(self._budget(s), self._remaining(s)) for s in seqs]
        t0 = time.perf_counter()
        T = 1 + max(len(d.ids) for d in drafts)
        rows = torch.zeros(len(seqs), T, dtype=torch.long)
        for i, (s, d) in enumerate(zip(seqs, drafts)):
            row = [s.tokens[-1], *d.ids]
            rows[i, : len(row)] = torch.tensor(row)
        starts = [self.cache.length(s.slot) for s in seqs]
        logits = self.target.model(rows, self.cache, [s.slot for s in seqs], starts)
        t_fwd = time.perf_counter() - t0
        if len(seqs) == 1:  # the controller's cost of a pass with T rows for one sequence
            self.costs.record_verify(T, t_fwd)
        for i, (s, d) in enumerate(zip(seqs, drafts)):
            t1 = time.perf_counter()
            k = len(d.ids)
            res = verify(d.ids, d.probs, logits[i, : k + 1], s.req.sampling, s.gen)
            self.cache.append(s.slot, [s.tokens[-1], *d.ids[: res.n_accepted]])
            s.speculator.accept(d, res.n_accepted, res.tokens)
            s.stats.t_verify += t_fwd / len(seqs) + time.perf_counter() - t1
            self._append(s, res.tokens, res.n_accepted)
            if s.req.n_probs > 0 and s.n_new:
                s.logprobs.extend(_logprobs(logits[i, : s.n_new], s.output[-s.n_new:],
                                            s.req.n_probs))
        return seqs

    def _append(self, seq: Sequence, new: list[int], n_from_draft: int) -> None:
        sp = seq.req.sampling
        eog = () if sp.ignore_eos else self.tok.eog_ids
        seq.n_new = 0
        for j, t in enumerate(new):
            seq.tokens.append(t)
            seq.output.append(t)
            seq.from_draft.append(j < n_from_draft)
            seq.n_new += 1
            if t in eog:
                seq.stop_type = "eos"
                break
            seq.text += seq.detok.push(t)
            if sp.stop and self._check_stop(seq):
                break
            if sp.n_predict >= 0 and len(seq.output) >= sp.n_predict:
                seq.stop_type = "limit"
                break
            if len(seq.tokens) >= self.cfg.ctx_size:
                seq.stop_type = "limit"
                break
        if seq.done:
            if seq.stop_type != "word":
                seq.text += seq.detok.flush()
                if sp.stop:
                    self._check_stop(seq)
        seq.t_gen_ms = 1e3 * (time.perf_counter() - seq.t_gen_start)

    def _check_stop(self, seq: Sequence) -> bool:
        text = seq.text
        for s in seq.req.sampling.stop:
            i = text.find(s, max(0, seq.emitted - len(s)))
            if i >= 0:
                seq.text = text[:i]
                seq.stop_type = "word"
                seq.stopping_word = s
                return True
        return False

    # -- one request start to end -----------------------------------------------------------

    def generate(self, req: Request, on_text=None) -> Sequence:
        """Run one request to the end; on_text(str) gets the streamed text as it is safe."""
        seq = self.add(req)
        try:
            while not seq.done:
                self.step()
                if on_text is not None:
                    piece = seq.take_text()
                    if piece:
                        on_text(piece)
        finally:
            self.release(seq)
        if on_text is not None:
            piece = seq.take_text()
            if piece:
                on_text(piece)
        return seq
