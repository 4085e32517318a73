"""Progress of a long wait: a bar on a terminal, a plain line now and then in a log file.

A bar redrawn in place is right for a terminal and wrong for a log (a cluster job's output, a
sweep's log.txt, `| tee`): there its carriage returns pile up into one enormous line, so where the
output is not a terminal each report is a line of its own, at most one every LINE_EVERY_S.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

BAR_AFTER_S = 2.0       # a wait shorter than this shows no bar
LINE_EVERY_S = 30.0     # in a log: often enough to see the work move, seldom enough to read the log
clock = time.monotonic      # a module attribute, so that a test can put a fake clock in its place
LINE = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} {unit} [{elapsed} elapsed, {remaining} left, {rate_fmt}{postfix}]"


def duration(seconds: float) -> str:
    """Seconds in the words a person reads at a glance: about 12 h 40 min, about 25 min, about
    1 min 30 s (to 10 s below 10 minutes), about 40 s."""
    if seconds >= 3600 - 30:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"about {hours} h {minutes} min"
    if seconds >= 600 - 30:
        return f"about {round(seconds / 60)} min"
    if seconds >= 60 - 5:
        minutes, tens = divmod(round(seconds / 10), 6)
        return f"about {minutes} min" + (f" {10 * tens} s" if tens else "")
    return f"about {max(1, round(seconds))} s"


def progress(total: int | None, desc: str, unit: str = "it", initial: int = 0, leave: bool = True,
             disable: bool = False, unit_scale: bool = False, file=None):
    """A bar on a terminal, Lines elsewhere; both take update(n), set_postfix(), write() and close(),
    and work as context managers."""
    file = file or sys.stderr
    if disable or file.isatty():
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave, disable=disable,
                    unit_scale=unit_scale, file=file, delay=BAR_AFTER_S, dynamic_ncols=True)
    return Lines(total, desc, unit, initial, unit_scale, file)


class Lines:
    """A wait's progress as plain lines: one every LINE_EVERY_S while it lasts, and a last one at
    its end when it lasted that long."""

    def __init__(self, total: int | None, desc: str, unit: str, initial: int = 0, unit_scale: bool = False,
                 file=None):
        self.total, self.desc, self.unit, self.unit_scale = total, desc, unit, unit_scale
        self.n = self.initial = self.said_n = initial
        self.file, self.postfix = file or sys.stderr, ""
        self.start = self.said_at = clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        if clock() - self.said_at >= LINE_EVERY_S:
            self.say()

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self.postfix = ", ".join(f"{name}={value}" for name, value in values.items())

    def say(self) -> None:
        """Print where the wait stands."""
        now = clock()
        line = tqdm.format_meter(self.n, self.total, now - self.start, prefix=self.desc, unit=self.unit,
                                 unit_scale=self.unit_scale, postfix=self.postfix, initial=self.initial,
                                 bar_format=LINE if self.total else "{desc}: {n_fmt} {unit} [{elapsed}, {rate_fmt}{postfix}]")
        print(line, file=self.file, flush=True)
        self.said_at, self.said_n = now, self.n

    @staticmethod
    def write(text: str) -> None:
        """A line of the program's own, on standard output, as tqdm.write prints it."""
        print(text, flush=True)

    def close(self) -> None:
        if self.said_at > self.start and self.n != self.said_n:
            self.say()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
