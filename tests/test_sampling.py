"""The sampler chain on hand-made logits, and reproducible draws."""

import math

import pytest
import torch

from tandem.config import SamplingParams
from tandem.errors import TandemError
from tandem.sampling import greedy, logits_to_probs, make_generator, sample, sample_rows


# probabilities 0.5, 0.2, 0.15, 0.1, 0.05 at temperature 1
P5 = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
LOGITS5 = P5.log()[None]  # (1, 5)


def params(**kw) -> SamplingParams:
    """Every filter off and temperature 1 unless given."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    return SamplingParams(**(base | kw))


def kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs[0] > 0).flatten().tolist()


def test_no_filters_is_plain_softmax():
    probs = logits_to_probs(LOGITS5, params())
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs[0], P5)


def test_input_logits_are_not_modified():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, 1.2]])
    before = logits.clone()
    for p in (params(), params(top_k=3, top_p=0.5, min_p=0.2, temperature=0.5), params(top_p=0.5),
              params(temperature=0)):
        logits_to_probs(logits, p)
    assert torch.equal(logits, before)


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, 1.2]])
    probs = logits_to_probs(logits, params(top_k=3))
    assert kept(probs) == [1, 3, 5]
    torch.testing.assert_close(probs[0, [1, 3, 5]], torch.softmax(logits[0, [1, 3, 5]], -1))


def test_top_k_larger_than_vocab_keeps_everything():
    torch.testing.assert_close(logits_to_probs(LOGITS5, params(top_k=100))[0], P5)


@pytest.mark.parametrize("top_p, n_kept", [(0.6, 2), (0.8, 3), (0.86, 4), (0.99, 5), (0.3, 1)])
def test_top_p_keeps_the_minimal_nucleus(top_p, n_kept):
    # cumulative: 0.5, 0.7, 0.85, 0.95, 1.0 -> the first prefix reaching top_p
    probs = logits_to_probs(LOGITS5, params(top_p=top_p))
    assert kept(probs) == list(range(n_kept))
    torch.testing.assert_close(probs[0, :n_kept], P5[:n_kept] / P5[:n_kept].sum())


def test_top_p_zero_still_keeps_one_token():
    probs = logits_to_probs(LOGITS5, params(top_p=0.0))
    assert kept(probs) == [0]


def test_min_p_threshold_is_relative_to_the_top_token():
    # min_p 0.35 -> threshold 0.175: keeps 0.5 and 0.2; min_p 0.25 -> 0.125: also keeps 0.15
    assert kept(logits_to_probs(LOGITS5, params(min_p=0.35))) == [0, 1]
    assert kept(logits_to_probs(LOGITS5, params(min_p=0.25))) == [0, 1, 2]
    torch.testing.assert_close(logits_to_probs(LOGITS5, params(min_p=0.35))[0, :2],
                               torch.tensor([0.5, 0.2]) / 0.7)


@pytest.mark.parametrize("temperature, power", [(0.5, 2.0), (2.0, 0.5), (0.25, 4.0)])
def test_temperature_sharpens_and_flattens(temperature, power):
    # softmax(log p / T) = p^(1/T) / sum
    probs = logits_to_probs(LOGITS5, params(temperature=temperature))[0]
    expected = P5**power / (P5**power).sum()
    torch.testing.assert_close(probs, expected)
    entropy = -(probs * probs.log()).sum()
    base = -(P5 * P5.log()).sum()
    assert (entropy < base) if temperature < 1 else (entropy > base)


def test_filters_see_temperature_one_probabilities():
    # llama.cpp's order: top-p before temperature. At T=1 the 0.6 nucleus is tokens {0, 1};
    # had the temperature (0.25) come first, token 0 alone (0.97 after sharpening) would pass.
    probs = logits_to_probs(LOGITS5, params(top_p=0.6, temperature=0.25))[0]
    assert kept(probs[None]) == [0, 1]
    torch.testing.assert_close(probs[:2], torch.tensor([0.5**4, 0.2**4]) / (0.5**4 + 0.2**4))


def test_whole_chain_on_a_worked_example():
    # top-k 4 -> [.5 .2 .15 .1] / .95; top-p 0.8 -> cumulative .526 .737 .895: keep 3;
    # min-p 0.35 keeps p >= 0.35 p_max: 0.2/0.5 = 0.4 stays, 0.15/0.5 = 0.3 goes; T=0.5 squares
    probs = logits_to_probs(LOGITS5, params(top_k=4, top_p=0.8, min_p=0.35, temperature=0.5))
    expected = torch.tensor([0.25, 0.04, 0.0, 0.0, 0.0]) / 0.29
    torch.testing.assert_close(probs[0], expected)


def test_module_doc_example():
    probs = logits_to_probs(LOGITS5, params(top_p=0.6, temperature=2.0))[0]
    torch.testing.assert_close(probs, torch.tensor([0.6126, 0.3874, 0, 0, 0]), atol=1e-4, rtol=0)


def test_rows_are_filtered_independently():
    logits = torch.stack([P5.log(), P5.flip(0).log()])  # (2, 5)
    probs = logits_to_probs(logits, params(top_k=2))
    assert kept(probs[:1]) == [0, 1] and kept(probs[1:]) == [3, 4]
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))


@pytest.mark.parametrize("p", [params(temperature=0.0), params(top_k=1, temperature=0.8),
                               SamplingParams(temperature=-1.0)])
def test_greedy_is_one_hot_at_argmax(p):
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0], [5.0, 0.0, 0.0, 4.9]])
    probs = logits_to_probs(logits, p)
    torch.testing.assert_close(probs, torch.tensor([[0.0, 1, 0, 0], [1.0, 0, 0, 0]]))
    assert greedy(logits[0]) == 1 and greedy(logits[1]) == 0


def test_bfloat16_logits_give_float32_probs():
    probs = logits_to_probs(LOGITS5.bfloat16(), params())
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs[0], P5, atol=5e-3, rtol=0)


def draws(seed: int, n: int = 64) -> list[int]:
    gen = make_generator(seed)
    probs = logits_to_probs(torch.randn(1, 50, generator=torch.Generator().manual_seed(0)),
                            SamplingParams())[0]
    return [sample(probs, gen) for _ in range(n)]


def test_same_seed_same_tokens_and_different_seeds_differ():
    assert draws(42) == draws(42)
    assert draws(42) != draws(43)


def test_random_seed_is_recorded_and_replays():
    gen = make_generator(-1)
    seed = gen.initial_seed()
    assert 0 <= seed < 2**32
    probs = torch.full((20,), 0.05)
    first = [sample(probs, gen) for _ in range(32)]
    replay = make_generator(seed)
    assert [sample(probs, replay) for _ in range(32)] == first


def test_two_random_seeds_differ():
    assert make_generator(-1).initial_seed() != make_generator(-1).initial_seed()


def test_seed_out_of_range_is_a_clear_error():
    with pytest.raises(TandemError, match="seed must be < 2\\*\\*64"):
        make_generator(2**64)


def test_sample_never_picks_zero_probability_and_matches_frequencies():
    w = torch.tensor([0.0, 0.3, 0.0, 0.6, 0.1, 0.0])  # unnormalized weights are fine too
    n = 40_000
    gen = make_generator(7)
    tokens = sample_rows((2 * w).expand(n, -1), gen)  # (n,)
    freq = torch.bincount(tokens, minlength=6).float() / n
    assert freq[[0, 2, 5]].sum() == 0
    # 5 standard errors of a frequency near 0.5 with n = 40k is 0.0125
    assert (freq - w).abs().max() < 0.0125


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-24])
def test_extreme_uniform_draws_never_pick_a_zero_weight(monkeypatch, u):
    # the ends of torch.rand's [0, 1) range land on the first / last positive weight
    rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: torch.full_like(rand(*a, **kw), u))
    w = torch.tensor([0.0, 0.0, 0.3, 0.0, 0.7, 0.0])
    assert sample(w, make_generator(0)) == (4 if u == 0.0 else 2)


def test_sample_rows_draws_one_token_per_row_of_any_batch_shape():
    w = torch.zeros(3, 4, 10)
    w[..., 7] = 1.0
    w[1, 2] = 0.0
    w[1, 2, 3] = 5.0
    out = sample_rows(w, make_generator(0))
    assert out.shape == (3, 4)
    expected = torch.full((3, 4), 7)
    expected[1, 2] = 3
    assert torch.equal(out, expected)


def test_sampling_follows_temperature_on_average():
    # at T=0.5 token 0 has 0.25/0.325 ~ 0.77 vs 0.5 at T=1: a user sees sharper output
    gen = make_generator(3)
    probs = logits_to_probs(LOGITS5, params(temperature=0.5))[0]
    tokens = [sample(probs, gen) for _ in range(2000)]
    share = tokens.count(0) / len(tokens)
    expected = 0.25 / sum(p**2 for p in P5.tolist())
    assert math.isclose(share, expected, abs_tol=0.04)


@pytest.mark.parametrize("temperature", [1e6, 1e30, 5e307, 1.7e308])
def test_huge_temperatures_sample_the_candidates_uniformly(temperature):
    """Found by fuzzing the server: 5e307 became inf in float32, every probability NaN, and
    the draw a token id past the vocabulary. A temperature beyond float32's range samples as
    the highest one it can: the candidates (top-k 3 here) equally likely, the rest never."""
    probs = logits_to_probs(LOGITS5, params(temperature=temperature, top_k=3))
    torch.testing.assert_close(probs[0], torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]))
    draws = {sample(probs[0], make_generator(s)) for s in range(64)}
    assert draws == {0, 1, 2}


@pytest.mark.parametrize("temperature", [1e-300, 1e-45, 1e-10])
def test_tiny_temperatures_keep_only_the_best_tokens(temperature):
    """Also from the fuzzer: logits / 1e-300 were +-inf and their softmax NaN. A tiny
    temperature picks among the tokens tied for the best logit."""
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0]])
    probs = logits_to_probs(logits, params(temperature=temperature))
    torch.testing.assert_close(probs[0], torch.tensor([0.0, 0.5, 0.5, 0.0]))


def test_infinite_and_huge_logit_biases_stay_finite():
    from tandem.grammar import BIAS_LIMIT, bias_vector

    v = bias_vector({0: math.inf, 1: -math.inf, 2: 1e300, 3: -1e300, 4: -5.0}, 6)
    assert v.tolist() == [BIAS_LIMIT, -math.inf, BIAS_LIMIT, -BIAS_LIMIT, -5.0, 0.0]
    probs = logits_to_probs(LOGITS5.repeat(1, 2)[:, :6] + v, params())
    assert torch.isfinite(probs).all() and probs[0, 0] == probs[0, 2] == 0.5
