"""The replicas' routing rule (tandem/cluster/affinity.py) on its own, no Ray: the longest
cached prefix in tokens wins, unless its replica's queue is much longer; a session sticks and
moves when its replica is gone; two random choices otherwise; the table stays bounded."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tandem.cluster.affinity import BLOCK, Affinity, Route, block_keys


def route(tokens: list[int], session: str | None = None) -> Route:
    return Route(session, block_keys(tokens))


def test_block_keys_are_chained_whole_blocks():
    a = list(range(40))
    assert len(block_keys(a)) == 40 // BLOCK
    b = [99, *a[1:]]  # a different first token changes every key after it
    assert set(block_keys(a)).isdisjoint(block_keys(b))
    assert block_keys(a + [1, 2, 3])[:2] == block_keys(a)[:2]
    assert block_keys(a[:BLOCK - 1]) == []


def test_the_longest_prefix_wins():
    aff = Affinity(rng=random.Random(0))
    system = list(range(2 * BLOCK))
    aff.record("a", route(system))  # a holds the system prompt
    aff.record("b", route(system + list(range(100, 100 + 2 * BLOCK))))  # b, a conversation too
    idle = Counter()
    turn2 = system + list(range(100, 100 + 3 * BLOCK))
    assert aff.choose(["a", "b"], idle.__getitem__, route(turn2))[0] == "b"
    assert aff.matched("b", route(turn2)) == 4 * BLOCK
    assert aff.matched("a", route(turn2)) == 2 * BLOCK
    other = system + list(range(500, 500 + BLOCK))  # the system prompt only: a or b, either
    assert {aff.choose(["a", "b"], idle.__getitem__, route(other))[0] for _ in range(20)} \
        == {"a", "b"}


def test_a_much_longer_queue_gives_the_prefix_up():
    aff = Affinity(slack=2, rng=random.Random(0))
    prompt = list(range(3 * BLOCK))
    aff.record("a", route(prompt))
    assert aff.choose(["a", "b"], Counter(a=2).__getitem__, route(prompt))[0] == "a"
    assert aff.choose(["a", "b"], Counter(a=3).__getitem__, route(prompt))[0] == "b"


def test_a_session_sticks_and_moves_when_its_replica_is_gone():
    aff = Affinity(rng=random.Random(1))
    idle = Counter()
    first = aff.choose(["a", "b", "c"], idle.__getitem__, route([1, 2], "s"))[0]
    aff.record(first, route([1, 2], "s"))
    busy = Counter({first: 50})  # a session sticks even to a busy replica
    for k in range(10):
        assert aff.choose(["a", "b", "c"], busy.__getitem__,
                          route(list(range(k, k + 40)), "s"))[0] == first
    rest = [r for r in ("a", "b", "c") if r != first]
    moved = aff.choose(rest, idle.__getitem__, route([1, 2], "s"))[0]
    assert moved in rest


def test_two_choices_prefer_the_shorter_queue_and_every_replica_is_offered():
    aff = Affinity(rng=random.Random(2))
    queue = Counter(a=5, b=0, c=5, d=5)
    picks = Counter(aff.choose("abcd", queue.__getitem__, None)[0] for _ in range(400))
    # b is picked whenever it is one of the two drawn: 1 - (3/4 * 2/3) = 1/2 of the time
    assert 150 < picks["b"] < 250
    order = aff.choose("abcd", queue.__getitem__, None)
    assert sorted(order) == list("abcd") and len(order) == 4


def test_the_table_is_bounded():
    aff = Affinity(max_keys=100, max_sessions=10)
    for i in range(50):
        aff.record("a", route([i] * (10 * BLOCK), f"s{i}"))
    assert len(aff.holders) == 100 and len(aff.sessions) == 10
    assert aff.matched("a", route([49] * (10 * BLOCK))) == 10 * BLOCK
    assert aff.matched("a", route([0] * (10 * BLOCK))) == 0  # the oldest dropped


def test_a_shared_head_alone_does_not_make_a_request_wait():
    """Prompts that share only a system prompt spread over idle replicas; a conversation's
    next turn (most of its prompt held) still waits up to the slack for its replica."""
    aff = Affinity(slack=2, rng=random.Random(0))
    system = list(range(BLOCK))
    aff.record("a", route(system + list(range(100, 100 + 3 * BLOCK))))
    new = route(system + list(range(500, 500 + 3 * BLOCK)))  # 1 of 4 blocks held by a
    assert aff.choose(["a", "b"], Counter(a=1).__getitem__, new)[0] == "b"
    assert aff.choose(["a", "b"], Counter().__getitem__, new)[0] == "a"  # no wait: a
    turn2 = route(system + list(range(100, 100 + 4 * BLOCK)))  # 4 of 5 blocks held by a
    assert aff.choose(["a", "b"], Counter(a=2).__getitem__, turn2)[0] == "a"


def test_the_router_switch_of_a_baseline(monkeypatch):
    """TANDEM_FLEET_ROUTER picks the prefix router (default) or Ray Serve's own (pow2); any other
    value is refused before anything starts."""
    from tandem.cluster.settings import router_choice
    from tandem.errors import TandemError

    monkeypatch.delenv("TANDEM_FLEET_ROUTER", raising=False)
    assert router_choice() == "prefix"
    monkeypatch.setenv("TANDEM_FLEET_ROUTER", "pow2")
    assert router_choice() == "pow2"
    monkeypatch.setenv("TANDEM_FLEET_ROUTER", "round-robin")
    with pytest.raises(TandemError, match="TANDEM_FLEET_ROUTER=round-robin"):
        router_choice()
