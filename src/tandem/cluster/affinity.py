"""Which replica a request goes to: the one holding its longest cached prefix, a session's own,
or the shorter queue of two (no Ray here: router.py applies this inside Ray Serve).

The problem: a replica reuses the prompt prefix it already holds (its slots' KV cache,
--cache-ram), and its suffix pool holds the answers it gave. A second turn sent elsewhere
recomputes the whole conversation. But a replica whose queue is long makes the turn wait.

The rule, for each request:
  1. It names a session (an `x-session` header, or llama.cpp's `id_slot`: one session for
     every slot): the replica the session was first sent to, while it lives.
  2. Its prompt shares a prefix with prompts sent before: among the replicas holding the
     longest such prefix (counted in tokens, BLOCK at a time), the one with the shortest
     queue, unless that queue is more than `slack` requests longer than the fleet's shortest
     (no longer at all where the prefix is under HEAD_SHARE of the prompt: a shared head).
  3. Otherwise two replicas at random, the shorter queue of the two (power of two choices).
The others follow, shortest queue first, for when the first refuses (its queue full).

Prefixes are kept as chained block keys, as vLLM's and llm-d's prefix caches do:

    tokens  [t0 .. t15][t16 .. t31][t32 .. t40]      BLOCK = 16, the tail (9 tokens) not kept
    keys    k0 = h(0, t0..t15), k1 = h(k0, t16..t31)

k1 stands for the whole 32-token prefix, so "replica R holds k0 and k1" says R was sent a
prompt starting with those 32 tokens. A new prompt's match on R is its leading run of keys R
holds, times BLOCK. The table is what was sent, not what the replica still caches (it may
have evicted it): a belief, bounded to `max_keys` keys (least recently used dropped).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

BLOCK = 16
# a match shorter than this share of the prompt is a shared head (a system prompt): it is
# followed only to a replica with no longer a queue than the shortest (found measuring 2 x 1
# thread at concurrency 4: prompts that shared only Qwen's system prompt piled onto one replica
# while the other's CPU idled, 0.45x the throughput of one server of 2 threads)
HEAD_SHARE = 0.5


def block_keys(tokens: Sequence[int], block: int = BLOCK) -> list[int]:
    """The chained key of every whole block of `tokens` (a partial last block has none)."""
    keys, h = [], 0
    for i in range(0, len(tokens) - block + 1, block):
        h = hash((h, tuple(tokens[i:i + block])))
        keys.append(h)
    return keys


@dataclass(slots=True)
class Route:
    """What the ingress tells the router about a request: its session, its prompt's keys."""
    session: str | None = None
    keys: list[int] = field(default_factory=list)


class Affinity:
    """The table (block key -> replicas sent it; session -> replica) and the rule above."""

    def __init__(self, slack: int = 2, max_keys: int = 65536, max_sessions: int = 65536,
                 rng: random.Random | None = None) -> None:
        self.slack, self.max_keys, self.max_sessions = slack, max_keys, max_sessions
        self.holders: OrderedDict[int, set[str]] = OrderedDict()
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.rng = rng or random.Random()

    def choose(self, replicas: Sequence[str], queue: Callable[[str], int],
               route: Route | None) -> list[str]:
        """`replicas` in the order to try them; the first is the choice."""
        if not replicas:
            return []
        first = self._session(replicas, route) or self._prefix(replicas, queue, route) \
            or self._two_choices(replicas, queue)
        rest = sorted((r for r in replicas if r != first), key=queue)
        return [first, *rest]

    def matched(self, replica: str, route: Route) -> int:
        """Tokens of `route`'s prompt that `replica` was sent before (whole blocks)."""
        n = 0
        for key in route.keys:
            if replica not in self.holders.get(key, ()):
                break
            n += 1
        return n * BLOCK

    def record(self, replica: str, route: Route | None) -> None:
        """`replica` was sent this request: it now holds the prompt's blocks (and session)."""
        if route is None:
            return
        if route.session is not None:
            self.sessions[route.session] = replica
            self.sessions.move_to_end(route.session)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        for key in route.keys:
            self.holders.setdefault(key, set()).add(replica)
            self.holders.move_to_end(key)
        while len(self.holders) > self.max_keys:
            self.holders.popitem(last=False)

    def _session(self, replicas: Sequence[str], route: Route | None) -> str | None:
        if route is None or route.session is None:
            return None
        held = self.sessions.get(route.session)
        return held if held in replicas else None  # a replica gone: the session moves

    def _prefix(self, replicas: Sequence[str], queue: Callable[[str], int],
                route: Route | None) -> str | None:
        if route is None or not route.keys:
            return None
        best, n = set(replicas), 0
        for key in route.keys:  # narrow to the replicas holding each next block
            holding = best & self.holders.get(key, set())
            if not holding:
                break
            best, n = holding, n + 1
        if n == 0:
            return None  # no replica holds even the first block
        shortest = min(queue(r) for r in replicas)
        # a head most prompts share (a system prompt) saves little: it may not cost a wait
        slack = self.slack if n >= HEAD_SHARE * len(route.keys) else 0
        fit = [r for r in best if queue(r) - shortest <= slack]
        if not fit:
            return None  # the holders are busy: recomputing the prefix costs less
        low = min(queue(r) for r in fit)
        return self.rng.choice(sorted(r for r in fit if queue(r) == low))

    def _two_choices(self, replicas: Sequence[str], queue: Callable[[str], int]) -> str:
        pair = self.rng.sample(list(replicas), min(2, len(replicas)))
        return min(pair, key=queue)
