"""ngram-simple on hand-made token arrays, and against a brute-force reference."""

from __future__ import annotations

import random
import time

import pytest

from tandem.config import SpecConfig
from tandem.errors import TandemError
from tandem.speculative.ngram import NgramProposer
from tandem.speculative.proposer import Proposer


def _proposer(seq: list[int], ngram_min: int = 2, ngram_max: int = 4, m: int = 8) -> NgramProposer:
    p = NgramProposer(ngram_min, ngram_max, m)
    p.begin(seq)
    return p


def _reference(seq: list[int], ngram_min: int, ngram_max: int, m: int, k: int) -> list[int]:
    """Scan every n and every earlier start, newest first: the definition, without an index."""
    L = len(seq)
    for n in range(ngram_max, ngram_min - 1, -1):
        if n > L - 1:
            continue
        suffix = seq[L - n:]
        for p in range(L - n - 1, -1, -1):
            if seq[p: p + n] == suffix:
                return seq[p + n: p + n + min(m, k)]
    return []


def test_docstring_example():
    seq = [5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6, 7]
    p = _proposer(seq, 2, 3, 2)
    assert p.propose(4).ids == [1, 5]
    assert p.propose(1).ids == [1]
    draft = p.propose(4)
    assert draft.probs is None  # deterministic proposer


def test_is_a_proposer():
    assert isinstance(NgramProposer(), Proposer)


def test_longest_match_wins_over_shorter_more_recent_one():
    # (8, 1, 2) occurred at 0 followed by 50; (1, 2) alone occurred more recently followed by 60.
    seq = [8, 1, 2, 50, 9, 1, 2, 60, 7, 8, 1, 2]
    assert _proposer(seq, 2, 3, 1).propose(5).ids == [50]
    # With n capped at 2, only the shorter match exists and its most recent occurrence is used.
    assert _proposer(seq, 2, 2, 1).propose(5).ids == [60]


def test_most_recent_occurrence_is_used():
    seq = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2, 30, 31, 0, 1, 2]
    assert _proposer(seq, 2, 2, 3).propose(8).ids == [30, 31, 0]


def test_suffix_itself_does_not_count():
    seq = [4, 5, 6, 7]  # every suffix occurs only as itself
    assert _proposer(seq, 1, 4, 8).propose(8).ids == []


def test_overlapping_occurrence_counts():
    assert _proposer([3, 3, 3], 2, 2, 8).propose(8).ids == [3]
    # (1, 2, 1) at 0 overlaps the suffix at 2; it is followed by 2, 1.
    assert _proposer([1, 2, 1, 2, 1], 3, 3, 8).propose(8).ids == [2, 1]


def test_no_match_gives_empty_draft():
    assert _proposer([1, 2, 3, 4, 5, 1, 9], 2, 4, 8).propose(4).ids == []
    assert _proposer([], 1, 4, 8).propose(4).ids == []
    assert _proposer([7], 1, 4, 8).propose(4).ids == []


def test_respects_m_and_k():
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert _proposer(seq, 2, 2, 3).propose(10).ids == [3, 4, 5]
    assert _proposer(seq, 2, 2, 10).propose(2).ids == [3, 4]
    assert _proposer(seq, 2, 2, 10).propose(0).ids == []
    # The continuation stops at the end of the sequence.
    assert _proposer([1, 2, 3, 1, 2], 2, 2, 10).propose(10).ids == [3, 1, 2]


def test_ngram_min_and_max_bounds():
    seq = [9, 1, 2, 3, 0, 1]  # only a 1-gram (1) repeats
    assert _proposer(seq, 1, 3, 2).propose(2).ids == [2, 3]
    assert _proposer(seq, 2, 3, 2).propose(2).ids == []
    # A 5-token repeat is found only as its last ngram_max tokens; ngram_max=2 still matches.
    seq = [1, 2, 3, 4, 5, 77, 1, 2, 3, 4, 5]
    assert _proposer(seq, 2, 2, 1).propose(1).ids == [77]
    assert _proposer(seq, 6, 8, 1).propose(1).ids == []


def test_bad_sizes_are_refused_by_the_settings():
    with pytest.raises(TandemError, match="min"):
        SpecConfig(ngram_min=3, ngram_max=2)
    with pytest.raises(TandemError, match="min"):
        SpecConfig(ngram_min=0, ngram_max=2)
    with pytest.raises(TandemError, match="spec-ngram-size-m"):
        SpecConfig(ngram_m=0)


def test_begin_forgets_the_previous_sequence():
    p = _proposer([1, 2, 3, 1, 2], 2, 2, 4)
    assert p.propose(4).ids == [3, 1, 2]
    p.begin([1, 2])
    assert p.propose(4).ids == []


@pytest.mark.parametrize("seed", range(6))
def test_incremental_accept_matches_reference(seed):
    """Growing the sequence through accept() proposes what the brute-force definition does."""
    rng = random.Random(seed)
    ngram_min = rng.randint(1, 3)
    ngram_max = rng.randint(ngram_min, 5)
    m = rng.randint(1, 6)
    vocab = rng.choice([2, 3, 5])  # small vocabularies make repeats of every length common
    seq = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
    p = NgramProposer(ngram_min, ngram_max, m)
    p.begin(seq)
    for _ in range(60):
        k = rng.randint(0, 8)
        got = p.propose(k).ids
        assert got == _reference(seq, ngram_min, ngram_max, m, k), (seq, k)
        # Accept a prefix of the draft plus one "target" token, as the engine does.
        n_acc = rng.randint(0, len(got))
        new = got[:n_acc] + [rng.randrange(vocab)]
        p.accept(n_acc, new)
        seq = seq + new
        fresh = _proposer(seq, ngram_min, ngram_max, m)
        assert fresh.propose(k).ids == p.propose(k).ids


def test_fast_on_long_context():
    """A step must not rescan the context: 500 steps on 20k tokens in well under a second
    (a scan of 20k tokens per call costs ~10 ms in Python, i.e. ~5 s here)."""
    rng = random.Random(0)
    p = NgramProposer(2, 4, 8)
    p.begin([rng.randrange(1000) for _ in range(20000)])
    t0 = time.perf_counter()
    for _ in range(500):
        p.propose(8)
        p.accept(0, [rng.randrange(1000)])
    assert time.perf_counter() - t0 < 1.0
