"""The suffix pool across replicas: each replica's finished answers reach the other replicas'
pools (`--spec-suffix-pool`), so a request that repeats an answer another replica gave is
drafted from it there too.

    engine thread                 report thread (replica.py)             board (board.py)
    SharedPool.add(answer) -> outbox ---- every 0.5 s: publish -----> ring of recent answers
    SharedPool.propose()  <- inbox  <---- the others' answers since --

The engine's thread only appends to and drains two bounded deques: nothing on the hot path
waits for Ray. The inbox is drained into the pool before the next draft (the pool is the engine
thread's alone). Memory: each pool keeps its budget (two generations, suffix.py), the deques
at most QUEUED answers each, the board at most its token budget.
"""

from __future__ import annotations

from collections import deque

from ..speculative.suffix import SuffixPool

QUEUED = 256  # answers waiting in each direction (older ones dropped)


class SharedPool(SuffixPool):
    def __init__(self, max_tokens: int, depth: int) -> None:
        super().__init__(max_tokens, depth)
        self.outbox: deque[list[int]] = deque(maxlen=QUEUED)
        self.inbox: deque[list[int]] = deque(maxlen=QUEUED)
        self._touching = False

    def add(self, tokens: list[int]) -> None:
        """An answer finished here (published), or an old one kept by `touch` (not again)."""
        super().add(tokens)
        if tokens and not self._touching:
            self.outbox.append([int(t) for t in tokens])

    def touch(self, at) -> None:
        self._touching = True
        try:
            super().touch(at)
        finally:
            self._touching = False

    @property
    def docs(self) -> list[list[int]]:
        """(Read by the proposer on the engine's thread before each pool draft: the other
        replicas' answers join here.)"""
        while self.inbox:
            SuffixPool.add(self, self.inbox.popleft())
        return SuffixPool.docs.fget(self)

    def take_outbox(self) -> list[list[int]]:
        """What to publish (called by the report thread: popleft is atomic)."""
        out = []
        while self.outbox:
            out.append(self.outbox.popleft())
        return out


def share(engine) -> SharedPool | None:
    """Replace the engine's suffix pool by a SharedPool (after loading, before any request);
    None where the engine keeps no pool (--spec-suffix-pool 0, or no suffix speculation)."""
    pool = engine.speculation.pool
    if pool is None:
        return None
    shared = SharedPool(pool.max_tokens, pool.depth)
    for doc in pool.docs:
        SuffixPool.add(shared, doc)
    engine.speculation.pool = shared
    return shared
