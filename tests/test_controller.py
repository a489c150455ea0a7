"""The cost-aware controller: k from measured costs and acceptance, 0 when nothing pays."""

from __future__ import annotations

import pytest

from tandem.config import EngineConfig, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.speculative.controller import AcceptanceTracker, Controller, CostModel



def costs(verify: dict[int, float], draft: float | None = None) -> CostModel:
    c = CostModel()
    c.verify = dict(verify)
    c.draft_token = draft
    return c


def trained(rate: float, n: int = 400) -> AcceptanceTracker:
    """A tracker that saw drafts of 4 accepted token by token with probability `rate`."""
    import random

    rng = random.Random(0)
    t = AcceptanceTracker()
    for _ in range(n):
        a = 0
        while a < 4 and rng.random() < rate:
            a += 1
        t.update(4, a)
    return t


def test_docstring_example_draft_loses_ngram_wins():
    # plain 170 ms, 3 rows 250 ms, 5 rows 400 ms; acceptance 0.8 per position
    c = costs({1: 0.170, 3: 0.250, 5: 0.400}, draft=0.060)
    ctl = Controller(c, n_max=4, acceptance=trained(0.8))
    assert ctl.rate(4, 0.060) < ctl.rate(0, 0.060)  # four 60 ms draft tokens lose ...
    assert ctl.choose() == 1  # ... one still pays: 1.78 tokens in 60 + 210 ms
    c.draft_token = 0.150
    assert ctl.choose() == 0  # a draft token as dear as most of a plain step: never
    k = ctl.choose(draft_token=0.0)  # n-gram drafts are free: verifying a few rows pays
    assert k >= 2
    assert ctl.rate(k, 0.0) > ctl.rate(0, 0.0)


def test_flat_verify_cost_drafts_the_most_when_acceptance_is_high():
    c = costs({1: 0.1, 9: 0.1})  # GPU-like: 9 rows cost what 1 costs
    assert Controller(c, n_max=8, acceptance=trained(0.9)).choose(0.0) == 8


def test_low_acceptance_turns_speculation_off_but_probes_again():
    c = costs({1: 0.1, 2: 0.15, 5: 0.3})
    ctl = Controller(c, n_max=4, acceptance=trained(0.05), probe_every=5)
    picks = [ctl.choose(0.0) for _ in range(10)]
    assert picks.count(0) == 8 and all(k > 0 for k in (picks[4], picks[9]))


def test_break_even_is_not_worth_speculating():
    # n-gram draft (free), acceptance ~0.5: E[tokens | 1] ~ 1.5 for a 2-row pass
    acc = trained(0.5)
    e1 = acc.expected_tokens(1)
    plain = 0.100
    for gain, want in ((1.03, 0), (1.10, 1)):  # predicted speed-up of k = 1 over plain
        # verify costs with every k > 1 far too slow: only k = 1 competes with plain
        c = costs({1: plain, 2: e1 * plain / gain, 3: 10.0})
        assert Controller(c, n_max=2, acceptance=acc).choose(0.0) == want, gain


def test_acceptance_tracker_counts_positions_reached():
    t = AcceptanceTracker(prior_hits=0, prior_misses=0)
    t.update(4, 2)  # positions 0, 1 accepted, 2 rejected, 3 never reached
    t.update(4, 4)
    assert t.reached == [2, 2, 2, 1] and t.accepted == [2, 2, 1, 1]
    assert t.rate(2) == 0.5 and t.expected_tokens(2) == pytest.approx(3.0)


def test_interpolated_verify_cost():
    c = costs({1: 1.0, 5: 3.0})
    assert c.verify_time(3) == pytest.approx(2.0)
    assert c.verify_time(7) == pytest.approx(4.0)  # extrapolated from the last two
    assert costs({1: 1.0}).verify_time(2) is None


def test_auto_keeps_greedy_output_and_stops_drafting_when_it_cannot_pay(models):
    target, _, other = models
    base = Engine(target, None, EngineConfig(ctx_size=512), SpecConfig(types=["none"]))
    spec = SpecConfig(types=["auto"], n_max=4, p_min=0.0)
    assert spec.adaptive and spec.types == ["suffix", "draft-simple"]
    auto = Engine(target, other, EngineConfig(ctx_size=512), spec)
    sp = SamplingParams(temperature=0, n_predict=40, ignore_eos=True)
    want = base.generate(Request([5, 6, 7, 8], sp)).output
    seq = auto.generate(Request([5, 6, 7, 8], sp))
    assert seq.output == want
    assert len(auto.costs.verify) >= 2 and auto.costs.draft_token is not None  # calibrated
    # make drafting ruinously expensive: the controller must stop drafting with the model
    auto.costs.draft_token = 10.0
    auto.costs.verify = {r: 0.001 * r**3 for r in range(1, 10)}
    seq = auto.generate(Request([5, 6, 7, 8], sp))
    assert seq.output == want
    assert seq.stats.n_drafts <= 40 // 16 + 1  # only the periodic probes


def test_a_measurement_moves_every_row_count_and_its_own_the_most():
    c = costs({1: 0.1, 5: 0.3})
    c.record_verify(1, 0.2)  # the machine got twice as slow
    assert c.verify[1] == pytest.approx(0.8 * 0.1 + 0.2 * 0.2)  # its own: the full step
    assert c.verify[5] == pytest.approx(0.3 * (1 + 0.1 * (0.2 / 0.1 - 1)))  # the drift: half
    c.alpha = 0.0  # frozen costs stay frozen
    c.record_verify(5, 9.0)
    assert c.verify == pytest.approx({1: 0.12, 5: 0.33})


def test_unreached_positions_expect_what_the_position_before_them_got():
    t = AcceptanceTracker()
    for _ in range(100):
        t.update(1, 1)  # only ever drafted one token, always accepted
    assert t.rate(0) == pytest.approx(102 / 103)
    assert t.rate(3) == pytest.approx(t.rate(0))  # not the 2/3 of the bare prior
    # so with free n-gram drafts and 9 rows at twice the cost of 1, a long draft is chosen
    ctl = Controller(costs({1: 0.1, 9: 0.2}), n_max=8, acceptance=t)
    assert ctl.choose(0.0) == 8


def test_speculating_controller_probes_one_token_longer_now_and_then():
    c = costs({1: 0.1, 2: 0.12, 3: 0.5, 4: 0.6})  # rows 3 and 4 look dear (a slow spell)
    ctl = Controller(c, n_max=3, acceptance=trained(0.95), probe_every=4)
    picks = [ctl.choose(0.0) for _ in range(8)]
    assert picks == [1, 1, 1, 2, 1, 1, 1, 2]


def test_what_a_proposer_showed_carries_over_to_the_next_request(models):
    """Acceptance by position and by confidence is learned over every request: a new
    sequence's controllers start from what earlier ones measured, not from the priors."""
    target, same, _ = models
    e = Engine(target, same, EngineConfig(ctx_size=512),
               SpecConfig(types=["auto"], n_max=4, p_min=0.0))
    sp = SamplingParams(temperature=0, n_predict=24, ignore_eos=True)
    ids = [5, 6, 7, 8] * 6  # repetition: the suffix proposer has matches
    first = e.add(Request(list(ids), sp))
    while not first.done:
        e.step()
    e.release(first)
    acceptance, calibration = e.speculation.learned["suffix"]
    seen = sum(calibration.reached)
    assert seen > 0 and first.stats.n_drafted > 0
    second = e.add(Request(list(ids), sp))
    ctl = second.speculator.entries[0].controller
    # the request's own estimates start from every request's and learn into them
    assert ctl.calibration.parent is calibration and ctl.acceptance.parent is acceptance
    assert ctl.calibration.p(0.9) == pytest.approx(calibration.p(0.9))
    e.release(second)
    # the draft model's controller learns into draft_history, which also judges its catch-up
    assert e.speculation.learned["draft-simple"][0] is e.draft_history


def test_a_request_whose_drafts_fail_stops_drafting_though_others_did_well():
    """The shared calibration learned that confidence 0.65 is accepted 80% of the time (a text
    that copies its source); a request whose 0.65 drafts keep failing (a story) must stop
    verifying them after a few, not after the shared estimate has been dragged down."""
    from tandem.speculative.controller import Calibration

    shared = Calibration()
    for i in range(400):
        shared.update([0.65], 0 if i % 5 == 0 else 1)
    c = costs({1: 0.100, 2: 0.120, 3: 0.140})  # an extra row: a fifth of a pass
    story = Controller(c, n_max=2, calibration=Calibration(parent=shared))
    assert story.cut([0.65]) == 1  # believed at first: 0.8 beats the row's cost
    cuts = []
    for _ in range(10):
        k = story.cut([0.65])
        cuts.append(k)
        if k:
            story.update(k, 0, [0.65])
    assert cuts.count(1) <= 4 and cuts[-1] == 0
    assert shared.p(0.65) > 0.7  # every request's estimate moved little
    # the next request starts from the shared estimate again
    assert Controller(c, n_max=2, calibration=Calibration(parent=shared)).cut([0.65]) == 1
    # and a request that keeps confirming it keeps drafting
    copy = Controller(c, n_max=2, calibration=Calibration(parent=shared))
    for _ in range(10):
        assert copy.cut([0.65]) == 1
        copy.update(1, 1, [0.65])


def test_a_requests_acceptance_by_position_starts_from_every_requests():
    shared = trained(0.9)
    mine = AcceptanceTracker(parent=shared)
    assert mine.rates(4) == pytest.approx(shared.rates(4))
    for _ in range(6):  # this request's draft-model tokens keep failing at the first position
        mine.update(4, 0)
    assert mine.rate(0) < 0.4 < 0.85 < shared.rate(0)
    c = costs({1: 0.100, 2: 0.120, 3: 0.140, 5: 0.200}, draft=0.030)
    assert Controller(c, n_max=4, acceptance=shared).choose() > 0
    assert Controller(c, n_max=4, acceptance=mine).choose() == 0


def test_calibration_times_a_draft_token_without_the_first_calls_cost(models, monkeypatch):
    """A model's first call pays one-time costs; timed once, they became the draft's cost per
    token (three times the target's pass on the default pair), and auto never drafted."""
    import time

    target, draft, _ = models
    e = Engine(target, draft, EngineConfig(ctx_size=512),
               SpecConfig(types=["auto"], n_max=4, p_min=0.0))
    forward = type(draft.model).forward
    calls = []

    def slow_first(self, *args, **kwargs):
        if self is draft.model and kwargs.get("logits") != "none":
            calls.append(1)
            if len(calls) == 1:
                time.sleep(0.5)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(draft.model), "forward", slow_first)
    e.calibrate(0)
    assert len(calls) >= 2
    assert e.costs.draft_token < 0.25


def test_draft_calls_that_give_nothing_count_in_the_cost_per_drafted_token():
    """A draft model call cut to nothing (its first token not worth a row) cost a pass and
    gave nothing to verify. Counted per token verified, a draft of one token after two
    empty calls costs three passes, and the controller stops drafting where that loses."""
    c = costs({1: 0.050, 2: 0.058, 3: 0.066}, draft=0.020)
    ctl = Controller(c, n_max=2, acceptance=trained(0.85))
    assert ctl.choose() > 0  # a 20 ms token accepted 85% of the time pays
    c.alpha = 1.0  # the latest measurement, for the arithmetic
    c.record_draft(0, 0.020)
    c.record_draft(0, 0.020)
    c.record_draft(1, 0.020)
    assert c.draft_token == pytest.approx(0.060)
    assert Controller(c, n_max=2, acceptance=trained(0.85)).choose() == 0
    c.record_draft(2, 0.040)  # nothing pending: per token again
    assert c.draft_token == pytest.approx(0.020)


def test_a_short_catch_up_costs_a_draft_pass_and_does_not_set_the_rate():
    """A pass streams the draft's weights once however few rows it reads: reading 3 skipped
    tokens costs about one draft step, 3 ms where a 500-token prompt costs 1 ms per token. Such
    reads do not move the per-token rate (else a few of them priced a long catch-up at 3 ms a
    token and it never paid); their price is a draft step at least."""
    c = costs({1: 0.030}, draft=0.010)
    c.draft_step = 0.009
    c.alpha = 1.0
    c.record_draft_prefill(512, 0.512)
    assert c.draft_prefill_token == pytest.approx(0.001)
    c.record_draft_prefill(3, 0.009)
    assert c.draft_prefill_token == pytest.approx(0.001)
    assert c.draft_prefill(3) == pytest.approx(0.009)  # one step
    assert c.draft_prefill(400) == pytest.approx(0.400)
    c.record_draft_prefill(16, 0.032)
    assert c.draft_prefill_token == pytest.approx(0.002)
    assert CostModel().draft_prefill(10) is None  # unmeasured


def test_the_draft_drafts_on_while_one_more_pass_raises_the_steps_rate():
    """Controller.extend: after each drafted token, one more pass of the draft model is paid
    only if some continuation raises the step's expected tokens per second (the drafted
    tokens at their calibrated confidences, the rest as likely as the last). Costs of
    this machine's 1.5B target and 0.5B draft: 32 ms a plain pass, 11 ms a draft pass."""
    c = costs({1: 0.032, 2: 0.0334, 3: 0.0358, 4: 0.040, 5: 0.0458})
    c.draft_step = 0.011
    ctl = Controller(c, n_max=4)  # uncalibrated: a confidence is taken at its word
    assert ctl.extend([0.95])  # 1.95 tokens in 44 ms; a second at .90 gives 2.85 in 58 ms
    assert ctl.extend([0.95, 0.95])
    assert not ctl.extend([0.95, 0.9, 0.9])  # a fourth at .69 (4.27 in 90 ms) lowers 49 tok/s
    assert not ctl.extend([0.3])  # a second token at .09 adds 11 + 2.4 ms for 0.09 tokens
    assert not ctl.extend([0.9, 0.9, 0.9, 0.9])  # n_max drafted
    c.draft_step = 0.030  # a draft pass nearly as dear as the target's: no token pays it
    assert not ctl.extend([0.95])
    # what the target accepted moves it: a draft whose .95 tokens keep failing stops
    for _ in range(40):
        ctl.calibration.update([0.95, 0.95], 0)
    c.draft_step = 0.011
    assert not ctl.extend([0.95])
    assert Controller(costs({1: 0.032}), n_max=4).extend([0.5])  # unmeasured: draft, measure


def test_a_draft_pass_that_gets_slower_is_priced_as_it_is_now():
    """The passes of draft calls move the step's cost (CostModel.record_draft), so a machine
    that slows down (another process on a core) makes the draft stop sooner."""
    c = costs({1: 0.032, 2: 0.0334, 3: 0.0358, 4: 0.040, 5: 0.0458})
    c.draft_step = 0.011
    ctl = Controller(c, n_max=4)
    assert ctl.extend([0.95])
    for _ in range(20):
        c.record_draft(2, 0.070, passes=2)  # 35 ms a pass now
    assert c.draft_step == pytest.approx(0.035, rel=0.01)
    assert not ctl.extend([0.95])
    c.record_draft(0, 0.035)  # without passes (the engine's catch-up path): step kept
    assert c.draft_step == pytest.approx(0.035, rel=0.01)


def test_auto_verifies_the_draft_token_its_paid_pass_gave(models):
    """Under auto the draft model has no probability floor: the pass that gives a token's
    probability is paid before it is seen, and verifying that token costs one row. A call
    that drafts one token makes one pass and proposes it, however unsure; a fixed floor
    (llama.cpp's p_min, which auto used at 0.75) threw such passes away."""
    from tandem.models.decoder import KVCache
    from tandem.speculative.draft import DraftModelProposer

    target, same, _ = models
    assert SpecConfig(types=["auto"]).draft_p_min == 0.0
    assert SpecConfig(types=["auto"], p_min=0.6).draft_p_min == 0.6  # given: kept
    ids = [3, 17, 9, 40, 3, 17]
    p = DraftModelProposer(same.model, KVCache(same.args, 1, 128, same.dtype), 0,
                           SamplingParams(temperature=0.0), None, 4, 0, SpecConfig(
                               types=["auto"]).draft_p_min, lazy=False)
    p.begin(list(ids))
    asked: list[list[float]] = []

    def extend(conf):
        asked.append(list(conf))
        return len(conf) < 3

    d = p.propose(4, extend)
    assert len(d.ids) == 3 and asked == [d.conf[:1], d.conf[:2], d.conf]
    assert p.cache.length(0) == len(ids) + 2  # 3 passes: the last token is not fed yet
    p.accept(0, [5])
    one = p.propose(4, lambda conf: False)
    assert len(one.ids) == 1  # one pass, its token proposed, whatever its probability
    floor = DraftModelProposer(same.model, KVCache(same.args, 1, 128, same.dtype), 0,
                               SamplingParams(temperature=0.0), None, 4, 0, one.conf[0] + 0.01)
    floor.begin(list(ids))
    floor.accept(0, [5])
    assert floor.propose(4).ids == []  # an explicit floor above it: the pass thrown away
