"""The verifier: greedy acceptance on hand-built logits, and exact speculative sampling.

The statistical tests draw >= 100,000 speculative iterations for small vocabularies and check
that every emitted position has the target's distribution. They call `verify_batch`, the batched
rule that `verify` itself runs with B = 1 (100k separate `verify` calls would take ~20 s on a
loaded 2-core machine); `test_verify_is_verify_batch_on_one_row` pins the two together and
`test_public_verify_in_a_loop_keeps_the_target_distribution` runs the public function directly.
"""

import pytest
import scipy.stats
import torch

from tandem.config import SamplingParams
from tandem.sampling import logits_to_probs, make_generator
from tandem.speculative.verify import VerifyResult, verify, verify_batch

GREEDY = SamplingParams(temperature=0.0)
PLAIN = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def log(rows: list[list[float]]) -> torch.Tensor:
    """Logits whose temperature-1 softmax is the given rows (zeros become -inf)."""
    return torch.tensor(rows, dtype=torch.float32).log()


# -- greedy ------------------------------------------------------------------------------------


def greedy_logits() -> torch.Tensor:
    """(4, 6) target rows whose argmaxes are 3, 1, 4, 2."""
    logits = torch.zeros(4, 6)
    for row, best in enumerate([3, 1, 4, 2]):
        logits[row, best] = 5.0
        logits[row, (best + 1) % 6] = 4.0  # a close second, to make an off-by-one visible
    return logits


def test_greedy_all_accepted_plus_bonus():
    assert verify([3, 1, 4], None, greedy_logits(), GREEDY, None) == VerifyResult(3, [3, 1, 4, 2])


def test_greedy_first_mismatch_is_replaced_by_the_target_argmax():
    assert verify([3, 2, 4], None, greedy_logits(), GREEDY, None) == VerifyResult(1, [3, 1])
    assert verify([0, 1, 4], None, greedy_logits(), GREEDY, None) == VerifyResult(0, [3])
    assert verify([3, 1, 5], None, greedy_logits(), GREEDY, None) == VerifyResult(2, [3, 1, 4])


def test_greedy_empty_draft_is_the_argmax_of_row_zero():
    assert verify([], None, greedy_logits()[:1], GREEDY, None) == VerifyResult(0, [3])


def test_greedy_ignores_draft_probs_and_top_k_one_is_greedy():
    q = torch.full((3, 6), 1 / 6)
    top1 = SamplingParams(temperature=0.9, top_k=1)
    assert verify([3, 1, 4], q, greedy_logits(), top1, make_generator(0)) == VerifyResult(
        3, [3, 1, 4, 2])


def test_bfloat16_target_logits_work():
    logits = greedy_logits().bfloat16()
    assert verify([3, 1, 0], None, logits, GREEDY, None) == VerifyResult(2, [3, 1, 4])


def test_bad_shapes_and_ids_are_reported():
    with pytest.raises(ValueError, match=r"\(k\+1, V\) = \(4, V\)"):
        verify([3, 1, 4], None, greedy_logits()[:3], GREEDY, None)
    with pytest.raises(ValueError, match=r"draft_probs must be \(k, V\) = \(3, 6\)"):
        verify([3, 1, 4], torch.ones(2, 6) / 6, greedy_logits(), PLAIN, None)
    with pytest.raises(ValueError, match=r"draft token ids must be in \[0, 6\)"):
        verify([3, 1, 6], None, greedy_logits(), GREEDY, None)


# -- sampled: exact behaviour ------------------------------------------------------------------


def test_identical_draft_and_target_accepts_everything():
    logits = torch.randn(4, 7, generator=torch.Generator().manual_seed(1))
    q = logits_to_probs(logits[:3], PLAIN)
    gen = make_generator(0)
    for ids in ([0, 1, 2], [6, 6, 6], [5, 0, 3]):
        assert verify(ids, q, logits, PLAIN, gen).n_accepted == 3


def test_a_token_the_target_filtered_out_is_never_accepted_or_emitted():
    # top-k 2 of the target keeps tokens 0 and 1 only; the draft proposes token 2
    logits = log([[0.5, 0.3, 0.2]] * 3)
    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    gen = make_generator(11)
    q = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    for draft_probs in (q, None):
        for _ in range(300):
            res = verify([2, 2], draft_probs, logits, params, gen)
            assert res.n_accepted == 0 and res.tokens[0] in (0, 1)


def test_empty_draft_samples_one_token():
    logits = log([[0.25, 0.0, 0.75]])
    gen = make_generator(5)
    out = [verify([], None, logits, PLAIN, gen) for _ in range(400)]
    assert all(r.n_accepted == 0 and len(r.tokens) == 1 for r in out)
    share = sum(r.tokens[0] == 2 for r in out) / len(out)
    assert 0.65 < share < 0.85 and all(r.tokens[0] != 1 for r in out)


def run_public(seed: int, draft_probs: torch.Tensor | None) -> list[VerifyResult]:
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(2))
    gen = make_generator(seed)
    return [verify([1, 4, 7], draft_probs, logits, PLAIN, gen) for _ in range(200)]


@pytest.mark.parametrize("draft_probs", [None, torch.full((3, 9), 1 / 9)])
def test_seeded_runs_repeat_exactly(draft_probs):
    assert run_public(123, draft_probs) == run_public(123, draft_probs)
    assert run_public(123, draft_probs) != run_public(124, draft_probs)


def test_greedy_verify_is_verify_batch_with_ties_and_long_matches():
    """verify's greedy shortcut (numpy's argmax, no tensors) against the vectorized rule, on
    rows full of equal maxima (both take the first) and drafts that match for a while."""
    g = torch.Generator().manual_seed(5)
    for case in range(60):
        k, V = case % 7, 6
        logits = torch.randint(0, 3, (k + 1, V), generator=g).float()  # many ties
        best = logits.argmax(-1).tolist()
        keep = case % (k + 1)
        ids = best[:keep] + torch.randint(V, (k - keep,), generator=g).tolist()
        res = verify(ids, None, logits, GREEDY, None)
        n, tokens = verify_batch(torch.tensor([ids], dtype=torch.long).view(1, k), None,
                                 logits[None], GREEDY, None)
        assert (res.n_accepted, res.tokens) == (int(n[0]), tokens[0, : int(n[0]) + 1].tolist())
        assert res.n_accepted >= keep


def test_verify_is_verify_batch_on_one_row():
    g = torch.Generator().manual_seed(3)
    settings = [PLAIN, SamplingParams(), SamplingParams(temperature=0.6, top_k=3), GREEDY]
    for case in range(60):
        k, V = case % 5, 8
        params = settings[case % 4]
        logits = 2 * torch.randn(k + 1, V, generator=g)
        ids = torch.randint(V, (k,), generator=g).tolist()
        q = torch.softmax(torch.randn(k, V, generator=g), -1) if case % 3 else None
        res = verify(ids, q, logits, params, make_generator(case))
        n, tokens = verify_batch(torch.tensor([ids], dtype=torch.long),
                                 None if q is None else q[None], logits[None], params,
                                 make_generator(case))
        assert res.n_accepted == int(n[0]) and len(res.tokens) == res.n_accepted + 1
        assert res.tokens == tokens[0, : res.n_accepted + 1].tolist()
        assert res.tokens[: res.n_accepted] == ids[: res.n_accepted]
        assert (tokens[0, res.n_accepted + 1 :] == -1).all()


# -- sampled: the output distribution ----------------------------------------------------------


def check(tokens: torch.Tensor, p: torch.Tensor) -> tuple[float, float, float]:
    """(TV distance, its bound, chi-square p-value) of the empirical distribution of tokens (n,)
    against p (V,); tokens where p is 0 must never occur.

    The bound: each frequency f_i has standard error s_i = sqrt(p_i (1 - p_i) / n), so
    E|f_i - p_i| <= s_i (Jensen) and E[TV] <= 0.5 * sum_i s_i. TV moves by at most 1/n per draw,
    so McDiarmid gives P(TV > E[TV] + t) <= exp(-2 n t^2); at 4x the mean bound t >= 1.5 *
    sum_i sqrt(p_i (1 - p_i) / n), so a false alarm has probability <= exp(-4.5 (sum_i
    sqrt(p_i (1 - p_i)))^2), about 1e-3 for these vocabularies whatever n is (a loose bound: TV
    is a sum of near-Gaussian terms whose real tail is far thinner). The seeds are fixed, so the
    outcome is deterministic; the margin is there so that a changed seed still passes.
    """
    n, V = tokens.numel(), p.numel()
    p = p.double()
    counts = torch.bincount(tokens, minlength=V).double()
    assert counts.numel() == V and counts[p == 0].sum() == 0, "emitted a token the target gives 0"
    tv = 0.5 * (counts / n - p).abs().sum().item()
    bound = 4 * 0.5 * (p * (1 - p) / n).sqrt().sum().item()
    support = p > 0
    expected = p[support] / p[support].sum() * n
    pvalue = scipy.stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue
    return tv, bound, pvalue


def assert_target_distribution(tokens: torch.Tensor, p: torch.Tensor) -> None:
    tv, bound, pvalue = check(tokens, p)
    assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f} (n={tokens.numel()})"
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2e} (n={tokens.numel()})"


def draw_drafts(q: torch.Tensor | None, fixed: list[int], B: int, seed: int) -> torch.Tensor:
    """(B, k) draft tokens: row i drawn from q[i] (a sampling proposer) or the fixed ids."""
    if q is None:
        return torch.tensor(fixed, dtype=torch.long).expand(B, -1).contiguous()
    g = torch.Generator().manual_seed(seed)
    cols = [torch.multinomial(q[i], B, replacement=True, generator=g) for i in range(len(q))]
    return torch.stack(cols, dim=1) if cols else torch.zeros(B, 0, dtype=torch.long)


def speculate(logits, q, params, B=200_000, seed=0, fixed=()):
    """B independent iterations of the real rule: (n_accepted (B,), tokens (B, k+1), drafts)."""
    draft = draw_drafts(q, list(fixed), B, seed)
    k = draft.shape[1]
    dq = None if q is None else q.expand(B, k, -1)
    n, tokens = verify_batch(draft, dq, logits.expand(B, k + 1, -1), params,
                             make_generator(seed + 1))
    return n, tokens, draft


# Each scenario: target logits (k+1, V), draft rows q (k, V) or None with fixed draft ids.
SCENARIOS = {
    # q has mass where p has none (tokens 3, 4) and none where p has most (token 0)
    "disjoint-support": dict(
        logits=log([[0.5, 0.3, 0.2, 0, 0], [0.1, 0.2, 0.3, 0.4, 0], [0, 0, 0.5, 0.25, 0.25],
                    [0.6, 0.1, 0.1, 0.1, 0.1]]),
        q=torch.tensor([[0.0, 0.5, 0.2, 0.2, 0.1], [0.3, 0.3, 0.0, 0.2, 0.2],
                        [0.4, 0.0, 0.3, 0.3, 0.0]])),
    # a deterministic proposer (n-gram): q is one-hot at the drafted ids
    "one-hot": dict(
        logits=log([[0.2, 0.5, 0.2, 0.1, 0], [0.3, 0.1, 0.6, 0, 0], [0.7, 0.1, 0.1, 0.05, 0.05],
                    [0.25, 0.25, 0.25, 0.25, 0]]),
        q=None, fixed=[1, 2, 0]),
    # q very different from p: the draft likes what the target nearly never picks
    "opposite": dict(
        logits=log([[0.85, 0.1, 0.04, 0.01], [0.7, 0.2, 0.05, 0.05], [0.25, 0.25, 0.25, 0.25]]),
        q=torch.tensor([[0.01, 0.04, 0.15, 0.8], [0.05, 0.05, 0.1, 0.8]])),
    # q == p: every draft token is accepted, the bonus is drawn from the last row
    "identical": dict(
        logits=log([[0.4, 0.3, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]),
        q=logits_to_probs(log([[0.4, 0.3, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1]]), PLAIN)),
    # an empty draft is plain sampling from row 0
    "empty-draft": dict(logits=log([[0.1, 0.2, 0.3, 0.4]]), q=torch.zeros(0, 4)),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_emitted_position_has_the_target_distribution(name):
    sc = SCENARIOS[name]
    logits, q = sc["logits"], sc["q"]
    n, tokens, _ = speculate(logits, q, PLAIN, fixed=sc.get("fixed", ()))
    p = logits_to_probs(logits, PLAIN)
    k = logits.shape[0] - 1
    assert (tokens[:, 0] >= 0).all() and ((tokens >= 0).sum(1) == n + 1).all()
    # position i is emitted when the first i draft tokens were accepted; it then follows p_i
    checked = 0
    for i in range(k + 1):
        reached = n >= i
        if int(reached.sum()) >= 10_000:
            assert_target_distribution(tokens[reached, i], p[i])
            checked += 1
    assert checked >= min(2, k + 1)
    if name == "identical":
        assert (n == k).all()


def test_filtered_sampling_keeps_the_filtered_target_distribution():
    # target row 0 by hand: top-k 4 -> [.5 .2 .15 .1] / .95 (cum .526 .737 .895); top-p 0.85
    # keeps 3; min-p 0.1 keeps all three; T = 0.7 -> weights p^(1/0.7)
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.85, min_p=0.1)
    target = log([[0.5, 0.2, 0.15, 0.1, 0.05, 0.0], [0.05, 0.1, 0.15, 0.2, 0.5, 0.0],
                  [0.3, 0.3, 0.2, 0.1, 0.05, 0.05]])
    w = torch.tensor([0.5, 0.2, 0.15]) ** (1 / 0.7)
    p = logits_to_probs(target, params)
    torch.testing.assert_close(p[0], torch.cat([w / w.sum(), torch.zeros(3)]))
    # the draft is a different model under the same settings, so its q has its own zeros
    draft_logits = log([[0.2, 0.2, 0.1, 0.1, 0.1, 0.3], [0.3, 0.3, 0.2, 0.1, 0.05, 0.05]])
    q = logits_to_probs(draft_logits, params)
    n, tokens, _ = speculate(target, q, params, seed=10)
    assert_target_distribution(tokens[:, 0], p[0])
    assert_target_distribution(tokens[n >= 1, 1], p[1])
    assert_target_distribution(tokens[n >= 2, 2], p[2])


def test_the_check_catches_wrong_acceptance_rules():
    """The statistical check has power: two plausible mistakes fail it by a wide margin."""
    sc = SCENARIOS["disjoint-support"]
    logits, q = sc["logits"], sc["q"]
    p0 = logits_to_probs(logits, PLAIN)[0]
    n, tokens, draft = speculate(logits, q, PLAIN, seed=20)
    _, bound, _ = check(tokens[:, 0], p0)
    # 1. accept every draft token: the output is the draft's distribution
    #    (q has mass on tokens p gives 0, so compare on frequencies directly)
    freq = torch.bincount(draft[:, 0], minlength=5).double() / len(draft)
    assert 0.5 * (freq - p0.double()).abs().sum() > 10 * bound
    # 2. the right acceptance but recovering from p instead of max(p - q, 0)
    wrong = torch.where(n >= 1, draft[:, 0],
                        torch.multinomial(p0, len(n), replacement=True,
                                          generator=torch.Generator().manual_seed(21)))
    tv, bound, pvalue = check(wrong, p0)
    assert tv > 10 * bound and pvalue < 1e-10


def test_public_verify_in_a_loop_keeps_the_target_distribution():
    sc = SCENARIOS["disjoint-support"]
    logits, q = sc["logits"], sc["q"]
    p0 = logits_to_probs(logits, PLAIN)[0]
    draft = draw_drafts(q, [], 3000, seed=30).tolist()
    gen = make_generator(31)
    first = torch.tensor([verify(ids, q, logits, PLAIN, gen).tokens[0] for ids in draft])
    assert_target_distribution(first, p0)
    # at this n the bound is ~0.05 while the accept-everything rule would be off by 0.5
