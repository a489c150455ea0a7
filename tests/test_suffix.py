"""The suffix proposer, its shared pool of earlier outputs, and drafts cut by calibrated
confidence."""

from __future__ import annotations

import random

import pytest

from tandem.speculative.controller import Calibration, Controller, CostModel
from tandem.speculative.proposer import Proposer
from tandem.speculative.suffix import SuffixIndex, SuffixPool, SuffixProposer, grow


def proposer(seq: list[int], n_max: int = 16, pool: SuffixPool | None = None,
             min_conf: float = 0.0) -> SuffixProposer:
    p = SuffixProposer(n_max, pool, min_conf=min_conf)
    p.begin(seq)
    return p


def test_docstring_example():
    seq = [4, 1, 2, 3, 7, 1, 2, 3, 7, 8, 1, 2, 3]
    d = proposer(seq).propose(2)
    # (1, 2, 3) was followed by 7 both times; then (1, 2, 3, 7) by 1 once and by 8 once:
    # the most recent (8) wins, with a lower confidence than the agreed 7
    assert d.ids == [7, 8]
    assert d.conf == pytest.approx([(2 + 3 / 5) / 3, (1 + 4 / 6) / 3])
    assert d.conf[0] > d.conf[1]
    assert isinstance(proposer(seq), Proposer)


def test_the_longest_match_wins_over_the_most_frequent_short_one():
    # "9 5" is followed by 1 three times, but the 6-token end "2 3 4 8 9 5" occurred once,
    # followed by 7: that occurrence is the one to copy
    seq = [9, 5, 1, 9, 5, 1, 9, 5, 1, 2, 3, 4, 8, 9, 5, 7, 6, 0, 2, 3, 4, 8, 9, 5]
    d = proposer(seq).propose(3)
    assert d.ids == [7, 6, 0]


def test_a_longer_match_is_more_confident_than_a_short_one():
    long_ctx = list(range(100, 130))
    a = proposer([*long_ctx, 1, 2, *long_ctx]).propose(1)  # a 30-token match, seen once
    b = proposer([5, 6, 1, 2, 7, 5, 6]).propose(1)  # a 2-token match, seen once
    assert a.ids == [1] and b.ids == [1]
    assert a.conf[0] > b.conf[0]


def test_a_repetition_continues_into_its_own_draft():
    d = proposer([3, 3, 3]).propose(5)
    assert d.ids == [3, 3, 3, 3, 3]
    d = proposer([1, 2, 1, 2, 1]).propose(4)
    assert d.ids == [2, 1, 2, 1]


def test_no_match_no_draft_and_k_caps_it():
    assert proposer([1, 2, 3, 4]).propose(4).ids == []
    assert proposer([]).propose(4).ids == []
    assert proposer([1, 2, 1, 2, 1]).propose(0).ids == []
    seq = [1, 2, 3, 4, 5, 6, 1, 2]
    assert proposer(seq).propose(2).ids == [3, 4]
    assert proposer(seq, n_max=1).propose(8).ids == [3]


def test_alone_it_stops_below_its_confidence_floor():
    seq = [4, 1, 2, 3, 7, 1, 2, 3, 7, 8, 1, 2, 3]
    assert proposer(seq, min_conf=0.7).propose(4).ids == [7]  # 0.87, then 0.56: cut


def test_index_agrees_with_a_brute_force_search():
    rng = random.Random(3)
    for _ in range(200):
        seq = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        idx = SuffixIndex(depth=4)
        idx.extend(seq)
        cands, length = idx.match(seq)
        # brute force: the longest m such that seq's last m tokens occur ending before some
        # earlier position i (i < len(seq)), and every such i
        best, want = 0, []
        for i in range(1, len(seq)):
            m = 0
            while m < i and seq[i - 1 - m] == seq[-1 - m]:
                m += 1
            if m > best:
                best, want = m, [i]
            elif m == best and m > 0:
                want.append(i)
        assert (length, cands) == (best, want), seq


def test_each_token_follows_what_the_matches_agree_on():
    tokens = [1, 2, 5, 1, 2, 5, 1, 2, 6]
    ids, conf = grow(tokens, [2, 5, 8], 2, 1)  # after (1, 2): 5, 5, 6
    assert ids == [5] and conf == pytest.approx([(2 + 0.5) / 4])


def test_outputs_of_earlier_requests_are_found_in_the_pool():
    pool = SuffixPool(max_tokens=1000)
    first = proposer([50, 51], pool=pool)
    first.accept(0, [10, 11, 12, 13, 14, 15, 16])  # the first request's output
    first.end()
    assert pool.docs == [[10, 11, 12, 13, 14, 15, 16]]
    second = proposer([60, 61, 10, 11, 12], pool=pool)  # never saw 13 itself
    assert second.propose(4).ids == [13, 14, 15, 16]
    # without the pool nothing is known
    assert proposer([60, 61, 10, 11, 12]).propose(4).ids == []


def test_the_pool_keeps_its_budget_and_evicts_the_least_recently_used():
    pool = SuffixPool(max_tokens=40)  # two generations of 20 tokens
    docs = [[100 * d + i for i in range(10)] for d in range(4)]
    for doc in docs:
        pool.add(doc)
    assert pool.size == 40 and pool.docs == docs
    # a draft from the oldest output makes it the most recently used: it is carried over
    ids, _, at = pool.propose([0, 1, 2], 3)
    assert ids == [3, 4, 5]
    pool.touch(at)
    assert pool.size <= 40 and docs[0] in pool.docs and docs[1] not in pool.docs
    pool.add([500 + i for i in range(10)])
    pool.add([600 + i for i in range(10)])
    assert pool.size <= 40
    assert docs[0] in pool.docs and docs[2] not in pool.docs and docs[3] not in pool.docs
    assert pool.propose([0, 1, 2], 3)[0] == [3, 4, 5]  # still found
    assert pool.propose([601, 602], 2)[0] == [603, 604]  # the newest too
    assert pool.propose([300, 301], 2)[0] == []  # evicted: never proposed again
    # an output over half the budget keeps its end
    pool.add(list(range(1000, 1030)))
    assert pool.docs[-1] == list(range(1010, 1030)) and pool.size <= 40


def test_the_pool_drops_a_generation_instead_of_rebuilding_its_index():
    pool = SuffixPool(max_tokens=200)
    for d in range(50):
        pool.add([1000 * d + i for i in range(10)])
        assert pool.size <= 200
    # every output within the last two generations is found, the oldest are gone
    assert pool.propose([49000, 49001], 3)[0] == [49002, 49003, 49004]
    assert pool.propose([40000, 40001], 3)[0] == [40002, 40003, 40004]
    assert pool.propose([0, 1], 3)[0] == []
    assert len(pool.old.index.tokens) <= 110 and len(pool.new.index.tokens) <= 110


def test_overconfident_proposers_are_calibrated_by_what_was_accepted():
    cal = Calibration()
    assert cal.p(0.95) == pytest.approx(0.95)  # believed until measured
    rng = random.Random(1)
    for _ in range(300):  # confidences of 0.95, but the target agrees one time in five
        k = 4
        n = 0
        while n < k and rng.random() < 0.2:
            n += 1
        cal.update([0.95] * k, n)
    assert cal.p(0.95) == pytest.approx(0.2, abs=0.05)
    # a bin never measured starts from its confidence times the shared factor (~0.2 / 0.95)
    assert cal.p(0.35) == pytest.approx(0.35 * cal.scale)
    assert cal.scale == pytest.approx(0.2 / 0.95, abs=0.05)


def test_cut_verifies_the_prefix_that_pays():
    # free drafts; 2 rows cost 1.1 plain passes, every further row 0.5 more (this CPU's shape)
    costs = CostModel()
    costs.verify = {1: 0.10, 2: 0.11, 3: 0.16, 5: 0.26, 9: 0.46, 17: 0.86}
    ctl = Controller(costs, n_max=16)
    sure = [0.995] * 10
    # near-certain tokens: E[tokens] / t_verify peaks around 8 here (8.8 tokens for 4.6 passes)
    assert 7 <= ctl.cut(sure) <= 10
    cheap = CostModel()
    cheap.verify = {1: 0.10, 17: 0.12}  # a GPU: 17 rows cost what 1 costs
    assert Controller(cheap, n_max=16).cut(sure) == 10  # verify them all
    # two sure tokens, then guesses: only the sure part pays
    assert ctl.cut([0.99, 0.99, 0.15, 0.15, 0.15]) == 2
    # nothing that pays: 0, and a probe (1 token) only every probe_every steps, only while the
    # first token's confidence bin is still unmeasured
    ctl = Controller(costs, n_max=16, probe_every=4)
    picks = [ctl.cut([0.05, 0.05]) for _ in range(8)]
    assert picks == [0, 0, 0, 1, 0, 0, 0, 1]
    for _ in range(8):
        ctl.update(1, 0, [0.05])
    assert [ctl.cut([0.05, 0.05]) for _ in range(8)] == [0] * 8  # measured: no more probes


def test_a_slower_machine_keeps_the_same_choice():
    # every pass twice as slow (another process took a core): the ratios, and so the cut, hold
    fast = CostModel()
    fast.verify = {1: 0.10, 2: 0.13, 3: 0.18, 5: 0.30, 9: 0.50}
    slow = CostModel()
    slow.verify = {r: 2 * t for r, t in fast.verify.items()}
    for conf in ([0.9] * 8, [0.6] * 8, [0.99, 0.3, 0.3], [0.2] * 4):
        assert Controller(fast, n_max=8).cut(conf) == Controller(slow, n_max=8).cut(conf)


def test_a_proposer_overconfident_everywhere_is_corrected_everywhere():
    """Misses in some bins lower the estimate of bins not measured yet (the shared factor),
    before each bin has its own measurements."""
    cal = Calibration()
    for _ in range(10):
        cal.update([0.65], 0)  # tokens of confidence 0.65, never accepted
        cal.update([0.85], 0)
    assert cal.scale < 0.2
    assert cal.p(0.45) < 0.1  # a bin never measured: corrected by the shared factor
    assert cal.p(0.65) < 0.1
    fresh = Calibration()
    assert fresh.p(0.45) == pytest.approx(0.45)


def test_tokens_still_to_come_follow_the_earlier_answers_that_got_as_far():
    from tandem.speculative.speculator import Speculation

    s = Speculation(None, None, prefill_chunk=512)
    # nothing known: as many more as it has produced (the Copernican estimate)
    assert s.expected_remaining(0, 256) == 0
    assert s.expected_remaining(40, 256) == 40
    assert s.expected_remaining(200, 256) == 200
    assert s.expected_remaining(200, 56) == 56  # never more than the budget
    s.lengths.extend([10, 12, 14, 200, 220, 240])
    assert s.expected_remaining(0, 256) == 107  # median of all six lengths
    assert s.expected_remaining(20, 256) == 200  # past 20 tokens only the long ones count
    assert s.expected_remaining(20, 50) == 50  # never more than the budget
    assert s.expected_remaining(230, 256) == 230  # fewer than 3 got this far: Copernican
    assert s.expected_remaining(230, 100) == 100


def _pool_speculation(pool_doc: list[int]):
    from tandem.speculative.controller import CostModel
    from tandem.speculative.speculator import Speculation

    shared = Speculation(None, None, 64, pool_tokens=1000)
    shared.costs = CostModel()
    shared.costs.verify = {r: 0.1 + 0.01 * (r - 1) for r in range(1, 18)}  # rows are cheap
    shared.pool.add(pool_doc)
    return shared


def _start(shared, prompt):
    from tandem.config import SamplingParams, SpecConfig
    from tandem.speculative.stats import SpecStats

    spec = SpecConfig(types=["auto"], suffix_pool=1000).resolved(False)
    return shared.start(spec, 0, SamplingParams(temperature=0.0), None, prompt, SpecStats())


def test_pool_drafts_are_calibrated_apart_from_the_requests_own():
    """A match in another request's output says less than one in the request's own text: the
    pool's drafts that fail teach the pool's calibration, not the suffix proposer's own."""
    from tandem.speculative.suffix import OWN, POOL

    shared = _pool_speculation([10, 11, 12, 13, 14, 15, 16, 17])
    spec = _start(shared, [60, 61, 10, 11, 12])  # only the pool knows what followed 12
    d = spec.draft(8, 100)
    assert d.ids[:2] == [13, 14]
    spec.accept(d, 0, [99])  # the target disagreed
    pool_cal, own_cal = shared.learned[POOL][1], shared.learned[OWN][1]
    assert pool_cal.seen(d.conf[0]) > 0 and own_cal.seen(d.conf[0]) == 0


def test_a_fresh_pool_calibration_starts_from_what_the_own_drafts_showed():
    """Before the pool's drafts are measured, a pool draft is believed no more than a draft of
    the request's own text at the same confidence: where the own drafts keep failing (chatty
    text), a pool match of the same confidence is not verified on its raw confidence. The pool's
    own failures then teach the pool alone."""
    from tandem.speculative.suffix import OWN, POOL

    pool_doc = [20, 21, 22, 23, 24, 25, 26, 27]
    prompt = [60, 61, 20, 21, 22]  # only the pool knows what followed 22
    fresh = _pool_speculation(pool_doc)
    d = _start(fresh, prompt).draft(8, 100)
    assert d.ids[:2] == [23, 24]  # measured nothing yet: verified on its confidence
    conf = d.conf[0]

    shared = _pool_speculation(pool_doc)
    failed = 0
    for i in range(12):  # earlier requests' own drafts at this confidence failed
        own = _start(shared, [1, 2, 3, 50 + i, 1, 2, 3])
        od = own.draft(4, 100)
        if not od.ids:  # no longer worth verifying
            break
        assert od.ids[0] == 50 + i and od.conf[0] == conf and own.entries[0].used is own.entries[0].controller
        own.accept(od, 0, [99])
        failed += 1
    own_p = shared.learned[OWN][1].p(conf)
    assert failed >= 3 and own_p < 0.15 < conf
    spec = _start(shared, prompt)
    assert spec.entries[0].pool.calibration.p(conf) <= own_p + 1e-9
    assert spec.draft(8, 100).ids == []  # not worth a pass at what the own drafts showed
    before = shared.learned[OWN][1].p(conf)
    pool = shared.learned[POOL][1]
    pool.update([conf], 0)
    assert shared.learned[OWN][1].p(conf) == before  # the pool does not teach its prior


def test_the_draft_verified_is_the_one_its_calibration_says_pays_more():
    from tandem.speculative.controller import AcceptanceTracker, Calibration
    from tandem.speculative.suffix import OWN, POOL

    def trained(rate_hit: bool) -> Calibration:
        cal = Calibration()
        for _ in range(60):
            cal.update([0.7, 0.7, 0.7], 3 if rate_hit else 0)
        return cal

    # the request's own text continues (1, 2, 3) with 7; the pool's output with 8, 9 twice
    prompt = [1, 2, 3, 7, 5, 1, 2, 3]
    pool_doc = [1, 2, 3, 8, 9, 1, 2, 3, 8, 9]
    for good, first in ((OWN, 7), (POOL, 8)):
        shared = _pool_speculation(pool_doc)
        bad = POOL if good == OWN else OWN
        shared.learned[good] = (AcceptanceTracker(), trained(True))
        shared.learned[bad] = (AcceptanceTracker(), trained(False))
        d = _start(shared, prompt).draft(4, 100)
        assert d.ids and d.ids[0] == first, (good, d)


class _LazyDraft:
    """A costly proposer that reads the prompt lazily (the draft model's interface under auto):
    records when it was made to read it."""

    free, kind = False, "draft"

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.seen = 0
        self.read_at: int | None = None  # tokens generated when it caught up

    def begin(self, prompt_ids):
        self.tokens, self.seen = list(prompt_ids), 0

    def behind(self):
        return len(self.tokens) - self.seen

    def catch_up(self, limit=None):
        fed = self.behind() if limit is None else min(limit, self.behind())
        self.seen += fed
        return fed

    def propose(self, k, extend=None):
        from tandem.speculative.proposer import Draft

        return Draft([1] * k, None, [0.9] * k)

    def accept(self, n_accepted, new_ids):
        caught_up = self.behind() <= 2
        self.tokens += new_ids
        if caught_up:  # it read the draft's tokens: all but the target's own one
            self.seen = len(self.tokens) - 1

    def shift(self, keep, discard):
        pass

    def end(self):
        pass


def _lazy_speculator(lengths: list[int], tried: int = 50):
    from tandem.speculative.controller import CostModel
    from tandem.speculative.drafters import ModelDrafter
    from tandem.speculative.speculator import Speculation, Speculator
    from tandem.speculative.stats import SpecStats

    shared = Speculation(None, None, prefill_chunk=512)
    shared.costs = CostModel(verify={1: 0.100, 2: 0.110, 3: 0.120, 4: 0.130, 5: 0.140},
                             draft_token=0.005, draft_prefill_token=0.004)
    for _ in range(tried):  # the draft model's tokens were mostly accepted so far
        shared.draft_history.update(4, 4)
    shared.lengths.extend(lengths)
    proposer = _LazyDraft()
    proposer.begin(list(range(100, 300)))  # a 200-token prompt it has not read
    ctl = Controller(shared.costs, n_max=4, acceptance=shared.draft_history)
    return Speculator(shared, [ModelDrafter(proposer, ctl)], SpecStats()), proposer


def _generate(spec, proposer, n: int) -> None:
    while spec.produced < n:
        d = spec.draft(4, 256 - spec.produced)
        if proposer.read_at is None and proposer.behind() <= 2:
            proposer.read_at = spec.produced
        spec.accept(d, len(d.ids), d.ids + [7])


def test_a_fresh_server_bets_a_draft_models_catch_up_on_what_the_answer_has_shown():
    """With no earlier answers, reading a 200-token prompt into the draft model (0.8 s here)
    is not bet on the whole 256-token budget at the first token: an answer of a few tokens
    (a translation, a yes) would pay it and gain nothing. It is read once the answer has gone
    on long enough that as many more tokens would pay it back; after earlier long answers, at
    once."""
    fresh, p = _lazy_speculator([])
    _generate(fresh, p, 1)
    assert p.read_at is None and p.behind() > 100  # a short answer never paid the catch-up
    _generate(fresh, p, 60)
    assert p.read_at is not None and 5 <= p.read_at <= 30
    known, q = _lazy_speculator([240, 250, 256])  # earlier answers ran long
    _generate(known, q, 1)
    assert q.read_at == 0


def test_a_draft_model_never_tried_is_judged_hopefully_until_it_has_shown_its_acceptance(
        monkeypatch):
    """A draft model never read in has only its prior acceptance (2/3). On this machine's
    costs (a 32 ms target pass, 10.6 ms a draft pass, 2.34 ms a draft prompt token) that
    never pays a 200-token catch-up for 70 tokens to come, so the draft would never be tried
    and its real acceptance never learned. The catch-up is judged one standard deviation
    above the estimate: hopeful while nothing is known, the estimate itself once the draft
    has shown what it does, and a draft that keeps failing is not read in again."""
    from tandem.speculative import drafters
    from tandem.speculative.controller import CostModel

    def judge(tried: int, accepted: int) -> bool:
        spec, _ = _lazy_speculator([], tried=0)
        spec.shared.costs = CostModel(
            verify={1: 0.032, 2: 0.0334, 3: 0.0358, 4: 0.040, 5: 0.0458},
            draft_token=0.0106, draft_prefill_token=0.00234)
        for _ in range(tried):
            spec.shared.draft_history.update(4, accepted)
        return drafters.catch_up_pays(spec, 4, 200, 70)

    assert judge(0, 0)  # never tried: tried now
    assert not judge(300, 0)  # its tokens were refused: not read in again
    assert judge(300, 4)
    monkeypatch.setattr(drafters, "CATCH_UP_OPTIMISM", 0.0)
    assert not judge(0, 0)  # at the prior's mean it would never have been tried
    assert judge(300, 4)  # what it showed decides alike either way
