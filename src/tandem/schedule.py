"""Which waiting prompt the scheduler step reads first.

On a CPU reading prompts is compute-bound: two prompts that arrive together take their sum to
read however they are interleaved, so the later of them gets its first token after both. What
the order decides is who waits. Oldest first (FIFO) lets a short question that arrived a moment
after a long document wait for all of the document: its time to first token is many times its
own prompt time. Shortest remaining first (SRPT, which minimizes the mean) reads the question
first, and the document then waits only for the question: the ratio of each request's time to
first token to its own prompt time stays near 1 for the short one and at most about 2 for the
long one.

SRPT alone could keep a long prompt waiting while short ones keep arriving, so the key is its
remaining prompt time less the time it has already waited (least slack first): a prompt moves
ahead of a new one once it has waited about as long as the difference of their remaining
times, so none waits much longer than its own reading time behind later arrivals.
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

# seconds per prompt row before the engine has measured one (about a 1.5B model on 2 cores):
# only the order depends on it, never what is computed
ROW_SECONDS_GUESS = 0.015


class Waiting(Protocol):
    n_prompt: int  # prompt tokens
    prefill_at: int  # of them already in the cache
    t_start: float  # when the request was added (time.perf_counter)


def prompt_order(waiting: Sequence[Waiting], row_seconds: float | None,
                 now: float | None = None) -> list:
    """The sequences still reading their prompts, the one to read first first: by remaining
    prompt rows times the measured seconds per row, less the seconds waited so far; ties (the
    same key) by arrival."""
    now = time.perf_counter() if now is None else now
    t_row = row_seconds if row_seconds and row_seconds > 0 else ROW_SECONDS_GUESS

    def slack(s: Waiting) -> tuple[float, float]:
        left = s.n_prompt - 1 - s.prefill_at  # the last prompt token is read with the first row
        return left * t_row - (now - s.t_start), s.t_start

    return sorted(waiting, key=slack)
