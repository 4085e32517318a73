"""How many threads sampling on a CPU uses: the count whose one-token steps run fastest now.

A sampling step is a few hundred small ops. torch's threads meet at the end of each op, so when
another process holds a core, every op waits for the thread that core delays, and a step can be
many times slower than on one thread; on an idle machine the second thread can still pay a little
(docs/performance.md has both). Which one wins depends on the load at the time, so sampling times
a few steps at each count now and then, and runs the rest at the faster one.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterator

import torch

SETTLE = 2              # steps after a change of count left untimed: threads wake, caches refill
TIMED = 4               # timed steps of a block; their median is robust to a slow one
FIRST_RUN = 64          # steps at the leading count before the first probe of the others
LONGEST_RUN = 2048      # a count that keeps winning is probed less and less often, down to this
GIVE_UP = 3.0           # two probe steps this many times slower than the leader's end the probe
FAR_SLOWER = 10.0       # one probe step this many times slower ends it: no hitch is that long
MARGIN = 0.9            # a count leads only if this much faster: steps vary, and a move costs


class Ended(Exception):
    """The stream has no more items."""


def fastest_threads(stream: Iterator, counts: tuple[int, ...]) -> Iterator:
    """Yield stream's items, each next() run at the thread count that is fastest now.

    It runs at counts[0]. After a run of steps it times a block of steps at the leading count,
    one at another count, and one at the leading count again: a step's work grows until the
    window slides, so the other count is held to the mean of the blocks around it. It moves if
    the other is faster by MARGIN. Otherwise the next run is twice as long, or 16 times when
    the other count lost by far, up to LONGEST_RUN: a count that loses by far costs a few steps
    now and then. torch's count is put back at the end."""
    before = torch.get_num_threads()
    leader, run = counts[0], FIRST_RUN
    step = iter(stream)

    def timed(n: int):
        if torch.get_num_threads() != n:    # setting it costs a step a tenth of its time, even unchanged
            torch.set_num_threads(n)
        start = time.perf_counter()
        try:
            item = next(step)
        except StopIteration:
            raise Ended from None       # a generator may not let StopIteration out (PEP 479)
        return item, time.perf_counter() - start

    def block(n: int, base: float):
        """Steps at n; the median of the timed ones, or None once one takes FAR_SLOWER times base,
        or two take GIVE_UP times it (one may be a moment's hitch)."""
        times, slow = [], 0
        for i in range(SETTLE + TIMED):
            item, seconds = timed(n)
            yield item
            slow += seconds > GIVE_UP * base
            if slow == 2 or seconds > FAR_SLOWER * base:
                return None
            if i >= SETTLE:
                times.append(seconds)
        return statistics.median(times)

    try:
        while True:
            for _ in range(run):
                yield timed(leader)[0]
            growth, moved = 16, False
            for n in [n for n in counts if n != leader]:
                ahead = yield from block(leader, math.inf)
                other = yield from block(n, ahead)
                if other is None:
                    continue
                behind = yield from block(leader, math.inf)
                growth = 2
                if other < MARGIN * (ahead + behind) / 2:
                    leader, moved = n, True
            run = FIRST_RUN if moved else min(growth * run, LONGEST_RUN)
    except Ended:
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
