"""--spec-synth-len / --spec-synth-rates: llama-server's benchmarking mode, where drafted tokens
are kept at random at set rates instead of by the target (the output is then not valid). It
measures what speculation costs and gains at a known acceptance, whatever the proposer."""

from __future__ import annotations

import random

import pytest
import torch

from tandem.cli import build_parser
from tandem.config import SamplingParams, SpecConfig
from tandem.engine import Request
from tandem.errors import TandemError
from tandem.flags import spec_config
from tandem.server import envargs
from tandem.speculative.verify import verify_synthetic
from tests.test_engine import GREEDY, engine, random_prompts, run


@pytest.mark.parametrize("n_max,length", [(4, 1.0), (4, 2.5), (8, 4.0), (4, 5.0), (1, 1.5)])
def test_a_mean_length_gives_geometric_rates_as_llama_server(n_max, length):
    spec = SpecConfig(n_max=n_max, synth_len=length)
    rates = spec.synth
    assert len(rates) == n_max
    assert 1 + sum(rates) == pytest.approx(length, abs=1e-6)  # the mean tokens per step
    p = rates[0]
    assert rates == pytest.approx([p ** (i + 1) for i in range(n_max)])
    # given the tokens before it, each drafted token is kept with the same probability p
    assert spec.synth_probs == pytest.approx([p] * n_max)


def test_rates_become_conditional_probabilities():
    spec = SpecConfig(n_max=4, synth_rates="0.8, 0.4,0.1,0")
    assert spec.synth == [0.8, 0.4, 0.1, 0.0]
    assert spec.synth_probs == pytest.approx([0.8, 0.5, 0.25, 0.0])
    assert SpecConfig(n_max=3, synth_rates=[0.0, 0.0, 0.0]).synth_probs == [0.0, 0.0, 0.0]
    assert SpecConfig().synth is None and SpecConfig().synth_probs == []


@pytest.mark.parametrize("kw,message", [
    (dict(synth_len=2.0, synth_rates="0.5,0.5,0.5,0.5"), "mutually exclusive"),
    (dict(synth_rates="0.5,0.5"), "must have spec-draft-n-max = 4 values, got 2"),
    (dict(synth_rates="0.5,0.6,0.1,0"), "must not increase"),
    (dict(synth_rates="1.5,1,1,1"), "within [0, 1]"),
    (dict(synth_rates="nan,0,0,0"), "within [0, 1]"),
    (dict(synth_rates="0.5,x,0,0"), "comma-separated numbers"),
    (dict(synth_len=5.5), "within [1, 5]"),
    (dict(synth_len=0.5), "within [1, 5]"),
    (dict(synth_len=2.0, n_max=0), "spec-draft-n-max >= 1"),
])
def test_bad_settings_are_refused_naming_the_flag(kw, message):
    with pytest.raises(TandemError, match="spec-synth|spec-draft") as err:
        SpecConfig(**kw)
    assert message in str(err.value)


def test_flags_and_variables_reach_the_config():
    serve = build_parser().commands["serve"]
    a = serve.parse_args(["-md", "d.gguf", "--spec-draft-n-max", "3", "--spec-synth-len", "2"])
    spec = spec_config(a)
    assert spec.synth is not None and 1 + sum(spec.synth) == pytest.approx(2.0)
    assert "WARNING: synthetic acceptance" in spec.describe("d.gguf")
    words, used = envargs.env_argv(serve, [], {"LLAMA_ARG_SPEC_SYNTH_RATES": "1,0.5,0.25,0",
                                               "LLAMA_ARG_SPEC_TYPE": "draft-simple"})
    a = serve.parse_args([*words, "-md", "d.gguf"])
    assert spec_config(a).synth == [1.0, 0.5, 0.25, 0.0]


def test_one_draw_per_drafted_token_never_an_end_of_generation():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([7, 8, 9, 1]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0.0)
    # everything kept: the drafted tokens whatever the target says, then its bonus token
    res = verify_synthetic([3, 4, 5], logits, greedy, None, [1.0] * 3, random.Random(0), set())
    assert (res.n_accepted, res.tokens) == (3, [3, 4, 5, 1])
    # nothing kept: the target's own token at row 0
    res = verify_synthetic([3, 4, 5], logits, greedy, None, [0.0] * 3, random.Random(0), set())
    assert (res.n_accepted, res.tokens) == (0, [7])
    # a drafted end of generation is never kept: the target's token at its row instead
    res = verify_synthetic([3, 2, 5], logits, greedy, None, [1.0] * 3, random.Random(0), {2})
    assert (res.n_accepted, res.tokens) == (1, [3, 8])
    # the same seed, the same decisions
    probs = [0.7, 0.7, 0.7]
    a = [verify_synthetic([3, 4, 5], logits, greedy, None, probs, r, set()).n_accepted
         for r in [random.Random(11)] * 20]
    b = [verify_synthetic([3, 4, 5], logits, greedy, None, probs, r, set()).n_accepted
         for r in [random.Random(11)] * 20]
    assert a == b and len(set(a)) > 1


def test_rates_one_keep_every_draft_and_zero_keep_none(models):
    base = engine(models, "none")
    keep_all = engine(models, "draft-simple", "other", n_max=4, p_min=0.0,
                      synth_rates=[1.0] * 4)
    keep_none = engine(models, "draft-simple", "other", n_max=4, p_min=0.0,
                       synth_rates=[0.0] * 4)
    vocab = models[0].args.vocab_size
    changed = 0
    for ids in random_prompts(6, vocab, seed=5):
        want = run(base, ids, n_predict=20, ignore_eos=True, **GREEDY)
        seq = keep_all.generate(Request(ids, SamplingParams(n_predict=20, ignore_eos=True,
                                                            **GREEDY), cache_prompt=False))
        assert seq.stats.n_drafted > 0 and seq.stats.n_accepted == seq.stats.n_drafted
        changed += seq.output != want  # an unrelated draft's tokens, kept against the target
        seq = keep_none.generate(Request(ids, SamplingParams(n_predict=20, ignore_eos=True,
                                                             **GREEDY), cache_prompt=False))
        assert seq.stats.n_drafted > 0 and seq.stats.n_accepted == 0
        assert seq.output == want  # every draft rejected: the target's own text
    assert changed > 0


def test_the_measured_acceptance_follows_the_rates(models):
    """Drafts of 4 at rates p, p^2, p^3, p^4 keep sum(rates) tokens each on average."""
    rates = [0.5, 0.25, 0.125, 0.0625]
    e = engine(models, "draft-simple", "other", n_max=4, p_min=0.0, synth_rates=rates)
    drafts = kept = 0
    for i, ids in enumerate(random_prompts(8, models[0].args.vocab_size, seed=8)):
        seq = e.generate(Request(ids, SamplingParams(n_predict=60, ignore_eos=True, seed=i,
                                                     **GREEDY), cache_prompt=False))
        drafts += seq.stats.n_drafts
        kept += seq.stats.n_accepted
    assert drafts > 100
    # the mean of a count in 0..4 with standard deviation ~1, over > 100 drafts: within 0.25
    assert kept / drafts == pytest.approx(sum(rates), abs=0.25)


def test_a_seed_repeats_the_decisions_and_the_text(models):
    e = engine(models, "draft-simple", "other", n_max=4, p_min=0.0, synth_len=2.5)
    ids = random_prompts(1, models[0].args.vocab_size, seed=2)[0]
    sp = dict(n_predict=32, ignore_eos=True, temperature=0.7, top_k=5, seed=4242)
    runs = [e.generate(Request(ids, SamplingParams(**sp), cache_prompt=False)) for _ in range(2)]
    assert runs[0].output == runs[1].output
    assert [(r.stats.n_drafted, r.stats.n_accepted) for r in runs][0] == \
        (runs[1].stats.n_drafted, runs[1].stats.n_accepted)
    assert runs[0].stats.n_drafted > 0
