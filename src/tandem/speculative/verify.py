"""One verification function for every proposer: accepted draft tokens + one more.

Words: draft token i is *accepted* or rejected; at the first rejection the target supplies the
*recovered* token; when all k are accepted the target's last row gives a *bonus* token. Either
way one iteration emits n_accepted + 1 tokens.

Greedy requests: accept while the draft token equals the target's argmax; the extra token is the
target's argmax at the first mismatch (or at row k).

Sampled requests: exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023). With p_i
the target's distribution at row i (after the request's own top-k / top-p / min-p / temperature)
and q_i the distribution draft token x_i was drawn from:

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
    at the first rejection emit y ~ normalize(max(p_i - q_i, 0))          (recovered)
    if all k are accepted emit y ~ p_k                                    (bonus)

Why the output has the target's distribution: P(emit x at row i) = q(x) min(1, p(x)/q(x)) +
P(reject) r(x) = min(q(x), p(x)) + max(p(x) - q(x), 0) = p(x), because P(reject) =
1 - sum_x min(p, q) = sum_x max(p - q, 0) is exactly the residual's normalizer.

Worked example, vocabulary {a, b, c}: p = (0.6, 0.3, 0.1), q = (0.2, 0.2, 0.6).
Drafted a or b: p/q = 3 or 1.5 -> always accepted. Drafted c: accepted with probability
0.1/0.6 = 1/6; otherwise recovered from max(p - q, 0) = (0.4, 0.1, 0) normalized = (0.8, 0.2, 0).
P(reject) = q(c) * 5/6 = 0.5. Check a: P(emit a) = q(a) * 1 + 0.5 * 0.8 = 0.6 = p(a);
b: 0.2 + 0.5 * 0.2 = 0.3 = p(b); c: 0.6 * 1/6 = 0.1 = p(c).

A deterministic proposer (n-gram, suffix; draft_probs None) has q = one-hot at x, so x is
accepted with probability p(x) and the recovered token comes from p with x removed. That is the
same as drawing the target's own token y ~ p and accepting iff y == x, which is how it is
computed here: the emitted token is then exactly the target's own sample, and greedy is the
same rule with the argmax as "the sample". The rows are drawn one at a time, only while they
match, so a request draws exactly one number per emitted token, as it does without
speculation: the same seed gives the same text with speculation as without (llama-server's
guarantee too). The draft model proposes its top token the same way; only with
--spec-draft-rejection does it sample its draft and pass the rows (draft_probs), which are
verified by rejection sampling: more accepted (sum_x min(p, q) rather than p(x)) but other
draws, the same distribution, not the same text for a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..config import SamplingParams
from ..sampling import logits_to_probs, sample_rows


@dataclass(slots=True)
class VerifyResult:
    """n_accepted draft tokens were kept; tokens = those followed by the recovered/bonus token."""

    n_accepted: int
    tokens: list[int]


def verify(draft_ids: list[int], draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           params: SamplingParams, gen: torch.Generator | None) -> VerifyResult:
    """Verify one sequence's draft against the target's k + 1 logit rows.

    draft_ids: k drafted tokens (k may be 0: then this samples one token from row 0).
    draft_probs: (k, V) rows the draft tokens were drawn from, or None for a deterministic
        proposer (also what a greedy draft is). Ignored for greedy requests.
    target_logits: (k+1, V); row i scores the position of draft_ids[i], row k the one after.
    gen: the request's generator, on target_logits' device (None = torch's global one);
        unused for greedy requests.
    Returns len(tokens) == n_accepted + 1. One host sync.
    """
    _check_inputs(draft_ids, draft_probs, target_logits)
    if params.greedy and target_logits.dtype == torch.float32 and not target_logits.is_cuda:
        # the same rule without building tensors: every decode step of a greedy request comes
        # here (numpy's argmax, like torch's, takes the first of equal maxima)
        best = target_logits.numpy().argmax(-1).tolist()
        n = 0
        while n < len(draft_ids) and draft_ids[n] == best[n]:
            n += 1
        return VerifyResult(n, [*draft_ids[:n], best[n]])
    draft = torch.tensor([draft_ids], dtype=torch.long, device=target_logits.device)  # (1, k)
    probs = None if draft_probs is None else draft_probs[None]
    n, tokens = verify_batch(draft, probs, target_logits[None], params, gen)
    out = torch.cat([n, tokens[0]]).tolist()
    return VerifyResult(out[0], out[1 : out[0] + 2])


def verify_synthetic(draft_ids: list[int], target_logits: torch.Tensor, params: SamplingParams,
                     gen: torch.Generator | None, accept: list[float], rng: random.Random,
                     eog: frozenset[int] | set[int]) -> VerifyResult:
    """--spec-synth-* (llama-server's benchmarking mode; the output is not the target's): draft
    token i is kept with probability accept[i] given the ones before it, whatever the target
    says, never a drafted end of generation; then the target's own token at the first row not
    kept (its argmax, or one draw from the request's sampler, as decoding without a draft).
    One draw of rng per drafted token looked at: a seed repeats the same decisions."""
    n = 0
    while n < len(draft_ids):
        keep = n < len(accept) and rng.random() < accept[n]
        if not keep or draft_ids[n] in eog:
            break
        n += 1
    own = verify([], None, target_logits[n: n + 1], params, gen).tokens[0]
    return VerifyResult(n, [*draft_ids[:n], own])


def verify_batch(draft: torch.Tensor, draft_probs: torch.Tensor | None,
                 target_logits: torch.Tensor, params: SamplingParams,
                 gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule for B sequences sharing params and gen; no host sync.

    draft (B, k) long, draft_probs (B, k, V) or None, target_logits (B, k+1, V).
    Returns n_accepted (B,) long and tokens (B, k+1) long: row b holds the accepted draft
    tokens, the recovered/bonus token at index n_accepted[b], and -1 after it.
    """
    if params.greedy:
        target = target_logits.argmax(-1)  # (B, k+1)
        return _leading(draft, draft == target[:, :-1], target)
    p = logits_to_probs(target_logits, params)  # (B, k+1, V)
    if draft_probs is None:
        target = _match_sample(draft, p, gen)  # the target's own samples, while they match
        return _leading(draft, draft == target[:, :-1], target)
    accepted, extra = _rejection_sample(draft, p, draft_probs.to(p), gen)
    return _leading(draft, accepted, extra)


def _match_sample(draft: torch.Tensor, p: torch.Tensor,
                  gen: torch.Generator | None) -> torch.Tensor:
    """(B, k+1) the target's own sample at each row, drawn row by row for the sequences whose
    earlier rows all matched their draft (-1 where no longer drawn): one number per emitted
    token, as without speculation."""
    B, k = draft.shape
    out = torch.full((B, k + 1), -1, dtype=torch.long, device=p.device)
    active = torch.arange(B, device=p.device)
    for i in range(k + 1):
        out[active, i] = t = sample_rows(p[active, i], gen)
        if i == k:
            break
        active = active[t == draft[active, i]]
        if not len(active):
            break
    return out


def _rejection_sample(draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                      gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted (B, k) bool and extra (B, k+1): extra[:, i] is the token to emit if the first
    rejection is at row i (recovered; i < k) or if all k are accepted (bonus; i == k)."""
    k = draft.shape[1]
    p_draft, p_bonus = p[:, :k], p[:, k:]  # (B, k, V), (B, 1, V)
    p_x = p_draft.gather(-1, draft[..., None])[..., 0]  # (B, k)
    q_x = q.gather(-1, draft[..., None])[..., 0]  # (B, k)
    u = torch.rand(draft.shape, generator=gen, device=p.device, dtype=p.dtype)  # [0, 1)
    # u < p/q without dividing: q_x = 0 (cannot happen for a drawn token) accepts iff p_x > 0,
    # and p_x = 0 never accepts
    accepted = u * q_x < p_x
    residual = (p_draft - q).clamp_min_(0.0)  # (B, k, V)
    # all zero only when p == q, where rejection has probability 0; p keeps it well defined
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_draft)
    extra = sample_rows(torch.cat([residual, p_bonus], dim=1), gen)  # (B, k+1)
    return accepted, extra


def _leading(draft: torch.Tensor, accepted: torch.Tensor,
             extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the draft up to the first rejection and put extra's token right after it."""
    B, k = draft.shape
    n = accepted.long().cumprod(dim=-1).sum(dim=-1)  # (B,) leading accepted count
    pos = torch.arange(k + 1, device=draft.device)  # (k+1,)
    padded = torch.cat([draft, draft.new_full((B, 1), -1)], dim=1)  # (B, k+1)
    tokens = torch.where(pos < n[:, None], padded, -1)
    tokens.scatter_(1, n[:, None], extra.gather(1, n[:, None]))
    return n, tokens


def _check_inputs(draft_ids: list[int], draft_probs: torch.Tensor | None,
                  target_logits: torch.Tensor) -> None:
    k, V = len(draft_ids), target_logits.shape[-1]
    if target_logits.dim() != 2 or target_logits.shape[0] != k + 1:
        raise ValueError(f"target_logits must be (k+1, V) = ({k + 1}, V) for {k} draft tokens, "
                         f"got {tuple(target_logits.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (k, V):
        raise ValueError(f"draft_probs must be (k, V) = ({k}, {V}), got {tuple(draft_probs.shape)}")
    if draft_ids and not (0 <= min(draft_ids) and max(draft_ids) < V):
        raise ValueError(f"draft token ids must be in [0, {V}), got {draft_ids}")
