"""The time a sweep run here has left, from the iterations its runs still have to train.

Runs differ in length: a tuning run that successive halving stops at its rung trains a quarter of
the steps, a paused one resumed trains the rest, and a setting's confirmation runs join the plan
only once its tuning ends. A mean over the runs ended so far misjudges all three, so the estimate
is the seconds per iteration the ended runs took, times the iterations the plan still holds, with
each setting's confirmation runs counted before they are planned.
"""

from __future__ import annotations

import time

from ..config import TrainConfig, build
from ..progress import duration
from .grid import SweepRun, final_eval, setting_of


def stop_iter(values: dict, run: SweepRun) -> int:
    """The iteration the run trains to: the rung its plan pauses it at, else its max_iters."""
    return run.extra.get("pause_at") or build(TrainConfig, {**values, **setting_of(run)}).max_iters


def reached(run: SweepRun) -> int:
    """The last iteration the run evaluated at, where a resumed run goes on from (0: none yet)."""
    last = final_eval(run.folder)
    return last["iter"] if last else 0


class Clock:
    """What the runs ended here took, per iteration, and the time left that it gives."""

    def __init__(self, values: dict, jobs: int, confirm_runs: int = 0):
        self.values, self.jobs = values, jobs
        self.confirm_runs = confirm_runs        # the confirmation runs the whole plan will hold
        self.max_iters = build(TrainConfig, values).max_iters      # of a confirmation run not yet planned
        self.seconds = self.iters = 0.0
        self.started: dict = {}                # a run's folder -> the iteration it started this time from

    def start(self, run: SweepRun) -> None:
        self.started[run.folder] = reached(run)

    def end(self, entry: tuple, runs: list[SweepRun], todo: list[SweepRun], running) -> str:
        """Count in the run that ended (entry: the run and its start time first), and give ", about N
        left" for the runs waiting (todo), those at work (running: entries like it) and the
        confirmation runs not yet planned; "" until a run has trained an iteration."""
        run, started = entry[:2]
        now = time.time()
        self.seconds += now - started
        self.iters += max(0, reached(run) - self.started.pop(run.folder, 0))
        if not self.iters:
            return ""
        per_iter = self.seconds / self.iters
        iters = sum(max(0, stop_iter(self.values, r) - reached(r)) for r in todo)
        iters += sum(max(0.0, stop_iter(self.values, r) - self.started.get(r.folder, 0) - (now - t) / per_iter)
                     for r, t, *_ in running)
        planned = sum(r.stage != "tune" for r in runs)
        iters += max(0, self.confirm_runs - planned) * self.max_iters
        return f", {duration(iters * per_iter / self.jobs)} left" if iters >= 1 else ""
