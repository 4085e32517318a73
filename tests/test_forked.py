"""run_start=fork: a sweep's runs forked from a server that imported the trainer once train as
fresh processes do, each in a process and session of its own, and end with the sweep."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import train
from conftest import ROOT, tiny_args, untimed_metrics
from gpt.config import SweepConfig
from gpt.errors import UserError
from gpt.sweep.forked import forking

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked runs are Linux's default")


def test_auto_forks_on_linux_and_fresh_never_does():
    assert forking("auto") and forking("fork") and not forking("fresh")
    with pytest.raises(UserError, match="run_start='spawn'"):
        SweepConfig(run_start="spawn")


@pytest.mark.slow     # over 15 s on 2 AVX2 cores; .ci/run runs the slow tests too
@pytest.mark.e2e
def test_a_tuned_sweep_trains_the_same_losses_forked_as_in_fresh_processes(data_dir, tmp_path):
    sweep = ["--max_iters=6", "--eval_interval=3", "--sweep", "n_layer=1,2", "--seeds=2",
             "--tune", "learning_rate=1e-3,1e-2", "--jobs=2"]
    runs = {}
    for start in ("fork", "fresh"):
        out = tmp_path / start
        assert train.main(tiny_args(data_dir, out, *sweep, f"--run_start={start}")) == 0
        runs[start] = {p.parent.relative_to(out): untimed_metrics(p.parent, "train") + untimed_metrics(p.parent, "eval")
                       for p in out.rglob("metrics.jsonl")}
    assert len(runs["fork"]) >= 2 * 2 + 2 * 2 and runs["fork"] == runs["fresh"]     # tuning may extend a grid
    results = [json.loads(p.read_text()) for p in (tmp_path / "fork").rglob("result.json")]
    assert len(results) == len(runs["fork"]) and {r["returncode"] for r in results} == {0}


@pytest.mark.e2e
def test_forked_runs_save_and_end_when_the_sweep_is_killed_outright(data_dir, tmp_path):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=100000", "--eval_interval=100000", "--sweep", "n_layer=1,2",
                     "--jobs=2", "--run_start=fork")
    sweep = subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    logs = [out / f"n_layer={n}__seed=1337" / "log.txt" for n in (1, 2)]
    deadline = time.time() + 60
    while not all(p.exists() and "training " in p.read_text() for p in logs):
        assert time.time() < deadline and sweep.poll() is None
        time.sleep(0.2)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    deadline = time.time() + 60
    while not all("saved" in p.read_text() for p in logs):      # each run saves as it ends
        assert time.time() < deadline, [p.read_text()[-300:] for p in logs]
        time.sleep(0.2)
    for p in logs:
        assert "SIGTERM: saved" in p.read_text() and (p.parent / "ckpt.pt").exists()


@pytest.mark.e2e
def test_a_forked_run_on_two_threads_computes_on_both_without_hanging(data_dir, tmp_path):
    # a process forked after torch's thread pool ran hangs in its first parallel op: the server must not run one
    out = tmp_path / "sw"
    argv = [a for a in tiny_args(data_dir, out, "--max_iters=4", "--sweep", "n_layer=1", "--run_start=fork")
            if a != "--threads=1"]
    proc = subprocess.run([sys.executable, "train.py", *argv, "--threads=2", "--thread_split=ops"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-500:] + proc.stderr[-500:]
    assert "(float32, 2 threads)" in (out / "n_layer=1__seed=1337" / "log.txt").read_text()


def say_environment(argv: list[str]) -> int:
    print(os.environ.get("GPT_FORKED_TEST", "unset"))
    return 0


def test_a_forked_run_gets_the_sweeps_environment_as_it_starts_not_the_servers(tmp_path, monkeypatch):
    from gpt.sweep.forked import ForkedRun
    monkeypatch.delenv("GPT_FORKED_TEST", raising=False)
    assert ForkedRun(say_environment, [], str(tmp_path / "before.txt")).wait() == 0   # the server starts here
    monkeypatch.setenv("GPT_FORKED_TEST", "seen")       # as WANDB_MODE, set after an earlier sweep in one process
    assert ForkedRun(say_environment, [], str(tmp_path / "after.txt")).wait() == 0
    assert (tmp_path / "before.txt").read_text() == "unset\n" and (tmp_path / "after.txt").read_text() == "seen\n"
