"""One request in the engine: what was asked (`Request`) and what its slot holds and produced
so far (`Sequence`: tokens, text held back before a possible stop string, statistics)."""

from __future__ import annotations

import random
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from ..config import SamplingParams, SpecConfig
from ..grammar import Guide
from ..media import Media
from ..sampling import TokenLogprobs
from ..speculative.speculator import Speculator
from ..speculative.stats import SpecStats


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    spec: SpecConfig | None = None  # None = the engine's default
    cache_prompt: bool = True
    id_slot: int = -1
    n_probs: int = 0  # > 0: keep the target's top n_probs log-probabilities per output token
    # with n_probs: the probabilities after the sampler chain (temperature, top-k/p, min-p),
    # tokens it rules out left out, instead of the raw logits' (llama.cpp's post_sampling_probs)
    post_sampling: bool = False
    grammar: str | None = None  # an llguidance grammar (grammar.py from_gbnf/from_json_schema)
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the target's logits
    # with --context-shift: the tokens a full context keeps (-1: the prompt), and how many of
    # those after them it drops (0: half)
    n_keep: int = 0
    n_discard: int = 0
    media: list[Media] = field(default_factory=list)  # the prompt's images (media.py)


@dataclass(slots=True)
class Sequence:
    """One request: waiting for a slot (slot -1), then in its slot: its tokens, text, stop
    state and statistics."""

    req: Request
    slot: int
    spec: SpecConfig
    speculator: Speculator | None
    gen: torch.Generator | None
    seed: int
    detok: object
    tokens: list[int]  # prompt + generated
    n_prompt: int
    n_prompt_processed: int = 0  # prompt tokens this request computes (not reused from cache)
    prefill_at: int = 0  # prompt tokens held in the cache so far (all but the last when read)
    output: list[int] = field(default_factory=list)
    # per output token: its proposer ("target" or Draft.source); len(text) once it was decoded
    origins: list[str] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # per output token, if n_probs
    text: str = ""  # decoded output (incl. held-back part)
    emitted: int = 0  # characters of text already handed out
    stop_type: str = ""  # "" while running, then eos | limit | word | cancel | error
    error: str = ""  # with stop_type "error": why the request could not go on
    stopping_word: str = ""
    stats: SpecStats = field(default_factory=SpecStats)
    t_start: float = 0.0
    t_prompt_ms: float = 0.0
    t_gen_start: float = 0.0
    t_gen_ms: float = 0.0
    n_new: int = 0  # tokens produced by the last step
    guide: Guide | None = None  # the request's grammar state
    bias: torch.Tensor | None = None  # (V,) the request's logit biases
    truncated: bool = False  # the context was shifted (tokens dropped) while generating
    synth: random.Random | None = None  # --spec-synth-*: the draws that accept drafted tokens

    @property
    def done(self) -> bool:
        return bool(self.stop_type)

    @property
    def waiting(self) -> bool:
        """On the scheduler's waiting list: no slot yet (slot -1)."""
        return self.slot < 0

    @property
    def prefilling(self) -> bool:
        """Still reading its prompt (all but the last token go into the cache first)."""
        return self.prefill_at < self.n_prompt - 1

    @property
    def gen_steps(self) -> int:
        """Tokens generated after the first: what predicted_ms timed."""
        return max(len(self.output) - 1, 0)

    def append(self, new: list[int], n_from_draft: int, source: str, eog: Collection[int],
               ctx_size: int, context_shift: bool) -> None:
        """The tokens one pass gave (the first n_from_draft of them drafted by `source`), up
        to the first that ends the generation: an end-of-generation id (in eog), a stop
        string, n_predict, or a full context (unless it shifts)."""
        sp = self.req.sampling
        # with a grammar, an EOG token comes only where the grammar allows nothing else: its end
        eog = () if sp.ignore_eos and self.guide is None else eog
        self.n_new = 0
        if not self.output and new:  # the first token ends the prompt's time
            self.t_gen_start = time.perf_counter()
            self.t_prompt_ms = 1e3 * (self.t_gen_start - self.t_start)
        for j, t in enumerate(new):
            self.tokens.append(t)
            self.output.append(t)
            self.origins.append(source if j < n_from_draft else "target")
            self.n_new += 1
            self.text += "" if t in eog else self.detok.push(t)
            self.ends.append(len(self.text))
            if t in eog:
                self.stop_type = "eos"
            elif sp.stop and self._check_stop():
                pass
            elif sp.n_predict >= 0 and len(self.output) >= sp.n_predict:
                self.stop_type = "limit"
            elif len(self.tokens) >= ctx_size and not context_shift:
                self.stop_type = "limit"
            if self.done:
                break
        if self.done and self.stop_type != "word":
            self.text += self.detok.flush()
            if sp.stop:
                self._check_stop()
        self.t_gen_ms = 1e3 * (time.perf_counter() - self.t_gen_start)

    def finish(self, why: str, error: str = "") -> None:
        """End the generation (why: a stop_type), the decoder's held-back text flushed."""
        self.stop_type, self.error = why, error
        self.text += self.detok.flush()

    def _check_stop(self) -> bool:
        """Cut the text at the first stop string that appears in what is not yet emitted."""
        text = self.text
        for s in self.req.sampling.stop:
            i = text.find(s, max(0, self.emitted - len(s)))
            if i >= 0:
                self.text = text[:i]
                self.stop_type = "word"
                self.stopping_word = s
                return True
        return False

    def take_text(self) -> str:
        """Text that is safe to stream now: never part of a possible stop string."""
        hold = 0 if self.done else _partial_stop(self.text, self.req.sampling.stop)
        end = len(self.text) - hold
        out = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out

    def timings(self) -> dict:
        """llama-server's timings: the prompt's time runs until the first token (the pass that
        reads the last prompt token gives it), the generation's from there to the last token,
        so its rate is over the n - 1 tokens after the first (`gen_steps`)."""
        n = len(self.output)
        steps = self.gen_steps
        t = {
            "cache_n": self.n_prompt - self.n_prompt_processed,
            "prompt_n": self.n_prompt_processed,
            "prompt_ms": self.t_prompt_ms,
            "prompt_per_token_ms": self.t_prompt_ms / max(self.n_prompt_processed, 1),
            "prompt_per_second": 1e3 * self.n_prompt_processed / self.t_prompt_ms
            if self.t_prompt_ms > 0 else 0.0,
            "predicted_n": n,
            "predicted_ms": self.t_gen_ms,
            "predicted_per_token_ms": self.t_gen_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 * steps / self.t_gen_ms if self.t_gen_ms > 0 else 0.0,
        }
        if self.spec.enabled:
            t["draft_n"] = self.stats.n_drafted
            t["draft_n_accepted"] = self.stats.n_accepted
            if self.guide is not None:  # drafted tokens the grammar forced
                t["draft_n_forced"] = self.stats.n_forced
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
