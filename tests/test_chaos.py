"""The chaos tier (python3 -m pytest -q -m chaos, not in the default run): a malicious checkpoint
given to every loader, and a submitit_local sweep killed outright. Each must end in one clear line
with nothing lost and no code run. The other hostile cases (a reused process id, weights or moments
damaged on disk, another run's checkpoint) are quick and run by default: tests/test_integrity.py,
tests/test_slurm.py."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import sample
import train
from conftest import ROOT, tiny_args
from gpt import checkpoint, evaluate, export, figures
from gpt.sweep import report, submitted

pytestmark = pytest.mark.chaos


class Boom:
    """Unpickled, it would run a shell command."""
    def __reduce__(self):
        return (os.system, ("touch boom-was-run",))


@pytest.fixture
def poisoned(data_dir, tmp_path, monkeypatch):
    """A trained run whose ckpt.pt (and ckpt_best.pt) carry a pickled object that runs a command."""
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    for name in ("ckpt.pt", "ckpt_best.pt"):
        (out / name).unlink()
        torch.save({**ckpt, "meta": {**ckpt["meta"], "x": Boom()}}, out / name)
    monkeypatch.chdir(tmp_path)
    return out


@pytest.mark.parametrize("loader", ["sample", "resume", "evaluate", "export", "init_from", "attention figure"])
def test_a_malicious_checkpoint_is_refused_by_every_loader_in_one_line(poisoned, data_dir, tmp_path, capsys, loader):
    calls = {
        "sample": lambda: sample.main([f"--out_dir={poisoned}", "--max_new_tokens=2"]),
        "resume": lambda: train.main([f"--out_dir={poisoned}", "--resume", "--max_iters=4"]),
        "evaluate": lambda: evaluate.main([f"--out_dir={poisoned}"]),
        "export": lambda: export.main([f"--out_dir={poisoned}", f"--to={tmp_path / 'hf'}"]),
        "init_from": lambda: train.main(tiny_args(data_dir, tmp_path / "fine", "--max_iters=2",
                                                  f"--init_from={poisoned}")),
        "attention figure": lambda: figures.main(["attention", str(poisoned)]),
    }
    assert calls[loader]() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a pickled Python object" in err and "was not loaded" in err
    assert not (tmp_path / "boom-was-run").exists()


def _iters(run) -> int:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line)["iter"] for line in lines[:-1] if '"train"' in line), default=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process start times in /proc")
def test_a_submitit_local_sweep_killed_outright_leaves_jobs_that_status_names_and_cancel_stops(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=3000", "--eval_interval=100", "--sweep", "residual=true,false",
                     "--jobs=2", "--launcher=submitit_local")
    sweep = subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    runs = [out / "residual=true__seed=1337", out / "residual=false__seed=1337"]
    deadline = time.time() + 120
    while not all(_iters(r) >= 100 for r in runs):     # both training, past a checkpoint
        assert sweep.poll() is None and time.time() < deadline
        time.sleep(0.1)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    assert report.main(["status", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("0 done, 2 running, 0 queued") and "2 of the running runs are jobs of a submitit_local" in said
    assert report.main(["cancel", str(out)]) == 0
    assert "cancelled 2 runs" in capsys.readouterr().out
    for _ in range(600):        # each saves as it stops
        if not any(submitted.states(submitted.read(out)).get(r.name) == "running" for r in runs):
            break
        time.sleep(0.1)
    assert all((r / "ckpt.pt").exists() for r in runs)
    stopped = {r: checkpoint.load(r / "ckpt.pt", mmap=True, needs=("iter",))["iter"] for r in runs}
    assert all(0 < it < 3000 for it in stopped.values())
    # nothing lost: the same command resumes both and finishes
    assert train.main([*argv[:-1], "--launcher=local", "--max_iters=3000"]) == 0
    assert all(json.loads((r / "result.json").read_text())["status"] == "finished" for r in runs)
    assert all("resuming" in (r / "log.txt").read_text() for r in runs)
