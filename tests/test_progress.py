"""Progress: a bar on a terminal, plain lines in a log, for training, evaluations and saves."""

import io
import re

import pytest
from tqdm import tqdm

import train
from conftest import tiny_args
from gpt import checkpoint, progress


@pytest.fixture
def clock(monkeypatch):
    """A clock that moves on 20 s at each reading."""
    ticks = iter(range(0, 10**9, 20))
    monkeypatch.setattr(progress, "clock", lambda: next(ticks))


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_and_a_log_gets_lines():
    assert isinstance(progress.progress(10, "x", file=Terminal()), tqdm)
    assert isinstance(progress.progress(10, "x", file=io.StringIO()), progress.Lines)


def test_a_short_wait_says_nothing_in_a_log(monkeypatch):
    ticks = iter(range(100))                    # a second a reading: 10 updates stay under 30 s
    monkeypatch.setattr(progress, "clock", lambda: next(ticks))
    log = io.StringIO()
    with progress.progress(10, "evaluating", "batches", file=log) as bar:
        for _ in range(10):
            bar.update()
    assert log.getvalue() == ""


@pytest.mark.parametrize("updates", [59, 60])
def test_a_long_wait_is_a_line_every_30_s_and_one_at_its_end(clock, updates):
    log = io.StringIO()
    with progress.progress(100, "run", "steps", initial=40, file=log) as bar:
        bar.set_postfix(loss="2.3412", lr="1.0e-03", refresh=False)
        for _ in range(updates):
            bar.update()
    lines = log.getvalue().splitlines()
    # the clock is read at each update and at each line: a line every other update (the 60th
    # one's is the last), or else one at the end
    assert len(lines) == 30 and "\r" not in log.getvalue()
    assert lines[0] == "run:  42% 42/100 steps [01:00 elapsed, 29:00 left, 30.00s/steps, loss=2.3412, lr=1.0e-03]"
    assert lines[-1].startswith(f"run: {40 + updates:3}% {40 + updates}/100 steps [")


@pytest.mark.e2e
def test_training_and_its_evaluations_show_progress_in_a_log(clock, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--eval_iters=3")) == 0
    err = capsys.readouterr().err.splitlines()
    evaluations = [line for line in err if line.startswith("evaluating at iteration ")]
    steps = [line for line in err if line.startswith("run: ")]
    # each evaluation scores 3 batches of each split; every other batch makes a line
    assert {line.split(":")[0] for line in evaluations} == {f"evaluating at iteration {it}" for it in (0, 2, 4)}
    assert all(re.search(r" \d/6 batches \[", line) for line in evaluations)
    assert steps and all(re.search(r"% \d/4 steps \[.*loss=\d", line) for line in steps)


def test_saving_a_checkpoint_counts_its_bytes(clock, tmp_path, capsys):
    import torch
    state = {"model": {"w": torch.zeros(1 << 20), "b": torch.zeros(1 << 20)}, "iter": 1}
    assert checkpoint.tensor_bytes(state) == 2 * 4 << 20
    checkpoint.save(state, tmp_path / "ckpt.pt")
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("saving ckpt.pt: ") for line in lines)
    assert re.match(r"saving ckpt.pt: +\d+% ", lines[-1])
