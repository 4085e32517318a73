"""The time a sweep says it has left, weighed by the iterations its runs still have to train."""

import json
import time

import pytest

from gpt.sweep.eta import Clock
from gpt.sweep.grid import SweepRun


def run_at(tmp_path, name, stage="tune", pause_at=None, evaluated=()):
    folder = tmp_path / name
    folder.mkdir()
    with open(folder / "metrics.jsonl", "w") as f:
        for i in evaluated:
            f.write(json.dumps({"kind": "eval", "iter": i, "val_loss": 2.0}) + "\n")
    return SweepRun({"x": name}, 1337, folder, stage=stage, extra={"pause_at": pause_at} if pause_at else {})


def evaluate(run, at):
    with open(run.folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "eval", "iter": at, "val_loss": 2.0}) + "\n")


@pytest.mark.parametrize("jobs, said", [(1, ", about 16 min left"), (2, ", about 8 min left")])
def test_halved_resumed_and_unplanned_runs_are_weighed_by_their_iterations(tmp_path, jobs, said):
    # a tuning run paused at the rung (800 of 3,200 iterations) in 80 s: 0.1 s an iteration
    paused = run_at(tmp_path, "paused", pause_at=800)
    resumed = run_at(tmp_path, "resumed", evaluated=[0, 800])     # goes on from 800 to 3,200
    halved = run_at(tmp_path, "halved", pause_at=800)              # trains to the rung only
    clock = Clock({"max_iters": 3200}, jobs=jobs, confirm_runs=2)
    clock.start(paused)
    evaluate(paused, 800)
    # 2,400 + 800 + 2 confirmation runs not yet planned of 3,200: 9,600 iterations, 960 s on one
    # slot (a mean over the runs ended so far would say 160 s)
    assert clock.end((paused, time.time() - 80), [paused, resumed, halved], [resumed, halved], []) == said


def test_a_run_at_work_counts_what_it_has_not_trained_yet(tmp_path):
    first, busy = run_at(tmp_path, "first", stage="confirm"), run_at(tmp_path, "busy", stage="confirm")
    clock = Clock({"max_iters": 1000}, jobs=1)
    clock.start(first)
    clock.start(busy)
    evaluate(first, 1000)
    # 100 s for 1,000 iterations; the other run started 40 s ago, so has about 600 iterations to go
    left = clock.end((first, time.time() - 100), [first, busy], [], [(busy, time.time() - 40)])
    assert left == ", about 1 min left"


def test_nothing_is_said_before_a_run_has_trained_an_iteration(tmp_path):
    failed, waiting = run_at(tmp_path, "failed"), run_at(tmp_path, "waiting")
    clock = Clock({"max_iters": 1000}, jobs=1)
    clock.start(failed)
    assert clock.end((failed, time.time() - 5), [failed, waiting], [waiting], []) == ""
