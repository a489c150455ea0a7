"""How many threads a pass should use on a machine other processes share.

Every product of a pass ends at a barrier where each thread waits for the slowest. When another
process keeps one of the CPUs busy, the thread on that CPU runs only part of the time and every
barrier waits for it: on a 2-CPU machine with a busy loop beside it, the target decodes faster
on 1 thread than on 2 (`bench/results/threads-busy/`). So before each pass the
engine asks `CpuShare.threads()`: the CPUs this process may run on (its affinity) less the CPU
time other processes used on them over the last window, read from /proc/stat (user, nice,
system, irq, softirq of those CPUs) less this process's own CPU time (`os.times`, every thread).
Steal time (a hypervisor's) is not counted: it takes both vCPUs alike. The kernels give the same
bits with any number of threads, so the output never depends on this.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

from . import kernels

log = logging.getLogger("tandem.engine")

WINDOW = 0.5  # seconds between readings
KEEP = 0.5    # a CPU counts as free while others use less than half of it


def _proc_stat(path: str = "/proc/stat") -> dict[int, float]:
    """Seconds each CPU spent on work (user, nice, system, irq, softirq) since boot."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *v = line.split()
                user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in v[:7])
                out[int(name[3:])] = (user + nice + system + irq + softirq) / hz
    return out


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class CpuShare:
    """threads(): `wanted` less the CPUs other processes keep busy, at least 1.

    Readings come at most every WINDOW seconds; between them the last answer holds. Where
    /proc/stat cannot be read (not Linux), or with `fixed`, the answer is always `wanted`."""

    def __init__(self, wanted: int, fixed: bool = False, *,
                 stat: Callable[[], dict[int, float]] = _proc_stat,
                 own: Callable[[], float] = _own_cpu, clock: Callable[[], float] = time.monotonic,
                 cpus: set[int] | None = None) -> None:
        self.wanted = max(1, wanted)
        self._stat, self._own, self._clock = stat, own, clock
        self.cpus = cpus if cpus is not None else set(os.sched_getaffinity(0))
        self.fixed = fixed  # --threads-fixed: always `wanted`
        self.current = self.wanted
        self._applied: int | None = None  # what apply() last set
        self._resumed = False  # the count was reset by resume(), not read
        self.others = 0.0  # CPUs' worth of other processes' work over the last window
        self._last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        try:
            busy = sum(s for c, s in self._stat().items() if c in self.cpus)
        except (OSError, ValueError):
            return None
        return self._clock(), busy, self._own()

    def threads(self) -> int:
        if self.fixed or self.wanted == 1 or self._last is None:
            return self.wanted
        if self._clock() - self._last[0] < WINDOW:
            return self.current
        now = self._read()
        if now is None:
            return self.current
        dt = now[0] - self._last[0]
        self.others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2])) / dt
        self._resumed = False
        self._last = now
        free = len(self.cpus) - self.others
        self.current = max(1, min(self.wanted, int(free + KEEP)))
        return self.current

    def resume(self) -> None:
        """The engine starts working after an idle spell (Engine.step's first pass after every
        sequence was done): a new window, and `wanted` threads until it is read. What other
        processes did while this one waited (another server answering its own request, a
        benchmark's turns) says nothing of what they will do now; counted, a first window
        with a few seconds of idle in it took another server's request for a neighbour that
        keeps the CPUs busy, and the thread count it gave then held through the first passes,
        a whole prompt chunk of seconds at one thread. Load that is still there shows in the
        first window (WINDOW seconds, or the first pass if longer)."""
        if self._last is not None:
            self._last = self._read()
            self.current = self.wanted
            self._resumed = True

    def apply(self) -> int:
        """Cap every product's threads at threads() (kernels.cap_threads), and PyTorch's own
        operations' (sampling, the embedding); log a change."""
        n = self.threads()
        if n != self._applied:
            kernels.cap_threads(0 if n == self.wanted else n)
            torch.set_num_threads(n)
            if self._applied is not None and self._resumed:
                log.info("threads per pass %d -> %d: work resumes after an idle spell, every "
                         "thread until other processes' use is read again", self._applied, n)
            elif self._applied is not None:
                log.info("threads per pass %d -> %d: other processes use %.1f of %d CPUs",
                         self._applied, n, self.others, len(self.cpus))
            self._applied = n
        return n
