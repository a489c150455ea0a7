"""Threads per pass on a shared machine (cpushare.py): one thread fewer per CPU that other
processes keep busy, read from /proc/stat-style counters against this process's own CPU time."""

from __future__ import annotations

import pytest
import torch

from tandem import kernels
from tandem.cpushare import WINDOW, CpuShare, _proc_stat


class Machine:
    """Fake counters: per-CPU work seconds, this process's CPU seconds, a clock."""

    def __init__(self, cpus: int) -> None:
        self.work = {c: 0.0 for c in range(cpus)}
        self.own = 0.0
        self.now = 100.0

    def run(self, seconds: float, ours: float, others: float) -> None:
        """`seconds` pass with `ours` and `others` CPUs' worth of work spread over the CPUs."""
        self.now += seconds
        self.own += ours * seconds
        for c in self.work:
            self.work[c] += (ours + others) * seconds / len(self.work)

    def share(self, wanted: int, **kw) -> CpuShare:
        return CpuShare(wanted, stat=lambda: dict(self.work), own=lambda: self.own,
                        clock=lambda: self.now, cpus=set(self.work), **kw)


def test_a_busy_neighbour_takes_one_thread_and_gives_it_back():
    m = Machine(2)
    cs = m.share(2)
    m.run(1.0, ours=1.9, others=0.05)  # quiet: our two threads, a little system noise
    assert cs.threads() == 2
    m.run(1.0, ours=1.0, others=1.0)  # a busy loop on the other CPU
    assert cs.threads() == 1 and cs.others == pytest.approx(1.0)
    m.run(1.0, ours=1.0, others=1.0)  # still there: still one
    assert cs.threads() == 1
    m.run(1.0, ours=1.0, others=0.1)  # gone: both again
    assert cs.threads() == 2


def test_what_others_did_while_the_engine_was_idle_is_not_counted():
    """Between requests the engine reads nothing; what ran meanwhile (other servers of a
    benchmark, answering their own requests seconds before) must not take a thread away from the
    new request: resume() starts a new window with every thread wanted. Load that is still
    there shows in that window."""
    m = Machine(2)
    cs = m.share(2)
    m.run(1.0, ours=1.9, others=0.05)
    assert cs.threads() == 2
    m.run(1.5, ours=0.0, others=2.0)  # idle while another server answered, now gone
    cs.resume()
    assert cs.threads() == 2
    m.run(WINDOW, ours=1.9, others=0.0)
    assert cs.threads() == 2
    m.run(120.0, ours=0.0, others=2.0)  # idle again, and this time the load stays
    cs.resume()
    m.run(WINDOW, ours=1.0, others=1.0)
    assert cs.threads() == 1 and cs.others == pytest.approx(1.0)
    m.run(60.0, ours=0.0, others=1.0)  # idle under that load, then a request:
    cs.resume()  # every thread first, one again once the window shows the neighbour
    assert cs.threads() == 2
    m.run(WINDOW, ours=1.0, others=1.0)
    assert cs.threads() == 1


def test_a_long_pass_is_a_window_like_any_other():
    """A prompt chunk's pass can take seconds; the reading after it says what others did
    during it. (An earlier rule took any reading over 2 s for an idle spell and kept the count:
    a request begun on one thread stayed on one for its whole 741-token prompt, 26 s against
    14.6 s on two.)"""
    m = Machine(2)
    cs = m.share(2)
    m.run(WINDOW, ours=1.0, others=1.0)
    assert cs.threads() == 1
    m.run(16.0, ours=1.0, others=0.0)  # the neighbour left; one 16 s pass on our one thread
    assert cs.threads() == 2
    m.run(8.0, ours=1.0, others=1.0)  # it came back during an 8 s pass
    assert cs.threads() == 1


def test_readings_wait_for_the_window_and_partial_load_keeps_threads():
    m = Machine(4)
    cs = m.share(4)
    m.run(WINDOW, ours=3.6, others=0.4)  # less than half a CPU taken: keep all four
    assert cs.threads() == 4
    m.run(WINDOW / 2, ours=2.0, others=2.0)  # too soon to read: the last answer holds
    assert cs.threads() == 4
    m.run(WINDOW, ours=2.0, others=2.0)  # two CPUs taken: two threads
    assert cs.threads() == 2
    m.run(WINDOW, ours=1.0, others=8.0)  # never below one
    assert cs.threads() == 1


def test_fixed_one_thread_and_unreadable_counters_keep_what_was_asked():
    m = Machine(2)
    m.run(1.0, 0.0, 0.0)
    fixed = m.share(2, fixed=True)
    one = m.share(1)
    m.run(1.0, ours=1.0, others=1.0)
    assert fixed.threads() == 2 and one.threads() == 1

    def broken():
        raise OSError("no /proc/stat")

    cs = CpuShare(2, stat=broken, own=lambda: 0.0, cpus={0, 1})
    assert cs.threads() == 2


def test_only_this_process_s_cpus_count():
    """In a container or under taskset, work on CPUs this process may not use is not ours to
    yield to."""
    work = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    clock = [0.0]
    cs = CpuShare(2, stat=lambda: dict(work), own=lambda: 0.0, clock=lambda: clock[0],
                  cpus={0, 1})
    clock[0] += 1.0
    work[2] += 1.0
    work[3] += 1.0  # both other CPUs busy: nothing to do with us
    assert cs.threads() == 2
    clock[0] += 1.0
    work[1] += 1.0  # one of ours busy
    assert cs.threads() == 1


def test_the_real_counters_read_and_apply_caps_the_kernels():
    stat = _proc_stat()
    assert stat and all(v >= 0 for v in stat.values())
    cs = CpuShare(2)
    before, torch_before = kernels.cap_threads(0), torch.get_num_threads()
    try:
        cs.threads = lambda: 1  # as if a neighbour took a CPU
        assert cs.apply() == 1 and kernels._threads(2) == 1 and torch.get_num_threads() == 1
        cs.threads = lambda: 2
        assert cs.apply() == 2 and kernels._threads(2) == 2  # the cap is lifted
        assert torch.get_num_threads() == 2
    finally:
        kernels.cap_threads(before)
        torch.set_num_threads(torch_before)
