"""Turning logits into tokens: llama.cpp's sampler chain as small tensor functions.

The chain, in llama.cpp's default order (common/common.h `samplers`: top-k, typ-p, top-p,
min-p, temperature, then `dist` draws the token; penalties, DRY, XTC, typ-p and top-n-sigma are
off by default and not implemented here):

    top-k   keep the k largest logits                               (top_k <= 0: off)
    top-p   softmax of what is left; keep the smallest set of most    (top_p >= 1: off)
            likely tokens whose probability sums to >= top_p (always at least one)
    min-p   keep tokens with prob >= min_p * (the largest prob)       (min_p <= 0: off)
    temp    divide the surviving logits by the temperature, softmax

Top-p and min-p therefore see temperature-1 probabilities, exactly as in llama.cpp: the
temperature reshapes the distribution only among the tokens the filters kept. Greedy
(temperature <= 0 or top_k == 1) is a one-hot at the argmax.

Example: logits = log([0.5, 0.2, 0.15, 0.1, 0.05]), top_k=0, top_p=0.6, min_p=0, temperature=2:
top-p keeps tokens 0 and 1 (0.5 < 0.6 <= 0.5 + 0.2), and temperature 2 turns their weights into
sqrt(0.5) : sqrt(0.2), so probs = [0.613, 0.387, 0, 0, 0].

Sampling draws with an explicit torch.Generator (one per request, seeded from the request's
seed), so the same seed and settings give the same tokens.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from .config import SamplingParams
from .errors import TandemError

_SEED_LIMIT = 2**64  # torch.Generator.manual_seed accepts 0 .. 2**64 - 1
MAX_TEMPERATURE = 1e30  # higher ones sample as this one: float32 logits / T stay finite
MIN_TEMPERATURE = 1e-30  # lower positive ones sample as this one (the best tokens only)


def logits_to_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after the sampler chain (module doc)."""
    logits = logits.float()
    if p.greedy:
        return _one_hot_argmax(logits)
    vals, idx = _candidates(logits, p)  # (..., C) logits, (..., C) token ids or None
    vals = _top_p(vals, p.top_p)
    vals = _min_p(vals, p.min_p)
    # scaled from the best logit, so that no temperature makes a logit infinite (a tiny one
    # leaves the best tokens alone, not inf / inf = NaN); past MAX_TEMPERATURE (float32's
    # range) the candidates are already equally likely
    top = vals.amax(dim=-1, keepdim=True)
    t = min(max(p.temperature, MIN_TEMPERATURE), MAX_TEMPERATURE)
    probs = torch.softmax((vals - top) / t, dim=-1)
    if idx is None:
        return probs
    return torch.zeros_like(logits).scatter_(-1, idx, probs)


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(logits)
    return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)


def _candidates(logits: torch.Tensor,
                p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k as a compact candidate list, sorted by logit (descending) when top-p needs it.

    Returns (vals, idx): vals (..., C) the candidates' logits, idx (..., C) their token ids, or
    idx None when vals is the whole unsorted vocabulary (no top-k, no top-p: nothing to sort).
    Working on the k candidates instead of all V tokens keeps top-p's sort cheap.
    """
    V = logits.shape[-1]
    if 0 < p.top_k < V:
        return torch.topk(logits, p.top_k, dim=-1)  # sorted, exactly k kept even on ties
    if p.top_p < 1.0:
        return torch.sort(logits, dim=-1, descending=True)
    return logits, None


def _top_p(vals: torch.Tensor, top_p: float) -> torch.Tensor:
    """vals (..., C) sorted descending; -inf out every token after the nucleus.

    A token is kept when the probability of the tokens before it is still < top_p, which is
    the smallest prefix whose sum reaches top_p. The first token is always kept.
    """
    if top_p >= 1.0:
        return vals
    probs = torch.softmax(vals, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # (..., C) mass of the more likely tokens
    drop = before >= top_p
    drop[..., 0] = False
    return vals.masked_fill(drop, -math.inf)


def _min_p(vals: torch.Tensor, min_p: float) -> torch.Tensor:
    """-inf out tokens with prob < min_p * max prob; in logits: logit < max logit + log(min_p)."""
    if min_p <= 0.0:
        return vals
    threshold = vals.amax(dim=-1, keepdim=True) + math.log(min_p)
    return vals.masked_fill(vals < threshold, -math.inf)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded with seed; seed < 0 draws a random 32-bit seed from os.urandom.

    The seed actually used is `gen.initial_seed()`, to report back to the user (a reported
    seed, sent again, reproduces the run). Random seeds are 32-bit like llama.cpp's.
    """
    if seed >= _SEED_LIMIT:
        raise TandemError(f"seed must be < 2**64 (or negative for a random seed), got {seed}")
    if seed < 0:
        seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample_rows(weights: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token per row of (..., V) non-negative weights (need not sum to 1) -> (...) long.

    Inverse-CDF sampling, like llama.cpp's `dist`: one uniform number per row, r = (1 - u) *
    total in (0, total], and the token is the first i with cumsum(w)[i] >= r. A zero weight is
    never chosen (its cumsum equals its predecessor's), the draw stays on the device (no host
    sync), and it costs one cumsum instead of V random numbers. Each row needs a positive total.

    Example: w = [0.2, 0, 0.8], cumsum = [0.2, 0.2, 1.0]; u = 0.5 -> r = 0.5 -> token 2.
    """
    cdf = torch.cumsum(weights.float(), dim=-1)  # (..., V) non-decreasing
    u = torch.rand((*cdf.shape[:-1], 1), generator=gen, device=cdf.device)  # (..., 1) in [0, 1)
    r = (1.0 - u) * cdf[..., -1:]  # (..., 1) in (0, total]
    return torch.searchsorted(cdf, r)[..., 0]


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    """Draw one token id from probs (V,)."""
    return int(sample_rows(probs, gen).item())


def greedy(logits: torch.Tensor) -> int:
    """The argmax token id of logits (V,)."""
    return int(torch.argmax(logits).item())


@dataclass(slots=True)
class TokenLogprobs:
    """The target's log-probability of an output token (raw logits, temperature 1), and the
    n most likely tokens at that position as (id, logprob), most likely first."""

    id: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(rows: torch.Tensor, ids: list[int], n: int,
              post: SamplingParams | None = None) -> list[TokenLogprobs]:
    """(T, V) logits, the T tokens chosen from them -> their log-probabilities and top n; with
    `post`, of the distribution the sampler drew from, tokens of probability 0 left out."""
    if post is None:
        lp = torch.log_softmax(rows.float(), dim=-1)  # (T, V)
    else:
        lp = torch.log(logits_to_probs(rows, post))  # -inf where the sampler rules a token out
    top_v, top_i = lp.topk(min(n, lp.shape[-1]), dim=-1)  # (T, n)
    chosen = lp[torch.arange(len(ids)), torch.tensor(ids)].tolist()
    return [TokenLogprobs(t, c, [(i, v) for i, v in zip(ti, tv) if v != float("-inf")])
            for t, c, ti, tv in zip(ids, chosen, top_i.tolist(), top_v.tolist())]
