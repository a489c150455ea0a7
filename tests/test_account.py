"""A request's account under auto: a draft is verified only if losing it entirely would still
leave the request no more than RISK behind the target alone, by the measured costs."""

from __future__ import annotations

import random

import pytest

from tandem.config import EngineConfig, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.speculative.account import RISK, Account
from tandem.speculative.controller import CostModel


def frozen(prompt_token: float | None = 0.01) -> CostModel:
    c = CostModel(alpha=0.0)
    c.verify = {1: 0.1, 2: 0.12, 3: 0.14, 5: 0.2}
    c.prompt_token = prompt_token
    return c


def test_the_prompt_read_is_the_margin_of_the_first_drafts():
    # nothing read, nothing won: no draft may risk anything
    assert Account(frozen(), prompt_rows=0).affordable(4) == 0
    # 100 prompt rows = 1 s: 2 tokens (loss 0.04 s) fit 5% of 1.14 s, 3 (0.07 s) do not
    a = Account(frozen(), prompt_rows=100)
    assert a.affordable(4) == 2
    # the prompt cost is not measured yet: the account does not bind until it is
    assert Account(frozen(None), prompt_rows=100).affordable(4) == 4
    assert Account(frozen(None)).can_spend(10.0)
    # a 1000-row prompt allows the longest draft from the start
    assert Account(frozen(), prompt_rows=1000).affordable(4) == 4


def test_what_drafts_won_is_risked_again_and_losses_shrink_the_next_draft():
    a = Account(frozen(), prompt_rows=100)
    a.step(2, 3)  # 2 drafted, both kept: 3 tokens for 0.14 s instead of 0.3 s
    assert a.ahead == pytest.approx(0.16) and a.elapsed == pytest.approx(1.14)
    assert a.affordable(4) == 4
    for _ in range(4):
        a.step(2, 1)  # 2 drafted, none kept: 0.04 s lost each time
    assert a.ahead == pytest.approx(0.0) and a.elapsed == pytest.approx(1.7)
    assert a.affordable(4) == 3  # even again, 5% of the longer time: 3 tokens (0.07 s) fit
    a.step(0, 1)  # a plain step: no gain, no loss, more time
    assert a.ahead == pytest.approx(0.0) and a.elapsed == pytest.approx(1.8)
    # the draft model's seconds count as lost when nothing is kept
    assert a.affordable(2, per_token=0.1) == 0
    assert a.can_spend(0.05) and not a.can_spend(0.2)  # a catch-up on the prompt


def test_auto_never_falls_more_than_risk_behind_and_keeps_the_output(models):
    """Frozen costs under which drafts pay if they are right (a row costs a tenth of a pass)
    on prompts whose repetition the suffix proposer copies where the random model goes its
    own way: every step, the request's account stays within RISK of the time it ran, and the
    output is the target's."""
    target, _, other = models
    base = Engine(target, None, EngineConfig(ctx_size=512), SpecConfig(types=["none"]))
    auto = Engine(target, other, EngineConfig(ctx_size=512),
                  SpecConfig(types=["auto"], n_max=4, p_min=0.0))
    auto._calibrated = True
    c = auto.costs
    c.alpha = 0.0
    c.verify = {r: 0.1 + 0.01 * (r - 1) for r in range(1, 10)}
    c.draft_token, c.draft_prefill_token, c.prompt_token = 0.01, 0.001, 0.005
    rng = random.Random(7)
    vocab = target.args.vocab_size
    drafted = 0
    for _ in range(4):
        base_ids = [rng.randrange(vocab - 3) for _ in range(rng.randint(2, 6))]
        ids = base_ids * 8  # repetition: the suffix proposer drafts what may not follow
        sp = SamplingParams(temperature=0, n_predict=24, ignore_eos=True)
        seq = auto.add(Request(list(ids), sp, cache_prompt=False))
        while not seq.done:
            auto.step()
            a = seq.speculator.account
            assert a.ahead >= -RISK * a.elapsed - 1e-12, (a.ahead, a.elapsed)
        auto.release(seq)
        drafted += seq.stats.n_drafted
        assert seq.output == base.generate(Request(list(ids), sp, cache_prompt=False)).output
    assert drafted > 0  # it did draft, within the bound
