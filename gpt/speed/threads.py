"""How many threads sampling on a CPU uses: the count whose one-token steps run fastest now.

A sampling step is a few hundred small ops. torch's threads meet at the end of each op, so when
another process holds a core, every op waits for the thread that core delays, and a step can be
many times slower than on one thread; on an idle machine the second thread can still pay a little
(docs/performance.md has both). Which one wins depends on the load at the time, so sampling times
a few steps at each count now and then, and runs the rest at the faster one.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator

import torch

PROBE_STEPS = 3         # timed steps of a probe; their median is robust to one slow step
FIRST_RUN = 64          # steps at the leading count before the first probe of the others
LONGEST_RUN = 2048      # a count that keeps winning is probed less and less often, down to this
GIVE_UP = 3.0           # a probe step this many times slower than the leader's ends the probe


def fastest_threads(stream: Iterator, counts: tuple[int, ...]) -> Iterator:
    """Yield stream's items, each next() run at the thread count that is fastest now.

    It runs at counts[0], timing each step. After a run of steps it times a few at each other
    count and moves to one whose median is lower. Otherwise the next run is twice as long, or
    four times when the other count lost by far, up to LONGEST_RUN: a count that loses by far
    costs a step now and then. A probe ends at a step GIVE_UP times slower than the leader's,
    but for a count's first step, which may start its threads. torch's count is put back."""
    before = torch.get_num_threads()
    leader, run, probed = counts[0], FIRST_RUN, set()
    step = iter(stream)

    def timed(n: int):
        torch.set_num_threads(n)
        start = time.perf_counter()
        item = next(step)
        return item, time.perf_counter() - start

    try:
        item, _ = timed(leader)         # the prompt's step, which may be long, is not timed against others
        yield item
        while True:
            times = []
            for _ in range(run):
                item, seconds = timed(leader)
                times.append(seconds)
                yield item
            best, growth = statistics.median(times[-16:]), 4
            for n in (n for n in counts if n != leader):
                probe = []
                while len(probe) < PROBE_STEPS:
                    item, seconds = timed(n)
                    probe.append(seconds)
                    yield item
                    if (n in probed or len(probe) > 1) and seconds > GIVE_UP * best:
                        break
                probed.add(n)
                if len(probe) == PROBE_STEPS:
                    growth = 2
                    if statistics.median(probe) < best:
                        leader, best, run = n, statistics.median(probe), FIRST_RUN // growth
            run = min(growth * run, LONGEST_RUN)
    except StopIteration:
        return
    finally:
        torch.set_num_threads(before)


def sampling_threads(stream: Iterator, threads: int, device: torch.device) -> Iterator:
    """stream run at `threads` threads, or (0) at whichever of 1 and torch's count is faster now.

    0 starts at torch's count on an idle machine (load average under 0.5), else at one thread."""
    if device.type != "cpu":
        return stream
    if threads:
        return _fixed(stream, threads)
    if torch.get_num_threads() == 1:
        return stream
    idle = hasattr(os, "getloadavg") and os.getloadavg()[0] < 0.5
    return fastest_threads(stream, (torch.get_num_threads(), 1) if idle else (1, torch.get_num_threads()))


def _fixed(stream: Iterator, threads: int) -> Iterator:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield from stream
    finally:
        torch.set_num_threads(before)
