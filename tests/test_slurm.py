"""Sweeps as submitit jobs: submitit's local executor end to end, a requeue, and the Slurm submission against fake Slurm tools."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from conftest import tiny_args
from gpt.config import REPO_ROOT
from gpt.sweep import report, submitted

pytest.importorskip("submitit")
pytestmark = pytest.mark.e2e

FAKE = {    # what each fake tool prints; each records its arguments (and sbatch its script) in calls.txt
    "sbatch": 'if grep -q "partition=nope" "$1"; then\n'
              '  echo "sbatch: error: invalid partition specified: nope" >&2\n'
              '  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2\n'
              '  exit 1\nfi\ncat "$1" >> "$(dirname "$0")/scripts.txt"\necho "Submitted batch job 4242"\n',
    "sacct": 'echo "JobID|State"\ncat "$(dirname "$0")/sacct.txt" 2>/dev/null\n',
    "srun": "", "squeue": "", "scancel": "",
}


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """Fake sbatch, srun, squeue, sacct and scancel first on PATH; returns their folder."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, body in FAKE.items():
        path = folder / name
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> "$(dirname "$0")/calls.txt"\n{body}')
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def weights(folder: Path) -> dict:
    return torch.load(folder / "ckpt.pt", map_location="cpu", weights_only=False)["model"]


@pytest.mark.slow     # over 10 s; .ci/run runs the slow tests too
def test_submitit_local_runs_a_two_by_two_sweep_end_to_end(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=3", "--sweep", "residual=true,false",
                     "--seeds=2", "--jobs=2", "--launcher=submitit_local", "--slurm_time=5")
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "4 to submit (submitit_local)" in printed and printed.count("started residual=") == 4
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [(r["residual"], r["seed"], r["status"]) for r in rows] == [
        ("true", "1337", "finished"), ("true", "1338", "finished"),
        ("false", "1337", "finished"), ("false", "1338", "finished")]
    for r in rows:      # each an ordinary run folder
        folder = out / f"residual={r['residual']}__seed={r['seed']}"
        assert {"ckpt.pt", "config.json", "metrics.jsonl", "log.txt", "result.json"} <= {p.name for p in folder.iterdir()}
    assert report.main(["status", str(out)]) == 1        # nothing pending
    assert capsys.readouterr().out.startswith("4 done, 0 running, 0 queued, 0 failed, 0 not submitted\n")
    assert train.main(argv) == 0                          # again: nothing to submit
    assert "(4 already finished, 0 queued or running), 0 to submit" in capsys.readouterr().out


def _task_of(controller: int) -> int:
    """The submitit process a local job's controller runs, which gets the timeout signal."""
    for _ in range(600):
        children = Path(f"/proc/{controller}/task/{controller}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise AssertionError("the local job started no task")


def _iters(run: Path) -> int:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line)["iter"] for line in lines[:-1] if '"train"' in line), default=0)


@pytest.mark.slow     # over 10 s; .ci/run runs the slow tests too
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the job's process in /proc")
def test_a_job_stopped_by_the_time_limit_signal_is_requeued_and_ends_as_an_uninterrupted_run(data_dir, tmp_path):
    args = ("--max_iters=800", "--eval_interval=100", "--seed=7", "--sweep", "residual=true")
    plain = tmp_path / "plain"
    assert train.main(tiny_args(data_dir, plain, *args)) == 0
    out = tmp_path / "jobs"
    # the sweep waits for its job; this test stops the job meanwhile
    sweep = subprocess.Popen([sys.executable, "train.py", *tiny_args(data_dir, out, *args, "--launcher=submitit_local")],
                             cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    run = out / "residual=true__seed=7"
    while _iters(run) < 200:        # mid-run: past its first checkpoints, well before its end
        assert sweep.poll() is None
        time.sleep(0.05)
    controller = int(submitted.read(out)["jobs"][run.name]["id"])
    os.kill(_task_of(controller), signal.SIGUSR2)       # what submitit sends at a time limit or preemption
    assert sweep.wait(timeout=300) == 0
    log = (run / "log.txt").read_text()
    assert "SIGTERM: saved" in log and "resuming" in log      # it saved, and the requeued job resumed it
    assert "Requeued job" in "".join(p.read_text() for p in (out / "slurm").glob("*_log.*"))
    assert json.loads((run / "result.json").read_text())["status"] == "finished"
    ours, theirs = weights(run), weights(plain / run.name)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_slurm_submits_one_array_with_the_options_and_returns(data_dir, tmp_path, slurm, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=6", "--sweep", "residual=true,false", "--seeds=2", "--jobs=2",
                     "--launcher=slurm", "--slurm_partition=gpu", "--slurm_time=90", "--slurm_gpus=1",
                     "--slurm_cpus=8", "--slurm_mem=32G", "--slurm_account=lab", "--slurm_qos=high",
                     "--slurm_extra=--constraint=a100; --exclusive")
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "submitted 4 runs as Slurm job 4242 (2 at a time)" in printed
    assert f"watch:  python -m gpt.sweep status {out}" in printed and f"cancel: python -m gpt.sweep cancel {out}" in printed
    script = (slurm / "scripts.txt").read_text()
    sbatch = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {"#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=8",
            "#SBATCH --mem=32G", "#SBATCH --account=lab", "#SBATCH --qos=high", "#SBATCH --constraint=a100",
            "#SBATCH --exclusive", "#SBATCH --array=0-3%2", "#SBATCH --signal=USR2@90"} <= sbatch
    assert f"{sys.executable} -u -m submitit.core._submit" in script
    assert not any((out / f"residual=true__seed={s}" / "ckpt.pt").exists() for s in (1337, 1338))    # nothing ran here
    assert submitted.read(out)["jobs"]["residual=false__seed=1338"]["id"] == "4242_3"

    (slurm / "sacct.txt").write_text("4242_0|RUNNING\n4242_1|PENDING\n4242_2|FAILED\n4242_3|PENDING\n")
    (out / "residual=false__seed=1337").mkdir()
    (out / "residual=false__seed=1337" / "log.txt").write_text("iter 1\nRuntimeError: out of memory\n")
    assert report.main(["status", str(out)]) == 0      # runs pending
    said = capsys.readouterr().out
    assert said.startswith("0 done, 1 running, 2 queued, 1 failed, 0 not submitted\n")
    assert "failed: residual=false__seed=1337: RuntimeError: out of memory" in said
    assert report.main(["report", str(out)]) == 0
    assert "Partial: 0 of 4 runs have a result; 4 are queued, running" in capsys.readouterr().out

    (slurm / "scripts.txt").unlink()
    assert train.main(argv) == 0        # again: the failed run alone
    assert "3 queued or running), 1 to submit" in capsys.readouterr().out
    assert "--array" not in (slurm / "scripts.txt").read_text()
    (slurm / "sacct.txt").write_text("4242_0|RUNNING\n4242_1|PENDING\n4242|PENDING\n4242_3|COMPLETED\n")
    assert report.main(["cancel", str(out)]) == 0
    assert "scancel 4242 4242_0 4242_1" in (slurm / "calls.txt").read_text()
    assert "cancelled 3 runs" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--launcher=pbs"], "error: launcher='pbs' is not allowed; choose one of local, slurm, submitit_local\n"),
    (["--slurm_partition=gpu"], "error: --slurm_partition is an option of --launcher=slurm, and the launcher is "
                                "local; give --launcher=slurm, or leave it out\n"),
    (["--launcher=submitit_local", "--slurm_gpus=1"], "error: --slurm_gpus is an option of --launcher=slurm, "
                                                      "and the launcher is submitit_local;"),
    (["--launcher=slurm", "--slurm_partition=nope"], "error: Slurm refused the sweep's jobs: Batch job submission "
                                                     "failed: Invalid partition name specified\n"),
    (["--launcher=slurm", "--slurm_extra=constraint=a100"], "error: slurm_extra: 'constraint=a100' is not an "
                                                            "#SBATCH option;"),
])
def test_bad_launcher_input_is_one_line(data_dir, tmp_path, slurm, capsys, extra, message):
    argv = tiny_args(data_dir, tmp_path / "sw", "--max_iters=2", "--seeds=2", *extra)
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_slurm_without_sbatch_or_submitit_says_so(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))       # no sbatch
    argv = tiny_args(data_dir, tmp_path / "sw", "--max_iters=2", "--seeds=2", "--launcher=slurm")
    assert train.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: sbatch not found: --launcher=slurm submits from a Slurm")
    monkeypatch.setitem(sys.modules, "submitit", None)
    assert train.main(argv) == 2
    assert capsys.readouterr().err == 'error: --launcher=slurm needs submitit: pip install -e ".[slurm]"\n'


def test_a_file_may_hold_slurm_options_that_only_the_slurm_launcher_reads(data_dir, tmp_path, capsys):
    config = tmp_path / "s.toml"
    config.write_text('[sweep]\nseeds = 2\nslurm_partition = "gpu"\nslurm_time = 30\n')
    argv = [f"--config={config}", *tiny_args(data_dir, tmp_path / "sw", "--max_iters=2")]
    assert train.main(argv) == 0
    assert "2 runs (0 already finished), 1 at a time" in capsys.readouterr().out
    assert train.main([*argv[:1], *tiny_args(data_dir, tmp_path / "one", "--max_iters=2"), "--seeds=1",
                       "--launcher=slurm"]) == 2
    assert "this is one run" in capsys.readouterr().err


def test_cancel_and_status_never_take_a_reused_process_id_for_the_sweeps(data_dir, tmp_path, capsys):
    """After a kill -9 of a submitit_local sweep its pid stays in jobs.json; once another process
    has it, cancel must not signal that process, and status must not call the runs queued."""
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=1", "--sweep", "residual=true,false")
    assert train.main(argv) == 0
    capsys.readouterr()
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        record = {"launcher": "submitit_local", "logs": str(out / "slurm"), "submitter": stranger.pid,
                  "submitter_start": submitted.started_at(stranger.pid) + 1,     # another process's start
                  "jobs": {"residual=true__seed=1337": {"id": None, "at": 0.0},
                           "residual=false__seed=1337": {"id": stranger.pid, "at": 0.0, "start": 1}}}
        submitted.write(out, record)
        assert submitted.states(record) == {"residual=true__seed=1337": "ended", "residual=false__seed=1337": "ended"}
        assert report.main(["cancel", str(out)]) == 0
        said = capsys.readouterr().out
        assert f"(pid {stranger.pid}) is no longer running; its record is cleared, and no process was signalled" in said
        assert stranger.poll() is None                       # alive: nothing was sent to it
        assert submitted.read(out)["submitter"] is None
        # an older record, without start times, is never taken as the sweep's either
        submitted.write(out, {**record, "submitter_start": None})
        assert report.main(["cancel", str(out)]) == 0 and stranger.poll() is None
        # the process itself, recorded with its own start, is the sweep's
        assert submitted.is_ours(stranger.pid, submitted.started_at(stranger.pid))
    finally:
        stranger.kill()
        stranger.wait()


def test_status_tells_runs_training_from_runs_not_started_in_a_local_sweep_and_after_a_kill(tmp_path):
    """A run trains while its folder is held; the sweep at work holds its own. So status tells a local
    sweep's two runs training from the ones waiting, and, once a submitit_local sweep was killed, a
    run whose job ended before it began from one that failed."""
    from gpt import checkpoint
    from gpt.sweep import status
    out = tmp_path / "sw"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"axes": {"n_layer": [1, 2, 3, 4]}, "seeds": 1, "base_seed": 0,
                                                "command": "x"}))
    for n in (1, 2):
        (out / f"n_layer={n}__seed=0").mkdir()
    with checkpoint.hold_folder(out), checkpoint.hold_folder(out / "n_layer=1__seed=0"), \
            checkpoint.hold_folder(out / "n_layer=2__seed=0"):
        assert status.standing(out)[0] == {"done": [], "running": ["n_layer=1__seed=0", "n_layer=2__seed=0"],
                                        "queued": ["n_layer=3__seed=0", "n_layer=4__seed=0"], "stopped": [],
                                        "not started": [], "failed": [], "not submitted": []}
    # a submitit_local sweep killed outright: its record lists jobs that ended, one of whose runs had begun
    submitted.write(out, {"launcher": "submitit_local", "logs": str(out / "slurm"), "submitter": None,
                          "jobs": {f"n_layer={n}__seed=0": {"id": None, "at": 0.0} for n in (1, 2, 3)}})
    (out / "n_layer=1__seed=0" / "log.txt").write_text("iter 0\nKilled\n")
    groups, _ = status.standing(out)
    assert groups["failed"] == ["n_layer=1__seed=0"]
    assert groups["not started"] == ["n_layer=2__seed=0", "n_layer=3__seed=0"]
    assert groups["not submitted"] == ["n_layer=4__seed=0"]


def test_jobs_of_a_killed_submitit_local_sweep_are_named_orphaned_and_cancel_stops_them(tmp_path, capsys):
    out = tmp_path / "sw"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"axes": {"n_layer": [1, 2]}, "seeds": 1, "base_seed": 0,
                                                "command": "x"}))
    # a job's controller, still at work after its sweep was killed with kill -9 (its cmdline names submitit)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "submitit"])
    try:
        submitted.write(out, {"launcher": "submitit_local", "logs": str(out / "slurm"), "submitter": None,
                              "jobs": {"n_layer=1__seed=0": {"id": job.pid, "at": 0.0,
                                                             "start": submitted.started_at(job.pid)}}})
        assert report.main(["status", str(out)]) == 0
        said = capsys.readouterr().out
        assert said.startswith("0 done, 1 running, 0 queued, 0 failed, 1 not submitted\n")
        assert "1 of the running runs are jobs of a submitit_local sweep that no longer runs" in said
        assert report.main(["cancel", str(out)]) == 0
        assert "cancelled 1 run: n_layer=1__seed=0" in capsys.readouterr().out
        assert job.wait(timeout=10) != 0            # stopped by the cancel's SIGINT
    finally:
        job.kill()
        job.wait()
